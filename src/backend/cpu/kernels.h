/* kernels.h - per-ISA inner kernels of the CPU backend (internal).
 * Every kernel accumulates in f32 and reads weights exactly as stored.
 * _scalar is the reference; _avx2 and _avx512 must agree with it to f32
 * rounding (tests/unit/test_backend_kernels.c). */
#ifndef DF_CPU_KERNELS_H
#define DF_CPU_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* exact conversions */
static inline float df_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}
float df_f16_to_f32(uint16_t h);
/* MXFP4 (backend.h, DF_W_MXFP4): E2M1 code -> f32 (index = the nibble: bits
 * 0-2 magnitude, bit 3 sign, so 8 is -0.0); E8M0 scale byte -> 2^(s-127),
 * exact (s = 0: the subnormal 2^-127), 255 -> NaN (OCP MX). */
extern const float df_e2m1_lut[16];
static inline float df_e8m0_to_f32(uint8_t s) {
    union { uint32_t u; float f; } v = {s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : (uint32_t)s << 23};
    return v.f;
}
extern float df_fp8_lut[256]; /* E4M3FN -> f32, exact; filled by df_kernels_init */
void df_kernels_init(void);
/* Per-thread f32 scratch slot (0..3) of at least n floats, grown on first use only, freed at thread exit. */
float *df_cpu_scratch(int slot, size_t n);

#define DF_DECL_KERNELS(isa)                                                                                       \
    float df_k_dot_f32_##isa(const float *w, const float *x, int64_t n);                                          \
    float df_k_dot_i8_##isa(const int8_t *w, const float *x, int64_t n);                                          \
    float df_k_dot_bf16_##isa(const uint16_t *w, const float *x, int64_t n);                                      \
    float df_k_dot_f16_##isa(const uint16_t *w, const float *x, int64_t n);                                       \
    float df_k_dot_fp8_##isa(const uint8_t *w, const float *x, int64_t n);                                        \
    /* n % 32 == 0 and group % 32 == 0 for the SIMD versions; scales: one f32 per group */                        \
    float df_k_dot_int4_##isa(const uint8_t *packed, const float *scales, int group, const float *x, int64_t n);  \
    /* row dequantization to f32 (scale applied) */                                                              \
    void df_k_deq_bf16_##isa(const uint16_t *w, float *out, int64_t n);                                           \
    void df_k_deq_f16_##isa(const uint16_t *w, float *out, int64_t n);                                            \
    void df_k_deq_fp8_##isa(const uint8_t *w, float scale, float *out, int64_t n);                                \
    /* MXFP4 rows: packed [n/2] bytes, one E8M0 scale per 32 elements; SIMD versions need n % 32 == 0. The dot  \
     * sums each group of 32 products, then adds group sum x scale (as INT4). */                                  \
    float df_k_dot_mxfp4_##isa(const uint8_t *packed, const uint8_t *scales, const float *x, int64_t n);          \
    void df_k_deq_mxfp4_##isa(const uint8_t *packed, const uint8_t *scales, float *out, int64_t n);               \
    /* Prefill GEMM (cpu.c mm_rows). pack16: P[k*16 + i] = src[i*ld + k] for i < nr, 0 for nr <= i < 16,      \
     * k < kc (a panel of 16 rows, k-major). gemm16: Y[t*ldy + i] = fma-chain over k < kc of P[k*16 + i] *      \
     * X[t*ldx + k], starting from Y[t*ldy + i] when acc, else from 0, for i < nr <= 16, t < nt <= 6. Every     \
     * output is ONE chain of fused multiply-adds in the order of k, so the result does not depend on the ISA,  \
     * on how rows, tokens or K are blocked, or on the thread count (scalar: fmaf, bit-identical to SIMD).      \
     * P is 32-byte aligned (aligned loads in the SIMD kernels). */                                              \
    void df_k_pack16_##isa(const float *src, int64_t ld, int nr, int64_t kc, float *P);                          \
    void df_k_gemm16_##isa(const float *P, int64_t kc, const float *X, int64_t ldx, int nt, float *Y, int64_t ldy, \
                           int nr, int acc);                                                                      \
    /* two full panels at once (P, and P + pstride for rows 16..31 of Y), nt <= 3: 4 nt FMA chains in flight    \
     * where one panel would have 2 nt; the same bits as two gemm16 calls */                                     \
    void df_k_gemm32_##isa(const float *P, int64_t pstride, int64_t kc, const float *X, int64_t ldx, int nt,       \
                           float *Y, int64_t ldy, int acc);                                                       \
    /* y += a x */                                                                                                \
    void df_k_axpy_##isa(float *y, float a, const float *x, int64_t n);                                           \
    /* Four rows at once (row k at w + k*ld elements) against one x: out[k] = W[k,:] . x. The rows share every    \
     * load of x, so x costs one L1/L2 read per four weight rows instead of one per row. */                       \
    void df_k_dot4_f32_##isa(const float *w, int64_t ld, const float *x, int64_t n, float *out);                  \
    void df_k_dot4_bf16_##isa(const uint16_t *w, int64_t ld, const float *x, int64_t n, float *out);              \
    void df_k_dot4_f16_##isa(const uint16_t *w, int64_t ld, const float *x, int64_t n, float *out);               \
    /* BF16 decode with x prepared once per product (bf16x_prep: xp[n] in the ISA's order; AVX2: per 16        \
     * elements the 8 even then the 8 odd ones), so that one wide load of weights gives f32 vectors by a shift  \
     * (even elements) and an and (odd ones), no widening: dotp(w, x, xp, n) = dot4p's out[k] = W[k,:] . x       \
     * (x itself for the tail). Scalar / AVX-512: xp is a copy of x and the plain kernels run. */                \
    void df_k_bf16x_prep_##isa(const float *x, float *xp, int64_t n);                                             \
    float df_k_dot_bf16p_##isa(const uint16_t *w, const float *x, const float *xp, int64_t n);                    \
    void df_k_dot4_bf16p_##isa(const uint16_t *w, int64_t ld, const float *x, const float *xp, int64_t n, float *out); \
    /* FP8 with column-block scales: sc[k][b] scales columns [b*blk, (b+1)*blk) of row k; SIMD versions need      \
     * n % 32 == 0 and blk % 32 == 0 */                                                                           \
    void df_k_dot4_fp8s_##isa(const uint8_t *w, int64_t ld, const float *x, int64_t n, int blk,                   \
                              const float *const *sc, float *out);                                               \
    /* FP8 decode with x prepared once per product. fp8x_prep writes xp and returns xs; dot_fp8sp (one row, scales  \
     * sc[b]) and dot4_fp8sp (four rows, as dot4_fp8s) read xp and multiply their sums by xs; the same            \
     * requirements (n % 32 == 0, blk % 32 == 0 for SIMD). AVX2: weights become f32 by integer ops alone (the      \
     * value times 2^-120, E4M3 subnormals as f32 subnormals, exact), so xp is x times 2^k (per 32 elements   \
     * x[4j], then x[4j+1], x[4j+2], x[4j+3], j < 8), k <= 120 the largest that keeps xp finite, xs = 2^(120-k):  \
     * the products are the scalar ones times 2^(k-120) (the same unless below f32's normal range). AVX-512:    \
     * the AVX2 code (fp8_int_avx2.h; its four-row kernel two rows per zmm), the same bits. Scalar: xp is a     \
     * copy of x, xs = 1, the plain kernels. */                                                                 \
    float df_k_fp8x_prep_##isa(const float *x, float *xp, int64_t n);                                             \
    float df_k_dot_fp8sp_##isa(const uint8_t *w, const float *xp, float xs, int64_t n, int blk, const float *sc);   \
    void df_k_dot4_fp8sp_##isa(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,          \
                               const float *const *sc, float *out);                                              \
    /* dot4_fp8sp for rows known to hold no E4M3 NaN code (0x7f, 0xff: cpu.c keeps that per weight,             \
     * df_weight.nan_codes): the same bits for such rows, without the per-block check (undefined for a row     \
     * with one: finite garbage, not NaN) */                                                                      \
    void df_k_dot4_fp8spn_##isa(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,         \
                                const float *const *sc, float *out);

DF_DECL_KERNELS(scalar)
DF_DECL_KERNELS(avx2)
DF_DECL_KERNELS(avx512)

#endif
