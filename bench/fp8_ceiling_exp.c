/* fp8_ceiling_exp.c - docs/PERFORMANCE.md "Issue 17: FP8 decode, round 4":
 * the one-thread, L2-resident compute ceiling of the AVX2 FP8 four-row
 * decode kernel (df_k_dot4_fp8sp_avx2) against variants of its E4M3 -> f32
 * conversion, without the NaN-code check, and an eight-row kernel. A
 * measuring aid, not built by the Makefile:
 *
 *   make build/bench/kernel_bench
 *   cc -std=c11 -D_GNU_SOURCE -O2 -mavx2 -mfma -Iinclude -Isrc -DCONV=0 [-DNONAN] [-DR8=ROW8]
 *      -o /tmp/f8c bench/fp8_ceiling_exp.c build/src/backend/cpu/kernels_avx2.o
 *      build/src/backend/cpu/kernels_scalar.o build/src/backend/cpu/kernels_avx512.o -lm   (one line)
 *   /tmp/f8c COLS ROWS WHICH ITERS
 *
 * WHICH 0: the engine's kernel, 3: the engine's kernel for rows known to hold no NaN
 * code (dot4_fp8spn, round 5), 1: this file's four-row kernel with
 * conversion CONV, 2: its eight-row kernel (R8: ROW8B one accumulator per
 * row, four chained FMAs; ROW8 a product tree per row). ROWS x COLS bytes of
 * random finite codes (ROWS 32 x COLS 7168 = 224 KiB: L2-resident), ITERS
 * passes; prints G weights per second of process CPU time. The first pass
 * is checked against the engine's kernel (rounding-level tolerance). */
#include "backend/cpu/kernels.h"
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static int row_has_nan(const uint8_t *p, int64_t n) { for (int64_t i = 0; i < n; i++) if ((p[i] & 0x7f) == 0x7f) return 1; return 0; }
static inline int nan_seen32(__m256i acc) { return _mm256_movemask_epi8(_mm256_cmpeq_epi8(acc, _mm256_set1_epi8(0x7f))) != 0; }
#ifndef CONV
#define CONV 1
#endif
/* CVT: the 32 codes of one 32-byte load v -> f0 (codes 4j), f1 (4j+1), f2
 * (4j+2), f3 (4j+3) as f32 (fp8_int_avx2.h's order and bits). CONV 0: the
 * engine's (5 shifts, 4 ands); 1: the same bits with 2 vpmaddwd for 2 of the
 * shifts; 2: the same bits, 4 vpmaddwd + 1 shift; 5/6: a second load one byte
 * back instead of the 16-bit shift left (the same bits; reads w[-1]: the
 * harness leaves 64 bytes before the matrix); timing-only bounds (wrong
 * values): 3 no conversion, 4 one shift + one and for all four, 7 four
 * shifts + four ands, 8 four plain logic ops. */
#if CONV == 0
#define CVT(v, f0, f1, f2, f3) \
    const __m256i hA = _mm256_srai_epi16(v, 4), hB = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4); \
    const __m256 f0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(hB, 16), m87)); \
    const __m256 f1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(hA, 16), m87)); \
    const __m256 f2 = _mm256_castsi256_ps(_mm256_and_si256(hB, m87)); \
    const __m256 f3 = _mm256_castsi256_ps(_mm256_and_si256(hA, m87));
#elif CONV == 1
#define CVT(v, f0, f1, f2, f3) \
    const __m256i w_ = _mm256_slli_epi16(v, 8); \
    const __m256 f0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(w_, klo), m87)); \
    const __m256 f1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(v, klo), m87)); \
    const __m256 f2 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(w_, 4), m87)); \
    const __m256 f3 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(v, 4), m87));
#elif CONV == 5
#define CVT(v, f0, f1, f2, f3) \
    const __m256i l1_ = _mm256_loadu_si256((const __m256i *)(wr_ - 1)); \
    const __m256 f0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(l1_, klo), m87)); \
    const __m256 f1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(v, klo), m87)); \
    const __m256 f2 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(l1_, 4), m87)); \
    const __m256 f3 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(v, 4), m87));
#elif CONV == 6
#define CVT(v, f0, f1, f2, f3) \
    const __m256i l1_ = _mm256_loadu_si256((const __m256i *)(wr_ - 1)); \
    const __m256 f0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(_mm256_srai_epi16(l1_, 4), 16), m87)); \
    const __m256 f1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(_mm256_srai_epi16(v, 4), 16), m87)); \
    const __m256 f2 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(l1_, 4), m87)); \
    const __m256 f3 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(v, 4), m87));
#elif CONV == 7
#define CVT(v, f0, f1, f2, f3) \
    const __m256 f0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(v, 4), m87)); \
    const __m256 f1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(v, 3), m87)); \
    const __m256 f2 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(v, 2), m87)); \
    const __m256 f3 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi16(v, 1), m87));
#elif CONV == 8
#define CVT(v, f0, f1, f2, f3) \
    const __m256 f0 = _mm256_castsi256_ps(_mm256_and_si256(v, m87)); \
    const __m256 f1 = _mm256_castsi256_ps(_mm256_andnot_si256(v, m87)); \
    const __m256 f2 = _mm256_castsi256_ps(_mm256_or_si256(v, m87)); \
    const __m256 f3 = _mm256_castsi256_ps(_mm256_xor_si256(v, m87));
#elif CONV == 3
#define CVT(v, f0, f1, f2, f3) const __m256 f0 = _mm256_castsi256_ps(v), f1 = f0, f2 = f0, f3 = f0;
#elif CONV == 4
#define CVT(v, f0, f1, f2, f3) const __m256i hA = _mm256_srai_epi16(v, 4); const __m256 f0 = _mm256_castsi256_ps(_mm256_and_si256(hA, m87)), f1 = f0, f2 = f0, f3 = f0;
#else
#define CVT(v, f0, f1, f2, f3) \
    const __m256i w_ = _mm256_slli_epi16(v, 8); \
    const __m256 f0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(w_, klo), m87)); \
    const __m256 f1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(v, klo), m87)); \
    const __m256 f2 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(w_, khi), m87)); \
    const __m256 f3 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_madd_epi16(v, khi), m87));
#endif
#ifdef NONAN
#define NANACC(acc, v) (void)0
#else
#define NANACC(acc, v) acc = _mm256_max_epu8(acc, _mm256_and_si256(v, m7f))
#endif

#define ROW4(r, t, u) { const uint8_t *wr_ = w + (r) * ld + i; (void)wr_; const __m256i v = _mm256_loadu_si256((const __m256i *)wr_); NANACC(nan, v); CVT(v, f0, f1, f2, f3) \
    t = _mm256_fmadd_ps(f0, x0, t), u = _mm256_fmadd_ps(f1, x1, u); t = _mm256_fmadd_ps(f2, x2, t), u = _mm256_fmadd_ps(f3, x3, u); }

void v4(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk, const float *const *sc, float *out) {
    const __m256i m87 = _mm256_set1_epi32((int)0x87f00000u), m7f = _mm256_set1_epi8(0x7f), klo = _mm256_set1_epi32(4096), khi = _mm256_set1_epi32(4096 << 16);
    (void)klo, (void)khi, (void)m87, (void)m7f;
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256i nan = _mm256_setzero_si256();
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) {
        const int64_t c1 = n - c0 < blk ? n : c0 + blk;
        __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0, u0 = t0, u1 = t0, u2 = t0, u3 = t0;
        for (int64_t i = c0; i < c1; i += 32) {
            const __m256 x0 = _mm256_loadu_ps(xp + i), x1 = _mm256_loadu_ps(xp + i + 8), x2 = _mm256_loadu_ps(xp + i + 16), x3 = _mm256_loadu_ps(xp + i + 24);
            ROW4(0, t0, u0) ROW4(1, t1, u1) ROW4(2, t2, u2) ROW4(3, t3, u3)
        }
        a[0] = _mm256_fmadd_ps(_mm256_add_ps(t0, u0), _mm256_set1_ps(sc[0][b]), a[0]);
        a[1] = _mm256_fmadd_ps(_mm256_add_ps(t1, u1), _mm256_set1_ps(sc[1][b]), a[1]);
        a[2] = _mm256_fmadd_ps(_mm256_add_ps(t2, u2), _mm256_set1_ps(sc[2][b]), a[2]);
        a[3] = _mm256_fmadd_ps(_mm256_add_ps(t3, u3), _mm256_set1_ps(sc[3][b]), a[3]);
    }
    const int anynan = nan_seen32(nan);
    for (int k = 0; k < 4; k++) out[k] = anynan && row_has_nan(w + k * ld, n) ? NAN : hsum8(a[k]) * xs;
}
/* eight rows, one accumulator per row per block */
#define ROW8(r) { const uint8_t *wr_ = w + (r) * ld + i; (void)wr_; const __m256i v = _mm256_loadu_si256((const __m256i *)wr_); NANACC(nan, v); CVT(v, f0, f1, f2, f3) \
    __m256 p = _mm256_mul_ps(f0, _mm256_loadu_ps(xp + i)); p = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xp + i + 8), p); \
    p = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xp + i + 16), p); t[r] = _mm256_add_ps(t[r], _mm256_fmadd_ps(f3, _mm256_loadu_ps(xp + i + 24), p)); }
#define ROW8B(r) { const uint8_t *wr_ = w + (r) * ld + i; (void)wr_; const __m256i v = _mm256_loadu_si256((const __m256i *)wr_); NANACC(nan, v); CVT(v, f0, f1, f2, f3) \
    t[r] = _mm256_fmadd_ps(f0, _mm256_loadu_ps(xp + i), t[r]); t[r] = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xp + i + 8), t[r]); \
    t[r] = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xp + i + 16), t[r]); t[r] = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xp + i + 24), t[r]); }
#ifndef R8
#define R8 ROW8B
#endif
void v8(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk, const float *const *sc, float *out) {
    const __m256i m87 = _mm256_set1_epi32((int)0x87f00000u), m7f = _mm256_set1_epi8(0x7f), klo = _mm256_set1_epi32(4096), khi = _mm256_set1_epi32(4096 << 16);
    (void)klo, (void)khi, (void)m87, (void)m7f;
    __m256 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    __m256i nan = _mm256_setzero_si256();
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) {
        const int64_t c1 = n - c0 < blk ? n : c0 + blk;
        __m256 t[8];
        for (int k = 0; k < 8; k++) t[k] = _mm256_setzero_ps();
        for (int64_t i = c0; i < c1; i += 32) { R8(0) R8(1) R8(2) R8(3) R8(4) R8(5) R8(6) R8(7) }
        for (int k = 0; k < 8; k++) a[k] = _mm256_fmadd_ps(t[k], _mm256_set1_ps(sc[k][b]), a[k]);
    }
    const int anynan = nan_seen32(nan);
    for (int k = 0; k < 8; k++) out[k] = anynan && row_has_nan(w + k * ld, n) ? NAN : hsum8(a[k]) * xs;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char **argv) {
    df_kernels_init(); if (getenv("DAZ")) _mm_setcsr(_mm_getcsr() | 0x8040);
    const int64_t C = argc > 1 ? atoll(argv[1]) : 2048; const int R = argc > 2 ? atoi(argv[2]) : 64; const int which = argc > 3 ? atoi(argv[3]) : 0;
    const int iters = argc > 4 ? atoi(argv[4]) : 200;
    uint8_t *w = (uint8_t *)aligned_alloc(64, (size_t)R * C + 64) + 64; float *x = malloc(C * 4), *xp = malloc(C * 4), *sc = malloc(((C + 127) / 128) * 4 * 8);
    srand(1);
    for (int64_t i = 0; i < R * C; i++) { uint8_t c = rand() & 0xff; if ((c & 0x7f) == 0x7f) c = 0x31; w[i] = c; }
    for (int64_t i = 0; i < C; i++) x[i] = (float)(rand() % 20001) / 20000.0f - 0.5f;
    for (int64_t i = 0; i < (C + 127) / 128 * 8; i++) sc[i] = 0.01f * (1 + i % 7);
    const float xs = df_k_fp8x_prep_avx2(x, xp, C);
    const float *scp[8]; for (int k = 0; k < 8; k++) scp[k] = sc + k * ((C + 127) / 128);
    float out[8], ref[8];
    df_k_dot4_fp8sp_avx2(w, C, xp, xs, C, 128, scp, ref); df_k_dot4_fp8sp_avx2(w + 4 * C, C, xp, xs, C, 128, scp + 4, ref + 4);
    if (which == 1) { v4(w, C, xp, xs, C, 128, scp, out); v4(w + 4 * C, C, xp, xs, C, 128, scp + 4, out + 4); }
    else if (which == 2) v8(w, C, xp, xs, C, 128, scp, out);
    else memcpy(out, ref, sizeof out);
    for (int k = 0; k < 8; k++) if (fabsf(out[k] - ref[k]) > 1e-4f * (fabsf(ref[k]) + 1)) printf("MISMATCH row %d %g %g\n", k, out[k], ref[k]);
    double t0 = now(); float sink = 0;
    for (int it = 0; it < iters; it++) {
        if (which == 2) for (int r = 0; r + 8 <= R; r += 8) { v8(w + (size_t)r * C, C, xp, xs, C, 128, scp, out); sink += out[0]; }
        else for (int r = 0; r + 4 <= R; r += 4) {
            if (which == 1) v4(w + (size_t)r * C, C, xp, xs, C, 128, scp, out);
            else if (which == 3) df_k_dot4_fp8spn_avx2(w + (size_t)r * C, C, xp, xs, C, 128, scp, out);
            else df_k_dot4_fp8sp_avx2(w + (size_t)r * C, C, xp, xs, C, 128, scp, out);
            sink += out[0]; }
    }
    double t = now() - t0;
    printf("which=%d C=%lld R=%d conv=%d: %.2f G weights/s (cpu) sink %g\n", which, (long long)C, R, CONV, (double)R * C * iters / t * 1e-9, sink);
    return 0;
}
