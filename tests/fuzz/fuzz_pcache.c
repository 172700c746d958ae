/* fuzz_pcache.c - libFuzzer target for session files (the server's prompt
 * cache, df_session_load): any bytes must be either loaded (a prefix of the
 * prompt, after which the session computes finite logits) or refused with
 * DF_EFORMAT, and the session usable afterwards either way; never a crash, a leak, undefined
 * behaviour or an allocation the model does not bound.
 *
 * Once per process the tiny tests/data/models/llama-f32-tied is opened, a
 * valid file of its state after 40 tokens is made and written into the
 * corpus directories given on the command line (so the fuzzer starts from a
 * file that passes the fingerprint, which a committed seed could not: the
 * fingerprint changes with the build's version). The first input byte picks
 * a mode: bit 0 set rewrites the section and header checksums after the
 * mutation (as far as the header's sizes lie inside the input), so mutations
 * reach the size, token and finiteness checks behind them. Run from the
 * repository root (as `make fuzz` does). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "deltafin.h"

#define NIDS 48
static df_engine *eng;
static df_session *ses;
static int32_t ids[NIDS];
static int fd = -1;
static int vocab;

static void write_seed(const char *dir, const char *name, const void *b, size_t n) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fwrite(b, 1, n, f);
    fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    df_options o;
    df_options_default(&o);
    o.n_threads = 1;
    char err[512];
    eng = df_engine_open("tests/data/models/llama-f32-tied", &o, err, sizeof err);
    if (!eng) { fprintf(stderr, "fuzz_pcache: %s (run from the repository root)\n", err); abort(); }
    df_model_info mi;
    df_engine_info(eng, &mi);
    vocab = mi.vocab_size;
    for (int i = 0; i < NIDS; i++) ids[i] = (int32_t)((i * 37 + 11) % vocab);
    ses = df_session_new(eng, 64);
    fd = memfd_create("pcache", 0);
    if (!ses || fd < 0 || df_session_sync(ses, ids, 40)) abort();
    uint64_t n = 0;
    if (df_session_save(ses, -1, ids, 40, fd, &n)) abort();
    unsigned char *b = malloc(n + 1);
    if (pread(fd, b + 1, n, 0) != (ssize_t)n) abort();
    for (int i = 1; i < *argc; i++) {
        struct stat sb;
        const char *a = (*argv)[i];
        if (a[0] == '-' || stat(a, &sb) || !S_ISDIR(sb.st_mode)) continue;
        b[0] = 0, write_seed(a, "seed-valid", b, n + 1);
        b[0] = 1, write_seed(a, "seed-valid-fixup", b, n + 1);
    }
    free(b);
    return 0;
}

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* Rewrites the checksums of the sections the header declares, where they lie inside f. */
static void fixup(uint8_t *f, size_t n) {
    if (n < 104) return;
    uint64_t pos = rd64(f + 24), cf = rd64(f + 40), ff = rd64(f + 48);
    uint32_t V = rd32(f + 36), hl = rd32(f + 56);
    if (pos > 1u << 20 || cf > 1u << 20 || ff > 1u << 20 || V > 1u << 20) return;
    uint64_t len[4] = {pos * 4, hl ? (uint64_t)V * 4 : 0, ff * 4, pos * cf * 4}, off = 104;
    for (int i = 0; i < 4; i++) {
        if (off + len[i] > n) break;
        uint64_t h = XXH3_64bits(f + off, len[i]);
        memcpy(f + 64 + 8 * i, &h, 8);
        off += len[i];
    }
    uint64_t h = XXH3_64bits(f, 96);
    memcpy(f + 96, &h, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t n = size - 1;
    uint8_t *f = malloc(n ? n : 1);
    memcpy(f, data + 1, n);
    if (data[0] & 1) fixup(f, n);
    if (ftruncate(fd, 0) || (n && pwrite(fd, f, n, 0) != (ssize_t)n)) abort();
    free(f);
    size_t pos = 99;
    int rc = df_session_load(ses, fd, ids, NIDS, &pos);
    if (rc == 0) {
        if (pos < 1 || pos > NIDS || df_session_len(ses) != pos) __builtin_trap();
    } else {
        if (rc != DF_EFORMAT || pos != 0 || !df_engine_error(eng)[0]) __builtin_trap();
    }
    /* the session is usable either way: it computes the rest of the prompt and
     * samples an id in range (a loaded file with valid checksums and crafted
     * finite values may give non-finite logits: the sampler takes them) */
    if (df_session_sync(ses, ids, NIDS) || !df_session_logits(ses)) __builtin_trap();
    df_sampling sp;
    df_sampling_default(&sp);
    int32_t id = -1;
    sp.temperature = 0;
    if (df_session_sample(ses, &sp, &id) || id < 0 || id >= vocab) __builtin_trap();
    sp.temperature = 1, sp.top_p = 0.9f;
    if (df_session_sample(ses, &sp, &id) || id < 0 || id >= vocab) __builtin_trap();
    df_session_sync(ses, ids, 0);
    return 0;
}
