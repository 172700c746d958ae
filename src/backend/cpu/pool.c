/* pool.c - the CPU backend's thread pool. It runs one task at a time; a
 * task is cut into shares (df_pool_run: one per thread) and every thread,
 * the caller included, claims shares from one atomic word until none is
 * left. The caller returns when every share is done, and waits only for
 * shares already running: a worker that is not on a CPU when a task starts
 * (descheduled on a loaded machine, or still waking up) costs the caller
 * nothing, it runs that worker's share itself.
 *
 * The hot path takes no lock: the caller publishes the task with one store
 * (generation, share count, next share) and claims with fetch_add, like the
 * workers; a finished share adds one to a counter on its own cache line.
 * Workers spin on the task word (with pause) for a bounded time, then yield,
 * then sleep on a condition variable, so an idle engine costs no CPU; the
 * caller takes the mutex only when a worker sleeps.
 *
 * Bits: a share's work is given by (share, shares) alone (the tasks split
 * their work from those), so which thread runs a share does not change any
 * result, and df_pool_run's shares are the thread count as before. */
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

/* the task word: generation (24 bits) | shares (20 bits) | next share (20 bits) */
#define W_NEXT_BITS 20
#define W_SH_BITS 20
#define W_MASK ((UINT64_C(1) << 20) - 1)
#define W_GEN(w) ((w) >> (W_NEXT_BITS + W_SH_BITS))
#define W_SHARES(w) (((w) >> W_NEXT_BITS) & W_MASK)
#define W_NEXT(w) ((w) & W_MASK)
#define W_GEN_MASK ((UINT64_C(1) << 24) - 1)

/* how long an idle worker spins, then yields, before it sleeps */
#define SPIN_S 100e-6
#define YIELD_S 2e-3

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct {
    _Alignas(64) _Atomic uint64_t word; /* the task word, written by the caller, claimed by all */
    _Alignas(64) atomic_int done;       /* shares finished in this generation */
    _Alignas(64) atomic_int sleepers;   /* workers in (or about to enter) pthread_cond_wait */
    _Alignas(64) df_task_fn fn;         /* the task: written before the word, read after a claim */
    void *ctx;
    uint64_t gen;
    int n, started, serial; /* serial: df_pool_serial */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* DELTAFIN_POOL_STATS=1: counts and times of the pool, printed at exit
 * (round trips, the caller's time in the pool and waiting for shares that
 * other threads run, the shares workers ran, their sleeps): a measuring aid,
 * off by default. */
static int stats_on;
static struct {
    long long runs, shares, caller_shares;
    double t_pool, t_wait, t0;
    atomic_llong sleeps;
} S;
static void stats_print(void) {
    const double wall = now_s() - S.t0;
    const long long sl = atomic_load(&S.sleeps);
    fprintf(stderr,
            "[pool] %d threads: %lld round trips in %.3f s (%.2f us each in the pool, caller waiting %.2f us each); "
            "pool %.1f%% of the time since init, waiting %.1f%%; workers ran %lld of %lld shares, slept %lld times\n",
            P.n, S.runs, wall, S.runs ? 1e6 * S.t_pool / (double)S.runs : 0.0, S.runs ? 1e6 * S.t_wait / (double)S.runs : 0.0,
            wall > 0 ? 100 * S.t_pool / wall : 0.0, wall > 0 ? 100 * S.t_wait / wall : 0.0, S.shares - S.caller_shares, S.shares, sl);
}

/* Claims and runs shares of the task in the word until none is left;
 * returns the word's generation and how many shares this thread ran. */
static uint64_t run_shares(int *ran) {
    int k = 0;
    for (;;) {
        const uint64_t w = atomic_fetch_add_explicit(&P.word, 1, memory_order_acq_rel);
        const int i = (int)W_NEXT(w), sh = (int)W_SHARES(w);
        if (i >= sh) {
            if (ran) *ran = k;
            return W_GEN(w);
        }
        /* the share is unfinished, so the caller has not moved on: fn and ctx are this generation's */
        P.fn(P.ctx, i, sh);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
        k++;
    }
}

static void *worker(void *arg) {
    (void)arg;
    uint64_t seen = 0; /* the generation this worker last found exhausted */
    for (;;) {
        uint64_t w = atomic_load_explicit(&P.word, memory_order_acquire);
        if (W_GEN(w) == seen) {
            const double t0 = now_s();
            for (int spins = 1;; spins++) {
                CPU_RELAX();
                w = atomic_load_explicit(&P.word, memory_order_acquire);
                if (W_GEN(w) != seen) break;
                if (spins % 64) continue;
                const double dt = now_s() - t0;
                if (dt < SPIN_S) continue;
                if (dt < YIELD_S) { sched_yield(); continue; }
                /* sleep: announce it first, so that a caller that published after our last look sees it and wakes us */
                atomic_fetch_add_explicit(&P.sleepers, 1, memory_order_seq_cst);
                pthread_mutex_lock(&P.mu);
                if (stats_on) atomic_fetch_add(&S.sleeps, 1);
                while (W_GEN(atomic_load_explicit(&P.word, memory_order_seq_cst)) == seen) pthread_cond_wait(&P.cv, &P.mu);
                pthread_mutex_unlock(&P.mu);
                atomic_fetch_sub_explicit(&P.sleepers, 1, memory_order_relaxed);
                break;
            }
        }
        seen = run_shares(NULL);
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

void df_pool_run_shares(df_task_fn fn, void *ctx, int shares) {
    if (!P.started) df_pool_init(0);
    if (shares <= 0) return;
    if (P.n == 1 || P.serial) { fn(ctx, 0, 1); return; }
    if (shares > DF_POOL_MAX_SHARES) shares = DF_POOL_MAX_SHARES;
    const double t0 = stats_on ? now_s() : 0;
    P.fn = fn;
    P.ctx = ctx;
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    P.gen = (P.gen + 1) & W_GEN_MASK;
    if (!P.gen) P.gen = 1; /* workers start having seen generation 0 */
    atomic_store_explicit(&P.word, (P.gen << (W_NEXT_BITS + W_SH_BITS)) | ((uint64_t)shares << W_NEXT_BITS), memory_order_seq_cst);
    if (atomic_load_explicit(&P.sleepers, memory_order_seq_cst)) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
    }
    int mine = 0;
    run_shares(&mine);
    const double t1 = stats_on ? now_s() : 0;
    /* shares other threads claimed: spin briefly (they usually end together),
     * then yield the core so that a descheduled worker can finish its share */
    for (int spins = 0; atomic_load_explicit(&P.done, memory_order_acquire) < shares; spins++) {
        if (spins < 4000) CPU_RELAX();
        else sched_yield();
    }
    if (stats_on) {
        const double t2 = now_s();
        S.runs++, S.shares += shares, S.caller_shares += mine, S.t_pool += t2 - t0, S.t_wait += t2 - t1;
    }
}

void df_pool_run(df_task_fn fn, void *ctx) {
    if (!P.started) df_pool_init(0);
    df_pool_run_shares(fn, ctx, P.n);
}
