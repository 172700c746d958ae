/* attn_kernels_scalar.c - the reference attention kernels: attn_kernels.h's
 * definition in plain C. Every multiply-add is an explicit fmaf and every
 * other operation a statement of its own (no contraction can change a
 * rounding), so these give the SIMD kernels' bits. */
#include "backend/cpu/attn_kernels.h"

#include <math.h>
#include <string.h>

#define KA_LOG2E 1.44269504088896341f
#define KA_MAGIC 12582912.0f /* 1.5 * 2^23: x + MAGIC rounds x to an integer (|x| < 2^22) */
#define KA_LN2_HI 0.693359375f
#define KA_LN2_LO (-2.12194440e-4f)

float df_ka_exp(float x) {
    const int under = x < -87.0f;
    x = x > -87.0f ? x : -87.0f; /* _mm256_max_ps(x, -87) */
    const float t = fmaf(x, KA_LOG2E, KA_MAGIC);
    const float n = t - KA_MAGIC;
    float r = fmaf(-n, KA_LN2_HI, x);
    r = fmaf(-n, KA_LN2_LO, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float r2 = r * r;
    float y = fmaf(p, r2, r);
    y = y + 1.0f;
    union { uint32_t u; float f; } e = {(uint32_t)((int32_t)n + 127) << 23};
    y = y * e.f;
    return under ? 0.0f : y;
}

static float tree8(const float *l) {
    const float a = l[0] + l[1], b = l[2] + l[3], c = l[4] + l[5], d = l[6] + l[7];
    const float lo = a + b, hi = c + d;
    return lo + hi;
}

void df_ka_scores_scalar(const float *Q, int nq, const float *K, int64_t ldk, int nk, int hd, float scale, float *S,
                         int64_t lds) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++) {
            const float *q = Q + (size_t)i * hd, *k = K + (size_t)j * ldk;
            float l[8] = {0};
            for (int d = 0; d < hd; d++) l[d & 7] = fmaf(q[d], k[d], l[d & 7]);
            const float s = tree8(l);
            S[(size_t)i * lds + j] = s * scale;
        }
}

float df_ka_softmax_scalar(float *s, int n) {
    float m = s[0];
    for (int j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
    float l[8] = {0};
    for (int j = 0; j < n; j++) {
        const float x = s[j] - m;
        s[j] = df_ka_exp(x);
        l[j & 7] = l[j & 7] + s[j];
    }
    return tree8(l);
}

void df_ka_pv_scalar(const float *P, int64_t ldp, int nq, const float *V, int64_t ldv, int nk, int hd, float *O) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++) {
            const float p = P[(size_t)i * ldp + j], *v = V + (size_t)j * ldv;
            float *o = O + (size_t)i * hd;
            for (int d = 0; d < hd; d++) o[d] = fmaf(p, v[d], o[d]);
        }
}
