/* read_floor.cuh - the HBM read floor's kernel, shared by cuda_bench.cu and fp8_gemv.cu: every 16 bytes of p read once
 * (grid-stride, 16-byte loads through the read-only path), folded so the loads cannot be dropped. */
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void k_read(const uint4 *p, size_t n, unsigned *sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = acc;
}
