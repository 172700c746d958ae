/* cuda_bench.cu - the CUDA backend's speed against floors measured in the same run.
 *
 *   cuda_bench [--quick] [--floor]   (--floor: the HBM read floor only)
 *
 * Floors: HBM read bandwidth (a plain 16-byte-load read kernel over 4 GiB),
 * cuBLAS SGEMM (f32) and cuBLAS BF16 GEMM (bf16 inputs, f32 accumulate) on
 * the prefill shapes. Ours, through the backend table (df_backend_cuda):
 *   decode: the products of one token step (n = 1, 2, 4, 8 tokens) of
 *     Qwen3-30B-A3B (BF16: q/k/v/o, and 8 of 128 routed experts gate/up/down,
 *     768 x 2048) and DeepSeek-V3 (FP8 128x128 blocks: MLA q_a/q_b/kv_a/o,
 *     8 of 32 registered routed experts, 2048 x 7168), each step on experts
 *     not read in the step before, in weight bytes per second;
 *   prefill: products of 2,048 tokens on the same matrices, in TFLOP/s, ours
 *     in each form (exact f32: dequantize + SGEMM; split-f16 and the first
 *     form, split-bf16, on tensor cores), with the rel L2 error of each and of a plain BF16 GEMM (x
 *     rounded to bf16) and of cuBLAS with CUBLAS_COMPUTE_32F_FAST_TF32 on the f32 data, against a
 *     double-precision reference on sampled rows.
 * Timing: CUDA events on the default stream, warm-up, then the median of
 * repeats. Random weights (valid values; the content does not matter for
 * speed). */
#include "backend/cuda/cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "read_floor.cuh"

static const df_backend_ops *B = &df_backend_cuda;
static int g_quick, g_floor_only;

#define CKB(x)                                                                                   \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "cuda_bench: %s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t rnd64(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static float frand(void) { return (float)((rnd64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* median time in ms of reps calls of f (after warm) */
template <typename F> static double time_ms(F f, int warm, int reps) {
    cudaEvent_t a, b;
    CKB(cudaEventCreate(&a));
    CKB(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++) f(i);
    std::vector<double> t;
    for (int i = 0; i < reps; i++) {
        CKB(cudaEventRecord(a));
        f(warm + i);
        CKB(cudaEventRecord(b));
        CKB(cudaEventSynchronize(b));
        float ms;
        CKB(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* ---- floors ---------------------------------------------------------------------------- */
static double hbm_read_gbs(void) {
    const size_t bytes = (size_t)4 << 30;
    uint4 *p;
    unsigned *sink;
    CKB(cudaMalloc(&p, bytes));
    CKB(cudaMalloc(&sink, 4));
    CKB(cudaMemset(p, 1, bytes));
    int sms;
    CKB(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const double ms = time_ms([&](int) { k_read<<<sms * 8, 512>>>(p, bytes / 16, sink); }, 3, 10);
    cudaFree(p), cudaFree(sink);
    return bytes / ms / 1e6;
}

/* ---- weights ----------------------------------------------------------------------------- */
struct W {
    df_weight w;
    std::vector<uint8_t> data, scale;
};
static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static void make_bf16(W &o, int64_t rows, int64_t cols) {
    memset(&o.w, 0, sizeof o.w);
    o.data.resize((size_t)rows * cols * 2);
    uint16_t *d = (uint16_t *)o.data.data();
    for (size_t i = 0; i < (size_t)rows * cols; i++) d[i] = bf16_bits(frand() * 0.05f);
    o.w.fmt = DF_W_BF16, o.w.rows = rows, o.w.cols = cols, o.w.row_bytes = (size_t)cols * 2, o.w.data = o.data.data();
}
static void make_fp8(W &o, int64_t rows, int64_t cols) {
    memset(&o.w, 0, sizeof o.w);
    o.data.resize((size_t)rows * cols);
    for (size_t i = 0; i < o.data.size(); i++) {
        uint8_t b = (uint8_t)rnd64();
        o.data[i] = (b & 0x7f) == 0x7f ? b ^ 1 : b;
    }
    const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    o.scale.resize((size_t)(sr * sc) * 4);
    float *s = (float *)o.scale.data();
    for (int64_t i = 0; i < sr * sc; i++) s[i] = 1e-3f * (1.0f + 0.5f * frand());
    o.w.fmt = DF_W_FP8, o.w.rows = rows, o.w.cols = cols, o.w.row_bytes = (size_t)cols, o.w.data = o.data.data();
    o.w.scale = o.scale.data(), o.w.scale_dtype = DF_SCALE_F32, o.w.blk_r = 128, o.w.blk_c = 128, o.w.scale_cols = sc;
}
static void reg(W &o) {
    if (B->weight_register(&o.w)) {
        fprintf(stderr, "cuda_bench: weight_register failed\n");
        exit(1);
    }
    o.data.clear(), o.data.shrink_to_fit(); /* the device copy is what the kernels read */
    o.w.data = NULL;
}
static df_act *act_rand(size_t n) {
    std::vector<float> h(n);
    for (auto &v : h) v = frand();
    df_act *p = B->alloc(n);
    B->write(p, h.data(), n);
    return p;
}

/* ---- decode --------------------------------------------------------------------------------- */
struct Model {
    const char *name;
    std::vector<W> dense;             /* one step's dense products, batched as listed in dense_batches */
    std::vector<std::vector<int>> dense_batches;
    std::vector<W> gate, up, down;    /* routed experts */
    int k;
};

static void decode_rows(Model &m, double floor_gbs) {
    const int NS[] = {1, 2, 4, 8};
    int64_t maxc = 0, maxr = 0;
    for (auto &w : m.dense) maxc = std::max(maxc, w.w.cols), maxr = std::max(maxr, w.w.rows);
    for (auto *v : {&m.gate, &m.down}) maxc = std::max(maxc, (*v)[0].w.cols), maxr = std::max(maxr, (*v)[0].w.rows);
    df_act *x = act_rand((size_t)8 * maxc * 16), *y = B->alloc((size_t)8 * maxr * 32);
    const int E = (int)m.gate.size();
    for (int ni = 0; ni < 4; ni++) {
        const int n = NS[ni];
        /* experts: gate+up of k experts in one batch, then their down products in another */
        int64_t eb = 0;
        for (int e = 0; e < m.k; e++) eb += df_weight_bytes(&m.gate[e].w) + df_weight_bytes(&m.up[e].w) + df_weight_bytes(&m.down[e].w);
        auto experts = [&](int it) {
            std::vector<df_mv_job> j;
            for (int e = 0; e < m.k; e++) {
                const int id = (it * m.k + e) % E;
                j.push_back({&m.gate[id].w, x, df_act_at(y, (size_t)(2 * e) * n * m.gate[id].w.rows)});
                j.push_back({&m.up[id].w, x, df_act_at(y, (size_t)(2 * e + 1) * n * m.up[id].w.rows)});
            }
            B->matmul_batch(j.data(), (int)j.size(), n);
            j.clear();
            for (int e = 0; e < m.k; e++) {
                const int id = (it * m.k + e) % E;
                j.push_back({&m.down[id].w, x, df_act_at(y, (size_t)e * n * m.down[id].w.rows)});
            }
            B->matmul_batch(j.data(), (int)j.size(), n);
        };
        const double te = time_ms(experts, 3, g_quick ? 10 : 40);
        int64_t db = 0;
        for (auto &w : m.dense) db += df_weight_bytes(&w.w);
        auto dense = [&](int) {
            for (auto &bt : m.dense_batches) {
                std::vector<df_mv_job> j;
                size_t off = 0;
                for (int i : bt) j.push_back({&m.dense[i].w, x, df_act_at(y, off)}), off += (size_t)n * m.dense[i].w.rows;
                B->matmul_batch(j.data(), (int)j.size(), n);
            }
        };
        const double td = time_ms(dense, 3, g_quick ? 10 : 40);
        printf("decode %-22s n=%d  routed experts (%d x gate/up/down): %7.1f GB/s %5.1f%% of floor (%.1f us) | dense projections: %7.1f GB/s %5.1f%% (%.1f us) | step: %5.1f%%\n",
               m.name, n, m.k, eb / te / 1e6, 100.0 * eb / te / 1e6 / floor_gbs, te * 1e3, db / td / 1e6, 100.0 * db / td / 1e6 / floor_gbs, td * 1e3,
               100.0 * (eb + db) / (te + td) / 1e6 / floor_gbs);
    }
    B->free(x), B->free(y);
}

/* ---- prefill -------------------------------------------------------------------------------- */
__global__ void k_to_bf16(const float *s, __nv_bfloat16 *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = __float2bfloat16(s[i]);
}
__global__ void k_to_f16(const float *s, __half *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = __float2half(s[i]);
}
/* host copy of the decoded weight rows [r0, r0+nr) (stored bytes kept on the host for this) */
static double rel_l2(const std::vector<float> &got, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static void prefill_row(const char *name, W &wt, cublasHandle_t h, int n) {
    const int64_t R = wt.w.rows, C = wt.w.cols;
    const double flop = 2.0 * R * C * n;
    /* the stored bytes stay on the host for the reference */
    std::vector<float> wf((size_t)R * C);
    for (int64_t r = 0; r < R; r++) df_dequant_row(&wt.w, r, wf.data() + (size_t)r * C);
    reg(wt);
    std::vector<float> xh((size_t)n * C);
    for (auto &v : xh) v = frand();
    df_act *x = B->alloc(xh.size()), *y = B->alloc((size_t)n * R);
    B->write(x, xh.data(), xh.size());
    /* ours: exact f32 (SGEMM on the dequantized slab), then split-bf16 (tensor cores) */
    df_mv_job j = {&wt.w, x, y};
    setenv("DELTAFIN_CUDA_SPLIT_MIN_N", "0", 1);
    const double t_ours = time_ms([&](int) { B->matmul_batch(&j, 1, n); }, 2, g_quick ? 5 : 10);
    std::vector<float> yo((size_t)n * R), ys((size_t)n * R);
    B->read(yo.data(), y, yo.size());
    setenv("DELTAFIN_CUDA_SPLIT_MIN_N", "1", 1);
    const double t_split = time_ms([&](int) { B->matmul_batch(&j, 1, n); }, 2, g_quick ? 5 : 10);
    B->read(ys.data(), y, ys.size());
    /* the first split form (split-bf16: 3 bf16 pieces, 3 or 6 GEMMs) */
    setenv("DELTAFIN_CUDA_SPLIT_FORM", "bf16", 1);
    std::vector<float> y1((size_t)n * R);
    const double t_s1 = time_ms([&](int) { B->matmul_batch(&j, 1, n); }, 2, g_quick ? 5 : 10);
    B->read(y1.data(), y, y1.size());
    unsetenv("DELTAFIN_CUDA_SPLIT_FORM");
    unsetenv("DELTAFIN_CUDA_SPLIT_MIN_N");
    /* cuBLAS SGEMM on the f32 weight (no dequantization) */
    float *dW, *dX, *dY;
    __nv_bfloat16 *bW, *bX;
    CKB(cudaMalloc(&dW, (size_t)R * C * 4));
    CKB(cudaMalloc(&dY, (size_t)n * R * 4));
    CKB(cudaMemcpy(dW, wf.data(), (size_t)R * C * 4, cudaMemcpyHostToDevice));
    dX = (float *)x;
    CKB(cudaMalloc(&bW, (size_t)R * C * 2));
    CKB(cudaMalloc(&bX, (size_t)n * C * 2));
    k_to_bf16<<<1024, 256>>>(dW, bW, (size_t)R * C);
    k_to_bf16<<<1024, 256>>>(dX, bX, (size_t)n * C);
    const float one = 1.0f, zero = 0.0f;
    cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
    const double t_sg = time_ms([&](int) { cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, n, (int)C, &one, dW, (int)C, dX, (int)C, &zero, dY, (int)R); }, 2,
                                g_quick ? 5 : 10);
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    const double t_bf = time_ms([&](int) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, n, (int)C, &one, bW, CUDA_R_16BF, (int)C, bX, CUDA_R_16BF, (int)C, &zero, dY, CUDA_R_32F, (int)R,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }, 2, g_quick ? 5 : 10);
    std::vector<float> yb((size_t)n * R), yt((size_t)n * R);
    CKB(cudaMemcpy(yb.data(), dY, yb.size() * 4, cudaMemcpyDeviceToHost));
    /* cuBLAS on the f32 data with TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32: the inputs rounded to TF32's
     * 10-bit mantissa, f32 accumulation) */
    const double t_tf = time_ms([&](int) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, n, (int)C, &one, dW, CUDA_R_32F, (int)C, dX, CUDA_R_32F, (int)C, &zero, dY, CUDA_R_32F, (int)R,
                     CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    }, 2, g_quick ? 5 : 10);
    CKB(cudaMemcpy(yt.data(), dY, yt.size() * 4, cudaMemcpyDeviceToHost));
    /* the split-f16 form's GEMM alone (its K laid out P times: 2 pieces for BF16 weights, 3 for the others), on the
     * bf16 buffers' bits read as f16, then the form's own passes are the rest of its time */
    const int P = wt.w.fmt == DF_W_BF16 ? 2 : 3;
    __half *hW, *hX;
    CKB(cudaMalloc(&hW, (size_t)R * C * P * 2));
    CKB(cudaMalloc(&hX, (size_t)n * C * P * 2));
    for (int i = 0; i < P; i++) {
        k_to_f16<<<1024, 256>>>(dW, hW + (size_t)i * R * C, (size_t)R * C);
        k_to_f16<<<1024, 256>>>(dX, hX + (size_t)i * n * C, (size_t)n * C);
    }
    const double t_h = time_ms([&](int) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, n, (int)(P * C), &one, hW, CUDA_R_16F, (int)(P * C), hX, CUDA_R_16F, (int)(P * C), &zero, dY,
                     CUDA_R_32F, (int)R, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }, 2, g_quick ? 5 : 10);
    cudaFree(hW), cudaFree(hX);
    /* double reference on sampled rows (every token) */
    const int NR = 48;
    std::vector<double> ref;
    std::vector<float> go, gb, gs, gt, g1;
    for (int k = 0; k < NR; k++) {
        const int64_t r = (int64_t)(rnd64() % (uint64_t)R);
        for (int t = 0; t < n; t++) {
            double s = 0;
            const float *wr = wf.data() + (size_t)r * C, *xr = xh.data() + (size_t)t * C;
            for (int64_t c = 0; c < C; c++) s += (double)wr[c] * xr[c];
            ref.push_back(s), go.push_back(yo[(size_t)t * R + r]), gb.push_back(yb[(size_t)t * R + r]), gs.push_back(ys[(size_t)t * R + r]);
            gt.push_back(yt[(size_t)t * R + r]), g1.push_back(y1[(size_t)t * R + r]);
        }
    }
    const double sg = flop / t_sg / 1e9, bf = flop / t_bf / 1e9, f32 = flop / t_ours / 1e9, sp = flop / t_split / 1e9, tf = flop / t_tf / 1e9,
                 s1 = flop / t_s1 / 1e9;
    printf("prefill %-32s [%5lld x %5lld] n=%4d | cuBLAS SGEMM %5.1f TFLOP/s, BF16 %5.1f (rel L2 %.1e), FAST_TF32 %5.1f (rel L2 %.1e) | ours f32 "
           "(dequant+SGEMM) %5.1f = %3.0f%% of SGEMM (rel L2 %.1e) | ours split-f16 %5.1f = %3.0f%% of BF16, %3.0f%% of SGEMM, %3.0f%% of TF32 (rel L2 %.1e) "
           "| split-bf16 %5.1f = %3.0f%% of TF32 (rel L2 %.1e) | split-f16's GEMM alone (K x %d) %.1f us of its %.1f us\n",
           name, (long long)R, (long long)C, n, sg, bf, rel_l2(gb, ref), tf, rel_l2(gt, ref), f32, 100.0 * f32 / sg, rel_l2(go, ref), sp, 100.0 * sp / bf,
           100.0 * sp / sg, 100.0 * sp / tf, rel_l2(gs, ref), s1, 100.0 * s1 / tf, rel_l2(g1, ref), P, t_h * 1e3, t_split * 1e3);
    cudaFree(dW), cudaFree(dY), cudaFree(bW), cudaFree(bX);
    B->free(x), B->free(y);
    B->weight_unregister(&wt.w);
}

/* Two products on one x in one matmul_batch call (an FFN's gate and up: prefill round 3 splits x once for both) against
 * the two jobs alone and cuBLAS TF32 on the same two shapes; the batch's outputs compared bit for bit with the jobs'
 * alone (their error is prefill_row's) */
static void prefill_pair(const char *name, W &wa, W &wb, cublasHandle_t h, int n) {
    W *ws[2] = {&wa, &wb};
    const int64_t C = wa.w.cols;
    double flop = 0;
    std::vector<float> wf[2];
    for (int i = 0; i < 2; i++) {
        const int64_t R = ws[i]->w.rows;
        flop += 2.0 * R * C * n;
        wf[i].resize((size_t)R * C);
        for (int64_t r = 0; r < R; r++) df_dequant_row(&ws[i]->w, r, wf[i].data() + (size_t)r * C);
        reg(*ws[i]);
    }
    std::vector<float> xh((size_t)n * C);
    for (auto &v : xh) v = frand();
    df_act *x = B->alloc(xh.size()), *y[2] = {B->alloc((size_t)n * wa.w.rows), B->alloc((size_t)n * wb.w.rows)};
    B->write(x, xh.data(), xh.size());
    df_mv_job j[2] = {{&wa.w, x, y[0]}, {&wb.w, x, y[1]}};
    setenv("DELTAFIN_CUDA_SPLIT_MIN_N", "1", 1);
    const double t_a = time_ms([&](int) { B->matmul_batch(&j[0], 1, n); }, 2, g_quick ? 5 : 10);
    const double t_b = time_ms([&](int) { B->matmul_batch(&j[1], 1, n); }, 2, g_quick ? 5 : 10);
    std::vector<float> alone[2], both[2];
    for (int i = 0; i < 2; i++) alone[i].resize((size_t)n * ws[i]->w.rows), both[i].resize(alone[i].size());
    B->read(alone[1].data(), y[1], alone[1].size());
    B->matmul_batch(&j[0], 1, n), B->read(alone[0].data(), y[0], alone[0].size());
    const double t_ab = time_ms([&](int) { B->matmul_batch(j, 2, n); }, 2, g_quick ? 5 : 10);
    for (int i = 0; i < 2; i++) B->read(both[i].data(), y[i], both[i].size());
    unsetenv("DELTAFIN_CUDA_SPLIT_MIN_N");
    const int same = alone[0] == both[0] && alone[1] == both[1];
    float *dW[2], *dY;
    const int64_t Rm = wa.w.rows > wb.w.rows ? wa.w.rows : wb.w.rows;
    CKB(cudaMalloc(&dY, (size_t)n * Rm * 4));
    for (int i = 0; i < 2; i++) {
        CKB(cudaMalloc(&dW[i], wf[i].size() * 4));
        CKB(cudaMemcpy(dW[i], wf[i].data(), wf[i].size() * 4, cudaMemcpyHostToDevice));
    }
    const float one = 1.0f, zero = 0.0f;
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    const double t_tf = time_ms([&](int) {
        for (int i = 0; i < 2; i++)
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)ws[i]->w.rows, n, (int)C, &one, dW[i], CUDA_R_32F, (int)C, (const float *)x, CUDA_R_32F, (int)C, &zero,
                         dY, CUDA_R_32F, (int)ws[i]->w.rows, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    }, 2, g_quick ? 5 : 10);
    const double tf = flop / t_tf / 1e9, ab = flop / t_ab / 1e9, sep = flop / (t_a + t_b) / 1e9;
    printf("prefill %-32s n=%4d | cuBLAS FAST_TF32, both products %5.1f TFLOP/s | ours split-f16, one batch (x split once) %5.1f = %3.0f%% of TF32 (%.1f us) "
           "| the two jobs alone %5.1f = %3.0f%% (%.1f + %.1f us) | batch outputs %s the jobs' alone\n",
           name, n, tf, ab, 100.0 * ab / tf, t_ab * 1e3, sep, 100.0 * sep / tf, t_a * 1e3, t_b * 1e3, same ? "bit-equal to" : "DIFFER from");
    for (int i = 0; i < 2; i++) cudaFree(dW[i]), B->free(y[i]), B->weight_unregister(&ws[i]->w);
    cudaFree(dY), B->free(x);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--floor")) g_floor_only = 1;
        else {
            fprintf(stderr, "usage: cuda_bench [--quick] [--floor]\n");
            return 2;
        }
    if (!df_cuda_available()) {
        fprintf(stderr, "cuda_bench: no CUDA device: skipped\n");
        return 77;
    }
    cudaDeviceProp p;
    CKB(cudaGetDeviceProperties(&p, 0));
    int mclk = 0, bus = 0;
    cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, 0), cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, 0);
    printf("device: %s, %d SMs, %.0f GiB, memory bus %d bits\n", p.name, p.multiProcessorCount, p.totalGlobalMem / 1073741824.0, bus);
    const double floor_gbs = hbm_read_gbs();
    printf("floor: HBM read %.1f GB/s (16-byte loads over 4 GiB, median of 10)\n", floor_gbs);
    if (g_floor_only) return 0;

    /* Qwen3-30B-A3B, BF16 */
    {
        Model m;
        m.name = "Qwen3-30B-A3B BF16";
        m.k = 8;
        const int E = g_quick ? 32 : 128;
        m.gate.resize(E), m.up.resize(E), m.down.resize(E);
        for (int e = 0; e < E; e++) make_bf16(m.gate[e], 768, 2048), reg(m.gate[e]), make_bf16(m.up[e], 768, 2048), reg(m.up[e]), make_bf16(m.down[e], 2048, 768), reg(m.down[e]);
        m.dense.resize(5);
        make_bf16(m.dense[0], 4096, 2048), make_bf16(m.dense[1], 512, 2048), make_bf16(m.dense[2], 512, 2048), make_bf16(m.dense[3], 2048, 4096),
            make_bf16(m.dense[4], 128, 2048); /* q k v o router */
        for (auto &w : m.dense) reg(w);
        m.dense_batches = {{0, 1, 2}, {3}, {4}};
        decode_rows(m, floor_gbs);
        for (auto *v : {&m.gate, &m.up, &m.down, &m.dense})
            for (auto &w : *v) B->weight_unregister(&w.w);
    }
    /* DeepSeek-V3, FP8 128x128 */
    {
        Model m;
        m.name = "DeepSeek-V3 FP8";
        m.k = 8;
        const int E = g_quick ? 16 : 32;
        m.gate.resize(E), m.up.resize(E), m.down.resize(E);
        for (int e = 0; e < E; e++) make_fp8(m.gate[e], 2048, 7168), reg(m.gate[e]), make_fp8(m.up[e], 2048, 7168), reg(m.up[e]), make_fp8(m.down[e], 7168, 2048), reg(m.down[e]);
        m.dense.resize(6);
        make_fp8(m.dense[0], 1536, 7168), make_fp8(m.dense[1], 576, 7168), make_fp8(m.dense[2], 24576, 1536), make_fp8(m.dense[3], 7168, 16384),
            make_fp8(m.dense[4], 2048, 7168), make_fp8(m.dense[5], 2048, 7168); /* q_a kv_a q_b o, shared expert gate up */
        for (auto &w : m.dense) reg(w);
        m.dense_batches = {{0, 1}, {2}, {3}, {4, 5}};
        decode_rows(m, floor_gbs);
        for (auto *v : {&m.gate, &m.up, &m.down, &m.dense})
            for (auto &w : *v) B->weight_unregister(&w.w);
    }
    /* prefill, 2,048 tokens */
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cuda_bench: cublasCreate failed\n");
        return 1;
    }
    const int n = 2048;
    {
        W w;
        make_bf16(w, 4096, 2048), prefill_row("Qwen3 q_proj BF16", w, h, n);
        make_bf16(w, 768, 2048), prefill_row("Qwen3 expert gate BF16", w, h, n);
        make_bf16(w, 2048, 768), prefill_row("Qwen3 expert down BF16", w, h, n);
        make_fp8(w, 2048, 7168), prefill_row("DeepSeek-V3 expert gate FP8", w, h, n);
        make_fp8(w, 24576, 1536), prefill_row("DeepSeek-V3 q_b FP8", w, h, n);
        W w2;
        make_fp8(w, 2048, 7168), make_fp8(w2, 2048, 7168), prefill_pair("DeepSeek-V3 expert gate+up FP8", w, w2, h, n);
        make_bf16(w, 768, 2048), make_bf16(w2, 768, 2048), prefill_pair("Qwen3 expert gate+up BF16", w, w2, h, n);
        make_bf16(w, 768, 2048), prefill_row("Qwen3 expert gate BF16 (128 tok)", w, h, 128);
    }
    cublasDestroy(h);
    return 0;
}
