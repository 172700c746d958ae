/* dec_cpu_parity.c - the persistent decode kernel (bench/cuda/dec_kernel.cuh), run on the CPU by its emulation
 * (bench/cuda/dec_emu.cc: every GPU thread a fiber), against deltafin's CPU backend on a real checkpoint
 * (tests/tools/make_dec_ckpt.py: a Qwen3-MoE safetensors file with the published names, in the kernel's shapes).
 *
 * The kernel is handed exactly what the model and the CPU backend hold: the mapped BF16 tensors of each layer (q, k, v,
 * o, the router; each routed expert's gate/up/down through a table of pointers), the f32 norm gains, the session's K/V
 * cache as gqa.c writes it, the backend's RoPE table of the position, config.json's epsilon and the model's softmax
 * scale. A prompt is prefilled by the CPU backend; then, for each of a few greedy positions, the kernel runs the
 * layers on the token's embedding row (the persistent kernel, the same kernel with its rows in a shared-memory ring,
 * and at the first position the launch arm, which must give the same bits), then the CPU backend's own forward of
 * that position. Checks per position: what the layers added to h (rel L2 < 1e-4), the logits of the kernel's h (the
 * final norm and the lm_head in double on the host) against the CPU forward's (rel L2 < 1e-4, the same argmax), the
 * last layer's experts in order against the CPU route's, and a deliberately wrong input (the cache read one position
 * short) must fail the same checks, so the check can fail.
 *
 * Usage: dec_cpu_parity CHECKPOINT_DIR [prompt positions (40)] [decode positions (3)]. Exit 0: every check passed. */
#include "deltafin.h"
#include "backend/backend.h"
#include "model/model.h"
#include "backend/cuda/dec_layers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int arg_int(int argc, char **argv, int i, int def, const char *what) {
    if (argc <= i) return def;
    char *end = NULL;
    const long v = strtol(argv[i], &end, 10);
    if (!*argv[i] || *end || v < 0 || v > 100000) {
        fprintf(stderr, "dec_cpu_parity: argument %d (%s) must be an integer 0..100000, got \"%s\"\n", i, what, argv[i]);
        exit(2);
    }
    return (int)v;
}

/* the kernel's shapes against the model's: a field that differs is named with both values */
static int fits(const df_model *m) {
    const df_config *c = &m->cfg;
    int ok = 1;
#define NEED(cond, field, want, got)                                                                                     \
    if (!(cond)) fprintf(stderr, "dec_cpu_parity: %s: the kernel is built for %d, the model has %d\n", field, (int)(want), (int)(got)), ok = 0
    NEED(c->family == DF_FAM_QWEN3_MOE, "family (qwen3_moe)", DF_FAM_QWEN3_MOE, c->family);
    NEED(c->hidden == H, "hidden_size", H, c->hidden);
    NEED(c->n_heads == NQ, "num_attention_heads", NQ, c->n_heads);
    NEED(c->n_kv_heads == NKV, "num_key_value_heads", NKV, c->n_kv_heads);
    NEED(c->head_dim == HD_, "head_dim", HD_, c->head_dim);
    NEED(c->rope_dim == HD_, "rotary dims", HD_, c->rope_dim);
    NEED(c->n_experts == NE, "num_experts", NE, c->n_experts);
    NEED(c->n_experts_used == TOPK, "num_experts_per_tok", TOPK, c->n_experts_used);
    NEED(c->moe_intermediate == IE, "moe_intermediate_size", IE, c->moe_intermediate);
    NEED(c->norm_topk_prob, "norm_topk_prob", 1, c->norm_topk_prob);
    NEED(!m->rope_adjacent, "rope pairs adjacent", 0, m->rope_adjacent);
    for (int l = 0; l < c->n_layers && ok; l++) {
        const df_layer *L = &m->layers[l];
        NEED(L->kind.mixer == DF_MIXER_GQA && L->q_norm && L->k_norm && !L->bq && !L->bk && !L->bv && !L->bo, "layer kind (GQA, q/k norms, no biases)", 1, 0);
        NEED(L->kind.ffn == DF_FFN_MOE && L->kind.router == DF_ROUTER_SOFTMAX_TOPK && L->kind.act == DF_ACT_SILU_GLU && !L->has_shared,
             "layer kind (softmax-routed SiLU MoE, no shared expert)", 1, 0);
        NEED(L->kind.resid == DF_RESID_PLAIN, "residual kind (plain)", DF_RESID_PLAIN, L->kind.resid);
        const df_weight *ws[5] = {&L->w.wq, &L->w.wk, &L->w.wv, &L->w.wo, &L->w.router};
        for (int i = 0; i < 5; i++) NEED(ws[i]->fmt == DF_W_BF16 && ws[i]->data, "spine weight format (BF16, resident)", DF_W_BF16, ws[i]->fmt);
        for (int e = 0; e < NE; e++)
            NEED(L->experts[e].gate.fmt == DF_W_BF16 && L->experts[e].gate.data && L->experts[e].up.data && L->experts[e].down.data,
                 "routed expert (BF16, resident)", DF_W_BF16, L->experts[e].gate.fmt);
    }
#undef NEED
    return ok;
}

static double rel_l2(const double *a, const double *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += (a[i] - ref[i]) * (a[i] - ref[i]), den += ref[i] * ref[i];
    return sqrt(num / (den > 0 ? den : 1));
}
static float bf(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* the logits of h: final RMSNorm (config eps) and the lm_head, in double */
static void logits_of(const df_model *m, const float *h, double *out) {
    const int V = m->cfg.vocab;
    double ss = 0, x[H];
    for (int i = 0; i < H; i++) ss += (double)h[i] * h[i];
    const double inv = 1.0 / sqrt(ss / H + m->cfg.rms_eps);
    for (int i = 0; i < H; i++) x[i] = m->final_norm[i] * (h[i] * inv);
    for (int v = 0; v < V; v++) {
        const uint16_t *row = (const uint16_t *)(const void *)(m->lm_head.data + (size_t)v * m->lm_head.row_bytes);
        double s = 0;
        for (int i = 0; i < H; i++) s += bf(row[i]) * x[i];
        out[v] = s;
    }
}
static int argmax_d(const double *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}
/* ---- the model's own forward through a backend whose decode_layers is the emulated kernel -------------------------
 * The CPU backend's ops plus decode_layers (backend.h) built as a device backend would: the layer table from the
 * df_decode_layer run forward.c hands over (weights' bytes, registered params, the session's cache) and the routed
 * experts of each layer's index; so model/forward.c's decode_layers path (the run's arguments, the layers skipped,
 * the final norm after it) is checked against the op-by-op path too. */
static const df_model *g_model;
static const uint16_t **g_etab; /* [layer][3 NE] */
static int g_dec_calls;
static int emu_decode_layers(const df_decode_layers_args *a) {
    if (!a) return 0; /* on */
    if (a->hidden != H || a->n_heads != NQ || a->n_kv_heads != NKV || a->head_dim != HD_ || a->n_experts != NE || a->k != TOPK || a->moe_inter != IE)
        return 1;
    dec_layer *tab = calloc((size_t)a->n_layers, sizeof *tab);
    if (!tab) return DF_ENOMEM;
    for (int l = 0; l < a->n_layers; l++) {
        const df_decode_layer *L = &a->layers[l];
        dec_layer *d = &tab[l];
        d->wq = (const uint16_t *)(const void *)L->wq->data, d->wk = (const uint16_t *)(const void *)L->wk->data;
        d->wv = (const uint16_t *)(const void *)L->wv->data, d->wo = (const uint16_t *)(const void *)L->wo->data;
        d->wr = (const uint16_t *)(const void *)L->router->data;
        d->etab = (const uint8_t *)(const void *)(g_etab + (size_t)L->layer * 3 * NE), d->estride = (int)sizeof *g_etab;
        d->n1 = L->attn_norm, d->n2 = L->ffn_norm, d->qn = L->q_norm, d->kn = L->k_norm, d->kv = (float *)(void *)L->cache;
    }
    const dec_run_args r = {tab, a->n_layers, a->pos, (const float *)(const void *)a->rope_cs, a->eps, a->scale, (float *)(void *)a->h, NULL, 1, 20};
    const int rc = dec_emu_run(&r);
    free(tab);
    g_dec_calls++;
    return rc ? DF_EINTERNAL : 0;
}

static int argmax_f(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: dec_cpu_parity CHECKPOINT_DIR [prompt positions (40)] [decode positions (3)]\n"), 2;
    const int P = arg_int(argc, argv, 2, 40, "prompt positions"), T = arg_int(argc, argv, 3, 3, "decode positions");
    if (P < 1 || T < 1) return fprintf(stderr, "dec_cpu_parity: at least one prompt and one decode position\n"), 2;
    char err[512];
    if (df_backend_select("cpu")) return fprintf(stderr, "dec_cpu_parity: no cpu backend\n"), 1;
    df_backend_init(0);
    df_load_opts lo = {.mode = 0};
    df_model *m = NULL;
    if (df_model_load(argv[1], &lo, &m, err, sizeof err)) return fprintf(stderr, "dec_cpu_parity: %s: %s\n", argv[1], err), 1;
    if (df_model_backend_attach(m, err, sizeof err)) return fprintf(stderr, "dec_cpu_parity: %s\n", err), 1;
    if (!fits(m)) return fprintf(stderr, "dec_cpu_parity: %s does not have the kernel's shapes (bench/cuda/dec_layers.h)\n", argv[1]), 1;
    const df_config *c = &m->cfg;
    const int NL = c->n_layers, V = c->vocab;
    df_state s;
    if (df_state_init(m, P + T + 1, P, 1, &s, err, sizeof err)) return fprintf(stderr, "dec_cpu_parity: %s\n", err), 1;
    s.src = m->resident_src;

    /* the layer table: the model's own memory, the session's caches */
    dec_layer *tab = calloc((size_t)NL, sizeof *tab);
    const uint16_t **etab = calloc((size_t)NL * 3 * NE, sizeof *etab);
    for (int l = 0; l < NL; l++) {
        const df_layer *L = &m->layers[l];
        dec_layer *d = &tab[l];
        d->wq = (const uint16_t *)(const void *)L->w.wq.data, d->wk = (const uint16_t *)(const void *)L->w.wk.data;
        d->wv = (const uint16_t *)(const void *)L->w.wv.data, d->wo = (const uint16_t *)(const void *)L->w.wo.data;
        d->wr = (const uint16_t *)(const void *)L->w.router.data;
        const uint16_t **et = etab + (size_t)l * 3 * NE;
        for (int e = 0; e < NE; e++) {
            et[3 * e] = (const uint16_t *)(const void *)L->experts[e].gate.data;
            et[3 * e + 1] = (const uint16_t *)(const void *)L->experts[e].up.data;
            et[3 * e + 2] = (const uint16_t *)(const void *)L->experts[e].down.data;
        }
        d->etab = (const uint8_t *)(const void *)et, d->estride = (int)sizeof *et;
        d->n1 = L->attn_norm, d->n2 = L->ffn_norm, d->qn = L->q_norm, d->kn = L->k_norm;
        d->kv = (float *)(void *)s.ls[l].cache; /* the CPU backend's memory is the host's */
    }

    /* the prompt, prefilled by the CPU backend */
    int32_t *ids = malloc((size_t)P * sizeof *ids);
    uint32_t r = 12345;
    for (int i = 0; i < P; i++) r = r * 1103515245u + 12345u, ids[i] = (int32_t)((r >> 8) % (uint32_t)V);
    float *lg = malloc((size_t)V * sizeof *lg);
    if (df_forward(m, &s, ids, P, 0, lg, 0)) return fprintf(stderr, "dec_cpu_parity: the prompt's forward failed: %s\n", s.err), 1;

    static float h0[H], hk[H], hs[H], hl[H], href[H];
    static double dh0[H], dk[H], dref[H];
    double *lk = malloc((size_t)V * sizeof *lk), *lr = malloc((size_t)V * sizeof *lr);
    int *kids = malloc((size_t)NL * TOPK * sizeof *kids), *lids = malloc((size_t)NL * TOPK * sizeof *lids);
    int ok = 1;
    for (int t = 0; t < T; t++) {
        const int pos = P + t, tok = argmax_f(lg, V);
        if (df_model_embed_row(m, tok, h0, err, sizeof err)) return fprintf(stderr, "dec_cpu_parity: %s\n", err), 1;
        df_rope_table(s.rope_cs, pos, 1, m->inv_freq, c->rope_dim / 2, m->rope_scale);
        dec_run_args a = {tab, NL, pos, (const float *)(const void *)s.rope_cs, (float)c->rms_eps, m->attn_scale, hk, kids, 1, 20};
        memcpy(hk, h0, sizeof hk);
        int rc = dec_emu_run(&a);
        memcpy(hs, h0, sizeof hs); /* the same kernel with its rows in the shared-memory ring */
        a.h = hs, a.ids = NULL, a.persistent = 2, a.blocks = 13;
        rc |= dec_emu_run(&a);
        int launch_bits = -1;
        if (t == 0) { /* the launch arm: a kernel an op, 36 blocks a wave */
            memcpy(hl, h0, sizeof hl);
            a.h = hl, a.ids = lids, a.persistent = 0, a.blocks = 36;
            rc |= dec_emu_run(&a);
            launch_bits = !memcmp(hl, hk, sizeof hk) && !memcmp(lids, kids, (size_t)NL * TOPK * sizeof *kids);
        }
        /* the CPU backend's own forward of the position (it rewrites the cache row the kernel wrote) */
        if (df_forward(m, &s, &tok, 1, pos, lg, 0)) return fprintf(stderr, "dec_cpu_parity: the forward of position %d failed: %s\n", pos, s.err), 1;
        df_read(href, s.x, H); /* the residual stream after the last layer (before the final norm) */
        for (int i = 0; i < H; i++) dh0[i] = h0[i], dk[i] = (double)hk[i] - h0[i], dref[i] = (double)href[i] - h0[i];
        const double eh = rel_l2(dk, dref, H);
        logits_of(m, hk, lk);
        for (int v = 0; v < V; v++) lr[v] = lg[v];
        const double el = rel_l2(lk, lr, V);
        const int ak = argmax_d(lk, V), ar = argmax_f(lg, V);
        int same_ids = 1;
        for (int k = 0; k < TOPK; k++) same_ids &= kids[(NL - 1) * TOPK + k] == s.sel[k];
        const int ring_bits = !memcmp(hs, hk, sizeof hk);
        const int good = !rc && eh < 1e-4 && el < 1e-4 && ak == ar && same_ids && ring_bits && launch_bits != 0;
        printf("position %d (token %d), %d layers: what the layers added rel L2 %.3g, logits rel L2 %.3g, argmax %d (CPU %d), the last layer's experts %s, "
               "the smem ring %s%s  %s\n",
               pos, tok, NL, eh, el, ak, ar, same_ids ? "equal" : "DIFFER", ring_bits ? "bit-equal" : "DIFFERS",
               launch_bits < 0 ? "" : launch_bits ? ", the launch arm bit-equal" : ", the launch arm DIFFERS", good ? "ok" : "FAILED");
        if (!same_ids) {
            printf("  kernel:");
            for (int k = 0; k < TOPK; k++) printf(" %d", kids[(NL - 1) * TOPK + k]);
            printf("  CPU:");
            for (int k = 0; k < TOPK; k++) printf(" %d", s.sel[k]);
            printf("\n");
        }
        ok &= good;
    }
    { /* the check can fail: the kernel told the position is one less (it reads one cached row short and writes over it) */
        const int pos = P + T;
        const int tok = argmax_f(lg, V);
        if (df_model_embed_row(m, tok, h0, err, sizeof err)) return fprintf(stderr, "dec_cpu_parity: %s\n", err), 1;
        df_rope_table(s.rope_cs, pos, 1, m->inv_freq, c->rope_dim / 2, m->rope_scale);
        memcpy(hk, h0, sizeof hk);
        dec_run_args a = {tab, NL, pos - 1, (const float *)(const void *)s.rope_cs, (float)c->rms_eps, m->attn_scale, hk, kids, 1, 20};
        const int rc = dec_emu_run(&a);
        if (df_forward(m, &s, &tok, 1, pos, lg, 0)) return fprintf(stderr, "dec_cpu_parity: the forward of position %d failed: %s\n", pos, s.err), 1;
        df_read(href, s.x, H);
        for (int i = 0; i < H; i++) dk[i] = (double)hk[i] - h0[i], dref[i] = (double)href[i] - h0[i];
        const double eh = rel_l2(dk, dref, H);
        const int caught = rc || eh >= 1e-4;
        printf("a wrong input (position %d run as %d): what the layers added rel L2 %.3g  %s\n", pos, pos - 1, eh, caught ? "caught (ok)" : "NOT CAUGHT");
        ok &= caught;
    }
    (void)dh0;
    { /* the model's forward through the CPU ops + the emulated decode_layers: the same prompt, then the same tokens as
       * one-token steps, against the CPU forward's logits of those steps (kept below) */
        df_state s2, s3;
        static df_backend_ops emu;
        emu = df_backend_cpu, emu.name = "cpu+dec-emu", emu.decode_layers = emu_decode_layers;
        g_model = m, g_etab = etab;
        int32_t *toks = malloc((size_t)T * sizeof *toks);
        float *lref = malloc((size_t)T * V * sizeof *lref), *lemu = malloc((size_t)T * V * sizeof *lemu);
        /* the reference: the CPU forward over the prompt, then T greedy steps */
        if (df_state_init(m, P + T + 1, P, 1, &s3, err, sizeof err)) return fprintf(stderr, "dec_cpu_parity: %s\n", err), 1;
        s3.src = m->resident_src;
        if (df_forward(m, &s3, ids, P, 0, lg, 0)) return fprintf(stderr, "dec_cpu_parity: %s\n", s3.err), 1;
        for (int t = 0; t < T; t++) {
            toks[t] = argmax_f(lg, V);
            if (df_forward(m, &s3, &toks[t], 1, P + t, lg, 0)) return fprintf(stderr, "dec_cpu_parity: %s\n", s3.err), 1;
            memcpy(lref + (size_t)t * V, lg, (size_t)V * sizeof *lg);
        }
        df_be = &emu;
        if (df_state_init(m, P + T + 1, P, 1, &s2, err, sizeof err)) return fprintf(stderr, "dec_cpu_parity: %s\n", err), 1;
        s2.src = m->resident_src;
        int fwd_ok = !df_forward(m, &s2, ids, P, 0, lg, 0);
        const int calls0 = g_dec_calls;
        for (int t = 0; t < T && fwd_ok; t++) fwd_ok = !df_forward(m, &s2, &toks[t], 1, P + t, lemu + (size_t)t * V, 0);
        df_be = &df_backend_cpu;
        double worst = 0;
        int same = 1;
        for (int t = 0; t < T; t++) {
            double num = 0, den = 0;
            for (int v = 0; v < V; v++) {
                const double d = (double)lemu[(size_t)t * V + v] - lref[(size_t)t * V + v];
                num += d * d, den += (double)lref[(size_t)t * V + v] * lref[(size_t)t * V + v];
            }
            const double e = sqrt(num / (den > 0 ? den : 1));
            worst = e > worst ? e : worst;
            same &= argmax_f(lemu + (size_t)t * V, V) == argmax_f(lref + (size_t)t * V, V);
        }
        const int calls = g_dec_calls - calls0, good = fwd_ok && calls == T && worst < 1e-4 && same;
        printf("the model's forward with decode_layers (the emulated kernel) for %d steps: %d calls, logits rel L2 at most %.3g against the CPU "
               "forward's, argmax %s  %s\n",
               T, calls, worst, same ? "equal" : "DIFFERS", good ? "ok" : "FAILED");
        ok &= good;
        /* a speculative verify pass over the same tokens (exact: every row the bits of a plain step) on this backend:
         * forward.c runs its positions as plain steps through decode_layers, so its rows are those steps' bits */
        if (T > 1) {
            df_state s4;
            float *lver = malloc((size_t)T * V * sizeof *lver);
            df_be = &emu;
            if (df_state_init(m, P + T + 1, P, T, &s4, err, sizeof err)) return fprintf(stderr, "dec_cpu_parity: %s\n", err), 1;
            s4.src = m->resident_src;
            int vok = !df_forward(m, &s4, ids, P, 0, lg, 0);
            const int c0 = g_dec_calls;
            s4.exact = 2;
            vok = vok && !df_forward(m, &s4, toks, T, P, lver, 1);
            s4.exact = 0;
            df_be = &df_backend_cpu;
            const int vcalls = g_dec_calls - c0, bits = vok && !memcmp(lver, lemu, (size_t)T * V * sizeof *lver);
            printf("a verify pass over the %d tokens (exact products): %d decode_layers calls, its rows %s the plain steps'  %s\n", T, vcalls,
                   bits ? "bit-equal to" : "DIFFER from", bits && vcalls == T ? "ok" : "FAILED");
            ok &= bits && vcalls == T;
            df_state_free(&s4);
            free(lver);
        }
        df_state_free(&s2), df_state_free(&s3);
        free(toks), free(lref), free(lemu);
    }
    printf("%s\n", ok ? "dec_cpu_parity: ok" : "dec_cpu_parity: FAILED");
    free(tab), free(etab), free(ids), free(lg), free(lk), free(lr), free(kids), free(lids);
    df_state_free(&s);
    df_model_backend_detach(m);
    df_model_free(m);
    return ok ? 0 : 1;
}
