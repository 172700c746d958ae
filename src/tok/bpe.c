/* bpe.c - byte-pair encoding over token ids.
 *
 * A word (one pre-token) starts as one symbol per byte (byte-level models)
 * or per UTF-8 character (others); then, while some adjacent pair has a
 * merge, the pair of lowest rank is merged, the leftmost one on ties. This is
 * what HF tokenizers' BPE (merges list, rank = line index) and tiktoken (rank
 * of the concatenated bytes) both compute. Short words use a flat array
 * (quadratic in the word, which is tiny); long words use an indexed binary
 * heap over a linked list, O(n log n) with 24 bytes per symbol, so one huge
 * pre-token (a 100 MiB run of letters) stays tractable.
 *
 * The per-thread cache maps word bytes -> ids; it is cleared when full,
 * which never changes results. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"
#include "tok/unicode.h"
#include "util/util.h"

void df_ids_grow(df_ids *x, size_t more) {
    size_t c = x->cap ? x->cap : 256;
    while (c < x->n + more) c *= 2;
    x->v = df_xrealloc(x->v, c * sizeof *x->v);
    x->cap = c;
}

/* ---- hashing ------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static inline uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0x100000001B3ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    }
    return mix64(h);
}

/* ---- tables ------------------------------------------------------------- */

void df_bpe_init(df_bpe *b) {
    memset(b, 0, sizeof *b);
    for (int i = 0; i < 256; i++) b->byte_id[i] = b->byte_fb_id[i] = -1;
    b->unk_id = -1;
}

void df_bpe_free(df_bpe *b) {
    free(b->blob);
    free(b->tok);
    free(b->vocab.slots);
    free(b->merges.slots);
    memset(b, 0, sizeof *b);
}


void df_bpe_set_token(df_bpe *b, int32_t id, const uint8_t *bytes, size_t len) {
    if (id >= b->n_ids) {
        int32_t nn = b->n_ids ? b->n_ids : 1024;
        while (nn <= id) nn *= 2;
        b->tok = df_xrealloc(b->tok, (size_t)nn * sizeof *b->tok);
        for (int32_t i = b->n_ids; i < nn; i++) b->tok[i] = UINT64_MAX;
        b->n_ids = nn;
    }
        if (b->blob_len + len > b->blob_cap) {
        b->blob_cap = b->blob_cap ? b->blob_cap * 2 : 1 << 20;
        while (b->blob_len + len > b->blob_cap) b->blob_cap *= 2;
        b->blob = df_xrealloc(b->blob, b->blob_cap);
    }
    memcpy(b->blob + b->blob_len, bytes, len);
    b->tok[id] = ((uint64_t)b->blob_len << 24) | (uint64_t)len;
    b->blob_len += len;
}

int32_t df_bpe_lookup(const df_bpe *b, const uint8_t *s, size_t n) {
    if (!b->vocab.cap) return -1;
    size_t mask = b->vocab.cap - 1, i = (size_t)hash_bytes(s, n) & mask;
    for (;;) {
        uint32_t v = b->vocab.slots[i];
        if (!v) return -1;
        size_t l;
        const uint8_t *t = df_bpe_bytes(b, (int32_t)(v - 1), &l);
        if (l == n && !memcmp(t, s, n)) return (int32_t)(v - 1);
        i = (i + 1) & mask;
    }
}

void df_bpe_index(df_bpe *b) {
    /* trim n_ids to max id + 1 */
    int32_t last = b->n_ids - 1;
    while (last >= 0 && b->tok[last] == UINT64_MAX) last--;
    b->n_ids = last + 1;
    size_t cap = 16;
    while (cap < (size_t)b->n_ids * 2 + 16) cap *= 2;
    free(b->vocab.slots);
    b->vocab.slots = df_xcalloc(cap, sizeof *b->vocab.slots);
    b->vocab.cap = cap;
    for (int32_t id = 0; id < b->n_ids; id++) {
        size_t l;
        const uint8_t *t = df_bpe_bytes(b, id, &l);
        if (!t) continue;
        size_t i = (size_t)hash_bytes(t, l) & (cap - 1);
        for (;;) {
            uint32_t v = b->vocab.slots[i];
            if (!v) { b->vocab.slots[i] = (uint32_t)id + 1; break; }
            size_t l2;
            const uint8_t *t2 = df_bpe_bytes(b, (int32_t)(v - 1), &l2);
            if (l2 == l && !memcmp(t2, t, l)) { b->vocab.slots[i] = (uint32_t)id + 1; break; }
            i = (i + 1) & (cap - 1);
        }
    }
    for (int c = 0; c < 256; c++) {
        uint8_t ch = (uint8_t)c;
        if (b->byte_level) b->byte_id[c] = df_bpe_lookup(b, &ch, 1);
    }
}

static inline size_t pair_slot(uint64_t key, size_t cap) { return (size_t)mix64(key) & (cap - 1); }

void df_pairmap_put(df_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 1 << 16;
        df_pairslot *ns = df_xcalloc(nc, sizeof *ns);
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->slots[i].key) continue;
            size_t j = pair_slot(m->slots[i].key, nc);
            while (ns[j].key) j = (j + 1) & (nc - 1);
            ns[j] = m->slots[i];
        }
        free(m->slots);
        m->slots = ns;
        m->cap = nc;
    }
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t j = pair_slot(key, m->cap);
    while (m->slots[j].key && m->slots[j].key != key) j = (j + 1) & (m->cap - 1);
    if (!m->slots[j].key) { m->slots[j].key = key; m->n++; }
    m->slots[j].val = ((uint64_t)rank << 32) | (uint32_t)id;
}

/* rank << 32 | id of the merge of (a, b), or UINT64_MAX. */
static inline uint64_t pair_get(const df_pairmap *m, int32_t a, int32_t b) {
    if (!m->cap) return UINT64_MAX;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t j = pair_slot(key, m->cap);
    for (;;) {
        const df_pairslot *e = &m->slots[j];
        if (e->key == key) return e->val;
        if (!e->key) return UINT64_MAX;
        j = (j + 1) & (m->cap - 1);
    }
}

void df_bpe_pairs_from_ranks(df_bpe *b) {
    for (int32_t id = 0; id < b->n_ids; id++) {
        size_t l;
        const uint8_t *t = df_bpe_bytes(b, id, &l);
        if (!t || l < 2) continue;
        for (size_t k = 1; k < l; k++) {
            int32_t x = df_bpe_lookup(b, t, k), y;
            if (x < 0) continue;
            if ((y = df_bpe_lookup(b, t + k, l - k)) < 0) continue;
            df_pairmap_put(&b->merges, x, y, (uint32_t)id, id);
        }
    }
}

/* ---- word cache ---------------------------------------------------------
 * Two tables. Short words (<= IK bytes, <= IV ids: nearly all pre-tokens)
 * live inline in one 64-byte slot, so a hit costs one cache line; the table
 * grows by rehashing up to CACHE_MAX_SLOTS and is cleared when full. Longer
 * words (<= CACHE_MAX_WORD bytes) go to a second table whose keys and ids
 * are in side buffers. */

#define IK 26
#define IV 8
typedef struct { uint32_t tag; uint8_t klen, vlen; uint8_t key[IK]; int32_t ids[IV]; } small_slot;
_Static_assert(sizeof(small_slot) == 64, "one cache line per small slot");

typedef struct { uint64_t h; uint32_t koff, klen, voff, vlen; } cache_slot;
struct df_bpe_cache {
    small_slot *small;
    size_t scap_slots, sused;
    cache_slot *slots;
    size_t cap, used;
    uint8_t *keys;
    size_t klen, kcap;
    int32_t *vals;
    size_t vlen, vcap;
    /* scratch for merging */
    int32_t *sym, *nxt, *prv, *hp, *hidx;
    uint32_t *rank;
    uint64_t *rv;
    size_t scap;
};

#define SMALL_MIN_SLOTS (1u << 10)
#define SMALL_MAX_SLOTS (1u << 16)
#define CACHE_MAX_SLOTS (1u << 14)
#define CACHE_MAX_WORD 128

static small_slot *small_alloc(size_t n) {
    small_slot *p = aligned_alloc(64, n * sizeof *p);
    if (!p) { fprintf(stderr, "deltafin: out of memory (%zu bytes)\n", n * sizeof *p); abort(); }
    memset(p, 0, n * sizeof *p);
    return p;
}

df_bpe_cache *df_bpe_cache_new(void) {
    /* cache-line aligned and padded: the caches of different threads never share a line */
    size_t sz = (sizeof(df_bpe_cache) + 63) & ~(size_t)63;
    df_bpe_cache *c = aligned_alloc(64, sz);
    if (!c) { fprintf(stderr, "deltafin: out of memory (%zu bytes)\n", sz); abort(); }
    memset(c, 0, sz);
    c->scap_slots = SMALL_MIN_SLOTS;
    c->small = small_alloc(c->scap_slots);
    c->cap = 1 << 8;
    c->slots = df_xcalloc(c->cap, sizeof *c->slots);
    return c;
}

void df_bpe_cache_free(df_bpe_cache *c) {
    if (!c) return;
    free(c->small);
    free(c->slots);
    free(c->keys);
    free(c->vals);
    free(c->sym);
    free(c->nxt);
    free(c->prv);
    free(c->hp);
    free(c->hidx);
    free(c->rank);
    free(c->rv);
    free(c);
}

static inline uint32_t small_tag(uint64_t h) { return (uint32_t)(h >> 32); }

static void small_put(df_bpe_cache *c, uint64_t h, const uint8_t *s, size_t n, const int32_t *ids, size_t m) {
    if ((c->sused + 1) * 2 > c->scap_slots) {
        if (c->scap_slots < SMALL_MAX_SLOTS) { /* grow, keeping every entry */
            size_t nc = c->scap_slots * 2;
            small_slot *ns = small_alloc(nc);
            for (size_t i = 0; i < c->scap_slots; i++) {
                small_slot *e = &c->small[i];
                if (!e->klen) continue;
                size_t j = (size_t)hash_bytes(e->key, e->klen) & (nc - 1);
                while (ns[j].klen) j = (j + 1) & (nc - 1);
                ns[j] = *e;
            }
            free(c->small);
            c->small = ns;
            c->scap_slots = nc;
        } else {
            memset(c->small, 0, c->scap_slots * sizeof *c->small);
            c->sused = 0;
        }
    }
    size_t j = (size_t)h & (c->scap_slots - 1);
    while (c->small[j].klen) j = (j + 1) & (c->scap_slots - 1);
    small_slot *e = &c->small[j];
    e->tag = small_tag(h);
    e->klen = (uint8_t)n;
    e->vlen = (uint8_t)m;
    memcpy(e->key, s, n);
    memcpy(e->ids, ids, m * sizeof *ids);
    c->sused++;
}

static void cache_put(df_bpe_cache *c, uint64_t h, const uint8_t *s, size_t n, const int32_t *ids, size_t m) {
    if (n <= IK && m <= IV) { small_put(c, h, s, n, ids, m); return; }
    if ((c->used + 1) * 2 > c->cap) {
        if (c->cap < CACHE_MAX_SLOTS) {
            size_t nc = c->cap * 2;
            cache_slot *ns = df_xcalloc(nc, sizeof *ns);
            for (size_t i = 0; i < c->cap; i++) {
                if (!c->slots[i].klen) continue;
                size_t j = (size_t)c->slots[i].h & (nc - 1);
                while (ns[j].klen) j = (j + 1) & (nc - 1);
                ns[j] = c->slots[i];
            }
            free(c->slots);
            c->slots = ns;
            c->cap = nc;
        } else {
            memset(c->slots, 0, c->cap * sizeof *c->slots);
            c->used = c->klen = c->vlen = 0;
        }
    }
    if (c->klen + n > c->kcap) { c->kcap = (c->klen + n) * 2 + 4096; c->keys = df_xrealloc(c->keys, c->kcap); }
    if (c->vlen + m > c->vcap) { c->vcap = (c->vlen + m) * 2 + 1024; c->vals = df_xrealloc(c->vals, c->vcap * sizeof *c->vals); }
    size_t j = (size_t)h & (c->cap - 1);
    while (c->slots[j].klen) j = (j + 1) & (c->cap - 1);
    cache_slot *e = &c->slots[j];
    e->h = h;
    e->koff = (uint32_t)c->klen;
    e->klen = (uint32_t)n;
    e->voff = (uint32_t)c->vlen;
    e->vlen = (uint32_t)m;
    memcpy(c->keys + c->klen, s, n);
    c->klen += n;
    if (m) memcpy(c->vals + c->vlen, ids, m * sizeof *ids); /* a word may give no ids (bytes without tokens): vals may still be NULL */
    c->vlen += m;
    c->used++;
}

/* Appends the cached ids of s[0..n) to out and returns 1, or returns 0. */
static inline int cache_get(df_bpe_cache *c, uint64_t h, const uint8_t *s, size_t n, df_ids *out) {
    const int32_t *v = NULL;
    size_t m = 0;
    if (n <= IK) {
        uint32_t tag = small_tag(h);
        size_t mask = c->scap_slots - 1, j = (size_t)h & mask;
        for (;;) {
            const small_slot *e = &c->small[j];
            if (!e->klen) break;
            if (e->tag == tag && e->klen == n && !memcmp(e->key, s, n)) { v = e->ids; m = e->vlen; break; }
            j = (j + 1) & mask;
        }
    }
    if (!v) {
        size_t mask = c->cap - 1, j = (size_t)h & mask;
        for (;;) {
            const cache_slot *e = &c->slots[j];
            if (!e->klen) return 0;
            if (e->h == h && e->klen == n && !memcmp(c->keys + e->koff, s, n)) {
                m = e->vlen;
                if (!m) return 1; /* a word that gives no ids: vals may still be NULL */
                v = c->vals + e->voff;
                break;
            }
            j = (j + 1) & mask;
        }
    }
    if (out->n + m > out->cap) df_ids_grow(out, m);
    if (m) memcpy(out->v + out->n, v, m * sizeof *v);
    out->n += m;
    return 1;
}

/* ---- merging ------------------------------------------------------------ */

static void scratch(df_bpe_cache *c, size_t n, int heap) {
    if (n <= c->scap && (!heap || c->hp)) return;
    size_t cap = n > c->scap ? n + n / 2 + 16 : c->scap;
    c->sym = df_xrealloc(c->sym, cap * sizeof *c->sym);
    c->rank = df_xrealloc(c->rank, cap * sizeof *c->rank);
    c->rv = df_xrealloc(c->rv, cap * sizeof *c->rv);
    if (heap || c->hp) {
        c->nxt = df_xrealloc(c->nxt, cap * sizeof *c->nxt);
        c->prv = df_xrealloc(c->prv, cap * sizeof *c->prv);
        c->hp = df_xrealloc(c->hp, cap * sizeof *c->hp);
        c->hidx = df_xrealloc(c->hidx, cap * sizeof *c->hidx);
    }
    c->scap = cap;
}

/* Initial symbols of the word into c->sym; returns their count. */
static size_t symbolize(const df_bpe *b, df_bpe_cache *c, const uint8_t *s, size_t n) {
    scratch(c, n, 0);
    size_t m = 0;
    if (b->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = b->byte_id[s[i]];
            if (id < 0) id = b->unk_id;
            if (id >= 0) c->sym[m++] = id;
        }
        return m;
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = df_utf8_decode(s + i, n - i, &cp);
        if (!l) l = 1;
        int32_t id = df_bpe_lookup(b, s + i, (size_t)l);
        int fb = 0;
        if (id < 0 && b->byte_fallback) { /* all of the character's bytes have <0xXX> tokens, or none is used */
            fb = 1;
            for (int k = 0; k < l; k++) fb &= b->byte_fb_id[s[i + k]] >= 0;
        }
        if (id >= 0) c->sym[m++] = id;
        else if (fb) {
            for (int k = 0; k < l; k++) c->sym[m++] = b->byte_fb_id[s[i + k]];
        } else if (b->unk_id >= 0) {
            c->sym[m++] = b->unk_id;
        }
        i += (size_t)l;
    }
    return m;
}

/* Flat array merge: fine for short words. rv[i] is the merge of pair
 * (i, i + 1) as rank << 32 | id (UINT64_MAX none); ranks identify merges,
 * so the smallest value is the lowest rank, the leftmost on ties. */
static size_t merge_flat(const df_bpe *b, int32_t *sym, uint64_t *rv, size_t m) {
    if (!b->merges.cap) return m;
    for (size_t i = 0; i + 1 < m; i++) rv[i] = pair_get(&b->merges, sym[i], sym[i + 1]);
    while (m > 1) {
        uint64_t best = UINT64_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rv[i] < best) { best = rv[i]; bi = i; }
        if (best == UINT64_MAX) break;
        sym[bi] = (int32_t)(uint32_t)best;
        memmove(sym + bi + 1, sym + bi + 2, (m - bi - 2) * sizeof *sym);
        memmove(rv + bi + 1, rv + bi + 2, (m - bi - 2) * sizeof *rv);
        m--;
        if (bi + 1 < m) rv[bi] = pair_get(&b->merges, sym[bi], sym[bi + 1]);
        if (bi > 0) rv[bi - 1] = pair_get(&b->merges, sym[bi - 1], sym[bi]);
    }
    return m;
}

/* Indexed min-heap over positions, keyed by (rank[pos], pos). */
static inline int heap_less(const uint32_t *rank, int32_t a, int32_t b) {
    return rank[a] < rank[b] || (rank[a] == rank[b] && a < b);
}
static void heap_up(int32_t *hp, int32_t *hidx, const uint32_t *rank, size_t k) {
    int32_t x = hp[k];
    while (k > 0) {
        size_t p = (k - 1) / 2;
        if (!heap_less(rank, x, hp[p])) break;
        hp[k] = hp[p];
        hidx[hp[k]] = (int32_t)k;
        k = p;
    }
    hp[k] = x;
    hidx[x] = (int32_t)k;
}
static void heap_down(int32_t *hp, int32_t *hidx, const uint32_t *rank, size_t k, size_t n) {
    int32_t x = hp[k];
    for (;;) {
        size_t l = 2 * k + 1;
        if (l >= n) break;
        size_t r = l + 1, m = (r < n && heap_less(rank, hp[r], hp[l])) ? r : l;
        if (!heap_less(rank, hp[m], x)) break;
        hp[k] = hp[m];
        hidx[hp[k]] = (int32_t)k;
        k = m;
    }
    hp[k] = x;
    hidx[x] = (int32_t)k;
}

static void heap_remove(int32_t *hp, int32_t *hidx, const uint32_t *rank, int32_t p, size_t *hn) {
    size_t k = (size_t)hidx[p];
    hidx[p] = -1;
    (*hn)--;
    if (k < *hn) {
        int32_t x = hp[*hn];
        hp[k] = x;
        hidx[x] = (int32_t)k;
        heap_down(hp, hidx, rank, k, *hn);
        heap_up(hp, hidx, rank, (size_t)hidx[x]);
    }
}

/* Recomputes the rank of the pair (p, nxt[p]) and fixes p's place in the heap. */
static void set_rank(const df_bpe *b, df_bpe_cache *c, int32_t p, size_t *hn) {
    int32_t *sym = c->sym, *nxt = c->nxt, *hp = c->hp, *hidx = c->hidx;
    uint32_t *rank = c->rank;
    uint64_t v = nxt[p] >= 0 ? pair_get(&b->merges, sym[p], sym[nxt[p]]) : UINT64_MAX;
    uint32_t r = v == UINT64_MAX ? UINT32_MAX : (uint32_t)(v >> 32);
    if (hidx[p] < 0) {
        rank[p] = r;
        if (r != UINT32_MAX) { hp[*hn] = p; hidx[p] = (int32_t)*hn; (*hn)++; heap_up(hp, hidx, rank, *hn - 1); }
    } else if (r == UINT32_MAX) {
        heap_remove(hp, hidx, rank, p, hn);
        rank[p] = r;
    } else {
        uint32_t old = rank[p];
        rank[p] = r;
        if (r < old) heap_up(hp, hidx, rank, (size_t)hidx[p]);
        else heap_down(hp, hidx, rank, (size_t)hidx[p], *hn);
    }
}

/* Heap merge for long words; returns the symbol count, compacted into sym. */
static size_t merge_heap(const df_bpe *b, df_bpe_cache *c, size_t m) {
    scratch(c, m, 1);
    int32_t *sym = c->sym, *nxt = c->nxt, *prv = c->prv, *hp = c->hp, *hidx = c->hidx;
    uint32_t *rank = c->rank;
    size_t hn = 0;
    for (size_t i = 0; i < m; i++) {
        nxt[i] = i + 1 < m ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
        uint64_t v = i + 1 < m ? pair_get(&b->merges, sym[i], sym[i + 1]) : UINT64_MAX;
        rank[i] = v == UINT64_MAX ? UINT32_MAX : (uint32_t)(v >> 32);
        hidx[i] = -1;
        if (rank[i] != UINT32_MAX) { hp[hn] = (int32_t)i; hidx[i] = (int32_t)hn; hn++; }
    }
    for (size_t k = hn / 2; k-- > 0;) heap_down(hp, hidx, rank, k, hn);
    while (hn > 0) {
        int32_t p = hp[0], q = nxt[p];
        uint64_t v = pair_get(&b->merges, sym[p], sym[q]);
        sym[p] = (int32_t)(uint32_t)v;
        if (hidx[q] >= 0) heap_remove(hp, hidx, rank, q, &hn);
        nxt[p] = nxt[q];
        if (nxt[q] >= 0) prv[nxt[q]] = p;
        set_rank(b, c, p, &hn);
        if (prv[p] >= 0) set_rank(b, c, prv[p], &hn);
    }
    size_t o = 0;
    for (int32_t p = 0; p >= 0; p = nxt[p]) sym[o++] = sym[p];
    return o;
}

void df_bpe_encode_word(const df_bpe *b, df_bpe_cache *c, const uint8_t *s, size_t n, df_ids *out) {
    if (n == 0) return;
    if (n == 1 && b->byte_level) {
        int32_t id = b->byte_id[s[0]];
        if (id < 0) id = b->unk_id;
        if (id >= 0) df_ids_push(out, id);
        return;
    }
    uint64_t h = 0;
    if (n <= CACHE_MAX_WORD) {
        h = hash_bytes(s, n);
        if (cache_get(c, h, s, n, out)) return;
    }
    size_t m;
    int32_t whole = b->whole_word_first ? df_bpe_lookup(b, s, n) : -1;
    if (whole >= 0) {
        scratch(c, 1, 0);
        c->sym[0] = whole;
        m = 1;
    } else {
        m = symbolize(b, c, s, n);
        m = m <= 256 ? merge_flat(b, c->sym, c->rv, m) : merge_heap(b, c, m);
    }
    if (out->n + m > out->cap) df_ids_grow(out, m);
    memcpy(out->v + out->n, c->sym, m * sizeof(int32_t));
    out->n += m;
    if (n <= CACHE_MAX_WORD) cache_put(c, h, s, n, c->sym, m);
}
