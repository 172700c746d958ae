/* hub.c - the Hugging Face hub protocol, the huggingface_hub cache layout and
 * a ranged, parallel, retrying download engine on libcurl (hub.h). */
#include "hub/hub.h"
#include "deltafin.h"
#include "util/util.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* snprintf through a function, so that paths longer than a buffer are cut
 * (and then not found) rather than warned about at every call. */
int df_hub_sp(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return r < 0 ? 0 : (size_t)r >= n ? (int)(n ? n - 1 : 0) : r;
}

/* ---- paths and environment ------------------------------------------------ */

static const char *env(const char *k) {
    const char *v = getenv(k);
    return v && *v ? v : NULL;
}

static void hf_home(char *buf, size_t n) {
    if (env("HF_HOME")) df_hub_sp(buf, n, "%s", env("HF_HOME"));
    else if (env("XDG_CACHE_HOME")) df_hub_sp(buf, n, "%s/huggingface", env("XDG_CACHE_HOME"));
    else df_hub_sp(buf, n, "%s/.cache/huggingface", env("HOME") ? env("HOME") : ".");
}

const char *df_hub_cache_dir(char *buf, size_t n) {
    if (env("HF_HUB_CACHE")) df_hub_sp(buf, n, "%s", env("HF_HUB_CACHE"));
    else if (env("HUGGINGFACE_HUB_CACHE")) df_hub_sp(buf, n, "%s", env("HUGGINGFACE_HUB_CACHE"));
    else {
        char h[2048];
        hf_home(h, sizeof h);
        df_hub_sp(buf, n, "%s/hub", h);
    }
    return buf;
}

static int id_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'; }

int df_hub_is_repo_id(const char *s) {
    if (!s || !*s || *s == '.' || *s == '/' || *s == '-') return 0;
    int slashes = 0;
    const char *p = s;
    for (; *p && *p != '@'; p++) {
        if (*p == '/') { if (p == s || p[1] == '/' || p[1] == 0 || p[1] == '@' || p[1] == '.') return 0; slashes++; }
        else if (!id_char(*p)) return 0;
    }
    if (slashes != 1 || p - s > 200) return 0;
    if (*p == '@') {
        if (!p[1]) return 0;
        for (p++; *p; p++) if (!id_char(*p) && *p != '/') return 0;
    }
    return 1;
}

int df_hub_parse_ref(const char *arg, char *repo, size_t rn, char *rev, size_t vn, char *err, size_t errlen) {
    if (!df_hub_is_repo_id(arg))
        return df_err(err, errlen, DF_EINPUT, "'%s': expected a Hugging Face repo id ORG/NAME[@REVISION] (letters, digits, '.', '_', '-')", arg);
    const char *at = strchr(arg, '@');
    size_t l = at ? (size_t)(at - arg) : strlen(arg);
    if (l >= rn || (at && strlen(at + 1) >= vn)) return df_err(err, errlen, DF_EINPUT, "'%s': repo id or revision too long", arg);
    memcpy(repo, arg, l);
    repo[l] = 0;
    df_hub_sp(rev, vn, "%s", at ? at + 1 : "main");
    if (strstr(rev, "..")) return df_err(err, errlen, DF_EINPUT, "'%s': revision may not contain '..'", arg);
    return 0;
}

void df_hub_repo_dir(const char *cache, const char *repo, char *buf, size_t n) {
    char c[2048], name[512];
    if (!cache) cache = df_hub_cache_dir(c, sizeof c);
    df_hub_sp(name, sizeof name, "%s", repo);
    char *s = strchr(name, '/');
    if (s) *s = 0;
    df_hub_sp(buf, n, "%s/models--%s--%s", cache, name, s ? s + 1 : "");
}

static int is_commit(const char *s) {
    if (strlen(s) != 40) return 0;
    for (; *s; s++) if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

/* The commit a revision names in the cache: itself, or refs/REV. */
static int cached_commit(const char *rdir, const char *rev, char commit[48], char *err, size_t errlen) {
    if (is_commit(rev)) { df_hub_sp(commit, 48, "%s", rev); return 0; }
    char p[4096];
    df_hub_sp(p, sizeof p, "%s/refs/%s", rdir, rev);
    FILE *f = fopen(p, "r");
    if (!f) return df_err(err, errlen, DF_EINPUT, "%s: not in the hub cache (no such ref file)", p);
    char line[128] = "";
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    line[strcspn(line, "\r\n")] = 0;
    if (!ok || !is_commit(line)) return df_err(err, errlen, DF_EFORMAT, "%s: expected a 40-hex commit, got '%.60s'", p, line);
    df_hub_sp(commit, 48, "%s", line);
    return 0;
}

int df_hub_snapshot_dir(const char *cache, const char *repo, const char *rev, char *buf, size_t n, char *err, size_t errlen) {
    char rdir[4096], commit[48];
    df_hub_repo_dir(cache, repo, rdir, sizeof rdir);
    int rc = cached_commit(rdir, rev, commit, err, errlen);
    if (rc) return rc;
    df_hub_sp(buf, n, "%s/snapshots/%s", rdir, commit);
    if (!df_is_dir(buf)) return df_err(err, errlen, DF_EINPUT, "%s: not in the hub cache (no snapshot directory)", buf);
    return 0;
}

static int has_weights_missing(const char *dir, char *missing, size_t mn);
static int has_weights(const char *dir) { return has_weights_missing(dir, NULL, 0); }

int df_hub_snapshot_check(const char *dir, char *err, size_t errlen) {
    char miss[4300] = "";
    if (has_weights_missing(dir, miss, sizeof miss)) return 0;
    if (!miss[0]) df_hub_sp(miss, sizeof miss, "%s/config.json", dir);
    if (df_file_exists(miss)) return 0; /* not a safetensors model: nothing to check */
    return df_err(err, errlen, DF_EINPUT, "%s: missing from the cached snapshot", miss);
}

static int has_weights_missing(const char *dir, char *missing, size_t mn) {
    char p[4200];
    df_hub_sp(p, sizeof p, "%s/model.safetensors", dir);
    if (df_file_exists(p)) return 1;
    df_hub_sp(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (!df_file_exists(p)) return 0;
    /* sharded: weights are there when the index's first shard is */
    char *txt = NULL;
    size_t len;
    if (df_read_file(p, &txt, &len, NULL, 0)) return 0;
    json_t *j = json_loadb(txt, len, 0, NULL);
    free(txt);
    int ok = 0;
    json_t *wm = j ? json_object_get(j, "weight_map") : NULL;
    const char *k;
    json_t *v;
    if (json_is_object(wm)) {
        ok = 1;
        json_object_foreach(wm, k, v) {
            if (!json_is_string(v)) { ok = 0; break; }
            df_hub_sp(p, sizeof p, "%s/%s", dir, json_string_value(v));
            if (!df_file_exists(p)) {
                if (missing) df_hub_sp(missing, mn, "%s", p);
                ok = 0;
                break;
            }
        }
    }
    json_decref(j);
    return ok;
}

int df_hub_model_dir(const char *model, char *buf, size_t n, char *err, size_t errlen) {
    char repo[256], rev[256], rdir[4096], commit[48];
    int rc = df_hub_parse_ref(model, repo, sizeof repo, rev, sizeof rev, err, errlen);
    if (rc) return rc;
    df_hub_repo_dir(NULL, repo, rdir, sizeof rdir);
    if ((rc = cached_commit(rdir, rev, commit, err, errlen))) {
        char s[4400];
        df_hub_sp(s, sizeof s, "%s/deltafin-stream/refs/%s", rdir, rev);
        if (is_commit(rev) || !df_file_exists(s)) return rc;
        char sd[4400];
        df_hub_sp(sd, sizeof sd, "%s/deltafin-stream", rdir);
        if (cached_commit(sd, rev, commit, err, errlen)) return rc;
    }
    char snap[4200], stream[4400];
    df_hub_sp(snap, sizeof snap, "%s/snapshots/%s", rdir, commit);
    df_hub_sp(stream, sizeof stream, "%s/deltafin-stream/%s/stream.json", rdir, commit);
    if (df_is_dir(snap) && has_weights(snap)) { df_hub_sp(buf, n, "%s", snap); return 0; }
    if (df_file_exists(stream)) { df_hub_sp(buf, n, "%s/deltafin-stream/%s", rdir, commit); return 0; }
    if (df_is_dir(snap)) { df_hub_sp(buf, n, "%s", snap); return 0; }
    return df_err(err, errlen, DF_EINPUT, "%s: model %s is not in the hub cache (run deltafin setup --full %s)", snap, model, model);
}

void df_hub_opts_default(df_hub_opts *o) {
    memset(o, 0, sizeof *o);
    df_hub_sp(o->endpoint, sizeof o->endpoint, "%s", env("HF_ENDPOINT") ? env("HF_ENDPOINT") : "https://huggingface.co");
    size_t l = strlen(o->endpoint);
    while (l && o->endpoint[l - 1] == '/') o->endpoint[--l] = 0;
    if (env("HF_TOKEN")) df_hub_sp(o->token, sizeof o->token, "%s", env("HF_TOKEN"));
    else {
        char p[2300], h[2048];
        hf_home(h, sizeof h);
        if (env("HF_TOKEN_PATH")) df_hub_sp(p, sizeof p, "%s", env("HF_TOKEN_PATH"));
        else df_hub_sp(p, sizeof p, "%s/token", h);
        FILE *f = fopen(p, "r");
        if (f) {
            if (fgets(o->token, sizeof o->token, f)) o->token[strcspn(o->token, "\r\n \t")] = 0;
            fclose(f);
        }
    }
    df_hub_cache_dir(o->cache, sizeof o->cache);
    const char *off = env("HF_HUB_OFFLINE");
    o->offline = off && (!strcmp(off, "1") || !strcasecmp(off, "true") || !strcasecmp(off, "yes") || !strcasecmp(off, "on"));
    o->connections = 8;
    o->retries = env("DELTAFIN_HUB_RETRIES") ? atoi(env("DELTAFIN_HUB_RETRIES")) : 10;
    o->backoff_ms = env("DELTAFIN_HUB_BACKOFF_MS") ? atoi(env("DELTAFIN_HUB_BACKOFF_MS")) : 500;
    o->stall_s = env("DELTAFIN_HUB_STALL_S") ? atoi(env("DELTAFIN_HUB_STALL_S")) : 30;
    o->chunk = env("DELTAFIN_HUB_CHUNK") ? df_parse_size(env("DELTAFIN_HUB_CHUNK")) : (int64_t)16 << 20;
    if (o->retries < 1) o->retries = 1;
    if (o->backoff_ms < 0) o->backoff_ms = 0;
    if (o->stall_s < 1) o->stall_s = 1;
    if (o->chunk < 4096) o->chunk = 4096;
}

/* ---- HTTP ------------------------------------------------------------------ */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static pthread_mutex_t net_mu = PTHREAD_MUTEX_INITIALIZER;
static df_hub_net net_total;
void df_hub_net_get(df_hub_net *n) {
    pthread_mutex_lock(&net_mu);
    *n = net_total;
    pthread_mutex_unlock(&net_mu);
}

typedef struct {
    long status;
    char location[4096], etag[160], linked_etag[160], commit[64], content_range[128], retry_after[64];
    int64_t linked_size, content_length;
} resp_hdrs;

static size_t on_header(char *b, size_t sz, size_t nm, void *p) {
    resp_hdrs *h = p;
    size_t n = sz * nm;
    char line[4200];
    size_t l = n < sizeof line - 1 ? n : sizeof line - 1;
    memcpy(line, b, l);
    line[l] = 0;
    line[strcspn(line, "\r\n")] = 0;
    if (!strncmp(line, "HTTP/", 5)) { /* a new response (after a 100 or a redirect): start over */
        memset(h, 0, sizeof *h);
        h->linked_size = h->content_length = -1;
        return n;
    }
    char *c = strchr(line, ':');
    if (!c) return n;
    *c = 0;
    char *v = c + 1;
    while (*v == ' ' || *v == '\t') v++;
#define H(name, field) if (!strcasecmp(line, name)) df_hub_sp(h->field, sizeof h->field, "%s", v);
    H("location", location) else H("etag", etag) else H("x-linked-etag", linked_etag) else H("x-repo-commit", commit)
    else H("content-range", content_range) else H("retry-after", retry_after)
    else if (!strcasecmp(line, "x-linked-size")) h->linked_size = strtoll(v, NULL, 10);
    else if (!strcasecmp(line, "content-length")) h->content_length = strtoll(v, NULL, 10);
#undef H
    return n;
}

static size_t to_buf(char *b, size_t sz, size_t nm, void *p) {
    df_buf *o = p;
    if (o->len + sz * nm > ((size_t)256 << 20)) return 0;
    df_buf_put(o, b, sz * nm);
    return sz * nm;
}

/* The origin (scheme://host[:port]) of a URL. */
static void origin(const char *url, char *o, size_t n) {
    const char *s = strstr(url, "://");
    const char *e = s ? strchr(s + 3, '/') : NULL;
    size_t l = e ? (size_t)(e - url) : strlen(url);
    if (l >= n) l = n - 1;
    memcpy(o, url, l);
    o[l] = 0;
}

/* The Authorization header goes to the hub's own host only (as huggingface_hub
 * does): never to the storage host a download is redirected to. */
static struct curl_slist *headers_for(const df_hub_opts *o, const char *url) {
    struct curl_slist *hl = curl_slist_append(NULL, "Accept-Encoding: identity");
    hl = curl_slist_append(hl, "User-Agent: deltafin/1; hf_hub-compatible");
    char a[1100], b[1100];
    origin(o->endpoint, a, sizeof a);
    origin(url, b, sizeof b);
    if (o->token[0] && !strcmp(a, b)) {
        char h[600];
        df_hub_sp(h, sizeof h, "Authorization: Bearer %s", o->token);
        hl = curl_slist_append(hl, h);
    }
    return hl;
}

static void setup_easy(CURL *c, const df_hub_opts *o, const char *url, struct curl_slist *hl, resp_hdrs *h) {
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)o->stall_s);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
    memset(h, 0, sizeof *h);
    h->linked_size = h->content_length = -1;
}

static void sleep_ms(double ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - (double)(time_t)(ms / 1000) * 1000) * 1e6)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* Backoff before attempt a (1-based retry count): base * 2^(a-1), at most 30 s, +-25% jitter; a 429's Retry-After wins. */
static void backoff(const df_hub_opts *o, int a, const resp_hdrs *h, unsigned *seed) {
    double ms = o->backoff_ms;
    for (int i = 1; i < a && ms < 30000; i++) ms *= 2;
    if (ms > 30000) ms = 30000;
    ms *= 0.75 + 0.5 * (rand_r(seed) / (double)RAND_MAX);
    if (h && h->status == 429 && h->retry_after[0]) {
        char *end;
        double s = strtod(h->retry_after, &end);
        if (end != h->retry_after && s >= 0) ms = (s > 120 ? 120 : s) * 1000; /* HTTP-date form: backoff as computed */
    }
    sleep_ms(ms);
}

static int retryable_status(long s) { return s == 408 || s == 429 || s >= 500; }

static const char *status_hint(long s) {
    return s == 401 ? " (unauthorized: set HF_TOKEN or log in with a token that can read this repo)"
         : s == 403 ? " (forbidden: a gated repo needs its terms accepted and HF_TOKEN)"
         : s == 404 ? " (no such repo, revision or file)" : "";
}

/* One request with retries: GET into body (HEAD when body is NULL). 0 or DF_EIO. */
static int request(const df_hub_opts *o, CURL *c, const char *url, df_buf *body, resp_hdrs *h, char *err, size_t errlen) {
    unsigned seed = (unsigned)(time(NULL) ^ (uintptr_t)h);
    char last[512] = "";
    for (int a = 0; a < o->retries; a++) {
        if (a) backoff(o, a, h, &seed);
        struct curl_slist *hl = headers_for(o, url);
        setup_easy(c, o, url, hl, h);
        if (body) {
            body->len = 0;
            curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_buf);
            curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
            curl_easy_setopt(c, CURLOPT_TIMEOUT, 300L);
        } else curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        CURLcode rc = curl_easy_perform(c);
        curl_slist_free_all(hl);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &h->status);
        pthread_mutex_lock(&net_mu);
        net_total.requests++;
        if (a) net_total.retries++;
        pthread_mutex_unlock(&net_mu);
        if (rc != CURLE_OK) { df_hub_sp(last, sizeof last, "%s", curl_easy_strerror(rc)); continue; }
        if (retryable_status(h->status)) { df_hub_sp(last, sizeof last, "HTTP %ld", h->status); continue; }
        if (h->status >= 400)
            return df_err(err, errlen, h->status == 401 || h->status == 403 || h->status == 404 ? DF_EINPUT : DF_EIO, "%s: HTTP %ld%s", url,
                          h->status, status_hint(h->status));
        return 0;
    }
    return df_err(err, errlen, DF_EIO, "%s: gave up after %d attempts (last: %s)", url, o->retries, last);
}

/* ---- the revision API ------------------------------------------------------ */

static void url_escape(const char *s, char *out, size_t n, int keep_slash) {
    size_t j = 0;
    for (; *s && j + 4 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (id_char((char)ch) || ch == '~' || (keep_slash && ch == '/')) out[j++] = (char)ch;
        else j += (size_t)df_hub_sp(out + j, n - j, "%%%02X", ch);
    }
    out[j] = 0;
}

static int safe_path(const char *p) {
    if (!*p || *p == '/' || strlen(p) > 1000) return 0;
    for (const char *s = p; *s; s++) if ((unsigned char)*s < 32 || *s == '\\') return 0;
    const char *s = p;
    while (s) { /* no "." / ".." components */
        const char *e = strchr(s, '/');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l == 0 || (l == 1 && s[0] == '.') || (l == 2 && s[0] == '.' && s[1] == '.')) return 0;
        s = e ? e + 1 : NULL;
    }
    return 1;
}

static int hexlen(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (; *s; s++) if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

int df_hub_revision(const df_hub_opts *o, const char *repo, const char *rev, df_hub_repo *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    df_hub_sp(r->repo, sizeof r->repo, "%s", repo);
    df_hub_sp(r->rev, sizeof r->rev, "%s", rev);
    if (o->offline)
        return df_err(err, errlen, DF_EINPUT, "HF_HUB_OFFLINE=1: cannot ask %s for %s@%s (the revision API is online only)", o->endpoint, repo, rev);
    pthread_once(&curl_once, curl_init);
    char url[2600], erev[600];
    url_escape(rev, erev, sizeof erev, 0);
    df_hub_sp(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", o->endpoint, repo, erev);
    CURL *c = curl_easy_init();
    df_buf b = {0};
    resp_hdrs h;
    int rc = request(o, c, url, &b, &h, err, errlen);
    curl_easy_cleanup(c);
    if (rc) { df_buf_free(&b); return rc; }
    rc = df_hub_parse_revision(b.p ? b.p : "", b.len, url, r, err, errlen);
    df_buf_free(&b);
    return rc;
}

/* The revision API's answer (untrusted network bytes) -> r (repo and rev set by the caller). */
int df_hub_parse_revision(const char *txt, size_t len, const char *url, df_hub_repo *r, char *err, size_t errlen) {
    json_error_t je;
    json_t *j = json_loadb(txt, len, 0, &je);
    if (!json_is_object(j)) { json_decref(j); return df_err(err, errlen, DF_EFORMAT, "%s: not a JSON object (%s)", url, je.text); }
    const char *sha = json_string_value(json_object_get(j, "sha"));
    json_t *sib = json_object_get(j, "siblings");
    if (!sha || !hexlen(sha, 40)) { json_decref(j); return df_err(err, errlen, DF_EFORMAT, "%s: field sha: expected a 40-hex commit", url); }
    if (!json_is_array(sib)) { json_decref(j); return df_err(err, errlen, DF_EFORMAT, "%s: field siblings: expected an array", url); }
    df_hub_sp(r->commit, sizeof r->commit, "%s", sha);
    r->files = df_xcalloc(json_array_size(sib) + 1, sizeof *r->files);
    size_t i;
    json_t *f;
    json_array_foreach(sib, i, f) {
        const char *p = json_string_value(json_object_get(f, "rfilename"));
        json_t *sz = json_object_get(f, "size"), *lfs = json_object_get(f, "lfs");
        const char *bid = json_string_value(json_object_get(f, "blobId"));
        if (!p || !safe_path(p) || !json_is_integer(sz) || json_integer_value(sz) < 0 || !bid || !hexlen(bid, 40)) {
            json_decref(j);
            df_hub_repo_free(r);
            return df_err(err, errlen, DF_EFORMAT, "%s: siblings[%zu]: expected rfilename (a relative path), size >= 0 and blobId (40 hex); "
                          "was the request made without ?blobs=true?", url, i);
        }
        df_hub_file *d = &r->files[r->n_files++];
        d->path = df_xstrdup(p);
        d->size = json_integer_value(sz);
        df_hub_sp(d->blob_id, sizeof d->blob_id, "%s", bid);
        if (json_is_object(lfs)) {
            const char *s256 = json_string_value(json_object_get(lfs, "sha256"));
            if (!s256 || !hexlen(s256, 64)) {
                json_decref(j);
                df_hub_repo_free(r);
                return df_err(err, errlen, DF_EFORMAT, "%s: siblings[%zu].lfs.sha256: expected 64 hex digits", url, i);
            }
            df_hub_sp(d->sha256, sizeof d->sha256, "%s", s256);
            json_t *ls = json_object_get(lfs, "size"); /* the file's size (size is the pointer's then) */
            if (ls && (!json_is_integer(ls) || json_integer_value(ls) < 0)) {
                json_decref(j);
                df_hub_repo_free(r);
                return df_err(err, errlen, DF_EFORMAT, "%s: siblings[%zu].lfs.size: expected an integer >= 0", url, i);
            }
            if (ls) d->size = json_integer_value(ls);
        }
    }
    json_decref(j);
    return 0;
}

void df_hub_repo_free(df_hub_repo *r) {
    for (int i = 0; i < r->n_files; i++) free(r->files[i].path);
    free(r->files);
    r->files = NULL;
    r->n_files = 0;
}

/* ---- remote files ------------------------------------------------------------ */

struct df_hub_remote {
    char url[4096];       /* where the bytes are (the storage host after a redirect) */
    char etag[160];
    char commit[64];
    int64_t size;
    char name[1024];      /* for messages */
    char repo[256], rev[64], path[1024]; /* to resolve it again (a signed storage URL that expired) */
    pthread_mutex_t mu;   /* url may be replaced while ranges are in flight */
};

static void unquote_etag(const char *in, char *out, size_t n) {
    if (!strncmp(in, "W/", 2)) in += 2;
    while (*in == '"') in++;
    df_hub_sp(out, n, "%s", in);
    size_t l = strlen(out);
    while (l && out[l - 1] == '"') out[--l] = 0;
}

df_hub_remote *df_hub_remote_open(const df_hub_opts *o, const char *repo, const char *commit, const char *path, char *err, size_t errlen) {
    if (o->offline) {
        df_err(err, errlen, DF_EINPUT, "HF_HUB_OFFLINE=1: %s of %s@%s is not in the hub cache", path, repo, commit);
        return NULL;
    }
    pthread_once(&curl_once, curl_init);
    char url[4096], ep[2048], erev[200];
    url_escape(path, ep, sizeof ep, 1);
    url_escape(commit, erev, sizeof erev, 0);
    df_hub_sp(url, sizeof url, "%s/%s/resolve/%s/%s", o->endpoint, repo, erev, ep);
    CURL *c = curl_easy_init();
    resp_hdrs h;
    df_hub_remote *rm = NULL;
    for (int hop = 0; hop < 10; hop++) {
        if (request(o, c, url, NULL, &h, err, errlen)) break;
        if (h.status >= 300 && h.status < 400 && h.location[0] == '/') { /* relative redirect (a renamed repo): follow on the hub */
            char org[1100];
            origin(o->endpoint, org, sizeof org);
            df_hub_sp(url, sizeof url, "%s%s", org, h.location);
            continue;
        }
        rm = df_xcalloc(1, sizeof *rm);
        pthread_mutex_init(&rm->mu, NULL);
        df_hub_sp(rm->repo, sizeof rm->repo, "%s", repo);
        df_hub_sp(rm->rev, sizeof rm->rev, "%s", commit);
        df_hub_sp(rm->path, sizeof rm->path, "%s", path);
        df_hub_sp(rm->name, sizeof rm->name, "%s/%s", repo, path);
        unquote_etag(h.linked_etag[0] ? h.linked_etag : h.etag, rm->etag, sizeof rm->etag);
        df_hub_sp(rm->commit, sizeof rm->commit, "%s", h.commit);
        rm->size = h.linked_size >= 0 ? h.linked_size : h.status < 300 ? h.content_length : -1;
        df_hub_sp(rm->url, sizeof rm->url, "%s", h.status >= 300 && h.status < 400 && h.location[0] ? h.location : url);
        if (!rm->etag[0] || rm->size < 0 || strchr(rm->etag, '/') || strstr(rm->etag, "..")) {
            df_err(err, errlen, DF_EFORMAT, "%s: HEAD gave no usable ETag/X-Linked-Etag (%s) or size (X-Linked-Size / Content-Length)", url,
                   rm->etag[0] ? rm->etag : "none");
            free(rm);
            rm = NULL;
        }
        break;
    }
    if (!rm && !err[0]) df_err(err, errlen, DF_EIO, "%s: too many redirects", url);
    curl_easy_cleanup(c);
    return rm;
}
void df_hub_remote_free(df_hub_remote *rm) {
    if (!rm) return;
    pthread_mutex_destroy(&rm->mu);
    free(rm);
}

/* A storage host answered 401/403 to a URL the hub gave: signed URLs expire
 * (a large download can outlive one), so ask the hub again, once per URL.
 * 1 if the URL was replaced (or already had been by another connection). */
static int refresh_location(const df_hub_opts *o, df_hub_remote *rm, const char *used) {
    char a[1100], b[1100];
    origin(o->endpoint, a, sizeof a);
    origin(used, b, sizeof b);
    if (!strcmp(a, b)) return 0; /* the hub itself refused: not an expired URL */
    pthread_mutex_lock(&rm->mu);
    int ok = strcmp(rm->url, used) != 0;
    if (!ok) {
        char err[512];
        df_hub_remote *n = df_hub_remote_open(o, rm->repo, rm->rev, rm->path, err, sizeof err);
        if (n && !strcmp(n->etag, rm->etag) && n->size == rm->size) {
            df_hub_sp(rm->url, sizeof rm->url, "%s", n->url);
            ok = 1;
        }
        df_hub_remote_free(n);
    }
    pthread_mutex_unlock(&rm->mu);
    return ok;
}
int64_t df_hub_remote_size(const df_hub_remote *rm) { return rm->size; }

/* ---- ranges over parallel connections ------------------------------------- */

typedef struct {
    const df_hub_opts *o;
    df_hub_remote *const *remotes;
    const df_hub_range *rg;
    int n, next, failed;
    unsigned char *done;
    void (*on_done)(void *, int);
    void *ctx;
    pthread_mutex_t mu;
    df_progress pg;
    char err[1024];
} fetch_job;

typedef struct {
    fetch_job *j;
    const df_hub_range *r;
    uint64_t got;       /* bytes of the range written so far */
    uint64_t want_from; /* the offset asked for in this attempt */
    int checked;        /* the response's status and headers were checked */
    char why[256];      /* why an attempt was abandoned */
    resp_hdrs h;
    CURL *c;
} xfer;

static size_t on_data(char *b, size_t sz, size_t nm, void *p) {
    xfer *x = p;
    size_t n = sz * nm;
    if (!x->checked) {
        long st = 0;
        curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &st);
        uint64_t rest = x->r->len - x->got;
        unsigned long long a = 0, e = 0, tot = 0;
        if (st == 206) {
            if (sscanf(x->h.content_range, "bytes %llu-%llu/%llu", &a, &e, &tot) < 2 || a != x->want_from || e != x->want_from + rest - 1) {
                df_hub_sp(x->why, sizeof x->why, "Content-Range '%s' does not match the bytes asked for (%llu-%llu)", x->h.content_range,
                         (unsigned long long)x->want_from, (unsigned long long)(x->want_from + rest - 1));
                return 0;
            }
        } else if (st >= 300) {
            snprintf(x->why, sizeof x->why, "HTTP %ld", st);
            return 0;
        } else if (!(st == 200 && x->want_from == 0 && (int64_t)rest == x->h.content_length)) {
            df_hub_sp(x->why, sizeof x->why, "HTTP %ld to a range request", st);
            return 0;
        }
        if (x->h.content_length >= 0 && (uint64_t)x->h.content_length != rest) {
            df_hub_sp(x->why, sizeof x->why, "Content-Length %lld, expected %llu", (long long)x->h.content_length, (unsigned long long)rest);
            return 0;
        }
        x->checked = 1;
    }
    if (x->got + n > x->r->len) { df_hub_sp(x->why, sizeof x->why, "the server sent more bytes than asked for"); return 0; }
    size_t w = 0;
    while (w < n) {
        ssize_t k = pwrite(x->r->fd, b + w, n - w, (off_t)(x->r->off + x->got + w));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { df_hub_sp(x->why, sizeof x->why, "write failed: %s", strerror(errno)); return 0; }
        w += (size_t)k;
    }
    x->got += n;
    pthread_mutex_lock(&x->j->mu);
    df_progress_add(&x->j->pg, (int64_t)n, 0);
    pthread_mutex_unlock(&x->j->mu);
    pthread_mutex_lock(&net_mu);
    net_total.bytes += (int64_t)n;
    pthread_mutex_unlock(&net_mu);
    return n;
}

/* One range, retried: resumes from the bytes already written on each attempt. */
static int fetch_one(fetch_job *j, CURL *c, int i, char *err, size_t errlen) {
    const df_hub_opts *o = j->o;
    const df_hub_range *r = &j->rg[i];
    df_hub_remote *rm = j->remotes[r->file];
    char url[4096];
    int refreshed = 0;
    xfer x = {.j = j, .r = r, .c = c};
    unsigned seed = (unsigned)(i * 7919 + time(NULL));
    char last[300] = "";
    for (int a = 0; a < o->retries && !j->failed; a++) {
        if (a) backoff(o, a, &x.h, &seed);
        if (x.got == r->len) break;
        pthread_mutex_lock(&rm->mu);
        df_hub_sp(url, sizeof url, "%s", rm->url);
        pthread_mutex_unlock(&rm->mu);
        struct curl_slist *hl = headers_for(o, url);
        setup_easy(c, o, url, hl, &x.h);
        char range[96];
        x.want_from = r->off + x.got;
        x.checked = 0;
        x.why[0] = 0;
        df_hub_sp(range, sizeof range, "%llu-%llu", (unsigned long long)x.want_from, (unsigned long long)(r->off + r->len - 1));
        curl_easy_setopt(c, CURLOPT_RANGE, range);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
        uint64_t before = x.got;
        double t0 = df_now();
        CURLcode rc = curl_easy_perform(c);
        double dt = df_now() - t0;
        curl_slist_free_all(hl);
        long st = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
        x.h.status = st;
        pthread_mutex_lock(&net_mu);
        net_total.requests++;
        net_total.seconds += dt;
        if (a) net_total.retries++;
        pthread_mutex_unlock(&net_mu);
        if (x.why[0] && !x.checked) x.got = before; /* nothing of this response was kept */
        if (rc == CURLE_OK && x.got == r->len) return 0;
        if ((st == 401 || st == 403) && refreshed < 3 && refresh_location(o, rm, url)) {
            refreshed++;
            fprintf(stderr, "deltafin: hub: %s: the storage URL was refused (HTTP %ld): resolved it again; retrying\n", rm->name, st);
            a--; /* not a failed attempt */
            continue;
        }
        if (st >= 400 && !retryable_status(st))
            return df_err(err, errlen, DF_EIO, "%s: bytes %llu-%llu: HTTP %ld%s", rm->name, (unsigned long long)r->off,
                          (unsigned long long)(r->off + r->len - 1), st, status_hint(st));
        if (x.why[0]) df_hub_sp(last, sizeof last, "%s", x.why);
        else if (rc != CURLE_OK) df_hub_sp(last, sizeof last, "%s (%llu of %llu bytes)", curl_easy_strerror(rc), (unsigned long long)x.got,
                                          (unsigned long long)r->len);
        else if (retryable_status(st)) df_hub_sp(last, sizeof last, "HTTP %ld", st);
        else df_hub_sp(last, sizeof last, "short read: %llu of %llu bytes", (unsigned long long)x.got, (unsigned long long)r->len);
        if (a + 1 >= o->retries || j->failed) break;
        if (j->pg.on) fprintf(stderr, "\n");
        fprintf(stderr, "deltafin: hub: %s bytes %llu-%llu: %s; retrying (%d of %d)\n", rm->name, (unsigned long long)r->off,
                (unsigned long long)(r->off + r->len - 1), last, a + 1, o->retries - 1);
    }
    if (x.got == r->len) return 0;
    if (j->failed) return DF_EIO;
    return df_err(err, errlen, DF_EIO, "%s: bytes %llu-%llu: gave up after %d attempts (last: %s)", rm->name, (unsigned long long)r->off,
                  (unsigned long long)(r->off + r->len - 1), o->retries, last);
}

/* Idle curl handles kept between calls, so connections are reused across
 * fetches (stream mode fetches a layer's experts at a time). */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static CURL *pool[64];
static int n_pool;
static CURL *handle_get(void) {
    CURL *c = NULL;
    pthread_mutex_lock(&pool_mu);
    if (n_pool) c = pool[--n_pool];
    pthread_mutex_unlock(&pool_mu);
    return c ? c : curl_easy_init();
}
static void handle_put(CURL *c) {
    pthread_mutex_lock(&pool_mu);
    if (n_pool < 64) pool[n_pool++] = c, c = NULL;
    pthread_mutex_unlock(&pool_mu);
    if (c) curl_easy_cleanup(c);
}

static void *fetch_worker(void *p) {
    fetch_job *j = p;
    CURL *c = handle_get();
    char err[1024];
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int i = -1;
        while (!j->failed && j->next < j->n && (i = j->next++) >= 0 && j->done && j->done[i]) i = -1;
        pthread_mutex_unlock(&j->mu);
        if (i < 0) break;
        err[0] = 0;
        int rc = fetch_one(j, c, i, err, sizeof err);
        if (!rc && j->on_done && fdatasync(j->rg[i].fd)) /* durable before it is logged as done */ rc = df_err(err, sizeof err, DF_EIO, "%s: fdatasync: %s", j->remotes[j->rg[i].file]->name, strerror(errno));
        pthread_mutex_lock(&j->mu);
        if (rc) {
            if (!j->failed) df_hub_sp(j->err, sizeof j->err, "%s", err);
            j->failed = 1;
        } else {
            if (j->done) j->done[i] = 1;
            if (j->on_done) j->on_done(j->ctx, i);
        }
        pthread_mutex_unlock(&j->mu);
    }
    handle_put(c);
    return NULL;
}

int df_hub_fetch_ranges(const df_hub_opts *o, df_hub_remote *const *remotes, const df_hub_range *rg, int n, unsigned char *done,
                        void (*on_done)(void *ctx, int i), void *ctx, char *err, size_t errlen) {
    pthread_once(&curl_once, curl_init);
    fetch_job j = {.o = o, .remotes = remotes, .rg = rg, .n = n, .done = done, .on_done = on_done, .ctx = ctx};
    pthread_mutex_init(&j.mu, NULL);
    int64_t total = 0, have = 0;
    for (int i = 0; i < n; i++) {
        total += (int64_t)rg[i].len;
        if (done && done[i]) have += (int64_t)rg[i].len;
    }
    df_progress_init(&j.pg, "fetch", total, o->progress && total >= (1 << 20));
    j.pg.done = have;
    int nt = o->connections < 1 ? 1 : o->connections > 64 ? 64 : o->connections;
    if (nt > n) nt = n;
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < nt; t++)
        if (!pthread_create(&th[t], NULL, fetch_worker, &j)) started = t;
    fetch_worker(&j);
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
    if (!j.failed && n) df_progress_add(&j.pg, 0, 1);
    else if (j.pg.on) fputc('\n', stderr);
    pthread_mutex_destroy(&j.mu);
    if (j.failed) return df_err(err, errlen, DF_EIO, "%s", j.err);
    if (!on_done) /* one fdatasync per file at the end */
        for (int i = 0; i < n; i++) {
            int seen = 0;
            for (int q = 0; q < i && !seen; q++) seen = rg[q].fd == rg[i].fd;
            if (!seen && fdatasync(rg[i].fd)) return df_err(err, errlen, DF_EIO, "%s: fdatasync: %s", remotes[rg[i].file]->name, strerror(errno));
        }
    return 0;
}

/* ---- whole files into the cache --------------------------------------------- */

static int hash_file(const char *path, int git_blob, int64_t size, char *hex, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return df_err(err, errlen, DF_EIO, "%s: %s", path, strerror(errno));
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, git_blob ? EVP_sha1() : EVP_sha256(), NULL);
    if (git_blob) {
        char hdr[64];
        int l = df_hub_sp(hdr, sizeof hdr, "blob %lld", (long long)size);
        EVP_DigestUpdate(c, hdr, (size_t)l + 1);
    }
    unsigned char *buf = df_xmalloc(1 << 20), md[64];
    ssize_t k;
    while ((k = read(fd, buf, 1 << 20)) > 0) EVP_DigestUpdate(c, buf, (size_t)k);
    int rerr = k < 0;
    close(fd);
    free(buf);
    unsigned ml = 0;
    EVP_DigestFinal_ex(c, md, &ml);
    EVP_MD_CTX_free(c);
    if (rerr) return df_err(err, errlen, DF_EIO, "%s: read failed", path);
    for (unsigned i = 0; i < ml; i++) df_hub_sp(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* snapshots/COMMIT/PATH -> ../../blobs/ETAG (one more ../ per directory in PATH), made atomically. */
static int link_snapshot(const char *rdir, const char *commit, const char *path, const char *etag, char *err, size_t errlen) {
    char lp[4200], tgt[4200], tmp[4300];
    df_hub_sp(lp, sizeof lp, "%s/snapshots/%s/%s", rdir, commit, path);
    char *slash = strrchr(lp, '/');
    *slash = 0;
    if (df_mkdirs(lp)) return df_err(err, errlen, DF_EIO, "%s: cannot create: %s", lp, strerror(errno));
    *slash = '/';
    size_t j = 0;
    j += (size_t)df_hub_sp(tgt + j, sizeof tgt - j, "../../");
    for (const char *s = path; *s; s++) if (*s == '/') j += (size_t)df_hub_sp(tgt + j, sizeof tgt - j, "../");
    df_hub_sp(tgt + j, sizeof tgt - j, "blobs/%s", etag);
    df_hub_sp(tmp, sizeof tmp, "%s.deltafin-link.%d", lp, (int)getpid());
    unlink(tmp);
    if (symlink(tgt, tmp) || rename(tmp, lp)) {
        unlink(tmp);
        return df_err(err, errlen, DF_EIO, "%s: cannot create the link: %s", lp, strerror(errno));
    }
    return 0;
}

int df_hub_write_file(const char *path, const char *text, char *err, size_t errlen) {
    char tmp[4300];
    df_hub_sp(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    char *slash = strrchr(tmp, '/');
    if (slash) { *slash = 0; df_mkdirs(tmp); *slash = '/'; }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return df_err(err, errlen, DF_EIO, "%s: %s", tmp, strerror(errno));
    size_t l = strlen(text);
    int bad = write(fd, text, l) != (ssize_t)l || fsync(fd);
    close(fd);
    if (bad || rename(tmp, path)) { unlink(tmp); return df_err(err, errlen, DF_EIO, "%s: cannot write: %s", path, strerror(errno)); }
    return 0;
}

void df_hub_log_range_done(void *ctx, int i) {
    const int fd = *(const int *)ctx;
    char line[32];
    int l = df_hub_sp(line, sizeof line, "%d\n", i);
    if (write(fd, line, (size_t)l) == l) (void)fdatasync(fd);
}

/* Downloads one file to blobs/ETAG through ETAG.incomplete (ranges of o->chunk
 * bytes, the finished ones listed in ETAG.incomplete.done, so a killed run
 * resumes); renamed to its blob name only after its hash matched. */
static int fetch_blob(const df_hub_opts *o, const char *rdir, const df_hub_repo *r, const df_hub_file *f, char *etag_out, char *err, size_t errlen) {
    df_hub_remote *rm = df_hub_remote_open(o, r->repo, r->commit, f->path, err, errlen);
    if (!rm) return DF_EIO;
    const char *want = f->sha256[0] ? f->sha256 : f->blob_id;
    int rc = 0, lockfd = -1; /* the partial file, held (and locked) until it has its blob name */
    if (strcmp(rm->etag, want) || rm->size != f->size) {
        rc = df_err(err, errlen, DF_EFORMAT, "%s: HEAD says etag %s size %lld, the revision API %s size %lld", rm->name, rm->etag,
                    (long long)rm->size, want, (long long)f->size);
        goto out;
    }
    if (rm->commit[0] && strcmp(rm->commit, r->commit)) {
        rc = df_err(err, errlen, DF_EFORMAT, "%s: X-Repo-Commit %s, expected %s", rm->name, rm->commit, r->commit);
        goto out;
    }
    char blob[4300], part[4400], log[4500];
    df_hub_sp(blob, sizeof blob, "%s/blobs/%s", rdir, rm->etag);
    df_hub_sp(part, sizeof part, "%s.incomplete", blob);
    df_hub_sp(log, sizeof log, "%s.incomplete.done", blob);
    df_hub_sp(etag_out, 160, "%s", rm->etag);
    int64_t n = f->size == 0 ? 0 : (f->size + o->chunk - 1) / o->chunk;
    unsigned char *done = df_xcalloc((size_t)n + 1, 1);
    /* one process per partial file: another deltafin downloading the same blob is waited for */
    int fd = -1;
    for (int tries = 0; tries < 100; tries++) {
        fd = open(part, O_RDWR | O_CREAT, 0644);
        if (fd < 0) break;
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            fprintf(stderr, "deltafin setup: %s: another process is downloading it; waiting\n", f->path);
            if (flock(fd, LOCK_EX)) { close(fd); fd = -1; errno = EIO; break; }
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(part, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) break;
        close(fd); /* the other process renamed or removed it meanwhile */
        fd = -1;
        if (stat(blob, &b) == 0 && b.st_size == f->size) { free(done); goto out; } /* it finished: nothing to do */
    }
    if (fd < 0) { rc = df_err(err, errlen, DF_EIO, "%s: %s", part, strerror(errno)); free(done); goto out; }
    lockfd = fd;
    /* what a killed run finished: the chunks its log lists (a torn last line is ignored) */
    struct stat ps;
    FILE *lf = df_file_exists(log) && fstat(fd, &ps) == 0 && ps.st_size == f->size ? fopen(log, "r") : NULL;
    int resumed = 0;
    if (lf) {
        char line[64];
        while (fgets(line, sizeof line, lf)) {
            if (!strchr(line, '\n')) break;
            long v = strtol(line, NULL, 10);
            if (v >= 0 && v < n && !done[v]) { done[v] = 1; resumed++; }
        }
        fclose(lf);
    } else if (ftruncate(fd, 0) || ftruncate(fd, f->size)) {
        rc = df_err(err, errlen, DF_EIO, "%s: cannot size to %lld bytes: %s", part, (long long)f->size, strerror(errno));
    }
    if (!lf) unlink(log);
    int dl_fd = rc ? -1 : open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (!rc && dl_fd < 0) rc = df_err(err, errlen, DF_EIO, "%s: %s", log, strerror(errno));
    if (!rc && resumed) fprintf(stderr, "deltafin setup: %s: resuming (%d of %lld ranges already here)\n", f->path, resumed, (long long)n);
    if (!rc) {
        df_hub_range *rg = df_xcalloc((size_t)n + 1, sizeof *rg);
        for (int64_t i = 0; i < n; i++) {
            rg[i].file = 0, rg[i].fd = fd, rg[i].off = (uint64_t)(i * o->chunk);
            rg[i].len = (uint64_t)((i + 1) * o->chunk > f->size ? f->size - i * o->chunk : o->chunk);
        }
        df_hub_remote *rms[1] = {rm};
        if (o->progress && f->size >= (1 << 20)) fprintf(stderr, "deltafin setup: %s (%.1f MB)\n", f->path, f->size / 1e6);
        rc = df_hub_fetch_ranges(o, rms, rg, (int)n, done, df_hub_log_range_done, &dl_fd, err, errlen);
        free(rg);
    }
    if (dl_fd >= 0) close(dl_fd);
    if (!rc && fsync(fd)) rc = df_err(err, errlen, DF_EIO, "%s: fsync: %s", part, strerror(errno));
    free(done);
    if (rc) goto out;
    char hex[160];
    if ((rc = hash_file(part, !f->sha256[0], f->size, hex, err, errlen))) goto out;
    if (strcmp(hex, want)) {
        /* start over next time: a wrong byte cannot be located */
        unlink(log);
        unlink(part);
        rc = df_err(err, errlen, DF_EIO, "%s: %s %s after download, expected %s (the partial file was removed)", rm->name,
                    f->sha256[0] ? "sha256" : "git blob sha1", hex, want);
        goto out;
    }
    if (rename(part, blob)) { rc = df_err(err, errlen, DF_EIO, "%s: cannot rename into place: %s", blob, strerror(errno)); goto out; }
    unlink(log);
out:
    if (lockfd >= 0) close(lockfd);
    df_hub_remote_free(rm);
    return rc;
}

int df_hub_fetch_files(const df_hub_opts *o, const df_hub_repo *r, int (*want)(const char *path), int *downloaded, char *err, size_t errlen) {
    char rdir[4096], p[4300];
    df_hub_repo_dir(o->cache, r->repo, rdir, sizeof rdir);
    df_hub_sp(p, sizeof p, "%s/blobs", rdir);
    if (df_mkdirs(p)) return df_err(err, errlen, DF_EIO, "%s: cannot create: %s", p, strerror(errno));
    df_hub_sp(p, sizeof p, "%s/snapshots/%s", rdir, r->commit);
    if (df_mkdirs(p)) return df_err(err, errlen, DF_EIO, "%s: cannot create: %s", p, strerror(errno));
    *downloaded = 0;
    for (int i = 0; i < r->n_files; i++) {
        const df_hub_file *f = &r->files[i];
        if (want && !want(f->path)) continue;
        const char *etag = f->sha256[0] ? f->sha256 : f->blob_id;
        char lp[4300], blob[4300];
        struct stat st;
        df_hub_sp(lp, sizeof lp, "%s/snapshots/%s/%s", rdir, r->commit, f->path);
        df_hub_sp(blob, sizeof blob, "%s/blobs/%s", rdir, etag);
        if (stat(lp, &st) == 0 && st.st_size == f->size) continue; /* already in the snapshot (ours or huggingface_hub's) */
        if (!(stat(blob, &st) == 0 && st.st_size == f->size)) { /* a blob shared with another revision is linked, not fetched */
            char got[160];
            int rc = fetch_blob(o, rdir, r, f, got, err, errlen);
            if (rc) return rc;
            etag = got;
            (*downloaded)++;
            int lrc = link_snapshot(rdir, r->commit, f->path, got, err, errlen);
            if (lrc) return lrc;
            continue;
        }
        int rc = link_snapshot(rdir, r->commit, f->path, etag, err, errlen);
        if (rc) return rc;
    }
    if (strcmp(r->rev, r->commit)) {
        char line[64];
        df_hub_sp(p, sizeof p, "%s/refs/%s", rdir, r->rev);
        df_hub_sp(line, sizeof line, "%s", r->commit);
        return df_hub_write_file(p, line, err, errlen);
    }
    return 0;
}
