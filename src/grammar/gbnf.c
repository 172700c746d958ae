/* gbnf.c - the grammar text (docs/GRAMMAR.md) parsed to a small syntax tree
 * per rule, then compiled to the byte-level automaton of grammar_int.h.
 *
 *   rule    ::= name "::=" alts          (ends at a newline outside parentheses,
 *                                         unless the next line starts with '|')
 *   alts    ::= seq ("|" seq)*
 *   seq     ::= (primary postfix*)*
 *   primary ::= "literal" | [class] | [^class] | . | name | "(" alts ")"
 *   postfix ::= * | + | ? | {m} | {m,} | {m,n}
 *
 * Literals are byte strings (their UTF-8 bytes as written; \uXXXX and \xHH
 * give the code point's UTF-8). Classes are sets of code points, compiled
 * to alternatives of UTF-8 byte-range sequences (a negated class is every
 * scalar value, surrogates excluded, but those listed). */
#include "grammar/grammar_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* ---- syntax tree --------------------------------------------------------- */

enum { A_SEQ, A_ALT, A_LIT, A_CLASS, A_REF, A_REP };

typedef struct ast {
    int kind;
    struct ast **kid;
    int nkid;
    uint8_t *bytes; /* LIT */
    int nbytes;
    uint32_t *rng;  /* CLASS: [lo, hi] pairs of code points, already complemented if negated */
    int nrng;
    char *name;     /* REF */
    int rule;       /* REF: resolved */
    size_t at;      /* REF: text offset (for errors) */
    int min, max;   /* REP: max -1 = unbounded */
} ast;

static void ast_free(ast *a) {
    if (!a) return;
    for (int i = 0; i < a->nkid; i++) ast_free(a->kid[i]);
    free(a->kid);
    free(a->bytes);
    free(a->rng);
    free(a->name);
    free(a);
}

static ast *ast_new(int kind) {
    ast *a = calloc(1, sizeof *a);
    if (a) a->kind = kind;
    return a;
}

static int ast_add(ast *a, ast *k) {
    ast **t = realloc(a->kid, sizeof *t * (size_t)(a->nkid + 1));
    if (!t) return -1;
    a->kid = t;
    a->kid[a->nkid++] = k;
    return 0;
}

/* ---- parser --------------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t n, i;
    const char *rule; /* the rule being parsed (for messages) */
    int depth;
    char *err;
    size_t errlen;
    int rc;
} parser;

static void where(const parser *p, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') { (*line)++; *col = 1; }
        else (*col)++;
    }
}

static ast *fail_at(parser *p, size_t at, const char *what) {
    if (!p->rc) {
        int l, c;
        where(p, at, &l, &c);
        char got[24];
        if (at >= p->n) snprintf(got, sizeof got, "end of text");
        else if (isprint((unsigned char)p->s[at])) snprintf(got, sizeof got, "'%c'", p->s[at]);
        else snprintf(got, sizeof got, "byte 0x%02x", (unsigned char)p->s[at]);
        p->rc = df_err(p->err, p->errlen, DF_EINPUT, "grammar line %d:%d%s%s%s: %s, got %s", l, c,
                       p->rule ? " in rule '" : "", p->rule ? p->rule : "", p->rule ? "'" : "", what, got);
    }
    return NULL;
}

static int is_name(int c) { return isalnum(c) || c == '_' || c == '-' || c == '.'; }

/* Skips spaces, tabs, comments; newlines too when nl. */
static void skip(parser *p, int nl) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) p->i++;
        else if (c == '#') { while (p->i < p->n && p->s[p->i] != '\n') p->i++; }
        else break;
    }
}

/* A newline followed (after blank lines and comments) by '|' continues the rule. */
static int continues(parser *p) {
    size_t save = p->i;
    skip(p, 1);
    if (p->i < p->n && p->s[p->i] == '|') return 1;
    p->i = save;
    return 0;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 scalar value at s[*i]; -1 if malformed. */
static int32_t utf8_next(const char *s, size_t n, size_t *i) {
    const uint8_t *u = (const uint8_t *)s;
    uint32_t c = u[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || *i + (size_t)len > n) return -1;
    if (len == 1) { (*i)++; return (int32_t)c; }
    c &= 0x3f >> (len - 1);
    for (int k = 1; k < len; k++) {
        if ((u[*i + k] & 0xc0) != 0x80) return -1;
        c = c << 6 | (u[*i + k] & 0x3f);
    }
    static const uint32_t minv[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < minv[len] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return -1;
    *i += (size_t)len;
    return (int32_t)c;
}

static int utf8_put(uint32_t c, uint8_t *o) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xc0 | c >> 6); o[1] = (uint8_t)(0x80 | (c & 0x3f)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xe0 | c >> 12); o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f)); o[2] = (uint8_t)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | c >> 18); o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f)); o[3] = (uint8_t)(0x80 | (c & 0x3f));
    return 4;
}

/* One character of a literal or class at p->i: an escape or a UTF-8 scalar.
 * Returns the code point, or -1 (error set). *raw: the bytes as written
 * (literals keep them unless escaped). */
static int32_t parse_char(parser *p) {
    size_t at = p->i;
    if (p->s[p->i] != '\\') {
        int32_t c = utf8_next(p->s, p->n, &p->i);
        if (c < 0) fail_at(p, at, "expected UTF-8 text");
        return c;
    }
    p->i++;
    if (p->i >= p->n) { fail_at(p, p->i, "expected an escape after '\\'"); return -1; }
    char e = p->s[p->i++];
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case '"': return '"';
    case '\\': return '\\';
    case '[': return '[';
    case ']': return ']';
    case '-': return '-';
    case '^': return '^';
    case '/': return '/';
    case 'x': case 'u': {
        int nd = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < nd; k++) {
            int h = p->i < p->n ? hexval((unsigned char)p->s[p->i]) : -1;
            if (h < 0) { fail_at(p, p->i, e == 'x' ? "expected 2 hex digits after \\x" : "expected 4 hex digits after \\u"); return -1; }
            v = v << 4 | (uint32_t)h;
            p->i++;
        }
        if (v >= 0xd800 && v <= 0xdfff) { fail_at(p, at, "a surrogate code point is not a character"); return -1; }
        return (int32_t)v;
    }
    default:
        fail_at(p, p->i - 1, "expected an escape (\\n \\t \\r \\\" \\\\ \\[ \\] \\- \\^ \\/ \\xHH \\uXXXX)");
        return -1;
    }
}

static ast *parse_alts(parser *p, int nested);

static int cmp_u32pair(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorts and merges ranges; complements over the scalar values if neg. */
static int class_normalize(ast *a, int neg) {
    if (a->nrng) qsort(a->rng, (size_t)a->nrng, 2 * sizeof(uint32_t), cmp_u32pair);
    int m = 0;
    for (int i = 0; i < a->nrng; i++) {
        uint32_t lo = a->rng[2 * i], hi = a->rng[2 * i + 1];
        if (m && lo <= a->rng[2 * (m - 1) + 1] + 1) {
            if (hi > a->rng[2 * (m - 1) + 1]) a->rng[2 * (m - 1) + 1] = hi;
        } else {
            a->rng[2 * m] = lo;
            a->rng[2 * m + 1] = hi;
            m++;
        }
    }
    a->nrng = m;
    if (!neg) return 0;
    /* complement of the set within [0, 0x10ffff] minus the surrogates */
    uint32_t *o = malloc(sizeof *o * 2 * (size_t)(m + 3));
    if (!o) return -1;
    int k = 0;
    uint32_t next = 0;
    for (int i = 0; i <= m; i++) {
        uint32_t lo = i < m ? a->rng[2 * i] : 0x110000;
        if (lo > next) {
            uint32_t s = next, e = lo - 1; /* [s, e] minus [d800, dfff] */
            if (e < 0xd800 || s > 0xdfff) { o[2 * k] = s; o[2 * k + 1] = e; k++; }
            else {
                if (s < 0xd800) { o[2 * k] = s; o[2 * k + 1] = 0xd7ff; k++; }
                if (e > 0xdfff) { o[2 * k] = 0xe000; o[2 * k + 1] = e; k++; }
            }
        }
        if (i < m) next = a->rng[2 * i + 1] + 1;
    }
    free(a->rng);
    a->rng = o;
    a->nrng = k;
    return 0;
}

static ast *parse_class(parser *p) {
    size_t at = p->i;
    p->i++; /* [ */
    int neg = 0;
    if (p->i < p->n && p->s[p->i] == '^') { neg = 1; p->i++; }
    ast *a = ast_new(A_CLASS);
    if (!a) return fail_at(p, at, "out of memory");
    int cap = 0;
    while (1) {
        if (p->i >= p->n || p->s[p->i] == '\n') { ast_free(a); return fail_at(p, p->i, "expected ']' closing the class"); }
        if (p->s[p->i] == ']') { p->i++; break; }
        int32_t lo = parse_char(p), hi = lo;
        if (lo < 0) { ast_free(a); return NULL; }
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            size_t at2 = p->i;
            hi = parse_char(p);
            if (hi < 0) { ast_free(a); return NULL; }
            if (hi < lo) { ast_free(a); return fail_at(p, at2, "expected a range's end >= its start"); }
        }
        if (a->nrng == cap) {
            cap = cap ? cap * 2 : 8;
            uint32_t *t = realloc(a->rng, sizeof *t * 2 * (size_t)cap);
            if (!t) { ast_free(a); return fail_at(p, at, "out of memory"); }
            a->rng = t;
        }
        a->rng[2 * a->nrng] = (uint32_t)lo;
        a->rng[2 * a->nrng + 1] = (uint32_t)hi;
        a->nrng++;
    }
    if (class_normalize(a, neg)) { ast_free(a); return fail_at(p, at, "out of memory"); }
    if (!a->nrng) { ast_free(a); return fail_at(p, at, "expected a class that matches some character"); }
    return a;
}

static ast *parse_literal(parser *p) {
    size_t at = p->i;
    p->i++;
    ast *a = ast_new(A_LIT);
    if (!a) return fail_at(p, at, "out of memory");
    size_t cap = 16;
    a->bytes = malloc(cap);
    if (!a->bytes) { ast_free(a); return fail_at(p, at, "out of memory"); }
    while (1) {
        if (p->i >= p->n || p->s[p->i] == '\n') { ast_free(a); return fail_at(p, p->i, "expected '\"' closing the literal"); }
        if (p->s[p->i] == '"') { p->i++; break; }
        int32_t c = parse_char(p);
        if (c < 0) { ast_free(a); return NULL; }
        if ((size_t)a->nbytes + 4 > cap) {
            cap *= 2;
            uint8_t *t = realloc(a->bytes, cap);
            if (!t) { ast_free(a); return fail_at(p, at, "out of memory"); }
            a->bytes = t;
        }
        a->nbytes += utf8_put((uint32_t)c, a->bytes + a->nbytes);
    }
    return a;
}

static int parse_int(parser *p, int *v) {
    if (p->i >= p->n || !isdigit((unsigned char)p->s[p->i])) return -1;
    long x = 0;
    while (p->i < p->n && isdigit((unsigned char)p->s[p->i])) {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > DF_GRAMMAR_MAX_REPEAT) return -2;
    }
    *v = (int)x;
    return 0;
}

static ast *parse_seq(parser *p, int nested) {
    ast *seq = ast_new(A_SEQ);
    if (!seq) return fail_at(p, p->i, "out of memory");
    while (1) {
        skip(p, nested);
        if (p->i >= p->n) break;
        char c = p->s[p->i];
        size_t at = p->i;
        ast *x = NULL;
        if (c == '"') x = parse_literal(p);
        else if (c == '[') x = parse_class(p);
        else if (c == '.') {
            p->i++;
            x = ast_new(A_CLASS);
            if (x && !(x->rng = malloc(4 * sizeof *x->rng))) { ast_free(x); x = NULL; }
            if (!x) { ast_free(seq); return fail_at(p, at, "out of memory"); }
            x->rng[0] = 0; x->rng[1] = 0xd7ff; x->rng[2] = 0xe000; x->rng[3] = 0x10ffff;
            x->nrng = 2;
        } else if (c == '(') {
            if (++p->depth > 200) { ast_free(seq); return fail_at(p, at, "expected at most 200 nested parentheses"); }
            p->i++;
            x = parse_alts(p, 1);
            p->depth--;
            if (x) {
                skip(p, 1);
                if (p->i >= p->n || p->s[p->i] != ')') { ast_free(x); ast_free(seq); return fail_at(p, p->i, "expected ')'"); }
                p->i++;
            }
        } else if (is_name((unsigned char)c)) {
            size_t s = p->i;
            while (p->i < p->n && is_name((unsigned char)p->s[p->i])) p->i++;
            size_t e = p->i;
            /* a name followed by ::= starts the next rule */
            size_t save = p->i;
            skip(p, 0);
            if (p->i + 3 <= p->n && !memcmp(p->s + p->i, "::=", 3)) { p->i = s; break; }
            p->i = save;
            x = ast_new(A_REF);
            if (!x || !(x->name = strndup(p->s + s, e - s))) { ast_free(x); ast_free(seq); return fail_at(p, at, "out of memory"); }
            x->at = s;
        } else break;
        if (!x) { ast_free(seq); return NULL; }
        /* postfix operators */
        while (p->i < p->n) {
            char o = p->s[p->i];
            int mn, mx;
            if (o == '*') { mn = 0; mx = -1; p->i++; }
            else if (o == '+') { mn = 1; mx = -1; p->i++; }
            else if (o == '?') { mn = 0; mx = 1; p->i++; }
            else if (o == '{') {
                size_t ob = p->i++;
                skip(p, 0);
                int r = parse_int(p, &mn);
                if (r) { ast_free(x); ast_free(seq); return fail_at(p, p->i, r == -2 ? "expected a repetition count <= 10000" : "expected a number after '{'"); }
                skip(p, 0);
                mx = mn;
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    skip(p, 0);
                    if (p->i < p->n && p->s[p->i] == '}') mx = -1;
                    else if ((r = parse_int(p, &mx))) { ast_free(x); ast_free(seq); return fail_at(p, p->i, r == -2 ? "expected a repetition count <= 10000" : "expected a number or '}'"); }
                    skip(p, 0);
                }
                if (p->i >= p->n || p->s[p->i] != '}') { ast_free(x); ast_free(seq); return fail_at(p, p->i, "expected '}'"); }
                p->i++;
                if (mx >= 0 && mx < mn) { ast_free(x); ast_free(seq); return fail_at(p, ob, "expected {m,n} with m <= n"); }
            } else break;
            ast *r = ast_new(A_REP);
            if (!r || ast_add(r, x)) { ast_free(r); ast_free(x); ast_free(seq); return fail_at(p, at, "out of memory"); }
            r->min = mn;
            r->max = mx;
            x = r;
        }
        if (ast_add(seq, x)) { ast_free(x); ast_free(seq); return fail_at(p, at, "out of memory"); }
    }
    return seq;
}

static ast *parse_alts(parser *p, int nested) {
    ast *alt = ast_new(A_ALT);
    if (!alt) return fail_at(p, p->i, "out of memory");
    while (1) {
        ast *s = parse_seq(p, nested);
        if (!s) { ast_free(alt); return NULL; }
        if (ast_add(alt, s)) { ast_free(s); ast_free(alt); return fail_at(p, p->i, "out of memory"); }
        skip(p, nested);
        if (p->i < p->n && p->s[p->i] == '|') { p->i++; continue; }
        if (!nested && p->i < p->n && p->s[p->i] == '\n' && continues(p)) { p->i++; continue; }
        break;
    }
    return alt;
}

/* ---- compiler ------------------------------------------------------------- */

typedef struct {
    df_gedge *e;     /* edges with their source node in rule (reused) */
    int32_t *src;
    size_t ne, cap;
    int nn;
    uint8_t *is_end;
    size_t endcap;
    int over;        /* node limit hit */
    ast **bodies;    /* rule bodies, for inlining */
    const uint8_t *inl; /* rule r is built in place of each reference to it */
} builder;

static int new_node(builder *b) {
    if (b->nn >= DF_GRAMMAR_MAX_NODES) { b->over = 1; return 0; }
    if ((size_t)b->nn >= b->endcap) {
        size_t c = b->endcap ? b->endcap * 2 : 1024;
        uint8_t *t = realloc(b->is_end, c);
        if (!t) { b->over = 2; return 0; }
        memset(t + b->endcap, 0, c - b->endcap);
        b->is_end = t;
        b->endcap = c;
    }
    return b->nn++;
}

static void edge(builder *b, int from, int kind, int lo, int hi, int to, int rule) {
    if (b->over) return;
    if (b->ne == b->cap) {
        size_t c = b->cap ? b->cap * 2 : 1024;
        df_gedge *t = realloc(b->e, sizeof *t * c);
        int32_t *s = t ? realloc(b->src, sizeof *s * c) : NULL;
        if (t) b->e = t;
        if (!s) { b->over = 2; return; }
        b->src = s;
        b->cap = c;
    }
    b->e[b->ne] = (df_gedge){(uint8_t)kind, (uint8_t)lo, (uint8_t)hi, to, rule};
    b->src[b->ne++] = from;
}

/* UTF-8 byte-range sequences for code points [lo, hi] (the classic split by
 * encoded length, then by continuation-byte boundaries). */
static void class_range(builder *b, int start, int end, uint32_t lo, uint32_t hi) {
    static const uint32_t lim[3] = {0x7f, 0x7ff, 0xffff};
    for (int k = 0; k < 3; k++)
        if (lo <= lim[k] && hi > lim[k]) {
            class_range(b, start, end, lo, lim[k]);
            class_range(b, start, end, lim[k] + 1, hi);
            return;
        }
    if (hi <= 0x7f) { edge(b, start, GE_RANGE, (int)lo, (int)hi, end, -1); return; }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) { class_range(b, start, end, lo, lo | m); class_range(b, start, end, (lo | m) + 1, hi); return; }
            if ((hi & m) != m) { class_range(b, start, end, lo, (hi & ~m) - 1); class_range(b, start, end, hi & ~m, hi); return; }
        }
    }
    uint8_t a[4], z[4];
    int n = utf8_put(lo, a);
    utf8_put(hi, z);
    int cur = start;
    for (int k = 0; k < n; k++) {
        int to = k == n - 1 ? end : new_node(b);
        edge(b, cur, GE_RANGE, a[k], z[k], to, -1);
        cur = to;
    }
}

/* Builds a's fragment from node start; returns its exit node. */
static int build(builder *b, const ast *a, int start) {
    if (b->over) return start;
    switch (a->kind) {
    case A_LIT: {
        int cur = start;
        for (int k = 0; k < a->nbytes; k++) {
            int n = new_node(b);
            edge(b, cur, GE_RANGE, a->bytes[k], a->bytes[k], n, -1);
            cur = n;
        }
        return cur;
    }
    case A_CLASS: {
        int s = new_node(b), end = new_node(b);
        edge(b, start, GE_EPS, 0, 0, s, -1);
        for (int r = 0; r < a->nrng; r++) class_range(b, s, end, a->rng[2 * r], a->rng[2 * r + 1]);
        return end;
    }
    case A_SEQ: {
        int cur = start;
        for (int k = 0; k < a->nkid; k++) cur = build(b, a->kid[k], cur);
        return cur;
    }
    case A_ALT: {
        if (a->nkid == 1) return build(b, a->kid[0], start);
        int end = new_node(b);
        for (int k = 0; k < a->nkid; k++) {
            int s = new_node(b);
            edge(b, start, GE_EPS, 0, 0, s, -1);
            edge(b, build(b, a->kid[k], s), GE_EPS, 0, 0, end, -1);
        }
        return end;
    }
    case A_REF: {
        if (b->inl && b->inl[a->rule]) return build(b, b->bodies[a->rule], start);
        int end = new_node(b);
        edge(b, start, GE_CALL, 0, 0, end, a->rule);
        return end;
    }
    case A_REP: {
        int cur = start;
        if (a->max < 0 && a->min > 0) { /* x{m,}: m - 1 copies, then one copy that loops back to itself */
            for (int k = 0; k < a->min - 1 && !b->over; k++) {
                int s = new_node(b);
                edge(b, cur, GE_EPS, 0, 0, s, -1);
                cur = build(b, a->kid[0], s);
            }
            /* not m copies and a loop over another: a second copy of a rule call is a second return
             * node, so (x*)+ would keep 2^depth distinct stacks of equal meaning */
            int s = new_node(b), exit = new_node(b);
            edge(b, cur, GE_EPS, 0, 0, s, -1);
            int e = build(b, a->kid[0], s);
            edge(b, e, GE_EPS, 0, 0, s, -1);
            edge(b, e, GE_EPS, 0, 0, exit, -1);
            return exit;
        }
        for (int k = 0; k < a->min && !b->over; k++) {
            int s = new_node(b);
            edge(b, cur, GE_EPS, 0, 0, s, -1);
            cur = build(b, a->kid[0], s);
        }
        if (a->max < 0) {
            int loop = new_node(b), exit = new_node(b);
            edge(b, cur, GE_EPS, 0, 0, loop, -1);
            int s = new_node(b);
            edge(b, loop, GE_EPS, 0, 0, s, -1);
            edge(b, build(b, a->kid[0], s), GE_EPS, 0, 0, loop, -1);
            edge(b, loop, GE_EPS, 0, 0, exit, -1);
            return exit;
        }
        if (a->max == a->min) return cur;
        int exit = new_node(b);
        for (int k = a->min; k < a->max && !b->over; k++) { /* (x (x (x)?)?)? */
            edge(b, cur, GE_EPS, 0, 0, exit, -1);
            int s = new_node(b);
            edge(b, cur, GE_EPS, 0, 0, s, -1);
            cur = build(b, a->kid[0], s);
        }
        edge(b, cur, GE_EPS, 0, 0, exit, -1);
        return exit;
    }
    }
    return start;
}

typedef struct {
    char *name;
    ast *body;
    size_t at;
} rule_def;

typedef struct {
    rule_def *r;
    int n, cap;
} rules;

static int find_rule(const rules *rs, const char *name) {
    for (int i = 0; i < rs->n; i++)
        if (!strcmp(rs->r[i].name, name)) return i;
    return -1;
}

static int resolve(parser *p, const rules *rs, ast *a) {
    if (a->kind == A_REF) {
        a->rule = find_rule(rs, a->name);
        if (a->rule < 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "expected a defined rule, '%.100s' is not defined", a->name);
            fail_at(p, a->at, msg);
            return -1;
        }
    }
    for (int i = 0; i < a->nkid; i++)
        if (resolve(p, rs, a->kid[i])) return -1;
    return 0;
}

void df_grammar_free(df_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
    df_gcache_free(g);
    free(g->eoff);
    free(g->edges);
    free(g->is_end);
    free(g->has_range);
    for (int i = 0; g->rname && i < g->n_rules; i++) free(g->rname[i]);
    free(g->rname);
    free(g->rstart);
    free(g->rend);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

int df_grammar_n_nodes(const df_grammar *g) { return g->n_nodes; }

/* Strongly connected components (Tarjan, iterative) of a graph of n
 * vertices in CSR form; comp[v] = component id, in completion order (a
 * component is numbered after every component it reaches). Returns the
 * number of components, -1 out of memory. */
static int scc(int n, const int32_t *off, const int32_t *adj, int32_t *comp) {
    int32_t *idx = malloc(sizeof *idx * (size_t)(n + 1)), *low = malloc(sizeof *low * (size_t)(n + 1)),
            *stk = malloc(sizeof *stk * (size_t)(n + 1)), *cs = malloc(sizeof *cs * (size_t)(n + 1)),
            *ce = malloc(sizeof *ce * (size_t)(n + 1));
    uint8_t *on = calloc((size_t)n + 1, 1);
    int nc = -1;
    if (!idx || !low || !stk || !cs || !ce || !on) goto out;
    for (int v = 0; v < n; v++) idx[v] = -1;
    int counter = 0, sp = 0;
    nc = 0;
    for (int r = 0; r < n; r++) {
        if (idx[r] >= 0) continue;
        int cp = 0; /* call stack: vertex cs[], next edge ce[] */
        cs[cp] = r; ce[cp] = off[r]; cp++;
        idx[r] = low[r] = counter++; stk[sp++] = r; on[r] = 1;
        while (cp) {
            int v = cs[cp - 1];
            if (ce[cp - 1] < off[v + 1]) {
                int w = adj[ce[cp - 1]++];
                if (idx[w] < 0) {
                    idx[w] = low[w] = counter++; stk[sp++] = w; on[w] = 1;
                    cs[cp] = w; ce[cp] = off[w]; cp++;
                } else if (on[w] && idx[w] < low[v]) low[v] = idx[w];
                continue;
            }
            if (low[v] == idx[v]) {
                int w;
                do { w = stk[--sp]; on[w] = 0; comp[w] = nc; } while (w != v);
                nc++;
            }
            cp--;
            if (cp && low[v] < low[cs[cp - 1]]) low[cs[cp - 1]] = low[v];
        }
    }
out:
    free(idx); free(low); free(stk); free(cs); free(ce); free(on);
    return nc;
}

/* 1 if vertex v lies on a cycle: its component has several vertices, or a self-edge. */
static int on_cycle(int v, const int32_t *off, const int32_t *adj, const int32_t *comp, const int32_t *csize) {
    if (csize[comp[v]] > 1) return 1;
    for (int k = off[v]; k < off[v + 1]; k++)
        if (adj[k] == v) return 1;
    return 0;
}

/* Nullable and productive rules (fixpoints over each rule's own nodes; a
 * stamp per node instead of clearing), then the graph "rule A can call rule
 * B before consuming a byte": a cycle in it is left recursion, refused. And
 * every rule reachable from the root must derive a finite string. */
static int check_rules(df_grammar *g, char *err, size_t errlen) {
    int R = g->n_rules, N = g->n_nodes;
    uint8_t *nullable = calloc((size_t)R + 1, 1), *prod = calloc((size_t)R + 1, 1), *rr = calloc((size_t)R + 1, 1);
    uint32_t *stamp = calloc((size_t)N + 1, sizeof *stamp), st = 0;
    int32_t *stk = malloc(sizeof *stk * ((size_t)N + 1)), *q = malloc(sizeof *q * ((size_t)R + 1));
    int32_t *off = calloc((size_t)R + 2, sizeof *off), *adj = NULL, *comp = malloc(sizeof *comp * ((size_t)R + 1)),
            *csize = calloc((size_t)R + 1, sizeof *csize);
    size_t nadj = 0, capadj = 0;
    int rc = 0;
    if (!nullable || !prod || !rr || !stamp || !stk || !q || !off || !comp || !csize) goto oom;
    for (int mode = 0; mode < 2; mode++) { /* 0 nullable (eps + calls of nullable rules), 1 productive */
        uint8_t *flag = mode ? prod : nullable;
        for (int changed = 1; changed;) {
            changed = 0;
            for (int r = 0; r < R; r++) {
                if (flag[r]) continue;
                st++;
                int sp = 0, ok = 0;
                stk[sp++] = g->rstart[r];
                stamp[g->rstart[r]] = st;
                while (sp && !ok) {
                    int n = stk[--sp];
                    if (n == g->rend[r]) { ok = 1; break; }
                    for (int k = g->eoff[n]; k < g->eoff[n + 1]; k++) {
                        const df_gedge *e = &g->edges[k];
                        int to = -1;
                        if (e->kind == GE_EPS) to = e->to;
                        else if (e->kind == GE_RANGE) to = mode ? e->to : -1;
                        else if (flag[e->rule]) to = e->to;
                        if (to >= 0 && stamp[to] != st) { stamp[to] = st; stk[sp++] = to; }
                    }
                }
                if (ok) { flag[r] = 1; changed = 1; }
            }
        }
    }
    /* left calls, as adjacency lists */
    for (int r = 0; r < R; r++) {
        off[r] = (int32_t)nadj;
        st++;
        int sp = 0;
        stk[sp++] = g->rstart[r];
        stamp[g->rstart[r]] = st;
        while (sp) {
            int n = stk[--sp];
            for (int k = g->eoff[n]; k < g->eoff[n + 1]; k++) {
                const df_gedge *e = &g->edges[k];
                int to = -1;
                if (e->kind == GE_EPS) to = e->to;
                else if (e->kind == GE_CALL) {
                    if (nadj == capadj) {
                        capadj = capadj ? capadj * 2 : 256;
                        int32_t *t = realloc(adj, sizeof *t * capadj);
                        if (!t) goto oom;
                        adj = t;
                    }
                    adj[nadj++] = e->rule;
                    if (nullable[e->rule]) to = e->to;
                }
                if (to >= 0 && stamp[to] != st) { stamp[to] = st; stk[sp++] = to; }
            }
        }
    }
    off[R] = (int32_t)nadj;
    if (scc(R, off, adj ? adj : off, comp) < 0) goto oom;
    for (int r = 0; r < R; r++) csize[comp[r]]++;
    for (int r = 0; r < R; r++)
        if (on_cycle(r, off, adj ? adj : off, comp, csize)) {
            rc = df_err(err, errlen, DF_EUNSUPPORTED,
                        "grammar rule '%s': left recursion (the rule can reach itself before any byte) is not supported",
                        g->rname[r]);
            goto out;
        }
    /* rules reachable from the root must be productive */
    st++;
    int qn = 0;
    rr[g->root] = 1;
    q[qn++] = g->root;
    for (int qi = 0; qi < qn; qi++) {
        int r = q[qi];
        if (!prod[r]) {
            rc = df_err(err, errlen, DF_EINPUT, "grammar rule '%s': it matches no finite text (every alternative recurses forever)", g->rname[r]);
            goto out;
        }
        int sp = 0;
        stk[sp++] = g->rstart[r];
        stamp[g->rstart[r]] = st;
        while (sp) {
            int n = stk[--sp];
            for (int k = g->eoff[n]; k < g->eoff[n + 1]; k++) {
                const df_gedge *e = &g->edges[k];
                if (e->kind == GE_CALL && !rr[e->rule]) { rr[e->rule] = 1; q[qn++] = e->rule; }
                if (stamp[e->to] != st) { stamp[e->to] = st; stk[sp++] = e->to; }
            }
        }
    }
    goto out;
oom:
    rc = df_err(err, errlen, DF_ENOMEM, "grammar: out of memory");
out:
    free(nullable); free(prod); free(rr); free(stamp); free(stk); free(q); free(off); free(adj); free(comp); free(csize);
    return rc;
}

/* Inlining: a reference to a rule that is not recursive (cannot reach
 * itself) and whose expansion is small is built in place, as a copy, instead
 * of a call. Then most of a JSON grammar is one flat automaton and the
 * per-node mask caches see whole strings and numbers instead of stopping at
 * the end of a small rule (which would leave most tokens context-dependent).
 * Only recursive rules (nesting) remain calls. */
#define INLINE_MAX 20000
static double ast_cost(const ast *a, const double *rc, const uint8_t *inl) {
    double c = 0;
    switch (a->kind) {
    case A_LIT: return a->nbytes + 1;
    case A_CLASS: return 2 + 4.0 * a->nrng;
    case A_REF: return inl[a->rule] ? rc[a->rule] : 1;
    case A_REP: return (a->max < 0 ? a->min + 1 : a->max) * ast_cost(a->kid[0], rc, inl) + 4;
    default:
        for (int i = 0; i < a->nkid; i++) c += ast_cost(a->kid[i], rc, inl) + 2;
        return c + 1;
    }
}
static int count_refs(const ast *a) {
    int n = a->kind == A_REF;
    for (int i = 0; i < a->nkid; i++) n += count_refs(a->kid[i]);
    return n;
}
static void list_refs(const ast *a, int32_t *adj, int32_t *k) {
    if (a->kind == A_REF) adj[(*k)++] = a->rule;
    for (int i = 0; i < a->nkid; i++) list_refs(a->kid[i], adj, k);
}
static int plan_inline(const rules *rs, builder *b) {
    int R = rs->n, rc = -1;
    int32_t *off = calloc((size_t)R + 2, sizeof *off), *adj = NULL, *comp = malloc(sizeof *comp * ((size_t)R + 1)),
            *csize = calloc((size_t)R + 1, sizeof *csize), *order = malloc(sizeof *order * ((size_t)R + 1));
    uint8_t *inl = calloc((size_t)R + 1, 1);
    double *cost = calloc((size_t)R + 1, sizeof *cost);
    b->bodies = malloc(sizeof *b->bodies * ((size_t)R + 1));
    if (!off || !comp || !csize || !order || !inl || !cost || !b->bodies) goto out;
    int32_t total = 0;
    for (int r = 0; r < R; r++) { off[r] = total; total += count_refs(rs->r[r].body); b->bodies[r] = rs->r[r].body; }
    off[R] = total;
    if (!(adj = malloc(sizeof *adj * ((size_t)total + 1)))) goto out;
    for (int r = 0; r < R; r++) { int32_t k = off[r]; list_refs(rs->r[r].body, adj, &k); }
    int nc = scc(R, off, adj, comp);
    if (nc < 0) goto out;
    for (int r = 0; r < R; r++) csize[comp[r]]++;
    /* components complete in reverse topological order: a rule's references are costed before it */
    int32_t *start = calloc((size_t)nc + 1, sizeof *start);
    if (!start) goto out;
    for (int r = 0; r < R; r++) start[comp[r] + 1]++;
    for (int c = 0; c < nc; c++) start[c + 1] += start[c];
    for (int r = 0; r < R; r++) order[start[comp[r]]++] = r;
    free(start);
    for (int i = 0; i < R; i++) {
        int r = order[i];
        if (on_cycle(r, off, adj, comp, csize)) continue; /* recursive: always a call */
        cost[r] = ast_cost(rs->r[r].body, cost, inl);
        inl[r] = cost[r] <= INLINE_MAX;
    }
    rc = 0;
out:
    b->inl = inl;
    free(off); free(adj); free(comp); free(csize); free(order); free(cost);
    return rc;
}

int df_grammar_compile(const char *text, size_t len, const char *root, df_grammar **out, char *err, size_t errlen) {
    *out = NULL;
    if (len > DF_GRAMMAR_MAX_TEXT)
        return df_err(err, errlen, DF_EINPUT, "grammar: %zu bytes, expected at most %u", len, DF_GRAMMAR_MAX_TEXT);
    if (!root || !*root) root = "root";
    parser p = {.s = text, .n = len, .err = err, .errlen = errlen};
    rules rs = {0};
    builder b = {0};
    df_grammar *g = NULL;
    int rc = 0;
    while (1) {
        skip(&p, 1);
        if (p.i >= p.n) break;
        size_t at = p.i;
        p.rule = NULL;
        while (p.i < p.n && is_name((unsigned char)p.s[p.i])) p.i++;
        if (p.i == at) { fail_at(&p, at, "expected a rule name"); break; }
        char *name = strndup(p.s + at, p.i - at);
        if (!name) { fail_at(&p, at, "out of memory"); break; }
        skip(&p, 0);
        if (p.i + 3 > p.n || memcmp(p.s + p.i, "::=", 3)) { free(name); fail_at(&p, p.i, "expected '::=' after the rule name"); break; }
        p.i += 3;
        if (find_rule(&rs, name) >= 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "expected each rule defined once, '%.100s' is defined again", name);
            free(name);
            fail_at(&p, at, msg);
            break;
        }
        p.rule = name;
        ast *body = parse_alts(&p, 0);
        if (!body) { free(name); break; }
        skip(&p, 0);
        if (p.i < p.n && p.s[p.i] != '\n') { ast_free(body); fail_at(&p, p.i, "expected a newline after the rule"); free(name); break; }
        if (rs.n == rs.cap) {
            rs.cap = rs.cap ? rs.cap * 2 : 16;
            rule_def *t = realloc(rs.r, sizeof *t * (size_t)rs.cap);
            if (!t) { ast_free(body); free(name); fail_at(&p, at, "out of memory"); break; }
            rs.r = t;
        }
        rs.r[rs.n++] = (rule_def){name, body, at};
        p.rule = NULL;
    }
    p.rule = NULL;
    if (p.rc) { rc = p.rc; goto done; }
    for (int i = 0; i < rs.n; i++) {
        p.rule = rs.r[i].name;
        if (resolve(&p, &rs, rs.r[i].body)) { rc = p.rc; goto done; }
    }
    int ri = find_rule(&rs, root);
    if (ri < 0) { rc = df_err(err, errlen, DF_EINPUT, "grammar: no rule named '%.100s' (the root)", root); goto done; }
    g = calloc(1, sizeof *g);
    if (!g) { rc = df_err(err, errlen, DF_ENOMEM, "grammar: out of memory"); goto done; }
    pthread_mutex_init(&g->mu, NULL);
    atomic_init(&g->refs, 1);
    g->n_rules = rs.n;
    g->root = ri;
    g->rstart = malloc(sizeof *g->rstart * (size_t)rs.n);
    g->rend = malloc(sizeof *g->rend * (size_t)rs.n);
    g->rname = calloc((size_t)rs.n, sizeof *g->rname);
    if (!g->rstart || !g->rend || !g->rname) { rc = df_err(err, errlen, DF_ENOMEM, "grammar: out of memory"); goto done; }
    if (plan_inline(&rs, &b)) { rc = df_err(err, errlen, DF_ENOMEM, "grammar: out of memory"); goto done; }
    for (int i = 0; i < rs.n; i++) {
        g->rstart[i] = new_node(&b);
        g->rend[i] = new_node(&b);
    }
    for (int i = 0; i < rs.n && !b.over; i++) {
        g->rname[i] = rs.r[i].name;
        rs.r[i].name = NULL;
        if (!b.over) b.is_end[g->rend[i]] = 1;
        if (i != ri && b.inl[i]) continue; /* only ever built in place of its references */
        int e = build(&b, rs.r[i].body, g->rstart[i]);
        edge(&b, e, GE_EPS, 0, 0, g->rend[i], -1);
    }
    for (int i = 0; i < rs.n; i++)
        if (!g->rname[i]) g->rname[i] = strdup("?");
    if (b.over) {
        rc = b.over == 1 ? df_err(err, errlen, DF_EINPUT, "grammar too large: more than %d automaton nodes (repetitions and inlined rules expand), expected fewer", DF_GRAMMAR_MAX_NODES)
                         : df_err(err, errlen, DF_ENOMEM, "grammar: out of memory");
        goto done;
    }
    /* edges sorted by source node (counting sort), node flags */
    g->n_nodes = b.nn;
    g->eoff = calloc((size_t)b.nn + 1, sizeof *g->eoff);
    g->edges = malloc(sizeof *g->edges * (b.ne ? b.ne : 1));
    g->has_range = calloc((size_t)b.nn, 1);
    g->is_end = b.is_end;
    b.is_end = NULL;
    if (!g->eoff || !g->edges || !g->has_range) { rc = df_err(err, errlen, DF_ENOMEM, "grammar: out of memory"); goto done; }
    for (size_t k = 0; k < b.ne; k++) g->eoff[b.src[k] + 1]++;
    for (int i = 0; i < b.nn; i++) g->eoff[i + 1] += g->eoff[i];
    {
        int32_t *fill = malloc(sizeof *fill * (size_t)b.nn);
        if (!fill) { rc = df_err(err, errlen, DF_ENOMEM, "grammar: out of memory"); goto done; }
        memcpy(fill, g->eoff, sizeof *fill * (size_t)b.nn);
        for (size_t k = 0; k < b.ne; k++) {
            g->edges[fill[b.src[k]]++] = b.e[k];
            if (b.e[k].kind == GE_RANGE) g->has_range[b.src[k]] = 1;
        }
        free(fill);
    }
    if ((rc = check_rules(g, err, errlen))) goto done;
    *out = g;
    g = NULL;
done:
    for (int i = 0; i < rs.n; i++) { free(rs.r[i].name); ast_free(rs.r[i].body); }
    free(rs.r);
    free(b.e);
    free(b.src);
    free(b.is_end);
    free(b.bodies);
    free((void *)b.inl);
    if (g) df_grammar_free(g);
    return rc;
}
