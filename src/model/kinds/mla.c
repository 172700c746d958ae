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


static void mla_forward(const df_model *m, df_state *s, int l, int n, int pos0) {
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[l];
    const int NH = c->n_heads, nope = c->qk_nope_dim, rope = c->qk_rope_dim, R = c->kv_lora_rank;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    /* transformers (and DeepSeek's own modeling code) build q_a_layernorm and
     * kv_a_layernorm with the default eps 1e-6, whatever rms_norm_eps says. */
    const float eps = 1e-6f;
    /* the two products of xn (q_a or q_proj, and kv_a) in one batch: one launch on a GPU (each job's rows as alone) */
    const df_mv_job xj[2] = {{c->q_lora_rank ? &L->w.q_a : &L->w.q_proj, s->xn, c->q_lora_rank ? s->h1 : s->q}, {&L->w.kv_a, s->xn, s->k}};
    df_matmul_batch(xj, 2, n);
    if (c->q_lora_rank) {
        df_rmsnorm_rows(s->h1, c->q_lora_rank, s->h1, c->q_lora_rank, L->q_a_norm, n, c->q_lora_rank, eps);
        df_matmul(&L->w.q_b, s->h1, n, s->q);
    }
    if (!L->kind.nope) df_rope(DF_AT(s->q, nope), n, NH, (size_t)NH * qh, qh, rope, s->rope_cs, c->rope_interleave);
    /* positions pos0..: the normalised latent, then the rotated shared key */
    df_act *dst = DF_AT(s->ls[l].cache, (size_t)pos0 * cdim);
    df_rmsnorm_rows(dst, cdim, s->k, cdim, L->kv_a_norm, n, R, eps);
    df_copy_rows(DF_AT(dst, R), cdim, DF_AT(s->k, R), cdim, n, rope);
    if (!L->kind.nope) df_rope(DF_AT(dst, R), n, 1, cdim, 0, rope, s->rope_cs, c->rope_interleave);
    const df_attn_mla_args a = {s->q, s->ls[l].cache, s->att, &L->w.kv_b, &L->w.k_b, &L->w.v_b, n, pos0, NH, nope, rope, R, c->v_head_dim, m->attn_scale};
    df_attn_mla(&a);
    if (L->kind.out_gate) { /* Kimi K3: attention * sigmoid(g_proj x) */
        df_matmul(&L->w.g_proj, s->xn, n, s->ko);
        df_gate(s->att, s->ko, s->att, (size_t)n * NH * c->v_head_dim, DF_GATE_SIGMOID, 0, 0);
    }
    df_matmul(&L->w.wo, s->att, n, s->o);
}

static size_t mla_cache_floats(const df_model *m, int l) {
    (void)l;
    return (size_t)m->cfg.kv_lora_rank + (size_t)m->cfg.qk_rope_dim;
}
static size_t mla_fixed_floats(const df_model *m, int l) { (void)m, (void)l; return 0; }

const df_mixer_ops df_mixer_mla = {"MLA", 1, mla_cache_floats, mla_fixed_floats, mla_forward};
