/* bench.c - `deltafin bench floors`: the physical floors benchmarks are
 * compared against, measured on this machine in the same run: memory read
 * bandwidth (one thread and all threads, a buffer far larger than the
 * caches) and peak f32 FMA throughput of the best ISA (register-resident
 * dependency-free FMA chains on every thread). Prints one JSON object. */
#include "backend/backend.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct {
    const float *buf;
    size_t n;
    int use;      /* threads participating */
    double sums[256];
} bw_ctx;

__attribute__((target("avx2,fma"))) static float sum_avx2(const float *p, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

static void bw_task(void *p, int tid, int nth) {
    bw_ctx *c = p;
    (void)nth;
    if (tid >= c->use) return;
    size_t per = c->n / (size_t)c->use / 64 * 64;
    c->sums[tid] = sum_avx2(c->buf + per * (size_t)tid, per);
}

static double measure_bw(const float *buf, size_t n, int use) {
    bw_ctx c = {buf, n, use, {0}};
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = df_now();
        df_pool_run(bw_task, &c);
        double dt = df_now() - t0;
        size_t per = n / (size_t)use / 64 * 64;
        double gbs = (double)per * use * 4 / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

typedef struct { double flops[256]; long iters; } fma_ctx;

__attribute__((target("avx512f"))) static void fma512(fma_ctx *c, int tid) {
    __m512 a[12], m = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < c->iters; it++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, b);
    float s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
    c->flops[tid] = s; /* keep the result alive */
}
__attribute__((target("avx2,fma"))) static void fma256(fma_ctx *c, int tid) {
    __m256 a[12], m = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < c->iters; it++)
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, b);
    float t[8], s = 0;
    for (int i = 0; i < 12; i++) { _mm256_storeu_ps(t, a[i]); s += t[0]; }
    c->flops[tid] = s;
}
static void fma_task(void *p, int tid, int nth) {
    (void)nth;
    if (df_isa() == DF_ISA_AVX512) fma512(p, tid);
    else fma256(p, tid);
}

int df_cmd_bench(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "floors")) {
        fprintf(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
                "usage: deltafin bench floors [--threads N]\n"
                "  Measures this machine's floors: memory read GB/s (1 thread, all threads) and peak f32 FMA GFLOP/s.\n");
        return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    int threads = 0;
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    df_pool_init(threads);
    int nth = df_pool_size();
    size_t n = (size_t)1 << 28; /* 1 GiB of floats */
    float *buf = df_aligned_alloc(n * 4);
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023);
    double bw1 = measure_bw(buf, n, 1), bwn = measure_bw(buf, n, nth);
    free(buf);
    fma_ctx fc = {{0}, 20000000};
    double t0 = df_now();
    df_pool_run(fma_task, &fc);
    double dt = df_now() - t0;
    int lanes = df_isa() == DF_ISA_AVX512 ? 16 : 8;
    double gflops = (double)fc.iters * 12 * lanes * 2 * nth / dt / 1e9;
    printf("{\"threads\": %d, \"isa\": \"%s\", \"mem_read_gbs_1t\": %.2f, \"mem_read_gbs\": %.2f, \"peak_fma_gflops\": %.1f}\n", nth,
           df_isa_name(df_isa()), bw1, bwn, gflops);
    return 0;
}
