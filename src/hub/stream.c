/* stream.c - setup --stream: a stream directory beside the hub cache's
 * snapshots (hub.h), and the runtime's view of it: which remote file a shard
 * is, and fetching byte ranges of shards into the sparse local copies. */
#include "hub/hub.h"
#include "deltafin.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* The parts a streamed expert is read in (as the store's manifest lists
 * them); small per-expert metadata such as INT4's weight_shape is read at
 * load and so stays resident. */
int df_hub_is_expert_tensor(const char *name) {
    static const char *const parts[] = {"weight", "weight_packed", "weight_scale", "weight_scale_inv"};
    const char *last = strrchr(name, '.');
    int part = 0;
    for (size_t i = 0; last && i < sizeof parts / sizeof *parts; i++) part |= !strcmp(last + 1, parts[i]);
    if (!part) return 0;
    for (const char *p = strstr(name, ".experts."); p; p = strstr(p + 1, ".experts.")) {
        const char *d = p + 9;
        if (*d < '0' || *d > '9') continue;
        while (*d >= '0' && *d <= '9') d++;
        if (*d == '.') return 1;
    }
    return 0;
}

static int ends_with(const char *s, const char *e) {
    size_t a = strlen(s), b = strlen(e);
    return a >= b && !strcmp(s + a - b, e);
}
static int is_shard(const char *p) { return ends_with(p, ".safetensors") && !strchr(p, '/'); }
/* Whole files in stream mode: what the model directory's loader reads (top
 * level) except weights; subfolders (original/, onnx/, ...) are left out. */
static int small_file(const char *p) {
    if (strchr(p, '/')) return 0;
    static const char *const w[] = {".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt", ".ot", ".pkl", ".npz"};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) if (ends_with(p, w[i])) return 0;
    return 1;
}

/* One shard: sparse local copy, header, resident tensors. */
static int stream_shard(const df_hub_opts *o, const df_hub_repo *r, const df_hub_file *f, const char *sdir, char *err, size_t errlen) {
    df_hub_remote *rm = df_hub_remote_open(o, r->repo, r->commit, f->path, err, errlen);
    if (!rm) return DF_EIO;
    int rc = 0, fd = -1, lfd = -1;
    char path[4400], logp[4500];
    unsigned char *done = NULL;
    df_hub_range *rg = NULL;
    char *hdr = NULL;
    json_t *j = NULL;
    int64_t size = df_hub_remote_size(rm);
    if (size != f->size) { rc = df_err(err, errlen, DF_EFORMAT, "%s: HEAD says %lld bytes, the revision API %lld", f->path, (long long)size, (long long)f->size); goto out; }
    df_hub_sp(path, sizeof path, "%s/%s", sdir, f->path);
    df_hub_sp(logp, sizeof logp, "%s/%s.resident.done", sdir, f->path);
    fd = open(path, O_RDWR | O_CREAT, 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) { rc = df_err(err, errlen, DF_EIO, "%s: %s", path, strerror(errno)); goto out; }
    int resume = st.st_size == size && df_file_exists(logp);
    if (!resume && (ftruncate(fd, 0) || ftruncate(fd, size))) {
        rc = df_err(err, errlen, DF_EIO, "%s: cannot size to %lld bytes: %s", path, (long long)size, strerror(errno));
        goto out;
    }
    if (size < 8) { rc = df_err(err, errlen, DF_EFORMAT, "%s: %lld bytes, too small for a safetensors file", f->path, (long long)size); goto out; }
    /* the header: its length, then the JSON */
    df_hub_remote *rms[1] = {rm};
    df_hub_range h8 = {0, 0, 8, fd};
    if ((rc = df_hub_fetch_ranges(o, rms, &h8, 1, NULL, NULL, NULL, err, errlen))) goto out;
    uint8_t lb[8];
    if (pread(fd, lb, 8, 0) != 8) { rc = df_err(err, errlen, DF_EIO, "%s: read back failed", path); goto out; }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | lb[i];
    if (hl == 0 || hl > ((uint64_t)100 << 20) || 8 + hl > (uint64_t)size) {
        rc = df_err(err, errlen, DF_EFORMAT, "%s: header length %llu, expected 1..min(100 MB, file size - 8 = %lld)", f->path, (unsigned long long)hl,
                    (long long)size - 8);
        goto out;
    }
    df_hub_range hr = {0, 8, hl, fd};
    if ((rc = df_hub_fetch_ranges(o, rms, &hr, 1, NULL, NULL, NULL, err, errlen))) goto out;
    hdr = df_xmalloc(hl + 1);
    if (pread(fd, hdr, hl, 8) != (ssize_t)hl) { rc = df_err(err, errlen, DF_EIO, "%s: read back failed", path); goto out; }
    hdr[hl] = 0;
    json_error_t je;
    j = json_loadb(hdr, hl, 0, &je);
    if (!json_is_object(j)) { rc = df_err(err, errlen, DF_EFORMAT, "%s: header: not a JSON object (%s)", f->path, je.text); goto out; }
    /* resident tensors: data offsets sorted, adjacent ones merged, cut into chunks */
    size_t nt = json_object_size(j), nr = 0;
    uint64_t(*iv)[2] = df_xcalloc(nt + 1, sizeof *iv);
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        if (!strcmp(k, "__metadata__") || df_hub_is_expert_tensor(k)) continue;
        json_t *d = json_object_get(v, "data_offsets");
        if (!json_is_array(d) || json_array_size(d) != 2 || !json_is_integer(json_array_get(d, 0)) || !json_is_integer(json_array_get(d, 1))) {
            free(iv);
            rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': data_offsets: expected [begin, end]", f->path, k);
            goto out;
        }
        json_int_t a = json_integer_value(json_array_get(d, 0)), b = json_integer_value(json_array_get(d, 1));
        if (a < 0 || b < a || (uint64_t)b > (uint64_t)size - 8 - hl) {
            free(iv);
            rc = df_err(err, errlen, DF_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] outside the data section (%lld bytes)", f->path, k,
                        (long long)a, (long long)b, (long long)(size - 8 - (int64_t)hl));
            goto out;
        }
        if (b > a) { iv[nr][0] = 8 + hl + (uint64_t)a; iv[nr][1] = 8 + hl + (uint64_t)b; nr++; }
    }
    for (size_t x = 1; x < nr; x++) /* insertion sort: headers hold thousands of tensors at most */
        for (size_t y = x; y > 0 && iv[y - 1][0] > iv[y][0]; y--) {
            uint64_t t0 = iv[y][0], t1 = iv[y][1];
            iv[y][0] = iv[y - 1][0], iv[y][1] = iv[y - 1][1], iv[y - 1][0] = t0, iv[y - 1][1] = t1;
        }
    size_t cap = 16, n = 0;
    rg = df_xcalloc(cap, sizeof *rg);
    for (size_t x = 0; x < nr;) {
        uint64_t a = iv[x][0], b = iv[x][1];
        for (x++; x < nr && iv[x][0] <= b; x++) if (iv[x][1] > b) b = iv[x][1];
        for (uint64_t c = a; c < b; c += (uint64_t)o->chunk) {
            if (n == cap) rg = df_xrealloc(rg, (cap *= 2) * sizeof *rg);
            rg[n++] = (df_hub_range){0, c, b - c < (uint64_t)o->chunk ? b - c : (uint64_t)o->chunk, fd};
        }
    }
    free(iv);
    done = df_xcalloc(n + 1, 1);
    if (resume) {
        FILE *lf = fopen(logp, "r");
        char line[64];
        while (lf && fgets(line, sizeof line, lf)) {
            if (!strchr(line, '\n')) break;
            long i = strtol(line, NULL, 10);
            if (i >= 0 && (size_t)i < n) done[i] = 1;
        }
        if (lf) fclose(lf);
    }
    lfd = open(logp, O_WRONLY | O_CREAT | O_APPEND | (resume ? 0 : O_TRUNC), 0644);
    if (lfd < 0) { rc = df_err(err, errlen, DF_EIO, "%s: %s", logp, strerror(errno)); goto out; }
    if (o->progress && size >= (1 << 20)) fprintf(stderr, "deltafin setup: %s: header and resident tensors\n", f->path);
    rc = df_hub_fetch_ranges(o, rms, rg, (int)n, done, df_hub_log_range_done, &lfd, err, errlen);
out:
    if (lfd >= 0) close(lfd);
    if (fd >= 0) close(fd);
    json_decref(j);
    free(hdr);
    free(rg);
    free(done);
    df_hub_remote_free(rm);
    return rc;
}

int df_hub_stream_setup(const df_hub_opts *o, const df_hub_repo *r, int64_t disk, int *downloaded, char *dir, size_t dn, char *err, size_t errlen) {
    int rc = df_hub_fetch_files(o, r, small_file, downloaded, err, errlen);
    if (rc) return rc;
    char rdir[4096], sdir[4400], p[4600], tgt[4600];
    df_hub_repo_dir(o->cache, r->repo, rdir, sizeof rdir);
    df_hub_sp(sdir, sizeof sdir, "%s/deltafin-stream/%s", rdir, r->commit);
    if (df_mkdirs(sdir)) return df_err(err, errlen, DF_EIO, "%s: cannot create: %s", sdir, strerror(errno));
    df_hub_sp(dir, dn, "%s", sdir);
    df_hub_sp(p, sizeof p, "%s/stream.json", sdir);
    unlink(p); /* not complete until written again below */
    json_t *shards = json_array();
    for (int i = 0; i < r->n_files; i++) {
        const df_hub_file *f = &r->files[i];
        if (small_file(f->path)) { /* a link to the snapshot's file (one more ../ per directory in the path) */
            df_hub_sp(p, sizeof p, "%s/%s", sdir, f->path);
            char *slash = strrchr(p, '/');
            *slash = 0;
            df_mkdirs(p);
            *slash = '/';
            size_t jn = (size_t)df_hub_sp(tgt, sizeof tgt, "../../");
            for (const char *s = f->path; *s; s++) if (*s == '/') jn += (size_t)df_hub_sp(tgt + jn, sizeof tgt - jn, "../");
            df_hub_sp(tgt + jn, sizeof tgt - jn, "snapshots/%s/%s", r->commit, f->path);
            unlink(p);
            if (symlink(tgt, p)) { json_decref(shards); return df_err(err, errlen, DF_EIO, "%s: cannot link: %s", p, strerror(errno)); }
            continue;
        }
        if (!is_shard(f->path)) continue; /* other weight formats and subfolders are not streamed */
        if ((rc = stream_shard(o, r, f, sdir, err, errlen))) { json_decref(shards); return rc; }
        json_array_append_new(shards, json_pack("{s:s, s:I, s:s}", "name", f->path, "size", (json_int_t)f->size, "sha256", f->sha256));
    }
    if (!json_array_size(shards)) { json_decref(shards); return df_err(err, errlen, DF_EFORMAT, "%s@%s: no .safetensors files to stream", r->repo, r->rev); }
    json_t *m = json_pack("{s:s, s:i, s:s, s:s, s:s, s:I, s:o}", "format", "deltafin-hub-stream", "version", 1, "repo", r->repo, "commit", r->commit,
                          "endpoint", o->endpoint, "disk_budget", (json_int_t)disk, "shards", shards);
    char *txt = json_dumps(m, JSON_INDENT(1));
    json_decref(m);
    df_hub_sp(p, sizeof p, "%s/stream.json", sdir);
    rc = df_hub_write_file(p, txt, err, errlen);
    free(txt);
    if (rc) return rc;
    for (int i = 0; i < r->n_files; i++) { /* the up-front logs are done with */
        if (!is_shard(r->files[i].path)) continue;
        df_hub_sp(p, sizeof p, "%s/%s.resident.done", sdir, r->files[i].path);
        unlink(p);
    }
    if (strcmp(r->rev, r->commit)) {
        df_hub_sp(p, sizeof p, "%s/deltafin-stream/refs/%s", rdir, r->rev);
        char *slash = strrchr(p, '/');
        *slash = 0;
        df_mkdirs(p);
        *slash = '/';
        rc = df_hub_write_file(p, r->commit, err, errlen);
    }
    return rc;
}

/* ---- runtime ------------------------------------------------------------- */

struct df_hub_stream {
    df_hub_opts o;
    char repo[256], commit[48];
    int n;
    char **names;
    df_hub_remote **remotes; /* opened on first use */
    int64_t disk;
};

df_hub_stream *df_hub_stream_open(const char *dir, char *err, size_t errlen) {
    char p[4300];
    df_hub_sp(p, sizeof p, "%s/stream.json", dir);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!json_is_object(j)) { json_decref(j); df_err(err, errlen, DF_EFORMAT, "%s: %s", p, je.text); return NULL; }
    const char *repo = json_string_value(json_object_get(j, "repo")), *commit = json_string_value(json_object_get(j, "commit"));
    const char *ep = json_string_value(json_object_get(j, "endpoint"));
    json_t *sh = json_object_get(j, "shards"), *db = json_object_get(j, "disk_budget");
    int ok_commit = commit && strlen(commit) == 40;
    for (const char *q = commit; ok_commit && *q; q++) ok_commit = (*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f');
    if (!repo || !df_hub_is_repo_id(repo) || strchr(repo, '@') || !ok_commit || !ep || !json_is_array(sh) || !json_is_integer(db) ||
        json_integer_value(db) < -1) {
        json_decref(j);
        df_err(err, errlen, DF_EFORMAT, "%s: expected repo (ORG/NAME), commit (40 hex), endpoint, disk_budget (bytes, or -1: none) and shards", p);
        return NULL;
    }
    for (size_t i = 0; i < json_array_size(sh); i++) { /* each a shard file name of this directory: no path */
        const char *nm = json_string_value(json_object_get(json_array_get(sh, i), "name"));
        if (!nm || !is_shard(nm) || nm[0] == '.') {
            df_err(err, errlen, DF_EFORMAT, "%s: shards[%zu].name: expected a file name ending in .safetensors, got '%s'", p, i,
                   nm ? nm : "(none)");
            json_decref(j); /* after the message: nm lives in j */
            return NULL;
        }
    }
    df_hub_stream *s = df_xcalloc(1, sizeof *s);
    df_hub_opts_default(&s->o);
    if (!getenv("HF_ENDPOINT")) df_hub_sp(s->o.endpoint, sizeof s->o.endpoint, "%s", ep); /* where it was set up, unless told otherwise */
    s->o.progress = 0;
    df_hub_sp(s->repo, sizeof s->repo, "%s", repo);
    df_hub_sp(s->commit, sizeof s->commit, "%s", commit);
    s->disk = json_integer_value(db);
    s->n = (int)json_array_size(sh);
    s->names = df_xcalloc((size_t)s->n + 1, sizeof *s->names);
    s->remotes = df_xcalloc((size_t)s->n + 1, sizeof *s->remotes);
    for (int i = 0; i < s->n; i++) {
        const char *nm = json_string_value(json_object_get(json_array_get(sh, (size_t)i), "name"));
        s->names[i] = df_xstrdup(nm);
    }
    json_decref(j);
    return s;
}

void df_hub_stream_free(df_hub_stream *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) { free(s->names[i]); df_hub_remote_free(s->remotes[i]); }
    free(s->names);
    free(s->remotes);
    free(s);
}
int64_t df_hub_stream_disk_budget(const df_hub_stream *s) { return s->disk; }

int df_hub_stream_fetch(df_hub_stream *s, const df_hub_piece *p, int n, char *err, size_t errlen) {
    df_hub_range *rg = df_xcalloc((size_t)n + 1, sizeof *rg);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int f = -1;
        for (int k = 0; k < s->n; k++) if (!strcmp(s->names[k], p[i].shard)) f = k;
        if (f < 0) { rc = df_err(err, errlen, DF_EINPUT, "%s: not a shard of the stream setup of %s", p[i].shard, s->repo); break; }
        if (!s->remotes[f] && !(s->remotes[f] = df_hub_remote_open(&s->o, s->repo, s->commit, s->names[f], err, errlen))) { rc = DF_EIO; break; }
        rg[i] = (df_hub_range){f, p[i].off, p[i].len, p[i].fd};
    }
    if (!rc) rc = df_hub_fetch_ranges(&s->o, s->remotes, rg, n, NULL, NULL, NULL, err, errlen);
    free(rg);
    return rc;
}
