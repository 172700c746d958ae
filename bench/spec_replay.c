/* spec_replay.c - replays a greedy answer through the prompt-lookup drafter under a scripted cost model, to tell what
 * a drafting policy can reach before any wall clock is read (issue 15; docs/PERFORMANCE.md).
 *
 *   spec_replay PROMPT_IDS ANSWER_IDS [A=1.0] [B=0.28] [K_MAX=8]
 *
 * PROMPT_IDS: the prompt's token ids (a file, separated by spaces, commas or newlines: `deltafin tokenize` output with
 * the brackets removed); ANSWER_IDS: the ids the model generated from it (`deltafin run --spec none --print-ids`).
 * A plain step costs 1 and a verify pass of k drafts A + B k (measured on the edit row of bench/spec_bench.sh at 1,346
 * positions: A 1.0, B 0.28 with DELTAFIN_SPEC_TRACE=1), each with a deterministic +-5% jitter (measured times are
 * noisy, and auto's cost estimates follow them). Prints, for
 *   auto    spec.c's auto policy (df_spec_want / df_spec_note_*: the code `deltafin run --spec auto` runs);
 *   ngram   drafting whenever there is a match, k by the cost model (--spec ngram);
 *   oracle  the same n-gram drafts, cut to the prefix the model accepts (no rejected draft, no pass without a token
 *           gained): an upper bound for any policy over this drafter at that cost,
 * the speedup over plain steps, passes, tokens per pass, drafts accepted and plain steps. */
#include "core/spec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a number argument: the whole string, in [lo, hi], else exit 2 naming it */
static double num_arg(const char *s, const char *name, double lo, double hi) {
    char *end;
    const double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "spec_replay: %s must be a number in [%g, %g], got '%s'\n", name, lo, hi, s);
        exit(2);
    }
    return v;
}

static int32_t *load_ids(const char *path, size_t *n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "spec_replay: cannot open %s\n", path);
        exit(2);
    }
    size_t cap = 4096;
    int32_t *v = malloc(cap * sizeof *v);
    int c, have = 0;
    long x = 0;
    *n = 0;
    while ((c = fgetc(f)) != EOF || have) {
        if (c >= '0' && c <= '9') {
            x = x * 10 + (c - '0'), have = 1;
            if (x > INT32_MAX) {
                fprintf(stderr, "spec_replay: %s: id %ld... is larger than %d (token ids are int32)\n", path, x, INT32_MAX);
                exit(2);
            }
            continue;
        }
        if (have) {
            if (*n == cap && !(v = realloc(v, (cap *= 2) * sizeof *v))) {
                fprintf(stderr, "spec_replay: %s: out of memory at %zu ids\n", path, *n);
                exit(1);
            }
            v[(*n)++] = (int32_t)x;
            x = 0, have = 0;
        }
        if (c == EOF) break;
        if (c != ' ' && c != ',' && c != '\n' && c != '\r' && c != '\t' && c != '[' && c != ']') {
            fprintf(stderr, "spec_replay: %s: unexpected character '%c' (ids separated by spaces or commas)\n", path, c);
            exit(2);
        }
    }
    fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spec_replay PROMPT_IDS ANSWER_IDS [A=1.0] [B=0.28] [K_MAX=8]\n");
        return 2;
    }
    size_t np, na;
    /* the arguments first (nothing loaded yet), then the two files */
    const double A = argc > 3 ? num_arg(argv[3], "A (a pass's fixed cost in plain steps)", 0.01, 100) : 1.0;
    const double B = argc > 4 ? num_arg(argv[4], "B (a pass's cost per drafted token)", 0, 100) : 0.28;
    const int k_max = argc > 5 ? (int)num_arg(argv[5], "K_MAX", 1, DF_SPEC_MAX_K) : 8;
    if (argc > 6 || (argc > 5 && k_max != atof(argv[5]))) {
        fprintf(stderr, "spec_replay: %s\n", argc > 6 ? "too many arguments" : "K_MAX must be a whole number");
        return 2;
    }
    int32_t *prompt = load_ids(argv[1], &np), *answer = load_ids(argv[2], &na);
    const size_t n = np + na;
    int32_t *t = !np || na < 2 ? NULL : malloc(n * sizeof *t);
    if (t) memcpy(t, prompt, np * sizeof *t), memcpy(t + np, answer, na * sizeof *t);
    free(prompt), free(answer);
    if (!t) {
        if (!np || na < 2)
            fprintf(stderr, "spec_replay: need a prompt of 1+ ids (%s: %zu) and an answer of 2+ ids (%s: %zu)\n", argv[1], np, argv[2], na);
        else
            fprintf(stderr, "spec_replay: out of memory for %zu ids\n", n);
        return 2;
    }
    printf("prompt %zu ids, answer %zu ids; plain step 1, pass of k drafts %.3f + %.3f k; k_max %d\n", np, na, A, B, k_max);
    static const char *const names[] = {"auto", "ngram", "oracle"};
    for (int mode = 0; mode < 3; mode++) {
        df_spec *sp = df_spec_new(mode == 0 ? DF_SPEC_AUTO : DF_SPEC_NGRAM, k_max, NULL);
        if (!sp) {
            free(t);
            return 1;
        }
        int32_t d[DF_SPEC_MAX_K];
        df_spec_append(sp, t, np + 1); /* the prompt and the answer's first id (the prefill chose it) */
        double time = 0;
        long passes = 0, plain = 0, accepted = 0, drafted = 0;
        unsigned seed = 1;
        for (size_t i = np; i + 1 < n;) { /* t[i] is the last id decided */
            seed = seed * 1103515245u + 12345u;
            const double jit = 0.95 + 0.1 * ((seed >> 16) & 1023) / 1023.0;
            /* drafts t[i+1 .. i+k] and the pass's own token after them, t[i+k+1], all inside the answer */
            const int room = n - 2 - i < DF_SPEC_MAX_K ? (int)(n - 2 - i) : DF_SPEC_MAX_K;
            int k = df_spec_want(sp, room);
            if (k > 0) k = df_spec_draft(sp, k, d, NULL, 0);
            int acc = 0;
            while (k > 0 && acc < k && d[acc] == t[i + 1 + (size_t)acc]) acc++;
            if (mode == 2) k = acc; /* the oracle drafts only what will be accepted */
            if (k > 0) {
                const double secs = (A + B * k) * jit;
                df_spec_note_verify(sp, k, acc, secs);
                time += secs, passes++, accepted += acc, drafted += k;
                df_spec_append(sp, t + i + 1, (size_t)acc + 1);
                i += (size_t)acc + 1;
            } else {
                df_spec_note_plain(sp, jit);
                time += jit, plain++;
                df_spec_append(sp, t + i + 1, 1);
                i++;
            }
        }
        printf("%-6s %.3fx  %ld passes (%.2f tokens a pass), %ld of %ld drafts accepted, %ld plain steps\n", names[mode],
               (double)(na - 1) / time, passes, passes ? (double)(accepted + passes) / passes : 0.0, accepted, drafted, plain);
        df_spec_free(sp);
    }
    free(t);
    return 0;
}
