/* spec.h - drafters and the economics of speculative decoding (spec.c);
 * the verify pass itself is in generate.c (it shares the emission path).
 *
 * A drafter sees the whole timeline (prompt + every chosen token, the one
 * not yet pushed included) through df_spec_append and proposes up to k
 * tokens that would follow it. */
#ifndef DF_CORE_SPEC_H
#define DF_CORE_SPEC_H

#include "deltafin.h"

#include <stddef.h>
#include <stdint.h>

typedef struct df_spec df_spec;
/* NULL on out of memory. mode: DF_SPEC_NGRAM, DF_SPEC_DRAFT or DF_SPEC_AUTO
 * (prompt lookup with the economics below). */
df_spec *df_spec_new(int mode, int k_max, df_engine *draft);
void df_spec_free(df_spec *sp);
/* DF_SPEC_MTP: drafts with the MTP module of the model of session s (the
 * session being generated in; it keeps the hidden states the module reads).
 * 0, or DF_EINPUT when the model has no MTP module (message in err). */
int df_spec_attach_mtp(df_spec *sp, df_session *s, char *err, size_t errlen);
/* The MTP module's logits for every entry of the timeline the session
 * holds: out[(len-1) x vocab], row i from h_i and token i+1 (tests, eval). */
int df_spec_mtp_eval(df_session *s, float *out, char *err, size_t errlen);
/* The engine generating (before the first df_spec_append): a DF_SPEC_DRAFT
 * drafter whose model has another tokenizer (df_spec_check_draft said so,
 * or the vocabulary sizes differ) drafts through text. 0 or DF_ENOMEM. */
int df_spec_set_target(df_spec *sp, df_engine *target);
int df_spec_text_level(const df_spec *sp);
/* The timeline grew by ids[0..n). */
int df_spec_append(df_spec *sp, const int32_t *ids, size_t n);
/* How many tokens to draft now (0: take a plain step); `room`: the most the
 * context and the token limit allow. ngram and auto: 0 without an n-gram
 * match, else the k of the best expected tokens per unit of time for the
 * match's length bucket (its measured acceptance, the measured cost of a
 * pass against a plain step); auto takes a plain step where no k gains
 * or where the bucket's rate is not measured yet, and then scores the
 * draft it would have made against the tokens that follow (a shadow). */
int df_spec_want(df_spec *sp, int room);
/* Up to k proposed tokens after the timeline into out; returns how many
 * (0: no proposal), or a DF_E* code (message in err). */
int df_spec_draft(df_spec *sp, int k, int32_t *out, char *err, size_t errlen);
/* Measurements: a verify pass of k drafts (accepted of them) took secs; a
 * plain step took secs. */
void df_spec_note_verify(df_spec *sp, int k, int accepted, double secs);
void df_spec_note_plain(df_spec *sp, double secs);
/* The draft length chosen last (auto: 0 when it chose a plain step). */
int df_spec_k_now(const df_spec *sp);
/* Expected tokens per plain step's time of a pass of k drafts, acceptance
 * a per draft (while the ones before it were accepted), a pass costing
 * 1 + beta * k plain steps. */
double df_spec_gain(double a, double beta, int k);

/* The prompt-lookup index, exposed for tests. It follows one match: an
 * earlier position whose preceding tokens equal the timeline's last
 * df_ngram_match_len tokens; while the timeline goes on as the match did,
 * the match grows (O(1) per token). When it breaks (or is shorter than 3),
 * the last 3 tokens are looked up: of the 16 most recent earlier
 * occurrences the one with the longest common suffix (compared up to 64
 * tokens; of equals the first at or after the anchor, else the most
 * recent), else an occurrence of the last 2, then the last 1 token: the
 * first at or after the anchor (the source position where the last match
 * of 8+ tokens broke off), else the most recent. df_ngram_draft proposes up to k tokens
 * that followed the match (continued periodically past the end). */
typedef struct df_ngram df_ngram;
df_ngram *df_ngram_new(void);
void df_ngram_free(df_ngram *ng);
int df_ngram_append(df_ngram *ng, const int32_t *ids, size_t n);
int df_ngram_draft(const df_ngram *ng, int k, int32_t *out);
size_t df_ngram_match_len(const df_ngram *ng);
/* 1 when the match is a 1-2 token key found at or after the anchor (where
 * the last copy of 4+ tokens broke off) rather than the most recent one */
int df_ngram_anchored(const df_ngram *ng);

#endif
