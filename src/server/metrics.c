/* metrics.c - see metrics.h. Counters in fixed arrays behind one mutex,
 * rendered as Prometheus text exposition format 0.0.4: for each family a
 * "# HELP" and a "# TYPE" line, then its samples; counters end in _total;
 * histograms give cumulative _bucket{le="..."} lines ending with +Inf, then
 * _sum and _count; label values are escaped (backslash, double quote,
 * newline). */
#include "server/metrics.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/util.h"

/* ---- the label tables ---------------------------------------------------- */

static const char *const ROUTES[] = {
    "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
    "/v1/models", "/health", "/metrics", "other",
};
#define N_ROUTES (sizeof ROUTES / sizeof *ROUTES)

static const char *const OUTCOMES[] = {
    "ok", "bad_request", "unauthorized", "not_found", "method_not_allowed", "payload_too_large",
    "rate_limited", "client_error", "server_error", "cancelled",
};
#define N_OUTCOMES (sizeof OUTCOMES / sizeof *OUTCOMES)

/* Histogram bucket upper bounds, seconds. */
static const double TTFT_LE[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const double GAP_LE[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
#define N_TTFT (sizeof TTFT_LE / sizeof *TTFT_LE)
#define N_GAP (sizeof GAP_LE / sizeof *GAP_LE)

typedef struct {
    uint64_t n[16]; /* per bucket (not cumulative); the last one used is the +Inf bucket */
    double sum;
    uint64_t count;
} hist;

struct df_metrics {
    pthread_mutex_t mu;
    char *model_id;
    double t_start;
    uint64_t req[N_ROUTES][N_OUTCOMES];
    uint64_t gens, memo_hits;
    uint64_t tok_prompt, tok_cached, tok_out;
    uint64_t drafted, accepted;
    hist ttft, gap;
    df_stats st;
    int have_st;
};

_Static_assert(N_TTFT < 16 && N_GAP < 16, "histogram buckets fit hist.n");

df_metrics *df_metrics_new(const char *model_id) {
    df_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->model_id = strdup(model_id ? model_id : "");
    if (!m->model_id) { free(m); return NULL; }
    pthread_mutex_init(&m->mu, NULL);
    m->t_start = df_now();
    return m;
}

void df_metrics_free(df_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->model_id);
    free(m);
}

static size_t route_index(const char *path) {
    for (size_t i = 0; i + 1 < N_ROUTES; i++)
        if (path && !strcmp(path, ROUTES[i])) return i;
    if (path && !strncmp(path, "/v1/models/", 11)) return 5; /* /v1/models/ID: one series, not one per id */
    return N_ROUTES - 1;
}

const char *df_metrics_outcome(int status) {
    switch (status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 413: return "payload_too_large";
    case 429: return "rate_limited";
    case 499: return "cancelled";
    default: break;
    }
    if (status <= 0) return "cancelled"; /* never answered: the connection went first */
    if (status >= 200 && status < 400) return "ok";
    if (status >= 400 && status < 500) return "client_error";
    return "server_error";
}

static size_t outcome_index(int status, int complete) {
    const char *o = complete ? df_metrics_outcome(status) : "cancelled";
    for (size_t i = 0; i < N_OUTCOMES; i++)
        if (!strcmp(o, OUTCOMES[i])) return i;
    return N_OUTCOMES - 1;
}

void df_metrics_request(df_metrics *m, const char *path, int status, int complete) {
    if (!m) return;
    size_t r = route_index(path), o = outcome_index(status, complete);
    pthread_mutex_lock(&m->mu);
    m->req[r][o]++;
    pthread_mutex_unlock(&m->mu);
}

void df_metrics_generation(df_metrics *m, long prompt, long cached, long generated, long drafted, long accepted) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->gens++;
    m->tok_prompt += prompt > 0 ? (uint64_t)prompt : 0;
    m->tok_cached += cached > 0 ? (uint64_t)cached : 0;
    m->tok_out += generated > 0 ? (uint64_t)generated : 0;
    m->drafted += drafted > 0 ? (uint64_t)drafted : 0;
    m->accepted += accepted > 0 ? (uint64_t)accepted : 0;
    pthread_mutex_unlock(&m->mu);
}

void df_metrics_memo_hit(df_metrics *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->memo_hits++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(df_metrics *m, hist *h, const double *le, size_t nle, double v) {
    if (!m) return;
    if (!(v >= 0)) v = 0; /* NaN or a clock step back */
    size_t b = 0;
    while (b < nle && v > le[b]) b++; /* b == nle: the +Inf bucket */
    pthread_mutex_lock(&m->mu);
    h->n[b]++;
    h->sum += v;
    h->count++;
    pthread_mutex_unlock(&m->mu);
}

void df_metrics_ttft(df_metrics *m, double s) { if (m) observe(m, &m->ttft, TTFT_LE, N_TTFT, s); }
void df_metrics_token_gap(df_metrics *m, double s) { if (m) observe(m, &m->gap, GAP_LE, N_GAP, s); }

void df_metrics_engine(df_metrics *m, const df_stats *st) {
    if (!m || !st) return;
    pthread_mutex_lock(&m->mu);
    m->st = *st;
    m->have_st = 1;
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering -------------------------------------------------------------- */

/* A label value with \, " and newline escaped as the format asks. */
static void put_label(FILE *f, const char *v) {
    for (; *v; v++) {
        if (*v == '\\') fputs("\\\\", f);
        else if (*v == '"') fputs("\\\"", f);
        else if (*v == '\n') fputs("\\n", f);
        else fputc(*v, f);
    }
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_hist(FILE *f, const char *name, const char *help, const hist *h, const double *le, size_t nle) {
    family(f, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t b = 0; b < nle; b++) {
        cum += h->n[b];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, le[b], (unsigned long long)cum);
    }
    cum += h->n[nle];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    fprintf(f, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

static void counter1(FILE *f, const char *name, const char *help, uint64_t v) {
    family(f, name, "counter", help);
    fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

static void gauge1(FILE *f, const char *name, const char *help, double v) {
    family(f, name, "gauge", help);
    fprintf(f, "%s %.17g\n", name, v);
}

/* Resident memory now (bytes), from /proc/self/statm; 0 if unknown. */
static int64_t rss_now(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long long size = 0, res = 0;
    int ok = fscanf(f, "%lld %lld", &size, &res) == 2;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return ok && page > 0 ? (int64_t)res * page : 0;
}

char *df_metrics_render(df_metrics *m, int queue_waiting, int running, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    int64_t rss = rss_now();
    pthread_mutex_lock(&m->mu);
    const df_stats *st = &m->st;

    family(f, "deltafin_build_info", "gauge", "The server's version and served model id (value 1).");
    fprintf(f, "deltafin_build_info{version=\"");
    put_label(f, DF_VERSION);
    fprintf(f, "\",model=\"");
    put_label(f, m->model_id);
    fprintf(f, "\"} 1\n");
    gauge1(f, "deltafin_uptime_seconds", "Seconds since the server started.", df_now() - m->t_start);

    family(f, "deltafin_requests_total", "counter",
           "HTTP requests answered, by route (other: unknown paths) and outcome (ok, bad_request, unauthorized, "
           "not_found, method_not_allowed, payload_too_large, rate_limited, client_error, server_error, cancelled).");
    for (size_t r = 0; r < N_ROUTES; r++)
        for (size_t o = 0; o < N_OUTCOMES; o++)
            if (m->req[r][o])
                fprintf(f, "deltafin_requests_total{route=\"%s\",outcome=\"%s\"} %llu\n", ROUTES[r], OUTCOMES[o],
                        (unsigned long long)m->req[r][o]);
    counter1(f, "deltafin_generations_total", "Generations the engine ran (a memo answer is not one).", m->gens);
    counter1(f, "deltafin_memo_hits_total", "Answers given from the exact-response memo, without the engine.", m->memo_hits);
    counter1(f, "deltafin_prompt_tokens_total", "Prompt tokens of the generations the engine ran.", m->tok_prompt);
    counter1(f, "deltafin_prompt_tokens_cached_total", "Of those, tokens reused from the session (prefix reuse).", m->tok_cached);
    counter1(f, "deltafin_completion_tokens_total", "Tokens generated by the engine.", m->tok_out);
    render_hist(f, "deltafin_time_to_first_token_seconds", "Seconds from a request's arrival to its first generated token.",
                &m->ttft, TTFT_LE, N_TTFT);
    render_hist(f, "deltafin_inter_token_latency_seconds", "Seconds between two successive tokens of one generation.",
                &m->gap, GAP_LE, N_GAP);
    gauge1(f, "deltafin_queue_waiting", "Requests waiting for the engine now.", queue_waiting);
    gauge1(f, "deltafin_generation_running", "1 while a generation holds the engine.", running);

    family(f, "deltafin_expert_cache_hits_total", "counter",
           "Routed-expert lookups served from a tier's cache (ram: the host expert cache, prefetched ones included; "
           "vram: the GPU cache, counted per expert part).");
    fprintf(f, "deltafin_expert_cache_hits_total{tier=\"ram\"} %lld\n", (long long)(st->expert_hits + st->expert_prefetch_hits));
    if (st->gpu_budget_bytes) fprintf(f, "deltafin_expert_cache_hits_total{tier=\"vram\"} %lld\n", (long long)st->gpu_cache_hits);
    family(f, "deltafin_expert_cache_misses_total", "counter", "Routed-expert lookups a tier's cache did not hold.");
    fprintf(f, "deltafin_expert_cache_misses_total{tier=\"ram\"} %lld\n", (long long)st->expert_misses);
    if (st->gpu_budget_bytes) fprintf(f, "deltafin_expert_cache_misses_total{tier=\"vram\"} %lld\n", (long long)st->gpu_cache_misses);
    family(f, "deltafin_expert_cache_read_bytes_total", "counter",
           "Expert bytes brought into a tier (ram: read from disk; vram: copied from the host).");
    fprintf(f, "deltafin_expert_cache_read_bytes_total{tier=\"ram\"} %lld\n", (long long)st->bytes_read);
    if (st->gpu_budget_bytes) fprintf(f, "deltafin_expert_cache_read_bytes_total{tier=\"vram\"} %lld\n", (long long)st->gpu_h2d_expert_bytes);
    counter1(f, "deltafin_expert_prefetch_hits_total", "Expert lookups served by a prefetched read.", (uint64_t)st->expert_prefetch_hits);
    counter1(f, "deltafin_expert_prefetch_issued_total", "Prefetch reads issued.", (uint64_t)st->prefetch_issued);
    counter1(f, "deltafin_expert_prefetch_unused_total", "Prefetch reads evicted before use.", (uint64_t)st->prefetch_unused);
    counter1(f, "deltafin_expert_prefetch_predicted_total", "Router-lookahead predictions of non-resident experts judged.",
             (uint64_t)st->prefetch_predicted);
    counter1(f, "deltafin_expert_prefetch_predicted_right_total", "Of those, predictions that were right.",
             (uint64_t)st->prefetch_predicted_right);
    gauge1(f, "deltafin_expert_prefetch_precision", "predicted_right / predicted (0 before any prediction).",
           st->prefetch_predicted ? (double)st->prefetch_predicted_right / (double)st->prefetch_predicted : 0.0);
    counter1(f, "deltafin_spec_drafted_tokens_total", "Draft tokens proposed to speculative verify passes.", m->drafted);
    counter1(f, "deltafin_spec_accepted_tokens_total", "Of those, draft tokens accepted.", m->accepted);

    family(f, "deltafin_memory_bytes", "gauge",
           "Memory per tier (rss: the process now; peak_rss: its peak; expert_cache_ram: host expert-cache slots; "
           "vram_budget, vram_used, vram_spine, vram_expert_cache: the GPU, when the backend has one).");
    fprintf(f, "deltafin_memory_bytes{tier=\"rss\"} %lld\n", (long long)rss);
    fprintf(f, "deltafin_memory_bytes{tier=\"peak_rss\"} %lld\n", (long long)(m->have_st ? st->peak_rss_bytes : 0));
    fprintf(f, "deltafin_memory_bytes{tier=\"expert_cache_ram\"} %lld\n", (long long)st->expert_cache_bytes);
    if (st->gpu_budget_bytes) {
        fprintf(f, "deltafin_memory_bytes{tier=\"vram_budget\"} %lld\n", (long long)st->gpu_budget_bytes);
        fprintf(f, "deltafin_memory_bytes{tier=\"vram_used\"} %lld\n", (long long)st->gpu_used_bytes);
        fprintf(f, "deltafin_memory_bytes{tier=\"vram_spine\"} %lld\n", (long long)st->gpu_spine_bytes);
        fprintf(f, "deltafin_memory_bytes{tier=\"vram_expert_cache\"} %lld\n", (long long)st->gpu_cache_bytes);
    }
    pthread_mutex_unlock(&m->mu);
    if (fclose(f)) { free(buf); return NULL; }
    *len = n;
    return buf;
}
