/* hub.h - models from a Hugging Face hub: the hub protocol (revision API,
 * resolve URLs with redirects, ETag / X-Linked-Etag / X-Linked-Size /
 * X-Repo-Commit), the cache layout huggingface_hub writes
 * (CACHE/models--ORG--NAME/{blobs/ETAG, snapshots/COMMIT/PATH -> ../../blobs/ETAG,
 * refs/REVISION}), and a download engine on libcurl: byte ranges over
 * several connections, retries with backoff on dropped connections, 429
 * (Retry-After) and 5xx, short reads and wrong lengths detected, resumable
 * after kill -9, whole files verified (LFS sha256, or the git blob id of
 * small files) before they get their blob name.
 *
 * Environment (read by df_hub_opts_default only): HF_ENDPOINT, HF_TOKEN /
 * HF_TOKEN_PATH / HF_HOME/token, HF_HUB_OFFLINE, HF_HOME, HF_HUB_CACHE,
 * HUGGINGFACE_HUB_CACHE, XDG_CACHE_HOME; testing aids DELTAFIN_HUB_CHUNK
 * (bytes per range), DELTAFIN_HUB_RETRIES, DELTAFIN_HUB_BACKOFF_MS,
 * DELTAFIN_HUB_STALL_S. docs/STORAGE.md describes the layout. */
#ifndef DF_HUB_H
#define DF_HUB_H

#include <stddef.h>
#include <stdint.h>

/* The hub cache directory (HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else
 * HF_HOME/hub, HF_HOME defaulting to $XDG_CACHE_HOME/huggingface or
 * ~/.cache/huggingface). Returns buf. */
const char *df_hub_cache_dir(char *buf, size_t n);
/* 1 if s looks like a repo id "ORG/NAME" (optionally "@REV"): exactly one
 * '/', no leading '.' or '/', characters [A-Za-z0-9._-]. */
int df_hub_is_repo_id(const char *s);
/* Splits "ORG/NAME[@REV]" (REV default "main"). 0 or DF_EINPUT. */
int df_hub_parse_ref(const char *arg, char *repo, size_t rn, char *rev, size_t vn, char *err, size_t errlen);
/* CACHE/models--ORG--NAME into buf (cache NULL: df_hub_cache_dir). */
void df_hub_repo_dir(const char *cache, const char *repo, char *buf, size_t n);
/* The snapshot directory of repo at rev (a commit hash, or a ref looked up
 * in refs/) in the cache (NULL: default). 0 when it exists, else DF_EINPUT
 * with a message naming what is missing. */
int df_hub_snapshot_dir(const char *cache, const char *repo, const char *rev, char *buf, size_t n, char *err, size_t errlen);
/* Whether a snapshot directory holds its weights: 0, or DF_EINPUT naming
 * the first file the safetensors index lists that is missing (or
 * config.json). */
int df_hub_snapshot_check(const char *dir, char *err, size_t errlen);
/* What --model ORG/NAME[@REV] opens: the snapshot directory, or the stream
 * directory of that commit when the snapshot holds no weights but a stream
 * setup exists. 0 or DF_EINPUT. */
int df_hub_model_dir(const char *model, char *buf, size_t n, char *err, size_t errlen);

typedef struct {
    char endpoint[1024];
    char token[512];      /* "" : none */
    char cache[2048];
    int offline;          /* HF_HUB_OFFLINE=1 */
    int connections;      /* parallel connections (default 8) */
    int progress;         /* progress line on stderr */
    int retries;          /* attempts per range (default 10) */
    int backoff_ms;       /* first backoff (default 500, doubling, jitter, at most 30 s) */
    int stall_s;          /* a transfer under 1 byte/s for this long is dropped (default 30) */
    int64_t chunk;        /* bytes per range (default 16 MiB) */
} df_hub_opts;
void df_hub_opts_default(df_hub_opts *o);

typedef struct {
    char *path;
    int64_t size;
    char blob_id[48];     /* git blob sha1 */
    char sha256[72];      /* LFS sha256, "" for a plain git file */
} df_hub_file;

typedef struct {
    char repo[256], rev[256], commit[48];
    df_hub_file *files;
    int n_files;
} df_hub_repo;
/* GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true. */
int df_hub_revision(const df_hub_opts *o, const char *repo, const char *rev, df_hub_repo *r, char *err, size_t errlen);
/* The parsing half of df_hub_revision: the answer's bytes (untrusted) -> r's commit and files; url names the source in
 * messages. 0 or DF_EFORMAT; on failure r holds nothing to free. */
int df_hub_parse_revision(const char *txt, size_t len, const char *url, df_hub_repo *r, char *err, size_t errlen);
void df_hub_repo_free(df_hub_repo *r);

/* Network counters, summed over everything a process fetched. */
typedef struct {
    int64_t bytes, requests, retries;
    double seconds;       /* wall time spent in transfers (not counting disk work after) */
} df_hub_net;
void df_hub_net_get(df_hub_net *n);

/* Downloads files whose name passes want (NULL: every file) into the cache
 * as huggingface_hub lays it out, reusing blobs already there; refs/REV is
 * written last. 0 or a negative DF_E* code. *downloaded: files fetched. */
int df_hub_fetch_files(const df_hub_opts *o, const df_hub_repo *r, int (*want)(const char *path), int *downloaded, char *err,
                       size_t errlen);

/* Byte ranges of repo files fetched into local files (stream mode). */
typedef struct {
    int file;             /* index into the url list given to df_hub_fetch_ranges */
    uint64_t off, len;    /* in the remote file */
    int fd;               /* written at the same offset */
} df_hub_range;
typedef struct df_hub_remote df_hub_remote;
/* The download location of path in r (HEAD on its resolve URL, redirects
 * followed as huggingface_hub does); NULL on error. */
df_hub_remote *df_hub_remote_open(const df_hub_opts *o, const char *repo, const char *commit, const char *path, char *err, size_t errlen);
void df_hub_remote_free(df_hub_remote *rm);
int64_t df_hub_remote_size(const df_hub_remote *rm);
/* Fetches every range over o->connections connections (each retried), then
 * fdatasyncs the fds. done (may be NULL): done[i] set to 1 as range i
 * completes (and is skipped when already 1). 0 or a negative DF_E* code. */
int df_hub_fetch_ranges(const df_hub_opts *o, df_hub_remote *const *remotes, const df_hub_range *rg, int n, unsigned char *done,
                        void (*on_done)(void *ctx, int i), void *ctx, char *err, size_t errlen);

/* Stream setup (stream.c): the repo's small files whole into the cache (as
 * df_hub_fetch_files), then REPO_DIR/deltafin-stream/COMMIT/: links to
 * them, and per safetensors shard a sparse file of the shard's size holding
 * its header and every tensor that is not a routed expert's part
 * (df_hub_is_expert_tensor), fetched by range (resumable: NAME.resident.done lists the
 * finished ranges); stream.json (repo, commit, endpoint, disk budget,
 * shards) is written last and marks it complete, with
 * deltafin-stream/refs/REV. disk: the expert cache's disk budget (-1:
 * unlimited). dir receives the stream directory. */
int df_hub_stream_setup(const df_hub_opts *o, const df_hub_repo *r, int64_t disk, int *downloaded, char *dir, size_t dn, char *err,
                        size_t errlen);
/* 1 if name is a routed expert's streamed part: ".experts.<digits>." and a
 * last component weight, weight_packed, weight_scale or weight_scale_inv
 * (INT4's weight_shape, read at load, stays resident). */
int df_hub_is_expert_tensor(const char *name);

/* The runtime side of a stream directory: which remote file each shard is. */
typedef struct df_hub_stream df_hub_stream;
/* Reads dir/stream.json; NULL and a message if it is not a complete stream directory. */
df_hub_stream *df_hub_stream_open(const char *dir, char *err, size_t errlen);
void df_hub_stream_free(df_hub_stream *s);
int64_t df_hub_stream_disk_budget(const df_hub_stream *s);
/* Fetches ranges of shard files (by their base names) into fds, in parallel. */
typedef struct { const char *shard; uint64_t off, len; int fd; } df_hub_piece;
int df_hub_stream_fetch(df_hub_stream *s, const df_hub_piece *p, int n, char *err, size_t errlen);

/* Module helpers shared by hub.c and stream.c. df_hub_write_file: text to
 * path through a temporary file, fsynced, renamed into place (parent
 * directories created). df_hub_log_range_done: the on_done callback of
 * df_hub_fetch_ranges that appends "i\n" to the file descriptor *ctx (an
 * int) and fdatasyncs it: the record a killed download resumes from. */
/* snprintf that returns the length written (cut at n - 1): paths longer than
 * a buffer are cut (and then not found) rather than warned about at every call. */
int df_hub_sp(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int df_hub_write_file(const char *path, const char *text, char *err, size_t errlen);
void df_hub_log_range_done(void *ctx, int i);

#endif
