/* template_parse_int.h - lexer / parser internals shared by
 * template_lex.c (tokens), template_expr.c (expressions) and
 * template_parse.c (statements, entry point tparse). Not a public header.
 *
 * Invariants: tokens and nodes live in the template's arena; p->depth counts
 * expression and block nesting and never exceeds MAX_NEST (enter() checks);
 * every failure goes through tp_pfail, which formats "template line L,
 * column C: msg" and longjmps out of the parse.
 */
#ifndef DF_TOK_TEMPLATE_PARSE_INT_H
#define DF_TOK_TEMPLATE_PARSE_INT_H

#include "tok/template_int.h"

#include <stdio.h>
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
_Noreturn void tp_pfail(P *p, uint32_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* template_lex.c: fills p->t (ends with K_EOF). */
void tp_lex(P *p);

/* ---- parser helpers ----------------------------------------------------- */

static inline tok *cur(P *p) { return &p->t[p->i]; }
static inline tok *peek(P *p, size_t k) { return p->i + k < p->nt ? &p->t[p->i + k] : &p->t[p->nt - 1]; }
static inline void adv(P *p) { if (p->i + 1 < p->nt) p->i++; }
static inline int is_op(const tok *t, const char *op) { return t->k == K_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0; }
static inline int is_name(const tok *t, const char *nm) { return t->k == K_NAME && t->n == strlen(nm) && memcmp(t->p, nm, t->n) == 0; }

static inline const char *describe(const tok *t, char *buf, size_t bl) {
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

_Noreturn static inline void unexpected(P *p, const char *expected) {
    char b[64];
    if (expected) tp_pfail(p, cur(p)->off, "expected %s, got %s", expected, describe(cur(p), b, sizeof b));
    tp_pfail(p, cur(p)->off, "unexpected %s", describe(cur(p), b, sizeof b));
}

static inline void expect_op(P *p, const char *op) {
    if (!is_op(cur(p), op)) {
        char e[16];
        snprintf(e, sizeof e, "'%s'", op);
        unexpected(p, e);
    }
    adv(p);
}
static inline tok *expect_name(P *p) {
    if (cur(p)->k != K_NAME) unexpected(p, "a name");
    tok *t = cur(p);
    adv(p);
    return t;
}
static inline void expect_k(P *p, int k, const char *what) {
    if (cur(p)->k != k) unexpected(p, what);
    adv(p);
}

static inline node *mk(P *p, int kind, uint32_t off) {
    node *n = ta_alloc(p->R, &p->T->A, sizeof(node));
    n->kind = (uint16_t)kind;
    n->off = off;
    return n;
}

/* growable node-pointer vector in the arena */
typedef struct { node **v; size_t n, cap; } nvec;
static inline void nv_push(P *p, nvec *v, node *x) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 4;
        node **q = ta_alloc(p->R, &p->T->A, nc * sizeof(node *));
        if (v->n) memcpy(q, v->v, v->n * sizeof(node *));
        v->v = q;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static inline void enter(P *p) {
    if (++p->depth > MAX_NEST) tp_pfail(p, cur(p)->off, "nesting deeper than %d levels", MAX_NEST);
}

/* template_expr.c: the expression grammar used by the statements. */
node *tp_parse_expression(P *p, int with_condexpr);
node *tp_parse_tuple(P *p, int with_condexpr, int explicit_parens, const char *extra_end);
void tp_parse_call_args(P *p, node *n);
void tp_dotted_name(P *p, node *n);
node *tp_parse_filter(P *p, node *operand);

#endif
