/* fuzz_template.c - libFuzzer target: parses arbitrary bytes as a chat
 * template and renders it against a fixed chat context. Must never crash,
 * leak or hang: the renderer bounds nesting, steps, memory and output.
 *
 * Deep templates (issue 18: 1+1+...+1, x|f|f|..., a.b.b..., [[[...]]]) need
 * long inputs. Two ways reach them: the seed corpus holds deep shapes of a
 * few KB (libFuzzer's default -max_len grows to the largest seed; run with
 * -max_len=65536 for more), and a compact repeat encoding expands a short
 * input: 0xFF, a count byte c, then PRE 0xFE UNIT 0xFE POST renders as
 * PRE + UNIT repeated 64*c times + POST (0xFE/0xFF never occur in UTF-8,
 * so no valid template is shadowed). The dictionary fuzz_template.dict
 * supplies the tokens. */
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

/* Expands the repeat encoding; returns a malloc'd NUL-terminated source. */
static char *expand(const uint8_t *data, size_t size) {
    if (size >= 2 && data[0] == 0xFF) {
        size_t count = (size_t)data[1] * 64;
        const uint8_t *p = data + 2, *end = data + size;
        const uint8_t *s1 = memchr(p, 0xFE, (size_t)(end - p));
        const uint8_t *s2 = s1 ? memchr(s1 + 1, 0xFE, (size_t)(end - s1 - 1)) : NULL;
        if (s2) {
            size_t lp = (size_t)(s1 - p), lu = (size_t)(s2 - s1 - 1), lq = (size_t)(end - s2 - 1);
            if (lu * count > (1u << 20)) count = lu ? (1u << 20) / lu : 0;
            char *src = malloc(lp + lu * count + lq + 1);
            if (!src) return NULL;
            char *o = src;
            memcpy(o, p, lp), o += lp;
            for (size_t i = 0; i < count; i++) memcpy(o, s1 + 1, lu), o += lu;
            memcpy(o, s2 + 1, lq), o += lq;
            *o = 0;
            return src;
        }
    }
    char *src = malloc(size + 1);
    if (!src) return NULL;
    memcpy(src, data, size);
    src[size] = 0;
    return src;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *src = expand(data, size);
    if (!src) return 0;
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
