/* cuda_mm.cu - the CUDA backend's products (matmul_batch), in two regimes.
 *
 * Decode (n < MM_GEMM_MIN_N tokens): a warp per MM_R output rows, 8 warps
 * per block, and the jobs of a batch in ONE launch per weight decoder (the job
 * table travels as a kernel parameter, no copy; a MoE batch is one format). Each lane reads the stored row with 16-byte
 * loads, decodes the 8..32 elements of a load exactly (as the CPU decoders:
 * BF16/F16/F32/FP8 E4M3 are exact conversions, E2M1 by bit assembly,
 * INT4/I8 as integers, times the stored scale), and uses them for up to
 * MM_TN tokens and MM_R rows (x is read through L1, shared by the block's
 * warps), then the warp reduces. Weights whose rows are not 16-byte aligned, GGML block types
 * and partial scale groups take the generic path: the same warp-per-row
 * kernel decoding element by element (wget). f32 accumulation throughout.
 *
 * Prefill (n >= MM_GEMM_MIN_N): the weight is dequantized exactly to an f32
 * slab (rows in chunks of at most MM_SLAB_FLOATS floats' bytes) and
 * multiplied by cuBLAS SGEMM in f32 (pedantic math: no TF32), so the result
 * is an f32 product of exactly the stored values; from MM_SPLIT_MIN_N
 * tokens, in an error-bounded split form on tensor cores instead: split-f16
 * (two f16 pieces of x and of W, one GEMM over the pieces laid along K; see
 * mm_gemm_f16), or the first form, split-bf16 (three bf16 pieces, 3 or 6
 * GEMMs; DELTAFIN_CUDA_SPLIT_FORM=bf16); docs/PERFORMANCE.md gives the
 * measured error and rates. Without
 * cuBLAS (handle creation failed) the decode kernel runs over tiles of
 * tokens instead.
 *
 * Either way each output row is computed the same way whatever the batch,
 * so grouping jobs does not change bits. */
#include "backend/cuda/cuda_int.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define MM_TN 8            /* tokens per warp pass */
#define MM_WARPS 8         /* warps per block */
#define MM_R 4             /* rows per warp */
#define MM_MAXJ 24         /* jobs per launch (the table is a kernel parameter, < 4 KiB) */
#define MM_GEMM_MIN_N 32   /* from this many tokens: dequantize + SGEMM */
#define MM_SPLIT_MIN_N 512 /* from this many: split-f16 tensor-core products (DELTAFIN_CUDA_SPLIT_MIN_N) */
#define MM_SLAB_FLOATS ((size_t)64 << 20) /* 256 MiB of f32 weight per SGEMM chunk */

enum { V_GENERIC, V_F32, V_F16, V_BF16, V_FP8, V_INT4, V_I8ROW, V_MXFP4 };

struct MmJob {
    DW w;
    const float *x;
    float *y;
    int vec;           /* V_*: the decoder of the 16-byte path, or V_GENERIC */
    int wk;            /* warps that split a row group's columns (1, 2, 4 or 8; from the job's own shape) */
    unsigned blk0;     /* first block of this job in the launch */
};
template <int MJ> struct MmBatchT {
    MmJob j[MJ];
    int nj, n;         /* jobs, tokens of this launch (<= MM_TN) */
    int t0;            /* first token of this launch (grid.y tiles add to it) */
    int pf;            /* 1: every job's weight is resident and written by no kernel: prefetch it before pdl_wait */
    int cp;            /* host side: 1 for a launch of k_mm_cp (round 9, bit 1024); the device never reads it */
};
typedef MmBatchT<MM_MAXJ> MmBatch;
/* A decode launch of at most MM_SMALLJ jobs travels in a table of that size: the launch copies the
 * whole parameter (about 2.5 KB for MM_MAXJ jobs, 0.4 KB for 4) into the queue on the host. */
#define MM_SMALLJ 4
/* DELTAFIN_CUDA_LEAN bit 4: one-token products load U steps of each row per lane before their products (the
 * same bits): U = 4 in launches of at most two blocks per SM (the dense products of a decode step; the kernel
 * may then use 128 registers, which U = 4 needs without spills), else U = 2 (three blocks per SM) */
static int g_sms;
static int sms(void) {
    if (!g_sms) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
            cudaGetLastError(), v = 1 << 20; /* unknown: never narrow */
        g_sms = v;
    }
    return g_sms;
}
static int deep_u(unsigned blocks) { return (uint64_t)blocks <= 2 * (uint64_t)sms() ? 4 : 2; }

/* ---- exact decoders of 16 stored bytes ---------------------------------------------- */
static __device__ __forceinline__ float e2m1_fast(uint32_t code) { /* as e2m1f */
    const uint32_t e = (code >> 1) & 3, m = code & 1, s = (code & 8) << 28;
    const uint32_t bits = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | s);
}
/* E4M3FN pair (low byte first) -> f32: the hardware conversion to f16 is exact
 * (every E4M3 value, subnormals and NaN included, is an f16), as is f16 -> f32. */
static __device__ __forceinline__ float2 fp8x2_f32(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffff), __NV_E4M3);
    return __half22float2(__half2(h));
}

/* elements per 16-byte load, and per decoded chunk */
template <int V> struct Fmt {
    static constexpr int E = V == V_F32 ? 4 : V == V_F16 || V == V_BF16 ? 8 : V == V_FP8 || V == V_I8ROW ? 16 : 32;
    static constexpr int C = V == V_F32 ? 4 : 8;
};

/* chunk h (C elements) of the 16 stored bytes q, times the scale s, as the CPU decodes them */
template <int V> static __device__ __forceinline__ void decode(const uint4 &u, int h, float s, float (&wv)[Fmt<V>::C]) {
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
    if (V == V_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) wv[i] = __uint_as_float(q[i]);
    } else if (V == V_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) wv[2 * i] = __uint_as_float(q[i] << 16), wv[2 * i + 1] = __uint_as_float(q[i] & 0xffff0000u);
    } else if (V == V_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(__halves2half2(__ushort_as_half((unsigned short)(q[i] & 0xffff)), __ushort_as_half((unsigned short)(q[i] >> 16))));
            wv[2 * i] = f.x, wv[2 * i + 1] = f.y;
        }
    } else if (V == V_FP8) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t word = q[2 * h + i];
            const float2 lo = fp8x2_f32(word), hi = fp8x2_f32(word >> 16);
            wv[4 * i] = __fmul_rn(lo.x, s), wv[4 * i + 1] = __fmul_rn(lo.y, s), wv[4 * i + 2] = __fmul_rn(hi.x, s), wv[4 * i + 3] = __fmul_rn(hi.y, s);
        }
    } else if (V == V_I8ROW) {
#pragma unroll
        for (int i = 0; i < 8; i++) wv[i] = __fmul_rn((float)(int8_t)((q[2 * h + i / 4] >> (8 * (i % 4))) & 0xff), s);
    } else if (V == V_INT4) {
#pragma unroll
        for (int i = 0; i < 8; i++) wv[i] = __fmul_rn((float)((int)((q[h] >> (4 * i)) & 15) - 8), s);
    } else { /* V_MXFP4 */
#pragma unroll
        for (int i = 0; i < 8; i++) wv[i] = __fmul_rn(e2m1_fast((q[h] >> (4 * i)) & 15), s);
    }
}

/* V: the decoder; NT: tokens per pass (1, 2, 4 or MM_TN: few registers for few tokens).
 * A row group is MM_R consecutive rows, read by J.wk warps of the block that
 * split its columns (32-lane strides interleaved); each lane loads 16 bytes
 * of every row of the group per step (MM_R loads in flight), and each
 * activation chunk it loads serves the MM_R rows. The wk partial sums are
 * added in warp order (shared memory), so a row's bits depend only on its
 * job's shape. */
/* The gate applied to a product's input as it is loaded (the device-routed MoE's down products read the
 * gate/up products g and u and apply the gate, as k_gate would have written it: the same bits): u = g + uoff */
struct GateIn {
    long long uoff;
    int kind;
    float p0, p1;
};
/* One warp's share of a row group: rows r0..r0+nr-1 of job J, the 32-lane column strides ks of wk, tokens
 * t0..t0+nt-1, into acc. A (1 token only): the input is gate(g, u) of J.x (= g) and J.x + ga.uoff (u). */
template <int V, int NT, int U, int A>
static __device__ __forceinline__ void mm_warp(const MmJob &J, int64_t r0, int nr, int ks, int wk, int t0, int nt, const GateIn &ga, float (&acc)[MM_R][NT]) {
    const DW &w = J.w;
    const int64_t K = w.cols;
    const float *x = J.x + (int64_t)t0 * K;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < MM_R; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[i][t] = 0.0f;
    if (V == V_GENERIC) {
        for (int i = 0; i < nr; i++)
            for (int64_t c = ks * 32 + lane; c < K; c += 32 * wk) {
                const float wv = wget(w, r0 + i, c);
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < nt) acc[i][t] = fmaf(wv, A == 1 ? gate_apply(ga.kind, ld_act(x + c), ld_act(x + ga.uoff + c), ga.p0, ga.p1) : A == 2 ? x[(int64_t)t * K + c] : ld_act(x + (int64_t)t * K + c), acc[i][t]);
            }
    } else if (nr) {
        constexpr int E = Fmt<V>::E, C = Fmt<V>::C;
        const int64_t nv = K / E;
        const uint4 *rows[MM_R];
        int64_t srow[MM_R]; /* the row's first scale entry (FP8: its block row's) */
        float rs[MM_R];     /* I8ROW: the row's scale */
        /* 16-byte steps per scale entry along a row (V_FP8: blk_c % 16 == 0, V_INT4: blk_c % 32 == 0; MXFP4: one) */
        const uint32_t vps = V == V_FP8 ? (uint32_t)w.blk_c / 16 : V == V_INT4 ? (uint32_t)w.blk_c / 32 : 1;
#pragma unroll
        for (int i = 0; i < MM_R; i++) {
            const int64_t ri = r0 + (i < nr ? i : 0);
            rows[i] = (const uint4 *)(w.data + (size_t)ri * w.row_bytes);
            srow[i] = V == V_FP8 ? (ri / w.blk_r) * w.scale_cols : ri * w.scale_cols;
            rs[i] = V == V_I8ROW ? scale_at(w, ri) : 1.0f;
        }
        /* U > 1 (one token, DELTAFIN_CUDA_LEAN bit 4): the loads of U steps are issued before any of their
         * products, so a lane keeps U x MM_R 16-byte loads in flight; the products run in the same step order
         * as U = 1, so every accumulator sees the same fmaf chain (the same bits) */
        for (int64_t v0 = ks * 32 + lane; v0 < nv; v0 += (int64_t)U * 32 * wk) {
            uint4 u[U][MM_R];
            float s[U][MM_R];
#pragma unroll
            for (int q = 0; q < U; q++) {
                const int64_t v = v0 + (int64_t)q * 32 * wk;
                if (q && v >= nv) break;
                const int64_t sc = V == V_FP8 || V == V_INT4 ? (int64_t)((uint32_t)v / vps) : v; /* rows are < 2^32 steps */
#pragma unroll
                for (int i = 0; i < MM_R; i++) {
                    u[q][i] = __ldg(rows[i] + v);
                    s[q][i] = V == V_FP8 || V == V_INT4 ? scale_at(w, srow[i] + sc) : V == V_MXFP4 ? e8m0f(__ldg(w.scale + srow[i] + sc)) : rs[i];
                }
            }
#pragma unroll
            for (int q = 0; q < U; q++) {
                const int64_t v = v0 + (int64_t)q * 32 * wk;
                if (q && v >= nv) break;
                const int64_t c0 = v * E;
#pragma unroll
                for (int h = 0; h < E / C; h++) {
                    float wv[MM_R][C];
#pragma unroll
                    for (int i = 0; i < MM_R; i++) decode<V>(u[q][i], h, s[q][i], wv[i]);
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        if (t < nt) {
                            const float4 *xp = (const float4 *)(x + (int64_t)t * K + c0 + h * C);
                            float xv[C];
#pragma unroll
                            for (int qq = 0; qq < C / 4; qq++) {
                                const float4 f = A == 2 ? xp[qq] : ld_act(xp + qq); /* A 2: x in shared memory */
                                xv[4 * qq] = f.x, xv[4 * qq + 1] = f.y, xv[4 * qq + 2] = f.z, xv[4 * qq + 3] = f.w;
                            }
                            if (A == 1) {
                                const float4 *up = (const float4 *)(x + ga.uoff + c0 + h * C);
#pragma unroll
                                for (int qq = 0; qq < C / 4; qq++) {
                                    const float4 f = ld_act(up + qq);
                                    xv[4 * qq] = gate_apply(ga.kind, xv[4 * qq], f.x, ga.p0, ga.p1);
                                    xv[4 * qq + 1] = gate_apply(ga.kind, xv[4 * qq + 1], f.y, ga.p0, ga.p1);
                                    xv[4 * qq + 2] = gate_apply(ga.kind, xv[4 * qq + 2], f.z, ga.p0, ga.p1);
                                    xv[4 * qq + 3] = gate_apply(ga.kind, xv[4 * qq + 3], f.w, ga.p0, ga.p1);
                                }
                            }
#pragma unroll
                            for (int i = 0; i < MM_R; i++)
#pragma unroll
                                for (int k = 0; k < C; k++) acc[i][t] = fmaf(wv[i][k], xv[k], acc[i][t]);
                        }
                    }
                }
            }
        }
    }
}
template <int V, int NT, int WP, int MJ, int U> static __device__ __forceinline__ void mm_body(const MmBatchT<MJ> &b) {
    int j = 0;
    while (j + 1 < b.nj && blockIdx.x >= b.j[j + 1].blk0) j++;
    const MmJob &J = b.j[j];
    const DW &w = J.w;
    const int wk = J.wk, warp = threadIdx.x >> 5, ks = warp % wk;
    const int64_t r0 = ((int64_t)(blockIdx.x - J.blk0) * (WP / wk) + warp / wk) * MM_R;
    const int nr = r0 >= w.rows ? 0 : w.rows - r0 < MM_R ? (int)(w.rows - r0) : MM_R; /* 0: an idle warp (it still meets the barrier) */
    const int t0 = b.t0 + blockIdx.y * NT, nt = b.n - (int)blockIdx.y * NT < NT ? b.n - (int)blockIdx.y * NT : NT;
    const int lane = threadIdx.x & 31;
    float acc[MM_R][NT];
    const GateIn none = {0, 0, 0.0f, 0.0f};
    mm_warp<V, NT, U, 0>(J, r0, nr, ks, wk, t0, nt, none, acc);
    float mine[MM_R];
#pragma unroll
    for (int i = 0; i < MM_R; i++) {
        mine[i] = 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float sum = warp_sum(acc[i][t]);
            if (lane == t) mine[i] = sum;
        }
    }
    if (wk > 1) { /* block-uniform */
        __shared__ float part[WP][MM_R][NT];
        if (lane < NT)
#pragma unroll
            for (int i = 0; i < MM_R; i++) part[warp][i][lane] = mine[i];
        __syncthreads();
        if (ks) return;
#pragma unroll
        for (int i = 0; i < MM_R; i++) {
            float sum = 0.0f;
            if (lane < NT)
                for (int k = 0; k < wk; k++) sum += part[warp + k][i][lane];
            mine[i] = sum;
        }
    }
    if (lane < nt)
#pragma unroll
        for (int i = 0; i < MM_R; i++)
            if (i < nr) J.y[(int64_t)(t0 + lane) * w.rows + r0 + i] = mine[i];
}
/* Round 7 (bit 32): before it waits for the kernel before it, a warp asks L2 for the stored rows of its row
 * group (one prefetch per 128-byte line; the first warp of a row group's wk covers the whole rows), so the
 * weight's bytes stream in while that kernel still runs; the product then reads them as before (the same bits). */
template <int WP, int MJ> static __device__ __forceinline__ void mm_prefetch(const MmBatchT<MJ> &b) {
    int j = 0;
    while (j + 1 < b.nj && blockIdx.x >= b.j[j + 1].blk0) j++;
    const MmJob &J = b.j[j];
    const DW &w = J.w;
    const int wk = J.wk, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp % wk || blockIdx.y) return;
    const int64_t r0 = ((int64_t)(blockIdx.x - J.blk0) * (WP / wk) + warp / wk) * MM_R;
    const int nr = r0 >= w.rows ? 0 : w.rows - r0 < MM_R ? (int)(w.rows - r0) : MM_R;
    if (!nr) return;
    /* the group's rows are contiguous: nr * row_bytes bytes from row r0 */
    const uint8_t *base = w.data + (size_t)r0 * w.row_bytes;
    const size_t bytes = (size_t)nr * w.row_bytes;
    for (size_t off = (size_t)lane * 128; off < bytes; off += 32 * 128) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
#endif
    }
}
/* the job table as a kernel parameter (the host knows the weights) */
template <int V, int NT, int WP, int MJ, int U>
__global__ void __launch_bounds__(WP * 32, (NT > 2 || U > 2 ? 2 : 3) * (MM_WARPS / WP)) k_mm(const __grid_constant__ MmBatchT<MJ> b) {
    pdl_go();
    if (b.pf) mm_prefetch<WP, MJ>(b);
    pdl_wait();
    mm_body<V, NT, WP, MJ, U>(b);
}
/* the job table in device memory, written by an earlier kernel (the device-routed MoE: the device chose the
 * experts); the same body, so each row's arithmetic is the same */
template <int V, int NT, int WP, int MJ, int U>
__global__ void __launch_bounds__(WP * 32, (NT > 2 || U > 2 ? 2 : 3) * (MM_WARPS / WP)) k_mm_dev(const MmBatchT<MJ> *b) {
    /* the wait first: a kernel launched after this one (k_moe_down) then knows the route that wrote this table has finished */
    pdl_wait(), pdl_go(); mm_body<V, NT, WP, MJ, U>(*b); }
/* Round 12 (DELTAFIN_CUDA_LEAN bit 262144): k_mm_dev for the FP8 experts' gate/up products under a bound of 2 blocks an SM
 * (128 registers) instead of 3 (80): at 80, the FP8 body (U = 2: 8 loads of 16 bytes and 8 scales a lane in flight)
 * spills (ptxas: 72 bytes of stack, 68 bytes of spill stores); the same body, so the same bits */
template <int V, int NT, int WP, int MJ, int U>
__global__ void __launch_bounds__(WP * 32, 2) k_mm_dev2(const MmBatchT<MJ> *b) { pdl_wait(), pdl_go(); mm_body<V, NT, WP, MJ, U>(*b); }

/* the device-routed MoE's combine: out[t] = sum over k in order of w[k] x part[k][t], for the block's first nr threads
 * (the one expression every down launch uses: the same bits in each) */
template <int N> static __device__ __forceinline__ void moe_comb(const float (*part)[N], const float *w, int K, int nr, float *out) {
    if ((int)threadIdx.x < nr) {
        float o = 0.0f;
        for (int j = 0; j < K; j++) o += w[j] * part[j][threadIdx.x];
        out[threadIdx.x] = o;
    }
}
/* Round 6 (DELTAFIN_CUDA_LEAN bit 8): the device-routed MoE's gate, down products and combine in ONE launch.
 * A block per group of MM_R output rows, a warp per chosen expert k (the k-th job of the down table: its rows
 * read in 32-lane strides as a launch of wk = 1 reads them, so the same bits), the gate applied to the input
 * as it is loaded (gate_apply, as k_gate writes it: the same bits), each expert's rows written to d as before,
 * then out = the block's K rows combined by the route's weights in k order (k_moe_combine's arithmetic). */
template <int V, int U>
__global__ void __launch_bounds__(FUSED_MAX_K * 32) k_moe_down(const MmBatchT<MM_MAXJ> *b, int K, GateIn ga, const float *wr, float *out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    pdl_go();
    {
        /* round 7 (bit 32): launched early, this kernel's predecessor is the gate/up launch, which lets it launch only
         * after its own wait: the route that wrote this table has finished. So the table is read now (through L2:
         * __ldcg) and the block's rows of expert `warp` are asked of L2 before the wait for the gate/up products. */
        const MmJob *Jp = &b->j[warp];
        const uint8_t *data = (const uint8_t *)__ldcg((const unsigned long long *)&Jp->w.data);
        const size_t rb = (size_t)__ldcg((const unsigned long long *)&Jp->w.row_bytes);
        const int64_t rows = (int64_t)__ldcg((const long long *)&Jp->w.rows), r0 = (int64_t)blockIdx.x * MM_R;
        const int nr = r0 >= rows ? 0 : rows - r0 < MM_R ? (int)(rows - r0) : MM_R;
        const uint8_t *base = data + (size_t)r0 * rb;
        for (size_t off = (size_t)lane * 128; off < (size_t)nr * rb; off += 32 * 128) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
#endif
        }
    }
    pdl_wait();
    const MmJob &J = b->j[warp];
    const int64_t rows = J.w.rows, r0 = (int64_t)blockIdx.x * MM_R;
    const int nr = r0 >= rows ? 0 : rows - r0 < MM_R ? (int)(rows - r0) : MM_R;
    float acc[MM_R][1];
    mm_warp<V, 1, U, 1>(J, r0, nr, 0, 1, 0, 1, ga, acc);
    __shared__ float part[FUSED_MAX_K][MM_R];
#pragma unroll
    for (int i = 0; i < MM_R; i++) {
        const float sum = warp_sum(acc[i][0]);
        if (!lane) {
            part[warp][i] = sum;
            if (i < nr) J.y[r0 + i] = sum;
        }
    }
    __syncthreads();
    moe_comb(part, wr, K, nr, out + r0);
}

/* Round 7 (DELTAFIN_CUDA_LEAN bit 128): k_moe_down with the gate computed once per block instead of once per row
 * group: each warp writes gate(g, u) of its expert's input into shared memory (gate_apply, the same values k_gate
 * writes), then reads it from there (A = 2) for M row groups of MM_R rows; each row's products, its write and the
 * combine are k_moe_down's (the same bits). M = 2 puts the launch in one wave of two blocks per SM. */
template <int V, int U, int M>
__global__ void __launch_bounds__(FUSED_MAX_K * 32) k_moe_down_sh(const MmBatchT<MM_MAXJ> *b, int K, int I, GateIn ga, const float *wr, float *out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    pdl_go();
    { /* as k_moe_down: the table is final (see there); the block's M row groups of expert `warp` asked of L2 */
        const MmJob *Jp = &b->j[warp];
        const uint8_t *data = (const uint8_t *)__ldcg((const unsigned long long *)&Jp->w.data);
        const size_t rb = (size_t)__ldcg((const unsigned long long *)&Jp->w.row_bytes);
        const int64_t rows = (int64_t)__ldcg((const long long *)&Jp->w.rows), r0 = (int64_t)blockIdx.x * M * MM_R;
        const int nr = r0 >= rows ? 0 : rows - r0 < M * MM_R ? (int)(rows - r0) : M * MM_R;
        const uint8_t *base = data + (size_t)r0 * rb;
        for (size_t off = (size_t)lane * 128; off < (size_t)nr * rb; off += 32 * 128) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
#endif
        }
    }
    pdl_wait();
    extern __shared__ __align__(16) float hsh[];
    const MmJob &J = b->j[warp];
    float *h = hsh + (size_t)warp * I;
    for (int c = lane; c < I; c += 32) h[c] = gate_apply(ga.kind, ld_act(J.x + c), ld_act(J.x + ga.uoff + c), ga.p0, ga.p1);
    __syncwarp();
    MmJob Js = J;
    Js.x = h;
    const int64_t rows = J.w.rows;
    __shared__ float part[FUSED_MAX_K][MM_R];
    for (int m = 0; m < M; m++) {
        const int64_t r0 = ((int64_t)blockIdx.x * M + m) * MM_R;
        const int nr = r0 >= rows ? 0 : rows - r0 < MM_R ? (int)(rows - r0) : MM_R;
        float acc[MM_R][1];
        mm_warp<V, 1, U, 2>(Js, r0, nr, 0, 1, 0, 1, ga, acc);
#pragma unroll
        for (int i = 0; i < MM_R; i++) {
            const float sum = warp_sum(acc[i][0]);
            if (!lane) {
                part[warp][i] = sum;
                if (i < nr) J.y[r0 + i] = sum;
            }
        }
        __syncthreads();
        moe_comb(part, wr, K, nr, out + r0);
        __syncthreads();
    }
}

/* ---- round 9: rows streamed through cp.async into shared memory -------------------------------------------
 * The loads of a lane's 16-byte steps go global -> shared memory asynchronously (cp.async.cg: through L2 only,
 * no registers held while they fly), several stages ahead of the products; each lane copies exactly the steps it
 * then multiplies, so a lane waits only for its own copies (cp.async.wait_group: no block barrier; k_mm_cp's one
 * __syncwarp per stage orders the reads of a ring slot before its refill).
 * Each row is summed as a one-warp row of mm_warp sums it (wk = 1): lane l takes the row's 16-byte steps
 * l, l + 32, ... in order, decodes each (decode<V>) and chains fmaf over its elements in order, then warp_sum:
 * the bits of the launch with wk = 1, whatever the rows per warp or the jobs of the launch. */
static __device__ __forceinline__ void cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
#else
    *(uint4 *)dst = *(const uint4 *)src;
#endif
}
static __device__ __forceinline__ void cp_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
/* at most N of this thread's committed groups still pending */
template <int N> static __device__ __forceinline__ void cp_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
/* RT groups committed: group s (0-based) has landed (s a constant where the caller's loop is unrolled) */
template <int RT> static __device__ __forceinline__ void cp_wait_rt(int s) {
    switch (RT - 1 - s) {
    case 0: cp_wait<0>(); break;
    case 1: cp_wait<1>(); break;
    case 2: cp_wait<2>(); break;
    default: cp_wait<3>(); break; /* more pending than 3: waiting for those too is only early */
    }
}
/* the dense kernel's pipeline: CP_P steps of 16 bytes per lane per stage, CP_NS stages per warp (CP_NS - 1 of
 * them in flight while one is multiplied), CP_WARPS warps per block: 4 x 4 x 512 B x 4 = 32 KiB of shared memory
 * per block (under the 48 KiB a launch gets without opting in) */
#define CP_P 4
#define CP_NS 4
#define CP_WARPS 4
#define CP_SMEM ((size_t)CP_WARPS * CP_NS * CP_P * 32 * 16)
/* DELTAFIN_CUDA_LEAN bit 1024 (round 9): one-token products of spine weights (F32, F16, BF16 rows of the 16-byte
 * path). A warp takes J.wk consecutive rows of its job (here wk is the rows per warp, set by mm_flush_cp) and
 * streams their bytes as one sequence of steps (row by row, a row's steps 0 .. spr - 1, the last one partial
 * where a row is not a multiple of 32 steps: lanes past its end copy and add nothing). The first CP_NS - 1 stages
 * are copied before the wait for the kernel before (resident weights only: b.pf, as round 7's L2 prefetch). */
template <int V, int MJ>
__global__ void __launch_bounds__(CP_WARPS * 32) k_mm_cp(const __grid_constant__ MmBatchT<MJ> b) {
    extern __shared__ __align__(16) uint4 cp_ring[];
    pdl_go();
    int j = 0;
    while (j + 1 < b.nj && blockIdx.x >= b.j[j + 1].blk0) j++;
    const MmJob &J = b.j[j];
    const DW &w = J.w;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rpw = J.wk;
    const int64_t ra = ((int64_t)(blockIdx.x - J.blk0) * CP_WARPS + warp) * rpw;
    const int nrow = ra >= w.rows ? 0 : w.rows - ra < rpw ? (int)(w.rows - ra) : rpw;
    if (!nrow) return; /* an idle warp: no barrier in this kernel */
    constexpr int E = Fmt<V>::E, C = Fmt<V>::C;
    const int64_t upr = w.cols / E;               /* 16-byte steps of a row (vec_kind: cols % E == 0) */
    const int spr = (int)((upr + 31) / 32);       /* warp steps per row */
    const int64_t nst = (int64_t)nrow * spr;      /* warp steps of this warp */
    const size_t rb = w.row_bytes;
    const uint8_t *base = w.data + (size_t)ra * rb + (size_t)lane * 16;
    uint4 *ring = cp_ring + (size_t)warp * CP_NS * CP_P * 32 + lane;
    int64_t ig = 0, irow = 0;
    int iq = 0;
    /* copy the next CP_P steps into stage slot `slot`, one commit group (empty past the end: every lane commits
     * the same groups, so wait_group counts alike) */
    auto issue = [&](int slot) {
#pragma unroll
        for (int p = 0; p < CP_P; p++) {
            if (ig < nst) {
                if ((int64_t)iq * 32 + lane < upr) cp16(ring + (slot * CP_P + p) * 32, base + (size_t)irow * rb + (size_t)iq * 512);
                ig++;
                if (++iq == spr) iq = 0, irow++;
            }
        }
        cp_commit();
    };
    if (b.pf) {
        /* resident weights (no kernel writes them): the warp's rows asked of L2 and its first stages copied
         * before the wait, while the kernel before still runs */
        const uint8_t *wb = w.data + (size_t)ra * rb;
        for (size_t off = (size_t)(CP_NS - 1) * CP_P * 512 + (size_t)lane * 128; off < (size_t)nrow * rb; off += 32 * 128) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            asm volatile("prefetch.global.L2 [%0];" ::"l"(wb + off));
#endif
        }
    } else
        pdl_wait();
#pragma unroll
    for (int s = 0; s < CP_NS - 1; s++) issue(s);
    if (b.pf) pdl_wait();
    const float *x = J.x;
    float acc = 0.0f;
    int64_t cg = 0, crow = 0;
    int cq = 0;
    for (int s = 0; cg < nst; s = s + 1 == CP_NS ? 0 : s + 1) {
        /* refill the slot of the stage multiplied last time round; __syncwarp orders this lane's reads of it
         * before the asynchronous copies that overwrite it (PTX orders cp.async with nothing else by itself) */
        __syncwarp();
        issue(s == 0 ? CP_NS - 1 : s - 1);
        cp_wait<CP_NS - 1>(); /* this lane's copies of stage slot s have landed */
#pragma unroll
        for (int p = 0; p < CP_P; p++) {
            if (cg < nst) { /* warp-uniform */
                const int64_t v = (int64_t)cq * 32 + lane;
                if (v < upr) {
                    const uint4 u = ring[(s * CP_P + p) * 32];
#pragma unroll
                    for (int h = 0; h < E / C; h++) {
                        float wv[C], xv[C];
                        decode<V>(u, h, 1.0f, wv);
                        const float4 *xp = (const float4 *)(x + v * E + h * C);
#pragma unroll
                        for (int qq = 0; qq < C / 4; qq++) {
                            const float4 f = ld_act(xp + qq);
                            xv[4 * qq] = f.x, xv[4 * qq + 1] = f.y, xv[4 * qq + 2] = f.z, xv[4 * qq + 3] = f.w;
                        }
#pragma unroll
                        for (int k = 0; k < C; k++) acc = fmaf(wv[k], xv[k], acc);
                    }
                }
                cg++;
                if (++cq == spr) {
                    const float sum = warp_sum(acc);
                    if (!lane) J.y[ra + crow] = sum;
                    acc = 0.0f, cq = 0, crow++;
                }
            }
        }
    }
    cp_wait<0>();
}

/* The parts of the down launches of bits 2048 (k_moe_down_cp) and 8192 (k_moe_down_rt), shared so both run the same
 * operations. dn_copy: a warp's RT rows (SPR steps of 16 bytes a lane each) into its ring, one commit group per row.
 * dn_gate: gate(g, u) of the lane's own columns of x (g at x, u at x + ga.uoff), as k_gate writes it. dn_rows: row s
 * multiplied once its group has landed (a one-warp row: wk = 1), its sum into part[warp][s] and y[r0 + s]; then
 * out[r0 + t] = the block's rows combined by w in k order. */
template <int SPR, int RT>
__device__ __forceinline__ void dn_copy(uint4 *ring, const uint8_t *base, size_t rb, int nr, int64_t upr, int lane) {
#pragma unroll
    for (int s = 0; s < RT; s++) {
#pragma unroll
        for (int q = 0; q < SPR; q++)
            if (s < nr && (int64_t)q * 32 + lane < upr) cp16(ring + (s * SPR + q) * 32, base + (size_t)s * rb + (size_t)q * 512);
        cp_commit();
    }
}
template <int E, int SPR>
__device__ __forceinline__ void dn_gate(const float *x, const GateIn &ga, int64_t upr, int lane, float (&xg)[SPR][E]) {
#pragma unroll
    for (int q = 0; q < SPR; q++) {
        const int64_t v = (int64_t)q * 32 + lane;
        if (v < upr) {
            const float4 *gp = (const float4 *)(x + v * E), *up = (const float4 *)(x + ga.uoff + v * E);
#pragma unroll
            for (int qq = 0; qq < E / 4; qq++) {
                const float4 g = ld_act(gp + qq), u = ld_act(up + qq);
                xg[q][4 * qq] = gate_apply(ga.kind, g.x, u.x, ga.p0, ga.p1);
                xg[q][4 * qq + 1] = gate_apply(ga.kind, g.y, u.y, ga.p0, ga.p1);
                xg[q][4 * qq + 2] = gate_apply(ga.kind, g.z, u.z, ga.p0, ga.p1);
                xg[q][4 * qq + 3] = gate_apply(ga.kind, g.w, u.w, ga.p0, ga.p1);
            }
        } else {
#pragma unroll
            for (int e = 0; e < E; e++) xg[q][e] = 0.0f;
        }
    }
}
/* dn_gate's values already computed (round 17: k_guh_rt wrote h = gate(g, u)): the lane's own columns of h */
template <int E, int SPR, int CG = 0>
__device__ __forceinline__ void dn_load(const float *h, int64_t upr, int lane, float (&xg)[SPR][E]) {
#pragma unroll
    for (int q = 0; q < SPR; q++) {
        const int64_t v = (int64_t)q * 32 + lane;
        if (v < upr) {
            const float4 *hp = (const float4 *)(h + v * E);
#pragma unroll
            for (int qq = 0; qq < E / 4; qq++) {
                const float4 f = CG ? __ldcg(hp + qq) : __ldg(hp + qq);
                xg[q][4 * qq] = f.x, xg[q][4 * qq + 1] = f.y, xg[q][4 * qq + 2] = f.z, xg[q][4 * qq + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int e = 0; e < E; e++) xg[q][e] = 0.0f;
        }
    }
}
template <int V, int SPR, int RT>
__device__ __forceinline__ void dn_rows(const uint4 *ring, const float (&xg)[SPR][Fmt<V>::E], int64_t upr, int nr, int lane, int warp,
                                        float (*part)[RT], float *y, int64_t r0, int K, const float *w, float *out) {
    constexpr int E = Fmt<V>::E, C = Fmt<V>::C;
#pragma unroll
    for (int s = 0; s < RT; s++) {
        if (s < nr) { /* block-uniform: every expert's down projection has the same rows */
            cp_wait_rt<RT>(s); /* row s's group has landed */
            float acc = 0.0f;
#pragma unroll
            for (int q = 0; q < SPR; q++) {
                if ((int64_t)q * 32 + lane < upr) {
                    const uint4 u = ring[(s * SPR + q) * 32];
#pragma unroll
                    for (int h = 0; h < E / C; h++) {
                        float wv[C];
                        decode<V>(u, h, 1.0f, wv);
#pragma unroll
                        for (int k = 0; k < C; k++) acc = fmaf(wv[k], xg[q][h * C + k], acc);
                    }
                }
            }
            const float sum = warp_sum(acc);
            if (!lane) part[warp][s] = sum, y[r0 + s] = sum;
        }
    }
    cp_wait<0>();
    __syncthreads();
    moe_comb(part, w, K, nr, out + r0);
}

/* DELTAFIN_CUDA_LEAN bit 2048 (round 9): the device-routed MoE's gate + down + combine launch (k_moe_down's
 * contract: each expert's rows written to d with the bits of the host-routed down launch, wk = 1, and out = the
 * block's rows combined by the route's weights in k order, k_moe_down's arithmetic) with each warp's RT rows
 * copied by cp.async into shared memory at once, one commit group per row, before the wait for the gate/up
 * launch (the table and the resident experts are final then: see k_moe_down); after the wait each lane computes
 * gate(g, u) of its own columns once (the same value for every row: SPR x E floats in registers, gate_apply as
 * k_gate writes it) while the rows still fly, then multiplies row s as soon as its group has landed.
 * SPR: warp steps per row (I / E / 32 rounded up, at most 4); shared memory K x RT x SPR x 512 bytes. */
template <int V, int SPR, int RT>
__global__ void __launch_bounds__(FUSED_MAX_K * 32) k_moe_down_cp(const MmBatchT<MM_MAXJ> *b, int K, GateIn ga, const float *wr, float *out) {
    extern __shared__ __align__(16) uint4 dn_ring[];
    constexpr int E = Fmt<V>::E;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint4 *ring = dn_ring + (size_t)warp * RT * SPR * 32 + lane;
    pdl_go();
    const int64_t r0 = (int64_t)blockIdx.x * RT;
    int nr;
    int64_t upr;
    {
        const MmJob *Jp = &b->j[warp];
        const uint8_t *data = (const uint8_t *)__ldcg((const unsigned long long *)&Jp->w.data);
        const size_t rb = (size_t)__ldcg((const unsigned long long *)&Jp->w.row_bytes);
        const int64_t rows = (int64_t)__ldcg((const long long *)&Jp->w.rows), cols = (int64_t)__ldcg((const long long *)&Jp->w.cols);
        nr = r0 >= rows ? 0 : rows - r0 < RT ? (int)(rows - r0) : RT;
        upr = cols / E;
        const uint8_t *base = data + (size_t)r0 * rb + (size_t)lane * 16;
        dn_copy<SPR, RT>(ring, base, rb, nr, upr, lane);
    }
    pdl_wait();
    const MmJob &J = b->j[warp];
    float xg[SPR][E];
    dn_gate<E, SPR>(J.x, ga, upr, lane, xg);
    __shared__ float part[FUSED_MAX_K][RT];
    dn_rows<V, SPR, RT>(ring, xg, upr, nr, lane, warp, part, J.y, r0, K, wr, out);
}

/* A kernel's dynamic shared memory opted in once per kernel and size (whatever the size: the kernel's static
 * shared memory counts against the same 48 KiB default), and its preferred carveout set to the most shared memory
 * (round 9's kernels are bound by shared memory: k_mm_cp's 4 blocks of 32 KiB an SM need more than a smaller
 * carveout leaves; a refused carveout is only a hint lost). -1 (launch something else) where the opt-in is refused. */
static int smem_optin(const void *k, size_t bytes) {
    static const void *ks[64];
    static size_t got[64];
    static int nk;
    int i = 0;
    while (i < nk && ks[i] != k) i++;
    if (i < nk && got[i] >= bytes) return 0;
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess) cudaGetLastError();
    if (i == nk && nk < 64) nk++;
    if (i < 64) ks[i] = k, got[i] = bytes;
    return 0;
}

/* Warps per row group: as many as keep at least 8 16-byte steps per lane (long
 * rows: more blocks, and a lane's loop stays long enough to keep its loads in
 * flight; measured: splitting rows of 8 steps lost 10-15% on the MoE experts);
 * from the weight's own shape only. */
static int split_at(const DW &d, int vec, int64_t min_steps) {
    const int64_t E = vec == V_F32 ? 4 : vec == V_F16 || vec == V_BF16 ? 8 : vec == V_FP8 || vec == V_I8ROW ? 16 : vec == V_GENERIC ? 1 : 32;
    const int64_t steps = d.cols / E / 32;
    int wk = 1;
    while (wk < MM_WARPS && steps >= min_steps * wk) wk *= 2;
    return wk;
}
static int split_of(const DW &d, int vec) { return split_at(d, vec, 16); }
/* DELTAFIN_CUDA_LEAN bit 512 (round 8, on by default): the one-token products of spine weights (no expert
 * identity: q/k/v, o, the router, lm_head) split a row over warps while each keeps at least 8 16-byte steps per
 * lane instead of 16 (a 2048-column BF16 row over 2 warps, 4 steps each, all in flight at U = 4; twice the
 * blocks; the router's 128 rows in 8 blocks instead of 4). Each such row is then summed in another order: NOT
 * round 7's bits (within the conformance bounds; DELTAFIN_CUDA_LEAN=366 keeps round 7's products). Routed
 * experts keep split_of (the device-routed MoE's rows must equal the host-routed launches'). DELTAFIN_CUDA_MM_SPLIT1=S
 * (a measurement aid: 1, 2, 4, 8 or 16) sets the threshold for every one-token product, experts included. */
static int g_split1 = -1; /* the env's value, 0: unset */
static int split1(int expert) {
    if (g_split1 < 0) {
        const char *e = getenv("DELTAFIN_CUDA_MM_SPLIT1");
        const int v = e && *e ? atoi(e) : 0;
        g_split1 = v == 1 || v == 2 || v == 4 || v == 8 || v == 16 ? v : 0;
    }
    if (g_split1) return g_split1;
    return !expert && (lean_mask() & 512) ? 8 : 16;
}
extern "C" void df_cuda_set_split1(int s) { g_split1 = s == 1 || s == 2 || s == 4 || s == 8 || s == 16 ? s : 0; }

/* Which 16-byte decoder fits weight d read with activations x (V_GENERIC when none does). */
static int vec_kind(const DW &d, const float *x) {
    if (((uintptr_t)d.data & 15) || (d.row_bytes & 15) || ((uintptr_t)x & 15)) return V_GENERIC;
    const int64_t K = d.cols;
    switch (d.fmt) {
    case DF_W_F32: return K % 4 == 0 ? V_F32 : V_GENERIC;
    case DF_W_F16: return K % 8 == 0 ? V_F16 : V_GENERIC;
    case DF_W_BF16: return K % 8 == 0 ? V_BF16 : V_GENERIC;
    case DF_W_FP8: return K % 16 == 0 && d.blk_c % 16 == 0 ? V_FP8 : V_GENERIC;
    case DF_W_I8ROW: return K % 16 == 0 ? V_I8ROW : V_GENERIC;
    case DF_W_INT4: return K % 32 == 0 && d.blk_c % 32 == 0 && d.row_bytes == (size_t)K / 2 ? V_INT4 : V_GENERIC;
    case DF_W_MXFP4: return K % 32 == 0 && d.row_bytes == (size_t)K / 2 ? V_MXFP4 : V_GENERIC;
    default: return V_GENERIC;
    }
}

template <int NT, int WP, int MJ, int U = 1> static void mm_launch(const MmBatchT<MJ> &b, unsigned blocks) {
    const dim3 grid(blocks, (unsigned)((b.n + NT - 1) / NT)), th(WP * 32);
    switch (b.j[0].vec) {
    case V_F32: launch_k(k_mm<V_F32, NT, WP, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_F16: launch_k(k_mm<V_F16, NT, WP, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_BF16: launch_k(k_mm<V_BF16, NT, WP, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_FP8: launch_k(k_mm<V_FP8, NT, WP, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_INT4: launch_k(k_mm<V_INT4, NT, WP, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_I8ROW: launch_k(k_mm<V_I8ROW, NT, WP, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_MXFP4: launch_k(k_mm<V_MXFP4, NT, WP, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    default: launch_k(k_mm<V_GENERIC, NT, WP, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    }
}
/* DELTAFIN_CUDA_LEAN (a measurement aid): a mask of the decode-step savings: 1 the product launches below
 * (4-warp blocks, small job tables), 2 the one-launch split attention (cuda_ops.cu); 0: none, every launch as
 * before them; 4 (round 5) one-token products issue 2 or 4 steps of loads per lane before their products, and a
 * rmsnorm row gets a thread per 2 columns (cuda_ops.cu); 8 (round 6) the device-routed MoE's gate, down products
 * and combine in one launch (k_moe_down); 16 (round 6, opt-in) the split attention keeps more loads in flight
 * and its combine reads its parts in parallel (cuda_ops.cu). Default 14: bits 1 and 16 measured no gain on the
 * H200 (docs/PERFORMANCE.md, CUDA rounds 3 and 6: bit 16's kernel took 20.6 us against 18.8), so they stay
 * opt-in; DELTAFIN_CUDA_LEAN=6 restores round 5's kernels, 2 round 4's. Round 7: 32 programmatic dependent
 * launches (every kernel begins with pdl_entry; the one-token products of resident weights prefetch their rows
 * into L2 before they wait), 64 the register-resident route (k_route_soft), 128 (opt-in) the MoE down launch with
 * the gate once per block (k_moe_down_sh); 14 | 32 | 64 = 110 was round 7's default, DELTAFIN_CUDA_LEAN=14
 * restores round 6's launches. Round 8: 256 the fused row ops (cuda_ops.cu: add_rmsnorm, qk_norm_rope), 512 the
 * one-token spine products' rows over more warps (split1 below); default 878 = 110 | 256 | 512; DELTAFIN_CUDA_LEAN=110
 * restores round 7's launches and bits, 366 round 8 without bit 512. Round 9: 1024 (opt-in: 3.6% slower end to end
 * on the H200) the one-token spine products through the cp.async pipeline (k_mm_cp: the bits of a one-warp row, wk =
 * 1), 2048 (default: +4.9%) the MoE down launch with its rows streamed through cp.async (k_moe_down_cp: k_moe_down's
 * bits); 2926 = 878 | 2048 was round 9's default, DELTAFIN_CUDA_LEAN=878 restores round 8. Round 10 (the mask now
 * keeps 16 bits): 4096 one-token GQA decode attention in one launch over (chunk, KV head) blocks (cuda_ops.cu,
 * k_attn_dec: other sums than bits 2 / 16's launches; +5.6% end to end on the H200), 8192 the MoE route inside the
 * gate/up and down launches (k_gu_rt, k_moe_down_rt: the same bits; +1.3%); default 15214 = 2926 | 4096 | 8192
 * (+6.6%, docs/PERFORMANCE.md round 10) was round 10's default, DELTAFIN_CUDA_LEAN=2926 restores round 9. Round 11:
 * 16384 the one-token spine products in one balanced wave (k_mm_bal: k_mm's bits; alone 4.7% slower), 32768 (with
 * 16384) their first round of weight loads before griddepcontrol.wait (the same bits); default 64366 = 15214 |
 * 16384 | 32768 (+2.0% on the H200, the same ids), DELTAFIN_CUDA_LEAN=15214 restores round 10. Round 12 (the mask now
 * keeps 31 bits; opt-in, written without a device): FP8 E4M3 with block scales (DeepSeek-V3), 65536 the FP8 experts'
 * down launch k_moe_down_f8, 131072 the one-token FP8 products through k_mm_bal, 262144 the FP8 experts' gate/up launch
 * at 2 blocks an SM (k_mm_dev2); all three keep the default's bits. Measured on the H200 (DeepSeek-V3-shape FP8 model,
 * docs/PERFORMANCE.md round 12): 65536 +41.6%, 65536 | 262144 +43.0%, with 131072 too only +21.8% (its 8-warp rows are
 * slower); default 392046 = 64366 | 65536 | 262144, DELTAFIN_CUDA_LEAN=64366 restores round 11. Round 13: 524288 the
 * one-token FP8 products through k_mm_f8 (a warp per 4 whole rows: a one-warp row's bits), 1048576 the FP8 experts'
 * gate/up launch with its body (k_mm_devf8: k_mm_dev's bits for rows read by one warp); default 1964910 = 392046 |
 * 524288 | 1048576, DELTAFIN_CUDA_LEAN=392046 restores round 12. Round 14: 2097152 the k_mm_f8 launches whose
 * one-warp blocks fill at most half a wave with each row group's columns over 2 or 4 warps (their rows summed in
 * another order), 8388608 the FP8 MoE down launch with one scale product a 16-byte step (other sums), 16777216 that
 * launch without its combine, k_moe_combine after it (opt-in; the same bits); default 12450670 = 1964910 | 2097152 |
 * 8388608, DELTAFIN_CUDA_LEAN=1964910 restores round 13. Round 15 (the mask keeps 31 bits; 28 used): 33554432 the FP8 MoE down
 * launch as k_moe_down_c8 (a block per row group of every expert, each warp's rows whole in registers, the gate once
 * by k_gate before it: k_moe_down_f8's bits), 67108864 MLA's decode launches with kv_b's rows loaded before their wait
 * and the scores four heads at a time (cuda_ops.cu: the same bits), 134217728 the one-token BF16 products of at most
 * MM_SMALLJ jobs through k_mm_f8's body (with 524288; one-warp rows' sums); default 247331694 = 12450670 | 33554432 |
 * 67108864 | 134217728, DELTAFIN_CUDA_LEAN=12450670 restores round 14. Round 17: 268435456 the gate computed
 * once by the gate/up launch of the route-inside MoE (k_guh_rt, a block per 16 rows of an expert's gate AND up; the
 * down launch reads h = gate(g, u) through L2 only: the same bits; +2-5% end to end on the H200); default 515767150 =
 * 247331694 | 268435456 (round 18), DELTAFIN_CUDA_LEAN=247331694 restores round 15. Why L2 only (ld.global.cg): the
 * down launch is resident while k_guh_rt writes h (programmatic launch: k_guh_rt lets its dependents start at once),
 * and the read-only path (ld.global.nc, __ldg) is defined only for data that no one writes during the reading
 * kernel's lifetime; read that way, 5 of 6 end-to-end runs read other ids (round 18's A/B, docs/PERFORMANCE.md),
 * read through L2 none. Every bit but 512, 1024, 4096, 524288, 2097152, 8388608 and 134217728
 * gives the same bits of every result. df_cuda_set_lean(on) sets 511 (every bit but 512) or 0 (the test of
 * both paths); df_cuda_set_lean_mask sets any mask. */
#define LEAN_BITS 0x7fffffffu /* round 12: the mask keeps 31 bits (16 until round 11) */
#define LEAN_DEFAULT (14 | 32 | 64 | 256 | 512 | 2048 | 4096 | 8192 | 16384 | 32768 | 65536 | 262144 | 524288 | 1048576 | 2097152 | 8388608 | \
                      33554432 | 67108864 | 134217728 | 268435456) /* 515767150: round 18's (247331694 | 268435456) */
int g_lean = -1;
int lean_mask(void) {
    if (g_lean < 0) {
        const char *e = getenv("DELTAFIN_CUDA_LEAN");
        g_lean = e && *e ? (int)(strtoul(e, NULL, 10) & LEAN_BITS) : LEAN_DEFAULT;
    }
    return g_lean;
}
extern "C" int df_cuda_lean_default(void) { return LEAN_DEFAULT; }
extern "C" void df_cuda_set_lean(int on) { g_lean = on ? 511 : 0; }
extern "C" void df_cuda_set_lean_mask(int m) { g_lean = m < 0 ? -1 : (int)((unsigned)m & LEAN_BITS); }
/* bit 32 (round 7): programmatic dependent launches (launch_k); off for good once the launch API refuses one */
int64_t g_pdl_launches;
static int g_pdl_refused;
int pdl_on(void) { return (lean_mask() & 32) && !g_pdl_refused; }
void pdl_refused(cudaError_t e) {
    cudaGetLastError();
    if (!g_pdl_refused)
        fprintf(stderr, "deltafin: cuda backend: programmatic dependent launch refused (%s); kernels launch the plain way\n", cudaGetErrorString(e));
    g_pdl_refused = 1;
}
extern "C" int64_t df_cuda_pdl_launches(void) { return g_pdl_launches; }
static int64_t g_mm_narrow;
extern "C" int64_t df_cuda_mm_narrow_launches(void) { return g_mm_narrow; }
/* One token, few blocks (a dense product of decode: q/k/v, o, the router, lm_head): with 8-warp blocks they
 * fill fewer than two per SM and the SMs that get two set the time; 4-warp blocks (the same row groups, the
 * same split of each row over warps, so the same bits) spread them twice as finely. The job table shrinks
 * to MM_SMALLJ entries when the jobs fit. */
/* Round 9 (bit 1024): a launch of k_mm_cp. Rows per warp: the launch's rows over CP_WPSM warps per SM (at least
 * one), the same for every job (a row's bits do not depend on it). */
#define CP_WPSM 16
static int64_t g_mm_cp;
extern "C" int64_t df_cuda_mm_cp_launches(void) { return g_mm_cp; }
template <int MJ> static void mm_launch_cp(const MmBatchT<MJ> &b, unsigned blocks) {
    const dim3 grid(blocks, 1), th(CP_WARPS * 32);
    /* CP_SMEM is under the default limit: a refused opt-in changes nothing (the carveout is a hint) */
    switch (b.j[0].vec) {
    case V_F32: smem_optin((const void *)k_mm_cp<V_F32, MJ>, CP_SMEM), launch_k(k_mm_cp<V_F32, MJ>, dim3(grid), dim3(th), CP_SMEM, b); break;
    case V_F16: smem_optin((const void *)k_mm_cp<V_F16, MJ>, CP_SMEM), launch_k(k_mm_cp<V_F16, MJ>, dim3(grid), dim3(th), CP_SMEM, b); break;
    default: smem_optin((const void *)k_mm_cp<V_BF16, MJ>, CP_SMEM), launch_k(k_mm_cp<V_BF16, MJ>, dim3(grid), dim3(th), CP_SMEM, b); break;
    }
}
static void mm_flush_cp(MmBatch *b) {
    int64_t rows = 0;
    for (int i = 0; i < b->nj; i++) rows += b->j[i].w.rows;
    const int64_t target = (int64_t)sms() * CP_WPSM;
    int64_t rpw = (rows + target - 1) / target;
    if (rpw < 1) rpw = 1;
    if (rpw > (1 << 30)) rpw = 1 << 30;
    unsigned nb = 0;
    for (int i = 0; i < b->nj; i++) {
        const int64_t warps = (b->j[i].w.rows + rpw - 1) / rpw;
        b->j[i].wk = (int)rpw, b->j[i].blk0 = nb;
        nb += (unsigned)((warps + CP_WARPS - 1) / CP_WARPS);
    }
    if (b->nj <= MM_SMALLJ) {
        MmBatchT<MM_SMALLJ> s;
        memcpy(s.j, b->j, (size_t)b->nj * sizeof(MmJob));
        s.nj = b->nj, s.n = b->n, s.t0 = b->t0, s.pf = b->pf, s.cp = 1;
        mm_launch_cp<MM_SMALLJ>(s, nb);
    } else
        mm_launch_cp<MM_MAXJ>(*b, nb);
    g_mm_cp++;
}
/* ---- round 11 (DELTAFIN_CUDA_LEAN bit 16384): one-token products of spine rows in one balanced wave ----------
 * Why the default's dense launches (k_mm) sit far above their bytes' floor (docs/PERFORMANCE.md round 11): q/k/v
 * (5120 rows of 4 KB) is 320 blocks of 8 warps at 3 an SM, so 56 SMs hold 3 blocks (192 KB) and 76 hold 2 (128 KB):
 * the launch lasts as long as the SMs with 24% more bytes than the mean; lm_head (8192 rows) is 512 such blocks
 * against 396 slots: two waves; each warp there takes its 8 KB in two dependent rounds of 8 loads a lane; and
 * nothing but L2 prefetches runs before griddepcontrol.wait, so the first loads of weight bytes wait for the
 * kernel before. k_mm_bal instead: a grid of at most (SMs x blocks an SM by occupancy) blocks of 8 warps, ONE
 * wave; the work is cut into tasks of R whole rows (R = 2 for rows of fewer than 16 16-byte steps a lane, else 1:
 * 16 loads of 16 bytes a lane a round) dealt round-robin over the blocks (task t to block t % G, its warp (t / G)
 * % 8), so blocks differ by at most one task and every SM holds the same number of blocks; each lane issues a
 * round's 16 loads before any product; with resident weights (pf) the rows of a warp's tasks are asked of L2
 * before griddepcontrol.wait as k_mm's are, and with bit 32768 as well (pf = 2) the first round of a warp's first
 * task is loaded into registers BEFORE the wait instead (the weights are written by no kernel; x, written by the
 * kernel before, is read only after the wait), the rows of its later tasks still asked of L2. **The same bits as k_mm** for the same wk (the default's split of
 * the row, bit 512 or not): the warp takes all WK column parts of its rows itself, keeping one accumulator per
 * part (step j of a lane, column step 32 j + lane, goes to part j % WK, in increasing j: each part's fmaf chain is
 * the chain warp j % WK of k_mm's row group runs), then sums each part over the warp (warp_sum) and adds the
 * parts from 0.0f in part order, as mm_body adds its warps' partial sums. */
/* C floats of x at p (16-byte aligned) through L1 (ld_act), and acc[i] += the R rows' wv[i] . xv in column order
 * (the one-token kernels' inner step: k_mm_bal, k_mm_f8) */
template <int C> static __device__ __forceinline__ void ldx(const float *p, float (&xv)[C]) {
    const float4 *xp = (const float4 *)p;
#pragma unroll
    for (int qq = 0; qq < C / 4; qq++) {
        const float4 f = ld_act(xp + qq);
        xv[4 * qq] = f.x, xv[4 * qq + 1] = f.y, xv[4 * qq + 2] = f.z, xv[4 * qq + 3] = f.w;
    }
}
template <int R, int C> static __device__ __forceinline__ void fma_rows(const float (&wv)[R][C], const float (&xv)[C], float (&acc)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int c = 0; c < C; c++) acc[i] = fmaf(wv[i][c], xv[c], acc[i]);
}
#define BAL_WARPS 8
template <int V, int MJ, int WK, int R> struct BalTask {
    const MmJob *J;
    const uint4 *rows[R];
    int64_t r0, nv;
    int nr;
    int64_t srow[V == V_FP8 ? R : 1]; /* round 12, FP8: each row's first scale entry (its block row's), as mm_warp's */
    uint32_t vps;                     /* FP8: 16-byte steps per scale entry along a row */
};
/* steps a lane loads a round, for each of its R rows: 16 / R; round 12's FP8 rows with R > 1: 8 / R (16 / R spills at the
 * 128 registers of 2 blocks an SM with the scales beside the loads). A multiple of WK (mm_flush_bal: R = 4 with WK <= 2) */
template <int V, int R> struct BalS { static constexpr int S = V == V_FP8 && R > 1 ? 8 / R : 16 / R; };
/* Round 12: scale entry i of an FP8 weight, as scale_at reads it (the same float), F32 scales in one 4-byte load */
static __device__ __forceinline__ float scale_ld(const DW &w, int64_t i) {
    if (w.sdt == DF_SCALE_F32 && !((uintptr_t)w.scale & 3)) return __ldg((const float *)(const void *)w.scale + i);
    return scale_at(w, i);
}
template <int V, int MJ, int WK, int R> static __device__ __forceinline__ void bal_task(const MmBatchT<MJ> &b, unsigned t, BalTask<V, MJ, WK, R> &k) {
    int j = 0;
    while (j + 1 < b.nj && t >= b.j[j + 1].blk0) j++;
    k.J = &b.j[j];
    const DW &w = k.J->w;
    k.r0 = (int64_t)(t - k.J->blk0) * R;
    k.nr = w.rows - k.r0 < R ? (int)(w.rows - k.r0) : R;
    k.nv = w.cols / Fmt<V>::E;
#pragma unroll
    for (int i = 0; i < R; i++) k.rows[i] = (const uint4 *)(w.data + (size_t)(k.r0 + (i < k.nr ? i : 0)) * w.row_bytes);
    if (V == V_FP8) {
#pragma unroll
        for (int i = 0; i < (V == V_FP8 ? R : 1); i++) k.srow[i] = ((k.r0 + (i < k.nr ? i : 0)) / w.blk_r) * w.scale_cols;
        k.vps = (uint32_t)w.blk_c / 16;
    }
}
template <int V, int MJ, int WK, int R>
static __device__ __forceinline__ void bal_load(const BalTask<V, MJ, WK, R> &k, int64_t j0, uint4 (&u)[BalS<V, R>::S][R], float (&sc)[BalS<V, R>::S][R]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int q = 0; q < BalS<V, R>::S; q++) {
        const int64_t v = (j0 + q) * 32 + lane;
        if (v < k.nv)
#pragma unroll
            for (int i = 0; i < R; i++) {
                u[q][i] = __ldg(k.rows[i] + v);
                /* FP8: the step's scale, as mm_warp's (the row's block row, column step v / vps) */
                if (V == V_FP8) sc[q][i] = scale_ld(k.J->w, k.srow[V == V_FP8 ? i : 0] + (int64_t)((uint32_t)v / k.vps));
            }
    }
}
template <int V, int MJ, int WK, int R>
__global__ void __launch_bounds__(BAL_WARPS * 32, 2) k_mm_bal(const __grid_constant__ MmBatchT<MJ> b) {
    constexpr int E = Fmt<V>::E, C = Fmt<V>::C, S = BalS<V, R>::S;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned G = gridDim.x, T = b.j[b.nj - 1].blk0 + (unsigned)((b.j[b.nj - 1].w.rows + R - 1) / R);
    pdl_go();
    unsigned t = blockIdx.x + G * (unsigned)warp;
    uint4 u[S][R];
    float sc[S][R]; /* FP8: the scales of u (unused otherwise) */
    BalTask<V, MJ, WK, R> k;
    int have = 0;
    if (b.pf == 2 && t < T) { /* bit 32768: resident rows, written by no kernel: the first round is loaded before the wait */
        bal_task<V, MJ, WK, R>(b, t, k);
        bal_load<V, MJ, WK, R>(k, 0, u, sc);
        have = 1;
    }
    if (b.pf) /* as k_mm: the rows of the warp's tasks (bit 32768: of its later tasks) asked of L2 before the wait */
        for (unsigned tp = b.pf == 2 ? t + G * BAL_WARPS : t; tp < T; tp += G * BAL_WARPS) {
            BalTask<V, MJ, WK, R> kp;
            bal_task<V, MJ, WK, R>(b, tp, kp);
            const uint8_t *base = (const uint8_t *)kp.rows[0];
            const size_t bytes = (size_t)kp.nr * kp.J->w.row_bytes;
            for (size_t off = (size_t)lane * 128; off < bytes; off += 32 * 128) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
#endif
            }
        }
    pdl_wait();
    for (; t < T; t += G * BAL_WARPS) {
        if (!have) bal_task<V, MJ, WK, R>(b, t, k);
        const int64_t K = k.J->w.cols;
        const float *x = k.J->x + (int64_t)b.t0 * K;
        float acc[WK][R];
#pragma unroll
        for (int p = 0; p < WK; p++)
#pragma unroll
            for (int i = 0; i < R; i++) acc[p][i] = 0.0f;
        for (int64_t j0 = 0; j0 * 32 < k.nv; j0 += S) {
            if (!have) bal_load<V, MJ, WK, R>(k, j0, u, sc);
            have = 0;
#pragma unroll
            for (int q = 0; q < S; q++) {
                const int64_t v = (j0 + q) * 32 + lane;
                if (v >= k.nv) break;
                const int64_t c0 = v * E;
#pragma unroll
                for (int h = 0; h < E / C; h++) {
                    float wv[R][C];
#pragma unroll
                    for (int i = 0; i < R; i++) decode<V>(u[q][i], h, V == V_FP8 ? sc[q][i] : 1.0f, wv[i]);
                    float xv[C];
                    ldx<C>(x + c0 + h * C, xv);
                    fma_rows<R, C>(wv, xv, acc[q % WK]);
                }
            }
        }
        float *y = k.J->y + (int64_t)b.t0 * k.J->w.rows + k.r0;
#pragma unroll
        for (int i = 0; i < R; i++) {
            float s;
            if (WK == 1)
                s = warp_sum(acc[0][i]);
            else {
                s = 0.0f;
#pragma unroll
                for (int p = 0; p < WK; p++) s += warp_sum(acc[p][i]);
            }
            if (!lane && i < k.nr) y[i] = s;
        }
    }
}
/* blocks an SM of one k_mm_bal instance (the occupancy API, asked once per instance; 2 if it fails) */
template <int V, int WK, int R> static int bal_occ(void) {
    static int occ;
    if (!occ) {
        int v = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k_mm_bal<V, MM_SMALLJ, WK, R>, BAL_WARPS * 32, 0) != cudaSuccess || v <= 0) cudaGetLastError(), v = 2;
        occ = v;
    }
    return occ;
}
template <int V, int WK, int R> static void bal_go(MmBatchT<MM_SMALLJ> &s, unsigned T) {
    const uint64_t cap = (uint64_t)sms() * (uint64_t)bal_occ<V, WK, R>();
    const unsigned G = (uint64_t)T < cap ? T : (unsigned)cap;
    launch_k(k_mm_bal<V, MM_SMALLJ, WK, R>, dim3(G), dim3(BAL_WARPS * 32), 0, s);
}
template <int V, int WK> static void bal_go_r(MmBatchT<MM_SMALLJ> &s, unsigned T, int R) {
    if constexpr (V == V_FP8 && WK <= 2) { /* round 12: FP8 rows of at most 4 steps a lane (q_b: 3) */
        if (R == 4) {
            bal_go<V, WK, 4>(s, T);
            return;
        }
    }
    R == 1 ? bal_go<V, WK, 1>(s, T) : bal_go<V, WK, 2>(s, T);
}
template <int V> static void bal_go_wk(MmBatchT<MM_SMALLJ> &s, unsigned T, int R, int wk) {
    if constexpr (V == V_FP8) { /* round 12: FP8 rows split over 8 warps by k_mm (o: 16384 columns, 32 steps a lane): R = 1 */
        if (wk == 8) {
            bal_go<V, 8, 1>(s, T);
            return;
        }
    }
    wk == 1 ? bal_go_r<V, 1>(s, T, R) : wk == 2 ? bal_go_r<V, 2>(s, T, R) : bal_go_r<V, 4>(s, T, R);
}
static int64_t g_mm_bal;
extern "C" int64_t df_cuda_mm_bal_launches(void) { return g_mm_bal; }

/* ---- round 13 (DELTAFIN_CUDA_LEAN bit 524288): one-token FP8 products, a warp per 4 whole rows -----------------------
 * Why: under ncu (2026-12-02, the DeepSeek-V3-shape FP8 model) the dense FP8 one-token products took ~730 us a token
 * for ~1.2 GB (o 61.5 us for 117 MB, the dense FFN's gate/up 113 us for 264 MB), while bench/cuda/fp8_gemv.cu's plain
 * kernel (a warp per 4 rows reading them whole, 2 steps of 16 bytes a row in flight, the same decode: variant A) read
 * the same shapes at 67-72% of the HBM floor (o 37.4 us, gate 43.0 us). k_mm splits such rows over wk warps of a
 * block (bit 512: o's 16384 columns over 8 warps of 4 steps a lane: short-lived warps, 4.5 waves of blocks, a shared-
 * memory sum a row group), keeps its FP8 body at 80 registers with spills, and reads every scale with scale_at's byte
 * loads. Here a warp takes MM_R = 4 rows whole with one accumulator a row: **the bits of a one-warp row** (k_mm's for
 * wk 1: fewer than 8 steps a lane with bit 512, e.g. q_b, the shared expert's down; other rows are summed in another
 * order than the default's, within the conformance bounds, as bit 512 did to round 7's). Measured on the way
 * (fp8_gemv.cu's variant F, this body on plain arguments): the L2 prefetch and the decode order change nothing, a bound
 * of 3 blocks an SM (80 registers) costs 20% on o, and a branch per scale load (the scale's dtype decided per load, 96
 * LDGs in the SASS) kept the loads from issuing together: SF = 1 (F32 scales, the 4 rows in one block row, blk_c / 16 a
 * power of two: DeepSeek-V3's 128 x 128) reads one scale a step with a plain load; SF = 0 reads each row's with
 * scale_at. Resident rows: the first 2 KB of each asked of L2 before griddepcontrol.wait (whole rows, 117 MB for o with
 * every block resident at once, evicted the first lines before they were read: o 67.6 us). */
/* PF: the caller passed pdl_go only (the job table is a kernel parameter: resident rows may be asked of L2, then the
 * wait); 0: the caller waited already (a table in device memory, written by the kernel before) */
/* KS (bit 2097152, round 14): the columns of each warp's 4 rows split over KS warps of the block (part p takes the
 * 32-step chunks p, p + KS, ...: 512 bytes of each row a step, coalesced), each part one accumulator a row, the parts'
 * warp sums added in part order through shared memory (KS = 1: none of this, the one-warp row). For launches whose
 * one-warp blocks fill at most a quarter or half of one wave (DeepSeek-V3's q_a + kv_a: 66 blocks, the shared
 * expert's gate/up: 128, against 264 slots), so that every SM streams. */
/* V (round 15, bit 134217728): V_BF16 rows through the same body (no scales: decode<V_BF16>, one-warp rows' bits) */
template <int SF, int U, int MJ, int PF, int KS = 1, int V = V_FP8> static __device__ __forceinline__ void f8_body(const MmBatchT<MJ> &b) {
    constexpr int E = Fmt<V>::E, C = Fmt<V>::C, GW = MM_WARPS / KS; /* row groups (of MM_R rows) a block */
    int j = 0;
    while (j + 1 < b.nj && blockIdx.x >= b.j[j + 1].blk0) j++;
    const MmJob &J = b.j[j];
    const DW &w = J.w;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = warp / KS, p = warp % KS;
    const int64_t r0 = ((int64_t)(blockIdx.x - J.blk0) * GW + g) * MM_R;
    const int nr = r0 >= w.rows ? 0 : w.rows - r0 < MM_R ? (int)(w.rows - r0) : MM_R;
    if (KS == 1 && !nr) return;
    if (PF && b.pf && nr) { /* resident rows (written by no kernel): the first 2 KB of each asked of L2 while the kernel before runs */
        const size_t pb = w.row_bytes < 2048 ? w.row_bytes : 2048;
        for (int i = 0; i < nr; i++)
            for (size_t off = (size_t)lane * 128; off < pb; off += 32 * 128) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                if (KS == 1 || (int)(off / 512) % KS == p) asm volatile("prefetch.global.L2 [%0];" ::"l"(w.data + (size_t)(r0 + i) * w.row_bytes + off));
#endif
            }
    }
    const uint4 *rows[MM_R];
    int64_t srow[SF ? 1 : MM_R];
#pragma unroll
    for (int i = 0; i < MM_R; i++) {
        const int64_t ri = r0 + (i < nr ? i : 0);
        rows[i] = (const uint4 *)(w.data + (size_t)ri * w.row_bytes);
        if (V == V_FP8 && (!SF || !i)) srow[SF ? 0 : i] = (ri / w.blk_r) * w.scale_cols;
    }
    const float *sf = V == V_FP8 ? (const float *)(const void *)w.scale + (SF ? srow[0] : 0) : NULL; /* SF: the group's scale row */
    const uint32_t vps = V == V_FP8 ? (uint32_t)w.blk_c / 16 : 1, nv = (uint32_t)(w.cols / E); /* rows are < 2^32 steps */
    const int vsh = SF ? __ffs(vps) - 1 : 0;
    if (PF) pdl_wait();
    const float *x = J.x + (int64_t)b.t0 * w.cols;
    float acc[MM_R];
#pragma unroll
    for (int i = 0; i < MM_R; i++) acc[i] = 0.0f;
    for (uint32_t v0 = lane + 32 * p; v0 < (nr ? nv : 0); v0 += 32 * KS * U) {
        uint4 u[U][MM_R];
        float sc[U][SF ? 1 : MM_R];
#pragma unroll
        for (int q = 0; q < U; q++) {
            const uint32_t v = v0 + 32 * KS * q;
            if (v < nv) {
#pragma unroll
                for (int i = 0; i < MM_R; i++) u[q][i] = __ldg(rows[i] + v);
                if (V != V_FP8) {
                } else if (SF) sc[q][0] = __ldg(sf + (v >> vsh));
                else
#pragma unroll
                    for (int i = 0; i < MM_R; i++) sc[q][SF ? 0 : i] = scale_at(w, srow[SF ? 0 : i] + (int64_t)(v / vps));
            }
        }
#pragma unroll
        for (int q = 0; q < U; q++) {
            const uint32_t v = v0 + 32 * KS * q;
            if (v >= nv) break;
#pragma unroll
            for (int h = 0; h < E / C; h++) {
                float wv[MM_R][C];
#pragma unroll
                for (int i = 0; i < MM_R; i++) decode<V>(u[q][i], h, V == V_FP8 ? sc[q][SF ? 0 : i] : 1.0f, wv[i]);
                float xv[C];
                ldx<C>(x + (size_t)v * E + h * C, xv);
                fma_rows<MM_R, C>(wv, xv, acc);
            }
        }
    }
    float *y = J.y + (int64_t)b.t0 * w.rows + r0;
    if constexpr (KS == 1) {
#pragma unroll
        for (int i = 0; i < MM_R; i++) {
            const float s = warp_sum(acc[i]);
            if (!lane && i < nr) y[i] = s;
        }
    } else {
        __shared__ float ps[MM_WARPS][MM_R];
#pragma unroll
        for (int i = 0; i < MM_R; i++) {
            const float s = warp_sum(acc[i]);
            if (!lane) ps[warp][i] = s;
        }
        __syncthreads();
        if (!p && lane < nr) {
            float s = ps[warp][lane];
#pragma unroll
            for (int k = 1; k < KS; k++) s += ps[warp + k][lane];
            y[lane] = s;
        }
    }
}
template <int SF, int U, int KS, int V = V_FP8>
__global__ void __launch_bounds__(MM_WARPS * 32, 2) k_mm_f8(const __grid_constant__ MmBatchT<MM_SMALLJ> b) {
    pdl_go();
    f8_body<SF, U, MM_SMALLJ, 1, KS, V>(b);
}
/* Round 13 (bit 1048576): the FP8 experts' gate/up launch of the device-routed MoE with this body, its job table written
 * by the route kernel (k_mm_dev's layout for rows read by one warp: 32 rows a block, so the same table): the rows of a
 * one-warp row, k_mm_dev's bits for wk 1 */
template <int SF, int U>
__global__ void __launch_bounds__(MM_WARPS * 32, 2) k_mm_devf8(const MmBatchT<MM_MAXJ> *b) {
    pdl_wait(), pdl_go();
    f8_body<SF, U, MM_MAXJ, 0>(*b);
}
static int64_t g_mm_f8, g_mm_f8s, g_mm_f8b;
extern "C" int64_t df_cuda_mm_f8_launches(void) { return g_mm_f8; }
extern "C" int64_t df_cuda_mm_f8_bf16_launches(void) { return g_mm_f8b; }
extern "C" int64_t df_cuda_mm_f8_split_launches(void) { return g_mm_f8s; }
/* 1: the one-token FP8 launch went through k_mm_f8 (bit 524288; at most MM_SMALLJ jobs: the launch takes SF = 1 when every
 * job's scales allow it); 0: not taken */
/* The parts KS a row group that k_mm_f8 takes for this batch of one token (mm_flush_f8), 0 where the batch does not go
 * through it. Its rows' bits are k_mm's with wk = KS (the same decode, fmaf chain and lane steps; the KS parts' sums
 * added from the first part's, not from 0: the same but for the sign of an all-zero sum). */
static int f8_ks(const MmBatch *b) {
    /* round 15 (bit 134217728): BF16 rows of the 16-byte path through the same body, 4 steps of a lane's rows a round */
    const int bf = b->j[0].vec == V_BF16 && (lean_mask() & 134217728);
    if (b->nj > MM_SMALLJ || (b->j[0].vec != V_FP8 && !bf) || !(lean_mask() & 524288)) return 0;
    for (int i = 0; i < b->nj; i++)
        if ((uint64_t)b->j[i].w.rows > 0x3fffffffu || b->j[i].vec != b->j[0].vec) return 0;
    /* bit 2097152: KS parts a row group where the one-warp blocks fill at most half the slots of one wave (2 blocks an SM),
     * the largest power of two (<= 4) that keeps the launch in one wave, and at least 2 steps a lane in each part */
    int ks = 1;
    if (lean_mask() & 2097152) {
        uint64_t nb1 = 0, minv = UINT64_MAX;
        for (int i = 0; i < b->nj; i++) {
            nb1 += (uint64_t)((b->j[i].w.rows + MM_WARPS * MM_R - 1) / (MM_WARPS * MM_R));
            const uint64_t v = (uint64_t)(b->j[i].w.cols / (bf ? 8 : 16));
            minv = v < minv ? v : minv;
        }
        while (ks < 4 && nb1 * 2 * ks <= 2 * (uint64_t)sms() && minv >= (uint64_t)64 * 2 * ks) ks *= 2;
    }
    return ks;
}
static int mm_flush_f8(MmBatch *b) {
    const int bf = b->j[0].vec == V_BF16;
    const int ks = b->n == 1 ? f8_ks(b) : 0;
    if (!ks) return 0;
    int sf = 1;
    for (int i = 0; i < b->nj; i++) {
        const DW &d = b->j[i].w;
        const uint32_t vps = (uint32_t)d.blk_c / 16;
        if (bf) continue;
        if (d.sdt != DF_SCALE_F32 || ((uintptr_t)d.scale & 3) || d.blk_r % MM_R || !vps || (vps & (vps - 1))) sf = 0;
    }
    MmBatchT<MM_SMALLJ> s;
    memcpy(s.j, b->j, (size_t)b->nj * sizeof(MmJob));
    s.nj = b->nj, s.n = 1, s.t0 = b->t0, s.pf = b->pf, s.cp = 0;
    unsigned nb = 0;
    for (int i = 0; i < s.nj; i++) {
        s.j[i].blk0 = nb;
        nb += (unsigned)((s.j[i].w.rows + MM_WARPS / ks * MM_R - 1) / (MM_WARPS / ks * MM_R));
    }
#define F8_LAUNCH(SFV, KSV) launch_k(k_mm_f8<SFV, 2, KSV>, dim3(nb), dim3(MM_WARPS * 32), 0, s)
#define BF_LAUNCH(KSV) launch_k(k_mm_f8<0, 4, KSV, V_BF16>, dim3(nb), dim3(MM_WARPS * 32), 0, s)
    if (bf) { if (ks == 4) BF_LAUNCH(4); else if (ks == 2) BF_LAUNCH(2); else BF_LAUNCH(1); }
    else if (sf) { if (ks == 4) F8_LAUNCH(1, 4); else if (ks == 2) F8_LAUNCH(1, 2); else F8_LAUNCH(1, 1); }
    else { if (ks == 4) F8_LAUNCH(0, 4); else if (ks == 2) F8_LAUNCH(0, 2); else F8_LAUNCH(0, 1); }
#undef F8_LAUNCH
#undef BF_LAUNCH
    if (bf) g_mm_f8b++;
    else g_mm_f8++;
    if (ks > 1 && !bf) g_mm_f8s++;
    return 1;
}
/* 1: the launch went through k_mm_bal (bit 16384, bit 32768 its loads before the wait; F32 / F16 / BF16 rows of the 16-byte path, at most MM_SMALLJ
 * jobs of one wk in 1, 2, 4); 0: not taken, the caller launches k_mm as before */
static int mm_flush_bal(MmBatch *b) {
    if (b->n != 1 || b->nj > MM_SMALLJ) return 0;
    const int vec = b->j[0].vec, wk = b->j[0].wk;
    /* round 12 (bit 131072): FP8 rows (128 x 128 scale blocks or any FP8 of the 16-byte path), with or without bit 16384 */
    const int f8 = vec == V_FP8 && (lean_mask() & 131072);
    if (!f8 && (!(lean_mask() & 16384) || (vec != V_F32 && vec != V_F16 && vec != V_BF16))) return 0;
    if (wk != 1 && wk != 2 && wk != 4 && !(f8 && wk == 8)) return 0; /* FP8: wk 8 too (rows of at least 32 steps a lane: R = 1) */
    for (int i = 1; i < b->nj; i++)
        if (b->j[i].wk != wk) return 0;
    /* R from the first job's steps a lane (every job's rows: any R gives the same bits) */
    const int64_t E = vec == V_F32 ? 4 : vec == V_FP8 ? 16 : 8, spl = (b->j[0].w.cols / E + 31) / 32;
    /* FP8: R = 4 where a lane has at most 4 steps a row (q_b's 1536 columns: 3; then wk is 1), 2 steps of 4 rows a round */
    const int R = wk == 8 ? 1 : f8 && spl <= 4 && wk <= 2 ? 4 : spl >= 16 ? 1 : 2;
    MmBatchT<MM_SMALLJ> s;
    memcpy(s.j, b->j, (size_t)b->nj * sizeof(MmJob));
    s.nj = b->nj, s.n = 1, s.t0 = b->t0, s.pf = b->pf ? (lean_mask() & 32768 ? 2 : 1) : 0, s.cp = 0;
    uint64_t T = 0;
    for (int i = 0; i < s.nj; i++) {
        s.j[i].blk0 = (unsigned)T;
        T += (uint64_t)((s.j[i].w.rows + R - 1) / R);
    }
    if (T == 0 || T > 0x7fffffffu) return 0;
    if (vec == V_F32) bal_go_wk<V_F32>(s, (unsigned)T, R, wk);
    else if (vec == V_FP8) bal_go_wk<V_FP8>(s, (unsigned)T, R, wk);
    else if (vec == V_F16) bal_go_wk<V_F16>(s, (unsigned)T, R, wk);
    else bal_go_wk<V_BF16>(s, (unsigned)T, R, wk);
    g_mm_bal++;
    return 1;
}
static void mm_flush_one(MmBatch *b, unsigned blocks) {
    if (b->cp) {
        mm_flush_cp(b);
        return;
    }
    if (mm_flush_f8(b) || mm_flush_bal(b)) return;
    const int lean = lean_mask() & 1;
    int narrow = 0;
    if (lean && (uint64_t)blocks < 2 * (uint64_t)sms()) {
        narrow = 1;
        for (int i = 0; i < b->nj; i++)
            if (b->j[i].wk > MM_WARPS / 2) narrow = 0;
    }
    if (narrow) {
        unsigned nb = 0;
        for (int i = 0; i < b->nj; i++) {
            const int per_block = MM_WARPS / 2 / b->j[i].wk * MM_R;
            b->j[i].blk0 = nb;
            nb += (unsigned)((b->j[i].w.rows + per_block - 1) / per_block);
        }
        blocks = nb;
        g_mm_narrow++;
    }
    /* U: 1 (round 4), else deep_u of the 8-warp blocks' count (a narrow launch has twice the blocks, half the size) */
    const int U = lean_mask() & 4 ? deep_u(narrow ? (blocks + 1) / 2 : blocks) : 1;
    if (lean && b->nj <= MM_SMALLJ) {
        MmBatchT<MM_SMALLJ> s;
        memcpy(s.j, b->j, (size_t)b->nj * sizeof(MmJob));
        s.nj = b->nj, s.n = b->n, s.t0 = b->t0, s.pf = b->pf, s.cp = 0;
        if (narrow) U == 4 ? mm_launch<1, MM_WARPS / 2, MM_SMALLJ, 4>(s, blocks) : U == 2 ? mm_launch<1, MM_WARPS / 2, MM_SMALLJ, 2>(s, blocks) : mm_launch<1, MM_WARPS / 2, MM_SMALLJ>(s, blocks);
        else U == 4 ? mm_launch<1, MM_WARPS, MM_SMALLJ, 4>(s, blocks) : U == 2 ? mm_launch<1, MM_WARPS, MM_SMALLJ, 2>(s, blocks) : mm_launch<1, MM_WARPS, MM_SMALLJ>(s, blocks);
    } else if (narrow) U == 4 ? mm_launch<1, MM_WARPS / 2, MM_MAXJ, 4>(*b, blocks) : U == 2 ? mm_launch<1, MM_WARPS / 2, MM_MAXJ, 2>(*b, blocks) : mm_launch<1, MM_WARPS / 2, MM_MAXJ>(*b, blocks);
    else U == 4 ? mm_launch<1, MM_WARPS, MM_MAXJ, 4>(*b, blocks) : U == 2 ? mm_launch<1, MM_WARPS, MM_MAXJ, 2>(*b, blocks) : mm_launch<1, MM_WARPS, MM_MAXJ>(*b, blocks);
}
static void mm_flush(MmBatch *b, unsigned blocks, int n) {
    if (!b->nj) return;
    if (n != 1 || !pdl_on()) b->pf = 0;
    if (g_exact && n > 1) {
        /* exact products: this batch's one-token launch emulated (the jobs hold the one-token split; the batch is the
         * one a one-token call groups). Through k_mm_f8 with KS = 1: k_mm with wk 1, the n tokens in one launch;
         * KS > 1 (its parts' sums start from the first part's): one-token launches, a token at a time. */
        const int ks = f8_ks(b);
        if (ks > 1) {
            MmBatch one = *b;
            for (int t = 0; t < n; t++) {
                for (int i = 0; i < b->nj; i++)
                    one.j[i].x = b->j[i].x + (int64_t)t * b->j[i].w.cols, one.j[i].y = b->j[i].y + (int64_t)t * b->j[i].w.rows;
                one.n = 1, one.t0 = 0, one.pf = 0;
                mm_flush_one(&one, blocks);
                post("matmul_batch");
                g_mm_launches++;
            }
            b->nj = 0, b->pf = 1;
            return;
        }
        if (ks == 1) {
            blocks = 0;
            for (int i = 0; i < b->nj; i++) {
                b->j[i].wk = 1, b->j[i].blk0 = blocks;
                blocks += (unsigned)((b->j[i].w.rows + MM_WARPS * MM_R - 1) / (MM_WARPS * MM_R));
            }
        }
    }
    const int per = 65535 * MM_TN;
    for (int t0 = 0; t0 < n; t0 += per) {
        b->t0 = t0;
        b->n = n - t0 < per ? n - t0 : per;
        if (b->n == 1) mm_flush_one(b, blocks);
        else if (b->n == 2) mm_launch<2, MM_WARPS, MM_MAXJ>(*b, blocks);
        else if (b->n <= 4) mm_launch<4, MM_WARPS, MM_MAXJ>(*b, blocks);
        else mm_launch<MM_TN, MM_WARPS, MM_MAXJ>(*b, blocks);
        post("matmul_batch");
        g_mm_launches++;
    }
    b->nj = 0, b->pf = 1;
}

/* ---- prefill: exact f32 slab + SGEMM, or split-bf16 on tensor cores ---------------------- */
__global__ void k_dequant(DW w, int64_t r0, int64_t nr, float *out) { pdl_entry();
    const size_t N = (size_t)nr * w.cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x)
        out[i] = wget(w, r0 + (int64_t)(i / w.cols), (int64_t)(i % w.cols));
}
/* v = p0 + p1 + p2 + e in bf16 pieces: p0 = bf16(v), p1 = bf16(v - p0), p2 = bf16(v - p0 - p1)
 * (each difference is exact in f32); |e| <= 2^-24 |v| about: f32's own precision.
 * p[1], p[2] NULL: only p0 (a value that is a bf16 already). */
static __device__ __forceinline__ void split3(float v, size_t i, __nv_bfloat16 *const *p) {
    const __nv_bfloat16 a = __float2bfloat16_rn(v);
    p[0][i] = a;
    if (!p[1]) return;
    const float r1 = v - __bfloat162float(a);
    const __nv_bfloat16 b = __float2bfloat16_rn(r1);
    p[1][i] = b;
    p[2][i] = __float2bfloat16_rn(r1 - __bfloat162float(b));
}
struct Pieces { __nv_bfloat16 *p[3]; };
__global__ void k_dequant_split(DW w, int64_t r0, int64_t nr, Pieces o) { pdl_entry();
    const size_t N = (size_t)nr * w.cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x)
        split3(wget(w, r0 + (int64_t)(i / w.cols), (int64_t)(i % w.cols)), i, o.p);
}
__global__ void k_split(const float *x, size_t N, Pieces o) { pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) split3(x[i], i, o.p);
}

/* ---- split-f16 (the default split form since prefill round 2; DELTAFIN_CUDA_SPLIT_FORM=bf16: the form above) ----
 * X and a row chunk of W are scaled by powers of two, 2^ex for all of X and 2^ew for the chunk, so that their largest
 * magnitudes lie in [2^14, 2^15) (for FP8, the bound 448 max|scale| of the chunk: no pass over W): inside f16's range,
 * every element within 2^28 of the largest a normal f16. v = h0 + h1 + e with h0 = f16(v), h1 = f16(v - h0) (the
 * difference exact in f32): 22 significant bits, |e| <= 2^-22 |v| about. Where a format's values are f16s once
 * scaled (F16, BF16, MXFP4: <= 11 significant bits), W = W0.
 * Y = 2^-(ex+ew) (W0 x1 [+ W1 x0] + W0 x0) in ONE f16 GEMM with f32 accumulation over the pieces laid along K:
 * x' = [x1 | x0] against W' = [W0 | W0], or x' = [x1 | x0 | x0] against W' = [W0 | W1 | W0] (the split-bf16 form: 3
 * or 6 GEMMs of K, each reading and writing Y). The small terms come first in K: the tensor cores' accumulation error
 * grows with the sum it adds to (measured: the big terms first erred 4x more at K 7168; prefill round 3 measured two
 * GEMMs without the repeated pieces, small terms then the big one added with beta 1: slower on every shape but one).
 * The factor 2^-(ex+ew) is the GEMM's alpha, written by the weight's split kernel into device memory (no host wait).
 * Jobs of one matmul_batch call with the same x (gate and up, q/k/v) split it once (g_xs). Left out: W1 x1 (2^-22
 * |W||x|) and each piece's rounding (2^-22): a few times f32's own 2^-24 per term (docs/PERFORMANCE.md: the measured
 * error). A token row whose largest magnitude is 2^k below X's largest keeps 22 bits for k <= 18 or so; an infinite
 * element makes the scale 1 (the product is not finite anyway); maxima beyond 2^+-100 can over- or underflow alpha
 * where f32 would not. */
#define SF_TH 256 /* threads of the split kernels */
#define SF_U 4     /* prefill round 3: loads of a thread the split kernels issue before using them (16 B each: a
                    * thread's one 16-byte load at a time left the passes at 1.5-3 TB/s) */
/* the block's largest value, then one atomicMax (non-negative floats order as their bits) */
static __device__ __forceinline__ void absmax_to(float m, unsigned *out) {
    __shared__ float part[SF_TH / 32];
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < SF_TH / 32 ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (threadIdx.x == 0 && m > 0.0f) atomicMax(out, __float_as_uint(m));
    }
}
/* the power of two that puts a largest magnitude (its bits) in [2^14, 2^15), as a float (its exponent in [-126, 127]);
 * 1 for 0, inf and NaN */
static __device__ __forceinline__ int f16_shift(unsigned mb) {
    const float m = __uint_as_float(mb);
    if (!(m > 0.0f) || isinf(m)) return 0;
    int e;
    frexpf(m, &e);
    e = 15 - e;
    return e > 127 ? 127 : e < -126 ? -126 : e;
}
static __device__ __forceinline__ void split16(float v, __half &h0, __half &h1) {
    h0 = __float2half_rn(v), h1 = __float2half_rn(v - __half2float(h0));
}
/* V4: X 16-byte aligned and N a multiple of 4 */
template <int V4> __global__ void __launch_bounds__(SF_TH) k_absmax_x(const float *x, size_t N, unsigned *out) { pdl_entry();
    float m = 0.0f;
    const size_t st = (size_t)gridDim.x * SF_TH;
    if (V4) /* SF_U loads of a thread in flight */
        for (size_t i = blockIdx.x * (size_t)SF_TH + threadIdx.x; i < N / 4; i += SF_U * st) {
            float4 v[SF_U];
#pragma unroll
            for (int u = 0; u < SF_U; u++) v[u] = i + u * st < N / 4 ? ld_act((const float4 *)x + i + u * st) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int u = 0; u < SF_U; u++) m = fmaxf(m, fmaxf(fmaxf(fabsf(v[u].x), fabsf(v[u].y)), fmaxf(fabsf(v[u].z), fabsf(v[u].w))));
        }
    else
        for (size_t i = blockIdx.x * (size_t)SF_TH + threadIdx.x; i < N; i += st) m = fmaxf(m, fabsf(x[i]));
    absmax_to(m, out);
}
/* Prefill round 3: 8 columns of a row a thread, the row's bytes in 8- (FP8), 16- (BF16, F16) or 32-byte (F32) loads,
 * the values wget's (FP8: the exact E4M3 -> f16 conversion times the block's scale, one scale load for the 8). The
 * host takes it where split_v8() holds: K % 8 == 0, rows 16-byte aligned, FP8 scale blocks a multiple of 8 wide */
static __device__ __forceinline__ void ld8w(const DW &w, const uint8_t *src, int64_t c, int64_t srow, float v[8]) {
    if (w.fmt == DF_W_FP8) {
        const uint2 u = *(const uint2 *)(src + c);
        const float s = scale_ld(w, srow + (int64_t)((uint64_t)c / (uint64_t)w.blk_c));
        const uint32_t b[2] = {u.x, u.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)((b[i >> 2] >> (8 * (i & 3))) & 255u), __NV_E4M3);
            v[i] = __half2float(__half(h)) * s;
        }
    } else if (w.fmt == DF_W_F32) {
        const float4 a = *(const float4 *)(src + 4 * c), b = *(const float4 *)(src + 4 * c + 16);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        const uint4 u = *(const uint4 *)(src + 2 * c);
        const uint32_t b[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t h = (b[i >> 1] >> (16 * (i & 1))) & 0xffffu;
            v[i] = w.fmt == DF_W_BF16 ? bf16f(h) : f16f(h);
        }
    }
}
/* largest |W| of rows [r0, r0 + nr): FP8 the bound 448 max|scale| over the chunk's scale blocks, others every element */
__global__ void __launch_bounds__(SF_TH) k_absmax_w(DW w, int64_t r0, int64_t nr, int v8, unsigned *out) { pdl_entry();
    float m = 0.0f;
    if (w.fmt != DF_W_FP8 && v8) {
        for (int64_t r = blockIdx.x; r < nr; r += gridDim.x) {
            const uint8_t *src = w.data + (size_t)(r0 + r) * w.row_bytes;
            for (int64_t c = 8 * (int64_t)threadIdx.x; c < w.cols; c += 8 * SF_TH) {
                float v[8];
                ld8w(w, src, c, 0, v);
#pragma unroll
                for (int i = 0; i < 8; i++) m = fmaxf(m, fabsf(v[i]));
            }
        }
    } else if (w.fmt == DF_W_FP8) {
        const int64_t b0 = r0 / w.blk_r, b1 = (r0 + nr - 1) / w.blk_r, ns = (b1 - b0 + 1) * w.scale_cols;
        for (int64_t i = blockIdx.x * (int64_t)SF_TH + threadIdx.x; i < ns; i += (int64_t)gridDim.x * SF_TH)
            m = fmaxf(m, 448.0f * fabsf(scale_at(w, b0 * w.scale_cols + i)));
    } else
        for (int64_t r = blockIdx.x; r < nr; r += gridDim.x)
            for (int64_t c = threadIdx.x; c < w.cols; c += SF_TH) m = fmaxf(m, fabsf(wget(w, r0 + r, c)));
    absmax_to(m, out);
}
/* x' rows of P K halves: [x1 | x0 | x0] (P 3) or [x1 | x0] (P 2); V4: four columns a thread (K % 4 == 0, x aligned) */
template <int V4> __global__ void __launch_bounds__(SF_TH) k_split16_x(const float *x, int64_t n, int64_t K, int P, const unsigned *m, __half *o) { pdl_entry();
    const float sc = ldexpf(1.0f, f16_shift(m[0]));
    if (V4) { /* 4 columns an item, the n K / 4 items over the grid, SF_U a thread at once */
        const size_t K4 = (size_t)K / 4, items = (size_t)n * K4, st = (size_t)gridDim.x * SF_TH;
        for (size_t i0 = blockIdx.x * (size_t)SF_TH + threadIdx.x; i0 < items; i0 += SF_U * st) {
            float4 v[SF_U];
#pragma unroll
            for (int u = 0; u < SF_U; u++) v[u] = i0 + u * st < items ? ld_act((const float4 *)x + i0 + u * st) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int u = 0; u < SF_U; u++) {
                const size_t i = i0 + u * st;
                if (i >= items) break;
                const size_t t = i / K4, c = i - t * K4;
                __half *row = o + t * P * K;
                __half a0, a1, b0, b1, c0, c1, d0, d1;
                split16(v[u].x * sc, a0, a1), split16(v[u].y * sc, b0, b1), split16(v[u].z * sc, c0, c1), split16(v[u].w * sc, d0, d1);
                const __half2 h0[2] = {__halves2half2(a0, b0), __halves2half2(c0, d0)}, h1[2] = {__halves2half2(a1, b1), __halves2half2(c1, d1)};
                ((uint2 *)row)[c] = *(const uint2 *)h1;
                ((uint2 *)(row + K))[c] = *(const uint2 *)h0;
                if (P == 3) ((uint2 *)(row + 2 * K))[c] = *(const uint2 *)h0;
            }
        }
    } else
        for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
            __half *row = o + (size_t)t * P * K;
            const float *xr = x + (size_t)t * K;
            for (int64_t c = threadIdx.x; c < K; c += SF_TH) {
                __half h0, h1;
                split16(xr[c] * sc, h0, h1);
                row[c] = h1, row[K + c] = h0;
                if (P == 3) row[2 * K + c] = h0;
            }
        }
}
/* W' rows of P K halves for rows [r0, r0 + nr): [W0 | W1 | W0] (P 3) or [W0 | W0] (P 2); alpha = 2^-(ex+ew).
 * FP8 rows decode through the hardware E4M3 -> f16 conversion (exact) times the block's scale; v8: 8 columns a
 * thread (ld8w) */
__global__ void __launch_bounds__(SF_TH) k_split16_w(DW w, int64_t r0, int64_t nr, int P, int v8, const unsigned *mw, const unsigned *mx, float *alpha, __half *o) {
    pdl_entry();
    const int e = f16_shift(*mw);
    const float sc = ldexpf(1.0f, e);
    if (blockIdx.x == 0 && threadIdx.x == 0) *alpha = ldexpf(1.0f, -(e + f16_shift(*mx)));
    const int64_t K = w.cols;
    if (v8) { /* 8 columns an item, the nr K / 8 items over the grid, SF_U a thread at once */
        const size_t K8 = (size_t)K / 8, items = (size_t)nr * K8, st = (size_t)gridDim.x * SF_TH;
        for (size_t i0 = blockIdx.x * (size_t)SF_TH + threadIdx.x; i0 < items; i0 += SF_U * st) {
            float v[SF_U][8];
#pragma unroll
            for (int u = 0; u < SF_U; u++) {
                const size_t i = i0 + u * st;
                if (i >= items) break;
                const size_t r = i / K8, c = (i - r * K8) * 8;
                const int64_t rr = r0 + (int64_t)r;
                ld8w(w, w.data + (size_t)rr * w.row_bytes, (int64_t)c, w.fmt == DF_W_FP8 ? rr / w.blk_r * w.scale_cols : 0, v[u]);
            }
#pragma unroll
            for (int u = 0; u < SF_U; u++) {
                const size_t i = i0 + u * st;
                if (i >= items) break;
                const size_t r = i / K8, c = (i - r * K8) * 8;
                __half *row = o + r * P * K;
                __half h0[8], h1[8];
#pragma unroll
                for (int e = 0; e < 8; e++) split16(v[u][e] * sc, h0[e], h1[e]);
                *(uint4 *)(row + c) = *(const uint4 *)h0;
                *(uint4 *)(row + K + c) = *(const uint4 *)(P == 3 ? h1 : h0);
                if (P == 3) *(uint4 *)(row + 2 * K + c) = *(const uint4 *)h0;
            }
        }
        return;
    }
    for (int64_t r = blockIdx.x; r < nr; r += gridDim.x) {
        __half *row = o + (size_t)r * P * K;
        const int64_t rr = r0 + r, srow = w.fmt == DF_W_FP8 ? rr / w.blk_r * w.scale_cols : 0;
        const uint8_t *src = w.data + (size_t)rr * w.row_bytes;
        for (int64_t c = threadIdx.x; c < K; c += SF_TH) {
            float v;
            if (w.fmt == DF_W_FP8) {
                const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)src[c], __NV_E4M3);
                v = __half2float(__half(h)) * scale_at(w, srow + (int64_t)((unsigned)c / (unsigned)w.blk_c));
            } else
                v = wget(w, rr, c);
            __half h[2];
            split16(v * sc, h[0], h[1]);
            row[c] = h[0], row[K + c] = h[P == 3];
            if (P == 3) row[2 * K + c] = h[0];
        }
    }
}

static cublasHandle_t g_blas;
static int g_blas_state; /* 0 untried, 1 ready, -1 unavailable */
static cublasHandle_t blas(void) {
    if (!g_blas_state) {
        cublasStatus_t s = cublasCreate(&g_blas);
        g_blas_state = s == CUBLAS_STATUS_SUCCESS ? 1 : -1;
        if (g_blas_state < 0)
            fprintf(stderr, "deltafin: cuda backend: matmul_batch: cuBLAS unavailable (status %d); prefill products use the decode kernel\n", (int)s);
    }
    return g_blas_state > 0 ? g_blas : NULL;
}

/* From how many tokens the split-bf16 form runs (DELTAFIN_CUDA_SPLIT_MIN_N, default
 * MM_SPLIT_MIN_N; 0: never, every prefill product in SGEMM). Read per call: the
 * benchmark and the parity test switch it. */
static int split_min_n(void) {
    const char *e = getenv("DELTAFIN_CUDA_SPLIT_MIN_N");
    if (!e || !*e) return MM_SPLIT_MIN_N;
    const long v = strtol(e, NULL, 10);
    return v <= 0 ? INT32_MAX : v > INT32_MAX ? INT32_MAX : (int)v;
}
/* formats whose every value is a bf16 (one weight piece: 3 products instead of 6) */
static int bf16_exact(const DW &d) { return d.fmt == DF_W_BF16 || d.fmt == DF_W_MXFP4 || (d.fmt == DF_W_GGML && d.gt == DF_GGML_BF16); }
/* formats whose every value is an f16 once scaled by a power of two (<= 11 significant bits: one weight piece) */
static int f16_exact(const DW &d) {
    return d.fmt == DF_W_F16 || d.fmt == DF_W_BF16 || d.fmt == DF_W_MXFP4 ||
           (d.fmt == DF_W_GGML && (d.gt == DF_GGML_F16 || d.gt == DF_GGML_BF16 || d.gt == DF_GGML_MXFP4));
}
/* the split form of prefill products: 1 split-f16 (the default), 0 split-bf16 (DELTAFIN_CUDA_SPLIT_FORM=bf16, the
 * first form, kept to measure against; read per call: the benchmark switches it) */
static int split_f16(void) {
    const char *e = getenv("DELTAFIN_CUDA_SPLIT_FORM");
    return !(e && !strcmp(e, "bf16"));
}
/* the split kernels' 8-columns-a-thread path (ld8w) applies */
static int split_v8(const DW &d) {
    if (d.fmt != DF_W_FP8 && d.fmt != DF_W_F32 && d.fmt != DF_W_F16 && d.fmt != DF_W_BF16) return 0;
    if ((d.cols & 7) || ((uintptr_t)d.data & 15) || (d.row_bytes & 15)) return 0;
    return d.fmt != DF_W_FP8 || (d.blk_c > 0 && !(d.blk_c & 7));
}
static size_t g_slab_bytes = MM_SLAB_FLOATS * 4; /* a prefill product's weight slab (tests make it small: several chunks) */
extern "C" void df_cuda_set_slab_bytes(size_t b) { g_slab_bytes = b ? b : MM_SLAB_FLOATS * 4; }
static int64_t g_f16_gemms; /* split-f16 GEMMs since the start (tests: the form taken) */
extern "C" int64_t df_cuda_split_f16_gemms(void) { return g_f16_gemms; }

static int blas_fail(const char *what, const DW &d, int64_t nr, int n, cublasStatus_t s) {
    fprintf(stderr, "deltafin: cuda backend: matmul_batch: %s [%lld x %lld] n=%d failed (status %d); the product kernel runs instead\n", what, (long long)nr, (long long)d.cols, n, (int)s);
    return -1;
}

/* x' of the last split, kept for the next job of the same matmul_batch call with the same X (gate and up, q/k/v, q_a
 * and kv_a: jobs of one batch read their x and write other buffers, so X is unchanged inside a call); g_matmul_batch
 * clears it on entry, and every path that may reuse the slots clears it */
static struct { const float *X; int n, XP; int64_t K; } g_xs;
static int64_t g_f16_xsplits; /* x splits since the start (tests: shared by a batch's jobs) */
extern "C" int64_t df_cuda_split_f16_xsplits(void) { return g_f16_xsplits; }

/* blocks of the split kernels' flattened paths for this many items (SF_U a thread) */
static unsigned sf_blocks(size_t items) {
    const size_t b = (items + (size_t)SF_TH * SF_U - 1) / ((size_t)SF_TH * SF_U);
    return b < 1 ? 1 : b > 16384 ? 16384 : (unsigned)b;
}
/* the split-f16 product (above) of rows of W in chunks of at most a slab's bytes; as mm_gemm */
static int mm_gemm_f16(cublasHandle_t h, const DW &d, const float *X, float *Y, int n) {
    const int P = f16_exact(d) ? 2 : 3, v8 = split_v8(d);
    const int64_t K = d.cols, KP = P * K;
    if (KP > INT32_MAX) return -1;
    int64_t chunk = (int64_t)(g_slab_bytes / 2 / (size_t)KP);
    if (chunk < 1) chunk = 1;
    if (chunk > d.rows) chunk = d.rows;
    const int64_t nch = (d.rows + chunk - 1) / chunk;
    const int reuse = g_xs.X == X && g_xs.n == n && g_xs.K == K && g_xs.XP == P;
    g_xs.X = NULL;
    /* mx: [0] max |X|, [1] 0.0f (beta); m: per chunk max |W|, alpha */
    const size_t mbytes = (size_t)(2 * nch) * sizeof(unsigned);
    unsigned *mx = (unsigned *)slot(S_F16X, 2 * sizeof(unsigned), "matmul_batch");
    unsigned *m = (unsigned *)slot(S_F16M, mbytes, "matmul_batch");
    __half *wp = (__half *)slot(S_SLAB0, (size_t)chunk * KP * 2, "matmul_batch");
    __half *xp = (__half *)slot(S_X0, (size_t)n * KP * 2, "matmul_batch");
    if (!mx || !m || !wp || !xp) return -1;
    gr_flush();
    CK("matmul_batch", cudaMemsetAsync(m, 0, mbytes, 0));
    if (!reuse) {
        gr_flush();
        CK("matmul_batch", cudaMemsetAsync(mx, 0, 2 * sizeof(unsigned), 0));
        const size_t N = (size_t)n * K;
        const int v4 = !((uintptr_t)X & 15) && !(K & 3);
        const unsigned gx = blocks_for(v4 ? N / 4 : N, SF_TH) < 1024 ? blocks_for(v4 ? N / 4 : N, SF_TH) : 1024;
        if (v4)
            launch_k(k_absmax_x<1>, dim3(gx), dim3(SF_TH), 0, X, N, mx),
                launch_k(k_split16_x<1>, dim3(sf_blocks(N / 4)), dim3(SF_TH), 0, X, (int64_t)n, K, P, (const unsigned *)mx, xp);
        else
            launch_k(k_absmax_x<0>, dim3(gx), dim3(SF_TH), 0, X, N, mx),
                launch_k(k_split16_x<0>, dim3(n < 65535 ? n : 65535), dim3(SF_TH), 0, X, (int64_t)n, K, P, (const unsigned *)mx, xp);
        post("matmul_batch");
        g_f16_xsplits++;
    }
    const int ldc = (int)d.rows;
    for (int64_t c = 0; c < nch; c++) {
        const int64_t r0 = c * chunk, nr = d.rows - r0 < chunk ? d.rows - r0 : chunk;
        const unsigned g = (unsigned)(nr < 65535 ? nr : 65535), ga = d.fmt == DF_W_FP8 ? 8 : g < 1024 ? g : 1024;
        unsigned *mw = m + 2 * c;
        float *alpha = (float *)(void *)(mw + 1);
        launch_k(k_absmax_w, dim3(ga), dim3(SF_TH), 0, d, r0, nr, v8, mw);
        launch_k(k_split16_w, dim3(v8 ? sf_blocks((size_t)nr * (size_t)K / 8) : g), dim3(SF_TH), 0, d, r0, nr, P, v8, (const unsigned *)mw, (const unsigned *)mx, alpha,
                 wp);
        post("matmul_batch");
        cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
        cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE);
        gr_flush(); /* cuBLAS launches on the legacy stream too */
        /* column-major view: Y^T[rows x n] (ld rows) = alpha (W' chunk, ld KP)^T . X'^T[KP x n] (ld KP) */
        cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, (int)KP, alpha, wp, CUDA_R_16F, (int)KP, xp, CUDA_R_16F, (int)KP,
                                        (const float *)(const void *)(mx + 1), Y + r0, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST);
        if (s != CUBLAS_STATUS_SUCCESS) return blas_fail("cublasGemmEx (split-f16)", d, nr, n, s);
        g_f16_gemms++;
    }
    if (Y + (size_t)n * d.rows <= X || Y >= X + (size_t)n * K) g_xs.X = X, g_xs.n = n, g_xs.K = K, g_xs.XP = P; /* Y left X as it was */
    return 0;
}

/* Y[n][rows] = X[n][cols] W^T through slabs of rows; 0, or -1 (reported) to fall back to
 * the kernel, which then computes every row.
 * SGEMM: the exact f32 weight times x in f32 (pedantic math: no TF32).
 * n >= split_min_n(): split-f16 (mm_gemm_f16, above), or with DELTAFIN_CUDA_SPLIT_FORM=bf16
 * split-bf16: x = x0 + x1 + x2 and W = W0 + W1 + W2 in bf16
 * pieces (W = W0 where W is a bf16 already), Y = sum of Wi xj over i + j <= 2 in
 * BF16 GEMMs with f32 accumulation (3 GEMMs for bf16 weights, 6 for others); the
 * dropped terms are about 2^-24 of |W||x| per product, f32's own rounding
 * (docs/PERFORMANCE.md gives the measured error and rates). */
static int mm_gemm(const DW &d, const float *X, float *Y, int n) {
    cublasHandle_t h = blas();
    if (!h || d.cols > INT32_MAX || d.rows > INT32_MAX) return -1;
    const int split = n >= split_min_n();
    if (split && split_f16()) return mm_gemm_f16(h, d, X, Y, n);
    g_xs.X = NULL; /* the slots below are the split-f16 form's too */
    const int wparts = split && !bf16_exact(d) ? 3 : 1;
    const size_t esz = split ? 2 : 4;
    int64_t chunk = (int64_t)(g_slab_bytes / esz / (size_t)d.cols);
    if (chunk < 1) chunk = 1;
    if (chunk > d.rows) chunk = d.rows;
    Pieces wp = {{NULL, NULL, NULL}}, xp = {{NULL, NULL, NULL}};
    for (int i = 0; i < wparts; i++)
        if (!(wp.p[i] = (__nv_bfloat16 *)slot(S_SLAB0 + i, (size_t)chunk * d.cols * esz, "matmul_batch"))) return -1;
    if (split) {
        const size_t N = (size_t)n * d.cols;
        for (int i = 0; i < 3; i++)
            if (!(xp.p[i] = (__nv_bfloat16 *)slot(S_X0 + i, N * 2, "matmul_batch"))) return -1;
        launch_k(k_split, dim3(blocks_for(N, 256)), dim3(256), 0, X, N, xp);
        post("matmul_batch");
    }
    const float one = 1.0f, zero = 0.0f;
    const int K = (int)d.cols, ldc = (int)d.rows;
    for (int64_t r0 = 0; r0 < d.rows; r0 += chunk) {
        const int64_t nr = d.rows - r0 < chunk ? d.rows - r0 : chunk;
        const unsigned g = blocks_for((size_t)nr * d.cols, 256);
        /* column-major view: Y^T[rows x n] (ld rows) = (W chunk, ld cols)^T . X^T[cols x n] (ld cols) */
        if (!split) {
            launch_k(k_dequant, dim3(g), dim3(256), 0, d, r0, nr, (float *)(void *)wp.p[0]);
            post("matmul_batch");
            cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
            gr_flush();
            cublasStatus_t s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, K, &one, (const float *)(void *)wp.p[0], K, X, K, &zero, Y + r0, ldc);
            if (s != CUBLAS_STATUS_SUCCESS) return blas_fail("cublasSgemm", d, nr, n, s);
            continue;
        }
        launch_k(k_dequant_split, dim3(g), dim3(256), 0, d, r0, nr, wp);
        post("matmul_batch");
        cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
        gr_flush();
        int first = 1;
        for (int i = 0; i < wparts; i++)
            for (int j = 0; i + j <= 2; j++) {
                cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, K, &one, wp.p[i], CUDA_R_16BF, K, xp.p[j], CUDA_R_16BF, K,
                                                first ? &zero : &one, Y + r0, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                if (s != CUBLAS_STATUS_SUCCESS) return blas_fail("cublasGemmEx (split-bf16)", d, nr, n, s);
                first = 0;
            }
    }
    return 0;
}

/* ---- exact products (backend.h: exact_products; the speculative verify pass) ----------------------------------
 * On, a product of n > 1 tokens gives each token's row of Y the bits of the same product of that token alone. The
 * jobs hold the one-token split of their rows over warps (wk) and group into the batches a one-token call makes (the
 * same loop, the same flushes), and mm_flush emulates each batch's one-token launch. k_mm (and k_mm_bal, the same
 * bits): every row's fmaf chain and sums depend only on wk (mm_warp), so the n tokens go through k_mm in one launch,
 * the weight read once. k_mm_f8's body (FP8, and BF16 with LEAN bit 134217728, in batches of at most MM_SMALLJ
 * jobs): a row's bits are k_mm's with wk = its KS; KS 1 goes through k_mm likewise, KS > 1 (its parts' sums start
 * from the first part's, k_mm's from 0) a token at a time through the one-token launch. With LEAN bit 1024 (k_mm_cp
 * for the float spine: its own order, and batches of its own) a call holding such a job runs as n one-token calls.
 * Never the dequantize + SGEMM path. Thread-local, as the CPU backend's mode: the session sets it around its pass. */
thread_local int g_exact;
int g_exact_products(int on) {
    g_exact = on != 0;
    return 2; /* honoured; a MoE layer's experts run per position (backend.h): the device-routed path has its own bits */
}
static int exact_per_token(const df_mv_job *jobs, int n_jobs) {
    if (!(lean_mask() & 1024)) return 0;
    for (int j = 0; j < n_jobs; j++) {
        const df_weight *w = jobs[j].w;
        if (!w->ident && (w->fmt == DF_W_F32 || w->fmt == DF_W_F16 || w->fmt == DF_W_BF16)) return 1;
    }
    return 0;
}
static void mm_batch(const df_mv_job *jobs, int n_jobs, int n);
void g_matmul_batch(const df_mv_job *jobs, int n_jobs, int n) {
    LOCK();
    if (n <= 0) return;
    if (n > 1 && g_exact && exact_per_token(jobs, n_jobs)) {
        df_mv_job st[32], *one = n_jobs <= 32 ? st : (df_mv_job *)malloc((size_t)n_jobs * sizeof *one);
        if (!one) {
            fprintf(stderr, "deltafin: cuda backend: matmul_batch: out of host memory for %d jobs\n", n_jobs);
            exit(1);
        }
        for (int t = 0; t < n; t++) {
            for (int j = 0; j < n_jobs; j++)
                one[j] = df_mv_job{jobs[j].w, df_act_atc(jobs[j].x, (size_t)t * (size_t)jobs[j].w->cols), df_act_at(jobs[j].y, (size_t)t * (size_t)jobs[j].w->rows)};
            mm_batch(one, n_jobs, 1);
        }
        if (one != st) free(one);
        return;
    }
    mm_batch(jobs, n_jobs, n);
}
static void mm_batch(const df_mv_job *jobs, int n_jobs, int n) {
    g_xs.X = NULL; /* x may have changed since the last call */
    if (n > 1 && g_prof > 0) prof_restart();
    MmBatch b;
    b.nj = 0, b.pf = 1, b.cp = 0;
    unsigned blocks = 0;
    for (int j = 0; j < n_jobs; j++) {
        DW d;
        /* an unregistered weight without an identity is uploaded into scratch slots shared by every such job:
         * it runs alone. Routed experts (ident) come from the VRAM cache (slots in use this layer are never
         * evicted) or per-op scratch (a buffer per copy), spine weights left in host memory from per-op
         * scratch: they batch with the rest. */
        const int scratch = !jobs[j].w->handle && !jobs[j].w->ident;
        if (scratch) mm_flush(&b, blocks, n), blocks = 0;
        if (w_get(jobs[j].w, S_WD0, S_WS0, &d, "matmul_batch")) continue;
        if (d.rows <= 0) continue;
        if (n >= MM_GEMM_MIN_N && !g_exact && !mm_gemm(d, DCP(jobs[j].x), DP(jobs[j].y), n)) continue;
        /* exact products: the one-token split, so k_mm gives each token the one-token bits */
        const int vec = vec_kind(d, DCP(jobs[j].x)), wk = n == 1 || g_exact ? split_at(d, vec, split1(jobs[j].w->ident != 0)) : split_of(d, vec),
                  per_block = MM_WARPS / wk * MM_R;
        const unsigned nb = (unsigned)((d.rows + per_block - 1) / per_block);
        /* round 9 (bit 1024): one-token products of spine weights of the plain 16-byte decoders through k_mm_cp
         * (a job takes that kernel whatever the other jobs of its batch, so its bits do not depend on them) */
        const int cp = n == 1 && !jobs[j].w->ident && (lean_mask() & 1024) && (vec == V_F32 || vec == V_F16 || vec == V_BF16);
        /* a launch holds jobs of one decoder (the kernel is compiled per decoder) */
        if (b.nj == MM_MAXJ || (b.nj && (b.j[0].vec != vec || b.cp != cp)) || (uint64_t)blocks + nb > 0x7fffffffu) mm_flush(&b, blocks, n), blocks = 0;
        b.cp = cp;
        if (!w_resident(jobs[j].w)) b.pf = 0;
        MmJob &J = b.j[b.nj++];
        J.w = d, J.x = DCP(jobs[j].x), J.y = DP(jobs[j].y), J.vec = vec, J.wk = wk, J.blk0 = blocks;
        blocks += nb;
        if (scratch) mm_flush(&b, blocks, n), blocks = 0;
    }
    mm_flush(&b, blocks, n);
}

/* ---- the device-routed MoE (moe_fused): one token's router, experts and combine, nothing read back ----------
 * k_route_fused (one warp) routes with the host route's arithmetic (backend/cpu/ops.c, route_*: the same
 * operations in the same order, each rounded alone: no contraction) and tie rule (the largest value, the
 * lowest index among equals), then writes the product launches' job tables into device memory from the
 * layer's table of resident experts; k_mm_dev runs them (the decode kernel's body: the same bits per row as
 * the host-routed launches), then the gate and the combine kernels of the host-routed path.
 * The one difference: exp. The host's is glibc's expf; here it is exp in double rounded once to float (the
 * correctly rounded value, but for inputs within ~1e-9 relative of a rounding boundary). glibc's expf is not
 * correctly rounded for about 1 input in 10^4 (tests/unit/test_backend_cuda.c says how often it showed), so a
 * router weight may differ from the host route's in its last bit; expert ids differ only where two logits
 * (softmax top-k: never, the ids come from the logits) or two biased sigmoid scores tie within that ulp. */
struct FusedDev {
    MmBatch gu, dn; /* gate/up products of the k experts (2k jobs), their down products (k jobs) */
};
struct RouteK {
    int kind, E, k, norm, G, topk_group;
    float scaling;
    const float *logits, *bias;
    float *w;
    int *ids_out;
    const DW *tab;
    const float *x;
    float *g, *u, *d;
    int D, I, vec_gu, wk_gu, vec_dn, wk_dn;
    unsigned nb_gu, nb_dn;
    FusedDev *fd;
    float *h;   /* round 17 (bit 268435456): gate(g, u) of the K experts, K x I (k_guh_rt writes it); NULL otherwise */
    GateIn ga;  /* the gate k_guh_rt applies */
};
static __device__ __forceinline__ float exp_host(float x) { return __double2float_rn(exp((double)x)); }
/* the index of the largest v[e] not taken (ties: the lowest index), -1 when all are taken: every lane gets it */
static __device__ int warp_take_max(const float *v, const unsigned char *taken, int E) {
    const int lane = threadIdx.x & 31;
    int bi = -1;
    float bv = 0.0f;
    for (int e = lane; e < E; e += 32)
        if (!taken[e] && (bi < 0 || v[e] > bv)) bi = e, bv = v[e];
    for (int o = 16; o; o >>= 1) {
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bi = oi, bv = ov;
    }
    return __shfl_sync(0xffffffffu, bi, 0);
}
static __device__ void route_tables(const RouteK &p, const int *ids, const float *wk, int lane);
__global__ void __launch_bounds__(32) k_route_fused(const __grid_constant__ RouteK p) { pdl_entry();
    extern __shared__ float sm[];
    const int E = p.E, K = p.k, lane = threadIdx.x;
    float *lg = sm, *sc = sm + E, *ch = sm + 2 * E, *gs = sm + 3 * E;
    unsigned char *taken = (unsigned char *)(gs + (p.G > 0 ? p.G : 1)), *keep = taken + E;
    __shared__ int ids[FUSED_MAX_K];
    __shared__ float wk[FUSED_MAX_K];
    for (int e = lane; e < E; e += 32) lg[e] = p.logits[e], taken[e] = 0;
    __syncwarp();
    if (p.kind == DF_ROUTE_SOFTMAX_TOPK) {
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32)
            if (lg[e] > mx) mx = lg[e];
        for (int o = 16; o; o >>= 1) {
            const float om = __shfl_xor_sync(0xffffffffu, mx, o);
            if (om > mx) mx = om;
        }
        for (int e = lane; e < E; e += 32) sc[e] = exp_host(__fsub_rn(lg[e], mx));
        __syncwarp();
        double sum = 0;
        if (!lane)
            for (int e = 0; e < E; e++) sum = __dadd_rn(sum, (double)sc[e]);
        sum = __shfl_sync(0xffffffffu, sum, 0);
        for (int k = 0; k < K; k++) {
            const int best = warp_take_max(lg, taken, E);
            if (!lane) taken[best] = 1, ids[k] = best, wk[k] = __double2float_rn(__ddiv_rn((double)sc[best], sum));
            __syncwarp();
        }
        if (!lane && p.norm) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s = __fadd_rn(s, wk[k]);
            for (int k = 0; k < K; k++) wk[k] = __fdiv_rn(wk[k], s);
        }
    } else {
        const int G = p.G, per = E / G;
        for (int e = lane; e < E; e += 32) {
            sc[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_host(-lg[e])));
            ch[e] = __fadd_rn(sc[e], p.bias[e]);
        }
        __syncwarp();
        for (int g = lane; g < G; g += 32) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int i = 0; i < per; i++) {
                const float v = ch[g * per + i];
                if (v > b1) b2 = b1, b1 = v;
                else if (v > b2) b2 = v;
            }
            gs[g] = __fadd_rn(b1, b2);
            keep[g] = 0;
        }
        __syncwarp();
        for (int k = 0; k < p.topk_group; k++) {
            const int best = warp_take_max(gs, keep, G);
            if (!lane && best >= 0) keep[best] = 1;
            __syncwarp();
        }
        for (int e = lane; e < E; e += 32)
            if (!keep[e / per]) taken[e] = 1; /* experts of dropped groups are never chosen */
        __syncwarp();
        for (int k = 0; k < K; k++) {
            int best = warp_take_max(ch, taken, E);
            if (best < 0) best = 0; /* unreachable: config checks topk_group * per >= K */
            if (!lane) taken[best] = 1, ids[k] = best, wk[k] = sc[best];
            __syncwarp();
        }
        if (!lane) {
            if (p.norm) {
                float s = 0.0f;
                for (int k = 0; k < K; k++) s = __fadd_rn(s, wk[k]);
                s = __fadd_rn(s, 1e-20f);
                for (int k = 0; k < K; k++) wk[k] = __fdiv_rn(wk[k], s);
            }
            for (int k = 0; k < K; k++) wk[k] = __fmul_rn(wk[k], p.scaling);
        }
    }
    __syncwarp();
    route_tables(p, ids, wk, lane);
}
/* Round 7 (DELTAFIN_CUDA_LEAN bit 64): the softmax top-k route of at most 32 * RS_V experts in two warps, the
 * logits in registers. Warp 1 computes the softmax denominator exactly as k_route_fused (the same max, the same
 * exp, the same double sum in expert order: the same bits); warp 0 meanwhile picks the k experts: each lane
 * keeps the best untaken logit of its own experts (the lowest index among equals), and the warp takes the
 * largest key with one redux.sync and the lowest index holding it with a second (keys order the floats as `>`
 * does, -0 as +0: the same choice and tie rule as warp_take_max). A NaN logit sends warp 0 to warp_take_max. */
#define RS_V 8
/* the route's shared memory (sc first: read as float4) */
struct RsSh {
    __align__(16) float sc[32 * RS_V];
    float lg[32 * RS_V];
    unsigned char taken[32 * RS_V];
    int ids[FUSED_MAX_K];
    float wk[FUSED_MAX_K];
    double total;
};
/* 64 threads at once: the block's 64 (k_route_soft) or its first 64 (round 10's kernels, threads 64.. do not call
 * it): a named barrier (1) joins the two warps, so the other threads never meet it */
static __device__ __forceinline__ void bar64(void) { asm volatile("bar.sync 1, 64;" ::: "memory"); }
/* k_route_soft's route: the ids and (W, warp 0, after its lane 0 and a __syncwarp) the weights in s; without W warp 1
 * skips the softmax denominator (round 10's gate/up blocks but the first need only the ids) */
template <int W> static __device__ __forceinline__ void route_soft_ids(const RouteK &p, RsSh &s) {
    float *lg = s.lg, *sc = s.sc;
    unsigned char *taken = s.taken;
    int *ids = s.ids;
    float *wk = s.wk;
    const int E = p.E, K = p.k, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v[RS_V];
#pragma unroll
    for (int i = 0; i < RS_V; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? __ldcg(p.logits + e) : 0.0f; /* through L2: round 10's down launch reads them before its wait */
        if (e < E && warp == 0) lg[e] = v[i], taken[e] = 0;
    }
    if (warp == 1 && !W) {
    } else if (warp == 1) { /* the denominator, as k_route_fused */
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < RS_V; i++)
            if (lane + 32 * i < E && v[i] > mx) mx = v[i];
        for (int o = 16; o; o >>= 1) {
            const float om = __shfl_xor_sync(0xffffffffu, mx, o);
            if (om > mx) mx = om;
        }
#pragma unroll
        for (int i = 0; i < RS_V; i++)
            if (lane + 32 * i < E) sc[lane + 32 * i] = exp_host(__fsub_rn(v[i], mx));
        __syncwarp();
        if (!lane) {
            double sum = 0;
            int e = 0;
            for (; e + 4 <= E; e += 4) {
                const float4 f = *(const float4 *)(sc + e);
                sum = __dadd_rn(sum, (double)f.x), sum = __dadd_rn(sum, (double)f.y), sum = __dadd_rn(sum, (double)f.z), sum = __dadd_rn(sum, (double)f.w);
            }
            for (; e < E; e++) sum = __dadd_rn(sum, (double)sc[e]);
            s.total = sum;
        }
    } else {
        int nan = 0;
#pragma unroll
        for (int i = 0; i < RS_V; i++) nan |= lane + 32 * i < E && v[i] != v[i];
        if (__any_sync(0xffffffffu, nan)) {
            __syncwarp();
            for (int k = 0; k < K; k++) {
                const int best = warp_take_max(lg, taken, E);
                if (!lane) taken[best] = 1, ids[k] = best;
                __syncwarp();
            }
        } else {
            unsigned key[RS_V];
#pragma unroll
            for (int i = 0; i < RS_V; i++) {
                const uint32_t u = __float_as_uint(__fadd_rn(v[i], 0.0f)); /* -0 -> +0 */
                key[i] = lane + 32 * i >= E ? 0u : (u & 0x80000000u) ? ~u : u | 0x80000000u; /* > 0 for every float */
            }
            unsigned bk = 0;
            int bi = 0x7fffffff;
#pragma unroll
            for (int i = 0; i < RS_V; i++)
                if (key[i] > bk) bk = key[i], bi = lane + 32 * i;
            for (int k = 0; k < K; k++) {
                const unsigned m = __reduce_max_sync(0xffffffffu, bk);
                const int best = (int)__reduce_min_sync(0xffffffffu, bk == m ? (unsigned)bi : 0x7fffffffu);
                if (!lane) ids[k] = best;
                if ((best & 31) == lane) { /* the winner's lane drops it and finds its next best */
#pragma unroll
                    for (int i = 0; i < RS_V; i++)
                        if (i == best >> 5) key[i] = 0;
                    bk = 0, bi = 0x7fffffff;
#pragma unroll
                    for (int i = 0; i < RS_V; i++)
                        if (key[i] > bk) bk = key[i], bi = lane + 32 * i;
                }
            }
        }
    }
    bar64();
    if (warp || !W) return;
    if (!lane) {
        const double sum = s.total;
        for (int k = 0; k < K; k++) wk[k] = __double2float_rn(__ddiv_rn((double)sc[ids[k]], sum));
        if (p.norm) {
            float sm = 0.0f;
            for (int k = 0; k < K; k++) sm = __fadd_rn(sm, wk[k]);
            for (int k = 0; k < K; k++) wk[k] = __fdiv_rn(wk[k], sm);
        }
    }
    __syncwarp();
}
__global__ void __launch_bounds__(64) k_route_soft(const __grid_constant__ RouteK p) {
    pdl_entry();
    __shared__ RsSh s;
    route_soft_ids<1>(p, s);
    if (threadIdx.x >= 32) return;
    route_tables(p, s.ids, s.wk, threadIdx.x & 31);
}
/* ---- round 10 (DELTAFIN_CUDA_LEAN bit 8192): the route inside the gate/up and down launches --------------------
 * The softmax top-k route (k_route_soft's code: route_soft_ids, the same bits) runs in the first two warps of EVERY
 * block of the two product launches instead of in a launch of its own: a decode step's MoE layer is 2 launches.
 * k_gu_rt waits for the router product first (the logits), then lets the down launch start, so that launch, when it
 * starts early, knows the logits are final (its predecessor's blocks all passed their wait): k_moe_down_rt routes
 * again BEFORE its own wait and copies its experts' rows (the resident table p.tab is written by no kernel) by
 * cp.async while the gate/up launch still runs, as k_moe_down_cp. Each block builds the one job it takes from the
 * ids (k_gu_rt: job blockIdx.x / nb_gu of the table route_tables writes: the same rows, x, y and row split) and runs
 * the decode kernel's body (k_mm_dev's: the same bits per row); block 0 of k_gu_rt writes the weights and ids out
 * (its other blocks need only the ids: their warp 1 skips the softmax denominator).
 * The down launch's combine reads its own weights (the same values). So every result has the bits of bits 64 + 2048. */
template <int V, int U>
__global__ void __launch_bounds__(MM_WARPS * 32, U > 2 ? 2 : 3) k_gu_rt(const __grid_constant__ RouteK p) {
    __shared__ RsSh rs;
    __shared__ MmBatchT<1> jb;
    pdl_wait(), pdl_go(); /* as k_mm_dev: the wait first */
    if (threadIdx.x < 64) { /* the weights in block 0 only (it writes them out) */
        if (blockIdx.x) route_soft_ids<0>(p, rs);
        else route_soft_ids<1>(p, rs);
    }
    __syncthreads();
    const unsigned jj = blockIdx.x / p.nb_gu;
    if (!threadIdx.x) {
        const int j = (int)(jj >> 1), e = rs.ids[j];
        MmJob &J = jb.j[0];
        J.w = p.tab[3 * e + (jj & 1)], J.x = p.x, J.y = ((jj & 1) ? p.u : p.g) + (size_t)j * p.I, J.vec = p.vec_gu, J.wk = p.wk_gu, J.blk0 = jj * p.nb_gu;
        jb.nj = 1, jb.n = 1, jb.t0 = 0, jb.pf = 0, jb.cp = 0;
    }
    if (!blockIdx.x && threadIdx.x < 32)
        for (int j = threadIdx.x; j < p.k; j += 32) {
            p.w[j] = rs.wk[j];
            if (p.ids_out) p.ids_out[j] = rs.ids[j];
        }
    __syncthreads();
    mm_body<V, 1, MM_WARPS, 1, U>(jb);
}
/* ---- round 17 (DELTAFIN_CUDA_LEAN bit 268435456): the gate computed once, by the gate/up launch ----------------------
 * k_gu_rt's route and rows, but a block holds GH_ROWS rows of ONE expert's gate AND the same rows of its up
 * projection (warps 0..3 the gate's, 4..7 the up's, MM_R rows a warp, wk = 1: each row through mm_warp with the same
 * arguments as mm_body gives it, so g and u have the bits of the host-routed launches), writes g and u as k_gu_rt
 * does, and then h = gate(g, u) of its rows (gate_apply, as k_gate and dn_gate compute it): the down launch
 * (k_moe_down_rt<..., H = 1>) reads h instead of loading g and u and applying the gate in each of its warps (ncu,
 * round 16: its per-warp g/u loads were load-queue throttling and 2 x the input bytes). The same bits everywhere. */
#define GH_ROWS (MM_WARPS / 2 * MM_R) /* 16 rows of gate and 16 of up a block */
static int64_t g_moe_guh;
extern "C" int64_t df_cuda_moe_guh_launches(void) { return g_moe_guh; }
template <int V, int U>
__global__ void __launch_bounds__(MM_WARPS * 32, U > 2 ? 2 : 3) k_guh_rt(const __grid_constant__ RouteK p) {
    __shared__ RsSh rs;
    __shared__ float gu[2][GH_ROWS];
    pdl_wait(), pdl_go();
    if (threadIdx.x < 64) {
        if (blockIdx.x) route_soft_ids<0>(p, rs);
        else route_soft_ids<1>(p, rs);
    }
    __syncthreads();
    const unsigned nbh = (unsigned)((p.I + GH_ROWS - 1) / GH_ROWS);
    const int j = (int)(blockIdx.x / nbh), warp = threadIdx.x >> 5, lane = threadIdx.x & 31, up = warp >= MM_WARPS / 2;
    const int64_t rb = (int64_t)(blockIdx.x % nbh) * GH_ROWS, r0 = rb + (int64_t)(warp % (MM_WARPS / 2)) * MM_R;
    if (!blockIdx.x && threadIdx.x < 32)
        for (int jj = threadIdx.x; jj < p.k; jj += 32) {
            p.w[jj] = rs.wk[jj];
            if (p.ids_out) p.ids_out[jj] = rs.ids[jj];
        }
    __shared__ MmJob jb[2];
    if (!(threadIdx.x & (MM_WARPS / 2 * 32 - 1))) {
        MmJob &Jw = jb[up];
        Jw.w = p.tab[3 * rs.ids[j] + up], Jw.x = p.x, Jw.y = (up ? p.u : p.g) + (size_t)j * p.I, Jw.vec = p.vec_gu, Jw.wk = 1, Jw.blk0 = 0;
    }
    __syncthreads();
    const MmJob &J = jb[up];
    const int64_t rows = J.w.rows;
    const int nr = r0 >= rows ? 0 : rows - r0 < MM_R ? (int)(rows - r0) : MM_R;
    float acc[MM_R][1];
    const GateIn none = {0, 0, 0.0f, 0.0f};
    mm_warp<V, 1, U, 0>(J, r0, nr, 0, 1, 0, 1, none, acc);
#pragma unroll
    for (int i = 0; i < MM_R; i++) {
        const float sum = warp_sum(acc[i][0]);
        if (!lane && i < nr) J.y[r0 + i] = sum, gu[up][r0 - rb + i] = sum;
    }
    __syncthreads();
    if (threadIdx.x < GH_ROWS && rb + threadIdx.x < rows)
        p.h[(size_t)j * p.I + rb + threadIdx.x] = gate_apply(p.ga.kind, gu[0][threadIdx.x], gu[1][threadIdx.x], p.ga.p0, p.ga.p1);
}
/* k_moe_down_cp with its jobs from its own route (see above): warp k takes expert ids[k] (the rows of p.tab[3 ids[k]
 * + 2], input p.g + k I, its rows into p.d + k D), the combine by the route's weights. H (round 17): the input is
 * p.h + k I, the gate already applied (k_guh_rt), read through L2 only with H = 2 (the default), through the read-only
 * path with H = 1 (DELTAFIN_CUDA_H_CG=0: undefined while k_guh_rt still writes h; a diagnosis aid). */
template <int V, int SPR, int RT, int H = 0>
__global__ void __launch_bounds__(FUSED_MAX_K * 32) k_moe_down_rt(const __grid_constant__ RouteK p, GateIn ga, float *out) {
    extern __shared__ __align__(16) uint4 dr_ring[];
    __shared__ RsSh rs;
    constexpr int E = Fmt<V>::E;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = p.k;
    uint4 *ring = dr_ring + (size_t)warp * RT * SPR * 32 + lane;
    pdl_go();
    if (threadIdx.x < 64) route_soft_ids<1>(p, rs);
    __syncthreads();
    const int64_t r0 = (int64_t)blockIdx.x * RT;
    const DW &w = p.tab[3 * rs.ids[warp] + 2];
    const int64_t rows = w.rows, upr = w.cols / E;
    const int nr = r0 >= rows ? 0 : rows - r0 < RT ? (int)(rows - r0) : RT;
    {
        const size_t rb = w.row_bytes;
        const uint8_t *base = w.data + (size_t)r0 * rb + (size_t)lane * 16;
        dn_copy<SPR, RT>(ring, base, rb, nr, upr, lane);
    }
    pdl_wait();
    float *y = p.d + (size_t)warp * p.D;
    float xg[SPR][E];
    if (H) dn_load<E, SPR, H == 2>(p.h + (size_t)warp * p.I, upr, lane, xg);
    else dn_gate<E, SPR>(p.g + (size_t)warp * p.I, ga, upr, lane, xg);
    __shared__ float part[FUSED_MAX_K][RT];
    dn_rows<V, SPR, RT>(ring, xg, upr, nr, lane, warp, part, y, r0, K, rs.wk, out);
}
/* k_moe_down_rt<V, SPR, DN_RT, H> for a decoder (F32, F16, else BF16) and SPR (1..4) known at run time */
#define DN_RT 4 /* rows per block of k_moe_down_cp (round 9, bit 2048) and k_moe_down_rt: D = 2048 gives 512 blocks of K warps */
template <int V, int H> static const void *dn_rt_kv(int spr) {
    return spr == 1 ? (const void *)k_moe_down_rt<V, 1, DN_RT, H> : spr == 2 ? (const void *)k_moe_down_rt<V, 2, DN_RT, H>
         : spr == 3 ? (const void *)k_moe_down_rt<V, 3, DN_RT, H> : (const void *)k_moe_down_rt<V, 4, DN_RT, H>;
}
template <int H> static const void *dn_rt_k(int vec, int spr) {
    return vec == V_F32 ? dn_rt_kv<V_F32, H>(spr) : vec == V_F16 ? dn_rt_kv<V_F16, H>(spr) : dn_rt_kv<V_BF16, H>(spr);
}
/* ---- round 12 (DELTAFIN_CUDA_LEAN bit 65536): the FP8 experts' gate + down + combine launch --------------------------
 * Why FP8 experts (DeepSeek-V3: E4M3 rows of I = 2048 bytes, 128 x 128 scale blocks) took round 6's k_moe_down: bits
 * 2048 (k_moe_down_cp) and 8192 (k_moe_down_rt, softmax routes only) take F32 / F16 / BF16 rows only (their products
 * decode with scale 1), and bit 128's gate in shared memory (K x I floats) needs at most 48 KiB (8 x 2048 x 4 is 64).
 * k_moe_down<V_FP8, 4> then holds 4 rows x 4 steps of 16 bytes AND 16 scales a lane: 168 registers (the bound of
 * its 384-thread launch) with spills, so ONE block of 8 warps an SM, 1792 blocks in 14 dependent waves, each lane
 * computing the gate of its 64 columns again in every block.
 * k_moe_down_f8 (K <= 8 experts: 2 blocks of 8 warps an SM at 128 registers): one wave of blocks (the SMs x the
 * blocks an SM holds), each block taking groups of F8_RT rows round
 * robin (group blockIdx.x, + gridDim.x, ...); warp k streams expert k's rows of those groups through a ring of F8_NS
 * rows in shared memory (cp.async, one commit group per row, the first F8_NS rows copied before the wait for the
 * gate/up launch as k_moe_down_cp does: the table and the resident experts are final then); after the wait each lane
 * computes gate(g, u) of its own columns ONCE for all its rows (dn_gate: gate_apply, as k_gate writes it), then per
 * row: the lane's steps q = 0 .. SPR - 1 (column step 32 q + lane), each decoded with its block's scale
 * (decode<V_FP8>: __fmul_rn(e4m3, scale), the scale of (row / blk_r, 16 (32 q + lane) / blk_c) read by scale_at as
 * mm_warp reads it, again only when the row's block row changes), fmaf over its 16 elements in order, warp_sum:
 * k_moe_down's one-warp row (wk = 1), so each expert row has k_moe_down's bits; the group's rows are written to d
 * and combined by the route's weights in k order (k_moe_down's arithmetic: the same output bits). */
#define F8_NS 4 /* rows in flight per warp: K x 4 x 2 KB = 64 KiB of ring a block (I = 2048, K = 8) */
#define F8_RT 4 /* rows per combine group (k_moe_down's MM_R) */
#define F8_MAX_K 8 /* warps (experts) a block: the bound below (2 blocks of 8 warps an SM, 128 registers: xg alone is 64) */
/* NS: rows in flight per warp (the ring; F8_NS by default, DELTAFIN_CUDA_F8_NS=6 or 8 for SPR 4: the same arithmetic) */
/* MODE 1 (bit 8388608, round 14): each 16-byte step's products summed unscaled (the E4M3 values as the hardware
 * converts them, fmaf over the step's 16 elements in order), then the step's sum times its block's scale added to the
 * row's accumulator with one fmaf: one product a step for the scale instead of one an element (a quarter of the
 * kernel's arithmetic). Other sums than k_moe_down's (within the conformance bounds).
 * MODE 2 (bit 16777216): no combine here: each warp streams its expert's rows without the block's two barriers a
 * group, and k_moe_combine (the same arithmetic as moe_comb: the same bits) runs after the launch. */
/* an FP8 job's weight from a table written by the route kernel, read through L2 (__ldcg) before griddepcontrol.wait:
 * the table is final then (see k_moe_down) */
static __device__ __forceinline__ DW dw_ldcg(const MmJob *Jp) {
    DW w;
    w.fmt = DF_W_FP8, w.gt = 0;
    w.sdt = __ldcg(&Jp->w.sdt), w.blk_r = __ldcg(&Jp->w.blk_r), w.blk_c = __ldcg(&Jp->w.blk_c);
    w.rows = (int64_t)__ldcg((const long long *)&Jp->w.rows), w.cols = (int64_t)__ldcg((const long long *)&Jp->w.cols);
    w.scale_cols = (int64_t)__ldcg((const long long *)&Jp->w.scale_cols);
    w.data = (const uint8_t *)__ldcg((const unsigned long long *)&Jp->w.data);
    w.scale = (const uint8_t *)__ldcg((const unsigned long long *)&Jp->w.scale);
    w.row_bytes = (size_t)__ldcg((const unsigned long long *)&Jp->w.row_bytes);
    return w;
}
template <int V, int SPR, int NS = F8_NS, int MODE = 0>
__global__ void __launch_bounds__(F8_MAX_K * 32, 2) k_moe_down_f8(const MmBatchT<MM_MAXJ> *b, int K, int ngr, GateIn ga, const float *wr, float *out) {
    extern __shared__ __align__(16) uint4 f8_ring[];
    constexpr int E = Fmt<V>::E, C = Fmt<V>::C;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint4 *ring = f8_ring + (size_t)warp * NS * SPR * 32 + lane;
    pdl_go();
    /* expert `warp`'s down weight, read through L2 before the wait (see k_moe_down: the table is final) */
    const MmJob *Jp = &b->j[warp];
    const DW w = dw_ldcg(Jp);
    const int64_t D = w.rows, upr = w.cols / E;
    const unsigned G = gridDim.x;
    const int nst = ((int)blockIdx.x < ngr ? (ngr - 1 - (int)blockIdx.x) / (int)G + 1 : 0) * F8_RT; /* the block's row slots */
    const uint8_t *base = w.data + (size_t)lane * 16;
    const size_t rb = w.row_bytes;
    /* slot i of the block's stream: row (blockIdx.x + G (i / F8_RT)) F8_RT + i % F8_RT (past D: nothing) */
    auto row_of = [&](int i) -> int64_t { return ((int64_t)blockIdx.x + (int64_t)G * (i / F8_RT)) * F8_RT + i % F8_RT; };
    auto issue = [&](int i) { /* one commit group, empty past the end: every lane commits alike */
        if (i < nst) {
            const int64_t r = row_of(i);
            if (r < D)
#pragma unroll
                for (int q = 0; q < SPR; q++)
                    if ((int64_t)q * 32 + lane < upr) cp16(ring + ((i % NS) * SPR + q) * 32, base + (size_t)r * rb + (size_t)q * 512);
        }
        cp_commit();
    };
#pragma unroll
    for (int i = 0; i < NS; i++) issue(i);
    pdl_wait();
    const float *x = Jp->x;
    float *y = Jp->y;
    float xg[SPR][E];
    dn_gate<E, SPR>(x, ga, upr, lane, xg);
    __shared__ float part[FUSED_MAX_K][F8_RT];
    const uint32_t vps = V == V_FP8 ? (uint32_t)w.blk_c / 16 : 1;
    float sc[SPR];
#pragma unroll
    for (int q = 0; q < SPR; q++) sc[q] = 1.0f;
    int64_t cbr = -1; /* the block row sc holds */
    for (int i = 0; i < nst; i++) {
        const int s = i % F8_RT;
        const int64_t r = row_of(i), r0 = r - s;
        const int nr = D - r0 < F8_RT ? (int)(D - r0) : F8_RT; /* block-uniform */
        cp_wait<NS - 1>();                                  /* slot i's group has landed */
        if (s < nr) {
            if (V == V_FP8 && r / w.blk_r != cbr) {
                cbr = r / w.blk_r;
#pragma unroll
                for (int q = 0; q < SPR; q++) {
                    const int64_t v = (int64_t)q * 32 + lane;
                    if (v < upr) sc[q] = scale_at(w, cbr * w.scale_cols + (int64_t)((uint32_t)v / vps));
                }
            }
            float acc = 0.0f;
#pragma unroll
            for (int q = 0; q < SPR; q++) {
                if ((int64_t)q * 32 + lane < upr) {
                    const uint4 u = ring[((i % NS) * SPR + q) * 32];
                    if ((MODE & 1) && V == V_FP8) {
                        const uint32_t qw[4] = {u.x, u.y, u.z, u.w};
                        float t = 0.0f;
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            const float2 lo = fp8x2_f32(qw[k]), hi = fp8x2_f32(qw[k] >> 16);
                            t = fmaf(lo.x, xg[q][4 * k], t), t = fmaf(lo.y, xg[q][4 * k + 1], t);
                            t = fmaf(hi.x, xg[q][4 * k + 2], t), t = fmaf(hi.y, xg[q][4 * k + 3], t);
                        }
                        acc = fmaf(t, sc[q], acc);
                    } else {
#pragma unroll
                        for (int h = 0; h < E / C; h++) {
                            float wv[C];
                            decode<V>(u, h, sc[q], wv);
#pragma unroll
                            for (int k = 0; k < C; k++) acc = fmaf(wv[k], xg[q][h * C + k], acc);
                        }
                    }
                }
            }
            const float sum = warp_sum(acc);
            if (!lane) {
                if (!(MODE & 2)) part[warp][s] = sum;
                y[r] = sum;
            }
        }
        __syncwarp(); /* this lane's reads of slot i before the copy that refills it */
        issue(i + NS);
        if (!(MODE & 2) && s == F8_RT - 1) { /* the group's rows are in part: combine them (block-uniform) */
            __syncthreads();
            moe_comb(part, wr, K, nr, out + r0);
            __syncthreads();
        }
    }
    cp_wait<0>();
}
/* ---- round 15 (DELTAFIN_CUDA_LEAN bit 33554432): the FP8 MoE down launch, a block per row group of every expert ------
 * Why: bench/cuda/moe_down_bench.cu (DeepSeek-V3's routed down, 8 experts x 7168 x 2048 E4M3, the H200, 2026-12-02):
 * k_moe_down_f8's schedule (each warp streams one expert's rows through a ring in shared memory, one row at a time)
 * takes 64-72 us a launch in the model (35-40% of the HBM floor), while a block per 4 rows of every expert, each warp
 * holding its expert's 4 rows whole in registers (every 16-byte load of a lane in flight at once), reads them in
 * 34-35 us (74-76%), with or without persistent blocks; computing the gate in each persistent block first (each warp
 * its expert's 2048 inputs) costs ~9 us of that (43.6 us), so k_gate computes it once, in a launch before this one,
 * into h ([K][I]: gate_apply on the same g and u: the values dn_gate computes). Here: one wave of persistent blocks of
 * K warps taking row groups gr = blockIdx.x, + G, ... (F8_RT rows); warp k: expert k's rows of the group and their
 * scales (scale_ld: scale_at's values), each row's steps q = 0 .. SPR - 1 in order with k_moe_down_f8's arithmetic
 * (A1 = 0: decode<V_FP8>'s product by the scale and an fmaf an element; A1 = 1: bit 8388608's unscaled step sums, one
 * fmaf a step with its scale), warp_sum, y and the block's part; then moe_comb. **k_moe_down_f8's bits** with the
 * same bit 8388608 (each row's chain and the combine are its). The first group's rows are loaded before
 * griddepcontrol.wait (the table and the weights are final then, as k_moe_down_f8's ring), later groups' after the
 * group before's products. The caller checks blk_r % F8_RT == 0 (one scale row a group) and I % 16 == 0. */
template <int SPR, int A1>
__global__ void __launch_bounds__(F8_MAX_K * 32, 2) k_moe_down_c8(const MmBatchT<MM_MAXJ> *b, int K, int ngr, const float *h,
                                                                  const float *wr, float *out) {
    __shared__ float part[2][F8_MAX_K][F8_RT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    pdl_go();
    const MmJob *Jp = &b->j[warp];
    const DW w = dw_ldcg(Jp);
    const int64_t D = w.rows, upr = w.cols / 16;
    const unsigned G = gridDim.x;
    const uint32_t vps = (uint32_t)w.blk_c / 16;
    uint4 u[SPR][F8_RT];
    float sc[SPR];
    auto load = [&](int gr) { /* the group's rows of this warp's expert and their scales: every load of the lane issued */
        const int64_t r0 = (int64_t)gr * F8_RT, srow = (r0 / w.blk_r) * w.scale_cols;
#pragma unroll
        for (int q = 0; q < SPR; q++) {
            const int64_t v = (int64_t)q * 32 + lane;
#pragma unroll
            for (int i = 0; i < F8_RT; i++)
                u[q][i] = v < upr && r0 + i < D ? __ldg((const uint4 *)(w.data + (size_t)(r0 + i) * w.row_bytes) + v) : make_uint4(0, 0, 0, 0);
            sc[q] = v < upr ? scale_ld(w, srow + (int64_t)((uint32_t)v / vps)) : 1.0f;
        }
    };
    int gr = blockIdx.x;
    if (gr < ngr) load(gr);
    pdl_wait();
    const float *x = h + (size_t)warp * (size_t)w.cols; /* this expert's gate(g, u), written by k_gate just before */
    float *y = Jp->y;
    for (int ph = 0; gr < ngr; gr += G, ph ^= 1) {
        const int64_t r0 = (int64_t)gr * F8_RT;
        const int nr = D - r0 < F8_RT ? (int)(D - r0) : F8_RT; /* block-uniform */
        float acc[F8_RT];
#pragma unroll
        for (int i = 0; i < F8_RT; i++) acc[i] = 0.0f;
#pragma unroll
        for (int q = 0; q < SPR; q++) {
            const int64_t v = (int64_t)q * 32 + lane;
            if (v >= upr) continue;
            float xg[16];
            const float4 *xp = (const float4 *)(x + v * 16);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4 f = ld_act(xp + k);
                xg[4 * k] = f.x, xg[4 * k + 1] = f.y, xg[4 * k + 2] = f.z, xg[4 * k + 3] = f.w;
            }
#pragma unroll
            for (int i = 0; i < F8_RT; i++) {
                if (A1) { /* k_moe_down_f8 MODE 1 */
                    const uint32_t qw[4] = {u[q][i].x, u[q][i].y, u[q][i].z, u[q][i].w};
                    float t = 0.0f;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float2 lo = fp8x2_f32(qw[k]), hi = fp8x2_f32(qw[k] >> 16);
                        t = fmaf(lo.x, xg[4 * k], t), t = fmaf(lo.y, xg[4 * k + 1], t);
                        t = fmaf(hi.x, xg[4 * k + 2], t), t = fmaf(hi.y, xg[4 * k + 3], t);
                    }
                    acc[i] = fmaf(t, sc[q], acc[i]);
                } else { /* k_moe_down_f8 MODE 0 */
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        float wv[8];
                        decode<V_FP8>(u[q][i], hh, sc[q], wv);
#pragma unroll
                        for (int k = 0; k < 8; k++) acc[i] = fmaf(wv[k], xg[hh * 8 + k], acc[i]);
                    }
                }
            }
        }
        if (gr + (int)G < ngr) load(gr + (int)G); /* the next group's rows in flight during the sums and the combine */
#pragma unroll
        for (int i = 0; i < F8_RT; i++) {
            const float t = warp_sum(acc[i]);
            if (!lane && i < nr) part[ph][warp][i] = t, y[r0 + i] = t;
        }
        __syncthreads(); /* part[ph] complete; part[ph ^ 1]'s readers of the group before passed the barrier too */
        moe_comb(part[ph], wr, K, nr, out + r0);
    }
}
/* blocks an SM of k_moe_down_f8<V_FP8, SPR, NS> for K warps and its ring (the occupancy API, asked once per K; 1 if it fails) */
template <int SPR, int NS = F8_NS, int MODE = 0> static int f8_occ(int K, size_t smem) {
    static int occ[FUSED_MAX_K + 1];
    if (!occ[K]) {
        int v = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k_moe_down_f8<V_FP8, SPR, NS, MODE>, 32 * K, smem) != cudaSuccess || v <= 0) cudaGetLastError(), v = 1;
        occ[K] = v;
    }
    return occ[K];
}
/* blocks an SM of k_moe_down_c8<SPR, A1> for K warps (asked once per K; 1 if it fails) */
template <int SPR, int A1> static int c8_occ(int K) {
    static int occ[F8_MAX_K + 1];
    if (!occ[K]) {
        int v = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k_moe_down_c8<SPR, A1>, 32 * K, 0) != cudaSuccess || v <= 0) cudaGetLastError(), v = 1;
        occ[K] = v;
    }
    return occ[K];
}
__global__ void k_gate(float *o, const float *g, const float *u, size_t n, int kind, float p0, float p1); /* cuda_ops.cu */
static int64_t g_moe_down_c8;
extern "C" int64_t df_cuda_moe_down_c8_launches(void) { return g_moe_down_c8; }
static int64_t g_moe_down_f8, g_gu_f8, g_moe_down_f8s, g_moe_down_f8c;
extern "C" int64_t df_cuda_moe_down_f8_launches(void) { return g_moe_down_f8; }
extern "C" int64_t df_cuda_moe_down_f8_step_launches(void) { return g_moe_down_f8s; }
extern "C" int64_t df_cuda_moe_down_f8_comb_launches(void) { return g_moe_down_f8c; }
extern "C" int64_t df_cuda_moe_gu_f8_launches(void) { return g_gu_f8; }
static int64_t g_gu_f8r;
extern "C" int64_t df_cuda_moe_gu_f8r_launches(void) { return g_gu_f8r; }
static int64_t g_route_fast, g_moe_down_sh, g_moe_down_cp, g_moe_rt;
extern "C" int64_t df_cuda_moe_rt_launches(void) { return g_moe_rt; }
extern "C" int64_t df_cuda_moe_down_sh_launches(void) { return g_moe_down_sh; }
extern "C" int64_t df_cuda_moe_down_cp_launches(void) { return g_moe_down_cp; }
extern "C" int64_t df_cuda_route_fast_launches(void) { return g_route_fast; }
/* the weights, and the job tables of the two product launches (one warp) */
static __device__ void route_tables(const RouteK &p, const int *ids, const float *wk, int lane) {
    const int K = p.k;
    for (int j = lane; j < K; j += 32) {
        const int e = ids[j];
        p.w[j] = wk[j];
        if (p.ids_out) p.ids_out[j] = e;
        MmJob *g = &p.fd->gu.j[2 * j], *u = &p.fd->gu.j[2 * j + 1], *dn = &p.fd->dn.j[j];
        g->w = p.tab[3 * e], g->x = p.x, g->y = p.g + (size_t)j * p.I, g->vec = p.vec_gu, g->wk = p.wk_gu, g->blk0 = (unsigned)(2 * j) * p.nb_gu;
        u->w = p.tab[3 * e + 1], u->x = p.x, u->y = p.u + (size_t)j * p.I, u->vec = p.vec_gu, u->wk = p.wk_gu, u->blk0 = (unsigned)(2 * j + 1) * p.nb_gu;
        dn->w = p.tab[3 * e + 2], dn->x = p.g + (size_t)j * p.I, dn->y = p.d + (size_t)j * p.D, dn->vec = p.vec_dn, dn->wk = p.wk_dn, dn->blk0 = (unsigned)j * p.nb_dn;
    }
    if (!lane) p.fd->gu.nj = 2 * K, p.fd->gu.n = 1, p.fd->gu.t0 = 0, p.fd->gu.pf = 0, p.fd->dn.nj = K, p.fd->dn.n = 1, p.fd->dn.t0 = 0, p.fd->dn.pf = 0;
}
template <int MJ, int U> static void mm_launch_dev(const MmBatchT<MJ> *b, int vec, unsigned blocks) {
    const dim3 grid(blocks, 1), th(MM_WARPS * 32);
    switch (vec) {
    case V_F32: launch_k(k_mm_dev<V_F32, 1, MM_WARPS, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_F16: launch_k(k_mm_dev<V_F16, 1, MM_WARPS, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_BF16: launch_k(k_mm_dev<V_BF16, 1, MM_WARPS, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_FP8: launch_k(k_mm_dev<V_FP8, 1, MM_WARPS, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_INT4: launch_k(k_mm_dev<V_INT4, 1, MM_WARPS, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_I8ROW: launch_k(k_mm_dev<V_I8ROW, 1, MM_WARPS, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    case V_MXFP4: launch_k(k_mm_dev<V_MXFP4, 1, MM_WARPS, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    default: launch_k(k_mm_dev<V_GENERIC, 1, MM_WARPS, MJ, U>, dim3(grid), dim3(th), 0, b); break;
    }
    post("moe_fused");
    g_mm_launches++;
}
static unsigned blocks_of(const DW &d, int wk) {
    const int per_block = MM_WARPS / wk * MM_R;
    return (unsigned)((d.rows + per_block - 1) / per_block);
}

static int g_moe_u = -1; /* DELTAFIN_CUDA_MOE_U=1, 2 or 4: the gate/up launch's U (a measurement aid; default as deep_u) */
static int64_t g_moe_launches;
extern "C" int64_t df_cuda_moe_launches(void) { return g_moe_launches; }

int g_moe_fused(const df_moe_fused_args *a) {
    LOCK();
    const df_route_args *r = &a->route;
    const int E = r->n_experts, K = r->k, D = a->D, I = a->I;
    if (r->n != 1 || K <= 0 || K > E || K > FUSED_MAX_K || 2 * K > MM_MAXJ || E > FUSED_MAX_E || D <= 0 || I <= 0 ||
        a->gate < 0 || a->gate >= DF_GATE_N || r->kind < 0 || r->kind >= DF_ROUTE_N)
        return 1;
    if (r->kind == DF_ROUTE_SIGMOID_GROUPS && (r->n_group <= 0 || E % r->n_group || !r->bias || r->topk_group <= 0 || r->topk_group > r->n_group ||
                                               (int64_t)r->topk_group * (E / r->n_group) < K))
        return 1;
    const DW *h0 = NULL, *tab = moe_table(a->layer, E, &h0);
    if (!tab) return 1;
    const DW &gw = h0[0], &uw = h0[1], &dw = h0[2];
    if (gw.rows != I || gw.cols != D || !(uw.rows == I && uw.cols == D) || dw.rows != D || dw.cols != I) return 1;
    const float *x = DCP(a->x), *g = DCP(a->g);
    const int vec_gu = vec_kind(gw, x), vec_dn = vec_kind(dw, g);
    /* one launch per projection: one decoder and one row split for every job (vec_kind sees the inputs' alignment) */
    if (vec_kind(uw, x) != vec_gu || split_of(uw, vec_gu) != split_of(gw, vec_gu) || (K > 1 && vec_kind(dw, g + I) != vec_dn)) return 1;
    RouteK p;
    p.h = NULL, p.ga = (GateIn){0, 0, 0.0f, 0.0f};
    p.kind = (int)r->kind, p.E = E, p.k = K, p.norm = r->norm_topk, p.G = r->kind == DF_ROUTE_SIGMOID_GROUPS ? r->n_group : 0;
    p.topk_group = r->topk_group, p.scaling = r->scaling;
    p.logits = DCP(r->logits), p.bias = NULL;
    if (p.G && !(p.bias = param(r->bias, (size_t)E, S_P0, "moe_fused"))) return DF_ENOMEM;
    p.w = DP(r->w), p.ids_out = a->ids_out ? (int *)(void *)a->ids_out : NULL;
    p.tab = tab, p.x = x, p.g = DP(a->g), p.u = DP(a->u), p.d = DP(a->d), p.D = D, p.I = I;
    p.vec_gu = vec_gu, p.wk_gu = split_of(gw, vec_gu), p.vec_dn = vec_dn, p.wk_dn = split_of(dw, vec_dn);
    p.nb_gu = blocks_of(gw, p.wk_gu), p.nb_dn = blocks_of(dw, p.wk_dn);
    if (!(p.fd = (FusedDev *)slot(S_MOE, sizeof(FusedDev), "moe_fused"))) return DF_ENOMEM;
    const size_t smem = (size_t)3 * E * sizeof(float) + (size_t)(p.G > 0 ? p.G : 1) * sizeof(float) + (size_t)E + (size_t)(p.G > 0 ? p.G : 1) + 16;
    const unsigned bgu = 2 * (unsigned)K * p.nb_gu, bdn = (unsigned)K * p.nb_dn;
    int ugu = lean_mask() & 4 ? deep_u(bgu) : 1, udn = lean_mask() & 4 ? deep_u(bdn) : 1;
    if (g_moe_u < 0) {
        const char *e = getenv("DELTAFIN_CUDA_MOE_U");
        g_moe_u = e && *e ? atoi(e) : 0;
    }
    if (g_moe_u == 1 || g_moe_u == 2 || g_moe_u == 4) ugu = g_moe_u;
    /* round 10 (bit 8192, with bits 8, 64 and 2048's launches): the route inside the two product launches */
    if ((lean_mask() & (8192 | 64 | 8 | 2048)) == (8192 | 64 | 8 | 2048) && p.kind == DF_ROUTE_SOFTMAX_TOPK && E <= 32 * RS_V && K >= 2 && p.wk_dn == 1 &&
        (vec_dn == V_F32 || vec_dn == V_F16 || vec_dn == V_BF16)) {
        const int64_t Edn = vec_dn == V_F32 ? 4 : 8;
        const int spr = (int)((I / Edn + 31) / 32);
        const size_t cpb = (size_t)K * DN_RT * (size_t)spr * 512;
        const void *krt = NULL;
        if (spr >= 1 && spr <= 4) {
            krt = dn_rt_k<0>(vec_dn, spr);
            if (smem_optin(krt, cpb)) krt = NULL;
        }
        /* round 17 (bit 268435456): the gate once, by the gate/up launch (k_guh_rt; wk 1 rows only), into K x I floats */
        p.h = NULL, p.ga = (GateIn){(long long)(DCP(a->u) - DCP(a->g)), (int)a->gate, a->p0, a->p1};
        const void *kh = NULL;
        static int hcg = -1; /* DELTAFIN_CUDA_H_CG=0: the down launch reads h through the read-only path (ld.global.nc),
                                * which round 18's A/B showed reading stale h (a diagnosis aid: shows the hazard) */
        if (hcg < 0) {
            const char *e = getenv("DELTAFIN_CUDA_H_CG");
            hcg = !(e && !strcmp(e, "0"));
            if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
                fprintf(stderr, "deltafin: cuda backend: DELTAFIN_CUDA_H_CG=%s is not 0 or 1: 1 (h through L2 only)\n", e);
        }
        if (krt && (lean_mask() & 268435456) && p.wk_gu == 1) {
            kh = hcg ? dn_rt_k<2>(vec_dn, spr) : dn_rt_k<1>(vec_dn, spr);
            if (smem_optin(kh, cpb) || !(p.h = (float *)slot(S_MOEH, (size_t)K * I * sizeof(float), "moe_fused"))) kh = NULL, p.h = NULL;
        }
        if (krt) {
            const int gh = kh != NULL; /* round 17: k_guh_rt and the down launch reading h */
            {
                ProfScope ps("moe_fused.gate_up");
                const dim3 grid(gh ? (unsigned)K * (unsigned)((I + GH_ROWS - 1) / GH_ROWS) : bgu, 1), th(MM_WARPS * 32);
                switch (vec_gu * 8 + ugu) {
#define GU_RT(VV) \
    case VV * 8 + 1: gh ? launch_k(k_guh_rt<VV, 1>, dim3(grid), dim3(th), 0, p) : launch_k(k_gu_rt<VV, 1>, dim3(grid), dim3(th), 0, p); break; \
    case VV * 8 + 2: gh ? launch_k(k_guh_rt<VV, 2>, dim3(grid), dim3(th), 0, p) : launch_k(k_gu_rt<VV, 2>, dim3(grid), dim3(th), 0, p); break; \
    case VV * 8 + 4: gh ? launch_k(k_guh_rt<VV, 4>, dim3(grid), dim3(th), 0, p) : launch_k(k_gu_rt<VV, 4>, dim3(grid), dim3(th), 0, p); break
                    GU_RT(V_GENERIC); GU_RT(V_F32); GU_RT(V_F16); GU_RT(V_BF16); GU_RT(V_FP8); GU_RT(V_INT4); GU_RT(V_I8ROW); GU_RT(V_MXFP4);
#undef GU_RT
                default: break; /* unreachable: ugu is 1, 2 or 4 */
                }
                post("moe_fused");
            }
            {
                ProfScope ps("moe_fused.down_comb");
                const unsigned nbr = (unsigned)((D + DN_RT - 1) / DN_RT);
                float *out = DP(a->out);
                switch (vec_dn * 8 + spr) {
#define DN_RTL(VV, S) \
    case VV * 8 + S: \
        !gh ? launch_k(k_moe_down_rt<VV, S, DN_RT>, dim3(nbr), dim3(32 * K), cpb, p, p.ga, out) \
            : hcg ? launch_k(k_moe_down_rt<VV, S, DN_RT, 2>, dim3(nbr), dim3(32 * K), cpb, p, p.ga, out) \
                  : launch_k(k_moe_down_rt<VV, S, DN_RT, 1>, dim3(nbr), dim3(32 * K), cpb, p, p.ga, out); \
        break
                    DN_RTL(V_F32, 1); DN_RTL(V_F32, 2); DN_RTL(V_F32, 3); DN_RTL(V_F32, 4);
                    DN_RTL(V_F16, 1); DN_RTL(V_F16, 2); DN_RTL(V_F16, 3); DN_RTL(V_F16, 4);
                    DN_RTL(V_BF16, 1); DN_RTL(V_BF16, 2); DN_RTL(V_BF16, 3); DN_RTL(V_BF16, 4);
#undef DN_RTL
                default: break; /* unreachable: krt is set for these only */
                }
                post("moe_fused");
            }
            g_moe_rt++, g_moe_guh += gh, g_moe_launches += 2, g_mm_launches += 2;
            moe_count_hits(3 * (int64_t)K);
            return 0;
        }
    }
    {
        ProfScope ps("moe_fused.route");
        if ((lean_mask() & 64) && p.kind == DF_ROUTE_SOFTMAX_TOPK && E <= 32 * RS_V) launch_k(k_route_soft, dim3(1), dim3(64), 0, p), g_route_fast++;
        else launch_k(k_route_fused, dim3(1), dim3(32), smem, p);
        post("moe_fused");
        g_moe_launches++;
    }
    {
        ProfScope ps("moe_fused.gate_up");
        const uint32_t gvps = (uint32_t)gw.blk_c / 16; /* round 13 (bit 1048576): FP8 gate/up rows read whole by one warp (wk 1) */
        const int gsf = gw.sdt == DF_SCALE_F32 && !((uintptr_t)gw.scale & 3) && gw.blk_r % MM_R == 0 && gvps && !(gvps & (gvps - 1));
        if ((lean_mask() & 1048576) && vec_gu == V_FP8 && p.wk_gu == 1) {
            const dim3 grid(bgu, 1), th(MM_WARPS * 32);
            gsf ? launch_k(k_mm_devf8<1, 2>, dim3(grid), dim3(th), 0, (const MmBatchT<MM_MAXJ> *)&p.fd->gu)
                : launch_k(k_mm_devf8<0, 2>, dim3(grid), dim3(th), 0, (const MmBatchT<MM_MAXJ> *)&p.fd->gu);
            post("moe_fused");
            g_mm_launches++, g_gu_f8r++;
        } else if ((lean_mask() & 262144) && vec_gu == V_FP8 && ugu <= 2) { /* round 12: FP8 gate/up at 2 blocks an SM, no spills */
            const dim3 grid(bgu, 1), th(MM_WARPS * 32);
            ugu == 2 ? launch_k(k_mm_dev2<V_FP8, 1, MM_WARPS, MM_MAXJ, 2>, dim3(grid), dim3(th), 0, (const MmBatchT<MM_MAXJ> *)&p.fd->gu)
                     : launch_k(k_mm_dev2<V_FP8, 1, MM_WARPS, MM_MAXJ, 1>, dim3(grid), dim3(th), 0, (const MmBatchT<MM_MAXJ> *)&p.fd->gu);
            post("moe_fused");
            g_mm_launches++, g_gu_f8++;
        } else
            ugu == 4 ? mm_launch_dev<MM_MAXJ, 4>(&p.fd->gu, vec_gu, bgu) : ugu == 2 ? mm_launch_dev<MM_MAXJ, 2>(&p.fd->gu, vec_gu, bgu) : mm_launch_dev<MM_MAXJ, 1>(&p.fd->gu, vec_gu, bgu);
        g_moe_launches++;
    }
    if ((lean_mask() & 8) && p.wk_dn == 1) { /* round 6: gate, down products and combine in one launch */
        ProfScope ps("moe_fused.down_comb");
        const GateIn ga = {(long long)(DCP(a->u) - DCP(a->g)), (int)a->gate, a->p0, a->p1};
        /* U: every 16-byte step of a lane's rows loaded at once when it has at most 4 (here I = 768 BF16: 3) */
        const int64_t E = vec_dn == V_F32 ? 4 : vec_dn == V_F16 || vec_dn == V_BF16 ? 8 : vec_dn == V_FP8 || vec_dn == V_I8ROW ? 16 : vec_dn == V_GENERIC ? 1 : 32;
        const int64_t steps = (I / E + 31) / 32;
        const int u = vec_dn == V_GENERIC ? 1 : steps <= 1 ? 1 : steps <= 2 ? 2 : 4;
        const unsigned nb = (unsigned)((D + MM_R - 1) / MM_R);
        const float *wr = DCP(r->w);
        float *out = DP(a->out);
        /* bit 2048 (round 9): the rows streamed through cp.async, the gate once per lane in registers (F32, F16, BF16
         * rows of at most 4 warp steps: I = 768 BF16 is 3); DN_RT rows per block, all in flight at once */
        const int spr = (int)((I / E + 31) / 32);
        const size_t cpb = (size_t)K * DN_RT * (size_t)spr * 512;
        const void *kcp = NULL;
        if ((lean_mask() & 2048) && (vec_dn == V_F32 || vec_dn == V_F16 || vec_dn == V_BF16) && spr >= 1 && spr <= 4) {
#define DN_CP_K(VV) (spr == 1 ? (const void *)k_moe_down_cp<VV, 1, DN_RT> : spr == 2 ? (const void *)k_moe_down_cp<VV, 2, DN_RT> : spr == 3 ? (const void *)k_moe_down_cp<VV, 3, DN_RT> : (const void *)k_moe_down_cp<VV, 4, DN_RT>)
            kcp = vec_dn == V_F32 ? DN_CP_K(V_F32) : vec_dn == V_F16 ? DN_CP_K(V_F16) : DN_CP_K(V_BF16);
#undef DN_CP_K
            if (smem_optin(kcp, cpb)) kcp = NULL;
        }
        /* bit 65536 (round 12): FP8 rows (I / 16 / 32 at most 4 warp steps: I = 2048 is 4) through k_moe_down_f8 */
        const void *kf8 = NULL;
        static int f8ns = -1; /* DELTAFIN_CUDA_F8_NS=6 or 8 (a measurement aid; I = 2048 FP8 rows, SPR 4): rows in flight a warp */
        if (f8ns < 0) f8ns = getenv("DELTAFIN_CUDA_F8_NS") ? atoi(getenv("DELTAFIN_CUDA_F8_NS")) : F8_NS;
        const int ns = spr == 4 && (f8ns == 6 || f8ns == 8) ? f8ns : F8_NS;
        const size_t f8b = (size_t)K * ns * (size_t)spr * 512;
        /* round 14 (I = 2048 FP8 rows, the default ring): bit 8388608 one scale product a step, bit 16777216 the combine after */
        const int fmode = spr == 4 && ns == F8_NS ? ((lean_mask() & 8388608) ? 1 : 0) | ((lean_mask() & 16777216) ? 2 : 0) : 0;
        if ((lean_mask() & 65536) && vec_dn == V_FP8 && K <= F8_MAX_K && spr >= 1 && spr <= 4) {
            kf8 = fmode == 1 ? (const void *)k_moe_down_f8<V_FP8, 4, F8_NS, 1> : fmode == 2 ? (const void *)k_moe_down_f8<V_FP8, 4, F8_NS, 2>
                : fmode == 3 ? (const void *)k_moe_down_f8<V_FP8, 4, F8_NS, 3>
                : spr == 1 ? (const void *)k_moe_down_f8<V_FP8, 1> : spr == 2 ? (const void *)k_moe_down_f8<V_FP8, 2> : spr == 3 ? (const void *)k_moe_down_f8<V_FP8, 3>
                : ns == 6 ? (const void *)k_moe_down_f8<V_FP8, 4, 6> : ns == 8 ? (const void *)k_moe_down_f8<V_FP8, 4, 8> : (const void *)k_moe_down_f8<V_FP8, 4>;
            if (smem_optin(kf8, f8b)) kf8 = NULL;
        }
        /* bit 128: the gate once per block into shared memory (K x I floats within the default 48 KiB), 2 row groups per block */
        const size_t shb = (size_t)K * I * sizeof(float);
        /* round 15 (bit 33554432): k_moe_down_c8 in place of k_moe_down_f8, its bits (A1: bit 8388608's arithmetic where
         * that launch would take it); not with bit 16777216's launch without its combine */
        float *hbuf = NULL;
        const int a1 = fmode & 1;
        if (kf8 && (lean_mask() & 33554432) && !(fmode & 2) && !(I % 16) && dw.blk_r > 0 && !(dw.blk_r % F8_RT) && dw.blk_c >= 16 &&
            !(dw.blk_c % 16))
            hbuf = (float *)slot(S_MOEH, (size_t)K * I * sizeof(float), "moe_fused"); /* K x I floats (NULL: k_moe_down_f8 instead) */
        if (hbuf) {
            /* the gate of every chosen expert's input, once (k_gate: gate_apply, the values k_moe_down_f8 computes) */
            launch_k(k_gate, dim3(blocks_for((size_t)K * I, 256)), dim3(256), 0, hbuf, (const float *)DCP(a->g), (const float *)DCP(a->u),
                     (size_t)K * I, (int)a->gate, a->p0, a->p1);
            post("moe_fused");
            const int ngr = (D + F8_RT - 1) / F8_RT;
            const int occ = spr == 1 ? (a1 ? c8_occ<1, 1>(K) : c8_occ<1, 0>(K)) : spr == 2 ? (a1 ? c8_occ<2, 1>(K) : c8_occ<2, 0>(K))
                          : spr == 3 ? (a1 ? c8_occ<3, 1>(K) : c8_occ<3, 0>(K)) : (a1 ? c8_occ<4, 1>(K) : c8_occ<4, 0>(K));
            const uint64_t cap = (uint64_t)sms() * (uint64_t)occ;
            const unsigned G = (uint64_t)ngr < cap ? (unsigned)ngr : (unsigned)cap;
            switch (spr * 2 + a1) {
#define DN_C8(S, A) case S * 2 + A: launch_k(k_moe_down_c8<S, A>, dim3(G), dim3(32 * K), 0, &p.fd->dn, K, ngr, (const float *)hbuf, wr, out); break
                DN_C8(1, 0); DN_C8(1, 1); DN_C8(2, 0); DN_C8(2, 1); DN_C8(3, 0); DN_C8(3, 1); DN_C8(4, 0); DN_C8(4, 1);
#undef DN_C8
            default: break; /* unreachable: spr is 1..4 */
            }
            g_moe_down_c8++;
            if (a1) g_moe_down_f8s++;
        } else if (kf8) {
            const int ngr = (D + F8_RT - 1) / F8_RT;
            const int occ = fmode == 1 ? f8_occ<4, F8_NS, 1>(K, f8b) : fmode == 2 ? f8_occ<4, F8_NS, 2>(K, f8b) : fmode == 3 ? f8_occ<4, F8_NS, 3>(K, f8b)
                          : spr == 1 ? f8_occ<1>(K, f8b) : spr == 2 ? f8_occ<2>(K, f8b) : spr == 3 ? f8_occ<3>(K, f8b)
                          : ns == 6 ? f8_occ<4, 6>(K, f8b) : ns == 8 ? f8_occ<4, 8>(K, f8b) : f8_occ<4>(K, f8b);
            const uint64_t cap = (uint64_t)sms() * (uint64_t)occ;
            const unsigned G = (uint64_t)ngr < cap ? (unsigned)ngr : (unsigned)cap;
            switch (spr) {
#define DN_F8(S) case S: launch_k(k_moe_down_f8<V_FP8, S>, dim3(G), dim3(32 * K), f8b, &p.fd->dn, K, ngr, ga, wr, out); break
                DN_F8(1); DN_F8(2); DN_F8(3);
            case 4:
                if (fmode == 1) launch_k(k_moe_down_f8<V_FP8, 4, F8_NS, 1>, dim3(G), dim3(32 * K), f8b, &p.fd->dn, K, ngr, ga, wr, out);
                else if (fmode == 2) launch_k(k_moe_down_f8<V_FP8, 4, F8_NS, 2>, dim3(G), dim3(32 * K), f8b, &p.fd->dn, K, ngr, ga, wr, out);
                else if (fmode == 3) launch_k(k_moe_down_f8<V_FP8, 4, F8_NS, 3>, dim3(G), dim3(32 * K), f8b, &p.fd->dn, K, ngr, ga, wr, out);
                else if (ns == 6) launch_k(k_moe_down_f8<V_FP8, 4, 6>, dim3(G), dim3(32 * K), f8b, &p.fd->dn, K, ngr, ga, wr, out);
                else if (ns == 8) launch_k(k_moe_down_f8<V_FP8, 4, 8>, dim3(G), dim3(32 * K), f8b, &p.fd->dn, K, ngr, ga, wr, out);
                else launch_k(k_moe_down_f8<V_FP8, 4>, dim3(G), dim3(32 * K), f8b, &p.fd->dn, K, ngr, ga, wr, out);
                break;
#undef DN_F8
            default: break; /* unreachable: kf8 is set for these only */
            }
            g_moe_down_f8++;
            if (fmode & 1) g_moe_down_f8s++;
            if (fmode & 2) g_moe_combine(a->out, a->d, r->w, 1, K, D), g_moe_down_f8c++;
        } else if (kcp) {
            const unsigned nbr = (unsigned)((D + DN_RT - 1) / DN_RT);
            switch (vec_dn * 8 + spr) {
#define DN_CP(VV, S) case VV * 8 + S: launch_k(k_moe_down_cp<VV, S, DN_RT>, dim3(nbr), dim3(32 * K), cpb, &p.fd->dn, K, ga, wr, out); break
                DN_CP(V_F32, 1); DN_CP(V_F32, 2); DN_CP(V_F32, 3); DN_CP(V_F32, 4);
                DN_CP(V_F16, 1); DN_CP(V_F16, 2); DN_CP(V_F16, 3); DN_CP(V_F16, 4);
                DN_CP(V_BF16, 1); DN_CP(V_BF16, 2); DN_CP(V_BF16, 3); DN_CP(V_BF16, 4);
#undef DN_CP
            default: break; /* unreachable: kcp is set for these only */
            }
            g_moe_down_cp++;
        } else if ((lean_mask() & 128) && shb <= 48 * 1024 && !(I % 4) && vec_dn != V_GENERIC) {
            const unsigned nb2 = (nb + 1) / 2;
            switch (vec_dn) {
#define MOE_DOWN_SH(VV) u == 4 ? launch_k(k_moe_down_sh<VV, 4, 2>, dim3(nb2), dim3(32 * K), shb, &p.fd->dn, K, I, ga, wr, out) : u == 2 ? launch_k(k_moe_down_sh<VV, 2, 2>, dim3(nb2), dim3(32 * K), shb, &p.fd->dn, K, I, ga, wr, out) : launch_k(k_moe_down_sh<VV, 1, 2>, dim3(nb2), dim3(32 * K), shb, &p.fd->dn, K, I, ga, wr, out)
            case V_F32: MOE_DOWN_SH(V_F32); break;
            case V_F16: MOE_DOWN_SH(V_F16); break;
            case V_BF16: MOE_DOWN_SH(V_BF16); break;
            case V_FP8: MOE_DOWN_SH(V_FP8); break;
            case V_INT4: MOE_DOWN_SH(V_INT4); break;
            case V_I8ROW: MOE_DOWN_SH(V_I8ROW); break;
            default: MOE_DOWN_SH(V_MXFP4); break;
#undef MOE_DOWN_SH
            }
            g_moe_down_sh++;
        } else
        switch (vec_dn) {
#define MOE_DOWN(VV) u == 4 ? launch_k(k_moe_down<VV, 4>, dim3(nb), dim3(32 * K), 0, &p.fd->dn, K, ga, wr, out) : u == 2 ? launch_k(k_moe_down<VV, 2>, dim3(nb), dim3(32 * K), 0, &p.fd->dn, K, ga, wr, out) : launch_k(k_moe_down<VV, 1>, dim3(nb), dim3(32 * K), 0, &p.fd->dn, K, ga, wr, out)
        case V_F32: MOE_DOWN(V_F32); break;
        case V_F16: MOE_DOWN(V_F16); break;
        case V_BF16: MOE_DOWN(V_BF16); break;
        case V_FP8: MOE_DOWN(V_FP8); break;
        case V_INT4: MOE_DOWN(V_INT4); break;
        case V_I8ROW: MOE_DOWN(V_I8ROW); break;
        case V_MXFP4: MOE_DOWN(V_MXFP4); break;
        default: launch_k(k_moe_down<V_GENERIC, 1>, dim3(nb), dim3(32 * K), 0, &p.fd->dn, K, ga, wr, out); break;
#undef MOE_DOWN
        }
        post("moe_fused");
        g_mm_launches++, g_moe_launches++;
    } else {
        g_gate(a->g, a->g, a->u, (size_t)K * I, a->gate, a->p0, a->p1);
        {
            ProfScope ps("moe_fused.down");
            udn == 4 ? mm_launch_dev<MM_MAXJ, 4>(&p.fd->dn, vec_dn, bdn) : udn == 2 ? mm_launch_dev<MM_MAXJ, 2>(&p.fd->dn, vec_dn, bdn) : mm_launch_dev<MM_MAXJ, 1>(&p.fd->dn, vec_dn, bdn);
        }
        g_moe_combine(a->out, a->d, r->w, 1, K, D);
        g_moe_launches += 3;
    }
    moe_count_hits(3 * (int64_t)K);
    return 0;
}
