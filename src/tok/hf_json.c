/* hf_json.c - loads a Hugging Face tokenizer.json (BPE model) into a
 * df_tokenizer.
 *
 * Invariants: every field we do not implement exactly is rejected with
 * DF_EUNSUPPORTED naming it (never silently ignored when it would change
 * ids); a broken file gets DF_EFORMAT naming the file and field. Byte-level
 * vocabularies are stored as raw bytes (the GPT-2 byte-to-unicode alphabet is
 * undone at load), so BPE runs on bytes. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "deltafin.h"
#include "tok/tok_internal.h"
#include "tok/unicode.h"
#include "util/util.h"

/* GPT-2 bytes_to_unicode: byte -> code point, and its inverse (-1 if none). */
static uint32_t b2u[256];
static int32_t u2b[512];

void df_tok_bytelevel_tables(void);
void df_tok_bytelevel_tables(void) {
    int n = 0;
    for (int i = 0; i < 512; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        b2u[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        u2b[b2u[b]] = b;
    }
}

/* Undoes the byte-level alphabet of s into out (room for strlen(s) bytes).
 * Returns the byte count, or -1 if some character is not in the alphabet. */
long df_tok_bytelevel_decode(const char *s, size_t n, uint8_t *out);
long df_tok_bytelevel_decode(const char *s, size_t n, uint8_t *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = df_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (!l || cp >= 512 || u2b[cp] < 0) return -1;
        out[o++] = (uint8_t)u2b[cp];
        i += (size_t)l;
    }
    return (long)o;
}

static int bad(char *err, size_t errlen, const char *file, const char *field, const char *what) {
    return df_err(err, errlen, DF_EFORMAT, "%s: %s: %s", file, field, what);
}

static int get_bool(json_t *o, const char *k, int def) {
    json_t *v = json_object_get(o, k);
    return v && json_is_boolean(v) ? json_is_true(v) : def;
}

static int add_norm(df_tokenizer *t, json_t *n, const char *file, char *err, size_t errlen) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return bad(err, errlen, file, "normalizer.type", "expected a string");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr)) return bad(err, errlen, file, "normalizer.normalizers", "expected an array");
        size_t i;
        json_t *x;
        json_array_foreach(arr, i, x) {
            int rc = add_norm(t, x, file, err, errlen);
            if (rc) return rc;
        }
        return 0;
    }
    if (t->n_norm >= DF_TOK_MAX_STEPS)
        return df_err(err, errlen, DF_EFORMAT, "%s: normalizer: more than %d steps (at most %d are accepted)", file, DF_TOK_MAX_STEPS, DF_TOK_MAX_STEPS);
    df_norm_step st = {0};
    if (!strcmp(type, "NFC")) {
        st.kind = DF_NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        const char *p = json_string_value(json_object_get(n, "prepend"));
        if (!p) return bad(err, errlen, file, "normalizer.prepend", "expected a string");
        if (strlen(p) > DF_TOK_MAX_NORM_STR)
            return df_err(err, errlen, DF_EFORMAT, "%s: normalizer step %d (Prepend): prepend is %zu bytes, at most %d are accepted", file, t->n_norm + 1,
                          strlen(p), DF_TOK_MAX_NORM_STR);
        st.kind = DF_NORM_PREPEND;
        st.a = df_xstrdup(p);
        st.alen = strlen(p);
    } else if (!strcmp(type, "Replace")) {
        const char *p = json_string_value(json_object_get(json_object_get(n, "pattern"), "String"));
        const char *c = json_string_value(json_object_get(n, "content"));
        if (!p || !c || !*p)
            return df_err(err, errlen, DF_EUNSUPPORTED, "%s: normalizer Replace: only a non-empty String pattern is supported", file);
        if (strlen(p) > DF_TOK_MAX_NORM_STR || strlen(c) > DF_TOK_MAX_NORM_STR)
            return df_err(err, errlen, DF_EFORMAT, "%s: normalizer step %d (Replace): %s is %zu bytes, at most %d are accepted", file, t->n_norm + 1,
                          strlen(p) > DF_TOK_MAX_NORM_STR ? "pattern.String" : "content", strlen(p) > DF_TOK_MAX_NORM_STR ? strlen(p) : strlen(c),
                          DF_TOK_MAX_NORM_STR);
        st.kind = DF_NORM_REPLACE;
        st.a = df_xstrdup(p);
        st.alen = strlen(p);
        st.b = df_xstrdup(c);
        st.blen = strlen(c);
    } else {
        return df_err(err, errlen, DF_EUNSUPPORTED, "%s: normalizer type \"%s\" is not supported (NFC, Prepend, Replace, Sequence are)", file, type);
    }
    t->norm = df_xrealloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *t->norm);
    t->norm[t->n_norm++] = st;
    return 0;
}

int df_tok_add_pretok_regex(df_tokenizer *t, const char *pattern, int behavior, int invert, char *err, size_t errlen) {
    df_pretok_step st = {0};
    if (t->n_steps >= DF_TOK_MAX_STEPS)
        return df_err(err, errlen, DF_EFORMAT, "%s: pre_tokenizer: more than %d steps (at most %d are accepted)", t->path, DF_TOK_MAX_STEPS, DF_TOK_MAX_STEPS);
    st.re = df_pretok_compile(pattern, err, errlen);
    if (!st.re) return DF_EUNSUPPORTED;
    st.fast = invert ? DF_FAST_NONE : df_pretok_fast_id(pattern);
    st.behavior = behavior;
    st.invert = invert;
    t->steps = df_xrealloc(t->steps, (size_t)(t->n_steps + 1) * sizeof *t->steps);
    t->steps[t->n_steps++] = st;
    return 0;
}

static int add_pretok(df_tokenizer *t, json_t *p, const char *file, int *byte_level, char *err, size_t errlen) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return bad(err, errlen, file, "pre_tokenizer.type", "expected a string");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr)) return bad(err, errlen, file, "pre_tokenizer.pretokenizers", "expected an array");
        size_t i;
        json_t *x;
        json_array_foreach(arr, i, x) {
            int rc = add_pretok(t, x, file, byte_level, err, errlen);
            if (rc) return rc;
        }
        return 0;
    }
    /* every step is a level of recursion per piece when encoding: bounded (ByteLevel may add two) */
    if (t->n_steps + 2 > DF_TOK_MAX_STEPS)
        return df_err(err, errlen, DF_EFORMAT, "%s: pre_tokenizer: more than %d steps (at most %d are accepted)", file, DF_TOK_MAX_STEPS - 2, DF_TOK_MAX_STEPS - 2);
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        int b;
        if (!beh) return bad(err, errlen, file, "pre_tokenizer.Split.behavior", "expected a string");
        if (!strcmp(beh, "Isolated")) b = DF_SPLIT_ISOLATED;
        else if (!strcmp(beh, "Removed")) b = DF_SPLIT_REMOVED;
        else if (!strcmp(beh, "MergedWithPrevious")) b = DF_SPLIT_MERGED_PREV;
        else if (!strcmp(beh, "MergedWithNext")) b = DF_SPLIT_MERGED_NEXT;
        else if (!strcmp(beh, "Contiguous")) b = DF_SPLIT_CONTIGUOUS;
        else return df_err(err, errlen, DF_EUNSUPPORTED, "%s: pre_tokenizer.Split.behavior \"%s\" is not supported", file, beh);
        int inv = get_bool(p, "invert", 0);
        if (re) return df_tok_add_pretok_regex(t, re, b, inv, err, errlen);
        if (!lit) return bad(err, errlen, file, "pre_tokenizer.Split.pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
        if (!*lit) return df_err(err, errlen, DF_EUNSUPPORTED, "%s: pre_tokenizer.Split: empty String pattern", file);
        df_pretok_step st = {0};
        st.literal = df_xstrdup(lit);
        st.literal_len = strlen(lit);
        st.behavior = b;
        st.invert = inv;
        t->steps = df_xrealloc(t->steps, (size_t)(t->n_steps + 1) * sizeof *t->steps);
        t->steps[t->n_steps++] = st;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        *byte_level = 1;
        int aps = get_bool(p, "add_prefix_space", 1), ur = get_bool(p, "use_regex", 1);
        if (aps) { /* a step that only adds the prefix space */
            df_pretok_step st = {0};
            st.prefix_space = 1;
            t->steps = df_xrealloc(t->steps, (size_t)(t->n_steps + 1) * sizeof *t->steps);
            t->steps[t->n_steps++] = st;
        }
        if (ur) return df_tok_add_pretok_regex(t, df_gpt2_pattern, DF_SPLIT_ISOLATED, 0, err, errlen);
        return 0;
    }
    return df_err(err, errlen, DF_EUNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported (Split, ByteLevel, Sequence are)", file, type);
}

static int set_decoder(df_tokenizer *t, json_t *d, const char *file, int *byte_level, char *err, size_t errlen) {
    if (!d || json_is_null(d)) return 0;
    const char *type = json_string_value(json_object_get(d, "type"));
    if (!type) return bad(err, errlen, file, "decoder.type", "expected a string");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(d, "decoders");
        size_t i;
        json_t *x;
        if (!json_is_array(arr)) return bad(err, errlen, file, "decoder.decoders", "expected an array");
        json_array_foreach(arr, i, x) {
            int rc = set_decoder(t, x, file, byte_level, err, errlen);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) { *byte_level = 1; return 0; }
    if (!strcmp(type, "ByteFallback")) { t->bytefb_decode = 1; return 0; }
    if (!strcmp(type, "Fuse")) return 0;
    if (!strcmp(type, "Replace") || !strcmp(type, "Metaspace")) { t->metaspace_decode = 1; return 0; }
    if (!strcmp(type, "Strip")) { t->metaspace_decode |= 2; return 0; }
    return df_err(err, errlen, DF_EUNSUPPORTED, "%s: decoder type \"%s\" is not supported", file, type);
}

int df_tok_load_hf_json(df_tokenizer *t, const char *file, char *err, size_t errlen) {
    df_tok_bytelevel_tables();
    free(t->path); /* messages name the file */
    t->path = df_xstrdup(file);
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root) return df_err(err, errlen, DF_EFORMAT, "%s:%d:%d: invalid JSON: %s", file, je.line, je.column, je.text);
    int rc = 0;
    uint8_t *tmp = NULL;
    if (!json_is_object(root)) { rc = bad(err, errlen, file, "(root)", "expected an object"); goto out; }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) { rc = bad(err, errlen, file, "model", "expected an object"); goto out; }
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE")) {
        rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: model.type \"%s\" is not supported (only BPE)", file, mtype);
        goto out;
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0) {
        rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: model.dropout is set (random BPE dropout is not supported)", file);
        goto out;
    }
    const char *csp = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *eows = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((csp && *csp) || (eows && *eows)) {
        rc = df_err(err, errlen, DF_EUNSUPPORTED, "%s: model.continuing_subword_prefix / end_of_word_suffix are not supported", file);
        goto out;
    }
    int byte_level = 0;
    if ((rc = add_norm(t, json_object_get(root, "normalizer"), file, err, errlen))) goto out;
    if ((rc = add_pretok(t, json_object_get(root, "pre_tokenizer"), file, &byte_level, err, errlen))) goto out;
    if ((rc = set_decoder(t, json_object_get(root, "decoder"), file, &byte_level, err, errlen))) goto out;
    df_bpe *b = &t->bpe;
    b->byte_level = byte_level;
    b->byte_fallback = get_bool(model, "byte_fallback", 0);
    b->whole_word_first = get_bool(model, "ignore_merges", 0);

    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) { rc = bad(err, errlen, file, "model.vocab", "expected an object"); goto out; }
    const char *key;
    json_t *val;
    size_t tcap = 256;
    tmp = df_xmalloc(tcap);
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= DF_TOK_MAX_ID) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: model.vocab[\"%.64s\"]: expected an id in [0, %d), got %s%lld", file, key, DF_TOK_MAX_ID,
                        json_is_integer(val) ? "" : "a non-integer", json_is_integer(val) ? (long long)json_integer_value(val) : 0LL);
            goto out;
        }
        size_t kl = strlen(key);
        if (kl + 1 > tcap) { tcap = kl * 2 + 1; tmp = df_xrealloc(tmp, tcap); }
        long bl = byte_level ? df_tok_bytelevel_decode(key, kl, tmp) : -1;
        if (bl >= 0) df_bpe_set_token(b, (int32_t)json_integer_value(val), tmp, (size_t)bl);
        else df_bpe_set_token(b, (int32_t)json_integer_value(val), (const uint8_t *)key, kl);
    }
    df_bpe_index(b);
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) b->unk_id = df_tok_token_id(t, unk);
    if (b->byte_fallback) {
        for (int c = 0; c < 256; c++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", c);
            b->byte_fb_id[c] = df_bpe_lookup(b, (const uint8_t *)name, 6);
        }
    }
    json_t *merges = json_object_get(model, "merges");
    if (merges && !json_is_array(merges)) { rc = bad(err, errlen, file, "model.merges", "expected an array"); goto out; }
    size_t mi;
    json_t *m;
    json_array_foreach(merges, mi, m) {
        const char *a = NULL, *c = NULL;
        size_t al = 0, cl = 0;
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp) { rc = df_err(err, errlen, DF_EFORMAT, "%s: model.merges[%zu]: expected \"a b\", got \"%s\"", file, mi, s); goto out; }
            a = s; al = (size_t)(sp - s); c = sp + 1; cl = strlen(c);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)); al = strlen(a);
            c = json_string_value(json_array_get(m, 1)); cl = strlen(c);
        } else {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", file, mi);
            goto out;
        }
        if (al + cl + 1 > tcap) { tcap = (al + cl) * 2 + 1; tmp = df_xrealloc(tmp, tcap); }
        int32_t ida, idc, idn;
        long la = byte_level ? df_tok_bytelevel_decode(a, al, tmp) : -1;
        if (la < 0) { memcpy(tmp, a, al); la = (long)al; }
        ida = df_bpe_lookup(b, tmp, (size_t)la);
        long lc = byte_level ? df_tok_bytelevel_decode(c, cl, tmp + la) : -1;
        if (lc < 0) { memcpy(tmp + la, c, cl); lc = (long)cl; }
        idc = df_bpe_lookup(b, tmp + la, (size_t)lc);
        idn = df_bpe_lookup(b, tmp, (size_t)(la + lc));
        if (ida < 0 || idc < 0 || idn < 0) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: model.merges[%zu]: \"%.*s\" + \"%.*s\": %s is not in model.vocab", file, mi,
                        (int)al, a, (int)cl, c, ida < 0 ? "the left part" : idc < 0 ? "the right part" : "the merged token");
            goto out;
        }
        df_pairmap_put(&b->merges, ida, idc, (uint32_t)mi, idn);
    }
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added)) { rc = bad(err, errlen, file, "added_tokens", "expected an array"); goto out; }
    size_t ai;
    json_t *at;
    json_array_foreach(added, ai, at) {
        json_t *id = json_object_get(at, "id");
        const char *content = json_string_value(json_object_get(at, "content"));
        if (!json_is_integer(id) || !content) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: added_tokens[%zu]: expected {\"id\": integer >= 0, \"content\": string}", file, ai);
            goto out;
        }
        if (json_integer_value(id) < 0 || json_integer_value(id) >= DF_TOK_MAX_ID) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: added_tokens[%zu].id: expected an id in [0, %d), got %lld", file, ai, DF_TOK_MAX_ID,
                        (long long)json_integer_value(id));
            goto out;
        }
        if (strlen(content) > DF_TOK_MAX_ADDED_LEN) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: added_tokens[%zu].content: %zu bytes, at most %d are accepted", file, ai, strlen(content),
                        DF_TOK_MAX_ADDED_LEN);
            goto out;
        }
        df_added a = {0};
        a.id = (int32_t)json_integer_value(id);
        a.content = df_xstrdup(content);
        a.len = strlen(content);
        a.special = (uint8_t)get_bool(at, "special", 0);
        a.lstrip = (uint8_t)get_bool(at, "lstrip", 0);
        a.rstrip = (uint8_t)get_bool(at, "rstrip", 0);
        a.single_word = (uint8_t)get_bool(at, "single_word", 0);
        a.normalized = (uint8_t)get_bool(at, "normalized", !a.special);
        t->added = df_xrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
        t->added[t->n_added++] = a;
    }
out:
    free(tmp);
    json_decref(root);
    return rc;
}
