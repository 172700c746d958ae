/* gqa.c - mixer kind GQA: grouped-query attention with a K/V cache, as
 * transformers' LlamaAttention / Qwen3Attention compute it: q,k,v
 * projections (optional biases), per-head q/k RMSNorm (when the layer has
 * q_norm/k_norm), rotate-half RoPE, causal softmax(q.k * scale) v, output
 * projection. State: per position, the layer's K row then its V row
 * ([2][KV*hd]); truncatable. */
#include "model/kinds.h"

#include <math.h>
#include <string.h>

static void gqa_forward(const df_model *m, df_state *s, int l, int n, int pos0) {
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[l];
    const int NH = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    const size_t qdim = (size_t)NH * hd, kdim = (size_t)KV * hd;
    const df_mv_job jobs[3] = {{&L->w.wq, s->xn, s->q}, {&L->w.wk, s->xn, s->k}, {&L->w.wv, s->xn, s->v}};
    df_matmul_batch(jobs, 3, n);
    const float eps = (float)c->rms_eps;
    for (int t = 0; t < n; t++) {
        float *q = s->q + t * qdim, *k = s->k + t * kdim, *v = s->v + t * kdim;
        if (L->bq) for (size_t i = 0; i < qdim; i++) q[i] += L->bq[i];
        if (L->bk) for (size_t i = 0; i < kdim; i++) k[i] += L->bk[i];
        if (L->bv) for (size_t i = 0; i < kdim; i++) v[i] += L->bv[i];
        const float *cs = s->rope_cs + (size_t)t * c->rope_dim;
        for (int h = 0; h < NH; h++) {
            if (L->q_norm) df_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, eps);
            df_rope(cs, hd, q + h * hd, m->rope_adjacent);
        }
        for (int h = 0; h < KV; h++) {
            if (L->k_norm) df_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, eps);
            df_rope(cs, hd, k + h * hd, m->rope_adjacent);
        }
        float *row = s->ls[l].cache + (size_t)(pos0 + t) * 2 * kdim;
        memcpy(row, k, kdim * sizeof(float));
        memcpy(row + kdim, v, kdim * sizeof(float));
    }
    const df_attn_gqa_args a = {s->q, s->ls[l].cache, s->att, n, pos0, NH, KV, hd, m->attn_scale};
    df_attn_gqa(&a);
    df_matmul(&L->w.wo, s->att, n, s->o);
    if (L->bo)
        for (int t = 0; t < n; t++)
            for (int i = 0; i < c->hidden; i++) s->o[(size_t)t * c->hidden + i] += L->bo[i];
}

static size_t gqa_cache_floats(const df_model *m, int l) {
    (void)l;
    return 2 * (size_t)m->cfg.n_kv_heads * (size_t)m->cfg.head_dim;
}
static size_t gqa_fixed_floats(const df_model *m, int l) { (void)m, (void)l; return 0; }

const df_mixer_ops df_mixer_gqa = {"GQA", 1, gqa_cache_floats, gqa_fixed_floats, gqa_forward};
