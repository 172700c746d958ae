/* ffn.c - FFN kinds: a dense gated FFN, and a mixture of routed experts
 * (+ shared experts) whose weights come from a df_expert_source.
 *
 * MoE has one path whatever the tier: the router picks K experts per token,
 * the distinct experts of the batch are asked of the source (the model's own
 * memory, or the expert cache over files/packs), and each expert is computed
 * as the source hands it over. Every routed expert's output lands in its own
 * (token, k) row of de_all and the rows are summed in (token, k) order at the
 * end, so the result does not depend on the tier, on which experts were
 * cache hits or on the order in which reads arrived: resident and streamed
 * runs give the same bits. Every buffer is sized from the config at
 * df_state_init (no fixed limit on experts per token). */
#include "model/kinds.h"
#include "deltafin.h"
#include "util/util.h"

#include <stdlib.h>
#include <string.h>

/* The backend's gated activation of a layer's act kind, with its parameters. */
typedef struct { df_gate_kind k; float p0, p1; } gate_kind;
static gate_kind gate_of(const df_model *m, const df_layer *L) {
    switch (L->kind.act) {
    case DF_ACT_SITU_GLU: return (gate_kind){DF_GATE_SITU, (float)m->cfg.situ_beta, (float)m->cfg.situ_linear_beta};
    case DF_ACT_SILU_GLU:
    case DF_ACT_N: break;
    }
    return (gate_kind){DF_GATE_SILU, 0, 0};
}

/* out[n x rows of down] = down(act(gate x, up x)) */
static void glu(const df_glu *f, gate_kind gk, const df_act *x, int n, df_act *h1, df_act *h2, df_act *out) {
    const df_mv_job jobs[2] = {{&f->gate, x, h1}, {&f->up, x, h2}};
    df_matmul_batch(jobs, 2, n);
    df_gate(h1, h1, h2, (size_t)n * (size_t)f->gate.rows, gk.k, gk.p0, gk.p1);
    df_matmul(&f->down, h1, n, out);
}

int df_ffn_dense(const df_model *m, df_state *s, const df_layer *L, int n) {
    glu(&L->w.mlp, gate_of(m, L), s->xn, n, s->h1, s->h2, s->ffn_out);
    return 0;
}

/* The weights of expert e of layer l (template t) at the bytes parts[]
 * (data, then the scale sidecar where the format has one, for gate, up,
 * down), each tagged with its identity so a device backend can cache it. */
static void expert_view(const df_ffn *t, int l, int e, const uint8_t *const *parts, df_glu *out, int nan_check, int *notes) {
    out->gate = t->gate, out->up = t->up, out->down = t->down;
    df_weight *ws[3] = {&out->gate, &out->up, &out->down};
    const df_weight *tw[3] = {&t->gate, &t->up, &t->down};
    int p = 0;
    for (int w = 0; w < 3; w++) {
        const int dp = p;
        ws[w]->data = parts[p++];
        if (df_weight_scale_bytes(ws[w])) ws[w]->scale = parts[p++];
        ws[w]->ident = df_expert_ident(l, e, w);
        /* FP8 NaN codes (backend.h, nan_codes): a view of the template's own resident bytes takes the
         * template's answer (found on the expert's first use, kept in the model's template); a view of an
         * expert-cache slot, whose bytes change, takes the slot's word for that part (source.h, part_notes:
         * 0 = UNCHECKED at each load of the slot): the loaded bytes' first use runs the checking kernel, the
         * second scans them (backend.h, df_weight_nan_codes_memo), the answer is kept there until the slot
         * is loaded again; a source without words: the checking kernel */
        if (nan_check && tw[w]->data && ws[w]->data == tw[w]->data) ws[w]->nan_codes = df_weight_nan_codes(tw[w]);
        else df_weight_nan_codes_memo(ws[w], nan_check && notes ? &notes[dp] : NULL); /* at most one scan per load */
    }
}

typedef struct {
    const df_model *m;
    df_state *s;
    const df_layer *L;
    int l;          /* the layer's index */
    const int *ids; /* experts of this acquire */
    const df_act *xin; /* the routed experts' input [n x D]: the normed hidden state, or its latent projection */
    int D;          /* its width */
    int n;          /* tokens in the batch */
    int npend;      /* decode: experts handed over and not computed yet */
    df_expert_source *src; /* where the experts come from (part_notes) */
} moe_ctx;

/* Decode: the pending experts' gate/up products in one dispatch, their down
 * products in another (rows are computed the same way whatever the batch,
 * so the bits do not depend on how experts were grouped). */
static void flush_decode(moe_ctx *c) {
    if (!c->npend) return;
    df_state *s = c->s;
    const int D = c->D, I = c->m->cfg.moe_intermediate;
    const gate_kind gk = gate_of(c->m, c->L);
    df_mv_job *jobs = s->jobs; /* [2 x topk] */
    for (int j = 0; j < c->npend; j++) {
        jobs[2 * j] = (df_mv_job){&s->pend_f[j].gate, c->xin, DF_AT(s->ge, (size_t)j * I)};
        jobs[2 * j + 1] = (df_mv_job){&s->pend_f[j].up, c->xin, DF_AT(s->ue, (size_t)j * I)};
    }
    df_matmul_batch(jobs, 2 * c->npend, 1);
    df_gate(s->ge, s->ge, s->ue, (size_t)c->npend * I, gk.k, gk.p0, gk.p1);
    for (int j = 0; j < c->npend; j++) jobs[j] = (df_mv_job){&s->pend_f[j].down, DF_AT(s->ge, (size_t)j * I), DF_AT(s->de_all, (size_t)s->pend_k[j] * D)};
    df_matmul_batch(jobs, c->npend, 1);
    c->npend = 0;
}

/* Called by the source as each expert is ready: computes its output rows of de_all. */
static void expert_ready(void *p, int i, const uint8_t *const *parts) {
    moe_ctx *c = p;
    df_state *s = c->s;
    if (i < 0) { /* the source is about to wait, or is done: compute what is batched */
        if (c->n == 1) flush_decode(c);
        return;
    }
    const int D = c->D, K = c->m->cfg.n_experts_used, e = c->ids[i];
    df_glu f;
    /* slot words only for decode on the CPU backend: the scan serves the host decode kernels (dot_rows); a
     * prefill's products do not look at nan_codes (and its experts are mostly fresh loads), a device backend's
     * kernels neither: they leave the words for the next host decode use */
    const int host_decode = c->n == 1 && (df_be == &df_backend_cpu || df_be == &df_backend_cpu_scalar);
    int *notes = host_decode && c->src->ops->part_notes ? c->src->ops->part_notes(c->src, c->l, e) : NULL;
    expert_view(&c->L->experts[e], c->l, e, parts, &f, 1, notes);
    if (c->n == 1) { /* decode: slot k of the one token, batched until the next flush */
        int k = 0;
        while (s->sel[k] != e) k++;
        s->pend_k[c->npend] = k;
        s->pend_f[c->npend++] = f;
        return;
    }
    /* prefill: the tokens routed to e, gathered, through the expert, scattered to their (token, k) rows */
    int cnt = 0;
    for (int t = 0; t < c->n; t++)
        for (int k = 0; k < K; k++)
            if (s->sel[t * K + k] == e) s->tok_list[cnt] = t * K + k, s->tok_src[cnt++] = t;
    df_gather(s->xe, c->xin, s->tok_src, cnt, D);
    glu(&f, gate_of(c->m, c->L), s->xe, cnt, s->ge, s->ue, s->de);
    df_scatter(s->de_all, s->tok_list, s->de, cnt, D);
}

/* Router lookahead: the next MoE layer's router applied to the current
 * residual predicts its experts, so a source can start reading them while
 * this layer computes. Prediction only warms the source: that layer still
 * routes on its own input. Returns the next MoE layer, or -1. */
static int predict_next(const df_model *m, df_state *s, int l) {
    const df_config *c = &m->cfg;
    int nl = l + 1;
    while (nl < c->n_layers && m->layers[nl].kind.ffn != DF_FFN_MOE) nl++;
    if (nl >= c->n_layers) return -1;
    const df_layer *N = &m->layers[nl];
    df_rmsnorm_rows(s->xp, c->hidden, s->x, c->hidden, N->ffn_norm, 1, c->hidden, (float)c->rms_eps);
    df_matmul(&N->w.router, s->xp, 1, s->plog);
    df_router_of(N->kind.router)(m, N, s->plog, 1, s->pred, NULL);
    return nl;
}

/* Decode of a layer whose experts are all resident on a device that routes
 * (backend.h, moe_fused): the router, the experts and the combine run there
 * with nothing read back, so the host does not wait for the device. 1: the
 * backend declined (the host-routed path runs), 0, or a DF_E* code. */
static int moe_fused(const df_model *m, df_state *s, const df_layer *L, int l, const df_act *xin, df_act *out, int D) {
    const df_config *c = &m->cfg;
    const gate_kind gk = gate_of(m, L);
    df_moe_fused_args a = {.layer = l, .x = xin, .out = out, .g = s->ge, .u = s->ue, .d = s->de_all, .D = D,
                           .I = c->moe_intermediate, .gate = gk.k, .p0 = gk.p0, .p1 = gk.p1};
    a.route = df_route_args_of(m, L, s->router_logits, 1, NULL, s->selw);
    return df_moe_fused(&a);
}

/* Every routed expert of layer l (the model's own memory) handed to the backend to bring into its device
 * expert cache (moe_preload), so the layer can become resident before each expert has been routed to once. */
static int moe_preload(const df_model *m, const df_layer *L, int l) {
    const int E = m->cfg.n_experts;
    df_weight *w = malloc((size_t)3 * E * sizeof *w);
    if (!w) return DF_ENOMEM; /* the layer keeps the host-routed path */
    for (int e = 0; e < E; e++) {
        const df_ffn *f = &L->experts[e];
        const df_weight *ws[3] = {&f->gate, &f->up, &f->down};
        const uint8_t *parts[DF_EXPERT_PARTS];
        int p = 0;
        for (int k = 0; k < 3; k++) {
            parts[p++] = ws[k]->data;
            if (df_weight_scale_bytes(ws[k])) parts[p++] = ws[k]->scale;
        }
        df_glu g;
        expert_view(f, l, e, parts, &g, 0, NULL); /* for a device: no host scan */
        w[3 * e] = g.gate, w[3 * e + 1] = g.up, w[3 * e + 2] = g.down;
    }
    int rc = df_moe_preload(w, 3 * E);
    df_experts_done();
    free(w);
    return rc;
}

int df_ffn_moe(const df_model *m, df_state *s, const df_layer *L, int l, int n) {
    const df_config *c = &m->cfg;
    const int H = c->hidden, E = c->n_experts, K = c->n_experts_used;
    if (s->exact == 2 && n > 1) {
        /* a verify pass on a backend whose one-token MoE has bits of its own (backend.h: exact_products 2): each
         * position through this function as a plain step's (router, experts, combine, shared experts), its rows of
         * xn and ffn_out viewed as a batch of one; the other scratch is per call */
        df_act *xn = s->xn, *fo = s->ffn_out;
        int rc = 0;
        for (int t = 0; t < n && !rc; t++) {
            s->xn = DF_AT(xn, (size_t)t * H), s->ffn_out = DF_AT(fo, (size_t)t * H);
            rc = df_ffn_moe(m, s, L, l, 1);
        }
        s->xn = xn, s->ffn_out = fo;
        return rc;
    }
    df_matmul(&L->w.router, s->xn, n, s->router_logits);
    df_expert_source *src = s->src ? s->src : m->resident_src;
    /* latent MoE: the routed experts work on the latent projection of the input */
    const int D = L->kind.latent ? c->latent_dim : H;
    df_act *comb = L->kind.latent ? s->lat : s->ffn_out; /* where the combine goes */
    int fused = 1;
    if (n == 1 && src == m->resident_src && df_moe_resident(l, E, K, n) == 1) {
        if (L->kind.latent) df_matmul(&L->w.lat_down, s->xn, n, s->lat);
        fused = moe_fused(m, s, L, l, L->kind.latent ? s->lat : s->xn, comb, D);
        if (fused < 0) return df_err(s->err, sizeof s->err, fused, "layer %d: the device-routed MoE failed (the backend said why on stderr)", l);
    }
    if (fused) { /* the host-routed path */
        df_router_of(L->kind.router)(m, L, s->router_logits, n, s->sel, s->selw);
        /* the distinct experts of this batch, in index order */
        unsigned char *seen = s->seen;
        memset(seen, 0, (size_t)E);
        for (int i = 0; i < n * K; i++) seen[s->sel[i]] = 1;
        int ne = 0;
        for (int e = 0; e < E; e++)
            if (seen[e]) s->exp_list[ne++] = e;
        int pf_l = n == 1 && src->ops->wants_prediction(src) ? predict_next(m, s, l) : -1;
        if (L->kind.latent) df_matmul(&L->w.lat_down, s->xn, n, s->lat);
        moe_ctx mc = {.m = m, .s = s, .L = L, .l = l, .n = n, .xin = L->kind.latent ? s->lat : s->xn, .D = D, .src = src};
        const int wave = src->ops->capacity(src);
        if (wave <= 0) return df_err(s->err, sizeof s->err, DF_EINTERNAL, "layer %d: the expert source holds no experts", l);
        for (int w0 = 0; w0 < ne; w0 += wave) {
            int cnt = ne - w0 < wave ? ne - w0 : wave;
            mc.ids = s->exp_list + w0;
            int rc = src->ops->acquire(src, l, mc.ids, cnt, pf_l, s->pred, w0 == 0 && pf_l >= 0 ? K : 0, expert_ready, &mc, s->err, sizeof s->err);
            df_experts_done(); /* a device backend's expert cache may reuse these experts' slots from here on */
            src->ops->release(src);
            if (rc) return rc;
        }
        df_moe_combine(comb, s->de_all, s->selw, n, K, D);
        /* the first pass over a layer whose experts all fit the device's cache brings them in (prefill pays
         * the copy once, and the decode steps after it run device-routed) */
        if (src == m->resident_src && df_moe_resident(l, E, K, n) == 2) (void)moe_preload(m, L, l); /* a failure leaves the host-routed path */
    }
    if (L->kind.latent) { /* the sum in the latent width: norm, project back (the latent input is consumed) */
        if (L->lat_norm) df_rmsnorm_rows(s->lat, D, s->lat, D, L->lat_norm, n, D, (float)c->rms_eps);
        df_matmul(&L->w.lat_up, s->lat, n, s->ffn_out);
    }
    if (L->has_shared) {
        glu(&L->w.shared, gate_of(m, L), s->xn, n, s->h1, s->h2, s->o);
        df_add(s->ffn_out, s->o, (size_t)n * H);
    }
    return 0;
}
