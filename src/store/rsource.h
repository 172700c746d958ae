/* rsource.h - an expert source whose experts are fetched on first use.
 *
 * It wraps another source (the expert cache over local files): before it
 * hands an acquire on, every asked-for expert that is not on local disk yet
 * is fetched (by the caller's fetch function: stream mode's hub ranges) into
 * its extents of the local files, which are sparse copies of the remote
 * ones. Local disk is a cache with a byte budget: when a fetch would exceed
 * it, the experts used least (counted per acquire, kept across runs) that
 * the current acquire does not need are evicted (their extents punched out
 * of the files). The bytes served are the remote file's bytes, so results
 * are those of a full install.
 *
 * State (which experts are on disk, use counts) lives in one small file.
 * Crash order: an expert is marked present only after its bytes were
 * fdatasynced; it is marked absent (and synced) before its bytes are
 * punched out. So a kill at any point leaves no expert marked present whose
 * bytes are not all there. Like the rest of src/store, this knows bytes and
 * extents only. */
#ifndef DF_STORE_RSOURCE_H
#define DF_STORE_RSOURCE_H

#include "store/source.h"

/* Fetch ext[0..n) (file indices into the paths given at creation) into
 * fds[ext.file] at the same offsets, durably (fdatasync). 0 or DF_E*. */
typedef int (*df_rsource_fetch_fn)(void *ctx, const df_extent *ext, int n, const int *fds, char *err, size_t errlen);

typedef struct df_rsource df_rsource;
typedef struct {
    int64_t experts_fetched, bytes_fetched, evictions;
    double fetch_seconds;       /* wall time in fetch calls */
    int64_t disk_bytes;         /* routed-expert bytes on local disk now */
    int64_t disk_budget;        /* -1: unlimited */
} df_rsource_stats;

/* inner: the source that reads local files (valid while this lives).
 * locs: [n_layers * n_experts]. state_path: the state file (created).
 * disk_budget: bytes of experts kept on disk (-1: unlimited). */
df_rsource *df_rsource_new(df_expert_source *inner, const char *const *paths, int n_files, int n_layers, int n_experts,
                           const df_expert_loc *locs, const char *state_path, int64_t disk_budget, df_rsource_fetch_fn fetch,
                           void *ctx, char *err, size_t errlen);
df_expert_source *df_rsource_source(df_rsource *r);
void df_rsource_stats_get(const df_rsource *r, df_rsource_stats *s);
/* Writes the use counts back and frees. */
void df_rsource_free(df_rsource *r);

#endif
