/* forward.c - the layer loop shared by every family: embeddings, norms,
 * attention (family-specific), dense MLP or routed experts, final norm and
 * logits. Works on a batch of n consecutive tokens (prefill) or one (decode);
 * all buffers come from df_state, sized once, so the per-token loop does not
 * allocate. */
#include "model/model.h"
#include "store/ecache.h"
#include "deltafin.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int max_i(int a, int b) { return a > b ? a : b; }

size_t df_state_bytes_per_token(const df_model *m) {
    const df_config *c = &m->cfg;
    if (c->family == DF_FAM_DEEPSEEK_V3) return (size_t)c->n_layers * (size_t)(c->kv_lora_rank + c->qk_rope_dim) * sizeof(float);
    return (size_t)c->n_layers * 2 * (size_t)c->n_kv_heads * (size_t)c->head_dim * sizeof(float);
}

int df_state_init(const df_model *m, int max_ctx, int max_batch, df_state *s, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    const df_config *c = &m->cfg;
    s->max_ctx = max_ctx;
    s->max_batch = max_batch;
    const size_t B = (size_t)max_batch, L = (size_t)c->n_layers, T = (size_t)max_ctx;
    int nth = df_pool_size();
    int qdim, kdim, adim;
    if (c->family == DF_FAM_DEEPSEEK_V3) {
        qdim = c->n_heads * (c->qk_nope_dim + c->qk_rope_dim);
        kdim = c->kv_lora_rank + c->qk_rope_dim;
        adim = c->n_heads * c->v_head_dim;
        s->latent = calloc(L * T * (size_t)kdim, sizeof(float));
        if (!s->latent) return df_err(err, errlen, DF_ENOMEM, "cannot allocate the latent cache (%zu MB)", L * T * (size_t)kdim * 4 >> 20);
        s->qlat = df_xcalloc((size_t)nth * (size_t)(c->kv_lora_rank + c->qk_rope_dim), sizeof(float));
        s->mla_w = df_xcalloc((size_t)nth * (size_t)(c->qk_nope_dim + c->v_head_dim) * (size_t)c->kv_lora_rank, sizeof(float));
    } else {
        qdim = c->n_heads * c->head_dim;
        kdim = c->n_kv_heads * c->head_dim;
        adim = qdim;
        s->k_cache = calloc(L * T * (size_t)kdim, sizeof(float));
        s->v_cache = calloc(L * T * (size_t)kdim, sizeof(float));
        if (!s->k_cache || !s->v_cache) {
            df_state_free(s);
            return df_err(err, errlen, DF_ENOMEM, "cannot allocate the KV cache (%zu MB)", 2 * L * T * (size_t)kdim * 4 >> 20);
        }
    }
    int inter = max_i(max_i(c->intermediate, c->q_lora_rank), max_i(c->moe_intermediate, c->moe_intermediate * max_i(1, c->n_shared_experts)));
    s->x = df_xcalloc(B * (size_t)c->hidden, sizeof(float));
    s->xn = df_xcalloc(B * (size_t)c->hidden, sizeof(float));
    s->o = df_xcalloc(B * (size_t)c->hidden, sizeof(float));
    s->ffn_out = df_xcalloc(B * (size_t)c->hidden, sizeof(float));
    s->q = df_xcalloc(B * (size_t)qdim, sizeof(float));
    s->k = df_xcalloc(B * (size_t)kdim, sizeof(float));
    s->v = df_xcalloc(B * (size_t)kdim, sizeof(float));
    s->att = df_xcalloc(B * (size_t)adim, sizeof(float));
    s->h1 = df_xcalloc(B * (size_t)inter, sizeof(float));
    s->h2 = df_xcalloc(B * (size_t)inter, sizeof(float));
    s->att_scores = df_xcalloc((size_t)nth * T, sizeof(float));
    s->rope_cs = df_xcalloc(B * (size_t)c->rope_dim, sizeof(float));
    if (c->n_experts) {
        s->router_logits = df_xcalloc(B * (size_t)c->n_experts, sizeof(float));
        s->sel = df_xcalloc(B * (size_t)c->n_experts_used, sizeof(int));
        s->selw = df_xcalloc(B * (size_t)c->n_experts_used, sizeof(float));
        s->tok_list = df_xcalloc(B * (size_t)c->n_experts_used, sizeof(int));
        s->xe = df_xcalloc(B * (size_t)c->hidden, sizeof(float));
        s->ge = df_xcalloc(B * (size_t)c->moe_intermediate, sizeof(float));
        s->ue = df_xcalloc(B * (size_t)c->moe_intermediate, sizeof(float));
        s->de = df_xcalloc(B * (size_t)c->hidden, sizeof(float));
        s->de_all = df_xcalloc(B * (size_t)c->n_experts_used * (size_t)c->hidden, sizeof(float));
        s->exp_list = df_xcalloc((size_t)c->n_experts, sizeof(int));
        s->xp = df_xcalloc((size_t)c->hidden, sizeof(float));
        s->plog = df_xcalloc((size_t)c->n_experts, sizeof(float));
        s->pred = df_xcalloc((size_t)c->n_experts_used, sizeof(int));
        s->predw = df_xcalloc((size_t)c->n_experts_used, sizeof(float));
    }
    return 0;
}

void df_state_free(df_state *s) {
    float *bufs[] = {s->mla_w, s->k_cache, s->v_cache, s->latent, s->x, s->xn, s->q, s->k, s->v, s->att, s->o, s->h1, s->h2,
                     s->ffn_out, s->router_logits, s->att_scores, s->qlat, s->rope_cs, s->selw, s->xe, s->ge, s->ue, s->de};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s->sel);
    free(s->tok_list);
    free(s->exp_list);
    free(s->xp);
    free(s->plog);
    free(s->pred);
    free(s->predw);
    free(s->de_all);
    memset(s, 0, sizeof *s);
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

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* out[n x hidden] = down(silu(gate x) * up x) */
static void mlp(const df_ffn *f, const float *x, int n, float *h1, float *h2, float *out) {
    const df_mv_job jobs[2] = {{&f->gate, x, h1}, {&f->up, x, h2}};
    df_matmul_batch(jobs, 2, n);
    const int64_t I = f->gate.rows;
    for (int64_t i = 0; i < (int64_t)n * I; i++) h1[i] = silu(h1[i]) * h2[i];
    df_matmul(&f->down, h1, n, out);
}

/* One expert over the gathered tokens cnt tokens of xe (decode: cnt == 1,
 * xe == xn); outputs to out[cnt x H]. Products are per row, so the bits do
 * not depend on which other work shares a dispatch. */
static void expert_ffn(const df_ffn *f, const float *x, int cnt, float *g, float *u, float *out) {
    mlp(f, x, cnt, g, u, out);
}

typedef struct {
    const df_model *m;
    df_state *s;
    const int *ids; /* experts of this acquire */
    int n;          /* tokens in the batch */
    int npend;      /* decode: experts handed over and not computed yet */
    int pend_k[64];
    const df_ffn *pend_f[64];
} moe_ctx;

/* Decode: the pending experts' gate/up products in one dispatch, their down
 * products in another (rows are computed the same way whatever the batch,
 * so the bits do not depend on how experts were grouped). */
static void moe_flush_decode(moe_ctx *c) {
    if (!c->npend) return;
    df_state *s = c->s;
    const df_config *cfg = &c->m->cfg;
    const int H = cfg->hidden, I = cfg->moe_intermediate;
    df_mv_job jobs[128];
    for (int j = 0; j < c->npend; j++) {
        jobs[2 * j] = (df_mv_job){&c->pend_f[j]->gate, s->xn, s->ge + (size_t)j * I};
        jobs[2 * j + 1] = (df_mv_job){&c->pend_f[j]->up, s->xn, s->ue + (size_t)j * I};
    }
    df_matmul_batch(jobs, 2 * c->npend, 1);
    for (int64_t i = 0; i < (int64_t)c->npend * I; i++) s->ge[i] = silu(s->ge[i]) * s->ue[i];
    for (int j = 0; j < c->npend; j++) jobs[j] = (df_mv_job){&c->pend_f[j]->down, s->ge + (size_t)j * I, s->de_all + (size_t)c->pend_k[j] * H};
    df_matmul_batch(jobs, c->npend, 1);
    c->npend = 0;
}

/* Called by the expert cache as each expert becomes resident (or directly
 * for resident experts): computes its output rows of de_all. */
static void moe_expert_ready(void *p, int i, const df_ffn *f) {
    moe_ctx *c = p;
    df_state *s = c->s;
    if (i < 0) { /* the cache is about to wait, or is done: compute what is batched */
        if (c->n == 1) moe_flush_decode(c);
        return;
    }
    const df_config *cfg = &c->m->cfg;
    const int H = cfg->hidden, K = cfg->n_experts_used, I = cfg->moe_intermediate, e = c->ids[i];
    if (c->n == 1) { /* decode: slot k of the one token, batched until the next flush */
        int k = 0;
        while (s->sel[k] != e) k++;
        c->pend_k[c->npend] = k;
        c->pend_f[c->npend++] = f;
        return;
    }
    int cnt = 0;
    for (int t = 0; t < c->n; t++)
        for (int k = 0; k < K; k++)
            if (s->sel[t * K + k] == e) { s->tok_list[cnt] = t * K + k; memcpy(s->xe + (size_t)cnt * H, s->xn + (size_t)t * H, (size_t)H * 4); cnt++; }
    expert_ffn(f, s->xe, cnt, s->ge, s->ue, s->de);
    for (int j = 0; j < cnt; j++) memcpy(s->de_all + (size_t)s->tok_list[j] * H, s->de + (size_t)j * H, (size_t)H * 4);
    (void)I;
}

/* Routed experts (+ shared). Every expert's output lands in de_all[token][k]
 * and is summed in (token, k) order at the end, so resident and streamed
 * runs give the same bits whatever order the experts arrive in. */
static int moe(const df_model *m, df_state *s, const df_layer *L, int l, int n) {
    const df_config *c = &m->cfg;
    const int H = c->hidden, E = c->n_experts, K = c->n_experts_used, I = c->moe_intermediate;
    df_matmul(&L->router, s->xn, n, s->router_logits);
    for (int t = 0; t < n; t++) {
        if (c->family == DF_FAM_DEEPSEEK_V3) df_route_deepseek(m, L, s->router_logits + (size_t)t * E, s->sel + t * K, s->selw + t * K);
        else df_route_qwen3(m, L, s->router_logits + (size_t)t * E, s->sel + t * K, s->selw + t * K);
    }
    /* the distinct experts of this batch, in index order */
    int ne = 0;
    for (int e = 0; e < E; e++)
        for (int i = 0; i < n * K; i++)
            if (s->sel[i] == e) { s->exp_list[ne++] = e; break; }
    moe_ctx mc = {.m = m, .s = s, .ids = s->exp_list, .n = n};
    int nl = l + 1; /* the next MoE layer */
    while (nl < c->n_layers && !m->layers[nl].moe) nl++;
    if (m->ecache && n == 1 && m->prefetch && nl < c->n_layers) {
        /* router lookahead: the next MoE layer's router on the current residual
         * predicts its experts; their reads start while this layer's experts
         * compute. Prediction only warms the cache: that layer still routes on
         * its own input. */
        const df_layer *N = &m->layers[nl];
        df_rmsnorm(s->xp, s->x, N->ffn_norm, H, (float)c->rms_eps);
        df_matvec(&N->router, s->xp, s->plog);
        if (c->family == DF_FAM_DEEPSEEK_V3) df_route_deepseek(m, N, s->plog, s->pred, s->predw);
        else df_route_qwen3(m, N, s->plog, s->pred, s->predw);
        int rc = df_ecache_acquire_pf(m->ecache, l, s->exp_list, ne, nl, s->pred, K, moe_expert_ready, &mc, s->err, sizeof s->err);
        df_ecache_release(m->ecache);
        if (rc) return rc;
    } else if (m->ecache) {
        int wave = df_ecache_slots(m->ecache);
        for (int w0 = 0; w0 < ne; w0 += wave) {
            int cnt = ne - w0 < wave ? ne - w0 : wave;
            mc.ids = s->exp_list + w0;
            int rc = df_ecache_acquire(m->ecache, l, mc.ids, cnt, moe_expert_ready, &mc, s->err, sizeof s->err);
            df_ecache_release(m->ecache);
            if (rc) return rc;
        }
    } else if (n == 1) {
        /* decode, resident: all k experts' gate/up in one dispatch, their downs in another */
        df_mv_job jobs[2 * 64];
        for (int k = 0; k < K; k++) {
            const df_ffn *f = &L->experts[s->sel[k]];
            jobs[2 * k] = (df_mv_job){&f->gate, s->xn, s->ge + (size_t)k * I};
            jobs[2 * k + 1] = (df_mv_job){&f->up, s->xn, s->ue + (size_t)k * I};
        }
        df_matmul_batch(jobs, 2 * K, 1);
        for (int64_t i = 0; i < (int64_t)K * I; i++) s->ge[i] = silu(s->ge[i]) * s->ue[i];
        for (int k = 0; k < K; k++) jobs[k] = (df_mv_job){&L->experts[s->sel[k]].down, s->ge + (size_t)k * I, s->de_all + (size_t)k * H};
        df_matmul_batch(jobs, K, 1);
    } else {
        for (int i = 0; i < ne; i++) moe_expert_ready(&mc, i, &L->experts[s->exp_list[i]]);
    }
    memset(s->ffn_out, 0, (size_t)n * H * sizeof(float));
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++) df_axpy(s->ffn_out + (size_t)t * H, s->selw[t * K + k], s->de_all + ((size_t)t * K + k) * H, H);
    if (L->has_shared) {
        mlp(&L->shared, s->xn, n, s->h1, s->h2, s->o);
        for (int64_t i = 0; i < (int64_t)n * H; i++) s->ffn_out[i] += s->o[i];
    }
    return 0;
}

int df_forward(const df_model *m, df_state *s, const int32_t *tokens, int n, int pos0, float *logits, int all) {
    const df_config *c = &m->cfg;
    const int H = c->hidden;
    if (n <= 0 || n > s->max_batch || pos0 < 0 || pos0 + n > s->max_ctx) return DF_EINPUT;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab) return DF_EINPUT;
    double t0 = df_now();
    s->err[0] = 0;
    if (m->ecache) df_ecache_set_token(m->ecache, pos0);
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
    for (int l = 0; l < c->n_layers; l++) {
        const df_layer *L = &m->layers[l];
        double a0 = df_now();
        for (int t = 0; t < n; t++) df_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, L->attn_norm, H, eps);
        if (c->family == DF_FAM_DEEPSEEK_V3) df_attn_mla(m, s, l, n, pos0);
        else df_attn_gqa(m, s, l, n, pos0);
        for (int64_t i = 0; i < (int64_t)n * H; i++) s->x[i] += s->o[i];
        double a1 = df_now();
        for (int t = 0; t < n; t++) df_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, L->ffn_norm, H, eps);
        if (L->moe) {
            int rc = moe(m, s, L, l, n);
            if (rc) return rc;
        } else {
            mlp(&L->mlp, s->xn, n, s->h1, s->h2, s->ffn_out);
        }
        for (int64_t i = 0; i < (int64_t)n * H; i++) s->x[i] += s->ffn_out[i];
        double a2 = df_now();
        s->t_attn += a1 - a0;
        s->t_ffn += a2 - a1;
    }
    double t2 = df_now();
    int first = all ? 0 : n - 1, cnt = all ? n : 1;
    for (int t = 0; t < cnt; t++) df_rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)(first + t) * H, m->final_norm, H, eps);
    df_matmul(&m->lm_head, s->xn, cnt, logits);
    s->t_other += df_now() - t2;
    return 0;
}
