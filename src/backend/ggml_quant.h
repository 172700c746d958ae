/* ggml_quant.h - GGUF/GGML block types executed as stored.
 *
 * A row of a GGML-typed tensor is a sequence of fixed-size blocks (Q4_0: 32
 * weights in 18 bytes, Q4_K: 256 in 144, ...; F32/F16/BF16 are "blocks" of
 * one element). Nothing here re-quantizes anything: weights are decoded to
 * f32 inside the kernels, and activations stay f32.
 *
 * Contracts shared by every function:
 *   - type is a GGML type id (DF_GGML_* in format/gguf.h) for which
 *     df_ggml_traits_of() is non-NULL; other ids are a caller bug (the model
 *     loader reports unsupported types by tensor name before calling here).
 *   - n is a multiple of the type's block_elems; row/src point at the first
 *     block and need no alignment.
 *   - df_ggml_dequant_row is bit-exact to gguf-py's gguf.quants.dequantize
 *     (same products, same rounding, no fused multiply-add) on every ISA.
 *   - df_ggml_dot / df_ggml_dot_multi equal dot(dequant(row), x) up to f32
 *     rounding of a reordered sum (relative 1e-5 of sum |w_i x_i| in tests).
 *   - All functions are thread-safe and allocate nothing.
 * The ISA (AVX-512, AVX2, scalar) is picked at run time from the CPU.
 */
#ifndef DF_BACKEND_GGML_QUANT_H
#define DF_BACKEND_GGML_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name; /* "Q4_K" */
    int block_elems;  /* weights per block */
    int block_bytes;  /* bytes per block */
} df_ggml_traits;

/* Supported types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, MXFP4. NULL for any other id (IQ*, TQ*, Q8_K, ...). */
const df_ggml_traits *df_ggml_traits_of(int type);

/* Bytes of a row of n weights (n a multiple of block_elems). */
int64_t df_ggml_row_bytes(int type, int64_t n);

/* dst[0..n) = the weights of the row at src. */
void df_ggml_dequant_row(int type, const void *src, float *dst, int64_t n);

/* sum_i w_i * x_i over one row of n weights; x is f32[n]. */
float df_ggml_dot(int type, const void *row, const float *x, int64_t n);

/* One weight row against m activation vectors: out[j*out_stride] =
 * dot(row, x + j*x_stride) for j < m. Decodes each weight block once per
 * group of vectors (the prefill path). */
void df_ggml_dot_multi(int type, const void *row, const float *x, int64_t n, int m,
                       int64_t x_stride, float *out, int64_t out_stride);

/* Four rows at once (row k at row + k*row_stride bytes) against one x:
 * out[k] = dot(row k, x). Each block of x is read once for the four rows
 * (decode is bound by x traffic from L1/L2, not only by the weight stream). */
void df_ggml_dot4(int type, const void *row, size_t row_stride, const float *x, int64_t n, float *out);

/* The prefill GEMM's k-major panel of 16 rows (backend/cpu/cpu.c mm_rows):
 * P[k*16 + i] = weight k of row i (at rows + i*row_stride), k < n, the
 * values df_ggml_dequant_row gives, bit for bit, dequantized straight into
 * the panel (no row buffer, no float transpose). Returns 0, or -1 when the
 * ISA in effect has no panel kernel for type (the caller then dequantizes
 * rows and packs them). Kernels (AVX2, also used on AVX-512 CPUs): Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K. */
int df_ggml_pack16(int type, const void *rows, size_t row_stride, int64_t n, float *P);

/* ---- prepared activations (decode) --------------------------------------
 * A matrix-vector product reads one x against many rows. df_ggml_px_init
 * computes, once per (x, type), what the ISA's decode kernels share across
 * rows (sums of x per 16/32 weights for the offset and min terms:
 * sum_i (d*q_i + m) x_i = d * sum_i q_i x_i + m * sum_i x_i); df_ggml_px_dot
 * then runs rows against it, four at a time. The prepared data is a pure
 * function of x, so a row's result does not depend on which rows are run
 * together nor on how many threads share the rows: every row of one
 * df_ggml_px_dot call (four-row groups and remainder rows alike) runs the
 * same operations in the same order.
 *
 * Numerics: activations stay f32 and each product is an f32 multiply of a
 * decoded weight value and x; the scale and the offset/min are applied per
 * block to the block's partial sums (the order of additions is documented
 * per kernel in ggml_quant_avx2.c). Results agree with dot(dequant(row), x)
 * within f32 rounding relative to sum_i (|d q_i x_i| + |m x_i|) (which is
 * sum|w_i x_i| unless the offset cancels the weight). No state outside the
 * struct and aux: nothing is cached across calls. */
typedef struct {
    int type, isa;     /* isa: the kernels aux was prepared for (-1: none) */
    int64_t n;         /* row length */
    const float *x;    /* the activation, f32[n] (not copied) */
    const float *aux;  /* df_ggml_px_floats(type, n) floats, or NULL */
} df_ggml_px;

/* Floats of aux that df_ggml_px_init may write for a row of n (any ISA). */
size_t df_ggml_px_floats(int type, int64_t n);

/* Prepares x (f32[n], kept by pointer) for rows of type; aux: caller scratch
 * of df_ggml_px_floats(type, n) floats, valid while p is used. */
void df_ggml_px_init(df_ggml_px *p, int type, const float *x, int64_t n, float *aux);

/* out[k] = dot(row k, x) for k < nrows, row k at row + k*row_stride bytes.
 * Falls back to df_ggml_dot4/df_ggml_dot when the ISA in effect has no
 * prepared-x kernel for the type or is not the one p was prepared for. */
void df_ggml_px_dot(const df_ggml_px *p, const void *row, size_t row_stride, int64_t nrows, float *out);

/* The same for np prepared activations of one type and length (a verify
 * pass's tokens): out[t*out_stride + k] = dot(row k, x of p[t]), each the
 * bits df_ggml_px_dot(&p[t], ...) gives. Where the ISA has a fused kernel
 * (AVX2: Q4_1, Q8_0, Q5_0, Q4_K, Q6_K) each weight block is decoded once
 * per group of tokens (up to 6 for Q4_1, 8 for Q8_0, 3 for the others; with
 * more than one group, Q4_1 and Q8_0 run every group over a chunk of rows
 * before the next) and each token runs the one-token kernel's arithmetic
 * (same lanes, same order); otherwise one df_ggml_px_dot per token. */
void df_ggml_px_dot_multi(const df_ggml_px *p, int np, const void *row, size_t row_stride, int64_t nrows, float *out,
                          int64_t out_stride);

enum { DF_GGML_ISA_AUTO = -1, DF_GGML_ISA_SCALAR = 0, DF_GGML_ISA_AVX2 = 1, DF_GGML_ISA_AVX512 = 2 };

/* Forces an ISA (tests, benchmarks); DF_GGML_ISA_AUTO restores the best.
 * A request above what the CPU supports is clamped to the best supported. */
void df_ggml_set_isa(int isa);
int df_ggml_get_isa(void);           /* the ISA in effect */
int df_ggml_isa_supported(int isa);  /* 1 if this CPU (and OS) can run it */
const char *df_ggml_isa_name(int isa);

#endif
