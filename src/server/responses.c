/* responses.c - the OpenAI Responses API (see oai_int.h and docs/SERVER.md):
 * POST /v1/responses, as Codex and the openai SDK's client.responses use it.
 *
 * A Responses body is validated (df_resp_parse, pure) into the same chat
 * request a Chat Completions client would send with the same conversation:
 * `instructions` first as a system turn, then the input items in order
 * (message items by role; "developer" is rendered as "system", as the Chat
 * Completions route does for templates that know no developer role). It
 * then takes the same way through the memo, the queue and the generation
 * (df_oai_run); only the answers differ (the df_proto below).
 *
 * Invariants:
 *   - nothing is stored: store: true and previous_response_id are refused
 *     (a client must send the whole conversation, as Codex does with
 *     store: false), and so is anything else the engine cannot honour,
 *     with a 400 naming the field, never ignored;
 *   - errors have the OpenAI shape (the same responder as the chat route);
 *   - streaming events carry increasing sequence_number values from 0, in
 *     the order the openai SDK's stream accumulator expects: created,
 *     in_progress, output_item.added, content_part.added, output_text.delta
 *     ..., output_text.done, content_part.done, output_item.done, then
 *     completed (or incomplete when max_output_tokens ended it).
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

#define bad_type df_oai_bad_type

static int refuse(df_oai_error *e, const char *field, const char *what) {
    return df_oai_fail(e, 400, field, "unsupported_parameter",
                       "Unsupported parameter: '%s': %s (Deltafin refuses what it cannot honour instead of ignoring it).",
                       field, what);
}

static int unknown(df_oai_error *e, const char *field) {
    return df_oai_fail(e, 400, field, "unknown_parameter", "Unknown parameter: '%s'.", field);
}

static int missing(df_oai_error *e, const char *field) {
    return df_oai_fail(e, 400, field, "missing_required_parameter", "Missing required parameter: '%s'.", field);
}

/* Appends {role, content: text} to turns. Returns 0 or -1 (not UTF-8 / out of memory). */
static int add_turn(json_t *turns, const char *role, const char *text, size_t n, const char *where, df_oai_error *e) {
    json_t *c = json_stringn(text ? text : "", n);
    if (!c) return df_oai_fail(e, 400, where, "invalid_value", "Invalid value for '%s': not valid UTF-8.", where);
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "role", json_string(role)) || json_object_set_new(o, "content", c) ||
        json_array_append_new(turns, o))
        return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    return 0;
}

/* A message item's content: a string, or an array of parts: input_text (user,
 * system, developer) or output_text (assistant) {type, text} joined with "\n"
 * as the chat route joins text parts. Appends to b. */
static int parse_content(const json_t *c, const char *where, int assistant, sbuf *b, df_oai_error *e) {
    if (json_is_string(c)) { sb_put(b, json_string_value(c), json_string_length(c)); return 0; }
    if (!json_is_array(c)) return bad_type(e, where, "a string or an array of content parts", c);
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        char p[96], q[160];
        df_oai_pathf(p, sizeof p, "%s[%zu]", where, i);
        if (!json_is_object(part)) return bad_type(e, p, "an object", part);
        json_t *type = json_object_get(part, "type");
        df_oai_pathf(q, sizeof q, "%s.type", p);
        if (!type) return missing(e, q);
        if (!json_is_string(type)) return bad_type(e, q, "a string", type);
        const char *t = json_string_value(type);
        const char *want = assistant ? "output_text" : "input_text";
        if (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio") || !strcmp(t, "refusal")) {
            char what[80];
            df_oai_pathf(what, sizeof what, "'%s' content parts (text only)", t);
            return refuse(e, q, what);
        }
        if (strcmp(t, want))
            return df_oai_fail(e, 400, q, "invalid_value", "Invalid value: '%.40s'. A %s message's parts must be '%s'.", t,
                               assistant ? "assistant" : "user/system/developer", want);
        const char *k;
        json_t *v;
        json_object_foreach(part, k, v) {
            df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
            if (!strcmp(k, "type")) continue;
            if (!strcmp(k, "text")) { if (!json_is_string(v)) return bad_type(e, q, "a string", v); continue; }
            /* what an earlier response returned, sent back as history: only empty ones carry no meaning */
            if (assistant && (!strcmp(k, "annotations") || !strcmp(k, "logprobs"))) {
                if (json_is_null(v) || (json_is_array(v) && !json_array_size(v))) continue;
                if (!strcmp(k, "logprobs") && json_is_array(v)) continue; /* log-probabilities of history change nothing */
                return refuse(e, q, "annotations in history");
            }
            return unknown(e, q);
        }
        json_t *text = json_object_get(part, "text");
        df_oai_pathf(q, sizeof q, "%s.text", p);
        if (!text) return missing(e, q);
        if (i) sb_put(b, "\n", 1);
        sb_put(b, json_string_value(text), json_string_length(text));
    }
    return 0;
}

/* The conversation being built from input items: the chat messages, and
 * reasoning waiting for the assistant turn it belongs to. */
typedef struct {
    json_t *turns;
    sbuf reasoning;
    int has_reasoning;
} conv;

/* Gives the pending reasoning to the assistant message o (as the chat
 * route's reasoning_content). */
static int take_reasoning(conv *cv, json_t *o, df_oai_error *e) {
    if (!cv->has_reasoning) return 0;
    cv->has_reasoning = 0;
    if (cv->reasoning.oom) return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    json_t *r = json_stringn(cv->reasoning.p ? cv->reasoning.p : "", cv->reasoning.len);
    cv->reasoning.len = 0;
    if (!r) return df_oai_fail(e, 400, "input", "invalid_value", "Invalid value for a reasoning item: not valid UTF-8.");
    json_object_set_new(o, "reasoning_content", r);
    return 0;
}

/* Checks the keys of an item: every key must be in allowed (NULL-ended) or
 * be id/status (what an earlier response returned, sent back as history). */
static int item_keys(const json_t *it, const char *p, const char *const *allowed, df_oai_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)it, k, v) {
        char q[96];
        df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(k, *a);
        if (ok) continue;
        if (!strcmp(k, "id") || !strcmp(k, "status")) {
            if (!json_is_null(v) && !json_is_string(v)) return bad_type(e, q, "a string", v);
            continue;
        }
        return unknown(e, q);
    }
    return 0;
}

static int get_str(const json_t *it, const char *p, const char *key, const json_t **out, df_oai_error *e) {
    char q[96];
    df_oai_pathf(q, sizeof q, "%s.%s", p, key);
    const json_t *v = json_object_get(it, key);
    if (!v || json_is_null(v)) return missing(e, q);
    if (!json_is_string(v)) return bad_type(e, q, "a string", v);
    *out = v;
    return 0;
}

/* function_call {call_id, name, arguments}: a tool call of the assistant,
 * added to the assistant message just before it (one turn: its text, then
 * its calls), or to a new one with content null, as Chat Completions
 * clients send it. */
static int function_call(const json_t *it, const char *p, conv *cv, df_oai_error *e) {
    static const char *const keys[] = {"type", "call_id", "name", "arguments", NULL};
    const json_t *id, *name, *args;
    if (item_keys(it, p, keys, e) || get_str(it, p, "call_id", &id, e) || get_str(it, p, "name", &name, e) ||
        get_str(it, p, "arguments", &args, e))
        return -1;
    json_t *last = json_array_get(cv->turns, json_array_size(cv->turns) - 1), *o;
    if (last && !strcmp(json_string_value(json_object_get(last, "role")), "assistant") && !cv->has_reasoning) {
        o = last;
    } else {
        o = json_object();
        json_object_set_new(o, "role", json_string("assistant"));
        json_object_set_new(o, "content", json_null());
        json_array_append_new(cv->turns, o);
        if (take_reasoning(cv, o, e)) return -1;
    }
    json_t *calls = json_object_get(o, "tool_calls");
    if (!calls) { calls = json_array(); json_object_set_new(o, "tool_calls", calls); }
    json_t *c = json_object(), *f = json_object();
    json_object_set(c, "id", (json_t *)id);
    json_object_set_new(c, "type", json_string("function"));
    json_object_set(f, "name", (json_t *)name);
    json_object_set(f, "arguments", (json_t *)args);
    json_object_set_new(c, "function", f);
    json_array_append_new(calls, c);
    return 0;
}

/* function_call_output {call_id, output}: the tool's answer, a chat "tool"
 * message. output is a string or an array of input_text parts. */
static int function_call_output(const json_t *it, const char *p, conv *cv, df_oai_error *e) {
    static const char *const keys[] = {"type", "call_id", "output", NULL};
    const json_t *id;
    if (item_keys(it, p, keys, e) || get_str(it, p, "call_id", &id, e)) return -1;
    char q[96];
    df_oai_pathf(q, sizeof q, "%s.output", p);
    const json_t *out = json_object_get(it, "output");
    if (!out || json_is_null(out)) return missing(e, q);
    sbuf text = {0};
    if (parse_content(out, q, 0, &text, e)) { free(text.p); return -1; }
    if (text.oom) { free(text.p); return df_oai_fail(e, 503, NULL, NULL, "Out of memory."); }
    int rc = add_turn(cv->turns, "tool", text.p, text.len, q, e);
    free(text.p);
    if (!rc) json_object_set(json_array_get(cv->turns, json_array_size(cv->turns) - 1), "tool_call_id", (json_t *)id);
    return rc;
}

/* Texts of an array of {type: want, text} parts, joined with "\n" into b. */
static int reasoning_parts(const json_t *a, const char *where, const char *want, sbuf *b, df_oai_error *e) {
    if (!json_is_array(a)) return bad_type(e, where, "an array", a);
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) {
        char p[128];
        df_oai_pathf(p, sizeof p, "%s[%zu]", where, i);
        json_t *t = json_object_get(x, "type"), *text = json_object_get(x, "text");
        if (!json_is_object(x) || !json_is_string(t) || strcmp(json_string_value(t), want) || !json_is_string(text) ||
            json_object_size(x) != 2)
            return df_oai_fail(e, 400, p, "invalid_value", "Invalid value for '%s': expected {\"type\": \"%s\", \"text\": string}.", p, want);
        if (b->len) sb_put(b, "\n", 1);
        sb_put(b, json_string_value(text), json_string_length(text));
    }
    return 0;
}

/* reasoning {summary, content?, encrypted_content?}: the reasoning of the
 * assistant turn that follows, given to it as reasoning_content (the chat
 * route's field, which each template renders as it expects); its content
 * (reasoning_text parts), else its summary. */
static int reasoning_item(const json_t *it, const char *p, conv *cv, df_oai_error *e) {
    static const char *const keys[] = {"type", "summary", "content", "encrypted_content", NULL};
    if (item_keys(it, p, keys, e)) return -1;
    char q[96];
    const json_t *enc = json_object_get(it, "encrypted_content");
    df_oai_pathf(q, sizeof q, "%s.encrypted_content", p);
    if (enc && !json_is_null(enc)) return refuse(e, q, "encrypted reasoning (this server never encrypts reasoning, so it cannot read any)");
    const json_t *content = json_object_get(it, "content"), *summary = json_object_get(it, "summary");
    sbuf b = {0};
    int rc = 0;
    if (content && !json_is_null(content) && json_array_size(content)) {
        df_oai_pathf(q, sizeof q, "%s.content", p);
        rc = reasoning_parts(content, q, "reasoning_text", &b, e);
    } else if (summary && !json_is_null(summary)) {
        df_oai_pathf(q, sizeof q, "%s.summary", p);
        rc = reasoning_parts(summary, q, "summary_text", &b, e);
    } else {
        df_oai_pathf(q, sizeof q, "%s.summary", p);
        rc = missing(e, q);
    }
    if (!rc) {
        if (cv->has_reasoning && cv->reasoning.len && b.len) sb_put(&cv->reasoning, "\n", 1);
        sb_put(&cv->reasoning, b.p ? b.p : "", b.len);
        cv->has_reasoning = 1;
    }
    free(b.p);
    return rc;
}

/* One input item. Message items have type "message" or no type. */
static int parse_item(const json_t *it, size_t i, conv *cv, df_oai_error *e) {
    char p[48], q[96];
    df_oai_pathf(p, sizeof p, "input[%zu]", i);
    if (!json_is_object(it)) return bad_type(e, p, "an object", it);
    json_t *type = json_object_get(it, "type");
    df_oai_pathf(q, sizeof q, "%s.type", p);
    if (type && !json_is_null(type) && !json_is_string(type)) return bad_type(e, q, "a string", type);
    const char *t = type && json_is_string(type) ? json_string_value(type) : "message";
    if (!strcmp(t, "function_call")) return function_call(it, p, cv, e);
    if (!strcmp(t, "function_call_output")) return function_call_output(it, p, cv, e);
    if (!strcmp(t, "reasoning")) return reasoning_item(it, p, cv, e);
    if (strcmp(t, "message")) {
        if (!strcmp(t, "item_reference")) return refuse(e, q, "item references (nothing is stored)");
        char what[96];
        df_oai_pathf(what, sizeof what, "'%s' items", t);
        return refuse(e, q, what);
    }
    json_t *role = json_object_get(it, "role"), *content = json_object_get(it, "content");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)it, k, v) {
        df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
        if (!strcmp(k, "type") || !strcmp(k, "role") || !strcmp(k, "content")) continue;
        if (!strcmp(k, "id")) { if (!json_is_null(v) && !json_is_string(v)) return bad_type(e, q, "a string", v); continue; }
        if (!strcmp(k, "status")) { if (!json_is_null(v) && !json_is_string(v)) return bad_type(e, q, "a string", v); continue; }
        if (!strcmp(k, "phase")) { if (!json_is_null(v) && !json_is_string(v)) return bad_type(e, q, "a string", v); continue; }
        return unknown(e, q);
    }
    df_oai_pathf(q, sizeof q, "%s.role", p);
    if (!role) return missing(e, q);
    if (!json_is_string(role)) return bad_type(e, q, "a string", role);
    const char *r = json_string_value(role);
    int asst = !strcmp(r, "assistant");
    if (!asst && strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer"))
        return df_oai_fail(e, 400, q, "invalid_value",
                           "Invalid value: '%.40s'. Supported values are: 'user', 'assistant', 'system', and 'developer'.", r);
    df_oai_pathf(q, sizeof q, "%s.content", p);
    if (!content) return missing(e, q);
    sbuf text = {0};
    if (parse_content(content, q, asst, &text, e)) { free(text.p); return -1; }
    if (text.oom) { free(text.p); return df_oai_fail(e, 503, NULL, NULL, "Out of memory."); }
    int rc = add_turn(cv->turns, !strcmp(r, "developer") ? "system" : r, text.p, text.len, q, e);
    free(text.p);
    if (!rc && asst) rc = take_reasoning(cv, json_array_get(cv->turns, json_array_size(cv->turns) - 1), e);
    return rc;
}

static int parse_input(const json_t *v, json_t *turns, df_oai_error *e) {
    if (json_is_string(v)) return add_turn(turns, "user", json_string_value(v), json_string_length(v), "input", e);
    if (!json_is_array(v)) return bad_type(e, "input", "a string or an array of input items", v);
    if (!json_array_size(v)) return df_oai_fail(e, 400, "input", "empty_array", "Invalid 'input': empty array.");
    conv cv = {.turns = turns};
    size_t i;
    json_t *it;
    int rc = 0;
    json_array_foreach(v, i, it) if ((rc = parse_item(it, i, &cv, e))) break;
    free(cv.reasoning.p);
    if (rc) return -1;
    json_t *last = json_array_get(turns, json_array_size(turns) - 1);
    if (!last) return df_oai_fail(e, 400, "input", "invalid_value", "Invalid 'input': no message (reasoning items alone are no conversation).");
    if (!strcmp(json_string_value(json_object_get(last, "role")), "assistant"))
        return refuse(e, "input", "a last item from the assistant (continuing the assistant's text, or a function call without its output)");
    return 0;
}

/* tools: [{type: "function", name, description?, parameters?, strict?}]:
 * turned into the chat route's shape and checked by its own rules. */
static int parse_tools(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (!json_is_array(v)) return bad_type(e, "tools", "an array", v);
    json_t *chat = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        char p[48], q[96];
        df_oai_pathf(p, sizeof p, "tools[%zu]", i);
        if (!json_is_object(t)) { json_decref(chat); return bad_type(e, p, "an object", t); }
        json_t *type = json_object_get(t, "type");
        df_oai_pathf(q, sizeof q, "%s.type", p);
        if (!json_is_string(type)) { json_decref(chat); return type ? bad_type(e, q, "a string", type) : missing(e, q); }
        if (strcmp(json_string_value(type), "function")) {
            char what[96];
            df_oai_pathf(what, sizeof what, "'%s' tools (hosted and custom tools; only 'function' tools)", json_string_value(type));
            json_decref(chat);
            return refuse(e, q, what);
        }
        json_t *fn = json_object();
        const char *k;
        json_t *x;
        json_object_foreach(t, k, x) if (strcmp(k, "type") && !json_is_null(x)) json_object_set(fn, k, x);
        json_t *c = json_object();
        json_object_set_new(c, "type", json_string("function"));
        json_object_set_new(c, "function", fn);
        json_array_append_new(chat, c);
    }
    int rc = df_oai_parse_tools(chat, r, e);
    json_decref(chat);
    if (rc) { /* the chat checks name tools[i].function.x: here it is tools[i].x */
        char *f = strstr(e->param, ".function");
        if (f) memmove(f, f + 9, strlen(f + 9) + 1);
        while ((f = strstr(e->message, ".function."))) memmove(f, f + 9, strlen(f + 9) + 1);
    }
    return rc;
}

/* tool_choice: "none" | "auto" | "required" | {type: "function", name}. */
static int parse_tool_choice(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (json_is_string(v)) {
        const char *x = json_string_value(v);
        if (!strcmp(x, "none")) r->tool_choice = DF_OAI_TOOLS_NONE;
        else if (!strcmp(x, "auto")) r->tool_choice = DF_OAI_TOOLS_AUTO;
        else if (!strcmp(x, "required")) r->tool_choice = DF_OAI_TOOLS_REQUIRED;
        else return df_oai_fail(e, 400, "tool_choice", "invalid_value", "Invalid value: '%.40s'. Supported values are: 'none', 'auto', and 'required'.", x);
        return 0;
    }
    if (!json_is_object(v)) return bad_type(e, "tool_choice", "a string or an object", v);
    json_t *type = json_object_get(v, "type"), *name = json_object_get(v, "name");
    if (!json_is_string(type)) return missing(e, "tool_choice.type");
    if (strcmp(json_string_value(type), "function"))
        return refuse(e, "tool_choice.type", "only {\"type\": \"function\", \"name\": ...} names a tool here");
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        char p[80];
        df_oai_pathf(p, sizeof p, "tool_choice.%.40s", k);
        if (strcmp(k, "type") && strcmp(k, "name")) return unknown(e, p);
    }
    if (!json_is_string(name)) return missing(e, "tool_choice.name");
    r->tool_choice = DF_OAI_TOOLS_NAMED;
    free(r->tool_choice_name);
    r->tool_choice_name = strndup(json_string_value(name), json_string_length(name));
    return r->tool_choice_name ? 0 : df_oai_fail(e, 503, "tool_choice", NULL, "Out of memory.");
}

/* reasoning: {effort?, summary?}: effort reaches the template as
 * reasoning_effort (refused later if the template never reads it); the
 * reasoning is returned as it is, so a summary can only be "auto". */
static int parse_reasoning(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (!json_is_object(v)) return bad_type(e, "reasoning", "an object", v);
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        char p[64];
        df_oai_pathf(p, sizeof p, "reasoning.%.40s", k);
        if (json_is_null(x)) continue;
        if (!strcmp(k, "effort")) {
            static const char *const ok[] = {"none", "minimal", "low", "medium", "high", NULL};
            if (!json_is_string(x)) return bad_type(e, p, "a string", x);
            int good = 0;
            for (const char *const *o = ok; *o; o++) good |= !strcmp(*o, json_string_value(x));
            if (!good)
                return df_oai_fail(e, 400, p, "invalid_value", "Invalid value: '%.40s'. Supported values are: 'none', 'minimal', 'low', 'medium', and 'high'.", json_string_value(x));
            free(r->reasoning_effort);
            if (!(r->reasoning_effort = strdup(json_string_value(x)))) return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
            continue;
        }
        if (!strcmp(k, "summary") || !strcmp(k, "generate_summary")) {
            if (json_is_string(x) && !strcmp(json_string_value(x), "auto")) continue;
            return refuse(e, p, "summaries other than 'auto' (the reasoning is returned as the model wrote it, not summarised)");
        }
        return unknown(e, p);
    }
    return 0;
}

static int get_number(const json_t *v, const char *name, double lo, double hi, double *out, df_oai_error *e) {
    if (!json_is_number(v)) return bad_type(e, name, "a number", v);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return df_oai_fail(e, 400, name, "invalid_value", "Invalid '%s': expected a number from %g to %g, but got %g.", name,
                           lo, hi, x);
    *out = x;
    return 0;
}

/* `text`: {format: {type: "text" | "json_object" | "json_schema", name?,
 * schema?, strict?, description?}}: the chat route's response_format (the
 * Responses API puts the json_schema fields beside type), enforced the same
 * way by constrained decoding. */
static int parse_text(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (!json_is_object(v)) return bad_type(e, "text", "an object", v);
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (json_is_null(x)) continue;
        if (!strcmp(k, "format")) {
            if (!json_is_object(x)) return bad_type(e, "text.format", "an object", x);
            json_t *t = json_object_get(x, "type");
            if (!json_is_string(t)) return missing(e, "text.format.type");
            const char *ty = json_string_value(t);
            json_t *rf = json_object(), *js = json_object();
            json_object_set(rf, "type", t);
            const char *k2;
            json_t *x2;
            int rc = 0;
            json_object_foreach(x, k2, x2) {
                if (!strcmp(k2, "type")) continue;
                if (!strcmp(ty, "json_schema") &&
                    (!strcmp(k2, "name") || !strcmp(k2, "schema") || !strcmp(k2, "strict") || !strcmp(k2, "description"))) {
                    json_object_set(js, k2, x2);
                    continue;
                }
                char p[64];
                df_oai_pathf(p, sizeof p, "text.format.%.40s", k2);
                rc = unknown(e, p);
                break;
            }
            if (!rc && !strcmp(ty, "json_schema")) json_object_set(rf, "json_schema", js);
            if (!rc && (rc = df_oai_parse_response_format(rf, r, e))) {
                /* the chat checks name response_format.json_schema.x: here it is text.format.x */
                char p[sizeof e->param];
                const char *tail = !strncmp(e->param, "response_format.json_schema", 27) ? e->param + 27
                                 : !strncmp(e->param, "response_format", 15) ? e->param + 15 : NULL;
                if (tail) {
                    snprintf(p, sizeof p, "text.format%s", tail);
                    snprintf(e->param, sizeof e->param, "%s", p);
                }
                char *at = strstr(e->message, "response_format.json_schema");
                size_t cut = 27;
                if (!at && (at = strstr(e->message, "response_format"))) cut = 15;
                if (at) { /* the same renaming in the message, in place (it only gets shorter) */
                    memmove(at + 11, at + cut, strlen(at + cut) + 1);
                    memcpy(at, "text.format", 11);
                }
            }
            json_decref(js);
            json_decref(rf);
            if (rc) return rc;
            continue;
        }
        if (!strcmp(k, "verbosity")) return refuse(e, "text.verbosity", "verbosity (it would change the prompt)");
        char p[64];
        df_oai_pathf(p, sizeof p, "text.%.40s", k);
        return unknown(e, p);
    }
    return 0;
}

/* One top-level field. */
static int parse_field(const df_oai_limits *lim, const char *k, const json_t *v, df_oai_request *r, json_t *sys,
                       json_t *turns, df_oai_error *e) {
    if (json_is_null(v)) return 0; /* not given; required ones are checked after */
    if (!strcmp(k, "model")) {
        if (!json_is_string(v)) return bad_type(e, k, "a string", v);
        if (strcmp(json_string_value(v), lim->model_id))
            return df_oai_fail(e, 404, k, "model_not_found",
                               "The model `%.200s` does not exist or you do not have access to it; this server serves '%.200s'.",
                               json_string_value(v), lim->model_id);
        return 0;
    }
    if (!strcmp(k, "input")) return parse_input(v, turns, e);
    if (!strcmp(k, "instructions")) {
        if (!json_is_string(v)) return bad_type(e, k, "a string", v);
        if (!json_string_length(v)) return 0; /* empty instructions are none */
        return add_turn(sys, "system", json_string_value(v), json_string_length(v), k, e);
    }
    if (!strcmp(k, "max_output_tokens")) {
        if (!json_is_integer(v)) return bad_type(e, k, "an integer", v);
        json_int_t x = json_integer_value(v);
        if (x < 1)
            return df_oai_fail(e, 400, k, "integer_below_min_value",
                               "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 1, but got %lld instead.",
                               (long long)x);
        if (x > lim->max_tokens)
            return df_oai_fail(e, 400, k, "integer_above_max_value",
                               "Invalid 'max_output_tokens': %lld is more than this server allows per request (%ld, --max-tokens).",
                               (long long)x, lim->max_tokens);
        r->max_tokens = (long)x;
        return 0;
    }
    if (!strcmp(k, "temperature")) {
        if (get_number(v, k, 0, 2, &r->temperature, e)) return -1;
        r->has_temperature = 1;
        return 0;
    }
    if (!strcmp(k, "top_p")) return get_number(v, k, 0, 1, &r->top_p, e);
    if (!strcmp(k, "stream")) {
        if (!json_is_boolean(v)) return bad_type(e, k, "a boolean", v);
        r->stream = json_is_true(v);
        return 0;
    }
    if (!strcmp(k, "stream_options")) {
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        const char *k2;
        json_t *v2;
        json_object_foreach((json_t *)v, k2, v2) {
            char p[64];
            df_oai_pathf(p, sizeof p, "stream_options.%.40s", k2);
            if (strcmp(k2, "include_obfuscation")) return unknown(e, p);
            if (!json_is_null(v2) && !json_is_boolean(v2)) return bad_type(e, p, "a boolean", v2);
        }
        return 0;
    }
    if (!strcmp(k, "store")) {
        if (!json_is_boolean(v)) return bad_type(e, k, "a boolean", v);
        return json_is_true(v) ? refuse(e, k, "true: this server stores no responses; send store: false and the whole conversation") : 0;
    }
    if (!strcmp(k, "tools")) return parse_tools(v, r, e);
    if (!strcmp(k, "tool_choice")) return parse_tool_choice(v, r, e);
    if (!strcmp(k, "parallel_tool_calls")) {
        if (!json_is_boolean(v)) return bad_type(e, k, "a boolean", v);
        r->parallel_tool_calls = json_is_true(v);
        return 0;
    }
    if (!strcmp(k, "text")) return parse_text(v, r, e);
    if (!strcmp(k, "truncation")) {
        if (!json_is_string(v)) return bad_type(e, k, "a string", v);
        if (!strcmp(json_string_value(v), "disabled")) return 0;
        return refuse(e, k, "'auto' (the server never drops parts of a conversation; a prompt too long is refused)");
    }
    if (!strcmp(k, "include")) {
        if (!json_is_array(v)) return bad_type(e, k, "an array", v);
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            char p[40];
            df_oai_pathf(p, sizeof p, "include[%zu]", i);
            if (!json_is_string(x)) return bad_type(e, p, "a string", x);
            /* reasoning is never encrypted here: asking for its encrypted form asks for nothing */
            if (!strcmp(json_string_value(x), "reasoning.encrypted_content")) continue;
            return refuse(e, p, "this inclusion");
        }
        return 0;
    }
    if (!strcmp(k, "reasoning")) return parse_reasoning(v, r, e);
    if (!strcmp(k, "metadata")) { /* echoed back; it cannot change the output */
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        if (json_object_size(v) > 16) return df_oai_fail(e, 400, k, "invalid_value", "Invalid 'metadata': at most 16 keys.");
        const char *k2;
        json_t *v2;
        json_object_foreach((json_t *)v, k2, v2) {
            char p[96];
            df_oai_pathf(p, sizeof p, "metadata.%.40s", k2);
            if (!json_is_string(v2)) return bad_type(e, p, "a string", v2);
        }
        return 0;
    }
    /* hints that cannot change the output: prefix reuse is automatic, there is one tier of service */
    if (!strcmp(k, "prompt_cache_key") || !strcmp(k, "user") || !strcmp(k, "safety_identifier") ||
        !strcmp(k, "service_tier")) {
        if (!json_is_string(v)) return bad_type(e, k, "a string", v);
        return 0;
    }
    if (!strcmp(k, "background")) {
        if (!json_is_boolean(v)) return bad_type(e, k, "a boolean", v);
        return json_is_true(v) ? refuse(e, k, "background responses (nothing is stored to poll)") : 0;
    }
    if (!strcmp(k, "previous_response_id")) return refuse(e, k, "previous_response_id (nothing is stored; send the whole conversation)");
    if (!strcmp(k, "conversation")) return refuse(e, k, "conversations (nothing is stored; send the whole conversation)");
    if (!strcmp(k, "prompt")) return refuse(e, k, "stored prompt templates");
    if (!strcmp(k, "max_tool_calls")) return refuse(e, k, "max_tool_calls (use parallel_tool_calls: false for one call)");
    if (!strcmp(k, "top_logprobs")) {
        if (json_is_integer(v) && json_integer_value(v) == 0) return 0;
        return refuse(e, k, "log-probabilities on this route (the chat completions route has them)");
    }
    return unknown(e, k);
}

int df_resp_parse(const df_oai_limits *lim, const char *body, size_t len, df_oai_request *out, json_t **echo,
                  df_oai_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    if (echo) *echo = NULL;
    out->kind = DF_OAI_CHAT;
    out->max_tokens = -1;
    out->top_p = 1;
    out->parallel_tool_calls = 1;
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root)
        return df_oai_fail(e, 400, NULL, NULL, "We could not parse the JSON body of your request: %s (line %d, column %d).",
                           je.text, je.line, je.column);
    json_t *sys = json_array(), *turns = json_array();
    int rc = 0;
    if (!json_is_object(root)) rc = df_oai_fail(e, 400, NULL, NULL, "The request body must be a JSON object, not %s.", df_oai_jtype(root));
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach(root, k, v) {
        if ((rc = parse_field(lim, k, v, out, sys, turns, e))) break;
    }
    if (!rc) {
        if (!json_is_string(json_object_get(root, "model"))) rc = missing(e, "model");
        else if (!json_array_size(turns)) rc = missing(e, "input");
        else rc = df_oai_check_tool_choice(out, e);
    }
    if (!rc) {
        json_array_extend(sys, turns);
        if (!(out->messages_json = json_dumps(sys, JSON_COMPACT))) rc = df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    }
    if (!rc && echo) {
        /* what the response object repeats of the request */
        json_t *o = json_object();
        static const char *const keys[] = {"instructions", "metadata", "temperature", "top_p", "max_output_tokens",
                                           "parallel_tool_calls", "prompt_cache_key", "user", "safety_identifier",
                                           "tools", "tool_choice", "reasoning", "text", "truncation"};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            json_t *x = json_object_get(root, keys[i]);
            if (x && !json_is_null(x)) json_object_set(o, keys[i], x);
        }
        *echo = o;
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

/* Output item ids: a prefix and the response id's tail ("msg_", "rs_";
 * function calls "fc_" with the call's index appended). */
static void item_id(const gen *g, const char *prefix, long idx, char *out, size_t n) {
    const char *tail = strchr(g->id, '_');
    tail = tail ? tail + 1 : g->id;
    if (idx >= 0) snprintf(out, n, "%s%s_%ld", prefix, tail, idx);
    else snprintf(out, n, "%s%s", prefix, tail);
}

static json_t *usage(const gen *g, size_t reasoning_tokens) {
    json_t *u = json_object(), *in = json_object(), *outd = json_object();
    json_object_set_new(u, "input_tokens", json_integer((json_int_t)g->n_prompt));
    json_object_set_new(in, "cached_tokens", json_integer((json_int_t)g->cached));
    json_object_set_new(u, "input_tokens_details", in);
    json_object_set_new(u, "output_tokens", json_integer(g->n_gen));
    json_object_set_new(outd, "reasoning_tokens", json_integer((json_int_t)reasoning_tokens));
    json_object_set_new(u, "output_tokens_details", outd);
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)g->n_prompt + g->n_gen));
    return u;
}

/* A text part: output_text (message) or reasoning_text (reasoning). */
static json_t *text_part(const char *type, const char *t, size_t n) {
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string(type));
    json_object_set_new(p, "text", jstr(t ? t : "", n));
    if (!strcmp(type, "output_text")) {
        json_object_set_new(p, "annotations", json_array());
        json_object_set_new(p, "logprobs", json_array());
    }
    return p;
}

/* An item closed while the generation goes on (a think block ended) is
 * complete; one closed at the end is incomplete when max_output_tokens cut it. */
static const char *item_status(const gen *g, int done) {
    return !done ? "in_progress" : g->finish && !strcmp(g->finish, "length") ? "incomplete" : "completed";
}

/* The assistant message item; done: with its text t. */
static json_t *message_item(const gen *g, int done, const char *t, size_t n) {
    char id[96];
    item_id(g, "msg_", -1, id, sizeof id);
    json_t *m = json_object(), *c = json_array();
    json_object_set_new(m, "id", json_string(id));
    json_object_set_new(m, "type", json_string("message"));
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "status", json_string(item_status(g, done)));
    if (done) json_array_append_new(c, text_part("output_text", t, n));
    json_object_set_new(m, "content", c);
    return m;
}

/* The reasoning item: the model's own reasoning text (think block), in
 * content as reasoning_text; no summary is made. */
static json_t *reasoning_item_out(const gen *g, int done, const char *t, size_t n) {
    char id[96];
    item_id(g, "rs_", -1, id, sizeof id);
    json_t *m = json_object(), *c = json_array();
    json_object_set_new(m, "id", json_string(id));
    json_object_set_new(m, "type", json_string("reasoning"));
    json_object_set_new(m, "summary", json_array());
    if (done) json_array_append_new(c, text_part("reasoning_text", t, n));
    json_object_set_new(m, "content", c);
    json_object_set_new(m, "status", json_string(item_status(g, done)));
    return m;
}

static json_t *call_item(const gen *g, const df_tc_call *c, size_t i, int done) {
    char id[96];
    item_id(g, "fc_", (long)i, id, sizeof id);
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(id));
    json_object_set_new(m, "type", json_string("function_call"));
    json_object_set_new(m, "call_id", json_string(c->id));
    json_object_set_new(m, "name", jstr(c->name, strlen(c->name)));
    json_object_set_new(m, "arguments", done ? jstr(c->args, strlen(c->args)) : json_string(""));
    json_object_set_new(m, "status", json_string(done ? "completed" : "in_progress"));
    return m;
}

/* The output items of a finished answer, in the order the model wrote them:
 * reasoning, text, function calls. A message item is there when there is
 * text, or nothing else. */
static json_t *output_items(gen *g) {
    json_t *out = json_array();
    df_tc *tc = gen_tc(g);
    if (!tc) return out;
    size_t cl, rl, nc = df_tc_n_calls(tc);
    const char *c = df_tc_content(tc, &cl), *r = df_tc_reasoning(tc, &rl);
    if (rl) json_array_append_new(out, reasoning_item_out(g, 1, r, rl));
    if (cl || !nc) json_array_append_new(out, message_item(g, 1, c, cl));
    for (size_t i = 0; i < nc; i++) json_array_append_new(out, call_item(g, df_tc_call_at(tc, i), i, 1));
    return out;
}

/* The response object; done: finished, with output and usage. */
static json_t *response(gen *g, int done) {
    const json_t *echo = g->ext;
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer(g->created));
    int incomplete = done && !strcmp(g->finish, "length");
    json_object_set_new(o, "status", json_string(!done ? "in_progress" : incomplete ? "incomplete" : "completed"));
    json_object_set_new(o, "error", json_null());
    if (incomplete) {
        json_t *d = json_object();
        json_object_set_new(d, "reason", json_string("max_output_tokens"));
        json_object_set_new(o, "incomplete_details", d);
    } else {
        json_object_set_new(o, "incomplete_details", json_null());
    }
    json_object_set_new(o, "model", json_string(g->srv->model_id));
    json_object_set_new(o, "output", done ? output_items(g) : json_array());
    json_object_set_new(o, "tools", json_array());
    json_object_set_new(o, "tool_choice", json_string("auto"));
    json_object_set_new(o, "parallel_tool_calls", json_true());
    json_object_set_new(o, "store", json_false());
    json_object_set_new(o, "truncation", json_string("disabled"));
    json_object_set_new(o, "previous_response_id", json_null());
    json_object_set_new(o, "reasoning", json_null());
    json_t *tf = json_object(), *fmt = json_object();
    json_object_set_new(fmt, "type", json_string("text"));
    json_object_set_new(tf, "format", fmt);
    json_object_set_new(o, "text", tf);
    json_object_set_new(o, "instructions", json_null());
    json_object_set_new(o, "metadata", json_object());
    json_object_set_new(o, "temperature", json_real(g->rq.has_temperature ? g->rq.temperature : 1.0));
    json_object_set_new(o, "top_p", json_real(g->rq.top_p));
    json_object_set_new(o, "max_output_tokens", json_null());
    if (echo) json_object_update((json_t *)o, (json_t *)echo); /* what the request gave, as given */
    /* reasoning_tokens: 0: the generation step does not count the reasoning's tokens apart from the text's */
    json_object_set_new(o, "usage", done ? usage(g, 0) : json_null());
    return o;
}

static char *resp_body(const gen *cg) {
    gen *g = (gen *)cg; /* the output parser is fed here */
    json_t *o = response(g, 1);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* "event: <type>\ndata: <json with type and sequence_number>\n\n"; consumes o. */
static void event(gen *g, const char *type, json_t *o) {
    if (!o) { g->out.oom = 1; return; }
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(g->seq++));
    gen_sse_event(g, type, o);
}

/* {item_id, output_index[, content_index]} of the open item. */
static json_t *at_item(const gen *g, int with_part) {
    char id[96];
    item_id(g, g->ropen == 1 ? "rs_" : "msg_", -1, id, sizeof id);
    json_t *o = json_object();
    json_object_set_new(o, "item_id", json_string(id));
    json_object_set_new(o, "output_index", json_integer(g->rnext - 1));
    if (with_part) json_object_set_new(o, "content_index", json_integer(0));
    return o;
}

static void item_event(gen *g, const char *type, int index, json_t *item) {
    json_t *o = json_object();
    json_object_set_new(o, "output_index", json_integer(index));
    json_object_set_new(o, "item", item);
    event(g, type, o);
}

/* Opens a reasoning (1) or message (2) item at the next output index. */
static void open_item(gen *g, int kind) {
    g->ropen = kind;
    int idx = g->rnext++;
    item_event(g, "response.output_item.added", idx, kind == 1 ? reasoning_item_out(g, 0, NULL, 0) : message_item(g, 0, NULL, 0));
    json_t *o = at_item(g, 1);
    json_object_set_new(o, "part", text_part(kind == 1 ? "reasoning_text" : "output_text", "", 0));
    event(g, "response.content_part.added", o);
}

/* Closes the open item, whose whole text is t. */
static void close_item(gen *g, const char *t, size_t n) {
    int kind = g->ropen;
    if (!kind) return;
    json_t *o = at_item(g, 1);
    json_object_set_new(o, "text", jstr(t ? t : "", n));
    if (kind == 2) json_object_set_new(o, "logprobs", json_array());
    event(g, kind == 1 ? "response.reasoning_text.done" : "response.output_text.done", o);
    o = at_item(g, 1);
    json_object_set_new(o, "part", text_part(kind == 1 ? "reasoning_text" : "output_text", t, n));
    event(g, "response.content_part.done", o);
    item_event(g, "response.output_item.done", g->rnext - 1,
               kind == 1 ? reasoning_item_out(g, 1, t, n) : message_item(g, 1, t, n));
    g->ropen = 0;
}

static void sse_head(gen *g) {
    json_t *o = json_object();
    json_object_set_new(o, "response", response(g, 0));
    event(g, "response.created", o);
    o = json_object();
    json_object_set_new(o, "response", response(g, 0));
    event(g, "response.in_progress", o);
}

/* What the output parser has decided since the last event: reasoning text,
 * then message text (closing the reasoning item), then whole function calls
 * (closing the message item), each as its items' events. */
static void sse_more(gen *g) {
    df_tc *tc = gen_tc(g);
    if (!tc) { g->out.oom = 1; return; }
    size_t cl, rl;
    const char *c = df_tc_content(tc, &cl), *r = df_tc_reasoning(tc, &rl);
    if (rl > g->sent_r) {
        if (g->ropen != 1) open_item(g, 1);
        json_t *o = at_item(g, 1);
        json_object_set_new(o, "delta", jstr(r + g->sent_r, rl - g->sent_r));
        event(g, "response.reasoning_text.delta", o);
        g->sent_r = rl;
    }
    if (cl > g->sent) {
        if (g->ropen == 1) close_item(g, r, rl);
        if (g->ropen != 2) open_item(g, 2);
        json_t *o = at_item(g, 1);
        json_object_set_new(o, "delta", jstr(c + g->sent, cl - g->sent));
        json_object_set_new(o, "logprobs", json_array());
        event(g, "response.output_text.delta", o);
        g->sent = cl;
    }
    for (; g->calls_sent < df_tc_n_calls(tc); g->calls_sent++) {
        if (g->ropen) close_item(g, g->ropen == 1 ? r : c, g->ropen == 1 ? rl : cl);
        const df_tc_call *k = df_tc_call_at(tc, g->calls_sent);
        int idx = g->rnext++;
        char id[96];
        item_id(g, "fc_", (long)g->calls_sent, id, sizeof id);
        item_event(g, "response.output_item.added", idx, call_item(g, k, g->calls_sent, 0));
        json_t *o = json_object();
        json_object_set_new(o, "item_id", json_string(id));
        json_object_set_new(o, "output_index", json_integer(idx));
        json_object_set_new(o, "delta", jstr(k->args, strlen(k->args)));
        event(g, "response.function_call_arguments.delta", o);
        o = json_object();
        json_object_set_new(o, "item_id", json_string(id));
        json_object_set_new(o, "output_index", json_integer(idx));
        json_object_set_new(o, "name", jstr(k->name, strlen(k->name)));
        json_object_set_new(o, "arguments", jstr(k->args, strlen(k->args)));
        event(g, "response.function_call_arguments.done", o);
        item_event(g, "response.output_item.done", idx, call_item(g, k, g->calls_sent, 1));
    }
}

static void sse_tail(gen *g) {
    sse_more(g);
    df_tc *tc = gen_tc(g);
    if (!tc) { g->out.oom = 1; return; }
    size_t cl, rl;
    const char *c = df_tc_content(tc, &cl), *r = df_tc_reasoning(tc, &rl);
    if (g->ropen == 1) close_item(g, r, rl);
    if (!g->ropen && !cl && !df_tc_n_calls(tc)) open_item(g, 2); /* an empty answer is an empty message, as in the body */
    if (g->ropen == 2) close_item(g, c, cl);
    json_t *o = json_object();
    json_object_set_new(o, "response", response(g, 1));
    event(g, !strcmp(g->finish, "length") ? "response.incomplete" : "response.completed", o);
}

/* An error after the stream began: an "error" event, then response.failed. */
static void sse_error(gen *g) {
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string("server_error"));
    json_object_set_new(o, "message", json_string(g->errmsg));
    json_object_set_new(o, "param", json_null());
    event(g, "error", o);
    o = response(g, 0);
    json_object_set_new(o, "status", json_string("failed"));
    json_t *err = json_object();
    json_object_set_new(err, "code", json_string("server_error"));
    json_object_set_new(err, "message", json_string(g->errmsg));
    json_object_set_new(o, "error", err);
    json_t *ev = json_object();
    json_object_set_new(ev, "response", o);
    event(g, "response.failed", ev);
}

/* Errors of the shared path name the chat field: here reasoning_effort is reasoning.effort. */
static void resp_error(df_http_req *r, const df_oai_error *e) {
    if (strcmp(e->param, "reasoning_effort")) { df_oai_respond_error(r, e); return; }
    df_oai_error x = *e;
    snprintf(x.param, sizeof x.param, "reasoning.effort");
    df_oai_respond_error(r, &x);
}

static const df_proto resp = {"resp_", resp_error, df_oai_busy, resp_body, sse_head, sse_more, sse_tail, sse_error};

void df_resp_create(df_oai_server *s, df_http_req *r) {
    size_t len;
    const char *body = df_http_body(r, &len);
    df_oai_limits lim = {s->model_id, s->info.vocab_size, s->cap};
    df_oai_error e;
    gen *g = gen_new(s, r, &resp);
    if (!g) { df_http_respond_error(r, 503, "server_error", NULL, NULL, "Out of memory."); return; }
    json_t *echo = NULL;
    if (df_resp_parse(&lim, body, len, &g->rq, &echo, &e)) { resp_error(r, &e); gen_free(g); return; }
    g->ext = echo;
    df_oai_run(g, body, len, 'R');
}
