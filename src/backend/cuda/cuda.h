/* cuda.h - the CUDA backend (df_backend_cuda, built with `make CUDA=1`).
 *
 * Backend memory is device memory (cudaMalloc); weights are uploaded once
 * by weight_register (the stored bytes and the scale sidecar, unchanged:
 * kernels decode every stored format inside the product), params by
 * param_register (a device copy found by the host address). Operations
 * run on the default stream in call order; read() waits for them. A CUDA
 * error is reported on stderr as one line naming the operation. */
#ifndef DF_BACKEND_CUDA_H
#define DF_BACKEND_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

extern const df_backend_ops df_backend_cuda;
/* 1 when a CUDA device can be used (the runtime finds at least one), else 0. */
int df_cuda_available(void);
/* The VRAM budget (df_backend_set_memory): budget 0 = free memory minus a margin. */
void df_cuda_set_memory(int64_t budget, int64_t reserve, int64_t expert_bytes);
/* Launches of the decode product kernel so far (matmul_batch batches its jobs into few launches; tests check it). */
int64_t df_cuda_mm_launches(void);
/* Of those, launches in 4-warp blocks (a one-token product of few blocks: docs/PERFORMANCE.md, CUDA). */
int64_t df_cuda_mm_narrow_launches(void);
/* Kernel launches of the device-routed MoE op (moe_fused) so far: 3 per call with DELTAFIN_CUDA_LEAN bit 8
 * (route, gate/up products, gate + down products + combine), 5 without (tests check it). */
int64_t df_cuda_moe_launches(void);
/* 1: every decode-step launch saving (narrow blocks and small job tables for one-token products, the
 * one-launch split attention, round 5's deeper loads, round 6's fused MoE down launch and split attention with
 * more loads in flight, round 7's programmatic dependent launches and register-resident route, round 8's fused
 * add + norm and q/k norm + rope; not round 8's split of one-token spine rows, bit 512, which changes bits); 0: none.
 * Default (DELTAFIN_CUDA_LEAN unset, 12450670): all but the narrow product blocks, the round-6 attention and the
 * round-7 shared-gate down launch, plus bits 512, 2048, 4096, 8192, 16384, 32768, 65536, 262144, 524288, 1048576, 2097152
 * and 8388608 (cuda_mm.cu lists them). The results are the
 * same bits either way (1 or 0). */
void df_cuda_set_lean(int on);
/* Kernel launches with the programmatic-serialization attribute so far (DELTAFIN_CUDA_LEAN bit 32; tests). */
int64_t df_cuda_pdl_launches(void);
/* Launches of the register-resident route kernel (bit 64) so far (tests). */
int64_t df_cuda_route_fast_launches(void);
/* Launches of the MoE down launch with the gate once per block (bit 128, opt-in) so far (tests). */
int64_t df_cuda_moe_down_sh_launches(void);
/* The one-token products' row split (DELTAFIN_CUDA_MM_SPLIT1; tests): at least s 16-byte steps per lane (1, 2,
 * 4, 8 or 16) for every one-token product; 0: the default (8 for spine weights with DELTAFIN_CUDA_LEAN bit 512,
 * else 16). */
void df_cuda_set_split1(int s);
/* Launches of the fused row ops (add_rmsnorm, qk_norm_rope; DELTAFIN_CUDA_LEAN bit 256, round 8) so far (tests). */
int64_t df_cuda_fused_launches(void);
/* The whole DELTAFIN_CUDA_LEAN mask (tests; round 9's bits 1024 and 2048 are not in df_cuda_set_lean(1)):
 * m & 0x7fffffff (31 bits since round 12; 16 before); a negative m: the default (or the env's value) again. */
void df_cuda_set_lean_mask(int m);
int df_cuda_lean_default(void); /* the mask the backend uses without DELTAFIN_CUDA_LEAN */
/* Launches of round 9's one-token spine products through the cp.async pipeline (bit 1024) so far (tests). */
int64_t df_cuda_mm_cp_launches(void);
/* Launches of round 9's MoE down launch with its rows streamed through cp.async (bit 2048) so far (tests). */
int64_t df_cuda_moe_down_cp_launches(void);
/* Launches of round 10's one-token GQA decode attention over (chunk, KV head) blocks (bit 4096) so far (tests). */
int64_t df_cuda_attn_dec_launches(void);
/* Device-routed MoE layers run with the route inside the gate/up and down launches (round 10, bit 8192) so far (tests). */
int64_t df_cuda_moe_rt_launches(void);
/* round 17: MoE layers whose gate/up launch applied the gate (k_guh_rt) */
int64_t df_cuda_moe_guh_launches(void);
void df_cuda_set_attn_kw(int kw); /* k_attn_dec's positions a warp: 2 or 4; anything else: DELTAFIN_CUDA_ATTN_KW or 4 */
void df_cuda_set_attn_th(int th); /* k_attn_dec's threads a block: 128 or 256; anything else: DELTAFIN_CUDA_ATTN_TH or 256 */
/* round 20: the fewest parts k_attn_dec combines in a tree (0: never; < 0: DELTAFIN_CUDA_ATTN_TREE or 48) */
void df_cuda_set_attn_tree(int parts);
/* Launches of round 11's one-token spine products in one balanced wave (k_mm_bal, bit 16384) so far (tests). */
int64_t df_cuda_mm_bal_launches(void);
/* Launches of round 13's one-token FP8 products a warp per 4 whole rows (k_mm_f8, bit 524288) so far (tests). */
int64_t df_cuda_mm_f8_launches(void);
int64_t df_cuda_mm_f8_split_launches(void); /* of those, with the columns split over 2 or 4 warps (bit 2097152) */
int64_t df_cuda_mm_f8_bf16_launches(void);  /* BF16 one-token products through that body (round 15, bit 134217728) */
/* Launches of round 12's FP8 MoE down launch (k_moe_down_f8, bit 65536) so far (tests). */
int64_t df_cuda_moe_down_f8_launches(void);
int64_t df_cuda_moe_down_f8_step_launches(void); /* of those, one scale product a 16-byte step (bit 8388608) */
int64_t df_cuda_moe_down_f8_comb_launches(void); /* of those, the combine in its own launch after (bit 16777216: the same bits) */
/* Launches of round 15's FP8 MoE down launch, a block per row group of every expert (k_moe_down_c8, bit 33554432: k_moe_down_f8's
 * bits; counted in df_cuda_moe_down_f8_step_launches too with bit 8388608) so far (tests). */
int64_t df_cuda_moe_down_c8_launches(void);
/* MLA calls whose decode launches loaded resident kv_b rows before their wait (round 15, bit 67108864: the same bits) so far (tests). */
int64_t df_cuda_mla_early_calls(void);
/* Launches of round 12's FP8 gate/up launch at 2 blocks an SM (k_mm_dev2, bit 262144) so far (tests). */
int64_t df_cuda_moe_gu_f8_launches(void);
/* Launches of round 13's FP8 gate/up launch with k_mm_f8's body (k_mm_devf8, bit 1048576) so far (tests). */
int64_t df_cuda_moe_gu_f8r_launches(void);
/* cuBLAS GEMMs of the split-f16 prefill form (prefill round 2, the default split form) so far (tests). */
int64_t df_cuda_split_f16_gemms(void);
/* x splits of the split-f16 form so far: jobs of one matmul_batch call with the same x share one (tests). */
int64_t df_cuda_split_f16_xsplits(void);
/* The weight slab of a prefill product in bytes (rows go through cuBLAS in chunks of it; 0: the default, 256 MiB);
 * tests make it small. */
void df_cuda_set_slab_bytes(size_t bytes);
/* Round 25: the launches between two host-visible points recorded and issued as one CUDA graph, updated in place,
 * from the second time the same kernels come in the same order (DELTAFIN_CUDA_GRAPH, default on; cuda_graph.cu).
 * on 0: every launch issued directly from here (what was recorded goes out first); min_nodes >= 2: the fewest
 * launches a graph is built for (default 16, DELTAFIN_CUDA_GRAPH_MIN); anything less keeps it (tests). */
void df_cuda_set_graph(int on, int min_nodes);
/* out[7]: flushes, graph launches, graphs built, graph nodes updated, launches issued directly, launches recorded,
 * steps whose first launch found the GPU idle (those go out launch by launch: a graph would wait for the whole step) */
void df_cuda_graph_stats(int64_t out[7]);
/* decode_layers (cuda_dec.cu: the persistent decode kernel): on 1 / 0 overrides DELTAFIN_CUDA_PERSIST (default off:
 * opt-in until measured), -1 reads it again; its launches so far (tests). */
void df_cuda_set_persist(int on);
int64_t df_cuda_dec_launches(void);
/* 0: record every step, even one whose first launch finds the GPU idle (tests: a test's steps follow its reads); 1: the default */
void df_cuda_set_graph_idle_check(int on);

#ifdef __cplusplus
}
#endif

#endif
