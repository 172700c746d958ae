/* template_expr.c - expression parser of the Jinja2 subset: jinja2's
 * grammar and precedence (parser.py) from conditional expressions down to
 * primaries, postfix access, calls, filters and tests.
 *
 * Invariants: recursion is bounded by enter() (MAX_NEST); unknown filters
 * and tests are errors naming line and column; nodes are arena allocated.
 */
#include "tok/template_parse_int.h"

#include "deltafin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- expressions -------------------------------------------------------- */

node *tp_parse_expression(P *p, int with_condexpr);
static node *parse_or(P *p);
static node *parse_unary(P *p, int with_filter);
static node *parse_primary(P *p);
static node *parse_postfix(P *p, node *n);

static int tuple_end(P *p, const char *extra) {
    tok *t = cur(p);
    if (t->k == K_VEND || t->k == K_BEND || t->k == K_EOF || is_op(t, ")")) return 1;
    return extra && is_name(t, extra);
}

node *tp_parse_tuple(P *p, int with_condexpr, int explicit_parens, const char *extra_end) {
    uint32_t off = cur(p)->off;
    nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) expect_op(p, ",");
        if (tuple_end(p, extra_end)) break;
        nv_push(p, &items, with_condexpr ? tp_parse_expression(p, 1) : parse_or(p));
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

node *tp_parse_expression(P *p, int with_condexpr) {
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
        if (ops.n >= 64) tp_pfail(p, t->off, "comparison chain too long");
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
void tp_parse_call_args(P *p, node *n) {
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
            tp_pfail(p, cur(p)->off, "unsupported: *args / **kwargs in calls");
        if (cur(p)->k == K_NAME && is_op(peek(p, 1), "=")) {
            if (kwv.n >= 64) tp_pfail(p, cur(p)->off, "too many keyword arguments");
            kwn[kwv.n] = cur(p)->p;
            kwl[kwv.n] = cur(p)->n;
            adv(p);
            adv(p);
            nv_push(p, &kwv, tp_parse_expression(p, 1));
        } else {
            if (kwv.n) tp_pfail(p, cur(p)->off, "invalid syntax for function call expression (positional argument after keyword argument)");
            nv_push(p, &args, tp_parse_expression(p, 1));
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

void tp_dotted_name(P *p, node *n) {
    tok *t = expect_name(p);
    n->str = t->p;
    n->len = t->n;
    while (is_op(cur(p), ".")) {
        adv(p);
        tok *u = expect_name(p);
        n->len = (size_t)(u->p + u->n - n->str);
    }
}

node *tp_parse_filter(P *p, node *operand) {
    while (is_op(cur(p), "|")) {
        adv(p);
        uint32_t off = cur(p)->off;
        node *f = mk(p, N_FILTER, off);
        f->a = operand;
        tp_dotted_name(p, f);
        const char *why = NULL;
        if (!tb_filter_known(f->str, f->len, &why)) {
            if (why) tp_pfail(p, off, "unsupported filter '%.*s' (%s)", (int)f->len, f->str, why);
            tp_pfail(p, off, "no filter named '%.*s'", (int)f->len, f->str);
        }
        if (is_op(cur(p), "(")) tp_parse_call_args(p, f);
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
    tp_dotted_name(p, t);
    if (!tb_test_known(t->str, t->len)) tp_pfail(p, noff, "no test named '%.*s'", (int)t->len, t->str);
    tok *c = cur(p);
    if (is_op(c, "(")) {
        tp_parse_call_args(p, t);
    } else if ((c->k == K_NAME || c->k == K_STR || c->k == K_INT || c->k == K_FLOAT || is_op(c, "(") ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) tp_pfail(p, c->off, "you cannot chain multiple tests with is");
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
        node *e = tp_parse_expression(p, 1);
        if (!is_op(cur(p), ":")) return e;
        adv(p);
        args[0] = e;
    }
    if (!is_op(cur(p), ":") && !is_op(cur(p), "]") && !is_op(cur(p), ",")) args[1] = tp_parse_expression(p, 1);
    if (is_op(cur(p), ":")) {
        adv(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) args[2] = tp_parse_expression(p, 1);
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
            if (!args.n) tp_pfail(p, t->off, "expected an expression in subscript");
            node *g = mk(p, N_GETITEM, t->off);
            g->a = n;
            if (args.n == 1) {
                g->b = args.v[0];
            } else {
                node *tu = mk(p, N_TUPLE, t->off);
                tu->list = args.v;
                tu->n = args.n;
                for (size_t i = 0; i < args.n; i++)
                    if (args.v[i]->kind == N_SLICE) tp_pfail(p, t->off, "unsupported: multi-dimensional slices");
                g->b = tu;
            }
            n = g;
        } else if (is_op(t, "(")) {
            node *c = mk(p, N_CALL, t->off);
            c->a = n;
            tp_parse_call_args(p, c);
            n = c;
        } else {
            return n;
        }
    }
}

static node *parse_filter_expr(P *p, node *n) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, "|")) n = tp_parse_filter(p, n);
        else if (is_name(t, "is")) n = parse_test(p, n);
        else if (is_op(t, "(")) {
            node *c = mk(p, N_CALL, t->off);
            c->a = n;
            tp_parse_call_args(p, c);
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
            n = tp_parse_tuple(p, 1, 1, NULL);
            expect_op(p, ")");
            return n;
        }
        if (is_op(t, "[")) {
            adv(p);
            nvec items = {0};
            while (!is_op(cur(p), "]")) {
                if (items.n) expect_op(p, ",");
                if (is_op(cur(p), "]")) break;
                nv_push(p, &items, tp_parse_expression(p, 1));
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
                nv_push(p, &keys, tp_parse_expression(p, 1));
                expect_op(p, ":");
                nv_push(p, &vals, tp_parse_expression(p, 1));
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
