/* oai_int.h - the OpenAI server's insides, shared by its files (not
 * public; the server's API is openai.h). One file per job:
 *
 *   queue.c   the turn at the engine: one holder, a bounded FIFO of waiters
 *   memo.c    exact answers to recent deterministic requests
 *   gen.c     one request's generation: prompt, session sync, the shared
 *             generation step (df_gen, src/core/generate.c), logprobs
 *   openai.c  routes, response bodies, SSE streaming, lifetime
 *   request.c validation (pure, fuzzed on its own)
 *   anthropic.c the Anthropic Messages API (/v1/messages): validation and
 *             its answers, over the same queue and generation as OpenAI chat
 *   responses.c the OpenAI Responses API (/v1/responses), likewise
 *   toolcall.c the model's output split into content, reasoning and tool
 *             calls (its own header, toolcall.h), shared by both protocols
 */
#ifndef DF_SERVER_OAI_INT_H
#define DF_SERVER_OAI_INT_H

#include "server/metrics.h"
#include "server/openai.h"
#include "server/toolcall.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- queue.c ---------------------------------------------------------------
 *
 * One generation at a time. A request that finds the engine busy waits in a
 * FIFO of at most qmax entries, polling its connection every 50 ms so that
 * a client who gives up leaves the queue. */

typedef struct df_waiter { struct df_waiter *next; } df_waiter;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, n_waiting, qmax;
    df_waiter *head, *tail;
    atomic_int stopping;
} df_turn;

enum { TURN_OK, TURN_FULL, TURN_GONE, TURN_STOP };

void df_turn_init(df_turn *t, int qmax);
void df_turn_destroy(df_turn *t);
/* Waits for the engine in arrival order. TURN_FULL: the queue is full;
 * TURN_GONE: the client (r, may be NULL) disconnected while waiting;
 * TURN_STOP: shutdown. */
int df_turn_acquire(df_turn *t, df_http_req *r);
void df_turn_release(df_turn *t);
/* Shutdown: waiters get TURN_STOP, df_turn_stopping says so. */
void df_turn_stop(df_turn *t);
int df_turn_stopping(df_turn *t);

/* ---- memo.c ----------------------------------------------------------------
 *
 * Maps the exact bytes of a deterministic request to its answer, least
 * recently used first out, bounded in entries and bytes. */

typedef struct df_memo df_memo;

typedef struct {
    char *text;
    size_t tlen;
    const char *finish; /* a string constant */
    long n_prompt, n_gen;
    int stop_hit;       /* the stop string that ended it, or -1 */
    char *logprobs;     /* {"lp": [...], "off": [...]} or NULL */
    int think_open;     /* the prompt opened a think block (the output starts as reasoning) */
} df_memo_answer;

df_memo *df_memo_new(int max_entries, size_t max_bytes);
void df_memo_free(df_memo *m);
/* 1 and a copy of the answer in *out (free with df_memo_answer_free) on a
 * hit; 0 on a miss (or when the copy could not be made). */
int df_memo_get(df_memo *m, const char *key, size_t klen, df_memo_answer *out);
/* Stores an answer, taking ownership of key, a->text and a->logprobs (freed
 * at once if the entry is not kept: too big, or already there). */
void df_memo_put(df_memo *m, char *key, size_t klen, df_memo_answer *a);
void df_memo_answer_free(df_memo_answer *a);

/* ---- the server ------------------------------------------------------------ */

struct df_oai_server {
    df_engine *e;
    df_model_info info;
    df_session *s;
    int ctx;
    long cap;
    char *model_id;
    int has_tok, quiet;
    int spec, spec_max;    /* df_oai_options */
    df_engine *draft;
    long long created;

    df_turn turn;
    pthread_mutex_t pmu; /* one big prompt rendered/tokenized at a time */
    int max_tok_bytes;   /* the longest token's text in bytes; 0: unknown */


    df_memo *memo;       /* NULL: --no-memo */
    struct df_pcache *pc; /* the prompt cache on disk (pcache.h); NULL: no --cache-dir */
    df_metrics *metrics;  /* GET /metrics (metrics.h) */

    /* the chat format (toolcall.h): decided once from the template */
    const char *tpl_src; /* the chat template's text (NULL: none, or K3) */
    const char *tpl_src_tools; /* the one for requests with tools ("tool_use", else tpl_src) */
    int is_k3;
    df_tc_family tc_fam;
    int has_think;       /* the template writes think blocks */

    atomic_uint_least64_t idctr;
    uint64_t salt;
};

/* Request bodies at least this large are prepared one at a time. */
#define DF_OAI_BIG_BODY ((size_t)1 << 20)

/* ---- gen.c -----------------------------------------------------------------
 *
 * A gen is one request's generation: its prompt tokens, the shared
 * generation step, the text so far (final: stop strings applied), the
 * log-probabilities as JSON, and (when streaming) the SSE bytes not yet
 * sent. */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

void sb_put(sbuf *b, const void *d, size_t n);
/* A JSON string from n bytes of possibly invalid UTF-8: invalid bytes
 * become U+FFFD. Never NULL unless out of memory. */
json_t *jstr(const char *p, size_t n);

typedef struct gen gen;

/* A protocol's answers (OpenAI's or Anthropic's): the error shape, the
 * "busy" answer, the whole non-streaming body, and the stream's events.
 * The request's way through the queue and the generation is shared
 * (df_oai_run). */
typedef struct {
    const char *id_prefix;
    void (*error)(df_http_req *r, const df_oai_error *e);
    void (*busy)(df_http_req *r, int qmax);   /* the queue is full */
    char *(*body)(const gen *g);              /* malloc'd JSON, NULL if out of memory */
    void (*sse_head)(gen *g);                 /* before the first token */
    void (*sse_more)(gen *g);                 /* text (etc.) not yet sent */
    void (*sse_tail)(gen *g);                 /* the end */
    void (*sse_error)(gen *g);                /* g->errmsg after the stream began */
} df_proto;

struct gen {
    df_oai_server *srv;
    df_http_req *req;
    const df_proto *proto;
    df_oai_request rq;
    char id[48];
    long long created;
    double t_arrive, t_tok; /* df_now() at the request's arrival, at the last token chosen (metrics) */
    int32_t *prompt;
    size_t n_prompt, cached;
    long max_new;
    df_gen *dg;         /* the generation step (with the turn) */
    int32_t last;       /* the token the last step chose (the next step pushes it) */
    sbuf text;          /* generated text, final: cut at a stop string */
    size_t sent;        /* text[0..sent) has gone out in chunks */
    long n_gen;
    const char *finish; /* "stop" | "length" once done */
    int failed;         /* engine error or shutdown: errstatus, errmsg */
    int errstatus;
    char errmsg[256];
    json_t *lp;         /* per generated token: {token, logprob, bytes, top_logprobs} */
    long *off;          /* text offset of each token (completions' text_offset) */
    size_t n_off, cap_off, lp_sent;
    int holds_turn;
    int memo_hit;
    char *memo_key;
    size_t memo_klen;
    double t0, t_fwd;   /* start of decoding; seconds in the engine (sampling, forward passes) */
    int logged;
    int phase;          /* streaming: 0 head, 1 tokens, 2 done */
    sbuf out;
    size_t out_pos;
    int want_stop_hit;  /* find which stop string ended it (Anthropic's stop_sequence) */
    int32_t *ids;       /* want_stop_hit: the generated ids */
    size_t n_ids, cap_ids;
    int stop_hit;       /* the index in rq.stop of the stop string that ended it, or -1 */
    int count_only;     /* tokenize only (count_tokens): no context checks */
    /* chat output split into content, reasoning and tool calls (toolcall.h) */
    df_tc *tc;
    size_t tc_fed;      /* text[0..tc_fed) has been fed to tc */
    int think_open;     /* the prompt opened a think block */
    size_t sent_r;      /* streaming: reasoning sent */
    size_t calls_sent;  /* streaming: tool calls sent */
    int ablk, aidx, aping; /* Anthropic streaming: the open block (0 none, 1 thinking, 2 text), its index, ping sent */
    int seq;            /* Responses API stream: the next event's sequence_number */
    int ropen, rnext;   /* Responses API stream: the open output item (0 none, 1 reasoning, 2 message), the next output_index */
    json_t *ext;        /* a protocol's own data (Responses: the request fields the answer repeats); freed with the gen */
    struct df_pcache_job *pc_job; /* what the prompt cache stores of this prompt, handed over with the turn */
};

/* Feeds the text generated so far to g's output parser (made on first use;
 * finished once g->finish is set) and returns it (NULL if out of memory). */
df_tc *gen_tc(gen *g);
/* An SSE event with a name ("event: TYPE\ndata: JSON\n\n", the Anthropic and
 * Responses streams) into g->out; consumes o; out of memory sets g->out.oom. */
void gen_sse_event(gen *g, const char *type, json_t *o);
/* The finish reason to report: "tool_calls" when the answer has calls. */
const char *gen_finish(gen *g);

/* Renders and tokenizes the prompt and checks it against the context (no
 * session needed: done before the turn). Returns 0, or fills e. */
int gen_tokenize(gen *g, df_oai_error *e);
/* Syncs the session with the prompt and sets up the generation step. Needs
 * the turn. Returns 0, or fills e. */
int gen_prepare(gen *g, df_oai_error *e);
/* One token. Sets g->finish or g->failed when generation is over. */
void gen_step(gen *g);
void gen_release(gen *g);
/* The client went away mid-generation: free the engine, say so. */
void gen_stopped(gen *g);
void gen_log(gen *g);
void gen_free(gen *g);
/* Fills a finished gen from the memo; returns 1 on a hit. */
int gen_memo_lookup(gen *g);
/* Stores a finished deterministic generation (complete, not failed). */
void gen_memo_store(gen *g);
/* The longest token's text in bytes (0 without a tokenizer). */
int gen_longest_token(df_oai_server *s);

/* ---- openai.c: shared by both protocols ------------------------------------ */

/* Runs a validated request (g->rq, g->proto, g->srv, g->req set; body and
 * len: the request's bytes, the memo key with tag in front): memo,
 * tokenizing, the queue, the generation, the answer. Consumes g. */
void df_oai_run(gen *g, const char *body, size_t len, char tag);
/* A fresh gen for a request on s (NULL if out of memory). */
gen *gen_new(df_oai_server *s, df_http_req *r, const df_proto *p);
void make_id(df_oai_server *s, const char *prefix, char *out, size_t n);
/* OpenAI-shaped answers shared by the OpenAI routes: an error, and the
 * queue-full 429. */
void df_oai_respond_error(df_http_req *r, const df_oai_error *e);
void df_oai_busy(df_http_req *r, int qmax);

/* ---- anthropic.c ------------------------------------------------------------ */

/* Validates an Anthropic Messages body (count: a count_tokens body) into a
 * chat request (messages rendered like OpenAI chat). Pure. Returns 0, or -1
 * with e filled (the message names the field). */
int df_anth_parse(int count, const df_oai_limits *lim, const char *body, size_t len, df_oai_request *out,
                  df_oai_error *e);
/* POST /v1/messages and /v1/messages/count_tokens. */
void df_anth_messages(df_oai_server *s, df_http_req *r);
void df_anth_count_tokens(df_oai_server *s, df_http_req *r);

/* ---- request.c: shared with the routes that build chat requests ----------- */

/* OpenAI's names of JSON types ("an object", "a decimal", ...), and its
 * invalid_type error ("Invalid type for 'param': expected W, but got T"). */
const char *df_oai_jtype(const json_t *v);
int df_oai_bad_type(df_oai_error *e, const char *param, const char *want, const json_t *v);

/* Checks a tools array in OpenAI chat shape ([{type: "function", function:
 * {name, description?, parameters?, strict?}}]) and keeps it in r->tools_json;
 * checks r->tool_choice against r->tools_json. 0, or -1 with e filled. */
int df_oai_parse_tools(const json_t *tools, df_oai_request *r, df_oai_error *e);
int df_oai_check_tool_choice(df_oai_request *r, df_oai_error *e);
/* The chat route's response_format (text, json_object, json_schema), compiled into r->grammar. */
int df_oai_parse_response_format(const json_t *v, df_oai_request *r, df_oai_error *e);
/* The parameters schema of tool i of a chat-shaped tools array, as JSON text
 * (malloc'd; {"type":"object"} when the tool has none), NULL if out of memory. */
char *df_oai_tool_schema(const char *tools_json, size_t i);

/* ---- responses.c ------------------------------------------------------------ */

/* Validates a Responses API body into a chat request (instructions and input
 * items rendered like OpenAI chat messages). echo (may be NULL) receives the
 * request fields the response object repeats (instructions, metadata,
 * temperature, ...), a new reference. Pure. Returns 0, or -1 with e filled. */
int df_resp_parse(const df_oai_limits *lim, const char *body, size_t len, df_oai_request *out, json_t **echo,
                  df_oai_error *e);
/* POST /v1/responses. */
void df_resp_create(df_oai_server *s, df_http_req *r);

#endif
