/* template_print.c - output buffer, Python str()/repr() and json.dumps of
 * template values, and values built from JSON (jansson).
 *
 * Invariants: printing follows CPython exactly for the JSON-like types
 * (None, bool, int, float repr with shortest round-trip digits, str, list,
 * tuple, dict); nesting is bounded through tv_enter / tv_leave.
 */
#include "tok/template_int.h"

#include "deltafin.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- output buffer ---------------------------------------------------- */

void tout_put(tctx *R, tout *o, const char *p, size_t n) {
    if (!n) return;
    if (R->max_output && (n > R->max_output || o->len + n > R->max_output))
        tfail(R, DF_EINPUT, "output budget of %zu bytes exceeded", R->max_output);
    tcharge_bytes(R, n);
    if (o->len + n + 1 > o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        while (nc < o->len + n + 1) nc *= 2;
        char *q;
        if (o->in_arena) {
            q = ta_alloc(R, &R->A, nc);
            if (o->len) memcpy(q, o->p, o->len);
        } else {
            q = realloc(o->p, nc);
        }
        if (!q) tfail(R, DF_ENOMEM, "out of memory rendering the template");
        o->p = q;
        o->cap = nc;
    }
    memcpy(o->p + o->len, p, n);
    o->len += n;
    o->p[o->len] = 0;
}
static void tout_s(tctx *R, tout *o, const char *s) { tout_put(R, o, s, strlen(s)); }

/* ---- printing ----------------------------------------------------------- */

void float_repr(double f, char *buf) {
    if (isnan(f)) { strcpy(buf, "nan"); return; }
    if (isinf(f)) { strcpy(buf, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { strcpy(buf, signbit(f) ? "-0.0" : "0.0"); return; }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d[.ddd]e[+-]xx */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') { neg = 1; p++; }
    while (*p && *p != 'e') {
        if (*p != '.') digits[nd++] = *p;
        p++;
    }
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(p + 1);
    int decpt = exp10 + 1;
    char *o = buf;
    if (neg) *o++ = '-';
    if (decpt > 16 || decpt < -3) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        return;
    }
    if (decpt <= 0) {
        *o++ = '0'; *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, digits, nd);
        o += nd;
    } else if (decpt >= nd) {
        memcpy(o, digits, nd);
        o += nd;
        for (int i = nd; i < decpt; i++) *o++ = '0';
        *o++ = '.'; *o++ = '0';
    } else {
        memcpy(o, digits, decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, digits + decpt, nd - decpt);
        o += nd - decpt;
    }
    *o = 0;
}

static void str_repr(tctx *R, tout *o, const char *s, size_t n) {
    tcharge(R, (uint64_t)n * (TPL_SCAN_UNITS / 2)); /* per code point */
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    tout_put(R, o, &q, 1);
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = u8_dec(s + i, n - i, &cp);
        const char *esc = NULL;
        char eb[16];
        if (cp == (uint32_t)q || cp == '\\') { eb[0] = '\\'; eb[1] = (char)cp; eb[2] = 0; esc = eb; }
        else if (cp == '\n') esc = "\\n";
        else if (cp == '\r') esc = "\\r";
        else if (cp == '\t') esc = "\\t";
        else if (!u_isprintable(cp)) {
            if (cp < 0x100) snprintf(eb, sizeof eb, "\\x%02x", cp);
            else if (cp < 0x10000) snprintf(eb, sizeof eb, "\\u%04x", cp);
            else snprintf(eb, sizeof eb, "\\U%08x", cp);
            esc = eb;
        }
        if (esc) {
            tout_put(R, o, s + i - run, run);
            run = 0;
            tout_s(R, o, esc);
        } else {
            run += l;
        }
        i += l;
    }
    tout_put(R, o, s + n - run, run);
    tout_put(R, o, &q, 1);
}

static void seq_repr(tctx *R, tout *o, const tv *v) {
    const char *open = "[", *close = "]";
    if (v->sub == TL_TUPLE) { open = "("; close = v->l->n == 1 ? ",)" : ")"; }
    else if (v->sub == TL_ITEMS) { open = "dict_items(["; close = "])"; }
    else if (v->sub == TL_KEYS) { open = "dict_keys(["; close = "])"; }
    else if (v->sub == TL_VALUES) { open = "dict_values(["; close = "])"; }
    tout_s(R, o, open);
    for (size_t i = 0; i < v->l->n; i++) {
        if (i) tout_s(R, o, ", ");
        tv_repr_into(R, o, &v->l->v[i]);
    }
    tout_s(R, o, close);
}

static void dict_repr(tctx *R, tout *o, const tdict *d) {
    tout_s(R, o, "{");
    for (size_t i = 0; i < d->n; i++) {
        if (i) tout_s(R, o, ", ");
        tv_repr_into(R, o, &d->k[i]);
        tout_s(R, o, ": ");
        tv_repr_into(R, o, &d->v[i]);
    }
    tout_s(R, o, "}");
}

static void other_str(tctx *R, tout *o, const tv *v) {
    char b[96];
    switch (v->t) {
    case TV_NONE: tout_s(R, o, "None"); break;
    case TV_BOOL: tout_s(R, o, v->b ? "True" : "False"); break;
    case TV_INT: snprintf(b, sizeof b, "%lld", (long long)v->i); tout_s(R, o, b); break;
    case TV_FLOAT: float_repr(v->f, b); tout_s(R, o, b); break;
    case TV_LIST: case TV_DICT: case TV_NS:
        tv_enter(R);
        if (v->t == TV_LIST) seq_repr(R, o, v);
        else if (v->t == TV_DICT) dict_repr(R, o, v->d);
        else { tout_s(R, o, "<Namespace "); dict_repr(R, o, v->d); tout_s(R, o, ">"); }
        tv_leave(R);
        break;
    case TV_LOOP: tout_s(R, o, "<LoopContext>"); break;
    case TV_MACRO: snprintf(b, sizeof b, "<Macro '%.*s'>", (int)(v->macro->len > 40 ? 40 : v->macro->len), v->macro->str); tout_s(R, o, b); break;
    case TV_FUNC: tout_s(R, o, "<function>"); break;
    case TV_METHOD: snprintf(b, sizeof b, "<built-in method %.40s of %s object>", v->m->name, tv_typename(&v->m->self)); tout_s(R, o, b); break;
    default: break;
    }
}

void tv_str_into(tctx *R, tout *o, const tv *v) {
    if (v->t == TV_STR) tout_put(R, o, v->s.p, v->s.n);
    else if (v->t == TV_UNDEF) return;
    else other_str(R, o, v);
}

void tv_repr_into(tctx *R, tout *o, const tv *v) {
    if (v->t == TV_STR) {
        if (v->sub == TS_MARKUP) tout_s(R, o, "Markup(");
        str_repr(R, o, v->s.p, v->s.n);
        if (v->sub == TS_MARKUP) tout_s(R, o, ")");
    } else if (v->t == TV_UNDEF) tout_s(R, o, "Undefined");
    else other_str(R, o, v);
}

tv tv_to_str(tctx *R, const tv *v) {
    if (v->t == TV_STR) { tv r = *v; r.sub = TS_PLAIN; return r; }
    if (v->t == TV_UNDEF) return tv_str("", 0);
    if (v->t == TV_BOOL) return tv_cstr(v->b ? "True" : "False");
    if (v->t == TV_NONE) return tv_cstr("None");
    tout o = {0};
    o.in_arena = 1;
    tv_str_into(R, &o, v);
    return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
}

/* ---- JSON ---------------------------------------------------------------- */

static void json_str(tctx *R, tout *o, const char *s, size_t n, int ascii) {
    tcharge(R, (uint64_t)n * (TPL_SCAN_UNITS / 2)); /* per code point */
    tout_s(R, o, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = u8_dec(s + i, n - i, &cp);
        char eb[16];
        const char *esc = NULL;
        switch (cp) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (cp < 0x20 || (ascii && cp >= 0x7F)) {
                if (cp >= 0x10000) {
                    uint32_t c = cp - 0x10000;
                    snprintf(eb, sizeof eb, "\\u%04x\\u%04x", 0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF));
                } else {
                    snprintf(eb, sizeof eb, "\\u%04x", cp);
                }
                esc = eb;
            }
        }
        if (esc) {
            tout_put(R, o, s + i - run, run);
            run = 0;
            tout_s(R, o, esc);
        } else {
            run += l;
        }
        i += l;
    }
    tout_put(R, o, s + n - run, run);
    tout_s(R, o, "\"");
}

static void json_indent(tctx *R, tout *o, const tjson_opts *opt, int level) {
    tout_s(R, o, "\n");
    for (int i = 0; i < level; i++) tout_put(R, o, opt->indent, opt->indent_n);
}

static void json_key(tctx *R, tout *o, const tv *k, const tjson_opts *opt) {
    char b[40];
    switch (k->t) {
    case TV_STR: json_str(R, o, k->s.p, k->s.n, opt->ensure_ascii); return;
    case TV_INT: snprintf(b, sizeof b, "\"%lld\"", (long long)k->i); tout_s(R, o, b); return;
    case TV_BOOL: tout_s(R, o, k->b ? "\"true\"" : "\"false\""); return;
    case TV_NONE: tout_s(R, o, "\"null\""); return;
    case TV_FLOAT: b[0] = '"'; float_repr(k->f, b + 1); strcat(b, "\""); tout_s(R, o, b); return;
    default: tfail(R, DF_EINPUT, "keys must be str, int, float, bool or None, not %s", tv_typename(k));
    }
}

void tv_json_into(tctx *R, tout *o, const tv *v, const tjson_opts *opt, int level) {
    char b[40];
    if (level > TPL_MAX_NEST) tfail(R, DF_EINPUT, "tojson: value nesting deeper than %d levels", TPL_MAX_NEST);
    switch (v->t) {
    case TV_NONE: tout_s(R, o, "null"); return;
    case TV_BOOL: tout_s(R, o, v->b ? "true" : "false"); return;
    case TV_INT: snprintf(b, sizeof b, "%lld", (long long)v->i); tout_s(R, o, b); return;
    case TV_FLOAT:
        if (isnan(v->f)) tout_s(R, o, "NaN");
        else if (isinf(v->f)) tout_s(R, o, v->f < 0 ? "-Infinity" : "Infinity");
        else { float_repr(v->f, b); tout_s(R, o, b); }
        return;
    case TV_STR: json_str(R, o, v->s.p, v->s.n, opt->ensure_ascii); return;
    case TV_LIST:
        if (v->sub != TL_LIST && v->sub != TL_TUPLE) break;
        if (!v->l->n) { tout_s(R, o, "[]"); return; }
        tout_s(R, o, "[");
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) tout_put(R, o, opt->item_sep, opt->item_sep_n);
            if (opt->has_indent) json_indent(R, o, opt, level + 1);
            tv_json_into(R, o, &v->l->v[i], opt, level + 1);
        }
        if (opt->has_indent) json_indent(R, o, opt, level);
        tout_s(R, o, "]");
        return;
    case TV_DICT: {
        const tdict *d = v->d;
        if (!d->n) { tout_s(R, o, "{}"); return; }
        size_t *ord = ta_alloc(R, &R->A, d->n * sizeof(size_t));
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (opt->sort_keys) {
            /* stable insertion sort by key (small dicts; keys must be mutually orderable) */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = ord[i], j = i;
                while (j > 0 && tv_cmp(R, &d->k[ord[j - 1]], &d->k[x], "<") > 0) { ord[j] = ord[j - 1]; j--; }
                ord[j] = x;
                tcharge_items(R, i - j + 1); /* quadratic on big dicts: charged per comparison */
            }
        }
        tout_s(R, o, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i) tout_put(R, o, opt->item_sep, opt->item_sep_n);
            if (opt->has_indent) json_indent(R, o, opt, level + 1);
            json_key(R, o, &d->k[ord[i]], opt);
            tout_put(R, o, opt->key_sep, opt->key_sep_n);
            tv_json_into(R, o, &d->v[ord[i]], opt, level + 1);
        }
        if (opt->has_indent) json_indent(R, o, opt, level);
        tout_s(R, o, "}");
        return;
    }
    default: break;
    }
    tfail(R, DF_EINPUT, "Object of type %s is not JSON serializable", tv_typename(v));
}

tv tv_from_json(tctx *R, const void *jp) {
    const json_t *j = jp;
    if ((json_is_array(j) || json_is_object(j)) && R->rdepth >= TPL_MAX_NEST)
        tfail(R, DF_EINPUT, "chat context (messages, tools or variables) nested deeper than %d levels", TPL_MAX_NEST);
    switch (json_typeof(j)) {
    case JSON_NULL: return tv_none();
    case JSON_TRUE: return tv_bool(1);
    case JSON_FALSE: return tv_bool(0);
    case JSON_INTEGER: return tv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return tv_float(json_real_value(j));
    case JSON_STRING: return tv_strdup(R, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tv l = tv_list(R, n, TL_LIST);
        tv_enter(R);
        for (size_t i = 0; i < n; i++) l.l->v[i] = tv_from_json(R, json_array_get(j, i));
        tv_leave(R);
        return tv_seal(R, l);
    }
    case JSON_OBJECT: {
        tv d = tv_dict(R, json_object_size(j) + 1);
        tv_enter(R);
        for (void *it = json_object_iter((json_t *)j); it; it = json_object_iter_next((json_t *)j, it)) {
            d.d->k[d.d->n] = tv_strdup(R, json_object_iter_key(it), json_object_iter_key_len(it));
            d.d->v[d.d->n] = tv_from_json(R, json_object_iter_value(it));
            d.d->n++;
        }
        tv_leave(R);
        return tv_seal(R, d);
    }
    }
    return tv_none();
}
