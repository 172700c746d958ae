/* tiktoken.c - loads a tiktoken rank file ("<base64 token> <rank>" per line)
 * into a df_tokenizer: rank = id, and every token that splits into two tokens
 * yields a merge of that rank, which reproduces tiktoken's byte-pair merge.
 *
 * Invariants: ranks are unique and tokens are unique (tiktoken requires
 * both); a malformed line is DF_EFORMAT naming file:line. */
#include <stdlib.h>
#include <string.h>

#include "deltafin.h"
#include "tok/tok_internal.h"
#include "util/util.h"

static int b64val(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes standard base64 (with optional '=' padding); returns the length or -1. */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out) {
    while (n && s[n - 1] == '=') n--;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64val(s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return (long)o;
}

int df_tok_load_tiktoken(df_tokenizer *t, const char *file, const char *pat, char *err, size_t errlen) {
    df_mapped m;
    int rc = df_map_file(file, &m, err, errlen);
    if (rc) return rc;
    df_bpe *b = &t->bpe;
    b->byte_level = 1;
    b->whole_word_first = 1;
    uint8_t tok[1024];
    size_t line = 0, i = 0;
    while (i < m.size) {
        line++;
        size_t e = i;
        while (e < m.size && m.data[e] != '\n') e++;
        size_t le = e;
        if (le > i && m.data[le - 1] == '\r') le--;
        if (le > i) {
            size_t sp = i;
            while (sp < le && m.data[sp] != ' ') sp++;
            long tl = (sp - i) <= sizeof tok * 4 / 3 ? b64_decode(m.data + i, sp - i, tok) : -1;
            char *end = NULL;
            long long r = -1;
            if (sp < le) {
                char num[24];
                size_t nl = le - sp - 1;
                if (nl > 0 && nl < sizeof num) {
                    memcpy(num, m.data + sp + 1, nl);
                    num[nl] = 0;
                    r = strtoll(num, &end, 10);
                    if (*end) r = -1;
                }
            }
            if (tl <= 0 || r < 0 || r >= DF_TOK_MAX_ID) {
                rc = df_err(err, errlen, DF_EFORMAT, "%s:%zu: expected \"<base64 token> <rank>\"", file, line);
                goto out;
            }
            if (r < b->n_ids && b->tok[r] != UINT64_MAX) {
                rc = df_err(err, errlen, DF_EFORMAT, "%s:%zu: rank %lld appears twice", file, line, r);
                goto out;
            }
            df_bpe_set_token(b, (int32_t)r, tok, (size_t)tl);
        }
        i = e + 1;
    }
    if (!b->n_ids) { rc = df_err(err, errlen, DF_EFORMAT, "%s: no tokens", file); goto out; }
    df_bpe_index(b);
    for (int c = 0; c < 256; c++)
        if (b->byte_id[c] < 0) {
            rc = df_err(err, errlen, DF_EFORMAT, "%s: byte 0x%02X has no token (every single byte must)", file, c);
            goto out;
        }
    df_bpe_pairs_from_ranks(b);
    rc = df_tok_add_pretok_regex(t, pat, DF_SPLIT_ISOLATED, 0, err, errlen);
out:
    df_unmap_file(&m);
    return rc;
}
