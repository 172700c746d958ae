/* fuzz_hub_revision.c - libFuzzer target for the Hugging Face revision API's
 * answer (issue 16): the bytes a hub (or anything answering at HF_ENDPOINT)
 * sends for GET /api/models/REPO/revision/REV?blobs=true. When the parser
 * accepts, every file it hands on must be what the downloader relies on: a
 * relative path without "..", a size >= 0, a 40-hex blob id and, for LFS
 * files, a 64-hex sha256; the commit is 40 hex digits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"

/* a relative path whose components are neither empty, "." nor ".." */
static int relative(const char *p) {
    if (!p || !*p || *p == '/') return 0;
    for (const char *s = p; s;) {
        const char *e = strchr(s, '/');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l == 0 || (l == 1 && s[0] == '.') || (l == 2 && s[0] == '.' && s[1] == '.')) return 0;
        s = e ? e + 1 : NULL;
    }
    return 1;
}

static int hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    df_hub_repo r;
    memset(&r, 0, sizeof r);
    char err[512];
    if (df_hub_parse_revision((const char *)data, size, "fuzz", &r, err, sizeof err) == 0) {
        if (!hex(r.commit, 40)) abort();
        for (int i = 0; i < r.n_files; i++) {
            const df_hub_file *f = &r.files[i];
            if (!relative(f->path)) abort();
            if (f->size < 0 || !hex(f->blob_id, 40)) abort();
            if (f->sha256[0] && !hex(f->sha256, 64)) abort();
        }
        df_hub_repo_free(&r);
    }
    return 0;
}
