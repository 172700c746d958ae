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
    const uint8_t *data;    /* row r starts at data + r * row_bytes */
    size_t row_bytes;
    /* DF_W_FP8: scale_inv [ceil(rows/blk_r)][ceil(cols/blk_c)]
     * DF_W_INT4: weight_scale [rows][ceil(cols/group)]; data = int32 words, 8 nibbles each (q - 8)
     * DF_W_MXFP4: weight_scale uint8 E8M0 [rows][cols/32] (scale_dtype DF_SCALE_E8M0, blk_c 32) */
    const void *scale;
    df_scale_dtype scale_dtype;
    int blk_r, blk_c;       /* FP8 block; INT4, MXFP4: blk_r = 1, blk_c = group size */
    int64_t scale_cols;     /* scale entries per scale row */
} df_weight;

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
