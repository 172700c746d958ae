/* test_core_spec_mtp.c - the MTP drafter (src/core/spec.c, src/model/mtp.c)
 * on the tiny DeepSeek-V3 checkpoint with an MTP module: through verify
 * passes that accept all, some or none of the drafts (the session and the
 * module's entries cut back each time), the first draft of every pass equals
 * the argmax of the module's logits computed from scratch in a fresh session
 * for the same timeline (df_session_mtp_logits), so the incremental entries
 * and their rollback are exact. A model without the module is refused.
 * Runs from the repository root (tests/data/models). */
#include "core/spec.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "open_model.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}


/* The module's argmax for the last entry of timeline ids[0..n), from scratch. */
static int fresh_mtp_argmax(df_engine *e, const int32_t *ids, size_t n, int V) {
    df_session *f = df_session_new(e, 256);
    float *lg = malloc((n - 1) * (size_t)V * sizeof(float));
    int best = -1;
    if (f && lg && !df_session_sync(f, ids, n - 1) && !df_session_push(f, ids[n - 1]) && !df_session_mtp_logits(f, lg))
        best = argmax(lg + (n - 2) * (size_t)V, V);
    free(lg);
    df_session_free(f);
    return best;
}

/* The model's greedy continuation of ids[0..n) (k tokens) from scratch. */
static void greedy(df_engine *e, const int32_t *ids, size_t n, int k, int32_t *out) {
    df_session *f = df_session_new(e, 256);
    df_session_sync(f, ids, n);
    for (int i = 0; i < k; i++) {
        df_session_sample(f, NULL, &out[i]);
        if (i + 1 < k) df_session_push(f, out[i]);
    }
    df_session_free(f);
}

int main(void) {
    df_engine *e = open_model("tests/data/models/deepseek-v3-bf16");
    if (!e) return 1;
    CHECK(df_engine_has_mtp(e), "deepseek-v3-bf16 carries an MTP module");
    df_model_info info;
    df_engine_info(e, &info);
    const int V = info.vocab_size, K = 3;
    df_session *s = df_session_new(e, 256);
    int32_t tl[256] = {0, 418, 41, 102, 13, 245, 222, 10, 321, 237, 76, 198};
    size_t n = 12; /* the timeline: the session's tokens + the chosen one not yet pushed */
    df_session_sync(s, tl, n);
    df_session_sample(s, NULL, &tl[n++]);
    df_spec *sp = df_spec_new(DF_SPEC_MTP, K, NULL);
    char err[256];
    CHECK(sp && !df_spec_attach_mtp(sp, s, err, sizeof err), "attach: %s", err);
    df_spec_append(sp, tl, n);
    float *ql = malloc((size_t)(K + 1) * V * sizeof(float));
    int saw_all = 0, saw_none = 0, saw_some = 0;
    for (int round = 0; round < 12 && !fails; round++) {
        int32_t d[K + 1];
        d[0] = tl[n - 1];
        int k = df_spec_draft(sp, K, d + 1, err, sizeof err);
        CHECK(k == K, "round %d: drafted %d: %s", round, k, err);
        int want = fresh_mtp_argmax(e, tl, n, V);
        CHECK(d[1] == want, "round %d (timeline %zu): first draft %d, from scratch %d", round, n, d[1], want);
        /* every third round drafts the model's own continuation (all accepted), every third a half-right one */
        if (round % 3 == 1) greedy(e, tl, n, K, d + 1);
        if (round % 3 == 2) { greedy(e, tl, n, K, d + 1); d[3] = (d[3] + 1) % V; }
        size_t base = df_session_len(s);
        CHECK(!df_session_verify(s, d, (size_t)K + 1, ql), "verify");
        int acc = 0;
        while (acc < K && argmax(ql + (size_t)acc * V, V) == d[acc + 1]) acc++;
        int32_t next = argmax(ql + (size_t)acc * V, V);
        CHECK(!df_session_cut(s, base + 1 + (size_t)acc, ql + (size_t)acc * V, acc + 1), "cut");
        saw_all |= acc == K, saw_none |= acc == 0, saw_some |= acc > 0 && acc < K;
        for (int i = 1; i <= acc; i++) tl[n++] = d[i];
        tl[n++] = next;
        df_spec_append(sp, tl + n - 1 - acc, (size_t)acc + 1);
    }
    CHECK(saw_all && saw_none && saw_some, "passes accepted all (%d), none (%d) and some (%d) drafts", saw_all, saw_none, saw_some);
    df_spec_free(sp);
    df_session_free(s);
    free(ql);
    df_engine_close(e);

    /* no module: the attach says so */
    e = open_model("tests/data/models/deepseek-v3-fp8");
    if (!e) return 1;
    CHECK(!df_engine_has_mtp(e), "deepseek-v3-fp8 has no MTP module");
    s = df_session_new(e, 64);
    sp = df_spec_new(DF_SPEC_MTP, K, NULL);
    err[0] = 0;
    CHECK(df_spec_attach_mtp(sp, s, err, sizeof err) == DF_EINPUT && strstr(err, "has no MTP module"), "%s", err);
    df_spec_free(sp);
    df_session_free(s);
    df_engine_close(e);
    if (fails) return 1;
    printf("test_core_spec_mtp: all passed\n");
    return 0;
}
