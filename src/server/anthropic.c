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
 *   - what the engine cannot honour (a forced tool call, server tools,
 *     images and documents, an assistant prefill, unknown fields) is refused
 *     with a 400 whose message starts with the offending field, never
 *     ignored; tool_use / tool_result / thinking blocks become the messages
 *     the OpenAI route renders (assistant tool_calls and reasoning_content,
 *     tool messages);
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
    "image", "document", "redacted_thinking", "server_tool_use",
    "web_search_tool_result", "search_result", "container_upload", "mcp_tool_use", "mcp_tool_result",
};

/* What a turn's tool_use / tool_result / thinking blocks become: the
 * internal messages the OpenAI route renders (assistant tool_calls and
 * reasoning_content, tool messages). */
typedef struct {
    int asst;
    json_t *calls;     /* assistant: [{id, type, function: {name, arguments}}] */
    sbuf thinking;     /* assistant: the thinking blocks' text */
    json_t *results;   /* user: [{role: tool, tool_call_id, content}] */
} turn_extra;

/* Content: a string, or an array of text blocks ({type: "text", text,
 * cache_control?, citations: null?}) joined with "\n" (as the OpenAI chat
 * route joins text parts). Appends the text to *b. */
static int parse_content(const json_t *c, const char *where, sbuf *b, turn_extra *x, df_oai_error *e);

/* A tool_use block (assistant): {type, id, name, input: object, cache_control?}. */
static int tool_use_block(const json_t *blk, const char *p, turn_extra *x, df_oai_error *e) {
    char q[160];
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)blk, k, v) {
        df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
        if (!strcmp(k, "type") || !strcmp(k, "cache_control")) continue;
        if (!strcmp(k, "id") || !strcmp(k, "name")) { if (!json_is_string(v)) return bad_type(e, q, "a string", v); continue; }
        if (!strcmp(k, "input")) { if (!json_is_object(v)) return bad_type(e, q, "an object", v); continue; }
        return unknown(e, q);
    }
    static const char *const need[] = {"id", "name", "input"};
    for (int i = 0; i < 3; i++)
        if (!json_object_get(blk, need[i])) { df_oai_pathf(q, sizeof q, "%s.%s", p, need[i]); return afail(e, 400, q, "Field required"); }
    char *args = json_dumps(json_object_get(blk, "input"), JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!args) return afail(e, 503, NULL, "Out of memory.");
    json_t *call = json_object(), *fn = json_object();
    json_object_set(call, "id", json_object_get(blk, "id"));
    json_object_set_new(call, "type", json_string("function"));
    json_object_set(fn, "name", json_object_get(blk, "name"));
    json_object_set_new(fn, "arguments", json_string(args));
    free(args);
    json_object_set_new(call, "function", fn);
    json_array_append_new(x->calls, call);
    return 0;
}

/* A tool_result block (user): {type, tool_use_id, content?: string or text
 * blocks, is_error?, cache_control?} -> a tool message. */
static int tool_result_block(const json_t *blk, const char *p, turn_extra *x, df_oai_error *e) {
    char q[160];
    const char *k;
    json_t *v;
    sbuf text = {0};
    json_object_foreach((json_t *)blk, k, v) {
        df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
        if (!strcmp(k, "type") || !strcmp(k, "cache_control")) continue;
        if (!strcmp(k, "tool_use_id")) { if (!json_is_string(v)) { free(text.p); return bad_type(e, q, "a string", v); } continue; }
        if (!strcmp(k, "is_error")) { if (!json_is_boolean(v) && !json_is_null(v)) { free(text.p); return bad_type(e, q, "a boolean", v); } continue; }
        if (!strcmp(k, "content")) {
            if (json_is_array(v) && !json_array_size(v)) continue;
            if (parse_content(v, q, &text, NULL, e)) { free(text.p); return -1; }
            continue;
        }
        free(text.p);
        return unknown(e, q);
    }
    json_t *id = json_object_get(blk, "tool_use_id");
    if (!id) { free(text.p); df_oai_pathf(q, sizeof q, "%s.tool_use_id", p); return afail(e, 400, q, "Field required"); }
    json_t *c = json_stringn(text.p ? text.p : "", text.len);
    free(text.p);
    if (!c || text.oom) { json_decref(c); return afail(e, 400, p, "not valid UTF-8"); }
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("tool"));
    json_object_set(m, "tool_call_id", id);
    json_object_set_new(m, "content", c);
    json_array_append_new(x->results, m);
    return 0;
}

/* A thinking block (assistant): {type, thinking, signature?}. */
static int thinking_block(const json_t *blk, const char *p, turn_extra *x, df_oai_error *e) {
    char q[160];
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)blk, k, v) {
        df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
        if (!strcmp(k, "type")) continue;
        if (!strcmp(k, "thinking") || !strcmp(k, "signature")) { if (!json_is_string(v)) return bad_type(e, q, "a string", v); continue; }
        return unknown(e, q);
    }
    json_t *t = json_object_get(blk, "thinking");
    if (!t) { df_oai_pathf(q, sizeof q, "%s.thinking", p); return afail(e, 400, q, "Field required"); }
    if (x->thinking.len) sb_put(&x->thinking, "\n", 1);
    sb_put(&x->thinking, json_string_value(t), json_string_length(t));
    return 0;
}

static int parse_content(const json_t *c, const char *where, sbuf *b, turn_extra *x, df_oai_error *e) {
    if (json_is_string(c)) { sb_put(b, json_string_value(c), json_string_length(c)); return 0; }
    if (!json_is_array(c)) return bad_type(e, where, "a string or an array of content blocks", c);
    if (!json_array_size(c)) return afail(e, 400, where, "expected at least one content block");
    size_t i;
    json_t *blk;
    int ntext = 0;
    json_array_foreach(c, i, blk) {
        char p[96], q[160];
        df_oai_pathf(p, sizeof p, "%s.%zu", where, i);
        if (!json_is_object(blk)) return bad_type(e, p, "an object", blk);
        json_t *type = json_object_get(blk, "type");
        df_oai_pathf(q, sizeof q, "%s.type", p);
        if (!type) return afail(e, 400, q, "Field required");
        if (!json_is_string(type)) return bad_type(e, q, "a string", type);
        const char *t = json_string_value(type);
        if (x && x->asst && !strcmp(t, "tool_use")) { if (tool_use_block(blk, p, x, e)) return -1; continue; }
        if (x && x->asst && !strcmp(t, "thinking")) { if (thinking_block(blk, p, x, e)) return -1; continue; }
        if (x && !x->asst && !strcmp(t, "tool_result")) { if (tool_result_block(blk, p, x, e)) return -1; continue; }
        if (!strcmp(t, "tool_use") || !strcmp(t, "thinking") || !strcmp(t, "tool_result"))
            return afail(e, 400, q, "'%s' blocks are only allowed in %s turns", t,
                         !strcmp(t, "tool_result") ? "user" : "assistant");
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
        if (ntext++) sb_put(b, "\n", 1);
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
    if (last && !strcmp(json_string_value(json_object_get(last, "role")), role) && json_is_string(json_object_get(last, "content")) &&
        !json_object_get(last, "tool_calls")) {
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
        turn_extra x = {.asst = !strcmp(r, "assistant"), .calls = json_array(), .results = json_array()};
        int rc = parse_content(content, q, &text, &x, e);
        if (!rc && (json_array_size(x.calls) || x.thinking.len)) {
            /* an assistant turn with tool calls or thinking: a message of its own */
            json_t *o = json_object(), *c = text.len ? json_stringn(text.p, text.len) : json_null();
            json_object_set_new(o, "role", json_string("assistant"));
            json_object_set_new(o, "content", c ? c : json_null());
            if (x.thinking.len) json_object_set_new(o, "reasoning_content", json_stringn(x.thinking.p, x.thinking.len));
            if (json_array_size(x.calls)) json_object_set(o, "tool_calls", x.calls);
            json_array_append_new(norm, o);
            free(text.p);
            if (x.thinking.oom || text.oom) rc = afail(e, 503, NULL, "Out of memory.");
        } else if (!rc && json_array_size(x.results)) {
            /* tool results first (they answer the previous turn's calls), then any text */
            json_array_extend(norm, x.results);
            if (text.len) rc = add_turn(norm, r, &text, q, e);
            else free(text.p);
        } else if (!rc) {
            rc = add_turn(norm, r, &text, q, e);
        } else {
            free(text.p);
        }
        json_decref(x.calls);
        json_decref(x.results);
        free(x.thinking.p);
        if (rc) return -1;
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

/* tools: [{name, description?, input_schema, cache_control?, type?:
 * "custom"}] -> the OpenAI shape the templates get ({type: "function",
 * function: {name, description, parameters}}). Anthropic's server tools
 * (web search, bash, ...) are refused. */
static int parse_tools(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (!json_is_array(v)) return bad_type(e, "tools", "an array", v);
    json_t *out = json_array(), *seen = json_object();
    size_t i;
    json_t *t;
    int rc = 0;
    json_array_foreach(v, i, t) {
        char p[48], q[96];
        df_oai_pathf(p, sizeof p, "tools.%zu", i);
        if (!json_is_object(t)) { rc = bad_type(e, p, "an object", t); break; }
        json_t *type = json_object_get(t, "type");
        if (type && !json_is_null(type) && !(json_is_string(type) && !strcmp(json_string_value(type), "custom"))) {
            df_oai_pathf(q, sizeof q, "%s.type", p);
            rc = json_is_string(type) ? refuse(e, q, "Anthropic's server tools (only custom tools with an input_schema)")
                                      : bad_type(e, q, "a string", type);
            break;
        }
        const char *k;
        json_t *x;
        json_object_foreach(t, k, x) {
            df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
            if (!strcmp(k, "type") || !strcmp(k, "cache_control")) continue;
            if (!strcmp(k, "name") || !strcmp(k, "description")) { if (!json_is_string(x)) { rc = bad_type(e, q, "a string", x); break; } continue; }
            if (!strcmp(k, "input_schema")) { if (!json_is_object(x)) { rc = bad_type(e, q, "an object", x); break; } continue; }
            rc = unknown(e, q);
            break;
        }
        if (rc) break;
        json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
        if (!name) { df_oai_pathf(q, sizeof q, "%s.name", p); rc = afail(e, 400, q, "Field required"); break; }
        if (!schema) { df_oai_pathf(q, sizeof q, "%s.input_schema", p); rc = afail(e, 400, q, "Field required"); break; }
        const char *nm = json_string_value(name);
        size_t nl = json_string_length(name);
        int ok = nl >= 1 && nl <= 64;
        for (size_t j = 0; ok && j < nl; j++)
            ok = (nm[j] >= 'a' && nm[j] <= 'z') || (nm[j] >= 'A' && nm[j] <= 'Z') || (nm[j] >= '0' && nm[j] <= '9') || nm[j] == '_' || nm[j] == '-';
        df_oai_pathf(q, sizeof q, "%s.name", p);
        if (!ok) { rc = afail(e, 400, q, "String should match pattern '^[a-zA-Z0-9_-]{1,64}$'"); break; }
        if (json_object_get(seen, nm)) { rc = afail(e, 400, "tools", "tool names must be unique ('%.64s' twice)", nm); break; }
        json_object_set_new(seen, nm, json_true());
        json_t *fn = json_object(), *o = json_object();
        json_object_set(fn, "name", name);
        if (json_object_get(t, "description")) json_object_set(fn, "description", json_object_get(t, "description"));
        json_object_set(fn, "parameters", schema);
        json_object_set_new(o, "type", json_string("function"));
        json_object_set_new(o, "function", fn);
        json_array_append_new(out, o);
    }
    if (!rc && json_array_size(out)) {
        free(r->tools_json);
        r->tools_json = json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!r->tools_json) rc = afail(e, 503, NULL, "Out of memory.");
    }
    json_decref(out);
    json_decref(seen);
    return rc;
}

/* tool_choice: {type: "auto" | "any" | "tool" | "none", name?, disable_parallel_tool_use?}. */
static int parse_tool_choice(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (!json_is_object(v)) return bad_type(e, "tool_choice", "an object", v);
    json_t *t = json_object_get(v, "type");
    if (!json_is_string(t)) return afail(e, 400, "tool_choice.type", "Field required");
    const char *ty = json_string_value(t), *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        char p[64];
        df_oai_pathf(p, sizeof p, "tool_choice.%.40s", k);
        if (!strcmp(k, "type") || (!strcmp(k, "name") && !strcmp(ty, "tool"))) continue;
        if (!strcmp(k, "disable_parallel_tool_use") && strcmp(ty, "none")) {
            if (!json_is_boolean(x)) return bad_type(e, p, "a boolean", x);
            if (json_is_true(x)) r->parallel_tool_calls = 0;
            continue;
        }
        return unknown(e, p);
    }
    if (!strcmp(ty, "auto")) r->tool_choice = DF_OAI_TOOLS_AUTO;
    else if (!strcmp(ty, "none")) r->tool_choice = DF_OAI_TOOLS_NONE;
    else if (!strcmp(ty, "any")) r->tool_choice = DF_OAI_TOOLS_REQUIRED; /* enforced by constrained decoding */
    else if (!strcmp(ty, "tool")) {
        json_t *nm = json_object_get(v, "name");
        if (!json_is_string(nm)) return afail(e, 400, "tool_choice.name", "Field required");
        r->tool_choice = DF_OAI_TOOLS_NAMED;
        free(r->tool_choice_name);
        if (!(r->tool_choice_name = strndup(json_string_value(nm), json_string_length(nm)))) return afail(e, 503, NULL, "Out of memory.");
    } else return afail(e, 400, "tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none', got '%.40s'", ty);
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
        if (parse_content(v, "system", &text, NULL, e)) { free(text.p); return -1; }
        if (!text.len && !text.oom) { free(text.p); return 0; } /* an empty system prompt is none */
        return add_turn(sys, "system", &text, "system", e);
    }
    if (!strcmp(k, "tools")) return parse_tools(v, r, e);
    if (!strcmp(k, "tool_choice")) return parse_tool_choice(v, r, e);
    if (!strcmp(k, "thinking")) {
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        json_t *t = json_object_get(v, "type");
        if (!json_is_string(t)) return afail(e, 400, "thinking.type", "Field required");
        const char *ty = json_string_value(t), *k2;
        json_t *v2;
        json_object_foreach((json_t *)v, k2, v2) {
            char p[64];
            df_oai_pathf(p, sizeof p, "thinking.%.40s", k2);
            if (strcmp(k2, "type") && !(strcmp(ty, "enabled") == 0 && strcmp(k2, "budget_tokens") == 0)) return unknown(e, p);
        }
        if (!strcmp(ty, "disabled")) { r->thinking = 2; return 0; }
        if (strcmp(ty, "enabled")) return afail(e, 400, "thinking.type", "Input should be 'enabled' or 'disabled', got '%.40s'", ty);
        json_t *b = json_object_get(v, "budget_tokens");
        if (!b) return afail(e, 400, "thinking.budget_tokens", "Field required");
        if (!json_is_integer(b)) return bad_type(e, "thinking.budget_tokens", "an integer", b);
        if (json_integer_value(b) < 1024) return afail(e, 400, "thinking.budget_tokens", "must be at least 1024, got %lld", (long long)json_integer_value(b));
        r->thinking = 1;
        return 0;
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
    out->parallel_tool_calls = 1;
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
        else if (df_oai_check_tool_choice(out, e)) {
            /* the chat route's checks, named in this API's terms */
            size_t i;
            char p[sizeof e->param], m[sizeof e->message];
            snprintf(m, sizeof m, "%s", e->message);
            if (sscanf(e->param, "tools[%zu].function.parameters", &i) == 1) snprintf(p, sizeof p, "tools.%zu.input_schema", i);
            else snprintf(p, sizeof p, "%s", e->param);
            rc = afail(e, e->status, p, "%s", m);
        }
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

static const char *stop_reason(gen *g) {
    if (!strcmp(g->finish, "length")) return "max_tokens";
    if (!strcmp(gen_finish(g), "tool_calls")) return "tool_use";
    return g->stop_hit >= 0 ? "stop_sequence" : "end_turn";
}

/* Anthropic's id of a call: toolu_ + the call id's characters (a native id
 * such as Kimi K2's functions.NAME:IDX is kept). */
static json_t *tool_use_id(const df_tc_call *c) {
    char id[80];
    if (!strncmp(c->id, "call_", 5)) snprintf(id, sizeof id, "toolu_%s", c->id + 5);
    else snprintf(id, sizeof id, "%s", c->id);
    return json_string(id);
}

static json_t *tool_use_block_json(const df_tc_call *c, int with_input) {
    json_t *b = json_object();
    json_object_set_new(b, "type", json_string("tool_use"));
    json_object_set_new(b, "id", tool_use_id(c));
    json_object_set_new(b, "name", jstr(c->name, strlen(c->name)));
    json_t *in = with_input ? json_loads(c->args, 0, NULL) : NULL;
    json_object_set_new(b, "input", in ? in : json_object());
    return b;
}

static json_t *stop_sequence(gen *g) {
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
static json_t *message(gen *g, int done) {
    json_t *o = json_object(), *content = json_array();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "type", json_string("message"));
    json_object_set_new(o, "role", json_string("assistant"));
    json_object_set_new(o, "model", json_string(g->srv->model_id));
    df_tc *tc = done ? gen_tc(g) : NULL;
    if (tc) { /* thinking, then text (also when empty, unless there are tool calls), then tool_use blocks */
        size_t cl, rl, nc = df_tc_n_calls(tc);
        const char *c = df_tc_content(tc, &cl), *r = df_tc_reasoning(tc, &rl);
        if (rl) {
            json_t *b = json_object();
            json_object_set_new(b, "type", json_string("thinking"));
            json_object_set_new(b, "thinking", jstr(r, rl));
            json_object_set_new(b, "signature", json_string(""));
            json_array_append_new(content, b);
        }
        if (cl || !nc) {
            json_t *b = json_object();
            json_object_set_new(b, "type", json_string("text"));
            json_object_set_new(b, "text", jstr(c, cl));
            json_array_append_new(content, b);
        }
        for (size_t i = 0; i < nc; i++) json_array_append_new(content, tool_use_block_json(df_tc_call_at(tc, i), 1));
    }
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "stop_reason", done ? json_string(stop_reason(g)) : json_null());
    json_object_set_new(o, "stop_sequence", done ? stop_sequence(g) : json_null());
    json_object_set_new(o, "usage", usage(g, done ? g->n_gen : 0));
    return o;
}

static char *anth_body(const gen *cg) {
    gen *g = (gen *)cg; /* the output parser is fed here */
    json_t *o = message(g, 1);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* "event: <type>\ndata: <json>\n\n"; consumes o. */
static void event(gen *g, const char *type, json_t *o) { gen_sse_event(g, type, o); }

static json_t *typed(const char *type) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string(type));
    return o;
}

static void sse_head(gen *g) {
    json_t *o = typed("message_start");
    json_object_set_new(o, "message", message(g, 0));
    event(g, "message_start", o);
}

/* Blocks are opened as the output needs them: content_block_start (the
 * first one followed by a ping, as Anthropic sends it), deltas, then
 * content_block_stop when another kind of block begins or at the end. */
static void block_stop(gen *g) {
    if (!g->ablk) return;
    json_t *o = typed("content_block_stop");
    json_object_set_new(o, "index", json_integer(g->aidx));
    event(g, "content_block_stop", o);
    g->ablk = 0;
    g->aidx++;
}

static void block_start(gen *g, json_t *block) {
    json_t *o = typed("content_block_start");
    json_object_set_new(o, "index", json_integer(g->aidx));
    json_object_set_new(o, "content_block", block);
    event(g, "content_block_start", o);
    if (!g->aping) { event(g, "ping", typed("ping")); g->aping = 1; }
}

static void block_delta(gen *g, json_t *delta) {
    json_t *o = typed("content_block_delta");
    json_object_set_new(o, "index", json_integer(g->aidx));
    json_object_set_new(o, "delta", delta);
    event(g, "content_block_delta", o);
}

/* kind 1: thinking, 2: text. */
static void block_text(gen *g, int kind, const char *p, size_t n) {
    if (g->ablk != kind) {
        block_stop(g);
        json_t *b = typed(kind == 1 ? "thinking" : "text");
        json_object_set_new(b, kind == 1 ? "thinking" : "text", json_string(""));
        if (kind == 1) json_object_set_new(b, "signature", json_string(""));
        block_start(g, b);
        g->ablk = kind;
    }
    if (!n) return;
    json_t *d = typed(kind == 1 ? "thinking_delta" : "text_delta");
    json_object_set_new(d, kind == 1 ? "thinking" : "text", jstr(p, n));
    block_delta(g, d);
}

static void sse_more(gen *g) {
    df_tc *tc = gen_tc(g);
    if (!tc) { g->out.oom = 1; return; }
    size_t cl, rl;
    const char *c = df_tc_content(tc, &cl), *r = df_tc_reasoning(tc, &rl);
    if (rl > g->sent_r) { block_text(g, 1, r + g->sent_r, rl - g->sent_r); g->sent_r = rl; }
    if (cl > g->sent) { block_text(g, 2, c + g->sent, cl - g->sent); g->sent = cl; }
    for (; g->calls_sent < df_tc_n_calls(tc); g->calls_sent++) {
        const df_tc_call *k = df_tc_call_at(tc, g->calls_sent);
        block_stop(g);
        block_start(g, tool_use_block_json(k, 0));
        json_t *d = typed("input_json_delta");
        json_object_set_new(d, "partial_json", jstr(k->args, strlen(k->args)));
        block_delta(g, d);
        g->ablk = 3;
        block_stop(g);
    }
}

static void sse_tail(gen *g) {
    sse_more(g);
    if (!g->aidx && !g->ablk) block_text(g, 2, "", 0); /* an empty answer still has its text block */
    block_stop(g);
    json_t *o = typed("message_delta");
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
