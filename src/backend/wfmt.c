/* wfmt.c - the weight-format traits table: per df_wfmt its name, block
 * geometry and scale sidecar. Byte counts of a df_weight (row bytes, scale
 * bytes, total) are computed from it instead of per-format constants. */
#include "backend/backend.h"
#include "backend/ggml_quant.h"

_Static_assert(DF_MXFP4_GROUP_BYTES * 8 == DF_MXFP4_GROUP * 4, "MXFP4: 32 E2M1 codes of 4 bits in 16 bytes");
_Static_assert(DF_MXFP4_GROUP % 2 == 0, "MXFP4: a group never splits a byte");
_Static_assert(DF_INT4_WORD_BYTES * 8 == DF_INT4_WORD_ELEMS * 4, "INT4: 8 nibbles per 32-bit word");

static const df_wfmt_traits traits[] = {
    [DF_W_F32] = {"F32", "F32", 1, 4, DF_SCALES_NONE, 0},
    [DF_W_F16] = {"F16", "F16", 1, 2, DF_SCALES_NONE, 0},
    [DF_W_BF16] = {"BF16", "BF16", 1, 2, DF_SCALES_NONE, 0},
    [DF_W_FP8] = {"FP8_E4M3", "FP8_E4M3 (block scales)", 1, 1, DF_SCALES_BLOCKS_2D, 0},
    [DF_W_INT4] = {"INT4", "INT4 pack-quantized", DF_INT4_WORD_ELEMS, DF_INT4_WORD_BYTES, DF_SCALES_ROW_GROUPS, 0},
    [DF_W_GGML] = {"GGML?", "GGML", 0, 0, DF_SCALES_NONE, 0},
    [DF_W_I8ROW] = {"I8ROW", "I8ROW (not exact)", 1, 1, DF_SCALES_PER_ROW, 4},
    [DF_W_MXFP4] = {"MXFP4", "MXFP4 (E2M1, E8M0 scale per 32)", DF_MXFP4_GROUP, DF_MXFP4_GROUP_BYTES, DF_SCALES_ROW_GROUPS, 1},
};
_Static_assert(sizeof traits / sizeof traits[0] == DF_W_NFMT, "one traits entry per df_wfmt");

const df_wfmt_traits *df_wfmt_traits_of(df_wfmt f) {
    return (int)f >= 0 && (int)f < DF_W_NFMT && traits[f].name ? &traits[f] : NULL;
}

int64_t df_wfmt_row_bytes(df_wfmt f, int64_t cols) {
    const df_wfmt_traits *t = df_wfmt_traits_of(f);
    if (!t || !t->block_elems) return -1;
    return (cols + t->block_elems - 1) / t->block_elems * t->block_bytes;
}

int df_scale_dtype_bytes(df_scale_dtype t) {
    switch (t) {
    case DF_SCALE_F32: return 4;
    case DF_SCALE_BF16:
    case DF_SCALE_F16: return 2;
    case DF_SCALE_E8M0: return 1;
    }
    return 4;
}

const char *df_wfmt_name(const df_weight *w) {
    if (w->fmt == DF_W_GGML) {
        const df_ggml_traits *g = df_ggml_traits_of(w->ggml_type);
        return g ? g->name : "GGML?";
    }
    const df_wfmt_traits *t = df_wfmt_traits_of(w->fmt);
    return t ? t->name : "?";
}

int64_t df_weight_scale_bytes(const df_weight *w) {
    const df_wfmt_traits *t = df_wfmt_traits_of(w->fmt);
    if (!t) return 0;
    const int64_t eb = t->scale_bytes ? t->scale_bytes : df_scale_dtype_bytes(w->scale_dtype);
    switch (t->scales) {
    case DF_SCALES_NONE: return 0;
    case DF_SCALES_PER_ROW: return w->rows * eb;
    case DF_SCALES_ROW_GROUPS: return w->rows * w->scale_cols * eb;
    case DF_SCALES_BLOCKS_2D: return w->blk_r > 0 ? (w->rows + w->blk_r - 1) / w->blk_r * w->scale_cols * eb : 0;
    }
    return 0;
}

int64_t df_weight_bytes(const df_weight *w) { return (int64_t)w->row_bytes * w->rows + df_weight_scale_bytes(w); }

/* A byte b is a NaN code iff (b & 0x7f) + 1 carries into bit 7: eight bytes
 * per 64-bit word (no carry crosses a byte: at most 0x80). */
static int fp8_rows_have_nan(const uint8_t *p, size_t rb, int64_t rows, int64_t cols) {
    const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full, one = 0x0101010101010101ull, hi = 0x8080808080808080ull;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *q = p + (size_t)r * rb;
        uint64_t acc = 0;
        int64_t i = 0;
        for (; i + 32 <= cols; i += 32) {
            uint64_t u[4];
            memcpy(u, q + i, 32);
            acc |= ((u[0] & lo7) + one) | ((u[1] & lo7) + one) | ((u[2] & lo7) + one) | ((u[3] & lo7) + one);
        }
        if (acc & hi) return 1;
        for (; i < cols; i++)
            if ((q[i] & 0x7f) == 0x7f) return 1;
    }
    return 0;
}
int df_weight_nan_codes(const df_weight *w) {
    if (w->fmt != DF_W_FP8 || !w->data) return DF_NAN_CODES_MAYBE;
    int s = __atomic_load_n(&w->nan_codes, __ATOMIC_ACQUIRE);
    if (s == DF_NAN_CODES_UNCHECKED) {
        s = fp8_rows_have_nan(w->data, w->row_bytes, w->rows, w->cols) ? DF_NAN_CODES_MAYBE : DF_NAN_CODES_NONE;
        __atomic_store_n(&((df_weight *)(uintptr_t)w)->nan_codes, s, __ATOMIC_RELEASE);
    }
    return s;
}
int df_weight_nan_codes_memo(df_weight *w, int *memo) {
    if (!memo || w->fmt != DF_W_FP8) return w->nan_codes = DF_NAN_CODES_MAYBE;
    if (*memo == DF_NAN_CODES_UNCHECKED) { /* the first use of these bytes: no scan yet */
        *memo = DF_NAN_CODES_USED_ONCE;
        return w->nan_codes = DF_NAN_CODES_MAYBE;
    }
    if (*memo == DF_NAN_CODES_USED_ONCE) { /* used again: scan once, keep the answer */
        w->nan_codes = DF_NAN_CODES_UNCHECKED;
        *memo = df_weight_nan_codes(w);
    }
    return w->nan_codes = *memo;
}
