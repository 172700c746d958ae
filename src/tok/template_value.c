/* template_value.c - the value model of the chat-template renderer: arena,
 * error exits, UTF-8 and the few Unicode properties Python string methods
 * need, value constructors, dicts, equality and ordering. Printing
 * (str()/repr()) and JSON are in template_print.c.
 *
 * Invariants: tv_seal bounds container nesting at TPL_MAX_NEST; dicts keep
 * insertion order (set replaces in place or appends) with a lazily built
 * hash index of their scalar keys; Unicode properties beyond Latin, Greek
 * and Cyrillic letter case are approximations documented in
 * docs/CHAT_TEMPLATES.md.
 */
#include "tok/template_int.h"

#include "deltafin.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ------------------------------------------------------------ */

struct tchunk {
    tchunk *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
};

void *ta_alloc(tctx *R, tarena *A, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    tchunk *c = A->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > 65536 - sizeof(tchunk) ? n : 65536 - sizeof(tchunk);
        if (A->cap && (sz > A->cap || A->total + sz + sizeof(tchunk) > A->cap))
            tfail(R, DF_EINPUT, "memory budget of %zu bytes exceeded (a block of %zu more bytes was needed)", A->cap, n);
        c = malloc(sizeof(tchunk) + sz);
        if (!c) tfail(R, DF_ENOMEM, "out of memory rendering the template");
        c->size = sz;
        c->used = 0;
        A->total += sz + sizeof(tchunk);
        /* keep a partly used big chunk at the head only if it has room */
        if (A->head && n == sz) {
            c->next = A->head->next;
            A->head->next = c;
        } else {
            c->next = A->head;
            A->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    tcharge_bytes(R, n);
    return p;
}

void ta_free(tarena *A) {
    tchunk *c = A->head;
    while (c) {
        tchunk *nx = c->next;
        free(c);
        c = nx;
    }
    A->head = NULL;
    A->total = 0;
}

/* ---- errors ----------------------------------------------------------- */

void t_line_col(const char *src, size_t off, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; src && i < off && src[i]; i++) {
        if (src[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

void tfail(tctx *R, int code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (R->err && R->errlen) {
        int line = 0, col = 0;
        if (R->T) t_line_col(R->T->src, R->off, &line, &col);
        if (line)
            snprintf(R->err, R->errlen, "template line %d: %s", line, msg);
        else
            snprintf(R->err, R->errlen, "%s", msg);
    }
    R->code = code;
    longjmp(R->jb, 1);
}

void tfail_raw(tctx *R, int code, const char *msg) {
    if (R->err && R->errlen) {
        /* one line: newlines in the template's message become spaces */
        size_t j = 0;
        for (size_t i = 0; msg[i] && j + 1 < R->errlen; i++) R->err[j++] = (msg[i] == '\n' || msg[i] == '\r') ? ' ' : msg[i];
        R->err[j] = 0;
    }
    R->code = code;
    longjmp(R->jb, 1);
}

void tcharge(tctx *R, uint64_t units) {
    if (!R->max_steps) return;
    R->steps += units;
    if (R->steps / TPL_STEP_UNITS > R->max_steps)
        tfail(R, DF_EINPUT, "step budget of %llu exceeded (loop turns, expression evaluations and string work)",
              (unsigned long long)R->max_steps);
}

void tv_enter(tctx *R) {
    if (++R->rdepth > TPL_MAX_NEST) tfail(R, DF_EINPUT, "value nesting deeper than %d levels", TPL_MAX_NEST);
}

/* ---- UTF-8 and Unicode -------------------------------------------------- */

int u8_dec(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) { *cp = u[0]; return 1; }
    int len = u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
    if (len == 1 || (size_t)len > n) { *cp = 0xFFFD; return 1; }
    uint32_t c = u[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) { *cp = 0xFFFD; return 1; }
        c = (c << 6) | (u[i] & 0x3F);
    }
    *cp = c;
    return len;
}

int u8_enc(uint32_t cp, char *o) {
    unsigned char *u = (unsigned char *)o;
    if (cp < 0x80) { u[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { u[0] = 0xC0 | (cp >> 6); u[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        u[0] = 0xE0 | (cp >> 12); u[1] = 0x80 | ((cp >> 6) & 0x3F); u[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    u[0] = 0xF0 | (cp >> 18); u[1] = 0x80 | ((cp >> 12) & 0x3F);
    u[2] = 0x80 | ((cp >> 6) & 0x3F); u[3] = 0x80 | (cp & 0x3F);
    return 4;
}

int u8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c < 0x80) { i++; continue; }
        int len; uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (i + len > n) return 0;
        for (int k = 1; k < len; k++) {
            if ((u[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

size_t u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

int u_isspace(uint32_t c) {
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
    if (c < 0x85) return 0;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python's str.isprintable: false for categories Cc, Cf, Cs, Co, Cn, Zl,
 * Zp, Zs except ' '. Unassigned code points (Cn) are not tabulated here;
 * the format (Cf), private-use and separator ranges are. */
int u_isprintable(uint32_t c) {
    if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return 0;
    if (c < 0x300) return 1;
    if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x890 || c == 0x891 ||
        c == 0x8E2 || c == 0x180E || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
        (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000 ||
        (c >= 0xD800 && c <= 0xF8FF) || (c >= 0xFDD0 && c <= 0xFDEF) || c == 0xFEFF ||
        (c >= 0xFFF0 && c <= 0xFFFB) || (c & 0xFFFE) == 0xFFFE || c == 0x110BD || c == 0x110CD ||
        (c >= 0x13430 && c <= 0x1343F) || (c >= 0x1BCA0 && c <= 0x1BCA3) || (c >= 0x1D173 && c <= 0x1D17A) ||
        c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F) || c >= 0xF0000)
        return 0;
    return 1;
}

/* Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and
 * Cyrillic (the one-to-one mappings); other code points map to themselves. */
uint32_t u_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x130) return 'i' ; /* approximation of 'i̇' */
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
        if (c == 0x178) return 0xFF;
        if (c == 0x138 || c == 0x149 || c == 0x17F) return c;
        return (c & 1) ? c : c + 1;
    }
    if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    if (c >= 0x460 && c <= 0x4FF && !(c >= 0x482 && c <= 0x489)) {
        if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c + 1 : c;
        if (c == 0x4C0) return 0x4CF;
        return (c & 1) ? c : c + 1;
    }
    if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
    return c;
}

uint32_t u_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x131) return 'I';
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
        if (c == 0x138 || c == 0x149 || c == 0x130 || c == 0x178) return c;
        if (c == 0x17F) return 'S';
        return (c & 1) ? c - 1 : c;
    }
    if (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if (c >= 0x460 && c <= 0x4FF && !(c >= 0x482 && c <= 0x489)) {
        if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c : c - 1;
        if (c == 0x4CF) return 0x4C0;
        return (c & 1) ? c - 1 : c;
    }
    if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
    return c;
}

int u_isdigit(uint32_t c) { return c >= '0' && c <= '9'; }
int u_isalpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    if (c == 0xAA || c == 0xB5 || c == 0xBA) return 1;
    if (c < 0xC0 || c == 0xD7 || c == 0xF7) return 0;
    if (u_isspace(c) || !u_isprintable(c)) return 0;
    /* general punctuation, symbols, emoji and CJK punctuation are not letters */
    if ((c >= 0x2000 && c <= 0x2BFF) || (c >= 0x3000 && c <= 0x303F) || (c >= 0x1F000 && c <= 0x1FAFF) ||
        (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0x300 && c <= 0x36F))
        return 0;
    return 1;
}
int u_isalnum(uint32_t c) { return u_isalpha(c) || u_isdigit(c); }

int tv_is_ascii(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80) return 0;
    return 1;
}

uint32_t *tv_codepoints(tctx *R, const char *p, size_t n, size_t *count) {
    uint32_t *cps = ta_alloc(R, &R->A, (n + 1) * sizeof(uint32_t));
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        i += u8_dec(p + i, n - i, &cps[k]);
        k++;
    }
    *count = k;
    return cps;
}

tv tv_from_codepoints(tctx *R, const uint32_t *cps, size_t n) {
    char *o = ta_alloc(R, &R->A, n * 4 + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += u8_enc(cps[i], o + k);
    return tv_str(o, k);
}

/* ---- constructors ----------------------------------------------------- */

tv tv_undef(void) { tv v = {0}; v.t = TV_UNDEF; return v; }
tv tv_undef_named(tctx *R, const char *name, size_t nlen, const char *owner) {
    tv v = tv_undef();
    v.u = ta_alloc(R, &R->A, sizeof(tundef));
    v.u->name = name;
    v.u->nlen = nlen;
    v.u->owner = owner;
    return v;
}
tv tv_none(void) { tv v = {0}; v.t = TV_NONE; return v; }
tv tv_bool(int b) { tv v = {0}; v.t = TV_BOOL; v.b = !!b; return v; }
tv tv_int(int64_t i) { tv v = {0}; v.t = TV_INT; v.i = i; return v; }
tv tv_float(double f) { tv v = {0}; v.t = TV_FLOAT; v.f = f; return v; }
tv tv_str(const char *p, size_t n) { tv v = {0}; v.t = TV_STR; v.s.p = p; v.s.n = n; return v; }
tv tv_cstr(const char *p) { return tv_str(p, strlen(p)); }
tv tv_strdup(tctx *R, const char *p, size_t n) {
    char *q = ta_alloc(R, &R->A, n + 1);
    if (n) memcpy(q, p, n);
    return tv_str(q, n);
}
tv tv_list(tctx *R, size_t n, int kind) {
    tv v = {0};
    v.t = TV_LIST;
    v.sub = (uint8_t)kind;
    v.l = ta_alloc(R, &R->A, sizeof(tlist));
    v.l->n = n;
    v.l->v = n ? ta_alloc(R, &R->A, n * sizeof(tv)) : NULL;
    return v;
}
tv tv_dict(tctx *R, size_t cap) {
    tv v = {0};
    v.t = TV_DICT;
    v.d = ta_alloc(R, &R->A, sizeof(tdict));
    v.d->cap = cap ? cap : 4;
    v.d->k = ta_alloc(R, &R->A, v.d->cap * sizeof(tv));
    v.d->v = ta_alloc(R, &R->A, v.d->cap * sizeof(tv));
    return v;
}

static uint32_t item_depth(const tv *v) {
    if (v->t == TV_LIST) return v->l->depth ? v->l->depth : 1;
    if (v->t == TV_DICT) return v->d->depth ? v->d->depth : 1;
    return 0;
}

tv tv_seal(tctx *R, tv v) {
    uint32_t d = 0;
    if (v.t == TV_LIST) {
        for (size_t i = 0; i < v.l->n; i++) {
            uint32_t x = item_depth(&v.l->v[i]);
            if (x > d) d = x;
        }
        tcharge_items(R, v.l->n);
        v.l->depth = d + 1;
    } else if (v.t == TV_DICT) {
        for (size_t i = 0; i < v.d->n; i++) {
            uint32_t x = item_depth(&v.d->v[i]), y = item_depth(&v.d->k[i]);
            if (x > d) d = x;
            if (y > d) d = y;
        }
        tcharge_items(R, v.d->n);
        v.d->depth = d + 1;
    } else {
        return v;
    }
    if (d + 1 > TPL_MAX_NEST) tfail(R, DF_EINPUT, "value nesting deeper than %d levels", TPL_MAX_NEST);
    return v;
}

static int key_scalar(const tv *k) {
    return k->t == TV_NONE || k->t == TV_BOOL || k->t == TV_INT || k->t == TV_FLOAT || k->t == TV_STR;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Consistent with tv_eq: 1 == 1.0 == True hash alike; Markup and str alike. */
static uint64_t key_hash(tctx *R, const tv *k) {
    switch (k->t) {
    case TV_BOOL: return mix64((uint64_t)k->b);
    case TV_INT: return mix64((uint64_t)k->i);
    case TV_FLOAT:
        if (k->f >= -9223372036854775808.0 && k->f < 9223372036854775808.0 && k->f == floor(k->f))
            return mix64((uint64_t)(int64_t)k->f);
        {
            uint64_t bits;
            memcpy(&bits, &k->f, sizeof bits);
            return mix64(bits ^ 0x5555555555555555ull);
        }
    case TV_STR: {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < k->s.n; i++) h = (h ^ (unsigned char)k->s.p[i]) * 0x100000001b3ull;
        tcharge_bytes(R, k->s.n);
        return mix64(h);
    }
    default: return 0x9e3779b97f4a7c15ull;
    }
}

#define DICT_INDEX_MIN 8

/* Brings d's index up to date with its keys (see struct tdict). */
static void dict_index(tctx *R, tdict *d) {
    if (!d->idx || d->n * 2 > d->icap) {
        size_t ic = 32;
        while (ic < d->n * 4) ic *= 2;
        d->idx = ta_alloc(R, &R->A, ic * sizeof(uint32_t));
        d->icap = ic;
        d->indexed = 0;
    }
    tcharge_items(R, d->n - d->indexed);
    for (size_t i = d->indexed; i < d->n; i++) {
        if (!key_scalar(&d->k[i])) continue;
        size_t p = (size_t)key_hash(R, &d->k[i]) & (d->icap - 1);
        while (d->idx[p]) p = (p + 1) & (d->icap - 1);
        d->idx[p] = (uint32_t)(i + 1);
    }
    d->indexed = d->n;
}

tv *tdict_get(tctx *R, const tdict *cd, tv k) {
    tdict *d = (tdict *)cd; /* the index is a cache in the render's arena */
    if (d->n >= DICT_INDEX_MIN && key_scalar(&k) && d->n < UINT32_MAX) {
        dict_index(R, d);
        tcharge_items(R, 1);
        for (size_t p = (size_t)key_hash(R, &k) & (d->icap - 1); d->idx[p]; p = (p + 1) & (d->icap - 1)) {
            size_t j = d->idx[p] - 1;
            if (tv_eq(R, &d->k[j], &k)) return &d->v[j];
        }
        return NULL;
    }
    tcharge_items(R, d->n);
    for (size_t i = 0; i < d->n; i++)
        if (tv_eq(R, &d->k[i], &k)) return &d->v[i];
    return NULL;
}
tv *tdict_gets(tctx *R, const tdict *d, const char *k, size_t n) { return tdict_get(R, d, tv_str(k, n)); }
void tdict_set(tctx *R, tdict *d, tv k, tv v) {
    tv *p = tdict_get(R, d, k);
    if (p) { *p = v; return; }
    if (d->n == d->cap) {
        size_t nc = d->cap * 2;
        tv *nk = ta_alloc(R, &R->A, nc * sizeof(tv)), *nv = ta_alloc(R, &R->A, nc * sizeof(tv));
        memcpy(nk, d->k, d->n * sizeof(tv));
        memcpy(nv, d->v, d->n * sizeof(tv));
        d->k = nk; d->v = nv; d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

/* ---- predicates --------------------------------------------------------- */

const char *tv_typename(const tv *v) {
    switch (v->t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return v->sub == TS_MARKUP ? "Markup" : "str";
    case TV_LIST:
        return v->sub == TL_TUPLE ? "tuple" : v->sub == TL_ITEMS ? "dict_items" : v->sub == TL_KEYS ? "dict_keys"
             : v->sub == TL_VALUES ? "dict_values" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_LOOP: return "LoopContext";
    case TV_MACRO: return "Macro";
    case TV_FUNC: return "function";
    case TV_METHOD: return "builtin_function_or_method";
    }
    return "object";
}

int tv_truthy(const tv *v) {
    switch (v->t) {
    case TV_UNDEF: case TV_NONE: return 0;
    case TV_BOOL: return v->b;
    case TV_INT: return v->i != 0;
    case TV_FLOAT: return v->f != 0.0;
    case TV_STR: return v->s.n != 0;
    case TV_LIST: return v->l->n != 0;
    case TV_DICT: return v->d->n != 0;
    default: return 1;
    }
}

int tv_is_num(const tv *v) { return v->t == TV_INT || v->t == TV_FLOAT || v->t == TV_BOOL; }
static double num_f(const tv *v) { return v->t == TV_FLOAT ? v->f : v->t == TV_INT ? (double)v->i : (double)v->b; }
static int64_t num_i(const tv *v) { return v->t == TV_INT ? v->i : v->b; }

static int list_eq(tctx *R, const tv *a, const tv *b) {
    if ((a->sub == TL_TUPLE) != (b->sub == TL_TUPLE)) return 0;
    if (a->l == b->l) return 1;
    if (a->l->n != b->l->n) return 0;
    tv_enter(R);
    tcharge_items(R, a->l->n);
    int r = 1;
    for (size_t i = 0; i < a->l->n && r; i++) r = tv_eq(R, &a->l->v[i], &b->l->v[i]);
    tv_leave(R);
    return r;
}

static int dict_eq(tctx *R, const tdict *a, const tdict *b) {
    if (a == b) return 1;
    if (a->n != b->n) return 0;
    tv_enter(R);
    int r = 1;
    for (size_t i = 0; i < a->n && r; i++) {
        tv *o = tdict_get(R, b, a->k[i]);
        r = o && tv_eq(R, &a->v[i], o);
    }
    tv_leave(R);
    return r;
}

int tv_eq(tctx *R, const tv *a, const tv *b) {
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->t == TV_FLOAT || b->t == TV_FLOAT) {
            /* int vs float: compare exactly like Python */
            if (a->t != TV_FLOAT) return (double)num_i(a) == b->f && (int64_t)b->f == num_i(a);
            if (b->t != TV_FLOAT) return (double)num_i(b) == a->f && (int64_t)a->f == num_i(b);
            return a->f == b->f;
        }
        return num_i(a) == num_i(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case TV_UNDEF: case TV_NONE: return 1;
    case TV_STR:
        if (a->s.n != b->s.n) return 0;
        tcharge_bytes(R, a->s.n);
        return memcmp(a->s.p, b->s.p, a->s.n) == 0;
    case TV_LIST: return list_eq(R, a, b);
    case TV_DICT: return dict_eq(R, a->d, b->d);
    case TV_NS: return a->d == b->d;
    case TV_LOOP: return a->loop == b->loop;
    case TV_MACRO: return a->macro == b->macro;
    case TV_FUNC: return a->fn == b->fn;
    case TV_METHOD: return a->m == b->m;
    }
    return 0;
}

int tv_cmp(tctx *R, const tv *a, const tv *b, const char *opname) {
    if (a->t == TV_UNDEF) tb_undef_fail(R, a);
    if (b->t == TV_UNDEF) tb_undef_fail(R, b);
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a->t != TV_FLOAT && b->t != TV_FLOAT) {
            int64_t x = num_i(a), y = num_i(b);
            return (x > y) - (x < y);
        }
        double x = num_f(a), y = num_f(b);
        return (x > y) - (x < y); /* NaN compares as equal; Python's ops all give False */
    }
    if (a->t == TV_STR && b->t == TV_STR) {
        size_t m = a->s.n < b->s.n ? a->s.n : b->s.n;
        tcharge_bytes(R, m);
        int c = m ? memcmp(a->s.p, b->s.p, m) : 0;
        if (c) return c;
        return (a->s.n > b->s.n) - (a->s.n < b->s.n);
    }
    if (a->t == TV_LIST && b->t == TV_LIST && (a->sub == TL_TUPLE) == (b->sub == TL_TUPLE) &&
        (a->sub == TL_LIST || a->sub == TL_TUPLE) && (b->sub == TL_LIST || b->sub == TL_TUPLE)) {
        size_t m = a->l->n < b->l->n ? a->l->n : b->l->n;
        tv_enter(R);
        tcharge_items(R, m);
        for (size_t i = 0; i < m; i++) {
            if (tv_eq(R, &a->l->v[i], &b->l->v[i])) continue;
            int c = tv_cmp(R, &a->l->v[i], &b->l->v[i], opname);
            tv_leave(R);
            return c;
        }
        tv_leave(R);
        return (a->l->n > b->l->n) - (a->l->n < b->l->n);
    }
    tfail(R, DF_EINPUT, "'%s' not supported between instances of '%s' and '%s'", opname, tv_typename(a),
          tv_typename(b));
}
