/* generate.c - one generation step shared by `deltafin run` and the server
 * (see the generation section of deltafin.h).
 *
 * Invariants:
 *   - text[0..final) never contains a stop string nor the start of one
 *     unless generation is over; stop strings are found in the decoded
 *     text, so one that spans several tokens is found too;
 *   - the token chosen by a step is pushed at the start of the next step,
 *     so a step returns as soon as its token is chosen (a stream can send
 *     it before the next forward pass) and the last token is never pushed;
 *   - only session calls are used (deltafin.h, and for speculation the
 *     verify / cut / sample-from helpers of core.h): this file knows
 *     nothing of the engine's insides;
 *   - speculation never changes which tokens are chosen: every position of
 *     a verify pass is sampled with the same call and RNG as a plain step,
 *     in the same order, and the tokens it decides are handed out one per
 *     step through the same path; when generation ends, the session is cut
 *     back to what it would hold without speculation (settle).
 */
#include "core/generate.h"
#include "core/core.h"
#include "core/spec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine_int.h"
#include "grammar/grammar.h"
#include "util/util.h"

struct df_gen {
    df_engine *e;
    df_session *s;
    df_gen_config cfg;
    char **stop;          /* copies of the stop strings */
    df_model_info info;
    df_detok *dt;
    char *text;           /* all decoded text, cut at a stop string */
    size_t len, cap, final, given; /* given: text[0..given) handed out */
    long n;               /* tokens chosen */
    size_t pushed;
    int32_t pending;      /* chosen by the last step, to push first */
    int has_pending, over;
    const char *finish;
    double t_engine;
    /* a plain step pushed whose time is not noted yet (speculation's economics): a step queued ahead runs on the
     * device while the host goes on, and the host waits for it when it samples the token after it, so a plain step
     * is noted with that sampling's time added (close_plain) */
    int plain_open;
    double plain_dt;
    int k_next; /* the pending token's drafts, decided when it became known (-1: at its push) */
    df_gmatch *gm;        /* constrained decoding: the document so far */
    uint32_t *allow;      /* its mask, (vocab + 31) / 32 words */
    char err[256];
    /* speculative decoding: a verify pass decides up to k+1 tokens at once;
     * they wait in q[] and are handed out one per step through the same
     * path as a sampled token. q[0..qn-1) are already in the session. */
    df_spec *spec;
    df_spec_stats ss;
    int pending_in_session;
    size_t prompt_len, qbase;  /* qbase: the session length before the verify pass */
    int32_t q[DF_SPEC_MAX_K + 1], draft[DF_SPEC_MAX_K + 1];
    int qn, qi;
    float *ql;                 /* (k+1) * vocab logits of the verify pass */
};

int df_stop_scan(const char *text, size_t len, size_t final, const char *const *stop, int n_stop, int at_end,
                 size_t *cut) {
    size_t best = (size_t)-1;
    for (int i = 0; i < n_stop; i++) {
        const char *m = memmem(text + final, len - final, stop[i], strlen(stop[i]));
        if (m && (size_t)(m - text) < best) best = (size_t)(m - text);
    }
    if (best != (size_t)-1) { *cut = best; return 1; }
    size_t hold = 0;
    if (!at_end)
        for (int i = 0; i < n_stop; i++) {
            size_t sl = strlen(stop[i]);
            for (size_t k = sl - 1 < len - final ? sl - 1 : len - final; k > hold; k--)
                if (!memcmp(text + len - k, stop[i], k)) { hold = k; break; }
        }
    *cut = len - hold;
    return 0;
}

int df_logprobs(const float *logits, int vocab, int32_t id, int k, df_logprob *chosen, df_logprob *top) {
    float mx = logits[0];
    for (int i = 1; i < vocab; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    chosen->id = id;
    chosen->logprob = logits[id] - lse;
    if (k > DF_GEN_MAX_TOP) k = DF_GEN_MAX_TOP;
    int best[DF_GEN_MAX_TOP], nb = 0;
    for (int i = 0; i < vocab && k > 0; i++) { /* keep best[] sorted, ties to the lower id */
        if (nb == k && logits[i] <= logits[best[nb - 1]]) continue;
        int j = nb < k ? nb++ : nb - 1;
        while (j > 0 && logits[best[j - 1]] < logits[i]) { best[j] = best[j - 1]; j--; }
        best[j] = i;
    }
    for (int j = 0; j < nb; j++) {
        top[j].id = best[j];
        top[j].logprob = logits[best[j]] - lse;
    }
    return nb;
}

char *df_token_text(df_engine *e, int32_t id, size_t *n) {
    *n = 0;
    df_detok *d = df_has_tokenizer(e) ? df_detok_new(e) : NULL;
    if (!d) return NULL;
    size_t a, b;
    const char *p = df_detok_push(d, id, &a);
    char *out = malloc(a + 1);
    if (out) memcpy(out, p, a);
    p = df_detok_flush(d, &b);
    char *o2 = out ? realloc(out, a + b + 1) : NULL;
    if (!o2) { free(out); df_detok_free(d); return NULL; }
    memcpy(o2 + a, p, b);
    o2[a + b] = 0;
    *n = a + b;
    df_detok_free(d);
    return o2;
}

/* Speculation on or off for this generation (off: the reason in the stats). */
static int spec_setup(df_gen *g) {
    const df_gen_config *c = &g->cfg;
    g->ss.mode = c->spec;
    g->cfg.spec_max = c->spec_max ? c->spec_max : DF_SPEC_DEFAULT_K;
    const char *off = NULL;
    if (c->spec == DF_SPEC_NONE) return 0;
    if (c->spec == DF_SPEC_MTP && !df_engine_has_mtp(g->e)) off = "the model has no MTP module (or it is streamed): --spec mtp cannot draft";
    else if (c->constrained || c->grammar) off = "a constraint (grammar) chooses the tokens of this request";
    else if (!df_session_truncatable(g->s)) off = "the model has recurrent layers (Kimi Linear KDA): speculation is not built for them yet";
    else if (c->spec == DF_SPEC_AUTO && !df_session_verify_exact(g->s))
        off = "this backend's verify pass is not bit-identical to plain steps (no exact products): auto takes plain steps";
    else if (c->spec == DF_SPEC_DRAFT && !c->draft) off = "--spec draft without a draft model";
    if (off) {
        snprintf(g->ss.off_reason, sizeof g->ss.off_reason, "%s", off);
        return 0;
    }
    g->spec = df_spec_new(c->spec, g->cfg.spec_max, c->draft);
    g->ql = malloc((size_t)(g->cfg.spec_max + 1) * (size_t)g->info.vocab_size * sizeof(float));
    if (!g->spec || !g->ql || df_spec_set_target(g->spec, g->e)) return -1;
    g->ss.text_level = df_spec_text_level(g->spec);
    if (c->spec == DF_SPEC_MTP && df_spec_attach_mtp(g->spec, g->s, g->ss.off_reason, sizeof g->ss.off_reason)) {
        df_spec_free(g->spec); /* the reason is in the stats */
        g->spec = NULL;
        return 0;
    }
    if (g->prompt_len && df_spec_append(g->spec, df_session_tokens(g->s), g->prompt_len)) return -1;
    return 0;
}

void df_gen_spec_stats(const df_gen *g, df_spec_stats *out) {
    *out = g->ss;
    out->k_now = g->spec ? df_spec_k_now(g->spec) : 0;
}

df_gen *df_gen_new(df_engine *e, df_session *s, const df_gen_config *cfg) {
    if (cfg->spec < DF_SPEC_NONE || cfg->spec > DF_SPEC_AUTO || cfg->spec_max < 0 || cfg->spec_max > DF_SPEC_MAX_K) return NULL;
    if (cfg->n_stop < 0 || cfg->top_logprobs < 0 || cfg->top_logprobs > DF_GEN_MAX_TOP || cfg->max_new < 0) return NULL;
    df_gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->e = e;
    g->s = s;
    g->cfg = *cfg;
    g->k_next = -1;
    df_engine_info(e, &g->info);
    g->cfg.n_stop = cfg->text ? cfg->n_stop : 0; /* stop strings need text */
    g->cfg.stop = NULL;
    if (g->cfg.n_stop) {
        g->stop = calloc((size_t)g->cfg.n_stop, sizeof *g->stop);
        if (!g->stop) { df_gen_free(g); return NULL; }
        g->cfg.stop = (const char *const *)g->stop;
        for (int i = 0; i < g->cfg.n_stop; i++)
            if (!cfg->stop[i][0] || !(g->stop[i] = strdup(cfg->stop[i]))) { df_gen_free(g); return NULL; }
    }
    if (cfg->text && df_has_tokenizer(e) && !(g->dt = df_detok_new(e))) { df_gen_free(g); return NULL; }
    if (cfg->grammar) {
        df_gvocab *v = df_engine_gvocab(e);
        if (!v || !(g->gm = df_gmatch_new(cfg->grammar, v, df_errbuf(), DF_ERRLEN)) ||
            !(g->allow = calloc(df_gvocab_mask_words(v), sizeof *g->allow))) {
            df_gen_free(g);
            return NULL;
        }
    }
    df_session_seed(s, cfg->sampling.seed);
    g->prompt_len = df_session_len(s);
    if (spec_setup(g)) { df_gen_free(g); return NULL; }
    return g;
}

void df_gen_free(df_gen *g) {
    if (!g) return;
    df_detok_free(g->dt);
    df_gmatch_free(g->gm);
    free(g->allow);
    for (int i = 0; g->stop && i < g->cfg.n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->text);
    df_spec_free(g->spec);
    free(g->ql);
    free(g);
}

static int put(df_gen *g, const char *p, size_t n) {
    if (g->len + n + 1 > g->cap) {
        size_t cap = g->cap ? g->cap : 256;
        while (cap < g->len + n + 1) cap *= 2;
        char *t = realloc(g->text, cap);
        if (!t) return -1;
        g->text = t;
        g->cap = cap;
    }
    memcpy(g->text + g->len, p, n);
    g->len += n;
    g->text[g->len] = 0;
    return 0;
}

/* Stop strings over the not-yet-final text; 1 if one was found (the text is
 * then cut there). */
static int stops(df_gen *g, int at_end) {
    size_t cut;
    if (!g->text) return 0;
    int hit = df_stop_scan(g->text, g->len, g->final, g->cfg.stop, g->cfg.n_stop, at_end, &cut);
    if (hit) {
        g->len = cut;
        g->text[cut] = 0;
    }
    g->final = cut;
    return hit;
}

/* The end: the detokenizer's last bytes, a last stop check. */
static int finish(df_gen *g, const char *why) {
    g->over = 1;
    if (g->dt) {
        size_t n;
        const char *p = df_detok_flush(g->dt, &n);
        if (put(g, p, n)) return DF_ENOMEM;
    }
    g->finish = stops(g, 1) ? "stop" : why;
    return 0;
}

static void hand_out(df_gen *g, df_gen_token *out) {
    out->text = g->text ? g->text + g->given : "";
    out->text_len = g->final - g->given;
    g->given = g->final;
}

static int fail(df_gen *g, df_gen_token *out, int rc, const char *msg) {
    snprintf(g->err, sizeof g->err, "%s", msg);
    g->over = 1;
    if (g->dt) { /* the text held back is final now */
        size_t n;
        const char *p = df_detok_flush(g->dt, &n);
        if (!put(g, p, n)) g->final = g->len;
    }
    hand_out(g, out);
    return rc;
}

static int is_eos(const df_gen *g, int32_t id) {
    for (int i = 0; !g->cfg.ignore_eos && i < g->info.n_eos; i++)
        if (g->info.eos_ids[i] == id) return 1;
    return 0;
}

/* One verify pass: the pending token and k drafts in one batched forward;
 * every position is sampled exactly as a plain step would sample it (same
 * logits rule, same RNG draw), and a draft counts as accepted while it
 * equals that choice. With temperature > 0 this is speculative sampling
 * with a deterministic draft x: accepted with probability p(x), else the
 * token comes from p without x, renormalised (the draw was not x). The
 * session is cut back to the accepted prefix. Returns 0 or DF_E*. */
static int verify(df_gen *g, int k) {
    const size_t V = (size_t)g->info.vocab_size;
    g->draft[0] = g->pending;
    size_t base = df_session_len(g->s);
    double t0 = df_now();
    int rc = df_session_verify(g->s, g->draft, (size_t)k + 1, g->ql);
    if (rc) return rc;
    int acc = 0;
    g->qn = g->qi = 0;
    g->qbase = base;
    for (int i = 0; i <= k; i++) {
        int32_t y;
        if ((rc = df_session_sample_logits(g->s, g->ql + (size_t)i * V, &g->cfg.sampling, &y))) return rc;
        g->q[g->qn++] = y;
        if (i == k || y != g->draft[i + 1] || is_eos(g, y)) break;
        acc++;
    }
    if ((rc = df_session_cut(g->s, base + 1 + (size_t)acc, g->ql + (size_t)acc * V, acc + 1))) return rc;
    double dt = df_now() - t0;
    df_spec_note_verify(g->spec, k, acc, dt);
    g->ss.passes++;
    g->ss.drafted += k;
    g->ss.accepted += acc;
    g->ss.pass_tokens += g->qn;
    g->ss.t_verify += dt;
    return 0;
}

/* How many drafts the pending token's push takes (0: a plain step), the drafts in draft[1..k]. */
static int decide_k(df_gen *g) {
    if (!g->spec) return 0;
    double t = df_now();
    size_t len = df_session_len(g->s), lim = df_session_max_ctx(g->s);
    if (g->cfg.max_context && g->cfg.max_context < lim) lim = g->cfg.max_context;
    long room = lim > len + 1 ? (long)(lim - len - 1) : 0;
    if (g->cfg.max_new - g->n - 1 < room) room = g->cfg.max_new - g->n - 1;
    int k = df_spec_want(g->spec, room > DF_SPEC_MAX_K ? DF_SPEC_MAX_K : (int)room);
    if (k > 0) {
        k = df_spec_draft(g->spec, k, g->draft + 1, g->err, sizeof g->err);
        if (k < 0) {
            snprintf(g->ss.off_reason, sizeof g->ss.off_reason, "the drafter failed (%.120s): speculation off", g->err);
            df_spec_free(g->spec);
            g->spec = NULL;
            k = 0;
        }
        g->ss.t_draft += df_now() - t;
    }
    return k;
}

/* The pending token into the session: already there (an accepted draft),
 * a verify pass with drafts after it, or a plain step. */
static int push_pending(df_gen *g) {
    g->has_pending = 0;
    if (g->pending_in_session) { g->pushed++; return 0; }
    int k, rc;
    double t = df_now();
    if (g->k_next >= 0) k = g->k_next, g->k_next = -1; /* decided when the token became known (df_gen_step) */
    else k = decide_k(g);
    if (k > 0) {
        rc = verify(g, k);
    } else {
        double t1 = df_now();
        rc = df_session_push(g->s, g->pending);
        if (g->cfg.spec) g->plain_open = 1, g->plain_dt = df_now() - t1;
    }
    g->t_engine += df_now() - t;
    if (!rc) g->pushed++;
    return rc;
}

/* The plain step pushed last, noted with `extra` seconds (the sampling of the token after it, where the host
 * waited for it) */
static void close_plain(df_gen *g, double extra) {
    if (!g->plain_open) return;
    g->plain_open = 0;
    const double dt = g->plain_dt + extra;
    if (g->spec) df_spec_note_plain(g->spec, dt);
    g->ss.plain_steps++;
    g->ss.t_plain += dt;
}

/* Generation is over: the session holds the prompt and every chosen token
 * but the last, as without speculation (accepted drafts past it go). */
static void settle(df_gen *g) {
    size_t want = g->prompt_len + g->pushed, len = df_session_len(g->s);
    if (len <= want) return;
    const size_t V = (size_t)g->info.vocab_size;
    size_t i = want - g->qbase - 1; /* q position whose logits follow `want` tokens */
    df_session_cut(g->s, want, want > g->qbase && i < (size_t)g->qn ? g->ql + i * V : NULL, 0);
}

int df_gen_step(df_gen *g, df_gen_token *out) {
    memset(out, 0, sizeof *out);
    out->text = "";
    if (g->over) return fail(g, out, DF_EINPUT, "the generation is over");
    int rc;
    if (g->has_pending) {
        rc = push_pending(g);
        if (rc) { settle(g); return fail(g, out, rc, df_engine_error(g->e)); }
    }
    if (g->n >= g->cfg.max_new) { /* max_new 0 */
        close_plain(g, 0.0);
        if ((rc = finish(g, "length"))) return fail(g, out, rc, "out of memory");
        hand_out(g, out);
        return 0;
    }
    const float *logits = NULL;
    int32_t id;
    int in_session = 0;
    if (g->qi < g->qn) { /* decided by the last verify pass (never with a grammar: speculation is off then) */
        logits = g->ql + (size_t)g->qi * (size_t)g->info.vocab_size;
        id = g->q[g->qi++];
        in_session = g->qi < g->qn;
        close_plain(g, 0.0);
    } else {
        g->qi = g->qn = 0;
        logits = g->cfg.logprobs ? df_session_logits(g->s) : NULL;
        df_sampling sp = g->cfg.sampling;
        double t;
        if (g->gm) { /* the tokens that keep the document a valid prefix; end-of-sequence once it is complete */
            t = df_now();
            rc = df_gmatch_mask(g->gm, g->allow);
            g->t_engine += df_now() - t;
            if (rc) return fail(g, out, rc, df_gmatch_error(g->gm));
            int any = 0;
            for (int i = 0; i < g->info.n_eos && df_gmatch_complete(g->gm); i++)
                if (g->info.eos_ids[i] >= 0 && g->info.eos_ids[i] < g->info.vocab_size) {
                    g->allow[g->info.eos_ids[i] >> 5] |= 1u << (g->info.eos_ids[i] & 31);
                    any = 1;
                }
            for (size_t w = 0; !any && w < ((size_t)g->info.vocab_size + 31) / 32; w++) any = g->allow[w] != 0;
            if (!any) {
                if (df_gmatch_complete(g->gm)) { /* complete, and the model has no end-of-sequence id */
                    if ((rc = finish(g, "stop"))) return fail(g, out, rc, "out of memory");
                    hand_out(g, out);
                    return 0;
                }
                return fail(g, out, DF_EUNSUPPORTED, "grammar: no token of the vocabulary can continue the document");
            }
            sp.allow = g->allow;
        }
        t = df_now();
        /* greedy plain steps with another token to come: the next pass queued before this token is known (core.h) */
        /* with speculation, where its last choice was a plain step (the next one likely is too): a verify pass
         * that follows after all takes the queued pass as its first position (df_session_verify), at a plain
         * step's cost instead of a position's in the pass */
        const int ahead = !g->gm && !logits && (!g->spec || df_spec_k_now(g->spec) == 0) && g->n + 1 < g->cfg.max_new &&
                          (!g->cfg.max_context || g->prompt_len + g->pushed + 1 < (size_t)g->cfg.max_context);
        rc = ahead ? df_session_sample_ahead(g->s, &sp, &id) : df_session_sample(g->s, &sp, &id);
        close_plain(g, df_now() - t); /* where the last step was queued ahead, this waited for it */
        g->t_engine += df_now() - t;
        if (rc) return fail(g, out, rc, df_engine_error(g->e));
    }
    int eos = is_eos(g, id);
    for (int i = 0; g->gm && i < g->info.n_eos; i++) eos |= g->info.eos_ids[i] == id; /* a grammar's end even with ignore_eos */
    if (eos) {
        settle(g);
        if ((rc = finish(g, "stop"))) return fail(g, out, rc, "out of memory");
        hand_out(g, out);
        return 0;
    }
    g->n++;
    out->has_token = 1;
    out->id = id;
    out->text_offset = g->len;
    if (logits && g->cfg.logprobs) out->n_top = df_logprobs(logits, g->info.vocab_size, id, g->cfg.top_logprobs, &out->logprob, out->top);
    if (g->dt) {
        size_t n;
        const char *p = df_detok_push(g->dt, id, &n);
        if (put(g, p, n)) return fail(g, out, DF_ENOMEM, "out of memory");
    }
    if (g->gm && (rc = df_gmatch_accept(g->gm, id))) return fail(g, out, rc, df_gmatch_error(g->gm));
    if (g->spec && df_spec_append(g->spec, &id, 1)) return fail(g, out, DF_ENOMEM, "out of memory");
    if (stops(g, 0)) {
        g->over = 1;
        g->finish = "stop";
    } else if (g->gm && df_gmatch_done(g->gm)) { /* the document is complete and nothing can follow: EOS forced */
        if ((rc = finish(g, "stop"))) return fail(g, out, rc, "out of memory");
    } else if (g->n >= g->cfg.max_new || (g->cfg.max_context && g->prompt_len + g->pushed >= g->cfg.max_context)) {
        if ((rc = finish(g, "length"))) return fail(g, out, rc, "out of memory");
    } else {
        g->pending = id;
        g->has_pending = 1;
        g->pending_in_session = in_session;
        int32_t qid;
        if (g->spec && !in_session && !(df_session_queued(g->s, &qid) && qid == id)) {
            /* the token is known on the host and its step not queued (a pass decided it, or the host sampled it): its
             * push decided now, and a plain step queued at once (no wait for the device between a pass and it) */
            double t = df_now();
            g->k_next = decide_k(g);
            if (g->k_next == 0) (void)df_session_queue(g->s, id);
            g->t_engine += df_now() - t;
        }
    }
    if (g->over) settle(g);
    hand_out(g, out);
    return g->over ? 0 : 1;
}

const char *df_gen_finish_reason(const df_gen *g) { return g->finish; }
long df_gen_count(const df_gen *g) { return g->n; }
size_t df_gen_pushed(const df_gen *g) { return g->pushed; }
double df_gen_engine_seconds(const df_gen *g) { return g->t_engine; }
const char *df_gen_error(const df_gen *g) { return g->err; }
