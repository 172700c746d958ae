/* gemm_tile_exp.c - docs/PERFORMANCE.md "Issue 17: two-thread GEMM, round 7":
 * the prefill GEMM's micro-kernels alone, one thread, per second of the
 * thread's own CPU time (CLOCK_THREAD_CPUTIME_ID: time given to other
 * processes is not counted; the host's fast/slow modes still are, so the
 * tests run interleaved, round after round, and are compared within a
 * round). A measuring aid, not built by the Makefile:
 *
 *   make build/bench/kernel_bench   # the objects it links
 *   cc -std=c11 -D_GNU_SOURCE -O2 -mavx2 -mfma -Iinclude -Isrc -pthread -o /tmp/gtx bench/gemm_tile_exp.c
 *      build/src/backend/cpu/kernels_avx2.o build/src/backend/cpu/kernels_scalar.o
 *      build/src/backend/cpu/kernels_avx512.o build/src/util/util.o -lm   (one line)
 *   /tmp/gtx [ROUNDS [PAD]]   (PAD: x rows K + PAD floats apart; default 0)
 *
 * Tests (GFLOP/s = 2 x rows x kc x tokens per CPU-second):
 *   fma:      12 FMA chains in registers (the thread's FMA rate);
 *   g16 KC:   mm_rows' loops before round 7: a packed block of 48 rows (three
 *             16-row panels) x KC columns, 64 tokens in blocks of 6 (3 x 16
 *             + 4 x 4... equal blocks: 6,6,...,4), gemm16 per panel;
 *   g24 KC:   round 7's: the same block, tokens in blocks of 4, gemm24 per
 *             24-row tile (two tiles, the middle panel shared);
 *   pack:     pack16 of 48 rows x 2048 of a 2048 x 2048 f32 weight (GB/s of
 *             weights; rows 8 KB apart, the weight past L2).
 * The x block is the 64 tokens' rows of K = 2048 (8 KB apart), as in the
 * engine. */
#include "backend/cpu/kernels.h"
#include "util/util.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* round 7's 24 x 4 micro-kernel (measured not ahead of gemm16 in the engine: docs/PERFORMANCE.md; kept here,
 * not in the backend, so the experiment can be re-run). Each output the same fmaf chain over k as gemm16. */
/* 24 rows x NT <= 4 tokens on the 16-row panels: the tile is NH <= 3 half
 * panels (8 rows each, round 7's gemm24), three loads of W and NT broadcasts
 * per 3 NT FMAs; at 24 x 4 twelve accumulators + 3 W vectors + 1 broadcast =
 * the 16 ymm registers (16 x 6: 2 loads + 6 broadcasts per 12 FMAs). */
#define Q_STEP(T)                                                                                                 \
    if (T < nt_) {                                                                                                \
        const __m256 xb = _mm256_broadcast_ss(x##T + k);                                                         \
        a##T = _mm256_fmadd_ps(w0, xb, a##T);                                                                     \
        if (nh_ > 1) b##T = _mm256_fmadd_ps(w1, xb, b##T);                                                        \
        if (nh_ > 2) c##T = _mm256_fmadd_ps(w2, xb, c##T);                                                        \
    }
#define Q_LOAD(T)                                                                                                 \
    if (T < nt_) {                                                                                                \
        a##T = acc ? _mm256_loadu_ps(Y + T * ldy) : _mm256_setzero_ps();                                         \
        if (nh_ > 1) b##T = acc ? _mm256_loadu_ps(Y + T * ldy + 8) : _mm256_setzero_ps();                        \
        if (nh_ > 2) c##T = acc ? _mm256_loadu_ps(Y + T * ldy + 16) : _mm256_setzero_ps();                       \
    }
#define Q_STORE(T)                                                                                                \
    if (T < nt_) {                                                                                                \
        _mm256_storeu_ps(Y + T * ldy, a##T);                                                                      \
        if (nh_ > 1) _mm256_storeu_ps(Y + T * ldy + 8, b##T);                                                     \
        if (nh_ > 2) _mm256_storeu_ps(Y + T * ldy + 16, c##T);                                                    \
    }
#define GEMM24_NT(NH, NT)                                                                                         \
    static void gemm24_##NH##_##NT(const float *H0, const float *H1, const float *H2, int64_t kc, const float *X, \
                                   int64_t ldx, float *Y, int64_t ldy, int acc) {                                 \
        enum { nh_ = NH, nt_ = NT };                                                                              \
        const float *x0 = X, *x1 = 1 < NT ? X + ldx : X, *x2 = 2 < NT ? X + 2 * ldx : X;                          \
        const float *x3 = 3 < NT ? X + 3 * ldx : X;                                                               \
        __m256 a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3;                                                    \
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = _mm256_setzero_ps();                          \
        Q_LOAD(0) Q_LOAD(1) Q_LOAD(2) Q_LOAD(3)                                                                   \
        for (int64_t k = 0; k < kc; k++, H0 += 16, H1 += 16, H2 += 16) {                                          \
            const __m256 w0 = _mm256_load_ps(H0);                                                                 \
            const __m256 w1 = nh_ > 1 ? _mm256_load_ps(H1) : w0, w2 = nh_ > 2 ? _mm256_load_ps(H2) : w0;         \
            Q_STEP(0) Q_STEP(1) Q_STEP(2) Q_STEP(3)                                                               \
        }                                                                                                         \
        Q_STORE(0) Q_STORE(1) Q_STORE(2) Q_STORE(3)                                                               \
        (void)x1, (void)x2, (void)x3;                                                                             \
    }
GEMM24_NT(1, 1)
GEMM24_NT(1, 2)
GEMM24_NT(1, 3)
GEMM24_NT(1, 4)
GEMM24_NT(2, 1)
GEMM24_NT(2, 2)
GEMM24_NT(2, 3)
GEMM24_NT(2, 4)
GEMM24_NT(3, 1)
GEMM24_NT(3, 2)
GEMM24_NT(3, 3)
GEMM24_NT(3, 4)

/* P must be 32-byte aligned */
static void gemm24_avx2(const float *P, int64_t ps, int h0, int64_t kc, const float *X, int64_t ldx, int nt, float *Y,
                      int64_t ldy, int nr, int acc) {
    typedef void (*fn_t)(const float *, const float *, const float *, int64_t, const float *, int64_t, float *, int64_t, int);
    static const fn_t fn[3][4] = {{gemm24_1_1, gemm24_1_2, gemm24_1_3, gemm24_1_4},
                                  {gemm24_2_1, gemm24_2_2, gemm24_2_3, gemm24_2_4},
                                  {gemm24_3_1, gemm24_3_2, gemm24_3_3, gemm24_3_4}};
    if (nt < 1 || nr < 1) return;
    const int nh = (nr + 7) / 8;
    const float *H[3];
    for (int j = 0; j < 3; j++) {
        const int h = h0 + (j < nh ? j : 0);
        H[j] = P + (int64_t)(h / 2) * ps + (h % 2) * 8;
    }
    if (nr == 8 * nh) { fn[nh - 1][nt - 1](H[0], H[1], H[2], kc, X, ldx, Y, ldy, acc); return; }
    float tmp[4 * 24];
    if (acc)
        for (int t = 0; t < nt; t++) memcpy(tmp + t * 24, Y + t * ldy, (size_t)nr * sizeof(float));
    fn[nh - 1][nt - 1](H[0], H[1], H[2], kc, X, ldx, tmp, 24, acc);
    for (int t = 0; t < nt; t++) memcpy(Y + t * ldy, tmp + t * 24, (size_t)nr * sizeof(float));
}

#define K 2048
#define NTOK 64
#define MC 48

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *X, *Y, *PK, *W;
static int64_t LDX = K; /* x's row stride: K as in the engine (rows 8 KB apart, one L1 set), or padded */

static void run_g16(int64_t kc) {
    for (int64_t k0 = 0; k0 + kc <= K; k0 += kc)
        for (int t = 0; t < NTOK;) {
            const int left = NTOK - t, nt = (left + (left + 5) / 6 - 1) / ((left + 5) / 6);
            for (int p = 0; p < MC / 16; p++)
                df_k_gemm16_avx2(PK + (size_t)p * 16 * K + (size_t)k0 * 16, kc, X + (int64_t)t * LDX + k0, LDX, nt, Y + (int64_t)t * MC + p * 16,
                                 MC, 16, k0 > 0);
            t += nt;
        }
}
static void run_g24(int64_t kc) {
    for (int64_t k0 = 0; k0 + kc <= K; k0 += kc)
        for (int t = 0; t < NTOK; t += 4)
            for (int i0 = 0; i0 < MC; i0 += 24)
                gemm24_avx2(PK + (size_t)k0 * 16, (int64_t)16 * K, i0 / 8, kc, X + (int64_t)t * LDX + k0, LDX, 4, Y + (int64_t)t * MC + i0, MC,
                                 24, k0 > 0);
}
/* a 24-wide k-major panel (P[k*24 + i]): the layout a pack24 would give */
static float *PC;
static void g24c(const float *P, int64_t kc, const float *X0, float *Yt, int acc) {
    const float *x0 = X0, *x1 = X0 + LDX, *x2 = X0 + 2 * LDX, *x3 = X0 + 3 * LDX;
    __m256 a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3;
#define L3(v, t, o) v = acc ? _mm256_loadu_ps(Yt + t * MC + o) : _mm256_setzero_ps()
    L3(a0, 0, 0); L3(b0, 0, 8); L3(c0, 0, 16); L3(a1, 1, 0); L3(b1, 1, 8); L3(c1, 1, 16);
    L3(a2, 2, 0); L3(b2, 2, 8); L3(c2, 2, 16); L3(a3, 3, 0); L3(b3, 3, 8); L3(c3, 3, 16);
    for (int64_t k = 0; k < kc; k++, P += 24) {
        const __m256 w0 = _mm256_load_ps(P), w1 = _mm256_load_ps(P + 8), w2 = _mm256_load_ps(P + 16);
        __m256 xb = _mm256_broadcast_ss(x0 + k);
        a0 = _mm256_fmadd_ps(w0, xb, a0), b0 = _mm256_fmadd_ps(w1, xb, b0), c0 = _mm256_fmadd_ps(w2, xb, c0);
        xb = _mm256_broadcast_ss(x1 + k);
        a1 = _mm256_fmadd_ps(w0, xb, a1), b1 = _mm256_fmadd_ps(w1, xb, b1), c1 = _mm256_fmadd_ps(w2, xb, c1);
        xb = _mm256_broadcast_ss(x2 + k);
        a2 = _mm256_fmadd_ps(w0, xb, a2), b2 = _mm256_fmadd_ps(w1, xb, b2), c2 = _mm256_fmadd_ps(w2, xb, c2);
        xb = _mm256_broadcast_ss(x3 + k);
        a3 = _mm256_fmadd_ps(w0, xb, a3), b3 = _mm256_fmadd_ps(w1, xb, b3), c3 = _mm256_fmadd_ps(w2, xb, c3);
    }
#define S3(v, t, o) _mm256_storeu_ps(Yt + t * MC + o, v)
    S3(a0, 0, 0); S3(b0, 0, 8); S3(c0, 0, 16); S3(a1, 1, 0); S3(b1, 1, 8); S3(c1, 1, 16);
    S3(a2, 2, 0); S3(b2, 2, 8); S3(c2, 2, 16); S3(a3, 3, 0); S3(b3, 3, 8); S3(c3, 3, 16);
}
static void run_g24c(int64_t kc) {
    for (int64_t k0 = 0; k0 + kc <= K; k0 += kc)
        for (int t = 0; t < NTOK; t += 4)
            for (int i0 = 0; i0 < MC; i0 += 24)
                g24c(PC + (size_t)i0 * K + (size_t)k0 * 24, kc, X + (int64_t)t * LDX + k0, Y + (int64_t)t * MC + i0, k0 > 0);
}
static float fma_sink;
static void run_fma(void) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 a0 = m, a1 = c, a2 = m, a3 = c, a4 = m, a5 = c, a6 = m, a7 = c, a8 = m, a9 = c, a10 = m, a11 = c;
    for (int it = 0; it < 100000; it++) {
        a0 = _mm256_fmadd_ps(a0, m, c), a1 = _mm256_fmadd_ps(a1, m, c), a2 = _mm256_fmadd_ps(a2, m, c);
        a3 = _mm256_fmadd_ps(a3, m, c), a4 = _mm256_fmadd_ps(a4, m, c), a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c), a7 = _mm256_fmadd_ps(a7, m, c), a8 = _mm256_fmadd_ps(a8, m, c);
        a9 = _mm256_fmadd_ps(a9, m, c), a10 = _mm256_fmadd_ps(a10, m, c), a11 = _mm256_fmadd_ps(a11, m, c);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)), _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    fma_sink += _mm256_cvtss_f32(s);
}
static int pack_row;
static void run_pack(void) {
    for (int p = 0; p < MC / 16; p++) df_k_pack16_avx2(W + (size_t)(pack_row + p * 16) * K, K, 16, K, PK + (size_t)p * 16 * K);
    pack_row = (pack_row + MC) % (K - MC);
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (argc > 2) LDX = K + atoi(argv[2]);
    X = df_aligned_alloc((size_t)NTOK * LDX * 4), Y = df_aligned_alloc((size_t)NTOK * MC * 4);
    PK = df_aligned_alloc((size_t)MC * K * 4), W = df_aligned_alloc((size_t)K * K * 4);
    for (size_t i = 0; i < (size_t)NTOK * LDX; i++) X[i] = (float)(i % 17) * 0.01f;
    for (size_t i = 0; i < (size_t)K * K; i++) W[i] = (float)(i % 13) * 0.01f;
    for (int p = 0; p < MC / 16; p++) df_k_pack16_avx2(W + (size_t)p * 16 * K, K, 16, K, PK + (size_t)p * 16 * K);
    PC = df_aligned_alloc((size_t)MC * K * 4);
    for (int i = 0; i < MC; i++)
        for (int k = 0; k < K; k++) PC[(size_t)(i / 24) * 24 * K + (size_t)k * 24 + i % 24] = W[(size_t)i * K + k];
    const char *names[] = {"fma", "g16 512", "g24 512", "g16 256", "g24 256", "g24 128", "pack", "g24c 512", "g24c 128"};
    enum { NT = 9 };
    double res[NT][64];
    for (int r = 0; r < rounds && r < 64; r++)
        for (int ti = 0; ti < NT; ti++) {
            int reps = 0;
            double t0 = cpu_now(), t1, work = 0;
            do {
                switch (ti) {
                case 0: run_fma(), work += 100000.0 * 12 * 16; break;
                case 1: run_g16(512), work += 2.0 * MC * K * NTOK; break;
                case 2: run_g24(512), work += 2.0 * MC * K * NTOK; break;
                case 3: run_g16(256), work += 2.0 * MC * K * NTOK; break;
                case 4: run_g24(256), work += 2.0 * MC * K * NTOK; break;
                case 5: run_g24(128), work += 2.0 * MC * K * NTOK; break;
                case 6: run_pack(), work += (double)MC * K * 4; break;
                case 7: run_g24c(512), work += 2.0 * MC * K * NTOK; break;
                default: run_g24c(128), work += 2.0 * MC * K * NTOK; break;
                }
                reps++;
                t1 = cpu_now();
            } while (t1 - t0 < 0.05);
            res[ti][r] = work / (t1 - t0) * 1e-9;
        }
    for (int ti = 0; ti < NT; ti++) {
        printf("%-8s", names[ti]);
        for (int r = 0; r < rounds && r < 64; r++) printf(" %6.1f", res[ti][r]);
        printf("   %s\n", ti == 6 ? "GB/s" : "GFLOP/s");
    }
    return fma_sink == 12345.0f;
}
