/* kernels_scalar.c - reference kernels: plain C, f32 accumulation in the
 * order of the elements. Every SIMD kernel is tested against these. */
#include "backend/cpu/kernels.h"
#include <math.h>
#include <string.h>

float df_fp8_lut[256];
const float df_e2m1_lut[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float df_f16_to_f32(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

void df_kernels_init(void) {
    for (int b = 0; b < 256; b++) {
        int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
        float v;
        if (e == 15 && m == 7) v = NAN; /* E4M3FN has no infinities; S.1111.111 is NaN */
        else if (e == 0) v = ldexpf((float)m, -9);
        else v = ldexpf((float)(8 + m), e - 10);
        df_fp8_lut[b] = s ? -v : v;
    }
}

float df_k_dot_i8_scalar(const int8_t *w, const float *x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += (float)w[i] * x[i];
    return s;
}

float df_k_dot_f32_scalar(const float *w, const float *x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += w[i] * x[i];
    return s;
}
float df_k_dot_bf16_scalar(const uint16_t *w, const float *x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += df_bf16_to_f32(w[i]) * x[i];
    return s;
}
float df_k_dot_f16_scalar(const uint16_t *w, const float *x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += df_f16_to_f32(w[i]) * x[i];
    return s;
}
float df_k_dot_fp8_scalar(const uint8_t *w, const float *x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += df_fp8_lut[w[i]] * x[i];
    return s;
}
float df_k_dot_int4_scalar(const uint8_t *p, const float *scales, int group, const float *x, int64_t n) {
    float s = 0;
    for (int64_t g0 = 0; g0 < n; g0 += group) {
        float gs = 0;
        int64_t g1 = g0 + group < n ? g0 + group : n;
        for (int64_t i = g0; i < g1; i++) {
            int q = (p[i >> 1] >> ((i & 1) * 4)) & 15;
            gs += (float)(q - 8) * x[i];
        }
        s += gs * scales[g0 / group];
    }
    return s;
}
void df_k_pack16_scalar(const float *src, int64_t ld, int nr, int64_t kc, float *P) {
    for (int64_t k = 0; k < kc; k++)
        for (int i = 0; i < 16; i++) P[k * 16 + i] = i < nr ? src[i * ld + k] : 0.0f;
}
/* fmaf: the same single rounding per step as the SIMD kernels' FMA, so every
 * ISA gives the same bits (glibc picks the FMA instruction where there is one) */
void df_k_gemm16_scalar(const float *P, int64_t kc, const float *X, int64_t ldx, int nt, float *Y, int64_t ldy,
                        int nr, int acc) {
    for (int t = 0; t < nt; t++)
        for (int i = 0; i < nr; i++) {
            float s = acc ? Y[t * ldy + i] : 0.0f;
            for (int64_t k = 0; k < kc; k++) s = fmaf(P[k * 16 + i], X[t * ldx + k], s);
            Y[t * ldy + i] = s;
        }
}

void df_k_gemm32_scalar(const float *P, int64_t pstride, int64_t kc, const float *X, int64_t ldx, int nt, float *Y,
                        int64_t ldy, int acc) {
    df_k_gemm16_scalar(P, kc, X, ldx, nt, Y, ldy, 16, acc);
    df_k_gemm16_scalar(P + pstride, kc, X, ldx, nt, Y + 16, ldy, 16, acc);
}

void df_k_deq_bf16_scalar(const uint16_t *w, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = df_bf16_to_f32(w[i]);
}
void df_k_deq_f16_scalar(const uint16_t *w, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = df_f16_to_f32(w[i]);
}
void df_k_deq_fp8_scalar(const uint8_t *w, float scale, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = df_fp8_lut[w[i]] * scale;
}

void df_k_axpy_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
void df_k_dot4_f32_scalar(const float *w, int64_t ld, const float *x, int64_t n, float *out) {
    for (int k = 0; k < 4; k++) out[k] = df_k_dot_f32_scalar(w + k * ld, x, n);
}
void df_k_dot4_bf16_scalar(const uint16_t *w, int64_t ld, const float *x, int64_t n, float *out) {
    for (int k = 0; k < 4; k++) out[k] = df_k_dot_bf16_scalar(w + k * ld, x, n);
}
void df_k_dot4_f16_scalar(const uint16_t *w, int64_t ld, const float *x, int64_t n, float *out) {
    for (int k = 0; k < 4; k++) out[k] = df_k_dot_f16_scalar(w + k * ld, x, n);
}
void df_k_bf16x_prep_scalar(const float *x, float *xp, int64_t n) { memcpy(xp, x, (size_t)n * sizeof(float)); }
float df_k_dot_bf16p_scalar(const uint16_t *w, const float *x, const float *xp, int64_t n) {
    (void)xp;
    return df_k_dot_bf16_scalar(w, x, n);
}
void df_k_dot4_bf16p_scalar(const uint16_t *w, int64_t ld, const float *x, const float *xp, int64_t n, float *out) {
    (void)xp;
    df_k_dot4_bf16_scalar(w, ld, x, n, out);
}
void df_k_dot4_fp8s_scalar(const uint8_t *w, int64_t ld, const float *x, int64_t n, int blk, const float *const *sc,
                           float *out) {
    for (int k = 0; k < 4; k++) {
        float s = 0;
        for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++)
            s += sc[k][b] * df_k_dot_fp8_scalar(w + k * ld + c0, x + c0, n - c0 < blk ? n - c0 : blk);
        out[k] = s;
    }
}

static inline int e2m1_code(const uint8_t *p, int64_t i) { return (p[i >> 1] >> ((i & 1) * 4)) & 15; }
float df_k_dot_mxfp4_scalar(const uint8_t *p, const uint8_t *scales, const float *x, int64_t n) {
    float s = 0;
    for (int64_t g0 = 0; g0 < n; g0 += 32) {
        float gs = 0;
        const int64_t g1 = g0 + 32 < n ? g0 + 32 : n;
        for (int64_t i = g0; i < g1; i++) gs += df_e2m1_lut[e2m1_code(p, i)] * x[i];
        s += gs * df_e8m0_to_f32(scales[g0 / 32]);
    }
    return s;
}
void df_k_deq_mxfp4_scalar(const uint8_t *p, const uint8_t *scales, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = df_e2m1_lut[e2m1_code(p, i)] * df_e8m0_to_f32(scales[i / 32]);
}

float df_k_fp8x_prep_scalar(const float *x, float *xp, int64_t n) {
    memcpy(xp, x, (size_t)n * sizeof(float));
    return 1.0f;
}
float df_k_dot_fp8sp_scalar(const uint8_t *w, const float *xp, float xs, int64_t n, int blk, const float *sc) {
    float s = 0;
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) s += sc[b] * df_k_dot_fp8_scalar(w + c0, xp + c0, n - c0 < blk ? n - c0 : blk);
    return s * xs;
}
void df_k_dot4_fp8sp_scalar(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,
                            const float *const *sc, float *out) {
    df_k_dot4_fp8s_scalar(w, ld, xp, n, blk, sc, out);
    for (int k = 0; k < 4; k++) out[k] *= xs;
}
void df_k_dot4_fp8spn_scalar(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,
                             const float *const *sc, float *out) {
    df_k_dot4_fp8sp_scalar(w, ld, xp, xs, n, blk, sc, out);
}
