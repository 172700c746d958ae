/* gguf.c - GGUF v2/v3 reader: GGML type table, name index, open / close.
 * See gguf.h for the invariants it establishes; one file is parsed by
 * gguf_parse.c, read through gguf_access.c, internals in gguf_int.h.
 *
 * Parsing is one forward pass per file with a bounds-checked cursor: every
 * read first checks the bytes left, and every count is checked against the
 * smallest encoding its elements could have in the bytes left, so that no
 * allocation is sized by an untrusted number larger than the file. Strings
 * are copied (NUL-terminated) into an arena owned by the handle; numeric
 * arrays stay in the map. After the tensor infos, tensors are checked for
 * extent and alignment and sorted by offset to find overlaps.
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

/* ---- GGML type table ---------------------------------------------------
 * Storage shape of every GGML type id gguf-py knows. The reader needs it to
 * size tensors even when no kernel executes the type (IQ families...). */

const type_info gguf_types[DF_GGML_N_TYPES] = {
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
    if (type < 0 || type >= DF_GGML_N_TYPES || !gguf_types[type].name) return -1;
    if (block_elems) *block_elems = gguf_types[type].blck;
    if (block_bytes) *block_bytes = gguf_types[type].size;
    return 0;
}

const char *df_gguf_type_name(int type) {
    if (type < 0 || type >= DF_GGML_N_TYPES || !gguf_types[type].name) return "?";
    return gguf_types[type].name;
}

static const char *const VALUE_TYPE_NAMES[DF_GGUF_N_VALUE_TYPES] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};

const char *df_gguf_value_type_name(int type) {
    if (type < 0 || type >= DF_GGUF_N_VALUE_TYPES) return "?";
    return VALUE_TYPE_NAMES[type];
}

/* ---- handle ------------------------------------------------------------ */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Sizes the index for n names. Returns 0 or DF_ENOMEM. */
int gguf_index_init(name_index *ix, uint64_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    ix->slot = calloc(cap, sizeof *ix->slot);
    ix->cap = cap;
    return ix->slot ? 0 : DF_ENOMEM;
}

/* Looks name up among entries whose name is the first member (a const
 * char *) of structs of `stride` bytes at base. Returns the entry index or
 * -1; *slot is where the name is or would go. */
int gguf_index_find(const name_index *ix, const void *base, size_t stride, const char *name,
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
    if (gguf_index_init(&g->t_index, n)) return DF_ENOMEM;
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
    if (declared > f->size / 25) declared = f->size / 25; /* gguf_parse_file reports it */
    if (grow_t_index(g, (uint64_t)g->n_tensors + declared))
        return df_err(err, errlen, DF_ENOMEM, "%s: out of memory", f->path);
    return gguf_parse_file(g, fi, err, errlen);
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
