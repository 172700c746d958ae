/* bench.c - `deltafin bench floors` (the floors of backend/cpu/floors.c as
 * one JSON object), `bench first-touch`, and the dispatch to the workloads
 * of bench_run.c. */
#include "backend/cpu/cpu.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "util/util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* `bench first-touch`: how fast never-touched memory can be faulted in
 * (MADV_POPULATE_WRITE of a fresh huge-page-advised mapping from several
 * threads, as the engine's prefaulting does). Bare metal zeroes pages at
 * 10+ GB/s; a VM that backs memory lazily is far slower, and a streamed run
 * must fault in everything it holds. Run it after dropping page caches. */
static int first_touch(int argc, char **argv) {
    int64_t size = (int64_t)2 << 30;
    int threads = 8;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc) size = df_parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else { fprintf(stderr, "bench first-touch: unknown option '%s'\n", argv[i]); return 2; }
    }
    if (size <= 0 || threads < 1 || threads > DF_PREFAULT_MAX_THREADS) {
        fprintf(stderr, "bench first-touch: expected --size > 0 and --threads 1..%d\n", DF_PREFAULT_MAX_THREADS);
        return 2;
    }
    uint8_t *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { fprintf(stderr, "bench first-touch: cannot map %lld bytes\n", (long long)size); return 1; }
    madvise(p, (size_t)size, MADV_HUGEPAGE);
    double t0 = df_now();
    df_prefault *f = df_prefault_start(p, (size_t)size, threads);
    df_prefault_wait(f, p, p + size);
    df_prefault_finish(f);
    double dt = df_now() - t0;
    munmap(p, (size_t)size);
    printf("{\"first_touch_gbs\": %.3f, \"bytes\": %lld, \"threads\": %d}\n", size / dt / 1e9, (long long)size, threads);
    return 0;
}


int df_cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "first-touch")) return first_touch(argc, argv);
    static const char *workloads[] = {"decode", "prefill", "stream", "server", "tokenizer"};
    for (size_t w = 0; argc >= 2 && w < sizeof workloads / sizeof *workloads; w++)
        if (!strcmp(argv[1], workloads[w])) return df_bench_workload(argc, argv);
    if (argc < 2 || strcmp(argv[1], "floors")) {
        fprintf(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
                "usage: deltafin bench (decode | prefill | stream | server | tokenizer) --arm NAME=BINARY[:OPTIONS] ... [options]\n"
                "  Named workloads, two or more arms run interleaved, output gated on the ids, results as JSON,\n"
                "  markdown and SVG plots (deltafin bench decode --help for the options).\n"
                "       deltafin bench floors [--threads N]\n"
                "  Measures this machine's floors: memory read GB/s (1 thread, all threads) and peak f32 FMA GFLOP/s.\n"
                "       deltafin bench first-touch [--size 2G] [--threads 8]\n"
                "  GB/s at which never-touched memory is faulted in (run after dropping page caches).\n");
        return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    int threads = 0; /* 0: one per CPU */
    for (int i = 2; i < argc; i++) {
        long v;
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            if (df_parse_int(argv[++i], 1, 1024, &v)) {
                fprintf(stderr, "bench floors: --threads: expected 1..1024, got '%s'\n", argv[i]);
                return 2;
            }
            threads = (int)v;
        } else {
            fprintf(stderr, "bench floors: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    df_pool_init(threads);
    df_floors fl;
    df_bench_floors((size_t)1 << 30, 20000000, &fl);
    printf("{\"threads\": %d, \"isa\": \"%s\", \"mem_read_gbs_1t\": %.2f, \"mem_read_gbs\": %.2f, "
           "\"mem_method_1t\": \"%s\", \"mem_method\": \"%s\", \"peak_fma_gflops\": %.1f}\n",
           fl.threads, fl.isa, fl.mem_read_gbs_1t, fl.mem_read_gbs, fl.mem_method_1t, fl.mem_method, fl.peak_fma_gflops);
    return 0;
}
