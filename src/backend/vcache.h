/* vcache.h - the bookkeeping of a device expert cache (the CUDA backend's
 * VRAM tier), kept apart from any device so it is tested without a GPU:
 * which expert part is in which slot, hits and misses, the eviction choice,
 * and the budget arithmetic that sizes the cache.
 *
 * Keys are expert identities (df_weight.ident: layer, expert, part), never
 * host addresses: a host expert-cache slot is reused for other experts, an
 * identity always names the same bytes while the model is open.
 *
 * Epochs: the backend closes an epoch at every experts_done (once per
 * acquire of a MoE layer). A slot used in the current epoch may still be read by work the
 * device has not run yet, and the batch that asked for it may not have been
 * launched yet, so it is never evicted: when every slot is in use in the
 * current epoch, insert answers -1 and the caller copies the weight into
 * scratch for that one product (a bypass). The epoch of a slot's last use
 * tells the backend which recorded event the copy into it must wait for. */
#ifndef DF_BACKEND_VCACHE_H
#define DF_BACKEND_VCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef enum { DF_VC_LRU = 0, DF_VC_LFU = 1 } df_vc_policy;

typedef struct {
    uint64_t key;       /* 0: empty */
    uint64_t last_use;  /* clock of the last lookup or insert */
    uint64_t uses;      /* lookups + 1 since it was inserted */
    int64_t epoch;      /* epoch of the last use */
} df_vc_slot;

typedef struct {
    int n_slots;
    int n_filled;       /* slots [0, n_filled) have held a key: free slots are taken in order, no scan */
    df_vc_slot *slot;
    int *tab;           /* open addressing, linear probing: slot index or -1; tab_cap = power of two >= 2 n_slots */
    int tab_cap;
    df_vc_policy policy;
    uint64_t clock;
    int64_t epoch;
    int64_t hits, misses, evictions, bypasses;
} df_vcache;

/* 0 or DF_ENOMEM / DF_EINPUT (n_slots < 1). */
int df_vc_init(df_vcache *c, int n_slots, df_vc_policy p);
void df_vc_free(df_vcache *c);
/* Forgets every key (a model was closed); keeps the slots and the counters. */
void df_vc_clear(df_vcache *c);
/* The slot holding key (a hit: its use is recorded), or -1 (a miss is not counted here). */
int df_vc_lookup(df_vcache *c, uint64_t key);
/* The slot holding key, or -1; records nothing (no use, no hit): the
 * device-routed MoE's residency check (every part of a layer present). */
int df_vc_peek(const df_vcache *c, uint64_t key);
/* Puts key (not present) into a free slot or the policy's victim among the
 * slots not used in the current epoch; *evicted = the key it replaced (0:
 * none), *victim_epoch = the epoch of that slot's last use (-1: none).
 * Returns the slot, or -1 when every slot is in use in this epoch (a bypass).
 * Counts the miss. key must not be 0. */
int df_vc_insert(df_vcache *c, uint64_t key, uint64_t *evicted, int64_t *victim_epoch);
/* Closes the current epoch. */
static inline void df_vc_fence(df_vcache *c) { c->epoch++; }

/* Budget arithmetic: how many slots of slot_bytes fit in budget once `used`
 * bytes (spine, params, activations, session state) and `reserve` (scratch
 * for products that bypass the cache, the spine streamed from the host) are
 * taken. Returns the count (>= min_slots), or DF_ENOMEM with one line in
 * err naming the numbers (asked, available) and --gpu-memory. */
int64_t df_vc_plan(int64_t budget, int64_t used, int64_t reserve, int64_t slot_bytes, int min_slots, char *err, size_t errlen);

#endif
