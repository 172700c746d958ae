/* attn.c - the attention cores of the mixer kinds as backend operations
 * (the table's attn_gqa, attn_mla), on the CPU backend's pool. The
 * model's mixer kinds compute projections, norms and RoPE and write their
 * state; the loops over positions and heads live here, so another backend
 * can implement them next to its own memory. Per-thread scratch (scores,
 * the absorbed query, a head's dequantized W_uk/W_uv) comes from
 * df_cpu_scratch: grown on first use only, freed at thread exit.
 *
 * Bits: each (token, head) item is computed by one thread in a fixed order,
 * so results do not depend on the thread count; GQA over several positions
 * computes each item exactly as one-position decode does (gqa_unit). */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"

#include <string.h>

enum { SC_SCORES = 0, SC_QLAT = 1, SC_MLAW = 2 };
/* the batched paths shrink their tiles of positions to keep the per-thread
 * scores scratch under this (4 MB; a tile of one position always fits
 * what the one-position path needs) */
#define ATTN_SCRATCH_FLOATS ((int64_t)1 << 20)

/* The f32 dot and axpy kernels of the current ISA (those of df_cpu_dot and
 * df_cpu_axpy), fetched once per task rather than once per 64-float call. */
typedef float (*dot_fn)(const float *, const float *, int64_t);
typedef void (*axpy_fn)(float *, float, const float *, int64_t);
static dot_fn dot_kernel(void) {
    const int i = df_isa();
    return i == DF_ISA_AVX512 ? df_k_dot_f32_avx512 : i == DF_ISA_AVX2 ? df_k_dot_f32_avx2 : df_k_dot_f32_scalar;
}
static axpy_fn axpy_kernel(void) {
    const int i = df_isa();
    return i == DF_ISA_AVX512 ? df_k_axpy_avx512 : i == DF_ISA_AVX2 ? df_k_axpy_avx2 : df_k_axpy_scalar;
}

static void gqa_task(void *p, int tid, int nth) {
    const df_attn_gqa_args *a = p;
    const int NH = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, grp = NH / KV;
    const size_t kdim = (size_t)KV * hd;
    const float *kc = DF_CF(a->kv), *vc = DF_CF(a->kv) + kdim; /* position j: K at j*2*kdim, V after it */
    float *sc = df_cpu_scratch(SC_SCORES, (size_t)(a->pos0 + a->n));
    const dot_fn dot = dot_kernel();
    const axpy_fn axpy = axpy_kernel();
    const int items = a->n * NH;
    for (int it = tid; it < items; it += nth) {
        int t = it / NH, h = it % NH, kvh = h / grp, len = a->pos0 + t + 1;
        const float *q = DF_CF(a->q) + ((size_t)t * NH + h) * hd;
        for (int j = 0; j < len; j++) sc[j] = dot(q, kc + (size_t)j * 2 * kdim + (size_t)kvh * hd, hd) * a->scale;
        df_cpu_softmax(sc, len);
        float *out = DF_F(a->out) + ((size_t)t * NH + h) * hd;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int j = 0; j < len; j++) axpy(out, sc[j], vc + (size_t)j * 2 * kdim + (size_t)kvh * hd, hd);
    }
}

/* Batched positions (prefill, a speculative verify pass): the unit of work
 * is (KV head, tile of consecutive positions); its queries are the tile's
 * positions x the heads of that KV head's group. Keys go in chunks of
 * GQA_KC: a chunk's K rows are read once for all of the unit's queries
 * (they stay in L1), then its V rows likewise. Each query's arithmetic is
 * gqa_task's, in the same order: s_j = dot(q, k_j) * scale for j < its
 * length, the same softmax, out = sum_j p_j v_j by axpy in key order; so a
 * batch's attention equals the one-position decode path's bit for bit, and
 * the tiling (which depends on the thread count) changes no result. */
enum { GQA_QT = 16, GQA_KC = 64 };
typedef struct {
    const df_attn_gqa_args *a;
    int qt, tiles; /* positions per tile, tiles per KV head */
} gqa_batch_ctx;

static void gqa_unit(const df_attn_gqa_args *a, int kvh, int t0, int t1) {
    const int NH = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, grp = NH / KV;
    const size_t kdim = (size_t)KV * hd;
    const float *kc = DF_CF(a->kv) + (size_t)kvh * hd, *vc = kc + kdim; /* position j at j*2*kdim */
    const int maxlen = a->pos0 + t1; /* the last position's length */
    float *sc = df_cpu_scratch(SC_SCORES, (size_t)(t1 - t0) * grp * maxlen); /* a row of maxlen scores per query */
    const dot_fn dot = dot_kernel();
    const axpy_fn axpy = axpy_kernel();
    for (int j0 = 0; j0 < maxlen; j0 += GQA_KC) {
        const int j1 = maxlen - j0 < GQA_KC ? maxlen : j0 + GQA_KC;
        for (int t = t0; t < t1; t++) {
            const int je = a->pos0 + t + 1 < j1 ? a->pos0 + t + 1 : j1;
            for (int g = 0; g < grp; g++) {
                const float *q = DF_CF(a->q) + ((size_t)t * NH + (size_t)kvh * grp + g) * hd;
                float *s = sc + ((size_t)(t - t0) * grp + g) * maxlen;
                for (int j = j0; j < je; j++) s[j] = dot(q, kc + (size_t)j * 2 * kdim, hd) * a->scale;
            }
        }
    }
    for (int t = t0; t < t1; t++)
        for (int g = 0; g < grp; g++) {
            df_cpu_softmax(sc + ((size_t)(t - t0) * grp + g) * maxlen, a->pos0 + t + 1);
            memset(DF_F(a->out) + ((size_t)t * NH + (size_t)kvh * grp + g) * hd, 0, (size_t)hd * sizeof(float));
        }
    for (int j0 = 0; j0 < maxlen; j0 += GQA_KC) {
        const int j1 = maxlen - j0 < GQA_KC ? maxlen : j0 + GQA_KC;
        for (int t = t0; t < t1; t++) {
            const int je = a->pos0 + t + 1 < j1 ? a->pos0 + t + 1 : j1;
            for (int g = 0; g < grp; g++) {
                float *out = DF_F(a->out) + ((size_t)t * NH + (size_t)kvh * grp + g) * hd;
                const float *s = sc + ((size_t)(t - t0) * grp + g) * maxlen;
                for (int j = j0; j < je; j++) axpy(out, s[j], vc + (size_t)j * 2 * kdim, hd);
            }
        }
    }
}

/* share `sh` of `nsh`: units [b, e) of KV x tiles (unit u: KV head u / tiles, tile u % tiles) */
static void gqa_batch_task(void *p, int sh, int nsh) {
    const gqa_batch_ctx *c = p;
    const df_attn_gqa_args *a = c->a;
    const int64_t units = (int64_t)a->n_kv_heads * c->tiles;
    const int64_t b = units * sh / nsh, e = units * (sh + 1) / nsh;
    for (int64_t u = b; u < e; u++) {
        const int kvh = (int)(u / c->tiles), t0 = (int)(u % c->tiles) * c->qt;
        gqa_unit(a, kvh, t0, a->n - t0 < c->qt ? a->n : t0 + c->qt);
    }
}

void df_cpu_attn_gqa(const df_attn_gqa_args *a) {
    const int small = (int64_t)a->n * a->n_heads * (a->pos0 + a->n) * a->head_dim < 32768; /* too little work to share */
    if (a->n == 1) {
        if (small) gqa_task((void *)a, 0, 1);
        else df_pool_run(gqa_task, (void *)a);
        return;
    }
    /* tiles small enough for ~4 units per thread, at most GQA_QT positions */
    const int nth = df_pool_size();
    int qt = (int)(((int64_t)a->n * a->n_kv_heads) / (4 * nth));
    qt = qt < 1 ? 1 : qt > GQA_QT ? GQA_QT : qt;
    const int grp = a->n_heads / a->n_kv_heads;
    while (qt > 1 && (int64_t)qt * grp * (a->pos0 + a->n) > ATTN_SCRATCH_FLOATS) qt /= 2; /* scores scratch per thread */
    gqa_batch_ctx c = {a, qt, (a->n + qt - 1) / qt};
    const int units = a->n_kv_heads * c.tiles;
    if (small) gqa_batch_task(&c, 0, 1);
    else df_pool_run_shares(gqa_batch_task, &c, units);
}

/* One (token, head) of MLA given its absorbed query qlat [R]: scores over the
 * latent cache, softmax, and o_lat = sum_j p_j c_j written back into qlat. */
static void mla_attend(const df_attn_mla_args *a, const float *q, float *qlat, float *sc, int len) {
    const int nope = a->nope, rope = a->rope, R = a->kv_lora;
    const size_t cdim = (size_t)R + rope;
    for (int j = 0; j < len; j++) {
        const float *cj = DF_CF(a->cache) + (size_t)j * cdim;
        sc[j] = (df_cpu_dot(qlat, cj, R) + df_cpu_dot(q + nope, cj + R, rope)) * a->scale;
    }
    df_cpu_softmax(sc, len);
    memset(qlat, 0, (size_t)R * sizeof(float));
    for (int j = 0; j < len; j++) df_cpu_axpy(qlat, sc[j], DF_CF(a->cache) + (size_t)j * cdim, R);
}

/* Decode: (token, head) items; the absorbed query q_lat = W_uk^T q_nope is a
 * product with kv_b's rows (or k_b's, in the GGUF split form). */
static void mla_task(void *p, int tid, int nth) {
    const df_attn_mla_args *a = p;
    const int NH = a->n_heads, nope = a->nope, rope = a->rope, R = a->kv_lora, vd = a->v_dim;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    float *sc = df_cpu_scratch(SC_SCORES, (size_t)(a->pos0 + a->n));
    float *qlat = df_cpu_scratch(SC_QLAT, cdim); /* [R] absorbed q, then reused for o_lat */
    const int items = a->n * NH;
    for (int it = tid; it < items; it += nth) {
        int t = it / NH, h = it % NH, len = a->pos0 + t + 1;
        const float *q = DF_CF(a->q) + ((size_t)t * NH + h) * qh;
        const int64_t kv_row0 = (int64_t)h * (nope + vd);
        if (a->k_b->data) /* split form: q_lat[c] = W_uk^T[h][c] . q_nope */
            for (int c2 = 0; c2 < R; c2++) qlat[c2] = df_dot_row(a->k_b, (int64_t)h * R + c2, q);
        else
            df_cpu_matvec_t_rows(a->kv_b, kv_row0, nope, q, qlat);
        mla_attend(a, q, qlat, sc, len);
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
 * then the latent cache is read in chunks of MLA_KC rows, each chunk once
 * for all the tile's queries (scores, then o_lat = sum_j p_j c_j). Each
 * (token, head) is computed with the same operations in the same order
 * whatever the tile, so the results do not depend on the tiling, the thread
 * count or how positions are batched (n >= 2; one position takes the decode
 * path, which reads the stored weights directly: equal within rounding). */
enum { MLA_QT = 16, MLA_KC = 64 };
typedef struct {
    const df_attn_mla_args *a;
    int qt, tiles; /* positions per tile, tiles per head */
} mla_batch_ctx;

static void mla_unit(const df_attn_mla_args *a, int h, int t0, int t1) {
    const int NH = a->n_heads, nope = a->nope, rope = a->rope, R = a->kv_lora, vd = a->v_dim, nt = t1 - t0;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    const int maxlen = a->pos0 + t1;
    const dot_fn dot = dot_kernel();
    const axpy_fn axpy = axpy_kernel();
    float *sc = df_cpu_scratch(SC_SCORES, (size_t)nt * maxlen);  /* a row of maxlen scores per position */
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
    for (int j0 = 0; j0 < maxlen; j0 += MLA_KC) {
        const int j1 = maxlen - j0 < MLA_KC ? maxlen : j0 + MLA_KC;
        for (int t = t0; t < t1; t++) {
            const int je = a->pos0 + t + 1 < j1 ? a->pos0 + t + 1 : j1;
            const float *q = DF_CF(a->q) + ((size_t)t * NH + h) * qh, *ql = qlat + (size_t)(t - t0) * R;
            float *s = sc + (size_t)(t - t0) * maxlen;
            for (int j = j0; j < je; j++) {
                const float *cj = cache + (size_t)j * cdim;
                s[j] = (dot(ql, cj, R) + dot(q + nope, cj + R, rope)) * a->scale;
            }
        }
    }
    for (int t = t0; t < t1; t++) {
        df_cpu_softmax(sc + (size_t)(t - t0) * maxlen, a->pos0 + t + 1);
        memset(qlat + (size_t)(t - t0) * R, 0, (size_t)R * sizeof(float));
    }
    for (int j0 = 0; j0 < maxlen; j0 += MLA_KC) {
        const int j1 = maxlen - j0 < MLA_KC ? maxlen : j0 + MLA_KC;
        for (int t = t0; t < t1; t++) {
            const int je = a->pos0 + t + 1 < j1 ? a->pos0 + t + 1 : j1;
            float *ol = qlat + (size_t)(t - t0) * R;
            const float *s = sc + (size_t)(t - t0) * maxlen;
            for (int j = j0; j < je; j++) axpy(ol, s[j], cache + (size_t)j * cdim, R);
        }
    }
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
        mla_unit(a, h, t0, a->n - t0 < c->qt ? a->n : t0 + c->qt);
    }
}

void df_cpu_attn_mla(const df_attn_mla_args *a) {
    if (a->n == 1) { df_pool_run(mla_task, (void *)a); return; }
    mla_batch_ctx c = {a, a->n < MLA_QT ? a->n : MLA_QT, 0};
    while (c.qt > 1 && (int64_t)c.qt * (a->pos0 + a->n) > ATTN_SCRATCH_FLOATS) c.qt /= 2; /* scores scratch per thread */
    c.tiles = (a->n + c.qt - 1) / c.qt;
    df_pool_run_shares(mla_batch_task, &c, a->n_heads * c.tiles);
}
