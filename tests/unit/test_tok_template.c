/* test_tok_template.c - unit tests of the chat-template renderer
 * (src/tok/template*.c): rendering against expected bytes (taken from
 * jinja2 as transformers configures it), error codes and messages, resource
 * limits, and the chat helpers. Exits non-zero on any failure. */
#include "deltafin.h"
#include "tok/template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, checks;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        checks++;                                                               \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* Renders src with ctx and compares with want (NULL: expect an error whose
 * code is want_rc and whose message contains needle). */
static void expect(const char *src, const char *ctx, const char *want, int want_rc, const char *needle) {
    char err[512] = "";
    df_template *t = df_template_parse(src, err, sizeof err);
    if (!t) {
        CHECK(!want && want_rc == DF_EINPUT && (!needle || strstr(err, needle)), "parse of %s failed: %s", src, err);
        return;
    }
    char *out = NULL;
    size_t len = 0;
    int rc = df_template_render(t, ctx, &out, &len, err, sizeof err);
    if (want) {
        CHECK(rc == 0, "render of %s failed: %s", src, err);
        if (rc == 0) CHECK(len == strlen(want) && !memcmp(out, want, len), "%s\n  got  [%s]\n  want [%s]", src, out, want);
    } else {
        CHECK(rc == want_rc, "%s: rc %d, want %d (%s)", src, rc, want_rc, err);
        CHECK(!needle || strstr(err, needle), "%s: message [%s] lacks [%s]", src, err, needle);
        CHECK(out == NULL, "%s: output on error", src);
        CHECK(!strchr(err, '\n'), "%s: multi-line message", src);
    }
    free(out);
    df_template_free(t);
}

static void test_basics(void) {
    const char *C = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}],"
                    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"n\":3,\"f\":2.5,\"z\":null}";
    expect("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m['content'] }}{% endfor %}", C, "<s><user>hi<assistant>yo", 0, NULL);
    expect("{{ n + 1 }} {{ n / 2 }} {{ n // 2 }} {{ -n % 2 }} {{ f * 2 }} {{ z }} {{ true }} {{ [1, 'a', none] }}", C,
           "4 1.5 1 1 5.0 None True [1, 'a', None]", 0, NULL);
    expect("{{ {'a': \"it's\", 'b': 'x\\ny'} }}", C, "{'a': \"it's\", 'b': 'x\\ny'}", 0, NULL);
    expect("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ 2.0 ** 0.5 }}", C,
           "1e+16 1000000000000000.0 0.0001 1e-05 0.3333333333333333 1.4142135623730951", 0, NULL);
    expect("{{ messages[::-1]|map(attribute='role')|join(',') }} {{ 'héllo'[::-1] }} {{ messages|length }}", C,
           "assistant,user olléh 2", 0, NULL);
    expect("{% set ns = namespace(x=0) %}{% for i in range(4) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", C, "6", 0, NULL);
    expect("{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}",
           C, "0TrueFalse22|1FalseTrue21|", 0, NULL);
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}", C, "a1b2", 0, NULL);
    expect("{% for i in [1, 2, 3, 4] if i is even %}{{ i }}{% else %}none{% endfor %}{% for i in [] %}x{% else %}E{% endfor %}", C,
           "24E", 0, NULL);
    expect("{% for i in range(9) %}{% if i == 2 %}{% continue %}{% elif i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", C,
           "0134", 0, NULL);
    expect("{{ x is defined }}{{ x is undefined }}{{ z is none }}{{ 'a' is string }}{{ n is number }}{{ {} is mapping }}", C,
           "FalseTrueTrueTrueTrueTrue", 0, NULL);
    expect("[{{ x }}][{{ x|default('d') }}][{{ x|length }}][{{ 'a' in x }}]", C, "[][d][0][False]", 0, NULL);
    expect("{{ '  a b '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'abc'.startswith('ab') }}|{{ 'x\\n'.rstrip('\\n') }}|{{ 'AbC'.lower() }}", C,
           "a b|['a', 'b']|True|x|abc", 0, NULL);
    expect("{{ {'b': [1, 2.5, none, true], 'a': 'é\"'}|tojson }}", C, "{\"b\": [1, 2.5, null, true], \"a\": \"é\\\"\"}", 0, NULL);
    expect("{{ {'a': [1]}|tojson(indent=2) }}", C, "{\n  \"a\": [\n    1\n  ]\n}", 0, NULL);
    expect("{{ {'b': 1, 'a': 2}|tojson(separators=(',', ':'), sort_keys=true) }}", C, "{\"a\":2,\"b\":1}", 0, NULL);
    expect("{{ 'é😀'|tojson(ensure_ascii=true) }}", C, "\"\\u00e9\\ud83d\\ude00\"", 0, NULL);
    expect("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", C, "[1B][23]", 0, NULL);
    expect("{% set x %}in{{ 1 }}{% endset %}{{ x }}|{% filter upper %}abc{% endfilter %}", C, "in1|ABC", 0, NULL);
    expect("{% raw %}{{ x }}{% endraw %}{# gone #}", C, "{{ x }}", 0, NULL);
}

static void test_whitespace(void) {
    const char *C = "{}";
    /* trim_blocks + lstrip_blocks, as transformers configures jinja2 */
    expect("a\n  {% if true %}\n  b\n  {% endif %}\nc", C, "a\n  b\nc", 0, NULL);
    expect("a  {%- if true -%}  b  {%- endif -%}  c", C, "abc", 0, NULL);
    expect("x\n  {{ 1 }}\n{# c #}\ny", C, "x\n  1\ny", 0, NULL);
    expect("{%+ if true %}p{% endif %}", C, "p", 0, NULL);
    expect("  {%+ if true %}p{% endif +%}\nq", C, "  p\nq", 0, NULL);
    expect("a\r\nb\r\n", C, "a\nb", 0, NULL);
    expect("end\n\n", C, "end\n", 0, NULL);
    expect("{{- ' x ' -}}\n", C, " x ", 0, NULL);
}

static void test_errors(void) {
    const char *C = "{\"messages\":[{\"role\":\"user\"}]}";
    expect("{{ raise_exception('Only user and assistant roles are supported!') }}", C, NULL, DF_EINPUT,
           "Only user and assistant roles are supported!");
    char err[256];
    df_template *t = df_template_parse("{{ raise_exception('exact message') }}", err, sizeof err);
    CHECK(t != NULL, "parse");
    char *out = NULL;
    size_t len;
    int rc = df_template_render(t, "{}", &out, &len, err, sizeof err);
    CHECK(rc == DF_EINPUT && !strcmp(err, "exact message"), "raise_exception message is exact: [%s]", err);
    df_template_free(t);
    expect("{{ nope.x }}", C, NULL, DF_EINPUT, "'nope' is undefined");
    expect("{{ messages[0].content.strip() }}", C, NULL, DF_EINPUT, "has no attribute 'content'");
    expect("\n{{ 1 + 'a' }}", C, NULL, DF_EINPUT, "template line 2");
    expect("{{ 1 // 0 }}", C, NULL, DF_EINPUT, "division");
    expect("{{ 9223372036854775807 + 1 }}", C, NULL, DF_EUNSUPPORTED, "overflow");
    expect("{% include 'x' %}", C, NULL, DF_EINPUT, "line 1, column 4: unsupported tag 'include'");
    expect("a\n{{ x|nosuch }}", C, NULL, DF_EINPUT, "line 2");
    expect("{% if x %}", C, NULL, DF_EINPUT, "endif");
    expect("{{ x", C, NULL, DF_EINPUT, "not closed");
    expect("{{ [1, 2) }}", C, NULL, DF_EINPUT, "unexpected ')'");
    expect("{% for x in y recursive %}{% endfor %}", C, NULL, DF_EINPUT, "recursive");
    /* bad context */
    t = df_template_parse("x", err, sizeof err);
    rc = df_template_render(t, "[1]", &out, &len, err, sizeof err);
    CHECK(rc == DF_EINPUT && strstr(err, "object"), "context must be an object: %s", err);
    rc = df_template_render(t, "{bad", &out, &len, err, sizeof err);
    CHECK(rc == DF_EINPUT && strstr(err, "context JSON"), "bad context JSON: %s", err);
    df_template_free(t);
    /* invalid UTF-8 source */
    t = df_template_parse("\xff\xfe", err, sizeof err);
    CHECK(t == NULL && strstr(err, "UTF-8"), "invalid UTF-8: %s", err);
    df_template_free(NULL);
}

static void test_limits(void) {
    char err[256];
    char *out = NULL;
    size_t len;
    df_template *t = df_template_parse("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", err, sizeof err);
    CHECK(t != NULL, "parse");
    df_template_set_limits(t, 0, 0, 100000);
    int rc = df_template_render(t, "{}", &out, &len, err, sizeof err);
    CHECK(rc == DF_EINPUT && strstr(err, "step budget of 100000 exceeded"), "step limit: %d %s", rc, err);
    df_template_free(t);
    t = df_template_parse("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", err, sizeof err);
    df_template_set_limits(t, 1 << 20, 0, 0);
    rc = df_template_render(t, "{}", &out, &len, err, sizeof err);
    CHECK(rc == DF_EINPUT && strstr(err, "output budget of 1048576 bytes exceeded"), "output limit: %d %s", rc, err);
    df_template_free(t);
    t = df_template_parse("{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s + 'xxxxxxxxxxxxxxxx' %}{% endfor %}",
                          err, sizeof err);
    df_template_set_limits(t, 0, 8 << 20, 0);
    rc = df_template_render(t, "{}", &out, &len, err, sizeof err);
    CHECK(rc == DF_EINPUT && strstr(err, "memory budget of 8388608 bytes exceeded"), "memory limit: %d %s", rc, err);
    df_template_free(t);
    t = df_template_parse("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", err, sizeof err);
    rc = df_template_render(t, "{}", &out, &len, err, sizeof err);
    CHECK(rc == DF_EINPUT && strstr(err, "nested deeper than 256 levels"), "recursion limit: %d %s", rc, err);
    df_template_free(t);
    /* deep nesting in the source is a parse error, not a stack overflow */
    char *deep = malloc(20000);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 5000; i++) strcat(deep, "(");
    t = df_template_parse(deep, err, sizeof err);
    CHECK(t == NULL && strstr(err, "nested deeper than 256 levels"), "deep nesting: %s", err);
    free(deep);
}

/* Builds "pre" + n times "unit" + "post" (malloc'd). */
static char *repeat_src(const char *pre, const char *unit, size_t n, const char *post) {
    size_t lp = strlen(pre), lu = strlen(unit), lq = strlen(post);
    char *s = malloc(lp + lu * n + lq + 1);
    memcpy(s, pre, lp);
    for (size_t i = 0; i < n; i++) memcpy(s + lp + i * lu, unit, lu);
    memcpy(s + lp + lu * n, post, lq + 1);
    return s;
}

/* Issue 18: hostile templates from a model repository end in a clear error
 * (DF_EINPUT, a message naming the limit) in bounded time and memory, with
 * the default limits; they used to overflow the C stack or run for minutes. */
static void test_hostile(void) {
    const char *C = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    /* long operator / filter / attribute / call chains build deep trees */
    char *s = repeat_src("{{ 1", "+1", 50000, " }}");
    expect(s, C, NULL, DF_EINPUT, "nesting deeper than 256 levels");
    free(s);
    s = repeat_src("{{ 'X'", "|lower", 100000, " }}");
    expect(s, C, NULL, DF_EINPUT, "nesting deeper than 256 levels");
    free(s);
    s = repeat_src("{{ messages", ".b", 100000, " }}");
    expect(s, C, NULL, DF_EINPUT, "nesting deeper than 256 levels");
    free(s);
    s = repeat_src("{{ x", "()", 100000, " }}");
    expect(s, C, NULL, DF_EINPUT, "nesting deeper than 256 levels");
    free(s);
    s = repeat_src("{{ 'a'", " ~ 'b' if x else 'c'", 20000, " }}");
    expect(s, C, NULL, DF_EINPUT, "nesting deeper than 256 levels");
    free(s);
    /* a huge flat template: its tokens are bounded by the memory budget
     * (they took about 24 bytes of parse memory per source byte, unbounded) */
    s = repeat_src("{{ 0", "+0", 4000000, " }}");
    {
        char perr[256];
        df_template *pt = df_template_parse(s, perr, sizeof perr);
        CHECK(pt == NULL && strstr(perr, "memory budget of 268435456 bytes exceeded"), "huge template: %s", perr);
        df_template_free(pt);
    }
    free(s);
    /* ...while 200 levels still render */
    s = repeat_src("{{ 0", "+1", 200, " }}");
    expect(s, C, "200", 0, NULL);
    free(s);
    /* values nested at run time: comparing, printing, serializing */
    const char *nest = "{% set ns = namespace(a=[], b=[]) %}{% for i in range(100000) %}{% set ns.a = [ns.a] %}"
                       "{% set ns.b = [ns.b] %}{% endfor %}";
    static const char *const uses[] = {"{{ ns.a == ns.b }}", "{{ ns.a }}", "{{ ns.a|tojson }}", "{{ ns.a < ns.b }}",
                                       "{{ ns.a in [ns.b] }}", "{{ [ns.a]|unique|list|length }}"};
    for (size_t i = 0; i < sizeof uses / sizeof *uses; i++) {
        char src[512];
        snprintf(src, sizeof src, "%s%s", nest, uses[i]);
        expect(src, C, NULL, DF_EINPUT, "value nesting deeper than 256 levels");
    }
    expect("{% set ns = namespace(d={}) %}{% for i in range(1000) %}{% set ns.d = {'k': ns.d} %}{% endfor %}", C, NULL,
           DF_EINPUT, "value nesting deeper than 256 levels");
    expect("{% set ns = namespace(d={}) %}{% for i in range(1000) %}{% set ns.d = dict(k=ns.d) %}{% endfor %}", C, NULL,
           DF_EINPUT, "value nesting deeper than 256 levels");
    /* a namespace holding itself prints as an error, not an endless recursion */
    expect("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", C, NULL, DF_EINPUT, "value nesting deeper than 256 levels");
    /* context JSON nested deeper than the limit */
    s = repeat_src("{\"x\":", "[", 1000, "");
    char *t2 = repeat_src(s, "]", 1000, "}");
    expect("{{ x|length }}", t2, NULL, DF_EINPUT, "chat context (messages, tools or variables) nested deeper than 256 levels");
    free(s);
    free(t2);
    /* string work counts against the step budget */
    expect("{% set s = 'a' * 10000000 %}{% for i in range(10000) %}{% if 'b' in s %}x{% endif %}{% endfor %}", C, NULL,
           DF_EINPUT, "step budget of 20000000 exceeded");
    expect("{% set s = 'a' * 10000000 %}{% for i in range(10000) %}{{ s.find('b') }}{% endfor %}", C, NULL, DF_EINPUT,
           "step budget of 20000000 exceeded");
    expect("{% set s = 'a' * 10000000 %}{% for i in range(10000) %}{% if s == s ~ '' %}{% endif %}{% endfor %}", C, NULL,
           DF_EINPUT, "exceeded");
    expect("{% set l = range(100000)|list %}{% for i in range(10000) %}{% if -1 in l %}{% endif %}{% endfor %}", C, NULL,
           DF_EINPUT, "step budget of 20000000 exceeded");
    expect("{{ (range(100000)|list)|unique|list|length }}", C, NULL, DF_EINPUT, "step budget of 20000000 exceeded");
    /* per-code-point work and searches are charged at their measured cost,
     * so 100000 passes over 1 MB end at the step budget (they took 2-4 s of
     * CPU each when every byte cost 1/64 of a step) */
    static const char *const passes[] = {"s.isalpha()", "s|title|length", "s.count('a')", "s.find('a' * 1000 + 'b')",
                                          "s.rfind('b' + 'a' * 1000)", "s[::-1]|length", "s|wordcount", "[s]|string|length"};
    for (size_t i = 0; i < sizeof passes / sizeof *passes; i++) {
        char src[512];
        snprintf(src, sizeof src, "{%% set s = 'a' * 1000000 %%}{%% for i in range(100000) %%}{{ %s }}{%% endfor %%}", passes[i]);
        expect(src, C, NULL, DF_EINPUT, "step budget of 20000000 exceeded");
    }
    /* ...and so do allocations: replace / join / repetition hit a budget */
    expect("{% set s = 'a' * 10000000 %}{% for i in range(10000) %}{% set t = s.replace('b', 'c') %}{% endfor %}", C, NULL,
           DF_EINPUT, "exceeded");
    expect("{% set l = ['a' * 1000000] * 10 %}{% for i in range(10000) %}{% set t = l|join %}{% endfor %}", C, NULL,
           DF_EINPUT, "exceeded");
    expect("{{ 'x' * 1000000000 }}", C, NULL, DF_EINPUT, "memory budget of 268435456 bytes exceeded");
    /* a 100000-key dict literal renders as in Python (hash index; it was
     * quadratic and took 22 s) */
    s = malloc(100000 * 16 + 64);
    size_t k = (size_t)sprintf(s, "{{ {");
    for (int i = 0; i < 100000; i++) k += (size_t)sprintf(s + k, "%s'k%d': %d", i ? "," : "", i, i);
    strcpy(s + k, "}|length }}");
    expect(s, C, "100000", 0, NULL);
    free(s);
    /* a big dict from the context (a client's message) sorted by tojson's
     * insertion sort: quadratic, charged per comparison */
    s = malloc(50000 * 24 + 64);
    k = (size_t)sprintf(s, "{\"d\":{");
    for (int i = 50000; i > 0; i--) k += (size_t)sprintf(s + k, "%s\"k%06d\":%d", i < 50000 ? "," : "", i, i);
    strcpy(s + k, "}}");
    expect("{{ d|tojson(sort_keys=true)|length }}", s, NULL, DF_EINPUT, "step budget of 20000000 exceeded");
    /* lookups in it go through the index, which catches up with the keys
     * the JSON reader appended directly */
    expect("{{ d['k000001'] }} {{ d.k050000 }} {{ 'k000000' in d }} {{ d.get('k025000') }} {{ d == d }}", s,
           "1 50000 False 25000 True", 0, NULL);
    /* scalar keys hash like they compare: 1 == 1.0 == True */
    expect("{% set d = {1: 'a', 2: 'b', 3: 'c', 4: 'd', 5: 'e', 6: 'f', 7: 'g', 8: 'h', 9: 'i', 1.0: 'x', True: 'y', "
           "'k': 1, (1, 2): 't', none: 'n', 2.5: 'f'} %}{{ d|length }} {{ d[1] }}{{ d[9.0] }}{{ d.get(true) }}{{ d.k }}"
           "{{ d[(1, 2)] }}{{ d[none] }}{{ d[2.5] }} {{ 10 in d }}{{ (1, 2) in d }}{{ 'K' in d }}", C,
           "13 yiy1tnf FalseTrueFalse", 0, NULL);
    free(s);
    /* %-formatting: exact output, refused beyond the width limit */
    char want[700];
    snprintf(want, sizeof want, "%.600f", 1.5);
    CHECK(strlen(want) == 602, "libc %%.600f");
    expect("{{ '%.600f' % 1.5 }}", C, want, 0, NULL);
    expect("{{ '%.1000000000f' % 1.5 }}", C, NULL, DF_EINPUT, "precision exceeds the limit of 100000");
    expect("{{ '%1000000000d' % 1 }}", C, NULL, DF_EINPUT, "width exceeds the limit of 100000");
    expect("{{ '%99999999999999999999s' % 'x' }}", C, NULL, DF_EINPUT, "width exceeds the limit of 100000");
    expect("[{{ '%5s|%-5s|%.2s|%5.1s' % ('é', 'é', 'éèê', 'éè') }}]", C, "[    é|é    |éè|    é]", 0, NULL);
    /* center and indent refused widths above the limit by silently returning
     * the input (center) or clamping to 10000 (indent) */
    expect("{{ 'x'|center(1000000000) }}", C, NULL, DF_EINPUT, "center width 1000000000 exceeds the limit of 100000");
    expect("{{ 'a\nb'|indent(1000000000) }}", C, NULL, DF_EINPUT, "indent width 1000000000 exceeds the limit of 100000");
    expect("{{ 'x'|center(5) }}|{{ 'a\nb'|indent(3) }}", C, "  x  |a\n   b", 0, NULL);
    char pad[700];
    snprintf(pad, sizeof pad, "[%600d]", 7);
    expect("[{{ '%600d' % 7 }}]", C, pad, 0, NULL);
}

static void test_chat_helpers(void) {
    char err[256];
    char *src = NULL, *sp = NULL, *ctx = NULL;
    const char *cfg = "{\"chat_template\":[{\"name\":\"default\",\"template\":\"D\"},{\"name\":\"tool_use\",\"template\":\"T\"}],"
                      "\"bos_token\":{\"content\":\"<B>\"},\"eos_token\":\"<E>\",\"unk_token\":null}";
    int rc = df_chat_config_parse(cfg, "cfg.json", 0, &src, &sp, err, sizeof err);
    CHECK(rc == 0 && !strcmp(src, "D") && !strcmp(sp, "{\"bos_token\":\"<B>\",\"eos_token\":\"<E>\"}"), "config: %s %s", src, sp);
    free(src);
    free(sp);
    rc = df_chat_config_parse(cfg, "cfg.json", 1, &src, NULL, err, sizeof err);
    CHECK(rc == 0 && !strcmp(src, "T"), "tool_use template");
    free(src);
    rc = df_chat_config_parse("{\"chat_template\": 3}", "cfg.json", 0, &src, &sp, err, sizeof err);
    CHECK(rc == DF_EFORMAT && strstr(err, "cfg.json") && strstr(err, "chat_template") && !src, "bad template field: %s", err);
    rc = df_chat_context_build("[{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":null,\"reasoning\":\"r\"}]", NULL, 1,
                               "{\"eos_token\":\"<E>\"}", "{\"enable_thinking\":false}", &ctx, err, sizeof err);
    CHECK(rc == 0, "context: %s", err);
    if (!rc) {
        /* null values stay null (None in the template, issue 14); key order as transformers' aliasing */
        const char *want = "{\"eos_token\":\"<E>\",\"messages\":[{\"thinking\":\"r\",\"role\":\"assistant\",\"content\":\"a\","
                           "\"tool_calls\":null,\"reasoning\":\"r\",\"reasoning_content\":\"r\"}],\"tools\":null,\"documents\":null,"
                           "\"add_generation_prompt\":true,\"enable_thinking\":false}";
        CHECK(!strcmp(ctx, want), "context:\n  got  %s\n  want %s", ctx, want);
    }
    free(ctx);
    rc = df_chat_context_build("[]", NULL, 0, NULL, NULL, &ctx, err, sizeof err);
    CHECK(rc == DF_EINPUT && strstr(err, "empty"), "empty conversation: %s", err);
}

int main(void) {
    test_basics();
    test_whitespace();
    test_errors();
    test_limits();
    test_hostile();
    test_chat_helpers();
    printf("test_tok_template: %d checks, %d failures\n", checks, failures);
    return failures != 0;
}
