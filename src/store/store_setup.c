/* store_setup.c - the setup writer (df_store_build, see store.h): spine,
 * expert packs or direct mode, manifest, read-back verification.
 *
 * Invariants: write errors name the file (ENOSPC included); small files are
 * written atomically (temp, fsync, rename); packs hold each expert's parts
 * contiguous and 4 KiB-aligned; finished layers are recorded in
 * setup-state.json only after their packs were fsynced; the manifest says
 * complete only after every blob was read back and its checksum verified.
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

#define ALIGN 4096u

/* ---- routed-expert tensors ------------------------------------------------ */

int store_expert_part(const df_store_layout *lay, const char *name, int *l, int *e, int *rank) {
    char f[256], pre[256];
    int n = 0;
    const char *fmt = lay->expert_fmt ? lay->expert_fmt : DF_STORE_EXPERT_FMT;
    static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"};
    const char *const *proj = lay->proj[0] ? lay->proj : hf;
    snprintf(f, sizeof f, "%s.%%n", fmt);
    if (sscanf(name, f, l, e, &n) != 2 || !n) return 0;
    int pl = snprintf(pre, sizeof pre, fmt, *l, *e); /* "+1", " 1", "01" are not this expert */
    if (pl <= 0 || (size_t)pl >= sizeof pre || strncmp(name, pre, (size_t)pl) || name[pl] != '.') return 0;
    const char *sfx = name + pl + 1, *dot = strchr(sfx, '.');
    if (!dot) return 0;
    size_t plen = (size_t)(dot - sfx);
    int p = -1;
    for (int i = 0; i < 3 && p < 0; i++)
        if (plen == strlen(proj[i]) && !strncmp(sfx, proj[i], plen)) p = i;
    const char *kind = dot + 1;
    int k = !strcmp(kind, "weight") || !strcmp(kind, "weight_packed") ? 0 : !strcmp(kind, "weight_scale_inv") || !strcmp(kind, "weight_scale") ? 1 : -1;
    if (p < 0 || k < 0) return 0;
    *rank = p * 2 + k;
    return 1;
}

typedef struct {
    const df_st_tensor *t[6];
    int n;
    uint64_t xxh3;
    int file;            /* pack file index (pack mode) */
    uint64_t off[6];     /* where each part lands */
} expert_rec;

static uint64_t a_up(uint64_t x) { return (x + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }

/* ---- writing with clear errors (ENOSPC names the file) -------------------- */

static int64_t test_write_limit = -1, written_total; /* DELTAFIN_TEST_WRITE_LIMIT: simulate a full disk */

static int write_all(int fd, const void *buf, size_t n, const char *path, char *err, size_t errlen) {
    const uint8_t *p = buf;
    while (n) {
        size_t k = n > (64u << 20) ? (64u << 20) : n;
        if (test_write_limit >= 0 && written_total + (int64_t)k > test_write_limit) {
            errno = ENOSPC;
            return df_err(err, errlen, DF_EIO, "%s: write failed: %s (the store is not marked complete; free space and run setup again to resume)", path, strerror(errno));
        }
        ssize_t w = write(fd, p, k);
        if (w < 0) {
            if (errno == EINTR) continue;
            return df_err(err, errlen, DF_EIO, "%s: write failed: %s (the store is not marked complete; free space and run setup again to resume)", path, strerror(errno));
        }
        p += w, n -= (size_t)w, written_total += w;
    }
    return 0;
}

static int write_file_atomic(const char *path, const void *buf, size_t n, char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return df_err(err, errlen, DF_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    int rc = write_all(fd, buf, n, tmp, err, errlen);
    if (!rc && fsync(fd)) rc = df_err(err, errlen, DF_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
    close(fd);
    if (!rc && rename(tmp, path)) rc = df_err(err, errlen, DF_EIO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}

static int write_json_atomic(const char *path, json_t *j, char *err, size_t errlen) {
    char *s = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    int rc = write_file_atomic(path, s, strlen(s), err, errlen);
    free(s);
    return rc;
}

static int sha256_path(const char *path, char hex[65], df_progress *pg, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return df_err(err, errlen, DF_EIO, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    static unsigned char buf[1 << 20];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) { EVP_DigestUpdate(c, buf, n); df_progress_add(pg, (int64_t)n, 0); }
    int bad = ferror(f);
    fclose(f);
    unsigned char md[32];
    unsigned int l;
    EVP_DigestFinal_ex(c, md, &l);
    EVP_MD_CTX_free(c);
    if (bad) return df_err(err, errlen, DF_EIO, "%s: read error", path);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

static void hex16(char out[17], uint64_t v) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

/* The spine as written, read back: its size, the xxh3 of its header (the
 * 8-byte length and the JSON) and of every tensor's bytes, into sp. */
static int spine_sums(const char *out, json_t *sp, char *err, size_t errlen) {
    char *path = df_path_join(out, "spine.safetensors");
    df_st_set *s = df_st_open_file(path, err, errlen);
    if (!s) { free(path); return DF_EFORMAT; }
    size_t size = 0;
    const uint8_t *base = df_st_file_data(s, 0, &size);
    uint64_t hl = 0;
    for (int i = 0; i < 8 && size >= 8; i++) hl |= (uint64_t)base[i] << (8 * i);
    int rc = 0;
    if (!base || size < 8 || hl > size - 8) rc = df_err(err, errlen, DF_EIO, "%s: reads back truncated", path);
    json_t *tj = json_object();
    char hx[17];
    for (int i = 0; i < df_st_count(s) && !rc; i++) {
        const df_st_tensor *t = df_st_at(s, i);
        hex16(hx, XXH3_64bits(t->data, t->nbytes));
        json_object_set_new(tj, t->name, json_string(hx));
    }
    if (!rc) {
        json_object_set_new(sp, "size", json_integer((json_int_t)size));
        hex16(hx, XXH3_64bits(base, 8 + hl));
        json_object_set_new(sp, "header_xxh3", json_string(hx));
        json_object_set(sp, "tensors", tj);
    }
    json_decref(tj);
    df_st_close(s);
    free(path);
    return rc;
}

static uint64_t expert_hash(const expert_rec *x) {
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    for (int p = 0; p < x->n; p++) XXH3_64bits_update(h, x->t[p]->data, x->t[p]->nbytes);
    uint64_t v = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return v;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int copy_small(const char *from_dir, const char *to_dir, const char *name, char *err, size_t errlen) {
    char *src = df_path_join(from_dir, name), *dst = df_path_join(to_dir, name), *buf = NULL;
    size_t len = 0;
    int rc = 0;
    if (df_file_exists(src)) {
        rc = df_read_file(src, &buf, &len, err, errlen);
        if (!rc) rc = write_file_atomic(dst, buf, len, err, errlen);
    }
    free(buf), free(src), free(dst);
    return rc;
}

/* --spine int8: which spine tensors become row-int8. Linear weights (2-D,
 * BF16/F16/F32, name ending in .weight) except the routers, whose outputs
 * choose the experts (routing must not change). */
static int int8_candidate(const df_st_tensor *t) {
    size_t n = strlen(t->name);
    if (t->n_dims != 2 || n < 7 || strcmp(t->name + n - 7, ".weight")) return 0;
    if (strstr(t->name, ".mlp.gate.weight")) return 0;
    return t->dtype == DF_ST_BF16 || t->dtype == DF_ST_F16 || t->dtype == DF_ST_F32;
}

static float elem_f32(const df_st_tensor *t, size_t i) {
    if (t->dtype == DF_ST_F32) { float f; memcpy(&f, t->data + 4 * i, 4); return f; }
    uint16_t h;
    memcpy(&h, t->data + 2 * i, 2);
    if (t->dtype == DF_ST_BF16) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
    int sgn = h >> 15, e = (h >> 10) & 31, mnt = h & 1023;
    float v = e == 0 ? ldexpf((float)mnt, -24) : ldexpf((float)(mnt | 1024), e - 25);
    return sgn ? -v : v;
}

/* Row-int8 of one row: scale = max|w| / 127, q = round(w / scale). */
static float quant_row(const df_st_tensor *t, int64_t r, int8_t *q) {
    const int64_t C = t->shape[1];
    float mx = 0;
    for (int64_t i = 0; i < C; i++) { float a = fabsf(elem_f32(t, (size_t)(r * C + i))); if (a > mx) mx = a; }
    float sc = mx > 0 ? mx / 127.0f : 1.0f;
    for (int64_t i = 0; i < C; i++) q[i] = (int8_t)lrintf(elem_f32(t, (size_t)(r * C + i)) / sc);
    return sc;
}

/* Writes spine.safetensors: every tensor except routed-expert parts, bytes as
 * shipped (or row-int8 + weight_row_scale for linear weights with int8). */
static int write_spine(const df_st_set *st, const df_store_layout *lay, const char *out, int int8, df_progress *pg, char *err, size_t errlen) {
    json_t *h = json_object();
    uint64_t off = 0;
    int n = df_st_count(st);
    for (int i = 0; i < n; i++) {
        const df_st_tensor *t = df_st_at(st, i);
        int l, e, r;
        if (store_expert_part(lay, t->name, &l, &e, &r)) continue;
        json_t *sh = json_array();
        for (int d = 0; d < t->n_dims; d++) json_array_append_new(sh, json_integer(t->shape[d]));
        if (int8 && int8_candidate(t)) {
            uint64_t nb = (uint64_t)t->shape[0] * (uint64_t)t->shape[1];
            json_object_set_new(h, t->name, json_pack("{s:s,s:o,s:[I,I]}", "dtype", "I8", "shape", sh, "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
            off += nb;
            char sn[1024];
            snprintf(sn, sizeof sn, "%.*s_row_scale", (int)strlen(t->name), t->name);
            json_object_set_new(h, sn, json_pack("{s:s,s:[I],s:[I,I]}", "dtype", "F32", "shape", (json_int_t)t->shape[0], "data_offsets", (json_int_t)off,
                                                 (json_int_t)(off + 4 * (uint64_t)t->shape[0])));
            off += 4 * (uint64_t)t->shape[0];
            continue;
        }
        json_object_set_new(h, t->name, json_pack("{s:s,s:o,s:[I,I]}", "dtype", df_st_dtype_name(t->dtype), "shape", sh, "data_offsets",
                                                  (json_int_t)off, (json_int_t)(off + t->nbytes)));
        off += t->nbytes;
    }
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *hs = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    size_t hl = strlen(hs), pad = (8 - hl % 8) % 8;
    char *path = df_path_join(out, "spine.safetensors"), tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), rc = 0;
    if (fd < 0) rc = df_err(err, errlen, DF_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)(hl + pad) >> (8 * i));
    if (!rc) rc = write_all(fd, len8, 8, tmp, err, errlen);
    if (!rc) rc = write_all(fd, hs, hl, tmp, err, errlen);
    if (!rc && pad) rc = write_all(fd, "        ", pad, tmp, err, errlen);
    for (int i = 0; i < n && !rc; i++) {
        const df_st_tensor *t = df_st_at(st, i);
        int l, e, r;
        if (store_expert_part(lay, t->name, &l, &e, &r)) continue;
        if (int8 && int8_candidate(t)) {
            const int64_t R = t->shape[0], C = t->shape[1];
            int8_t *q = df_xmalloc((size_t)C);
            float *sc = df_xmalloc((size_t)R * sizeof(float));
            for (int64_t row = 0; row < R && !rc; row++) {
                sc[row] = quant_row(t, row, q);
                rc = write_all(fd, q, (size_t)C, tmp, err, errlen);
            }
            if (!rc) rc = write_all(fd, sc, (size_t)R * sizeof(float), tmp, err, errlen);
            free(q), free(sc);
        } else {
            rc = write_all(fd, t->data, t->nbytes, tmp, err, errlen);
        }
        df_progress_add(pg, (int64_t)t->nbytes, 0);
    }
    if (!rc && fsync(fd)) rc = df_err(err, errlen, DF_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    if (!rc && rename(tmp, path)) rc = df_err(err, errlen, DF_EIO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    free(hs), free(path);
    return rc;
}

#define MAX_STORE_DIRS 64 /* drives one store spreads its packs over (the pos[] of each layer below) */

int df_store_build(const df_store_opts *o, char *err, size_t errlen) {
    if (o->n_dirs < 0 || o->n_dirs > MAX_STORE_DIRS)
        return df_err(err, errlen, DF_EINPUT, "store: %d pack directories (expected 0..%d)", o->n_dirs, MAX_STORE_DIRS);
    const char *tl = getenv("DELTAFIN_TEST_WRITE_LIMIT");
    test_write_limit = tl ? atoll(tl) : -1;
    written_total = 0;
    const char *ab = getenv("DELTAFIN_TEST_ABORT_AFTER_LAYERS"); /* tests: die like a kill after N layers */
    int abort_after = ab ? atoi(ab) : -1;
    int rc = 0;
    if (o->layout.n_experts <= 0)
        return df_err(err, errlen, DF_EINPUT, "%s: not a mixture-of-experts model (no routed experts to store)", o->from);
    if (o->layout.n_layers <= 0 || o->layout.n_layers > 4096 || o->layout.n_experts > 65536)
        return df_err(err, errlen, DF_EINPUT, "%s: %d layers x %d experts: expected 1..4096 layers and 1..65536 experts", o->from,
                      o->layout.n_layers, o->layout.n_experts);
    df_st_set *st = df_st_open_dir(o->from, err, errlen);
    if (!st) return DF_EFORMAT;
    const int L = o->layout.n_layers, E = o->layout.n_experts;
    expert_rec *ex = df_xcalloc((size_t)L * E, sizeof *ex);
    int64_t expert_bytes = 0, spine_bytes = 0;
    for (int i = 0; i < df_st_count(st); i++) {
        const df_st_tensor *t = df_st_at(st, i);
        int l, e, r;
        if (!store_expert_part(&o->layout, t->name, &l, &e, &r)) { spine_bytes += (int64_t)t->nbytes; continue; }
        if (l < 0 || l >= L || e < 0 || e >= E) { spine_bytes += (int64_t)t->nbytes; continue; } /* MTP layers stay in the spine */
        expert_rec *x = &ex[(size_t)l * E + e];
        x->t[r] = t;
        expert_bytes += (int64_t)t->nbytes;
    }
    for (int i = 0; i < L * E; i++) { /* compact parts in rank order */
        expert_rec *x = &ex[i];
        const df_st_tensor *tt[6];
        int n = 0;
        for (int r = 0; r < 6; r++) if (x->t[r]) tt[n++] = x->t[r];
        memset(x->t, 0, sizeof x->t);
        for (int r = 0; r < n; r++) x->t[r] = tt[r];
        x->n = n;
    }
    json_t *state = NULL, *man = NULL;
    char *state_path = df_path_join(o->out, "setup-state.json"), *man_path = df_path_join(o->out, "manifest.json");
    char **pack_names = NULL;
    int n_packs = 0;
    df_progress pg;
    df_progress_init(&pg, "hashing", 0, o->progress);
    if (df_mkdirs(o->out)) { rc = df_err(err, errlen, DF_EIO, "%s: cannot create: %s", o->out, strerror(errno)); goto out; }
    unlink(man_path); /* whatever happens next, the store is not complete until the end */
    state = json_load_file(state_path, 0, NULL);
    if (state && !json_is_object(state)) { json_decref(state); state = NULL; }
    /* the state belongs to this source and these options only */
    if (state) {
        json_t *src = json_object_get(state, "from");
        if (!json_is_string(src) || strcmp(json_string_value(src), o->from) || json_is_true(json_object_get(state, "pack")) != !!o->pack ||
            (int)json_integer_value(json_object_get(state, "n_dirs")) != (o->pack ? (o->n_dirs ? o->n_dirs : 1) : 0) ||
            json_is_true(json_object_get(state, "spine_int8")) != !!o->spine_int8) {
            json_decref(state);
            state = NULL;
        }
    }
    if (!state) state = json_pack("{s:s,s:b,s:i,s:{},s:{},s:b,s:b}", "from", o->from, "pack", o->pack, "n_dirs", o->pack ? (o->n_dirs ? o->n_dirs : 1) : 0,
                                  "sha256", "layers", "spine", 0, "spine_int8", o->spine_int8);
    else fprintf(stderr, "deltafin setup: resuming %s (%zu layers already done)\n", o->out, json_object_size(json_object_get(state, "layers")));

    /* 1. source identity: size + sha256 of every file (cached in the state by size and mtime) */
    json_t *files = json_array();
    for (int i = 0; i < df_st_n_files(st); i++) {
        struct stat fs;
        stat(df_st_file_path(st, i), &fs);
        pg.total += fs.st_size;
    }
    for (int i = 0; i < df_st_n_files(st) && !rc; i++) {
        const char *p = df_st_file_path(st, i);
        struct stat fs;
        stat(p, &fs);
        json_t *cached = json_object_get(json_object_get(state, "sha256"), base_name(p));
        char hex[65];
        if (json_is_object(cached) && json_integer_value(json_object_get(cached, "size")) == fs.st_size &&
            json_integer_value(json_object_get(cached, "mtime")) == (json_int_t)fs.st_mtime) {
            snprintf(hex, sizeof hex, "%s", json_string_value(json_object_get(cached, "sha256")));
            df_progress_add(&pg, fs.st_size, 0);
        } else {
            rc = sha256_path(p, hex, &pg, err, errlen);
            json_object_set_new(json_object_get(state, "sha256"), base_name(p), json_pack("{s:I,s:I,s:s}", "size", (json_int_t)fs.st_size, "mtime", (json_int_t)fs.st_mtime, "sha256", hex));
        }
        json_array_append_new(files, json_pack("{s:s,s:I,s:s}", "name", base_name(p), "size", (json_int_t)fs.st_size, "sha256", hex));
    }
    df_progress_add(&pg, 0, 1);
    if (!rc) rc = write_json_atomic(state_path, state, err, errlen);
    if (rc) { json_decref(files); goto out; }

    /* 2. spine + config and tokenizer files */
    df_progress_init(&pg, "writing", spine_bytes + expert_bytes, o->progress);
    if (!json_is_true(json_object_get(state, "spine"))) {
        rc = write_spine(st, &o->layout, o->out, o->spine_int8, &pg, err, errlen);
        static const char *small[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tiktoken.model",
                                      "chat_template.jinja", "special_tokens_map.json"};
        for (size_t i = 0; i < sizeof small / sizeof *small && !rc; i++) rc = copy_small(o->from, o->out, small[i], err, errlen);
        if (!rc) { json_object_set_new(state, "spine", json_true()); rc = write_json_atomic(state_path, state, err, errlen); }
        if (rc) { json_decref(files); goto out; }
    } else {
        df_progress_add(&pg, spine_bytes, 0);
    }

    /* 3. per MoE layer: packs (or checksums of the source bytes in direct mode) */
    int nd = o->pack ? (o->n_dirs ? o->n_dirs : 1) : 0, layers_done_now = 0;
    char pack_dir0[4200];
    snprintf(pack_dir0, sizeof pack_dir0, "%s/packs", o->out);
    for (int l = 0; l < L && !rc; l++) {
        int any = 0;
        for (int e = 0; e < E; e++) any |= ex[(size_t)l * E + e].n > 0;
        if (!any) continue;
        char lk[16];
        snprintf(lk, sizeof lk, "%d", l);
        json_t *done = json_object_get(json_object_get(state, "layers"), lk);
        if (nd) {
            for (int d = 0; d < nd; d++) {
                char name[4400];
                snprintf(name, sizeof name, "%s/layer-%03d.d%d.pack", o->dirs ? o->dirs[d] : pack_dir0, l, d);
                pack_names = df_xrealloc(pack_names, (size_t)(n_packs + 1) * sizeof *pack_names);
                pack_names[n_packs++] = df_xstrdup(name);
            }
        }
        /* offsets are deterministic: experts of drive d in index order, each 4 KiB-aligned */
        uint64_t pos[MAX_STORE_DIRS] = {0};
        for (int e = 0; e < E; e++) {
            expert_rec *x = &ex[(size_t)l * E + e];
            if (!x->n) continue;
            if (nd) {
                int d = e % nd;
                x->file = n_packs - nd + d;
                pos[d] = a_up(pos[d]);
                for (int p = 0; p < x->n; p++) { x->off[p] = pos[d]; pos[d] += x->t[p]->nbytes; }
            } else {
                x->file = x->t[0]->file_index;
                for (int p = 0; p < x->n; p++) x->off[p] = x->t[p]->file_offset;
            }
        }
        if (json_is_array(done) && (int)json_array_size(done) == E) { /* finished in an earlier run */
            for (int e = 0; e < E; e++) {
                const char *h = json_string_value(json_array_get(done, (size_t)e));
                ex[(size_t)l * E + e].xxh3 = h ? strtoull(h, NULL, 16) : 0;
                for (int p = 0; p < ex[(size_t)l * E + e].n; p++) df_progress_add(&pg, (int64_t)ex[(size_t)l * E + e].t[p]->nbytes, 0);
            }
            continue;
        }
        json_t *hashes = json_array();
        if (nd) {
            for (int d = 0; d < nd && !rc; d++) {
                const char *pn = pack_names[n_packs - nd + d];
                char dirbuf[4400];
                snprintf(dirbuf, sizeof dirbuf, "%s", pn);
                *strrchr(dirbuf, '/') = 0;
                if (df_mkdirs(dirbuf)) { rc = df_err(err, errlen, DF_EIO, "%s: cannot create: %s", dirbuf, strerror(errno)); break; }
                int fd = open(pn, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                if (fd < 0) { rc = df_err(err, errlen, DF_EIO, "%s: cannot create: %s", pn, strerror(errno)); break; }
                uint64_t at = 0;
                static const uint8_t zeros[ALIGN];
                for (int e = d; e < E && !rc; e += nd) {
                    expert_rec *x = &ex[(size_t)l * E + e];
                    if (!x->n) continue;
                    if (x->off[0] > at) { rc = write_all(fd, zeros, (size_t)(x->off[0] - at), pn, err, errlen); at = x->off[0]; }
                    for (int p = 0; p < x->n && !rc; p++) {
                        rc = write_all(fd, x->t[p]->data, x->t[p]->nbytes, pn, err, errlen);
                        at += x->t[p]->nbytes;
                        df_progress_add(&pg, (int64_t)x->t[p]->nbytes, 0);
                    }
                }
                if (!rc && at % ALIGN) rc = write_all(fd, zeros, (size_t)(a_up(at) - at), pn, err, errlen);
                if (!rc && fsync(fd)) rc = df_err(err, errlen, DF_EIO, "%s: fsync failed: %s", pn, strerror(errno));
                close(fd);
            }
        } else {
            for (int e = 0; e < E; e++) for (int p = 0; p < ex[(size_t)l * E + e].n; p++) df_progress_add(&pg, (int64_t)ex[(size_t)l * E + e].t[p]->nbytes, 0);
        }
        for (int e = 0; e < E; e++) {
            expert_rec *x = &ex[(size_t)l * E + e];
            char h[17] = "";
            if (x->n) { x->xxh3 = expert_hash(x); snprintf(h, sizeof h, "%016llx", (unsigned long long)x->xxh3); }
            json_array_append_new(hashes, json_string(h));
        }
        if (rc) { json_decref(hashes); break; }
        json_object_set_new(json_object_get(state, "layers"), lk, hashes);
        rc = write_json_atomic(state_path, state, err, errlen);
        if (!rc && ++layers_done_now == abort_after) _exit(9);
    }
    df_progress_add(&pg, 0, 1);
    if (rc) { json_decref(files); goto out; }

    /* 4. verify every blob as it will be read, then write the manifest (complete) */
    df_progress_init(&pg, "verifying", expert_bytes, o->progress);
    man = json_pack("{s:s,s:i,s:b,s:{s:s,s:o},s:{s:s,s:b},s:b}", "format", "deltafin-store", "format_version", FORMAT_VERSION, "complete", 0,
                    "source", "path", o->from, "files", files, "spine", "file", "spine.safetensors", "exact", !o->spine_int8, "packed", o->pack);
    char *cfgp = df_path_join(o->out, "config.json");
    json_t *cfgj = json_load_file(cfgp, 0, NULL);
    free(cfgp);
    json_object_set_new(man, "config", cfgj ? cfgj : json_null());
    json_object_set_new(json_object_get(man, "spine"), "mode", json_string(o->spine_int8 ? "int8" : "exact"));
    json_t *flist = json_array(), *exj = json_array();
    char **fnames = nd ? pack_names : NULL;
    int nf = nd ? n_packs : df_st_n_files(st);
    for (int i = 0; i < nf; i++) {
        const char *p = nd ? fnames[i] : df_st_file_path(st, i);
        size_t ol = strlen(o->out);
        json_array_append_new(flist, json_string(!strncmp(p, o->out, ol) && p[ol] == '/' ? p + ol + 1 : p));
    }
    json_object_set_new(man, "files", flist);
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (int l = 0; l < L && !rc; l++)
        for (int e = 0; e < E && !rc; e++) {
            expert_rec *x = &ex[(size_t)l * E + e];
            if (!x->n) continue;
            const char *fp = nd ? fnames[x->file] : df_st_file_path(st, x->file);
            int fd = open(fp, O_RDONLY | O_CLOEXEC);
            if (fd < 0) { rc = df_err(err, errlen, DF_EIO, "%s: cannot open for verification: %s", fp, strerror(errno)); break; }
            XXH3_state_t *h = XXH3_createState();
            XXH3_64bits_reset(h);
            json_t *parts = json_array();
            for (int p = 0; p < x->n && !rc; p++) {
                const df_st_tensor *t = x->t[p];
                if (t->nbytes > cap) { free(buf); buf = df_xmalloc(cap = t->nbytes); }
                ssize_t r = pread(fd, buf, t->nbytes, (off_t)x->off[p]);
                if (r != (ssize_t)t->nbytes) rc = df_err(err, errlen, DF_EIO, "%s: short read verifying layer %d expert %d", fp, l, e);
                XXH3_64bits_update(h, buf, t->nbytes);
                df_progress_add(&pg, (int64_t)t->nbytes, 0);
                json_t *sh = json_array();
                for (int d = 0; d < t->n_dims; d++) json_array_append_new(sh, json_integer(t->shape[d]));
                json_array_append_new(parts, json_pack("{s:s,s:s,s:o,s:i,s:I,s:I}", "tensor", t->name, "dtype", df_st_dtype_name(t->dtype), "shape", sh,
                                                       "file", x->file, "offset", (json_int_t)x->off[p], "length", (json_int_t)t->nbytes));
            }
            uint64_t got = XXH3_64bits_digest(h);
            XXH3_freeState(h);
            close(fd);
            if (!rc && got != x->xxh3) rc = df_err(err, errlen, DF_EIO, "%s: layer %d expert %d reads back with a different checksum (%016llx, wrote %016llx)", fp, l, e,
                                                  (unsigned long long)got, (unsigned long long)x->xxh3);
            char hx[17];
            snprintf(hx, sizeof hx, "%016llx", (unsigned long long)x->xxh3);
            json_array_append_new(exj, json_pack("{s:i,s:i,s:s,s:o}", "layer", l, "expert", e, "xxh3", hx, "parts", parts));
        }
    free(buf);
    df_progress_add(&pg, 0, 1);
    json_object_set_new(man, "experts", exj);
    if (!rc) rc = spine_sums(o->out, json_object_get(man, "spine"), err, errlen);
    if (!rc) {
        json_object_set_new(man, "complete", json_true());
        rc = write_json_atomic(man_path, man, err, errlen);
    }
    if (!rc) unlink(state_path);
out:
    json_decref(man);
    json_decref(state);
    for (int i = 0; i < n_packs; i++) free(pack_names[i]);
    free(pack_names);
    free(state_path), free(man_path);
    free(ex);
    df_st_close(st);
    return rc;
}
