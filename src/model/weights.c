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

static const df_expert_source_ops resident_ops = {res_acquire, res_release, res_capacity, res_wants_prediction, res_set_token};

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
