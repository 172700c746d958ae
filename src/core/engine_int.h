/* engine_int.h - the engine struct, shared by the files of src/core. */
#ifndef DF_ENGINE_INT_H
#define DF_ENGINE_INT_H

#include "deltafin.h"
#include "model/model.h"
#include "store/ecache.h"

struct df_tokenizer;
struct df_template;

struct df_engine {
    df_model *model;
    df_options opt;
    df_stats stats;
    int32_t stop[DF_MAX_EOS * 2]; /* eos ids of config.json, generation_config.json, tokenizer */
    int n_stop;
    struct df_tokenizer *tok;
    struct df_template *tpl;
    struct df_template *tpl_tools; /* the "tool_use" template for requests with tools, or NULL */
    int add_bos;
    char *special_tokens_json; /* bos_token, eos_token, ... for the chat template */
    struct df_k3_glue *k3;     /* Kimi K3 (config.json model_type kimi_k3): its chat format, tok_glue.c */
    /* expert residency: the engine is its one owner */
    df_expert_source *src;     /* where sessions get routed experts: the model's memory or the cache */
    void *pinned;              /* the expert cache's memory, page-locked by the backend (host_pin), or NULL */
    df_ecache *ecache;         /* streamed models */
    FILE *trace;               /* --trace */
    int prefetch_mode;         /* as df_options.prefetch, in effect */
    struct df_gvocab *gvocab;  /* constrained decoding's vocabulary index (tok_glue.c), built on first use */
    struct df_rsource *rsrc;   /* setup --stream: experts fetched from the hub on first use (hubsrc.c) */
    struct df_hub_stream *hstream;
    int draft_text_level;      /* as a draft model: its tokenizer differs from the target's it was checked
                                  against (df_spec_check_draft), so it drafts text, re-tokenized (spec.c) */
};

/* hubsrc.c: a model directory made by setup --stream (it holds stream.json) */
int df_engine_is_hub_stream(const char *dir);
int df_engine_hub_stream(df_engine *e, char *err, size_t errlen); /* wraps e->src; after the expert cache exists */
void df_engine_hub_stream_close(df_engine *e);
void df_engine_hub_stats(df_engine *e, df_stats *out);

/* The message of the last failed engine or session call, per thread: the
 * server renders and tokenizes outside the engine's turn while another
 * thread generates, so one buffer per engine would race. */
#define DF_ERRLEN 512
char *df_errbuf(void);

void df_engine_add_stop(df_engine *e, int32_t id);
/* The grammar module's index of the tokenizer's vocabulary (token bytes;
 * special tokens and stop ids never inside a document), built on first use
 * and kept with the engine. NULL + df_errbuf() message without a tokenizer. */
struct df_gvocab *df_engine_gvocab(df_engine *e);
int df_engine_tok_load(df_engine *e, const char *dir, char *err, size_t errlen);
void df_engine_tok_free(df_engine *e);

#endif
