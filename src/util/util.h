/* util.h - small helpers shared by every module: error formatting, files,
 * time, sizes, growable buffers. Nothing here knows about models. */
#ifndef DF_UTIL_H
#define DF_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Formats a message into err (if non-NULL) and returns code. */
int df_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A read-only memory mapping of a whole file. */
typedef struct {
    const uint8_t *data;
    size_t size;
    int fd;
    char *path;
    int resident; /* data is an anonymous copy (huge-page advised), not a file mapping */
} df_mapped;
int df_map_file(const char *path, df_mapped *m, char *err, size_t errlen);
/* Reads the whole file into anonymous memory the engine owns (not the page
 * cache, which the kernel may evict): the resident spine. */
int df_load_file(const char *path, df_mapped *m, char *err, size_t errlen);
void df_unmap_file(df_mapped *m);

/* A progress line on stderr for long work: "  WHAT  done / total MB  MB/s  ETA s",
 * redrawn at most every 0.25 s (always on final, which ends the line). on = 0 counts
 * silently; total 0 (unknown) prints no total or ETA. */
typedef struct {
    int on;
    int64_t done, total;
    double t0, last;
    const char *what;
} df_progress;
void df_progress_init(df_progress *p, const char *what, int64_t total, int on);
void df_progress_add(df_progress *p, int64_t add, int final);

/* One extent to read: bytes [off, off + len) of file `file` into dst. Bytes
 * past need_end (an absolute file offset) may lie beyond the end of the file
 * (the 4 KiB-aligned tail of the last tensor). */
typedef struct {
    int file;
    uint64_t off, len, need_end;
    uint8_t *dst;
} df_read_req;
/* Reads every extent (O_DIRECT through io_uring where offsets, lengths and
 * dst are 4 KiB aligned; buffered otherwise), with a progress line on a
 * terminal naming `what`. Returns 0 or DF_EIO with the file and offset. */
struct df_prefault;
int df_read_extents(const char *const *paths, int n_files, const df_read_req *reqs, int n_reqs, const char *what,
                    struct df_prefault *pf, char *err, size_t errlen);

/* Faults memory in (MADV_POPULATE_WRITE, else a write per page). */
void df_touch_range(void *p, size_t n);
/* Faults [p, p + n) in with `threads` background threads (at most
 * DF_PREFAULT_MAX_THREADS), each walking its own contiguous stripe of
 * df_prefault_stripe bytes from its start, 2 MiB at a time: first touches
 * that wait for a hypervisor overlap when they are far apart.
 * df_prefault_wait blocks until [start, end) is faulted in;
 * df_prefault_finish stops, joins and frees. df_read_extents given a
 * prefault handle over its destinations reads the stripes side by side and
 * issues each read once its memory is faulted in. */
#define DF_PREFAULT_MAX_THREADS 16
typedef struct df_prefault df_prefault;
df_prefault *df_prefault_start(void *p, size_t n, int threads);
size_t df_prefault_stripe(const df_prefault *f);
const uint8_t *df_prefault_base(const df_prefault *f);
void df_prefault_wait(df_prefault *f, const void *start, const void *end);
void df_prefault_finish(df_prefault *f);

/* Reads a whole file into a NUL-terminated malloc'd buffer. */
int df_read_file(const char *path, char **out, size_t *len, char *err, size_t errlen);
int df_file_exists(const char *path);
int df_is_dir(const char *path);
/* Joins a and b with '/' into a malloc'd string. */
char *df_path_join(const char *a, const char *b);

double df_now(void); /* monotonic seconds */
int df_n_cpus(void);
int64_t df_mem_available(void); /* bytes, from /proc/meminfo */
int64_t df_peak_rss(void);      /* bytes, VmHWM of /proc/self/status */

/* Parses "123", "4K", "1.5G", "128MiB" into bytes; -1 on error. */
int64_t df_parse_size(const char *s);

/* Parses a comma-separated id list "1,2,3". */
int df_parse_ids(const char *s, int32_t **ids, size_t *n, char *err, size_t errlen);

void *df_xmalloc(size_t n);
void *df_xcalloc(size_t n, size_t sz);
void *df_xrealloc(void *p, size_t n);
char *df_xstrdup(const char *s);

/* 64-byte aligned allocation (free with free()). */
void *df_aligned_alloc(size_t n);

/* A growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} df_buf;
void df_buf_put(df_buf *b, const void *data, size_t n);
void df_buf_puts(df_buf *b, const char *s);
void df_buf_printf(df_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void df_buf_free(df_buf *b);

/* mkdir -p: creates path and its missing parents (0755). 0, or -1 with errno. */
int df_mkdirs(const char *path);

#endif
