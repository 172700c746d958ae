/* test_backend_pool.c - the CPU thread pool (pool.c): every share of a task
 * runs exactly once with (share, shares) as given, across many round trips
 * and across workers that went to sleep; the caller does not wait for a
 * worker that is not running (a stalled worker's shares are run by the
 * caller); and a microbenchmark of one round trip with empty tasks
 * (printed, not asserted: wall-clock on a shared machine). */
#include "backend/cpu/cpu.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

enum { MAXSH = 64 };
typedef struct {
    atomic_int ran[MAXSH];
    atomic_int bad;
    int shares;
    atomic_long tids[MAXSH]; /* the kernel thread id that ran each share */
    int plain[MAXSH];        /* a plain write per share, read by the caller after the task (TSan: ordered) */
} count_ctx;

static void count_task(void *p, int tid, int nth) {
    count_ctx *c = p;
    if (tid < 0 || tid >= c->shares || nth != c->shares) { atomic_fetch_add(&c->bad, 1); return; }
    atomic_fetch_add(&c->ran[tid], 1);
    atomic_store(&c->tids[tid], (long)syscall(SYS_gettid));
    c->plain[tid] = tid + 1;
}

static void run_and_check(int shares, const char *what) {
    count_ctx c;
    memset(&c, 0, sizeof c);
    c.shares = shares;
    df_pool_run_shares(count_task, &c, shares);
    int ok = atomic_load(&c.bad) == 0;
    for (int i = 0; i < shares; i++) ok &= atomic_load(&c.ran[i]) == 1 && c.plain[i] == i + 1;
    CHECK(ok, "%s: %d shares: each must run once with nth = shares (bad %d)", what, shares, atomic_load(&c.bad));
}

/* ---- a worker stalled in a signal handler ---------------------------------- */
static atomic_int stalled, release_it;
static void on_usr1(int sig) {
    (void)sig;
    atomic_store(&stalled, 1);
    while (!atomic_load(&release_it)) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
}
static atomic_int runs_done;
static void *releaser(void *arg) {
    (void)arg;
    /* the old pool: the runs below wait for the stalled worker until here (3 s) */
    for (int ms = 0; ms < 3000 && !atomic_load(&runs_done); ms++) sleep_ms(1);
    atomic_store(&release_it, 1);
    return NULL;
}

static void test_stalled_worker(void) {
    if (df_pool_size() < 2) { printf("skip stalled-worker test: 1 thread\n"); return; }
    /* find a worker's kernel thread id: a worker runs some share sooner or later */
    long wtid = 0, me = (long)syscall(SYS_gettid);
    for (int k = 0; k < 200000 && !wtid; k++) {
        count_ctx c;
        memset(&c, 0, sizeof c);
        c.shares = df_pool_size();
        df_pool_run(count_task, &c);
        for (int i = 0; i < c.shares; i++)
            if (atomic_load(&c.tids[i]) != me) wtid = atomic_load(&c.tids[i]);
    }
    if (!wtid) { printf("skip stalled-worker test: no worker ever ran a share\n"); return; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    syscall(SYS_tgkill, getpid(), wtid, SIGUSR1);
    while (!atomic_load(&stalled)) sleep_ms(1);
    /* the worker holds no share (every earlier task returned): the caller must not wait for it */
    pthread_t th;
    pthread_create(&th, NULL, releaser, NULL);
    const double t0 = now();
    for (int k = 0; k < 100; k++) run_and_check(df_pool_size(), "stalled worker");
    const double dt = now() - t0;
    const int before_release = !atomic_load(&release_it);
    atomic_store(&runs_done, 1);
    CHECK(before_release, "100 tasks with a stalled worker took %.3f s: the caller waited for the worker", dt);
    pthread_join(th, NULL);
    printf("stalled worker: 100 tasks in %.4f s while the worker was stalled\n", dt);
    for (int k = 0; k < 100; k++) run_and_check(df_pool_size(), "after release");
}

static void nop_task(void *p, int tid, int nth) { (void)p, (void)tid, (void)nth; }
/* a share of *(double *)p seconds of busy work */
static void busy_task(void *p, int tid, int nth) {
    (void)tid, (void)nth;
    const double t0 = now(), w = *(const double *)p;
    while (now() - t0 < w) {}
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    df_pool_init(threads);
    printf("pool of %d threads\n", df_pool_size());
    /* many round trips, several share counts */
    for (int k = 0; k < 20000; k++) run_and_check(1 + k % 17, "round trips");
    /* after the workers went to sleep (they sleep after ~2 ms idle) */
    for (int k = 0; k < 5; k++) {
        sleep_ms(10);
        run_and_check(df_pool_size(), "after sleep");
        run_and_check(MAXSH, "after sleep, many shares");
    }
    /* serial mode: the caller alone, one share */
    df_pool_serial(1);
    {
        count_ctx c;
        memset(&c, 0, sizeof c);
        c.shares = 1;
        df_pool_run_shares(count_task, &c, 7);
        CHECK(atomic_load(&c.ran[0]) == 1 && !atomic_load(&c.bad), "serial: fn(ctx, 0, 1) once");
    }
    df_pool_serial(0);
    test_stalled_worker();
    /* microbenchmark: one round trip of an empty task, and of shares of 2 us
     * of work each (the time above 2 us is the pool's; median of 21 batches) */
    enum { B = 21, R = 2000 };
    const double works[2] = {0, 2e-6};
    for (int wi = 0; wi < 2; wi++) {
        double per[B], w = works[wi];
        for (int b = 0; b < B; b++) {
            const double t0 = now();
            for (int r = 0; r < R; r++) df_pool_run(wi ? busy_task : nop_task, &w);
            per[b] = (now() - t0) / R;
        }
        qsort(per, B, sizeof *per, cmp_d);
        printf("round trip, %s, %d threads: median %.3f us (min %.3f, max %.3f)\n", wi ? "shares of 2 us" : "empty task", df_pool_size(),
               1e6 * per[B / 2], 1e6 * per[0], 1e6 * per[B - 1]);
    }
    printf(fails ? "%d FAILED\n" : "all pool tests passed\n", fails);
    return fails != 0;
}
