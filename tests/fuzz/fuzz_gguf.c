/* fuzz_gguf.c - libFuzzer target for the GGUF reader: parse the input as a
 * GGUF file from memory, then walk every metadata value (nested arrays
 * included, through the typed getters) and every tensor's bytes, and
 * dequantize the first row of each tensor whose type has kernels. Any
 * crash, sanitizer report or leak is a bug; errors are fine.
 */
#include "backend/ggml_quant.h"
#include "format/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile unsigned sink;

static void walk_value(const df_gguf_value *v, int depth) {
    if (v->type != DF_GGUF_ARRAY) {
        int64_t i;
        double d;
        if (!df_gguf_value_i64(v, &i)) sink += (unsigned)i;
        if (!df_gguf_value_f64(v, &d)) sink += (unsigned)(d == d);
        if (v->type == DF_GGUF_STRING) sink += (unsigned)strlen(v->v.str.s);
        return;
    }
    for (uint64_t k = 0; k < v->n; k++) {
        if (v->elem_type == DF_GGUF_STRING) {
            sink += (unsigned)strlen(v->strs[k].s) + (unsigned)v->strs[k].len;
        } else if (v->elem_type == DF_GGUF_ARRAY) {
            walk_value(&v->vals[k], depth + 1);
        } else {
            int64_t i;
            double d;
            if (!df_gguf_array_i64(v, k, &i)) sink += (unsigned)i;
            if (!df_gguf_array_f64(v, k, &d)) sink += (unsigned)(d == d);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    df_gguf *g = NULL;
    char err[512];
    if (df_gguf_open_mem(data, size, "fuzz.gguf", &g, err, sizeof err)) return 0;
    for (int i = 0; i < df_gguf_n_kv(g); i++) {
        const df_gguf_kv *kv = df_gguf_kv_at(g, i);
        walk_value(&kv->val, 0);
        const char *s;
        int64_t iv;
        float f;
        int b;
        const df_gguf_str *strs;
        uint64_t n;
        int32_t *i32 = NULL;
        float *f32 = NULL;
        (void)df_gguf_get_str(g, kv->key, &s, err, sizeof err);
        (void)df_gguf_get_i64(g, kv->key, &iv, err, sizeof err);
        (void)df_gguf_get_f32(g, kv->key, &f, err, sizeof err);
        (void)df_gguf_get_bool(g, kv->key, &b, err, sizeof err);
        (void)df_gguf_get_arr_str(g, kv->key, &strs, &n, err, sizeof err);
        if (df_gguf_get_arr_i32(g, kv->key, &i32, &n, err, sizeof err) == 1) free(i32);
        if (df_gguf_get_arr_f32(g, kv->key, &f32, &n, err, sizeof err) == 1) free(f32);
    }
    for (int i = 0; i < df_gguf_n_tensors(g); i++) {
        const df_gguf_tensor *t = df_gguf_tensor_at(g, i);
        if (df_gguf_tensor_find(g, t->name) != t) abort();
        for (uint64_t k = 0; k < t->nbytes; k++) sink += t->data[k];
        const df_ggml_traits *tr = df_ggml_traits_of(t->type);
        if (tr && t->nbytes && t->ne[0] <= 4096) {
            float row[4096], x[4096];
            for (int64_t k = 0; k < t->ne[0]; k++) x[k] = 1.0f;
            df_ggml_dequant_row(t->type, t->data, row, t->ne[0]);
            sink += (unsigned)(df_ggml_dot(t->type, t->data, x, t->ne[0]) == 0.0f);
        }
    }
    df_gguf_close(g);
    return 0;
}
