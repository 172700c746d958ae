/* test_backend_ops.c - op-by-op conformance of a backend against the CPU
 * reference (in the spirit of ggml's test-backend-ops).
 *
 * Every operation of df_backend_ops runs on the candidate backend
 * (--backend NAME, default "cpu": best ISA, all threads) and on the
 * reference ("cpu-scalar": the same CPU code on its scalar kernels and one
 * thread) with the same inputs, for every stored weight format and odd
 * shapes (rows and columns that are not multiples of the SIMD width or of
 * four rows where the format allows; n = 1, 2, 7, 33 tokens; positions > 0).
 * Outputs (and states updated in place) are compared normwise:
 *   max_i |cand_i - ref_i| <= tol * max_i |ref_i|
 * with tol stated per op: 0 for copies, 1e-6 for element-wise ops, 2e-5
 * for reductions (products, norms, attention, scans), 1e-4 for products of
 * >= 512 tokens (prefill: a GPU backend may run them in an error-bounded
 * tensor-core form, as CUDA's split-bf16); router ids must be equal. Products, the causal convolution and the KDA scan are also checked
 * against plain double-precision loops written here (so the reference
 * itself is checked, not only the candidate's agreement with it).
 *
 *   test_backend_ops [--backend NAME] [--ref NAME] [-v]
 *
 * Formats: F32, F16, BF16, FP8 (block-scaled), INT4 (grouped), I8ROW,
 * MXFP4 (compressed-tensors) and every GGML block type of ggml_quant.h. A
 * new df_wfmt is one more case in make_weight and one entry in FORMATS. */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/ggml_quant.h"
#include "format/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, checks, verbose;
static const df_backend_ops *CAND, *REF;

#define TOL_EXACT 0.0
#define TOL_ELEM 1e-6
#define TOL_RED 2e-5
#define TOL_PREFILL 1e-4

/* ---- random data ----------------------------------------------------------- */
static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((double)(next() >> 11) / 9007199254740992.0 * 2 - 1); }
static float *rnd(size_t n, float scale) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}
static uint16_t f16_rand(void) { /* finite, normal, |v| in [2^-6, 2^1) */
    uint16_t h = (uint16_t)next();
    return (uint16_t)((h & 0x83ff) | ((9 + next() % 8) << 10));
}
static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* ---- comparison ------------------------------------------------------------ */
static void compare(const char *what, const float *c, const float *r, size_t n, double tol) {
    double mx = 0, err = 0;
    size_t at = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(c[i]) != isnan(r[i]) || isinf(c[i]) || isinf(r[i])) bad = 1;
        if (fabs((double)r[i]) > mx) mx = fabs((double)r[i]);
        double e = fabs((double)c[i] - (double)r[i]);
        if (e > err) err = e, at = i;
    }
    checks++;
    if (bad || err > tol * mx) {
        failures++;
        fprintf(stderr, "FAIL %s: max |cand - ref| = %.3g at %zu (cand %.9g ref %.9g), > %.1g x max|ref| %.3g\n", what, err, at,
                n ? c[at] : 0.0, n ? r[at] : 0.0, tol, mx);
    } else if (verbose) {
        printf("ok   %s: err %.3g / max %.3g\n", what, err, mx);
    }
}
static void compare_d(const char *what, const float *c, const double *r, size_t n, double tol) {
    float *rf = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) rf[i] = (float)r[i];
    compare(what, c, rf, n, tol);
    free(rf);
}

/* Backend memory of be holding host[n] (a copy). */
static df_act *up(const df_backend_ops *be, const float *host, size_t n) {
    df_act *p = be->alloc(n);
    if (!p) { fprintf(stderr, "FAIL %s: alloc of %zu floats\n", be->name, n); exit(1); }
    be->write(p, host, n);
    return p;
}
static float *down(const df_backend_ops *be, const df_act *p, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    be->read(h, p, n);
    return h;
}
/* The same op on both backends: inputs are uploaded to each; out[i] of each compared. */
typedef struct {
    df_act *p[8];
    const df_backend_ops *be;
} side;
static void side_up(side *s, const df_backend_ops *be, float *const *host, const size_t *n, int k) {
    s->be = be;
    for (int i = 0; i < k; i++) s->p[i] = up(be, host[i], n[i]);
}
static void side_cmp(const char *what, side *c, side *r, int i, size_t n, double tol) {
    float *hc = down(c->be, c->p[i], n), *hr = down(r->be, r->p[i], n);
    compare(what, hc, hr, n, tol);
    free(hc), free(hr);
}
static void side_free(side *s, int k) {
    for (int i = 0; i < k; i++) s->be->free(s->p[i]);
}

/* ---- weights of every format --------------------------------------------------- */
typedef enum { F_F32, F_F16, F_BF16, F_FP8, F_FP8_B64, F_INT4, F_I8ROW, F_MXFP4, F_GGML } fkind;
typedef struct {
    fkind k;
    int ggml;
    const char *name;
} fmt_case;
static const fmt_case FORMATS[] = {
    {F_F32, 0, "F32"}, {F_F16, 0, "F16"}, {F_BF16, 0, "BF16"}, {F_FP8, 0, "FP8 128x128"}, {F_FP8_B64, 0, "FP8 32x64 bf16-scale"},
    {F_INT4, 0, "INT4 g32"}, {F_I8ROW, 0, "I8ROW"},
    {F_GGML, DF_GGML_F32, "GGML F32"}, {F_GGML, DF_GGML_F16, "GGML F16"}, {F_GGML, DF_GGML_BF16, "GGML BF16"},
    {F_GGML, DF_GGML_Q4_0, "Q4_0"}, {F_GGML, DF_GGML_Q4_1, "Q4_1"}, {F_GGML, DF_GGML_Q5_0, "Q5_0"}, {F_GGML, DF_GGML_Q5_1, "Q5_1"},
    {F_GGML, DF_GGML_Q8_0, "Q8_0"}, {F_GGML, DF_GGML_Q2_K, "Q2_K"}, {F_GGML, DF_GGML_Q3_K, "Q3_K"}, {F_GGML, DF_GGML_Q4_K, "Q4_K"},
    {F_GGML, DF_GGML_Q5_K, "Q5_K"}, {F_GGML, DF_GGML_Q6_K, "Q6_K"}, {F_GGML, DF_GGML_MXFP4, "GGML MXFP4"},
    {F_MXFP4, 0, "MXFP4 (compressed-tensors)"},
};
#define N_FORMATS (int)(sizeof FORMATS / sizeof FORMATS[0])

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* Random GGML blocks with sane f16 scales (as test_backend_ggml.c). */
static void ggml_fill(int type, uint8_t *buf, int64_t n) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    int64_t nb = n / t->block_elems, bb = t->block_bytes;
    for (int64_t i = 0; i < nb * bb; i++) buf[i] = (uint8_t)next();
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *b = buf + i * bb;
        switch (type) {
        case DF_GGML_F32: { float f = frand(); memcpy(b, &f, 4); break; }
        case DF_GGML_F16: put16(b, f16_rand()); break;
        case DF_GGML_BF16: put16(b, bf16_of(frand())); break;
        case DF_GGML_Q4_0: case DF_GGML_Q5_0: case DF_GGML_Q8_0: put16(b, f16_rand()); break;
        case DF_GGML_Q4_1: case DF_GGML_Q5_1: put16(b, f16_rand()), put16(b + 2, f16_rand()); break;
        case DF_GGML_Q2_K: put16(b + 80, f16_rand()), put16(b + 82, f16_rand()); break;
        case DF_GGML_Q3_K: put16(b + 108, f16_rand()); break;
        case DF_GGML_Q4_K: case DF_GGML_Q5_K: put16(b, f16_rand()), put16(b + 2, f16_rand()); break;
        case DF_GGML_Q6_K: put16(b + 208, f16_rand()); break;
        case DF_GGML_MXFP4: b[0] = (uint8_t)(110 + next() % 30); break;
        }
    }
}

/* The column counts a format is tested with: odd where the format allows. */
static int cols_for(const fmt_case *f, int64_t *out) {
    if (f->k == F_GGML) {
        int be = df_ggml_traits_of(f->ggml)->block_elems;
        if (be == 1) { out[0] = 37, out[1] = 200, out[2] = 1030; return 3; }
        if (be == 32) { out[0] = 32, out[1] = 96, out[2] = 416; return 3; }
        out[0] = 256, out[1] = 768;
        return 2;
    }
    if (f->k == F_INT4) { out[0] = 64, out[1] = 96, out[2] = 200; return 3; } /* 200: a partial group (scalar path) */
    if (f->k == F_MXFP4) { out[0] = 32, out[1] = 96, out[2] = 416; return 3; }  /* whole groups of 32 (others are refused at load) */
    if (f->k == F_FP8 || f->k == F_FP8_B64) { out[0] = 256, out[1] = 200, out[2] = 37; return 3; } /* partial blocks */
    out[0] = 37, out[1] = 200, out[2] = 1030;
    return 3;
}

typedef struct {
    df_weight w;
    void *data, *scale;
} wbuf;

static void make_weight(const fmt_case *f, int64_t rows, int64_t cols, wbuf *o) {
    memset(o, 0, sizeof *o);
    df_weight *w = &o->w;
    w->rows = rows, w->cols = cols;
    switch (f->k) {
    case F_F32: {
        float *d = rnd((size_t)(rows * cols), 1);
        w->fmt = DF_W_F32, w->row_bytes = (size_t)cols * 4, o->data = d;
        break;
    }
    case F_F16: case F_BF16: {
        uint16_t *d = malloc((size_t)(rows * cols) * 2);
        for (int64_t i = 0; i < rows * cols; i++) d[i] = f->k == F_F16 ? f16_rand() : bf16_of(frand());
        w->fmt = f->k == F_F16 ? DF_W_F16 : DF_W_BF16, w->row_bytes = (size_t)cols * 2, o->data = d;
        break;
    }
    case F_FP8: case F_FP8_B64: {
        uint8_t *d = malloc((size_t)(rows * cols));
        for (int64_t i = 0; i < rows * cols; i++) {
            uint8_t b = (uint8_t)next();
            d[i] = (b & 0x7f) == 0x7f ? b ^ 1 : b; /* no NaN */
        }
        int br = f->k == F_FP8 ? 128 : 32, bc = f->k == F_FP8 ? 128 : 64;
        int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
        if (f->k == F_FP8) {
            float *s = malloc((size_t)(sr * sc) * 4);
            for (int64_t i = 0; i < sr * sc; i++) s[i] = 1e-3f * (1 + (float)(next() % 100) / 50);
            o->scale = s, w->scale_dtype = DF_SCALE_F32;
        } else {
            uint16_t *s = malloc((size_t)(sr * sc) * 2);
            for (int64_t i = 0; i < sr * sc; i++) s[i] = bf16_of(1e-3f * (1 + (float)(next() % 100) / 50));
            o->scale = s, w->scale_dtype = DF_SCALE_BF16;
        }
        w->fmt = DF_W_FP8, w->row_bytes = (size_t)cols, w->blk_r = br, w->blk_c = bc, w->scale_cols = sc, o->data = d;
        break;
    }
    case F_INT4: {
        const int g = 32;
        size_t rb = (size_t)((cols + 7) / 8) * 4;
        uint8_t *d = malloc(rb * (size_t)rows);
        for (size_t i = 0; i < rb * (size_t)rows; i++) d[i] = (uint8_t)next();
        int64_t sc = (cols + g - 1) / g;
        uint16_t *s = malloc((size_t)(rows * sc) * 2);
        for (int64_t i = 0; i < rows * sc; i++) s[i] = bf16_of(0.01f * (1 + (float)(next() % 100) / 50));
        w->fmt = DF_W_INT4, w->row_bytes = rb, w->blk_r = 1, w->blk_c = g, w->scale_cols = sc, w->scale_dtype = DF_SCALE_BF16;
        o->data = d, o->scale = s;
        break;
    }
    case F_I8ROW: {
        int8_t *d = malloc((size_t)(rows * cols));
        for (int64_t i = 0; i < rows * cols; i++) d[i] = (int8_t)next();
        float *s = malloc((size_t)rows * 4);
        for (int64_t r = 0; r < rows; r++) s[r] = 0.01f * (1 + (float)(next() % 100) / 50);
        w->fmt = DF_W_I8ROW, w->row_bytes = (size_t)cols, w->blk_r = 1, w->blk_c = (int)cols, w->scale_cols = 1, w->scale_dtype = DF_SCALE_F32;
        o->data = d, o->scale = s;
        break;
    }
    case F_MXFP4: {
        size_t rb = (size_t)(cols / 2);
        uint8_t *d = malloc(rb * (size_t)rows), *sc = malloc((size_t)(rows * (cols / 32)));
        for (size_t i = 0; i < rb * (size_t)rows; i++) d[i] = (uint8_t)next();
        for (int64_t i = 0; i < rows * (cols / 32); i++) sc[i] = (uint8_t)(118 + next() % 12); /* 2^-9 .. 2^2 */
        w->fmt = DF_W_MXFP4, w->row_bytes = rb, w->blk_r = 1, w->blk_c = 32, w->scale_cols = cols / 32, w->scale_dtype = DF_SCALE_E8M0;
        o->data = d, o->scale = sc;
        break;
    }
    case F_GGML: {
        size_t rb = (size_t)df_ggml_row_bytes(f->ggml, cols);
        uint8_t *d = malloc(rb * (size_t)rows + 1);
        for (int64_t r = 0; r < rows; r++) ggml_fill(f->ggml, d + 1 + rb * (size_t)r, cols);
        w->fmt = DF_W_GGML, w->ggml_type = f->ggml, w->row_bytes = rb;
        o->data = d;
        w->data = d + 1; /* unaligned, as blocks in files are */
        w->scale = o->scale;
        return;
    }
    }
    w->data = o->data;
    w->scale = o->scale;
}
static void free_weight(wbuf *o) { free(o->data), free(o->scale); }

/* Y[n][rows] in double from the dequantized rows (the reference of the reference). */
static double *matmul_double(const df_weight *w, const float *x, int n) {
    double *y = calloc((size_t)n * (size_t)w->rows, sizeof(double));
    float *row = malloc((size_t)w->cols * sizeof(float));
    df_set_isa(DF_ISA_SCALAR), df_ggml_set_isa(DF_GGML_ISA_SCALAR);
    for (int64_t r = 0; r < w->rows; r++) {
        df_dequant_row(w, r, row);
        for (int t = 0; t < n; t++) {
            double s = 0;
            for (int64_t i = 0; i < w->cols; i++) s += (double)row[i] * x[(size_t)t * w->cols + i];
            y[(size_t)t * w->rows + r] = s;
        }
    }
    df_set_isa(-1), df_ggml_set_isa(DF_GGML_ISA_AUTO);
    free(row);
    return y;
}

static const int NS[] = {1, 2, 7, 33};

static void test_matmul(void) {
    static const int64_t ROWS[] = {1, 7, 33, 70};
    for (int fi = 0; fi < N_FORMATS; fi++) {
        const fmt_case *f = &FORMATS[fi];
        int64_t cols[4];
        int nc = cols_for(f, cols);
        for (int ci = 0; ci < nc; ci++)
            for (int ri = 0; ri < 4; ri++)
                for (int ni = 0; ni < 4; ni++) {
                    const int64_t R = ROWS[ri], C = cols[ci];
                    const int n = NS[ni];
                    if (ri < 2 && ni > 1 && ci > 0) continue; /* keep the run short: small rows with few n */
                    wbuf wb;
                    make_weight(f, R, C, &wb);
                    CAND->weight_register(&wb.w);
                    float *x = rnd((size_t)n * C, 1);
                    side c, r;
                    float *yz = calloc((size_t)n * R, sizeof(float));
                    float *h[2] = {x, yz};
                    size_t sz[2] = {(size_t)n * C, (size_t)n * R};
                    side_up(&c, CAND, h, sz, 2), side_up(&r, REF, h, sz, 2);
                    df_mv_job jc = {&wb.w, c.p[0], c.p[1]}, jr = {&wb.w, r.p[0], r.p[1]};
                    CAND->matmul_batch(&jc, 1, n);
                    REF->matmul_batch(&jr, 1, n);
                    char what[128];
                    snprintf(what, sizeof what, "matmul %s [%lld x %lld] n=%d", f->name, (long long)R, (long long)C, n);
                    side_cmp(what, &c, &r, 1, sz[1], TOL_RED);
                    /* the reference against double precision */
                    double *yd = matmul_double(&wb.w, x, n);
                    float *yr = down(REF, r.p[1], sz[1]);
                    snprintf(what, sizeof what, "matmul %s [%lld x %lld] n=%d (reference vs double)", f->name, (long long)R, (long long)C, n);
                    compare_d(what, yr, yd, sz[1], TOL_RED);
                    free(yd), free(yr);
                    side_free(&c, 2), side_free(&r, 2);
                    CAND->weight_unregister(&wb.w);
                    free(x), free(yz);
                    free_weight(&wb);
                }
    }
    /* a batch of jobs of different formats and shapes in one dispatch */
    for (int ni = 0; ni < 4; ni++) {
        const int n = NS[ni], NJ = 4;
        const int fis[4] = {2, 3, 9, 17}; /* BF16, FP8, GGML BF16, Q4_K */
        const int64_t rs[4] = {33, 70, 9, 5}, cs[4] = {200, 256, 200, 256};
        wbuf wb[4];
        side c, r;
        float *h[8];
        size_t sz[8];
        for (int j = 0; j < NJ; j++) {
            make_weight(&FORMATS[fis[j]], rs[j], cs[j], &wb[j]);
            h[2 * j] = rnd((size_t)n * cs[j], 1), sz[2 * j] = (size_t)n * cs[j];
            h[2 * j + 1] = calloc((size_t)n * rs[j], sizeof(float)), sz[2 * j + 1] = (size_t)n * rs[j];
        }
        side_up(&c, CAND, h, sz, 2 * NJ), side_up(&r, REF, h, sz, 2 * NJ);
        df_mv_job jc[4], jr[4];
        for (int j = 0; j < NJ; j++) jc[j] = (df_mv_job){&wb[j].w, c.p[2 * j], c.p[2 * j + 1]}, jr[j] = (df_mv_job){&wb[j].w, r.p[2 * j], r.p[2 * j + 1]};
        CAND->matmul_batch(jc, NJ, n);
        REF->matmul_batch(jr, NJ, n);
        for (int j = 0; j < NJ; j++) {
            char what[96];
            snprintf(what, sizeof what, "matmul_batch job %d (%s) n=%d", j, FORMATS[fis[j]].name, n);
            side_cmp(what, &c, &r, 2 * j + 1, sz[2 * j + 1], TOL_RED);
        }
        side_free(&c, 2 * NJ), side_free(&r, 2 * NJ);
        for (int j = 0; j < NJ; j++) free(h[2 * j]), free(h[2 * j + 1]), free_weight(&wb[j]);
    }
}

/* Prefill products (n = 600 tokens): the CUDA backend takes its split-bf16
 * tensor-core form there (from 512 tokens; from 32: dequantize + SGEMM,
 * covered by n = 33 above); formats with bf16-exact values (BF16, MXFP4)
 * and others. */
static void test_matmul_prefill(void) {
    const int fis[] = {0, 2, 3, 5, 17, N_FORMATS - 1}; /* F32, BF16, FP8 128x128, INT4 g32, Q4_K, MXFP4 */
    const int n = 600;
    for (size_t k = 0; k < sizeof fis / sizeof fis[0]; k++) {
        const fmt_case *f = &FORMATS[fis[k]];
        int64_t cols[4];
        cols_for(f, cols);
        const int64_t R = 70, C = cols[1];
        wbuf wb;
        make_weight(f, R, C, &wb);
        CAND->weight_register(&wb.w);
        float *x = rnd((size_t)n * C, 1), *yz = calloc((size_t)n * R, sizeof(float));
        float *h[2] = {x, yz};
        size_t sz[2] = {(size_t)n * C, (size_t)n * R};
        side c, r;
        side_up(&c, CAND, h, sz, 2), side_up(&r, REF, h, sz, 2);
        df_mv_job jc = {&wb.w, c.p[0], c.p[1]}, jr = {&wb.w, r.p[0], r.p[1]};
        CAND->matmul_batch(&jc, 1, n);
        REF->matmul_batch(&jr, 1, n);
        char what[128];
        snprintf(what, sizeof what, "matmul %s [%lld x %lld] n=%d (prefill)", f->name, (long long)R, (long long)C, n);
        side_cmp(what, &c, &r, 1, sz[1], TOL_PREFILL);
        double *yd = matmul_double(&wb.w, x, n);
        float *yc = down(CAND, c.p[1], sz[1]);
        snprintf(what, sizeof what, "matmul %s [%lld x %lld] n=%d (prefill, candidate vs double)", f->name, (long long)R, (long long)C, n);
        compare_d(what, yc, yd, sz[1], TOL_PREFILL);
        free(yd), free(yc);
        side_free(&c, 2), side_free(&r, 2);
        CAND->weight_unregister(&wb.w);
        free(x), free(yz);
        free_weight(&wb);
    }
}

/* ---- attention ------------------------------------------------------------------ */
/* The CPU backend: n positions in one call give the bits of n one-position
 * calls (a speculative verify pass equals the plain steps), for the
 * candidate's output `out` of a batched call already made. */
static void gqa_batch_vs_steps(const df_act *q, const df_act *kv, const df_act *out, int n, int pos0, int NH, int KV, int hd, float scale) {
    if (strcmp(CAND->name, "cpu") || n == 1) return;
    const size_t qs = (size_t)NH * hd;
    df_act *o1 = CAND->alloc((size_t)n * qs);
    for (int t = 0; t < n; t++) {
        const df_attn_gqa_args a1 = {DF_AT(q, t * qs), kv, DF_AT(o1, t * qs), 1, pos0 + t, NH, KV, hd, scale};
        CAND->attn_gqa(&a1);
    }
    float *hb = down(CAND, out, (size_t)n * qs), *h1 = down(CAND, o1, (size_t)n * qs);
    checks++;
    if (memcmp(hb, h1, (size_t)n * qs * sizeof(float))) {
        failures++;
        fprintf(stderr, "FAIL attn_gqa n=%d pos0=%d: the batched call differs from %d one-position calls (bits)\n", n, pos0, n);
    } else if (verbose) {
        printf("ok   attn_gqa n=%d pos0=%d: batched == one-position calls, bit for bit\n", n, pos0);
    }
    free(hb), free(h1);
    CAND->free(o1);
}
static void test_attn_gqa(void) {
    /* pos0 300: a decode step over a long cache (the CUDA backend splits its positions over blocks), head_dim 128 */
    static const int P0[] = {0, 5, 40, 300};
    for (int ni = 0; ni < 4; ni++)
        for (int pi = 0; pi < 4; pi++) {
            const int n = NS[ni], pos0 = P0[pi], NH = 6, KV = 2, hd = pi == 3 ? 128 : 36, T = pos0 + n;
            float *q = rnd((size_t)n * NH * hd, 1), *kv = rnd((size_t)T * 2 * KV * hd, 1), *o = calloc((size_t)n * NH * hd, 4);
            float *h[3] = {q, kv, o};
            size_t sz[3] = {(size_t)n * NH * hd, (size_t)T * 2 * KV * hd, (size_t)n * NH * hd};
            side c, r;
            side_up(&c, CAND, h, sz, 3), side_up(&r, REF, h, sz, 3);
            df_attn_gqa_args ac = {c.p[0], c.p[1], c.p[2], n, pos0, NH, KV, hd, 0.17f}, ar = ac;
            ar.q = r.p[0], ar.kv = r.p[1], ar.out = r.p[2];
            CAND->attn_gqa(&ac);
            REF->attn_gqa(&ar);
            char what[64];
            snprintf(what, sizeof what, "attn_gqa n=%d pos0=%d", n, pos0);
            side_cmp(what, &c, &r, 2, sz[2], TOL_RED);
            gqa_batch_vs_steps(c.p[0], c.p[1], c.p[2], n, pos0, NH, KV, hd, 0.17f);
            side_free(&c, 3), side_free(&r, 3);
            free(q), free(kv), free(o);
        }
    /* a speculative verify pass of SmolLM2's shape (9 heads, 3 KV heads, head_dim 64) over ~1000 positions */
    const int n = 9, pos0 = 1000, NH = 9, KV = 3, hd = 64, T = pos0 + n;
    float *q = rnd((size_t)n * NH * hd, 1), *kv = rnd((size_t)T * 2 * KV * hd, 1), *o = calloc((size_t)n * NH * hd, 4);
    float *h[3] = {q, kv, o};
    size_t sz[3] = {(size_t)n * NH * hd, (size_t)T * 2 * KV * hd, (size_t)n * NH * hd};
    side c, r;
    side_up(&c, CAND, h, sz, 3), side_up(&r, REF, h, sz, 3);
    df_attn_gqa_args ac = {c.p[0], c.p[1], c.p[2], n, pos0, NH, KV, hd, 0.125f}, ar = ac;
    ar.q = r.p[0], ar.kv = r.p[1], ar.out = r.p[2];
    CAND->attn_gqa(&ac);
    REF->attn_gqa(&ar);
    side_cmp("attn_gqa verify shape n=9 pos0=1000", &c, &r, 2, sz[2], TOL_RED);
    gqa_batch_vs_steps(c.p[0], c.p[1], c.p[2], n, pos0, NH, KV, hd, 0.125f);
    side_free(&c, 3), side_free(&r, 3);
    free(q), free(kv), free(o);
}

/* one MLA case: CAND against REF on random q, cache and weights of format fi (kv_b, or with split the GGUF
 * k_b / v_b); on the CPU backend (n >= 4) also the same positions in two batches, bit for bit */
static void mla_case(int fi, int split, int n, int pos0, int NH, int nope, int rope, int R, int vd, float scale, const char *label) {
    const int T = pos0 + n;
    wbuf kvb, kb, vb;
    make_weight(&FORMATS[fi], (int64_t)NH * (nope + vd), R, &kvb);
    df_weight none = {0};
    if (split) make_weight(&FORMATS[fi], (int64_t)NH * R, nope, &kb), make_weight(&FORMATS[fi], (int64_t)NH * vd, R, &vb);
    float *q = rnd((size_t)n * NH * (nope + rope), 1), *cache = rnd((size_t)T * (R + rope), 1), *o = calloc((size_t)n * NH * vd, 4);
    float *h[3] = {q, cache, o};
    size_t sz[3] = {(size_t)n * NH * (nope + rope), (size_t)T * (R + rope), (size_t)n * NH * vd};
    side c, r;
    side_up(&c, CAND, h, sz, 3), side_up(&r, REF, h, sz, 3);
    df_attn_mla_args ac = {c.p[0], c.p[1], c.p[2], &kvb.w, split ? &kb.w : &none, split ? &vb.w : &none, n, pos0, NH, nope, rope, R, vd, scale};
    df_attn_mla_args ar = ac;
    ar.q = r.p[0], ar.cache = r.p[1], ar.out = r.p[2];
    CAND->attn_mla(&ac);
    REF->attn_mla(&ar);
    char what[128];
    snprintf(what, sizeof what, "attn_mla%s %s%s n=%d pos0=%d", label, FORMATS[fi].name, split ? " split k_b/v_b" : "", n, pos0);
    side_cmp(what, &c, &r, 2, sz[2], TOL_RED);
    if (!strcmp(CAND->name, "cpu") && n >= 4) {
        /* the CPU backend: the same positions in two batches (n >= 2 each) give the same bits */
        const int n1 = n / 2;
        const size_t qs = (size_t)NH * (nope + rope), os = (size_t)NH * vd;
        df_act *o2 = CAND->alloc(sz[2]);
        df_attn_mla_args a1 = ac, a2 = ac;
        a1.out = o2, a1.n = n1;
        a2.q = DF_AT(ac.q, n1 * qs), a2.out = DF_AT(o2, n1 * os), a2.n = n - n1, a2.pos0 = pos0 + n1;
        CAND->attn_mla(&a1), CAND->attn_mla(&a2);
        float *hb = down(CAND, c.p[2], sz[2]), *h2 = down(CAND, o2, sz[2]);
        checks++;
        if (memcmp(hb, h2, sz[2] * sizeof(float)))
            failures++, fprintf(stderr, "FAIL %s: one batch differs from two batches (%d + %d positions)\n", what, n1, n - n1);
        else if (verbose)
            printf("ok   %s: one batch == two batches, bit for bit\n", what);
        free(hb), free(h2);
        CAND->free(o2);
    }
    side_free(&c, 3), side_free(&r, 3);
    free(q), free(cache), free(o);
    free_weight(&kvb);
    if (split) free_weight(&kb), free_weight(&vb);
}
static void test_attn_mla(void) {
    const int fis[3] = {0, 2, 3}; /* F32, BF16, FP8 */
    for (int fi = 0; fi < 3; fi++)
        for (int split = 0; split < 2; split++)
            for (int ni = 0; ni < 4; ni++) mla_case(fis[fi], split, NS[ni], ni * 3, 3, 24, 8, 40, 20, 0.11f, "");
}

/* MLA at DeepSeek-V3's head shapes (nope 128, rope 64, kv_lora 512, v 128): the CUDA backend's decode path
 * (three launches for n <= 4: absorb, chunks of positions over groups of 16 heads, combine + W_uv) over 20 heads
 * (a partial head group), short and long caches (chunks of 16 and of 64 positions), both weight layouts */
static void test_attn_mla_dsv3(void) {
    const int fis[2] = {2, 3}; /* BF16, FP8 */
    const int cases[][2] = {{1, 700}, {2, 37}, {4, 300}, {1, 5000}, {1, 0}};
    for (int fi = 0; fi < 2; fi++)
        for (int split = 0; split < 2; split++)
            for (int ci = 0; ci < 5; ci++)
                if (!split || ci < 3) /* the split layout: the shorter cases suffice */
                    mla_case(fis[fi], split, cases[ci][0], cases[ci][1], 20, 128, 64, 512, 128, 0.0721f, " DeepSeek-V3 heads");
}

/* ---- rows and element-wise ops ------------------------------------------------------ */
static void test_rows(void) {
    for (int ni = 0; ni < 4; ni++) {
        const int n = NS[ni], C = 37, S = 45; /* rows of 37 at a stride of 45 */
        float *x = rnd((size_t)n * S, 3), *g = rnd(C, 1), *y = rnd((size_t)n * S, 1);
        float *h[2] = {x, y};
        size_t sz[2] = {(size_t)n * S, (size_t)n * S};
        side c, r;
        side_up(&c, CAND, h, sz, 2), side_up(&r, REF, h, sz, 2);
        CAND->rmsnorm(c.p[1], S, c.p[0], S, g, n, C, 1e-6f);
        REF->rmsnorm(r.p[1], S, r.p[0], S, g, n, C, 1e-6f);
        char what[64];
        snprintf(what, sizeof what, "rmsnorm rows=%d cols=%d strided", n, C);
        side_cmp(what, &c, &r, 1, sz[1], TOL_RED);
        /* in place, per head (rows of head_dim) */
        CAND->rmsnorm(c.p[0], 9, c.p[0], 9, g, n * 5, 9, 1e-5f);
        REF->rmsnorm(r.p[0], 9, r.p[0], 9, g, n * 5, 9, 1e-5f);
        snprintf(what, sizeof what, "rmsnorm per head in place n=%d", n);
        side_cmp(what, &c, &r, 0, (size_t)n * 45, TOL_RED);
        side_free(&c, 2), side_free(&r, 2);
        free(x), free(g), free(y);
    }
    /* RoPE: the table of positions pos0.., then both rotations over strided heads */
    for (int ni = 0; ni < 4; ni++)
        for (int il = 0; il < 2; il++) {
            const int n = NS[ni], pos0 = 3 + 100 * ni, dim = 10, NH = 3, hs = 14, ts = NH * hs + 2;
            float *inv = malloc((dim / 2) * sizeof(float));
            for (int i = 0; i < dim / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / dim);
            float *x = rnd((size_t)n * ts, 1), *cs = calloc((size_t)n * dim, 4);
            float *h[2] = {x, cs};
            size_t sz[2] = {(size_t)n * ts, (size_t)n * dim};
            side c, r;
            side_up(&c, CAND, h, sz, 2), side_up(&r, REF, h, sz, 2);
            CAND->rope_table(c.p[1], pos0, n, inv, dim / 2, 1.25f);
            REF->rope_table(r.p[1], pos0, n, inv, dim / 2, 1.25f);
            char what[64];
            snprintf(what, sizeof what, "rope_table n=%d pos0=%d", n, pos0);
            side_cmp(what, &c, &r, 1, sz[1], TOL_ELEM);
            CAND->rope(DF_AT(c.p[0], 2), n, NH, ts, hs, dim, c.p[1], il);
            REF->rope(DF_AT(r.p[0], 2), n, NH, ts, hs, dim, r.p[1], il);
            snprintf(what, sizeof what, "rope %s n=%d pos0=%d", il ? "interleaved" : "rotate-half", n, pos0);
            side_cmp(what, &c, &r, 0, sz[0], TOL_ELEM);
            side_free(&c, 2), side_free(&r, 2);
            free(inv), free(x), free(cs);
        }
    /* element-wise */
    static const size_t LEN[] = {1, 37, 1003};
    for (int li = 0; li < 3; li++) {
        const size_t N = LEN[li];
        float *a = rnd(N * 2, 4), *b = rnd(N * 2, 4), *o = rnd(N * 2, 1), *bias = rnd(N, 1);
        float *h[3] = {a, b, o};
        size_t sz[3] = {N * 2, N * 2, N * 2};
        side c, r;
        side_up(&c, CAND, h, sz, 3), side_up(&r, REF, h, sz, 3);
        char what[64];
        CAND->add(c.p[2], c.p[0], N * 2), REF->add(r.p[2], r.p[0], N * 2);
        snprintf(what, sizeof what, "add n=%zu", N * 2), side_cmp(what, &c, &r, 2, N * 2, TOL_ELEM);
        CAND->add_bias(c.p[2], bias, 2, (int)N), REF->add_bias(r.p[2], bias, 2, (int)N);
        snprintf(what, sizeof what, "add_bias 2 x %zu", N), side_cmp(what, &c, &r, 2, N * 2, TOL_ELEM);
        CAND->axpy(c.p[2], -0.7f, c.p[1], N * 2), REF->axpy(r.p[2], -0.7f, r.p[1], N * 2);
        snprintf(what, sizeof what, "axpy n=%zu", N * 2), side_cmp(what, &c, &r, 2, N * 2, TOL_ELEM);
        CAND->scale(c.p[2], 0.3f, N * 2), REF->scale(r.p[2], 0.3f, N * 2);
        snprintf(what, sizeof what, "scale n=%zu", N * 2), side_cmp(what, &c, &r, 2, N * 2, TOL_ELEM);
        for (int k = 0; k < DF_GATE_N; k++) {
            const float p0 = 4.0f, p1 = k == DF_GATE_SITU && li == 1 ? 0.0f : 2.5f; /* SiTU with and without the up squash */
            float *gin = down(REF, r.p[0], N * 2), *uin = down(REF, r.p[1], N * 2);
            CAND->gate(c.p[2], c.p[0], c.p[1], N * 2, (df_gate_kind)k, p0, p1), REF->gate(r.p[2], r.p[0], r.p[1], N * 2, (df_gate_kind)k, p0, p1);
            snprintf(what, sizeof what, "gate kind %d n=%zu", k, N * 2), side_cmp(what, &c, &r, 2, N * 2, TOL_ELEM);
            double *gd = malloc(N * 2 * sizeof(double));
            for (size_t i = 0; i < N * 2; i++) {
                const double x = gin[i], u = uin[i], sg = 1 / (1 + exp(-x));
                gd[i] = k == DF_GATE_SILU ? x * sg * u : k == DF_GATE_SIGMOID ? sg * u : p0 * tanh(x / p0) * sg * (p1 != 0 ? p1 * tanh(u / p1) : u);
            }
            float *go = down(REF, r.p[2], N * 2);
            snprintf(what, sizeof what, "gate kind %d n=%zu (reference vs double)", k, N * 2), compare_d(what, go, gd, N * 2, TOL_ELEM);
            free(go), free(gd), free(gin), free(uin);
            CAND->gate(c.p[0], c.p[0], c.p[1], N * 2, (df_gate_kind)k, p0, p1), REF->gate(r.p[0], r.p[0], r.p[1], N * 2, (df_gate_kind)k, p0, p1);
            snprintf(what, sizeof what, "gate kind %d in place n=%zu", k, N * 2), side_cmp(what, &c, &r, 0, N * 2, TOL_ELEM);
        }
        {
            float *xin = down(REF, r.p[1], N * 2);
            CAND->sigmoid(c.p[1], N * 2), REF->sigmoid(r.p[1], N * 2);
            snprintf(what, sizeof what, "sigmoid n=%zu", N * 2), side_cmp(what, &c, &r, 1, N * 2, TOL_ELEM);
            double *sd = malloc(N * 2 * sizeof(double));
            for (size_t i = 0; i < N * 2; i++) sd[i] = 1 / (1 + exp(-(double)xin[i]));
            float *so = down(REF, r.p[1], N * 2);
            snprintf(what, sizeof what, "sigmoid n=%zu (reference vs double)", N * 2), compare_d(what, so, sd, N * 2, TOL_ELEM);
            free(so), free(sd), free(xin);
        }
        side_free(&c, 3), side_free(&r, 3);
        free(a), free(b), free(o), free(bias);
    }
}

/* The CPU backend splits large row and element-wise calls (prefill, verify passes) over its pool; each row's sums on one
 * thread and every element by the same code, so the bits must equal the one-thread reference's: memcmp, not a tolerance.
 * Sizes past the split's threshold (8192 elements of work), odd so the ranges end mid-vector; CPU candidates only. */
static void test_rows_split(void) {
    if (strncmp(CAND->name, "cpu", 3) || !strcmp(CAND->name, REF->name)) return;
    const int n = 61, C = 576, NH = 9, hd = 64, dim = 64, ts = NH * hd;
    const size_t N = (size_t)n * 1536 + 7;
    float *x = rnd((size_t)n * C, 3), *g = rnd(C, 1), *a = rnd(N, 4), *b = rnd(N, 4), *q = rnd((size_t)n * ts, 1);
    float *inv = malloc((dim / 2) * sizeof(float));
    for (int i = 0; i < dim / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / dim);
    float *h[6] = {x, a, b, q, x, q}; /* [4]: rmsnorm's out, [5]: the rope table */
    size_t sz[6] = {(size_t)n * C, N, N, (size_t)n * ts, (size_t)n * C, (size_t)n * dim};
    side c, r;
    side_up(&c, CAND, h, sz, 6), side_up(&r, REF, h, sz, 6);
    const struct { const char *what; int i; size_t n; } out[] = {{"rmsnorm", 4, (size_t)n * C}, {"add", 1, N}, {"gate", 2, N}, {"rope", 3, (size_t)n * ts}};
    for (int step = 0; step < 4; step++) {
        side *sd[2] = {&c, &r};
        for (int k = 0; k < 2; k++) {
            const df_backend_ops *be = sd[k]->be;
            df_act **p = sd[k]->p;
            if (step == 0) be->rmsnorm(p[4], C, p[0], C, g, n, C, 1e-6f);
            if (step == 1) be->add(p[1], p[2], N);
            if (step == 2)
                for (int kind = 0; kind < DF_GATE_N; kind++) be->gate(p[2], p[1], p[2], N, (df_gate_kind)kind, 4.0f, 2.5f);
            if (step == 3) be->rope_table(p[5], 17, n, inv, dim / 2, 1.0f), be->rope(p[3], n, NH, ts, hd, dim, p[5], 0);
        }
        float *hc = down(CAND, c.p[out[step].i], out[step].n), *hr = down(REF, r.p[out[step].i], out[step].n);
        checks++;
        if (memcmp(hc, hr, out[step].n * sizeof(float))) {
            failures++;
            fprintf(stderr, "FAIL %s over %zu values split over %d threads: not bit-equal to the one-thread reference\n", out[step].what, out[step].n,
                    df_pool_size());
        }
        free(hc), free(hr);
    }
    side_free(&c, 6), side_free(&r, 6);
    free(x), free(g), free(a), free(b), free(q), free(inv);
}

/* ---- fused ops (optional entries: each side runs its own, or the composition the wrapper issues where it has
 * none; cpu-scalar has none, so the candidate's fused op is checked against the plain ops) ------------------ */
static void test_fused(void) {
    for (int ni = 0; ni < 4; ni++)
        for (int ci = 0; ci < 2; ci++) {
            const int n = NS[ni], C = ci ? 300 : 37;
            const size_t N = (size_t)n * C;
            float *y = rnd(N, 3), *x = rnd(N, 3), *o = rnd(N, 1), *g = rnd(C, 1);
            float *h[3] = {y, x, o};
            size_t sz[3] = {N, N, N};
            side c, r;
            side_up(&c, CAND, h, sz, 3), side_up(&r, REF, h, sz, 3);
            df_add_rmsnorm_on(CAND, c.p[2], c.p[0], c.p[1], g, n, C, 1e-6f);
            df_add_rmsnorm_on(REF, r.p[2], r.p[0], r.p[1], g, n, C, 1e-6f);
            char what[80];
            snprintf(what, sizeof what, "add_rmsnorm rows=%d cols=%d (sum)", n, C), side_cmp(what, &c, &r, 0, N, TOL_ELEM);
            snprintf(what, sizeof what, "add_rmsnorm rows=%d cols=%d (norm)", n, C), side_cmp(what, &c, &r, 2, N, TOL_RED);
            side_free(&c, 3), side_free(&r, 3);
            free(y), free(x), free(o), free(g);
        }
    for (int ni = 0; ni < 4; ni++)
        for (int il = 0; il < 2; il++)
            for (int part = 0; part < 2; part++) {
                const int n = NS[ni], pos0 = 5 + 60 * ni, NQ = 4, NK = 2, hd = 12, rd = part ? 8 : hd;
                float *inv = malloc((rd / 2) * sizeof(float));
                for (int i = 0; i < rd / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / rd);
                float *q = rnd((size_t)n * NQ * hd, 2), *k = rnd((size_t)n * NK * hd, 2), *cs = calloc((size_t)n * rd, 4), *gq = rnd(hd, 1), *gk = rnd(hd, 1);
                /* the K/V cache rows (part 0: copied, at a stride of 2 rows + 1; part 1: no copy) */
                const size_t KVS = 2 * (size_t)NK * hd + 1;
                float *v = rnd((size_t)n * NK * hd, 2), *kv = rnd((size_t)n * KVS, 1);
                float *h[5] = {q, k, cs, v, kv};
                size_t sz[5] = {(size_t)n * NQ * hd, (size_t)n * NK * hd, (size_t)n * rd, (size_t)n * NK * hd, (size_t)n * KVS};
                side c, r;
                side_up(&c, CAND, h, sz, 5), side_up(&r, REF, h, sz, 5);
                CAND->rope_table(c.p[2], pos0, n, inv, rd / 2, 1.0f), REF->rope_table(r.p[2], pos0, n, inv, rd / 2, 1.0f);
                df_qk_norm_rope_args ac = {c.p[0], c.p[1], gq, gk, n, NQ, NK, hd, rd, 1e-6f, c.p[2], il, NULL, NULL, NULL, 0};
                df_qk_norm_rope_args ar = {r.p[0], r.p[1], gq, gk, n, NQ, NK, hd, rd, 1e-6f, r.p[2], il, NULL, NULL, NULL, 0};
                if (!part) {
                    ac.v = c.p[3], ac.kc = c.p[4], ac.vc = DF_AT(c.p[4], (size_t)NK * hd), ac.kv_stride = KVS;
                    ar.v = r.p[3], ar.kc = r.p[4], ar.vc = DF_AT(r.p[4], (size_t)NK * hd), ar.kv_stride = KVS;
                }
                df_qk_norm_rope_on(CAND, &ac), df_qk_norm_rope_on(REF, &ar);
                char what[80];
                snprintf(what, sizeof what, "qk_norm_rope q n=%d il=%d rope %d/%d", n, il, rd, hd), side_cmp(what, &c, &r, 0, sz[0], TOL_RED);
                snprintf(what, sizeof what, "qk_norm_rope k n=%d il=%d rope %d/%d", n, il, rd, hd), side_cmp(what, &c, &r, 1, sz[1], TOL_RED);
                snprintf(what, sizeof what, "qk_norm_rope cache n=%d il=%d rope %d/%d", n, il, rd, hd), side_cmp(what, &c, &r, 4, sz[4], TOL_RED);
                side_free(&c, 5), side_free(&r, 5);
                free(inv), free(q), free(k), free(cs), free(gq), free(gk), free(v), free(kv);
            }
}

/* ---- memory ops: exact --------------------------------------------------------------- */
static void test_memory(void) {
    const int n = 7, C = 33;
    float *src = rnd((size_t)n * C * 2, 1), *dst = rnd((size_t)n * C * 2, 1);
    const int idx[7] = {3, 0, 6, 6, 1, 5, 2}, sidx[7] = {4, 0, 6, 2, 1, 5, 3};
    float *h[2] = {src, dst};
    size_t sz[2] = {(size_t)n * C * 2, (size_t)n * C * 2};
    side c, r;
    side_up(&c, CAND, h, sz, 2), side_up(&r, REF, h, sz, 2);
    float *back = down(CAND, c.p[0], sz[0]);
    compare("write/read round trip", back, src, sz[0], TOL_EXACT);
    free(back);
    CAND->copy_rows(DF_AT(c.p[1], 1), 2 * C, c.p[0], C + 5, n, C - 6), REF->copy_rows(DF_AT(r.p[1], 1), 2 * C, r.p[0], C + 5, n, C - 6);
    side_cmp("copy_rows strided", &c, &r, 1, sz[1], TOL_EXACT);
    CAND->gather_rows(c.p[1], c.p[0], idx, n, C), REF->gather_rows(r.p[1], r.p[0], idx, n, C);
    side_cmp("gather_rows", &c, &r, 1, sz[1], TOL_EXACT);
    CAND->scatter_rows(c.p[1], sidx, c.p[0], n, C), REF->scatter_rows(r.p[1], sidx, r.p[0], n, C);
    side_cmp("scatter_rows", &c, &r, 1, sz[1], TOL_EXACT);
    CAND->copy(DF_AT(c.p[1], 3), c.p[0], 50), REF->copy(DF_AT(r.p[1], 3), r.p[0], 50);
    side_cmp("copy", &c, &r, 1, sz[1], TOL_EXACT);
    CAND->zero(DF_AT(c.p[1], 5), 17), REF->zero(DF_AT(r.p[1], 5), 17);
    side_cmp("zero", &c, &r, 1, sz[1], TOL_EXACT);
    /* the reference's gather by hand: row j is row idx[j] of src */
    REF->gather_rows(r.p[1], r.p[0], idx, n, C);
    float *g = down(REF, r.p[1], sz[1]);
    for (int j = 0; j < n; j++) compare("gather_rows (reference vs expected)", g + (size_t)j * C, src + (size_t)idx[j] * C, (size_t)C, TOL_EXACT);
    side_free(&c, 2), side_free(&r, 2);
    free(g), free(src), free(dst);
}

/* ---- routers and the MoE combine --------------------------------------------------------- */
static void test_route(void) {
    for (int kind = 0; kind < DF_ROUTE_N; kind++)
        for (int ni = 0; ni < 4; ni++)
            for (int wnull = 0; wnull < 2; wnull++) {
                const int n = NS[ni], E = kind ? 40 : 61, K = kind ? 5 : 6;
                float *lg = rnd((size_t)n * E, 3), *bias = rnd(E, 0.5f), *w = calloc((size_t)n * K, 4);
                float *h[2] = {lg, w};
                size_t sz[2] = {(size_t)n * E, (size_t)n * K};
                side c, r;
                side_up(&c, CAND, h, sz, 2), side_up(&r, REF, h, sz, 2);
                int *ic = calloc((size_t)n * K, sizeof(int)), *ir = calloc((size_t)n * K, sizeof(int));
                df_route_args ac = {(df_route_kind)kind, c.p[0], ic, wnull ? NULL : c.p[1], n, E, K, 1, 8, 3, 2.5f, bias}, ar = ac;
                ar.logits = r.p[0], ar.ids = ir, ar.w = wnull ? NULL : r.p[1];
                CAND->route(&ac);
                REF->route(&ar);
                char what[64];
                snprintf(what, sizeof what, "route kind %d n=%d%s", kind, n, wnull ? " (ids only)" : "");
                checks++;
                if (memcmp(ic, ir, (size_t)n * K * sizeof(int))) failures++, fprintf(stderr, "FAIL %s: expert ids differ\n", what);
                if (!wnull) side_cmp(what, &c, &r, 1, sz[1], TOL_ELEM);
                /* the ids are K distinct experts (kind 1: from the 3 kept groups of 5 only) */
                for (int t = 0; t < n; t++)
                    for (int a = 0; a < K; a++)
                        for (int b = a + 1; b < K; b++)
                            if (ir[t * K + a] == ir[t * K + b] || ir[t * K + a] < 0 || ir[t * K + a] >= E) failures++, fprintf(stderr, "FAIL %s: ids not distinct\n", what);
                side_free(&c, 2), side_free(&r, 2);
                free(lg), free(bias), free(w), free(ic), free(ir);
            }
    for (int ni = 0; ni < 4; ni++) {
        const int n = NS[ni], K = 3, C = 37;
        float *x = rnd((size_t)n * K * C, 2), *w = rnd((size_t)n * K, 1), *o = rnd((size_t)n * C, 1);
        float *h[3] = {x, w, o};
        size_t sz[3] = {(size_t)n * K * C, (size_t)n * K, (size_t)n * C};
        side c, r;
        side_up(&c, CAND, h, sz, 3), side_up(&r, REF, h, sz, 3);
        CAND->moe_combine(c.p[2], c.p[0], c.p[1], n, K, C), REF->moe_combine(r.p[2], r.p[0], r.p[1], n, K, C);
        char what[64];
        snprintf(what, sizeof what, "moe_combine n=%d k=%d", n, K);
        side_cmp(what, &c, &r, 2, sz[2], TOL_RED);
        side_free(&c, 3), side_free(&r, 3);
        free(x), free(w), free(o);
    }
}

/* ---- recurrent mixers ---------------------------------------------------------------- */
static double silu_d(double v) { return v / (1 + exp(-v)); }

static void test_conv1d(void) {
    for (int silu = 0; silu < 2; silu++)
        for (int W = 2; W <= 4; W += 2) {
            const int C = 37, M = W - 1;
            float *w = rnd((size_t)C * W, 1), *bias = silu ? rnd(C, 0.5f) : NULL;
            /* the whole sequence for the double reference, fed in chunks of 2, 7, 1, 33 tokens */
            static const int chunks[] = {2, 7, 1, 33};
            int total = 0;
            for (int i = 0; i < 4; i++) total += chunks[i];
            float *xs = rnd((size_t)total * C, 1), *st0 = calloc((size_t)C * M, 4), *y0 = calloc((size_t)total * C, 4);
            double *yd = calloc((size_t)total * C, sizeof(double));
            for (int t = 0; t < total; t++)
                for (int ch = 0; ch < C; ch++) {
                    double a = bias ? bias[ch] : 0;
                    for (int j = 0; j < W; j++) {
                        int s = t - M + j;
                        if (s >= 0) a += (double)w[ch * W + j] * xs[(size_t)s * C + ch];
                    }
                    yd[(size_t)t * C + ch] = silu ? silu_d(a) : a;
                }
            float *h[3] = {xs, st0, y0};
            size_t sz[3] = {(size_t)total * C, (size_t)C * M, (size_t)total * C};
            side c, r;
            side_up(&c, CAND, h, sz, 3), side_up(&r, REF, h, sz, 3);
            for (int i = 0, t0 = 0; i < 4; t0 += chunks[i++]) {
                df_conv1d_args ac = {DF_AT(c.p[2], (size_t)t0 * C), DF_AT(c.p[0], (size_t)t0 * C), c.p[1], w, bias, chunks[i], C, W, silu};
                df_conv1d_args ar = {DF_AT(r.p[2], (size_t)t0 * C), DF_AT(r.p[0], (size_t)t0 * C), r.p[1], w, bias, chunks[i], C, W, silu};
                CAND->causal_conv1d(&ac);
                REF->causal_conv1d(&ar);
                char what[80];
                snprintf(what, sizeof what, "causal_conv1d W=%d silu=%d chunk %d (n=%d) state", W, silu, i, chunks[i]);
                side_cmp(what, &c, &r, 1, sz[1], TOL_EXACT);
            }
            char what[80];
            snprintf(what, sizeof what, "causal_conv1d W=%d silu=%d", W, silu);
            side_cmp(what, &c, &r, 2, sz[2], TOL_RED);
            float *yr = down(REF, r.p[2], sz[2]);
            snprintf(what, sizeof what, "causal_conv1d W=%d silu=%d (reference vs double)", W, silu);
            compare_d(what, yr, yd, sz[2], TOL_RED);
            /* the state after the run: the last M inputs of each channel */
            float *sr = down(REF, r.p[1], sz[1]);
            double *sd = calloc(sz[1], sizeof(double));
            for (int ch = 0; ch < C; ch++)
                for (int j = 0; j < M; j++) sd[(size_t)ch * M + j] = xs[(size_t)(total - M + j) * C + ch];
            snprintf(what, sizeof what, "causal_conv1d W=%d state (reference vs expected)", W);
            compare_d(what, sr, sd, sz[1], TOL_EXACT);
            side_free(&c, 3), side_free(&r, 3);
            free(yr), free(sr), free(sd), free(w), free(bias), free(xs), free(st0), free(y0), free(yd);
        }
}

static void test_kda(void) {
    const int nh = 3, dk = 20, dv = 12;
    static const int chunks[] = {1, 7, 2, 33};
    int total = 0;
    for (int i = 0; i < 4; i++) total += chunks[i];
    const size_t nq = (size_t)total * nh * dk, nv = (size_t)total * nh * dv, ns = (size_t)nh * dk * dv;
    float *q = rnd(nq, 1), *k = rnd(nq, 1), *v = rnd(nv, 1), *g = rnd(nq, 1), *beta = rnd((size_t)total * nh, 1);
    for (size_t i = 0; i < nq; i++) g[i] = -0.05f - 0.5f * fabsf(g[i]); /* log decay in (-0.55, -0.05] */
    for (size_t i = 0; i < (size_t)total * nh; i++) beta[i] = 0.5f + 0.45f * beta[i];
    for (size_t r0 = 0; r0 < nq; r0 += dk) { /* unit keys, as the KDA kind's L2 norm makes them */
        double s = 0;
        for (int i = 0; i < dk; i++) s += (double)k[r0 + i] * k[r0 + i];
        for (int i = 0; i < dk; i++) k[r0 + i] = (float)(k[r0 + i] / sqrt(s));
    }
    float *S0 = rnd(ns, 0.1f), *o0 = calloc(nv, 4);
    const float scale = 0.25f;
    /* double reference over the whole sequence */
    double *S = malloc(ns * sizeof(double)), *od = calloc(nv, sizeof(double)), *u = malloc((size_t)dv * sizeof(double));
    for (size_t i = 0; i < ns; i++) S[i] = S0[i];
    for (int t = 0; t < total; t++)
        for (int h = 0; h < nh; h++) {
            double *Sh = S + (size_t)h * dk * dv;
            const size_t qo = ((size_t)t * nh + h) * dk, vo = ((size_t)t * nh + h) * dv;
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) Sh[i * dv + j] *= exp((double)g[qo + i]);
            for (int j = 0; j < dv; j++) {
                double a = 0;
                for (int i = 0; i < dk; i++) a += Sh[i * dv + j] * k[qo + i];
                u[j] = v[vo + j] - a;
            }
            const double b = beta[(size_t)t * nh + h];
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) Sh[i * dv + j] += b * k[qo + i] * u[j];
            for (int j = 0; j < dv; j++) {
                double a = 0;
                for (int i = 0; i < dk; i++) a += Sh[i * dv + j] * (double)(q[qo + i] * scale);
                od[vo + j] = a;
            }
        }
    float *h[7] = {q, k, v, g, beta, S0, o0};
    size_t sz[7] = {nq, nq, nv, nq, (size_t)total * nh, ns, nv};
    side c, r;
    side_up(&c, CAND, h, sz, 7), side_up(&r, REF, h, sz, 7);
    for (int i = 0, t0 = 0; i < 4; t0 += chunks[i++]) {
        const size_t a = (size_t)t0 * nh * dk, b = (size_t)t0 * nh * dv, e = (size_t)t0 * nh;
        df_kda_args ac = {DF_AT(c.p[6], b), DF_AT(c.p[0], a), DF_AT(c.p[1], a), DF_AT(c.p[2], b), DF_AT(c.p[3], a), DF_AT(c.p[4], e), c.p[5], chunks[i], nh, dk, dv, scale};
        df_kda_args ar = {DF_AT(r.p[6], b), DF_AT(r.p[0], a), DF_AT(r.p[1], a), DF_AT(r.p[2], b), DF_AT(r.p[3], a), DF_AT(r.p[4], e), r.p[5], chunks[i], nh, dk, dv, scale};
        CAND->kda_scan(&ac);
        REF->kda_scan(&ar);
        char what[64];
        snprintf(what, sizeof what, "kda_scan chunk %d (n=%d) state", i, chunks[i]);
        side_cmp(what, &c, &r, 5, ns, TOL_RED);
    }
    side_cmp("kda_scan outputs", &c, &r, 6, nv, TOL_RED);
    float *orf = down(REF, r.p[6], nv), *srf = down(REF, r.p[5], ns);
    compare_d("kda_scan outputs (reference vs double)", orf, od, nv, TOL_RED);
    compare_d("kda_scan state (reference vs double)", srf, S, ns, TOL_RED);
    side_free(&c, 7), side_free(&r, 7);
    free(orf), free(srf), free(q), free(k), free(v), free(g), free(beta), free(S0), free(o0), free(S), free(od), free(u);
}

/* ---- l2norm, KDA gate, attention residuals: against double loops ---------------------- */
static void test_kimi_ops(void) {
    char what[96];
    /* l2norm: rows x cols, with a scale */
    static const int RC[][2] = {{1, 1}, {7, 16}, {33, 128}, {5, 37}};
    for (int i = 0; i < 4; i++) {
        const int rows = RC[i][0], cols = RC[i][1];
        const size_t n = (size_t)rows * cols;
        float *x = rnd(n, 2);
        float *h[1] = {x};
        size_t sz[1] = {n};
        side c, r;
        side_up(&c, CAND, h, sz, 1), side_up(&r, REF, h, sz, 1);
        CAND->l2norm(c.p[0], rows, cols, 1e-6f, 0.125f), REF->l2norm(r.p[0], rows, cols, 1e-6f, 0.125f);
        snprintf(what, sizeof what, "l2norm %d x %d", rows, cols), side_cmp(what, &c, &r, 0, n, TOL_RED);
        double *d = malloc(n * sizeof(double));
        for (int rr = 0; rr < rows; rr++) {
            double ss = 0;
            for (int j = 0; j < cols; j++) ss += (double)x[(size_t)rr * cols + j] * x[(size_t)rr * cols + j];
            for (int j = 0; j < cols; j++) d[(size_t)rr * cols + j] = 0.125 * x[(size_t)rr * cols + j] / sqrt(ss + 1e-6);
        }
        float *o = down(REF, r.p[0], n);
        snprintf(what, sizeof what, "l2norm %d x %d (reference vs double)", rows, cols), compare_d(what, o, d, n, TOL_RED);
        side_free(&c, 1), side_free(&r, 1);
        free(o), free(d), free(x);
    }
    /* KDA forget gate, both forms (lower bound; softplus incl. its threshold) */
    for (int lb = 0; lb < 2; lb++) {
        const int n = 7, nh = 3, dd = 20;
        const size_t N = (size_t)n * nh * dd;
        float *f = rnd(N, 12), *A = rnd(nh, 1), *dt = rnd((size_t)nh * dd, 1), *g0 = calloc(N, 4);
        float *h[2] = {f, g0};
        size_t sz[2] = {N, N};
        side c, r;
        side_up(&c, CAND, h, sz, 2), side_up(&r, REF, h, sz, 2);
        df_kda_gate_args ac = {c.p[1], c.p[0], A, dt, n, nh, dd, lb, -5.0f}, ar = {r.p[1], r.p[0], A, dt, n, nh, dd, lb, -5.0f};
        CAND->kda_gate(&ac), REF->kda_gate(&ar);
        snprintf(what, sizeof what, "kda_gate lower_bound=%d", lb), side_cmp(what, &c, &r, 1, N, TOL_ELEM);
        double *d = malloc(N * sizeof(double));
        for (int t = 0; t < n; t++)
            for (int hh = 0; hh < nh; hh++)
                for (int j = 0; j < dd; j++) {
                    const size_t o = ((size_t)t * nh + hh) * dd + j;
                    const double x = (double)f[o] + dt[(size_t)hh * dd + j], a = exp((double)A[hh]);
                    d[o] = lb ? -5.0 / (1 + exp(-a * x)) : -a * (x > 20 ? x : log1p(exp(x)));
                }
        float *o = down(REF, r.p[1], N);
        snprintf(what, sizeof what, "kda_gate lower_bound=%d (reference vs double)", lb), compare_d(what, o, d, N, TOL_ELEM);
        /* in place (g aliases f) */
        df_kda_gate_args ai = {r.p[0], r.p[0], A, dt, n, nh, dd, lb, -5.0f};
        REF->kda_gate(&ai);
        float *oi = down(REF, r.p[0], N);
        snprintf(what, sizeof what, "kda_gate lower_bound=%d in place", lb), compare(what, oi, o, N, TOL_EXACT);
        side_free(&c, 2), side_free(&r, 2);
        free(o), free(oi), free(d), free(f), free(A), free(dt), free(g0);
    }
    /* attention residuals: nb completed blocks (0, 1, 4) and the partial sum */
    static const int NB[] = {0, 1, 4};
    for (int bi = 0; bi < 3; bi++) {
        const int nb = NB[bi], n = 5, hd = 67;
        const size_t stride = (size_t)8 * hd; /* blocks sized for a batch of 8 */
        float *blocks = rnd((size_t)(nb ? nb : 1) * stride, 3), *p = rnd((size_t)n * hd, 3), *o0 = calloc((size_t)n * hd, 4);
        float *nw = rnd(hd, 1), *pw = rnd(hd, 1);
        float *h[3] = {blocks, p, o0};
        size_t sz[3] = {(size_t)(nb ? nb : 1) * stride, (size_t)n * hd, (size_t)n * hd};
        side c, r;
        side_up(&c, CAND, h, sz, 3), side_up(&r, REF, h, sz, 3);
        df_attn_res_args ac = {c.p[2], c.p[0], stride, nb, c.p[1], nw, pw, n, hd, 1e-5f}, ar = {r.p[2], r.p[0], stride, nb, r.p[1], nw, pw, n, hd, 1e-5f};
        CAND->attn_res(&ac), REF->attn_res(&ar);
        snprintf(what, sizeof what, "attn_res nb=%d", nb), side_cmp(what, &c, &r, 2, (size_t)n * hd, TOL_RED);
        double *d = calloc((size_t)n * hd, sizeof(double)), sc[8];
        for (int t = 0; t < n; t++) {
            double mx = -1e300, sum = 0;
            for (int i = 0; i <= nb; i++) {
                const float *v = i < nb ? blocks + (size_t)i * stride + (size_t)t * hd : p + (size_t)t * hd;
                double ss = 0, s = 0;
                for (int j = 0; j < hd; j++) ss += (double)v[j] * v[j];
                for (int j = 0; j < hd; j++) s += v[j] / sqrt(ss / hd + 1e-5) * ((double)nw[j] * pw[j]);
                sc[i] = s, mx = s > mx ? s : mx;
            }
            for (int i = 0; i <= nb; i++) sum += sc[i] = exp(sc[i] - mx);
            for (int i = 0; i <= nb; i++) {
                const float *v = i < nb ? blocks + (size_t)i * stride + (size_t)t * hd : p + (size_t)t * hd;
                for (int j = 0; j < hd; j++) d[(size_t)t * hd + j] += sc[i] / sum * v[j];
            }
        }
        float *o = down(REF, r.p[2], (size_t)n * hd);
        snprintf(what, sizeof what, "attn_res nb=%d (reference vs double)", nb), compare_d(what, o, d, (size_t)n * hd, TOL_RED);
        side_free(&c, 3), side_free(&r, 3);
        free(o), free(d), free(blocks), free(p), free(o0), free(nw), free(pw);
    }
}

int main(int argc, char **argv) {
    const char *cand = "cpu", *ref = "cpu-scalar";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) cand = argv[++i];
        else if (!strcmp(argv[i], "--ref") && i + 1 < argc) ref = argv[++i];
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else { fprintf(stderr, "usage: %s [--backend NAME] [--ref NAME] [-v]\n", argv[0]); return 2; }
    }
    CAND = df_backend_find(cand), REF = df_backend_find(ref);
    if (!CAND || !REF) { fprintf(stderr, "unknown backend '%s'\n", CAND ? ref : cand); return 2; }
    df_pool_init(0);
    printf("candidate %s (%s, %d threads), reference %s\n", CAND->name, df_isa_name(df_isa()), df_pool_size(), REF->name);
    test_memory();
    test_matmul();
    test_matmul_prefill();
    test_attn_gqa();
    test_attn_mla();
    test_attn_mla_dsv3();
    test_rows();
    test_rows_split();
    test_fused();
    test_route();
    test_conv1d();
    test_kda();
    test_kimi_ops();
    printf("test_backend_ops: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
