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
#endif
    printf("test_backend_cuda: %s build, %d failures\n", df_backend_cuda_built() ? "CUDA" : "CPU-only", failures);
    return failures ? 1 : 0;
}
