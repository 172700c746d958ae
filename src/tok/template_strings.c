/* template_strings.c - string primitives, Python % formatting, str.format
 * and the str methods of the renderer.
 *
 * Invariants: strings are UTF-8 and counted in code points where Python
 * counts characters; every scan is linear in its operands (the caller, or
 * tb_call_method, charges the cost per byte, so no quadratic worst case may
 * exist); widths and precisions are bounded by TPL_MAX_FORMAT_WIDTH.
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

/* ---- strings ------------------------------------------------------------ */

/* Substring searches in linear time (their cost is charged by the caller
 * per byte, so a quadratic worst case such as 'aaa...a' searched for
 * 'aa...ab' must not exist): glibc's memmem forwards, KMP backwards. */
const char *tb_memfind(tctx *R, const char *h, size_t hn, const char *nd, size_t nn) {
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
tv tb_str_strip(tctx *R, tv s, const tv *chars, int mode) {
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

tv tb_str_map(tctx *R, tv s, uint32_t (*f)(uint32_t)) {
    char *o = ta_alloc(R, &R->A, s.s.n * 2 + 4);
    size_t k = 0;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp;
        i += u8_dec(s.s.p + i, s.s.n - i, &cp);
        k += u8_enc(f(cp), o + k);
    }
    return tv_str(o, k);
}

tv tb_str_capitalize(tctx *R, tv s) {
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
tv tb_jinja_title(tctx *R, tv s) {
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

tv tb_str_replace(tctx *R, tv s, tv old, tv nw, int64_t count) {
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
        const char *f = (count < 0 || done < count) ? tb_memfind(R, s.s.p + i, s.s.n - i, old.s.p, old.s.n) : NULL;
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
                    tv rest = tb_str_strip(R, tv_str(p + i, len - i), NULL, 2);
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
                    tv rest = tb_str_strip(R, tv_str(p, e), NULL, 1);
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
                const char *f = (maxsplit < 0 || (int64_t)n < maxsplit) ? tb_memfind(R, p + i, len - i, sep.s.p, sep.s.n) : NULL;
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

tv tb_html_escape(tctx *R, tv s) {
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

static int64_t cp_index(const char *base, const char *at) { return (int64_t)u8_count(base, (size_t)(at - base)); }

tv tb_str_method(tctx *R, tv s, const char *m, const targs *A) {
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
        return tb_str_strip(R, s, arg(A, 0, NULL), M("strip") ? 3 : M("lstrip") ? 1 : 2);
    }
    if (M("split") || M("rsplit")) {
        static const char *const nm[] = {"sep", "maxsplit", NULL};
        arg_max(R, A, 2, nm);
        const tv *sep = arg(A, 0, "sep"), *mx = arg(A, 1, "maxsplit");
        return str_split(R, s, sep, mx ? want_int(R, mx, "maxsplit") : -1, M("rsplit"));
    }
    if (M("lower")) { arg_max(R, A, 0, none); return tb_str_map(R, s, u_lower); }
    if (M("upper")) { arg_max(R, A, 0, none); return tb_str_map(R, s, u_upper); }
    if (M("casefold")) { arg_max(R, A, 0, none); return tb_str_map(R, s, u_lower); }
    if (M("capitalize")) { arg_max(R, A, 0, none); return tb_str_capitalize(R, s); }
    if (M("title")) { arg_max(R, A, 0, none); return py_title(R, s); }
    if (M("replace")) {
        static const char *const nm[] = {"count", NULL};
        arg_max(R, A, 3, nm);
        if (A->na < 2) tfail(R, DF_EINPUT, "replace() takes at least 2 arguments");
        const tv *cnt = arg(A, 2, "count");
        return tb_str_replace(R, s, want_str(R, &A->a[0], "replace() argument 1"), want_str(R, &A->a[1], "replace() argument 2"),
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
            tb_slice_indices(R, cnt, &st, &en, &(tv){.t = TV_NONE}, &a0, &e0, &stp);
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
            while ((f = tb_memfind(R, hay.s.p + i, hay.s.n - i, sub.s.p, sub.s.n))) { c++; i = (size_t)(f - hay.s.p) + sub.s.n; }
            return tv_int(c);
        }
        const char *f = (M("find") || M("index")) ? tb_memfind(R, hay.s.p, hay.s.n, sub.s.p, sub.s.n)
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
        const char *f = M("partition") ? tb_memfind(R, s.s.p, s.s.n, sep.s.p, sep.s.n) : memrfind(R, s.s.p, s.s.n, sep.s.p, sep.s.n);
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
