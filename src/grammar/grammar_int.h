/* grammar_int.h - the compiled automaton shared by gbnf.c (compiler) and
 * match.c (vocabulary index, matcher). Not public.
 *
 * A grammar is a set of rules; each rule is a byte-level NFA fragment from
 * its start node to its end node. Edges: a byte range (consumes one byte), an
 * epsilon, or a call (push the return node, go to the called rule's start).
 * Reaching a rule's end node pops the stack. Left recursion is refused at
 * compile time (so closures terminate) and every rule reachable from the root
 * must derive some finite string (so every reachable configuration can still
 * complete: a token is allowed iff its bytes can be consumed). */
#ifndef DF_GRAMMAR_INT_H
#define DF_GRAMMAR_INT_H

#include "grammar/grammar.h"

#include <pthread.h>
#include <stdatomic.h>

enum { GE_RANGE = 0, GE_EPS = 1, GE_CALL = 2 };

typedef struct {
    uint8_t kind, lo, hi;
    int32_t to;   /* RANGE/EPS: target; CALL: return node */
    int32_t rule; /* CALL: the called rule */
} df_gedge;

/* Per-node cache of the context-independent part of the mask (match.c). */
typedef struct df_gnode_cache df_gnode_cache;

/* A lazily built DFA over sets of parse positions whose stacks are all
 * BOTTOM (match.c): the per-node cache walks step through it by table lookup
 * instead of running closures, and states are shared across nodes (the
 * positions of a bounded string reach the same states). Under df_grammar.mu. */
typedef struct {
    int32_t n, cap;
    int32_t *trans;  /* [cap * 256]: -1 unknown, -2 not a DFA step, else next state | ctx << 30 */
    int32_t *noff;   /* [cap + 1]: state s is the nodes[noff[s] .. noff[s+1]) */
    int32_t *nodes;
    size_t nn, ncap;
    int32_t *slot;   /* hash of states: id + 1, 0 empty; hcap slots */
    uint32_t hcap;
} df_gdfa;

struct df_grammar {
    int n_nodes;
    int32_t *eoff;    /* [n_nodes + 1]: node i's edges are edges[eoff[i] .. eoff[i+1]) */
    df_gedge *edges;
    uint8_t *is_end;  /* [n_nodes]: a rule's end node */
    uint8_t *has_range; /* [n_nodes]: the node has a byte edge (a parse position) */
    int n_rules;
    int32_t *rstart, *rend; /* [n_rules] */
    char **rname;
    int root;
    atomic_int refs; /* df_grammar_free drops one; the last frees (cache.c shares grammars) */
    /* mask cache, bound to one vocabulary (the first matcher's) */
    pthread_mutex_t mu;
    const df_gvocab *cv;
    df_gnode_cache **cache; /* [n_nodes], lazily built */
    df_gdfa dfa;
};

/* Frees the per-node mask cache (match.c). */
void df_gcache_free(df_grammar *g);

#endif
