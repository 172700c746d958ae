/* forward.c - the layer walk shared by every family, and the per-session
 * state it runs on. For each layer: norm, the layer's mixer kind, residual
 * add, norm, the layer's FFN kind, residual add; then the final norm and the
 * logits. It knows kinds, not families (kinds.h). Works on a batch of n
 * consecutive tokens (prefill) or one (decode); all buffers come from
 * df_state, sized once from the config, so the per-token loop does not
 * allocate and no size read from a model file meets a fixed array.
 * Activations and states are backend memory (df_act) and every step is a
 * backend operation (backend.h); the host only writes the embedding rows
 * in and reads the logits (and snapshots) out. */
#include "model/kinds.h"
#include "deltafin.h"
#include "util/util.h"

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

/* Whether every layer is of the kinds a backend's decode_layers covers (backend.h, df_decode_layer): GQA with q/k norms
 * and full rotate-half RoPE, no biases; a softmax-routed, renormalised SiLU MoE without shared or latent experts; plain
 * residuals. */
static int decode_kinds(const df_model *m) {
    const df_config *c = &m->cfg;
    if (m->rope_adjacent || c->rope_dim != c->head_dim || !c->norm_topk_prob || c->attn_res_block || m->out_res_norm || c->n_layers < 1) return 0;
    for (int l = 0; l < c->n_layers; l++) {
        const df_layer *L = &m->layers[l];
        if (L->kind.mixer != DF_MIXER_GQA || !L->q_norm || !L->k_norm || L->bq || L->bk || L->bv || L->bo || L->kind.ffn != DF_FFN_MOE ||
            L->kind.router != DF_ROUTER_SOFTMAX_TOPK || L->kind.act != DF_ACT_SILU_GLU || L->kind.resid != DF_RESID_PLAIN || L->kind.latent ||
            L->has_shared)
            return 0;
    }
    return 1;
}

/* backend memory of n floats, zeroed; sets *fail when out of memory */
static df_act *balloc(size_t n, int *fail) {
    df_act *p = df_alloc(n ? n : 1);
    if (!p) *fail = 1;
    return p;
}

int df_state_init(const df_model *m, int max_ctx, int max_batch, int max_logits, df_state *s, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    const df_config *c = &m->cfg;
    s->max_ctx = max_ctx;
    s->max_batch = max_batch;
    s->max_logits = max_logits < 1 ? 1 : max_logits > max_batch ? max_batch : max_logits;
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
    s->state_mem = total ? df_alloc(total) : NULL;
    if (total && !s->state_mem) {
        df_state_free(s);
        return df_err(err, errlen, DF_ENOMEM, "cannot allocate the session state (%zu MB for %zu positions)", total * sizeof(float) >> 20, T);
    }
    size_t off = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (s->ls[l].cache_floats) s->ls[l].cache = DF_AT(s->state_mem, off), off += s->ls[l].cache_floats * T;
        if (s->ls[l].fixed_floats) s->ls[l].fixed = DF_AT(s->state_mem, off), off += s->ls[l].fixed_floats;
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
    int fail = 0;
    const size_t gdim = max_z(KC, has_mla && c->mla_out_gate ? (size_t)c->n_heads * (size_t)c->v_head_dim : 0);
    if (gdim) s->ko = balloc(B * gdim, &fail);
    if (KC) {
        s->kg = balloc(B * KC, &fail);
        s->kb = balloc(B * (size_t)c->kda_heads, &fail);
        s->kc = balloc(3 * B * KC, &fail);
    }
    if (c->attn_res_block) {
        s->max_blocks = 1 + (c->n_layers - 1) / c->attn_res_block;
        s->blocks = balloc((size_t)s->max_blocks * B * H, &fail);
    }
    if (c->latent_dim) s->lat = balloc(B * (size_t)c->latent_dim, &fail);
    s->x = balloc(B * H, &fail);
    s->xn = balloc(B * H, &fail);
    s->o = balloc(B * H, &fail);
    s->ffn_out = balloc(B * H, &fail);
    s->q = balloc(B * qdim, &fail);
    s->k = balloc(B * kdim, &fail);
    s->v = balloc(B * kdim, &fail);
    s->att = balloc(B * adim, &fail);
    s->h1 = balloc(B * inter, &fail);
    s->h2 = balloc(B * inter, &fail);
    s->rope_cs = balloc(B * (size_t)max_z(2, (size_t)c->rope_dim), &fail);
    s->logits = balloc((size_t)s->max_logits * (size_t)c->vocab, &fail);
    s->emb = df_xcalloc(B * H, sizeof(float));
    if (E) {
        s->router_logits = balloc(B * E, &fail);
        s->selw = balloc(B * K, &fail);
        s->xe = balloc(B * DH, &fail);
        s->ge = balloc(max_z(B, K) * I, &fail);
        s->ue = balloc(max_z(B, K) * I, &fail);
        s->de = balloc(B * DH, &fail);
        s->de_all = balloc(B * K * DH, &fail);
        s->xp = balloc(H, &fail);
        s->plog = balloc(E, &fail);
        s->sel = df_xcalloc(B * K, sizeof(int));
        s->tok_list = df_xcalloc(B * K, sizeof(int));
        s->tok_src = df_xcalloc(B * K, sizeof(int));
        s->exp_list = df_xcalloc(E, sizeof(int));
        s->seen = df_xcalloc(E, 1);
        s->pend_k = df_xcalloc(K, sizeof(int));
        s->pend_f = df_xcalloc(K, sizeof(df_glu));
        s->jobs = df_xcalloc(2 * K, sizeof(df_mv_job));
        s->pred = df_xcalloc(K, sizeof(int));
    }
    if (fail) {
        df_state_free(s);
        return df_err(err, errlen, DF_ENOMEM, "cannot allocate the session's scratch for a batch of %zu tokens", B);
    }
    if (decode_kinds(m)) { /* the layers as a backend's decode_layers takes them (only one that has it ever reads this) */
        s->dec = df_xcalloc(L, sizeof *s->dec);
        for (int l = 0; l < c->n_layers; l++) {
            const df_layer *Ly = &m->layers[l];
            s->dec[l] = (df_decode_layer){&Ly->w.wq, &Ly->w.wk, &Ly->w.wv, &Ly->w.wo, &Ly->w.router, Ly->attn_norm, Ly->ffn_norm, Ly->q_norm, Ly->k_norm,
                                          s->ls[l].cache, l};
        }
    }
    return 0;
}

void df_state_free(df_state *s) {
    df_act *acts[] = {s->state_mem, s->x, s->xn, s->q, s->k, s->v, s->att, s->o, s->h1, s->h2, s->ffn_out, s->router_logits,
                      s->rope_cs, s->logits, s->selw, s->xe, s->ge, s->ue, s->de, s->de_all, s->xp, s->plog,
                      s->kg, s->kb, s->ko, s->kc, s->blocks, s->lat};
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) df_free(acts[i]);
    void *bufs[] = {s->ls, s->emb, s->sel, s->tok_list, s->tok_src, s->exp_list, s->seen, s->pend_k, s->pend_f, s->jobs, s->pred, s->dec};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    memset(s, 0, sizeof *s);
}

/* Fixed states are laid out after each layer's cache; a snapshot copies them
 * to the host in layer order into one buffer. */
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
        if (s->ls[l].fixed_floats) df_read(p, s->ls[l].fixed, s->ls[l].fixed_floats), p += s->ls[l].fixed_floats;
    return 0;
}

void df_state_restore(df_state *s, const df_snapshot *snap) {
    const int n_layers = s->n_layers;
    const float *p = snap->fixed;
    for (int l = 0; l < n_layers && p; l++)
        if (s->ls[l].fixed_floats) df_write(s->ls[l].fixed, p, s->ls[l].fixed_floats), p += s->ls[l].fixed_floats;
}

void df_state_clear_fixed(df_state *s) {
    for (int l = 0; l < s->n_layers; l++)
        if (s->ls[l].fixed_floats) df_zero(s->ls[l].fixed, s->ls[l].fixed_floats);
}

void df_snapshot_free(df_snapshot *snap) {
    free(snap->fixed);
    memset(snap, 0, sizeof *snap);
}

/* The forward pass. tokens NULL: one position whose token is the backend's token slot (embed_token; the caller
 * checked that it gathers m's embedding); logits NULL: the last position's logits stay in s->logits and their
 * argmax is started (next_token), its ticket in *ticket. */
static int fwd(const df_model *m, df_state *s, const int32_t *tokens, int n, int pos0, float *logits, int all, int64_t *ticket) {
    const df_config *c = &m->cfg;
    const int H = c->hidden;
    if (n <= 0 || n > s->max_batch || (all && n > s->max_logits) || pos0 < 0 || pos0 + n > s->max_ctx) return DF_EINPUT;
    if ((!tokens || !logits) && (n != 1 || all)) return DF_EINPUT;
    if ((!logits && !df_be->next_token) || (!tokens && !df_be->embed_token)) return DF_EUNSUPPORTED;
    for (int t = 0; tokens && t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab) return DF_EINPUT;
    double t0 = df_now();
    s->err[0] = 0;
    s->dec_ran = 0;
    if (s->src) s->src->ops->set_token(s->src, pos0);
    if (!tokens) {
        if (df_be->embed_token(&m->embed, s->x)) return DF_EUNSUPPORTED;
    } else {
        for (int t = 0; t < n; t++)
            if (df_model_embed_row(m, tokens[t], s->emb + (size_t)t * H, s->err, sizeof s->err)) return DF_EIO;
        df_write(s->x, s->emb, (size_t)n * H);
    }
    df_rope_table(s->rope_cs, pos0, n, m->inv_freq, c->rope_dim / 2, m->rope_scale);
    const float eps = (float)c->rms_eps;
    double t1 = df_now();
    s->t_other += t1 - t0;
    const size_t NH_ = (size_t)n * H, bstride = (size_t)s->max_batch * H;
    const int bs = c->attn_res_block;
    int nb = 0; /* attention residuals: completed blocks in s->blocks; s->x is the partial sum of this block */
    const int first = all ? 0 : n - 1, cnt = all ? n : 1;
    /* normed: s->xn already holds the next norm of s->x (the residual add before it was df_add_rmsnorm: one
     * backend op for the add and the norm, the same two ops where the backend has no fused one) */
    int normed = 0, whole = 0;
    /* a decode position through every layer in one backend operation, where the backend has one for these kinds
     * (backend.h, decode_layers: the CUDA backend's persistent kernel); it declines what it does not cover */
    if (n == 1 && s->dec && df_be->decode_layers && !s->exact && (s->src ? s->src : m->resident_src) == m->resident_src) {
        const df_decode_layers_args da = {s->dec, c->n_layers, s->x, s->rope_cs, pos0, H, c->n_heads, c->n_kv_heads, c->head_dim,
                                          c->n_experts, c->n_experts_used, c->moe_intermediate, eps, m->attn_scale};
        const int rc = df_be->decode_layers(&da);
        if (rc < 0) return df_err(s->err, sizeof s->err, rc, "position %d: the decode step's layers failed on the device (the backend said why on stderr)", pos0);
        whole = rc == 0;
        s->dec_ran = whole;
        s->t_ffn += df_now() - t1; /* (the layers' time, not split into mixer and FFN) */
    }
    for (int l = 0; !whole && l < c->n_layers; l++) {
        const df_layer *L = &m->layers[l];
        const int ar = L->kind.resid == DF_RESID_ATTNRES;
        df_be_layer = l; /* named in a device backend's error messages */
        double a0 = df_now();
        int restart = 0;
        if (ar) {
            /* the mixer's input mixes the completed blocks and the partial sum; a new block starts every bs layers */
            const df_act *in = s->x;
            if (nb) {
                const df_attn_res_args r = {s->xn, s->blocks, bstride, nb, s->x, L->res_norm[0], L->res_proj[0], n, H, eps};
                df_attn_res(&r);
                in = s->xn;
            }
            if (l % bs == 0 && nb < s->max_blocks) df_copy(DF_AT(s->blocks, (size_t)nb++ * bstride), s->x, NH_), restart = 1;
            df_rmsnorm_rows(s->xn, H, in, H, L->attn_norm, n, H, eps);
        } else if (!normed) {
            df_rmsnorm_rows(s->xn, H, s->x, H, L->attn_norm, n, H, eps);
        }
        normed = 0;
        df_mixer_of(L->kind.mixer)->forward(m, s, l, n, pos0);
        if (restart) df_copy(s->x, s->o, NH_);
        else if (!ar) df_add_rmsnorm(s->xn, s->x, s->o, L->ffn_norm, n, H, eps);
        else df_add(s->x, s->o, NH_);
        double a1 = df_now();
        if (ar) {
            const df_attn_res_args r = {s->xn, s->blocks, bstride, nb, s->x, L->res_norm[1], L->res_proj[1], n, H, eps};
            df_attn_res(&r);
            df_rmsnorm_rows(s->xn, H, s->xn, H, L->ffn_norm, n, H, eps);
        }
        int rc = L->kind.ffn == DF_FFN_MOE ? df_ffn_moe(m, s, L, l, n) : df_ffn_dense(m, s, L, n);
        if (rc) {
            df_be_layer = -1;
            return rc;
        }
        const df_layer *L2 = l + 1 < c->n_layers ? &m->layers[l + 1] : NULL;
        if (L2 && L2->kind.resid != DF_RESID_ATTNRES) /* the add and the next layer's first norm */
            df_add_rmsnorm(s->xn, s->x, s->ffn_out, L2->attn_norm, n, H, eps), normed = 1;
        else if (!L2 && !(m->out_res_norm && nb) && cnt == n) /* the add and the final norm */
            df_add_rmsnorm(s->xn, s->x, s->ffn_out, m->final_norm, n, H, eps), normed = 1;
        else
            df_add(s->x, s->ffn_out, NH_);
        double a2 = df_now();
        s->t_attn += a1 - a0;
        s->t_ffn += a2 - a1;
    }
    df_be_layer = -1;
    double t2 = df_now();
    const df_act *fin = DF_AT(s->x, (size_t)first * H);
    if (normed) {
        /* s->xn holds the final norm already */
    } else if (m->out_res_norm && nb) { /* the output mixes the blocks and the last partial sum too */
        const df_attn_res_args r = {s->xn, DF_AT(s->blocks, (size_t)first * H), bstride, nb, fin, m->out_res_norm, m->out_res_proj, cnt, H, eps};
        df_attn_res(&r);
        fin = s->xn;
    }
    if (!normed) df_rmsnorm_rows(s->xn, H, fin, H, m->final_norm, cnt, H, eps);
    df_matmul(&m->lm_head, s->xn, cnt, s->logits);
    if (logits) df_read(logits, s->logits, (size_t)cnt * c->vocab);
    else *ticket = df_be->next_token(s->logits, c->vocab);
    s->t_other += df_now() - t2;
    return 0;
}

int df_forward(const df_model *m, df_state *s, const int32_t *tokens, int n, int pos0, float *logits, int all) {
    if (!logits || !tokens) return DF_EINPUT;
    if (s->exact && n > 1 && all && s->dec && df_be->decode_layers && n <= s->max_logits && df_be->decode_layers(NULL) == 0) {
        /* a verify pass (exact: each row the bits of a plain step) on a backend whose plain steps may run their layers
         * through decode_layers, whose bits no batched pass gives: the positions as plain steps while the backend takes
         * them that way; once it declines one (plain steps go op by op then), the rest as the exact batched pass */
        const int ex = s->exact;
        int t = 0, rc = 0, ran = 1;
        s->exact = 0;
        while (t < n && ran && !rc) {
            s->dec_ran = 0;
            rc = fwd(m, s, tokens + t, 1, pos0 + t, logits + (size_t)t * (size_t)m->cfg.vocab, 1, NULL);
            ran = s->dec_ran, t++;
        }
        s->exact = ex;
        if (rc || t == n) return rc;
        return fwd(m, s, tokens + t, n - t, pos0 + t, logits + (size_t)t * (size_t)m->cfg.vocab, 1, NULL);
    }
    return fwd(m, s, tokens, n, pos0, logits, all, NULL);
}

int df_forward_ahead(const df_model *m, df_state *s, const int32_t *token, int pos0, int64_t *ticket) {
    return fwd(m, s, token, 1, pos0, NULL, 0, ticket);
}

int df_forward_ahead_embeds(const df_model *m) {
    return df_be->next_token && df_be->embed_token && df_be->embed_token(&m->embed, NULL) == 0;
}
