/* forward.c - the layer walk shared by every family, and the per-session
 * state it runs on. For each layer: norm, the layer's mixer kind, residual
 * add, norm, the layer's FFN kind, residual add; then the final norm and the
 * logits. It knows kinds, not families (kinds.h). Works on a batch of n
 * consecutive tokens (prefill) or one (decode); all buffers come from
 * df_state, sized once from the config, so the per-token loop does not
 * allocate and no size read from a model file meets a fixed array. */
#include "model/kinds.h"
#include "deltafin.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

size_t df_state_bytes_per_token(const df_model *m) {
    size_t f = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) f += df_mixer_of(m->layers[l].kind.mixer)->cache_floats(m, l);
    return f * sizeof(float);
}

size_t df_state_fixed_bytes(const df_model *m) {
    size_t f = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) f += df_mixer_of(m->layers[l].kind.mixer)->fixed_floats(m, l);
    return f * sizeof(float);
}

int df_state_truncatable(const df_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (!df_mixer_of(m->layers[l].kind.mixer)->truncatable) return 0;
    return 1;
}

int df_state_init(const df_model *m, int max_ctx, int max_batch, df_state *s, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    const df_config *c = &m->cfg;
    s->max_ctx = max_ctx;
    s->max_batch = max_batch;
    s->n_layers = c->n_layers;
    const size_t B = (size_t)max_batch, T = (size_t)max_ctx, L = (size_t)c->n_layers;
    /* every layer's state in one allocation: growing caches, then fixed states */
    s->ls = df_xcalloc(L, sizeof *s->ls);
    size_t total = 0, qdim = 0, kdim = 0, adim = 0;
    int has_mla = 0, has_kda = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const df_mixer_ops *mx = df_mixer_of(m->layers[l].kind.mixer);
        s->ls[l].cache_floats = mx->cache_floats(m, l);
        s->ls[l].fixed_floats = mx->fixed_floats(m, l);
        if (s->ls[l].cache_floats > (SIZE_MAX / sizeof(float) - total) / T)
            return df_err(err, errlen, DF_ENOMEM, "layer %d: state of %zu floats per position x %zu positions does not fit in memory", l, s->ls[l].cache_floats, T);
        total += s->ls[l].cache_floats * T + s->ls[l].fixed_floats;
        if (m->layers[l].kind.mixer == DF_MIXER_MLA) has_mla = 1;
        if (m->layers[l].kind.mixer == DF_MIXER_KDA) has_kda = 1;
    }
    s->state_floats = total;
    s->state_mem = total ? calloc(total, sizeof(float)) : NULL;
    if (total && !s->state_mem) {
        df_state_free(s);
        return df_err(err, errlen, DF_ENOMEM, "cannot allocate the session state (%zu MB for %zu positions)", total * sizeof(float) >> 20, T);
    }
    float *p = s->state_mem;
    for (int l = 0; l < c->n_layers; l++) {
        if (s->ls[l].cache_floats) s->ls[l].cache = p, p += s->ls[l].cache_floats * T;
        if (s->ls[l].fixed_floats) s->ls[l].fixed = p, p += s->ls[l].fixed_floats;
    }
    /* scratch, sized for the widest kind any layer uses */
    qdim = max_z((size_t)c->n_heads * (size_t)c->head_dim, has_mla ? (size_t)c->n_heads * (size_t)(c->qk_nope_dim + c->qk_rope_dim) : 0);
    kdim = max_z((size_t)c->n_kv_heads * (size_t)c->head_dim, has_mla ? (size_t)(c->kv_lora_rank + c->qk_rope_dim) : 0);
    adim = max_z((size_t)c->n_heads * (size_t)c->head_dim, has_mla ? (size_t)c->n_heads * (size_t)c->v_head_dim : 0);
    const size_t KC = has_kda ? (size_t)c->kda_heads * (size_t)c->kda_head_dim : 0; /* KDA channels */
    qdim = max_z(qdim, KC), kdim = max_z(kdim, KC), adim = max_z(adim, KC);
    const size_t H = (size_t)c->hidden, K = (size_t)c->n_experts_used, E = (size_t)c->n_experts, I = (size_t)c->moe_intermediate;
    const size_t DH = max_z(H, (size_t)c->latent_dim); /* widest routed-expert input/output */
    size_t inter = max_z(max_z((size_t)c->intermediate, (size_t)c->q_lora_rank), I * max_z(1, (size_t)c->n_shared_experts));
    inter = max_z(inter, has_kda ? (size_t)c->kda_head_dim : 0);
    const size_t gdim = max_z(KC, has_mla && c->mla_out_gate ? (size_t)c->n_heads * (size_t)c->v_head_dim : 0);
    if (gdim) s->ko = df_xcalloc(B * gdim, sizeof(float));
    if (KC) {
        s->kg = df_xcalloc(B * KC, sizeof(float));
        s->kb = df_xcalloc(B * (size_t)c->kda_heads, sizeof(float));
    }
    if (c->attn_res_block) {
        s->max_blocks = 1 + (c->n_layers - 1) / c->attn_res_block;
        s->blocks = df_xcalloc((size_t)s->max_blocks * B * H, sizeof(float));
    }
    if (c->latent_dim) s->lat = df_xcalloc(B * (size_t)c->latent_dim, sizeof(float));
    s->x = df_xcalloc(B * H, sizeof(float));
    s->xn = df_xcalloc(B * H, sizeof(float));
    s->o = df_xcalloc(B * H, sizeof(float));
    s->ffn_out = df_xcalloc(B * H, sizeof(float));
    s->q = df_xcalloc(B * qdim, sizeof(float));
    s->k = df_xcalloc(B * kdim, sizeof(float));
    s->v = df_xcalloc(B * kdim, sizeof(float));
    s->att = df_xcalloc(B * adim, sizeof(float));
    s->h1 = df_xcalloc(B * inter, sizeof(float));
    s->h2 = df_xcalloc(B * inter, sizeof(float));
    s->rope_cs = df_xcalloc(B * (size_t)max_z(2, (size_t)c->rope_dim), sizeof(float));
    if (E) {
        s->router_logits = df_xcalloc(B * E, sizeof(float));
        s->sel = df_xcalloc(B * K, sizeof(int));
        s->selw = df_xcalloc(B * K, sizeof(float));
        s->tok_list = df_xcalloc(B * K, sizeof(int));
        s->xe = df_xcalloc(B * DH, sizeof(float));
        s->ge = df_xcalloc(max_z(B, K) * I, sizeof(float));
        s->ue = df_xcalloc(max_z(B, K) * I, sizeof(float));
        s->de = df_xcalloc(B * DH, sizeof(float));
        s->de_all = df_xcalloc(B * K * DH, sizeof(float));
        s->exp_list = df_xcalloc(E, sizeof(int));
        s->route_tmp = df_xcalloc(4 * E, sizeof(float));
        s->pend_k = df_xcalloc(K, sizeof(int));
        s->pend_f = df_xcalloc(K, sizeof(df_glu));
        s->jobs = df_xcalloc(2 * K, sizeof(df_mv_job));
        s->xp = df_xcalloc(H, sizeof(float));
        s->plog = df_xcalloc(E, sizeof(float));
        s->pred = df_xcalloc(K, sizeof(int));
        s->predw = df_xcalloc(K, sizeof(float));
    }
    return 0;
}

void df_state_free(df_state *s) {
    void *bufs[] = {s->state_mem, s->ls, s->x, s->xn, s->q, s->k, s->v, s->att, s->o, s->h1, s->h2, s->ffn_out,
                    s->router_logits, s->rope_cs, s->kg, s->kb, s->ko, s->blocks, s->lat, s->sel, s->selw, s->tok_list, s->xe, s->ge, s->ue,
                    s->de, s->de_all, s->exp_list, s->route_tmp, s->pend_k, s->pend_f, s->jobs, s->xp, s->plog, s->pred, s->predw};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    memset(s, 0, sizeof *s);
}

/* Fixed states are laid out after each layer's cache; a snapshot copies them
 * in layer order into one buffer. */
int df_state_snapshot(const df_state *s, int pos, df_snapshot *out) {
    const int n_layers = s->n_layers;
    memset(out, 0, sizeof *out);
    out->pos = pos;
    size_t n = 0;
    for (int l = 0; l < n_layers; l++) n += s->ls[l].fixed_floats;
    out->n_floats = n;
    if (!n) return 0;
    out->fixed = malloc(n * sizeof(float));
    if (!out->fixed) return DF_ENOMEM;
    float *p = out->fixed;
    for (int l = 0; l < n_layers; l++)
        if (s->ls[l].fixed_floats) memcpy(p, s->ls[l].fixed, s->ls[l].fixed_floats * sizeof(float)), p += s->ls[l].fixed_floats;
    return 0;
}

void df_state_restore(df_state *s, const df_snapshot *snap) {
    const int n_layers = s->n_layers;
    const float *p = snap->fixed;
    for (int l = 0; l < n_layers && p; l++)
        if (s->ls[l].fixed_floats) memcpy(s->ls[l].fixed, p, s->ls[l].fixed_floats * sizeof(float)), p += s->ls[l].fixed_floats;
}

void df_state_clear_fixed(df_state *s) {
    for (int l = 0; l < s->n_layers; l++)
        if (s->ls[l].fixed_floats) memset(s->ls[l].fixed, 0, s->ls[l].fixed_floats * sizeof(float));
}

void df_snapshot_free(df_snapshot *snap) {
    free(snap->fixed);
    memset(snap, 0, sizeof *snap);
}

void df_rope(const float *cs, int d, float *v, int interleaved) {
    int half = d / 2;
    if (interleaved) {
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1], a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * c - b * s;
            v[2 * i + 1] = b * c + a * s;
        }
    } else {
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1], a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

int df_forward(const df_model *m, df_state *s, const int32_t *tokens, int n, int pos0, float *logits, int all) {
    const df_config *c = &m->cfg;
    const int H = c->hidden;
    if (n <= 0 || n > s->max_batch || pos0 < 0 || pos0 + n > s->max_ctx) return DF_EINPUT;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab) return DF_EINPUT;
    double t0 = df_now();
    s->err[0] = 0;
    if (s->src) s->src->ops->set_token(s->src, pos0);
    for (int t = 0; t < n; t++)
        if (df_model_embed_row(m, tokens[t], s->x + (size_t)t * H, s->err, sizeof s->err)) return DF_EIO;
    const int half = c->rope_dim / 2;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)(pos0 + t) * m->inv_freq[i];
            s->rope_cs[((size_t)t * half + i) * 2] = cosf(ang) * m->rope_scale;
            s->rope_cs[((size_t)t * half + i) * 2 + 1] = sinf(ang) * m->rope_scale;
        }
    const float eps = (float)c->rms_eps;
    double t1 = df_now();
    s->t_other += t1 - t0;
    const size_t NH_ = (size_t)n * H, bstride = (size_t)s->max_batch * H;
    const int bs = c->attn_res_block;
    int nb = 0; /* attention residuals: completed blocks in s->blocks; s->x is the partial sum of this block */
    for (int l = 0; l < c->n_layers; l++) {
        const df_layer *L = &m->layers[l];
        const int ar = L->kind.resid == DF_RESID_ATTNRES;
        double a0 = df_now();
        int restart = 0;
        if (ar) {
            /* the mixer's input mixes the completed blocks and the partial sum; a new block starts every bs layers */
            const float *in = s->x;
            if (nb) df_attn_res(m, s->blocks, bstride, nb, s->x, n, L->res_norm[0], L->res_proj[0], s->xn), in = s->xn;
            if (l % bs == 0 && nb < s->max_blocks) memcpy(s->blocks + (size_t)nb++ * bstride, s->x, NH_ * sizeof(float)), restart = 1;
            for (int t = 0; t < n; t++) df_rmsnorm(s->xn + (size_t)t * H, in + (size_t)t * H, L->attn_norm, H, eps);
        } else {
            for (int t = 0; t < n; t++) df_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, L->attn_norm, H, eps);
        }
        df_mixer_of(L->kind.mixer)->forward(m, s, l, n, pos0);
        if (restart) memcpy(s->x, s->o, NH_ * sizeof(float));
        else for (size_t i = 0; i < NH_; i++) s->x[i] += s->o[i];
        double a1 = df_now();
        if (ar) {
            df_attn_res(m, s->blocks, bstride, nb, s->x, n, L->res_norm[1], L->res_proj[1], s->xn);
            for (int t = 0; t < n; t++) df_rmsnorm(s->xn + (size_t)t * H, s->xn + (size_t)t * H, L->ffn_norm, H, eps);
        } else {
            for (int t = 0; t < n; t++) df_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, L->ffn_norm, H, eps);
        }
        int rc = L->kind.ffn == DF_FFN_MOE ? df_ffn_moe(m, s, L, l, n) : df_ffn_dense(m, s, L, n);
        if (rc) return rc;
        for (size_t i = 0; i < NH_; i++) s->x[i] += s->ffn_out[i];
        double a2 = df_now();
        s->t_attn += a1 - a0;
        s->t_ffn += a2 - a1;
    }
    double t2 = df_now();
    int first = all ? 0 : n - 1, cnt = all ? n : 1;
    const float *fin = s->x + (size_t)first * H;
    if (m->out_res_norm && nb) { /* the output mixes the blocks and the last partial sum too */
        df_attn_res(m, s->blocks + (size_t)first * H, bstride, nb, fin, cnt, m->out_res_norm, m->out_res_proj, s->xn);
        fin = s->xn;
    }
    for (int t = 0; t < cnt; t++) df_rmsnorm(s->xn + (size_t)t * H, fin + (size_t)t * H, m->final_norm, H, eps);
    df_matmul(&m->lm_head, s->xn, cnt, logits);
    s->t_other += df_now() - t2;
    return 0;
}
