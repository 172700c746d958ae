/* tokenizer_bench.c - encode throughput of the native tokenizer (driver for
 * bench/tokenizer_bench.py, which builds it; not part of the deltafin binary).
 * usage: tokenizer_bench TOKENIZER FILE THREADS REPS
 * Prints: "<tokens> <best seconds> <MB/s> <CPU seconds of that run, all threads>"
 * (load time excluded). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "tok/tokenizer.h"
#include "util/util.h"

static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: %s TOKENIZER FILE THREADS REPS\n", argv[0]); return 2; }
    char err[512];
    df_tokenizer *t = df_tok_load(argv[1], err, sizeof err);
    if (!t) { fprintf(stderr, "%s\n", err); return 2; }
    char *text;
    size_t len;
    if (df_read_file(argv[2], &text, &len, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 2; }
    int threads = atoi(argv[3]), reps = atoi(argv[4]);
    double best = 1e30, best_cpu = 0;
    size_t n = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids;
        double c0 = cpu_seconds(), t0 = df_now();
        df_tok_encode(t, text, len, 0, threads, &ids, &n);
        double dt = df_now() - t0, dc = cpu_seconds() - c0;
        if (dt < best) { best = dt; best_cpu = dc; }
        free(ids);
    }
    printf("%zu %.6f %.2f %.6f\n", n, best, len / best / 1e6, best_cpu);
    free(text);
    df_tok_free(t);
    return 0;
}
