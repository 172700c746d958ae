/* gguf_int.h - internals of the GGUF reader shared by gguf.c (type table,
 * name index, open / close), gguf_parse.c (one file's header, metadata and
 * tensor table, validated) and gguf_access.c (accessors, typed getters).
 * Not a public header.
 *
 * Invariants: a df_gguf only exists fully validated (see gguf.h); strings
 * and small tables live in its arena until df_gguf_close; name indexes hold
 * entry index + 1 (0 = empty slot) in a power-of-two table.
 */
#ifndef DF_FORMAT_GGUF_INT_H
#define DF_FORMAT_GGUF_INT_H

#include "format/gguf.h"

#include "deltafin.h"
#include "util/util.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    const char *name;
    int blck; /* elements per block */
    int size; /* bytes per block */
} type_info;
extern const type_info gguf_types[DF_GGML_N_TYPES];

/* Encoded size of a fixed-size value type; 0 for STRING/ARRAY/unknown. */
static inline int value_size(int type) {
    switch (type) {
    case DF_GGUF_UINT8: case DF_GGUF_INT8: case DF_GGUF_BOOL: return 1;
    case DF_GGUF_UINT16: case DF_GGUF_INT16: return 2;
    case DF_GGUF_UINT32: case DF_GGUF_INT32: case DF_GGUF_FLOAT32: return 4;
    case DF_GGUF_UINT64: case DF_GGUF_INT64: case DF_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}
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

/* Sizes the index for n names. Returns 0 or DF_ENOMEM. */
int gguf_index_init(name_index *ix, uint64_t n);
/* Looks name up among entries whose name is the first member (a const
 * char *) of structs of `stride` bytes at base. Returns the entry index or
 * -1; *slot is where the name is or would go. */
int gguf_index_find(const name_index *ix, const void *base, size_t stride, const char *name, uint32_t *slot);
#define KV_FIND(f, name, slot) gguf_index_find(&(f)->kv_index, (f)->kv, sizeof(df_gguf_kv), (name), (slot))
#define T_FIND(g, name, slot) gguf_index_find(&(g)->t_index, (g)->tensors, sizeof(df_gguf_tensor), (name), (slot))

static inline uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline const df_gguf_kv *file_find(const gguf_file *f, const char *key) {
    uint32_t slot;
    int found = f->kv ? KV_FIND(f, key, &slot) : -1;
    return found >= 0 ? &f->kv[found] : NULL;
}

/* gguf_parse.c: parses and validates file fi of g (its data already set). */
int gguf_parse_file(df_gguf *g, int fi, char *err, size_t errlen);

#endif
