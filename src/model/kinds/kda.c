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
 * Prefill runs the same recurrence token by token as decode, so any split of a
 * prompt gives the same bits. The fixed state per layer: the last W-1 inputs of
 * each convolution ([W-1][H*d] x 3) and S ([H][d][d]); nothing grows with the
 * position, and the state cannot be truncated (a session restores a snapshot
 * instead). */
#include "model/kinds.h"

#include <math.h>
#include <string.h>

static inline float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float silu(float x) { return x / (1.0f + expf(-x)); }
/* torch.nn.functional.softplus (beta 1, threshold 20) */
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static size_t kda_channels(const df_model *m) { return (size_t)m->cfg.kda_heads * (size_t)m->cfg.kda_head_dim; }

static size_t kda_fixed_floats(const df_model *m, int l) {
    (void)l;
    const size_t C = kda_channels(m), d = (size_t)m->cfg.kda_head_dim, W = (size_t)m->cfg.kda_conv;
    return 3 * (W - 1) * C + (size_t)m->cfg.kda_heads * d * d;
}
static size_t kda_cache_floats(const df_model *m, int l) { (void)m, (void)l; return 0; }

/* x[n][C] in place: causal depthwise conv of width W over (window, x) then
 * SiLU; win [W-1][C] holds the previous W-1 inputs (oldest first) and is
 * advanced past the n new ones. w [C][W]: tap W-1 multiplies the current input. */
static void short_conv(float *x, int n, size_t C, int W, const float *w, float *win) {
    for (int t = 0; t < n; t++) {
        float *xt = x + (size_t)t * C;
        for (size_t c = 0; c < C; c++) {
            const float *wc = w + c * (size_t)W;
            float acc = 0.0f;
            for (int j = 0; j < W - 1; j++) acc += wc[j] * win[(size_t)j * C + c];
            const float cur = xt[c];
            acc += wc[W - 1] * cur;
            for (int j = 0; j + 1 < W - 1; j++) win[(size_t)j * C + c] = win[(size_t)(j + 1) * C + c];
            if (W > 1) win[(size_t)(W - 2) * C + c] = cur;
            xt[c] = silu(acc);
        }
    }
}

static void l2norm(float *x, int d, float mul) {
    float ss = 0.0f;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    const float r = mul / sqrtf(ss + 1e-6f);
    for (int i = 0; i < d; i++) x[i] *= r;
}

/* One token through one head's state S [d][d] (key-major). */
static void kda_step(float *S, int d, const float *q, const float *k, const float *v, const float *decay, float beta, float *o, float *u) {
    for (int i = 0; i < d; i++) {
        float *row = S + (size_t)i * d;
        const float a = decay[i];
        for (int j = 0; j < d; j++) row[j] *= a;
    }
    for (int j = 0; j < d; j++) u[j] = 0.0f;
    for (int i = 0; i < d; i++) {
        const float *row = S + (size_t)i * d;
        const float ki = k[i];
        for (int j = 0; j < d; j++) u[j] += ki * row[j];
    }
    for (int j = 0; j < d; j++) u[j] = beta * (v[j] - u[j]);
    for (int j = 0; j < d; j++) o[j] = 0.0f;
    for (int i = 0; i < d; i++) {
        float *row = S + (size_t)i * d;
        const float ki = k[i], qi = q[i];
        for (int j = 0; j < d; j++) {
            row[j] += ki * u[j];
            o[j] += qi * row[j];
        }
    }
}

static void kda_forward(const df_model *m, df_state *s, int l, int n, int pos0) {
    (void)pos0;
    const df_config *c = &m->cfg;
    const df_layer *L = &m->layers[l];
    const int NH = c->kda_heads, d = c->kda_head_dim, W = c->kda_conv;
    const size_t C = kda_channels(m);
    float *win = s->ls[l].fixed, *S = win + 3 * (size_t)(W - 1) * C;
    /* projections: q, k, v, the forget gate's low-rank first half, beta, the output gate */
    df_mv_job jobs[6] = {{&L->w.wq, s->xn, s->q}, {&L->w.wk, s->xn, s->k}, {&L->w.wv, s->xn, s->v},
                         {&L->w.f_a, s->xn, s->h1}, {&L->w.b_proj, s->xn, s->kb}};
    int nj = 5;
    if (L->w.g_proj.data) jobs[nj++] = (df_mv_job){&L->w.g_proj, s->xn, s->ko};
    else jobs[nj++] = (df_mv_job){&L->w.g_a, s->xn, s->h2};
    df_matmul_batch(jobs, nj, n);
    df_matmul(&L->w.f_b, s->h1, n, s->kg);
    if (!L->w.g_proj.data) df_matmul(&L->w.g_b, s->h2, n, s->ko);
    float *xs[3] = {s->q, s->k, s->v};
    for (int i = 0; i < 3; i++) short_conv(xs[i], n, C, W, L->conv[i], win + (size_t)i * (W - 1) * C);
    const float qscale = 1.0f / sqrtf((float)d);
    float *u = s->h1; /* [d] scratch: f_a's output is consumed */
    for (int t = 0; t < n; t++) {
        float *qt = s->q + (size_t)t * C, *kt = s->k + (size_t)t * C, *vt = s->v + (size_t)t * C;
        float *gt = s->kg + (size_t)t * C, *ot = s->att + (size_t)t * C, *zt = s->ko + (size_t)t * C;
        for (int h = 0; h < NH; h++) {
            const size_t o = (size_t)h * d;
            l2norm(qt + o, d, qscale);
            l2norm(kt + o, d, 1.0f);
            const float A = expf(L->A_log[h]);
            for (int i = 0; i < d; i++) {
                float f = gt[o + i] + L->dt_bias[o + i];
                float g = c->kda_has_lower_bound ? (float)c->kda_lower_bound * sigm(A * f) : -A * softplus(f);
                gt[o + i] = expf(g);
            }
            kda_step(S + o * d, d, qt + o, kt + o, vt + o, gt + o, sigm(s->kb[(size_t)t * NH + h]), ot + o, u);
            /* gated output norm (fla FusedRMSNormGated, activation sigmoid) */
            df_rmsnorm(ot + o, ot + o, L->o_norm, d, (float)c->rms_eps);
            for (int i = 0; i < d; i++) ot[o + i] *= sigm(zt[o + i]);
        }
    }
    df_matmul(&L->w.wo, s->att, n, s->o);
}

const df_mixer_ops df_mixer_kda = {"KDA", 0, kda_cache_floats, kda_fixed_floats, kda_forward};
