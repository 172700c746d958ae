/* family.c - families as data. Each family is one table entry saying which
 * kinds its layers are made of; the kinds' code lives in src/model/kinds/.
 * Adding a family whose layers are made of existing kinds is a table entry
 * here plus its config fields (config.c) and tensor names (loader.c);
 * a family with a new kind adds that kind's file and its ops entry below.
 *
 *   family        attention layers   FFN of MoE layers        router
 *   llama         GQA                dense only               -
 *   qwen3         GQA (+ q/k norm)   dense only               -
 *   qwen3_moe     GQA (+ q/k norm)   MoE (mlp_only -> dense)  softmax top-k
 *   deepseek_v3   MLA                MoE (+ shared experts)   sigmoid + bias, groups
 *   kimi_linear   KDA or MLA (NoPE,  MoE, latent MoE when      sigmoid + bias
 *   (kimi_k3)     + output gate),    routed_expert_hidden_size
 *                 per layer from     (+ shared experts);
 *                 linear_attn_config SiLU or SiTU; block attention residuals
 */
#include "model/family.h"
#include "model/kinds.h"
#include "deltafin.h"

typedef struct {
    df_family fam;
    df_mixer_kind mixer;
    df_router_kind router;
    int qk_norm;
    /* per-layer refinements read from the config (NULL: every layer alike) */
    void (*refine)(const df_config *c, int l, df_layer_kind *k);
} family_desc;

static void kimi_layer(const df_config *c, int l, df_layer_kind *k) {
    k->mixer = c->layer_kda[l] ? DF_MIXER_KDA : DF_MIXER_MLA;
    k->nope = k->mixer == DF_MIXER_MLA && c->mla_nope;
    k->out_gate = k->mixer == DF_MIXER_MLA && c->mla_out_gate;
    k->act = c->act_situ ? DF_ACT_SITU_GLU : DF_ACT_SILU_GLU;
    k->resid = c->attn_res_block ? DF_RESID_ATTNRES : DF_RESID_PLAIN;
    k->latent = k->ffn == DF_FFN_MOE && c->latent_dim > 0;
}

static const family_desc families[] = {
    {DF_FAM_LLAMA, DF_MIXER_GQA, DF_ROUTER_NONE, 0, NULL},
    {DF_FAM_QWEN3, DF_MIXER_GQA, DF_ROUTER_NONE, 1, NULL},
    {DF_FAM_QWEN3_MOE, DF_MIXER_GQA, DF_ROUTER_SOFTMAX_TOPK, 1, NULL},
    {DF_FAM_DEEPSEEK_V3, DF_MIXER_MLA, DF_ROUTER_SIGMOID_GROUPS, 0, NULL},
    {DF_FAM_KIMI_LINEAR, DF_MIXER_MLA, DF_ROUTER_SIGMOID_GROUPS, 0, kimi_layer},
};

int df_family_layer_kind(const df_config *c, int l, int moe, df_layer_kind *out) {
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
        if (families[i].fam != c->family) continue;
        if (moe && families[i].router == DF_ROUTER_NONE) return DF_EUNSUPPORTED;
        *out = (df_layer_kind){
            .mixer = families[i].mixer,
            .ffn = moe ? DF_FFN_MOE : DF_FFN_DENSE,
            .act = DF_ACT_SILU_GLU,
            .router = moe ? families[i].router : DF_ROUTER_NONE,
            .resid = DF_RESID_PLAIN,
            .qk_norm = families[i].qk_norm,
        };
        if (families[i].refine) families[i].refine(c, l, out);
        return 0;
    }
    return DF_EUNSUPPORTED;
}

/* ---- kind registries -------------------------------------------------- */
static const df_mixer_ops *const mixers[DF_MIXER_N] = {[DF_MIXER_GQA] = &df_mixer_gqa, [DF_MIXER_MLA] = &df_mixer_mla, [DF_MIXER_KDA] = &df_mixer_kda};
static const df_route_fn routers[DF_ROUTER_N] = {[DF_ROUTER_SOFTMAX_TOPK] = df_route_softmax_topk,
                                                 [DF_ROUTER_SIGMOID_GROUPS] = df_route_sigmoid_groups};

const df_mixer_ops *df_mixer_of(df_mixer_kind k) { return mixers[k]; }
df_route_fn df_router_of(df_router_kind k) { return routers[k]; }

const char *df_kind_name_ffn(df_ffn_kind k) {
    static const char *n[DF_FFN_N] = {[DF_FFN_DENSE] = "dense", [DF_FFN_MOE] = "MoE"};
    return n[k];
}
const char *df_kind_name_router(df_router_kind k) {
    static const char *n[DF_ROUTER_N] = {[DF_ROUTER_NONE] = "none", [DF_ROUTER_SOFTMAX_TOPK] = "softmax top-k",
                                         [DF_ROUTER_SIGMOID_GROUPS] = "sigmoid + bias, groups"};
    return n[k];
}
