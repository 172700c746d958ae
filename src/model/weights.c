/* weights.c - the one iterator over a model's spine weights, and the
 * model's routed experts seen from outside: where each one is (for an
 * expert cache) and the resident expert source (experts served from the
 * model's own memory, through the same df_expert_source interface as the
 * streamed tiers, so the MoE code has one path). */
#include "model/model.h"
#include "util/util.h"

#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

void df_model_foreach_weight(df_model *m, df_weight_fn fn, void *ctx) {
    if (m->embed.data) fn(ctx, &m->embed);
    if (m->lm_head.data && m->lm_head.data != m->embed.data) fn(ctx, &m->lm_head);
    for (int l = 0; l < m->cfg.n_layers && m->layers; l++) {
        /* df_layer_weights holds only df_weight members (model.h), walked as an array */
        df_weight *w = (df_weight *)&m->layers[l].w;
        for (int i = 0; i < DF_LAYER_NW; i++)
            if (w[i].data) fn(ctx, &w[i]);
    }
}

/* ---- registration with the backend -------------------------------------- */
typedef struct { int rc; const df_weight *last; } reg_ctx;
static void reg_one(void *p, df_weight *w) {
    reg_ctx *c = p;
    if (!c->rc && w != c->last) c->rc = df_weight_register(w);
}
static void unreg_one(void *p, df_weight *w) { (void)p; df_weight_unregister(w); }

int df_model_backend_attach(df_model *m, char *err, size_t errlen) {
    /* an untied embedding last: no product reads it (a device backend holds it only to gather the next token's row,
     * backend.h embed_token), so under a device memory budget the weights the products read get the room first */
    reg_ctx c = {0, m->embed.data && m->embed.data != m->lm_head.data ? &m->embed : NULL};
    df_model_foreach_weight(m, reg_one, &c);
    if (c.last && !c.rc) c.rc = df_weight_register(&m->embed);
    if (c.rc) return df_err(err, errlen, c.rc, "%s: the %s backend cannot hold the model's weights", m->dir, df_be->name);
    const size_t H = (size_t)m->cfg.hidden, hd = (size_t)m->cfg.head_dim, kc = (size_t)m->cfg.kda_heads * (size_t)m->cfg.kda_head_dim;
    int rc = df_param_register(m->final_norm, H);
    if (m->out_res_norm && !rc) rc = df_param_register(m->out_res_norm, H);
    if (m->out_res_proj && !rc) rc = df_param_register(m->out_res_proj, H);
    if (m->inv_freq && !rc) rc = df_param_register(m->inv_freq, (size_t)m->cfg.rope_dim / 2);
    for (int l = 0; l < m->cfg.n_layers && !rc; l++) {
        const df_layer *L = &m->layers[l];
        const struct { const float *p; size_t n; } ps[] = {
            {L->attn_norm, H}, {L->ffn_norm, H}, {L->bq, (size_t)L->w.wq.rows}, {L->bk, (size_t)L->w.wk.rows},
            {L->bv, (size_t)L->w.wv.rows}, {L->bo, H}, {L->q_norm, hd}, {L->k_norm, hd},
            {L->q_a_norm, (size_t)m->cfg.q_lora_rank}, {L->kv_a_norm, (size_t)m->cfg.kv_lora_rank},
            {L->router_bias, (size_t)m->cfg.n_experts},
            {L->conv[0], kc * (size_t)m->cfg.kda_conv}, {L->conv[1], kc * (size_t)m->cfg.kda_conv}, {L->conv[2], kc * (size_t)m->cfg.kda_conv},
            {L->A_log, (size_t)m->cfg.kda_heads}, {L->dt_bias, kc}, {L->o_norm, (size_t)m->cfg.kda_head_dim},
            {L->lat_norm, (size_t)m->cfg.latent_dim}, {L->res_norm[0], H}, {L->res_proj[0], H}, {L->res_norm[1], H}, {L->res_proj[1], H}};
        for (size_t i = 0; i < sizeof ps / sizeof *ps && !rc; i++)
            if (ps[i].p) rc = df_param_register(ps[i].p, ps[i].n);
    }
    if (rc) return df_err(err, errlen, rc, "%s: the %s backend cannot hold the model's parameters", m->dir, df_be->name);
    df_tier_stats ts;
    if (!df_tier_stats_get(&ts) && ts.spine_host_weights)
        fprintf(stderr, "deltafin: %s backend: %d spine weights (%.1f MB) do not fit the VRAM budget (%.1f MB, part kept for activations and state) "
                        "and stay in host memory, copied to the device for each product (slower; raise --gpu-memory)\n",
                df_be->name, ts.spine_host_weights, ts.spine_host_bytes / 1e6, ts.budget / 1e6);
    return 0;
}

void df_model_backend_detach(df_model *m) { df_model_foreach_weight(m, unreg_one, NULL); }

df_expert_loc *df_model_expert_locs(const df_model *m) {
    const df_config *c = &m->cfg;
    df_expert_loc *loc = df_xcalloc((size_t)c->n_layers * (size_t)(c->n_experts ? c->n_experts : 1), sizeof *loc);
    for (int l = 0; l < c->n_layers; l++)
        if (m->layers[l].kind.ffn == DF_FFN_MOE)
            for (int e = 0; e < c->n_experts; e++) loc[(size_t)l * c->n_experts + e] = m->layers[l].experts[e].loc;
    return loc;
}

int64_t df_model_expert_bytes(const df_model *m) {
    int64_t b = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->layers[l].kind.ffn == DF_FFN_MOE)
            for (int e = 0; e < m->cfg.n_experts; e++) {
                const df_ffn *f = &m->layers[l].experts[e];
                b += df_weight_bytes(&f->gate) + df_weight_bytes(&f->up) + df_weight_bytes(&f->down);
            }
    return b;
}

/* ---- the resident expert source ---------------------------------------- */
typedef struct {
    df_expert_source base;
    const df_model *m;
} resident_src;

static int res_acquire(df_expert_source *s, int l, const int *ids, int k, int pf_l, const int *pf_ids, int pf_k,
                       df_expert_ready_fn ready, void *ctx, char *err, size_t errlen) {
    (void)pf_l, (void)pf_ids, (void)pf_k, (void)err, (void)errlen;
    const df_model *m = ((resident_src *)s)->m;
    for (int i = 0; i < k; i++) {
        const df_ffn *f = &m->layers[l].experts[ids[i]];
        const df_weight *ws[3] = {&f->gate, &f->up, &f->down};
        const uint8_t *parts[DF_EXPERT_PARTS];
        int p = 0;
        for (int w = 0; w < 3; w++) {
            parts[p++] = ws[w]->data;
            if (df_weight_scale_bytes(ws[w])) parts[p++] = ws[w]->scale;
        }
        ready(ctx, i, parts);
    }
    ready(ctx, -1, NULL);
    return 0;
}
static void res_release(df_expert_source *s) { (void)s; }
static int res_capacity(const df_expert_source *s) { (void)s; return INT_MAX; }
static int res_wants_prediction(const df_expert_source *s) { (void)s; return 0; }
static void res_set_token(df_expert_source *s, int64_t pos) { (void)s, (void)pos; }

static const df_expert_source_ops resident_ops = {res_acquire, res_release, res_capacity, res_wants_prediction, res_set_token,
                                                   NULL /* part_notes: ffn.c uses the model's own weights' nan_codes */};

df_expert_source *df_model_resident_source(const df_model *m) {
    resident_src *r = df_xcalloc(1, sizeof *r);
    r->base.ops = &resident_ops;
    r->m = m;
    return &r->base;
}

void df_model_store_layout(const df_config *c, char *fmt, size_t n, df_store_layout *out) {
    memset(out, 0, sizeof *out);
    out->n_layers = c->n_layers, out->n_experts = c->n_experts;
    if (c->family == DF_FAM_KIMI_LINEAR) { /* Moonshot's names: block_sparse_moe.experts.E.{w1,w3,w2} */
        snprintf(fmt, n, "%smodel.layers.%%d.block_sparse_moe.experts.%%d", c->tensor_prefix);
        out->expert_fmt = fmt;
        out->proj[0] = "w1", out->proj[1] = "w3", out->proj[2] = "w2";
    }
}
