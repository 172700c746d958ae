/* template_builtins_int.h - helpers shared by the builtin files of the
 * renderer: template_builtins.c (access, operators, globals, tests),
 * template_strings.c (string primitives, % and str.format, str methods) and
 * template_filters.c (filters, sorting, list / dict methods).
 *
 * Not a public header: only those three files include it. The small argument
 * helpers are static inline; the rest is defined in the file named next to
 * it. Every helper fails through tfail (longjmp) and never returns an error.
 */
#ifndef DF_TOK_TEMPLATE_BUILTINS_INT_H
#define DF_TOK_TEMPLATE_BUILTINS_INT_H

#include "tok/template_int.h"

#include "deltafin.h"

#include <stdint.h>
#include <string.h>

static inline int sv_eq(const tv *v, const char *s) { return v->t == TV_STR && v->s.n == strlen(s) && !memcmp(v->s.p, s, v->s.n); }
static inline int name_is(const char *n, size_t l, const char *s) { return l == strlen(s) && !memcmp(n, s, l); }

static inline tv soft_str(tctx *R, const tv *v) { return tv_to_str(R, v); }

static inline int64_t want_int(tctx *R, const tv *v, const char *what) {
    if (v->t == TV_INT) return v->i;
    if (v->t == TV_BOOL) return v->b;
    if (v->t == TV_UNDEF) tb_undef_fail(R, v);
    tfail(R, DF_EINPUT, "%s must be an integer, not '%s'", what, tv_typename(v));
}

static inline tv want_str(tctx *R, const tv *v, const char *what) {
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

static inline const tv *arg(const targs *A, size_t i, const char *name) {
    if (i < A->na) return &A->a[i];
    for (size_t k = 0; k < A->nk; k++)
        if (name && name_is(A->kn[k], A->kl[k], name)) return &A->kv[k];
    return NULL;
}

static inline void arg_max(tctx *R, const targs *A, size_t maxpos, const char *const *names) {
    if (A->na > maxpos) tfail(R, DF_EINPUT, "%s() takes at most %zu positional arguments (%zu given)", A->fname, maxpos, A->na);
    for (size_t k = 0; k < A->nk; k++) {
        int ok = 0;
        for (int j = 0; names && names[j]; j++)
            if (name_is(A->kn[k], A->kl[k], names[j])) ok = 1;
        if (!ok) tfail(R, DF_EINPUT, "%s() got an unexpected keyword argument '%.*s'", A->fname, (int)A->kl[k], A->kn[k]);
    }
}

static inline int in_names(const char *const *names, const char *n, size_t l) {
    for (int i = 0; names[i]; i++)
        if (name_is(n, l, names[i])) return 1;
    return 0;
}

_Noreturn static inline void overflow(tctx *R) { tfail(R, DF_EUNSUPPORTED, "integer overflow (only 64-bit integers are supported)"); }

/* template_builtins.c */
/* An undefined value whose use fails with the formatted hint. */
tv tb_undef_hint(tctx *R, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
extern const char *const TB_DICT_METHODS[];
/* Python slice.indices */
void tb_slice_indices(tctx *R, size_t len, const tv *a, const tv *b, const tv *c, int64_t *start, int64_t *stop,
                      int64_t *stepo);
int tb_apply_test(tctx *R, const char *name, size_t nl, const tv *v, const tv *args, size_t nargs);

/* template_strings.c */
/* Forward substring search in linear time (the caller charges the cost). */
const char *tb_memfind(tctx *R, const char *h, size_t hn, const char *nd, size_t nn);
/* strip chars (NULL: whitespace) from the left (mode 1), right (2) or both (3) */
tv tb_str_strip(tctx *R, tv s, const tv *chars, int mode);
tv tb_str_map(tctx *R, tv s, uint32_t (*f)(uint32_t));
tv tb_str_capitalize(tctx *R, tv s);
/* jinja2's title filter: words start after runs of [-\s({[<] */
tv tb_jinja_title(tctx *R, tv s);
tv tb_str_replace(tctx *R, tv s, tv old, tv nw, int64_t count);
tv tb_html_escape(tctx *R, tv s);
/* Python str methods (self s, method name m). */
tv tb_str_method(tctx *R, tv s, const char *m, const targs *A);

#endif
