/* qwen3_moe.c - the Qwen3-MoE router, as transformers' Qwen3MoeTopKRouter:
 * softmax over all experts in f32, top-k, renormalised over the k when
 * norm_topk_prob. Ties go to the lower expert index (torch.topk on CPU). */
#include "model/model.h"

#include <math.h>

void df_route_qwen3(const df_model *m, const df_layer *L, const float *logits, int *sel, float *w) {
    (void)L;
    const int E = m->cfg.n_experts, K = m->cfg.n_experts_used;
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) if (logits[e] > mx) mx = logits[e];
    double sum = 0;
    for (int e = 0; e < E; e++) sum += expf(logits[e] - mx);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) if (sel[j] == e) taken = 1;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        sel[k] = best;
        w[k] = (float)(expf(logits[best] - mx) / sum);
    }
    if (m->cfg.norm_topk_prob) {
        float s = 0;
        for (int k = 0; k < K; k++) s += w[k];
        for (int k = 0; k < K; k++) w[k] /= s;
    }
}
