/* template_filters.c - jinja2 filters, sorting, and the list / dict / loop
 * methods of the renderer.
 *
 * Invariants: sort, dictsort, unique, min and max compare jinja2's keys
 * (attribute path, then lower-cased strings unless case_sensitive) with
 * Python's ordering (unorderable types fail); sort and dictsort are stable
 * merge sorts; tojson is transformers'
 * json.dumps(ensure_ascii=False, ...); method work is charged against the
 * step budget per byte or item before it is done.
 */
#include "tok/template_builtins_int.h"

#include "deltafin.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- sorting ------------------------------------------------------------ */

typedef struct { tv key; tv val; } kv;

/* key for sort/unique/min/max: attribute path, then lower-case strings */
static tv attr_path(tctx *R, const tv *item, const tv *attribute) {
    if (!attribute || attribute->t == TV_NONE) return *item;
    if (attribute->t == TV_INT) return tb_getitem(R, item, attribute);
    tv a = want_str(R, attribute, "attribute");
    tv cur = *item;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < a.s.n && a.s.p[j] != '.') j++;
        const char *part = a.s.p + i;
        size_t pl = j - i;
        int digits = pl > 0;
        for (size_t k = 0; k < pl; k++)
            if (part[k] < '0' || part[k] > '9') digits = 0;
        tv key = digits ? tv_int(strtoll(part, NULL, 10)) : tv_str(part, pl);
        cur = tb_getitem(R, &cur, &key);
        if (j >= a.s.n) break;
        i = j + 1;
    }
    return cur;
}

static tv sort_key(tctx *R, const tv *item, const tv *attribute, int case_sensitive) {
    tv k = attr_path(R, item, attribute);
    if (!case_sensitive && k.t == TV_STR) k = tb_str_map(R, k, u_lower);
    return k;
}

static void merge_sort(tctx *R, kv *a, size_t n, int reverse) {
    if (n < 2) return;
    kv *tmp = ta_alloc(R, &R->A, n * sizeof(kv));
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = tv_cmp(R, &a[j].key, &a[i].key, "<");
                if (reverse) c = -c;
                if (c < 0) tmp[k++] = a[j++];
                else tmp[k++] = a[i++];
            }
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        memcpy(a, tmp, n * sizeof(kv));
    }
}

/* ---- methods ------------------------------------------------------------ */

static tv list_from(tctx *R, const tv *items, size_t n, int kind) {
    tv l = tv_list(R, n, kind);
    if (n) memcpy(l.l->v, items, n * sizeof(tv));
    return l;
}

static tv dict_items(tctx *R, const tdict *d) {
    tv l = tv_list(R, d->n, TL_ITEMS);
    for (size_t i = 0; i < d->n; i++) {
        tv t = tv_list(R, 2, TL_TUPLE);
        t.l->v[0] = d->k[i];
        t.l->v[1] = d->v[i];
        l.l->v[i] = tv_seal(R, t);
    }
    return tv_seal(R, l);
}

tv tb_call_method(tctx *R, const tmethod *mt, const tv *args, size_t nargs, const char **kwn, const size_t *kwl,
                  const tv *kwv, size_t nkw) {
    targs A = {args, nargs, kwn, kwl, kwv, nkw, mt->name};
    const tv *self = &mt->self;
    const char *m = mt->name;
    static const char *const none[] = {NULL};
    /* string methods scan their operands once or a bounded number of times */
    if (self->t == TV_STR) {
        size_t work = self->s.n;
        for (size_t i = 0; i < nargs; i++)
            if (args[i].t == TV_STR) work += args[i].s.n;
        tcharge_scan(R, work);
    } else if (self->t == TV_LIST) {
        tcharge_items(R, self->l->n);
    } else if (self->t == TV_DICT) {
        tcharge_items(R, self->d->n);
    }
    switch (self->t) {
    case TV_STR: return tb_str_method(R, *self, m, &A);
    case TV_DICT:
        if (!strcmp(m, "get")) {
            arg_max(R, &A, 2, none);
            if (nargs < 1) tfail(R, DF_EINPUT, "get expected at least 1 argument, got 0");
            tv *v = tdict_get(R, self->d, args[0]);
            return v ? *v : nargs > 1 ? args[1] : tv_none();
        }
        arg_max(R, &A, 0, none);
        if (!strcmp(m, "items")) return dict_items(R, self->d);
        if (!strcmp(m, "keys")) return list_from(R, self->d->k, self->d->n, TL_KEYS);
        if (!strcmp(m, "values")) return list_from(R, self->d->v, self->d->n, TL_VALUES);
        if (!strcmp(m, "copy")) {
            tv d = tv_dict(R, self->d->n + 1);
            for (size_t i = 0; i < self->d->n; i++) tdict_set(R, d.d, self->d->k[i], self->d->v[i]);
            return d;
        }
        break;
    case TV_LIST:
        if (!strcmp(m, "count")) {
            arg_max(R, &A, 1, none);
            if (nargs != 1) tfail(R, DF_EINPUT, "count() takes exactly one argument");
            int64_t c = 0;
            for (size_t i = 0; i < self->l->n; i++) c += tv_eq(R, &self->l->v[i], &args[0]);
            return tv_int(c);
        }
        if (!strcmp(m, "index")) {
            arg_max(R, &A, 1, none);
            if (nargs != 1) tfail(R, DF_EINPUT, "index() takes exactly one argument");
            for (size_t i = 0; i < self->l->n; i++)
                if (tv_eq(R, &self->l->v[i], &args[0])) return tv_int((int64_t)i);
            tfail(R, DF_EINPUT, "value is not in list");
        }
        if (!strcmp(m, "copy")) return list_from(R, self->l->v, self->l->n, TL_LIST);
        break;
    case TV_LOOP:
        if (!strcmp(m, "cycle")) {
            if (!nargs) tfail(R, DF_EINPUT, "no items for cycling given");
            return args[self->loop->i % nargs];
        }
        tfail(R, DF_EUNSUPPORTED, "unsupported: loop.changed()");
    default: break;
    }
    tfail(R, DF_EINTERNAL, "internal error: method '%s' of '%s'", m, tv_typename(self));
}

/* ---- filters ------------------------------------------------------------ */

static const char *const FILTERS[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max",
    "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string",
    "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", "center", NULL};
static const char *const FILTERS_UNSUPPORTED[] = {
    "batch", "slice", "truncate", "wordwrap", "urlencode", "urlize", "striptags", "xmlattr", "filesizeformat",
    "pprint", "random", "groupby", NULL};

int tb_filter_known(const char *name, size_t n, const char **why) {
    *why = NULL;
    if (in_names(FILTERS, name, n)) return 1;
    if (in_names(FILTERS_UNSUPPORTED, name, n)) *why = "not implemented by Deltafin's renderer";
    return 0;
}

static tv apply_filter(tctx *R, const char *name, size_t nl, tv v, const targs *A);

/* select/reject/selectattr/rejectattr */
static tv select_items(tctx *R, tv v, const targs *A, int use_attr, int reject) {
    size_t n;
    tv *items = tb_iterate(R, &v, &n);
    size_t ai = 0;
    const tv *attribute = NULL;
    if (use_attr) {
        attribute = arg(A, 0, NULL);
        if (!attribute) tfail(R, DF_EINPUT, "Missing parameter for attribute name");
        ai = 1;
    }
    const tv *test = A->na > ai ? &A->a[ai] : NULL;
    tv l = tv_list(R, n, TL_LIST);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        tv x = use_attr ? attr_path(R, &items[i], attribute) : items[i];
        int ok;
        if (!test) ok = tv_truthy(&x);
        else {
            tv tn = want_str(R, test, "test name");
            if (!tb_test_known(tn.s.p, tn.s.n)) tfail(R, DF_EINPUT, "No test named '%.*s'", (int)tn.s.n, tn.s.p);
            ok = tb_apply_test(R, tn.s.p, tn.s.n, &x, A->a + ai + 1, A->na - ai - 1);
        }
        if (ok != reject) l.l->v[k++] = items[i];
    }
    l.l->n = k;
    return l;
}

static tv do_sort(tctx *R, tv v, const targs *A) {
    static const char *const nm[] = {"reverse", "case_sensitive", "attribute", NULL};
    arg_max(R, A, 3, nm);
    const tv *rev = arg(A, 0, "reverse"), *cs = arg(A, 1, "case_sensitive"), *at = arg(A, 2, "attribute");
    size_t n;
    tv *items = tb_iterate(R, &v, &n);
    kv *a = ta_alloc(R, &R->A, (n + 1) * sizeof(kv));
    size_t lg = 1;
    while (lg < 64 && ((size_t)1 << lg) < n) lg++;
    tcharge_items(R, n * lg); /* merge sort: n log n comparisons */
    for (size_t i = 0; i < n; i++) { a[i].val = items[i]; a[i].key = sort_key(R, &items[i], at, cs && tv_truthy(cs)); }
    merge_sort(R, a, n, rev && tv_truthy(rev));
    tv l = tv_list(R, n, TL_LIST);
    for (size_t i = 0; i < n; i++) l.l->v[i] = a[i].val;
    return l;
}

static tv do_minmax(tctx *R, tv v, const targs *A, int want_max) {
    static const char *const nm[] = {"case_sensitive", "attribute", NULL};
    arg_max(R, A, 2, nm);
    const tv *cs = arg(A, 0, "case_sensitive"), *at = arg(A, 1, "attribute");
    size_t n;
    tv *items = tb_iterate(R, &v, &n);
    if (!n) return tb_undef_hint(R, "No aggregated item, sequence was empty.");
    size_t best = 0;
    tv bk = sort_key(R, &items[0], at, cs && tv_truthy(cs));
    for (size_t i = 1; i < n; i++) {
        tv k = sort_key(R, &items[i], at, cs && tv_truthy(cs));
        int c = tv_cmp(R, &k, &bk, "<");
        if (want_max ? c > 0 : c < 0) { best = i; bk = k; }
    }
    return items[best];
}

static tv do_tojson(tctx *R, tv v, const targs *A) {
    static const char *const nm[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    arg_max(R, A, 4, nm);
    const tv *ea = arg(A, 0, "ensure_ascii"), *ind = arg(A, 1, "indent"), *sep = arg(A, 2, "separators"),
             *sk = arg(A, 3, "sort_keys");
    tjson_opts o = {0};
    o.ensure_ascii = ea && tv_truthy(ea);
    o.sort_keys = sk && tv_truthy(sk);
    char *spaces = NULL;
    if (ind && ind->t != TV_NONE) {
        o.has_indent = 1;
        if (ind->t == TV_STR) { o.indent = ind->s.p; o.indent_n = ind->s.n; }
        else {
            int64_t k = want_int(R, ind, "indent");
            if (k < 0) k = 0;
            if (k > 1000) k = 1000;
            spaces = ta_alloc(R, &R->A, (size_t)k + 1);
            memset(spaces, ' ', (size_t)k);
            o.indent = spaces;
            o.indent_n = (size_t)k;
        }
        o.item_sep = ",";
        o.item_sep_n = 1;
    } else {
        o.item_sep = ", ";
        o.item_sep_n = 2;
    }
    o.key_sep = ": ";
    o.key_sep_n = 2;
    if (sep && sep->t != TV_NONE) {
        size_t m;
        tv *parts = tb_iterate(R, sep, &m);
        if (m != 2 || parts[0].t != TV_STR || parts[1].t != TV_STR) tfail(R, DF_EINPUT, "tojson: separators must be a pair of strings");
        o.item_sep = parts[0].s.p; o.item_sep_n = parts[0].s.n;
        o.key_sep = parts[1].s.p; o.key_sep_n = parts[1].s.n;
    }
    tout out = {0};
    out.in_arena = 1;
    if (v.t == TV_UNDEF) tfail(R, DF_EINPUT, "Object of type Undefined is not JSON serializable");
    tv_json_into(R, &out, &v, &o, 0);
    return out.len ? tv_str(out.p, out.len) : tv_str("", 0);
}

static tv do_indent(tctx *R, tv v, const targs *A) {
    static const char *const nm[] = {"width", "first", "blank", NULL};
    arg_max(R, A, 3, nm);
    tv s = soft_str(R, &v);
    const tv *w = arg(A, 0, "width"), *first = arg(A, 1, "first"), *blank = arg(A, 2, "blank");
    tv ind;
    if (!w) ind = tv_cstr("    ");
    else if (w->t == TV_STR) ind = *w;
    else {
        int64_t k = want_int(R, w, "width");
        if (k < 0) k = 0;
        if (k > TPL_MAX_FORMAT_WIDTH) tfail(R, DF_EINPUT, "indent width %lld exceeds the limit of %d", (long long)k, TPL_MAX_FORMAT_WIDTH);
        char *sp = ta_alloc(R, &R->A, (size_t)k + 1);
        memset(sp, ' ', (size_t)k);
        ind = tv_str(sp, (size_t)k);
    }
    /* s += "\n"; lines = s.splitlines() */
    char *buf = ta_alloc(R, &R->A, s.s.n + 2);
    memcpy(buf, s.s.p, s.s.n);
    buf[s.s.n] = '\n';
    tv lines = tb_str_method(R, tv_str(buf, s.s.n + 1), "splitlines", &(targs){0});
    tout o = {0};
    o.in_arena = 1;
    if (first && tv_truthy(first)) tout_put(R, &o, ind.s.p, ind.s.n);
    size_t n = lines.l->n;
    for (size_t i = 0; i < n; i++) {
        tv *ln = &lines.l->v[i];
        if (i) {
            tout_put(R, &o, "\n", 1);
            if ((blank && tv_truthy(blank)) || ln->s.n) tout_put(R, &o, ind.s.p, ind.s.n);
        }
        tout_put(R, &o, ln->s.p, ln->s.n);
    }
    return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
}

static tv apply_filter(tctx *R, const char *name, size_t nl, tv v, const targs *A) {
#define F(s) name_is(name, nl, s)
    static const char *const none[] = {NULL};
    /* every filter reads its input at least once */
    if (v.t == TV_STR) tcharge_scan(R, v.s.n);
    else if (v.t == TV_LIST) tcharge_items(R, v.l->n);
    else if (v.t == TV_DICT) tcharge_items(R, v.d->n);
    if (F("safe")) { arg_max(R, A, 0, none); tv s = soft_str(R, &v); s.sub = TS_MARKUP; return s; }
    if (F("tojson")) return do_tojson(R, v, A);
    if (F("length") || F("count")) {
        arg_max(R, A, 0, none);
        switch (v.t) {
        case TV_UNDEF: return tv_int(0);
        case TV_STR: return tv_int((int64_t)u8_count(v.s.p, v.s.n));
        case TV_LIST: return tv_int((int64_t)v.l->n);
        case TV_DICT: return tv_int((int64_t)v.d->n);
        default: tfail(R, DF_EINPUT, "object of type '%s' has no len()", tv_typename(&v));
        }
    }
    if (F("string")) { arg_max(R, A, 0, none); return v.t == TV_STR ? v : soft_str(R, &v); }
    if (F("trim")) {
        static const char *const nm[] = {"chars", NULL};
        arg_max(R, A, 1, nm);
        return tb_str_strip(R, soft_str(R, &v), arg(A, 0, "chars"), 3);
    }
    if (F("lower")) { arg_max(R, A, 0, none); return tb_str_map(R, soft_str(R, &v), u_lower); }
    if (F("upper")) { arg_max(R, A, 0, none); return tb_str_map(R, soft_str(R, &v), u_upper); }
    if (F("capitalize")) { arg_max(R, A, 0, none); return tb_str_capitalize(R, soft_str(R, &v)); }
    if (F("title")) { arg_max(R, A, 0, none); return tb_jinja_title(R, soft_str(R, &v)); }
    if (F("default") || F("d")) {
        static const char *const nm[] = {"default_value", "boolean", NULL};
        arg_max(R, A, 2, nm);
        const tv *dv = arg(A, 0, "default_value"), *bo = arg(A, 1, "boolean");
        if (v.t == TV_UNDEF || (bo && tv_truthy(bo) && !tv_truthy(&v))) return dv ? *dv : tv_str("", 0);
        return v;
    }
    if (F("first") || F("last")) {
        arg_max(R, A, 0, none);
        size_t n;
        tv *items = tb_iterate(R, &v, &n);
        if (!n) return tb_undef_hint(R, F("first") ? "No first item, sequence was empty." : "No last item, sequence was empty.");
        return F("first") ? items[0] : items[n - 1];
    }
    if (F("join")) {
        static const char *const nm[] = {"d", "attribute", NULL};
        arg_max(R, A, 2, nm);
        const tv *d = arg(A, 0, "d"), *at = arg(A, 1, "attribute");
        tv sep = d ? soft_str(R, d) : tv_str("", 0);
        size_t n;
        tv *items = tb_iterate(R, &v, &n);
        tout o = {0};
        o.in_arena = 1;
        for (size_t i = 0; i < n; i++) {
            if (i) tout_put(R, &o, sep.s.p, sep.s.n);
            tv x = at ? attr_path(R, &items[i], at) : items[i];
            tv_str_into(R, &o, &x);
        }
        return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
    }
    if (F("items")) {
        arg_max(R, A, 0, none);
        if (v.t == TV_UNDEF) return tv_list(R, 0, TL_LIST);
        if (v.t != TV_DICT) tfail(R, DF_EINPUT, "Can only get item pairs from a mapping.");
        tv l = dict_items(R, v.d);
        l.sub = TL_LIST;
        return l;
    }
    if (F("list")) {
        arg_max(R, A, 0, none);
        size_t n;
        tv *items = tb_iterate(R, &v, &n);
        return list_from(R, items, n, TL_LIST);
    }
    if (F("replace")) {
        static const char *const nm[] = {"old", "new", "count", NULL};
        arg_max(R, A, 3, nm);
        const tv *o = arg(A, 0, "old"), *n = arg(A, 1, "new"), *c = arg(A, 2, "count");
        if (!o || !n) tfail(R, DF_EINPUT, "replace filter needs old and new");
        tv os = soft_str(R, o), ns = soft_str(R, n);
        return tb_str_replace(R, soft_str(R, &v), os, ns, c && c->t != TV_NONE ? want_int(R, c, "count") : -1);
    }
    if (F("select") || F("reject")) return select_items(R, v, A, 0, F("reject"));
    if (F("selectattr") || F("rejectattr")) return select_items(R, v, A, 1, F("rejectattr"));
    if (F("map")) {
        size_t n;
        tv *items = tb_iterate(R, &v, &n);
        tv l = tv_list(R, n, TL_LIST);
        const tv *at = NULL, *dflt = NULL;
        for (size_t k = 0; k < A->nk; k++) {
            if (name_is(A->kn[k], A->kl[k], "attribute")) at = &A->kv[k];
            else if (name_is(A->kn[k], A->kl[k], "default")) dflt = &A->kv[k];
        }
        if (at) {
            for (size_t i = 0; i < n; i++) {
                tv x = attr_path(R, &items[i], at);
                if (x.t == TV_UNDEF && dflt) x = *dflt;
                l.l->v[i] = x;
            }
            return l;
        }
        if (!A->na) tfail(R, DF_EINPUT, "map requires a filter argument");
        tv fname = want_str(R, &A->a[0], "filter name");
        const char *why;
        if (!tb_filter_known(fname.s.p, fname.s.n, &why)) tfail(R, DF_EINPUT, "No filter named '%.*s'", (int)fname.s.n, fname.s.p);
        targs B = {A->a + 1, A->na - 1, A->kn, A->kl, A->kv, A->nk, "map"};
        for (size_t i = 0; i < n; i++) l.l->v[i] = apply_filter(R, fname.s.p, fname.s.n, items[i], &B);
        return l;
    }
    if (F("int")) {
        static const char *const nm[] = {"default", "base", NULL};
        arg_max(R, A, 2, nm);
        const tv *d = arg(A, 0, "default"), *b = arg(A, 1, "base");
        tv dv = d ? *d : tv_int(0);
        int base = b ? (int)want_int(R, b, "base") : 10;
        switch (v.t) {
        case TV_INT: return v;
        case TV_BOOL: return tv_int(v.b);
        case TV_FLOAT:
            if (v.f != v.f || v.f >= 9.2e18 || v.f <= -9.2e18) return dv;
            return tv_int((int64_t)v.f);
        case TV_STR: {
            /* int(s, base), else int(float(s)), else the default */
            tv s = tb_str_strip(R, v, NULL, 3);
            char buf[128];
            size_t k = 0;
            if (!s.s.n || s.s.n >= sizeof buf) return dv;
            for (size_t i = 0; i < s.s.n; i++) {
                char c = s.s.p[i];
                if (c == '_' && i > 0 && i + 1 < s.s.n && s.s.p[i - 1] != '_' && s.s.p[i + 1] != '_') continue;
                buf[k++] = c;
            }
            buf[k] = 0;
            if (base >= 2 && base <= 36) {
                char *end;
                errno = 0;
                long long x = strtoll(buf, &end, base);
                int ok = end != buf && !*end && !errno && (base == 10 || base == 16 || buf[0] != '0' || !buf[1]);
                if (ok && !strchr(buf, ' ')) return tv_int(x);
            }
            char *end;
            double f = strtod(buf, &end);
            if (end != buf && !*end && f == f && f < 9.2e18 && f > -9.2e18 && !strchr(buf, 'x') && !strchr(buf, 'X'))
                return tv_int((int64_t)f);
            return dv;
        }
        default: return dv;
        }
    }
    if (F("float")) {
        static const char *const nm[] = {"default", NULL};
        arg_max(R, A, 1, nm);
        const tv *d = arg(A, 0, "default");
        tv dv = d ? *d : tv_float(0.0);
        if (v.t == TV_FLOAT) return v;
        if (v.t == TV_INT) return tv_float((double)v.i);
        if (v.t == TV_BOOL) return tv_float(v.b);
        if (v.t == TV_STR) {
            tv s = tb_str_strip(R, v, NULL, 3);
            char buf[128];
            if (!s.s.n || s.s.n >= sizeof buf) return dv;
            memcpy(buf, s.s.p, s.s.n);
            buf[s.s.n] = 0;
            char *end;
            double f = strtod(buf, &end);
            if (*end) return dv;
            return tv_float(f);
        }
        return dv;
    }
    if (F("abs")) {
        arg_max(R, A, 0, none);
        if (v.t == TV_INT) { if (v.i == INT64_MIN) overflow(R); return tv_int(v.i < 0 ? -v.i : v.i); }
        if (v.t == TV_BOOL) return tv_int(v.b);
        if (v.t == TV_FLOAT) return tv_float(fabs(v.f));
        tfail(R, DF_EINPUT, "bad operand type for abs(): '%s'", tv_typename(&v));
    }
    if (F("round")) {
        static const char *const nm[] = {"precision", "method", NULL};
        arg_max(R, A, 2, nm);
        const tv *pr = arg(A, 0, "precision"), *me = arg(A, 1, "method");
        int64_t prec = pr ? want_int(R, pr, "precision") : 0;
        if (prec < 0 || prec > 30) tfail(R, DF_EUNSUPPORTED, "round: unsupported precision");
        double x = v.t == TV_FLOAT ? v.f : v.t == TV_INT ? (double)v.i : v.t == TV_BOOL ? v.b : NAN;
        if (x != x && v.t != TV_FLOAT) tfail(R, DF_EINPUT, "round: a number is required, not '%s'", tv_typename(&v));
        const char *method = me && me->t == TV_STR ? me->s.p : "common";
        size_t ml = me && me->t == TV_STR ? me->s.n : 6;
        if (!isfinite(x)) return tv_float(x);
        if (name_is(method, ml, "common")) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            return tv_float(strtod(buf, NULL));
        }
        double m = pow(10, (double)prec);
        if (name_is(method, ml, "ceil")) return tv_float(ceil(x * m) / m);
        if (name_is(method, ml, "floor")) return tv_float(floor(x * m) / m);
        tfail(R, DF_EINPUT, "method must be common, ceil or floor");
    }
    if (F("sum")) {
        static const char *const nm[] = {"attribute", "start", NULL};
        arg_max(R, A, 2, nm);
        const tv *at = arg(A, 0, "attribute"), *st = arg(A, 1, "start");
        tv acc = st ? *st : tv_int(0);
        size_t n;
        tv *items = tb_iterate(R, &v, &n);
        for (size_t i = 0; i < n; i++) {
            tv x = at ? attr_path(R, &items[i], at) : items[i];
            acc = tb_binop(R, OP_ADD, &acc, &x);
        }
        return acc;
    }
    if (F("min") || F("max")) return do_minmax(R, v, A, F("max"));
    if (F("sort")) return do_sort(R, v, A);
    if (F("unique")) {
        static const char *const nm[] = {"case_sensitive", "attribute", NULL};
        arg_max(R, A, 2, nm);
        const tv *cs = arg(A, 0, "case_sensitive"), *at = arg(A, 1, "attribute");
        size_t n;
        tv *items = tb_iterate(R, &v, &n);
        tv l = tv_list(R, n, TL_LIST);
        tv *keys = ta_alloc(R, &R->A, (n + 1) * sizeof(tv));
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            tv key = sort_key(R, &items[i], at, cs && tv_truthy(cs));
            int seen = 0;
            tcharge_items(R, k); /* quadratic: each item is compared with those kept */
            for (size_t j = 0; j < k && !seen; j++) seen = tv_eq(R, &keys[j], &key);
            if (!seen) { keys[k] = key; l.l->v[k++] = items[i]; }
        }
        l.l->n = k;
        return l;
    }
    if (F("reverse")) {
        arg_max(R, A, 0, none);
        if (v.t == TV_STR) {
            tv neg = tv_int(-1), nn = tv_none();
            return tb_slice(R, &v, &nn, &nn, &neg);
        }
        size_t n;
        tv *items = tb_iterate(R, &v, &n);
        tv l = tv_list(R, n, TL_LIST);
        for (size_t i = 0; i < n; i++) l.l->v[i] = items[n - 1 - i];
        return l;
    }
    if (F("dictsort")) {
        static const char *const nm[] = {"case_sensitive", "by", "reverse", NULL};
        arg_max(R, A, 3, nm);
        const tv *cs = arg(A, 0, "case_sensitive"), *by = arg(A, 1, "by"), *rev = arg(A, 2, "reverse");
        if (v.t != TV_DICT) tfail(R, DF_EINPUT, "dictsort: expected a mapping, not '%s'", tv_typename(&v));
        int byval = 0;
        if (by) {
            if (sv_eq(by, "value")) byval = 1;
            else if (!sv_eq(by, "key")) tfail(R, DF_EINPUT, "You can only sort by either \"key\" or \"value\"");
        }
        size_t n = v.d->n;
        kv *a = ta_alloc(R, &R->A, (n + 1) * sizeof(kv));
        tv items = dict_items(R, v.d);
        for (size_t i = 0; i < n; i++) {
            a[i].val = items.l->v[i];
            tv k = byval ? v.d->v[i] : v.d->k[i];
            a[i].key = sort_key(R, &k, NULL, cs && tv_truthy(cs));
        }
        merge_sort(R, a, n, rev && tv_truthy(rev));
        tv l = tv_list(R, n, TL_LIST);
        for (size_t i = 0; i < n; i++) l.l->v[i] = a[i].val;
        return l;
    }
    if (F("escape") || F("e") || F("forceescape")) {
        arg_max(R, A, 0, none);
        if (v.t == TV_STR && v.sub == TS_MARKUP && !F("forceescape")) return v;
        return tb_html_escape(R, soft_str(R, &v));
    }
    if (F("attr")) {
        arg_max(R, A, 1, none);
        if (A->na != 1) tfail(R, DF_EINPUT, "attr filter needs a name");
        tv nm = want_str(R, &A->a[0], "attribute name");
        if (v.t == TV_DICT) {
            if (in_names(TB_DICT_METHODS, nm.s.p, nm.s.n)) return tb_getattr(R, &v, nm.s.p, nm.s.n);
            return tv_undef_named(R, nm.s.p, nm.s.n, "dict object");
        }
        return tb_getattr(R, &v, nm.s.p, nm.s.n);
    }
    if (F("format")) {
        tv s = soft_str(R, &v);
        if (A->nk) {
            tv d = tv_dict(R, A->nk + 1);
            for (size_t k = 0; k < A->nk; k++) tdict_set(R, d.d, tv_str(A->kn[k], A->kl[k]), A->kv[k]);
            return tb_percent_format(R, &s, &d);
        }
        tv t = list_from(R, A->a, A->na, TL_TUPLE);
        return tb_percent_format(R, &s, &t);
    }
    if (F("wordcount")) {
        arg_max(R, A, 0, none);
        tv s = soft_str(R, &v);
        int64_t c = 0;
        int in = 0;
        for (size_t i = 0; i < s.s.n;) {
            uint32_t cp;
            i += u8_dec(s.s.p + i, s.s.n - i, &cp);
            int w = u_isalnum(cp) || cp == '_';
            if (w && !in) c++;
            in = w;
        }
        return tv_int(c);
    }
    if (F("center")) {
        static const char *const nm[] = {"width", NULL};
        arg_max(R, A, 1, nm);
        const tv *w = arg(A, 0, "width");
        int64_t width = w ? want_int(R, w, "width") : 80;
        tv s = soft_str(R, &v);
        int64_t len = (int64_t)u8_count(s.s.p, s.s.n);
        if (width > TPL_MAX_FORMAT_WIDTH) tfail(R, DF_EINPUT, "center width %lld exceeds the limit of %d", (long long)width, TPL_MAX_FORMAT_WIDTH);
        if (width <= len) return s;
        int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
        char *o = ta_alloc(R, &R->A, s.s.n + (size_t)marg + 1);
        memset(o, ' ', (size_t)left);
        memcpy(o + left, s.s.p, s.s.n);
        memset(o + left + s.s.n, ' ', (size_t)(marg - left));
        return tv_str(o, s.s.n + (size_t)marg);
    }
    if (F("indent")) return do_indent(R, v, A);
#undef F
    tfail(R, DF_EUNSUPPORTED, "unsupported filter '%.*s'", (int)nl, name);
}

tv tb_filter(tctx *R, tscope *S, const node *e, tv v) {
    tv *args = e->n ? ta_alloc(R, &R->A, e->n * sizeof(tv)) : NULL;
    tv *kwv = e->n2 ? ta_alloc(R, &R->A, e->n2 * sizeof(tv)) : NULL;
    for (size_t i = 0; i < e->n; i++) args[i] = teval(R, S, e->list[i]);
    for (size_t i = 0; i < e->n2; i++) kwv[i] = teval(R, S, e->list2[i]);
    R->off = e->off;
    char fname[64];
    snprintf(fname, sizeof fname, "%.*s", (int)(e->len > 60 ? 60 : e->len), e->str);
    targs A = {args, e->n, e->names, e->nlens, kwv, e->n2, fname};
    return apply_filter(R, e->str, e->len, v, &A);
}
