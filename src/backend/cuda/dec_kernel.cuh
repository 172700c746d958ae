/* dec_kernel.cuh - the decode step of a run of Qwen3-MoE-kind layers as tasks of one persistent kernel (issue 13, the
 * 70% goal): the kernel bench/cuda/layer_bench.cu measures, on the GPU (nvcc) or on the CPU (g++ -DSIMT_EMU
 * -Ibench/cuda with simt_emu.h: every GPU thread a fiber), and the one the CUDA backend's decode_layers op runs
 * (cuda_dec.cu; opt-in while unmeasured: docs/PERFORMANCE.md, round 27). Everything is in namespace dec. The shapes are dec_layers.h's; the layers' weights and caches come in as dec_layer tables (the backend's own
 * layout, so tests/emu/dec_cpu_parity.c can hand it the CPU backend's memory of a real checkpoint).
 *
 * A step (one layer of one token) is cut into tasks, op by op, the same for every way of running them:
 *   QKV    rows of q, k, v (three tensors), the input norm computed by every block from h (no launch of its own)
 *   ATTN   (KV head, CH positions): q/k norm + RoPE of its heads, scores, softmax part, P x V part; the last part
 *          of a KV head (a ticket) combines its heads' parts into att
 *   O      rows of W_o, h += the row's value
 *   ROUTER rows of W_r, the norm again computed by every block
 *   GUH    (chosen expert, rows) gate and up rows together, a = silu(g) u; every block routes for itself
 *   DOWN   (chosen expert, rows); the last of the TOPK experts' tasks of a row range (a ticket) adds their sum,
 *          weighted in k order, into h
 *   LM     (with V) lm_head rows (the final norm in every block), each task's best logit; the last task (a ticket)
 *          takes the argmax and writes the token's embedding row as h
 * M = 0: a kernel an op (k_op; programmatic launches: wait = griddepcontrol.wait); M = 1: k_persist, resident blocks
 * taking the tasks of every op in order, waiting on per-op counters (acquire loads of counters bumped after a fence). */
#ifndef DF_DEC_KERNEL_CUH
#define DF_DEC_KERNEL_CUH
#include "dec_layers.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_runtime.h>
/* what differs from the CPU emulation (simt_emu.h): shared memory and the inline PTX helpers below */
#define DYN_SMEM(T, name) extern __shared__ T name[]
#define BLOCK_STATIC(T, name) __shared__ T name
#define PTX(cuda, emu) cuda
#else
#include "simt_emu.h"
#define DYN_SMEM(T, name) T *name = (T *)emu_smem()
#define BLOCK_STATIC(T, name) T &name = *(T *)emu_static(sizeof(T))
#define PTX(cuda, emu) emu
#endif

namespace dec {
#define TH 256 /* threads a block, 8 warps */
static_assert(H == 8 * TH && NQ == 8 * NKV && HD_ == 128, "the kernel's code: one 8-value step of h a thread, a warp a q head of a KV head");
static_assert(NE % 32 == 0 && NE <= 1024 && IE % 256 == 0 && IE <= 4096 && TOPK <= 32, "experts: a lane's NE / 32 logits, IE / 256 steps a row");
static_assert(CH >= 1 && CH <= 32, "the attention: a lane a cached position of the task's chunk");

enum { OP_QKV, OP_ATTN, OP_O, OP_R, OP_GUH, OP_DN, NOP, OP_LM = NOP, NOPX }; /* OP_LM: after the last layer, with a vocabulary */
/* counters, each on its own 128-byte line (index * 32 in the counter array) */
enum { C_H, C_QKV, C_ATT, C_O, C_R, C_GUH0, C_TA0 = C_GUH0 + TOPK, C_TD0 = C_TA0 + NKV, C_TOK = C_TD0 + 64, C_TLM, C_ERR, C_N };
#define CN(n, c) ((n).cnt + 32 * (c))

/* a layer's weights and cache as the backend holds them (a table in device memory: a kernel parameter's arrays
 * indexed by a run-time layer would be copied to local memory): q, k, v, o, the router as their own tensors, each
 * routed expert's gate, up and down as its own tensor found through a table of NE pointers (the backend's device table
 * of VRAM-resident experts: slots in no particular order), the norms' f32 vectors, the K/V cache a position's K row
 * then its V row (gqa.c's layout) */
typedef dec_layer LW; /* dec_layers.h */
/* routed expert e's part p (0 gate, 1 up, 2 down) of layer table L */
__device__ __forceinline__ const uint16_t *expert_part(const LW &L, int e, int p) {
    return *(const uint16_t *const *)(const void *)(L.etab + (size_t)(3 * e + p) * (size_t)L.estride);
}
struct Net {
    const LW *lw;
    const float *cs;            /* RoPE cos / sin at position P, HD_ floats */
    float eps, scale;           /* the RMSNorms' epsilon; the attention's softmax scale */
    float *h, *qkv, *part, *att, *lg, *act, *dy;
    int *ids_dbg;
    unsigned *cnt;
    int L, P, nch, G, pf, pexp, nodep, l2pf, smw, dbg_n;
    int trap; /* a wait that times out traps (the launch fails, named by the backend) instead of only setting C_ERR */
    /* the token boundary (V > 0): final norm nf, lm_head wlm (V x H), argmax, the next token's row of emb as h */
    const uint16_t *wlm, *emb;
    const float *nf;
    int V, lm_R, lm_n, ntoks;
    float *bestv, *hfin, *lgv; /* a task's best logit; h before the boundary (the check); the logits */
    int *besti, *toks;   /* its id; the tokens chosen */
    int ts_on, ts_tok;           /* the timeline: token ts_tok's steps (ts_on: 1) */
    unsigned long long *ts;      /* [L][NOPX][4]: first begin, first ready, last ready, last end (global timer, ns); then [L][TA_N][2] */
    int qkv_R, qkv_n, o_R, o_n, r_R, r_n, guh_pairs, guh_tpe, dn_R, dn_tpe;
};
struct Sh {
    int ids[TOPK];
    float wts[TOPK];
    int s;
    float red[8];
    int redi[8];
    unsigned last;
    int tok;
    int P, nch; /* the position (the cached rows before it) and its attention chunks: the kernel's argument or Net's */
};

__device__ __forceinline__ void pdl_go(void) { PTX(asm volatile("griddepcontrol.launch_dependents;" ::: "memory"), ); }
__device__ __forceinline__ void pdl_wait(void) { PTX(asm volatile("griddepcontrol.wait;" ::: "memory"), ); }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
    return v;
}
/* the block's sum, the warps' sums added in warp order (the same bits in every block) */
__device__ __forceinline__ float block_sum(float v, Sh &sh) {
    v = warp_sum(v);
    __syncthreads();
    if (!(threadIdx.x & 31)) sh.red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0;
#pragma unroll
    for (int w = 0; w < TH / 32; w++) s += sh.red[w];
    return s;
}
/* DEC_XPF (an experiment, layer_bench's builds layer_bench_xpf / layer_bench_ef; 0 in every other build): 1, each
 * attention task asks L2 to keep its share of the NEXT layer's q/k/v rows (evict_last, xpf_next below) while the
 * attention's chain leaves HBM idle, and every weight load of the products is evict_first (so that the 75 MB of
 * experts and the lm_head streamed between do not push those rows out); 2, the evict_first loads alone (the control) */
#ifndef DEC_XPF
#define DEC_XPF 0
#endif
static_assert(DEC_XPF >= 0 && DEC_XPF <= 2, "DEC_XPF: 0 (off), 1 (the next layer's q/k/v asked of L2, evict_first loads), 2 (the loads alone)");
#if DEC_XPF
/* the evict_first policy (sm_90 takes the eviction priority of a 16-byte load only as a cache hint); not volatile: the
 * compiler may create it once */
__device__ __forceinline__ unsigned long long pol_ef(void) {
    unsigned long long p = 0;
    PTX(asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p)), );
    return p;
}
#define LDW_OP "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32"
#define LDW_POL_S ", %5" /* operand 5 in ldw (after p), 6 in ldw_after (after acc) */
#define LDW_POL_A ", %6"
#define LDW_POLARG , "l"(pol_ef())
#else
#define LDW_OP "ld.global.nc.L1::no_allocate.v4.u32"
#define LDW_POL_S ""
#define LDW_POL_A ""
#define LDW_POLARG
#endif
/* a weight load: read-only, not kept in L1, issued where it stands (before a wait) */
__device__ __forceinline__ uint4 ldw(const uint4 *p) {
    uint4 r;
    PTX(asm volatile(LDW_OP " {%0, %1, %2, %3}, [%4]" LDW_POL_S ";" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p) LDW_POLARG), r = *p);
    return r;
}
/* the same, issued only once acc is known: a row's registers are reloaded after its product has consumed them (else the
 * compiler may keep old and new rows live at once: 2 x the registers) */
__device__ __forceinline__ uint4 ldw_after(const uint4 *p, float acc) {
    uint4 r;
    PTX(asm volatile(LDW_OP " {%0, %1, %2, %3}, [%4]" LDW_POL_A ";" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "f"(acc) LDW_POLARG),
        ((void)acc, r = *p));
    return r;
}
__device__ __forceinline__ unsigned ld_acq(const unsigned *p) {
    unsigned v;
    PTX(asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"), v = *(volatile const unsigned *)p);
    return v;
}
__device__ __forceinline__ unsigned long long gtimer(void) {
    unsigned long long t;
    PTX(asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)), t = g_emu.switches);
    return t;
}
/* the timeline (ts_on): thread 0 of each task folds the global timer into op's slots of step s's layer, when s is a
 * step of token ts_tok; k: 0 the task began, 1 its wait returned, 2 it ended */
enum { TS_BEGIN, TS_READY, TS_END };
__device__ __forceinline__ void ts_mark(const Net &n, int s, int op, int k) {
    if (!n.ts_on || s / n.L != n.ts_tok || threadIdx.x) return;
    unsigned long long *p = n.ts + ((size_t)(s % n.L) * NOPX + op) * 4;
    const unsigned long long t = gtimer();
    if (k == TS_BEGIN) atomicMin(p, t);
    else if (k == TS_READY) atomicMin(p + 1, t), atomicMax(p + 2, t);
    else atomicMax(p + 3, t);
}
/* points inside the attention's tasks (the timeline): thread 0 of each task folds the timer into the first and last
 * time a task passed point k (TA_*), after the ops' slots: ts + L x NOPX x 4 + (layer x TA_N + k) x 2 */
enum { TA_Q, TA_ROWS, TA_PART, TA_TICKET, TA_COMBINED, TA_N };
__device__ __forceinline__ void ts_sub(const Net &n, int s, int k) {
    if (!n.ts_on || s / n.L != n.ts_tok || threadIdx.x) return;
    unsigned long long *p = n.ts + (size_t)n.L * NOPX * 4 + ((size_t)(s % n.L) * TA_N + k) * 2;
    const unsigned long long t = gtimer();
    atomicMin(p, t), atomicMax(p + 1, t);
}
__device__ __forceinline__ void ts_end(const Net &n, int s, int op) { /* after every thread of the task */
    if (!n.ts_on) return;
    __syncthreads();
    ts_mark(n, s, op, TS_END);
}
/* M = 0 (launch arm): the programmatic wait; M = 1: thread 0 spins on the counter (acquire) until it reaches target
 * (nodep: no wait at all, a measurement of the tasks' streaming alone: the results are garbage) */
template <int M> __device__ __forceinline__ void dep_wait(const Net &n, const unsigned *c, unsigned target) {
    if (!M) {
        pdl_wait();
        return;
    }
    if (n.nodep) return;
    if (!threadIdx.x) {
        const long long t0 = clock64();
        unsigned *err = CN(n, C_ERR);
        while ((int)(ld_acq(c) - target) < 0) {
            if (*(volatile unsigned *)err) break;
            __nanosleep(32);
            if (clock64() - t0 > 4000000000LL) {
                atomicExch(err, 1u);
                if (n.trap) PTX(asm volatile("trap;"), abort());
                break;
            }
        }
    }
    __syncthreads();
}
/* a task's results written by every thread: counted done (fence, then the counter) */
__device__ __forceinline__ void done(unsigned *c) {
    __syncthreads();
    if (!threadIdx.x) __threadfence(), atomicAdd(c, 1u);
}
/* true in the block that arrives n-th (mod n) at the ticket; its later reads see every earlier arrival's writes */
__device__ __forceinline__ bool ticket_last(unsigned *c, unsigned n, Sh &sh) {
    __syncthreads();
    if (!threadIdx.x) {
        __threadfence();
        const unsigned o = atomicAdd(c, 1u);
        sh.last = o % n == n - 1;
        if (sh.last) __threadfence();
    }
    __syncthreads();
    return sh.last != 0;
}
/* x from shared memory, loaded where it stands (volatile: not hoisted out of the row loop into 64 registers) */
__device__ __forceinline__ float4 lds4(const float4 *p) {
    float4 v;
    PTX(asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"((unsigned)__cvta_generic_to_shared(p))), v = *p);
    return v;
}
/* the same, issued only once dep is known (x of a step read after the step two before has been multiplied: the
 * compiler would otherwise load all of a row's x first, 8 J registers more) */
__device__ __forceinline__ float4 lds4_after(const float4 *p, float dep) {
    float4 v;
    PTX(asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"((unsigned)__cvta_generic_to_shared(p)), "f"(dep)),
        ((void)dep, v = *p));
    return v;
}
/* 8 BF16 weights against x's 8 values (x in two planes: A[q] = x[8q..8q+3], B[q] = x[8q+4..8q+7]) */
__device__ __forceinline__ float dot8(uint4 v, float4 a, float4 b, float acc) {
    acc = fmaf(__uint_as_float(v.x << 16), a.x, acc);
    acc = fmaf(__uint_as_float(v.x & 0xffff0000u), a.y, acc);
    acc = fmaf(__uint_as_float(v.y << 16), a.z, acc);
    acc = fmaf(__uint_as_float(v.y & 0xffff0000u), a.w, acc);
    acc = fmaf(__uint_as_float(v.z << 16), b.x, acc);
    acc = fmaf(__uint_as_float(v.z & 0xffff0000u), b.y, acc);
    acc = fmaf(__uint_as_float(v.w << 16), b.z, acc);
    acc = fmaf(__uint_as_float(v.w & 0xffff0000u), b.w, acc);
    return acc;
}
/* A warp's n rows (addr(k): row k's first 16 bytes; J 16-byte steps a lane, the lane's steps lane + 32 j): rows_pre
 * loads the first PF into b; rows_run multiplies row k from b[k % PF] and loads row k + PF into its place, the sum
 * to emit(k, sum) in every lane. */
template <int J, int PF, class A> __device__ __forceinline__ void rows_pre(int n, A addr, uint4 (&b)[PF][J]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int s = 0; s < PF; s++)
        if (s < n) {
            const uint4 *p = addr(s);
#pragma unroll
            for (int j = 0; j < J; j++) b[s][j] = ldw(p + lane + 32 * j);
        }
}
/* 16 bytes global -> shared, asynchronously (cp.async; the emulation copies at once); cp16_after: issued only once dep
 * is known (a ring slot is refilled after its row's product has read it) */
__device__ __forceinline__ void cp16(void *dst, const void *src) {
    PTX(asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)), emu_cp16(dst, src));
}
__device__ __forceinline__ void cp16_after(void *dst, const void *src, float dep) {
    PTX(asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "f"(dep)),
        ((void)dep, emu_cp16(dst, src)));
}
__device__ __forceinline__ void cp_commit(void) { PTX(asm volatile("cp.async.commit_group;" ::: "memory"), emu_cp_commit()); }
template <int N> __device__ __forceinline__ void cp_wait(void) { PTX(asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"), emu_cp_wait(N)); }
/* persist-smem (smw): a warp's rows in flight in a ring of shared memory instead of registers: the persistent kernel
 * runs one block an SM (more registers spill), so its registers hold half the launch arm's bytes in flight, while
 * ~180 KB of the SM's shared memory sit unused. RING_BYTES a block (after the 16 KB of x planes), RING_WARP a warp,
 * ring_slots<J>() rows of J x 512 bytes; slot s holds a row as [J][32 lanes] 16-byte pieces, each lane reading only
 * the pieces it copied (no barrier between lanes). */
#ifndef PBLOCKS /* the persistent kernel's blocks an SM (-DPBLOCKS=2: 16 warps an SM at <= 128 registers, with spills) */
#define PBLOCKS 1
#endif
#define PLANES_BYTES (16 << 10)
#define RING_BYTES ((PBLOCKS == 1 ? 160 : 80) << 10)
#define RING_WARP (RING_BYTES / 8)
template <int J> __host__ __device__ constexpr int ring_slots() { return RING_WARP / (J * 512) < 1 ? 1 : RING_WARP / (J * 512); }
template <int J, int SL, class A> __device__ __forceinline__ void ring_pre(int n, A addr, uint4 *ring) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int s = 0; s < SL; s++) {
        if (s < n) {
            const uint4 *p = addr(s);
#pragma unroll
            for (int j = 0; j < J; j++) cp16(ring + (s * J + j) * 32 + lane, p + lane + 32 * j);
        }
        cp_commit(); /* a group a slot, empty or not: the waits below count groups */
    }
}
template <int J, int SL, class A, class E>
__device__ __forceinline__ void ring_run(int n, A addr, const float4 *XA, const float4 *XB, E emit, uint4 *ring) {
    const int lane = threadIdx.x & 31;
#pragma unroll 1
    for (int k = 0; k < n; k++) {
        uint4 *slot = ring + (k % SL) * J * 32 + lane;
        cp_wait<SL - 1>(); /* row k's group (SL - 1 groups were committed after it) */
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int j = 0; j < J; j++) {
            float &a = j & 1 ? a1 : a0;
            a = dot8(slot[j * 32], lds4_after(XA + lane + 32 * j, a), lds4_after(XB + lane + 32 * j, a), a);
        }
        const float acc = a0 + a1;
        if (k + SL < n) {
            const uint4 *p = addr(k + SL);
#pragma unroll
            for (int j = 0; j < J; j++) cp16_after(slot + j * 32, p + lane + 32 * j, acc);
        }
        cp_commit();
        emit(k, warp_sum(acc));
    }
    cp_wait<0>(); /* (only empty groups are left; the next task's copies must not meet them) */
}
/* l2pf: the rows past the first PF asked of L2 before the wait too (one bulk prefetch a row, lane 0), so that what
 * the registers cannot hold is on chip when the wait returns */
template <int J, class A> __device__ __forceinline__ void rows_l2(const Net &n, int from, int nr, A addr) {
    if (!n.l2pf || (threadIdx.x & 31)) return;
    for (int k = from; k < nr; k++)
        PTX(asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(addr(k)), "r"(J * 512) : "memory"), (void)addr(k));
}
template <int J, int PF, class A, class E>
__device__ __forceinline__ void rows_run(int n, A addr, const float4 *XA, const float4 *XB, E emit, uint4 (&b)[PF][J]) {
    const int lane = threadIdx.x & 31;
#pragma unroll 1
    for (int k0 = 0; k0 < n; k0 += PF) {
#pragma unroll
        for (int s = 0; s < PF; s++) {
            const int k = k0 + s;
            if (k < n) {
                float a0 = 0.0f, a1 = 0.0f; /* even and odd steps: two chains, x of step j read once step j - 2 is done */
#pragma unroll
                for (int j = 0; j < J; j++) {
                    float &a = j & 1 ? a1 : a0;
                    a = dot8(b[s][j], lds4_after(XA + lane + 32 * j, a), lds4_after(XB + lane + 32 * j, a), a);
                }
                const float acc = a0 + a1;
                if (k + PF < n) {
                    const uint4 *p = addr(k + PF);
#pragma unroll
                    for (int j = 0; j < J; j++) b[s][j] = ldw_after(p + lane + 32 * j, acc);
                }
                emit(k, warp_sum(acc));
            }
        }
    }
}
/* the rows of a task through registers (rows_pre / rows_run) or the ring (M = 1 with smw) */
#define RING_OF(sm) ((uint4 *)((char *)(sm) + PLANES_BYTES) + (threadIdx.x >> 5) * (RING_WARP / 16))
template <int M, int J, int PF, class A> __device__ __forceinline__ void any_pre(const Net &n, int nr, A addr, uint4 (&b)[PF][J], float4 *sm) {
    if (M && n.smw) ring_pre<J, ring_slots<J>()>(nr, addr, RING_OF(sm));
    else rows_pre<J, PF>(nr, addr, b);
}
template <int M, int J, int PF, class A, class E>
__device__ __forceinline__ void any_run(const Net &n, int nr, A addr, const float4 *XA, const float4 *XB, E emit, uint4 (&b)[PF][J], float4 *sm) {
    if (M && n.smw) ring_run<J, ring_slots<J>()>(nr, addr, XA, XB, emit, RING_OF(sm));
    else rows_run<J, PF>(nr, addr, XA, XB, emit, b);
}
/* acc + the squares of v's 4 values, as explicit fmas: every kernel gets the same bits (contraction left to the
 * compiler could differ between kernels; the arms are compared bit for bit) */
__device__ __forceinline__ float sumsq4(float4 v, float acc) { return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, acc)))); }
/* x = rmsnorm(h) by w into the planes (H = 2048: one 8-value step a thread); h read through L2 */
__device__ __forceinline__ void norm_planes(const float *h, const float *w, float eps, float4 *XA, float4 *XB, Sh &sh) {
    const int q = threadIdx.x;
    const float4 a = __ldcg((const float4 *)h + 2 * q), b = __ldcg((const float4 *)h + 2 * q + 1);
    float ss = sumsq4(b, sumsq4(a, 0.0f));
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / H + eps);
    const float4 wa = ((const float4 *)w)[2 * q], wb = ((const float4 *)w)[2 * q + 1];
    XA[q] = make_float4(wa.x * (a.x * inv), wa.y * (a.y * inv), wa.z * (a.z * inv), wa.w * (a.w * inv));
    XB[q] = make_float4(wb.x * (b.x * inv), wb.y * (b.y * inv), wb.z * (b.z * inv), wb.w * (b.w * inv));
    __syncthreads();
}
__device__ __forceinline__ void planes_from(const float *x, int n8, float4 *XA, float4 *XB) {
    for (int q = threadIdx.x; q < n8; q += TH) XA[q] = __ldcg((const float4 *)x + 2 * q), XB[q] = __ldcg((const float4 *)x + 2 * q + 1);
    __syncthreads();
}
/* the route of step s (softmax of the router's logits, top 8 by value then lower id, weights renormalised) into sh,
 * by warp 0 of the block; once a step a block */
__device__ void route(const Net &n, int s, Sh &sh) {
    if (sh.s == s) return;
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        constexpr int RV = NE / 32; /* a lane's logits: experts RV lane .. RV lane + RV - 1 */
        float v[RV];
        if constexpr (RV == 4) {
            const float4 v4 = __ldcg((const float4 *)n.lg + lane);
            v[0] = v4.x, v[1] = v4.y, v[2] = v4.z, v[3] = v4.w;
        } else {
#pragma unroll
            for (int i = 0; i < RV; i++) v[i] = __ldcg(n.lg + RV * lane + i);
        }
        float mx = v[0];
#pragma unroll
        for (int i = 1; i < RV; i++) mx = fmaxf(mx, v[i]);
        mx = warp_max(mx);
        float e[RV], es = 0;
#pragma unroll
        for (int i = 0; i < RV; i++) e[i] = expf(v[i] - mx), es += e[i];
        const float den = warp_sum(es);
        float p[RV];
#pragma unroll
        for (int i = 0; i < RV; i++) p[i] = e[i] / den;
        unsigned taken = 0;
        float pk[TOPK];
#pragma unroll
        for (int k = 0; k < TOPK; k++) {
            float bv = -1.0f;
            int bi = 1 << 30;
#pragma unroll
            for (int i = 0; i < RV; i++)
                if (!(taken >> i & 1) && p[i] > bv) bv = p[i], bi = RV * lane + i;
#pragma unroll
            for (int o = 16; o; o >>= 1) {
                const float ov = __shfl_xor_sync(~0u, bv, o);
                const int oi = __shfl_xor_sync(~0u, bi, o);
                if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
            }
            if (bi / RV == lane) taken |= 1u << (bi % RV);
            pk[k] = bv;
            if (!lane) sh.ids[k] = (unsigned)bi < (unsigned)NE ? bi : 0; /* (always < NE but in the nodep arm, whose logits are garbage) */
        }
        float ws = 0, mine = 0.0f;
#pragma unroll
        for (int k = 0; k < TOPK; k++) ws += pk[k], mine = lane == k ? pk[k] : mine;
        if (lane < TOPK) sh.wts[lane] = mine / ws;
        if (!lane) sh.s = s;
    }
    __syncthreads();
    if (!blockIdx.x && threadIdx.x < TOPK && s < n.dbg_n) n.ids_dbg[s * TOPK + threadIdx.x] = sh.ids[threadIdx.x];
}

/* ---- the tasks: M = 0 launch arm (wait = griddepcontrol.wait), M = 1 persistent (wait = counters) ------------------ */
/* D: rows in flight a warp, in units of 16 steps a lane (256 bytes a lane). The launch arm's kernels: 1, at 2 blocks
 * an SM (<= 128 registers, no spills: 128 KB an SM in flight). The persistent kernel: PDEPTH (default 1), one block an
 * SM: every op's code in one kernel needs more than 128 registers (1.7 KB of spills a thread at 2 blocks an SM), and
 * at PDEPTH 2 more than 255 (2.4 KB of spills), so by default it keeps half the launch arm's bytes in flight (64 KB
 * an SM); build with -DPDEPTH=2 to see the spilling variant. */
#ifndef PDEPTH
#define PDEPTH 1
#endif
#define DEPTH (M ? PDEPTH : 1)
/* a dense product's task: rows [t R, t R + R) of W (< rows; J x 256 BF16 columns each), PF rows in flight a warp, the
 * first loaded before the wait for counter wc to reach target; x = rmsnorm(h) by normw (normw != NULL) or the J x 256
 * floats at xin; emit(row, value) in lane 0; then the task counted done on donec */
/* Rows: a product's rows in up to three tensors (q, k, v: rows [0, e0) of W, [e0, e1) of W1, the rest of W2) */
struct Rows {
    const uint16_t *W, *W1, *W2;
    int e0, e1;
};
__device__ __forceinline__ Rows rows1(const uint16_t *W) { return Rows{W, W, W, 1 << 30, 1 << 30}; }
template <int M, int J, int PF, class E>
__device__ __forceinline__ void t_dense(const Net &n, int s, int op, int t, int R, int rows, Rows W, const unsigned *wc, unsigned target,
                                        const float *normw, const float *xin, unsigned *donec, float4 *sm, Sh &sh, E emit) {
    __syncthreads();
    ts_mark(n, s, op, TS_BEGIN);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = t * R;
    const int rt = rows - r0 < R ? rows - r0 : R, nw = rt > w ? (rt - w + 7) / 8 : 0;
    auto addr = [&](int k) {
        const int r = r0 + w + 8 * k;
        const uint16_t *p = r < W.e0 ? W.W + (size_t)r * (J * 256) : r < W.e1 ? W.W1 + (size_t)(r - W.e0) * (J * 256) : W.W2 + (size_t)(r - W.e1) * (J * 256);
        return (const uint4 *)p;
    };
    uint4 b[PF][J];
    if (n.pf) any_pre<M, J, PF>(n, nw, addr, b, sm), rows_l2<J>(n, M && n.smw ? ring_slots<J>() : PF, nw, addr); /* past the rows in flight */
    dep_wait<M>(n, wc, target);
    ts_mark(n, s, op, TS_READY);
    if (!n.pf) any_pre<M, J, PF>(n, nw, addr, b, sm);
    float4 *XA = sm, *XB = sm + J * 32;
    if (normw) norm_planes(n.h, normw, n.eps, XA, XB, sh);
    else planes_from(xin, J * 32, XA, XB);
    any_run<M, J, PF>(n, nw, addr, XA, XB, [&](int k, float v) { if (!lane) emit(r0 + w + 8 * k, v); }, b, sm);
    if (M && donec) done(donec);
    ts_end(n, s, op);
}
template <int M> __device__ void t_qkv(const Net &n, int l, int s, int t, float4 *sm, Sh &sh) {
    float *y = n.qkv;
    const int tok0 = n.V && !l; /* a token's first layer reads the row the boundary wrote, else the layer before's h */
    t_dense<M, H / 256, 2 * DEPTH>(n, s, OP_QKV, t, n.qkv_R, QKV, Rows{n.lw[l].wq, n.lw[l].wk, n.lw[l].wv, QR, QR + KR}, CN(n, tok0 ? C_TOK : C_H), (unsigned)(tok0 ? s / n.L : n.dn_tpe * s),
                                   n.lw[l].n1, NULL, CN(n, C_QKV), sm, sh, [&](int r, float v) { y[r] = v; });
}
/* q or k head (128 values at src) normalised by g, rotated, into dst (warp-wide; lane holds 4 values) */
__device__ __forceinline__ void head_norm_rope(const float *src, const float *g, const float *cs, float eps, float *tmp, float *dst) {
    const int lane = threadIdx.x & 31;
    const float4 v = __ldcg((const float4 *)src + lane);
    const float ss = warp_sum(sumsq4(v, 0.0f));
    const float inv = 1.0f / sqrtf(ss / HD_ + eps);
    const float4 gg = ((const float4 *)g)[lane];
    ((float4 *)tmp)[lane] = make_float4(gg.x * (v.x * inv), gg.y * (v.y * inv), gg.z * (v.z * inv), gg.w * (v.w * inv));
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = lane + 32 * r;
        const float a = tmp[i], bb = tmp[i + HD_ / 2], c = cs[2 * i], sn = cs[2 * i + 1];
        dst[i] = fmaf(a, c, -(bb * sn)), dst[i + HD_ / 2] = fmaf(bb, c, a * sn);
    }
    __syncwarp();
}
/* DEC_XPF == 1: attention task t of nt asks L2 for its share of layer l + 1's (the token's last layer: layer 0's) q, k
 * and v rows (4 KB each, one bulk prefetch a row by lane 0 of a warp) under an evict_last policy; issued before the
 * task's wait, since no kernel writes weights. Changes no bits (the emulation: nothing). */
__device__ __forceinline__ void xpf_next(const Net &n, int l, int t, int nt) {
#if DEC_XPF == 1
    if (threadIdx.x & 31) return;
    const LW &L = n.lw[(l + 1) % n.L];
    const int R = (QKV + nt - 1) / nt;
    for (int r = t * R + (int)(threadIdx.x >> 5); r < (t + 1) * R && r < QKV; r += TH / 32) {
        const uint16_t *p = r < QR ? L.wq + (size_t)r * H : r < QR + KR ? L.wk + (size_t)(r - QR) * H : L.wv + (size_t)(r - QR - KR) * H;
        PTX(asm volatile("{\n\t.reg .b64 pol;\n\tcreatepolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
                         "cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, pol;\n\t}" ::"l"(p), "r"(H * 2) : "memory"),
            (void)p);
    }
#else
    (void)n, (void)l, (void)t, (void)nt;
#endif
}
#define KS 132 /* a cached row's stride in shared memory (floats): float4 reads of 32 rows at once without conflicts */
template <int M> __device__ void t_attn(const Net &n, int l, int s, int t, float4 *sm, Sh &sh) {
    __syncthreads();
    ts_mark(n, s, OP_ATTN, TS_BEGIN);
    const int nch = sh.nch, g = t / nch, c = t % nch, w = threadIdx.x >> 5, lane = threadIdx.x & 31, P = sh.P;
    const int p0 = c * CH, np = P + 1 - p0 < CH ? P + 1 - p0 : CH, ncache = P - p0 < np ? P - p0 : np;
    float *Ks = (float *)sm, *Vs = Ks + CH * KS, *Qs = Vs + CH * KS, *Tq = Qs + 8 * HD_, *Tk = Tq + 8 * HD_;
    float *kv = n.lw[l].kv;
    for (int i = threadIdx.x; i < ncache * (HD_ / 4); i += TH) { /* the cached rows, copied while the products run */
        const int j = i / (HD_ / 4), q = i % (HD_ / 4);
        const float *src = kv + (size_t)(p0 + j) * 2 * KR + (size_t)g * HD_ + 4 * q;
        cp16(Ks + j * KS + 4 * q, src), cp16(Vs + j * KS + 4 * q, src + KR);
    }
    cp_commit();
    xpf_next(n, l, t, NKV * nch);
    dep_wait<M>(n, CN(n, C_QKV), (unsigned)(n.qkv_n * (s + 1)));
    ts_mark(n, s, OP_ATTN, TS_READY);
    head_norm_rope(n.qkv + (size_t)(8 * g + w) * HD_, n.lw[l].qn, n.cs, n.eps, Tq + w * HD_, Qs + w * HD_);
    if (w == 0 && ncache < np) { /* the new position's k and v: this chunk holds position P */
        const int j = P - p0;
        head_norm_rope(n.qkv + QR + (size_t)g * HD_, n.lw[l].kn, n.cs, n.eps, Tk, Ks + j * KS);
        ((float4 *)(Vs + j * KS))[lane] = __ldcg((const float4 *)(n.qkv + QR + KR + (size_t)g * HD_) + lane);
    }
    ts_sub(n, s, TA_Q);
    cp_wait<0>();
    __syncthreads();
    ts_sub(n, s, TA_ROWS);
    if (ncache < np && threadIdx.x < HD_ / 4) { /* the new row into the cache (read by no task of this step) */
        const int j = P - p0;
        ((float4 *)(kv + (size_t)P * 2 * KR + (size_t)g * HD_))[threadIdx.x] = ((const float4 *)(Ks + j * KS))[threadIdx.x];
        ((float4 *)(kv + (size_t)P * 2 * KR + KR + (size_t)g * HD_))[threadIdx.x] = ((const float4 *)(Vs + j * KS))[threadIdx.x];
    }
    { /* warp w: head 8 g + w over the chunk's positions, lane j = position p0 + j */
        const float4 *q4 = (const float4 *)(Qs + w * HD_);
        float sc = -INFINITY;
        if (lane < np) {
            const float4 *k4 = (const float4 *)(Ks + lane * KS);
            float a = 0.0f;
#pragma unroll 8
            for (int m = 0; m < HD_ / 4; m++) {
                const float4 qq = q4[m], kk = k4[m];
                a = fmaf(qq.x, kk.x, a), a = fmaf(qq.y, kk.y, a), a = fmaf(qq.z, kk.z, a), a = fmaf(qq.w, kk.w, a);
            }
            sc = a * n.scale;
        }
        const float mx = warp_max(sc);
        const float p = lane < np ? expf(sc - mx) : 0.0f;
        const float ls = warp_sum(p);
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int j = 0; j < np; j++) {
            const float pj = __shfl_sync(~0u, p, j);
            const float4 v = ((const float4 *)(Vs + j * KS))[lane];
            o.x = fmaf(pj, v.x, o.x), o.y = fmaf(pj, v.y, o.y), o.z = fmaf(pj, v.z, o.z), o.w = fmaf(pj, v.w, o.w);
        }
        float *pt = n.part + ((size_t)(g * nch + c) * 8 + w) * KS;
        if (!lane) pt[0] = mx, pt[1] = ls;
        ((float4 *)(pt + 4))[lane] = o;
    }
    ts_sub(n, s, TA_PART);
    if (ticket_last(CN(n, C_TA0 + g), (unsigned)nch, sh)) { /* the last part of KV head g: combine its 8 heads */
        ts_sub(n, s, TA_TICKET);
        /* warp w: head 8 g + w. The parts' maxima and sums a lane a part (they were a loop of dependent L2 loads, ~2 a
         * part, which made the last block of a head most of the attention's time); the weighted rows a float4 a lane,
         * the weight of each part from its lane, 8 parts' loads in flight */
        const float *pb = n.part + (size_t)g * nch * 8 * KS + (size_t)w * KS; /* part cc at pb + cc * 8 * KS */
        float m = -INFINITY;
        for (int cc = lane; cc < nch; cc += 32) m = fmaxf(m, __ldcg(pb + (size_t)cc * 8 * KS));
        m = warp_max(m);
        float L = 0.0f;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int c0 = 0; c0 < nch; c0 += 32) {
            const int cc = c0 + lane, nn = nch - c0 < 32 ? nch - c0 : 32;
            const float *pt = pb + (size_t)cc * 8 * KS;
            const float f = cc < nch ? expf(__ldcg(pt) - m) : 0.0f;
            if (cc < nch) L = fmaf(__ldcg(pt + 1), f, L);
#pragma unroll 8
            for (int k = 0; k < nn; k++) {
                const float fk = __shfl_sync(~0u, f, k);
                const float4 v = __ldcg((const float4 *)(pb + (size_t)(c0 + k) * 8 * KS + 4) + lane);
                o.x = fmaf(v.x, fk, o.x), o.y = fmaf(v.y, fk, o.y), o.z = fmaf(v.z, fk, o.z), o.w = fmaf(v.w, fk, o.w);
            }
        }
        L = warp_sum(L);
        const float inv = 1.0f / L;
        ((float4 *)(n.att + (size_t)(8 * g + w) * HD_))[lane] = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
        ts_sub(n, s, TA_COMBINED);
        if (M) done(CN(n, C_ATT));
    }
    ts_end(n, s, OP_ATTN);
}
template <int M> __device__ void t_o(const Net &n, int l, int s, int t, float4 *sm, Sh &sh) {
    float *h = n.h;
    t_dense<M, QR / 256, DEPTH>(n, s, OP_O, t, n.o_R, H, rows1(n.lw[l].wo), CN(n, C_ATT), (unsigned)(NKV * (s + 1)), NULL, n.att, CN(n, C_O), sm, sh,
                                [&](int r, float v) { h[r] = __ldcg(h + r) + v; });
}
template <int M> __device__ void t_router(const Net &n, int l, int s, int t, float4 *sm, Sh &sh) {
    float *y = n.lg;
    t_dense<M, H / 256, 2 * DEPTH>(n, s, OP_R, t, n.r_R, NE, rows1(n.lw[l].wr), CN(n, C_O), (unsigned)(n.o_n * (s + 1)), n.lw[l].n2, NULL, CN(n, C_R), sm, sh,
                                   [&](int r, float v) { y[r] = v; });
}
/* the token boundary after step s (the last layer's): logits of lm_head rows (the final norm in every block), each
 * task's best (value, then the lowest id) into bestv / besti; the last task (a ticket) takes the argmax over the
 * tasks in order, keeps h in hfin, writes the token's embedding row as the next h and counts the token (C_TOK) */
template <int M> __device__ void t_lm(const Net &n, int s, int t, float4 *sm, Sh &sh) {
    float *lg = n.lgv;
    t_dense<M, H / 256, 2 * DEPTH>(n, s, OP_LM, t, n.lm_R, n.V, rows1(n.wlm), CN(n, C_H), (unsigned)(n.dn_tpe * (s + 1)), n.nf, NULL, NULL, sm, sh,
                                   [&](int r, float v) { lg[r] = v; });
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = t * n.lm_R, rt = n.V - r0 < n.lm_R ? n.V - r0 : n.lm_R;
    float bv = -INFINITY;
    int bi = 1 << 30;
    if (!lane) { /* the warp's own rows (its lane 0 wrote them), in increasing id: strictly greater keeps the lowest */
        for (int r = r0 + w; r < r0 + rt; r += 8)
            if (lg[r] > bv) bv = lg[r], bi = r;
        sh.red[w] = bv, sh.redi[w] = bi;
    }
    __syncthreads();
    if (!threadIdx.x) {
        for (int k = 1; k < TH / 32; k++)
            if (sh.red[k] > bv || (sh.red[k] == bv && sh.redi[k] < bi)) bv = sh.red[k], bi = sh.redi[k];
        n.bestv[t] = bv, n.besti[t] = bi;
    }
    if (ticket_last(CN(n, C_TLM), (unsigned)n.lm_n, sh)) {
        if (!threadIdx.x) {
            float v = -INFINITY;
            int id = 0;
            for (int k = 0; k < n.lm_n; k++) { /* tasks in row order: strictly greater keeps the lowest id */
                const float x = __ldcg(n.bestv + k);
                if (x > v) v = x, id = __ldcg(n.besti + k);
            }
            sh.tok = id & 0x7fffffff;
            if (sh.tok >= n.V) sh.tok = 0; /* (only a nodep run's garbage) */
            /* the token's index: the step's in the persistent kernel; the launch arms' graph numbers its steps modulo L,
             * so their tokens are counted (C_TOK, which no launch-arm task waits on) */
            const unsigned ti = M ? (unsigned)(s / n.L) : atomicAdd(CN(n, C_TOK), 1u);
            if (ti < (unsigned)n.ntoks) n.toks[ti] = sh.tok;
        }
        __syncthreads();
        const uint16_t *e = n.emb + (size_t)sh.tok * H;
        for (int i = threadIdx.x; i < H; i += TH) n.hfin[i] = __ldcg(n.h + i), n.h[i] = __uint_as_float((uint32_t)e[i] << 16);
        if (M) done(CN(n, C_TOK));
        ts_end(n, s, OP_LM);
    }
}
template <int M> __device__ void t_guh(const Net &n, int l, int s, int t, float4 *sm, Sh &sh) {
    constexpr int D = DEPTH;
    __syncthreads();
    ts_mark(n, s, OP_GUH, TS_BEGIN);
    const int e = t / n.guh_tpe, w = threadIdx.x >> 5, lane = threadIdx.x & 31, i0 = (t % n.guh_tpe) * n.guh_pairs;
    const int pt = IE - i0 < n.guh_pairs ? IE - i0 : n.guh_pairs, npw = pt > w ? (pt - w + 7) / 8 : 0;
    dep_wait<M>(n, CN(n, C_R), (unsigned)(n.r_n * (s + 1)));
    ts_mark(n, s, OP_GUH, TS_READY);
    if (!M) pdl_go(); /* the down launch may start once the logits are final (it routes before its own wait) */
    route(n, s, sh);
    const uint16_t *Wg = expert_part(n.lw[l], sh.ids[e], 0), *Wu = expert_part(n.lw[l], sh.ids[e], 1);
    auto addr = [&](int k) { return (const uint4 *)((k & 1 ? Wu : Wg) + (size_t)(i0 + w + 8 * (k >> 1)) * H); };
    uint4 b[2 * D][H / 256];
    any_pre<M, H / 256, 2 * D>(n, 2 * npw, addr, b, sm); /* the loads fly while the block normalises */
    float4 *XA = sm, *XB = sm + H / 8;
    norm_planes(n.h, n.lw[l].n2, n.eps, XA, XB, sh);
    float *a = n.act + (size_t)e * IE, gv = 0.0f;
    any_run<M, H / 256, 2 * D>(n, 2 * npw, addr, XA, XB, [&](int k, float v) {
        if (!(k & 1)) gv = v;
        else if (!lane) a[i0 + w + 8 * (k >> 1)] = gv / (1.0f + expf(-gv)) * v;
    }, b, sm);
    if (M) done(CN(n, C_GUH0 + e));
    ts_end(n, s, OP_GUH);
}
template <int M> __device__ void t_down(const Net &n, int l, int s, int t, float4 *sm, Sh &sh) {
    constexpr int D = DEPTH;
    __syncthreads();
    ts_mark(n, s, OP_DN, TS_BEGIN);
    const int e = t / n.dn_tpe, rb = t % n.dn_tpe, w = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = rb * n.dn_R;
    const int rt = H - r0 < n.dn_R ? H - r0 : n.dn_R, nw = rt > w ? (rt - w + 7) / 8 : 0;
    if (M && sh.s != s) dep_wait<M>(n, CN(n, C_R), (unsigned)(n.r_n * (s + 1))); /* the route first (launch arm: final already) */
    route(n, s, sh);
    const uint16_t *W = expert_part(n.lw[l], sh.ids[e], 2);
    auto addr = [&](int k) { return (const uint4 *)(W + (size_t)(r0 + w + 8 * k) * IE); };
    uint4 b[5 * D][IE / 256];
    if (n.pf) any_pre<M, IE / 256, 5 * D>(n, nw, addr, b, sm), rows_l2<IE / 256>(n, M && n.smw ? ring_slots<IE / 256>() : 5 * D, nw, addr);
    if (!M || n.pexp) dep_wait<M>(n, CN(n, C_GUH0 + e), (unsigned)(n.guh_tpe * (s + 1)));
    else
        for (int k = 0; k < TOPK; k++) dep_wait<M>(n, CN(n, C_GUH0 + k), (unsigned)(n.guh_tpe * (s + 1)));
    ts_mark(n, s, OP_DN, TS_READY);
    if (!n.pf) any_pre<M, IE / 256, 5 * D>(n, nw, addr, b, sm);
    float4 *XA = sm, *XB = sm + IE / 8;
    planes_from(n.act + (size_t)e * IE, IE / 8, XA, XB);
    float *y = n.dy + (size_t)e * H;
    any_run<M, IE / 256, 5 * D>(n, nw, addr, XA, XB, [&](int k, float v) { if (!lane) y[r0 + w + 8 * k] = v; }, b, sm);
    if (ticket_last(CN(n, C_TD0 + rb), TOPK, sh)) { /* the last expert of this row range: h += the weighted sum, k order */
        for (int r = r0 + (int)threadIdx.x; r < r0 + rt; r += TH) {
            float o = 0.0f;
#pragma unroll
            for (int k = 0; k < TOPK; k++) o = fmaf(sh.wts[k], __ldcg(n.dy + (size_t)k * H + r), o);
            n.h[r] = __ldcg(n.h + r) + o;
        }
        if (M) done(CN(n, C_H));
    }
    ts_end(n, s, OP_DN);
}
template <int M> __device__ __forceinline__ void run_op(int op, const Net &n, int l, int s, int t, float4 *sm, Sh &sh) {
    switch (op) {
    case OP_QKV: t_qkv<M>(n, l, s, t, sm, sh); break;
    case OP_ATTN: t_attn<M>(n, l, s, t, sm, sh); break;
    case OP_O: t_o<M>(n, l, s, t, sm, sh); break;
    case OP_R: t_router<M>(n, l, s, t, sm, sh); break;
    case OP_GUH: t_guh<M>(n, l, s, t, sm, sh); break;
    case OP_DN: t_down<M>(n, l, s, t, sm, sh); break;
    default: t_lm<M>(n, s, t, sm, sh); break;
    }
}
/* the tasks of op (nch: the attention's chunks of the position) */
static inline __host__ __device__ int op_tasks(const Net &n, int op, int nch) {
    return op == OP_QKV ? n.qkv_n : op == OP_ATTN ? NKV * nch : op == OP_O ? n.o_n : op == OP_R ? n.r_n : op == OP_GUH ? TOPK * n.guh_tpe
         : op == OP_DN ? TOPK * n.dn_tpe : n.lm_n;
}
#define SMEM_BYTES ((2 * CH * KS + 17 * HD_) * 4) /* the attention's: a chunk's k and v rows, 8 q heads twice, k scratch */
#define PSMEM_BYTES (PLANES_BYTES + RING_BYTES)   /* the persistent kernel's: the planes, then the ring (over the attention's) */
static_assert(PSMEM_BYTES >= SMEM_BYTES, "the persistent kernel's shared memory holds the attention's");

/* the persistent arm: steps s0 .. s0 + ns - 1 (step s = layer s % L of token s / L), every op's tasks in op order, at
 * position pos (< 0: Net's P; the backend passes the step's position here, so that Net stays in device memory as it is
 * from one step to the next) */
__global__ void __launch_bounds__(TH, PBLOCKS) k_persist(const Net *np, int s0, int ns, int pos) {
    /* the parameters read from global memory (not a kernel parameter): the compiler may not hoist every op's fields out
     * of the loops into registers for the whole kernel (it did: 2.4 KB of spills) */
    const Net &n = *np;
    DYN_SMEM(float4, sm);
    BLOCK_STATIC(Sh, sh);
    const int P = pos >= 0 ? pos : n.P, nch = (P + CH) / CH;
    if (!threadIdx.x) sh.s = -1, sh.P = P, sh.nch = nch; /* (read after the first task's barrier) */
    for (int s = s0; s < s0 + ns; s++) {
        const int l = s % n.L;
#pragma unroll 1
        for (int op = 0; op < (n.V && l == n.L - 1 ? NOPX : NOP); op++) {
            const int nt = op_tasks(n, op, nch);
            for (int t = blockIdx.x; t < nt; t += gridDim.x) run_op<1>(op, n, l, s, t, sm, sh);
        }
    }
}
/* the launch arms: one op of step s, a block a task; B blocks an SM at least (2: the backend's way; 1: the persistent
 * kernel's occupancy, to tell the schedule's effect from the occupancy's) */
template <int OP, int B> __global__ void __launch_bounds__(TH, B) k_op(const __grid_constant__ Net n, int s) {
    DYN_SMEM(float4, sm);
    BLOCK_STATIC(Sh, sh);
    if (!threadIdx.x) sh.s = -1, sh.P = n.P, sh.nch = n.nch;
    if (OP != OP_GUH) pdl_go();
    run_op<0>(OP, n, s % n.L, s, blockIdx.x, sm, sh);
}

#ifdef SIMT_EMU
/* the launch arm's kernel of op (2 blocks an SM) for step s on the CPU emulation: a block a task, all at once */
static inline void emu_launch_op(const Net &n, int op, int s) {
    const dim3 g((unsigned)op_tasks(n, op, n.nch)), b(TH);
    switch (op) {
    case OP_QKV: emu_launch(g, b, SMEM_BYTES, [&] { k_op<OP_QKV, 2>(n, s); }); break;
    case OP_ATTN: emu_launch(g, b, SMEM_BYTES, [&] { k_op<OP_ATTN, 2>(n, s); }); break;
    case OP_O: emu_launch(g, b, SMEM_BYTES, [&] { k_op<OP_O, 2>(n, s); }); break;
    case OP_R: emu_launch(g, b, SMEM_BYTES, [&] { k_op<OP_R, 2>(n, s); }); break;
    case OP_GUH: emu_launch(g, b, SMEM_BYTES, [&] { k_op<OP_GUH, 2>(n, s); }); break;
    case OP_DN: emu_launch(g, b, SMEM_BYTES, [&] { k_op<OP_DN, 2>(n, s); }); break;
    default: emu_launch(g, b, SMEM_BYTES, [&] { k_op<OP_LM, 2>(n, s); }); break;
    }
}
#endif

/* the tasks of an op for G resident blocks: one wave, the rows dealt evenly (the launch arm's kernels: G = 2 blocks an
 * SM; the persistent kernel: its blocks). Only which warp takes a row changes with G, not a row's arithmetic. */
static inline void decompose(Net &n, int G) {
    const int G8 = G / TOPK > 0 ? G / TOPK : 1;
    n.G = G;
    n.qkv_R = (QKV + G - 1) / G, n.qkv_n = (QKV + n.qkv_R - 1) / n.qkv_R;
    n.o_R = (H + G - 1) / G, n.o_n = (H + n.o_R - 1) / n.o_R;
    n.r_R = 8, n.r_n = NE / 8;
    n.guh_pairs = (IE + G8 - 1) / G8, n.guh_tpe = (IE + n.guh_pairs - 1) / n.guh_pairs;
    n.dn_R = (H + G8 - 1) / G8, n.dn_tpe = (H + n.dn_R - 1) / n.dn_R;
    n.lm_R = n.V ? (n.V + G - 1) / G : 1, n.lm_n = n.V ? (n.V + n.lm_R - 1) / n.lm_R : 0;
}

} /* namespace dec */
#endif
