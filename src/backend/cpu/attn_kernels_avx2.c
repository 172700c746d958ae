/* attn_kernels_avx2.c - attn_kernels.h's attention kernels on AVX2 + FMA,
 * the same bits as the scalar reference (see the definition there).
 *
 * scores: blocks of up to 3 queries x 4 keys, one 8-lane accumulator per
 *   (query, key) (lane c: the chain over d = c mod 8), K rows read once per
 *   block for all its queries; the four keys' lanes are summed by three
 *   horizontal adds and one 128-bit add, which is tree8 for each key.
 * softmax: 8 scores at a time, exp as a vector polynomial.
 * pv: blocks of up to 3 queries x 32 dimensions (12 accumulators), a V row
 *   segment loaded once for the block's queries.
 * head_dim % 8 != 0: the scalar kernels (the same definition). */
#include "backend/cpu/attn_kernels.h"

#include <immintrin.h>
#include <math.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define KA_PF 8 /* keys ahead that the kernels prefetch */

/* [tree8(a), tree8(b), tree8(c), tree8(d)] */
ALWAYS_INLINE __m128 red4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_hadd_ps(a, b); /* a0+a1 a2+a3 b0+b1 b2+b3 | a4+a5 a6+a7 b4+b5 b6+b7 */
    const __m256 cd = _mm256_hadd_ps(c, d);
    const __m256 x = _mm256_hadd_ps(ab, cd); /* (a0+a1)+(a2+a3) ... | (a4+a5)+(a6+a7) ... */
    return _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
}

/* NQ queries x NK (4 or 1) keys */
ALWAYS_INLINE void sc_block(const float *Q, const int NQ, const float *K, int64_t ldk, const int NK, int hd,
                            __m256 scale, float *S, int64_t lds) {
    __m256 acc[3][4];
    #pragma GCC unroll 4
    for (int i = 0; i < 3; i++)
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++) acc[i][k] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        __m256 kv[4];
        #pragma GCC unroll 4
        for (int k = 0; k < NK; k++) kv[k] = _mm256_loadu_ps(K + k * ldk + d);
        #pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            const __m256 q = _mm256_loadu_ps(Q + (size_t)i * hd + d);
            #pragma GCC unroll 4
            for (int k = 0; k < NK; k++) acc[i][k] = _mm256_fmadd_ps(q, kv[k], acc[i][k]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NQ; i++) {
        if (NK == 4) {
            const __m128 s = red4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            _mm_storeu_ps(S + (size_t)i * lds, _mm_mul_ps(s, _mm256_castps256_ps128(scale)));
        } else {
            const __m128 s = red4(acc[i][0], acc[i][0], acc[i][0], acc[i][0]);
            _mm_store_ss(S + (size_t)i * lds, _mm_mul_ss(s, _mm256_castps256_ps128(scale)));
        }
    }
}

void df_ka_scores_avx2(const float *Q, int nq, const float *K, int64_t ldk, int nk, int hd, float scale, float *S,
                       int64_t lds) {
    if (hd % 8) { df_ka_scores_scalar(Q, nq, K, ldk, nk, hd, scale, S, lds); return; }
    const __m256 sv = _mm256_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *k = K + (size_t)j * ldk;
        /* the rows KA_PF keys ahead into L1: a cache's K rows sit 2 x kdim floats apart (V between them), a
         * few per 4 KB page, which the hardware prefetcher follows poorly (decode at 1,500 positions ran at
         * a quarter of the read floor); hints only, no result changes */
        if (j + KA_PF + 4 <= nk)
            for (int r = 0; r < 4; r++)
                for (int d = 0; d < hd; d += 16) _mm_prefetch((const char *)(k + (size_t)(KA_PF + r) * ldk + d), _MM_HINT_T0);
        int i = 0;
        for (; i + 3 <= nq; i += 3) sc_block(Q + (size_t)i * hd, 3, k, ldk, 4, hd, sv, S + (size_t)i * lds + j, lds);
        if (nq - i == 2) sc_block(Q + (size_t)i * hd, 2, k, ldk, 4, hd, sv, S + (size_t)i * lds + j, lds);
        else if (nq - i == 1) sc_block(Q + (size_t)i * hd, 1, k, ldk, 4, hd, sv, S + (size_t)i * lds + j, lds);
    }
    for (; j < nk; j++) {
        const float *k = K + (size_t)j * ldk;
        int i = 0;
        for (; i + 3 <= nq; i += 3) sc_block(Q + (size_t)i * hd, 3, k, ldk, 1, hd, sv, S + (size_t)i * lds + j, lds);
        for (; i < nq; i++) sc_block(Q + (size_t)i * hd, 1, k, ldk, 1, hd, sv, S + (size_t)i * lds + j, lds);
    }
}

/* df_ka_exp on 8 lanes, operation for operation */
ALWAYS_INLINE __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f), magic = _mm256_set1_ps(12582912.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 r2 = _mm256_mul_ps(r, r);
    __m256 y = _mm256_fmadd_ps(p, r2, r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

float df_ka_softmax_avx2(float *s, int n) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
    float mx[8];
    _mm256_storeu_ps(mx, mv);
    float m = mx[0];
    for (int c = 1; c < 8; c++) m = mx[c] > m ? mx[c] : m;
    for (; j < n; j++) m = s[j] > m ? s[j] : m;
    const __m256 mb = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mb));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (j < n) { /* the tail in its lanes, +0 in the others (exact) */
        float t[8] = {0};
        for (int c = 0; c < n - j; c++) t[c] = s[j + c];
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(t), mb)),
                                       _mm256_cmp_ps(_mm256_set_ps(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_ps((float)(n - j)), _CMP_LT_OQ));
        _mm256_storeu_ps(t, e);
        for (int c = 0; c < n - j; c++) s[j + c] = t[c];
        sum = _mm256_add_ps(sum, e);
    }
    return _mm_cvtss_f32(red4(sum, sum, sum, sum));
}

/* NQ queries x NV vectors of 8 dimensions, keys [0, nk) */
ALWAYS_INLINE void pv_block(const float *P, int64_t ldp, const int NQ, const float *V, int64_t ldv, int nk,
                            const int NV, float *O, int hd) {
    __m256 acc[3][4];
    #pragma GCC unroll 4
    for (int i = 0; i < NQ; i++)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[i][v] = _mm256_loadu_ps(O + (size_t)i * hd + 8 * v);
    for (int j = 0; j < nk; j++) {
        __m256 vv[4];
        if (NV == 4 && j + KA_PF < nk) _mm_prefetch((const char *)(V + (size_t)(j + KA_PF) * ldv), _MM_HINT_T0), _mm_prefetch((const char *)(V + (size_t)(j + KA_PF) * ldv + 16), _MM_HINT_T0);
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) vv[v] = _mm256_loadu_ps(V + (size_t)j * ldv + 8 * v);
        #pragma GCC unroll 4
        for (int i = 0; i < NQ; i++) {
            const __m256 p = _mm256_broadcast_ss(P + (size_t)i * ldp + j);
            #pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[i][v] = _mm256_fmadd_ps(p, vv[v], acc[i][v]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < NQ; i++)
        #pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(O + (size_t)i * hd + 8 * v, acc[i][v]);
}

ALWAYS_INLINE void pv_rows(const float *P, int64_t ldp, const int NQ, const float *V, int64_t ldv, int nk, int hd,
                           float *O) {
    int d = 0;
    for (; d + 32 <= hd; d += 32) pv_block(P, ldp, NQ, V + d, ldv, nk, 4, O + d, hd);
    for (; d < hd; d += 8) pv_block(P, ldp, NQ, V + d, ldv, nk, 1, O + d, hd);
}

void df_ka_pv_avx2(const float *P, int64_t ldp, int nq, const float *V, int64_t ldv, int nk, int hd, float *O) {
    if (hd % 8) { df_ka_pv_scalar(P, ldp, nq, V, ldv, nk, hd, O); return; }
    int i = 0;
    for (; i + 3 <= nq; i += 3) pv_rows(P + (size_t)i * ldp, ldp, 3, V, ldv, nk, hd, O + (size_t)i * hd);
    if (nq - i == 2) pv_rows(P + (size_t)i * ldp, ldp, 2, V, ldv, nk, hd, O + (size_t)i * hd);
    else if (nq - i == 1) pv_rows(P + (size_t)i * ldp, ldp, 1, V, ldv, nk, hd, O + (size_t)i * hd);
}
