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

typedef struct {
    const char *what;
    uint64_t total, done;
    double t0, last;
    int show;
} progress;

static void prog_tick(progress *p, int final) {
    if (!p->show) return;
    double now = df_now();
    if (!final && now - p->last < 0.5) return;
    p->last = now;
    double rate = p->done / (now - p->t0 > 1e-6 ? now - p->t0 : 1e-6);
    fprintf(stderr, "\r  loading %s %8.1f / %.1f MB  %7.1f MB/s  ETA %4.0f s ", p->what, p->done / 1e6, p->total / 1e6,
            rate / 1e6, rate > 0 ? (double)(p->total - p->done) / rate : 0.0);
    if (final) fputc('\n', stderr);
}

/* Buffered reads of whatever could not be read with O_DIRECT. */
static int read_buffered(const char *path, const df_read_req *r, uint64_t pos, uint64_t len, progress *pg, char *err,
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
        pos += (uint64_t)n, len -= (uint64_t)n, pg->done += (uint64_t)n;
        prog_tick(pg, 0);
    }
    close(fd);
    return 0;
}

int df_read_extents(const char *const *paths, int n_files, const df_read_req *reqs, int n_reqs, const char *what,
                    char *err, size_t errlen) {
    progress pg = {what ? what : "", 0, 0, df_now(), 0, 0};
    int64_t n_chunks = 0;
    for (int i = 0; i < n_reqs; i++) {
        if (reqs[i].file < 0 || reqs[i].file >= n_files)
            return df_err(err, errlen, DF_EINTERNAL, "read_extents: bad file index %d", reqs[i].file);
        pg.total += reqs[i].len;
        n_chunks += (int64_t)((reqs[i].len + CHUNK - 1) / CHUNK);
    }
    pg.show = isatty(2) && pg.total >= (256u << 20);
    int *fd = df_xmalloc((size_t)(n_files ? n_files : 1) * sizeof(int));
    for (int i = 0; i < n_files; i++) fd[i] = open(paths[i], O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct io_uring ring;
    int have_ring = !getenv("DELTAFIN_NO_IO_URING") && io_uring_queue_init(QD, &ring, 0) == 0;
    chunk *ch = df_xmalloc((size_t)(n_chunks ? n_chunks : 1) * sizeof(chunk));
    int64_t k = 0;
    for (int i = 0; i < n_reqs; i++)
        for (uint64_t p = 0; p < reqs[i].len; p += CHUNK)
            ch[k++] = (chunk){i, p, (uint32_t)(reqs[i].len - p > CHUNK ? CHUNK : reqs[i].len - p)};
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
                pg.done += c->len;
            } else if (res >= 0) {
                /* short: end of file inside the aligned tail, or a partial read to finish buffered */
                if (r->off + c->pos + (uint64_t)res >= r->need_end) pg.done += c->len;
                else redo[id] = 1;
            } else if (res == -EINVAL || res == -EOPNOTSUPP) {
                redo[id] = 1;
            } else {
                rc = df_err(err, errlen, DF_EIO, "%s: read of %u bytes at %llu failed: %s", paths[r->file], c->len,
                            (unsigned long long)(r->off + c->pos), strerror(-res));
            }
            prog_tick(&pg, 0);
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
    if (!rc) prog_tick(&pg, 1);
    else if (pg.show) fputc('\n', stderr);
    for (int i = 0; i < n_files; i++)
        if (fd[i] >= 0) close(fd[i]);
    free(fd), free(ch), free(redo);
    return rc;
}
