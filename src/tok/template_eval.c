/* template_eval.c - evaluation of template nodes.
 *
 * Scoping follows jinja2: the template's top level is one scope; every
 * iteration of a for loop gets a fresh scope whose parent is the scope
 * around the loop (so {% set %} inside a loop never leaks out, and a name
 * set in one iteration is gone in the next); if/elif/else share the
 * enclosing scope; macros run in a scope whose parent is the top level;
 * {% with %} and {% generation %} open a scope. Namespace attributes are
 * the only state that crosses scopes.
 *
 * Every node evaluation counts one step against the render's step limit.
 */
#include "tok/template_int.h"

#include "deltafin.h"

#include <string.h>

/* ---- scopes ------------------------------------------------------------- */

static tscope *scope_new(tctx *R, tscope *parent) {
    tscope *s = ta_alloc(R, &R->A, sizeof(tscope));
    s->parent = parent;
    return s;
}

static tv *scope_find_local(tscope *s, const char *name, size_t n) {
    for (size_t i = s->n; i-- > 0;)
        if (s->nlens[i] == n && memcmp(s->names[i], name, n) == 0) return &s->vals[i];
    return NULL;
}

static void scope_set(tctx *R, tscope *s, const char *name, size_t n, tv v) {
    tv *p = scope_find_local(s, name, n);
    if (p) { *p = v; return; }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        const char **nn = ta_alloc(R, &R->A, nc * sizeof(char *));
        size_t *nl = ta_alloc(R, &R->A, nc * sizeof(size_t));
        tv *nv = ta_alloc(R, &R->A, nc * sizeof(tv));
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof(char *));
            memcpy(nl, s->nlens, s->n * sizeof(size_t));
            memcpy(nv, s->vals, s->n * sizeof(tv));
        }
        s->names = nn; s->nlens = nl; s->vals = nv; s->cap = nc;
    }
    s->names[s->n] = name;
    s->nlens[s->n] = n;
    s->vals[s->n] = v;
    s->n++;
}

static tv lookup(tctx *R, tscope *s, const char *name, size_t n) {
    for (; s; s = s->parent) {
        tv *p = scope_find_local(s, name, n);
        if (p) return *p;
    }
    int fn = tb_global_func(name, n);
    if (fn >= 0) {
        tv v = {0};
        v.t = TV_FUNC;
        v.fn = fn;
        return v;
    }
    return tv_undef_named(R, name, n, NULL);
}

static void step(tctx *R, const node *e) {
    R->off = e->off;
    tcharge(R, TPL_STEP_UNITS);
}

/* ---- expressions -------------------------------------------------------- */

static void eval_args(tctx *R, tscope *S, const node *e, tv **args, tv **kwv) {
    *args = e->n ? ta_alloc(R, &R->A, e->n * sizeof(tv)) : NULL;
    *kwv = e->n2 ? ta_alloc(R, &R->A, e->n2 * sizeof(tv)) : NULL;
    for (size_t i = 0; i < e->n; i++) (*args)[i] = teval(R, S, e->list[i]);
    for (size_t i = 0; i < e->n2; i++) (*kwv)[i] = teval(R, S, e->list2[i]);
}

static tv eval_call(tctx *R, tscope *S, const node *e) {
    tv callee = teval(R, S, e->a);
    tv *args, *kwv;
    eval_args(R, S, e, &args, &kwv);
    R->off = e->off;
    switch (callee.t) {
    case TV_METHOD: return tb_call_method(R, callee.m, args, e->n, e->names, e->nlens, kwv, e->n2);
    case TV_FUNC: return tb_call_func(R, callee.fn, args, e->n, e->names, e->nlens, kwv, e->n2);
    case TV_MACRO: return tb_call_macro(R, callee.macro, args, e->n, e->names, e->nlens, kwv, e->n2);
    case TV_UNDEF: tb_undef_fail(R, &callee);
    default: tfail(R, DF_EINPUT, "'%s' object is not callable", tv_typename(&callee));
    }
}

static tv eval_compare(tctx *R, tscope *S, const node *e) {
    tv left = teval(R, S, e->a);
    for (size_t i = 0; i < e->n; i++) {
        tv right = teval(R, S, e->list[i]);
        R->off = e->off;
        int ok;
        switch (e->ops[i]) {
        case OP_EQ: ok = tv_eq(R, &left, &right); break;
        case OP_NE: ok = !tv_eq(R, &left, &right); break;
        case OP_LT: ok = tv_cmp(R, &left, &right, "<") < 0; break;
        case OP_LE: ok = tv_cmp(R, &left, &right, "<=") <= 0; break;
        case OP_GT: ok = tv_cmp(R, &left, &right, ">") > 0; break;
        case OP_GE: ok = tv_cmp(R, &left, &right, ">=") >= 0; break;
        case OP_IN: ok = tb_contains(R, &right, &left); break;
        default: ok = !tb_contains(R, &right, &left); break;
        }
        /* NaN: every ordering comparison is false in Python */
        if ((left.t == TV_FLOAT && left.f != left.f) || (right.t == TV_FLOAT && right.f != right.f)) {
            if (e->ops[i] >= OP_LT && e->ops[i] <= OP_GE) ok = 0;
        }
        if (!ok) return tv_bool(0);
        left = right;
    }
    return tv_bool(1);
}

static void eval_enter(tctx *R) {
    if (++R->edepth > TPL_MAX_EVAL_DEPTH)
        tfail(R, DF_EINPUT, "evaluation nested deeper than %d levels (expressions and statements across macro calls)",
              TPL_MAX_EVAL_DEPTH);
}

static tv teval_node(tctx *R, tscope *S, const node *e);

tv teval(tctx *R, tscope *S, const node *e) {
    step(R, e);
    eval_enter(R);
    tv v = teval_node(R, S, e);
    R->edepth--;
    return v;
}

static tv teval_node(tctx *R, tscope *S, const node *e) {
    switch (e->kind) {
    case N_CONST: return e->val;
    case N_NAME: return lookup(R, S, e->str, e->len);
    case N_GETATTR: {
        tv o = teval(R, S, e->a);
        R->off = e->off;
        return tb_getattr(R, &o, e->str, e->len);
    }
    case N_GETITEM: {
        tv o = teval(R, S, e->a);
        if (e->b->kind == N_SLICE) {
            const node *sl = e->b;
            tv a = sl->a ? teval(R, S, sl->a) : tv_none();
            tv b = sl->b ? teval(R, S, sl->b) : tv_none();
            tv c = sl->c ? teval(R, S, sl->c) : tv_none();
            R->off = e->off;
            return tb_slice(R, &o, &a, &b, &c);
        }
        tv k = teval(R, S, e->b);
        R->off = e->off;
        return tb_getitem(R, &o, &k);
    }
    case N_CALL: return eval_call(R, S, e);
    case N_FILTER: {
        tv v = teval(R, S, e->a);
        return tb_filter(R, S, e, v);
    }
    case N_TEST: {
        tv v = teval(R, S, e->a);
        return tv_bool(tb_test(R, S, e, &v));
    }
    case N_NOT: {
        tv v = teval(R, S, e->a);
        return tv_bool(!tv_truthy(&v));
    }
    case N_NEG:
    case N_POS: {
        tv v = teval(R, S, e->a);
        R->off = e->off;
        if (v.t == TV_UNDEF) tb_undef_fail(R, &v);
        if (v.t == TV_BOOL) v = tv_int(v.b);
        if (e->kind == N_POS && (v.t == TV_INT || v.t == TV_FLOAT)) return v;
        if (v.t == TV_INT) {
            if (v.i == INT64_MIN) tfail(R, DF_EUNSUPPORTED, "integer overflow (only 64-bit integers are supported)");
            return tv_int(-v.i);
        }
        if (v.t == TV_FLOAT) return tv_float(-v.f);
        tfail(R, DF_EINPUT, "bad operand type for unary %c: '%s'", e->kind == N_NEG ? '-' : '+', tv_typename(&v));
    }
    case N_AND: {
        tv a = teval(R, S, e->a);
        return tv_truthy(&a) ? teval(R, S, e->b) : a;
    }
    case N_OR: {
        tv a = teval(R, S, e->a);
        return tv_truthy(&a) ? a : teval(R, S, e->b);
    }
    case N_BINOP: {
        tv a = teval(R, S, e->a);
        tv b = teval(R, S, e->b);
        R->off = e->off;
        return tb_binop(R, e->op, &a, &b);
    }
    case N_COMPARE: return eval_compare(R, S, e);
    case N_COND: {
        tv c = teval(R, S, e->a);
        if (tv_truthy(&c)) return teval(R, S, e->b);
        return e->c ? teval(R, S, e->c) : tv_undef();
    }
    case N_LIST:
    case N_TUPLE: {
        tv l = tv_list(R, e->n, e->kind == N_TUPLE ? TL_TUPLE : TL_LIST);
        for (size_t i = 0; i < e->n; i++) l.l->v[i] = teval(R, S, e->list[i]);
        return tv_seal(R, l);
    }
    case N_DICT: {
        tv d = tv_dict(R, e->n + 1);
        for (size_t i = 0; i < e->n; i++) {
            tv k = teval(R, S, e->list[i]);
            tv v = teval(R, S, e->list2[i]);
            if (k.t == TV_LIST && k.sub != TL_TUPLE) tfail(R, DF_EINPUT, "unhashable type: 'list'");
            if (k.t == TV_DICT || k.t == TV_NS) tfail(R, DF_EINPUT, "unhashable type: '%s'", tv_typename(&k));
            tdict_set(R, d.d, k, v);
        }
        return tv_seal(R, d);
    }
    case N_CONCAT: {
        tout o = {0};
        o.in_arena = 1;
        for (size_t i = 0; i < e->n; i++) {
            tv v = teval(R, S, e->list[i]);
            tv_str_into(R, &o, &v);
        }
        return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
    }
    default: break;
    }
    tfail(R, DF_EINTERNAL, "internal error: node kind %d is not an expression", e->kind);
}

/* ---- statements --------------------------------------------------------- */

static void exec_body(tctx *R, tscope *S, const node *body);

static void assign(tctx *R, tscope *S, const node *target, tv v) {
    if (target->kind == N_NAME) {
        scope_set(R, S, target->str, target->len, v);
        return;
    }
    /* N_NSREF */
    tv ns = lookup(R, S, target->str, target->len);
    R->off = target->off;
    if (ns.t != TV_NS) tfail(R, DF_EINPUT, "cannot assign attribute on non-namespace object");
    if (target->val.s.n && target->val.s.p[0] == '_')
        tfail(R, DF_EINPUT, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%.*s'.",
              (int)target->val.s.n, target->val.s.p);
    tdict_set(R, ns.d, target->val, v);
}

static void assign_targets(tctx *R, tscope *S, node *const *targets, size_t nt, tv v) {
    if (nt == 1) {
        assign(R, S, targets[0], v);
        return;
    }
    size_t n;
    tv *items = tb_iterate(R, &v, &n);
    if (n != nt)
        tfail(R, DF_EINPUT, n > nt ? "too many values to unpack (expected %zu)" : "not enough values to unpack (expected %zu, got %zu)", nt, n);
    for (size_t i = 0; i < nt; i++) assign(R, S, targets[i], items[i]);
}

static tv render_to_string(tctx *R, tscope *S, const node *body) {
    tout o = {0};
    o.in_arena = 1;
    tout *saved = R->out;
    R->out = &o;
    if (++R->depth > R->max_depth) tfail(R, DF_EINPUT, "blocks or macro calls nested deeper than %d levels", R->max_depth);
    exec_body(R, S, body);
    R->depth--;
    R->out = saved;
    return o.len ? tv_str(o.p, o.len) : tv_str("", 0);
}

/* Applies a filter chain whose innermost operand is NULL to base. */
static tv apply_chain(tctx *R, tscope *S, const node *f, tv base) {
    if (!f) return base;
    tv v = apply_chain(R, S, f->a, base);
    step(R, f);
    return tb_filter(R, S, f, v);
}

tv tb_call_macro(tctx *R, const node *m, const tv *args, size_t nargs, const char **kwn, const size_t *kwl,
                 const tv *kwv, size_t nkw) {
    tscope *S = scope_new(R, R->globals);
    size_t np = m->n2;
    if (nargs > np) {
        tv va = tv_list(R, nargs - np, TL_TUPLE);
        memcpy(va.l->v, args + np, (nargs - np) * sizeof(tv));
        scope_set(R, S, "varargs", 7, tv_seal(R, va));
    } else {
        scope_set(R, S, "varargs", 7, tv_list(R, 0, TL_TUPLE));
    }
    tv kw = tv_dict(R, nkw + 1);
    for (size_t i = 0; i < np; i++) {
        tv v = tv_undef_named(R, m->names[i], m->nlens[i], NULL);
        int set = 0;
        if (i < nargs) { v = args[i]; set = 1; }
        for (size_t k = 0; k < nkw; k++)
            if (kwl[k] == m->nlens[i] && memcmp(kwn[k], m->names[i], kwl[k]) == 0) {
                if (set) tfail(R, DF_EINPUT, "macro '%.*s' got multiple values for argument '%.*s'", (int)m->len, m->str, (int)kwl[k], kwn[k]);
                v = kwv[k];
                set = 1;
            }
        if (!set && m->list2[i]) v = teval(R, S, m->list2[i]);
        scope_set(R, S, m->names[i], m->nlens[i], v);
    }
    for (size_t k = 0; k < nkw; k++) {
        int known = 0;
        for (size_t i = 0; i < np; i++)
            if (kwl[k] == m->nlens[i] && memcmp(kwn[k], m->names[i], kwl[k]) == 0) known = 1;
        if (!known) tdict_set(R, kw.d, tv_str(kwn[k], kwl[k]), kwv[k]);
    }
    scope_set(R, S, "kwargs", 6, tv_seal(R, kw));
    int saved_ctl = R->loop_ctl;
    tv r = render_to_string(R, S, m->c);
    R->loop_ctl = saved_ctl;
    return r;
}

static void exec_for(tctx *R, tscope *S, const node *e) {
    tv seq = teval(R, S, e->a);
    R->off = e->off;
    size_t n;
    tv *items = tb_iterate(R, &seq, &n);
    tscope *it = scope_new(R, S);
    if (e->b) {
        /* loop filter: evaluated with the targets bound, before 'loop' exists */
        tv *kept = ta_alloc(R, &R->A, (n ? n : 1) * sizeof(tv));
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            step(R, e);
            it->n = 0;
            assign_targets(R, it, e->list2, e->n2, items[i]);
            tv c = teval(R, it, e->b);
            if (tv_truthy(&c)) kept[k++] = items[i];
        }
        items = kept;
        n = k;
    }
    tloop *L = ta_alloc(R, &R->A, sizeof(tloop));
    L->items = items;
    L->n = n;
    tv lv = {0};
    lv.t = TV_LOOP;
    lv.loop = L;
    L->depth = 1; /* loop.depth counts recursive-loop levels only (no recursive loops here) */
    for (size_t i = 0; i < n; i++) {
        step(R, e);
        L->i = i;
        it->n = 0;
        assign_targets(R, it, e->list2, e->n2, items[i]);
        scope_set(R, it, "loop", 4, lv);
        exec_body(R, it, e->c);
        if (R->loop_ctl == 1) { R->loop_ctl = 0; break; }
        R->loop_ctl = 0;
    }
    if (n == 0 && e->d) exec_body(R, scope_new(R, S), e->d);
}

static void exec_stmt_node(tctx *R, tscope *S, const node *e);

static void exec_stmt(tctx *R, tscope *S, const node *e) {
    step(R, e);
    eval_enter(R);
    exec_stmt_node(R, S, e);
    R->edepth--;
}

static void exec_stmt_node(tctx *R, tscope *S, const node *e) {
    switch (e->kind) {
    case N_DATA: tout_put(R, R->out, e->str, e->len); return;
    case N_OUTPUT: {
        tv v = teval(R, S, e->a);
        tv_str_into(R, R->out, &v);
        return;
    }
    case N_IF:
        for (size_t i = 0; i < e->n2; i++) {
            tv c = teval(R, S, e->list2[i]);
            if (tv_truthy(&c)) { exec_body(R, S, e->list[i]); return; }
        }
        if (e->c) exec_body(R, S, e->c);
        return;
    case N_FOR: exec_for(R, S, e); return;
    case N_SET: {
        tv v = teval(R, S, e->a);
        assign_targets(R, S, e->list2, e->n2, v);
        return;
    }
    case N_SETBLOCK: {
        tv v = render_to_string(R, scope_new(R, S), e->c);
        v = apply_chain(R, S, e->a, v);
        assign_targets(R, S, e->list2, e->n2, v);
        return;
    }
    case N_MACRO: {
        tv m = {0};
        m.t = TV_MACRO;
        m.macro = e;
        scope_set(R, S, e->str, e->len, m);
        return;
    }
    case N_BREAK: R->loop_ctl = 1; return;
    case N_CONTINUE: R->loop_ctl = 2; return;
    case N_FILTERBLOCK: {
        tv v = render_to_string(R, scope_new(R, S), e->c);
        v = apply_chain(R, S, e->a, v);
        tv_str_into(R, R->out, &v);
        return;
    }
    case N_WITH: {
        tscope *W = scope_new(R, S);
        tv *vals = e->n ? ta_alloc(R, &R->A, e->n * sizeof(tv)) : NULL;
        for (size_t i = 0; i < e->n; i++) vals[i] = teval(R, S, e->list[i]);
        for (size_t i = 0; i < e->n; i++) assign(R, W, e->list2[i], vals[i]);
        exec_body(R, W, e->c);
        return;
    }
    case N_BODY: exec_body(R, S, e); return;
    default: tfail(R, DF_EINTERNAL, "internal error: node kind %d is not a statement", e->kind);
    }
}

static void exec_body(tctx *R, tscope *S, const node *body) {
    for (size_t i = 0; i < body->n; i++) {
        exec_stmt(R, S, body->list[i]);
        if (R->loop_ctl) return;
    }
}

void teval_root(tctx *R, const node *root) {
    exec_body(R, R->globals, root);
}
