/* safetensors.h - validated reader for safetensors files and sharded HF
 * checkpoints (model.safetensors.index.json).
 *
 * Invariants after a successful open: every tensor's byte range lies inside
 * its file's data section, ranges do not overlap, and nbytes equals the
 * product of the shape times the dtype size. Data is memory-mapped and never
 * modified. */
#ifndef DF_SAFETENSORS_H
#define DF_SAFETENSORS_H

#include "util/util.h"
#include <stdint.h>

typedef enum {
    DF_ST_F32, DF_ST_F16, DF_ST_BF16, DF_ST_F64,
    DF_ST_F8_E4M3, DF_ST_F8_E5M2,
    DF_ST_I8, DF_ST_U8, DF_ST_I16, DF_ST_I32, DF_ST_I64, DF_ST_BOOL,
    DF_ST_N_DTYPES
} df_st_dtype;

const char *df_st_dtype_name(df_st_dtype t);
int df_st_dtype_size(df_st_dtype t); /* bytes per element */

typedef struct {
    char *name;
    df_st_dtype dtype;
    int n_dims;
    int64_t shape[8];
    const uint8_t *data; /* into the mapping */
    uint64_t nbytes;
    uint64_t file_offset; /* absolute offset of data in its file */
    int file_index;       /* which shard */
} df_st_tensor;

typedef struct df_st_set df_st_set; /* all tensors of a checkpoint */

/* Opens one .safetensors file. */
df_st_set *df_st_open_file(const char *path, char *err, size_t errlen);
/* Opens a checkpoint directory: model.safetensors.index.json if present (all
 * shards it names, every weight_map entry checked against the shard), else
 * every *.safetensors file in the directory. */
df_st_set *df_st_open_dir(const char *dir, char *err, size_t errlen);
/* As df_st_open_dir, with resident = 1 reading every shard into engine-owned memory. */
df_st_set *df_st_open_dir2(const char *dir, int resident, char *err, size_t errlen);
/* Parses a header from memory (used by the fuzz target and by open_file).
 * buf holds the whole file. */
df_st_set *df_st_parse(const uint8_t *buf, size_t size, const char *name, char *err, size_t errlen);
void df_st_close(df_st_set *s);

int df_st_count(const df_st_set *s);
const df_st_tensor *df_st_at(const df_st_set *s, int i);
const df_st_tensor *df_st_find(const df_st_set *s, const char *name);
const char *df_st_file_path(const df_st_set *s, int file_index);
int df_st_file_fd(const df_st_set *s, int file_index);
int df_st_n_files(const df_st_set *s);
/* The file mapping of file i (NULL when it was read into memory instead). */
const uint8_t *df_st_file_data(const df_st_set *s, int i, size_t *size);
/* Drops the file mappings (tensor data pointers become invalid; names, shapes and offsets stay). */
void df_st_unmap(df_st_set *s);
/* Adds a tensor whose bytes stay on disk (data NULL): an expert of a store,
 * read later through the expert cache. path joins the file list (unmapped). */
int df_st_add_virtual(df_st_set *s, const char *name, df_st_dtype dtype, int n_dims, const int64_t *shape, const char *path,
                      uint64_t off, uint64_t nbytes, char *err, size_t errlen);
/* dtype by name ("BF16", ...); -1 if unknown. */
int df_st_dtype_from_name(const char *name);

#endif
