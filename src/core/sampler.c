/* sampler.c - next-token choice from logits: greedy (lowest id wins ties)
 * or temperature / top-k / top-p / min-p sampling, applied in that order
 * (as transformers' logits warpers), with a seeded xoshiro256** generator:
 * the same seed and logits give the same tokens. */
#include "core/core.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
void df_rng_seed(df_rng *r, uint64_t seed) {
    r->seed = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
uint64_t df_rng_next(df_rng *r) {
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return res;
}
double df_rng_uniform(df_rng *r) { return (double)(df_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Lowest index of the maximum. Two passes: the maximum with 8 independent
 * running maxima (no loop-carried dependency on an index), then the first
 * position holding it; NaNs are skipped as the one-pass version did. */
int df_argmax(const float *x, int n) {
    if (n <= 0) return 0;
    float m[8];
    for (int k = 0; k < 8; k++) m[k] = x[0];
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    float mx = m[0];
    for (int k = 1; k < 8; k++) mx = m[k] > mx ? m[k] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (i = 0; i < n; i++)
        if (x[i] == mx) return i;
    return 0;
}

/* Lowest index of the maximum among the allowed tokens (bitset); -1 if none
 * is allowed. NaNs are skipped. */
static int argmax_allowed(const float *x, int n, const uint32_t *allow) {
    int best = -1;
    float mx = 0;
    for (int w = 0; w * 32 < n; w++) {
        uint32_t m = allow[w];
        while (m) {
            int i = w * 32 + __builtin_ctz(m);
            m &= m - 1;
            if (i >= n) break;
            if (x[i] != x[i]) { if (best < 0) best = i; continue; }
            if (best < 0 || x[best] != x[best] || x[i] > mx) { best = i; mx = x[i]; }
        }
    }
    return best;
}

typedef struct { float p; int id; } cand;
static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

int df_sampling_check(const df_sampling *sp, char *err, size_t errlen) {
    if (!sp) return 0;
    if (!isfinite(sp->temperature))
        return df_err(err, errlen, DF_EINPUT, "sampling temperature: expected a finite number (<= 0: greedy), got %g", (double)sp->temperature);
    if (!(sp->top_p >= 0 && sp->top_p <= 1))
        return df_err(err, errlen, DF_EINPUT, "sampling top_p: expected 0 < P <= 1 (0 or 1: off), got %g", (double)sp->top_p);
    if (!(sp->min_p >= 0 && sp->min_p <= 1))
        return df_err(err, errlen, DF_EINPUT, "sampling min_p: expected 0 <= P <= 1, got %g", (double)sp->min_p);
    if (sp->top_k < 0) return df_err(err, errlen, DF_EINPUT, "sampling top_k: expected >= 0 (0: off), got %d", sp->top_k);
    return 0;
}

/* Sampling: logits / temperature, sorted; top-k; softmax relative to the
 * maximum; top-p; min-p; one draw. A NaN logit counts as -inf. When the
 * scaled maximum overflows (a temperature so small that logit / T is
 * infinite) the draw is the limit T -> 0: greedy. */
int df_sample(const float *logits, int n, const df_sampling *sp, df_rng *rng, void *work) {
    if (sp && df_sampling_check(sp, NULL, 0)) return DF_EINPUT;
    if (sp && sp->seed && sp->seed != rng->seed) df_rng_seed(rng, sp->seed);
    const uint32_t *al = sp ? sp->allow : NULL;
    if (al && argmax_allowed(logits, n, al) < 0) return DF_EINPUT; /* no token allowed */
    if (!sp || sp->temperature <= 0) return al ? argmax_allowed(logits, n, al) : df_argmax(logits, n);
    cand *c = work; /* n entries */
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        int ok = !al || (al[i >> 5] >> (i & 31) & 1);
        c[i].p = !ok || isnan(logits[i]) ? -INFINITY : logits[i] / sp->temperature;
        c[i].id = i;
        if (c[i].p > mx) mx = c[i].p;
    }
    if (!isfinite(mx)) return al ? argmax_allowed(logits, n, al) : df_argmax(logits, n);
    int m = n;
    qsort(c, (size_t)n, sizeof *c, cmp_cand);
    while (m > 1 && c[m - 1].p == -INFINITY) m--; /* masked and NaN logits are never drawn */
    if (sp->top_k > 0 && sp->top_k < m) m = sp->top_k;
    double sum = 0;
    for (int i = 0; i < m; i++) { c[i].p = expf(c[i].p - mx); sum += c[i].p; }
    for (int i = 0; i < m; i++) c[i].p = (float)(c[i].p / sum);
    if (sp->top_p > 0 && sp->top_p < 1) {
        double acc = 0;
        int keep = m;
        for (int i = 0; i < m; i++) { acc += c[i].p; if (acc >= sp->top_p) { keep = i + 1; break; } }
        m = keep;
    }
    if (sp->min_p > 0) {
        float thr = c[0].p * sp->min_p;
        int keep = 1;
        while (keep < m && c[keep].p >= thr) keep++;
        m = keep;
    }
    sum = 0;
    for (int i = 0; i < m; i++) sum += c[i].p;
    double u = df_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < m; i++) { acc += c[i].p; if (u < acc) return c[i].id; }
    return c[m - 1].id;
}
