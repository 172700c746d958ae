/* bench_run.c - `deltafin bench WORKLOAD`: named workloads run as child
 * processes, two or more arms interleaved, results gated on the generated ids.
 *
 * A workload (decode, prefill, stream, server, tokenizer) fixes what one run
 * does; an arm (--arm NAME=BINARY[:OPTIONS]) fixes which binary does it and
 * with which extra options. Each rep runs every arm once, the arm order
 * rotated per rep (rep 0: A B C, rep 1: B C A, ...), so slow drift of the
 * machine (other builds, thermal state, the page cache) spreads over all arms
 * instead of biasing the arm that ran last. Each run is a child process with
 * a fixed argv (posix_spawn, no shell); run workloads read the child's
 * `run --stats-json` file, the server workload times the SSE stream of the
 * real `deltafin serve` from client threads (libcurl), the tokenizer workload
 * times `tokenize` / `detokenize` children against a load-only run.
 *
 * The floors (memory read, FMA peak; the disk's O_DIRECT read for stream) are
 * measured in the same invocation, before the runs, so every number is shown
 * against what this machine can do now. Every arm's output must equal the
 * first arm's (ids for run workloads, text for server, ids and bytes for
 * tokenizer) unless the arm is named in --no-id-check: otherwise the result is
 * FAILED and the exit code 1. --out DIR gets results.json, results.md and SVG
 * plots (plot.c). */
#include "backend/cpu/cpu.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "cli/plot.h"
#include "store/diskbench.h"
#include "util/util.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

extern char **environ;

enum { W_DECODE, W_PREFILL, W_STREAM, W_SERVER, W_TOKENIZER, W_N };
static const char *wl_name[W_N] = {"decode", "prefill", "stream", "server", "tokenizer"};

#define MAX_ARMS 8
#define MAX_OPTS 64

typedef struct {
    char name[64];
    char *bin;
    char *opts[MAX_OPTS]; /* extra options, split on spaces */
    int nopts;
    int no_id_check;
} arm_t;

/* One metric of a workload: key in a run record, label, unit; primary is
 * the one plotted per run and compared across arms first. */
typedef struct { const char *key, *label; int higher_better; } metric_t;

static const metric_t m_decode[] = {{"decode_tok_s", "decode tok/s", 1}, {"prefill_tok_s", "prefill tok/s", 1},
                                    {"weight_gbs", "weight GB/s", 1}, {"ttft_s", "first token s (load incl.)", 0},
                                    {"peak_rss_mb", "peak RSS MB", 0}, {NULL, NULL, 0}};
static const metric_t m_stream[] = {{"decode_tok_s", "decode tok/s", 1}, {"hit_rate", "expert hit rate", 1},
                                    {"decode_mb_per_token", "expert MB read/token", 0}, {"read_gbs", "read GB/s", 1},
                                    {"ttft_s", "first token s (load incl.)", 0}, {"peak_rss_mb", "peak RSS MB", 0},
                                    {NULL, NULL, 0}};
static const metric_t m_prefill[] = {{"prefill_tok_s", "prefill tok/s", 1}, {"prefill_gflops", "prefill GFLOP/s", 1},
                                     {"peak_rss_mb", "peak RSS MB", 0}, {NULL, NULL, 0}};
static const metric_t m_server[] = {{"ttft_p50_ms", "TTFT p50 ms", 0}, {"ttft_p90_ms", "TTFT p90 ms", 0},
                                    {"itl_p50_ms", "inter-token p50 ms", 0}, {"itl_p90_ms", "inter-token p90 ms", 0},
                                    {"tok_s", "tokens/s (all clients)", 1}, {NULL, NULL, 0}};
static const metric_t m_tok[] = {{"encode_mb_s", "encode MB/s", 1}, {"decode_mb_s", "decode MB/s", 1}, {NULL, NULL, 0}};
static const metric_t *wl_metrics[W_N] = {m_decode, m_prefill, m_stream, m_server, m_tok};
/* The floor field of a run record for each workload's primary metric. */
static const char *wl_floor_key[W_N] = {"floor_tok_s", "floor_tok_s", "floor_tok_s", NULL, NULL};

typedef struct {
    int wl;
    arm_t arms[MAX_ARMS];
    int narms;
    long reps, max_new, prompt_len, clients, requests, threads;
    const char *model, *prompt, *ids, *out, *corpus, *tokenizer, *expert_cache;
    double timeout;
    int64_t floor_mem, floor_disk;
    int no_floors;
    char *no_id_check[MAX_ARMS];
    int n_no_id_check;
    /* measured */
    df_floors fl;
    int have_floors;
    double disk_gbs;
    char disk_note[1400];
    char cache_note[256];
    char gen_ids[8192]; /* prefill: the generated prompt ids */
    char rundir[2048];
} bench_t;

static const char usage[] =
    "usage: deltafin bench WORKLOAD --arm NAME=BINARY[:OPTIONS] --arm NAME=BINARY[:OPTIONS] [options]\n"
    "  WORKLOAD   decode     greedy decode of --max-new tokens after a short prompt (run --ignore-eos)\n"
    "             prefill    a --prompt-len token prompt, one token generated: prefill tokens/s\n"
    "             stream     decode with routed experts streamed from disk (--expert-cache, default 0 = the\n"
    "                        minimum), the model's files evicted from the page cache before every run\n"
    "             server     the real `deltafin serve`: --clients concurrent streamed completions, TTFT and\n"
    "                        inter-token latency distributions\n"
    "             tokenizer  encode / decode MB/s of `tokenize` / `detokenize` on --corpus (load time subtracted)\n"
    "  deltafin bench floors | first-touch   the machine's floors (deltafin bench --help)\n"
    "options:\n"
    "  --arm NAME=BINARY[:OPTIONS]   an arm: a deltafin binary and extra options for it, split on spaces (no\n"
    "                                quoting; given last, so they override the workload's). At least two arms\n"
    "                                (two binaries, or one binary with two option sets), at most 8\n"
    "  --reps N             runs per arm, interleaved A B, B A, ... (default 3)\n"
    "  --model M            the model (default " DF_DEFAULT_MODEL "); tokenizer: the --tokenizer default\n"
    "  --prompt TEXT | --ids LIST   decode/stream prompt (default --ids 1,2,3,4,5,6,7,8); server prompt text\n"
    "  --max-new N          tokens per run or request (default 64)\n"
    "  --prompt-len N       prefill: prompt tokens (default 256; ids cycle 1..251)\n"
    "  --expert-cache SIZE  stream: the expert cache (default 0 = the minimum)\n"
    "  --clients N --requests N   server: concurrent clients (default 2), requests per client (default 4)\n"
    "  --corpus FILE --tokenizer PATH   tokenizer: the text, and the tokenizer (default: --model)\n"
    "  --threads N          passed to every child as --threads N\n"
    "  --timeout SECS       one run's limit (default 600); a run over it is killed and FAILED\n"
    "  --no-id-check NAME   arm NAME's output may differ from the first arm's (options that change it)\n"
    "  --floor-mem SIZE     buffer of the memory-read floor (default 1G; 0 with --no-floors)\n"
    "  --floor-disk SIZE    most bytes read for the disk floor (stream; default 1G)\n"
    "  --no-floors          skip the floors (the % of floor column is then empty)\n"
    "  --out DIR            write results.json, results.md and the plots (*.svg) there, and the runs' files\n"
    "                       under DIR/runs (default: a fresh directory bench-WORKLOAD-DATE)\n"
    "Exit: 0 all runs passed; 1 a run failed or an arm's output differed (FAILED); 2 bad options.\n";

/* ---- small helpers ------------------------------------------------------ */

static int parse_arm(bench_t *b, const char *s, char *err, size_t errlen) {
    const char *eq = strchr(s, '=');
    if (!eq || eq == s || !eq[1]) return df_err(err, errlen, DF_EINPUT, "--arm '%s': expected NAME=BINARY[:OPTIONS]", s);
    if (b->narms >= MAX_ARMS) return df_err(err, errlen, DF_EINPUT, "--arm: at most %d arms", MAX_ARMS);
    arm_t *a = &b->arms[b->narms];
    size_t nl = (size_t)(eq - s);
    if (nl >= sizeof a->name) return df_err(err, errlen, DF_EINPUT, "--arm '%s': NAME longer than %zu bytes", s, sizeof a->name - 1);
    memcpy(a->name, s, nl);
    a->name[nl] = 0;
    for (size_t i = 0; i < nl; i++)
        if (!(a->name[i] == '-' || a->name[i] == '_' || a->name[i] == '.' || (a->name[i] >= '0' && a->name[i] <= '9') ||
              ((a->name[i] | 32) >= 'a' && (a->name[i] | 32) <= 'z')))
            return df_err(err, errlen, DF_EINPUT, "--arm '%s': NAME may hold letters, digits, '-', '_' and '.' only", s);
    for (int k = 0; k < b->narms; k++)
        if (!strcmp(b->arms[k].name, a->name)) return df_err(err, errlen, DF_EINPUT, "--arm: the name '%s' is given twice", a->name);
    const char *colon = strchr(eq + 1, ':');
    a->bin = colon ? strndup(eq + 1, (size_t)(colon - eq - 1)) : strdup(eq + 1);
    int rc = 0;
    if (!a->bin[0]) rc = df_err(err, errlen, DF_EINPUT, "--arm '%s': BINARY is empty", s);
    else if (access(a->bin, X_OK)) rc = df_err(err, errlen, DF_EINPUT, "--arm %s: BINARY '%s' is not an executable file", a->name, a->bin);
    else if (colon) {
        char *o = strdup(colon + 1), *save = NULL;
        for (char *t = strtok_r(o, " \t", &save); t && !rc; t = strtok_r(NULL, " \t", &save)) {
            if (a->nopts >= MAX_OPTS) rc = df_err(err, errlen, DF_EINPUT, "--arm %s: at most %d options", a->name, MAX_OPTS);
            else a->opts[a->nopts++] = strdup(t);
        }
        free(o);
    }
    if (rc) { /* the arm is not kept: free what it holds */
        free(a->bin);
        for (int q = 0; q < a->nopts; q++) free(a->opts[q]);
        memset(a, 0, sizeof *a);
        return rc;
    }
    b->narms++;
    return 0;
}

static double median_of(double *v, int n) {
    if (n <= 0) return NAN;
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double pct_of_sorted(const double *v, int n, double p) {
    if (n <= 0) return NAN;
    double r = p * (n - 1);
    int i = (int)r;
    return i + 1 < n ? v[i] + (r - i) * (v[i + 1] - v[i]) : v[n - 1];
}

static double jnum(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Spawns argv[0] with stdin/stdout/stderr redirected to files (NULL: /dev/null
 * for stdin, inherited otherwise). Returns the pid, or -1 with err filled. */
static pid_t spawn(char *const argv[], const char *in, const char *out, const char *errf, int search, char *err, size_t errlen) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, in ? in : "/dev/null", O_RDONLY, 0);
    if (out) posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (errf) posix_spawn_file_actions_addopen(&fa, 2, errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = search ? posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) : posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) { df_err(err, errlen, DF_EIO, "cannot start %s: %s", argv[0], strerror(rc)); return -1; }
    return pid;
}

/* Waits for pid at most timeout seconds (then SIGKILL). Returns the exit
 * code, 128+signal for a signal, or -1 on a timeout. */
static int wait_child(pid_t pid, double timeout) {
    double t0 = df_now();
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) return -2;
        if (df_now() - t0 > timeout) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Runs argv to completion; *wall gets its seconds. Returns as wait_child, or -3 when it could not start. */
static int run_child(char *const argv[], const char *in, const char *out, const char *errf, double timeout, double *wall, char *err, size_t errlen) {
    double t0 = df_now();
    pid_t pid = spawn(argv, in, out, errf, 0, err, errlen);
    if (pid < 0) return -3;
    int rc = wait_child(pid, timeout);
    *wall = df_now() - t0;
    return rc;
}

/* The last line of a file (a child's stderr), for a FAILED message. */
static void last_line(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    char *t = NULL, e[64];
    size_t len = 0;
    if (df_read_file(path, &t, &len, e, sizeof e)) return;
    while (len && (t[len - 1] == '\n' || t[len - 1] == '\r')) len--;
    size_t s = len;
    while (s && t[s - 1] != '\n') s--;
    snprintf(buf, n, "%.*s", (int)(len - s), t + s);
    free(t);
}

static void fail_run(json_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_run(json_t *r, const char *fmt, ...) {
    char m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    json_object_set_new(r, "ok", json_false());
    json_object_set_new(r, "error", json_string(m));
}

/* argv under construction: fixed strings and the arm's options. */
typedef struct { char *v[160]; int n; char own[24][64]; int nown; } argvec;
static void av(argvec *a, const char *s) { if (a->n < 158) a->v[a->n++] = (char *)s, a->v[a->n] = NULL; }
static const char *avnum(argvec *a, long x) {
    if (a->nown >= 24) return "0";
    snprintf(a->own[a->nown], sizeof a->own[0], "%ld", x);
    return a->own[a->nown++];
}
static void av_arm(argvec *a, const arm_t *arm) { for (int i = 0; i < arm->nopts; i++) av(a, arm->opts[i]); }

/* ---- page cache: evict the model's files before a stream run ------------- */

/* Evicts path's pages from the page cache (posix_fadvise DONTNEED: permitted
 * for any reader, drops clean pages only), every regular file under a directory. */
static int evict_files(const char *path, int depth) {
    struct stat st;
    if (stat(path, &st)) return 0;
    if (S_ISREG(st.st_mode)) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) return 0;
        fdatasync(fd);
        int ok = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
        close(fd);
        return ok;
    }
    if (!S_ISDIR(st.st_mode) || depth > 2) return 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        n += evict_files(p, depth + 1);
    }
    closedir(d);
    return n;
}

/* The largest regular file of a model (a file, or under a directory): the disk floor reads it. */
static void largest_file(const char *path, char *best, size_t n, off_t *best_size, int depth) {
    struct stat st;
    if (stat(path, &st)) return;
    if (S_ISREG(st.st_mode)) {
        if (st.st_size > *best_size) { *best_size = st.st_size; snprintf(best, n, "%s", path); }
        return;
    }
    if (!S_ISDIR(st.st_mode) || depth > 2) return;
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        largest_file(p, best, n, best_size, depth + 1);
    }
    closedir(d);
}

/* ---- run workloads: decode, prefill, stream ----------------------------- */

static void run_workload_run(bench_t *b, const arm_t *arm, const char *tag, json_t *r) {
    char sj[4200], so[4200], se[4200], err[512];
    snprintf(sj, sizeof sj, "%s/%s.stats.json", b->rundir, tag);
    snprintf(so, sizeof so, "%s/%s.out", b->rundir, tag);
    snprintf(se, sizeof se, "%s/%s.err", b->rundir, tag);
    argvec a = {.n = 0};
    av(&a, arm->bin), av(&a, "run"), av(&a, "--model"), av(&a, b->model);
    if (b->wl == W_PREFILL) av(&a, "--ids"), av(&a, b->gen_ids), av(&a, "--max-new"), av(&a, "1");
    else {
        if (b->prompt) av(&a, "--prompt"), av(&a, b->prompt);
        else av(&a, "--ids"), av(&a, b->ids ? b->ids : "1,2,3,4,5,6,7,8");
        av(&a, "--max-new"), av(&a, avnum(&a, b->max_new));
    }
    av(&a, "--ignore-eos"), av(&a, "--print-ids"), av(&a, "--stats-json"), av(&a, sj);
    if (b->threads) av(&a, "--threads"), av(&a, avnum(&a, b->threads));
    if (b->wl == W_STREAM) {
        av(&a, "--expert-cache"), av(&a, b->expert_cache ? b->expert_cache : "0");
        int n = evict_files(b->model, 0);
        json_object_set_new(r, "files_evicted", json_integer(n));
    }
    av_arm(&a, arm);
    json_t *argv_j = json_array();
    for (int i = 0; i < a.n; i++) json_array_append_new(argv_j, json_string(a.v[i]));
    json_object_set_new(r, "argv", argv_j);
    double wall = 0;
    int rc = run_child(a.v, NULL, so, se, b->timeout, &wall, err, sizeof err);
    json_object_set_new(r, "wall_s", json_real(wall));
    json_object_set_new(r, "exit", json_integer(rc));
    if (rc == -3) { fail_run(r, "%s", err); return; }
    if (rc == -1) { fail_run(r, "killed after the --timeout of %.0f s", b->timeout); return; }
    if (rc) { char ll[600]; last_line(se, ll, sizeof ll); fail_run(r, "exit %d: %s", rc, ll); return; }
    json_error_t je;
    json_t *st = json_load_file(sj, 0, &je);
    if (!json_is_object(st)) { json_decref(st); fail_run(r, "%s: not a JSON object (line %d: %s)", sj, je.line, je.text); return; }
    json_object_set_new(r, "ok", json_true());
    const char *copy[] = {"prefill_tokens", "prefill_seconds", "prefill_tok_s", "decode_tokens", "decode_seconds", "decode_tok_s",
                          "weight_gbs", "ttft_s", "hit_rate", "read_gbs", "bytes_read", "decode_bytes_read", "n_params_active",
                          "weight_bytes_touched", "streaming", "ids", "series", "expert_cache_bytes", "backend", "threads"};
    for (size_t i = 0; i < sizeof copy / sizeof *copy; i++) {
        json_t *v = json_object_get(st, copy[i]);
        if (v) json_object_set(r, copy[i], v);
    }
    json_object_set_new(r, "peak_rss_mb", json_real(jnum(st, "peak_rss_bytes") / 1e6));
    double dt = jnum(st, "decode_tokens");
    json_object_set_new(r, "decode_mb_per_token", json_real(dt > 0 ? jnum(st, "decode_bytes_read") / dt / 1e6 : 0));
    double ps = jnum(st, "prefill_seconds"), np = jnum(st, "n_params_active");
    json_object_set_new(r, "prefill_gflops", json_real(ps > 0 ? 2 * np * jnum(st, "prefill_tokens") / ps / 1e9 : 0));
    /* floors in the metric's unit: tokens/s if the run went at the floor */
    if (b->have_floors) {
        double fl = NAN;
        if (b->wl == W_PREFILL) fl = np > 0 ? b->fl.peak_fma_gflops * 1e9 / (2 * np) : NAN;
        else {
            double wpt = dt > 0 ? jnum(st, "weight_bytes_touched") / dt : 0;
            fl = wpt > 0 ? b->fl.mem_read_gbs * 1e9 / wpt : NAN;
            double rpt = dt > 0 ? jnum(st, "decode_bytes_read") / dt : 0;
            if (b->wl == W_STREAM && b->disk_gbs > 0 && rpt > 0) fl = fmin(isfinite(fl) ? fl : INFINITY, b->disk_gbs * 1e9 / rpt);
        }
        if (isfinite(fl)) json_object_set_new(r, "floor_tok_s", json_real(fl));
    }
    json_decref(st);
}

/* ---- server workload ---------------------------------------------------- */

typedef struct {
    double t_send, t_end;
    double *tt; /* times of text chunks */
    int ntt, cap;
    df_buf text;
    df_buf line;
    long http;
    char err[256];
} req_t;

typedef struct {
    bench_t *b;
    int port, client;
    req_t *reqs; /* [b->requests] */
} client_t;

static void req_line(req_t *q, const char *s, size_t n) {
    if (n < 6 || strncmp(s, "data: ", 6)) return;
    s += 6, n -= 6;
    if (n >= 6 && !strncmp(s, "[DONE]", 6)) return;
    json_error_t je;
    json_t *o = json_loadb(s, n, 0, &je);
    json_t *t = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "text");
    if (json_is_string(t) && json_string_length(t)) {
        if (q->ntt == q->cap) { q->cap = q->cap ? 2 * q->cap : 64; q->tt = df_xrealloc(q->tt, (size_t)q->cap * sizeof *q->tt); }
        q->tt[q->ntt++] = df_now();
        df_buf_put(&q->text, json_string_value(t), json_string_length(t));
    }
    json_decref(o);
}

static size_t req_write(char *p, size_t sz, size_t nm, void *ud) {
    req_t *q = ud;
    size_t n = sz * nm;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            req_line(q, q->line.p ? q->line.p : "", q->line.len);
            q->line.len = 0;
        } else if (q->line.len < (16u << 20)) {
            df_buf_put(&q->line, p + i, 1);
        }
    }
    return n;
}

static void *client_main(void *p) {
    client_t *c = p;
    bench_t *b = c->b;
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", c->port);
    for (int r = 0; r < b->requests; r++) {
        req_t *q = &c->reqs[r];
        char prompt[4400];
        snprintf(prompt, sizeof prompt, "%s (request %ld)", b->prompt ? b->prompt : "Tell me a story about a careful benchmark.",
                 (long)c->client * b->requests + r);
        json_t *body = json_pack("{s:s,s:s,s:I,s:f,s:b}", "model", "bench", "prompt", prompt, "max_tokens", (json_int_t)b->max_new,
                                 "temperature", 0.0, "stream", 1);
        char *bs = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        CURL *h = curl_easy_init();
        struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, bs);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, req_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, q);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(b->timeout * 1000));
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        q->t_send = df_now();
        CURLcode cc = curl_easy_perform(h);
        q->t_end = df_now();
        if (q->line.len) req_line(q, q->line.p, q->line.len);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &q->http);
        if (cc != CURLE_OK) snprintf(q->err, sizeof q->err, "%s", curl_easy_strerror(cc));
        else if (q->http != 200) snprintf(q->err, sizeof q->err, "HTTP %ld: %.200s", q->http, q->text.p ? q->text.p : "");
        curl_slist_free_all(hd);
        curl_easy_cleanup(h);
        free(bs);
    }
    return NULL;
}

/* The port `deltafin serve --port 0` printed on stderr, or 0. */
static int find_port(const char *errf) {
    char *t = NULL, e[64];
    size_t len = 0;
    if (df_read_file(errf, &t, &len, e, sizeof e)) return 0;
    const char *m = strstr(t, "listening on http://127.0.0.1:");
    int port = m ? atoi(m + strlen("listening on http://127.0.0.1:")) : 0;
    free(t);
    return port;
}

static void run_workload_server(bench_t *b, const arm_t *arm, const char *tag, json_t *r) {
    char se[4200], err[512];
    snprintf(se, sizeof se, "%s/%s.serve.err", b->rundir, tag);
    argvec a = {.n = 0};
    av(&a, arm->bin), av(&a, "serve"), av(&a, "--model"), av(&a, b->model), av(&a, "--port"), av(&a, "0");
    av(&a, "--host"), av(&a, "127.0.0.1"), av(&a, "--served-model-name"), av(&a, "bench");
    if (b->threads) av(&a, "--threads"), av(&a, avnum(&a, b->threads));
    av_arm(&a, arm);
    json_t *argv_j = json_array();
    for (int i = 0; i < a.n; i++) json_array_append_new(argv_j, json_string(a.v[i]));
    json_object_set_new(r, "argv", argv_j);
    pid_t pid = spawn(a.v, NULL, "/dev/null", se, 0, err, sizeof err);
    if (pid < 0) { fail_run(r, "%s", err); return; }
    int port = 0, st;
    double t0 = df_now();
    while (!(port = find_port(se)) && df_now() - t0 < b->timeout) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            char ll[600];
            last_line(se, ll, sizeof ll);
            fail_run(r, "deltafin serve exited before listening: %s", ll);
            return;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (!port) { kill(pid, SIGKILL); waitpid(pid, &st, 0); fail_run(r, "deltafin serve did not listen within %.0f s", b->timeout); return; }
    json_object_set_new(r, "load_s", json_real(df_now() - t0));
    int nc = (int)b->clients, nr = (int)b->requests;
    client_t *cl = df_xcalloc((size_t)nc, sizeof *cl);
    pthread_t *th = df_xcalloc((size_t)nc, sizeof *th);
    double t_start = df_now();
    for (int c = 0; c < nc; c++) {
        cl[c] = (client_t){b, port, c, df_xcalloc((size_t)nr, sizeof(req_t))};
        if (pthread_create(&th[c], NULL, client_main, &cl[c])) { cl[c].reqs[0].err[0] = '!'; th[c] = 0; }
    }
    for (int c = 0; c < nc; c++)
        if (th[c]) pthread_join(th[c], NULL);
    double t_all = df_now() - t_start;
    kill(pid, SIGTERM);
    int xrc = wait_child(pid, 30);
    json_object_set_new(r, "serve_exit", json_integer(xrc));
    /* latencies: TTFT per request, inter-token gaps pooled */
    int nreq = nc * nr, ni = 0, nt = 0;
    long toks = 0;
    double *ttft = df_xcalloc((size_t)nreq, sizeof *ttft);
    for (int c = 0; c < nc; c++)
        for (int q = 0; q < nr; q++) toks += cl[c].reqs[q].ntt > 1 ? cl[c].reqs[q].ntt - 1 : 0;
    double *itl = df_xcalloc((size_t)toks + 1, sizeof *itl);
    json_t *texts = json_array(), *jt = json_array(), *ji = json_array();
    char first_err[300] = "";
    long total_tokens = 0;
    for (int c = 0; c < nc; c++)
        for (int q = 0; q < nr; q++) {
            req_t *rq = &cl[c].reqs[q];
            if (rq->err[0] && !first_err[0]) snprintf(first_err, sizeof first_err, "client %d request %d: %s", c, q, rq->err[0] == '!' ? "no thread" : rq->err);
            json_array_append_new(texts, json_stringn(rq->text.p ? rq->text.p : "", rq->text.len));
            total_tokens += rq->ntt;
            if (rq->ntt) ttft[nt++] = rq->tt[0] - rq->t_send, json_array_append_new(jt, json_real(rq->tt[0] - rq->t_send));
            for (int i = 1; i < rq->ntt; i++) itl[ni] = rq->tt[i] - rq->tt[i - 1], json_array_append_new(ji, json_real(itl[ni])), ni++;
            free(rq->tt), df_buf_free(&rq->text), df_buf_free(&rq->line);
        }
    for (int c = 0; c < nc; c++) free(cl[c].reqs);
    free(cl), free(th);
    qsort(ttft, (size_t)nt, sizeof *ttft, cmp_d);
    qsort(itl, (size_t)ni, sizeof *itl, cmp_d);
    json_object_set_new(r, "texts", texts);
    json_object_set_new(r, "ttft_s_all", jt);
    json_object_set_new(r, "itl_s_all", ji);
    json_object_set_new(r, "requests", json_integer(nreq));
    json_object_set_new(r, "clients", json_integer(nc));
    json_object_set_new(r, "chunks", json_integer(total_tokens));
    json_object_set_new(r, "wall_s", json_real(t_all));
    json_object_set_new(r, "ttft_p50_ms", json_real(pct_of_sorted(ttft, nt, 0.5) * 1e3));
    json_object_set_new(r, "ttft_p90_ms", json_real(pct_of_sorted(ttft, nt, 0.9) * 1e3));
    json_object_set_new(r, "itl_p50_ms", json_real(pct_of_sorted(itl, ni, 0.5) * 1e3));
    json_object_set_new(r, "itl_p90_ms", json_real(pct_of_sorted(itl, ni, 0.9) * 1e3));
    json_object_set_new(r, "tok_s", json_real(t_all > 0 ? total_tokens / t_all : 0));
    free(ttft), free(itl);
    if (first_err[0]) fail_run(r, "%s", first_err);
    else if (xrc) fail_run(r, "deltafin serve exited %d on SIGTERM (log %s)", xrc, se);
    else json_object_set_new(r, "ok", json_true());
}

/* ---- tokenizer workload -------------------------------------------------- */

/* The seconds after `what` ("encode" / "decode") in a `--time` line of a
 * tokenize/detokenize stderr file, or -1. */
static double time_field(const char *errf, const char *what) {
    char *t = NULL, e[64], key[32];
    size_t len = 0;
    if (df_read_file(errf, &t, &len, e, sizeof e)) return -1;
    snprintf(key, sizeof key, ", %s ", what);
    const char *m = strstr(t, ": time: load ");
    m = m ? strstr(m, key) : NULL;
    double v = m ? strtod(m + strlen(key), NULL) : -1;
    free(t);
    return v;
}

/* 1 when a child refused --time (a binary from before it existed). */
static int refused_time(const char *errf) {
    char *t = NULL, e[64];
    size_t len = 0;
    if (df_read_file(errf, &t, &len, e, sizeof e)) return 0;
    int r = strstr(t, "\"--time\"") != NULL;
    free(t);
    return r;
}

/* Encode then decode the corpus with the arm's binary. Binaries with
 * `--time` report the encode/decode seconds themselves (load excluded);
 * for older ones a load-only run on empty input is subtracted from the
 * wall time, which is only meaningful when the corpus takes far longer
 * than loading the tokenizer. */
static void run_workload_tokenizer(bench_t *b, const arm_t *arm, const char *tag, json_t *r) {
    char ids_f[4200], dec_f[4200], se[4200], sd[4200], empty_f[4200], err[512];
    snprintf(ids_f, sizeof ids_f, "%s/%s.ids.json", b->rundir, tag);
    snprintf(dec_f, sizeof dec_f, "%s/%s.decoded", b->rundir, tag);
    snprintf(se, sizeof se, "%s/%s.encode.err", b->rundir, tag);
    snprintf(sd, sizeof sd, "%s/%s.decode.err", b->rundir, tag);
    snprintf(empty_f, sizeof empty_f, "%s/empty_ids.json", b->rundir);
    const char *tk = b->tokenizer ? b->tokenizer : b->model;
    argvec enc = {.n = 0}, dec = {.n = 0};
    int timing = 1;
again:
    enc.n = dec.n = 0;
    av(&enc, arm->bin), av(&enc, "tokenize"), av(&enc, "--tokenizer"), av(&enc, tk);
    if (timing) av(&enc, "--time");
    av_arm(&enc, arm);
    av(&dec, arm->bin), av(&dec, "detokenize"), av(&dec, "--tokenizer"), av(&dec, tk);
    if (timing) av(&dec, "--time");
    json_t *argv_j = json_array();
    for (int i = 0; i < enc.n; i++) json_array_append_new(argv_j, json_string(enc.v[i]));
    json_object_set_new(r, "argv", argv_j);
    struct stat st;
    double corpus_bytes = stat(b->corpus, &st) ? 0 : (double)st.st_size;
    double w_el = 0, w_e = 0, w_dl = 0, w_d = 0;
    int rc = run_child(enc.v, b->corpus, ids_f, se, b->timeout, &w_e, err, sizeof err);
    if (rc == 2 && timing && refused_time(se)) { timing = 0; goto again; }
    if (!rc) rc = run_child(dec.v, ids_f, dec_f, sd, b->timeout, &w_d, err, sizeof err);
    if (!rc && !timing) rc = run_child(enc.v, "/dev/null", "/dev/null", se, b->timeout, &w_el, err, sizeof err);
    if (!rc && !timing) rc = run_child(dec.v, empty_f, "/dev/null", sd, b->timeout, &w_dl, err, sizeof err);
    json_object_set_new(r, "exit", json_integer(rc));
    if (rc == -3) { fail_run(r, "%s", err); return; }
    if (rc == -1) { fail_run(r, "killed after the --timeout of %.0f s", b->timeout); return; }
    if (rc) { char ll[600]; last_line(w_d > 0 ? sd : se, ll, sizeof ll); fail_run(r, "exit %d: %s", rc, ll); return; }
    double te = timing ? time_field(se, "encode") : w_e - w_el, td = timing ? time_field(sd, "decode") : w_d - w_dl;
    json_object_set_new(r, "timing", json_string(timing ? "--time (load excluded)" : "wall time minus a load-only run"));
    json_object_set_new(r, "corpus_bytes", json_real(corpus_bytes));
    json_object_set_new(r, "encode_s", json_real(te)), json_object_set_new(r, "decode_s", json_real(td));
    json_object_set_new(r, "encode_wall_s", json_real(w_e)), json_object_set_new(r, "decode_wall_s", json_real(w_d));
    /* under 0.1 ms (or negative, load-subtracted) is noise: null rather than a huge rate */
    json_object_set_new(r, "encode_mb_s", te > 1e-4 ? json_real(corpus_bytes / te / 1e6) : json_null());
    json_object_set_new(r, "decode_mb_s", td > 1e-4 ? json_real(corpus_bytes / td / 1e6) : json_null());
    char *ids = NULL, *d = NULL;
    size_t il = 0, dl = 0;
    if (df_read_file(ids_f, &ids, &il, err, sizeof err) || df_read_file(dec_f, &d, &dl, err, sizeof err)) {
        free(ids);
        fail_run(r, "%s", err);
        return;
    }
    json_error_t je;
    json_t *ja = json_loadb(ids, il, 0, &je);
    json_object_set_new(r, "tokens", json_integer(json_is_array(ja) ? (json_int_t)json_array_size(ja) : -1));
    json_decref(ja);
    /* the gate compares hashes of the ids and of the decoded bytes */
    json_object_set_new(r, "ids_hash", json_sprintf("%016llx", (unsigned long long)XXH3_64bits(ids, il)));
    json_object_set_new(r, "decoded_hash", json_sprintf("%016llx", (unsigned long long)XXH3_64bits(d, dl)));
    free(ids), free(d);
    json_object_set_new(r, "ok", json_true());
}

/* ---- the gate: every arm's output equals the first arm's ----------------- */

/* The part of a run record that must be equal across arms. */
static json_t *gate_key(int wl, json_t *r, json_t **second) {
    *second = NULL;
    if (wl == W_SERVER) return json_object_get(r, "texts");
    if (wl == W_TOKENIZER) { *second = json_object_get(r, "decoded_hash"); return json_object_get(r, "ids_hash"); }
    return json_object_get(r, "ids");
}

/* One line saying where two id arrays (or texts) first differ. */
static void describe_diff(int wl, json_t *ref, json_t *got, char *m, size_t n) {
    if (wl == W_TOKENIZER) { snprintf(m, n, "token ids or decoded bytes differ (hash %s vs %s)", json_string_value(ref), json_string_value(got)); return; }
    size_t nr = json_array_size(ref), ng = json_array_size(got), i = 0;
    while (i < nr && i < ng && json_equal(json_array_get(ref, i), json_array_get(got, i))) i++;
    if (wl == W_SERVER) { snprintf(m, n, "the text of request %zu differs from the first arm's", i); return; }
    if (i < nr && i < ng)
        snprintf(m, n, "generated ids differ at position %zu: %lld, expected %lld", i, (long long)json_integer_value(json_array_get(got, i)),
                 (long long)json_integer_value(json_array_get(ref, i)));
    else snprintf(m, n, "generated %zu ids, expected %zu", ng, nr);
}

/* ---- summaries ------------------------------------------------------------ */

/* Values of key over an arm's passed runs, into v (returns how many). */
static int arm_values(json_t *runs, const char *key, double *v, int cap) {
    int n = 0;
    size_t i;
    json_t *r;
    json_array_foreach(runs, i, r) {
        if (!json_is_true(json_object_get(r, "ok"))) continue;
        double x = jnum(r, key);
        if (isfinite(x) && n < cap) v[n++] = x;
    }
    return n;
}

static json_t *summarize(bench_t *b, json_t *runs_by_arm) {
    json_t *sum = json_object();
    const metric_t *ms = wl_metrics[b->wl];
    double *v = df_xcalloc((size_t)b->reps + 1, sizeof *v);
    for (int k = 0; k < b->narms; k++) {
        json_t *runs = json_object_get(runs_by_arm, b->arms[k].name), *ao = json_object();
        for (int m = 0; ms[m].key; m++) {
            int n = arm_values(runs, ms[m].key, v, (int)b->reps);
            json_t *mo = json_object();
            json_object_set_new(mo, "runs", json_integer(n));
            if (n) {
                double med = median_of(v, n); /* sorts v */
                json_object_set_new(mo, "median", json_real(med));
                json_object_set_new(mo, "min", json_real(v[0]));
                json_object_set_new(mo, "max", json_real(v[n - 1]));
                json_object_set_new(mo, "spread_pct", json_real(med != 0 ? 100 * (v[n - 1] - v[0]) / fabs(med) : 0));
                if (m == 0 && wl_floor_key[b->wl]) {
                    int nf = arm_values(runs, wl_floor_key[b->wl], v, (int)b->reps);
                    if (nf) {
                        double fm = median_of(v, nf);
                        json_object_set_new(mo, "floor", json_real(fm));
                        json_object_set_new(mo, "pct_of_floor", json_real(fm > 0 ? 100 * med / fm : 0));
                    }
                }
                if (k > 0) {
                    double base = jnum(json_object_get(json_object_get(sum, b->arms[0].name), ms[m].key), "median");
                    if (isfinite(base) && base != 0) json_object_set_new(mo, "ratio_to_first", json_real(med / base));
                }
            }
            json_object_set_new(ao, ms[m].key, mo);
        }
        json_object_set_new(sum, b->arms[k].name, ao);
    }
    free(v);
    return sum;
}

/* ---- plots ---------------------------------------------------------------- */

/* Writes DIR/NAME.svg and DIR/NAME.png of one drawing, listing both in plots. */
static int emit_plot(bench_t *b, const char *svg_file, const df_plot *p, const df_plot_series *s, int ns, json_t *plots, char *err, size_t errlen) {
    char path[4200], png_file[256];
    snprintf(path, sizeof path, "%s/%s", b->out, svg_file);
    if (df_plot_svg(path, p, s, ns, err, errlen)) return -1;
    json_array_append_new(plots, json_string(svg_file));
    snprintf(png_file, sizeof png_file, "%.*s.png", (int)(strlen(svg_file) - 4), svg_file);
    snprintf(path, sizeof path, "%s/%s", b->out, png_file);
    if (df_plot_png(path, p, s, ns, err, errlen)) return -1;
    json_array_append_new(plots, json_string(png_file));
    return 0;
}

static int plot_runs(bench_t *b, json_t *runs_by_arm, const metric_t *m, const char *file, json_t *plots, char *err, size_t errlen) {
    df_plot_series s[MAX_ARMS + 1];
    double xs[MAX_ARMS][64], ys[MAX_ARMS][64], fx[2], fy[2];
    int ns = 0;
    double floor_v = NAN;
    for (int k = 0; k < b->narms; k++) {
        json_t *runs = json_object_get(runs_by_arm, b->arms[k].name), *r;
        size_t i;
        int n = 0;
        json_array_foreach(runs, i, r) {
            if (n >= 64) break;
            xs[k][n] = (double)i + 1;
            ys[k][n++] = json_is_true(json_object_get(r, "ok")) ? jnum(r, m->key) : NAN;
            double f = wl_floor_key[b->wl] && m == wl_metrics[b->wl] ? jnum(r, wl_floor_key[b->wl]) : NAN;
            if (isfinite(f) && !(f < floor_v)) floor_v = isfinite(floor_v) ? fmin(floor_v, f) : f;
        }
        s[ns++] = (df_plot_series){b->arms[k].name, n, xs[k], ys[k], 0, 0};
    }
    /* the floor is drawn only when it is within 20x of the data (else it flattens the runs) */
    double top = 0;
    for (int k = 0; k < b->narms; k++)
        for (int i = 0; i < s[k].n; i++) if (isfinite(ys[k][i])) top = fmax(top, ys[k][i]);
    if (isfinite(floor_v) && top > 0 && floor_v < 20 * top) {
        fx[0] = 1, fx[1] = (double)b->reps, fy[0] = fy[1] = floor_v;
        s[ns++] = (df_plot_series){"floor", 2, fx, fy, 1, 0};
    }
    char title[256];
    snprintf(title, sizeof title, "%s: %s per run (arms interleaved)", wl_name[b->wl], m->label);
    df_plot p = {title, "run (rep)", m->label, 1, 1};
    return emit_plot(b, file, &p, s, ns, plots, err, errlen);
}

/* The run whose primary metric is an arm's median (the one its over-the-run plots show). */
static json_t *median_run(bench_t *b, json_t *runs) {
    json_t *best = NULL, *r;
    double v[64], med;
    int n = arm_values(runs, wl_metrics[b->wl][0].key, v, 64);
    if (!n) return NULL;
    med = median_of(v, n);
    size_t i;
    double bd = INFINITY;
    json_array_foreach(runs, i, r) {
        if (!json_is_true(json_object_get(r, "ok"))) continue;
        double d = fabs(jnum(r, wl_metrics[b->wl][0].key) - med);
        if (d < bd) bd = d, best = r;
    }
    return best;
}

enum { OVER_TOK_S, OVER_HIT, OVER_BYTES };

/* A per-token series of the median run of every arm, over a window of 8 tokens. */
static int plot_over_run(bench_t *b, json_t *runs_by_arm, int what, json_t *plots, char *err, size_t errlen) {
    static const char *files[] = {"over_run_tok_s.svg", "over_run_hit_rate.svg", "over_run_mb_per_token.svg"};
    static const char *ylab[] = {"tokens/s (8-token window)", "expert-cache hit rate (8-token window)", "expert MB read per token (8-token window)"};
    df_plot_series s[MAX_ARMS];
    double *bufs[MAX_ARMS * 2] = {0};
    for (int k = 0; k < b->narms; k++) {
        json_t *r = median_run(b, json_object_get(runs_by_arm, b->arms[k].name));
        json_t *se = json_object_get(r, "series");
        json_t *t = json_object_get(se, "t"), *h = json_object_get(se, "hits"), *l = json_object_get(se, "lookups"), *by = json_object_get(se, "bytes_read");
        int n = (int)json_array_size(t);
        double *x = bufs[2 * k] = df_xcalloc((size_t)n + 1, sizeof *x), *y = bufs[2 * k + 1] = df_xcalloc((size_t)n + 1, sizeof *y);
        int m = 0;
        for (int i = 1; i < n; i++) {
            int w = i < 8 ? i : 8;
            double dt = json_number_value(json_array_get(t, i)) - json_number_value(json_array_get(t, i - w));
            double dh = (double)(json_integer_value(json_array_get(h, i)) - json_integer_value(json_array_get(h, i - w)));
            double dl = (double)(json_integer_value(json_array_get(l, i)) - json_integer_value(json_array_get(l, i - w)));
            double db = (double)(json_integer_value(json_array_get(by, i)) - json_integer_value(json_array_get(by, i - w)));
            x[m] = i + 1;
            y[m++] = what == OVER_TOK_S ? (dt > 0 ? w / dt : NAN) : what == OVER_HIT ? (dl > 0 ? dh / dl : NAN) : db / w / 1e6;
        }
        s[k] = (df_plot_series){b->arms[k].name, m, x, y, 0, 0};
    }
    char title[256];
    snprintf(title, sizeof title, "%s: %s over the run (median run of each arm)", wl_name[b->wl],
             what == OVER_TOK_S ? "tokens/s" : what == OVER_HIT ? "hit rate" : "bytes read per token");
    df_plot p = {title, "generated token", ylab[what], 1, 1};
    int rc = emit_plot(b, files[what], &p, s, b->narms, plots, err, errlen);
    for (int i = 0; i < 2 * b->narms; i++) free(bufs[i]);
    return rc;
}

/* CDF of a latency pooled over an arm's runs (server). */
static int plot_cdf(bench_t *b, json_t *runs_by_arm, const char *key, const char *file, const char *what, json_t *plots, char *err, size_t errlen) {
    df_plot_series s[MAX_ARMS];
    double *bufs[MAX_ARMS * 2] = {0};
    for (int k = 0; k < b->narms; k++) {
        json_t *runs = json_object_get(runs_by_arm, b->arms[k].name), *r, *v;
        size_t i, j, n = 0;
        json_array_foreach(runs, i, r) n += json_array_size(json_object_get(r, key));
        double *x = bufs[2 * k] = df_xcalloc(n + 2, sizeof *x), *y = bufs[2 * k + 1] = df_xcalloc(n + 2, sizeof *y);
        size_t m = 0;
        json_array_foreach(runs, i, r) json_array_foreach(json_object_get(r, key), j, v) x[1 + m++] = json_number_value(v) * 1e3;
        qsort(x + 1, m, sizeof *x, cmp_d);
        x[0] = x[1], y[0] = 0; /* the step up from 0 at the smallest sample */
        for (size_t q = 0; q < m; q++) y[q + 1] = (double)(q + 1) / (double)m;
        s[k] = (df_plot_series){b->arms[k].name, m ? (int)m + 1 : 0, x, y, 0, 1};
    }
    char title[256], xl[128];
    snprintf(title, sizeof title, "server: %s distribution (%ld clients, all runs)", what, b->clients);
    snprintf(xl, sizeof xl, "%s (ms)", what);
    df_plot p = {title, xl, "fraction of samples <= x (CDF)", 1, 0};
    int rc = emit_plot(b, file, &p, s, b->narms, plots, err, errlen);
    for (int i = 0; i < 2 * b->narms; i++) free(bufs[i]);
    return rc;
}

/* ---- results.md ------------------------------------------------------------ */

static void fmt_num(char *s, size_t n, double v) {
    if (!isfinite(v)) snprintf(s, n, "-");
    else if (fabs(v) >= 100) snprintf(s, n, "%.1f", v);
    else if (fabs(v) >= 1) snprintf(s, n, "%.2f", v);
    else snprintf(s, n, "%.4g", v);
}

static int write_md(bench_t *b, json_t *res, const char *path, FILE *also) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int pass = 0; pass < 2; pass++) {
        FILE *o = pass ? also : f;
        if (!o) continue;
        json_t *sum = json_object_get(res, "summary"), *fails = json_object_get(res, "failures"), *v;
        size_t i;
        fprintf(o, "### deltafin bench %s: %s\n\n", wl_name[b->wl], json_string_value(json_object_get(res, "status")));
        fprintf(o, "- date %s, commit %s\n", json_string_value(json_object_get(res, "date")), json_string_value(json_object_get(res, "git_commit")));
        json_t *mach = json_object_get(res, "machine");
        fprintf(o, "- machine: %s, %lld CPUs, %.1f GB memory, Linux %s\n", json_string_value(json_object_get(mach, "cpu")),
                (long long)json_integer_value(json_object_get(mach, "cpus")), jnum(mach, "mem_bytes") / 1e9,
                json_string_value(json_object_get(mach, "kernel")));
        fprintf(o, "- command: `%s`\n", json_string_value(json_object_get(res, "command_line")));
        if (b->have_floors)
            fprintf(o, "- floors (same invocation): memory read %.2f GB/s (%d threads, %s), %.2f GB/s (1 thread); f32 FMA peak %.1f GFLOP/s (%s)\n",
                    b->fl.mem_read_gbs, b->fl.threads, b->fl.mem_method, b->fl.mem_read_gbs_1t, b->fl.peak_fma_gflops, b->fl.isa);
        else if (b->wl == W_SERVER || b->wl == W_TOKENIZER) fprintf(o, "- floors: none applies (%s are shown as measured)\n", b->wl == W_SERVER ? "latencies" : "tokenizer MB/s");
        else fprintf(o, "- floors: not measured (--no-floors)\n");
        if (b->wl == W_STREAM) {
            fprintf(o, "- disk floor: %s\n- page cache: %s\n", b->disk_note, b->cache_note);
            double mb = jnum(res, "model_bytes"), cb = NAN;
            json_t *r0 = json_array_get(json_object_get(json_object_get(res, "runs"), b->arms[0].name), 0);
            if (r0) cb = jnum(r0, "expert_cache_bytes");
            fprintf(o, "- model files %.1f MB, expert cache %.1f MB%s\n", mb / 1e6, cb / 1e6,
                    isfinite(cb) && cb >= mb ? " (NOT over the cache: every expert fits; give a smaller --expert-cache)" : "");
        }
        if (b->wl == W_SERVER) fprintf(o, "- %ld clients x %ld streamed completions each, %ld tokens at most, per run\n", b->clients, b->requests, b->max_new);
        if (b->wl == W_SERVER || b->wl == W_TOKENIZER) fprintf(o, "- %ld reps per arm, order rotated per rep\n\n", b->reps);
        else if (b->wl == W_PREFILL) fprintf(o, "- %ld reps per arm, order rotated per rep; floor of prefill tokens/s: the FMA peak over 2 x active parameters\n\n", b->reps);
        else fprintf(o, "- %ld reps per arm, order rotated per rep; floor of tokens/s: the memory read floor over the weight bytes each token read%s\n\n",
                     b->reps, b->wl == W_STREAM ? ", or the disk floor over the expert bytes read per token, the lower" : "");
        fprintf(o, "| metric | arm | runs | median | min - max | spread | %% of floor | vs %s |\n|---|---|---|---|---|---|---|---|\n", b->arms[0].name);
        for (int m = 0; wl_metrics[b->wl][m].key; m++)
            for (int k = 0; k < b->narms; k++) {
                json_t *mo = json_object_get(json_object_get(sum, b->arms[k].name), wl_metrics[b->wl][m].key);
                char md[32], lo[32], hi[32], sp[32] = "-", pf[32] = "-", rt[32] = "-";
                fmt_num(md, sizeof md, jnum(mo, "median")), fmt_num(lo, sizeof lo, jnum(mo, "min")), fmt_num(hi, sizeof hi, jnum(mo, "max"));
                if (isfinite(jnum(mo, "spread_pct"))) snprintf(sp, sizeof sp, "%.1f%%", jnum(mo, "spread_pct"));
                if (isfinite(jnum(mo, "pct_of_floor"))) snprintf(pf, sizeof pf, "%.1f%%", jnum(mo, "pct_of_floor"));
                if (isfinite(jnum(mo, "ratio_to_first"))) snprintf(rt, sizeof rt, "%.3fx", jnum(mo, "ratio_to_first"));
                fprintf(o, "| %s | %s | %lld | %s | %s - %s | %s | %s | %s |\n", wl_metrics[b->wl][m].label, b->arms[k].name,
                        (long long)json_integer_value(json_object_get(mo, "runs")), md, lo, hi, sp, pf, k ? rt : "1");
            }
        fprintf(o, "\narms:\n");
        for (int k = 0; k < b->narms; k++) {
            fprintf(o, "- %s: `%s`", b->arms[k].name, b->arms[k].bin);
            for (int q = 0; q < b->arms[k].nopts; q++) fprintf(o, " `%s`", b->arms[k].opts[q]);
            fprintf(o, "%s\n", b->arms[k].no_id_check ? " (--no-id-check: its output is not compared)" : "");
        }
        if (json_array_size(fails)) {
            fprintf(o, "\nFAILED:\n");
            json_array_foreach(fails, i, v) fprintf(o, "- %s\n", json_string_value(v));
        }
        json_t *plots = json_object_get(res, "plots");
        if (json_array_size(plots)) {
            fprintf(o, "\nplots:");
            json_array_foreach(plots, i, v) fprintf(o, " %s", json_string_value(v));
            fprintf(o, "\n");
        }
    }
    return ferror(f) | fclose(f) ? -1 : 0;
}

/* ---- machine, commit -------------------------------------------------------- */

static json_t *machine_info(void) {
    json_t *m = json_object();
    char cpu[256] = "unknown", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    struct utsname u;
    json_object_set_new(m, "cpu", json_string(cpu));
    json_object_set_new(m, "cpus", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    json_object_set_new(m, "mem_bytes", json_integer((json_int_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE)));
    json_object_set_new(m, "kernel", json_string(uname(&u) ? "?" : u.release));
    json_object_set_new(m, "hostname", json_string(uname(&u) ? "?" : u.nodename));
    return m;
}

/* `git rev-parse HEAD` of the current directory, or "unknown". */
static void git_commit(const char *dir, char *out, size_t n) {
    char f[4200], e[64], *t = NULL;
    size_t len = 0;
    snprintf(out, n, "unknown");
    snprintf(f, sizeof f, "%s/git-head", dir);
    char *argv[] = {"git", "rev-parse", "HEAD", NULL};
    pid_t pid = spawn(argv, NULL, f, "/dev/null", 1, e, sizeof e);
    if (pid < 0 || wait_child(pid, 20) != 0) return;
    if (df_read_file(f, &t, &len, e, sizeof e)) return;
    t[strcspn(t, "\n")] = 0;
    if (t[0]) snprintf(out, n, "%s", t);
    free(t);
    unlink(f);
}

static int mkdirs(const char *path) {
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') { *s = 0; if (mkdir(p, 0755) && errno != EEXIST) return -1; *s = '/'; }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

static int64_t tree_bytes(const char *path, int depth) {
    struct stat st;
    if (stat(path, &st)) return 0;
    if (S_ISREG(st.st_mode)) return st.st_size;
    if (!S_ISDIR(st.st_mode) || depth > 2) return 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    int64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        n += tree_bytes(p, depth + 1);
    }
    closedir(d);
    return n;
}

/* ---- the command ------------------------------------------------------------ */

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "deltafin bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see deltafin bench --help)\n");
    va_end(ap);
    return 2;
}

static void free_arms(bench_t *b) {
    for (int k = 0; k < b->narms; k++) {
        free(b->arms[k].bin);
        for (int q = 0; q < b->arms[k].nopts; q++) free(b->arms[k].opts[q]);
    }
}

int df_bench_workload(int argc, char **argv) {
    bench_t *b = df_xcalloc(1, sizeof *b);
    b->wl = -1;
    for (int w = 0; w < W_N; w++)
        if (!strcmp(argv[1], wl_name[w])) b->wl = w;
    b->reps = 3, b->max_new = 64, b->prompt_len = 256, b->clients = 2, b->requests = 4, b->timeout = 600;
    b->floor_mem = (int64_t)1 << 30, b->floor_disk = (int64_t)1 << 30;
    df_args a;
    df_args_init(&a, argc, argv);
    a.cmd = "bench";
    a.i = 2;
    const char *opt;
    char err[1024];
    long v;
    double f;
    int code = 2;
    while ((opt = df_args_next(&a))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) { fputs(usage, stdout); code = 0; goto out; }
        if (df_args_opt(&a, opt, "--arm", 1)) { if (parse_arm(b, a.val, err, sizeof err)) { bad("%s", err); goto out; } }
        else if (df_args_opt(&a, opt, "--reps", 1)) { if (df_parse_int(a.val, 1, 64, &b->reps)) df_args_fail(&a, "--reps: expected 1..64, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--max-new", 1)) { if (df_parse_int(a.val, 1, 1 << 20, &b->max_new)) df_args_fail(&a, "--max-new: expected 1..1048576, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--prompt-len", 1)) { if (df_parse_int(a.val, 1, 1000, &b->prompt_len)) df_args_fail(&a, "--prompt-len: expected 1..1000, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--clients", 1)) { if (df_parse_int(a.val, 1, 256, &b->clients)) df_args_fail(&a, "--clients: expected 1..256, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--requests", 1)) { if (df_parse_int(a.val, 1, 10000, &b->requests)) df_args_fail(&a, "--requests: expected 1..10000, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--threads", 1)) { if (df_parse_int(a.val, 1, 1024, &b->threads)) df_args_fail(&a, "--threads: expected 1..1024, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--timeout", 1)) { if (df_parse_float(a.val, &f) || f <= 0 || f > 86400) df_args_fail(&a, "--timeout: expected seconds in (0, 86400], got '%s'", a.val); else b->timeout = f; }
        else if (df_args_opt(&a, opt, "--floor-mem", 1)) { b->floor_mem = df_parse_size(a.val); if (b->floor_mem < (1 << 20)) df_args_fail(&a, "--floor-mem: expected a size of at least 1M, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--floor-disk", 1)) { b->floor_disk = df_parse_size(a.val); if (b->floor_disk < (1 << 20)) df_args_fail(&a, "--floor-disk: expected a size of at least 1M, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--no-floors", 0)) b->no_floors = 1;
        else if (df_args_opt(&a, opt, "--model", 1)) b->model = a.val;
        else if (df_args_opt(&a, opt, "--prompt", 1)) b->prompt = a.val;
        else if (df_args_opt(&a, opt, "--ids", 1)) b->ids = a.val;
        else if (df_args_opt(&a, opt, "--out", 1)) b->out = a.val;
        else if (df_args_opt(&a, opt, "--corpus", 1)) b->corpus = a.val;
        else if (df_args_opt(&a, opt, "--tokenizer", 1)) b->tokenizer = a.val;
        else if (df_args_opt(&a, opt, "--expert-cache", 1)) { b->expert_cache = a.val; if (df_parse_size(a.val) < 0) df_args_fail(&a, "--expert-cache: expected a size, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--no-id-check", 1)) { if (b->n_no_id_check < MAX_ARMS) b->no_id_check[b->n_no_id_check++] = (char *)a.val; else df_args_fail(&a, "--no-id-check: at most %d", MAX_ARMS); }
        else if (!a.bad) df_args_fail(&a, "unknown option '%s'", opt);
    }
    (void)v;
    if (a.bad) goto out;
    if (b->narms < 2) { bad("%s: give at least two arms (--arm NAME=BINARY[:OPTIONS]), got %d", wl_name[b->wl], b->narms); goto out; }
    if (b->prompt && b->ids) { bad("give at most one of --prompt and --ids"); goto out; }
    if (b->wl == W_SERVER && b->ids) { bad("server: --ids is not supported (the requests send --prompt text)"); goto out; }
    if (b->ids) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (df_parse_ids(b->ids, &ids, &n, err, sizeof err)) { bad("--ids: %s", err); goto out; }
        free(ids);
    }
    if (b->wl == W_TOKENIZER) {
        if (!b->corpus) { bad("tokenizer: --corpus FILE is required"); goto out; }
        if (access(b->corpus, R_OK)) { bad("tokenizer: --corpus %s: cannot read it: %s", b->corpus, strerror(errno)); goto out; }
    }
    if (!b->model) b->model = DF_DEFAULT_MODEL;
    for (int q = 0; q < b->n_no_id_check; q++) {
        int found = 0;
        for (int k = 0; k < b->narms; k++)
            if (!strcmp(b->arms[k].name, b->no_id_check[q])) b->arms[k].no_id_check = 1, found = 1;
        if (!found) { bad("--no-id-check %s: no arm has that name", b->no_id_check[q]); goto out; }
    }
    if (b->arms[0].no_id_check) { bad("--no-id-check %s: the first arm is the reference the others are checked against", b->arms[0].name); goto out; }
    /* the output directory */
    char defout[128];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    if (!b->out) {
        snprintf(defout, sizeof defout, "bench-%s-%04d%02d%02d-%02d%02d%02d", wl_name[b->wl], tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        b->out = defout;
    }
    if (strlen(b->out) > 1900) { bad("--out: a path of at most 1900 bytes"); goto out; }
    snprintf(b->rundir, sizeof b->rundir, "%s/runs", b->out);
    if (mkdirs(b->rundir)) { fprintf(stderr, "deltafin bench: --out %s: cannot create %s: %s\n", b->out, b->rundir, strerror(errno)); code = 1; goto out; }
    code = 1;
    if (b->wl == W_PREFILL) {
        size_t o = 0;
        for (long i = 0; i < b->prompt_len && o + 8 < sizeof b->gen_ids; i++) o += (size_t)snprintf(b->gen_ids + o, sizeof b->gen_ids - o, "%s%ld", i ? "," : "", 1 + (i * 37) % 251);
    }
    if (b->wl == W_TOKENIZER) {
        char p[4200];
        snprintf(p, sizeof p, "%s/empty_ids.json", b->rundir);
        FILE *ef = fopen(p, "w");
        if (!ef || fputs("[]\n", ef) < 0 || fclose(ef)) { fprintf(stderr, "deltafin bench: cannot write %s\n", p); goto out; }
    }
    if (b->wl == W_SERVER || b->wl == W_TOKENIZER) b->no_floors = 1; /* no compute floor applies: latencies and tokenizer MB/s are shown as measured */
    /* floors, before the runs */
    if (!b->no_floors) {
        fprintf(stderr, "[bench] measuring floors (memory read over %lld MB, FMA peak)...\n", (long long)(b->floor_mem >> 20));
        df_pool_init(b->threads ? (int)b->threads : 0);
        df_bench_floors((size_t)b->floor_mem, b->floor_mem >= (1 << 30) ? 20000000 : 2000000, &b->fl);
        b->have_floors = 1;
    }
    if (b->wl == W_STREAM) {
        char big[4096] = "";
        off_t bs = 0;
        largest_file(b->model, big, sizeof big, &bs, 0);
        b->disk_gbs = 0;
        if (!big[0]) snprintf(b->disk_note, sizeof b->disk_note, "not measured: no file under %.900s", b->model);
        else if (b->no_floors) snprintf(b->disk_note, sizeof b->disk_note, "not measured (--no-floors)");
        else {
            evict_files(big, 0);
            if (df_disk_read_bw(big, 8, (size_t)4 << 20, b->floor_disk, &b->disk_gbs, err, sizeof err))
                snprintf(b->disk_note, sizeof b->disk_note, "not measured: %.900s", err), b->disk_gbs = 0;
            else snprintf(b->disk_note, sizeof b->disk_note, "%.3f GB/s O_DIRECT (io_uring, 4 MiB reads at queue depth 8) on %.900s", b->disk_gbs, big);
        }
        snprintf(b->cache_note, sizeof b->cache_note, "the model's files evicted with posix_fadvise(DONTNEED) before every run "
                 "(clean pages only, no root needed; /proc/sys/vm/drop_caches is not used: it would drop every user's cache)");
    }
    /* the runs: rep r runs arm (r + j) % narms as its j-th */
    json_t *res = json_object(), *runs_by_arm = json_object(), *order = json_array(), *fails = json_array();
    for (int k = 0; k < b->narms; k++) json_object_set_new(runs_by_arm, b->arms[k].name, json_array());
    if (b->wl == W_SERVER) curl_global_init(CURL_GLOBAL_DEFAULT);
    int seq = 0;
    for (long r = 0; r < b->reps; r++)
        for (int j = 0; j < b->narms; j++, seq++) {
            const arm_t *arm = &b->arms[(r + j) % b->narms];
            char tag[128];
            snprintf(tag, sizeof tag, "%s-rep%ld", arm->name, r);
            json_t *rec = json_object();
            json_object_set_new(rec, "arm", json_string(arm->name));
            json_object_set_new(rec, "rep", json_integer(r));
            json_object_set_new(rec, "seq", json_integer(seq));
            if (b->wl == W_SERVER) run_workload_server(b, arm, tag, rec);
            else if (b->wl == W_TOKENIZER) run_workload_tokenizer(b, arm, tag, rec);
            else run_workload_run(b, arm, tag, rec);
            json_t *o = json_object();
            json_object_set_new(o, "seq", json_integer(seq));
            json_object_set_new(o, "arm", json_string(arm->name));
            json_object_set_new(o, "rep", json_integer(r));
            json_array_append_new(order, o);
            const char *pk = wl_metrics[b->wl][0].key;
            if (json_is_true(json_object_get(rec, "ok")))
                fprintf(stderr, "[bench] %s rep %ld/%ld arm %s: %s %.4g\n", wl_name[b->wl], r + 1, b->reps, arm->name, wl_metrics[b->wl][0].label, jnum(rec, pk));
            else {
                fprintf(stderr, "[bench] %s rep %ld/%ld arm %s: FAILED: %s\n", wl_name[b->wl], r + 1, b->reps, arm->name, json_string_value(json_object_get(rec, "error")));
                json_array_append_new(fails, json_sprintf("arm %s rep %ld: %s", arm->name, r, json_string_value(json_object_get(rec, "error"))));
            }
            json_array_append_new(json_object_get(runs_by_arm, arm->name), rec);
        }
    if (b->wl == W_SERVER) curl_global_cleanup();
    /* the gate */
    json_t *ref = NULL, *ref2 = NULL;
    json_t *first = json_object_get(runs_by_arm, b->arms[0].name), *rr;
    size_t ri;
    json_array_foreach(first, ri, rr) if (json_is_true(json_object_get(rr, "ok")) && !ref) ref = gate_key(b->wl, rr, &ref2);
    for (int k = 0; k < b->narms && ref; k++) {
        json_array_foreach(json_object_get(runs_by_arm, b->arms[k].name), ri, rr) {
            if (!json_is_true(json_object_get(rr, "ok"))) continue;
            if (b->arms[k].no_id_check) { json_object_set_new(rr, "id_check", json_string("skipped (--no-id-check)")); continue; }
            json_t *k2, *key = gate_key(b->wl, rr, &k2);
            if (json_equal(key, ref) && (!ref2 || json_equal(k2, ref2))) { json_object_set_new(rr, "id_check", json_string("equal")); continue; }
            char m[512];
            describe_diff(b->wl, json_equal(key, ref) ? ref2 : ref, json_equal(key, ref) ? k2 : key, m, sizeof m);
            json_object_set_new(rr, "id_check", json_string("DIFFERENT"));
            json_array_append_new(fails, json_sprintf("arm %s rep %lld: %s than arm %s rep 0 (the first arm's output is the reference; "
                                                      "--no-id-check NAME for an arm whose options change the output)",
                                                      b->arms[k].name, (long long)json_integer_value(json_object_get(rr, "rep")), m, b->arms[0].name));
            fprintf(stderr, "[bench] FAILED: arm %s rep %lld: %s\n", b->arms[k].name, (long long)json_integer_value(json_object_get(rr, "rep")), m);
        }
    }
    if (!ref) json_array_append_new(fails, json_sprintf("arm %s: no run passed, so there is no reference output", b->arms[0].name));
    const int failed = json_array_size(fails) > 0;
    /* results.json */
    char date[64], commit[128];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    git_commit(b->rundir, commit, sizeof commit);
    df_buf cl = {0};
    json_t *cmd = json_array();
    for (int i = 0; i < argc; i++) { /* command_line: shell-quoted where a word needs it, to paste and rerun */
        json_array_append_new(cmd, json_string(argv[i]));
        df_buf_puts(&cl, i ? " " : "deltafin ");
        if (argv[i][0] && !argv[i][strspn(argv[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%")]) {
            df_buf_puts(&cl, argv[i]);
            continue;
        }
        df_buf_put(&cl, "'", 1);
        for (const char *c = argv[i]; *c; c++) df_buf_puts(&cl, *c == '\'' ? "'\\''" : (char[2]){*c, 0});
        df_buf_put(&cl, "'", 1);
    }
    json_object_set_new(res, "workload", json_string(wl_name[b->wl]));
    json_object_set_new(res, "status", json_string(failed ? "FAILED" : "PASSED"));
    json_object_set_new(res, "failures", fails);
    json_object_set_new(res, "date", json_string(date));
    json_object_set_new(res, "git_commit", json_string(commit));
    json_object_set_new(res, "machine", machine_info());
    json_object_set_new(res, "command", cmd);
    json_object_set_new(res, "command_line", json_stringn(cl.p ? cl.p : "", cl.len));
    df_buf_free(&cl);
    json_t *fj = json_object();
    if (b->have_floors) {
        json_object_set_new(fj, "threads", json_integer(b->fl.threads));
        json_object_set_new(fj, "isa", json_string(b->fl.isa));
        json_object_set_new(fj, "mem_read_gbs", json_real(b->fl.mem_read_gbs));
        json_object_set_new(fj, "mem_read_gbs_1t", json_real(b->fl.mem_read_gbs_1t));
        json_object_set_new(fj, "mem_method", json_string(b->fl.mem_method));
        json_object_set_new(fj, "peak_fma_gflops", json_real(b->fl.peak_fma_gflops));
        json_object_set_new(fj, "mem_buffer_bytes", json_integer(b->floor_mem));
    }
    if (b->wl == W_STREAM) {
        if (b->disk_gbs > 0) json_object_set_new(fj, "disk_read_gbs", json_real(b->disk_gbs));
        json_object_set_new(fj, "disk_note", json_string(b->disk_note));
        json_object_set_new(res, "page_cache", json_string(b->cache_note));
        json_object_set_new(res, "model_bytes", json_integer(tree_bytes(b->model, 0)));
    }
    json_object_set_new(res, "floors", fj);
    json_t *arms = json_array();
    for (int k = 0; k < b->narms; k++) {
        json_t *ao = json_object(), *oo = json_array();
        for (int q = 0; q < b->arms[k].nopts; q++) json_array_append_new(oo, json_string(b->arms[k].opts[q]));
        json_object_set_new(ao, "name", json_string(b->arms[k].name));
        json_object_set_new(ao, "binary", json_string(b->arms[k].bin));
        json_object_set_new(ao, "options", oo);
        json_object_set_new(ao, "id_check", json_boolean(!b->arms[k].no_id_check));
        json_array_append_new(arms, ao);
    }
    json_object_set_new(res, "arms", arms);
    json_object_set_new(res, "reps", json_integer(b->reps));
    json_object_set_new(res, "order", order);
    json_t *params = json_object();
    json_object_set_new(params, "model", json_string(b->model));
    json_object_set_new(params, "max_new", json_integer(b->max_new));
    if (b->wl == W_PREFILL) json_object_set_new(params, "prompt_len", json_integer(b->prompt_len));
    if (b->wl == W_SERVER) json_object_set_new(params, "clients", json_integer(b->clients)), json_object_set_new(params, "requests_per_client", json_integer(b->requests));
    if (b->wl == W_TOKENIZER) json_object_set_new(params, "corpus", json_string(b->corpus));
    json_object_set_new(res, "params", params);
    json_object_set_new(res, "runs", runs_by_arm);
    json_object_set_new(res, "summary", summarize(b, runs_by_arm));
    /* plots */
    json_t *plots = json_array();
    json_object_set_new(res, "plots", plots);
    int prc = plot_runs(b, runs_by_arm, &wl_metrics[b->wl][0], "runs.svg", plots, err, sizeof err);
    if (!prc && b->wl == W_TOKENIZER) prc = plot_runs(b, runs_by_arm, &wl_metrics[b->wl][1], "runs_decode.svg", plots, err, sizeof err);
    if (!prc && b->wl == W_SERVER) {
        prc = plot_cdf(b, runs_by_arm, "ttft_s_all", "latency_ttft.svg", "time to first token", plots, err, sizeof err);
        if (!prc) prc = plot_cdf(b, runs_by_arm, "itl_s_all", "latency_itl.svg", "inter-token latency", plots, err, sizeof err);
    }
    if (!prc && (b->wl == W_DECODE || b->wl == W_STREAM)) {
        prc = plot_over_run(b, runs_by_arm, OVER_TOK_S, plots, err, sizeof err);
        int streamed = b->wl == W_STREAM;
        json_array_foreach(first, ri, rr) if (json_is_true(json_object_get(rr, "streaming"))) streamed = 1;
        if (!prc && streamed) prc = plot_over_run(b, runs_by_arm, OVER_HIT, plots, err, sizeof err);
        if (!prc && streamed) prc = plot_over_run(b, runs_by_arm, OVER_BYTES, plots, err, sizeof err);
    }
    if (prc) { fprintf(stderr, "deltafin bench: %s\n", err); json_decref(res); goto out; }
    char path[4200];
    snprintf(path, sizeof path, "%s/results.json", b->out);
    if (json_dump_file(res, path, JSON_INDENT(1))) { fprintf(stderr, "deltafin bench: cannot write %s\n", path); json_decref(res); goto out; }
    snprintf(path, sizeof path, "%s/results.md", b->out);
    if (write_md(b, res, path, stdout)) { fprintf(stderr, "deltafin bench: cannot write %s\n", path); json_decref(res); goto out; }
    fprintf(stderr, "[bench] %s: results.json, results.md and %zu plots in %s\n", failed ? "FAILED" : "PASSED", json_array_size(plots), b->out);
    json_decref(res);
    code = failed ? 1 : 0;
out:
    free_arms(b);
    free(b);
    return code;
}
