/* kimi_k3_chat.c - Kimi K3's chat format (see kimi_k3_chat.h), rendered the
 * way the vendor's encoding_k3.py renders it, segment for segment.
 *
 * Order of a prompt: the tool declaration (a system message of type
 * tool-declare holding the tools as compact JSON with every object's keys
 * sorted), the thinking-effort note, the conversation (tool results re-sorted
 * into the order of the calls they answer), the tool-choice and
 * response-format notes, then the generation prompt: an unclosed assistant
 * message opening a think block (or a response block with thinking off).
 *
 * Python semantics reproduced where they show in the output: str() of
 * scalars (True, None, 1.5), json.dumps(ensure_ascii=False) with its
 * escapes and float repr, truthiness ("" and [] are false), str.strip(),
 * dict.get(key, default) (a key holding null is not absent). */
#include "tok/kimi_k3_chat.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deltafin.h"
#include "tok/tokenizer.h"
#include "tok/unicode.h"
#include "util/util.h"

void float_repr(double f, char *buf); /* template_print.c: Python repr(float), buf >= 32 bytes */

static const char OPEN[] = "<|open|>", CLOSE[] = "<|close|>", SEP[] = "<|sep|>", EOM[] = "<|end_of_msg|>";
static const char IMAGE_PLACEHOLDER[] = "<|kimi_image_placeholder|>";

typedef struct {
    df_buf text;
    df_k3_seg *seg;
    size_t n_seg, cap_seg;
    char *err;
    size_t errlen;
} r3;

/* Appends one segment (nothing when empty, as _segment does). */
static void seg(r3 *R, const char *s, size_t n, int special) {
    if (!n) return;
    if (R->n_seg == R->cap_seg) {
        R->cap_seg = R->cap_seg ? R->cap_seg * 2 : 64;
        R->seg = df_xrealloc(R->seg, R->cap_seg * sizeof *R->seg);
    }
    R->seg[R->n_seg++] = (df_k3_seg){R->text.len, n, special};
    df_buf_put(&R->text, s, n);
}
static void text(r3 *R, const char *s) { seg(R, s, strlen(s), 0); }
static void ctl(r3 *R, const char *s) { seg(R, s, strlen(s), 1); }

/* ---- Python values ------------------------------------------------------ */

static int py_isspace(uint32_t c) {
    if (c < 0x80) return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20);
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* str.strip(): the range of s[0..n) without leading/trailing whitespace. */
static void py_strip(const char *s, size_t n, size_t *a, size_t *b) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, last = 0;
    *a = n;
    while (i < n) {
        uint32_t c;
        int l = df_utf8_decode(u + i, n - i, &c);
        if (l <= 0) l = 1;
        if (!py_isspace(c)) {
            if (*a == n) *a = i;
            last = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (*a == n) { *a = *b = 0; return; }
    *b = last;
}

static int py_truthy(const json_t *v) {
    if (!v || json_is_null(v) || json_is_false(v)) return 0;
    if (json_is_string(v)) return json_string_length(v) > 0;
    if (json_is_integer(v)) return json_integer_value(v) != 0;
    if (json_is_real(v)) return json_real_value(v) != 0;
    if (json_is_array(v)) return json_array_size(v) > 0;
    if (json_is_object(v)) return json_object_size(v) > 0;
    return 1;
}

/* dict.get(key, default): a present key wins even when it holds null. */
static json_t *get_or(json_t *o, const char *k, json_t *dflt) {
    json_t *v = json_is_object(o) ? json_object_get(o, k) : NULL;
    return v ? v : dflt;
}

/* str(v) for scalars into b; containers are refused (1). */
static int py_str(const json_t *v, df_buf *b) {
    char num[48];
    switch (json_typeof(v)) {
    case JSON_STRING: df_buf_put(b, json_string_value(v), json_string_length(v)); return 0;
    case JSON_INTEGER: df_buf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); return 0;
    case JSON_REAL: float_repr(json_real_value(v), num); df_buf_puts(b, num); return 0;
    case JSON_TRUE: df_buf_puts(b, "True"); return 0;
    case JSON_FALSE: df_buf_puts(b, "False"); return 0;
    case JSON_NULL: df_buf_puts(b, "None"); return 0;
    default: return 1;
    }
}

/* json.dumps(v, ensure_ascii=False) (compact: separators=(",", ":")), keys
 * sorted when sort (the vendor's _deep_sort before dumping). */
static void dump_str(df_buf *b, const char *s, size_t n) {
    df_buf_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); esc = u; }
        if (!esc) continue;
        df_buf_put(b, s + run, i - run);
        df_buf_puts(b, esc);
        run = i + 1;
    }
    df_buf_put(b, s + run, n - run);
    df_buf_put(b, "\"", 1);
}

static int key_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void dump(df_buf *b, json_t *v, int compact, int sort) {
    char num[48];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        size_t n = json_object_size(v), i = 0;
        const char **keys = df_xmalloc((n ? n : 1) * sizeof *keys);
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) keys[i++] = k;
        if (sort) qsort(keys, n, sizeof *keys, key_cmp);
        df_buf_put(b, "{", 1);
        for (i = 0; i < n; i++) {
            if (i) df_buf_puts(b, compact ? "," : ", ");
            dump_str(b, keys[i], strlen(keys[i]));
            df_buf_puts(b, compact ? ":" : ": ");
            dump(b, json_object_get(v, keys[i]), compact, sort);
        }
        df_buf_put(b, "}", 1);
        free(keys);
        return;
    }
    case JSON_ARRAY:
        df_buf_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) df_buf_puts(b, compact ? "," : ", ");
            dump(b, json_array_get(v, i), compact, sort);
        }
        df_buf_put(b, "]", 1);
        return;
    case JSON_STRING: dump_str(b, json_string_value(v), json_string_length(v)); return;
    case JSON_INTEGER: df_buf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); return;
    case JSON_REAL: float_repr(json_real_value(v), num); df_buf_puts(b, num); return;
    case JSON_TRUE: df_buf_puts(b, "true"); return;
    case JSON_FALSE: df_buf_puts(b, "false"); return;
    default: df_buf_puts(b, "null"); return;
    }
}

/* ---- tags --------------------------------------------------------------- */

typedef struct {
    const char *key;
    const json_t *val; /* str() of it, escaped; or sval when NULL */
    const char *sval;
} attr;

/* <|open|>tag key="value"...<|sep|>: each attribute is four text segments
 * (' key', '="', the escaped value, '"'). */
static int open_tag(r3 *R, const char *tag, const attr *a, int na, const char *where) {
    ctl(R, OPEN);
    text(R, tag);
    for (int i = 0; i < na; i++) {
        df_buf k = {0}, v = {0}, e = {0};
        df_buf_printf(&k, " %s", a[i].key);
        if (a[i].val) {
            if (py_str(a[i].val, &v)) {
                df_buf_free(&k);
                return df_err(R->err, R->errlen, DF_EINPUT, "%s: the %s attribute must be a string, number, boolean or null, not %s",
                              where, a[i].key, json_is_object(a[i].val) ? "an object" : "an array");
            }
        } else {
            df_buf_puts(&v, a[i].sval);
        }
        for (size_t j = 0; j < v.len; j++) { /* & first, then " (so &quot; is not escaped again) */
            if (v.p[j] == '&') df_buf_puts(&e, "&amp;");
            else if (v.p[j] == '"') df_buf_puts(&e, "&quot;");
            else df_buf_put(&e, v.p + j, 1);
        }
        seg(R, k.p, k.len, 0);
        text(R, "=\"");
        seg(R, e.p, e.len, 0);
        text(R, "\"");
        df_buf_free(&k);
        df_buf_free(&v);
        df_buf_free(&e);
    }
    ctl(R, SEP);
    return 0;
}

static void close_tag(r3 *R, const char *tag) {
    ctl(R, CLOSE);
    text(R, tag);
    ctl(R, SEP);
}

/* A system message the encoder synthesizes (type = kind), body stripped
 * (n = SIZE_MAX: body is NUL-terminated). */
static void internal_system(r3 *R, const char *kind, const char *body, size_t n) {
    if (n == SIZE_MAX) n = strlen(body);
    attr a[2] = {{"role", NULL, "system"}, {"type", NULL, kind}};
    open_tag(R, "message", a, 2, "");
    size_t s, e;
    py_strip(body, n, &s, &e);
    seg(R, body + s, e - s, 0);
    close_tag(R, "message");
    ctl(R, EOM);
}

static void tool_declare(r3 *R, json_t *tools, int dynamic) {
    df_buf b = {0};
    df_buf_puts(&b, dynamic ? "## New Tools Available\n"
                              "The system dynamically extends the toolset via lazy-loading.\n"
                              "You have access to all existing and extended tools.\n"
                              "Here are the specs for the extended tools.\n\n```json\n"
                            : "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n");
    dump(&b, tools, 1, 1);
    df_buf_puts(&b, "\n```");
    internal_system(R, "tool-declare", b.p, b.len);
    df_buf_free(&b);
}

/* Text from the caller: str(v) as one text segment. */
static int append_text(r3 *R, const json_t *v, const char *where) {
    df_buf b = {0};
    if (py_str(v, &b)) return df_err(R->err, R->errlen, DF_EINPUT, "%s: expected a string", where);
    seg(R, b.p, b.len, 0);
    df_buf_free(&b);
    return 0;
}

/* A message's content: a string, null/absent, or a list of parts ({type:
 * "text", text} or an image, which leaves the image placeholder). */
static int render_content(r3 *R, json_t *content, const char *where) {
    char w[160];
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) return append_text(R, content, where);
    if (!json_is_array(content))
        return df_err(R->err, R->errlen, DF_EINPUT, "%s: expected a string, a list of parts or null", where);
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        snprintf(w, sizeof w, "%s[%zu]", where, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !json_object_get(part, "type"))
            return df_err(R->err, R->errlen, DF_EINPUT, "%s: expected an object with a type", w);
        if (type && (!strcmp(type, "image") || !strcmp(type, "image_url"))) {
            ctl(R, IMAGE_PLACEHOLDER);
            continue;
        }
        json_t *t = json_object_get(part, "text");
        if (!t) return df_err(R->err, R->errlen, DF_EINPUT, "%s: a part of type '%s' needs text", w, type ? type : "?");
        snprintf(w, sizeof w, "%s[%zu].text", where, i);
        if (append_text(R, t, w)) return DF_EINPUT;
    }
    return 0;
}

static const char *xtml_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_TRUE: case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    case JSON_INTEGER: case JSON_REAL: return "number";
    case JSON_STRING: return "string";
    case JSON_OBJECT: return "object";
    default: return "array";
    }
}

/* A call's function object (call.get("function", call)). */
static json_t *call_function(json_t *call) { return get_or(call, "function", call); }

/* Normalized arguments of a call (_normalize_arguments): *obj (new ref) is
 * the mapping, or *raw the text kept as a json block when it does not parse. */
static int call_arguments(r3 *R, json_t *fn, json_t **obj, json_t **raw, const char *where) {
    json_t *a = json_object_get(fn, "arguments");
    *obj = NULL;
    *raw = NULL;
    if (!a || json_is_null(a)) { *obj = json_object(); return 0; }
    if (json_is_object(a)) { *obj = json_incref(a); return 0; }
    if (!json_is_string(a))
        return df_err(R->err, R->errlen, DF_EINPUT, "%s.arguments: Kimi K3 tool call arguments must be an object or a JSON object string", where);
    const char *s = json_string_value(a);
    size_t n = json_string_length(a), x, y;
    py_strip(s, n, &x, &y);
    if (x == y) { *obj = json_object(); return 0; }
    json_t *p = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    if (!p) { *raw = a; return 0; }
    if (!json_is_object(p)) {
        json_decref(p);
        return df_err(R->err, R->errlen, DF_EINPUT, "%s.arguments: Kimi K3 tool call arguments must be a JSON object", where);
    }
    *obj = p;
    return 0;
}

static int render_assistant(r3 *R, json_t *m, int thinking, const char *where) {
    char w[160];
    if (thinking) {
        open_tag(R, "think", NULL, 0, where);
        json_t *rs = json_object_get(m, "reasoning_content");
        if (!py_truthy(rs)) rs = json_object_get(m, "reasoning");
        if (rs && !json_is_null(rs)) {
            df_buf b = {0};
            snprintf(w, sizeof w, "%s.reasoning_content", where);
            if (py_str(rs, &b)) return df_err(R->err, R->errlen, DF_EINPUT, "%s: expected a string", w);
            size_t x, y;
            py_strip(b.p ? b.p : "", b.len, &x, &y);
            if (x < y) seg(R, b.p, b.len, 0);
            df_buf_free(&b);
        }
        close_tag(R, "think");
    }
    open_tag(R, "response", NULL, 0, where);
    snprintf(w, sizeof w, "%s.content", where);
    if (render_content(R, json_object_get(m, "content"), w)) return DF_EINPUT;
    close_tag(R, "response");
    json_t *calls = json_object_get(m, "tool_calls");
    if (!py_truthy(calls)) return 0;
    if (!json_is_array(calls)) return df_err(R->err, R->errlen, DF_EINPUT, "%s.tool_calls: expected an array", where);
    open_tag(R, "tools", NULL, 0, where);
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        snprintf(w, sizeof w, "%s.tool_calls[%zu]", where, i);
        if (!json_is_object(c)) return df_err(R->err, R->errlen, DF_EINPUT, "%s: expected an object", w);
        json_t *fn = call_function(c);
        if (!json_is_object(fn)) return df_err(R->err, R->errlen, DF_EINPUT, "%s.function: expected an object", w);
        json_t *name = json_object_get(fn, "name");
        if (!name) return df_err(R->err, R->errlen, DF_EINPUT, "%s.function.name: missing", w);
        json_t *idx = json_integer((json_int_t)i + 1);
        attr a[2] = {{"tool", name, NULL}, {"index", idx, NULL}};
        int rc = open_tag(R, "call", a, 2, w);
        json_decref(idx);
        if (rc) return rc;
        json_t *args, *raw;
        if (call_arguments(R, fn, &args, &raw, w)) return DF_EINPUT;
        if (raw) {
            attr t = {"type", NULL, "object"};
            open_tag(R, "json", &t, 1, w);
            seg(R, json_string_value(raw), json_string_length(raw), 0);
            close_tag(R, "json");
        } else {
            const char *k;
            json_t *v;
            json_object_foreach(args, k, v) {
                attr t[2] = {{"key", NULL, k}, {"type", NULL, xtml_type(v)}};
                open_tag(R, "argument", t, 2, w);
                if (json_is_string(v)) {
                    seg(R, json_string_value(v), json_string_length(v), 0);
                } else {
                    df_buf b = {0};
                    dump(&b, v, 0, 0);
                    seg(R, b.p, b.len, 0);
                    df_buf_free(&b);
                }
                close_tag(R, "argument");
            }
            json_decref(args);
        }
        close_tag(R, "call");
    }
    close_tag(R, "tools");
    return 0;
}

/* ---- tool results: normalize_xtml_tool_result_messages ------------------- */

typedef struct {
    json_t *m;    /* borrowed */
    json_t *tool; /* the matched call's function name (borrowed), or NULL */
    size_t pos;
    size_t at;    /* index in the caller's array */
} item;

static int item_cmp(const void *a, const void *b) {
    const item *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos ? 1 : 0; /* ties keep order: see the caller */
}

static int role_is(json_t *m, const char *r) {
    const char *s = json_string_value(json_object_get(m, "role"));
    return json_is_object(m) && s && !strcmp(s, r);
}

/* str(id) of a call or tool-result id (strings and numbers); 1 if none. */
static int id_str(json_t *v, df_buf *b) {
    if (!v || json_is_null(v) || json_is_object(v) || json_is_array(v)) return 1;
    return py_str(v, b);
}

/* Each tool result that names a call of the last assistant message (by
 * tool_call_id, else id) takes that call's function name as its tool; a run
 * of results that all name one is sorted into the calls' order (a run with
 * any other result keeps its order). */
static int order_messages(r3 *R, json_t *msgs, item **out, size_t *nout) {
    size_t n = json_array_size(msgs), k = 0;
    item *it = df_xcalloc(n ? n : 1, sizeof *it);
    json_t *calls = NULL; /* the last assistant message's tool_calls */
    size_t i = 0;
    while (i < n) {
        json_t *m = json_array_get(msgs, i);
        if (role_is(m, "assistant")) {
            calls = json_object_get(m, "tool_calls");
            if (!json_is_array(calls)) calls = NULL;
            it[k++] = (item){m, NULL, 0, i};
            i++;
            continue;
        }
        if (!role_is(m, "tool")) {
            it[k++] = (item){m, NULL, 0, i};
            i++;
            continue;
        }
        size_t start = k;
        int unresolved = 0;
        for (; i < n && role_is(json_array_get(msgs, i), "tool"); i++) {
            json_t *t = json_array_get(msgs, i);
            json_t *cid = get_or(t, "tool_call_id", json_object_get(t, "id"));
            df_buf want = {0};
            item x = {t, NULL, 0, i};
            if (!id_str(cid, &want) && calls) {
                for (size_t j = 0; j < json_array_size(calls); j++) {
                    json_t *c = json_array_get(calls, j);
                    if (!json_is_object(c)) continue;
                    df_buf have = {0};
                    int match = !id_str(json_object_get(c, "id"), &have) && have.len == want.len &&
                                (!want.len || !memcmp(have.p, want.p, want.len));
                    df_buf_free(&have);
                    if (match) { /* the first call with this id (setdefault) */
                        json_t *fn = call_function(c);
                        x.tool = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
                        if (x.tool && json_is_null(x.tool)) x.tool = NULL;
                        x.pos = j + 1;
                        break;
                    }
                }
            }
            df_buf_free(&want);
            if (!x.pos) unresolved = 1;
            it[k++] = x;
        }
        if (!unresolved) {
            /* a stable sort: insertion (runs are short; qsort is not stable) */
            for (size_t a = start + 1; a < k; a++) {
                item x = it[a];
                size_t b = a;
                while (b > start && item_cmp(&it[b - 1], &x) > 0) { it[b] = it[b - 1]; b--; }
                it[b] = x;
            }
        }
    }
    (void)R;
    *out = it;
    *nout = k;
    return 0;
}

/* ---- the conversation --------------------------------------------------- */

static int render_all(r3 *R, json_t *msgs, json_t *tools, int add_gen, json_t *opt) {
    char w[96];
    int thinking = 1;
    json_t *th = json_object_get(opt, "thinking");
    if (th) thinking = py_truthy(th);
    json_t *effort = json_object_get(opt, "thinking_effort");
    const char *eff = effort ? (json_is_null(effort) ? NULL : json_string_value(effort)) : "max";
    if (thinking && effort && !json_is_null(effort) &&
        (!eff || (strcmp(eff, "low") && strcmp(eff, "high") && strcmp(eff, "max")))) {
        df_buf b = {0};
        if (py_str(effort, &b)) df_buf_puts(&b, "?");
        int rc = df_err(R->err, R->errlen, DF_EINPUT, "thinking_effort: unsupported value '%.*s'; supported values are 'high', 'low' and 'max'",
                        (int)(b.len > 40 ? 40 : b.len), b.p ? b.p : "");
        df_buf_free(&b);
        return rc;
    }
    if (py_truthy(tools)) tool_declare(R, tools, 0);
    if (thinking && eff && *eff) {
        df_buf b = {0};
        df_buf_printf(&b, "`thinking_effort` guides on how much to think in your thinking channel (not including the "
                          "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                          "Now the system is invoked with `thinking_effort=%s`.", eff);
        internal_system(R, "thinking-effort", b.p, b.len);
        df_buf_free(&b);
    }
    item *it;
    size_t n;
    order_messages(R, msgs, &it, &n);
    json_t *prior = NULL;
    size_t tool_index = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *m = it[i].m;
        snprintf(w, sizeof w, "messages[%zu]", it[i].at);
        if (!json_is_object(m)) continue;
        json_t *role = json_object_get(m, "role");
        if (!role) { rc = df_err(R->err, R->errlen, DF_EINPUT, "%s.role: missing", w); break; }
        const char *r = json_string_value(role);
        if (!r) continue;
        json_t *name = json_object_get(m, "name");
        if (!strcmp(r, "system") && py_truthy(json_object_get(m, "tools"))) {
            tool_declare(R, json_object_get(m, "tools"), 1);
        } else if (!strcmp(r, "user") || !strcmp(r, "system") || !strcmp(r, "assistant")) {
            int asst = !strcmp(r, "assistant");
            attr a[2] = {{"role", NULL, r}, {"name", name, NULL}};
            if ((rc = open_tag(R, "message", a, py_truthy(name) ? 2 : 1, w))) break;
            if (asst) {
                prior = json_object_get(m, "tool_calls");
                tool_index = 0;
                rc = render_assistant(R, m, thinking, w);
            } else {
                char wc[112];
                snprintf(wc, sizeof wc, "%s.content", w);
                rc = render_content(R, json_object_get(m, "content"), wc);
            }
            if (rc) break;
            close_tag(R, "message");
            ctl(R, EOM);
        } else if (!strcmp(r, "tool")) {
            tool_index++;
            json_t *tool = it[i].tool ? it[i].tool : get_or(m, "tool", name);
            if (tool && json_is_null(tool)) tool = NULL;
            if (!tool && py_truthy(prior) && json_is_array(prior) && tool_index <= json_array_size(prior)) {
                json_t *fn = call_function(json_array_get(prior, tool_index - 1));
                tool = json_object_get(fn, "name");
                if (!tool) { rc = df_err(R->err, R->errlen, DF_EINPUT, "%s: the matching tool call has no function name", w); break; }
                if (json_is_null(tool)) tool = NULL;
            }
            if (!tool) {
                rc = df_err(R->err, R->errlen, DF_EINPUT, "%s: a Kimi K3 tool message needs a resolvable tool name (tool_call_id of a call of the previous assistant message, tool or name, or a call at its position)", w);
                break;
            }
            json_t *idx = json_integer((json_int_t)tool_index);
            attr a[3] = {{"role", NULL, "tool"}, {"tool", tool, NULL}, {"index", idx, NULL}};
            rc = open_tag(R, "message", a, 3, w);
            json_decref(idx);
            if (rc) break;
            char wc[112];
            snprintf(wc, sizeof wc, "%s.content", w);
            if ((rc = render_content(R, json_object_get(m, "content"), wc))) break;
            close_tag(R, "message");
            ctl(R, EOM);
        }
    }
    free(it);
    if (rc) return rc;
    const char *tc = json_string_value(json_object_get(opt, "tool_choice"));
    if (tc && !strcmp(tc, "required"))
        internal_system(R, "tool-choice", "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.", SIZE_MAX);
    else if (tc && !strcmp(tc, "none"))
        internal_system(R, "tool-choice", "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.", SIZE_MAX);
    json_t *rf = json_object_get(opt, "response_format");
    const char *rt = json_string_value(json_is_object(rf) ? json_object_get(rf, "type") : rf);
    static const char RF[] = "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
    if (rt && !strcmp(rt, "json_object")) {
        df_buf b = {0};
        df_buf_printf(&b, "The system is invoked with `response_format=json_object`.\n%s", RF);
        internal_system(R, "response-format", b.p, b.len);
        df_buf_free(&b);
    } else if (rt && !strcmp(rt, "json_schema")) {
        json_t *js = json_is_object(rf) ? json_object_get(rf, "json_schema") : NULL, *schema = NULL;
        if (js && !json_is_null(js)) schema = json_is_object(js) ? get_or(js, "schema", get_or(js, "json_schema", js)) : js;
        df_buf b = {0};
        df_buf_printf(&b, "The system is invoked with `response_format=json_schema`.\n%s\nThe JSON data must match the following schema:\n```json\n", RF);
        if (schema) dump(&b, schema, 1, 1);
        else df_buf_puts(&b, "null");
        df_buf_puts(&b, "\n```");
        internal_system(R, "response-format", b.p, b.len);
        df_buf_free(&b);
    }
    if (add_gen) {
        attr a = {"role", NULL, "assistant"};
        open_tag(R, "message", &a, 1, "");
        open_tag(R, thinking ? "think" : "response", NULL, 0, "");
    }
    return 0;
}

static json_t *parse_arg(const char *s, const char *what, int need_array, char *err, size_t errlen, int *rc) {
    json_error_t je;
    json_t *v = json_loads(s, JSON_DECODE_ANY, &je);
    *rc = 0;
    if (!v) { *rc = df_err(err, errlen, DF_EINPUT, "%s: invalid JSON at line %d, column %d: %s", what, je.line, je.column, je.text); return NULL; }
    if (need_array == 1 && !json_is_array(v)) *rc = df_err(err, errlen, DF_EINPUT, "%s: expected an array", what);
    if (need_array == 2 && !json_is_object(v)) *rc = df_err(err, errlen, DF_EINPUT, "%s: expected an object", what);
    if (*rc) { json_decref(v); return NULL; }
    return v;
}

int df_k3_chat_render(const char *messages_json, const char *tools_json, int add_generation_prompt,
                      const char *options_json, df_k3_prompt *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int rc;
    json_t *msgs = parse_arg(messages_json ? messages_json : "", "messages", 1, err, errlen, &rc), *tools = NULL, *opt = NULL;
    if (!msgs) return rc;
    if (tools_json && !(tools = parse_arg(tools_json, "tools", 0, err, errlen, &rc))) { json_decref(msgs); return rc; }
    if (options_json && !(opt = parse_arg(options_json, "options", 2, err, errlen, &rc))) {
        json_decref(msgs);
        json_decref(tools);
        return rc;
    }
    r3 R = {0};
    R.err = err;
    R.errlen = errlen;
    rc = render_all(&R, msgs, tools, add_generation_prompt, opt);
    json_decref(msgs);
    json_decref(tools);
    json_decref(opt);
    if (rc) {
        df_buf_free(&R.text);
        free(R.seg);
        return rc;
    }
    df_buf_put(&R.text, "", 1); /* NUL, not counted */
    out->text = R.text.p;
    out->len = R.text.len - 1;
    out->seg = R.seg;
    out->n_seg = R.n_seg;
    return 0;
}

void df_k3_prompt_free(df_k3_prompt *p) {
    if (!p) return;
    free(p->text);
    free(p->seg);
    memset(p, 0, sizeof *p);
}

int df_k3_prompt_encode(const struct df_tokenizer *t, const df_k3_prompt *p, int n_threads, int32_t **ids,
                        size_t *n, char *err, size_t errlen) {
    int32_t *v = NULL;
    size_t nv = 0, cap = 0;
    *ids = NULL;
    *n = 0;
    for (size_t i = 0; i < p->n_seg; i++) {
        int32_t *part;
        size_t np;
        int rc = df_tok_encode_err(t, p->text + p->seg[i].off, p->seg[i].len, p->seg[i].special ? DF_TOK_ALLOW_SPECIAL : 0,
                                   n_threads, &part, &np, err, errlen);
        if (rc) { free(v); return rc; }
        if (nv + np > cap) {
            cap = (nv + np) * 2 + 16;
            v = df_xrealloc(v, cap * sizeof *v);
        }
        if (np) memcpy(v + nv, part, np * sizeof *part);
        nv += np;
        free(part);
    }
    *ids = v ? v : df_xmalloc(sizeof *v);
    *n = nv;
    return 0;
}

int df_k3_is_model_dir(const char *dir) {
    char *p = df_path_join(dir, "config.json");
    json_t *c = json_load_file(p, 0, NULL);
    free(p);
    const char *mt = json_string_value(json_object_get(c, "model_type"));
    int yes = mt && !strcmp(mt, "kimi_k3");
    json_decref(c);
    return yes;
}
