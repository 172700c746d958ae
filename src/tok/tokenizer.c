/* tokenizer.c - loading (path dispatch, tokenizer_config.json), added-token
 * matching and the encode pipeline (serial and parallel). Decoding and the
 * streaming detokenizer are in decode.c.
 *
 * Invariants: encoding is a pure function of (tokenizer, bytes, flags); the
 * thread count never changes the ids (see "Parallel encoding" below for why
 * the cut points are safe). Added tokens are matched exactly as HF's
 * AddedVocabulary does: non-normalized tokens leftmost-longest over the raw
 * text first, then, inside each remaining piece after normalization, the
 * normalized ones; lstrip/rstrip/single_word are applied per match within the
 * piece being split. */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "deltafin.h"
#include "tok/tok_internal.h"
#include "tok/unicode.h"
#include "util/util.h"

void df_tok_bytelevel_tables(void);

/* ---- added-token splitting ---------------------------------------------- */

typedef struct { size_t start, end; int32_t id; } df_seg; /* id < 0: text to encode */
typedef struct { df_seg *v; size_t n, cap; } df_segs;

static void seg_push(df_segs *s, size_t a, size_t b, int32_t id) {
    if (s->n == s->cap) { s->cap = s->cap ? s->cap * 2 : 64; s->v = df_xrealloc(s->v, s->cap * sizeof *s->v); }
    s->v[s->n++] = (df_seg){a, b, id};
}

static int is_ws_cp(uint32_t cp) { return cp < 0x110000 && (df_uc_props(cp) & DF_UC_WS); }
/* code point of the character ending at s[n) (invalid: 0xFFFFFFFF) */
static uint32_t last_cp(const uint8_t *s, size_t n, size_t *start) {
    size_t k = n - 1;
    while (k > 0 && n - k < 4 && (s[k] & 0xC0) == 0x80) k--;
    uint32_t cp;
    int l = df_utf8_decode(s + k, n - k, &cp);
    if (!l || (size_t)l != n - k) { *start = n - 1; return 0xFFFFFFFFu; }
    *start = k;
    return cp;
}

/* Splits s[0..n) on the tokens of tr (HF find_matches), appending segments
 * with offsets shifted by base. special_ok: 0 skips special tokens. */
static void split_added(const df_tokenizer *t, const df_trie *tr, const uint8_t *s, size_t n, size_t base,
                        int special_ok, df_segs *out) {
    size_t start_off = 0, p = 0;
    size_t ws_from = 1, ws_to = 0; /* the last rstrip: from ws_from, whitespace up to ws_to (empty: none yet) */
    df_trie_scan sc;
    df_tok_trie_scan_begin(tr, s, n, &sc);
    while (p < n) {
        /* the common case inline: no token starts with this byte (no automaton) */
        if (!sc.mlen && !tr->first[s[p]]) { p++; continue; }
        int32_t term = -1;
        size_t ml = df_tok_trie_longest(tr, &sc, s, n, p, &term);
        if (!ml) { p++; continue; }
        const df_added *a = &t->added[term];
        size_t ms = p, me = p + ml;
        p = me;
        if (a->special && !special_ok) continue;
        if (a->single_word) {
            size_t k;
            uint32_t before = ms > 0 ? last_cp(s, ms, &k) : 0xFFFFFFFFu, after = 0xFFFFFFFFu;
            if (me < n && !df_utf8_decode(s + me, n - me, &after)) after = 0xFFFFFFFFu;
            if ((ms > 0 && df_uc_is_word(before)) || (me < n && df_uc_is_word(after))) continue;
        }
        if (a->lstrip) {
            /* HF strips back to the last non-whitespace character, then takes
             * max(that, start_off): the walk stops at start_off (the same
             * result; a whitespace run is not walked once per match) */
            size_t ns = ms;
            while (ns > start_off) {
                size_t k;
                uint32_t cp = last_cp(s, ns, &k);
                if (!is_ws_cp(cp)) break;
                ns = k;
            }
            ms = ns > start_off ? ns : start_off;
        }
        if (a->rstrip) {
            /* the scan goes on from the match's end, not from after the
             * stripped run (as HF's find_iter), so matches inside one long
             * run would each strip it again: a start inside the last
             * stripped run at a character boundary ends where it ended */
            if (me >= ws_from && me <= ws_to && (me == ws_to || (s[me] & 0xC0) != 0x80)) {
                me = ws_to;
            } else {
                ws_from = me;
                while (me < n) {
                    uint32_t cp;
                    int l = df_utf8_decode(s + me, n - me, &cp);
                    if (!l || !is_ws_cp(cp)) break;
                    me += (size_t)l;
                }
                ws_to = me;
            }
        }
        if (start_off < ms) seg_push(out, base + start_off, base + ms, -1);
        seg_push(out, base + ms, base + me, a->id);
        start_off = me;
    }
    if (start_off < n) seg_push(out, base + start_off, base + n, -1);
    df_tok_trie_scan_end(&sc);
}

/* ---- the encode pipeline ------------------------------------------------ */

typedef struct {
    const df_tokenizer *t;
    df_bpe_cache *cache;
    df_ids *out;
    pcre2_match_data *md;
    int special_ok;
    /* the pre-tokenizer output cap of the current gap (df_tok_out_cap) and
     * the bytes handed to BPE so far; rc != 0 stops the pipeline */
    size_t budget, used;
    int rc;
    char *err;
    size_t errlen;
} worker;

typedef struct { size_t s, e; int m; } piece;

static void pretok(worker *w, int k, const uint8_t *s, size_t n);

/* Hands one pre-token to BPE, counting its bytes against the gap's cap. */
static void to_bpe(worker *w, const uint8_t *s, size_t n) {
    if (w->rc) return;
    if (n > w->budget - w->used) {
        const df_tokenizer *t = w->t;
        int grows = -1;
        for (int i = 0; i < t->n_steps && grows < 0; i++)
            if (t->steps[i].prefix_space) grows = i;
        char what[96];
        if (grows >= 0) snprintf(what, sizeof what, "pre-tokenizer step %d of %d (ByteLevel add_prefix_space)", grows + 1, t->n_steps);
        else snprintf(what, sizeof what, "pre-tokenizer (Metaspace)");
        w->rc = df_err(w->err, w->errlen, DF_EINPUT,
                       "%s: %s: the pre-tokens would exceed %zu bytes, the cap for this input (max(64 KiB, %u x input)); refusing to tokenize",
                       t->path, what, w->budget, DF_TOK_OUT_FACTOR);
        return;
    }
    w->used += n;
    df_bpe_encode_word(&w->t->bpe, w->cache, s, n, w->out);
}

/* Applies split behaviour to the (start, end, is_match) list of one piece, then recurses. */
static void split_general(worker *w, int k, const uint8_t *s, size_t n) {
    const df_pretok_step *st = &w->t->steps[k];
    piece *v = NULL;
    size_t nv = 0, cap = 0, pos = 0, ms, me;
#define PUSH(a, b, mm) do { if (nv == cap) { cap = cap ? cap * 2 : 16; v = df_xrealloc(v, cap * sizeof *v); } v[nv++] = (piece){a, b, mm}; } while (0)
    if (st->literal) {
        while (pos + st->literal_len <= n) {
            const uint8_t *f = memmem(s + pos, n - pos, st->literal, st->literal_len);
            if (!f) break;
            ms = (size_t)(f - s);
            me = ms + st->literal_len;
            if (ms > pos) PUSH(pos, ms, 0);
            PUSH(ms, me, 1);
            pos = me;
        }
    } else {
        int f;
        while ((f = df_pretok_find(st->fast, st->re, w->md, s, n, pos, &ms, &me)) > 0) {
            if (ms > pos) PUSH(pos, ms, 0);
            PUSH(ms, me, 1);
            pos = me;
        }
        if (f < 0) {
            w->rc = df_err(w->err, w->errlen, DF_EINPUT,
                           "%s: pre-tokenizer step %d of %d (Split regex): PCRE2 gave up matching (its match, depth or heap limit) at byte %zu of a %zu-byte piece; refusing to tokenize",
                           w->t->path, k + 1, w->t->n_steps, pos, n);
            free(v);
            return;
        }
    }
    if (pos < n) PUSH(pos, n, 0);
    if (st->invert)
        for (size_t i = 0; i < nv; i++) v[i].m = !v[i].m;
    piece *o = df_xmalloc((nv + 1) * sizeof *o);
    size_t no = 0;
    int prev = 0;
    switch (st->behavior) {
    case DF_SPLIT_ISOLATED: memcpy(o, v, nv * sizeof *v); no = nv; break;
    case DF_SPLIT_REMOVED:
        for (size_t i = 0; i < nv; i++) if (!v[i].m) o[no++] = v[i];
        break;
    case DF_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < nv; i++) {
            if (v[i].m && !prev && no) o[no - 1].e = v[i].e;
            else o[no++] = v[i];
            prev = v[i].m;
        }
        break;
    case DF_SPLIT_MERGED_NEXT:
        for (size_t i = nv; i-- > 0;) {
            if (v[i].m && !prev && no) o[no - 1].s = v[i].s;
            else o[no++] = v[i];
            prev = v[i].m;
        }
        for (size_t i = 0; i < no / 2; i++) { piece x = o[i]; o[i] = o[no - 1 - i]; o[no - 1 - i] = x; }
        break;
    case DF_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < nv; i++) {
            if (v[i].m == prev && no) o[no - 1].e = v[i].e;
            else o[no++] = v[i];
            prev = v[i].m;
        }
        break;
    }
#undef PUSH
    free(v);
    for (size_t i = 0; i < no && !w->rc; i++) pretok(w, k + 1, s + o[i].s, o[i].e - o[i].s);
    free(o);
}

/* Pre-tokenizer step k over one piece; after the last step, BPE. */
static void pretok(worker *w, int k, const uint8_t *s, size_t n) {
    const df_tokenizer *t = w->t;
    if (n == 0 || w->rc) return;
    if (k == t->n_steps) { to_bpe(w, s, n); return; }
    const df_pretok_step *st = &t->steps[k];
    if (st->prefix_space) {
        if (s[0] == ' ') { pretok(w, k + 1, s, n); return; }
        uint8_t *b = df_xmalloc(n + 1);
        b[0] = ' ';
        memcpy(b + 1, s, n);
        pretok(w, k + 1, b, n + 1);
        free(b);
        return;
    }
    if (st->fast && st->behavior == DF_SPLIT_ISOLATED && !st->invert) {
        size_t pos = 0, ms, me;
        int last = k + 1 == t->n_steps;
        while (!w->rc && df_pretok_find(st->fast, NULL, NULL, s, n, pos, &ms, &me)) {
            if (ms > pos) pretok(w, k + 1, s + pos, ms - pos);
            if (last) to_bpe(w, s + ms, me - ms);
            else pretok(w, k + 1, s + ms, me - ms);
            pos = me;
        }
        if (pos < n) pretok(w, k + 1, s + pos, n - pos);
        return;
    }
    split_general(w, k, s, n);
}

/* Describes normalizer step i: its kind and strings (escaped, shortened). */
static void put_quoted(char *o, size_t ol, const char *s, size_t n) {
    size_t k = 0;
    if (ol < 8) { if (ol) *o = 0; return; }
    o[k++] = '"';
    for (size_t i = 0; i < n && k + 6 < ol; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == 24 && n > 28) { memcpy(o + k, "...", 3); k += 3; break; }
        if (c < 0x20 || c == '"' || c == '\\') k += (size_t)snprintf(o + k, ol - k, "\\x%02x", c);
        else o[k++] = (char)c;
    }
    o[k++] = '"';
    o[k] = 0;
}

void df_tok_norm_describe(const df_tokenizer *t, int i, char *out, size_t outlen) {
    const df_norm_step *st = &t->norm[i];
    char a[48], b[48];
    if (st->kind == DF_NORM_NFC) { snprintf(out, outlen, "NFC"); return; }
    put_quoted(a, sizeof a, st->a, st->alen);
    if (st->kind == DF_NORM_PREPEND) { snprintf(out, outlen, "Prepend %s", a); return; }
    put_quoted(b, sizeof b, st->b, st->blen);
    snprintf(out, outlen, "Replace %s -> %s", a, b);
}

static int norm_cap_err(const df_tokenizer *t, int i, size_t cap, size_t n, char *err, size_t errlen) {
    char d[128];
    df_tok_norm_describe(t, i, d, sizeof d);
    return df_err(err, errlen, DF_EINPUT,
                  "%s: normalizer step %d of %d (%s): its output would exceed %zu bytes, the cap for a %zu-byte input "
                  "(max(64 KiB, %u x input)); refusing to tokenize",
                  t->path, i + 1, t->n_norm, d, cap, n, DF_TOK_OUT_FACTOR);
}

/* Normalizes s (one piece without raw added tokens): *out is a malloc'd
 * buffer, or NULL when the normalizers leave it unchanged. Every stage's
 * output is capped at df_tok_out_cap(n), checked before it grows past the
 * cap (NFC, which at most triples its input, is checked once done). */
int df_tok_normalize(const df_tokenizer *t, const uint8_t *s, size_t n, uint8_t **out, size_t *outlen, char *err, size_t errlen) {
    uint8_t *cur = NULL;
    size_t cl = n, cap = df_tok_out_cap(n);
    *out = NULL;
    for (int i = 0; i < t->n_norm; i++) {
        const df_norm_step *st = &t->norm[i];
        const uint8_t *in = cur ? cur : s;
        uint8_t *o = NULL;
        size_t ol = 0, oc = 0;
        if (st->kind == DF_NORM_NFC) {
            if (df_nfc_quick_span(in, cl) == cl) continue;
            df_nfc_append(in, cl, &o, &ol, &oc);
            if (ol > cap) { free(o); free(cur); return norm_cap_err(t, i, cap, n, err, errlen); }
        } else if (st->kind == DF_NORM_PREPEND) {
            if (!cl) continue;
            if (st->alen > cap - cl) { free(cur); return norm_cap_err(t, i, cap, n, err, errlen); }
            o = df_xmalloc(cl + st->alen);
            memcpy(o, st->a, st->alen);
            memcpy(o + st->alen, in, cl);
            ol = cl + st->alen;
        } else if (st->kind == DF_NORM_REPLACE) {
            df_buf b = {0};
            size_t p = 0;
            while (p < cl) {
                const uint8_t *f = memmem(in + p, cl - p, st->a, st->alen);
                if (!f) break;
                size_t keep = (size_t)(f - in) - p;
                if (keep > cap - b.len || st->blen > cap - b.len - keep) { df_buf_free(&b); free(cur); return norm_cap_err(t, i, cap, n, err, errlen); }
                df_buf_put(&b, in + p, keep);
                df_buf_put(&b, st->b, st->blen);
                p = (size_t)(f - in) + st->alen;
            }
            if (cl - p > cap - b.len) { df_buf_free(&b); free(cur); return norm_cap_err(t, i, cap, n, err, errlen); }
            df_buf_put(&b, in + p, cl - p);
            o = (uint8_t *)b.p;
            ol = b.len;
        }
        free(cur);
        cur = o;
        cl = ol;
    }
    *out = cur;
    *outlen = cl;
    return 0;
}

/* The SentencePiece Metaspace pre-tokenizer (prepend_scheme "first", no
 * split): spaces become U+2581 and, for the piece at the very start of the
 * input, one U+2581 is prepended unless it already starts with one. */
static void pretok_metaspace(worker *w, const uint8_t *s, size_t n, int at_start) {
    if (n == 0) return;
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    int pre = at_start && s[0] != ' ' && !(n >= 3 && !memcmp(s, "\xe2\x96\x81", 3));
    uint8_t stackb[512];
    size_t m = n + 2 * spaces + (pre ? 3 : 0);
    uint8_t *b = m <= sizeof stackb ? stackb : df_xmalloc(m), *o = b;
    if (pre) { memcpy(o, "\xe2\x96\x81", 3); o += 3; }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { memcpy(o, "\xe2\x96\x81", 3); o += 3; }
        else *o++ = s[i];
    }
    pretok(w, 0, b, m);
    if (b != stackb) free(b);
}

static void pretok_top(worker *w, const uint8_t *s, size_t n, int at_start) {
    if (w->t->metaspace_first) pretok_metaspace(w, s, n, at_start);
    else pretok(w, 0, s, n);
}

/* Encodes one piece of text that holds no raw added token; at_start: it
 * begins at offset 0 of the input. */
static void encode_gap(worker *w, const uint8_t *s, size_t n, int at_start) {
    const df_tokenizer *t = w->t;
    size_t nl = n;
    uint8_t *norm = NULL;
    if (w->rc) return;
    if (t->n_norm && (w->rc = df_tok_normalize(t, s, n, &norm, &nl, w->err, w->errlen))) return;
    const uint8_t *x = norm ? norm : s;
    w->budget = df_tok_out_cap(n);
    w->used = 0;
    if (t->has_trie_norm) {
        df_segs segs = {0};
        split_added(t, &t->trie_norm, x, nl, 0, w->special_ok, &segs);
        for (size_t i = 0; i < segs.n && !w->rc; i++) {
            if (segs.v[i].id >= 0) df_ids_push(w->out, segs.v[i].id);
            else pretok_top(w, x + segs.v[i].start, segs.v[i].end - segs.v[i].start, at_start && segs.v[i].start == 0);
        }
        free(segs.v);
    } else {
        pretok_top(w, x, nl, at_start);
    }
    free(norm);
}

static void worker_init(worker *w, const df_tokenizer *t, df_ids *out, int special_ok, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    w->err = err;
    w->errlen = errlen;
    w->t = t;
    w->cache = df_bpe_cache_new();
    w->out = out;
    w->md = pcre2_match_data_create(32, NULL);
    w->special_ok = special_ok;
}
static void worker_free(worker *w) {
    df_bpe_cache_free(w->cache);
    pcre2_match_data_free(w->md);
}

/* ---- Parallel encoding ---------------------------------------------------
 * Cut points. A gap (text between raw added tokens) is cut at b only when
 * text[b-1] == '\n' and text[b] is ASCII graphic (0x21..0x7E), and for the
 * GPT-2 ByteLevel regex also text[b-2] is ASCII graphic. Encoding the two
 * halves separately gives the same ids because every stage restarts at b:
 *  - NFC: '\n' and an ASCII graphic are starters with NFC_QC=Yes that never
 *    compose, so NFC(left + right) = NFC(left) + NFC(right).
 *  - Normalized added tokens: none contains '\n' before its last byte and none
 *    has lstrip (else split_ok is 0), so no match crosses b, and rstrip can only
 *    eat whitespace up to b (text[b] is not whitespace); single_word sees '\n'
 *    before b, a non-word character, exactly like the start of a piece.
 *  - Every supported scanner pattern (cl100k, Qwen2, o200k, Kimi, DeepSeek's
 *    three stages): no alternative can contain '\n' followed by another
 *    character ('\n' is excluded from every optional prefix and letter class,
 *    and appears only in trailing [\r\n]* runs or whitespace runs, which stop
 *    before text[b], a non-space; o200k's trailing run is [\r\n/]*, so for
 *    o200k text[b] must also not be '/'). The match covering text[b-1] therefore ends
 *    exactly at b, both in the full text and in the left half: in the full text
 *    \s+(?!\S) cannot be what matched it because \s*[\r\n]+ is tried first on
 *    the same run and succeeds, ending after the run's last newline, which is
 *    b-1; the left half gives the same match for the same reason. Matching
 *    then restarts at b with no look-behind, so the right half matches alike.
 *    DeepSeek's first two stages only isolate digit / CJK runs that cannot
 *    contain '\n', so any piece of theirs crossing b is cut by stage three at
 *    b anyway.
 *  - GPT-2's \s+(?!\S) comes before plain \s+ and would take "  \n" whole at
 *    the end of a left half while the full text splits it; requiring an ASCII
 *    graphic before the '\n' makes the whitespace run a lone "\n" both ways.
 *  - BPE works per pre-token, and the pieces are the same.
 * Tokenizers with other patterns, Prepend/Replace normalizers or ByteLevel
 * add_prefix_space are encoded serially.
 * Raw added tokens: when none has lstrip or a '\n' before its last byte
 * (split_raw_ok), the raw text itself is cut first and every task matches the
 * added tokens of its own range: no match can cross b (it would hold "\n" and
 * then another byte), rstrip stops at text[b] (not whitespace), single_word
 * sees '\n' or the start of the range before b alike, and a match that ends
 * before b leaves the scan at the same place in both. A gap that then starts
 * at b-1 ("\n" after an added token) is cut to a lone "\n", which every
 * supported pattern matches alone either way. Otherwise the added tokens are
 * matched over the whole text first and only the gaps are cut.
 * Costs: each thread has its own word cache (a thread warms it separately)
 * and writes its ids to a vector of its own, stored into the task's slot once
 * at the end (slots of neighbouring tasks share cache lines). */

static int cut_ok(const df_tokenizer *t, const uint8_t *s, size_t start, size_t b) {
    if (b <= start + 1 || s[b - 1] != '\n' || s[b] < 0x21 || s[b] > 0x7E) return 0;
    if (t->split_need_prev_graphic && (b < start + 2 || s[b - 2] < 0x21 || s[b - 2] > 0x7E)) return 0;
    if (t->split_no_slash && s[b] == '/') return 0;
    return 1;
}

/* First safe cut at or after want in (a, end), or end. */
static size_t next_cut(const df_tokenizer *t, const uint8_t *s, size_t a, size_t want, size_t end) {
    if (want >= end) return end;
    const uint8_t *p = s + (want > a + 1 ? want - 1 : a + 1);
    while (p < s + end) {
        const uint8_t *q = memchr(p, '\n', (size_t)(s + end - p));
        if (!q) break;
        size_t cand = (size_t)(q - s) + 1;
        if (cand < end && cut_ok(t, s, a, cand)) return cand;
        p = q + 1;
    }
    return end;
}

/* Encodes text[a..b): raw added tokens first (when match), then each gap. */
static void encode_range(worker *w, const uint8_t *s, size_t a, size_t b, int match, df_segs *scratch_segs) {
    const df_tokenizer *t = w->t;
    if (!match || !t->has_trie_raw) {
        if (b > a) encode_gap(w, s + a, b - a, a == 0);
        return;
    }
    scratch_segs->n = 0;
    split_added(t, &t->trie_raw, s + a, b - a, a, w->special_ok, scratch_segs);
    for (size_t i = 0; i < scratch_segs->n && !w->rc; i++) {
        const df_seg *g = &scratch_segs->v[i];
        if (g->id >= 0) df_ids_push(w->out, g->id);
        else encode_gap(w, s + g->start, g->end - g->start, g->start == 0);
    }
}

/* A parallel job: task k encodes items [task_start[k], task_start[k+1]),
 * each a range of the text; with match set, a range is raw text in which the
 * task matches the raw added tokens itself (split_raw_ok), else it is an added
 * token (id >= 0) or a gap. Tasks are taken in order from an atomic counter;
 * each has its own result vector, joined in task order. */
typedef struct {
    const df_tokenizer *t;
    const uint8_t *text;
    df_seg *items;
    size_t *task_start;
    size_t n_tasks;
    df_ids *results;
    int special_ok, match;
    pthread_mutex_t err_mu;  /* the first failing task's message */
    int rc;
    char *err;
    size_t errlen;
    _Alignas(64) atomic_size_t next; /* its own cache line: the fields above are read by every thread */
    char pad[64 - sizeof(atomic_size_t)];
} par_job;

static void *par_main(void *arg) {
    par_job *j = arg;
    worker w;
    df_segs segs = {0};
    char err[512] = "";
    worker_init(&w, j->t, NULL, j->special_ok, err, sizeof err);
    for (;;) {
        size_t k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (k >= j->n_tasks) break;
        /* the ids go to a vector of this thread's own, stored into results[k]
         * once at the end: results[] elements of neighbouring tasks share cache
         * lines, and updating them per token made the threads fight over them */
        df_ids mine = {0};
        w.out = &mine;
        size_t bytes = 0;
        for (size_t i = j->task_start[k]; i < j->task_start[k + 1]; i++) bytes += j->items[i].end - j->items[i].start;
        df_ids_grow(&mine, bytes / 3 + 16); /* about 4 bytes per token: one growth at most */
        for (size_t i = j->task_start[k]; i < j->task_start[k + 1] && !w.rc; i++) {
            df_seg *sg = &j->items[i];
            if (sg->id >= 0) df_ids_push(&mine, sg->id);
            else encode_range(&w, j->text, sg->start, sg->end, j->match, &segs);
        }
        j->results[k] = mine;
        if (w.rc) {
            pthread_mutex_lock(&j->err_mu);
            if (!j->rc) { j->rc = w.rc; if (j->err && j->errlen) snprintf(j->err, j->errlen, "%s", err); }
            pthread_mutex_unlock(&j->err_mu);
            break;
        }
    }
    free(segs.v);
    worker_free(&w);
    return NULL;
}

#define PAR_MIN_BYTES (256u << 10)
#define PAR_TASKS_PER_THREAD 16
#define PAR_MIN_TASK (32u << 10)

int df_tok_encode(const df_tokenizer *t, const char *text, size_t len, int flags, int n_threads, int32_t **ids, size_t *n) {
    return df_tok_encode_err(t, text, len, flags, n_threads, ids, n, NULL, 0);
}

static int encode_core(const df_tokenizer *t, const char *text, size_t len, int flags, int n_threads, int32_t **ids, size_t *n,
                       char *err, size_t errlen) {
    const uint8_t *s = (const uint8_t *)text;
    int rc = 0;
    *ids = NULL;
    *n = 0;
    int special_ok = !t->is_tiktoken || (flags & DF_TOK_ALLOW_SPECIAL);
    if (n_threads <= 0) n_threads = df_n_cpus();
    df_ids out = {0};
    df_segs segs = {0};
    if (n_threads <= 1 || len < PAR_MIN_BYTES || !t->split_ok) {
        worker w;
        worker_init(&w, t, &out, special_ok, err, errlen);
        if (len) df_ids_grow(&out, len / 3 + 16);
        encode_range(&w, s, 0, len, 1, &segs);
        rc = w.rc;
        worker_free(&w);
    } else {
        size_t target = len / ((size_t)n_threads * PAR_TASKS_PER_THREAD);
        if (target < PAR_MIN_TASK) target = PAR_MIN_TASK;
        int match = t->split_raw_ok;
        /* what gets cut: the whole text (each task matches added tokens), or
         * the gaps between added tokens matched here */
        if (match || !t->has_trie_raw) seg_push(&segs, 0, len, -1);
        else split_added(t, &t->trie_raw, s, len, 0, special_ok, &segs);
        df_segs items = {0};
        size_t *ts = NULL, nts = 0, tcap = 0, acc = 0;
#define TASK_START(i) do { if (nts == tcap) { tcap = tcap ? tcap * 2 : 64; ts = df_xrealloc(ts, tcap * sizeof *ts); } ts[nts++] = (i); } while (0)
        TASK_START(0);
        for (size_t i = 0; i < segs.n; i++) {
            df_seg g = segs.v[i];
            if (g.id >= 0) { seg_push(&items, g.start, g.end, g.id); continue; }
            size_t a = g.start;
            while (a < g.end) {
                size_t b = next_cut(t, s, a, a + (target > acc ? target - acc : 1), g.end);
                seg_push(&items, a, b, -1);
                acc += b - a;
                a = b;
                if (acc >= target) { TASK_START(items.n); acc = 0; }
            }
        }
        if (ts[nts - 1] != items.n) TASK_START(items.n);
#undef TASK_START
        par_job j = {0};
        j.t = t;
        j.text = s;
        j.items = items.v;
        j.task_start = ts;
        j.n_tasks = nts - 1;
        j.results = df_xcalloc(j.n_tasks ? j.n_tasks : 1, sizeof *j.results);
        j.special_ok = special_ok;
        j.match = match;
        j.err = err;
        j.errlen = errlen;
        pthread_mutex_init(&j.err_mu, NULL);
        atomic_init(&j.next, 0);
        int nt = n_threads < (int)j.n_tasks ? n_threads : (int)j.n_tasks;
        pthread_t *th = df_xmalloc(sizeof *th * (size_t)(nt > 0 ? nt : 1));
        int started = 0;
        for (int i = 1; i < nt; i++)
            if (!pthread_create(&th[started], NULL, par_main, &j)) started++;
        par_main(&j);
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        size_t total = 0;
        for (size_t k = 0; k < j.n_tasks; k++) total += j.results[k].n;
        out.v = df_xmalloc((total ? total : 1) * sizeof *out.v);
        for (size_t k = 0; k < j.n_tasks; k++) {
            if (j.results[k].n) memcpy(out.v + out.n, j.results[k].v, j.results[k].n * sizeof *out.v);
            out.n += j.results[k].n;
            free(j.results[k].v);
        }
        out.cap = total;
        rc = j.rc;
        pthread_mutex_destroy(&j.err_mu);
        free(j.results);
        free(th);
        free(ts);
        free(items.v);
    }
    free(segs.v);
    if (rc) { free(out.v); return rc; }
    if (!out.v) out.v = df_xmalloc(sizeof *out.v);
    *ids = out.v;
    *n = out.n;
    return DF_OK;
}

/* ---- Kimi's slicing guards ----------------------------------------------
 * tokenization_kimi.py does not hand the whole text to tiktoken: it cuts it
 * into slices of 400,000 characters (code points, Python str indices), and
 * cuts each slice again wherever a run of whitespace or of non-whitespace
 * characters (Python's str.isspace) would grow past 25,000; every piece is
 * encoded on its own, so no token spans a cut (not even a special token).
 * This reproduces the cuts exactly. A byte that does not start a valid UTF-8
 * character (Python strings have none) counts as one non-space character. */
#define KIMI_SLICE_CHARS 400000u
#define KIMI_RUN_CHARS 25000u

/* Python's str.isspace (bidirectional class WS, B or S, or category Zs). */
static int py_isspace(uint32_t c) {
    if (c < 0x80) return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20);
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* The code point at s[i] (i < n) and its length; an invalid or truncated
 * sequence is one byte with c = 0xFFFFFFFF. */
static uint32_t kimi_next(const uint8_t *s, size_t n, size_t i, size_t *len) {
    uint8_t b = s[i];
    uint32_t c;
    size_t need;
    *len = 1;
    if (b < 0x80) return b;
    if (b >= 0xc2 && b <= 0xdf) { need = 1; c = b & 0x1fu; }
    else if (b >= 0xe0 && b <= 0xef) { need = 2; c = b & 0x0fu; }
    else if (b >= 0xf0 && b <= 0xf4) { need = 3; c = b & 0x07u; }
    else return 0xFFFFFFFFu;
    if (n - i <= need) return 0xFFFFFFFFu;
    for (size_t k = 1; k <= need; k++) {
        if ((s[i + k] & 0xc0) != 0x80) return 0xFFFFFFFFu;
        c = (c << 6) | (s[i + k] & 0x3fu);
    }
    if ((need == 2 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) || (need == 3 && (c < 0x10000 || c > 0x10ffff)))
        return 0xFFFFFFFFu;
    *len = need + 1;
    return c;
}

static int encode_append(const df_tokenizer *t, const char *text, size_t len, int flags, int n_threads, df_ids *out,
                         char *err, size_t errlen) {
    int32_t *part = NULL;
    size_t np = 0;
    int rc = encode_core(t, text, len, flags, n_threads, &part, &np, err, errlen);
    if (!rc && np) {
        if (out->cap - out->n < np) df_ids_grow(out, np);
        memcpy(out->v + out->n, part, np * sizeof *part);
        out->n += np;
    }
    free(part);
    return rc;
}

int df_tok_encode_err(const df_tokenizer *t, const char *text, size_t len, int flags, int n_threads, int32_t **ids, size_t *n,
                      char *err, size_t errlen) {
    if (!t->kimi_slicing || len <= KIMI_RUN_CHARS) /* at most as many characters as bytes: no cut */
        return encode_core(t, text, len, flags, n_threads, ids, n, err, errlen);
    const uint8_t *s = (const uint8_t *)text;
    *ids = NULL;
    *n = 0;
    df_ids out = {0};
    size_t start = 0, ci = 0, run = 0;
    int run_space = 0, rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t l;
        int sp = py_isspace(kimi_next(s, len, i, &l)), cut = 0;
        if (ci % KIMI_SLICE_CHARS == 0) { cut = ci > 0; run = 1; run_space = sp; } /* a new slice */
        else if (run_space != sp) { run = 1; run_space = sp; }
        else if (++run > KIMI_RUN_CHARS) { cut = 1; run = 1; }
        if (cut) {
            rc = encode_append(t, text + start, i - start, flags, n_threads, &out, err, errlen);
            start = i;
        }
        ci++;
        i += l;
    }
    if (!rc) rc = encode_append(t, text + start, len - start, flags, n_threads, &out, err, errlen);
    if (rc) { free(out.v); return rc; }
    if (!out.v) out.v = df_xmalloc(sizeof *out.v);
    *ids = out.v;
    *n = out.n;
    return DF_OK;
}

int df_tok_is_kimi(const df_tokenizer *t) { return t->kimi_slicing; }
