/* mtp.h - the multi-token-prediction (MTP) module of DeepSeek-V3/R1 and
 * Kimi K2 checkpoints, run as a drafter (mtp.c).
 *
 * Entry i of the module combines the main model's final hidden state h_i
 * (before the final norm) with the embedding of the token t_{i+1} that
 * follows it and predicts t_{i+2}:
 *   x   = eh_proj([enorm(emb(t_{i+1})); hnorm(h_i)])
 *   x   = decoder layer (attention over entries 0..i, its own cache; MoE)
 *   out = head(shared_head.norm(x))
 * Chained drafting feeds x (the layer's output, before the norm) back as
 * the next entry's h. Internal to src/model and src/core. */
#ifndef DF_MODEL_MTP_H
#define DF_MODEL_MTP_H

#include "model/model.h"

typedef struct df_mtp df_mtp;

/* The module's state for entries 0..max_ctx-1 (its layer's cache and a
 * scratch for DF batches of up to max_batch entries). NULL with a message
 * in err when the model has no MTP module or memory is short. */
df_mtp *df_mtp_new(const df_model *m, int max_ctx, int max_batch, char *err, size_t errlen);
void df_mtp_free(df_mtp *p);
/* Runs entries pos0..pos0+n (n <= max_batch): h [n x hidden] host, tok[n]
 * the tokens after them. Writes the logits of the last entry (or of every
 * entry when all) into logits, and when hout is not NULL the last entry's
 * output hidden state [hidden]. 0 or DF_E* (message in err). */
int df_mtp_forward(df_mtp *p, const float *h, const int32_t *tok, int n, int pos0, float *logits, int all, float *hout,
                   char *err, size_t errlen);

#endif
