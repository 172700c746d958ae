/* tok_internal.h - structures shared by the files of the tokenizer module
 * (never included outside src/tok). One df_tokenizer is immutable after
 * loading and may be used by many threads at once; every per-call scratch
 * (BPE word cache, piece vectors) lives in a df_tok_worker owned by one
 * thread. */
#ifndef DF_TOK_INTERNAL_H
#define DF_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/tokenizer.h"

/* ---- pre-tokenizer ------------------------------------------------------ */

/* Hand-written scanners for known split patterns (checked against PCRE2 by
 * tests/unit/test_tok.c). DF_FAST_NONE means "use PCRE2". */
enum {
    DF_FAST_NONE = 0,
    DF_FAST_CL100K,     /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|... (cl100k, Llama 3) */
    DF_FAST_QWEN2,      /* same with \p{N} (Qwen2/3) */
    DF_FAST_O200K,      /* o200k_base, (?i:...) contractions */
    DF_FAST_O200K_ASCII,/* o200k_base with contractions spelled out ('s|'S|...), ASCII case only */
    DF_FAST_KIMI,       /* Kimi K2 (o200k-like, Han runs first, letters exclude Han) */
    DF_FAST_DS_DIGITS,  /* DeepSeek V3 stage 1: \p{N}{1,3} */
    DF_FAST_DS_CJK,     /* DeepSeek V3 stage 2: [一-龥぀-ゟ゠-ヿ]+ */
    DF_FAST_DS_MAIN,    /* DeepSeek V3 stage 3 */
    DF_FAST_GPT2,       /* the ByteLevel pre-tokenizer's own regex */
    DF_FAST_COUNT
};

/* Split behaviours of HF's Split pre-tokenizer. */
enum { DF_SPLIT_ISOLATED, DF_SPLIT_REMOVED, DF_SPLIT_MERGED_PREV, DF_SPLIT_MERGED_NEXT, DF_SPLIT_CONTIGUOUS };

typedef struct {
    int fast;               /* DF_FAST_* or DF_FAST_NONE */
    pcre2_code *re;         /* compiled translated pattern (always set for regex steps) */
    char *literal;          /* Split with a String pattern (re == NULL) */
    size_t literal_len;
    int behavior, invert;
    int prefix_space;       /* ByteLevel add_prefix_space: prepend ' ' to pieces not starting with one */
} df_pretok_step;

/* Returns the DF_FAST_* id of a pattern string (as written in tokenizer.json
 * or tiktoken's pat_str), or DF_FAST_NONE. */
int df_pretok_fast_id(const char *pattern);
/* Compiles pattern (Oniguruma / Rust-regex syntax as used by HF and tiktoken)
 * into PCRE2 with UTF, UCP, MATCH_INVALID_UTF and JIT. Translates \s and \S to
 * White_Space, and class intersection [A&&[^B]] to (?:(?![B])[A]). */
pcre2_code *df_pretok_compile(const char *pattern, char *err, size_t errlen);
/* The translation df_pretok_compile applies (malloc'd), for tests. */
char *df_pretok_translate(const char *pattern);
/* Finds the leftmost match at or after pos in s[0..n): returns 1 and sets
 * [*ms, *me), or 0; -1 when PCRE2 gives up (its match, depth or heap limit,
 * a hostile pattern). fast != NONE uses the scanner (never -1), else re. md is
 * a match data block for re (may be NULL when fast is used). */
int df_pretok_find(int fast, const pcre2_code *re, pcre2_match_data *md, const uint8_t *s, size_t n,
                   size_t pos, size_t *ms, size_t *me);
/* Builds the character class tables (idempotent, thread-safe). */
void df_pretok_init(void);

/* ---- BPE ---------------------------------------------------------------- */

/* One slot: key and value side by side, so a probe touches one cache line. */
typedef struct { uint64_t key, val; } df_pairslot; /* key (a << 32 | b) + 1, 0 = empty; val rank << 32 | new id */
typedef struct {
    df_pairslot *slots;
    size_t cap;      /* power of two */
    size_t n;
} df_pairmap;

typedef struct {
    uint32_t *slots; /* id + 1, 0 = empty; keyed by token bytes */
    size_t cap;
} df_bytesmap;

typedef struct df_bpe {
    int32_t n_ids;          /* ids 0..n_ids-1 may have bytes */
    uint8_t *blob;          /* token bytes, concatenated */
    size_t blob_len, blob_cap;
    uint64_t *tok;          /* per id: offset << 24 | length (length < 2^24); UINT64_MAX = no token */
    df_bytesmap vocab;      /* token bytes -> id (model tokens only) */
    df_pairmap merges;      /* (left id, right id) -> (rank, merged id) */
    int32_t byte_id[256];   /* byte-level: id of each single byte, -1 if none */
    int byte_level;         /* symbols are bytes; else UTF-8 characters looked up in vocab */
    int whole_word_first;   /* tiktoken / ignore_merges: a piece that is a token is that token */
    int byte_fallback;      /* char mode: unknown chars become <0xXX> tokens */
    int32_t byte_fb_id[256];
    int32_t unk_id;         /* -1 none */
} df_bpe;

void df_bpe_init(df_bpe *b);
void df_bpe_free(df_bpe *b);
/* Sets the bytes of token id (grows the tables). */
void df_bpe_set_token(df_bpe *b, int32_t id, const uint8_t *bytes, size_t len);
/* Builds b->vocab from the tokens set so far (last id wins on duplicates, as a JSON map can't
 * have them; tiktoken files are checked by the caller). */
void df_bpe_index(df_bpe *b);
int32_t df_bpe_lookup(const df_bpe *b, const uint8_t *s, size_t n);
/* Adds a merge; a later duplicate of the same pair overrides (HF collects into a map). */
void df_pairmap_put(df_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
/* tiktoken: every token of 2+ bytes that splits into two tokens gives pair -> (its rank, it). */
void df_bpe_pairs_from_ranks(df_bpe *b);
static inline const uint8_t *df_bpe_bytes(const df_bpe *b, int32_t id, size_t *len) {
    if (id < 0 || id >= b->n_ids || b->tok[id] == UINT64_MAX) { *len = 0; return NULL; }
    *len = (size_t)(b->tok[id] & 0xFFFFFF);
    return b->blob + (b->tok[id] >> 24);
}

/* A growable id vector. */
typedef struct { int32_t *v; size_t n, cap; } df_ids;
static inline void df_ids_push(df_ids *x, int32_t id);

/* Per-thread scratch for encoding. */
typedef struct df_bpe_cache df_bpe_cache;
df_bpe_cache *df_bpe_cache_new(void);
void df_bpe_cache_free(df_bpe_cache *c);
/* Appends the ids of one pre-token (bytes) to out. */
void df_bpe_encode_word(const df_bpe *b, df_bpe_cache *c, const uint8_t *s, size_t n, df_ids *out);

void df_ids_grow(df_ids *x, size_t more);
static inline void df_ids_push(df_ids *x, int32_t id) {
    if (x->n == x->cap) df_ids_grow(x, 1);
    x->v[x->n++] = id;
}

/* ---- added tokens ------------------------------------------------------- */

typedef struct {
    char *content;      /* as matched (normalized content for normalized tokens) */
    size_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} df_added;

/* A byte trie for leftmost-longest matching (trie.c). When its longest token
 * is over DF_TRIE_WALK_MAX bytes, df_tok_trie_finish also builds an
 * Aho-Corasick automaton over the reversed tokens so that a scan stays linear
 * in the text (a plain walk per position costs up to the token length). */
#define DF_TRIE_WALK_MAX 64
typedef struct {
    struct df_trie_node *nodes;
    size_t n, cap;
    size_t max_len;                /* bytes of the longest token */
    uint8_t first[256];
    struct df_trie_node *rev;      /* reversed tokens (only when max_len > DF_TRIE_WALK_MAX) */
    size_t rn;
    int32_t *rfail;                /* failure link per reversed state */
    uint32_t *rlong;               /* length of the longest terminal on its failure chain */
} df_trie;
/* per-text scan state: with the automaton, the longest token's length at each position */
typedef struct { uint32_t *mlen; } df_trie_scan;
void df_tok_trie_add(df_trie *tr, const uint8_t *s, size_t n, int32_t term);
void df_tok_trie_finish(df_trie *tr); /* after the last add */
void df_tok_trie_free(df_trie *tr);
void df_tok_trie_scan_begin(const df_trie *tr, const uint8_t *s, size_t n, df_trie_scan *sc);
void df_tok_trie_scan_end(df_trie_scan *sc);
/* the longest token starting at s[p] (p < n): its length and *term, or 0 */
size_t df_tok_trie_longest(const df_trie *tr, const df_trie_scan *sc, const uint8_t *s, size_t n, size_t p, int32_t *term);

/* ---- the tokenizer ------------------------------------------------------ */

enum { DF_NORM_NFC = 1, DF_NORM_PREPEND, DF_NORM_REPLACE };
typedef struct { int kind; char *a; size_t alen; char *b; size_t blen; } df_norm_step;

/* ---- limits on what a tokenizer file may ask for (hostile files) ---------
 * Normalizers and pre-tokenizers may grow the text (Replace "a" -> "aaaa",
 * Prepend, ByteLevel's prefix space, Metaspace). For one piece of input text
 * of n bytes (the text between two raw added tokens), every normalizer
 * stage's output and the total bytes the pre-tokenizer hands to BPE are
 * capped at df_tok_out_cap(n) = max(64 KiB, 16 * n); the cap is checked
 * before the output grows past it, and encoding then fails with DF_EINPUT
 * naming the step. Real tokenizers grow text by 3x at most (NFC, U+2581). */
#define DF_TOK_OUT_FLOOR ((size_t)64 << 10)
#define DF_TOK_OUT_FACTOR 16u
static inline size_t df_tok_out_cap(size_t n) {
    if (n > SIZE_MAX / DF_TOK_OUT_FACTOR) return SIZE_MAX;
    return n * DF_TOK_OUT_FACTOR > DF_TOK_OUT_FLOOR ? n * DF_TOK_OUT_FACTOR : DF_TOK_OUT_FLOOR;
}
#define DF_TOK_MAX_STEPS 64          /* normalizer steps, and pre-tokenizer steps (after Sequences are flattened) */
#define DF_TOK_MAX_NORM_STR 1024     /* bytes of a Replace pattern / content or a Prepend string */
#define DF_TOK_MAX_ID (1 << 22)      /* token ids are < 4,194,304 (real vocabularies: <= ~262k) */
#define DF_TOK_MAX_ADDED_LEN 65536   /* bytes of one added token's content */

struct df_tokenizer {
    char *path;
    int is_tiktoken;
    int kimi_slicing;             /* Kimi tiktoken.model: tokenization_kimi.py's 400k / 25k cuts, specials by default */
    df_bpe bpe;
    /* normalizer */
    df_norm_step *norm; int n_norm;
    /* pre-tokenizer */
    df_pretok_step *steps; int n_steps;
    /* added tokens */
    df_added *added; int n_added;
    df_trie trie_raw, trie_norm;  /* non-normalized (matched first) / normalized tokens */
    int has_trie_raw, has_trie_norm;
    int split_ok;                 /* parallel split at "\n" + ASCII graphic is proven safe */
    int split_raw_ok;             /* ... even before raw added tokens are matched (none has lstrip
                                   * or a '\n' before its last byte), so each thread matches its own */
    int split_need_prev_graphic;  /* ... and the byte before the '\n' must be ASCII graphic too */
    int split_no_slash;           /* ... and the byte after it must not be '/' (o200k's [\r\n/]*) */
    /* decoding */
    uint64_t *dec;                /* per id: offset << 24 | len into dec_blob, UINT64_MAX none */
    uint8_t *dec_blob;
    int32_t n_ids;
    int bytefb_decode, metaspace_decode; /* char-mode decoders: <0xXX> -> byte, U+2581 -> ' ' */
    int metaspace_first;          /* SPM pre-tokenizer: ' ' -> U+2581, one U+2581 prepended at text start */
    /* config */
    char *chat_template, *bos, *eos;
    char *chat_template_tools; /* the "tool_use" template when the config names one, else NULL */
};

/* Describes normalizer step i for messages ("Replace \"a\" -> \"b\"", quoted and shortened). */
void df_tok_norm_describe(const df_tokenizer *t, int i, char *out, size_t outlen);

/* Runs the normalizers over s[0..n): *out is malloc'd, or NULL when they leave
 * s unchanged (*outlen is set either way). DF_EINPUT naming the step when a
 * stage's output would pass df_tok_out_cap(n). */
int df_tok_normalize(const df_tokenizer *t, const uint8_t *s, size_t n, uint8_t **out, size_t *outlen, char *err, size_t errlen);

/* Loaders (tokenizer.c dispatches by path). All return 0 or DF_E*. */
int df_tok_load_hf_json(df_tokenizer *t, const char *file, char *err, size_t errlen);
int df_tok_load_tiktoken(df_tokenizer *t, const char *file, const char *pat, char *err, size_t errlen);
/* Finishes a loaded tokenizer: tries, decode table, split safety. */
int df_tok_finish(df_tokenizer *t, char *err, size_t errlen);
int df_tok_add_pretok_regex(df_tokenizer *t, const char *pattern, int behavior, int invert, char *err, size_t errlen);

extern const char df_kimi_pattern[];
extern const char df_gpt2_pattern[];

#endif
