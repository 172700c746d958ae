/* bulkread.c - reads many file extents into memory the caller owns, at the
 * disk's bandwidth: O_DIRECT (no page-cache copy, so each byte lands in RAM
 * once), 4 MiB requests kept QD deep through io_uring. Falls back to
 * buffered pread where O_DIRECT or io_uring is unavailable (tmpfs, old
 * kernels, DELTAFIN_NO_IO_URING). Used for the resident spine of a streamed
 * model, which is read once at load. */
#include "util/util.h"
#include "deltafin.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (4u << 20)
#define QD 16

typedef struct {
    int req;        /* index of the extent */
    uint64_t pos;   /* byte offset inside the extent */
    uint32_t len;
} chunk;

/* Buffered reads of whatever could not be read with O_DIRECT. */
static int read_buffered(const char *path, const df_read_req *r, uint64_t pos, uint64_t len, df_progress *pg, char *err,
                         size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err(err, errlen, DF_EIO, "%s: cannot open: %s", path, strerror(errno));
    while (len) {
        ssize_t n = pread(fd, r->dst + pos, len > CHUNK ? CHUNK : len, (off_t)(r->off + pos));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = errno;
            close(fd);
            if (n == 0 && r->off + pos >= r->need_end)
                return 0; /* past the bytes the caller needs: the aligned tail beyond end of file */
            return df_err(err, errlen, DF_EIO, "%s: read failed at byte %llu: %s", path,
                          (unsigned long long)(r->off + pos), n < 0 ? strerror(e) : "unexpected end of file");
        }
        pos += (uint64_t)n, len -= (uint64_t)n, df_progress_add(pg, (int64_t)n, 0);
    }
    close(fd);
    return 0;
}

typedef struct {
    const df_read_req *r;
    const uint8_t *base;
    size_t stripe;
} order_ctx;
/* stripe-interleaved order: position inside the stripe, then stripe */
static int chunk_cmp(const void *a, const void *b, void *ctx) {
    const order_ctx *o = ctx;
    const chunk *x = a, *y = b;
    size_t px = (size_t)(o->r[x->req].dst + x->pos - o->base), py = (size_t)(o->r[y->req].dst + y->pos - o->base);
    size_t ix = px % o->stripe, iy = py % o->stripe;
    if (ix != iy) return ix < iy ? -1 : 1;
    return px < py ? -1 : px > py;
}

int df_read_extents(const char *const *paths, int n_files, const df_read_req *reqs, int n_reqs, const char *what,
                    struct df_prefault *pf, char *err, size_t errlen) {
    df_progress pg;
    df_progress_init(&pg, what, 0, 0);
    int64_t n_chunks = 0;
    for (int i = 0; i < n_reqs; i++) {
        if (reqs[i].file < 0 || reqs[i].file >= n_files)
            return df_err(err, errlen, DF_EINTERNAL, "read_extents: bad file index %d", reqs[i].file);
        pg.total += (int64_t)reqs[i].len;
        n_chunks += (int64_t)((reqs[i].len + CHUNK - 1) / CHUNK);
    }
    pg.on = isatty(2) && pg.total >= (256 << 20);
    int *fd = df_xmalloc((size_t)(n_files ? n_files : 1) * sizeof(int));
    for (int i = 0; i < n_files; i++) fd[i] = open(paths[i], O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct io_uring ring;
    int have_ring = !getenv("DELTAFIN_NO_IO_URING") && io_uring_queue_init(QD, &ring, 0) == 0;
    chunk *ch = df_xmalloc((size_t)(n_chunks ? n_chunks : 1) * sizeof(chunk));
    int64_t k = 0;
    for (int i = 0; i < n_reqs; i++)
        for (uint64_t p = 0; p < reqs[i].len; p += CHUNK)
            ch[k++] = (chunk){i, p, (uint32_t)(reqs[i].len - p > CHUNK ? CHUNK : reqs[i].len - p)};
    /* with a striped prefault, read the stripes side by side, in step with their faulting */
    order_ctx oc = {reqs, pf ? df_prefault_base(pf) : NULL, df_prefault_stripe(pf)};
    if (oc.stripe) qsort_r(ch, (size_t)n_chunks, sizeof *ch, chunk_cmp, &oc);
    /* chunks that O_DIRECT could not serve (no descriptor, EINVAL) are redone buffered */
    uint8_t *redo = df_xcalloc((size_t)(n_chunks ? n_chunks : 1), 1);
    int rc = 0;
    if (have_ring) {
        int64_t next = 0, inflight = 0;
        while (!rc && (next < n_chunks || inflight > 0)) {
            while (next < n_chunks && inflight < QD) {
                const chunk *c = &ch[next];
                const df_read_req *r = &reqs[c->req];
                int aligned = ((uintptr_t)(r->dst + c->pos) % 4096 == 0) && ((r->off + c->pos) % 4096 == 0) && c->len % 4096 == 0;
                if (fd[r->file] < 0 || !aligned) { redo[next++] = 1; continue; }
                if (pf) df_prefault_wait(pf, r->dst + c->pos, r->dst + c->pos + c->len);
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                if (!sqe) break;
                io_uring_prep_read(sqe, fd[r->file], r->dst + c->pos, c->len, r->off + c->pos);
                io_uring_sqe_set_data64(sqe, (uint64_t)next);
                next++, inflight++;
            }
            if (inflight == 0) continue;
            io_uring_submit(&ring);
            struct io_uring_cqe *cqe;
            int w = io_uring_wait_cqe(&ring, &cqe);
            if (w < 0) { rc = df_err(err, errlen, DF_EIO, "%s: io_uring wait failed: %s", what, strerror(-w)); break; }
            int64_t id = (int64_t)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            const chunk *c = &ch[id];
            const df_read_req *r = &reqs[c->req];
            if (res == (int)c->len) {
                df_progress_add(&pg, c->len, 0);
            } else if (res >= 0) {
                /* short: end of file inside the aligned tail, or a partial read to finish buffered */
                if (r->off + c->pos + (uint64_t)res >= r->need_end) df_progress_add(&pg, c->len, 0);
                else redo[id] = 1;
            } else if (res == -EINVAL || res == -EOPNOTSUPP) {
                redo[id] = 1;
            } else {
                rc = df_err(err, errlen, DF_EIO, "%s: read of %u bytes at %llu failed: %s", paths[r->file], c->len,
                            (unsigned long long)(r->off + c->pos), strerror(-res));
            }
        }
        while (inflight > 0) { /* drain after an error */
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&ring, &cqe)) break;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
        }
        io_uring_queue_exit(&ring);
    } else {
        memset(redo, 1, (size_t)n_chunks);
    }
    for (int64_t i = 0; i < n_chunks && !rc; i++)
        if (redo[i]) rc = read_buffered(paths[reqs[ch[i].req].file], &reqs[ch[i].req], ch[i].pos, ch[i].len, &pg, err, errlen);
    if (!rc) df_progress_add(&pg, 0, 1);
    else if (pg.on) fputc('\n', stderr);
    for (int i = 0; i < n_files; i++)
        if (fd[i] >= 0) close(fd[i]);
    free(fd), free(ch), free(redo);
    return rc;
}

/* ---- faulting memory in, many at a time --------------------------------- */
/* On a VM whose host backs guest memory lazily the first touch of a page
 * waits for the host: 0.42-0.46 GB/s for one thread on this project's 2-vCPU
 * VM after page caches were dropped. Faults taken by several threads
 * overlap: 0.66-0.88 GB/s with eight, and up to 3.6 GB/s at times (the
 * host's state varies; docs/PERFORMANCE.md). Each thread owns one
 * contiguous stripe, so a reader can follow all of them at once. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define PF_STEP (2u << 20)

struct df_prefault {
    uint8_t *p;
    size_t n, stripe;      /* stripe: bytes per thread, a multiple of PF_STEP */
    atomic_int stop, go;
    atomic_uchar *done;    /* per PF_STEP piece */
    size_t n_pieces;
    int threads;
    struct pf_arg {
        struct df_prefault *f;
        int t;
    } arg[DF_PREFAULT_MAX_THREADS];
    pthread_t th[DF_PREFAULT_MAX_THREADS];
};

void df_touch_range(void *p, size_t n) {
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
#endif
    for (size_t i = 0; i < n; i += 4096) ((volatile uint8_t *)p)[i] = ((volatile uint8_t *)p)[i];
}

static void *prefault_main(void *arg) {
    struct pf_arg *a = arg;
    df_prefault *f = a->f;
    size_t b = (size_t)a->t * f->stripe, e = b + f->stripe < f->n ? b + f->stripe : f->n;
    /* start once every thread exists: faults hold the address space's lock for reading,
     * which the next thread's stack mapping waits for */
    while (!atomic_load(&f->go) && !atomic_load(&f->stop)) usleep(100);
    for (size_t at = b; at < e && !atomic_load(&f->stop); at += PF_STEP) {
        df_touch_range(f->p + at, e - at < PF_STEP ? e - at : PF_STEP);
        atomic_store(&f->done[at / PF_STEP], 1);
    }
    return NULL;
}

df_prefault *df_prefault_start(void *p, size_t n, int threads) {
    df_prefault *f = df_xcalloc(1, sizeof *f);
    f->p = p, f->n = n;
    if (threads > DF_PREFAULT_MAX_THREADS) threads = DF_PREFAULT_MAX_THREADS;
    if (threads < 1) threads = 1;
    f->n_pieces = (n + PF_STEP - 1) / PF_STEP;
    f->stripe = (f->n_pieces + (size_t)threads - 1) / (size_t)threads * PF_STEP;
    f->done = df_xcalloc(f->n_pieces ? f->n_pieces : 1, 1);
    atomic_init(&f->stop, 0);
    atomic_init(&f->go, 0);
    for (int i = 0; i < threads; i++) {
        f->arg[f->threads] = (struct pf_arg){f, i};
        if (pthread_create(&f->th[f->threads], NULL, prefault_main, &f->arg[f->threads]) == 0) f->threads++;
    }
    atomic_store(&f->go, 1);
    return f;
}

size_t df_prefault_stripe(const df_prefault *f) { return f && f->threads ? f->stripe : 0; }
const uint8_t *df_prefault_base(const df_prefault *f) { return f ? f->p : NULL; }

void df_prefault_wait(df_prefault *f, const void *start, const void *end) {
    if (!f || f->threads == 0) return;
    size_t a = (size_t)((const uint8_t *)start - f->p), b = (size_t)((const uint8_t *)end - f->p);
    if (b > f->n) b = f->n;
    for (size_t i = a / PF_STEP; a < b && i <= (b - 1) / PF_STEP; i++) {
        int spins = 0;
        while (!atomic_load(&f->done[i])) {
            /* a stripe whose thread never started is faulted by the reader itself */
            if (++spins > 200000) return;
            usleep(50);
        }
    }
}

void df_prefault_finish(df_prefault *f) {
    if (!f) return;
    atomic_store(&f->stop, 1);
    for (int i = 0; i < f->threads; i++) pthread_join(f->th[i], NULL);
    free((void *)f->done), free(f);
}
