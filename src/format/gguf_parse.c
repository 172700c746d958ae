/* gguf_parse.c - parses one GGUF file: header, metadata key/values and the
 * tensor table, then checks tensor extent, alignment and overlap.
 *
 * Parsing is one forward pass with a bounds-checked cursor: every read
 * first checks the bytes left, and every count is checked against the
 * smallest encoding its elements could have in the bytes left, so that no
 * allocation is sized by an untrusted number larger than the file. Strings
 * are copied (NUL-terminated) into the handle's arena; numeric arrays stay
 * in the map. Every error is a one-line message naming file and field.
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

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define MAX_NEST 8             /* nested array depth we accept */

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
int gguf_parse_file(df_gguf *g, int fi, char *err, size_t errlen) {
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
    if (!f->kv || gguf_index_init(&f->kv_index, n_kv))
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
                          f->path, name.s, t->ne[0], gguf_types[type].name, blck);
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
                          f->path, t->name, gguf_types[t->type].name, t->ne[0], t->ne[1], t->ne[2],
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
