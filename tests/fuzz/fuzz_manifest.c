/* fuzz_manifest.c - libFuzzer target for store manifests (issue 18).
 *
 * Once per process, a real store is built (df_store_build --pack) from
 * tests/data/models/qwen3-moe-bf16 (3 layers, 8 experts) into a temporary
 * directory: spine.safetensors and the packs stay, and every input is written
 * as that store's manifest.json. Then, as the loader does: the spine is
 * opened, df_store_attach validates the manifest and adds the experts as
 * virtual tensors, and when it accepts, every virtual tensor must lie inside
 * its file and name a routed expert, and df_store_spine_verify runs over the
 * spine's tensors (which must pass: the spine is untouched). The seed corpus
 * (tests/fuzz/corpus/fuzz_manifest/) holds the manifest of that store and a
 * few edited ones. Run from the repository root (as `make fuzz` does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deltafin.h"
#include "format/safetensors.h"
#include "store/store.h"
#include "util/util.h"

static char dir[64];
static const df_store_layout lay = {3, 8, NULL, {NULL, NULL, NULL}};

static void cleanup(void) {
    char cmd[128];
    if (!dir[0]) return;
    /* only the files this target created */
    const char *names[] = {"manifest.json", "spine.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                           "packs/layer-000.d0.pack", "packs/layer-002.d0.pack", "setup-state.json"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s", dir, names[i]);
        unlink(cmd);
    }
    snprintf(cmd, sizeof cmd, "%s/packs", dir);
    rmdir(cmd);
    rmdir(dir);
}

static int setup_store(void) {
    snprintf(dir, sizeof dir, "/tmp/fuzz_manifestXXXXXX");
    if (!mkdtemp(dir)) return -1;
    atexit(cleanup);
    df_store_opts o = {0};
    o.from = "tests/data/models/qwen3-moe-bf16";
    o.out = dir;
    o.pack = 1;
    o.layout = lay;
    char err[1024];
    if (df_store_build(&o, err, sizeof err)) { fprintf(stderr, "fuzz_manifest: cannot build the store: %s\n", err); return -1; }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready = 0;
    if (!ready) {
        if (setup_store()) abort();
        ready = 1;
    }
    char mp[128];
    snprintf(mp, sizeof mp, "%s/manifest.json", dir);
    FILE *f = fopen(mp, "wb");
    if (!f) abort();
    fwrite(data, 1, size, f);
    fclose(f);
    char err[1024];
    df_st_set *st = df_st_open_dir(dir, err, sizeof err);
    if (!st) abort(); /* the spine is untouched */
    int n_spine = df_st_count(st);
    uint64_t *xxh3 = NULL;
    int int8 = 0;
    df_store_spine *sp = NULL;
    int rc = df_store_attach(dir, st, &lay, &xxh3, &int8, &sp, err, sizeof err);
    if (rc < 0) {
        if (xxh3 || sp || !err[0] || strchr(err, '\n')) abort(); /* one line, nothing leaked out */
    } else if (rc == 1) {
        for (int i = n_spine; i < df_st_count(st); i++) {
            const df_st_tensor *t = df_st_at(st, i);
            int l, e;
            char rest[64];
            if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%63s", &l, &e, rest) != 3 || l < 0 || l >= 3 || e < 0 || e >= 8) abort();
            struct stat sb;
            if (stat(df_st_file_path(st, t->file_index), &sb) || t->file_offset + t->nbytes > (uint64_t)sb.st_size) abort();
        }
        const char **names = malloc(sizeof *names * (size_t)n_spine);
        const uint8_t **dp = malloc(sizeof *dp * (size_t)n_spine);
        uint64_t *sz = malloc(sizeof *sz * (size_t)n_spine);
        for (int i = 0; i < n_spine; i++) {
            const df_st_tensor *t = df_st_at(st, i);
            names[i] = t->name, dp[i] = t->data, sz[i] = t->nbytes;
        }
        /* may fail when the input's spine checksums differ from the real ones: cleanly */
        if (df_store_spine_verify(sp, n_spine, names, dp, sz, 2, err, sizeof err) && (!err[0] || strchr(err, '\n'))) abort();
        free(names), free(dp), free(sz);
    } else {
        abort(); /* manifest.json exists: never "not a store" */
    }
    free(xxh3);
    df_store_spine_free(sp);
    df_st_close(st);
    return 0;
}
