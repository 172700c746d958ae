/* template_builtins.c - attribute and item access, iteration, slicing,
 * operators, global functions and tests of the renderer.
 *
 * Semantics are those of jinja2's ImmutableSandboxedEnvironment as
 * transformers configures it: obj.attr tries the Python attribute (a
 * method) first and then the item, obj[key] the other way round; a miss is
 * Undefined (an error only when used, as jinja2's default Undefined);
 * mutating methods (list.append, dict.update, ...) are unsafe and fail when
 * called. Operators follow Python (int/float promotion, floor division and
 * modulo signs, str/list repetition); ints are 64-bit and overflow is an
 * error. String work lives in template_strings.c, filters and list / dict
 * methods in template_filters.c; shared helpers in template_builtins_int.h.
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

/* ---- small helpers ------------------------------------------------------ */

void tb_undef_fail(tctx *R, const tv *v) {
    const tundef *u = v->u;
    if (!u) tfail(R, DF_EINPUT, "undefined value used");
    if (u->hint) tfail(R, DF_EINPUT, "%s", u->hint);
    if (u->owner) tfail(R, DF_EINPUT, "'%s' has no attribute '%.*s'", u->owner, (int)(u->nlen > 80 ? 80 : u->nlen), u->name);
    tfail(R, DF_EINPUT, "'%.*s' is undefined", (int)(u->nlen > 80 ? 80 : u->nlen), u->name);
}

tv tb_undef_hint(tctx *R, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    tv v = tv_undef();
    v.u = ta_alloc(R, &R->A, sizeof(tundef));
    tv s = tv_strdup(R, buf, strlen(buf));
    v.u->hint = s.s.p;
    return v;
}

static const char *owner_name(tctx *R, const tv *v) {
    if (v->t == TV_NONE) return "None";
    const char *tn = tv_typename(v);
    char *o = ta_alloc(R, &R->A, strlen(tn) + 8);
    sprintf(o, "%s object", tn);
    return o;
}

/* ---- iteration, access ---------------------------------------------------- */

tv *tb_iterate(tctx *R, const tv *v, size_t *n) {
    switch (v->t) {
    case TV_UNDEF: *n = 0; return NULL;
    case TV_LIST: *n = v->l->n; return v->l->v;
    case TV_DICT: {
        tv *o = ta_alloc(R, &R->A, (v->d->n + 1) * sizeof(tv));
        memcpy(o, v->d->k, v->d->n * sizeof(tv));
        *n = v->d->n;
        return o;
    }
    case TV_STR: {
        size_t cnt = u8_count(v->s.p, v->s.n), k = 0;
        tv *o = ta_alloc(R, &R->A, (cnt + 1) * sizeof(tv));
        for (size_t i = 0; i < v->s.n;) {
            uint32_t cp;
            int l = u8_dec(v->s.p + i, v->s.n - i, &cp);
            o[k++] = tv_str(v->s.p + i, (size_t)l);
            i += l;
        }
        *n = k;
        return o;
    }
    default: tfail(R, DF_EINPUT, "'%s' object is not iterable", tv_typename(v));
    }
}

static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format", "format_map",
    "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
    "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans", "partition",
    "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
    "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill", NULL};
static const char *const LIST_METHODS[] = {"count", "index", "copy", NULL};
static const char *const LIST_UNSAFE[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", NULL};
const char *const TB_DICT_METHODS[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"pop", "popitem", "setdefault", "update", "clear", "fromkeys", NULL};

static tv method(tctx *R, const tv *self, const char *name, size_t n) {
    tv v = {0};
    v.t = TV_METHOD;
    v.m = ta_alloc(R, &R->A, sizeof(tmethod));
    v.m->self = *self;
    tv s = tv_strdup(R, name, n);
    v.m->name = s.s.p;
    return v;
}

static tv loop_attr(tctx *R, const tv *obj, const char *name, size_t n) {
    const tloop *L = obj->loop;
    if (name_is(name, n, "index")) return tv_int((int64_t)L->i + 1);
    if (name_is(name, n, "index0")) return tv_int((int64_t)L->i);
    if (name_is(name, n, "revindex")) return tv_int((int64_t)(L->n - L->i));
    if (name_is(name, n, "revindex0")) return tv_int((int64_t)(L->n - L->i - 1));
    if (name_is(name, n, "first")) return tv_bool(L->i == 0);
    if (name_is(name, n, "last")) return tv_bool(L->i + 1 == L->n);
    if (name_is(name, n, "length")) return tv_int((int64_t)L->n);
    if (name_is(name, n, "depth")) return tv_int(L->depth);
    if (name_is(name, n, "depth0")) return tv_int(L->depth - 1);
    if (name_is(name, n, "previtem")) return L->i > 0 ? L->items[L->i - 1] : tb_undef_hint(R, "there is no previous item");
    if (name_is(name, n, "nextitem")) return L->i + 1 < L->n ? L->items[L->i + 1] : tb_undef_hint(R, "there is no next item");
    if (name_is(name, n, "cycle") || name_is(name, n, "changed")) return method(R, obj, name, n);
    return tv_undef_named(R, name, n, "LoopContext object");
}

tv tb_getattr(tctx *R, const tv *obj, const char *name, size_t n) {
    switch (obj->t) {
    case TV_UNDEF: tb_undef_fail(R, obj);
    case TV_DICT: {
        if (in_names(TB_DICT_METHODS, name, n)) return method(R, obj, name, n);
        if (in_names(DICT_UNSAFE, name, n))
            return tb_undef_hint(R, "access to attribute '%.*s' of 'dict' object is unsafe.", (int)n, name);
        tv *v = tdict_gets(R, obj->d, name, n);
        if (v) return *v;
        return tv_undef_named(R, name, n, "dict object");
    }
    case TV_NS: {
        tv *v = tdict_gets(R, obj->d, name, n);
        if (v) return *v;
        return tv_undef_named(R, name, n, "Namespace object");
    }
    case TV_LOOP: return loop_attr(R, obj, name, n);
    case TV_STR:
        if (in_names(STR_METHODS, name, n)) return method(R, obj, name, n);
        break;
    case TV_LIST:
        if (obj->sub == TL_LIST || obj->sub == TL_TUPLE) {
            if (in_names(LIST_METHODS, name, n) && !(obj->sub == TL_TUPLE && name_is(name, n, "copy"))) return method(R, obj, name, n);
            if (obj->sub == TL_LIST && in_names(LIST_UNSAFE, name, n))
                return tb_undef_hint(R, "access to attribute '%.*s' of 'list' object is unsafe.", (int)n, name);
        }
        break;
    default: break;
    }
    return tv_undef_named(R, name, n, owner_name(R, obj));
}

static int index_of(tctx *R, int64_t i, size_t n, size_t *out) {
    (void)R;
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return 0;
    *out = (size_t)i;
    return 1;
}

tv tb_getitem(tctx *R, const tv *obj, const tv *key) {
    if (obj->t == TV_UNDEF) tb_undef_fail(R, obj);
    int intkey = key->t == TV_INT || key->t == TV_BOOL;
    int64_t ki = key->t == TV_INT ? key->i : key->t == TV_BOOL ? key->b : 0;
    switch (obj->t) {
    case TV_LIST:
        if (intkey && (obj->sub == TL_LIST || obj->sub == TL_TUPLE)) {
            size_t at;
            if (index_of(R, ki, obj->l->n, &at)) return obj->l->v[at];
            return tb_undef_hint(R, "'%s object' has no element %lld", tv_typename(obj), (long long)ki);
        }
        break;
    case TV_STR:
        if (intkey) {
            size_t cnt = u8_count(obj->s.p, obj->s.n), at;
            if (!index_of(R, ki, cnt, &at)) return tb_undef_hint(R, "'str object' has no element %lld", (long long)ki);
            size_t i = 0, c = 0;
            while (i < obj->s.n) {
                uint32_t cp;
                int l = u8_dec(obj->s.p + i, obj->s.n - i, &cp);
                if (c == at) return tv_str(obj->s.p + i, (size_t)l);
                i += l;
                c++;
            }
        }
        break;
    case TV_DICT: {
        if (key->t != TV_LIST || key->sub == TL_TUPLE) {
            tv *v = tdict_get(R, obj->d, *key);
            if (v) return *v;
        }
        break;
    }
    default: break;
    }
    if (key->t == TV_STR) {
        if (obj->t == TV_DICT && !in_names(TB_DICT_METHODS, key->s.p, key->s.n) && !in_names(DICT_UNSAFE, key->s.p, key->s.n))
            return tv_undef_named(R, key->s.p, key->s.n, "dict object");
        return tb_getattr(R, obj, key->s.p, key->s.n);
    }
    tv ks = tv_to_str(R, key);
    return tv_undef_named(R, ks.s.p, ks.s.n, owner_name(R, obj));
}

/* Python slice.indices */
void tb_slice_indices(tctx *R, size_t len, const tv *a, const tv *b, const tv *c, int64_t *start, int64_t *stop,
                          int64_t *stepo) {
    int64_t n = (int64_t)len;
    int64_t step = c->t == TV_NONE ? 1 : want_int(R, c, "slice step");
    if (step == 0) tfail(R, DF_EINPUT, "slice step cannot be zero");
    int64_t lo, hi;
    if (step < 0) { lo = -1; hi = n - 1; } else { lo = 0; hi = n; }
    int64_t s, e;
    if (a->t == TV_NONE) s = step < 0 ? hi : lo;
    else {
        s = want_int(R, a, "slice index");
        if (s < 0) { s += n; if (s < lo) s = lo; }
        else if (s > hi) s = hi;
    }
    if (b->t == TV_NONE) e = step < 0 ? lo : hi;
    else {
        e = want_int(R, b, "slice index");
        if (e < 0) { e += n; if (e < lo) e = lo; }
        else if (e > hi) e = hi;
    }
    *start = s;
    *stop = e;
    *stepo = step;
}

tv tb_slice(tctx *R, const tv *obj, const tv *a, const tv *b, const tv *c) {
    if (obj->t == TV_UNDEF) tb_undef_fail(R, obj);
    for (int k = 0; k < 3; k++) {
        const tv *x = k == 0 ? a : k == 1 ? b : c;
        if (x->t != TV_NONE && x->t != TV_INT && x->t != TV_BOOL) return tv_undef(); /* TypeError -> undefined */
    }
    if (obj->t == TV_LIST && (obj->sub == TL_LIST || obj->sub == TL_TUPLE)) {
        int64_t s, e, st;
        tb_slice_indices(R, obj->l->n, a, b, c, &s, &e, &st);
        size_t cnt = 0;
        if (st > 0 && e > s) cnt = (size_t)((e - s + st - 1) / st);
        else if (st < 0 && s > e) cnt = (size_t)((s - e - st - 1) / -st);
        tv l = tv_list(R, cnt, obj->sub);
        for (size_t i = 0; i < cnt; i++) l.l->v[i] = obj->l->v[s + (int64_t)i * st];
        return l;
    }
    if (obj->t == TV_STR) {
        size_t cnt;
        tcharge_scan(R, obj->s.n);
        uint32_t *cps = tv_codepoints(R, obj->s.p, obj->s.n, &cnt);
        int64_t s, e, st;
        tb_slice_indices(R, cnt, a, b, c, &s, &e, &st);
        size_t k = 0;
        if (st > 0 && e > s) k = (size_t)((e - s + st - 1) / st);
        else if (st < 0 && s > e) k = (size_t)((s - e - st - 1) / -st);
        uint32_t *o = ta_alloc(R, &R->A, (k + 1) * sizeof(uint32_t));
        for (size_t i = 0; i < k; i++) o[i] = cps[s + (int64_t)i * st];
        return tv_from_codepoints(R, o, k);
    }
    return tv_undef();
}

int tb_contains(tctx *R, const tv *c, const tv *item) {
    switch (c->t) {
    case TV_UNDEF: return 0;
    case TV_STR:
        if (item->t != TV_STR) tfail(R, DF_EINPUT, "'in <string>' requires string as left operand, not %s", tv_typename(item));
        return tb_memfind(R, c->s.p, c->s.n, item->s.p, item->s.n) != NULL;
    case TV_LIST:
        tcharge_items(R, c->l->n);
        for (size_t i = 0; i < c->l->n; i++)
            if (tv_eq(R, &c->l->v[i], item)) return 1;
        return 0;
    case TV_DICT:
        if (item->t == TV_DICT || item->t == TV_NS || (item->t == TV_LIST && item->sub != TL_TUPLE))
            tfail(R, DF_EINPUT, "unhashable type: '%s'", tv_typename(item));
        return tdict_get(R, c->d, *item) != NULL;
    default: tfail(R, DF_EINPUT, "argument of type '%s' is not iterable", tv_typename(c));
    }
}

/* ---- arithmetic --------------------------------------------------------- */

static tv repeat(tctx *R, const tv *seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq->t == TV_STR) {
        if (times && seq->s.n > (SIZE_MAX / 2) / (size_t)times) overflow(R);
        size_t tot = seq->s.n * (size_t)times;
        if (R->A.cap && tot > R->A.cap)
            tfail(R, DF_EINPUT, "memory budget of %zu bytes exceeded (string repetition of %zu bytes)", R->A.cap, tot);
        char *o = ta_alloc(R, &R->A, tot + 1);
        for (int64_t i = 0; i < times; i++) memcpy(o + (size_t)i * seq->s.n, seq->s.p, seq->s.n);
        return tv_str(o, tot);
    }
    size_t n = seq->l->n;
    if (times && n > (SIZE_MAX / 64) / (size_t)times) overflow(R);
    size_t tot = n * (size_t)times;
    if (R->A.cap && tot * sizeof(tv) > R->A.cap)
        tfail(R, DF_EINPUT, "memory budget of %zu bytes exceeded (list repetition of %zu items)", R->A.cap, tot);
    tv l = tv_list(R, tot, seq->sub);
    l.l->depth = seq->l->depth;
    for (int64_t i = 0; i < times; i++) memcpy(l.l->v + (size_t)i * n, seq->l->v, n * sizeof(tv));
    return l;
}

static int64_t ipow(tctx *R, int64_t b, int64_t e) {
    int64_t r = 1;
    while (e > 0) {
        if (e & 1) { if (__builtin_mul_overflow(r, b, &r)) overflow(R); }
        e >>= 1;
        if (e && __builtin_mul_overflow(b, b, &b)) overflow(R);
    }
    return r;
}

_Noreturn static void bad_operands(tctx *R, const char *op, const tv *a, const tv *b) {
    tfail(R, DF_EINPUT, "unsupported operand type(s) for %s: '%s' and '%s'", op, tv_typename(a), tv_typename(b));
}

tv tb_binop(tctx *R, int op, const tv *a, const tv *b) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a->t == TV_UNDEF) tb_undef_fail(R, a);
    if (b->t == TV_UNDEF) tb_undef_fail(R, b);
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->t != TV_FLOAT && b->t != TV_FLOAT && op != OP_DIV) {
            int64_t x = a->t == TV_INT ? a->i : a->b, y = b->t == TV_INT ? b->i : b->b, r;
            switch (op) {
            case OP_ADD: if (__builtin_add_overflow(x, y, &r)) overflow(R); return tv_int(r);
            case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) overflow(R); return tv_int(r);
            case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) overflow(R); return tv_int(r);
            case OP_FDIV:
            case OP_MOD: {
                if (y == 0) tfail(R, DF_EINPUT, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) { if (op == OP_MOD) return tv_int(0); overflow(R); }
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                return tv_int(op == OP_FDIV ? q : m);
            }
            case OP_POW:
                if (y >= 0) return tv_int(ipow(R, x, y));
                if (x == 0) tfail(R, DF_EINPUT, "0.0 cannot be raised to a negative power");
                return tv_float(pow((double)x, (double)y));
            }
        }
        double x = a->t == TV_FLOAT ? a->f : a->t == TV_INT ? (double)a->i : a->b;
        double y = b->t == TV_FLOAT ? b->f : b->t == TV_INT ? (double)b->i : b->b;
        switch (op) {
        case OP_ADD: return tv_float(x + y);
        case OP_SUB: return tv_float(x - y);
        case OP_MUL: return tv_float(x * y);
        case OP_DIV:
            if (y == 0) tfail(R, DF_EINPUT, a->t == TV_FLOAT || b->t == TV_FLOAT ? "float division by zero" : "division by zero");
            return tv_float(x / y);
        case OP_FDIV:
        case OP_MOD: {
            if (y == 0) tfail(R, DF_EINPUT, op == OP_MOD ? "float modulo" : "float floor division by zero");
            double mod = fmod(x, y), div = (x - mod) / y, fl;
            if (mod != 0) {
                if ((y < 0) != (mod < 0)) { mod += y; div -= 1.0; }
            } else {
                mod = copysign(0.0, y);
            }
            if (div != 0) {
                fl = floor(div);
                if (div - fl > 0.5) fl += 1.0;
            } else {
                fl = copysign(0.0, x / y);
            }
            return tv_float(op == OP_FDIV ? fl : mod);
        }
        case OP_POW:
            if (x == 0 && y < 0) tfail(R, DF_EINPUT, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) tfail(R, DF_EUNSUPPORTED, "unsupported: complex result of **");
            return tv_float(pow(x, y));
        }
    }
    switch (op) {
    case OP_ADD:
        if (a->t == TV_STR && b->t == TV_STR) {
            tv x = *a, y = *b;
            int markup = a->sub == TS_MARKUP || b->sub == TS_MARKUP;
            if (markup && x.sub != TS_MARKUP) x = tb_html_escape(R, x);
            if (markup && y.sub != TS_MARKUP) y = tb_html_escape(R, y);
            char *o = ta_alloc(R, &R->A, x.s.n + y.s.n + 1);
            if (x.s.n) memcpy(o, x.s.p, x.s.n);
            if (y.s.n) memcpy(o + x.s.n, y.s.p, y.s.n);
            tv r = tv_str(o, x.s.n + y.s.n);
            r.sub = markup ? TS_MARKUP : TS_PLAIN;
            return r;
        }
        if (a->t == TV_LIST && b->t == TV_LIST && a->sub == b->sub && (a->sub == TL_LIST || a->sub == TL_TUPLE)) {
            tv l = tv_list(R, a->l->n + b->l->n, a->sub);
            if (a->l->n) memcpy(l.l->v, a->l->v, a->l->n * sizeof(tv));
            if (b->l->n) memcpy(l.l->v + a->l->n, b->l->v, b->l->n * sizeof(tv));
            l.l->depth = a->l->depth > b->l->depth ? a->l->depth : b->l->depth;
            return l;
        }
        if (a->t == TV_STR) tfail(R, DF_EINPUT, "can only concatenate str (not \"%s\") to str", tv_typename(b));
        if (a->t == TV_LIST && a->sub == TL_LIST) tfail(R, DF_EINPUT, "can only concatenate list (not \"%s\") to list", tv_typename(b));
        break;
    case OP_MUL:
        if ((a->t == TV_STR || (a->t == TV_LIST && a->sub <= TL_TUPLE)) && (b->t == TV_INT || b->t == TV_BOOL))
            return repeat(R, a, b->t == TV_INT ? b->i : b->b);
        if ((b->t == TV_STR || (b->t == TV_LIST && b->sub <= TL_TUPLE)) && (a->t == TV_INT || a->t == TV_BOOL))
            return repeat(R, b, a->t == TV_INT ? a->i : a->b);
        break;
    case OP_MOD:
        if (a->t == TV_STR) return tb_percent_format(R, a, b);
        break;
    default: break;
    }
    bad_operands(R, names[op], a, b);
}

/* ---- globals ------------------------------------------------------------ */

int tb_global_func(const char *name, size_t n) {
    if (name_is(name, n, "range")) return TF_RANGE;
    if (name_is(name, n, "namespace")) return TF_NAMESPACE;
    if (name_is(name, n, "dict")) return TF_DICT;
    if (name_is(name, n, "raise_exception")) return TF_RAISE;
    if (name_is(name, n, "strftime_now")) return TF_STRFTIME;
    return -1;
}

static void check_ns_name(tctx *R, const tv *k) {
    if (k->t == TV_STR && k->s.n && k->s.p[0] == '_')
        tfail(R, DF_EINPUT, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%.*s'. Please rename the attribute.",
              (int)(k->s.n > 60 ? 60 : k->s.n), k->s.p);
}

tv tb_call_func(tctx *R, int fn, const tv *args, size_t nargs, const char **kwn, const size_t *kwl, const tv *kwv,
                size_t nkw) {
    switch (fn) {
    case TF_RANGE: {
        if (nkw) tfail(R, DF_EINPUT, "range() takes no keyword arguments");
        if (nargs < 1 || nargs > 3) tfail(R, DF_EINPUT, "range expected 1 to 3 arguments, got %zu", nargs);
        int64_t start = 0, stop, st = 1;
        if (nargs == 1) stop = want_int(R, &args[0], "range() argument");
        else {
            start = want_int(R, &args[0], "range() argument");
            stop = want_int(R, &args[1], "range() argument");
            if (nargs == 3) st = want_int(R, &args[2], "range() argument");
        }
        if (st == 0) tfail(R, DF_EINPUT, "range() arg 3 must not be zero");
        double cnt = 0;
        if (st > 0 && stop > start) cnt = ceil(((double)stop - (double)start) / (double)st);
        else if (st < 0 && start > stop) cnt = ceil(((double)start - (double)stop) / (double)-st);
        if (cnt > 100000) tfail(R, DF_EINPUT, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        tv l = tv_list(R, (size_t)cnt, TL_LIST);
        for (size_t i = 0; i < (size_t)cnt; i++) l.l->v[i] = tv_int(start + (int64_t)i * st);
        return l;
    }
    case TF_NAMESPACE:
    case TF_DICT: {
        tv d = tv_dict(R, nkw + 4);
        if (nargs > 1) tfail(R, DF_EINPUT, "%s expected at most 1 positional argument", fn == TF_DICT ? "dict" : "namespace");
        if (nargs == 1) {
            if (args[0].t == TV_DICT || args[0].t == TV_NS) {
                for (size_t i = 0; i < args[0].d->n; i++) tdict_set(R, d.d, args[0].d->k[i], args[0].d->v[i]);
            } else {
                size_t n;
                tv *items = tb_iterate(R, &args[0], &n);
                for (size_t i = 0; i < n; i++) {
                    size_t m;
                    tv *pair = tb_iterate(R, &items[i], &m);
                    if (m != 2) tfail(R, DF_EINPUT, "dictionary update sequence element #%zu has length %zu; 2 is required", i, m);
                    tdict_set(R, d.d, pair[0], pair[1]);
                }
            }
        }
        for (size_t i = 0; i < nkw; i++) tdict_set(R, d.d, tv_str(kwn[i], kwl[i]), kwv[i]);
        d = tv_seal(R, d);
        if (fn == TF_NAMESPACE) {
            for (size_t i = 0; i < d.d->n; i++) check_ns_name(R, &d.d->k[i]);
            d.t = TV_NS;
        }
        return d;
    }
    case TF_RAISE: {
        tv m = nargs ? tv_to_str(R, &args[0]) : tv_str("", 0);
        char *z = ta_alloc(R, &R->A, m.s.n + 1);
        memcpy(z, m.s.p, m.s.n);
        for (size_t i = 0; i < m.s.n; i++)
            if (!z[i]) z[i] = ' ';
        tfail_raw(R, DF_EINPUT, z);
    }
    case TF_STRFTIME: {
        if (nargs != 1 || args[0].t != TV_STR) tfail(R, DF_EINPUT, "strftime_now() takes one format string");
        /* one conversion prints at most a few dozen bytes (%c); size the
         * buffer for the worst case instead of truncating */
        size_t fl = args[0].s.n;
        if (fl > TPL_MAX_FORMAT_WIDTH)
            tfail(R, DF_EINPUT, "strftime_now() format of %zu bytes exceeds the limit of %d", fl, TPL_MAX_FORMAT_WIDTH);
        char *fmt = ta_alloc(R, &R->A, fl + 1);
        memcpy(fmt, args[0].s.p, fl);
        size_t cap = fl * 64 + 64;
        char *buf = ta_alloc(R, &R->A, cap);
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t n = fl ? strftime(buf, cap, fmt, &tmv) : 0;
        return tv_str(buf, n);
    }
    }
    tfail(R, DF_EINTERNAL, "internal error: unknown function %d", fn);
}

/* ---- tests -------------------------------------------------------------- */

static const char *const TESTS[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string", "mapping",
    "iterable", "sequence", "callable", "sameas", "escaped", "in", "eq", "equalto", "==", "ne", "!=", "lt",
    "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "odd", "even", "divisibleby", "lower",
    "upper", "filter", "test", NULL};

int tb_test_known(const char *name, size_t n) { return in_names(TESTS, name, n); }

int tb_apply_test(tctx *R, const char *name, size_t nl, const tv *v, const tv *args, size_t nargs) {
#define T(s) name_is(name, nl, s)
    if (T("defined")) return v->t != TV_UNDEF;
    if (T("undefined")) return v->t == TV_UNDEF;
    if (T("none")) return v->t == TV_NONE;
    if (T("boolean")) return v->t == TV_BOOL;
    if (T("false")) return v->t == TV_BOOL && !v->b;
    if (T("true")) return v->t == TV_BOOL && v->b;
    if (T("integer")) return v->t == TV_INT;
    if (T("float")) return v->t == TV_FLOAT;
    if (T("number")) return tv_is_num(v);
    if (T("string")) return v->t == TV_STR;
    if (T("mapping")) return v->t == TV_DICT;
    if (T("iterable")) return v->t == TV_STR || v->t == TV_LIST || v->t == TV_DICT || v->t == TV_UNDEF;
    if (T("sequence")) return v->t == TV_STR || (v->t == TV_LIST && v->sub <= TL_TUPLE) || v->t == TV_DICT || v->t == TV_UNDEF;
    if (T("callable")) return v->t == TV_MACRO || v->t == TV_FUNC || v->t == TV_METHOD;
    if (T("escaped")) return v->t == TV_STR && v->sub == TS_MARKUP;
    if (T("filter")) { tv s = nargs ? args[0] : tv_none(); const char *w; return s.t == TV_STR && tb_filter_known(s.s.p, s.s.n, &w); }
    if (T("test")) { tv s = nargs ? args[0] : tv_none(); return s.t == TV_STR && tb_test_known(s.s.p, s.s.n); }
    if (T("lower") || T("upper")) {
        if (v->t != TV_STR) return 0;
        tv s = tb_str_method(R, *v, T("lower") ? "islower" : "isupper", &(targs){0});
        return s.b;
    }
    if (T("odd") || T("even") || T("divisibleby")) {
        if (v->t == TV_UNDEF) tb_undef_fail(R, v);
        tv two = tv_int(2);
        tv d = T("divisibleby") ? (nargs ? args[0] : tv_none()) : two;
        tv m = tb_binop(R, OP_MOD, v, &d);
        int zero = m.t == TV_FLOAT ? m.f == 0 : m.i == 0;
        return T("odd") ? !zero : zero;
    }
    if (!nargs) tfail(R, DF_EINPUT, "test '%.*s' needs an argument", (int)nl, name);
    const tv *o = &args[0];
    if (T("sameas")) {
        if (v->t != o->t) return 0;
        if (v->t == TV_NONE || v->t == TV_UNDEF) return v->t == TV_NONE;
        if (v->t == TV_BOOL) return v->b == o->b;
        return tv_eq(R, v, o) && (v->t != TV_LIST || v->l == o->l) && (v->t != TV_DICT || v->d == o->d);
    }
    if (T("in")) return tb_contains(R, o, v);
    if (T("eq") || T("equalto") || T("==")) return tv_eq(R, v, o);
    if (T("ne") || T("!=")) return !tv_eq(R, v, o);
    if (T("lt") || T("lessthan") || T("<")) return tv_cmp(R, v, o, "<") < 0;
    if (T("le") || T("<=")) return tv_cmp(R, v, o, "<=") <= 0;
    if (T("gt") || T("greaterthan") || T(">")) return tv_cmp(R, v, o, ">") > 0;
    if (T("ge") || T(">=")) return tv_cmp(R, v, o, ">=") >= 0;
#undef T
    tfail(R, DF_EINTERNAL, "internal error: test '%.*s'", (int)nl, name);
}

int tb_test(tctx *R, tscope *S, const node *e, const tv *v) {
    tv *args = e->n ? ta_alloc(R, &R->A, e->n * sizeof(tv)) : NULL;
    for (size_t i = 0; i < e->n; i++) args[i] = teval(R, S, e->list[i]);
    for (size_t i = 0; i < e->n2; i++) teval(R, S, e->list2[i]);
    R->off = e->off;
    return tb_apply_test(R, e->str, e->len, v, args, e->n);
}
