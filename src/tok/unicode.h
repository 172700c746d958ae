/* unicode.h - Unicode character data for the tokenizer: general category,
 * White_Space, NFC tables (generated into unicode_tables.c from Python's
 * unicodedata by tools/gen_unicode_tables.py), a strict UTF-8 decoder and
 * the NFC normalizer.
 *
 * Invariants: df_utf8_decode accepts exactly the well-formed UTF-8 of the
 * Unicode standard (no overlongs, no surrogates, nothing above U+10FFFF), the
 * same set PCRE2 accepts; anything else decodes as one invalid byte. */
#ifndef DF_TOK_UNICODE_H
#define DF_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    DF_GC_Lu, DF_GC_Ll, DF_GC_Lt, DF_GC_Lm, DF_GC_Lo, DF_GC_Mn, DF_GC_Mc, DF_GC_Me,
    DF_GC_Nd, DF_GC_Nl, DF_GC_No, DF_GC_Pc, DF_GC_Pd, DF_GC_Ps, DF_GC_Pe, DF_GC_Pi,
    DF_GC_Pf, DF_GC_Po, DF_GC_Sm, DF_GC_Sc, DF_GC_Sk, DF_GC_So, DF_GC_Zs, DF_GC_Zl,
    DF_GC_Zp, DF_GC_Cc, DF_GC_Cf, DF_GC_Cs, DF_GC_Co, DF_GC_Cn, DF_GC_COUNT
};
#define DF_UC_WS 32         /* White_Space */
#define DF_UC_NFC_ACTIVE 64 /* NFC_QC != Yes, or ccc != 0 */

typedef struct { uint32_t cp; uint32_t val; } df_uc_pair;
typedef struct { uint32_t cp; uint32_t off; uint32_t len; } df_uc_decomp_entry;
typedef struct { uint32_t a, b, c; } df_uc_comp_entry;

extern const char df_uc_version[];
extern const uint16_t df_uc_stage1[0x1100];
extern const uint8_t df_uc_stage2[];
extern const df_uc_pair df_uc_ccc[];
extern const size_t df_uc_ccc_n;
extern const df_uc_decomp_entry df_uc_decomp[];
extern const size_t df_uc_decomp_n;
extern const uint32_t df_uc_decomp_data[];
extern const df_uc_comp_entry df_uc_comp[];
extern const size_t df_uc_comp_n;

/* Property byte of a code point (cp < 0x110000): category | DF_UC_* bits. */
static inline uint8_t df_uc_props(uint32_t cp) {
    return df_uc_stage2[((uint32_t)df_uc_stage1[cp >> 8] << 8) | (cp & 255)];
}
static inline int df_uc_gc(uint32_t cp) { return df_uc_props(cp) & 31; }

/* Rust regex's \w (UTS #18: Alphabetic, Mark, Nd, Pc, Join_Control), which HF
 * tokenizers' single_word test uses. Alphabetic is L, Nl and Other_Alphabetic
 * (and Other_Lower/Uppercase); outside L, M and Nl those are only the circled
 * and squared Latin letters (So) below: test_tok checks this against PCRE2's
 * [\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}] on every code point. */
static inline int df_uc_is_word(uint32_t cp) {
    if (cp >= 0x110000) return 0;
    int g = df_uc_gc(cp);
    if (g <= DF_GC_Nl || g == DF_GC_Pc) return 1; /* L*, M*, Nd, Nl */
    if (cp == 0x200C || cp == 0x200D) return 1;
    return g == DF_GC_So && ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
                             (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189));
}

/* Decodes one well-formed UTF-8 character at s[0..n) (n >= 1). Returns its
 * length (1-4) and sets *cp; returns 0 (and *cp = 0xFFFFFFFF) when s[0]
 * does not start a well-formed sequence. */
static inline int df_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    *cp = 0xFFFFFFFFu;
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
        if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0;  /* overlong */
        if (c == 0xF4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
              ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

/* Encodes cp (a scalar value) into out (4 bytes room); returns the length. */
int df_utf8_encode(uint32_t cp, uint8_t *out);

/* Canonical combining class of cp. */
int df_uc_ccc_of(uint32_t cp);

/* Length of the longest prefix of s[0..n) that NFC leaves unchanged by the
 * quick check (all characters NFC_QC=Yes with ccc 0, or invalid bytes). */
size_t df_nfc_quick_span(const uint8_t *s, size_t n);

/* Appends NFC(s[0..n)) to *out (growable: *out, *len, *cap; realloc'd).
 * Invalid UTF-8 bytes pass through unchanged and act as starters that
 * compose with nothing. */
void df_nfc_append(const uint8_t *s, size_t n, uint8_t **out, size_t *len, size_t *cap);

#endif
