/* vcache.c - see vcache.h. */
#include "backend/vcache.h"
#include "deltafin.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

static size_t khash(uint64_t k, int cap) {
    k ^= k >> 33, k *= 0xff51afd7ed558ccdull, k ^= k >> 33, k *= 0xc4ceb9fe1a85ec53ull, k ^= k >> 33;
    return (size_t)k & (size_t)(cap - 1);
}

int df_vc_init(df_vcache *c, int n_slots, df_vc_policy p) {
    memset(c, 0, sizeof *c);
    if (n_slots < 1) return DF_EINPUT;
    int cap = 16;
    while (cap < 2 * n_slots) cap *= 2;
    c->slot = calloc((size_t)n_slots, sizeof *c->slot);
    c->tab = malloc((size_t)cap * sizeof *c->tab);
    if (!c->slot || !c->tab) {
        df_vc_free(c);
        return DF_ENOMEM;
    }
    c->n_slots = n_slots, c->tab_cap = cap, c->policy = p;
    df_vc_clear(c);
    return 0;
}

void df_vc_free(df_vcache *c) {
    free(c->slot);
    free(c->tab);
    c->slot = NULL, c->tab = NULL, c->n_slots = 0, c->tab_cap = 0;
}

void df_vc_clear(df_vcache *c) {
    for (int i = 0; i < c->tab_cap; i++) c->tab[i] = -1;
    for (int i = 0; i < c->n_slots; i++) c->slot[i] = (df_vc_slot){0, 0, 0, -1};
    c->n_filled = 0;
}

/* The table position of key, or -1. */
static int tpos(const df_vcache *c, uint64_t key) {
    for (size_t i = khash(key, c->tab_cap);; i = (i + 1) & (size_t)(c->tab_cap - 1)) {
        if (c->tab[i] < 0) return -1;
        if (c->slot[c->tab[i]].key == key) return (int)i;
    }
}

/* Removes table position i (backward-shift deletion: no tombstones). */
static void tdel(df_vcache *c, size_t i) {
    const size_t m = (size_t)(c->tab_cap - 1);
    c->tab[i] = -1;
    for (size_t j = (i + 1) & m; c->tab[j] >= 0; j = (j + 1) & m) {
        size_t h = khash(c->slot[c->tab[j]].key, c->tab_cap);
        /* the entry at j may move to the hole at i when i lies cyclically in [h, j) */
        if (((j - h) & m) >= ((j - i) & m)) {
            c->tab[i] = c->tab[j], c->tab[j] = -1;
            i = j;
        }
    }
}

int df_vc_lookup(df_vcache *c, uint64_t key) {
    if (!key || !c->n_slots) return -1;
    int p = tpos(c, key);
    if (p < 0) return -1;
    df_vc_slot *s = &c->slot[c->tab[p]];
    s->last_use = ++c->clock, s->uses++, s->epoch = c->epoch;
    c->hits++;
    return c->tab[p];
}

int df_vc_peek(const df_vcache *c, uint64_t key) {
    if (!key || !c->n_slots) return -1;
    int p = tpos(c, key);
    return p < 0 ? -1 : c->tab[p];
}

int df_vc_insert(df_vcache *c, uint64_t key, uint64_t *evicted, int64_t *victim_epoch) {
    *evicted = 0, *victim_epoch = -1;
    c->misses++;
    int best = -1;
    if (c->n_filled < c->n_slots) best = c->n_filled++;
    else for (int i = 0; i < c->n_slots; i++) { /* full: the policy's victim */
        const df_vc_slot *s = &c->slot[i];
        if (s->epoch >= c->epoch) continue; /* may still be read by work not yet run */
        if (best < 0) { best = i; continue; }
        const df_vc_slot *b = &c->slot[best];
        if (c->policy == DF_VC_LFU ? (s->uses < b->uses || (s->uses == b->uses && s->last_use < b->last_use)) : s->last_use < b->last_use) best = i;
    }
    if (best < 0) {
        c->bypasses++;
        return -1;
    }
    df_vc_slot *s = &c->slot[best];
    if (s->key) {
        *evicted = s->key, *victim_epoch = s->epoch;
        tdel(c, (size_t)tpos(c, s->key));
        c->evictions++;
    }
    s->key = key, s->last_use = ++c->clock, s->uses = 1, s->epoch = c->epoch;
    size_t i = khash(key, c->tab_cap);
    while (c->tab[i] >= 0) i = (i + 1) & (size_t)(c->tab_cap - 1);
    c->tab[i] = best;
    return best;
}

int64_t df_vc_plan(int64_t budget, int64_t used, int64_t reserve, int64_t slot_bytes, int min_slots, char *err, size_t errlen) {
    const int64_t avail = budget - used - reserve;
    const int64_t need = slot_bytes * (int64_t)min_slots;
    if (slot_bytes <= 0 || avail < need)
        return df_err(err, errlen, DF_ENOMEM,
                      "out of VRAM: the expert cache needs at least %d slot%s of %.2f MB = %.2f MB, available %.2f MB of the %.2f MB budget "
                      "(%.2f MB in use by the spine, parameters, activations and state, %.2f MB kept for scratch); raise --gpu-memory",
                      min_slots, min_slots == 1 ? "" : "s", slot_bytes / 1e6, need / 1e6, (avail > 0 ? avail : 0) / 1e6, budget / 1e6, used / 1e6, reserve / 1e6);
    return avail / slot_bytes;
}
