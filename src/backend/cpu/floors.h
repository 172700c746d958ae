/* floors.h - the machine's floors (memory read GB/s, peak f32 FMA GFLOP/s),
 * measured in-process so a benchmark reports its numbers against floors taken
 * in the same run (floors.c says how). */
#ifndef DF_CPU_FLOORS_H
#define DF_CPU_FLOORS_H
#include <stddef.h>

typedef struct {
    int threads;
    const char *isa;
    double mem_read_gbs_1t, mem_read_gbs;     /* best read method, one thread and all */
    const char *mem_method_1t, *mem_method;
    double peak_fma_gflops;                   /* all threads, f32 FMA of the best ISA */
} df_floors;

/* Measures the floors with a buffer of buf_bytes (1 GiB for `bench floors`)
 * on df_pool_size() threads (df_pool_init must have run) and fma_iters FMA
 * rounds per thread per pass. */
void df_bench_floors(size_t buf_bytes, long fma_iters, df_floors *out);
#endif
