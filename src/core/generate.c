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
 *   - only the session calls of deltafin.h are used: this file knows
 *     nothing of the engine's insides.
 */
#include "core/generate.h"

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
    df_gmatch *gm;        /* constrained decoding: the document so far */
    uint32_t *allow;      /* its mask, (vocab + 31) / 32 words */
    char err[256];
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

df_gen *df_gen_new(df_engine *e, df_session *s, const df_gen_config *cfg) {
    if (cfg->n_stop < 0 || cfg->top_logprobs < 0 || cfg->top_logprobs > DF_GEN_MAX_TOP || cfg->max_new < 0) return NULL;
    df_gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->e = e;
    g->s = s;
    g->cfg = *cfg;
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

int df_gen_step(df_gen *g, df_gen_token *out) {
    memset(out, 0, sizeof *out);
    out->text = "";
    if (g->over) return fail(g, out, DF_EINPUT, "the generation is over");
    int rc;
    double t;
    if (g->has_pending) {
        t = df_now();
        rc = df_session_push(g->s, g->pending);
        g->t_engine += df_now() - t;
        g->has_pending = 0;
        if (rc) return fail(g, out, rc, df_engine_error(g->e));
        g->pushed++;
    }
    if (g->n >= g->cfg.max_new) { /* max_new 0 */
        if ((rc = finish(g, "length"))) return fail(g, out, rc, "out of memory");
        hand_out(g, out);
        return 0;
    }
    const float *logits = g->cfg.logprobs ? df_session_logits(g->s) : NULL;
    int32_t id;
    df_sampling sp = g->cfg.sampling;
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
    rc = df_session_sample(g->s, &sp, &id);
    g->t_engine += df_now() - t;
    if (rc) return fail(g, out, rc, df_engine_error(g->e));
    int eos = 0;
    for (int i = 0; (!g->cfg.ignore_eos || g->gm) && i < g->info.n_eos; i++) eos |= g->info.eos_ids[i] == id;
    if (eos) {
        if ((rc = finish(g, "stop"))) return fail(g, out, rc, "out of memory");
        hand_out(g, out);
        return 0;
    }
    g->n++;
    out->has_token = 1;
    out->id = id;
    out->text_offset = g->len;
    if (logits) out->n_top = df_logprobs(logits, g->info.vocab_size, id, g->cfg.top_logprobs, &out->logprob, out->top);
    if (g->dt) {
        size_t n;
        const char *p = df_detok_push(g->dt, id, &n);
        if (put(g, p, n)) return fail(g, out, DF_ENOMEM, "out of memory");
    }
    if (g->gm && (rc = df_gmatch_accept(g->gm, id))) return fail(g, out, rc, df_gmatch_error(g->gm));
    if (stops(g, 0)) {
        g->over = 1;
        g->finish = "stop";
    } else if (g->gm && df_gmatch_done(g->gm)) { /* the document is complete and nothing can follow: EOS forced */
        if ((rc = finish(g, "stop"))) return fail(g, out, rc, "out of memory");
    } else if (g->n >= g->cfg.max_new || (g->cfg.max_context && df_session_len(g->s) >= g->cfg.max_context)) {
        if ((rc = finish(g, "length"))) return fail(g, out, rc, "out of memory");
    } else {
        g->pending = id;
        g->has_pending = 1;
    }
    hand_out(g, out);
    return g->over ? 0 : 1;
}

const char *df_gen_finish_reason(const df_gen *g) { return g->finish; }
long df_gen_count(const df_gen *g) { return g->n; }
size_t df_gen_pushed(const df_gen *g) { return g->pushed; }
double df_gen_engine_seconds(const df_gen *g) { return g->t_engine; }
const char *df_gen_error(const df_gen *g) { return g->err; }
