/* kernels_avx512.c - AVX-512 kernels (compiled with AVX-512 flags; only
 * called when the CPU reports avx512f/bw/vl). Conversions are exact:
 * bf16 by a 16-bit shift, f16 by vcvtph2ps, FP8 E4M3 by re-biasing into f16
 * (value = f16((b & 0x7f) << 7 | (b & 0x80) << 8) * 256, exact for normals
 * and subnormals) outside decode; FP8 decode on prepared x runs the AVX2
 * integer route (fp8_int_avx2.h); INT4 nibbles by integer unpacking. */
#include "backend/cpu/kernels.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

float df_k_dot_i8_avx512(const int8_t *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + i)))), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + i + 16)))), _mm512_loadu_ps(x + i + 16), a1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < n; i++) s += (float)w[i] * x[i];
    return s;
}

float df_k_dot_f32_avx512(const float *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return hsum(_mm512_add_ps(a0, a1));
}

static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline __m512 bf16x16_mask(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

float df_k_dot_bf16_avx512(const uint16_t *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(bf16x16(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(bf16x16(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(bf16x16(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(bf16x16(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(bf16x16(w + i), _mm512_loadu_ps(x + i), a0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(bf16x16_mask(w + i, m), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

float df_k_dot_f16_avx512(const uint16_t *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i + 16))), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))), _mm512_loadu_ps(x + i), a0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i)), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return hsum(_mm512_add_ps(a0, a1));
}

/* 16 FP8 bytes -> f32, E4M3FN's NaN code (S.1111.111) as NaN (the shifts
 * alone read it as +-480) */
static inline __m512 fp8x16(__m128i b) {
    __m256i v = _mm256_cvtepu8_epi16(b);
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7f)), 7),
                                _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8));
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b, _mm_set1_epi8(0x7f)), _mm_set1_epi8(0x7f));
    return _mm512_mask_mov_ps(_mm512_cvtph_ps(h), nan, _mm512_set1_ps(NAN));
}
/* NaN codes in n bytes at p (a multiple of 32), for the dot kernels whose
 * fast conversion (fp8x32_h) reads them as +-480: a row with one gets NaN */
static inline __mmask32 fp8_nan32(const uint8_t *p) {
    return _mm256_cmpeq_epi8_mask(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi8(0x7f)),
                                  _mm256_set1_epi8(0x7f));
}
static int fp8_row_has_nan(const uint8_t *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if ((p[i] & 0x7f) == 0x7f) return 1;
    return 0;
}

/* 32 FP8 bytes -> f16 bits in one zmm: sign-extending b to 16 bits puts the
 * sign in bits 8..15; shifted left by 7, bits 7..13 hold b & 0x7f and bit 15
 * the sign; clearing bit 14 (a copy of the sign) leaves
 * (b & 0x7f) << 7 | (b & 0x80) << 8. Three integer ops per 32 weights. */
static inline __m512i fp8x32_h(const uint8_t *p) {
    __m512i v = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_and_si512(_mm512_slli_epi16(v, 7), _mm512_set1_epi16((short)0xbfff));
}
static inline __m512 h_lo(__m512i h) { return _mm512_cvtph_ps(_mm512_castsi512_si256(h)); }
static inline __m512 h_hi(__m512i h) { return _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)); }

float df_k_dot_fp8_avx512(const uint8_t *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = a0, a3 = a0;
    __mmask32 nan = 0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        nan |= fp8_nan32(w + i) | fp8_nan32(w + i + 32);
        __m512i h0 = fp8x32_h(w + i), h1 = fp8x32_h(w + i + 32);
        a0 = _mm512_fmadd_ps(h_lo(h0), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(h_hi(h0), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(h_lo(h1), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(h_hi(h1), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(fp8x16(_mm_loadu_si128((const __m128i *)(w + i))), _mm512_loadu_ps(x + i), a0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(fp8x16(_mm_maskz_loadu_epi8(m, w + i)), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return nan ? NAN : hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) * 256.0f;
}

/* ---- four rows per call ------------------------------------------------ */

void df_k_dot4_f32_avx512(const float *w, int64_t ld, const float *x, int64_t n, float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + ld + i), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 2 * ld + i), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 3 * ld + i), xv, a3);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + ld + i), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + 2 * ld + i), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + 3 * ld + i), xv, a3);
    }
    out[0] = hsum(a0), out[1] = hsum(a1), out[2] = hsum(a2), out[3] = hsum(a3);
}

#define DOT4_16(NAME, T, LD16, LDM)                                                                               \
    void NAME(const T *w, int64_t ld, const float *x, int64_t n, float *out) {                                    \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;            \
        int64_t i = 0;                                                                                            \
        for (; i + 32 <= n; i += 32) {                                                                            \
            __m512 xv = _mm512_loadu_ps(x + i), xw = _mm512_loadu_ps(x + i + 16);                                 \
            a0 = _mm512_fmadd_ps(LD16(w + i), xv, a0);                                                            \
            a1 = _mm512_fmadd_ps(LD16(w + ld + i), xv, a1);                                                       \
            a2 = _mm512_fmadd_ps(LD16(w + 2 * ld + i), xv, a2);                                                   \
            a3 = _mm512_fmadd_ps(LD16(w + 3 * ld + i), xv, a3);                                                   \
            b0 = _mm512_fmadd_ps(LD16(w + i + 16), xw, b0);                                                       \
            b1 = _mm512_fmadd_ps(LD16(w + ld + i + 16), xw, b1);                                                  \
            b2 = _mm512_fmadd_ps(LD16(w + 2 * ld + i + 16), xw, b2);                                              \
            b3 = _mm512_fmadd_ps(LD16(w + 3 * ld + i + 16), xw, b3);                                              \
        }                                                                                                         \
        for (; i < n; i += 16) {                                                                                  \
            __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);                    \
            __m512 xv = _mm512_maskz_loadu_ps(m, x + i);                                                          \
            a0 = _mm512_fmadd_ps(LDM(w + i, m), xv, a0);                                                          \
            a1 = _mm512_fmadd_ps(LDM(w + ld + i, m), xv, a1);                                                     \
            a2 = _mm512_fmadd_ps(LDM(w + 2 * ld + i, m), xv, a2);                                                 \
            a3 = _mm512_fmadd_ps(LDM(w + 3 * ld + i, m), xv, a3);                                                 \
        }                                                                                                         \
        out[0] = hsum(_mm512_add_ps(a0, b0)), out[1] = hsum(_mm512_add_ps(a1, b1));                               \
        out[2] = hsum(_mm512_add_ps(a2, b2)), out[3] = hsum(_mm512_add_ps(a3, b3));                               \
    }
static inline __m512 f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 f16x16_mask(const uint16_t *p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
DOT4_16(df_k_dot4_bf16_avx512, uint16_t, bf16x16, bf16x16_mask)
DOT4_16(df_k_dot4_f16_avx512, uint16_t, f16x16, f16x16_mask)

void df_k_dot4_fp8s_avx512(const uint8_t *w, int64_t ld, const float *x, int64_t n, int blk, const float *const *sc,
                           float *out) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __mmask32 nan = 0; /* of the four rows together */
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) {
        const int64_t c1 = n - c0 < blk ? n : c0 + blk;
        __m512 t0 = _mm512_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
        for (int64_t i = c0; i < c1; i += 32) {
            nan |= fp8_nan32(w + i) | fp8_nan32(w + ld + i) | fp8_nan32(w + 2 * ld + i) | fp8_nan32(w + 3 * ld + i);
            __m512 xv = _mm512_loadu_ps(x + i), xw = _mm512_loadu_ps(x + i + 16);
            __m512i h0 = fp8x32_h(w + i), h1 = fp8x32_h(w + ld + i), h2 = fp8x32_h(w + 2 * ld + i),
                    h3 = fp8x32_h(w + 3 * ld + i);
            t0 = _mm512_fmadd_ps(h_hi(h0), xw, _mm512_fmadd_ps(h_lo(h0), xv, t0));
            t1 = _mm512_fmadd_ps(h_hi(h1), xw, _mm512_fmadd_ps(h_lo(h1), xv, t1));
            t2 = _mm512_fmadd_ps(h_hi(h2), xw, _mm512_fmadd_ps(h_lo(h2), xv, t2));
            t3 = _mm512_fmadd_ps(h_hi(h3), xw, _mm512_fmadd_ps(h_lo(h3), xv, t3));
        }
        a0 = _mm512_fmadd_ps(t0, _mm512_set1_ps(sc[0][b]), a0);
        a1 = _mm512_fmadd_ps(t1, _mm512_set1_ps(sc[1][b]), a1);
        a2 = _mm512_fmadd_ps(t2, _mm512_set1_ps(sc[2][b]), a2);
        a3 = _mm512_fmadd_ps(t3, _mm512_set1_ps(sc[3][b]), a3);
    }
    out[0] = hsum(a0) * 256.0f, out[1] = hsum(a1) * 256.0f, out[2] = hsum(a2) * 256.0f, out[3] = hsum(a3) * 256.0f;
    if (nan)
        for (int k = 0; k < 4; k++)
            if (fp8_row_has_nan(w + k * ld, n)) out[k] = NAN;
}

/* FP8 with prepared x: the AVX2 file's integer route (E4M3 -> f32 by shifts
 * and masks, x in its order, kernels.h), in 256-bit registers, from the
 * shared header: the same bits as the AVX2 kernels; the four-row kernel
 * below in 512-bit registers. (It replaces the f16 route of dot4_fp8s here,
 * which vcvtph2ps bounds.) */
#define FP8I_PF(w, ld, off) ((void)0)
#include "backend/cpu/fp8_int_avx2.h"
float df_k_fp8x_prep_avx512(const float *x, float *xp, int64_t n) { return fp8i_prep(x, xp, n); }
float df_k_dot_fp8sp_avx512(const uint8_t *w, const float *xp, float xs, int64_t n, int blk, const float *sc) {
    return fp8i_dot(w, xp, xs, n, blk, sc);
}
/* The four-row kernel in 512-bit registers: rows 0 and 1 in the two halves
 * of one zmm, rows 2 and 3 in another, x broadcast to both halves. Each
 * lane does what the AVX2 kernel's lane does (the same conversion, the same
 * FMAs in the same order, the block scale, the same horizontal sum of each
 * half), so the bits are fp8i_dot4's (test_fp8_avx512_is_avx2) in half the
 * instructions. */
#define F8Z_HI(h) _mm512_castsi512_ps(_mm512_and_si512(h, m87))
#define F8Z_LO(h) _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(h, 16), m87))
#define F8Z_PAIR(p, t, u)                                                                                          \
    {                                                                                                              \
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w + 2 * (p) * ld + i))), \
                                             _mm256_loadu_si256((const __m256i *)(w + (2 * (p) + 1) * ld + i)), 1);  \
        const __m512i hA = _mm512_srai_epi16(v, 4), hB = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 4);            \
        if (chk) nan = _mm512_max_epu8(nan, _mm512_and_si512(v, m7f));                                             \
        t = _mm512_fmadd_ps(F8Z_LO(hB), x0, t), u = _mm512_fmadd_ps(F8Z_LO(hA), x1, u);                             \
        t = _mm512_fmadd_ps(F8Z_HI(hB), x2, t), u = _mm512_fmadd_ps(F8Z_HI(hA), x3, u);                             \
    }
static inline __m512 f8z_scales(const float *s0, const float *s1, int64_t b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0[b])), _mm256_set1_ps(s1[b]), 1);
}
/* chk: as fp8i_dot4's (1: NaN codes give NaN; 0: the rows hold none) */
static inline __attribute__((always_inline)) void f8z_dot4(const uint8_t *w, int64_t ld, const float *xp, float xs,
                                                           int64_t n, int blk, const float *const *sc, float *out,
                                                           const int chk) {
    const __m512i m87 = _mm512_set1_epi32((int)0x87f00000u), m7f = _mm512_set1_epi8(0x7f);
    __m512 a01 = _mm512_setzero_ps(), a23 = _mm512_setzero_ps();
    __m512i nan = _mm512_setzero_si512(); /* of the four rows together */
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) {
        const int64_t c1 = n - c0 < blk ? n : c0 + blk;
        __m512 t01 = _mm512_setzero_ps(), u01 = t01, t23 = t01, u23 = t01;
        for (int64_t i = c0; i < c1; i += 32) {
            if (!(i & 63)) /* as the AVX2 kernel (kernels_avx2.c, DF_FP8_PF): each row 512 bytes ahead */
                for (int k = 0; k < 4; k++) _mm_prefetch((const char *)w + k * ld + i + 512, _MM_HINT_T0);
            const __m512 x0 = _mm512_broadcast_f32x8(_mm256_loadu_ps(xp + i)), x1 = _mm512_broadcast_f32x8(_mm256_loadu_ps(xp + i + 8));
            const __m512 x2 = _mm512_broadcast_f32x8(_mm256_loadu_ps(xp + i + 16)), x3 = _mm512_broadcast_f32x8(_mm256_loadu_ps(xp + i + 24));
            F8Z_PAIR(0, t01, u01)
            F8Z_PAIR(1, t23, u23)
        }
        a01 = _mm512_fmadd_ps(_mm512_add_ps(t01, u01), f8z_scales(sc[0], sc[1], b), a01);
        a23 = _mm512_fmadd_ps(_mm512_add_ps(t23, u23), f8z_scales(sc[2], sc[3], b), a23);
    }
    const int anynan = chk && _mm512_cmpeq_epi8_mask(nan, m7f) != 0;
    const __m256 h[4] = {_mm512_castps512_ps256(a01), _mm512_extractf32x8_ps(a01, 1), _mm512_castps512_ps256(a23),
                         _mm512_extractf32x8_ps(a23, 1)};
    for (int k = 0; k < 4; k++) out[k] = anynan && fp8i_row_has_nan(w + k * ld, n) ? NAN : fp8i_hsum8(h[k]) * xs;
}
void df_k_dot4_fp8sp_avx512(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,
                            const float *const *sc, float *out) {
    f8z_dot4(w, ld, xp, xs, n, blk, sc, out, 1);
}
void df_k_dot4_fp8spn_avx512(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,
                             const float *const *sc, float *out) {
    f8z_dot4(w, ld, xp, xs, n, blk, sc, out, 0);
}

void df_k_axpy_avx512(float *y, float a, const float *x, int64_t n) {
    const __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

float df_k_dot_int4_avx512(const uint8_t *p, const float *scales, int group, const float *x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    const __m512 eight = _mm512_set1_ps(8.0f);
    for (int64_t g0 = 0; g0 < n; g0 += group) {
        __m512 gs = _mm512_setzero_ps();
        for (int64_t i = g0; i < g0 + group; i += 32) {
            __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + i / 2)));
            /* 16-bit lane k = byte k: low nibble -> byte 2k, high nibble -> byte 2k+1 (element order) */
            __m256i e = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi16(0x0f)),
                                        _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0xf0)), 4));
            __m512 q0 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(e))), eight);
            __m512 q1 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(e, 1))), eight);
            gs = _mm512_fmadd_ps(q0, _mm512_loadu_ps(x + i), gs);
            gs = _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + i + 16), gs);
        }
        acc = _mm512_fmadd_ps(gs, _mm512_set1_ps(scales[g0 / group]), acc);
    }
    return hsum(acc);
}

/* BF16 decode: the AVX-512 kernels widen with one vpmovzxwd per 16; the
 * prepared-x entry points use them as they are (xp = x). */
void df_k_bf16x_prep_avx512(const float *x, float *xp, int64_t n) { memcpy(xp, x, (size_t)n * sizeof(float)); }
float df_k_dot_bf16p_avx512(const uint16_t *w, const float *x, const float *xp, int64_t n) {
    (void)xp;
    return df_k_dot_bf16_avx512(w, x, n);
}
void df_k_dot4_bf16p_avx512(const uint16_t *w, int64_t ld, const float *x, const float *xp, int64_t n, float *out) {
    (void)xp;
    df_k_dot4_bf16_avx512(w, ld, x, n, out);
}

/* The prefill GEMM uses the AVX2 micro-kernel (every AVX-512 CPU has AVX2 +
 * FMA): a 512-bit one (16 rows x 12 tokens) is left for a machine where it
 * can be measured and tested. Same bits either way (kernels.h). */
void df_k_pack16_avx512(const float *src, int64_t ld, int nr, int64_t kc, float *P) { df_k_pack16_avx2(src, ld, nr, kc, P); }
void df_k_gemm16_avx512(const float *P, int64_t kc, const float *X, int64_t ldx, int nt, float *Y, int64_t ldy,
                        int nr, int acc) {
    df_k_gemm16_avx2(P, kc, X, ldx, nt, Y, ldy, nr, acc);
}
void df_k_gemm32_avx512(const float *P, int64_t pstride, int64_t kc, const float *X, int64_t ldx, int nt, float *Y,
                        int64_t ldy, int acc) {
    df_k_gemm32_avx2(P, pstride, kc, X, ldx, nt, Y, ldy, acc);
}

void df_k_deq_bf16_avx512(const uint16_t *w, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, bf16x16(w + i));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(out + i, m, bf16x16_mask(w + i, m));
    }
}
void df_k_deq_f16_avx512(const uint16_t *w, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i)));
    }
}
void df_k_deq_fp8_avx512(const uint8_t *w, float scale, float *out, int64_t n) {
    const __m512 s = _mm512_set1_ps(scale * 256.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(fp8x16(_mm_loadu_si128((const __m128i *)(w + i))), s));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(fp8x16(_mm_maskz_loadu_epi8(m, w + i)), s));
    }
}

/* ---- MXFP4 ------------------------------------------------------------- */
/* 16 packed bytes -> the 32 codes in element order (two zmm of 32-bit
 * lanes), then f32 values by vpermps over the 16 signed E2M1 values (its
 * index is the low 4 bits: the code itself, -0.0 included). */
static inline void e2m1x32(const uint8_t *p, __m512 *v0, __m512 *v1) {
    const __m512 kv = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i e = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi16(0x0f)), _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0xf0)), 4));
    *v0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(e)), kv);
    *v1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(e, 1)), kv);
}

float df_k_dot_mxfp4_avx512(const uint8_t *p, const uint8_t *scales, const float *x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < n; g0 += 32) {
        __m512 v0, v1;
        e2m1x32(p + g0 / 2, &v0, &v1);
        __m512 gs = _mm512_fmadd_ps(v1, _mm512_loadu_ps(x + g0 + 16), _mm512_mul_ps(v0, _mm512_loadu_ps(x + g0)));
        acc = _mm512_fmadd_ps(gs, _mm512_set1_ps(df_e8m0_to_f32(scales[g0 / 32])), acc);
    }
    return hsum(acc);
}

void df_k_deq_mxfp4_avx512(const uint8_t *p, const uint8_t *scales, float *out, int64_t n) {
    for (int64_t g0 = 0; g0 < n; g0 += 32) {
        const __m512 s = _mm512_set1_ps(df_e8m0_to_f32(scales[g0 / 32]));
        __m512 v0, v1;
        e2m1x32(p + g0 / 2, &v0, &v1);
        _mm512_storeu_ps(out + g0, _mm512_mul_ps(v0, s));
        _mm512_storeu_ps(out + g0 + 16, _mm512_mul_ps(v1, s));
    }
}
