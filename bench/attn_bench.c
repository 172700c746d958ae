/* attn_bench.c - the CPU attention core on a batch of positions against the
 * same positions one at a time (a speculative verify pass against plain
 * steps; prefill tiles), on SmolLM2-135M's shape by default: 9 heads, 3 KV
 * heads, head_dim 64. Arms are interleaved and repeated; medians printed.
 *
 * Each of the 30 layers has its own KV cache (as in the model: 1,346 positions are 62 MB, more than
 * this machine's caches), so the memory side is measured, not an L2-resident copy.
 *
 * Build (after make): bench/attn_bench.sh builds it from build/'s objects and runs it.
 * Run: build/attn_bench [threads=2] [n=9] [ctx=1000] [reps=15] */
#include "backend/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2, n = argc > 2 ? atoi(argv[2]) : 9, ctx = argc > 3 ? atoi(argv[3]) : 1000,
              reps = argc > 4 ? atoi(argv[4]) : 15;
    const int NH = 9, KV = 3, hd = 64, T = ctx + n, layers = 30; /* one "pass" = the 30 layers' attention */
    df_pool_init(threads);
    const size_t lkv = (size_t)T * 2 * KV * hd; /* one layer's cache, floats */
    float *q = malloc((size_t)n * NH * hd * 4), *kv = malloc(lkv * layers * 4), *o = malloc((size_t)n * NH * hd * 4);
    srand(1);
    for (size_t i = 0; i < (size_t)n * NH * hd; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < lkv * layers; i++) kv[i] = (float)rand() / RAND_MAX - 0.5f;
    double *tb = malloc(reps * sizeof(double)), *ts = malloc(reps * sizeof(double));
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int l = 0; l < layers; l++) {
            df_attn_gqa_args a = {(df_act *)q, (df_act *)(kv + lkv * l), (df_act *)o, n, ctx, NH, KV, hd, 0.125f};
            df_cpu_attn_gqa(&a);
        }
        double t1 = now();
        for (int l = 0; l < layers; l++)
            for (int t = 0; t < n; t++) {
                df_attn_gqa_args a = {(df_act *)(q + (size_t)t * NH * hd), (df_act *)(kv + lkv * l), (df_act *)(o + (size_t)t * NH * hd), 1, ctx + t, NH, KV, hd, 0.125f};
                df_cpu_attn_gqa(&a);
            }
        double t2 = now();
        tb[r] = t1 - t0, ts[r] = t2 - t1;
    }
    qsort(tb, reps, sizeof *tb, cmp_d), qsort(ts, reps, sizeof *ts, cmp_d);
    printf("attention, %d layers, %d positions at context %d, %d threads: batched %.3f ms, one at a time %.3f ms (medians of %d), ratio %.2f\n",
           layers, n, ctx, df_pool_size(), 1e3 * tb[reps / 2], 1e3 * ts[reps / 2], reps, ts[reps / 2] / tb[reps / 2]);
    return 0;
}
