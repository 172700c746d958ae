/* h2d_bw.cu - the floor for the CUDA tier benchmark: host -> device copy
 * bandwidth of pinned buffers (cudaHostAlloc + cudaMemcpyAsync on a
 * non-blocking stream, as the VRAM expert cache copies), for copies of
 * CHUNK bytes (an expert part: 768 x 2048 BF16 = 3 MiB) and of 256 MiB.
 * Prints one line per chunk size: bytes, seconds, GB/s.
 * Usage: h2d_bw [TOTAL_MB (default 2048)] */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "h2d_bw: %s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

int main(int argc, char **argv) {
    const size_t total = (size_t)(argc > 1 ? atoi(argv[1]) : 2048) << 20;
    void *h = NULL, *d = NULL;
    CK(cudaHostAlloc(&h, total, cudaHostAllocDefault));
    CK(cudaMalloc(&d, total));
    for (size_t i = 0; i < total; i += 4096) ((char *)h)[i] = (char)i;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const size_t chunks[] = {(size_t)768 * 2048 * 2, (size_t)256 << 20};
    for (int c = 0; c < 2; c++) {
        const size_t ch = chunks[c];
        float best = 0;
        for (int rep = 0; rep < 3; rep++) {
            CK(cudaEventRecord(a, s));
            size_t done = 0;
            for (size_t off = 0; off + ch <= total; off += ch, done += ch) CK(cudaMemcpyAsync((char *)d + off, (char *)h + off, ch, cudaMemcpyHostToDevice, s));
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            float gbs = done / (ms / 1e3f) / 1e9f;
            if (gbs > best) best = gbs;
        }
        printf("h2d pinned: chunks of %zu B: %.2f GB/s (best of 3 over %zu MB)\n", ch, best, total >> 20);
    }
    return 0;
}
