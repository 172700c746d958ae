/* rsource.c - experts fetched on first use into a disk cache with a budget
 * (rsource.h). */
#include "store/rsource.h"
#include "deltafin.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STATE_MAGIC "DFRSRC01"
#define HDR 16 /* magic, n_layers u32, n_experts u32 */

typedef struct { uint32_t present, uses; } rec;

struct df_rsource {
    df_expert_source base;
    df_expert_source *inner;
    int n_files, n_layers, n_experts;
    int *fds;
    df_expert_loc *locs;
    rec *st;
    int state_fd;
    int64_t budget;
    df_rsource_fetch_fn fetch;
    void *ctx;
    df_rsource_stats stats;
    int *want;          /* scratch: experts of the current acquire */
    df_extent *ext;     /* scratch */
};

static int64_t expert_bytes(const df_expert_loc *l) {
    int64_t b = 0;
    for (int p = 0; p < l->n_parts; p++) b += (int64_t)l->part[p].len;
    return b;
}

static int put_rec(df_rsource *r, int i, char *err, size_t errlen) {
    if (pwrite(r->state_fd, &r->st[i], sizeof(rec), HDR + (off_t)i * (off_t)sizeof(rec)) != (ssize_t)sizeof(rec))
        return df_err(err, errlen, DF_EIO, "expert cache state: write failed: %s", strerror(errno));
    return 0;
}

static void evict(df_rsource *r, int i) {
    const df_expert_loc *l = &r->locs[i];
    r->st[i].present = 0;
    if (put_rec(r, i, NULL, 0) || fdatasync(r->state_fd)) return; /* left marked: its bytes stay too */
    for (int p = 0; p < l->n_parts; p++)
        (void)fallocate(r->fds[l->part[p].file], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)l->part[p].off, (off_t)l->part[p].len);
    r->stats.disk_bytes -= expert_bytes(l);
    r->stats.evictions++;
}

/* Makes room for need more bytes: evicts the least used experts not wanted now. */
static void make_room(df_rsource *r, int64_t need, int l, const int *ids, int k) {
    if (r->budget < 0) return;
    int total = r->n_layers * r->n_experts;
    while (r->stats.disk_bytes + need > r->budget) {
        int best = -1;
        for (int i = 0; i < total; i++) {
            if (!r->st[i].present) continue;
            int wanted = 0;
            if (i / r->n_experts == l)
                for (int j = 0; j < k; j++) if (ids[j] == i % r->n_experts) wanted = 1;
            if (wanted) continue;
            if (best < 0 || r->st[i].uses < r->st[best].uses) best = i;
        }
        if (best < 0) return; /* the budget is smaller than one layer's experts: keep what this acquire needs */
        evict(r, best);
    }
}

static int r_acquire(df_expert_source *s, int l, const int *ids, int k, int pf_l, const int *pf_ids, int pf_k, df_expert_ready_fn ready,
                     void *ctx, char *err, size_t errlen) {
    (void)pf_l, (void)pf_ids, (void)pf_k; /* no prediction: a prefetch could read an expert not fetched yet */
    df_rsource *r = (df_rsource *)s;
    if (l < 0 || l >= r->n_layers) return df_err(err, errlen, DF_EINPUT, "expert source: layer %d of %d", l, r->n_layers);
    int nm = 0;
    int64_t need = 0;
    for (int j = 0; j < k; j++) {
        if (ids[j] < 0 || ids[j] >= r->n_experts) return df_err(err, errlen, DF_EINPUT, "expert source: expert %d of %d", ids[j], r->n_experts);
        int i = l * r->n_experts + ids[j];
        r->st[i].uses++;
        if (r->st[i].present || r->locs[i].n_parts == 0) continue;
        int dup = 0;
        for (int q = 0; q < nm; q++) dup |= r->want[q] == i;
        if (dup) continue;
        r->want[nm++] = i;
        need += expert_bytes(&r->locs[i]);
    }
    if (nm) {
        make_room(r, need, l, ids, k);
        int ne = 0;
        for (int q = 0; q < nm; q++)
            for (int p = 0; p < r->locs[r->want[q]].n_parts; p++) r->ext[ne++] = r->locs[r->want[q]].part[p];
        /* one request per run of touching extents (an expert's parts are usually adjacent in a shard) */
        for (int x = 1; x < ne; x++)
            for (int y = x; y > 0 && (r->ext[y - 1].file > r->ext[y].file || (r->ext[y - 1].file == r->ext[y].file && r->ext[y - 1].off > r->ext[y].off)); y--) {
                df_extent t = r->ext[y];
                r->ext[y] = r->ext[y - 1], r->ext[y - 1] = t;
            }
        int nw = 0;
        for (int x = 0; x < ne; x++) {
            if (nw && r->ext[nw - 1].file == r->ext[x].file && r->ext[nw - 1].off + r->ext[nw - 1].len >= r->ext[x].off) {
                uint64_t end = r->ext[x].off + r->ext[x].len;
                if (end > r->ext[nw - 1].off + r->ext[nw - 1].len) r->ext[nw - 1].len = end - r->ext[nw - 1].off;
            } else r->ext[nw++] = r->ext[x];
        }
        ne = nw;
        double t0 = df_now();
        int rc = r->fetch(r->ctx, r->ext, ne, r->fds, err, errlen);
        r->stats.fetch_seconds += df_now() - t0;
        if (rc) return rc;
        for (int q = 0; q < nm; q++) {
            r->st[r->want[q]].present = 1;
            if ((rc = put_rec(r, r->want[q], err, errlen))) return rc;
            r->stats.experts_fetched++;
            r->stats.bytes_fetched += expert_bytes(&r->locs[r->want[q]]);
            r->stats.disk_bytes += expert_bytes(&r->locs[r->want[q]]);
        }
        if (fdatasync(r->state_fd)) return df_err(err, errlen, DF_EIO, "expert cache state: fdatasync: %s", strerror(errno));
    }
    return r->inner->ops->acquire(r->inner, l, ids, k, pf_l, NULL, 0, ready, ctx, err, errlen);
}
static void r_release(df_expert_source *s) { df_rsource *r = (df_rsource *)s; r->inner->ops->release(r->inner); }
static int r_capacity(const df_expert_source *s) { const df_rsource *r = (const df_rsource *)s; return r->inner->ops->capacity(r->inner); }
static int r_wants(const df_expert_source *s) { (void)s; return 0; }
static void r_token(df_expert_source *s, int64_t pos) {
    df_rsource *r = (df_rsource *)s;
    if (r->inner->ops->set_token) r->inner->ops->set_token(r->inner, pos);
}
static int *r_notes(df_expert_source *s, int l, int e) {
    df_rsource *r = (df_rsource *)s;
    return r->inner->ops->part_notes ? r->inner->ops->part_notes(r->inner, l, e) : NULL;
}
static const df_expert_source_ops r_ops = {r_acquire, r_release, r_capacity, r_wants, r_token, r_notes};

df_rsource *df_rsource_new(df_expert_source *inner, const char *const *paths, int n_files, int n_layers, int n_experts,
                           const df_expert_loc *locs, const char *state_path, int64_t disk_budget, df_rsource_fetch_fn fetch,
                           void *ctx, char *err, size_t errlen) {
    df_rsource *r = df_xcalloc(1, sizeof *r);
    r->base.ops = &r_ops;
    r->inner = inner;
    r->n_files = n_files, r->n_layers = n_layers, r->n_experts = n_experts;
    r->budget = disk_budget;
    r->fetch = fetch, r->ctx = ctx;
    r->state_fd = -1;
    size_t total = (size_t)n_layers * (size_t)n_experts;
    r->locs = df_xmalloc((total + 1) * sizeof *r->locs);
    memcpy(r->locs, locs, total * sizeof *locs);
    r->st = df_xcalloc(total + 1, sizeof *r->st);
    r->want = df_xcalloc((size_t)n_experts + 1, sizeof *r->want);
    r->ext = df_xcalloc(((size_t)n_experts + 1) * DF_EXPERT_PARTS, sizeof *r->ext);
    r->fds = df_xcalloc((size_t)n_files + 1, sizeof *r->fds);
    for (int f = 0; f < n_files; f++) r->fds[f] = -1;
    for (int f = 0; f < n_files; f++)
        if ((r->fds[f] = open(paths[f], O_RDWR)) < 0) {
            df_err(err, errlen, DF_EIO, "%s: cannot open for writing fetched experts: %s", paths[f], strerror(errno));
            df_rsource_free(r);
            return NULL;
        }
    r->state_fd = open(state_path, O_RDWR | O_CREAT, 0644);
    if (r->state_fd < 0) {
        df_err(err, errlen, DF_EIO, "%s: %s", state_path, strerror(errno));
        df_rsource_free(r);
        return NULL;
    }
    char hdr[HDR], want[HDR];
    memcpy(want, STATE_MAGIC, 8);
    uint32_t dims[2] = {(uint32_t)n_layers, (uint32_t)n_experts};
    memcpy(want + 8, dims, 8);
    size_t bytes = total * sizeof(rec);
    if (pread(r->state_fd, hdr, HDR, 0) != HDR || memcmp(hdr, want, HDR) || pread(r->state_fd, r->st, bytes, HDR) != (ssize_t)bytes) {
        /* new, or from another layout: nothing is known to be on disk */
        memset(r->st, 0, bytes);
        if (ftruncate(r->state_fd, 0) || pwrite(r->state_fd, want, HDR, 0) != HDR || pwrite(r->state_fd, r->st, bytes, HDR) != (ssize_t)bytes ||
            fdatasync(r->state_fd)) {
            df_err(err, errlen, DF_EIO, "%s: cannot write: %s", state_path, strerror(errno));
            df_rsource_free(r);
            return NULL;
        }
    }
    for (size_t i = 0; i < total; i++) {
        if (r->st[i].present > 1 || r->locs[i].n_parts == 0) r->st[i].present = 0;
        if (r->st[i].present) r->stats.disk_bytes += expert_bytes(&r->locs[i]);
    }
    r->stats.disk_budget = disk_budget;
    return r;
}

df_expert_source *df_rsource_source(df_rsource *r) { return &r->base; }
void df_rsource_stats_get(const df_rsource *r, df_rsource_stats *s) { *s = r->stats; }

void df_rsource_free(df_rsource *r) {
    if (!r) return;
    if (r->state_fd >= 0) {
        size_t bytes = (size_t)r->n_layers * (size_t)r->n_experts * sizeof(rec);
        /* use counts are advisory: written back as they are (presence was written as it changed) */
        if (pwrite(r->state_fd, r->st, bytes, HDR) == (ssize_t)bytes) (void)fdatasync(r->state_fd);
        close(r->state_fd);
    }
    for (int f = 0; f < r->n_files; f++) if (r->fds[f] >= 0) close(r->fds[f]);
    free(r->fds);
    free(r->locs);
    free(r->st);
    free(r->want);
    free(r->ext);
    free(r);
}
