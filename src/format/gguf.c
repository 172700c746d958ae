/* gguf.c - GGUF v2/v3 reader. See gguf.h for the invariants it establishes.
 *
 * Parsing is one forward pass per file with a bounds-checked cursor: every
 * read first checks the bytes left, and every count is checked against the
 * smallest encoding its elements could have in the bytes left, so that no
 * allocation is sized by an untrusted number larger than the file. Strings
 * are copied (NUL-terminated) into an arena owned by the handle; numeric
 * arrays stay in the map. After the tensor infos, tensors are checked for
 * extent and alignment and sorted by offset to find overlaps.
 */
#include "format/gguf.h"

#include "deltafin.h"
#include "util/util.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define MAX_NEST 8             /* nested array depth we accept */

/* ---- GGML type table ---------------------------------------------------
 * Storage shape of every GGML type id gguf-py knows. The reader needs it to
 * size tensors even when no kernel executes the type (IQ families...). */

typedef struct {
    const char *name;
    int blck; /* elements per block */
    int size; /* bytes per block */
} type_info;

static const type_info TYPES[DF_GGML_N_TYPES] = {
    [DF_GGML_F32] = {"F32", 1, 4},          [DF_GGML_F16] = {"F16", 1, 2},
    [DF_GGML_Q4_0] = {"Q4_0", 32, 18},      [DF_GGML_Q4_1] = {"Q4_1", 32, 20},
    [DF_GGML_Q5_0] = {"Q5_0", 32, 22},      [DF_GGML_Q5_1] = {"Q5_1", 32, 24},
    [DF_GGML_Q8_0] = {"Q8_0", 32, 34},      [DF_GGML_Q8_1] = {"Q8_1", 32, 40},
    [DF_GGML_Q2_K] = {"Q2_K", 256, 84},     [DF_GGML_Q3_K] = {"Q3_K", 256, 110},
    [DF_GGML_Q4_K] = {"Q4_K", 256, 144},    [DF_GGML_Q5_K] = {"Q5_K", 256, 176},
    [DF_GGML_Q6_K] = {"Q6_K", 256, 210},    [DF_GGML_Q8_K] = {"Q8_K", 256, 292},
    [DF_GGML_IQ2_XXS] = {"IQ2_XXS", 256, 66}, [DF_GGML_IQ2_XS] = {"IQ2_XS", 256, 74},
    [DF_GGML_IQ3_XXS] = {"IQ3_XXS", 256, 98}, [DF_GGML_IQ1_S] = {"IQ1_S", 256, 50},
    [DF_GGML_IQ4_NL] = {"IQ4_NL", 32, 18},  [DF_GGML_IQ3_S] = {"IQ3_S", 256, 110},
    [DF_GGML_IQ2_S] = {"IQ2_S", 256, 82},   [DF_GGML_IQ4_XS] = {"IQ4_XS", 256, 136},
    [DF_GGML_I8] = {"I8", 1, 1},            [DF_GGML_I16] = {"I16", 1, 2},
    [DF_GGML_I32] = {"I32", 1, 4},          [DF_GGML_I64] = {"I64", 1, 8},
    [DF_GGML_F64] = {"F64", 1, 8},          [DF_GGML_IQ1_M] = {"IQ1_M", 256, 56},
    [DF_GGML_BF16] = {"BF16", 1, 2},        [DF_GGML_TQ1_0] = {"TQ1_0", 256, 54},
    [DF_GGML_TQ2_0] = {"TQ2_0", 256, 66},   [DF_GGML_MXFP4] = {"MXFP4", 32, 17},
    [DF_GGML_NVFP4] = {"NVFP4", 64, 36},    [DF_GGML_Q1_0] = {"Q1_0", 128, 18},
};

int df_gguf_type_size(int type, int *block_elems, int *block_bytes) {
    if (type < 0 || type >= DF_GGML_N_TYPES || !TYPES[type].name) return -1;
    if (block_elems) *block_elems = TYPES[type].blck;
    if (block_bytes) *block_bytes = TYPES[type].size;
    return 0;
}

const char *df_gguf_type_name(int type) {
    if (type < 0 || type >= DF_GGML_N_TYPES || !TYPES[type].name) return "?";
    return TYPES[type].name;
}

static const char *const VALUE_TYPE_NAMES[DF_GGUF_N_VALUE_TYPES] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};

const char *df_gguf_value_type_name(int type) {
    if (type < 0 || type >= DF_GGUF_N_VALUE_TYPES) return "?";
    return VALUE_TYPE_NAMES[type];
}

/* Encoded size of a fixed-size value type; 0 for STRING/ARRAY/unknown. */
static int value_size(int type) {
    switch (type) {
    case DF_GGUF_UINT8: case DF_GGUF_INT8: case DF_GGUF_BOOL: return 1;
    case DF_GGUF_UINT16: case DF_GGUF_INT16: return 2;
    case DF_GGUF_UINT32: case DF_GGUF_INT32: case DF_GGUF_FLOAT32: return 4;
    case DF_GGUF_UINT64: case DF_GGUF_INT64: case DF_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- handle ------------------------------------------------------------ */

/* Arena: strings and small tables live here until close. */
typedef struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
} arena_blk;

/* Open-addressing string -> index table (indices + 1; 0 = empty). */
typedef struct {
    uint32_t *slot;
    uint32_t cap; /* power of two */
} name_index;

typedef struct {
    df_mapped map;       /* when opened from a path */
    const uint8_t *data; /* whole file */
    size_t size;
    char *path;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;
    df_gguf_kv *kv; /* this part's metadata */
    int n_kv;
    name_index kv_index;
} gguf_file;

struct df_gguf {
    gguf_file *files;
    int n_files;
    df_gguf_tensor *tensors;
    int n_tensors, cap_tensors;
    name_index t_index;
    arena_blk *arena;
};

/* Returns n bytes of 16-byte aligned zeroed arena memory, or NULL. */
static void *arena_alloc(df_gguf *g, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_blk *b = g->arena;
    if (!b || b->cap - b->used < n) {
        /* blocks grow from 4 KiB to 1 MiB so that tiny files stay cheap */
        size_t grow = b ? (b->cap < (1u << 19) ? 2 * b->cap : (1u << 20)) : 4096;
        size_t cap = n > grow ? n : grow;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = g->arena;
        b->used = 0;
        b->cap = cap;
        g->arena = b;
    }
    void *p = b->mem + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Sizes the index for n names. Returns 0 or DF_ENOMEM. */
static int index_init(name_index *ix, uint64_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    ix->slot = calloc(cap, sizeof *ix->slot);
    ix->cap = cap;
    return ix->slot ? 0 : DF_ENOMEM;
}

/* Looks name up among entries whose name is the first member (a const
 * char *) of structs of `stride` bytes at base. Returns the entry index or
 * -1; *slot is where the name is or would go. */
static int index_find(const name_index *ix, const void *base, size_t stride, const char *name,
                      uint32_t *slot) {
    uint32_t m = ix->cap - 1, s = (uint32_t)hash_str(name) & m;
    while (ix->slot && ix->slot[s]) {
        int i = (int)ix->slot[s] - 1;
        const char *n;
        memcpy(&n, (const char *)base + (size_t)i * stride, sizeof n);
        if (strcmp(n, name) == 0) {
            *slot = s;
            return i;
        }
        s = (s + 1) & m;
    }
    *slot = s;
    return -1;
}
#define KV_FIND(f, name, slot) index_find(&(f)->kv_index, (f)->kv, sizeof(df_gguf_kv), (name), (slot))
#define T_FIND(g, name, slot) index_find(&(g)->t_index, (g)->tensors, sizeof(df_gguf_tensor), (name), (slot))

/* ---- cursor ------------------------------------------------------------ */

typedef struct {
    df_gguf *g;
    const uint8_t *p;
    size_t size, pos;
    const char *file;
    char *err;
    size_t errlen;
} cursor;

/* Ensures n bytes remain; what/ctx name the item for the message. */
static int need(cursor *c, uint64_t n, const char *what, const char *ctx) {
    if (n <= c->size - c->pos) return 0;
    return df_err(c->err, c->errlen, DF_EFORMAT,
                  "%s: truncated: %s%s%s at offset %zu needs %" PRIu64 " bytes, %zu left", c->file,
                  what, ctx ? " of " : "", ctx ? ctx : "", c->pos, n, c->size - c->pos);
}

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what, const char *ctx) {
    int rc = need(c, 4, what, ctx);
    if (rc) return rc;
    *v = (uint32_t)rd_le(c->p + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what, const char *ctx) {
    int rc = need(c, 8, what, ctx);
    if (rc) return rc;
    *v = rd_le(c->p + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* Reads a GGUF string (u64 length + bytes) into an arena copy. */
static int rd_str(cursor *c, df_gguf_str *out, const char *what, const char *ctx) {
    uint64_t len;
    int rc = rd_u64(c, &len, what, ctx);
    if (rc) return rc;
    if (len > c->size - c->pos)
        return df_err(c->err, c->errlen, DF_EFORMAT,
                      "%s: %s%s%s at offset %zu: string length %" PRIu64
                      " exceeds the %zu bytes left in the file",
                      c->file, what, ctx ? " of " : "", ctx ? ctx : "", c->pos - 8, len,
                      c->size - c->pos);
    char *s = arena_alloc(c->g, (size_t)len + 1);
    if (!s) return df_err(c->err, c->errlen, DF_ENOMEM, "%s: out of memory", c->file);
    memcpy(s, c->p + c->pos, (size_t)len);
    s[len] = 0;
    c->pos += (size_t)len;
    out->s = s;
    out->len = len;
    return 0;
}

/* Bytes a value of this type takes at least (for count checks). */
static uint64_t min_encoded(int type) {
    if (type == DF_GGUF_STRING) return 8;
    if (type == DF_GGUF_ARRAY) return 12;
    return (uint64_t)value_size(type);
}

/* Reads a value of the given type (already read). key names it. */
static int rd_value(cursor *c, int type, df_gguf_value *v, const char *key, int depth) {
    int rc, sz = value_size(type);
    v->type = type;
    if (sz) {
        if ((rc = need(c, (uint64_t)sz, "value", key))) return rc;
        uint64_t raw = rd_le(c->p + c->pos, sz);
        c->pos += (size_t)sz;
        switch (type) {
        case DF_GGUF_UINT8: case DF_GGUF_UINT16: case DF_GGUF_UINT32: case DF_GGUF_UINT64:
            v->v.u = raw;
            break;
        case DF_GGUF_INT8: v->v.i = (int8_t)raw; break;
        case DF_GGUF_INT16: v->v.i = (int16_t)raw; break;
        case DF_GGUF_INT32: v->v.i = (int32_t)raw; break;
        case DF_GGUF_INT64: memcpy(&v->v.i, &raw, 8); break;
        case DF_GGUF_FLOAT32: {
            uint32_t r32 = (uint32_t)raw;
            float f;
            memcpy(&f, &r32, 4);
            v->v.f = f;
            break;
        }
        case DF_GGUF_FLOAT64: memcpy(&v->v.f, &raw, 8); break;
        case DF_GGUF_BOOL:
            if (raw > 1)
                return df_err(c->err, c->errlen, DF_EFORMAT,
                              "%s: key '%s': bool value must be 0 or 1, found %u", c->file, key,
                              (unsigned)raw);
            v->v.b = (int)raw;
            break;
        }
        return 0;
    }
    if (type == DF_GGUF_STRING) return rd_str(c, &v->v.str, "string value", key);
    if (type != DF_GGUF_ARRAY)
        return df_err(c->err, c->errlen, DF_EFORMAT,
                      "%s: key '%s': unknown value type %d (expected 0..12)", c->file, key, type);
    if (depth >= MAX_NEST)
        return df_err(c->err, c->errlen, DF_EFORMAT,
                      "%s: key '%s': arrays nested deeper than %d", c->file, key, MAX_NEST);
    uint32_t et;
    uint64_t n;
    if ((rc = rd_u32(c, &et, "array element type", key))) return rc;
    if ((rc = rd_u64(c, &n, "array length", key))) return rc;
    if (et >= DF_GGUF_N_VALUE_TYPES)
        return df_err(c->err, c->errlen, DF_EFORMAT,
                      "%s: key '%s': unknown array element type %u (expected 0..12)", c->file, key,
                      et);
    uint64_t left = c->size - c->pos, me = min_encoded((int)et);
    if (n > left / me)
        return df_err(c->err, c->errlen, DF_EFORMAT,
                      "%s: key '%s': array of %" PRIu64 " %s needs at least %" PRIu64
                      " bytes per element, only %" PRIu64 " bytes left",
                      c->file, key, n, df_gguf_value_type_name((int)et), me, left);
    v->elem_type = (int)et;
    v->n = n;
    if ((sz = value_size((int)et))) {
        v->raw = c->p + c->pos;
        if (et == DF_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (v->raw[i] > 1)
                    return df_err(c->err, c->errlen, DF_EFORMAT,
                                  "%s: key '%s': bool element %" PRIu64 " must be 0 or 1, found %u",
                                  c->file, key, i, v->raw[i]);
        c->pos += (size_t)(n * (uint64_t)sz);
        return 0;
    }
    if (et == DF_GGUF_STRING) {
        df_gguf_str *s = arena_alloc(c->g, (size_t)n * sizeof *s);
        if (!s) return df_err(c->err, c->errlen, DF_ENOMEM, "%s: out of memory", c->file);
        for (uint64_t i = 0; i < n; i++)
            if ((rc = rd_str(c, &s[i], "array string", key))) return rc;
        v->strs = s;
        return 0;
    }
    df_gguf_value *a = arena_alloc(c->g, (size_t)n * sizeof *a);
    if (!a) return df_err(c->err, c->errlen, DF_ENOMEM, "%s: out of memory", c->file);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t t2 = DF_GGUF_ARRAY;
        if ((rc = rd_value(c, (int)t2, &a[i], key, depth + 1))) return rc;
    }
    v->vals = a;
    return 0;
}

/* ---- one file ---------------------------------------------------------- */

static const df_gguf_kv *file_find(const gguf_file *f, const char *key) {
    uint32_t slot;
    int found = f->kv ? KV_FIND(f, key, &slot) : -1;
    return found >= 0 ? &f->kv[found] : NULL;
}

static int cmp_by_offset(const void *a, const void *b) {
    const df_gguf_tensor *x = *(const df_gguf_tensor *const *)a, *y = *(const df_gguf_tensor *const *)b;
    return x->file_offset < y->file_offset ? -1 : x->file_offset > y->file_offset;
}

/* Grows g->tensors to hold n more. */
static int reserve_tensors(df_gguf *g, uint64_t more, const char *file, char *err, size_t errlen) {
    uint64_t want = (uint64_t)g->n_tensors + more;
    if (want > INT32_MAX)
        return df_err(err, errlen, DF_EFORMAT, "%s: %" PRIu64 " tensors in total is too many", file,
                      want);
    if (want <= (uint64_t)g->cap_tensors) return 0;
    df_gguf_tensor *t = realloc(g->tensors, (size_t)want * sizeof *t);
    if (!t) return df_err(err, errlen, DF_ENOMEM, "%s: out of memory", file);
    g->tensors = t;
    g->cap_tensors = (int)want;
    return 0;
}

/* Parses and validates file fi of g (data/size/path already set). Appends
 * its tensors to g's table (names unique across files). */
static int parse_file(df_gguf *g, int fi, char *err, size_t errlen) {
    gguf_file *f = &g->files[fi];
    cursor c = {g, f->data, f->size, 0, f->path, err, errlen};
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    int rc;

    if (f->size < 4 || (magic = (uint32_t)rd_le(f->data, 4)) != GGUF_MAGIC) {
        char got[9] = "";
        for (size_t i = 0; i < 4 && i < f->size; i++)
            snprintf(got + 2 * i, 3, "%02x", f->data[i]);
        return df_err(err, errlen, DF_EFORMAT,
                      "%s: not a GGUF file: magic expected 47475546 (\"GGUF\"), found %s%s", f->path,
                      f->size ? got : "an empty file", f->size && f->size < 4 ? " (short)" : "");
    }
    c.pos = 4;
    if ((rc = rd_u32(&c, &version, "version", NULL))) return rc;
    if (version == 0x02000000u || version == 0x03000000u)
        return df_err(err, errlen, DF_EUNSUPPORTED,
                      "%s: big-endian GGUF is not supported (version field %08x)", f->path, version);
    if (version == 1)
        return df_err(err, errlen, DF_EUNSUPPORTED,
                      "%s: GGUF version 1 is not supported (expected 2 or 3)", f->path);
    if (version != 2 && version != 3)
        return df_err(err, errlen, DF_EFORMAT, "%s: GGUF version expected 2 or 3, found %u",
                      f->path, version);
    f->version = version;
    if ((rc = rd_u64(&c, &n_tensors, "tensor count", NULL))) return rc;
    if ((rc = rd_u64(&c, &n_kv, "metadata count", NULL))) return rc;
    /* Smallest kv: key length (8) + 1-byte key + type (4) + 1-byte value. */
    if (n_kv > (c.size - c.pos) / 14)
        return df_err(err, errlen, DF_EFORMAT,
                      "%s: metadata count %" PRIu64 " cannot fit in the %zu bytes left (at most %zu)",
                      f->path, n_kv, c.size - c.pos, (c.size - c.pos) / 14);
    /* Smallest tensor info: name length (8) + 1-byte name + n_dims (4) + type (4) + offset (8). */
    if (n_tensors > (c.size - c.pos) / 25)
        return df_err(err, errlen, DF_EFORMAT,
                      "%s: tensor count %" PRIu64 " cannot fit in the %zu bytes left (at most %zu)",
                      f->path, n_tensors, c.size - c.pos, (c.size - c.pos) / 25);

    /* metadata */
    f->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *f->kv);
    if (!f->kv || index_init(&f->kv_index, n_kv))
        return df_err(err, errlen, DF_ENOMEM, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < n_kv; i++) {
        df_gguf_str key;
        uint32_t type;
        char ctx[48];
        snprintf(ctx, sizeof ctx, "metadata entry %" PRIu64, i);
        if ((rc = rd_str(&c, &key, "key", ctx))) return rc;
        if (key.len == 0 || strlen(key.s) != key.len)
            return df_err(err, errlen, DF_EFORMAT, "%s: %s: key is empty or contains a NUL byte",
                          f->path, ctx);
        if ((rc = rd_u32(&c, &type, "value type", key.s))) return rc;
        if (type >= DF_GGUF_N_VALUE_TYPES)
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: key '%s': unknown value type %u (expected 0..12)", f->path, key.s,
                          type);
        df_gguf_kv *kv = &f->kv[i];
        kv->key = key.s;
        if ((rc = rd_value(&c, (int)type, &kv->val, key.s, 0))) return rc;
        uint32_t slot_;
        int found = KV_FIND(f, key.s, &slot_);
        if (found >= 0)
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: duplicate metadata key '%s' (entries %d and %" PRIu64 ")", f->path,
                          key.s, found, i);
        f->kv_index.slot[slot_] = (uint32_t)i + 1;
        f->n_kv = (int)i + 1;
    }

    f->alignment = DF_GGUF_DEFAULT_ALIGNMENT;
    const df_gguf_kv *al = file_find(f, "general.alignment");
    if (al) {
        if (al->val.type != DF_GGUF_UINT32)
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: key 'general.alignment': expected uint32, found %s", f->path,
                          df_gguf_value_type_name(al->val.type));
        uint64_t a = al->val.v.u;
        if (a == 0 || (a & (a - 1)))
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: key 'general.alignment': expected a power of two, found %" PRIu64,
                          f->path, a);
        f->alignment = (uint32_t)a;
    }

    /* tensor infos */
    if ((rc = reserve_tensors(g, n_tensors, f->path, err, errlen))) return rc;
    int first = g->n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        df_gguf_tensor *t = &g->tensors[g->n_tensors];
        df_gguf_str name;
        uint32_t n_dims, type;
        char ctx[48];
        memset(t, 0, sizeof *t);
        snprintf(ctx, sizeof ctx, "tensor info %" PRIu64, i);
        if ((rc = rd_str(&c, &name, "name", ctx))) return rc;
        if (name.len == 0 || strlen(name.s) != name.len)
            return df_err(err, errlen, DF_EFORMAT, "%s: %s: name is empty or contains a NUL byte",
                          f->path, ctx);
        t->name = name.s;
        if ((rc = rd_u32(&c, &n_dims, "n_dims", name.s))) return rc;
        if (n_dims > DF_GGUF_MAX_DIMS)
            return df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': n_dims expected <= %d, found %u",
                          f->path, name.s, DF_GGUF_MAX_DIMS, n_dims);
        t->n_dims = (int)n_dims;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        uint64_t nel = 1;
        int overflow = 0;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne;
            if ((rc = rd_u64(&c, &ne, "dimension", name.s))) return rc;
            if (ne > (uint64_t)INT64_MAX)
                return df_err(err, errlen, DF_EFORMAT,
                              "%s: tensor '%s': dimension %u is %" PRIu64 ", larger than INT64_MAX",
                              f->path, name.s, d, ne);
            t->ne[d] = (int64_t)ne;
            overflow |= __builtin_mul_overflow(nel, ne, &nel);
        }
        if (overflow || nel > (uint64_t)INT64_MAX)
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: tensor '%s': element count [%" PRId64 ", %" PRId64 ", %" PRId64
                          ", %" PRId64 "] overflows",
                          f->path, name.s, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        if ((rc = rd_u32(&c, &type, "type", name.s))) return rc;
        int blck, bsize;
        if (df_gguf_type_size((int)type, &blck, &bsize))
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: tensor '%s': unknown GGML type %u (expected an id of "
                          "GGMLQuantizationType, 0..%d)",
                          f->path, name.s, type, DF_GGML_N_TYPES - 1);
        t->type = (int)type;
        if (t->ne[0] % blck)
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: tensor '%s': row length ne[0]=%" PRId64
                          " is not a multiple of the %s block size %d",
                          f->path, name.s, t->ne[0], TYPES[type].name, blck);
        uint64_t nb = (uint64_t)(t->ne[0] / blck), bytes;
        overflow = __builtin_mul_overflow(nb, (uint64_t)bsize, &bytes);
        for (int d = 1; d < 4; d++) overflow |= __builtin_mul_overflow(bytes, (uint64_t)t->ne[d], &bytes);
        if (overflow)
            return df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': byte size overflows", f->path,
                          name.s);
        t->nbytes = bytes;
        uint64_t off;
        if ((rc = rd_u64(&c, &off, "offset", name.s))) return rc;
        if (off % f->alignment)
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %u",
                          f->path, name.s, off, f->alignment);
        t->file_offset = off; /* relative for now */
        t->file_index = fi;
        uint32_t slot_;
        int found = T_FIND(g, name.s, &slot_);
        if (found >= 0)
            return df_err(err, errlen, DF_EFORMAT, "%s: duplicate tensor name '%s'%s%s", f->path,
                          name.s, g->tensors[found].file_index != fi ? ", also in " : "",
                          g->tensors[found].file_index != fi
                              ? g->files[g->tensors[found].file_index].path
                              : "");
        g->t_index.slot[slot_] = (uint32_t)g->n_tensors + 1;
        g->n_tensors++;
    }

    /* data section */
    uint64_t a = f->alignment;
    f->data_off = ((uint64_t)c.pos + a - 1) / a * a;
    for (int i = first; i < g->n_tensors; i++) {
        df_gguf_tensor *t = &g->tensors[i];
        uint64_t start = f->data_off + t->file_offset, end;
        if (start < f->data_off || __builtin_add_overflow(start, t->nbytes, &end) || end > f->size)
            return df_err(err, errlen, DF_EFORMAT,
                          "%s: tensor '%s' (%s [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                          "]): data at offset %" PRIu64 " + %" PRIu64
                          " bytes ends past the end of the file (size %zu)",
                          f->path, t->name, TYPES[t->type].name, t->ne[0], t->ne[1], t->ne[2],
                          t->ne[3], f->data_off + t->file_offset, t->nbytes, f->size);
        t->file_offset = start;
        t->data = f->data + start;
    }
    /* overlaps: sort this file's tensors by offset */
    int nt = g->n_tensors - first;
    if (nt > 1) {
        df_gguf_tensor **order = malloc((size_t)nt * sizeof *order);
        if (!order) return df_err(err, errlen, DF_ENOMEM, "%s: out of memory", f->path);
        for (int i = 0; i < nt; i++) order[i] = &g->tensors[first + i];
        qsort(order, (size_t)nt, sizeof *order, cmp_by_offset);
        const df_gguf_tensor *prev = NULL;
        for (int i = 0; i < nt && !rc; i++) {
            const df_gguf_tensor *t = order[i];
            if (!t->nbytes) continue;
            if (prev && prev->file_offset + prev->nbytes > t->file_offset)
                rc = df_err(err, errlen, DF_EFORMAT,
                            "%s: tensor '%s' [%" PRIu64 ", +%" PRIu64 ") overlaps tensor '%s' [%" PRIu64
                            ", +%" PRIu64 ")",
                            f->path, t->name, t->file_offset, t->nbytes, prev->name,
                            prev->file_offset, prev->nbytes);
            prev = t;
        }
        free(order);
    }
    return rc;
}

/* ---- open / close ------------------------------------------------------ */

static df_gguf *new_handle(int n_files) {
    df_gguf *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->files = calloc((size_t)n_files, sizeof *g->files);
    if (!g->files) {
        free(g);
        return NULL;
    }
    for (int i = 0; i < n_files; i++) g->files[i].map.fd = -1;
    return g;
}

void df_gguf_close(df_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_files; i++) {
        gguf_file *f = &g->files[i];
        if (f->map.fd >= 0 || f->map.data) df_unmap_file(&f->map);
        free(f->path);
        free(f->kv);
        free(f->kv_index.slot);
    }
    free(g->files);
    free(g->tensors);
    free(g->t_index.slot);
    while (g->arena) {
        arena_blk *n = g->arena->next;
        free(g->arena);
        g->arena = n;
    }
    free(g);
}

/* Grows the tensor-name index so that it can hold n names at <= 50% load.
 * Rebuilds from g->tensors. */
static int grow_t_index(df_gguf *g, uint64_t n) {
    if (g->t_index.slot && (uint64_t)g->t_index.cap >= 2 * n) return 0;
    free(g->t_index.slot);
    if (index_init(&g->t_index, n)) return DF_ENOMEM;
    for (int i = 0; i < g->n_tensors; i++) {
        uint32_t slot_;
        (void)T_FIND(g, g->tensors[i].name, &slot_);
        g->t_index.slot[slot_] = (uint32_t)i + 1;
    }
    return 0;
}

/* Sizes the name index from the file's declared tensor count (bounded by
 * the file size) and parses it. */
static int load_file(df_gguf *g, int fi, char *err, size_t errlen) {
    gguf_file *f = &g->files[fi];
    uint64_t declared = f->size >= 24 ? rd_le(f->data + 8, 8) : 0;
    if (declared > f->size / 25) declared = f->size / 25; /* parse_file reports it */
    if (grow_t_index(g, (uint64_t)g->n_tensors + declared))
        return df_err(err, errlen, DF_ENOMEM, "%s: out of memory", f->path);
    return parse_file(g, fi, err, errlen);
}

int df_gguf_open_mem(const void *data, size_t size, const char *name, df_gguf **out, char *err,
                     size_t errlen) {
    *out = NULL;
    df_gguf *g = new_handle(1);
    if (!g) return df_err(err, errlen, DF_ENOMEM, "%s: out of memory", name);
    g->n_files = 1;
    g->files[0].data = size ? data : (const uint8_t *)"";
    g->files[0].size = size;
    g->files[0].path = strdup(name ? name : "<memory>");
    int rc = g->files[0].path ? load_file(g, 0, err, errlen)
                              : df_err(err, errlen, DF_ENOMEM, "out of memory");
    if (rc) {
        df_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* Reads an integer key of file f into *v: 1 found, 0 absent, <0 error. */
static int file_int(const gguf_file *f, const char *key, int64_t *v, char *err, size_t errlen) {
    const df_gguf_kv *kv = file_find(f, key);
    if (!kv) return 0;
    if (df_gguf_value_i64(&kv->val, v))
        return df_err(err, errlen, DF_EFORMAT, "%s: key '%s': expected an integer, found %s",
                      f->path, key, df_gguf_value_type_name(kv->val.type));
    return 1;
}

/* Finds "-NNNNN-of-MMMMM.gguf" at the end of path; returns the position of
 * the first N digit or -1, with the part number and count. */
static long split_pattern(const char *path, int *no, int *count) {
    size_t len = strlen(path);
    const char *suf = "-00000-of-00000.gguf";
    size_t sl = strlen(suf);
    if (len < sl) return -1;
    const char *p = path + len - sl;
    for (size_t i = 0; i < sl; i++) {
        if (suf[i] == '0') {
            if (p[i] < '0' || p[i] > '9') return -1;
        } else if (p[i] != suf[i]) {
            return -1;
        }
    }
    *no = atoi(p + 1);
    *count = atoi(p + 10);
    return (long)(p + 1 - path);
}

int df_gguf_open(const char *path, df_gguf **out, char *err, size_t errlen) {
    *out = NULL;
    df_gguf *g = new_handle(1);
    if (!g) return df_err(err, errlen, DF_ENOMEM, "%s: out of memory", path);
    int rc = df_map_file(path, &g->files[0].map, err, errlen);
    if (rc) {
        df_gguf_close(g);
        return rc;
    }
    g->n_files = 1;
    g->files[0].data = g->files[0].map.data ? g->files[0].map.data : (const uint8_t *)"";
    g->files[0].size = g->files[0].map.size;
    g->files[0].path = strdup(path);
    if (!g->files[0].path) rc = df_err(err, errlen, DF_ENOMEM, "out of memory");
    if (!rc) rc = load_file(g, 0, err, errlen);

    /* split parts */
    int64_t count = 1, no = 0, total = -1;
    if (!rc && (rc = file_int(&g->files[0], "split.count", &count, err, errlen)) > 0) rc = 0;
    if (!rc && (rc = file_int(&g->files[0], "split.no", &no, err, errlen)) > 0) rc = 0;
    if (!rc && (rc = file_int(&g->files[0], "split.tensors.count", &total, err, errlen)) > 0) rc = 0;
    if (!rc && (count < 1 || count > 99999))
        rc = df_err(err, errlen, DF_EFORMAT, "%s: key 'split.count': expected 1..99999, found %" PRId64,
                    path, count);
    if (!rc && count > 1) {
        int pno = 0, pcount = 0;
        long at = split_pattern(path, &pno, &pcount);
        if (no != 0)
            rc = df_err(err, errlen, DF_EINPUT,
                        "%s: this is part %" PRId64 " of a %" PRId64
                        "-part split model; open the first part (-00001-of-...)",
                        path, no + 1, count);
        else if (at < 0 || pno != 1 || pcount != count)
            rc = df_err(err, errlen, DF_EFORMAT,
                        "%s: split.count is %" PRId64
                        " but the name does not end in -00001-of-%05d.gguf",
                        path, count, (int)count);
        gguf_file *files = rc ? NULL : realloc(g->files, (size_t)count * sizeof *files);
        if (!rc && !files) rc = df_err(err, errlen, DF_ENOMEM, "%s: out of memory", path);
        if (!rc) {
            g->files = files;
            memset(files + 1, 0, (size_t)(count - 1) * sizeof *files);
            for (int i = 1; i < count; i++) files[i].map.fd = -1;
        }
        for (int i = 1; !rc && i < count; i++) {
            char *pp = strdup(path);
            if (!pp) {
                rc = df_err(err, errlen, DF_ENOMEM, "out of memory");
                break;
            }
            char num[12];
            snprintf(num, sizeof num, "%05d", i + 1);
            memcpy(pp + at, num, 5);
            gguf_file *f = &g->files[i];
            g->n_files = i + 1;
            f->path = pp;
            if ((rc = df_map_file(pp, &f->map, err, errlen))) break;
            f->data = f->map.data ? f->map.data : (const uint8_t *)"";
            f->size = f->map.size;
            if ((rc = load_file(g, i, err, errlen))) break;
            int64_t c2 = -1, n2 = -1;
            if ((rc = file_int(f, "split.count", &c2, err, errlen)) < 0) break;
            if ((rc = file_int(f, "split.no", &n2, err, errlen)) < 0) break;
            rc = 0;
            if (c2 != count || n2 != i)
                rc = df_err(err, errlen, DF_EFORMAT,
                            "%s: expected split.no %d and split.count %" PRId64 ", found %" PRId64
                            " and %" PRId64,
                            pp, i, count, n2, c2);
        }
    }
    if (!rc && total >= 0 && total != g->n_tensors)
        rc = df_err(err, errlen, DF_EFORMAT,
                    "%s: split.tensors.count is %" PRId64 " but the %d part(s) hold %d tensors", path,
                    total, g->n_files, g->n_tensors);
    if (rc) {
        df_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

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
    return (uint64_t)(t->ne[0] / TYPES[t->type].blck) * (uint64_t)TYPES[t->type].size;
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
