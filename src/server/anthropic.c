/* anthropic.c - the Anthropic Messages API (see oai_int.h and
 * docs/SERVER.md): POST /v1/messages and POST /v1/messages/count_tokens.
 *
 * A Messages body is validated (df_anth_parse, pure) into the same chat
 * request an OpenAI client would send with the same conversation: the
 * system prompt first, then the turns, rendered by the model's own chat
 * template. It then takes the same way through the memo, the queue and the
 * generation (df_oai_run); only the answers differ (the df_proto below).
 *
 * Invariants:
 *   - what the engine cannot honour (tools, non-text blocks, thinking, an
 *     assistant prefill, unknown fields) is refused with a 400 whose message
 *     starts with the offending field, never ignored;
 *   - every error has Anthropic's shape {"type": "error", "error": {"type",
 *     "message"}}, the type from the HTTP status (df_http_anth_type);
 *   - stop_sequence is the stop string that ended the text (gen.c finds it),
 *     so stop_reason is "stop_sequence" only when one did.
 */
#include "server/oai_int.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* =========================================================================
 * Validation (pure: no engine, no globals)
 * ========================================================================= */

/* Fills e (type invalid_request_error, param field) with "field: message";
 * returns -1. */
static int afail(df_oai_error *e, int status, const char *field, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int afail(df_oai_error *e, int status, const char *field, const char *fmt, ...) {
    char msg[sizeof e->message - 140];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e->status = status;
    snprintf(e->type, sizeof e->type, "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", field ? field : "");
    e->code[0] = 0;
    if (field) snprintf(e->message, sizeof e->message, "%.128s: %s", field, msg);
    else snprintf(e->message, sizeof e->message, "%s", msg);
    return -1;
}

static const char *jtype(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int bad_type(df_oai_error *e, const char *field, const char *want, const json_t *v) {
    return afail(e, 400, field, "expected %s, got %s", want, jtype(v));
}

static int refuse(df_oai_error *e, const char *field, const char *what) {
    return afail(e, 400, field, "not supported by this server yet: %s (Deltafin refuses what it cannot honour "
                 "instead of ignoring it)", what);
}

static int unknown(df_oai_error *e, const char *field) {
    return afail(e, 400, field, "Extra inputs are not permitted");
}


/* Block types of Anthropic's API that the server knows but cannot honour. */
static const char *const refused_blocks[] = {
    "tool_use", "tool_result", "image", "document", "thinking", "redacted_thinking", "server_tool_use",
    "web_search_tool_result", "search_result", "container_upload", "mcp_tool_use", "mcp_tool_result",
};

/* Content: a string, or an array of text blocks ({type: "text", text,
 * cache_control?, citations: null?}) joined with "\n" (as the OpenAI chat
 * route joins text parts). Appends the text to *b. */
static int parse_content(const json_t *c, const char *where, sbuf *b, df_oai_error *e) {
    if (json_is_string(c)) { sb_put(b, json_string_value(c), json_string_length(c)); return 0; }
    if (!json_is_array(c)) return bad_type(e, where, "a string or an array of content blocks", c);
    if (!json_array_size(c)) return afail(e, 400, where, "expected at least one content block");
    size_t i;
    json_t *blk;
    json_array_foreach(c, i, blk) {
        char p[96], q[160];
        df_oai_pathf(p, sizeof p, "%s.%zu", where, i);
        if (!json_is_object(blk)) return bad_type(e, p, "an object", blk);
        json_t *type = json_object_get(blk, "type");
        df_oai_pathf(q, sizeof q, "%s.type", p);
        if (!type) return afail(e, 400, q, "Field required");
        if (!json_is_string(type)) return bad_type(e, q, "a string", type);
        const char *t = json_string_value(type);
        if (strcmp(t, "text")) {
            for (size_t k = 0; k < sizeof refused_blocks / sizeof *refused_blocks; k++)
                if (!strcmp(t, refused_blocks[k])) {
                    char what[80];
                    df_oai_pathf(what, sizeof what, "'%s' content blocks", t);
                    return refuse(e, q, what);
                }
            return afail(e, 400, q, "'%.40s' is not a content block type", t);
        }
        const char *k;
        json_t *v;
        json_object_foreach(blk, k, v) {
            df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
            if (!strcmp(k, "type")) continue;
            if (!strcmp(k, "text")) { if (!json_is_string(v)) return bad_type(e, q, "a string", v); continue; }
            if (!strcmp(k, "cache_control")) { if (!json_is_null(v) && !json_is_object(v)) return bad_type(e, q, "an object", v); continue; }
            if (!strcmp(k, "citations")) {
                if (json_is_null(v) || (json_is_array(v) && !json_array_size(v))) continue;
                return refuse(e, q, "citations");
            }
            return unknown(e, q);
        }
        json_t *text = json_object_get(blk, "text");
        df_oai_pathf(q, sizeof q, "%s.text", p);
        if (!text) return afail(e, 400, q, "Field required");
        if (i) sb_put(b, "\n", 1);
        sb_put(b, json_string_value(text), json_string_length(text));
    }
    return 0;
}

/* Appends {role, content} to norm, or the content to the last message when
 * it has the same role (consecutive same-role turns make one turn, joined
 * with "\n"). Consumes text. Returns 0 or -1 (out of memory / not UTF-8). */
static int add_turn(json_t *norm, const char *role, sbuf *text, const char *where, df_oai_error *e) {
    if (text->oom) { free(text->p); return afail(e, 503, NULL, "Out of memory."); }
    json_t *last = json_array_get(norm, json_array_size(norm) - 1);
    json_t *c;
    if (last && !strcmp(json_string_value(json_object_get(last, "role")), role)) {
        const json_t *old = json_object_get(last, "content");
        sbuf m = {0};
        sb_put(&m, json_string_value(old), json_string_length(old));
        sb_put(&m, "\n", 1);
        sb_put(&m, text->p ? text->p : "", text->len);
        free(text->p);
        if (m.oom) { free(m.p); return afail(e, 503, NULL, "Out of memory."); }
        c = json_stringn(m.p ? m.p : "", m.len);
        free(m.p);
        if (!c) return afail(e, 400, where, "not valid UTF-8");
        json_object_set_new(last, "content", c);
        return 0;
    }
    c = json_stringn(text->p ? text->p : "", text->len);
    free(text->p);
    if (!c) return afail(e, 400, where, "not valid UTF-8");
    json_t *o = json_object();
    json_object_set_new(o, "role", json_string(role));
    json_object_set_new(o, "content", c);
    json_array_append_new(norm, o);
    return 0;
}

/* messages: [{role: "user" | "assistant", content}], non-empty, not ending
 * with an assistant turn (a prefill). Appends to norm. */
static int parse_messages(const json_t *msgs, json_t *norm, df_oai_error *e) {
    if (!json_is_array(msgs)) return bad_type(e, "messages", "an array", msgs);
    if (!json_array_size(msgs)) return afail(e, 400, "messages", "at least one message is required");
    size_t i;
    json_t *m;
    const char *last = NULL;
    json_array_foreach(msgs, i, m) {
        char p[48], q[96];
        df_oai_pathf(p, sizeof p, "messages.%zu", i);
        if (!json_is_object(m)) return bad_type(e, p, "an object", m);
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) {
            df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
            if (strcmp(k, "role") && strcmp(k, "content")) return unknown(e, q);
        }
        df_oai_pathf(q, sizeof q, "%s.role", p);
        if (!role) return afail(e, 400, q, "Field required");
        if (!json_is_string(role)) return bad_type(e, q, "a string", role);
        const char *r = json_string_value(role);
        if (strcmp(r, "user") && strcmp(r, "assistant"))
            return afail(e, 400, q, "Input should be 'user' or 'assistant', got '%.40s'", r);
        df_oai_pathf(q, sizeof q, "%s.content", p);
        if (!content) return afail(e, 400, q, "Field required");
        sbuf text = {0};
        if (parse_content(content, q, &text, e)) { free(text.p); return -1; }
        if (add_turn(norm, r, &text, q, e)) return -1;
        last = r;
    }
    if (last && !strcmp(last, "assistant"))
        return refuse(e, "messages", "a last turn from the assistant (prefill: continuing the assistant's text)");
    return 0;
}

static int parse_stop(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (!json_is_array(v)) return bad_type(e, "stop_sequences", "an array of strings", v);
    if (json_array_size(v) > DF_OAI_MAX_STOP)
        return afail(e, 400, "stop_sequences", "at most %d stop sequences are supported, got %zu", DF_OAI_MAX_STOP,
                     json_array_size(v));
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        char p[40];
        df_oai_pathf(p, sizeof p, "stop_sequences.%zu", i);
        if (!json_is_string(s)) return bad_type(e, p, "a string", s);
        if (!json_string_length(s)) return afail(e, 400, p, "an empty stop sequence");
        if (!(r->stop[r->n_stop] = strndup(json_string_value(s), json_string_length(s)))) return afail(e, 503, NULL, "Out of memory.");
        r->n_stop++;
    }
    return 0;
}

static int get_number(const json_t *v, const char *name, double lo, double hi, double *out, df_oai_error *e) {
    if (!json_is_number(v)) return bad_type(e, name, "a number", v);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return afail(e, 400, name, "expected a number from %g to %g, got %g", lo, hi, x);
    *out = x;
    return 0;
}

/* One top-level field (count: the count_tokens body, which has no sampling
 * fields). */
static int parse_field(int count, const df_oai_limits *lim, const char *k, const json_t *v, df_oai_request *r,
                       json_t *sys, json_t *turns, df_oai_error *e) {
    if (json_is_null(v)) return 0; /* not given; required ones are checked after */
    if (!strcmp(k, "model")) {
        if (!json_is_string(v)) return bad_type(e, k, "a string", v);
        if (strcmp(json_string_value(v), lim->model_id))
            return afail(e, 404, k, "model '%.200s' not found; this server serves '%.200s'", json_string_value(v), lim->model_id);
        return 0;
    }
    if (!strcmp(k, "messages")) return parse_messages(v, turns, e);
    if (!strcmp(k, "system")) {
        sbuf text = {0};
        if (parse_content(v, "system", &text, e)) { free(text.p); return -1; }
        if (!text.len && !text.oom) { free(text.p); return 0; } /* an empty system prompt is none */
        return add_turn(sys, "system", &text, "system", e);
    }
    if (!strcmp(k, "tools")) {
        if (!json_is_array(v)) return bad_type(e, k, "an array", v);
        return json_array_size(v) ? refuse(e, k, "tool use") : 0;
    }
    if (!strcmp(k, "tool_choice")) return refuse(e, k, "tool_choice (tool use)");
    if (!strcmp(k, "thinking")) {
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        json_t *t = json_object_get(v, "type");
        if (json_is_string(t) && !strcmp(json_string_value(t), "disabled") && json_object_size(v) == 1) return 0;
        return refuse(e, k, "extended thinking");
    }
    if (count) return unknown(e, k);
    if (!strcmp(k, "max_tokens")) {
        if (!json_is_integer(v)) return bad_type(e, k, "an integer", v);
        json_int_t x = json_integer_value(v);
        if (x < 1) return afail(e, 400, k, "expected an integer of at least 1, got %lld", (long long)x);
        if (x > lim->max_tokens)
            return afail(e, 400, k, "%lld is too large; this server allows at most %ld output tokens per request (--max-tokens)",
                         (long long)x, lim->max_tokens);
        r->max_tokens = (long)x;
        return 0;
    }
    if (!strcmp(k, "stop_sequences")) return parse_stop(v, r, e);
    if (!strcmp(k, "temperature")) {
        if (get_number(v, k, 0, 1, &r->temperature, e)) return -1;
        r->has_temperature = 1;
        return 0;
    }
    if (!strcmp(k, "top_p")) return get_number(v, k, 0, 1, &r->top_p, e);
    if (!strcmp(k, "top_k")) {
        if (!json_is_integer(v)) return bad_type(e, k, "an integer", v);
        json_int_t x = json_integer_value(v);
        if (x < 0 || x > INT32_MAX) return afail(e, 400, k, "expected an integer from 0 to %d, got %lld", INT32_MAX, (long long)x);
        r->top_k = (int)x;
        return 0;
    }
    if (!strcmp(k, "stream")) {
        if (!json_is_boolean(v)) return bad_type(e, k, "a boolean", v);
        r->stream = json_is_true(v);
        return 0;
    }
    if (!strcmp(k, "cache_control")) { /* a caching hint: prefix reuse is automatic here */
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        return 0;
    }
    if (!strcmp(k, "metadata")) { /* accepted and ignored: it cannot change the output */
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        const char *k2;
        json_t *v2;
        json_object_foreach((json_t *)v, k2, v2) {
            char p[64];
            df_oai_pathf(p, sizeof p, "metadata.%.40s", k2);
            if (strcmp(k2, "user_id")) return unknown(e, p);
            if (!json_is_null(v2) && !json_is_string(v2)) return bad_type(e, p, "a string", v2);
        }
        return 0;
    }
    return unknown(e, k);
}

int df_anth_parse(int count, const df_oai_limits *lim, const char *body, size_t len, df_oai_request *out,
                  df_oai_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    out->kind = DF_OAI_CHAT;
    out->max_tokens = -1;
    out->top_p = 1;
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root)
        return afail(e, 400, NULL, "The request body is not valid JSON: %s (line %d, column %d).", je.text, je.line, je.column);
    json_t *sys = json_array(), *turns = json_array();
    int rc = 0;
    if (!json_is_object(root)) rc = afail(e, 400, NULL, "The request body must be a JSON object, not %s.", jtype(root));
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach(root, k, v) {
        if ((rc = parse_field(count, lim, k, v, out, sys, turns, e))) break;
    }
    if (!rc) {
        if (!json_is_string(json_object_get(root, "model"))) rc = afail(e, 400, "model", "Field required");
        else if (!json_array_size(turns)) rc = afail(e, 400, "messages", "Field required");
        else if (!count && out->max_tokens < 0) rc = afail(e, 400, "max_tokens", "Field required");
    }
    if (!rc) {
        json_array_extend(sys, turns);
        if (!(out->messages_json = json_dumps(sys, JSON_COMPACT))) rc = afail(e, 503, NULL, "Out of memory.");
    }
    json_decref(sys);
    json_decref(turns);
    json_decref(root);
    if (rc) df_oai_request_free(out);
    return rc;
}

/* =========================================================================
 * Answers
 * ========================================================================= */

/* The error in Anthropic's shape; the message starts with the field (errors
 * from the shared path, e.g. the context check, are prefixed here). */
static void anth_error(df_http_req *r, const df_oai_error *e) {
    char msg[sizeof e->param + sizeof e->message + 4];
    size_t pl = strlen(e->param);
    if (pl && e->status < 500 && !(strncmp(e->message, e->param, pl) == 0 && e->message[pl] == ':'))
        snprintf(msg, sizeof msg, "%s: %s", e->param, e->message);
    else
        snprintf(msg, sizeof msg, "%s", e->message);
    char *b = df_http_anth_error_body(e->status, msg);
    if (!b) { df_http_drop(r); return; }
    df_http_respond(r, e->status, "application/json", b, strlen(b), NULL, NULL);
    free(b);
}

static void anth_busy(df_http_req *r, int qmax) {
    char msg[200];
    snprintf(msg, sizeof msg, "Overloaded: one generation is running and %d are waiting (--queue %d). Retry later.", qmax, qmax);
    char *b = df_http_anth_error_body(529, msg);
    if (b) df_http_respond(r, 529, "application/json", b, strlen(b), "Retry-After", "1");
    else df_http_drop(r);
    free(b);
}

static const char *stop_reason(const gen *g) {
    if (!strcmp(g->finish, "length")) return "max_tokens";
    return g->stop_hit >= 0 ? "stop_sequence" : "end_turn";
}

static json_t *stop_sequence(const gen *g) {
    return g->stop_hit >= 0 && g->stop_hit < g->rq.n_stop ? jstr(g->rq.stop[g->stop_hit], strlen(g->rq.stop[g->stop_hit]))
                                                           : json_null();
}

/* input_tokens counts the prompt tokens not read from the cache, as
 * Anthropic's usage does: input + cache_read = the whole prompt. */
static json_t *usage(const gen *g, long output) {
    json_t *u = json_object();
    json_object_set_new(u, "input_tokens", json_integer((json_int_t)(g->n_prompt - g->cached)));
    json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
    json_object_set_new(u, "cache_read_input_tokens", json_integer((json_int_t)g->cached));
    json_object_set_new(u, "output_tokens", json_integer(output));
    return u;
}

/* The message object; done: with content, stop_reason and usage as they end. */
static json_t *message(const gen *g, int done) {
    json_t *o = json_object(), *content = json_array();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "type", json_string("message"));
    json_object_set_new(o, "role", json_string("assistant"));
    json_object_set_new(o, "model", json_string(g->srv->model_id));
    if (done) {
        json_t *b = json_object();
        json_object_set_new(b, "type", json_string("text"));
        json_object_set_new(b, "text", jstr(g->text.p ? g->text.p : "", g->text.len));
        json_array_append_new(content, b);
    }
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "stop_reason", done ? json_string(stop_reason(g)) : json_null());
    json_object_set_new(o, "stop_sequence", done ? stop_sequence(g) : json_null());
    json_object_set_new(o, "usage", usage(g, done ? g->n_gen : 0));
    return o;
}

static char *anth_body(const gen *g) {
    json_t *o = message(g, 1);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* "event: <type>\ndata: <json>\n\n"; consumes o. */
static void event(gen *g, const char *type, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) { g->out.oom = 1; return; }
    sb_put(&g->out, "event: ", 7);
    sb_put(&g->out, type, strlen(type));
    sb_put(&g->out, "\ndata: ", 7);
    sb_put(&g->out, s, strlen(s));
    sb_put(&g->out, "\n\n", 2);
    free(s);
}

static json_t *typed(const char *type) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string(type));
    return o;
}

static void sse_head(gen *g) {
    json_t *o = typed("message_start");
    json_object_set_new(o, "message", message(g, 0));
    event(g, "message_start", o);
    o = typed("content_block_start");
    json_object_set_new(o, "index", json_integer(0));
    json_t *b = typed("text");
    json_object_set_new(b, "text", json_string(""));
    json_object_set_new(o, "content_block", b);
    event(g, "content_block_start", o);
    event(g, "ping", typed("ping"));
}

static void sse_more(gen *g) {
    if (g->text.len <= g->sent) return;
    json_t *o = typed("content_block_delta"), *d = typed("text_delta");
    json_object_set_new(o, "index", json_integer(0));
    json_object_set_new(d, "text", jstr(g->text.p + g->sent, g->text.len - g->sent));
    json_object_set_new(o, "delta", d);
    event(g, "content_block_delta", o);
    g->sent = g->text.len;
}

static void sse_tail(gen *g) {
    sse_more(g);
    json_t *o = typed("content_block_stop");
    json_object_set_new(o, "index", json_integer(0));
    event(g, "content_block_stop", o);
    o = typed("message_delta");
    json_t *d = json_object(), *u = json_object();
    json_object_set_new(d, "stop_reason", json_string(stop_reason(g)));
    json_object_set_new(d, "stop_sequence", stop_sequence(g));
    json_object_set_new(o, "delta", d);
    json_object_set_new(u, "output_tokens", json_integer(g->n_gen));
    json_object_set_new(o, "usage", u);
    event(g, "message_delta", o);
    event(g, "message_stop", typed("message_stop"));
}

/* An error after the stream began: an error event ends it. */
static void sse_error(gen *g) {
    char *b = df_http_anth_error_body(g->errstatus ? g->errstatus : 500, g->errmsg);
    if (!b) { g->out.oom = 1; return; }
    sb_put(&g->out, "event: error\ndata: ", 19);
    sb_put(&g->out, b, strlen(b));
    sb_put(&g->out, "\n\n", 2);
    free(b);
}

static const df_proto anth = {"msg_", anth_error, anth_busy, anth_body, sse_head, sse_more, sse_tail, sse_error};

/* =========================================================================
 * Routes
 * ========================================================================= */

static void oom(df_http_req *r) {
    df_oai_error e = {.status = 503};
    snprintf(e.message, sizeof e.message, "Out of memory.");
    anth_error(r, &e);
}

void df_anth_messages(df_oai_server *s, df_http_req *r) {
    size_t len;
    const char *body = df_http_body(r, &len);
    df_oai_limits lim = {s->model_id, s->info.vocab_size, s->cap};
    df_oai_error e;
    gen *g = gen_new(s, r, &anth);
    if (!g) { oom(r); return; }
    if (df_anth_parse(0, &lim, body, len, &g->rq, &e)) { anth_error(r, &e); gen_free(g); return; }
    g->want_stop_hit = g->rq.n_stop > 0;
    df_oai_run(g, body, len, 'A');
}

void df_anth_count_tokens(df_oai_server *s, df_http_req *r) {
    size_t len;
    const char *body = df_http_body(r, &len);
    df_oai_limits lim = {s->model_id, s->info.vocab_size, s->cap};
    df_oai_error e;
    gen *g = gen_new(s, r, &anth);
    if (!g) { oom(r); return; }
    if (df_anth_parse(1, &lim, body, len, &g->rq, &e)) { anth_error(r, &e); gen_free(g); return; }
    g->count_only = 1;
    int big = len >= DF_OAI_BIG_BODY;
    if (big) pthread_mutex_lock(&s->pmu);
    int rc = gen_tokenize(g, &e);
    if (big) pthread_mutex_unlock(&s->pmu);
    if (rc) { anth_error(r, &e); gen_free(g); return; }
    json_t *o = json_object();
    json_object_set_new(o, "input_tokens", json_integer((json_int_t)g->n_prompt));
    char *out = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (out) df_http_respond(r, 200, "application/json", out, strlen(out), NULL, NULL);
    else oom(r);
    free(out);
    gen_free(g);
}
