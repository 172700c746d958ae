/* core.h - internals of the engine/session layer (not public). */
#ifndef DF_CORE_H
#define DF_CORE_H

#include "deltafin.h"
#include <stdint.h>

typedef struct { uint64_t s[4]; } df_rng;
void df_rng_seed(df_rng *r, uint64_t seed);
uint64_t df_rng_next(df_rng *r);
double df_rng_uniform(df_rng *r);
int df_argmax(const float *x, int n);
/* work: scratch of n * 8 bytes */
int df_sample(const float *logits, int n, const df_sampling *sp, df_rng *rng, void *work);

#endif
