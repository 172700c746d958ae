/* template_int.h - internals shared by the template_*.c files (not a public
 * header: only src/tok/template*.c include it).
 *
 * Invariants:
 *  - Every value (tv) is immutable once built, except namespace objects,
 *    whose attribute table is mutated by {% set ns.x = ... %}. Lists and
 *    dicts are therefore shared freely by pointer, never copied.
 *  - All memory of a parse lives in the template's arena; all memory of a
 *    render lives in the render's arena (freed as a whole at the end). No
 *    value owns malloc'd memory.
 *  - Strings are valid UTF-8 (sources are validated, JSON input is checked
 *    by jansson, and every operation cuts at code-point boundaries); they
 *    carry a length and may contain NUL bytes.
 *  - Runtime and syntax errors longjmp to the entry point (tfail); nothing
 *    between holds a resource that an arena does not own.
 */
#ifndef DF_TOK_TEMPLATE_INT_H
#define DF_TOK_TEMPLATE_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

/* ---- limits ----------------------------------------------------------- */

/* Nesting limit shared by the parser (tag brackets, statement and
 * expression recursion, and the depth of the syntax tree: a chain such as
 * 1+1+...+1, x|f|f|... or a.b.b... is as deep as it is long), and by values
 * built at run time or read from the context JSON (a list in a list in ...).
 * Every recursive walk over nodes or values is bounded by it. */
#define TPL_MAX_NEST 256
/* Bound on the evaluator's own recursion: expression and statement levels
 * summed over all active macro calls (each call may nest TPL_MAX_NEST deep). */
#define TPL_MAX_EVAL_DEPTH 2048
/* String and container work is charged against the step budget, counted
 * internally in units: one evaluation step (a node evaluated, a loop turn) is
 * TPL_STEP_UNITS, one byte read, written or allocated is one unit, one item
 * visited by a search, comparison or copy is TPL_ITEM_UNITS. */
#define TPL_STEP_UNITS 64
#define TPL_ITEM_UNITS 32
/* Measured costs (ns per byte at about 30 ns per step): copying 0.3,
 * searching (memmem, KMP) up to 4, per-code-point work (case mapping,
 * escaping, slicing, splitting, predicates) up to 17. So every byte handed to
 * a string filter, method or slice is charged TPL_SCAN_UNITS, every byte a
 * substring search passes TPL_SEARCH_UNITS, and each search call (one per
 * match in count/replace/split) TPL_STEP_UNITS / 2. */
#define TPL_SCAN_UNITS 32
#define TPL_SEARCH_UNITS 8
/* Largest width or precision a % or format conversion may ask for. */
#define TPL_MAX_FORMAT_WIDTH 100000

/* ---- arena ------------------------------------------------------------ */

typedef struct tchunk tchunk;
typedef struct {
    tchunk *head;
    size_t total; /* bytes obtained from malloc so far */
    size_t cap;   /* 0: unlimited */
} tarena;

struct tctx;
/* Returns zeroed, 16-byte aligned memory from the arena; fails through R
 * (longjmp) when the cap is exceeded. */
void *ta_alloc(struct tctx *R, tarena *A, size_t n);
void ta_free(tarena *A);

/* ---- values ----------------------------------------------------------- */

enum {
    TV_UNDEF, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT,
    TV_NS, TV_LOOP, TV_MACRO, TV_FUNC, TV_METHOD
};
/* list kinds (tv.sub for TV_LIST): how str() prints it */
enum { TL_LIST, TL_TUPLE, TL_ITEMS, TL_KEYS, TL_VALUES };
/* string flag (tv.sub for TV_STR) */
enum { TS_PLAIN = 0, TS_MARKUP = 1 };

typedef struct tv tv;
typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tundef tundef;
typedef struct tmethod tmethod;
typedef struct tloop tloop;
typedef struct node node;

struct tv {
    uint8_t t;   /* TV_* */
    uint8_t sub; /* TL_* or TS_* */
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        tlist *l;
        tdict *d;      /* TV_DICT and TV_NS */
        tundef *u;     /* may be NULL: plain undefined */
        tmethod *m;
        tloop *loop;
        const node *macro;
        int fn;        /* TV_FUNC: a TF_* id */
    };
};

/* depth: nesting of the value (1 + deepest item; 0 when not computed),
 * set by tv_seal where containers are built from arbitrary values. */
struct tlist { size_t n; tv *v; uint32_t depth; };
/* idx: open-addressing hash index of the scalar keys (None, bool, int,
 * float, str), entry = key position + 1, built lazily once a dict has 8 keys
 * and brought up to date (keys [indexed, n)) at each lookup, so appends may
 * bypass it; a lookup by a non-scalar key scans linearly. */
struct tdict { size_t n, cap; tv *k; tv *v; uint32_t depth; uint32_t *idx; size_t icap, indexed; };
/* Why a value is undefined, for the message when it is used. */
struct tundef {
    const char *name; size_t nlen; /* the missing name or key (str form) */
    const char *owner;             /* NULL: "'name' is undefined"; else a type name: "'dict object' has no attribute 'name'" */
    const char *hint;              /* a full message overriding the above */
};
struct tmethod { tv self; const char *name; };
struct tloop {
    const tv *items; size_t n, i;
    int depth;
};

/* builtin global functions */
enum { TF_RANGE, TF_NAMESPACE, TF_DICT, TF_RAISE, TF_STRFTIME, TF_CYCLE, TF_CHANGED };

/* ---- AST -------------------------------------------------------------- */

enum {
    /* expressions */
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_BINOP, N_COMPARE, N_COND, N_LIST,
    N_TUPLE, N_DICT, N_CONCAT,
    /* statements */
    N_DATA, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK,
    N_CONTINUE, N_FILTERBLOCK, N_WITH, N_BODY, N_NSREF
};
/* N_BINOP / N_COMPARE operators */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

/* One fat node for every kind; the comment of each kind in template_parse.c
 * says which fields it uses. */
struct node {
    uint16_t kind, op;
    uint32_t off;              /* byte offset in the (normalized) source */
    node *a, *b, *c, *d;
    node **list; size_t n;     /* items / args / body */
    node **list2; size_t n2;   /* dict values / kwarg values / elif tests */
    const char **names; size_t *nlens; /* kwarg names / macro params */
    const char *str; size_t len;       /* name, data text */
    tv val;                    /* N_CONST; N_NSREF: the attribute name */
    uint8_t *ops;              /* N_COMPARE: OP_* of each operand in list */
    int flag;                  /* N_TEST: negated; N_FOR: recursive; N_CALL: has *args */
};

/* ---- template and render context -------------------------------------- */

struct df_template {
    tarena A;
    char *src; size_t srclen; /* normalized source (offsets point here) */
    node *root;               /* N_BODY */
    size_t max_output, max_memory;
    uint64_t max_steps;
    int max_depth;
};

typedef struct tscope tscope;
struct tscope {
    tscope *parent;
    size_t n, cap;
    const char **names; size_t *nlens;
    tv *vals;
};

typedef struct tout { char *p; size_t len, cap; int in_arena; } tout; /* in_arena: grown in R->A, never freed */

typedef struct tctx {
    tarena A;
    jmp_buf jb;
    char *err; size_t errlen;
    int code;
    const struct df_template *T;
    uint32_t off;             /* offset of the node being evaluated */
    tout *out;                /* current output sink */
    size_t max_output;
    uint64_t steps, max_steps; /* steps: work done, in TPL_STEP_UNITS per step */
    int depth, max_depth;     /* macro/filter-block nesting */
    tscope *globals;
    int loop_ctl;             /* 0, 1 = break, 2 = continue */
    int rdepth;               /* repr/str/json/compare nesting of values */
    int edepth;               /* evaluator recursion (expressions + statements) */
} tctx;

/* Fails the render (or parse): formats "template line L: msg" unless
 * raw is set, and longjmps to R->jb. */
_Noreturn void tfail(tctx *R, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
_Noreturn void tfail_raw(tctx *R, int code, const char *msg);
/* Charges units (see TPL_STEP_UNITS) against the render's step budget and
 * fails when it is spent, so string and container work is bounded like loop
 * turns are. No-op outside a render (max_steps 0). */
void tcharge(tctx *R, uint64_t units);
static inline void tcharge_bytes(tctx *R, size_t n) { tcharge(R, (uint64_t)n); }
static inline void tcharge_items(tctx *R, size_t n) { tcharge(R, (uint64_t)n * TPL_ITEM_UNITS); }
static inline void tcharge_scan(tctx *R, size_t n) { tcharge(R, (uint64_t)n * TPL_SCAN_UNITS); }
/* Enters / leaves one level of value recursion (compare, print, JSON). */
void tv_enter(tctx *R);
static inline void tv_leave(tctx *R) { R->rdepth--; }
void t_line_col(const char *src, size_t off, int *line, int *col);

/* ---- unicode ------------------------------------------------------------ */

/* Decodes one code point at s (n bytes left, n > 0); returns its length. */
int u8_dec(const char *s, size_t n, uint32_t *cp);
int u8_enc(uint32_t cp, char *out); /* 1..4 bytes */
int u_isspace(uint32_t cp);         /* Python str.isspace */
int u_isprintable(uint32_t cp);     /* Python str.isprintable (approximation, see .c) */
uint32_t u_lower(uint32_t cp);
uint32_t u_upper(uint32_t cp);
int u_isalpha(uint32_t cp);
int u_isdigit(uint32_t cp);
int u_isalnum(uint32_t cp);
int u8_valid(const char *s, size_t n);
size_t u8_count(const char *s, size_t n);

/* ---- value helpers (template_value.c; printing, JSON: template_print.c) - */

tv tv_undef(void);
tv tv_undef_named(tctx *R, const char *name, size_t nlen, const char *owner);
tv tv_none(void);
tv tv_bool(int b);
tv tv_int(int64_t i);
tv tv_float(double f);
tv tv_str(const char *p, size_t n);
tv tv_cstr(const char *p);
tv tv_strdup(tctx *R, const char *p, size_t n);
tv tv_list(tctx *R, size_t n, int kind); /* items zeroed (undefined) */
tv tv_dict(tctx *R, size_t cap);
void tdict_set(tctx *R, tdict *d, tv k, tv v); /* replaces in place or appends */
tv *tdict_get(tctx *R, const tdict *d, tv k);
tv *tdict_gets(tctx *R, const tdict *d, const char *k, size_t n);
/* Computes the nesting depth of a list or dict built from arbitrary items
 * (1 + deepest item) and fails when it exceeds TPL_MAX_NEST; no-op for
 * other values. Returns v. */
tv tv_seal(tctx *R, tv v);

const char *tv_typename(const tv *v); /* Python type name: 'dict', 'str', ... */
int tv_truthy(const tv *v);
int tv_is_num(const tv *v); /* int, float or bool */
int tv_eq(tctx *R, const tv *a, const tv *b);
/* Python ordering; fails (TypeError) on unorderable types. Returns <0, 0, >0. */
int tv_cmp(tctx *R, const tv *a, const tv *b, const char *opname);

/* Python str(v) / repr(v), appended to a buffer. */
void tout_put(tctx *R, tout *o, const char *p, size_t n);
void tv_str_into(tctx *R, tout *o, const tv *v);
void tv_repr_into(tctx *R, tout *o, const tv *v);
void float_repr(double f, char *buf); /* Python repr(float), buf >= 32 bytes */
tv tv_to_str(tctx *R, const tv *v); /* str(v) as a string value */

/* json.dumps(v, ensure_ascii, indent (NULL: none), separators, sort_keys) */
typedef struct {
    int ensure_ascii, sort_keys;
    const char *indent; size_t indent_n; int has_indent;
    const char *item_sep; size_t item_sep_n;
    const char *key_sep; size_t key_sep_n;
} tjson_opts;
void tv_json_into(tctx *R, tout *o, const tv *v, const tjson_opts *opt, int level);

/* Builds a value from a jansson json_t (void * to keep jansson out of here). */
tv tv_from_json(tctx *R, const void *json);

/* A string value's code points (arena array). */
uint32_t *tv_codepoints(tctx *R, const char *p, size_t n, size_t *count);
tv tv_from_codepoints(tctx *R, const uint32_t *cps, size_t n);
int tv_is_ascii(const char *p, size_t n);

/* ---- parse / eval entry points ------------------------------------------ */

node *tparse(tctx *R, struct df_template *T); /* parses T->src into T->A */
void teval_root(tctx *R, const node *root);
tv teval(tctx *R, tscope *S, const node *e);

/* builtins (template_builtins.c, template_strings.c, template_filters.c) */
int tb_filter_known(const char *name, size_t n, const char **why);
int tb_test_known(const char *name, size_t n);
tv tb_filter(tctx *R, tscope *S, const node *e, tv v);
int tb_test(tctx *R, tscope *S, const node *e, const tv *v);
tv tb_getattr(tctx *R, const tv *obj, const char *name, size_t n);
tv tb_getitem(tctx *R, const tv *obj, const tv *key);
tv tb_call_method(tctx *R, const tmethod *m, const tv *args, size_t nargs, const char **kwn, const size_t *kwl,
                  const tv *kwv, size_t nkw);
tv tb_call_func(tctx *R, int fn, const tv *args, size_t nargs, const char **kwn, const size_t *kwl, const tv *kwv,
                size_t nkw);
int tb_global_func(const char *name, size_t n); /* TF_* or -1 */
/* Iterates v the way a Python for loop does; returns an arena array. */
tv *tb_iterate(tctx *R, const tv *v, size_t *n);
tv tb_binop(tctx *R, int op, const tv *a, const tv *b);
int tb_contains(tctx *R, const tv *container, const tv *item);
tv tb_slice(tctx *R, const tv *obj, const tv *start, const tv *stop, const tv *step);
/* Python str % args formatting. */
tv tb_percent_format(tctx *R, const tv *fmt, const tv *args);
tv tb_call_macro(tctx *R, const node *m, const tv *args, size_t nargs, const char **kwn, const size_t *kwl,
                 const tv *kwv, size_t nkw);
_Noreturn void tb_undef_fail(tctx *R, const tv *v);

#endif
