/* bench.h - what the bench files share: the floors (backend/cpu/floors.c),
 * measured in-process so a workload run (bench_run.c) reports its numbers
 * against floors taken in the same invocation. */
#ifndef DF_BENCH_H
#define DF_BENCH_H
#include <stddef.h>

#include "backend/cpu/floors.h" /* df_floors, df_bench_floors */

int df_bench_workload(int argc, char **argv); /* bench_run.c: decode, prefill, stream, server, tokenizer */
#endif
