/* test_backend_kernels.c - every ISA's kernels against the scalar reference
 * on random data (odd lengths included), and the exact conversions against
 * independent definitions. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }
static float frand(void) { return (float)((int)(rnd() % 20001) - 10000) / 10000.0f; }

static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }

static void close_enough(const char *what, int isa, int64_t n, float got, float ref, float mag) {
    CHECK(fabsf(got - ref) <= 1e-5f * mag + 1e-6f, "%s isa=%s n=%lld got %.9g ref %.9g", what, df_isa_name(isa), (long long)n, got, ref);
}

int main(void) {
    df_kernels_init();
    /* FP8 E4M3FN table: the values of the format's definition */
    CHECK(df_fp8_lut[0x00] == 0.0f, "fp8 0");
    CHECK(df_fp8_lut[0x38] == 1.0f, "fp8 1.0 = %g", df_fp8_lut[0x38]);
    CHECK(df_fp8_lut[0x7e] == 448.0f, "fp8 max = %g", df_fp8_lut[0x7e]);
    CHECK(df_fp8_lut[0x01] == ldexpf(1, -9), "fp8 min subnormal");
    CHECK(df_fp8_lut[0xb8] == -1.0f, "fp8 -1");
    CHECK(isnan(df_fp8_lut[0x7f]), "fp8 nan");
    CHECK(df_f16_to_f32(0x3c00) == 1.0f && df_f16_to_f32(0x0001) == ldexpf(1, -24) && df_f16_to_f32(0xc000) == -2.0f, "f16");

    const int64_t sizes[] = {1, 7, 16, 31, 32, 33, 64, 100, 257, 1024, 7168 + 5};
    for (int isa = DF_ISA_AVX2; isa <= DF_ISA_AVX512; isa++) {
        df_set_isa(isa);
        if (df_isa() != isa) { printf("skip %s (not supported here)\n", df_isa_name(isa)); continue; }
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            int64_t n = sizes[si];
            float *x = malloc((size_t)n * 4), *wf = malloc((size_t)n * 4);
            uint16_t *wb = malloc((size_t)n * 2), *wh = malloc((size_t)n * 2);
            uint8_t *w8 = malloc((size_t)n), *w4 = malloc((size_t)(n + 1) / 2 + 64);
            float mag = 0;
            for (int64_t i = 0; i < n; i++) {
                x[i] = frand();
                wf[i] = frand();
                wb[i] = f2bf(frand());
                wh[i] = (uint16_t)(rnd() & 0x7bff); /* finite halves */
                w8[i] = (uint8_t)(rnd() & 0xff);
                if ((w8[i] & 0x7f) == 0x7f) w8[i] = 0x11; /* no NaN */
                mag += fabsf(x[i]) * 448;
            }
            for (int64_t i = 0; i < (n + 1) / 2 + 64; i++) w4[i] = (uint8_t)rnd();
            float (*f32[3])(const float *, const float *, int64_t) = {df_k_dot_f32_scalar, df_k_dot_f32_avx2, df_k_dot_f32_avx512};
            float (*bf[3])(const uint16_t *, const float *, int64_t) = {df_k_dot_bf16_scalar, df_k_dot_bf16_avx2, df_k_dot_bf16_avx512};
            float (*hf[3])(const uint16_t *, const float *, int64_t) = {df_k_dot_f16_scalar, df_k_dot_f16_avx2, df_k_dot_f16_avx512};
            float (*f8[3])(const uint8_t *, const float *, int64_t) = {df_k_dot_fp8_scalar, df_k_dot_fp8_avx2, df_k_dot_fp8_avx512};
            close_enough("f32", isa, n, f32[isa](wf, x, n), f32[0](wf, x, n), mag);
            close_enough("bf16", isa, n, bf[isa](wb, x, n), bf[0](wb, x, n), mag);
            close_enough("f16", isa, n, hf[isa](wh, x, n), hf[0](wh, x, n), mag * 200);
            close_enough("fp8", isa, n, f8[isa](w8, x, n), f8[0](w8, x, n), mag);
            float (*i8[3])(const int8_t *, const float *, int64_t) = {df_k_dot_i8_scalar, df_k_dot_i8_avx2, df_k_dot_i8_avx512};
            close_enough("i8", isa, n, i8[isa]((const int8_t *)w8, x, n), i8[0]((const int8_t *)w8, x, n), mag);
            if (n % 32 == 0) {
                float sc[1024];
                for (int g = 0; g < 1024; g++) sc[g] = frand();
                float (*i4[3])(const uint8_t *, const float *, int, const float *, int64_t) = {df_k_dot_int4_scalar, df_k_dot_int4_avx2, df_k_dot_int4_avx512};
                close_enough("int4", isa, n, i4[isa](w4, sc, 32, x, n), i4[0](w4, sc, 32, x, n), mag);
            }
            free(x); free(wf); free(wb); free(wh); free(w8); free(w4);
        }
        /* four-row kernels and axpy vs scalar (odd sizes, odd row strides) */
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            int64_t n = sizes[si], ld = n + 3;
            float *x = malloc((size_t)n * 4), *wf = malloc((size_t)(4 * ld) * 4), *y0 = malloc((size_t)n * 4), *y1 = malloc((size_t)n * 4);
            uint16_t *wb = malloc((size_t)(4 * ld) * 2), *wh = malloc((size_t)(4 * ld) * 2);
            uint8_t *w8 = malloc((size_t)(4 * ld));
            float mag = 0;
            for (int64_t i = 0; i < n; i++) x[i] = frand(), y0[i] = y1[i] = frand(), mag += fabsf(x[i]) * 448;
            for (int64_t i = 0; i < 4 * ld; i++) {
                wf[i] = frand();
                wb[i] = f2bf(frand());
                wh[i] = (uint16_t)(rnd() & 0x7bff);
                w8[i] = (uint8_t)(rnd() & 0xff);
                if ((w8[i] & 0x7f) == 0x7f) w8[i] = 0x11;
            }
            float got[5] = {0, 0, 0, 0, NAN}, ref[4];
            void (*d4f[3])(const float *, int64_t, const float *, int64_t, float *) = {df_k_dot4_f32_scalar, df_k_dot4_f32_avx2, df_k_dot4_f32_avx512};
            void (*d4b[3])(const uint16_t *, int64_t, const float *, int64_t, float *) = {df_k_dot4_bf16_scalar, df_k_dot4_bf16_avx2, df_k_dot4_bf16_avx512};
            void (*d4h[3])(const uint16_t *, int64_t, const float *, int64_t, float *) = {df_k_dot4_f16_scalar, df_k_dot4_f16_avx2, df_k_dot4_f16_avx512};
            d4f[isa](wf, ld, x, n, got), d4f[0](wf, ld, x, n, ref);
            for (int k = 0; k < 4; k++) close_enough("dot4 f32", isa, n, got[k], ref[k], mag);
            d4b[isa](wb, ld, x, n, got), d4b[0](wb, ld, x, n, ref);
            for (int k = 0; k < 4; k++) close_enough("dot4 bf16", isa, n, got[k], ref[k], mag);
            d4h[isa](wh, ld, x, n, got), d4h[0](wh, ld, x, n, ref);
            for (int k = 0; k < 4; k++) close_enough("dot4 f16", isa, n, got[k], ref[k], mag * 200);
            CHECK(isnan(got[4]), "dot4 wrote past out[3]");
            if (n % 32 == 0) {
                float scs[4][64];
                const float *sc[4] = {scs[0], scs[1], scs[2], scs[3]};
                for (int k = 0; k < 4; k++)
                    for (int b = 0; b < 64; b++) scs[k][b] = frand();
                void (*d48[3])(const uint8_t *, int64_t, const float *, int64_t, int, const float *const *, float *) = {df_k_dot4_fp8s_scalar, df_k_dot4_fp8s_avx2, df_k_dot4_fp8s_avx512};
                for (int blk = 32; blk <= 128; blk *= 2) {
                    d48[isa](w8, ld, x, n, blk, sc, got), d48[0](w8, ld, x, n, blk, sc, ref);
                    for (int k = 0; k < 4; k++) close_enough("dot4 fp8s", isa, n, got[k], ref[k], mag);
                }
            }
            void (*ax[3])(float *, float, const float *, int64_t) = {df_k_axpy_scalar, df_k_axpy_avx2, df_k_axpy_avx512};
            ax[isa](y0, 0.37f, x, n), ax[0](y1, 0.37f, x, n);
            for (int64_t i = 0; i < n; i++) close_enough("axpy", isa, n, y0[i], y1[i], 2);
            free(x); free(wf); free(y0); free(y1); free(wb); free(wh); free(w8);
        }
        /* tile kernel vs scalar, 4x4 and ragged */
        for (int trial = 0; trial < 3; trial++) {
            int64_t n = 1000 + trial * 24;
            float W[4 * 1024], X[4 * 1024], Y[16], R[16];
            for (int i = 0; i < 4 * 1024; i++) { W[i] = frand(); X[i] = frand(); }
            void (*tile[3])(const float *, int64_t, int, const float *, int64_t, int, int64_t, float *, int64_t) = {df_k_tile_f32_scalar, df_k_tile_f32_avx2, df_k_tile_f32_avx512};
            int nr = trial == 2 ? 3 : 4, nt = trial == 2 ? 2 : 4;
            tile[isa](W, 1024, nr, X, 1024, nt, n, Y, 4);
            tile[0](W, 1024, nr, X, 1024, nt, n, R, 4);
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < nr; r++) close_enough("tile", isa, n, Y[t * 4 + r], R[t * 4 + r], (float)n);
        }
    }
    /* FP8 block-scaled row dot through df_dot_row equals dequant + f32 dot */
    {
        df_set_isa(-1);
        enum { R = 5, C = 70 };
        uint8_t w[R * C];
        float sc[2 * 3], x[C], row[C];
        for (int i = 0; i < R * C; i++) { w[i] = (uint8_t)(rnd() & 0x7e); }
        for (int i = 0; i < 6; i++) sc[i] = frand();
        for (int i = 0; i < C; i++) x[i] = frand();
        df_weight W = {.fmt = DF_W_FP8, .rows = R, .cols = C, .data = w, .row_bytes = C, .scale = sc, .scale_dtype = DF_SCALE_F32, .blk_r = 3, .blk_c = 32, .scale_cols = 3};
        for (int r = 0; r < R; r++) {
            df_dequant_row(&W, r, row);
            double ref = 0;
            for (int i = 0; i < C; i++) ref += (double)row[i] * x[i];
            float got = df_dot_row(&W, r, x);
            CHECK(fabs(got - ref) < 1e-3, "fp8 block row %d got %g ref %g", r, got, ref);
            CHECK(row[40] == df_fp8_lut[w[r * C + 40]] * sc[(r / 3) * 3 + 1], "fp8 block scale index row %d", r);
        }
    }
    printf("%s: %d failures\n", __FILE__, fails);
    return fails != 0;
}
