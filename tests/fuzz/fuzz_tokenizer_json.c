/* fuzz_tokenizer_json.c - libFuzzer target for tokenizer.json normalizers,
 * pre-tokenizers and added tokens (issue 18: hostile tokenizer files).
 *
 * fuzz_tokenizer.c feeds raw bytes to the JSON loader, which mostly stops at
 * the JSON parser or the first unknown field. This target instead spends the
 * input's first bytes on building a well-formed tokenizer.json: a Sequence of
 * up to 9 normalizers (NFC, Prepend, Replace with short strings that may grow
 * the text), a Sequence of up to 9 pre-tokenizers (Split with a regex from a
 * list or a literal, every behaviour, invert; ByteLevel with its flags), a
 * small byte-level vocabulary with merges, and added tokens with every flag
 * (normalized ones go through the normalizers at load). The rest of the input
 * is the text, encoded serially and on 2 threads.
 *
 * Checked: loading fails cleanly or succeeds; encoding either succeeds, with
 * the same ids on 1 and 2 threads and ids that decode, or fails with
 * DF_EINPUT and a message naming a normalizer or pre-tokenizer step (the
 * output cap, or PCRE2 giving up on a regex); memory stays bounded (libFuzzer's -rss_limit_mb). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deltafin.h"
#include "tok/tokenizer.h"
#include "util/util.h"

typedef struct { const uint8_t *p; size_t n; } src;
static unsigned take(src *s, unsigned mod) {
    if (!s->n) return 0;
    unsigned v = s->p[0];
    s->p++, s->n--;
    return mod ? v % mod : v;
}

/* A short JSON string (escaped) from the input: up to max bytes of a small
 * alphabet that overlaps the text's likely bytes. */
static void put_str(df_buf *j, src *s, int max) {
    static const char *alpha[] = {"a", "b", " ", "\\n", "\\u00e9", "e\\u0301", "\\u2581", "ab", "<", ">", "|", "0", "1"};
    int n = (int)take(s, (unsigned)max + 1);
    df_buf_puts(j, "\"");
    for (int i = 0; i < n; i++) df_buf_puts(j, alpha[take(s, sizeof alpha / sizeof *alpha)]);
    df_buf_puts(j, "\"");
}

static const char *regexes[] = {
    "\\\\p{N}{1,3}", "\\\\s+", " ?\\\\p{L}+", "[a-z]", ".", "\\\\s+(?!\\\\S)|\\\\s+", "(?i:'s|'t)", "a|b", "\\\\p{L}+|\\\\p{N}+|[^\\\\s\\\\p{L}\\\\p{N}]+",
};
static const char *behaviors[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};

static void build_json(df_buf *j, src *s) {
    df_buf_puts(j, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    /* byte-level vocabulary: printable ASCII, the space as U+0120, a few merges' results */
    char key[16];
    int id = 0;
    for (int c = 33; c < 127; c++) {
        if (c == '"' || c == '\\') snprintf(key, sizeof key, "\\%c", c);
        else snprintf(key, sizeof key, "%c", c);
        df_buf_puts(j, id ? ", \"" : "\""), df_buf_puts(j, key), df_buf_puts(j, "\": ");
        char num[16];
        snprintf(num, sizeof num, "%d", id++);
        df_buf_puts(j, num);
    }
    df_buf_puts(j, ", \"\\u0120\": 94, \"\\u010a\": 95, \"ab\": 96, \"\\u0120a\": 97, \"aa\": 98}, "
                   "\"merges\": [\"a b\", \"\\u0120 a\", \"a a\"]");
    if (take(s, 2)) df_buf_puts(j, ", \"ignore_merges\": true");
    df_buf_puts(j, "}, \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [");
    int nn = (int)take(s, 10);
    for (int i = 0; i < nn; i++) {
        if (i) df_buf_puts(j, ", ");
        switch (take(s, 3)) {
        case 0: df_buf_puts(j, "{\"type\": \"NFC\"}"); break;
        case 1: df_buf_puts(j, "{\"type\": \"Prepend\", \"prepend\": "), put_str(j, s, 3), df_buf_puts(j, "}"); break;
        default:
            df_buf_puts(j, "{\"type\": \"Replace\", \"pattern\": {\"String\": \"");
            df_buf_puts(j, (const char *[]){"a", " ", "ab", "\\u00e9"}[take(s, 4)]);
            df_buf_puts(j, "\"}, \"content\": "), put_str(j, s, 12), df_buf_puts(j, "}");
        }
    }
    df_buf_puts(j, "]}, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [");
    int np = (int)take(s, 10);
    for (int i = 0; i < np; i++) {
        if (i) df_buf_puts(j, ", ");
        if (take(s, 3) == 0) {
            df_buf_puts(j, "{\"type\": \"ByteLevel\", \"add_prefix_space\": ");
            df_buf_puts(j, take(s, 2) ? "true" : "false");
            df_buf_puts(j, ", \"use_regex\": ");
            df_buf_puts(j, take(s, 2) ? "true" : "false");
            df_buf_puts(j, "}");
            continue;
        }
        df_buf_puts(j, "{\"type\": \"Split\", \"pattern\": ");
        if (take(s, 3)) df_buf_puts(j, "{\"Regex\": \""), df_buf_puts(j, regexes[take(s, sizeof regexes / sizeof *regexes)]), df_buf_puts(j, "\"}");
        else df_buf_puts(j, "{\"String\": \""), df_buf_puts(j, (const char *[]){"a", " ", "ab", "\\n"}[take(s, 4)]), df_buf_puts(j, "\"}");
        df_buf_puts(j, ", \"behavior\": \""), df_buf_puts(j, behaviors[take(s, 5)]), df_buf_puts(j, "\", \"invert\": ");
        df_buf_puts(j, take(s, 4) == 0 ? "true}" : "false}");
    }
    df_buf_puts(j, "]}, \"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [");
    int na = (int)take(s, 4);
    for (int i = 0; i < na; i++) {
        char head[64];
        snprintf(head, sizeof head, "%s{\"id\": %d, \"content\": ", i ? ", " : "", 100 + i);
        df_buf_puts(j, head);
        put_str(j, s, 4);
        unsigned f = take(s, 32);
        char flags[160];
        snprintf(flags, sizeof flags, ", \"special\": %s, \"normalized\": %s, \"lstrip\": %s, \"rstrip\": %s, \"single_word\": %s}", f & 1 ? "true" : "false",
                 f & 2 ? "true" : "false", f & 4 ? "true" : "false", f & 8 ? "true" : "false", f & 16 ? "true" : "false");
        df_buf_puts(j, flags);
    }
    df_buf_puts(j, "]}");
    df_buf_put(j, "", 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    src s = {data, size};
    df_buf j = {0};
    build_json(&j, &s);
    char path[] = "/tmp/fuzz_tokjsonXXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { df_buf_free(&j); return 0; }
    int ok = write(fd, j.p, j.len - 1) == (ssize_t)(j.len - 1);
    close(fd);
    char err[512];
    df_tokenizer *t = ok ? df_tok_load(path, err, sizeof err) : NULL;
    unlink(path);
    df_buf_free(&j);
    if (!t) return 0;
    const char *text = (const char *)s.p;
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    char e1[512] = "", e2[512] = "";
    int r1 = df_tok_encode_err(t, text, s.n, 0, 1, &a, &na, e1, sizeof e1);
    int r2 = df_tok_encode_err(t, text, s.n, 0, 2, &b, &nb, e2, sizeof e2);
    if (r1 != r2) abort();
    if (r1) {
        /* the only ways encoding fails: the output cap, or PCRE2 giving up, with a message naming the step */
        if (r1 != DF_EINPUT || (!strstr(e1, "normalizer step") && !strstr(e1, "pre-tokenizer")) ||
            !((strstr(e1, "exceed") && strstr(e1, "the cap")) || strstr(e1, "PCRE2 gave up")))
            abort();
        if (a || b) abort();
    } else {
        if (na != nb || (na && memcmp(a, b, na * sizeof *a))) abort();
        char *out;
        size_t ol;
        if (df_tok_decode(t, a, na, &out, &ol)) abort(); /* every id encoding gives has bytes */
        free(out);
    }
    free(a);
    free(b);
    df_tok_free(t);
    return 0;
}
