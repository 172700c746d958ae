/* model.h - a loaded model: its configuration, its layers described by
 * kinds, its weights as stored, and the forward pass.
 *
 * A model is a list of layers; each layer is described by kinds (the mixer
 * that mixes positions, the FFN, its activation, its router, its residual
 * scheme). A family (src/model/family.c) is a table entry that maps a
 * config.json / GGUF architecture onto those kinds; the code of each kind
 * lives in src/model/kinds/ and is reached through the ops tables of
 * kinds.h, so forward.c walks layers without knowing families.
 *
 * Weights are never rewritten: a df_weight points at the stored bytes
 * (read into engine-owned memory, mapped, or, for streamed routed experts,
 * only located on disk: see store/source.h). */
#ifndef DF_MODEL_H
#define DF_MODEL_H

#include "backend/backend.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "store/source.h"
#include "store/store.h"
#include <stdio.h>

/* ---- layer kinds ------------------------------------------------------ */
typedef enum { DF_MIXER_GQA, DF_MIXER_MLA, DF_MIXER_KDA, DF_MIXER_N } df_mixer_kind;
typedef enum { DF_FFN_DENSE, DF_FFN_MOE, DF_FFN_N } df_ffn_kind;
typedef enum { DF_ACT_SILU_GLU, DF_ACT_SITU_GLU, DF_ACT_N } df_act_kind;
typedef enum { DF_ROUTER_NONE, DF_ROUTER_SOFTMAX_TOPK, DF_ROUTER_SIGMOID_GROUPS, DF_ROUTER_N } df_router_kind;
typedef enum { DF_RESID_PLAIN, DF_RESID_ATTNRES, DF_RESID_N } df_resid_kind;

typedef struct {
    df_mixer_kind mixer;
    df_ffn_kind ffn;
    df_act_kind act;
    df_router_kind router;
    df_resid_kind resid;
    int qk_norm;          /* GQA: per-head RMSNorm of q and k before RoPE (qwen3) */
    int nope;             /* MLA: no RoPE (kimi): the rope dims are plain dims, k_rot shared unrotated */
    int out_gate;         /* MLA: output * sigmoid(g_proj x) before o_proj (kimi k3) */
    int latent;           /* MoE: routed experts work in a latent width (down-proj, experts, norm, up-proj) */
} df_layer_kind;

/* A gated FFN: down(act(gate x) * up x). gate/up [inter x hidden], down [hidden x inter]. */
typedef struct { df_weight gate, up, down; } df_glu;

/* A routed expert: shapes and formats of its weights, and where its bytes
 * are. Data/scale pointers are set only while resident in the model's own
 * memory; streamed experts are reached through a df_expert_source. */
typedef struct {
    df_weight gate, up, down;
    df_expert_loc loc;
} df_ffn;

/* Every spine weight of a layer, in one struct, so that one iterator
 * (df_model_foreach_weight) reaches all of them: loading, streaming,
 * parameter counts and inspect cannot miss one. Unused ones have data NULL. */
typedef struct {
    /* GQA */
    df_weight wq, wk, wv;         /* [H*hd x hidden], [KV*hd x hidden] x2 */
    /* MLA */
    df_weight q_a, q_b, q_proj;   /* [q_lora x hidden], [H*(nope+rope) x q_lora] | [H*(nope+rope) x hidden] */
    df_weight kv_a, kv_b;         /* [kv_lora+rope x hidden], [H*(nope+v) x kv_lora] */
    df_weight k_b, v_b;           /* GGUF split form: k_b [H*kv_lora x nope] (W_uk^T per head), v_b [H*v x kv_lora] */
    df_weight wo;                 /* [hidden x H*hd] or [hidden x H*v] */
    /* FFN */
    df_glu mlp;                   /* dense layers */
    df_glu shared;                /* shared experts of a MoE layer */
    df_weight router;             /* [E x hidden] */
    /* KDA (q, k, v in wq/wk/wv [H*d x hidden], o_proj in wo) and the MLA output gate */
    df_weight g_proj;             /* [H*d x hidden]: KDA full-rank output gate (K3) or the MLA output gate */
    df_weight g_a, g_b;           /* KDA low-rank output gate (Kimi Linear): [d x hidden], [H*d x d] */
    df_weight f_a, f_b;           /* KDA forget gate: [d x hidden], [H*d x d] */
    df_weight b_proj;             /* KDA beta: [H x hidden] */
    /* latent MoE */
    df_weight lat_down, lat_up;   /* [latent x hidden], [hidden x latent] */
} df_layer_weights;
#define DF_LAYER_NW ((int)(sizeof(df_layer_weights) / sizeof(df_weight)))
_Static_assert(sizeof(df_layer_weights) % sizeof(df_weight) == 0, "df_layer_weights holds only df_weight members");

typedef struct {
    df_layer_kind kind;
    df_layer_weights w;
    float *attn_norm, *ffn_norm;  /* [hidden] */
    float *bq, *bk, *bv, *bo;     /* GQA optional biases */
    float *q_norm, *k_norm;       /* [hd], GQA per-head q/k norm (qwen3) */
    float *q_a_norm;              /* [q_lora], MLA */
    float *kv_a_norm;             /* [kv_lora], MLA */
    float *router_bias;           /* [E], sigmoid router correction bias */
    float *conv[3];               /* KDA q/k/v short convolutions, [H*d][width] f32 */
    float *A_log;                 /* KDA [H] (the first H entries of a padded tensor) */
    float *dt_bias;               /* KDA [H*d] */
    float *o_norm;                /* KDA [d], shared by the heads */
    float *lat_norm;              /* latent MoE [latent] (latent_moe_use_norm) */
    float *res_norm[2], *res_proj[2]; /* block attention residuals: [0] before the mixer, [1] before the FFN, [hidden] each */
    df_ffn *experts;              /* [E], MoE layers */
    int has_shared;
} df_layer;

struct df_gguf;

/* The multi-token-prediction (MTP) module that DeepSeek-V3/R1 and Kimi K2
 * checkpoints ship as layer num_hidden_layers (model/mtp.h computes it).
 * Loaded only for resident models; layer NULL: none. */
typedef struct {
    df_layer *layer;        /* the full decoder layer (== &layers[n_layers]) or NULL */
    df_weight eh_proj;      /* [hidden x 2*hidden]: columns 0..hidden-1 take the embedding, the rest the hidden state */
    float *enorm, *hnorm;   /* [hidden] */
    float *head_norm;       /* [hidden] shared_head.norm */
    df_weight embed, head;  /* [vocab x hidden] its own embed_tokens / shared_head.head, else the main ones */
} df_mtp_weights;

typedef struct df_model {
    df_config cfg;
    char *dir;              /* checkpoint directory, or the GGUF file */
    df_st_set *st;          /* safetensors checkpoints */
    struct df_gguf *gguf;   /* GGUF files */
    int rope_adjacent;      /* GQA q/k rotate adjacent pairs (llama-arch GGUF stores q/k rows permuted for it) */
    df_weight embed;       /* [vocab x hidden] */
    float *final_norm;     /* [hidden] */
    df_weight lm_head;     /* [vocab x hidden] (== embed when tied) */
    float *out_res_norm, *out_res_proj; /* block attention residuals before the final norm, [hidden] */
    df_layer *layers;      /* [n_layers] */
    float *inv_freq;       /* [rope_dim/2] */
    float rope_scale;      /* cos/sin multiplier (YaRN attention_factor) */
    float attn_scale;      /* softmax scale */
    int64_t n_params, n_params_active, bytes, bytes_active;
    int n_ignored_tensors; /* recognised but unused (MTP layers) */
    int spine_int8;        /* the spine is row-int8 (store built with --spine int8): NOT exact */
    int streamed;          /* routed experts stay on disk (their extents only); a df_expert_source reads them */
    struct df_store_spine *store_spine; /* a store's spine checksums, checked once the spine is read (then freed) */
    char **files;          /* the weight files the experts' extents refer to */
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
    df_expert_source *resident_src; /* routed experts served from the model's own memory (NULL when streamed) */
    df_mtp_weights mtp;    /* the MTP module (not part of the main layer walk) */
} df_model;

/* How a model is loaded. */
typedef struct {
    int mode;          /* 0 map the files; 1 read them into owned memory; 2 stream routed experts
                          (the spine is read into owned memory, experts keep only their extents) */
    int resident_embed; /* streaming: keep an untied embedding in memory instead of reading rows per token */
    int populate;      /* fault owned memory in ahead of reads, from several threads */
    int64_t spine_budget; /* streaming: refuse a spine larger than this many bytes (0: no limit) */
} df_load_opts;

int df_model_load(const char *dir, const df_load_opts *o, df_model **out, char *err, size_t errlen);
/* Loads a GGUF file (llama, qwen3, qwen3moe, deepseek2 architectures): tensors
 * are used as stored (GGML block types), the config comes from the metadata. */
int df_model_load_gguf(const char *path, const df_load_opts *o, df_model **out, char *err, size_t errlen);
int df_model_own_spine(df_model *m, const df_load_opts *o, char *err, size_t errlen);
/* The embedding row of token tok into out[hidden] (from memory, or read from
 * the file when embed_on_disk). 0, or DF_EIO with a message in err. */
int df_model_embed_row(const df_model *m, int32_t tok, float *out, char *err, size_t errlen);
/* Shared by the loaders: layer kinds, RoPE tables, softmax scale,
 * parameter/byte counts, the resident expert source. 0 or DF_E* (a limit). */
int df_model_finish(df_model *m, char *err, size_t errlen);
void df_model_free(df_model *m);

/* The one iterator over a model's spine weights: the embedding, the output
 * head when untied, and every df_weight of every layer (routed experts are
 * not spine). fn is called for each weight with data != NULL. */
typedef void (*df_weight_fn)(void *ctx, df_weight *w);
void df_model_foreach_weight(df_model *m, df_weight_fn fn, void *ctx);
/* Registers the spine weights and the small f32 params (norm gains, biases,
 * router bias, RoPE frequencies) with the selected backend, once per model
 * (CPU: nothing to do; a device backend uploads them). Routed experts are
 * not registered: they reach the backend through the expert source.
 * 0 or DF_E* with a message. detach undoes it (idempotent). */
int df_model_backend_attach(df_model *m, char *err, size_t errlen);
void df_model_backend_detach(df_model *m);
/* Where each routed expert is, [n_layers * n_experts] (entries of dense
 * layers have n_parts 0). Caller frees. */
df_expert_loc *df_model_expert_locs(const df_model *m);
/* Routed experts served from the model's own memory (resident models). */
df_expert_source *df_model_resident_source(const df_model *m);
/* How a store finds this family's routed-expert tensors (name format and
 * projection names); fmt is a buffer of n bytes the layout points into. */
void df_model_store_layout(const df_config *c, char *fmt, size_t n, df_store_layout *out);
/* Bytes of all routed experts. */
int64_t df_model_expert_bytes(const df_model *m);

/* ---- per-session state ----------------------------------------------- */
/* Each layer's mixer keeps its own state: a cache that grows with the
 * position (GQA: K and V rows; MLA: latent + rotated key) and/or a state of
 * fixed size (recurrent mixers). A mixer whose state at position p is a
 * prefix of its state at any later position is truncatable: a session may
 * cut it back; otherwise going back needs a snapshot (df_snapshot). */
typedef struct {
    df_act *cache;       /* [max_ctx][cache_floats] or NULL (backend memory) */
    size_t cache_floats; /* per position */
    df_act *fixed;       /* [fixed_floats] or NULL (backend memory) */
    size_t fixed_floats;
} df_layer_state;

/* Activations and states are backend memory (df_act, opaque: the model
 * only passes them to backend operations); the host keeps the expert ids,
 * the index lists and the embedding rows on their way in. */
typedef struct {
    int max_ctx, max_batch, max_logits, n_layers; /* max_logits: rows of logits a call may ask for (all) */
    df_layer_state *ls;       /* [n_layers] */
    df_act *state_mem;        /* one allocation behind every layer's cache and fixed state */
    size_t state_floats;
    /* backend scratch, [max_batch x ...] */
    df_act *x, *xn, *q, *k, *v, *att, *o, *h1, *h2, *ffn_out, *router_logits;
    df_act *rope_cs;          /* [max_batch][rope_dim/2][2] cos, sin of this batch's positions */
    df_act *kg, *kb, *ko;     /* KDA: gates [max_batch x H*d], betas [max_batch x H]; output gates (KDA, MLA) */
    df_act *kc;               /* KDA: the three convolutions' outputs [3][max_batch x H*d] */
    df_act *blocks;           /* attention residuals: [max_blocks][max_batch x hidden] completed block outputs */
    int max_blocks;
    df_act *lat;              /* latent MoE: [max_batch x latent] routed input, then the routed sum */
    df_act *logits;           /* [max_logits x vocab] */
    df_act *selw;             /* [max_batch x topk] expert weights */
    df_act *xe, *ge, *ue, *de; /* gathered expert batch: [max_batch x hidden], [max(max_batch, topk) x I] x2, [max_batch x hidden] */
    df_act *de_all;           /* [max_batch x topk x hidden] each routed expert's output */
    df_act *xp, *plog;        /* router lookahead: [hidden], [n_experts] */
    /* host */
    float *emb;               /* [max_batch x hidden] embedding rows before they are written to x */
    int *sel;                 /* [max_batch x topk] expert ids */
    int *tok_list;            /* [max_batch x topk] (token, k) slots routed to an expert */
    int *tok_src;             /* [max_batch x topk] their tokens */
    int *exp_list;            /* [n_experts] distinct experts of a batch */
    unsigned char *seen;      /* [n_experts] */
    int *pend_k;              /* [topk] decode: slots of experts handed over, not computed yet */
    df_glu *pend_f;           /* [topk] their weights */
    df_mv_job *jobs;          /* [2 x topk] */
    char err[256];            /* message of a failed forward (e.g. expert I/O) */
    int *pred;                /* [topk] predicted experts of the next layer */
    df_expert_source *src;    /* where routed experts come from (set by the engine) */
    df_decode_layer *dec;     /* [n_layers]: the layers as a backend's decode_layers takes them (NULL: a kind it does not cover) */
    int dec_ran;              /* the last forward pass ran its layers through decode_layers */
    double t_attn, t_ffn, t_other;
    /* the pass runs in the backend's exact products (backend.h: exact_products' answer, set by the session around a
     * verify pass; 0 otherwise): 2 runs a MoE layer's routed experts a position at a time (ffn.c) */
    int exact;
} df_state;

/* max_batch positions a call; max_logits (<= max_batch) of them with logits each (df_forward's all) */
int df_state_init(const df_model *m, int max_ctx, int max_batch, int max_logits, df_state *s, char *err, size_t errlen);
void df_state_free(df_state *s);
/* Bytes of state that grow with each position (all layers), and of fixed state. */
size_t df_state_bytes_per_token(const df_model *m);
size_t df_state_fixed_bytes(const df_model *m);
/* Whether every layer's state can be cut back to an earlier position. */
int df_state_truncatable(const df_model *m);

/* A snapshot of a session's state at a position: the fixed state of every
 * layer (recurrent mixers) plus the position; growing caches are not copied
 * (positions before pos are never rewritten, so they stay valid). */
typedef struct {
    int pos;
    float *fixed;      /* [sum of fixed_floats] */
    size_t n_floats;
} df_snapshot;
int df_state_snapshot(const df_state *s, int pos, df_snapshot *out);
void df_state_restore(df_state *s, const df_snapshot *snap);
void df_snapshot_free(df_snapshot *snap);
/* The state of position 0 (every fixed state zero). */
void df_state_clear_fixed(df_state *s);

/* Runs tokens[0..n) at positions pos0.. through the model (n <= max_batch,
 * pos0 + n <= max_ctx). Writes logits for the last position into
 * logits[vocab], or for every position into logits[n x vocab] if all
 * (then n <= max_logits). */
int df_forward(const df_model *m, df_state *s, const int32_t *tokens, int n, int pos0, float *logits, int all);
/* One position at pos0 queued ahead (backend.h, next_token): its token *token, or with token NULL the backend's
 * token slot (the argmax the last pass started; only where df_forward_ahead_embeds); its logits stay on the
 * backend and their argmax is started, the ticket in *ticket. 0, DF_EUNSUPPORTED (the backend has no such ops),
 * or a DF_E* code of the pass. */
int df_forward_ahead(const df_model *m, df_state *s, const int32_t *token, int pos0, int64_t *ticket);
/* 1 when df_forward_ahead can take its token from the backend's slot (the backend gathers rows of m's embedding) */
int df_forward_ahead_embeds(const df_model *m);

#endif
