/* cuda_mm.cu - the CUDA backend's products (matmul_batch), in two regimes.
 *
 * Decode (n < MM_GEMM_MIN_N tokens): a warp per output row, 8 rows per
 * block, and the jobs of a batch in ONE launch per weight decoder (the job
 * table travels as a kernel parameter, no copy; a MoE batch is one format). Each lane reads the stored row with 16-byte
 * loads, decodes the 8..32 elements of a load exactly (as the CPU decoders:
 * BF16/F16/F32 are exact conversions, FP8 E4M3 and E2M1 by bit assembly,
 * INT4/I8 as integers, times the stored scale), and uses them for up to
 * MM_TN tokens (x is read through L1, shared by the block's warps), then the
 * warp reduces. Weights whose rows are not 16-byte aligned, GGML block types
 * and partial scale groups take the generic path: the same warp-per-row
 * kernel decoding element by element (wget). f32 accumulation throughout.
 *
 * Prefill (n >= MM_GEMM_MIN_N): the weight is dequantized exactly to an f32
 * slab (rows in chunks of at most MM_SLAB_FLOATS floats) and multiplied by
 * cuBLAS SGEMM in f32 (the default math mode: no TF32), so the result is
 * an f32 product of exactly the stored values (docs/PERFORMANCE.md gives
 * the measured error and rates). Without cuBLAS (handle creation failed)
 * the decode kernel runs over tiles of MM_TN tokens instead.
 *
 * Either way each output row is computed the same way whatever the batch,
 * so grouping jobs does not change bits. */
#include "backend/cuda/cuda_int.cuh"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#define MM_TN 8            /* tokens per warp pass */
#define MM_WARPS 8         /* rows (warps) per block */
#define MM_MAXJ 24         /* jobs per launch (the table is a kernel parameter, < 4 KiB) */
#define MM_GEMM_MIN_N 32   /* from this many tokens: dequantize + SGEMM */
#define MM_SLAB_FLOATS ((size_t)64 << 20) /* 256 MiB of f32 weight per SGEMM chunk */

enum { V_GENERIC, V_F32, V_F16, V_BF16, V_FP8, V_INT4, V_I8ROW, V_MXFP4 };

struct MmJob {
    DW w;
    const float *x;
    float *y;
    int vec;           /* V_*: the decoder of the 16-byte path, or V_GENERIC */
    unsigned blk0;     /* first block of this job in the launch */
};
struct MmBatch {
    MmJob j[MM_MAXJ];
    int nj, n;         /* jobs, tokens of this launch (<= MM_TN) */
    int t0;            /* first token of this launch (grid.y tiles add to it) */
};

/* ---- exact decoders of 16 stored bytes ---------------------------------------------- */
static __device__ __forceinline__ float fp8_fast(uint32_t b) { /* E4M3FN, as fp8f */
    const uint32_t em = b & 0x7f, s = (b & 0x80) << 24;
    float v;
    if (em == 0x7f) v = __int_as_float(0x7fc00000);
    else if (em >= 8) v = __uint_as_float((em + (120u << 3)) << 20);
    else v = (float)em * 0.001953125f; /* m * 2^-9, exact */
    return __uint_as_float(__float_as_uint(v) | s);
}
static __device__ __forceinline__ float e2m1_fast(uint32_t code) { /* as e2m1f */
    const uint32_t e = (code >> 1) & 3, m = code & 1, s = (code & 8) << 28;
    const uint32_t bits = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | s);
}

/* acc[t] += sum_i w_i * x[t][c0 + i] over the E elements in wv */
template <int NT, int E> static __device__ __forceinline__ void fma_tokens(float (&acc)[NT], const float (&wv)[E], const float *x, int64_t K,
                                                                           int64_t c0, int nt) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < nt) {
            const float4 *xp = (const float4 *)(x + (int64_t)t * K + c0);
            float s = acc[t];
#pragma unroll
            for (int q = 0; q < E / 4; q++) {
                const float4 xv = __ldg(xp + q);
                s = fmaf(wv[4 * q], xv.x, s);
                s = fmaf(wv[4 * q + 1], xv.y, s);
                s = fmaf(wv[4 * q + 2], xv.z, s);
                s = fmaf(wv[4 * q + 3], xv.w, s);
            }
            acc[t] = s;
        }
    }
}

/* One row r of job J for tokens [0, nt) of x (already offset to the tile). */
template <int V, int NT> static __device__ __forceinline__ void row_dot(const MmJob &J, int64_t r, const float *x, int nt, float (&acc)[NT]) {
    const DW &w = J.w;
    const int lane = threadIdx.x & 31;
    const int64_t K = w.cols;
    const uint4 *row = (const uint4 *)(w.data + (size_t)r * w.row_bytes);
    if (V == V_GENERIC) {
        for (int64_t c = lane; c < K; c += 32) {
            const float wv[4] = {wget(w, r, c), 0, 0, 0};
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) acc[t] = fmaf(wv[0], __ldg(x + (int64_t)t * K + c), acc[t]);
        }
        return;
    }
    constexpr int E = V == V_F32 ? 4 : V == V_F16 || V == V_BF16 ? 8 : V == V_FP8 || V == V_I8ROW ? 16 : 32; /* elements per 16 bytes */
    const int64_t nv = K / E;
    float rs = 0.0f;
    if (V == V_I8ROW) rs = scale_at(w, r);
    for (int64_t v = lane; v < nv; v += 32) {
        const uint4 u = __ldg(row + v);
        const uint32_t q[4] = {u.x, u.y, u.z, u.w};
        const int64_t c0 = v * E;
        if (V == V_F32) {
            const float wv[4] = {__uint_as_float(q[0]), __uint_as_float(q[1]), __uint_as_float(q[2]), __uint_as_float(q[3])};
            fma_tokens<NT, 4>(acc, wv, x, K, c0, nt);
        } else if (V == V_BF16 || V == V_F16) {
            float wv[8];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (V == V_BF16) wv[2 * i] = __uint_as_float(q[i] << 16), wv[2 * i + 1] = __uint_as_float(q[i] & 0xffff0000u);
                else
                    wv[2 * i] = __half2float(__ushort_as_half((unsigned short)(q[i] & 0xffff))),
                    wv[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(q[i] >> 16)));
            }
            fma_tokens<NT, 8>(acc, wv, x, K, c0, nt);
        } else if (V == V_FP8 || V == V_I8ROW) {
            const float s = V == V_FP8 ? scale_at(w, (r / w.blk_r) * w.scale_cols + c0 / w.blk_c) : rs;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float wv[8];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const uint32_t b8 = (q[2 * h + i / 4] >> (8 * (i % 4))) & 0xff;
                    wv[i] = __fmul_rn(V == V_FP8 ? fp8_fast(b8) : (float)(int8_t)b8, s);
                }
                fma_tokens<NT, 8>(acc, wv, x, K, c0 + 8 * h, nt);
            }
        } else { /* INT4, MXFP4 (one group of 32 per load) */
            const float s = V == V_INT4 ? scale_at(w, r * w.scale_cols + c0 / w.blk_c) : e8m0f(w.scale[r * w.scale_cols + c0 / DF_MXFP4_GROUP]);
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float wv[8];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const uint32_t c4 = (q[h] >> (4 * i)) & 15;
                    wv[i] = __fmul_rn(V == V_INT4 ? (float)((int)c4 - 8) : e2m1_fast(c4), s);
                }
                fma_tokens<NT, 8>(acc, wv, x, K, c0 + 8 * h, nt);
            }
        }
    }
}

/* V: the decoder; NT: tokens per pass (1, 2, 4 or MM_TN: few registers for few tokens) */
template <int V, int NT> __global__ void __launch_bounds__(MM_WARPS * 32, (V == V_INT4 || V == V_MXFP4) && NT > 2 ? 2 : 3) k_mm(const __grid_constant__ MmBatch b) {
    int j = 0;
    while (j + 1 < b.nj && blockIdx.x >= b.j[j + 1].blk0) j++;
    const MmJob &J = b.j[j];
    const int64_t r = (int64_t)(blockIdx.x - J.blk0) * MM_WARPS + (threadIdx.x >> 5);
    if (r >= J.w.rows) return;
    const int t0 = b.t0 + blockIdx.y * NT, nt = b.n - (int)blockIdx.y * NT < NT ? b.n - (int)blockIdx.y * NT : NT;
    const float *x = J.x + (int64_t)t0 * J.w.cols;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    row_dot<V, NT>(J, r, x, nt, acc);
    const int lane = threadIdx.x & 31;
    float mine = 0.0f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == t) mine = s;
    }
    if (lane < nt) J.y[(int64_t)(t0 + lane) * J.w.rows + r] = mine;
}

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

template <int NT> static void mm_launch(const MmBatch *b, unsigned blocks) {
    const dim3 grid(blocks, (unsigned)((b->n + NT - 1) / NT)), th(MM_WARPS * 32);
    switch (b->j[0].vec) {
    case V_F32: k_mm<V_F32, NT><<<grid, th>>>(*b); break;
    case V_F16: k_mm<V_F16, NT><<<grid, th>>>(*b); break;
    case V_BF16: k_mm<V_BF16, NT><<<grid, th>>>(*b); break;
    case V_FP8: k_mm<V_FP8, NT><<<grid, th>>>(*b); break;
    case V_INT4: k_mm<V_INT4, NT><<<grid, th>>>(*b); break;
    case V_I8ROW: k_mm<V_I8ROW, NT><<<grid, th>>>(*b); break;
    case V_MXFP4: k_mm<V_MXFP4, NT><<<grid, th>>>(*b); break;
    default: k_mm<V_GENERIC, NT><<<grid, th>>>(*b); break;
    }
}
static void mm_flush(MmBatch *b, unsigned blocks, int n) {
    if (!b->nj) return;
    const int per = 65535 * MM_TN;
    for (int t0 = 0; t0 < n; t0 += per) {
        b->t0 = t0;
        b->n = n - t0 < per ? n - t0 : per;
        if (b->n == 1) mm_launch<1>(b, blocks);
        else if (b->n == 2) mm_launch<2>(b, blocks);
        else if (b->n <= 4) mm_launch<4>(b, blocks);
        else mm_launch<MM_TN>(b, blocks);
        post("matmul_batch");
    }
    b->nj = 0;
}

/* ---- prefill: exact f32 slab + SGEMM ----------------------------------------------------- */
__global__ void k_dequant(DW w, int64_t r0, int64_t nr, float *out) {
    const size_t N = (size_t)nr * w.cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x)
        out[i] = wget(w, r0 + (int64_t)(i / w.cols), (int64_t)(i % w.cols));
}

static cublasHandle_t g_blas;
static int g_blas_state; /* 0 untried, 1 ready, -1 unavailable */
static cublasHandle_t blas(void) {
    if (!g_blas_state) {
        cublasStatus_t s = cublasCreate(&g_blas);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(g_blas, CUBLAS_PEDANTIC_MATH); /* f32 as stated: no TF32 */
        g_blas_state = s == CUBLAS_STATUS_SUCCESS ? 1 : -1;
        if (g_blas_state < 0)
            fprintf(stderr, "deltafin: cuda backend: matmul_batch: cuBLAS unavailable (status %d); prefill products use the decode kernel\n", (int)s);
    }
    return g_blas_state > 0 ? g_blas : NULL;
}

/* Y[n][rows] = X[n][cols] W^T through the slab; 0, or -1 to fall back to the kernel. */
static int mm_gemm(const DW &d, const float *X, float *Y, int n) {
    cublasHandle_t h = blas();
    if (!h || d.cols > INT32_MAX || d.rows > INT32_MAX) return -1;
    int64_t chunk = (int64_t)(MM_SLAB_FLOATS / (size_t)d.cols);
    if (chunk < 1) chunk = 1;
    if (chunk > d.rows) chunk = d.rows;
    float *slab = (float *)slot(S_SLAB, (size_t)chunk * d.cols * sizeof(float), "matmul_batch");
    if (!slab) return -1;
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < d.rows; r0 += chunk) {
        const int64_t nr = d.rows - r0 < chunk ? d.rows - r0 : chunk;
        k_dequant<<<blocks_for((size_t)nr * d.cols, 256), 256>>>(d, r0, nr, slab);
        post("matmul_batch");
        /* column-major view: Y^T[rows x n] (ld rows) = slab^T' (W chunk, ld cols) . X^T[cols x n] (ld cols) */
        cublasStatus_t s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, (int)d.cols, &one, slab, (int)d.cols, X, (int)d.cols, &zero,
                                       Y + r0, (int)d.rows);
        if (s != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "deltafin: cuda backend: matmul_batch: cublasSgemm [%lld x %lld] n=%d failed (status %d)\n", (long long)nr,
                    (long long)d.cols, n, (int)s);
            return r0 ? 0 : -1; /* a failure after the first chunk leaves its rows unset: reported */
        }
    }
    return 0;
}

void g_matmul_batch(const df_mv_job *jobs, int n_jobs, int n) {
    LOCK();
    if (n <= 0) return;
    MmBatch b;
    b.nj = 0;
    unsigned blocks = 0;
    for (int j = 0; j < n_jobs; j++) {
        DW d;
        /* an unregistered weight is uploaded into scratch shared by every such job: it runs alone */
        const int scratch = !jobs[j].w->handle;
        if (scratch) mm_flush(&b, blocks, n), blocks = 0;
        if (w_get(jobs[j].w, S_WD0, S_WS0, &d, "matmul_batch")) continue;
        if (d.rows <= 0) continue;
        if (n >= MM_GEMM_MIN_N && !mm_gemm(d, DCP(jobs[j].x), DP(jobs[j].y), n)) continue;
        const unsigned nb = (unsigned)((d.rows + MM_WARPS - 1) / MM_WARPS);
        const int vec = vec_kind(d, DCP(jobs[j].x));
        /* a launch holds jobs of one decoder (the kernel is compiled per decoder) */
        if (b.nj == MM_MAXJ || (b.nj && b.j[0].vec != vec) || (uint64_t)blocks + nb > 0x7fffffffu) mm_flush(&b, blocks, n), blocks = 0;
        MmJob &J = b.j[b.nj++];
        J.w = d, J.x = DCP(jobs[j].x), J.y = DP(jobs[j].y), J.vec = vec, J.blk0 = blocks;
        blocks += nb;
        if (scratch) mm_flush(&b, blocks, n), blocks = 0;
    }
    mm_flush(&b, blocks, n);
}
