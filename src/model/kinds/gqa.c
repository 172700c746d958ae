/* llama.c - grouped-query attention with a K/V cache, as transformers'
 * LlamaAttention / Qwen3Attention compute it: q,k,v projections (optional
 * biases), per-head q/k RMSNorm (qwen3 family), rotate-half RoPE, causal
 * softmax(q.k * scale) v, output projection. Used by llama, qwen3 and
 * qwen3_moe. */
#include "model/model.h"

#include <math.h>
#include <string.h>

typedef struct {
    const df_model *m;
    df_state *s;
    int l, n, pos0;
} attn_ctx;

static void gqa_task(void *p, int tid, int nth) {
    attn_ctx *a = p;
    const df_config *c = &a->m->cfg;
    df_state *s = a->s;
    const int NH = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, grp = NH / KV;
    const size_t kdim = (size_t)KV * hd;
    const float *kc = s->k_cache + (size_t)a->l * s->max_ctx * kdim;
    const float *vc = s->v_cache + (size_t)a->l * s->max_ctx * kdim;
    float *sc = s->att_scores + (size_t)tid * s->max_ctx;
    const int items = a->n * NH;
    for (int it = tid; it < items; it += nth) {
        int t = it / NH, h = it % NH, kvh = h / grp, len = a->pos0 + t + 1;
        const float *q = s->q + ((size_t)t * NH + h) * hd;
        for (int j = 0; j < len; j++) sc[j] = df_dot_f32(q, kc + (size_t)j * kdim + (size_t)kvh * hd, hd) * a->m->attn_scale;
        df_softmax(sc, len);
        float *out = s->att + ((size_t)t * NH + h) * hd;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int j = 0; j < len; j++) df_axpy(out, sc[j], vc + (size_t)j * kdim + (size_t)kvh * hd, hd);
    }
}

void df_attn_gqa(const df_model *m, df_state *s, int l, int n, int pos0) {
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[l];
    const int NH = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    const size_t qdim = (size_t)NH * hd, kdim = (size_t)KV * hd;
    const df_mv_job jobs[3] = {{&L->wq, s->xn, s->q}, {&L->wk, s->xn, s->k}, {&L->wv, s->xn, s->v}};
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
        size_t off = ((size_t)l * s->max_ctx + (size_t)(pos0 + t)) * kdim;
        memcpy(s->k_cache + off, k, kdim * sizeof(float));
        memcpy(s->v_cache + off, v, kdim * sizeof(float));
    }
    attn_ctx a = {m, s, l, n, pos0};
    if ((int64_t)n * NH * (pos0 + n) * hd < 32768) gqa_task(&a, 0, 1); /* too little work to share */
    else df_pool_run(gqa_task, &a);
    df_matmul(&L->wo, s->att, n, s->o);
    if (L->bo)
        for (int t = 0; t < n; t++)
            for (int i = 0; i < c->hidden; i++) s->o[(size_t)t * c->hidden + i] += L->bo[i];
}
