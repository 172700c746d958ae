/* test_backend_exact.c - exact products (backend.h: exact_products): while
 * the mode is on, a product of n tokens gives for every token the bits of
 * the one-token product of that token's x alone, in every stored format
 * (F32, F16, BF16, FP8 blocks, INT4 packs, row-int8, MXFP4 and every GGML
 * block type, K-quants included), for row counts that are not multiples of
 * 4, rows short and long (the float formats switch between one-row and
 * four-row kernels at 2 KB), one job or several in one dispatch, on one
 * thread (the pool serial) and on two, on the scalar and the AVX2 kernels.
 * The reference is the product with n = 1, run token by token; without the
 * mode the same n-token products are the batched ones, which round
 * differently (checked too, so that the test sees a difference to catch).
 *
 * Usage: test_backend_exact [--bench] (--bench: instructions of a 5-token
 * exact pass against 5 one-token products, for callgrind). */
#include "backend/cpu/cpu.h"
#include "backend/ggml_quant.h"
#include "format/gguf.h"
#include "util/util.h"
#include "test_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails, checks;
#define CHECK(c, ...) do { checks++; if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float frand(void) { return (float)((int)(rnd() % 20001) - 10000) / 10000.0f; }

static void batch(const df_weight *const *w, int nw, const float *X, int n, float *const *Y) {
    df_mv_job j[4];
    for (int i = 0; i < nw; i++) j[i] = (df_mv_job){w[i], (const df_act *)(const void *)X, (df_act *)(void *)Y[i]};
    df_cpu_matmul_batch(j, nw, n);
}

/* the first differing float of a and b (n), or -1 */
static long first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) if (memcmp(a + i, b + i, 4)) return (long)i;
    return -1;
}

static const struct { int fmt, gtype; const char *name; } F[] = {
    {DF_W_F32, 0, "f32"}, {DF_W_F16, 0, "f16"}, {DF_W_BF16, 0, "bf16"}, {DF_W_FP8, 0, "fp8"}, {DF_W_INT4, 0, "int4"},
    {DF_W_I8ROW, 0, "i8row"}, {DF_W_MXFP4, 0, "mxfp4"},
    {DF_W_GGML, DF_GGML_F32, "g-f32"}, {DF_W_GGML, DF_GGML_F16, "g-f16"}, {DF_W_GGML, DF_GGML_BF16, "g-bf16"},
    {DF_W_GGML, DF_GGML_Q4_0, "q4_0"}, {DF_W_GGML, DF_GGML_Q4_1, "q4_1"}, {DF_W_GGML, DF_GGML_Q5_0, "q5_0"},
    {DF_W_GGML, DF_GGML_Q5_1, "q5_1"}, {DF_W_GGML, DF_GGML_Q8_0, "q8_0"}, {DF_W_GGML, DF_GGML_Q2_K, "q2_k"},
    {DF_W_GGML, DF_GGML_Q3_K, "q3_k"}, {DF_W_GGML, DF_GGML_Q4_K, "q4_k"}, {DF_W_GGML, DF_GGML_Q5_K, "q5_k"},
    {DF_W_GGML, DF_GGML_Q6_K, "q6_k"}, {DF_W_GGML, DF_GGML_MXFP4, "g-mxfp4"}};
#define NF (int)(sizeof F / sizeof *F)

enum { NMAX = 21 };

static void test_format(int f, int64_t R, int64_t C, int *differed) {
    gw a, b;
    gw_make(&a, F[f].fmt, F[f].gtype, R, C);
    gw_make(&b, F[f].fmt, F[f].gtype, R / 2 + 3, C); /* a second job of another row count */
    const df_weight *ws[2] = {&a.w, &b.w};
    const int64_t Rs[2] = {a.w.rows, b.w.rows};
    float *X = malloc((size_t)(NMAX * C) * 4);
    for (int64_t i = 0; i < NMAX * C; i++) X[i] = frand();
    float *want[2], *got[2], *one[2];
    for (int j = 0; j < 2; j++)
        want[j] = malloc((size_t)(NMAX * Rs[j]) * 4), got[j] = malloc((size_t)(NMAX * Rs[j]) * 4), one[j] = malloc((size_t)Rs[j] * 4);
    static const int ns[] = {2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, NMAX}; /* every group split of the fused kernels (up to 6 and 8 tokens per decode) */
    const int best = (df_set_isa(-1), df_isa());
    for (int isa = 0; isa <= (best < 1 ? best : 1); isa++) {
        df_set_isa(isa), df_ggml_set_isa(isa);
        /* the reference: each token alone (two threads), as one job and as a two-job dispatch */
        df_pool_serial(0);
        for (int t = 0; t < NMAX; t++) {
            for (int j = 0; j < 2; j++) batch(&ws[j], 1, X + (size_t)t * C, 1, &one[j]), memcpy(want[j] + (size_t)t * Rs[j], one[j], (size_t)Rs[j] * 4);
            float *y2[2] = {got[0], got[1]};
            batch(ws, 2, X + (size_t)t * C, 1, y2);
            for (int j = 0; j < 2; j++)
                CHECK(first_diff(got[j], want[j] + (size_t)t * Rs[j], (size_t)Rs[j]) < 0, "%s %lldx%lld isa %d: one token, batch of 2 jobs != alone", F[f].name, (long long)R, (long long)C, isa);
        }
        for (int serial = 0; serial <= 1; serial++) {
            df_pool_serial(serial);
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                const int n = ns[ni];
                /* the scalar kernels have no fused groups (only the EXACT_TOKENS chunks of prepared x): a few
                 * counts below and above 16 cover them; the scalar runs were ~80% of this test's time (CI's budget) */
                if (isa == 0 && n != 2 && n != 5 && n != 17 && n != NMAX) continue;
                for (int nw = 1; nw <= 2; nw++) {
                    CHECK(df_cpu_exact_products(1) == 1, "exact mode honoured");
                    batch(ws, nw, X, n, got);
                    df_cpu_exact_products(0);
                    for (int j = 0; j < nw; j++) {
                        long d = first_diff(got[j], want[j], (size_t)(n * Rs[j]));
                        CHECK(d < 0, "%s %lldx%lld isa %s %s n=%d jobs=%d job %d: token %ld row %ld: %.9g, one-token %.9g", F[f].name,
                              (long long)R, (long long)C, df_isa_name(isa), serial ? "1 thread" : "2 threads", n, nw, j,
                              d / (long)Rs[j], d % (long)Rs[j], d < 0 ? 0.0 : got[j][d], d < 0 ? 0.0 : want[j][d]);
                    }
                }
                /* the mode off: the batched path (counts formats where it differs) */
                batch(ws, 1, X, n, got);
                if (first_diff(got[0], want[0], (size_t)(n * Rs[0])) >= 0) (*differed)++;
            }
        }
        df_pool_serial(0);
    }
    df_set_isa(-1), df_ggml_set_isa(DF_GGML_ISA_AUTO);
    for (int j = 0; j < 2; j++) free(want[j]), free(got[j]), free(one[j]);
    free(X), free(a.data), free(a.scale), free(b.data), free(b.scale);
}

/* instructions of a 5-token exact pass, 5 one-token products and the batched pass of one Q4_1 product (callgrind) */
static void bench(void) {
    gw a;
    gw_make(&a, DF_W_GGML, DF_GGML_Q4_1, 1536, 576);
    float *X = malloc(5 * 576 * 4), *Y = malloc(5 * 1536 * 4);
    for (int i = 0; i < 5 * 576; i++) X[i] = frand();
    const df_weight *w = &a.w;
    float *y[1] = {Y};
    for (int rep = 0; rep < 20; rep++) {
        for (int t = 0; t < 5; t++) y[0] = Y + t * 1536, batch(&w, 1, X + t * 576, 1, y);
        y[0] = Y;
        df_cpu_exact_products(1), batch(&w, 1, X, 5, y), df_cpu_exact_products(0);
        batch(&w, 1, X, 5, y);
    }
    free(X), free(Y), free(a.data);
}

int main(int argc, char **argv) {
    df_pool_init(2);
    if (argc > 1 && !strcmp(argv[1], "--bench")) { bench(); return 0; }
    /* rows: 4k+1 and 4k+2 (the one-row tail); columns: short rows (one-row float kernels) and rows of 2 KB+ (four-row) */
    /* 9 x 33024: rows over 32768 (Q4_1's fused kernel gathers the tokens' offsets for up to 1024 blocks, else
     * it runs groups of 3) and x over L1 (its rows are run in segments) */
    static const int64_t shapes[][2] = {{37, 256}, {70, 576}, {21, 1024}, {13, 2304}, {66, 4352}, {9, 33024}};
    int differed = 0;
    for (int f = 0; f < NF; f++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const int64_t R = shapes[si][0], C = shapes[si][1];
            if (F[f].fmt == DF_W_GGML && C % df_ggml_traits_of(F[f].gtype)->block_elems) continue;
            test_format(f, R, C, &differed);
        }
    CHECK(differed > 0, "the batched products never differed from the one-token ones: the test would not see a difference");
    printf("test_backend_exact: %d checks, %d failures (the batched path differed in %d cases)\n", checks, fails, differed);
    return fails ? 1 : 0;
}
