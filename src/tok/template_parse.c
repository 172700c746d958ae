/* template_parse.c - lexer and parser of the Jinja2 subset.
 *
 * The lexer reproduces jinja2's with trim_blocks=True and lstrip_blocks=True:
 * newlines are normalized to "\n" and one trailing newline is dropped;
 * "{%-"/"-%}" strip all (Unicode) whitespace; "{%+" keeps it; a block or
 * comment tag alone on its line loses the indentation before it; the first
 * newline after "%}" or "#}" is removed; "}}" and "%}" inside brackets are
 * operators, not tag ends. String literals decode like Python's
 * unicode-escape codec after jinja2's backslashreplace step.
 *
 * The parser follows jinja2's grammar and precedence (parser.py) and builds
 * node trees in the template's arena. Unknown filters, tests and tags and
 * unsupported constructs are errors naming the line and column.
 *
 * Node fields by kind (see struct node):
 *   N_CONST val | N_NAME str | N_GETATTR a.str | N_GETITEM a[b] | N_SLICE a:b:c
 *   N_CALL/N_FILTER/N_TEST a=operand, str=name (filter/test), list=args,
 *     names+list2=kwargs | N_NEG/N_POS/N_NOT a | N_AND/N_OR a,b
 *   N_BINOP op a b | N_COMPARE a, list=operands, ops | N_COND b if a else c
 *   N_LIST/N_TUPLE/N_CONCAT list | N_DICT list=keys list2=values
 *   N_DATA str | N_OUTPUT a | N_IF list2=tests list=bodies c=else
 *   N_FOR list2=targets a=iter b=filter c=body d=else
 *   N_SET list2=targets a=value | N_SETBLOCK list2=targets a=filters c=body
 *   N_NSREF str=namespace val=attribute | N_MACRO str=name names=params
 *     list2=defaults c=body | N_FILTERBLOCK a=filters c=body
 *   N_WITH list2=targets list=values c=body | N_BODY list
 */
#include "tok/template_int.h"

#include "deltafin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_EOF, K_DATA, K_VBEGIN, K_VEND, K_BBEGIN, K_BEND, K_NAME, K_STR, K_INT, K_FLOAT, K_OP };

typedef struct {
    int k;
    uint32_t off;
    const char *p; size_t n; /* name, operator, decoded string, data */
    int64_t i;
    double f;
} tok;

typedef struct {
    tctx *R;
    struct df_template *T;
    tok *t; size_t nt, cap;
    size_t i;
    int depth;      /* expression / block nesting */
    int loops;      /* enclosing for loops (for break/continue) */
} P;

#define MAX_NEST TPL_MAX_NEST

_Noreturn static void pfail(P *p, uint32_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pfail(P *p, uint32_t off, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    t_line_col(p->T->src, off, &line, &col);
    if (p->R->err && p->R->errlen) snprintf(p->R->err, p->R->errlen, "template line %d, column %d: %s", line, col, msg);
    p->R->code = DF_EINPUT;
    longjmp(p->R->jb, 1);
}

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
        case 'N': pfail(p, (uint32_t)esc, "\\N{...} escapes in string literals are not supported");
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
            if (v < 0) pfail(p, (uint32_t)esc, "truncated \\%c escape in string literal", c);
            cp = cp * 16 + (uint32_t)v;
        }
        if (cp > 0x10FFFF) pfail(p, (uint32_t)esc, "illegal Unicode character in string literal");
        if (cp >= 0xD800 && cp <= 0xDFFF) pfail(p, (uint32_t)esc, "surrogate code points in string literals are not supported");
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
        if (pos >= n) pfail(p, (uint32_t)tag_off, "unexpected end of template: %s tag is not closed", block ? "{%" : "{{");
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
                pfail(p, (uint32_t)pos, "integer literal too large (only 64-bit integers are supported)");
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
            if (j >= n) pfail(p, (uint32_t)pos, "unterminated string literal");
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
            pfail(p, (uint32_t)pos, "unexpected character U+%04X in tag", cp);
        }
        if (ol == 1 && (c == '(' || c == '[' || c == '{')) {
            if (nb >= MAX_NEST) pfail(p, (uint32_t)pos, "brackets nested deeper than %d levels", MAX_NEST);
            bal[nb++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (ol == 1 && (c == ')' || c == ']' || c == '}')) {
            if (!nb) pfail(p, (uint32_t)pos, "unexpected '%c'", c);
            if (bal[nb - 1] != c) pfail(p, (uint32_t)pos, "unexpected '%c', expected '%c'", c, bal[nb - 1]);
            nb--;
        }
        tok *t = emit(p, K_OP, pos);
        t->p = s + pos;
        t->n = ol;
        pos += ol;
    }
}

static void lex(P *p) {
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
            if (!mend) pfail(p, (uint32_t)i, "missing end of raw directive");
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
            if (!end) pfail(p, (uint32_t)i, "missing end of comment tag");
            line_starting = s[end - 1] == '\n';
            pos = end;
            continue;
        }
        emit(p, kind == '%' ? K_BBEGIN : K_VBEGIN, i);
        pos = lex_tag(p, b, kind == '%', &line_starting, i);
    }
    emit(p, K_EOF, n);
}

/* ---- parser helpers ----------------------------------------------------- */

static tok *cur(P *p) { return &p->t[p->i]; }
static tok *peek(P *p, size_t k) { return p->i + k < p->nt ? &p->t[p->i + k] : &p->t[p->nt - 1]; }
static void adv(P *p) { if (p->i + 1 < p->nt) p->i++; }
static int is_op(const tok *t, const char *op) { return t->k == K_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0; }
static int is_name(const tok *t, const char *nm) { return t->k == K_NAME && t->n == strlen(nm) && memcmp(t->p, nm, t->n) == 0; }

static const char *describe(const tok *t, char *buf, size_t bl) {
    switch (t->k) {
    case K_EOF: return "end of template";
    case K_DATA: return "template data";
    case K_VBEGIN: return "'{{'";
    case K_VEND: return "end of print statement";
    case K_BBEGIN: return "'{%'";
    case K_BEND: return "end of statement block";
    case K_STR: return "string";
    case K_INT: return "integer";
    case K_FLOAT: return "float";
    default: snprintf(buf, bl, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    }
}

_Noreturn static void unexpected(P *p, const char *expected) {
    char b[64];
    if (expected) pfail(p, cur(p)->off, "expected %s, got %s", expected, describe(cur(p), b, sizeof b));
    pfail(p, cur(p)->off, "unexpected %s", describe(cur(p), b, sizeof b));
}

static void expect_op(P *p, const char *op) {
    if (!is_op(cur(p), op)) {
        char e[16];
        snprintf(e, sizeof e, "'%s'", op);
        unexpected(p, e);
    }
    adv(p);
}
static tok *expect_name(P *p) {
    if (cur(p)->k != K_NAME) unexpected(p, "a name");
    tok *t = cur(p);
    adv(p);
    return t;
}
static void expect_k(P *p, int k, const char *what) {
    if (cur(p)->k != k) unexpected(p, what);
    adv(p);
}

static node *mk(P *p, int kind, uint32_t off) {
    node *n = ta_alloc(p->R, &p->T->A, sizeof(node));
    n->kind = (uint16_t)kind;
    n->off = off;
    return n;
}

/* growable node-pointer vector in the arena */
typedef struct { node **v; size_t n, cap; } nvec;
static void nv_push(P *p, nvec *v, node *x) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 4;
        node **q = ta_alloc(p->R, &p->T->A, nc * sizeof(node *));
        if (v->n) memcpy(q, v->v, v->n * sizeof(node *));
        v->v = q;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static void enter(P *p) {
    if (++p->depth > MAX_NEST) pfail(p, cur(p)->off, "nesting deeper than %d levels", MAX_NEST);
}

/* ---- expressions -------------------------------------------------------- */

static node *parse_expression(P *p, int with_condexpr);
static node *parse_or(P *p);
static node *parse_unary(P *p, int with_filter);
static node *parse_primary(P *p);
static node *parse_postfix(P *p, node *n);

static int tuple_end(P *p, const char *extra) {
    tok *t = cur(p);
    if (t->k == K_VEND || t->k == K_BEND || t->k == K_EOF || is_op(t, ")")) return 1;
    return extra && is_name(t, extra);
}

static node *parse_tuple(P *p, int with_condexpr, int explicit_parens, const char *extra_end) {
    uint32_t off = cur(p)->off;
    nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) expect_op(p, ",");
        if (tuple_end(p, extra_end)) break;
        nv_push(p, &items, with_condexpr ? parse_expression(p, 1) : parse_or(p));
        if (is_op(cur(p), ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) unexpected(p, "an expression");
    }
    node *n = mk(p, N_TUPLE, off);
    n->list = items.v;
    n->n = items.n;
    return n;
}

static node *parse_condexpr(P *p) {
    node *e1 = parse_or(p);
    while (is_name(cur(p), "if")) {
        uint32_t off = cur(p)->off;
        adv(p);
        node *e2 = parse_or(p);
        node *e3 = NULL;
        if (is_name(cur(p), "else")) {
            adv(p);
            enter(p);
            e3 = parse_condexpr(p);
            p->depth--;
        }
        node *c = mk(p, N_COND, off);
        c->a = e2;
        c->b = e1;
        c->c = e3;
        e1 = c;
    }
    return e1;
}

static node *parse_expression(P *p, int with_condexpr) {
    enter(p);
    node *n = with_condexpr ? parse_condexpr(p) : parse_or(p);
    p->depth--;
    return n;
}

static node *parse_not(P *p);
static node *parse_and(P *p) {
    node *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        uint32_t off = cur(p)->off;
        adv(p);
        node *n = mk(p, N_AND, off);
        n->a = l;
        n->b = parse_not(p);
        l = n;
    }
    return l;
}
static node *parse_or(P *p) {
    node *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        uint32_t off = cur(p)->off;
        adv(p);
        node *n = mk(p, N_OR, off);
        n->a = l;
        n->b = parse_and(p);
        l = n;
    }
    return l;
}

static node *parse_math1(P *p);
static node *parse_compare(P *p) {
    uint32_t off = cur(p)->off;
    node *e = parse_math1(p);
    nvec ops = {0};
    uint8_t opc[64];
    for (;;) {
        tok *t = cur(p);
        int op = -1;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(p, 1), "in")) { op = OP_NOTIN; adv(p); }
        if (op < 0) break;
        adv(p);
        if (ops.n >= 64) pfail(p, t->off, "comparison chain too long");
        opc[ops.n] = (uint8_t)op;
        nv_push(p, &ops, parse_math1(p));
    }
    if (!ops.n) return e;
    node *n = mk(p, N_COMPARE, off);
    n->a = e;
    n->list = ops.v;
    n->n = ops.n;
    n->ops = ta_alloc(p->R, &p->T->A, ops.n);
    memcpy(n->ops, opc, ops.n);
    return n;
}

static node *parse_not(P *p) {
    if (is_name(cur(p), "not")) {
        uint32_t off = cur(p)->off;
        adv(p);
        enter(p);
        node *n = mk(p, N_NOT, off);
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static node *binop(P *p, int op, uint32_t off, node *a, node *b) {
    node *n = mk(p, N_BINOP, off);
    n->op = (uint16_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static node *parse_pow(P *p) {
    node *l = parse_unary(p, 1);
    while (is_op(cur(p), "**")) {
        uint32_t off = cur(p)->off;
        adv(p);
        l = binop(p, OP_POW, off, l, parse_unary(p, 1));
    }
    return l;
}
static node *parse_math2(P *p) {
    node *l = parse_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FDIV : is_op(t, "%") ? OP_MOD : -1;
        if (op < 0) return l;
        adv(p);
        l = binop(p, op, t->off, l, parse_pow(p));
    }
}
static node *parse_concat(P *p) {
    uint32_t off = cur(p)->off;
    node *first = parse_math2(p);
    if (!is_op(cur(p), "~")) return first;
    nvec v = {0};
    nv_push(p, &v, first);
    while (is_op(cur(p), "~")) {
        adv(p);
        nv_push(p, &v, parse_math2(p));
    }
    node *n = mk(p, N_CONCAT, off);
    n->list = v.v;
    n->n = v.n;
    return n;
}
static node *parse_math1(P *p) {
    node *l = parse_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (op < 0) return l;
        adv(p);
        l = binop(p, op, t->off, l, parse_concat(p));
    }
}

/* (args, k=v, ...) after the '(' has been seen */
static void parse_call_args(P *p, node *n) {
    expect_op(p, "(");
    nvec args = {0}, kwv = {0};
    const char *kwn[64];
    size_t kwl[64];
    int require_comma = 0;
    while (!is_op(cur(p), ")")) {
        if (require_comma) {
            expect_op(p, ",");
            if (is_op(cur(p), ")")) break;
        }
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            pfail(p, cur(p)->off, "unsupported: *args / **kwargs in calls");
        if (cur(p)->k == K_NAME && is_op(peek(p, 1), "=")) {
            if (kwv.n >= 64) pfail(p, cur(p)->off, "too many keyword arguments");
            kwn[kwv.n] = cur(p)->p;
            kwl[kwv.n] = cur(p)->n;
            adv(p);
            adv(p);
            nv_push(p, &kwv, parse_expression(p, 1));
        } else {
            if (kwv.n) pfail(p, cur(p)->off, "invalid syntax for function call expression (positional argument after keyword argument)");
            nv_push(p, &args, parse_expression(p, 1));
        }
        require_comma = 1;
    }
    expect_op(p, ")");
    n->list = args.v;
    n->n = args.n;
    n->list2 = kwv.v;
    n->n2 = kwv.n;
    if (kwv.n) {
        n->names = ta_alloc(p->R, &p->T->A, kwv.n * sizeof(char *));
        n->nlens = ta_alloc(p->R, &p->T->A, kwv.n * sizeof(size_t));
        memcpy(n->names, kwn, kwv.n * sizeof(char *));
        memcpy(n->nlens, kwl, kwv.n * sizeof(size_t));
    }
}

static void dotted_name(P *p, node *n) {
    tok *t = expect_name(p);
    n->str = t->p;
    n->len = t->n;
    while (is_op(cur(p), ".")) {
        adv(p);
        tok *u = expect_name(p);
        n->len = (size_t)(u->p + u->n - n->str);
    }
}

static node *parse_filter(P *p, node *operand) {
    while (is_op(cur(p), "|")) {
        adv(p);
        uint32_t off = cur(p)->off;
        node *f = mk(p, N_FILTER, off);
        f->a = operand;
        dotted_name(p, f);
        const char *why = NULL;
        if (!tb_filter_known(f->str, f->len, &why)) {
            if (why) pfail(p, off, "unsupported filter '%.*s' (%s)", (int)f->len, f->str, why);
            pfail(p, off, "no filter named '%.*s'", (int)f->len, f->str);
        }
        if (is_op(cur(p), "(")) parse_call_args(p, f);
        operand = f;
    }
    return operand;
}

static node *parse_test(P *p, node *operand) {
    uint32_t off = cur(p)->off;
    adv(p); /* 'is' */
    int negated = 0;
    if (is_name(cur(p), "not")) { adv(p); negated = 1; }
    node *t = mk(p, N_TEST, off);
    t->a = operand;
    uint32_t noff = cur(p)->off;
    dotted_name(p, t);
    if (!tb_test_known(t->str, t->len)) pfail(p, noff, "no test named '%.*s'", (int)t->len, t->str);
    tok *c = cur(p);
    if (is_op(c, "(")) {
        parse_call_args(p, t);
    } else if ((c->k == K_NAME || c->k == K_STR || c->k == K_INT || c->k == K_FLOAT || is_op(c, "(") ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) pfail(p, c->off, "you cannot chain multiple tests with is");
        enter(p);
        node *arg = parse_postfix(p, parse_primary(p));
        p->depth--;
        t->list = ta_alloc(p->R, &p->T->A, sizeof(node *));
        t->list[0] = arg;
        t->n = 1;
    }
    if (!negated) return t;
    node *n = mk(p, N_NOT, off);
    n->a = t;
    return n;
}

static node *parse_subscripted(P *p) {
    uint32_t off = cur(p)->off;
    node *args[3] = {NULL, NULL, NULL};
    if (is_op(cur(p), ":")) {
        adv(p);
    } else {
        node *e = parse_expression(p, 1);
        if (!is_op(cur(p), ":")) return e;
        adv(p);
        args[0] = e;
    }
    if (!is_op(cur(p), ":") && !is_op(cur(p), "]") && !is_op(cur(p), ",")) args[1] = parse_expression(p, 1);
    if (is_op(cur(p), ":")) {
        adv(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) args[2] = parse_expression(p, 1);
    }
    node *s = mk(p, N_SLICE, off);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static node *parse_postfix(P *p, node *n) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, ".")) {
            adv(p);
            tok *a = cur(p);
            if (a->k == K_NAME) {
                adv(p);
                node *g = mk(p, N_GETATTR, t->off);
                g->a = n;
                g->str = a->p;
                g->len = a->n;
                n = g;
            } else if (a->k == K_INT) {
                adv(p);
                node *k = mk(p, N_CONST, a->off);
                k->val = tv_int(a->i);
                node *g = mk(p, N_GETITEM, t->off);
                g->a = n;
                g->b = k;
                n = g;
            } else {
                unexpected(p, "a name or number");
            }
        } else if (is_op(t, "[")) {
            adv(p);
            nvec args = {0};
            while (!is_op(cur(p), "]")) {
                if (args.n) expect_op(p, ",");
                if (is_op(cur(p), "]")) break;
                nv_push(p, &args, parse_subscripted(p));
            }
            expect_op(p, "]");
            if (!args.n) pfail(p, t->off, "expected an expression in subscript");
            node *g = mk(p, N_GETITEM, t->off);
            g->a = n;
            if (args.n == 1) {
                g->b = args.v[0];
            } else {
                node *tu = mk(p, N_TUPLE, t->off);
                tu->list = args.v;
                tu->n = args.n;
                for (size_t i = 0; i < args.n; i++)
                    if (args.v[i]->kind == N_SLICE) pfail(p, t->off, "unsupported: multi-dimensional slices");
                g->b = tu;
            }
            n = g;
        } else if (is_op(t, "(")) {
            node *c = mk(p, N_CALL, t->off);
            c->a = n;
            parse_call_args(p, c);
            n = c;
        } else {
            return n;
        }
    }
}

static node *parse_filter_expr(P *p, node *n) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, "|")) n = parse_filter(p, n);
        else if (is_name(t, "is")) n = parse_test(p, n);
        else if (is_op(t, "(")) {
            node *c = mk(p, N_CALL, t->off);
            c->a = n;
            parse_call_args(p, c);
            n = c;
        } else return n;
    }
}

static node *parse_unary(P *p, int with_filter) {
    tok *t = cur(p);
    node *n;
    enter(p);
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(p);
        n = mk(p, is_op(t, "-") ? N_NEG : N_POS, t->off);
        n->a = parse_unary(p, 0);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static node *parse_primary(P *p) {
    tok *t = cur(p);
    node *n;
    switch (t->k) {
    case K_NAME:
        adv(p);
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            n = mk(p, N_CONST, t->off);
            n->val = tv_bool(t->p[0] == 't' || t->p[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            n = mk(p, N_CONST, t->off);
            n->val = tv_none();
        } else {
            n = mk(p, N_NAME, t->off);
            n->str = t->p;
            n->len = t->n;
        }
        return n;
    case K_STR: {
        n = mk(p, N_CONST, t->off);
        adv(p);
        if (cur(p)->k != K_STR) {
            n->val = tv_str(t->p, t->n);
            return n;
        }
        size_t total = t->n;
        for (size_t k = p->i; p->t[k].k == K_STR; k++) total += p->t[k].n;
        char *buf = ta_alloc(p->R, &p->T->A, total + 1);
        size_t o = t->n;
        memcpy(buf, t->p, t->n);
        while (cur(p)->k == K_STR) {
            memcpy(buf + o, cur(p)->p, cur(p)->n);
            o += cur(p)->n;
            adv(p);
        }
        n->val = tv_str(buf, o);
        return n;
    }
    case K_INT:
    case K_FLOAT:
        adv(p);
        n = mk(p, N_CONST, t->off);
        n->val = t->k == K_INT ? tv_int(t->i) : tv_float(t->f);
        return n;
    case K_OP:
        if (is_op(t, "(")) {
            adv(p);
            n = parse_tuple(p, 1, 1, NULL);
            expect_op(p, ")");
            return n;
        }
        if (is_op(t, "[")) {
            adv(p);
            nvec items = {0};
            while (!is_op(cur(p), "]")) {
                if (items.n) expect_op(p, ",");
                if (is_op(cur(p), "]")) break;
                nv_push(p, &items, parse_expression(p, 1));
            }
            expect_op(p, "]");
            n = mk(p, N_LIST, t->off);
            n->list = items.v;
            n->n = items.n;
            return n;
        }
        if (is_op(t, "{")) {
            adv(p);
            nvec keys = {0}, vals = {0};
            while (!is_op(cur(p), "}")) {
                if (keys.n) expect_op(p, ",");
                if (is_op(cur(p), "}")) break;
                nv_push(p, &keys, parse_expression(p, 1));
                expect_op(p, ":");
                nv_push(p, &vals, parse_expression(p, 1));
            }
            expect_op(p, "}");
            n = mk(p, N_DICT, t->off);
            n->list = keys.v;
            n->n = keys.n;
            n->list2 = vals.v;
            n->n2 = vals.n;
            return n;
        }
        break;
    default: break;
    }
    unexpected(p, NULL);
}

/* ---- statements ------------------------------------------------------- */

static node *parse_body(P *p, const char *const *ends);

static int name_in(const tok *t, const char *const *names) {
    for (int i = 0; names && names[i]; i++)
        if (is_name(t, names[i])) return 1;
    return 0;
}

static int reserved_name(const tok *t) {
    return is_name(t, "true") || is_name(t, "false") || is_name(t, "none") || is_name(t, "True") ||
           is_name(t, "False") || is_name(t, "None");
}

/* name | name.attr (with_ns) | a, b, ... ; stops before extra_end */
static void parse_targets(P *p, int with_ns, nvec *out) {
    int paren = 0;
    if (is_op(cur(p), "(")) { adv(p); paren = 1; }
    for (;;) {
        tok *t = cur(p);
        if (t->k != K_NAME) unexpected(p, "a variable name");
        if (reserved_name(t)) pfail(p, t->off, "cannot assign to '%.*s'", (int)t->n, t->p);
        adv(p);
        node *n;
        if (with_ns && is_op(cur(p), ".")) {
            adv(p);
            tok *a = expect_name(p);
            n = mk(p, N_NSREF, t->off);
            n->str = t->p;
            n->len = t->n;
            n->val = tv_str(a->p, a->n);
        } else {
            n = mk(p, N_NAME, t->off);
            n->str = t->p;
            n->len = t->n;
        }
        nv_push(p, out, n);
        if (!is_op(cur(p), ",")) break;
        adv(p);
        if (paren && is_op(cur(p), ")")) break;
        if (!paren && cur(p)->k != K_NAME) break;
    }
    if (paren) expect_op(p, ")");
}

static void end_tag(P *p, const char *name) {
    expect_k(p, K_BBEGIN, "'{%'");
    if (!is_name(cur(p), name)) {
        char e[40];
        snprintf(e, sizeof e, "'%s'", name);
        unexpected(p, e);
    }
    adv(p);
    expect_k(p, K_BEND, "end of statement block");
}

/* A filter chain with no operand (for {% filter %} and {% set x | f %}). */
static node *parse_filter_chain(P *p) {
    node *chain = NULL;
    uint32_t off = cur(p)->off;
    node *f = mk(p, N_FILTER, off);
    dotted_name(p, f);
    const char *why = NULL;
    if (!tb_filter_known(f->str, f->len, &why)) pfail(p, off, "no filter named '%.*s'", (int)f->len, f->str);
    if (is_op(cur(p), "(")) parse_call_args(p, f);
    chain = f;
    return parse_filter(p, chain);
}

static node *parse_statement(P *p) {
    tok *t = cur(p);
    uint32_t off = t->off;
    if (t->k != K_NAME) unexpected(p, "a tag name");
    adv(p);
    enter(p);
    node *n = NULL;
    if (is_name(t, "if")) {
        n = mk(p, N_IF, off);
        nvec tests = {0}, bodies = {0};
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        static const char *const ends2[] = {"endif", NULL};
        for (;;) {
            nv_push(p, &tests, parse_tuple(p, 0, 0, NULL));
            expect_k(p, K_BEND, "end of statement block");
            nv_push(p, &bodies, parse_body(p, ends));
            expect_k(p, K_BBEGIN, "'{%'");
            tok *e = cur(p);
            adv(p);
            if (is_name(e, "elif")) continue;
            if (is_name(e, "else")) {
                expect_k(p, K_BEND, "end of statement block");
                n->c = parse_body(p, ends2);
                end_tag(p, "endif");
            } else {
                expect_k(p, K_BEND, "end of statement block");
            }
            break;
        }
        n->list2 = tests.v;
        n->n2 = tests.n;
        n->list = bodies.v;
        n->n = bodies.n;
    } else if (is_name(t, "for")) {
        n = mk(p, N_FOR, off);
        nvec targets = {0};
        parse_targets(p, 0, &targets);
        n->list2 = targets.v;
        n->n2 = targets.n;
        if (!is_name(cur(p), "in")) unexpected(p, "'in'");
        adv(p);
        n->a = parse_tuple(p, 0, 0, "recursive");
        if (is_name(cur(p), "if")) {
            adv(p);
            n->b = parse_expression(p, 1);
        }
        if (is_name(cur(p), "recursive")) pfail(p, cur(p)->off, "unsupported: recursive for loops");
        expect_k(p, K_BEND, "end of statement block");
        static const char *const ends[] = {"endfor", "else", NULL};
        static const char *const ends2[] = {"endfor", NULL};
        p->loops++;
        n->c = parse_body(p, ends);
        p->loops--;
        expect_k(p, K_BBEGIN, "'{%'");
        if (is_name(cur(p), "else")) {
            adv(p);
            expect_k(p, K_BEND, "end of statement block");
            n->d = parse_body(p, ends2);
            end_tag(p, "endfor");
        } else {
            adv(p);
            expect_k(p, K_BEND, "end of statement block");
        }
    } else if (is_name(t, "set")) {
        nvec targets = {0};
        parse_targets(p, 1, &targets);
        if (is_op(cur(p), "=")) {
            adv(p);
            n = mk(p, N_SET, off);
            n->a = parse_tuple(p, 1, 0, NULL);
            expect_k(p, K_BEND, "end of statement block");
        } else {
            if (targets.n != 1) unexpected(p, "'='");
            n = mk(p, N_SETBLOCK, off);
            if (is_op(cur(p), "|")) {
                adv(p);
                n->a = parse_filter_chain(p);
            }
            expect_k(p, K_BEND, "end of statement block");
            static const char *const ends[] = {"endset", NULL};
            n->c = parse_body(p, ends);
            end_tag(p, "endset");
        }
        n->list2 = targets.v;
        n->n2 = targets.n;
    } else if (is_name(t, "macro")) {
        n = mk(p, N_MACRO, off);
        tok *nm = expect_name(p);
        n->str = nm->p;
        n->len = nm->n;
        expect_op(p, "(");
        nvec defs = {0};
        const char *pn[64];
        size_t pl[64];
        size_t np = 0;
        while (!is_op(cur(p), ")")) {
            if (np) expect_op(p, ",");
            if (is_op(cur(p), ")")) break;
            tok *a = expect_name(p);
            if (np >= 64) pfail(p, a->off, "too many macro parameters");
            pn[np] = a->p;
            pl[np] = a->n;
            np++;
            if (is_op(cur(p), "=")) {
                adv(p);
                nv_push(p, &defs, parse_expression(p, 1));
            } else {
                if (defs.n && defs.v[defs.n - 1]) pfail(p, a->off, "non-default argument follows default argument");
                nv_push(p, &defs, NULL);
            }
        }
        expect_op(p, ")");
        expect_k(p, K_BEND, "end of statement block");
        n->names = ta_alloc(p->R, &p->T->A, (np + 1) * sizeof(char *));
        n->nlens = ta_alloc(p->R, &p->T->A, (np + 1) * sizeof(size_t));
        memcpy(n->names, pn, np * sizeof(char *));
        memcpy(n->nlens, pl, np * sizeof(size_t));
        n->list2 = defs.v;
        n->n2 = np;
        int saved = p->loops;
        p->loops = 0;
        static const char *const ends[] = {"endmacro", NULL};
        n->c = parse_body(p, ends);
        p->loops = saved;
        end_tag(p, "endmacro");
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        if (!p->loops) pfail(p, off, "'%.*s' outside of a for loop", (int)t->n, t->p);
        n = mk(p, is_name(t, "break") ? N_BREAK : N_CONTINUE, off);
        expect_k(p, K_BEND, "end of statement block");
    } else if (is_name(t, "filter")) {
        n = mk(p, N_FILTERBLOCK, off);
        n->a = parse_filter_chain(p);
        expect_k(p, K_BEND, "end of statement block");
        static const char *const ends[] = {"endfilter", NULL};
        n->c = parse_body(p, ends);
        end_tag(p, "endfilter");
    } else if (is_name(t, "with")) {
        n = mk(p, N_WITH, off);
        nvec targets = {0}, vals = {0};
        while (cur(p)->k != K_BEND) {
            if (targets.n) expect_op(p, ",");
            nvec one = {0};
            tok *a = cur(p);
            if (a->k != K_NAME) unexpected(p, "a variable name");
            adv(p);
            node *nm = mk(p, N_NAME, a->off);
            nm->str = a->p;
            nm->len = a->n;
            (void)one;
            nv_push(p, &targets, nm);
            expect_op(p, "=");
            nv_push(p, &vals, parse_expression(p, 1));
        }
        expect_k(p, K_BEND, "end of statement block");
        static const char *const ends[] = {"endwith", NULL};
        n->c = parse_body(p, ends);
        end_tag(p, "endwith");
        n->list2 = targets.v;
        n->n2 = targets.n;
        n->list = vals.v;
        n->n = vals.n;
    } else if (is_name(t, "generation")) {
        /* transformers' AssistantTracker: renders its body unchanged */
        n = mk(p, N_WITH, off);
        expect_k(p, K_BEND, "end of statement block");
        static const char *const ends[] = {"endgeneration", NULL};
        n->c = parse_body(p, ends);
        end_tag(p, "endgeneration");
    } else if (is_name(t, "include") || is_name(t, "import") || is_name(t, "from") || is_name(t, "extends") ||
               is_name(t, "block") || is_name(t, "call") || is_name(t, "autoescape")) {
        pfail(p, off, "unsupported tag '%.*s'", (int)t->n, t->p);
    } else {
        pfail(p, off, "unknown tag '%.*s'", (int)t->n > 40 ? 40 : (int)t->n, t->p);
    }
    p->depth--;
    return n;
}

/* Parses statements until EOF (ends == NULL) or until a block tag whose name
 * is in ends (left unconsumed, positioned at its '{%'). */
static node *parse_body(P *p, const char *const *ends) {
    uint32_t off = cur(p)->off;
    nvec v = {0};
    enter(p);
    for (;;) {
        tok *t = cur(p);
        if (t->k == K_EOF) {
            if (ends) {
                const char *want = ends[0];
                for (int k = 0; ends[k]; k++)
                    if (!strncmp(ends[k], "end", 3)) want = ends[k];
                pfail(p, t->off, "unexpected end of template, expected {%% %s %%}", want);
            }
            break;
        }
        if (t->k == K_DATA) {
            node *d = mk(p, N_DATA, t->off);
            d->str = t->p;
            d->len = t->n;
            nv_push(p, &v, d);
            adv(p);
        } else if (t->k == K_VBEGIN) {
            adv(p);
            node *o = mk(p, N_OUTPUT, t->off);
            o->a = parse_tuple(p, 1, 0, NULL);
            expect_k(p, K_VEND, "end of print statement");
            nv_push(p, &v, o);
        } else if (t->k == K_BBEGIN) {
            tok *nm = peek(p, 1);
            if (ends && name_in(nm, ends)) break;
            static const char *const stray[] = {"endif", "endfor", "elif", "else", "endset", "endmacro", "endfilter",
                                                "endwith", "endgeneration", "endraw", NULL};
            if (name_in(nm, stray)) pfail(p, nm->off, "unexpected '%.*s'", (int)nm->n, nm->p);
            adv(p);
            nv_push(p, &v, parse_statement(p));
        } else {
            unexpected(p, NULL);
        }
    }
    p->depth--;
    node *b = mk(p, N_BODY, off);
    b->list = v.v;
    b->n = v.n;
    return b;
}

/* The parser's recursion is bounded by enter(), but operator, filter,
 * attribute and call chains are parsed by loops and build trees as deep as
 * they are long (1+1+...+1 nests to the left). Everything that walks the
 * tree later (the evaluator) recurses on its depth, so the depth is checked
 * here, without recursion: a depth-first walk with an explicit stack. */
typedef struct { const node *n; int depth; } dfs_item;

static void check_tree_depth(P *p, const node *root) {
    size_t cap = 256, top = 0;
    dfs_item *st = ta_alloc(p->R, &p->T->A, cap * sizeof *st);
    st[top++] = (dfs_item){root, 1};
    while (top) {
        dfs_item it = st[--top];
        if (it.depth > MAX_NEST) pfail(p, it.n->off, "nesting deeper than %d levels", MAX_NEST);
        const node *kids[4] = {it.n->a, it.n->b, it.n->c, it.n->d};
        size_t need = top + 4 + it.n->n + it.n->n2;
        if (need > cap) {
            size_t nc = cap;
            while (nc < need) nc *= 2;
            dfs_item *q = ta_alloc(p->R, &p->T->A, nc * sizeof *q);
            memcpy(q, st, top * sizeof *st);
            st = q;
            cap = nc;
        }
        for (int k = 0; k < 4; k++)
            if (kids[k]) st[top++] = (dfs_item){kids[k], it.depth + 1};
        for (size_t k = 0; k < it.n->n; k++)
            if (it.n->list && it.n->list[k]) st[top++] = (dfs_item){it.n->list[k], it.depth + 1};
        for (size_t k = 0; k < it.n->n2; k++)
            if (it.n->list2 && it.n->list2[k]) st[top++] = (dfs_item){it.n->list2[k], it.depth + 1};
    }
}

node *tparse(tctx *R, struct df_template *T) {
    P p = {0};
    p.R = R;
    p.T = T;
    lex(&p);
    node *root = parse_body(&p, NULL);
    check_tree_depth(&p, root);
    return root;
}
