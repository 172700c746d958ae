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

#endif
