/* fuzz_safetensors.c - libFuzzer target for the safetensors header parser:
 * arbitrary bytes must be rejected or accepted without reading outside the
 * buffer, leaking or crashing. */
#include "format/safetensors.h"
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    df_st_set *s = df_st_parse(data, size, "fuzz", err, sizeof err);
    if (s) {
        for (int i = 0; i < df_st_count(s); i++) {
            const df_st_tensor *t = df_st_at(s, i);
            volatile uint8_t sink = 0;
            if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
            (void)sink;
            (void)df_st_find(s, t->name);
        }
        df_st_close(s);
    }
    return 0;
}
