/* spec.c - drafters for speculative decoding and when drafting pays.
 *
 *   - ngram (prompt lookup): the index follows one match, an earlier
 *     position whose preceding tokens equal the timeline's last ones; while
 *     the timeline repeats what followed it the match grows by one per
 *     token (a copied file is followed line by line, O(1) per token). When
 *     it breaks, the last 3 tokens are looked up in a hash index of every
 *     earlier 3-gram (chained to its earlier occurrences): the longest
 *     common suffix among the 16 most recent wins, else a 2-gram, then a
 *     1-gram. Where a copy of 8+ tokens broke off is kept (the anchor): a
 *     1-2 token key takes its first occurrence at or after it, else its
 *     most recent (an edit's answer comes back to the file further on).
 *     The tokens that followed the match are the draft.
 *   - draft: a second engine with the same vocabulary drafts greedily in
 *     its own session, synced to the timeline before each draft (the common
 *     prefix is kept, so only the new tokens are computed).
 *   - how many to draft (ngram and auto): a plain step costs t1, a verify
 *     pass of k drafts c_k (both measured as it runs, c_k per k; see
 *     pass_cost); draft i of a match of m tokens is accepted at the rate
 *     a_i of the bucket of m + i (1-2, 3-7, 8-15, 16+ tokens: a long match
 *     is a copy and goes on; 1-2 tokens found at the anchor: their own
 *     bucket), so a pass yields 1 + a_0 + a_0 a_1 + ... tokens; each draft
 *     is scored in its own position's bucket, and k is the one with the
 *     best expected tokens per unit of time: long accepted runs raise a and
 *     k up to --spec-max, misses lower them. ngram drafts whenever there is
 *     a match. auto drafts only in a bucket whose rate was measured (3-8
 *     scored drafts, `evidence`; 8-15 and 16+ take the shorter bucket's
 *     while theirs is not) and where some k beats a plain step; at each plain step with a match
 *     it keeps the draft the drafter would have made (a shadow) and scores
 *     it against the tokens that follow, so a bucket's rate is measured,
 *     and kept current, without paying for passes: where drafting fails
 *     auto costs nothing but the drafter's lookups, and where the answer
 *     starts copying the shadows raise the rate and passes begin.
 * Which tokens are chosen never depends on any of this (generate.c samples
 * every position as a plain step would), only how many forward passes it
 * takes. */
#include "core/spec.h"
#include "core/core.h"
#include "core/session_int.h"
#include "model/mtp.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DF_NGRAM_MAX 3
#define DF_SPEC_BUCKETS 5
#define DF_SPEC_BETA0 0.3        /* verify cost per drafted token / plain step, until measured */
#define DF_SPEC_DECAY 0.9        /* weight of a bucket's past tries at each new pass */
/* auto: no pass in a bucket before this many (decayed) scored drafts, shadows
 * included; more for 1-2 token matches, the weakest evidence of a copy */
static const double evidence[DF_SPEC_BUCKETS] = {8, 3, 3, 3, 3};
#define DF_SPEC_LOSS_SHARE 0.03  /* auto: past this share lost, only passes expected to gain DF_SPEC_MARGIN run */
#define DF_SPEC_MARGIN 1.2
#define DF_SPEC_MARGIN0 1.1 /* auto: a pass must be expected to gain this much (its cost and rate are estimates) */
#define DF_SPEC_EXPLORE_TRIES 4 /* auto: at most 2 drafts until a bucket has this many (decayed) tries, prior included */
#define DF_NGRAM_CAND 16  /* earlier occurrences of the suffix's 3-gram compared per lookup */
#define DF_NGRAM_LONG 64  /* match lengths are compared up to this many tokens */
#define DF_NGRAM_ANCHOR_MIN 8 /* a match this long that breaks sets the anchor */
#define DF_NGRAM_WALK 512 /* occurrences of a 1-2 token key walked back to the anchor */

/* ---- n-gram index --------------------------------------------------------- */

typedef struct { uint64_t h; int64_t end; } ng_slot; /* end < 0: empty */

struct df_ngram {
    int32_t *hist;
    int64_t *prev[DF_NGRAM_MAX]; /* prev[n-1][e]: the previous end of the n-gram ending at e (-1: none) */
    size_t len, cap, indexed; /* n-grams ending before `indexed` are in the tables */
    ng_slot *tab[DF_NGRAM_MAX];
    size_t tcap[DF_NGRAM_MAX], tused[DF_NGRAM_MAX];
    /* the match followed: hist[src - mlen .. src) equals the timeline's
     * last mlen tokens (src < len, mlen 0: none); hist[src] is drafted first */
    size_t src, mlen;
    /* where a copy broke off: the source position the last match of
     * DF_NGRAM_ANCHOR_MIN+ tokens would have drafted next (SIZE_MAX: none).
     * An edit's answer leaves the file it copies (a changed line, a skipped
     * block) and comes back to it further on: a short key (1-2 tokens) is
     * then matched at its first occurrence from there, not the most recent
     * one anywhere. anchored: the match was found that way. */
    size_t anchor;
    int anchored;
};

static uint64_t ng_hash(const int32_t *t, int n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return h | 1; /* never 0 */
}

df_ngram *df_ngram_new(void) {
    df_ngram *ng = calloc(1, sizeof(df_ngram));
    if (ng) ng->anchor = SIZE_MAX;
    return ng;
}

void df_ngram_free(df_ngram *ng) {
    if (!ng) return;
    for (int i = 0; i < DF_NGRAM_MAX; i++) free(ng->tab[i]);
    free(ng->hist);
    for (int i = 0; i < DF_NGRAM_MAX; i++) free(ng->prev[i]);
    free(ng);
}

/* The slot of the n-gram hist[end-n+1..end]: its own or the empty one where it goes. */
static ng_slot *ng_find(const df_ngram *ng, int n, const int32_t *key, uint64_t h) {
    ng_slot *t = ng->tab[n - 1];
    size_t mask = ng->tcap[n - 1] - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        if (t[i].end < 0) return &t[i];
        if (t[i].h == h && !memcmp(ng->hist + t[i].end - n + 1, key, (size_t)n * sizeof *key)) return &t[i];
    }
}

static int ng_grow(df_ngram *ng, int n) {
    size_t ocap = ng->tcap[n - 1], ncap = ocap ? ocap * 2 : 1024;
    ng_slot *old = ng->tab[n - 1], *t = malloc(ncap * sizeof *t);
    if (!t) return DF_ENOMEM;
    for (size_t i = 0; i < ncap; i++) t[i].end = -1;
    ng->tab[n - 1] = t;
    ng->tcap[n - 1] = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].end >= 0) *ng_find(ng, n, ng->hist + old[i].end - n + 1, old[i].h) = old[i];
    free(old);
    return 0;
}

/* How many tokens before hist[e+1] and before the end of the timeline agree
 * (up to DF_NGRAM_LONG). */
static size_t ng_common(const df_ngram *ng, size_t e) {
    size_t l = 0;
    while (l < DF_NGRAM_LONG && l <= e && ng->hist[e - l] == ng->hist[ng->len - 1 - l]) l++;
    return l;
}

/* A new match for the timeline's suffix: among the last DF_NGRAM_CAND
 * earlier occurrences of its 3-gram the one with the longest common suffix
 * (of equals: the first at or after the anchor, else the most recent),
 * else a 2-gram, then a 1-gram: its first occurrence at or after the anchor
 * (among the DF_NGRAM_WALK most recent), else its most recent.
 * Bounded work whatever the length. */
static void ng_lookup(df_ngram *ng) {
    ng->mlen = 0, ng->anchored = 0;
    const size_t an = ng->anchor;
    for (int n = DF_NGRAM_MAX; n >= 1; n--) {
        if ((size_t)n > ng->len || !ng->tcap[n - 1]) continue;
        const int32_t *key = ng->hist + ng->len - n;
        ng_slot *s = ng_find(ng, n, key, ng_hash(key, n));
        if (s->end < 0) continue;
        int64_t best = s->end, near = -1; /* near: the earliest occurrence seen whose continuation is at or after the anchor */
        size_t bl = n == DF_NGRAM_MAX ? ng_common(ng, (size_t)s->end) : (size_t)n, nl = 0;
        if (an != SIZE_MAX && (size_t)s->end + 1 >= an) near = s->end, nl = bl;
        const int cand = n == DF_NGRAM_MAX ? DF_NGRAM_CAND : an != SIZE_MAX ? DF_NGRAM_WALK : 1;
        int64_t e = ng->prev[n - 1][s->end];
        for (int c = 1; c < cand && e >= 0; c++, e = ng->prev[n - 1][e]) {
            size_t l = n == DF_NGRAM_MAX ? ng_common(ng, (size_t)e) : (size_t)n;
            if (l > bl) bl = l, best = e;
            if (an != SIZE_MAX && (size_t)e + 1 >= an && l >= nl) near = e, nl = l;
            if (n < DF_NGRAM_MAX && (an == SIZE_MAX || (size_t)e + 1 < an)) break; /* past the anchor: the nearest is known */
        }
        if (near >= 0 && nl == bl) best = near, ng->anchored = n < DF_NGRAM_MAX;
        ng->src = (size_t)best + 1, ng->mlen = bl;
        return;
    }
}

int df_ngram_append(df_ngram *ng, const int32_t *ids, size_t n) {
    if (!n) return 0;
    if (ng->len + n > ng->cap) {
        size_t cap = ng->cap ? ng->cap : 1024;
        while (cap < ng->len + n) cap *= 2;
        int32_t *h = realloc(ng->hist, cap * sizeof *h);
        if (!h) return DF_ENOMEM;
        ng->hist = h;
        for (int k = 0; k < DF_NGRAM_MAX; k++) {
            int64_t *pv = realloc(ng->prev[k], cap * sizeof *pv);
            if (!pv) return DF_ENOMEM;
            ng->prev[k] = pv;
        }
        ng->cap = cap;
    }
    for (size_t i = 0; i < n; i++) { /* the match followed goes on while the timeline repeats what followed it */
        if (ng->mlen && ng->hist[ng->src] == ids[i]) ng->src++, ng->mlen++;
        else {
            if (ng->mlen >= DF_NGRAM_ANCHOR_MIN) ng->anchor = ng->src; /* a copy broke off here */
            ng->mlen = 0;
        }
        ng->hist[ng->len++] = ids[i];
    }
    /* index every n-gram ending before the last token: a lookup of the
     * timeline's suffix then finds earlier occurrences only */
    for (; ng->indexed + 1 < ng->len; ng->indexed++) {
        size_t e = ng->indexed;
        for (int k = 1; k <= DF_NGRAM_MAX; k++) ng->prev[k - 1][e] = -1;
        for (int k = 1; k <= DF_NGRAM_MAX && (size_t)k <= e + 1; k++) {
            if ((ng->tused[k - 1] + 1) * 2 > ng->tcap[k - 1] && ng_grow(ng, k)) return DF_ENOMEM;
            const int32_t *key = ng->hist + e - k + 1;
            uint64_t h = ng_hash(key, k);
            ng_slot *s = ng_find(ng, k, key, h);
            if (s->end < 0) ng->tused[k - 1]++;
            ng->prev[k - 1][e] = s->end; /* the chain of this n-gram's occurrences, newest first */
            s->h = h, s->end = (int64_t)e; /* the most recent occurrence wins */
        }
    }
    /* a match shorter than the longest n-gram is looked up again: a longer one may exist */
    if (ng->mlen < DF_NGRAM_MAX) ng_lookup(ng);
    return 0;
}

size_t df_ngram_match_len(const df_ngram *ng) { return ng->mlen; }
int df_ngram_anchored(const df_ngram *ng) { return ng->mlen && ng->anchored; }

int df_ngram_draft(const df_ngram *ng, int k, int32_t *out) {
    if (!ng->mlen) return 0;
    /* what followed the match; past the end of the timeline the match
     * repeats with period len - src: continue it periodically */
    size_t from = ng->src, period = ng->len - from;
    int m = 0;
    for (; m < k; m++) out[m] = (size_t)m < period ? ng->hist[from + (size_t)m] : out[(size_t)m - period];
    return m;
}

/* ---- the drafter and its economics ---------------------------------------- */

struct df_spec {
    int mode, k_max, k;
    df_ngram *ng;
    df_engine *draft;
    df_session *ds;      /* the draft model's session */
    int32_t *dtmp;
    /* mtp: the module's entries 0..mtp_len-1 hold the committed timeline
     * (entry i: h_i and t_{i+1}); entries past it are chained drafts */
    df_session *ts;      /* the target session (its hidden states) */
    df_mtp *mtp;
    size_t mtp_len;
    float *mlog, *mh, *mh2; /* [vocab], [hidden] x2 */
    int mV, mH;
    /* ngram and auto: the cost model (see choose) */
    double t1;            /* plain step seconds */
    double cost[DF_SPEC_MAX_K + 1]; /* seconds of a verify pass of k drafts, measured (0: not yet) */
    double succ[DF_SPEC_BUCKETS], tries[DF_SPEC_BUCKETS]; /* per match-length bucket: accepted drafts, and tries (accepted + the miss), decayed */
    double t_total, t_loss; /* auto: seconds of all steps and passes; what passes that lost cost beyond plain steps */
    int n_plain, n_verify, bucket;
    int trace;           /* DELTAFIN_SPEC_TRACE set: one line per decision on stderr */
    double seen[DF_SPEC_BUCKETS]; /* auto: scored drafts per bucket (real and shadow tries, decayed; no prior) */
    /* auto's shadow draft: what the drafter proposed at a plain step,
     * scored against the tokens that followed (free acceptance data) */
    int32_t sh[DF_SPEC_MAX_K];
    int sh_n, sh_pos, sh_anch, sh_last;
    size_t sh_m;
    size_t pm;            /* the match length the last pass drafted from */
    int panch;            /* ... and whether it was anchored */
    /* draft across tokenizers: the committed text (the target's detokenized
     * timeline) and where each timeline token ends in it */
    int text_level;
    df_engine *target;
    df_detok *tdt;
    char *text;
    size_t tlen, tcap, *toff, ocap, n_text; /* n_text: timeline tokens in text */
};

df_spec *df_spec_new(int mode, int k_max, df_engine *draft) {
    df_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return NULL;
    sp->mode = mode;
    sp->k_max = k_max;
    sp->k = k_max;
    sp->trace = getenv("DELTAFIN_SPEC_TRACE") && *getenv("DELTAFIN_SPEC_TRACE");
    static const double prior[DF_SPEC_BUCKETS] = {0.3, 0.5, 0.7, 0.8, 0.3}; /* longer matches go on more often */
    /* ngram: the prior is worth two tries; auto measures every bucket on
     * shadow drafts before its first pass, so its prior only breaks ties
     * (worth half a try: an optimistic prior over 3-4 scored drafts made
     * passes on chat answers whose drafts come true 10-15% of the time) */
    const double w = mode == DF_SPEC_AUTO ? 0.5 : 2;
    for (int b = 0; b < DF_SPEC_BUCKETS; b++) sp->succ[b] = w * prior[b], sp->tries[b] = w;
    if (!(sp->ng = df_ngram_new())) { free(sp); return NULL; }
    if (mode == DF_SPEC_DRAFT) {
        sp->draft = draft;
        sp->ds = draft ? df_session_new(draft, 0) : NULL;
        if (!sp->ds) { df_spec_free(sp); return NULL; }
    }
    return sp;
}

void df_spec_free(df_spec *sp) {
    if (!sp) return;
    df_ngram_free(sp->ng);
    df_session_free(sp->ds);
    df_mtp_free(sp->mtp);
    df_detok_free(sp->tdt);
    free(sp->text), free(sp->toff);
    free(sp->mlog), free(sp->mh), free(sp->mh2);
    free(sp->dtmp);
    free(sp);
}

static int text_put(df_spec *sp, const char *p, size_t n) {
    if (sp->tlen + n + 1 > sp->tcap) {
        size_t cap = sp->tcap ? sp->tcap : 1024;
        while (cap < sp->tlen + n + 1) cap *= 2;
        char *t = realloc(sp->text, cap);
        if (!t) return DF_ENOMEM;
        sp->text = t, sp->tcap = cap;
    }
    memcpy(sp->text + sp->tlen, p, n);
    sp->tlen += n;
    sp->text[sp->tlen] = 0;
    return 0;
}

/* The bucket of draft i of a draft made from a match of m tokens (anch:
 * the match was anchored): the match is m + i tokens long when draft i is
 * scored, so a copy's long drafts measure the long buckets too. */
static int bucket_at(size_t m, int anch) { return m < 3 ? (anch ? 4 : 0) : m < 8 ? 1 : m < 16 ? 2 : 3; }

/* A draft of k tokens from a match of m of which the first `accepted` were
 * right: each accepted draft a success, the first rejected one a failure,
 * each in the bucket of its own position (a bucket's past decayed once per
 * draft that reaches it). */
static void tally(df_spec *sp, size_t m, int anch, int k, int accepted) {
    int last = -1;
    for (int i = 0; i < k && i <= accepted; i++) {
        const int b = bucket_at(m + (size_t)i, anch), ok = i < accepted;
        if (b != last) sp->succ[b] *= DF_SPEC_DECAY, sp->tries[b] *= DF_SPEC_DECAY, sp->seen[b] *= DF_SPEC_DECAY, last = b;
        sp->succ[b] += ok, sp->tries[b] += 1, sp->seen[b] += 1;
    }
}

/* auto's shadow draft against the tokens the steps chose: scored as a pass
 * of sh_n drafts would have been (tally's sums), at no cost, and credited
 * token by token (the decay once, when the shadow starts), so a copy's
 * rate rises as it is seen, not sh_n tokens later. */
static void shadow_score(df_spec *sp, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n && sp->sh_n; i++) {
        const int b = bucket_at(sp->sh_m + (size_t)sp->sh_pos, sp->sh_anch), ok = ids[i] == sp->sh[sp->sh_pos];
        if (b != sp->sh_last) sp->succ[b] *= DF_SPEC_DECAY, sp->tries[b] *= DF_SPEC_DECAY, sp->seen[b] *= DF_SPEC_DECAY, sp->sh_last = b;
        sp->succ[b] += ok, sp->tries[b] += 1, sp->seen[b] += 1;
        if (!ok || ++sp->sh_pos == sp->sh_n) sp->sh_n = 0;
    }
}

int df_spec_append(df_spec *sp, const int32_t *ids, size_t n) {
    shadow_score(sp, ids, n);
    int rc = df_ngram_append(sp->ng, ids, n);
    if (rc || !sp->text_level) return rc;
    if (sp->n_text + n > sp->ocap) {
        size_t cap = sp->ocap ? sp->ocap : 1024;
        while (cap < sp->n_text + n) cap *= 2;
        size_t *o = realloc(sp->toff, cap * sizeof *o);
        if (!o) return DF_ENOMEM;
        sp->toff = o, sp->ocap = cap;
    }
    for (size_t i = 0; i < n; i++) { /* bytes held back (an incomplete UTF-8 sequence) join the text with a later token */
        size_t b;
        const char *p = df_detok_push(sp->tdt, ids[i], &b);
        if (text_put(sp, p, b)) return DF_ENOMEM;
        sp->toff[sp->n_text++] = sp->tlen;
    }
    return 0;
}

int df_spec_set_target(df_spec *sp, df_engine *target) {
    sp->target = target;
    if (sp->mode != DF_SPEC_DRAFT || !sp->draft) return 0;
    df_model_info a, b;
    df_engine_info(target, &a);
    df_engine_info(sp->draft, &b);
    sp->text_level = (a.vocab_size != b.vocab_size || sp->draft->draft_text_level) && df_has_tokenizer(target) && df_has_tokenizer(sp->draft);
    if (sp->text_level && !(sp->tdt = df_detok_new(target))) return DF_ENOMEM;
    return 0;
}

int df_spec_text_level(const df_spec *sp) { return sp->text_level; }


int df_spec_k_now(const df_spec *sp) { return sp->k; }

/* The bucket of a match length: 1-2, 3-7, 8-15, 16+ tokens. A longer match
 * is more likely to go on (code being copied), so each has its own rate. */
static int bucket_of(const df_spec *sp, size_t m) { return bucket_at(m, df_ngram_anchored(sp->ng)); }

/* Expected tokens per unit of time (a plain step = 1) of a pass of k drafts
 * each accepted with probability a while the ones before it were: it yields
 * 1 + a + ... + a^k tokens and costs 1 + beta * k plain steps. */
double df_spec_gain(double a, double beta, int k) {
    if (a > 0.99) a = 0.99;
    if (a < 0) a = 0;
    return (1 - pow(a, k + 1)) / (1 - a) / (1 + beta * k);
}

/* The seconds of a pass of k drafts: the most of what passes of up to k
 * drafts measured (a pass is never cheaper than a shorter one); a k longer
 * than the longest measured, jm, is extrapolated from it at the cost per
 * draft it showed ((c_jm - t1) / jm, at least 0), so a
 * longer pass gets tried when its acceptance would pay even at that cost,
 * and measured then; with none measured, t1 * (1 + DF_SPEC_BETA0 * k).
 * Measured per k, not as one line through a plain step: batched kernels
 * can give a pass a fixed cost (2 positions costing much more than a step
 * where 9 cost little more than that), and the exact verify products cost
 * most of a step per position. */
static double pass_cost(const df_spec *sp, int k) {
    double c = 0;
    int jm = 0;
    for (int j = 1; j <= k; j++)
        if (sp->cost[j] > 0) {
            if (sp->cost[j] > c) c = sp->cost[j];
            jm = j;
        }
    if (!jm) return sp->t1 * (1 + DF_SPEC_BETA0 * k);
    if (jm < k) {
        double per = (sp->cost[jm] - sp->t1) / jm;
        if (per < 0) per = 0;
        if (sp->cost[jm] + per * (k - jm) > c) c = sp->cost[jm] + per * (k - jm);
    }
    return c;
}

/* auto: bucket b's rate is measured (evidence[b] scored drafts), or it is
 * a copy bucket (8-15, 16+) whose shorter neighbour's is: a longer match goes
 * on at least as often as a shorter one, so until its own drafts are
 * scored it takes that rate (rate_of); a copy that runs through the
 * buckets is not stopped for three shadows at each. */
static int measured(const df_spec *sp, int b) {
    return sp->seen[b] >= evidence[b] || ((b == 2 || b == 3) && measured(sp, b - 1));
}
static double rate_of(const df_spec *sp, int b) {
    if (sp->mode == DF_SPEC_AUTO && (b == 2 || b == 3) && sp->seen[b] < evidence[b] && measured(sp, b - 1)) return rate_of(sp, b - 1);
    return sp->succ[b] / sp->tries[b];
}

/* The k of the best expected tokens per plain step's time for a draft
 * from a match of m tokens (anch: anchored), 1..k_max, and that gain: draft
 * i is accepted at the rate of bucket_at(m + i) while the ones before it
 * were, so a pass yields 1 + a_0 + a_0 a_1 + ... tokens. */
static int choose(const df_spec *sp, size_t m, int anch, double *g) {
    int best = 1;
    double e = 1, p = 1;
    *g = -1;
    for (int k = 1; k <= sp->k_max; k++) {
        const int b = bucket_at(m + (size_t)k - 1, anch);
        const double a = rate_of(sp, b);
        p *= a > 0.99 ? 0.99 : a < 0 ? 0 : a;
        e += p;
        double gk = e * sp->t1 / pass_cost(sp, k);
        if (gk > *g) *g = gk, best = k;
    }
    return best;
}

/* auto, taking a plain step where the drafter has a match: the draft it
 * would have made becomes the shadow, scored as the tokens arrive. */
static int plain_step(df_spec *sp, size_t m) {
    sp->k = 0;
    if (sp->mode == DF_SPEC_AUTO && m && !sp->sh_n) {
        int n = df_ngram_draft(sp->ng, sp->k_max < DF_SPEC_MAX_K ? sp->k_max : DF_SPEC_MAX_K, sp->sh);
        if (n > 0) {
            sp->sh_m = m, sp->sh_anch = df_ngram_anchored(sp->ng), sp->sh_last = -1;
            sp->sh_n = n, sp->sh_pos = 0;
        }
    }
    return 0;
}

/* DELTAFIN_SPEC_TRACE: the decision at timeline length len, its reason,
 * the match length, its bucket's measured rate and the gain chosen. */
static int trace(const df_spec *sp, const char *why, size_t m, int b, double g, int k) {
    if (sp->trace)
        fprintf(stderr, "[spec] at %zu: %s match %zu bucket %d rate %.2f seen %.1f gain %.2f k %d\n", sp->ng->len, why, m,
                b, b >= 0 ? rate_of(sp, b) : 0, b >= 0 ? sp->seen[b] : 0, g, k);
    return k;
}

int df_spec_want(df_spec *sp, int room) {
    if (room <= 0) return 0;
    if (sp->mode != DF_SPEC_NGRAM && sp->mode != DF_SPEC_AUTO) return sp->k < room ? sp->k : room;
    const size_t m = df_ngram_match_len(sp->ng);
    if (!m) return trace(sp, "plain: no match", 0, -1, 0, 0); /* nothing to draft from: a plain step */
    if (!sp->n_plain) return plain_step(sp, m); /* a plain step first: its time is the unit */
    double g;
    const int anch = df_ngram_anchored(sp->ng);
    int b = sp->bucket = bucket_of(sp, m), k = choose(sp, m, anch, &g);
    sp->pm = m, sp->panch = anch;
    if (sp->mode == DF_SPEC_AUTO) {
        /* no pass on the prior alone: a bucket's rate is first measured on
         * shadow drafts (plain steps cost nothing extra), so answers that
         * do not copy never pay for exploring passes */
        if (!measured(sp, b)) return trace(sp, "plain: evidence", m, b, g, plain_step(sp, m));
        /* short passes while the bucket has few tries (a long pass that
         * misses costs several steps: each position of a verify pass costs
         * most of a plain step's compute) */
        if (sp->tries[b] < DF_SPEC_EXPLORE_TRIES && k > 2) k = 2;
        /* a marginal gain does not pay for passes once those that lost have
         * cost DF_SPEC_LOSS_SHARE of the time (short passes on answers that
         * rarely copy: each costs more than the steps it saves); the
         * bucket's rate keeps being measured on shadow drafts, so drafting
         * resumes where the answer starts to copy */
        if (g < DF_SPEC_MARGIN0 || (g < DF_SPEC_MARGIN && sp->t_loss > DF_SPEC_LOSS_SHARE * sp->t_total))
            return trace(sp, g < DF_SPEC_MARGIN0 ? "plain: gain" : "plain: loss share", m, b, g, plain_step(sp, m));
        sp->sh_n = 0; /* a pass measures this bucket itself */
    }
    sp->k = k;
    trace(sp, "pass", m, b, g, k);
    return k < room ? k : room;
}

void df_spec_note_plain(df_spec *sp, double secs) {
    sp->t1 = sp->n_plain++ ? 0.8 * sp->t1 + 0.2 * secs : secs;
    sp->t_total += secs;
}

void df_spec_note_verify(df_spec *sp, int k, int accepted, double secs) {
    sp->n_verify++;
    if ((sp->mode != DF_SPEC_NGRAM && sp->mode != DF_SPEC_AUTO) || k <= 0) return;
    if (sp->trace) fprintf(stderr, "[spec]   pass of %d: %d accepted, %.2f plain steps\n", k, accepted, sp->t1 > 0 ? secs / sp->t1 : 0);
    tally(sp, sp->pm, sp->panch, k, accepted); /* geometric: each accepted draft a success, the first rejected one a failure */
    sp->t_total += secs;
    if (k <= DF_SPEC_MAX_K) sp->cost[k] = sp->cost[k] > 0 ? 0.7 * sp->cost[k] + 0.3 * secs : secs;
    double loss = secs - sp->t1 * (accepted + 1); /* beyond the plain steps it saved */
    if (loss > 0) sp->t_loss += loss;
}

int df_spec_attach_mtp(df_spec *sp, df_session *s, char *err, size_t errlen) {
    const df_model *m = s->e->model;
    sp->ts = s;
    if (!df_session_hidden(s))
        return df_err(err, errlen, DF_EINPUT, "%s has no MTP module (config num_nextn_predict_layers and tensors model.layers.%d.eh_proj/enorm/hnorm/shared_head)",
                      m->dir, m->cfg.n_layers);
    if (strcmp(df_be->name, "cpu")) /* its weights are not registered with a device backend */
        return df_err(err, errlen, DF_EUNSUPPORTED, "--spec mtp runs on the CPU backend only (the backend is %s)", df_be->name);
    sp->mtp = df_mtp_new(m, (int)df_session_max_ctx(s), DF_MAX_BATCH, err, errlen);
    if (!sp->mtp) return DF_EINPUT;
    sp->mV = m->cfg.vocab, sp->mH = m->cfg.hidden;
    sp->mlog = malloc((size_t)sp->mV * sizeof(float));
    sp->mh = malloc((size_t)sp->mH * sizeof(float));
    sp->mh2 = malloc((size_t)sp->mH * sizeof(float));
    if (!sp->mlog || !sp->mh || !sp->mh2) return df_err(err, errlen, DF_ENOMEM, "MTP drafter: out of memory");
    return 0;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* MTP drafting: the session holds S positions, the timeline S + 1 tokens
 * (the chosen one not yet pushed last). The entries S-1 back to mtp_len
 * are computed from the session's hidden states (the last of them drafts
 * t_{S+1}), then each further draft chains the module's own output hidden
 * state with the draft before it. */
static int mtp_draft(df_spec *sp, int k, int32_t *out, char *err, size_t errlen) {
    const df_ngram *ng = sp->ng;
    const size_t S = df_session_len(sp->ts), max = df_session_max_ctx(sp->ts);
    if (S == 0 || ng->len != S + 1) return 0;
    if (S - 1 + (size_t)k > max) k = (int)(max - (S - 1));
    if (k <= 0) return 0;
    const float *hid = df_session_hidden(sp->ts);
    const size_t H = (size_t)sp->mH;
    size_t from = sp->mtp_len < S ? sp->mtp_len : S - 1;
    int rc;
    for (size_t p = from; p < S; p += DF_MAX_BATCH) {
        int cnt = (int)(S - p < DF_MAX_BATCH ? S - p : DF_MAX_BATCH);
        if ((rc = df_mtp_forward(sp->mtp, hid + p * H, ng->hist + p + 1, cnt, (int)p, sp->mlog, 0, sp->mh, err, errlen))) return rc;
    }
    sp->mtp_len = S;
    out[0] = argmax(sp->mlog, sp->mV);
    for (int i = 1; i < k; i++) {
        memcpy(sp->mh2, sp->mh, H * sizeof(float));
        if ((rc = df_mtp_forward(sp->mtp, sp->mh2, &out[i - 1], 1, (int)(S - 1) + i, sp->mlog, 0, sp->mh, err, errlen))) return rc;
        out[i] = argmax(sp->mlog, sp->mV);
    }
    return k;
}

int df_spec_mtp_eval(df_session *s, float *out, char *err, size_t errlen) {
    df_spec *sp = df_spec_new(DF_SPEC_MTP, 1, NULL);
    if (!sp) return df_err(err, errlen, DF_ENOMEM, "out of memory");
    int rc = df_spec_attach_mtp(sp, s, err, errlen);
    const size_t S = df_session_len(s), V = (size_t)s->e->model->cfg.vocab, H = (size_t)s->e->model->cfg.hidden;
    const int32_t *ids = df_session_tokens(s);
    const float *hid = df_session_hidden(s);
    for (size_t p = 0; !rc && p + 1 < S; p += DF_MAX_BATCH) {
        int cnt = (int)(S - 1 - p < DF_MAX_BATCH ? S - 1 - p : DF_MAX_BATCH);
        rc = df_mtp_forward(sp->mtp, hid + p * H, ids + p + 1, cnt, (int)p, out + p * V, 1, NULL, err, errlen);
    }
    df_spec_free(sp);
    return rc;
}

int df_session_mtp_logits(df_session *s, float *out) { return df_spec_mtp_eval(s, out, df_errbuf(), DF_ERRLEN); }

int df_engine_has_mtp(const df_engine *e) { return e->model->mtp.layer != NULL; }

/* Drafting across tokenizers: the draft model's session is synced to the
 * committed text tokenized by its own tokenizer (the common prefix of ids is
 * kept), it generates k + 1 tokens greedily, and their text D is appended to
 * the text of the timeline's last m target tokens (m = 3, 2, 1) and
 * tokenized by the target's tokenizer: when that starts with those m tokens
 * (the boundary agrees), the tokens after them are the drafts, the last one
 * excepted (its bytes may continue in text the draft did not write). */
#define DF_TEXT_TAIL 3
static int text_draft(df_spec *sp, int k, int32_t *out, char *err, size_t errlen) {
    const df_ngram *ng = sp->ng;
    if (!sp->tlen || ng->len != sp->n_text) return 0;
    int32_t *dids = NULL, *tids = NULL;
    size_t nd = 0, nt = 0, dlen = 0, cap = 256;
    char *buf = NULL;
    df_detok *dd = NULL;
    int got = 0, rc = df_tokenize(sp->draft, sp->text, sp->tlen, &dids, &nd);
    if (rc) { rc = df_err(err, errlen, rc, "draft model: tokenizing the text: %s", df_engine_error(sp->draft)); goto out; }
    df_model_info di;
    df_engine_info(sp->draft, &di);
    if (nd && df_engine_adds_bos(sp->draft) && di.bos_id >= 0 && dids[0] != di.bos_id) { /* as its plain-text prompts start */
        int32_t *t = realloc(dids, (nd + 1) * sizeof *t);
        if (!t) { rc = df_err(err, errlen, DF_ENOMEM, "out of memory"); goto out; }
        dids = t;
        memmove(dids + 1, dids, nd * sizeof *dids);
        dids[0] = di.bos_id, nd++;
    }
    const size_t max = df_session_max_ctx(sp->ds);
    int kd = k + 1;
    if (!nd || nd + 1 > max) goto out; /* nothing to continue from, or the draft session is full: no drafts */
    if (nd + (size_t)kd > max) kd = (int)(max - nd);
    if ((rc = df_session_sync(sp->ds, dids, nd))) { rc = df_err(err, errlen, rc, "draft model: %s", df_engine_error(sp->draft)); goto out; }
    /* buf: the text of the last m0 target tokens (the tail), then the draft's text */
    const size_t m0 = ng->len < DF_TEXT_TAIL ? ng->len : DF_TEXT_TAIL;
    const size_t tail_at = ng->len > m0 ? sp->toff[ng->len - m0 - 1] : 0, tail = sp->tlen - tail_at;
    if (!(buf = malloc(tail + cap)) || !(dd = df_detok_new(sp->draft))) { rc = df_err(err, errlen, DF_ENOMEM, "out of memory"); goto out; }
    memcpy(buf, sp->text + tail_at, tail);
    for (int i = 0; i <= kd; i++) {
        int32_t id;
        size_t b;
        const char *p;
        if (i < kd) {
            if ((rc = df_session_sample(sp->ds, NULL, &id))) { rc = df_err(err, errlen, rc, "draft model: %s", df_engine_error(sp->draft)); goto out; }
            if (i + 1 < kd && (rc = df_session_push(sp->ds, id))) { rc = df_err(err, errlen, rc, "draft model: %s", df_engine_error(sp->draft)); goto out; }
            p = df_detok_push(dd, id, &b);
        } else {
            p = df_detok_flush(dd, &b);
        }
        if (dlen + b > cap) {
            while (dlen + b > cap) cap *= 2;
            char *t = realloc(buf, tail + cap);
            if (!t) { rc = df_err(err, errlen, DF_ENOMEM, "out of memory"); goto out; }
            buf = t;
        }
        memcpy(buf + tail + dlen, p, b);
        dlen += b;
    }
    for (size_t m = m0; dlen && m >= 1 && !got; m--) {
        const size_t at = ng->len > m ? sp->toff[ng->len - m - 1] : 0;
        free(tids), tids = NULL;
        if ((rc = df_tokenize(sp->target, buf + (at - tail_at), sp->tlen - at + dlen, &tids, &nt))) {
            rc = df_err(err, errlen, rc, "tokenizing the draft's text: %s", df_engine_error(sp->target));
            goto out;
        }
        if (nt <= m + 1 || memcmp(tids, ng->hist + ng->len - m, m * sizeof *tids)) continue; /* the boundary moved */
        for (size_t i = m; i + 1 < nt && got < k; i++) out[got++] = tids[i];
    }
out:
    free(dids), free(tids), free(buf);
    df_detok_free(dd);
    return rc ? rc : got;
}

int df_spec_draft(df_spec *sp, int k, int32_t *out, char *err, size_t errlen) {
    if (k <= 0) return 0;
    if (sp->mode == DF_SPEC_MTP) return mtp_draft(sp, k, out, err, errlen);
    if (sp->mode != DF_SPEC_DRAFT) return df_ngram_draft(sp->ng, k, out);
    if (sp->text_level) return text_draft(sp, k, out, err, errlen);

    /* the draft model: sync its session to the timeline, then k greedy steps */
    const df_ngram *ng = sp->ng;
    size_t max = df_session_max_ctx(sp->ds);
    if (ng->len + (size_t)k > max) {
        if (ng->len + 1 > max) return 0; /* the draft session is full: no drafts */
        k = (int)(max - ng->len);
    }
    int rc = df_session_sync(sp->ds, ng->hist, ng->len);
    if (rc) return df_err(err, errlen, rc, "draft model: %s", df_engine_error(sp->draft));
    for (int i = 0; i < k; i++) {
        int32_t id;
        if ((rc = df_session_sample(sp->ds, NULL, &id))) return df_err(err, errlen, rc, "draft model: %s", df_engine_error(sp->draft));
        out[i] = id;
        if (i + 1 < k && (rc = df_session_push(sp->ds, id))) return df_err(err, errlen, rc, "draft model: %s", df_engine_error(sp->draft));
    }
    return k;
}

/* ---- names and the vocabulary check ---------------------------------------- */

static const char *const spec_names[] = {"none", "ngram", "draft", "mtp", "auto"};

int df_spec_parse(const char *name) {
    for (int i = 0; i < 5; i++)
        if (name && !strcmp(name, spec_names[i])) return i;
    return -1;
}

const char *df_spec_name(int mode) { return mode >= 0 && mode < 5 ? spec_names[mode] : "?"; }

int df_spec_check_draft(df_engine *target, df_engine *draft, char *err, size_t errlen) {
    df_model_info a, b;
    df_engine_info(target, &a);
    df_engine_info(draft, &b);
    const int ta = df_has_tokenizer(target), tb = df_has_tokenizer(draft);
    draft->draft_text_level = 0;
    if (a.vocab_size != b.vocab_size) {
        if (ta && tb) { draft->draft_text_level = 1; return 0; } /* it drafts text, re-tokenized for the target */
        return df_err(err, errlen, DF_EINPUT, "--draft: the draft model's vocabulary has %d ids, the model's %d, and %s: "
                      "it cannot draft for it (drafting across vocabularies goes through text)", b.vocab_size, a.vocab_size,
                      !ta && !tb ? "neither has a tokenizer" : ta ? "the draft model has no tokenizer" : "the model has no tokenizer");
    }
    /* without tokenizers ids are all both models know (test checkpoints):
     * the same vocabulary size is all there is to check; a wrong pairing
     * costs speed only, since every token is verified */
    if (!ta && !tb) return 0;
    if (!ta || !tb)
        return df_err(err, errlen, DF_EINPUT, "--draft: %s has no tokenizer: the vocabularies cannot be compared",
                      ta ? "the draft model" : "the model");
    for (int id = 0; id < a.vocab_size; id++) {
        size_t na, nb;
        char *sa = df_token_text(target, id, &na), *sb = df_token_text(draft, id, &nb);
        int same = sa && sb && na == nb && !memcmp(sa, sb, na);
        free(sa);
        free(sb);
        if (!same) { draft->draft_text_level = 1; return 0; } /* the same size, other bytes: through text too */
    }
    return 0;
}
