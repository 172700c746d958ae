/* openai.c - see openai.h. The routes, the response bodies (JSON and SSE)
 * and the server's lifetime. The other jobs have their own files (see
 * oai_int.h): the turn at the engine (queue.c), the memo (memo.c), one
 * request's generation (gen.c, around the shared step in
 * src/core/generate.c), validation (request.c).
 *
 * Invariants:
 *   - text given to a client never contains a stop string or anything after
 *     it (the generation step holds back what could start one);
 *   - every JSON string built here goes through jstr(), which replaces bytes
 *     that are not UTF-8 (jansson refuses them), so no response is ever lost
 *     to a malformed token;
 *   - nothing here exits or aborts; allocation failures become 5xx answers.
 */
#include "server/oai_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server/pcache.h"
#include "util/util.h"

/* =========================================================================
 * Response bodies
 * ========================================================================= */

static json_t *usage_json(const gen *g) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer((json_int_t)g->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(g->n_gen));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)g->n_prompt + g->n_gen));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer((json_int_t)g->cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

/* Log-probabilities of tokens [a, b) in the shape of the endpoint:
 * chat {content: [...], refusal: null}; completions {tokens,
 * token_logprobs, top_logprobs, text_offset}. NULL (json null) if not asked. */
static json_t *logprobs_json(const gen *g, size_t a, size_t b) {
    if (!g->rq.logprobs) return json_null();
    if (b > json_array_size(g->lp)) b = json_array_size(g->lp);
    if (g->rq.kind == DF_OAI_CHAT) {
        json_t *o = json_object(), *c = json_array();
        for (size_t i = a; i < b; i++) json_array_append(c, json_array_get(g->lp, i));
        json_object_set_new(o, "content", c);
        json_object_set_new(o, "refusal", json_null());
        return o;
    }
    json_t *o = json_object(), *tok = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
    for (size_t i = a; i < b; i++) {
        json_t *it = json_array_get(g->lp, i), *alts = json_object(), *alt;
        json_array_append(tok, json_object_get(it, "token"));
        json_array_append(tlp, json_object_get(it, "logprob"));
        size_t j;
        json_array_foreach(json_object_get(it, "top_logprobs"), j, alt)
            json_object_set(alts, json_string_value(json_object_get(alt, "token")), json_object_get(alt, "logprob"));
        json_array_append_new(top, alts);
        json_array_append_new(off, json_integer(i < g->n_off ? g->off[i] : 0));
    }
    json_object_set_new(o, "tokens", tok);
    json_object_set_new(o, "token_logprobs", tlp);
    json_object_set_new(o, "top_logprobs", top);
    json_object_set_new(o, "text_offset", off);
    return o;
}

static json_t *head_json(const gen *g, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(g->created));
    json_object_set_new(o, "model", json_string(g->srv->model_id));
    json_object_set_new(o, "system_fingerprint", json_string("deltafin-" DF_VERSION));
    return o;
}

/* A tool call in OpenAI's shape; with_head: id, type and name (the first
 * delta of a streamed call, or the whole call), args: the arguments. */
static json_t *call_json(const df_tc_call *c, size_t index, int stream, int with_head, const char *args) {
    json_t *o = json_object(), *f = json_object();
    if (stream) json_object_set_new(o, "index", json_integer((json_int_t)index));
    if (with_head) {
        json_object_set_new(o, "id", json_string(c->id));
        json_object_set_new(o, "type", json_string("function"));
        json_object_set_new(f, "name", jstr(c->name, strlen(c->name)));
    }
    json_object_set_new(f, "arguments", jstr(args, strlen(args)));
    json_object_set_new(o, "function", f);
    return o;
}

/* The whole non-streaming answer. */
static char *final_body(const gen *cg) {
    gen *g = (gen *)cg; /* the output parser is fed here */
    const int chat = g->rq.kind == DF_OAI_CHAT;
    json_t *o = head_json(g, chat ? "chat.completion" : "text_completion");
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    if (chat) {
        df_tc *tc = gen_tc(g);
        if (!tc) { json_decref(ch); json_decref(o); return NULL; }
        size_t cl, rl, nc = df_tc_n_calls(tc);
        const char *c = df_tc_content(tc, &cl), *r = df_tc_reasoning(tc, &rl);
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("assistant"));
        json_object_set_new(m, "content", !cl && nc ? json_null() : jstr(c, cl));
        if (rl) json_object_set_new(m, "reasoning_content", jstr(r, rl));
        if (nc) {
            json_t *calls = json_array();
            for (size_t i = 0; i < nc; i++) {
                const df_tc_call *k = df_tc_call_at(tc, i);
                json_array_append_new(calls, call_json(k, i, 0, 1, k->args));
            }
            json_object_set_new(m, "tool_calls", calls);
        }
        json_object_set_new(m, "refusal", json_null());
        json_object_set_new(m, "annotations", json_array());
        json_object_set_new(ch, "message", m);
    } else {
        json_object_set_new(ch, "text", jstr(g->text.p ? g->text.p : "", g->text.len));
    }
    json_object_set_new(ch, "logprobs", logprobs_json(g, 0, (size_t)-1));
    json_object_set_new(ch, "finish_reason", json_string(gen_finish(g)));
    json_t *chs = json_array();
    json_array_append_new(chs, ch);
    json_object_set_new(o, "choices", chs);
    json_object_set_new(o, "usage", usage_json(g));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Appends "data: <json>\n\n" and consumes o. */
static void sse(gen *g, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) { g->out.oom = 1; return; }
    sb_put(&g->out, "data: ", 6);
    sb_put(&g->out, s, strlen(s));
    sb_put(&g->out, "\n\n", 2);
    free(s);
}

/* One streaming chunk: text (may be NULL), logprobs [a, b), finish (NULL
 * while running), role on the first chat chunk. */
static void sse_chunk(gen *g, const char *text, size_t n, size_t a, size_t b, const char *finish, int role) {
    const int chat = g->rq.kind == DF_OAI_CHAT;
    json_t *o = head_json(g, chat ? "chat.completion.chunk" : "text_completion");
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    if (chat) {
        json_t *d = json_object();
        if (role) {
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            json_object_set_new(d, "refusal", json_null());
        } else if (text) {
            json_object_set_new(d, "content", jstr(text, n));
        }
        json_object_set_new(ch, "delta", d);
    } else {
        json_object_set_new(ch, "text", text ? jstr(text, n) : json_string(""));
    }
    json_object_set_new(ch, "logprobs", a < b ? logprobs_json(g, a, b) : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *chs = json_array();
    json_array_append_new(chs, ch);
    json_object_set_new(o, "choices", chs);
    if (g->rq.include_usage) json_object_set_new(o, "usage", json_null());
    sse(g, o);
}

/* A chat chunk with one delta (consumed). */
static void sse_delta(gen *g, json_t *d, size_t a, size_t b) {
    json_t *o = head_json(g, "chat.completion.chunk");
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    json_object_set_new(ch, "delta", d);
    json_object_set_new(ch, "logprobs", a < b ? logprobs_json(g, a, b) : json_null());
    json_object_set_new(ch, "finish_reason", json_null());
    json_t *chs = json_array();
    json_array_append_new(chs, ch);
    json_object_set_new(o, "choices", chs);
    if (g->rq.include_usage) json_object_set_new(o, "usage", json_null());
    sse(g, o);
}

/* Chat: what the output parser has decided since the last chunk - new
 * reasoning (delta.reasoning_content), new content (delta.content, with the
 * pending log-probabilities), new tool calls (delta.tool_calls: index, id
 * and name, then the arguments). */
static void sse_pending_chat(gen *g) {
    df_tc *tc = gen_tc(g);
    if (!tc) { g->out.oom = 1; return; }
    size_t cl, rl, nlp = g->lp ? json_array_size(g->lp) : 0;
    const char *c = df_tc_content(tc, &cl), *r = df_tc_reasoning(tc, &rl);
    if (rl > g->sent_r) {
        json_t *d = json_object();
        json_object_set_new(d, "reasoning_content", jstr(r + g->sent_r, rl - g->sent_r));
        sse_delta(g, d, 0, 0);
        g->sent_r = rl;
    }
    if (cl > g->sent || (g->rq.logprobs && nlp > g->lp_sent)) {
        json_t *d = json_object();
        json_object_set_new(d, "content", jstr(c + g->sent, cl - g->sent));
        sse_delta(g, d, g->lp_sent, nlp);
        g->sent = cl;
        g->lp_sent = nlp;
    }
    for (; g->calls_sent < df_tc_n_calls(tc); g->calls_sent++) {
        const df_tc_call *k = df_tc_call_at(tc, g->calls_sent);
        for (int part = 0; part < 2; part++) {
            json_t *d = json_object(), *calls = json_array();
            json_array_append_new(calls, call_json(k, g->calls_sent, 1, part == 0, part ? k->args : ""));
            json_object_set_new(d, "tool_calls", calls);
            sse_delta(g, d, 0, 0);
        }
    }
}

/* Pending text and log-probabilities as one chunk, if there are any. */
static void sse_pending(gen *g) {
    if (g->rq.kind == DF_OAI_CHAT) { sse_pending_chat(g); return; }
    size_t nlp = g->lp ? json_array_size(g->lp) : 0;
    if (g->text.len > g->sent || (g->rq.logprobs && nlp > g->lp_sent)) {
        sse_chunk(g, g->text.p + g->sent, g->text.len - g->sent, g->lp_sent, nlp, NULL, 0);
        g->sent = g->text.len;
        g->lp_sent = nlp;
    }
}

/* The end of a stream: finish chunk, usage chunk, [DONE]. */
static void sse_tail(gen *g) {
    sse_pending(g);
    sse_chunk(g, NULL, 0, 0, 0, gen_finish(g), 0);
    if (g->rq.include_usage) {
        json_t *o = head_json(g, g->rq.kind == DF_OAI_CHAT ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", usage_json(g));
        sse(g, o);
    }
    sb_put(&g->out, "data: [DONE]\n\n", 14);
}

static void sse_head(gen *g) {
    if (g->rq.kind == DF_OAI_CHAT) sse_chunk(g, NULL, 0, 0, 0, NULL, 1);
}

/* An error after the stream began: data: {"error": {...}}, then [DONE]. */
static void sse_error(gen *g) {
    char *b = df_http_error_body("server_error", NULL, NULL, g->errmsg);
    if (b) {
        sb_put(&g->out, "data: ", 6);
        sb_put(&g->out, b, strlen(b));
        sb_put(&g->out, "\n\n", 2);
        free(b);
    }
    sb_put(&g->out, "data: [DONE]\n\n", 14);
}

/* The http stream callback: hands out pending bytes, making more one token
 * at a time through the protocol's events; checks the client before each
 * token. */
static ssize_t stream_fn(void *ctx, char *buf, size_t max) {
    gen *g = ctx;
    for (;;) {
        if (g->out.oom) return -1;
        if (g->out_pos < g->out.len) {
            size_t n = g->out.len - g->out_pos < max ? g->out.len - g->out_pos : max;
            memcpy(buf, g->out.p + g->out_pos, n);
            g->out_pos += n;
            return (ssize_t)n;
        }
        g->out.len = g->out_pos = 0;
        if (g->phase == 2) return 0;
        if (g->phase == 0) {
            g->proto->sse_head(g);
            g->phase = 1;
            continue;
        }
        if (g->failed) { gen_release(g); g->proto->sse_error(g); g->phase = 2; continue; }
        if (g->finish) { gen_release(g); g->proto->sse_tail(g); g->phase = 2; continue; }
        if (df_http_peer_closed(g->req)) { gen_stopped(g); return -1; }
        gen_step(g);
        if (!g->failed && !g->finish) g->proto->sse_more(g);
    }
}

static void stream_done(void *ctx, int complete) {
    gen *g = ctx;
    gen_release(g);
    if (complete) gen_log(g);
    if (complete && df_oai_deterministic(&g->rq)) gen_memo_store(g);
    gen_free(g);
}

/* =========================================================================
 * Routes
 * ========================================================================= */

static void respond_json(df_http_req *r, int status, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) { df_http_respond_error(r, 503, "server_error", NULL, NULL, "Out of memory."); return; }
    df_http_respond(r, status, "application/json", s, strlen(s), NULL, NULL);
    free(s);
}

void df_oai_respond_error(df_http_req *r, const df_oai_error *e) {
    df_http_respond_error(r, e->status, e->status >= 500 ? "server_error" : e->type[0] ? e->type : "invalid_request_error",
                          e->param[0] ? e->param : NULL, e->code[0] ? e->code : NULL, e->message);
}

static json_t *model_json(const df_oai_server *s) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_id));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->created));
    json_object_set_new(m, "owned_by", json_string("deltafin"));
    json_object_set_new(m, "max_model_len", json_integer(s->ctx));
    return m;
}

void make_id(df_oai_server *s, const char *prefix, char *out, size_t n) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t x = (atomic_fetch_add(&s->idctr, 1) + 1) * 0x9e3779b97f4a7c15ull ^ s->salt;
    char tail[25];
    for (int i = 0; i < 24; i++) {
        x ^= x >> 31; x *= 0xbf58476d1ce4e5b9ull; x ^= x >> 29;
        tail[i] = al[x % 62];
    }
    tail[24] = 0;
    snprintf(out, n, "%s%s", prefix, tail);
}

void df_oai_busy(df_http_req *r, int qmax) {
    char msg[200];
    snprintf(msg, sizeof msg, "The server is busy: one generation is running and %d are waiting (--queue %d). Retry later.", qmax, qmax);
    char *b = df_http_error_body("requests", NULL, "rate_limit_exceeded", msg);
    if (b) df_http_respond(r, 429, "application/json", b, strlen(b), "Retry-After", "1");
    else df_http_drop(r);
    free(b);
}

static const df_proto oai_chat = {"chatcmpl-", df_oai_respond_error, df_oai_busy, final_body, sse_head, sse_pending, sse_tail, sse_error};
static const df_proto oai_cmpl = {"cmpl-", df_oai_respond_error, df_oai_busy, final_body, sse_head, sse_pending, sse_tail, sse_error};

gen *gen_new(df_oai_server *s, df_http_req *r, const df_proto *p) {
    gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->srv = s;
    g->req = r;
    g->proto = p;
    g->stop_hit = -1;
    g->lp = json_array();
    if (!g->lp) { free(g); return NULL; }
    g->created = (long long)time(NULL);
    g->t_arrive = df_now();
    make_id(s, p->id_prefix, g->id, sizeof g->id);
    return g;
}

static void answer_error(gen *g, int status, const char *msg) {
    df_oai_error e = {.status = status};
    snprintf(e.type, sizeof e.type, "server_error");
    snprintf(e.message, sizeof e.message, "%s", msg);
    g->proto->error(g->req, &e);
}

void df_oai_run(gen *g, const char *body, size_t len, char tag) {
    df_oai_server *s = g->srv;
    df_http_req *r = g->req;
    df_oai_error e;
    memset(&e, 0, sizeof e);
    if (s->memo && df_oai_deterministic(&g->rq) && len <= (1u << 20)) {
        g->memo_key = malloc(len + 1);
        if (g->memo_key) {
            g->memo_key[0] = tag;
            memcpy(g->memo_key + 1, body, len);
            g->memo_klen = len + 1;
        }
    }
    if (!gen_memo_lookup(g)) {
        int big = len >= DF_OAI_BIG_BODY; /* big prompts are prepared one at a time, small ones at once */
        if (big) pthread_mutex_lock(&s->pmu);
        int gone = df_http_peer_closed(r), rc = gone ? 0 : gen_tokenize(g, &e);
        if (big) pthread_mutex_unlock(&s->pmu);
        if (gone) { df_http_drop(r); gen_free(g); return; } /* the client left while waiting */
        if (rc) { g->proto->error(r, &e); gen_free(g); return; }
        switch (df_turn_acquire(&s->turn, r)) {
        case TURN_FULL: g->proto->busy(r, s->turn.qmax); gen_free(g); return;
        case TURN_GONE: df_http_drop(r); gen_free(g); return;
        case TURN_STOP: answer_error(g, 503, "The server is shutting down."); gen_free(g); return;
        default: break;
        }
        g->holds_turn = 1;
        if (gen_prepare(g, &e)) { gen_release(g); g->proto->error(r, &e); gen_free(g); return; }
    }
    if (g->rq.stream) {
        df_http_respond_stream(r, 200, "text/event-stream", stream_fn, stream_done, g);
        return;
    }
    while (!g->finish && !g->failed) {
        if (df_http_peer_closed(r)) { gen_stopped(g); df_http_drop(r); gen_free(g); return; }
        gen_step(g);
    }
    gen_release(g);
    char *out = g->failed ? NULL : g->proto->body(g);
    gen_log(g);
    if (g->failed) {
        answer_error(g, g->errstatus, g->errmsg);
        gen_free(g);
        return;
    }
    if (out) df_http_respond(r, 200, "application/json", out, strlen(out), NULL, NULL);
    else answer_error(g, 503, "Out of memory.");
    free(out);
    if (df_oai_deterministic(&g->rq)) gen_memo_store(g);
    gen_free(g);
}

static void complete(df_oai_server *s, df_http_req *r, df_oai_kind kind) {
    size_t len;
    const char *body = df_http_body(r, &len);
    df_oai_limits lim = {s->model_id, s->info.vocab_size, s->cap};
    df_oai_error e;
    gen *g = gen_new(s, r, kind == DF_OAI_CHAT ? &oai_chat : &oai_cmpl);
    if (!g) { df_http_respond_error(r, 503, "server_error", NULL, NULL, "Out of memory."); return; }
    if (df_oai_parse(kind, &lim, body, len, &g->rq, &e)) { df_oai_respond_error(r, &e); gen_free(g); return; }
    df_oai_run(g, body, len, (char)kind);
}

void df_oai_handle(void *app, df_http_req *r) {
    df_oai_server *s = app;
    const char *m = df_http_method(r), *p = df_http_path(r);
    int get = !strcmp(m, "GET"), post = !strcmp(m, "POST");
    if (!strcmp(p, "/health")) {
        if (!get) goto method;
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        respond_json(r, 200, o);
    } else if (!strcmp(p, "/v1/models")) {
        if (!get) goto method;
        json_t *o = json_object(), *d = json_array();
        json_array_append_new(d, model_json(s));
        json_object_set_new(o, "object", json_string("list"));
        json_object_set_new(o, "data", d);
        respond_json(r, 200, o);
    } else if (!strncmp(p, "/v1/models/", 11)) {
        if (!get) goto method;
        if (strcmp(p + 11, s->model_id)) {
            char msg[300];
            snprintf(msg, sizeof msg, "The model `%.200s` does not exist or you do not have access to it.", p + 11);
            df_http_respond_error(r, 404, "invalid_request_error", "model", "model_not_found", msg);
        } else {
            respond_json(r, 200, model_json(s));
        }
    } else if (!strcmp(p, "/metrics")) {
        if (!get) goto method;
        pthread_mutex_lock(&s->turn.mu);
        int waiting = s->turn.n_waiting, running = s->turn.running;
        pthread_mutex_unlock(&s->turn.mu);
        size_t n;
        char *t = df_metrics_render(s->metrics, waiting, running, &n);
        if (t) df_http_respond(r, 200, DF_METRICS_CONTENT_TYPE, t, n, NULL, NULL);
        else df_http_respond_error(r, 503, "server_error", NULL, NULL, "Out of memory.");
        free(t);
    } else if (!strcmp(p, "/v1/chat/completions")) {
        if (!post) goto method;
        complete(s, r, DF_OAI_CHAT);
    } else if (!strcmp(p, "/v1/completions")) {
        if (!post) goto method;
        complete(s, r, DF_OAI_COMPLETIONS);
    } else if (!strcmp(p, "/v1/messages")) {
        if (!post) goto method;
        df_anth_messages(s, r);
    } else if (!strcmp(p, "/v1/messages/count_tokens")) {
        if (!post) goto method;
        df_anth_count_tokens(s, r);
    } else if (!strcmp(p, "/v1/responses")) {
        if (!post) goto method;
        df_resp_create(s, r);
    } else {
        char msg[300];
        snprintf(msg, sizeof msg, "Unknown request URL: %s %.200s. Please check the URL for typos.", m, p);
        df_http_respond_error(r, 404, "invalid_request_error", NULL, "unknown_url", msg);
    }
    return;
method: {
        char msg[300];
        snprintf(msg, sizeof msg, "Method %s is not allowed on %.200s.", m, p);
        df_http_respond_error(r, 405, "invalid_request_error", NULL, "method_not_allowed", msg);
    }
}


df_oai_server *df_oai_new(df_engine *e, const df_oai_options *o, char *err, size_t errlen) {
    df_oai_server *s = calloc(1, sizeof *s);
    if (!s) { df_err(err, errlen, DF_ENOMEM, "out of memory"); return NULL; }
    s->e = e;
    df_engine_info(e, &s->info);
    s->ctx = o->ctx > 0 ? o->ctx : (s->info.max_context < 8192 ? s->info.max_context : 8192);
    if (s->ctx <= 1) { free(s); df_err(err, errlen, DF_EINPUT, "the context length must be at least 2 tokens"); return NULL; }
    s->cap = o->max_tokens > 0 ? o->max_tokens : s->ctx;
    s->model_id = strdup(o->model_id ? o->model_id : "model");
    s->has_tok = df_has_tokenizer(e);
    s->quiet = o->quiet;
    s->spec = o->spec, s->spec_max = o->spec_max, s->draft = o->draft;
    s->created = (long long)time(NULL);
    s->metrics = df_metrics_new(s->model_id);
    if (o->memo)
        s->memo = df_memo_new(o->memo_entries > 0 ? o->memo_entries : 256, o->memo_bytes > 0 ? o->memo_bytes : (size_t)64 << 20);
    s->s = df_session_new(e, s->ctx);
    if (!s->s || !s->model_id || !s->metrics || (o->memo && !s->memo)) {
        df_err(err, errlen, DF_ENOMEM, "cannot create a session of %d tokens: %s", s->ctx, df_engine_error(e));
        df_metrics_free(s->metrics);
        df_session_free(s->s);
        df_memo_free(s->memo);
        free(s->model_id);
        free(s);
        return NULL;
    }
    if (getrandom(&s->salt, sizeof s->salt, 0) != (ssize_t)sizeof s->salt) s->salt = (uint64_t)time(NULL);
    df_turn_init(&s->turn, o->queue);
    if (o->cache_dir && !(s->pc = df_pcache_open(o->cache_dir, o->cache_bytes > 0 ? o->cache_bytes : (int64_t)4 << 30, e, s->s, &s->turn, o->quiet, err, errlen))) {
        df_turn_destroy(&s->turn);
        df_session_free(s->s);
        df_memo_free(s->memo);
        df_metrics_free(s->metrics);
        free(s->model_id);
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->pmu, NULL);
    df_stats st;
    df_stats_get(e, &st);
    df_metrics_engine(s->metrics, &st);
    s->max_tok_bytes = gen_longest_token(s);
    s->tpl_src = df_chat_template_source(e, 0);
    s->tpl_src_tools = df_chat_template_source(e, 1);
    s->is_k3 = df_chat_is_k3(e);
    s->tc_fam = df_tc_detect(s->tpl_src_tools, s->is_k3); /* calls come from the template that declares tools */
    s->has_think = df_tc_has_think(s->tpl_src, s->is_k3) || df_tc_has_think(s->tpl_src_tools, 0);
    return s;
}

void df_oai_stop(df_oai_server *s) { df_turn_stop(&s->turn); }

void df_oai_request_done(void *app, const char *path, int status, int complete) {
    df_oai_server *s = app;
    df_metrics_request(s->metrics, path, status, complete);
}

void df_oai_free(df_oai_server *s) {
    if (!s) return;
    df_pcache_close(s->pc); /* before the session: its writer uses it */
    df_memo_free(s->memo);
    df_session_free(s->s);
    df_metrics_free(s->metrics);
    free(s->model_id);
    df_turn_destroy(&s->turn);
    pthread_mutex_destroy(&s->pmu);
    free(s);
}
