/* template.c - public entry points of the chat-template renderer and the
 * apply_chat_template preprocessing (tokenizer_config.json reading, message
 * normalization).
 *
 * Invariants: every entry point catches the renderer's longjmp errors, so
 * callers only ever see a return code and a one-line message; a failed
 * parse or render frees everything it allocated.
 */
#include "tok/template.h"

#include "deltafin.h"
#include "tok/template_int.h"
#include "util/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define DEFAULT_MAX_STEPS 20000000ull
#define DEFAULT_MAX_DEPTH 256

static void set_err(char *err, size_t errlen, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
}

df_template *df_template_parse(const char *src, char *err, size_t errlen) {
    if (!src) {
        set_err(err, errlen, "template source is NULL");
        return NULL;
    }
    size_t n = strlen(src);
    if (!u8_valid(src, n)) {
        set_err(err, errlen, "template is not valid UTF-8");
        return NULL;
    }
    if (n > (size_t)UINT32_MAX - 16) {
        set_err(err, errlen, "template is too large");
        return NULL;
    }
    df_template *T = calloc(1, sizeof *T);
    if (!T) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    T->max_output = DEFAULT_MAX_OUTPUT;
    T->max_memory = DEFAULT_MAX_MEMORY;
    T->max_steps = DEFAULT_MAX_STEPS;
    T->max_depth = DEFAULT_MAX_DEPTH;
    /* normalize \r\n and \r to \n; drop one trailing newline (jinja2's
     * keep_trailing_newline=False) */
    T->src = malloc(n + 1);
    if (!T->src) {
        free(T);
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            T->src[k++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            T->src[k++] = src[i];
        }
    }
    if (k && T->src[k - 1] == '\n') k--;
    T->src[k] = 0;
    T->srclen = k;

    tctx *R = calloc(1, sizeof *R);
    if (!R) {
        df_template_free(T);
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    R->err = err;
    R->errlen = errlen;
    R->T = NULL; /* parse errors format their own line/column */
    if (setjmp(R->jb)) {
        free(R);
        df_template_free(T);
        return NULL;
    }
    /* the parse's own memory (tokens, nodes, decoded literals: about 30x
     * the source at worst) is bounded like a render's */
    T->A.cap = DEFAULT_MAX_MEMORY;
    T->root = tparse(R, T);
    free(R);
    return T;
}

void df_template_free(df_template *t) {
    if (!t) return;
    ta_free(&t->A);
    free(t->src);
    free(t);
}

void df_template_set_limits(df_template *t, size_t max_output, size_t max_memory, uint64_t max_steps) {
    if (!t) return;
    if (max_output) t->max_output = max_output;
    if (max_memory) t->max_memory = max_memory;
    if (max_steps) t->max_steps = max_steps;
}

/* Renders with an already parsed jansson context object. */
static int render_json(const df_template *t, const json_t *ctx, char **out, size_t *out_len, char *err,
                       size_t errlen) {
    *out = NULL;
    if (out_len) *out_len = 0;
    tctx *R = calloc(1, sizeof *R);
    tout *o = calloc(1, sizeof *o);
    if (!R || !o) {
        free(R);
        free(o);
        set_err(err, errlen, "out of memory");
        return DF_ENOMEM;
    }
    R->err = err;
    R->errlen = errlen;
    R->T = t;
    R->A.cap = t->max_memory;
    R->max_output = t->max_output;
    R->max_steps = t->max_steps;
    R->max_depth = t->max_depth;
    R->out = o;
    if (setjmp(R->jb)) {
        int code = R->code ? R->code : DF_EINTERNAL;
        free(o->p);
        free(o);
        ta_free(&R->A);
        free(R);
        return code;
    }
    R->globals = ta_alloc(R, &R->A, sizeof(tscope));
    tscope *G = R->globals;
    const char *key;
    json_t *val;
    /* context variables become top-level names (strings owned by the arena);
     * errors here are about the context, not a template line */
    R->T = NULL;
    for (void *it = json_object_iter((json_t *)ctx); it; it = json_object_iter_next((json_t *)ctx, it)) {
        key = json_object_iter_key(it);
        val = json_object_iter_value(it);
        tv k = tv_strdup(R, key, json_object_iter_key_len(it));
        tv v = tv_from_json(R, val);
        if (G->n == G->cap) {
            size_t nc = G->cap ? G->cap * 2 : 16;
            const char **nn = ta_alloc(R, &R->A, nc * sizeof(char *));
            size_t *nl = ta_alloc(R, &R->A, nc * sizeof(size_t));
            tv *nv = ta_alloc(R, &R->A, nc * sizeof(tv));
            if (G->n) {
                memcpy(nn, G->names, G->n * sizeof(char *));
                memcpy(nl, G->nlens, G->n * sizeof(size_t));
                memcpy(nv, G->vals, G->n * sizeof(tv));
            }
            G->names = nn; G->nlens = nl; G->vals = nv; G->cap = nc;
        }
        G->names[G->n] = k.s.p;
        G->nlens[G->n] = k.s.n;
        G->vals[G->n] = v;
        G->n++;
    }
    R->T = t;
    teval_root(R, t->root);
    if (!o->p) {
        o->p = malloc(1);
        if (!o->p) {
            set_err(err, errlen, "out of memory");
            ta_free(&R->A);
            free(R);
            free(o);
            return DF_ENOMEM;
        }
        o->p[0] = 0;
    }
    *out = o->p;
    if (out_len) *out_len = o->len;
    free(o);
    ta_free(&R->A);
    free(R);
    return 0;
}

int df_template_render(const df_template *t, const char *context_json, char **out, size_t *out_len, char *err,
                       size_t errlen) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !out) return df_err(err, errlen, DF_EINPUT, "df_template_render: no template or output pointer");
    json_error_t je;
    json_t *ctx = json_loads(context_json ? context_json : "{}", JSON_ALLOW_NUL, &je);
    if (!ctx) return df_err(err, errlen, DF_EINPUT, "context JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_object(ctx)) {
        json_decref(ctx);
        return df_err(err, errlen, DF_EINPUT, "context JSON must be an object");
    }
    int rc = render_json(t, ctx, out, out_len, err, errlen);
    json_decref(ctx);
    return rc;
}

/* ---- chat helpers ------------------------------------------------------- */

static const char *const SPECIAL_KEYS[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                           "pad_token", "cls_token", "mask_token", NULL};

int df_chat_config_parse(const char *config_json, const char *name, int want_tools, char **template_src,
                         char **special_tokens_json, char *err, size_t errlen) {
    if (template_src) *template_src = NULL;
    if (special_tokens_json) *special_tokens_json = NULL;
    if (!name) name = "tokenizer_config.json";
    json_error_t je;
    json_t *cfg = json_loads(config_json ? config_json : "", JSON_ALLOW_NUL, &je);
    if (!cfg) return df_err(err, errlen, DF_EFORMAT, "%s: invalid JSON: %s (line %d)", name, je.text, je.line);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return df_err(err, errlen, DF_EFORMAT, "%s: expected a JSON object", name);
    }
    int rc = 0;
    json_t *sp = json_object();
    for (int i = 0; SPECIAL_KEYS[i]; i++) {
        json_t *v = json_object_get(cfg, SPECIAL_KEYS[i]);
        if (!v || json_is_null(v)) continue;
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (!json_is_string(v)) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: field \"%s\" must be a string or an object with a string \"content\"",
                        name, SPECIAL_KEYS[i]);
            goto done;
        }
        json_object_set(sp, SPECIAL_KEYS[i], v);
    }
    if (template_src) {
        json_t *ct = json_object_get(cfg, "chat_template");
        const char *src = NULL;
        if (!ct || json_is_null(ct)) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: no \"chat_template\" field", name);
            goto done;
        }
        if (json_is_string(ct)) {
            src = json_string_value(ct);
        } else if (json_is_array(ct)) {
            const char *dflt = NULL, *tool = NULL;
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) {
                json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
                if (!json_is_string(nm) || !json_is_string(tp)) {
                    rc = df_err(err, errlen, DF_EFORMAT, "%s: chat_template[%zu] must be {\"name\": string, \"template\": string}", name, i);
                    goto done;
                }
                if (!strcmp(json_string_value(nm), "default")) dflt = json_string_value(tp);
                if (!strcmp(json_string_value(nm), "tool_use")) tool = json_string_value(tp);
            }
            src = (want_tools && tool) ? tool : dflt;
            if (!src) {
                rc = df_err(err, errlen, DF_EFORMAT, "%s: chat_template has several templates and none is named \"default\"", name);
                goto done;
            }
        } else {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: \"chat_template\" must be a string or a list of {name, template}", name);
            goto done;
        }
        *template_src = df_xstrdup(src);
    }
    if (special_tokens_json) *special_tokens_json = json_dumps(sp, JSON_COMPACT | JSON_PRESERVE_ORDER);
done:
    json_decref(sp);
    json_decref(cfg);
    if (rc && template_src && *template_src) {
        free(*template_src);
        *template_src = NULL;
    }
    return rc;
}

/* Applies transformers' reasoning aliasing to one message (a new ref):
 * every key kept, null ones as null. */
static json_t *normalize_message(json_t *m) {
    json_t *o = json_object();
    /* reasoning under any of its names (first non-null wins) */
    static const char *const rk[] = {"reasoning_content", "thinking", "reasoning", NULL};
    json_t *reasoning = NULL;
    for (int i = 0; rk[i] && !reasoning; i++) {
        json_t *v = json_object_get(m, rk[i]);
        if (v && !json_is_null(v)) reasoning = v;
    }
    if (reasoning) json_object_set(o, "thinking", reasoning);
    /* JSON null stays None (issue 14): {"content": null, "tool_calls": [...]}
     * must reach the template as content None, as the renderer transformers
     * uses gives it when handed the message unchanged */
    for (void *it = json_object_iter(m); it; it = json_object_iter_next(m, it)) {
        json_t *v = json_object_iter_value(it);
        json_object_setn(o, json_object_iter_key(it), json_object_iter_key_len(it), v);
    }
    if (reasoning) json_object_set(o, "reasoning_content", reasoning);
    return o;
}

int df_chat_context_build(const char *messages_json, const char *tools_json, int add_generation_prompt,
                          const char *special_tokens_json, const char *extra_vars_json, char **context_json,
                          char *err, size_t errlen) {
    *context_json = NULL;
    json_error_t je;
    json_t *msgs = json_loads(messages_json ? messages_json : "", JSON_ALLOW_NUL, &je);
    if (!msgs) return df_err(err, errlen, DF_EINPUT, "messages: invalid JSON: %s (line %d)", je.text, je.line);
    if (json_is_object(msgs) && json_is_array(json_object_get(msgs, "messages"))) {
        json_t *inner = json_incref(json_object_get(msgs, "messages"));
        json_decref(msgs);
        msgs = inner;
    }
    if (!json_is_array(msgs)) {
        json_decref(msgs);
        return df_err(err, errlen, DF_EINPUT, "messages: expected a JSON array of message objects");
    }
    if (json_array_size(msgs) == 0) {
        json_decref(msgs);
        return df_err(err, errlen, DF_EINPUT, "messages: cannot apply a chat template to an empty conversation");
    }
    json_t *ctx = json_object();
    int rc = 0;
    if (special_tokens_json) {
        json_t *sp = json_loads(special_tokens_json, JSON_ALLOW_NUL, &je);
        if (!json_is_object(sp)) {
            json_decref(sp);
            rc = df_err(err, errlen, DF_EINPUT, "special tokens: expected a JSON object");
            goto done;
        }
        json_object_update(ctx, sp);
        json_decref(sp);
    }
    json_t *norm = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) {
            json_decref(norm);
            rc = df_err(err, errlen, DF_EINPUT, "messages[%zu]: expected an object", i);
            goto done;
        }
        json_array_append_new(norm, normalize_message(m));
    }
    json_object_set_new(ctx, "messages", norm);
    if (tools_json) {
        json_t *tools = json_loads(tools_json, JSON_ALLOW_NUL, &je);
        if (!tools) {
            rc = df_err(err, errlen, DF_EINPUT, "tools: invalid JSON: %s (line %d)", je.text, je.line);
            goto done;
        }
        if (!json_is_array(tools) && !json_is_null(tools)) {
            json_decref(tools);
            rc = df_err(err, errlen, DF_EINPUT, "tools: expected a JSON array of tool schemas");
            goto done;
        }
        json_object_set_new(ctx, "tools", tools);
    } else {
        json_object_set_new(ctx, "tools", json_null());
    }
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (extra_vars_json) {
        json_t *ex = json_loads(extra_vars_json, JSON_ALLOW_NUL, &je);
        if (!json_is_object(ex)) {
            json_decref(ex);
            rc = df_err(err, errlen, DF_EINPUT, "extra variables: expected a JSON object");
            goto done;
        }
        json_object_update(ctx, ex);
        json_decref(ex);
    }
    *context_json = json_dumps(ctx, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!*context_json) rc = df_err(err, errlen, DF_ENOMEM, "out of memory building the chat context");
done:
    json_decref(ctx);
    json_decref(msgs);
    return rc;
}
