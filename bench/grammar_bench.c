/* grammar_bench.c - constrained decoding's cost per token on a real
 * vocabulary (default: the Qwen3 tokenizer, 151,669 tokens): building the
 * vocabulary index, compiling a schema's grammar, and df_gmatch_mask +
 * df_gmatch_accept per token along a tokenized document, first with cold
 * per-node caches (a fresh grammar: the first request with a schema) and
 * then warm (the same grammar again: a repeated schema). Prints mean,
 * median, p99 and worst mask times in ms.
 *
 *   make O=build build/bench/grammar_bench && build/bench/grammar_bench [TOKENIZER_DIR] */
#include "grammar/grammar.h"
#include "tok/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const struct { const char *name, *schema, *doc; } cases[] = {
    {"person (strict schema)",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
     "\"email\":{\"type\":[\"string\",\"null\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
     "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"}},"
     "\"required\":[\"street\",\"city\"],\"additionalProperties\":false}},"
     "\"required\":[\"name\",\"age\",\"email\",\"tags\",\"address\"],\"additionalProperties\":false}",
     "{\n  \"name\": \"Alice Johnson, the quick brown fox jumps over the lazy dog\",\n  \"age\": 42,\n  \"email\": null,\n"
     "  \"tags\": [\"engineer\", \"amateur astronomer\", \"coffee \\\"snob\\\"\", \"d\\u00e9j\\u00e0 vu\"],\n"
     "  \"address\": {\"street\": \"12 Rue de la Paix\", \"city\": \"Paris\"}\n}"},
    {"bounded string (maxLength 200)", "{\"type\":\"string\",\"maxLength\":200}",
     "\"The quick brown fox jumps over the lazy dog, and then it keeps on running through the forest until the night "
     "falls and the stars come out over the hills.\""},
    {"json_object (any object)", "{\"type\":\"object\"}",
     "{\"results\": [{\"id\": 1, \"score\": 0.93, \"text\": \"The mitochondria is the powerhouse of the cell.\"},"
     " {\"id\": 2, \"score\": -1.5e3, \"ok\": true, \"none\": null, \"nested\": {\"a\": [1, 2, [3, {}]]}}],"
     " \"summary\": \"Two results; the first is a well-known biology fact, the second a nested structure.\"}"},
};

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "../shared/fixtures/tokenizers/qwen3";
    char err[512];
    df_tokenizer *t = df_tok_load(dir, err, sizeof err);
    if (!t) { fprintf(stderr, "grammar_bench: %s\n", err); return 2; }
    int n = df_tok_vocab_size(t);
    const char **tb = calloc((size_t)n, sizeof *tb);
    size_t *tl = calloc((size_t)n, sizeof *tl);
    uint8_t *ex = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        tb[i] = df_tok_token_bytes(t, i, &tl[i]);
        if (!tb[i]) tl[i] = 0;
        ex[i] = df_tok_is_special(t, i) != 0;
    }
    double t0 = df_now();
    df_gvocab *v = df_gvocab_new(n, tb, tl, ex, err, sizeof err);
    if (!v) { fprintf(stderr, "grammar_bench: %s\n", err); return 1; }
    printf("vocabulary %s: %d tokens, index built in %.1f ms (once per tokenizer)\n", dir, n, (df_now() - t0) * 1e3);
    uint32_t *bits = malloc(df_gvocab_mask_words(v) * sizeof *bits);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int32_t *ids;
        size_t nid;
        df_tok_encode(t, cases[c].doc, strlen(cases[c].doc), 0, 1, &ids, &nid);
        double *ms = malloc(sizeof *ms * nid);
        for (int pass = 0; pass < 2; pass++) {
            static df_grammar *g;
            if (pass == 0) {
                df_buf b = {0};
                t0 = df_now();
                if (df_json_schema_to_grammar(cases[c].schema, strlen(cases[c].schema), "", &b, err, sizeof err) ||
                    df_grammar_compile(b.p, b.len, "root", &g, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
                printf("\n%s: schema -> grammar (%zu bytes, %d nodes) in %.2f ms; document of %zu tokens\n", cases[c].name,
                       b.len, df_grammar_n_nodes(g), (df_now() - t0) * 1e3, nid);
                df_buf_free(&b);
            }
            df_gmatch *m = df_gmatch_new(g, v, err, sizeof err);
            double acc = 0, tot = 0;
            for (size_t i = 0; i < nid; i++) {
                double a = df_now();
                df_gmatch_mask(m, bits);
                ms[i] = (df_now() - a) * 1e3;
                tot += ms[i];
                if (!(bits[ids[i] >> 5] >> (ids[i] & 31) & 1)) { fprintf(stderr, "token %zu not allowed: bug\n", i); return 1; }
                a = df_now();
                df_gmatch_accept(m, ids[i]);
                acc += (df_now() - a) * 1e3;
            }
            if (!df_gmatch_complete(m)) { fprintf(stderr, "document incomplete: bug\n"); return 1; }
            qsort(ms, nid, sizeof *ms, cmpd);
            printf("  %s: mask mean %.4f ms, median %.4f, p99 %.4f, worst %.4f; accept mean %.4f ms\n",
                   pass ? "warm caches" : "cold caches", tot / (double)nid, ms[nid / 2], ms[(nid * 99) / 100], ms[nid - 1],
                   acc / (double)nid);
            df_gmatch_free(m);
            if (pass) df_grammar_free(g);
        }
        free(ms);
        free(ids);
    }
    free(bits);
    df_gvocab_free(v);
    free(tb);
    free(tl);
    free(ex);
    df_tok_free(t);
    return 0;
}
