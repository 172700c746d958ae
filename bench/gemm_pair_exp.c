/* gemm_pair_exp.c - docs/PERFORMANCE.md "Issue 17: FP8 decode and two-thread
 * GEMM, round 5": does one thread's half of the two-thread prefill GEMM run
 * slower because the other core runs its half (shared FMA units: vCPUs that
 * are SMT siblings; shared L3; the clock), and which part? A measuring aid,
 * not built by the Makefile:
 *
 *   make build/bench/kernel_bench   # the objects it links
 *   cc -std=c11 -D_GNU_SOURCE -O2 -mavx2 -mfma -Iinclude -Isrc -pthread -o /tmp/gpx bench/gemm_pair_exp.c
 *      build/src/backend/cpu/kernels_avx2.o build/src/backend/cpu/kernels_scalar.o
 *      build/src/backend/cpu/kernels_avx512.o build/src/util/util.o -lm   (one line)
 *   /tmp/gpx [ROUNDS]
 *
 * Two threads pinned to CPUs 0 and 1. Each round runs every test three ways,
 * in rotated order: thread A alone, thread B alone (the other CPU idle as far
 * as this process goes), both at once (started on a barrier). Per thread it
 * reports the work rate per second of that thread's own CPU time
 * (CLOCK_THREAD_CPUTIME_ID: time the host scheduler gives other processes is
 * not counted, so the numbers mean something on a loaded machine, unlike
 * wall time) and per second of wall time. Tests:
 *   fma:  12 independent FMA chains in registers (floors.c's peak loop), no
 *         memory: if the two vCPUs share one core's FMA units, each thread's
 *         rate halves when both run;
 *   l2:   the GEMM micro-kernel (df_k_gemm32_avx2, 3 tokens, and gemm16, 6
 *         tokens: mm_rows' calls) over one packed 64 x 512 panel block
 *         (128 KB, L2) and a 64-token x block, as mm_rows' inner loops: the
 *         kernel with its data in the core's own caches;
 *   gemm: mm_rows' whole loop for F32 weights (cpu.c: pack 64-row blocks of
 *         W k-major, K in slices of 512, token blocks of 6), each thread its
 *         own half of a 2048 x 2048 weight, x of 64 tokens shared: what the
 *         engine's two-thread product does, in per-thread pieces;
 *   pack: only the packing of that loop.
 * GFLOP/s (2 x rows x K x tokens; pack: GB/s of weights read). */
#include "backend/cpu/kernels.h"
#include "util/util.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { K = 2048, R = 2048, NT = 64, MR = 16 };
static int MC = 64, KC = 512; /* GPX_MC, GPX_KC: mm_rows' GEMM_MC, GEMM_KC */
static float *W, *X, *Y[2];
static float *PK[2];
static int64_t LDX = K; /* GPX_LDX: the x rows' stride in floats (the engine's: K) */

static double tcpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static double twall(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double fma_loop(long iters) {
    const __m256 m = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    for (long it = 0; it < iters; it++) {
        a0 = _mm256_fmadd_ps(a0, m, b), a1 = _mm256_fmadd_ps(a1, m, b), a2 = _mm256_fmadd_ps(a2, m, b), a3 = _mm256_fmadd_ps(a3, m, b);
        a4 = _mm256_fmadd_ps(a4, m, b), a5 = _mm256_fmadd_ps(a5, m, b), a6 = _mm256_fmadd_ps(a6, m, b), a7 = _mm256_fmadd_ps(a7, m, b);
        a8 = _mm256_fmadd_ps(a8, m, b), a9 = _mm256_fmadd_ps(a9, m, b), a10 = _mm256_fmadd_ps(a10, m, b), a11 = _mm256_fmadd_ps(a11, m, b);
    }
    a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)), _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    if (_mm256_cvtss_f32(a0) == 12345.0f) printf("!");
    return 2.0 * 8 * 12 * (double)iters;
}

/* mm_rows (cpu.c) for F32 rows [b, e), without the dequantization */
static double gemm_rows(int tid, int64_t b, int64_t e, int pack_only) {
    float *pk = PK[tid], *y = Y[tid];
    double flops = 0;
    for (int64_t r = b; r < e; r += MC) {
        const int64_t mc = e - r < MC ? e - r : MC;
        const int np = (int)((mc + MR - 1) / MR);
        for (int p = 0; p < np; p++) df_k_pack16_avx2(W + (r + p * MR) * K, K, MR, K, pk + (size_t)p * MR * K);
        if (pack_only) { flops += 4.0 * (double)mc * K; continue; }
        for (int64_t k0 = 0; k0 < K; k0 += KC)
            for (int t = 0; t < NT;) {
                const int left = NT - t, nt = (left + (left + 5) / 6 - 1) / ((left + 5) / 6);
                for (int p = 0; p < np; p++) {
                    const int64_t r0 = r + (int64_t)p * MR;
                    if (nt <= 3 && (p + 2) * MR <= mc) {
                        df_k_gemm32_avx2(pk + (size_t)p * MR * K + (size_t)k0 * MR, (int64_t)MR * K, KC, X + (int64_t)t * LDX + k0, LDX, nt,
                                         y + (int64_t)t * R + r0, R, k0 > 0);
                        p++;
                        continue;
                    }
                    df_k_gemm16_avx2(pk + (size_t)p * MR * K + (size_t)k0 * MR, KC, X + (int64_t)t * LDX + k0, LDX, nt, y + (int64_t)t * R + r0, R,
                                     MR, k0 > 0);
                }
                t += nt;
            }
        flops += 2.0 * (double)mc * K * NT;
    }
    return flops;
}

/* the micro-kernel over one packed 64 x KC block (as packed by gemm_rows), all 64 tokens */
static double l2_block(int tid, int reps) {
    float *pk = PK[tid], *y = Y[tid];
    double flops = 0;
    for (int rep = 0; rep < reps; rep++)
        for (int t = 0; t < NT;) {
            const int left = NT - t, nt = (left + (left + 5) / 6 - 1) / ((left + 5) / 6);
            for (int p = 0; p < MC / MR; p++) {
                if (nt <= 3) {
                    df_k_gemm32_avx2(pk + (size_t)p * MR * K, (int64_t)MR * K, KC, X + (int64_t)t * LDX, LDX, nt, y + (int64_t)t * R + p * MR, R, 1);
                    p++;
                    continue;
                }
                df_k_gemm16_avx2(pk + (size_t)p * MR * K, KC, X + (int64_t)t * LDX, LDX, nt, y + (int64_t)t * R + p * MR, R, MR, 1);
            }
            t += nt;
        }
    flops += 2.0 * MC * KC * NT * (double)reps;
    return flops;
}

typedef struct {
    int tid, test;
    pthread_barrier_t *bar;
    double work, cpu, wall;
} job;
static void *run(void *p) {
    job *j = p;
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(j->tid, &cs);
    pthread_setaffinity_np(pthread_self(), sizeof cs, &cs);
    if (j->bar) pthread_barrier_wait(j->bar);
    const double c0 = tcpu(), w0 = twall();
    switch (j->test) {
    case 0: j->work = fma_loop(4000000); break;
    case 1: j->work = l2_block(j->tid, 40); break;
    case 2: j->work = gemm_rows(j->tid, (int64_t)j->tid * R / 2, (int64_t)(j->tid + 1) * R / 2, 0); break;
    case 3: j->work = 0; for (int i = 0; i < 8; i++) j->work += gemm_rows(j->tid, (int64_t)j->tid * R / 2, (int64_t)(j->tid + 1) * R / 2, 1); break;
    }
    j->cpu = tcpu() - c0, j->wall = twall() - w0;
    return NULL;
}

int main(int argc, char **argv) {
    df_kernels_init();
    const int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (getenv("GPX_LDX")) LDX = atoll(getenv("GPX_LDX"));
    if (getenv("GPX_MC")) MC = atoi(getenv("GPX_MC"));
    if (getenv("GPX_KC")) KC = atoi(getenv("GPX_KC"));
    W = df_aligned_alloc((size_t)R * K * 4), X = df_aligned_alloc((size_t)NT * LDX * 4);
    for (size_t i = 0; i < (size_t)R * K; i++) W[i] = (float)((int)(i * 2654435761u % 2001) - 1000) * 1e-3f;
    for (size_t i = 0; i < (size_t)NT * LDX; i++) X[i] = (float)((int)(i * 40503u % 2001) - 1000) * 1e-3f;
    for (int t = 0; t < 2; t++) {
        Y[t] = df_aligned_alloc((size_t)NT * R * 4), PK[t] = df_aligned_alloc((size_t)MC * K * 4);
        memset(Y[t], 0, (size_t)NT * R * 4);
        gemm_rows(t, t * MC, (t + 1) * MC, 1); /* a packed block for l2 */
    }
    static const char *names[] = {"fma", "l2", "gemm", "pack"};
    /* [test][way: 0 A alone, 1 B alone, 2 both: A, 3 both: B][round] */
    static double rc[4][4][64], rw[4][4][64];
    for (int rd = 0; rd < rounds && rd < 64; rd++)
        for (int ti = 0; ti < 4; ti++)
            for (int wi = 0; wi < 3; wi++) {
                const int way = (wi + rd) % 3;
                job j[2] = {{0, ti, NULL, 0, 0, 0}, {1, ti, NULL, 0, 0, 0}};
                pthread_t th[2];
                pthread_barrier_t bar;
                if (way < 2) {
                    pthread_create(&th[0], NULL, run, &j[way]);
                    pthread_join(th[0], NULL);
                    rc[ti][way][rd] = j[way].work / j[way].cpu * 1e-9, rw[ti][way][rd] = j[way].work / j[way].wall * 1e-9;
                } else {
                    pthread_barrier_init(&bar, NULL, 2);
                    j[0].bar = j[1].bar = &bar;
                    for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, run, &j[t]);
                    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
                    pthread_barrier_destroy(&bar);
                    for (int t = 0; t < 2; t++)
                        rc[ti][2 + t][rd] = j[t].work / j[t].cpu * 1e-9, rw[ti][2 + t][rd] = j[t].work / j[t].wall * 1e-9;
                }
            }
    printf("per thread, median over %d rounds [all]: G/s per CPU-second of the thread | per wall second\n", rounds);
    for (int ti = 0; ti < 4; ti++)
        for (int way = 0; way < 4; way++) {
            static const char *wn[] = {"A alone", "B alone", "both: A", "both: B"};
            double c[64], w[64];
            const int n = rounds < 64 ? rounds : 64;
            memcpy(c, rc[ti][way], sizeof c), memcpy(w, rw[ti][way], sizeof w);
            for (int i = 0; i < n; i++)
                for (int k = i + 1; k < n; k++) {
                    if (c[k] < c[i]) { double t = c[i]; c[i] = c[k], c[k] = t; }
                    if (w[k] < w[i]) { double t = w[i]; w[i] = w[k], w[k] = t; }
                }
            printf("%-5s %-8s cpu %7.2f  wall %7.2f  [cpu", names[ti], wn[way], c[n / 2], w[n / 2]);
            for (int i = 0; i < n; i++) printf(" %.1f", rc[ti][way][i]);
            printf("]\n");
        }
    return 0;
}
