/* trie.c - the byte trie of added tokens and its leftmost-longest scanner.
 *
 * Added tokens are matched as HF's AddedVocabulary does (aho-corasick with
 * MatchKind::LeftmostLongest): scanning left to right, the longest token that
 * starts at the first position where any token starts, then on after its end.
 *
 * The plain scan walks the trie from each candidate position, which costs the
 * depth it reaches there: fine for real tokenizers (added tokens of a few dozen
 * bytes), quadratic for a hostile one (a 64 KiB normalized token "a...ab"
 * against 64 KiB of "a": 2^31 steps, found by fuzz_tokenizer_json). So when
 * the longest token is over DF_TRIE_WALK_MAX bytes, finishing the trie also
 * builds an Aho-Corasick automaton over the REVERSED tokens, and a scan first
 * runs it over the reversed text: after reading s[p] its state is the longest
 * prefix of s[p..n) that is a prefix of some token, and the longest token that
 * is a prefix of s[p..n) is that state if it is terminal, else the nearest
 * terminal on its failure chain (precomputed per state). That gives the length
 * of the longest token starting at every position in O(n) state steps; the
 * forward scan then reads it, and walks the forward trie only over the bytes
 * of a match (for its term), which it then skips. Same matches, linear time. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_internal.h"
#include "util/util.h"

struct df_trie_node { int32_t child, sibling, term; uint8_t byte; };

static int32_t node_new(struct df_trie_node **nodes, size_t *n, size_t *cap, uint8_t byte) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        *nodes = df_xrealloc(*nodes, *cap * sizeof **nodes);
    }
    struct df_trie_node *x = &(*nodes)[*n];
    x->child = x->sibling = x->term = -1;
    x->byte = byte;
    return (int32_t)(*n)++;
}

static inline int32_t child_of(const struct df_trie_node *nodes, int32_t v, uint8_t b) {
    int32_t c = nodes[v].child;
    while (c >= 0 && nodes[c].byte != b) c = nodes[c].sibling;
    return c;
}

/* Inserts s[0..n) (reversed when rev), marking the end with term when it has none yet. */
static void insert(struct df_trie_node **nodes, size_t *nn, size_t *cap, const uint8_t *s, size_t n, int rev, int32_t term) {
    if (!*nn) node_new(nodes, nn, cap, 0);
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = s[rev ? n - 1 - i : i];
        int32_t found = child_of(*nodes, cur, b);
        if (found < 0) {
            found = node_new(nodes, nn, cap, b);
            (*nodes)[found].sibling = (*nodes)[cur].child;
            (*nodes)[cur].child = found;
        }
        cur = found;
    }
    if ((*nodes)[cur].term < 0) (*nodes)[cur].term = term; /* first token with this content wins */
}

void df_tok_trie_add(df_trie *tr, const uint8_t *s, size_t n, int32_t term) {
    if (!n) return;
    insert(&tr->nodes, &tr->n, &tr->cap, s, n, 0, term);
    tr->first[s[0]] = 1;
    if (n > tr->max_len) tr->max_len = n;
}

void df_tok_trie_finish(df_trie *tr) {
    if (tr->max_len <= DF_TRIE_WALK_MAX || tr->rev) return;
    /* the reversed tokens: enumerate the forward trie's terminal paths */
    size_t rcap = 0;
    int32_t *stack = df_xmalloc(tr->n * sizeof *stack);
    uint8_t *path = df_xmalloc(tr->max_len + 1);
    int32_t *depth = df_xcalloc(tr->n, sizeof *depth);
    size_t sp = 0;
    stack[sp++] = 0;
    while (sp) {
        int32_t v = stack[--sp];
        if (v) path[depth[v] - 1] = tr->nodes[v].byte;
        if (tr->nodes[v].term >= 0) insert(&tr->rev, &tr->rn, &rcap, path, (size_t)depth[v], 1, 1);
        for (int32_t c = tr->nodes[v].child; c >= 0; c = tr->nodes[c].sibling) {
            depth[c] = depth[v] + 1;
            stack[sp++] = c;
        }
    }
    free(path);
    free(depth);
    free(stack);
    /* failure links in breadth-first order, and per state the length of the
     * longest terminal state on its failure chain (itself included) */
    size_t rn = tr->rn;
    int32_t *fail = df_xcalloc(rn, sizeof *fail), *queue = df_xmalloc(rn * sizeof *queue), *rd = df_xcalloc(rn, sizeof *rd);
    tr->rlong = df_xcalloc(rn, sizeof *tr->rlong);
    size_t qh = 0, qt = 0;
    queue[qt++] = 0;
    while (qh < qt) {
        int32_t v = queue[qh++];
        if (v) tr->rlong[v] = tr->rev[v].term >= 0 ? (uint32_t)rd[v] : tr->rlong[fail[v]];
        for (int32_t u = tr->rev[v].child; u >= 0; u = tr->rev[u].sibling) {
            rd[u] = rd[v] + 1;
            int32_t f = 0;
            if (v) {
                f = fail[v];
                int32_t g;
                while ((g = child_of(tr->rev, f, tr->rev[u].byte)) < 0 && f) f = fail[f];
                f = g >= 0 ? g : 0;
            }
            fail[u] = f;
            queue[qt++] = u;
        }
    }
    tr->rfail = fail;
    free(queue);
    free(rd);
}

void df_tok_trie_free(df_trie *tr) {
    free(tr->nodes);
    free(tr->rev);
    free(tr->rfail);
    free(tr->rlong);
    memset(tr, 0, sizeof *tr);
}

void df_tok_trie_scan_begin(const df_trie *tr, const uint8_t *s, size_t n, df_trie_scan *sc) {
    sc->mlen = NULL;
    if (!tr->rev || !n) return;
    sc->mlen = df_xmalloc(n * sizeof *sc->mlen);
    int32_t v = 0;
    for (size_t i = n; i-- > 0;) {
        int32_t g;
        while ((g = child_of(tr->rev, v, s[i])) < 0 && v) v = tr->rfail[v];
        v = g >= 0 ? g : 0;
        sc->mlen[i] = tr->rlong[v];
    }
}

void df_tok_trie_scan_end(df_trie_scan *sc) {
    free(sc->mlen);
    sc->mlen = NULL;
}

size_t df_tok_trie_longest(const df_trie *tr, const df_trie_scan *sc, const uint8_t *s, size_t n, size_t p, int32_t *term) {
    size_t lim = n - p;
    if (sc->mlen) {
        lim = sc->mlen[p];
        if (!lim) return 0;
    } else if (!tr->first[s[p]]) {
        return 0;
    }
    int32_t cur = 0;
    size_t best = 0;
    for (size_t i = 0; i < lim; i++) {
        int32_t c = child_of(tr->nodes, cur, s[p + i]);
        if (c < 0) break;
        cur = c;
        if (tr->nodes[cur].term >= 0) { best = i + 1; *term = tr->nodes[cur].term; }
    }
    return best;
}
