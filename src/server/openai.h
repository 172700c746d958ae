/* openai.h - the OpenAI-compatible routes: request validation (a pure
 * function, fuzzed on its own), generation with one shared session, SSE
 * streaming, the FIFO admission queue and the exact-response memo. One
 * file per job: request.c, queue.c, memo.c, gen.c, openai.c (oai_int.h).
 *
 * Invariants:
 *   - df_oai_parse touches no global state and no engine: JSON text in, a
 *     validated request or an OpenAI-shaped 4xx error out, for any bytes;
 *   - a validated request is one the engine can execute exactly; anything it
 *     cannot (n > 1, a forced tool call, logit_bias, penalties, non-text
 *     parts, ...) has been refused with the offending field in param (what
 *     depends on the chat template - tools, chat_template_kwargs,
 *     reasoning_effort - is checked against it before rendering, gen.c);
 *   - at most one generation touches the engine at a time; waiting requests
 *     are served in arrival order; at most `queue` wait, more get 429;
 *   - df_session_sync does the prefix reuse and says how many prompt tokens it
 *     kept (df_session_reused), reported as usage.prompt_tokens_details
 *     .cached_tokens.
 */
#ifndef DF_SERVER_OPENAI_H
#define DF_SERVER_OPENAI_H

#include "deltafin.h"
#include "server/http.h"

#include <stddef.h>
#include <stdint.h>

/* ---- validation (pure) -------------------------------------------------- */

typedef enum { DF_OAI_CHAT = 1, DF_OAI_COMPLETIONS = 2 } df_oai_kind;

typedef struct {
    const char *model_id; /* the served id: requests must name it */
    int vocab_size;       /* token-id prompts are checked against it */
    long max_tokens;      /* the server's cap on completion tokens (> 0) */
} df_oai_limits;

typedef struct {
    int status;        /* 400 or 404 */
    char type[32];     /* "invalid_request_error" */
    char param[128];   /* "" is sent as null */
    char code[48];     /* "" is sent as null */
    char message[512];
} df_oai_error;

/* Fills e as an invalid_request_error with status, param and code (NULL for
 * none) and a formatted message; returns -1. */
/* snprintf for parameter paths ("messages[3].content[0].type"); a path longer than the buffer is cut. */
void df_oai_pathf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int df_oai_fail(df_oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define DF_OAI_MAX_STOP 4
#define DF_OAI_MAX_TOP_LOGPROBS 20

typedef struct {
    df_oai_kind kind;
    char *messages_json;   /* chat: the messages as the template gets them (see SERVER.md) */
    char *prompt;          /* completions: a text prompt, or NULL */
    size_t prompt_len;
    int32_t *prompt_ids;   /* completions: a token-id prompt, or NULL */
    size_t n_prompt_ids;
    long max_tokens;       /* -1: not given (chat: up to the context) */
    int has_temperature;
    double temperature;    /* [0, 2] */
    double top_p;          /* [0, 1]; 1 when not given */
    int top_k;             /* 0: off (Anthropic's top_k; OpenAI has none) */
    int has_seed;
    int64_t seed;
    char *stop[DF_OAI_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    int logprobs;          /* 1: report the chosen tokens' log-probabilities */
    int top_logprobs;      /* alternatives per token, 0..20 (completions: 0..5) */
    /* chat: tool calling and reasoning (SERVER.md) */
    char *tools_json;      /* the tools array as the template gets it (OpenAI shape), or NULL: none */
    int tool_choice;       /* DF_OAI_TOOLS_AUTO (default), _NONE, _REQUIRED, _NAMED */
    char *tool_choice_name;/* _NAMED: the function */
    int parallel_tool_calls; /* 1 (default): several calls allowed; 0: generation ends after the first */
    char *template_kwargs_json; /* chat_template_kwargs (an object), or NULL */
    char *reasoning_effort;     /* or NULL */
    int thinking;          /* Anthropic's thinking: 0 not given, 1 enabled, 2 disabled */
    df_grammar *grammar;   /* chat response_format json_object / json_schema: the compiled constraint, or NULL */
} df_oai_request;

enum { DF_OAI_TOOLS_AUTO = 0, DF_OAI_TOOLS_NONE, DF_OAI_TOOLS_REQUIRED, DF_OAI_TOOLS_NAMED };

/* Validates body (len bytes, need not be NUL-terminated) as a request of the
 * given kind. Returns 0 and fills *out (free with df_oai_request_free), or
 * -1 and fills *err (out is then empty). */
int df_oai_parse(df_oai_kind kind, const df_oai_limits *lim, const char *body, size_t len, df_oai_request *out,
                 df_oai_error *err);
void df_oai_request_free(df_oai_request *r);
/* 1 if the request always produces the same output (greedy, or seeded). */
int df_oai_deterministic(const df_oai_request *r);

/* ---- the server --------------------------------------------------------- */

typedef struct {
    const char *model_id;  /* served id (default: the --model argument's last path component) */
    long max_tokens;       /* cap per request; 0: the context length */
    int ctx;               /* session context; 0: min(model, 8192) */
    int queue;             /* requests allowed to wait behind the running one */
    int memo;              /* 0: no exact-response memo */
    int memo_entries;      /* 0: 256 */
    size_t memo_bytes;     /* 0: 64 MiB */
    int quiet;             /* 1: no log lines on stderr */
    int spec, spec_max;    /* speculative decoding (df_gen_config): DF_SPEC_*, drafts per pass */
    df_engine *draft;      /* the draft model of DF_SPEC_DRAFT (owned by the caller) */
    const char *cache_dir; /* the prompt cache on disk (pcache.h), or NULL */
    int64_t cache_bytes;   /* its bound; 0: 4 GiB */
} df_oai_options;

typedef struct df_oai_server df_oai_server;

/* Takes the engine (not its ownership) and makes the one session; reads
 * every token's text once to know the longest (the byte bound on prompts). */
df_oai_server *df_oai_new(df_engine *e, const df_oai_options *o, char *err, size_t errlen);
/* The HTTP handler (app = the df_oai_server). */
void df_oai_handle(void *app, df_http_req *req);
/* The http layer's on_done (app = the df_oai_server): counts the request for GET /metrics. */
void df_oai_request_done(void *app, const char *path, int status, int complete);
/* Makes waiting requests and running generations stop soon (shutdown). */
void df_oai_stop(df_oai_server *s);
void df_oai_free(df_oai_server *s);

#endif
