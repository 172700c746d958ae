/* attnres.c - residual kind "block attention residuals" (Kimi K3) and the
 * gated activations.
 *
 * Attention residuals replace the running residual sum by a learned mix:
 * the layers are grouped in blocks of attn_res_block_size; the output of
 * each completed block is kept, and before the mixer and before the FFN of
 * every layer (and before the final norm) the input is
 *   V = [block_0 .. block_{nb-1}, p]       (p: the partial sum of this block)
 *   score_i = sum_d (V_i,d / rms(V_i)) * norm_w_d * proj_w_d   (rms eps = rms_norm_eps)
 *   out = sum_i softmax(score)_i V_i
 * as Moonshot's _apply_attn_res computes it, in f32. The walk that keeps the
 * blocks is in forward.c. */
#include "model/kinds.h"

#include <math.h>

void df_attn_res(const df_model *m, const float *blocks, size_t block_stride, int nb, const float *p, int n, const float *norm_w, const float *proj_w, float *out) {
    const int H = m->cfg.hidden;
    const float eps = (float)m->cfg.rms_eps;
    float sc[DF_MAX_LAYERS + 1]; /* nb <= n_layers < DF_MAX_LAYERS */
    for (int t = 0; t < n; t++) {
        float mx = -INFINITY;
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? blocks + (size_t)i * block_stride + (size_t)t * H : p + (size_t)t * H;
            float ss = 0.0f;
            for (int d = 0; d < H; d++) ss += v[d] * v[d];
            const float r = 1.0f / sqrtf(ss / (float)H + eps);
            float s = 0.0f;
            for (int d = 0; d < H; d++) s += (v[d] * r) * (norm_w[d] * proj_w[d]);
            sc[i] = s;
            if (s > mx) mx = s;
        }
        float sum = 0.0f;
        for (int i = 0; i <= nb; i++) sum += sc[i] = expf(sc[i] - mx);
        float *o = out + (size_t)t * H;
        for (int d = 0; d < H; d++) o[d] = 0.0f;
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? blocks + (size_t)i * block_stride + (size_t)t * H : p + (size_t)t * H;
            const float w = sc[i] / sum;
            for (int d = 0; d < H; d++) o[d] += w * v[d];
        }
    }
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

void df_act_glu(const df_model *m, df_act_kind act, float *h1, const float *h2, int64_t count) {
    if (act == DF_ACT_SITU_GLU) {
        /* SiTU (Moonshot's SituAndMul): beta tanh(g / beta) sigmoid(g) * [lb tanh(u / lb)] */
        const float b = (float)m->cfg.situ_beta, lb = (float)m->cfg.situ_linear_beta;
        for (int64_t i = 0; i < count; i++) {
            const float g = h1[i], u = lb != 0.0f ? lb * tanhf(h2[i] / lb) : h2[i];
            h1[i] = b * tanhf(g / b) * (1.0f / (1.0f + expf(-g))) * u;
        }
        return;
    }
    for (int64_t i = 0; i < count; i++) h1[i] = silu(h1[i]) * h2[i];
}
