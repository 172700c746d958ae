/* session_int.h - the session struct, shared by session.c (timelines,
 * snapshots) and session_file.c (a session's state in a file). Private to
 * src/core. */
#ifndef DF_CORE_SESSION_INT_H
#define DF_CORE_SESSION_INT_H

#include "core/core.h"
#include "core/engine_int.h"
#include "model/model.h"
#include "util/util.h"

#define DF_MAX_BATCH 64      /* positions of a call with logits at each: verify passes, eval chunks */
#define DF_PREFILL_BATCH 512 /* positions of a prompt's forward call: each weight is read (CPU: dequantized into panels;
                              * streamed experts: read from the cache or disk) once per call, so fewer calls read less */
#define DF_DEFAULT_CTX 4096
#define DF_MAX_SNAPSHOTS 16
#define DF_AUTO_SNAPSHOTS 4 /* taken by df_session_sync; the oldest is dropped first */

typedef struct {
    int used, automatic;
    uint64_t age;
    df_snapshot st;
    float *logits;   /* [vocab] at the snapshot's position (NULL when the position is 0) */
} snap_slot;

struct df_session {
    df_engine *e;
    df_state st;
    int32_t *tokens;
    size_t reused;   /* positions the last df_session_sync kept */
    size_t len;
    int logits_valid;
    float *logits;   /* [vocab] */
    float *work;     /* sampler scratch [vocab * 2] */
    df_rng rng;
    snap_slot snaps[DF_MAX_SNAPSHOTS];
    uint64_t snap_clock;
    float *hid;      /* [max_ctx x hidden]: the final hidden state (before the final norm) of every
                        position, kept when the model has an MTP module (its drafter's input); else NULL */
    /* greedy decoding ahead (df_session_sample_ahead): ahead: the pass of ahead_id at position len is queued;
     * tok: the argmax of the logits after the last position (len, or len - 1 without ahead) was started on the
     * backend (ticket), and with tok_dev those logits are on the backend only (logits_valid 0) */
    int ahead, tok, tok_dev, ahead_on; /* ahead_on: -1 not decided yet, 0 off, 1 host tokens, 2 the backend's token slot */
    int32_t ahead_id;
    int64_t ticket, seq;
};

/* Drops a pass queued ahead and brings logits left on the backend to the host (session.c): every session call
 * that reads or changes the state begins with it. */
void df_session_settle(df_session *s);

/* Empties the session (session.c): every snapshot dropped, fixed states
 * zero, length 0, no logits. */
void df_session_reset(df_session *s);

#endif
