/* test_core_sessfile.c - session files (df_session_save / df_session_load,
 * the server's prompt cache): a state saved and loaded into another session
 * gives the same logits bit for bit and continues exactly like the session
 * it came from, on a GQA model, an MLA model and a recurrent hybrid (Kimi
 * Linear: KDA fixed state + MLA latents); a snapshot's state is saved after
 * the session moved on; a prefix without logits (truncatable models only);
 * and hostile files: every header byte flipped, truncations, flipped
 * sections, a foreign fingerprint, sizes that do not match the model, NaNs
 * behind valid checksums, tokens of another prompt: each refused with
 * DF_EFORMAT and the session left usable. Runs from the repository root. */
#include "deltafin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include "open_model.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)


static double rel_l2(const float *a, const float *b, int n) {
    double d = 0, r = 0;
    for (int i = 0; i < n; i++) d += (double)(a[i] - b[i]) * (a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d / (r > 0 ? r : 1));
}

/* The bytes of the file written by df_session_save(s, snap, ids, n). */
static unsigned char *save_bytes(df_session *s, int snap, const int32_t *ids, size_t n, size_t *len, int *rc) {
    FILE *f = tmpfile();
    uint64_t bytes = 0;
    *rc = df_session_save(s, snap, ids, n, fileno(f), &bytes);
    *len = (size_t)bytes;
    unsigned char *b = malloc(*len ? *len : 1);
    if (*len && pread(fileno(f), b, *len, 0) != (ssize_t)*len) *rc = -100;
    fclose(f);
    return b;
}

static int load_bytes(df_session *s, const void *b, size_t len, const int32_t *ids, size_t n, size_t *pos) {
    FILE *f = tmpfile();
    if (len && fwrite(b, 1, len, f) != len) return -100;
    fflush(f);
    int rc = df_session_load(s, fileno(f), ids, n, pos);
    fclose(f);
    return rc;
}

static void test_roundtrip(const char *dir) {
    df_engine *e = open_model(dir);
    CHECK(e, "open %s", dir);
    if (!e) return;
    df_model_info mi;
    df_engine_info(e, &mi);
    df_stats st;
    df_stats_get(e, &st);
    const int V = mi.vocab_size;
    int32_t ids[60];
    for (int i = 0; i < 60; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    df_session *a = df_session_new(e, 128), *b = df_session_new(e, 128);
    float *la = malloc((size_t)V * sizeof(float));
    CHECK(!df_session_sync(a, ids, 40), "%s: sync", dir);
    size_t len, pos = 0;
    int rc;
    unsigned char *f = save_bytes(a, -1, ids, 40, &len, &rc);
    CHECK(!rc && len == df_session_file_bytes(a, 40), "%s: save rc %d, %zu bytes, expected %llu", dir, rc, len,
          (unsigned long long)df_session_file_bytes(a, 40));
    CHECK(!load_bytes(b, f, len, ids, 60, &pos) && pos == 40 && df_session_len(b) == 40, "%s: load: %s (pos %zu)", dir, df_engine_error(e), pos);
    CHECK(df_session_logits(b) && !memcmp(df_session_logits(a), df_session_logits(b), (size_t)V * sizeof(float)), "%s: logits after load differ", dir);
    /* both go on from the same bits */
    CHECK(!df_session_sync(a, ids, 60) && !df_session_sync(b, ids, 60), "%s: sync 60", dir);
    CHECK(df_session_reused(b) == 40, "%s: the loaded session reused %zu, expected 40", dir, df_session_reused(b));
    CHECK(!memcmp(df_session_logits(a), df_session_logits(b), (size_t)V * sizeof(float)), "%s: continuation after load differs", dir);

    /* a snapshot at 30, saved after the session went on to 60 */
    df_session_sync(a, ids, 30);
    memcpy(la, df_session_logits(a), (size_t)V * sizeof(float));
    int snap = df_session_snapshot(a);
    CHECK(snap >= 0 && !df_session_sync(a, ids, 60), "%s: snapshot", dir);
    free(f);
    f = save_bytes(a, snap, ids, 30, &len, &rc);
    CHECK(!rc, "%s: save snapshot: %s", dir, df_engine_error(e));
    CHECK(!load_bytes(b, f, len, ids, 30, &pos) && pos == 30 && !memcmp(df_session_logits(b), la, (size_t)V * sizeof(float)),
          "%s: snapshot load: %s", dir, df_engine_error(e));
    /* a snapshot of another position, or tokens that are not the session's, are refused */
    free(f);
    f = save_bytes(a, snap, ids, 31, &len, &rc);
    CHECK(rc == DF_EINPUT, "%s: snapshot at the wrong position: rc %d", dir, rc);
    int32_t other[60];
    memcpy(other, ids, sizeof other);
    other[5] = (other[5] + 1) % V;
    free(f);
    f = save_bytes(a, -1, other, 60, &len, &rc);
    CHECK(rc == DF_EINPUT, "%s: save with other tokens: rc %d", dir, rc);

    /* a prefix without logits: only where every layer can be truncated */
    free(f);
    f = save_bytes(a, -1, ids, 20, &len, &rc);
    if (st.state_bytes_fixed == 0) {
        CHECK(!rc, "%s: prefix save: %s", dir, df_engine_error(e));
        CHECK(!load_bytes(b, f, len, ids, 40, &pos) && pos == 20 && !df_session_logits(b), "%s: prefix load: %s", dir, df_engine_error(e));
        df_session *c = df_session_new(e, 128);
        df_session_sync(b, ids, 40);
        df_session_sync(c, ids, 40);
        CHECK(df_session_reused(b) == 20 && rel_l2(df_session_logits(b), df_session_logits(c), V) < 1e-5, "%s: prefix continuation", dir);
        df_session_free(c);
    } else {
        CHECK(rc == DF_EUNSUPPORTED, "%s: a recurrent model's prefix without a snapshot: rc %d", dir, rc);
    }
    free(f);
    free(la);
    df_session_free(a);
    df_session_free(b);
    df_engine_close(e);
}

/* Rewrites the header's own checksum (bytes 96..104 over 0..96). */
static void fix_header(unsigned char *f) {
    uint64_t h = XXH3_64bits(f, 96);
    memcpy(f + 96, &h, 8);
}

static void expect_refused(df_engine *e, df_session *s, const unsigned char *f, size_t len, const int32_t *ids, size_t n,
                           const char *why, const char *what, const float *fresh, int V) {
    size_t pos = 99;
    int rc = load_bytes(s, f, len, ids, n, &pos);
    CHECK(rc == DF_EFORMAT && pos == 0, "%s: rc %d pos %zu", what, rc, pos);
    CHECK(!why || strstr(df_engine_error(e), why), "%s: message '%s' lacks '%s'", what, df_engine_error(e), why);
    /* usable afterwards: the same logits as a fresh session */
    CHECK(!df_session_sync(s, ids, n) && !memcmp(df_session_logits(s), fresh, (size_t)V * sizeof(float)), "%s: session not usable after refusal", what);
}

static void test_hostile(const char *dir) {
    df_engine *e = open_model(dir);
    CHECK(e, "open %s", dir);
    if (!e) return;
    df_model_info mi;
    df_engine_info(e, &mi);
    df_stats st;
    df_stats_get(e, &st);
    const int V = mi.vocab_size;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 13 + 7) % V);
    df_session *a = df_session_new(e, 64), *s = df_session_new(e, 64);
    df_session_sync(a, ids, 40);
    float *fresh = malloc((size_t)V * sizeof(float));
    memcpy(fresh, df_session_logits(a), (size_t)V * sizeof(float));
    size_t len;
    int rc;
    unsigned char *good = save_bytes(a, -1, ids, 40, &len, &rc), *f = malloc(len);
    CHECK(!rc, "%s: save", dir);
    /* every header byte */
    for (size_t i = 0; i < 104; i++) {
        memcpy(f, good, len);
        f[i] ^= 0x41;
        char what[64];
        snprintf(what, sizeof what, "%s: header byte %zu", dir, i);
        expect_refused(e, s, f, len, ids, 40, NULL, what, fresh, V);
    }
    /* truncations and padding */
    size_t cuts[] = {0, 50, 103, 104, 104 + 40 * 4, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) expect_refused(e, s, good, cuts[i], ids, 40, NULL, "truncated", fresh, V);
    unsigned char *pad = calloc(len + 8, 1);
    memcpy(pad, good, len);
    expect_refused(e, s, pad, len + 8, ids, 40, "its header implies", "padded", fresh, V);
    free(pad);
    /* a byte of each section */
    size_t at[] = {104 + 3, 104 + 160 + 5, len - 5};
    const char *sec[] = {"tokens", "logits", "caches"};
    for (int i = 0; i < 3; i++) {
        memcpy(f, good, len);
        f[at[i]] ^= 0x04;
        expect_refused(e, s, f, len, ids, 40, sec[i], sec[i], fresh, V);
    }
    /* a foreign fingerprint with a valid header checksum */
    memcpy(f, good, len);
    f[16] ^= 1;
    fix_header(f);
    expect_refused(e, s, f, len, ids, 40, "another model", "fingerprint", fresh, V);
    /* sizes that are not the model's, behind a valid header checksum */
    size_t fields[] = {24, 32, 36, 40, 48, 56, 60, 8, 12};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        memcpy(f, good, len);
        f[fields[i]] ^= 0x02;
        fix_header(f);
        char what[64];
        snprintf(what, sizeof what, "%s: header field at %zu", dir, fields[i]);
        expect_refused(e, s, f, len, ids, 40, NULL, what, fresh, V);
    }
    /* huge positions must not allocate */
    memcpy(f, good, len);
    memset(f + 24, 0xff, 8);
    fix_header(f);
    expect_refused(e, s, f, len, ids, 40, "positions", "huge pos", fresh, V);
    /* NaN in the caches behind valid checksums */
    memcpy(f, good, len);
    uint32_t nan = 0x7fc00000u;
    memcpy(f + len - 4, &nan, 4);
    uint64_t ccache = XXH3_64bits(f + (len - 40 * (size_t)(st.state_bytes_per_token)), 40 * (size_t)st.state_bytes_per_token);
    memcpy(f + 88, &ccache, 8);
    fix_header(f);
    expect_refused(e, s, f, len, ids, 40, "non-finite", "nan", fresh, V);
    /* a prompt that is not the file's */
    int32_t other[40];
    memcpy(other, ids, sizeof other);
    other[39] = (other[39] + 1) % V;
    float *fresh2 = malloc((size_t)V * sizeof(float));
    df_session *c = df_session_new(e, 64);
    df_session_sync(c, other, 40);
    memcpy(fresh2, df_session_logits(c), (size_t)V * sizeof(float));
    df_session_sync(s, ids, 0); /* empty: the check below compares with a whole prefill */
    expect_refused(e, s, good, len, other, 40, "not the prompt's", "other prompt", fresh2, V);
    /* shorter prompt than the file */
    size_t pos;
    CHECK(load_bytes(s, good, len, ids, 39, &pos) == DF_EFORMAT, "%s: a file longer than the prompt", dir);
    /* a refusal before the caches leaves the session as it was */
    df_session_sync(s, ids, 40);
    memcpy(f, good, len);
    f[0] ^= 1;
    load_bytes(s, f, len, ids, 40, &pos);
    CHECK(df_session_len(s) == 40 && df_session_logits(s), "%s: a refused header emptied the session", dir);
    free(fresh2);
    df_session_free(c);
    free(good);
    free(f);
    free(fresh);
    df_session_free(a);
    df_session_free(s);
    df_engine_close(e);
}

static void test_fingerprints_differ(void) {
    df_engine *a = open_model("tests/data/models/llama-f32-tied"), *b = open_model("tests/data/models/llama-bf16");
    CHECK(a && b, "open");
    if (a && b) {
        uint64_t fa = df_engine_fingerprint(a);
        CHECK(fa == df_engine_fingerprint(a), "the fingerprint is not stable");
        CHECK(fa != df_engine_fingerprint(b), "two models with one fingerprint");
    }
    df_engine_close(a);
    df_engine_close(b);
}

int main(void) {
    const char *models[] = {"tests/data/models/llama-f32-tied", "tests/data/models/deepseek-v3-bf16", "tests/data/models/kimi-linear-tiny",
                            "tests/data/models/qwen3-moe-k70"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) test_roundtrip(models[i]);
    test_hostile("tests/data/models/llama-f32-tied");
    test_hostile("tests/data/models/kimi-linear-tiny");
    test_fingerprints_differ();
    if (fails) { fprintf(stderr, "%d check(s) failed\n", fails); return 1; }
    printf("session file tests: all passed\n");
    return 0;
}
