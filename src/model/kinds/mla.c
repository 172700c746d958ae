/* mla.c - mixer kind MLA (DeepSeek-V3, Kimi K2): multi-head latent
 * attention with a latent cache. State: per position, the normalised kv
 * latent c (kv_lora_rank; its RMSNorm uses eps 1e-6 as in transformers) and
 * the rotated shared key k_rot (qk_rope_head_dim), never expanded K/V. Scores use the absorbed form
 *   q_nope . (W_uk c) = (W_uk^T q_nope) . c
 * and values o_lat = sum_j p_j c_j, v = W_uv o_lat, which equal transformers'
 * expanded computation up to f32 rounding. The softmax scale includes the
 * YaRN mscale(mscale_all_dim)^2; cos/sin carry attention_factor.
 * Truncatable. */
#include "model/kinds.h"

#include <math.h>
#include <string.h>

typedef struct {
    const df_model *m;
    df_state *s;
    int l, n, pos0;
} mla_ctx;

static void mla_task(void *p, int tid, int nth) {
    mla_ctx *a = p;
    const df_config *c = &a->m->cfg;
    const df_layer *L = &a->m->layers[a->l];
    df_state *s = a->s;
    const int NH = c->n_heads, nope = c->qk_nope_dim, rope = c->qk_rope_dim, R = c->kv_lora_rank, vd = c->v_head_dim;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    const float *cache = s->ls[a->l].cache;
    float *sc = s->att_scores + (size_t)tid * s->max_ctx;
    float *qlat = s->qlat + (size_t)tid * cdim; /* [R] absorbed q, then reused for o_lat */
    const int items = a->n * NH;
    for (int it = tid; it < items; it += nth) {
        int t = it / NH, h = it % NH, len = a->pos0 + t + 1;
        const float *q = s->q + ((size_t)t * NH + h) * qh;
        const int64_t kv_row0 = (int64_t)h * (nope + vd);
        if (L->w.k_b.data) /* split form: q_lat[c] = W_uk^T[h][c] . q_nope */
            for (int c2 = 0; c2 < R; c2++) qlat[c2] = df_dot_row(&L->w.k_b, (int64_t)h * R + c2, q);
        else
            df_matvec_t_rows(&L->w.kv_b, kv_row0, nope, q, qlat);
        for (int j = 0; j < len; j++) {
            const float *cj = cache + (size_t)j * cdim;
            sc[j] = (df_dot_f32(qlat, cj, R) + df_dot_f32(q + nope, cj + R, rope)) * a->m->attn_scale;
        }
        df_softmax(sc, len);
        memset(qlat, 0, (size_t)R * sizeof(float));
        for (int j = 0; j < len; j++) df_axpy(qlat, sc[j], cache + (size_t)j * cdim, R);
        float *out = s->att + ((size_t)t * NH + h) * vd;
        if (L->w.v_b.data)
            for (int i = 0; i < vd; i++) out[i] = df_dot_row(&L->w.v_b, (int64_t)h * vd + i, qlat);
        else
            for (int i = 0; i < vd; i++) out[i] = df_dot_row(&L->w.kv_b, kv_row0 + nope + i, qlat);
    }
}

/* Prefill: heads are the unit of work; each head's W_uk and W_uv rows are
 * dequantized once into thread scratch and used for every token of the
 * batch (the per-(token, head) path would dequantize them n times). */
static void mla_prefill_task(void *p, int tid, int nth) {
    mla_ctx *a = p;
    const df_config *c = &a->m->cfg;
    const df_layer *L = &a->m->layers[a->l];
    df_state *s = a->s;
    const int NH = c->n_heads, nope = c->qk_nope_dim, rope = c->qk_rope_dim, R = c->kv_lora_rank, vd = c->v_head_dim;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    const float *cache = s->ls[a->l].cache;
    float *sc = s->att_scores + (size_t)tid * s->max_ctx;
    float *qlat = s->qlat + (size_t)tid * cdim;
    float *wk = s->mla_w + (size_t)tid * (size_t)(nope + vd) * R; /* [nope x R] (kv_b) or [R x nope] (k_b) */
    float *wv = wk + (size_t)nope * R;                              /* [vd x R] */
    for (int h = tid; h < NH; h += nth) {
        const int64_t kv_row0 = (int64_t)h * (nope + vd);
        if (L->w.k_b.data)
            for (int r = 0; r < R; r++) df_dequant_row(&L->w.k_b, (int64_t)h * R + r, wk + (size_t)r * nope);
        else
            for (int d = 0; d < nope; d++) df_dequant_row(&L->w.kv_b, kv_row0 + d, wk + (size_t)d * R);
        for (int i = 0; i < vd; i++)
            df_dequant_row(L->w.v_b.data ? &L->w.v_b : &L->w.kv_b, L->w.v_b.data ? (int64_t)h * vd + i : kv_row0 + nope + i, wv + (size_t)i * R);
        for (int t = 0; t < a->n; t++) {
            const int len = a->pos0 + t + 1;
            const float *q = s->q + ((size_t)t * NH + h) * qh;
            if (L->w.k_b.data) {
                for (int r = 0; r < R; r++) qlat[r] = df_dot_f32(wk + (size_t)r * nope, q, nope);
            } else {
                memset(qlat, 0, (size_t)R * sizeof(float));
                for (int d = 0; d < nope; d++) df_axpy(qlat, q[d], wk + (size_t)d * R, R);
            }
            for (int j = 0; j < len; j++) {
                const float *cj = cache + (size_t)j * cdim;
                sc[j] = (df_dot_f32(qlat, cj, R) + df_dot_f32(q + nope, cj + R, rope)) * a->m->attn_scale;
            }
            df_softmax(sc, len);
            memset(qlat, 0, (size_t)R * sizeof(float));
            for (int j = 0; j < len; j++) df_axpy(qlat, sc[j], cache + (size_t)j * cdim, R);
            float *out = s->att + ((size_t)t * NH + h) * vd;
            for (int i = 0; i < vd; i++) out[i] = df_dot_f32(wv + (size_t)i * R, qlat, R);
        }
    }
}

static void mla_forward(const df_model *m, df_state *s, int l, int n, int pos0) {
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[l];
    const int NH = c->n_heads, nope = c->qk_nope_dim, rope = c->qk_rope_dim, R = c->kv_lora_rank;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    /* transformers (and DeepSeek's own modeling code) build q_a_layernorm and
     * kv_a_layernorm with the default eps 1e-6, whatever rms_norm_eps says. */
    const float eps = 1e-6f;
    if (c->q_lora_rank) {
        df_matmul(&L->w.q_a, s->xn, n, s->h1);
        for (int t = 0; t < n; t++) df_rmsnorm(s->h1 + (size_t)t * c->q_lora_rank, s->h1 + (size_t)t * c->q_lora_rank, L->q_a_norm, c->q_lora_rank, eps);
        df_matmul(&L->w.q_b, s->h1, n, s->q);
    } else {
        df_matmul(&L->w.q_proj, s->xn, n, s->q);
    }
    df_matmul(&L->w.kv_a, s->xn, n, s->k);
    for (int t = 0; t < n; t++) {
        const float *cs = s->rope_cs + (size_t)t * rope;
        for (int h = 0; h < NH; h++) df_rope(cs, rope, s->q + ((size_t)t * NH + h) * qh + nope, c->rope_interleave);
        float *kv = s->k + (size_t)t * cdim;
        float *dst = s->ls[l].cache + (size_t)(pos0 + t) * cdim;
        df_rmsnorm(dst, kv, L->kv_a_norm, R, eps);
        memcpy(dst + R, kv + R, (size_t)rope * sizeof(float));
        df_rope(cs, rope, dst + R, c->rope_interleave);
    }
    mla_ctx a = {m, s, l, n, pos0};
    df_pool_run(n > 1 ? mla_prefill_task : mla_task, &a);
    df_matmul(&L->w.wo, s->att, n, s->o);
}

static size_t mla_cache_floats(const df_model *m, int l) {
    (void)l;
    return (size_t)m->cfg.kv_lora_rank + (size_t)m->cfg.qk_rope_dim;
}
static size_t mla_fixed_floats(const df_model *m, int l) { (void)m, (void)l; return 0; }

const df_mixer_ops df_mixer_mla = {"MLA", 1, mla_cache_floats, mla_fixed_floats, mla_forward};
