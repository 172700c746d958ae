/* session_file.c - a session's state at a position in a file, and back
 * (the server's prompt cache, src/server/pcache.c; format in docs/SERVER.md).
 *
 * Layout (native byte order, checked by a marker; every size in the header
 * is checked against the model before anything is allocated):
 *
 *   header  104 bytes: magic "DFPCACHE", version, byte-order marker, the
 *           engine's fingerprint, positions, layers, vocab, growing-cache
 *           floats per position, fixed floats, has_logits, one XXH3-64 per
 *           section, and one over the header itself
 *   tokens  [pos] int32
 *   logits  [vocab] f32 at pos (absent when has_logits is 0)
 *   fixed   [fixed_floats] f32: every recurrent layer's state, layer order
 *   caches  per layer with a growing cache: rows [0, pos) x cache_floats f32
 *
 * A file is untrusted input: a load checks the header, the sizes against the
 * model and the file's length, the tokens against the caller's prompt, and
 * every section's checksum and finiteness. It writes into the session only
 * the caches' rows (streamed, so no buffer of the file's size) and empties
 * the session when a later check fails, so a refused file leaves either the
 * session untouched (header, tokens, logits, fixed state) or empty (caches),
 * never half-loaded. */
#include "core/session_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define PC_MAGIC "DFPCACHE"
#define PC_VERSION 1u
#define PC_ENDIAN 0x01020304u
#define PC_HDR 104
#define PC_CHUNK ((size_t)1 << 20) /* floats per streamed chunk (4 MiB) */

typedef struct {
    uint64_t fingerprint, pos, cache_floats, fixed_floats;
    uint32_t version, endian, n_layers, vocab, has_logits, reserved;
    uint64_t sum[4]; /* tokens, logits, fixed, caches */
} pc_header;

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void hdr_encode(const pc_header *h, uint8_t b[PC_HDR]) {
    memset(b, 0, PC_HDR);
    memcpy(b, PC_MAGIC, 8);
    put32(b + 8, h->version), put32(b + 12, h->endian);
    put64(b + 16, h->fingerprint), put64(b + 24, h->pos);
    put32(b + 32, h->n_layers), put32(b + 36, h->vocab);
    put64(b + 40, h->cache_floats), put64(b + 48, h->fixed_floats);
    put32(b + 56, h->has_logits), put32(b + 60, h->reserved);
    for (int i = 0; i < 4; i++) put64(b + 64 + 8 * i, h->sum[i]);
    put64(b + 96, XXH3_64bits(b, 96));
}

static void hdr_decode(const uint8_t b[PC_HDR], pc_header *h) {
    h->version = get32(b + 8), h->endian = get32(b + 12);
    h->fingerprint = get64(b + 16), h->pos = get64(b + 24);
    h->n_layers = get32(b + 32), h->vocab = get32(b + 36);
    h->cache_floats = get64(b + 40), h->fixed_floats = get64(b + 48);
    h->has_logits = get32(b + 56), h->reserved = get32(b + 60);
    for (int i = 0; i < 4; i++) h->sum[i] = get64(b + 64 + 8 * i);
}

/* ---- the fingerprint -------------------------------------------------------- */

static void fp_weight(void *ctx, df_weight *w) {
    XXH3_state_t *h = ctx;
    int64_t shape[5] = {w->fmt, w->ggml_type, w->rows, w->cols, (int64_t)w->row_bytes};
    XXH3_64bits_update(h, shape, sizeof shape);
    size_t n = w->rows > 0 ? (size_t)w->rows * w->row_bytes : 0;
    if (w->data && n) XXH3_64bits_update(h, w->data, n < 4096 ? n : 4096); /* the first bytes: a fine-tune of the same shapes differs there */
}

uint64_t df_engine_fingerprint(df_engine *e) {
    const df_model *m = e->model;
    const df_config *c = &m->cfg;
    XXH3_state_t *h = XXH3_createState();
    if (!h) return 0;
    XXH3_64bits_reset(h);
    char tag[160];
    snprintf(tag, sizeof tag, "deltafin session file v%u|%s|backend %s|cache f32|spine_int8 %d", PC_VERSION, DF_VERSION,
             df_be->name, m->spine_int8);
    XXH3_64bits_update(h, tag, strlen(tag));
    char *path = df_path_join(m->dir, "config.json"), *txt = NULL;
    size_t len = 0;
    char err[256];
    if (df_is_dir(m->dir) && !df_read_file(path, &txt, &len, err, sizeof err)) XXH3_64bits_update(h, txt, len);
    free(txt);
    free(path);
    int64_t dims[] = {c->family, c->vocab, c->hidden, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
                      c->intermediate, c->max_pos, c->rope_dim, c->tie_embeddings, m->rope_adjacent,
                      (int64_t)df_state_bytes_per_token(m), (int64_t)df_state_fixed_bytes(m), m->n_params};
    XXH3_64bits_update(h, dims, sizeof dims);
    double reals[] = {c->rms_eps, c->rope_theta, m->rope_scale, m->attn_scale};
    XXH3_64bits_update(h, reals, sizeof reals);
    if (m->inv_freq && c->rope_dim > 1) XXH3_64bits_update(h, m->inv_freq, (size_t)(c->rope_dim / 2) * sizeof(float));
    if (m->final_norm) XXH3_64bits_update(h, m->final_norm, (size_t)c->hidden * sizeof(float));
    df_model_foreach_weight((df_model *)m, fp_weight, h);
    uint64_t fp = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return fp;
}

/* ---- sizes ------------------------------------------------------------------ */

static size_t cache_floats(const df_session *s) {
    size_t f = 0;
    for (int l = 0; l < s->st.n_layers; l++) f += s->st.ls[l].cache_floats;
    return f;
}

static size_t fixed_floats(const df_session *s) {
    size_t f = 0;
    for (int l = 0; l < s->st.n_layers; l++) f += s->st.ls[l].fixed_floats;
    return f;
}

uint64_t df_session_file_bytes(const df_session *s, size_t n) {
    return PC_HDR + (uint64_t)n * 4 + (uint64_t)s->e->model->cfg.vocab * 4 + (uint64_t)fixed_floats(s) * 4 +
           (uint64_t)n * cache_floats(s) * 4;
}

/* ---- writing ---------------------------------------------------------------- */

static int pwrite_all(int fd, const void *p, size_t n, uint64_t off) {
    const char *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return df_err(df_errbuf(), DF_ERRLEN, DF_EIO, "writing the session file at offset %llu: %s",
                                  (unsigned long long)off, w < 0 ? strerror(errno) : "no progress");
        c += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

typedef struct { int fd; uint64_t off; XXH3_state_t *h; } pc_writer;

static int wr(pc_writer *w, const void *p, size_t n) {
    XXH3_64bits_update(w->h, p, n);
    int rc = pwrite_all(w->fd, p, n, w->off);
    w->off += n;
    return rc;
}

int df_session_save(df_session *s, int snap, const int32_t *ids, size_t n, int fd, uint64_t *bytes) {
    df_session_settle(s);
    const df_model *m = s->e->model;
    const size_t V = (size_t)m->cfg.vocab, F = fixed_floats(s), C = cache_floats(s);
    if (bytes) *bytes = 0;
    if (n == 0 || n > s->len)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "cannot save position %zu: the session holds %zu positions", n, s->len);
    if (memcmp(s->tokens, ids, n * sizeof *ids))
        return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "cannot save position %zu: the session's tokens are not the given ones", n);
    const float *logits = NULL, *fixed = NULL;
    df_snapshot now = {0};
    if (snap >= 0) {
        if (snap >= DF_MAX_SNAPSHOTS || !s->snaps[snap].used || (size_t)s->snaps[snap].st.pos != n || !s->snaps[snap].logits)
            return df_err(df_errbuf(), DF_ERRLEN, DF_EINPUT, "snapshot %d is not a state at position %zu (dropped or reused)", snap, n);
        logits = s->snaps[snap].logits, fixed = s->snaps[snap].st.fixed;
    } else if (n == s->len && s->logits_valid) {
        if (df_state_snapshot(&s->st, (int)n, &now)) return df_err(df_errbuf(), DF_ERRLEN, DF_ENOMEM, "out of memory for %zu floats of fixed state", F);
        logits = s->logits, fixed = now.fixed;
    } else if (!df_state_truncatable(m)) {
        return df_err(df_errbuf(), DF_ERRLEN, DF_EUNSUPPORTED, "position %zu is not the session's end and its recurrent layers keep no state there (snapshot it)", n);
    }
    if (F && !fixed) return df_err(df_errbuf(), DF_ERRLEN, DF_EINTERNAL, "no fixed state at position %zu", n);
    XXH3_state_t *h = XXH3_createState();
    float *buf = malloc(PC_CHUNK * sizeof(float));
    int rc = 0;
    if (!h || !buf) { rc = df_err(df_errbuf(), DF_ERRLEN, DF_ENOMEM, "out of memory for the session file's buffers"); goto out; }
    pc_header hd = {.version = PC_VERSION, .endian = PC_ENDIAN, .fingerprint = df_engine_fingerprint(s->e), .pos = n,
                    .n_layers = (uint32_t)s->st.n_layers, .vocab = (uint32_t)V, .cache_floats = C, .fixed_floats = F,
                    .has_logits = logits != NULL};
    pc_writer w = {fd, PC_HDR, h};
    XXH3_64bits_reset(h);
    if ((rc = wr(&w, ids, n * sizeof *ids))) goto out;
    hd.sum[0] = XXH3_64bits_digest(h);
    XXH3_64bits_reset(h);
    if (logits && (rc = wr(&w, logits, V * sizeof(float)))) goto out;
    hd.sum[1] = XXH3_64bits_digest(h);
    XXH3_64bits_reset(h);
    if (F && (rc = wr(&w, fixed, F * sizeof(float)))) goto out;
    hd.sum[2] = XXH3_64bits_digest(h);
    XXH3_64bits_reset(h);
    for (int l = 0; l < s->st.n_layers; l++) {
        const df_layer_state *ls = &s->st.ls[l];
        size_t total = n * ls->cache_floats;
        for (size_t done = 0; done < total && !rc; done += PC_CHUNK) {
            size_t cnt = total - done < PC_CHUNK ? total - done : PC_CHUNK;
            df_read(buf, DF_AT(ls->cache, done), cnt); /* rows [0, n) are contiguous: [max_ctx][cache_floats] */
            rc = wr(&w, buf, cnt * sizeof(float));
        }
        if (rc) goto out;
    }
    hd.sum[3] = XXH3_64bits_digest(h);
    uint8_t hb[PC_HDR];
    hdr_encode(&hd, hb);
    if ((rc = pwrite_all(fd, hb, PC_HDR, 0))) goto out;
    if (bytes) *bytes = w.off;
out:
    df_snapshot_free(&now);
    XXH3_freeState(h);
    free(buf);
    return rc;
}

/* ---- reading ---------------------------------------------------------------- */

static int pread_all(int fd, void *p, size_t n, uint64_t off) {
    char *c = p;
    while (n) {
        ssize_t r = pread(fd, c, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return df_err(df_errbuf(), DF_ERRLEN, r < 0 ? DF_EIO : DF_EFORMAT, "session file: reading %zu bytes at offset %llu: %s",
                                  n, (unsigned long long)off, r < 0 ? strerror(errno) : "end of file (truncated)");
        c += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* Whether no value is Inf or NaN (exponent bits all set), on the bits: a
 * branch-free loop the compiler vectorizes. */
static int all_finite(const float *x, size_t n) {
    const uint32_t *u = (const uint32_t *)(const void *)x;
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (uint32_t)((u[i] & 0x7f800000u) == 0x7f800000u);
    return !bad;
}

/* Reads a section of n floats (or ints, finite 0) at *off into p, checks its checksum. */
static int read_section(int fd, void *p, size_t bytes, uint64_t *off, uint64_t sum, const char *what, int finite) {
    int rc = pread_all(fd, p, bytes, *off);
    if (rc) return rc;
    *off += bytes;
    if (XXH3_64bits(p, bytes) != sum)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: the %s section's checksum does not match (corrupt file)", what);
    if (finite && !all_finite(p, bytes / sizeof(float)))
        return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: the %s section holds a non-finite value", what);
    return 0;
}

int df_session_load(df_session *s, int fd, const int32_t *ids, size_t n, size_t *pos_out) {
    df_session_settle(s);
    const df_model *m = s->e->model;
    const size_t V = (size_t)m->cfg.vocab, F = fixed_floats(s), C = cache_floats(s);
    *pos_out = 0;
    struct stat sb;
    if (fstat(fd, &sb)) return df_err(df_errbuf(), DF_ERRLEN, DF_EIO, "session file: fstat: %s", strerror(errno));
    uint64_t size = (uint64_t)sb.st_size;
    if (size < PC_HDR)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: %llu bytes, shorter than the %d-byte header", (unsigned long long)size, PC_HDR);
    uint8_t hb[PC_HDR];
    int rc = pread_all(fd, hb, PC_HDR, 0);
    if (rc) return rc;
    if (memcmp(hb, PC_MAGIC, 8)) return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: bad magic (not a Deltafin prompt-cache file)");
    if (get64(hb + 96) != XXH3_64bits(hb, 96)) return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: the header's checksum does not match (corrupt header)");
    pc_header h;
    hdr_decode(hb, &h);
    if (h.version != PC_VERSION) return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: format version %u, this build reads version %u", h.version, PC_VERSION);
    if (h.endian != PC_ENDIAN) return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: written on a machine of another byte order");
    uint64_t fp = df_engine_fingerprint(s->e);
    if (h.fingerprint != fp)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: written for another model, backend or build (fingerprint %016llx, this engine's %016llx)",
                      (unsigned long long)h.fingerprint, (unsigned long long)fp);
    if (h.n_layers != (uint32_t)s->st.n_layers || h.vocab != (uint32_t)V || h.cache_floats != C || h.fixed_floats != F)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: layout of %u layers, vocab %u, %llu cache floats per position, %llu fixed floats; "
                      "the model has %d, %zu, %zu, %zu", h.n_layers, h.vocab, (unsigned long long)h.cache_floats, (unsigned long long)h.fixed_floats,
                      s->st.n_layers, V, C, F);
    if (h.has_logits > 1 || h.reserved) return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: has_logits %u / reserved %u (expected 0 or 1 / 0)", h.has_logits, h.reserved);
    if (!h.has_logits && !df_state_truncatable(m))
        return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: no logits, which only models without recurrent layers may omit");
    if (h.pos == 0 || h.pos > (uint64_t)s->st.max_ctx || h.pos > n)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: %llu positions, expected 1..%zu (the prompt's %zu tokens, the session's %d)",
                      (unsigned long long)h.pos, n < (size_t)s->st.max_ctx ? n : (size_t)s->st.max_ctx, n, s->st.max_ctx);
    const size_t pos = (size_t)h.pos; /* <= max_ctx: every product below is at most the session's own allocation */
    uint64_t want = PC_HDR + (uint64_t)pos * 4 + (h.has_logits ? (uint64_t)V * 4 : 0) + (uint64_t)F * 4 + (uint64_t)pos * C * 4;
    if (size != want)
        return df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: %llu bytes, its header implies %llu (truncated or padded)",
                      (unsigned long long)size, (unsigned long long)want);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int32_t *tok = malloc(pos * sizeof *tok);
    float *lg = h.has_logits ? malloc(V * sizeof(float)) : NULL, *fx = F ? malloc(F * sizeof(float)) : NULL;
    float *buf = malloc(PC_CHUNK * sizeof(float));
    XXH3_state_t *xs = XXH3_createState();
    uint64_t off = PC_HDR;
    if (!tok || (h.has_logits && !lg) || (F && !fx) || !buf || !xs) { rc = df_err(df_errbuf(), DF_ERRLEN, DF_ENOMEM, "out of memory loading a session file"); goto out; }
    if ((rc = read_section(fd, tok, pos * sizeof *tok, &off, h.sum[0], "tokens", 0))) goto out;
    if (memcmp(tok, ids, pos * sizeof *tok)) {
        rc = df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: its %zu tokens are not the prompt's first %zu (a different prefix under this name)", pos, pos);
        goto out;
    }
    if (h.has_logits && (rc = read_section(fd, lg, V * sizeof(float), &off, h.sum[1], "logits", 1))) goto out;
    if (!h.has_logits && XXH3_64bits(NULL, 0) != h.sum[1]) { rc = df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: the logits section's checksum does not match"); goto out; }
    if (F && (rc = read_section(fd, fx, F * sizeof(float), &off, h.sum[2], "fixed state", 1))) goto out;
    if (!F && XXH3_64bits(NULL, 0) != h.sum[2]) { rc = df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: the fixed state section's checksum does not match"); goto out; }
    /* From here on the session's caches are written: on failure it is emptied. */
    df_session_reset(s);
    XXH3_64bits_reset(xs);
    int finite = 1;
    for (int l = 0; l < s->st.n_layers && !rc; l++) {
        const df_layer_state *ls = &s->st.ls[l];
        size_t total = pos * ls->cache_floats;
        for (size_t done = 0; done < total && !rc; done += PC_CHUNK) {
            size_t cnt = total - done < PC_CHUNK ? total - done : PC_CHUNK;
            if ((rc = pread_all(fd, buf, cnt * sizeof(float), off))) break;
            off += cnt * sizeof(float);
            XXH3_64bits_update(xs, buf, cnt * sizeof(float));
            finite &= all_finite(buf, cnt);
            df_write(DF_AT(ls->cache, done), buf, cnt);
        }
    }
    if (!rc && XXH3_64bits_digest(xs) != h.sum[3]) rc = df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: the caches section's checksum does not match (corrupt file)");
    if (!rc && !finite) rc = df_err(df_errbuf(), DF_ERRLEN, DF_EFORMAT, "session file: the caches section holds a non-finite value");
    if (rc) { df_session_reset(s); goto out; }
    float *p = fx;
    for (int l = 0; l < s->st.n_layers && p; l++)
        if (s->st.ls[l].fixed_floats) df_write(s->st.ls[l].fixed, p, s->st.ls[l].fixed_floats), p += s->st.ls[l].fixed_floats;
    memcpy(s->tokens, tok, pos * sizeof *tok);
    s->len = pos;
    s->logits_valid = h.has_logits != 0;
    if (lg) memcpy(s->logits, lg, V * sizeof(float));
    *pos_out = pos;
out:
    free(tok);
    free(lg);
    free(fx);
    free(buf);
    XXH3_freeState(xs);
    return rc;
}
