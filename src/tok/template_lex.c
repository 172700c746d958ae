/* template_lex.c - lexer of the Jinja2 subset (see template_parse.c for the
 * rules it reproduces: trim_blocks and lstrip_blocks, whitespace control,
 * newline normalisation, Python unicode-escape string literals).
 *
 * Invariants: produces p->t, a token array in the template's arena ending in
 * K_EOF; bracket nesting inside tags is bounded by MAX_NEST; every error
 * names the line and column through tp_pfail.
 */
#include "tok/template_parse_int.h"

#include "deltafin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- lexer ------------------------------------------------------------ */

static tok *emit(P *p, int k, size_t off) {
    if (p->nt == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        tok *n = ta_alloc(p->R, &p->T->A, nc * sizeof(tok));
        if (p->nt) memcpy(n, p->t, p->nt * sizeof(tok));
        p->t = n;
        p->cap = nc;
    }
    tok *t = &p->t[p->nt++];
    memset(t, 0, sizeof *t);
    t->k = k;
    t->off = (uint32_t)off;
    return t;
}

/* length of the Unicode whitespace code point at s[i], or 0 */
static int ws_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    uint32_t cp;
    int l = u8_dec(s + i, n - i, &cp);
    return u_isspace(cp) ? l : 0;
}
static size_t skip_ws(const char *s, size_t n, size_t i) {
    int l;
    while ((l = ws_at(s, n, i)) > 0) i += l;
    return i;
}
/* end of s[a..b) with trailing whitespace removed (Python str.rstrip) */
static size_t rstrip_ws(const char *s, size_t a, size_t b) {
    while (b > a) {
        size_t k = b - 1;
        while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        if (!ws_at(s, b, k)) break;
        b = k;
    }
    return b;
}
static int starts(const char *s, size_t n, size_t i, const char *lit) {
    size_t l = strlen(lit);
    return i + l <= n && memcmp(s + i, lit, l) == 0;
}

/* lstrip_blocks / "-" handling of the data before a tag; returns the new end */
static size_t strip_before(const char *s, size_t a, size_t b, char sign, int lstrip_ok, int line_starting) {
    if (sign == '-') return rstrip_ws(s, a, b);
    if (sign == '+' || !lstrip_ok) return b;
    size_t l = b;
    while (l > a && s[l - 1] != '\n') l--;
    int has_nl = l > a;
    if (!has_nl && !line_starting) return b;
    if (l == b) return b;
    for (size_t k = l; k < b;) {
        int w = ws_at(s, b, k);
        if (!w) return b;
        k += w;
    }
    return l;
}

static void emit_data(P *p, size_t a, size_t b) {
    if (b <= a) return;
    tok *t = emit(p, K_DATA, a);
    t->p = p->T->src + a;
    t->n = b - a;
}

/* Decodes a string literal body s[a..b) into the arena. */
static void decode_string(P *p, size_t a, size_t b, tok *t) {
    const char *s = p->T->src;
    char *o = ta_alloc(p->R, &p->T->A, (b - a) * 3 + 16);
    size_t k = 0;
    for (size_t i = a; i < b;) {
        if (s[i] != '\\') { o[k++] = s[i++]; continue; }
        size_t esc = i;
        i++;
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            /* backslashreplace turned the character into "\xNN"/"\uNNNN"/"\UNNNNNNNN";
             * the backslash before it escapes that backslash */
            uint32_t cp;
            int l = u8_dec(s + i, b - i, &cp);
            o[k++] = '\\';
            k += (size_t)sprintf(o + k, cp < 0x100 ? "x%02x" : cp < 0x10000 ? "u%04x" : "U%08x", cp);
            i += l;
            continue;
        }
        i++;
        uint32_t cp = 0;
        int nhex = 0;
        switch (c) {
        case '\n': continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = 7; continue;
        case 'b': o[k++] = 8; continue;
        case 'f': o[k++] = 12; continue;
        case 'n': o[k++] = '\n'; continue;
        case 'r': o[k++] = '\r'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'v': o[k++] = 11; continue;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case 'N': tp_pfail(p, (uint32_t)esc, "\\N{...} escapes in string literals are not supported");
        default:
            if (c >= '0' && c <= '7') {
                cp = c - '0';
                for (int d = 0; d < 2 && i < b && s[i] >= '0' && s[i] <= '7'; d++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += u8_enc(cp, o + k);
                continue;
            }
            o[k++] = '\\';
            o[k++] = (char)c;
            continue;
        }
        for (int d = 0; d < nhex; d++, i++) {
            char h = i < b ? s[i] : 0;
            int v = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (v < 0) tp_pfail(p, (uint32_t)esc, "truncated \\%c escape in string literal", c);
            cp = cp * 16 + (uint32_t)v;
        }
        if (cp > 0x10FFFF) tp_pfail(p, (uint32_t)esc, "illegal Unicode character in string literal");
        if (cp >= 0xD800 && cp <= 0xDFFF) tp_pfail(p, (uint32_t)esc, "surrogate code points in string literals are not supported");
        k += u8_enc(cp, o + k);
    }
    t->p = o;
    t->n = k;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
/* (\d+_)*\d+ at i; returns end or i when no match */
static size_t digits_us(const char *s, size_t n, size_t i) {
    size_t j = i, last = i;
    while (j < n && is_digit(s[j])) {
        while (j < n && is_digit(s[j])) j++;
        last = j;
        if (j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) j++;
        else break;
    }
    return last;
}

static const char *OPS2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

/* Lexes the inside of a {{ }} or {% %} tag starting at pos; returns the
 * position after the end tag and sets *line_starting. */
static size_t lex_tag(P *p, size_t pos, int block, int *line_starting, size_t tag_off) {
    const char *s = p->T->src;
    size_t n = p->T->srclen;
    char bal[MAX_NEST];
    int nb = 0;
    for (;;) {
        if (pos >= n) tp_pfail(p, (uint32_t)tag_off, "unexpected end of template: %s tag is not closed", block ? "{%" : "{{");
        if (nb == 0) {
            size_t end = 0;
            if (block) {
                if (starts(s, n, pos, "+%}")) end = pos + 3;
                else if (starts(s, n, pos, "-%}")) end = skip_ws(s, n, pos + 3);
                else if (starts(s, n, pos, "%}")) end = pos + 2 + (pos + 2 < n && s[pos + 2] == '\n');
            } else {
                if (starts(s, n, pos, "-}}")) end = skip_ws(s, n, pos + 3);
                else if (starts(s, n, pos, "}}")) end = pos + 2;
            }
            if (end) {
                emit(p, block ? K_BEND : K_VEND, pos);
                *line_starting = s[end - 1] == '\n';
                return end;
            }
        }
        int w = ws_at(s, n, pos);
        if (w) { pos += w; continue; }
        char c = s[pos];
        /* float: (?<!\.)D(\.D)?e[+-]?D | D\.D */
        if (is_digit(c) && !(pos > 0 && s[pos - 1] == '.')) {
            size_t j = digits_us(s, n, pos), fe = 0;
            size_t k = j;
            int frac = 0;
            if (k + 1 < n && s[k] == '.' && is_digit(s[k + 1])) { k = digits_us(s, n, k + 1); frac = 1; }
            if (k < n && (s[k] == 'e' || s[k] == 'E')) {
                size_t e = k + 1;
                if (e < n && (s[e] == '+' || s[e] == '-')) e++;
                if (e < n && is_digit(s[e])) fe = digits_us(s, n, e);
            }
            if (fe || frac) {
                size_t end = fe ? fe : k;
                char buf[128];
                size_t bl = 0;
                for (size_t q = pos; q < end && bl + 1 < sizeof buf; q++)
                    if (s[q] != '_') buf[bl++] = s[q];
                buf[bl] = 0;
                tok *t = emit(p, K_FLOAT, pos);
                t->f = strtod(buf, NULL);
                pos = end;
                continue;
            }
        }
        if (is_digit(c)) {
            size_t j = pos;
            int base = 10;
            char lc = pos + 1 < n ? (char)(s[pos + 1] | 32) : 0;
            if (c == '0' && (lc == 'b' || lc == 'o' || lc == 'x')) {
                base = lc == 'b' ? 2 : lc == 'o' ? 8 : 16;
                size_t q = pos + 2, last = 0;
                for (;;) {
                    size_t r = q;
                    if (r < n && s[r] == '_') r++;
                    char d = r < n ? (char)(s[r] | 32) : 0;
                    int ok = base == 2 ? (d == '0' || d == '1') : base == 8 ? (d >= '0' && d <= '7')
                           : (is_digit(d) || (d >= 'a' && d <= 'f'));
                    if (!ok) break;
                    q = r + 1;
                    last = q;
                }
                if (!last) { base = 10; j = pos + 1; } /* "0" then a name */
                else j = last;
            } else if (c == '0') {
                j = pos + 1;
                while (j < n && (s[j] == '0' || (s[j] == '_' && j + 1 < n && s[j + 1] == '0'))) j++;
            } else {
                j = pos + 1;
                while (j < n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1])))) j++;
            }
            char buf[160];
            size_t bl = 0;
            for (size_t q = pos + (base != 10 ? 2 : 0); q < j && bl + 1 < sizeof buf; q++)
                if (s[q] != '_') buf[bl++] = s[q];
            buf[bl] = 0;
            errno = 0;
            unsigned long long v = strtoull(buf, NULL, base);
            if (errno || v > (unsigned long long)INT64_MAX || bl + 1 >= sizeof buf)
                tp_pfail(p, (uint32_t)pos, "integer literal too large (only 64-bit integers are supported)");
            tok *t = emit(p, K_INT, pos);
            t->i = (int64_t)v;
            pos = j;
            continue;
        }
        if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t j = pos + 1;
            while (j < n && (s[j] == '_' || is_digit(s[j]) || ((s[j] | 32) >= 'a' && (s[j] | 32) <= 'z'))) j++;
            tok *t = emit(p, K_NAME, pos);
            t->p = s + pos;
            t->n = j - pos;
            pos = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t j = pos + 1;
            while (j < n && s[j] != c) j += (s[j] == '\\' && j + 1 < n) ? 2 : 1;
            if (j >= n) tp_pfail(p, (uint32_t)pos, "unterminated string literal");
            tok *t = emit(p, K_STR, pos);
            decode_string(p, pos + 1, j, t);
            pos = j + 1;
            continue;
        }
        const char *op = NULL;
        size_t ol = 0;
        for (int q = 0; OPS2[q]; q++)
            if (starts(s, n, pos, OPS2[q])) { op = OPS2[q]; ol = 2; break; }
        if (!op && c && strchr(OPS1, c)) { op = s + pos; ol = 1; }
        if (!op) {
            uint32_t cp;
            u8_dec(s + pos, n - pos, &cp);
            tp_pfail(p, (uint32_t)pos, "unexpected character U+%04X in tag", cp);
        }
        if (ol == 1 && (c == '(' || c == '[' || c == '{')) {
            if (nb >= MAX_NEST) tp_pfail(p, (uint32_t)pos, "brackets nested deeper than %d levels", MAX_NEST);
            bal[nb++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (ol == 1 && (c == ')' || c == ']' || c == '}')) {
            if (!nb) tp_pfail(p, (uint32_t)pos, "unexpected '%c'", c);
            if (bal[nb - 1] != c) tp_pfail(p, (uint32_t)pos, "unexpected '%c', expected '%c'", c, bal[nb - 1]);
            nb--;
        }
        tok *t = emit(p, K_OP, pos);
        t->p = s + pos;
        t->n = ol;
        pos += ol;
    }
}

void tp_lex(P *p) {
    const char *s = p->T->src;
    size_t n = p->T->srclen, pos = 0;
    int line_starting = 1;
    while (pos < n) {
        size_t i = pos;
        while (i + 1 < n && !(s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#'))) i++;
        if (i + 1 >= n) { emit_data(p, pos, n); break; }
        char kind = s[i + 1];
        size_t b = i + 2;
        char sign = 0;
        if (b < n && (s[b] == '-' || s[b] == '+')) sign = s[b++];
        /* raw block? {%(-|+|)\s*raw\s*(-%}\s*|%}) */
        size_t raw_end = 0;
        if (kind == '%') {
            size_t q = skip_ws(s, n, b);
            if (starts(s, n, q, "raw")) {
                q = skip_ws(s, n, q + 3);
                if (starts(s, n, q, "-%}")) raw_end = skip_ws(s, n, q + 3);
                else if (starts(s, n, q, "%}")) raw_end = q + 2;
            }
        }
        size_t tend = strip_before(s, pos, i, sign, kind != '{', line_starting);
        emit_data(p, pos, tend);
        if (raw_end) {
            line_starting = s[raw_end - 1] == '\n';
            /* find {%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?) */
            size_t k = raw_end, mend = 0;
            char esign = 0;
            for (; k + 1 < n; k++) {
                if (!(s[k] == '{' && s[k + 1] == '%')) continue;
                size_t q = k + 2;
                char sg = 0;
                if (q < n && (s[q] == '-' || s[q] == '+')) sg = s[q++];
                q = skip_ws(s, n, q);
                if (!starts(s, n, q, "endraw")) continue;
                q = skip_ws(s, n, q + 6);
                if (starts(s, n, q, "+%}")) mend = q + 3;
                else if (starts(s, n, q, "-%}")) mend = skip_ws(s, n, q + 3);
                else if (starts(s, n, q, "%}")) mend = q + 2 + (q + 2 < n && s[q + 2] == '\n');
                if (mend) { esign = sg; break; }
            }
            if (!mend) tp_pfail(p, (uint32_t)i, "missing end of raw directive");
            emit_data(p, raw_end, strip_before(s, raw_end, k, esign, 1, line_starting));
            line_starting = s[mend - 1] == '\n';
            pos = mend;
            continue;
        }
        if (kind == '#') {
            size_t k = b, end = 0;
            for (; k < n; k++) {
                if (starts(s, n, k, "+#}")) { end = k + 3; break; }
                if (starts(s, n, k, "-#}")) { end = skip_ws(s, n, k + 3); break; }
                if (starts(s, n, k, "#}")) { end = k + 2 + (k + 2 < n && s[k + 2] == '\n'); break; }
            }
            if (!end) tp_pfail(p, (uint32_t)i, "missing end of comment tag");
            line_starting = s[end - 1] == '\n';
            pos = end;
            continue;
        }
        emit(p, kind == '%' ? K_BBEGIN : K_VBEGIN, i);
        pos = lex_tag(p, b, kind == '%', &line_starting, i);
    }
    emit(p, K_EOF, n);
}
