/* ecache: the words of a slot (source.h, part_notes) that a caller keeps
 * what it derived from an expert's bytes in (ffn.c: FP8 NaN codes): 0 when
 * the expert is loaded, kept while it stays loaded (hits), 0 again when a
 * slot is loaded with other bytes (a slot reused for another expert, and the
 * same expert read back after its eviction), none for an expert not loaded;
 * rsource passes them through. */
#include "deltafin.h"
#include "store/ecache.h"
#include "util/util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

enum { E = 4, PART = 4096, EXPERT = 2 * PART };
static uint64_t off_of(int e) { return (uint64_t)e * EXPERT; }

typedef struct { df_expert_source *s; int l; const int *ids; int *notes[8]; const uint8_t *p0[8]; int n; } rd_ctx;
static void ready(void *ctx, int i, const uint8_t *const *p) {
    rd_ctx *c = ctx;
    if (i < 0) return;
    c->notes[i] = c->s->ops->part_notes(c->s, c->l, c->ids[i]), c->p0[i] = p[0], c->n++;
}
static int *acq(df_expert_source *s, int e, const uint8_t **p0) {
    char err[256] = "";
    int ids[1] = {e};
    rd_ctx c = {s, 0, ids, {0}, {0}, 0};
    int rc = s->ops->acquire(s, 0, ids, 1, -1, NULL, 0, ready, &c, err, sizeof err);
    CHECK(rc == 0 && c.n == 1, "acquire expert %d: %d %s", e, rc, err);
    if (p0) *p0 = c.p0[0];
    return c.notes[0];
}

int main(void) {
    char dir[] = "/tmp/df_ecache_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char *path = df_path_join(dir, "shard.bin");
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    uint8_t *b = malloc((size_t)E * EXPERT);
    for (int i = 0; i < E * EXPERT; i++) b[i] = (uint8_t)(i / PART + 1); /* part k of the file: bytes k + 1 */
    CHECK(fd >= 0 && pwrite(fd, b, (size_t)E * EXPERT, 0) == E * EXPERT, "file");
    close(fd);
    df_expert_loc locs[E];
    memset(locs, 0, sizeof locs);
    for (int e = 0; e < E; e++) {
        locs[e].n_parts = 2;
        locs[e].part[0] = (df_extent){0, off_of(e), PART};
        locs[e].part[1] = (df_extent){0, off_of(e) + PART, PART};
    }
    const char *paths[1] = {path};
    char err[256] = "";
    df_ecache_opts o = {.budget = 2 * EXPERT, .min_slots = 2, .policy = DF_EVICT_LRU, .use_io_uring = 0, .populate = 0, .fresh_memory = 2};
    df_ecache *c = df_ecache_new(paths, 1, 1, E, locs, &o, err, sizeof err);
    CHECK(c != NULL, "new: %s", err);
    if (!c) return 1;
    CHECK(df_ecache_slots(c) == 2, "two slots, got %d", df_ecache_slots(c));
    df_expert_source *s = df_ecache_source(c);
    CHECK(s->ops->part_notes != NULL, "the expert cache has words per slot");
    CHECK(s->ops->part_notes(s, 0, 0) == NULL, "no words for an expert not loaded");
    CHECK(s->ops->part_notes(s, 1, 0) == NULL && s->ops->part_notes(s, 0, E) == NULL && s->ops->part_notes(s, -1, 0) == NULL,
          "no words outside the layers and experts");

    const uint8_t *p0;
    int *n0 = acq(s, 0, &p0);
    CHECK(n0 && p0 && p0[0] == 1, "expert 0 loaded, with words");
    if (!n0) return 1;
    for (int k = 0; k < DF_EXPERT_PARTS; k++) CHECK(n0[k] == 0, "word %d is 0 at the load, got %d", k, n0[k]);
    n0[0] = 1, n0[1] = 2; /* what a caller derived */
    s->ops->release(s);
    int *h = acq(s, 0, NULL); /* a hit: the same bytes */
    CHECK(h == n0 && h[0] == 1 && h[1] == 2, "a hit keeps the words (%d %d)", h ? h[0] : -1, h ? h[1] : -1);
    s->ops->release(s);
    int *n1 = acq(s, 1, NULL);
    CHECK(n1 && n1 != n0 && n1[0] == 0 && n1[1] == 0, "expert 1 in the other slot: its own words, 0");
    if (n1) n1[0] = 7;
    s->ops->release(s);
    /* expert 2 evicts the least recently used (expert 0): its slot's words are for other bytes now */
    const uint8_t *p2;
    int *n2 = acq(s, 2, &p2);
    CHECK(n2 == n0 && p2 && p2[0] == 5, "expert 2 reuses expert 0's slot (bytes %d)", p2 ? p2[0] : -1);
    CHECK(n2 && n2[0] == 0 && n2[1] == 0, "a slot loaded with other bytes: words 0 again, got %d %d", n2 ? n2[0] : -1, n2 ? n2[1] : -1);
    CHECK(s->ops->part_notes(s, 0, 0) == NULL, "the evicted expert has no words");
    s->ops->release(s);
    /* expert 0 read back (into expert 1's slot, the least recent now): 0 again, whatever it held before */
    int *r0 = acq(s, 0, &p0);
    CHECK(r0 && r0[0] == 0 && r0[1] == 0 && p0 && p0[0] == 1, "expert 0 read back: words 0");
    s->ops->release(s);
    df_ecache_free(c);
    unlink(path);
    rmdir(dir);
    free(path), free(b);
    if (failures) fprintf(stderr, "test_store_ecache: %d failures\n", failures);
    else printf("ecache: all checks passed\n");
    return failures != 0;
}
