/* gguf.h - reader for GGUF files (versions 2 and 3, little-endian).
 *
 * A GGUF file is: magic "GGUF", u32 version, u64 tensor count, u64 metadata
 * count, the metadata key/value pairs, the tensor infos (name, dims, GGML
 * type, offset), padding to `general.alignment` (default 32), then the
 * tensor data. The reader maps the file read-only and validates everything
 * before handing out a pointer: every count against the bytes left, every
 * string length, every tensor's type, shape, alignment and extent, overlaps
 * between tensors and duplicate keys and names. Any violation is one line
 * naming the file, the key or tensor, and what was expected vs found.
 *
 * Invariants of an open df_gguf:
 *   - every df_gguf_tensor's data[0..nbytes) lies inside its file's mapping,
 *     is aligned (relative to the data section) to the file's alignment, and
 *     overlaps no other tensor of that file;
 *   - tensor names are unique across all split parts; keys are unique;
 *   - every string handed out is NUL-terminated (a copy; len is the stored
 *     length, which may include embedded NULs);
 *   - ne[] dims beyond n_dims are 1; ne[0] (the row length, innermost) is a
 *     multiple of the type's block size.
 * Split models (name-00001-of-0000N.gguf) are opened through their first
 * part; the parts' tensors form one table, the metadata is the first part's.
 * Nothing here knows whether our kernels can execute a type: that is
 * df_ggml_traits_of() in backend/ggml_quant.h.
 */
#ifndef DF_FORMAT_GGUF_H
#define DF_FORMAT_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Metadata value types, as numbered by the GGUF specification. */
enum {
    DF_GGUF_UINT8 = 0,
    DF_GGUF_INT8 = 1,
    DF_GGUF_UINT16 = 2,
    DF_GGUF_INT16 = 3,
    DF_GGUF_UINT32 = 4,
    DF_GGUF_INT32 = 5,
    DF_GGUF_FLOAT32 = 6,
    DF_GGUF_BOOL = 7,
    DF_GGUF_STRING = 8,
    DF_GGUF_ARRAY = 9,
    DF_GGUF_UINT64 = 10,
    DF_GGUF_INT64 = 11,
    DF_GGUF_FLOAT64 = 12,
    DF_GGUF_N_VALUE_TYPES
};

/* GGML tensor types (ids as in gguf-py's GGMLQuantizationType). */
enum {
    DF_GGML_F32 = 0, DF_GGML_F16 = 1, DF_GGML_Q4_0 = 2, DF_GGML_Q4_1 = 3,
    DF_GGML_Q5_0 = 6, DF_GGML_Q5_1 = 7, DF_GGML_Q8_0 = 8, DF_GGML_Q8_1 = 9,
    DF_GGML_Q2_K = 10, DF_GGML_Q3_K = 11, DF_GGML_Q4_K = 12, DF_GGML_Q5_K = 13,
    DF_GGML_Q6_K = 14, DF_GGML_Q8_K = 15, DF_GGML_IQ2_XXS = 16, DF_GGML_IQ2_XS = 17,
    DF_GGML_IQ3_XXS = 18, DF_GGML_IQ1_S = 19, DF_GGML_IQ4_NL = 20, DF_GGML_IQ3_S = 21,
    DF_GGML_IQ2_S = 22, DF_GGML_IQ4_XS = 23, DF_GGML_I8 = 24, DF_GGML_I16 = 25,
    DF_GGML_I32 = 26, DF_GGML_I64 = 27, DF_GGML_F64 = 28, DF_GGML_IQ1_M = 29,
    DF_GGML_BF16 = 30, DF_GGML_TQ1_0 = 34, DF_GGML_TQ2_0 = 35, DF_GGML_MXFP4 = 39,
    DF_GGML_NVFP4 = 40, DF_GGML_Q1_0 = 41,
    DF_GGML_N_TYPES = 42 /* one past the largest id */
};

#define DF_GGUF_MAX_DIMS 4
#define DF_GGUF_DEFAULT_ALIGNMENT 32

/* A string: s is NUL-terminated, len excludes the terminator. */
typedef struct {
    const char *s;
    uint64_t len;
} df_gguf_str;

/* One metadata value. For arrays, elem_type/n describe the elements and
 * exactly one of raw/strs/vals is set according to elem_type. */
typedef struct df_gguf_value {
    int type; /* DF_GGUF_* */
    union {
        uint64_t u;  /* UINT8..UINT64 */
        int64_t i;   /* INT8..INT64 */
        double f;    /* FLOAT32 (exactly widened), FLOAT64 */
        int b;       /* BOOL: 0 or 1 */
        df_gguf_str str;
    } v;
    /* ARRAY only: */
    int elem_type;
    uint64_t n;
    const uint8_t *raw;                /* numeric/bool elements, little-endian, unaligned, in the map */
    const df_gguf_str *strs;           /* STRING elements */
    const struct df_gguf_value *vals;  /* ARRAY elements (nested arrays) */
} df_gguf_value;

typedef struct {
    const char *key;
    df_gguf_value val;
} df_gguf_kv;

typedef struct {
    const char *name;
    int type;             /* DF_GGML_* (always a known id; maybe not executable) */
    int n_dims;           /* 0..4 */
    int64_t ne[4];        /* ne[0] innermost (row length); unused dims are 1 */
    const uint8_t *data;  /* [nbytes] inside file file_index's mapping */
    uint64_t nbytes;
    uint64_t file_offset; /* absolute byte offset of data in its file */
    int file_index;       /* split part, 0-based */
} df_gguf_tensor;

typedef struct df_gguf df_gguf;

/* Opens path (mapping it) and validates it. If path is the first part of a
 * split model (...-00001-of-0000N.gguf with split.count N), opens and
 * validates every part too. Returns 0 and *out, or a negative DF_E* code
 * (DF_EFORMAT malformed, DF_EUNSUPPORTED valid but unsupported e.g. v1 or
 * big-endian, DF_EIO, DF_ENOMEM) with a one-line message in err. */
int df_gguf_open(const char *path, df_gguf **out, char *err, size_t errlen);

/* Same over bytes already in memory (no split handling). data must outlive
 * the handle; name is used in messages. */
int df_gguf_open_mem(const void *data, size_t size, const char *name, df_gguf **out,
                     char *err, size_t errlen);

void df_gguf_close(df_gguf *g);

/* File facts. */
uint32_t df_gguf_version(const df_gguf *g);
uint32_t df_gguf_alignment(const df_gguf *g); /* of the first part */
int df_gguf_n_files(const df_gguf *g);
const char *df_gguf_path(const df_gguf *g, int file_index);
/* The whole-file mapping of part i (NULL for in-memory or resident files). */
const uint8_t *df_gguf_file_data(const df_gguf *g, int file_index, size_t *size);
uint64_t df_gguf_data_offset(const df_gguf *g, int file_index); /* start of the data section */

/* ---- metadata ---------------------------------------------------------- */

int df_gguf_n_kv(const df_gguf *g);
const df_gguf_kv *df_gguf_kv_at(const df_gguf *g, int i);
/* NULL if absent. */
const df_gguf_kv *df_gguf_find(const df_gguf *g, const char *key);

/* Typed getters. Each returns 1 when the key is present and was converted,
 * 0 when absent (*out untouched), or DF_EFORMAT when present with the wrong
 * type or a value out of range (message in err). Integer getters accept any
 * integer type; the float getter accepts floats and integers; bool accepts
 * BOOL only. */
int df_gguf_get_str(const df_gguf *g, const char *key, const char **out, char *err, size_t errlen);
int df_gguf_get_u32(const df_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen);
int df_gguf_get_i64(const df_gguf *g, const char *key, int64_t *out, char *err, size_t errlen);
int df_gguf_get_f32(const df_gguf *g, const char *key, float *out, char *err, size_t errlen);
int df_gguf_get_bool(const df_gguf *g, const char *key, int *out, char *err, size_t errlen);
/* Arrays. The string array points into the handle; the numeric ones are
 * malloc'd conversions the caller frees (any integer element type for i32/
 * i64, range-checked; float or integer elements for f32). */
int df_gguf_get_arr_str(const df_gguf *g, const char *key, const df_gguf_str **out, uint64_t *n,
                        char *err, size_t errlen);
int df_gguf_get_arr_i32(const df_gguf *g, const char *key, int32_t **out, uint64_t *n, char *err,
                        size_t errlen);
int df_gguf_get_arr_i64(const df_gguf *g, const char *key, int64_t **out, uint64_t *n, char *err,
                        size_t errlen);
int df_gguf_get_arr_f32(const df_gguf *g, const char *key, float **out, uint64_t *n, char *err,
                        size_t errlen);

/* Value helpers: convert one scalar value (0 ok, DF_EFORMAT wrong type or
 * out of range), element i of a numeric array likewise. */
int df_gguf_value_i64(const df_gguf_value *v, int64_t *out);
int df_gguf_value_f64(const df_gguf_value *v, double *out);
int df_gguf_array_i64(const df_gguf_value *v, uint64_t i, int64_t *out);
int df_gguf_array_f64(const df_gguf_value *v, uint64_t i, double *out);

const char *df_gguf_value_type_name(int type); /* "uint8", ..., "?" */

/* ---- tensors ----------------------------------------------------------- */

int df_gguf_n_tensors(const df_gguf *g);
const df_gguf_tensor *df_gguf_tensor_at(const df_gguf *g, int i);
const df_gguf_tensor *df_gguf_tensor_find(const df_gguf *g, const char *name);
int64_t df_gguf_tensor_nelements(const df_gguf_tensor *t);
uint64_t df_gguf_tensor_row_bytes(const df_gguf_tensor *t); /* bytes of one ne[0] row */

/* GGML type facts known to the reader (storage size only). Returns 0 and
 * the block shape, or -1 for an unknown id. */
int df_gguf_type_size(int type, int *block_elems, int *block_bytes);
const char *df_gguf_type_name(int type); /* "Q4_K", ..., "?" */

#endif
