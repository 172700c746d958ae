/* kda.c - mixer kind KDA (Kimi Delta Attention, Kimi Linear / Kimi K3): a
 * linear recurrent mixer with a fixed-size state, as Moonshot's
 * KimiDeltaAttention computes it with fla's recurrent KDA:
 *
 *   q, k, v = depthwise causal conv (width W, no bias) + SiLU of the q/k/v
 *             projections; q, k L2-normalised per head (x / sqrt(|x|^2 + 1e-6)),
 *             q scaled by d^-0.5
 *   f       = f_b(f_a(x)) + dt_bias (per channel)
 *   decay   = exp(g), g = lb * sigmoid(exp(A_log[h]) f)   with a lower bound lb (K3)
 *                     g = -exp(A_log[h]) softplus(f)      without (Kimi Linear)
 *   beta    = sigmoid(b_proj(x)) per head
 *   per head, state S [d x d] (key x value):
 *             S <- diag(decay) S;  u = v - S^T k;  S <- S + beta k u^T;  o = S^T q
 *   out     = o_proj(RMSNorm(o, o_norm) * sigmoid(gate)) per head, where gate is
 *             g_proj(x) (K3's full-rank gate) or g_b(g_a(x)) (Kimi Linear).
 *
 * Every step is a backend operation (causal_conv1d, l2norm, kda_gate,
 * sigmoid, kda_scan, rmsnorm, gate). Prefill runs the same recurrence token by
 * token as decode. The fixed state per layer: the last W-1 inputs of each
 * convolution ([H*d][W-1] x 3) and S ([H][d][d]); nothing grows with the
 * position, and the state cannot be truncated (a session restores a snapshot
 * instead). */
#include "model/kinds.h"

#include <math.h>

static size_t kda_channels(const df_model *m) { return (size_t)m->cfg.kda_heads * (size_t)m->cfg.kda_head_dim; }

static size_t kda_fixed_floats(const df_model *m, int l) {
    (void)l;
    const size_t C = kda_channels(m), d = (size_t)m->cfg.kda_head_dim, W = (size_t)m->cfg.kda_conv;
    return 3 * (W - 1) * C + (size_t)m->cfg.kda_heads * d * d;
}
static size_t kda_cache_floats(const df_model *m, int l) { (void)m, (void)l; return 0; }

static void kda_forward(const df_model *m, df_state *s, int l, int n, int pos0) {
    (void)pos0;
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[l];
    const int NH = c->kda_heads, d = c->kda_head_dim, W = c->kda_conv;
    const size_t C = kda_channels(m), nC = (size_t)n * C;
    df_act *win = s->ls[l].fixed, *S = DF_AT(win, 3 * (size_t)(W - 1) * C);
    /* projections: q, k, v, the forget gate's low-rank first half, beta, the output gate */
    df_mv_job jobs[6] = {{&L->w.wq, s->xn, s->q}, {&L->w.wk, s->xn, s->k}, {&L->w.wv, s->xn, s->v},
                         {&L->w.f_a, s->xn, s->h1}, {&L->w.b_proj, s->xn, s->kb}};
    int nj = 5;
    if (L->w.g_proj.data) jobs[nj++] = (df_mv_job){&L->w.g_proj, s->xn, s->ko};
    else jobs[nj++] = (df_mv_job){&L->w.g_a, s->xn, s->h2};
    df_matmul_batch(jobs, nj, n);
    df_matmul(&L->w.f_b, s->h1, n, s->kg);
    if (!L->w.g_proj.data) df_matmul(&L->w.g_b, s->h2, n, s->ko);
    /* short convolutions + SiLU into kc: q, k, v */
    const df_act *xs[3] = {s->q, s->k, s->v};
    df_act *ys[3] = {s->kc, DF_AT(s->kc, nC), DF_AT(s->kc, 2 * nC)};
    for (int i = 0; i < 3; i++) {
        const df_conv1d_args a = {ys[i], xs[i], DF_AT(win, (size_t)i * (W - 1) * C), L->conv[i], NULL, n, (int)C, W, 1};
        df_causal_conv1d(&a);
    }
    df_l2norm(ys[0], n * NH, d, 1e-6f, 1.0f);
    df_l2norm(ys[1], n * NH, d, 1e-6f, 1.0f);
    const df_kda_gate_args ga = {s->kg, s->kg, L->A_log, L->dt_bias, n, NH, d, c->kda_has_lower_bound, (float)c->kda_lower_bound};
    df_kda_gate(&ga);
    df_sigmoid(s->kb, (size_t)n * NH);
    const df_kda_args ka = {s->att, ys[0], ys[1], ys[2], s->kg, s->kb, S, n, NH, d, d, 1.0f / sqrtf((float)d)};
    df_kda_scan(&ka);
    /* gated output norm (fla's FusedRMSNormGated, activation sigmoid), then o_proj */
    df_rmsnorm_rows(s->att, d, s->att, d, L->o_norm, n * NH, d, (float)c->rms_eps);
    df_gate(s->att, s->ko, s->att, nC, DF_GATE_SIGMOID, 0, 0);
    df_matmul(&L->w.wo, s->att, n, s->o);
}

const df_mixer_ops df_mixer_kda = {"KDA", 0, kda_cache_floats, kda_fixed_floats, kda_forward};
