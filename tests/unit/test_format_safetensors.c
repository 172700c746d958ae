/* test_format_safetensors.c - the safetensors header validator on good and
 * malformed buffers: every malformed case is rejected with a message that
 * names the problem, and nothing reads outside the buffer (run under ASan). */
#include "deltafin.h"
#include "format/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static uint8_t *make(const char *json, size_t data_len, size_t *size) {
    size_t h = strlen(json);
    *size = 8 + h + data_len;
    uint8_t *b = calloc(1, *size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, json, h);
    return b;
}

static void expect(const char *json, size_t data_len, const char *needle) {
    size_t n;
    uint8_t *b = make(json, data_len, &n);
    char err[512] = "";
    df_st_set *s = df_st_parse(b, n, "t.safetensors", err, sizeof err);
    if (!needle) {
        CHECK(s != NULL, "expected success for %s: %s", json, err);
    } else {
        CHECK(s == NULL, "expected failure for %s", json);
        CHECK(strstr(err, needle) != NULL, "error for %s is \"%s\", expected to contain \"%s\"", json, err, needle);
    }
    df_st_close(s);
    free(b);
}

int main(void) {
    expect("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},\"__metadata__\":{\"format\":\"pt\"}}", 12, NULL);
    expect("{}", 0, NULL);
    expect("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 11, "past the data section");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 24, "need 24 bytes");
    expect("{\"a\":{\"dtype\":\"Q9\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "unsupported dtype");
    expect("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6, "overlap");
    expect("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 4, "begin <= end");
    expect("{\"a\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect("{\"a\":{\"dtype\":\"U8\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4, "need");
    expect("{\"a\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, "data_offsets");
    expect("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4, "JSON");
    expect("[1,2]", 0, "object");
    expect("{\"a\":", 0, "JSON");
    /* header length beyond the file */
    {
        uint8_t b[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
        char err[256];
        CHECK(!df_st_parse(b, sizeof b, "x", err, sizeof err) && strstr(err, "truncated"), "huge header length: %s", err);
        CHECK(!df_st_parse(b, 5, "x", err, sizeof err) && strstr(err, "shorter"), "5-byte file: %s", err);
    }
    /* lookup */
    {
        size_t n;
        uint8_t *b = make("{\"w\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[2,8]},\"v\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 8, &n);
        char err[256];
        df_st_set *s = df_st_parse(b, n, "x", err, sizeof err);
        CHECK(s && df_st_count(s) == 2, "two tensors");
        const df_st_tensor *t = s ? df_st_find(s, "w") : NULL;
        CHECK(t && t->dtype == DF_ST_F16 && t->shape[0] == 3 && t->nbytes == 6 && t->data == b + 8 + (n - 8 - 8) + 2, "tensor w fields");
        CHECK(s && !df_st_find(s, "missing"), "missing lookup");
        df_st_close(s);
        free(b);
    }
    printf("%s: %d failures\n", __FILE__, fails);
    return fails != 0;
}
