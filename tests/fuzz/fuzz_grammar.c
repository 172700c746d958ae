/* fuzz_grammar.c - libFuzzer target for the grammar parser and the JSON
 * schema converter (src/grammar): any bytes must compile or give a message,
 * never crash, leak or hit undefined behaviour. The first byte picks the
 * mode: even, the rest is grammar text (root rule "root"); odd, the rest is
 * a JSON schema whose grammar must then compile (or be refused with a
 * message). A compiled grammar is run: a matcher over a small vocabulary
 * takes masks and accepts allowed tokens for a few steps, and every allowed
 * token must be accepted (or refused by a documented limit). Build and run:
 * make fuzz. */
#include "grammar/grammar.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static df_gvocab *vocab(void) {
    static df_gvocab *v;
    if (v) return v;
    static const char *toks[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "0", "1", "-", ".", "e", "true",
                                 "false", "null", "\":", "\",", "\"}", "ab", "\\", "\\n", "\xc3\xa9", "x", "yes"};
    enum { N = sizeof toks / sizeof *toks };
    size_t l[N];
    for (int i = 0; i < N; i++) l[i] = strlen(toks[i]);
    v = df_gvocab_new(N, toks, l, NULL, NULL, 0);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    char err[512];
    df_grammar *g = NULL;
    df_buf b = {0};
    if (data[0] & 1) {
        int rc = df_json_schema_to_grammar((const char *)data + 1, size - 1, "p-", &b, err, sizeof err);
        if (rc) { if (!err[0] || b.len) __builtin_trap(); }
        else if (df_grammar_compile(b.p, b.len, "p-root", &g, err, sizeof err) && !err[0]) __builtin_trap();
    } else if (df_grammar_compile((const char *)data + 1, size - 1, "root", &g, err, sizeof err) && !err[0])
        __builtin_trap();
    df_buf_free(&b);
    if (!g) return 0;
    df_gvocab *v = vocab();
    df_gmatch *m = v ? df_gmatch_new(g, v, err, sizeof err) : NULL;
    /* a small vocabulary needs few steps per call; the limit keeps each input well under libFuzzer's timeout
     * under instrumentation ((x?){296} took 10 s without it) */
    if (m) df_gmatch_set_work_limit(m, 50000);
    uint32_t bits[1];
    for (int step = 0; m && step < 24; step++) {
        if (df_gmatch_mask(m, bits)) break;
        if (!bits[0]) break;
        int pick = (int)((size + (size_t)step * 7) % 32), t = -1;
        for (int k = 0; k < 32 && t < 0; k++)
            if (bits[0] >> ((pick + k) % 32) & 1) t = (pick + k) % 32;
        int rc = df_gmatch_accept(m, t);
        /* an allowed token must be accepted; the exceptions are the documented limits (live parse positions: an
         * ambiguous grammar's next set can pass it while the mask, built from per-node caches, did not; the work
         * limit), refused with DF_EUNSUPPORTED and a message */
        if (rc == DF_EUNSUPPORTED && (strstr(df_gmatch_error(m), "too ambiguous") || strstr(df_gmatch_error(m), "parse steps")))
            break;
        if (rc) __builtin_trap();
    }
    df_gmatch_free(m);
    df_grammar_free(g);
    return 0;
}
