/* tok_glue.c - the engine's tokenizer and chat template: loaded from the
 * model directory when present (tokenizer.json or tiktoken.model, and the
 * chat_template of tokenizer_config.json), exposed through deltafin.h. The
 * template is parsed once; the tokenizer's eos token joins the stop ids.
 *
 * Kimi K3 (config.json model_type kimi_k3) ships no template: its chat
 * format is rendered by src/tok/kimi_k3_chat.c as segments (structure and
 * text), which the vendor tokenizer encodes one by one. deltafin.h renders
 * (df_chat_render) and tokenizes (df_tokenize) in two calls, and the text
 * alone cannot tell structure from a user's "<|open|>", so the engine keeps
 * the segments of its last few K3 renders and df_tokenize uses them when it
 * is handed exactly one of those texts. */
#include "core/core.h"
#include "core/engine_int.h"
#include "format/gguf.h"
#include "grammar/grammar.h"
#include "tok/template.h"
#include "tok/tokenizer.h"
#include "util/util.h"

#include "tok/kimi_k3_chat.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The tokenizer embedded in a GGUF file's metadata (tokenizer.ggml.*). */
static int tok_from_gguf(df_engine *e, char *err, size_t errlen) {
    const df_gguf *g = e->model->gguf;
    if (!df_gguf_find(g, "tokenizer.ggml.model")) return 0; /* no tokenizer */
    int ab = e->add_bos;
    e->tok = df_tok_load_gguf(g, e->model->dir, &ab, err, errlen);
    if (!e->tok) return DF_EFORMAT;
    e->add_bos = ab;
    return 0;
}

#define K3_SLOTS 8
struct df_k3_glue {
    pthread_mutex_t mu;
    df_k3_prompt slot[K3_SLOTS]; /* recent renders, text + segments */
    uint64_t used[K3_SLOTS], clock;
};

static void k3_free(struct df_k3_glue *g) {
    if (!g) return;
    for (int i = 0; i < K3_SLOTS; i++) df_k3_prompt_free(&g->slot[i]);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* Remembers p (taking it over) in the least recently used slot. */
static void k3_remember(struct df_k3_glue *g, df_k3_prompt *p) {
    pthread_mutex_lock(&g->mu);
    int lru = 0;
    for (int i = 1; i < K3_SLOTS; i++)
        if (g->used[i] < g->used[lru]) lru = i;
    df_k3_prompt_free(&g->slot[lru]);
    g->slot[lru] = *p;
    g->used[lru] = ++g->clock;
    memset(p, 0, sizeof *p);
    pthread_mutex_unlock(&g->mu);
}

/* A copy of the segments of a remembered render whose text is exactly
 * text[0..len), or NULL. */
static df_k3_seg *k3_lookup(struct df_k3_glue *g, const char *text, size_t len, size_t *n_seg) {
    df_k3_seg *segs = NULL;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < K3_SLOTS; i++) {
        df_k3_prompt *p = &g->slot[i];
        if (p->text && p->len == len && !memcmp(p->text, text, len)) {
            segs = df_xmalloc((p->n_seg ? p->n_seg : 1) * sizeof *segs);
            if (p->n_seg) memcpy(segs, p->seg, p->n_seg * sizeof *segs);
            *n_seg = p->n_seg;
            g->used[i] = ++g->clock;
            break;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return segs;
}

static int load_template(df_engine *e, const char *where, char *err, size_t errlen) {
    const char *tpl = df_tok_chat_template(e->tok);
    if (!tpl) return 0;
    if (!e->special_tokens_json) {
        json_t *sp = json_object();
        const char *bos = df_tok_bos_token(e->tok), *eos = df_tok_eos_token(e->tok);
        if (bos) json_object_set_new(sp, "bos_token", json_string(bos));
        if (eos) json_object_set_new(sp, "eos_token", json_string(eos));
        e->special_tokens_json = json_dumps(sp, JSON_COMPACT);
        json_decref(sp);
    }
    char terr[512];
    e->tpl = df_template_parse(tpl, terr, sizeof terr);
    if (!e->tpl) return df_err(err, errlen, DF_EUNSUPPORTED, "%s: chat_template: %s", where, terr);
    const char *tt = df_tok_chat_template_tools(e->tok);
    if (tt) {
        e->tpl_tools = df_template_parse(tt, terr, sizeof terr);
        if (!e->tpl_tools) return df_err(err, errlen, DF_EUNSUPPORTED, "%s: chat_template \"tool_use\": %s", where, terr);
    }
    return 0;
}

static void add_eos_stop(df_engine *e) {
    const char *eos = df_tok_eos_token(e->tok);
    if (eos) {
        int32_t id = df_tok_token_id(e->tok, eos);
        if (id >= 0) df_engine_add_stop(e, id);
    }
}

int df_engine_tok_load(df_engine *e, const char *dir, char *err, size_t errlen) {
    if (e->model->gguf) {
        int rc = tok_from_gguf(e, err, errlen);
        if (rc || !e->tok) return rc;
        add_eos_stop(e);
        return load_template(e, dir, err, errlen);
    }
    char *tj = df_path_join(dir, "tokenizer.json"), *tm = df_path_join(dir, "tiktoken.model");
    int have = df_file_exists(tj) || df_file_exists(tm);
    free(tj);
    free(tm);
    if (!have) return 0;
    e->tok = df_tok_load(dir, err, errlen);
    if (!e->tok) return DF_EFORMAT;
    if (df_k3_is_model_dir(dir)) {
        e->k3 = df_xcalloc(1, sizeof *e->k3);
        pthread_mutex_init(&e->k3->mu, NULL);
    }
    char *cfgp = df_path_join(dir, "tokenizer_config.json"), *cfgtext = NULL;
    if (!e->k3 && df_file_exists(cfgp) && df_read_file(cfgp, &cfgtext, NULL, NULL, 0) == 0) { /* K3: no template */
        char *src = NULL;
        if (df_chat_config_parse(cfgtext, cfgp, 0, &src, &e->special_tokens_json, err, errlen) != 0) {
            free(cfgtext);
            free(cfgp);
            return DF_EFORMAT;
        }
        free(src); /* the tokenizer resolved the same template (incl. chat_template.jinja) */
    }
    free(cfgtext);
    free(cfgp);
    int rc = load_template(e, dir, err, errlen);
    if (rc) return rc;
    cfgp = df_path_join(dir, "tokenizer_config.json");
    json_t *cfg = json_load_file(cfgp, 0, NULL);
    free(cfgp);
    if (cfg) {
        e->add_bos = json_is_true(json_object_get(cfg, "add_bos_token"));
        json_decref(cfg);
    }
    add_eos_stop(e);
    return 0;
}

static pthread_mutex_t gvocab_mu = PTHREAD_MUTEX_INITIALIZER;

df_gvocab *df_engine_gvocab(df_engine *e) {
    pthread_mutex_lock(&gvocab_mu);
    df_gvocab *v = e->gvocab;
    if (!v && !e->tok) df_err(df_errbuf(), DF_ERRLEN, DF_EUNSUPPORTED, "constrained decoding needs the model's tokenizer, and this model has none");
    if (!v && e->tok) {
        int n = e->model->cfg.vocab;
        const char **b = calloc((size_t)n, sizeof *b);
        size_t *l = calloc((size_t)n, sizeof *l);
        uint8_t *ex = calloc((size_t)n, 1);
        if (b && l && ex) {
            for (int i = 0; i < n; i++) {
                b[i] = df_tok_token_bytes(e->tok, i, &l[i]);
                if (!b[i]) l[i] = 0;
                ex[i] = df_tok_is_special(e->tok, i) != 0;
            }
            for (int i = 0; i < e->n_stop; i++)
                if (e->stop[i] >= 0 && e->stop[i] < n) ex[e->stop[i]] = 1;
            v = e->gvocab = df_gvocab_new(n, b, l, ex, df_errbuf(), DF_ERRLEN);
        } else df_err(df_errbuf(), DF_ERRLEN, DF_ENOMEM, "constrained decoding: out of memory (vocabulary index)");
        free(b);
        free(l);
        free(ex);
    }
    pthread_mutex_unlock(&gvocab_mu);
    return v;
}

void df_engine_tok_free(df_engine *e) {
    df_gvocab_free(e->gvocab);
    e->gvocab = NULL;
    k3_free(e->k3);
    free(e->special_tokens_json);
    df_template_free(e->tpl);
    df_template_free(e->tpl_tools);
    df_tok_free(e->tok);
}

int df_has_tokenizer(const df_engine *e) { return e->tok != NULL; }
int df_engine_adds_bos(const df_engine *e) { return e->add_bos; }

int df_tokenize(df_engine *e, const char *text, size_t len, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!e->tok) return df_err(df_errbuf(), DF_ERRLEN, DF_EUNSUPPORTED, "this model has no tokenizer");
    /* Kimi's encode() matches special tokens by default (allow_special_tokens=True): its chat templates'
     * <|im_user|> ... and K3's structure tokens are specials */
    int flags = df_tok_is_kimi(e->tok) ? DF_TOK_ALLOW_SPECIAL : 0;
    size_t n_seg = 0;
    df_k3_seg *segs = e->k3 ? k3_lookup(e->k3, text, len, &n_seg) : NULL;
    if (segs) {
        df_k3_prompt p = {(char *)text, len, segs, n_seg};
        int rc = df_k3_prompt_encode(e->tok, &p, 0, ids, n, df_errbuf(), DF_ERRLEN);
        free(segs);
        return rc;
    }
    return df_tok_encode_err(e->tok, text, len, flags, 0, ids, n, df_errbuf(), DF_ERRLEN);
}

int df_chat_render(df_engine *e, const char *messages_json, const char *tools_json, int add_gen, char **out) {
    return df_chat_render_vars(e, messages_json, tools_json, add_gen, NULL, out);
}

const char *df_chat_template_source(const df_engine *e, int want_tools) {
    if (!e->tok || !e->tpl) return NULL;
    return want_tools && e->tpl_tools ? df_tok_chat_template_tools(e->tok) : df_tok_chat_template(e->tok);
}

int df_chat_is_k3(const df_engine *e) { return e->k3 && !e->tpl; }

int df_chat_render_vars(df_engine *e, const char *messages_json, const char *tools_json, int add_gen, const char *vars_json,
                        char **out) {
    *out = NULL;
    if (e->k3 && !e->tpl) {
        df_k3_prompt p;
        int rc = df_k3_chat_render(messages_json, tools_json, add_gen, vars_json, &p, df_errbuf(), DF_ERRLEN);
        if (rc) return rc;
        *out = df_xmalloc(p.len + 1);
        memcpy(*out, p.text, p.len + 1);
        k3_remember(e->k3, &p);
        return 0;
    }
    if (!e->tpl) return df_err(df_errbuf(), DF_ERRLEN, DF_EUNSUPPORTED, "this model has no chat template");
    /* the context as transformers' apply_chat_template builds it: cleaned
     * messages, tools or none, special-token variables */
    char *ctx = NULL;
    int rc = df_chat_context_build(messages_json, tools_json, add_gen, e->special_tokens_json, vars_json, &ctx, df_errbuf(), DF_ERRLEN);
    if (rc) return rc;
    size_t len;
    /* a "tool_use" template, when the model has one, renders requests with tools (as transformers picks it) */
    rc = df_template_render(tools_json && e->tpl_tools ? e->tpl_tools : e->tpl, ctx, out, &len, df_errbuf(), DF_ERRLEN);
    free(ctx);
    return rc;
}

struct df_detok {
    df_tok_stream *s;
};
df_detok *df_detok_new(df_engine *e) {
    if (!e->tok) return NULL;
    df_detok *d = df_xcalloc(1, sizeof *d);
    d->s = df_tok_stream_new(e->tok);
    return d;
}
void df_detok_free(df_detok *d) {
    if (!d) return;
    df_tok_stream_free(d->s);
    free(d);
}
const char *df_detok_push(df_detok *d, int32_t id, size_t *n) { return df_tok_stream_push(d->s, id, n); }
const char *df_detok_flush(df_detok *d, size_t *n) { return df_tok_stream_flush(d->s, n); }
