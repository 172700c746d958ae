/* diskbench.c - the disk floor: read bandwidth of a file with O_DIRECT
 * reads of a given size at a given queue depth through io_uring, the way the
 * expert cache reads. Used by `deltafin bench floors --disk FILE`. */
#include "store/diskbench.h"
#include "deltafin.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int df_disk_read_bw(const char *path, int qd, size_t block, int64_t max_bytes, double *gbs, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) return df_err(err, errlen, DF_EIO, "%s: cannot open with O_DIRECT: %s", path, strerror(errno));
    struct stat st;
    fstat(fd, &st);
    int64_t size = st.st_size / (int64_t)block * (int64_t)block;
    if (max_bytes > 0 && size > max_bytes) size = max_bytes;
    if (size < (int64_t)block) { close(fd); return df_err(err, errlen, DF_EINPUT, "%s: smaller than one %zu-byte read", path, block); }
    struct io_uring ring;
    if (io_uring_queue_init((unsigned)qd, &ring, 0)) { close(fd); return df_err(err, errlen, DF_EIO, "io_uring unavailable"); }
    uint8_t *buf = mmap(NULL, block * (size_t)qd, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int64_t next = 0, done = 0;
    int inflight = 0, rc = 0;
    double t0 = df_now();
    while (done < size && !rc) {
        while (inflight < qd && next < size) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            int slot = (int)((next / (int64_t)block) % qd);
            io_uring_prep_read(sqe, fd, buf + (size_t)slot * block, (unsigned)block, (uint64_t)next);
            next += (int64_t)block;
            inflight++;
        }
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe)) { rc = df_err(err, errlen, DF_EIO, "io_uring wait failed"); break; }
        if (cqe->res < 0) rc = df_err(err, errlen, DF_EIO, "%s: read failed: %s", path, strerror(-cqe->res));
        else done += cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
    }
    double dt = df_now() - t0;
    while (inflight-- > 0) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe)) break;
        io_uring_cqe_seen(&ring, cqe);
    }
    io_uring_queue_exit(&ring);
    munmap(buf, block * (size_t)qd);
    close(fd);
    if (!rc) *gbs = done / dt / 1e9;
    return rc;
}
