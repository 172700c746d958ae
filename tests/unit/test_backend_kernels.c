/* test_backend_kernels.c - every ISA's kernels against the scalar reference
 * on random data (odd lengths included), and the exact conversions against
 * independent definitions. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "backend/ggml_quant.h"
#include "util/util.h"
#include "test_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float frand(void) { return (float)((int)(rnd() % 20001) - 10000) / 10000.0f; }

static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }

static void close_enough(const char *what, int isa, int64_t n, float got, float ref, float mag) {
    CHECK(fabsf(got - ref) <= 1e-5f * mag + 1e-6f, "%s isa=%s n=%lld got %.9g ref %.9g", what, df_isa_name(isa), (long long)n, got, ref);
}

/* ---- MXFP4 ---------------------------------------------------------------
 * The reference decode is written from the format's definition (OCP MX:
 * E2M1 = sign, 2 exponent bits (bias 1), 1 mantissa bit; E8M0 = 2^(s-127),
 * 255 NaN), not from the kernels' tables. */
static float ref_e2m1(int code) {
    int e = (code >> 1) & 3, m = code & 1;
    float v = e == 0 ? 0.5f * (float)m : ldexpf(1.0f + 0.5f * (float)m, e - 1);
    return (code & 8) ? -v : v;
}
static float ref_mx(int code, int s) { return s == 255 ? NAN : ldexpf(ref_e2m1(code), s - 127); }
static int same_f32(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4), memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}
static int nib(const uint8_t *p, int64_t i) { return (p[i / 2] >> (4 * (i % 2))) & 15; }

typedef float (*mx_dot_fn)(const uint8_t *, const uint8_t *, const float *, int64_t);
typedef void (*mx_deq_fn)(const uint8_t *, const uint8_t *, float *, int64_t);
static const mx_dot_fn mx_dot[3] = {df_k_dot_mxfp4_scalar, df_k_dot_mxfp4_avx2, df_k_dot_mxfp4_avx512};
static const mx_deq_fn mx_deq[3] = {df_k_deq_mxfp4_scalar, df_k_deq_mxfp4_avx2, df_k_deq_mxfp4_avx512};

static void test_mxfp4(void) {
    /* the table of values and the E8M0 decode */
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        CHECK(same_f32(df_e2m1_lut[c], ref_e2m1(c)), "e2m1 code %d: %g", c, df_e2m1_lut[c]);
        CHECK(fabsf(ref_e2m1(c)) == e2m1[c & 7] && (signbit(ref_e2m1(c)) != 0) == (c >= 8), "ref e2m1 code %d", c);
    }
    CHECK(df_e8m0_to_f32(127) == 1.0f && df_e8m0_to_f32(0) == ldexpf(1, -127) && df_e8m0_to_f32(254) == ldexpf(1, 127) &&
          df_e8m0_to_f32(1) == ldexpf(1, -126) && isnan(df_e8m0_to_f32(255)), "e8m0");
    const int best = (df_set_isa(-1), df_isa());
    /* dequantization: every byte value (so all 16 codes in both nibbles) and
     * every scale 0..255 (255: NaN), bit-exact to the reference, on every ISA */
    {
        enum { G = 257, N = 32 * G };
        uint8_t *p = malloc(N / 2), sc[G];
        float *out = malloc(N * sizeof(float));
        for (int i = 0; i < N / 2; i++) p[i] = (uint8_t)(i < 256 ? (uint32_t)i : rnd());
        for (int g = 0; g < G; g++) sc[g] = (uint8_t)(g < 256 ? (uint32_t)(255 - g) : rnd() % 255);
        for (int isa = 0; isa <= best; isa++) {
            for (int64_t i = 0; i < N; i++) out[i] = 12345.0f;
            mx_deq[isa](p, sc, out, N);
            int bad = 0;
            for (int64_t i = 0; i < N && bad < 5; i++)
                if (!same_f32(out[i], ref_mx(nib(p, i), sc[i / 32]))) {
                    bad++;
                    CHECK(0, "mxfp4 deq isa=%s i=%lld code %d scale %d: got %g want %g", df_isa_name(isa), (long long)i, nib(p, i), sc[i / 32], out[i], ref_mx(nib(p, i), sc[i / 32]));
                }
        }
        free(p), free(out);
    }
    /* dot products: every ISA against the scalar kernel and both against a
     * double sum of the reference values, odd multiples of 32 */
    const int64_t ns[] = {32, 96, 160, 32 * 33, 32 * 225};
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
        const int64_t n = ns[k];
        uint8_t *p = malloc((size_t)n / 2), *sc = malloc((size_t)n / 32);
        float *x = malloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n / 2; i++) p[i] = (uint8_t)rnd();
        for (int64_t i = 0; i < n; i++) x[i] = frand();
        for (int lo = 0; lo < 2; lo++) {
            /* lo: scales 0..239 (tiny and huge blocks mixed, no overflow); else 110..144 */
            for (int64_t g = 0; g < n / 32; g++) sc[g] = (uint8_t)(lo ? rnd() % 240 : 110 + rnd() % 35);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) {
                double v = (double)ref_mx(nib(p, i), sc[i / 32]) * x[i];
                ref += v, mag += fabs(v);
            }
            const float s0 = mx_dot[0](p, sc, x, n);
            CHECK(fabs(s0 - ref) <= 1e-5 * mag + 1e-30, "mxfp4 dot scalar n=%lld got %.9g ref %.9g", (long long)n, s0, ref);
            for (int isa = 1; isa <= best; isa++) {
                const float s1 = mx_dot[isa](p, sc, x, n);
                CHECK(fabs(s1 - ref) <= 1e-5 * mag + 1e-30 && fabsf(s1 - s0) <= 1e-5f * (float)mag + 1e-30f, "mxfp4 dot isa=%s n=%lld got %.9g scalar %.9g ref %.9g",
                      df_isa_name(isa), (long long)n, s1, s0, ref);
            }
        }
        /* scale 255 (NaN) in one block: NaN on every ISA; scale 254 with a large
         * block: +inf (the true value exceeds FLT_MAX) on every ISA */
        for (int64_t g = 0; g < n / 32; g++) sc[g] = 127;
        sc[n / 64] = 255;
        for (int isa = 0; isa <= best; isa++) CHECK(isnan(mx_dot[isa](p, sc, x, n)), "mxfp4 dot scale 255 isa=%s n=%lld: not NaN", df_isa_name(isa), (long long)n);
        sc[n / 64] = 254;
        for (int64_t i = n / 64 * 32; i < n / 64 * 32 + 32; i++) x[i] = 1.0f;
        for (int64_t i = n / 64 * 16; i < n / 64 * 16 + 16; i++) p[i] = 0x77; /* 6.0, 6.0 */
        for (int isa = 0; isa <= best; isa++) {
            float s = mx_dot[isa](p, sc, x, n);
            CHECK(isinf(s) && s > 0, "mxfp4 dot scale 254 isa=%s n=%lld: got %g, want +inf", df_isa_name(isa), (long long)n, s);
        }
        free(p), free(sc), free(x);
    }
    /* through df_weight: decode (n = 1: df_dot_row rows), prefill (n = 3, 17:
     * dequantized tiles), the transposed product, rows x cols odd multiples of 32 */
    {
        enum { R = 96, C = 160, NMAX = 17 };
        uint8_t *p = malloc(R * C / 2), sc[R * C / 32];
        float *X = malloc(NMAX * C * sizeof(float)), *Y = malloc(NMAX * R * sizeof(float)), row[C], yt[C];
        for (int i = 0; i < R * C / 2; i++) p[i] = (uint8_t)rnd();
        for (int i = 0; i < R * C / 32; i++) sc[i] = (uint8_t)(100 + rnd() % 50);
        for (int i = 0; i < NMAX * C; i++) X[i] = frand();
        df_weight W = {.fmt = DF_W_MXFP4, .rows = R, .cols = C, .data = p, .row_bytes = C / 2, .scale = sc, .scale_dtype = DF_SCALE_E8M0,
                       .blk_r = 1, .blk_c = 32, .scale_cols = C / 32};
        CHECK(df_weight_scale_bytes(&W) == R * C / 32 && df_weight_bytes(&W) == R * C / 2 + R * C / 32, "mxfp4 bytes %lld", (long long)df_weight_bytes(&W));
        CHECK(!strcmp(df_wfmt_name(&W), "MXFP4"), "mxfp4 name %s", df_wfmt_name(&W));
        for (int isa = 0; isa <= best; isa++) {
            df_set_isa(isa);
            for (int r = 0; r < R; r++) {
                df_dequant_row(&W, r, row);
                for (int c = 0; c < C; c++)
                    if (!same_f32(row[c], ref_mx(nib(p + r * C / 2, c), sc[r * C / 32 + c / 32]))) { CHECK(0, "mxfp4 dequant_row isa=%s r=%d c=%d", df_isa_name(isa), r, c); break; }
            }
            const int nt[] = {1, 3, 17};
            for (int k = 0; k < 3; k++) {
                const df_mv_job j = {&W, (const df_act *)(const void *)X, (df_act *)(void *)Y}; /* CPU backend memory is host memory */
                df_cpu_matmul_batch(&j, 1, nt[k]);
                for (int t = 0; t < nt[k]; t++)
                    for (int r = 0; r < R; r++) {
                        double ref = 0, mag = 0;
                        for (int c = 0; c < C; c++) {
                            double v = (double)ref_mx(nib(p + r * C / 2, c), sc[r * C / 32 + c / 32]) * X[t * C + c];
                            ref += v, mag += fabs(v);
                        }
                        float got = Y[t * R + r];
                        if (!(fabs(got - ref) <= 1e-5 * mag + 1e-30)) {
                            CHECK(0, "mxfp4 matmul isa=%s n=%d t=%d r=%d got %.9g ref %.9g", df_isa_name(isa), nt[k], t, r, got, ref);
                            t = nt[k], r = R;
                        }
                    }
            }
            df_cpu_matvec_t_rows(&W, 5, 7, X, yt);
            for (int c = 0; c < C; c++) {
                double ref = 0, mag = 0;
                for (int r = 0; r < 7; r++) {
                    double v = (double)ref_mx(nib(p + (5 + r) * C / 2, c), sc[(5 + r) * C / 32 + c / 32]) * X[r];
                    ref += v, mag += fabs(v);
                }
                if (!(fabs(yt[c] - ref) <= 1e-5 * mag + 1e-30)) { CHECK(0, "mxfp4 matvec_t isa=%s c=%d got %g ref %g", df_isa_name(isa), c, yt[c], ref); break; }
            }
        }
        df_set_isa(-1);
        free(p), free(X), free(Y);
    }
}

/* ---- prefill GEMM through df_cpu_matmul_batch, every stored format ------
 * Against a double sum over the rows df_dequant_row gives (relative bound);
 * bit-identical at 1 and 2 threads, for every batch size from 6 (token t's
 * outputs do not depend on the other tokens of the batch; 2-5 tokens run
 * the dot kernels and agree with each other), on every ISA from 6 tokens
 * (each output one FMA chain over k in order, the weights dequantized
 * exactly), and as one job or two jobs of a batch. Shapes: rows not a multiple of the
 * 16-row panel or of the 64-row block, K below, at and past the 256 slice
 * and not a multiple of it, n = 2..130 tokens. */
static void run_mm(const df_weight *w, const float *X, int n, float *Y) {
    const df_mv_job j = {w, (const df_act *)(const void *)X, (df_act *)(void *)Y};
    df_cpu_matmul_batch(&j, 1, n);
}
static void test_gemm(void) {
    df_pool_init(2);
    const int best = df_isa();
    static const struct { int fmt, gtype; const char *name; } F[] = {
        {DF_W_F32, 0, "f32"}, {DF_W_BF16, 0, "bf16"}, {DF_W_F16, 0, "f16"}, {DF_W_FP8, 0, "fp8"}, {DF_W_INT4, 0, "int4"},
        {DF_W_I8ROW, 0, "i8row"}, {DF_W_MXFP4, 0, "mxfp4"}, {DF_W_GGML, 8, "q8_0"}, {DF_W_GGML, 3, "q4_1"},
        /* the Q4_K_M file's types and the other 32-blocks with panel kernels (df_ggml_pack16) */
        {DF_W_GGML, 2, "q4_0"}, {DF_W_GGML, 6, "q5_0"}, {DF_W_GGML, 7, "q5_1"}, {DF_W_GGML, 12, "q4_k"}, {DF_W_GGML, 14, "q6_k"}};
    static const int64_t shapes[][2] = {{37, 300}, {130, 544}, {16, 96}, {81, 256}, {50, 768}};
    static const int ns[] = {2, 3, 4, 5, 6, 7, 13, 64, 130};
    enum { NMAX = 130 };
    for (size_t f = 0; f < sizeof F / sizeof *F; f++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const int64_t R = shapes[si][0], C = shapes[si][1];
            if ((F[f].fmt == DF_W_MXFP4 || F[f].fmt == DF_W_GGML) && C % 32) continue;
            if (F[f].fmt == DF_W_GGML && C % df_ggml_traits_of(F[f].gtype)->block_elems) continue;
            if (C == 768 && F[f].fmt != DF_W_GGML) continue; /* the K-quant shape: K-quants (and the 32-blocks) only */
            gw g;
            gw_make(&g, F[f].fmt, F[f].gtype, R, C);
            float *X = malloc((size_t)(NMAX * C) * 4), *Y = malloc((size_t)(NMAX * R) * 4), *Y2 = malloc((size_t)(NMAX * R) * 4);
            float *Wd = malloc((size_t)(R * C) * 4);
            for (int64_t i = 0; i < NMAX * C; i++) X[i] = frand();
            df_set_isa(0);
            for (int64_t r = 0; r < R; r++) df_dequant_row(&g.w, r, Wd + r * C);
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                const int n = ns[ni];
                int bad = 0;
                df_set_isa(best), df_pool_serial(0);
                run_mm(&g.w, X, n, Y);
                for (int t = 0; t < n && !bad; t++)
                    for (int64_t r = 0; r < R && !bad; r++) {
                        double ref = 0, mag = 0;
                        for (int64_t c = 0; c < C; c++) ref += (double)Wd[r * C + c] * X[t * C + c], mag += fabs((double)Wd[r * C + c] * X[t * C + c]);
                        if (!(fabs(Y[t * R + r] - ref) <= 1e-5 * mag + 1e-30)) {
                            bad = 1;
                            CHECK(0, "gemm %s %lldx%lld n=%d t=%d r=%lld got %.9g ref %.9g", F[f].name, (long long)R, (long long)C, n, t, (long long)r, Y[t * R + r], ref);
                        }
                    }
                df_pool_serial(1); /* one thread */
                run_mm(&g.w, X, n, Y2);
                CHECK(!memcmp(Y, Y2, (size_t)(n * R) * 4), "gemm %s %lldx%lld n=%d: 1 thread != 2 threads", F[f].name, (long long)R, (long long)C, n);
                df_pool_serial(0);
                for (int isa = 0; isa < best && n >= 6; isa++) { /* the GEMM (n >= 6; 2-5 tokens run the dot kernels) */
                    df_set_isa(isa);
                    run_mm(&g.w, X, n, Y2);
                    CHECK(!memcmp(Y, Y2, (size_t)(n * R) * 4), "gemm %s %lldx%lld n=%d: isa %s != %s", F[f].name, (long long)R, (long long)C, n, df_isa_name(isa), df_isa_name(best));
                }
                df_set_isa(best);
                /* batch-size invariance: tokens t..t+5 alone give the bits they had in the batch of n >= 6
                 * (n = 3..5: tokens t, t+1 alone as in the batch of n) */
                const int win = n >= 6 ? 6 : 2;
                for (int t = 0; t + win <= n; t += n / 2 + 1) {
                    run_mm(&g.w, X + (int64_t)t * C, win, Y2);
                    CHECK(!memcmp(Y + (int64_t)t * R, Y2, (size_t)(win * R) * 4), "gemm %s %lldx%lld: tokens %d..%d of n=%d differ alone", F[f].name, (long long)R, (long long)C, t, t + win - 1, n);
                }
            }
            /* two jobs in one dispatch (batch_task) = each alone */
            {
                gw h;
                gw_make(&h, DF_W_BF16, 0, 19, C);
                float *Yh = malloc((size_t)(NMAX * 19) * 4), *Yh2 = malloc((size_t)(NMAX * 19) * 4);
                const df_mv_job jobs[2] = {{&g.w, (const df_act *)(const void *)X, (df_act *)(void *)Y2},
                                           {&h.w, (const df_act *)(const void *)X, (df_act *)(void *)Yh}};
                df_cpu_matmul_batch(jobs, 2, 7);
                run_mm(&g.w, X, 7, Y), run_mm(&h.w, X, 7, Yh2);
                CHECK(!memcmp(Y, Y2, (size_t)(7 * R) * 4) && !memcmp(Yh, Yh2, (size_t)(7 * 19) * 4), "gemm %s %lldx%lld: two-job batch differs", F[f].name, (long long)R, (long long)C);
                free(Yh), free(Yh2), free(h.data), free(h.scale);
            }
            free(X), free(Y), free(Y2), free(Wd), free(g.data), free(g.scale);
        }
    df_set_isa(-1);
}

/* The GEMM's bit contract stated directly: every output is the single FMA
 * chain fmaf(w[k], x[k], s) over k = 0..K-1 in order from 0, whatever the
 * driver's blocking. Shapes that cross its edges: several 64-row blocks in
 * one range (one thread) and a last panel of 8 rows, K in 3 slices of 367
 * columns (slices that start at columns not a multiple of 8: the packed
 * panel's slice offsets and the tail of the 8-column transposes), token
 * blocks of 6 and 4; F32 (packed straight from the weight) and BF16
 * (dequantized rows), one thread and two. A blocking or packing change
 * that alters any output's order or operands fails it (issue 17 round 6:
 * a slice packed from a column one off was caught). */
static void test_gemm_chain(void) {
    df_pool_init(2);
    const int64_t R = 200, C = 1101;
    const int fmts[2] = {DF_W_F32, DF_W_BF16};
    float *X = malloc((size_t)(64 * C) * 4), *Y = malloc((size_t)(64 * R) * 4), *Wd = malloc((size_t)(R * C) * 4);
    for (int64_t i = 0; i < 64 * C; i++) X[i] = frand();
    for (int f = 0; f < 2; f++) {
        gw g;
        gw_make(&g, fmts[f], 0, R, C);
        for (int64_t r = 0; r < R; r++) df_dequant_row(&g.w, r, Wd + r * C);
        for (int serial = 0; serial < 2; serial++)
            for (int n = 6; n <= 64; n += 58) {
                df_pool_serial(serial);
                run_mm(&g.w, X, n, Y);
                int bad = 0;
                for (int t = 0; t < n && !bad; t++)
                    for (int64_t r = 0; r < R && !bad; r++) {
                        float s = 0;
                        for (int64_t c = 0; c < C; c++) s = fmaf(Wd[r * C + c], X[t * C + c], s);
                        if (memcmp(&s, Y + t * R + r, 4)) {
                            bad = 1;
                            CHECK(0, "gemm chain %s n=%d threads=%d t=%d r=%lld got %.9g want %.9g", fmts[f] == DF_W_F32 ? "f32" : "bf16", n,
                                  serial ? 1 : 2, t, (long long)r, Y[t * R + r], s);
                        }
                    }
            }
        free(g.data), free(g.scale);
    }
    df_pool_serial(0);
    free(X), free(Y), free(Wd);
}

/* Decode products (n = 1) of the float formats through the driver, rows
 * short and long (four-row kernels on rows a quarter of the range apart,
 * the remainder one row at a time), R odd so groups of four leave a
 * remainder: within the bound of a double
 * sum, the same bits on one thread and on two, and an FP8 NaN code makes its
 * row NaN and no other. */
static void test_decode_rows(void) {
    df_pool_init(2);
    static const int fmts[] = {DF_W_F32, DF_W_BF16, DF_W_F16, DF_W_FP8};
    static const int64_t cols[] = {96, 576, 1024, 2048, 4608};
    enum { R = 37 };
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
        for (size_t ci = 0; ci < sizeof cols / sizeof *cols; ci++) {
            const int64_t C = cols[ci];
            gw g;
            gw_make(&g, fmts[f], 0, R, C);
            float *x = malloc((size_t)C * 4), *y = malloc(R * 4), *y1 = malloc(R * 4), *row = malloc((size_t)C * 4);
            for (int64_t i = 0; i < C; i++) x[i] = frand();
            df_pool_serial(0);
            run_mm(&g.w, x, 1, y);
            for (int r = 0; r < R; r++) {
                df_dequant_row(&g.w, r, row);
                double ref = 0, mag = 0;
                for (int64_t c = 0; c < C; c++) ref += (double)row[c] * x[c], mag += fabs((double)row[c] * x[c]);
                if (!(fabs(y[r] - ref) <= 1e-5 * mag + 1e-30)) {
                    CHECK(0, "decode fmt %d %dx%lld row %d: got %.9g ref %.9g", fmts[f], R, (long long)C, r, y[r], ref);
                    break;
                }
            }
            df_pool_serial(1);
            run_mm(&g.w, x, 1, y1);
            df_pool_serial(0);
            CHECK(!memcmp(y, y1, R * 4), "decode fmt %d %dx%lld: 1 thread != 2 threads", fmts[f], R, (long long)C);
            if (fmts[f] == DF_W_FP8) {
                /* the first product checked the weight for NaN codes (cpu.c, fp8_nan_free) */
                CHECK(g.w.nan_codes == DF_NAN_CODES_NONE, "decode fp8 %dx%lld: nan_codes %d after a product, want NONE", R, (long long)C,
                      g.w.nan_codes);
                uint8_t *d = g.data;
                const int nanrows[] = {2, 9, 36}; /* in a group of four, another group, the remainder */
                for (int k = 0; k < 3; k++) d[(size_t)nanrows[k] * (size_t)C + (size_t)(C / 2 + k)] = (uint8_t)(k & 1 ? 0xff : 0x7f);
                g.w.nan_codes = DF_NAN_CODES_UNCHECKED; /* other bytes (backend.h: whoever rewrites data says so) */
                run_mm(&g.w, x, 1, y1);
                CHECK(g.w.nan_codes == DF_NAN_CODES_MAYBE, "decode fp8 %dx%lld with NaN codes: nan_codes %d, want MAYBE", R,
                      (long long)C, g.w.nan_codes);
                for (int r = 0; r < R; r++) {
                    const int want = r == 2 || r == 9 || r == 36;
                    CHECK((isnan(y1[r]) != 0) == want, "decode fp8 %dx%lld with NaN codes: row %d = %g", R, (long long)C, r, y1[r]);
                }
            }
            free(x), free(y), free(y1), free(row), free(g.data), free(g.scale);
        }
}

/* The decode driver's bit contract (cpu.c, dot_rows), every float format on
 * the best ISA: the product's value for a row is what the four-row kernel
 * gives for that row (with three neighbours, any distance apart) for every
 * row but the matrix's last rows % 4, which are the one-row kernel's, at one
 * thread and at two, as one job or as the second job of a batch (a row range
 * that starts inside the dispatch). That is what makes the result
 * independent of the thread split; round 2 ran short rows one at a time
 * (BF16 up to 2048 columns), which this rejects. */
static void test_decode_kernel_contract(void) {
    df_pool_init(2);
    const int isa = df_isa();
    static const int fmts[] = {DF_W_F32, DF_W_BF16, DF_W_F16, DF_W_FP8};
    static const int64_t cols[] = {96, 200, 576, 2048};
    static const int Rs[] = {5, 37, 64, 203};
    void (*d4f[3])(const float *, int64_t, const float *, int64_t, float *) = {df_k_dot4_f32_scalar, df_k_dot4_f32_avx2, df_k_dot4_f32_avx512};
    void (*d4h[3])(const uint16_t *, int64_t, const float *, int64_t, float *) = {df_k_dot4_f16_scalar, df_k_dot4_f16_avx2, df_k_dot4_f16_avx512};
    void (*bprep[3])(const float *, float *, int64_t) = {df_k_bf16x_prep_scalar, df_k_bf16x_prep_avx2, df_k_bf16x_prep_avx512};
    void (*d4bp[3])(const uint16_t *, int64_t, const float *, const float *, int64_t, float *) = {df_k_dot4_bf16p_scalar, df_k_dot4_bf16p_avx2, df_k_dot4_bf16p_avx512};
    float (*dbp[3])(const uint16_t *, const float *, const float *, int64_t) = {df_k_dot_bf16p_scalar, df_k_dot_bf16p_avx2, df_k_dot_bf16p_avx512};
    float (*f8prep[3])(const float *, float *, int64_t) = {df_k_fp8x_prep_scalar, df_k_fp8x_prep_avx2, df_k_fp8x_prep_avx512};
    void (*d48sp[3])(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *) = {df_k_dot4_fp8sp_scalar, df_k_dot4_fp8sp_avx2, df_k_dot4_fp8sp_avx512};
    float (*d8sp[3])(const uint8_t *, const float *, float, int64_t, int, const float *) = {df_k_dot_fp8sp_scalar, df_k_dot_fp8sp_avx2, df_k_dot_fp8sp_avx512};
    float (*d1f[3])(const float *, const float *, int64_t) = {df_k_dot_f32_scalar, df_k_dot_f32_avx2, df_k_dot_f32_avx512};
    float (*d1h[3])(const uint16_t *, const float *, int64_t) = {df_k_dot_f16_scalar, df_k_dot_f16_avx2, df_k_dot_f16_avx512};
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
        for (size_t ci = 0; ci < sizeof cols / sizeof *cols; ci++)
            for (size_t ri = 0; ri < sizeof Rs / sizeof *Rs; ri++) {
                const int64_t C = cols[ci];
                const int R = Rs[ri];
                if (fmts[f] == DF_W_FP8 && C % 32) continue; /* the FP8 kernels' requirement (cpu.c falls back) */
                gw g, h;
                gw_make(&g, fmts[f], 0, R, C);
                gw_make(&h, DF_W_BF16, 0, 9, 64); /* the first job of the batch */
                float *x = malloc((size_t)C * 4), *xp = malloc((size_t)C * 4), *want = malloc((size_t)R * 4);
                float *y[3], *xh = malloc(64 * 4), *yh = malloc(9 * 4);
                for (int k = 0; k < 3; k++) y[k] = malloc((size_t)R * 4);
                for (int64_t i = 0; i < C; i++) x[i] = frand();
                for (int i = 0; i < 64; i++) xh[i] = frand();
                /* the kernels on groups of four adjacent rows (the driver groups them otherwise) */
                const uint8_t *d = g.data;
                const size_t rb = g.w.row_bytes;
                float xs = 1;
                if (fmts[f] == DF_W_BF16) bprep[isa](x, xp, C);
                if (fmts[f] == DF_W_FP8) xs = f8prep[isa](x, xp, C);
                const float *scf = (const float *)(const void *)g.scale;
                for (int r = 0; r < R; r++) {
                    const int four = r < R / 4 * 4;
                    const int r4 = r / 4 * 4;
                    float o[4];
                    switch (fmts[f]) {
                    case DF_W_F32:
                        if (four) d4f[isa]((const float *)(const void *)(d + r4 * rb), (int64_t)rb / 4, x, C, o), want[r] = o[r - r4];
                        else want[r] = d1f[isa]((const float *)(const void *)(d + r * rb), x, C);
                        break;
                    case DF_W_F16:
                        if (four) d4h[isa]((const uint16_t *)(const void *)(d + r4 * rb), (int64_t)rb / 2, x, C, o), want[r] = o[r - r4];
                        else want[r] = d1h[isa]((const uint16_t *)(const void *)(d + r * rb), x, C);
                        break;
                    case DF_W_BF16:
                        if (four) d4bp[isa]((const uint16_t *)(const void *)(d + r4 * rb), (int64_t)rb / 2, x, xp, C, o), want[r] = o[r - r4];
                        else want[r] = dbp[isa]((const uint16_t *)(const void *)(d + r * rb), x, xp, C);
                        break;
                    case DF_W_FP8: {
                        const float *sc[4];
                        for (int k = 0; k < 4; k++) sc[k] = scf + (size_t)((r4 + k) / g.w.blk_r * g.w.scale_cols);
                        if (four) d48sp[isa](d + r4 * rb, (int64_t)rb, xp, xs, C, g.w.blk_c, sc, o), want[r] = o[r - r4];
                        else want[r] = d8sp[isa](d + r * rb, xp, xs, C, g.w.blk_c, scf + (size_t)(r / g.w.blk_r * g.w.scale_cols));
                        break;
                    }
                    }
                }
                df_pool_serial(0);
                run_mm(&g.w, x, 1, y[0]);
                df_pool_serial(1);
                run_mm(&g.w, x, 1, y[1]);
                df_pool_serial(0);
                const df_mv_job jobs[2] = {{&h.w, (const df_act *)(const void *)xh, (df_act *)(void *)yh},
                                           {&g.w, (const df_act *)(const void *)x, (df_act *)(void *)y[2]}};
                df_cpu_matmul_batch(jobs, 2, 1);
                static const char *how[3] = {"2 threads", "1 thread", "second job of a batch"};
                for (int k = 0; k < 3; k++)
                    for (int r = 0; r < R; r++)
                        if (memcmp(&y[k][r], &want[r], 4)) {
                            CHECK(0, "decode contract fmt %d %dx%lld (%s): row %d = %.9g, the %s kernel gives %.9g", fmts[f], R,
                                  (long long)C, how[k], r, y[k][r], r < R / 4 * 4 ? "four-row" : "one-row", want[r]);
                            break;
                        }
                free(x), free(xp), free(want), free(xh), free(yh);
                for (int k = 0; k < 3; k++) free(y[k]);
                free(g.data), free(g.scale), free(h.data), free(h.scale);
            }
}

/* The traits table: an entry per format, and byte counts that agree with the
 * layouts the loaders build. */
static void test_traits(void) {
    for (int f = 0; f < DF_W_NFMT; f++) {
        const df_wfmt_traits *t = df_wfmt_traits_of((df_wfmt)f);
        CHECK(t && t->name && t->desc, "traits of format %d", f);
    }
    CHECK(!df_wfmt_traits_of((df_wfmt)DF_W_NFMT), "traits past the last format");
    CHECK(df_wfmt_row_bytes(DF_W_F32, 10) == 40 && df_wfmt_row_bytes(DF_W_BF16, 10) == 20 && df_wfmt_row_bytes(DF_W_F16, 3) == 6 &&
          df_wfmt_row_bytes(DF_W_FP8, 70) == 70 && df_wfmt_row_bytes(DF_W_I8ROW, 9) == 9, "row bytes of the unpacked formats");
    CHECK(df_wfmt_row_bytes(DF_W_INT4, 64) == 32 && df_wfmt_row_bytes(DF_W_INT4, 65) == 36, "INT4 row bytes: int32 words of 8");
    CHECK(df_wfmt_row_bytes(DF_W_MXFP4, 7168) == 3584 && df_wfmt_row_bytes(DF_W_GGML, 256) == -1, "MXFP4 / GGML row bytes");
    df_weight fp8 = {.fmt = DF_W_FP8, .rows = 300, .cols = 70, .row_bytes = 70, .scale_dtype = DF_SCALE_F32, .blk_r = 128, .blk_c = 32, .scale_cols = 3};
    CHECK(df_weight_scale_bytes(&fp8) == 3 * 3 * 4 && df_weight_bytes(&fp8) == 300 * 70 + 36, "FP8 scale bytes %lld", (long long)df_weight_scale_bytes(&fp8));
    df_weight i4 = {.fmt = DF_W_INT4, .rows = 5, .cols = 64, .row_bytes = 32, .scale_dtype = DF_SCALE_BF16, .blk_r = 1, .blk_c = 32, .scale_cols = 2};
    CHECK(df_weight_scale_bytes(&i4) == 5 * 2 * 2, "INT4 scale bytes");
    df_weight i8 = {.fmt = DF_W_I8ROW, .rows = 5, .cols = 64, .row_bytes = 64, .scale_dtype = DF_SCALE_F32, .blk_r = 1, .blk_c = 64, .scale_cols = 1};
    CHECK(df_weight_scale_bytes(&i8) == 20, "I8ROW scale bytes");
    df_weight bf = {.fmt = DF_W_BF16, .rows = 5, .cols = 64, .row_bytes = 128};
    CHECK(df_weight_scale_bytes(&bf) == 0 && df_weight_bytes(&bf) == 640, "BF16 bytes");
}

/* ---- FP8 NaN codes in the dot kernels ------------------------------------
 * E4M3FN has no infinities; S.1111.111 (0x7f, 0xff) is NaN, and a product
 * with it makes the row's dot NaN in the scalar reference. Every code at
 * several positions (SIMD body, last column, scalar tail) of rows of several
 * lengths: each ISA's result is NaN exactly where the scalar one is, and
 * within the usual bound elsewhere. */
static void test_fp8_nan(void) {
    const int64_t lens[] = {32, 96, 256 + 13};
    for (int isa = DF_ISA_AVX2; isa <= DF_ISA_AVX512; isa++) {
        df_set_isa(isa);
        if (df_isa() != isa) continue;
        float (*f8[3])(const uint8_t *, const float *, int64_t) = {df_k_dot_fp8_scalar, df_k_dot_fp8_avx2, df_k_dot_fp8_avx512};
        void (*d48[3])(const uint8_t *, int64_t, const float *, int64_t, int, const float *const *, float *) = {
            df_k_dot4_fp8s_scalar, df_k_dot4_fp8s_avx2, df_k_dot4_fp8s_avx512};
        float (*prep8[3])(const float *, float *, int64_t) = {df_k_fp8x_prep_scalar, df_k_fp8x_prep_avx2, df_k_fp8x_prep_avx512};
        float (*d8sp[3])(const uint8_t *, const float *, float, int64_t, int, const float *) = {df_k_dot_fp8sp_scalar, df_k_dot_fp8sp_avx2, df_k_dot_fp8sp_avx512};
        void (*d48sp[3])(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *) = {df_k_dot4_fp8sp_scalar, df_k_dot4_fp8sp_avx2, df_k_dot4_fp8sp_avx512};
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            const int64_t n = lens[li], ld = n + 32, nb = n - n % 32; /* dot4: n % 32 == 0 */
            uint8_t *w = malloc((size_t)(4 * ld));
            float *x = malloc((size_t)n * 4), scs[4][16];
            const float *sc[4] = {scs[0], scs[1], scs[2], scs[3]};
            for (int k = 0; k < 4; k++)
                for (int b = 0; b < 16; b++) scs[k][b] = 0.5f + 0.25f * (float)((k + b) % 3);
            for (int64_t i = 0; i < n; i++) x[i] = frand();
            int bad = 0, bad4 = 0;
            for (int code = 0; code < 256 && !(bad && bad4); code++) {
                const int64_t at[3] = {5, nb - 1, n - 1};
                for (int p = 0; p < 3; p++) {
                    for (int64_t i = 0; i < 4 * ld; i++) w[i] = (uint8_t)(0x30 + (i * 7) % 16);
                    w[at[p]] = (uint8_t)code;            /* row 0 */
                    w[2 * ld + (at[p] + 3) % nb] = (uint8_t)code; /* row 2, another column */
                    float mag = 0;
                    for (int64_t i = 0; i < n; i++) mag += fabsf(x[i]) * 448;
                    const float got = f8[isa](w, x, n), ref = f8[0](w, x, n);
                    if (!bad && (isnan(got) != isnan(ref) || (!isnan(ref) && fabsf(got - ref) > 1e-5f * mag + 1e-6f))) {
                        CHECK(0, "fp8 dot isa=%s n=%lld code 0x%02x at %lld: got %g ref %g", df_isa_name(isa), (long long)n, code,
                              (long long)at[p], got, ref);
                        bad = 1;
                    }
                    if (at[p] >= nb) continue;
                    float g4[4], r4[4], xp[512];
                    d48[isa](w, ld, x, nb, 32, sc, g4), d48[0](w, ld, x, nb, 32, sc, r4);
                    const float xs = prep8[isa](x, xp, nb);
                    float gp[4];
                    d48sp[isa](w, ld, xp, xs, nb, 32, sc, gp);
                    for (int k = 0; k < 4 && !bad4; k++) {
                        const float g1 = d8sp[isa](w + k * ld, xp, xs, nb, 32, sc[k]);
                        if (isnan(gp[k]) != isnan(r4[k]) || isnan(g1) != isnan(r4[k])) {
                            CHECK(0, "fp8 dot4sp/dotsp isa=%s n=%lld code 0x%02x at %lld row %d: got %g / %g ref %g", df_isa_name(isa),
                                  (long long)nb, code, (long long)at[p], k, gp[k], g1, r4[k]);
                            bad4 = 1;
                        }
                    }
                    for (int k = 0; k < 4 && !bad4; k++)
                        if (isnan(g4[k]) != isnan(r4[k]) || (!isnan(r4[k]) && fabsf(g4[k] - r4[k]) > 1e-5f * mag * 2 + 1e-6f)) {
                            CHECK(0, "fp8 dot4s isa=%s n=%lld code 0x%02x at %lld row %d: got %g ref %g", df_isa_name(isa),
                                  (long long)nb, code, (long long)at[p], k, g4[k], r4[k]);
                            bad4 = 1;
                        }
                }
            }
            free(w), free(x);
        }
    }
    df_set_isa(-1);
}

/* ---- FP8 decode on prepared x (fp8x_prep, dot_fp8sp, dot4_fp8sp) -------
 * Every E4M3 code alone in a row (the other columns +0) at even and odd
 * positions of the kernels' 16-element order: the dot is one product,
 * exactly the table's value x x x scale (subnormal codes included, NaN for
 * the NaN codes). Then rows against activations near f32's top (the prep
 * scales x down, not up) and with an infinity, against the scalar sums. */
static void test_fp8_prepared(void) {
    enum { N = 64 };
    for (int isa = DF_ISA_AVX2; isa <= DF_ISA_AVX512; isa++) {
        df_set_isa(isa);
        if (df_isa() != isa) continue;
        float (*prep8[3])(const float *, float *, int64_t) = {df_k_fp8x_prep_scalar, df_k_fp8x_prep_avx2, df_k_fp8x_prep_avx512};
        float (*d8sp[3])(const uint8_t *, const float *, float, int64_t, int, const float *) = {df_k_dot_fp8sp_scalar, df_k_dot_fp8sp_avx2, df_k_dot_fp8sp_avx512};
        void (*d48sp[3])(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *) = {df_k_dot4_fp8sp_scalar, df_k_dot4_fp8sp_avx2, df_k_dot4_fp8sp_avx512};
        uint8_t w[4 * N];
        float x[N], xp[N], scs[4][2] = {{0.375f, 0.375f}, {0.375f, 0.375f}, {0.375f, 0.375f}, {0.375f, 0.375f}};
        const float *sc[4] = {scs[0], scs[1], scs[2], scs[3]};
        for (int i = 0; i < N; i++) x[i] = (float)(i % 7) - 3.0f;
        const int pos[] = {0, 1, 2, 14, 15, 16, 17, 31, 32, 47, 63};
        int bad = 0;
        for (int code = 0; code < 256 && !bad; code++)
            for (size_t p = 0; p < sizeof pos / sizeof *pos && !bad; p++) {
                const int j = pos[p];
                x[j] = 1.5f;
                const float xs = prep8[isa](x, xp, N), want = (code & 0x7f) ? df_fp8_lut[code] * 1.5f * 0.375f : 0.0f; /* a sum from +0: -0 adds to +0 */
                memset(w, 0, sizeof w);
                w[j] = (uint8_t)code, w[3 * N + j] = (uint8_t)code;
                float got[4];
                d48sp[isa](w, N, xp, xs, N, 32, sc, got);
                const float one = d8sp[isa](w, xp, xs, N, 32, sc[0]);
                if (!same_f32(got[0], want) || !same_f32(got[3], want) || !same_f32(one, want) || got[1] != 0 || got[2] != 0) {
                    CHECK(0, "fp8sp isa=%s code 0x%02x at %d: dot4 %g %g %g %g, dot %g, want %g", df_isa_name(isa), code, j,
                          got[0], got[1], got[2], got[3], one, want);
                    bad = 1;
                }
                x[j] = (float)(j % 7) - 3.0f;
            }
        /* x near the top of f32, then with +inf: as the scalar sums */
        for (int trial = 0; trial < 2; trial++) {
            float mag = 0, ref[4], got[4];
            for (int i = 0; i < 4 * N; i++) w[i] = (uint8_t)(rnd() & 0xff), w[i] = (w[i] & 0x7f) == 0x7f ? 0x3a : w[i];
            for (int i = 0; i < N; i++) x[i] = frand() * 1e30f, mag += fabsf(x[i]) * 448;
            if (trial == 1) x[9] = INFINITY;
            const float xs = prep8[isa](x, xp, N);
            df_k_dot4_fp8s_scalar(w, N, x, N, 32, sc, ref);
            d48sp[isa](w, N, xp, xs, N, 32, sc, got);
            for (int k = 0; k < 4; k++) {
                const float one = d8sp[isa](w + k * N, xp, xs, N, 32, sc[k]);
                if (trial == 0) {
                    close_enough("dot4 fp8sp, x ~1e30", isa, N, got[k], ref[k], mag);
                    close_enough("dot fp8sp, x ~1e30", isa, N, one, ref[k], mag);
                } else {
                    CHECK(same_f32(got[k], ref[k]) && same_f32(one, ref[k]), "fp8sp isa=%s x with inf row %d: dot4 %g dot %g ref %g",
                          df_isa_name(isa), k, got[k], one, ref[k]);
                }
            }
        }
    }
    df_set_isa(-1);
}

/* ---- FP8 decode without the NaN-code check (round 5) --------------------
 * The product checks an FP8 weight for E4M3 NaN codes once (cpu.c,
 * fp8_nan_free: df_weight.nan_codes) and runs the four-row kernel without its
 * per-block check (dot4_fp8spn) where there is none. Both paths:
 *  - kernels: dot4_fp8spn gives dot4_fp8sp's bits on rows without NaN codes
 *    (every code but the two NaNs, subnormals included; blocks of 32 and 128);
 *  - products: a weight without NaN codes gives the same bits when it is
 *    checked (UNCHECKED -> NONE: the kernel without the check) and when it is
 *    marked MAYBE (the checking kernel), at one thread and two; a NaN code at
 *    any column of any row (every column of the scan's 32-byte words and its
 *    tail) is found by the check (-> MAYBE) and makes exactly that row NaN.
 * Before the change there was no flag (MAYBE and UNCHECKED ran the same
 * kernel); a check that missed a NaN code fails the last part. */
static void test_fp8_nan_flag(void) {
    df_pool_init(2);
    for (int isa = DF_ISA_AVX2; isa <= DF_ISA_AVX512; isa++) {
        df_set_isa(isa);
        if (df_isa() != isa) continue;
        float (*prep8[3])(const float *, float *, int64_t) = {df_k_fp8x_prep_scalar, df_k_fp8x_prep_avx2, df_k_fp8x_prep_avx512};
        void (*d48sp[3])(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *) = {
            df_k_dot4_fp8sp_scalar, df_k_dot4_fp8sp_avx2, df_k_dot4_fp8sp_avx512};
        void (*d48spn[3])(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *) = {
            df_k_dot4_fp8spn_scalar, df_k_dot4_fp8spn_avx2, df_k_dot4_fp8spn_avx512};
        static const int64_t ns[] = {32, 96, 576, 2048, 7168};
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int blk = 32; blk <= 128; blk *= 4) {
                const int64_t n = ns[ni], ld = n + 64, nb = (n + blk - 1) / blk;
                uint8_t *w = malloc((size_t)(4 * ld));
                float *x = malloc((size_t)n * 4), *xp = malloc((size_t)n * 4), *sc = malloc((size_t)(4 * nb) * 4);
                for (int64_t i = 0; i < 4 * ld; i++) {
                    w[i] = (uint8_t)(rnd() & 0xff);
                    if ((w[i] & 0x7f) == 0x7f) w[i] = (uint8_t)(rnd() & 7); /* subnormals and zeros, not NaN */
                }
                for (int64_t i = 0; i < n; i++) x[i] = ldexpf(frand(), (int)(rnd() % 41) - 20);
                for (int i = 0; i < 4 * nb; i++) sc[i] = ldexpf(1.0f + (float)(i % 5) / 8, (int)(i % 7) - 3);
                const float *scp[4] = {sc, sc + nb, sc + 2 * nb, sc + 3 * nb};
                const float xs = prep8[isa](x, xp, n);
                float a[4], b[4];
                d48sp[isa](w, ld, xp, xs, n, blk, scp, a);
                d48spn[isa](w, ld, xp, xs, n, blk, scp, b);
                for (int k = 0; k < 4; k++)
                    CHECK(same_f32(a[k], b[k]) && !isnan(a[k]), "dot4_fp8spn isa=%s n=%lld blk=%d row %d: %.9g, dot4_fp8sp %.9g",
                          df_isa_name(isa), (long long)n, blk, k, b[k], a[k]);
                free(w), free(x), free(xp), free(sc);
            }
        static const int64_t cols[] = {96, 576, 2048};
        static const int Rs[] = {37, 203};
        for (size_t ci = 0; ci < sizeof cols / sizeof *cols; ci++)
            for (size_t ri = 0; ri < sizeof Rs / sizeof *Rs; ri++) {
                const int64_t C = cols[ci];
                const int R = Rs[ri];
                gw g;
                gw_make(&g, DF_W_FP8, 0, R, C);
                float *x = malloc((size_t)C * 4), *y[4];
                for (int k = 0; k < 4; k++) y[k] = malloc((size_t)R * 4);
                for (int64_t i = 0; i < C; i++) x[i] = frand();
                for (int th = 0; th < 2; th++) {
                    df_pool_serial(th);
                    g.w.nan_codes = DF_NAN_CODES_MAYBE;
                    run_mm(&g.w, x, 1, y[2 * th]);
                    CHECK(g.w.nan_codes == DF_NAN_CODES_MAYBE, "fp8 MAYBE stays MAYBE (%d)", g.w.nan_codes);
                    g.w.nan_codes = DF_NAN_CODES_UNCHECKED;
                    run_mm(&g.w, x, 1, y[2 * th + 1]);
                    CHECK(g.w.nan_codes == DF_NAN_CODES_NONE, "fp8 isa=%s %dx%lld: checked %d, want NONE", df_isa_name(isa), R,
                          (long long)C, g.w.nan_codes);
                }
                df_pool_serial(0);
                for (int k = 1; k < 4; k++)
                    CHECK(!memcmp(y[0], y[k], (size_t)R * 4), "fp8 isa=%s %dx%lld: product %d (%s, %s) != the checking kernel's, 2 threads",
                          df_isa_name(isa), R, (long long)C, k, k < 2 ? "2 threads" : "1 thread", k & 1 ? "checked: no check" : "MAYBE");
                /* the host helper (backend.h) that the product and the expert views use: found once, then kept */
                g.w.nan_codes = DF_NAN_CODES_UNCHECKED;
                CHECK(df_weight_nan_codes(&g.w) == DF_NAN_CODES_NONE && g.w.nan_codes == DF_NAN_CODES_NONE, "df_weight_nan_codes clean: %d",
                      g.w.nan_codes);
                const uint8_t keep0 = g.data[(size_t)(R / 2) * (size_t)C + 3];
                g.data[(size_t)(R / 2) * (size_t)C + 3] = 0xff;
                CHECK(df_weight_nan_codes(&g.w) == DF_NAN_CODES_NONE, "df_weight_nan_codes rescanned a checked weight");
                g.w.nan_codes = DF_NAN_CODES_UNCHECKED;
                CHECK(df_weight_nan_codes(&g.w) == DF_NAN_CODES_MAYBE && g.w.nan_codes == DF_NAN_CODES_MAYBE, "df_weight_nan_codes 0xff: %d",
                      g.w.nan_codes);
                g.data[(size_t)(R / 2) * (size_t)C + 3] = keep0;
                {
                    df_weight nd = g.w;
                    nd.nan_codes = DF_NAN_CODES_UNCHECKED, nd.data = NULL;
                    CHECK(df_weight_nan_codes(&nd) == DF_NAN_CODES_MAYBE && nd.nan_codes == DF_NAN_CODES_UNCHECKED, "no data: MAYBE");
                    nd = g.w;
                    nd.fmt = DF_W_BF16, nd.nan_codes = DF_NAN_CODES_UNCHECKED;
                    CHECK(df_weight_nan_codes(&nd) == DF_NAN_CODES_MAYBE, "not FP8: MAYBE");
                }
                /* one NaN code at column c of row r: only row r is NaN (rows in the four-row groups and the remainder) */
                uint8_t *d = g.data;
                const int rows_at[] = {0, R / 4 * 4 - 1, R - 1};
                int bad = 0;
                for (int64_t c = 0; c < C && !bad; c += (C > 96 ? 37 : 1))
                    for (int ri2 = 0; ri2 < 3 && !bad; ri2++) {
                        const int r = rows_at[ri2];
                        const uint8_t keep = d[(size_t)r * (size_t)C + (size_t)c];
                        d[(size_t)r * (size_t)C + (size_t)c] = (uint8_t)((c + ri2) & 1 ? 0xff : 0x7f);
                        g.w.nan_codes = DF_NAN_CODES_UNCHECKED;
                        run_mm(&g.w, x, 1, y[1]);
                        for (int rr = 0; rr < R && !bad; rr++)
                            if (rr == r ? !isnan(y[1][rr]) : memcmp(&y[1][rr], &y[0][rr], 4)) {
                                CHECK(0, "fp8 isa=%s %dx%lld NaN code at row %d col %lld: row %d = %g (flag %d)", df_isa_name(isa), R,
                                      (long long)C, r, (long long)c, rr, y[1][rr], g.w.nan_codes);
                                bad = 1;
                            }
                        CHECK(bad || g.w.nan_codes == DF_NAN_CODES_MAYBE, "fp8 NaN code at row %d col %lld: flag %d, want MAYBE", r,
                              (long long)c, g.w.nan_codes);
                        d[(size_t)r * (size_t)C + (size_t)c] = keep;
                    }
                free(x), free(g.data), free(g.scale);
                for (int k = 0; k < 4; k++) free(y[k]);
            }
    }
    df_set_isa(-1);
}

/* ---- FP8 bytes of an expert-cache slot (backend.h: df_weight_nan_codes_memo) --
 * A streamed expert's weight is a view rebuilt at each use over a slot's
 * bytes; the answer lives in the slot's word (store/source.h, part_notes), 0
 * at each load. The first use of loaded bytes is MAYBE without a scan; loaded
 * clean, the second use finds NONE (the kernel without the check: the
 * checking kernel's bits), later uses take the word without a scan; loaded
 * with a NaN code: MAYBE at every use and exactly that row NaN; no word, or
 * not FP8: MAYBE. Per ISA, one and two threads. Before the word, slot views
 * were always MAYBE: the NONE checks fail there. */
static void test_fp8_slot_memo(void) {
    df_pool_init(2);
    for (int isa = DF_ISA_SCALAR; isa <= DF_ISA_AVX512; isa++) {
        df_set_isa(isa);
        if (df_isa() != isa) continue;
        static const int64_t cols[] = {576, 2048};
        for (size_t ci = 0; ci < sizeof cols / sizeof *cols; ci++)
            for (int th = 0; th < 2; th++) {
                df_pool_serial(!th);
                const int64_t C = cols[ci];
                const int R = 67;
                gw g; /* the model's template weight: shape and scales; data: the slot */
                gw_make(&g, DF_W_FP8, 0, R, C);
                float *x = malloc((size_t)C * 4), *ya = malloc((size_t)R * 4), *yb = malloc((size_t)R * 4);
                for (int64_t i = 0; i < C; i++) x[i] = frand();
                df_weight ref = g.w;
                ref.nan_codes = DF_NAN_CODES_MAYBE; /* the checking kernel */
                run_mm(&ref, x, 1, ya);
                int word = 0; /* the slot was just loaded */
                df_weight v = g.w;
                v.nan_codes = DF_NAN_CODES_NONE; /* whatever the template said */
                CHECK(df_weight_nan_codes_memo(&v, &word) == DF_NAN_CODES_MAYBE && v.nan_codes == DF_NAN_CODES_MAYBE &&
                          word == DF_NAN_CODES_USED_ONCE,
                      "slot: the first use is MAYBE without a scan (view %d, word %d)", v.nan_codes, word);
                run_mm(&v, x, 1, yb);
                CHECK(!memcmp(ya, yb, (size_t)R * 4), "slot: first use != the checking kernel's bits");
                v = g.w;
                v.nan_codes = DF_NAN_CODES_MAYBE;
                CHECK(df_weight_nan_codes_memo(&v, &word) == DF_NAN_CODES_NONE && v.nan_codes == DF_NAN_CODES_NONE &&
                          word == DF_NAN_CODES_NONE,
                      "slot isa=%s %lld cols: clean bytes, second use -> NONE (view %d, word %d)", df_isa_name(isa), (long long)C,
                      v.nan_codes, word);
                run_mm(&v, x, 1, yb);
                CHECK(!memcmp(ya, yb, (size_t)R * 4), "slot isa=%s %lld cols th=%d: NONE view != the checking kernel's bits",
                      df_isa_name(isa), (long long)C, th + 1);
                /* a later use (a hit): the word, not a scan (a byte changed behind the cache's back is not seen) */
                const size_t at = (size_t)(R - 3) * (size_t)C + 5; /* a row of the four-row groups */
                const uint8_t keep = g.data[at];
                g.data[at] = 0x7f;
                df_weight v2 = g.w;
                v2.nan_codes = DF_NAN_CODES_MAYBE;
                CHECK(df_weight_nan_codes_memo(&v2, &word) == DF_NAN_CODES_NONE, "slot: a hit scanned again");
                /* the slot loaded again, with a NaN code: MAYBE at the first, second (the scan) and third use, that
                 * row NaN, the others the same bits */
                word = 0;
                for (int use = 0; use < 3; use++) {
                    df_weight v3 = g.w;
                    v3.nan_codes = DF_NAN_CODES_NONE;
                    CHECK(df_weight_nan_codes_memo(&v3, &word) == DF_NAN_CODES_MAYBE && v3.nan_codes == DF_NAN_CODES_MAYBE &&
                              word == (use ? DF_NAN_CODES_MAYBE : DF_NAN_CODES_USED_ONCE),
                          "slot isa=%s: NaN code, use %d -> MAYBE (view %d, word %d)", df_isa_name(isa), use, v3.nan_codes, word);
                    run_mm(&v3, x, 1, yb);
                    for (int r = 0; r < R; r++)
                        if (r == R - 3 ? !isnan(yb[r]) : memcmp(&ya[r], &yb[r], 4)) {
                            CHECK(0, "slot isa=%s %lld cols th=%d use %d NaN code in row %d: row %d = %g", df_isa_name(isa), (long long)C,
                                  th + 1, use, R - 3, r, yb[r]);
                            break;
                        }
                }
                g.data[at] = keep;
                df_weight v4 = g.w;
                v4.nan_codes = DF_NAN_CODES_NONE;
                CHECK(df_weight_nan_codes_memo(&v4, NULL) == DF_NAN_CODES_MAYBE && v4.nan_codes == DF_NAN_CODES_MAYBE, "no word: MAYBE");
                {
                    int wb = DF_NAN_CODES_USED_ONCE;
                    df_weight vb = g.w;
                    vb.fmt = DF_W_BF16, vb.nan_codes = DF_NAN_CODES_NONE;
                    CHECK(df_weight_nan_codes_memo(&vb, &wb) == DF_NAN_CODES_MAYBE && vb.nan_codes == DF_NAN_CODES_MAYBE, "not FP8: MAYBE");
                }
                free(x), free(ya), free(yb), free(g.data), free(g.scale);
            }
    }
    df_pool_serial(0);
    df_set_isa(-1);
}

/* ---- AVX-512 FP8 decode = AVX2 FP8 decode, bit for bit ------------------
 * The AVX-512 build runs the AVX2 file's integer route (fp8_int_avx2.h; the
 * four-row kernel two rows per zmm, the same ops per lane): on an AVX-512
 * machine, its prep (xp, xs), one-row and four-row kernels give
 * the AVX2 functions' bits, for rows of every DeepSeek-V3 length and the
 * odd ones, 32- and 128-column blocks, all codes (subnormals, both zeros),
 * a row with a NaN code, x with a wide spread of magnitudes. Before the
 * port the AVX-512 kernels were the f16 route (xs = 1, other sums): this
 * fails there. Skipped where AVX-512 is not available (the dev VM). */
static void test_fp8_avx512_is_avx2(void) {
    df_set_isa(DF_ISA_AVX512);
    if (df_isa() != DF_ISA_AVX512) {
        printf("skip fp8 avx512 = avx2 (avx512 not supported here)\n");
        df_set_isa(-1);
        return;
    }
    static const int64_t ns[] = {32, 96, 576, 2048, 7168};
    static const int blks[] = {32, 128};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (size_t bi = 0; bi < sizeof blks / sizeof *blks; bi++) {
            const int64_t n = ns[ni], ld = n + 32;
            const int blk = blks[bi], nb = (int)((n + blk - 1) / blk);
            uint8_t *w = malloc((size_t)(4 * ld));
            float *x = malloc((size_t)n * 4), *xp2 = malloc((size_t)n * 4), *xp5 = malloc((size_t)n * 4), *sc = malloc((size_t)(4 * nb) * 4);
            for (int64_t i = 0; i < 4 * ld; i++) w[i] = (uint8_t)(rnd() & 0xff);
            for (int64_t i = 0; i < n; i++) w[i] = (w[i] & 0x7f) == 0x7f ? 0x01 : w[i]; /* row 0: no NaN code */
            w[2 * ld + n / 2] = 0xff;                                                     /* row 2: one */
            for (int64_t i = 0; i < n; i++) x[i] = ldexpf(frand(), (int)(rnd() % 41) - 20);
            for (int i = 0; i < 4 * nb; i++) sc[i] = ldexpf(1.0f + (float)(i % 5) / 8, (int)(i % 7) - 3);
            const float *scp[4] = {sc, sc + nb, sc + 2 * nb, sc + 3 * nb};
            const float xs2 = df_k_fp8x_prep_avx2(x, xp2, n), xs5 = df_k_fp8x_prep_avx512(x, xp5, n);
            CHECK(same_f32(xs2, xs5) && !memcmp(xp2, xp5, (size_t)n * 4), "fp8x_prep avx512 != avx2, n=%lld", (long long)n);
            float o2[4], o5[4];
            df_k_dot4_fp8sp_avx2(w, ld, xp2, xs2, n, blk, scp, o2);
            df_k_dot4_fp8sp_avx512(w, ld, xp2, xs2, n, blk, scp, o5);
            for (int k = 0; k < 4; k++) {
                CHECK(same_f32(o2[k], o5[k]), "dot4_fp8sp avx512 %.9g != avx2 %.9g, n=%lld blk=%d row %d", o5[k], o2[k], (long long)n, blk, k);
                const float d2 = df_k_dot_fp8sp_avx2(w + k * ld, xp2, xs2, n, blk, scp[k]);
                const float d5 = df_k_dot_fp8sp_avx512(w + k * ld, xp2, xs2, n, blk, scp[k]);
                CHECK(same_f32(d2, d5), "dot_fp8sp avx512 %.9g != avx2 %.9g, n=%lld blk=%d row %d", d5, d2, (long long)n, blk, k);
            }
            CHECK(isnan(o5[2]) && !isnan(o5[0]), "dot4_fp8sp avx512 NaN row: %g %g", o5[0], o5[2]);
            /* no NaN code in any of the four rows (rows 1 and 3 hold random bytes): the kernels without the
             * check, the same bits */
            for (int64_t i = 0; i < 4 * ld; i++) w[i] = (w[i] & 0x7f) == 0x7f ? 0x01 : w[i];
            df_k_dot4_fp8sp_avx2(w, ld, xp2, xs2, n, blk, scp, o2);
            df_k_dot4_fp8spn_avx512(w, ld, xp2, xs2, n, blk, scp, o5);
            for (int k = 0; k < 4; k++)
                CHECK(same_f32(o2[k], o5[k]), "dot4_fp8spn avx512 %.9g != avx2 %.9g, n=%lld blk=%d row %d", o5[k], o2[k], (long long)n, blk, k);
            free(w), free(x), free(xp2), free(xp5), free(sc);
        }
    df_set_isa(-1);
}

int main(void) {
    df_kernels_init();
    /* FP8 E4M3FN table: the values of the format's definition */
    CHECK(df_fp8_lut[0x00] == 0.0f, "fp8 0");
    CHECK(df_fp8_lut[0x38] == 1.0f, "fp8 1.0 = %g", df_fp8_lut[0x38]);
    CHECK(df_fp8_lut[0x7e] == 448.0f, "fp8 max = %g", df_fp8_lut[0x7e]);
    CHECK(df_fp8_lut[0x01] == ldexpf(1, -9), "fp8 min subnormal");
    CHECK(df_fp8_lut[0xb8] == -1.0f, "fp8 -1");
    CHECK(isnan(df_fp8_lut[0x7f]), "fp8 nan");
    /* every E4M3 code, NaN (S.1111.111) included, through each ISA's row
     * dequantization (SIMD body, scalar tail) = table x scale */
    {
        uint8_t codes[256 + 7];
        float out[256 + 7];
        for (int i = 0; i < 256 + 7; i++) codes[i] = (uint8_t)(i * 97 + 13);
        void (*dq[3])(const uint8_t *, float, float *, int64_t) = {df_k_deq_fp8_scalar, df_k_deq_fp8_avx2, df_k_deq_fp8_avx512};
        for (int isa = 0; isa <= df_isa(); isa++) {
            dq[isa](codes, 0.375f, out, 256 + 7);
            for (int i = 0; i < 256 + 7; i++)
                if (!same_f32(out[i], df_fp8_lut[codes[i]] * 0.375f)) { CHECK(0, "deq_fp8 isa=%s code 0x%02x: %g", df_isa_name(isa), codes[i], out[i]); break; }
        }
    }
    CHECK(df_f16_to_f32(0x3c00) == 1.0f && df_f16_to_f32(0x0001) == ldexpf(1, -24) && df_f16_to_f32(0xc000) == -2.0f, "f16");

    const int64_t sizes[] = {1, 7, 16, 31, 32, 33, 64, 100, 257, 1024, 7168 + 5};
    for (int isa = DF_ISA_AVX2; isa <= DF_ISA_AVX512; isa++) {
        df_set_isa(isa);
        if (df_isa() != isa) { printf("skip %s (not supported here)\n", df_isa_name(isa)); continue; }
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            int64_t n = sizes[si];
            float *x = malloc((size_t)n * 4), *wf = malloc((size_t)n * 4);
            uint16_t *wb = malloc((size_t)n * 2), *wh = malloc((size_t)n * 2);
            uint8_t *w8 = malloc((size_t)n), *w4 = malloc((size_t)(n + 1) / 2 + 64);
            float mag = 0;
            for (int64_t i = 0; i < n; i++) {
                x[i] = frand();
                wf[i] = frand();
                wb[i] = f2bf(frand());
                wh[i] = (uint16_t)(rnd() & 0x7bff); /* finite halves */
                w8[i] = (uint8_t)(rnd() & 0xff);
                if ((w8[i] & 0x7f) == 0x7f) w8[i] = 0x11; /* no NaN */
                mag += fabsf(x[i]) * 448;
            }
            for (int64_t i = 0; i < (n + 1) / 2 + 64; i++) w4[i] = (uint8_t)rnd();
            float (*f32[3])(const float *, const float *, int64_t) = {df_k_dot_f32_scalar, df_k_dot_f32_avx2, df_k_dot_f32_avx512};
            float (*bf[3])(const uint16_t *, const float *, int64_t) = {df_k_dot_bf16_scalar, df_k_dot_bf16_avx2, df_k_dot_bf16_avx512};
            float (*hf[3])(const uint16_t *, const float *, int64_t) = {df_k_dot_f16_scalar, df_k_dot_f16_avx2, df_k_dot_f16_avx512};
            float (*f8[3])(const uint8_t *, const float *, int64_t) = {df_k_dot_fp8_scalar, df_k_dot_fp8_avx2, df_k_dot_fp8_avx512};
            close_enough("f32", isa, n, f32[isa](wf, x, n), f32[0](wf, x, n), mag);
            close_enough("bf16", isa, n, bf[isa](wb, x, n), bf[0](wb, x, n), mag);
            close_enough("f16", isa, n, hf[isa](wh, x, n), hf[0](wh, x, n), mag * 200);
            close_enough("fp8", isa, n, f8[isa](w8, x, n), f8[0](w8, x, n), mag);
            float (*i8[3])(const int8_t *, const float *, int64_t) = {df_k_dot_i8_scalar, df_k_dot_i8_avx2, df_k_dot_i8_avx512};
            close_enough("i8", isa, n, i8[isa]((const int8_t *)w8, x, n), i8[0]((const int8_t *)w8, x, n), mag);
            if (n % 32 == 0) {
                float sc[1024];
                for (int g = 0; g < 1024; g++) sc[g] = frand();
                float (*i4[3])(const uint8_t *, const float *, int, const float *, int64_t) = {df_k_dot_int4_scalar, df_k_dot_int4_avx2, df_k_dot_int4_avx512};
                close_enough("int4", isa, n, i4[isa](w4, sc, 32, x, n), i4[0](w4, sc, 32, x, n), mag);
            }
            free(x); free(wf); free(wb); free(wh); free(w8); free(w4);
        }
        /* four-row kernels and axpy vs scalar (odd sizes, odd row strides) */
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            int64_t n = sizes[si], ld = n + 3;
            float *x = malloc((size_t)n * 4), *wf = malloc((size_t)(4 * ld) * 4), *y0 = malloc((size_t)n * 4), *y1 = malloc((size_t)n * 4);
            uint16_t *wb = malloc((size_t)(4 * ld) * 2), *wh = malloc((size_t)(4 * ld) * 2);
            uint8_t *w8 = malloc((size_t)(4 * ld));
            float mag = 0;
            for (int64_t i = 0; i < n; i++) x[i] = frand(), y0[i] = y1[i] = frand(), mag += fabsf(x[i]) * 448;
            for (int64_t i = 0; i < 4 * ld; i++) {
                wf[i] = frand();
                wb[i] = f2bf(frand());
                wh[i] = (uint16_t)(rnd() & 0x7bff);
                w8[i] = (uint8_t)(rnd() & 0xff);
                if ((w8[i] & 0x7f) == 0x7f) w8[i] = 0x11;
            }
            float got[5] = {0, 0, 0, 0, NAN}, ref[4];
            void (*d4f[3])(const float *, int64_t, const float *, int64_t, float *) = {df_k_dot4_f32_scalar, df_k_dot4_f32_avx2, df_k_dot4_f32_avx512};
            void (*d4b[3])(const uint16_t *, int64_t, const float *, int64_t, float *) = {df_k_dot4_bf16_scalar, df_k_dot4_bf16_avx2, df_k_dot4_bf16_avx512};
            void (*d4h[3])(const uint16_t *, int64_t, const float *, int64_t, float *) = {df_k_dot4_f16_scalar, df_k_dot4_f16_avx2, df_k_dot4_f16_avx512};
            d4f[isa](wf, ld, x, n, got), d4f[0](wf, ld, x, n, ref);
            for (int k = 0; k < 4; k++) close_enough("dot4 f32", isa, n, got[k], ref[k], mag);
            d4b[isa](wb, ld, x, n, got), d4b[0](wb, ld, x, n, ref);
            for (int k = 0; k < 4; k++) close_enough("dot4 bf16", isa, n, got[k], ref[k], mag);
            /* BF16 with x prepared in the ISA's order (xp), against the plain scalar kernels on x */
            {
                void (*prep[3])(const float *, float *, int64_t) = {df_k_bf16x_prep_scalar, df_k_bf16x_prep_avx2, df_k_bf16x_prep_avx512};
                float (*dbp[3])(const uint16_t *, const float *, const float *, int64_t) = {df_k_dot_bf16p_scalar, df_k_dot_bf16p_avx2, df_k_dot_bf16p_avx512};
                void (*d4bp[3])(const uint16_t *, int64_t, const float *, const float *, int64_t, float *) = {df_k_dot4_bf16p_scalar, df_k_dot4_bf16p_avx2, df_k_dot4_bf16p_avx512};
                float *xp = malloc((size_t)n * 4);
                prep[isa](x, xp, n);
                d4bp[isa](wb, ld, x, xp, n, got), d4b[0](wb, ld, x, n, ref);
                for (int k = 0; k < 4; k++) close_enough("dot4 bf16p", isa, n, got[k], ref[k], mag);
                for (int k = 0; k < 4; k++) close_enough("dot bf16p", isa, n, dbp[isa](wb + k * ld, x, xp, n), ref[k], mag);
                free(xp);
            }
            d4h[isa](wh, ld, x, n, got), d4h[0](wh, ld, x, n, ref);
            for (int k = 0; k < 4; k++) close_enough("dot4 f16", isa, n, got[k], ref[k], mag * 200);
            CHECK(isnan(got[4]), "dot4 wrote past out[3]");
            if (n % 32 == 0) {
                float scs[4][64];
                const float *sc[4] = {scs[0], scs[1], scs[2], scs[3]};
                for (int k = 0; k < 4; k++)
                    for (int b = 0; b < 64; b++) scs[k][b] = frand();
                void (*d48[3])(const uint8_t *, int64_t, const float *, int64_t, int, const float *const *, float *) = {df_k_dot4_fp8s_scalar, df_k_dot4_fp8s_avx2, df_k_dot4_fp8s_avx512};
                float (*prep8[3])(const float *, float *, int64_t) = {df_k_fp8x_prep_scalar, df_k_fp8x_prep_avx2, df_k_fp8x_prep_avx512};
                float (*d8sp[3])(const uint8_t *, const float *, float, int64_t, int, const float *) = {df_k_dot_fp8sp_scalar, df_k_dot_fp8sp_avx2, df_k_dot_fp8sp_avx512};
                void (*d48sp[3])(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *) = {df_k_dot4_fp8sp_scalar, df_k_dot4_fp8sp_avx2, df_k_dot4_fp8sp_avx512};
                float *xp = malloc((size_t)n * 4);
                const float xs = prep8[isa](x, xp, n);
                for (int blk = 32; blk <= 128; blk *= 2) {
                    d48[isa](w8, ld, x, n, blk, sc, got), d48[0](w8, ld, x, n, blk, sc, ref);
                    for (int k = 0; k < 4; k++) close_enough("dot4 fp8s", isa, n, got[k], ref[k], mag);
                    /* prepared x: against the plain scalar kernel on x */
                    d48sp[isa](w8, ld, xp, xs, n, blk, sc, got);
                    for (int k = 0; k < 4; k++) close_enough("dot4 fp8sp", isa, n, got[k], ref[k], mag);
                    for (int k = 0; k < 4; k++) close_enough("dot fp8sp", isa, n, d8sp[isa](w8 + k * ld, xp, xs, n, blk, sc[k]), ref[k], mag);
                }
                free(xp);
            }
            void (*ax[3])(float *, float, const float *, int64_t) = {df_k_axpy_scalar, df_k_axpy_avx2, df_k_axpy_avx512};
            ax[isa](y0, 0.37f, x, n), ax[0](y1, 0.37f, x, n);
            for (int64_t i = 0; i < n; i++) close_enough("axpy", isa, n, y0[i], y1[i], 2);
            free(x); free(wf); free(y0); free(y1); free(wb); free(wh); free(w8);
        }
        /* GEMM micro-kernel and panel packing vs scalar: bit-identical (one
         * FMA chain per output on every ISA, kernels.h), every nt and nr,
         * continuing from Y (acc) and from zero, odd kc */
        for (int trial = 0; trial < 4; trial++) {
            const int64_t kc = trial == 0 ? 1 : trial == 1 ? 7 : trial == 2 ? 256 : 301, ld = kc + 5;
            float *src = malloc((size_t)(16 * ld) * 4), *X = malloc((size_t)(6 * ld) * 4);
            float *P0 = df_aligned_alloc((size_t)(16 * kc) * 4), *P1 = df_aligned_alloc((size_t)(16 * kc) * 4);
            for (int64_t i = 0; i < 16 * ld; i++) src[i] = frand();
            for (int64_t i = 0; i < 6 * ld; i++) X[i] = frand();
            void (*pk[3])(const float *, int64_t, int, int64_t, float *) = {df_k_pack16_scalar, df_k_pack16_avx2, df_k_pack16_avx512};
            void (*gm[3])(const float *, int64_t, const float *, int64_t, int, float *, int64_t, int, int) = {df_k_gemm16_scalar, df_k_gemm16_avx2, df_k_gemm16_avx512};
            for (int nr = 1; nr <= 16; nr += (nr == 1 ? 4 : nr == 13 ? 3 : 4)) {
                memset(P1, 0x7f, (size_t)(16 * kc) * 4); /* pad rows must be written as zeros */
                pk[isa](src, ld, nr, kc, P1), pk[0](src, ld, nr, kc, P0);
                CHECK(!memcmp(P0, P1, (size_t)(16 * kc) * 4), "pack16 isa=%s nr=%d kc=%lld", df_isa_name(isa), nr, (long long)kc);
                for (int nt = 1; nt <= 6; nt++)
                    for (int acc = 0; acc < 2; acc++) {
                        float Y[6 * 20], R[6 * 20];
                        for (int i = 0; i < 6 * 20; i++) Y[i] = R[i] = frand();
                        gm[isa](P1, kc, X, ld, nt, Y, 20, nr, acc), gm[0](P0, kc, X, ld, nt, R, 20, nr, acc);
                        CHECK(!memcmp(Y, R, sizeof Y), "gemm16 isa=%s nr=%d nt=%d kc=%lld acc=%d", df_isa_name(isa), nr, nt, (long long)kc, acc);
                        if (nr == 16) { /* two panels in one call = two one-panel calls */
                            float Y2[6 * 40], R2[6 * 40];
                            for (int i = 0; i < 6 * 40; i++) Y2[i] = R2[i] = frand();
                            void (*g32[3])(const float *, int64_t, int64_t, const float *, int64_t, int, float *, int64_t, int) = {df_k_gemm32_scalar, df_k_gemm32_avx2, df_k_gemm32_avx512};
                            g32[isa](P1, 0, kc, X, ld, nt, Y2, 40, acc);
                            gm[0](P0, kc, X, ld, nt, R2, 40, 16, acc), gm[0](P0, kc, X, ld, nt, R2 + 16, 40, 16, acc);
                            CHECK(!memcmp(Y2, R2, sizeof Y2), "gemm32 isa=%s nt=%d kc=%lld acc=%d", df_isa_name(isa), nt, (long long)kc, acc);
                        }
                        if (!acc) { /* and the scalar reference against a double sum */
                            double ref = 0, mag = 0;
                            for (int64_t k = 0; k < kc; k++) ref += (double)src[k] * X[k], mag += fabs((double)src[k] * X[k]);
                            CHECK(fabs(R[0] - ref) <= 1e-5 * mag + 1e-30, "gemm16 scalar vs double kc=%lld got %g ref %g", (long long)kc, R[0], ref);
                        }
                    }
            }
            free(src), free(X), free(P0), free(P1);
        }
    }
    /* FP8 block-scaled row dot through df_dot_row equals dequant + f32 dot */
    {
        df_set_isa(-1);
        enum { R = 5, C = 70 };
        uint8_t w[R * C];
        float sc[2 * 3], x[C], row[C];
        for (int i = 0; i < R * C; i++) { w[i] = (uint8_t)(rnd() & 0x7e); }
        for (int i = 0; i < 6; i++) sc[i] = frand();
        for (int i = 0; i < C; i++) x[i] = frand();
        df_weight W = {.fmt = DF_W_FP8, .rows = R, .cols = C, .data = w, .row_bytes = C, .scale = sc, .scale_dtype = DF_SCALE_F32, .blk_r = 3, .blk_c = 32, .scale_cols = 3};
        for (int r = 0; r < R; r++) {
            df_dequant_row(&W, r, row);
            double ref = 0;
            for (int i = 0; i < C; i++) ref += (double)row[i] * x[i];
            float got = df_dot_row(&W, r, x);
            CHECK(fabs(got - ref) < 1e-3, "fp8 block row %d got %g ref %g", r, got, ref);
            CHECK(row[40] == df_fp8_lut[w[r * C + 40]] * sc[(r / 3) * 3 + 1], "fp8 block scale index row %d", r);
        }
    }
    test_mxfp4();
    test_fp8_nan();
    test_fp8_prepared();
    test_fp8_avx512_is_avx2();
    test_fp8_nan_flag();
    test_fp8_slot_memo();
    test_traits();
    test_gemm();
    test_gemm_chain();
    test_decode_rows();
    test_decode_kernel_contract();
    printf("%s: %d failures\n", __FILE__, fails);
    return fails != 0;
}
