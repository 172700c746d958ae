/* test_server_toolcall.c - src/server/toolcall.c: the output of each model
 * family (with its real special-token strings) split into content,
 * reasoning and tool calls; fed whole and one byte at a time (streaming
 * must give the same result, and never pass on part of a marker); malformed
 * calls kept as content; family detection; the grammar of a call, compiled:
 * what it accepts and rejects, and that the parser reads what it accepts. */
#include "server/toolcall.h"
#include "grammar/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

#define DS(x) "<\xef\xbd\x9c" x "\xef\xbd\x9c>"
#define DSB DS("tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin")
#define DSE DS("tool\xe2\x96\x81" "calls\xe2\x96\x81" "end")
#define DCB DS("tool\xe2\x96\x81" "call\xe2\x96\x81" "begin")
#define DCE DS("tool\xe2\x96\x81" "call\xe2\x96\x81" "end")
#define DSEP DS("tool\xe2\x96\x81" "sep")

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\"}}]";

typedef struct {
    const char *content, *reasoning;
    int n;
    const char *names[3], *args[3], *ids[3];
} want;

/* Runs text through a parser fed with pieces of `step` bytes (0: whole). */
static df_tc *parse(df_tc_family f, int think, int in_think, const char *text, size_t step) {
    df_tc_config c = {.fam = f, .think = think, .in_think = in_think, .tools = 1, .tools_json = TOOLS, .id_seed = 42};
    df_tc *p = df_tc_new(&c);
    size_t n = strlen(text);
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n; i += step) {
        df_tc_feed(p, text + i, i + step <= n ? step : n - i);
        /* what is passed on never ends with the start of a marker (it is held back until decided) */
        size_t cl;
        const char *ct = df_tc_content(p, &cl);
        for (size_t k = 1; k < 11 && k <= cl; k++)
            CHECK(memcmp(ct + cl - k, "<tool_call>", k), "partial marker passed on: %.*s", (int)cl, ct);
    }
    df_tc_finish(p);
    return p;
}

static void expect(const char *what, df_tc_family f, int think, int in_think, const char *text, const want *w) {
    for (size_t step = 0; step <= 3; step++) {
        df_tc *p = parse(f, think, in_think, text, step);
        size_t cl, rl;
        const char *c = df_tc_content(p, &cl), *r = df_tc_reasoning(p, &rl);
        CHECK(cl == strlen(w->content) && !memcmp(c, w->content, cl), "%s/%zu: content %.*s, want %s", what, step, (int)cl, c, w->content);
        CHECK(rl == strlen(w->reasoning) && !memcmp(r, w->reasoning, rl), "%s/%zu: reasoning %.*s, want %s", what, step, (int)rl, r,
              w->reasoning);
        CHECK(df_tc_n_calls(p) == (size_t)w->n, "%s/%zu: %zu calls, want %d", what, step, df_tc_n_calls(p), w->n);
        for (int i = 0; i < w->n && i < (int)df_tc_n_calls(p); i++) {
            const df_tc_call *k = df_tc_call_at(p, (size_t)i);
            CHECK(!strcmp(k->name, w->names[i]), "%s: call %d name %s", what, i, k->name);
            CHECK(!strcmp(k->args, w->args[i]), "%s: call %d args %s, want %s", what, i, k->args, w->args[i]);
            if (w->ids[i]) CHECK(!strcmp(k->id, w->ids[i]), "%s: call %d id %s", what, i, k->id);
            else CHECK(!strncmp(k->id, "call_", 5) && strlen(k->id) == 29, "%s: call %d id %s", what, i, k->id);
            for (int j = 0; j < i; j++) CHECK(strcmp(k->id, df_tc_call_at(p, (size_t)j)->id), "%s: ids not unique", what);
        }
        df_tc_free(p);
    }
}

static void test_families(void) {
    /* Qwen3 / Hermes, with a think block that the generation prompt did not open */
    expect("hermes", DF_TC_HERMES, 1, 0,
           "<think>\nI need the weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
           "<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}\n</tool_call>",
           &(want){"Let me check.\n\n", "I need the weather.", 2, {"get_weather", "search"}, {"{\"city\":\"Paris\"}", "{\"q\":\"x\"}"}, {0}});
    /* output starting inside <think> (DeepSeek-R1, Qwen3 when the prompt opens it) */
    expect("r1", DF_TC_DEEPSEEK, 1, 1, "Thinking...\n</think>\n\nThe answer is 4.",
           &(want){"The answer is 4.", "Thinking...", 0, {0}, {0}, {0}});
    /* DeepSeek-V3 / R1 */
    expect("deepseek", DF_TC_DEEPSEEK, 1, 0,
           DSB DCB "function" DSEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DCE "\n" DCB "function" DSEP
           "search\n```json\n{}\n```" DCE DSE,
           &(want){"", "", 2, {"get_weather", "search"}, {"{\"city\":\"Paris\"}", "{}"}, {0}});
    /* DeepSeek-V3.1 */
    expect("deepseek31", DF_TC_DEEPSEEK, 0, 0, "ok " DSB DCB "search" DSEP "{\"q\": 1}" DCE DSE,
           &(want){"ok ", "", 1, {"search"}, {"{\"q\":1}"}, {0}});
    /* Kimi K2: native ids kept */
    expect("kimi_k2", DF_TC_KIMI_K2, 1, 0,
           "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"北京\"}"
           "<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{\"q\": \"a\"}<|tool_call_end|><|tool_calls_section_end|>",
           &(want){"Checking.", "", 2, {"get_weather", "search"}, {"{\"city\":\"北京\"}", "{\"q\":\"a\"}"},
                   {"functions.get_weather:0", "functions.search:1"}});
    /* Kimi K3: think part, response part, typed arguments, the json form, the closing structure dropped */
    expect("kimi_k3", DF_TC_KIMI_K3, 1, 1,
           "Need weather.<|close|>think<|sep|><|open|>response<|sep|>Sure.<|close|>response<|sep|><|open|>tools<|sep|>"
           "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>Beijing"
           "<|close|>argument<|sep|><|open|>argument key=\"days\" type=\"integer\"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|>"
           "<|open|>call tool=\"search\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"q\": \"a&b\"}<|close|>json<|sep|>"
           "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>",
           &(want){"Sure.", "Need weather.", 2, {"get_weather", "search"}, {"{\"city\":\"Beijing\",\"days\":2}", "{\"q\":\"a&b\"}"}, {0}});
    /* Llama 3.x JSON (the whole output) */
    expect("llama3", DF_TC_LLAMA3, 0, 0, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
           &(want){"", "", 1, {"get_weather"}, {"{\"city\":\"Rome\"}"}, {0}});
    expect("llama3_text", DF_TC_LLAMA3, 0, 0, "Hello {\"name\": 1}", &(want){"Hello {\"name\": 1}", "", 0, {0}, {0}, {0}});
    expect("llama3_python_tag", DF_TC_LLAMA3, 0, 0, "<|python_tag|>{\"name\": \"search\", \"parameters\": {}}",
           &(want){"", "", 1, {"search"}, {"{}"}, {0}});
    /* Mistral, both forms */
    expect("mistral", DF_TC_MISTRAL, 0, 0, "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q\": \"z\"}}, {\"name\": \"get_weather\", \"arguments\": {}}]",
           &(want){"", "", 2, {"search", "get_weather"}, {"{\"q\":\"z\"}", "{}"}, {0}});
    expect("mistral11", DF_TC_MISTRAL, 0, 0, "[TOOL_CALLS]search[ARGS]{\"q\": \"z\"}",
           &(want){"", "", 1, {"search"}, {"{\"q\":\"z\"}"}, {0}});
}

static void test_malformed(void) {
    /* bad JSON, an undeclared tool, arguments not an object, an unfinished call: all content, unchanged */
    const char *bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
    expect("bad_json", DF_TC_HERMES, 0, 0, bad, &(want){bad, "", 0, {0}, {0}, {0}});
    const char *undeclared = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>";
    expect("undeclared", DF_TC_HERMES, 0, 0, undeclared, &(want){undeclared, "", 0, {0}, {0}, {0}});
    const char *notobj = "<tool_call>{\"name\": \"search\", \"arguments\": [1]}</tool_call>";
    expect("not_object", DF_TC_HERMES, 0, 0, notobj, &(want){notobj, "", 0, {0}, {0}, {0}});
    const char *cut = "Hi <tool_call>{\"name\": \"search\", \"argu";
    expect("unfinished", DF_TC_HERMES, 0, 0, cut, &(want){cut, "", 0, {0}, {0}, {0}});
    const char *mistral_bad = "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {}}, {\"name\": \"nope\"}]";
    expect("mistral_all_or_nothing", DF_TC_MISTRAL, 0, 0, mistral_bad, &(want){mistral_bad, "", 0, {0}, {0}, {0}});
    /* a good call then a bad one: the good one is a call, the bad one content */
    expect("mixed", DF_TC_HERMES, 0, 0,
           "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call><tool_call>oops</tool_call>",
           &(want){"<tool_call>oops</tool_call>", "", 1, {"search"}, {"{}"}, {0}});
    /* "<tool_c" that is not a call: held back only until decided */
    expect("not_a_call", DF_TC_HERMES, 0, 0, "a <tool_c b", &(want){"a <tool_c b", "", 0, {0}, {0}, {0}});
    /* an unclosed think block: reasoning to the end */
    expect("unclosed_think", DF_TC_HERMES, 1, 0, "<think>\nhmm  ", &(want){"", "hmm", 0, {0}, {0}, {0}});
}

static void test_no_tools(void) {
    /* calls are not parsed when tools are off (tool_choice none / no tools): content as generated */
    df_tc_config c = {.fam = DF_TC_HERMES, .think = 1};
    df_tc *p = df_tc_new(&c);
    const char *t = "<think>x</think>\n<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>";
    df_tc_feed(p, t, strlen(t));
    df_tc_finish(p);
    size_t cl;
    const char *ct = df_tc_content(p, &cl);
    CHECK(df_tc_n_calls(p) == 0 && cl == strlen(t + 17) && !memcmp(ct, t + 17, cl), "no tools: %.*s", (int)cl, ct);
    df_tc_free(p);
}

/* An empty output (nothing fed, then the end), in every family, inside a
 * think block or not: nothing, and no null buffer handed to memmem/memmove
 * (found by fuzz_toolcall under UBSan). */
static void test_empty(void) {
    for (int f = DF_TC_NONE; f <= DF_TC_MISTRAL; f++)
        for (int in = 0; in < 2; in++) {
            df_tc_config c = {.fam = (df_tc_family)f, .think = 1, .in_think = in, .tools = 1};
            df_tc *p = df_tc_new(&c);
            df_tc_feed(p, "", 0);
            df_tc_finish(p);
            size_t cl, rl;
            df_tc_content(p, &cl);
            df_tc_reasoning(p, &rl);
            CHECK(!cl && !rl && !df_tc_n_calls(p), "empty output, family %d", f);
            df_tc_free(p);
        }
}

static void test_detect(void) {
    CHECK(df_tc_detect("{{ '" DCB "' }}", 0) == DF_TC_DEEPSEEK, "deepseek");
    CHECK(df_tc_detect("<|tool_calls_section_begin|>", 0) == DF_TC_KIMI_K2, "k2");
    CHECK(df_tc_detect("{{- '<tool_call>\\n' }}", 0) == DF_TC_HERMES, "hermes");
    CHECK(df_tc_detect("[TOOL_CALLS]", 0) == DF_TC_MISTRAL, "mistral");
    CHECK(df_tc_detect("<|python_tag|>", 0) == DF_TC_LLAMA3, "llama3");
    CHECK(df_tc_detect(NULL, 1) == DF_TC_KIMI_K3, "k3");
    CHECK(df_tc_detect("<|start|>assistant<|channel|>", 0) == DF_TC_NONE, "gpt-oss: not parsed");
    CHECK(df_tc_template_reads("{% if tools %}", "tools"), "reads tools");
    CHECK(!df_tc_template_reads("{% if tools_x %}{{ my_tools }}", "tools"), "whole words only");
    CHECK(df_tc_template_reads("{%- if enable_thinking is defined and enable_thinking is false %}", "enable_thinking"), "kwarg");
    CHECK(df_tc_prompt_opens_think(DF_TC_DEEPSEEK, "<｜Assistant｜><think>\n", strlen("<｜Assistant｜><think>\n")), "r1 opens");
    CHECK(!df_tc_prompt_opens_think(DF_TC_HERMES, "<think>\n\n</think>\n\n", 19), "qwen3 no-think closes");
    CHECK(df_tc_prompt_opens_think(DF_TC_KIMI_K3, "<|open|>think<|sep|>", 20), "k3 opens");
}

/* The grammar of a call (df_toolcall_grammar + the schema rules), compiled
 * by the grammar module: each text is accepted as a whole document (ok = 1)
 * or not (ok = 0); an accepted text is also parsed into exactly one call per
 * call in it, so the grammar never admits what the parser would not read. */
static void grammar(df_tc_family f, const char *named, int parallel, const char *text, int ok, int ncalls) {
    df_buf b = {0};
    char err[300] = "";
    int rc = df_toolcall_grammar(f, TOOLS, named, parallel, "tc-", &b, err, sizeof err);
    CHECK(rc == 0, "%s: %s", df_tc_family_name(f), err);
    /* tool 0 takes objects with a string city; tool 1 has no parameters: any object */
    static const char *const schemas[2] = {"{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                                           "\"required\":[\"city\"],\"additionalProperties\":false}", "{\"type\":\"object\"}"};
    for (int i = 0; i < 2 && !rc; i++) {
        char pre[32];
        snprintf(pre, sizeof pre, "tc-t%d-", i);
        rc = df_json_schema_to_grammar(schemas[i], strlen(schemas[i]), pre, &b, err, sizeof err);
        CHECK(rc == 0, "schema %d: %s", i, err);
    }
    df_grammar *g = NULL;
    if (!rc) rc = df_grammar_compile(b.p, b.len, "root", &g, err, sizeof err);
    CHECK(rc == 0, "%s grammar does not compile: %s\n%s", df_tc_family_name(f), err, b.p ? b.p : "");
    if (!rc) {
        /* a one-token vocabulary is enough: accept_bytes walks the automaton by bytes */
        const char *tok[1] = {"x"};
        size_t len[1] = {1};
        df_gvocab *v = df_gvocab_new(1, tok, len, NULL, err, sizeof err);
        df_gmatch *m = v ? df_gmatch_new(g, v, err, sizeof err) : NULL;
        CHECK(m != NULL, "matcher: %s", err);
        int acc = m && df_gmatch_accept_bytes(m, text, strlen(text)) == 0 && df_gmatch_complete(m);
        CHECK(acc == ok, "%s grammar (named %s, parallel %d) %s:\n%s\ngrammar:\n%s", df_tc_family_name(f), named ? named : "-",
              parallel, ok ? "rejects a valid call" : "accepts an invalid call", text, b.p);
        if (acc) {
            df_tc *p = parse(f, 0, 0, text, 0);
            CHECK((int)df_tc_n_calls(p) == ncalls, "%s: the grammar accepts text the parser reads as %zu calls, not %d:\n%s",
                  df_tc_family_name(f), df_tc_n_calls(p), ncalls, text);
            df_tc_free(p);
        }
        df_gmatch_free(m);
        df_gvocab_free(v);
        df_grammar_free(g);
    }
    df_buf_free(&b);
}

static void test_grammar(void) {
    /* Qwen3 / Hermes: the layout its template writes, the compact one, any JSON whitespace */
    const char *h1 = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const char *h2 = "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>";
    grammar(DF_TC_HERMES, NULL, 0, h1, 1, 1);
    grammar(DF_TC_HERMES, NULL, 0, h2, 1, 1);
    grammar(DF_TC_HERMES, "search", 0, h1, 0, 0);                     /* named: only search */
    grammar(DF_TC_HERMES, "search", 0, "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": [1, 2]}}\n</tool_call>", 1, 1);
    grammar(DF_TC_HERMES, NULL, 0, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n</tool_call>", 0, 0);
    grammar(DF_TC_HERMES, NULL, 0, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", 0, 0);
    grammar(DF_TC_HERMES, NULL, 0, "Sure. <tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>", 0, 0);
    {
        char two[512];
        snprintf(two, sizeof two, "%s\n%s", h1, h2);
        grammar(DF_TC_HERMES, NULL, 1, two, 1, 2);
        grammar(DF_TC_HERMES, NULL, 0, two, 0, 0);                     /* parallel off: one call */
    }
    grammar(DF_TC_DEEPSEEK, "get_weather", 0,
            DSB DCB "function" DSEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DCE DSE, 1, 1);
    grammar(DF_TC_DEEPSEEK, "search", 0,
            DSB DCB "function" DSEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DCE DSE, 0, 0);
    grammar(DF_TC_KIMI_K2, "search", 1,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{\"q\": 1}"
            "<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
            "<|tool_calls_section_end|>", 1, 2);
    grammar(DF_TC_KIMI_K3, "search", 0,
            "<|open|>tools<|sep|><|open|>call tool=\"search\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{}"
            "<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", 1, 1);
    grammar(DF_TC_LLAMA3, "search", 1, "{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}", 1, 1);
    grammar(DF_TC_MISTRAL, NULL, 1,
            "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {}},{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}]", 1, 2);
    df_buf b = {0};
    char err[200] = "";
    CHECK(df_toolcall_grammar(DF_TC_HERMES, TOOLS, "nope", 0, "", &b, err, sizeof err) < 0 && strstr(err, "nope"), "unknown named: %s", err);
    CHECK(df_toolcall_grammar(DF_TC_NONE, TOOLS, NULL, 0, "", &b, err, sizeof err) < 0 && strstr(err, "no tool call syntax"), "none: %s", err);
    CHECK(df_toolcall_grammar(DF_TC_HERMES, "[]", NULL, 0, "", &b, err, sizeof err) < 0, "no tools");
    df_buf_free(&b);
}

int main(void) {
    test_families();
    test_malformed();
    test_no_tools();
    test_empty();
    test_detect();
    test_grammar();
    if (fails) { fprintf(stderr, "test_server_toolcall: %d failures\n", fails); return 1; }
    printf("test_server_toolcall: ok\n");
    return 0;
}
