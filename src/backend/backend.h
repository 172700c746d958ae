/* backend.h - the backend contract: what the model asks of a device.
 *
 * A backend is a table of operations (df_backend_ops) on
 *   - weights as stored (df_weight): registered once (df_weight_register;
 *     the CPU uses the stored bytes in place, a GPU backend uploads them and
 *     keeps its copy in w->handle),
 *   - activations and per-session state in backend memory (df_act): opaque
 *     to the model, which only passes them to operations and copies values
 *     to or from the host with the backend's write/read,
 *   - small model constants (norm gains, biases, the router bias, conv
 *     weights: "params"): host f32 arrays that live as long as the model,
 *     announced once with param_register (CPU: read in place; a GPU backend
 *     keeps a device copy found by the host address).
 * Operations are coarse (a batch of products, an attention core over all
 * heads, a norm over rows), so a device backend launches few kernels per
 * layer. The selected backend is df_be (df_backend_select, default "cpu");
 * the model calls the short inline wrappers at the end of this file.
 *
 * A df_weight describes a matrix [rows x cols] (out x in) exactly as it is
 * stored in the checkpoint: the bytes are never rewritten; kernels
 * dequantize inside the dot product and accumulate in f32. The CPU backend
 * (src/backend/cpu) is the reference; its thread pool and its run-time
 * choice of AVX-512, AVX2 or scalar kernels are private to it
 * (backend/cpu/cpu.h). tests/unit/test_backend_ops.c runs every operation of
 * a candidate backend against the CPU reference. */
#ifndef DF_BACKEND_H
#define DF_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* DF_W_I8ROW: row-int8 (int8 values, one f32 scale per row): the opt-in,
 * NOT exact spine of a store built with --spine int8; never a checkpoint's
 * own format.
 * DF_W_MXFP4: OCP MX FP4 as compressed-tensors stores it ("mxfp4-pack-
 * quantized"): data = uint8 [rows][cols/2], element j of a row is nibble j of
 * byte j/2, low nibble first, an E2M1 code (bits 0-2 the magnitude index into
 * {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign); scale = uint8 [rows][cols/32],
 * one E8M0 exponent per 32 consecutive elements of a row, value 2^(s-127)
 * (s = 0 is 2^-127, an f32 subnormal); s = 255 is NaN (the OCP MX spec's
 * encoding), so a block with that scale decodes to NaN. Decoded values are
 * exact in f32 (they overflow to +-inf only where the true value exceeds
 * FLT_MAX: scales 253, 254). cols must be a multiple of 32 (refused at load). */
typedef enum { DF_W_F32, DF_W_F16, DF_W_BF16, DF_W_FP8, DF_W_INT4, DF_W_GGML, DF_W_I8ROW, DF_W_MXFP4 } df_wfmt;
#define DF_W_NFMT (DF_W_MXFP4 + 1)
/* DF_SCALE_E8M0: one byte, value 2^(s-127), 255 = NaN (MXFP4) */
typedef enum { DF_SCALE_F32, DF_SCALE_BF16, DF_SCALE_F16, DF_SCALE_E8M0 } df_scale_dtype;

/* Block geometry of the packed formats (the traits table below and the
 * kernels use these; _Static_asserts in backend/wfmt.c tie them together). */
#define DF_MXFP4_GROUP 32        /* elements per E8M0 scale */
#define DF_MXFP4_GROUP_BYTES 16  /* packed bytes of those 32 elements */
#define DF_INT4_WORD_ELEMS 8     /* INT4 pack-quantized: 8 nibbles per int32 word */
#define DF_INT4_WORD_BYTES 4

typedef struct {
    df_wfmt fmt;
    int ggml_type;          /* DF_W_GGML: GGML block type id */
    int64_t rows, cols;     /* out x in */
    const uint8_t *data;    /* row r starts at data + r * row_bytes (host memory) */
    size_t row_bytes;
    /* DF_W_FP8: scale_inv [ceil(rows/blk_r)][ceil(cols/blk_c)]
     * DF_W_INT4: weight_scale [rows][ceil(cols/group)]; data = int32 words, 8 nibbles each (q - 8)
     * DF_W_MXFP4: weight_scale uint8 E8M0 [rows][cols/32] (scale_dtype DF_SCALE_E8M0, blk_c 32) */
    const void *scale;
    df_scale_dtype scale_dtype;
    int blk_r, blk_c;       /* FP8 block; INT4, MXFP4: blk_r = 1, blk_c = group size */
    int64_t scale_cols;     /* scale entries per scale row */
    void *handle;           /* the backend's copy (NULL: unregistered, or a backend that uses data in place) */
    uint64_t ident;         /* a routed expert's part: df_expert_ident (a device backend caches it under this key); 0: none */
    /* DF_W_FP8: whether data holds an E4M3 NaN code (0x7f, 0xff), as far as known (DF_NAN_CODES_*). The CPU
     * backend checks a weight left UNCHECKED (the zero default) once, on its first decode product
     * (df_weight_nan_codes), and keeps the answer here; a weight known to hold NONE decodes without the
     * per-block check (the same bits). Whoever repoints data at other bytes sets UNCHECKED or, for bytes that
     * change while the struct lives, MAYBE: always the checking kernel. Expert views (ffn.c) take their
     * template's answer where they view its own resident bytes; views of expert-cache slots (host decode)
     * the slot's word for the part (df_weight_nan_codes_memo: MAYBE at the first use of loaded bytes, scanned
     * at the second); else MAYBE. */
    int nan_codes;
} df_weight;
enum { DF_NAN_CODES_UNCHECKED = 0, DF_NAN_CODES_NONE = 1, DF_NAN_CODES_MAYBE = 2,
       DF_NAN_CODES_USED_ONCE = 3 /* df_weight_nan_codes_memo's word only: used once, not scanned */ };

/* The identity of part (0 gate, 1 up, 2 down) of routed expert e of layer l:
 * the same bytes for as long as the model is open, wherever they sit on the
 * host (host expert-cache slots are reused, so addresses are no key). Never 0. */
static inline uint64_t df_expert_ident(int l, int e, int part) {
    return ((uint64_t)(uint32_t)(l + 1) << 40) | ((uint64_t)(uint32_t)e << 8) | (uint64_t)(part & 0xff);
}

/* ---- weight-format traits (backend/wfmt.c) ---------------------------- */
/* Where a format keeps its scales: none; one per row; one per (row, group of
 * blk_c columns); one per (blk_r x blk_c) block. */
typedef enum { DF_SCALES_NONE, DF_SCALES_PER_ROW, DF_SCALES_ROW_GROUPS, DF_SCALES_BLOCKS_2D } df_scale_layout;
typedef struct {
    const char *name;       /* short name (df_wfmt_name; GGML: the block type's) */
    const char *desc;       /* for `inspect` */
    int block_elems;        /* elements per block along a row; 0: per GGML block type */
    int block_bytes;        /* data bytes per block; 0: per GGML block type */
    df_scale_layout scales; /* the scale sidecar (a separate tensor), if any */
    int scale_bytes;        /* bytes per scale entry; 0: by df_weight.scale_dtype */
} df_wfmt_traits;
/* NULL for a value outside df_wfmt. */
const df_wfmt_traits *df_wfmt_traits_of(df_wfmt f);
/* Bytes of one stored row of cols elements (partial blocks rounded up), -1 for
 * DF_W_GGML (its row size comes from the GGML block type) or an unknown format. */
int64_t df_wfmt_row_bytes(df_wfmt f, int64_t cols);
/* Bytes of one scale entry of dtype t. */
int df_scale_dtype_bytes(df_scale_dtype t);

const char *df_wfmt_name(const df_weight *w);
/* Bytes of the weight (incl. scales). */
int64_t df_weight_bytes(const df_weight *w);
/* Bytes of the weight's scale sidecar, a separate tensor (FP8, INT4, MXFP4, row-int8); 0 for formats without one. */
int64_t df_weight_scale_bytes(const df_weight *w);
/* DF_W_FP8: w->nan_codes, found now if it is DF_NAN_CODES_UNCHECKED (a scan of every row's first cols bytes
 * for 0x7f / 0xff, one read of the weight) and stored in *w (the model's weight objects are never const
 * objects; two threads that both scan store the same answer). Other formats: DF_NAN_CODES_MAYBE. */
int df_weight_nan_codes(const df_weight *w);
/* w->nan_codes for FP8 bytes whose answer is kept outside w, in *memo (an expert-cache slot's word,
 * store/source.h part_notes: w is a view rebuilt per use, the word lives as long as the bytes, 0 at each
 * load). The first use of the bytes (*memo UNCHECKED) is MAYBE, no scan (*memo becomes USED_ONCE: an expert
 * loaded for one token does not pay a read of its bytes); the second scans them (df_weight_nan_codes) and
 * keeps the answer in *memo; later uses copy it. memo NULL or not FP8: MAYBE. Returns w->nan_codes. */
int df_weight_nan_codes_memo(df_weight *w, int *memo);
/* Host helpers on stored bytes (the loaders' embedding rows and small vectors): W[r,:] -> f32, W[r,:] . x. */
void df_dequant_row(const df_weight *w, int64_t r, float *out);
float df_dot_row(const df_weight *w, int64_t r, const float *x);

/* ---- backend memory ----------------------------------------------------- */
/* Activations and state live in backend memory, reached only through
 * df_act pointers. The type is incomplete on purpose: model code cannot
 * index or dereference one (a stray host loop does not compile); DF_AT
 * offsets a pointer by a number of f32 elements (backend addresses are
 * linear, as device pointers are). */
typedef struct df_act df_act;
static inline df_act *df_act_at(df_act *p, size_t floats) { return (df_act *)(void *)((char *)p + floats * sizeof(float)); }
static inline const df_act *df_act_atc(const df_act *p, size_t floats) {
    return (const df_act *)(const void *)((const char *)p + floats * sizeof(float));
}
#define DF_AT(p, floats) _Generic((p), const df_act *: df_act_atc, default: df_act_at)((p), (size_t)(floats))

/* ---- operation arguments ------------------------------------------------ */
/* One product of a batch: Y[n][w->rows] = X[n][w->cols] W^T (n = 1: y = W x). */
typedef struct {
    const df_weight *w;
    const df_act *x;
    df_act *y;
} df_mv_job;

/* GQA, causal: for each of n queries at positions pos0.. and each head,
 * softmax(q . K[j] * scale) over j <= position, then the weighted sum of
 * V[j]. kv: per position a K row then a V row, [2][n_kv_heads x head_dim]. */
typedef struct {
    const df_act *q;  /* [n][n_heads][head_dim] */
    const df_act *kv; /* [pos0 + n][2][n_kv_heads * head_dim] */
    df_act *out;      /* [n][n_heads][head_dim] */
    int n, pos0, n_heads, n_kv_heads, head_dim;
    float scale;
} df_attn_gqa_args;

/* MLA on the latent cache, absorbed form: scores (W_uk^T q_nope) . c_j +
 * q_rope . k_rot_j, values W_uv (sum_j p_j c_j); W_uk/W_uv are rows of
 * kv_b [H*(nope+v) x kv_lora] in its stored format, or of the GGUF split
 * k_b [H*kv_lora x nope] / v_b [H*v x kv_lora] when their data is set. */
typedef struct {
    const df_act *q;     /* [n][n_heads][nope + rope] (rope part rotated) */
    const df_act *cache; /* [pos0 + n][kv_lora + rope] */
    df_act *out;         /* [n][n_heads][v_dim] */
    const df_weight *kv_b, *k_b, *v_b;
    int n, pos0, n_heads, nope, rope, kv_lora, v_dim;
    float scale;
} df_attn_mla_args;

/* A layer of a decode_layers run: GQA with per-head q/k RMSNorm and rotate-half RoPE over a K/V cache laid out as
 * gqa.c keeps it ([positions][K row | V row]), no biases; a softmax top-k routed MoE (renormalised, SiLU-gated
 * experts, none shared) whose routed experts the backend holds itself (the device table of layer `layer`); plain
 * residuals, pre-norms. */
typedef struct {
    const df_weight *wq, *wk, *wv, *wo, *router;
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm; /* params */
    df_act *cache;
    int layer;
} df_decode_layer;
typedef struct {
    const df_decode_layer *layers;
    int n_layers;
    df_act *h;             /* [hidden]: the residual stream, in and out */
    const df_act *rope_cs; /* [head_dim / 2][cos, sin] of pos (rope_table) */
    int pos;               /* the cache rows 0 .. pos - 1 are read, row pos written */
    int hidden, n_heads, n_kv_heads, head_dim, n_experts, k, moe_inter;
    float eps, scale;      /* the RMSNorms' epsilon; the attention's softmax scale */
} df_decode_layers_args;

/* Gated activations out = act(g) * u, in f32:
 *   SILU     silu(g) * u                                    (SiLU-GLU)
 *   SITU     b tanh(g / b) sigmoid(g) * [c tanh(u / c)]    (Moonshot's SiTU: b = p0, c = p1; p1 = 0: u as is)
 *   SIGMOID  sigmoid(g) * u                                 (output gates) */
typedef enum { DF_GATE_SILU, DF_GATE_SITU, DF_GATE_SIGMOID, DF_GATE_N } df_gate_kind;

/* Routers: per token, logits [E] -> k expert ids (host) and weights.
 * SOFTMAX_TOPK (Qwen3-MoE): softmax over all E in f32, top k (ties to the
 * lower index), renormalised over the k when norm_topk.
 * SIGMOID_GROUPS (DeepSeek-V3 / Kimi "noaux_tc"): s = sigmoid(logit), choice
 * = s + bias; groups ranked by the sum of their top-2 choices, topk_group
 * groups kept, top k experts by choice among them; weights s (unbiased),
 * / (sum + 1e-20) when norm_topk, times scaling. */
typedef enum { DF_ROUTE_SOFTMAX_TOPK, DF_ROUTE_SIGMOID_GROUPS, DF_ROUTE_N } df_route_kind;
typedef struct {
    df_route_kind kind;
    const df_act *logits;   /* [n][n_experts] */
    int *ids;               /* host [n][k]: the experts */
    df_act *w;              /* [n][k] their weights, or NULL (ids only: a prediction) */
    int n, n_experts, k;
    int norm_topk;
    int n_group, topk_group;  /* SIGMOID_GROUPS: n_experts % n_group == 0, topk_group * E / n_group >= k */
    float scaling;            /* SIGMOID_GROUPS */
    const float *bias;        /* param [n_experts], SIGMOID_GROUPS */
} df_route_args;

/* One MoE layer's routed experts for n tokens without the host (moe_fused,
 * optional): the router (route.kind, .logits on the device, .n_experts, .k,
 * .norm_topk, the groups, .scaling, .bias; .ids unused) runs ON the device
 * with the host route's arithmetic and tie rule, its weights go to route.w
 * [n][k] (device), the chosen experts' gate/up products, gate and down
 * products run from the device's own table of the layer's VRAM-resident
 * experts (their outputs in d, row (t, k)) and out = the combine of d by the
 * weights, in (t, k) order: the expert stage of the host-routed path with
 * nothing read back. out may alias x (the latent MoE's input). */
typedef struct {
    df_route_args route;
    int layer;                /* the layer's index (df_expert_ident) */
    const df_act *x;          /* [n][D] the routed experts' input */
    df_act *out;              /* [n][D] */
    df_act *g, *u;            /* scratch [n * k][I] */
    df_act *d;                /* [n * k][D] each expert's output */
    int D, I;                 /* expert input/output width, intermediate width */
    df_gate_kind gate;
    float p0, p1;
    df_act *ids_out;          /* NULL, or [n][k] int32: the chosen ids (tests) */
} df_moe_fused_args;

/* Depthwise causal convolution over n tokens of C channels, width W (the
 * short convolution of KDA / Mamba-style mixers): with xx = the W-1 inputs
 * kept in state followed by x,
 *   y[t][c] = sum_{j<W} w[c][j] * xx[t + j][c]     (tap W-1 is the current token)
 * (+ bias[c]), then silu(y) if silu. state [C][W-1] holds each channel's
 * last W-1 inputs, oldest first (zero at position 0) and is updated to the
 * last W-1 of xx. y may not alias x. */
typedef struct {
    df_act *y;              /* [n][C] */
    const df_act *x;        /* [n][C] */
    df_act *state;          /* [C][W-1] */
    const float *w;         /* param [C][W] */
    const float *bias;      /* param [C] or NULL */
    int n, C, W, silu;
} df_conv1d_args;

/* KDA (Kimi Delta Attention) recurrence, per head h of nh, key dim dk,
 * value dim dv, state S [dk][dv] (S[i][j]: key channel i, value channel j):
 * for each token t in order (q first scaled by scale):
 *   S = diag(exp(g_t)) S;  u = v_t - S^T k_t;  S = S + beta_t k_t u^T;  o_t = S^T q_t
 * (as fla's naive_recurrent_kda, f32). q, k, g, v, o token-major. */
typedef struct {
    df_act *o;              /* [n][nh][dv] */
    const df_act *q, *k;    /* [n][nh][dk] */
    const df_act *v;        /* [n][nh][dv] */
    const df_act *g;        /* [n][nh][dk] log of the per-key-channel decay */
    const df_act *beta;     /* [n][nh] */
    df_act *S;              /* [nh][dk][dv], updated in place */
    int n, nh, dk, dv;
    float scale;
} df_kda_args;

/* KDA's forget gate, per token t, head h < nh, channel i < d (c = h*d + i):
 * x = f[t][c] + dt_bias[c]; A = exp(A_log[h]);
 *   with a lower bound lb (K3):  g = lb * sigmoid(A x)
 *   without (Kimi Linear):       g = -A * softplus(x)   (torch's softplus, threshold 20)
 * g is the log of the decay kda_scan applies. g may alias f. */
typedef struct {
    df_act *g;              /* [n][nh * d] */
    const df_act *f;        /* [n][nh * d] */
    const float *A_log;     /* param [nh] */
    const float *dt_bias;   /* param [nh * d] */
    int n, nh, d;
    int has_lower_bound;
    float lower_bound;
} df_kda_gate_args;

#define DF_ATTN_RES_MAX_BLOCKS 512 /* completed blocks (<= layers; the model's layer limit) */
/* Block attention residuals (Kimi K3), per token t < n of width h: with
 * V = [blocks[0][t] .. blocks[nb-1][t], p[t]],
 *   score_i = sum_d (V_i,d / sqrt(mean_d V_i^2 + eps)) * (norm_w_d * proj_w_d)
 *   out[t] = sum_i softmax(score)_i V_i
 * blocks[b] starts at blocks + b * block_stride floats. out may not alias the inputs. */
typedef struct {
    df_act *out;            /* [n][h] */
    const df_act *blocks;   /* nb x [n][h], block_stride apart */
    size_t block_stride;
    int nb;
    const df_act *p;        /* [n][h] the partial sum */
    const float *norm_w, *proj_w; /* params [h] */
    int n, h;
    float eps;
} df_attn_res_args;

/* Per-head q/k RMSNorm then RoPE of one attention layer (qk_norm_rope, optional):
 * rmsnorm(q rows of hd by q_norm, k rows of hd by k_norm, eps) in place, then
 * rope(q: n tokens x nq heads, k: n x nk heads, dims [0, rope_dim), cs,
 * interleaved), then (kc set) copy_rows of the n rotated k rows [nk*hd] to
 * kc + t*kv_stride and of the n v rows [nk*hd] to vc + t*kv_stride (the K/V
 * cache rows of these positions): exactly those operations issued in that
 * order (the wrapper df_qk_norm_rope issues them when the entry is NULL). */
typedef struct {
    df_act *q, *k;                 /* [n][nq][hd], [n][nk][hd], contiguous, in place */
    const float *q_norm, *k_norm;  /* params [hd] */
    int n, nq, nk, hd, rope_dim;   /* rope_dim even, <= hd */
    float eps;
    const df_act *cs;              /* rope_table's [n][rope_dim/2][cos, sin] */
    int interleaved;
    const df_act *v;               /* [n][nk][hd] (with kc) */
    df_act *kc, *vc;               /* NULL: no copy; else the cache rows, kv_stride floats apart, not overlapping q, k, v */
    size_t kv_stride;
} df_qk_norm_rope_args;

/* What a backend with memory tiers keeps where (tier_stats); bytes. */
typedef struct {
    int64_t budget;                 /* device memory budget (--gpu-memory, or free memory minus a margin at start) */
    int64_t used;                   /* device memory in use now, every kind */
    int64_t spine_dev_bytes;        /* registered weights resident on the device */
    int64_t spine_host_bytes;       /* registered weights left in host memory (over budget), copied per product */
    int spine_host_weights;
    int64_t cache_bytes;            /* the device expert cache: slots x slot bytes (0 until the first routed expert) */
    int cache_slots;
    int64_t cache_hits, cache_misses, cache_evictions, cache_bypasses; /* expert parts */
    int64_t pinned_bytes;           /* host memory page-locked through host_pin */
    int64_t h2d_expert_bytes;       /* routed experts copied host -> device */
    int64_t h2d_expert_pinned_bytes;/* ... of which from pinned memory */
    int64_t h2d_expert_staged_bytes;/* ... of which through page-locked staging buffers (from pageable memory) */
    int64_t h2d_spine_bytes;        /* host-side spine weights copied per product */
    int eviction_lfu;               /* the cache's policy: 0 LRU, 1 LFU */
} df_tier_stats;

/* ---- the table ---------------------------------------------------------- */
typedef struct df_backend_ops {
    const char *name;
    /* memory: alloc returns zeroed backend memory of n floats (NULL when out of memory) */
    df_act *(*alloc)(size_t n);
    void (*free)(df_act *p);
    void (*write)(df_act *dst, const float *src, size_t n);   /* host -> backend */
    void (*read)(float *dst, const df_act *src, size_t n);    /* backend -> host */
    void (*copy)(df_act *dst, const df_act *src, size_t n);   /* within the backend, no overlap */
    void (*zero)(df_act *dst, size_t n);
    /* rows of cols floats: dst[r*ds + i] = src[r*ss + i] */
    void (*copy_rows)(df_act *dst, size_t ds, const df_act *src, size_t ss, int rows, int cols);
    /* dst[j] = src[idx[j]] (gather) / dst[idx[j]] = src[j] (scatter), rows of cols floats; idx host [n] */
    void (*gather_rows)(df_act *dst, const df_act *src, const int *idx, int n, int cols);
    void (*scatter_rows)(df_act *dst, const int *idx, const df_act *src, int n, int cols);

    /* weights and params (0 or a negative DF_E*) */
    int (*weight_register)(df_weight *w);
    void (*weight_unregister)(df_weight *w);
    int (*param_register)(const float *p, size_t n);

    /* products: several independent products in one dispatch (their rows are
     * shared across the device together). Each output row is computed the
     * same way whatever the batch, so grouping does not change bits. */
    void (*matmul_batch)(const df_mv_job *jobs, int n_jobs, int n);

    /* attention cores (all tokens and heads of a batch) */
    void (*attn_gqa)(const df_attn_gqa_args *a);
    void (*attn_mla)(const df_attn_mla_args *a);

    /* RMSNorm of rows of cols floats, as HF: out = g * (x / sqrt(mean(x^2) + eps));
     * row r at x + r*xs, out + r*os (in place allowed). Per-head norms are rows of head_dim. */
    void (*rmsnorm)(df_act *out, size_t os, const df_act *x, size_t xs, const float *g, int rows, int cols, float eps);
    /* cs[t][i] = (cos, sin)((pos0 + t) * inv_freq[i]) * scale, t < n, i < half: the rotation of n positions */
    void (*rope_table)(df_act *cs, int pos0, int n, const float *inv_freq, int half, float scale);
    /* Rotary embedding in place of dims [0, dim) of the head vectors at
     * x + t*ts + h*hs (t < n, h < nh) by cs[t] ([dim/2][cos, sin]) of rope_table:
     * interleaved rotates pairs (2i, 2i+1), otherwise (i, i + dim/2) (rotate-half). */
    void (*rope)(df_act *x, int n, int nh, size_t ts, size_t hs, int dim, const df_act *cs, int interleaved);

    /* element-wise */
    void (*add)(df_act *y, const df_act *x, size_t n);                    /* y += x */
    void (*add_bias)(df_act *y, const float *b, int rows, int cols);      /* y[r][i] += b[i] */
    void (*axpy)(df_act *y, float a, const df_act *x, size_t n);          /* y += a x */
    void (*scale)(df_act *y, float a, size_t n);                          /* y *= a */
    void (*gate)(df_act *out, const df_act *g, const df_act *u, size_t n, df_gate_kind kind, float p0, float p1); /* out = act(g) * u (out may be g or u) */
    void (*sigmoid)(df_act *x, size_t n);                                 /* x = sigmoid(x) */
    /* rows of cols floats in place: x = x * scale / sqrt(sum x^2 + eps) (fla's l2norm, then a scale) */
    void (*l2norm)(df_act *x, int rows, int cols, float eps, float scale);
    /* block attention residuals (see df_attn_res_args) */
    void (*attn_res)(const df_attn_res_args *a);

    /* MoE */
    void (*route)(const df_route_args *a);
    /* out[t] = sum_k w[t][k] * x[t][k] (k in order), t < n: the weighted sum of
     * each token's expert outputs; x [n][k][cols], w [n][k], out [n][cols] */
    void (*moe_combine)(df_act *out, const df_act *x, const df_act *w, int n, int k, int cols);

    /* recurrent mixers */
    void (*causal_conv1d)(const df_conv1d_args *a);
    void (*kda_scan)(const df_kda_args *a);
    void (*kda_gate)(const df_kda_gate_args *a);

    /* memory tiers (optional: NULL in a backend that reads host memory in
     * place, like the CPU; the wrappers below then do nothing) */
    int (*host_pin)(void *p, size_t bytes); /* page-locks host memory that products read often (expert-cache slots); 0 or DF_E* */
    void (*host_unpin)(void *p);
    void (*host_fence)(void);               /* returns once no copy still reads host memory handed to a product (the
                                               host expert cache calls it before it rewrites a slot) */
    void (*experts_done)(void);             /* the products of the experts handed over so far are all issued (the MoE
                                               code calls it after each acquire): a device cache may reuse their slots */
    void (*tier_reset)(void);               /* forgets cached experts (their model is closed) */
    void (*tier_stats)(df_tier_stats *out);

    /* device-routed MoE (optional: NULL on the CPU, whose route is on the
     * host anyway): moe_resident says whether moe_fused can run layer `layer`
     * (n_experts experts, k per token) for n tokens now, i.e. every expert of
     * the layer is resident in the device's expert cache (its device table is
     * filled) and n is 1: 1; 0: not now; 2 (any n): not yet, but the cache's
     * never-used slots hold the missing parts and the layer had no preload
     * yet: hand every part of the layer to moe_preload (a layer gets one).
     * moe_fused runs it (0; 1: declined, nothing
     * done: the caller takes the host-routed path; or a negative DF_E* code).
     * A device expert cache counts each fused token's k experts x 3 parts as
     * hits, and preloaded parts as misses (copied host -> device). */
    int (*moe_resident)(int layer, int n_experts, int k, int n);
    int (*moe_fused)(const df_moe_fused_args *a);
    /* copies the routed expert parts w[0..n) (ident set) that are not cached yet into free slots of the
     * device expert cache (never evicting); 0 or DF_E* */
    int (*moe_preload)(const df_weight *w, int n);

    /* Exact products (optional; the speculative verify pass): on = 1 asks that,
     * until on = 0, every matmul_batch issued by the calling thread with n > 1
     * gives for each token's row of Y exactly the bits that the same product
     * with n = 1 gives for that token's x alone (the decode product's order,
     * not the prefill GEMM's), at about the compute of n one-token products.
     * The same holds for attention (each position's output the bits of a
     * one-position step at that position: the CUDA backend launches its
     * decode attention a position at a time). Returns 1 when honoured; 2 when
     * honoured but a MoE layer's routed experts must run a position at a time
     * through the one-token path (the caller does: model/kinds/ffn.c), since
     * the device routes and combines a token's experts in kernels of their
     * own (moe_fused, whose bits the batched host-routed path does not give);
     * 0 when the backend cannot (its verify pass is then not bit-identical to
     * plain steps). NULL: not supported (0). */
    int (*exact_products)(int on);

    /* Fused operations (optional; NULL: the wrappers below issue the plain
     * operations they stand for, so a backend that names one must give the
     * composition's result; the CUDA backend gives its bits, one launch).
     * add_rmsnorm: y += x over rows x cols (contiguous rows), then
     * out = rmsnorm(y) by g as rmsnorm does (out [rows][cols], not aliasing y or x):
     * the residual add and the next norm of a layer. */
    void (*add_rmsnorm)(df_act *out, df_act *y, const df_act *x, const float *g, int rows, int cols, float eps);
    /* qk_norm_rope: see df_qk_norm_rope_args (q/k norms and the rotation of a GQA layer) */
    void (*qk_norm_rope)(const df_qk_norm_rope_args *a);

    /* Greedy decoding one token ahead (optional: all three or none; core/session.c's df_session_sample_ahead):
     * the host queues the forward pass of a token before it knows the token, so a device never waits for the
     * host between two tokens.
     * next_token: the argmax of logits[0..vocab) by df_argmax's rule (the first of equal maxima, NaN never
     * chosen, 0 when logits[0] is NaN) into the backend's token slot of the calling thread, where embed_token
     * reads it, and its read-back started; returns a ticket (>= 0).
     * next_token_wait: that id, waiting for the read-back; only the last 2 tickets of the thread can be waited for.
     * embed_token: out[0..emb->cols) = row (the token slot) of emb as df_dequant_row gives it: 0, or
     * DF_EUNSUPPORTED with nothing done when the backend holds no copy of emb it gathers rows of (out NULL: only
     * says which). */
    int64_t (*next_token)(const df_act *logits, int vocab);
    int32_t (*next_token_wait)(int64_t ticket);
    int (*embed_token)(const df_weight *emb, df_act *out);
    /* 1: operations return before their work is done (a device queue), so a pass queued ahead runs while the host
     * waits for its token; 0 (the CPU): queuing ahead gains nothing and is done only when asked (DELTAFIN_AHEAD=1) */
    int queued;

    /* One decode position through a run of layers in one operation (optional: NULL on the CPU; the CUDA backend's
     * persistent decode kernel, opt-in with DELTAFIN_CUDA_PERSIST=1 while it is unmeasured): h += every layer's
     * mixer and FFN in turn, each layer's K/V row of the position written to its cache, exactly what the op-by-op
     * path computes (model/forward.c calls it only for runs whose kinds it covers: df_decode_layer). 0: done; 1:
     * declined, nothing done (shapes, formats or tiers it does not cover: the caller takes the op-by-op path); or a
     * negative DF_E* code. a NULL: whether it is on at all (0: it may take runs; 1: it declines every one), so that a
     * verify pass (exact_products) knows whether plain steps may have bits of decode_layers' own. */
    int (*decode_layers)(const df_decode_layers_args *a);
} df_backend_ops;

extern const df_backend_ops df_backend_cpu;        /* best ISA, all threads */
extern const df_backend_ops df_backend_cpu_scalar; /* scalar kernels, one thread: the reference */
extern const df_backend_ops *df_be;                /* the selected backend */
/* The layer the calling thread's forward pass is in (-1 outside one): a
 * device backend names it in its error messages. */
#ifdef __cplusplus
extern thread_local int df_be_layer;
#else
extern _Thread_local int df_be_layer;
#endif

/* Starts the default backend with n_threads workers (0: all online cores); idempotent. */
void df_backend_init(int n_threads);
int df_backend_threads(void);
/* The backend called name ("cpu", "cpu-scalar", and "cuda" in a CUDA build), or NULL. */
const df_backend_ops *df_backend_find(const char *name);
/* Makes name the selected backend; 0 or DF_EINPUT (unknown name). */
int df_backend_select(const char *name);
/* 1 when this build has the CUDA backend (make CUDA=1). */
int df_backend_cuda_built(void);
/* The user's choice (df_options.backend): NULL or "" keeps the selection;
 * "cpu"; "cuda" (DF_EUNSUPPORTED with one line in err outside a CUDA build
 * or without a device); "auto" (CUDA when built and a device is present,
 * else CPU). 0 or a DF_E* code with the message in err. */
int df_backend_choose(const char *name, char *err, size_t errlen);
/* The device memory budget of the selected backend (--gpu-memory) before a
 * model is attached: budget bytes (0: free device memory minus a margin),
 * reserve = the share kept from the spine for activations, session state and
 * scratch, expert_bytes = the model's routed experts (a device expert cache
 * is never larger). Nothing on the CPU. */
void df_backend_set_memory(int64_t budget, int64_t reserve, int64_t expert_bytes);
/* 1 while a caller that retries smaller allocates (a session's activations for 512-position prompt calls): an alloc the
 * memory budget refuses returns NULL without its message; 0 (the default): the message names the numbers */
extern int df_alloc_quiet;

/* ---- call-site wrappers (model code) ------------------------------------ */
static inline df_act *df_alloc(size_t n) { return df_be->alloc(n); }
static inline void df_free(df_act *p) { if (p) df_be->free(p); }
static inline void df_write(df_act *dst, const float *src, size_t n) { df_be->write(dst, src, n); }
static inline void df_read(float *dst, const df_act *src, size_t n) { df_be->read(dst, src, n); }
static inline void df_copy(df_act *dst, const df_act *src, size_t n) { df_be->copy(dst, src, n); }
static inline void df_zero(df_act *dst, size_t n) { df_be->zero(dst, n); }
static inline void df_copy_rows(df_act *dst, size_t ds, const df_act *src, size_t ss, int rows, int cols) { df_be->copy_rows(dst, ds, src, ss, rows, cols); }
static inline void df_gather(df_act *dst, const df_act *src, const int *idx, int n, int cols) { df_be->gather_rows(dst, src, idx, n, cols); }
static inline void df_scatter(df_act *dst, const int *idx, const df_act *src, int n, int cols) { df_be->scatter_rows(dst, idx, src, n, cols); }
static inline int df_weight_register(df_weight *w) { return df_be->weight_register(w); }
static inline void df_weight_unregister(df_weight *w) { df_be->weight_unregister(w); }
static inline int df_param_register(const float *p, size_t n) { return df_be->param_register(p, n); }
static inline void df_matmul_batch(const df_mv_job *jobs, int n_jobs, int n) { df_be->matmul_batch(jobs, n_jobs, n); }
/* Y[n][rows] = X[n][cols] W^T */
static inline void df_matmul(const df_weight *w, const df_act *x, int n, df_act *y) {
    const df_mv_job j = {w, x, y};
    df_be->matmul_batch(&j, 1, n);
}
static inline void df_attn_gqa(const df_attn_gqa_args *a) { df_be->attn_gqa(a); }
static inline void df_attn_mla(const df_attn_mla_args *a) { df_be->attn_mla(a); }
static inline void df_rmsnorm_rows(df_act *out, size_t os, const df_act *x, size_t xs, const float *g, int rows, int cols, float eps) {
    df_be->rmsnorm(out, os, x, xs, g, rows, cols, eps);
}
static inline void df_rope_table(df_act *cs, int pos0, int n, const float *inv_freq, int half, float scale) { df_be->rope_table(cs, pos0, n, inv_freq, half, scale); }
static inline void df_rope(df_act *x, int n, int nh, size_t ts, size_t hs, int dim, const df_act *cs, int interleaved) {
    df_be->rope(x, n, nh, ts, hs, dim, cs, interleaved);
}
static inline void df_add(df_act *y, const df_act *x, size_t n) { df_be->add(y, x, n); }
static inline void df_add_bias(df_act *y, const float *b, int rows, int cols) { df_be->add_bias(y, b, rows, cols); }
static inline void df_axpy(df_act *y, float a, const df_act *x, size_t n) { df_be->axpy(y, a, x, n); }
static inline void df_scale(df_act *y, float a, size_t n) { df_be->scale(y, a, n); }
static inline void df_gate(df_act *out, const df_act *g, const df_act *u, size_t n, df_gate_kind k, float p0, float p1) { df_be->gate(out, g, u, n, k, p0, p1); }
static inline void df_sigmoid(df_act *x, size_t n) { df_be->sigmoid(x, n); }
static inline void df_l2norm(df_act *x, int rows, int cols, float eps, float scale) { df_be->l2norm(x, rows, cols, eps, scale); }
static inline void df_attn_res(const df_attn_res_args *a) { df_be->attn_res(a); }
static inline void df_kda_gate(const df_kda_gate_args *a) { df_be->kda_gate(a); }
static inline void df_route(const df_route_args *a) { df_be->route(a); }
static inline void df_moe_combine(df_act *out, const df_act *x, const df_act *w, int n, int k, int cols) { df_be->moe_combine(out, x, w, n, k, cols); }
static inline void df_causal_conv1d(const df_conv1d_args *a) { df_be->causal_conv1d(a); }
static inline void df_kda_scan(const df_kda_args *a) { df_be->kda_scan(a); }
static inline int df_host_pin(void *p, size_t bytes) { return df_be->host_pin ? df_be->host_pin(p, bytes) : 0; }
static inline void df_host_unpin(void *p) { if (df_be->host_unpin) df_be->host_unpin(p); }
static inline void df_host_fence(void) { if (df_be->host_fence) df_be->host_fence(); }
static inline void df_experts_done(void) { if (df_be->experts_done) df_be->experts_done(); }
static inline void df_tier_reset(void) { if (df_be->tier_reset) df_be->tier_reset(); }
static inline int df_moe_resident(int layer, int n_experts, int k, int n) { return df_be->moe_resident && df_be->moe_fused ? df_be->moe_resident(layer, n_experts, k, n) : 0; }
static inline int df_moe_fused(const df_moe_fused_args *a) { return df_be->moe_fused ? df_be->moe_fused(a) : 1; }
static inline int df_moe_preload(const df_weight *w, int n) { return df_be->moe_preload ? df_be->moe_preload(w, n) : 0; }
/* backend.h: exact_products. 1: honoured (the products from here on until
 * off are the one-token bits), 2: honoured with a MoE layer's experts a
 * position at a time, 0: the backend has no exact mode. */
static inline int df_exact_products(int on) { return df_be->exact_products ? df_be->exact_products(on) : 0; }
/* The fused operations on backend be, or their plain composition where be has none (tests call these with a
 * named backend; the model calls the df_be forms below). */
static inline void df_add_rmsnorm_on(const df_backend_ops *be, df_act *out, df_act *y, const df_act *x, const float *g, int rows, int cols,
                                     float eps) {
    if (be->add_rmsnorm) {
        be->add_rmsnorm(out, y, x, g, rows, cols, eps);
        return;
    }
    be->add(y, x, (size_t)rows * (size_t)cols);
    be->rmsnorm(out, (size_t)cols, y, (size_t)cols, g, rows, cols, eps);
}
static inline void df_qk_norm_rope_on(const df_backend_ops *be, const df_qk_norm_rope_args *a) {
    if (be->qk_norm_rope) {
        be->qk_norm_rope(a);
        return;
    }
    const size_t hd = (size_t)a->hd;
    be->rmsnorm(a->q, hd, a->q, hd, a->q_norm, a->n * a->nq, a->hd, a->eps);
    be->rmsnorm(a->k, hd, a->k, hd, a->k_norm, a->n * a->nk, a->hd, a->eps);
    be->rope(a->q, a->n, a->nq, (size_t)a->nq * hd, hd, a->rope_dim, a->cs, a->interleaved);
    be->rope(a->k, a->n, a->nk, (size_t)a->nk * hd, hd, a->rope_dim, a->cs, a->interleaved);
    if (a->kc) {
        be->copy_rows(a->kc, a->kv_stride, a->k, (size_t)a->nk * hd, a->n, a->nk * a->hd);
        be->copy_rows(a->vc, a->kv_stride, a->v, (size_t)a->nk * hd, a->n, a->nk * a->hd);
    }
}
/* y += x; out = rmsnorm(y) (rows of cols, contiguous) */
static inline void df_add_rmsnorm(df_act *out, df_act *y, const df_act *x, const float *g, int rows, int cols, float eps) {
    df_add_rmsnorm_on(df_be, out, y, x, g, rows, cols, eps);
}
static inline void df_qk_norm_rope(const df_qk_norm_rope_args *a) { df_qk_norm_rope_on(df_be, a); }
/* 0 with *out filled, or -1 (a backend without tiers; *out zeroed). */
static inline int df_tier_stats_get(df_tier_stats *out) {
    memset(out, 0, sizeof *out);
    if (!df_be->tier_stats) return -1;
    df_be->tier_stats(out);
    return 0;
}

#endif
