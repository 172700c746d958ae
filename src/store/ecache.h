/* ecache.h - the expert cache: engine-owned slots under an explicit byte
 * budget that hold routed experts streamed from disk (not the OS page
 * cache). Reads use O_DIRECT through io_uring (synchronous pread where
 * io_uring is unavailable); all misses of a layer are issued at once and
 * each expert is handed to the caller as soon as its bytes have arrived and
 * (when a checksum is known) been verified. Prefetches fill free or
 * evictable slots without ever changing which experts are used.
 *
 * Prefetches that turn out wrong (the layer's real routing differs) and are
 * still in flight are cancelled (IORING_OP_ASYNC_CANCEL) and their slots
 * freed; wrong ones that already arrived are the first slots reused. Slots
 * never used yet are taken only after those: their first touch is costly.
 *
 * The cache deals in bytes, extents and slots (store/source.h), never in
 * model structs; it implements the df_expert_source interface
 * (df_ecache_source), through which the model's MoE code reaches it.
 *
 * Invariants: a slot holding a pinned expert is never evicted; a slot is
 * READY only after every extent arrived whole and its checksum matched. */
#ifndef DF_STORE_ECACHE_H
#define DF_STORE_ECACHE_H

#include "store/source.h"
#include <stdio.h>

typedef struct df_ecache df_ecache;

typedef enum { DF_EVICT_LRU = 0, DF_EVICT_LFU = 1 } df_evict_policy;
/* Router-lookahead prefetch: predictions are always judged against the
 * layer's real routing; auto issues reads only while at least half of the
 * last 64 predictions (of experts not yet resident) were right. */
typedef enum { DF_PF_AUTO = 0, DF_PF_ALWAYS = 1, DF_PF_NEVER = 2 } df_prefetch_mode;

typedef struct {
    int64_t budget;      /* bytes of slot memory */
    int min_slots;       /* at least this many slots whatever the budget */
    df_evict_policy policy;
    int use_io_uring;    /* 0: synchronous pread */
    int populate;        /* fault the slot memory in ahead of use, in a background thread */
    int fresh_memory;    /* 0: measure how fast fresh memory is faulted in; 1/2: treat it as slow/fast (tests) */
    void (*before_reuse)(void); /* called before a read rewrites slot memory that held an expert (a device backend
                                   waits there for its copies out of the slots), or NULL */
} df_ecache_opts;

/* paths: the files the extents refer to (opened by the cache with O_DIRECT
 * when the filesystem allows). experts: [n_layers * n_experts] where each
 * expert is (copied); entries of non-MoE layers have n_parts == 0. */
df_ecache *df_ecache_new(const char *const *paths, int n_files, int n_layers, int n_experts, const df_expert_loc *experts,
                         const df_ecache_opts *o, char *err, size_t errlen);
void df_ecache_free(df_ecache *c);
/* The cache as an expert source (valid while the cache lives). */
df_expert_source *df_ecache_source(df_ecache *c);

typedef df_expert_ready_fn df_ecache_ready_fn;

/* Makes experts ids[0..k) of layer l resident and pinned (k <= slots);
 * calls ready(ctx, i, parts) for each, hits first, misses in arrival order, and ready(ctx, -1,
 * NULL) before every wait for I/O and once at the end, so a caller may batch
 * the experts handed over so far. Returns 0 or a
 * negative DF_E* code (I/O error, checksum mismatch naming layer and expert). */
int df_ecache_acquire(df_ecache *c, int l, const int *ids, int k, df_ecache_ready_fn ready, void *ctx, char *err, size_t errlen);
/* As acquire, and once this layer's experts are pinned and their reads
 * issued (before waiting), records pf_ids[0..pf_k) as the prediction for
 * layer pf_l and prefetches them when the prefetch mode says so. */
int df_ecache_acquire_pf(df_ecache *c, int l, const int *ids, int k, int pf_l, const int *pf_ids, int pf_k,
                         df_ecache_ready_fn ready, void *ctx, char *err, size_t errlen);
/* Unpins everything acquired so far. */
void df_ecache_release(df_ecache *c);
/* Starts reading experts ids of layer l that are not resident, into slots
 * that are free or evictable; never blocks on I/O. */
void df_ecache_prefetch(df_ecache *c, int l, const int *ids, int k);

typedef struct {
    int64_t hits, prefetch_hits, misses, prefetch_issued, prefetch_unused, prefetch_cancelled;
    int64_t predicted, predicted_right; /* lookahead predictions of non-resident experts, and how many were used */
    int64_t stale_reuses;               /* reads that evicted a stale expert instead of taking fresh memory */
    double touch_gbs;                   /* first-touch speed of slot memory, measured at creation (0: no arena) */
    int64_t bytes_read;
    double io_wait_s, read_busy_s;
    int n_slots;
    int64_t slot_bytes;
    int io_uring;
} df_ecache_stats;
void df_ecache_stats_get(const df_ecache *c, df_ecache_stats *s);
int df_ecache_slots(const df_ecache *c);
/* The slot memory (one mapping): what a device backend page-locks (host_pin) so its copies out of the slots are asynchronous. */
void df_ecache_memory(const df_ecache *c, void **p, size_t *bytes);
void df_ecache_set_policy(df_ecache *c, df_evict_policy p);
void df_ecache_set_prefetch(df_ecache *c, df_prefetch_mode m);

/* Tracing: when set, acquire writes one JSON line per (token, layer). */
void df_ecache_set_trace(df_ecache *c, FILE *f);
void df_ecache_set_token(df_ecache *c, int64_t token);

#endif
