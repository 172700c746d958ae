/* float_decode_exp.c - the experiments of docs/PERFORMANCE.md "Issue 17:
 * float decode, round 3": where the float decode products lose against the
 * read floor. Not built by the Makefile (a measuring aid, not a tool):
 *
 *   make build/bench/kernel_bench   # the objects it links
 *   cc -std=c11 -D_GNU_SOURCE -O2 -mavx2 -mfma -Iinclude -Isrc -pthread -o /tmp/fdx bench/float_decode_exp.c
 *      $(find build/src/backend build/src/format build/src/util -name '*.o')
 *      -ljansson -lpcre2-8 -lmicrohttpd -luring -lxxhash -lcrypto -lcurl -lpng16 -lm   (one line)
 *   /tmp/fdx [-t THREADS] [-r ROUNDS] [-cpu] [-nofloor] [-imb] NAME=SPEC ...
 *
 * Each round: a two-thread floor pass (floors.c, as kernel_bench; -nofloor:
 * none), then every variant once (order rotated per round), each timed as
 * the best of 3 passes over its ~256 MiB matrix after one warm pass; prints
 * per variant the median GB/s, the median % of its round's floor and the
 * median ratio to the first variant of the same round. -cpu: process CPU
 * seconds / threads instead of wall time (use with -t 1 on a loaded host).
 * -imb: per pass of kind 3 on two shares, how far apart the two shares end.
 *
 * SPEC = alloc,fmt,cols,kind[,group,pf,dist,shares]
 *   alloc 0: as kernel_bench did (64-byte aligned, its madvise fails: 4 KiB
 *         pages), 1: 2 MiB aligned + MADV_HUGEPAGE (the engine's, the
 *         floor's), 2: 2 MiB aligned + MADV_NOHUGEPAGE
 *   fmt f32|bf16|f16|fp8 (FP8: 128x128 f32 block scales), cols: row length
 *   kind 0: the engine's decode product (df_cpu_matmul_batch, n = 1)
 *   kind 1: a floor-shaped read of the same matrix (integer sums of 32-byte
 *         loads, no x) with the product's thread split (halves aligned to 8
 *         rows); group 1: one row at a time, 2/4/8: that many adjacent rows
 *         side by side, 12/14/18: 2/4/8 rows a 1/2, 1/4, 1/8 of the range
 *         apart; pf 1: the next group's lines (T0, round 2's kernels), 2: the
 *         same NTA, 3: each stream dist bytes ahead (T0)
 *   kind 3: BF16 four-row kernel (a copy of the AVX2 one) with its own
 *         driver; group 0: four adjacent rows, 1: four rows a quarter of the
 *         range apart, 2: that + prefetch dist bytes ahead T0, 3: the same
 *         NTA, 4: x reads confined to its first 4 KiB (wrong sums: tests
 *         whether x falling out of L1 costs); shares: pool shares (0: one
 *         per thread)
 *   kind 4: FP8 four-row kernel (a copy of the AVX2 one as it was before
 *         the in-lane widening: its sums assume that round's x order, so
 *         with today's fp8x_prep only its speed means something), rows a
 *         quarter apart; group 1: with the NaN check, 0: without; pf 3 T0 /
 *         4 NTA dist bytes ahead in each stream
 * FDX_BYTES=N in the environment: matrices of ~N bytes instead of 256e6
 * (256e3: L2-resident, the compute ceiling). FDX_FP8_CHECK=1: FP8 weights
 * marked DF_NAN_CODES_MAYBE (the four-row kernel with its NaN-code check;
 * unset, the product checks the weight once and runs the kernel without). */
#include "backend/cpu/cpu.h"
#include "backend/cpu/floors.h"
#include "backend/cpu/kernels.h"
#include "util/util.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }

static int g_cpu, g_imb;
static double now(void) {
    struct timespec ts;
    clock_gettime(g_cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ((double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec) / (g_cpu ? df_pool_size() : 1);
}

/* alloc: 0 = as kernel_bench (64-aligned, madvise on it), 1 = 2 MiB aligned + HUGEPAGE, 2 = 2 MiB + NOHUGEPAGE */
static uint8_t *alloc_m(size_t n, int mode) {
    uint8_t *p = NULL;
    if (mode == 0) {
        p = df_aligned_alloc(n);
        if (madvise(p, n, MADV_HUGEPAGE)) fprintf(stderr, "(madvise a64 failed, as in kernel_bench)\n");
    } else {
        if (posix_memalign((void **)&p, (size_t)2 << 20, n)) abort();
        madvise(p, n, mode == 1 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    }
    return p;
}
static long anon_huge_kb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages:", 14)) kb = atol(line + 14);
    if (f) fclose(f);
    return kb;
}

typedef struct {
    const uint8_t *d;
    int64_t rows, rb;   /* rows, row bytes */
    int group;          /* 1 or 4 rows side by side */
    int pf;             /* 0 none, 1 next group T0 (as the kernels), 2 next group NTA, 3 same row +dist T0 */
    int dist;
    int split;          /* 0 contiguous halves (dot_rows), 1 shares of 64 rows claimed */
    int unroll;         /* 32-byte loads per row per step: 1 or 2 */
    int64_t sink[64];
} rd_ctx;

#define PF4(b, ld, off, H) _mm_prefetch((const char *)(b) + 4 * (ld) + (off), H), _mm_prefetch((const char *)(b) + 5 * (ld) + (off), H), \
                           _mm_prefetch((const char *)(b) + 6 * (ld) + (off), H), _mm_prefetch((const char *)(b) + 7 * (ld) + (off), H)

static void rd_rows(rd_ctx *c, int64_t r0, int64_t r1, int tid) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    int64_t ld = c->rb;
    const int G = c->group >= 10 ? c->group - 10 : c->group; /* 1x: far rows (quarters of the range) */
    const int far = c->group >= 10;
    int64_t r = r0, step = G, last = r1;
    if (far) { ld = (r1 - r0) / G * c->rb; step = 1; last = r0 + (r1 - r0) / G; }
    if (G >= 2)
        for (; r + (far ? 1 : G) <= last; r += step) {
            const uint8_t *w = c->d + r * c->rb;
            for (int64_t i = 0; i + 32 <= c->rb; i += 32) {
                if (c->pf == 1 && !(i & 63)) PF4(w, ld, i, _MM_HINT_T0);
                if (c->pf == 2 && !(i & 63)) PF4(w, ld, i, _MM_HINT_NTA);
                if (c->pf == 3 && !(i & 63))
                    for (int k = 0; k < G; k++) _mm_prefetch((const char *)w + k * ld + i + c->dist, _MM_HINT_T0);
                a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(w + i)));
                a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(w + ld + i)));
                if (G >= 4) {
                    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(w + 2 * ld + i)));
                    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(w + 3 * ld + i)));
                }
                if (G >= 8) {
                    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(w + 4 * ld + i)));
                    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(w + 5 * ld + i)));
                    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(w + 6 * ld + i)));
                    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(w + 7 * ld + i)));
                }
            }
        }
    if (far) r = r0 + (last - r0) * G;
    for (; r < r1; r++) {
        const uint8_t *w = c->d + r * c->rb;
        int64_t i = 0;
        for (; i + 128 <= c->rb; i += 128) {
            if (c->pf == 3) _mm_prefetch((const char *)w + i + c->dist, _MM_HINT_T0), _mm_prefetch((const char *)w + i + 64 + c->dist, _MM_HINT_T0);
            a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(w + i)));
            a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(w + i + 32)));
            a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(w + i + 64)));
            a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(w + i + 96)));
        }
        for (; i + 32 <= c->rb; i += 32) a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(w + i)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    int64_t t[4];
    _mm256_storeu_si256((__m256i *)t, a0);
    c->sink[(tid & 7) * 8] += t[0] + t[1] + t[2] + t[3];
}
static void rd_task(void *p, int share, int shares) {
    rd_ctx *c = p;
    int64_t chunks = (c->rows + 7) / 8, b = chunks * share / shares * 8, e = chunks * (share + 1) / shares * 8;
    if (e > c->rows) e = c->rows;
    rd_rows(c, b, e, share);
}


static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define BF_EV(v) _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))
#define BF_OD(v) _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)))
/* four rows at w, w+ld, ..: pf 0 none, 3 ahead dist bytes in each stream */
static inline __attribute__((always_inline)) void x4_bf16p(const uint16_t *w, int64_t ld, const float *xp, int64_t n, float *out, int pf, int dist) {
    const int64_t xm = pf == 5 ? 1023 : -1;
    __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (pf == 3 && !(i & 31)) {
            const char *b = (const char *)(w + i) + dist;
            _mm_prefetch(b, _MM_HINT_T0), _mm_prefetch(b + 2 * ld, _MM_HINT_T0), _mm_prefetch(b + 4 * ld, _MM_HINT_T0), _mm_prefetch(b + 6 * ld, _MM_HINT_T0);
        }
        if (pf == 4 && !(i & 31)) {
            const char *b = (const char *)(w + i) + dist;
            _mm_prefetch(b, _MM_HINT_NTA), _mm_prefetch(b + 2 * ld, _MM_HINT_NTA), _mm_prefetch(b + 4 * ld, _MM_HINT_NTA), _mm_prefetch(b + 6 * ld, _MM_HINT_NTA);
        }
        const __m256 xe = _mm256_loadu_ps(xp + (i & xm)), xo = _mm256_loadu_ps(xp + (i & xm) + 8);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + i)), v1 = _mm256_loadu_si256((const __m256i *)(w + ld + i));
        const __m256i v2 = _mm256_loadu_si256((const __m256i *)(w + 2 * ld + i)), v3 = _mm256_loadu_si256((const __m256i *)(w + 3 * ld + i));
        e0 = _mm256_fmadd_ps(BF_EV(v0), xe, e0), o0 = _mm256_fmadd_ps(BF_OD(v0), xo, o0);
        e1 = _mm256_fmadd_ps(BF_EV(v1), xe, e1), o1 = _mm256_fmadd_ps(BF_OD(v1), xo, o1);
        e2 = _mm256_fmadd_ps(BF_EV(v2), xe, e2), o2 = _mm256_fmadd_ps(BF_OD(v2), xo, o2);
        e3 = _mm256_fmadd_ps(BF_EV(v3), xe, e3), o3 = _mm256_fmadd_ps(BF_OD(v3), xo, o3);
    }
    out[0] = hsum8(_mm256_add_ps(e0, o0)), out[1] = hsum8(_mm256_add_ps(e1, o1));
    out[2] = hsum8(_mm256_add_ps(e2, o2)), out[3] = hsum8(_mm256_add_ps(e3, o3));
}
typedef struct { const df_weight *w; const float *x; float *y; float *xp; int drv, dist; } kx_ctx;
static void kx_rows(kx_ctx *c, int64_t b, int64_t e) {
    const int64_t rb = (int64_t)c->w->row_bytes, n = c->w->cols, le = rb / 2;
    const uint8_t *d = c->w->data;
    float out[4];
    if (c->drv == 0) { /* near four, no pf */
        for (int64_t r = b; r + 4 <= e; r += 4) x4_bf16p((const uint16_t *)(d + r * rb), le, c->xp, n, c->y + r, 0, 0);
    } else { /* far four */
        const int64_t q = (e - b) / 4;
        for (int64_t r = b; r < b + q; r++) {
            if (c->drv == 1) x4_bf16p((const uint16_t *)(d + r * rb), q * le, c->xp, n, out, 0, 0);
            else if (c->drv == 2) x4_bf16p((const uint16_t *)(d + r * rb), q * le, c->xp, n, out, 3, c->dist);
            else if (c->drv == 3) x4_bf16p((const uint16_t *)(d + r * rb), q * le, c->xp, n, out, 4, c->dist);
            else x4_bf16p((const uint16_t *)(d + r * rb), q * le, c->xp, n, out, 5, c->dist);
            c->y[r] = out[0], c->y[r + q] = out[1], c->y[r + 2 * q] = out[2], c->y[r + 3 * q] = out[3];
        }
    }
}
static double g_t0, g_tend[64];
static int g_nsh;
static void kx_task(void *p, int share, int shares) {
    kx_ctx *c = p;
    g_nsh = shares;
    int64_t chunks = (c->w->rows + 7) / 8, b = chunks * share / shares * 8, e = chunks * (share + 1) / shares * 8;
    if (e > c->w->rows) e = c->w->rows;
    kx_rows(c, b, e);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    g_tend[share] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define F8W(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#define F8E(v) _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 20), m87))
#define F8O(v) _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 4), m87))
static inline __m256i fp8_nan_acc32(__m256i acc, const uint8_t *p) {
    return _mm256_max_epu8(acc, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi8(0x7f)));
}
#define F8STEP(j)                                                                                                 \
    {                                                                                                             \
        const __m256 xe = _mm256_loadu_ps(xp + (j)), xo = _mm256_loadu_ps(xp + (j) + 8);                          \
        const __m256i v0 = F8W(w + (j)), v1 = F8W(w + ld + (j)), v2 = F8W(w + 2 * ld + (j)), v3 = F8W(w + 3 * ld + (j)); \
        t0 = _mm256_fmadd_ps(F8E(v0), xe, t0), u0 = _mm256_fmadd_ps(F8O(v0), xo, u0);                             \
        t1 = _mm256_fmadd_ps(F8E(v1), xe, t1), u1 = _mm256_fmadd_ps(F8O(v1), xo, u1);                             \
        t2 = _mm256_fmadd_ps(F8E(v2), xe, t2), u2 = _mm256_fmadd_ps(F8O(v2), xo, u2);                             \
        t3 = _mm256_fmadd_ps(F8E(v3), xe, t3), u3 = _mm256_fmadd_ps(F8O(v3), xo, u3);                             \
    }
static inline __attribute__((always_inline)) void x4_fp8(const uint8_t *w, int64_t ld, const float *xp, float xs, int64_t n, int blk,
                          const float *const *sc, float *out, int pf, int dist, int nanchk) {
    const __m256i m87 = _mm256_set1_epi32((int)0x87f00000u);
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256i nan = _mm256_setzero_si256();
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += blk, b++) {
        const int64_t c1 = n - c0 < blk ? n : c0 + blk;
        __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0, u0 = t0, u1 = t0, u2 = t0, u3 = t0;
        for (int64_t i = c0; i < c1; i += 32) {
            if (pf && !(i & 63)) {
                const char *q = (const char *)w + i + dist;
                if (pf == 3) _mm_prefetch(q, _MM_HINT_T0), _mm_prefetch(q + ld, _MM_HINT_T0), _mm_prefetch(q + 2 * ld, _MM_HINT_T0), _mm_prefetch(q + 3 * ld, _MM_HINT_T0);
                else _mm_prefetch(q, _MM_HINT_NTA), _mm_prefetch(q + ld, _MM_HINT_NTA), _mm_prefetch(q + 2 * ld, _MM_HINT_NTA), _mm_prefetch(q + 3 * ld, _MM_HINT_NTA);
            }
            if (nanchk) {
            nan = fp8_nan_acc32(fp8_nan_acc32(nan, w + i), w + ld + i);
            nan = fp8_nan_acc32(fp8_nan_acc32(nan, w + 2 * ld + i), w + 3 * ld + i);
            }
            F8STEP(i)
            F8STEP(i + 16)
        }
        a[0] = _mm256_fmadd_ps(_mm256_add_ps(t0, u0), _mm256_set1_ps(sc[0][b]), a[0]);
        a[1] = _mm256_fmadd_ps(_mm256_add_ps(t1, u1), _mm256_set1_ps(sc[1][b]), a[1]);
        a[2] = _mm256_fmadd_ps(_mm256_add_ps(t2, u2), _mm256_set1_ps(sc[2][b]), a[2]);
        a[3] = _mm256_fmadd_ps(_mm256_add_ps(t3, u3), _mm256_set1_ps(sc[3][b]), a[3]);
    }
    int64_t t[4];
    _mm256_storeu_si256((__m256i *)t, nan);
    for (int k = 0; k < 4; k++) out[k] = hsum8(a[k]) * xs + (float)(t[0] & 1);
}
typedef struct { const df_weight *w; float *y; const float *xp; float xs; int pf, dist, nanchk; } k8_ctx;
static void k8_task(void *p, int share, int shares) {
    k8_ctx *c = p;
    const df_weight *w = c->w;
    int64_t chunks = (w->rows + 7) / 8, b = chunks * share / shares * 8, e = chunks * (share + 1) / shares * 8;
    if (e > w->rows) e = w->rows;
    const int64_t rb = (int64_t)w->row_bytes, q = (e - b) / 4;
    const float *scs = w->scale;
    float out[4];
    for (int64_t r = b; r < b + q; r++) {
        const float *sc[4];
        for (int k = 0; k < 4; k++) sc[k] = scs + (r + k * q) / 128 * w->scale_cols;
        x4_fp8(w->data + r * rb, q * rb, c->xp, c->xs, w->cols, 128, sc, out, c->pf, c->dist, c->nanchk);
        c->y[r] = out[0], c->y[r + q] = out[1], c->y[r + 2 * q] = out[2], c->y[r + 3 * q] = out[3];
    }
}

typedef struct { const char *name; int alloc, fmt; int64_t cols; int kind; rd_ctx rd; } var_t; /* kind 0 product, 1 read */

static int fmt_of(const char *s) { return !strcmp(s, "f32") ? DF_W_F32 : !strcmp(s, "bf16") ? DF_W_BF16 : !strcmp(s, "f16") ? DF_W_F16 : DF_W_FP8; }
static size_t esize(int fmt) { return fmt == DF_W_F32 ? 4 : fmt == DF_W_FP8 ? 1 : 2; }

typedef struct { df_weight w; uint8_t *d; float *x, *y, *xp; } mat_t;
static void make(mat_t *m, int alloc, int fmt, int64_t cols, double bytes) {
    memset(m, 0, sizeof *m);
    df_weight *w = &m->w;
    w->fmt = fmt, w->cols = cols, w->row_bytes = (size_t)cols * esize(fmt);
    w->rows = (int64_t)(bytes / (double)w->row_bytes) / 16 * 16;
    size_t n = w->row_bytes * (size_t)w->rows;
    m->d = alloc_m(n, alloc);
    uint32_t *d32 = (uint32_t *)(void *)m->d;
    for (size_t i = 0; i < n / 4; i++) d32[i] = rnd() & 0x3b7f3b7fu;
    if (fmt == DF_W_FP8)
        for (size_t i = 0; i < n; i++) m->d[i] = (m->d[i] & 0x7f) == 0x7f ? 0x3b : m->d[i];
    if (fmt == DF_W_F32)
        for (size_t i = 0; i < n / 4; i++) ((float *)(void *)m->d)[i] = (float)(int)(rnd() % 2001 - 1000) * 1e-3f;
    if (fmt == DF_W_FP8) {
        w->blk_r = 128, w->blk_c = 128, w->scale_cols = (cols + 127) / 128;
        size_t sb = (size_t)((w->rows + 127) / 128 * w->scale_cols);
        float *s = df_xmalloc(sb * 4);
        for (size_t i = 0; i < sb; i++) s[i] = 1e-3f * (float)(1 + rnd() % 100);
        w->scale = s, w->scale_dtype = DF_SCALE_F32;
    }
    w->data = m->d;
    m->xp = df_aligned_alloc((size_t)cols * 4);
    m->x = df_aligned_alloc((size_t)cols * 4), m->y = df_aligned_alloc((size_t)w->rows * 4);
    for (int64_t i = 0; i < cols; i++) m->x[i] = (float)(int)(rnd() % 2001 - 1000) * 1e-3f;
}

static double run_var(var_t *v, mat_t *m) {
    double best = 1e30;
    const df_mv_job j = {&m->w, (const df_act *)(const void *)m->x, (df_act *)(void *)m->y};
    v->rd.d = m->d, v->rd.rows = m->w.rows, v->rd.rb = (int64_t)m->w.row_bytes;
    for (int r = 0; r < 4; r++) {
        double t0 = now();
        if (v->kind == 0) df_cpu_matmul_batch(&j, 1, 1);
        else if (v->kind == 4) { /* fp8 far: group field = nanchk, pf, dist */
            k8_ctx kc = {&m->w, m->y, m->xp, 0, v->rd.pf, v->rd.dist, v->rd.group};
            kc.xs = df_k_fp8x_prep_avx2(m->x, m->xp, m->w.cols);
            df_pool_run(k8_task, &kc);
        }
        else if (v->kind == 3) {
            kx_ctx kc = {&m->w, m->x, m->y, m->xp, v->rd.group, v->rd.dist};
            df_k_bf16x_prep_avx2(m->x, m->xp, m->w.cols);
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            g_t0 = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
            if (v->rd.split) df_pool_run_shares(kx_task, &kc, v->rd.split);
            else df_pool_run(kx_task, &kc);
            if (g_imb && g_nsh == 2) {
                double a = g_tend[0] - g_t0, b = g_tend[1] - g_t0;
                fprintf(stderr, "imb %.3f (%.1f %.1f ms)\n", fabs(a - b) / (a > b ? a : b), 1e3 * a, 1e3 * b);
            }
        }
        else if (v->rd.split == 0) df_pool_run(rd_task, &v->rd);
        else df_pool_run_shares(rd_task, &v->rd, (int)((v->rd.rows + 63) / 64));
        double dt = now() - t0;
        if (r && dt < best) best = dt; /* first: warm */
    }
    return (double)m->w.row_bytes * (double)m->w.rows / best / 1e9;
}

static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double med(double *v, int n) {
    double t[256];
    memcpy(t, v, (size_t)n * sizeof *v);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* variant spec: name=alloc,fmt,cols,kind[,group,pf,dist,split] */
int main(int argc, char **argv) {
    int threads = 2, rounds = 5, nofloor = 0;
    int a = 1;
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (!strcmp(argv[a], "-t")) threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-r")) rounds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-cpu")) g_cpu = 1;
        else if (!strcmp(argv[a], "-nofloor")) nofloor = 1;
        else if (!strcmp(argv[a], "-imb")) g_imb = 1;
    }
    df_kernels_init();
    df_pool_init(threads);
    int nv = argc - a;
    var_t *v = calloc((size_t)nv, sizeof *v);
    mat_t *m = calloc((size_t)nv, sizeof *m);
    for (int i = 0; i < nv; i++) {
        char fmt[16];
        int alloc, kind, group = 1, pf = 0, dist = 0, split = 0;
        long long cols;
        v[i].name = argv[a + i];
        const char *s = strchr(argv[a + i], '=') + 1;
        int k = sscanf(s, "%d,%15[^,],%lld,%d,%d,%d,%d,%d", &alloc, fmt, &cols, &kind, &group, &pf, &dist, &split);
        if (k < 4) { fprintf(stderr, "bad spec %s\n", argv[a + i]); return 2; }
        v[i].alloc = alloc, v[i].fmt = fmt_of(fmt), v[i].cols = cols, v[i].kind = kind;
        v[i].rd.group = group, v[i].rd.pf = pf, v[i].rd.dist = dist, v[i].rd.split = split;
        /* share a matrix with an earlier variant of the same alloc/fmt/cols */
        int same = -1;
        for (int j = 0; j < i; j++)
            if (v[j].alloc == alloc && v[j].fmt == v[i].fmt && v[j].cols == cols) { same = j; break; }
        if (same >= 0) m[i] = m[same];
        else make(&m[i], alloc, v[i].fmt, cols, getenv("FDX_BYTES") ? atof(getenv("FDX_BYTES")) : 256e6);
        if (getenv("FDX_FP8_CHECK")) m[i].w.nan_codes = DF_NAN_CODES_MAYBE; /* the kernel with the NaN-code check */
    }
    fprintf(stderr, "AnonHugePages %ld kB\n", anon_huge_kb());
    double *gb = calloc((size_t)(nv * rounds), sizeof *gb), *rel = calloc((size_t)(nv * rounds), sizeof *rel), *fl = calloc((size_t)rounds, sizeof *fl);
    for (int r = 0; r < rounds; r++) {
        df_floors f = {0};
        if (!nofloor) df_bench_floors((size_t)256 << 20, 1000, &f);
        fl[r] = nofloor ? 1 : f.mem_read_gbs;
        if (!nofloor) fprintf(stderr, "floor %.1f (%s) 1t %.1f (%s)\n", f.mem_read_gbs, f.mem_method, f.mem_read_gbs_1t, f.mem_method_1t);
        for (int k = 0; k < nv; k++) {
            int i = (k + r) % nv; /* rotate the order */
            gb[i * rounds + r] = run_var(&v[i], &m[i]);
            rel[i * rounds + r] = gb[i * rounds + r] / fl[r];
        }
    }
    double *ratio = calloc((size_t)rounds, sizeof *ratio);
    printf("rounds %d threads %d cpu %d floor median %.2f (", rounds, threads, g_cpu, med(fl, rounds));
    for (int r = 0; r < rounds; r++) printf("%s%.1f", r ? " " : "", fl[r]);
    printf(")\n");
    for (int i = 0; i < nv; i++) {
        for (int r = 0; r < rounds; r++) ratio[r] = gb[i * rounds + r] / gb[0 * rounds + r];
        printf("%-28s GB/s %6.2f  %%floor %5.1f  vs first %.3f  [", v[i].name, med(gb + i * rounds, rounds), 100 * med(rel + i * rounds, rounds), med(ratio, rounds));
        for (int r = 0; r < rounds; r++) printf("%s%.1f", r ? " " : "", gb[i * rounds + r]);
        printf("]\n");
    }
    return 0;
}
