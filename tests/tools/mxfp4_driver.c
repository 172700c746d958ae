/* mxfp4_driver.c - exposes the backend's MXFP4 weights to the Python tests
 * (tests/py/test_mxfp4.py builds it with cc). Not part of the deltafin binary.
 *
 *   mxfp4_driver ISA ROWS COLS PACKED SCALE DEQ [X N Y]
 *
 * PACKED: uint8 [ROWS][COLS/2], SCALE: uint8 [ROWS][COLS/32] (the bytes of a
 * checkpoint's weight_packed / weight_scale). Writes every row through
 * df_dequant_row to DEQ (f32), and with X (f32 [N][COLS]) the product
 * df_matmul (N = 1: the decode dot products; N > 1: the prefill path) to Y
 * (f32 [N][ROWS]). ISA is scalar|avx2|avx512; an unsupported one exits 77.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *slurp(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    void *p = malloc(want ? want : 1);
    if (!f || !p || fread(p, 1, want, f) != want || fgetc(f) != EOF) {
        fprintf(stderr, "%s: expected exactly %zu bytes\n", path, want);
        exit(1);
    }
    fclose(f);
    return p;
}

static void spill(const char *path, const float *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof(float), n, f) != n || fclose(f)) {
        fprintf(stderr, "%s: cannot write\n", path);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 10) {
        fprintf(stderr, "usage: mxfp4_driver ISA ROWS COLS PACKED SCALE DEQ [X N Y]\n");
        return 2;
    }
    int isa = !strcmp(argv[1], "scalar") ? DF_ISA_SCALAR : !strcmp(argv[1], "avx2") ? DF_ISA_AVX2 : DF_ISA_AVX512;
    df_set_isa(isa);
    if (df_isa() != isa) return 77;
    df_backend_init(2);
    const int64_t R = atoll(argv[2]), C = atoll(argv[3]);
    if (R < 1 || C < 32 || C % 32) {
        fprintf(stderr, "ROWS >= 1 and COLS a multiple of 32\n");
        return 2;
    }
    df_weight w = {.fmt = DF_W_MXFP4, .rows = R, .cols = C, .row_bytes = (size_t)df_wfmt_row_bytes(DF_W_MXFP4, C),
                   .scale_dtype = DF_SCALE_E8M0, .blk_r = 1, .blk_c = DF_MXFP4_GROUP, .scale_cols = C / DF_MXFP4_GROUP};
    w.data = slurp(argv[4], (size_t)(R * C / 2));
    w.scale = slurp(argv[5], (size_t)(R * C / DF_MXFP4_GROUP));
    float *deq = malloc((size_t)(R * C) * sizeof(float));
    for (int64_t r = 0; r < R; r++) df_dequant_row(&w, r, deq + r * C);
    spill(argv[6], deq, (size_t)(R * C));
    if (argc == 10) {
        const int n = atoi(argv[8]);
        float *x = slurp(argv[7], (size_t)n * (size_t)C * sizeof(float)), *y = malloc((size_t)n * (size_t)R * sizeof(float));
        /* through the backend contract: the input and output live in backend memory */
        df_act *xa = df_alloc((size_t)n * (size_t)C), *ya = df_alloc((size_t)n * (size_t)R);
        df_write(xa, x, (size_t)n * (size_t)C);
        df_matmul(&w, xa, n, ya);
        df_read(y, ya, (size_t)n * (size_t)R);
        df_free(xa), df_free(ya);
        spill(argv[9], y, (size_t)n * (size_t)R);
        free(x), free(y);
    }
    free(deq), free((void *)w.data), free((void *)w.scale);
    return 0;
}
