/* fp8_gemv.cu - which arithmetic a one-token FP8 E4M3 product (128 x 128 block scales, DeepSeek-V3) needs to
 * reach the HBM floor on the H200: three kernel bodies on DeepSeek-V3's dense shapes, each against the read floor
 * measured in the same run and against a double-precision host reference.
 *
 *   fp8_gemv [REPS [NAME]]   (NAME: only the shapes whose name holds it, e.g. "o 7168")
 *
 * Why (docs/PERFORMANCE.md, "FP8 one-token products: the arithmetic"): the backend's `k_mm<V_FP8>` decodes every
 * weight with the hardware fp8x2 -> half2 conversion, half2 -> float2, a product by its block scale and an FMA:
 * ~3.5 instructions an element, ~17 elements an SM-cycle at the floor. The variants:
 *   A  "scalar": that decode (cvt e4m3x2 -> f16x2, f16 -> f32, __fmul_rn by the scale, fmaf), a warp per 4 rows,
 *      2 steps of 16 bytes a row in flight (k_mm's FP8 body, simplified);
 *   B  "int": each byte placed in an f32 by integer operations (its value times 2^-120, subnormals exact), 16
 *      products summed per 16-byte step and the step's sum multiplied by its scale times 2^120 (fmaf);
 *   T  "mma": tensor cores, mma.sync m16n8k16 f16 x f16 -> f32: the weights as A (E4M3 -> f16 is exact: one
 *      cvt per 2 elements), x as B in three f16 parts (x 2^e = h1 + h2 + h3 per 128-column block, e so that the
 *      block's largest |x| is in [2^14, 2^15): ~33 bits of x), the three parts in B's columns 0..2, each
 *      128 x 128 block's sums multiplied by its scale times 2^-e (f32); a warp per 16 rows and a range of
 *      column blocks, 8 warps a block (column ranges of the same 16 rows), K split further over grid.y with
 *      the partial sums added in a fixed order by a second launch.
 *   F  the backend's k_mm_f8 body (src/backend/cuda/cuda_mm.cu, round 13) on plain arguments, with its L2 prefetch
 *      (pf), launch bounds (lb2 / lb3: blocks an SM) and decode order (dec) switched one at a time.
 * Prints per shape: us per call, GB/s of weight + scale bytes, % of the floor, rel L2 error against the host.
 * Results (docs/PERFORMANCE.md, "round 13"): A and B alike (67-73% on the large shapes: the arithmetic is not the
 * limit), T best alone on the large and the small shapes but its x split costs two more launches; F within 10-20% of A. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#define BENCH_NAME "fp8_gemv"
#include "fp8_bench.cuh"
#include "read_floor.cuh"


/* ---- A: the backend's decode -------------------------------------------------------------------------------------- */
/* variant A's step: 16 bytes of each of 4 rows (u), each row's scale (s), 16 floats of x at xp: a word's four
 * elements decoded, scaled and added in order, word by word */
static __device__ __forceinline__ void a_step(const uint4 (&u)[4], const float (&s)[4], const float4 *xp, float (&acc)[4]) {
#pragma unroll
    for (int h = 0; h < 4; h++) {
        const float4 xv = __ldg(xp + h);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t word = h == 0 ? u[i].x : h == 1 ? u[i].y : h == 2 ? u[i].z : u[i].w;
            const float2 lo = fp8x2_f32(word), hi = fp8x2_f32(word >> 16);
            acc[i] = fmaf(__fmul_rn(lo.x, s[i]), xv.x, acc[i]);
            acc[i] = fmaf(__fmul_rn(lo.y, s[i]), xv.y, acc[i]);
            acc[i] = fmaf(__fmul_rn(hi.x, s[i]), xv.z, acc[i]);
            acc[i] = fmaf(__fmul_rn(hi.y, s[i]), xv.w, acc[i]);
        }
    }
}
/* ---- B: integer decode, one scale product a step ------------------------------------------------------------------ */
/* byte i of word as an f32 equal to its E4M3 value times 2^-120 (E4M3's exponent field 0 lands on f32's: subnormals
 * exact; NaN codes are not handled here) */
static __device__ __forceinline__ float e4m3_lo(uint32_t word, int i) {
    const int t = (int)(word << (24 - 8 * i));
    return __int_as_float((t >> 4) & (int)0x87F00000);
}
/* a warp per 4 rows, the whole row; lane steps v = lane + 32 i (16 bytes), U steps in flight; IB: the step's arithmetic is
 * variant B's (e4m3_lo: one scale product a step) instead of A's */
template <int U, int IB>
__global__ void __launch_bounds__(256, 3) k_ab(const uint8_t *w, const float *sc, const float *x, float *y, int M, int K) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    const int r0 = warp * 4;
    if (r0 >= M) return;
    const int nv = K / 16, scols = K / 128;
    float acc[4] = {0, 0, 0, 0};
    const uint4 *rows[4];
    for (int i = 0; i < 4; i++) rows[i] = (const uint4 *)(w + (size_t)min(r0 + i, M - 1) * K);
    const float *srow = sc + (size_t)(r0 / 128) * scols;
    for (int v0 = lane; v0 < nv; v0 += 32 * U) {
        uint4 u[U][4];
        float s[U];
#pragma unroll
        for (int q = 0; q < U; q++) {
            const int v = v0 + 32 * q;
            if (v < nv) {
#pragma unroll
                for (int i = 0; i < 4; i++) u[q][i] = __ldg(rows[i] + v);
                s[q] = __ldg(srow + v / 8);
            }
        }
#pragma unroll
        for (int q = 0; q < U; q++) {
            const int v = v0 + 32 * q;
            if (v >= nv) break;
            const float4 *xp = (const float4 *)(x + (size_t)v * 16);
            if (IB) {
                float part[4] = {0, 0, 0, 0};
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    const float4 xv = __ldg(xp + h);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const uint32_t word = h == 0 ? u[q][i].x : h == 1 ? u[q][i].y : h == 2 ? u[q][i].z : u[q][i].w;
                        part[i] = fmaf(e4m3_lo(word, 0), xv.x, part[i]);
                        part[i] = fmaf(e4m3_lo(word, 1), xv.y, part[i]);
                        part[i] = fmaf(e4m3_lo(word, 2), xv.z, part[i]);
                        part[i] = fmaf(e4m3_lo(word, 3), xv.w, part[i]);
                    }
                }
                const float s2 = s[q] * 1.329228e36f; /* 2^120: the benchmark's scales are < 2^8 */
#pragma unroll
                for (int i = 0; i < 4; i++) acc[i] = fmaf(part[i], s2, acc[i]);
            } else {
                const float s4[4] = {s[q], s[q], s[q], s[q]};
                a_step(u[q], s4, xp, acc);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float t = warp_sum(acc[i]);
        if (lane == 0 && r0 + i < M) y[r0 + i] = t;
    }
}

/* ---- T: tensor cores --------------------------------------------------------------------------------------------- */
/* x split per 128-column block b: xs[p][c] (f16, p = 0..2) with x[c] 2^e_b ~= xs[0][c] + xs[1][c] + xs[2][c], and
 * xf[b] = 2^-e_b. One block of 128 threads per column block. */
__global__ void k_xsplit(const float *x, __half *xs, float *xf, int K) {
    const int b = blockIdx.x, c = b * 128 + threadIdx.x;
    const float v = x[c];
    float m = fabsf(v);
#pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __shared__ float wm[4];
    if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = m;
    __syncthreads();
    m = fmaxf(fmaxf(wm[0], wm[1]), fmaxf(wm[2], wm[3]));
    const int e = m > 0.0f ? 14 - ilogbf(m) : 0;
    const float xv = ldexpf(v, e);
    const __half h1 = __float2half_rn(xv);
    const float r1 = xv - __half2float(h1);
    const __half h2 = __float2half_rn(r1);
    const float r2 = r1 - __half2float(h2);
    xs[c] = h1, xs[K + c] = h2, xs[2 * K + c] = __float2half_rn(r2);
    if (threadIdx.x == 0) xf[b] = ldexpf(1.0f, -e);
}
static __device__ __forceinline__ uint32_t cvt2(uint32_t two) { /* bytes 0, 1 of two -> f16x2 (byte 0 low) */
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffff), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
static __device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* grid (M / 16, S), 8 warps: warp w of split s takes column blocks [cb0, cb1) of the (S x 8)-way split of K / 128
 * blocks; part[s][r] receives the block's sum over its 8 warps (in warp order). A warp step: 64 columns of its 16
 * rows, lane (g = lane / 4, j = lane % 4) loading the 16 bytes at column 16 j of rows g and g + 8; mma m of the step
 * takes bytes 4m..4m+3 (logical k 2j, 2j+1 <- bytes 0, 1; 2j+8, 2j+9 <- bytes 2, 3), and lane g < 3 supplies the
 * same columns of x's part g as B. U: column blocks (2 steps each) a round, loads issued before the mmas. */
template <int U>
__global__ void __launch_bounds__(256) k_t(const uint8_t *w, const float *sc, const __half *xs, const float *xf, float *part, int M, int K) {
    const int wid = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, j = lane & 3;
    const int r0 = blockIdx.x * 16, S = gridDim.y, nb = K / 128;
    const int W = S * 8, wi = blockIdx.y * 8 + wid;
    const int cb0 = (int)((long long)nb * wi / W), cb1 = (int)((long long)nb * (wi + 1) / W);
    const uint8_t *ra = w + (size_t)(r0 + g) * K + 16 * j, *rb = ra + (size_t)8 * K;
    const float *srow = sc + (size_t)(r0 / 128) * nb;
    const __half *xp = xs + (size_t)(g < 3 ? g : 0) * K + 16 * j;
    float acc[4] = {0, 0, 0, 0};
    for (int c = cb0; c < cb1; c += U) {
        uint4 wa[U][2], wb[U][2], xa[U][2][2];
#pragma unroll
        for (int q = 0; q < U; q++) {
            if (c + q < cb1) {
#pragma unroll
                for (int st = 0; st < 2; st++) {
                    const size_t off = (size_t)(c + q) * 128 + 64 * st;
                    wa[q][st] = __ldg((const uint4 *)(ra + off));
                    wb[q][st] = __ldg((const uint4 *)(rb + off));
                    if (g < 3) {
                        xa[q][st][0] = __ldg((const uint4 *)(xp + off));
                        xa[q][st][1] = __ldg((const uint4 *)(xp + off + 8));
                    } else {
                        xa[q][st][0] = make_uint4(0, 0, 0, 0), xa[q][st][1] = make_uint4(0, 0, 0, 0);
                    }
                }
            }
        }
#pragma unroll
        for (int q = 0; q < U; q++) {
            if (c + q >= cb1) break;
            float d[4] = {0, 0, 0, 0};
#pragma unroll
            for (int st = 0; st < 2; st++) {
                const uint32_t A[4] = {wa[q][st].x, wa[q][st].y, wa[q][st].z, wa[q][st].w};
                const uint32_t B[4] = {wb[q][st].x, wb[q][st].y, wb[q][st].z, wb[q][st].w};
                const uint32_t X[8] = {xa[q][st][0].x, xa[q][st][0].y, xa[q][st][0].z, xa[q][st][0].w,
                                       xa[q][st][1].x, xa[q][st][1].y, xa[q][st][1].z, xa[q][st][1].w};
#pragma unroll
                for (int m = 0; m < 4; m++) mma16816(d, cvt2(A[m]), cvt2(B[m]), cvt2(A[m] >> 16), cvt2(B[m] >> 16), X[2 * m], X[2 * m + 1]);
            }
            const float s = __ldg(srow + c + q) * __ldg(xf + c + q);
#pragma unroll
            for (int i = 0; i < 4; i++) acc[i] = fmaf(s, d[i], acc[i]);
        }
    }
    /* row g: columns n = 2j, 2j+1 in acc[0], acc[1]; row g + 8 in acc[2], acc[3]; the row is n = 0 + 1 + 2 */
    const float a01 = acc[0] + acc[1], b01 = acc[2] + acc[3];
    const float a2 = __shfl_down_sync(0xffffffffu, acc[0], 1), b2 = __shfl_down_sync(0xffffffffu, acc[2], 1);
    __shared__ float red[8][16];
    if (j == 0) red[wid][g] = a01 + a2, red[wid][g + 8] = b01 + b2;
    __syncthreads();
    if (threadIdx.x < 16) {
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) t += red[i][threadIdx.x];
        part[(size_t)blockIdx.y * M + r0 + threadIdx.x] = t;
    }
}
__global__ void k_tsum(const float *part, float *y, int M, int S) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= M) return;
    float t = 0.0f;
    for (int s = 0; s < S; s++) t += part[(size_t)s * M + r];
    y[r] = t;
}

/* ---- F: the backend's k_mm_f8<1, 2> body (cuda_mm.cu, round 13) on plain arguments, with switches ---------------------
 * PF: its L2 prefetch of the first 2 KB of each row (1) or none (0); MINB: its launch bounds' blocks an SM (2) or variant A's (3);
 * DEC: its decode order (1: the 8 elements of a half-step of all 4 rows decoded, then x, then the FMAs) or variant A's (0) */
struct WF {
    int64_t rows, cols, scale_cols;
    int blk_r, blk_c;
    size_t row_bytes;
    const uint8_t *data;
    const float *scale;
};
template <int PF, int MINB, int DEC>
__global__ void __launch_bounds__(256, MINB) k_f(const __grid_constant__ WF w, const float *x, float *yv) {
    constexpr int U = 2, E = 16, C = 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * 8 + warp) * 4;
    const int nr = r0 >= w.rows ? 0 : w.rows - r0 < 4 ? (int)(w.rows - r0) : 4;
    if (!nr) return;
    if (PF) {
        const size_t pb = w.row_bytes < 2048 ? w.row_bytes : 2048;
        for (int i = 0; i < nr; i++)
            for (size_t off = (size_t)lane * 128; off < pb; off += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(w.data + (size_t)(r0 + i) * w.row_bytes + off));
    }
    const uint4 *rows[4];
    int64_t srow[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t ri = r0 + (i < nr ? i : 0);
        rows[i] = (const uint4 *)(w.data + (size_t)ri * w.row_bytes);
        srow[i] = (ri / w.blk_r) * w.scale_cols;
    }
    const bool one_s = srow[3] == srow[0];
    const uint32_t vps = (uint32_t)w.blk_c / 16, nv = (uint32_t)(w.cols / E);
    const int vsh = (vps & (vps - 1)) ? -1 : __ffs(vps) - 1;
    float acc[4] = {0, 0, 0, 0};
    for (uint32_t j0 = 0; j0 * 32 < nv; j0 += U) {
        uint4 u[U][4];
        float sc[U][4];
#pragma unroll
        for (int q = 0; q < U; q++) {
            const uint32_t v = (j0 + q) * 32 + lane;
            if (v < nv) {
                const int64_t c = vsh >= 0 ? (int64_t)(v >> vsh) : (int64_t)(v / vps);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    u[q][i] = __ldg(rows[i] + v);
                    sc[q][i] = i && one_s ? sc[q][0] : __ldg(w.scale + srow[i] + c);
                }
            }
        }
#pragma unroll
        for (int q = 0; q < U; q++) {
            const uint32_t v = (j0 + q) * 32 + lane;
            if (v >= nv) break;
            if (DEC) {
#pragma unroll
                for (int h = 0; h < E / C; h++) {
                    float wv[4][C];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const uint32_t qq4[4] = {u[q][i].x, u[q][i].y, u[q][i].z, u[q][i].w};
#pragma unroll
                        for (int k = 0; k < 2; k++) {
                            const float2 lo = fp8x2_f32(qq4[2 * h + k]), hi = fp8x2_f32(qq4[2 * h + k] >> 16);
                            wv[i][4 * k] = __fmul_rn(lo.x, sc[q][i]), wv[i][4 * k + 1] = __fmul_rn(lo.y, sc[q][i]);
                            wv[i][4 * k + 2] = __fmul_rn(hi.x, sc[q][i]), wv[i][4 * k + 3] = __fmul_rn(hi.y, sc[q][i]);
                        }
                    }
                    const float4 *xp = (const float4 *)(x + (int64_t)v * E + h * C);
                    float xv[C];
#pragma unroll
                    for (int qq = 0; qq < C / 4; qq++) {
                        const float4 f = __ldg(xp + qq);
                        xv[4 * qq] = f.x, xv[4 * qq + 1] = f.y, xv[4 * qq + 2] = f.z, xv[4 * qq + 3] = f.w;
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++)
#pragma unroll
                        for (int c = 0; c < C; c++) acc[i] = fmaf(wv[i][c], xv[c], acc[i]);
                }
            } else
                a_step(u[q], sc[q], (const float4 *)(x + (size_t)v * 16), acc);
        }
    }
    float *y = yv + r0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float s = warp_sum(acc[i]);
        if (!lane && i < nr) y[i] = s;
    }
}

/* ---- host -------------------------------------------------------------------------------------------------------- */
struct Shape {
    const char *name;
    int M, K;
};

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const double floor_gbs = read_floor_gbs(sms); /* a 4 GiB read */
    printf("fp8_gemv: HBM read floor %.1f GB/s (4 GiB, best of 6)\n", floor_gbs);
    const Shape shapes[] = {{"q_a 1536x7168", 1536, 7168},     {"kv_a 576x7168", 576, 7168},     {"q_b 24576x1536", 24576, 1536},
                            {"o 7168x16384", 7168, 16384},     {"ffn gate 18432x7168", 18432, 7168}, {"ffn down 7168x18432", 7168, 18432},
                            {"shexp gate 2048x7168", 2048, 7168}, {"shexp down 7168x2048", 7168, 2048}};
    int fails = 0;
    for (const Shape &sh : shapes) {
        if (argc > 2 && !strstr(sh.name, argv[2])) continue; /* fp8_gemv REPS NAME: the shapes whose name holds NAME */
        const int M = sh.M, K = sh.K, nbr = (M + 127) / 128, nb = K / 128;
        const size_t wbytes = (size_t)M * K, sbytes = (size_t)nbr * nb * 4;
        /* copies enough to leave L2 (50 MB) behind: at least 256 MB in all */
        const int ncopy = (int)((256ull << 20) / (wbytes + sbytes) + 1);
        std::vector<uint8_t> hw(wbytes);
        std::vector<float> hs((size_t)nbr * nb), hx(K);
        for (size_t i = 0; i < wbytes; i++) {
            uint8_t b = (uint8_t)rnd();
            if ((b & 0x7f) == 0x7f) b &= 0xfe; /* no NaN codes */
            hw[i] = b;
        }
        for (auto &v : hs) v = ldexpf(1.0f + (rnd() % 1000) / 1000.0f, -12 + (int)(rnd() % 8));
        for (auto &v : hx) v = ((int)(rnd() % 20001) - 10000) / 5000.0f * ldexpf(1.0f, -(int)(rnd() % 6));
        std::vector<double> ref(M);
        for (int r = 0; r < M; r++) {
            double t = 0;
            for (int c = 0; c < K; c++) t += (double)e4m3_host(hw[(size_t)r * K + c]) * hs[(size_t)(r / 128) * nb + c / 128] * hx[c];
            ref[r] = t;
        }
        uint8_t *dw;
        float *ds, *dx, *dy, *dpart, *dxf;
        __half *dxs;
        CK(cudaMalloc(&dw, (wbytes + 256) * ncopy));
        CK(cudaMalloc(&ds, sbytes * ncopy));
        CK(cudaMalloc(&dx, K * 4));
        CK(cudaMalloc(&dy, M * 4));
        CK(cudaMalloc(&dpart, (size_t)64 * M * 4));
        CK(cudaMalloc(&dxs, (size_t)3 * K * 2));
        CK(cudaMalloc(&dxf, nb * 4));
        for (int i = 0; i < ncopy; i++) {
            CK(cudaMemcpy(dw + (wbytes + 256) * i, hw.data(), wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy((char *)ds + sbytes * i, hs.data(), sbytes, cudaMemcpyHostToDevice));
        }
        CK(cudaMemcpy(dx, hx.data(), K * 4, cudaMemcpyHostToDevice));
        /* S for T: at least 2 blocks an SM */
        int S = 1;
        while ((M / 16) * S < 2 * sms && S * 8 * 2 <= nb && S < 64) S *= 2;
        for (int var = 0; var < 12; var++) {
            const char *vn[] = {"A scalar U2", "A scalar U4", "B int U2", "T mma U1", "T mma U2", "T U2 alone", "T U4 alone",
                                "F pf lb2 dec", "F - lb2 dec", "F pf lb3 dec", "F pf lb2 -", "F - lb3 -"};
            auto launch = [&](int i) {
                const uint8_t *w = dw + (wbytes + 256) * i;
                const float *s = (const float *)((const char *)ds + sbytes * i);
                const int warps = (M + 3) / 4, blocks = (warps * 32 + 255) / 256;
                if (var == 0) k_ab<2, 0><<<blocks, 256>>>(w, s, dx, dy, M, K);
                else if (var == 1) k_ab<4, 0><<<blocks, 256>>>(w, s, dx, dy, M, K);
                else if (var == 2) k_ab<2, 1><<<blocks, 256>>>(w, s, dx, dy, M, K);
                else if (var == 5) k_t<2><<<dim3(M / 16, S), 256>>>(w, s, dxs, dxf, dpart, M, K);
                else if (var == 6) k_t<4><<<dim3(M / 16, S), 256>>>(w, s, dxs, dxf, dpart, M, K);
                else if (var >= 7) {
                    const WF wf = {M, K, nb, 128, 128, (size_t)K, w, s};
                    if (var == 7) k_f<1, 2, 1><<<blocks, 256>>>(wf, dx, dy);
                    else if (var == 8) k_f<0, 2, 1><<<blocks, 256>>>(wf, dx, dy);
                    else if (var == 9) k_f<1, 3, 1><<<blocks, 256>>>(wf, dx, dy);
                    else if (var == 10) k_f<1, 2, 0><<<blocks, 256>>>(wf, dx, dy);
                    else k_f<0, 3, 0><<<blocks, 256>>>(wf, dx, dy);
                }
                else {
                    k_xsplit<<<nb, 128>>>(dx, dxs, dxf, K);
                    if (var == 3) k_t<1><<<dim3(M / 16, S), 256>>>(w, s, dxs, dxf, dpart, M, K);
                    else k_t<2><<<dim3(M / 16, S), 256>>>(w, s, dxs, dxf, dpart, M, K);
                    k_tsum<<<(M + 255) / 256, 256>>>(dpart, dy, M, S);
                }
            };
            CK(cudaMemset(dy, 0, M * 4));
            if (var == 5 || var == 6) { /* the whole path once for the result; the product launch alone timed */
                k_xsplit<<<nb, 128>>>(dx, dxs, dxf, K);
                if (var == 5) k_t<2><<<dim3(M / 16, S), 256>>>(dw, ds, dxs, dxf, dpart, M, K);
                else k_t<4><<<dim3(M / 16, S), 256>>>(dw, ds, dxs, dxf, dpart, M, K);
                k_tsum<<<(M + 255) / 256, 256>>>(dpart, dy, M, S);
            } else
                launch(0);
            const double rel = rel_l2_dev(dy, ref.data(), M);
            const double us = time_us(launch, ncopy, reps), gbs = (wbytes + sbytes) / (us * 1e-6) / 1e9;
            printf("%-22s %-12s %8.2f us %7.1f GB/s %5.1f%% of floor  rel L2 %.2e\n", sh.name, vn[var], us, gbs, 100 * gbs / floor_gbs, rel);
            if (!(rel < 1e-5)) fails++;
        }
        if (S > 1) printf("%-22s (T: K split %d ways over grid.y)\n", sh.name, S);
        cudaFree(dw), cudaFree(ds), cudaFree(dx), cudaFree(dy), cudaFree(dpart), cudaFree(dxs), cudaFree(dxf);
    }
    printf("fp8_gemv: %d results off by more than rel L2 1e-5\n", fails);
    return fails != 0;
}
