/* core.h - internals of the engine/session layer (not public). */
#ifndef DF_CORE_H
#define DF_CORE_H

#include "deltafin.h"
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
    uint64_t seed; /* the seed of the last df_rng_seed */
} df_rng;
void df_rng_seed(df_rng *r, uint64_t seed);
uint64_t df_rng_next(df_rng *r);
double df_rng_uniform(df_rng *r);
int df_argmax(const float *x, int n);
/* Checks a df_sampling: temperature finite (<= 0: greedy), top_p and min_p
 * in [0, 1] (top_p 0 or 1: off), top_k >= 0. Returns 0, or DF_EINPUT with a
 * one-line message naming the field, the range and the value. */
int df_sampling_check(const df_sampling *sp, char *err, size_t errlen);
/* The next token id, or DF_EINPUT if df_sampling_check refuses sp. When
 * sp->seed is non-zero and differs from the seed rng last had, rng is
 * reseeded with it first. work: scratch of n * 8 bytes. */
int df_sample(const float *logits, int n, const df_sampling *sp, df_rng *rng, void *work);

/* Speculative decoding (session.c; used by spec.c and generate.c). */
int df_session_truncatable(const df_session *s); /* every layer allows going back by truncation */
const int32_t *df_session_tokens(const df_session *s); /* the timeline, df_session_len ids */
size_t df_session_max_ctx(const df_session *s);
/* Samples from logits (not the session's own) with the session's RNG: the
 * same draw df_session_sample makes. */
int df_session_sample_logits(df_session *s, const float *logits, const df_sampling *sp, int32_t *out_id);
/* Appends ids[0..n) (n <= 64) in one batched forward and writes the logits
 * after each into out (n * vocab); truncatable models only. Its time and
 * expert bytes count as decode; tokens are credited by df_session_cut. On a
 * backend with exact products (df_session_verify_exact) row i of out is,
 * bit for bit, the logits of a plain step (df_session_push) of ids[i] after
 * ids[0..i): the pass runs every product in the one-token order. Where the
 * pass of ids[0] was queued ahead (df_session_sample_ahead,
 * df_session_queue), that queued plain step is row 0 and the pass runs over
 * ids[1..n). */
int df_session_verify(df_session *s, const int32_t *ids, size_t n, float *out);
/* 1 when the session's backend makes verify passes bit-identical to plain
 * steps (backend.h: exact_products; the CPU and CUDA backends), 0 otherwise. */
int df_session_verify_exact(const df_session *s);
/* Back to len (<= the length; truncation) with logits the distribution
 * there (NULL: unknown, recomputed when needed); credits `credited` decode
 * tokens to the engine's stats. */
int df_session_cut(df_session *s, size_t len, const float *logits, long credited);
/* Greedy decoding one token ahead (generate.c's plain steps): df_session_sample's choice where sp is greedy
 * without a mask, returned after the forward pass of that token has been queued (not run) at the next position,
 * so that a df_session_push of the same id returns at once and a device backend never waits for the host between
 * two tokens; every other session call first drops the queued pass (positions past the length are rewritten
 * before they are read). The ids are df_session_sample's: the logits' argmax by df_argmax's rule, on the backend.
 * Where the conditions are not met (sp, recurrent layers, an MTP module, a host expert cache, a full context, a
 * backend without the ops (backend.h next_token), or DELTAFIN_AHEAD=0) it is df_session_sample; a backend whose
 * ops run synchronously (the CPU) takes this path only with DELTAFIN_AHEAD=1. */
int df_session_sample_ahead(df_session *s, const df_sampling *sp, int32_t *out_id);
/* The forward pass of a token the caller already knows (the last token a verify pass decided) queued at the next
 * position as df_session_sample_ahead queues its own: the df_session_push of id, or a df_session_verify whose first
 * id it is, then confirms it, and a df_session_sample_ahead after that push finds the logits on the backend (no
 * synchronous step between a pass and the next). 1 when queued; 0 when not (the conditions of
 * df_session_sample_ahead but the sampling, or logits still on the backend): the push then runs the step. */
int df_session_queue(df_session *s, int32_t id);
/* 1 with *id the token whose pass is queued at the next position (df_session_sample_ahead, df_session_queue), else 0 */
int df_session_queued(const df_session *s, int32_t *id);
/* The main model's final hidden states (before the final norm), [max_ctx x
 * hidden], valid for positions below the length that this session computed;
 * NULL unless the model has an MTP module. */
const float *df_session_hidden(const df_session *s);

#endif
