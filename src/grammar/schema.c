/* schema.c - JSON Schema (the subset of docs/GRAMMAR.md, a superset of what
 * OpenAI's strict mode accepts) to grammar rules.
 *
 * Each subschema becomes one rule `<prefix>sN`; $ref targets become
 * `<prefix>refN` (made once, so recursive schemas are recursive rules); the
 * shared JSON rules (`<prefix>ws`, `<prefix>string`, `<prefix>value`, ...)
 * are appended at the end. Every keyword is either enforced or refused
 * (DF_EUNSUPPORTED, naming it and the schema path); annotations (title,
 * description, $comment, default, examples, ...) change no document.
 *
 * Generated documents are a subset of the valid ones: properties come in the
 * schema's order, whitespace is bounded, numbers are bounded in digits,
 * enum/const values are written in compact form (docs/GRAMMAR.md). */
#include "grammar/grammar.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_SCHEMA_BYTES (256u << 10)

typedef struct {
    char *ref, *rule;
} refmap;

typedef struct {
    df_buf *out;
    const char *prefix;
    json_t *root;
    int counter;
    refmap *refs;
    int nrefs;
    char *err;
    size_t errlen;
    int rc;
} conv;

static const char *annotations[] = {"title", "description", "$schema", "$comment", "default", "examples",
                                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};

static int is_annotation(const char *k) {
    for (int i = 0; annotations[i]; i++)
        if (!strcmp(annotations[i], k)) return 1;
    return 0;
}

static int refuse(conv *c, int code, const char *path, const char *fmt, const char *a) {
    if (!c->rc) {
        char msg[200];
        snprintf(msg, sizeof msg, fmt, a);
        c->rc = df_err(c->err, c->errlen, code, "json schema%s%s: %s", *path ? " at " : "", path, msg);
    }
    return c->rc;
}

/* A grammar literal for bytes p[0..n). */
static void lit(df_buf *b, const char *p, size_t n) {
    df_buf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"') df_buf_puts(b, "\\\"");
        else if (ch == '\\') df_buf_puts(b, "\\\\");
        else if (ch < 0x20 || ch == 0x7f) df_buf_printf(b, "\\x%02x", ch);
        else df_buf_put(b, &ch, 1);
    }
    df_buf_puts(b, "\"");
}

/* A JSON value in compact form as a literal. */
static int lit_json(conv *c, df_buf *b, json_t *v, const char *path) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) return refuse(c, DF_ENOMEM, path, "%s", "out of memory");
    lit(b, s, strlen(s));
    free(s);
    return 0;
}

static int gen(conv *c, json_t *s, const char *path, int depth, char *name, size_t nlen);

static void new_name(conv *c, const char *kind, char *name, size_t nlen) {
    snprintf(name, nlen, "%s%s%d", c->prefix, kind, c->counter++);
}

static void emit(conv *c, const char *name, const df_buf *body) {
    df_buf_printf(c->out, "%s ::= ", name);
    df_buf_put(c->out, body->p ? body->p : "", body->len);
    df_buf_puts(c->out, "\n");
}

/* JSON pointer (#/a/b, ~0 ~1 escapes) from the root schema; NULL if absent. */
static json_t *resolve_ref(json_t *root, const char *ref) {
    if (strcmp(ref, "#") == 0) return root;
    if (strncmp(ref, "#/", 2)) return NULL;
    json_t *cur = root;
    const char *p = ref + 2;
    char tok[256];
    while (cur) {
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') { tok[n++] = '~'; p += 2; }
            else if (p[0] == '~' && p[1] == '1') { tok[n++] = '/'; p += 2; }
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *e;
            long i = strtol(tok, &e, 10);
            cur = *tok && !*e ? json_array_get(cur, (size_t)i) : NULL;
        } else cur = NULL;
        if (!*p) break;
        if (*p != '/') return NULL;
        p++;
    }
    return cur;
}

static int get_count(conv *c, json_t *s, const char *key, const char *path, long *v) {
    json_t *x = json_object_get(s, key);
    if (!x) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > DF_GRAMMAR_MAX_REPEAT) {
        char m[120];
        snprintf(m, sizeof m, "'%s' must be an integer 0..%d", key, DF_GRAMMAR_MAX_REPEAT);
        return refuse(c, DF_EUNSUPPORTED, path, "%s", m);
    }
    *v = (long)json_integer_value(x);
    return 1;
}

static void rep(df_buf *b, long mn, long mx) {
    if (mn == 0 && mx < 0) df_buf_puts(b, "*");
    else if (mn == 1 && mx < 0) df_buf_puts(b, "+");
    else if (mx < 0) df_buf_printf(b, "{%ld,}", mn);
    else if (mn == mx) df_buf_printf(b, "{%ld}", mn);
    else df_buf_printf(b, "{%ld,%ld}", mn, mx);
}

static int gen_string(conv *c, json_t *s, const char *path, df_buf *b) {
    long mn = 0, mx = -1;
    if (get_count(c, s, "minLength", path, &mn) < 0 || get_count(c, s, "maxLength", path, &mx) < 0) return c->rc;
    if (mx >= 0 && mx < mn) return refuse(c, DF_EUNSUPPORTED, path, "%s", "maxLength < minLength: no string is valid");
    if (mn == 0 && mx < 0) { df_buf_printf(b, "%sstring", c->prefix); return 0; }
    /* counted characters: no surrogate escapes (a pair is one character in the schema's count, two here) */
    df_buf_printf(b, "\"\\\"\" %scharn", c->prefix);
    rep(b, mn, mx);
    df_buf_puts(b, " \"\\\"\"");
    return 0;
}

static int gen_array(conv *c, json_t *s, const char *path, int depth, df_buf *b) {
    long mn = 0, mx = -1;
    if (get_count(c, s, "minItems", path, &mn) < 0 || get_count(c, s, "maxItems", path, &mx) < 0) return c->rc;
    if (mx >= 0 && mx < mn) return refuse(c, DF_EUNSUPPORTED, path, "%s", "maxItems < minItems: no array is valid");
    char item[128];
    json_t *it = json_object_get(s, "items");
    if (it) {
        char p2[512];
        snprintf(p2, sizeof p2, "%s/items", path);
        if (gen(c, it, p2, depth + 1, item, sizeof item)) return c->rc;
    } else snprintf(item, sizeof item, "%svalue", c->prefix);
    if (mx == 0) { df_buf_printf(b, "\"[\" %sws \"]\"", c->prefix); return 0; }
    df_buf_printf(b, "\"[\" %sws ", c->prefix);
    if (mn == 0) df_buf_puts(b, "(");
    df_buf_printf(b, "%s %sws (\",\" %sws %s %sws)", item, c->prefix, c->prefix, item, c->prefix);
    rep(b, mn ? mn - 1 : 0, mx < 0 ? -1 : mx - 1);
    if (mn == 0) df_buf_puts(b, ")?");
    df_buf_puts(b, " \"]\"");
    return 0;
}

static int gen_object(conv *c, json_t *s, const char *path, int depth, const char *name, df_buf *b) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
           *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return refuse(c, DF_EUNSUPPORTED, path, "%s", "'properties' must be an object");
    if (req && !json_is_array(req)) return refuse(c, DF_EUNSUPPORTED, path, "%s", "'required' must be an array of names");
    size_t n = props ? json_object_size(props) : 0;
    const char **keys = calloc(n + 1, sizeof *keys);
    uint8_t *isreq = calloc(n + 1, 1);
    char (*vals)[128] = calloc(n + 1, sizeof *vals);
    char extra[160] = "";
    int rc = 0;
    if (!keys || !isreq || !vals) { rc = refuse(c, DF_ENOMEM, path, "%s", "out of memory"); goto out; }
    size_t i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) keys[i++] = k; /* jansson keeps insertion order */
    for (size_t r = 0; req && r < json_array_size(req); r++) {
        json_t *x = json_array_get(req, r);
        if (!json_is_string(x)) { rc = refuse(c, DF_EUNSUPPORTED, path, "%s", "'required' must be an array of names"); goto out; }
        size_t j = 0;
        while (j < n && strcmp(keys[j], json_string_value(x))) j++;
        if (j == n) { rc = refuse(c, DF_EUNSUPPORTED, path, "'required' names '%.80s', which is not in 'properties'", json_string_value(x)); goto out; }
        isreq[j] = 1;
    }
    for (i = 0; i < n; i++) {
        char p2[512];
        snprintf(p2, sizeof p2, "%s/properties/%s", path, keys[i]);
        if ((rc = gen(c, json_object_get(props, keys[i]), p2, depth + 1, vals[i], sizeof vals[i]))) goto out;
    }
    if (!addl || json_is_true(addl)) snprintf(extra, sizeof extra, "%svalue", c->prefix);
    else if (json_is_object(addl)) {
        char p2[512];
        snprintf(p2, sizeof p2, "%s/additionalProperties", path);
        if ((rc = gen(c, addl, p2, depth + 1, extra, sizeof extra))) goto out;
    } else if (!json_is_false(addl)) { rc = refuse(c, DF_EUNSUPPORTED, path, "%s", "'additionalProperties' must be a boolean or a schema"); goto out; }
    const char *P = c->prefix;
    /* F_i: the first member among i..n; R_i: the members after one was written */
    for (i = 0; i <= n; i++) {
        df_buf f = {0}, r = {0};
        char fn[200], rn[200];
        if (i < n) {
            df_buf kv = {0};
            json_t *ks = json_string(keys[i]);
            char *kj = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
            json_decref(ks);
            if (!kj) { rc = refuse(c, DF_ENOMEM, path, "%s", "out of memory"); goto out; }
            lit(&kv, kj, strlen(kj));
            free(kj);
            df_buf_printf(&kv, " %sws \":\" %sws %s %sws", P, P, vals[i], P);
            df_buf_printf(&f, "%.*s %s-r%zu", (int)kv.len, kv.p, name, i + 1);
            if (!isreq[i]) df_buf_printf(&f, " | %s-f%zu", name, i + 1);
            if (isreq[i]) df_buf_printf(&r, "\",\" %sws %.*s %s-r%zu", P, (int)kv.len, kv.p, name, i + 1);
            else df_buf_printf(&r, "(\",\" %sws %.*s)? %s-r%zu", P, (int)kv.len, kv.p, name, i + 1);
            df_buf_free(&kv);
        } else if (*extra) {
            df_buf_printf(&f, "%sstring %sws \":\" %sws %s %sws %s-r%zu | \"\"", P, P, P, extra, P, name, n);
            df_buf_printf(&r, "(\",\" %sws %sstring %sws \":\" %sws %s %sws)*", P, P, P, P, extra, P);
        } else {
            df_buf_puts(&f, "\"\"");
            df_buf_puts(&r, "\"\"");
        }
        snprintf(fn, sizeof fn, "%s-f%zu", name, i);
        snprintf(rn, sizeof rn, "%s-r%zu", name, i);
        emit(c, fn, &f);
        emit(c, rn, &r);
        df_buf_free(&f);
        df_buf_free(&r);
    }
    df_buf_printf(b, "\"{\" %sws %s-f0 \"}\"", P, name);
out:
    free(keys);
    free(isreq);
    free(vals);
    return rc;
}

static const char *known_types[] = {"string", "number", "integer", "boolean", "null", "object", "array", NULL};

/* Generates the rule for schema s; its name in name. */
static int gen(conv *c, json_t *s, const char *path, int depth, char *name, size_t nlen) {
    if (c->rc) return c->rc;
    if (depth > MAX_DEPTH) return refuse(c, DF_EUNSUPPORTED, path, "schema nested deeper than %s levels", "64");
    if (json_is_true(s) || (json_is_object(s) && !json_object_size(s))) {
        snprintf(name, nlen, "%svalue", c->prefix);
        return 0;
    }
    if (json_is_false(s)) return refuse(c, DF_EUNSUPPORTED, path, "%s", "schema false matches no document");
    if (!json_is_object(s)) return refuse(c, DF_EUNSUPPORTED, path, "%s", "a schema must be an object or a boolean");
    /* every keyword is enforced or refused */
    static const char *handled[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                    "anyOf", "items", "$ref", "minItems", "maxItems", "minLength", "maxLength", NULL};
    const char *k;
    json_t *v;
    int constraining = 0; /* keywords other than type / annotations */
    json_object_foreach(s, k, v) {
        if (is_annotation(k)) continue;
        int ok = 0;
        for (int i = 0; handled[i]; i++) ok |= !strcmp(handled[i], k);
        if (!ok) {
            if (!strcmp(k, "pattern")) return refuse(c, DF_EUNSUPPORTED, path, "%s", "unsupported keyword 'pattern' (regular expressions are not compiled to grammars yet)");
            if (!strcmp(k, "format")) {
                char m[160];
                snprintf(m, sizeof m, "unsupported keyword 'format' (\"%.60s\")", json_is_string(v) ? json_string_value(v) : "?");
                return refuse(c, DF_EUNSUPPORTED, path, "%s", m);
            }
            return refuse(c, DF_EUNSUPPORTED, path, "unsupported keyword '%.80s'", k);
        }
        if (strcmp(k, "type")) constraining++;
    }
    json_t *ref = json_object_get(s, "$ref"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"),
           *any = json_object_get(s, "anyOf"), *ty = json_object_get(s, "type");
    if (ref) {
        if (!json_is_string(ref)) return refuse(c, DF_EUNSUPPORTED, path, "%s", "'$ref' must be a string");
        if (constraining > 1 || ty) return refuse(c, DF_EUNSUPPORTED, path, "%s", "'$ref' with other constraining keywords is not supported");
        const char *r = json_string_value(ref);
        for (int i = 0; i < c->nrefs; i++)
            if (!strcmp(c->refs[i].ref, r)) { snprintf(name, nlen, "%s", c->refs[i].rule); return 0; }
        json_t *target = resolve_ref(c->root, r);
        if (!target) return refuse(c, DF_EUNSUPPORTED, path, "'$ref' %.100s: expected a JSON pointer into this schema (#/$defs/NAME)", r);
        refmap *t = realloc(c->refs, sizeof *t * (size_t)(c->nrefs + 1));
        if (!t) return refuse(c, DF_ENOMEM, path, "%s", "out of memory");
        c->refs = t;
        char rn[128];
        new_name(c, "ref", rn, sizeof rn);
        c->refs[c->nrefs].ref = strdup(r);
        c->refs[c->nrefs].rule = strdup(rn);
        c->nrefs++;
        snprintf(name, nlen, "%s", rn);
        char inner[128], p2[512];
        snprintf(p2, sizeof p2, "%.200s", r);
        if (gen(c, target, p2, depth + 1, inner, sizeof inner)) return c->rc;
        df_buf body = {0};
        df_buf_puts(&body, inner);
        emit(c, rn, &body);
        df_buf_free(&body);
        return 0;
    }
    /* the types allowed */
    int tmask = 0;
    if (ty) {
        json_t *list = json_is_array(ty) ? ty : NULL;
        size_t nt = list ? json_array_size(list) : 1;
        for (size_t i = 0; i < nt; i++) {
            json_t *t = list ? json_array_get(list, i) : ty;
            int bit = -1;
            for (int j = 0; known_types[j] && json_is_string(t); j++)
                if (!strcmp(known_types[j], json_string_value(t))) bit = j;
            if (bit < 0) return refuse(c, DF_EUNSUPPORTED, path, "'type' %.60s: expected string, number, integer, boolean, null, object, array or a list of them",
                                       json_is_string(t) ? json_string_value(t) : "(not a string)");
            tmask |= 1 << bit;
        }
        if (!tmask) return refuse(c, DF_EUNSUPPORTED, path, "%s", "'type' [] matches no document");
    }
    df_buf body = {0};
    new_name(c, "s", name, nlen);
    if (en || cn) {
        if (constraining > 1) { df_buf_free(&body); return refuse(c, DF_EUNSUPPORTED, path, "%s", "'enum'/'const' with other constraining keywords is not supported"); }
        json_t *vals = en ? en : NULL;
        if (en && !json_is_array(en)) { df_buf_free(&body); return refuse(c, DF_EUNSUPPORTED, path, "%s", "'enum' must be an array"); }
        size_t nv = en ? json_array_size(vals) : 1, used = 0;
        for (size_t i = 0; i < nv; i++) {
            json_t *x = en ? json_array_get(vals, i) : cn;
            if (tmask) { /* the value must also have one of the types */
                int t = json_is_string(x) ? 0 : json_is_integer(x) ? 2 : json_is_real(x) ? 1 : json_is_boolean(x) ? 3
                        : json_is_null(x) ? 4 : json_is_object(x) ? 5 : 6;
                int okt = (tmask >> t & 1) || (t == 2 && (tmask & 2));
                if (!okt) continue;
            }
            if (used++) df_buf_puts(&body, " | ");
            if (lit_json(c, &body, x, path)) { df_buf_free(&body); return c->rc; }
        }
        if (!used) { df_buf_free(&body); return refuse(c, DF_EUNSUPPORTED, path, "%s", "'enum'/'const' has no value of the allowed types: no document is valid"); }
        emit(c, name, &body);
        df_buf_free(&body);
        return 0;
    }
    if (any) {
        if (constraining > 1 || ty) { df_buf_free(&body); return refuse(c, DF_EUNSUPPORTED, path, "%s", "'anyOf' with other constraining keywords is not supported"); }
        if (!json_is_array(any) || !json_array_size(any)) { df_buf_free(&body); return refuse(c, DF_EUNSUPPORTED, path, "%s", "'anyOf' must be a non-empty array"); }
        for (size_t i = 0; i < json_array_size(any); i++) {
            char sub[128], p2[512];
            snprintf(p2, sizeof p2, "%s/anyOf/%zu", path, i);
            if (gen(c, json_array_get(any, i), p2, depth + 1, sub, sizeof sub)) { df_buf_free(&body); return c->rc; }
            df_buf_printf(&body, "%s%s", i ? " | " : "", sub);
        }
        emit(c, name, &body);
        df_buf_free(&body);
        return 0;
    }
    if (!tmask) { /* no type: what the keywords imply, else any value */
        int obj = json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties");
        int arr = json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems");
        int str = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
        if (obj + arr + str > 1) { df_buf_free(&body); return refuse(c, DF_EUNSUPPORTED, path, "%s", "keywords of several types without 'type'"); }
        if (obj) tmask = 1 << 5;
        else if (arr) tmask = 1 << 6;
        else if (str) tmask = 1;
        else { snprintf(name, nlen, "%svalue", c->prefix); c->counter--; df_buf_free(&body); return 0; }
    }
    /* keywords must belong to an allowed type */
    struct { const char *kw; int type; } owner[] = {{"properties", 5}, {"required", 5}, {"additionalProperties", 5},
        {"items", 6}, {"minItems", 6}, {"maxItems", 6}, {"minLength", 0}, {"maxLength", 0}};
    for (size_t i = 0; i < sizeof owner / sizeof *owner; i++)
        if (json_object_get(s, owner[i].kw) && !(tmask >> owner[i].type & 1)) {
            df_buf_free(&body);
            return refuse(c, DF_EUNSUPPORTED, path, "'%s' without its type in 'type'", owner[i].kw);
        }
    int alts = 0;
    for (int t = 0; t < 7; t++) {
        if (!(tmask >> t & 1)) continue;
        if (t == 2 && (tmask & 2)) continue; /* number covers integer */
        if (alts++) df_buf_puts(&body, " | ");
        switch (t) {
        case 0: if (gen_string(c, s, path, &body)) { df_buf_free(&body); return c->rc; } break;
        case 1: df_buf_printf(&body, "%snumber", c->prefix); break;
        case 2: df_buf_printf(&body, "%sinteger", c->prefix); break;
        case 3: df_buf_puts(&body, "\"true\" | \"false\""); break;
        case 4: df_buf_puts(&body, "\"null\""); break;
        case 5:
            if (gen_object(c, s, path, depth, name, &body)) { df_buf_free(&body); return c->rc; }
            break;
        case 6: if (gen_array(c, s, path, depth, &body)) { df_buf_free(&body); return c->rc; } break;
        }
    }
    emit(c, name, &body);
    df_buf_free(&body);
    return 0;
}

int df_json_schema_to_grammar(const char *schema_json, size_t len, const char *prefix, df_buf *out, char *err,
                              size_t errlen) {
    if (!prefix) prefix = "";
    for (const char *p = prefix; *p; p++)
        if (!(((*p | 32) >= 'a' && (*p | 32) <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-' || *p == '.'))
            return df_err(err, errlen, DF_EINPUT, "json schema: rule prefix '%.60s' must be letters, digits, _ - .", prefix);
    if (len > MAX_SCHEMA_BYTES)
        return df_err(err, errlen, DF_EINPUT, "json schema too large: %zu bytes, expected at most %u", len, MAX_SCHEMA_BYTES);
    json_error_t je;
    json_t *root = json_loadb(schema_json, len, JSON_DECODE_ANY, &je);
    if (!root) return df_err(err, errlen, DF_EINPUT, "json schema: not JSON (line %d column %d: %s)", je.line, je.column, je.text);
    conv c = {.out = out, .prefix = prefix, .root = root, .err = err, .errlen = errlen};
    char top[128];
    size_t start = out->len;
    if (!gen(&c, root, "", 0, top, sizeof top)) {
        df_buf_printf(out, "%sroot ::= %s\n", prefix, top);
        const char *P = prefix;
        static const char *common =
            "@ws ::= [ \\t\\n\\r]{0,20}\n"
            "@string ::= \"\\\"\" @char* \"\\\"\"\n"
            "@char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
            "@charn ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))\n"
            "@integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
            "@number ::= @integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
            "@value ::= @object | @array | @string | @number | \"true\" | \"false\" | \"null\"\n"
            "@object ::= \"{\" @ws (@string @ws \":\" @ws @value @ws (\",\" @ws @string @ws \":\" @ws @value @ws)*)? \"}\"\n"
            "@array ::= \"[\" @ws (@value @ws (\",\" @ws @value @ws)*)? \"]\"\n";
        for (const char *q = common; *q; q++) /* @ stands for the prefix */
            if (*q == '@') df_buf_puts(out, P);
            else df_buf_put(out, q, 1);
        if (out->len - start > DF_GRAMMAR_MAX_TEXT)
            c.rc = df_err(err, errlen, DF_EINPUT, "json schema too large: its grammar has %zu bytes, expected at most %u",
                          out->len - start, DF_GRAMMAR_MAX_TEXT);
    }
    for (int i = 0; i < c.nrefs; i++) { free(c.refs[i].ref); free(c.refs[i].rule); }
    free(c.refs);
    json_decref(root);
    if (c.rc) {
        out->len = start;
        if (out->p) out->p[start] = 0;
    }
    return c.rc;
}
