/* kernel_bench.c - the CPU backend's products against the floors measured in
 * the same run (docs/PERFORMANCE.md, issue 17):
 *
 *  - floors: memory read GB/s (all threads, best read method, a 512 MiB
 *    buffer) and peak f32 FMA GFLOP/s, measured by the code of `deltafin
 *    bench floors` (backend/cpu/floors.c: threads started together, not
 *    pool shares);
 *  - decode: GB/s of weights read by df_cpu_matmul_batch with n = 1 (the
 *    decode product) per format and row length, matrices of ~256 MiB (far
 *    past the L3), best of --reps; % of the read floor;
 *  - prefill: GFLOP/s (2 x rows x cols x n) of the same call with n tokens
 *    per format and batch size, best of --reps; % of the FMA peak.
 *
 *  - --float-decode: BF16/F16/FP8/F32 decode at rows of 576, 2048 and 7168,
 *    each run interleaved with a floor pass (float_decode below); --fmt NAME
 *    (bf16, f16, fp8, f32): that format only; --fp8-check: FP8 weights
 *    marked as possibly holding NaN codes (df_weight.nan_codes), i.e. the
 *    kernel with the per-block check, as NaN-holding weights and expert
 *    views run it.
 *  - --px TYPE ROWS COLS: one prepared-x decode product (df_ggml_px_init +
 *    df_ggml_px_dot) of a GGML type id over ROWS x COLS random blocks, for
 *    callgrind: `valgrind --tool=callgrind --toggle-collect=df_ggml_px_dot
 *    kernel_bench --px 6 512 1536` minus the same with 256 rows, divided by
 *    256 x 1536, is the kernel's instructions per weight (load-free).
 *  - --px TYPE ROWS COLS NP: NP (2..16) prepared activations through df_ggml_px_dot_multi, the verify pass's
 *    product, one thread, best of 7 (e.g. `--px 3 65536 4096 8`: 168 MB of Q4_1 rows, past the L3);
 *    KB_PX_REPS=N: best of N instead (also for NP = 1, which otherwise runs once for callgrind).
 *
 * Usage: kernel_bench [--threads N] [--reps R] [--quick] [--cpu-time] [--decode|--prefill|--float-decode [--pairs P] [--fmt NAME] [--fp8-check]] [--prefill [--fmt NAME] [--n N] [--rows R]] [--isa scalar|avx2|avx512]
 *        kernel_bench --px TYPE ROWS COLS [NP]
 * Prints one JSON object. Not a timed test: numbers swing with load. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/floors.h"
#include "backend/cpu/kernels.h"
#include "backend/ggml_quant.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- weights --------------------------------------------------------------- */
typedef struct { const char *name; int fmt, gtype; } fmt_def;
static const fmt_def FMTS[] = {{"f32", DF_W_F32, 0}, {"bf16", DF_W_BF16, 0}, {"f16", DF_W_F16, 0}, {"fp8", DF_W_FP8, 0},
                               {"q8_0", DF_W_GGML, 8}, {"q4_1", DF_W_GGML, 3}, {"q4_k", DF_W_GGML, 12},
                               /* the rest of the Q4_K_M file's types (bench/make_q4km_gguf.py) */
                               {"q5_0", DF_W_GGML, 6}, {"q6_k", DF_W_GGML, 14}};
#define NFMT (int)(sizeof FMTS / sizeof *FMTS)

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }

/* A rows x cols weight of format f with random, finite contents (FP8: 128x128
 * f32 block scales, as DeepSeek-V3). Returns 0, or -1 when cols does not fit
 * the format's blocks. */
static int make_weight(df_weight *w, const fmt_def *f, int64_t rows, int64_t cols) {
    memset(w, 0, sizeof *w);
    w->fmt = f->fmt, w->rows = rows, w->cols = cols;
    size_t rb, sb = 0;
    switch (f->fmt) {
    case DF_W_F32: rb = (size_t)cols * 4; break;
    case DF_W_BF16: case DF_W_F16: rb = (size_t)cols * 2; break;
    case DF_W_FP8:
        rb = (size_t)cols, w->blk_r = 128, w->blk_c = 128, w->scale_cols = (cols + 127) / 128;
        sb = (size_t)((rows + 127) / 128 * w->scale_cols) * 4;
        break;
    default:
        if (cols % df_ggml_traits_of(f->gtype)->block_elems) return -1;
        w->ggml_type = f->gtype, rb = (size_t)df_ggml_row_bytes(f->gtype, cols);
    }
    w->row_bytes = rb;
    /* on huge pages, as the engine's resident weights (model/loader.c: a 2 MiB
     * rounded mapping advised MADV_HUGEPAGE) and the floor's buffer: madvise
     * needs a page-aligned start, and the 64-byte aligned block this took
     * before was never advised (4 KiB pages where THP is "madvise", as on the
     * dev VM), which made the products read slower than the engine's: BF16
     * rows of 7168, one thread, 10.6 against 12.7 GB/s of CPU time
     * (docs/PERFORMANCE.md, issue 17 float decode round 3) */
    uint8_t *d = NULL;
    if (posix_memalign((void **)&d, (size_t)2 << 20, rb * (size_t)rows)) d = df_aligned_alloc(rb * (size_t)rows);
    madvise(d, rb * (size_t)rows, MADV_HUGEPAGE);
    uint32_t *d32 = (uint32_t *)(void *)d;
    for (size_t i = 0; i < rb * (size_t)rows / 4; i++) d32[i] = rnd() & 0x3b7f3b7fu; /* finite in every format... */
    if (f->fmt == DF_W_FP8) /* ...but E4M3, where 0x7f is NaN: the kernels give such a row NaN by a slow path */
        for (size_t i = 0; i < rb * (size_t)rows; i++) d[i] = (d[i] & 0x7f) == 0x7f ? 0x3b : d[i];
    if (f->fmt == DF_W_F32)
        for (size_t i = 0; i < (size_t)(rows * cols); i++) ((float *)(void *)d)[i] = (float)(int)(rnd() % 2001 - 1000) * 1e-3f;
    w->data = d;
    if (sb) {
        float *s = df_xmalloc(sb);
        for (size_t i = 0; i < sb / 4; i++) s[i] = 1e-3f * (float)(1 + rnd() % 100);
        w->scale = s, w->scale_dtype = DF_SCALE_F32;
    }
    return 0;
}
static void free_weight(df_weight *w) { free((void *)w->data), free((void *)w->scale); }

/* --cpu-time: seconds of CPU of the process divided by the threads instead
 * of wall-clock seconds: on a machine shared with other work, compute-bound
 * numbers then mean something (memory-bound ones still move with the load;
 * the pool's waiting threads spin, so use it with --threads 1). */
static int g_cpu_time;
static double now(void) {
    if (!g_cpu_time) return df_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ((double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec) / df_pool_size();
}

/* Seconds of one call, best of reps timings of `inner` back-to-back calls. */
static double time_mm(const df_weight *w, const float *X, int n, float *Y, int reps, int inner) {
    const df_mv_job j = {w, (const df_act *)(const void *)X, (df_act *)(void *)Y};
    double best = 1e30;
    df_cpu_matmul_batch(&j, 1, n); /* warm (scratch, pages) */
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < inner; i++) df_cpu_matmul_batch(&j, 1, n);
        double dt = (now() - t0) / inner;
        if (dt < best) best = dt;
    }
    return best;
}

/* --float-decode: the float formats' decode (n = 1) against the read floor,
 * interleaved: for each format and row length, `pairs` times a two-thread
 * floor pass (floors.c, 256 MiB buffer) then the product (best of 12 over a
 * 256 MiB matrix, 64 with --quick), so both see the same minutes of a host
 * whose bandwidth moves; prints every pair and the medians (GB/s, % of the
 * floor of its own pair). 12: the floor is the best of 12 passes (4 of each
 * read method), so the product gets as many tries; with 3 it read lower on a
 * loaded host for that alone (a pass that a descheduled thread stretches). */
static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static const char *g_fd_fmt;  /* --fmt: only this format's rows (--float-decode), only this format (--prefill) */
static int g_pf_n;            /* --n: prefill at this batch size only */
static int64_t g_pf_rows;     /* --rows: prefill shapes of this many rows only */
static int g_fp8_check;       /* --fp8-check: FP8 weights marked DF_NAN_CODES_MAYBE (the kernel with the NaN-code check) */
static void float_decode(int quick, int pairs) {
    static const int fmts[] = {1, 2, 3, 0}; /* bf16, f16, fp8, f32 (FMTS) */
    static const int64_t cols_l[] = {576, 2048, 7168};
    printf(" \"float_decode\": [");
    int first = 1;
    for (size_t fi = 0; fi < sizeof fmts / sizeof *fmts; fi++)
        for (size_t ci = 0; ci < sizeof cols_l / sizeof *cols_l; ci++) {
            const fmt_def *fd = &FMTS[fmts[fi]];
            const int64_t cols = cols_l[ci];
            if (g_fd_fmt && strcmp(g_fd_fmt, fd->name)) continue;
            df_weight w;
            if (make_weight(&w, fd, 16, cols)) continue;
            int64_t rows = (int64_t)((quick ? 64e6 : 256e6) / (double)w.row_bytes) / 16 * 16;
            free_weight(&w);
            make_weight(&w, fd, rows, cols);
            if (g_fp8_check) w.nan_codes = DF_NAN_CODES_MAYBE;
            float *x = df_aligned_alloc((size_t)cols * 4), *y = df_aligned_alloc((size_t)rows * 4);
            for (int64_t i = 0; i < cols; i++) x[i] = (float)(int)(rnd() % 2001 - 1000) * 1e-3f;
            double fl[64], gb[64], pct[64];
            const int np = pairs < 64 ? pairs : 64;
            for (int p = 0; p < np; p++) {
                df_floors f;
                df_bench_floors((size_t)256 << 20, 1000, &f);
                const double dt = time_mm(&w, x, 1, y, 12, 1);
                fl[p] = f.mem_read_gbs, gb[p] = (double)w.row_bytes * (double)rows / dt / 1e9, pct[p] = 100 * gb[p] / fl[p];
                printf("%s\n  {\"fmt\": \"%s\", \"cols\": %lld, \"pair\": %d, \"floor_gbs\": %.2f, \"gbs\": %.2f, \"pct_floor\": %.1f}",
                       first ? "" : ",", fd->name, (long long)cols, p, fl[p], gb[p], pct[p]);
                first = 0;
                fflush(stdout);
            }
            const double mf = median(fl, np), mg = median(gb, np), mp = median(pct, np);
            printf(",\n  {\"fmt\": \"%s\", \"cols\": %lld, \"median_of\": %d, \"floor_gbs\": %.2f, \"gbs\": %.2f, \"pct_floor\": %.1f}",
                   fd->name, (long long)cols, np, mf, mg, mp);
            fflush(stdout);
            free(x), free(y), free_weight(&w);
        }
    printf("]}\n");
}

/* --px: random code bytes with f16 scales in [2^-4, 2^-3) (Q6_K: d at byte 208); np > 1: np prepared activations
 * through df_ggml_px_dot_multi (a verify pass's product), timed, best of 7 (one thread) */
static int px_once(int type, int64_t rows, int64_t cols, int np) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    if (np < 1 || np > 16) { /* 16: the most a verify pass hands px_dot_multi (DF_GGML_PXM) */
        fprintf(stderr, "kernel_bench --px: NP must be 1..16 (prepared activations at once), got %d\n", np);
        return 2;
    }
    if (!t || t->block_elems < 32 || rows < 1 || cols < 1 || cols % t->block_elems) {
        fprintf(stderr, "kernel_bench --px: expected a GGML block type id and COLS a multiple of its block (type %d, cols %lld)\n", type, (long long)cols);
        return 2;
    }
    const int64_t rb = df_ggml_row_bytes(type, cols), nb = rows * (cols / t->block_elems);
    uint8_t *w = df_aligned_alloc((size_t)(rb * rows));
    for (int64_t i = 0; i < rb * rows; i++) w[i] = (uint8_t)rnd();
    const int doff = type == 14 ? 208 : type == 10 ? 80 : type == 11 ? 108 : 0, two = type == 3 || type == 7 || type == 12 || type == 13 || type == 10;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * t->block_bytes + doff;
        for (int k = 0; k <= two; k++) {
            uint16_t h = (uint16_t)(0x2c00 + (rnd() & 0x3ff));
            memcpy(p + 2 * k, &h, 2);
        }
    }
    const size_t af = df_ggml_px_floats(type, cols);
    float *x = df_aligned_alloc((size_t)cols * np * 4), *y = df_aligned_alloc((size_t)rows * np * 4);
    float *aux = df_aligned_alloc(af * np * 4);
    for (int64_t i = 0; i < cols * np; i++) x[i] = (float)(int)(rnd() % 2001 - 1000) * 1e-3f;
    df_ggml_px px[16];
    for (int q = 0; q < np; q++) df_ggml_px_init(&px[q], type, x + (size_t)q * cols, cols, aux + af * q);
    double best = 1e30;
    const char *re = getenv("KB_PX_REPS"); /* repetitions (best of): default 7 for np > 1, 1 for np = 1 (callgrind) */
    const int reps = re && atoi(re) > 0 ? atoi(re) : np > 1 ? 7 : 1;
    for (int rep = 0; rep < reps; rep++) {
        const double t0 = df_now();
        if (np > 1) df_ggml_px_dot_multi(px, np, w, (size_t)rb, rows, y, rows);
        else df_ggml_px_dot(&px[0], w, (size_t)rb, rows, y);
        if (df_now() - t0 < best) best = df_now() - t0;
    }
    double s = 0;
    for (int64_t r = 0; r < rows * np; r++) s += y[r];
    printf("{\"px\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"np\": %d, \"sum\": %.6g, \"best_ms\": %.4f, \"weight_gbs\": %.2f}\n", t->name,
           (long long)rows, (long long)cols, np, s, best * 1e3, (double)rb * rows / best / 1e9);
    free(w), free(x), free(y), free(aux);
    return 0;
}

int main(int argc, char **argv) {
    if ((argc == 5 || argc == 6) && !strcmp(argv[1], "--px")) return px_once(atoi(argv[2]), atoll(argv[3]), atoll(argv[4]), argc == 6 ? atoi(argv[5]) : 1);
    int threads = 2, reps = 5, quick = 0, only = 0; /* only: 1 decode, 2 prefill, 3 float decode vs floor */
    int pairs = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--cpu-time")) g_cpu_time = 1;
        else if (!strcmp(argv[i], "--decode")) only = 1;
        else if (!strcmp(argv[i], "--prefill")) only = 2;
        else if (!strcmp(argv[i], "--float-decode")) only = 3;
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fmt") && i + 1 < argc) g_fd_fmt = argv[++i];
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) g_pf_n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) g_pf_rows = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--fp8-check")) g_fp8_check = 1;
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            df_set_isa(!strcmp(s, "scalar") ? DF_ISA_SCALAR : !strcmp(s, "avx2") ? DF_ISA_AVX2 : DF_ISA_AVX512);
        } else {
            fprintf(stderr, "usage: kernel_bench [--threads N] [--reps R] [--quick] [--cpu-time] [--decode|--prefill|--float-decode [--pairs P] [--fmt NAME] [--fp8-check]] [--prefill [--fmt NAME] [--n N] [--rows R]] [--isa scalar|avx2|avx512]\n"
                            "       kernel_bench --px TYPE ROWS COLS\n");
            return 2;
        }
    }
    if (threads < 1 || reps < 1 || pairs < 1) { fprintf(stderr, "kernel_bench: expected --threads >= 1, --reps >= 1 and --pairs >= 1\n"); return 2; }
    df_kernels_init();
    df_pool_init(threads);
    const int nth = df_pool_size();
    if (only == 3) {
        printf("{\"threads\": %d, \"isa\": \"%s\",\n", nth, df_isa_name(df_isa()));
        float_decode(quick, pairs);
        return 0;
    }

    /* floors: the same code as `deltafin bench floors` (backend/cpu/floors.c) */
    df_floors fl;
    df_bench_floors((size_t)512 << 20, quick ? 5000000 : 20000000, &fl);
    const double read_gbs = fl.mem_read_gbs, peak = fl.peak_fma_gflops;
    printf("{\"threads\": %d, \"isa\": \"%s\", \"mem_read_gbs\": %.2f, \"peak_fma_gflops\": %.1f,\n", nth,
           df_isa_name(df_isa()), read_gbs, peak);

    /* decode: n = 1 */
    /* l2 = 1: a 256 KiB matrix read again and again from L2: the kernel's
     * compute ceiling (what it could stream at if memory were free) */
    static const int64_t dcols[] = {576, 2048, 4096, 7168};
    printf(" \"decode\": [");
    int first = 1;
    for (int l2 = 0; l2 < 2; l2++)
    for (int f = 0; f < NFMT && only != 2; f++)
        for (size_t ci = 0; ci < sizeof dcols / sizeof *dcols; ci++) {
            const double dbytes = l2 ? 256e3 : quick ? 64e6 : 256e6;
            const int64_t cols = dcols[ci];
            df_weight w;
            fmt_def fd = FMTS[f];
            int64_t rows = 16;
            if (make_weight(&w, &fd, rows, cols)) continue;
            rows = (int64_t)(dbytes / (double)w.row_bytes) / 16 * 16;
            if (rows < 16) rows = 16;
            free_weight(&w);
            make_weight(&w, &fd, rows, cols);
            float *x = df_aligned_alloc((size_t)cols * 4), *y = df_aligned_alloc((size_t)rows * 4);
            for (int64_t i = 0; i < cols; i++) x[i] = (float)(int)(rnd() % 2001 - 1000) * 1e-3f;
            double dt = time_mm(&w, x, 1, y, reps, l2 ? 2000 : 1);
            double gbs = (double)w.row_bytes * (double)rows / dt / 1e9;
            printf("%s\n  {\"fmt\": \"%s\", \"l2\": %d, \"rows\": %lld, \"cols\": %lld, \"gbs\": %.2f, \"pct_floor\": %.1f}", first ? "" : ",",
                   fd.name, l2, (long long)rows, (long long)cols, gbs, 100 * gbs / read_gbs);
            fflush(stdout);
            first = 0;
            free(x), free(y), free_weight(&w);
        }
    printf("],\n");

    /* prefill: n tokens */
    /* a large square matrix and SmolLM2-135M's FFN shapes (gate/up 1536 x 576, down 576 x 1536) */
    static const int ns[] = {2, 4, 8, 64, 128, 512};
    static const int64_t shapes[][2] = {{2048, 2048}, {1536, 576}, {576, 1536}}, qshapes[][2] = {{1024, 1024}, {1536, 576}};
    printf(" \"prefill\": [");
    first = 1;
    const int64_t CMAX = 2048;
    float *X = df_aligned_alloc((size_t)(512 * CMAX) * 4), *Y = df_aligned_alloc((size_t)(512 * 2048) * 4);
    for (int64_t i = 0; i < 512 * CMAX; i++) X[i] = (float)(int)(rnd() % 2001 - 1000) * 1e-3f;
    for (int si = 0; si < (quick ? 2 : 3); si++) {
        const int64_t R = quick ? qshapes[si][0] : shapes[si][0], C = quick ? qshapes[si][1] : shapes[si][1];
        if (g_pf_rows && R != g_pf_rows) continue;
        for (int f = 0; f < NFMT && only != 1; f++) {
            df_weight w;
            if (g_fd_fmt && strcmp(g_fd_fmt, FMTS[f].name)) continue;
            if (make_weight(&w, &FMTS[f], R, C)) continue;
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                const int n = ns[ni];
                if ((quick && n > 128) || (g_pf_n && n != g_pf_n)) continue;
                double dt = time_mm(&w, X, n, Y, reps, 1), gf = 2.0 * (double)R * (double)C * n / dt / 1e9;
                printf("%s\n  {\"fmt\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"n\": %d, \"gflops\": %.1f, \"pct_peak\": %.1f}",
                       first ? "" : ",", FMTS[f].name, (long long)R, (long long)C, n, gf, peak > 0 ? 100 * gf / peak : 0.0);
                fflush(stdout);
                first = 0;
            }
            free_weight(&w);
        }
    }
    printf("]}\n");
    free(X), free(Y);
    return 0;
}
