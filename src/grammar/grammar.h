/* grammar.h - constrained decoding: a GBNF-like grammar text (docs/GRAMMAR.md)
 * compiled to a byte-level pushdown automaton, JSON schemas turned into such
 * grammars, a vocabulary index built once per tokenizer, and a matcher per
 * request that gives the set of tokens whose whole byte string keeps the
 * document a valid prefix (a bitset over the vocabulary).
 *
 * Floor 3 (below core): this module knows bytes, not tokenizers; the core
 * hands it each token's bytes when it builds the vocabulary index.
 *
 * Exactness: a token is allowed iff some path of the automaton consumes all
 * of its bytes (then, since every rule derives some finite string, the
 * document can still be completed). End-of-sequence ids are not in the index;
 * the caller allows them exactly when df_gmatch_complete() says so.
 *
 * Threads: a df_grammar may be shared by matchers on several threads (its
 * per-state mask cache is behind a mutex); a df_gmatch is one request's. */
#ifndef DF_GRAMMAR_GRAMMAR_H
#define DF_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "deltafin.h"
#include "util/util.h"

typedef struct df_grammar df_grammar;
typedef struct df_gvocab df_gvocab;
typedef struct df_gmatch df_gmatch;

/* Limits (a grammar past them is refused with a message naming the limit). */
#define DF_GRAMMAR_MAX_TEXT (1u << 20)    /* bytes of grammar text */
#define DF_GRAMMAR_MAX_NODES 2000000      /* automaton nodes after expanding repetitions */
#define DF_GRAMMAR_MAX_REPEAT 10000       /* m and n of {m,n} */
#define DF_GRAMMAR_MAX_HEADS 4096         /* live parse positions at one byte (ambiguous grammars) */
#define DF_GRAMMAR_MAX_WORK (1ull << 27)  /* parse steps in one mask / accept / reset call (matcher default) */

/* Compiles grammar text (len bytes) with start rule root. 0, or a negative
 * DF_E* code and a message naming the line:column and the rule. */
int df_grammar_compile(const char *text, size_t len, const char *root, df_grammar **out, char *err, size_t errlen);
/* Drops a reference (the last one frees). */
void df_grammar_free(df_grammar *g);
/* Same as df_grammar_compile, through a process-wide cache of the 8 grammars
 * used last (keyed by root and text): equal texts share one compiled grammar
 * and its warm mask caches. Free the result with df_grammar_free. */
int df_grammar_compile_cached(const char *text, size_t len, const char *root, df_grammar **out, char *err,
                              size_t errlen);
int df_grammar_n_nodes(const df_grammar *g);

/* Appends to *out the rules of a grammar for the JSON documents valid under
 * the schema (JSON text); its start rule is `<prefix>root`, every rule name
 * starts with prefix. schema "{}" or the json_object shape {"type":"object"}
 * gives any object. Unsupported keywords are refused (DF_EUNSUPPORTED) with a
 * message naming the keyword and where it is ("... at #/properties/a"). */
int df_json_schema_to_grammar(const char *schema_json, size_t len, const char *prefix, df_buf *out, char *err,
                              size_t errlen);

/* ---- vocabulary ------------------------------------------------------------
 * n tokens; bytes[i] / lens[i] the token's bytes (what decoding it alone
 * gives); excluded[i] (may be NULL) non-zero for tokens never allowed inside a
 * document (special tokens, incl. end-of-sequence ids: the caller adds those).
 * Tokens with no bytes are never allowed either. The index copies what it
 * needs. */
df_gvocab *df_gvocab_new(int n, const char *const *bytes, const size_t *lens, const uint8_t *excluded, char *err,
                         size_t errlen);
void df_gvocab_free(df_gvocab *v);
int df_gvocab_size(const df_gvocab *v);
/* uint32 words of a mask over this vocabulary: (n + 31) / 32 */
size_t df_gvocab_mask_words(const df_gvocab *v);

/* ---- matcher ---------------------------------------------------------------
 * The grammar and vocabulary must outlive the matcher. NULL + err on failure. */
df_gmatch *df_gmatch_new(df_grammar *g, const df_gvocab *v, char *err, size_t errlen);
void df_gmatch_free(df_gmatch *m);
/* Back to the empty document (keeps the memory). 0 or a negative code. */
int df_gmatch_reset(df_gmatch *m);
/* The most parse steps (positions visited, trie nodes walked) one call may
 * take before it is refused (DF_EUNSUPPORTED, state unchanged): a bound on
 * CPU time per token whatever the grammar (nested optional repetitions,
 * (x?){5000}, make every byte's closure thousands wide). Default
 * DF_GRAMMAR_MAX_WORK. */
void df_gmatch_set_work_limit(df_gmatch *m, uint64_t steps);
/* bits (df_gvocab_mask_words words): bit i set iff token i may come next.
 * 0, or a negative code (DF_EUNSUPPORTED: the grammar is too ambiguous, more
 * than DF_GRAMMAR_MAX_HEADS live positions, or the call passed its work
 * limit). */
int df_gmatch_mask(df_gmatch *m, uint32_t *bits);
/* Advances by one token's bytes; DF_EINPUT (state unchanged) if the token is
 * not allowed. */
int df_gmatch_accept(df_gmatch *m, int32_t token);
/* Advances by raw bytes (tests, forced text); DF_EINPUT if not a valid prefix. */
int df_gmatch_accept_bytes(df_gmatch *m, const char *p, size_t n);
/* 1 when the text so far is a complete document (end-of-sequence may come). */
int df_gmatch_complete(const df_gmatch *m);
/* 1 when complete and nothing can follow (generation must end). */
int df_gmatch_done(const df_gmatch *m);
const char *df_gmatch_error(const df_gmatch *m);

#endif
