/* cuda_ops.cu - the CUDA backend's operations: products in every stored
 * format (cuda_mm.cu), attention cores, rows, element-wise ops, MoE, recurrent mixers
 * (see cuda.cu for memory, params, weights and the table). */
#include "backend/cuda/cuda_int.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

/* products: cuda_mm.cu */

/* ---- attention -------------------------------------------------------------------------- */
#define AT_TH 128
/* In place over sc[0..len): softmax as df_cpu_softmax (max, exp, double sum, times 1/sum). */
__device__ void block_softmax(float *sc, int len) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, sc[j]);
    m = block_max(m);
    double s = 0;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        float e = expf(sc[j] - m);
        sc[j] = e;
        s += e;
    }
    s = block_sum(s);
    const float inv = (float)(1.0 / s);
    for (int j = threadIdx.x; j < len; j += blockDim.x) sc[j] *= inv;
    __syncthreads();
}

/* Tokens per attention launch: the scores scratch (tokens x heads x positions
 * floats) stays under 64 Mi floats and grid.y under its limit; later chunks
 * are later positions of the same cache. With exact products on: 1. */
static int g_chunk = -1; /* DELTAFIN_CUDA_ATTN_CHUNK=N: at most N tokens per launch (a testing aid for the chunked path) */
static int chunk_tokens(int n, int heads, int pos0) {
    if (g_chunk < 0) {
        const char *e = getenv("DELTAFIN_CUDA_ATTN_CHUNK");
        g_chunk = e ? atoi(e) : 0;
        if (g_chunk < 0) g_chunk = 0;
    }
    /* exact products (cuda_mm.cu, g_exact): a position at a time, each a one-position step's launch and bits */
    if (g_exact) return 1;
    const size_t T = (size_t)pos0 + n, cap = ((size_t)64 << 20) / ((size_t)(heads > 0 ? heads : 1) * (T ? T : 1));
    size_t per = cap < 1 ? 1 : cap > 65535 ? 65535 : cap;
    if (g_chunk && (size_t)g_chunk < per) per = (size_t)g_chunk;
    return (int)(per < (size_t)n ? per : (size_t)n);
}

/* block (h, t) of TH threads. vec (head_dim % 4 == 0, 16-byte aligned q and cache): 16-byte loads. A decode
 * step has few blocks (one per head), so it runs 512 threads per block: the loads in flight per SM, not the
 * bandwidth, bound it (a 128-thread block read its head's cache at about 2.5 GB/s). */
template <int TH>
__global__ void __launch_bounds__(TH) k_attn_gqa(df_attn_gqa_args a, float *scores, int vec) { pdl_entry();
    const int h = blockIdx.x, t = blockIdx.y, NH = a.n_heads, hd = a.head_dim, kvh = h / (NH / a.n_kv_heads), T = a.pos0 + a.n;
    const int len = a.pos0 + t + 1;
    const size_t kdim = (size_t)a.n_kv_heads * hd;
    const float *q = DCP(a.q) + ((size_t)t * NH + h) * hd, *kc = DCP(a.kv) + (size_t)kvh * hd, *vc = kc + kdim;
    float *sc = scores + ((size_t)t * NH + h) * T;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = TH / 32;
    /* scores: a warp per position (lane-strided dot, then the warp sum), 4 positions in flight per warp */
    for (int j0 = wid; j0 < len; j0 += 4 * nw) {
        float s[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = j0 + u * nw;
            s[u] = 0.0f;
            if (j < len) {
                const float *k = kc + (size_t)j * 2 * kdim;
                if (vec)
                    for (int d = 4 * lane; d < hd; d += 128) {
                        const float4 kv = *(const float4 *)(k + d), qv = *(const float4 *)(q + d);
                        s[u] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                    }
                else
                    for (int d = lane; d < hd; d += 32) s[u] += q[d] * k[d];
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) s[u] = warp_sum(s[u]);
        if (!lane) {
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j0 + u * nw < len) sc[j0 + u * nw] = s[u] * a.scale;
        }
    }
    __syncthreads();
    block_softmax(sc, len);
    /* out = sum_j p_j v_j: the positions split over the warps (a lane holds 4 columns of a 128-column chunk),
     * the warps' partial sums added in warp order: a decode step's chain is len / nw loads long, not len */
    __shared__ float red[TH / 32][128];
    float *out = DP(a.out) + ((size_t)t * NH + h) * hd;
    for (int d0 = 0; d0 < hd; d0 += 128) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (vec) { /* columns d0 + 4 lane .. + 3 */
            const bool in = d0 + 4 * lane < hd;
#pragma unroll 4
            for (int j = wid; j < len; j += nw) {
                const float p = sc[j];
                if (in) {
                    const float4 v = *(const float4 *)(vc + (size_t)j * 2 * kdim + d0 + 4 * lane);
                    acc[0] += p * v.x, acc[1] += p * v.y, acc[2] += p * v.z, acc[3] += p * v.w;
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) red[wid][4 * lane + i] = acc[i];
        } else { /* columns d0 + lane + 32 i */
#pragma unroll 4
            for (int j = wid; j < len; j += nw) {
                const float p = sc[j];
                const float *v = vc + (size_t)j * 2 * kdim + d0;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (d0 + lane + 32 * i < hd) acc[i] += p * v[lane + 32 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++) red[wid][lane + 32 * i] = acc[i];
        }
        __syncthreads();
        for (int d = threadIdx.x; d < 128 && d0 + d < hd; d += TH) {
            float o = 0.0f;
            for (int w = 0; w < nw; w++) o += red[w][d];
            out[d0 + d] = o;
        }
        __syncthreads();
    }
}
/* Decode (few blocks): the positions split into chunks of AS_CH, a block per (head, token, chunk) with the
 * chunk's max m, sum l (double) of exp(s - m) and o = sum exp(s - m) v into part; k_attn_gqa_combine rescales
 * by exp(m - M) and divides by L: softmax(s) v as the CPU's (one max, double sum), rounded differently. */
#define AS_CH 64
/* PR (DELTAFIN_CUDA_LEAN bit 16, round 6, opt-in: ncu timed this kernel at 20.6 us against 18.8 without it on
 * the benchmark's 640-position decode): more loads in flight, the same bits: a warp's scores of 16 positions
 * at once (4 before; each position's score is its own sum), and the value loop loads 8 positions' rows before
 * adding them to the accumulators in the same order */
template <int PR>
static __device__ __forceinline__ void attn_split_block(const df_attn_gqa_args &a, float *part, int S, int vec, int ch) {
    const int h = blockIdx.x, t = blockIdx.y, z = blockIdx.z, NH = a.n_heads, hd = a.head_dim, kvh = h / (NH / a.n_kv_heads);
    const int len = a.pos0 + t + 1, j0 = z * ch, cnt = len - j0 < ch ? len - j0 : ch;
    const size_t kdim = (size_t)a.n_kv_heads * hd;
    const float *q = DCP(a.q) + ((size_t)t * NH + h) * hd, *kc = DCP(a.kv) + (size_t)kvh * hd + (size_t)j0 * 2 * kdim, *vc = kc + kdim;
    float *P = part + (((size_t)t * NH + h) * S + z) * (size_t)(hd + 2);
    if (cnt <= 0) { /* past this token's positions */
        for (int d = threadIdx.x; d < hd + 2; d += AT_TH) P[d] = d ? 0.0f : -INFINITY;
        return;
    }
    __shared__ float sc[AS_CH];
    __shared__ float red[AT_TH / 32][128];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = AT_TH / 32;
    constexpr int SU = PR ? 16 : 4;
    for (int i0 = wid; i0 < cnt; i0 += SU * nw) {
        float s[SU];
#pragma unroll
        for (int u = 0; u < SU; u++) {
            const int i = i0 + u * nw;
            s[u] = 0.0f;
            if (i < cnt) {
                const float *k = kc + (size_t)i * 2 * kdim;
                if (vec)
                    for (int d = 4 * lane; d < hd; d += 128) {
                        const float4 kv = *(const float4 *)(k + d), qv = *(const float4 *)(q + d);
                        s[u] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                    }
                else
                    for (int d = lane; d < hd; d += 32) s[u] += q[d] * k[d];
            }
        }
#pragma unroll
        for (int u = 0; u < SU; u++) s[u] = warp_sum(s[u]);
        if (!lane) {
#pragma unroll
            for (int u = 0; u < SU; u++)
                if (i0 + u * nw < cnt) sc[i0 + u * nw] = s[u] * a.scale;
        }
    }
    __syncthreads();
    float m = -INFINITY;
    for (int i = threadIdx.x; i < cnt; i += AT_TH) m = fmaxf(m, sc[i]);
    m = block_max(m);
    double l = 0;
    for (int i = threadIdx.x; i < cnt; i += AT_TH) {
        const float e = expf(sc[i] - m);
        sc[i] = e;
        l += e;
    }
    l = block_sum(l); /* its barriers order the writes of sc before the reads below */
    for (int d0 = 0; d0 < hd; d0 += 128) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (PR && vec && d0 + 4 * lane < hd) {
            for (int i0 = wid; i0 < cnt; i0 += 8 * nw) {
                float4 xv[8];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (i0 + u * nw < cnt) xv[u] = *(const float4 *)(vc + (size_t)(i0 + u * nw) * 2 * kdim + d0 + 4 * lane);
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (i0 + u * nw < cnt) {
                        const float p = sc[i0 + u * nw];
                        const float4 x = xv[u];
                        acc[0] += p * x.x, acc[1] += p * x.y, acc[2] += p * x.z, acc[3] += p * x.w;
                    }
            }
        } else if (!(PR && vec))
        for (int i = wid; i < cnt; i += nw) {
            const float p = sc[i];
            const float *v = vc + (size_t)i * 2 * kdim + d0;
            if (vec) {
                if (d0 + 4 * lane < hd) {
                    const float4 x = *(const float4 *)(v + 4 * lane);
                    acc[0] += p * x.x, acc[1] += p * x.y, acc[2] += p * x.z, acc[3] += p * x.w;
                }
            } else {
#pragma unroll
                for (int r = 0; r < 4; r++)
                    if (d0 + lane + 32 * r < hd) acc[r] += p * v[lane + 32 * r];
            }
        }
#pragma unroll
        for (int r = 0; r < 4; r++) red[wid][vec ? 4 * lane + r : lane + 32 * r] = acc[r];
        __syncthreads();
        for (int d = threadIdx.x; d < 128 && d0 + d < hd; d += AT_TH) {
            float o = 0.0f;
            for (int w = 0; w < nw; w++) o += red[w][d];
            P[2 + d0 + d] = o;
        }
        __syncthreads();
    }
    if (!threadIdx.x) P[0] = m, P[1] = (float)l;
}
/* Round 7 (DELTAFIN_CUDA_LEAN bit 32): before the wait, a split block asks L2 for its chunk's key and value rows
 * (128-byte lines), so a launch that starts early finds the cache there: prefetch.global.L2 fills no L1 line,
 * and L2 stays coherent with the kernel before it that writes the newest position (the reads come after the wait) */
static __device__ __forceinline__ void attn_prefetch(const df_attn_gqa_args &a, int ch) {
    const int h = blockIdx.x, t = blockIdx.y, z = blockIdx.z, hd = a.head_dim, kvh = h / (a.n_heads / a.n_kv_heads);
    const int len = a.pos0 + t + 1, j0 = z * ch, cnt = len - j0 < ch ? len - j0 : ch;
    if (cnt <= 0) return;
    const size_t kdim = (size_t)a.n_kv_heads * hd, rb = (size_t)hd * sizeof(float), lines = (rb + 127) / 128;
    const char *kc = (const char *)(DCP(a.kv) + (size_t)kvh * hd + (size_t)j0 * 2 * kdim);
    for (size_t i = threadIdx.x; i < (size_t)cnt * 2 * lines; i += AT_TH) {
        const size_t row = i / lines, l = i % lines; /* row 2j: position j's key, 2j + 1 its value */
        const char *p = kc + (row >> 1) * 2 * kdim * sizeof(float) + (row & 1) * kdim * sizeof(float) + l * 128;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
    }
}
template <int PR>
__global__ void __launch_bounds__(AT_TH) k_attn_gqa_split(df_attn_gqa_args a, float *part, int S, int vec, int ch) {
    pdl_go();
    attn_prefetch(a, ch);
    pdl_wait();
    attn_split_block<PR>(a, part, S, vec, ch);
}
/* the combine of head h, token t (a block of AT_TH threads); the parts are read from L2 (__ldcg): in the
 * fused kernel other blocks wrote them */
#define AS_MAXS 256 /* par: parts combined from shared memory (longer caches take the serial loop) */
static __device__ __forceinline__ void attn_combine_head(const df_attn_gqa_args &a, const float *part, int S, int h, int t, int par, int ch) {
    const int NH = a.n_heads, hd = a.head_dim, len = a.pos0 + t + 1;
    const int ns = (len + ch - 1) / ch;
    const float *P = part + ((size_t)t * NH + h) * S * (size_t)(hd + 2);
    if (par && ns <= AS_MAXS) {
        /* DELTAFIN_CUDA_LEAN bit 16 (round 6, opt-in): the same arithmetic in the same order, but the parts' m and l are
         * read by all threads at once and their exps computed once each, in parallel: the serial loops below
         * wait for an L2 read per part (3 x ns round trips) */
        __shared__ float cm[AS_MAXS], cl[AS_MAXS], cf[AS_MAXS];
        __shared__ double ce[AS_MAXS];
        __shared__ float cM, cinv;
        for (int z = threadIdx.x; z < ns; z += AT_TH) cm[z] = __ldcg(P + (size_t)z * (hd + 2)), cl[z] = __ldcg(P + (size_t)z * (hd + 2) + 1);
        __syncthreads();
        if (!threadIdx.x) {
            float M = -INFINITY;
            for (int z = 0; z < ns; z++) M = fmaxf(M, cm[z]);
            cM = M;
        }
        __syncthreads();
        const float M = cM;
        for (int z = threadIdx.x; z < ns; z += AT_TH) ce[z] = exp((double)cm[z] - M), cf[z] = expf(cm[z] - M);
        __syncthreads();
        if (!threadIdx.x) {
            double L = 0;
            for (int z = 0; z < ns; z++) L += (double)cl[z] * ce[z];
            cinv = (float)(1.0 / L);
        }
        __syncthreads();
        const float inv = cinv;
        float *out = DP(a.out) + ((size_t)t * NH + h) * hd;
        for (int d = threadIdx.x; d < hd; d += AT_TH) {
            float o = 0.0f;
#pragma unroll 8
            for (int z = 0; z < ns; z++) o += __ldcg(P + (size_t)z * (hd + 2) + 2 + d) * cf[z];
            out[d] = o * inv;
        }
        return;
    }
    float M = -INFINITY;
    for (int z = 0; z < ns; z++) M = fmaxf(M, __ldcg(P + (size_t)z * (hd + 2)));
    double L = 0;
    for (int z = 0; z < ns; z++) L += (double)__ldcg(P + (size_t)z * (hd + 2) + 1) * exp((double)__ldcg(P + (size_t)z * (hd + 2)) - M);
    const float inv = (float)(1.0 / L);
    float *out = DP(a.out) + ((size_t)t * NH + h) * hd;
    for (int d = threadIdx.x; d < hd; d += AT_TH) {
        float o = 0.0f;
        for (int z = 0; z < ns; z++) o += __ldcg(P + (size_t)z * (hd + 2) + 2 + d) * expf(__ldcg(P + (size_t)z * (hd + 2)) - M);
        out[d] = o * inv;
    }
}
__global__ void __launch_bounds__(AT_TH) k_attn_gqa_combine(df_attn_gqa_args a, const float *part, int S, int par, int ch) { pdl_entry(); attn_combine_head(a, part, S, blockIdx.x, blockIdx.y, par, ch); }
/* split and combine in ONE launch: the last of a (head, token)'s S blocks to finish (a counter per pair,
 * which that block sets back to 0) combines them, with the combine kernel's arithmetic: the same bits. */
template <int PR>
__global__ void __launch_bounds__(AT_TH) k_attn_gqa_fused(df_attn_gqa_args a, float *part, int S, int vec, unsigned *counts, int par, int ch) {
    pdl_go();
    attn_prefetch(a, ch);
    pdl_wait();
    attn_split_block<PR>(a, part, S, vec, ch);
    __shared__ int last;
    __threadfence(); /* this block's parts are visible device-wide before it counts itself */
    __syncthreads();
    unsigned *c = counts + (size_t)blockIdx.y * a.n_heads + blockIdx.x;
    if (!threadIdx.x) last = atomicAdd(c, 1u) == (unsigned)S - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    attn_combine_head(a, part, S, blockIdx.x, blockIdx.y, par, ch);
    if (!threadIdx.x) *c = 0;
}
/* ---- round 10 (DELTAFIN_CUDA_LEAN bit 4096): one-token GQA decode attention in ONE launch over (chunk, KV head)
 * blocks. A block of AD_TH threads takes DC_CH consecutive positions of one KV head for ALL the G = n_heads /
 * n_kv_heads q heads that share it (each K/V row is loaded once for the group, not once per q head): warp w holds
 * the K and V rows of positions w * DC_KW .. + DC_KW - 1 of its chunk in registers, 16 bytes a lane (NF float4s a
 * row: head_dim <= 256), all issued at once. Rows already final when the launch was queued (`pre`: positions below
 * the step's own, where the host has waited for the device since the last attention over this cache; see
 * g_attn_gqa) are loaded BEFORE griddepcontrol.wait, while the kernel before (the one that writes the new
 * position's row) still runs; the others are asked of L2 then and loaded after the wait. The scores of the
 * warp's DC_KW positions x GP heads (GP: G rounded up to a power of two, <= 8) are reduced across the lanes in one
 * reduce-scatter butterfly (31 shuffles for 32 sums instead of 5 each), the chunk's softmax of each head
 * (max m, l = sum exp(s - m)) taken by a warp, the probabilities times the V rows summed per warp in registers and
 * over the block's warps in shared memory, and (m, l, o) written as the chunk's part; the last block of a KV head to
 * finish (a counter per KV head, set back to 0 by it) combines its S parts: M = max m, w = exp(m - M), L = sum w l,
 * out = sum w o / L, every part's stats read at once and the o sums over 16-byte loads. softmax(s) v as the
 * CPU's, rounded differently (f32 sums in other orders): NOT the bits of bits 2 / 16's launches; test_backend_cuda
 * and the conformance test compare it with the CPU. Round 24: blocks of TH = 256 threads by default (32 positions a
 * block: the one combining block of a KV head reads half the parts; DELTAFIN_CUDA_ATTN_TH=128 restores 16 a block). */
#define AD_TH 128
#define AD_TH_DEF 256                    /* round 24: the default block size (DELTAFIN_CUDA_ATTN_TH) */
#define DC_KW 4                          /* positions per warp */
#define DC_CH (DC_KW * AD_TH / 32)       /* positions per block: 16 */
#define DC_MAXP 2048                     /* S x GP parts at most (the combine's stats in shared memory) */
static int64_t g_attn_dec;
extern "C" int64_t df_cuda_attn_dec_launches(void) { return g_attn_dec; }
/* NV sums of a lane's v[] over the warp's 32 lanes, scattered: the lane ends with the total of value *idx (lanes that
 * differ only in their low 5 - log2(NV) bits hold the same one). NV: a power of two, 1..32. */
template <int C, int ST, int NV> static __device__ __forceinline__ void rs_stage(float (&v)[NV], int lane, int &base) {
    if constexpr (ST < 5) {
        constexpr int o = 16 >> ST;
        if constexpr (C > 1) {
            constexpr int half = C / 2;
            const bool up = (lane & o) != 0;
#pragma unroll
            for (int i = 0; i < half; i++) {
                const float send = up ? v[i] : v[i + half], keep = up ? v[i + half] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
            if (up) base += half;
            rs_stage<half, ST + 1, NV>(v, lane, base);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
            rs_stage<1, ST + 1, NV>(v, lane, base);
        }
    }
}
template <int NV> static __device__ __forceinline__ float warp_reduce_scatter(float (&v)[NV], int lane, int *idx) {
    int base = 0;
    rs_stage<NV, 0, NV>(v, lane, base);
    *idx = base;
    return v[0];
}
static __device__ __forceinline__ float4 ldcg4(const float *p) { return __ldcg((const float4 *)p); }
static __device__ __forceinline__ void pf_l2(const void *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}
/* DELTAFIN_CUDA_ATTN_TS=1 / DELTAFIN_CUDA_MLA_TS=1 (measurement aids, off by default): k_attn_dec's / k_mla_chunk's
 * blocks write the GPU's global timer at their points (the names in g_kts_attn / g_kts_mla below: entry, past
 * griddepcontrol.wait, ...) for the first AD_TS_CALLS decode launches; at exit the medians over the launches of the
 * latest block at each point, from the launch's first block entry, go to stderr (kts_print). */
#define AD_TS_CALLS 1024
#define AD_TS_MAXB 4096 /* blocks a launch recorded at most */
#define AD_TS_N 12     /* points a block */
static __device__ __forceinline__ void ad_ts(unsigned long long *ts, int k) {
    if (ts && !threadIdx.x) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        ts[(((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * AD_TS_N + k] = t;
    }
}
/* Parts [z0, z0 + nz) of KV head kvh combined (k_attn_dec's last step, below): M = max m, w = exp(m - M), L = sum w l,
 * o = sum w o_z; into part zo (its m = M, l = L, o unnormalised) when out is NULL, else out = o / L. cw: G x nz floats of
 * shared memory. */
template <int GP, int TH>
static __device__ void ad_combine(const float *po, float *pml, int z0, int nz, int NKV, int kvh, int G, int hd, float *cw, float *cinv,
                                  float *out, int zo, unsigned long long *ts = NULL) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd4 = hd >> 2;
    constexpr int NW = TH / 32;
    for (int g = warp; g < G; g += NW) {
        float M = -INFINITY, L = 0.0f;
        const float *pg = pml + ((size_t)kvh * GP + g) * 2;
        const size_t zs2 = (size_t)NKV * GP * 2;
        if (nz <= 64) { /* round 24: a lane's (m, l) pairs loaded once, in one round (the loops below load them twice) */
            float2 ml[2];
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int zz = lane + 32 * k;
                if (zz < nz) ml[k] = __ldcg((const float2 *)(pg + (size_t)(z0 + zz) * zs2));
            }
#pragma unroll
            for (int k = 0; k < 2; k++)
                if (lane + 32 * k < nz) M = fmaxf(M, ml[k].x);
            M = warp_max(M);
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int zz = lane + 32 * k;
                if (zz < nz) {
                    const float w = expf(ml[k].x - M);
                    cw[g * nz + zz] = w;
                    L += w * ml[k].y;
                }
            }
        } else {
            for (int zz = lane; zz < nz; zz += 32) M = fmaxf(M, __ldcg(pg + (size_t)(z0 + zz) * zs2));
            M = warp_max(M);
            for (int zz = lane; zz < nz; zz += 32) {
                const float2 ml = __ldcg((const float2 *)(pg + (size_t)(z0 + zz) * zs2));
                const float w = expf(ml.x - M);
                cw[g * nz + zz] = w;
                L += w * ml.y;
            }
        }
        L = warp_sum(L);
        if (!lane) {
            cinv[g] = out ? 1.0f / L : 1.0f;
            if (!out) pml[(((size_t)zo * NKV + kvh) * GP + g) * 2] = M, pml[(((size_t)zo * NKV + kvh) * GP + g) * 2 + 1] = L;
        }
    }
    ad_ts(ts, 8);
    __syncthreads();
    ad_ts(ts, 9);
    for (int i = threadIdx.x; i < G * hd4; i += TH) {
        const int g = i / hd4, c4 = i % hd4;
        const size_t zs = (size_t)NKV * GP * hd;
        const float *pz = po + (size_t)z0 * zs + ((size_t)kvh * GP + g) * hd + 4 * c4;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int zz = 0;
        for (; zz + 16 <= nz; zz += 16) {
            float4 r[16];
#pragma unroll
            for (int u = 0; u < 16; u++) r[u] = ldcg4(pz + (size_t)(zz + u) * zs);
#pragma unroll
            for (int u = 0; u < 16; u++) {
                const float w = cw[g * nz + zz + u];
                o.x += w * r[u].x, o.y += w * r[u].y, o.z += w * r[u].z, o.w += w * r[u].w;
            }
        }
#pragma unroll 4
        for (; zz < nz; zz++) {
            const float4 r = ldcg4(pz + (size_t)zz * zs);
            const float w = cw[g * nz + zz];
            o.x += w * r.x, o.y += w * r.y, o.z += w * r.z, o.w += w * r.w;
        }
        const float inv = cinv[g];
        o.x *= inv, o.y *= inv, o.z *= inv, o.w *= inv;
        if (out) *(float4 *)(out + (size_t)g * hd + 4 * c4) = o;
        else *(float4 *)(po + ((size_t)zo * NKV + kvh) * GP * hd + (size_t)g * hd + 4 * c4) = o;
        if (i == (int)threadIdx.x) ad_ts(ts, 10);
    }
}
#define DC_GRP 16    /* round 20: parts a group combines first when the tree combine runs */
#define DC_NGMAX 128 /* groups a KV head at most (DC_MAXP / DC_GRP) */
/* GP: q heads per KV head rounded up to a power of two (<= 8); KW: positions a warp (DC_KW, or 2: DELTAFIN_CUDA_ATTN_KW); NF: float4s of a row per lane (head_dim <= 128 NF).
 * po: [S (+ groups)][NKV][GP][hd] partial sums, pml: [S (+ groups)][NKV][GP][2] (m, l); counts: NKV zeroed counters, then
 * NKV x DC_NGMAX for the groups; tree: combine in groups of DC_GRP first. */
template <int GP, int NF, int KW = DC_KW, int TH = AD_TH>
__global__ void __launch_bounds__(TH) k_attn_dec(df_attn_gqa_args a, float *po, float *pml, unsigned *counts, int pre, int tree, unsigned long long *ts) {
    constexpr int NW = TH / 32, NV = KW * GP, CH = KW * NW;
    static_assert(CH <= 32, "the chunk's softmax takes a lane a position");
    ad_ts(ts, 0);
    const int z = blockIdx.x, kvh = blockIdx.y, S = gridDim.x, NKV = a.n_kv_heads, hd = a.head_dim, G = a.n_heads / NKV, h0 = kvh * G;
    const int T = a.pos0 + 1, j0 = z * CH, cnt = T - j0 < CH ? T - j0 : CH;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd4 = hd >> 2;
    const size_t kdim = (size_t)NKV * hd;
    const float *kc = DCP(a.kv) + (size_t)kvh * hd;
    float4 kr[KW][NF], vr[KW][NF];
    pdl_go();
    /* the rows of positions below pre are final (no kernel still running writes them): loaded now; the rest asked of L2 */
#pragma unroll
    for (int k = 0; k < KW; k++) {
        const int j = j0 + warp * KW + k;
        const float *kp = kc + (size_t)j * 2 * kdim, *vp = kp + kdim;
#pragma unroll
        for (int f = 0; f < NF; f++) {
            const int c = 4 * (lane + 32 * f);
            kr[k][f] = vr[k][f] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < T && c < hd) {
                if (j < pre) kr[k][f] = ldcg4(kp + c), vr[k][f] = ldcg4(vp + c);
                else if (!(c & 31)) pf_l2(kp + c), pf_l2(vp + c);
            }
        }
    }
    pdl_wait();
    ad_ts(ts, 1);
#pragma unroll
    for (int k = 0; k < KW; k++) {
        const int j = j0 + warp * KW + k;
        const float *kp = kc + (size_t)j * 2 * kdim, *vp = kp + kdim;
#pragma unroll
        for (int f = 0; f < NF; f++) {
            const int c = 4 * (lane + 32 * f);
            if (j >= pre && j < T && c < hd) kr[k][f] = ldcg4(kp + c), vr[k][f] = ldcg4(vp + c);
        }
    }
    /* scores: v[k * GP + g] = this lane's share of q_g . K_k */
    float v[NV];
    {
        float4 qr[GP][NF];
#pragma unroll
        for (int g = 0; g < GP; g++)
#pragma unroll
            for (int f = 0; f < NF; f++) {
                const int c = 4 * (lane + 32 * f);
                qr[g][f] = g < G && c < hd ? ldcg4(DCP(a.q) + (size_t)(h0 + g) * hd + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
        for (int k = 0; k < KW; k++)
#pragma unroll
            for (int g = 0; g < GP; g++) {
                float s = 0.0f;
#pragma unroll
                for (int f = 0; f < NF; f++) s += qr[g][f].x * kr[k][f].x + qr[g][f].y * kr[k][f].y + qr[g][f].z * kr[k][f].z + qr[g][f].w * kr[k][f].w;
                v[k * GP + g] = s;
            }
    }
    __shared__ float sc[GP][CH];
    __shared__ __align__(16) float red[NW][GP * 128 * NF];
    {
        int idx;
        const float tot = warp_reduce_scatter<NV>(v, lane, &idx);
        if (!(lane & (32 / NV - 1))) sc[idx % GP][warp * KW + idx / GP] = tot * a.scale;
    }
    __syncthreads();
    ad_ts(ts, 2);
    /* each head's softmax over the chunk: a warp per head, a lane per position */
    for (int g = warp; g < G; g += NW) {
        const float s = lane < cnt ? sc[g][lane] : -INFINITY;
        const float m = warp_max(s);
        const float e = lane < cnt ? expf(s - m) : 0.0f;
        const float l = warp_sum(e);
        if (lane < CH) sc[g][lane] = e;
        if (!lane) {
            float *ml = pml + (((size_t)z * NKV + kvh) * GP + g) * 2;
            ml[0] = m, ml[1] = l;
        }
    }
    __syncthreads();
    ad_ts(ts, 3);
    /* o_g = sum_k p_gk V_k: the warp's positions in registers, then the warps' sums in shared memory */
#pragma unroll
    for (int g = 0; g < GP; g++) {
        if (g < G) {
#pragma unroll
            for (int f = 0; f < NF; f++) {
                float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int k = 0; k < KW; k++) {
                    const float p = sc[g][warp * KW + k]; /* 0 past the cache */
                    o.x += p * vr[k][f].x, o.y += p * vr[k][f].y, o.z += p * vr[k][f].z, o.w += p * vr[k][f].w;
                }
                const int c4 = lane + 32 * f;
                if (c4 < hd4) *(float4 *)&red[warp][(g * hd4 + c4) * 4] = o;
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * hd4; i += TH) {
        float4 o = *(const float4 *)&red[0][i * 4];
#pragma unroll
        for (int w = 1; w < NW; w++) {
            const float4 r = *(const float4 *)&red[w][i * 4];
            o.x += r.x, o.y += r.y, o.z += r.z, o.w += r.w;
        }
        const int g = i / hd4, c4 = i % hd4;
        *(float4 *)(po + (((size_t)z * NKV + kvh) * GP + g) * hd + 4 * c4) = o;
    }
    ad_ts(ts, 4);
    /* the last of the KV head's S blocks combines; round 20 (tree): the last of each group of DC_GRP blocks combines
     * its group into part S + group first, and the last of those the groups (S = 128 parts at 2,048 positions were
     * 16 dependent rounds of loads in one block) */
    __shared__ int last;
    __shared__ float cw[DC_MAXP];
    __shared__ float cinv[GP];
    /* round 24: the tickets as cooperative groups' grid barrier takes them: the block's barrier, then ONE thread's fence
     * (cumulative: it orders every write the barrier ordered before it) and atomic, and on the last block that thread's
     * fence again before the barrier the others wait at (was: a fence in every thread; ~0.4 us a launch) */
    __syncthreads();
    unsigned *ctr = counts + kvh;
    if (tree) {
        const int q = z / DC_GRP, ng = (S + DC_GRP - 1) / DC_GRP, gz0 = q * DC_GRP, gn = S - gz0 < DC_GRP ? S - gz0 : DC_GRP;
        unsigned *gc = counts + NKV + (size_t)kvh * DC_NGMAX + q;
        if (!threadIdx.x) {
            __threadfence();
            last = atomicAdd(gc, 1u) == (unsigned)gn - 1;
            if (last) __threadfence();
        }
        __syncthreads();
        if (!last) return;
        ad_combine<GP, TH>(po, pml, gz0, gn, NKV, kvh, G, hd, cw, cinv, NULL, S + q);
        __syncthreads();
        if (!threadIdx.x) {
            *gc = 0;
            __threadfence();
            last = atomicAdd(ctr, 1u) == (unsigned)ng - 1;
            if (last) __threadfence();
        }
        __syncthreads();
        if (!last) return;
        ad_combine<GP, TH>(po, pml, S, ng, NKV, kvh, G, hd, cw, cinv, DP(a.out) + (size_t)h0 * hd, 0);
    } else {
        if (!threadIdx.x) {
            __threadfence();
            last = atomicAdd(ctr, 1u) == (unsigned)S - 1;
            if (last) __threadfence();
        }
        __syncthreads();
        ad_ts(ts, 5);
        if (!last) return;
        ad_ts(ts, 6);
        ad_combine<GP, TH>(po, pml, 0, S, NKV, kvh, G, hd, cw, cinv, DP(a.out) + (size_t)h0 * hd, 0, ts);
    }
    if (!threadIdx.x) *ctr = 0;
    ad_ts(ts, 7);
}
static unsigned *g_att_cnt; /* zeroed counters of k_attn_gqa_fused, g_att_cnt_n of them */
static size_t g_att_cnt_n;
static int g_attn_ch = -1;
static int g_attn_split = -1; /* DELTAFIN_CUDA_ATTN_SPLIT=0: decode attention without the position split */
/* The host's waits for the device (g_read: a blocking copy on the legacy stream, every kernel queued before it has
 * finished when it returns) counted, and per K/V cache the count at its last decode attention: a cache whose last
 * attention came before the latest wait has every row below this step's position final (the rows a forward writes
 * are its own positions, and it attends over them in the same step), so those rows may be read before
 * griddepcontrol.wait. A cache not seen, or attended since the latest wait: none. */
int64_t g_host_waits;
#define KV_SEEN 256
static struct { const void *kv; int64_t waits; } g_kvseen[KV_SEEN];
static int g_kvseen_next;
/* every attention call over a cache (prefill, verify passes and decode alike) notes the count of host waits; the
 * rows below pos0 count as final when the cache's previous attention came before the latest wait */
static int g_attn_early = -1; /* DELTAFIN_CUDA_ATTN_EARLY=0: no row read before the wait (a measurement aid) */
static int final_rows(const void *kv, int pos0) {
    if (g_attn_early < 0) {
        const char *e = getenv("DELTAFIN_CUDA_ATTN_EARLY");
        g_attn_early = !(e && !strcmp(e, "0"));
    }
    if (!g_attn_early) pos0 = 0;
    const int64_t now = __atomic_load_n(&g_host_waits, __ATOMIC_SEQ_CST);
    for (int i = 0; i < KV_SEEN; i++)
        if (g_kvseen[i].kv == kv) {
            const int pre = g_kvseen[i].waits < now ? pos0 : 0;
            g_kvseen[i].waits = now;
            return pre;
        }
    g_kvseen[g_kvseen_next].kv = kv, g_kvseen[g_kvseen_next].waits = now;
    g_kvseen_next = (g_kvseen_next + 1) % KV_SEEN;
    return 0;
}
static int g_attn_tree = -1;
static int kw_env = -1; /* DELTAFIN_CUDA_ATTN_KW=2 (round 17, a measurement aid): 2 positions a warp, 8 a block */
extern "C" void df_cuda_set_attn_kw(int kw) { kw_env = kw == 2 || kw == DC_KW ? kw : -1; }
/* round 24: k_attn_dec's block size, 128 threads (16 positions a block) or 256 (32 positions: half the parts, which the
 * one combining block of each KV head reads in dependent rounds of L2 loads; DELTAFIN_CUDA_ATTN_TH=128 or 256) */
static int th_env = -1;
extern "C" void df_cuda_set_attn_th(int th) { th_env = th == 128 || th == 256 ? th : -1; }
extern "C" void df_cuda_set_attn_tree(int parts) { g_attn_tree = parts; }
/* DELTAFIN_CUDA_ATTN_TS / DELTAFIN_CUDA_MLA_TS (above): a kernel's launches' records, their grids, the summary at exit */
struct KTs {
    const char *env, *kernel;
    int npts;
    const char *names[AD_TS_N];
    unsigned long long *dev;
    int on, calls;
    size_t blocks[AD_TS_CALLS];
};
static KTs g_kts_attn = {"DELTAFIN_CUDA_ATTN_TS", "k_attn_dec", 11,
                         {"entry", "past wait", "scores", "softmax", "part written", "ticket", "last past fence", "combined", "stats",
                          "stats synced", "first o"},
                         NULL, -1, 0, {0}};
static KTs g_kts_mla = {"DELTAFIN_CUDA_MLA_TS", "k_mla_chunk", 6, {"entry", "past wait", "q loaded", "scores", "softmax", "o written"}, NULL, -1, 0, {0}};
static void kts_print_one(KTs &k) {
    if (!k.calls) return;
    const size_t per = (size_t)AD_TS_MAXB * AD_TS_N;
    unsigned long long *h = (unsigned long long *)malloc((size_t)k.calls * per * sizeof *h);
    double *v = (double *)malloc((size_t)AD_TS_N * k.calls * sizeof *v);
    gr_flush();
    if (h && v && cudaMemcpy(h, k.dev, (size_t)k.calls * per * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess) {
        for (int c = 0; c < k.calls; c++) { /* from the launch's first entry, the latest block at each point */
            const unsigned long long *r = h + (size_t)c * per;
            unsigned long long t0 = ~0ull, mx[AD_TS_N] = {0};
            for (size_t b = 0; b < k.blocks[c]; b++) {
                if (r[b * AD_TS_N] && r[b * AD_TS_N] < t0) t0 = r[b * AD_TS_N];
                for (int q = 0; q < AD_TS_N; q++)
                    if (r[b * AD_TS_N + q] > mx[q]) mx[q] = r[b * AD_TS_N + q];
            }
            for (int q = 0; q < AD_TS_N; q++) v[(size_t)q * k.calls + c] = mx[q] && t0 != ~0ull ? (double)(mx[q] - t0) / 1e3 : 0.0;
        }
        fprintf(stderr, "deltafin: cuda: %s timeline over %d launches (us from the launch's first block entry, the latest block, median):", k.kernel, k.calls);
        for (int q = 0; q < k.npts; q++) {
            std::sort(v + (size_t)q * k.calls, v + (size_t)(q + 1) * k.calls);
            fprintf(stderr, " %s %.2f;", k.names[q], v[(size_t)q * k.calls + k.calls / 2]);
        }
        fprintf(stderr, "\n");
    }
    free(h), free(v);
}
static void kts_print(void) { kts_print_one(g_kts_attn), kts_print_one(g_kts_mla); }
/* the record of this launch of k.kernel (blocks of it at most AD_TS_MAXB), NULL when off or past AD_TS_CALLS */
static unsigned long long *kts_slot(KTs &k, size_t blocks) {
    if (k.on < 0) {
        const char *e = getenv(k.env);
        k.on = e && !strcmp(e, "1");
        if (k.on && (cudaMalloc(&k.dev, (size_t)AD_TS_CALLS * AD_TS_MAXB * AD_TS_N * sizeof *k.dev) != cudaSuccess ||
                     cudaMemset(k.dev, 0, (size_t)AD_TS_CALLS * AD_TS_MAXB * AD_TS_N * sizeof *k.dev) != cudaSuccess))
            k.on = 0;
        static int registered;
        if (k.on && !registered) registered = 1, atexit(kts_print);
    }
    if (!k.on || k.calls >= AD_TS_CALLS || blocks > AD_TS_MAXB) return NULL;
    k.blocks[k.calls] = blocks;
    return k.dev + (size_t)k.calls++ * AD_TS_MAXB * AD_TS_N;
}
/* 1 when k_attn_dec took the launch */
static int attn_dec(const df_attn_gqa_args &c, int pre) {
    const int NH = c.n_heads, NKV = c.n_kv_heads, hd = c.head_dim;
    if (c.n != 1 || NKV <= 0 || NH % NKV || hd <= 0 || hd % 4 || hd > 256 || ((uintptr_t)c.q | (uintptr_t)c.kv | (uintptr_t)c.out) & 15) return 0;
    const int G = NH / NKV, GP = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : G <= 8 ? 8 : 0, NF = hd <= 128 ? 1 : 2;
    if (!GP || GP * 128 * NF > 1024) return 0; /* the warps' sums: NW x GP x 128 NF floats of shared memory (16 KiB) */
    if (kw_env < 0) {
        const char *e = getenv("DELTAFIN_CUDA_ATTN_KW");
        kw_env = e && !strcmp(e, "2") ? 2 : DC_KW;
        if (e && *e && strcmp(e, "2") && strcmp(e, "4"))
            fprintf(stderr, "deltafin: cuda backend: DELTAFIN_CUDA_ATTN_KW=%s is not 2 or 4 (positions a warp of the decode attention): 4\n", e);
    }
    if (th_env < 0) {
        const char *e = getenv("DELTAFIN_CUDA_ATTN_TH");
        th_env = e && !strcmp(e, "128") ? 128 : AD_TH_DEF;
        if (e && *e && strcmp(e, "128") && strcmp(e, "256"))
            fprintf(stderr, "deltafin: cuda backend: DELTAFIN_CUDA_ATTN_TH=%s is not 128 or 256 (threads a block of the decode attention): %d\n", e, AD_TH_DEF);
    }
    const int T = c.pos0 + 1;
    int kw = kw_env, th = kw == 2 ? AD_TH : th_env; /* 2 positions a warp: 128 threads only */
    int S = (T + kw * th / 32 - 1) / (kw * th / 32);
    if (kw != DC_KW && ((size_t)S * GP > DC_MAXP || S > 65535)) kw = DC_KW, S = (T + DC_CH - 1) / DC_CH; /* too many parts: 16 a block */
    if ((size_t)S * GP > DC_MAXP || S > 65535 || NKV > 65535) return 0;
    if (g_attn_tree < 0) { /* DELTAFIN_CUDA_ATTN_TREE: the fewest parts that take the tree combine (default 48; 0 = never) */
        const char *e = getenv("DELTAFIN_CUDA_ATTN_TREE");
        g_attn_tree = e && *e ? atoi(e) : 48;
    }
    const int tree = g_attn_tree > 0 && S >= g_attn_tree && S > DC_GRP, ng = tree ? (S + DC_GRP - 1) / DC_GRP : 0;
    const size_t np = (size_t)(S + ng) * NKV * GP; /* the groups' parts after the blocks' */
    float *po = (float *)slot(S_SCORES, np * ((size_t)hd + 2) * sizeof(float), "attn_gqa");
    if (!po) return -1;
    float *pml = po + np * hd;
    const size_t ncnt = ((size_t)NKV > (size_t)NH ? (size_t)NKV : (size_t)NH) + (size_t)NKV * DC_NGMAX; /* + the groups' */
    unsigned *cnt = (unsigned *)slot(S_CNT, ncnt * sizeof(unsigned), "attn_gqa");
    if (!cnt) return -1;
    if (cnt != g_att_cnt || ncnt > g_att_cnt_n) { /* a new buffer: zero it once (k_attn_gqa_fused's counters share it) */
        gr_flush();
        CK("attn_gqa", cudaMemsetAsync(cnt, 0, ncnt * sizeof(unsigned), 0));
        g_att_cnt = cnt, g_att_cnt_n = ncnt;
    }
    const dim3 grid((unsigned)S, (unsigned)NKV);
    unsigned long long *ts = kts_slot(g_kts_attn, (size_t)S * NKV);
#define AD_L(GG, FF)                                                                                                        \
    (kw == 2      ? launch_k(k_attn_dec<GG, FF, 2>, dim3(grid), dim3(AD_TH), 0, c, po, pml, cnt, pre, tree, ts)              \
     : th == 256 ? launch_k(k_attn_dec<GG, FF, DC_KW, 256>, dim3(grid), dim3(256), 0, c, po, pml, cnt, pre, tree, ts)      \
                 : launch_k(k_attn_dec<GG, FF>, dim3(grid), dim3(AD_TH), 0, c, po, pml, cnt, pre, tree, ts))
    if (NF == 1) GP == 1 ? AD_L(1, 1) : GP == 2 ? AD_L(2, 1) : GP == 4 ? AD_L(4, 1) : AD_L(8, 1);
    else GP == 1 ? AD_L(1, 2) : GP == 2 ? AD_L(2, 2) : AD_L(4, 2);
#undef AD_L
    g_attn_dec++;
    return 1;
}
void g_attn_gqa(const df_attn_gqa_args *a) {
    LOCK();
    if (a->n <= 0 || a->n_heads <= 0) return;
    const int pre = final_rows(a->kv, a->pos0); /* noted for every call (round 10's decode launch reads those rows early) */
    const int per = chunk_tokens(a->n, a->n_heads, a->pos0);
    for (int t0 = 0; t0 < a->n; t0 += per) {
        df_attn_gqa_args c = *a;
        c.n = a->n - t0 < per ? a->n - t0 : per, c.pos0 = a->pos0 + t0;
        c.q = (const df_act *)(DCP(a->q) + (size_t)t0 * a->n_heads * a->head_dim);
        c.out = (df_act *)(DP(a->out) + (size_t)t0 * a->n_heads * a->head_dim);
        const size_t T = (size_t)c.pos0 + c.n;
        float *sc = (float *)slot(S_SCORES, (size_t)c.n * c.n_heads * T * sizeof(float), "attn_gqa");
        if (!sc) return;
        const int vec = c.head_dim % 4 == 0 && !(((uintptr_t)c.q | (uintptr_t)c.kv) & 15);
        const dim3 grid((unsigned)c.n_heads, (unsigned)c.n);
        if (g_attn_split < 0) {
            const char *e = getenv("DELTAFIN_CUDA_ATTN_SPLIT");
            g_attn_split = !(e && !strcmp(e, "0"));
        }
        if (g_attn_ch < 0) { /* DELTAFIN_CUDA_ATTN_CH: positions per split block (8..AS_CH, default AS_CH; a measurement aid) */
            const char *e = getenv("DELTAFIN_CUDA_ATTN_CH");
            const int v = e && *e ? atoi(e) : AS_CH;
            g_attn_ch = v >= 8 && v <= AS_CH ? v : AS_CH;
        }
        if ((lean_mask() & 4096) && g_attn_split) { /* round 10: one-token decode attention over (chunk, KV head) blocks */
            const int r = attn_dec(c, pre);
            if (r < 0) return;
            if (r) {
                post("attn_gqa");
                continue;
            }
        }
        const int ch = g_attn_ch, S = (int)((T + ch - 1) / ch);
        if (g_attn_split && (size_t)c.n * c.n_heads < 512 && T >= 2 * AS_CH && S <= 65535) {
            float *part = (float *)slot(S_SCORES, (size_t)c.n * c.n_heads * S * (size_t)(c.head_dim + 2) * sizeof(float), "attn_gqa");
            if (!part) return;
            const size_t pairs = (size_t)c.n * c.n_heads;
            unsigned *cnt = NULL;
            if (lean_mask() & 2) {
                cnt = (unsigned *)slot(S_CNT, pairs * sizeof(unsigned), "attn_gqa");
                if (cnt && (cnt != g_att_cnt || pairs > g_att_cnt_n)) { /* a new buffer: zero it once */
                    gr_flush();
                    CK("attn_gqa", cudaMemsetAsync(cnt, 0, pairs * sizeof(unsigned), 0));
                    g_att_cnt = cnt, g_att_cnt_n = pairs;
                }
            }
            const int par = (lean_mask() & 16) != 0; /* opt-in: measured slower on the H200 (round 6) */
            const dim3 sg((unsigned)c.n_heads, (unsigned)c.n, (unsigned)S);
            if (cnt && par) launch_k(k_attn_gqa_fused<1>, dim3(sg), dim3(AT_TH), 0, c, part, S, vec, cnt, par, ch);
            else if (cnt) launch_k(k_attn_gqa_fused<0>, dim3(sg), dim3(AT_TH), 0, c, part, S, vec, cnt, par, ch);
            else {
                if (par) launch_k(k_attn_gqa_split<1>, dim3(sg), dim3(AT_TH), 0, c, part, S, vec, ch);
                else launch_k(k_attn_gqa_split<0>, dim3(sg), dim3(AT_TH), 0, c, part, S, vec, ch);
                post("attn_gqa");
                launch_k(k_attn_gqa_combine, dim3(grid), dim3(AT_TH), 0, c, part, S, par, ch);
            }
        } else if ((size_t)c.n * c.n_heads < 512) launch_k(k_attn_gqa<512>, dim3(grid), dim3(512), 0, c, sc, vec);
        else launch_k(k_attn_gqa<AT_TH>, dim3(grid), dim3(AT_TH), 0, c, sc, vec);
        post("attn_gqa");
    }
}

/* block (h, t); shared: q [nope + rope], qlat [R], olat [R] */
__global__ void __launch_bounds__(AT_TH) k_attn_mla(df_attn_mla_args a, DW kvb, DW kb, DW vb, int split_k, int split_v, float *scores) { pdl_entry();
    extern __shared__ float sh[];
    const int h = blockIdx.x, t = blockIdx.y, NH = a.n_heads, nope = a.nope, rope = a.rope, R = a.kv_lora, vd = a.v_dim;
    const int T = a.pos0 + a.n, len = a.pos0 + t + 1;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    float *qs = sh, *qlat = sh + qh, *olat = qlat + R;
    const float *q = DCP(a.q) + ((size_t)t * NH + h) * qh;
    for (int i = threadIdx.x; i < (int)qh; i += blockDim.x) qs[i] = q[i];
    __syncthreads();
    const int64_t kv_row0 = (int64_t)h * (nope + vd);
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float s = 0.0f;
        if (split_k)
            for (int d = 0; d < nope; d++) s += wget(kb, (int64_t)h * R + c, d) * qs[d];
        else
            for (int d = 0; d < nope; d++) s += qs[d] * wget(kvb, kv_row0 + d, c);
        qlat[c] = s;
    }
    __syncthreads();
    float *sc = scores + ((size_t)t * NH + h) * T;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = wid; j < len; j += nw) {
        const float *cj = DCP(a.cache) + (size_t)j * cdim;
        float s1 = 0.0f, s2 = 0.0f;
        for (int c = lane; c < R; c += 32) s1 += qlat[c] * cj[c];
        for (int c = lane; c < rope; c += 32) s2 += qs[nope + c] * cj[R + c];
        s1 = warp_sum(s1), s2 = warp_sum(s2);
        if (!lane) sc[j] = (s1 + s2) * a.scale;
    }
    __syncthreads();
    block_softmax(sc, len);
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < len; j++) o += sc[j] * DCP(a.cache)[(size_t)j * cdim + c];
        olat[c] = o;
    }
    __syncthreads();
    float *out = DP(a.out) + ((size_t)t * NH + h) * vd;
    for (int i = threadIdx.x; i < vd; i += blockDim.x) {
        float s = 0.0f;
        if (split_v)
            for (int c = 0; c < R; c++) s += wget(vb, (int64_t)h * vd + i, c) * olat[c];
        else
            for (int c = 0; c < R; c++) s += wget(kvb, kv_row0 + nope + i, c) * olat[c];
        out[i] = s;
    }
}
/* ---- MLA decode (a few positions): three launches in place of k_attn_mla's one block per (head, position) ----
 * k_attn_mla reads the whole latent cache once per head and position with one chain per column, and decodes
 * W_uk / W_uv one called wget at a time (671 us a layer for DeepSeek-V3's 128 heads at 640 positions on the
 * H200, ncu). For n <= MLA_DEC_N positions (512: decode and prefill calls of up to 512 positions, in batches):
 *   1. k_mla_absorb, block (h, t) of 1024 threads: qf[t][h] = [W_uk[h]^T q_nope | q_rope] (kv_lora + rope
 *      floats); eight parts of the nope rows, each thread 4 columns (128 apart), the parts added in part order;
 *   2. k_mla_chunk, block (chunk of md_ch(T) positions, group of MD_HG heads, t): each cache row of the chunk
 *      read once for the group's heads (a warp a position, the row in registers, then in shared memory), the
 *      scores, the chunk's max m and sum l of exp(s - m) per head, and o = sum_j exp(s_j - m) c_j[0, kv_lora)
 *      per head (a thread a column, the group's heads in registers), written as a partial [o | m | l];
 *   3. k_mla_out, block (h, t) of 1024 threads: t's partials combined (max, rescale, sums in chunk order) into
 *      the latent output, then W_uv[h] times it (a warp 4 rows, lanes over kv_lora, warp_sum).
 * The weights are read through mla_w<V>: inline decoders for F32 / BF16 / F16 / FP8 (the same values as wget:
 * the hardware's E4M3 -> f16 conversion is exact), wget for the rest. Different sums from k_attn_mla's (the
 * chunked softmax): within the conformance bounds, not its bits (the CUDA backend takes no exact verify passes,
 * so a step and a batch need not agree bit for bit). */
static int g_mla_dec = -1;
enum { MLA_DEC_N = 512, MD_HG = 16, MD_TH = 256, MD_BIG = 1024, MD_MAXK = 24 /* cache row floats per lane: kv_lora + rope <= 768 */ };
enum { MW_GENERIC, MW_F32, MW_BF16, MW_F16, MW_FP8 };
static int md_ch(size_t T) { /* positions per chunk: 16, more for long caches (at most 128 chunks) */
    size_t c = 16;
    while ((T + c - 1) / c > 128) c *= 2;
    return (int)c;
}
template <int V> static __device__ __forceinline__ float mla_w(const DW &w, int64_t r, int64_t c) {
    const uint8_t *row = w.data + (size_t)r * w.row_bytes;
    if (V == MW_F32) return ((const float *)row)[c];
    if (V == MW_BF16) return bf16f(((const uint16_t *)row)[c]);
    if (V == MW_F16) return __half2float(__ushort_as_half(((const uint16_t *)row)[c]));
    if (V == MW_FP8) { /* the block's scale: 32-bit indices, shifts for power-of-two blocks (loop invariants hoist them) */
        const __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)row[c], __NV_E4M3);
        const uint32_t br = (uint32_t)w.blk_r, bc = (uint32_t)w.blk_c, rr = (uint32_t)r, cc = (uint32_t)c;
        const uint32_t ri = (br & (br - 1)) ? rr / br : rr >> (__ffs((int)br) - 1);
        const uint32_t ci = (bc & (bc - 1)) ? cc / bc : cc >> (__ffs((int)bc) - 1);
        return __fmul_rn(__half2float(__half(hr)), scale_at(w, (int64_t)ri * w.scale_cols + ci));
    }
    return wget(w, r, c);
}
static int mla_kind(const DW &w) {
    switch (w.fmt) {
    case DF_W_F32: return MW_F32;
    case DF_W_BF16: return MW_BF16;
    case DF_W_F16: return MW_F16;
    case DF_W_FP8: return MW_FP8;
    default: return MW_GENERIC;
    }
}
/* W_uk[h][d][c]: kv_b row h * (nope + v) + d, column c; or k_b row h * kv_lora + c, column d */
template <int V, int SPLIT> static __device__ __forceinline__ float mla_wk(const DW &w, int h, int nope, int vd, int R, int d, int c) {
    return SPLIT ? mla_w<V>(w, (int64_t)h * R + c, d) : mla_w<V>(w, (int64_t)h * (nope + vd) + d, c);
}
template <int V, int SPLIT>
__global__ void __launch_bounds__(MD_BIG) k_mla_absorb(df_attn_mla_args a, DW w, float *qf) { pdl_entry();
    __shared__ float qs[256];       /* q_nope (nope <= 256: checked by the caller) */
    __shared__ float part[8][1024]; /* each part's sums (kv_lora <= 1024: checked by the caller) */
    const int h = blockIdx.x, t = blockIdx.y, NH = a.n_heads, nope = a.nope, rope = a.rope, R = a.kv_lora, vd = a.v_dim;
    const size_t qh = (size_t)nope + rope, cd = (size_t)R + rope;
    const float *q = DCP(a.q) + ((size_t)t * NH + h) * qh;
    float *o = qf + ((size_t)t * NH + h) * cd;
    for (int i = threadIdx.x; i < nope; i += blockDim.x) qs[i] = q[i];
    for (int i = threadIdx.x; i < rope; i += blockDim.x) o[R + i] = q[nope + i];
    __syncthreads();
    const int p = threadIdx.x >> 7, cs = threadIdx.x & 127, d0 = nope * p / 8, d1 = nope * (p + 1) / 8;
    constexpr int DU = V == MW_GENERIC ? 1 : V == MW_FP8 ? 4 : 8; /* rows a thread loads before their products */
    for (int cb = 0; cb < R; cb += 512) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int d = d0;
#pragma unroll 1
        for (; d + DU <= d1; d += DU) {
            float wv[DU][4];
#pragma unroll
            for (int k = 0; k < DU; k++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int c = cb + cs + 128 * j;
                    wv[k][j] = c < R ? mla_wk<V, SPLIT>(w, h, nope, vd, R, d + k, c) : 0.0f;
                }
#pragma unroll
            for (int k = 0; k < DU; k++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[j] = fmaf(wv[k][j], qs[d + k], acc[j]);
        }
        for (; d < d1; d++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = cb + cs + 128 * j;
                if (c < R) acc[j] = fmaf(mla_wk<V, SPLIT>(w, h, nope, vd, R, d, c), qs[d], acc[j]);
            }
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (cb + cs + 128 * j < R) part[p][cb + cs + 128 * j] = acc[j];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float v = part[0][c];
#pragma unroll
        for (int i = 1; i < 8; i++) v += part[i][c];
        o[c] = v;
    }
}
/* block (chunk s, head group g, position t); dynamic shared memory: qf of the group [MD_HG][cd], the chunk's
 * cache rows [ch][cd], e [MD_HG][ch] */
__global__ void __launch_bounds__(MD_TH) k_mla_chunk(df_attn_mla_args a, const float *qf, int ch, int S, float *part, int hq4, unsigned long long *ts) {
    ad_ts(ts, 0);
    pdl_entry();
    ad_ts(ts, 1);
    extern __shared__ float sh[];
    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, NH = a.n_heads, R = a.kv_lora, rope = a.rope;
    const int len = a.pos0 + t + 1, h0 = g * MD_HG, nh = NH - h0 < MD_HG ? NH - h0 : MD_HG;
    const int cd = R + rope, j0 = s * ch, nj = len - j0 < ch ? len - j0 : ch;
    float *qg = sh, *rows = sh + (size_t)MD_HG * cd, *e = rows + (size_t)ch * cd;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *pout = part + (((size_t)t * NH + h0) * S + s) * (size_t)(R + 2); /* head h0 + i at + i * S * (R + 2) */
    if (nj <= 0) return; /* a chunk past this position's length: k_mla_out reads only t's chunks */
    const float *qsrc = qf + ((size_t)t * NH + h0) * cd;
    if (!(cd & 3)) { /* the group's queries in float4s, 8 loads in flight a thread (a float at a time was a chain of ~36 loads) */
        const int n4 = nh * cd / 4;
#pragma unroll 8
        for (int i = threadIdx.x; i < n4; i += blockDim.x) ((float4 *)qg)[i] = ((const float4 *)qsrc)[i];
    } else {
#pragma unroll 8
        for (int i = threadIdx.x; i < nh * cd; i += blockDim.x) qg[i] = qsrc[i];
    }
    __syncthreads();
    ad_ts(ts, 2);
    const float *cache = DCP(a.cache);
    for (int jj = wid; jj < nj; jj += nw) { /* the scores: a warp a position, its row in registers */
        const float *row = cache + (size_t)(j0 + jj) * cd;
        float r[MD_MAXK];
#pragma unroll
        for (int k = 0; k < MD_MAXK; k++) r[k] = 32 * k + lane < cd ? row[32 * k + lane] : 0.0f;
#pragma unroll
        for (int k = 0; k < MD_MAXK; k++)
            if (32 * k + lane < cd) rows[(size_t)jj * cd + 32 * k + lane] = r[k];
        int i = 0;
        if (hq4) /* bit 67108864 (round 15): four heads' chains at a time (each head's sum as below: the same bits) */
            for (; i + 4 <= nh; i += 4) {
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int k = 0; k < MD_MAXK; k++)
                    if (32 * k + lane < cd)
#pragma unroll
                        for (int m = 0; m < 4; m++) d[m] = fmaf(qg[(size_t)(i + m) * cd + 32 * k + lane], r[k], d[m]);
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    d[m] = warp_sum(d[m]);
                    if (!lane) e[(size_t)(i + m) * ch + jj] = d[m] * a.scale;
                }
            }
        for (; i < nh; i++) {
            const float *qv = qg + (size_t)i * cd;
            float d = 0.0f;
#pragma unroll
            for (int k = 0; k < MD_MAXK; k++)
                if (32 * k + lane < cd) d = fmaf(qv[32 * k + lane], r[k], d);
            d = warp_sum(d);
            if (!lane) e[(size_t)i * ch + jj] = d * a.scale;
        }
    }
    __syncthreads();
    ad_ts(ts, 3);
    for (int i = wid; i < nh; i += nw) { /* each head's max and sum of exp over the chunk */
        float *ei = e + (size_t)i * ch;
        float m = -INFINITY;
        for (int jj = lane; jj < nj; jj += 32) m = fmaxf(m, ei[jj]);
        m = warp_max(m);
        float l = 0.0f;
        for (int jj = lane; jj < nj; jj += 32) {
            const float x = expf(ei[jj] - m);
            ei[jj] = x, l += x;
        }
        l = warp_sum(l);
        if (!lane) {
            float *pp = pout + (size_t)i * S * (R + 2);
            pp[R] = m, pp[R + 1] = l;
        }
    }
    for (int i = nh + wid; i < MD_HG; i += nw) /* a partial last group: the heads past nh weigh 0 below (read, never stored) */
        for (int jj = lane; jj < nj; jj += 32) e[(size_t)i * ch + jj] = 0.0f;
    __syncthreads();
    ad_ts(ts, 4);
    /* o = sum_j e_j c_j: a thread 4 columns (a float4 of each row) and half the group's heads in registers */
    const int hh = threadIdx.x / (blockDim.x / 2), ih0 = hh * (MD_HG / 2);
    for (int c4 = threadIdx.x % (blockDim.x / 2); 4 * c4 < R; c4 += blockDim.x / 2) {
        const int c = 4 * c4;
        float4 acc[MD_HG / 2];
#pragma unroll
        for (int i = 0; i < MD_HG / 2; i++) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c + 4 <= R && !(cd & 3)) {
            for (int jj = 0; jj < nj; jj++) {
                const float4 v = *(const float4 *)(rows + (size_t)jj * cd + c);
#pragma unroll
                for (int i = 0; i < MD_HG / 2; i++) {
                    const float p = e[(size_t)(ih0 + i) * ch + jj]; /* heads past nh: zeroed above, their sums never stored */
                    acc[i].x = fmaf(p, v.x, acc[i].x), acc[i].y = fmaf(p, v.y, acc[i].y);
                    acc[i].z = fmaf(p, v.z, acc[i].z), acc[i].w = fmaf(p, v.w, acc[i].w);
                }
            }
        } else { /* a partial last quad, or rows not 16-byte aligned */
            for (int jj = 0; jj < nj; jj++)
#pragma unroll
                for (int i = 0; i < MD_HG / 2; i++) {
                    const float p = e[(size_t)(ih0 + i) * ch + jj];
                    const float *v = rows + (size_t)jj * cd + c;
                    acc[i].x = fmaf(p, v[0], acc[i].x);
                    if (c + 1 < R) acc[i].y = fmaf(p, v[1], acc[i].y);
                    if (c + 2 < R) acc[i].z = fmaf(p, v[2], acc[i].z);
                    if (c + 3 < R) acc[i].w = fmaf(p, v[3], acc[i].w);
                }
        }
#pragma unroll
        for (int i = 0; i < MD_HG / 2; i++)
            if (ih0 + i < nh) {
                float *o = pout + (size_t)(ih0 + i) * S * (R + 2) + c;
                o[0] = acc[i].x;
                if (c + 1 < R) o[1] = acc[i].y;
                if (c + 2 < R) o[2] = acc[i].z;
                if (c + 3 < R) o[3] = acc[i].w;
            }
    }
    ad_ts(ts, 5);
}
/* t's partials of head h combined into ol[kv_lora] (shared): M = max m_s, weights exp(m_s - M), L = sum l_s x
 * weight in chunk order, ol = sum_s o_s x weight / L in chunk order. Every thread of the block calls it. */
static __device__ void mla_combine(const df_attn_mla_args &a, int h, int t, int ch, int S, const float *part, float *ol, float *wsc) {
    const int NH = a.n_heads, R = a.kv_lora, len = a.pos0 + t + 1, ns = (len + ch - 1) / ch;
    const float *pp = part + ((size_t)t * NH + h) * S * (size_t)(R + 2);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (wid == 0) {
        float M = -INFINITY;
        for (int q = lane; q < ns; q += 32) M = fmaxf(M, pp[(size_t)q * (R + 2) + R]);
        M = warp_max(M);
        for (int q = lane; q < ns; q += 32) wsc[q] = expf(pp[(size_t)q * (R + 2) + R] - M);
        __syncwarp();
        if (!lane) {
            float L = 0.0f;
            for (int q = 0; q < ns; q++) L = fmaf(pp[(size_t)q * (R + 2) + R + 1], wsc[q], L);
            wsc[128] = 1.0f / L;
        }
    }
    __syncthreads();
    const float inv = wsc[128];
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float o = 0.0f;
#pragma unroll 8
        for (int q = 0; q < ns; q++) o = fmaf(pp[(size_t)q * (R + 2) + c], wsc[q], o);
        ol[c] = o * inv;
    }
    __syncthreads();
}
/* block (h, t); shared: the latent output [kv_lora] */
template <int V>
__global__ void __launch_bounds__(MD_BIG) k_mla_out(df_attn_mla_args a, DW w, int split_v, int ch, int S, const float *part) { pdl_entry();
    __shared__ float ol[1024];
    __shared__ float wsc[129]; /* each chunk's weight exp(m_s - M) (S <= 128), then 1 / L */
    const int h = blockIdx.x, t = blockIdx.y, NH = a.n_heads, nope = a.nope, R = a.kv_lora, vd = a.v_dim;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    mla_combine(a, h, t, ch, S, part, ol, wsc);
    float *out = DP(a.out) + ((size_t)t * NH + h) * vd;
    const int64_t rb = split_v ? (int64_t)h * vd : (int64_t)h * (nope + vd) + nope;
    for (int i0 = wid * 4; i0 < vd; i0 += nw * 4) { /* a warp 4 rows of W_uv[h] at a time, lanes over kv_lora */
        float sm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int nr = vd - i0 < 4 ? vd - i0 : 4;
        constexpr int KU = V == MW_GENERIC ? 1 : V == MW_FP8 ? 4 : 8; /* columns a lane loads per row before the products */
        for (int c0 = 0; c0 < R; c0 += 32 * KU) {
            float w8[4][KU];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int k = 0; k < KU; k++) {
                    const int c = c0 + 32 * k + lane;
                    w8[i][k] = i < nr && c < R ? mla_w<V>(w, rb + i0 + i, c) : 0.0f;
                }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int k = 0; k < KU; k++) {
                    const int c = c0 + 32 * k + lane;
                    if (c < R) sm[i] = fmaf(w8[i][k], ol[c], sm[i]);
                }
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float v = warp_sum(sm[i]);
            if (!lane && i < nr) out[i0 + i] = v;
        }
    }
}
/* ---- the 16-byte paths of W_uk / W_uv in kv_b's layout (FP8 with 128-column scale blocks, BF16): a lane
 * decodes EP consecutive columns of a row from one 16-byte load (as the products' decoders), so a warp covers
 * 32 x EP columns of a row a load, and a row group's loads are all in flight at once. */
template <int V> struct MlaV { static constexpr int EP = V == MW_FP8 ? 16 : 8; }; /* elements per 16 bytes */
template <int V> static __device__ __forceinline__ void mla_dec16(const DW &w, int64_t r, int c0, const uint4 &u, float (&x)[MlaV<V>::EP]) {
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
    if (V == MW_FP8) {
        const uint32_t br = (uint32_t)w.blk_r, bc = (uint32_t)w.blk_c, rr = (uint32_t)r, cc = (uint32_t)c0;
        const uint32_t ri = (br & (br - 1)) ? rr / br : rr >> (__ffs((int)br) - 1);
        const uint32_t ci = (bc & (bc - 1)) ? cc / bc : cc >> (__ffs((int)bc) - 1);
        const float s = scale_at(w, (int64_t)ri * w.scale_cols + ci); /* one block: blk_c % 16 == 0 (the caller checks) */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((q[i] >> (16 * k)) & 0xffff), __NV_E4M3);
                const float2 f = __half22float2(__half2(h2));
                x[4 * i + 2 * k] = __fmul_rn(f.x, s), x[4 * i + 2 * k + 1] = __fmul_rn(f.y, s);
            }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) x[2 * i] = __uint_as_float(q[i] << 16), x[2 * i + 1] = __uint_as_float(q[i] & 0xffff0000u);
    }
}
/* the 16 bytes of lane's group g of columns (EP x (lane + 32 g)) of row r, zeros past kv_lora */
static __device__ __forceinline__ uint4 mla_ld16(const DW &w, int64_t r, int lane, int g, int EP, int R) {
    return EP * (lane + 32 * g) < R ? __ldg((const uint4 *)(w.data + (size_t)r * w.row_bytes) + lane + 32 * g) : make_uint4(0, 0, 0, 0);
}
/* rows r0 + first + i nw (i = 0..3, those below lim) of w, the lane's NG 16-byte groups each (zeros past lim): every load
 * issued before any use (k_mla_absorb_v's rows of W_uk, k_mla_out_v's of W_uv) */
template <int NG>
static __device__ __forceinline__ void mla_ld4(const DW &w, int64_t r0, int first, int nw, int lim, int lane, int EP, int R, uint4 (&u)[4][NG]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int g = 0; g < NG; g++) {
            const int r = first + i * nw;
            u[i][g] = r < lim ? mla_ld16(w, r0 + r, lane, g, EP, R) : make_uint4(0, 0, 0, 0);
        }
}
/* block (h, t) of 1024 threads: warp w the nope rows w, w + 32, ... of W_uk[h] (kv_b rows h * (nope + v) + d),
 * lane the columns [EP x (lane + 32 g)); the warps' sums added in warp order; dynamic shared memory [32][kv_lora] */
/* early (bit 67108864, round 15: resident weights under programmatic launches): the warp's first 4 rows loaded before
 * griddepcontrol.wait (the weights are written by no kernel; q, written by the kernel before, is read after it): the
 * same loads and arithmetic, so the same bits */
template <int V, int NG>
__global__ void __launch_bounds__(MD_BIG) k_mla_absorb_v(df_attn_mla_args a, DW w, float *qf, int early) {
    extern __shared__ float4 sh4[]; /* (float4: 16-byte aligned) */
    float *sh = (float *)sh4;
    __shared__ float qs[256];
    constexpr int EP = MlaV<V>::EP;
    const int h = blockIdx.x, t = blockIdx.y, NH = a.n_heads, nope = a.nope, rope = a.rope, R = a.kv_lora, vd = a.v_dim;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t r0 = (int64_t)h * (nope + vd);
    uint4 u0[4][NG];
    pdl_go();
    if (early) mla_ld4<NG>(w, r0, wid, nw, nope, lane, EP, R, u0);
    pdl_wait();
    const size_t qh = (size_t)nope + rope, cd = (size_t)R + rope;
    const float *q = DCP(a.q) + ((size_t)t * NH + h) * qh;
    float *o = qf + ((size_t)t * NH + h) * cd;
    for (int i = threadIdx.x; i < nope; i += blockDim.x) qs[i] = q[i];
    for (int i = threadIdx.x; i < rope; i += blockDim.x) o[R + i] = q[nope + i];
    __syncthreads();
    float acc[NG][EP];
#pragma unroll
    for (int g = 0; g < NG; g++)
#pragma unroll
        for (int k = 0; k < EP; k++) acc[g][k] = 0.0f;
    for (int d0 = wid; d0 < nope; d0 += 4 * nw) { /* 4 rows a warp at a time, every load issued first */
        uint4 u[4][NG];
        if (early && d0 == wid) {
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int g = 0; g < NG; g++) u[i][g] = u0[i][g];
        } else
            mla_ld4<NG>(w, r0, d0, nw, nope, lane, EP, R, u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int d = d0 + i * nw;
            if (d >= nope) break;
#pragma unroll
            for (int g = 0; g < NG; g++) {
                const int c0 = EP * (lane + 32 * g);
                if (c0 >= R) continue;
                float x[EP];
                mla_dec16<V>(w, r0 + d, c0, u[i][g], x);
#pragma unroll
                for (int k = 0; k < EP; k++) acc[g][k] = fmaf(x[k], qs[d], acc[g][k]);
            }
        }
    }
#pragma unroll
    for (int g = 0; g < NG; g++) { /* float4 stores: lanes EP floats apart hit the same banks with scalar ones */
        const int c0 = EP * (lane + 32 * g);
        if (c0 < R)
#pragma unroll
            for (int k = 0; k < EP; k += 4) *(float4 *)&sh[(size_t)wid * R + c0 + k] = make_float4(acc[g][k], acc[g][k + 1], acc[g][k + 2], acc[g][k + 3]);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float v = sh[c];
        for (int i = 1; i < nw; i++) v += sh[(size_t)i * R + c];
        o[c] = v;
    }
}
/* block (h, t) of 1024 threads: the combine, then warp w the rows w, w + 32, ... of W_uv[h] (kv_b rows
 * h * (nope + v) + nope + i), 16-byte loads, warp_sum */
template <int V, int NG>
__global__ void __launch_bounds__(MD_BIG) k_mla_out_v(df_attn_mla_args a, DW w, int ch, int S, const float *part, int early) {
    __shared__ __align__(16) float ol[1024];
    __shared__ float wsc[129];
    constexpr int EP = MlaV<V>::EP;
    const int h = blockIdx.x, t = blockIdx.y, NH = a.n_heads, nope = a.nope, R = a.kv_lora, vd = a.v_dim;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t r0 = (int64_t)h * (nope + vd) + nope;
    uint4 u[4][NG]; /* the block's rows asked for before the combine: the weights are final (resident or uploaded) */
    pdl_go();
    if (early) mla_ld4<NG>(w, r0, wid, nw, vd, lane, EP, R, u); /* early (bit 67108864): before the wait too */
    pdl_wait();
    if (!early) mla_ld4<NG>(w, r0, wid, nw, vd, lane, EP, R, u);
    mla_combine(a, h, t, ch, S, part, ol, wsc);
    float *out = DP(a.out) + ((size_t)t * NH + h) * vd;
    for (int i0 = wid; i0 < vd; i0 += 4 * nw) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i0 + i * nw;
            if (r >= vd) break;
            if (i0 != wid) /* rows past the first 4 x 32: loaded now */
#pragma unroll
                for (int g = 0; g < NG; g++) u[i][g] = mla_ld16(w, r0 + r, lane, g, EP, R);
            float sm = 0.0f;
#pragma unroll
            for (int g = 0; g < NG; g++) {
                const int c0 = EP * (lane + 32 * g);
                if (c0 >= R) continue;
                float x[EP];
                mla_dec16<V>(w, r0 + r, c0, u[i][g], x);
#pragma unroll
                for (int k = 0; k < EP; k += 4) { /* float4 reads of ol (scalar ones: 16-way bank conflicts) */
                    const float4 o4 = *(const float4 *)&ol[c0 + k];
                    sm = fmaf(x[k], o4.x, sm), sm = fmaf(x[k + 1], o4.y, sm), sm = fmaf(x[k + 2], o4.z, sm), sm = fmaf(x[k + 3], o4.w, sm);
                }
            }
            sm = warp_sum(sm);
            if (!lane) out[r] = sm;
        }
    }
}
#define MLA_BY_KIND(K, F, ...)                                                                              \
    switch (K) {                                                                                            \
    case MW_F32: F(MW_F32, __VA_ARGS__); break;                                                             \
    case MW_BF16: F(MW_BF16, __VA_ARGS__); break;                                                           \
    case MW_F16: F(MW_F16, __VA_ARGS__); break;                                                             \
    case MW_FP8: F(MW_FP8, __VA_ARGS__); break;                                                             \
    default: F(MW_GENERIC, __VA_ARGS__); break;                                                             \
    }
#define MLA_ABSORB(V, SPLIT, c, w, qf) launch_k(k_mla_absorb<V, SPLIT>, dim3((unsigned)(c).n_heads, (unsigned)(c).n), dim3(MD_BIG), 0, c, w, qf)
#define MLA_ABSORB0(V, c, w, qf) MLA_ABSORB(V, 0, c, w, qf)
#define MLA_ABSORB1(V, c, w, qf) MLA_ABSORB(V, 1, c, w, qf)
#define MLA_OUT(V, c, w, split_v, ch, S, part) launch_k(k_mla_out<V>, dim3((unsigned)(c).n_heads, (unsigned)(c).n), dim3(MD_BIG), 0, c, w, split_v, ch, S, part)
template <int V, int NG> static void mla_av(const df_attn_mla_args &c, const DW &kvb, float *qf, size_t shb, size_t *set, int early) {
    if (shb > 48 * 1024 && shb > *set) {
        CK("attn_mla", cudaFuncSetAttribute(k_mla_absorb_v<V, NG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shb));
        *set = shb;
    }
    launch_k(k_mla_absorb_v<V, NG>, dim3((unsigned)c.n_heads, (unsigned)c.n), dim3(MD_BIG), shb, c, kvb, qf, early);
}
/* the three launches for one batch of positions (mla_dec checks the shapes and splits the batches); early: kv_b is
 * resident and launches are programmatic (the 16-byte paths may load it before their wait: bit 67108864) */
static int mla_dec1(const df_attn_mla_args &c, const DW &kvb, const DW &kb, const DW &vb, int split_k, int split_v, int early) {
    const int cd = c.kv_lora + c.rope;
    const size_t T = (size_t)c.pos0 + c.n;
    const int ch = md_ch(T), S = (int)((T + ch - 1) / ch), G = (c.n_heads + MD_HG - 1) / MD_HG;
    const size_t shb = ((size_t)MD_HG * cd + (size_t)ch * cd + (size_t)MD_HG * ch) * sizeof(float);
    const size_t nq = (size_t)c.n * c.n_heads;
    float *qf = (float *)slot(S_P0, nq * cd * sizeof(float), "attn_mla");
    float *part = (float *)slot(S_SCORES, nq * S * (size_t)(c.kv_lora + 2) * sizeof(float), "attn_mla");
    if (!qf || !part) return -1;
    static size_t shb_set = 0;
    if (shb > 48 * 1024 && shb > shb_set) {
        CK("attn_mla", cudaFuncSetAttribute(k_mla_chunk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shb));
        shb_set = shb;
    }
    /* the 16-byte paths: kv_b's layout in FP8 (scale blocks of whole 16-column groups) or BF16, rows 16-byte
     * aligned, kv_lora a multiple of the elements per 16 bytes and at most 32 x EP x 2 */
    const int vk = split_k || split_v ? MW_GENERIC : mla_kind(kvb);
    const int ep = vk == MW_FP8 ? 16 : 8;
    const int vec = (vk == MW_FP8 || vk == MW_BF16) && !(c.kv_lora % ep) && c.kv_lora <= 64 * ep && !(kvb.row_bytes % 16) &&
                    !((uintptr_t)kvb.data % 16) && (vk != MW_FP8 || !(kvb.blk_c % 16)) && c.nope <= 256;
    const int ng = c.kv_lora <= 32 * ep ? 1 : 2;
    if (vec) {
        const size_t ashb = (size_t)32 * c.kv_lora * sizeof(float);
        static size_t ashb_set[4] = {0, 0, 0, 0};
        const int ai = (vk == MW_FP8 ? 0 : 2) + ng - 1;
        if (vk == MW_FP8) { if (ng == 1) mla_av<MW_FP8, 1>(c, kvb, qf, ashb, &ashb_set[ai], early); else mla_av<MW_FP8, 2>(c, kvb, qf, ashb, &ashb_set[ai], early); }
        else { if (ng == 1) mla_av<MW_BF16, 1>(c, kvb, qf, ashb, &ashb_set[ai], early); else mla_av<MW_BF16, 2>(c, kvb, qf, ashb, &ashb_set[ai], early); }
    } else if (split_k) { MLA_BY_KIND(mla_kind(kb), MLA_ABSORB1, c, kb, qf) }
    else { MLA_BY_KIND(mla_kind(kvb), MLA_ABSORB0, c, kvb, qf) }
    post("attn_mla");
    unsigned long long *mts = c.n == 1 ? kts_slot(g_kts_mla, (size_t)S * G) : NULL;
    launch_k(k_mla_chunk, dim3((unsigned)S, (unsigned)G, (unsigned)c.n), dim3(MD_TH), shb, c, (const float *)qf, ch, S, part, (lean_mask() & 67108864) ? 1 : 0, mts);
    post("attn_mla");
    const DW &wv = split_v ? vb : kvb;
    const float *pc = part;
    if (vec) {
        if (vk == MW_FP8) { if (ng == 1) launch_k(k_mla_out_v<MW_FP8, 1>, dim3((unsigned)c.n_heads, (unsigned)c.n), dim3(MD_BIG), 0, c, kvb, ch, S, pc, early);
                            else launch_k(k_mla_out_v<MW_FP8, 2>, dim3((unsigned)c.n_heads, (unsigned)c.n), dim3(MD_BIG), 0, c, kvb, ch, S, pc, early); }
        else { if (ng == 1) launch_k(k_mla_out_v<MW_BF16, 1>, dim3((unsigned)c.n_heads, (unsigned)c.n), dim3(MD_BIG), 0, c, kvb, ch, S, pc, early);
               else launch_k(k_mla_out_v<MW_BF16, 2>, dim3((unsigned)c.n_heads, (unsigned)c.n), dim3(MD_BIG), 0, c, kvb, ch, S, pc, early); }
    } else MLA_BY_KIND(mla_kind(wv), MLA_OUT, c, wv, split_v, ch, S, pc)
    post("attn_mla");
    return 1;
}
/* positions in batches whose partials stay under 256 MB (a prefill through these launches: DELTAFIN_CUDA_MLA_DEC_N) */
static int g_mla_dec_n = -1;
static int mla_dec(const df_attn_mla_args &c, const DW &kvb, const DW &kb, const DW &vb, int split_k, int split_v, int early) {
    if (g_mla_dec_n < 0) { /* DELTAFIN_CUDA_MLA_DEC_N=N: these launches for calls of up to N positions (default 512: a 512-token
                            * DeepSeek-V3-shape prefill's MLA 247 -> 52 ms on the H200, conformance with 64 and model parity
                            * (cuda_e2e, 14 models) with 512 passed; 4 keeps prefill calls on k_attn_mla) */
        const char *e = getenv("DELTAFIN_CUDA_MLA_DEC_N");
        g_mla_dec_n = e && atoi(e) > 0 ? atoi(e) : MLA_DEC_N;
    }
    const int cd = c.kv_lora + c.rope;
    if (c.n > g_mla_dec_n || c.nope > 256 || c.kv_lora > 1024 || cd > 32 * MD_MAXK) return 0;
    const size_t T = (size_t)c.pos0 + c.n;
    const int ch = md_ch(T), S = (int)((T + ch - 1) / ch);
    if (((size_t)MD_HG * cd + (size_t)ch * cd + (size_t)MD_HG * ch) * sizeof(float) > 200 * 1024) return 0;
    const size_t per = (size_t)c.n_heads * S * (size_t)(c.kv_lora + 2) * sizeof(float);
    const int nb = (int)((((size_t)256 << 20) / per) < 1 ? 1 : ((size_t)256 << 20) / per);
    for (int t0 = 0; t0 < c.n; t0 += nb) {
        df_attn_mla_args b = c;
        b.n = c.n - t0 < nb ? c.n - t0 : nb, b.pos0 = c.pos0 + t0;
        b.q = (const df_act *)(DCP(c.q) + (size_t)t0 * c.n_heads * (c.nope + c.rope));
        b.out = (df_act *)(DP(c.out) + (size_t)t0 * c.n_heads * c.v_dim);
        const int r = mla_dec1(b, kvb, kb, vb, split_k, split_v, early);
        if (r <= 0) return t0 ? -1 : r; /* (a later batch cannot refuse what the first took: same shapes, shorter caches) */
    }
    return 1;
}
static int64_t g_mla_early;
extern "C" int64_t df_cuda_mla_early_calls(void) { return g_mla_early; }
void g_attn_mla(const df_attn_mla_args *a) {
    LOCK();
    if (a->n <= 0 || a->n_heads <= 0) return;
    const int split_k = a->k_b && a->k_b->data, split_v = a->v_b && a->v_b->data;
    DW kvb, kb, vb;
    memset(&kvb, 0, sizeof kvb), memset(&kb, 0, sizeof kb), memset(&vb, 0, sizeof vb);
    if ((!split_k || !split_v) && w_get(a->kv_b, S_WD0, S_WS0, &kvb, "attn_mla")) return;
    if (split_k && w_get(a->k_b, S_WD1, S_WS1, &kb, "attn_mla")) return;
    if (split_v && w_get(a->v_b, S_WD2, S_WS2, &vb, "attn_mla")) return;
    const size_t shb = ((size_t)a->nope + a->rope + 2 * (size_t)a->kv_lora) * sizeof(float);
    if (shb > 48 * 1024) CK("attn_mla", cudaFuncSetAttribute(k_attn_mla, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shb));
    const int per = chunk_tokens(a->n, a->n_heads, a->pos0);
    /* bit 67108864 (round 15): kv_b's rows loaded before the 16-byte launches' wait where it is resident (written by no
     * kernel) and the launches programmatic */
    const int early = (lean_mask() & 67108864) && pdl_on() && !split_k && !split_v && w_resident(a->kv_b);
    if (early) g_mla_early++;
    for (int t0 = 0; t0 < a->n; t0 += per) {
        df_attn_mla_args c = *a;
        c.n = a->n - t0 < per ? a->n - t0 : per, c.pos0 = a->pos0 + t0;
        c.q = (const df_act *)(DCP(a->q) + (size_t)t0 * a->n_heads * (a->nope + a->rope));
        c.out = (df_act *)(DP(a->out) + (size_t)t0 * a->n_heads * a->v_dim);
        const size_t T = (size_t)c.pos0 + c.n;
        if (g_mla_dec < 0) { /* DELTAFIN_CUDA_MLA_DEC=0: k_attn_mla for every position (the before, a measurement aid) */
            const char *e = getenv("DELTAFIN_CUDA_MLA_DEC");
            g_mla_dec = !(e && !strcmp(e, "0"));
        }
        if (g_mla_dec) {
            const int r = mla_dec(c, kvb, kb, vb, split_k, split_v, early);
            if (r < 0) return;
            if (r) continue;
        }
        float *sc = (float *)slot(S_SCORES, (size_t)c.n * c.n_heads * T * sizeof(float), "attn_mla");
        if (!sc) return;
        launch_k(k_attn_mla, dim3(dim3((unsigned)c.n_heads, (unsigned)c.n)), dim3(AT_TH), shb, c, kvb, kb, vb, split_k, split_v, sc);
        post("attn_mla");
    }
}

/* ---- rows ------------------------------------------------------------------------------- */
/* the threads of a row's block (the sums' order depends on it: the fused ops below use the same count) */
/* A row of at most RN_REG x blockDim columns: the thread's elements loaded at once into registers (all loads in
 * flight, not one dependent round per element) and kept there for the second pass; the same sums in the same
 * order as the loops (the same bits). */
enum { RN_REG = 8 };
static int g_rn_reg = -1;
static int rn_reg(void) { /* DELTAFIN_CUDA_RN_REG=0: the loops for every row (the before; the same bits, a measurement aid) */
    if (g_rn_reg < 0) {
        const char *e = getenv("DELTAFIN_CUDA_RN_REG");
        g_rn_reg = !(e && !strcmp(e, "0"));
    }
    return g_rn_reg;
}
/* threads a row of the norm launches: half the columns (bit 4), at most DELTAFIN_CUDA_RN_TH (round 24: 32..1024 in
 * steps of 32, default 512: a block of 1,024 threads spent its time in the barriers and the 32-part block sum; 512
 * measured +1.4% decode, 256 -0.7%) but never fewer than keep the row in RN_REG registers a thread (7168 columns: 896);
 * other thread counts sum the squares in other groups (other bits, the same bound) */
enum { RN_CAP_DEF = 512 };
static unsigned g_rn_cap;
static unsigned rms_threads(int cols) {
    unsigned th = 128;
    if (lean_mask() & 4) {
        if (!g_rn_cap) {
            const char *e = getenv("DELTAFIN_CUDA_RN_TH");
            const int v = e && *e ? atoi(e) : RN_CAP_DEF;
            if (e && *e && !(v >= 32 && v <= 1024 && v % 32 == 0))
                fprintf(stderr, "deltafin: cuda backend: DELTAFIN_CUDA_RN_TH=%s is not a multiple of 32 in 32..1024 (threads a norm row at most): %d\n", e, RN_CAP_DEF);
            g_rn_cap = v >= 32 && v <= 1024 && v % 32 == 0 ? (unsigned)v : (unsigned)RN_CAP_DEF;
        }
        const unsigned want = ((unsigned)((cols + 1) / 2) + 31u) / 32u * 32u;
        th = want > 1024u ? 1024u : want < 32u ? 32u : want;
        if (th > g_rn_cap) {
            const unsigned need = ((unsigned)((cols + RN_REG - 1) / RN_REG) + 31u) / 32u * 32u;
            th = need > g_rn_cap ? (need > 1024u ? 1024u : need) : g_rn_cap;
        }
    }
    return th;
}
static __device__ __forceinline__ void rn_load(const float *p, int n, float (&v)[RN_REG]) {
#pragma unroll
    for (int k = 0; k < RN_REG; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = i < n ? p[i] : 0.0f;
    }
}
/* the thread's sum of squares, its elements in order (the loops' order) */
static __device__ __forceinline__ double rn_ss(const float (&v)[RN_REG], int n) {
    double ss = 0;
#pragma unroll
    for (int k = 0; k < RN_REG; k++)
        if (threadIdx.x + k * blockDim.x < (unsigned)n) ss += (double)v[k] * v[k];
    return ss;
}
static __device__ __forceinline__ void rn_store(float *o, const float (&gv)[RN_REG], const float (&v)[RN_REG], float inv, int n) {
#pragma unroll
    for (int k = 0; k < RN_REG; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n) o[i] = gv[k] * (v[k] * inv);
    }
}
__global__ void __launch_bounds__(1024) k_rmsnorm(float *out, size_t os, const float *x, size_t xs, const float *g, int rows, int n, float eps, int reg) { pdl_entry();
    if (reg && n <= RN_REG * (int)blockDim.x) {
        for (int r = blockIdx.x; r < rows; r += gridDim.x) {
            const float *xr = x + (size_t)r * xs;
            float *o = out + (size_t)r * os;
            float v[RN_REG], gv[RN_REG];
            rn_load(xr, n, v), rn_load(g, n, gv);
            const double ss = block_sum(rn_ss(v, n)); /* (its barriers: every read of the row before any write) */
            rn_store(o, gv, v, 1.0f / sqrtf((float)(ss / n) + eps), n);
            __syncthreads();
        }
        return;
    }
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + (size_t)r * xs;
        float *o = out + (size_t)r * os;
        double ss = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
        ss = block_sum(ss);
        const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = g[i] * (xr[i] * inv);
        __syncthreads();
    }
}
void g_rmsnorm(df_act *out, size_t os, const df_act *x, size_t xs, const float *g, int rows, int cols, float eps) {
    LOCK();
    if (rows <= 0 || cols <= 0) return;
    const float *dg = param(g, (size_t)cols, S_P0, "rmsnorm");
    if (!dg) return;
    /* DELTAFIN_CUDA_LEAN bit 4: a row's block has a thread per 2 columns (up to 1024): a 2048-column row in
     * 128 threads was 16 dependent load rounds per pass, about 9 us on the H200 for 8 KB */
    const unsigned th = rms_threads(cols);
    launch_k(k_rmsnorm, dim3(rows < 65535 ? rows : 65535), dim3(th), 0, DP(out), os, DCP(x), xs, dg, rows, cols, eps, rn_reg());
    post("rmsnorm");
}

__global__ void k_rope_table(float *p, int pos0, int n, const float *inv_freq, int half, float scale) { pdl_entry();
    const size_t N = (size_t)n * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < N; k += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(k / half), i = (int)(k % half);
        const float ang = (float)(pos0 + t) * inv_freq[i];
        p[k * 2] = cosf(ang) * scale;
        p[k * 2 + 1] = sinf(ang) * scale;
    }
}
void g_rope_table(df_act *cs, int pos0, int n, const float *inv_freq, int half, float scale) {
    LOCK();
    if (n <= 0 || half <= 0) return;
    const float *di = param(inv_freq, (size_t)half, S_P0, "rope_table");
    if (!di) return;
    const size_t N = (size_t)n * half;
    launch_k(k_rope_table, dim3(blocks_for(N, 256)), dim3(256), 0, DP(cs), pos0, n, di, half, scale);
    post("rope_table");
}

/* one rotated pair (k_rope and the fused k_qk_norm_rope: the same expression, the same bits) */
static __device__ __forceinline__ void rope_pair(float *p0, float *p1, float c, float s) {
    const float a = *p0, b = *p1;
    *p0 = a * c - b * s;
    *p1 = b * c + a * s;
}
__global__ void k_rope(float *x, int n, int nh, size_t ts, size_t hs, int dim, const float *cs, int interleaved) { pdl_entry();
    const int half = dim / 2;
    const size_t N = (size_t)n * nh * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < N; k += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(k % half), h = (int)((k / half) % nh), t = (int)(k / ((size_t)half * nh));
        const float *c2 = cs + (size_t)t * half * 2;
        float *v = x + (size_t)t * ts + (size_t)h * hs;
        const float c = c2[2 * i], s = c2[2 * i + 1];
        const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
        rope_pair(v + i0, v + i1, c, s);
    }
}
void g_rope(df_act *x, int n, int nh, size_t ts, size_t hs, int dim, const df_act *cs, int interleaved) {
    PROF_SCOPE();
    if (n <= 0 || nh <= 0 || dim < 2) return;
    const size_t N = (size_t)n * nh * (dim / 2);
    launch_k(k_rope, dim3(blocks_for(N, 256)), dim3(256), 0, DP(x), n, nh, ts, hs, dim, DCP(cs), interleaved);
    post("rope");
}

/* ---- fused row ops (DELTAFIN_CUDA_LEAN bit 256, round 8): one launch for what the model issues back to back,
 * each value computed by k_add / k_rmsnorm / k_rope's own expressions in the same order (same thread count per
 * row, so the same double sums): the same bits as the plain launches, which run instead with the bit off. ---- */
int64_t g_fused_launches;
extern "C" int64_t df_cuda_fused_launches(void) { return g_fused_launches; }
/* y += x, then out = rmsnorm(y) by g, rows of n contiguous floats */
__global__ void __launch_bounds__(1024) k_add_rmsnorm(float *out, float *y, const float *x, const float *g, int rows, int n, float eps, int reg) { pdl_entry();
    if (reg && n <= RN_REG * (int)blockDim.x) { /* as k_rmsnorm: the thread's elements in registers, the same sums */
        for (int r = blockIdx.x; r < rows; r += gridDim.x) {
            float *yr = y + (size_t)r * n;
            const float *xr = x + (size_t)r * n;
            float *o = out + (size_t)r * n;
            float v[RN_REG], xv[RN_REG], gv[RN_REG];
            rn_load(yr, n, v), rn_load(xr, n, xv), rn_load(g, n, gv);
            __syncthreads(); /* every read of the rows before any write (out may be x or y) */
#pragma unroll
            for (int k = 0; k < RN_REG; k++) {
                const int i = threadIdx.x + k * blockDim.x;
                v[k] = v[k] + xv[k];
                if (i < n) yr[i] = v[k];
            }
            const double ss = block_sum(rn_ss(v, n));
            rn_store(o, gv, v, 1.0f / sqrtf((float)(ss / n) + eps), n);
            __syncthreads();
        }
        return;
    }
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        float *yr = y + (size_t)r * n;
        const float *xr = x + (size_t)r * n;
        float *o = out + (size_t)r * n;
        double ss = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = yr[i] + xr[i];
            yr[i] = v;
            ss += (double)v * v;
        }
        ss = block_sum(ss);
        const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = g[i] * (yr[i] * inv);
        __syncthreads();
    }
}
void g_add_rmsnorm(df_act *out, df_act *y, const df_act *x, const float *g, int rows, int cols, float eps) {
    if (rows <= 0 || cols <= 0) return;
    if (!(lean_mask() & 256)) { /* round 7's two launches */
        g_add(y, x, (size_t)rows * cols);
        g_rmsnorm(out, (size_t)cols, y, (size_t)cols, g, rows, cols, eps);
        return;
    }
    LOCK();
    const float *dg = param(g, (size_t)cols, S_P0, "add_rmsnorm");
    if (!dg) return;
    launch_k(k_add_rmsnorm, dim3(rows < 65535 ? rows : 65535), dim3(rms_threads(cols)), 0, DP(out), DP(y), DCP(x), dg, rows, cols, eps, rn_reg());
    g_fused_launches++;
    post("add_rmsnorm");
}
/* a block per head row (the q rows, the k rows, then with kc the v rows): k_rmsnorm's norm in place, then k_rope's
 * pairs, then (kc) a k row's copy into the cache; a v row's block only copies it */
__global__ void k_qk_norm_rope(float *q, float *k, const float *gq, const float *gk, int n, int nq, int nk, int hd, int dim, float eps,
                               const float *cs, int interleaved, const float *vv, float *kc, float *vc, size_t kvs) { pdl_entry();
    const int rq = n * nq, rk = rq + n * nk, rows = kc ? rk + n * nk : rk, half = dim / 2;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        if (r >= rk) { /* a v row into the cache */
            const int rr = r - rk, t = rr / nk, h = rr % nk;
            const float *src = vv + (size_t)rr * hd;
            float *dst = vc + (size_t)t * kvs + (size_t)h * hd;
            for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = src[i];
            continue;
        }
        const int isq = r < rq, rr = isq ? r : r - rq, t = rr / (isq ? nq : nk);
        float *v = (isq ? q : k) + (size_t)rr * hd;
        const float *g = isq ? gq : gk;
        double ss = 0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += (double)v[i] * v[i];
        ss = block_sum(ss);
        const float inv = 1.0f / sqrtf((float)(ss / hd) + eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = g[i] * (v[i] * inv);
        __syncthreads();
        const float *c2 = cs + (size_t)t * half * 2;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
            rope_pair(v + i0, v + i1, c2[2 * i], c2[2 * i + 1]);
        }
        __syncthreads();
        if (!isq && kc) {
            float *dst = kc + (size_t)t * kvs + (size_t)(rr % nk) * hd;
            for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = v[i];
        }
    }
}
void g_qk_norm_rope(const df_qk_norm_rope_args *a) {
    if (a->n <= 0 || a->hd <= 0) return;
    if (!(lean_mask() & 256) || a->rope_dim > a->hd) { /* round 7's four launches */
        const size_t hd = (size_t)a->hd;
        g_rmsnorm(a->q, hd, a->q, hd, a->q_norm, a->n * a->nq, a->hd, a->eps);
        g_rmsnorm(a->k, hd, a->k, hd, a->k_norm, a->n * a->nk, a->hd, a->eps);
        g_rope(a->q, a->n, a->nq, (size_t)a->nq * hd, hd, a->rope_dim, a->cs, a->interleaved);
        g_rope(a->k, a->n, a->nk, (size_t)a->nk * hd, hd, a->rope_dim, a->cs, a->interleaved);
        if (a->kc) {
            df_backend_cuda.copy_rows(a->kc, a->kv_stride, a->k, (size_t)a->nk * hd, a->n, a->nk * a->hd);
            df_backend_cuda.copy_rows(a->vc, a->kv_stride, a->v, (size_t)a->nk * hd, a->n, a->nk * a->hd);
        }
        return;
    }
    LOCK();
    const float *gq = param(a->q_norm, (size_t)a->hd, S_P0, "qk_norm_rope");
    const float *gk = gq ? param(a->k_norm, (size_t)a->hd, S_P1, "qk_norm_rope") : NULL;
    if (!gk) return;
    const int rows = a->n * (a->nq + (a->kc ? 2 : 1) * a->nk);
    launch_k(k_qk_norm_rope, dim3(rows < 65535 ? rows : 65535), dim3(rms_threads(a->hd)), 0, DP(a->q), DP(a->k), gq, gk, a->n, a->nq, a->nk,
             a->hd, a->rope_dim < 2 ? 0 : a->rope_dim, a->eps, DCP(a->cs), a->interleaved, DCP(a->v), DP(a->kc), DP(a->vc), a->kv_stride);
    g_fused_launches++;
    post("qk_norm_rope");
}

/* ---- element-wise ----------------------------------------------------------------------- */
#define GRID_LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ void k_add(float *y, const float *x, size_t n) { pdl_entry(); GRID_LOOP(i, n) y[i] += x[i]; }
__global__ void k_add_bias(float *y, const float *b, size_t n, int cols) { pdl_entry(); GRID_LOOP(i, n) y[i] += b[i % cols]; }
__global__ void k_axpy(float *y, float a, const float *x, size_t n) { pdl_entry(); GRID_LOOP(i, n) y[i] += a * x[i]; }
__global__ void k_scale(float *y, float a, size_t n) { pdl_entry(); GRID_LOOP(i, n) y[i] *= a; }
__global__ void k_sigmoid(float *y, size_t n) { pdl_entry(); GRID_LOOP(i, n) y[i] = d_sigm(y[i]); }
__global__ void k_gate(float *o, const float *g, const float *u, size_t n, int kind, float p0, float p1) { pdl_entry();
    GRID_LOOP(i, n) o[i] = gate_apply(kind, g[i], u[i], p0, p1);
}
void g_add(df_act *y, const df_act *x, size_t n) { PROF_SCOPE(); if (n) launch_k(k_add, dim3(blocks_for(n, 256)), dim3(256), 0, DP(y), DCP(x), n), post("add"); }
void g_add_bias(df_act *y, const float *b, int rows, int cols) {
    LOCK();
    if (rows <= 0 || cols <= 0) return;
    const float *db = param(b, (size_t)cols, S_P0, "add_bias");
    if (!db) return;
    const size_t n = (size_t)rows * cols;
    launch_k(k_add_bias, dim3(blocks_for(n, 256)), dim3(256), 0, DP(y), db, n, cols);
    post("add_bias");
}
void g_axpy(df_act *y, float a, const df_act *x, size_t n) { if (n) launch_k(k_axpy, dim3(blocks_for(n, 256)), dim3(256), 0, DP(y), a, DCP(x), n), post("axpy"); }
void g_scale(df_act *y, float a, size_t n) { if (n) launch_k(k_scale, dim3(blocks_for(n, 256)), dim3(256), 0, DP(y), a, n), post("scale"); }
void g_sigmoid(df_act *x, size_t n) { if (n) launch_k(k_sigmoid, dim3(blocks_for(n, 256)), dim3(256), 0, DP(x), n), post("sigmoid"); }
void g_gate(df_act *out, const df_act *g, const df_act *u, size_t n, df_gate_kind kind, float p0, float p1) {
    if (!n || kind < 0 || kind >= DF_GATE_N) return;
    launch_k(k_gate, dim3(blocks_for(n, 256)), dim3(256), 0, DP(out), DCP(g), DCP(u), n, (int)kind, p0, p1);
    post("gate");
}

__global__ void k_l2norm(float *x, int rows, int cols, float eps, float scale) { pdl_entry();
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        float *v = x + (size_t)r * cols, ss = 0.0f;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += v[i] * v[i];
        ss = block_sum(ss);
        const float k = scale / sqrtf(ss + eps);
        for (int i = threadIdx.x; i < cols; i += blockDim.x) v[i] *= k;
        __syncthreads();
    }
}
void g_l2norm(df_act *x, int rows, int cols, float eps, float scale) {
    if (rows <= 0 || cols <= 0) return;
    launch_k(k_l2norm, dim3(rows < 65535 ? rows : 65535), dim3(128), 0, DP(x), rows, cols, eps, scale);
    post("l2norm");
}

/* block per token */
__global__ void k_attn_res(df_attn_res_args a, const float *nw, const float *pw) { pdl_entry();
    __shared__ float sc[1 + DF_ATTN_RES_MAX_BLOCKS];
    __shared__ float total;
    const int h = a.h, nb = a.nb;
    for (int t = blockIdx.x; t < a.n; t += gridDim.x) {
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? DCP(a.blocks) + (size_t)i * a.block_stride + (size_t)t * h : DCP(a.p) + (size_t)t * h;
            float ss = 0.0f;
            for (int d = threadIdx.x; d < h; d += blockDim.x) ss += v[d] * v[d];
            ss = block_sum(ss);
            const float r = 1.0f / sqrtf(ss / (float)h + a.eps);
            float s = 0.0f;
            for (int d = threadIdx.x; d < h; d += blockDim.x) s += (v[d] * r) * (nw[d] * pw[d]);
            s = block_sum(s);
            if (!threadIdx.x) sc[i] = s;
        }
        __syncthreads();
        if (!threadIdx.x) {
            float mx = -INFINITY, sum = 0.0f;
            for (int i = 0; i <= nb; i++) mx = fmaxf(mx, sc[i]);
            for (int i = 0; i <= nb; i++) sum += sc[i] = expf(sc[i] - mx);
            total = sum;
        }
        __syncthreads();
        float *o = DP(a.out) + (size_t)t * h;
        for (int d = threadIdx.x; d < h; d += blockDim.x) {
            float acc = 0.0f;
            for (int i = 0; i <= nb; i++) {
                const float *v = i < nb ? DCP(a.blocks) + (size_t)i * a.block_stride + (size_t)t * h : DCP(a.p) + (size_t)t * h;
                acc += (sc[i] / total) * v[d];
            }
            o[d] = acc;
        }
        __syncthreads();
    }
}
void g_attn_res(const df_attn_res_args *a) {
    LOCK();
    if (a->n <= 0 || a->h <= 0) return;
    if (a->nb < 0 || a->nb > DF_ATTN_RES_MAX_BLOCKS) {
        fprintf(stderr, "deltafin: cuda backend: attn_res: %d blocks (at most %d)\n", a->nb, DF_ATTN_RES_MAX_BLOCKS);
        return;
    }
    const float *nw = param(a->norm_w, (size_t)a->h, S_P0, "attn_res"), *pw = param(a->proj_w, (size_t)a->h, S_P1, "attn_res");
    if (!nw || !pw) return;
    launch_k(k_attn_res, dim3(a->n < 65535 ? a->n : 65535), dim3(128), 0, *a, nw, pw);
    post("attn_res");
}

/* ---- MoE -------------------------------------------------------------------------------- */
/* The router on the host with the CPU backend's code (the expert ids are host memory by contract), through
 * page-locked staging: the logits come back in one direct copy (the one wait of a MoE layer: the ids decide
 * what the host does next), the weights go out asynchronously on the compute stream (the staging buffer is
 * rewritten only by the next route, after its read-back, so after that copy has run). Pageable staging when
 * page-locked memory cannot be had. */
static float *g_rt_pin;
static size_t g_rt_cap; /* floats */
static int g_rt_pageable;
void g_route(const df_route_args *a) {
    LOCK(); /* the staging buffer is shared: one route at a time, like every op that keeps state */
    if (a->n <= 0) return;
    const size_t nl = (size_t)a->n * a->n_experts, nw = (size_t)a->n * a->k, need = nl + nw + 64;
    if (g_rt_cap < need) {
        if (g_rt_pin) {
            gr_flush();
            cudaDeviceSynchronize(); /* the last weights copy may still read it */
            if (g_rt_pageable) free(g_rt_pin);
            else cudaFreeHost(g_rt_pin);
        }
        g_rt_pin = NULL, g_rt_cap = 0, g_rt_pageable = 0;
        if (cudaHostAlloc((void **)&g_rt_pin, need * sizeof(float), cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            g_rt_pin = (float *)malloc(need * sizeof(float)), g_rt_pageable = 1;
        }
        if (!g_rt_pin) {
            fprintf(stderr, "deltafin: cuda backend: route: out of host memory for %zu logits\n", nl);
            return;
        }
        g_rt_cap = need;
    }
    float *lg = g_rt_pin, *w = g_rt_pin + nl;
    gr_flush();
    CK("route", cudaMemcpy(lg, a->logits, nl * sizeof(float), cudaMemcpyDeviceToHost));
    df_route_args h = *a;
    h.logits = (const df_act *)lg;
    h.w = a->w ? (df_act *)w : NULL;
    df_backend_cpu.route(&h);
    if (a->w) CK("route", cudaMemcpyAsync(a->w, w, nw * sizeof(float), cudaMemcpyHostToDevice, 0));
}

__global__ void k_moe_combine(float *out, const float *x, const float *w, int n, int k, int cols) { pdl_entry();
    const size_t N = (size_t)n * cols;
    GRID_LOOP(i, N) {
        const size_t t = i / cols, c = i % cols;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += w[t * k + j] * x[(t * k + j) * cols + c];
        out[i] = acc;
    }
}
void g_moe_combine(df_act *out, const df_act *x, const df_act *w, int n, int k, int cols) {
    PROF_SCOPE();
    if (n <= 0 || cols <= 0) return;
    const size_t N = (size_t)n * cols;
    launch_k(k_moe_combine, dim3(blocks_for(N, 256)), dim3(256), 0, DP(out), DCP(x), DCP(w), n, k, cols);
    post("moe_combine");
}

/* ---- recurrent mixers ------------------------------------------------------------------- */
/* thread per channel, tokens in order (as the CPU loop) */
__global__ void k_conv1d(df_conv1d_args a, const float *wt, const float *bias) { pdl_entry();
    const int C = a.C, W = a.W, n = a.n, M = W - 1;
    const float *x = DCP(a.x);
    float *y = DP(a.y), *st = DP(a.state);
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        const float *wc = wt + (size_t)c * W;
        float *sc = st + (size_t)c * M;
        for (int t = 0; t < n; t++) {
            float acc = 0.0f;
            for (int j = 0; j < M; j++) {
                const int src = t + j - M;
                const float v = src < 0 ? sc[M + src] : x[(size_t)src * C + c];
                acc += wc[j] * v;
            }
            acc += wc[M] * x[(size_t)t * C + c];
            if (bias) acc += bias[c];
            y[(size_t)t * C + c] = a.silu ? d_silu(acc) : acc;
        }
        if (n >= M) {
            for (int j = 0; j < M; j++) sc[j] = x[(size_t)(n - M + j) * C + c];
        } else if (M > 0) {
            for (int j = 0; j < M - n; j++) sc[j] = sc[j + n];
            for (int j = 0; j < n; j++) sc[M - n + j] = x[(size_t)j * C + c];
        }
    }
}
void g_causal_conv1d(const df_conv1d_args *a) {
    LOCK();
    if (a->n <= 0 || a->C <= 0 || a->W <= 0) return;
    const float *wt = param(a->w, (size_t)a->C * a->W, S_P0, "causal_conv1d"), *b = param(a->bias, (size_t)a->C, S_P1, "causal_conv1d");
    if (!wt || (a->bias && !b)) return;
    launch_k(k_conv1d, dim3(blocks_for((size_t)a->C, 128)), dim3(128), 0, *a, wt, b);
    post("causal_conv1d");
}

/* block per head; thread j owns column j of S (S[i][j] for every key channel i) */
__global__ void k_kda_scan(df_kda_args a) { pdl_entry();
    const int h = blockIdx.x, dk = a.dk, dv = a.dv, nh = a.nh;
    float *S = DP(a.S) + (size_t)h * dk * dv;
    for (int j = threadIdx.x; j < dv; j += blockDim.x)
        for (int t = 0; t < a.n; t++) {
            const size_t qk = ((size_t)t * nh + h) * dk, vo = ((size_t)t * nh + h) * dv;
            const float *q = DCP(a.q) + qk, *k = DCP(a.k) + qk, *g = DCP(a.g) + qk;
            const float beta = DCP(a.beta)[(size_t)t * nh + h];
            float u = 0.0f;
            for (int i = 0; i < dk; i++) {
                float s = S[(size_t)i * dv + j] * expf(g[i]);
                S[(size_t)i * dv + j] = s;
                u += k[i] * s;
            }
            u = DCP(a.v)[vo + j] - u;
            float o = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float s = S[(size_t)i * dv + j] + (beta * k[i]) * u;
                S[(size_t)i * dv + j] = s;
                o += (q[i] * a.scale) * s;
            }
            DP(a.o)[vo + j] = o;
        }
}
void g_kda_scan(const df_kda_args *a) {
    if (a->n <= 0 || a->nh <= 0) return;
    int th = (a->dv + 31) / 32 * 32;
    if (th > 256) th = 256;
    launch_k(k_kda_scan, dim3((unsigned)a->nh), dim3(th), 0, *a);
    post("kda_scan");
}

__device__ __forceinline__ float d_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__global__ void k_kda_gate(df_kda_gate_args a, const float *A_log, const float *dt_bias) { pdl_entry();
    const size_t N = (size_t)a.n * a.nh * a.d;
    GRID_LOOP(o, N) {
        const int h = (int)((o / a.d) % a.nh), i = (int)(o % a.d);
        const float A = expf(A_log[h]), x = DCP(a.f)[o] + dt_bias[(size_t)h * a.d + i];
        DP(a.g)[o] = a.has_lower_bound ? a.lower_bound * d_sigm(A * x) : -A * d_softplus(x);
    }
}
void g_kda_gate(const df_kda_gate_args *a) {
    LOCK();
    if (a->n <= 0 || a->nh <= 0 || a->d <= 0) return;
    const float *al = param(a->A_log, (size_t)a->nh, S_P0, "kda_gate"), *dt = param(a->dt_bias, (size_t)a->nh * a->d, S_P1, "kda_gate");
    if (!al || !dt) return;
    const size_t N = (size_t)a->n * a->nh * a->d;
    launch_k(k_kda_gate, dim3(blocks_for(N, 256)), dim3(256), 0, *a, al, dt);
    post("kda_gate");
}

