/* match.c - the vocabulary index, the matcher, and per-node mask caches.
 *
 * The matcher keeps the set of live parse positions ("heads"): an automaton
 * node with a byte edge plus a call stack (frames in a pool, shared by
 * heads: a stack is the index of its top frame). Advancing by a byte follows
 * the matching byte edges, then the closure: epsilons, calls (push a frame,
 * enter the rule) and rule ends (pop). Left recursion is refused at compile
 * time, so closures end; a (node, stack) pair is visited once per byte.
 *
 * Masks walk the vocabulary's byte trie (preorder arrays; a failed prefix
 * skips its whole subtree), one level of heads per byte of depth. Most of
 * that work does not depend on the stack below the head's node, so it is
 * cached per node, as XGrammar does: walking from (node, BOTTOM), a token is
 *   accepted  if a path consumes all its bytes without popping BOTTOM
 *             (or pops it exactly at its last byte: every configuration can
 *             complete, so the token is a valid prefix in every context);
 *   rejected  if every path dies before the last byte without popping BOTTOM;
 *   uncertain otherwise (some path needed the stack below).
 * At run time the mask is the union over heads of their node's accepted set
 * plus the uncertain tokens checked against the head's real stack, walking
 * a sub-trie of just those tokens. */
#include "grammar/grammar_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROOT (-1)
#define BOTTOM (-2)
#define VBITS 16 /* visited table: 1 << VBITS slots */
#define VMAX (1 << (VBITS - 1))

typedef struct {
    int32_t n;
    uint8_t *byte;
    int32_t *depth;         /* 1 = a first byte */
    int32_t *end;           /* preorder index after the node's subtree */
    int32_t *tfirst, *tn;   /* tokens ending here: toks[tfirst .. tfirst + tn) */
    int32_t *toks;
} trie;

struct df_gvocab {
    int n;
    size_t words;
    char *blob;
    size_t *off;   /* [n + 1] */
    uint8_t *ok;   /* [n] 1: may appear in a document */
    int maxlen;
    trie t;
};

struct df_gnode_cache {
    uint32_t *acc; /* words */
    trie unc;
};

struct df_gmatch {
    df_grammar *g;
    const df_gvocab *v;
    df_gnode_cache **cache; /* g->cache, or own when g is bound to another vocabulary */
    int own_cache;
    /* frames: stack = index of the top frame; ROOT / BOTTOM below the first */
    int32_t *fret, *fpar;
    size_t fn, fcap, fperm;
    /* frames are hash-consed: one frame per (return node, parent) among the
     * live frames [0, fn), so equal stacks are equal indices (fh: index + 1,
     * 0 empty; entries past fn or whose frame was reused are skipped) */
    uint32_t *fh;
    size_t fhcap, fhcount;
    /* the committed heads */
    int32_t *cn, *cs;
    int ncur, ccap, complete;
    /* levels of the walk: heads hn/hs[hoff[d] .. hoff[d+1]) */
    int32_t *hn, *hs;
    size_t hcap;
    size_t *hoff, *ftop;
    uint8_t *ctxf;
    int32_t *sd;            /* cache walks: the DFA state of each level, or -1 */
    /* visited (node, stack) at the level being built */
    uint64_t *vk;
    uint32_t *vg;
    uint32_t gen;
    int vcount;
    int32_t *wn, *ws;
    size_t wcap;
    uint64_t work, work_max; /* parse steps in this call, the limit */
    int over;                /* 1 too many positions, 2 out of memory, 3 past the work limit */
    char err[200];
};

/* ---- vocabulary ---------------------------------------------------------- */

static void trie_free(trie *t) {
    free(t->byte);
    free(t->depth);
    free(t->end);
    free(t->tfirst);
    free(t->tn);
    free(t->toks);
    memset(t, 0, sizeof *t);
}

static int trie_alloc(trie *t, size_t nodes, size_t toks) {
    size_t n = nodes ? nodes : 1, k = toks ? toks : 1;
    t->byte = malloc(n);
    t->depth = malloc(sizeof(int32_t) * n);
    t->end = malloc(sizeof(int32_t) * n);
    t->tfirst = malloc(sizeof(int32_t) * n);
    t->tn = malloc(sizeof(int32_t) * n);
    t->toks = malloc(sizeof(int32_t) * k);
    return t->byte && t->depth && t->end && t->tfirst && t->tn && t->toks ? 0 : -1;
}

static int cmp_tok(const void *a, const void *b, void *arg) {
    const df_gvocab *v = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->blob + v->off[x], v->blob + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void df_gvocab_free(df_gvocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->ok);
    trie_free(&v->t);
    free(v);
}

int df_gvocab_size(const df_gvocab *v) { return v->n; }
size_t df_gvocab_mask_words(const df_gvocab *v) { return v->words; }

df_gvocab *df_gvocab_new(int n, const char *const *bytes, const size_t *lens, const uint8_t *excluded, char *err,
                         size_t errlen) {
    if (n <= 0) { df_err(err, errlen, DF_EINPUT, "grammar vocabulary: %d tokens, expected at least 1", n); return NULL; }
    df_gvocab *v = calloc(1, sizeof *v);
    int32_t *ids = NULL;
    if (!v) goto oom;
    v->n = n;
    v->words = ((size_t)n + 31) / 32;
    v->off = malloc(sizeof *v->off * ((size_t)n + 1));
    v->ok = calloc((size_t)n, 1);
    if (!v->off || !v->ok) goto oom;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += bytes[i] ? lens[i] : 0;
    v->blob = malloc(total ? total : 1);
    if (!v->blob) goto oom;
    size_t o = 0;
    int nok = 0;
    for (int i = 0; i < n; i++) {
        v->off[i] = o;
        size_t l = bytes[i] ? lens[i] : 0;
        if (l) memcpy(v->blob + o, bytes[i], l);
        o += l;
        v->ok[i] = l > 0 && !(excluded && excluded[i]);
        if (v->ok[i]) { nok++; if ((int)l > v->maxlen) v->maxlen = (int)l; }
    }
    v->off[n] = o;
    ids = malloc(sizeof *ids * (size_t)(nok ? nok : 1));
    if (!ids) goto oom;
    int k = 0;
    size_t okbytes = 0;
    for (int i = 0; i < n; i++)
        if (v->ok[i]) { ids[k++] = i; okbytes += v->off[i + 1] - v->off[i]; }
    qsort_r(ids, (size_t)nok, sizeof *ids, cmp_tok, v);
    /* preorder trie from the sorted byte strings */
    trie *t = &v->t;
    if (trie_alloc(t, okbytes, (size_t)nok)) goto oom;
    int32_t *path = malloc(sizeof *path * ((size_t)v->maxlen + 1));
    if (!path) goto oom;
    int cur = 0, nn = 0;
    const char *prev = NULL;
    size_t plen = 0;
    for (int j = 0; j < nok; j++) {
        int32_t id = ids[j];
        const char *b = v->blob + v->off[id];
        size_t l = v->off[id + 1] - v->off[id], lcp = 0;
        while (prev && lcp < l && lcp < plen && b[lcp] == prev[lcp]) lcp++;
        for (; cur > (int)lcp; cur--) t->end[path[cur]] = nn;
        for (size_t q = lcp; q < l; q++) {
            t->byte[nn] = (uint8_t)b[q];
            t->depth[nn] = (int32_t)q + 1;
            t->tn[nn] = 0;
            t->tfirst[nn] = 0;
            path[q + 1] = nn++;
        }
        cur = (int)l;
        int32_t node = path[l];
        if (!t->tn[node]) t->tfirst[node] = j;
        t->tn[node]++;
        t->toks[j] = id;
        prev = b;
        plen = l;
    }
    for (; cur > 0; cur--) t->end[path[cur]] = nn;
    t->n = nn;
    free(path);
    free(ids);
    return v;
oom:
    free(ids);
    df_gvocab_free(v);
    df_err(err, errlen, DF_ENOMEM, "grammar vocabulary: out of memory (%d tokens)", n);
    return NULL;
}

/* ---- heads and closure ----------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem, int arrays, void **p2) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *a = realloc(*p, c * elem);
    if (!a) return -1;
    *p = a;
    if (arrays == 2) {
        void *b = realloc(*p2, c * elem);
        if (!b) return -1;
        *p2 = b;
    }
    *cap = c;
    return 0;
}

static size_t frame_slot(const df_gmatch *m, int32_t ret, int32_t par) {
    uint64_t key = (uint64_t)(uint32_t)ret << 32 | (uint32_t)par;
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & (m->fhcap - 1);
}

/* Rebuilds the frame table from the live frames, sized for growth. */
static int frame_rehash(df_gmatch *m) {
    size_t cap = 1024;
    while (cap < 4 * (m->fn + 1)) cap *= 2;
    if (cap != m->fhcap) {
        uint32_t *t = realloc(m->fh, cap * sizeof *t);
        if (!t) return -1;
        m->fh = t;
        m->fhcap = cap;
    }
    memset(m->fh, 0, m->fhcap * sizeof *m->fh);
    m->fhcount = 0;
    for (size_t f = 0; f < m->fn; f++) {
        size_t i = frame_slot(m, m->fret[f], m->fpar[f]);
        while (m->fh[i]) {
            uint32_t e = m->fh[i] - 1;
            if (m->fret[e] == m->fret[f] && m->fpar[e] == m->fpar[f]) break; /* an older equal frame */
            i = (i + 1) & (m->fhcap - 1);
        }
        if (!m->fh[i]) { m->fh[i] = (uint32_t)f + 1; m->fhcount++; }
    }
    return 0;
}

/* The frame (ret, par): an existing live one, else a new one. Sharing keeps
 * equal stacks equal, so the visited set merges them: a nested nullable
 * repetition (x ::= "a" x*+ ...) would otherwise double its heads per byte. */
static int32_t frame(df_gmatch *m, int32_t ret, int32_t par) {
    if ((m->fhcount + 1) * 2 > m->fhcap && frame_rehash(m)) { m->over = 2; return ROOT; }
    size_t i = frame_slot(m, ret, par);
    for (; m->fh[i]; i = (i + 1) & (m->fhcap - 1)) {
        uint32_t e = m->fh[i] - 1;
        if (e < m->fn && m->fret[e] == ret && m->fpar[e] == par) return (int32_t)e;
    }
    if (m->fn >= INT32_MAX - 1 ||
        grow((void **)&m->fret, &m->fcap, m->fn + 1, sizeof(int32_t), 2, (void **)&m->fpar)) { m->over = 2; return ROOT; }
    m->fret[m->fn] = ret;
    m->fpar[m->fn] = par;
    m->fh[i] = (uint32_t)m->fn + 1;
    m->fhcount++;
    return (int32_t)m->fn++;
}

static int work(df_gmatch *m, size_t *wn, int32_t node, int32_t stk) {
    if (grow((void **)&m->wn, &m->wcap, *wn + 1, sizeof(int32_t), 2, (void **)&m->ws)) { m->over = 2; return -1; }
    m->wn[*wn] = node;
    m->ws[*wn] = stk;
    (*wn)++;
    return 0;
}

/* 1 if (node, stk) was already visited at this level, else marks it. */
static int visited(df_gmatch *m, int32_t node, int32_t stk) {
    uint64_t key = (uint64_t)(uint32_t)node << 32 | (uint32_t)stk;
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    size_t mask = ((size_t)1 << VBITS) - 1, i = (size_t)(h >> (64 - VBITS));
    while (m->vg[i] == m->gen) {
        if (m->vk[i] == key) return 1;
        i = (i + 1) & mask;
    }
    if (++m->vcount > VMAX) { m->over = 1; return 1; }
    if (++m->work > m->work_max) { m->over = 3; return 1; }
    m->vg[i] = m->gen;
    m->vk[i] = key;
    return 0;
}

static void new_level(df_gmatch *m) {
    if (++m->gen == 0) { memset(m->vg, 0, sizeof *m->vg << VBITS); m->gen = 1; }
    m->vcount = 0;
}

/* Runs the closure of the work items, appending heads after hoff[d]
 * (the level being built, d). Returns flags: 1 popped BOTTOM, 2 popped ROOT. */
static int closure(df_gmatch *m, size_t wn, size_t *hlen) {
    const df_grammar *g = m->g;
    int flags = 0;
    while (wn && !m->over) {
        wn--;
        int32_t n = m->wn[wn], s = m->ws[wn];
        if (visited(m, n, s)) continue;
        if (g->has_range[n]) {
            if (grow((void **)&m->hn, &m->hcap, *hlen + 1, sizeof(int32_t), 2, (void **)&m->hs)) { m->over = 2; break; }
            m->hn[*hlen] = n;
            m->hs[*hlen] = s;
            (*hlen)++;
        }
        if (g->is_end[n]) {
            if (s == ROOT) flags |= 2;
            else if (s == BOTTOM) flags |= 1;
            else work(m, &wn, m->fret[s], m->fpar[s]);
            continue;
        }
        for (int k = g->eoff[n]; k < g->eoff[n + 1]; k++) {
            const df_gedge *e = &g->edges[k];
            if (e->kind == GE_EPS) work(m, &wn, e->to, s);
            else if (e->kind == GE_CALL) {
                int32_t f = frame(m, e->to, s);
                work(m, &wn, g->rstart[e->rule], f);
            }
        }
    }
    return flags;
}

/* Level d+1 from level d by byte c. Returns closure flags, or -1 (m->over). */
static int advance(df_gmatch *m, int d, uint8_t c) {
    const df_grammar *g = m->g;
    m->fn = m->ftop[d];
    new_level(m);
    size_t wn = 0, hlen = m->hoff[d + 1];
    for (size_t h = m->hoff[d]; h < m->hoff[d + 1]; h++) {
        int32_t n = m->hn[h];
        for (int k = g->eoff[n]; k < g->eoff[n + 1]; k++) {
            const df_gedge *e = &g->edges[k];
            if (e->kind == GE_RANGE && c >= e->lo && c <= e->hi) work(m, &wn, e->to, m->hs[h]);
        }
    }
    int fl = closure(m, wn, &hlen);
    if (hlen - m->hoff[d + 1] > DF_GRAMMAR_MAX_HEADS) m->over = 1;
    m->hoff[d + 2] = hlen;
    m->ftop[d + 1] = m->fn;
    return m->over ? -1 : fl;
}

/* Level 0 = the committed heads (or one given head). */
static int level0(df_gmatch *m, int one, int32_t n, int32_t s) {
    if (grow((void **)&m->hn, &m->hcap, (size_t)m->ncur + 1, sizeof(int32_t), 2, (void **)&m->hs)) return DF_ENOMEM;
    m->hoff[0] = 0;
    if (one) {
        m->hn[0] = n;
        m->hs[0] = s;
        m->hoff[1] = 1;
    } else {
        memcpy(m->hn, m->cn, sizeof *m->hn * (size_t)m->ncur);
        memcpy(m->hs, m->cs, sizeof *m->hs * (size_t)m->ncur);
        m->hoff[1] = (size_t)m->ncur;
    }
    m->fn = m->fperm;
    m->ftop[0] = m->fperm;
    return 0;
}

static int fail_over(df_gmatch *m) {
    if (m->over == 2) { snprintf(m->err, sizeof m->err, "grammar matcher: out of memory"); return DF_ENOMEM; }
    if (m->over == 3) {
        snprintf(m->err, sizeof m->err,
                 "grammar matcher: more than %llu parse steps for one token (the grammar is too complex to match: "
                 "nested optional repetitions?)", (unsigned long long)m->work_max);
        return DF_EUNSUPPORTED;
    }
    snprintf(m->err, sizeof m->err, "grammar matcher: more than %d live parse positions at one byte (the grammar is too ambiguous)",
             DF_GRAMMAR_MAX_HEADS);
    return DF_EUNSUPPORTED;
}

/* ---- per-node cache ------------------------------------------------------- */

static void cache_free(df_gnode_cache *c) {
    if (!c) return;
    free(c->acc);
    trie_free(&c->unc);
    free(c);
}

void df_gcache_free(df_grammar *g) {
    for (int i = 0; g->cache && i < g->n_nodes; i++) cache_free(g->cache[i]);
    free(g->cache);
    g->cache = NULL;
    free(g->dfa.trans);
    free(g->dfa.noff);
    free(g->dfa.nodes);
    free(g->dfa.slot);
    memset(&g->dfa, 0, sizeof g->dfa);
}

#define DFA_MAX 16384 /* states per grammar (1 KiB of transitions each) */

static uint32_t hash_nodes(const int32_t *x, int k) {
    uint32_t h = 2166136261u ^ (uint32_t)k;
    for (int i = 0; i < k; i++) h = (h ^ (uint32_t)x[i]) * 16777619u;
    return h;
}

/* The state of the sorted node set x[0..k); -1 when the DFA is full or out of memory. */
static int32_t dfa_intern(df_gdfa *a, const int32_t *x, int k) {
    if (!a->slot) {
        a->hcap = 2 * DFA_MAX;
        if (!(a->slot = calloc(a->hcap, sizeof *a->slot)) || !(a->noff = malloc(sizeof *a->noff * (DFA_MAX + 1)))) return -1;
        a->noff[0] = 0;
    }
    uint32_t i = hash_nodes(x, k) & (a->hcap - 1);
    for (; a->slot[i]; i = (i + 1) & (a->hcap - 1)) {
        int32_t s = a->slot[i] - 1, n = a->noff[s + 1] - a->noff[s];
        if (n == k && !memcmp(a->nodes + a->noff[s], x, sizeof *x * (size_t)k)) return s;
    }
    if (a->n >= DFA_MAX) return -1;
    if (a->n == a->cap) {
        int32_t c = a->cap ? a->cap * 2 : 64;
        int32_t *t = realloc(a->trans, sizeof *t * 256 * (size_t)c);
        if (!t) return -1;
        memset(t + (size_t)a->cap * 256, 0xff, sizeof *t * 256 * (size_t)(c - a->cap));
        a->trans = t;
        a->cap = c;
    }
    if (a->nn + (size_t)k > a->ncap) {
        size_t c = a->ncap ? a->ncap : 1024;
        while (c < a->nn + (size_t)k) c *= 2;
        int32_t *t = realloc(a->nodes, sizeof *t * c);
        if (!t) return -1;
        a->nodes = t;
        a->ncap = c;
    }
    memcpy(a->nodes + a->nn, x, sizeof *x * (size_t)k);
    a->nn += (size_t)k;
    int32_t s = a->n++;
    a->noff[s + 1] = (int32_t)a->nn;
    a->slot[i] = s + 1;
    return s;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Level d's heads written out from DFA state s (stacks BOTTOM). */
static int materialize(df_gmatch *m, int d, int32_t s) {
    const df_gdfa *a = &m->g->dfa;
    int32_t k = a->noff[s + 1] - a->noff[s];
    if (grow((void **)&m->hn, &m->hcap, m->hoff[d] + (size_t)k + 1, sizeof(int32_t), 2, (void **)&m->hs)) return -1;
    for (int32_t j = 0; j < k; j++) {
        m->hn[m->hoff[d] + (size_t)j] = a->nodes[a->noff[s] + j];
        m->hs[m->hoff[d] + (size_t)j] = BOTTOM;
    }
    m->hoff[d + 1] = m->hoff[d] + (size_t)k;
    return 0;
}

/* Builds node x's cache by walking the whole trie from (x, BOTTOM). */
static df_gnode_cache *cache_build(df_gmatch *m, int32_t x) {
    const trie *t = &m->v->t;
    df_gnode_cache *c = calloc(1, sizeof *c);
    uint8_t *mark = calloc((size_t)t->n + 1, 1);
    int32_t *cnt = NULL;
    if (!c || !mark || !(c->acc = calloc(m->v->words, sizeof *c->acc))) goto oom;
    if (level0(m, 1, x, BOTTOM)) goto oom;
    m->ctxf[0] = 0;
    df_gdfa *a = &m->g->dfa;
    int32_t *sd = m->sd, tmp[64];
    sd[0] = dfa_intern(a, &x, 1);
    int nunc = 0;
    for (int32_t i = 0; i < t->n;) {
        if (++m->work > m->work_max) { m->over = 3; goto fail; }
        int d = t->depth[i], fl, nonempty;
        int32_t p = sd[d - 1], tr = p >= 0 ? a->trans[(size_t)p * 256 + t->byte[i]] : -2;
        if (tr >= 0) { /* a known step: no closure to run */
            sd[d] = tr & 0x3fffffff;
            fl = (tr >> 30) & 1;
            nonempty = a->noff[sd[d] + 1] > a->noff[sd[d]];
            m->hoff[d + 1] = m->hoff[d];
            m->ftop[d] = m->ftop[d - 1];
        } else {
            if (p >= 0 && materialize(m, d - 1, p)) goto oom;
            fl = advance(m, d - 1, t->byte[i]);
            if (fl < 0) goto fail;
            size_t h0 = m->hoff[d], k = m->hoff[d + 1] - h0;
            nonempty = k > 0;
            sd[d] = -1;
            if (tr == -1) { /* p is a state: is the new level one too (every stack BOTTOM, few positions)? */
                int ok = k <= 64;
                for (size_t j = 0; ok && j < k; j++) { ok = m->hs[h0 + j] == BOTTOM; tmp[j] = m->hn[h0 + j]; }
                int32_t s2 = -1;
                if (ok) {
                    qsort(tmp, k, sizeof *tmp, cmp_i32);
                    s2 = dfa_intern(a, tmp, (int)k);
                }
                a->trans[(size_t)p * 256 + t->byte[i]] = s2 >= 0 ? (s2 | (fl & 1) << 30) : -2;
                sd[d] = s2;
            }
        }
        m->ctxf[d] = m->ctxf[d - 1] | (fl & 1);
        if (t->tn[i]) {
            if (nonempty || (fl & 1))
                for (int32_t k = 0; k < t->tn[i]; k++) {
                    int32_t id = t->toks[t->tfirst[i] + k];
                    c->acc[id >> 5] |= 1u << (id & 31);
                }
            else if (m->ctxf[d - 1]) { mark[i] = 1; nunc++; }
        }
        if (!nonempty) {
            if (m->ctxf[d])
                for (int32_t j = i + 1; j < t->end[i]; j++)
                    if (t->tn[j]) { mark[j] = 1; nunc++; }
            i = t->end[i];
        } else i++;
    }
    m->fn = m->fperm;
    if (nunc) { /* the sub-trie of the uncertain tokens: nodes whose subtree holds one */
        cnt = malloc(sizeof *cnt * ((size_t)t->n + 1));
        if (!cnt) goto oom;
        cnt[0] = 0;
        for (int32_t i = 0; i < t->n; i++) cnt[i + 1] = cnt[i] + mark[i];
        /* keep[i]: cnt[end[i]] - cnt[i] > 0; new index = number kept before */
        int32_t nk = 0, ntok = 0;
        for (int32_t i = 0; i < t->n; i++)
            if (cnt[t->end[i]] - cnt[i] > 0) { nk++; if (mark[i]) ntok += t->tn[i]; }
        trie *u = &c->unc;
        if (trie_alloc(u, (size_t)nk, (size_t)ntok)) goto oom;
        /* kept-before counts, reusing mark's meaning: kb[i] kept nodes before i */
        int32_t *kb = malloc(sizeof *kb * ((size_t)t->n + 1));
        if (!kb) goto oom;
        kb[0] = 0;
        for (int32_t i = 0; i < t->n; i++) kb[i + 1] = kb[i] + (cnt[t->end[i]] - cnt[i] > 0);
        int32_t j = 0, q = 0;
        for (int32_t i = 0; i < t->n; i++) {
            if (!(cnt[t->end[i]] - cnt[i] > 0)) continue;
            u->byte[j] = t->byte[i];
            u->depth[j] = t->depth[i];
            u->end[j] = kb[t->end[i]];
            u->tfirst[j] = q;
            u->tn[j] = mark[i] ? t->tn[i] : 0;
            for (int32_t k = 0; k < u->tn[j]; k++) u->toks[q++] = t->toks[t->tfirst[i] + k];
            j++;
        }
        u->n = nk;
        free(kb);
    }
    free(cnt);
    free(mark);
    return c;
oom:
    m->over = 2;
fail:
    m->fn = m->fperm;
    free(cnt);
    free(mark);
    cache_free(c);
    return NULL;
}

static df_gnode_cache *cache_get(df_gmatch *m, int32_t x) {
    df_gnode_cache *c;
    pthread_mutex_lock(&m->g->mu); /* the shared cache and the grammar's DFA */
    c = m->cache[x];
    if (!c) c = m->cache[x] = cache_build(m, x);
    pthread_mutex_unlock(&m->g->mu);
    return c;
}

/* ---- matcher ------------------------------------------------------------- */

void df_gmatch_free(df_gmatch *m) {
    if (!m) return;
    if (m->own_cache && m->cache) {
        for (int i = 0; i < m->g->n_nodes; i++) cache_free(m->cache[i]);
        free(m->cache);
    }
    free(m->fret); free(m->fpar); free(m->fh);
    free(m->cn); free(m->cs);
    free(m->hn); free(m->hs);
    free(m->hoff); free(m->ftop); free(m->ctxf); free(m->sd);
    free(m->vk); free(m->vg);
    free(m->wn); free(m->ws);
    free(m);
}

const char *df_gmatch_error(const df_gmatch *m) { return m->err; }
void df_gmatch_set_work_limit(df_gmatch *m, uint64_t steps) { m->work_max = steps ? steps : 1; }
int df_gmatch_complete(const df_gmatch *m) { return m->complete; }
int df_gmatch_done(const df_gmatch *m) { return m->complete && m->ncur == 0; }

/* The committed heads = level d of the walk. */
static int commit(df_gmatch *m, int d, int complete) {
    size_t k = m->hoff[d + 1] - m->hoff[d];
    if ((int)k > m->ccap) {
        int32_t *a = realloc(m->cn, sizeof *a * k), *b = a ? realloc(m->cs, sizeof *b * k) : NULL;
        if (a) m->cn = a;
        if (!b) return DF_ENOMEM;
        m->cs = b;
        m->ccap = (int)k;
    }
    if (k) { /* no heads (a finished document): cn may still be NULL */
        memcpy(m->cn, m->hn + m->hoff[d], sizeof *m->cn * k);
        memcpy(m->cs, m->hs + m->hoff[d], sizeof *m->cs * k);
    }
    m->ncur = (int)k;
    m->complete = complete;
    m->fperm = m->ftop[d];
    return 0;
}

int df_gmatch_reset(df_gmatch *m) {
    const df_grammar *g = m->g;
    m->over = 0;
    m->work = 0;
    m->fn = m->fperm = 0;
    m->hoff[0] = 0;
    m->ftop[0] = 0;
    new_level(m);
    size_t wn = 0, hlen = 0;
    work(m, &wn, g->rstart[g->root], ROOT);
    int fl = closure(m, wn, &hlen);
    if (m->over || hlen > DF_GRAMMAR_MAX_HEADS) {
        if (!m->over) m->over = 1;
        int rc = fail_over(m);
        m->ncur = 0;
        m->complete = 0;
        return rc;
    }
    m->hoff[1] = hlen;
    m->ftop[0] = m->fn;
    return commit(m, 0, (fl & 2) != 0);
}

df_gmatch *df_gmatch_new(df_grammar *g, const df_gvocab *v, char *err, size_t errlen) {
    df_gmatch *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->g = g;
    m->v = v;
    m->work_max = DF_GRAMMAR_MAX_WORK;
    size_t L = (size_t)v->maxlen + 3;
    m->hoff = calloc(L, sizeof *m->hoff);
    m->ftop = calloc(L, sizeof *m->ftop);
    m->ctxf = calloc(L, 1);
    m->sd = calloc(L, sizeof *m->sd);
    m->vk = malloc(sizeof *m->vk << VBITS);
    m->vg = calloc((size_t)1 << VBITS, sizeof *m->vg);
    if (!m->hoff || !m->ftop || !m->ctxf || !m->sd || !m->vk || !m->vg) goto oom;
    if (grow((void **)&m->hn, &m->hcap, 1024, sizeof(int32_t), 2, (void **)&m->hs)) goto oom;
    pthread_mutex_lock(&g->mu);
    if (!g->cv) {
        g->cache = calloc((size_t)g->n_nodes, sizeof *g->cache);
        if (g->cache) g->cv = v;
    }
    if (g->cv == v) m->cache = g->cache;
    pthread_mutex_unlock(&g->mu);
    if (!m->cache) {
        m->own_cache = 1;
        if (!(m->cache = calloc((size_t)g->n_nodes, sizeof *m->cache))) goto oom;
    }
    int rc = df_gmatch_reset(m);
    if (rc == DF_ENOMEM) goto oom;
    if (rc) {
        df_err(err, errlen, rc, "%s", m->err);
        df_gmatch_free(m);
        return NULL;
    }
    return m;
oom:
    df_gmatch_free(m);
    df_err(err, errlen, DF_ENOMEM, "grammar matcher: out of memory");
    return NULL;
}

int df_gmatch_accept_bytes(df_gmatch *m, const char *p, size_t n) {
    if (m->over) return fail_over(m);
    m->work = 0;
    if (n == 0) return 0;
    /* levels alternate between 0 and 1 so that long texts need no deep arrays */
    if (level0(m, 0, 0, 0)) return DF_ENOMEM;
    int fl = 0;
    for (size_t i = 0; i < n; i++) {
        fl = advance(m, 0, (uint8_t)p[i]);
        if (fl < 0) { m->fn = m->fperm; int rc = fail_over(m); m->over = 0; return rc; }
        size_t k = m->hoff[2] - m->hoff[1];
        if (!k && !(i == n - 1 && (fl & 2))) {
            m->fn = m->fperm;
            snprintf(m->err, sizeof m->err, "grammar: byte %zu of %zu (0x%02x) cannot continue the document", i + 1, n,
                     (uint8_t)p[i]);
            return DF_EINPUT;
        }
        /* level 1 becomes level 0 */
        memmove(m->hn, m->hn + m->hoff[1], sizeof *m->hn * k);
        memmove(m->hs, m->hs + m->hoff[1], sizeof *m->hs * k);
        m->hoff[1] = k;
        m->ftop[0] = m->ftop[1];
    }
    return commit(m, 0, (fl & 2) != 0);
}

int df_gmatch_accept(df_gmatch *m, int32_t token) {
    if (token < 0 || token >= m->v->n || !m->v->ok[token]) {
        snprintf(m->err, sizeof m->err, "grammar: token %d is never allowed inside a document", token);
        return DF_EINPUT;
    }
    return df_gmatch_accept_bytes(m, m->v->blob + m->v->off[token], m->v->off[token + 1] - m->v->off[token]);
}

/* Uncertain tokens of head (n, s): walk the sub-trie with the real stack. */
static int walk_unc(df_gmatch *m, const trie *u, int32_t n, int32_t s, uint32_t *bits) {
    if (level0(m, 1, n, s)) return DF_ENOMEM;
    for (int32_t i = 0; i < u->n;) {
        int d = u->depth[i];
        int fl = advance(m, d - 1, u->byte[i]);
        if (fl < 0) { m->fn = m->fperm; return fail_over(m); }
        int nonempty = m->hoff[d + 1] > m->hoff[d];
        if (u->tn[i] && (nonempty || (fl & 2)))
            for (int32_t k = 0; k < u->tn[i]; k++) {
                int32_t id = u->toks[u->tfirst[i] + k];
                bits[id >> 5] |= 1u << (id & 31);
            }
        i = nonempty ? i + 1 : u->end[i];
    }
    m->fn = m->fperm;
    return 0;
}

int df_gmatch_mask(df_gmatch *m, uint32_t *bits) {
    size_t W = m->v->words;
    memset(bits, 0, W * sizeof *bits);
    if (m->over) return fail_over(m);
    m->work = 0;
    for (int h = 0; h < m->ncur; h++) {
        int32_t n = m->cn[h];
        int dup = 0;
        for (int j = 0; j < h && !dup; j++) dup = m->cn[j] == n;
        df_gnode_cache *c = cache_get(m, n);
        if (!c) { int rc = fail_over(m); m->over = 0; return rc; }
        if (!dup)
            for (size_t w = 0; w < W; w++) bits[w] |= c->acc[w];
        if (c->unc.n) {
            int rc = walk_unc(m, &c->unc, n, m->cs[h], bits);
            if (rc) { m->over = 0; return rc; }
        }
    }
    return 0;
}
