/* ggml_driver.c - exposes the GGUF reader and the GGML kernels to the
 * Python tests (tests/py/test_gguf_quant.py builds it with cc). Not part of
 * the deltafin binary.
 *
 *   ggml_driver dequant TYPE ISA IN OUT   raw blocks in IN -> f32 in OUT
 *   ggml_driver dump FILE OUTDIR          OUTDIR/meta.json + OUTDIR/<i>.bin
 *
 * ISA is scalar|avx2|avx512|auto (an unsupported one exits 77: skip).
 * dump exits with -rc (2 = DF_EFORMAT, 3 = DF_EUNSUPPORTED, ...) and the
 * reader's message on stderr when the file does not open. Strings are
 * written as hex in the JSON so that any bytes survive.
 */
#include "backend/ggml_quant.h"
#include "format/gguf.h"
#include "util/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int isa_of(const char *s) {
    if (!strcmp(s, "scalar")) return DF_GGML_ISA_SCALAR;
    if (!strcmp(s, "avx2")) return DF_GGML_ISA_AVX2;
    if (!strcmp(s, "avx512")) return DF_GGML_ISA_AVX512;
    return DF_GGML_ISA_AUTO;
}

static int dequant(int type, const char *isa, const char *in, const char *out) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    if (!t) {
        fprintf(stderr, "type %d unsupported\n", type);
        return 3;
    }
    int i = isa_of(isa);
    if (i != DF_GGML_ISA_AUTO && !df_ggml_isa_supported(i)) return 77;
    df_ggml_set_isa(i);
    char err[512];
    char *buf;
    size_t len;
    if (df_read_file(in, &buf, &len, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int64_t n = (int64_t)(len / (size_t)t->block_bytes) * t->block_elems;
    float *y = malloc(sizeof(float) * (size_t)(n ? n : 1));
    df_ggml_dequant_row(type, buf, y, n);
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(y, sizeof(float), (size_t)n, f) != (size_t)n || fclose(f)) return 1;
    free(y);
    free(buf);
    return 0;
}

static void put_hex(FILE *f, const df_gguf_str *s) {
    fputc('"', f);
    for (uint64_t i = 0; i < s->len; i++) fprintf(f, "%02x", (unsigned char)s->s[i]);
    fputc('"', f);
}

static void put_value(FILE *f, const df_gguf_value *v);

static void put_array(FILE *f, const df_gguf_value *v) {
    fprintf(f, "{\"elem_type\": %d, \"values\": [", v->elem_type);
    for (uint64_t i = 0; i < v->n; i++) {
        if (i) fputs(", ", f);
        if (v->elem_type == DF_GGUF_STRING) {
            put_hex(f, &v->strs[i]);
        } else if (v->elem_type == DF_GGUF_ARRAY) {
            put_array(f, &v->vals[i]);
        } else if (v->elem_type == DF_GGUF_BOOL) {
            fputs(v->raw[i] ? "true" : "false", f);
        } else if (v->elem_type == DF_GGUF_FLOAT32 || v->elem_type == DF_GGUF_FLOAT64) {
            double d;
            df_gguf_array_f64(v, i, &d);
            fprintf(f, "%.17g", d);
        } else if (v->elem_type == DF_GGUF_UINT64) {
            uint64_t u = 0;
            memcpy(&u, v->raw + 8 * i, 8);
            fprintf(f, "%" PRIu64, u);
        } else {
            int64_t x;
            df_gguf_array_i64(v, i, &x);
            fprintf(f, "%" PRId64, x);
        }
    }
    fputs("]}", f);
}

static void put_value(FILE *f, const df_gguf_value *v) {
    switch (v->type) {
    case DF_GGUF_UINT8: case DF_GGUF_UINT16: case DF_GGUF_UINT32: case DF_GGUF_UINT64:
        fprintf(f, "%" PRIu64, v->v.u);
        break;
    case DF_GGUF_INT8: case DF_GGUF_INT16: case DF_GGUF_INT32: case DF_GGUF_INT64:
        fprintf(f, "%" PRId64, v->v.i);
        break;
    case DF_GGUF_FLOAT32: case DF_GGUF_FLOAT64: fprintf(f, "%.17g", v->v.f); break;
    case DF_GGUF_BOOL: fputs(v->v.b ? "true" : "false", f); break;
    case DF_GGUF_STRING: put_hex(f, &v->v.str); break;
    case DF_GGUF_ARRAY: put_array(f, v); break;
    }
}

static int dump(const char *path, const char *dir) {
    char err[1024];
    df_gguf *g;
    int rc = df_gguf_open(path, &g, err, sizeof err);
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return -rc;
    }
    char *mp = df_path_join(dir, "meta.json");
    FILE *f = fopen(mp, "w");
    free(mp);
    if (!f) return 1;
    fprintf(f, "{\"version\": %u, \"alignment\": %u, \"n_files\": %d, \"data_offset\": %" PRIu64 ",\n",
            df_gguf_version(g), df_gguf_alignment(g), df_gguf_n_files(g), df_gguf_data_offset(g, 0));
    fputs(" \"kv\": [", f);
    for (int i = 0; i < df_gguf_n_kv(g); i++) {
        const df_gguf_kv *kv = df_gguf_kv_at(g, i);
        fprintf(f, "%s\n  {\"key\": \"%s\", \"type\": %d, \"value\": ", i ? "," : "", kv->key,
                kv->val.type);
        put_value(f, &kv->val);
        fputc('}', f);
        if (df_gguf_find(g, kv->key) != kv) fprintf(stderr, "find(%s) mismatch\n", kv->key);
    }
    fputs("],\n \"tensors\": [", f);
    for (int i = 0; i < df_gguf_n_tensors(g); i++) {
        const df_gguf_tensor *t = df_gguf_tensor_at(g, i);
        fprintf(f, "%s\n  {\"name\": \"%s\", \"type\": %d, \"n_dims\": %d, \"ne\": [%" PRId64 ", %" PRId64
                   ", %" PRId64 ", %" PRId64 "], \"nbytes\": %" PRIu64 ", \"file_offset\": %" PRIu64
                   ", \"file_index\": %d}",
                i ? "," : "", t->name, t->type, t->n_dims, t->ne[0], t->ne[1], t->ne[2], t->ne[3],
                t->nbytes, t->file_offset, t->file_index);
        if (df_gguf_tensor_find(g, t->name) != t) fprintf(stderr, "tensor_find(%s) mismatch\n", t->name);
        char name[32];
        snprintf(name, sizeof name, "%d.bin", i);
        char *tp = df_path_join(dir, name);
        FILE *tf = fopen(tp, "wb");
        free(tp);
        if (!tf || fwrite(t->data, 1, (size_t)t->nbytes, tf) != (size_t)t->nbytes || fclose(tf)) return 1;
    }
    fputs("]}\n", f);
    fclose(f);
    df_gguf_close(g);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "dequant")) return dequant(atoi(argv[2]), argv[3], argv[4], argv[5]);
    if (argc == 4 && !strcmp(argv[1], "dump")) return dump(argv[2], argv[3]);
    fprintf(stderr, "usage: ggml_driver dequant TYPE ISA IN OUT | dump FILE OUTDIR\n");
    return 64;
}
