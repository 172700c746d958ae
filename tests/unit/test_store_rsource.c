/* rsource: experts fetched on first use, marked present only once fetched,
 * fetched once, evicted under a disk budget by use counts (never one the
 * current acquire needs), holes punched on eviction, the state kept across
 * reopening, a fetch failure passed up without marking anything. A fake
 * inner source checks it only ever sees experts whose bytes are on disk. */
#include "deltafin.h"
#include "store/rsource.h"
#include "util/util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

enum { L = 2, E = 4, PART = 4096, EXPERT = 2 * PART };
static uint8_t byte_at(uint64_t i) { return (uint8_t)(1 + (i * 2654435761u >> 13) % 251); } /* never 0 */
static uint64_t off_of(int l, int e) { return (uint64_t)(l * E + e) * EXPERT; }

/* the fake remote: writes the true bytes */
static int fetches, fail_next;
static int fetch(void *ctx, const df_extent *ext, int n, const int *fds, char *err, size_t errlen) {
    (void)ctx;
    if (fail_next) { fail_next = 0; return df_err(err, errlen, DF_EIO, "network down"); }
    fetches++;
    for (int i = 0; i < n; i++) {
        uint8_t *b = malloc(ext[i].len);
        for (uint64_t k = 0; k < ext[i].len; k++) b[k] = byte_at(ext[i].off + k);
        if (pwrite(fds[ext[i].file], b, ext[i].len, (off_t)ext[i].off) != (ssize_t)ext[i].len) return DF_EIO;
        free(b);
    }
    return 0;
}

/* the fake inner source: checks the bytes on disk of every expert it is asked for */
static const char *g_path;
static int inner_bad;
static int in_acquire(df_expert_source *s, int l, const int *ids, int k, int pf_l, const int *pf_ids, int pf_k, df_expert_ready_fn ready,
                      void *ctx, char *err, size_t errlen) {
    (void)s, (void)pf_l, (void)pf_ids, (void)err, (void)errlen;
    if (pf_k) inner_bad++;
    int fd = open(g_path, O_RDONLY);
    uint8_t b[EXPERT];
    for (int j = 0; j < k; j++) {
        if (pread(fd, b, EXPERT, (off_t)off_of(l, ids[j])) != EXPERT) inner_bad++;
        for (int q = 0; q < EXPERT; q++) if (b[q] != byte_at(off_of(l, ids[j]) + q)) { inner_bad++; break; }
        ready(ctx, j, NULL);
    }
    close(fd);
    ready(ctx, -1, NULL);
    return 0;
}
static void in_release(df_expert_source *s) { (void)s; }
static int in_cap(const df_expert_source *s) { (void)s; return 8; }
static int in_wants(const df_expert_source *s) { (void)s; return 1; }
static int in_words[DF_EXPERT_PARTS];
static int *in_notes(df_expert_source *s, int l, int e) { (void)s; return l == 1 && e == 2 ? in_words : NULL; }
static const df_expert_source_ops in_ops = {in_acquire, in_release, in_cap, in_wants, NULL, in_notes};
static void ready(void *ctx, int i, const uint8_t *const *p) { (void)ctx, (void)i, (void)p; }

static int present_bytes_zero(const char *path, int l, int e) {
    int fd = open(path, O_RDONLY);
    uint8_t b[EXPERT];
    int z = pread(fd, b, EXPERT, (off_t)off_of(l, e)) == EXPERT;
    for (int q = 0; q < EXPERT && z; q++) z = b[q] == 0;
    close(fd);
    return z;
}

int main(void) {
    char dir[] = "/tmp/df_rsource_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char *path = df_path_join(dir, "shard.safetensors"), *state = df_path_join(dir, "experts.state");
    g_path = path;
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)L * E * EXPERT) == 0, "sparse file");
    close(fd);
    df_expert_loc locs[L * E];
    memset(locs, 0, sizeof locs);
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) {
            df_expert_loc *x = &locs[l * E + e];
            x->n_parts = 2;
            x->part[0] = (df_extent){0, off_of(l, e), PART};
            x->part[1] = (df_extent){0, off_of(l, e) + PART, PART};
        }
    df_expert_source inner = {&in_ops};
    const char *paths[1] = {path};
    char err[256] = "";
    /* budget: 3 experts */
    df_rsource *r = df_rsource_new(&inner, paths, 1, L, E, locs, state, 3 * EXPERT, fetch, NULL, err, sizeof err);
    CHECK(r != NULL, "new: %s", err);
    df_expert_source *s = df_rsource_source(r);
    CHECK(s->ops->wants_prediction(s) == 0, "no prediction: a prefetch could read an expert not fetched");
    CHECK(s->ops->part_notes && s->ops->part_notes(s, 1, 2) == in_words && s->ops->part_notes(s, 0, 2) == NULL,
          "part_notes: the inner source's words");
    int a[2] = {0, 1};
    int pf[2] = {2, 3};
    CHECK(s->ops->acquire(s, 0, a, 2, 1, pf, 2, ready, NULL, err, sizeof err) == 0, "acquire: %s", err);
    CHECK(fetches == 1, "one fetch for a layer's misses, got %d", fetches);
    s->ops->release(s);
    CHECK(s->ops->acquire(s, 0, a, 2, -1, NULL, 0, ready, NULL, err, sizeof err) == 0 && fetches == 1, "hits are not fetched again");
    s->ops->release(s);
    df_rsource_stats st;
    df_rsource_stats_get(r, &st);
    CHECK(st.experts_fetched == 2 && st.disk_bytes == 2 * EXPERT && st.evictions == 0, "stats %lld %lld", (long long)st.experts_fetched,
          (long long)st.disk_bytes);
    /* expert 0 of layer 0 used 2x, 1 used 2x; now layer 1: 2 more -> one eviction: the least used not wanted */
    int b1[1] = {3};
    CHECK(s->ops->acquire(s, 1, b1, 1, -1, NULL, 0, ready, NULL, err, sizeof err) == 0, "acquire: %s", err);
    s->ops->release(s);
    CHECK(s->ops->acquire(s, 1, b1, 1, -1, NULL, 0, ready, NULL, err, sizeof err) == 0, "acquire: %s", err);
    s->ops->release(s);
    CHECK(s->ops->acquire(s, 1, b1, 1, -1, NULL, 0, ready, NULL, err, sizeof err) == 0, "acquire: %s", err);
    s->ops->release(s);
    int b2[1] = {2};
    CHECK(s->ops->acquire(s, 1, b2, 1, -1, NULL, 0, ready, NULL, err, sizeof err) == 0, "acquire: %s", err);
    s->ops->release(s);
    df_rsource_stats_get(r, &st);
    CHECK(st.evictions == 1 && st.disk_bytes == 3 * EXPERT, "one eviction to stay in 3 experts: %lld evictions, %lld bytes",
          (long long)st.evictions, (long long)st.disk_bytes);
    /* layer 0's experts had 2 uses each, layer 1 expert 3 had 3: one of layer 0's went, and its bytes are a hole */
    CHECK(present_bytes_zero(path, 0, 0) || present_bytes_zero(path, 0, 1), "the evicted expert's bytes were punched out");
    CHECK(!present_bytes_zero(path, 1, 3), "the most used expert stays");
    /* a failed fetch marks nothing */
    fail_next = 1;
    int c0[1] = {1};
    int evicted_l0e1 = present_bytes_zero(path, 0, 1);
    int rc = s->ops->acquire(s, 0, evicted_l0e1 ? c0 : a, 1, -1, NULL, 0, ready, NULL, err, sizeof err);
    CHECK(rc == DF_EIO && strstr(err, "network down"), "fetch failure passed up: %d %s", rc, err);
    df_rsource_stats_get(r, &st);
    /* room was made before the fetch (one more eviction), nothing new is marked present */
    CHECK(st.experts_fetched == 4 && st.disk_bytes == 2 * EXPERT, "after a failed fetch: %lld fetched, %lld bytes", (long long)st.experts_fetched,
          (long long)st.disk_bytes);
    df_rsource_free(r);
    CHECK(inner_bad == 0, "the inner source saw %d experts with wrong bytes or a prediction", inner_bad);
    /* reopen: what is present is known, nothing is fetched again */
    fetches = 0;
    r = df_rsource_new(&inner, paths, 1, L, E, locs, state, 3 * EXPERT, fetch, NULL, err, sizeof err);
    CHECK(r != NULL, "reopen: %s", err);
    s = df_rsource_source(r);
    df_rsource_stats_get(r, &st);
    CHECK(st.disk_bytes == 2 * EXPERT, "reopened state: %lld bytes present", (long long)st.disk_bytes);
    CHECK(s->ops->acquire(s, 1, b1, 1, -1, NULL, 0, ready, NULL, err, sizeof err) == 0 && fetches == 0, "present after reopen");
    s->ops->release(s);
    /* a budget below one layer's need: what the acquire needs is kept anyway */
    df_rsource_free(r);
    unlink(state);
    r = df_rsource_new(&inner, paths, 1, L, E, locs, state, 1, fetch, NULL, err, sizeof err);
    s = df_rsource_source(r);
    int all[4] = {0, 1, 2, 3};
    CHECK(s->ops->acquire(s, 0, all, 4, -1, NULL, 0, ready, NULL, err, sizeof err) == 0, "tiny budget: %s", err);
    s->ops->release(s);
    df_rsource_free(r);
    CHECK(inner_bad == 0, "the inner source saw %d experts with wrong bytes", inner_bad);
    unlink(state);
    unlink(path);
    rmdir(dir);
    free(path);
    free(state);
    if (failures) { fprintf(stderr, "%d failures\n", failures); return 1; }
    printf("rsource: all checks passed\n");
    return 0;
}
