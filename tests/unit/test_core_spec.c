/* test_core_spec.c - prompt lookup and the economics of speculative
 * decoding (src/core/spec.c).
 *
 * The index: the longest suffix first (3, 2, then 1 tokens), among earlier
 * occurrences of the 3-gram the one with the longest common suffix, a match
 * followed as the timeline repeats it, a periodic continuation past the end,
 * only earlier occurrences (never the suffix itself), and on random
 * sequences every draft checked against the timeline (the reported match is
 * real and the draft is what followed it).
 *
 * The cost model: a scripted decode (a "true" token sequence, a scripted
 * cost of a verify pass of k drafts against a plain step, acceptance given
 * by whether the drafts equal the true tokens) run through df_spec_want /
 * df_spec_draft / df_spec_note_*: auto costs at most 3% more time than plain
 * steps where drafting fails or passes cost as much as the tokens they
 * yield, and gains where the answer copies the prompt; ngram mode lengthens
 * its drafts on long accepted runs and shortens them after misses. */
#include "core/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* the common suffix length of h[0..e] and h[0..len) */
static size_t common(const int32_t *h, size_t e, size_t len) {
    size_t l = 0;
    while (l <= e && h[e - l] == h[len - 1 - l]) l++;
    return l;
}

/* the continuation drafted from a match whose next token is h[from] */
static void cont(const int32_t *h, size_t len, size_t from, int k, int32_t *out) {
    size_t period = len - from;
    for (int m = 0; m < k; m++) out[m] = (size_t)m < period ? h[from + m] : out[m - period];
}

static void index_tests(void) {
    int32_t out[16], want[16];
    {
        df_ngram *ng = df_ngram_new();
        int32_t a[] = {1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 2, 3};
        df_ngram_append(ng, a, 12);
        /* suffix 2,3 (the 3-gram 7,2,3 never occurred): most recent earlier 2,3 ends at 7, followed by 5,7,2,3 */
        int n = df_ngram_draft(ng, 4, out);
        CHECK(n == 4 && out[0] == 5 && out[1] == 7 && out[2] == 2 && out[3] == 3, "n=%d %d %d %d %d", n, out[0], out[1], out[2], out[3]);
        CHECK(df_ngram_match_len(ng) == 2, "match of 2, got %zu", df_ngram_match_len(ng));
        int32_t b = 42; /* never seen: no draft */
        df_ngram_append(ng, &b, 1);
        CHECK(df_ngram_draft(ng, 4, out) == 0 && df_ngram_match_len(ng) == 0, "a new token has no draft");
        df_ngram_free(ng);
    }
    {
        /* the longest match wins over the most recent: 7,8,9,1,2,3 was followed by 100 (older),
         * 5,5,5,1,2,3 by 200 (newer); the timeline ends 7,8,9,1,2,3 */
        df_ngram *ng = df_ngram_new();
        int32_t a[] = {7, 8, 9, 1, 2, 3, 100, 5, 5, 5, 1, 2, 3, 200, 60, 7, 8, 9, 1, 2, 3};
        df_ngram_append(ng, a, sizeof a / sizeof *a);
        int n = df_ngram_draft(ng, 3, out);
        CHECK(n == 3 && out[0] == 100 && out[1] == 5 && out[2] == 5, "longest match: n=%d %d %d %d", n, out[0], out[1], out[2]);
        CHECK(df_ngram_match_len(ng) == 6, "match of 6, got %zu", df_ngram_match_len(ng));
        df_ngram_free(ng);
    }
    {
        /* a "file" of lines that share their 3-grams (x = 1, 2, 3, then a number), repeated: once the copy
         * is matched the match is followed line by line, where the most recent 3-gram would point at the
         * previous line */
        enum { L = 40 };
        int32_t file[L * 4];
        for (int i = 0; i < L; i++) file[4 * i] = 1, file[4 * i + 1] = 2, file[4 * i + 2] = 3, file[4 * i + 3] = 1000 + i;
        df_ngram *ng = df_ngram_new();
        df_ngram_append(ng, file, L * 4);
        int32_t sep = 7;
        df_ngram_append(ng, &sep, 1);
        df_ngram_append(ng, file, 8); /* the copy starts: two lines */
        int right = 0;
        for (int i = 8; i < L * 4; i++) {
            int n = df_ngram_draft(ng, 1, out);
            right += n == 1 && out[0] == file[i];
            df_ngram_append(ng, &file[i], 1);
        }
        CHECK(right == L * 4 - 8, "the copy followed: %d of %d drafts right", right, L * 4 - 8);
        CHECK(df_ngram_match_len(ng) >= L * 4 - 8, "the match grew with the copy: %zu", df_ngram_match_len(ng));
        df_ngram_free(ng);
    }
    {
        df_ngram *ng = df_ngram_new();
        int32_t a[] = {8, 8, 8};
        df_ngram_append(ng, a, 3);
        /* 8,8 occurred ending at 1: followed by one 8, then periodic */
        int n = df_ngram_draft(ng, 5, out);
        CHECK(n == 5 && out[0] == 8 && out[4] == 8, "periodic n=%d", n);
        df_ngram_free(ng);
        ng = df_ngram_new();
        df_ngram_append(ng, a, 1);
        CHECK(df_ngram_draft(ng, 3, out) == 0, "a single token is not its own earlier occurrence");
        df_ngram_free(ng);
    }
    /* an edit's answer leaves the copy and comes back to it further on: a 1-token key is matched at its first
     * occurrence after where the copy broke off (the anchor), not at its most recent one */
    {
        int32_t file[80];
        for (int i = 0; i < 80; i++) file[i] = 1000 + i; /* distinct tokens ... */
        file[20] = file[40] = file[60] = 7;                /* ... but one key that occurs three times */
        df_ngram *ng = df_ngram_new();
        df_ngram_append(ng, file, 80);
        int32_t sep = 5, ins[2] = {900, 901};
        df_ngram_append(ng, &sep, 1);
        df_ngram_append(ng, file, 12); /* the copy: 12 tokens */
        CHECK(df_ngram_match_len(ng) >= 8, "the copy is followed: %zu", df_ngram_match_len(ng));
        df_ngram_append(ng, ins, 2); /* it breaks off at file[12]: two new tokens */
        df_ngram_append(ng, &file[20], 1); /* back to the file at the key */
        int n = df_ngram_draft(ng, 3, out);
        CHECK(n == 3 && out[0] == file[21] && out[1] == file[22] && df_ngram_anchored(ng), "resync after the anchor: drafted %d: %d %d (want %d %d), anchored %d",
              n, out[0], out[1], file[21], file[22], df_ngram_anchored(ng));
        /* without a copy before (no anchor) the most recent occurrence is drafted, as before */
        df_ngram_free(ng);
        ng = df_ngram_new();
        df_ngram_append(ng, file, 80);
        df_ngram_append(ng, &sep, 1);
        df_ngram_append(ng, &file[20], 1);
        n = df_ngram_draft(ng, 2, out);
        CHECK(n == 2 && out[0] == file[61] && !df_ngram_anchored(ng), "no anchor: the most recent occurrence: %d (want %d)", out[0], file[61]);
        df_ngram_free(ng);
    }
    /* random sequences over a small alphabet, appended in random pieces: whenever there is an earlier
     * occurrence of the last token there is a match; the match is real (the tokens before the drafted
     * continuation equal the timeline's last match_len tokens); a 3-gram that occurred earlier gives a
     * match of 3 or more */
    srand(7);
    for (int trial = 0; trial < 100; trial++) {
        size_t len = 1 + (size_t)(rand() % 2000);
        int alpha = 2 + rand() % 40;
        int32_t *h = malloc(len * sizeof *h);
        for (size_t i = 0; i < len; i++) h[i] = rand() % alpha;
        df_ngram *ng = df_ngram_new();
        for (size_t i = 0; i < len;) {
            size_t step = 1 + (size_t)(rand() % 7);
            if (step > len - i) step = len - i;
            CHECK(df_ngram_append(ng, h + i, step) == 0, "append");
            i += step;
            int k = 1 + rand() % 16, n = df_ngram_draft(ng, k, out);
            size_t m = df_ngram_match_len(ng), best = 0;
            for (size_t e = 0; e + 1 < i; e++) {
                size_t l = common(h, e, i);
                if (l > best) best = l;
            }
            CHECK((n == 0) == (best == 0) && (n == 0 || n == k), "trial %d len %zu: drafted %d, longest earlier match %zu", trial, i, n, best);
            CHECK(m <= best && (best < 3 || m >= 3) && (best == 0 || m >= 1), "trial %d len %zu: match %zu, longest %zu", trial, i, m, best);
            int real = 0; /* some earlier position with a match of m whose continuation is the draft */
            for (size_t e = 0; n && !real && e + 1 < i; e++)
                if (common(h, e, i) >= m) {
                    cont(h, i, e + 1, n, want);
                    real = !memcmp(out, want, (size_t)n * sizeof *out);
                }
            CHECK(!n || real, "trial %d len %zu: the draft is not what followed a match of %zu", trial, i, m);
        }
        df_ngram_free(ng);
        free(h);
    }
}

/* ---- the cost model, scripted ---------------------------------------------- */

typedef struct {
    double spec_time, plain_time; /* the decode's time with the drafter, and with plain steps only */
    long passes, drafted, accepted, tokens;
    int k_max_seen;
} sim_result;

/* Decodes truth[p..n) after the prompt truth[0..p): a plain step costs 1, a pass of k drafts
 * 1 + alpha + beta * k (jitter: +-10% pseudo-random, as measured times are). */
static sim_result simulate_a(int mode, int k_max, const int32_t *truth, size_t p, size_t n, double alpha, double beta) {
    sim_result r = {0};
    df_spec *sp = df_spec_new(mode, k_max, NULL);
    int32_t d[40];
    unsigned seed = 12345;
    df_spec_append(sp, truth, p + 1); /* the prompt and the first token (chosen by the prefill) */
    for (size_t i = p; i + 1 < n;) { /* truth[i] is pending */
        seed = seed * 1103515245u + 12345u;
        double jit = 0.9 + 0.2 * ((seed >> 16) & 1023) / 1023.0;
        int room = (int)(n - 1 - i) < 32 ? (int)(n - 1 - i) : 32;
        int k = df_spec_want(sp, room);
        if (k > 0) k = df_spec_draft(sp, k, d, NULL, 0);
        if (k > 0) {
            int acc = 0;
            while (acc < k && d[acc] == truth[i + 1 + (size_t)acc]) acc++;
            double secs = (1 + alpha + beta * k) * jit;
            df_spec_note_verify(sp, k, acc, secs);
            r.spec_time += secs;
            r.passes++, r.drafted += k, r.accepted += acc;
            if (k > r.k_max_seen) r.k_max_seen = k;
            df_spec_append(sp, truth + i + 1, (size_t)acc + 1);
            i += (size_t)acc + 1;
        } else {
            df_spec_note_plain(sp, jit);
            r.spec_time += jit;
            df_spec_append(sp, truth + i + 1, 1);
            i++;
        }
    }
    r.tokens = (long)(n - 1 - p);
    r.plain_time = (double)r.tokens; /* the same jitter on average */
    if (getenv("SPEC_TEST_VERBOSE"))
        fprintf(stderr, "%s k_max %d beta %.2f: %ld tokens, time %.1f vs %.1f plain (%.3fx), %ld passes, %ld/%ld accepted, k up to %d\n",
                mode == DF_SPEC_AUTO ? "auto " : "ngram", k_max, beta, r.tokens, r.spec_time, r.plain_time, r.spec_time / r.plain_time,
                r.passes, r.accepted, r.drafted, r.k_max_seen);
    df_spec_free(sp);
    return r;
}

static sim_result simulate(int mode, int k_max, const int32_t *truth, size_t p, size_t n, double beta) {
    return simulate_a(mode, k_max, truth, p, n, 0, beta);
}

/* a text that copies: a "file" of 150 lines of 8 tokens that share most of their n-grams, then the same
 * file with one line changed (the answer), as an edit prompt does */
static size_t make_copy(int32_t *t) {
    size_t n = 0;
    for (int l = 0; l < 150; l++) {
        int32_t line[8] = {10, 11, 12 + l % 5, 20, 100 + l, 21, 22, 9};
        for (int j = 0; j < 8; j++) t[n++] = line[j];
    }
    return n;
}

static void cost_tests(void) {
    static int32_t t[20000];
    size_t p = make_copy(t), n = p;
    t[n++] = 5; /* the instruction */
    t[n++] = 6;
    for (size_t i = 0; i < p; i++) t[n++] = i / 8 == 70 && i % 8 == 4 ? 999 : t[i]; /* one line changed */
    const size_t copy_n = n;

    /* the copy, passes cheap against a step (memory-bound decode): both modes gain a lot, auto about as much as ngram */
    sim_result ng = simulate(DF_SPEC_NGRAM, 8, t, p + 2, copy_n, 0.1), au = simulate(DF_SPEC_AUTO, 8, t, p + 2, copy_n, 0.1);
    CHECK(ng.spec_time < 0.3 * ng.plain_time, "ngram on the copy, beta 0.1: %.0f vs %.0f plain", ng.spec_time, ng.plain_time);
    CHECK(au.spec_time < 1.05 * ng.spec_time, "auto on the copy: %.0f vs ngram %.0f", au.spec_time, ng.spec_time);
    CHECK(ng.k_max_seen == 8, "long accepted runs reach --spec-max: %d", ng.k_max_seen);
    /* passes cost 0.5 step per draft (this CPU): still a gain, smaller k */
    au = simulate(DF_SPEC_AUTO, 8, t, p + 2, copy_n, 0.5);
    CHECK(au.spec_time < 0.75 * au.plain_time, "auto on the copy, beta 0.5: %.0f vs %.0f plain", au.spec_time, au.plain_time);
    /* a pass has a fixed cost (the batched kernels: 2 positions cost 2 steps, 9 positions 2.6): the long passes pay */
    au = simulate_a(DF_SPEC_AUTO, 8, t, p + 2, copy_n, 0.9, 0.1);
    CHECK(au.spec_time < 0.45 * au.plain_time && au.k_max_seen == 8, "auto on the copy, pass 1.9 + 0.1 k: %.0f vs %.0f plain, k up to %d",
          au.spec_time, au.plain_time, au.k_max_seen);
    /* passes cost one step per draft: a pass costs what its tokens would, auto must not lose more than 3% */
    au = simulate(DF_SPEC_AUTO, 8, t, p + 2, copy_n, 1.0);
    CHECK(au.spec_time < 1.03 * au.plain_time, "auto on the copy, beta 1.0: %.0f vs %.0f plain", au.spec_time, au.plain_time);

    /* an edit's answer: the copy with a token changed every 40 and a line of 8 skipped every 120; each break
     * leaves 1-2 token matches (found at the anchor) and a copy running again through the buckets. auto must
     * keep up with ngram (it measured the buckets one by one, 3 shadows each, after every break: 6-9% slower) */
    {
        size_t m = p + 2;
        for (size_t i = 0; i < p && m < p + 2 + 600;) {
            if (i % 40 == 17) { t[m++] = 5000 + (int32_t)i, i++; continue; }
            if (i % 120 == 60) { i += 8; continue; }
            t[m++] = t[i++];
        }
        for (int c = 0; c < 2; c++) {
            const double a = c ? 0.3 : 0.15, b = c ? 0.3 : 0.22;
            sim_result sn = simulate_a(DF_SPEC_NGRAM, 8, t, p + 2, m, a, b), sa = simulate_a(DF_SPEC_AUTO, 8, t, p + 2, m, a, b);
            CHECK(sa.spec_time < 1.03 * sn.spec_time && sn.spec_time < 0.7 * sn.plain_time,
                  "an edit with changes and skips, pass %.2f + %.2f k: auto %.1f vs ngram %.1f (plain %.1f)", 1 + a, b, sa.spec_time,
                  sn.spec_time, sn.plain_time);
        }
    }

    /* chat: random tokens over a 300-token alphabet after a random prompt: matches are short and wrong */
    srand(3);
    for (size_t i = 0; i < 3000; i++) t[i] = rand() % 300;
    for (double beta = 0.1; beta <= 1.0; beta += 0.45) {
        au = simulate(DF_SPEC_AUTO, 8, t, 1000, 3000, beta);
        CHECK(au.spec_time < 1.03 * au.plain_time, "auto on chat, beta %.2f: %.1f vs %.1f plain (%ld passes)", beta, au.spec_time,
              au.plain_time, au.passes);
        /* its rates are measured on shadow drafts, which never came true here: not one pass is paid for */
        CHECK(au.passes == 0, "auto on chat, beta %.2f: %ld passes on drafts that were never right", beta, au.passes);
        au = simulate(DF_SPEC_AUTO, 8, t, 1000, 1120, beta); /* a short answer: the probes' share too */
        CHECK(au.spec_time < 1.03 * au.plain_time, "auto on a short chat answer, beta %.2f: %.1f vs %.1f plain (%ld passes)", beta,
              au.spec_time, au.plain_time, au.passes);
    }
    /* a prompt whose answer repeats short pieces of it now and then (an edit answered by an explanation):
     * 2- and 3-token matches right 40% of the time */
    for (size_t i = 1000; i < 3000; i++) t[i] = rand() % 10 < 4 && i > 1003 ? t[i - 1000 + 7] : rand() % 300;
    au = simulate(DF_SPEC_AUTO, 8, t, 1000, 3000, 0.5);
    CHECK(au.spec_time < 1.03 * au.plain_time, "auto on a non-copying answer, beta 0.5: %.1f vs %.1f plain (%ld passes)",
          au.spec_time, au.plain_time, au.passes);

    /* ngram: a miss shortens the draft: alternate long copied runs with a change every 24 tokens */
    for (size_t i = 0; i < p; i++) t[p + 2 + i] = i % 24 == 23 ? 5000 + (int32_t)i : t[i];
    df_spec *sp = df_spec_new(DF_SPEC_NGRAM, 8, NULL);
    df_spec_append(sp, t, p + 2 + 20); /* 20 tokens into the copy: a long match */
    df_spec_note_plain(sp, 1.0);
    int k_long = 0, k_short = 0;
    for (int i = 0; i < 40; i++) { /* long accepted runs */
        k_long = df_spec_want(sp, 32);
        df_spec_note_verify(sp, k_long, k_long, 1 + 0.3 * k_long);
    }
    k_long = df_spec_want(sp, 32);
    for (int i = 0; i < 6; i++) { /* misses */
        k_short = df_spec_want(sp, 32);
        df_spec_note_verify(sp, k_short, 1, 1 + 0.3 * k_short);
    }
    k_short = df_spec_want(sp, 32);
    CHECK(k_long == 8 && k_short < k_long, "ngram: k %d after accepted runs, %d after misses", k_long, k_short);
    df_spec_free(sp);

    /* the gain formula */
    CHECK(df_spec_gain(0.0, 0.0, 4) > 0.999 && df_spec_gain(0.0, 0.0, 4) < 1.001, "no acceptance, free passes: 1");
    CHECK(df_spec_gain(0.5, 0.0, 2) > 1.749 && df_spec_gain(0.5, 0.0, 2) < 1.751, "1 + 1/2 + 1/4");
    CHECK(df_spec_gain(0.5, 1.0, 2) < 0.6, "three steps' cost for 1.75 tokens");
}

int main(void) {
    index_tests();
    cost_tests();
    CHECK(df_spec_parse("auto") == DF_SPEC_AUTO && df_spec_parse("none") == DF_SPEC_NONE && df_spec_parse("x") == -1, "parse");
    if (fails) { fprintf(stderr, "%d failures\n", fails); return 1; }
    printf("test_core_spec: ok\n");
    return 0;
}
