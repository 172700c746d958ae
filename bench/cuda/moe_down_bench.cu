/* moe_down_bench.cu - how fast the one-token FP8 MoE down product can read its experts on the H200: DeepSeek-V3's
 * routed down shape (K = 8 experts of 7168 x 2048 E4M3 rows, 128 x 128 block scales, 117 MB a token), each expert's
 * input its own 2048 floats, the K outputs combined by the route's weights in k order, against the HBM read floor
 * measured in the same run and a double-precision host reference.
 *
 *   moe_down_bench [REPS]
 *
 * Why (docs/PERFORMANCE.md, CUDA round 15): in the model the backend's k_moe_down_f8 (a wave of persistent blocks,
 * each warp streaming one expert's rows through a ring of 4 rows in shared memory, a row at a time) takes 64-72 us a
 * launch under ncu for these 117 MB (35-40% of the floor), while the gate/up launch k_mm_devf8 (a warp per 4 whole rows
 * in registers) reads its 235 MB at 81%. The variants, all with the backend's decode (decode<V_FP8>: the hardware
 * E4M3 -> f16 -> f32 conversion, __fmul_rn by the block's scale, fmaf over the 16 elements of a step in order, then
 * warp_sum) so that the arithmetic is the same and only the memory schedule differs:
 *   R2 / R4  a warp per 4 rows of one expert, U = 2 or 4 of a lane's 4 steps of 16 bytes a row in flight (the gate/up
 *            launch's body), the experts' rows one after the other, y[k][r] written; the combine a second launch;
 *   C4       a block per 4 rows of every expert (warp k: expert k's 4 rows, all 16 loads of a lane in flight at once),
 *            the 4 x K sums through shared memory and combined in the block (k order): one launch, no partials;
 *   C4P      C4 as persistent blocks (one wave; each block loops over row groups), the next group's loads issued
 *            before the current group's products (pipe) or after them;
 *   gate     x = silu(g) u computed by each warp for its expert into shared memory first and read from there (the
 *            backend's k_moe_down_c8); A1: one scale product a 16-byte step (bit 8388608's arithmetic).
 * x: each expert's 2048 inputs (in the model: silu(gate) * up, written by the gate/up launch or a small one after it).
 * Prints us per call, GB/s of weight + scale bytes, % of the floor, rel L2 against the host. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#define BENCH_NAME "moe_down_bench"
#include "fp8_bench.cuh"
#include "read_floor.cuh"


enum { NE = 8, D = 7168, I = 2048, NV = I / 16, SC = I / 128 }; /* experts, rows, columns, 16-byte steps a row, scale columns */

/* one 16-byte step of a row: its 16 elements decoded with scale s and added to acc in order (decode<V_FP8>'s order) */
static __device__ __forceinline__ void step(const uint4 &u, float s, const float *xp, float &acc) {
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int h = 0; h < 4; h++) {
        const float4 xv = __ldg((const float4 *)xp + h);
        const float2 lo = fp8x2_f32(q[h]), hi = fp8x2_f32(q[h] >> 16);
        acc = fmaf(__fmul_rn(lo.x, s), xv.x, acc);
        acc = fmaf(__fmul_rn(lo.y, s), xv.y, acc);
        acc = fmaf(__fmul_rn(hi.x, s), xv.z, acc);
        acc = fmaf(__fmul_rn(hi.y, s), xv.w, acc);
    }
}
struct Args {
    const uint8_t *w[NE]; /* expert k's D x I bytes */
    const float *s[NE];   /* its (D / 128) x SC scales */
    const float *x;       /* [NE][I] */
    const float *g, *u;   /* [NE][I]: x = silu(g) u (the GATE variants compute it) */
    const float *wr;      /* [NE] route weights */
    float *y;             /* [NE][D] (R2 / R4) */
    float *out;           /* [D] */
};
/* R: warp g of the grid takes expert g / (D / 4)'s rows 4 (g % (D / 4)) .. + 3 */
template <int U>
__global__ void __launch_bounds__(256, 2) k_r(const __grid_constant__ Args a) {
    const int g = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (g >= NE * (D / 4)) return;
    const int e = g / (D / 4), r0 = (g % (D / 4)) * 4;
    const uint4 *rows = (const uint4 *)(a.w[e] + (size_t)r0 * I);
    const float *srow = a.s[e] + (size_t)(r0 / 128) * SC, *x = a.x + (size_t)e * I;
    float acc[4] = {0, 0, 0, 0};
#pragma unroll
    for (int q0 = 0; q0 < NV / 32; q0 += U) {
        uint4 u[U][4];
        float s[U];
#pragma unroll
        for (int q = 0; q < U; q++) {
            const int v = (q0 + q) * 32 + lane;
#pragma unroll
            for (int i = 0; i < 4; i++) u[q][i] = __ldg(rows + (size_t)i * NV + v);
            s[q] = __ldg(srow + v / 8);
        }
#pragma unroll
        for (int q = 0; q < U; q++) {
            const int v = (q0 + q) * 32 + lane;
#pragma unroll
            for (int i = 0; i < 4; i++) step(u[q][i], s[q], x + (size_t)v * 16, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float t = warp_sum(acc[i]);
        if (!lane) a.y[(size_t)e * D + r0 + i] = t;
    }
}
__global__ void k_comb(const __grid_constant__ Args a) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= D) return;
    float t = 0.0f;
#pragma unroll
    for (int e = 0; e < NE; e++) t = fmaf(a.wr[e], a.y[(size_t)e * D + r], t);
    a.out[r] = t;
}
/* C: block b (NE warps), warp e: expert e's rows 4 gr .. + 3 for the block's row groups gr = b, b + G, ... (G = gridDim.x:
 * D / 4 for C4, one wave for C4P); the next group's 16 loads a lane issued before the current group's products (PIPE) */
/* GATE: x computed by each warp for its expert into shared memory first (silu(g) u, lane l's float4 h of step q at
 * (4 q + h) 32 + l), then read from there (the backend's k_moe_down_c8); A1: one scale product a step */
template <int PIPE, int GATE = 0, int A1 = 0>
__global__ void __launch_bounds__(NE * 32, 2) k_c(const __grid_constant__ Args a) {
    const int e = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __shared__ float part[NE][4];
    extern __shared__ __align__(16) float4 hs[]; /* GATE: NE * (NV / 32) * 4 * 32 (dynamic: 64 KB) */
    const float *x = a.x + (size_t)e * I;
    if (GATE) {
        for (int c4 = lane; c4 < I / 4; c4 += 32) {
            const float4 g = __ldg((const float4 *)(a.g + (size_t)e * I) + c4), u = __ldg((const float4 *)(a.u + (size_t)e * I) + c4);
            const int v = c4 / 4;
            hs[(size_t)e * (NV / 32) * 4 * 32 + ((v / 32) * 4 + c4 % 4) * 32 + v % 32] =
                make_float4(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y, g.z / (1.0f + expf(-g.z)) * u.z, g.w / (1.0f + expf(-g.w)) * u.w);
        }
        __syncwarp();
    }
    const uint8_t *w = a.w[e];
    const float *sc = a.s[e];
    auto load = [&](int gr, uint4 (&u)[4][4], float (&s)[4]) {
        const uint4 *rows = (const uint4 *)(w + (size_t)gr * 4 * I);
        const float *srow = sc + (size_t)(gr * 4 / 128) * SC;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int v = q * 32 + lane;
#pragma unroll
            for (int i = 0; i < 4; i++) u[q][i] = __ldg(rows + (size_t)i * NV + v);
            s[q] = __ldg(srow + v / 8);
        }
    };
    uint4 u[4][4];
    float s[4];
    int gr = blockIdx.x;
    if (gr < D / 4) load(gr, u, s);
    for (; gr < D / 4; gr += gridDim.x) {
        uint4 nu[4][4];
        float ns[4];
        if (PIPE && gr + (int)gridDim.x < D / 4) load(gr + gridDim.x, nu, ns);
        float acc[4] = {0, 0, 0, 0};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int v = q * 32 + lane;
            if (GATE) {
                float xg[16];
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    const float4 f = hs[(size_t)e * (NV / 32) * 4 * 32 + (q * 4 + h) * 32 + lane];
                    xg[4 * h] = f.x, xg[4 * h + 1] = f.y, xg[4 * h + 2] = f.z, xg[4 * h + 3] = f.w;
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint32_t qw[4] = {u[q][i].x, u[q][i].y, u[q][i].z, u[q][i].w};
                    float t = 0.0f;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float2 lo = fp8x2_f32(qw[k]), hi = fp8x2_f32(qw[k] >> 16);
                        if (A1) {
                            t = fmaf(lo.x, xg[4 * k], t), t = fmaf(lo.y, xg[4 * k + 1], t);
                            t = fmaf(hi.x, xg[4 * k + 2], t), t = fmaf(hi.y, xg[4 * k + 3], t);
                        } else {
                            acc[i] = fmaf(__fmul_rn(lo.x, s[q]), xg[4 * k], acc[i]), acc[i] = fmaf(__fmul_rn(lo.y, s[q]), xg[4 * k + 1], acc[i]);
                            acc[i] = fmaf(__fmul_rn(hi.x, s[q]), xg[4 * k + 2], acc[i]), acc[i] = fmaf(__fmul_rn(hi.y, s[q]), xg[4 * k + 3], acc[i]);
                        }
                    }
                    if (A1) acc[i] = fmaf(t, s[q], acc[i]);
                }
            } else
#pragma unroll
                for (int i = 0; i < 4; i++) step(u[q][i], s[q], x + (size_t)v * 16, acc[i]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float t = warp_sum(acc[i]);
            if (!lane) part[e][i] = t;
        }
        __syncthreads();
        if (threadIdx.x < 4) {
            float t = 0.0f;
#pragma unroll
            for (int k = 0; k < NE; k++) t = fmaf(a.wr[k], part[k][threadIdx.x], t);
            a.out[gr * 4 + threadIdx.x] = t;
        }
        __syncthreads();
        if (PIPE) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                s[q] = ns[q];
#pragma unroll
                for (int i = 0; i < 4; i++) u[q][i] = nu[q][i];
            }
        } else if (gr + (int)gridDim.x < D / 4)
            load(gr + gridDim.x, u, s);
    }
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const double floor_gbs = read_floor_gbs(sms);
    printf("moe_down_bench: %d SMs, HBM read floor %.1f GB/s\n", sms, floor_gbs);
    const size_t wb = (size_t)D * I, sb = (size_t)(D / 128) * SC * 4;
    const int ncopy = 2; /* two sets of experts, alternated: 2 x 117 MB, past the 60 MB L2 */
    std::vector<uint8_t> hw(wb * NE);
    std::vector<float> hs((size_t)(D / 128) * SC * NE), hx((size_t)NE * I), hwr(NE);
    for (auto &b : hw) {
        b = (uint8_t)rnd();
        if ((b & 0x7f) == 0x7f) b ^= 1; /* no NaN codes */
    }
    for (auto &v : hs) v = ldexpf(1.0f + (rnd() % 1000) / 1000.0f, -12 + (int)(rnd() % 8));
    std::vector<float> hg(hx.size()), hu(hx.size());
    for (size_t i = 0; i < hx.size(); i++) { /* x = silu(g) u, as the GATE variants compute it */
        hg[i] = ((int)(rnd() % 20001) - 10000) / 2500.0f, hu[i] = ((int)(rnd() % 20001) - 10000) / 5000.0f * ldexpf(1.0f, -(int)(rnd() % 6));
        hx[i] = hg[i] / (1.0f + expf(-hg[i])) * hu[i];
    }
    for (auto &v : hwr) v = (rnd() % 1000) / 1000.0f;
    std::vector<double> ref(D, 0.0);
    for (int e = 0; e < NE; e++)
        for (int r = 0; r < D; r++) {
            double t = 0;
            const uint8_t *row = hw.data() + wb * e + (size_t)r * I;
            const float *srow = hs.data() + (size_t)(D / 128) * SC * e + (size_t)(r / 128) * SC;
            for (int c = 0; c < I; c++) t += (double)e4m3_host(row[c]) * srow[c / 128] * hx[(size_t)e * I + c];
            ref[r] += hwr[e] * t;
        }
    Args A[ncopy];
    float *dx, *dwr, *dy, *dout;
    CK(cudaMalloc(&dx, hx.size() * 4));
    CK(cudaMalloc(&dwr, NE * 4));
    CK(cudaMalloc(&dy, (size_t)NE * D * 4));
    CK(cudaMalloc(&dout, D * 4));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    float *dg, *du;
    CK(cudaMalloc(&dg, hg.size() * 4));
    CK(cudaMalloc(&du, hu.size() * 4));
    CK(cudaMemcpy(dg, hg.data(), hg.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(du, hu.data(), hu.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwr, hwr.data(), NE * 4, cudaMemcpyHostToDevice));
    for (int c = 0; c < ncopy; c++) {
        for (int e = 0; e < NE; e++) {
            uint8_t *w;
            float *s;
            CK(cudaMalloc(&w, wb));
            CK(cudaMalloc(&s, sb));
            CK(cudaMemcpy(w, hw.data() + wb * e, wb, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(s, hs.data() + (size_t)(D / 128) * SC * e, sb, cudaMemcpyHostToDevice));
            A[c].w[e] = w, A[c].s[e] = s;
        }
        A[c].x = dx, A[c].g = dg, A[c].u = du, A[c].wr = dwr, A[c].y = dy, A[c].out = dout;
    }
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_c<1>, NE * 32, 0));
    const int gp = sms * (occ > 0 ? occ : 1);
    int fails = 0;
    const char *vn[] = {"R2 + comb", "R4 + comb", "R4 alone", "C4", "C4 pipe", "C4P", "C4P pipe", "C4P gate", "C4P gate A1", "C4 gate A1"};
    const size_t hsb = (size_t)NE * I * 4;
    CK(cudaFuncSetAttribute(k_c<0, 1, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)hsb));
    CK(cudaFuncSetAttribute(k_c<0, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)hsb));
    int occg = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occg, k_c<0, 1, 1>, NE * 32, hsb));
    const int gpg = sms * (occg > 0 ? occg : 1);
    for (int var = 0; var < 10; var++) {
        auto launch = [&](int c) {
            const int rblocks = NE * (D / 4) * 32 / 256;
            if (var == 0) k_r<2><<<rblocks, 256>>>(A[c]), k_comb<<<(D + 255) / 256, 256>>>(A[c]);
            else if (var == 1) k_r<4><<<rblocks, 256>>>(A[c]), k_comb<<<(D + 255) / 256, 256>>>(A[c]);
            else if (var == 2) k_r<4><<<rblocks, 256>>>(A[c]);
            else if (var == 3) k_c<0><<<D / 4, NE * 32>>>(A[c]);
            else if (var == 4) k_c<1><<<D / 4, NE * 32>>>(A[c]);
            else if (var == 5) k_c<0><<<gp, NE * 32>>>(A[c]);
            else if (var == 6) k_c<1><<<gp, NE * 32>>>(A[c]);
            else if (var == 7) k_c<0, 1, 0><<<gpg, NE * 32, hsb>>>(A[c]);
            else if (var == 8) k_c<0, 1, 1><<<gpg, NE * 32, hsb>>>(A[c]);
            else k_c<0, 1, 1><<<D / 4, NE * 32, hsb>>>(A[c]);
        };
        CK(cudaMemset(dout, 0, D * 4));
        launch(0);
        if (var == 2) k_comb<<<(D + 255) / 256, 256>>>(A[0]);
        const double rel = rel_l2_dev(dout, ref.data(), D);
        const double us = time_us(launch, ncopy, reps), gbs = (double)(wb + sb) * NE / (us * 1e-6) / 1e9;
        printf("moe down 8 x 7168 x 2048  %-10s %8.2f us %7.1f GB/s %5.1f%% of floor  rel L2 %.2e\n", vn[var], us, gbs, 100 * gbs / floor_gbs, rel);
        if (!(rel < 1e-5)) fails++;
    }
    printf("moe_down_bench: C4P grid %d (%d blocks an SM), with the gate %d (%d); %d results off by more than rel L2 1e-5\n", gp, occ, gpg, occg, fails);
    return fails != 0;
}
