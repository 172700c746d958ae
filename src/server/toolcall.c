/* toolcall.c - see toolcall.h: output parsing (think blocks, native tool
 * calls) per model family, and the grammar text of a call for constrained
 * decoding.
 *
 * The parser is a small state machine over the text not yet decided
 * (pend): in TEXT it looks for the earliest marker (think open, a calls
 * section or a call, a structure marker to drop); in THINK for the think
 * close; in SECTION for the next call or the section's end; in CALL for the
 * call's end; in TAIL (Llama 3 JSON, Mistral) it keeps everything until the
 * output ends. Text is passed on as soon as no marker can start in it.
 */
#include "server/toolcall.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* ---- families --------------------------------------------------------- */

#define DS_SEC_OPEN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_SEC_CLOSE "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_OPEN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_CLOSE "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

typedef struct {
    const char *think_open, *think_close;
    const char *sec_open, *sec_close; /* NULL: calls stand alone */
    const char *call_open, *call_close;
    const char *drop[5];              /* structure markers removed from content */
    const char *tail_open;            /* TAIL families: the marker that starts the calls */
} fam_spec;

static const fam_spec SPECS[] = {
    [DF_TC_NONE] = {"<think>", "</think>", NULL, NULL, NULL, NULL, {NULL}, NULL},
    [DF_TC_HERMES] = {"<think>", "</think>", NULL, NULL, "<tool_call>", "</tool_call>", {NULL}, NULL},
    [DF_TC_DEEPSEEK] = {"<think>", "</think>", DS_SEC_OPEN, DS_SEC_CLOSE, DS_CALL_OPEN, DS_CALL_CLOSE, {NULL}, NULL},
    [DF_TC_KIMI_K2] = {"<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                       "<|tool_call_begin|>", "<|tool_call_end|>", {NULL}, NULL},
    [DF_TC_KIMI_K3] = {"<|open|>think<|sep|>", "<|close|>think<|sep|>", "<|open|>tools<|sep|>", "<|close|>tools<|sep|>",
                       "<|open|>call", "<|close|>call<|sep|>",
                       {"<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>", "<|end_of_msg|>", NULL},
                       NULL},
    [DF_TC_LLAMA3] = {"<think>", "</think>", NULL, NULL, NULL, NULL, {NULL}, "<|python_tag|>"},
    [DF_TC_MISTRAL] = {"<think>", "</think>", NULL, NULL, NULL, NULL, {NULL}, "[TOOL_CALLS]"},
};

const char *df_tc_family_name(df_tc_family f) {
    static const char *const n[] = {"none", "hermes", "deepseek", "kimi_k2", "kimi_k3", "llama3", "mistral"};
    return (unsigned)f < sizeof n / sizeof *n ? n[f] : "none";
}

df_tc_family df_tc_detect(const char *src, int is_k3) {
    if (is_k3) return DF_TC_KIMI_K3;
    if (!src) return DF_TC_NONE;
    if (strstr(src, DS_CALL_OPEN) || strstr(src, DS_SEC_OPEN)) return DF_TC_DEEPSEEK;
    if (strstr(src, "<|tool_calls_section_begin|>")) return DF_TC_KIMI_K2;
    if (strstr(src, "<tool_call>")) return DF_TC_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return DF_TC_MISTRAL;
    if (strstr(src, "<|python_tag|>") || (strstr(src, "\"parameters\"") && strstr(src, "<|start_header_id|>")))
        return DF_TC_LLAMA3;
    return DF_TC_NONE;
}

static int ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

int df_tc_template_reads(const char *src, const char *name) {
    if (!src || !name || !*name) return 0;
    size_t n = strlen(name);
    for (const char *p = strstr(src, name); p; p = strstr(p + 1, name))
        if ((p == src || !ident_char(p[-1])) && !ident_char(p[n])) return 1;
    return 0;
}

int df_tc_has_think(const char *src, int is_k3) { return is_k3 || (src && strstr(src, "<think>")); }

int df_tc_prompt_opens_think(df_tc_family f, const char *prompt, size_t len) {
    const char *open = SPECS[f].think_open;
    while (len && isspace((unsigned char)prompt[len - 1])) len--;
    size_t n = strlen(open);
    return len >= n && !memcmp(prompt + len - n, open, n);
}

/* ---- the parser ------------------------------------------------------- */

enum { ST_TEXT, ST_THINK, ST_SECTION, ST_CALL, ST_TAIL };

struct df_tc {
    df_tc_config c;
    const fam_spec *sp;
    json_t *names;       /* declared tool names (object used as a set), NULL: any */
    int state, in_section;
    int lead;            /* content: leading whitespace after a think block is dropped */
    int started;         /* any non-space output seen (Llama 3: a call must be the whole output) */
    size_t scan;         /* CALL: pend[0..scan) holds no complete call end (searched already) */
    df_buf pend;         /* undecided text */
    df_buf content, reasoning, rsp; /* rsp: reasoning whitespace held back */
    df_tc_call *calls;
    size_t n_calls, cap_calls;
    uint64_t ctr;
};

static void buf_take(df_buf *b, size_t n) { /* drops the first n bytes */
    if (!n) return;
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

df_tc *df_tc_new(const df_tc_config *c) {
    df_tc *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->c = *c;
    if ((unsigned)p->c.fam > DF_TC_MISTRAL) p->c.fam = DF_TC_NONE;
    p->sp = &SPECS[p->c.fam];
    p->state = c->think && c->in_think ? ST_THINK : ST_TEXT;
    p->lead = p->state == ST_THINK;
    if (c->tools_json) {
        json_t *t = json_loads(c->tools_json, 0, NULL);
        p->names = json_object();
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e) {
            json_t *nm = json_object_get(json_object_get(e, "function"), "name");
            if (!json_is_string(nm)) nm = json_object_get(e, "name"); /* Anthropic shape */
            if (json_is_string(nm)) json_object_set_new(p->names, json_string_value(nm), json_true());
        }
        json_decref(t);
    }
    p->c.tools_json = NULL;
    return p;
}

void df_tc_free(df_tc *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].args);
    }
    free(p->calls);
    json_decref(p->names);
    df_buf_free(&p->pend);
    df_buf_free(&p->content);
    df_buf_free(&p->reasoning);
    df_buf_free(&p->rsp);
    free(p);
}

static void put_content(df_tc *p, const char *s, size_t n) {
    if (p->lead) {
        while (n && isspace((unsigned char)*s)) s++, n--;
        if (!n) return;
        p->lead = 0;
    }
    for (size_t i = 0; i < n && !p->started; i++)
        if (!isspace((unsigned char)s[i])) p->started = 1;
    df_buf_put(&p->content, s, n);
}

/* Reasoning without its surrounding whitespace: leading whitespace is
 * dropped, trailing whitespace held back until more reasoning follows. */
static void put_reasoning(df_tc *p, const char *s, size_t n) {
    size_t e = n;
    while (e && isspace((unsigned char)s[e - 1])) e--;
    size_t b = 0;
    if (!p->reasoning.len && !p->rsp.len)
        while (b < e && isspace((unsigned char)s[b])) b++;
    if (b < e) {
        df_buf_put(&p->reasoning, p->rsp.p, p->rsp.len);
        p->rsp.len = 0;
        df_buf_put(&p->reasoning, s + b, e - b);
    }
    if (p->reasoning.len) df_buf_put(&p->rsp, s + e, n - e);
}

/* The length of the longest suffix of s[0..n) that is a proper prefix of m. */
static size_t partial(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *m) { return m && n ? memmem(s, n, m, strlen(m)) : NULL; }

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static void trim(const char **s, size_t *n) {
    while (*n && isspace((unsigned char)**s)) (*s)++, (*n)--;
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

/* Adds a call if its name is declared and its arguments (JSON text, or
 * args_obj) are a JSON object. Returns 0, or -1 (malformed). Takes args_obj. */
static int add_call(df_tc *p, const char *name, size_t nlen, const char *args, size_t alen, json_t *args_obj,
                    const char *native_id) {
    json_t *a = args_obj;
    if (!a) {
        trim(&args, &alen);
        a = alen ? json_loadb(args, alen, 0, NULL) : json_object(); /* no arguments: {} */
    }
    trim(&name, &nlen);
    char *nm = dupn(name, nlen);
    int ok = a && json_is_object(a) && nm && nlen && !memchr(name, '\n', nlen) &&
             (!p->names || json_object_get(p->names, nm));
    char *txt = ok ? json_dumps(a, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(a);
    if (!txt) { free(nm); return -1; }
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? 2 * p->cap_calls : 4;
        df_tc_call *c = realloc(p->calls, cap * sizeof *c);
        if (!c) { free(nm); free(txt); return -1; }
        p->calls = c;
        p->cap_calls = cap;
    }
    df_tc_call *c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof *c);
    c->name = nm;
    c->args = txt;
    if (native_id && strlen(native_id) < sizeof c->id) {
        snprintf(c->id, sizeof c->id, "%s", native_id);
    } else {
        static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        uint64_t x = p->c.id_seed ^ (++p->ctr * 0x9e3779b97f4a7c15ull);
        memcpy(c->id, "call_", 5);
        for (int i = 0; i < 24; i++) {
            x += 0x9e3779b97f4a7c15ull;
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            c->id[5 + i] = al[z % 62];
        }
        c->id[29] = 0;
    }
    return 0;
}

/* Hermes / Qwen3: {"name": N, "arguments": {...}} ("arguments" may be a
 * JSON string holding the object). */
static int parse_json_call(df_tc *p, json_t *o, const char *argkey2) {
    json_t *nm = json_object_get(o, "name"), *a = json_object_get(o, "arguments");
    if (!a && argkey2) a = json_object_get(o, argkey2);
    if (!json_is_string(nm)) return -1;
    if (json_is_string(a)) return add_call(p, json_string_value(nm), json_string_length(nm), json_string_value(a),
                                           json_string_length(a), NULL, NULL);
    if (a && !json_is_object(a)) return -1;
    return add_call(p, json_string_value(nm), json_string_length(nm), NULL, 0, a ? json_incref(a) : json_object(), NULL);
}

/* K3 attribute value: &quot; and &amp; unescaped. */
static char *k3_attr(const char *s, size_t n, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "%s=\"", key);
    const char *a = find(s, n, pat);
    if (!a) return NULL;
    a += strlen(pat);
    const char *e = memchr(a, '"', (size_t)(s + n - a));
    if (!e) return NULL;
    df_buf b = {0};
    for (const char *q = a; q < e;) {
        if (!strncmp(q, "&quot;", 6) && q + 6 <= e) { df_buf_put(&b, "\"", 1); q += 6; }
        else if (!strncmp(q, "&amp;", 5) && q + 5 <= e) { df_buf_put(&b, "&", 1); q += 5; }
        else df_buf_put(&b, q++, 1);
    }
    df_buf_put(&b, "", 1);
    return b.p;
}

/* K3: body after "<|open|>call": ` tool="N" index="I"<|sep|>` then
 * `<|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>`... or
 * `<|open|>json type="object"<|sep|>RAW<|close|>json<|sep|>`. */
static int parse_k3(df_tc *p, const char *s, size_t n) {
    const char *sep = find(s, n, "<|sep|>");
    if (!sep) return -1;
    char *name = k3_attr(s, (size_t)(sep - s), "tool");
    if (!name) return -1;
    const char *q = sep + 7, *end = s + n;
    json_t *args = json_object();
    int rc = 0;
    while (!rc) {
        while (q < end && isspace((unsigned char)*q)) q++;
        if (q == end) break;
        if (!strncmp(q, "<|open|>argument", 16) || !strncmp(q, "<|open|>json", 12)) {
            int js = q[8] == 'j';
            const char *hs = find(q, (size_t)(end - q), "<|sep|>");
            const char *close = js ? "<|close|>json<|sep|>" : "<|close|>argument<|sep|>";
            const char *ve = hs ? find(hs + 7, (size_t)(end - hs - 7), close) : NULL;
            if (!ve) { rc = -1; break; }
            const char *v = hs + 7;
            if (js) {
                json_t *o = json_loadb(v, (size_t)(ve - v), 0, NULL);
                if (!json_is_object(o)) { json_decref(o); rc = -1; break; }
                json_object_update(args, o);
                json_decref(o);
            } else {
                char *key = k3_attr(q, (size_t)(hs - q), "key"), *type = k3_attr(q, (size_t)(hs - q), "type");
                json_t *val = NULL;
                if (key && type && !strcmp(type, "string")) val = json_stringn(v, (size_t)(ve - v));
                else if (key) val = json_loadb(v, (size_t)(ve - v), JSON_DECODE_ANY, NULL);
                if (val) json_object_set_new(args, key, val);
                else rc = -1;
                free(key);
                free(type);
            }
            q = ve + strlen(close);
        } else {
            rc = -1;
        }
    }
    if (!rc) rc = add_call(p, name, strlen(name), NULL, 0, args, NULL);
    else json_decref(args);
    free(name);
    return rc;
}

/* One complete call body (between the family's call markers). */
static int parse_call(df_tc *p, const char *s, size_t n) {
    switch (p->c.fam) {
    case DF_TC_HERMES: {
        json_t *o = json_loadb(s, n, 0, NULL);
        int rc = json_is_object(o) ? parse_json_call(p, o, NULL) : -1;
        json_decref(o);
        return rc;
    }
    case DF_TC_DEEPSEEK: { /* "function<sep>NAME\n```json\nARGS\n```" (V3, R1) or "NAME<sep>ARGS" (V3.1) */
        const char *sep = find(s, n, DS_SEP);
        if (!sep) return -1;
        const char *l = s, *r = sep + strlen(DS_SEP);
        size_t ll = (size_t)(sep - s), rl = (size_t)(s + n - r);
        trim(&l, &ll);
        if (ll == 8 && !memcmp(l, "function", 8)) {
            const char *nl = memchr(r, '\n', rl);
            if (!nl) return -1;
            const char *name = r, *a = nl + 1;
            size_t nlen = (size_t)(nl - r), al = (size_t)(s + n - a);
            trim(&a, &al);
            if (al >= 7 && !memcmp(a, "```json", 7)) a += 7, al -= 7;
            else if (al >= 3 && !memcmp(a, "```", 3)) a += 3, al -= 3;
            if (al >= 3 && !memcmp(a + al - 3, "```", 3)) al -= 3;
            return add_call(p, name, nlen, a, al, NULL, NULL);
        }
        return add_call(p, l, ll, r, rl, NULL, NULL);
    }
    case DF_TC_KIMI_K2: { /* "functions.NAME:IDX<|tool_call_argument_begin|>ARGS" */
        const char *ab = find(s, n, "<|tool_call_argument_begin|>");
        if (!ab) return -1;
        const char *id = s;
        size_t il = (size_t)(ab - s);
        trim(&id, &il);
        const char *name = id;
        size_t nl = il;
        if (nl > 10 && !memcmp(name, "functions.", 10)) name += 10, nl -= 10;
        const char *colon = NULL;
        for (size_t i = nl; i-- > 0;)
            if (name[i] == ':') { colon = name + i; break; }
        if (colon) {
            int digits = colon + 1 < name + nl;
            for (const char *q = colon + 1; q < name + nl; q++) digits &= isdigit((unsigned char)*q) != 0;
            if (digits) nl = (size_t)(colon - name);
        }
        char *nid = il < 64 ? dupn(id, il) : NULL;
        const char *a = ab + 28;
        int rc = add_call(p, name, nl, a, (size_t)(s + n - a), NULL, nid);
        free(nid);
        return rc;
    }
    case DF_TC_KIMI_K3: return parse_k3(p, s, n);
    default: return -1;
    }
}

/* TAIL families: the whole rest of the output holds the calls. */
static int parse_tail(df_tc *p, const char *s, size_t n) {
    trim(&s, &n);
    size_t before = p->n_calls;
    int rc = -1;
    if (p->c.fam == DF_TC_LLAMA3) {
        if (n >= 14 && !memcmp(s, "<|python_tag|>", 14)) s += 14, n -= 14;
        json_t *o = json_loadb(s, n, 0, NULL);
        if (json_is_object(o)) rc = parse_json_call(p, o, "parameters");
        json_decref(o);
    } else if (p->c.fam == DF_TC_MISTRAL) {
        s += 12, n -= 12; /* [TOOL_CALLS] */
        trim(&s, &n);
        json_t *o = json_loadb(s, n, 0, NULL);
        if (json_is_array(o) && json_array_size(o)) { /* [{"name", "arguments"}, ...] */
            size_t i;
            json_t *e;
            rc = 0;
            json_array_foreach(o, i, e) if (rc || !json_is_object(e) || parse_json_call(p, e, NULL)) rc = -1;
        } else { /* NAME[ARGS]{...}, repeated with [TOOL_CALLS] */
            rc = 0;
            while (!rc && n) {
                const char *a = find(s, n, "[ARGS]");
                if (!a) { rc = -1; break; }
                const char *next = find(a, (size_t)(s + n - a), "[TOOL_CALLS]");
                const char *ae = next ? next : s + n;
                rc = add_call(p, s, (size_t)(a - s), a + 6, (size_t)(ae - a - 6), NULL, NULL);
                if (!next) break;
                n -= (size_t)(next + 12 - s);
                s = next + 12;
            }
        }
        json_decref(o);
    }
    if (rc) { /* all or nothing */
        while (p->n_calls > before) {
            p->n_calls--;
            free(p->calls[p->n_calls].name);
            free(p->calls[p->n_calls].args);
        }
    }
    return rc;
}

/* Markers searched in TEXT; *which: 0 think, 1 section/call, 2 drop, 3 tail. */
static const char *text_marker(const df_tc *p, const char *s, size_t n, size_t *mlen, int *which, size_t *hold) {
    const char *best = NULL;
    const char *cands[8];
    int kinds[8], k = 0;
    if (p->c.think) cands[k] = p->sp->think_open, kinds[k++] = 0;
    if (p->c.tools && (p->sp->sec_open || p->sp->call_open))
        cands[k] = p->sp->sec_open ? p->sp->sec_open : p->sp->call_open, kinds[k++] = 1;
    if (p->c.tools && p->sp->tail_open) cands[k] = p->sp->tail_open, kinds[k++] = 3;
    for (int i = 0; p->sp->drop[i] && k < 8; i++) cands[k] = p->sp->drop[i], kinds[k++] = 2;
    *hold = 0;
    for (int i = 0; i < k; i++) {
        const char *f = find(s, n, cands[i]);
        if (f && (!best || f < best)) { best = f; *mlen = strlen(cands[i]); *which = kinds[i]; }
        size_t h = partial(s, n, cands[i]);
        if (h > *hold) *hold = h;
    }
    return best;
}

static void run(df_tc *p, int final) {
    df_buf *b = &p->pend;
    for (;;) {
        const char *s = b->p ? b->p : ""; /* nothing fed yet: no buffer */
        size_t n = b->len;
        if (p->state == ST_TEXT) {
            /* Llama 3: a call is the whole output, starting with '{' */
            if (p->c.tools && p->c.fam == DF_TC_LLAMA3 && !p->started) {
                size_t i = 0;
                while (i < n && isspace((unsigned char)s[i])) i++;
                if (i < n && s[i] == '{') { p->state = ST_TAIL; continue; }
                if (i == n && !final) return;
            }
            size_t ml = 0, hold = 0;
            int which = 0;
            const char *m = n ? text_marker(p, s, n, &ml, &which, &hold) : NULL;
            if (!m) {
                size_t keep = final ? 0 : hold;
                put_content(p, s, n - keep);
                buf_take(b, n - keep);
                return;
            }
            if (which == 3) { /* the rest is calls (or, if they do not parse, content) */
                put_content(p, s, (size_t)(m - s));
                buf_take(b, (size_t)(m - s));
                p->state = ST_TAIL;
                continue;
            }
            put_content(p, s, (size_t)(m - s));
            if (which == 1) {
                if (p->sp->sec_open) { p->state = ST_SECTION; buf_take(b, (size_t)(m - s) + ml); }
                else { p->state = ST_CALL; p->in_section = 0; buf_take(b, (size_t)(m - s)); }
            } else {
                buf_take(b, (size_t)(m - s) + ml);
                if (which == 0) p->state = ST_THINK;
            }
            continue;
        }
        if (p->state == ST_THINK) {
            const char *m = find(s, n, p->sp->think_close);
            if (!m) {
                size_t keep = final ? 0 : partial(s, n, p->sp->think_close);
                put_reasoning(p, s, n - keep);
                buf_take(b, n - keep);
                return;
            }
            put_reasoning(p, s, (size_t)(m - s));
            buf_take(b, (size_t)(m - s) + strlen(p->sp->think_close));
            p->state = ST_TEXT;
            p->lead = 1;
            continue;
        }
        if (p->state == ST_SECTION) { /* between calls: whitespace, a call, or the end of the section */
            size_t i = 0;
            while (i < n && isspace((unsigned char)s[i])) i++;
            size_t co = strlen(p->sp->call_open), sc = strlen(p->sp->sec_close), r = n - i;
            if (r >= sc && !memcmp(s + i, p->sp->sec_close, sc)) {
                buf_take(b, i + sc);
                p->state = ST_TEXT;
                p->lead = 1;
                continue;
            }
            if (r >= co && !memcmp(s + i, p->sp->call_open, co)) {
                buf_take(b, i);
                p->state = ST_CALL;
                p->in_section = 1;
                continue;
            }
            if (!final && ((r < co && !memcmp(s + i, p->sp->call_open, r)) || (r < sc && !memcmp(s + i, p->sp->sec_close, r))))
                return; /* undecided */
            if (!final && !r) return;
            /* something else: the section is over, the rest is content */
            p->state = ST_TEXT;
            continue;
        }
        if (p->state == ST_CALL) { /* pend starts with call_open */
            size_t co = strlen(p->sp->call_open), cc = strlen(p->sp->call_close);
            size_t from = p->scan > co + cc ? p->scan - cc + 1 : co; /* a long call is not searched again from its start */
            const char *m = find(s + from, n - from, p->sp->call_close);
            if (!m) {
                p->scan = n;
                if (!final) return;
                put_content(p, s, n); /* unfinished: content as it is */
                buf_take(b, n);
                p->scan = 0;
                p->state = ST_TEXT;
                continue;
            }
            p->scan = 0;
            size_t end = (size_t)(m - s) + cc;
            if (parse_call(p, s + co, (size_t)(m - s) - co)) put_content(p, s, end); /* malformed: content */
            buf_take(b, end);
            p->state = p->in_section ? ST_SECTION : ST_TEXT;
            continue;
        }
        /* ST_TAIL */
        if (!final) return;
        if (n && parse_tail(p, s, n)) put_content(p, s, n);
        buf_take(b, n);
        p->state = ST_TEXT;
        return;
    }
}

void df_tc_feed(df_tc *p, const char *s, size_t n) {
    if (!n) return;
    df_buf_put(&p->pend, s, n);
    run(p, 0);
}

void df_tc_finish(df_tc *p) {
    run(p, 1);
    if (p->pend.len) { /* cannot happen: every state decides at the end */
        put_content(p, p->pend.p, p->pend.len);
        p->pend.len = 0;
    }
}

const char *df_tc_content(const df_tc *p, size_t *len) {
    *len = p->content.len;
    return p->content.p ? p->content.p : "";
}
const char *df_tc_reasoning(const df_tc *p, size_t *len) {
    *len = p->reasoning.len;
    return p->reasoning.p ? p->reasoning.p : "";
}
size_t df_tc_n_calls(const df_tc *p) { return p->n_calls; }
const df_tc_call *df_tc_call_at(const df_tc *p, size_t i) { return i < p->n_calls ? &p->calls[i] : NULL; }

/* ---- the grammar of a call ---------------------------------------------- */

/* A GBNF string literal: "..." with \" \\ \n \r \t escaped. */
static void lit(df_buf *b, const char *s) {
    df_buf_put(b, "\"", 1);
    for (; *s; s++) {
        switch (*s) {
        case '"': df_buf_puts(b, "\\\""); break;
        case '\\': df_buf_puts(b, "\\\\"); break;
        case '\n': df_buf_puts(b, "\\n"); break;
        case '\r': df_buf_puts(b, "\\r"); break;
        case '\t': df_buf_puts(b, "\\t"); break;
        default: df_buf_put(b, s, 1);
        }
    }
    df_buf_put(b, "\"", 1);
}

/* The JSON object of a call, {"name": "NAME", "<key>": ARGS}, with the
 * whitespace JSON allows between its tokens (rule <prefix>ws): the layout is
 * the model's choice, as the parser accepts any (a model pushed into one
 * layout it would not write is pushed off its own distribution). */
static void json_call(df_buf *b, const char *name, const char *key, const char *args, const char *prefix) {
    char ws[80], q[160];
    snprintf(ws, sizeof ws, " %sws ", prefix);
    lit(b, "{");
    df_buf_puts(b, ws);
    lit(b, "\"name\"");
    df_buf_puts(b, ws);
    lit(b, ":");
    df_buf_puts(b, ws);
    snprintf(q, sizeof q, "\"%s\"", name);
    lit(b, q);
    df_buf_puts(b, ws);
    lit(b, ",");
    df_buf_puts(b, ws);
    snprintf(q, sizeof q, "\"%s\"", key);
    lit(b, q);
    df_buf_puts(b, ws);
    lit(b, ":");
    df_buf_puts(b, ws);
    df_buf_puts(b, args);
    df_buf_puts(b, ws);
    lit(b, "}");
}

/* One alternative of <prefix>call: tool i named name, in the family's syntax. */
static void call_alt(df_buf *b, df_tc_family fam, const char *name, size_t i, const char *prefix) {
    char args[160], pre[256], post[256], ws[80];
    snprintf(args, sizeof args, " %st%zu-root ", prefix, i);
    snprintf(ws, sizeof ws, " %sws ", prefix);
    switch (fam) {
    case DF_TC_HERMES: /* <tool_call>\n{...}\n</tool_call>, as Qwen3's template writes it, any JSON whitespace */
        lit(b, "<tool_call>");
        df_buf_puts(b, ws);
        json_call(b, name, "arguments", args, prefix);
        df_buf_puts(b, ws);
        lit(b, "</tool_call>");
        return;
    case DF_TC_LLAMA3:
        json_call(b, name, "parameters", args, prefix);
        return;
    case DF_TC_MISTRAL:
        json_call(b, name, "arguments", args, prefix);
        return;
    case DF_TC_DEEPSEEK:
        snprintf(pre, sizeof pre, DS_CALL_OPEN "function" DS_SEP "%s\n```json\n", name);
        snprintf(post, sizeof post, "\n```" DS_CALL_CLOSE);
        break;
    case DF_TC_KIMI_K2:
        snprintf(pre, sizeof pre, "<|tool_call_begin|>functions.%s:", name);
        snprintf(post, sizeof post, "<|tool_call_end|>");
        break;
    default: /* KIMI_K3 */
        snprintf(pre, sizeof pre, "<|open|>call tool=\"%s\" index=\"", name);
        snprintf(post, sizeof post, "<|close|>json<|sep|><|close|>call<|sep|>");
        break;
    }
    lit(b, pre);
    if (fam == DF_TC_KIMI_K2) df_buf_puts(b, " [0-9]+ \"<|tool_call_argument_begin|>\"");
    if (fam == DF_TC_KIMI_K3) df_buf_puts(b, " [1-9] [0-9]* \"\\\"<|sep|><|open|>json type=\\\"object\\\"<|sep|>\"");
    df_buf_puts(b, args);
    lit(b, post);
}

int df_toolcall_grammar(df_tc_family fam, const char *tools_json, const char *named, int parallel, const char *prefix,
                        df_buf *out, char *err, size_t errlen) {
    if (!prefix) prefix = "";
    if (fam == DF_TC_NONE || (unsigned)fam > DF_TC_MISTRAL)
        return df_err(err, errlen, DF_EUNSUPPORTED, "tool calls: the model's chat template has no tool call syntax Deltafin knows");
    json_t *tools = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
    if (!json_is_array(tools) || !json_array_size(tools)) {
        json_decref(tools);
        return df_err(err, errlen, DF_EINPUT, "tools: expected a non-empty array of tools");
    }
    df_buf alts = {0};
    size_t i, n = 0;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *nm = json_object_get(json_object_get(t, "function"), "name");
        if (!json_is_string(nm)) nm = json_object_get(t, "name");
        const char *name = json_string_value(nm);
        int ok = name && *name && strlen(name) <= 64;
        for (const char *q = name; ok && *q; q++) ok = isalnum((unsigned char)*q) || *q == '_' || *q == '-';
        if (!ok) {
            df_buf_free(&alts);
            json_decref(tools);
            return df_err(err, errlen, DF_EINPUT, "tools[%zu]: the name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i);
        }
        if (named && strcmp(named, name)) continue;
        df_buf_puts(&alts, n++ ? "\n    | " : "");
        call_alt(&alts, fam, name, i, prefix);
    }
    json_decref(tools);
    if (!n) {
        df_buf_free(&alts);
        return df_err(err, errlen, DF_EINPUT, "tool_choice: no tool named '%.64s'", named ? named : "");
    }
    char call[96], many[256];
    snprintf(call, sizeof call, "%scall", prefix);
    /* several calls: separated by a newline (as the templates render them), Mistral's by commas */
    if (parallel) snprintf(many, sizeof many, "%s (%s %s)*", call, fam == DF_TC_MISTRAL ? "\",\"" : "\"\\n\"", call);
    else snprintf(many, sizeof many, "%s", call);
    switch (fam) {
    case DF_TC_HERMES:
        df_buf_printf(out, "root ::= %s\n", many);
        break;
    case DF_TC_DEEPSEEK:
        df_buf_puts(out, "root ::= ");
        lit(out, DS_SEC_OPEN);
        df_buf_printf(out, " %s ", many);
        lit(out, DS_SEC_CLOSE);
        df_buf_puts(out, "\n");
        break;
    case DF_TC_KIMI_K2:
        df_buf_printf(out, "root ::= \"<|tool_calls_section_begin|>\" %s%s \"<|tool_calls_section_end|>\"\n", call,
                      parallel ? "+" : "");
        break;
    case DF_TC_KIMI_K3:
        df_buf_printf(out, "root ::= \"<|open|>tools<|sep|>\" %s%s \"<|close|>tools<|sep|>\"\n", call, parallel ? "+" : "");
        break;
    case DF_TC_LLAMA3:
        df_buf_printf(out, "root ::= %s\n", call);
        break;
    default: /* MISTRAL */
        df_buf_printf(out, "root ::= \"[TOOL_CALLS][\" %s \"]\"\n", many);
        break;
    }
    df_buf_printf(out, "%s ::= ", call);
    df_buf_put(out, alts.p, alts.len);
    df_buf_puts(out, "\n");
    /* JSON whitespace between a call's tokens, bounded so that a model cannot loop on it */
    df_buf_printf(out, "%sws ::= [ \\t\\n\\r]{0,8}\n", prefix);
    df_buf_free(&alts);
    return 0;
}
