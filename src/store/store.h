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
 * A store is marked complete (manifest "complete": true, written by rename)
 * only after every blob was read back and its checksum verified. Setup is
 * resumable: finished layers are recorded in STORE/setup-state.json after
 * their packs were fsynced, and skipped on the next run. */
#ifndef DF_STORE_STORE_H
#define DF_STORE_STORE_H

#include "format/safetensors.h"
#include <stdint.h>

typedef struct {
    const char *from, *out;
    int pack;
    const char **dirs; /* pack directories (NULL: STORE/packs) */
    int n_dirs;
    int progress;      /* show a progress bar on stderr */
    int spine_int8;    /* --spine int8: row-int8 linear weights in the spine (NOT exact) */
} df_store_opts;

int df_store_build(const df_store_opts *o, char *err, size_t errlen);

/* If dir is a store: adds its routed experts to st as virtual tensors and
 * returns 1 with *xxh3 = [n_layers * n_experts] checksums (0 where no expert);
 * 0 if dir is not a store; a negative DF_E* code on a bad or incomplete store. */
int df_store_attach(const char *dir, df_st_set *st, int n_layers, int n_experts, uint64_t **xxh3, int *spine_int8, char *err, size_t errlen);
int df_is_store(const char *dir);

#endif
