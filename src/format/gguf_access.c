/* gguf_access.c - read-only accessors and typed metadata getters of an
 * open df_gguf. They never fail on a validated handle except for a missing
 * key or a wrong type, reported as one line naming the key and the types.
 */
#include "format/gguf_int.h"

#include "deltafin.h"
#include "util/util.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- accessors --------------------------------------------------------- */

uint32_t df_gguf_version(const df_gguf *g) { return g->files[0].version; }
uint32_t df_gguf_alignment(const df_gguf *g) { return g->files[0].alignment; }
int df_gguf_n_files(const df_gguf *g) { return g->n_files; }
const char *df_gguf_path(const df_gguf *g, int i) {
    return i >= 0 && i < g->n_files ? g->files[i].path : NULL;
}
const uint8_t *df_gguf_file_data(const df_gguf *g, int i, size_t *size) {
    int ok = i >= 0 && i < g->n_files && g->files[i].path && !g->files[i].map.resident;
    *size = ok ? g->files[i].size : 0;
    return ok ? g->files[i].data : NULL;
}
uint64_t df_gguf_data_offset(const df_gguf *g, int i) {
    return i >= 0 && i < g->n_files ? g->files[i].data_off : 0;
}

int df_gguf_n_kv(const df_gguf *g) { return g->files[0].n_kv; }
const df_gguf_kv *df_gguf_kv_at(const df_gguf *g, int i) {
    return i >= 0 && i < g->files[0].n_kv ? &g->files[0].kv[i] : NULL;
}
const df_gguf_kv *df_gguf_find(const df_gguf *g, const char *key) {
    return file_find(&g->files[0], key);
}

int df_gguf_n_tensors(const df_gguf *g) { return g->n_tensors; }
const df_gguf_tensor *df_gguf_tensor_at(const df_gguf *g, int i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}
const df_gguf_tensor *df_gguf_tensor_find(const df_gguf *g, const char *name) {
    uint32_t slot;
    int found = g->t_index.slot ? T_FIND(g, name, &slot) : -1;
    return found >= 0 ? &g->tensors[found] : NULL;
}
int64_t df_gguf_tensor_nelements(const df_gguf_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}
uint64_t df_gguf_tensor_row_bytes(const df_gguf_tensor *t) {
    return (uint64_t)(t->ne[0] / gguf_types[t->type].blck) * (uint64_t)gguf_types[t->type].size;
}

/* ---- typed getters ----------------------------------------------------- */

static int is_uint(int t) {
    return t == DF_GGUF_UINT8 || t == DF_GGUF_UINT16 || t == DF_GGUF_UINT32 || t == DF_GGUF_UINT64;
}
static int is_int(int t) {
    return t == DF_GGUF_INT8 || t == DF_GGUF_INT16 || t == DF_GGUF_INT32 || t == DF_GGUF_INT64;
}

int df_gguf_value_i64(const df_gguf_value *v, int64_t *out) {
    if (is_int(v->type)) {
        *out = v->v.i;
        return 0;
    }
    if (is_uint(v->type) && v->v.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->v.u;
        return 0;
    }
    return DF_EFORMAT;
}

int df_gguf_value_f64(const df_gguf_value *v, double *out) {
    int64_t i;
    if (v->type == DF_GGUF_FLOAT32 || v->type == DF_GGUF_FLOAT64) {
        *out = v->v.f;
        return 0;
    }
    if (v->type == DF_GGUF_UINT64) {
        *out = (double)v->v.u;
        return 0;
    }
    if (df_gguf_value_i64(v, &i)) return DF_EFORMAT;
    *out = (double)i;
    return 0;
}

/* Element i of a numeric array as a scalar value. */
static int array_elem(const df_gguf_value *v, uint64_t i, df_gguf_value *e) {
    if (v->type != DF_GGUF_ARRAY || !v->raw || i >= v->n) return DF_EFORMAT;
    int sz = value_size(v->elem_type);
    uint64_t raw = rd_le(v->raw + i * (uint64_t)sz, sz);
    memset(e, 0, sizeof *e);
    e->type = v->elem_type;
    switch (v->elem_type) {
    case DF_GGUF_INT8: e->v.i = (int8_t)raw; break;
    case DF_GGUF_INT16: e->v.i = (int16_t)raw; break;
    case DF_GGUF_INT32: e->v.i = (int32_t)raw; break;
    case DF_GGUF_INT64: memcpy(&e->v.i, &raw, 8); break;
    case DF_GGUF_FLOAT32: {
        uint32_t r = (uint32_t)raw;
        float f;
        memcpy(&f, &r, 4);
        e->v.f = f;
        break;
    }
    case DF_GGUF_FLOAT64: memcpy(&e->v.f, &raw, 8); break;
    case DF_GGUF_BOOL: e->v.b = (int)raw; break;
    default: e->v.u = raw; break;
    }
    return 0;
}

int df_gguf_array_i64(const df_gguf_value *v, uint64_t i, int64_t *out) {
    df_gguf_value e;
    return array_elem(v, i, &e) ? DF_EFORMAT : df_gguf_value_i64(&e, out);
}

int df_gguf_array_f64(const df_gguf_value *v, uint64_t i, double *out) {
    df_gguf_value e;
    return array_elem(v, i, &e) ? DF_EFORMAT : df_gguf_value_f64(&e, out);
}

static int wrong_type(const df_gguf *g, const char *key, const df_gguf_value *v, const char *want,
                      char *err, size_t errlen) {
    if (v->type == DF_GGUF_ARRAY)
        return df_err(err, errlen, DF_EFORMAT, "%s: key '%s': expected %s, found array of %s",
                      g->files[0].path, key, want, df_gguf_value_type_name(v->elem_type));
    return df_err(err, errlen, DF_EFORMAT, "%s: key '%s': expected %s, found %s", g->files[0].path,
                  key, want, df_gguf_value_type_name(v->type));
}

int df_gguf_get_str(const df_gguf *g, const char *key, const char **out, char *err, size_t errlen) {
    const df_gguf_kv *kv = df_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->val.type != DF_GGUF_STRING) return wrong_type(g, key, &kv->val, "string", err, errlen);
    *out = kv->val.v.str.s;
    return 1;
}

int df_gguf_get_i64(const df_gguf *g, const char *key, int64_t *out, char *err, size_t errlen) {
    const df_gguf_kv *kv = df_gguf_find(g, key);
    if (!kv) return 0;
    if (df_gguf_value_i64(&kv->val, out))
        return is_uint(kv->val.type)
                   ? df_err(err, errlen, DF_EFORMAT, "%s: key '%s': value %" PRIu64 " out of range",
                            g->files[0].path, key, kv->val.v.u)
                   : wrong_type(g, key, &kv->val, "an integer", err, errlen);
    return 1;
}

int df_gguf_get_u32(const df_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen) {
    int64_t v;
    int rc = df_gguf_get_i64(g, key, &v, err, errlen);
    if (rc <= 0) return rc;
    if (v < 0 || v > (int64_t)UINT32_MAX)
        return df_err(err, errlen, DF_EFORMAT,
                      "%s: key '%s': expected 0..4294967295, found %" PRId64, g->files[0].path, key, v);
    *out = (uint32_t)v;
    return 1;
}

int df_gguf_get_f32(const df_gguf *g, const char *key, float *out, char *err, size_t errlen) {
    const df_gguf_kv *kv = df_gguf_find(g, key);
    double d;
    if (!kv) return 0;
    if (df_gguf_value_f64(&kv->val, &d)) return wrong_type(g, key, &kv->val, "a number", err, errlen);
    /* a FLOAT64 or integer beyond float's range has no float value (the conversion is undefined);
     * NaN and infinities pass through for the caller's range check */
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return df_err(err, errlen, DF_EFORMAT, "%s: key '%s': expected a number within float range (|x| <= %g), found %g", g->files[0].path, key, (double)FLT_MAX, d);
    *out = (float)d;
    return 1;
}

int df_gguf_get_bool(const df_gguf *g, const char *key, int *out, char *err, size_t errlen) {
    const df_gguf_kv *kv = df_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->val.type != DF_GGUF_BOOL) return wrong_type(g, key, &kv->val, "bool", err, errlen);
    *out = kv->val.v.b;
    return 1;
}

/* Finds an array key; returns 1 with *v, 0 absent, <0 not an array. */
static int find_array(const df_gguf *g, const char *key, const df_gguf_value **v, const char *want,
                      char *err, size_t errlen) {
    const df_gguf_kv *kv = df_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->val.type != DF_GGUF_ARRAY) return wrong_type(g, key, &kv->val, want, err, errlen);
    *v = &kv->val;
    return 1;
}

int df_gguf_get_arr_str(const df_gguf *g, const char *key, const df_gguf_str **out, uint64_t *n,
                        char *err, size_t errlen) {
    const df_gguf_value *v = NULL;
    int rc = find_array(g, key, &v, "array of string", err, errlen);
    if (rc <= 0) return rc;
    if (v->elem_type != DF_GGUF_STRING)
        return df_err(err, errlen, DF_EFORMAT, "%s: key '%s': expected array of string, found array of %s",
                      g->files[0].path, key, df_gguf_value_type_name(v->elem_type));
    *out = v->strs;
    *n = v->n;
    return 1;
}

/* Converts a numeric array: kind 0 i32, 1 i64, 2 f32. */
static int get_num_array(const df_gguf *g, const char *key, void **out, uint64_t *n, int kind,
                         char *err, size_t errlen) {
    static const char *const want[] = {"array of integers", "array of integers", "array of numbers"};
    static const size_t esz[] = {4, 8, 4};
    const df_gguf_value *v = NULL;
    int rc = find_array(g, key, &v, want[kind], err, errlen);
    if (rc <= 0) return rc;
    int et = v->elem_type;
    int ok = is_int(et) || is_uint(et) || (kind == 2 && (et == DF_GGUF_FLOAT32 || et == DF_GGUF_FLOAT64));
    if (!ok)
        return df_err(err, errlen, DF_EFORMAT, "%s: key '%s': expected %s, found array of %s",
                      g->files[0].path, key, want[kind], df_gguf_value_type_name(et));
    void *buf = malloc(v->n ? (size_t)v->n * esz[kind] : 1);
    if (!buf) return df_err(err, errlen, DF_ENOMEM, "%s: out of memory", g->files[0].path);
    for (uint64_t i = 0; i < v->n; i++) {
        int64_t iv = 0;
        double dv = 0;
        int bad = kind == 2 ? df_gguf_array_f64(v, i, &dv) : df_gguf_array_i64(v, i, &iv);
        if (!bad && kind == 0 && (iv < INT32_MIN || iv > INT32_MAX)) bad = 1;
        if (bad) {
            free(buf);
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: key '%s': element %" PRIu64 " out of range for %s", g->files[0].path,
                          key, i, kind == 0 ? "int32" : kind == 1 ? "int64" : "float");
        }
        if (kind == 0) ((int32_t *)buf)[i] = (int32_t)iv;
        else if (kind == 1) ((int64_t *)buf)[i] = iv;
        else ((float *)buf)[i] = (float)dv;
    }
    *out = buf;
    *n = v->n;
    return 1;
}

int df_gguf_get_arr_i32(const df_gguf *g, const char *key, int32_t **out, uint64_t *n, char *err,
                        size_t errlen) {
    return get_num_array(g, key, (void **)out, n, 0, err, errlen);
}
int df_gguf_get_arr_i64(const df_gguf *g, const char *key, int64_t **out, uint64_t *n, char *err,
                        size_t errlen) {
    return get_num_array(g, key, (void **)out, n, 1, err, errlen);
}
int df_gguf_get_arr_f32(const df_gguf *g, const char *key, float **out, uint64_t *n, char *err,
                        size_t errlen) {
    return get_num_array(g, key, (void **)out, n, 2, err, errlen);
}
