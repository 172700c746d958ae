/* test_weights.h - random weights of every stored format with finite
 * values and scales, for the backend's unit tests (test_backend_exact,
 * test_backend_kernels): one generator instead of a copy per test. Its own
 * xorshift state, so a test's other random numbers do not depend on how
 * many weights it made. Free g.data and g.scale when done. */
#ifndef DF_TEST_WEIGHTS_H
#define DF_TEST_WEIGHTS_H

#include "backend/backend.h"
#include "backend/ggml_quant.h"
#include "format/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t tw_state = 0x9e3779b97f4a7c15ull;
static uint32_t tw_rnd(void) { tw_state ^= tw_state << 13; tw_state ^= tw_state >> 7; tw_state ^= tw_state << 17; return (uint32_t)tw_state; }
static float tw_frand(void) { return (float)((int)(tw_rnd() % 20001) - 10000) / 10000.0f; }
static uint16_t tw_f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }
static uint16_t tw_f16_small(void) { return (uint16_t)(0x2000 + tw_rnd() % 0x800); } /* finite, ~2^-7 .. 2^-5 */
static void tw_put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

typedef struct { df_weight w; uint8_t *data, *scale; } gw;

/* Random weights of a format with finite values and scales. */
static __attribute__((unused)) void gw_make(gw *g, int fmt, int gtype, int64_t R, int64_t C) {
    memset(g, 0, sizeof *g);
    df_weight *w = &g->w;
    w->fmt = fmt, w->rows = R, w->cols = C;
    size_t rb = 0, sb = 0;
    switch (fmt) {
    case DF_W_F32: rb = (size_t)C * 4; break;
    case DF_W_F16: case DF_W_BF16: rb = (size_t)C * 2; break;
    case DF_W_FP8: rb = (size_t)C, w->blk_r = 3, w->blk_c = 32, w->scale_cols = (C + 31) / 32, sb = (size_t)((R + 2) / 3 * w->scale_cols) * 4; break;
    case DF_W_INT4: rb = (size_t)(C + 1) / 2, w->blk_r = 1, w->blk_c = 32, w->scale_cols = (C + 31) / 32, sb = (size_t)(R * w->scale_cols) * 4; break;
    case DF_W_I8ROW: rb = (size_t)C, w->blk_r = 1, w->blk_c = (int)C, w->scale_cols = 1, sb = (size_t)R * 4; break;
    case DF_W_MXFP4: rb = (size_t)C / 2, w->blk_r = 1, w->blk_c = 32, w->scale_cols = C / 32, sb = (size_t)(R * C / 32), w->scale_dtype = DF_SCALE_E8M0; break;
    case DF_W_GGML: w->ggml_type = gtype, rb = (size_t)df_ggml_row_bytes(gtype, C); break;
    }
    w->row_bytes = rb;
    uint8_t *d = malloc(rb * (size_t)R + 1);
    for (size_t i = 0; i < rb * (size_t)R; i++) d[i] = (uint8_t)tw_rnd();
    for (int64_t r = 0; r < R; r++) {
        uint8_t *row = d + (size_t)r * rb;
        const int fe = fmt == DF_W_GGML ? (gtype == DF_GGML_F32 ? 4 : gtype == DF_GGML_F16 ? 2 : gtype == DF_GGML_BF16 ? 3 : 0) : 0;
        for (int64_t c = 0; c < C; c++) {
            if (fmt == DF_W_F32 || fe == 4) { float f = tw_frand(); memcpy(row + 4 * c, &f, 4); }
            if (fmt == DF_W_BF16 || fe == 3) tw_put16(row + 2 * c, tw_f2bf(tw_frand()));
            if (fmt == DF_W_F16 || fe == 2) tw_put16(row + 2 * c, (uint16_t)(tw_rnd() & 0xbbff)); /* |v| < 1 */
            if (fmt == DF_W_FP8 && (row[c] & 0x7f) == 0x7f) row[c] = 0x31;                 /* no NaN */
        }
        if (fmt == DF_W_GGML && !fe) {
            const size_t bb = (size_t)df_ggml_traits_of(gtype)->block_bytes;
            for (size_t b = 0; b < rb; b += bb) {
                uint8_t *k = row + b;
                switch (gtype) {
                case DF_GGML_Q4_0: case DF_GGML_Q5_0: case DF_GGML_Q8_0: tw_put16(k, tw_f16_small()); break;
                case DF_GGML_Q4_1: case DF_GGML_Q5_1: case DF_GGML_Q4_K: case DF_GGML_Q5_K:
                    tw_put16(k, tw_f16_small()), tw_put16(k + 2, (uint16_t)(0x8000 | tw_f16_small())); break;
                case DF_GGML_Q2_K: tw_put16(k + 80, tw_f16_small()), tw_put16(k + 82, tw_f16_small()); break;
                case DF_GGML_Q3_K: tw_put16(k + 108, tw_f16_small()); break;
                case DF_GGML_Q6_K: tw_put16(k + 208, tw_f16_small()); break;
                case DF_GGML_MXFP4: k[0] = (uint8_t)(118 + tw_rnd() % 12); break;
                }
            }
        }
    }
    w->data = d, g->data = d;
    if (sb) {
        uint8_t *sc = malloc(sb);
        if (fmt == DF_W_MXFP4) for (size_t i = 0; i < sb; i++) sc[i] = (uint8_t)(120 + tw_rnd() % 10);
        else for (size_t i = 0; i < sb / 4; i++) { float f = tw_frand(); memcpy(sc + 4 * i, &f, 4); }
        w->scale = sc, g->scale = sc;
    }
}

#endif
