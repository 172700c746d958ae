/* cpu.h - what is particular to the CPU backend: its thread pool and its
 * run-time choice of kernel set (ISA). The model never sees these; tools
 * that measure the CPU itself (bench floors) and the kernel tests do. */
#ifndef DF_BACKEND_CPU_H
#define DF_BACKEND_CPU_H

#include "backend/backend.h"

/* ---- thread pool ----------------------------------------------------- */
typedef void (*df_task_fn)(void *ctx, int tid, int nth);
void df_pool_init(int n_threads); /* idempotent; 0 = all cores */
int df_pool_size(void);
void df_pool_run(df_task_fn fn, void *ctx); /* runs fn on every thread, returns when all are done */

/* ---- ISA ------------------------------------------------------------- */
enum { DF_ISA_SCALAR = 0, DF_ISA_AVX2 = 1, DF_ISA_AVX512 = 2 };
int df_isa(void);
void df_set_isa(int isa); /* -1 = best available */
const char *df_isa_name(int isa);

#endif
