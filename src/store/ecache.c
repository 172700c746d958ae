/* ecache.c - see ecache.h.
 *
 * Slot memory is one anonymous mapping of n_slots * slot_bytes, 4 KiB
 * aligned. An expert's extents are read as 4 KiB-aligned supersets
 * [floor(off), ceil(off + len)) packed back to back in its slot, so every
 * read is O_DIRECT-legal; the weights then point inside the slot at the
 * extent's true start. */
#include "store/ecache.h"
#include "deltafin.h"
#include "util/util.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#define ALIGN 4096u
#define QD 256
#define CANCEL_TAG (1ull << 62) /* user_data of cancel requests */
#define POPULATE_THREADS 8 /* threads faulting slot memory in ahead of use */
#define FAST_TOUCH_GBS 4.0 /* first touches slower than this: memory is lazily backed (lazy_memory) */
#define STALE_TOKENS 16    /* ... and experts unused for this many positions are evicted before fresh slots are taken */
#define PF_WINDOW 64  /* prefetch gating: predictions judged over the last 64 that needed a read */
#define PF_MIN 16     /* ... once at least this many were judged */

enum { S_EMPTY, S_LOADING, S_READY };

typedef struct {
    int key;          /* layer * n_experts + expert, -1 if empty */
    int state;
    int pinned;
    int pending;      /* extents still in flight */
    int failed;
    int prefetched;   /* loaded by prefetch and not yet used */
    int dead;         /* a prefetch its layer did not ask for: reused before any other slot */
    uint64_t last_use, uses;
    int64_t last_token;
    uint8_t *mem;
    int n_parts;
    const uint8_t *parts[DF_EXPERT_PARTS]; /* the expert's parts inside mem */
    int notes[DF_EXPERT_PARTS]; /* source.h, part_notes: the caller's words for these bytes, 0 at each load */
} slot;

struct df_ecache {
    df_expert_source base;   /* the df_expert_source interface: first member, so a source pointer is the cache */
    int n_files, n_layers, n_experts;
    int *fd;
    char **path;
    df_expert_loc *loc;      /* [L * E] where each expert is (owned copy) */
    int max_k;               /* experts per acquire the scratch below holds */
    int *a_how, *a_sl, *a_done; /* acquire scratch [max_k] */
    double *a_waited;
    int *slot_of;     /* [L * E] */
    slot *slots;
    int n_slots;
    int64_t slot_bytes;
    uint8_t *arena;
    size_t arena_bytes;
    df_evict_policy policy;
    void (*before_reuse)(void);
    uint64_t clock;
    struct io_uring ring;
    int have_ring;
    int inflight;
    df_ecache_stats st;
    FILE *trace;
    int64_t token;
    char ioerr[256];
    pthread_t populator[POPULATE_THREADS];
    int populating, populate_ahead, min_ahead;
    atomic_int pop_next; /* the next slot to fault in */
    atomic_int pop_go;   /* set once every populate thread is created */
    atomic_int stop_populate;
    atomic_int high_water; /* slots [0, high_water) have been used */
    pthread_mutex_t rate_mu; /* fresh slots taken per second (decaying), which sets how far ahead to fault */
    double fresh_rate, fresh_t;
    double touch_gbs;        /* first-touch speed of slot memory, measured once at creation */
    /* prefetch gating: the last prediction and the outcomes of recent ones */
    df_prefetch_mode pf_mode;
    int pred_l, pred_n, pred_ids[64];
    uint8_t win[PF_WINDOW];
    int win_n, win_pos, win_hits;
};

/* How many slots past the high-water mark to keep faulted in: the fresh
 * slots the last half second took (a prefill takes hundreds a second, a
 * decode a few), at least min_ahead and at most populate_ahead (1 GiB).
 * Faulting in slots that are never used costs the same CPU as useful ones. */
#define AHEAD_TAU 0.5
static int populate_ahead(df_ecache *c) {
    pthread_mutex_lock(&c->rate_mu);
    double r = c->fresh_rate * exp(-(df_now() - c->fresh_t) / AHEAD_TAU);
    pthread_mutex_unlock(&c->rate_mu);
    int a = (int)(r * AHEAD_TAU * 2);
    return a < c->min_ahead ? c->min_ahead : a > c->populate_ahead ? c->populate_ahead : a;
}

static void note_fresh_slot(df_ecache *c) {
    double now = df_now();
    pthread_mutex_lock(&c->rate_mu);
    c->fresh_rate = c->fresh_rate * exp(-(now - c->fresh_t) / AHEAD_TAU) + 1.0 / AHEAD_TAU;
    c->fresh_t = now;
    pthread_mutex_unlock(&c->rate_mu);
}

/* Faults slot memory in just ahead of use, in the background. On a VM the
 * first touch of a page is expensive (the host backs it: ~0.45 GB/s for one
 * thread here), and the waits of several threads overlap (0.8-3.6 GB/s with
 * eight, varying with the host) while the vCPUs run other work. Empty slots
 * are taken in index order (used ones first, pick_victim), so
 * POPULATE_THREADS threads at idle priority keep the next `ahead` slots past
 * the highest one used faulted in: first touches leave the per-token path
 * without paying for slots that are never used. Stops when the cache is freed. */
static void *populate(void *p) {
    df_ecache *c = p;
    struct sched_param sp = {0};
    sched_setscheduler(0, SCHED_IDLE, &sp);
    /* start faulting only once every thread exists: a fault holds the address space's
     * lock for reading, which the next thread's stack mapping waits for */
    while (!atomic_load(&c->pop_go) && !atomic_load(&c->stop_populate)) usleep(100);
    while (!atomic_load(&c->stop_populate)) {
        int cur = atomic_load(&c->pop_next);
        if (cur >= c->n_slots) break;
        int target = atomic_load(&c->high_water) + populate_ahead(c);
        if (cur >= target) { usleep(500); continue; }
        if (!atomic_compare_exchange_weak(&c->pop_next, &cur, cur + 1)) continue;
        df_touch_range(c->arena + (size_t)cur * (size_t)c->slot_bytes, (size_t)c->slot_bytes);
    }
    return NULL;
}

static uint64_t a_down(uint64_t x) { return x & ~(uint64_t)(ALIGN - 1); }
static uint64_t a_up(uint64_t x) { return (x + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }
static uint64_t span(const df_extent *e) { return a_up(e->off + e->len) - a_down(e->off); }

/* An expert's reads: its parts merged where they touch or share a 4 KiB page
 * in the same file (a packed expert is one read). run_of[p] is the run of
 * part p; runs are laid out back to back in the slot. */
typedef struct {
    int n;
    df_extent run[DF_EXPERT_PARTS];
    int run_of[DF_EXPERT_PARTS];
} reads;

static void plan_reads(const df_expert_loc *f, reads *r) {
    r->n = 0;
    for (int p = 0; p < f->n_parts; p++) {
        const df_extent *e = &f->part[p];
        df_extent *last = r->n ? &r->run[r->n - 1] : NULL;
        if (last && last->file == e->file && e->off >= last->off && a_down(e->off) <= a_up(last->off + last->len)) {
            uint64_t end = e->off + e->len > last->off + last->len ? e->off + e->len : last->off + last->len;
            last->len = end - last->off;
        } else {
            r->run[r->n++] = *e;
        }
        r->run_of[p] = r->n - 1;
    }
}

/* Byte position of part p inside the slot. */
static uint64_t part_pos(const df_expert_loc *f, const reads *r, int p) {
    uint64_t pos = 0;
    for (int i = 0; i < r->run_of[p]; i++) pos += span(&r->run[i]);
    const df_extent *run = &r->run[r->run_of[p]];
    return pos + (f->part[p].off - a_down(run->off));
}

static const df_expert_source_ops ecache_ops;

df_ecache *df_ecache_new(const char *const *paths, int n_files, int n_layers, int n_experts, const df_expert_loc *experts,
                         const df_ecache_opts *o, char *err, size_t errlen) {
    df_ecache *c = df_xcalloc(1, sizeof *c);
    c->base.ops = &ecache_ops;
    const size_t nk = (size_t)n_layers * (size_t)n_experts;
    c->loc = df_xmalloc((nk ? nk : 1) * sizeof *c->loc);
    if (nk) memcpy(c->loc, experts, nk * sizeof *c->loc);
    for (size_t i = 0; i < nk; i++)
        for (int p = 0; p < c->loc[i].n_parts; p++)
            if (c->loc[i].n_parts > DF_EXPERT_PARTS || c->loc[i].part[p].file < 0 || c->loc[i].part[p].file >= n_files) {
                df_err(err, errlen, DF_EINTERNAL, "expert cache: layer %zu expert %zu: part %d names file %d of %d", i / (size_t)n_experts,
                       i % (size_t)n_experts, p, c->loc[i].part[p].file, n_files);
                free(c->loc), free(c);
                return NULL;
            }
    c->max_k = n_experts > 0 ? n_experts : 1;
    c->a_how = df_xcalloc((size_t)c->max_k, sizeof(int));
    c->a_sl = df_xcalloc((size_t)c->max_k, sizeof(int));
    c->a_done = df_xcalloc((size_t)c->max_k, sizeof(int));
    c->a_waited = df_xcalloc((size_t)c->max_k, sizeof(double));
    c->n_files = n_files, c->n_layers = n_layers, c->n_experts = n_experts, c->policy = o->policy, c->before_reuse = o->before_reuse;
    c->fd = df_xmalloc((size_t)n_files * sizeof(int));
    c->path = df_xcalloc((size_t)n_files, sizeof(char *));
    for (int i = 0; i < n_files; i++) {
        c->path[i] = df_xstrdup(paths[i]);
        c->fd[i] = open(paths[i], O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (c->fd[i] < 0) c->fd[i] = open(paths[i], O_RDONLY | O_CLOEXEC); /* filesystems without O_DIRECT */
        if (c->fd[i] < 0) {
            df_err(err, errlen, DF_EIO, "%s: cannot open: %s", paths[i], strerror(errno));
            for (int j = 0; j <= i; j++) free(c->path[j]);
            for (int j = 0; j < i; j++) close(c->fd[j]);
            free(c->fd), free(c->path), free(c->loc), free(c->a_how), free(c->a_sl), free(c->a_done), free(c->a_waited), free(c);
            return NULL;
        }
    }
    int64_t sb = 0;
    for (int i = 0; i < n_layers * n_experts; i++) {
        reads r;
        plan_reads(&experts[i], &r);
        int64_t b = 0;
        for (int p = 0; p < r.n; p++) b += (int64_t)span(&r.run[p]);
        if (b > sb) sb = b;
    }
    c->slot_bytes = sb;
    int n = sb ? (int)(o->budget / sb) : 0;
    if (n < o->min_slots) n = o->min_slots;
    if (n > n_layers * n_experts) n = n_layers * n_experts;
    if (n < 1) n = 1;
    c->n_slots = n;
    c->arena_bytes = (size_t)n * (size_t)sb;
    c->arena = mmap(NULL, c->arena_bytes ? c->arena_bytes : ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c->arena == MAP_FAILED) {
        df_err(err, errlen, DF_ENOMEM, "expert cache: cannot allocate %d slots of %lld bytes", n, (long long)sb);
        c->arena = NULL;
        df_ecache_free(c);
        return NULL;
    }
    madvise(c->arena, c->arena_bytes, MADV_HUGEPAGE);
    /* at most: 8 layers of top-k or 1 GiB, whichever is more */
    c->min_ahead = 2 * (o->min_slots > 0 ? o->min_slots : 1);
    c->populate_ahead = 8 * (o->min_slots > 0 ? o->min_slots : 1);
    if (sb > 0 && (int64_t)c->populate_ahead * sb < (1ll << 30)) c->populate_ahead = (int)((1ll << 30) / sb);
    pthread_mutex_init(&c->rate_mu, NULL);
    if (c->arena_bytes) { /* the first slot's first 8 MiB, faulted in here: how expensive fresh memory is */
        size_t nb = c->arena_bytes < (8u << 20) ? c->arena_bytes : (8u << 20);
        double t0 = df_now();
        df_touch_range(c->arena, nb);
        double dt = df_now() - t0;
        c->touch_gbs = dt > 0 ? nb / dt / 1e9 : 1e3;
        if (o->fresh_memory == 1) c->touch_gbs = FAST_TOUCH_GBS / 8; /* forced (tests): as if slow */
        if (o->fresh_memory == 2) c->touch_gbs = FAST_TOUCH_GBS * 8; /* as if fast */
    }
    c->fresh_t = df_now();
    if (o->populate && c->arena_bytes && c->slot_bytes)
        for (int i = 0; i < POPULATE_THREADS; i++)
            if (pthread_create(&c->populator[c->populating], NULL, populate, c) == 0) c->populating++;
    atomic_store(&c->pop_go, 1);
    c->slots = df_xcalloc((size_t)n, sizeof(slot));
    for (int i = 0; i < n; i++) c->slots[i].key = -1, c->slots[i].mem = c->arena + (size_t)i * (size_t)sb;
    c->slot_of = df_xmalloc((size_t)(n_layers * n_experts) * sizeof(int));
    for (int i = 0; i < n_layers * n_experts; i++) c->slot_of[i] = -1;
    if (o->use_io_uring && io_uring_queue_init(QD, &c->ring, 0) == 0) c->have_ring = 1;
    c->pred_l = -1;
    c->pf_mode = DF_PF_AUTO;
    c->st.n_slots = n;
    c->st.slot_bytes = sb;
    c->st.io_uring = c->have_ring;
    return c;
}

void df_ecache_free(df_ecache *c) {
    if (!c) return;
    if (c->populating) {
        atomic_store(&c->stop_populate, 1);
        for (int i = 0; i < c->populating; i++) pthread_join(c->populator[i], NULL);
    }
    if (c->have_ring) {
        while (c->inflight > 0) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&c->ring, &cqe)) break;
            io_uring_cqe_seen(&c->ring, cqe);
            c->inflight--;
        }
        io_uring_queue_exit(&c->ring);
    }
    if (c->arena) munmap(c->arena, c->arena_bytes ? c->arena_bytes : ALIGN);
    for (int i = 0; i < c->n_files; i++) { if (c->fd) close(c->fd[i]); free(c->path[i]); }
    free(c->fd), free(c->path), free(c->slots), free(c->slot_of), free(c->loc);
    free(c->a_how), free(c->a_sl), free(c->a_done), free(c->a_waited), free(c);
}

/* Points the slot's parts at their bytes. */
static void bind_slot(df_ecache *c, slot *s) {
    const df_expert_loc *t = &c->loc[s->key];
    reads r;
    plan_reads(t, &r);
    s->n_parts = t->n_parts;
    for (int p = 0; p < t->n_parts; p++) s->parts[p] = s->mem + part_pos(t, &r, p);
}

static int verify(df_ecache *c, slot *s) {
    const df_expert_loc *t = &c->loc[s->key];
    if (!t->has_xxh3) return 0;
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    reads r;
    plan_reads(t, &r);
    for (int p = 0; p < t->n_parts; p++) XXH3_64bits_update(h, s->mem + part_pos(t, &r, p), t->part[p].len);
    uint64_t got = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return got == t->xxh3 ? 0 : -1;
}

/* Marks a slot whose last extent arrived. */
static void finish(df_ecache *c, slot *s) {
    if (s->failed == 3) { /* a cancelled prefetch: the slot is free again */
        c->slot_of[s->key] = -1;
        s->key = -1;
        s->state = S_EMPTY;
        s->failed = 0;
        s->prefetched = 0;
        return;
    }
    if (!s->failed && verify(c, s) != 0) s->failed = 2;
    if (s->failed) return; /* reported by acquire */
    bind_slot(c, s);
    s->state = S_READY;
}

/* Whether first touches of slot memory are expensive: faulting in the start
 * of the arena at creation ran under FAST_TOUCH_GBS (zeroing 2 MiB pages runs
 * at 10+ GB/s on bare metal; this project's VM, which backs memory lazily,
 * gave 0.4-0.5 after page caches were dropped). */
static int lazy_memory(const df_ecache *c) { return c->touch_gbs > 0 && c->touch_gbs < FAST_TOUCH_GBS; }

/* The slot a new read goes to, cheapest first: an empty slot that held an
 * expert before (its memory is faulted in), a dead prefetch (the oldest), a
 * never-used slot, and only then the eviction policy's victim. Where fresh
 * memory is expensive (lazy_memory), an expert that no forward pass used in
 * the last STALE_TOKENS positions is evicted before a never-used slot is
 * taken: on this project's VM a fresh 9.4 MB slot cost ~15 ms of CPU, a
 * re-read of an evicted expert a few ms of otherwise idle disk, and decode
 * of the GGUF benchmark ran 9.7-9.9 s instead of 11.2-12.1 s. */
static int pick_victim(df_ecache *c) {
    int best = -1, dead = -1, fresh = -1;
    const int hw = atomic_load(&c->high_water);
    for (int i = 0; i < c->n_slots; i++) {
        slot *s = &c->slots[i];
        if (s->key < 0) {
            if (i < hw) return i;
            if (fresh < 0) fresh = i;
            continue;
        }
        if (s->pinned || s->state == S_LOADING) continue;
        if (s->dead) {
            if (dead < 0 || s->last_use < c->slots[dead].last_use) dead = i;
            continue;
        }
        if (best < 0) { best = i; continue; }
        slot *b = &c->slots[best];
        if (c->policy == DF_EVICT_LFU ? (s->uses < b->uses || (s->uses == b->uses && s->last_use < b->last_use)) : s->last_use < b->last_use) best = i;
    }
    if (dead < 0 && fresh >= 0 && best >= 0 && c->token - c->slots[best].last_token > STALE_TOKENS && lazy_memory(c)) {
        c->st.stale_reuses++;
        return best;
    }
    return dead >= 0 ? dead : fresh >= 0 ? fresh : best;
}

/* Starts loading key into a victim slot; returns the slot index or -1 if no slot is free. */
static int start_load(df_ecache *c, int key) {
    int v = pick_victim(c);
    if (v < 0) return -1;
    if (c->before_reuse && v < atomic_load(&c->high_water)) c->before_reuse(); /* the slot's bytes may still be copied out */
    if (v + 1 > atomic_load(&c->high_water)) {
        atomic_store(&c->high_water, v + 1);
        if (c->populating) note_fresh_slot(c);
    }
    slot *s = &c->slots[v];
    if (s->key >= 0) {
        if (s->prefetched) c->st.prefetch_unused++;
        c->slot_of[s->key] = -1;
    }
    s->n_parts = 0;
    memset(s->notes, 0, sizeof s->notes); /* new bytes: nothing derived from the old ones holds */
    s->key = key, s->state = S_LOADING, s->failed = 0, s->prefetched = 0, s->dead = 0, s->uses = 0;
    c->slot_of[key] = v;
    const df_expert_loc *t = &c->loc[key];
    reads rd;
    plan_reads(t, &rd);
    uint64_t pos = 0;
    s->pending = rd.n;
    for (int p = 0; p < rd.n; p++) {
        const df_extent *e = &rd.run[p];
        uint64_t n = span(e);
        c->st.bytes_read += (int64_t)n;
        if (c->have_ring) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
            while (!sqe) { /* ring full: submit and retry */
                io_uring_submit(&c->ring);
                sqe = io_uring_get_sqe(&c->ring);
            }
            io_uring_prep_read(sqe, c->fd[e->file], s->mem + pos, (unsigned)n, a_down(e->off));
            io_uring_sqe_set_data64(sqe, ((uint64_t)v << 8) | (uint64_t)p);
            c->inflight++;
        } else {
            uint64_t done = 0, need = (e->off - a_down(e->off)) + e->len;
            while (done < need) {
                ssize_t r = pread(c->fd[e->file], s->mem + pos + done, n - done, (off_t)(a_down(e->off) + done));
                if (r <= 0) { s->failed = 1; snprintf(c->ioerr, sizeof c->ioerr, "%s: read failed at %llu: %s", c->path[e->file], (unsigned long long)(a_down(e->off) + done), r < 0 ? strerror(errno) : "end of file"); break; }
                done += (uint64_t)r;
            }
            s->pending--;
        }
        pos += n;
    }
    if (!c->have_ring) finish(c, s);
    return v;
}

/* Handles one completion; returns the slot that became complete or -1. */
static int reap(df_ecache *c, struct io_uring_cqe *cqe) {
    uint64_t ud = io_uring_cqe_get_data64(cqe);
    if (ud & CANCEL_TAG) { /* completion of a cancel request itself */
        io_uring_cqe_seen(&c->ring, cqe);
        c->inflight--;
        return -1;
    }
    int v = (int)(ud >> 8), p = (int)(ud & 0xff);
    slot *s = &c->slots[v];
    reads rd;
    plan_reads(&c->loc[s->key], &rd);
    const df_extent *e = &rd.run[p];
    uint64_t need = (e->off - a_down(e->off)) + e->len;
    if (s->failed == 3) {
        /* cancelled prefetch: whatever the outcome, the slot is freed in finish */
    } else if (cqe->res < 0 || (uint64_t)cqe->res < need) {
        s->failed = 1;
        snprintf(c->ioerr, sizeof c->ioerr, "%s: read of %llu bytes at %llu failed: %s", c->path[e->file], (unsigned long long)span(e),
                 (unsigned long long)a_down(e->off), cqe->res < 0 ? strerror(-cqe->res) : "short read");
    }
    io_uring_cqe_seen(&c->ring, cqe);
    c->inflight--;
    if (--s->pending == 0) { finish(c, s); return v; }
    return -1;
}

void df_ecache_prefetch(df_ecache *c, int l, const int *ids, int k) {
    int issued = 0;
    for (int i = 0; i < k; i++) {
        int key = l * c->n_experts + ids[i];
        if (c->slot_of[key] >= 0 || c->loc[key].n_parts == 0) continue;
        int v = start_load(c, key);
        if (v < 0) break;
        c->slots[v].prefetched = 1;
        c->slots[v].last_use = ++c->clock;
        c->st.prefetch_issued++;
        issued = 1;
    }
    if (issued && c->have_ring) io_uring_submit(&c->ring);
}

int df_ecache_acquire(df_ecache *c, int l, const int *ids, int k, df_ecache_ready_fn ready, void *ctx, char *err, size_t errlen) {
    return df_ecache_acquire_pf(c, l, ids, k, -1, NULL, 0, ready, ctx, err, errlen);
}

/* Judges the prediction made for layer l against the experts it really uses:
 * each predicted expert that was not resident (a read a prefetch would issue)
 * is right if l uses it. */
static void judge_prediction(df_ecache *c, int l, const int *ids, int k) {
    if (c->pred_l != l) return;
    for (int j = 0; j < c->pred_n; j++) {
        int hit = 0;
        for (int i = 0; i < k && !hit; i++) hit = ids[i] == c->pred_ids[j];
        if (c->win_n == PF_WINDOW) c->win_hits -= c->win[c->win_pos];
        else c->win_n++;
        c->win[c->win_pos] = (uint8_t)hit;
        c->win_hits += hit;
        c->win_pos = (c->win_pos + 1) % PF_WINDOW;
        c->st.predicted++;
        c->st.predicted_right += hit;
    }
    c->pred_l = -1;
}

/* Whether predictions are worth reading: always, never, or (auto) while at
 * least half of the recent ones were right. A wrong prefetch costs disk time
 * that demand reads then wait behind, and a slot; on random-weight models
 * (precision ~25%) prefetching made runs slower, docs/PERFORMANCE.md. */
static int prefetch_worth(const df_ecache *c) {
    if (c->pf_mode == DF_PF_ALWAYS) return 1;
    if (c->pf_mode == DF_PF_NEVER) return 0;
    return c->win_n >= PF_MIN && 2 * c->win_hits >= c->win_n;
}

int df_ecache_acquire_pf(df_ecache *c, int l, const int *ids, int k, int pf_l, const int *pf_ids, int pf_k,
                         df_ecache_ready_fn ready, void *ctx, char *err, size_t errlen) {
    enum { HIT = 0, PREFETCH_HIT = 1, PREFETCH_WAIT = 2, READ = 3 };
    int *how = c->a_how, *sl = c->a_sl, *done = c->a_done;
    double *waited = c->a_waited;
    if (k > c->max_k || k > c->n_slots)
        return df_err(err, errlen, DF_EINTERNAL, "expert cache: %d experts in one request (at most %d)", k, c->max_k < c->n_slots ? c->max_k : c->n_slots);
    judge_prediction(c, l, ids, k);
    int submit = 0;
    for (int i = 0; i < k; i++) {
        int key = l * c->n_experts + ids[i];
        int v = c->slot_of[key];
        waited[i] = 0;
        done[i] = 0;
        if (v >= 0 && c->slots[v].failed == 3) {
            /* a cancelled prefetch of this expert is still in flight: let it land (its slot is
             * freed then), and read the expert afresh */
            while (c->slots[v].key == key && c->slots[v].pending > 0) {
                struct io_uring_cqe *cqe;
                if (io_uring_wait_cqe(&c->ring, &cqe) < 0) break;
                reap(c, cqe);
            }
            v = c->slot_of[key];
        }
        if (v >= 0) {
            slot *s = &c->slots[v];
            how[i] = s->prefetched ? (s->state == S_READY ? PREFETCH_HIT : PREFETCH_WAIT) : HIT;
            if (s->prefetched) c->st.prefetch_hits++; else c->st.hits++;
            s->prefetched = 0;
            s->dead = 0;
        } else {
            v = start_load(c, key);
            if (v < 0) return df_err(err, errlen, DF_ENOMEM, "expert cache: no free slot for layer %d expert %d (%d slots, all pinned or loading)", l, ids[i], c->n_slots);
            how[i] = READ;
            c->st.misses++;
            submit = 1;
        }
        sl[i] = v;
        c->slots[v].pinned = 1;
        c->slots[v].last_use = ++c->clock;
        c->slots[v].last_token = c->token;
        c->slots[v].uses++;
    }
    /* prefetches for this layer that turned out wrong: those still reading are cancelled,
     * those that arrived become the first slots to reuse */
    if (c->pf_mode != DF_PF_NEVER)
        for (int v = 0; v < c->n_slots; v++) {
            slot *s = &c->slots[v];
            if (s->key < 0 || s->key / c->n_experts != l || !s->prefetched || s->pinned) continue;
            if (s->state == S_READY) { s->dead = 1; continue; }
            if (!c->have_ring || s->state != S_LOADING || s->failed) continue;
            s->failed = 3;
            c->st.prefetch_cancelled++;
            reads rd;
            plan_reads(&c->loc[s->key], &rd);
            for (int p = 0; p < rd.n; p++) {
                struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
                if (!sqe) { io_uring_submit(&c->ring); sqe = io_uring_get_sqe(&c->ring); }
                io_uring_prep_cancel64(sqe, ((uint64_t)v << 8) | (uint64_t)p, 0);
                io_uring_sqe_set_data64(sqe, CANCEL_TAG | ((uint64_t)v << 8) | (uint64_t)p);
                c->inflight++;
                submit = 1;
            }
        }
    if (submit && c->have_ring) io_uring_submit(&c->ring);
    if (pf_k > 0 && c->pf_mode != DF_PF_NEVER) {
        c->pred_l = pf_l, c->pred_n = 0;
        for (int j = 0; j < pf_k && c->pred_n < 64; j++)
            if (c->slot_of[pf_l * c->n_experts + pf_ids[j]] < 0) c->pred_ids[c->pred_n++] = pf_ids[j];
        if (c->have_ring && prefetch_worth(c)) df_ecache_prefetch(c, pf_l, pf_ids, pf_k);
    }
    int left = k;
    /* hand over what is ready, then wait for the rest in arrival order */
    for (;;) {
        for (int i = 0; i < k; i++) {
            if (done[i]) continue;
            slot *s = &c->slots[sl[i]];
            if (s->failed) {
                if (s->failed == 2)
                    return df_err(err, errlen, DF_EFORMAT, "expert cache: checksum mismatch for layer %d expert %d (corrupt store or file)", l, ids[i]);
                return df_err(err, errlen, DF_EIO, "expert cache: layer %d expert %d: %s", l, ids[i], c->ioerr);
            }
            if (s->state != S_READY) continue;
            done[i] = 1;
            left--;
            ready(ctx, i, s->parts);
        }
        if (!left) break;
        if (!c->have_ring) return df_err(err, errlen, DF_EINTERNAL, "expert cache: layer %d: waiting without io_uring", l);
        ready(ctx, -1, NULL); /* about to wait: the caller may compute what it has batched */
        double t0 = df_now();
        struct io_uring_cqe *cqe;
        int r = io_uring_wait_cqe(&c->ring, &cqe);
        double dt = df_now() - t0;
        c->st.io_wait_s += dt;
        for (int i = 0; i < k; i++) if (!done[i]) waited[i] += dt;
        if (r < 0) return df_err(err, errlen, DF_EIO, "expert cache: io_uring wait failed: %s", strerror(-r));
        reap(c, cqe);
        while (io_uring_peek_cqe(&c->ring, &cqe) == 0) reap(c, cqe);
    }
    ready(ctx, -1, NULL);
    if (c->trace) {
        fprintf(c->trace, "{\"token\":%lld,\"layer\":%d,\"experts\":[", (long long)c->token, l);
        static const char *names[] = {"hit", "prefetch_hit", "prefetch_wait", "read"};
        for (int i = 0; i < k; i++)
            fprintf(c->trace, "%s{\"id\":%d,\"served\":\"%s\",\"wait_us\":%.0f}", i ? "," : "", ids[i], names[how[i]], waited[i] * 1e6);
        fprintf(c->trace, "]}\n");
        if (ferror(c->trace)) return df_err(err, errlen, DF_EIO, "trace file: write failed (disk full?)");
    }
    return 0;
}

void df_ecache_release(df_ecache *c) {
    for (int i = 0; i < c->n_slots; i++) c->slots[i].pinned = 0;
}

void df_ecache_stats_get(const df_ecache *c, df_ecache_stats *s) {
    *s = c->st;
    s->touch_gbs = c->touch_gbs;
}
int df_ecache_slots(const df_ecache *c) { return c->n_slots; }
void df_ecache_set_policy(df_ecache *c, df_evict_policy p) { c->policy = p; }
void df_ecache_memory(const df_ecache *c, void **p, size_t *bytes) { *p = c->arena, *bytes = c->arena ? c->arena_bytes : 0; }
void df_ecache_set_trace(df_ecache *c, FILE *f) { c->trace = f; }
void df_ecache_set_prefetch(df_ecache *c, df_prefetch_mode m) { c->pf_mode = m; }
void df_ecache_set_token(df_ecache *c, int64_t t) { c->token = t; }

/* ---- the df_expert_source interface ---------------------------------- */
static int src_acquire(df_expert_source *s, int l, const int *ids, int k, int pf_l, const int *pf_ids, int pf_k,
                       df_expert_ready_fn ready, void *ctx, char *err, size_t errlen) {
    return df_ecache_acquire_pf((df_ecache *)s, l, ids, k, pf_l, pf_ids, pf_k, ready, ctx, err, errlen);
}
static void src_release(df_expert_source *s) { df_ecache_release((df_ecache *)s); }
static int src_capacity(const df_expert_source *s) { return ((const df_ecache *)s)->n_slots; }
static int src_wants_prediction(const df_expert_source *s) { return ((const df_ecache *)s)->pf_mode != DF_PF_NEVER; }
static void src_set_token(df_expert_source *s, int64_t pos) { df_ecache_set_token((df_ecache *)s, pos); }

/* the words of a loaded (pinned) expert's slot; NULL for one that is not loaded */
static int *src_part_notes(df_expert_source *s, int l, int e) {
    df_ecache *c = (df_ecache *)s;
    if (l < 0 || l >= c->n_layers || e < 0 || e >= c->n_experts) return NULL;
    const int v = c->slot_of[l * c->n_experts + e];
    return v >= 0 && c->slots[v].state == S_READY && !c->slots[v].failed ? c->slots[v].notes : NULL;
}

static const df_expert_source_ops ecache_ops = {src_acquire, src_release, src_capacity, src_wants_prediction, src_set_token,
                                                src_part_notes};

df_expert_source *df_ecache_source(df_ecache *c) { return &c->base; }
