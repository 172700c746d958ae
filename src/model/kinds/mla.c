/* mla.c - mixer kind MLA (DeepSeek-V3, Kimi K2): multi-head latent
 * attention with a latent cache. State: per position, the normalised kv
 * latent c (kv_lora_rank; its RMSNorm uses eps 1e-6 as in transformers) and
 * the rotated shared key k_rot (qk_rope_head_dim), never expanded K/V. Scores use the absorbed form
 *   q_nope . (W_uk c) = (W_uk^T q_nope) . c
 * and values o_lat = sum_j p_j c_j, v = W_uv o_lat, which equal transformers'
 * expanded computation up to f32 rounding. The softmax scale includes the
 * YaRN mscale(mscale_all_dim)^2; cos/sin carry attention_factor.
 * Kimi's variant (kind.nope): no RoPE at all, the "rope" dims of q and the
 * shared k_rot are plain dims; with kind.out_gate the attention output is
 * multiplied by sigmoid(g_proj x) before o_proj.
 * Truncatable. */
#include "model/kinds.h"

#include <math.h>
#include <string.h>

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
        if (!L->kind.nope)
            for (int h = 0; h < NH; h++) df_rope(cs, rope, s->q + ((size_t)t * NH + h) * qh + nope, c->rope_interleave);
        float *kv = s->k + (size_t)t * cdim;
        float *dst = s->ls[l].cache + (size_t)(pos0 + t) * cdim;
        df_rmsnorm(dst, kv, L->kv_a_norm, R, eps);
        memcpy(dst + R, kv + R, (size_t)rope * sizeof(float));
        if (!L->kind.nope) df_rope(cs, rope, dst + R, c->rope_interleave);
    }
    const df_attn_mla_args a = {s->q, s->ls[l].cache, s->att, &L->w.kv_b, &L->w.k_b, &L->w.v_b, n, pos0, NH, nope, rope, R, c->v_head_dim, m->attn_scale};
    df_attn_mla(&a);
    if (L->kind.out_gate) {
        const size_t od = (size_t)NH * c->v_head_dim;
        df_matmul(&L->w.g_proj, s->xn, n, s->ko);
        for (size_t i = 0; i < (size_t)n * od; i++) s->att[i] *= 1.0f / (1.0f + expf(-s->ko[i]));
    }
    df_matmul(&L->w.wo, s->att, n, s->o);
}

static size_t mla_cache_floats(const df_model *m, int l) {
    (void)l;
    return (size_t)m->cfg.kv_lora_rank + (size_t)m->cfg.qk_rope_dim;
}
static size_t mla_fixed_floats(const df_model *m, int l) { (void)m, (void)l; return 0; }

const df_mixer_ops df_mixer_mla = {"MLA", 1, mla_cache_floats, mla_fixed_floats, mla_forward};
