/* test_core_ahead.c - greedy decoding one token ahead (core.h df_session_sample_ahead, backend.h next_token /
 * embed_token) on the CPU backend, where it runs only with DELTAFIN_AHEAD=1: on every kind of test model the ids
 * are those of plain greedy steps (df_session_sample + df_session_push), the path is taken (the backend's token
 * slot where the embedding is held, host tokens where it is read from its file), and whatever a caller does
 * between a queued pass and its push (read the logits, push another id, cut, sync, snapshot) sees the session a
 * plain step would have left: logits bit-equal to a plain session's where they are kept, recomputed where the
 * queued pass replaced them. The backend's argmax against df_argmax on NaN, infinities, signed zeros and ties.
 * Runs from the repository root (tests/data/models). */
#include "core/core.h"
#include "core/session_int.h"
#include "backend/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "open_model.h"



static const df_sampling greedy = {.temperature = 0, .top_p = 1};

/* want_mode: the session's ahead_on after the first step (0 off, 1 host tokens, 2 the backend's slot) */
static void test_model(const char *dir, int want_mode) {
    df_engine *e = open_model(dir);
    CHECK(e, "open %s", dir);
    if (!e) return;
    df_model_info mi;
    df_engine_info(e, &mi);
    const int V = mi.vocab_size, N = 24;
    int32_t prompt[12], plain[64], ah[64];
    for (int i = 0; i < 12; i++) prompt[i] = (int32_t)((i * 53 + 7) % V);
    /* b steps between a's queued pass and its push from step 12 on: the token slot then holds b's argmax, and a
     * takes its next token from the host (the read-back) instead */
    df_session *p = df_session_new(e, 128), *a = df_session_new(e, 128), *b = df_session_new(e, 128);
    CHECK(p && a && b && !df_session_sync(p, prompt, 12) && !df_session_sync(a, prompt, 12) && !df_session_sync(b, prompt, 12),
          "%s: sessions", dir);
    int32_t bid = 0;
    float *lp = malloc((size_t)V * sizeof(float));
    for (int t = 0; t < N; t++) {
        CHECK(!df_session_sample(p, &greedy, &plain[t]), "%s: plain sample %d", dir, t);
        CHECK(!df_session_sample_ahead(a, &greedy, &ah[t]), "%s: ahead sample %d", dir, t);
        CHECK(ah[t] == plain[t], "%s: step %d: ahead id %d, plain %d", dir, t, ah[t], plain[t]);
        if (t == 0) CHECK(a->ahead_on == want_mode, "%s: ahead mode %d, expected %d", dir, a->ahead_on, want_mode);
        CHECK(!!a->ahead == !!want_mode, "%s: step %d: a pass queued: %d", dir, t, a->ahead);
        if (t == 9) { /* another id than the one queued: the queued pass is dropped, the step is a plain one */
            plain[t] = ah[t] = (plain[t] + 1) % V;
        }
        if (t >= 12) {
            CHECK(!df_session_sample_ahead(b, &greedy, &bid) && (bid == plain[t - 12] || t - 12 == 9), "%s: b's step %d: %d vs %d", dir,
                  t - 12, bid, plain[t - 12]);
            CHECK(!df_session_push(b, plain[t - 12]), "%s: b's push %d", dir, t - 12);
        }
        CHECK(!df_session_push(p, plain[t]) && !df_session_push(a, ah[t]), "%s: push %d", dir, t);
        CHECK(df_session_len(a) == df_session_len(p), "%s: lengths %zu / %zu", dir, df_session_len(a), df_session_len(p));
        if (t == 5 || t == 15) { /* logits left on the backend come to the host on demand: bit-equal */
            memcpy(lp, df_session_logits(p), (size_t)V * sizeof(float));
            const float *la = df_session_logits(a);
            CHECK(la && !memcmp(la, lp, (size_t)V * sizeof(float)), "%s: step %d: logits differ from the plain session's", dir, t);
        }
    }
    /* a queued pass, then a cut / sync / snapshot: the timeline a plain step leaves */
    int32_t id;
    CHECK(!df_session_sample_ahead(a, &greedy, &id) && !df_session_sample(p, &greedy, &plain[N]) && id == plain[N], "%s: last step", dir);
    const size_t len = df_session_len(a);
    CHECK(!df_session_cut(a, len, NULL, 0) && df_session_len(a) == len && !a->ahead, "%s: cut after a queued pass", dir);
    int32_t all[12 + 64];
    memcpy(all, prompt, sizeof prompt);
    memcpy(all + 12, ah, (size_t)N * sizeof(int32_t));
    CHECK(!df_session_sync(a, all, 12 + (size_t)N), "%s: sync", dir);
    memcpy(lp, df_session_logits(p), (size_t)V * sizeof(float));
    const float *la = df_session_logits(a);
    CHECK(la && !memcmp(la, lp, (size_t)V * sizeof(float)), "%s: logits after the sync differ from the plain session's", dir);
    CHECK(!df_session_sample_ahead(a, &greedy, &id) && id == plain[N], "%s: ahead after the sync: %d vs %d", dir, id, plain[N]);
    if (want_mode) CHECK(df_session_snapshot(a) >= 0 && !a->ahead, "%s: snapshot after a queued pass", dir);
    /* sampling (temperature > 0) and masks take the plain path */
    df_sampling hot = {.temperature = 0.8f, .top_p = 1, .seed = 3};
    CHECK(!df_session_sample_ahead(a, &hot, &id) && !a->ahead, "%s: sampled step queued a pass", dir);
    free(lp);
    df_session_free(p), df_session_free(a), df_session_free(b);
    df_engine_close(e);
}

static int ref_argmax(const float *x, int n) { return df_argmax(x, n); }

static void test_argmax_rule(void) {
    const float nan = NAN, inf = INFINITY;
    const struct { float x[6]; } cases[] = {
        {{1, 3, 3, 2, 0, 0}}, {{nan, 5, 6, 1, 2, 3}}, {{1, nan, 7, nan, 7, 2}}, {{-inf, -inf, -inf, -inf, -inf, -inf}},
        {{-0.0f, 0.0f, -1, -2, -3, -4}}, {{0.0f, -0.0f, -1, -2, -3, -4}}, {{-5, inf, 3, inf, nan, 1}}, {{2, 2, 2, 2, 2, 2}},
    };
    df_act *buf = df_alloc(6);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        df_write(buf, cases[c].x, 6);
        const int64_t t = df_be->next_token(buf, 6);
        const int got = df_be->next_token_wait(t), want = ref_argmax(cases[c].x, 6);
        CHECK(got == want, "argmax case %zu: backend %d, df_argmax %d", c, got, want);
    }
    srand(5);
    float *x = malloc(1000 * sizeof(float));
    df_free(buf);
    buf = df_alloc(1000);
    for (int r = 0; r < 200; r++) {
        const int n = 1 + rand() % 1000;
        for (int i = 0; i < n; i++) x[i] = (float)(rand() % 7) - 3; /* many ties */
        if (r % 3 == 0) x[rand() % n] = NAN;
        df_write(buf, x, (size_t)n);
        const int64_t t = df_be->next_token(buf, n);
        CHECK(df_be->next_token_wait(t) == ref_argmax(x, n), "argmax random %d (n %d)", r, n);
    }
    free(x);
    df_free(buf);
}

/* A verify pass whose first id's pass was queued ahead (speculation with ahead steps: session.c df_session_verify
 * confirms it and runs the pass over the drafts): each row of logits bit-equal to a plain step's, the pass taken
 * that way (nothing queued after it), and after a cut back into it, the known next token queued (df_session_queue)
 * and pushed, the next steps are a plain session's. */
static void test_verify_after_ahead(const char *dir) {
    df_engine *e = open_model(dir);
    CHECK(e, "open %s", dir);
    if (!e) return;
    df_model_info mi;
    df_engine_info(e, &mi);
    const size_t V = (size_t)mi.vocab_size;
    int32_t prompt[10], ids[8];
    for (int i = 0; i < 10; i++) prompt[i] = (int32_t)((i * 31 + 5) % (int)V);
    df_session *p = df_session_new(e, 128), *a = df_session_new(e, 128);
    CHECK(p && a && !df_session_sync(p, prompt, 10) && !df_session_sync(a, prompt, 10), "%s: sessions", dir);
    float *lp = malloc(6 * V * sizeof(float)), *out = malloc(6 * V * sizeof(float));
    /* the plain session: the greedy id, then drafts (its own next ids but the fourth, changed) and their logits */
    CHECK(!df_session_sample(p, &greedy, &ids[0]), "%s: plain sample", dir);
    for (int i = 0; i < 5; i++) {
        CHECK(!df_session_push(p, ids[i]), "%s: plain push %d", dir, i);
        memcpy(lp + (size_t)i * V, df_session_logits(p), V * sizeof(float));
        CHECK(!df_session_sample(p, &greedy, &ids[i + 1]), "%s: plain sample %d", dir, i);
        if (i == 3) ids[i + 1] = (ids[i + 1] + 1) % (int32_t)V;
    }
    int32_t id;
    CHECK(!df_session_sample_ahead(a, &greedy, &id) && id == ids[0] && a->ahead, "%s: queued pass of %d (plain %d)", dir, id, ids[0]);
    CHECK(!df_session_verify(a, ids, 5, out), "%s: verify after a queued pass: %s", dir, df_engine_error(e));
    CHECK(!a->ahead && df_session_len(a) == 15, "%s: after the pass: queued %d, length %zu", dir, a->ahead, df_session_len(a));
    for (int i = 0; i < 5; i++)
        CHECK(!memcmp(out + (size_t)i * V, lp + (size_t)i * V, V * sizeof(float)), "%s: pass row %d differs from the plain step's", dir, i);
    /* accept 2 drafts, then plain steps again: the plain session's ids */
    CHECK(!df_session_cut(a, 13, out + 2 * V, 3), "%s: cut", dir);
    df_session *q = df_session_new(e, 128); /* the reference: the prompt, then plain steps (a prefill's rounding differs) */
    CHECK(q && !df_session_sync(q, prompt, 10) && !df_session_push(q, ids[0]) && !df_session_push(q, ids[1]) && !df_session_push(q, ids[2]),
          "%s: reference session", dir);
    /* the token after the accepted prefix is known (the pass decided it): its step queued (df_session_queue), then
     * confirmed by the push, and the steps after it take the backend's token */
    /* an id outside the vocabulary is not queued (the push then refuses it, naming it) */
    CHECK(df_session_queue(a, (int32_t)V) == 0 && df_session_queue(a, -1) == 0 && !a->ahead, "%s: an out-of-range id queued", dir);
    CHECK(df_session_push(a, (int32_t)V) != 0 && df_session_len(a) == 13, "%s: an out-of-range id pushed", dir);
    CHECK(df_session_queue(a, ids[3]) == 1 && a->ahead && a->ahead_id == ids[3], "%s: queue a known token", dir);
    CHECK(df_session_queue(a, ids[3]) == 0, "%s: a second queue while one is queued", dir);
    CHECK(!df_session_push(a, ids[3]) && !a->ahead && !df_session_push(q, ids[3]), "%s: push of the queued token", dir);
    for (int t = 0; t < 4; t++) {
        int32_t x, y;
        CHECK(!df_session_sample_ahead(a, &greedy, &x) && !df_session_sample(q, &greedy, &y) && x == y, "%s: step %d after the pass", dir, t);
        CHECK(!df_session_push(a, x) && !df_session_push(q, y), "%s: push %d after the pass", dir, t);
    }
    /* a pass of one position after a queued pass: the confirmed step alone */
    CHECK(!df_session_sample_ahead(a, &greedy, &id) && a->ahead, "%s: queued again", dir);
    CHECK(!df_session_sample(q, &greedy, &ids[0]) && ids[0] == id && !df_session_push(q, id), "%s: reference step", dir);
    int rc1 = df_session_verify(a, &id, 1, out);
    const float *lq = df_session_logits(q);
    size_t d1 = 0;
    while (d1 < V && !memcmp(out + d1, lq + d1, sizeof(float))) d1++;
    CHECK(!rc1 && d1 == V, "%s: pass of one: rc %d, logit %zu: %g vs %g", dir, rc1, d1, d1 < V ? out[d1] : 0.0, d1 < V ? lq[d1] : 0.0);
    free(lp), free(out);
    df_session_free(p), df_session_free(a), df_session_free(q);
    df_engine_close(e);
}

int main(void) {
    setenv("DELTAFIN_AHEAD", "1", 1);
    df_backend_init(2);
    test_argmax_rule();
    test_model("tests/data/models/llama-f32-tied", 2);  /* tied embedding: held, the backend's slot */
    test_model("tests/data/models/qwen3-moe-k70", 2);
    test_model("tests/data/models/deepseek-v3-fp8", 2);
    test_model("tests/data/models/kimi-k3-tiny", 0);    /* hybrid: KDA layers keep a recurrent state */
    test_model("tests/data/models/kimi-linear-tiny", 0); /* recurrent layers: plain steps */
    test_model("tests/data/models/llama-bf16", 2);
    test_verify_after_ahead("tests/data/models/llama-f32-tied");
    test_verify_after_ahead("tests/data/models/qwen3-moe-k70");
    test_verify_after_ahead("tests/data/models/deepseek-v3-fp8");
    setenv("DELTAFIN_AHEAD", "0", 1);
    test_model("tests/data/models/llama-bf16", 0);
    if (failures) { fprintf(stderr, "%d check(s) failed\n", failures); return 1; }
    printf("ahead tests: all passed\n");
    return 0;
}
