/* test_backend_cuda.c - backend selection (df_backend_choose: --backend
 * cpu|cuda|auto) in either build, and, in a CUDA build (make CUDA=1, also
 * run by `make cuda-check`), what the CUDA backend refuses before touching
 * a device: GGML block types its kernels do not decode. Needs no GPU; the
 * CUDA backend's arithmetic is tested op by op by test_backend_ops
 * --backend cuda on a GPU. */
#include "backend/backend.h"
#include "deltafin.h"
#include "format/gguf.h"
#ifdef DF_CUDA
#include "backend/cuda/cuda.h"
#endif

#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(c, ...) do { if (!(c)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

int main(void) {
    char err[256] = "";
    CHECK(df_backend_choose(NULL, err, sizeof err) == 0 && df_be == &df_backend_cpu, "NULL keeps the default (cpu)");
    CHECK(df_backend_choose("cpu", err, sizeof err) == 0 && df_be == &df_backend_cpu, "cpu");
    err[0] = 0;
    CHECK(df_backend_choose("gpu", err, sizeof err) == DF_EINPUT && strstr(err, "expected cpu, cuda or auto, got 'gpu'"), "gpu: %s", err);
    CHECK(df_be == &df_backend_cpu, "a refused name leaves the selection");
#ifndef DF_CUDA
    CHECK(!df_backend_cuda_built() && !df_backend_find("cuda"), "a CPU-only build has no cuda backend");
    err[0] = 0;
    CHECK(df_backend_choose("cuda", err, sizeof err) == DF_EUNSUPPORTED && strstr(err, "built without CUDA") && !strchr(err, '\n'), "cuda: %s", err);
    CHECK(df_backend_choose("auto", err, sizeof err) == 0 && df_be == &df_backend_cpu, "auto without CUDA is cpu");
#else
    CHECK(df_backend_cuda_built() && df_backend_find("cuda") == &df_backend_cuda, "a CUDA build lists cuda");
    const int dev = df_cuda_available();
    err[0] = 0;
    int rc = df_backend_choose("cuda", err, sizeof err);
    CHECK(dev ? rc == 0 && df_be == &df_backend_cuda : rc == DF_EUNSUPPORTED && strstr(err, "no CUDA device"), "cuda (device %d): rc %d %s", dev, rc, err);
    df_backend_select("cpu");
    CHECK(df_backend_choose("auto", err, sizeof err) == 0 && df_be == (dev ? &df_backend_cuda : &df_backend_cpu), "auto (device %d)", dev);
    df_backend_select("cpu");
    /* block types without CUDA kernels are refused at register time, before any device call */
    static const int refused[] = {DF_GGML_Q8_1, DF_GGML_Q8_K, DF_GGML_IQ2_XXS, DF_GGML_IQ4_NL, DF_GGML_TQ1_0, DF_GGML_NVFP4, DF_GGML_Q1_0};
    uint8_t bytes[512] = {0};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        df_weight w;
        memset(&w, 0, sizeof w);
        w.fmt = DF_W_GGML, w.ggml_type = refused[i], w.rows = 1, w.cols = 256, w.data = bytes, w.row_bytes = sizeof bytes;
        rc = df_backend_cuda.weight_register(&w);
        CHECK(rc == DF_EUNSUPPORTED && !w.handle, "GGML type %d: rc %d", refused[i], rc);
    }
    df_weight bad;
    memset(&bad, 0, sizeof bad);
    bad.fmt = DF_W_FP8, bad.rows = 1, bad.cols = 16, bad.data = bytes, bad.row_bytes = 16; /* no block shape */
    CHECK(df_backend_cuda.weight_register(&bad) == DF_EUNSUPPORTED && !bad.handle, "FP8 without a block shape");
    /* On a device: the 8 routed experts of a MoE product (weights with an ident, never registered: the VRAM
     * expert cache serves them) go out in ONE launch of the product kernel, with the CPU's results. Before the
     * cached experts joined the batching each ran in a launch of its own (8 here). */
    if (dev) {
        df_backend_select("cuda");
        df_cuda_set_memory((int64_t)256 << 20, 0, (int64_t)8 * 96 * 256 * 4); /* a cache of these 8 experts, not all of VRAM */
        enum { NE = 8, R = 96, C = 256 };
        static float wv[NE][R * C], xv[C], yv[NE][R], yc[R];
        df_weight ew[NE];
        df_mv_job jobs[NE];
        df_act *x = df_backend_cuda.alloc(C), *y[NE];
        for (int c = 0; c < C; c++) xv[c] = (float)((c * 37 % 101) - 50) / 64.0f;
        df_backend_cuda.write(x, xv, C);
        for (int e = 0; e < NE; e++) {
            for (int i = 0; i < R * C; i++) wv[e][i] = (float)(((i + 13 * e) * 29 % 97) - 48) / 128.0f;
            memset(&ew[e], 0, sizeof ew[e]);
            ew[e].fmt = DF_W_F32, ew[e].rows = R, ew[e].cols = C, ew[e].data = (const uint8_t *)wv[e], ew[e].row_bytes = C * sizeof(float);
            ew[e].ident = df_expert_ident(0, e, 0);
            y[e] = df_backend_cuda.alloc(R);
            jobs[e].w = &ew[e], jobs[e].x = x, jobs[e].y = y[e];
        }
        for (int pass = 0; pass < 2; pass++) { /* misses (copies queued), then hits */
            const int64_t l0 = df_cuda_mm_launches();
            df_backend_cuda.matmul_batch(jobs, NE, 1);
            const int64_t launches = df_cuda_mm_launches() - l0;
            CHECK(launches == 1, "pass %d: 8 cached experts in %lld launches, expected 1", pass, (long long)launches);
            if (df_backend_cuda.experts_done) df_backend_cuda.experts_done();
            for (int e = 0; e < NE; e++) {
                df_backend_cuda.read(yv[e], y[e], R);
                for (int r = 0; r < R; r++) yc[r] = df_dot_row(&ew[e], r, xv);
                double d = 0, n2 = 0;
                for (int r = 0; r < R; r++) d += (double)(yv[e][r] - yc[r]) * (yv[e][r] - yc[r]), n2 += (double)yc[r] * yc[r];
                CHECK(d <= 1e-10 * n2, "pass %d expert %d: rel L2^2 %g against the CPU", pass, e, n2 > 0 ? d / n2 : d);
            }
        }
        /* One-token dense products of few blocks (q/k/v, o, router, lm_head of a decode step) run in 4-warp
         * blocks with a small job table (df_cuda_set_lean(1), the default): the same bits as the 8-warp launch
         * with the full table (lean off), jobs whose rows split over 1 and 2 warps, in one launch each way. */
        {
            enum { ND = 3 };
            static const int DR[ND] = {200, 96, 61}, DC[ND] = {512, 4096, 1024};
            static float dw[ND][200 * 4096], dx[4096], dy[2][ND][200];
            df_weight w2[ND];
            df_mv_job dj[ND];
            df_act *xd = df_backend_cuda.alloc(4096), *yd[ND];
            for (int c = 0; c < 4096; c++) dx[c] = (float)((c * 53 % 113) - 56) / 32.0f;
            df_backend_cuda.write(xd, dx, 4096);
            for (int k = 0; k < ND; k++) {
                for (int i = 0; i < DR[k] * DC[k]; i++) dw[k][i] = (float)(((i + 7 * k) * 31 % 89) - 44) / 256.0f;
                memset(&w2[k], 0, sizeof w2[k]);
                w2[k].fmt = DF_W_F32, w2[k].rows = DR[k], w2[k].cols = DC[k], w2[k].data = (const uint8_t *)dw[k], w2[k].row_bytes = (size_t)DC[k] * sizeof(float);
                CHECK(df_backend_cuda.weight_register(&w2[k]) == 0 && w2[k].handle, "dense weight %d registered", k);
                yd[k] = df_backend_cuda.alloc((size_t)DR[k]);
                dj[k].w = &w2[k], dj[k].x = xd, dj[k].y = yd[k];
            }
            for (int lean = 1; lean >= 0; lean--) {
                df_cuda_set_lean(lean);
                const int64_t l0 = df_cuda_mm_launches(), n0 = df_cuda_mm_narrow_launches();
                df_backend_cuda.matmul_batch(dj, ND, 1);
                const int64_t launches = df_cuda_mm_launches() - l0, narrow = df_cuda_mm_narrow_launches() - n0;
                CHECK(launches == 1 && narrow == lean, "lean %d: %lld launches (%lld narrow), expected 1 (%d)", lean, (long long)launches, (long long)narrow, lean);
                for (int k = 0; k < ND; k++) df_backend_cuda.read(dy[lean][k], yd[k], (size_t)DR[k]);
            }
            df_cuda_set_lean(1);
            for (int k = 0; k < ND; k++) {
                CHECK(!memcmp(dy[0][k], dy[1][k], (size_t)DR[k] * sizeof(float)), "dense job %d: the narrow launch changed bits", k);
                double d = 0, n2 = 0;
                for (int r = 0; r < DR[k]; r++) {
                    const float c = df_dot_row(&w2[k], r, dx);
                    d += (double)(dy[1][k][r] - c) * (dy[1][k][r] - c), n2 += (double)c * c;
                }
                CHECK(d <= 1e-10 * n2, "dense job %d: rel L2^2 %g against the CPU", k, n2 > 0 ? d / n2 : d);
                df_backend_cuda.weight_unregister(&w2[k]);
                df_backend_cuda.free(yd[k]);
            }
            df_backend_cuda.free(xd);
        }
        for (int e = 0; e < NE; e++) df_backend_cuda.free(y[e]);
        df_backend_cuda.free(x);
        if (df_backend_cuda.tier_reset) df_backend_cuda.tier_reset();
        df_backend_select("cpu");
    } else
        printf("test_backend_cuda: no CUDA device: the batching check of cached experts is SKIPPED\n");
#endif
    printf("test_backend_cuda: %s build, %d failures\n", df_backend_cuda_built() ? "CUDA" : "CPU-only", failures);
    return failures ? 1 : 0;
}
