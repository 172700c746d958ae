/* store.h - the expert store on disk.
 *
 * `deltafin setup --from DIR --out STORE` writes STORE/manifest.json
 * (format version, source identity with per-file sha256, the config, spine
 * mode, every routed expert's location and xxh3 checksum, completeness),
 * STORE/spine.safetensors (every tensor that is not a routed expert, bytes
 * as shipped), the config/tokenizer files, and with --pack the expert packs:
 * per MoE layer and drive, each expert's tensors (with their scale
 * sidecars, in their shipped format) contiguous and 4 KiB-aligned, so one
 * O_DIRECT read fetches one expert. Without --pack the manifest points into
 * the source shards (direct mode, no second copy). Packs of a layer are
 * spread over --store-dirs so a layer's reads go to every drive at once.
 *
 * The manifest also records the spine's size, the xxh3 of its header and of
 * every spine tensor (format version 2); opening a store checks the header at
 * once and each tensor after the spine has been read into memory.
 *
 * A store is marked complete (manifest "complete": true, written by rename)
 * only after every blob was read back and its checksum verified. Setup is
 * resumable: finished layers are recorded in STORE/setup-state.json after
 * their packs were fsynced, and skipped on the next run. */
#ifndef DF_STORE_STORE_H
#define DF_STORE_STORE_H

#include "format/safetensors.h"
#include <stdint.h>

/* What the store needs to know about the model; the caller (which parses
 * the model's config) passes it in: the store sits below the model layer
 * and reads no config itself. */
typedef struct {
    int n_layers, n_experts;  /* routed experts: layers 0..n_layers-1, experts 0..n_experts-1 */
    const char *expert_fmt;   /* printf format of a routed expert's tensor-name prefix, %d layer then
                               * %d expert; each part is PREFIX.{proj}.{weight, weight_packed,
                               * weight_scale,weight_scale_inv}. NULL: DF_STORE_EXPERT_FMT */
    const char *proj[3];      /* the gate, up and down projections' names; NULL: gate_proj, up_proj, down_proj */
} df_store_layout;
#define DF_STORE_EXPERT_FMT "model.layers.%d.mlp.experts.%d"

/* The manifest's format_version this build writes and reads. Version 2 added
 * the spine checksums; version 1 stores are refused with a message. */
#define DF_STORE_FORMAT_VERSION 2

typedef struct {
    const char *from, *out;
    int pack;
    const char **dirs; /* pack directories (NULL: STORE/packs) */
    int n_dirs;
    int progress;      /* show a progress bar on stderr */
    int spine_int8;    /* --spine int8: row-int8 linear weights in the spine (NOT exact) */
    df_store_layout layout;
} df_store_opts;

int df_store_build(const df_store_opts *o, char *err, size_t errlen);

/* The spine checksums of an attached store (manifest "spine"."tensors"). */
typedef struct df_store_spine df_store_spine;

/* If dir is a store: validates its manifest.json as a whole (every field's
 * type and range; every expert part names a routed-expert tensor of its own
 * layer and expert; offsets and lengths inside the files; no duplicates;
 * counts within the layout; spine size and header checksum), adds its routed
 * experts to st as virtual tensors and returns 1 with *xxh3 =
 * [n_layers * n_experts] checksums (0 where no expert) and *spine, which the
 * caller passes to df_store_spine_verify once the spine's bytes are read and
 * then frees; 0 if dir is not a store; a negative DF_E* code on a bad or
 * incomplete store, with one line naming manifest.json, the field and the
 * expected vs actual value. */
int df_store_attach(const char *dir, df_st_set *st, const df_store_layout *lay, uint64_t **xxh3, int *spine_int8,
                    df_store_spine **spine, char *err, size_t errlen);
int df_is_store(const char *dir);

/* Checks the bytes of the spine's tensors against the manifest: names[i]
 * holds sizes[i] bytes at data[i]; every tensor the manifest records must be
 * given exactly once. Hashes on up to `threads` threads (xxh3 runs at memory
 * speed). DF_EFORMAT naming the file and tensor on a mismatch. */
int df_store_spine_verify(const df_store_spine *s, int n, const char *const *names, const uint8_t *const *data,
                          const uint64_t *sizes, int threads, char *err, size_t errlen);
void df_store_spine_free(df_store_spine *s);

#endif
