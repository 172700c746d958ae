/* template_builtins.c - operators, attribute and item access, string / list
 * / dict methods, filters, tests and global functions of the renderer.
 *
 * Semantics are those of jinja2's ImmutableSandboxedEnvironment as
 * transformers configures it: obj.attr tries the Python attribute (a
 * method) first and then the item, obj[key] the other way round; a miss is
 * Undefined (an error only when used, as jinja2's default Undefined);
 * mutating methods (list.append, dict.update, ...) are unsafe and fail when
 * called; tojson is transformers' json.dumps(ensure_ascii=False, ...).
 * Operators follow Python (int/float promotion, floor division and modulo
 * signs, str/list repetition); ints are 64-bit and overflow is an error.
 */
#include "tok/template_int.h"

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

static tv undef_hint(tctx *R, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static tv undef_hint(tctx *R, const char *fmt, ...) {
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

static int sv_eq(const tv *v, const char *s) { return v->t == TV_STR && v->s.n == strlen(s) && !memcmp(v->s.p, s, v->s.n); }
static int name_is(const char *n, size_t l, const char *s) { return l == strlen(s) && !memcmp(n, s, l); }

static tv soft_str(tctx *R, const tv *v) { return tv_to_str(R, v); }

static int64_t want_int(tctx *R, const tv *v, const char *what) {
    if (v->t == TV_INT) return v->i;
    if (v->t == TV_BOOL) return v->b;
    if (v->t == TV_UNDEF) tb_undef_fail(R, v);
    tfail(R, DF_EINPUT, "%s must be an integer, not '%s'", what, tv_typename(v));
}

static tv want_str(tctx *R, const tv *v, const char *what) {
    if (v->t == TV_STR) return *v;
    if (v->t == TV_UNDEF) tb_undef_fail(R, v);
    tfail(R, DF_EINPUT, "%s must be str, not %s", what, tv_typename(v));
}

/* Argument access: positional index i or keyword name. */
typedef struct {
    const tv *a; size_t na;
    const char **kn; const size_t *kl; const tv *kv; size_t nk;
    const char *fname;
} targs;

static const tv *arg(const targs *A, size_t i, const char *name) {
    if (i < A->na) return &A->a[i];
    for (size_t k = 0; k < A->nk; k++)
        if (name && name_is(A->kn[k], A->kl[k], name)) return &A->kv[k];
    return NULL;
}

static void arg_max(tctx *R, const targs *A, size_t maxpos, const char *const *names) {
    if (A->na > maxpos) tfail(R, DF_EINPUT, "%s() takes at most %zu positional arguments (%zu given)", A->fname, maxpos, A->na);
    for (size_t k = 0; k < A->nk; k++) {
        int ok = 0;
        for (int j = 0; names && names[j]; j++)
            if (name_is(A->kn[k], A->kl[k], names[j])) ok = 1;
        if (!ok) tfail(R, DF_EINPUT, "%s() got an unexpected keyword argument '%.*s'", A->fname, (int)A->kl[k], A->kn[k]);
    }
}

/* ---- strings ------------------------------------------------------------ */

/* Substring searches in linear time (their cost is charged by the caller
 * per byte, so a quadratic worst case such as 'aaa...a' searched for
 * 'aa...ab' must not exist): glibc's memmem forwards, KMP backwards. */
static const char *memfind(tctx *R, const char *h, size_t hn, const char *nd, size_t nn) {
    tcharge(R, TPL_STEP_UNITS / 2);
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    const char *f = memmem(h, hn, nd, nn);
    tcharge(R, (uint64_t)(f ? (size_t)(f - h) + nn : hn) * TPL_SEARCH_UNITS);
    return f;
}
static const char *memrfind(tctx *R, const char *h, size_t hn, const char *nd, size_t nn) {
    tcharge(R, TPL_STEP_UNITS / 2);
    if (nn > hn) return NULL;
    tcharge(R, (uint64_t)(hn + nn) * TPL_SEARCH_UNITS);
    if (nn == 0) return h + hn;
    if (nn == 1) return memrchr(h, nd[0], hn);
    /* KMP over the reversed needle and haystack: rp(j) = nd[nn - 1 - j] */
#define RP(j) nd[nn - 1 - (j)]
    size_t *fail = ta_alloc(R, &R->A, nn * sizeof(size_t));
    for (size_t q = 1, k = 0; q < nn; q++) {
        while (k && RP(q) != RP(k)) k = fail[k - 1];
        if (RP(q) == RP(k)) k++;
        fail[q] = k;
    }
    for (size_t i = 0, k = 0; i < hn; i++) {
        char c = h[hn - 1 - i];
        while (k && c != RP(k)) k = fail[k - 1];
        if (c == RP(k)) k++;
        if (k == nn) return h + (hn - 1 - i);
    }
#undef RP
    return NULL;
}

/* strip chars (NULL: whitespace) from the left (mode 1), right (2) or both (3) */
static tv str_strip(tctx *R, tv s, const tv *chars, int mode) {
    size_t cn = 0;
    uint32_t *cs = NULL;
    if (chars && chars->t != TV_NONE) {
        tv c = want_str(R, chars, "strip arg");
        cs = tv_codepoints(R, c.s.p, c.s.n, &cn);
    }
    const char *p = s.s.p;
    size_t a = 0, b = s.s.n;
    if (mode & 1) {
        while (a < b) {
            uint32_t cp;
            int l = u8_dec(p + a, b - a, &cp);
            int hit = 0;
            if (cs) { for (size_t k = 0; k < cn; k++) if (cs[k] == cp) hit = 1; }
            else hit = u_isspace(cp);
            if (!hit) break;
            a += l;
        }
    }
    if (mode & 2) {
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
            uint32_t cp;
            u8_dec(p + k, b - k, &cp);
            int hit = 0;
            if (cs) { for (size_t q = 0; q < cn; q++) if (cs[q] == cp) hit = 1; }
            else hit = u_isspace(cp);
            if (!hit) break;
            b = k;
        }
    }
    return tv_str(p + a, b - a);
}

static tv str_map(tctx *R, tv s, uint32_t (*f)(uint32_t)) {
    char *o = ta_alloc(R, &R->A, s.s.n * 2 + 4);
    size_t k = 0;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp;
        i += u8_dec(s.s.p + i, s.s.n - i, &cp);
        k += u8_enc(f(cp), o + k);
    }
    return tv_str(o, k);
}

static tv str_capitalize(tctx *R, tv s) {
    char *o = ta_alloc(R, &R->A, s.s.n * 2 + 4);
    size_t k = 0;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp;
        int first = i == 0;
        i += u8_dec(s.s.p + i, s.s.n - i, &cp);
        k += u8_enc(first ? u_upper(cp) : u_lower(cp), o + k);
    }
    return tv_str(o, k);
}

/* jinja2's title filter: words start after runs of [-\s({[<] */
static tv jinja_title(tctx *R, tv s) {
    char *o = ta_alloc(R, &R->A, s.s.n * 2 + 4);
    size_t k = 0;
    int start = 1, prev_sep = -1;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp;
        i += u8_dec(s.s.p + i, s.s.n - i, &cp);
        int sep = u_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        if (prev_sep >= 0 && sep != prev_sep) start = 1;
        k += u8_enc(start ? u_upper(cp) : u_lower(cp), o + k);
        start = 0;
        prev_sep = sep;
    }
    return tv_str(o, k);
}

/* Python str.title: a letter after a non-letter is upper-cased */
static tv py_title(tctx *R, tv s) {
    char *o = ta_alloc(R, &R->A, s.s.n * 2 + 4);
    size_t k = 0;
    int prev_cased = 0;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp;
        i += u8_dec(s.s.p + i, s.s.n - i, &cp);
        uint32_t m = prev_cased ? u_lower(cp) : u_upper(cp);
        k += u8_enc(m, o + k);
        prev_cased = u_isalpha(cp);
    }
    return tv_str(o, k);
}

static tv str_replace(tctx *R, tv s, tv old, tv nw, int64_t count) {
    tout o = {0};
    o.in_arena = 1;
    if (old.s.n == 0) {
        /* insert between code points */
        int64_t done = 0;
        size_t i = 0;
        for (;;) {
            if (count < 0 || done < count) { tout_put(R, &o, nw.s.p, nw.s.n); done++; }
            if (i >= s.s.n) break;
            uint32_t cp;
            int l = u8_dec(s.s.p + i, s.s.n - i, &cp);
            tout_put(R, &o, s.s.p + i, l);
            i += l;
        }
        return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i <= s.s.n) {
        const char *f = (count < 0 || done < count) ? memfind(R, s.s.p + i, s.s.n - i, old.s.p, old.s.n) : NULL;
        if (!f) { tout_put(R, &o, s.s.p + i, s.s.n - i); break; }
        size_t at = (size_t)(f - s.s.p);
        tout_put(R, &o, s.s.p + i, at - i);
        tout_put(R, &o, nw.s.p, nw.s.n);
        i = at + old.s.n;
        done++;
    }
    return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
}

/* Python str.split / rsplit */
static tv str_split(tctx *R, tv s, const tv *sepv, int64_t maxsplit, int right) {
    tv out[4096];
    size_t n = 0;
    tv *big = NULL;
    size_t cap = 4096;
    tv *dst = out;
#define PUSH(x)                                                                 \
    do {                                                                        \
        if (n == cap) {                                                         \
            tv *nb = ta_alloc(R, &R->A, cap * 2 * sizeof(tv));                  \
            memcpy(nb, dst, n * sizeof(tv));                                    \
            dst = big = nb;                                                     \
            cap *= 2;                                                           \
        }                                                                       \
        dst[n++] = (x);                                                         \
    } while (0)
    const char *p = s.s.p;
    size_t len = s.s.n;
    if (!sepv || sepv->t == TV_NONE) {
        if (!right) {
            size_t i = 0;
            for (;;) {
                while (i < len) { uint32_t cp; int l = u8_dec(p + i, len - i, &cp); if (!u_isspace(cp)) break; i += l; }
                if (i >= len) break;
                if (maxsplit >= 0 && (int64_t)n >= maxsplit) {
                    tv rest = str_strip(R, tv_str(p + i, len - i), NULL, 2);
                    PUSH(rest);
                    break;
                }
                size_t j = i;
                while (j < len) { uint32_t cp; int l = u8_dec(p + j, len - j, &cp); if (u_isspace(cp)) break; j += l; }
                PUSH(tv_str(p + i, j - i));
                i = j;
            }
        } else {
            size_t e = len;
            for (;;) {
                while (e > 0) { size_t k = e - 1; while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80) k--; uint32_t cp; u8_dec(p + k, e - k, &cp); if (!u_isspace(cp)) break; e = k; }
                if (e == 0) break;
                if (maxsplit >= 0 && (int64_t)n >= maxsplit) {
                    tv rest = str_strip(R, tv_str(p, e), NULL, 1);
                    PUSH(rest);
                    break;
                }
                size_t b = e;
                while (b > 0) { size_t k = b - 1; while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80) k--; uint32_t cp; u8_dec(p + k, b - k, &cp); if (u_isspace(cp)) break; b = k; }
                PUSH(tv_str(p + b, e - b));
                e = b;
            }
        }
    } else {
        tv sep = want_str(R, sepv, "separator");
        if (!sep.s.n) tfail(R, DF_EINPUT, "empty separator");
        if (!right) {
            size_t i = 0;
            for (;;) {
                const char *f = (maxsplit < 0 || (int64_t)n < maxsplit) ? memfind(R, p + i, len - i, sep.s.p, sep.s.n) : NULL;
                if (!f) { PUSH(tv_str(p + i, len - i)); break; }
                PUSH(tv_str(p + i, (size_t)(f - (p + i))));
                i = (size_t)(f - p) + sep.s.n;
            }
        } else {
            size_t e = len;
            for (;;) {
                const char *f = (maxsplit < 0 || (int64_t)n < maxsplit) ? memrfind(R, p, e, sep.s.p, sep.s.n) : NULL;
                if (!f) { PUSH(tv_str(p, e)); break; }
                size_t at = (size_t)(f - p);
                PUSH(tv_str(p + at + sep.s.n, e - at - sep.s.n));
                e = at;
            }
        }
    }
#undef PUSH
    (void)big;
    tv l = tv_list(R, n, TL_LIST);
    for (size_t i = 0; i < n; i++) l.l->v[i] = right ? dst[n - 1 - i] : dst[i];
    return l;
}

static int str_starts_ends(tctx *R, tv s, const tv *pre, int ends) {
    if (pre->t == TV_LIST && pre->sub == TL_TUPLE) {
        for (size_t i = 0; i < pre->l->n; i++)
            if (str_starts_ends(R, s, &pre->l->v[i], ends)) return 1;
        return 0;
    }
    if (pre->t != TV_STR)
        tfail(R, DF_EINPUT, "%s first arg must be str or a tuple of str, not %s", ends ? "endswith" : "startswith", tv_typename(pre));
    if (pre->s.n > s.s.n) return 0;
    return !memcmp(ends ? s.s.p + s.s.n - pre->s.n : s.s.p, pre->s.p, pre->s.n);
}

static tv html_escape(tctx *R, tv s) {
    tout o = {0};
    o.in_arena = 1;
    for (size_t i = 0; i < s.s.n; i++) {
        const char *r = NULL;
        switch (s.s.p[i]) {
        case '&': r = "&amp;"; break;
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '"': r = "&#34;"; break;
        case '\'': r = "&#39;"; break;
        }
        if (r) tout_put(R, &o, r, strlen(r));
        else tout_put(R, &o, s.s.p + i, 1);
    }
    tv v = o.len ? tv_str(o.p, o.len) : tv_str("", 0);
    v.sub = TS_MARKUP;
    return v;
}

/* ---- Python % formatting -------------------------------------------------- */

tv tb_percent_format(tctx *R, const tv *fmtv, const tv *args) {
    tv fmt = *fmtv;
    const tv *items = args;
    size_t nitems = 1, used = 0;
    const tdict *mapping = NULL;
    if (args->t == TV_LIST && args->sub == TL_TUPLE) { items = args->l->v; nitems = args->l->n; }
    else if (args->t == TV_DICT) mapping = args->d;
    tout o = {0};
    o.in_arena = 1;
    const char *p = fmt.s.p;
    size_t n = fmt.s.n;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') { tout_put(R, &o, p + i, 1); continue; }
        i++;
        if (i >= n) tfail(R, DF_EINPUT, "incomplete format");
        if (p[i] == '%') { tout_put(R, &o, "%", 1); continue; }
        const tv *val = NULL;
        if (p[i] == '(') {
            size_t j = i + 1;
            while (j < n && p[j] != ')') j++;
            if (j >= n || !mapping) tfail(R, DF_EINPUT, "format requires a mapping");
            val = tdict_gets(R, mapping, p + i + 1, j - i - 1);
            if (!val) tfail(R, DF_EINPUT, "format key '%.*s' not found", (int)(j - i - 1), p + i + 1);
            i = j + 1;
        }
        /* flags, width and precision, rebuilt into a C spec; widths and
         * precisions beyond TPL_MAX_FORMAT_WIDTH are refused (Python would
         * build strings of that size) */
        char spec[48];
        size_t sl = 0;
        int left = 0;
        long width = -1, prec = -1;
        spec[sl++] = '%';
        while (i < n && p[i] && strchr("-+ #0", p[i])) {
            if (p[i] == '-') left = 1;
            if (sl < 8 && !memchr(spec + 1, p[i], sl - 1)) spec[sl++] = p[i];
            i++;
        }
        for (int part = 0; part < 2; part++) {
            if (part == 1) {
                if (i >= n || p[i] != '.') break;
                i++;
                prec = 0;
            }
            long v = 0;
            int any = 0;
            while (i < n && p[i] >= '0' && p[i] <= '9') {
                v = v * 10 + (p[i++] - '0');
                any = 1;
                if (v > TPL_MAX_FORMAT_WIDTH)
                    tfail(R, DF_EINPUT, "%% format %s exceeds the limit of %d", part ? "precision" : "width",
                          TPL_MAX_FORMAT_WIDTH);
            }
            if (part == 0 && any) width = v;
            if (part == 1) prec = v;
        }
        if (width >= 0) sl += (size_t)snprintf(spec + sl, sizeof spec - sl, "%ld", width);
        if (prec >= 0) sl += (size_t)snprintf(spec + sl, sizeof spec - sl, ".%ld", prec);
        if (i >= n) tfail(R, DF_EINPUT, "incomplete format");
        char conv = p[i];
        if (!val) {
            if (mapping) val = args;
            else {
                if (used >= nitems) tfail(R, DF_EINPUT, "not enough arguments for format string");
                val = &items[used++];
            }
        }
        char buf[512];
        switch (conv) {
        case 's': case 'r': case 'a': {
            tout t = {0};
            t.in_arena = 1;
            if (conv == 's') tv_str_into(R, &t, val);
            else tv_repr_into(R, &t, val);
            /* width and precision count code points, as in Python */
            size_t len = t.len, cps = u8_count(t.p, t.len);
            if (prec >= 0 && cps > (size_t)prec) {
                size_t k = 0, c = 0;
                while (k < len && c < (size_t)prec) {
                    k++;
                    while (k < len && ((unsigned char)t.p[k] & 0xC0) == 0x80) k++;
                    c++;
                }
                len = k;
                cps = c;
            }
            size_t pad = width > 0 && (size_t)width > cps ? (size_t)width - cps : 0;
            if (pad && !left) for (size_t k = 0; k < pad; k++) tout_put(R, &o, " ", 1);
            tout_put(R, &o, t.p, len);
            if (pad && left) for (size_t k = 0; k < pad; k++) tout_put(R, &o, " ", 1);
            break;
        }
        case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': {
            int64_t iv;
            if (val->t == TV_FLOAT) iv = (int64_t)val->f;
            else if (val->t == TV_INT || val->t == TV_BOOL) iv = val->t == TV_INT ? val->i : val->b;
            else tfail(R, DF_EINPUT, "%%%c format: a real number is required, not %s", conv, tv_typename(val));
            spec[sl++] = 'l'; spec[sl++] = 'l';
            spec[sl++] = conv == 'u' || conv == 'i' ? 'd' : conv;
            spec[sl] = 0;
            int need = snprintf(NULL, 0, spec, (long long)iv);
            char *ob = ta_alloc(R, &R->A, (size_t)need + 1);
            snprintf(ob, (size_t)need + 1, spec, (long long)iv);
            tout_put(R, &o, ob, (size_t)need);
            break;
        }
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
            double fv;
            if (val->t == TV_FLOAT) fv = val->f;
            else if (val->t == TV_INT) fv = (double)val->i;
            else if (val->t == TV_BOOL) fv = val->b;
            else tfail(R, DF_EINPUT, "must be real number, not %s", tv_typename(val));
            spec[sl++] = conv;
            spec[sl] = 0;
            /* sized exactly: '%.600f' % 1.5 is 602 bytes, as in Python */
            int need = snprintf(NULL, 0, spec, fv);
            char *ob = ta_alloc(R, &R->A, (size_t)need + 1);
            snprintf(ob, (size_t)need + 1, spec, fv);
            tout_put(R, &o, ob, (size_t)need);
            break;
        }
        case 'c': {
            uint32_t cp = 0;
            if (val->t == TV_INT) cp = (uint32_t)val->i;
            else if (val->t == TV_STR && u8_count(val->s.p, val->s.n) == 1) u8_dec(val->s.p, val->s.n, &cp);
            else tfail(R, DF_EINPUT, "%%c requires int or char");
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) tfail(R, DF_EINPUT, "%%c arg not in range");
            int l = u8_enc(cp, buf);
            tout_put(R, &o, buf, (size_t)l);
            break;
        }
        default: tfail(R, DF_EUNSUPPORTED, "unsupported format character '%c'", conv);
        }
    }
    if (!mapping && used < nitems && !(args->t != TV_LIST || args->sub != TL_TUPLE ? 0 : 0))
        if (args->t == TV_LIST && args->sub == TL_TUPLE) tfail(R, DF_EINPUT, "not all arguments converted during string formatting");
    return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
}

/* str.format with {} {0} {name} {0!r} and no format specs */
static tv str_format(tctx *R, tv fmt, const targs *A) {
    tout o = {0};
    o.in_arena = 1;
    size_t auto_i = 0;
    const char *p = fmt.s.p;
    size_t n = fmt.s.n;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '{' && i + 1 < n && p[i + 1] == '{') { tout_put(R, &o, "{", 1); i++; continue; }
        if (c == '}' && i + 1 < n && p[i + 1] == '}') { tout_put(R, &o, "}", 1); i++; continue; }
        if (c == '}') tfail(R, DF_EINPUT, "Single '}' encountered in format string");
        if (c != '{') { tout_put(R, &o, p + i, 1); continue; }
        size_t j = i + 1;
        while (j < n && p[j] != '}' && p[j] != '!' && p[j] != ':') j++;
        if (j >= n) tfail(R, DF_EINPUT, "expected '}' before end of string");
        const char *field = p + i + 1;
        size_t fl = j - i - 1;
        char conv = 's';
        if (p[j] == '!') {
            if (j + 1 >= n) tfail(R, DF_EINPUT, "unmatched '{' in format spec");
            conv = p[j + 1];
            j += 2;
        }
        if (j < n && p[j] == ':') {
            size_t k = j + 1;
            while (k < n && p[k] != '}') k++;
            if (k > j + 1) tfail(R, DF_EUNSUPPORTED, "unsupported: format specs in str.format");
            j = k;
        }
        if (j >= n || p[j] != '}') tfail(R, DF_EINPUT, "expected '}' before end of string");
        const tv *val = NULL;
        if (fl == 0) {
            val = auto_i < A->na ? &A->a[auto_i] : NULL;
            auto_i++;
        } else if (field[0] >= '0' && field[0] <= '9') {
            size_t idx = (size_t)strtoul(field, NULL, 10);
            val = idx < A->na ? &A->a[idx] : NULL;
        } else {
            for (size_t k = 0; k < A->nk; k++)
                if (A->kl[k] == fl && !memcmp(A->kn[k], field, fl)) val = &A->kv[k];
        }
        if (!val) tfail(R, DF_EINPUT, "format: missing argument for field '{%.*s}'", (int)fl, field);
        if (conv == 'r') tv_repr_into(R, &o, val);
        else tv_str_into(R, &o, val);
        i = j;
    }
    return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
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
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"pop", "popitem", "setdefault", "update", "clear", "fromkeys", NULL};

static int in_names(const char *const *names, const char *n, size_t l) {
    for (int i = 0; names[i]; i++)
        if (name_is(n, l, names[i])) return 1;
    return 0;
}

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
    if (name_is(name, n, "previtem")) return L->i > 0 ? L->items[L->i - 1] : undef_hint(R, "there is no previous item");
    if (name_is(name, n, "nextitem")) return L->i + 1 < L->n ? L->items[L->i + 1] : undef_hint(R, "there is no next item");
    if (name_is(name, n, "cycle") || name_is(name, n, "changed")) return method(R, obj, name, n);
    return tv_undef_named(R, name, n, "LoopContext object");
}

tv tb_getattr(tctx *R, const tv *obj, const char *name, size_t n) {
    switch (obj->t) {
    case TV_UNDEF: tb_undef_fail(R, obj);
    case TV_DICT: {
        if (in_names(DICT_METHODS, name, n)) return method(R, obj, name, n);
        if (in_names(DICT_UNSAFE, name, n))
            return undef_hint(R, "access to attribute '%.*s' of 'dict' object is unsafe.", (int)n, name);
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
                return undef_hint(R, "access to attribute '%.*s' of 'list' object is unsafe.", (int)n, name);
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
            return undef_hint(R, "'%s object' has no element %lld", tv_typename(obj), (long long)ki);
        }
        break;
    case TV_STR:
        if (intkey) {
            size_t cnt = u8_count(obj->s.p, obj->s.n), at;
            if (!index_of(R, ki, cnt, &at)) return undef_hint(R, "'str object' has no element %lld", (long long)ki);
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
        if (obj->t == TV_DICT && !in_names(DICT_METHODS, key->s.p, key->s.n) && !in_names(DICT_UNSAFE, key->s.p, key->s.n))
            return tv_undef_named(R, key->s.p, key->s.n, "dict object");
        return tb_getattr(R, obj, key->s.p, key->s.n);
    }
    tv ks = tv_to_str(R, key);
    return tv_undef_named(R, ks.s.p, ks.s.n, owner_name(R, obj));
}

/* Python slice.indices */
static void slice_indices(tctx *R, size_t len, const tv *a, const tv *b, const tv *c, int64_t *start, int64_t *stop,
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
        slice_indices(R, obj->l->n, a, b, c, &s, &e, &st);
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
        slice_indices(R, cnt, a, b, c, &s, &e, &st);
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
        return memfind(R, c->s.p, c->s.n, item->s.p, item->s.n) != NULL;
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

_Noreturn static void overflow(tctx *R) { tfail(R, DF_EUNSUPPORTED, "integer overflow (only 64-bit integers are supported)"); }

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
            if (markup && x.sub != TS_MARKUP) x = html_escape(R, x);
            if (markup && y.sub != TS_MARKUP) y = html_escape(R, y);
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
    if (!case_sensitive && k.t == TV_STR) k = str_map(R, k, u_lower);
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

static int64_t cp_index(const char *base, const char *at) { return (int64_t)u8_count(base, (size_t)(at - base)); }

static tv str_method(tctx *R, tv s, const char *m, const targs *A) {
#define M(name) (!strcmp(m, name))
    static const char *const none[] = {NULL};
    if (M("startswith") || M("endswith")) {
        static const char *const nm[] = {NULL};
        arg_max(R, A, 3, nm);
        const tv *pre = arg(A, 0, NULL);
        if (!pre) tfail(R, DF_EINPUT, "%s() takes at least 1 argument (0 given)", m);
        tv sub = s;
        if (A->na > 1) {
            tv st = A->a[1], en = A->na > 2 ? A->a[2] : tv_none();
            sub = tb_slice(R, &s, &st, &en, &(tv){.t = TV_NONE});
            if (sub.t != TV_STR) sub = tv_str("", 0);
        }
        return tv_bool(str_starts_ends(R, sub, pre, M("endswith")));
    }
    if (M("strip") || M("lstrip") || M("rstrip")) {
        arg_max(R, A, 1, none);
        return str_strip(R, s, arg(A, 0, NULL), M("strip") ? 3 : M("lstrip") ? 1 : 2);
    }
    if (M("split") || M("rsplit")) {
        static const char *const nm[] = {"sep", "maxsplit", NULL};
        arg_max(R, A, 2, nm);
        const tv *sep = arg(A, 0, "sep"), *mx = arg(A, 1, "maxsplit");
        return str_split(R, s, sep, mx ? want_int(R, mx, "maxsplit") : -1, M("rsplit"));
    }
    if (M("lower")) { arg_max(R, A, 0, none); return str_map(R, s, u_lower); }
    if (M("upper")) { arg_max(R, A, 0, none); return str_map(R, s, u_upper); }
    if (M("casefold")) { arg_max(R, A, 0, none); return str_map(R, s, u_lower); }
    if (M("capitalize")) { arg_max(R, A, 0, none); return str_capitalize(R, s); }
    if (M("title")) { arg_max(R, A, 0, none); return py_title(R, s); }
    if (M("replace")) {
        static const char *const nm[] = {"count", NULL};
        arg_max(R, A, 3, nm);
        if (A->na < 2) tfail(R, DF_EINPUT, "replace() takes at least 2 arguments");
        const tv *cnt = arg(A, 2, "count");
        return str_replace(R, s, want_str(R, &A->a[0], "replace() argument 1"), want_str(R, &A->a[1], "replace() argument 2"),
                           cnt ? want_int(R, cnt, "count") : -1);
    }
    if (M("find") || M("rfind") || M("index") || M("rindex") || M("count")) {
        arg_max(R, A, 3, none);
        if (A->na < 1) tfail(R, DF_EINPUT, "%s() takes at least 1 argument", m);
        tv sub = want_str(R, &A->a[0], "substring");
        int64_t off = 0;
        tv hay = s;
        if (A->na > 1) {
            tv st = A->a[1], en = A->na > 2 ? A->a[2] : tv_none();
            size_t cnt = u8_count(s.s.p, s.s.n);
            int64_t a0, e0, stp;
            slice_indices(R, cnt, &st, &en, &(tv){.t = TV_NONE}, &a0, &e0, &stp);
            off = a0;
            hay = tb_slice(R, &s, &st, &en, &(tv){.t = TV_NONE});
            if (e0 < a0) {
                if (M("count")) return tv_int(0);
                if (M("find") || M("rfind")) return tv_int(-1);
                tfail(R, DF_EINPUT, "substring not found");
            }
        }
        if (M("count")) {
            if (!sub.s.n) return tv_int((int64_t)u8_count(hay.s.p, hay.s.n) + 1);
            int64_t c = 0;
            size_t i = 0;
            const char *f;
            while ((f = memfind(R, hay.s.p + i, hay.s.n - i, sub.s.p, sub.s.n))) { c++; i = (size_t)(f - hay.s.p) + sub.s.n; }
            return tv_int(c);
        }
        const char *f = (M("find") || M("index")) ? memfind(R, hay.s.p, hay.s.n, sub.s.p, sub.s.n)
                                                  : memrfind(R, hay.s.p, hay.s.n, sub.s.p, sub.s.n);
        if (!f) {
            if (M("index") || M("rindex")) tfail(R, DF_EINPUT, "substring not found");
            return tv_int(-1);
        }
        return tv_int(off + cp_index(hay.s.p, f));
    }
    if (M("join")) {
        arg_max(R, A, 1, none);
        if (A->na != 1) tfail(R, DF_EINPUT, "join() takes exactly one argument");
        size_t n;
        tv *items = tb_iterate(R, &A->a[0], &n);
        tout o = {0};
        o.in_arena = 1;
        for (size_t i = 0; i < n; i++) {
            if (items[i].t != TV_STR) tfail(R, DF_EINPUT, "sequence item %zu: expected str instance, %s found", i, tv_typename(&items[i]));
            if (i) tout_put(R, &o, s.s.p, s.s.n);
            tout_put(R, &o, items[i].s.p, items[i].s.n);
        }
        return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
    }
    if (M("format")) return str_format(R, s, A);
    if (M("removeprefix") || M("removesuffix")) {
        arg_max(R, A, 1, none);
        if (A->na != 1) tfail(R, DF_EINPUT, "%s() takes exactly one argument", m);
        tv x = want_str(R, &A->a[0], m);
        if (str_starts_ends(R, s, &x, M("removesuffix")))
            return M("removeprefix") ? tv_str(s.s.p + x.s.n, s.s.n - x.s.n) : tv_str(s.s.p, s.s.n - x.s.n);
        return s;
    }
    if (M("splitlines")) {
        static const char *const nm[] = {"keepends", NULL};
        arg_max(R, A, 1, nm);
        const tv *ke = arg(A, 0, "keepends");
        int keep = ke && tv_truthy(ke);
        tv out = tv_list(R, s.s.n + 1, TL_LIST);
        size_t n = 0, i = 0, start = 0;
        while (i < s.s.n) {
            uint32_t cp;
            int l = u8_dec(s.s.p + i, s.s.n - i, &cp);
            int brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
                      cp == 0x2028 || cp == 0x2029;
            if (!brk) { i += l; continue; }
            size_t end = i;
            i += l;
            if (cp == '\r' && i < s.s.n && s.s.p[i] == '\n') i++;
            out.l->v[n++] = tv_str(s.s.p + start, (keep ? i : end) - start);
            start = i;
        }
        if (start < s.s.n) out.l->v[n++] = tv_str(s.s.p + start, s.s.n - start);
        out.l->n = n;
        return out;
    }
    if (M("isdigit") || M("isdecimal") || M("isnumeric") || M("isalpha") || M("isalnum") || M("isspace") ||
        M("islower") || M("isupper") || M("isascii")) {
        arg_max(R, A, 0, none);
        if (M("isascii")) return tv_bool(tv_is_ascii(s.s.p, s.s.n));
        if (!s.s.n) return tv_bool(0);
        int cased = 0;
        for (size_t i = 0; i < s.s.n;) {
            uint32_t cp;
            i += u8_dec(s.s.p + i, s.s.n - i, &cp);
            if (M("isdigit") || M("isdecimal") || M("isnumeric")) { if (!u_isdigit(cp)) return tv_bool(0); }
            else if (M("isalpha")) { if (!u_isalpha(cp)) return tv_bool(0); }
            else if (M("isalnum")) { if (!u_isalnum(cp)) return tv_bool(0); }
            else if (M("isspace")) { if (!u_isspace(cp)) return tv_bool(0); }
            else if (M("islower")) { if (u_upper(cp) != cp && u_lower(cp) == cp) cased = 1; else if (u_lower(cp) != cp) return tv_bool(0); }
            else { if (u_lower(cp) != cp && u_upper(cp) == cp) cased = 1; else if (u_upper(cp) != cp) return tv_bool(0); }
        }
        return tv_bool((M("islower") || M("isupper")) ? cased : 1);
    }
    if (M("swapcase")) {
        arg_max(R, A, 0, none);
        char *o = ta_alloc(R, &R->A, s.s.n * 2 + 4);
        size_t k = 0;
        for (size_t i = 0; i < s.s.n;) {
            uint32_t cp;
            i += u8_dec(s.s.p + i, s.s.n - i, &cp);
            uint32_t lo = u_lower(cp);
            k += u8_enc(lo != cp ? lo : u_upper(cp), o + k);
        }
        return tv_str(o, k);
    }
    if (M("partition") || M("rpartition")) {
        arg_max(R, A, 1, none);
        if (A->na != 1) tfail(R, DF_EINPUT, "%s() takes exactly one argument", m);
        tv sep = want_str(R, &A->a[0], "separator");
        if (!sep.s.n) tfail(R, DF_EINPUT, "empty separator");
        const char *f = M("partition") ? memfind(R, s.s.p, s.s.n, sep.s.p, sep.s.n) : memrfind(R, s.s.p, s.s.n, sep.s.p, sep.s.n);
        tv t = tv_list(R, 3, TL_TUPLE);
        if (!f) {
            t.l->v[0] = M("partition") ? s : tv_str("", 0);
            t.l->v[1] = tv_str("", 0);
            t.l->v[2] = M("partition") ? tv_str("", 0) : s;
        } else {
            t.l->v[0] = tv_str(s.s.p, (size_t)(f - s.s.p));
            t.l->v[1] = sep;
            t.l->v[2] = tv_str(f + sep.s.n, s.s.n - (size_t)(f - s.s.p) - sep.s.n);
        }
        return t;
    }
    tfail(R, DF_EUNSUPPORTED, "unsupported string method '%s'", m);
#undef M
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
    case TV_STR: return str_method(R, *self, m, &A);
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

/* ---- tests -------------------------------------------------------------- */

static const char *const TESTS[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string", "mapping",
    "iterable", "sequence", "callable", "sameas", "escaped", "in", "eq", "equalto", "==", "ne", "!=", "lt",
    "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "odd", "even", "divisibleby", "lower",
    "upper", "filter", "test", NULL};

int tb_test_known(const char *name, size_t n) { return in_names(TESTS, name, n); }

static int apply_test(tctx *R, const char *name, size_t nl, const tv *v, const tv *args, size_t nargs) {
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
        tv s = str_method(R, *v, T("lower") ? "islower" : "isupper", &(targs){0});
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
    return apply_test(R, e->str, e->len, v, args, e->n);
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
            ok = apply_test(R, tn.s.p, tn.s.n, &x, A->a + ai + 1, A->na - ai - 1);
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
    if (!n) return undef_hint(R, "No aggregated item, sequence was empty.");
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
    tv lines = str_method(R, tv_str(buf, s.s.n + 1), "splitlines", &(targs){0});
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
        return str_strip(R, soft_str(R, &v), arg(A, 0, "chars"), 3);
    }
    if (F("lower")) { arg_max(R, A, 0, none); return str_map(R, soft_str(R, &v), u_lower); }
    if (F("upper")) { arg_max(R, A, 0, none); return str_map(R, soft_str(R, &v), u_upper); }
    if (F("capitalize")) { arg_max(R, A, 0, none); return str_capitalize(R, soft_str(R, &v)); }
    if (F("title")) { arg_max(R, A, 0, none); return jinja_title(R, soft_str(R, &v)); }
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
        if (!n) return undef_hint(R, F("first") ? "No first item, sequence was empty." : "No last item, sequence was empty.");
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
        return str_replace(R, soft_str(R, &v), os, ns, c && c->t != TV_NONE ? want_int(R, c, "count") : -1);
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
            tv s = str_strip(R, v, NULL, 3);
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
            tv s = str_strip(R, v, NULL, 3);
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
        return html_escape(R, soft_str(R, &v));
    }
    if (F("attr")) {
        arg_max(R, A, 1, none);
        if (A->na != 1) tfail(R, DF_EINPUT, "attr filter needs a name");
        tv nm = want_str(R, &A->a[0], "attribute name");
        if (v.t == TV_DICT) {
            if (in_names(DICT_METHODS, nm.s.p, nm.s.n)) return tb_getattr(R, &v, nm.s.p, nm.s.n);
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
