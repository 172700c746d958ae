/* gguf_vocab.c - the tokenizer embedded in a GGUF file's metadata
 * (tokenizer.ggml.*), built through df_tok_from_arrays.
 *
 * The reference is transformers' GGUF conversion (AutoTokenizer.from_pretrained(
 * dir, gguf_file=...)): tokenizer.ggml.model "gpt2" is byte-level BPE with the
 * file's merges, "llama" is SentencePiece-style BPE with merges recovered
 * from the scores; control tokens (type 3) become special added tokens,
 * user-defined ones (type 4) plain added tokens; bos/eos/unk/pad ids name
 * special tokens too. Architecture phi3 takes the Prepend-normalizer variant
 * of SentencePiece (as transformers does); Gemma vocabularies (respelled
 * space tokens, file-order merges) are refused.
 *
 * Invariants: nothing here keeps pointers into the df_gguf after returning;
 * on failure everything is freed and err names the file and key. */
#include <stdlib.h>
#include <string.h>

#include "deltafin.h"
#include "format/gguf.h"
#include "tok/tok_internal.h"
#include "util/util.h"

df_tokenizer *df_tok_load_gguf(const struct df_gguf *g, const char *name, int *add_bos, char *err, size_t errlen) {
    const char *kind = NULL, *pre = NULL, *tpl = NULL, *tpl_tools = NULL, *arch = NULL;
    const char *path = name ? name : df_gguf_path(g, 0);
    char gerr[512];
    int r = df_gguf_get_str(g, "tokenizer.ggml.model", &kind, gerr, sizeof gerr);
    if (r == 0) { df_err(err, errlen, DF_EINPUT, "%s: no embedded tokenizer (tokenizer.ggml.model is absent)", path); return NULL; }
    if (r < 0) { df_err(err, errlen, DF_EFORMAT, "%s", gerr); return NULL; }
    if (df_gguf_get_str(g, "tokenizer.ggml.pre", &pre, gerr, sizeof gerr) < 0 ||
        df_gguf_get_str(g, "tokenizer.chat_template", &tpl, gerr, sizeof gerr) < 0 ||
        df_gguf_get_str(g, "tokenizer.chat_template.tool_use", &tpl_tools, gerr, sizeof gerr) < 0 ||
        df_gguf_get_str(g, "general.architecture", &arch, gerr, sizeof gerr) < 0) {
        df_err(err, errlen, DF_EFORMAT, "%s", gerr);
        return NULL;
    }
    int spm = !strcmp(kind, "llama");
    if (strcmp(kind, "gpt2") && !spm) {
        df_err(err, errlen, DF_EUNSUPPORTED, "%s: tokenizer.ggml.model \"%s\" is not supported (supported: gpt2, llama)", path, kind);
        return NULL;
    }
    if (spm && arch && !strncmp(arch, "gemma", 5)) {
        df_err(err, errlen, DF_EUNSUPPORTED, "%s: the SentencePiece vocabulary of architecture \"%s\" is not supported", path, arch);
        return NULL;
    }
    const df_gguf_str *toks = NULL, *merges = NULL;
    uint64_t nt = 0, nm = 0, ntypes = 0, nscores = 0;
    int32_t *types = NULL;
    float *scores = NULL;
    const char **tp = NULL, **mp = NULL;
    df_tokenizer *t = NULL;
    if (df_gguf_get_arr_str(g, "tokenizer.ggml.tokens", &toks, &nt, gerr, sizeof gerr) != 1) {
        df_err(err, errlen, DF_EFORMAT, "%s: tokenizer.ggml.tokens: missing or not a string array", path);
        return NULL;
    }
    if (nt >= (1u << 30)) {
        df_err(err, errlen, DF_EFORMAT, "%s: tokenizer.ggml.tokens: %llu tokens is too many", path, (unsigned long long)nt);
        return NULL;
    }
    if (df_gguf_get_arr_str(g, "tokenizer.ggml.merges", &merges, &nm, gerr, sizeof gerr) < 0 ||
        df_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", &types, &ntypes, gerr, sizeof gerr) < 0 ||
        df_gguf_get_arr_f32(g, "tokenizer.ggml.scores", &scores, &nscores, gerr, sizeof gerr) < 0) {
        df_err(err, errlen, DF_EFORMAT, "%s", gerr);
        goto out;
    }
    if ((types && ntypes != nt) || (scores && nscores != nt)) {
        df_err(err, errlen, DF_EFORMAT, "%s: tokenizer.ggml.token_type/scores have %llu/%llu entries for %llu tokens", path,
               (unsigned long long)ntypes, (unsigned long long)nscores, (unsigned long long)nt);
        goto out;
    }
    tp = df_xmalloc((nt ? nt : 1) * sizeof *tp);
    mp = df_xmalloc((nm ? nm : 1) * sizeof *mp);
    for (uint64_t i = 0; i < nt; i++) {
        if (strlen(toks[i].s) != toks[i].len) {
            df_err(err, errlen, DF_EFORMAT, "%s: tokenizer.ggml.tokens[%llu]: contains a NUL byte", path, (unsigned long long)i);
            goto out;
        }
        tp[i] = toks[i].s;
    }
    for (uint64_t i = 0; i < nm; i++) mp[i] = merges[i].s;
    /* bos/eos/unk/pad: special tokens, as transformers' special-token map makes them */
    static const char *const sp_keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
    int64_t sp_ids[4] = {-1, -1, -1, -1};
    for (int k = 0; k < 4; k++) {
        if (df_gguf_get_i64(g, sp_keys[k], &sp_ids[k], gerr, sizeof gerr) < 0) { df_err(err, errlen, DF_EFORMAT, "%s", gerr); goto out; }
        if (sp_ids[k] >= (int64_t)nt) sp_ids[k] = -1; /* out of range: ignored, as an absent key */
    }
    int32_t special_ids[4];
    size_t n_special = 0;
    for (int k = 0; k < 4; k++)
        if (sp_ids[k] >= 0) special_ids[n_special++] = (int32_t)sp_ids[k];
    df_tok_arrays a = {
        .kind = spm ? DF_TOK_ARRAYS_SPM : DF_TOK_ARRAYS_GPT2,
        .n_tokens = nt, .tokens = tp, .types = types, .scores = scores, .n_merges = nm, .merges = nm ? mp : NULL, .pre = pre,
        .chat_template = tpl, .chat_template_tools = tpl_tools, .bos = sp_ids[0] >= 0 ? tp[sp_ids[0]] : NULL, .eos = sp_ids[1] >= 0 ? tp[sp_ids[1]] : NULL,
        .spm_prepend = spm && arch && !strcmp(arch, "phi3"),
        .special_ids = special_ids, .n_special_ids = n_special,
    };
    char terr[512];
    t = df_tok_from_arrays(&a, terr, sizeof terr);
    if (!t) { df_err(err, errlen, DF_EFORMAT, "%s: embedded tokenizer: %s", path, terr); goto out; }
    if (add_bos) {
        int ab = 0;
        r = df_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &ab, gerr, sizeof gerr);
        /* absent: llama.cpp and transformers add BOS for SentencePiece vocabularies */
        *add_bos = r == 1 ? ab : spm;
    }
out:
    free(tp);
    free(mp);
    free(types);
    free(scores);
    return t;
}

/* Opens path as a GGUF file and loads its tokenizer (df_tok_load's .gguf case). */
df_tokenizer *df_tok_load_gguf_file(const char *path, char *err, size_t errlen);
df_tokenizer *df_tok_load_gguf_file(const char *path, char *err, size_t errlen) {
    df_gguf *g = NULL;
    if (df_gguf_open(path, &g, err, errlen)) return NULL;
    df_tokenizer *t = df_tok_load_gguf(g, path, NULL, err, errlen);
    df_gguf_close(g);
    return t;
}
