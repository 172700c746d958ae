/* fuzz_template.c - libFuzzer target: parses arbitrary bytes as a chat
 * template and renders it against a fixed chat context. Must never crash,
 * leak or hang: the renderer bounds nesting, steps, memory and output. */
#include "tok/template.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *CTX =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"h\\u00e9llo \\ud83d\\ude00\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"think\",\"tool_calls\":[{\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":[true,null,2.5]}}}]},{\"role\":\"tool\",\"content\":\"r\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"enable_thinking\":false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    char err[256];
    df_template *t = df_template_parse(src, err, sizeof err);
    if (t) {
        df_template_set_limits(t, 1 << 20, 64 << 20, 200000);
        char *out = NULL;
        size_t len = 0;
        if (df_template_render(t, CTX, &out, &len, err, sizeof err) == 0) free(out);
        df_template_free(t);
    }
    free(src);
    return 0;
}
