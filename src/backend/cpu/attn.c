/* attn.c - the attention cores of the mixer kinds as backend operations
 * (the table's attn_gqa, attn_mla), on the CPU backend's pool. The
 * model's mixer kinds compute projections, norms and RoPE and write their
 * state; the loops over positions and heads live here, so another backend
 * can implement them next to its own memory. Per-thread scratch (scores,
 * the absorbed query, a head's dequantized W_uk/W_uv) comes from
 * df_cpu_scratch: grown on first use only, freed at thread exit.
 *
 * Bits: each (token, head) item is computed by one thread in a fixed order,
 * so results do not depend on the thread count. GQA's arithmetic is
 * attn_kernels.h's (defined per score and per output, the same on every
 * ISA), so several positions in one call give exactly the bits of one
 * position at a time (gqa_unit). MLA: see mla_unit. */
#include "backend/cpu/attn_kernels.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"

#include <string.h>

enum { SC_SCORES = 0, SC_QLAT = 1, SC_MLAW = 2, SC_LONG = 4 }; /* (ops.c uses 3) */
/* the batched paths shrink their tiles of positions to keep the per-thread
 * scores scratch under this (4 MB; a tile of one position always fits
 * what the one-position path needs) */
#define ATTN_SCRATCH_FLOATS ((int64_t)1 << 20)

/* The GQA core. The unit of work is (KV head, a range of that head's group
 * of query heads, a tile of consecutive positions); its queries are the
 * tile's positions x the range's heads, packed into thread scratch. A
 * unit computes every score of its queries over the keys up to its last
 * position (df_ka_scores: K rows read once per block of queries), the
 * softmax of each query over its own length (scores beyond a query's
 * causal length are set to 0 and add exact zeros), then P x V in chunks
 * of GQA_KC keys (a chunk's V rows read once for all the unit's queries),
 * and scales each output by 1 / sum. All of this is attn_kernels.h's
 * per-(query, key) and per-(query, dimension) arithmetic, which no
 * blocking changes: one-position decode (a tile of one position) and a
 * batch of positions (prefill, a speculative verify pass) give the same
 * bits, on any thread count. (The one exception would be a V row holding
 * inf or NaN, where 0 x V is not an exact zero.) */
enum { GQA_QT = 16, GQA_KC = 64 };
typedef struct {
    void (*scores)(const float *, int, const float *, int64_t, int, int, float, float *, int64_t);
    float (*softmax)(float *, int);
    void (*pv)(const float *, int64_t, int, const float *, int64_t, int, int, float *);
} ka_fns;
static ka_fns ka_kernels(void) {
    const int i = df_isa(); /* AVX-512 runs the AVX2 kernels: 8 lanes is part of the arithmetic's definition */
    if (i == DF_ISA_AVX512 || i == DF_ISA_AVX2) return (ka_fns){df_ka_scores_avx2, df_ka_softmax_avx2, df_ka_pv_avx2};
    return (ka_fns){df_ka_scores_scalar, df_ka_softmax_scalar, df_ka_pv_scalar};
}

typedef struct {
    const df_attn_gqa_args *a;
    ka_fns f;
    int qt, tiles, nsub; /* positions per tile, tiles, ranges of query heads per group */
} gqa_ctx;

static void gqa_unit(const gqa_ctx *c, int kvh, int g0, int g1, int t0, int t1) {
    const df_attn_gqa_args *a = c->a;
    const int NH = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, grp = NH / KV, ng = g1 - g0, nq = (t1 - t0) * ng;
    const size_t kdim = (size_t)KV * hd;
    const int64_t ld = 2 * (int64_t)kdim; /* position j: K at j*2*kdim, V after it */
    const float *kc = DF_CF(a->kv) + (size_t)kvh * hd, *vc = kc + kdim;
    const int maxlen = a->pos0 + t1; /* the last position's length */
    float *sc = df_cpu_scratch(SC_SCORES, (size_t)nq * maxlen); /* a row of maxlen scores per query */
    float *qp = df_cpu_scratch(SC_QLAT, (size_t)nq * (2 * hd + 1)), *op = qp + (size_t)nq * hd, *inv = op + (size_t)nq * hd;
    for (int t = t0; t < t1; t++) /* query i = (t - t0) * ng + (g - g0) */
        memcpy(qp + (size_t)(t - t0) * ng * hd, DF_CF(a->q) + ((size_t)t * NH + (size_t)kvh * grp + g0) * hd,
               (size_t)ng * hd * sizeof(float));
    c->f.scores(qp, nq, kc, ld, maxlen, hd, a->scale, sc, maxlen);
    for (int i = 0; i < nq; i++) {
        const int len = a->pos0 + t0 + i / ng + 1;
        float *s = sc + (size_t)i * maxlen;
        inv[i] = 1.0f / c->f.softmax(s, len);
        if (len < maxlen) memset(s + len, 0, (size_t)(maxlen - len) * sizeof(float));
    }
    memset(op, 0, (size_t)nq * hd * sizeof(float));
    for (int j0 = 0; j0 < maxlen; j0 += GQA_KC)
        c->f.pv(sc + j0, maxlen, nq, vc + (size_t)j0 * ld, ld, maxlen - j0 < GQA_KC ? maxlen - j0 : GQA_KC, hd, op);
    for (int i = 0; i < nq; i++) {
        const int t = t0 + i / ng, g = g0 + i % ng;
        float *out = DF_F(a->out) + ((size_t)t * NH + (size_t)kvh * grp + g) * hd;
        const float *o = op + (size_t)i * hd;
        for (int d = 0; d < hd; d++) out[d] = o[d] * inv[i];
    }
}

/* share `sh` of `nsh`: units [b, e) of KV x nsub x tiles */
static void gqa_task(void *p, int sh, int nsh) {
    const gqa_ctx *c = p;
    const df_attn_gqa_args *a = c->a;
    const int grp = a->n_heads / a->n_kv_heads;
    const int64_t units = (int64_t)a->n_kv_heads * c->nsub * c->tiles;
    for (int64_t u = units * sh / nsh, e = units * (sh + 1) / nsh; u < e; u++) {
        const int tile = (int)(u % c->tiles), sub = (int)(u / c->tiles % c->nsub), kvh = (int)(u / c->tiles / c->nsub);
        const int t0 = tile * c->qt, g0 = grp * sub / c->nsub, g1 = grp * (sub + 1) / c->nsub;
        gqa_unit(c, kvh, g0, g1, t0, a->n - t0 < c->qt ? a->n : t0 + c->qt);
    }
}

/* Long caches, one position (a decode step) or a few: in the units above every unit
 * reads its KV head's whole cache, so a thread's share is whole KV heads (SmolLM2's 3 over 2 threads: one
 * thread does two thirds) and a batch of tiles reads the cache once per tile. Here the same arithmetic runs in
 * three rounds over the pool, each split evenly: (1) every score, units of a range of keys for every KV head (the
 * range's whole rows touched first: touch_rows), the cache's K rows read once for all positions and heads; (2) each query's softmax over its own
 * length; (3) P x V, units of (KV head, 32 dimensions), the V rows read once. Each score, softmax and output
 * is computed by exactly the kernels' calls of gqa_unit on the same rows (scores per (query, key), P x V per
 * (query, dimension) over the keys in order in chunks of GQA_KC), so the bits are the same. */
/* Also for a few positions (a verify pass of speculative decoding, up to GQA_LONG_N): the tiles of positions
 * read each KV head's cache once per tile (1.4 reads of the cache per pass, cachegrind) where the rounds read it
 * once. Measured (verify_bench, SmolLM2 Q4_1, 1,346 positions, 2 threads, 3 x 20 reps interleaved, quiet,
 * 2026-12-02 09:03): a 6-position exact pass 33.2-33.5 -> 29.8-32.3 ms mean; on the same path in a slower phase
 * of this host (05:50) it had read 53 -> 59 ms, so the choice follows the memory: the rounds' scores scratch is
 * bounded (GQA_LONG_MAXF floats) and above it the tiles run. */
enum { GQA_LONG_KEYS = 512, GQA_LONG_N = 8, GQA_LONG_KC = 64 };
#define GQA_LONG_MAXF ((size_t)8 << 20) /* scores scratch of the rounds for more than one position: 32 MB */
typedef struct {
    const df_attn_gqa_args *a;
    ka_fns f;
    float *sc, *inv; /* [KV][n][grp] rows of maxlen scores; 1 / sum per row */
    int maxlen, kchunks, slabs, slab;
} gqa_long_ctx;

/* One load per 64-byte line of rows [0, n) of w floats, ld apart, four chains: the cache's rows (K and V of every
 * KV head, 2 x kdim floats) are read whole, so the hardware prefetcher streams them into L2 and the rounds below read
 * K and V from there. Reading only one head's K rows (256 B of every 1.5 KB for SmolLM2) and later its V rows
 * streams at about half the rate: `build/bench/attn_read` (one thread, SmolLM2's cache at 1,346 positions, 30
 * layers, 62 MB) read it in 7.5 ms that way, 4.1 ms with this touch first, 2.5 ms as whole rows once (its floor);
 * at 8,192 positions 10.1 / 7.5 / 3.2 ms. Loads only: no result depends on it. */
static void touch_rows(const float *p, int64_t ld, int n, size_t w) {
    uint32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, u;
    size_t d;
    for (int r = 0; r < n; r++) {
        const float *q = p + (size_t)r * ld;
        for (d = 0; d + 64 <= w; d += 64) {
            memcpy(&u, q + d, 4), a0 |= u;
            memcpy(&u, q + d + 16, 4), a1 |= u;
            memcpy(&u, q + d + 32, 4), a2 |= u;
            memcpy(&u, q + d + 48, 4), a3 |= u;
        }
        for (; d < w; d += 16) memcpy(&u, q + d, 4), a0 |= u;
    }
    const uint32_t t = a0 | a1 | a2 | a3;
    __asm__ volatile("" : : "r"(t)); /* keep the loads */
}

/* Round 1: units of GQA_LONG_KC keys, each for every KV head (the rows touched whole first, then each head's
 * scores over them: the calls and bits of the per-head units before). */
static void gqa_long_scores(void *p, int sh, int nsh) {
    const gqa_long_ctx *c = p;
    const df_attn_gqa_args *a = c->a;
    const int NH = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, grp = NH / KV, n = a->n, nq = n * grp;
    const size_t kdim = (size_t)KV * hd;
    const int64_t units = c->kchunks;
    float *qp = df_cpu_scratch(SC_QLAT, (size_t)nq * hd);
    for (int64_t u = units * sh / nsh, e = units * (sh + 1) / nsh; u < e; u++) {
        const int j0 = (int)u * GQA_LONG_KC, nk = c->maxlen - j0 < GQA_LONG_KC ? c->maxlen - j0 : GQA_LONG_KC;
        touch_rows(DF_CF(a->kv) + (size_t)j0 * 2 * kdim, 2 * (int64_t)kdim, nk, 2 * kdim);
        for (int kvh = 0; kvh < KV; kvh++) {
            for (int t = 0; t < n; t++)
                memcpy(qp + (size_t)t * grp * hd, DF_CF(a->q) + ((size_t)t * NH + (size_t)kvh * grp) * hd, (size_t)grp * hd * sizeof(float));
            const float *kc = DF_CF(a->kv) + (size_t)kvh * hd + (size_t)j0 * 2 * kdim;
            c->f.scores(qp, nq, kc, 2 * (int64_t)kdim, nk, hd, a->scale, c->sc + (size_t)kvh * nq * c->maxlen + j0, c->maxlen);
        }
    }
}

static void gqa_long_softmax(void *p, int sh, int nsh) {
    const gqa_long_ctx *c = p;
    const df_attn_gqa_args *a = c->a;
    const int grp = a->n_heads / a->n_kv_heads, rows = a->n_kv_heads * a->n * grp;
    for (int r = rows * sh / nsh, e = rows * (sh + 1) / nsh; r < e; r++) {
        const int t = r / grp % a->n, len = a->pos0 + t + 1;
        float *s = c->sc + (size_t)r * c->maxlen;
        c->inv[r] = 1.0f / c->f.softmax(s, len);
        if (len < c->maxlen) memset(s + len, 0, (size_t)(c->maxlen - len) * sizeof(float));
    }
}

static void gqa_long_pv(void *p, int sh, int nsh) {
    const gqa_long_ctx *c = p;
    const df_attn_gqa_args *a = c->a;
    const int NH = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, grp = NH / KV, n = a->n, nq = n * grp, w = c->slab;
    const size_t kdim = (size_t)KV * hd;
    const int64_t ld = 2 * (int64_t)kdim, units = (int64_t)KV * c->slabs;
    for (int64_t u = units * sh / nsh, e = units * (sh + 1) / nsh; u < e; u++) {
        const int kvh = (int)(u / c->slabs), d0 = (int)(u % c->slabs) * w;
        const float *vc = DF_CF(a->kv) + kdim + (size_t)kvh * hd + d0, *P = c->sc + (size_t)kvh * nq * c->maxlen;
        float *op = df_cpu_scratch(SC_QLAT, (size_t)nq * w);
        memset(op, 0, (size_t)nq * w * sizeof(float));
        for (int j0 = 0; j0 < c->maxlen; j0 += GQA_KC)
            c->f.pv(P + j0, c->maxlen, nq, vc + (size_t)j0 * ld, ld, c->maxlen - j0 < GQA_KC ? c->maxlen - j0 : GQA_KC, w, op);
        for (int i = 0; i < nq; i++) {
            const int t = i / grp, g = i % grp;
            float *out = DF_F(a->out) + ((size_t)t * NH + (size_t)kvh * grp + g) * hd + d0;
            const float *o = op + (size_t)i * w, iv = c->inv[(size_t)kvh * nq + i];
            for (int d = 0; d < w; d++) out[d] = o[d] * iv;
        }
    }
}

/* 1 if it ran (a long cache, few positions, more than one thread) */
static int gqa_long(const df_attn_gqa_args *a) {
    const int nth = df_pool_size(), maxlen = a->pos0 + a->n;
    if (nth < 2 || a->n > GQA_LONG_N || maxlen < GQA_LONG_KEYS || a->n_kv_heads % nth == 0) return 0;
    if (a->n > 1 && (size_t)a->n_heads * a->n * ((size_t)maxlen + 1) > GQA_LONG_MAXF) return 0;
    gqa_long_ctx c = {a, ka_kernels(), NULL, NULL, maxlen, (maxlen + GQA_LONG_KC - 1) / GQA_LONG_KC, 1, a->head_dim};
    if (a->head_dim % 32 == 0) c.slabs = a->head_dim / 32, c.slab = 32;
    const size_t rows = (size_t)a->n_heads * a->n;
    c.sc = df_cpu_scratch(SC_LONG, rows * ((size_t)maxlen + 1)); /* the caller's buffer, shared for the three rounds */
    c.inv = c.sc + rows * (size_t)maxlen;
    df_pool_run_shares(gqa_long_scores, &c, c.kchunks);
    df_pool_run_shares(gqa_long_softmax, &c, (int)(rows < 64 ? rows : 64));
    df_pool_run_shares(gqa_long_pv, &c, a->n_kv_heads * c.slabs);
    return 1;
}

void df_cpu_attn_gqa_tiled(const df_attn_gqa_args *a, int qt, int nsub) {
    if (qt <= 0 && gqa_long(a)) return;
    const int small = (int64_t)a->n * a->n_heads * (a->pos0 + a->n) * a->head_dim < 32768; /* too little work to share */
    const int nth = df_pool_size(), KV = a->n_kv_heads, grp = a->n_heads / KV;
    gqa_ctx c = {a, ka_kernels(), 1, a->n, 1};
    if (qt > 0 && nsub > 0) { /* given (tests) */
        c.qt = qt < a->n ? qt : a->n, c.nsub = nsub < grp ? nsub : grp, c.tiles = (a->n + c.qt - 1) / c.qt;
    } else if (a->n == 1) {
        /* decode: a unit per KV head (its group's queries share each K/V row read), the groups split only
         * when there are fewer KV heads than threads */
        c.nsub = KV >= nth ? 1 : (nth + KV - 1) / KV < grp ? (nth + KV - 1) / KV : grp;
    } else {
        /* tiles small enough for ~4 units per thread, at most GQA_QT positions */
        int qt = (int)(((int64_t)a->n * KV) / (4 * nth));
        qt = qt < 1 ? 1 : qt > GQA_QT ? GQA_QT : qt;
        while (qt > 1 && (int64_t)qt * grp * (a->pos0 + a->n) > ATTN_SCRATCH_FLOATS) qt /= 2; /* scores scratch per thread */
        c.qt = qt, c.tiles = (a->n + qt - 1) / qt;
    }
    const int units = KV * c.nsub * c.tiles;
    if (small) gqa_task(&c, 0, 1);
    else df_pool_run_shares(gqa_task, &c, units);
}

void df_cpu_attn_gqa(const df_attn_gqa_args *a) { df_cpu_attn_gqa_tiled(a, 0, 0); }

/* One (token, head) of MLA given its absorbed query qlat [R]: scores over the
 * latent cache, softmax, and o_lat = sum_j p_j c_j written back into qlat;
 * the arithmetic of mla_unit (attn_kernels.h), sc holding 2 len floats. */
static void mla_attend(const df_attn_mla_args *a, const ka_fns *f, const float *q, float *qlat, float *sc, int len) {
    const int nope = a->nope, rope = a->rope, R = a->kv_lora;
    const int64_t cdim = (int64_t)R + rope;
    const float *cache = DF_CF(a->cache);
    float *sr = sc + len;
    f->scores(qlat, 1, cache, cdim, len, R, 1.0f, sc, len);
    f->scores(q + nope, 1, cache + R, cdim, len, rope, 1.0f, sr, len);
    for (int j = 0; j < len; j++) {
        const float x = sc[j] + sr[j];
        sc[j] = x * a->scale;
    }
    const float inv = 1.0f / f->softmax(sc, len);
    memset(qlat, 0, (size_t)R * sizeof(float));
    for (int j0 = 0; j0 < len; j0 += 64)
        f->pv(sc + j0, len, 1, cache + (size_t)j0 * cdim, cdim, len - j0 < 64 ? len - j0 : 64, R, qlat);
    for (int r = 0; r < R; r++) qlat[r] *= inv;
}

/* Decode: (token, head) items; the absorbed query q_lat = W_uk^T q_nope is a
 * product with kv_b's rows (or k_b's, in the GGUF split form). */
static void mla_task(void *p, int tid, int nth) {
    const df_attn_mla_args *a = p;
    const int NH = a->n_heads, nope = a->nope, rope = a->rope, R = a->kv_lora, vd = a->v_dim;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    float *sc = df_cpu_scratch(SC_SCORES, 2 * (size_t)(a->pos0 + a->n));
    float *qlat = df_cpu_scratch(SC_QLAT, cdim); /* [R] absorbed q, then reused for o_lat */
    const ka_fns f = ka_kernels();
    const int items = a->n * NH;
    for (int it = tid; it < items; it += nth) {
        int t = it / NH, h = it % NH, len = a->pos0 + t + 1;
        const float *q = DF_CF(a->q) + ((size_t)t * NH + h) * qh;
        const int64_t kv_row0 = (int64_t)h * (nope + vd);
        if (a->k_b->data) /* split form: q_lat[c] = W_uk^T[h][c] . q_nope */
            for (int c2 = 0; c2 < R; c2++) qlat[c2] = df_dot_row(a->k_b, (int64_t)h * R + c2, q);
        else
            df_cpu_matvec_t_rows(a->kv_b, kv_row0, nope, q, qlat);
        mla_attend(a, &f, q, qlat, sc, len);
        float *out = DF_F(a->out) + ((size_t)t * NH + h) * vd;
        if (a->v_b->data)
            for (int i = 0; i < vd; i++) out[i] = df_dot_row(a->v_b, (int64_t)h * vd + i, qlat);
        else
            for (int i = 0; i < vd; i++) out[i] = df_dot_row(a->kv_b, kv_row0 + nope + i, qlat);
    }
}

/* Prefill and verify passes: the unit of work is (head, tile of up to
 * MLA_QT consecutive positions). The head's W_uk and W_uv rows are
 * dequantized into thread scratch once per unit (the per-(token, head) path
 * would dequantize them per token), the tile's absorbed queries are formed,
 * then attn_kernels.h's scores (q_lat . c_j and q_rope . k_rot_j, added,
 * times the scale), softmax and o_lat = sum_j e_j c_j / sum run over the
 * latent cache (P x V in chunks of MLA_KC rows, each chunk read once for all
 * the tile's queries); mla_attend, the decode path's, is the same
 * arithmetic for one query. Each
 * (token, head) is computed with the same operations in the same order
 * whatever the tile, so the results do not depend on the tiling, the thread
 * count or how positions are batched (n >= 2; one position takes the decode
 * path, which reads the stored weights directly: equal within rounding). */
enum { MLA_QT = 16, MLA_KC = 64 };
typedef struct {
    const df_attn_mla_args *a;
    int qt, tiles; /* positions per tile, tiles per head */
    ka_fns f;
} mla_batch_ctx;

static void mla_unit(const mla_batch_ctx *c, int h, int t0, int t1) {
    const df_attn_mla_args *a = c->a;
    const int NH = a->n_heads, nope = a->nope, rope = a->rope, R = a->kv_lora, vd = a->v_dim, nt = t1 - t0;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    const int maxlen = a->pos0 + t1;
    /* per position: a row of maxlen scores, the rope query, a row of rope scores, 1 / sum */
    float *sc = df_cpu_scratch(SC_SCORES, (size_t)nt * (2 * (size_t)maxlen + rope + 1));
    float *qlat = df_cpu_scratch(SC_QLAT, (size_t)nt * R);       /* [nt][R] absorbed q, then o_lat */
    float *wk = df_cpu_scratch(SC_MLAW, (size_t)(nope + vd) * R); /* [nope x R] (kv_b) or [R x nope] (k_b) */
    float *wv = wk + (size_t)nope * R;                            /* [vd x R] */
    const df_weight *kb = a->k_b, *vb = a->v_b, *kvb = a->kv_b;
    const float *cache = DF_CF(a->cache);
    const int64_t kv_row0 = (int64_t)h * (nope + vd);
    if (kb->data)
        for (int r = 0; r < R; r++) df_dequant_row(kb, (int64_t)h * R + r, wk + (size_t)r * nope);
    else
        for (int d = 0; d < nope; d++) df_dequant_row(kvb, kv_row0 + d, wk + (size_t)d * R);
    for (int i = 0; i < vd; i++)
        df_dequant_row(vb->data ? vb : kvb, vb->data ? (int64_t)h * vd + i : kv_row0 + nope + i, wv + (size_t)i * R);
    for (int t = t0; t < t1; t++) {
        const float *q = DF_CF(a->q) + ((size_t)t * NH + h) * qh;
        float *ql = qlat + (size_t)(t - t0) * R;
        if (kb->data) {
            for (int r = 0; r < R; r++) ql[r] = df_cpu_dot(wk + (size_t)r * nope, q, nope);
        } else {
            memset(ql, 0, (size_t)R * sizeof(float));
            for (int d = 0; d < nope; d++) df_cpu_axpy(ql, q[d], wk + (size_t)d * R, R);
        }
    }
    /* scores: (q_lat . c_j + q_rope . k_rot_j) * scale, each dot attn_kernels.h's (scale 1: exact) */
    float *qr = sc + (size_t)nt * maxlen; /* [nt][rope] rotated queries, then [nt][maxlen] rope scores */
    float *sr = qr + (size_t)nt * rope, *inv = sr + (size_t)nt * maxlen;
    for (int t = t0; t < t1; t++)
        memcpy(qr + (size_t)(t - t0) * rope, DF_CF(a->q) + ((size_t)t * NH + h) * qh + nope, (size_t)rope * sizeof(float));
    c->f.scores(qlat, nt, cache, (int64_t)cdim, maxlen, R, 1.0f, sc, maxlen);
    c->f.scores(qr, nt, cache + R, (int64_t)cdim, maxlen, rope, 1.0f, sr, maxlen);
    for (int i = 0; i < nt; i++) {
        const int len = a->pos0 + t0 + i + 1;
        float *s = sc + (size_t)i * maxlen;
        const float *s2 = sr + (size_t)i * maxlen;
        for (int j = 0; j < len; j++) {
            const float x = s[j] + s2[j];
            s[j] = x * a->scale;
        }
        inv[i] = 1.0f / c->f.softmax(s, len);
        if (len < maxlen) memset(s + len, 0, (size_t)(maxlen - len) * sizeof(float));
    }
    /* o_lat = sum_j e_j c_j / sum, into qlat */
    memset(qlat, 0, (size_t)nt * R * sizeof(float));
    for (int j0 = 0; j0 < maxlen; j0 += MLA_KC)
        c->f.pv(sc + j0, maxlen, nt, cache + (size_t)j0 * cdim, (int64_t)cdim, maxlen - j0 < MLA_KC ? maxlen - j0 : MLA_KC, R, qlat);
    for (int i = 0; i < nt; i++)
        for (int r = 0; r < R; r++) qlat[(size_t)i * R + r] *= inv[i];
    for (int t = t0; t < t1; t++) {
        float *out = DF_F(a->out) + ((size_t)t * NH + h) * vd;
        for (int i = 0; i < vd; i++) out[i] = df_cpu_dot(wv + (size_t)i * R, qlat + (size_t)(t - t0) * R, R);
    }
}

/* share `sh` of `nsh`: units [b, e) of heads x tiles (unit u: head u / tiles, tile u % tiles) */
static void mla_batch_task(void *p, int sh, int nsh) {
    const mla_batch_ctx *c = p;
    const df_attn_mla_args *a = c->a;
    const int64_t units = (int64_t)a->n_heads * c->tiles;
    for (int64_t u = units * sh / nsh, e = units * (sh + 1) / nsh; u < e; u++) {
        const int h = (int)(u / c->tiles), t0 = (int)(u % c->tiles) * c->qt;
        mla_unit(c, h, t0, a->n - t0 < c->qt ? a->n : t0 + c->qt);
    }
}

void df_cpu_attn_mla(const df_attn_mla_args *a) {
    /* exact products (a verify pass: backend.h) take the decode path per (token, head): a plain step's bits */
    if (a->n == 1 || df_cpu_exact_on()) { df_pool_run(mla_task, (void *)a); return; }
    mla_batch_ctx c = {a, a->n < MLA_QT ? a->n : MLA_QT, 0, ka_kernels()};
    while (c.qt > 1 && (int64_t)c.qt * 2 * (a->pos0 + a->n) > ATTN_SCRATCH_FLOATS) c.qt /= 2; /* scores scratch per thread */
    c.tiles = (a->n + c.qt - 1) / c.qt;
    df_pool_run_shares(mla_batch_task, &c, a->n_heads * c.tiles);
}
