/* fp8_int_avx2.h - the FP8 (E4M3) decode kernels on prepared x by integer
 * ops in 256-bit registers (AVX2), shared by kernels_avx2.c and
 * kernels_avx512.c: included by both, each compiled with its own ISA flags,
 * so an AVX-512 machine runs the same prep and one-row kernel (its four-row
 * kernel is the same per lane in 512-bit registers) and gets the AVX2
 * file's bits (tests/unit/test_backend_kernels.c: test_fp8_avx512_is_avx2). The
 * includer defines FP8I_PF(w, ld, off) (a prefetch hook, may be empty). */
#ifndef DF_FP8_INT_AVX2_H
#define DF_FP8_INT_AVX2_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

static inline float fp8i_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline int fp8i_row_has_nan(const uint8_t *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if ((p[i] & 0x7f) == 0x7f) return 1;
    return 0;
}

/* ---- FP8 decode with prepared x -------------------------------------- */
/* 32 E4M3 bytes in one load (v): 32-bit lane j holds codes 4j, 4j+1, 4j+2,
 * 4j+3 in its bytes 0..3. An arithmetic shift right by 4 of each 16-bit half
 * (F8A) puts the code of the half's high byte (4j+1 low half, 4j+3 high
 * half) in bits 4..10 of the half and its sign in bits 11..15; F8B does the
 * same for the low bytes (4j, 4j+2) after a shift left by 8. In the high
 * half those bits are f32 bits 20..26 (exponent and mantissa) and 27..31
 * (sign, and copies of it in 27..30 that the mask 0x87f00000 clears, with
 * the low half): F8HI is codes 4j+3 / 4j+2 as f32, F8LO (the low half
 * shifted up 16 first) codes 4j+1 / 4j. Each f32 is the E4M3 value times
 * 2^-120, exactly, subnormal codes included (as f32 subnormals). Nine
 * integer ops per 32 weights, all within 128-bit lanes (no vpmovsxbw, no
 * conversion instruction: vcvtph2ps bounded the f16 route above at ~12 G
 * weights/s per core on the 2-core EPYC dev VM), and the one 32-byte load
 * serves the NaN-code check too. x is prepared in that order (fp8x_prep:
 * per 32 elements x[4j], then x[4j+1], x[4j+2], x[4j+3], j < 8) and times
 * 2^k; sums times 2^(120-k). */
#define F8A(v) _mm256_srai_epi16(v, 4)
#define F8B(v) _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4)
#define F8HI(h) _mm256_castsi256_ps(_mm256_and_si256(h, m87))
#define F8LO(h) _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(h, 16), m87))
#define F8NAN(acc, v) _mm256_max_epu8(acc, _mm256_and_si256(v, _mm256_set1_epi8(0x7f)))
static inline int fp8i_nan_seen32(__m256i acc) { return _mm256_movemask_epi8(_mm256_cmpeq_epi8(acc, _mm256_set1_epi8(0x7f))) != 0; }

static inline float fp8i_prep(const float *x, float *xp, int64_t n) {
    /* the largest finite |x| (infinities and NaNs pass through the scaling unchanged) */
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    __m256 mv = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absm);
        mv = _mm256_max_ps(mv, _mm256_and_ps(a, _mm256_cmp_ps(a, inf, _CMP_LT_OQ)));
    }
    float t[8], m = 0;
    _mm256_storeu_ps(t, mv);
    for (int j = 0; j < 8; j++) m = t[j] > m ? t[j] : m;
    for (; i < n; i++) m = fabsf(x[i]) < INFINITY && fabsf(x[i]) > m ? fabsf(x[i]) : m;
    int e;
    frexpf(m, &e); /* m < 2^e */
    const int k = 127 - e < 120 ? 127 - e : 120;
    const float up = ldexpf(1.0f, k);
    const __m256 upv = _mm256_set1_ps(up);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (i = 0; i + 32 <= n; i += 32) {
        /* a 4 x 4 transpose in each 128-bit half, then the halves interleaved */
        const __m256 a0 = _mm256_loadu_ps(x + i), a1 = _mm256_loadu_ps(x + i + 8), a2 = _mm256_loadu_ps(x + i + 16),
                     a3 = _mm256_loadu_ps(x + i + 24);
        const __m256 u0 = _mm256_unpacklo_ps(a0, a1), u1 = _mm256_unpackhi_ps(a0, a1), u2 = _mm256_unpacklo_ps(a2, a3),
                     u3 = _mm256_unpackhi_ps(a2, a3);
        const __m256 t[4] = {_mm256_shuffle_ps(u0, u2, 0x44), _mm256_shuffle_ps(u0, u2, 0xEE), _mm256_shuffle_ps(u1, u3, 0x44),
                             _mm256_shuffle_ps(u1, u3, 0xEE)};
        for (int q = 0; q < 4; q++) _mm256_storeu_ps(xp + i + 8 * q, _mm256_mul_ps(_mm256_permutevar8x32_ps(t[q], perm), upv));
    }
    for (; i < n; i++) xp[i] = x[i] * up;
    return ldexpf(1.0f, 120 - k);
}

static inline float fp8i_dot(const uint8_t *w, const float *xp, float xs, int64_t n, int blk, const float *sc) {
    const __m256i m87 = _mm256_set1_epi32((int)0x87f00000u);
    __m256 a = _mm256_setzero_ps();
    __m256i nan = _mm256_setzero_si256();
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) {
        const int64_t c1 = n - c0 < blk ? n : c0 + blk;
        __m256 t0 = _mm256_setzero_ps(), t1 = t0, u0 = t0, u1 = t0;
        for (int64_t i = c0; i < c1; i += 32) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + i)), hA = F8A(v), hB = F8B(v);
            nan = F8NAN(nan, v);
            t0 = _mm256_fmadd_ps(F8LO(hB), _mm256_loadu_ps(xp + i), t0);
            u0 = _mm256_fmadd_ps(F8LO(hA), _mm256_loadu_ps(xp + i + 8), u0);
            t1 = _mm256_fmadd_ps(F8HI(hB), _mm256_loadu_ps(xp + i + 16), t1);
            u1 = _mm256_fmadd_ps(F8HI(hA), _mm256_loadu_ps(xp + i + 24), u1);
        }
        a = _mm256_fmadd_ps(_mm256_add_ps(_mm256_add_ps(t0, u0), _mm256_add_ps(t1, u1)), _mm256_set1_ps(sc[b]), a);
    }
    return fp8i_nan_seen32(nan) ? NAN : fp8i_hsum8(a) * xs;
}

/* c + a * (the 8 floats at p), one fused multiply-add with a memory operand
 * (the same bits as _mm256_fmadd_ps(a, load(p), c)). The four-row kernel
 * reads x this way in each row's FMAs instead of loading x once into four
 * registers: the loads ride in the FMA instructions (Zen 3 issues 3 loads a
 * cycle, and x is in L1), and the four registers it frees end the
 * compiler's spills of the 16 it has (x4, 8 accumulators, the mask, the
 * conversion's temporaries): gcc 12 reloaded each row's weights twice and
 * added 4 register moves per 128 weights (docs/PERFORMANCE.md, "Issue 17:
 * FP8 decode and two-thread GEMM, round 5"). DF_FP8_XMEM=0 builds the
 * register form. */
#ifndef DF_FP8_XMEM
#define DF_FP8_XMEM 1
#endif
#if DF_FP8_XMEM && defined(__GNUC__)
#define FP8I_FMAM(a, p, c) __asm__("vfmadd231ps %2, %1, %0" : "+x"(c) : "x"(a), "m"(*(const __m256 *)(const void *)(p)))
#else
#define FP8I_FMAM(a, p, c) ((c) = _mm256_fmadd_ps((a), _mm256_loadu_ps(p), (c)))
#endif
/* one row's 32 weights at column i (x: xp + i, the block's four vectors) */
#define F8ROW(r, t, u)                                                                                            \
    {                                                                                                             \
        const __m256i v = _mm256_loadu_si256((const __m256i *)(w + (r) * ld + i)), hA = F8A(v), hB = F8B(v);     \
        if (chk) nan = F8NAN(nan, v);                                                                             \
        FP8I_FMAM(F8LO(hB), xp + i, t);                                                                           \
        FP8I_FMAM(F8LO(hA), xp + i + 8, u);                                                                       \
        FP8I_FMAM(F8HI(hB), xp + i + 16, t);                                                                      \
        FP8I_FMAM(F8HI(hA), xp + i + 24, u);                                                                      \
    }
/* chk 1: rows with an E4M3 NaN code (0x7f, 0xff) give NaN (two ops per row and
 * 32 weights, and a scan of the four rows when one is seen); chk 0: the
 * caller knows the rows hold none (kernels.h: dot4_fp8spn), the same bits
 * for such rows. A compile-time constant at each use (always inlined). */
static inline __attribute__((always_inline)) void fp8i_dot4(const uint8_t *w, int64_t ld, const float *xp, float xs,
                                                            int64_t n, int blk, const float *const *sc, float *out,
                                                            const int chk) {
    const __m256i m87 = _mm256_set1_epi32((int)0x87f00000u);
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256i nan = _mm256_setzero_si256(); /* of the four rows together */
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) {
        const int64_t c1 = n - c0 < blk ? n : c0 + blk;
        __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0, u0 = t0, u1 = t0, u2 = t0, u3 = t0;
        for (int64_t i = c0; i < c1; i += 32) {
            if (!(i & 63)) FP8I_PF(w, ld, i);
            F8ROW(0, t0, u0)
            F8ROW(1, t1, u1)
            F8ROW(2, t2, u2)
            F8ROW(3, t3, u3)
        }
        a[0] = _mm256_fmadd_ps(_mm256_add_ps(t0, u0), _mm256_set1_ps(sc[0][b]), a[0]);
        a[1] = _mm256_fmadd_ps(_mm256_add_ps(t1, u1), _mm256_set1_ps(sc[1][b]), a[1]);
        a[2] = _mm256_fmadd_ps(_mm256_add_ps(t2, u2), _mm256_set1_ps(sc[2][b]), a[2]);
        a[3] = _mm256_fmadd_ps(_mm256_add_ps(t3, u3), _mm256_set1_ps(sc[3][b]), a[3]);
    }
    const int anynan = chk && fp8i_nan_seen32(nan);
    for (int k = 0; k < 4; k++) out[k] = anynan && fp8i_row_has_nan(w + k * ld, n) ? NAN : fp8i_hsum8(a[k]) * xs;
}

#endif
