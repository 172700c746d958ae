/* backend.h - the operations the model code uses: products of a weight in
 * its stored format with f32 activations, the attention cores of the mixer
 * kinds, and small f32 ops. (Not yet a table a GPU backend can implement:
 * activations are host pointers and the CPU backend is linked directly;
 * docs/ARCHITECTURE.md, "Not yet done".)
 *
 * A df_weight describes a matrix [rows x cols] (out x in) exactly as it is
 * stored in the checkpoint: the bytes are never rewritten; kernels
 * dequantize inside the dot product and accumulate in f32. The CPU backend
 * (src/backend/cpu) is the reference; its thread pool and its run-time
 * choice of AVX-512, AVX2 or scalar kernels are private to it
 * (backend/cpu/cpu.h). */
#ifndef DF_BACKEND_H
#define DF_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* DF_W_I8ROW: row-int8 (int8 values, one f32 scale per row): the opt-in,
 * NOT exact spine of a store built with --spine int8; never a checkpoint's
 * own format. */
typedef enum { DF_W_F32, DF_W_F16, DF_W_BF16, DF_W_FP8, DF_W_INT4, DF_W_GGML, DF_W_I8ROW } df_wfmt;
typedef enum { DF_SCALE_F32, DF_SCALE_BF16, DF_SCALE_F16 } df_scale_dtype;

typedef struct {
    df_wfmt fmt;
    int ggml_type;          /* DF_W_GGML: GGML block type id */
    int64_t rows, cols;     /* out x in */
    const uint8_t *data;    /* row r starts at data + r * row_bytes */
    size_t row_bytes;
    /* DF_W_FP8: scale_inv [ceil(rows/blk_r)][ceil(cols/blk_c)]
     * DF_W_INT4: weight_scale [rows][ceil(cols/group)]; data = int32 words, 8 nibbles each (q - 8) */
    const void *scale;
    df_scale_dtype scale_dtype;
    int blk_r, blk_c;       /* FP8 block; INT4: blk_c = group size */
    int64_t scale_cols;     /* scale entries per scale row */
} df_weight;

const char *df_wfmt_name(const df_weight *w);
/* Bytes of the weight (incl. scales). */
int64_t df_weight_bytes(const df_weight *w);
/* Bytes of the weight's scale sidecar, a separate tensor (FP8, INT4, row-int8); 0 for formats without one. */
int64_t df_weight_scale_bytes(const df_weight *w);

/* ---- backend ----------------------------------------------------------- */
/* Starts the backend with n_threads workers (0: all online cores); idempotent. */
void df_backend_init(int n_threads);
int df_backend_threads(void);

/* ---- kernels (single-threaded) ---------------------------------------- */
float df_dot_row(const df_weight *w, int64_t r, const float *x);       /* W[r,:] . x */
void df_dequant_row(const df_weight *w, int64_t r, float *out);         /* W[r,:] -> f32 */

/* ---- parallel operations ---------------------------------------------- */
/* Several independent products in one parallel dispatch (rows of all jobs
 * are split across threads together): y_i = W_i x_i for decode, or
 * Y_i[n][rows] = X_i[n][cols] W_i^T when n > 1. Fewer dispatches per token. */
typedef struct {
    const df_weight *w;
    const float *x;
    float *y;
} df_mv_job;
void df_matmul_batch(const df_mv_job *jobs, int n_jobs, int n);

/* y[rows] = W x (decode). */
void df_matvec(const df_weight *w, const float *x, float *y);
/* Rows [r0, r0+nr) only: y[nr]. */
void df_matvec_rows(const df_weight *w, int64_t r0, int64_t nr, const float *x, float *y);
/* Y[n][rows] = X[n][cols] W^T (prefill). */
void df_matmul(const df_weight *w, const float *X, int n, float *Y);
/* Transposed product over a row slice: y[cols] = sum_r W[r0+r,:] * x[r], r < nr. Single-threaded. */
void df_matvec_t_rows(const df_weight *w, int64_t r0, int64_t nr, const float *x, float *y);

/* ---- attention cores (the loops over positions and heads of the mixer
 * kinds; the model computes projections, norms, RoPE and writes the state) */
/* GQA, causal: for each of n queries at positions pos0.. and each head,
 * softmax(q . K[j] * scale) over j <= position, then the weighted sum of
 * V[j]. kv: per position a K row then a V row, [2][n_kv_heads x head_dim]. */
typedef struct {
    const float *q;   /* [n][n_heads][head_dim] */
    const float *kv;  /* [pos0 + n][2][n_kv_heads * head_dim] */
    float *out;       /* [n][n_heads][head_dim] */
    int n, pos0, n_heads, n_kv_heads, head_dim;
    float scale;
} df_attn_gqa_args;
void df_attn_gqa(const df_attn_gqa_args *a);
/* MLA on the latent cache, absorbed form: scores (W_uk^T q_nope) . c_j +
 * q_rope . k_rot_j, values W_uv (sum_j p_j c_j); W_uk/W_uv are rows of
 * kv_b [H*(nope+v) x kv_lora] in its stored format, or of the GGUF split
 * k_b [H*kv_lora x nope] / v_b [H*v x kv_lora] when their data is set. */
typedef struct {
    const float *q;      /* [n][n_heads][nope + rope] (rope part rotated) */
    const float *cache;  /* [pos0 + n][kv_lora + rope] */
    float *out;          /* [n][n_heads][v_dim] */
    const df_weight *kv_b, *k_b, *v_b;
    int n, pos0, n_heads, nope, rope, kv_lora, v_dim;
    float scale;
} df_attn_mla_args;
void df_attn_mla(const df_attn_mla_args *a);

/* ---- small ops (single-threaded, f32) --------------------------------- */
void df_rmsnorm(float *out, const float *x, const float *g, int n, float eps); /* out = g * x / rms(x), as HF RMSNorm */
void df_softmax(float *x, int n);
float df_dot_f32(const float *a, const float *b, int n);
void df_axpy(float *y, float a, const float *x, int n); /* y += a x */

#endif
