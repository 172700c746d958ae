/* session.c - sessions: one timeline over an engine (tokens, every
 * layer's state, sampler state) and its snapshots.
 *
 * A session's state is per layer kind (model.h): growing caches (attention)
 * and fixed-size states (recurrent mixers). Going back to an earlier
 * position is a truncation when every layer's state allows it; otherwise it
 * is a restore of a snapshot taken at or before that position (the fixed
 * states and the logits at the snapshot's position; growing caches are not
 * copied since positions before the snapshot are never rewritten while it
 * is kept). df_session_sync takes snapshots of its own at the end of each
 * prompt when the model needs them, so a server reusing a conversation's
 * prefix restores instead of recomputing. */
#include "core/core.h"
#include "core/engine_int.h"
#include "core/session_int.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

df_session *df_session_new(df_engine *e, int max_context) {
    const df_config *c = &e->model->cfg;
    if (max_context <= 0) max_context = c->max_pos < DF_DEFAULT_CTX ? c->max_pos : DF_DEFAULT_CTX;
    df_session *s = df_xcalloc(1, sizeof *s);
    s->e = e;
    /* activations for prompt calls of DF_PREFILL_BATCH positions; where the backend's memory budget refuses them
     * (a GPU budget set low), calls of DF_MAX_BATCH, said once */
    df_alloc_quiet = 1;
    int rc = df_state_init(e->model, max_context, DF_PREFILL_BATCH, DF_MAX_BATCH, &s->st, df_errbuf(), DF_ERRLEN);
    df_alloc_quiet = 0;
    if (rc) {
        rc = df_state_init(e->model, max_context, DF_MAX_BATCH, DF_MAX_BATCH, &s->st, df_errbuf(), DF_ERRLEN);
        if (!rc)
            fprintf(stderr, "deltafin: the session's activations for %d-position prompt calls do not fit the memory budget: prompts run in "
                            "calls of %d positions\n", DF_PREFILL_BATCH, DF_MAX_BATCH);
    }
    if (rc) {
        free(s);
        return NULL;
    }
    s->st.src = e->src;
    s->tokens = df_xmalloc((size_t)max_context * sizeof(int32_t));
    s->logits = df_xmalloc((size_t)c->vocab * sizeof(float));
    s->work = df_xmalloc((size_t)c->vocab * 2 * sizeof(float));
    if (e->model->mtp.layer) s->hid = df_xcalloc((size_t)max_context * (size_t)c->hidden, sizeof(float));
    df_rng_seed(&s->rng, 0);
    s->ahead_on = -1;
    return s;
}

static void snap_drop(snap_slot *p) {
    df_snapshot_free(&p->st);
    free(p->logits);
    memset(p, 0, sizeof *p);
}

void df_session_free(df_session *s) {
    if (!s) return;
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++) snap_drop(&s->snaps[i]);
    df_state_free(&s->st);
    free(s->tokens);
    free(s->logits);
    free(s->work);
    free(s->hid);
    free(s);
}

/* Keeps the final hidden states of positions pos..pos+n that the last
 * forward pass computed (the MTP drafter's input). */
static void keep_hidden(df_session *s, size_t pos, size_t n) {
    if (!s->hid) return;
    const size_t H = (size_t)s->e->model->cfg.hidden;
    df_read(s->hid + pos * H, s->st.x, n * H);
}

const float *df_session_hidden(const df_session *s) { return s->hid; }

size_t df_session_len(const df_session *s) { return s->len; }
size_t df_session_reused(const df_session *s) { return s->reused; }
const float *df_session_logits(df_session *s) {
    df_session_settle(s);
    return s->logits_valid ? s->logits : NULL;
}
void df_session_seed(df_session *s, uint64_t seed) { df_rng_seed(&s->rng, seed); }

static int check_ids(df_session *s, const int32_t *ids, size_t n) {
    const df_config *c = &s->e->model->cfg;
    if (n > (size_t)s->st.max_ctx)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "%zu tokens exceed the session context of %d", n, s->st.max_ctx);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "token id %d at position %zu is out of range (vocab_size %d)", ids[i], i, c->vocab);
    return 0;
}

/* Runs ids[from..n) after the cache holds ids[0..from); logits of the last. */
static int run_tokens(df_session *s, const int32_t *ids, size_t from, size_t n) {
    df_engine *e = s->e;
    /* positions from `from` on are rewritten: snapshots after it no longer describe this timeline */
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++)
        if (s->snaps[i].used && (size_t)s->snaps[i].st.pos > from) snap_drop(&s->snaps[i]);
    double t0 = df_now();
    size_t todo = n - from;
    df_ecache_stats es0 = {0}, es1 = {0};
    if (e->ecache) df_ecache_stats_get(e->ecache, &es0);
    df_tier_stats ts0, ts1;
    const int tiers = !df_tier_stats_get(&ts0);
    const size_t B = (size_t)s->st.max_batch;
    for (size_t p = from; p < n; p += B) {
        int cnt = (int)(n - p < B ? n - p : B);
        int rc = df_forward(e->model, &s->st, ids + p, cnt, (int)p, s->logits, 0);
        if (rc) return df_err(df_errbuf(), DF_ERRLEN, rc, "forward pass failed at position %zu: %s", p, s->st.err[0] ? s->st.err : "bad input");
        keep_hidden(s, p, (size_t)cnt);
        memcpy(s->tokens + p, ids + p, (size_t)cnt * sizeof(int32_t));
        s->len = p + (size_t)cnt;
    }
    double dt = df_now() - t0;
    if (e->ecache) df_ecache_stats_get(e->ecache, &es1);
    if (todo == 1) {
        e->stats.decode_bytes_read += es1.bytes_read - es0.bytes_read;
        e->stats.decode_io_wait_seconds += es1.io_wait_s - es0.io_wait_s;
        if (tiers && !df_tier_stats_get(&ts1)) e->stats.gpu_decode_h2d_expert_bytes += ts1.h2d_expert_bytes - ts0.h2d_expert_bytes;
        e->stats.decode_tokens++;
        e->stats.decode_seconds += dt;
        e->stats.weight_bytes_touched += e->model->bytes_active;
    } else {
        e->stats.prefill_tokens += (int64_t)todo;
        e->stats.prefill_seconds += dt;
    }
    e->stats.t_attention = s->st.t_attn;
    e->stats.t_experts = s->st.t_ffn;
    e->stats.t_other = s->st.t_other;
    s->logits_valid = 1;
    return 0;
}

/* Takes a snapshot at the current length into a free slot (or the oldest
 * automatic one when automatic); returns its id or DF_E*. */
static int take_snapshot(df_session *s, int automatic) {
    int slot = -1, n_auto = 0, oldest = -1;
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++) {
        if (!s->snaps[i].used) { if (slot < 0) slot = i; continue; }
        if (s->snaps[i].automatic) {
            n_auto++;
            if (oldest < 0 || s->snaps[i].age < s->snaps[oldest].age) oldest = i;
        }
    }
    if (automatic && n_auto >= DF_AUTO_SNAPSHOTS) snap_drop(&s->snaps[oldest]), slot = oldest;
    if (slot < 0) return df_err(df_errbuf(), DF_ERRLEN, DF_ENOMEM, "all %d snapshots of the session are in use", DF_MAX_SNAPSHOTS);
    snap_slot *p = &s->snaps[slot];
    if (df_state_snapshot(&s->st, (int)s->len, &p->st))
        return df_err(df_errbuf(), DF_ERRLEN, DF_ENOMEM, "cannot allocate a snapshot of %zu bytes", df_state_fixed_bytes(s->e->model));
    const size_t V = (size_t)s->e->model->cfg.vocab;
    if (s->logits_valid) {
        p->logits = df_xmalloc(V * sizeof(float));
        memcpy(p->logits, s->logits, V * sizeof(float));
    }
    p->used = 1, p->automatic = automatic, p->age = ++s->snap_clock;
    return slot;
}

static void restore_slot(df_session *s, snap_slot *p) {
    df_state_restore(&s->st, &p->st);
    s->len = (size_t)p->st.pos;
    s->logits_valid = p->logits != NULL;
    if (p->logits) memcpy(s->logits, p->logits, (size_t)s->e->model->cfg.vocab * sizeof(float));
    p->age = ++s->snap_clock;
}

void df_session_reset(df_session *s) {
    df_session_settle(s);
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++) snap_drop(&s->snaps[i]);
    df_state_clear_fixed(&s->st);
    s->len = 0;
    s->logits_valid = 0;
    s->reused = 0;
}

int df_session_snapshot(df_session *s) {
    df_session_settle(s);
    return take_snapshot(s, 0);
}

int df_session_restore(df_session *s, int id) {
    df_session_settle(s);
    if (id < 0 || id >= DF_MAX_SNAPSHOTS || !s->snaps[id].used)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "snapshot %d does not exist (dropped, or invalidated by rewriting an earlier position)", id);
    if ((size_t)s->snaps[id].st.pos > s->len && !df_state_truncatable(s->e->model))
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINTERNAL, "snapshot %d is past the session's length", id);
    restore_slot(s, &s->snaps[id]);
    return 0;
}

void df_session_snapshot_drop(df_session *s, int id) {
    if (id >= 0 && id < DF_MAX_SNAPSHOTS) snap_drop(&s->snaps[id]);
}

size_t df_session_snapshot_bytes(const df_session *s) {
    return df_state_fixed_bytes(s->e->model) + (size_t)s->e->model->cfg.vocab * sizeof(float);
}

/* Makes the session's length `to` (<= its length) by the cheapest exact
 * means: truncation where every layer allows it, else the latest snapshot
 * at or before `to`, else the empty state. Returns the new length. */
static size_t rewind_to(df_session *s, size_t to) {
    if (to == s->len) return to;
    if (df_state_truncatable(s->e->model)) {
        s->len = to;
        s->logits_valid = 0;
        return to;
    }
    int best = -1;
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++)
        if (s->snaps[i].used && (size_t)s->snaps[i].st.pos <= to && (best < 0 || s->snaps[i].st.pos > s->snaps[best].st.pos)) best = i;
    if (best >= 0) {
        restore_slot(s, &s->snaps[best]);
    } else {
        df_state_clear_fixed(&s->st);
        s->len = 0;
        s->logits_valid = 0;
    }
    return s->len;
}

size_t df_session_reusable(const df_session *s, const int32_t *ids, size_t n) {
    size_t common = 0;
    while (common < s->len && common < n && s->tokens[common] == ids[common]) common++;
    if (n == 0) return 0;
    if (common == n && s->len == n && s->logits_valid) return n;
    if (common >= n) common = n - 1;
    if (common == s->len || df_state_truncatable(s->e->model)) return common;
    size_t best = 0;
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++)
        if (s->snaps[i].used && (size_t)s->snaps[i].st.pos <= common && (size_t)s->snaps[i].st.pos > best) best = (size_t)s->snaps[i].st.pos;
    return best;
}

int df_session_sync(df_session *s, const int32_t *ids, size_t n) {
    df_session_settle(s);
    int rc = check_ids(s, ids, n);
    if (rc) return rc;
    size_t common = 0;
    while (common < s->len && common < n && s->tokens[common] == ids[common]) common++;
    s->reused = 0;
    if (n == 0) {
        rewind_to(s, 0);
        s->logits_valid = 0;
        return 0;
    }
    if (common == n && s->len == n && s->logits_valid) { s->reused = n; return 0; }
    if (common >= n) common = n - 1; /* recompute the last position for its logits */
    size_t from = rewind_to(s, common);
    s->reused = from;
    s->logits_valid = 0;
    rc = run_tokens(s, ids, from, n);
    if (!rc && !df_state_truncatable(s->e->model)) take_snapshot(s, 1); /* failure to snapshot only costs a later recompute */
    return rc;
}

int df_session_push(df_session *s, int32_t id) {
    if (s->ahead && id == s->ahead_id) { /* the pass df_session_sample_ahead queued: counted there, credited here */
        df_engine *e = s->e;
        s->tokens[s->len++] = id;
        s->ahead = 0, s->tok = 1, s->logits_valid = 0;
        e->stats.decode_tokens++, e->stats.decode_ahead_tokens++;
        e->stats.weight_bytes_touched += e->model->bytes_active;
        e->stats.t_attention = s->st.t_attn, e->stats.t_experts = s->st.t_ffn, e->stats.t_other = s->st.t_other;
        return 0;
    }
    df_session_settle(s);
    if (s->len >= (size_t)s->st.max_ctx)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "context full (%d tokens)", s->st.max_ctx);
    int rc = check_ids(s, &id, 1);
    if (rc) return rc;
    s->tokens[s->len] = id;
    return run_tokens(s, s->tokens, s->len, s->len + 1);
}

int df_session_sample(df_session *s, const df_sampling *sp, int32_t *out_id) {
    df_session_settle(s);
    if (!s->logits_valid)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, s->len ? "no logits at the session's end (a pass queued ahead replaced them: sync first)"
                                                               : "no logits: the session is empty");
    int rc = df_sampling_check(sp, df_errbuf(), DF_ERRLEN);
    if (rc) return rc;
    int id = df_sample(s->logits, s->e->model->cfg.vocab, sp, &s->rng, s->work);
    if (id < 0) return df_err(df_errbuf(), DF_ERRLEN, id, "sampling failed");
    *out_id = id;
    return 0;
}

int df_session_eval_all(df_session *s, const int32_t *ids, size_t n, float *out) {
    df_session_settle(s);
    int rc = check_ids(s, ids, n);
    if (rc) return rc;
    df_engine *e = s->e;
    const size_t V = (size_t)e->model->cfg.vocab;
    /* every position is recomputed: start from the empty state */
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++) if (s->snaps[i].used && s->snaps[i].st.pos > 0) snap_drop(&s->snaps[i]);
    df_state_clear_fixed(&s->st);
    s->len = 0;
    s->logits_valid = 0;
    double t0 = df_now();
    for (size_t p = 0; p < n; p += DF_MAX_BATCH) {
        int cnt = (int)(n - p < DF_MAX_BATCH ? n - p : DF_MAX_BATCH);
        rc = df_forward(e->model, &s->st, ids + p, cnt, (int)p, out + p * V, 1);
        if (rc) return df_err(df_errbuf(), DF_ERRLEN, rc, "forward pass failed at position %zu: %s", p, s->st.err[0] ? s->st.err : "bad input");
        keep_hidden(s, p, (size_t)cnt);
        memcpy(s->tokens + p, ids + p, (size_t)cnt * sizeof(int32_t));
        s->len = p + (size_t)cnt;
    }
    e->stats.prefill_tokens += (int64_t)n;
    e->stats.prefill_seconds += df_now() - t0;
    if (n) {
        memcpy(s->logits, out + (n - 1) * V, V * sizeof(float));
        s->logits_valid = 1;
    }
    return 0;
}


/* ---- speculative decoding helpers (core.h; used by spec.c/generate.c) ---- */

int df_session_truncatable(const df_session *s) { return df_state_truncatable(s->e->model); }
const int32_t *df_session_tokens(const df_session *s) { return s->tokens; }
size_t df_session_max_ctx(const df_session *s) { return (size_t)s->st.max_ctx; }

int df_session_sample_logits(df_session *s, const float *logits, const df_sampling *sp, int32_t *out_id) {
    int rc = df_sampling_check(sp, df_errbuf(), DF_ERRLEN);
    if (rc) return rc;
    int id = df_sample(logits, s->e->model->cfg.vocab, sp, &s->rng, s->work);
    if (id < 0) return df_err(df_errbuf(), DF_ERRLEN, id, "sampling failed");
    *out_id = id;
    return 0;
}

int df_session_verify_exact(const df_session *s) {
    (void)s;
    return df_be->exact_products != NULL;
}

int df_session_verify(df_session *s, const int32_t *ids, size_t n, float *out) {
    if (n >= 1 && n <= DF_MAX_BATCH && s->ahead && ids[0] == s->ahead_id && s->len + n <= (size_t)s->st.max_ctx) {
        /* the first id's pass was queued ahead (df_session_sample_ahead): a plain step, so its logits are the bits
         * this pass's first row would have; confirmed as df_session_push confirms it (tokens credited by the cut),
         * its logits read back, and the pass runs over the drafts after it */
        s->tokens[s->len++] = ids[0];
        s->ahead = 0, s->tok = 1, s->logits_valid = 0;
        s->e->stats.weight_bytes_touched += s->e->model->bytes_active;
        const double t0 = df_now();
        df_session_settle(s);
        s->e->stats.decode_seconds += df_now() - t0;
        const size_t V = (size_t)s->e->model->cfg.vocab;
        memcpy(out, s->logits, V * sizeof(float));
        return n == 1 ? 0 : df_session_verify(s, ids + 1, n - 1, out + V);
    }
    df_session_settle(s);
    if (!df_state_truncatable(s->e->model))
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "verify: the model has recurrent layers (no truncation)");
    if (n == 0 || n > DF_MAX_BATCH)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "verify: %zu positions, expected 1..%d", n, DF_MAX_BATCH);
    if (s->len + n > (size_t)s->st.max_ctx)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "context full (%d tokens)", s->st.max_ctx);
    int rc = check_ids(s, ids, n);
    if (rc) return rc;
    df_engine *e = s->e;
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++)
        if (s->snaps[i].used && (size_t)s->snaps[i].st.pos > s->len) snap_drop(&s->snaps[i]);
    df_ecache_stats es0 = {0}, es1 = {0};
    if (e->ecache) df_ecache_stats_get(e->ecache, &es0);
    double t0 = df_now();
    /* the products of the pass in the one-token order (backend.h:
     * exact_products), so each position's logits are the bits a plain step
     * gives; a backend without the mode runs its batched products */
    s->st.exact = df_exact_products(1);
    rc = df_forward(e->model, &s->st, ids, (int)n, (int)s->len, out, 1);
    (void)df_exact_products(0);
    s->st.exact = 0;
    if (rc) return df_err(df_errbuf(), DF_ERRLEN, rc, "forward pass failed at position %zu: %s", s->len, s->st.err[0] ? s->st.err : "bad input");
    keep_hidden(s, s->len, n);
    memcpy(s->tokens + s->len, ids, n * sizeof(int32_t));
    s->len += n;
    const size_t V = (size_t)e->model->cfg.vocab;
    memcpy(s->logits, out + (n - 1) * V, V * sizeof(float));
    s->logits_valid = 1;
    double dt = df_now() - t0;
    if (e->ecache) df_ecache_stats_get(e->ecache, &es1);
    e->stats.decode_bytes_read += es1.bytes_read - es0.bytes_read;
    e->stats.decode_io_wait_seconds += es1.io_wait_s - es0.io_wait_s;
    e->stats.decode_seconds += dt;
    e->stats.weight_bytes_touched += e->model->bytes_active;
    e->stats.t_attention = s->st.t_attn;
    e->stats.t_experts = s->st.t_ffn;
    e->stats.t_other = s->st.t_other;
    return 0;
}

int df_session_cut(df_session *s, size_t len, const float *logits, long credited) {
    df_session_settle(s);
    if (len > s->len || (len < s->len && !df_state_truncatable(s->e->model)))
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINTERNAL, "cut: length %zu of a session of %zu", len, s->len);
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++)
        if (s->snaps[i].used && (size_t)s->snaps[i].st.pos > len) snap_drop(&s->snaps[i]);
    if (len < s->len || logits) {
        s->len = len;
        s->logits_valid = logits != NULL;
        if (logits && logits != s->logits) memcpy(s->logits, logits, (size_t)s->e->model->cfg.vocab * sizeof(float));
    }
    s->e->stats.decode_tokens += credited;
    return 0;
}

/* ---- greedy decoding one token ahead (core.h) ---------------------------- */

/* the last pass queued ahead by any session: the backend's token slot holds its argmax (the slot is one per backend
 * on a device: a session whose pass is not the last takes its token from the host; an engine runs one generation at a
 * time, the server's queue.c) */
static int64_t ahead_seq;

void df_session_settle(df_session *s) {
    if (s->ahead) {
        /* the queued pass wrote position len (past the timeline, rewritten before it is read) and, when its token was
         * the backend's own, replaced the logits after len - 1 there: they stay unknown (logits_valid 0) */
        s->ahead = 0;
        return;
    }
    if (s->tok) {
        df_read(s->logits, s->st.logits, (size_t)s->e->model->cfg.vocab);
        s->logits_valid = 1;
        s->tok = 0;
    }
}

static int ahead_ok(df_session *s, const df_sampling *sp) {
    if (s->ahead_on < 0) {
        const char *v = getenv("DELTAFIN_AHEAD");
        const df_model *m = s->e->model;
        const int on = df_be->next_token && df_be->next_token_wait && !(v && !strcmp(v, "0")) && (df_be->queued || (v && !strcmp(v, "1"))) &&
                       df_state_truncatable(m) && !s->hid && !s->e->ecache;
        s->ahead_on = on ? (df_forward_ahead_embeds(m) ? 2 : 1) : 0;
    }
    return s->ahead_on && (!sp || (sp->temperature <= 0 && !sp->allow)) && s->len + 1 < (size_t)s->st.max_ctx && (s->logits_valid || s->tok);
}

int df_session_queued(const df_session *s, int32_t *id) {
    if (!s->ahead) return 0;
    *id = s->ahead_id;
    return 1;
}

int df_session_queue(df_session *s, int32_t id) {
    if (s->ahead || s->tok || !ahead_ok(s, NULL) || check_ids(s, &id, 1)) return 0;
    df_engine *e = s->e;
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++) /* position len is rewritten */
        if (s->snaps[i].used && (size_t)s->snaps[i].st.pos > s->len) snap_drop(&s->snaps[i]);
    const double t0 = df_now();
    int64_t tk = 0;
    if (df_forward_ahead(e->model, &s->st, &id, (int)s->len, &tk)) return 0; /* the push runs the step (and says what failed) */
    s->ahead = 1, s->ahead_id = id, s->ticket = tk, s->seq = __atomic_add_fetch(&ahead_seq, 1, __ATOMIC_ACQ_REL);
    e->stats.decode_seconds += df_now() - t0;
    return 1;
}

int df_session_sample_ahead(df_session *s, const df_sampling *sp, int32_t *out_id) {
    if (!ahead_ok(s, sp)) return df_session_sample(s, sp, out_id);
    int rc = df_sampling_check(sp, df_errbuf(), DF_ERRLEN);
    if (rc) return rc;
    if (s->ahead) df_session_settle(s);
    if (sp && sp->seed && sp->seed != s->rng.seed) df_rng_seed(&s->rng, sp->seed); /* as df_sample does */
    df_engine *e = s->e;
    for (int i = 0; i < DF_MAX_SNAPSHOTS; i++) /* position len is rewritten */
        if (s->snaps[i].used && (size_t)s->snaps[i].st.pos > s->len) snap_drop(&s->snaps[i]);
    df_tier_stats ts0, ts1;
    const int tiers = !df_tier_stats_get(&ts0);
    double t0 = df_now();
    int32_t id;
    int64_t tk = 0;
    if (s->tok && s->ahead_on == 2 && s->seq == __atomic_load_n(&ahead_seq, __ATOMIC_ACQUIRE)) {
        /* the pass of the token the backend is choosing, queued before the host knows it */
        rc = df_forward_ahead(e->model, &s->st, NULL, (int)s->len, &tk);
        id = df_be->next_token_wait(s->ticket);
    } else {
        if (s->tok) id = df_be->next_token_wait(s->ticket), s->tok = 0;
        else if ((rc = df_session_sample(s, sp, &id))) return rc;
        rc = df_forward_ahead(e->model, &s->st, &id, (int)s->len, &tk);
    }
    s->tok = 0;
    if (rc) {
        s->logits_valid = 0;
        return df_err(df_errbuf(), DF_ERRLEN, rc, "forward pass failed at position %zu: %s", s->len, s->st.err[0] ? s->st.err : "bad input");
    }
    s->ahead = 1, s->ahead_id = id, s->ticket = tk, s->seq = __atomic_add_fetch(&ahead_seq, 1, __ATOMIC_ACQ_REL);
    e->stats.decode_seconds += df_now() - t0;
    if (tiers && !df_tier_stats_get(&ts1)) e->stats.gpu_decode_h2d_expert_bytes += ts1.h2d_expert_bytes - ts0.h2d_expert_bytes;
    *out_id = id;
    return 0;
}
