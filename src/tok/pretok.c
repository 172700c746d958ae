/* pretok.c - pre-tokenizer regexes: a translator from the Oniguruma /
 * Rust-regex syntax of tokenizer.json and tiktoken patterns to PCRE2, and
 * hand-written scanners for the patterns real models ship.
 *
 * Invariants: a scanner returns exactly the match PCRE2 returns for the same
 * pattern on the same bytes (leftmost, first alternative that succeeds, with
 * backtracking as the regex would do it), including on invalid UTF-8, where
 * an invalid byte matches no character class (PCRE2_MATCH_INVALID_UTF) and so
 * satisfies (?!\S). tests/unit/test_tok.c checks this on random strings.
 * Classes: \s is Unicode White_Space (as in Oniguruma and Rust's regex), not
 * PCRE2's \s (which adds U+180E), so the translation spells it out. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "deltafin.h"
#include "tok/tok_internal.h"
#include "tok/unicode.h"
#include "util/util.h"

/* ---- character classes -------------------------------------------------- */

enum {
    K_L = 1 << 0, K_N = 1 << 1, K_P = 1 << 2, K_S = 1 << 3, K_M = 1 << 4, K_WS = 1 << 5,
    K_CRLF = 1 << 6, K_INV = 1 << 7,
    K_U = 1 << 8,       /* Lu Lt Lm Lo M */
    K_W = 1 << 9,       /* Ll Lm Lo M */
    K_HAN = 1 << 10, K_SP = 1 << 11, K_APUNCT = 1 << 12 /* DeepSeek's ASCII punctuation set */,
    K_ALPHA = 1 << 13 /* A-Za-z */, K_DSCJK = 1 << 14, K_SLASH = 1 << 15,
};

static uint32_t gc_mask[DF_GC_COUNT];
static uint32_t ascii_mask[128];
static uint8_t *han_bits; /* 0x110000 bits */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static uint32_t mask_of_cp(uint32_t cp) {
    uint8_t p = df_uc_props(cp);
    uint32_t m = gc_mask[p & 31];
    if (p & DF_UC_WS) m |= K_WS;
    if (han_bits && (han_bits[cp >> 3] >> (cp & 7) & 1)) m |= K_HAN;
    if ((cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) || (cp >= 0x30A0 && cp <= 0x30FF)) m |= K_DSCJK;
    return m;
}

/* Marks \p{Han} (the Script property, as tiktoken's regex reads it; not
 * Script_Extensions) from PCRE2's own script table: one JIT scan over a
 * buffer holding every scalar value. */
static void build_han(void) {
    size_t cap = 0x110000 * 4, n = 0;
    uint8_t *buf = malloc(cap);
    uint8_t *bits = calloc(0x110000 / 8, 1);
    if (!buf || !bits) { free(buf); free(bits); return; }
    uint32_t *starts = malloc(sizeof(uint32_t) * 0x110000);
    if (!starts) { free(buf); free(bits); return; }
    /* only code points whose general category can be Han's (letters, Nl, So, Lm, Cn-free blocks) matter,
     * but scanning all is simple: ~4 MiB */
    uint32_t *cps = malloc(sizeof(uint32_t) * 0x110000);
    size_t m = 0;
    for (uint32_t cp = 0x80; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        int g = df_uc_gc(cp);
        if (g == DF_GC_Cn || g == DF_GC_Co || g == DF_GC_Cc || g == DF_GC_Zs) continue;
        starts[m] = (uint32_t)n;
        cps[m++] = cp;
        n += (size_t)df_utf8_encode(cp, buf + n);
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR) "\\p{sc:Han}+", PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (re) {
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        size_t pos = 0, ci = 0;
        while (pos < n && pcre2_match(re, buf, n, pos, 0, md, NULL) >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            while (ci < m && starts[ci] < ov[0]) ci++;
            while (ci < m && starts[ci] < ov[1]) { bits[cps[ci] >> 3] |= (uint8_t)(1 << (cps[ci] & 7)); ci++; }
            pos = ov[1];
        }
        pcre2_match_data_free(md);
        pcre2_code_free(re);
    }
    free(cps);
    free(starts);
    free(buf);
    han_bits = bits;
}

static void init_tables(void) {
    for (int g = 0; g < DF_GC_COUNT; g++) {
        uint32_t m = 0;
        switch (g) {
        case DF_GC_Lu: case DF_GC_Lt: m = K_L | K_U; break;
        case DF_GC_Ll: m = K_L | K_W; break;
        case DF_GC_Lm: case DF_GC_Lo: m = K_L | K_U | K_W; break;
        case DF_GC_Mn: case DF_GC_Mc: case DF_GC_Me: m = K_M | K_U | K_W; break;
        case DF_GC_Nd: case DF_GC_Nl: case DF_GC_No: m = K_N; break;
        case DF_GC_Pc: case DF_GC_Pd: case DF_GC_Ps: case DF_GC_Pe: case DF_GC_Pi: case DF_GC_Pf: case DF_GC_Po: m = K_P; break;
        case DF_GC_Sm: case DF_GC_Sc: case DF_GC_Sk: case DF_GC_So: m = K_S; break;
        default: m = 0;
        }
        gc_mask[g] = m;
    }
    build_han();
    for (uint32_t c = 0; c < 128; c++) {
        uint32_t m = mask_of_cp(c);
        if (c == '\r' || c == '\n') m |= K_CRLF;
        if (c == ' ') m |= K_SP;
        if (c == '/') m |= K_SLASH;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) m |= K_ALPHA;
        if (c >= 0x21 && c <= 0x7E && !((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) m |= K_APUNCT;
        ascii_mask[c] = m;
    }
}

void df_pretok_init(void) { pthread_once(&init_once, init_tables); }

/* Class mask and length of the character at s[i] (i < n). */
static inline uint32_t cls(const uint8_t *s, size_t n, size_t i, int *len) {
    uint8_t c = s[i];
    if (c < 0x80) { *len = 1; return ascii_mask[c]; }
    uint32_t cp;
    int l = df_utf8_decode(s + i, n - i, &cp);
    if (!l) { *len = 1; return K_INV; }
    *len = l;
    return mask_of_cp(cp);
}

/* End of the run of characters whose mask has any bit of want, from i. */
static inline size_t run(const uint8_t *s, size_t n, size_t i, uint32_t want) {
    while (i < n) {
        int l;
        if (!(cls(s, n, i, &l) & want)) break;
        i += (size_t)l;
    }
    return i;
}

/* Length of a contraction ('s 't 're 've 'm 'll 'd) at s[i], 0 if none.
 * caseless: Unicode simple case folding, where U+017F (long s) folds to s. */
static size_t contraction(const uint8_t *s, size_t n, size_t i, int caseless, int anycase) {
    if (i + 1 >= n || s[i] != '\'') return 0;
    uint8_t a = s[i + 1], al = anycase ? (uint8_t)(a | 0x20) : a;
    if (al == 's' || al == 't' || al == 'm' || al == 'd') return 2;
    if (caseless && a == 0xC5 && i + 2 < n && s[i + 2] == 0xBF) return 3; /* ſ */
    if (i + 2 < n) {
        uint8_t b = s[i + 2], bl = anycase ? (uint8_t)(b | 0x20) : b;
        if ((al == 'r' || al == 'v') && bl == 'e') return 3;
        if (al == 'l' && bl == 'l') return 3;
    }
    return 0;
}

/* The three whitespace alternatives shared by every pattern:
 * \s*[\r\n]+ | \s+(?!\S) | \s+   (c0: mask at i, which has K_WS). */
static inline size_t ws_alts(const uint8_t *s, size_t n, size_t i, int use_crlf_alt) {
    size_t j = i, last_nl = 0, last_start = i;
    while (j < n) {
        int l;
        uint32_t m = cls(s, n, j, &l);
        if (!(m & K_WS)) break;
        if (m & K_CRLF) last_nl = j + 1;
        last_start = j;
        j += (size_t)l;
    }
    if (use_crlf_alt && last_nl) return last_nl;
    if (j == n) return j;
    int l;
    if (cls(s, n, j, &l) & K_INV) return j; /* (?!\S) holds before an invalid byte */
    if (last_start > i) return last_start;  /* back off one character */
    return j;                               /* \s+ */
}

/* [^\r\n\p{L}\p{N}] : a valid character that is not CR, LF, a letter or a number */
#define IS_PRE(m) (!((m) & (K_CRLF | K_L | K_N | K_INV)))
/* [^\s\p{L}\p{N}] */
#define IS_Q(m) (!((m) & (K_WS | K_L | K_N | K_INV)))

/* cl100k / Qwen2: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t scan_cl100k(const uint8_t *s, size_t n, size_t i, int maxdig) {
    int l0;
    uint32_t c0 = cls(s, n, i, &l0);
    if (s[i] == '\'') {
        size_t k = contraction(s, n, i, 1, 1);
        if (k) return i + k;
    }
    if (c0 & K_L) return run(s, n, i + (size_t)l0, K_L);
    if (IS_PRE(c0) && i + (size_t)l0 < n) {
        size_t e = run(s, n, i + (size_t)l0, K_L);
        if (e > i + (size_t)l0) return e;
    }
    if (c0 & K_N) {
        size_t j = i + (size_t)l0;
        for (int d = 1; d < maxdig && j < n; d++) {
            int l;
            if (!(cls(s, n, j, &l) & K_N)) break;
            j += (size_t)l;
        }
        return j;
    }
    {
        size_t j = i;
        uint32_t c = c0;
        int l = l0;
        if (s[i] == ' ' && i + 1 < n) { j = i + 1; c = cls(s, n, j, &l); }
        if (IS_Q(c)) {
            size_t e = j;
            while (e < n) {
                int ll;
                if (!IS_Q(cls(s, n, e, &ll))) break;
                e += (size_t)ll;
            }
            while (e < n && (s[e] == '\r' || s[e] == '\n')) e++;
            return e;
        }
    }
    if (c0 & K_WS) return ws_alts(s, n, i, 1);
    return i;
}

/* o200k / Kimi letter alternatives at i:
 *   P? U* W+ C?  |  P? U+ W* C?    (P = [^\r\n\p{L}\p{N}], C = contraction)
 * with U, W possibly excluding Han (Kimi). Returns the end or 0. */
static size_t ow_letters(const uint8_t *s, size_t n, size_t i, uint32_t c0, int l0, uint32_t excl, int ci, int anycase) {
    for (int alt = 1; alt <= 2; alt++) {
        for (int p = 1; p >= 0; p--) {
            size_t j = i;
            if (p) {
                if (!IS_PRE(c0)) continue;
                j = i + (size_t)l0;
            }
            /* U-run from j, remembering the end of its last W character */
            size_t u = j, lastw = 0;
            while (u < n) {
                int l;
                uint32_t m = cls(s, n, u, &l);
                if (!(m & K_U) || (m & excl)) break;
                if ((m & K_W)) lastw = u + (size_t)l;
                u += (size_t)l;
            }
            size_t e = 0;
            if (alt == 1) {
                size_t w = u;
                while (w < n) {
                    int l;
                    uint32_t m = cls(s, n, w, &l);
                    if (!(m & K_W) || (m & excl)) break;
                    w += (size_t)l;
                }
                if (w > u) e = w;
                else if (lastw) e = lastw;
            } else if (u > j) {
                size_t w = u;
                while (w < n) {
                    int l;
                    uint32_t m = cls(s, n, w, &l);
                    if (!(m & K_W) || (m & excl)) break;
                    w += (size_t)l;
                }
                e = w;
            }
            if (e) return e + contraction(s, n, e, ci, anycase);
        }
    }
    return 0;
}

/* o200k: letters | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n/]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * Kimi:  [\p{Han}]+ | letters (without Han) | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n]* | ws */
static size_t scan_o200k(const uint8_t *s, size_t n, size_t i, int kimi, int ci, int anycase) {
    int l0;
    uint32_t c0 = cls(s, n, i, &l0);
    if (kimi && (c0 & K_HAN)) return run(s, n, i, K_HAN);
    size_t e = ow_letters(s, n, i, c0, l0, kimi ? K_HAN : 0, ci, anycase);
    if (e) return e;
    if (c0 & K_N) {
        size_t j = i + (size_t)l0;
        for (int d = 1; d < 3 && j < n; d++) {
            int l;
            if (!(cls(s, n, j, &l) & K_N)) break;
            j += (size_t)l;
        }
        return j;
    }
    {
        size_t j = i;
        uint32_t c = c0;
        int l = l0;
        if (s[i] == ' ' && i + 1 < n) { j = i + 1; c = cls(s, n, j, &l); }
        if (IS_Q(c)) {
            size_t q = j;
            while (q < n) {
                int ll;
                if (!IS_Q(cls(s, n, q, &ll))) break;
                q += (size_t)ll;
            }
            while (q < n && (s[q] == '\r' || s[q] == '\n' || (!kimi && s[q] == '/'))) q++;
            return q;
        }
    }
    if (c0 & K_WS) return ws_alts(s, n, i, 1);
    return i;
}

/* DeepSeek V3 stage 3:
 * [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
 *  ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+ */
static size_t scan_ds_main(const uint8_t *s, size_t n, size_t i) {
    int l0;
    uint32_t c0 = cls(s, n, i, &l0);
    if ((c0 & K_APUNCT) && i + 1 < n && (ascii_mask[s[i + 1] & 127] & K_ALPHA) && s[i + 1] < 0x80) {
        size_t j = i + 1;
        while (j < n && s[j] < 0x80 && (ascii_mask[s[j]] & K_ALPHA)) j++;
        return j;
    }
    if (!(c0 & (K_CRLF | K_L | K_P | K_S | K_INV))) { /* optional prefix taken */
        size_t e = run(s, n, i + (size_t)l0, K_L | K_M);
        if (e > i + (size_t)l0) return e;
    }
    if (c0 & (K_L | K_M)) return run(s, n, i, K_L | K_M);
    {
        size_t j = i;
        uint32_t c = c0;
        int l = l0;
        if (s[i] == ' ' && i + 1 < n) { j = i + 1; c = cls(s, n, j, &l); }
        if (c & (K_P | K_S)) {
            size_t q = run(s, n, j, K_P | K_S);
            while (q < n && (s[q] == '\r' || s[q] == '\n')) q++;
            return q;
        }
    }
    if (c0 & K_WS) return ws_alts(s, n, i, 1);
    return i;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t scan_gpt2(const uint8_t *s, size_t n, size_t i) {
    size_t k = contraction(s, n, i, 0, 0);
    if (k) return i + k;
    size_t j = i;
    int l;
    uint32_t c = cls(s, n, i, &l);
    if (s[i] == ' ' && i + 1 < n) {
        uint32_t c1 = cls(s, n, i + 1, &l);
        if (c1 & (K_L | K_N) || IS_Q(c1)) { j = i + 1; c = c1; }
    }
    if (c & K_L) return run(s, n, j, K_L);
    if (c & K_N) return run(s, n, j, K_N);
    if (IS_Q(c)) {
        size_t q = j;
        while (q < n) {
            int ll;
            if (!IS_Q(cls(s, n, q, &ll))) break;
            q += (size_t)ll;
        }
        return q;
    }
    if (c & K_WS) return ws_alts(s, n, i, 0);
    return i;
}

/* End of the match of scanner `fast` starting exactly at i, or i if none. */
static size_t scan_at(int fast, const uint8_t *s, size_t n, size_t i) {
    switch (fast) {
    case DF_FAST_CL100K: return scan_cl100k(s, n, i, 3);
    case DF_FAST_QWEN2: return scan_cl100k(s, n, i, 1);
    case DF_FAST_O200K: return scan_o200k(s, n, i, 0, 1, 1);
    case DF_FAST_O200K_ASCII: return scan_o200k(s, n, i, 0, 0, 1);
    case DF_FAST_KIMI: return scan_o200k(s, n, i, 1, 1, 1);
    case DF_FAST_GPT2: return scan_gpt2(s, n, i);
    case DF_FAST_DS_MAIN: return scan_ds_main(s, n, i);
    case DF_FAST_DS_DIGITS: {
        size_t j = i;
        for (int d = 0; d < 3 && j < n; d++) {
            int l;
            if (!(cls(s, n, j, &l) & K_N)) break;
            j += (size_t)l;
        }
        return j;
    }
    case DF_FAST_DS_CJK: return run(s, n, i, K_DSCJK);
    }
    return i;
}

int df_pretok_find(int fast, const pcre2_code *re, pcre2_match_data *md, const uint8_t *s, size_t n,
                   size_t pos, size_t *ms, size_t *me) {
    if (fast) {
        while (pos < n) {
            size_t e = scan_at(fast, s, n, pos);
            if (e > pos) { *ms = pos; *me = e; return 1; }
            int l;
            cls(s, n, pos, &l);
            pos += (size_t)l;
        }
        return 0;
    }
    /* a loop, not recursion: a pattern that matches empty everywhere ("a*")
     * would otherwise recurse once per character of a long piece */
    for (;;) {
        if (pos >= n) return 0;
        int rc = pcre2_match(re, s, n, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) return -1; /* PCRE2's match, depth or heap limit: the caller fails the encoding */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { /* an empty match: HF skips it (no piece); move on one character */
            size_t p = ov[0];
            int l;
            if (p >= n) return 0;
            cls(s, n, p, &l);
            pos = p + (size_t)l;
            continue;
        }
        *ms = ov[0];
        *me = ov[1];
        return 1;
    }
}

/* ---- pattern recognition and translation -------------------------------- */

const char df_kimi_pattern[] =
    "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char df_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const struct { int id; const char *pat; } known[] = {
    {DF_FAST_CL100K, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {DF_FAST_QWEN2, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {DF_FAST_O200K,
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
     "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
     "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {DF_FAST_O200K_ASCII,
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)?"
     "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)?"
     "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {DF_FAST_KIMI, df_kimi_pattern},
    {DF_FAST_DS_DIGITS, "\\p{N}{1,3}"},
    {DF_FAST_DS_CJK, "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+"},
    {DF_FAST_DS_MAIN,
     "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
    {DF_FAST_GPT2, df_gpt2_pattern},
};

int df_pretok_fast_id(const char *pattern) {
    if (getenv("DF_TOK_NO_FAST")) return DF_FAST_NONE;
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        if (!strcmp(pattern, known[k].pat)) return known[k].id;
    return DF_FAST_NONE;
}

#define WS_CLASS "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* 1 if name[0..n) is a Unicode script name PCRE2 knows (Han, Latin, ...). */
static int is_script_name(const char *name, size_t n) {
    if (n < 2 || n > 64 || memchr(name, ':', n) || memchr(name, '=', n)) return 0;
    char pat[80];
    snprintf(pat, sizeof pat, "\\p{sc:%.*s}", (int)n, name);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) return 0;
    pcre2_code_free(re);
    return 1;
}

/* Copies a property escape \p{X} / \P{X} at p into b; returns the next p, or
 * NULL if p holds none. A bare script name means the Script property in
 * Oniguruma and Rust's regex (tiktoken), but Script_Extensions in PCRE2 >=
 * 10.40 (there U+3002 IDEOGRAPHIC FULL STOP is \p{Han}); it is spelled
 * \p{sc:X} so PCRE2 matches the Script property too. */
static const char *put_prop(const char *p, df_buf *b) {
    if (p[0] != '\\' || (p[1] != 'p' && p[1] != 'P') || p[2] != '{') return NULL;
    const char *e = strchr(p, '}');
    if (!e) return NULL;
    if (is_script_name(p + 3, (size_t)(e - p - 3))) {
        df_buf_put(b, p, 3);
        df_buf_puts(b, "sc:");
        df_buf_put(b, p + 3, (size_t)(e + 1 - (p + 3)));
    } else {
        df_buf_put(b, p, (size_t)(e + 1 - p));
    }
    return e + 1;
}

/* Copies one class body item at p (an escape or a character) into b; returns the next p. */
static const char *class_item(const char *p, df_buf *b) {
    if (p[0] == '\\' && p[1]) {
        if (p[1] == 's') { df_buf_puts(b, WS_CLASS); return p + 2; }
        const char *q = put_prop(p, b);
        if (q) return q;
        df_buf_put(b, p, 2);
        return p + 2;
    }
    df_buf_put(b, p, 1);
    return p + 1;
}

/* Translates a class starting at p ('['); returns the position after it. */
static const char *translate_class(const char *p, df_buf *b) {
    df_buf body = {0};
    p++;
    int neg = 0;
    if (*p == '^') { neg = 1; p++; }
    if (*p == ']') { df_buf_puts(&body, "\\]"); p++; }
    df_buf inter = {0};
    int has_inter = 0, inter_neg = 0;
    while (*p && *p != ']') {
        if (p[0] == '&' && p[1] == '&') {
            p += 2;
            if (*p == '[') {
                has_inter = 1;
                df_buf sub = {0};
                p = translate_class(p, &sub); /* sub is "[...]" */
                if (sub.len >= 3 && sub.p[1] == '^') { inter_neg = 1; df_buf_put(&inter, sub.p + 2, sub.len - 3); }
                else df_buf_put(&inter, sub.p + 1, sub.len - 2);
                df_buf_free(&sub);
                continue;
            }
            df_buf_puts(&body, "&&");
            continue;
        }
        if (p[0] == '[' && p[1] == ':') { /* POSIX class */
            const char *e = strstr(p, ":]");
            if (e) { df_buf_put(&body, p, (size_t)(e + 2 - p)); p = e + 2; continue; }
        }
        p = class_item(p, &body);
    }
    if (*p == ']') p++;
    if (has_inter) {
        df_buf_printf(b, "(?:(?%s[%.*s])[%s%.*s])", inter_neg ? "!" : "=", (int)inter.len, inter.p ? inter.p : "",
                      neg ? "^" : "", (int)body.len, body.p ? body.p : "");
    } else {
        df_buf_printf(b, "[%s%.*s]", neg ? "^" : "", (int)body.len, body.p ? body.p : "");
    }
    df_buf_free(&body);
    df_buf_free(&inter);
    return p;
}

char *df_pretok_translate(const char *pattern) {
    df_buf b = {0};
    const char *p = pattern;
    while (*p) {
        if (p[0] == '\\' && p[1]) {
            if (p[1] == 's') { df_buf_puts(&b, "[" WS_CLASS "]"); p += 2; continue; }
            if (p[1] == 'S') { df_buf_puts(&b, "[^" WS_CLASS "]"); p += 2; continue; }
            const char *q = put_prop(p, &b);
            if (q) { p = q; continue; }
            df_buf_put(&b, p, 2);
            p += 2;
            continue;
        }
        if (*p == '[') { p = translate_class(p, &b); continue; }
        df_buf_put(&b, p, 1);
        p++;
    }
    df_buf_put(&b, "", 1);
    return b.p;
}

pcre2_code *df_pretok_compile(const char *pattern, char *err, size_t errlen) {
    char *tr = df_pretok_translate(pattern);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)tr, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        df_err(err, errlen, DF_EUNSUPPORTED, "regex \"%s\" at offset %zu: %s", pattern, (size_t)eo, (char *)msg);
        free(tr);
        return NULL;
    }
    free(tr);
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return re;
}
