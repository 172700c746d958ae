/* fp8_decode_exp.c - docs/PERFORMANCE.md "Issue 17: FP8 decode, round 6":
 * the engine's FP8 decode product (df_cpu_matmul_batch, n = 1: dot_rows and
 * its four-row kernel) on a ROWS x COLS FP8 weight with 128x128 block scales,
 * ITERS products after one warm-up (the warm-up does the one-time NaN-code
 * scan), on THREADS threads. A measuring aid, not built by the Makefile:
 *
 *   make build/bench/kernel_bench
 *   cc -std=c11 -O2 -g -Iinclude -Isrc -o /tmp/f8d bench/fp8_decode_exp.c \
 *      $(make -pn | grep -m1 '^build/bench/kernel_bench:' | cut -d: -f2- | tr ' ' '\n' | grep '\.o$') \
 *      -lm -pthread -ljansson -luring          (the kernel_bench objects)
 *   valgrind --tool=callgrind --toggle-collect=df_cpu_matmul_batch /tmp/f8d COLS ROWS 3 1
 *
 * Instructions per weight: (collected - df_weight_nan_codes's) / ((ITERS + 1) x ROWS x COLS);
 * round 6 used ROWS = 2 M / COLS rounded down to 16. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "backend/backend.h"
#include "util/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc < 4 || atoll(argv[1]) < 1 || atoll(argv[2]) < 1) {
        fprintf(stderr, "usage: fp8_decode_exp COLS ROWS ITERS [THREADS]\n");
        return 2;
    }
    const int64_t C = atoll(argv[1]), R = atoll(argv[2]); const int N = atoi(argv[3]); const int th = argc > 4 ? atoi(argv[4]) : 1;
    df_pool_init(th);
    df_weight w; memset(&w, 0, sizeof w);
    w.fmt = DF_W_FP8, w.rows = R, w.cols = C, w.blk_r = 128, w.blk_c = 128, w.scale_cols = (C + 127) / 128, w.row_bytes = (size_t)C;
    uint8_t *d = df_aligned_alloc((size_t)R * C);
    for (int64_t i = 0; i < R * C; i++) { uint8_t c = (uint8_t)((i * 2654435761u) >> 13); d[i] = (c & 0x7f) == 0x7f ? 0x31 : c; }
    int64_t ns = (R + 127) / 128 * w.scale_cols; float *s = malloc(ns * 4); for (int64_t i = 0; i < ns; i++) s[i] = 0.001f * (1 + i % 9);
    w.data = d, w.scale = s, w.scale_dtype = DF_SCALE_F32;
    float *x = df_aligned_alloc(C * 4), *y = df_aligned_alloc(R * 4);
    for (int64_t i = 0; i < C; i++) x[i] = (float)(i % 23) * 0.01f - 0.1f;
    const df_mv_job j = {&w, (const df_act *)(const void *)x, (df_act *)(void *)y};
    df_cpu_matmul_batch(&j, 1, 1);
    for (int i = 0; i < N; i++) df_cpu_matmul_batch(&j, 1, 1);
    printf("%g\n", y[0] + y[R - 1]);
    return 0;
}
