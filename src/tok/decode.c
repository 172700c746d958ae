/* decode.c - decoding ids to bytes, the token / vocabulary accessors and the
 * streaming detokenizer.
 *
 * Invariants: decoding concatenates each id's stored bytes (out-of-range ids
 * are an error naming the index); the stream holds back a trailing proper
 * prefix of a UTF-8 character until a later id completes it or flush.
 */
#include <stdlib.h>
#include <string.h>

#include "deltafin.h"
#include "tok/tok_internal.h"
#include "util/util.h"

long df_tok_bytelevel_decode(const char *s, size_t n, uint8_t *out);

/* ---- decoding ----------------------------------------------------------- */

const char *df_tok_token_bytes(const df_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->dec[id] == UINT64_MAX) { *len = 0; return NULL; }
    *len = (size_t)(t->dec[id] & 0xFFFFFF);
    return (const char *)t->dec_blob + (t->dec[id] >> 24);
}

int df_tok_decode_err(const df_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len, char *err, size_t errlen) {
    df_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = df_tok_token_bytes(t, ids[i], &l);
        if (!p) {
            df_buf_free(&b);
            return df_err(err, errlen, DF_EINPUT, "token id %d at index %zu is out of range (vocab size %d)", (int)ids[i], i,
                          df_tok_vocab_size(t));
        }
        df_buf_put(&b, p, l);
    }
    df_buf_put(&b, "", 1);
    b.len--;
    if ((t->metaspace_decode & 2) && b.len && b.p[0] == ' ') { memmove(b.p, b.p + 1, b.len); b.len--; }
    *out = b.p;
    *len = b.len;
    return DF_OK;
}

int df_tok_decode(const df_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len) {
    return df_tok_decode_err(t, ids, n, out, len, NULL, 0);
}

int df_tok_vocab_size(const df_tokenizer *t) { return t->n_ids; }

int df_tok_is_special(const df_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) return t->added[i].special;
    return 0;
}

int32_t df_tok_token_id(const df_tokenizer *t, const char *tok) {
    size_t n = strlen(tok);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, tok, n)) return t->added[i].id;
    if (t->is_tiktoken) {
        int32_t id = df_bpe_lookup(&t->bpe, (const uint8_t *)tok, n);
        if (id >= 0) return id;
    }
    if (t->bpe.byte_level) {
        uint8_t stackb[256];
        uint8_t *b = n <= sizeof stackb ? stackb : df_xmalloc(n);
        long l = df_tok_bytelevel_decode(tok, n, b);
        int32_t id = l >= 0 ? df_bpe_lookup(&t->bpe, b, (size_t)l) : -1;
        if (b != stackb) free(b);
        if (id >= 0 || t->is_tiktoken) return id;
    }
    return df_bpe_lookup(&t->bpe, (const uint8_t *)tok, n);
}

const char *df_tok_chat_template(const df_tokenizer *t) { return t->chat_template; }
const char *df_tok_chat_template_tools(const df_tokenizer *t) { return t->chat_template_tools; }
const char *df_tok_bos_token(const df_tokenizer *t) { return t->bos; }
const char *df_tok_eos_token(const df_tokenizer *t) { return t->eos; }

/* ---- streaming ---------------------------------------------------------- */

struct df_tok_stream {
    const df_tokenizer *t;
    uint8_t *buf;      /* held bytes, then the output */
    size_t held, cap;
    int started;       /* for the Strip decoder: only the very first space is stripped */
    uint8_t *out;      /* what the last push returned */
    size_t outcap;
};

df_tok_stream *df_tok_stream_new(const df_tokenizer *t) {
    df_tok_stream *s = df_xcalloc(1, sizeof *s);
    s->t = t;
    return s;
}

void df_tok_stream_free(df_tok_stream *s) {
    if (!s) return;
    free(s->buf);
    free(s->out);
    free(s);
}

/* Length of the trailing bytes of b[0..n) that form a proper prefix of a
 * well-formed UTF-8 character (0 if none). */
static size_t incomplete_tail(const uint8_t *b, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        uint8_t c = b[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
        if (need <= k) return 0; /* ASCII, invalid lead, or already complete */
        /* check the continuation bytes present are valid for this lead */
        for (size_t j = 1; j < k; j++) {
            uint8_t d = b[n - k + j];
            if ((d & 0xC0) != 0x80) return 0;
            if (j == 1) {
                if (c == 0xE0 && d < 0xA0) return 0;
                if (c == 0xED && d >= 0xA0) return 0;
                if (c == 0xF0 && d < 0x90) return 0;
                if (c == 0xF4 && d >= 0x90) return 0;
            }
        }
        return k;
    }
    return 0;
}

static uint8_t outbuf_dummy;

const char *df_tok_stream_push(df_tok_stream *s, int32_t id, size_t *n) {
    size_t l;
    const char *p = df_tok_token_bytes(s->t, id, &l);
    if (!p) { *n = 0; return (const char *)&outbuf_dummy; }
    if (s->held + l + 1 > s->cap) {
        s->cap = (s->held + l + 1) * 2;
        s->buf = df_xrealloc(s->buf, s->cap);
    }
    memcpy(s->buf + s->held, p, l);
    size_t total = s->held + l, off = 0;
    if (!s->started && total) {
        if ((s->t->metaspace_decode & 2) && s->buf[0] == ' ') off = 1;
        s->started = 1;
    }
    size_t keep = incomplete_tail(s->buf + off, total - off);
    size_t emit = total - off - keep;
    /* emitted bytes are returned from the front of buf; the held tail moves after them */
    if (emit + 1 > s->outcap) { s->outcap = emit * 2 + 64; s->out = df_xrealloc(s->out, s->outcap); }
    memcpy(s->out, s->buf + off, emit);
    memmove(s->buf, s->buf + off + emit, keep);
    s->held = keep;
    *n = emit;
    return (const char *)s->out;
}

const char *df_tok_stream_flush(df_tok_stream *s, size_t *n) {
    *n = s->held;
    s->held = 0;
    return s->buf ? (const char *)s->buf : (const char *)&outbuf_dummy;
}
