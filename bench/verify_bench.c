/* verify_bench.c - the cost of a speculative verify pass against plain steps
 * (issue 15 step 4; docs/PERFORMANCE.md). After a prompt of 64 ids, MODE
 * runs REPS times, each from the same length (cut back after it):
 *   plain    N plain steps (df_session_push)
 *   exact    one verify pass of N positions (exact products: the default)
 *   batched  one verify pass of N positions with the backend's exact mode
 *            hidden (the CPU table without exact_products: the batched
 *            products and MLA path of the passes before step 4)
 * and prints the wall time per pass. For instruction counts run it under
 *   valgrind --tool=callgrind --toggle-collect=measure ./build/bench/verify_bench M MODE N REPS
 * (only measure() is counted: the prompt and the model load are not).
 *
 * usage: verify_bench MODEL plain|exact|batched [N=5] [REPS=3] [THREADS=1] [PROMPT=64]
 * (PROMPT: the prompt's length, 1..4096; 8 keeps a callgrind run short, ~1500 is the
 * code-edit row of bench/spec_bench.sh, where the f32 KV cache is read once per step) */
#include "backend/backend.h"
#include "core/core.h"
#include "deltafin.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static df_backend_ops hidden; /* the selected backend without exact products */

/* one repetition of the mode (noinline: the callgrind toggle) */
__attribute__((noinline)) static int measure(df_session *s, int mode, const int32_t *ids, int n, float *out) {
    if (mode == 0) {
        for (int i = 0; i < n; i++)
            if (df_session_push(s, ids[i])) return -1;
        return 0;
    }
    return df_session_verify(s, ids, (size_t)n, out);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: verify_bench MODEL plain|exact|batched [N=5] [REPS=3] [THREADS=1] [PROMPT=64, <= 4096]\n"); return 2; }
    const int mode = !strcmp(argv[2], "plain") ? 0 : !strcmp(argv[2], "exact") ? 1 : !strcmp(argv[2], "batched") ? 2 : -1;
    const int n = argc > 3 ? atoi(argv[3]) : 5, reps = argc > 4 ? atoi(argv[4]) : 3, th = argc > 5 ? atoi(argv[5]) : 1;
    const int np = argc > 6 ? atoi(argv[6]) : 64;
    if (mode < 0 || n < 1 || n > 64 || reps < 1 || np < 1 || np > 4096) { fprintf(stderr, "verify_bench: bad arguments\n"); return 2; }
    df_options o;
    df_options_default(&o);
    o.n_threads = th;
    char err[512];
    df_engine *e = df_engine_open(argv[1], &o, err, sizeof err);
    if (!e) { fprintf(stderr, "verify_bench: %s\n", err); return 1; }
    if (mode == 2) hidden = *df_be, hidden.exact_products = NULL, df_be = &hidden;
    df_model_info mi;
    df_engine_info(e, &mi);
    int32_t *ids = malloc((size_t)(np + 64) * sizeof *ids);
    for (int i = 0; i < np + 64; i++) ids[i] = (int32_t)((i * 97 + 13) % mi.vocab_size);
    df_session *s = df_session_new(e, (size_t)np + 192);
    float *out = malloc((size_t)n * (size_t)mi.vocab_size * sizeof(float));
    if (!s || !out || df_session_sync(s, ids, (size_t)np)) { fprintf(stderr, "verify_bench: prompt: %s\n", df_engine_error(e)); return 1; }
    const float *lg = df_session_logits(s);
    float *keep = malloc((size_t)mi.vocab_size * sizeof(float));
    memcpy(keep, lg, (size_t)mi.vocab_size * sizeof(float));
    double best = 1e9, sum = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = df_now();
        if (measure(s, mode, ids + np, n, out)) { fprintf(stderr, "verify_bench: %s\n", df_engine_error(e)); return 1; }
        double dt = df_now() - t0;
        sum += dt, best = dt < best ? dt : best;
        df_session_cut(s, (size_t)np, keep, 0);
    }
    printf("%s %d positions: best %.3f ms, mean %.3f ms per pass (%d reps, %d threads)\n", argv[2], n, best * 1e3, sum / reps * 1e3, reps, th);
    free(out), free(keep), free(ids);
    df_session_free(s);
    df_engine_close(e);
    return 0;
}
