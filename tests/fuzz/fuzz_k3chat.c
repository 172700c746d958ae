/* fuzz_k3chat.c - libFuzzer target: Kimi K3's chat renderer on arbitrary
 * input, read as messages JSON, NUL, tools JSON, NUL, options JSON (missing
 * parts: none). Must never crash, leak or hang, and a successful render's
 * segments must tile its text exactly. Seeds: the goldens'
 * conversations (tests/data/chat/k3). */
#include "tok/kimi_k3_chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    const char *part[3] = {buf, NULL, NULL};
    char *p = buf, *end = buf + size;
    for (int k = 1; k < 3; k++) {
        char *z = memchr(p, 0, (size_t)(end - p));
        if (!z || z == end) break;
        part[k] = z + 1;
        p = z + 1;
    }
    df_k3_prompt out;
    char err[256];
    for (int gen = 0; gen < 2; gen++) {
        if (df_k3_chat_render(part[0], part[1], gen, part[2], &out, err, sizeof err) == 0) {
            size_t at = 0;
            for (size_t i = 0; i < out.n_seg; i++) {
                if (out.seg[i].off != at || !out.seg[i].len) abort();
                at += out.seg[i].len;
            }
            if (at != out.len || out.text[out.len]) abort();
            df_k3_prompt_free(&out);
        }
    }
    free(buf);
    return 0;
}
