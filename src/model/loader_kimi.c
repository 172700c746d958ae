/* loader_kimi.c - the tensors of Kimi Linear and Kimi K3 layers, by the
 * names of Moonshot's modeling code (KimiDecoderLayer): KDA mixers
 * (self_attn.*: projections, short convolutions, A_log, dt_bias, gates,
 * o_norm), the MLA output gate, the MoE block (block_sparse_moe.*: router,
 * experts w1/w3/w2, shared experts, latent projections and norm), dense MLPs
 * and the attention-residual weights. K3 prefixes every name with
 * "language_model." (cfg.tensor_prefix). */
#include "model/loader_int.h"
#include "backend/cpu/kernels.h"
#include "deltafin.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define P(fmt) (snprintf(p, sizeof p, "%s." fmt, pre), p)

/* A small tensor of exactly the shape dims[0..nd) copied to f32. */
static float *small(ld *c, const char *name, int nd, const int64_t *dims) {
    const df_st_tensor *t = ld_need(c, name);
    if (!t) return NULL;
    int ok = t->n_dims == nd;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) ok = ok && t->shape[i] == dims[i], n *= dims[i];
    if (!ok) {
        char want[96] = "[", got[96] = "[";
        for (int i = 0; i < nd; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)dims[i]);
        for (int i = 0; i < t->n_dims; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected shape %s], got %s]", ld_tfile(c, t), name, want, got);
        return NULL;
    }
    float *v = df_xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        switch (t->dtype) {
        case DF_ST_F32: memcpy(&v[i], t->data + 4 * i, 4); break;
        case DF_ST_BF16: memcpy(&h, t->data + 2 * i, 2); v[i] = df_bf16_to_f32(h); break;
        case DF_ST_F16: memcpy(&h, t->data + 2 * i, 2); v[i] = df_f16_to_f32(h); break;
        default:
            free(v);
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected dtype F32, BF16 or F16, got %s", ld_tfile(c, t), name, df_st_dtype_name(t->dtype));
            return NULL;
        }
        if (!isfinite(v[i])) { /* exp(A_log), the gates and norms would turn it into NaN logits */
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': entry %lld is %g; expected a finite value", ld_tfile(c, t), name, (long long)i, (double)v[i]);
            free(v);
            return NULL;
        }
    }
    return v;
}

/* A_log has one entry per KDA head. Kimi K3 stores it padded to head_dim
 * entries with zeros after the first num_heads (only those are used; two
 * public ports used all of them). Anything else is refused. */
static float *a_log(ld *c, const char *name) {
    const df_config *cfg = &c->m->cfg;
    const int NH = cfg->kda_heads, d = cfg->kda_head_dim;
    if (c->rc) return NULL;
    const df_st_tensor *t = df_st_find(c->m->st, name);
    if (!t) return ld_need(c, name), NULL;
    /* 1-D [n] (K3), or [1, 1, n, 1] as Kimi Linear stores it: every dim 1 but one */
    int64_t n = 1, big = 0;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i], big += t->shape[i] != 1;
    if (big > 1 || t->n_dims < 1 || t->n_dims > 4 || (n != NH && !(n == d && d > NH))) {
        char got[96] = "[";
        for (int i = 0; i < t->n_dims; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': expected %d entries (num_heads) or %d (head_dim, zero-padded), in one dimension, got shape %s]",
                       ld_tfile(c, t), name, NH, d, got);
        return NULL;
    }
    int64_t dims[4];
    for (int i = 0; i < t->n_dims; i++) dims[i] = t->shape[i];
    float *v = small(c, name, t->n_dims, dims);
    if (!v) return NULL;
    for (int64_t i = NH; i < n; i++)
        if (v[i] != 0.0f) {
            c->rc = df_err(c->err, c->errlen, DF_EFORMAT, "%s: tensor '%s': entry %lld is %g; the entries after the first %d (num_heads) must be zero padding",
                           ld_tfile(c, t), name, (long long)i, (double)v[i], NH);
            free(v);
            return NULL;
        }
    return v;
}

static void load_kda(ld *c, const char *pre, df_layer *L) {
    const df_config *cfg = &c->m->cfg;
    const int64_t H = cfg->hidden, d = cfg->kda_head_dim, NH = cfg->kda_heads, C = NH * d;
    char p[512];
    ld_linear(c, P("self_attn.q_proj"), C, H, &L->w.wq);
    ld_linear(c, P("self_attn.k_proj"), C, H, &L->w.wk);
    ld_linear(c, P("self_attn.v_proj"), C, H, &L->w.wv);
    ld_linear(c, P("self_attn.o_proj"), H, C, &L->w.wo);
    ld_linear(c, P("self_attn.f_a_proj"), d, H, &L->w.f_a);
    ld_linear(c, P("self_attn.f_b_proj"), C, d, &L->w.f_b);
    ld_linear(c, P("self_attn.b_proj"), NH, H, &L->w.b_proj);
    if (cfg->kda_full_rank_gate) {
        ld_linear(c, P("self_attn.g_proj"), C, H, &L->w.g_proj);
    } else {
        ld_linear(c, P("self_attn.g_a_proj"), d, H, &L->w.g_a);
        ld_linear(c, P("self_attn.g_b_proj"), C, d, &L->w.g_b);
    }
    static const char *conv[3] = {"q_conv1d", "k_conv1d", "v_conv1d"};
    const int64_t cd[3] = {C, 1, cfg->kda_conv};
    for (int i = 0; i < 3 && !c->rc; i++) {
        snprintf(p, sizeof p, "%s.self_attn.%s.weight", pre, conv[i]);
        L->conv[i] = small(c, p, 3, cd);
    }
    L->A_log = a_log(c, P("self_attn.A_log"));
    const int64_t dc[1] = {C}, dd[1] = {d};
    if (!c->rc) L->dt_bias = small(c, P("self_attn.dt_bias"), 1, dc);
    if (!c->rc) L->o_norm = small(c, P("self_attn.o_norm.weight"), 1, dd);
}

static void load_moe(ld *c, const char *pre, df_layer *L) {
    static const char *const wnames[3] = {"w1", "w3", "w2"}; /* gate, up, down */
    const df_config *cfg = &c->m->cfg;
    const int64_t H = cfg->hidden, E = cfg->n_experts, D = L->kind.latent ? cfg->latent_dim : H;
    char p[512];
    ld_linear(c, P("block_sparse_moe.gate"), E, H, &L->w.router);
    const int64_t de[1] = {E};
    if (!c->rc) L->router_bias = small(c, P("block_sparse_moe.gate.e_score_correction_bias"), 1, de);
    L->experts = df_xcalloc((size_t)E, sizeof(df_ffn));
    for (int64_t e = 0; e < E && !c->rc; e++) {
        char pe[512];
        df_glu g = {0};
        snprintf(pe, sizeof pe, "%s.block_sparse_moe.experts.%lld", pre, (long long)e);
        ld_ffn_named(c, pe, wnames, D, cfg->moe_intermediate, &g);
        L->experts[e].gate = g.gate, L->experts[e].up = g.up, L->experts[e].down = g.down;
        ld_expert_extents(c, pe, wnames, &L->experts[e]);
    }
    if (cfg->n_shared_experts) {
        L->has_shared = 1;
        ld_ffn_named(c, P("block_sparse_moe.shared_experts"), ld_hf_glu, H, (int64_t)cfg->moe_intermediate * cfg->n_shared_experts, &L->w.shared);
    }
    if (L->kind.latent) {
        ld_linear(c, P("block_sparse_moe.routed_expert_down_proj"), D, H, &L->w.lat_down);
        ld_linear(c, P("block_sparse_moe.routed_expert_up_proj"), H, D, &L->w.lat_up);
        const int64_t dd[1] = {D};
        if (cfg->latent_norm && !c->rc) L->lat_norm = small(c, P("block_sparse_moe.routed_expert_norm.weight"), 1, dd);
    }
}

void ld_kimi_layer(ld *c, const char *pre, int l, df_layer *L) {
    (void)l;
    const df_config *cfg = &c->m->cfg;
    const int64_t H = cfg->hidden;
    char p[512];
    if (L->kind.mixer == DF_MIXER_KDA) load_kda(c, pre, L);
    if (L->kind.out_gate) ld_linear(c, P("self_attn.g_proj"), (int64_t)cfg->n_heads * cfg->v_head_dim, H, &L->w.g_proj);
    if (L->kind.ffn == DF_FFN_MOE) load_moe(c, pre, L);
    else ld_ffn_named(c, P("mlp"), ld_hf_glu, H, cfg->intermediate, &L->w.mlp);
    if (L->kind.resid == DF_RESID_ATTNRES) {
        const int64_t dh[1] = {H}, dp[2] = {1, H};
        static const char *nm[2] = {"self_attention_res", "mlp_res"};
        for (int i = 0; i < 2 && !c->rc; i++) {
            snprintf(p, sizeof p, "%s.%s_norm.weight", pre, nm[i]);
            L->res_norm[i] = small(c, p, 1, dh);
            snprintf(p, sizeof p, "%s.%s_proj.weight", pre, nm[i]);
            if (!c->rc) L->res_proj[i] = small(c, p, 2, dp);
        }
    }
}

void ld_kimi_model(ld *c) {
    df_model *m = c->m;
    const df_config *cfg = &m->cfg;
    if (!cfg->attn_res_block || c->rc) return;
    const int64_t dh[1] = {cfg->hidden}, dp[2] = {1, cfg->hidden};
    char p[512];
    snprintf(p, sizeof p, "%smodel.output_attn_res_norm.weight", cfg->tensor_prefix);
    m->out_res_norm = small(c, p, 1, dh);
    snprintf(p, sizeof p, "%smodel.output_attn_res_proj.weight", cfg->tensor_prefix);
    if (!c->rc) m->out_res_proj = small(c, p, 2, dp);
}
