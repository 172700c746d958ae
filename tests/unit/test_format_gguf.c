/* test_format_gguf.c - the GGUF reader on hand-built files: a valid file
 * read back through every accessor, then one malformed variant per check
 * (each must give the right DF_E* code and a message naming the problem),
 * every truncation of a valid file, and random corruptions (run under ASan:
 * no crash, no leak, no out-of-bounds read).
 */
#include "format/gguf.h"
#include "deltafin.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* ---- a tiny GGUF builder ------------------------------------------------ */

static void u8(df_buf *b, uint8_t v) { df_buf_put(b, &v, 1); }
static void u16(df_buf *b, uint16_t v) { df_buf_put(b, &v, 2); }
static void u32(df_buf *b, uint32_t v) { df_buf_put(b, &v, 4); }
static void u64(df_buf *b, uint64_t v) { df_buf_put(b, &v, 8); }
static void str(df_buf *b, const char *s) {
    u64(b, strlen(s));
    df_buf_put(b, s, strlen(s));
}
static void kv_hdr(df_buf *b, const char *key, uint32_t type) {
    str(b, key);
    u32(b, type);
}
static void pad(df_buf *b, size_t align) {
    while (b->len % align) u8(b, 0);
}
static void tinfo(df_buf *b, const char *name, int n_dims, const uint64_t *ne, uint32_t type,
                  uint64_t off) {
    str(b, name);
    u32(b, (uint32_t)n_dims);
    for (int i = 0; i < n_dims; i++) u64(b, ne[i]);
    u32(b, type);
    u64(b, off);
}

/* Knobs for malformed variants of the standard file. */
typedef struct {
    uint32_t magic, version;
    uint64_t n_tensors_delta; /* added to the real count */
    uint64_t kv_extra_count;  /* claimed extra kvs (not present) */
    uint32_t t1_type;
    uint64_t t1_off;
    int t1_ndims;
    uint64_t t1_ne0;
    const char *t1_name;
    uint32_t align_type;
    uint32_t align;
    int dup_key;
    uint8_t bool_val;
    uint32_t kv_type_override; /* for "t.u32" */
    uint64_t str_len_override; /* for "t.str" (0: real) */
    uint64_t arr_len_override;
    size_t data_bytes; /* 0: exactly what the tensors need */
} knobs;

static knobs defaults(void) {
    knobs k = {0};
    k.magic = 0x46554747u;
    k.version = 3;
    k.t1_type = DF_GGML_Q4_0;
    k.t1_off = 64;
    k.t1_ndims = 2;
    k.t1_ne0 = 64;
    k.t1_name = "blk.0.w";
    k.align_type = DF_GGUF_UINT32;
    k.align = 64;
    k.bool_val = 1;
    return k;
}

/* Standard file: 2 tensors: "emb" F32 [16] at 0 (64 bytes), "blk.0.w"
 * Q4_0 [64, 2] at t1_off (72 bytes). Alignment 64. */
static df_buf build(knobs k) {
    df_buf b = {0};
    u32(&b, k.magic);
    u32(&b, k.version);
    u64(&b, 2 + k.n_tensors_delta);
    int n_kv = 10 + (k.dup_key ? 1 : 0);
    u64(&b, (uint64_t)n_kv + k.kv_extra_count);
    kv_hdr(&b, "general.architecture", DF_GGUF_STRING);
    str(&b, "llama");
    kv_hdr(&b, "general.alignment", k.align_type);
    if (k.align_type == DF_GGUF_UINT32) u32(&b, k.align);
    else u64(&b, k.align);
    kv_hdr(&b, "t.u32", k.kv_type_override ? k.kv_type_override : DF_GGUF_UINT32);
    u32(&b, 123456);
    kv_hdr(&b, "t.i8", DF_GGUF_INT8);
    u8(&b, (uint8_t)-5);
    kv_hdr(&b, "t.f32", DF_GGUF_FLOAT32);
    float f = 0.25f;
    df_buf_put(&b, &f, 4);
    kv_hdr(&b, "t.bool", DF_GGUF_BOOL);
    u8(&b, k.bool_val);
    kv_hdr(&b, "t.str", DF_GGUF_STRING);
    u64(&b, k.str_len_override ? k.str_len_override : 5);
    df_buf_put(&b, "hello", 5);
    kv_hdr(&b, "t.toks", DF_GGUF_ARRAY);
    u32(&b, DF_GGUF_STRING);
    u64(&b, k.arr_len_override ? k.arr_len_override : 3);
    str(&b, "a");
    str(&b, "bc");
    str(&b, "");
    kv_hdr(&b, "t.ints", DF_GGUF_ARRAY);
    u32(&b, DF_GGUF_INT16);
    u64(&b, 3);
    u16(&b, 1);
    u16(&b, (uint16_t)-2);
    u16(&b, 300);
    kv_hdr(&b, "t.nested", DF_GGUF_ARRAY);
    u32(&b, DF_GGUF_ARRAY);
    u64(&b, 2);
    u32(&b, DF_GGUF_FLOAT64);
    u64(&b, 1);
    double d = 2.5;
    df_buf_put(&b, &d, 8);
    u32(&b, DF_GGUF_UINT8);
    u64(&b, 2);
    u8(&b, 7);
    u8(&b, 9);
    if (k.dup_key) {
        kv_hdr(&b, "t.i8", DF_GGUF_INT8);
        u8(&b, 1);
    }
    uint64_t ne0[1] = {16};
    tinfo(&b, "emb", 1, ne0, DF_GGML_F32, 0);
    uint64_t ne1[5] = {k.t1_ne0, 2, 1, 1, 1};
    tinfo(&b, k.t1_name, k.t1_ndims, ne1, k.t1_type, k.t1_off);
    pad(&b, k.align && !(k.align & (k.align - 1)) ? k.align : 32);
    size_t data = k.data_bytes ? k.data_bytes : k.t1_off >= 64 && k.t1_off <= 4096 ? (size_t)k.t1_off + 72 : 136;
    for (size_t i = 0; i < data; i++) u8(&b, (uint8_t)i);
    return b;
}

static int open_buf(const df_buf *b, df_gguf **g, char *err, size_t errlen) {
    return df_gguf_open_mem(b->p, b->len, "test.gguf", g, err, errlen);
}

/* Expects the variant to fail with code and a message containing want. */
static void expect_fail(knobs k, int code, const char *want, const char *what) {
    df_buf b = build(k);
    df_gguf *g = NULL;
    char err[512] = "";
    int rc = open_buf(&b, &g, err, sizeof err);
    CHECK(rc == code, "%s: rc %d, expected %d (%s)", what, rc, code, err);
    CHECK(strstr(err, want) != NULL, "%s: message '%s' lacks '%s'", what, err, want);
    CHECK(strstr(err, "test.gguf") == err, "%s: message '%s' does not start with the file", what, err);
    CHECK(strchr(err, '\n') == NULL, "%s: message is not one line", what);
    CHECK(g == NULL, "%s: handle returned on failure", what);
    df_gguf_close(g);
    df_buf_free(&b);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_valid(void) {
    df_buf b = build(defaults());
    df_gguf *g;
    char err[512];
    int rc = open_buf(&b, &g, err, sizeof err);
    CHECK(rc == 0, "valid file: %s", err);
    if (rc) return;
    CHECK(df_gguf_version(g) == 3 && df_gguf_alignment(g) == 64, "version/alignment");
    CHECK(df_gguf_n_kv(g) == 10, "n_kv %d", df_gguf_n_kv(g));
    const char *s = NULL;
    CHECK(df_gguf_get_str(g, "general.architecture", &s, err, sizeof err) == 1 && !strcmp(s, "llama"),
          "arch");
    uint32_t u = 0;
    CHECK(df_gguf_get_u32(g, "t.u32", &u, err, sizeof err) == 1 && u == 123456, "u32");
    int64_t i = 0;
    CHECK(df_gguf_get_i64(g, "t.i8", &i, err, sizeof err) == 1 && i == -5, "i8 as i64");
    CHECK(df_gguf_get_u32(g, "t.i8", &u, err, sizeof err) == DF_EFORMAT && strstr(err, "t.i8"),
          "negative as u32 must fail: %s", err);
    float f = 0;
    CHECK(df_gguf_get_f32(g, "t.f32", &f, err, sizeof err) == 1 && f == 0.25f, "f32");
    CHECK(df_gguf_get_f32(g, "t.u32", &f, err, sizeof err) == 1 && f == 123456.0f, "int as f32");
    int bo = 0;
    CHECK(df_gguf_get_bool(g, "t.bool", &bo, err, sizeof err) == 1 && bo == 1, "bool");
    CHECK(df_gguf_get_bool(g, "t.u32", &bo, err, sizeof err) == DF_EFORMAT &&
              strstr(err, "expected bool, found uint32"),
          "wrong type message: %s", err);
    CHECK(df_gguf_get_str(g, "missing.key", &s, err, sizeof err) == 0, "missing key");
    CHECK(df_gguf_get_i64(g, "t.str", &i, err, sizeof err) == DF_EFORMAT, "string as int");
    const df_gguf_str *toks;
    uint64_t n = 0;
    CHECK(df_gguf_get_arr_str(g, "t.toks", &toks, &n, err, sizeof err) == 1 && n == 3 &&
              !strcmp(toks[1].s, "bc") && toks[2].len == 0,
          "string array");
    int32_t *ints = NULL;
    CHECK(df_gguf_get_arr_i32(g, "t.ints", &ints, &n, err, sizeof err) == 1 && n == 3 && ints[0] == 1 &&
              ints[1] == -2 && ints[2] == 300,
          "int16 array as i32");
    free(ints);
    float *fl = NULL;
    CHECK(df_gguf_get_arr_f32(g, "t.ints", &fl, &n, err, sizeof err) == 1 && fl[2] == 300.0f, "as f32");
    free(fl);
    CHECK(df_gguf_get_arr_i32(g, "t.toks", &ints, &n, err, sizeof err) == DF_EFORMAT, "strings as ints");
    const df_gguf_kv *nest = df_gguf_find(g, "t.nested");
    CHECK(nest && nest->val.elem_type == DF_GGUF_ARRAY && nest->val.n == 2, "nested");
    if (nest && nest->val.vals) {
        double dv = 0;
        int64_t iv = 0;
        CHECK(df_gguf_array_f64(&nest->val.vals[0], 0, &dv) == 0 && dv == 2.5, "nested f64");
        CHECK(df_gguf_array_i64(&nest->val.vals[1], 1, &iv) == 0 && iv == 9, "nested u8");
        CHECK(df_gguf_array_i64(&nest->val.vals[1], 2, &iv) == DF_EFORMAT, "nested out of range");
    }
    CHECK(df_gguf_n_tensors(g) == 2, "n_tensors");
    const df_gguf_tensor *t = df_gguf_tensor_find(g, "blk.0.w");
    CHECK(t && t->type == DF_GGML_Q4_0 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 2 &&
              t->ne[2] == 1 && t->nbytes == 72 && df_gguf_tensor_row_bytes(t) == 36,
          "tensor blk.0.w");
    const df_gguf_tensor *e = df_gguf_tensor_find(g, "emb");
    CHECK(e && e->nbytes == 64 && e->file_offset == df_gguf_data_offset(g, 0) &&
              e->file_offset % 64 == 0 && e->data == (const uint8_t *)b.p + e->file_offset &&
              e->data[1] == 1,
          "tensor emb");
    CHECK(t && t->file_offset == e->file_offset + 64 && t->data[0] == 64, "tensor data");
    CHECK(df_gguf_tensor_find(g, "nope") == NULL, "absent tensor");
    df_gguf_close(g);
    df_buf_free(&b);
}

static void test_malformed(void) {
    knobs k;
    k = defaults(); k.magic = 0x46554746u; expect_fail(k, DF_EFORMAT, "magic", "wrong magic");
    k = defaults(); k.version = 1; expect_fail(k, DF_EUNSUPPORTED, "version 1", "v1");
    k = defaults(); k.version = 9; expect_fail(k, DF_EFORMAT, "expected 2 or 3, found 9", "v9");
    k = defaults(); k.version = 0x03000000u; expect_fail(k, DF_EUNSUPPORTED, "big-endian", "big-endian");
    k = defaults(); k.version = 2;
    {
        df_buf b = build(k);
        df_gguf *g;
        char err[256];
        CHECK(open_buf(&b, &g, err, sizeof err) == 0, "v2 opens: %s", err);
        df_gguf_close(g);
        df_buf_free(&b);
    }
    k = defaults(); k.n_tensors_delta = 1ull << 60; expect_fail(k, DF_EFORMAT, "tensor count", "huge tensor count");
    k = defaults(); k.n_tensors_delta = 1; expect_fail(k, DF_EFORMAT, "tensor info 2", "one tensor too many");
    k = defaults(); k.kv_extra_count = (uint64_t)-1 / 2; expect_fail(k, DF_EFORMAT, "metadata count", "huge kv count");
    k = defaults(); k.str_len_override = 1ull << 62; expect_fail(k, DF_EFORMAT, "string length", "huge string");
    k = defaults(); k.str_len_override = (uint64_t)-1; expect_fail(k, DF_EFORMAT, "t.str", "string len 2^64-1");
    k = defaults(); k.arr_len_override = 1ull << 61; expect_fail(k, DF_EFORMAT, "t.toks", "huge array");
    k = defaults(); k.t1_off = 1ull << 40; expect_fail(k, DF_EFORMAT, "'blk.0.w'", "offset past end");
    k = defaults(); k.t1_off = (uint64_t)-64; expect_fail(k, DF_EFORMAT, "past the end", "offset wraps");
    k = defaults(); k.data_bytes = 100; expect_fail(k, DF_EFORMAT, "past the end", "data cut short");
    k = defaults(); k.t1_off = 32; expect_fail(k, DF_EFORMAT, "multiple of the alignment 64", "misaligned");
    k = defaults(); k.align = 32; k.t1_off = 32; expect_fail(k, DF_EFORMAT, "overlaps", "overlap");
    k = defaults(); k.t1_type = 99; expect_fail(k, DF_EFORMAT, "unknown GGML type 99", "unknown type");
    k = defaults(); k.t1_type = 4; expect_fail(k, DF_EFORMAT, "unknown GGML type 4", "removed type");
    k = defaults(); k.t1_ndims = 5; expect_fail(k, DF_EFORMAT, "n_dims expected <= 4, found 5", "n_dims");
    k = defaults(); k.t1_ne0 = 48; expect_fail(k, DF_EFORMAT, "not a multiple of the Q4_0 block size 32", "block");
    k = defaults(); k.t1_ne0 = 1ull << 62; expect_fail(k, DF_EFORMAT, "blk.0.w", "huge dims");
    k = defaults(); k.t1_ne0 = (uint64_t)-32; expect_fail(k, DF_EFORMAT, "larger than INT64_MAX", "dims > int64");
    k = defaults(); k.t1_name = "emb"; expect_fail(k, DF_EFORMAT, "duplicate tensor name 'emb'", "dup tensor");
    k = defaults(); k.dup_key = 1; expect_fail(k, DF_EFORMAT, "duplicate metadata key 't.i8'", "dup key");
    k = defaults(); k.bool_val = 2; expect_fail(k, DF_EFORMAT, "t.bool", "bool 2");
    k = defaults(); k.kv_type_override = 13; expect_fail(k, DF_EFORMAT, "unknown value type 13", "kv type");
    k = defaults(); k.align_type = DF_GGUF_UINT64; expect_fail(k, DF_EFORMAT, "expected uint32, found uint64", "align type");
    k = defaults(); k.align = 48; expect_fail(k, DF_EFORMAT, "power of two", "align 48");
    k = defaults(); k.align = 0; expect_fail(k, DF_EFORMAT, "power of two", "align 0");

    /* empty and tiny inputs */
    df_gguf *g = NULL;
    char err[256];
    CHECK(df_gguf_open_mem("", 0, "empty.gguf", &g, err, sizeof err) == DF_EFORMAT && !g, "empty");
    CHECK(df_gguf_open_mem("GGU", 3, "t.gguf", &g, err, sizeof err) == DF_EFORMAT, "3 bytes");
    CHECK(df_gguf_open_mem("GGUF", 4, "t.gguf", &g, err, sizeof err) == DF_EFORMAT, "magic only");
    CHECK(df_gguf_open("/nonexistent/x.gguf", &g, err, sizeof err) == DF_EIO && strstr(err, "x.gguf"),
          "missing file: %s", err);
}

static void test_truncations(void) {
    df_buf b = build(defaults());
    for (size_t n = 0; n < b.len; n++) {
        char *copy = malloc(n ? n : 1); /* exact size: ASan sees any over-read */
        memcpy(copy, b.p, n);
        df_gguf *g = NULL;
        char err[256] = "";
        int rc = df_gguf_open_mem(copy, n, "cut.gguf", &g, err, sizeof err);
        CHECK(rc == DF_EFORMAT, "prefix %zu: rc %d (%s)", n, rc, err);
        df_gguf_close(g);
        free(copy);
    }
    df_buf_free(&b);
}

static void test_corruptions(void) {
    df_buf b = build(defaults());
    uint64_t s = 12345;
    int opened = 0;
    for (int it = 0; it < 20000; it++) {
        char *copy = malloc(b.len);
        memcpy(copy, b.p, b.len);
        int flips = 1 + (int)(s % 4);
        for (int f = 0; f < flips; f++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(s >> 33) % b.len;
            copy[pos] = (char)(s >> 13);
        }
        df_gguf *g = NULL;
        char err[256];
        int rc = df_gguf_open_mem(copy, b.len, "fuzz.gguf", &g, err, sizeof err);
        CHECK(rc == 0 || rc == DF_EFORMAT || rc == DF_EUNSUPPORTED, "corrupt: rc %d", rc);
        if (rc == 0) {
            opened++;
            /* walk everything */
            for (int i = 0; i < df_gguf_n_tensors(g); i++) {
                const df_gguf_tensor *t = df_gguf_tensor_at(g, i);
                unsigned sum = 0;
                for (uint64_t j = 0; j < t->nbytes; j++) sum += t->data[j];
                (void)sum;
            }
        }
        df_gguf_close(g);
        free(copy);
    }
    CHECK(opened > 0, "no corrupted variant opened at all");
    df_buf_free(&b);
}

static void test_file_and_split(void) {
    char dir[] = "/tmp/df_gguf_testXXXXXX";
    if (!mkdtemp(dir)) return;
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "%s/m-00001-of-00002.gguf", dir);
    snprintf(p2, sizeof p2, "%s/m-00002-of-00002.gguf", dir);
    /* part 1: split keys + tensor a; part 2: split keys + tensor b */
    for (int part = 0; part < 2; part++) {
        df_buf b = {0};
        u32(&b, 0x46554747u);
        u32(&b, 3);
        u64(&b, 1);
        u64(&b, 3);
        kv_hdr(&b, "split.no", DF_GGUF_UINT16);
        u16(&b, (uint16_t)part);
        kv_hdr(&b, "split.count", DF_GGUF_UINT16);
        u16(&b, 2);
        kv_hdr(&b, "split.tensors.count", DF_GGUF_INT32);
        u32(&b, 2);
        uint64_t ne[1] = {32};
        tinfo(&b, part ? "b" : "a", 1, ne, DF_GGML_Q8_0, 0);
        pad(&b, 32);
        for (int i = 0; i < 34; i++) u8(&b, (uint8_t)(part * 100 + i));
        FILE *f = fopen(part ? p2 : p1, "wb");
        fwrite(b.p, 1, b.len, f);
        fclose(f);
        df_buf_free(&b);
    }
    df_gguf *g = NULL;
    char err[512];
    int rc = df_gguf_open(p1, &g, err, sizeof err);
    CHECK(rc == 0, "split open: %s", err);
    if (!rc) {
        CHECK(df_gguf_n_files(g) == 2 && df_gguf_n_tensors(g) == 2, "split counts");
        const df_gguf_tensor *tb = df_gguf_tensor_find(g, "b");
        CHECK(tb && tb->file_index == 1 && tb->data[0] == 100 && tb->nbytes == 34, "split tensor b");
        df_gguf_close(g);
    }
    rc = df_gguf_open(p2, &g, err, sizeof err);
    CHECK(rc == DF_EINPUT && strstr(err, "first part"), "open part 2: %d %s", rc, err);
    unlink(p2);
    rc = df_gguf_open(p1, &g, err, sizeof err);
    CHECK(rc == DF_EIO && strstr(err, "m-00002-of-00002.gguf"), "missing part: %d %s", rc, err);
    unlink(p1);
    rmdir(dir);
}

/* A FLOAT64 (or UINT64) value beyond float's range has no float value: the
 * reader refuses it, naming the key, instead of converting (undefined); NaN and
 * infinities are floats and pass through for the caller's range check. */
static void test_f32_range(void) {
    df_buf b = {0};
    u32(&b, 0x46554747u);
    u32(&b, 3);
    u64(&b, 0);
    u64(&b, 5);
    kv_hdr(&b, "general.architecture", DF_GGUF_STRING);
    str(&b, "llama");
    double big = 1e300, nan = NAN, ok = -2.5e38, inf = -INFINITY;
    kv_hdr(&b, "t.big", DF_GGUF_FLOAT64);
    df_buf_put(&b, &big, 8);
    kv_hdr(&b, "t.nan", DF_GGUF_FLOAT64);
    df_buf_put(&b, &nan, 8);
    kv_hdr(&b, "t.ok", DF_GGUF_FLOAT64);
    df_buf_put(&b, &ok, 8);
    kv_hdr(&b, "t.inf", DF_GGUF_FLOAT64);
    df_buf_put(&b, &inf, 8);
    df_gguf *g = NULL;
    char err[512] = "";
    int rc = open_buf(&b, &g, err, sizeof err);
    CHECK(rc == 0, "f32 range file: %s", err);
    if (!rc) {
        float f = 0;
        rc = df_gguf_get_f32(g, "t.big", &f, err, sizeof err);
        CHECK(rc == DF_EFORMAT && strstr(err, "test.gguf") == err && strstr(err, "'t.big'") && strstr(err, "1e+300"),
              "1e300 as f32: rc %d, '%s'", rc, err);
        CHECK(df_gguf_get_f32(g, "t.nan", &f, err, sizeof err) == 1 && isnan(f), "NaN passes");
        CHECK(df_gguf_get_f32(g, "t.inf", &f, err, sizeof err) == 1 && isinf(f) && f < 0, "-inf passes");
        CHECK(df_gguf_get_f32(g, "t.ok", &f, err, sizeof err) == 1 && f == -2.5e38f, "-2.5e38 is a float");
    }
    df_gguf_close(g);
    df_buf_free(&b);
}

int main(void) {
    test_valid();
    test_f32_range();
    test_malformed();
    test_truncations();
    test_corruptions();
    test_file_and_split();
    if (failures) {
        printf("test_format_gguf: %d failures\n", failures);
        return 1;
    }
    printf("test_format_gguf: ok\n");
    return 0;
}
