/* cpu.h - what is particular to the CPU backend: its thread pool and its
 * run-time choice of kernel set (ISA). The model never sees these; tools
 * that measure the CPU itself (bench floors) and the kernel tests do. */
#ifndef DF_BACKEND_CPU_H
#define DF_BACKEND_CPU_H

#include "backend/backend.h"

/* ---- thread pool (pool.c) ------------------------------------------- */
/* A task is cut into shares: fn(ctx, share, shares) does share `share` of
 * `shares` (its work given by those two numbers alone), once per share, on
 * any thread of the pool (a thread may run several shares, or none). */
typedef void (*df_task_fn)(void *ctx, int tid, int nth);
void df_pool_init(int n_threads); /* idempotent; 0 = all cores */
int df_pool_size(void);
/* runs fn's shares 0 .. df_pool_size()-1 on the pool (the caller takes part),
 * returns when all are done */
void df_pool_run(df_task_fn fn, void *ctx);
/* the same with `shares` shares (at most DF_POOL_MAX_SHARES): finer shares
 * balance the threads when one of them is slow or descheduled */
#define DF_POOL_MAX_SHARES 65536
void df_pool_run_shares(df_task_fn fn, void *ctx, int shares);
/* on: df_pool_run runs tasks on the caller alone, as fn(ctx, 0, 1) (the scalar reference backend); off: on every thread */
void df_pool_serial(int on);

/* ---- ISA ------------------------------------------------------------- */
enum { DF_ISA_SCALAR = 0, DF_ISA_AVX2 = 1, DF_ISA_AVX512 = 2 };
int df_isa(void);
void df_set_isa(int isa); /* -1 = best available */
const char *df_isa_name(int isa);

/* ---- host helpers of the CPU backend (f32, single-threaded, current ISA) */
float df_cpu_dot(const float *a, const float *b, int n);
void df_cpu_axpy(float *y, float a, const float *x, int n); /* y += a x */
void df_cpu_softmax(float *x, int n);
/* Transposed product over a row slice: y[cols] = sum_r W[r0+r,:] * x[r], r < nr. */
void df_cpu_matvec_t_rows(const df_weight *w, int64_t r0, int64_t nr, const float *x, float *y);
/* Backend memory of the CPU backend is host memory: a df_act is a float array. */
#define DF_F(p) ((float *)(void *)(p))
#define DF_CF(p) ((const float *)(const void *)(p))

/* ---- the CPU implementations of the table (cpu.c, attn.c, ops.c) ----- */
void df_cpu_matmul_batch(const df_mv_job *jobs, int n_jobs, int n);
/* backend.h: exact_products (a flag of the calling thread; always honoured) */
int df_cpu_exact_products(int on);
int df_cpu_exact_on(void); /* the calling thread's exact mode (ops other than products follow it too) */
void df_cpu_attn_gqa(const df_attn_gqa_args *a);
/* the same with the tiling given (tests): qt positions per unit of work, each KV group's query heads split in
 * nsub ranges (qt or nsub <= 0: chosen from the shape and the thread count, as df_cpu_attn_gqa does) */
void df_cpu_attn_gqa_tiled(const df_attn_gqa_args *a, int qt, int nsub);
void df_cpu_attn_mla(const df_attn_mla_args *a);

#endif
