/* test_backend_attn.c - the bit contract of the CPU backend's GQA attention
 * (src/backend/cpu/attn.c, attn_kernels.h) and its accuracy.
 *
 *  1. Batched == one position at a time, bit for bit: n = 1..13 positions
 *     in one call against n one-position calls (a speculative verify pass
 *     against plain decode steps), for grouped-query ratios 1, 3, 4, 8,
 *     head_dim 64 and 128 (and 36: the scalar fallback), contexts that are
 *     no multiple of the tiles, the key chunk or the SIMD width, on the
 *     pool's 2 threads and serially (1 thread), and under every tiling the
 *     thread count can choose (positions per unit, splits of a group).
 *  2. The same bits on every ISA: the op on the scalar kernels equals the
 *     op on AVX2 (where the CPU has it), and so does each kernel.
 *  3. Accuracy: the op against a double-precision loop (normwise relative
 *     bound), the exp against libm's double exp (relative bound), and
 *     large scores (softmax of a wide range) stay finite and accurate.
 *  4. MLA on the same kernels: against double, scalar vs AVX2 and one
 *     position (decode path) vs a batch within rounding (its products use
 *     the ISA's product kernels).
 *
 *   test_backend_attn [-v] */
#include "backend/cpu/attn_kernels.h"
#include "backend/cpu/cpu.h"

#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int verbose;
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}
static float *rnd(size_t n, float scale) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

typedef struct {
    int n, pos0, NH, KV, hd;
    float scale;
    float *q, *kv;
} shape;

static shape mk(int n, int pos0, int NH, int KV, int hd, float qscale) {
    shape s = {n, pos0, NH, KV, hd, 1.0f / sqrtf((float)hd), NULL, NULL};
    s.q = rnd((size_t)n * NH * hd, qscale);
    s.kv = rnd((size_t)(pos0 + n) * 2 * KV * hd, 1);
    return s;
}
static void unmk(shape *s) { free(s->q), free(s->kv); }
static size_t outn(const shape *s) { return (size_t)s->n * s->NH * s->hd; }

/* one call of n positions (qt, nsub <= 0: the automatic tiling) */
static float *batched(const shape *s, int qt, int nsub) {
    float *o = calloc(outn(s), sizeof(float));
    df_attn_gqa_args a = {(const df_act *)s->q, (const df_act *)s->kv, (df_act *)o, s->n, s->pos0, s->NH, s->KV, s->hd, s->scale};
    df_cpu_attn_gqa_tiled(&a, qt, nsub);
    return o;
}
/* n calls of one position */
static float *steps(const shape *s) {
    const size_t qs = (size_t)s->NH * s->hd;
    float *o = calloc(outn(s), sizeof(float));
    for (int t = 0; t < s->n; t++) {
        df_attn_gqa_args a = {(const df_act *)(s->q + t * qs), (const df_act *)s->kv, (df_act *)(o + t * qs), 1, s->pos0 + t, s->NH, s->KV, s->hd, s->scale};
        df_cpu_attn_gqa(&a);
    }
    return o;
}

static int same_bits(const float *a, const float *b, size_t n, size_t *at) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float))) { *at = i; return 0; }
    return 1;
}

/* 1: the batched path against one-position steps, every tiling, 2 threads and serial */
static void test_batched_vs_steps(void) {
    static const int RATIO[] = {1, 3, 4, 8}, HD[] = {64, 128, 36}, POS0[] = {0, 37, 203};
    int cases = 0;
    for (int ri = 0; ri < 4; ri++)
        for (int hi = 0; hi < 3; hi++)
            for (int pi = 0; pi < 3; pi++)
                for (int n = 1; n <= 13; n++) {
                    if (HD[hi] == 36 && (n % 4 != 1 || pi == 2)) continue; /* the scalar fallback: fewer cases */
                    const int KV = ri == 3 ? 1 : 2, NH = KV * RATIO[ri];
                    shape s = mk(n, POS0[pi], NH, KV, HD[hi], 1.0f);
                    float *ref = steps(&s);
                    for (int serial = 0; serial < 2; serial++) {
                        df_pool_serial(serial);
                        static const int QT[] = {0, 1, 2, 5, 16}, NSUB[] = {0, 1, 2, 8};
                        for (int qi = 0; qi < 5; qi++)
                            for (int si = 0; si < 4; si++) {
                                if ((qi == 0) != (si == 0)) continue;
                                float *o = batched(&s, QT[qi], NSUB[si]);
                                size_t at = 0;
                                const int ok = same_bits(o, ref, outn(&s), &at);
                                CHECK(ok, "GQA n=%d pos0=%d heads %d/%d hd=%d tiling qt=%d nsub=%d %s: batched differs from one-position steps at %zu (%.9g vs %.9g)",
                                      n, s.pos0, NH, KV, s.hd, QT[qi], NSUB[si], serial ? "1 thread" : "2 threads", at, o[at], ref[at]);
                                free(o);
                                cases++;
                            }
                    }
                    df_pool_serial(0);
                    /* one position: serial and pooled steps agree */
                    df_pool_serial(1);
                    float *r1 = steps(&s);
                    df_pool_serial(0);
                    size_t at = 0;
                    CHECK(same_bits(r1, ref, outn(&s), &at), "GQA n=%d pos0=%d heads %d/%d hd=%d: one-position steps differ between 1 and 2 threads at %zu", n, s.pos0, NH, KV, s.hd, at);
                    free(r1), free(ref);
                    unmk(&s);
                }
    if (verbose) printf("ok   batched == one-position steps: %d cases\n", cases);
}

/* 1b: long caches (>= 512 keys), few positions, KV heads not a multiple of the threads: the automatic path
 * splits keys, rows and dimensions over the pool in three rounds (attn.c gqa_long); it must give the bits of
 * the unit path (a forced tiling) and of one-position steps (which take it too), on 2 threads and serially */
static void test_long_cache(void) {
    static const int KVS[] = {3, 1}, RATIO[] = {3, 1}, HD[] = {64, 36}, POS0[] = {600, 1100}, NS[] = {1, 2, 6, 13};
    int cases = 0;
    for (int ki = 0; ki < 2; ki++)
        for (int ri = 0; ri < 2; ri++)
            for (int hi = 0; hi < 2; hi++)
                for (int pi = 0; pi < 2; pi++)
                    for (int ni = 0; ni < 4; ni++) {
                        if (HD[hi] == 36 && ni % 2) continue;
                        const int KV = KVS[ki], NH = KV * RATIO[ri], n = NS[ni];
                        shape s = mk(n, POS0[pi], NH, KV, HD[hi], 1.0f);
                        float *ref = batched(&s, 1, 1); /* the unit path: one position per tile, one head per unit */
                        for (int serial = 0; serial < 2; serial++) {
                            df_pool_serial(serial);
                            float *o = batched(&s, 0, 0), *st = steps(&s);
                            size_t at = 0;
                            CHECK(same_bits(o, ref, outn(&s), &at), "GQA long n=%d pos0=%d heads %d/%d hd=%d %s: automatic path differs from units at %zu (%.9g vs %.9g)",
                                  n, s.pos0, NH, KV, s.hd, serial ? "1 thread" : "2 threads", at, o[at], ref[at]);
                            CHECK(same_bits(st, ref, outn(&s), &at), "GQA long n=%d pos0=%d heads %d/%d hd=%d %s: one-position steps differ from units at %zu",
                                  n, s.pos0, NH, KV, s.hd, serial ? "1 thread" : "2 threads", at);
                            free(o), free(st);
                            cases++;
                        }
                        df_pool_serial(0);
                        free(ref);
                        unmk(&s);
                    }
    if (verbose) printf("ok   long caches: the three-round path == units: %d cases\n", cases);
}

/* 2: every ISA the same bits (op and kernels) */
static void test_isa(void) {
    if (df_isa() == DF_ISA_SCALAR) { printf("skip ISA comparison: no SIMD ISA on this CPU\n"); return; }
    const int best = df_isa();
    static const int HD[] = {64, 128, 36, 8};
    for (int hi = 0; hi < 4; hi++)
        for (int n = 1; n <= 9; n += 4) {
            shape s = mk(n, 45 + 8 * hi, 12, 3, HD[hi], 1.0f);
            df_set_isa(DF_ISA_SCALAR);
            float *os = batched(&s, 0, 0);
            df_set_isa(best);
            float *ob = batched(&s, 0, 0);
            size_t at = 0;
            CHECK(same_bits(os, ob, outn(&s), &at), "GQA n=%d hd=%d: %s differs from scalar at %zu (%.9g vs %.9g)", n, s.hd, df_isa_name(best), at, ob[at], os[at]);
            free(os), free(ob);
            unmk(&s);
        }
    /* the kernels one by one, odd sizes */
    for (int hd = 8; hd <= 136; hd += 16)
        for (int nq = 1; nq <= 7; nq++) {
            const int nk = 1 + (hd * 7 + nq * 13) % 71;
            float *Q = rnd((size_t)nq * hd, 2), *K = rnd((size_t)nk * (hd + 3), 2), *S1 = rnd((size_t)nq * nk, 1), *S2 = malloc((size_t)nq * nk * 4);
            memcpy(S2, S1, (size_t)nq * nk * 4);
            df_ka_scores_scalar(Q, nq, K, hd + 3, nk, hd, 0.3f, S1, nk);
            df_ka_scores_avx2(Q, nq, K, hd + 3, nk, hd, 0.3f, S2, nk);
            size_t at = 0;
            CHECK(same_bits(S1, S2, (size_t)nq * nk, &at), "scores hd=%d nq=%d nk=%d: avx2 differs from scalar at %zu", hd, nq, nk, at);
            float *P2 = malloc((size_t)nq * nk * 4);
            memcpy(P2, S1, (size_t)nq * nk * 4);
            for (int i = 0; i < nq; i++) {
                const int len = nk - i % nk;
                const float a = df_ka_softmax_scalar(S1 + (size_t)i * nk, len), b = df_ka_softmax_avx2(P2 + (size_t)i * nk, len);
                CHECK(!memcmp(&a, &b, 4), "softmax len=%d: sum %.9g (avx2) vs %.9g (scalar)", len, b, a);
            }
            CHECK(same_bits(S1, P2, (size_t)nq * nk, &at), "softmax hd=%d nq=%d nk=%d: avx2 differs from scalar at %zu", hd, nq, nk, at);
            float *V = rnd((size_t)nk * (hd + 5), 1), *O1 = rnd((size_t)nq * hd, 1), *O2 = malloc((size_t)nq * hd * 4);
            memcpy(O2, O1, (size_t)nq * hd * 4);
            df_ka_pv_scalar(S1, nk, nq, V, hd + 5, nk, hd, O1);
            df_ka_pv_avx2(S1, nk, nq, V, hd + 5, nk, hd, O2);
            CHECK(same_bits(O1, O2, (size_t)nq * hd, &at), "pv hd=%d nq=%d nk=%d: avx2 differs from scalar at %zu", hd, nq, nk, at);
            free(Q), free(K), free(S1), free(S2), free(P2), free(V), free(O1), free(O2);
        }
    if (verbose) printf("ok   scalar == %s, op and kernels\n", df_isa_name(best));
}

/* 3: against double precision */
static double rel_err(const shape *s, const float *o) {
    const int NH = s->NH, KV = s->KV, hd = s->hd, grp = NH / KV;
    const size_t kdim = (size_t)KV * hd;
    double err = 0, mx = 0;
    for (int t = 0; t < s->n; t++)
        for (int h = 0; h < NH; h++) {
            const int len = s->pos0 + t + 1;
            const float *q = s->q + ((size_t)t * NH + h) * hd;
            double *sc = malloc((size_t)len * sizeof(double)), m = -INFINITY, sum = 0;
            for (int j = 0; j < len; j++) {
                const float *k = s->kv + (size_t)j * 2 * kdim + (size_t)(h / grp) * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)q[i] * k[i];
                sc[j] = d * s->scale;
                if (sc[j] > m) m = sc[j];
            }
            for (int j = 0; j < len; j++) sc[j] = exp(sc[j] - m), sum += sc[j];
            for (int i = 0; i < hd; i++) {
                double r = 0;
                for (int j = 0; j < len; j++) r += sc[j] * s->kv[(size_t)j * 2 * kdim + kdim + (size_t)(h / grp) * hd + i];
                r /= sum;
                const double e = fabs(r - o[((size_t)t * NH + h) * hd + i]);
                if (e > err) err = e;
                if (fabs(r) > mx) mx = fabs(r);
            }
            free(sc);
        }
    return err / mx;
}

static void test_accuracy(void) {
    /* exp: relative error against double exp over [-87, 0] */
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        const float x = -87.0f * (float)i / 200000.0f;
        const double e = fabs((double)df_ka_exp(x) - exp((double)x)) / exp((double)x);
        if (e > worst) worst = e;
    }
    CHECK(worst < 3e-7, "exp: max relative error %.3g over [-87, 0] (bound 3e-7)", worst);
    CHECK(df_ka_exp(-87.5f) == 0.0f && df_ka_exp(-1e30f) == 0.0f && df_ka_exp(0.0f) == 1.0f, "exp: 0 below -87, exp(0) = 1");
    if (verbose) printf("ok   exp: max relative error %.3g\n", worst);
    /* the op, normal and wide scores (q x 1, x 30: softmax over a range of hundreds) */
    static const float QS[] = {1.0f, 30.0f};
    for (int qi = 0; qi < 2; qi++)
        for (int hi = 0; hi < 2; hi++) {
            shape s = mk(5, 1000, 9, 3, hi ? 128 : 64, QS[qi]);
            float *o = batched(&s, 0, 0);
            const double e = rel_err(&s, o);
            CHECK(e < 1e-5, "GQA hd=%d q x %g: normwise relative error %.3g against double (bound 1e-5)", s.hd, QS[qi], e);
            if (verbose) printf("ok   GQA hd=%d q x %g, context 1005: normwise relative error %.3g against double\n", s.hd, QS[qi], e);
            free(o);
            unmk(&s);
        }
}

/* 4: MLA (attn_mla, F32 kv_b) on the same attention kernels: against double;
 * scalar vs AVX2 and one position (the decode path, which reads the stored
 * weights directly) vs a batch within rounding. */
static void mla_ref(const float *q, const float *cache, const float *kvb, int n, int pos0, int NH, int nope, int rope, int R, int vd,
                    float scale, double *out) {
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    double *ql = malloc((size_t)R * sizeof(double)), *ol = malloc((size_t)R * sizeof(double)), *sc = malloc((size_t)(pos0 + n) * sizeof(double));
    for (int t = 0; t < n; t++)
        for (int h = 0; h < NH; h++) {
            const float *qq = q + ((size_t)t * NH + h) * qh;
            const float *w = kvb + (size_t)h * (nope + vd) * R;
            const int len = pos0 + t + 1;
            for (int c = 0; c < R; c++) {
                ql[c] = 0;
                for (int d = 0; d < nope; d++) ql[c] += (double)w[(size_t)d * R + c] * qq[d];
            }
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < len; j++) {
                const float *cj = cache + (size_t)j * cdim;
                double x = 0;
                for (int c = 0; c < R; c++) x += ql[c] * cj[c];
                for (int r = 0; r < rope; r++) x += (double)qq[nope + r] * cj[R + r];
                sc[j] = x * scale;
                if (sc[j] > m) m = sc[j];
            }
            for (int c = 0; c < R; c++) ol[c] = 0;
            for (int j = 0; j < len; j++) {
                const double e = exp(sc[j] - m);
                sum += e;
                for (int c = 0; c < R; c++) ol[c] += e * cache[(size_t)j * cdim + c];
            }
            for (int i = 0; i < vd; i++) {
                double o = 0;
                for (int c = 0; c < R; c++) o += (double)w[(size_t)(nope + i) * R + c] * (ol[c] / sum);
                out[((size_t)t * NH + h) * vd + i] = o;
            }
        }
    free(ql), free(ol), free(sc);
}

static void test_mla(void) {
    const int NH = 4, nope = 16, rope = 8, vd = 12;
    static const int RS[] = {64, 40};
    for (int ri = 0; ri < 2; ri++) {
        const int R = RS[ri], n = 7, pos0 = 30, T = pos0 + n;
        float *kvbd = rnd((size_t)NH * (nope + vd) * R, 0.3f), *q = rnd((size_t)n * NH * (nope + rope), 1), *cache = rnd((size_t)T * (R + rope), 1);
        df_weight kvb = {0}, none = {0};
        kvb.fmt = DF_W_F32, kvb.rows = (int64_t)NH * (nope + vd), kvb.cols = R, kvb.data = (const uint8_t *)kvbd, kvb.row_bytes = (size_t)R * 4;
        const size_t on = (size_t)n * NH * vd;
        float *o[3];
        for (int k = 0; k < 3; k++) o[k] = calloc(on, sizeof(float));
        const int best = df_isa();
        for (int k = 0; k < 2; k++) {
            df_set_isa(k ? best : DF_ISA_SCALAR);
            df_attn_mla_args a = {(const df_act *)q, (const df_act *)cache, (df_act *)o[k], &kvb, &none, &none, n, pos0, NH, nope, rope, R, vd, 0.2f};
            df_cpu_attn_mla(&a);
        }
        df_set_isa(best);
        const size_t qs = (size_t)NH * (nope + rope), os = (size_t)NH * vd;
        for (int t = 0; t < n; t++) {
            df_attn_mla_args a = {(const df_act *)(q + t * qs), (const df_act *)cache, (df_act *)(o[2] + t * os), &kvb, &none, &none, 1, pos0 + t, NH, nope, rope, R, vd, 0.2f};
            df_cpu_attn_mla(&a);
        }
        double *d = malloc(on * sizeof(double)), err = 0, err1 = 0, errs = 0, mx = 0;
        mla_ref(q, cache, kvbd, n, pos0, NH, nope, rope, R, vd, 0.2f, d);
        for (size_t i = 0; i < on; i++) {
            if (fabs(d[i]) > mx) mx = fabs(d[i]);
            if (fabs(o[1][i] - d[i]) > err) err = fabs(o[1][i] - d[i]);
            if (fabs((double)o[2][i] - o[1][i]) > err1) err1 = fabs((double)o[2][i] - o[1][i]);
            if (fabs((double)o[0][i] - o[1][i]) > errs) errs = fabs((double)o[0][i] - o[1][i]);
        }
        /* the absorbed query and the output projection use the ISA's product kernels: equal within rounding */
        CHECK(errs <= 1e-5 * mx, "MLA kv_lora=%d: %s differs from scalar by %.3g (normwise, bound 1e-5)", R, df_isa_name(best), errs / mx);
        CHECK(err <= 1e-5 * mx, "MLA kv_lora=%d: normwise relative error %.3g against double (bound 1e-5)", R, err / mx);
        CHECK(err1 <= 1e-5 * mx, "MLA kv_lora=%d: one position at a time differs from the batch by %.3g (normwise, bound 1e-5)", R, err1 / mx);
        if (verbose) printf("ok   MLA kv_lora=%d: scalar vs %s %.3g; against double %.3g; one position vs batch %.3g\n", R, df_isa_name(best), errs / mx, err / mx, err1 / mx);
        for (int k = 0; k < 3; k++) free(o[k]);
        free(d), free(kvbd), free(q), free(cache);
    }
}

int main(int argc, char **argv) {
    verbose = argc > 1 && !strcmp(argv[1], "-v");
    df_pool_init(2);
    test_batched_vs_steps();
    test_long_cache();
    test_isa();
    test_accuracy();
    test_mla();
    printf("test_backend_attn: %s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
