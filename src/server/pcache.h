/* pcache.h - the prompt cache on disk (serve --cache-dir; docs/SERVER.md
 * "Prompt cache on disk"): session states at prompt boundaries, one file
 * each, named by a hash of the engine's fingerprint and the token prefix,
 * bounded in bytes (least recently used out), written by a background
 * thread (temp file, fsync, rename) and loaded before a request's sync when
 * they hold a longer prefix than the session keeps in memory.
 *
 * Invariants:
 *   - the session is touched only under the engine's turn: df_pcache_load
 *     and df_pcache_plan by the request holding it, df_pcache_submit as it
 *     lets go, the writer thread only after taking the turn itself;
 *   - a file is visible under its name only once complete and synced; a
 *     file that fails any check is logged, deleted and treated as a miss
 *     (a cache never fails a request);
 *   - the index (names, sizes, last use) is guarded by the cache's mutex.
 */
#ifndef DF_SERVER_PCACHE_H
#define DF_SERVER_PCACHE_H

#include "server/oai_int.h"

/* Prompts (and shared prefixes) shorter than this are not stored. */
#define DF_PCACHE_MIN_TOKENS 32

typedef struct df_pcache df_pcache;
typedef struct df_pcache_job df_pcache_job;

/* Opens (creates) dir, indexes the *.dfpc files there, deletes temp files
 * of dead writers, evicts down to max_bytes, and starts the writer thread.
 * NULL with a message in err when dir is unusable. */
df_pcache *df_pcache_open(const char *dir, int64_t max_bytes, df_engine *e, df_session *s, df_turn *turn, int quiet,
                          char *err, size_t errlen);
/* Waits for the writer (after df_turn_stop: queued jobs are dropped, a file
 * being written is finished) and frees everything. */
void df_pcache_close(df_pcache *pc);
/* With the turn, before df_session_sync(ids, n): loads the longest stored
 * prefix of ids longer than what the session would keep; returns the
 * positions loaded (0: none). */
size_t df_pcache_load(df_pcache *pc, const int32_t *ids, size_t n);
/* With the turn, right after df_session_sync(ids, n): what to store of this
 * prompt (the whole prompt, through a snapshot taken now; the prefix of
 * `kept` positions it shared with the session), or NULL. */
df_pcache_job *df_pcache_plan(df_pcache *pc, const int32_t *ids, size_t n, size_t kept);
/* With the turn, as the request lets go of it: hands the job to the writer
 * (or drops it and its snapshot when the writer is behind). */
void df_pcache_submit(df_pcache *pc, df_pcache_job *job);

#endif
