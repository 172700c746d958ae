/* util.c - see util.h. */
#include "util/util.h"
#include "deltafin.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int df_err(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void *df_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "deltafin: out of memory (%zu bytes)\n", n); abort(); }
    return p;
}
void *df_xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) { fprintf(stderr, "deltafin: out of memory (%zu x %zu bytes)\n", n, sz); abort(); }
    return p;
}
void *df_xrealloc(void *q, size_t n) {
    void *p = realloc(q, n ? n : 1);
    if (!p) { fprintf(stderr, "deltafin: out of memory (%zu bytes)\n", n); abort(); }
    return p;
}
char *df_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = df_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
void *df_aligned_alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? (n + 63) / 64 * 64 : 64) != 0) {
        fprintf(stderr, "deltafin: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

int df_map_file(const char *path, df_mapped *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err(err, errlen, DF_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return df_err(err, errlen, DF_EIO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return df_err(err, errlen, DF_EINPUT, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return df_err(err, errlen, DF_EIO, "%s: mmap failed: %s", path, strerror(errno));
        }
        m->data = p;
    }
    m->fd = fd;
    m->path = df_xstrdup(path);
    return 0;
}

int df_load_file(const char *path, df_mapped *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err(err, errlen, DF_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return df_err(err, errlen, DF_EINPUT, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size, cap = (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    void *p = NULL;
    if (size) {
        p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return df_err(err, errlen, DF_ENOMEM, "%s: cannot allocate %zu bytes to hold it in memory", path, size);
        }
        madvise(p, cap, MADV_HUGEPAGE);
        size_t done = 0;
        while (done < size) {
            ssize_t r = pread(fd, (uint8_t *)p + done, size - done > (64u << 20) ? (64u << 20) : size - done, (off_t)done);
            if (r <= 0) {
                munmap(p, cap);
                close(fd);
                return df_err(err, errlen, DF_EIO, "%s: read failed at byte %zu: %s", path, done, r < 0 ? strerror(errno) : "unexpected end of file");
            }
            done += (size_t)r;
        }
    }
    m->data = p;
    m->size = size;
    m->fd = fd;
    m->path = df_xstrdup(path);
    m->resident = 1;
    return 0;
}

void df_unmap_file(df_mapped *m) {
    if (m->data && m->resident) munmap((void *)m->data, (m->size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1));
    else if (m->data) munmap((void *)m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    free(m->path);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

int df_read_file(const char *path, char **out, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return df_err(err, errlen, DF_EIO, "%s: cannot open: %s", path, strerror(errno));
    df_buf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) df_buf_put(&b, tmp, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        df_buf_free(&b);
        return df_err(err, errlen, DF_EIO, "%s: read error", path);
    }
    df_buf_put(&b, "", 1);
    *out = b.p;
    if (len) *len = b.len - 1;
    return 0;
}

int df_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
int df_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
char *df_path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = df_xmalloc(la + lb + 2);
    memcpy(p, a, la);
    size_t k = la;
    if (la && a[la - 1] != '/') p[k++] = '/';
    memcpy(p + k, b, lb + 1);
    return p;
}

double df_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
int df_n_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
int64_t df_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    int64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

int64_t df_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    int64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

int64_t df_parse_size(const char *s) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'B': end++; break;
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024; end++; break;
    case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: return -1;
    }
    if (mul > 1) {
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
    }
    if (*end) return -1;
    return (int64_t)(v * mul);
}

int df_parse_ids(const char *s, int32_t **ids, size_t *n, char *err, size_t errlen) {
    size_t cap = 16, k = 0;
    int32_t *v = df_xmalloc(cap * sizeof *v);
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return df_err(err, errlen, DF_EINPUT, "--ids: expected a comma-separated list of non-negative integers, got \"%s\"", s);
        }
        if (k == cap) v = df_xrealloc(v, (cap *= 2) * sizeof *v);
        v[k++] = (int32_t)x;
        p = end;
        if (*p && *p != ',' && *p != ' ') {
            free(v);
            return df_err(err, errlen, DF_EINPUT, "--ids: unexpected character '%c' in \"%s\"", *p, s);
        }
    }
    *ids = v;
    *n = k;
    return 0;
}

void df_buf_put(df_buf *b, const void *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1) c *= 2;
        b->p = df_xrealloc(b->p, c);
        b->cap = c;
    }
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
}
void df_buf_puts(df_buf *b, const char *s) { df_buf_put(b, s, strlen(s)); }
void df_buf_printf(df_buf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { df_buf_put(b, tmp, (size_t)n); return; }
    char *big = df_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    df_buf_put(b, big, (size_t)n);
    free(big);
}
void df_buf_free(df_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void df_progress_init(df_progress *p, const char *what, int64_t total, int on) {
    *p = (df_progress){on, 0, total, df_now(), 0, what ? what : ""};
}

void df_progress_add(df_progress *p, int64_t add, int final) {
    p->done += add;
    if (!p->on) return;
    double t = df_now();
    if (!final && t - p->last < 0.25) return;
    p->last = t;
    double el = t - p->t0, rate = el > 0 ? p->done / el : 0;
    if (p->total > 0)
        fprintf(stderr, "\r  %-8s %8.1f / %.1f MB  %7.1f MB/s  ETA %5.0f s ", p->what, p->done / 1e6, p->total / 1e6, rate / 1e6,
                rate > 0 ? (double)(p->total - p->done) / rate : 0.0);
    else
        fprintf(stderr, "\r  %-8s %8.1f MB  %7.1f MB/s ", p->what, p->done / 1e6, rate / 1e6);
    if (final) fputc('\n', stderr);
}

int df_mkdirs(const char *path) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) { errno = ENAMETOOLONG; return -1; }
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; if (mkdir(tmp, 0755) && errno != EEXIST) return -1; *p = '/'; }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}
