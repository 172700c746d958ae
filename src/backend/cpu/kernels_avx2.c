/* kernels_avx2.c - AVX2 + FMA + F16C kernels (same conversions as the
 * AVX-512 file, 8 lanes). Tails fall back to scalar code. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/avx2_tr.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float df_k_dot_i8_avx2(const int8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w + i)))), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w + i + 8)))), _mm256_loadu_ps(x + i + 8), a1);
    }
    __m256 a = _mm256_add_ps(a0, a1);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    float s = _mm_cvtss_f32(q);
    for (; i < n; i++) s += (float)w[i] * x[i];
    return s;
}

float df_k_dot_f32_avx2(const float *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += w[i] * x[i];
    return s;
}

static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

float df_k_dot_bf16_avx2(const uint16_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(bf16x8(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(bf16x8(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(bf16x8(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(bf16x8(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += df_bf16_to_f32(w[i]) * x[i];
    return s;
}

float df_k_dot_f16_avx2(const uint16_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8))), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += df_f16_to_f32(w[i]) * x[i];
    return s;
}

/* 16 E4M3 bytes -> their f16 bits / 256 in 16-bit lanes: sign-extend to 16
 * bits, shift left 7 (exponent and mantissa land in the f16 fields, the sign
 * in bit 15), clear the copy of the sign in bit 14: three integer ops per 16
 * weights. Normal and subnormal values are exact (the value times 2^-8).
 * E4M3FN's NaN code (S.1111.111) reads as +-480 here: the dot kernels look
 * for it separately (fp8_nan_*), the dequantization patches it (fp8x16_hn). */
static inline __m256i fp8x16_h(const uint8_t *p) {
    __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16((short)0xbfff));
}
/* the same with the NaN code as an f16 NaN (exponent bits set: 0x3f80 | 0x7c00) */
static inline __m256i fp8x16_hn(const uint8_t *p) {
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)), m7f = _mm256_set1_epi16(0x7f);
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16((short)0xbfff));
    const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(v, m7f), m7f);
    return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7c00)));
}
#define F16LO(h) _mm256_cvtph_ps(_mm256_castsi256_si128(h))
#define F16HI(h) _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))

/* NaN codes in the dot kernels: the running byte max of (code & 0x7f) is
 * 0x7f once a NaN code was read (two ops per 16 or 32 weights); a row that
 * has one gets NaN, what the scalar sum of its products gives. */
static inline __m128i fp8_nan_acc16(__m128i acc, const uint8_t *p) {
    return _mm_max_epu8(acc, _mm_and_si128(_mm_loadu_si128((const __m128i *)p), _mm_set1_epi8(0x7f)));
}
static inline int fp8_nan_seen16(__m128i acc) { return _mm_movemask_epi8(_mm_cmpeq_epi8(acc, _mm_set1_epi8(0x7f))) != 0; }
static int fp8_row_has_nan(const uint8_t *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if ((p[i] & 0x7f) == 0x7f) return 1;
    return 0;
}

float df_k_dot_fp8_avx2(const uint8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m128i nan = _mm_setzero_si128();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = fp8x16_h(w + i);
        nan = fp8_nan_acc16(nan, w + i);
        a0 = _mm256_fmadd_ps(F16LO(h), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(F16HI(h), _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = hsum8(_mm256_add_ps(a0, a1)) * 256.0f;
    for (; i < n; i++) s += df_fp8_lut[w[i]] * x[i];
    return fp8_nan_seen16(nan) ? NAN : s;
}

float df_k_dot_int4_avx2(const uint8_t *p, const float *scales, int group, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    const __m256 eight = _mm256_set1_ps(8.0f);
    for (int64_t g0 = 0; g0 < n; g0 += group) {
        __m256 gs = _mm256_setzero_ps();
        for (int64_t i = g0; i < g0 + group; i += 16) {
            __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + i / 2)));
            __m128i e = _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0x0f)), _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0xf0)), 4));
            __m256 q0 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e)), eight);
            __m256 q1 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e, 8))), eight);
            gs = _mm256_fmadd_ps(q0, _mm256_loadu_ps(x + i), gs);
            gs = _mm256_fmadd_ps(q1, _mm256_loadu_ps(x + i + 8), gs);
        }
        acc = _mm256_fmadd_ps(gs, _mm256_set1_ps(scales[g0 / group]), acc);
    }
    return hsum8(acc);
}

/* ---- prefill GEMM ------------------------------------------------------ */

void df_k_pack16_avx2(const float *src, int64_t ld, int nr, int64_t kc, float *P) {
    if (nr != 16) { df_k_pack16_scalar(src, ld, nr, kc, P); return; }
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8)
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (h * 8 + i) * ld + k);
            df_tr8x8_avx2(r);
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(P + (k + j) * 16 + h * 8, r[j]);
        }
    for (; k < kc; k++)
        for (int i = 0; i < 16; i++) P[k * 16 + i] = src[i * ld + k];
}

/* 16 rows (two vectors of W per k, from the packed panel) x NT tokens (one
 * broadcast of x each): 2*NT accumulators, at NT = 6 twelve of the 16 ymm
 * registers, 12 FMAs per 2 loads of W and 6 broadcasts. */
#define G_STEP(T)                                                                                                 \
    if (T < nt_) {                                                                                                 \
        const __m256 xb = _mm256_broadcast_ss(x##T + k);                                                          \
        a##T = _mm256_fmadd_ps(w0, xb, a##T);                                                                     \
        b##T = _mm256_fmadd_ps(w1, xb, b##T);                                                                     \
    }
#define G_LOAD(T)                                                                                                 \
    if (T < nt_) {                                                                                                 \
        a##T = acc ? _mm256_loadu_ps(Y + T * ldy) : _mm256_setzero_ps();                                         \
        b##T = acc ? _mm256_loadu_ps(Y + T * ldy + 8) : _mm256_setzero_ps();                                     \
    }
#define G_STORE(T)                                                                                                \
    if (T < nt_) { _mm256_storeu_ps(Y + T * ldy, a##T); _mm256_storeu_ps(Y + T * ldy + 8, b##T); }
#define GEMM16_NT(NT)                                                                                             \
    static void gemm16_##NT(const float *P, int64_t kc, const float *X, int64_t ldx, float *Y, int64_t ldy, int acc) { \
        enum { nt_ = NT };                                                                                        \
        const float *x0 = X, *x1 = 1 < NT ? X + ldx : X, *x2 = 2 < NT ? X + 2 * ldx : X;                          \
        const float *x3 = 3 < NT ? X + 3 * ldx : X, *x4 = 4 < NT ? X + 4 * ldx : X, *x5 = 5 < NT ? X + 5 * ldx : X; \
        __m256 a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5;                                                    \
        a0 = a1 = a2 = a3 = a4 = a5 = b0 = b1 = b2 = b3 = b4 = b5 = _mm256_setzero_ps();                          \
        G_LOAD(0) G_LOAD(1) G_LOAD(2) G_LOAD(3) G_LOAD(4) G_LOAD(5)                                               \
        for (int64_t k = 0; k < kc; k++, P += 16) {                                                               \
            const __m256 w0 = _mm256_load_ps(P), w1 = _mm256_load_ps(P + 8);                                      \
            G_STEP(0) G_STEP(1) G_STEP(2) G_STEP(3) G_STEP(4) G_STEP(5)                                           \
        }                                                                                                         \
        G_STORE(0) G_STORE(1) G_STORE(2) G_STORE(3) G_STORE(4) G_STORE(5)                                         \
        (void)x1, (void)x2, (void)x3, (void)x4, (void)x5;                                                         \
    }
GEMM16_NT(1)
GEMM16_NT(2)
GEMM16_NT(3)
GEMM16_NT(4)
GEMM16_NT(5)
GEMM16_NT(6)

/* 32 rows (two panels) x NT <= 3 tokens: 4 NT accumulators */
#define H_STEP(T)                                                                                                 \
    if (T < nt_) {                                                                                                \
        const __m256 xb = _mm256_broadcast_ss(x##T + k);                                                          \
        a##T = _mm256_fmadd_ps(w0, xb, a##T);                                                                     \
        b##T = _mm256_fmadd_ps(w1, xb, b##T);                                                                     \
        c##T = _mm256_fmadd_ps(w2, xb, c##T);                                                                     \
        d##T = _mm256_fmadd_ps(w3, xb, d##T);                                                                     \
    }
#define H_LOAD(T)                                                                                                 \
    if (T < nt_) {                                                                                                \
        a##T = acc ? _mm256_loadu_ps(Y + T * ldy) : _mm256_setzero_ps();                                         \
        b##T = acc ? _mm256_loadu_ps(Y + T * ldy + 8) : _mm256_setzero_ps();                                     \
        c##T = acc ? _mm256_loadu_ps(Y + T * ldy + 16) : _mm256_setzero_ps();                                    \
        d##T = acc ? _mm256_loadu_ps(Y + T * ldy + 24) : _mm256_setzero_ps();                                    \
    }
#define H_STORE(T)                                                                                                \
    if (T < nt_) {                                                                                                \
        _mm256_storeu_ps(Y + T * ldy, a##T), _mm256_storeu_ps(Y + T * ldy + 8, b##T);                             \
        _mm256_storeu_ps(Y + T * ldy + 16, c##T), _mm256_storeu_ps(Y + T * ldy + 24, d##T);                       \
    }
#define GEMM32_NT(NT)                                                                                             \
    static void gemm32_##NT(const float *P, int64_t ps, int64_t kc, const float *X, int64_t ldx, float *Y,        \
                            int64_t ldy, int acc) {                                                               \
        enum { nt_ = NT };                                                                                        \
        const float *x0 = X, *x1 = 1 < NT ? X + ldx : X, *x2 = 2 < NT ? X + 2 * ldx : X;                          \
        const float *Q = P + ps;                                                                                  \
        __m256 a0, a1, a2, b0, b1, b2, c0, c1, c2, d0, d1, d2;                                                    \
        a0 = a1 = a2 = b0 = b1 = b2 = c0 = c1 = c2 = d0 = d1 = d2 = _mm256_setzero_ps();                          \
        H_LOAD(0) H_LOAD(1) H_LOAD(2)                                                                             \
        for (int64_t k = 0; k < kc; k++, P += 16, Q += 16) {                                                      \
            const __m256 w0 = _mm256_load_ps(P), w1 = _mm256_load_ps(P + 8);                                     \
            const __m256 w2 = _mm256_load_ps(Q), w3 = _mm256_load_ps(Q + 8);                                     \
            H_STEP(0) H_STEP(1) H_STEP(2)                                                                         \
        }                                                                                                         \
        H_STORE(0) H_STORE(1) H_STORE(2)                                                                          \
        (void)x1, (void)x2;                                                                                       \
    }
GEMM32_NT(1)
GEMM32_NT(2)
GEMM32_NT(3)

void df_k_gemm32_avx2(const float *P, int64_t pstride, int64_t kc, const float *X, int64_t ldx, int nt, float *Y,
                      int64_t ldy, int acc) {
    static void (*const fn[4])(const float *, int64_t, int64_t, const float *, int64_t, float *, int64_t, int) = {
        NULL, gemm32_1, gemm32_2, gemm32_3};
    if (nt < 1) return;
    if (nt > 3) {
        df_k_gemm16_avx2(P, kc, X, ldx, nt, Y, ldy, 16, acc);
        df_k_gemm16_avx2(P + pstride, kc, X, ldx, nt, Y + 16, ldy, 16, acc);
        return;
    }
    fn[nt](P, pstride, kc, X, ldx, Y, ldy, acc);
}

/* P must be 32-byte aligned (the driver's packed panels are) */
void df_k_gemm16_avx2(const float *P, int64_t kc, const float *X, int64_t ldx, int nt, float *Y, int64_t ldy,
                      int nr, int acc) {
    static void (*const fn[7])(const float *, int64_t, const float *, int64_t, float *, int64_t, int) = {
        NULL, gemm16_1, gemm16_2, gemm16_3, gemm16_4, gemm16_5, gemm16_6};
    if (nt < 1) return;
    if (nr == 16) { fn[nt](P, kc, X, ldx, Y, ldy, acc); return; }
    float tmp[6 * 16];
    if (acc)
        for (int t = 0; t < nt; t++) memcpy(tmp + t * 16, Y + t * ldy, (size_t)nr * sizeof(float));
    fn[nt](P, kc, X, ldx, tmp, 16, acc);
    for (int t = 0; t < nt; t++) memcpy(Y + t * ldy, tmp + t * 16, (size_t)nr * sizeof(float));
}

void df_k_deq_bf16_avx2(const uint16_t *w, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, bf16x8(w + i));
    for (; i < n; i++) out[i] = df_bf16_to_f32(w[i]);
}
void df_k_deq_f16_avx2(const uint16_t *w, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))));
    for (; i < n; i++) out[i] = df_f16_to_f32(w[i]);
}
void df_k_deq_fp8_avx2(const uint8_t *w, float scale, float *out, int64_t n) {
    const __m256 s = _mm256_set1_ps(scale * 256.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = fp8x16_hn(w + i);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(F16LO(h), s));
        _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(F16HI(h), s));
    }
    for (; i < n; i++) out[i] = df_fp8_lut[w[i]] * scale;
}

/* ---- four rows per call (x loaded once for the four rows) -------------- */

void df_k_axpy_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static inline __m256 f32x8(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* The four-row kernels are given four rows a quarter of the decode
 * driver's row range apart (cpu.c, dot_rows), so each of the four is one
 * long sequential stream that the hardware prefetcher follows over the whole
 * quarter; they issue no software prefetch by default. (Round 2 read four
 * adjacent rows and prefetched the next four: streams of one row's length,
 * too short for the hardware prefetcher.) DF_DOT4_PF > 0 (a build option:
 * OPT="-O2 -DDF_DOT4_PF=2048") prefetches every stream that many bytes
 * ahead, one prefetch per stream per cache line (past a row's end: the next
 * row of the same stream; past the matrix: a hint that reads nothing and
 * cannot fault): 512-2048 measured within the noise of the loaded dev VM,
 * one thread, GB/s of CPU time (docs/PERFORMANCE.md, issue 17 float decode
 * round 3), so it stays off. */
#ifndef DF_DOT4_PF
#define DF_DOT4_PF 0
#endif
#define PF4(w, ldb, off)                                                                                          \
    do {                                                                                                          \
        if (DF_DOT4_PF) {                                                                                         \
            const char *pf_ = (const char *)(w) + (off) + DF_DOT4_PF;                                             \
            _mm_prefetch(pf_, _MM_HINT_T0), _mm_prefetch(pf_ + (ldb), _MM_HINT_T0);                               \
            _mm_prefetch(pf_ + 2 * (ldb), _MM_HINT_T0), _mm_prefetch(pf_ + 3 * (ldb), _MM_HINT_T0);               \
        }                                                                                                         \
    } while (0)
#define DOT4_8(NAME, T, LD8, ONE)                                                                             \
    void NAME(const T *w, int64_t ld, const float *x, int64_t n, float *out) {                                    \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                               \
        int64_t i = 0;                                                                                            \
        for (; i + 8 <= n; i += 8) {                                                                              \
            if (!((i * (int64_t)sizeof(T)) & 63)) PF4(w, ld * (int64_t)sizeof(T), i * (int64_t)sizeof(T));       \
            __m256 xv = _mm256_loadu_ps(x + i);                                                                   \
            a0 = _mm256_fmadd_ps(LD8(w + i), xv, a0);                                                             \
            a1 = _mm256_fmadd_ps(LD8(w + ld + i), xv, a1);                                                        \
            a2 = _mm256_fmadd_ps(LD8(w + 2 * ld + i), xv, a2);                                                    \
            a3 = _mm256_fmadd_ps(LD8(w + 3 * ld + i), xv, a3);                                                    \
        }                                                                                                         \
        out[0] = hsum8(a0), out[1] = hsum8(a1), out[2] = hsum8(a2), out[3] = hsum8(a3);                           \
        for (; i < n; i++)                                                                                        \
            for (int k = 0; k < 4; k++) out[k] += ONE(w[k * ld + i]) * x[i];                                      \
    }
static inline float id_f32(float f) { return f; }
DOT4_8(df_k_dot4_f32_avx2, float, f32x8, id_f32)
DOT4_8(df_k_dot4_bf16_avx2, uint16_t, bf16x8, df_bf16_to_f32)
DOT4_8(df_k_dot4_f16_avx2, uint16_t, f16x8, df_f16_to_f32)

/* ---- BF16 decode with prepared x -------------------------------------- */
/* xp per 16 elements: x[0], x[2], ..., x[14], then x[1], x[3], ..., x[15]. A
 * 256-bit load of 16 BF16 weights holds w[2j] in the low and w[2j+1] in the
 * high half of 32-bit lane j: a shift left 16 gives the even weights as f32,
 * an and with 0xffff0000 the odd ones, in xp's order. */
void df_k_bf16x_prep_avx2(const float *x, float *xp, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        /* per 128-bit half: a0 a2 b0 b2 | a4 a6 b4 b6 -> a0 a2 a4 a6 b0 b2 b4 b6 */
        const __m256 ev = _mm256_shuffle_ps(a, b, 0x88), od = _mm256_shuffle_ps(a, b, 0xDD);
        _mm256_storeu_ps(xp + i, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8)));
        _mm256_storeu_ps(xp + i + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8)));
    }
    for (; i < n; i++) xp[i] = x[i];
}
#define BF_EV(v) _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))
#define BF_OD(v) _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)))
float df_k_dot_bf16p_avx2(const uint16_t *w, const float *x, const float *xp, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + i)), v1 = _mm256_loadu_si256((const __m256i *)(w + i + 16));
        a0 = _mm256_fmadd_ps(BF_EV(v0), _mm256_loadu_ps(xp + i), a0);
        a1 = _mm256_fmadd_ps(BF_OD(v0), _mm256_loadu_ps(xp + i + 8), a1);
        a2 = _mm256_fmadd_ps(BF_EV(v1), _mm256_loadu_ps(xp + i + 16), a2);
        a3 = _mm256_fmadd_ps(BF_OD(v1), _mm256_loadu_ps(xp + i + 24), a3);
    }
    for (; i + 16 <= n; i += 16) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(w + i));
        a0 = _mm256_fmadd_ps(BF_EV(v), _mm256_loadu_ps(xp + i), a0);
        a1 = _mm256_fmadd_ps(BF_OD(v), _mm256_loadu_ps(xp + i + 8), a1);
    }
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += df_bf16_to_f32(w[i]) * x[i];
    return s;
}
void df_k_dot4_bf16p_avx2(const uint16_t *w, int64_t ld, const float *x, const float *xp, int64_t n, float *out) {
    __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (!(i & 31)) PF4(w, 2 * ld, 2 * i);
        const __m256 xe = _mm256_loadu_ps(xp + i), xo = _mm256_loadu_ps(xp + i + 8);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + i)), v1 = _mm256_loadu_si256((const __m256i *)(w + ld + i));
        const __m256i v2 = _mm256_loadu_si256((const __m256i *)(w + 2 * ld + i)), v3 = _mm256_loadu_si256((const __m256i *)(w + 3 * ld + i));
        e0 = _mm256_fmadd_ps(BF_EV(v0), xe, e0), o0 = _mm256_fmadd_ps(BF_OD(v0), xo, o0);
        e1 = _mm256_fmadd_ps(BF_EV(v1), xe, e1), o1 = _mm256_fmadd_ps(BF_OD(v1), xo, o1);
        e2 = _mm256_fmadd_ps(BF_EV(v2), xe, e2), o2 = _mm256_fmadd_ps(BF_OD(v2), xo, o2);
        e3 = _mm256_fmadd_ps(BF_EV(v3), xe, e3), o3 = _mm256_fmadd_ps(BF_OD(v3), xo, o3);
    }
    out[0] = hsum8(_mm256_add_ps(e0, o0)), out[1] = hsum8(_mm256_add_ps(e1, o1));
    out[2] = hsum8(_mm256_add_ps(e2, o2)), out[3] = hsum8(_mm256_add_ps(e3, o3));
    for (; i < n; i++)
        for (int k = 0; k < 4; k++) out[k] += df_bf16_to_f32(w[k * ld + i]) * x[i];
}

void df_k_dot4_fp8s_avx2(const uint8_t *w, int64_t ld, const float *x, int64_t n, int blk, const float *const *sc,
                         float *out) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m128i nan = _mm_setzero_si128(); /* of the four rows together */
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) {
        const int64_t c1 = n - c0 < blk ? n : c0 + blk;
        __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0, u0 = t0, u1 = t0, u2 = t0, u3 = t0;
        for (int64_t i = c0; i < c1; i += 16) {
            const __m256 xl = _mm256_loadu_ps(x + i), xh = _mm256_loadu_ps(x + i + 8);
            const __m256i h0 = fp8x16_h(w + i), h1 = fp8x16_h(w + ld + i), h2 = fp8x16_h(w + 2 * ld + i),
                          h3 = fp8x16_h(w + 3 * ld + i);
            nan = fp8_nan_acc16(fp8_nan_acc16(nan, w + i), w + ld + i);
            nan = fp8_nan_acc16(fp8_nan_acc16(nan, w + 2 * ld + i), w + 3 * ld + i);
            t0 = _mm256_fmadd_ps(F16LO(h0), xl, t0), u0 = _mm256_fmadd_ps(F16HI(h0), xh, u0);
            t1 = _mm256_fmadd_ps(F16LO(h1), xl, t1), u1 = _mm256_fmadd_ps(F16HI(h1), xh, u1);
            t2 = _mm256_fmadd_ps(F16LO(h2), xl, t2), u2 = _mm256_fmadd_ps(F16HI(h2), xh, u2);
            t3 = _mm256_fmadd_ps(F16LO(h3), xl, t3), u3 = _mm256_fmadd_ps(F16HI(h3), xh, u3);
        }
        a[0] = _mm256_fmadd_ps(_mm256_add_ps(t0, u0), _mm256_set1_ps(sc[0][b]), a[0]);
        a[1] = _mm256_fmadd_ps(_mm256_add_ps(t1, u1), _mm256_set1_ps(sc[1][b]), a[1]);
        a[2] = _mm256_fmadd_ps(_mm256_add_ps(t2, u2), _mm256_set1_ps(sc[2][b]), a[2]);
        a[3] = _mm256_fmadd_ps(_mm256_add_ps(t3, u3), _mm256_set1_ps(sc[3][b]), a[3]);
    }
    const int anynan = fp8_nan_seen16(nan);
    for (int k = 0; k < 4; k++) out[k] = anynan && fp8_row_has_nan(w + k * ld, n) ? NAN : hsum8(a[k]) * 256.0f;
}

/* ---- FP8 decode with prepared x: fp8_int_avx2.h (shared with AVX-512) -- */
/* FP8's four streams are prefetched DF_FP8_PF bytes ahead (one line per
 * stream per 64 columns), unlike the other formats' (DF_DOT4_PF, off): the
 * FP8 kernel is compute-heavy (~14 G weights/s per core from L2), so its
 * loads run ahead of the arithmetic less and the hardware prefetcher alone
 * leaves it waiting on memory. Engine product, one thread, GB/s of CPU time
 * on the loaded dev VM: 512 bytes ahead +21-30% over none in one set of
 * interleaved runs, +7-12% in another; 256 and 768 less (docs/PERFORMANCE.md,
 * "Issue 17: FP8 decode, round 4"). A build option: OPT="-O2 -DDF_FP8_PF=0". */
#ifndef DF_FP8_PF
#define DF_FP8_PF 512
#endif
#define FP8I_PF(w, ld, off)                                                                                       \
    do {                                                                                                          \
        if (DF_FP8_PF) {                                                                                          \
            const char *pf_ = (const char *)(w) + (off) + DF_FP8_PF;                                              \
            _mm_prefetch(pf_, _MM_HINT_T0), _mm_prefetch(pf_ + (ld), _MM_HINT_T0);                                \
            _mm_prefetch(pf_ + 2 * (ld), _MM_HINT_T0), _mm_prefetch(pf_ + 3 * (ld), _MM_HINT_T0);                 \
        }                                                                                                         \
    } while (0)
#include "backend/cpu/fp8_int_avx2.h"
float df_k_fp8x_prep_avx2(const float *x, float *xp, int64_t n) { return fp8i_prep(x, xp, n); }
float df_k_dot_fp8sp_avx2(const uint8_t *w, const float *xp, float xs, int64_t n, int blk, const float *sc) {
    return fp8i_dot(w, xp, xs, n, blk, sc);
}
void df_k_dot4_fp8sp_avx2(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,
                          const float *const *sc, float *out) {
    fp8i_dot4(w, ld, xp, xs, n, blk, sc, out, 1);
}
void df_k_dot4_fp8spn_avx2(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,
                           const float *const *sc, float *out) {
    fp8i_dot4(w, ld, xp, xs, n, blk, sc, out, 0);
}

/* ---- MXFP4 ------------------------------------------------------------- */
/* Dequantization: 8 packed bytes -> codes of elements 0..7 and 8..15 in
 * 32-bit lanes, then f32 values: vpermps looks the magnitude up by the low 3 bits, bit 3 of
 * the code (shifted to bit 31) is the sign, so code 8 gives -0.0. */
static inline void e2m1x16(const uint8_t *p, __m256 *v0, __m256 *v1) {
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    /* 16-bit lane k = byte k: low nibble -> byte 2k, high nibble -> byte 2k+1 (element order) */
    __m128i e = _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0x0f)), _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0xf0)), 4));
    __m256i i0 = _mm256_cvtepu8_epi32(e), i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(e, 8));
    *v0 = _mm256_or_ps(_mm256_permutevar8x32_ps(mag, i0), _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(i0, 28), sign)));
    *v1 = _mm256_or_ps(_mm256_permutevar8x32_ps(mag, i1), _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(i1, 28), sign)));
}

/* For the dot product: twice the values of 16 codes by one pshufb over the
 * int8 table {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ...}, 20-30% faster than the
 * vpermps decode in a single-core A/B on the 2-core AMD EPYC dev VM. Every
 * partial sum is then exactly twice the one of the true values (barring
 * f32 overflow or subnormal underflow) and the scale is halved, so the
 * result is the same; -0.0 codes become +0, which no sum of products can
 * tell apart. */
static inline void e2m1x16_x2(const uint8_t *p, __m256 *v0, __m256 *v1) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i raw = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(15);
    const __m128i q = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(_mm_and_si128(raw, m), _mm_and_si128(_mm_srli_epi16(raw, 4), m)));
    *v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    *v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
}

float df_k_dot_mxfp4_avx2(const uint8_t *p, const uint8_t *scales, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < n; g0 += 32) {
        __m256 v0, v1, v2, v3;
        e2m1x16_x2(p + g0 / 2, &v0, &v1);
        e2m1x16_x2(p + g0 / 2 + 8, &v2, &v3);
        __m256 gs = _mm256_mul_ps(v0, _mm256_loadu_ps(x + g0));
        gs = _mm256_fmadd_ps(v1, _mm256_loadu_ps(x + g0 + 8), gs);
        gs = _mm256_fmadd_ps(v2, _mm256_loadu_ps(x + g0 + 16), gs);
        gs = _mm256_fmadd_ps(v3, _mm256_loadu_ps(x + g0 + 24), gs);
        acc = _mm256_fmadd_ps(gs, _mm256_set1_ps(0.5f * df_e8m0_to_f32(scales[g0 / 32])), acc);
    }
    return hsum8(acc);
}

void df_k_deq_mxfp4_avx2(const uint8_t *p, const uint8_t *scales, float *out, int64_t n) {
    for (int64_t g0 = 0; g0 < n; g0 += 32) {
        const __m256 s = _mm256_set1_ps(df_e8m0_to_f32(scales[g0 / 32]));
        __m256 v[4];
        e2m1x16(p + g0 / 2, &v[0], &v[1]);
        e2m1x16(p + g0 / 2 + 8, &v[2], &v[3]);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(out + g0 + 8 * k, _mm256_mul_ps(v[k], s));
    }
}
