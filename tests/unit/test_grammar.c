/* test_grammar.c - src/grammar: the grammar parser (valid texts, every error
 * naming line:column and rule), documents accepted or rejected as the
 * grammar's meaning says, refusals (left recursion, rules that match no
 * finite text, limits), the JSON schema converter's refusals, and exact
 * masks: at every step of random walks, the mask equals the brute force
 * (token t allowed iff a fresh matcher accepts prefix + bytes(t)), on a
 * small vocabulary and on a sample of the Qwen3 vocabulary.
 *
 * Helper modes for tests/py/test_grammar.py:
 *   test_grammar --check SCHEMA_FILE DOCS_JSON   one line per document: 1 accepted, 0 rejected
 *   test_grammar --prefix SCHEMA_FILE DOCS_JSON  one line per text: 1 a valid prefix of some document, 0 not
 *   test_grammar --gen SCHEMA_FILE SEED N        N random documents the grammar allows, as a JSON array
 *   test_grammar --schema SCHEMA_FILE            the grammar text (or the error, exit 2) */
#include "grammar/grammar.h"
#include "tok/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c, ...)                                                   \
    do {                                                                \
        if (!(c)) {                                                     \
            failures++;                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
            fprintf(stderr, __VA_ARGS__);                               \
            fprintf(stderr, "\n");                                      \
        }                                                               \
    } while (0)

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static df_grammar *compile(const char *text, char *err, size_t errlen) {
    df_grammar *g = NULL;
    if (df_grammar_compile(text, strlen(text), "root", &g, err, errlen)) return NULL;
    return g;
}

/* 1 if the whole text is a complete document, 0 if only a valid prefix, -1 if rejected */
static int judge(df_grammar *g, const df_gvocab *v, const char *text) {
    char err[256];
    df_gmatch *m = df_gmatch_new(g, v, err, sizeof err);
    if (!m) return -2;
    int rc = df_gmatch_accept_bytes(m, text, strlen(text));
    int r = rc ? -1 : df_gmatch_complete(m);
    df_gmatch_free(m);
    return r;
}

static df_gvocab *byte_vocab(void) {
    static char bytes[256][1];
    const char *p[256];
    size_t l[256];
    for (int i = 0; i < 256; i++) { bytes[i][0] = (char)i; p[i] = bytes[i]; l[i] = 1; }
    return df_gvocab_new(256, p, l, NULL, NULL, 0);
}

static void test_accept_reject(void) {
    char err[256];
    df_gvocab *v = byte_vocab();
    struct { const char *g, *text; int want; } cases[] = {
        {"root ::= \"ab\" | \"a\" \"c\"*", "a", 1},
        {"root ::= \"ab\" | \"a\" \"c\"*", "ab", 1},
        {"root ::= \"ab\" | \"a\" \"c\"*", "accc", 1},
        {"root ::= \"ab\" | \"a\" \"c\"*", "abc", -1},
        {"root ::= [a-c]{2,3}", "a", 0},
        {"root ::= [a-c]{2,3}", "ab", 1},
        {"root ::= [a-c]{2,3}", "abc", 1},
        {"root ::= [a-c]{2,3}", "abca", -1},
        {"root ::= [a-c]{2,}", "abcabcabc", 1},
        {"root ::= [a-c]{2}", "abc", -1},
        {"root ::= x+ \";\"\nx ::= \"(\" x* \")\"", "(()(()))(", 0},
        {"root ::= x+ \";\"\nx ::= \"(\" x* \")\"", "(()(()));", 1},
        {"root ::= x+ \";\"\nx ::= \"(\" x* \")\"", "())", -1},
        {"root ::= [^\"\\\\]*", "h\xc3\xa9llo \xf0\x9f\x98\x80", 1},
        {"root ::= [^\"\\\\]*", "a\"", -1},
        {"root ::= [^\"\\\\]*", "\xc3", 0},        /* the start of a 2-byte character */
        {"root ::= [^\"\\\\]*", "\xc3\x28", -1},   /* not a continuation byte */
        {"root ::= [^\"\\\\]*", "\xed\xa0\x80", -1}, /* a surrogate's encoding */
        {"root ::= [\\u00e0-\\u00ff]+", "\xc3\xa0\xc3\xbf", 1},
        {"root ::= [\\u00e0-\\u00ff]+", "\xc3\x9f", -1},
        {"root ::= \"\\u00e9\\n\\t\\\"\\\\\"", "\xc3\xa9\n\t\"\\", 1},
        {"root ::= . .", "\xe2\x82\xac" "a", 1},
        {"# comment\nroot ::= a\n  | b # end\na ::= \"x\"\nb ::= \"y\"", "y", 1},
        {"root ::= (\"a\"\n  \"b\")", "ab", 1},
        {"root ::= \"\"", "", 1},
        {"root ::= \"a\"?", "", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        df_grammar *g = compile(cases[i].g, err, sizeof err);
        CHECK(g, "grammar %zu: %s", i, err);
        if (!g) continue;
        int r = judge(g, v, cases[i].text);
        CHECK(r == cases[i].want, "grammar %zu on '%s': got %d, want %d", i, cases[i].text, r, cases[i].want);
        df_grammar_free(g);
    }
    df_gvocab_free(v);
}

static void test_errors(void) {
    struct { const char *g, *want; } bad[] = {
        {"root ::= \"abc", "line 1:14 in rule 'root': expected '\"' closing the literal"},
        {"root ::= [a-", "line 1:13 in rule 'root': expected ']' closing the class"},
        {"root ::= x", "line 1:10 in rule 'root': expected a defined rule, 'x' is not defined"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2:1: expected each rule defined once"},
        {"root = \"a\"", "line 1:6: expected '::=' after the rule name"},
        {"root ::= \"a\"{3,2}", "expected {m,n} with m <= n"},
        {"root ::= \"a\"{99999}", "expected a repetition count <= 10000"},
        {"root ::= (\"a\"", "expected ')'"},
        {"root ::= \"\\q\"", "expected an escape"},
        {"root ::= [z-a]", "expected a range's end >= its start"},
        {"root ::= \"\\ud800\"", "a surrogate code point"},
        {"root ::= root \"a\" | \"b\"", "rule 'root': left recursion"},
        {"root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"", "rule 'a': left recursion"},
        {"root ::= \"a\" root", "rule 'root': it matches no finite text"},
        {"root ::= \"a\"\n)", "expected a rule name"},
        {"start ::= \"a\"", "no rule named 'root'"},
        {"root ::= [^\\x00-\\uffff\\U]", "expected an escape"},
        {"root ::= []", "expected a class that matches some character"}, /* fuzz: qsort of no ranges (UBSan) */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        df_grammar *g = compile(bad[i].g, err, sizeof err);
        CHECK(!g, "bad grammar %zu compiled", i);
        CHECK(strstr(err, bad[i].want), "bad grammar %zu: message '%s' lacks '%s'", i, err, bad[i].want);
        df_grammar_free(g);
    }
    /* the node limit: nested repetitions expand */
    char err[256] = "";
    df_grammar *g = compile("root ::= ((\"ab\"){10000}){10000}", err, sizeof err);
    CHECK(!g && strstr(err, "grammar too large: more than"), "node limit: %s", err);
    df_grammar_free(g);
}

/* Mask vs brute force along random walks. */
static void check_walks(df_grammar *g, const df_gvocab *v, const char *const *tb, const size_t *tl, int n, int walks,
                        int steps, int sample, const char *what) {
    char err[256];
    size_t W = df_gvocab_mask_words(v);
    uint32_t *bits = malloc(W * 4);
    char *prefix = malloc(1 << 16);
    df_gmatch *b = df_gmatch_new(g, v, err, sizeof err); /* the brute force, reset for each probe */
    for (int w = 0; w < walks; w++) {
        df_gmatch *m = df_gmatch_new(g, v, err, sizeof err);
        size_t plen = 0;
        for (int s = 0; s < steps && m; s++) {
            int rc = df_gmatch_mask(m, bits);
            CHECK(!rc, "%s: mask: %s", what, df_gmatch_error(m));
            int bad = 0, nallowed = 0;
            for (int t = 0; t < n; t++) {
                int allowed = bits[t >> 5] >> (t & 31) & 1;
                nallowed += allowed;
                if (sample > 1 && rnd() % (uint64_t)sample) continue;
                int want = 0;
                if (tl[t] && plen + tl[t] < (1 << 16)) {
                    memcpy(prefix + plen, tb[t], tl[t]);
                    want = b && !df_gmatch_reset(b) && !df_gmatch_accept_bytes(b, prefix, plen + tl[t]);
                }
                if (allowed != want && bad++ < 3)
                    CHECK(0, "%s walk %d step %d: token %d '%.*s' mask %d, brute force %d (prefix '%.*s')", what, w, s, t,
                          (int)tl[t], tb[t], allowed, want, (int)plen, prefix);
            }
            if (!nallowed) break;
            int pick = (int)(rnd() % (uint64_t)nallowed);
            for (int t = 0; t < n; t++)
                if (bits[t >> 5] >> (t & 31) & 1 && !pick--) {
                    CHECK(!df_gmatch_accept(m, t), "%s: accept of an allowed token failed", what);
                    memcpy(prefix + plen, tb[t], tl[t]);
                    plen += tl[t];
                    break;
                }
        }
        df_gmatch_free(m);
    }
    df_gmatch_free(b);
    free(bits);
    free(prefix);
}

static const char *JSONISH =
    "root ::= obj\n"
    "obj ::= \"{\" ws (kv (\",\" ws kv)*)? \"}\"\n"
    "kv ::= str ws \":\" ws val ws\n"
    "val ::= str | num | obj | \"[\" ws (val ws (\",\" ws val ws)*)? \"]\" | \"true\" | \"null\"\n"
    "str ::= \"\\\"\" ([^\"\\\\] | \"\\\\\" [\"\\\\n])* \"\\\"\"\n"
    "num ::= \"-\"? [0-9]+ (\".\" [0-9]+)?\n"
    "ws ::= [ \\n]{0,3}\n";

static void test_masks_small(void) {
    /* every string of 1..2 bytes over an alphabet, plus longer tokens */
    const char *alpha = "{}[]\":, \n\\a1.-tn\xc3\xa9";
    int na = (int)strlen(alpha);
    const char *extra[] = {"true", "null", "\"}", "\":", "\",", "{\"", "}}", "]}", "\"a\"", "12.5", "  \n", "\xc3\xa9\"",
                           "\xa9", "tr", "ue", "-0", "\\\"", "\\n\"", "a\":{\"", "]]", "[]", "{}", "},{"};
    int ne = (int)(sizeof extra / sizeof *extra);
    int n = na + na * na + ne;
    char **tb = malloc(sizeof *tb * (size_t)n);
    size_t *tl = malloc(sizeof *tl * (size_t)n);
    int k = 0;
    for (int i = 0; i < na; i++) { tb[k] = strndup(alpha + i, 1); tl[k++] = 1; }
    for (int i = 0; i < na; i++)
        for (int j = 0; j < na; j++) { tb[k] = malloc(2); tb[k][0] = alpha[i]; tb[k][1] = alpha[j]; tl[k++] = 2; }
    for (int i = 0; i < ne; i++) { tb[k] = strdup(extra[i]); tl[k++] = strlen(extra[i]); }
    char err[256];
    df_gvocab *v = df_gvocab_new(n, (const char *const *)tb, tl, NULL, err, sizeof err);
    df_grammar *g = compile(JSONISH, err, sizeof err);
    CHECK(v && g, "small vocab / JSON-ish grammar: %s", err);
    if (v && g) check_walks(g, v, (const char *const *)tb, tl, n, 30, 40, 1, "small");
    /* a JSON schema's grammar */
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3},"
                         "\"n\":{\"type\":[\"integer\",\"null\"]},\"l\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",1,true]},\"maxItems\":2}},"
                         "\"required\":[\"a\"],\"additionalProperties\":false}";
    df_buf gb = {0};
    int rc = df_json_schema_to_grammar(schema, strlen(schema), "j-", &gb, err, sizeof err);
    CHECK(!rc, "schema: %s", err);
    df_grammar *gs = NULL;
    if (!rc) {
        rc = df_grammar_compile(gb.p, gb.len, "j-root", &gs, err, sizeof err);
        CHECK(!rc, "schema grammar: %s\n%s", err, gb.p);
    }
    if (gs) {
        check_walks(gs, v, (const char *const *)tb, tl, n, 30, 40, 1, "schema");
        CHECK(judge(gs, v, "{\"a\":\"xyz\",\"l\":[\"x\",1]}") == 1, "schema: a valid document rejected");
        CHECK(judge(gs, v, "{\"a\":\"wxyz\"}") == -1, "schema: maxLength not enforced");
        CHECK(judge(gs, v, "{\"n\":1}") == -1, "schema: required not enforced");
        CHECK(judge(gs, v, "{\"a\":\"\",\"z\":1}") == -1, "schema: additionalProperties not enforced");
        CHECK(judge(gs, v, "{\"a\":\"\",\"l\":[1,1,1]}") == -1, "schema: maxItems not enforced");
        CHECK(judge(gs, v, "{\"a\":\"\",\"l\":[2]}") == -1, "schema: enum not enforced");
        CHECK(judge(gs, v, "{\"a\":\"\",\"n\":1.5}") == -1, "schema: integer not enforced");
        CHECK(judge(gs, v, "{ \"a\" : \"\" , \"n\" : null }") == 1, "schema: whitespace rejected");
    }
    df_grammar_free(gs);
    df_buf_free(&gb);
    df_grammar_free(g);
    df_gvocab_free(v);
    for (int i = 0; i < n; i++) free(tb[i]);
    free(tb);
    free(tl);
}

static void test_masks_qwen3(void) {
    char err[256];
    df_tokenizer *t = df_tok_load("../shared/fixtures/tokenizers/qwen3", err, sizeof err);
    if (!t) { printf("qwen3 fixture not found (%s): Qwen3 mask sample skipped\n", err); return; }
    int n = df_tok_vocab_size(t);
    const char **tb = calloc((size_t)n, sizeof *tb);
    size_t *tl = calloc((size_t)n, sizeof *tl);
    uint8_t *ex = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        tb[i] = df_tok_token_bytes(t, i, &tl[i]);
        ex[i] = df_tok_is_special(t, i) != 0;
        if (!tb[i]) tl[i] = 0;
    }
    df_gvocab *v = df_gvocab_new(n, tb, tl, ex, err, sizeof err);
    df_grammar *g = compile(JSONISH, err, sizeof err);
    CHECK(v && g, "qwen3 vocab: %s", err);
    /* specials never allowed: their lengths are zeroed for the brute force */
    for (int i = 0; i < n; i++)
        if (ex[i]) tl[i] = 0;
    if (v && g) check_walks(g, v, tb, tl, n, 3, 20, 150, "qwen3");
    df_grammar_free(g);
    df_gvocab_free(v);
    free(tb);
    free(tl);
    free(ex);
    df_tok_free(t);
}

static void test_schema_refusals(void) {
    struct { const char *s, *want; } bad[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "unsupported keyword 'pattern'"},
        {"{\"type\":\"string\",\"format\":\"email\"}", "unsupported keyword 'format' (\"email\")"},
        {"{\"type\":\"number\",\"minimum\":1}", "unsupported keyword 'minimum'"},
        {"{\"oneOf\":[{\"type\":\"string\"}]}", "unsupported keyword 'oneOf'"},
        {"{\"allOf\":[{\"type\":\"string\"}]}", "unsupported keyword 'allOf'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"prefixItems\":[]}}}", "at /properties/a: unsupported keyword 'prefixItems'"},
        {"{\"type\":\"object\",\"patternProperties\":{}}", "unsupported keyword 'patternProperties'"},
        {"{\"type\":\"date\"}", "'type' date"},
        {"{\"$ref\":\"#/$defs/missing\"}", "'$ref' #/$defs/missing"},
        {"{\"$ref\":\"http://x/y\"}", "'$ref' http://x/y"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"]}", "'required' names 'x'"},
        {"{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", "maxLength < minLength"},
        {"{\"type\":\"array\",\"maxItems\":100000}", "'maxItems' must be an integer 0..10000"},
        {"false", "schema false matches no document"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", "no value of the allowed types"},
        {"{\"type\":\"string\",\"items\":{}}", "'items' without its type"},
        {"[1", "not JSON"},
        {"{\"not\":{}}", "unsupported keyword 'not'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        df_buf b = {0};
        int rc = df_json_schema_to_grammar(bad[i].s, strlen(bad[i].s), "", &b, err, sizeof err);
        CHECK(rc < 0, "bad schema %zu accepted", i);
        CHECK(strstr(err, bad[i].want), "bad schema %zu: message '%s' lacks '%s'", i, err, bad[i].want);
        CHECK(b.len == 0, "bad schema %zu: output left behind", i);
        df_buf_free(&b);
    }
    /* composition: a schema's rules under a prefix, referenced from a hand-written root */
    const char *schema = "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"],\"additionalProperties\":false}";
    df_buf b = {0};
    df_buf_puts(&b, "root ::= \"<call>\" args-root \"</call>\"\n");
    char err[256];
    CHECK(!df_json_schema_to_grammar(schema, strlen(schema), "args-", &b, err, sizeof err), "prefix: %s", err);
    df_grammar *g = NULL;
    CHECK(!df_grammar_compile(b.p, b.len, "root", &g, err, sizeof err), "composed grammar: %s", err);
    df_gvocab *v = byte_vocab();
    if (g) {
        CHECK(judge(g, v, "<call>{\"x\": -12}</call>") == 1, "composed grammar rejects a valid call");
        CHECK(judge(g, v, "<call>{\"x\": \"a\"}</call>") == -1, "composed grammar accepts a wrong argument");
    }
    df_grammar_free(g);
    df_gvocab_free(v);
    df_buf_free(&b);
    /* recursion through $defs */
    const char *rec = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                      "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\",\"kids\"],"
                      "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
    df_buf r = {0};
    CHECK(!df_json_schema_to_grammar(rec, strlen(rec), "", &r, err, sizeof err), "recursive schema: %s", err);
    g = NULL;
    CHECK(!df_grammar_compile(r.p, r.len, "root", &g, err, sizeof err), "recursive grammar: %s", err);
    v = byte_vocab();
    if (g) {
        CHECK(judge(g, v, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}") == 1, "recursive: valid rejected");
        CHECK(judge(g, v, "{\"v\":1,\"kids\":[{\"v\":2}]}") == -1, "recursive: missing kids accepted");
    }
    df_grammar_free(g);
    df_gvocab_free(v);
    df_buf_free(&r);
}

/* Compiling is linear in the grammar: 4,000 chained rules, inlined or all
 * mutually recursive, compile in well under a second (the first version took
 * 100 s on the chain, quadratic inlining checks and a cubic closure: a
 * request with such a schema could hold the server). */
static void test_big_rule_graphs(void) {
    for (int rec = 0; rec < 2; rec++) {
        df_buf b = {0};
        df_buf_puts(&b, "root ::= r0\n");
        for (int i = 0; i < 3999; i++) df_buf_printf(&b, "r%d ::= \"a\" r%d | \"b\"\n", i, i + 1);
        df_buf_printf(&b, "r3999 ::= \"c\"%s\n", rec ? " r0 | \"d\"" : "");
        char err[256];
        df_grammar *g = NULL;
        double t0 = df_now();
        int rc = df_grammar_compile(b.p, b.len, "root", &g, err, sizeof err);
        double dt = df_now() - t0;
        CHECK(!rc, "chain of 4000 rules (recursive %d): %s", rec, err);
        CHECK(dt < 5.0, "chain of 4000 rules (recursive %d) took %.1f s to compile", rec, dt);
        df_gvocab *v = byte_vocab();
        if (g) CHECK(judge(g, v, "aaab") == 1 && judge(g, v, "aaaa") == 0 && judge(g, v, "ac") == -1, "chain grammar meaning");
        df_gvocab_free(v);
        df_grammar_free(g);
        df_buf_free(&b);
    }
}

/* A grammar whose live positions double with each byte is refused while
 * matching (never an unbounded set of stacks). */
static void test_ambiguity_limit(void) {
    char err[256];
    df_grammar *g = compile("root ::= r\nr ::= \"a\" r \"b\" | \"a\" r \"c\" | \"\"", err, sizeof err);
    CHECK(g, "ambiguous grammar: %s", err);
    df_gvocab *v = byte_vocab();
    df_gmatch *m = g && v ? df_gmatch_new(g, v, err, sizeof err) : NULL;
    int rc = 0, i;
    for (i = 0; m && i < 40 && !rc; i++) rc = df_gmatch_accept_bytes(m, "a", 1);
    CHECK(rc == DF_EUNSUPPORTED && m && strstr(df_gmatch_error(m), "too ambiguous"), "rc %d after %d bytes: %s", rc, i,
          m ? df_gmatch_error(m) : err);
    CHECK(i > 8, "the limit hit too early (%d bytes)", i);
    df_gmatch_free(m);
    df_gvocab_free(v);
    df_grammar_free(g);
}

/* Open-ended repetitions keep one copy of their body per loop: (x*)+ over
 * a recursive rule once kept 2^depth equal-meaning stacks (two return nodes
 * per level) and was refused as too ambiguous after 12 bytes (a fuzz find).
 * Their meaning is checked against the counts they allow. */
static void test_nested_repetition(void) {
    char err[256];
    df_gvocab *v = byte_vocab();
    df_grammar *g = compile("root ::= \"a\" x* | \"b\"\nx ::= \"a\" x*+ \")\"", err, sizeof err);
    CHECK(g, "nested repetition: %s", err);
    df_gmatch *m = g && v ? df_gmatch_new(g, v, err, sizeof err) : NULL;
    int rc = 0, i;
    for (i = 0; m && i < 300 && !rc; i++) rc = df_gmatch_accept_bytes(m, "a", 1);
    CHECK(m && !rc, "(x*)+: rc %d after %d bytes: %s", rc, i, m ? df_gmatch_error(m) : err);
    df_gmatch_free(m);
    if (g) CHECK(judge(g, v, "aa)") == 1 && judge(g, v, "aaa))") == 1 && judge(g, v, "aa)a)") == 1 && judge(g, v, "a)") == -1 &&
                     judge(g, v, "aa))") == -1 && judge(g, v, "aaa)") == 0,
                 "(x*)+ meaning");
    df_grammar_free(g);
    static const struct { const char *g; int lo, hi; } reps[] = {
        {"root ::= \"a\"+", 1, -1}, {"root ::= \"a\"{3,}", 3, -1}, {"root ::= \"a\"{2,4}", 2, 4},
        {"root ::= (\"a\"?)+", 0, -1}, {"root ::= (\"a\" | \"\")+", 0, -1}, {"root ::= (\"a\"{2})+", -2, -1},
    };
    for (size_t r = 0; r < sizeof reps / sizeof *reps; r++) {
        g = compile(reps[r].g, err, sizeof err);
        CHECK(g, "%s: %s", reps[r].g, err);
        if (!g) continue;
        char text[16] = {0};
        for (int n = 0; n < 12; n++) {
            memset(text, 'a', (size_t)n);
            text[n] = 0;
            int want = reps[r].lo == -2 ? (n >= 2 && n % 2 == 0 ? 1 : 0)
                                        : (n >= reps[r].lo && (reps[r].hi < 0 || n <= reps[r].hi) ? 1 : reps[r].hi >= 0 && n > reps[r].hi ? -1 : 0);
            CHECK(judge(g, v, text) == want, "%s on %d a's: %d, want %d", reps[r].g, n, judge(g, v, text), want);
        }
        df_grammar_free(g);
    }
    df_gvocab_free(v);
}

/* Nested optional repetitions make each byte's closure as wide as the
 * repetition: (x?){1000} costs ~1000 steps per trie node of every cache. A
 * call past the matcher's work limit is refused with a message, the state
 * unchanged; under the limit the masks are exact. (A fuzz find: 296 copies
 * took 10 s per input in the fuzz build.) */
static void test_work_limit(void) {
    char err[256];
    df_gvocab *v = byte_vocab();
    df_grammar *g = compile("root ::= [a-z]?{1000} \"!\"", err, sizeof err);
    CHECK(g, "[a-z]?{1000}: %s", err);
    df_gmatch *m = g && v ? df_gmatch_new(g, v, err, sizeof err) : NULL;
    CHECK(m, "matcher: %s", err);
    if (m) {
        df_gmatch_set_work_limit(m, 1000000);
        uint32_t bits[8];
        int rc = df_gmatch_mask(m, bits);
        CHECK(rc == DF_EUNSUPPORTED && strstr(df_gmatch_error(m), "parse steps for one token"), "mask past the limit: rc %d %s",
              rc, df_gmatch_error(m));
        rc = df_gmatch_accept_bytes(m, "ab", 2);
        CHECK(rc == 0, "accept after a refused mask: rc %d %s", rc, df_gmatch_error(m));
        rc = df_gmatch_accept_bytes(m, "!", 1);
        CHECK(rc == 0 && df_gmatch_complete(m), "the document completes: rc %d %s", rc, df_gmatch_error(m));
    }
    df_gmatch_free(m);
    df_grammar_free(g);
    g = compile("root ::= [a-z]?{40} \"!\"", err, sizeof err);
    m = g && v ? df_gmatch_new(g, v, err, sizeof err) : NULL;
    if (m) {
        uint32_t bits[8], want[8] = {0};
        for (int c = 'a'; c <= 'z'; c++) want[c >> 5] |= 1u << (c & 31);
        want['!' >> 5] |= 1u << ('!' & 31);
        int rc = df_gmatch_mask(m, bits);
        CHECK(rc == 0 && !memcmp(bits, want, sizeof bits), "[a-z]?{40} mask: rc %d %s", rc, df_gmatch_error(m));
    } else CHECK(0, "[a-z]?{40}: %s", err);
    df_gmatch_free(m);
    df_grammar_free(g);
    df_gvocab_free(v);
}

/* The process-wide cache: equal texts share one grammar; a grammar evicted
 * while in use stays alive for its holder. */
static void test_compile_cached(void) {
    char err[256], text[64];
    df_grammar *a = NULL, *b = NULL, *c = NULL;
    CHECK(!df_grammar_compile_cached("root ::= \"x\"+", 13, "root", &a, err, sizeof err), "cached: %s", err);
    CHECK(!df_grammar_compile_cached("root ::= \"x\"+", 13, "root", &b, err, sizeof err), "cached: %s", err);
    CHECK(a && a == b, "equal texts must share one grammar");
    CHECK(!df_grammar_compile_cached("root ::= \"y\"+", 13, "root", &c, err, sizeof err) && c != a, "other text, other grammar");
    df_grammar_free(b);
    df_grammar_free(c);
    for (int i = 0; i < 10; i++) { /* evict a */
        df_grammar *t = NULL;
        snprintf(text, sizeof text, "root ::= \"%d\"", i);
        CHECK(!df_grammar_compile_cached(text, strlen(text), "root", &t, err, sizeof err), "cached %d: %s", i, err);
        df_grammar_free(t);
    }
    df_gvocab *v = byte_vocab();
    CHECK(a && judge(a, v, "xxx") == 1, "a grammar evicted from the cache must stay usable by its holder");
    df_gvocab_free(v);
    df_grammar_free(a);
    CHECK(df_grammar_compile_cached("root ::= (", 10, "root", &a, err, sizeof err) < 0 && !a, "errors are not cached");
}

/* ---- helper modes --------------------------------------------------------- */

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    df_buf b = {0};
    char tmp[65536];
    size_t k;
    while ((k = fread(tmp, 1, sizeof tmp, f))) df_buf_put(&b, tmp, k);
    fclose(f);
    *n = b.len;
    return b.p ? b.p : strdup("");
}

static df_grammar *schema_grammar(const char *path) {
    size_t n;
    char *s = slurp(path, &n), err[512];
    if (!s) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    df_buf b = {0};
    df_grammar *g = NULL;
    if (df_json_schema_to_grammar(s, n, "", &b, err, sizeof err) || df_grammar_compile(b.p, b.len, "root", &g, err, sizeof err)) {
        printf("%s\n", err);
        exit(2);
    }
    free(s);
    df_buf_free(&b);
    return g;
}

static int mode_check(const char *schema, const char *docs, int prefix) {
    df_grammar *g = schema_grammar(schema);
    df_gvocab *v = byte_vocab();
    json_error_t je;
    json_t *a = json_load_file(docs, 0, &je);
    if (!a) { fprintf(stderr, "%s: %s\n", docs, je.text); return 2; }
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *d = json_array_get(a, i);
        char *txt = strndup(json_string_value(d), json_string_length(d));
        int r = judge(g, v, txt);
        printf("%d\n", prefix ? r >= 0 : r == 1);
        free(txt);
    }
    json_decref(a);
    df_gvocab_free(v);
    df_grammar_free(g);
    return 0;
}

/* Random documents: random allowed bytes, steering towards the end after a budget. */
static int mode_gen(const char *schema, uint64_t seed, int count) {
    df_grammar *g = schema_grammar(schema);
    df_gvocab *v = byte_vocab();
    rng_state = seed * 2654435761u + 1;
    json_t *out = json_array();
    uint32_t bits[8];
    char err[256];
    for (int d = 0; d < count; d++) {
        df_gmatch *m = df_gmatch_new(g, v, err, sizeof err);
        df_buf doc = {0};
        int budget = 20 + (int)(rnd() % 60);
        for (int step = 0; step < 20000; step++) {
            if (df_gmatch_done(m) || (df_gmatch_complete(m) && (step > budget || rnd() % 8 == 0))) break;
            df_gmatch_mask(m, bits);
            int cand[256], nc = 0, pref[256], np = 0;
            for (int t = 0; t < 256; t++)
                if (bits[t >> 5] >> (t & 31) & 1) {
                    cand[nc++] = t;
                    if (!strchr(",[{\\ \n\t\r", t) && t) pref[np++] = t;
                }
            if (!nc) break;
            int t;
            if (step > budget) {
                int close = -1;
                for (int i = 0; i < np && close < 0; i++)
                    if (strchr("\"}]0", pref[i])) close = pref[i];
                t = close >= 0 ? close : np ? pref[rnd() % (uint64_t)np] : cand[rnd() % (uint64_t)nc];
            } else t = cand[rnd() % (uint64_t)nc];
            df_gmatch_accept(m, t);
            char ch = (char)t;
            df_buf_put(&doc, &ch, 1);
        }
        json_array_append_new(out, json_stringn(doc.p ? doc.p : "", doc.len));
        df_buf_free(&doc);
        df_gmatch_free(m);
    }
    char *s = json_dumps(out, 0);
    printf("%s\n", s);
    free(s);
    json_decref(out);
    df_gvocab_free(v);
    df_grammar_free(g);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--check")) return mode_check(argv[2], argv[3], 0);
    if (argc == 4 && !strcmp(argv[1], "--prefix")) return mode_check(argv[2], argv[3], 1);
    if (argc == 5 && !strcmp(argv[1], "--gen")) return mode_gen(argv[2], strtoull(argv[3], NULL, 10), atoi(argv[4]));
    if (argc == 3 && !strcmp(argv[1], "--schema")) {
        size_t n;
        char *s = slurp(argv[2], &n), err[512];
        df_buf b = {0};
        if (!s || df_json_schema_to_grammar(s, n, "", &b, err, sizeof err)) { printf("%s\n", s ? err : "cannot read"); return 2; }
        fwrite(b.p, 1, b.len, stdout);
        return 0;
    }
    test_accept_reject();
    test_errors();
    test_schema_refusals();
    test_compile_cached();
    test_ambiguity_limit();
    test_nested_repetition();
    test_work_limit();
    test_big_rule_graphs();
    test_masks_small();
    test_masks_qwen3();
    if (failures) { fprintf(stderr, "%d failures\n", failures); return 1; }
    printf("test_grammar: all passed\n");
    return 0;
}
