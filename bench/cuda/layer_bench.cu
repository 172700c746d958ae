/* layer_bench.cu - what a persistent decode kernel could reach on this GPU (issue 13, the 70% goal), before anyone
 * builds one into the backend: a synthetic Qwen3-30B-A3B-shape decode layer (BF16 weights, f32 activations, one
 * token) run as the same tasks two ways, timed against the HBM read floor measured in the same run.
 *
 * The layer (a decode step of transformers' Qwen3MoeDecoderLayer, H = 2048, 32 q heads / 4 KV heads of 128, 128
 * experts of 768 choosing 8, softmax routing with norm_topk_prob): x = rmsnorm(h); q k v = W_qkv x; per-head q/k
 * RMSNorm, rotate-half RoPE at position P; attention over P cached positions plus the new one; h += W_o att;
 * x2 = rmsnorm(h); softmax(W_r x2), top 8, weights renormalised; for each chosen expert a = silu(W_g x2) * (W_u x2),
 * y = W_d a; h += sum_k w_k y_k. 113.8 MB of weights a layer; L layers of their own weights (default 4). A token ends as
 * a decode step does: final RMSNorm, the lm_head's V logits (default 8000: the backend benchmark's synthetic model;
 * 151936 is Qwen3's), their argmax, and that id's embedding row as the next token's h (V = 0: no boundary, the
 * residual stream carried on), so a token's first layer waits for the last token's argmax. The weight bytes a token
 * (L layers + lm_head) over its time against the floor is issue 13's measure. The weights and the cache are laid out
 * as the CUDA backend holds them, so that the persistent kernel measured here is the one it would run: q, k, v, o and
 * the router their own tensors; each routed expert's gate, up and down their own tensors in slots of a slab in no
 * particular order, found through a device table of pointers (the backend's table of VRAM-resident experts); the
 * K/V cache in f32 rows, a position's K row then its V row (src/model/kinds/gqa.c); the RoPE table of rope_table.
 *
 * The kernels are bench/cuda/dec_kernel.cuh's (the shapes and the layer table: dec_layers.h), shared with the CPU-emulated
 * check against the CPU backend on a real checkpoint (tests/emu/dec_cpu_parity.c); this file holds the arms, the host
 * reference, the hashed weights and the timing.
 * The work is cut into the same tasks for every arm (so every arm computes the same bits, checked):
 *   QKV    rows of W_qkv, the input norm computed by every block from h (no launch of its own)
 *   ATTN   (KV head, 32 positions): q/k norm + RoPE of its heads, scores, softmax part, P x V part; the last part
 *          of a KV head (a ticket) combines its 8 heads' parts into att
 *   O      rows of W_o, h += the row's value
 *   ROUTER rows of W_r, the norm again computed by every block
 *   GUH    (chosen expert, rows) gate and up rows together, a = silu(g) u; every block routes for itself
 *   DOWN   (chosen expert, rows); the last of the 8 experts' tasks of a row range (a ticket) adds their sum,
 *          weighted in k order, into h
 *   LM     (with V) lm_head rows (the final norm in every block), each task's best logit; the last task (a ticket)
 *          takes the argmax and writes the token's embedding row as h
 * Every product task loads its first weight rows into registers (or, persist-smem, a shared-memory ring) before it
 * waits for its input (the weights are written by nothing), then streams the rest a few rows ahead.
 * Arms:
 *   launch        a kernel an op (6 a layer, + the lm_head), programmatic launches (griddepcontrol: launch_dependents at entry,
 *                 wait before the input is read), one token captured as a CUDA graph and replayed: the backend's way
 *   launch-1      the same with the kernels built for one block an SM (255 registers) and one block an SM of tasks:
 *                 the persistent kernel's occupancy, so that launch-1 vs persist is the schedule alone
 *   persist       ONE cooperative launch of resident blocks (the SM count x blocks an SM) for all tokens; block b
 *                 runs tasks b, b + G, ... of each op in op order and waits on the op before's counter (acquire load
 *                 of a counter the producers bump after a fence), DOWN of an expert on that expert's GUH only
 *   persist-tok   the same kernel launched once a token
 *   persist-nopf  persist with the weights loaded only after the wait (what the early loads are worth)
 *   persist-noexp persist with DOWN waiting for every expert's GUH (what per-expert readiness is worth)
 *   persist-l2    persist with each task's rows past the registers' also asked of L2 before its wait (one
 *                 cp.async.bulk.prefetch.L2 a row); launch-l2 the same for the launch arm
 *   persist-smem  persist with a warp's rows in flight in a ring of shared memory (cp.async a row ahead into each
 *                 slot) instead of registers; persist-smem-l2 with the L2 hint too
 *   persist-nodep persist with no waits at all (the tasks' streaming alone; its results are garbage, not checked)
 * Then the timeline of one token in launch and persist: per layer and op, when its first task began, its first and
 * last waits returned and its last task ended (the global timer), from the moment the token's first wait returned.
 * A wait that lasts more than ~2 s sets an error flag (a deadlock or a lost counter shows as "TIMEOUT", not a hang).
 * Checks: every arm's h after one token's layers against a double-precision host forward of the same weights (rel L2
 * of what the layers added, the chosen experts, the next token), and after the timed tokens against the launch arm's,
 * bit for bit and token for token.
 * Usage: layer_bench [tokens (256)] [layers (4)] [cached positions P (640)] [vocabulary V (8000; 0: none)] [golden file
 * of the same configuration and one token, by tests/tools/layer_bench_golden.py: the first token against transformers]
 * Built with g++ -x c++ -DSIMT_EMU (make layer-bench-emu): the same kernels on the CPU (simt_emu.h), one or two tokens
 * through the launch arm and the persist / persist-noexp / persist-nopf / persist-smem arms, checked as on the GPU:
 * layer_bench_emu [layers (1)] [P (640)] [persistent blocks (24)] [launch blocks (48)] [V (8000)] [tokens (2; 2 with V)]
 * [golden file: the same step by transformers' Qwen3-MoE modules, written by tests/tools/layer_bench_golden.py].
 * Built with g++ -x c++ alone: only the host forward, timed (a look at the reference itself).
 * Experiment builds (tools/cuda_device.sh stages them beside this one; every arm's bits are the plain build's):
 * -DDEC_CH=16 (16 cached positions an attention task), -DDEC_XPF=1 (the attention's tasks ask L2 to keep the next
 * layer's q/k/v rows, evict_last, and every product's weight load is evict_first: the next layer's q/k/v from L2
 * while the attention's chain leaves HBM idle), -DDEC_XPF=2 (the evict_first loads alone, its control). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __CUDACC__
#define HD __host__ __device__
#else
#define HD
#endif

#include "backend/cuda/dec_layers.h" /* the shapes (Qwen3-30B-A3B's) and the layer table (build with -Isrc) */
using namespace dec;
enum { MAXL = 8 };
#define EPS 1e-6f

/* ---- weights from a hash: the device writes them, the host reference recomputes the rows it needs ---------------- */
HD static inline uint32_t mix(uint32_t seed, uint32_t i) {
    uint32_t x = i ^ (seed * 0x9E3779B9u);
    x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
    x += seed * 0x632BE5ABu;
    x ^= x >> 13, x *= 0x9E3779B1u, x ^= x >> 16;
    return x;
}
HD static inline uint32_t f2u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
HD static inline float u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
/* a weight: uniform in [-1/32, 1/32) (every step exact), rounded to BF16 (nearest even) */
HD static inline uint16_t wbits(uint32_t seed, uint32_t i) {
    const float f = ((float)(mix(seed, i) >> 8) * (1.0f / 16777216.0f) - 0.5f) * (1.0f / 16.0f);
    uint32_t b = f2u(f);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}
HD static inline float bf2f(uint16_t b) { return u2f((uint32_t)b << 16); }
/* a float: base + amp t, t in [-1, 1) with 16 bits (exact for the bases and powers of two used) */
HD static inline float fval(uint32_t seed, uint32_t i, float base, float amp) {
    return base + amp * (((float)(mix(seed, i) >> 16) - 32768.0f) * (1.0f / 32768.0f));
}
enum { S_QKV, S_O, S_R, S_G, S_U, S_D, S_N1, S_N2, S_QN, S_KN, S_KC, S_VC, S_LM = 0, S_EMB, S_NF }; /* S_LM..: seed_of(MAXL, .) */
static inline uint32_t seed_of(int l, int what) { return 100u + 16u * (uint32_t)l + (uint32_t)what; }
#define SEED_H0 7u
/* the slot of routed expert e in its part's slab: out of order (37 is prime to NE), as experts land in the backend's cache */
static inline int expert_slot(int e) { return (e * 37 + 11) % NE; }

/* argument i of argv as an integer (def when absent); a malformed one ("12x", "", "1e3") ends the program, named */
static int arg_int(int argc, char **argv, int i, int def, const char *what) {
    if (argc <= i) return def;
    char *end = NULL;
    const long v = strtol(argv[i], &end, 10);
    if (!*argv[i] || *end || v < -2147483647L || v > 2147483647L) {
        fprintf(stderr, "layer_bench: argument %d (%s) must be an integer, got \"%s\"\n", i, what, argv[i]);
        exit(2);
    }
    return (int)v;
}

/* ---- the host reference: the layer in double precision ------------------------------------------------------------- */
static double ref_w(int l, int what, size_t i) { return bf2f(wbits(seed_of(l, what), (uint32_t)i)); }
static void ref_norm(const double *x, int n, int l, int what, uint32_t off, double *o) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + (double)EPS);
    for (int i = 0; i < n; i++) o[i] = (double)fval(seed_of(l, what), off + (uint32_t)i, 1.0f, 0.125f) * x[i] * inv;
}
static void ref_rope(double *v, const float *cs) {
    for (int i = 0; i < HD_ / 2; i++) {
        const double a = v[i], b = v[i + HD_ / 2], c = cs[2 * i], s = cs[2 * i + 1];
        v[i] = a * c - b * s, v[i + HD_ / 2] = b * c + a * s;
    }
}
/* one layer on h (in place); ids: the 8 experts chosen */
static void ref_layer(int l, int P, const float *cs, double *h, int *ids) {
    static double x[H], qkv[QKV], att[QR], lg[NE], act[IE], y[H];
    ref_norm(h, H, l, S_N1, 0, x);
    for (int r = 0; r < QKV; r++) {
        double s = 0;
        for (int c = 0; c < H; c++) s += ref_w(l, S_QKV, (size_t)r * H + c) * x[c];
        qkv[r] = s;
    }
    for (int hh = 0; hh < NQ + NKV; hh++) { /* q heads then k heads: norm, rope */
        double *v = qkv + (size_t)hh * HD_, t[HD_];
        ref_norm(v, HD_, l, hh < NQ ? S_QN : S_KN, 0, t);
        memcpy(v, t, sizeof t);
        ref_rope(v, cs);
    }
    const double scale = 1.0 / sqrt((double)HD_);
    double *sc = (double *)malloc((size_t)(P + 1) * sizeof(double));
    for (int qh = 0; qh < NQ; qh++) {
        const int g = qh / (NQ / NKV);
        const double *q = qkv + (size_t)qh * HD_;
        double mx = -1e300;
        for (int p = 0; p <= P; p++) {
            double s = 0;
            for (int d = 0; d < HD_; d++) {
                const double k = p < P ? fval(seed_of(l, S_KC), (uint32_t)(((size_t)p * NKV + g) * HD_ + d), 0.0f, 1.0f) : qkv[QR + g * HD_ + d];
                s += q[d] * k;
            }
            sc[p] = s * scale;
            if (sc[p] > mx) mx = sc[p];
        }
        double den = 0;
        for (int p = 0; p <= P; p++) den += (sc[p] = exp(sc[p] - mx));
        for (int d = 0; d < HD_; d++) {
            double o = 0;
            for (int p = 0; p <= P; p++) {
                const double v = p < P ? fval(seed_of(l, S_VC), (uint32_t)(((size_t)p * NKV + g) * HD_ + d), 0.0f, 1.0f) : qkv[QR + KR + g * HD_ + d];
                o += sc[p] * v;
            }
            att[(size_t)qh * HD_ + d] = o / den;
        }
    }
    free(sc);
    for (int r = 0; r < H; r++) {
        double s = 0;
        for (int c = 0; c < QR; c++) s += ref_w(l, S_O, (size_t)r * QR + c) * att[c];
        h[r] += s;
    }
    ref_norm(h, H, l, S_N2, 0, x);
    double mx = -1e300;
    for (int e = 0; e < NE; e++) {
        double s = 0;
        for (int c = 0; c < H; c++) s += ref_w(l, S_R, (size_t)e * H + c) * x[c];
        lg[e] = s;
        if (s > mx) mx = s;
    }
    double den = 0;
    for (int e = 0; e < NE; e++) den += (lg[e] = exp(lg[e] - mx));
    int taken[NE] = {0};
    double wk[TOPK], wsum = 0;
    for (int k = 0; k < TOPK; k++) {
        int b = -1;
        for (int e = 0; e < NE; e++)
            if (!taken[e] && (b < 0 || lg[e] > lg[b])) b = e;
        taken[b] = 1, ids[k] = b, wk[k] = lg[b] / den, wsum += wk[k];
    }
    for (int r = 0; r < H; r++) y[r] = 0;
    for (int k = 0; k < TOPK; k++) {
        const size_t e = (size_t)ids[k];
        for (int i = 0; i < IE; i++) {
            double g = 0, u = 0;
            for (int c = 0; c < H; c++) {
                g += ref_w(l, S_G, (e * IE + i) * H + c) * x[c];
                u += ref_w(l, S_U, (e * IE + i) * H + c) * x[c];
            }
            act[i] = g / (1.0 + exp(-g)) * u;
        }
        for (int r = 0; r < H; r++) {
            double s = 0;
            for (int i = 0; i < IE; i++) s += ref_w(l, S_D, (e * H + r) * IE + i) * act[i];
            y[r] += wk[k] / wsum * s;
        }
    }
    for (int r = 0; r < H; r++) h[r] += y[r];
}
static void rope_table(int P, float *cs) { /* Qwen3's rope_theta 1e6, position P */
    for (int i = 0; i < HD_ / 2; i++) {
        const double ang = (double)P * pow(1e6, -2.0 * i / HD_);
        cs[2 * i] = (float)cos(ang), cs[2 * i + 1] = (float)sin(ang);
    }
}
/* one token: the L layers on h0 (the hash's first h when NULL; h after them in h, the experts in ids); with a
 * vocabulary of V > 0 ids, the final norm, the lm_head's logits and their argmax (the lowest id of equal maxima) into
 * *tok */
static void ref_forward(int L, int P, int V, const double *h0, double *h, int *ids, int *tok) {
    float cs[HD_];
    rope_table(P, cs);
    for (int i = 0; i < H; i++) h[i] = h0 ? h0[i] : fval(SEED_H0, (uint32_t)i, 0.0f, 1.0f);
    for (int l = 0; l < L; l++) ref_layer(l, P, cs, h, ids + TOPK * l);
    *tok = -1;
    if (V <= 0) return;
    static double x[H];
    ref_norm(h, H, MAXL, S_NF, 0, x);
    double best = -1e300;
    for (int v = 0; v < V; v++) {
        double s = 0;
        for (int c = 0; c < H; c++) s += ref_w(MAXL, S_LM, (size_t)v * H + c) * x[c];
        if (s > best) best = s, *tok = v;
    }
}

#if !defined(__CUDACC__) && !defined(SIMT_EMU)
#include <time.h>
int main(int argc, char **argv) { /* the reference alone, for a look at it without a GPU */
    const int L = arg_int(argc, argv, 1, 1, "layers"), P = arg_int(argc, argv, 2, 640, "positions"), V = arg_int(argc, argv, 3, 8000, "vocabulary");
    if (L < 1 || L > MAXL || P < 1 || P > 65536 || V < 0 || V > 1 << 20)
        return fprintf(stderr, "layer_bench (host): layers 1..%d, P 1..65536, vocabulary 0..%d\n", MAXL, 1 << 20), 2;
    static double h[H];
    int ids[TOPK * MAXL], tok;
    const clock_t t0 = clock();
    ref_forward(L, P, V, NULL, h, ids, &tok);
    double ss = 0, dd = 0;
    int finite = 1;
    for (int i = 0; i < H; i++) {
        const double d = h[i] - fval(SEED_H0, (uint32_t)i, 0.0f, 1.0f);
        ss += h[i] * h[i], dd += d * d, finite &= isfinite(h[i]) != 0;
    }
    printf("host forward, %d layer(s), P %d: %.2f s, |h| %.6f, |h - h0| %.6f, h[0..3] %.6f %.6f %.6f %.6f, %s\n", L, P,
           (double)(clock() - t0) / CLOCKS_PER_SEC, sqrt(ss), sqrt(dd), h[0], h[1], h[2], h[3], finite ? "finite" : "NOT FINITE");
    for (int l = 0; l < L; l++) {
        printf("layer %d experts:", l);
        for (int k = 0; k < TOPK; k++) printf(" %d", ids[TOPK * l + k]);
        printf("\n");
    }
    if (V) printf("the next token (argmax of %d logits): %d\n", V, tok);
    return finite ? 0 : 1;
}
#else
/* ======================================== the device side ======================================================= */
#include <vector>
#include "backend/cuda/dec_kernel.cuh" /* the kernels: a kernel an op and the persistent one */
#ifdef __CUDACC__
#include "read_floor.cuh"
#endif
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "layer_bench: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
static void print_tasks(const Net &n, const char *who) {
    printf("%s, G = %d: tasks a layer: qkv %d x %d rows, attn %d x %d positions, o %d x %d rows, router %d x %d, gate/up %d x %d pairs, down %d x %d rows\n",
           who, n.G, n.qkv_n, n.qkv_R, NKV * n.nch, CH, n.o_n, n.o_R, n.r_n, n.r_R, TOPK * n.guh_tpe, n.guh_pairs, TOPK * n.dn_tpe, n.dn_R);
}
/* rel L2 of what the layers added to h (h - h0), against the reference's: h0 itself would hide their errors */
static inline double rel_l2(const float *a, const double *ref) {
    double num = 0, den = 0;
    for (int i = 0; i < H; i++) {
        const double h0 = fval(SEED_H0, (uint32_t)i, 0.0f, 1.0f), d = (a[i] - h0) - (ref[i] - h0);
        num += d * d, den += (ref[i] - h0) * (ref[i] - h0);
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static inline double rel_l2_from(const float *a, const double *ref, const double *h0) {
    double num = 0, den = 0;
    for (int i = 0; i < H; i++) {
        const double d = (a[i] - h0[i]) - (ref[i] - h0[i]);
        num += d * d, den += (ref[i] - h0[i]) * (ref[i] - h0[i]);
    }
    return sqrt(num / (den > 0 ? den : 1));
}
/* the last token's input h: the hashed first h, or the first token's embedding row (as double, for rel_l2_from) */
static const double *h_last_in(int T, const int *rtok) {
    static double in[H];
    for (int i = 0; i < H; i++)
        in[i] = T == 2 ? bf2f(wbits(seed_of(MAXL, S_EMB), (uint32_t)((size_t)rtok[0] * H + i))) : fval(SEED_H0, (uint32_t)i, 0.0f, 1.0f);
    return in;
}
/* A run against transformers' own Qwen3-MoE modules (tests/tools/layer_bench_golden.py wrote the file):
 * every token's id, the last token's experts in order, and what its layers added to h (rel L2 < 1e-4). The host
 * forward's tokens and experts are checked against the file too (so it is not only our code checking our code). */
static int golden_check(const char *path, int L, int P, int V, int T, const float *h, const double *hin, const int *rtok, const int *rids) {
    FILE *f = fopen(path, "rb");
    int32_t hd[5];
    if (!f || fread(hd, 4, 5, f) != 5) return fprintf(stderr, "layer_bench: %s: cannot read the golden file's header\n", path), 0;
    if (hd[0] != 0x4c424731 || hd[1] != L || hd[2] != P || hd[3] != V || hd[4] != T) {
        fprintf(stderr, "layer_bench: %s: made for layers %d, P %d, V %d, tokens %d (magic %#x), this run is %d %d %d %d\n", path, hd[1], hd[2],
                hd[3], hd[4], (unsigned)hd[0], L, P, V, T);
        return fclose(f), 0;
    }
    int ok = 1, gtok[2] = {-1, -1}, gids[TOPK * MAXL];
    static float gh[H];
    for (int t = 0; t < T; t++) {
        if (fread(&gtok[t], 4, 1, f) != 1 || fread(gids, 4, (size_t)TOPK * L, f) != (size_t)TOPK * L || fread(gh, 4, H, f) != H) {
            fclose(f);
            return fprintf(stderr, "layer_bench: %s: short file (token %d)\n", path, t), 0;
        }
    }
    fclose(f);
    static double g[H];
    for (int i = 0; i < H; i++) g[i] = gh[i];
    const double e = rel_l2_from(h, g, hin);
    int same_ids = 1; /* (the emulated arms' experts equal rids: checked above) */
    for (int i = 0; i < TOPK * L; i++) same_ids &= gids[i] == rids[i];
    const int same_tok = gtok[0] == rtok[0] && gtok[T - 1] == rtok[T - 1];
    ok = e < 1e-4 && same_ids && same_tok;
    printf("golden (transformers' Qwen3MoeDecoderLayer, %s): token(s) %d %d, the last token's experts %s, its layers' output rel L2 %.3g against "
           "the kernels (their launch arm)  %s\n",
           path, gtok[0], T == 2 ? gtok[1] : -1, same_ids ? "equal" : "DIFFER", e, ok ? "ok" : "FAILED");
    return ok;
}
#ifdef __CUDACC__ /* ---- the GPU run ---- */
__global__ void k_fill_w(uint16_t *p, size_t n, uint32_t seed, size_t off) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = wbits(seed, (uint32_t)(off + i));
}
__global__ void k_fill_kv(float *p, size_t n, uint32_t sk, uint32_t sv) { /* n floats of [pos][K | V][KR] */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t pos = i / (2 * KR), c = i % (2 * KR);
        p[i] = fval(c < KR ? sk : sv, (uint32_t)(pos * KR + c % KR), 0.0f, 1.0f);
    }
}
__global__ void k_fill_f(float *p, size_t n, uint32_t seed, float base, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = fval(seed, (uint32_t)i, base, amp);
}

template <int B> static const void *op_kernel_b(int op) {
    switch (op) {
    case OP_QKV: return (const void *)k_op<OP_QKV, B>;
    case OP_ATTN: return (const void *)k_op<OP_ATTN, B>;
    case OP_O: return (const void *)k_op<OP_O, B>;
    case OP_R: return (const void *)k_op<OP_R, B>;
    case OP_GUH: return (const void *)k_op<OP_GUH, B>;
    case OP_DN: return (const void *)k_op<OP_DN, B>;
    default: return (const void *)k_op<OP_LM, B>;
    }
}
static int g_launch1; /* queue_launch_token takes the 1-block-an-SM kernels */
static const void *op_kernel(int op) { return g_launch1 ? op_kernel_b<1>(op) : op_kernel_b<2>(op); }
static void queue_launch_token(const Net &n, int s0, cudaStream_t st) {
    for (int s = s0; s < s0 + n.L; s++)
        for (int op = 0; op < (n.V && s % n.L == n.L - 1 ? NOPX : NOP); op++) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)op_tasks(n, op, n.nch)), cfg.blockDim = dim3(TH), cfg.dynamicSmemBytes = SMEM_BYTES, cfg.stream = st;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at, cfg.numAttrs = 1;
            int ss = s;
            void *args[] = {(void *)&n, &ss};
            CK(cudaLaunchKernelExC(&cfg, op_kernel(op), args));
        }
}
static Net *g_dnet; /* the device copy k_persist reads */
static void launch_persist(const Net &n, int s0, int ns, cudaStream_t st) {
    int a = s0, b = ns;
    int p = -1; /* (Net's P) */
    void *args[] = {(void *)&g_dnet, &a, &b, &p};
    CK(cudaLaunchCooperativeKernel((const void *)k_persist, dim3((unsigned)n.G), dim3(TH), args, PSMEM_BYTES, st));
}
static unsigned err_flag(const Net &n) {
    unsigned e = 0;
    CK(cudaMemcpy(&e, CN(n, C_ERR), sizeof e, cudaMemcpyDeviceToHost));
    return e;
}
static void reset_state(const Net &n, cudaStream_t st) {
    CK(cudaStreamSynchronize(st));
    k_fill_f<<<8, 256, 0, st>>>(n.h, H, SEED_H0, 0.0f, 1.0f);
    CK(cudaMemsetAsync(n.cnt, 0, (size_t)C_N * 32 * sizeof(unsigned), st));
    if (n.toks) CK(cudaMemsetAsync(n.toks, 0xff, (size_t)n.ntoks * sizeof(int), st)); /* no arm's tokens left for the next */
    CK(cudaStreamSynchronize(st));
}
static int g_glaunch, g_gpersist, g_sms; /* blocks of the launch arm's waves, of the persistent kernel; the SMs */
enum { A_LAUNCH, A_LAUNCH1, A_PERSIST, A_PTOK, A_NOPF, A_NOEXP, A_L2, A_L2LAUNCH, A_SMEM, A_SMEML2, A_NODEP, NARM };
static const char *arm_nm[NARM] = {"launch", "launch-1", "persist", "persist-tok", "persist-nopf", "persist-noexp", "persist-l2", "launch-l2",
                                   "persist-smem", "persist-smem-l2", "persist-nodep"};
/* tokens of arm a from the initial state; the time of the last of reps runs (ms, best), h after them into hout */
static float run_arm(Net n, int arm, int tokens, int reps, cudaStream_t st, float *hout, float *hfin, int *toks) {
    n.pf = arm != A_NOPF, n.pexp = arm != A_NOEXP, n.nodep = arm == A_NODEP, n.l2pf = arm == A_L2 || arm == A_L2LAUNCH || arm == A_SMEML2;
    n.smw = arm == A_SMEM || arm == A_SMEML2;
    decompose(n, arm == A_LAUNCH || arm == A_L2LAUNCH ? g_glaunch : arm == A_LAUNCH1 ? g_sms : g_gpersist);
    CK(cudaMemcpy(g_dnet, &n, sizeof n, cudaMemcpyHostToDevice));
    g_launch1 = arm == A_LAUNCH1;
    cudaGraphExec_t ge = NULL;
    if (arm == A_LAUNCH || arm == A_LAUNCH1 || arm == A_L2LAUNCH) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        queue_launch_token(n, 0, st); /* the steps' numbers matter only modulo L in this arm (tickets count modulo) */
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
    }
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < reps; r++) {
        reset_state(n, st);
        CK(cudaEventRecord(a, st));
        if (ge)
            for (int t = 0; t < tokens; t++) CK(cudaGraphLaunch(ge, st));
        else if (arm == A_PTOK)
            for (int t = 0; t < tokens; t++) launch_persist(n, t * n.L, n.L, st);
        else launch_persist(n, 0, tokens * n.L, st);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaGetLastError());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
        if (err_flag(n)) {
            printf("arm %-13s TIMEOUT: a wait lasted ~2 s (deadlock or a lost counter)\n", arm_nm[arm]);
            best = -1.0f;
            break;
        }
    }
    CK(cudaMemcpy(hout, n.h, H * sizeof(float), cudaMemcpyDeviceToHost));
    if (n.V) {
        CK(cudaMemcpy(hfin, n.hfin, H * sizeof(float), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(toks, n.toks, (size_t)tokens * sizeof(int), cudaMemcpyDeviceToHost));
    }
    if (ge) CK(cudaGraphExecDestroy(ge));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return best;
}
/* The timeline of one token (the middle one of `tokens`) in the launch arm (its graph, then one graph with the marks)
 * or the persistent arm (one launch): per layer and op, from the moment token's first QKV wait returned, when the op's
 * first task began, its first and last waits returned, its last task ended (us). */
static void run_timeline(Net n, int arm, int tokens, cudaStream_t st) {
    n.pf = 1, n.pexp = 1, n.nodep = 0, n.l2pf = 0, n.smw = 0;
    g_launch1 = 0;
    decompose(n, arm == A_LAUNCH ? g_glaunch : g_gpersist);
    unsigned long long init[MAXL * (NOPX * 4 + TA_N * 2)];
    for (int i = 0; i < MAXL * NOPX; i++) init[4 * i] = init[4 * i + 1] = ~0ull, init[4 * i + 2] = init[4 * i + 3] = 0;
    for (int i = n.L * NOPX * 4; i < MAXL * (NOPX * 4 + TA_N * 2); i += 2) init[i] = ~0ull, init[i + 1] = 0; /* the points' (from L x NOPX x 4) */
    CK(cudaMemcpy(n.ts, init, sizeof init, cudaMemcpyHostToDevice));
    reset_state(n, st);
    if (arm == A_LAUNCH) {
        cudaGraphExec_t ge[2];
        for (int k = 0; k < 2; k++) {
            n.ts_on = k, n.ts_tok = 0;
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            queue_launch_token(n, 0, st);
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge[k], g, 0));
            CK(cudaGraphDestroy(g));
        }
        for (int t = 0; t < tokens / 2; t++) CK(cudaGraphLaunch(ge[0], st));
        CK(cudaGraphLaunch(ge[1], st));
        CK(cudaStreamSynchronize(st));
        CK(cudaGraphExecDestroy(ge[0]));
        CK(cudaGraphExecDestroy(ge[1]));
    } else {
        n.ts_on = 1, n.ts_tok = tokens / 2;
        CK(cudaMemcpy(g_dnet, &n, sizeof n, cudaMemcpyHostToDevice));
        launch_persist(n, 0, tokens * n.L, st);
        CK(cudaStreamSynchronize(st));
    }
    CK(cudaGetLastError());
    unsigned long long ts[MAXL * (NOPX * 4 + TA_N * 2)];
    CK(cudaMemcpy(ts, n.ts, sizeof ts, cudaMemcpyDeviceToHost));
    static const char *opn[NOPX] = {"qkv", "attn", "o", "router", "gateup", "down", "lmhead"};
    const double t0 = (double)ts[(0 * NOPX + OP_QKV) * 4 + 1];
    const int last = n.V ? OP_LM : OP_DN;
    for (int l = 0; l < n.L; l++)
        for (int op = 0; op < (l == n.L - 1 ? last + 1 : NOP); op++) {
            const unsigned long long *p = ts + ((size_t)l * NOPX + op) * 4;
            printf("ts %-7s layer %d %-6s began %8.2f  ready %8.2f .. %8.2f  ended %8.2f us\n", arm_nm[arm], l, opn[op], (p[0] - t0) / 1e3, (p[1] - t0) / 1e3,
                   (p[2] - t0) / 1e3, (p[3] - t0) / 1e3);
        }
    static const char *tan_[TA_N] = {"q ready", "rows in", "part out", "ticket", "combined"};
    for (int l = 0; l < n.L; l++) { /* inside the attention's tasks: the first and the last task past each point */
        printf("ts %-7s layer %d attn  ", arm_nm[arm], l);
        for (int k = 0; k < TA_N; k++) {
            const unsigned long long *p = ts + (size_t)n.L * NOPX * 4 + ((size_t)l * TA_N + k) * 2;
            printf(" %s %.2f..%.2f", tan_[k], (p[0] - t0) / 1e3, (p[1] - t0) / 1e3);
        }
        printf(" us\n");
    }
    const double down = (ts[((size_t)(n.L - 1) * NOPX + OP_DN) * 4 + 3] - t0) / 1e3, end = (ts[((size_t)(n.L - 1) * NOPX + last) * 4 + 3] - t0) / 1e3;
    printf("ts %-7s token: %.2f us from the first layer's input to the last layer's output (%.2f us a layer), %.2f us to the next token's row\n",
           arm_nm[arm], down, down / n.L, end);
}
/* rows [off, off + n) of the hashed tensor seed (a part of it: q of W_qkv, an expert of W_g) */
static uint16_t *alloc_w(size_t n, uint32_t seed, size_t off = 0) {
    uint16_t *p = NULL;
    CK(cudaMalloc(&p, n * 2));
    k_fill_w<<<1024, 256>>>(p, n, seed, off);
    return p;
}
/* layer l's NE experts: each part (gate, up, down) in a slab of its own, expert e in slot expert_slot(e) (not in order,
 * as in the backend's expert cache), and the device table of their pointers ([NE][3], dec_layers.h) */
static void alloc_experts(int l, LW *lw) {
    static const uint16_t *tab[3 * NE];
    const size_t sz = (size_t)IE * H;
    for (int p = 0; p < 3; p++) {
        uint16_t *slab = NULL;
        CK(cudaMalloc(&slab, NE * sz * 2));
        for (int e = 0; e < NE; e++) {
            uint16_t *q = slab + (size_t)expert_slot(e) * sz;
            k_fill_w<<<256, 256>>>(q, sz, seed_of(l, p == 0 ? S_G : p == 1 ? S_U : S_D), (size_t)e * sz);
            tab[3 * e + p] = q;
        }
    }
    uint8_t *d = NULL;
    CK(cudaMalloc(&d, sizeof tab));
    CK(cudaMemcpy(d, tab, sizeof tab, cudaMemcpyHostToDevice));
    lw->etab = d, lw->estride = (int)sizeof tab[0];
}
static float *alloc_f(size_t n, uint32_t seed, float base, float amp) {
    float *p = NULL;
    CK(cudaMalloc(&p, n * 4));
    k_fill_f<<<256, 256>>>(p, n, seed, base, amp);
    return p;
}

int main(int argc, char **argv) {
    const int T = arg_int(argc, argv, 1, 256, "tokens"), L = arg_int(argc, argv, 2, 4, "layers"), P = arg_int(argc, argv, 3, 640, "positions"),
              V = arg_int(argc, argv, 4, 8000, "vocabulary");
    const char *golden = argc > 5 ? argv[5] : NULL; /* one token by transformers (tests/tools/layer_bench_golden.py) */
    if (T < 1 || T > 100000 || L < 1 || L > MAXL || P < 1 || P > 32768 || V < 0 || V > 1 << 20)
        return fprintf(stderr, "layer_bench: tokens 1..100000, layers 1..%d, cached positions 1..32768, vocabulary 0..%d (got %d %d %d %d)\n", MAXL,
                       1 << 20, T, L, P, V),
               2;
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    const int SM = pr.multiProcessorCount;
    CK(cudaFuncSetAttribute((const void *)k_persist, cudaFuncAttributeMaxDynamicSharedMemorySize, PSMEM_BYTES));
    for (int op = 0; op < NOPX; op++) {
        CK(cudaFuncSetAttribute(op_kernel_b<1>(op), cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
        CK(cudaFuncSetAttribute(op_kernel_b<2>(op), cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    }
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_persist, TH, PSMEM_BYTES));
    if (occ < 1) return fprintf(stderr, "layer_bench: the persistent kernel fits no SM\n"), 1;
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, k_persist));
    const double floor_gbs = read_floor_gbs(SM);
    Net n;
    memset(&n, 0, sizeof n);
    int occl = 0;
    for (int op = 0; op < NOPX; op++) { /* the launch arm's blocks an SM: the least of its kernels' */
        int o = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, op_kernel_b<2>(op), TH, SMEM_BYTES));
        occl = op == 0 || o < occl ? o : occl;
    }
    if (occl < 1) return fprintf(stderr, "layer_bench: a launch arm kernel fits no SM\n"), 1;
    g_glaunch = SM * occl, g_gpersist = SM * occ, g_sms = SM;
    if (g_glaunch > 64 * TOPK || g_gpersist > 64 * TOPK) return fprintf(stderr, "layer_bench: more than 64 down row ranges (tickets)\n"), 1;
    n.L = L, n.P = P, n.nch = (P + 1 + CH - 1) / CH, n.dbg_n = L, n.V = V, n.ntoks = T;
    n.eps = EPS, n.scale = (float)(1.0 / sqrt((double)HD_));
    size_t wbytes = 0;
    LW hl[MAXL];
    for (int l = 0; l < L; l++) {
        hl[l].wq = alloc_w((size_t)QR * H, seed_of(l, S_QKV));
        hl[l].wk = alloc_w((size_t)KR * H, seed_of(l, S_QKV), (size_t)QR * H);
        hl[l].wv = alloc_w((size_t)KR * H, seed_of(l, S_QKV), (size_t)(QR + KR) * H);
        hl[l].wo = alloc_w((size_t)H * QR, seed_of(l, S_O));
        hl[l].wr = alloc_w((size_t)NE * H, seed_of(l, S_R));
        alloc_experts(l, &hl[l]);
        hl[l].n1 = alloc_f(H, seed_of(l, S_N1), 1.0f, 0.125f);
        hl[l].n2 = alloc_f(H, seed_of(l, S_N2), 1.0f, 0.125f);
        hl[l].qn = alloc_f(HD_, seed_of(l, S_QN), 1.0f, 0.125f);
        hl[l].kn = alloc_f(HD_, seed_of(l, S_KN), 1.0f, 0.125f);
        float *kv = NULL;
        CK(cudaMalloc(&kv, (size_t)(P + 1) * 2 * KR * 4));
        k_fill_kv<<<256, 256>>>(kv, (size_t)(P + 1) * 2 * KR, seed_of(l, S_KC), seed_of(l, S_VC));
        hl[l].kv = kv;
    }
    if (V) {
        n.wlm = alloc_w((size_t)V * H, seed_of(MAXL, S_LM)), n.emb = alloc_w((size_t)V * H, seed_of(MAXL, S_EMB));
        n.nf = alloc_f(H, seed_of(MAXL, S_NF), 1.0f, 0.125f);
    }
    CK(cudaMalloc(&n.bestv, 1024 * sizeof(float)));
    CK(cudaMalloc(&n.besti, 1024 * sizeof(int)));
    CK(cudaMalloc(&n.hfin, H * sizeof(float)));
    CK(cudaMalloc(&n.lgv, (size_t)(V ? V : 1) * sizeof(float)));
    CK(cudaMalloc(&n.toks, (size_t)T * sizeof(int)));
    const size_t lmbytes = (size_t)V * H * 2; /* the token's lm_head (its embedding row: 4 KB, not counted) */
    LW *dl = NULL;
    CK(cudaMalloc(&dl, sizeof hl));
    CK(cudaMemcpy(dl, hl, sizeof hl, cudaMemcpyHostToDevice));
    n.lw = dl;
    wbytes = 2 * ((size_t)QKV * H + (size_t)H * QR + (size_t)NE * H + (size_t)TOPK * 3 * IE * H); /* a layer's weight bytes read */
    const size_t cbytes = (size_t)P * KR * 2 * 4;                                                /* its cached rows */
    float cs[HD_], *dcs = NULL;
    rope_table(P, cs);
    CK(cudaMalloc(&dcs, sizeof cs));
    CK(cudaMemcpy(dcs, cs, sizeof cs, cudaMemcpyHostToDevice));
    n.cs = dcs;
    CK(cudaMalloc(&n.h, H * 4));
    CK(cudaMalloc(&n.qkv, QKV * 4));
    CK(cudaMalloc(&n.part, (size_t)NKV * n.nch * 8 * KS * 4));
    CK(cudaMalloc(&n.att, QR * 4));
    CK(cudaMalloc(&n.lg, NE * 4));
    CK(cudaMalloc(&n.act, TOPK * IE * 4));
    CK(cudaMalloc(&n.dy, (size_t)TOPK * H * 4));
    CK(cudaMalloc(&n.ids_dbg, (size_t)MAXL * TOPK * sizeof(int)));
    CK(cudaMalloc(&n.cnt, (size_t)C_N * 32 * sizeof(unsigned)));
    CK(cudaMalloc(&g_dnet, sizeof(Net)));
    CK(cudaMalloc(&n.ts, (size_t)MAXL * (NOPX * 4 + TA_N * 2) * sizeof(unsigned long long)));
    CK(cudaDeviceSynchronize());
    printf("device: %s, %d SMs, L2 %d MiB; persistent blocks an SM %d (%d registers a thread, %d B shared), launch arm blocks an SM %d\n", pr.name, SM,
           pr.l2CacheSize >> 20, occ, fa.numRegs, PSMEM_BYTES, occl);
    decompose(n, g_glaunch);
    print_tasks(n, "launch");
    decompose(n, g_gpersist);
    print_tasks(n, "persist");
    printf("HBM read floor %.1f GB/s; a layer reads %.1f MB of weights (%.2f us at the floor) + %.2f MB of cache; a token %d layers + a %d-id "
           "lm_head: %.1f MB (%.2f us)\n",
           floor_gbs, wbytes / 1e6, wbytes / (floor_gbs * 1e3), cbytes / 1e6, L, V, (L * wbytes + lmbytes) / 1e6, (L * wbytes + lmbytes) / (floor_gbs * 1e3));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    /* one token through every arm against the host's double-precision forward */
    static double href[H];
    int rids[TOPK * MAXL], dids[TOPK * MAXL], rtok = -1;
    ref_forward(L, P, V, NULL, href, rids, &rtok);
    int ok = 1;
    static float h1[NARM][H], f1[NARM][H];
    for (int arm = 0; arm < NARM; arm++) {
        if (arm == A_NODEP) continue; /* its results are garbage by design */
        CK(cudaMemset(n.ids_dbg, 0xff, (size_t)MAXL * TOPK * sizeof(int)));
        int tok = -1;
        const float ms = run_arm(n, arm, 1, 1, st, h1[arm], f1[arm], &tok);
        CK(cudaMemcpy(dids, n.ids_dbg, (size_t)L * TOPK * sizeof(int), cudaMemcpyDeviceToHost));
        int same_ids = 1;
        for (int i = 0; i < L * TOPK; i++) same_ids &= dids[i] == rids[i];
        const float *hl_ = V ? f1[arm] : h1[arm]; /* h after the layers (with a vocabulary, h is the next token's row) */
        const double e = rel_l2(hl_, href);
        const int bits = !memcmp(h1[arm], h1[0], sizeof h1[0]) && !memcmp(hl_, V ? f1[0] : h1[0], sizeof h1[0]);
        const int good = ms >= 0 && e < 1e-4 && same_ids && tok == rtok && (arm == 0 || bits);
        printf("check %-15s one token: rel L2 vs the host %.3g, experts %s, next token %d (host %d), bits %s  %s\n", arm_nm[arm], e,
               same_ids ? "equal" : "DIFFER", tok, rtok, arm == 0 ? "(the reference arm)" : bits ? "equal to launch" : "DIFFER from launch", good ? "ok" : "FAILED");
        ok &= good;
    }
    if (golden) { /* the launch arm's first token (every other arm is bit-equal to it) against transformers */
        const int rt[2] = {rtok, rtok};
        ok &= golden_check(golden, L, P, V, 1, V ? f1[0] : h1[0], h_last_in(1, rt), rt, rids);
    }
    /* the timed runs */
    static float hT[NARM][H], fT[NARM][H];
    double pct[NARM] = {0};
    std::vector<int> toks0(T), toks(T);
    for (int arm = 0; arm < NARM; arm++) {
        const float ms = run_arm(n, arm, T, 3, st, hT[arm], fT[arm], arm ? toks.data() : toks0.data());
        if (ms < 0) {
            ok = 0;
            continue;
        }
        const double us_tok = ms * 1e3 / T, tbytes = (double)L * wbytes + lmbytes, gbs = tbytes / (us_tok * 1e3);
        pct[arm] = 100.0 * gbs / floor_gbs;
        const int hsame = !memcmp(hT[arm], hT[0], sizeof hT[0]) && (!V || !memcmp(fT[arm], fT[0], sizeof fT[0]));
        int tdiff = -1; /* the first token that differs from the launch arm's (every arm's tokens recorded, one a token) */
        for (int i = 0; V && i < T && tdiff < 0; i++)
            if ((arm ? toks : toks0)[i] != toks0[i] || toks0[i] < 0) tdiff = i;
        const int same = arm == A_NODEP || (hsame && tdiff < 0);
        char why[96] = "";
        if (!same) snprintf(why, sizeof why, " (%s%s%d)", hsame ? "" : "h bits differ; ", "first token differing or unwritten: ", tdiff);
        printf("arm %-15s %d tokens x %d layers%s: %8.2f us a token, %7.1f GB/s of its weights = %5.1f%% of the floor (with the cache %5.1f%%)  %s%s\n",
               arm_nm[arm], T, L, V ? " + lm_head" : "", us_tok, gbs, 100.0 * gbs / floor_gbs, 100.0 * (tbytes + (double)L * cbytes) / (us_tok * 1e3) / floor_gbs,
               arm == A_NODEP ? "(no waits: streaming alone, results not checked)" : same ? "bits and tokens ok" : "BITS OR TOKENS DIFFER from launch", why);
        ok &= same;
    }
    printf("summary (%% of the floor, weight bytes a token): launch %.1f, launch-1 %.1f, persist %.1f, persist-tok %.1f, persist-smem %.1f, "
           "persist-l2 %.1f, persist-smem-l2 %.1f, persist-nodep %.1f (streaming alone)\n",
           pct[A_LAUNCH], pct[A_LAUNCH1], pct[A_PERSIST], pct[A_PTOK], pct[A_SMEM], pct[A_L2], pct[A_SMEML2], pct[A_NODEP]);
    run_timeline(n, A_LAUNCH, T, st);
    run_timeline(n, A_PERSIST, T, st);
    printf("%s\n", ok ? "layer_bench: ok" : "layer_bench: FAILED");
    return ok ? 0 : 1;
}
#else /* ---- SIMT_EMU: the same kernels on the CPU (simt_emu.h), one token, checked as on the GPU ---- */
static void fill_w(uint16_t *p, size_t n, uint32_t seed, size_t off = 0) {
    for (size_t i = 0; i < n; i++) p[i] = wbits(seed, (uint32_t)(off + i));
}
static void fill_f(float *p, size_t n, uint32_t seed, float base, float amp) {
    for (size_t i = 0; i < n; i++) p[i] = fval(seed, (uint32_t)i, base, amp);
}
template <class T> static T *zal(size_t n) { return (T *)calloc(n ? n : 1, sizeof(T)); }
/* layer l's NE experts, each part in a slab in slots out of order, and the table of their pointers (as on the GPU) */
static void emu_experts(int l, LW *lw) {
    const size_t sz = (size_t)IE * H;
    const uint16_t **tab = zal<const uint16_t *>(3 * NE);
    for (int p = 0; p < 3; p++) {
        uint16_t *slab = zal<uint16_t>(NE * sz);
        for (int e = 0; e < NE; e++) {
            uint16_t *q = slab + (size_t)expert_slot(e) * sz;
            fill_w(q, sz, seed_of(l, p == 0 ? S_G : p == 1 ? S_U : S_D), (size_t)e * sz), tab[3 * e + p] = q;
        }
    }
    lw->etab = (const uint8_t *)tab, lw->estride = (int)sizeof tab[0];
}
/* one token of L layers through the launch arm (a kernel at a time, every block of it at once) or the persistent
 * kernel (G blocks, one launch), from the initial h; h after it into hout, the chosen experts into ids */
/* tokens (1 or 2) of L layers; h after the last token's layers into hout, its experts into ids, the tokens into tok */
static void emu_token(Net n, int tokens, int persistent, int G, int pexp, int pf, int smw, float *hout, int *ids, int *tok) {
    decompose(n, G);
    n.pexp = pexp, n.pf = pf, n.nodep = 0, n.l2pf = 1, n.smw = smw, n.ts_on = 0;
    fill_f(n.h, H, SEED_H0, 0.0f, 1.0f);
    memset(n.cnt, 0, (size_t)C_N * 32 * sizeof(unsigned));
    memset(n.ids_dbg, 0xff, (size_t)MAXL * TOPK * sizeof(int));
    n.dbg_n = tokens * n.L;
    if (persistent) emu_launch(dim3((unsigned)G), dim3(TH), PSMEM_BYTES, [&] { k_persist(&n, 0, tokens * n.L, -1); });
    else
        for (int s = 0; s < tokens * n.L; s++)
            for (int op = 0; op < (n.V && s % n.L == n.L - 1 ? NOPX : NOP); op++) emu_launch_op(n, op, s);
    memcpy(hout, n.V ? n.hfin : n.h, H * sizeof(float)); /* h after the layers */
    memcpy(ids, n.ids_dbg + (size_t)(tokens - 1) * n.L * TOPK, (size_t)n.L * TOPK * sizeof(int));
    for (int t = 0; t < tokens; t++) tok[t] = n.V ? n.toks[t] : -1;
    if (n.cnt[32 * C_ERR]) fprintf(stderr, "layer_bench (emulated): a wait timed out\n");
}
int main(int argc, char **argv) {
    const int L = arg_int(argc, argv, 1, 1, "layers"), P = arg_int(argc, argv, 2, 640, "positions"), GP = arg_int(argc, argv, 3, 24, "persistent blocks"),
              GL = arg_int(argc, argv, 4, 48, "launch blocks"), V = arg_int(argc, argv, 5, 8000, "vocabulary"), T = arg_int(argc, argv, 6, 2, "tokens");
    if (L < 1 || L > MAXL || P < 1 || P > 32768 || GP < 1 || GP > 512 || GL < 1 || GL > 512 || V < 0 || V > 1 << 20 || T < 1 || T > 2 || (T == 2 && !V))
        return fprintf(stderr, "layer_bench (emulated): layers 1..%d, positions 1..32768, blocks 1..512, vocabulary 0..%d, tokens 1..2 (2 with a "
                               "vocabulary) (got %d %d %d %d %d %d)\n",
                       MAXL, 1 << 20, L, P, GP, GL, V, T),
               2;
    Net n;
    memset(&n, 0, sizeof n);
    n.L = L, n.P = P, n.nch = (P + 1 + CH - 1) / CH, n.dbg_n = L, n.V = V, n.ntoks = 1;
    n.eps = EPS, n.scale = (float)(1.0 / sqrt((double)HD_));
    if (V) {
        uint16_t *w;
        float *f;
        n.wlm = w = zal<uint16_t>((size_t)V * H), fill_w(w, (size_t)V * H, seed_of(MAXL, S_LM));
        n.emb = w = zal<uint16_t>((size_t)V * H), fill_w(w, (size_t)V * H, seed_of(MAXL, S_EMB));
        n.nf = f = zal<float>(H), fill_f(f, H, seed_of(MAXL, S_NF), 1.0f, 0.125f);
    }
    n.bestv = zal<float>(1024), n.besti = zal<int>(1024), n.hfin = zal<float>(H), n.toks = zal<int>(2), n.ntoks = 2, n.lgv = zal<float>(V ? V : 1);
    static LW lw[MAXL];
    for (int l = 0; l < L; l++) {
        uint16_t *w;
        float *f;
        lw[l].wq = w = zal<uint16_t>((size_t)QR * H), fill_w(w, (size_t)QR * H, seed_of(l, S_QKV));
        lw[l].wk = w = zal<uint16_t>((size_t)KR * H), fill_w(w, (size_t)KR * H, seed_of(l, S_QKV), (size_t)QR * H);
        lw[l].wv = w = zal<uint16_t>((size_t)KR * H), fill_w(w, (size_t)KR * H, seed_of(l, S_QKV), (size_t)(QR + KR) * H);
        lw[l].wo = w = zal<uint16_t>((size_t)H * QR), fill_w(w, (size_t)H * QR, seed_of(l, S_O));
        lw[l].wr = w = zal<uint16_t>((size_t)NE * H), fill_w(w, (size_t)NE * H, seed_of(l, S_R));
        emu_experts(l, &lw[l]);
        lw[l].n1 = f = zal<float>(H), fill_f(f, H, seed_of(l, S_N1), 1.0f, 0.125f);
        lw[l].n2 = f = zal<float>(H), fill_f(f, H, seed_of(l, S_N2), 1.0f, 0.125f);
        lw[l].qn = f = zal<float>(HD_), fill_f(f, HD_, seed_of(l, S_QN), 1.0f, 0.125f);
        lw[l].kn = f = zal<float>(HD_), fill_f(f, HD_, seed_of(l, S_KN), 1.0f, 0.125f);
        lw[l].kv = f = zal<float>((size_t)(P + 1) * 2 * KR);
        for (size_t i = 0; i < (size_t)(P + 1) * 2 * KR; i++) /* [pos][K | V][KR] */
            f[i] = fval(i % (2 * KR) < KR ? seed_of(l, S_KC) : seed_of(l, S_VC), (uint32_t)(i / (2 * KR) * KR + i % KR), 0.0f, 1.0f);
    }
    static float cs[HD_];
    rope_table(P, cs);
    n.lw = lw, n.cs = cs;
    n.h = zal<float>(H), n.qkv = zal<float>(QKV), n.part = zal<float>((size_t)NKV * n.nch * 8 * KS), n.att = zal<float>(QR), n.lg = zal<float>(NE);
    n.act = zal<float>(TOPK * IE), n.dy = zal<float>((size_t)TOPK * H), n.ids_dbg = zal<int>((size_t)2 * MAXL * TOPK), n.cnt = zal<unsigned>((size_t)C_N * 32);
    n.ts = zal<unsigned long long>((size_t)MAXL * (NOPX * 4 + TA_N * 2));
    static double href[H], h2[H];
    int rids[TOPK * MAXL], rtok[2] = {-1, -1};
    ref_forward(L, P, V, NULL, href, rids, &rtok[0]);
    if (T == 2) { /* the second token: its layers on the first one's embedding row */
        for (int i = 0; i < H; i++) h2[i] = bf2f(wbits(seed_of(MAXL, S_EMB), (uint32_t)((size_t)rtok[0] * H + i)));
        ref_forward(L, P, V, h2, href, rids, &rtok[1]);
    }
    static const struct {
        const char *name;
        int persistent, pexp, pf, smw;
    } arms[] = {{"launch", 0, 1, 1, 0}, {"persist", 1, 1, 1, 0}, {"persist-noexp", 1, 0, 1, 0}, {"persist-nopf", 1, 1, 0, 0}, {"persist-smem", 1, 1, 1, 1}};
    enum { NA = sizeof arms / sizeof arms[0] };
    static float h[NA][H];
    int ok = 1;
    for (int a = 0; a < NA; a++) {
        int ids[TOPK * MAXL], tok[2] = {-1, -1};
        emu_token(n, T, arms[a].persistent, arms[a].persistent ? GP : GL, arms[a].pexp, arms[a].pf, arms[a].smw, h[a], ids, tok);
        int same_ids = 1;
        for (int i = 0; i < L * TOPK; i++) same_ids &= ids[i] == rids[i];
        const double e = T == 2 ? rel_l2_from(h[a], href, h2) : rel_l2(h[a], href);
        const int same_tok = tok[T - 1] == rtok[T - 1] && tok[0] == rtok[0];
        const int bits = !memcmp(h[a], h[0], sizeof h[0]), good = e < 1e-4 && same_ids && same_tok && bits && !n.cnt[32 * C_ERR];
        printf("emulated %-13s (%s %d blocks), %d token(s) of %d layer(s), P %d, vocabulary %d: the last token's rel L2 vs the host %.3g, experts %s, "
               "tokens %d %d (host %d %d), bits %s  %s\n",
               arms[a].name, arms[a].persistent ? "one launch of" : "launches of", arms[a].persistent ? GP : GL, T, L, P, V, e, same_ids ? "equal" : "DIFFER",
               tok[0], tok[1], rtok[0], rtok[1], a == 0 ? "(the reference arm)" : bits ? "equal to launch" : "DIFFER from launch", good ? "ok" : "FAILED");
        ok &= good;
    }
    if (argc > 7) ok &= golden_check(argv[7], L, P, V, T, h[0], h_last_in(T, rtok), rtok, rids);
    printf("%s\n", ok ? "layer_bench (emulated): ok" : "layer_bench (emulated): FAILED");
    return ok ? 0 : 1;
}
#endif /* __CUDACC__ */
#endif
