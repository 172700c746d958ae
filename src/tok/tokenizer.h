/* tokenizer.h - the native tokenizer: Hugging Face tokenizer.json (BPE) and
 * tiktoken rank files, byte-identical to the `tokenizers` and `tiktoken`
 * Python packages.
 *
 * A df_tokenizer is immutable once loaded; every function taking a const
 * df_tokenizer * may run on many threads at once. Encoding is
 *   added tokens (leftmost-longest, before anything else)
 *   -> normalizer (NFC, ...) -> normalized added tokens
 *   -> pre-tokenizer (Split regexes / known-pattern scanners, ByteLevel)
 *   -> BPE per pre-token.
 * Decoding returns exact bytes (invalid UTF-8 round-trips through byte-level
 * tokens). All functions returning int give 0 or a negative DF_E* code. */
#ifndef DF_TOK_TOKENIZER_H
#define DF_TOK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct df_tokenizer df_tokenizer;

/* path: a model directory (tokenizer.json, or tiktoken.model + tokenizer_config.json,
 * Kimi-style), a tokenizer.json file, a *.tiktoken file with a same-stem *.json
 * ({"pat_str": ..., "special_tokens": {...}}), or a *.gguf file (its embedded
 * tokenizer, see df_tok_load_gguf). NULL + err on failure. */
df_tokenizer *df_tok_load(const char *path, char *err, size_t errlen);
void df_tok_free(df_tokenizer *t);

/* tokenizer.json tokenizers always match added tokens (as HF does); tiktoken
 * ones only with DF_TOK_ALLOW_SPECIAL (else like tiktoken's encode_ordinary). */
enum { DF_TOK_ALLOW_SPECIAL = 1 };

/* Encodes text[0..len) (any bytes). n_threads: 0 = all cores, 1 = serial; the
 * result never depends on it. No BOS is added. *ids is malloc'd. */
int df_tok_encode(const df_tokenizer *t, const char *text, size_t len, int flags, int n_threads,
                  int32_t **ids, size_t *n);
/* Same, with a message on failure: DF_EINPUT when the tokenizer's
 * normalizers or pre-tokenizers would grow a piece of the text past
 * max(64 KiB, 16 x its length) (a hostile tokenizer.json; docs/TOKENIZER.md).
 * On failure *ids is NULL and *n 0. */
int df_tok_encode_err(const df_tokenizer *t, const char *text, size_t len, int flags, int n_threads,
                      int32_t **ids, size_t *n, char *err, size_t errlen);
/* Bytes of ids, like HF decode(skip_special_tokens=False) but without lossy
 * UTF-8 replacement. *out is malloc'd and NUL-terminated (len excludes it).
 * An id with no token is DF_EINPUT. */
int df_tok_decode(const df_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len);
/* Same, into a caller's message buffer on error. */
int df_tok_decode_err(const df_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len,
                      char *err, size_t errlen);

int df_tok_vocab_size(const df_tokenizer *t); /* max id + 1, counting added tokens */
/* Id of an exact token string ("<|im_end|>", or a vocab entry as tokenizer.json
 * spells it, e.g. "Ġthe"); -1 if none. */
int32_t df_tok_token_id(const df_tokenizer *t, const char *token_text);
/* Bytes of one id (NULL if none): what decode gives for it alone. */
const char *df_tok_token_bytes(const df_tokenizer *t, int32_t id, size_t *len);
/* 1 if id is a special added token. */
int df_tok_is_special(const df_tokenizer *t, int32_t id);
/* 1 for a Kimi tokenizer (a directory with tiktoken.model): encoding cuts the
 * text as tokenization_kimi.py does (400,000-character slices, runs of at most
 * 25,000 whitespace or non-whitespace characters; each piece encoded alone),
 * and its encode() matches special tokens by default (allow_special_tokens). */
int df_tok_is_kimi(const df_tokenizer *t);

/* From tokenizer_config.json (or chat_template.jinja): the chat template
 * (a string, or the "default" entry of a list) and bos/eos tokens (a string or
 * {"content": ...}); NULL if none. */
const char *df_tok_chat_template(const df_tokenizer *t);
/* The template named "tool_use" (tokenizer_config.json's list of templates,
 * or GGUF tokenizer.chat_template.tool_use), for requests with tools; NULL
 * when there is none (the default one serves them too). */
const char *df_tok_chat_template_tools(const df_tokenizer *t);
const char *df_tok_bos_token(const df_tokenizer *t);
const char *df_tok_eos_token(const df_tokenizer *t);

/* Streaming detokenizer: push ids one at a time; the returned bytes (valid
 * until the next call) never end inside a UTF-8 character. Bytes that cannot
 * start or continue a character are passed through at once. flush returns
 * what is held back. The concatenation of all outputs equals df_tok_decode. */
typedef struct df_tok_stream df_tok_stream;
df_tok_stream *df_tok_stream_new(const df_tokenizer *t);
void df_tok_stream_free(df_tok_stream *s);
const char *df_tok_stream_push(df_tok_stream *s, int32_t id, size_t *n);
const char *df_tok_stream_flush(df_tok_stream *s, size_t *n);

/* ---- building from arrays (GGUF-embedded tokenizers) ---------------------
 * kind DF_TOK_ARRAYS_GPT2: byte-level BPE; tokens are spelled in the GPT-2
 * byte-to-unicode alphabet, merges are "a b" strings, pre is a llama.cpp
 * pre-tokenizer name ("gpt2", "llama-bpe", "qwen2", "deepseek-v3", ...) or a
 * regex. kind DF_TOK_ARRAYS_SPM: SentencePiece-style BPE; tokens are plain
 * UTF-8 with U+2581 for spaces, scores order merges (higher first), <0xXX>
 * tokens give byte fallback. types (may be NULL) follow GGUF: 1 normal,
 * 2 unknown, 3 control, 4 user-defined, 6 byte; control and user-defined
 * tokens become added tokens (control ones special). */
enum { DF_TOK_ARRAYS_GPT2 = 1, DF_TOK_ARRAYS_SPM = 2 };
typedef struct {
    int kind;
    size_t n_tokens;
    const char *const *tokens;
    const int32_t *types;
    const float *scores;
    size_t n_merges;
    const char *const *merges;
    const char *pre;
    const char *chat_template, *bos, *eos;
    const char *chat_template_tools; /* or NULL */
    /* SPM only: 0 (default) splits nothing and spells spaces as U+2581, adding
     * one U+2581 at the very start of the text unless it starts with a space
     * (transformers' Metaspace, prepend_scheme "first"); 1 prepends U+2581 to
     * every piece between added tokens instead (its phi3 variant). */
    int spm_prepend;
    /* ids (bos, eos, unk, pad) that are special added tokens whatever their type */
    const int32_t *special_ids;
    size_t n_special_ids;
} df_tok_arrays;
df_tokenizer *df_tok_from_arrays(const df_tok_arrays *a, char *err, size_t errlen);

/* The tokenizer embedded in an open GGUF file's metadata (tokenizer.ggml.*),
 * as transformers' AutoTokenizer.from_pretrained(..., gguf_file=...) builds
 * it: model "gpt2" (byte-level BPE, the pre-tokenizer named by
 * tokenizer.ggml.pre) or "llama" (SentencePiece-style BPE from scores), plus
 * tokenizer.chat_template and the bos/eos tokens. name is used in messages
 * (NULL: the file's path). *add_bos (may be NULL) is tokenizer.ggml.add_bos_token,
 * or, when absent, 1 for "llama" vocabularies and 0 otherwise. NULL + err on
 * failure, including a file with no tokenizer.ggml.model. df_tok_load accepts
 * a *.gguf path too. */
struct df_gguf;
df_tokenizer *df_tok_load_gguf(const struct df_gguf *g, const char *name, int *add_bos, char *err, size_t errlen);

#endif
