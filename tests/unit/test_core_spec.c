/* test_core_spec.c - the prompt-lookup index of speculative decoding
 * (src/core/spec.c): longest suffix first (3, 2, then 1 tokens), the most
 * recent earlier occurrence, a periodic continuation past the end, only
 * earlier occurrences (never the suffix itself), incremental appends equal
 * to one append, and the result against a brute-force search on random
 * sequences. */
#include "core/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* brute force: the longest n (3..1) whose suffix occurred earlier, the most recent such occurrence */
static int brute(const int32_t *h, size_t len, int k, int32_t *out) {
    for (int n = 3; n >= 1; n--) {
        if ((size_t)n > len) continue;
        for (size_t e = len - 1; e-- > 0;) { /* end positions before the last */
            if (e + 1 < (size_t)n) break;
            if (memcmp(h + e + 1 - n, h + len - n, (size_t)n * sizeof *h)) continue;
            size_t from = e + 1, period = len - from;
            for (int m = 0; m < k; m++) out[m] = (size_t)m < period ? h[from + m] : out[m - period];
            return k;
        }
    }
    return 0;
}

int main(void) {
    int32_t out[16], want[16];
    {
        df_ngram *ng = df_ngram_new();
        int32_t a[] = {1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 2, 3};
        df_ngram_append(ng, a, 12);
        /* suffix 2,3 (the 3-gram 7,2,3 never occurred): most recent earlier 2,3 ends at 7, followed by 5,7,2,3 */
        int n = df_ngram_draft(ng, 4, out);
        CHECK(n == 4 && out[0] == 5 && out[1] == 7 && out[2] == 2 && out[3] == 3, "n=%d %d %d %d %d", n, out[0], out[1], out[2], out[3]);
        int32_t b = 42; /* never seen: no draft */
        df_ngram_append(ng, &b, 1);
        CHECK(df_ngram_draft(ng, 4, out) == 0, "a new token has no draft");
        df_ngram_free(ng);
    }
    {
        df_ngram *ng = df_ngram_new();
        int32_t a[] = {8, 8, 8};
        df_ngram_append(ng, a, 3);
        /* 8,8 occurred ending at 1: followed by one 8, then periodic */
        int n = df_ngram_draft(ng, 5, out);
        CHECK(n == 5 && out[0] == 8 && out[4] == 8, "periodic n=%d", n);
        df_ngram_free(ng);
        ng = df_ngram_new();
        df_ngram_append(ng, a, 1);
        CHECK(df_ngram_draft(ng, 3, out) == 0, "a single token is not its own earlier occurrence");
        df_ngram_free(ng);
    }
    /* random sequences over a small alphabet, appended in random pieces, against brute force */
    srand(7);
    for (int trial = 0; trial < 200; trial++) {
        size_t len = 1 + (size_t)(rand() % 3000);
        int alpha = 2 + rand() % 40;
        int32_t *h = malloc(len * sizeof *h);
        for (size_t i = 0; i < len; i++) h[i] = rand() % alpha;
        df_ngram *ng = df_ngram_new();
        for (size_t i = 0; i < len;) {
            size_t step = 1 + (size_t)(rand() % 7);
            if (step > len - i) step = len - i;
            CHECK(df_ngram_append(ng, h + i, step) == 0, "append");
            i += step;
            if (rand() % 5 == 0 || i == len) {
                int k = 1 + rand() % 16;
                int n = df_ngram_draft(ng, k, out), m = brute(h, i, k, want);
                CHECK(n == m && !memcmp(out, want, (size_t)n * sizeof *out), "trial %d len %zu k %d: %d vs %d", trial, i, k, n, m);
            }
        }
        df_ngram_free(ng);
        free(h);
    }
    /* names */
    CHECK(df_spec_parse("auto") == DF_SPEC_AUTO && df_spec_parse("none") == DF_SPEC_NONE && df_spec_parse("x") == -1, "parse");
    if (fails) { fprintf(stderr, "%d failures\n", fails); return 1; }
    printf("test_core_spec: ok\n");
    return 0;
}
