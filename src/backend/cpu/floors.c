/* floors.c - the physical floors a benchmark is set against, measured in the
 * same run (`deltafin bench floors`, the `bench` workloads, bench/kernel_bench):
 *
 *  - memory read bandwidth, one thread and all threads: each thread streams
 *    its own slice of a large buffer (1 GiB for `bench floors`: far larger
 *    than any cache), summing it with the widest loads of the ISA. Several
 *    read methods are tried (plain loads into 8 accumulators, the same with a
 *    software prefetch ahead, two interleaved streams per thread) and the best
 *    is reported, with its name: the floor is what the hardware gives, not
 *    what one loop gets. The buffer is advised MADV_HUGEPAGE, as the engine's
 *    resident weights.
 *  - peak f32 FMA throughput of the best ISA: 12 independent FMA chains held
 *    in registers (explicit variables: an array would be kept in memory and
 *    measure store forwarding instead) on every thread.
 * The threads are started here, all at once (on_threads), not run as pool
 * shares: a pool share may be run by any thread, so under load one thread
 * could run every share in turn and the floor would read as one core's. */
#include "backend/cpu/floors.h"
#include "backend/cpu/cpu.h"
#include "util/util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { M_PLAIN, M_PREFETCH, M_TWO_STREAMS, M_N };
static const char *method_name[M_N] = {"loads", "loads+prefetch", "two-streams"};

typedef struct {
    const float *buf;
    size_t n;
    int use;    /* threads participating */
    int method;
    int isa;
    double *sums; /* [threads of the pool] */
} bw_ctx;

#define PF_AHEAD 2048 /* bytes */

__attribute__((target("avx512f"))) static float sum_avx512(const float *p, size_t n, int method) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    if (method == M_TWO_STREAMS) {
        const float *q = p + n / 2;
        for (size_t i = 0; i + 64 <= n / 2; i += 64) {
            a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
            a1 = _mm512_add_ps(a1, _mm512_load_ps(q + i));
            a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 16));
            a3 = _mm512_add_ps(a3, _mm512_load_ps(q + i + 16));
            a4 = _mm512_add_ps(a4, _mm512_load_ps(p + i + 32));
            a5 = _mm512_add_ps(a5, _mm512_load_ps(q + i + 32));
            a6 = _mm512_add_ps(a6, _mm512_load_ps(p + i + 48));
            a7 = _mm512_add_ps(a7, _mm512_load_ps(q + i + 48));
        }
    } else {
        for (size_t i = 0; i + 128 <= n; i += 128) {
            if (method == M_PREFETCH) {
                _mm_prefetch((const char *)(p + i) + PF_AHEAD, _MM_HINT_T0);
                _mm_prefetch((const char *)(p + i) + PF_AHEAD + 64 * 4, _MM_HINT_T0);
            }
            a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
            a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
            a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
            a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
            a4 = _mm512_add_ps(a4, _mm512_load_ps(p + i + 64));
            a5 = _mm512_add_ps(a5, _mm512_load_ps(p + i + 80));
            a6 = _mm512_add_ps(a6, _mm512_load_ps(p + i + 96));
            a7 = _mm512_add_ps(a7, _mm512_load_ps(p + i + 112));
        }
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float sum_avx2(const float *p, size_t n, int method) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const size_t half = method == M_TWO_STREAMS ? n / 2 : 0;
    const size_t end = method == M_TWO_STREAMS ? n / 2 : n;
    for (size_t i = 0; i + 64 <= end; i += 64) {
        const float *q = p + i + half, *r = p + i;
        if (method == M_PREFETCH) {
            _mm_prefetch((const char *)r + PF_AHEAD, _MM_HINT_T0);
            _mm_prefetch((const char *)r + PF_AHEAD + 128, _MM_HINT_T0);
        }
        if (method == M_TWO_STREAMS) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(r)), a1 = _mm256_add_ps(a1, _mm256_load_ps(q));
            a2 = _mm256_add_ps(a2, _mm256_load_ps(r + 8)), a3 = _mm256_add_ps(a3, _mm256_load_ps(q + 8));
            a4 = _mm256_add_ps(a4, _mm256_load_ps(r + 16)), a5 = _mm256_add_ps(a5, _mm256_load_ps(q + 16));
            a6 = _mm256_add_ps(a6, _mm256_load_ps(r + 24)), a7 = _mm256_add_ps(a7, _mm256_load_ps(q + 24));
            a0 = _mm256_add_ps(a0, _mm256_load_ps(r + 32)), a1 = _mm256_add_ps(a1, _mm256_load_ps(q + 32));
            a2 = _mm256_add_ps(a2, _mm256_load_ps(r + 40)), a3 = _mm256_add_ps(a3, _mm256_load_ps(q + 40));
            a4 = _mm256_add_ps(a4, _mm256_load_ps(r + 48)), a5 = _mm256_add_ps(a5, _mm256_load_ps(q + 48));
            a6 = _mm256_add_ps(a6, _mm256_load_ps(r + 56)), a7 = _mm256_add_ps(a7, _mm256_load_ps(q + 56));
        } else {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(r)), a1 = _mm256_add_ps(a1, _mm256_load_ps(r + 8));
            a2 = _mm256_add_ps(a2, _mm256_load_ps(r + 16)), a3 = _mm256_add_ps(a3, _mm256_load_ps(r + 24));
            a4 = _mm256_add_ps(a4, _mm256_load_ps(r + 32)), a5 = _mm256_add_ps(a5, _mm256_load_ps(r + 40));
            a6 = _mm256_add_ps(a6, _mm256_load_ps(r + 48)), a7 = _mm256_add_ps(a7, _mm256_load_ps(r + 56));
        }
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

static float sum_scalar(const float *p, size_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= n; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
    return s0 + s1 + s2 + s3;
}

static size_t slice(const bw_ctx *c) { return c->n / (size_t)c->use / 1024 * 1024; }

static void bw_task(void *p, int tid, int nth) {
    bw_ctx *c = p;
    (void)nth;
    if (tid >= c->use) return;
    const float *s = c->buf + slice(c) * (size_t)tid;
    c->sums[tid] = c->isa == DF_ISA_AVX512 ? sum_avx512(s, slice(c), c->method)
                   : c->isa == DF_ISA_AVX2 ? sum_avx2(s, slice(c), c->method)
                                           : sum_scalar(s, slice(c));
}

/* Runs fn(ctx, t, nth) on nth distinct threads at once (the caller is t = 0)
 * and returns the seconds from their common start to the last one's end.
 * Not the engine's pool: a pool share may be run by any thread, so under load
 * one thread can run every share in turn, which measures one core and reads
 * a floor too low. */
typedef struct { df_task_fn fn; void *ctx; int t, nth; pthread_barrier_t *bar; } ot_arg;
static void *ot_main(void *p) {
    ot_arg *a = p;
    pthread_barrier_wait(a->bar);
    a->fn(a->ctx, a->t, a->nth);
    return NULL;
}
static double on_threads(df_task_fn fn, void *ctx, int nth) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nth);
    pthread_t *th = df_xcalloc((size_t)nth, sizeof *th);
    ot_arg *a = df_xcalloc((size_t)nth, sizeof *a);
    int started = 1;
    for (int t = 0; t < nth; t++) a[t] = (ot_arg){fn, ctx, t, nth, &bar};
    for (int t = 1; t < nth; t++) {
        if (pthread_create(&th[t], NULL, ot_main, &a[t])) break; /* cannot happen short of exhaustion: fewer threads */
        started++;
    }
    if (started < nth) { /* release the barrier with what started: the floor is then that many threads' */
        pthread_barrier_destroy(&bar);
        pthread_barrier_init(&bar, NULL, (unsigned)started);
    }
    pthread_barrier_wait(&bar);
    double t0 = df_now();
    fn(ctx, 0, nth);
    for (int t = 1; t < started; t++) pthread_join(th[t], NULL);
    double dt = df_now() - t0;
    pthread_barrier_destroy(&bar);
    free(th);
    free(a);
    return dt;
}

/* Best of reps passes of every method; *best_method gets the winner. */
static double measure_bw(const float *buf, size_t n, int use, int *best_method) {
    bw_ctx c = {buf, n, use, 0, df_isa(), df_xcalloc((size_t)df_pool_size(), sizeof(double))};
    double best = 0;
    int methods = c.isa == DF_ISA_SCALAR ? 1 : M_N;
    for (int rep = 0; rep < 4; rep++)
        for (int m = 0; m < methods; m++) {
            c.method = m;
            double dt = on_threads(bw_task, &c, df_pool_size());
            double gbs = (double)slice(&c) * use * 4 / dt / 1e9;
            if (gbs > best) best = gbs, *best_method = m;
        }
    free(c.sums);
    return best;
}

typedef struct { double *out; /* [threads of the pool] */ long iters; } fma_ctx;

#define FMA12(F, m, b)                                                                                   \
    a0 = F(a0, m, b), a1 = F(a1, m, b), a2 = F(a2, m, b), a3 = F(a3, m, b), a4 = F(a4, m, b),              \
    a5 = F(a5, m, b), a6 = F(a6, m, b), a7 = F(a7, m, b), a8 = F(a8, m, b), a9 = F(a9, m, b), a10 = F(a10, m, b), \
    a11 = F(a11, m, b)

__attribute__((target("avx512f"))) static void fma512(fma_ctx *c, int tid) {
    __m512 m = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3),
           a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7),
           a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    for (long it = 0; it < c->iters; it++) {
        FMA12(_mm512_fmadd_ps, m, b);
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5)); /* no folding */
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    c->out[tid] = _mm512_reduce_add_ps(s); /* keep the result alive */
}
__attribute__((target("avx2,fma"))) static void fma256(fma_ctx *c, int tid) {
    __m256 m = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2), a3 = _mm256_set1_ps(3),
           a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5), a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7),
           a8 = _mm256_set1_ps(8), a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    for (long it = 0; it < c->iters; it++) {
        FMA12(_mm256_fmadd_ps, m, b);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float t[8];
    _mm256_storeu_ps(t, s);
    c->out[tid] = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
static void fma_task(void *p, int tid, int nth) {
    (void)nth;
    if (df_isa() == DF_ISA_AVX512) fma512(p, tid);
    else fma256(p, tid);
}

void df_bench_floors(size_t buf_bytes, long fma_iters, df_floors *out) {
    int nth = df_pool_size();
    size_t n = buf_bytes / 4 / 1024 * 1024; /* floats */
    if (n < 1024) n = 1024;
    float *buf = NULL;
    if (posix_memalign((void **)&buf, (size_t)2 << 20, n * 4)) buf = df_aligned_alloc(n * 4);
    madvise(buf, n * 4, MADV_HUGEPAGE); /* as the engine's resident spine (no-op where THP is off) */
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023);
    int m1 = 0, mn = 0;
    double bw1 = measure_bw(buf, n, 1, &m1), bwn = measure_bw(buf, n, nth, &mn);
    free(buf);
    double gflops = 0;
    int lanes = df_isa() == DF_ISA_AVX512 ? 16 : 8;
    for (int rep = 0; rep < 3; rep++) {
        fma_ctx fc = {df_xcalloc((size_t)nth, sizeof(double)), fma_iters};
        double dt = on_threads(fma_task, &fc, nth);
        free(fc.out);
        double g = (double)fc.iters * 12 * lanes * 2 * nth / dt / 1e9;
        if (g > gflops) gflops = g;
    }
    *out = (df_floors){nth, df_isa_name(df_isa()), bw1, bwn, method_name[m1], method_name[mn], gflops};
}
