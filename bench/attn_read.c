/* attn_read.c - how fast the attention rounds can read a GQA KV cache laid out as the engine keeps it (position
 * j: K of every KV head, then V of every KV head, 2 x kdim floats), one thread, the cache cold (larger than the
 * last-level cache over all layers). Loads only (a sum that keeps them); no attention arithmetic. Modes:
 *   heads   each KV head's K rows over all positions, then each head's V rows (the long-cache rounds before
 *           2026-12-02: units of (KV head, key chunk), then (KV head, dimensions));
 *   touch   chunks of 128 positions: one load per 64-byte line of the whole rows first, then each head's K rows
 *           of the chunk; then each head's V rows over all positions (attn.c's rounds since);
 *   rows    every row whole, once: the pattern's floor (what the hardware prefetcher streams best).
 * Prints ms per sweep of all layers and GB/s of cache bytes. Not a timed test: the numbers move with the host.
 *
 * usage: attn_read [POSITIONS=1346] [LAYERS=30] [KV_HEADS=3] [HEAD_DIM=64]   (SmolLM2-135M's cache by default) */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* sum of floats [off, off + w) of n rows ld apart (w a multiple of 32) */
static __m256 sweep(const float *a, long n, long ld, long off, long w) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (long r = 0; r < n; r++) {
        const float *p = a + r * ld + off;
        for (long d = 0; d < w; d += 32) {
            s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + d));
            s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + d + 8));
            s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + d + 16));
            s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + d + 24));
        }
    }
    return _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
}

/* one load per 64-byte line (attn.c's touch_rows) */
static uint32_t touch(const float *a, long n, long ld) {
    uint32_t t = 0, u;
    for (long r = 0; r < n; r++)
        for (long d = 0; d < ld; d += 16) memcpy(&u, a + r * ld + d, 4), t |= u;
    return t;
}

int main(int argc, char **argv) {
    const long P = argc > 1 ? atol(argv[1]) : 1346, L = argc > 2 ? atol(argv[2]) : 30;
    const long KV = argc > 3 ? atol(argv[3]) : 3, hd = argc > 4 ? atol(argv[4]) : 64, kdim = KV * hd, ld = 2 * kdim;
    if (P < 1 || L < 1 || KV < 1 || hd < 32 || hd % 32) {
        fprintf(stderr, "usage: attn_read [POSITIONS] [LAYERS] [KV_HEADS] [HEAD_DIM, a multiple of 32]\n");
        return 2;
    }
    const size_t n = (size_t)P * (size_t)L * (size_t)ld;
    float *a = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!a) return 1;
    for (size_t i = 0; i < n; i++) a[i] = (float)(i % 7 + 1);
    const char *names[3] = {"heads", "touch", "rows"};
    printf("cache: %ld positions x %ld layers x %ld floats (%.1f MB)\n", P, L, ld, (double)n * 4 / 1e6);
    for (int mode = 0; mode < 3; mode++) {
        double best = 1e30;
        float keep = 0;
        uint32_t tk = 0;
        for (int rep = 0; rep < 5; rep++) {
            __m256 s = _mm256_setzero_ps();
            const double t0 = now();
            for (long l = 0; l < L; l++) {
                const float *b = a + (size_t)l * (size_t)P * (size_t)ld;
                if (mode == 0) {
                    for (long h = 0; h < KV; h++) s = _mm256_add_ps(s, sweep(b, P, ld, h * hd, hd));
                } else if (mode == 1) {
                    for (long c0 = 0; c0 < P; c0 += 128) {
                        const long nc = P - c0 < 128 ? P - c0 : 128;
                        tk |= touch(b + c0 * ld, nc, ld);
                        for (long h = 0; h < KV; h++) s = _mm256_add_ps(s, sweep(b + c0 * ld, nc, ld, h * hd, hd));
                    }
                } else {
                    s = _mm256_add_ps(s, sweep(b, P, ld, 0, ld));
                }
                if (mode < 2)
                    for (long h = 0; h < KV; h++) s = _mm256_add_ps(s, sweep(b, P, ld, kdim + h * hd, hd));
            }
            const double t = now() - t0;
            float v[8];
            _mm256_storeu_ps(v, s);
            keep += v[0];
            if (t < best) best = t;
        }
        printf("%-6s %8.2f ms per sweep, %6.1f GB/s of cache (best of 5; %g %u)\n", names[mode], best * 1e3,
               (double)n * 4 / best / 1e9, keep, tk);
    }
    free(a);
    return 0;
}
