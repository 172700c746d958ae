/* pool.c - the CPU backend's thread pool: it runs one task at a time on all
 * threads (the caller is thread 0); workers spin briefly and then sleep on a
 * condition variable, so an idle engine costs no CPU. */
#include "backend/cpu/cpu.h"
#include "util/util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* DELTAFIN_POOL_STATS=1: counts and times of the pool, printed at exit
 * (round trips, the caller's time in the pool and waiting for the others,
 * the workers' sleeps): a measuring aid, off by default. */
static int stats_on;
static struct {
    long long runs, sleeps;
    double t_pool, t_wait, t0;
} S;
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static struct {
    int n;
    pthread_t *th;
    atomic_uint gen;
    atomic_int done;
    df_task_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started;
    int serial; /* df_pool_serial */
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void stats_print(void) {
    const double wall = now_s() - S.t0;
    fprintf(stderr, "[pool] %d threads: %lld round trips in %.3f s (%.2f us each in the pool, caller waiting %.2f us each); "
                    "pool %.1f%% of the time since init, waiting %.1f%%; workers slept %lld times\n",
            P.n, S.runs, wall, S.runs ? 1e6 * S.t_pool / (double)S.runs : 0.0, S.runs ? 1e6 * S.t_wait / (double)S.runs : 0.0,
            wall > 0 ? 100 * S.t_pool / wall : 0.0, wall > 0 ? 100 * S.t_wait / wall : 0.0, S.sleeps);
}

static void *worker(void *arg) {
    int tid = (int)(intptr_t)arg;
    unsigned seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&P.gen, memory_order_acquire) == seen) {
            if (++spins < 20000) { CPU_RELAX(); continue; }
            if (spins < 20100) { sched_yield(); continue; }
            pthread_mutex_lock(&P.mu);
            if (stats_on) S.sleeps++;
            while (atomic_load_explicit(&P.gen, memory_order_acquire) == seen) pthread_cond_wait(&P.cv, &P.mu);
            pthread_mutex_unlock(&P.mu);
        }
        seen = atomic_load_explicit(&P.gen, memory_order_acquire);
        P.fn(P.ctx, tid, P.n);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_acq_rel);
    }
    return NULL;
}

void df_pool_init(int n) {
    pthread_mutex_lock(&P.mu);
    if (!P.started) {
        if (n <= 0) n = df_n_cpus();
        P.n = n;
        P.th = df_xcalloc((size_t)n, sizeof *P.th);
        for (int i = 1; i < n; i++) {
            pthread_attr_t a;
            pthread_attr_init(&a);
            pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
            pthread_create(&P.th[i], &a, worker, (void *)(intptr_t)i);
            pthread_attr_destroy(&a);
        }
        P.started = 1;
        const char *e = getenv("DELTAFIN_POOL_STATS");
        if (e && *e && *e != '0') stats_on = 1, S.t0 = now_s(), atexit(stats_print);
    }
    pthread_mutex_unlock(&P.mu);
}
int df_pool_size(void) { return P.started ? P.n : 1; }
void df_pool_serial(int on) { P.serial = on; }

void df_pool_run(df_task_fn fn, void *ctx) {
    if (!P.started) df_pool_init(0);
    if (P.n == 1 || P.serial) { fn(ctx, 0, 1); return; }
    const double t0 = stats_on ? now_s() : 0;
    P.fn = fn;
    P.ctx = ctx;
    atomic_store_explicit(&P.done, 0, memory_order_release);
    pthread_mutex_lock(&P.mu);
    atomic_fetch_add_explicit(&P.gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    fn(ctx, 0, P.n);
    const double t1 = stats_on ? now_s() : 0;
    /* spin briefly (the common case: workers finish together), then yield the
     * core so that a descheduled worker can run on an oversubscribed machine */
    for (int spins = 0; atomic_load_explicit(&P.done, memory_order_acquire) < P.n - 1; spins++) {
        if (spins < 4000) CPU_RELAX();
        else sched_yield();
    }
    if (stats_on) {
        const double t2 = now_s();
        S.runs++, S.t_pool += t2 - t0, S.t_wait += t2 - t1;
    }
}

