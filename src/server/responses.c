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
    return df_oai_fail(e, 400, field, "invalid_type", "Invalid type for '%s': expected %s, but got %s instead.", field,
                       want, jtype(v));
}

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

/* One input item. Message items have type "message" or no type. */
static int parse_item(const json_t *it, size_t i, json_t *turns, df_oai_error *e) {
    char p[48], q[96];
    df_oai_pathf(p, sizeof p, "input[%zu]", i);
    if (!json_is_object(it)) return bad_type(e, p, "an object", it);
    json_t *type = json_object_get(it, "type");
    df_oai_pathf(q, sizeof q, "%s.type", p);
    if (type && !json_is_null(type) && !json_is_string(type)) return bad_type(e, q, "a string", type);
    const char *t = type && json_is_string(type) ? json_string_value(type) : "message";
    if (strcmp(t, "message")) {
        if (!strcmp(t, "function_call") || !strcmp(t, "function_call_output"))
            return refuse(e, q, "function calls (tool use is not available on this route yet)");
        if (!strcmp(t, "reasoning")) return refuse(e, q, "reasoning items");
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
    int rc = add_turn(turns, !strcmp(r, "developer") ? "system" : r, text.p, text.len, q, e);
    free(text.p);
    return rc;
}

static int parse_input(const json_t *v, json_t *turns, df_oai_error *e) {
    if (json_is_string(v)) return add_turn(turns, "user", json_string_value(v), json_string_length(v), "input", e);
    if (!json_is_array(v)) return bad_type(e, "input", "a string or an array of input items", v);
    if (!json_array_size(v)) return df_oai_fail(e, 400, "input", "empty_array", "Invalid 'input': empty array.");
    size_t i;
    json_t *it;
    json_array_foreach(v, i, it) if (parse_item(it, i, turns, e)) return -1;
    json_t *last = json_array_get(turns, json_array_size(turns) - 1);
    if (!strcmp(json_string_value(json_object_get(last, "role")), "assistant"))
        return refuse(e, "input", "a last item from the assistant (continuing the assistant's text)");
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

/* `text`: {format: {type: "text"}, verbosity: null}: plain text only. */
static int parse_text(const json_t *v, df_oai_error *e) {
    if (!json_is_object(v)) return bad_type(e, "text", "an object", v);
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (json_is_null(x)) continue;
        if (!strcmp(k, "format")) {
            if (!json_is_object(x)) return bad_type(e, "text.format", "an object", x);
            json_t *t = json_object_get(x, "type");
            if (!json_is_string(t)) return missing(e, "text.format.type");
            if (strcmp(json_string_value(t), "text"))
                return refuse(e, "text.format.type", "only 'text' (structured outputs are not available on this route yet)");
            if (json_object_size(x) != 1) return unknown(e, "text.format");
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
    if (!strcmp(k, "tools")) {
        if (!json_is_array(v)) return bad_type(e, k, "an array", v);
        return json_array_size(v) ? refuse(e, k, "tools (tool use is not available on this route yet)") : 0;
    }
    if (!strcmp(k, "tool_choice")) {
        if (json_is_string(v) && (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"))) return 0;
        return refuse(e, k, "tool_choice other than 'none' or 'auto' (tool use is not available on this route yet)");
    }
    if (!strcmp(k, "parallel_tool_calls")) {
        if (!json_is_boolean(v)) return bad_type(e, k, "a boolean", v);
        return 0; /* without tools it changes nothing */
    }
    if (!strcmp(k, "text")) return parse_text(v, e);
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
    if (!strcmp(k, "reasoning")) {
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        const char *k2;
        json_t *v2;
        json_object_foreach((json_t *)v, k2, v2) {
            char p[64];
            df_oai_pathf(p, sizeof p, "reasoning.%.40s", k2);
            if (json_is_null(v2)) continue;
            if (!strcmp(k2, "effort") || !strcmp(k2, "summary") || !strcmp(k2, "generate_summary"))
                return refuse(e, p, "reasoning options on this route");
            return unknown(e, p);
        }
        return 0;
    }
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
    if (!strcmp(k, "max_tool_calls")) return refuse(e, k, "max_tool_calls (tool use is not available on this route yet)");
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
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root)
        return df_oai_fail(e, 400, NULL, NULL, "We could not parse the JSON body of your request: %s (line %d, column %d).",
                           je.text, je.line, je.column);
    json_t *sys = json_array(), *turns = json_array();
    int rc = 0;
    if (!json_is_object(root)) rc = df_oai_fail(e, 400, NULL, NULL, "The request body must be a JSON object, not %s.", jtype(root));
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach(root, k, v) {
        if ((rc = parse_field(lim, k, v, out, sys, turns, e))) break;
    }
    if (!rc) {
        if (!json_is_string(json_object_get(root, "model"))) rc = missing(e, "model");
        else if (!json_array_size(turns)) rc = missing(e, "input");
    }
    if (!rc) {
        json_array_extend(sys, turns);
        if (!(out->messages_json = json_dumps(sys, JSON_COMPACT))) rc = df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    }
    if (!rc && echo) {
        /* what the response object repeats of the request */
        json_t *o = json_object();
        static const char *const keys[] = {"instructions", "metadata", "temperature", "top_p", "max_output_tokens",
                                           "parallel_tool_calls", "prompt_cache_key", "user", "safety_identifier"};
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

/* The message item's id: "msg_" and the response id's tail. */
static void item_id(const gen *g, char *out, size_t n) {
    const char *tail = strchr(g->id, '_');
    snprintf(out, n, "msg_%s", tail ? tail + 1 : g->id);
}

static json_t *usage(const gen *g) {
    json_t *u = json_object(), *in = json_object(), *outd = json_object();
    json_object_set_new(u, "input_tokens", json_integer((json_int_t)g->n_prompt));
    json_object_set_new(in, "cached_tokens", json_integer((json_int_t)g->cached));
    json_object_set_new(u, "input_tokens_details", in);
    json_object_set_new(u, "output_tokens", json_integer(g->n_gen));
    json_object_set_new(outd, "reasoning_tokens", json_integer(0));
    json_object_set_new(u, "output_tokens_details", outd);
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)g->n_prompt + g->n_gen));
    return u;
}

static json_t *output_text(const gen *g, int done) {
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string("output_text"));
    json_object_set_new(p, "text", done ? jstr(g->text.p ? g->text.p : "", g->text.len) : json_string(""));
    json_object_set_new(p, "annotations", json_array());
    json_object_set_new(p, "logprobs", json_array());
    return p;
}

/* The assistant message item; done: with its text. */
static json_t *message_item(const gen *g, int done) {
    char id[64];
    item_id(g, id, sizeof id);
    json_t *m = json_object(), *c = json_array();
    json_object_set_new(m, "id", json_string(id));
    json_object_set_new(m, "type", json_string("message"));
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "status", json_string(!done ? "in_progress" : !strcmp(g->finish, "length") ? "incomplete" : "completed"));
    if (done) json_array_append_new(c, output_text(g, 1));
    json_object_set_new(m, "content", c);
    return m;
}

/* The response object; done: finished, with output and usage. */
static json_t *response(const gen *g, int done) {
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
    json_t *out = json_array();
    if (done) json_array_append_new(out, message_item(g, 1));
    json_object_set_new(o, "output", out);
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
    json_object_set_new(o, "usage", done ? usage(g) : json_null());
    return o;
}

static char *resp_body(const gen *g) {
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
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) { g->out.oom = 1; return; }
    sb_put(&g->out, "event: ", 7);
    sb_put(&g->out, type, strlen(type));
    sb_put(&g->out, "\ndata: ", 7);
    sb_put(&g->out, s, strlen(s));
    sb_put(&g->out, "\n\n", 2);
    free(s);
}

static json_t *at_part(const gen *g) {
    char id[64];
    item_id(g, id, sizeof id);
    json_t *o = json_object();
    json_object_set_new(o, "item_id", json_string(id));
    json_object_set_new(o, "output_index", json_integer(0));
    json_object_set_new(o, "content_index", json_integer(0));
    return o;
}

static void sse_head(gen *g) {
    json_t *o = json_object();
    json_object_set_new(o, "response", response(g, 0));
    event(g, "response.created", o);
    o = json_object();
    json_object_set_new(o, "response", response(g, 0));
    event(g, "response.in_progress", o);
    o = json_object();
    json_object_set_new(o, "output_index", json_integer(0));
    json_object_set_new(o, "item", message_item(g, 0));
    event(g, "response.output_item.added", o);
    o = at_part(g);
    json_object_set_new(o, "part", output_text(g, 0));
    event(g, "response.content_part.added", o);
}

static void sse_more(gen *g) {
    if (g->text.len <= g->sent) return;
    json_t *o = at_part(g);
    json_object_set_new(o, "delta", jstr(g->text.p + g->sent, g->text.len - g->sent));
    json_object_set_new(o, "logprobs", json_array());
    event(g, "response.output_text.delta", o);
    g->sent = g->text.len;
}

static void sse_tail(gen *g) {
    sse_more(g);
    json_t *o = at_part(g);
    json_object_set_new(o, "text", jstr(g->text.p ? g->text.p : "", g->text.len));
    json_object_set_new(o, "logprobs", json_array());
    event(g, "response.output_text.done", o);
    o = at_part(g);
    json_object_set_new(o, "part", output_text(g, 1));
    event(g, "response.content_part.done", o);
    o = json_object();
    json_object_set_new(o, "output_index", json_integer(0));
    json_object_set_new(o, "item", message_item(g, 1));
    event(g, "response.output_item.done", o);
    o = json_object();
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

static const df_proto resp = {"resp_", df_oai_respond_error, df_oai_busy, resp_body, sse_head, sse_more, sse_tail, sse_error};

void df_resp_create(df_oai_server *s, df_http_req *r) {
    size_t len;
    const char *body = df_http_body(r, &len);
    df_oai_limits lim = {s->model_id, s->info.vocab_size, s->cap};
    df_oai_error e;
    gen *g = gen_new(s, r, &resp);
    if (!g) { df_http_respond_error(r, 503, "server_error", NULL, NULL, "Out of memory."); return; }
    json_t *echo = NULL;
    if (df_resp_parse(&lim, body, len, &g->rq, &echo, &e)) { df_oai_respond_error(r, &e); gen_free(g); return; }
    g->ext = echo;
    df_oai_run(g, body, len, 'R');
}
