/* load.c - df_tok_load (path dispatch), tokenizer_config.json, the Kimi
 * tiktoken.model convention, df_tok_from_arrays, and the finishing pass that
 * every loader ends with (decode table, added-token tries, split safety).
 *
 * Invariants: on success the tokenizer is complete and immutable; on failure
 * everything is freed and err names the file and field. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "deltafin.h"
#include "tok/tok_internal.h"
#include "tok/unicode.h"
#include "util/util.h"

long df_tok_bytelevel_decode(const char *s, size_t n, uint8_t *out);
void df_tok_bytelevel_tables(void);
df_tokenizer *df_tok_load_gguf_file(const char *path, char *err, size_t errlen);

static const char *str_or_content(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* Reads chat_template / bos / eos from tokenizer_config.json in dir (absent: fine). */
static int load_config(df_tokenizer *t, const char *dir, json_t **cfg_out, char *err, size_t errlen) {
    char *p = df_path_join(dir, "tokenizer_config.json");
    int rc = 0;
    if (df_file_exists(p)) {
        json_error_t je;
        json_t *c = json_load_file(p, 0, &je);
        if (!c || !json_is_object(c)) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s:%d:%d: invalid JSON: %s", p, je.line, je.column, c ? "expected an object" : je.text);
            json_decref(c);
            free(p);
            return rc;
        }
        json_t *ct = json_object_get(c, "chat_template");
        if (json_is_string(ct)) t->chat_template = df_xstrdup(json_string_value(ct));
        else if (json_is_array(ct)) {
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) {
                const char *name = json_string_value(json_object_get(e, "name"));
                const char *tpl = json_string_value(json_object_get(e, "template"));
                if (name && tpl && !strcmp(name, "default") && !t->chat_template) t->chat_template = df_xstrdup(tpl);
                if (name && tpl && !strcmp(name, "tool_use") && !t->chat_template_tools) t->chat_template_tools = df_xstrdup(tpl);
            }
        }
        const char *b = str_or_content(json_object_get(c, "bos_token"));
        const char *e = str_or_content(json_object_get(c, "eos_token"));
        if (b) t->bos = df_xstrdup(b);
        if (e) t->eos = df_xstrdup(e);
        if (cfg_out) *cfg_out = c;
        else json_decref(c);
    }
    free(p);
    if (!t->chat_template) {
        char *j = df_path_join(dir, "chat_template.jinja");
        char *data;
        size_t len;
        if (df_file_exists(j) && df_read_file(j, &data, &len, NULL, 0) == 0) t->chat_template = data;
        free(j);
    }
    return rc;
}

static char *dir_of(const char *path) {
    const char *sl = strrchr(path, '/');
    if (!sl) return df_xstrdup(".");
    if (sl == path) return df_xstrdup("/");
    char *d = df_xstrdup(path);
    d[sl - path] = 0;
    return d;
}

static void add_special(df_tokenizer *t, const char *content, int32_t id) {
    df_added a = {0};
    a.content = df_xstrdup(content);
    a.len = strlen(content);
    a.id = id;
    a.special = 1;
    t->added = df_xrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    t->added[t->n_added++] = a;
}

/* *.tiktoken with a same-stem .json ({"pat_str", "special_tokens"}). */
static int load_tiktoken_file(df_tokenizer *t, const char *file, char *err, size_t errlen) {
    size_t fl = strlen(file);
    const char *dot = strrchr(file, '.');
    size_t stem = dot && !strchr(dot, '/') ? (size_t)(dot - file) : fl;
    char *js = df_xmalloc(stem + 6);
    memcpy(js, file, stem);
    strcpy(js + stem, ".json");
    json_error_t je;
    json_t *c = json_load_file(js, 0, &je);
    int rc = 0;
    if (!c) {
        rc = df_file_exists(js) ? df_err(err, errlen, DF_EFORMAT, "%s:%d:%d: invalid JSON: %s", js, je.line, je.column, je.text)
                                : df_err(err, errlen, DF_EINPUT, "%s: missing (a .tiktoken file needs a same-stem .json with pat_str and special_tokens)", js);
        free(js);
        return rc;
    }
    const char *pat = json_string_value(json_object_get(c, "pat_str"));
    json_t *sp = json_object_get(c, "special_tokens");
    if (!pat) { rc = df_err(err, errlen, DF_EFORMAT, "%s: pat_str: expected a string", js); goto out; }
    if (sp && !json_is_object(sp)) { rc = df_err(err, errlen, DF_EFORMAT, "%s: special_tokens: expected an object", js); goto out; }
    if ((rc = df_tok_load_tiktoken(t, file, pat, err, errlen))) goto out;
    const char *k;
    json_t *v;
    json_object_foreach(sp, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= DF_TOK_MAX_ID) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: special_tokens[\"%.64s\"]: expected an id in [0, %d)", js, k, DF_TOK_MAX_ID);
            goto out;
        }
        add_special(t, k, (int32_t)json_integer_value(v));
    }
out:
    json_decref(c);
    free(js);
    return rc;
}

/* Kimi: tiktoken.model + tokenizer_config.json; the pattern is built in and the
 * 256 special ids after the ranks are named by added_tokens_decoder or
 * <|reserved_token_ID|>, as tokenization_kimi.py does. */
static int load_kimi(df_tokenizer *t, const char *dir, char *err, size_t errlen) {
    char *file = df_path_join(dir, "tiktoken.model");
    int rc = df_tok_load_tiktoken(t, file, df_kimi_pattern, err, errlen);
    free(file);
    if (rc) return rc;
    t->kimi_slicing = 1;
    json_t *cfg = NULL;
    if ((rc = load_config(t, dir, &cfg, err, errlen))) return rc;
    json_t *dec = json_object_get(cfg, "added_tokens_decoder");
    int32_t base = t->bpe.n_ids;
    for (int32_t i = base; i < base + 256; i++) {
        char key[16], name[48];
        snprintf(key, sizeof key, "%d", (int)i);
        const char *c = json_string_value(json_object_get(json_object_get(dec, key), "content"));
        if (!c) { snprintf(name, sizeof name, "<|reserved_token_%d|>", (int)i); c = name; }
        add_special(t, c, i);
    }
    json_decref(cfg);
    return 0;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static df_tokenizer *tok_new(const char *path) {
    df_tokenizer *t = df_xcalloc(1, sizeof *t);
    t->path = df_xstrdup(path ? path : "(arrays)");
    df_bpe_init(&t->bpe);
    df_pretok_init();
    df_tok_bytelevel_tables();
    return t;
}

df_tokenizer *df_tok_load(const char *path, char *err, size_t errlen) {
    if (!path || !*path) { df_err(err, errlen, DF_EINPUT, "no tokenizer path given"); return NULL; }
    df_tokenizer *t = tok_new(path);
    int rc = 0;
    if (df_is_dir(path)) {
        char *tj = df_path_join(path, "tokenizer.json"), *tm = df_path_join(path, "tiktoken.model");
        if (df_file_exists(tj)) {
            if (!(rc = df_tok_load_hf_json(t, tj, err, errlen))) rc = load_config(t, path, NULL, err, errlen);
        } else if (df_file_exists(tm)) {
            t->is_tiktoken = 1;
            rc = load_kimi(t, path, err, errlen);
        } else {
            /* a directory holding exactly one *.tiktoken */
            DIR *d = opendir(path);
            char *found = NULL;
            int count = 0;
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (has_suffix(e->d_name, ".tiktoken")) {
                    count++;
                    free(found);
                    found = df_path_join(path, e->d_name);
                }
            }
            if (d) closedir(d);
            if (count == 1) {
                t->is_tiktoken = 1;
                rc = load_tiktoken_file(t, found, err, errlen);
            } else {
                rc = df_err(err, errlen, DF_EINPUT, "%s: no tokenizer.json, tiktoken.model or single *.tiktoken in this directory", path);
            }
            free(found);
        }
        free(tj);
        free(tm);
    } else if (!df_file_exists(path)) {
        rc = df_err(err, errlen, DF_EINPUT, "%s: no such file or directory", path);
    } else if (has_suffix(path, ".gguf") || has_suffix(path, ".GGUF")) {
        df_tok_free(t);
        return df_tok_load_gguf_file(path, err, errlen);
    } else if (has_suffix(path, ".tiktoken")) {
        t->is_tiktoken = 1;
        rc = load_tiktoken_file(t, path, err, errlen);
    } else if (has_suffix(path, "tiktoken.model")) {
        char *d = dir_of(path);
        t->is_tiktoken = 1;
        rc = load_kimi(t, d, err, errlen);
        free(d);
    } else {
        char *d = dir_of(path);
        if (!(rc = df_tok_load_hf_json(t, path, err, errlen))) rc = load_config(t, d, NULL, err, errlen);
        free(d);
    }
    if (!rc) rc = df_tok_finish(t, err, errlen);
    if (rc) { df_tok_free(t); return NULL; }
    return t;
}

void df_tok_free(df_tokenizer *t) {
    if (!t) return;
    free(t->path);
    df_bpe_free(&t->bpe);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); }
    free(t->norm);
    for (int i = 0; i < t->n_steps; i++) { pcre2_code_free(t->steps[i].re); free(t->steps[i].literal); }
    free(t->steps);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    df_tok_trie_free(&t->trie_raw);
    df_tok_trie_free(&t->trie_norm);
    free(t->dec);
    free(t->dec_blob);
    free(t->chat_template);
    free(t->chat_template_tools);
    free(t->bos);
    free(t->eos);
    free(t);
}

/* Normalizes an added token's content with the tokenizer's normalizers (NFC,
 * Prepend, Replace), as HF does before matching normalized tokens: a malloc'd
 * NUL-terminated string, or NULL with err when a normalizer grows it past the cap. */
static char *norm_content(const df_tokenizer *t, const char *s, size_t n, size_t *outlen, char *err, size_t errlen) {
    uint8_t *o = NULL;
    size_t ol = n;
    if (df_tok_normalize(t, (const uint8_t *)s, n, &o, &ol, err, errlen)) return NULL;
    char *r = df_xmalloc(ol + 1);
    memcpy(r, o ? (const char *)o : s, ol);
    r[ol] = 0;
    free(o);
    *outlen = ol;
    return r;
}

int df_tok_finish(df_tokenizer *t, char *err, size_t errlen) {
    df_bpe *b = &t->bpe;
    int32_t n = b->n_ids;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id + 1 > n) n = t->added[i].id + 1;
    t->n_ids = n;
    /* decode table */
    df_buf blob = {0};
    t->dec = df_xmalloc((size_t)(n ? n : 1) * sizeof *t->dec);
    for (int32_t id = 0; id < n; id++) {
        t->dec[id] = UINT64_MAX;
        size_t l;
        const uint8_t *p = df_bpe_bytes(b, id, &l);
        if (!p) continue;
        size_t off = blob.len;
        if (!b->byte_level && (t->bytefb_decode || t->metaspace_decode)) {
            unsigned v;
            if (t->bytefb_decode && l == 6 && !memcmp(p, "<0x", 3) && p[5] == '>' && sscanf((const char *)p + 3, "%2X", &v) == 1) {
                uint8_t c = (uint8_t)v;
                df_buf_put(&blob, &c, 1);
            } else {
                for (size_t i = 0; i < l;) {
                    if ((t->metaspace_decode & 1) && i + 3 <= l && !memcmp(p + i, "\xe2\x96\x81", 3)) { df_buf_put(&blob, " ", 1); i += 3; }
                    else { df_buf_put(&blob, p + i, 1); i++; }
                }
            }
        } else {
            df_buf_put(&blob, p, l);
        }
        t->dec[id] = ((uint64_t)off << 24) | (uint64_t)(blob.len - off);
    }
    for (int i = 0; i < t->n_added; i++) {
        const df_added *a = &t->added[i];
        size_t off = blob.len;
        df_buf_put(&blob, a->content, a->len);
        t->dec[a->id] = ((uint64_t)off << 24) | (uint64_t)a->len;
    }
    t->dec_blob = (uint8_t *)blob.p;
    /* tries: raw (non-normalized) tokens, and normalized ones by their normalized content */
    int split_ok = 1, raw_cut_ok = 1;
    for (int i = 0; i < t->n_added; i++) {
        df_added *a = &t->added[i];
        if (!a->len) continue;
        if (!a->normalized || t->is_tiktoken) {
            df_tok_trie_add(&t->trie_raw, (const uint8_t *)a->content, a->len, i);
            t->has_trie_raw = 1;
            const char *q = memchr(a->content, '\n', a->len);
            if (a->lstrip || (q && (size_t)(q - a->content) + 1 < a->len)) raw_cut_ok = 0;
        } else {
            size_t nl = 0;
            char err2[400];
            char *nc = norm_content(t, a->content, a->len, &nl, err2, sizeof err2);
            if (!nc) return df_err(err, errlen, DF_EFORMAT, "added token %d (id %d): %s", i, (int)a->id, err2);
            if (nl) {
                df_tok_trie_add(&t->trie_norm, (const uint8_t *)nc, nl, i);
                t->has_trie_norm = 1;
                const char *q = memchr(nc, '\n', nl);
                if (a->lstrip || (q && (size_t)(q - nc) + 1 < nl)) split_ok = 0;
            }
            free(nc);
        }
    }
    df_tok_trie_finish(&t->trie_raw);
    df_tok_trie_finish(&t->trie_norm);
    /* parallel split safety (see tokenizer.c) */
    if (!t->n_steps) split_ok = 0;
    for (int i = 0; i < t->n_steps; i++) {
        const df_pretok_step *st = &t->steps[i];
        if (st->prefix_space || !st->fast || st->behavior != DF_SPLIT_ISOLATED || st->invert) split_ok = 0;
        if (st->fast == DF_FAST_GPT2) t->split_need_prev_graphic = 1;
        if (st->fast == DF_FAST_O200K || st->fast == DF_FAST_O200K_ASCII) t->split_no_slash = 1;
    }
    for (int i = 0; i < t->n_norm; i++)
        if (t->norm[i].kind != DF_NORM_NFC) split_ok = 0;
    t->split_ok = split_ok;
    t->split_raw_ok = split_ok && raw_cut_ok;
    return 0;
}

/* ---- from arrays (GGUF) ------------------------------------------------- */

static const struct { const char *name; const char *pats[3]; } pre_names[] = {
    {"gpt2", {NULL}},
    {"llama-bpe", {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"qwen2", {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"deepseek-v3", {"\\p{N}{1,3}", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
                     "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-4o", {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"kimi-k2", {df_kimi_pattern}},
};

/* Is pre a pre-tokenizer name (lowercase letters, digits, '-', '_', '.') rather than a regex? */
static int is_pre_name(const char *pre) {
    if (!*pre) return 0;
    for (const char *p = pre; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.')) return 0;
    return 1;
}

static void add_added(df_tokenizer *t, const char *s, int32_t id, int special) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) { t->added[i].special |= (uint8_t)special; return; }
    df_added ad = {0};
    ad.content = df_xstrdup(s);
    ad.len = strlen(s);
    ad.id = id;
    ad.special = (uint8_t)special;
    t->added = df_xrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    t->added[t->n_added++] = ad;
}

/* One candidate merge of transformers' generate_merges. */
typedef struct { int32_t l, r, id; float score; uint32_t ll, lr; uint32_t seq; } spm_merge;

static int spm_merge_cmp(const void *pa, const void *pb) {
    const spm_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1; /* higher score first */
    if (a->ll != b->ll) return a->ll > b->ll ? -1 : 1;             /* then longer left piece */
    if (a->lr != b->lr) return a->lr > b->lr ? -1 : 1;             /* then longer right piece */
    return a->seq < b->seq ? -1 : a->seq > b->seq;                 /* stable */
}
static int spm_local_cmp(const void *pa, const void *pb) {
    const spm_merge *a = pa, *b = pb;
    if (a->l != b->l) return a->l < b->l ? -1 : 1;
    return a->r < b->r ? -1 : a->r > b->r;
}

/* SentencePiece merges recovered from the vocabulary exactly as transformers'
 * generate_merges orders them: every split (at character boundaries) of every
 * distinct token (first-occurrence order, last occurrence's score) into two
 * tokens; within a token by (left id, right id); then stably by score,
 * left length and right length in characters, all descending. Rank = position. */
static void spm_merges(df_bpe *b, const df_tok_arrays *a) {
    size_t cap = 1024, n = 0, lcap = 64;
    spm_merge *m = df_xmalloc(cap * sizeof *m), *loc = df_xmalloc(lcap * sizeof *loc);
    uint8_t *seen = df_xcalloc((size_t)b->n_ids + 1, 1);
    uint32_t *cpos = df_xmalloc(64 * sizeof *cpos);
    size_t ccap = 64;
    for (size_t i = 0; i < a->n_tokens; i++) {
        const uint8_t *s = (const uint8_t *)a->tokens[i];
        size_t l = strlen(a->tokens[i]);
        int32_t id = df_bpe_lookup(b, s, l);
        if (id < 0 || seen[id]) continue;
        seen[id] = 1;
        /* character boundaries */
        size_t nc = 0;
        for (size_t p = 0; p < l;) {
            if (nc + 1 >= ccap) { ccap *= 2; cpos = df_xrealloc(cpos, ccap * sizeof *cpos); }
            cpos[nc++] = (uint32_t)p;
            uint32_t cp;
            int k = df_utf8_decode(s + p, l - p, &cp);
            p += k > 0 ? (size_t)k : 1;
        }
        cpos[nc] = (uint32_t)l;
        size_t nl = 0;
        for (size_t k = 1; k < nc; k++) {
            int32_t x = df_bpe_lookup(b, s, cpos[k]), y;
            if (x < 0 || (y = df_bpe_lookup(b, s + cpos[k], l - cpos[k])) < 0) continue;
            if (nl == lcap) { lcap *= 2; loc = df_xrealloc(loc, lcap * sizeof *loc); }
            loc[nl++] = (spm_merge){x, y, id, a->scores[id], (uint32_t)k, (uint32_t)(nc - k), 0};
        }
        qsort(loc, nl, sizeof *loc, spm_local_cmp);
        for (size_t k = 0; k < nl; k++) {
            if (n == cap) { cap *= 2; m = df_xrealloc(m, cap * sizeof *m); }
            m[n] = loc[k];
            m[n].seq = (uint32_t)n;
            n++;
        }
    }
    qsort(m, n, sizeof *m, spm_merge_cmp);
    for (size_t k = 0; k < n; k++) df_pairmap_put(&b->merges, m[k].l, m[k].r, (uint32_t)k, m[k].id);
    free(m);
    free(loc);
    free(seen);
    free(cpos);
}

df_tokenizer *df_tok_from_arrays(const df_tok_arrays *a, char *err, size_t errlen) {
    df_tokenizer *t = tok_new(NULL);
    df_bpe *b = &t->bpe;
    int rc = 0;
    uint8_t *tmp = NULL;
    if (!a || !a->tokens || (a->kind != DF_TOK_ARRAYS_GPT2 && a->kind != DF_TOK_ARRAYS_SPM)) {
        rc = df_err(err, errlen, DF_EINPUT, "tokenizer arrays: kind must be GPT2 or SPM, with tokens");
        goto out;
    }
    if (a->n_tokens >= DF_TOK_MAX_ID) { rc = df_err(err, errlen, DF_EINPUT, "tokenizer arrays: %zu tokens, at most %d are accepted", a->n_tokens, DF_TOK_MAX_ID); goto out; }
    if (a->kind == DF_TOK_ARRAYS_SPM && !a->scores) { rc = df_err(err, errlen, DF_EINPUT, "tokenizer arrays: SPM needs scores"); goto out; }
    b->byte_level = a->kind == DF_TOK_ARRAYS_GPT2;
    size_t tcap = 256;
    tmp = df_xmalloc(tcap);
    /* every token is a vocabulary entry (as in transformers' BPE model); byte-level
     * tokens spelled outside the byte alphabet stand for their UTF-8 bytes */
    for (size_t i = 0; i < a->n_tokens; i++) {
        const char *s = a->tokens[i];
        if (!s) { rc = df_err(err, errlen, DF_EFORMAT, "tokenizer arrays: token %zu is NULL", i); goto out; }
        size_t l = strlen(s);
        if (l >= (1u << 24)) { rc = df_err(err, errlen, DF_EFORMAT, "tokenizer arrays: token %zu is too long", i); goto out; }
        if (l + 1 > tcap) { tcap = l * 2 + 1; tmp = df_xrealloc(tmp, tcap); }
        long bl = b->byte_level ? df_tok_bytelevel_decode(s, l, tmp) : -1;
        int in_alphabet = bl >= 0;
        if (in_alphabet) df_bpe_set_token(b, (int32_t)i, tmp, (size_t)bl);
        else df_bpe_set_token(b, (int32_t)i, (const uint8_t *)s, l);
        int type = a->types ? a->types[i] : 1;
        /* control -> special added token, user-defined -> plain added token; in a
         * byte-level vocabulary only those spelled in the byte alphabet (transformers
         * skips the others as llama.cpp mislabels) */
        if ((type == 3 || type == 4) && l && (!b->byte_level || in_alphabet)) add_added(t, s, (int32_t)i, type == 3);
    }
    for (size_t k = 0; k < a->n_special_ids; k++) {
        int32_t id = a->special_ids ? a->special_ids[k] : -1;
        if (id >= 0 && (size_t)id < a->n_tokens && a->tokens[id][0]) add_added(t, a->tokens[id], id, 1);
    }
    df_bpe_index(b);
    if (a->kind == DF_TOK_ARRAYS_GPT2) {
        for (size_t i = 0; i < a->n_merges; i++) {
            const char *m = a->merges[i], *sp = m ? strchr(m, ' ') : NULL;
            if (!sp) { rc = df_err(err, errlen, DF_EFORMAT, "tokenizer arrays: merge %zu: expected \"a b\"", i); goto out; }
            size_t ml = strlen(m);
            if (ml + 1 > tcap) { tcap = ml * 2 + 1; tmp = df_xrealloc(tmp, tcap); }
            long la = df_tok_bytelevel_decode(m, (size_t)(sp - m), tmp);
            long lc = la >= 0 ? df_tok_bytelevel_decode(sp + 1, strlen(sp + 1), tmp + la) : -1;
            int32_t x = la >= 0 ? df_bpe_lookup(b, tmp, (size_t)la) : -1;
            int32_t y = lc >= 0 ? df_bpe_lookup(b, tmp + la, (size_t)lc) : -1;
            int32_t z = lc >= 0 ? df_bpe_lookup(b, tmp, (size_t)(la + lc)) : -1;
            if (x < 0 || y < 0 || z < 0) { rc = df_err(err, errlen, DF_EFORMAT, "tokenizer arrays: merge %zu \"%s\": part not in the vocabulary", i, m); goto out; }
            df_pairmap_put(&b->merges, x, y, (uint32_t)i, z);
        }
        /* the pre-tokenizer: a known name's pattern; an unknown name gets the
         * GPT-2 ByteLevel regex (what transformers falls back to); anything else
         * is a regex */
        const char *pre = a->pre ? a->pre : "gpt2";
        int found = 0;
        for (size_t k = 0; k < sizeof pre_names / sizeof pre_names[0] && !found; k++) {
            if (strcmp(pre, pre_names[k].name)) continue;
            found = 1;
            if (!pre_names[k].pats[0]) rc = df_tok_add_pretok_regex(t, df_gpt2_pattern, DF_SPLIT_ISOLATED, 0, err, errlen);
            for (int q = 0; q < 3 && pre_names[k].pats[q] && !rc; q++)
                rc = df_tok_add_pretok_regex(t, pre_names[k].pats[q], DF_SPLIT_ISOLATED, 0, err, errlen);
        }
        if (!found)
            rc = df_tok_add_pretok_regex(t, is_pre_name(pre) ? df_gpt2_pattern : pre, DF_SPLIT_ISOLATED, 0, err, errlen);
        if (rc) goto out;
    } else {
        spm_merges(b, a);
        int all = 1;
        for (int c = 0; c < 256; c++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", c);
            b->byte_fb_id[c] = df_bpe_lookup(b, (const uint8_t *)name, 6);
            if (b->byte_fb_id[c] < 0) all = 0;
        }
        b->byte_fallback = all;
        for (size_t i = 0; i < a->n_tokens; i++)
            if (a->types && a->types[i] == 2) { b->unk_id = (int32_t)i; break; }
        if (a->spm_prepend) {
            df_norm_step p = {DF_NORM_PREPEND, df_xstrdup("\xe2\x96\x81"), 3, NULL, 0};
            df_norm_step q = {DF_NORM_REPLACE, df_xstrdup(" "), 1, df_xstrdup("\xe2\x96\x81"), 3};
            t->norm = df_xmalloc(2 * sizeof *t->norm);
            t->norm[0] = p;
            t->norm[1] = q;
            t->n_norm = 2;
        } else {
            t->metaspace_first = 1;
        }
        t->bytefb_decode = 1;
        t->metaspace_decode = 3;
        /* SPM models see each piece between added tokens as one word (no split) */
    }
    if (a->chat_template) t->chat_template = df_xstrdup(a->chat_template);
    if (a->chat_template_tools) t->chat_template_tools = df_xstrdup(a->chat_template_tools);
    if (a->bos) t->bos = df_xstrdup(a->bos);
    if (a->eos) t->eos = df_xstrdup(a->eos);
    rc = df_tok_finish(t, err, errlen);
out:
    free(tmp);
    if (rc) { df_tok_free(t); return NULL; }
    return t;
}
