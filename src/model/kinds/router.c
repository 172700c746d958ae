/* router.c - router kinds: one token's router logits -> K expert ids and
 * their weights. Scratch comes from the caller (tmp, [4 x n_experts] floats), so
 * no size read from a model file reaches the C stack.
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

#include <math.h>
#include <string.h>

/* The index of the largest v[e] not yet taken (ties: lowest index); marks it taken. */
static int take_max(const float *v, unsigned char *taken, int E) {
    int best = -1;
    for (int e = 0; e < E; e++)
        if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
    if (best >= 0) taken[best] = 1;
    return best;
}

void df_route_softmax_topk(const df_model *m, const df_layer *L, const float *logits, int *sel, float *w, float *tmp) {
    (void)L;
    const int E = m->cfg.n_experts, K = m->cfg.n_experts_used;
    unsigned char *taken = (unsigned char *)tmp;
    memset(taken, 0, (size_t)E);
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) if (logits[e] > mx) mx = logits[e];
    double sum = 0;
    for (int e = 0; e < E; e++) sum += expf(logits[e] - mx);
    for (int k = 0; k < K; k++) {
        int best = take_max(logits, taken, E);
        sel[k] = best;
        w[k] = (float)(expf(logits[best] - mx) / sum);
    }
    if (m->cfg.norm_topk_prob) {
        float s = 0;
        for (int k = 0; k < K; k++) s += w[k];
        for (int k = 0; k < K; k++) w[k] /= s;
    }
}

void df_route_sigmoid_groups(const df_model *m, const df_layer *L, const float *logits, int *sel, float *w, float *tmp) {
    const df_config *c = &m->cfg;
    const int E = c->n_experts, K = c->n_experts_used, G = c->n_group, per = E / G;
    float *score = tmp, *choice = tmp + E, *gscore = tmp + 2 * (size_t)E;
    unsigned char *keep = (unsigned char *)(gscore + G), *taken = keep + G; /* 2E + G floats + G + E bytes <= 4E floats */
    for (int e = 0; e < E; e++) {
        score[e] = 1.0f / (1.0f + expf(-logits[e]));
        choice[e] = score[e] + L->router_bias[e];
    }
    for (int g = 0; g < G; g++) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int i = 0; i < per; i++) {
            float v = choice[g * per + i];
            if (v > b1) { b2 = b1; b1 = v; }
            else if (v > b2) b2 = v;
        }
        gscore[g] = b1 + b2;
    }
    memset(keep, 0, (size_t)G);
    for (int k = 0; k < c->topk_group; k++) take_max(gscore, keep, G);
    memset(taken, 0, (size_t)E);
    for (int e = 0; e < E; e++)
        if (!keep[e / per]) taken[e] = 1; /* experts of dropped groups are never chosen */
    for (int k = 0; k < K; k++) {
        int best = take_max(choice, taken, E);
        if (best < 0) best = 0; /* unreachable: config checks topk_group * per >= K */
        sel[k] = best;
        w[k] = score[best];
    }
    if (c->norm_topk_prob) {
        float s = 0;
        for (int k = 0; k < K; k++) s += w[k];
        s += 1e-20f;
        for (int k = 0; k < K; k++) w[k] /= s;
    }
    for (int k = 0; k < K; k++) w[k] *= (float)c->routed_scaling;
}
