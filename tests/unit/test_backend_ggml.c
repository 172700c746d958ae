/* test_backend_ggml.c - GGML block-type kernels: every ISA against the
 * scalar reference on random blocks.
 *
 *   dequant: bit-identical to scalar (which tests/py/test_gguf_quant.py
 *            checks bit-exactly against gguf-py);
 *   dot, dot_multi: within 1e-5 * sum|w_i x_i| of a double-precision
 *            dot(dequant, x);
 * plus hand-computed blocks and the traits table vs the GGUF reader's.
 *
 * `test_backend_ggml --bench [MiB [cols]]` instead measures df_ggml_dot GB/s
 * per type and ISA on one thread over a MiB-sized matrix (default 256, rows
 * of 4096), and the prepared-x decode path (df_ggml_px_dot) where AVX2 has it.
 */
#include "backend/ggml_quant.h"
#include "format/gguf.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c, ...)                                                   \
    do {                                                                \
        if (!(c)) {                                                     \
            failures++;                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
            fprintf(stderr, __VA_ARGS__);                               \
            fprintf(stderr, "\n");                                      \
        }                                                               \
    } while (0)

static const int TYPES[] = {DF_GGML_F32,  DF_GGML_F16,  DF_GGML_BF16, DF_GGML_Q4_0, DF_GGML_Q4_1,
                            DF_GGML_Q5_0, DF_GGML_Q5_1, DF_GGML_Q8_0, DF_GGML_Q2_K, DF_GGML_Q3_K,
                            DF_GGML_Q4_K, DF_GGML_Q5_K, DF_GGML_Q6_K, DF_GGML_MXFP4};
#define N_TYPES (int)(sizeof TYPES / sizeof TYPES[0])

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((double)(next() >> 11) / 9007199254740992.0 * 2 - 1); }

/* A random finite f16: normal in [2^-6, 2^2) or, one time in 8, any finite
 * value including subnormals (wide=1). Sign random. */
static uint16_t rand_f16(int wide) {
    uint16_t h = (uint16_t)next();
    if (wide && (next() & 7) == 0) {
        if (((h >> 10) & 31) == 31) h &= (uint16_t)~(1u << 14);
        return h;
    }
    unsigned e = 9 + (unsigned)(next() % 8); /* 2^-6 .. 2^1 */
    return (uint16_t)((h & 0x83ff) | (e << 10));
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* Fills n weights of type with random bytes and sane scales. For F32 the
 * values are finite; for MXFP4 the exponent keeps products finite. */
static void fill_random(int type, uint8_t *buf, int64_t n, int wide) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    int64_t nb = n / t->block_elems, bb = t->block_bytes;
    for (int64_t i = 0; i < nb * bb; i++) buf[i] = (uint8_t)next();
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *b = buf + i * bb;
        switch (type) {
        case DF_GGML_F32: {
            float f = frand() * 4;
            memcpy(b, &f, 4);
            break;
        }
        case DF_GGML_F16: put16(b, rand_f16(wide)); break;
        case DF_GGML_BF16: {
            float f = frand() * 4;
            uint32_t u;
            memcpy(&u, &f, 4);
            put16(b, (uint16_t)(u >> 16));
            break;
        }
        case DF_GGML_Q4_0: case DF_GGML_Q5_0: case DF_GGML_Q8_0: put16(b, rand_f16(wide)); break;
        case DF_GGML_Q4_1: case DF_GGML_Q5_1:
            put16(b, rand_f16(wide));
            put16(b + 2, rand_f16(wide));
            break;
        case DF_GGML_Q2_K: put16(b + 80, rand_f16(wide)); put16(b + 82, rand_f16(wide)); break;
        case DF_GGML_Q3_K: put16(b + 108, rand_f16(wide)); break;
        case DF_GGML_Q4_K: case DF_GGML_Q5_K: put16(b, rand_f16(wide)); put16(b + 2, rand_f16(wide)); break;
        case DF_GGML_Q6_K: put16(b + 208, rand_f16(wide)); break;
        case DF_GGML_MXFP4: b[0] = (uint8_t)(wide ? next() % 256 : 110 + next() % 30); break;
        }
    }
}

static int isa_list[3], n_isa;

/* n values to test for a type: multiples of the block size, including
 * ones that are not multiples of 64 where the type allows. */
static int sizes_for(int type, int64_t *out) {
    int be = df_ggml_traits_of(type)->block_elems;
    if (be == 1) {
        static const int64_t s[] = {1, 7, 15, 16, 17, 33, 63, 64, 65, 130, 1000, 4099};
        memcpy(out, s, sizeof s);
        return 12;
    }
    if (be == 32) {
        static const int64_t s[] = {32, 64, 96, 160, 224, 1056, 4096};
        memcpy(out, s, sizeof s);
        return 7;
    }
    static const int64_t s[] = {256, 512, 768, 2816, 4096};
    memcpy(out, s, sizeof s);
    return 5;
}

static void test_type(int type) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    int64_t sizes[16];
    int ns = sizes_for(type, sizes);
    for (int si = 0; si < ns; si++) {
        int64_t n = sizes[si];
        for (int rep = 0; rep < 3; rep++) {
            int64_t bytes = df_ggml_row_bytes(type, n);
            uint8_t *row = malloc((size_t)bytes + 1);
            /* odd address: blocks in files are unaligned */
            uint8_t *r = row + 1;
            int wide = rep == 2;
            fill_random(type, r, n, wide);
            enum { M = 11 };
            float *x = malloc(sizeof(float) * (size_t)(n + 3) * M);
            for (int64_t i = 0; i < (n + 3) * M; i++) x[i] = frand();
            float *ref = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
            df_ggml_set_isa(DF_GGML_ISA_SCALAR);
            df_ggml_dequant_row(type, r, ref, n);
            double dref[M], mag[M];
            for (int j = 0; j < M; j++) {
                dref[j] = mag[j] = 0;
                for (int64_t i = 0; i < n; i++) {
                    dref[j] += (double)ref[i] * x[j * (n + 3) + i];
                    mag[j] += fabs((double)ref[i] * x[j * (n + 3) + i]);
                }
            }
            for (int ii = 0; ii < n_isa; ii++) {
                int isa = isa_list[ii];
                df_ggml_set_isa(isa);
                memset(got, 0xff, sizeof(float) * (size_t)n);
                df_ggml_dequant_row(type, r, got, n);
                int64_t bad = -1;
                for (int64_t i = 0; i < n && bad < 0; i++)
                    if (memcmp(&got[i], &ref[i], 4)) bad = i;
                CHECK(bad < 0, "%s %s n=%lld rep %d: dequant[%lld] %.9g != scalar %.9g", t->name,
                      df_ggml_isa_name(isa), (long long)n, rep, (long long)bad,
                      bad >= 0 ? got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0);
                if (wide && (type == DF_GGML_MXFP4 || type == DF_GGML_F16)) continue; /* may overflow */
                float d = df_ggml_dot(type, r, x, n);
                double tol = 1e-5 * mag[0] + 1e-30;
                CHECK(fabs(d - dref[0]) <= tol, "%s %s n=%lld: dot %.9g vs %.9g (tol %.3g)", t->name,
                      df_ggml_isa_name(isa), (long long)n, d, dref[0], tol);
                float out[2 * M];
                for (int m = 1; m <= M; m += (m < 3 ? 1 : 4)) {
                    for (int j = 0; j < 2 * M; j++) out[j] = NAN;
                    df_ggml_dot_multi(type, r, x, n, m, n + 3, out, 2);
                    for (int j = 0; j < m; j++) {
                        double tj = 1e-5 * mag[j] + 1e-30;
                        CHECK(fabs(out[2 * j] - dref[j]) <= tj,
                              "%s %s n=%lld m=%d j=%d: dot_multi %.9g vs %.9g", t->name,
                              df_ggml_isa_name(isa), (long long)n, m, j, out[2 * j], dref[j]);
                        CHECK(isnan(out[2 * j + 1]), "dot_multi wrote outside its stride");
                    }
                }
            }
            df_ggml_set_isa(DF_GGML_ISA_AUTO);
            free(row);
            free(x);
            free(ref);
            free(got);
        }
    }
}

/* df_ggml_dot4: four rows (odd stride, unaligned) against one x, every ISA,
 * each row within 1e-5 * sum|w x| of the double dot of its scalar dequant. */
static void test_dot4(int type) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    int64_t sizes[16];
    int ns = sizes_for(type, sizes);
    for (int si = 0; si < ns; si++) {
        int64_t n = sizes[si], rb = df_ggml_row_bytes(type, n), stride = rb + 3;
        uint8_t *buf = malloc((size_t)(4 * stride + 1)), *r = buf + 1;
        for (int k = 0; k < 4; k++) fill_random(type, r + k * stride, n, 0);
        float *x = malloc(sizeof(float) * (size_t)n), *deq = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) x[i] = frand();
        double dref[4], mag[4];
        df_ggml_set_isa(DF_GGML_ISA_SCALAR);
        for (int k = 0; k < 4; k++) {
            df_ggml_dequant_row(type, r + k * stride, deq, n);
            dref[k] = mag[k] = 0;
            for (int64_t i = 0; i < n; i++) dref[k] += (double)deq[i] * x[i], mag[k] += fabs((double)deq[i] * x[i]);
        }
        for (int ii = 0; ii < n_isa; ii++) {
            df_ggml_set_isa(isa_list[ii]);
            float out[5] = {NAN, NAN, NAN, NAN, NAN};
            df_ggml_dot4(type, r, (size_t)stride, x, n, out);
            for (int k = 0; k < 4; k++)
                CHECK(fabs(out[k] - dref[k]) <= 1e-5 * mag[k] + 1e-30, "%s %s n=%lld row %d: dot4 %.9g vs %.9g", t->name,
                      df_ggml_isa_name(isa_list[ii]), (long long)n, k, out[k], dref[k]);
            CHECK(isnan(out[4]), "dot4 wrote past out[3]");
        }
        df_ggml_set_isa(DF_GGML_ISA_AUTO);
        free(buf);
        free(x);
        free(deq);
    }
}

/* Types with prepared-x kernels on AVX2 (df_ggml_px_dot must not fall back). */
static int has_px_avx2(int type) {
    switch (type) {
    case DF_GGML_Q4_0: case DF_GGML_Q4_1: case DF_GGML_Q5_0: case DF_GGML_Q5_1: case DF_GGML_Q8_0:
    case DF_GGML_Q4_K: case DF_GGML_Q5_K: case DF_GGML_Q6_K: return 1;
    default: return 0;
    }
}

/* Runs rows [0, nr) of a px product in pieces of `piece` rows. */
static void px_rows(const df_ggml_px *p, const uint8_t *r, size_t stride, int nr, int piece, float *out) {
    for (int i = 0; i < nr; i += piece) df_ggml_px_dot(p, r + (size_t)i * stride, stride, nr - i < piece ? nr - i : piece, out + i);
}

/* df_ggml_px: nr rows (odd stride, unaligned) against one prepared x, every
 * ISA: each row within 1e-5 * sum|w x| of the double dot of its scalar
 * dequant; the same bits whichever pieces the rows are run in (four-row
 * groups, remainders, single rows: what a different thread count does);
 * and on AVX2 the prepared path is the one taken. */
static void test_px(int type) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    int64_t sizes[16];
    int ns = sizes_for(type, sizes);
    static const int NRS[] = {1, 3, 4, 5, 7, 9};
    for (int si = 0; si < ns; si++) {
        int64_t n = sizes[si], rb = df_ggml_row_bytes(type, n), stride = rb + 5;
        for (int ni = 0; ni < 6; ni++) {
            int nr = NRS[ni];
            uint8_t *buf = malloc((size_t)(nr * stride + 1)), *r = buf + 1;
            for (int k = 0; k < nr; k++) fill_random(type, r + k * stride, n, ni == 5);
            float *x = malloc(sizeof(float) * (size_t)n), *deq = malloc(sizeof(float) * (size_t)n);
            float *aux = malloc(sizeof(float) * df_ggml_px_floats(type, n));
            for (int64_t i = 0; i < n; i++) x[i] = frand();
            double dref[9], mag[9];
            df_ggml_set_isa(DF_GGML_ISA_SCALAR);
            for (int k = 0; k < nr; k++) {
                df_ggml_dequant_row(type, r + k * stride, deq, n);
                dref[k] = mag[k] = 0;
                for (int64_t i = 0; i < n; i++) dref[k] += (double)deq[i] * x[i], mag[k] += fabs((double)deq[i] * x[i]);
            }
            for (int ii = 0; ii < n_isa; ii++) {
                int isa = isa_list[ii];
                df_ggml_set_isa(isa);
                df_ggml_px px;
                df_ggml_px_init(&px, type, x, n, aux);
                if (isa == DF_GGML_ISA_AVX2 && has_px_avx2(type))
                    CHECK(px.aux == aux && px.isa == DF_GGML_ISA_AVX2, "%s avx2: prepared path not taken", t->name);
                float out[10], alt[10];
                for (int k = 0; k < 10; k++) out[k] = alt[k] = NAN;
                px_rows(&px, r, (size_t)stride, nr, nr, out);
                if (ni == 5 && (type == DF_GGML_MXFP4 || type == DF_GGML_F16)) continue; /* wide: may overflow */
                for (int k = 0; k < nr; k++)
                    CHECK(fabs(out[k] - dref[k]) <= 1e-5 * mag[k] + 1e-30, "%s %s n=%lld nr=%d row %d: px %.9g vs %.9g",
                          t->name, df_ggml_isa_name(isa), (long long)n, nr, k, out[k], dref[k]);
                CHECK(isnan(out[nr]), "px wrote past out[nr-1]");
                for (int piece = 1; piece <= 3; piece++) {
                    px_rows(&px, r, (size_t)stride, nr, piece, alt);
                    CHECK(memcmp(alt, out, sizeof(float) * (size_t)nr) == 0, "%s %s n=%lld nr=%d: pieces of %d differ",
                          t->name, df_ggml_isa_name(isa), (long long)n, nr, piece);
                }
            }
            df_ggml_set_isa(DF_GGML_ISA_AUTO);
            free(buf);
            free(x);
            free(deq);
            free(aux);
        }
    }
}

/* df_ggml_px_dot_multi (a verify pass's products): np = 1..16 prepared activations against nr rows give, token by
 * token, the bits of df_ggml_px_dot on that token alone, every ISA; nr = 150 is not a multiple of the 64-row chunks
 * the fused AVX2 kernels take when the tokens form more than one group (Q4_1: 7+, Q8_0: 9+). */
static void test_px_multi(int type) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    enum { NR = 150, NP = 16 };
    const int64_t n = 768, stride = df_ggml_row_bytes(type, n) + 3;
    uint8_t *buf = malloc((size_t)(NR * stride + 1)), *r = buf + 1;
    for (int k = 0; k < NR; k++) fill_random(type, r + k * stride, n, 0);
    float *x = malloc(sizeof(float) * (size_t)(n * NP)), *aux = malloc(sizeof(float) * df_ggml_px_floats(type, n) * NP);
    float *one = malloc(sizeof(float) * NR * NP), *multi = malloc(sizeof(float) * (NR + 1) * NP);
    for (int64_t i = 0; i < n * NP; i++) x[i] = frand();
    for (int ii = 0; ii < n_isa; ii++) {
        df_ggml_set_isa(isa_list[ii]);
        df_ggml_px px[NP];
        for (int q = 0; q < NP; q++) {
            df_ggml_px_init(&px[q], type, x + q * n, n, aux + (size_t)q * df_ggml_px_floats(type, n));
            df_ggml_px_dot(&px[q], r, (size_t)stride, NR, one + (size_t)q * NR);
        }
        for (int np = 1; np <= NP; np++) {
            for (int i = 0; i < (NR + 1) * NP; i++) multi[i] = NAN;
            df_ggml_px_dot_multi(px, np, r, (size_t)stride, NR, multi, NR + 1);
            for (int q = 0; q < np; q++) {
                CHECK(!memcmp(multi + (size_t)q * (NR + 1), one + (size_t)q * NR, sizeof(float) * NR),
                      "%s %s np=%d token %d: px_dot_multi differs from px_dot", t->name, df_ggml_isa_name(isa_list[ii]), np, q);
                CHECK(isnan(multi[(size_t)q * (NR + 1) + NR]), "%s np=%d token %d: px_dot_multi wrote past its rows", t->name, np, q);
            }
        }
    }
    df_ggml_set_isa(DF_GGML_ISA_AUTO);
    free(buf), free(x), free(aux), free(one), free(multi);
}

/* The f16 scale fields of a block (d first; m/dmin second where present). */
static int scale_offsets(int type, int off[2]) {
    switch (type) {
    case DF_GGML_Q4_0: case DF_GGML_Q5_0: case DF_GGML_Q8_0: off[0] = 0; return 1;
    case DF_GGML_Q4_1: case DF_GGML_Q5_1: case DF_GGML_Q4_K: case DF_GGML_Q5_K: off[0] = 0, off[1] = 2; return 2;
    case DF_GGML_Q2_K: off[0] = 80, off[1] = 82; return 2;
    case DF_GGML_Q3_K: off[0] = 108; return 1;
    case DF_GGML_Q6_K: off[0] = 208; return 1;
    default: return 0;
    }
}

/* Extreme block scales through every ISA's px product: d = 0 (and m = 0:
 * an exact 0), the largest and a subnormal f16 (within tolerance), and
 * Inf/NaN in d or m (non-finite iff the reference is). */
static void test_px_extreme(int type) {
    int off[2], nsc = scale_offsets(type, off);
    if (!nsc) return;
    const df_ggml_traits *t = df_ggml_traits_of(type);
    const int64_t n = 2 * t->block_elems;
    const int64_t rb = df_ggml_row_bytes(type, n);
    static const uint16_t VALS[] = {0x0000, 0x8000, 0x7bff, 0x0001, 0x7c00, 0xfc00, 0x7e00};
    float x[512], deq[512], aux[512];
    for (int64_t i = 0; i < n; i++) x[i] = frand();
    for (int vi = 0; vi < 7; vi++) {
        for (int which = 0; which < nsc; which++) {
            uint8_t row[4 * 210];
            fill_random(type, row, n, 0);
            /* block 1 gets the extreme value; for d = 0 also m = 0 */
            uint8_t *b = row + t->block_bytes;
            put16(b + off[which], VALS[vi]);
            if (vi < 2)
                for (int k = 0; k < nsc; k++) put16(b + off[k], VALS[vi]);
            df_ggml_set_isa(DF_GGML_ISA_SCALAR);
            df_ggml_dequant_row(type, row, deq, n);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) ref += (double)deq[i] * x[i], mag += fabs((double)deq[i] * x[i]);
            for (int ii = 0; ii < n_isa; ii++) {
                df_ggml_set_isa(isa_list[ii]);
                df_ggml_px px;
                df_ggml_px_init(&px, type, x, n, aux);
                float out[5];
                /* the same row four times and once more: the four-row body and the single-row one */
                uint8_t rows5[5 * 2 * 210];
                for (int k = 0; k < 5; k++) memcpy(rows5 + k * rb, row, (size_t)rb);
                df_ggml_px_dot(&px, rows5, (size_t)rb, 5, out);
                for (int k = 0; k < 5; k++) {
                    if (!isfinite(ref))
                        CHECK(!isfinite(out[k]), "%s %s scale %d=0x%04x: %g, reference %g", t->name,
                              df_ggml_isa_name(isa_list[ii]), which, VALS[vi], out[k], ref);
                    else
                        CHECK(fabs(out[k] - ref) <= 1e-5 * mag + 1e-30, "%s %s scale %d=0x%04x: %.9g vs %.9g", t->name,
                              df_ggml_isa_name(isa_list[ii]), which, VALS[vi], out[k], ref);
                }
            }
        }
    }
    df_ggml_set_isa(DF_GGML_ISA_AUTO);
}

/* Hand-computed blocks. */
static void test_known(void) {
    for (int ii = 0; ii < n_isa; ii++) {
        df_ggml_set_isa(isa_list[ii]);
        /* Q8_0: d = 0.5 (f16 0x3800), q = -16..15 */
        uint8_t b[34];
        put16(b, 0x3800);
        for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)(i - 16);
        float y[32];
        df_ggml_dequant_row(DF_GGML_Q8_0, b, y, 32);
        for (int i = 0; i < 32; i++) CHECK(y[i] == 0.5f * (float)(i - 16), "q8_0 known [%d] %g", i, y[i]);
        /* Q4_0: d = 2 (0x4000), low nibble i, high nibble 15-i */
        uint8_t q[18];
        put16(q, 0x4000);
        for (int i = 0; i < 16; i++) q[2 + i] = (uint8_t)(i | ((15 - i) << 4));
        df_ggml_dequant_row(DF_GGML_Q4_0, q, y, 32);
        for (int i = 0; i < 16; i++) {
            CHECK(y[i] == 2.0f * (float)(i - 8), "q4_0 known lo[%d] %g", i, y[i]);
            CHECK(y[16 + i] == 2.0f * (float)(7 - i), "q4_0 known hi[%d] %g", i, y[16 + i]);
        }
        /* MXFP4: e = 128 -> scale 1, nibbles 0..15 */
        uint8_t m[17];
        static const float kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        m[0] = 128;
        for (int i = 0; i < 16; i++) m[1 + i] = (uint8_t)(i | ((15 - i) << 4));
        df_ggml_dequant_row(DF_GGML_MXFP4, m, y, 32);
        for (int i = 0; i < 16; i++) {
            CHECK(y[i] == kv[i] && !signbit(y[i]) == !signbit(kv[i]), "mxfp4 known lo[%d] %g", i, y[i]);
            CHECK(y[16 + i] == kv[15 - i] && !signbit(y[16 + i]) == !signbit(kv[15 - i]),
                  "mxfp4 known hi[%d] %g", i, y[16 + i]);
        }
        /* F16 subnormal and BF16 */
        uint8_t h[4];
        put16(h, 0x0001);
        put16(h + 2, 0x8400);
        df_ggml_dequant_row(DF_GGML_F16, h, y, 2);
        CHECK(y[0] == ldexpf(1, -24) && y[1] == -ldexpf(1, -14), "f16 known %g %g", y[0], y[1]);
        put16(h, 0x3f80);
        put16(h + 2, 0xc040);
        df_ggml_dequant_row(DF_GGML_BF16, h, y, 2);
        CHECK(y[0] == 1.0f && y[1] == -3.0f, "bf16 known %g %g", y[0], y[1]);
    }
    df_ggml_set_isa(DF_GGML_ISA_AUTO);
}

static void test_traits(void) {
    int n_supported = 0;
    for (int type = -1; type < DF_GGML_N_TYPES + 2; type++) {
        const df_ggml_traits *t = df_ggml_traits_of(type);
        if (!t) continue;
        n_supported++;
        int be, bb;
        CHECK(df_gguf_type_size(type, &be, &bb) == 0 && be == t->block_elems && bb == t->block_bytes,
              "traits of %s disagree with the GGUF reader's table", t->name);
        CHECK(strcmp(t->name, df_gguf_type_name(type)) == 0, "name %s", t->name);
    }
    CHECK(n_supported == N_TYPES, "supported types %d, expected %d", n_supported, N_TYPES);
    CHECK(df_ggml_traits_of(DF_GGML_IQ2_XXS) == NULL && df_ggml_traits_of(DF_GGML_Q8_K) == NULL,
          "IQ2_XXS / Q8_K must be unsupported");
}

/* ---- benchmark ---------------------------------------------------------- */

static void bench(int64_t mib, int64_t n) {
    int64_t total = mib << 20;
    uint8_t *buf = df_aligned_alloc((size_t)total);
    float *x = malloc(sizeof(float) * (size_t)n), sink = 0;
    for (int64_t i = 0; i < n; i++) x[i] = frand();
    printf("df_ggml_dot, one thread, %lld MiB of weights, rows of %lld\n", (long long)mib, (long long)n);
    printf("%-6s", "type");
    for (int ii = 0; ii < n_isa; ii++) printf(" %10s", df_ggml_isa_name(isa_list[ii]));
    printf("   (GB/s of weight bytes; Gelem/s in brackets for the best)\n");
    for (int ti = 0; ti < N_TYPES; ti++) {
        int type = TYPES[ti];
        if (n % df_ggml_traits_of(type)->block_elems) continue; /* cols not a whole number of blocks */
        int64_t rb = df_ggml_row_bytes(type, n), rows = total / rb;
        fill_random(type, buf, rows * n, 0);
        printf("%-6s", df_ggml_traits_of(type)->name);
        double best_ge = 0;
        for (int ii = 0; ii < n_isa; ii++) {
            df_ggml_set_isa(isa_list[ii]);
            double best = 1e30;
            int reps = isa_list[ii] == DF_GGML_ISA_SCALAR ? 1 : 3;
            for (int rep = 0; rep < reps; rep++) {
                double t0 = df_now();
                for (int64_t r = 0; r < rows; r++) sink += df_ggml_dot(type, buf + r * rb, x, n);
                double dt = df_now() - t0;
                if (dt < best) best = dt;
            }
            printf(" %10.2f", (double)(rows * rb) / best / 1e9);
            double ge = (double)(rows * n) / best / 1e9;
            if (ge > best_ge) best_ge = ge;
            fflush(stdout);
        }
        if (has_px_avx2(type) && df_ggml_isa_supported(DF_GGML_ISA_AVX2)) {
            /* the decode path: x prepared once, all rows in one df_ggml_px_dot */
            df_ggml_set_isa(DF_GGML_ISA_AVX2);
            float *aux = malloc(sizeof(float) * df_ggml_px_floats(type, n)), *out = malloc(sizeof(float) * (size_t)rows);
            double best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = df_now();
                df_ggml_px px;
                df_ggml_px_init(&px, type, x, n, aux);
                df_ggml_px_dot(&px, buf, (size_t)rb, rows, out);
                double dt = df_now() - t0;
                sink += out[rows - 1];
                if (dt < best) best = dt;
            }
            printf("   px avx2 %.2f GB/s", (double)(rows * rb) / best / 1e9);
            free(aux);
            free(out);
        }
        printf("   [%.1f]\n", best_ge);
    }
    /* memory floor: plain read of the same bytes */
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = df_now();
        uint64_t acc = 0;
        const uint64_t *p = (const uint64_t *)buf;
        for (int64_t i = 0; i < total / 8; i += 8)
            acc += p[i] ^ p[i + 1] ^ p[i + 2] ^ p[i + 3] ^ p[i + 4] ^ p[i + 5] ^ p[i + 6] ^ p[i + 7];
        double dt = df_now() - t0;
        sink += (float)(acc & 1);
        if (dt < best) best = dt;
    }
    printf("plain read of the same buffer: %.2f GB/s (sink %g)\n", (double)total / best / 1e9, sink);
    df_ggml_set_isa(DF_GGML_ISA_AUTO);
    free(buf);
    free(x);
}

/* df_ggml_pack16 (the prefill GEMM's panel, issue 17 round 2): where a
 * kernel exists, P[k*16 + i] is bit for bit the scalar df_ggml_dequant_row
 * of row i (a padded row stride, scales wide enough to reach subnormals,
 * signed zeros and both signs); the types the Q4_1 and Q4_K_M files use
 * must have one on an AVX2 CPU. */
static void test_pack16(int type) {
    int64_t ns[16]; /* sizes_for writes up to 12 */
    const int nn = sizes_for(type, ns);
    const df_ggml_traits *t = df_ggml_traits_of(type);
    for (int ni = 0; ni < nn; ni++) {
        const int64_t n = ns[ni];
        if (n > 1056) continue;
        const size_t rb = (size_t)df_ggml_row_bytes(type, n), stride = rb + 3;
        uint8_t *r = malloc(16 * stride);
        float *P = malloc((size_t)(16 * n) * 4), *ref = malloc((size_t)n * 4);
        for (int rep = 0; rep < 3; rep++) {
            for (int i = 0; i < 16; i++) fill_random(type, r + i * stride, n, rep > 0);
            if (rep == 2) /* zero scales in some rows: d*q and m of both signs of zero */
                for (int i = 0; i < 16; i += 3)
                    for (int64_t b = 0; b < n / t->block_elems; b++) {
                        uint8_t *blk = r + i * stride + b * t->block_bytes;
                        int o = type == DF_GGML_Q6_K ? 208 : 0;
                        put16(blk + o, (uint16_t)(i & 4 ? 0x8000 : 0));
                    }
            df_ggml_set_isa(isa_list[n_isa - 1]);
            const int rc = df_ggml_pack16(type, r, stride, n, P);
            df_ggml_set_isa(DF_GGML_ISA_AUTO);
            const int want = df_ggml_isa_supported(DF_GGML_ISA_AVX2) &&
                             (type == DF_GGML_Q4_0 || type == DF_GGML_Q4_1 || type == DF_GGML_Q5_0 || type == DF_GGML_Q5_1 ||
                              type == DF_GGML_Q8_0 || type == DF_GGML_Q4_K || type == DF_GGML_Q6_K);
            CHECK((rc == 0) == want, "pack16 %s: rc %d, expected a kernel: %d", t->name, rc, want);
            if (rc) break;
            df_ggml_set_isa(DF_GGML_ISA_SCALAR);
            for (int i = 0; i < 16; i++) {
                df_ggml_dequant_row(type, r + i * stride, ref, n);
                for (int64_t k = 0; k < n; k++)
                    if (memcmp(&P[k * 16 + i], &ref[k], 4)) {
                        CHECK(0, "pack16 %s n=%lld rep %d row %d k=%lld: %a, dequant_row %a", t->name, (long long)n, rep, i, (long long)k,
                              P[k * 16 + i], ref[k]);
                        i = 16;
                        break;
                    }
            }
            df_ggml_set_isa(DF_GGML_ISA_AUTO);
        }
        free(r), free(P), free(ref);
    }
}

int main(int argc, char **argv) {
    for (int isa = DF_GGML_ISA_SCALAR; isa <= DF_GGML_ISA_AVX512; isa++)
        if (df_ggml_isa_supported(isa)) isa_list[n_isa++] = isa;
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench(argc > 2 ? atoll(argv[2]) : 256, argc > 3 ? atoll(argv[3]) : 4096);
        return 0;
    }
    printf("ISAs:");
    for (int i = 0; i < n_isa; i++) printf(" %s", df_ggml_isa_name(isa_list[i]));
    printf("\n");
    test_traits();
    test_known();
    for (int ti = 0; ti < N_TYPES; ti++) test_type(TYPES[ti]);
    for (int ti = 0; ti < N_TYPES; ti++) test_dot4(TYPES[ti]);
    for (int ti = 0; ti < N_TYPES; ti++) test_px(TYPES[ti]);
    for (int ti = 0; ti < N_TYPES; ti++) test_px_extreme(TYPES[ti]);
    for (int ti = 0; ti < N_TYPES; ti++) test_px_multi(TYPES[ti]);
    for (int ti = 0; ti < N_TYPES; ti++) test_pack16(TYPES[ti]);
    if (failures) {
        printf("test_backend_ggml: %d failures\n", failures);
        return 1;
    }
    printf("test_backend_ggml: ok (%d types x %d ISAs)\n", N_TYPES, n_isa);
    return 0;
}
