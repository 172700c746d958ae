/* request.c - validation of OpenAI request bodies (declared in openai.h):
 * a pure function from JSON text to a validated df_oai_request or an
 * OpenAI-shaped error. No engine, no globals, no I/O, so the fuzz target
 * (tests/fuzz/fuzz_openai_request.c) links this file alone with jansson.
 *
 * Invariants: every path out of df_oai_parse either fills *out completely
 * (caller frees with df_oai_request_free) or leaves it empty and fills *err
 * with a 4xx status (503 only for out of memory); the param of an error
 * names the offending field in OpenAI's dotted/indexed form.
 */
#include "server/oai_int.h" /* the helpers request.c shares with the other routes (declared there) */
#include "grammar/grammar.h"
#include "util/util.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* =========================================================================
 * Validation
 *
 * The rules follow OpenAI's own checks: an unknown field is refused by name,
 * a wrong type says what was expected, null means "not given" for optional
 * fields, and anything the engine cannot execute exactly is refused with the
 * field in param instead of being ignored. Bookkeeping fields that cannot
 * change the output (user, metadata, store, ...) are type-checked and
 * accepted.
 * ========================================================================= */

int df_oai_fail(df_oai_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

const char *df_oai_jtype(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a decimal";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int df_oai_bad_type(df_oai_error *e, const char *param, const char *want, const json_t *v) {
    return df_oai_fail(e, 400, param, "invalid_type", "Invalid type for '%s': expected %s, but got %s instead.", param, want,
                df_oai_jtype(v));
}
#define bad_type df_oai_bad_type

static int unsupported(df_oai_error *e, const char *param, const char *why) {
    return df_oai_fail(e, 400, param, "unsupported_parameter",
                "Unsupported value for '%s': %s. Deltafin refuses what it cannot execute exactly instead of ignoring it.",
                param, why);
}

/* response_format (OpenAI's shape): text; json_object (any JSON object);
 * json_schema {name, schema, strict, description}. The schema is turned into
 * a grammar and compiled here, so that an unsupported keyword, a schema too
 * large or one that matches nothing is a 400 naming it before the request
 * waits for the engine (docs/SERVER.md, docs/GRAMMAR.md). */
static int parse_response_format(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (!json_is_object(v)) return bad_type(e, "response_format", "an object", v);
    json_t *t = json_object_get(v, "type");
    if (!json_is_string(t)) return df_oai_fail(e, 400, "response_format.type", "missing_required_parameter", "Missing required parameter: 'response_format.type'.");
    const char *type = json_string_value(t), *k;
    json_t *x;
    int is_schema = !strcmp(type, "json_schema");
    if (strcmp(type, "text") && strcmp(type, "json_object") && !is_schema)
        return df_oai_fail(e, 400, "response_format.type", "invalid_value",
                           "Invalid value for 'response_format.type': expected 'text', 'json_object' or 'json_schema', got '%.60s'.", type);
    json_object_foreach((json_t *)v, k, x)
        if (strcmp(k, "type") && !(is_schema && !strcmp(k, "json_schema")))
            return df_oai_fail(e, 400, "response_format", "unknown_parameter", "Unrecognized request argument supplied: response_format.%.60s", k);
    if (!strcmp(type, "text")) return 0;
    const char *schema = "{\"type\":\"object\"}";
    char *dumped = NULL;
    if (is_schema) {
        json_t *js = json_object_get(v, "json_schema");
        if (!js) return df_oai_fail(e, 400, "response_format.json_schema", "missing_required_parameter", "Missing required parameter: 'response_format.json_schema'.");
        if (!json_is_object(js)) return bad_type(e, "response_format.json_schema", "an object", js);
        json_t *name = json_object_get(js, "name");
        if (!name) return df_oai_fail(e, 400, "response_format.json_schema.name", "missing_required_parameter", "Missing required parameter: 'response_format.json_schema.name'.");
        if (!json_is_string(name)) return bad_type(e, "response_format.json_schema.name", "a string", name);
        const char *nm = json_string_value(name);
        size_t nl = strlen(nm);
        int okn = nl >= 1 && nl <= 64;
        for (size_t i = 0; okn && i < nl; i++)
            okn = (nm[i] >= 'a' && nm[i] <= 'z') || (nm[i] >= 'A' && nm[i] <= 'Z') || (nm[i] >= '0' && nm[i] <= '9') || nm[i] == '_' || nm[i] == '-';
        if (!okn) return df_oai_fail(e, 400, "response_format.json_schema.name", "invalid_value", "Invalid 'response_format.json_schema.name': expected 1 to 64 of a-z, A-Z, 0-9, _ and -.");
        json_object_foreach(js, k, x) {
            char p[96];
            df_oai_pathf(p, sizeof p, "response_format.json_schema.%.40s", k);
            if (!strcmp(k, "name")) continue;
            else if (!strcmp(k, "description")) { if (!json_is_string(x)) return bad_type(e, p, "a string", x); }
            else if (!strcmp(k, "strict")) { if (!json_is_boolean(x) && !json_is_null(x)) return bad_type(e, p, "a boolean", x); }
            else if (!strcmp(k, "schema")) { if (!json_is_object(x)) return bad_type(e, p, "an object", x); }
            else return df_oai_fail(e, 400, p, "unknown_parameter", "Unrecognized request argument supplied: %s", p);
        }
        json_t *sc = json_object_get(js, "schema");
        if (sc) {
            if (!(dumped = json_dumps(sc, JSON_COMPACT | JSON_PRESERVE_ORDER))) return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
            schema = dumped;
        } else schema = "{}";
    }
    char err[512];
    df_buf gb = {0};
    int rc = df_json_schema_to_grammar(schema, strlen(schema), "", &gb, err, sizeof err);
    free(dumped);
    if (!rc) {
        df_grammar_free(r->grammar);
        r->grammar = NULL;
        rc = df_grammar_compile_cached(gb.p, gb.len, "root", &r->grammar, err, sizeof err);
    }
    df_buf_free(&gb);
    if (rc == DF_ENOMEM) return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    if (rc) return df_oai_fail(e, 400, "response_format.json_schema.schema", rc == DF_EUNSUPPORTED ? "unsupported_parameter" : "invalid_value",
                               "Invalid 'response_format.json_schema.schema': %s", err);
    return 0;
}

/* snprintf for parameter paths ("messages[3].content[0].type"): a path
 * longer than the buffer is cut, which only shortens an error message. */
void df_oai_pathf(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

static int get_bool(const json_t *v, const char *name, int *out, df_oai_error *e) {
    if (!json_is_boolean(v)) return bad_type(e, name, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

static int get_number(const json_t *v, const char *name, double lo, double hi, double *out, df_oai_error *e) {
    if (!json_is_number(v)) return bad_type(e, name, "a decimal", v);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return df_oai_fail(e, 400, name, "invalid_value", "Invalid value for '%s': expected a number from %g to %g, but got %g.",
                    name, lo, hi, x);
    *out = x;
    return 0;
}

static int get_int(const json_t *v, const char *name, long long lo, long long hi, long long *out, df_oai_error *e) {
    if (!json_is_integer(v)) return bad_type(e, name, "an integer", v);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return df_oai_fail(e, 400, name, "invalid_value", "Invalid value for '%s': expected an integer from %lld to %lld, but got %lld.",
                    name, lo, hi, x);
    *out = x;
    return 0;
}

static int get_string(const json_t *v, const char *name, df_oai_error *e) {
    return json_is_string(v) ? 0 : bad_type(e, name, "a string", v);
}

/* stop: a string or an array of 1..4 non-empty strings. */
static int parse_stop(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (json_is_string(v)) {
        if (!json_string_length(v)) return df_oai_fail(e, 400, "stop", "invalid_value", "Invalid value for 'stop': an empty string.");
        r->stop[r->n_stop++] = strndup(json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!json_is_array(v)) return bad_type(e, "stop", "a string or an array of strings", v);
    if (json_array_size(v) > DF_OAI_MAX_STOP)
        return df_oai_fail(e, 400, "stop", "invalid_value", "Invalid value for 'stop': at most %d sequences, got %zu.", DF_OAI_MAX_STOP,
                    json_array_size(v));
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        char p[32];
        df_oai_pathf(p, sizeof p, "stop[%zu]", i);
        if (!json_is_string(s)) return bad_type(e, p, "a string", s);
        if (!json_string_length(s)) return df_oai_fail(e, 400, p, "invalid_value", "Invalid value for '%s': an empty string.", p);
        r->stop[r->n_stop++] = strndup(json_string_value(s), json_string_length(s));
    }
    return 0;
}

/* Content: a string, or an array of text parts joined with "\n". Non-text
 * parts (images, audio, files, refusals) are refused. *out is malloc'd. */
static int parse_content(const json_t *c, const char *where, char **out, df_oai_error *e) {
    if (json_is_string(c)) {
        *out = strndup(json_string_value(c), json_string_length(c));
        return *out ? 0 : df_oai_fail(e, 503, where, NULL, "Out of memory.");
    }
    if (!json_is_array(c)) return bad_type(e, where, "a string or an array of content parts", c);
    size_t total = 1, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        char p[96], q[112];
        df_oai_pathf(p, sizeof p, "%s[%zu]", where, i);
        if (!json_is_object(part)) return bad_type(e, p, "an object", part);
        json_t *type = json_object_get(part, "type");
        df_oai_pathf(q, sizeof q, "%s.type", p);
        if (!type) return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q);
        if (!json_is_string(type)) return bad_type(e, q, "a string", type);
        const char *t = json_string_value(type);
        if (!strcmp(t, "image_url") || !strcmp(t, "input_audio") || !strcmp(t, "file") || !strcmp(t, "refusal")) {
            char why[96];
            df_oai_pathf(why, sizeof why, "'%s' content parts are not supported (text-only models)", t);
            return unsupported(e, q, why);
        }
        if (strcmp(t, "text"))
            return df_oai_fail(e, 400, q, "invalid_value", "Invalid value for '%s': '%.40s' is not a content part type.", q, t);
        const char *k;
        json_t *v;
        json_object_foreach(part, k, v) {
            df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
            if (!strcmp(k, "type")) continue;
            if (!strcmp(k, "text")) { if (get_string(v, q, e)) return -1; continue; }
            return df_oai_fail(e, 400, q, "unknown_parameter", "Unrecognized request argument supplied: %s", q);
        }
        json_t *text = json_object_get(part, "text");
        df_oai_pathf(q, sizeof q, "%s.text", p);
        if (!text) return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q);
        total += json_string_length(text) + 1;
    }
    char *s = malloc(total), *w = s;
    if (!s) return df_oai_fail(e, 503, where, NULL, "Out of memory.");
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        if (i) *w++ = '\n';
        memcpy(w, json_string_value(text), json_string_length(text));
        w += json_string_length(text);
    }
    *w = 0;
    *out = s;
    return 0;
}

/* tool_calls of an assistant message (history only: the server never makes
 * tool calls itself): [{id, type: "function", function: {name, arguments}}]. */
static int check_tool_calls(const json_t *tc, const char *where, df_oai_error *e) {
    if (!json_is_array(tc)) return bad_type(e, where, "an array", tc);
    size_t i;
    json_t *c;
    json_array_foreach(tc, i, c) {
        char p[96], q[128];
        df_oai_pathf(p, sizeof p, "%s[%zu]", where, i);
        if (!json_is_object(c)) return bad_type(e, p, "an object", c);
        const char *k;
        json_t *v;
        json_object_foreach(c, k, v) {
            df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
            if (!strcmp(k, "id")) { if (get_string(v, q, e)) return -1; }
            else if (!strcmp(k, "type")) {
                if (get_string(v, q, e)) return -1;
                if (strcmp(json_string_value(v), "function")) return df_oai_fail(e, 400, q, "invalid_value", "Invalid value for '%s': expected 'function'.", q);
            } else if (!strcmp(k, "function")) {
                if (!json_is_object(v)) return bad_type(e, q, "an object", v);
                const char *k2;
                json_t *v2;
                json_object_foreach(v, k2, v2) {
                    char r[160];
                    df_oai_pathf(r, sizeof r, "%s.%.40s", q, k2);
                    if (!strcmp(k2, "name") || !strcmp(k2, "arguments")) { if (get_string(v2, r, e)) return -1; }
                    else return df_oai_fail(e, 400, r, "unknown_parameter", "Unrecognized request argument supplied: %s", r);
                }
                if (!json_object_get(v, "name")) {
                    df_oai_pathf(q, sizeof q, "%s.function.name", p);
                    return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q);
                }
            } else return df_oai_fail(e, 400, q, "unknown_parameter", "Unrecognized request argument supplied: %s", q);
        }
        if (!json_object_get(c, "function")) {
            df_oai_pathf(q, sizeof q, "%s.function", p);
            return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q);
        }
    }
    return 0;
}

/* messages: checks each message and builds the array the chat template gets:
 * {role, content (a string), name?, tool_calls?, tool_call_id?}, with the
 * developer role given as system (its OpenAI meaning). */
static int parse_messages(const json_t *msgs, char **out, df_oai_error *e) {
    if (!json_is_array(msgs)) return bad_type(e, "messages", "an array", msgs);
    if (!json_array_size(msgs)) return df_oai_fail(e, 400, "messages", "invalid_value", "Invalid 'messages': empty array. Expected an array with minimum length 1.");
    json_t *norm = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char p[48], q[96];
        df_oai_pathf(p, sizeof p, "messages[%zu]", i);
        if (!json_is_object(m)) { json_decref(norm); return bad_type(e, p, "an object", m); }
        json_t *role = json_object_get(m, "role");
        df_oai_pathf(q, sizeof q, "%s.role", p);
        if (!role) { json_decref(norm); return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q); }
        if (!json_is_string(role)) { json_decref(norm); return bad_type(e, q, "a string", role); }
        const char *r = json_string_value(role);
        int sys = !strcmp(r, "system") || !strcmp(r, "developer"), user = !strcmp(r, "user"),
            asst = !strcmp(r, "assistant"), tool = !strcmp(r, "tool");
        if (!strcmp(r, "function")) { json_decref(norm); return unsupported(e, q, "the deprecated 'function' role (function calling) is not supported"); }
        if (!sys && !user && !asst && !tool) {
            json_decref(norm);
            return df_oai_fail(e, 400, q, "invalid_value", "Invalid value for '%s': '%.40s'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'.", q, r);
        }
        json_t *o = json_object();
        json_array_append_new(norm, o);
        json_object_set_new(o, "role", json_string(sys ? "system" : r));
        const char *k;
        json_t *v;
        int has_content = 0, has_tc = 0;
        json_object_foreach(m, k, v) {
            df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
            if (!strcmp(k, "role")) continue;
            if (!strcmp(k, "content")) {
                if (json_is_null(v) && asst) { json_object_set_new(o, "content", json_null()); continue; } /* None for the template */
                char *c;
                if (parse_content(v, q, &c, e)) { json_decref(norm); return -1; }
                json_object_set_new(o, "content", json_string(c));
                if (!json_object_get(o, "content")) { free(c); json_decref(norm); return df_oai_fail(e, 400, q, "invalid_value", "Invalid value for '%s': not valid UTF-8.", q); }
                free(c);
                has_content = 1;
            } else if (!strcmp(k, "name")) {
                if (tool || get_string(v, q, e)) { json_decref(norm); return tool ? df_oai_fail(e, 400, q, "unknown_parameter", "Unrecognized request argument supplied: %s", q) : -1; }
                json_object_set(o, "name", v);
            } else if (asst && !strcmp(k, "reasoning_content")) {
                if (json_is_null(v)) continue;
                if (get_string(v, q, e)) { json_decref(norm); return -1; }
                json_object_set(o, "reasoning_content", v);
            } else if (asst && !strcmp(k, "tool_calls")) {
                if (json_is_null(v)) continue;
                if (check_tool_calls(v, q, e)) { json_decref(norm); return -1; }
                if (json_array_size(v)) { json_object_set_new(o, "tool_calls", json_deep_copy(v)); has_tc = 1; }
            } else if (asst && (!strcmp(k, "refusal") || !strcmp(k, "audio") || !strcmp(k, "function_call"))) {
                if (json_is_null(v)) continue;
                json_decref(norm);
                return unsupported(e, q, !strcmp(k, "refusal") ? "refusal messages in the history are not supported"
                                          : !strcmp(k, "audio") ? "audio is not supported (text-only models)"
                                                                : "the deprecated function_call is not supported (tool calling)");
            } else if (tool && !strcmp(k, "tool_call_id")) {
                if (get_string(v, q, e)) { json_decref(norm); return -1; }
                json_object_set(o, "tool_call_id", v);
            } else {
                json_decref(norm);
                return df_oai_fail(e, 400, q, "unknown_parameter", "Unrecognized request argument supplied: %s", q);
            }
        }
        if (!has_content && !(asst && has_tc)) {
            df_oai_pathf(q, sizeof q, "%s.content", p);
            json_decref(norm);
            return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q);
        }
        if (!has_content && !json_object_get(o, "content")) json_object_set_new(o, "content", json_null());
        if (tool && !json_object_get(o, "tool_call_id")) {
            df_oai_pathf(q, sizeof q, "%s.tool_call_id", p);
            json_decref(norm);
            return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q);
        }
    }
    *out = json_dumps(norm, JSON_COMPACT);
    json_decref(norm);
    return *out ? 0 : df_oai_fail(e, 503, "messages", NULL, "Out of memory.");
}

/* prompt (completions): a string, an array of token ids, or an array with one
 * string or one id array. More than one prompt would be a batch: refused. */
static int parse_prompt(const json_t *v, const df_oai_limits *lim, df_oai_request *r, df_oai_error *e) {
    if (json_is_array(v) && json_array_size(v) == 1 && (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
        v = json_array_get(v, 0);
    else if (json_is_array(v) && json_array_size(v) > 1 && !json_is_integer(json_array_get(v, 0)))
        return unsupported(e, "prompt", "several prompts in one request (a batch) are not supported; send one per request");
    if (json_is_string(v)) {
        r->prompt = strndup(json_string_value(v), json_string_length(v));
        r->prompt_len = json_string_length(v);
        return r->prompt ? 0 : df_oai_fail(e, 503, "prompt", NULL, "Out of memory.");
    }
    if (!json_is_array(v)) return bad_type(e, "prompt", "a string or an array of token ids", v);
    size_t n = json_array_size(v), i;
    if (!n) return df_oai_fail(e, 400, "prompt", "invalid_value", "Invalid value for 'prompt': an empty array.");
    r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return df_oai_fail(e, 503, "prompt", NULL, "Out of memory.");
    json_t *t;
    json_array_foreach(v, i, t) {
        char p[40];
        df_oai_pathf(p, sizeof p, "prompt[%zu]", i);
        long long id;
        if (get_int(t, p, 0, lim->vocab_size - 1, &id, e)) return -1;
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = n;
    return 0;
}

void df_oai_request_free(df_oai_request *r) {
    free(r->messages_json);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->tools_json);
    free(r->tool_choice_name);
    free(r->template_kwargs_json);
    free(r->reasoning_effort);
    df_grammar_free(r->grammar);
    memset(r, 0, sizeof *r);
}

int df_oai_deterministic(const df_oai_request *r) {
    return !r->has_temperature || r->temperature == 0 || r->top_p == 0 || r->has_seed;
}

/* tools: [{type: "function", function: {name, description?, parameters?,
 * strict?}}], names matching ^[a-zA-Z0-9_-]{1,64}$ and unique. Kept as
 * given (the template renders them). */
static int parse_tools(const json_t *v, df_oai_request *r, df_oai_error *e) {
    if (!json_is_array(v)) return bad_type(e, "tools", "an array", v);
    if (json_array_size(v) > 128)
        return df_oai_fail(e, 400, "tools", "invalid_value", "Invalid 'tools': array too long. Expected an array with maximum length 128, but got an array with length %zu instead.", json_array_size(v));
    size_t i;
    json_t *t;
    json_t *seen = json_object();
    json_array_foreach(v, i, t) {
        char p[48], q[96];
        df_oai_pathf(p, sizeof p, "tools[%zu]", i);
        if (!json_is_object(t)) { json_decref(seen); return bad_type(e, p, "an object", t); }
        json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        df_oai_pathf(q, sizeof q, "%s.type", p);
        if (!type) { json_decref(seen); return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q); }
        if (!json_is_string(type)) { json_decref(seen); return bad_type(e, q, "a string", type); }
        if (strcmp(json_string_value(type), "function")) {
            json_decref(seen);
            if (!strcmp(json_string_value(type), "custom")) return unsupported(e, q, "custom (free-form) tools are not supported; only 'function' tools");
            return df_oai_fail(e, 400, q, "invalid_value", "Invalid value: '%.40s'. Supported values are: 'function'.", json_string_value(type));
        }
        const char *k;
        json_t *x;
        json_object_foreach(t, k, x) {
            if (strcmp(k, "type") && strcmp(k, "function")) {
                df_oai_pathf(q, sizeof q, "%s.%.40s", p, k);
                json_decref(seen);
                return df_oai_fail(e, 400, q, "unknown_parameter", "Unrecognized request argument supplied: %s", q);
            }
        }
        df_oai_pathf(q, sizeof q, "%s.function", p);
        if (!fn) { json_decref(seen); return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q); }
        if (!json_is_object(fn)) { json_decref(seen); return bad_type(e, q, "an object", fn); }
        json_object_foreach(fn, k, x) {
            char f[128];
            df_oai_pathf(f, sizeof f, "%s.function.%.40s", p, k);
            int bad = 0;
            if (!strcmp(k, "name") || !strcmp(k, "description")) bad = get_string(x, f, e);
            else if (!strcmp(k, "parameters")) bad = json_is_object(x) ? 0 : bad_type(e, f, "an object", x);
            else if (!strcmp(k, "strict")) bad = json_is_null(x) ? 0 : get_bool(x, f, &(int){0}, e);
            else bad = df_oai_fail(e, 400, f, "unknown_parameter", "Unrecognized request argument supplied: %s", f);
            if (bad) { json_decref(seen); return -1; }
        }
        json_t *name = json_object_get(fn, "name");
        df_oai_pathf(q, sizeof q, "%s.function.name", p);
        if (!name) { json_decref(seen); return df_oai_fail(e, 400, q, "missing_required_parameter", "Missing required parameter: '%s'.", q); }
        const char *nm = json_string_value(name);
        size_t nl = json_string_length(name);
        int ok = nl >= 1 && nl <= 64;
        for (size_t j = 0; ok && j < nl; j++)
            ok = (nm[j] >= 'a' && nm[j] <= 'z') || (nm[j] >= 'A' && nm[j] <= 'Z') || (nm[j] >= '0' && nm[j] <= '9') || nm[j] == '_' || nm[j] == '-';
        if (!ok) { json_decref(seen); return df_oai_fail(e, 400, q, "invalid_value", "Invalid '%s': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.", q); }
        if (json_object_get(seen, nm)) { json_decref(seen); return df_oai_fail(e, 400, "tools", "invalid_value", "Invalid 'tools': two tools are named '%.64s'; tool names must be unique.", nm); }
        json_object_set_new(seen, nm, json_true());
    }
    json_decref(seen);
    free(r->tools_json);
    r->tools_json = NULL;
    if (!json_array_size(v)) return 0; /* [] is no tools */
    r->tools_json = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    return r->tools_json ? 0 : df_oai_fail(e, 503, "tools", NULL, "Out of memory.");
}

/* tool_choice: "none" | "auto" | "required" | {type: "function", function: {name}}. */
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
    json_t *type = json_object_get(v, "type"), *fn = json_object_get(v, "function");
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        char p[80];
        df_oai_pathf(p, sizeof p, "tool_choice.%.40s", k);
        if (strcmp(k, "type") && strcmp(k, "function")) return df_oai_fail(e, 400, p, "unknown_parameter", "Unrecognized request argument supplied: %s", p);
    }
    if (!json_is_string(type)) return df_oai_fail(e, 400, "tool_choice.type", "missing_required_parameter", "Missing required parameter: 'tool_choice.type'.");
    if (strcmp(json_string_value(type), "function"))
        return unsupported(e, "tool_choice.type", "only {\"type\": \"function\", \"function\": {\"name\": ...}} names a tool here");
    json_t *name = json_object_get(fn, "name");
    if (!json_is_object(fn) || !json_is_string(name) || json_object_size(fn) != 1)
        return df_oai_fail(e, 400, "tool_choice.function.name", "missing_required_parameter", "Missing required parameter: 'tool_choice.function.name'.");
    r->tool_choice = DF_OAI_TOOLS_NAMED;
    free(r->tool_choice_name);
    r->tool_choice_name = strndup(json_string_value(name), json_string_length(name));
    return r->tool_choice_name ? 0 : df_oai_fail(e, 503, "tool_choice", NULL, "Out of memory.");
}

/* The parameters schema of tool i of a tools array (chat shape), as JSON
 * text (malloc'd); a tool without one takes any object. */
char *df_oai_tool_schema(const char *tools_json, size_t i) {
    json_t *t = json_loads(tools_json, 0, NULL);
    json_t *p = json_object_get(json_object_get(json_array_get(t, i), "function"), "parameters");
    char *out = p ? json_dumps(p, JSON_COMPACT | JSON_PRESERVE_ORDER) : strdup("{\"type\":\"object\"}");
    json_decref(t);
    return out;
}

/* After every field: tool_choice against tools. required / a named function
 * are enforced by constrained decoding (the grammar of a call in the model's
 * own syntax is made once the model's family is known, gen.c); here the
 * schemas of the tools it may call are checked, so an unsupported keyword is
 * a 400 naming the tool, and the combination with response_format, two
 * constraints on one answer, is refused. */
static int check_tool_choice(df_oai_request *r, df_oai_error *e) {
    if (r->tool_choice != DF_OAI_TOOLS_REQUIRED && r->tool_choice != DF_OAI_TOOLS_NAMED) return 0;
    if (!r->tools_json)
        return df_oai_fail(e, 400, "tool_choice", "invalid_value", "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.");
    if (r->grammar)
        return unsupported(e, "response_format", "a response_format together with tool_choice 'required' or a named function (the answer is a tool call)");
    json_t *t = json_loads(r->tools_json, 0, NULL), *x;
    size_t i;
    int found = 0, rc = 0;
    json_array_foreach(t, i, x) {
        const char *nm = json_string_value(json_object_get(json_object_get(x, "function"), "name"));
        if (r->tool_choice == DF_OAI_TOOLS_NAMED && strcmp(nm, r->tool_choice_name)) continue;
        found = 1;
        char *schema = df_oai_tool_schema(r->tools_json, i), err[400];
        df_buf gb = {0};
        int grc = schema ? df_json_schema_to_grammar(schema, strlen(schema), "t-", &gb, err, sizeof err) : DF_ENOMEM;
        free(schema);
        df_buf_free(&gb);
        if (grc) {
            char p[80];
            df_oai_pathf(p, sizeof p, "tools[%zu].function.parameters", i);
            rc = grc == DF_ENOMEM ? df_oai_fail(e, 503, NULL, NULL, "Out of memory.")
                                  : df_oai_fail(e, 400, p, grc == DF_EUNSUPPORTED ? "unsupported_parameter" : "invalid_value",
                                                "Invalid '%s' (tool_choice makes the call constrained by this schema): %s", p, err);
            break;
        }
    }
    json_decref(t);
    if (!rc && !found)
        return df_oai_fail(e, 400, "tool_choice", "invalid_value", "Invalid value for 'tool_choice': no function named '%.64s' was specified in the 'tools' parameter.", r->tool_choice_name);
    return rc;
}

/* One top-level field. Returns 0 if accepted, -1 with *e filled. */
static int parse_field(df_oai_kind kind, const df_oai_limits *lim, const char *k, const json_t *v, df_oai_request *r,
                       int *saw_max_tokens, df_oai_error *e) {
    const int chat = kind == DF_OAI_CHAT;
    double d;
    long long x;
    if (json_is_null(v)) return 0; /* null means not given; required ones are checked after */
    if (!strcmp(k, "model")) {
        if (get_string(v, k, e)) return -1;
        if (strcmp(json_string_value(v), lim->model_id))
            return df_oai_fail(e, 404, "model", "model_not_found", "The model `%.200s` does not exist or you do not have access to it. This server serves `%.200s`.",
                        json_string_value(v), lim->model_id);
        return 0;
    }
    if (chat && !strcmp(k, "messages")) return parse_messages(v, &r->messages_json, e);
    if (!chat && !strcmp(k, "prompt")) return parse_prompt(v, lim, r, e);
    if (!strcmp(k, "max_tokens") || (chat && !strcmp(k, "max_completion_tokens"))) {
        if (get_int(v, k, 1, INT32_MAX, &x, e)) return -1;
        if ((*saw_max_tokens)++)
            return df_oai_fail(e, 400, k, "invalid_value", "Give only one of 'max_tokens' and 'max_completion_tokens'.");
        if (x > lim->max_tokens)
            return df_oai_fail(e, 400, k, "invalid_value", "Invalid value for '%s': %lld is too large; this server allows at most %ld completion tokens per request (--max-tokens).",
                        k, x, lim->max_tokens);
        r->max_tokens = (long)x;
        return 0;
    }
    if (!strcmp(k, "temperature")) {
        if (get_number(v, k, 0, 2, &d, e)) return -1;
        r->has_temperature = 1;
        r->temperature = d;
        return 0;
    }
    if (!strcmp(k, "top_p")) return get_number(v, k, 0, 1, &r->top_p, e);
    if (!strcmp(k, "seed")) {
        if (get_int(v, k, INT64_MIN, INT64_MAX, &x, e)) return -1;
        r->has_seed = 1;
        r->seed = x;
        return 0;
    }
    if (!strcmp(k, "stop")) return parse_stop(v, r, e);
    if (!strcmp(k, "stream")) return get_bool(v, k, &r->stream, e);
    if (!strcmp(k, "stream_options")) {
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        const char *k2;
        json_t *v2;
        json_object_foreach((json_t *)v, k2, v2) {
            char p[80];
            snprintf(p, sizeof p, "stream_options.%.40s", k2);
            int b;
            if (!strcmp(k2, "include_usage")) { if (!json_is_null(v2) && get_bool(v2, p, &r->include_usage, e)) return -1; }
            else if (!strcmp(k2, "include_obfuscation")) { if (!json_is_null(v2) && get_bool(v2, p, &b, e)) return -1; }
            else return df_oai_fail(e, 400, p, "unknown_parameter", "Unrecognized request argument supplied: %s", p);
        }
        return 0;
    }
    if (chat && !strcmp(k, "logprobs")) return get_bool(v, k, &r->logprobs, e);
    if (chat && !strcmp(k, "top_logprobs")) {
        if (get_int(v, k, 0, DF_OAI_MAX_TOP_LOGPROBS, &x, e)) return -1;
        r->top_logprobs = (int)x;
        return 0;
    }
    if (!chat && !strcmp(k, "logprobs")) {
        if (get_int(v, k, 0, 5, &x, e)) return -1;
        r->logprobs = 1;
        r->top_logprobs = (int)x;
        return 0;
    }
    if (!strcmp(k, "n") || (!chat && !strcmp(k, "best_of"))) {
        if (get_int(v, k, 1, 128, &x, e)) return -1;
        return x == 1 ? 0 : unsupported(e, k, "only one choice per request (n = 1) is supported");
    }
    if (!strcmp(k, "frequency_penalty") || !strcmp(k, "presence_penalty")) {
        if (get_number(v, k, -2, 2, &d, e)) return -1;
        return d == 0 ? 0 : unsupported(e, k, "penalties are not implemented; only 0 is accepted");
    }
    if (!strcmp(k, "logit_bias")) {
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        return json_object_size(v) ? unsupported(e, k, "logit_bias is not implemented; only {} is accepted") : 0;
    }
    if (!strcmp(k, "user") || (chat && (!strcmp(k, "prompt_cache_key") || !strcmp(k, "safety_identifier") || !strcmp(k, "service_tier"))))
        return get_string(v, k, e);
    if (chat && !strcmp(k, "store")) { int b; return get_bool(v, k, &b, e); }
    if (chat && !strcmp(k, "parallel_tool_calls")) return get_bool(v, k, &r->parallel_tool_calls, e);
    if (chat && !strcmp(k, "metadata")) {
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        if (json_object_size(v) > 16) return df_oai_fail(e, 400, k, "invalid_value", "Invalid 'metadata': at most 16 keys.");
        const char *k2;
        json_t *v2;
        json_object_foreach((json_t *)v, k2, v2) {
            char p[80];
            snprintf(p, sizeof p, "metadata.%.40s", k2);
            if (get_string(v2, p, e)) return -1;
        }
        return 0;
    }
    if (chat && !strcmp(k, "prediction")) return json_is_object(v) ? 0 : bad_type(e, k, "an object", v);
    if (chat && !strcmp(k, "tools")) return parse_tools(v, r, e);
    if (chat && !strcmp(k, "functions")) {
        if (!json_is_array(v)) return bad_type(e, k, "an array", v);
        return json_array_size(v) ? unsupported(e, k, "function calling is not implemented yet") : 0;
    }
    if (chat && !strcmp(k, "tool_choice")) return parse_tool_choice(v, r, e);
    if (chat && !strcmp(k, "function_call")) {
        if (json_is_string(v) && (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"))) return 0;
        if (!json_is_string(v) && !json_is_object(v)) return bad_type(e, k, "a string or an object", v);
        return unsupported(e, k, "the deprecated function_call is not supported; use tools and tool_choice");
    }
    if (chat && !strcmp(k, "chat_template_kwargs")) {
        if (!json_is_object(v)) return bad_type(e, k, "an object", v);
        r->template_kwargs_json = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
        return r->template_kwargs_json ? 0 : df_oai_fail(e, 503, k, NULL, "Out of memory.");
    }
    if (chat && !strcmp(k, "reasoning_effort")) {
        if (get_string(v, k, e)) return -1;
        const char *x = json_string_value(v);
        if (strcmp(x, "none") && strcmp(x, "minimal") && strcmp(x, "low") && strcmp(x, "medium") && strcmp(x, "high"))
            return df_oai_fail(e, 400, k, "invalid_value", "Invalid value for 'reasoning_effort': expected one of 'none', 'minimal', 'low', 'medium' and 'high', but got '%.40s'.", x);
        r->reasoning_effort = strdup(x);
        return r->reasoning_effort ? 0 : df_oai_fail(e, 503, k, NULL, "Out of memory.");
    }
    if (chat && !strcmp(k, "response_format")) return parse_response_format(v, r, e);
    if (chat && !strcmp(k, "modalities")) {
        if (!json_is_array(v)) return bad_type(e, k, "an array", v);
        size_t i;
        json_t *m;
        json_array_foreach(v, i, m) {
            if (!json_is_string(m)) return bad_type(e, k, "an array of strings", v);
            if (strcmp(json_string_value(m), "text")) return unsupported(e, k, "only the 'text' modality is supported");
        }
        return 0;
    }
    if (chat && (!strcmp(k, "audio") || !strcmp(k, "verbosity") || !strcmp(k, "web_search_options")))
        return unsupported(e, k, "this option would change the output in ways Deltafin does not implement");
    if (!chat && !strcmp(k, "echo")) {
        int b;
        if (get_bool(v, k, &b, e)) return -1;
        return b ? unsupported(e, k, "echo is not implemented; only false is accepted") : 0;
    }
    if (!chat && !strcmp(k, "suffix")) {
        if (get_string(v, k, e)) return -1;
        return json_string_length(v) ? unsupported(e, k, "suffix (insertion) is not implemented") : 0;
    }
    return df_oai_fail(e, 400, k, "unknown_parameter", "Unrecognized request argument supplied: %s", k);
}

int df_oai_parse(df_oai_kind kind, const df_oai_limits *lim, const char *body, size_t len, df_oai_request *out,
                 df_oai_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    out->max_tokens = -1;
    out->top_p = 1;
    out->parallel_tool_calls = 1;
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root)
        return df_oai_fail(err, 400, NULL, "invalid_json",
                    "We could not parse the JSON body of your request: %s (line %d, column %d). The body must be a JSON object.",
                    je.text, je.line, je.column);
    int rc = 0, saw_max = 0;
    if (!json_is_object(root)) rc = df_oai_fail(err, 400, NULL, "invalid_json", "The body of your request must be a JSON object, not %s.", df_oai_jtype(root));
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach(root, k, v) {
        if ((rc = parse_field(kind, lim, k, v, out, &saw_max, err))) break;
    }
    if (!rc) {
        const char *req = kind == DF_OAI_CHAT ? "messages" : "prompt";
        json_t *m = json_object_get(root, "model");
        if (!m || json_is_null(m)) rc = df_oai_fail(err, 400, "model", "missing_required_parameter", "Missing required parameter: 'model'.");
        else if (kind == DF_OAI_CHAT ? !out->messages_json : !out->prompt && !out->prompt_ids)
            rc = df_oai_fail(err, 400, req, "missing_required_parameter", "Missing required parameter: '%s'.", req);
        else if (out->top_logprobs && !out->logprobs)
            rc = df_oai_fail(err, 400, "top_logprobs", "invalid_value", "Invalid value for 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is given.");
        else if (json_object_get(root, "stream_options") && !json_is_null(json_object_get(root, "stream_options")) && !out->stream)
            rc = df_oai_fail(err, 400, "stream_options", "invalid_value", "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
        else if (kind == DF_OAI_CHAT)
            rc = check_tool_choice(out, err);
    }
    if (!rc && kind == DF_OAI_COMPLETIONS && out->max_tokens < 0) out->max_tokens = lim->max_tokens < 16 ? lim->max_tokens : 16;
    json_decref(root);
    if (rc) df_oai_request_free(out);
    return rc;
}


/* For the routes that turn their bodies into chat requests (responses.c):
 * the chat route's own checks of a tools array in OpenAI chat shape, and of
 * tool_choice against the tools. */
int df_oai_parse_tools(const json_t *tools, df_oai_request *r, df_oai_error *e) { return parse_tools(tools, r, e); }
int df_oai_check_tool_choice(df_oai_request *r, df_oai_error *e) { return check_tool_choice(r, e); }
int df_oai_parse_response_format(const json_t *v, df_oai_request *r, df_oai_error *e) { return parse_response_format(v, r, e); }
