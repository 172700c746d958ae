/* test_core_sampler.c - the sampler (src/core/sampler.c) on hand-made
 * logits: out-of-range sampling options are refused (never NaN draws),
 * df_sampling.seed reseeds the generator, NaN logits and temperatures so
 * small that logit / T overflows do not make NaN probabilities. */
#include "core/core.h"
#include "deltafin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c, ...)                                                   \
    do {                                                                \
        if (!(c)) {                                                     \
            failures++;                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
            fprintf(stderr, __VA_ARGS__);                               \
            fprintf(stderr, "\n");                                      \
        }                                                               \
    } while (0)

#define V 1000
static float logits[V];
static float work[V * 2];

static df_sampling sampling(float t) {
    df_sampling sp;
    df_sampling_default(&sp);
    sp.temperature = t;
    return sp;
}

static void test_bad_options(void) {
    for (int i = 0; i < V; i++) logits[i] = (float)(i % 17) * 0.1f;
    struct { const char *field; df_sampling sp; } bad[6];
    for (int i = 0; i < 6; i++) bad[i].sp = sampling(1.0f);
    bad[0].field = "temperature", bad[0].sp.temperature = NAN;
    bad[1].field = "temperature", bad[1].sp.temperature = INFINITY;
    bad[2].field = "top_p", bad[2].sp.top_p = NAN;
    bad[3].field = "top_p", bad[3].sp.top_p = 1.5f;
    bad[4].field = "min_p", bad[4].sp.min_p = NAN;
    bad[5].field = "top_k", bad[5].sp.top_k = -1;
    for (int i = 0; i < 6; i++) {
        char err[256] = "";
        df_rng r;
        df_rng_seed(&r, 1);
        int rc = df_sampling_check(&bad[i].sp, err, sizeof err);
        CHECK(rc == DF_EINPUT && strstr(err, bad[i].field) && !strchr(err, '\n'), "case %d (%s): rc %d, '%s'", i, bad[i].field, rc, err);
        int id = df_sample(logits, V, &bad[i].sp, &r, work);
        CHECK(id == DF_EINPUT, "case %d (%s): df_sample gave %d, expected DF_EINPUT", i, bad[i].field, id);
    }
    df_sampling ok = sampling(0.7f);
    ok.top_p = 0.9f, ok.min_p = 0.05f, ok.top_k = 40;
    CHECK(df_sampling_check(&ok, NULL, 0) == 0, "valid options refused");
    df_sampling greedy = sampling(-1.0f); /* <= 0: greedy, as documented */
    CHECK(df_sampling_check(&greedy, NULL, 0) == 0, "negative temperature (greedy) refused");
}

/* sp.seed reseeds when it differs from the generator's seed; the same seed
 * given again continues the stream rather than restarting it. */
static void test_seed(void) {
    for (int i = 0; i < V; i++) logits[i] = 0; /* uniform: every draw is the generator's */
    df_sampling sp = sampling(1.0f);
    sp.seed = 7;
    df_rng a, b, c;
    df_rng_seed(&a, 0);  /* a session starts at seed 0 */
    df_rng_seed(&b, 7);
    df_rng_seed(&c, 0);
    df_sampling unseeded = sampling(1.0f);
    int same_ab = 1, same_ac = 1, distinct = 0, first = -1;
    for (int k = 0; k < 32; k++) {
        int x = df_sample(logits, V, &sp, &a, work), y = df_sample(logits, V, &sp, &b, work), z = df_sample(logits, V, &unseeded, &c, work);
        CHECK(x >= 0 && x < V, "draw %d out of range", x);
        same_ab &= x == y;
        same_ac &= x == z;
        if (k == 0) first = x;
        else distinct |= x != first;
    }
    CHECK(same_ab, "sp.seed 7 on a generator seeded 0 must equal a generator seeded 7");
    CHECK(!same_ac, "sp.seed 7 was ignored: same draws as seed 0");
    CHECK(distinct, "the generator restarts at every draw");
}

static void test_nan_and_tiny_temperature(void) {
    for (int i = 0; i < V; i++) logits[i] = (float)((i * 37) % 101) * 0.05f;
    logits[500] = 9.0f; /* the maximum */
    df_rng r;
    df_rng_seed(&r, 3);
    df_sampling tiny = sampling(1e-44f);
    CHECK(df_sample(logits, V, &tiny, &r, work) == 500, "temperature 1e-44 must be greedy");
    for (int i = 0; i < V; i += 3) logits[i] = NAN;
    df_sampling sp = sampling(1.0f);
    for (int k = 0; k < 200; k++) {
        int id = df_sample(logits, V, &sp, &r, work);
        CHECK(id >= 0 && id < V && id % 3 != 0, "draw %d is a NaN logit", id);
        if (id < 0 || id % 3 == 0) break;
    }
}

/* df_sampling.allow: greedy takes the best allowed token, sampling never
 * draws a disallowed one (whatever its logit), none allowed is DF_EINPUT. */
static void test_allow_mask(void) {
    uint32_t allow[(V + 31) / 32];
    memset(allow, 0, sizeof allow);
    int ok[] = {5, 200, 633, 999};
    for (int k = 0; k < 4; k++) allow[ok[k] >> 5] |= 1u << (ok[k] & 31);
    logits[5] = 1.0f, logits[200] = 0.5f, logits[633] = 2.0f, logits[999] = 1.5f; /* every other logit is higher */
    for (int i = 0; i < V; i++) if (i != 5 && i != 200 && i != 633 && i != 999) logits[i] = 3.0f + (float)(i % 7);
    df_rng rng;
    df_rng_seed(&rng, 1);
    df_sampling sp = sampling(0);
    sp.allow = allow;
    int id = df_sample(logits, V, &sp, &rng, work);
    CHECK(id == 633, "greedy with a mask: got %d, want 633 (logit %g, the best allowed)", id, (double)logits[633]);
    sp = sampling(1.0f);
    sp.allow = allow;
    sp.top_k = 2;
    int seen[V] = {0};
    for (int r = 0; r < 2000; r++) {
        id = df_sample(logits, V, &sp, &rng, work);
        CHECK(id >= 0 && id < V && (allow[id >> 5] >> (id & 31) & 1), "sampled a disallowed token %d", id);
        if (id >= 0 && id < V) seen[id]++;
    }
    CHECK(seen[633] && seen[999] && !seen[5] && !seen[200], "top-k 2 among allowed: 633 %d, 999 %d, 5 %d, 200 %d",
          seen[633], seen[999], seen[5], seen[200]);
    memset(allow, 0, sizeof allow);
    CHECK(df_sample(logits, V, &sp, &rng, work) == DF_EINPUT, "no token allowed must be DF_EINPUT");
    sp.temperature = 0;
    CHECK(df_sample(logits, V, &sp, &rng, work) == DF_EINPUT, "no token allowed (greedy) must be DF_EINPUT");
}

int main(void) {
    test_allow_mask();
    test_bad_options();
    test_seed();
    test_nan_and_tiny_temperature();
    if (failures) {
        printf("test_core_sampler: %d failures\n", failures);
        return 1;
    }
    printf("test_core_sampler: ok\n");
    return 0;
}
