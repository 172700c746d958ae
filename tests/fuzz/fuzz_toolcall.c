/* fuzz_toolcall.c - libFuzzer target for the model-output parser
 * (src/server/toolcall.c): any output text, fed in any pieces, must give the
 * same content, reasoning and calls as fed whole, never a crash, leak or
 * undefined behaviour. The first byte picks the family and the think /
 * tools switches, the second the piece size; the rest is the output. Build
 * and run: make fuzz (clang, libFuzzer + ASan/UBSan). */
#include "server/toolcall.h"

#include <stdint.h>
#include <string.h>

static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]";

static df_tc *run(const df_tc_config *c, const char *s, size_t n, size_t step) {
    df_tc *p = df_tc_new(c);
    if (!p) return NULL;
    for (size_t i = 0; i < n; i += step) df_tc_feed(p, s + i, i + step <= n ? step : n - i);
    df_tc_finish(p);
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    df_tc_config c = {.fam = (df_tc_family)(data[0] % 7), .think = (data[0] >> 3) & 1, .in_think = (data[0] >> 4) & 1,
                      .tools = !((data[0] >> 5) & 1), .tools_json = (data[0] >> 6) & 1 ? NULL : TOOLS, .id_seed = 1};
    size_t step = (size_t)data[1] % 7 + 1;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    df_tc *a = run(&c, s, n, n ? n : 1), *b = run(&c, s, n, step);
    if (a && b) {
        size_t al, bl;
        const char *x = df_tc_content(a, &al), *y = df_tc_content(b, &bl);
        if (al != bl || memcmp(x, y, al)) __builtin_trap();
        x = df_tc_reasoning(a, &al);
        y = df_tc_reasoning(b, &bl);
        if (al != bl || memcmp(x, y, al)) __builtin_trap();
        if (df_tc_n_calls(a) != df_tc_n_calls(b)) __builtin_trap();
        for (size_t i = 0; i < df_tc_n_calls(a); i++) {
            const df_tc_call *p = df_tc_call_at(a, i), *q = df_tc_call_at(b, i);
            if (strcmp(p->name, q->name) || strcmp(p->args, q->args)) __builtin_trap();
        }
    }
    df_tc_free(a);
    df_tc_free(b);
    return 0;
}
