/* df_read_extents and df_prefault: extents read into owned memory (O_DIRECT
 * where aligned, buffered otherwise), with and without a striped prefault,
 * from a file on disk and from tmpfs (which refuses O_DIRECT); the aligned
 * tail past the end of a file; errors name the file. */
#include "deltafin.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

static uint8_t byte_at(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static char *make_file(const char *dir, const char *name, uint64_t size) {
    char *path = df_path_join(dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) { free(path); return NULL; }
    for (uint64_t i = 0; i < size; i++) fputc(byte_at(i), f);
    fclose(f);
    return path;
}

/* Reads [off, off+len) of a `size`-byte file at several alignments and checks the bytes. */
static void check_file(const char *path, uint64_t size, int prefault) {
    const char *paths[1] = {path};
    const size_t cap = 64u << 20;
    uint8_t *mem = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(mem != MAP_FAILED, "mmap");
    if (mem == MAP_FAILED) return;
    /* aligned runs (O_DIRECT legal) incl. the 4 KiB-aligned tail past EOF, then unaligned ones */
    uint64_t tail_off = (size - 5000) & ~(uint64_t)4095;
    df_read_req rq[] = {
        {0, 0, 8u << 20, 8u << 20, mem},                                     /* two 4 MiB chunks */
        {0, 4096, 3 * 4096, 4 * 4096, mem + (9u << 20)},                     /* small */
        {0, tail_off, ((size - tail_off) + 4095) & ~(uint64_t)4095, size, mem + (10u << 20)}, /* past EOF */
        {0, 12345, 777777, 12345 + 777777, mem + (12u << 20) + 3},           /* unaligned: buffered */
    };
    const int n = (int)(sizeof rq / sizeof *rq);
    char err[256] = "";
    df_prefault *pf = prefault ? df_prefault_start(mem, 14u << 20, 4) : NULL;
    int rc = df_read_extents(paths, 1, rq, n, "test", pf, err, sizeof err);
    df_prefault_finish(pf);
    CHECK(rc == 0, "%s: rc %d: %s", path, rc, err);
    for (int r = 0; r < n && rc == 0; r++) {
        uint64_t need = rq[r].need_end - rq[r].off, bad = 0;
        for (uint64_t i = 0; i < need; i++)
            if (rq[r].dst[i] != byte_at(rq[r].off + i)) { bad = i + 1; break; }
        CHECK(bad == 0, "%s prefault=%d: request %d wrong at byte %llu", path, prefault, r, (unsigned long long)(bad - 1));
    }
    munmap(mem, cap);
}

int main(void) {
    char dir[] = "/tmp/df_bulkread_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    const uint64_t size = (13u << 20) + 1234;
    char *disk = make_file(dir, "w.bin", size);
    CHECK(disk != NULL, "cannot write the test file");
    if (disk) {
        check_file(disk, size, 0);
        check_file(disk, size, 1);
    }
    /* tmpfs refuses O_DIRECT: everything falls back to buffered reads */
    char shm[] = "/dev/shm/df_bulkread_XXXXXX";
    char *shm_file = NULL;
    if (mkdtemp(shm)) {
        shm_file = make_file(shm, "w.bin", size);
        if (shm_file) check_file(shm_file, size, 1);
    }
    /* a missing file: DF_EIO naming it */
    {
        const char *paths[1] = {"/nonexistent/df_missing.bin"};
        uint8_t *buf = aligned_alloc(4096, 4096);
        df_read_req rq = {0, 0, 4096, 4096, buf};
        char err[256] = "";
        int rc = df_read_extents(paths, 1, &rq, 1, "test", NULL, err, sizeof err);
        CHECK(rc == DF_EIO && strstr(err, "df_missing.bin"), "missing file: rc %d, '%s'", rc, err);
        free(buf);
    }
    /* a request past the end of the file that the caller needs: an error, not silence */
    if (disk) {
        const char *paths[1] = {disk};
        uint8_t *buf = aligned_alloc(4096, 8192);
        df_read_req rq = {0, size - 100, 8192, size + 4000, buf};
        char err[256] = "";
        int rc = df_read_extents(paths, 1, &rq, 1, "test", NULL, err, sizeof err);
        CHECK(rc == DF_EIO && strstr(err, "end of file"), "short file: rc %d, '%s'", rc, err);
        free(buf);
    }
    if (disk) unlink(disk);
    if (shm_file) unlink(shm_file);
    rmdir(dir);
    rmdir(shm);
    free(disk), free(shm_file);
    printf("test_util_bulkread: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
