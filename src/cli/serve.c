/* serve.c - `deltafin serve`: the OpenAI-compatible HTTP server.
 *
 * Opens the model once, starts the HTTP layer (src/server/http.c) with the
 * OpenAI routes (src/server/openai.c) as its handler, prints the address it
 * listens on, and runs until SIGINT or SIGTERM. Those two signals are
 * blocked in every thread and taken by sigwait here, so shutdown is an
 * ordinary function call: running generations are told to stop, then the
 * connection threads are joined.
 */
#include "cli/args.h"
#include "cli/cli.h"
#include "server/http.h"
#include "server/openai.h"
#include "util/util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *usage =
    "usage: deltafin serve --model M [options]\n"
    "OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions,\n"
    "GET /v1/models, GET /health, GET /metrics (Prometheus text format). One generation at a time;\n"
    "see docs/SERVER.md.\n"
    "  --host ADDR               address to listen on (default 127.0.0.1: this machine only)\n"
    "  --port N                  TCP port (default 8000; 0 picks a free one, printed at start)\n"
    "  --api-key KEY             require 'Authorization: Bearer KEY' on /v1/* (default: $DELTAFIN_API_KEY if set)\n"
    "  --max-request-bytes SIZE  largest request body (default 16MiB); larger gets 413\n"
    "  --max-connections N       open connections at most (default 256)\n"
    "  --max-connections-per-client N  open connections per client address (default 32; 0: no limit)\n"
    "  --header-timeout SECS     request headers must arrive within this (default 10)\n"
    "  --idle-timeout SECS       keep-alive connections idle longer are closed (default 30; 2 when busy)\n"
    "  --spec MODE --spec-max K --draft MODEL   speculative decoding as in `deltafin run` (default auto: prompt\n"
    "                            lookup while it pays); the tokens are those of --spec none, only the speed differs\n"
    "  --body-min-rate SIZE      request bodies slower than SIZE bytes/s after the header timeout are cut\n"
    "                            (default 32KiB; 0: off)\n"
    "  --max-tokens N            most completion tokens one request may ask for (default: the context)\n"
    "  --ctx N                   context length of the server's session (default: min(model, 8192))\n"
    "  --queue N                 requests that may wait for the engine (default 16); more get 429\n"
    "  --no-memo                 do not answer repeated deterministic requests from memory\n"
    "  --cache-dir DIR           prompt cache on disk: session states of past prompts, reused by later requests\n"
    "                            and after a restart (default: none)\n"
    "  --cache-size SIZE         bound of --cache-dir, least recently used files deleted first (default 4GiB)\n"
    "  --served-model-name ID    the model id clients send and see (default: the --model name's last part)\n"
    "  --quiet                   no per-request log lines on stderr\n"
    "  --threads N --ram SIZE --expert-cache SIZE --prefetch MODE --backend B --gpu-memory SIZE   as for deltafin run\n";

/* The last path component of a model path or name, without trailing '/'. */
static char *default_id(const char *model) {
    size_t n = strlen(model);
    while (n > 1 && model[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && model[b - 1] != '/') b--;
    char *id = df_xmalloc(n - b + 1);
    memcpy(id, model + b, n - b);
    id[n - b] = 0;
    return id;
}

static int is_loopback(const char *h) {
    return !strcmp(h, "127.0.0.1") || !strcmp(h, "::1") || !strcmp(h, "localhost") || !strncmp(h, "127.", 4);
}

int df_cmd_serve(int argc, char **argv) {
    df_args a;
    df_args_init(&a, argc, argv);
    df_options o;
    df_cli_options_default(&o);
    df_spec_opts spo;
    df_spec_opts_default(&spo);
    const char *cache_dir = NULL;
    int64_t cache_size = (int64_t)4 << 30;
    const char *model = NULL, *host = "127.0.0.1", *api_key = getenv("DELTAFIN_API_KEY"), *name = NULL, *opt;
    long port = 8000, max_tokens = 0, queue = 16, ctx = 0;
    int64_t max_body = (int64_t)16 << 20, min_rate = (int64_t)32 << 10;
    long max_conns = 256, per_ip = 32;
    double header_timeout = 10, idle_timeout = 30;
    int memo = 1, quiet = 0;
    while ((opt = df_args_next(&a))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) { fputs(usage, stdout); return 0; }
        if (df_args_model_opts(&a, opt, &model, &o)) continue;
        if (df_args_spec_opts(&a, opt, &spo)) continue;
        if (df_args_opt(&a, opt, "--host", 1)) host = a.val;
        else if (df_args_opt(&a, opt, "--api-key", 1)) api_key = a.val;
        else if (df_args_opt(&a, opt, "--served-model-name", 1)) name = a.val;
        else if (df_args_opt(&a, opt, "--no-memo", 0)) memo = 0;
        else if (df_args_opt(&a, opt, "--cache-dir", 1)) cache_dir = a.val;
        else if (df_args_opt(&a, opt, "--cache-size", 1)) {
            cache_size = df_parse_size(a.val);
            if (cache_size <= 0) df_args_fail(&a, "--cache-size: expected a size like 4GiB, got '%s'", a.val);
        }
        else if (df_args_opt(&a, opt, "--quiet", 0)) quiet = 1;
        else if (df_args_opt(&a, opt, "--port", 1)) { if (df_parse_int(a.val, 0, 65535, &port)) df_args_fail(&a, "--port: expected 0..65535, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--max-tokens", 1)) { if (df_parse_int(a.val, 1, 1L << 30, &max_tokens)) df_args_fail(&a, "--max-tokens: expected a positive count, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--ctx", 1)) { if (df_parse_int(a.val, 2, 1L << 24, &ctx)) df_args_fail(&a, "--ctx: expected a count >= 2, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--queue", 1)) { if (df_parse_int(a.val, 0, 100000, &queue)) df_args_fail(&a, "--queue: expected 0..100000, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--max-request-bytes", 1)) {
            max_body = df_parse_size(a.val);
            if (max_body <= 0) df_args_fail(&a, "--max-request-bytes: expected a size like 16MiB, got '%s'", a.val);
        } else if (df_args_opt(&a, opt, "--body-min-rate", 1)) {
            min_rate = !strcmp(a.val, "0") ? 0 : df_parse_size(a.val);
            if (min_rate < 0) df_args_fail(&a, "--body-min-rate: expected a size per second like 32KiB (or 0: off), got '%s'", a.val);
        }
        else if (df_args_opt(&a, opt, "--max-connections", 1)) { if (df_parse_int(a.val, 1, 100000, &max_conns)) df_args_fail(&a, "--max-connections: expected 1..100000, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--max-connections-per-client", 1)) { if (df_parse_int(a.val, 0, 100000, &per_ip)) df_args_fail(&a, "--max-connections-per-client: expected 0..100000, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--header-timeout", 1)) { if (df_parse_float(a.val, &header_timeout) || !(header_timeout >= 0.1 && header_timeout <= 3600)) df_args_fail(&a, "--header-timeout: expected seconds in 0.1..3600, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--idle-timeout", 1)) { if (df_parse_float(a.val, &idle_timeout) || !(idle_timeout >= 0.1 && idle_timeout <= 86400)) df_args_fail(&a, "--idle-timeout: expected seconds in 0.1..86400, got '%s'", a.val); }
        else if (!a.bad) df_args_fail(&a, "unknown option '%s'", opt);
    }
    if (a.bad) return 2;
    if (df_spec_opts_check(&a, &spo)) return 2;
    if (!model) return df_args_fail(&a, "--model is required");
    if (api_key && !*api_key) api_key = NULL;

    /* SIGINT/SIGTERM go to sigwait below: block them before any thread (the
     * engine's pool, the engine thread, connection threads) starts. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[1024];
    if (o.trace_path && df_trace_probe(o.trace_path, err, sizeof err)) { fprintf(stderr, "deltafin serve: %s\n", err); return 1; }
    df_engine *e = df_engine_open(model, &o, err, sizeof err);
    if (!e) { fprintf(stderr, "deltafin serve: %s\n", err); return 2; }
    int dfail;
    df_engine *draft = df_spec_open_draft(&spo, e, &o, &dfail, err, sizeof err);
    if (dfail) { fprintf(stderr, "deltafin serve: %s\n", err); df_engine_close(e); return 2; }
    char *id = name ? df_xstrdup(name) : default_id(model);
    df_oai_options so = {.model_id = id, .max_tokens = max_tokens, .ctx = (int)ctx, .queue = (int)queue, .memo = memo,
                         .quiet = quiet, .spec = spo.mode, .spec_max = spo.k, .draft = draft, .cache_dir = cache_dir,
                         .cache_bytes = cache_size};
    df_oai_server *srv = df_oai_new(e, &so, err, sizeof err);
    if (!srv) { fprintf(stderr, "deltafin serve: %s\n", err); free(id); df_engine_close(e); df_engine_close(draft); return 1; }
    if (!df_has_tokenizer(e))
        fprintf(stderr, "deltafin serve: warning: %s has no tokenizer: only token-id prompts on /v1/completions will work\n", model);

    df_http_config hc = {.host = host, .port = (int)port, .max_body = (size_t)max_body, .header_bytes = 64 * 1024,
                         .api_key = api_key, .max_connections = (int)max_conns, .max_per_ip = (int)per_ip,
                         .header_timeout = header_timeout, .idle_timeout = idle_timeout, .body_min_rate = (double)min_rate,
                         .quiet = quiet,
                         .handler = df_oai_handle, .app = srv, .on_done = df_oai_request_done};
    df_http_server *http = df_http_start(&hc, err, sizeof err);
    if (!http) {
        fprintf(stderr, "deltafin serve: %s\n", err);
        df_oai_free(srv);
        free(id);
        df_engine_close(e);
        df_engine_close(draft);
        return 1;
    }
    if (!is_loopback(host) && !api_key)
        fprintf(stderr, "deltafin serve: warning: listening on %s without --api-key: anyone who can reach this port can use it\n", host);
    int v6 = strchr(host, ':') != NULL;
    fprintf(stderr, "deltafin serve: listening on http://%s%s%s:%d (model id '%s')\n", v6 ? "[" : "", host, v6 ? "]" : "",
            df_http_port(http), id);
    fflush(stderr);

    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "deltafin serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    df_oai_stop(srv);
    df_http_stop(http);
    df_oai_free(srv);
    free(id);
    df_engine_close(e);
    df_engine_close(draft);
    return 0;
}
