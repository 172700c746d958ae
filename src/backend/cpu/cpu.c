/* cpu.c - the CPU backend: ISA dispatch, the stored formats (one case per
 * format in each switch below), and the products of the table
 * (matmul_batch) built on the per-ISA kernels; ops.c has the rest; the
 * thread pool is in pool.c. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "backend/ggml_quant.h"
#include "util/util.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- ISA -------------------------------------------------------------- */
static int g_isa = -1;
static int best_isa(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return DF_ISA_AVX512;
    /* every AVX2+FMA CPU also has F16C (Haswell, Zen); clang cannot query "f16c" here */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return DF_ISA_AVX2;
#endif
    return DF_ISA_SCALAR;
}
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static void init_all(void) {
    df_kernels_init();
    if (g_isa < 0) g_isa = best_isa();
    const char *e = getenv("DELTAFIN_ISA"); /* testing aid: scalar | avx2 | avx512 */
    if (e) {
        int want = !strcmp(e, "scalar") ? DF_ISA_SCALAR : !strcmp(e, "avx2") ? DF_ISA_AVX2 : DF_ISA_AVX512;
        if (want <= best_isa()) g_isa = want;
    }
}
int df_isa(void) { pthread_once(&init_once, init_all); return g_isa; }
void df_set_isa(int isa) {
    pthread_once(&init_once, init_all);
    int b = best_isa();
    g_isa = (isa < 0 || isa > b) ? b : isa;
}
const char *df_isa_name(int isa) { return isa == DF_ISA_AVX512 ? "avx512" : isa == DF_ISA_AVX2 ? "avx2" : "scalar"; }

typedef struct {
    float (*f32)(const float *, const float *, int64_t);
    float (*bf16)(const uint16_t *, const float *, int64_t);
    float (*f16)(const uint16_t *, const float *, int64_t);
    float (*fp8)(const uint8_t *, const float *, int64_t);
    float (*int4)(const uint8_t *, const float *, int, const float *, int64_t);
    void (*pack16)(const float *, int64_t, int, int64_t, float *);
    void (*gemm16)(const float *, int64_t, const float *, int64_t, int, float *, int64_t, int, int);
    void (*gemm32)(const float *, int64_t, int64_t, const float *, int64_t, int, float *, int64_t, int);
    void (*deq_bf16)(const uint16_t *, float *, int64_t);
    void (*deq_f16)(const uint16_t *, float *, int64_t);
    void (*deq_fp8)(const uint8_t *, float, float *, int64_t);
    void (*axpy)(float *, float, const float *, int64_t);
    void (*dot4_f32)(const float *, int64_t, const float *, int64_t, float *);
    void (*dot4_bf16)(const uint16_t *, int64_t, const float *, int64_t, float *);
    void (*dot4_f16)(const uint16_t *, int64_t, const float *, int64_t, float *);
    void (*bf16x_prep)(const float *, float *, int64_t);
    float (*bf16p)(const uint16_t *, const float *, const float *, int64_t);
    void (*dot4_bf16p)(const uint16_t *, int64_t, const float *, const float *, int64_t, float *);
    void (*dot4_fp8s)(const uint8_t *, int64_t, const float *, int64_t, int, const float *const *, float *);
    float (*i8)(const int8_t *, const float *, int64_t);
    float (*mxfp4)(const uint8_t *, const uint8_t *, const float *, int64_t);
    void (*deq_mxfp4)(const uint8_t *, const uint8_t *, float *, int64_t);
    float (*fp8x_prep)(const float *, float *, int64_t);
    float (*dot_fp8sp)(const uint8_t *, const float *, float, int64_t, int, const float *);
    void (*dot4_fp8sp)(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *);
    void (*dot4_fp8spn)(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *);
} ktab;
#define KT(isa)                                                                                                       \
    {df_k_dot_f32_##isa, df_k_dot_bf16_##isa, df_k_dot_f16_##isa, df_k_dot_fp8_##isa, df_k_dot_int4_##isa, df_k_pack16_##isa, df_k_gemm16_##isa, df_k_gemm32_##isa, \
     df_k_deq_bf16_##isa, df_k_deq_f16_##isa, df_k_deq_fp8_##isa, df_k_axpy_##isa, df_k_dot4_f32_##isa,                \
     df_k_dot4_bf16_##isa, df_k_dot4_f16_##isa, df_k_bf16x_prep_##isa, df_k_dot_bf16p_##isa, df_k_dot4_bf16p_##isa, \
     df_k_dot4_fp8s_##isa, df_k_dot_i8_##isa, df_k_dot_mxfp4_##isa, df_k_deq_mxfp4_##isa, df_k_fp8x_prep_##isa,     \
     df_k_dot_fp8sp_##isa, df_k_dot4_fp8sp_##isa, df_k_dot4_fp8spn_##isa}
static const ktab ktabs[3] = {KT(scalar), KT(avx2), KT(avx512)};
static inline const ktab *kt(void) { return &ktabs[df_isa()]; }

/* ---- weights (names and byte counts: backend/wfmt.c) ----------------- */
static inline float scale_at(const df_weight *w, int64_t i) {
    switch (w->scale_dtype) {
    case DF_SCALE_F32: { float f; memcpy(&f, (const uint8_t *)w->scale + 4 * i, 4); return f; }
    case DF_SCALE_BF16: { uint16_t h; memcpy(&h, (const uint8_t *)w->scale + 2 * i, 2); return df_bf16_to_f32(h); }
    default: { uint16_t h; memcpy(&h, (const uint8_t *)w->scale + 2 * i, 2); return df_f16_to_f32(h); }
    }
}

/* per-thread scratch, grown on first use only, freed when its thread exits */
static _Thread_local float *tl_buf;
static _Thread_local size_t tl_cap;
static _Thread_local float *tl_rows; /* prefill: dequantized rows of one panel */
static _Thread_local size_t tl_rows_cap;
static _Thread_local float *tl_xp; /* BF16 decode: x in the kernel's order */
static _Thread_local size_t tl_xp_cap;
static _Thread_local float *tl_sc;
static _Thread_local size_t tl_sc_cap;
/* FP8 decode: up to 4 scale rows converted to f32 (row index of each slot) */
static _Thread_local float *tl_fsc;
static _Thread_local size_t tl_fsc_cap;
static _Thread_local int64_t tl_fsc_row[4];
static _Thread_local const void *tl_fsc_w;
static _Thread_local float *tl_slot[5];
static _Thread_local size_t tl_slot_cap[5];
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_free(void *p) {
    (void)p;
    free(tl_buf);
    free(tl_rows);
    tl_rows = NULL, tl_rows_cap = 0;
    free(tl_xp);
    tl_xp = NULL, tl_xp_cap = 0;
    free(tl_sc);
    free(tl_fsc);
    for (int i = 0; i < 5; i++) free(tl_slot[i]), tl_slot[i] = NULL, tl_slot_cap[i] = 0;
    tl_buf = tl_sc = tl_fsc = NULL;
    tl_cap = tl_sc_cap = tl_fsc_cap = 0;
    tl_fsc_w = NULL;
}
static void scratch_key_init(void) { pthread_key_create(&scratch_key, scratch_free); }
static void scratch_register(void) {
    pthread_once(&scratch_once, scratch_key_init);
    pthread_setspecific(scratch_key, (void *)1); /* non-NULL: the destructor runs at thread exit */
}
static float *scratch(size_t n) {
    if (n > tl_cap) {
        free(tl_buf);
        tl_buf = df_aligned_alloc(n * sizeof(float));
        tl_cap = n;
        scratch_register();
    }
    return tl_buf;
}

float *df_cpu_scratch(int slot, size_t n) {
    if (n > tl_slot_cap[slot]) {
        free(tl_slot[slot]);
        tl_slot[slot] = df_aligned_alloc((n ? n : 1) * sizeof(float));
        tl_slot_cap[slot] = n;
        scratch_register();
    }
    return tl_slot[slot];
}

float df_dot_row(const df_weight *w, int64_t r, const float *x) {
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    const ktab *k = kt();
    switch (w->fmt) {
    case DF_W_F32: return k->f32((const float *)row, x, w->cols);
    case DF_W_I8ROW: return scale_at(w, r) * k->i8((const int8_t *)row, x, w->cols);
    case DF_W_BF16: return k->bf16((const uint16_t *)row, x, w->cols);
    case DF_W_F16: return k->f16((const uint16_t *)row, x, w->cols);
    case DF_W_FP8: {
        float s = 0;
        const int64_t sr = (r / w->blk_r) * w->scale_cols;
        for (int64_t c0 = 0, b = 0; c0 < w->cols; c0 += w->blk_c, b++) {
            int64_t n = w->cols - c0 < w->blk_c ? w->cols - c0 : w->blk_c;
            s += scale_at(w, sr + b) * k->fp8(row + c0, x + c0, n);
        }
        return s;
    }
    case DF_W_INT4: {
        int64_t ng = w->scale_cols;
        if ((size_t)ng > tl_sc_cap) { free(tl_sc); tl_sc = df_xmalloc((size_t)ng * sizeof(float)); tl_sc_cap = (size_t)ng; scratch_register(); }
        for (int64_t g = 0; g < ng; g++) tl_sc[g] = scale_at(w, r * ng + g);
        if (w->blk_c % 32 == 0 && w->cols % w->blk_c == 0) return k->int4(row, tl_sc, w->blk_c, x, w->cols);
        return df_k_dot_int4_scalar(row, tl_sc, w->blk_c, x, w->cols);
    }
    case DF_W_GGML: return df_ggml_dot(w->ggml_type, row, x, w->cols);
    case DF_W_MXFP4: {
        const uint8_t *sc = (const uint8_t *)w->scale + r * w->scale_cols;
        if (w->cols % DF_MXFP4_GROUP == 0) return k->mxfp4(row, sc, x, w->cols);
        return df_k_dot_mxfp4_scalar(row, sc, x, w->cols);
    }
    }
    return 0;
}

/* The f32 scales of FP8 scale row sr, kept in thread-local slot `slot` (0..3:
 * one per stream of the four-row driver, whose stream k moves to its next
 * scale row every blk_r rows) and reused while that slot holds row sr. */
static const float *fp8_scale_row(const df_weight *w, int64_t sr, int slot) {
    const size_t nc = (size_t)w->scale_cols;
    if (4 * nc > tl_fsc_cap) {
        free(tl_fsc);
        tl_fsc = df_xmalloc(4 * nc * sizeof(float));
        tl_fsc_cap = 4 * nc;
        tl_fsc_w = NULL;
        scratch_register();
    }
    if (tl_fsc_w != (const void *)w->scale) {
        for (int k = 0; k < 4; k++) tl_fsc_row[k] = -1;
        tl_fsc_w = w->scale;
    }
    float *f = tl_fsc + (size_t)slot * nc;
    if (tl_fsc_row[slot] != sr) {
        for (size_t b = 0; b < nc; b++) f[b] = scale_at(w, sr * (int64_t)nc + (int64_t)b);
        tl_fsc_row[slot] = sr;
    }
    return f;
}

/* Whether FP8 weight w is known to hold no E4M3 NaN code (0x7f, 0xff). A
 * weight left DF_NAN_CODES_UNCHECKED is scanned once, on its first decode
 * product (backend.h, df_weight_nan_codes: lazily, so a checkpoint's
 * weights are read when first used, not all at startup), and the answer is
 * kept in w->nan_codes: the four-row kernel then runs without its per-block
 * check (dot4_fp8spn, the same bits for such rows; a weight with a NaN code
 * keeps the checking kernel, which gives its rows NaN). */
static int fp8_nan_free(const df_weight *w) { return df_weight_nan_codes(w) == DF_NAN_CODES_NONE; }

/* the thread's buffer for x in a kernel's order (BF16, FP8 decode) */
static float *xp_buf(int64_t n) {
    if ((size_t)n > tl_xp_cap) {
        free(tl_xp);
        tl_xp = df_aligned_alloc((size_t)n * sizeof(float));
        tl_xp_cap = (size_t)n;
        scratch_register();
    }
    return tl_xp;
}

/* y[i] = W[r0+i,:] . x for i < nr.
 *
 * Float formats (F32, BF16, F16, FP8): four rows per kernel call (x, or the
 * x prepared for the kernel, read once per four rows), and the four rows
 * are a quarter of the range apart: with q = nr / 4, call j reads rows
 * j, j + q, j + 2q and j + 3q, so the call sequence reads four long
 * sequential streams, one per quarter, that the hardware prefetcher
 * follows from start to end. Four adjacent rows (round 2) are four streams
 * of one row's length each (576-7168 weights: 0.6-28 KiB), which restart
 * at every group and which the prefetcher barely trains on; one row at a
 * time is one stream, which one core cannot keep as many lines in flight
 * on. The remainder (nr % 4 rows) goes one row at a time. Measured:
 * docs/PERFORMANCE.md, "Issue 17: float decode, round 3".
 *
 * Bits: a four-row kernel's result for a row depends on that row and x
 * only (not on the other three rows or their distance), and the rows left
 * to the one-row kernel are the last nr % 4 of the range; the callers'
 * ranges start at multiples of 4 and all but a matrix's last range hold a
 * multiple of 4 rows, so those are the matrix's last rows % 4 at any
 * thread count: the result does not depend on the split. */
#define DOT4_FAR(CALL)                                                                                                 \
    do {                                                                                                               \
        const int64_t q = nr / 4;                                                                                      \
        for (int64_t j = 0; j < q; j++) {                                                                              \
            const uint8_t *row = w->data + (size_t)(r0 + j) * w->row_bytes;                                            \
            const int64_t ldb = q * (int64_t)w->row_bytes; /* bytes between the four rows */                           \
            float o4[4];                                                                                               \
            CALL;                                                                                                      \
            y[j] = o4[0], y[j + q] = o4[1], y[j + 2 * q] = o4[2], y[j + 3 * q] = o4[3];                                \
        }                                                                                                              \
        i = 4 * q;                                                                                                     \
    } while (0)
static void dot_rows(const df_weight *w, int64_t r0, int64_t nr, const float *x, float *y) {
    const ktab *k = kt();
    int64_t i = 0;
    switch (w->fmt) {
    case DF_W_F32:
        if (w->row_bytes % 4 == 0) DOT4_FAR(k->dot4_f32((const float *)row, ldb / 4, x, w->cols, o4));
        break;
    case DF_W_BF16:
        if (w->row_bytes % 2 == 0) {
            /* x in the kernel's order once per call (K floats: noise next to nr x K
             * weights), then one wide load per 16 weights and a shift or an and */
            float *xp = xp_buf(w->cols);
            k->bf16x_prep(x, xp, w->cols);
            DOT4_FAR(k->dot4_bf16p((const uint16_t *)row, ldb / 2, x, xp, w->cols, o4));
            for (; i < nr; i++) y[i] = k->bf16p((const uint16_t *)(w->data + (size_t)(r0 + i) * w->row_bytes), x, xp, w->cols);
        }
        break;
    case DF_W_F16:
        if (w->row_bytes % 2 == 0) DOT4_FAR(k->dot4_f16((const uint16_t *)row, ldb / 2, x, w->cols, o4));
        break;
    case DF_W_FP8:
        /* the scale rows cached by fp8_scale_row are keyed by the scale pointer,
         * which a reused buffer (an expert cache slot) keeps for other
         * contents: the cache lives for one call only */
        tl_fsc_w = NULL;
        if (w->blk_c % 32 == 0 && w->cols % 32 == 0 && w->blk_r > 0) {
            /* x prepared once per call (kernels.h: fp8x_prep); the scales of
             * stream k in slot k */
            const float xs = k->fp8x_prep(x, xp_buf(w->cols), w->cols);
            const float *xp = tl_xp;
            void (*const dot4)(const uint8_t *, int64_t, const float *, float, int64_t, int, const float *const *, float *) =
                fp8_nan_free(w) ? k->dot4_fp8spn : k->dot4_fp8sp;
            /* stream s's scale row changes every blk_r rows: looked up (a division and
             * a call) only when its row reaches nxt[s], not four times per call (at 576
             * columns that was 6% of the product's instructions: docs/PERFORMANCE.md,
             * "Issue 17: FP8 decode, round 6") */
            const float *sc[4] = {NULL, NULL, NULL, NULL};
            int64_t nxt[4] = {-1, -1, -1, -1};
            DOT4_FAR({
                for (int s = 0; s < 4; s++) {
                    const int64_t r = r0 + j + s * q;
                    if (r >= nxt[s]) {
                        const int64_t sr = r / w->blk_r;
                        sc[s] = fp8_scale_row(w, sr, s);
                        nxt[s] = (sr + 1) * w->blk_r;
                    }
                }
                dot4(row, ldb, xp, xs, w->cols, w->blk_c, sc, o4);
            });
            for (; i < nr; i++)
                y[i] = k->dot_fp8sp(w->data + (size_t)(r0 + i) * w->row_bytes, xp, xs, w->cols, w->blk_c,
                                    fp8_scale_row(w, (r0 + i) / w->blk_r, 0));
        }
        break;
    case DF_W_GGML: {
        /* x prepared once for all nr rows (ggml_quant.h: df_ggml_px); the
         * prepared data is a function of x only, so results do not depend
         * on how rows are split over threads */
        float stk[1024];
        size_t na = df_ggml_px_floats(w->ggml_type, w->cols);
        df_ggml_px px;
        df_ggml_px_init(&px, w->ggml_type, x, w->cols, na <= 1024 ? stk : scratch(na));
        df_ggml_px_dot(&px, w->data + (size_t)r0 * w->row_bytes, w->row_bytes, nr, y);
        return;
    }
    default: break;
    }
    for (; i < nr; i++) y[i] = df_dot_row(w, r0 + i, x);
}

void df_dequant_row(const df_weight *w, int64_t r, float *out) {
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    const int64_t n = w->cols;
    const ktab *k = kt();
    switch (w->fmt) {
    case DF_W_F32: memcpy(out, row, (size_t)n * 4); break;
    case DF_W_I8ROW: {
        const float sc = scale_at(w, r);
        for (int64_t i = 0; i < n; i++) out[i] = (float)((const int8_t *)row)[i] * sc;
        break;
    }
    case DF_W_BF16: k->deq_bf16((const uint16_t *)row, out, n); break;
    case DF_W_F16: k->deq_f16((const uint16_t *)row, out, n); break;
    case DF_W_FP8: {
        const int64_t sr = (r / w->blk_r) * w->scale_cols;
        for (int64_t c0 = 0, b = 0; c0 < n; c0 += w->blk_c, b++)
            k->deq_fp8(row + c0, scale_at(w, sr + b), out + c0, n - c0 < w->blk_c ? n - c0 : w->blk_c);
        break;
    }
    case DF_W_INT4:
        for (int64_t c0 = 0, g = 0; c0 < n; c0 += w->blk_c, g++) {
            const float s = scale_at(w, r * w->scale_cols + g);
            const int64_t c1 = n - c0 < w->blk_c ? n : c0 + w->blk_c;
            for (int64_t i = c0; i < c1; i++) out[i] = (float)(((row[i >> 1] >> ((i & 1) * 4)) & 15) - 8) * s;
        }
        break;
    case DF_W_GGML: df_ggml_dequant_row(w->ggml_type, row, out, n); break;
    case DF_W_MXFP4: {
        const uint8_t *sc = (const uint8_t *)w->scale + r * w->scale_cols;
        if (n % DF_MXFP4_GROUP == 0) k->deq_mxfp4(row, sc, out, n);
        else df_k_deq_mxfp4_scalar(row, sc, out, n);
        break;
    }
    }
}

/* ---- parallel matrix operations ---------------------------------------- */
typedef struct {
    const df_weight *w;
    int64_t r0, nr;
    const float *x;
    float *y;
    int n;
} mv_ctx;

static void split(int64_t total, int tid, int nth, int64_t align, int64_t *b, int64_t *e) {
    int64_t chunks = (total + align - 1) / align;
    int64_t c0 = chunks * tid / nth, c1 = chunks * (tid + 1) / nth;
    *b = c0 * align;
    *e = c1 * align < total ? c1 * align : total;
}

static void mv_task(void *p, int tid, int nth) {
    mv_ctx *c = p;
    int64_t b, e;
    split(c->nr, tid, nth, 8, &b, &e);
    if (b < e) dot_rows(c->w, c->r0 + b, e - b, c->x, c->y + b);
}

static void matvec(const df_weight *w, const float *x, float *y) {
    mv_ctx c = {w, 0, w->rows, x, y, 1};
    if (w->rows * w->cols < 32768) mv_task(&c, 0, 1);
    else df_pool_run(mv_task, &c);
}

/* Prefill GEMM blocking: rows in panels of 16 (dequantized to f32 once per
 * call, exactly, and packed k-major), up to GEMM_MC rows packed at a time,
 * K in equal slices of at most GEMM_KC so that the slice of the packed
 * panels (GEMM_MC x GEMM_KC floats, 128 KB) stays in L2 and the block of 6
 * tokens of x (12 KB) in L1 while the micro-kernel runs over the panels.
 * Scratch per thread: GEMM_MC x K floats packed + GEMM_MR x K dequantized.
 * Measured on the 2-core AVX2 dev VM (bench/kernel_bench.c;
 * docs/PERFORMANCE.md, issue 17). */
#define GEMM_MR 16
#define GEMM_NR 6
#define GEMM_KC 512
#define GEMM_MC 64

static float *rows_scratch(size_t n) {
    if (n > tl_rows_cap) {
        free(tl_rows);
        tl_rows = df_aligned_alloc(n * sizeof(float));
        tl_rows_cap = n;
        scratch_register();
    }
    return tl_rows;
}

/* Batches of fewer than GEMM_MIN_N tokens: dequantizing and packing 16-row
 * panels costs more than the few FMAs per weight it serves (measured in CPU
 * time, one thread: the GEMM 1.3-2x slower than this path at n = 2-4, faster
 * from 8), so 4 rows are dequantized at a time and each token runs the
 * four-row dot kernel over them (x shared by the 4 rows). The order is the
 * dot kernel's, not the GEMM's: batches of 2-5 tokens give the same bits as
 * each other and at any thread count (row groups of 4 are aligned to the
 * 16-row split), not the same as the GEMM's from GEMM_MIN_N tokens. */
#define GEMM_MIN_N 6
static void mm_rows_small(mv_ctx *c, int64_t b, int64_t e) {
    const df_weight *w = c->w;
    const int64_t K = w->cols, R = w->rows;
    const ktab *k = kt();
    const int direct = w->fmt == DF_W_F32 && w->row_bytes % 4 == 0;
    float *rb = direct ? NULL : rows_scratch((size_t)(4 * K));
    for (int64_t r = b; r < e; r += 4) {
        const int nr = (int)(e - r < 4 ? e - r : 4);
        const float *W = rb;
        int64_t ld = K;
        if (direct) W = (const float *)(w->data + (size_t)r * w->row_bytes), ld = (int64_t)w->row_bytes / 4;
        else
            for (int i = 0; i < nr; i++) df_dequant_row(w, r + i, rb + (size_t)i * K);
        for (int t = 0; t < c->n; t++) {
            const float *x = c->x + (int64_t)t * K;
            float *y = c->y + (int64_t)t * R + r;
            if (nr == 4) k->dot4_f32(W, ld, x, K, y);
            else
                for (int i = 0; i < nr; i++) y[i] = k->f32(W + i * ld, x, K);
        }
    }
}

/* Rows [b, e) of Y = X W^T (X [n][K], Y [n][R]), every format: each output
 * is one FMA chain over k in order (kernels.h, gemm16 / gemm32), so the result does
 * not depend on b, e (the thread split), the blocking, the batch size (from
 * GEMM_MIN_N up) or the ISA. It is not the decode product's order (dot_rows: several partial sums
 * per row, added at the end): a token's row of Y may differ from df_matvec of
 * the same x by f32 rounding (docs/PERFORMANCE.md, batch invariance). */
static void mm_rows(mv_ctx *c, int64_t b, int64_t e) {
    const df_weight *w = c->w;
    const int64_t K = w->cols, R = w->rows;
    if (K <= 0 || b >= e) return;
    if (c->n < GEMM_MIN_N) { mm_rows_small(c, b, e); return; }
    const ktab *k = kt();
    const int direct = w->fmt == DF_W_F32 && w->row_bytes % 4 == 0;
    float *pk = scratch((size_t)(GEMM_MC * K));
    float *rb = direct ? NULL : rows_scratch((size_t)(GEMM_MR * K));
    for (int64_t r = b; r < e; r += GEMM_MC) {
        const int64_t mc = e - r < GEMM_MC ? e - r : GEMM_MC;
        const int np = (int)((mc + GEMM_MR - 1) / GEMM_MR);
        for (int p = 0; p < np; p++) {
            const int64_t r0 = r + (int64_t)p * GEMM_MR;
            const int nr = (int)(e - r0 < GEMM_MR ? e - r0 : GEMM_MR);
            if (direct) {
                k->pack16((const float *)(w->data + (size_t)r0 * w->row_bytes), (int64_t)w->row_bytes / 4, nr, K, pk + (size_t)p * GEMM_MR * K);
            } else if (w->fmt == DF_W_GGML && nr == GEMM_MR && k != &ktabs[DF_ISA_SCALAR] &&
                       !df_ggml_pack16(w->ggml_type, w->data + (size_t)r0 * w->row_bytes, w->row_bytes, K, pk + (size_t)p * GEMM_MR * K)) {
                /* dequantized straight into the panel: the same values (ggml_quant.h) */
            } else {
                for (int i = 0; i < nr; i++) df_dequant_row(w, r0 + i, rb + (size_t)i * K);
                k->pack16(rb, K, nr, K, pk + (size_t)p * GEMM_MR * K);
            }
        }
        /* slices of equal length (K = 576: 2 x 288, not 256 + 256 + 64) */
        const int64_t kslice = (K + (K + GEMM_KC - 1) / GEMM_KC - 1) / ((K + GEMM_KC - 1) / GEMM_KC);
        for (int64_t k0 = 0; k0 < K; k0 += kslice) {
            const int64_t kc = K - k0 < kslice ? K - k0 : kslice;
            for (int t = 0; t < c->n;) {
                /* token blocks of equal size too (8 = 4 + 4, not 6 + 2: a block of nt
                 * tokens keeps 2 nt FMA chains in flight) */
                const int left = c->n - t, nt = (left + (left + GEMM_NR - 1) / GEMM_NR - 1) / ((left + GEMM_NR - 1) / GEMM_NR);
                for (int p = 0; p < np; p++) {
                    const int64_t r0 = r + (int64_t)p * GEMM_MR;
                    const int nr = (int)(e - r0 < GEMM_MR ? e - r0 : GEMM_MR);
                    if (nt <= 3 && (int64_t)(p + 2) * GEMM_MR <= mc) { /* few tokens: two panels per call, same bits */
                        k->gemm32(pk + (size_t)p * GEMM_MR * K + (size_t)k0 * GEMM_MR, (int64_t)GEMM_MR * K, kc, c->x + (int64_t)t * K + k0,
                                  K, nt, c->y + (int64_t)t * R + r0, R, k0 > 0);
                        p++;
                        continue;
                    }
                    k->gemm16(pk + (size_t)p * GEMM_MR * K + (size_t)k0 * GEMM_MR, kc, c->x + (int64_t)t * K + k0, K, nt,
                              c->y + (int64_t)t * R + r0, R, nr, k0 > 0);
                }
                t += nt;
            }
        }
    }
}

/* Shares of a prefill product of `rows` rows (rows of several jobs
 * together): GEMM_MC-row blocks, or GEMM_MC/2 when that gives fewer than 8
 * per thread (SmolLM2's 576-row products: 18 shares, not 9). The threads
 * claim shares one at a time (pool.c), so a thread that is descheduled or
 * slowed (another process, an interrupt) hands the rest of its rows to the
 * others instead of holding the product back: with one share per thread the
 * product took as long as its slowest half, which is why two threads
 * measured 29-61% of the two-core FMA peak where one thread reached 64-77%
 * of one core's (docs/PERFORMANCE.md, issue 17 round 2). Rows only, never K:
 * mm_rows gives the same bits for any row range, so the share count changes
 * no result. */
static int gemm_shares(int64_t rows) {
    const int nth = df_pool_size();
    if (nth <= 1) return 1;
    int64_t s = (rows + GEMM_MC - 1) / GEMM_MC;
    if (s < 8 * (int64_t)nth) s = (rows + GEMM_MC / 2 - 1) / (GEMM_MC / 2);
    if (s < nth) s = nth;
    return s > DF_POOL_MAX_SHARES ? DF_POOL_MAX_SHARES : (int)s;
}

static void mm_task(void *p, int share, int shares) {
    mv_ctx *c = p;
    int64_t b, e;
    split(c->w->rows, share, shares, GEMM_MR, &b, &e);
    mm_rows(c, b, e);
}

static void matmul(const df_weight *w, const float *X, int n, float *Y) {
    if (n == 1) { matvec(w, X, Y); return; }
    mv_ctx c = {w, 0, w->rows, X, Y, n};
    df_pool_run_shares(mm_task, &c, gemm_shares(w->rows));
}

typedef struct {
    const df_mv_job *jobs;
    int n_jobs, n;
    int64_t total; /* rows of all jobs (each rounded up to a block of al rows) */
    int64_t al;    /* 4 (decode: four-row kernels) or GEMM_MR (prefill panels) */
} batch_ctx;

static void batch_task(void *p, int share, int shares) {
    batch_ctx *c = p;
    int64_t b, e;
    split(c->total, share, shares, c->al, &b, &e);
    int64_t base = 0;
    for (int j = 0; j < c->n_jobs && base < e; j++) {
        const df_weight *w = c->jobs[j].w;
        int64_t r0 = b > base ? b - base : 0, r1 = e - base < w->rows ? e - base : w->rows;
        if (r0 < r1) {
            if (c->n == 1) {
                dot_rows(w, r0, r1 - r0, DF_CF(c->jobs[j].x), DF_F(c->jobs[j].y) + r0);
            } else {
                mv_ctx m = {w, 0, w->rows, DF_CF(c->jobs[j].x), DF_F(c->jobs[j].y), c->n};
                mm_rows(&m, r0, r1);
            }
        }
        base += (w->rows + c->al - 1) / c->al * c->al;
    }
}

/* ---- exact products (backend.h: exact_products) ------------------------
 * A verify pass of speculative decoding asks for products whose every token
 * row is the bits of the one-token product (dot_rows) of that token's x. The
 * one-token path's bits depend on the row grouping only through the four-row
 * kernels (groups of 4 from a multiple of 4, the remainder at the matrix's
 * end one row at a time: matvec splits rows at multiples of 8, batch_task at
 * multiples of 4), so rows are taken here in chunks that start at multiples
 * of 4, and each chunk (a few KB of weights, in cache) is run for every token
 * before the next. x is prepared once per token per call where the format
 * prepares it apart from the rows (GGML: df_ggml_px, shared by every chunk;
 * the fused kernels decode each weight block once for several tokens with
 * the one-token kernel's arithmetic per token); the float formats prepare it
 * inside dot_rows, once per chunk. */
static _Thread_local int tl_exact;
int df_cpu_exact_products(int on) {
    tl_exact = on != 0;
    return 1;
}
int df_cpu_exact_on(void) { return tl_exact; }

#define EXACT_CHUNK_BYTES 16384 /* weights of a chunk of rows (L1 with the tokens' x) */
#define EXACT_TOKENS 16         /* tokens prepared at a time (GGML) */

static void exact_rows(const df_weight *w, int64_t b, int64_t e, const float *X, int n, float *Y) {
    const int64_t K = w->cols, R = w->rows;
    int64_t ch = ((int64_t)EXACT_CHUNK_BYTES / (w->row_bytes ? (int64_t)w->row_bytes : 1)) & ~(int64_t)3;
    if (ch < 4) ch = 4;
    if (w->fmt == DF_W_GGML) {
        const size_t na = df_ggml_px_floats(w->ggml_type, K);
        float *aux = scratch((na ? na : 1) * EXACT_TOKENS);
        for (int t0 = 0; t0 < n; t0 += EXACT_TOKENS) {
            const int nt = n - t0 < EXACT_TOKENS ? n - t0 : EXACT_TOKENS;
            df_ggml_px px[EXACT_TOKENS];
            for (int t = 0; t < nt; t++) df_ggml_px_init(&px[t], w->ggml_type, X + (int64_t)(t0 + t) * K, K, aux + (size_t)t * na);
            for (int64_t r = b; r < e; r += ch) {
                const int64_t nr = e - r < ch ? e - r : ch;
                df_ggml_px_dot_multi(px, nt, w->data + (size_t)r * w->row_bytes, w->row_bytes, nr, Y + (int64_t)t0 * R + r, R);
            }
        }
        return;
    }
    for (int64_t r = b; r < e; r += ch) {
        const int64_t nr = e - r < ch ? e - r : ch;
        for (int t = 0; t < n; t++) dot_rows(w, r, nr, X + (int64_t)t * K, Y + (int64_t)t * R + r);
    }
}

typedef struct {
    const df_mv_job *jobs;
    int n_jobs, n;
    int64_t total; /* rows of all jobs, each rounded up to a multiple of 4 */
} exact_ctx;

static void exact_task(void *p, int share, int shares) {
    exact_ctx *c = p;
    int64_t b, e, base = 0;
    split(c->total, share, shares, 4, &b, &e);
    for (int j = 0; j < c->n_jobs && base < e; j++) {
        const df_weight *w = c->jobs[j].w;
        const int64_t r0 = b > base ? b - base : 0, r1 = e - base < w->rows ? e - base : w->rows;
        if (r0 < r1) exact_rows(w, r0, r1, DF_CF(c->jobs[j].x), c->n, DF_F(c->jobs[j].y));
        base += (w->rows + 3) / 4 * 4;
    }
}

static void exact_batch(const df_mv_job *jobs, int n_jobs, int n) {
    exact_ctx c = {jobs, n_jobs, n, 0};
    int64_t work = 0;
    for (int j = 0; j < n_jobs; j++) c.total += (jobs[j].w->rows + 3) / 4 * 4, work += jobs[j].w->rows * jobs[j].w->cols;
    if (work * n < 65536) { exact_task(&c, 0, 1); return; }
    /* shares of about 32 rows (threads claim them one at a time: pool.c), a
     * multiple of the threads: a dispatch of 9 shares of 64 rows (SmolLM2's
     * 576-row products) kept one of 2 threads idle for a ninth of it */
    const int64_t th = df_pool_size() > 0 ? df_pool_size() : 1;
    int64_t s = (c.total + 31) / 32;
    s = (s + th - 1) / th * th;
    df_pool_run_shares(exact_task, &c, s > DF_POOL_MAX_SHARES ? DF_POOL_MAX_SHARES : (int)s);
}

/* One job: the single-product paths (a decode product shares rows across
 * threads from 32768 weights up); several: one dispatch over all their rows. */
void df_cpu_matmul_batch(const df_mv_job *jobs, int n_jobs, int n) {
    if (n > 1 && tl_exact) { exact_batch(jobs, n_jobs, n); return; }
    if (n_jobs == 1) { matmul(jobs[0].w, DF_CF(jobs[0].x), n, DF_F(jobs[0].y)); return; }
    batch_ctx c = {jobs, n_jobs, n, 0, n == 1 ? 4 : GEMM_MR};
    int64_t work = 0;
    for (int j = 0; j < n_jobs; j++) c.total += (jobs[j].w->rows + c.al - 1) / c.al * c.al, work += jobs[j].w->rows * jobs[j].w->cols;
    if (n == 1 && work < 65536) batch_task(&c, 0, 1);
    else if (n == 1) df_pool_run(batch_task, &c);
    else df_pool_run_shares(batch_task, &c, gemm_shares(c.total));
}

void df_cpu_matvec_t_rows(const df_weight *w, int64_t r0, int64_t nr, const float *x, float *y) {
    memset(y, 0, (size_t)w->cols * sizeof(float));
    float *buf = scratch((size_t)w->cols);
    for (int64_t r = 0; r < nr; r++) {
        df_dequant_row(w, r0 + r, buf);
        df_cpu_axpy(y, x[r], buf, (int)w->cols);
    }
}

/* ---- small ops ---------------------------------------------------------- */
float df_cpu_dot(const float *a, const float *b, int n) { return kt()->f32(a, b, n); }
void df_cpu_axpy(float *y, float a, const float *x, int n) { kt()->axpy(y, a, x, n); }
void df_cpu_softmax(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) if (x[i] > m) m = x[i];
    double s = 0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); s += x[i]; }
    float inv = (float)(1.0 / s);
    for (int i = 0; i < n; i++) x[i] *= inv;
}
