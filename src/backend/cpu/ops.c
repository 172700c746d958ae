/* ops.c - the CPU backend's table (df_backend_cpu) and its reference twin
 * (df_backend_cpu_scalar: the same code on the scalar kernels and one
 * thread), with the operations that are not products or attention:
 * memory, norms, RoPE, element-wise ops, routers, the MoE combine and the
 * recurrent mixers' scans. Backend memory is host memory here (a df_act is
 * a float array), params are read in place and registration is a no-op.
 *
 * These small ops run on the calling thread for one position's rows; calls
 * over many (prefill, verify passes: 13% of a 512-token SmolLM2 prefill's
 * wall time ran here on one thread while the other spun) split their rows
 * or elements over the pool (par_for). Each row's sums stay on one thread
 * and every element is computed by the same code, so the bits do not
 * depend on the split or the thread count. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "backend/ggml_quant.h"
#include "deltafin.h"
#include "util/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- memory ----------------------------------------------------------------- */
static df_act *c_alloc(size_t n) { return (df_act *)calloc(n ? n : 1, sizeof(float)); }
static void c_free(df_act *p) { free(p); }
static void c_write(df_act *dst, const float *src, size_t n) { if (n) memcpy(DF_F(dst), src, n * sizeof(float)); }
static void c_read(float *dst, const df_act *src, size_t n) { if (n) memcpy(dst, DF_CF(src), n * sizeof(float)); }
static void c_copy(df_act *dst, const df_act *src, size_t n) { if (n) memcpy(DF_F(dst), DF_CF(src), n * sizeof(float)); }
static void c_zero(df_act *dst, size_t n) { if (n) memset(DF_F(dst), 0, n * sizeof(float)); }
static void c_copy_rows(df_act *dst, size_t ds, const df_act *src, size_t ss, int rows, int cols) {
    for (int r = 0; r < rows; r++) memcpy(DF_F(dst) + (size_t)r * ds, DF_CF(src) + (size_t)r * ss, (size_t)cols * sizeof(float));
}
static void c_gather(df_act *dst, const df_act *src, const int *idx, int n, int cols) {
    for (int j = 0; j < n; j++) memcpy(DF_F(dst) + (size_t)j * cols, DF_CF(src) + (size_t)idx[j] * cols, (size_t)cols * sizeof(float));
}
static void c_scatter(df_act *dst, const int *idx, const df_act *src, int n, int cols) {
    for (int j = 0; j < n; j++) memcpy(DF_F(dst) + (size_t)idx[j] * cols, DF_CF(src) + (size_t)j * cols, (size_t)cols * sizeof(float));
}

/* ---- weights and params: used in place -------------------------------------- */
static int c_weight_register(df_weight *w) { (void)w; return 0; }
static void c_weight_unregister(df_weight *w) { w->handle = NULL; }
static int c_param_register(const float *p, size_t n) { (void)p, (void)n; return 0; }

/* ---- over the pool ------------------------------------------------------------ */
#define PAR_MIN 8192 /* elements of work from which a call is split over the pool (a dispatch costs a few us) */
typedef void (*range_fn)(void *c, size_t a, size_t b);
typedef struct { range_fn fn; void *c; size_t n; } par_ctx;
static void par_task(void *ctx, int tid, int nth) {
    const par_ctx *p = ctx;
    const size_t a = p->n * (size_t)tid / (size_t)nth, b = p->n * (size_t)(tid + 1) / (size_t)nth;
    if (a < b) p->fn(p->c, a, b);
}
/* fn(c, a, b) over [0, n) in one range per pool thread where work (elements) is large enough, else on the caller */
static void par_for(size_t n, size_t work, range_fn fn, void *c) {
    if (work < PAR_MIN || n < 2 || df_pool_size() < 2) {
        fn(c, 0, n);
        return;
    }
    par_ctx p = {fn, c, n};
    df_pool_run(par_task, &p);
}

/* ---- rows ------------------------------------------------------------------- */
typedef struct { df_act *out; size_t os; const df_act *x; size_t xs; const float *g; int n; float eps; } rms_ctx;
static void rms_rows(void *ctx, size_t r0, size_t r1) {
    const rms_ctx *c = ctx;
    const int n = c->n;
    const float *g = c->g, eps = c->eps;
    for (size_t r = r0; r < r1; r++) {
        const float *xr = DF_CF(c->x) + r * c->xs;
        float *o = DF_F(c->out) + r * c->os;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = 0; i < n; i++) o[i] = g[i] * (xr[i] * inv);
    }
}
static void c_rmsnorm(df_act *out, size_t os, const df_act *x, size_t xs, const float *g, int rows, int n, float eps) {
    rms_ctx c = {out, os, x, xs, g, n, eps};
    par_for((size_t)(rows > 0 ? rows : 0), (size_t)(rows > 0 ? rows : 0) * (size_t)(n > 0 ? n : 0), rms_rows, &c);
}

static void c_rope_table(df_act *cs, int pos0, int n, const float *inv_freq, int half, float scale) {
    float *p = DF_F(cs);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)(pos0 + t) * inv_freq[i];
            p[((size_t)t * half + i) * 2] = cosf(ang) * scale;
            p[((size_t)t * half + i) * 2 + 1] = sinf(ang) * scale;
        }
}

static void rope_one(const float *cs, int d, float *v, int interleaved) {
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
typedef struct { df_act *x; int nh; size_t ts, hs; int dim; const df_act *cs; int interleaved; } rope_ctx;
static void rope_units(void *ctx, size_t u0, size_t u1) { /* unit u: position u / nh, head u % nh */
    const rope_ctx *c = ctx;
    for (size_t u = u0; u < u1; u++) {
        const size_t t = u / (size_t)c->nh, h = u % (size_t)c->nh;
        rope_one(DF_CF(c->cs) + t * (size_t)(c->dim / 2) * 2, c->dim, DF_F(c->x) + t * c->ts + h * c->hs, c->interleaved);
    }
}
static void c_rope(df_act *x, int n, int nh, size_t ts, size_t hs, int dim, const df_act *cs, int interleaved) {
    if (n <= 0 || nh <= 0) return;
    rope_ctx c = {x, nh, ts, hs, dim, cs, interleaved};
    const size_t units = (size_t)n * (size_t)nh;
    par_for(units, units * (size_t)(dim > 0 ? dim : 0) * 4, rope_units, &c); /* sin/cos products: ~4 elements' work a value */
}

/* ---- element-wise -------------------------------------------------------------- */
typedef struct { float *a; const float *b; } add_ctx;
static void add_range(void *ctx, size_t i0, size_t i1) {
    const add_ctx *c = ctx;
    for (size_t i = i0; i < i1; i++) c->a[i] += c->b[i];
}
static void c_add(df_act *y, const df_act *x, size_t n) {
    add_ctx c = {DF_F(y), DF_CF(x)};
    par_for(n, n / 4, add_range, &c); /* memory-bound: split from 32768 elements */
}
static void c_add_bias(df_act *y, const float *b, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        float *a = DF_F(y) + (size_t)r * cols;
        for (int i = 0; i < cols; i++) a[i] += b[i];
    }
}
static void c_axpy(df_act *y, float a, const df_act *x, size_t n) { df_cpu_axpy(DF_F(y), a, DF_CF(x), (int)n); }
static void c_scale(df_act *y, float a, size_t n) {
    float *p = DF_F(y);
    for (size_t i = 0; i < n; i++) p[i] *= a;
}
static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
typedef struct { float *o; const float *a, *b; df_gate_kind kind; float p0, p1; } gate_ctx;
static void gate_range(void *ctx, size_t i0, size_t i1) {
    const gate_ctx *c = ctx;
    float *o = c->o + i0;
    const float *a = c->a + i0, *b = c->b + i0, p0 = c->p0, p1 = c->p1;
    const size_t n = i1 - i0;
    switch (c->kind) {
    case DF_GATE_SILU:
        for (size_t i = 0; i < n; i++) o[i] = silu(a[i]) * b[i];
        break;
    case DF_GATE_SITU:
        for (size_t i = 0; i < n; i++) {
            const float x = a[i], y = p1 != 0.0f ? p1 * tanhf(b[i] / p1) : b[i];
            o[i] = p0 * tanhf(x / p0) * sigm(x) * y;
        }
        break;
    case DF_GATE_SIGMOID:
        for (size_t i = 0; i < n; i++) o[i] = sigm(a[i]) * b[i];
        break;
    case DF_GATE_N: break;
    }
}
static void c_gate(df_act *out, const df_act *g, const df_act *u, size_t n, df_gate_kind kind, float p0, float p1) {
    gate_ctx c = {DF_F(out), DF_CF(g), DF_CF(u), kind, p0, p1};
    par_for(n, n * 4, gate_range, &c); /* expf or tanhf an element: split from 2048 (a verify pass of 2 positions) */
}
static void c_sigmoid(df_act *x, size_t n) {
    float *p = DF_F(x);
    for (size_t i = 0; i < n; i++) p[i] = sigm(p[i]);
}
static void c_l2norm(df_act *x, int rows, int cols, float eps, float scale) {
    float *p = DF_F(x);
    for (int r = 0; r < rows; r++) {
        float *v = p + (size_t)r * cols, ss = 0.0f;
        for (int i = 0; i < cols; i++) ss += v[i] * v[i];
        const float k = scale / sqrtf(ss + eps);
        for (int i = 0; i < cols; i++) v[i] *= k;
    }
}
static void c_attn_res(const df_attn_res_args *a) {
    const int h = a->h, nb = a->nb;
    for (int t = 0; t < a->n; t++) {
        float mx = -INFINITY, sum = 0.0f, sc[1 + DF_ATTN_RES_MAX_BLOCKS];
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? DF_CF(a->blocks) + (size_t)i * a->block_stride + (size_t)t * h : DF_CF(a->p) + (size_t)t * h;
            float ss = 0.0f, s = 0.0f;
            for (int d = 0; d < h; d++) ss += v[d] * v[d];
            const float r = 1.0f / sqrtf(ss / (float)h + a->eps);
            for (int d = 0; d < h; d++) s += (v[d] * r) * (a->norm_w[d] * a->proj_w[d]);
            sc[i] = s;
            if (s > mx) mx = s;
        }
        for (int i = 0; i <= nb; i++) sum += sc[i] = expf(sc[i] - mx);
        float *o = DF_F(a->out) + (size_t)t * h;
        for (int d = 0; d < h; d++) o[d] = 0.0f;
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? DF_CF(a->blocks) + (size_t)i * a->block_stride + (size_t)t * h : DF_CF(a->p) + (size_t)t * h;
            df_cpu_axpy(o, sc[i] / sum, v, h);
        }
    }
}

/* ---- routers ---------------------------------------------------------------------- */
/* The index of the largest v[e] not yet taken (ties: lowest index); marks it taken. */
static int take_max(const float *v, unsigned char *taken, int E) {
    int best = -1;
    for (int e = 0; e < E; e++)
        if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
    if (best >= 0) taken[best] = 1;
    return best;
}

static void route_softmax_topk(const df_route_args *a, const float *logits, int *sel, float *w, float *tmp) {
    const int E = a->n_experts, K = a->k;
    unsigned char *taken = (unsigned char *)tmp;
    memset(taken, 0, (size_t)E);
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) if (logits[e] > mx) mx = logits[e];
    double sum = 0;
    for (int e = 0; e < E; e++) sum += expf(logits[e] - mx);
    for (int k = 0; k < K; k++) {
        int best = take_max(logits, taken, E);
        sel[k] = best;
        w[k] = (float)(expf(logits[best] - mx) / sum);
    }
    if (a->norm_topk) {
        float s = 0;
        for (int k = 0; k < K; k++) s += w[k];
        for (int k = 0; k < K; k++) w[k] /= s;
    }
}

static void route_sigmoid_groups(const df_route_args *a, const float *logits, int *sel, float *w, float *tmp) {
    const int E = a->n_experts, K = a->k, G = a->n_group, per = E / G;
    float *score = tmp, *choice = tmp + E, *gscore = tmp + 2 * (size_t)E;
    unsigned char *keep = (unsigned char *)(gscore + G), *taken = keep + G; /* 2E + G floats + G + E bytes <= 4E floats */
    for (int e = 0; e < E; e++) {
        score[e] = 1.0f / (1.0f + expf(-logits[e]));
        choice[e] = score[e] + a->bias[e];
    }
    for (int g = 0; g < G; g++) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int i = 0; i < per; i++) {
            float v = choice[g * per + i];
            if (v > b1) { b2 = b1; b1 = v; }
            else if (v > b2) b2 = v;
        }
        gscore[g] = b1 + b2;
    }
    memset(keep, 0, (size_t)G);
    for (int k = 0; k < a->topk_group; k++) take_max(gscore, keep, G);
    memset(taken, 0, (size_t)E);
    for (int e = 0; e < E; e++)
        if (!keep[e / per]) taken[e] = 1; /* experts of dropped groups are never chosen */
    for (int k = 0; k < K; k++) {
        int best = take_max(choice, taken, E);
        if (best < 0) best = 0; /* unreachable: config checks topk_group * per >= K */
        sel[k] = best;
        w[k] = score[best];
    }
    if (a->norm_topk) {
        float s = 0;
        for (int k = 0; k < K; k++) s += w[k];
        s += 1e-20f;
        for (int k = 0; k < K; k++) w[k] /= s;
    }
    for (int k = 0; k < K; k++) w[k] *= a->scaling;
}

enum { SC_ROUTE = 3 }; /* per-thread scratch slot (attn.c uses 0..2) */

static void c_route(const df_route_args *a) {
    const int E = a->n_experts, K = a->k;
    float *tmp = df_cpu_scratch(SC_ROUTE, 4 * (size_t)E + (size_t)K); /* router scratch, then K weights */
    float *wk = tmp + 4 * (size_t)E;
    for (int t = 0; t < a->n; t++) {
        const float *lg = DF_CF(a->logits) + (size_t)t * E;
        float *w = a->w ? DF_F(a->w) + (size_t)t * K : wk;
        if (a->kind == DF_ROUTE_SIGMOID_GROUPS) route_sigmoid_groups(a, lg, a->ids + (size_t)t * K, w, tmp);
        else route_softmax_topk(a, lg, a->ids + (size_t)t * K, w, tmp);
    }
}

/* out[t] = 0, then += w[t][k] x[t][k] for k in order (the kernel axpy) */
static void c_moe_combine(df_act *out, const df_act *x, const df_act *w, int n, int k, int cols) {
    float *o = DF_F(out);
    const float *xs = DF_CF(x), *ws = DF_CF(w);
    memset(o, 0, (size_t)n * cols * sizeof(float));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) df_cpu_axpy(o + (size_t)t * cols, ws[t * k + j], xs + ((size_t)t * k + j) * cols, cols);
}

/* ---- recurrent mixers ------------------------------------------------------------- */
static void c_causal_conv1d(const df_conv1d_args *a) {
    const int C = a->C, W = a->W, n = a->n, M = W - 1;
    const float *x = DF_CF(a->x);
    float *y = DF_F(a->y), *st = DF_F(a->state);
    for (int c = 0; c < C; c++) {
        const float *wc = a->w + (size_t)c * W;
        float *sc = st + (size_t)c * M; /* the last M inputs of channel c, oldest first */
        for (int t = 0; t < n; t++) {
            /* taps 0..M-1 read the window (state, then earlier tokens of the batch), tap M the current token */
            float acc = 0;
            for (int j = 0; j < M; j++) {
                int src = t + j - M; /* token index of tap j; < 0: in the state */
                float v = src < 0 ? sc[M + src] : x[(size_t)src * C + c];
                acc += wc[j] * v;
            }
            acc += wc[M] * x[(size_t)t * C + c];
            if (a->bias) acc += a->bias[c];
            y[(size_t)t * C + c] = a->silu ? silu(acc) : acc;
        }
        /* the new window: the last M of (state, x) */
        if (n >= M) {
            for (int j = 0; j < M; j++) sc[j] = x[(size_t)(n - M + j) * C + c];
        } else if (M > 0) {
            memmove(sc, sc + n, (size_t)(M - n) * sizeof(float));
            for (int j = 0; j < n; j++) sc[M - n + j] = x[(size_t)j * C + c];
        }
    }
}

enum { SC_KDA = 3 };

static void kda_task(void *p, int tid, int nth) {
    const df_kda_args *a = p;
    const int dk = a->dk, dv = a->dv, nh = a->nh;
    float *qs = df_cpu_scratch(SC_KDA, (size_t)dk * 2 + (size_t)dv); /* scaled q, decay, u */
    float *dec = qs + dk, *u = dec + dk;
    for (int h = tid; h < nh; h += nth) {
        float *S = DF_F(a->S) + (size_t)h * dk * dv;
        for (int t = 0; t < a->n; t++) {
            const size_t qk = ((size_t)t * nh + h) * dk, vo = ((size_t)t * nh + h) * dv;
            const float *q = DF_CF(a->q) + qk, *k = DF_CF(a->k) + qk, *g = DF_CF(a->g) + qk, *v = DF_CF(a->v) + vo;
            const float beta = DF_CF(a->beta)[(size_t)t * nh + h];
            for (int i = 0; i < dk; i++) qs[i] = q[i] * a->scale, dec[i] = expf(g[i]);
            /* S = diag(a) S; u = v - S^T k */
            for (int j = 0; j < dv; j++) u[j] = 0;
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) Si[j] *= dec[i];
                df_cpu_axpy(u, k[i], Si, dv);
            }
            for (int j = 0; j < dv; j++) u[j] = v[j] - u[j];
            /* S += beta k u^T; o = S^T q */
            float *o = DF_F(a->o) + vo;
            for (int j = 0; j < dv; j++) o[j] = 0;
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * dv;
                df_cpu_axpy(Si, beta * k[i], u, dv);
                df_cpu_axpy(o, qs[i], Si, dv);
            }
        }
    }
}
/* torch.nn.functional.softplus (beta 1, threshold 20) */
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static void c_kda_gate(const df_kda_gate_args *a) {
    const int nh = a->nh, d = a->d;
    const float *f = DF_CF(a->f);
    float *g = DF_F(a->g);
    for (int t = 0; t < a->n; t++)
        for (int h = 0; h < nh; h++) {
            const float A = expf(a->A_log[h]);
            const size_t o = ((size_t)t * nh + h) * d;
            for (int i = 0; i < d; i++) {
                const float x = f[o + i] + a->dt_bias[(size_t)h * d + i];
                g[o + i] = a->has_lower_bound ? a->lower_bound * sigm(A * x) : -A * softplus(x);
            }
        }
}
static void c_kda_scan(const df_kda_args *a) {
    if ((int64_t)a->nh * a->dk * a->dv * a->n < 32768) kda_task((void *)a, 0, 1);
    else df_pool_run(kda_task, (void *)a);
}

/* ---- the tables -------------------------------------------------------------------- */
/* Greedy decoding ahead (backend.h): synchronous here, the token slot the calling thread's. df_argmax's rule:
 * the first of equal maxima (x > best only), NaN never chosen (a comparison with NaN is false), 0 when x[0] is NaN. */
static _Thread_local int32_t c_tok, c_tok_ring[2];
static _Thread_local int64_t c_tok_n;
static int64_t c_next_token(const df_act *logits, int vocab) {
    const float *x = DF_CF(logits);
    int32_t best = 0;
    if (vocab > 0 && x[0] == x[0])
        for (int32_t i = 1; i < vocab; i++)
            if (x[i] > x[best]) best = i;
    c_tok = best, c_tok_ring[c_tok_n & 1] = best;
    return c_tok_n++;
}
static int32_t c_next_token_wait(int64_t ticket) { return c_tok_ring[ticket & 1]; }
static int c_embed_token(const df_weight *emb, df_act *out) {
    if (!emb->data) return DF_EUNSUPPORTED; /* an embedding read from its file row by row (model/loader.c) */
    if (out) df_dequant_row(emb, c_tok, DF_F(out));
    return 0;
}

const df_backend_ops df_backend_cpu = {
    .name = "cpu",
    .alloc = c_alloc, .free = c_free, .write = c_write, .read = c_read, .copy = c_copy, .zero = c_zero,
    .copy_rows = c_copy_rows, .gather_rows = c_gather, .scatter_rows = c_scatter,
    .weight_register = c_weight_register, .weight_unregister = c_weight_unregister, .param_register = c_param_register,
    .matmul_batch = df_cpu_matmul_batch,
    .attn_gqa = df_cpu_attn_gqa, .attn_mla = df_cpu_attn_mla,
    .rmsnorm = c_rmsnorm, .rope_table = c_rope_table, .rope = c_rope,
    .add = c_add, .add_bias = c_add_bias, .axpy = c_axpy, .scale = c_scale, .gate = c_gate,
    .sigmoid = c_sigmoid, .l2norm = c_l2norm, .attn_res = c_attn_res,
    .route = c_route, .moe_combine = c_moe_combine,
    .causal_conv1d = c_causal_conv1d, .kda_scan = c_kda_scan, .kda_gate = c_kda_gate,
    .exact_products = df_cpu_exact_products,
    .next_token = c_next_token, .next_token_wait = c_next_token_wait, .embed_token = c_embed_token,
};

/* The reference: every computing op of the table on the scalar kernels
 * (ours and the GGML decoders) and on the calling thread only. The ISA is
 * process-wide, so the reference is for tests that call one op at a time. */
static int ref_isa, ref_gisa;
static void ref_enter(void) {
    ref_isa = df_isa(), ref_gisa = df_ggml_get_isa();
    df_set_isa(DF_ISA_SCALAR), df_ggml_set_isa(DF_GGML_ISA_SCALAR), df_pool_serial(1);
}
static void ref_leave(void) { df_set_isa(ref_isa), df_ggml_set_isa(ref_gisa), df_pool_serial(0); }
#define REF(call) do { ref_enter(); call; ref_leave(); } while (0)
static void r_matmul_batch(const df_mv_job *j, int nj, int n) { REF(df_cpu_matmul_batch(j, nj, n)); }
static void r_attn_gqa(const df_attn_gqa_args *a) { REF(df_cpu_attn_gqa(a)); }
static void r_attn_mla(const df_attn_mla_args *a) { REF(df_cpu_attn_mla(a)); }
static void r_rmsnorm(df_act *out, size_t os, const df_act *x, size_t xs, const float *g, int rows, int n, float eps) { REF(c_rmsnorm(out, os, x, xs, g, rows, n, eps)); }
static void r_axpy(df_act *y, float a, const df_act *x, size_t n) { REF(c_axpy(y, a, x, n)); }
static void r_rope(df_act *x, int n, int nh, size_t ts, size_t hs, int dim, const df_act *cs, int interleaved) { REF(c_rope(x, n, nh, ts, hs, dim, cs, interleaved)); }
static void r_add(df_act *y, const df_act *x, size_t n) { REF(c_add(y, x, n)); }
static void r_gate(df_act *out, const df_act *g, const df_act *u, size_t n, df_gate_kind kind, float p0, float p1) { REF(c_gate(out, g, u, n, kind, p0, p1)); }
static void r_moe_combine(df_act *out, const df_act *x, const df_act *w, int n, int k, int cols) { REF(c_moe_combine(out, x, w, n, k, cols)); }
static void r_kda_scan(const df_kda_args *a) { REF(c_kda_scan(a)); }
static void r_attn_res(const df_attn_res_args *a) { REF(c_attn_res(a)); }

const df_backend_ops df_backend_cpu_scalar = {
    .name = "cpu-scalar",
    .alloc = c_alloc, .free = c_free, .write = c_write, .read = c_read, .copy = c_copy, .zero = c_zero,
    .copy_rows = c_copy_rows, .gather_rows = c_gather, .scatter_rows = c_scatter,
    .weight_register = c_weight_register, .weight_unregister = c_weight_unregister, .param_register = c_param_register,
    .matmul_batch = r_matmul_batch,
    .attn_gqa = r_attn_gqa, .attn_mla = r_attn_mla,
    .rmsnorm = r_rmsnorm, .rope_table = c_rope_table, .rope = r_rope,
    .add = r_add, .add_bias = c_add_bias, .axpy = r_axpy, .scale = c_scale, .gate = r_gate,
    .sigmoid = c_sigmoid, .l2norm = c_l2norm, .attn_res = r_attn_res,
    .route = c_route, .moe_combine = r_moe_combine,
    .causal_conv1d = c_causal_conv1d, .kda_scan = r_kda_scan, .kda_gate = c_kda_gate,
    .exact_products = df_cpu_exact_products,
    .next_token = c_next_token, .next_token_wait = c_next_token_wait, .embed_token = c_embed_token,
};

void df_backend_init(int n_threads) { df_pool_init(n_threads); }
int df_backend_threads(void) { return df_pool_size(); }
