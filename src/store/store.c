/* store.c - opening a store (see store.h): the manifest parsed and
 * validated as a whole against the source set, the spine header checked,
 * then each spine tensor verified after it was read (df_store_spine_verify).
 * The writer (deltafin setup) is store_setup.c.
 *
 * Invariants: the manifest is validated as a whole (format version, source
 * identity, layout, every expert's location and checksum) before the caller
 * gets anything; each failure is one message naming the file and the field
 * with the expected and actual value.
 */
#include "store/store_int.h"
#include "deltafin.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

int df_is_store(const char *dir) {
    char *p = df_path_join(dir, "manifest.json");
    int r = df_file_exists(p);
    free(p);
    return r;
}

/* ---- opening a store: the manifest, validated as a whole ------------------ */

struct df_store_spine {
    char *path;       /* STORE/spine.safetensors, for messages */
    json_t *tensors;  /* name -> xxh3 hex (validated) */
};

void df_store_spine_free(df_store_spine *s) {
    if (!s) return;
    free(s->path);
    json_decref(s->tensors);
    free(s);
}

static const char *jtype(const json_t *v) {
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* An integer in [lo, hi], else -1 with a message naming the field. */
static int get_int(const json_t *v, long long lo, long long hi, long long *out, const char *mp, const char *field, char *err, size_t errlen) {
    if (!json_is_integer(v)) return df_err(err, errlen, DF_EFORMAT, "%s: %s: expected an integer in [%lld, %lld], got %s", mp, field, lo, hi, jtype(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return df_err(err, errlen, DF_EFORMAT, "%s: %s: expected an integer in [%lld, %lld], got %lld", mp, field, lo, hi, x);
    *out = x;
    return 0;
}

/* The spine's size and header checksum (cheap: the header only). */
static int check_spine_header(const char *mp, const char *path, uint64_t want_size, uint64_t want_hx, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err(err, errlen, DF_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    int rc = 0;
    uint8_t len8[8];
    if (fstat(fd, &sb) || (uint64_t)sb.st_size != want_size) {
        rc = df_err(err, errlen, DF_EFORMAT, "%s: %lld bytes, %s records spine.size %llu (the spine changed since setup)", path,
                    (long long)sb.st_size, mp, (unsigned long long)want_size);
    } else if (pread(fd, len8, 8, 0) != 8) {
        rc = df_err(err, errlen, DF_EIO, "%s: cannot read the header", path);
    } else {
        uint64_t hl = 0;
        for (int i = 0; i < 8; i++) hl |= (uint64_t)len8[i] << (8 * i);
        if (hl > want_size - 8 || hl > (100u << 20)) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: header length %llu does not fit the %llu-byte file", path, (unsigned long long)hl, (unsigned long long)want_size);
        } else {
            uint8_t *h = df_xmalloc((size_t)hl + 8);
            if (pread(fd, h, (size_t)hl + 8, 0) != (ssize_t)(hl + 8)) rc = df_err(err, errlen, DF_EIO, "%s: cannot read the header", path);
            uint64_t got = rc ? 0 : XXH3_64bits(h, (size_t)hl + 8);
            if (!rc && got != want_hx)
                rc = df_err(err, errlen, DF_EFORMAT, "%s: header checksum mismatch: xxh3 %016llx, %s records spine.header_xxh3 %016llx (the spine is corrupt; run deltafin setup again)",
                            path, (unsigned long long)got, mp, (unsigned long long)want_hx);
            free(h);
        }
    }
    close(fd);
    return rc;
}

int df_store_attach(const char *dir, df_st_set *st, const df_store_layout *lay, uint64_t **xxh3, int *spine_int8,
                    df_store_spine **spine_out, char *err, size_t errlen) {
    *xxh3 = NULL;
    *spine_int8 = 0;
    *spine_out = NULL;
    char *mp = df_path_join(dir, "manifest.json");
    if (!df_file_exists(mp)) { free(mp); return 0; }
    json_error_t je;
    json_t *m = json_load_file(mp, 0, &je);
    int rc = 0;
    uint64_t *fsize = NULL;
    uint8_t *seen = NULL;
    df_store_spine *spine = NULL;
    const int L = lay->n_layers, E = lay->n_experts;
    const char *fmt = lay->expert_fmt;
    char field[160];
#define BAD(...) do { rc = df_err(err, errlen, DF_EFORMAT, __VA_ARGS__); goto out; } while (0)
    if (!m) { rc = df_err(err, errlen, DF_EFORMAT, "%s: not valid JSON: %s (line %d)", mp, je.text, je.line); goto out; }
    if (!json_is_object(m)) BAD("%s: expected a JSON object, got %s", mp, jtype(m));
    if (L <= 0 || E <= 0 || L > 4096 || E > 65536)
        BAD("%s: this model has %d layers x %d routed experts; a store needs a mixture-of-experts model", mp, L, E);
    json_t *fmtj = json_object_get(m, "format"), *ver = json_object_get(m, "format_version");
    if (!json_is_string(fmtj) || strcmp(json_string_value(fmtj), "deltafin-store"))
        BAD("%s: format: expected \"deltafin-store\", got %s%s%s", mp, json_is_string(fmtj) ? "\"" : jtype(fmtj), json_is_string(fmtj) ? json_string_value(fmtj) : "",
            json_is_string(fmtj) ? "\"" : "");
    if (json_is_integer(ver) && json_integer_value(ver) == 1) {
        rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: format_version 1 (an older deltafin) has no spine checksums; this build reads version %d: "
                    "run deltafin setup --from SOURCE --out %s again to rebuild the store", mp, FORMAT_VERSION, dir);
        goto out;
    }
    if (!json_is_integer(ver) || json_integer_value(ver) != FORMAT_VERSION) {
        rc = json_is_integer(ver) ? df_err(err, errlen, DF_EUNSUPPORTED, "%s: format_version: expected %d, got %lld (a newer deltafin?)", mp, FORMAT_VERSION, (long long)json_integer_value(ver))
                                  : df_err(err, errlen, DF_EFORMAT, "%s: format_version: expected %d, got %s", mp, FORMAT_VERSION, jtype(ver));
        goto out;
    }
    if (!json_is_true(json_object_get(m, "complete"))) { rc = df_err(err, errlen, DF_EINPUT, "%s: the store is incomplete; run deltafin setup again to finish it", mp); goto out; }

    /* spine: file, mode, size, header and per-tensor checksums */
    json_t *sp = json_object_get(m, "spine");
    if (!json_is_object(sp)) BAD("%s: spine: expected an object, got %s", mp, jtype(sp));
    json_t *sfile = json_object_get(sp, "file");
    if (!json_is_string(sfile) || strcmp(json_string_value(sfile), "spine.safetensors"))
        BAD("%s: spine.file: expected \"spine.safetensors\", got %s", mp, json_is_string(sfile) ? json_string_value(sfile) : jtype(sfile));
    json_t *smode = json_object_get(sp, "mode");
    if (!json_is_string(smode) || (strcmp(json_string_value(smode), "exact") && strcmp(json_string_value(smode), "int8"))) {
        rc = df_err(err, errlen, json_is_string(smode) ? DF_EUNSUPPORTED : DF_EFORMAT, "%s: spine.mode: expected \"exact\" or \"int8\", got %s", mp,
                    json_is_string(smode) ? json_string_value(smode) : jtype(smode));
        goto out;
    }
    *spine_int8 = !strcmp(json_string_value(smode), "int8");
    long long ssize;
    uint64_t shx;
    if ((rc = get_int(json_object_get(sp, "size"), 8, LLONG_MAX, &ssize, mp, "spine.size", err, errlen))) goto out;
    if (parse_hex16(json_string_value(json_object_get(sp, "header_xxh3")), &shx)) BAD("%s: spine.header_xxh3: expected 16 hex digits", mp);
    json_t *stens = json_object_get(sp, "tensors");
    if (!json_is_object(stens)) BAD("%s: spine.tensors: expected an object (tensor name -> xxh3), got %s", mp, jtype(stens));
    const char *tk;
    json_t *tv;
    json_object_foreach(stens, tk, tv) {
        uint64_t h;
        if (parse_hex16(json_string_value(tv), &h)) BAD("%s: spine.tensors[\"%.200s\"]: expected 16 hex digits", mp, tk);
    }
    spine = df_xcalloc(1, sizeof *spine);
    spine->path = df_path_join(dir, "spine.safetensors");
    spine->tensors = json_incref(stens);
    if ((rc = check_spine_header(mp, spine->path, (uint64_t)ssize, shx, err, errlen))) goto out;

    /* files: every one must exist; its size bounds the extents in it */
    json_t *files = json_object_get(m, "files"), *ex = json_object_get(m, "experts");
    if (!json_is_array(files)) BAD("%s: files: expected an array, got %s", mp, jtype(files));
    if (!json_is_array(ex)) BAD("%s: experts: expected an array, got %s", mp, jtype(ex));
    size_t nfiles = json_array_size(files);
    fsize = df_xcalloc(nfiles ? nfiles : 1, sizeof *fsize);
    for (size_t f = 0; f < nfiles; f++) {
        const char *fn = json_string_value(json_array_get(files, f));
        if (!fn || !*fn) BAD("%s: files[%zu]: expected a non-empty path, got %s", mp, f, jtype(json_array_get(files, f)));
        char *path = fn[0] == '/' ? df_xstrdup(fn) : df_path_join(dir, fn);
        struct stat sb;
        int bad = stat(path, &sb) != 0;
        if (bad) rc = df_err(err, errlen, DF_EIO, "%s: files[%zu]: %s: %s", mp, f, path, strerror(errno));
        free(path);
        if (bad) goto out;
        fsize[f] = (uint64_t)sb.st_size;
    }
    if (json_array_size(ex) > (size_t)L * (size_t)E)
        BAD("%s: experts: %zu entries, but %d layers x %d experts allow at most %lld", mp, json_array_size(ex), L, E, (long long)L * E);

    *xxh3 = df_xcalloc((size_t)L * (size_t)E, sizeof(uint64_t));
    seen = df_xcalloc((size_t)L * (size_t)E, 1);
    size_t i;
    json_t *x;
    json_array_foreach(ex, i, x) {
        long long l, e;
        if (!json_is_object(x)) BAD("%s: experts[%zu]: expected an object, got %s", mp, i, jtype(x));
        snprintf(field, sizeof field, "experts[%zu].layer", i);
        if ((rc = get_int(json_object_get(x, "layer"), 0, L - 1, &l, mp, field, err, errlen))) goto out;
        snprintf(field, sizeof field, "experts[%zu].expert", i);
        if ((rc = get_int(json_object_get(x, "expert"), 0, E - 1, &e, mp, field, err, errlen))) goto out;
        size_t slot = (size_t)l * (size_t)E + (size_t)e;
        if (seen[slot]) BAD("%s: experts[%zu]: layer %lld expert %lld appears twice", mp, i, l, e);
        seen[slot] = 1;
        if (parse_hex16(json_string_value(json_object_get(x, "xxh3")), &(*xxh3)[slot]))
            BAD("%s: experts[%zu].xxh3: expected 16 hex digits, got %s", mp, i, json_is_string(json_object_get(x, "xxh3")) ? json_string_value(json_object_get(x, "xxh3")) : jtype(json_object_get(x, "xxh3")));
        json_t *parts = json_object_get(x, "parts");
        if (!json_is_array(parts) || json_array_size(parts) < 1 || json_array_size(parts) > 6)
            BAD("%s: experts[%zu].parts: expected an array of 1 to 6 parts, got %s%s", mp, i, jtype(parts), json_is_array(parts) ? (json_array_size(parts) ? " of more than 6" : " (empty)") : "");
        char want[256];
        snprintf(want, sizeof want, fmt ? fmt : DF_STORE_EXPERT_FMT, (int)l, (int)e);
        size_t k;
        json_t *p;
        int last_rank = -1;
        json_array_foreach(parts, k, p) {
            const char *tn = json_string_value(json_object_get(p, "tensor")), *dt = json_string_value(json_object_get(p, "dtype"));
            int pl, pe, rank;
            if (!tn) BAD("%s: experts[%zu].parts[%zu].tensor: expected a string, got %s", mp, i, k, jtype(json_object_get(p, "tensor")));
            if (!store_expert_part(lay, tn, &pl, &pe, &rank) || pl != l || pe != e)
                BAD("%s: experts[%zu].parts[%zu].tensor: expected a routed-expert tensor %s.{%s,%s,%s}.{weight,...} (layer %lld expert %lld), got \"%.200s\"",
                    mp, i, k, want, lay->proj[0] ? lay->proj[0] : "gate_proj", lay->proj[1] ? lay->proj[1] : "up_proj", lay->proj[2] ? lay->proj[2] : "down_proj", l, e, tn);
            if (rank <= last_rank) BAD("%s: experts[%zu].parts[%zu].tensor: \"%.200s\" is out of order or repeated (gate, up, down; weight before scale)", mp, i, k, tn);
            last_rank = rank;
            int dtype = dt ? df_st_dtype_from_name(dt) : -1;
            if (dtype < 0) BAD("%s: experts[%zu].parts[%zu].dtype: expected a safetensors dtype, got %s", mp, i, k, dt ? dt : jtype(json_object_get(p, "dtype")));
            json_t *sh = json_object_get(p, "shape");
            if (!json_is_array(sh) || json_array_size(sh) > 8) BAD("%s: experts[%zu].parts[%zu].shape: expected an array of at most 8 sizes", mp, i, k);
            int64_t shape[8];
            uint64_t nel = 1;
            for (size_t d = 0; d < json_array_size(sh); d++) {
                long long v;
                snprintf(field, sizeof field, "experts[%zu].parts[%zu].shape[%zu]", i, k, d);
                if ((rc = get_int(json_array_get(sh, d), 0, 1LL << 40, &v, mp, field, err, errlen))) goto out;
                shape[d] = v;
                if (v && nel > (UINT64_MAX >> 8) / (uint64_t)v) BAD("%s: experts[%zu].parts[%zu].shape: too many elements", mp, i, k);
                nel *= (uint64_t)v;
            }
            long long fi, off, len;
            snprintf(field, sizeof field, "experts[%zu].parts[%zu].file", i, k);
            if ((rc = get_int(json_object_get(p, "file"), 0, (long long)nfiles - 1, &fi, mp, field, err, errlen))) goto out;
            snprintf(field, sizeof field, "experts[%zu].parts[%zu].offset", i, k);
            if ((rc = get_int(json_object_get(p, "offset"), 0, LLONG_MAX, &off, mp, field, err, errlen))) goto out;
            snprintf(field, sizeof field, "experts[%zu].parts[%zu].length", i, k);
            if ((rc = get_int(json_object_get(p, "length"), 0, LLONG_MAX, &len, mp, field, err, errlen))) goto out;
            uint64_t need = nel * (uint64_t)df_st_dtype_size((df_st_dtype)dtype);
            if ((uint64_t)len != need)
                BAD("%s: experts[%zu].parts[%zu].length: shape and dtype %s need %llu bytes, got %lld", mp, i, k, dt, (unsigned long long)need, len);
            if ((uint64_t)off > fsize[fi] || (uint64_t)len > fsize[fi] - (uint64_t)off)
                BAD("%s: experts[%zu].parts[%zu]: bytes [%lld, %lld) lie outside files[%lld] (%llu bytes)", mp, i, k, off, off + len, fi, (unsigned long long)fsize[fi]);
            const char *fn = json_string_value(json_array_get(files, (size_t)fi));
            char *path = fn[0] == '/' ? df_xstrdup(fn) : df_path_join(dir, fn);
            rc = df_st_add_virtual(st, tn, (df_st_dtype)dtype, (int)json_array_size(sh), shape, path, (uint64_t)off, (uint64_t)len, err, errlen);
            free(path);
            if (rc) goto out;
        }
    }
    /* a layer's experts are stored all together (setup writes every routed expert of a MoE layer) */
    for (int l = 0; l < L; l++) {
        int have = 0, missing = -1;
        for (int e = 0; e < E; e++) {
            if (seen[(size_t)l * E + e]) have++;
            else if (missing < 0) missing = e;
        }
        if (have && have < E) BAD("%s: experts: layer %d has %d of its %d experts (expert %d is missing)", mp, l, have, E, missing);
    }
#undef BAD
    rc = 1;
out:
    if (rc < 0) { free(*xxh3); *xxh3 = NULL; df_store_spine_free(spine); spine = NULL; }
    *spine_out = spine;
    free(fsize);
    free(seen);
    json_decref(m);
    free(mp);
    return rc;
}

/* ---- spine verification ---------------------------------------------------- */

typedef struct {
    int n;
    const uint8_t *const *data;
    const uint64_t *sizes;
    uint64_t *got;
    atomic_int next;
} hash_job;

static void *hash_main(void *arg) {
    hash_job *j = arg;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) break;
        j->got[i] = XXH3_64bits(j->data[i], (size_t)j->sizes[i]);
    }
    return NULL;
}

int df_store_spine_verify(const df_store_spine *s, int n, const char *const *names, const uint8_t *const *data, const uint64_t *sizes, int threads,
                          char *err, size_t errlen) {
    if (!s) return 0;
    if ((size_t)n != json_object_size(s->tensors))
        return df_err(err, errlen, DF_EFORMAT, "%s: %d tensors, the manifest records checksums of %zu (the spine changed since setup)", s->path, n,
                      json_object_size(s->tensors));
    hash_job j = {n, data, sizes, df_xcalloc((size_t)(n ? n : 1), sizeof(uint64_t)), 0};
    if (threads < 1) threads = 1;
    if (threads > 16) threads = 16;
    if (threads > n) threads = n > 0 ? n : 1;
    pthread_t th[16];
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (!pthread_create(&th[started], NULL, hash_main, &j)) started++;
    hash_main(&j);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        uint64_t want;
        if (parse_hex16(json_string_value(json_object_get(s->tensors, names[i])), &want))
            rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s' has no checksum in manifest.json (the spine changed since setup)", s->path, names[i]);
        else if (j.got[i] != want)
            rc = df_err(err, errlen, DF_EFORMAT, "%s: checksum mismatch for spine tensor '%s' (xxh3 %016llx, manifest.json records %016llx): the spine is corrupt; run deltafin setup again",
                        s->path, names[i], (unsigned long long)j.got[i], (unsigned long long)want);
    }
    free(j.got);
    return rc;
}
