/* pcache.c - the prompt cache on disk (see pcache.h; docs/SERVER.md).
 *
 * Names: DIR/<32 hex>-<L>.dfpc, the hex being XXH3-128 of the L token ids
 * of the prefix, seeded with the engine's fingerprint (the file itself
 * holds the ids and the fingerprint, checked on load, so a hash collision or
 * a renamed file is a refused file, not a wrong answer). Lookup: for each
 * distinct stored length L (from the index, longest first) with
 * kept-in-RAM < L <= n, hash ids[0..L) and look the name up in the index:
 * at most one hash of <= n ids per distinct length.
 *
 * What is stored, after a request (the writer takes the turn once the
 * request has let go of it): the whole prompt (fixed state and logits from a
 * snapshot taken right after the prompt's sync), and, for models whose
 * layers can all be truncated, the prefix the prompt shared with the
 * session's previous timeline (no logits), so that after a restart a new
 * request sharing only that prefix (the same system prompt or document with
 * another question) finds it.
 *
 * Writes: DIR/.tmp-<pid>-<n>.part, written under the turn, then fsync,
 * rename to its name, fsync of DIR. Temp files whose writer process is gone
 * (kill -9 mid-write) are deleted at the next open. */
#include "server/pcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "util/util.h"

#define PC_NAME 64
#define PC_MAX_JOBS 4

typedef struct {
    char name[PC_NAME];
    size_t len;      /* tokens */
    uint64_t bytes;
    double used;     /* last use, seconds since the epoch (the file's mtime) */
} pc_entry;

struct df_pcache_job {
    df_pcache_job *next;
    int32_t *ids;
    size_t n;        /* the whole prompt: ids[0..n) */
    int snap;        /* its snapshot, or -1: not stored */
    size_t shared;   /* the shared prefix to store too, or 0 */
};

struct df_pcache {
    char *dir;
    int64_t max_bytes;
    df_engine *e;
    df_session *s;
    df_turn *turn;
    int quiet;
    uint64_t fp;
    pthread_mutex_t mu;  /* index, queue, closing */
    pthread_cond_t cv;
    pc_entry *ent;
    size_t n_ent, cap_ent;
    uint64_t total;
    df_pcache_job *head, *tail;
    int n_jobs, closing, warned_big;
    unsigned tmp_ctr;
    pthread_t writer;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void key_name(const df_pcache *pc, const int32_t *ids, size_t L, char out[PC_NAME]) {
    XXH128_hash_t h = XXH3_128bits_withSeed(ids, L * sizeof *ids, pc->fp); /* the fingerprint as the seed */
    snprintf(out, PC_NAME, "%016" PRIx64 "%016" PRIx64 "-%zu.dfpc", (uint64_t)h.high64, (uint64_t)h.low64, L);
}

/* ---- the index (callers hold mu) --------------------------------------------- */

static pc_entry *find(df_pcache *pc, const char *name) {
    for (size_t i = 0; i < pc->n_ent; i++)
        if (!strcmp(pc->ent[i].name, name)) return &pc->ent[i];
    return NULL;
}

static void drop_entry(df_pcache *pc, pc_entry *x) {
    pc->total -= x->bytes;
    *x = pc->ent[--pc->n_ent];
}

static void add_entry(df_pcache *pc, const char *name, size_t len, uint64_t bytes, double used) {
    pc_entry *x = find(pc, name);
    if (x) drop_entry(pc, x);
    if (pc->n_ent == pc->cap_ent) {
        size_t cap = pc->cap_ent ? 2 * pc->cap_ent : 64;
        pc_entry *p = realloc(pc->ent, cap * sizeof *p);
        if (!p) return; /* the file stays on disk, unindexed until the next start */
        pc->ent = p, pc->cap_ent = cap;
    }
    x = &pc->ent[pc->n_ent++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->len = len, x->bytes = bytes, x->used = used;
    pc->total += bytes;
}

static void unlink_name(const df_pcache *pc, const char *name) {
    char *p = df_path_join(pc->dir, name);
    unlink(p);
    free(p);
}

/* Deletes least recently used files until the total fits, keeping `keep`. */
static void evict(df_pcache *pc, const char *keep) {
    while (pc->total > (uint64_t)pc->max_bytes && pc->n_ent) {
        pc_entry *old = NULL;
        for (size_t i = 0; i < pc->n_ent; i++)
            if ((!keep || strcmp(pc->ent[i].name, keep)) && (!old || pc->ent[i].used < old->used)) old = &pc->ent[i];
        if (!old) break;
        if (!pc->quiet) fprintf(stderr, "deltafin serve: prompt cache: evicted %s (%.1f MiB, least recently used)\n", old->name, old->bytes / 1048576.0);
        unlink_name(pc, old->name);
        drop_entry(pc, old);
    }
}

/* "<32 hex>-<len>.dfpc" -> len, or 0 */
static size_t parse_name(const char *n) {
    for (int i = 0; i < 32; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return 0;
    if (n[32] != '-') return 0;
    char *end;
    errno = 0;
    unsigned long long L = strtoull(n + 33, &end, 10);
    if (errno || end == n + 33 || n[33] == '0' || strcmp(end, ".dfpc") || L > ((size_t)1 << 31)) return 0;
    return (size_t)L;
}

/* ---- writing ------------------------------------------------------------------- */

typedef struct { int fd; char tmp[PC_NAME], name[PC_NAME]; size_t len; uint64_t bytes; } pc_out;

/* Under the turn: writes ids[0..n) at snap (or -1) to a temp file. 0 or DF_E*. */
static int write_tmp(df_pcache *pc, const int32_t *ids, size_t n, int snap, pc_out *o) {
    uint64_t need = df_session_file_bytes(pc->s, n);
    if (need > (uint64_t)pc->max_bytes) {
        if (!pc->warned_big++)
            fprintf(stderr, "deltafin serve: prompt cache: a state of %zu tokens takes %.1f MiB, more than --cache-size %.1f MiB: not stored\n",
                    n, need / 1048576.0, pc->max_bytes / 1048576.0);
        return DF_ENOMEM;
    }
    key_name(pc, ids, n, o->name);
    pthread_mutex_lock(&pc->mu);
    snprintf(o->tmp, sizeof o->tmp, ".tmp-%ld-%u.part", (long)getpid(), pc->tmp_ctr++);
    pthread_mutex_unlock(&pc->mu);
    char *path = df_path_join(pc->dir, o->tmp);
    o->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int rc = 0;
    if (o->fd < 0) {
        fprintf(stderr, "deltafin serve: prompt cache: cannot create %s: %s\n", path, strerror(errno));
        rc = DF_EIO;
    } else if ((rc = df_session_save(pc->s, snap, ids, n, o->fd, &o->bytes))) {
        if (rc != DF_EUNSUPPORTED) fprintf(stderr, "deltafin serve: prompt cache: not stored: %s\n", df_engine_error(pc->e));
        close(o->fd);
        unlink(path);
    }
    o->len = n;
    free(path);
    return rc;
}

/* Outside the turn: makes a written temp file durable and visible. */
static void publish(df_pcache *pc, pc_out *o, double t0) {
    char *tmp = df_path_join(pc->dir, o->tmp), *dst = df_path_join(pc->dir, o->name);
    int ok = fsync(o->fd) == 0;
    if (!ok) fprintf(stderr, "deltafin serve: prompt cache: fsync %s: %s\n", tmp, strerror(errno));
    close(o->fd);
    if (ok && rename(tmp, dst)) {
        fprintf(stderr, "deltafin serve: prompt cache: rename %s: %s\n", tmp, strerror(errno));
        ok = 0;
    }
    if (!ok) unlink(tmp);
    int dfd = ok ? open(pc->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) fsync(dfd), close(dfd);
    if (ok) {
        pthread_mutex_lock(&pc->mu);
        add_entry(pc, o->name, o->len, o->bytes, now_s());
        evict(pc, o->name);
        pthread_mutex_unlock(&pc->mu);
        if (!pc->quiet)
            fprintf(stderr, "deltafin serve: prompt cache: stored %zu tokens in %s (%.1f MiB) in %.1f ms\n", o->len, o->name,
                    o->bytes / 1048576.0, (df_now() - t0) * 1e3);
    }
    free(tmp);
    free(dst);
}

static void job_free(df_pcache_job *j) {
    if (!j) return;
    free(j->ids);
    free(j);
}

static void *writer_main(void *arg) {
    df_pcache *pc = arg;
    for (;;) {
        pthread_mutex_lock(&pc->mu);
        while (!pc->head && !pc->closing) pthread_cond_wait(&pc->cv, &pc->mu);
        df_pcache_job *j = pc->head;
        if (j) {
            pc->head = j->next;
            if (!pc->head) pc->tail = NULL;
            pc->n_jobs--;
        }
        pthread_mutex_unlock(&pc->mu);
        if (!j) return NULL;
        int r;
        while ((r = df_turn_acquire(pc->turn, NULL)) == TURN_FULL) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (r != TURN_OK) { job_free(j); continue; } /* shutdown: the snapshot goes with the session */
        double t0 = df_now();
        pc_out o[2];
        int ok[2] = {0, 0};
        if (j->snap >= 0) ok[0] = !write_tmp(pc, j->ids, j->n, j->snap, &o[0]);
        if (j->shared) ok[1] = !write_tmp(pc, j->ids, j->shared, -1, &o[1]);
        if (j->snap >= 0) df_session_snapshot_drop(pc->s, j->snap);
        df_turn_release(pc->turn);
        for (int i = 0; i < 2; i++)
            if (ok[i]) publish(pc, &o[i], t0);
        job_free(j);
    }
}

/* ---- the API --------------------------------------------------------------------- */

df_pcache *df_pcache_open(const char *dir, int64_t max_bytes, df_engine *e, df_session *s, df_turn *turn, int quiet,
                          char *err, size_t errlen) {
    if (df_mkdirs(dir) || !df_is_dir(dir)) { df_err(err, errlen, DF_EIO, "--cache-dir %s: cannot create the directory: %s", dir, strerror(errno)); return NULL; }
    if (access(dir, R_OK | W_OK | X_OK)) { df_err(err, errlen, DF_EIO, "--cache-dir %s: %s", dir, strerror(errno)); return NULL; }
    DIR *d = opendir(dir);
    if (!d) { df_err(err, errlen, DF_EIO, "--cache-dir %s: %s", dir, strerror(errno)); return NULL; }
    df_pcache *pc = calloc(1, sizeof *pc);
    if (!pc || !(pc->dir = strdup(dir))) { closedir(d); free(pc); df_err(err, errlen, DF_ENOMEM, "out of memory"); return NULL; }
    pc->max_bytes = max_bytes, pc->e = e, pc->s = s, pc->turn = turn, pc->quiet = quiet;
    pc->fp = df_engine_fingerprint(e);
    pthread_mutex_init(&pc->mu, NULL);
    pthread_cond_init(&pc->cv, NULL);
    struct dirent *de;
    int n_tmp = 0;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        long pid;
        unsigned ctr;
        if (sscanf(nm, ".tmp-%ld-%u.part", &pid, &ctr) == 2) {
            /* a temp file of a writer that died mid-write (kill -9): never renamed, so never read; delete it */
            if (pid > 0 && kill((pid_t)pid, 0) && errno == ESRCH) unlink_name(pc, nm), n_tmp++;
            continue;
        }
        size_t L = parse_name(nm);
        if (!L) continue;
        char *p = df_path_join(dir, nm);
        struct stat sb;
        if (!stat(p, &sb) && S_ISREG(sb.st_mode))
            add_entry(pc, nm, L, (uint64_t)sb.st_size, (double)sb.st_mtim.tv_sec + sb.st_mtim.tv_nsec * 1e-9);
        free(p);
    }
    closedir(d);
    evict(pc, NULL);
    if (!quiet)
        fprintf(stderr, "deltafin serve: prompt cache: %s: %zu files, %.1f MiB of at most %.1f MiB%s\n", dir, pc->n_ent,
                pc->total / 1048576.0, max_bytes / 1048576.0, n_tmp ? " (deleted unfinished temp files of dead writers)" : "");
    if (pthread_create(&pc->writer, NULL, writer_main, pc)) {
        df_err(err, errlen, DF_ENOMEM, "cannot start the prompt cache's writer thread");
        pthread_mutex_destroy(&pc->mu);
        pthread_cond_destroy(&pc->cv);
        free(pc->ent);
        free(pc->dir);
        free(pc);
        return NULL;
    }
    return pc;
}

void df_pcache_close(df_pcache *pc) {
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    pc->closing = 1;
    pthread_cond_broadcast(&pc->cv);
    pthread_mutex_unlock(&pc->mu);
    pthread_join(pc->writer, NULL);
    while (pc->head) {
        df_pcache_job *j = pc->head;
        pc->head = j->next;
        job_free(j);
    }
    pthread_mutex_destroy(&pc->mu);
    pthread_cond_destroy(&pc->cv);
    free(pc->ent);
    free(pc->dir);
    free(pc);
}

static int cmp_desc(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

size_t df_pcache_load(df_pcache *pc, const int32_t *ids, size_t n) {
    size_t ram = df_session_reusable(pc->s, ids, n);
    pthread_mutex_lock(&pc->mu);
    size_t *lens = malloc((pc->n_ent + 1) * sizeof *lens), k = 0;
    for (size_t i = 0; lens && i < pc->n_ent; i++)
        if (pc->ent[i].len > ram && pc->ent[i].len <= n) lens[k++] = pc->ent[i].len;
    pthread_mutex_unlock(&pc->mu);
    if (!lens) return 0;
    qsort(lens, k, sizeof *lens, cmp_desc);
    size_t got = 0;
    for (size_t i = 0; i < k && !got; i++) {
        if (i && lens[i] == lens[i - 1]) continue;
        char name[PC_NAME];
        key_name(pc, ids, lens[i], name);
        pthread_mutex_lock(&pc->mu);
        int have = find(pc, name) != NULL;
        pthread_mutex_unlock(&pc->mu);
        if (!have) continue;
        char *path = df_path_join(pc->dir, name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        double t0 = df_now();
        int rc = fd < 0 ? DF_EIO : df_session_load(pc->s, fd, ids, n, &got);
        double dt = df_now() - t0;
        if (!rc) {
            struct stat sb;
            uint64_t bytes = fstat(fd, &sb) ? 0 : (uint64_t)sb.st_size;
            (void)futimens(fd, NULL); /* last use, for LRU across restarts */
            pthread_mutex_lock(&pc->mu);
            pc_entry *x = find(pc, name);
            if (x) x->used = now_s();
            pthread_mutex_unlock(&pc->mu);
            if (!pc->quiet)
                fprintf(stderr, "deltafin serve: prompt cache: loaded %zu tokens from %s (%.1f MiB) in %.1f ms (%.0f MiB/s)\n", got, name,
                        bytes / 1048576.0, dt * 1e3, dt > 0 ? bytes / 1048576.0 / dt : 0.0);
        } else {
            got = 0;
            if (fd < 0 && errno == ENOENT) { /* evicted since it was listed (by this writer or another server) */
                pthread_mutex_lock(&pc->mu);
                pc_entry *x = find(pc, name);
                if (x) drop_entry(pc, x);
                pthread_mutex_unlock(&pc->mu);
                free(path);
                continue;
            }
            fprintf(stderr, "deltafin serve: prompt cache: ignored and deleted %s: %s\n", path,
                    fd < 0 ? strerror(errno) : df_engine_error(pc->e));
            unlink(path);
            pthread_mutex_lock(&pc->mu);
            pc_entry *x = find(pc, name);
            if (x) drop_entry(pc, x);
            pthread_mutex_unlock(&pc->mu);
        }
        if (fd >= 0) close(fd);
        free(path);
    }
    free(lens);
    return got;
}

df_pcache_job *df_pcache_plan(df_pcache *pc, const int32_t *ids, size_t n, size_t kept) {
    char name[PC_NAME];
    int want_full = n >= DF_PCACHE_MIN_TOKENS, want_shared = kept >= DF_PCACHE_MIN_TOKENS && kept + 1 < n;
    pthread_mutex_lock(&pc->mu);
    if (want_full) key_name(pc, ids, n, name), want_full = !find(pc, name);
    if (want_shared) key_name(pc, ids, kept, name), want_shared = !find(pc, name);
    int room = pc->n_jobs < PC_MAX_JOBS;
    pthread_mutex_unlock(&pc->mu);
    if ((!want_full && !want_shared) || !room) return NULL;
    df_pcache_job *j = calloc(1, sizeof *j);
    if (!j || !(j->ids = malloc(n * sizeof *ids))) { free(j); return NULL; }
    memcpy(j->ids, ids, n * sizeof *ids);
    j->n = n;
    j->snap = want_full ? df_session_snapshot(pc->s) : -1; /* < 0: no room for a snapshot, only the shared prefix */
    if (j->snap < 0) j->snap = -1;
    j->shared = want_shared ? kept : 0;
    if (j->snap < 0 && !j->shared) { job_free(j); return NULL; }
    return j;
}

void df_pcache_submit(df_pcache *pc, df_pcache_job *j) {
    if (!j) return;
    pthread_mutex_lock(&pc->mu);
    int ok = !pc->closing && pc->n_jobs < PC_MAX_JOBS;
    if (ok) {
        j->next = NULL;
        if (pc->tail) pc->tail->next = j; else pc->head = j;
        pc->tail = j;
        pc->n_jobs++;
        pthread_cond_signal(&pc->cv);
    }
    pthread_mutex_unlock(&pc->mu);
    if (!ok) {
        if (j->snap >= 0) df_session_snapshot_drop(pc->s, j->snap); /* the caller holds the turn */
        job_free(j);
    }
}
