/* router.c - router kinds: the choice of a layer's routing rule and its
 * parameters from the config. The math is a backend operation (backend.h,
 * df_route: DF_ROUTE_SOFTMAX_TOPK, DF_ROUTE_SIGMOID_GROUPS): it runs where
 * the router logits are, keeps the expert weights there for the combine,
 * and hands the host only the k expert ids per token that the expert
 * source needs (docs/ARCHITECTURE.md, "Routers are backend operations").
 *
 * softmax top-k (Qwen3-MoE, as transformers' Qwen3MoeTopKRouter): softmax
 * over all experts in f32, top-k, renormalised over the k when
 * norm_topk_prob. Ties go to the lower expert index (torch.topk on CPU).
 *
 * sigmoid + bias with groups (DeepSeek-V3 / Kimi "noaux_tc"): sigmoid
 * scores, + e_score_correction_bias for choice, groups ranked by the sum of
 * their top-2 biased scores, topk_group groups kept, top-k experts among
 * them; weights are the unbiased scores, normalised (+1e-20) when
 * norm_topk_prob, times routed_scaling_factor. */
#include "model/kinds.h"

df_route_args df_route_args_of(const df_model *m, const df_layer *L, const df_act *logits, int n, int *ids, df_act *w) {
    const df_config *c = &m->cfg;
    df_route_args a = {.kind = DF_ROUTE_SOFTMAX_TOPK, .logits = logits, .ids = ids, .w = w, .n = n,
                       .n_experts = c->n_experts, .k = c->n_experts_used, .norm_topk = c->norm_topk_prob};
    if (L->kind.router == DF_ROUTER_SIGMOID_GROUPS)
        a.kind = DF_ROUTE_SIGMOID_GROUPS, a.n_group = c->n_group, a.topk_group = c->topk_group, a.scaling = (float)c->routed_scaling,
        a.bias = L->router_bias;
    return a;
}

void df_route_softmax_topk(const df_model *m, const df_layer *L, const df_act *logits, int n, int *ids, df_act *w) {
    const df_route_args a = df_route_args_of(m, L, logits, n, ids, w);
    df_route(&a);
}

void df_route_sigmoid_groups(const df_model *m, const df_layer *L, const df_act *logits, int n, int *ids, df_act *w) {
    const df_route_args a = df_route_args_of(m, L, logits, n, ids, w);
    df_route(&a);
}
