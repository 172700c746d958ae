/* unicode.c - UTF-8 encoding and the NFC normalizer over the generated
 * tables of unicode_tables.c.
 *
 * NFC works region by region: text that passes the quick check (every
 * character NFC_QC=Yes with ccc 0) is copied unchanged; a region around each
 * "active" character, from the last starter before it up to the next inert
 * starter, is decomposed, canonically reordered and recomposed (UAX #15).
 * An inert starter can neither reorder nor compose with what precedes it,
 * so regions are independent and the result equals NFC of the whole text. */
#include "tok/unicode.h"

#include <stdlib.h>
#include <string.h>

#include "util/util.h"

int df_utf8_encode(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xC0 | (cp >> 6)); o[1] = (uint8_t)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12)); o[1] = (uint8_t)(0x80 | ((cp >> 6) & 63));
        o[2] = (uint8_t)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18)); o[1] = (uint8_t)(0x80 | ((cp >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)); o[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

int df_uc_ccc_of(uint32_t cp) {
    size_t lo = 0, hi = df_uc_ccc_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (df_uc_ccc[mid].cp < cp) lo = mid + 1; else hi = mid;
    }
    return lo < df_uc_ccc_n && df_uc_ccc[lo].cp == cp ? (int)df_uc_ccc[lo].val : 0;
}

static const df_uc_decomp_entry *find_decomp(uint32_t cp) {
    size_t lo = 0, hi = df_uc_decomp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (df_uc_decomp[mid].cp < cp) lo = mid + 1; else hi = mid;
    }
    return lo < df_uc_decomp_n && df_uc_decomp[lo].cp == cp ? &df_uc_decomp[lo] : NULL;
}

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21,
       TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

/* Primary composite of (a, b), or 0. */
static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = df_uc_comp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const df_uc_comp_entry *e = &df_uc_comp[mid];
        if (e->a < a || (e->a == a && e->b < b)) lo = mid + 1; else hi = mid;
    }
    if (lo < df_uc_comp_n && df_uc_comp[lo].a == a && df_uc_comp[lo].b == b) return df_uc_comp[lo].c;
    return 0;
}

/* An inert character: valid, NFC_QC=Yes and ccc 0 (invalid bytes count as inert). */
static int inert_at(const uint8_t *s, size_t n, int *clen) {
    uint32_t cp;
    if (s[0] < 0x80) { *clen = 1; return 1; }
    int l = df_utf8_decode(s, n, &cp);
    if (!l) { *clen = 1; return 1; }
    *clen = l;
    return !(df_uc_props(cp) & DF_UC_NFC_ACTIVE);
}

size_t df_nfc_quick_span(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0xCC) {           /* everything below U+0300 is inert */
            if (s[i] < 0x80) { i++; continue; }
        }
        int l;
        if (!inert_at(s + i, n - i, &l)) return i;
        i += (size_t)l;
    }
    return n;
}

static void reserve(uint8_t **out, size_t *len, size_t *cap, size_t more) {
    if (*len + more <= *cap) return;
    size_t c = *cap ? *cap : 64;
    while (c < *len + more) c *= 2;
    *out = df_xrealloc(*out, c);
    *cap = c;
}

/* Normalizes one region (all valid UTF-8) and appends it. */
static void nfc_region(const uint8_t *s, size_t n, uint8_t **out, size_t *len, size_t *cap) {
    size_t m = 0, mcap = n * 4 + 8; /* a decomposition expands a character to at most 4x (Hangul 3) */
    uint32_t stackbuf[256];
    uint32_t *cps = mcap <= 256 ? stackbuf : df_xmalloc(mcap * sizeof *cps);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = df_utf8_decode(s + i, n - i, &cp);
        i += (size_t)(l ? l : 1);
        if (cp >= SBASE && cp < SBASE + SCOUNT) {
            uint32_t si = cp - SBASE;
            cps[m++] = LBASE + si / NCOUNT;
            cps[m++] = VBASE + (si % NCOUNT) / TCOUNT;
            if (si % TCOUNT) cps[m++] = TBASE + si % TCOUNT;
            continue;
        }
        const df_uc_decomp_entry *d = find_decomp(cp);
        if (!d) { cps[m++] = cp; continue; }
        if (m + d->len > mcap) { /* cannot happen with the 4x bound, kept as a guard */
            mcap = (m + d->len) * 2;
            if (cps == stackbuf) { uint32_t *p = df_xmalloc(mcap * sizeof *p); memcpy(p, cps, m * sizeof *p); cps = p; }
            else cps = df_xrealloc(cps, mcap * sizeof *cps);
        }
        for (uint32_t k = 0; k < d->len; k++) cps[m++] = df_uc_decomp_data[d->off + k];
    }
    /* canonical ordering: stable insertion sort by ccc inside runs of non-starters */
    for (size_t i = 1; i < m; i++) {
        int ci = df_uc_ccc_of(cps[i]);
        if (!ci) continue;
        size_t j = i;
        uint32_t c = cps[i];
        while (j > 0) {
            int cj = df_uc_ccc_of(cps[j - 1]);
            if (cj == 0 || cj <= ci) break;
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = c;
    }
    /* canonical composition */
    size_t o = 0;
    long starter = -1;
    int last = 256;
    for (size_t i = 0; i < m; i++) {
        uint32_t c = cps[i];
        int cc = df_uc_ccc_of(c);
        if (starter >= 0 && (last < cc || last == 0)) {
            uint32_t comp = compose_pair(cps[starter], c);
            if (comp) { cps[starter] = comp; continue; }
        }
        if (cc == 0) starter = (long)o;
        last = cc;
        cps[o++] = c;
    }
    reserve(out, len, cap, o * 4);
    for (size_t i = 0; i < o; i++) *len += (size_t)df_utf8_encode(cps[i], *out + *len);
    if (cps != stackbuf) free(cps);
}

void df_nfc_append(const uint8_t *s, size_t n, uint8_t **out, size_t *len, size_t *cap) {
    size_t i = 0;
    while (i < n) {
        size_t span = df_nfc_quick_span(s + i, n - i);
        if (i + span == n) {
            if (span) { reserve(out, len, cap, span); memcpy(*out + *len, s + i, span); *len += span; }
            return;
        }
        /* back up to the start of the last character of the span (a starter that may compose) */
        size_t keep = span;
        if (keep > 0) {
            size_t k = keep - 1;
            while (k > 0 && (s[i + k] & 0xC0) == 0x80) k--;
            int l;
            uint32_t cp;
            /* only back up onto a valid character; an invalid byte composes with nothing */
            if ((l = df_utf8_decode(s + i + k, n - i - k, &cp)) && (size_t)l == keep - k) keep = k;
        }
        if (keep) {
            reserve(out, len, cap, keep);
            memcpy(*out + *len, s + i, keep);
            *len += keep;
        }
        /* region: from i+keep through the active characters up to the next inert one */
        size_t r = i + span, rs = i + keep;
        int l;
        uint32_t cp;
        l = df_utf8_decode(s + r, n - r, &cp); /* the active character (valid by construction) */
        r += (size_t)l;
        while (r < n) {
            int cl;
            if (inert_at(s + r, n - r, &cl)) break;
            r += (size_t)cl;
        }
        nfc_region(s + rs, r - rs, out, len, cap);
        i = r;
    }
}
