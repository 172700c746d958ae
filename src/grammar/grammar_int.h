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
};

/* Frees the per-node mask cache (match.c). */
void df_gcache_free(df_grammar *g);

#endif
