/* gqa.c - mixer kind GQA: grouped-query attention with a K/V cache, as
 * transformers' LlamaAttention / Qwen3Attention compute it: q,k,v
 * projections (optional biases), per-head q/k RMSNorm (when the layer has
 * q_norm/k_norm), rotate-half RoPE, causal softmax(q.k * scale) v, output
 * projection. State: per position, the layer's K row then its V row
 * ([2][KV*hd]); truncatable. */
#include "model/kinds.h"


static void gqa_forward(const df_model *m, df_state *s, int l, int n, int pos0) {
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[l];
    const int NH = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    const size_t qdim = (size_t)NH * hd, kdim = (size_t)KV * hd;
    const df_mv_job jobs[3] = {{&L->w.wq, s->xn, s->q}, {&L->w.wk, s->xn, s->k}, {&L->w.wv, s->xn, s->v}};
    df_matmul_batch(jobs, 3, n);
    const float eps = (float)c->rms_eps;
    if (L->bq) df_add_bias(s->q, L->bq, n, (int)qdim);
    if (L->bk) df_add_bias(s->k, L->bk, n, (int)kdim);
    if (L->bv) df_add_bias(s->v, L->bv, n, (int)kdim);
    /* the K and V rows of positions pos0.. go into the cache after the norms and the rotation */
    df_act *row = DF_AT(s->ls[l].cache, (size_t)pos0 * 2 * kdim);
    if (L->q_norm && L->k_norm) { /* the six ops below in one (backend.h: qk_norm_rope; the same ops where the backend has none) */
        const df_qk_norm_rope_args qa = {s->q, s->k, L->q_norm, L->k_norm, n, NH, KV, hd, hd, eps, s->rope_cs, m->rope_adjacent,
                                         s->v, row, DF_AT(row, kdim), 2 * kdim};
        df_qk_norm_rope(&qa);
    } else {
        if (L->q_norm) df_rmsnorm_rows(s->q, hd, s->q, hd, L->q_norm, n * NH, hd, eps);
        if (L->k_norm) df_rmsnorm_rows(s->k, hd, s->k, hd, L->k_norm, n * KV, hd, eps);
        df_rope(s->q, n, NH, qdim, hd, hd, s->rope_cs, m->rope_adjacent);
        df_rope(s->k, n, KV, kdim, hd, hd, s->rope_cs, m->rope_adjacent);
        df_copy_rows(row, 2 * kdim, s->k, kdim, n, (int)kdim);
        df_copy_rows(DF_AT(row, kdim), 2 * kdim, s->v, kdim, n, (int)kdim);
    }
    const df_attn_gqa_args a = {s->q, s->ls[l].cache, s->att, n, pos0, NH, KV, hd, m->attn_scale};
    df_attn_gqa(&a);
    df_matmul(&L->w.wo, s->att, n, s->o);
    if (L->bo) df_add_bias(s->o, L->bo, n, c->hidden);
}

static size_t gqa_cache_floats(const df_model *m, int l) {
    (void)l;
    return 2 * (size_t)m->cfg.n_kv_heads * (size_t)m->cfg.head_dim;
}
static size_t gqa_fixed_floats(const df_model *m, int l) { (void)m, (void)l; return 0; }

const df_mixer_ops df_mixer_gqa = {"GQA", 1, gqa_cache_floats, gqa_fixed_floats, gqa_forward};
