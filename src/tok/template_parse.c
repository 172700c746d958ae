/* template_parse.c - statement parser and entry point (tparse) of the
 * Jinja2 subset; the lexer is template_lex.c, expressions template_expr.c,
 * shared internals template_parse_int.h.
 *
 * The lexer (template_lex.c) reproduces jinja2's with trim_blocks=True and lstrip_blocks=True:
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
#include "tok/template_parse_int.h"

#include "deltafin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tp_pfail(P *p, uint32_t off, const char *fmt, ...) {
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
        if (reserved_name(t)) tp_pfail(p, t->off, "cannot assign to '%.*s'", (int)t->n, t->p);
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
    tp_dotted_name(p, f);
    const char *why = NULL;
    if (!tb_filter_known(f->str, f->len, &why)) tp_pfail(p, off, "no filter named '%.*s'", (int)f->len, f->str);
    if (is_op(cur(p), "(")) tp_parse_call_args(p, f);
    chain = f;
    return tp_parse_filter(p, chain);
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
            nv_push(p, &tests, tp_parse_tuple(p, 0, 0, NULL));
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
        n->a = tp_parse_tuple(p, 0, 0, "recursive");
        if (is_name(cur(p), "if")) {
            adv(p);
            n->b = tp_parse_expression(p, 1);
        }
        if (is_name(cur(p), "recursive")) tp_pfail(p, cur(p)->off, "unsupported: recursive for loops");
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
            n->a = tp_parse_tuple(p, 1, 0, NULL);
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
            if (np >= 64) tp_pfail(p, a->off, "too many macro parameters");
            pn[np] = a->p;
            pl[np] = a->n;
            np++;
            if (is_op(cur(p), "=")) {
                adv(p);
                nv_push(p, &defs, tp_parse_expression(p, 1));
            } else {
                if (defs.n && defs.v[defs.n - 1]) tp_pfail(p, a->off, "non-default argument follows default argument");
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
        if (!p->loops) tp_pfail(p, off, "'%.*s' outside of a for loop", (int)t->n, t->p);
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
            nv_push(p, &vals, tp_parse_expression(p, 1));
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
        tp_pfail(p, off, "unsupported tag '%.*s'", (int)t->n, t->p);
    } else {
        tp_pfail(p, off, "unknown tag '%.*s'", (int)t->n > 40 ? 40 : (int)t->n, t->p);
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
                tp_pfail(p, t->off, "unexpected end of template, expected {%% %s %%}", want);
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
            o->a = tp_parse_tuple(p, 1, 0, NULL);
            expect_k(p, K_VEND, "end of print statement");
            nv_push(p, &v, o);
        } else if (t->k == K_BBEGIN) {
            tok *nm = peek(p, 1);
            if (ends && name_in(nm, ends)) break;
            static const char *const stray[] = {"endif", "endfor", "elif", "else", "endset", "endmacro", "endfilter",
                                                "endwith", "endgeneration", "endraw", NULL};
            if (name_in(nm, stray)) tp_pfail(p, nm->off, "unexpected '%.*s'", (int)nm->n, nm->p);
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
        if (it.depth > MAX_NEST) tp_pfail(p, it.n->off, "nesting deeper than %d levels", MAX_NEST);
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
    tp_lex(&p);
    node *root = parse_body(&p, NULL);
    check_tree_depth(&p, root);
    return root;
}
