/* fuzz_tokenizer.c - libFuzzer target for the tokenizer module.
 * The first byte picks a mode:
 *   2 mod 4: the rest is a GGUF file; load its embedded tokenizer (must fail
 *         cleanly or load), and if it loads, encode and decode a short text;
 *   0 mod 4: the rest is a tokenizer.json; load it (must fail cleanly or load),
 *         and if it loads, encode and decode a short fixed text with it;
 *   odd:  the rest is text; encode it (serial and 2 threads, which must agree)
 *         with a small byte-level tokenizer built once from arrays, and check
 *         that decoding gives the bytes back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "tok/tokenizer.h"
#include "util/util.h"

static df_tokenizer *small;

static df_tokenizer *build_small(void) {
    static char *toks[256 + 4];
    static const char *merges[] = {"Ġ t", "h e", "Ġt he", "i n"};
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        char *s = calloc(4, 1);
        if (cp < 0x80) s[0] = (char)cp;
        else { s[0] = (char)(0xC0 | (cp >> 6)); s[1] = (char)(0x80 | (cp & 63)); }
        toks[b] = s;
    }
    toks[256] = "Ġt"; toks[257] = "he"; toks[258] = "Ġthe"; toks[259] = "in";
    df_tok_arrays a = {0};
    a.kind = DF_TOK_ARRAYS_GPT2;
    a.n_tokens = 260;
    a.tokens = (const char *const *)toks;
    a.n_merges = 4;
    a.merges = merges;
    a.pre = "qwen2";
    char err[256];
    return df_tok_from_arrays(&a, err, sizeof err);
}

static void exercise(df_tokenizer *t) {
    int32_t *ids;
    size_t n;
    const char *txt = "Hello world, it's 2024!\n<|im_end|> <s> \xe2\x96\x81x  y\xff";
    df_tok_encode(t, txt, strlen(txt), DF_TOK_ALLOW_SPECIAL, 1, &ids, &n);
    char *out;
    size_t ol;
    if (df_tok_decode(t, ids, n, &out, &ol) == 0) free(out);
    df_tok_stream *s = df_tok_stream_new(t);
    for (size_t i = 0; i < n; i++) df_tok_stream_push(s, ids[i], &ol);
    df_tok_stream_flush(s, &ol);
    df_tok_stream_free(s);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if ((data[0] & 3) == 2) {
        char err[512];
        df_gguf *g = NULL;
        uint8_t *copy = malloc(size - 1 ? size - 1 : 1); /* its own allocation, so ASan sees overreads */
        memcpy(copy, data + 1, size - 1);
        if (df_gguf_open_mem(copy, size - 1, "fuzz.gguf", &g, err, sizeof err) == 0) {
            int ab;
            df_tokenizer *t = df_tok_load_gguf(g, NULL, &ab, err, sizeof err);
            df_gguf_close(g);
            if (t) {
                exercise(t);
                df_tok_free(t);
            }
        }
        free(copy);
        return 0;
    }
    if (!(data[0] & 1)) {
        char path[] = "/tmp/fuzz_tokXXXXXX";
        int fd = mkstemp(path);
        if (fd < 0) return 0;
        if (write(fd, data + 1, size - 1) != (ssize_t)(size - 1)) { close(fd); unlink(path); return 0; }
        close(fd);
        char err[512];
        df_tokenizer *t = df_tok_load(path, err, sizeof err);
        unlink(path);
        if (t) {
            exercise(t);
            df_tok_free(t);
        }
        return 0;
    }
    if (!small) small = build_small();
    if (!small) abort();
    int32_t *a, *b;
    size_t na, nb;
    df_tok_encode(small, (const char *)data + 1, size - 1, 0, 1, &a, &na);
    df_tok_encode(small, (const char *)data + 1, size - 1, 0, 2, &b, &nb);
    if (na != nb || memcmp(a, b, na * sizeof *a)) abort();
    char *out;
    size_t ol;
    if (df_tok_decode(small, a, na, &out, &ol) || ol != size - 1 || memcmp(out, data + 1, ol)) abort();
    free(out);
    free(a);
    free(b);
    return 0;
}
