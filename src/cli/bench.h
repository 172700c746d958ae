/* bench.h - what the bench files share: the floors of bench.c, measured
 * in-process so a workload run (bench_run.c) reports its numbers against
 * floors taken in the same invocation. */
#ifndef DF_BENCH_H
#define DF_BENCH_H
#include <stddef.h>

typedef struct {
    int threads;
    const char *isa;
    double mem_read_gbs_1t, mem_read_gbs;     /* best read method, one thread and all */
    const char *mem_method_1t, *mem_method;
    double peak_fma_gflops;                   /* all threads, f32 FMA of the best ISA */
} df_floors;

/* Measures the floors with a buffer of buf_bytes (1 GiB for `bench floors`)
 * on the thread pool (df_pool_init must have run) and fma_iters FMA rounds
 * per thread per pass. */
void df_bench_floors(size_t buf_bytes, long fma_iters, df_floors *out);

int df_bench_workload(int argc, char **argv); /* bench_run.c: decode, prefill, stream, server, tokenizer */
#endif
