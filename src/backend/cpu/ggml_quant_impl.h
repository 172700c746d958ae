/* ggml_quant_impl.h - private to the ggml_quant*.c kernels: the block
 * layouts (with their sizes pinned by _Static_assert) and the per-ISA kernel
 * tables that ggml_quant.c dispatches to.
 *
 * Block structs document the byte layout; blocks in files are unaligned, so
 * kernels read fields at offsetof() through memcpy or unaligned loads,
 * never by dereferencing a struct pointer. f16 fields are raw IEEE half bits.
 */
#ifndef DF_BACKEND_CPU_GGML_QUANT_IMPL_H
#define DF_BACKEND_CPU_GGML_QUANT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define DF_QK_K 256

typedef struct { uint16_t d; uint8_t qs[16]; } df_blk_q4_0;                 /* w = d*(q-8) */
typedef struct { uint16_t d, m; uint8_t qs[16]; } df_blk_q4_1;              /* w = d*q + m */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } df_blk_q5_0;  /* w = d*(q-16) */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } df_blk_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } df_blk_q8_0;                  /* w = d*q */
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } df_blk_q2_k;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } df_blk_q3_k;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } df_blk_q4_k;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } df_blk_q5_k;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } df_blk_q6_k;
typedef struct { uint8_t e; uint8_t qs[16]; } df_blk_mxfp4;                 /* w = 2^(e-128) * e2m1x2[q] */

_Static_assert(sizeof(df_blk_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(df_blk_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(df_blk_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(df_blk_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(df_blk_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(df_blk_q2_k) == 84, "q2_K block");
_Static_assert(sizeof(df_blk_q3_k) == 110, "q3_K block");
_Static_assert(sizeof(df_blk_q4_k) == 144, "q4_K block");
_Static_assert(sizeof(df_blk_q5_k) == 176, "q5_K block");
_Static_assert(sizeof(df_blk_q6_k) == 210, "q6_K block");
_Static_assert(sizeof(df_blk_mxfp4) == 17, "mxfp4 block");
_Static_assert(offsetof(df_blk_q2_k, d) == 80 && offsetof(df_blk_q3_k, d) == 108 &&
                   offsetof(df_blk_q5_k, qs) == 48 && offsetof(df_blk_q6_k, d) == 208,
               "k-quant field offsets");

/* One ISA's kernels for one type (any member may be NULL: falls back). */
typedef struct {
    void (*dequant)(const uint8_t *src, float *dst, int64_t n);
    float (*dot)(const uint8_t *row, const float *x, int64_t n);
    void (*dot_multi)(const uint8_t *row, const float *x, int64_t n, int m, int64_t x_stride,
                      float *out, int64_t out_stride);
    void (*dot4)(const uint8_t *row, size_t row_stride, const float *x, int64_t n, float *out);
    /* prepared x (df_ggml_px): px_prep fills aux (at most n/8 + 16 floats),
     * px_dot runs nr rows against x and aux; both or neither are set */
    void (*px_prep)(const float *x, int64_t n, float *aux);
    void (*px_dot)(const uint8_t *row, size_t row_stride, int64_t nr, const float *x, const float *aux,
                   int64_t n, float *out);
} df_ggml_kernels;

/* px_dot for nt (2..DF_GGML_PXM) prepared activations at once (a verify
 * pass): out[t*os + k] the bits px_dot gives for x[t], aux[t]; each weight
 * block decoded once per group of them: up to 6 for Q4_1, 8 for Q8_0, 3 for
 * the K-quants (the tokens' accumulators and a block's codes fill the 16
 * AVX2 registers; ggml_quant_avx2.c). 16: a pass of --spec-max 8..15 drafts
 * is one call, not a call and a lone token. df_ggml_pxm_avx2 returns the fused
 * kernel of type when px_dot is the AVX2 prepared-x kernel it matches, else
 * NULL (the caller then runs px_dot once per activation). */
#define DF_GGML_PXM 16
typedef void (*df_ggml_pxm_fn)(const uint8_t *row, size_t row_stride, int64_t nr, int nt, const float *const *x,
                               const float *const *aux, int64_t n, float *out, int64_t os);
df_ggml_pxm_fn df_ggml_pxm_avx2(int type,
                                void (*px_dot)(const uint8_t *, size_t, int64_t, const float *, const float *, int64_t, float *));

/* The prefill GEMM's panel of 16 rows (df_ggml_pack16); NULL: no kernel. */
typedef void (*df_ggml_pack16_fn)(const uint8_t *rows, size_t row_stride, int64_t n, float *P);
df_ggml_pack16_fn df_ggml_pack16_avx2(int type);

/* NULL when that ISA has no kernels for type. Only call when the CPU
 * supports the ISA. */
const df_ggml_kernels *df_ggml_kernels_avx2(int type);
const df_ggml_kernels *df_ggml_kernels_avx512(int type);

/* The MXFP4 e2m1 values, doubled (the scale is 2^(e-128), half of e8m0). */
#define DF_E2M1X2 {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

#endif
