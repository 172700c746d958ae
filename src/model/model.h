/* model.h - a loaded model: config + weights (as stored, memory-mapped) and
 * the forward pass. One file per family implements its specific parts:
 * llama.c (GQA attention, also used by qwen3 and qwen3_moe), qwen3_moe.c
 * (softmax router), deepseek_v3.c (MLA attention with a latent cache,
 * sigmoid noaux_tc router). forward.c runs the layer loop, dense MLPs and
 * the routed experts. */
#ifndef DF_MODEL_H
#define DF_MODEL_H

#include "backend/backend.h"
#include "format/safetensors.h"
#include "model/config.h"
#include <stdio.h>

/* Where one contiguous piece of an expert lives on disk. */
typedef struct {
    int file;            /* index into the model's file list */
    uint64_t off, len;   /* absolute byte offset and length */
} df_extent;

/* An expert's pieces, in order: gate data, gate scale, up data, up scale,
 * down data, down scale (scales only for FP8/INT4). */
#define DF_FFN_PARTS 6
typedef struct {
    df_weight gate, up, down; /* gate/up [inter x hidden], down [hidden x inter] */
    /* streamed experts: where their bytes are (data pointers unused until loaded) */
    int n_parts;
    df_extent part[DF_FFN_PARTS];
    uint64_t xxh3;            /* checksum of the parts' bytes in order; valid if has_xxh3 */
    int has_xxh3;
} df_ffn;

typedef struct {
    float *attn_norm, *ffn_norm; /* [hidden] */
    /* GQA (llama, qwen3, qwen3_moe) */
    df_weight wq, wk, wv, wo;    /* [H*hd x hidden], [KV*hd x hidden] x2, [hidden x H*hd] */
    float *bq, *bk, *bv, *bo;    /* optional biases */
    float *q_norm, *k_norm;      /* [hd], qwen3 */
    /* MLA (deepseek_v3) */
    df_weight q_a, q_b, q_proj;  /* [q_lora x hidden], [H*(nope+rope) x q_lora] | [H*(nope+rope) x hidden] */
    float *q_a_norm;             /* [q_lora] */
    df_weight kv_a, kv_b;        /* [kv_lora+rope x hidden], [H*(nope+v) x kv_lora] */
    df_weight k_b, v_b;          /* or, as block-quantized GGUFs split it: k_b [H*kv_lora x nope] (W_uk^T per head), v_b [H*v x kv_lora] */
    float *kv_a_norm;            /* [kv_lora] */
    /* FFN */
    int moe;
    df_ffn mlp;                  /* dense layers */
    df_weight router;            /* [E x hidden] */
    float *router_bias;          /* [E], deepseek e_score_correction_bias */
    df_ffn *experts;             /* [E] */
    int has_shared;
    df_ffn shared;
} df_layer;

struct df_gguf;

typedef struct df_model {
    df_config cfg;
    char *dir;              /* checkpoint directory, or the GGUF file */
    df_st_set *st;          /* safetensors checkpoints */
    struct df_gguf *gguf;   /* GGUF files */
    int rope_adjacent;      /* GQA q/k rotate adjacent pairs (llama-arch GGUF stores q/k rows permuted for it) */
    df_weight embed;       /* [vocab x hidden] */
    float *final_norm;     /* [hidden] */
    df_weight lm_head;     /* [vocab x hidden] (== embed when tied) */
    df_layer *layers;      /* [n_layers] */
    float *inv_freq;       /* [rope_dim/2] */
    float rope_scale;      /* cos/sin multiplier (YaRN attention_factor) */
    float attn_scale;      /* softmax scale */
    int64_t n_params, n_params_active, bytes, bytes_active;
    int n_ignored_tensors; /* recognised but unused (MTP layers) */
    struct df_ecache *ecache; /* routed experts stream through this cache (NULL: resident) */
    df_ffn *ecache_tmpl;   /* [n_layers * n_experts] the cache's view of the experts */
    FILE *trace;
    int prefetch;          /* router-lookahead prediction for streamed experts */
    int prefetch_mode;     /* df_options.prefetch in effect (2: off) */
    int spine_int8;        /* the spine is row-int8 (store built with --spine int8): NOT exact */
    struct df_store_spine *store_spine; /* a store's spine checksums, checked once the spine is read (then freed) */
    char **files;          /* the weight files, for streamed experts' extents */
    int n_files;
    void **owned;          /* rebuilt tensors owned by the model (GGUF kv_b) */
    int n_owned;
    int embed_on_disk;     /* streaming, untied: embedding rows are read from the file per token */
    int embed_fd;
    uint64_t embed_off;
    uint8_t *spine_arena;  /* streaming: the resident weights, read into one huge-page arena */
    size_t spine_arena_bytes;
    double spine_load_s;   /* time and bytes of reading the spine */
    int64_t spine_load_bytes;
} df_model;

/* resident: 1 reads the weight files into engine-owned memory; 0 maps them;
 * 2 streams routed experts (the spine is copied into owned memory, experts
 * keep only their on-disk extents for an expert cache). */
int df_model_load(const char *dir, int resident, df_model **out, char *err, size_t errlen);
int df_model_own_spine(df_model *m, char *err, size_t errlen);
/* The embedding row of token tok into out[hidden] (from memory, or read from
 * the file when embed_on_disk). 0, or DF_EIO with a message in err. */
int df_model_embed_row(const df_model *m, int32_t tok, float *out, char *err, size_t errlen);
/* Loads a GGUF file (llama, qwen3, qwen3moe, deepseek2 architectures): tensors
 * are used as stored (GGML block types), the config comes from the metadata.
 * mode as df_model_load (0 and 1 map the file; 2 streams routed experts). */
int df_model_load_gguf(const char *path, int mode, df_model **out, char *err, size_t errlen);
/* Shared by the loaders: RoPE tables, softmax scale, parameter/byte counts. */
void df_model_finish(df_model *m);
void df_model_free(df_model *m);

/* Per-session state: caches and scratch, sized once. */
typedef struct {
    int max_ctx, max_batch;
    float *k_cache, *v_cache; /* GQA: [L][max_ctx][KV*hd] */
    float *latent;            /* MLA: [L][max_ctx][kv_lora + rope] */
    /* scratch, [max_batch x ...] */
    float *x, *xn, *q, *k, *v, *att, *o, *h1, *h2, *ffn_out, *router_logits;
    float *att_scores;        /* [n_threads][max_ctx] */
    float *qlat;              /* [n_threads][kv_lora] (MLA) */
    float *rope_cs;           /* [max_batch][rope_dim/2][2] cos, sin of this batch's positions */
    float *mla_w;             /* [n_threads][(nope + v) x kv_lora] one head's dequantized W_uk, W_uv (MLA prefill) */
    int *sel;                 /* [max_batch x topk] expert ids */
    float *selw;              /* [max_batch x topk] weights */
    int *tok_list;            /* [max_batch] tokens routed to an expert */
    float *xe, *ge, *ue, *de; /* gathered expert batch */
    float *de_all;            /* [max_batch x topk x hidden] each routed expert's output */
    int *exp_list;            /* [n_experts] distinct experts of a batch */
    char err[256];            /* message of a failed forward (e.g. expert I/O) */
    float *xp, *plog, *predw; /* router lookahead: [hidden], [n_experts], [topk] */
    int *pred;                /* [topk] predicted experts of the next layer */
    double t_attn, t_ffn, t_other;
} df_state;

int df_state_init(const df_model *m, int max_ctx, int max_batch, df_state *s, char *err, size_t errlen);
void df_state_free(df_state *s);
size_t df_state_bytes_per_token(const df_model *m);

/* Runs tokens[0..n) at positions pos0.. through the model (n <= max_batch,
 * pos0 + n <= max_ctx). Writes logits for the last position into
 * logits[vocab], or for every position into logits[n x vocab] if all. */
int df_forward(const df_model *m, df_state *s, const int32_t *tokens, int n, int pos0, float *logits, int all);

/* family parts */
void df_attn_gqa(const df_model *m, df_state *s, int l, int n, int pos0);
void df_attn_mla(const df_model *m, df_state *s, int l, int n, int pos0);
void df_route_qwen3(const df_model *m, const df_layer *L, const float *logits, int *sel, float *w);
void df_route_deepseek(const df_model *m, const df_layer *L, const float *logits, int *sel, float *w);
/* rotary embedding of one head vector in place; cs = [rope_dim/2][cos, sin] of its position */
void df_rope(const float *cs, int rope_dim, float *v, int interleaved);

#endif
