/* test_backend_cuda.c - backend selection (df_backend_choose: --backend
 * cpu|cuda|auto) in either build, and, in a CUDA build (make CUDA=1, also
 * run by `make cuda-check`), what the CUDA backend refuses before touching
 * a device: GGML block types its kernels do not decode. On a GPU also: cached
 * experts batched into one launch, the narrow one-token launch's bits, and
 * the device-routed MoE (moe_resident / moe_fused / moe_preload) against the
 * host-routed path. The CUDA backend's arithmetic is tested op by op by
 * test_backend_ops --backend cuda on a GPU. */
#include "backend/backend.h"
#include "deltafin.h"
#include "format/gguf.h"
#ifdef DF_CUDA
#include "backend/cuda/cuda.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c, ...) do { if (!(c)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

#ifdef DF_CUDA
static int32_t fbits(float f) { int32_t i; memcpy(&i, &f, 4); return i; }
static uint32_t rng_state = 12345;
static uint32_t rnd(void) { rng_state = rng_state * 1664525u + 1013904223u; return rng_state >> 8; }

/* The device-routed MoE (moe_resident / moe_fused) against the host-routed path on the same device: a layer
 * of E BF16 experts, every part first brought into the VRAM expert cache by products; logits with many ties
 * (a few distinct values) and without; both router kinds. The ids must equal the host route's; each weight
 * must be the host route's or one ulp from it (the exp: see cuda_mm.cu); every expert output row must be
 * bit-equal to the host-routed launches', and the output bit-equal to the host path's combine of those rows
 * by the fused weights (and so to the host path's output wherever the weights are equal); with each gate kind,
 * in 3 launches (round 6: the gate, down products and combine in one) and, every 5th trial with the savings
 * off, in round 4's 5. */
/* The split decode attention (positions in chunks of 64, one launch) with the savings on (round 6: more loads in
 * flight, the combine's parts read in parallel) and off: the same bits, for caches of 1..11 chunks and a last
 * chunk of 1..64 positions; and near the CPU's. */
static void attn_split_checks(void) {
    enum { NH = 8, NKV = 2, HD = 128, TMAX = 700 };
    const df_backend_ops *B = &df_backend_cuda;
    static float q[NH * HD], kv[TMAX * 2 * NKV * HD], o[2][NH * HD], oc[NH * HD];
    for (int i = 0; i < NH * HD; i++) q[i] = (float)((int)(rnd() % 2001) - 1000) / 500.0f;
    for (int i = 0; i < TMAX * 2 * NKV * HD; i++) kv[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    df_act *dq = B->alloc(NH * HD), *dkv = B->alloc(TMAX * 2 * NKV * HD), *dout = B->alloc(NH * HD);
    B->write(dq, q, NH * HD), B->write(dkv, kv, TMAX * 2 * NKV * HD);
    static const int lens[] = {129, 192, 200, 257, 640, 641, 700};
    int bad = 0;
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        df_attn_gqa_args a = {.q = dq, .kv = dkv, .out = dout, .n = 1, .pos0 = lens[li] - 1, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .scale = 0.088f};
        for (int lean = 0; lean < 2; lean++) {
            df_cuda_set_lean(lean);
            B->attn_gqa(&a);
            B->read(o[lean], dout, NH * HD);
        }
        df_cuda_set_lean(1);
        if (memcmp(o[0], o[1], sizeof o[0])) bad++;
        CHECK(!memcmp(o[0], o[1], sizeof o[0]), "attention over %d positions: the savings changed bits", lens[li]);
        df_attn_gqa_args h = a;
        h.q = (const df_act *)q, h.kv = (const df_act *)kv, h.out = (df_act *)oc;
        df_backend_cpu.attn_gqa(&h);
        double d = 0, n2 = 0;
        for (int i = 0; i < NH * HD; i++) d += (double)(o[1][i] - oc[i]) * (o[1][i] - oc[i]), n2 += (double)oc[i] * oc[i];
        CHECK(d <= 1e-10 * n2, "attention over %d positions: rel L2^2 %g against the CPU", lens[li], n2 > 0 ? d / n2 : d);
    }
    printf("test_backend_cuda: split decode attention: %d lengths, %s\n", (int)(sizeof lens / sizeof *lens), bad ? "bits DIFFER with the savings" : "the same bits with and without the savings");
    B->free(dq), B->free(dkv), B->free(dout);
}

/* Round 10 (DELTAFIN_CUDA_LEAN bit 4096): one-token GQA decode attention in one launch over (chunk of 16 positions,
 * or 32 with round 24's blocks of 256 threads, KV head) blocks, against the CPU (rel L2^2 <= 1e-10, and each head's
 * largest output column where it leads by more than 1e-4) and the default mask's launches (the same bound: other
 * sums, so not bit for bit), for q heads per KV head of 1, 3 (padded to 4), 8, 2 and 4 with 256-column heads, caches
 * of 1 to 2,048 positions (one chunk, partial and whole last chunks of either size, the benchmark's 640, round 20's
 * tree combine with a last group of one part, 128 parts); for both block sizes, each set with the tree combine at its
 * default threshold, from 17 parts on, and never (the
 * same bound against the CPU: other sums); one launch of k_attn_dec each; run twice, with
 * the cache's rows read before the programmatic wait (the host read back since the last attention over this cache)
 * and after it (no read between): the same bits. Shapes it does not take (16 q heads per KV head, head_dim 30) run
 * the default launches (no k_attn_dec launch) and stay near the CPU. */
static void attn_dec_checks(int kw, int tree, int th) {
    df_cuda_set_attn_kw(kw); /* round 17: 2 positions a warp (8 a block) as well as 4 */
    df_cuda_set_attn_th(th); /* round 24: blocks of 256 threads (32 positions) as well as 128 (16) */
    df_cuda_set_attn_tree(tree); /* round 20: the parts combined in groups of 16 first from `tree` parts on (0: never) */
    const df_backend_ops *B = &df_backend_cuda;
    enum { TMAX = 2048, MAXQ = 32 * 128, MAXKV = TMAX * 2 * 8 * 256 };
    static const struct { int nh, nkv, hd, takes; } SH[] = {
        {32, 4, 128, 1}, {8, 8, 64, 1}, {12, 4, 64, 1}, {16, 2, 64, 1}, {8, 4, 256, 1}, {12, 3, 256, 1}, {16, 1, 64, 0}, {4, 2, 30, 0},
    };
    /* 769: 49 parts of 16 positions, a last group of one; 513: 33 parts of 16 and 17 of 32, each a last group of one */
    static const int lens[] = {1, 2, 15, 16, 17, 31, 32, 33, 100, 513, 640, 641, 700, 769, 2048};
    static float q[MAXQ], kv[MAXKV], o0[MAXQ], o1[MAXQ], o2[MAXQ], oc[MAXQ];
    const int mask0 = 2926;
    int bad = 0, launches = 0;
    for (size_t si = 0; si < sizeof SH / sizeof *SH; si++) {
        const int NH = SH[si].nh, NKV = SH[si].nkv, HD = SH[si].hd, nq = NH * HD, nkv = TMAX * 2 * NKV * HD;
        for (int i = 0; i < nq; i++) q[i] = (float)((int)(rnd() % 2001) - 1000) / 400.0f;
        for (int i = 0; i < nkv; i++) kv[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
        df_act *dq = B->alloc((size_t)nq), *dkv = B->alloc((size_t)nkv), *d0 = B->alloc((size_t)nq), *d1 = B->alloc((size_t)nq), *d2 = B->alloc((size_t)nq);
        B->write(dq, q, (size_t)nq), B->write(dkv, kv, (size_t)nkv);
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            df_attn_gqa_args a = {.q = dq, .kv = dkv, .out = d0, .n = 1, .pos0 = lens[li] - 1, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .scale = 1.0f / 11.3f};
            df_cuda_set_lean_mask(mask0);
            B->attn_gqa(&a);
            B->read(o0, d0, (size_t)nq);
            df_cuda_set_lean_mask(mask0 | 4096);
            const int64_t l0 = df_cuda_attn_dec_launches();
            a.out = d1, B->attn_gqa(&a); /* the cache last attended before the read above: rows read before the wait */
            a.out = d2, B->attn_gqa(&a); /* no read since: every row read after the wait */
            const int64_t got = df_cuda_attn_dec_launches() - l0;
            launches += (int)got;
            CHECK(got == 2 * SH[si].takes, "decode attention %d/%d x %d over %d positions: %lld k_attn_dec launches, expected %d", NH, NKV, HD, lens[li], (long long)got, 2 * SH[si].takes);
            B->read(o1, d1, (size_t)nq), B->read(o2, d2, (size_t)nq);
            df_cuda_set_lean_mask(-1);
            CHECK(!memcmp(o1, o2, (size_t)nq * sizeof(float)), "decode attention %d/%d x %d over %d positions: the rows read before the wait changed bits", NH, NKV, HD, lens[li]);
            df_attn_gqa_args h = a;
            h.q = (const df_act *)q, h.kv = (const df_act *)kv, h.out = (df_act *)oc;
            df_backend_cpu.attn_gqa(&h);
            double d = 0, dd = 0, n2 = 0;
            for (int i = 0; i < nq; i++) d += (double)(o1[i] - oc[i]) * (o1[i] - oc[i]), dd += (double)(o1[i] - o0[i]) * (o1[i] - o0[i]), n2 += (double)oc[i] * oc[i];
            if (d > 1e-10 * n2 || dd > 1e-10 * n2) bad++;
            CHECK(d <= 1e-10 * n2, "decode attention %d/%d x %d over %d positions (bit 4096): rel L2^2 %g against the CPU", NH, NKV, HD, lens[li], n2 > 0 ? d / n2 : d);
            CHECK(dd <= 1e-10 * n2, "decode attention %d/%d x %d over %d positions: rel L2^2 %g between bit 4096 and mask %d", NH, NKV, HD, lens[li], n2 > 0 ? dd / n2 : dd, mask0);
            for (int hh = 0; hh < NH; hh++) { /* each head's largest column, where it leads clearly */
                const float *c = oc + (size_t)hh * HD, *g = o1 + (size_t)hh * HD;
                int bc = 0, bg = 0;
                for (int i = 1; i < HD; i++) bc = c[i] > c[bc] ? i : bc, bg = g[i] > g[bg] ? i : bg;
                float second = -1e30f;
                for (int i = 0; i < HD; i++)
                    if (i != bc && c[i] > second) second = c[i];
                if (c[bc] - second > 1e-4f * (fabsf(c[bc]) + 1e-3f)) CHECK(bc == bg, "decode attention %d/%d x %d over %d positions, head %d: argmax %d, the CPU's %d", NH, NKV, HD, lens[li], hh, bg, bc);
            }
        }
        B->free(dq), B->free(dkv), B->free(d0), B->free(d1), B->free(d2);
    }
    /* decode steps as the model issues them: qk_norm_rope (bit 256's kernel) writes the new position's K/V cache rows,
     * attention follows at once (launched programmatically: it may start while that kernel runs), the output is read
     * back (the host's wait) before the next step. From the second step on every older row is read before the wait,
     * the newest after it: a row read too early would be stale (the CPU over the read-back cache is the reference). */
    {
        enum { NH = 32, NKV = 4, HD = 128, P0 = 600, STEPS = 8, TT = P0 + STEPS, KD = NKV * HD };
        static float ckv[TT * 2 * KD], cq[NH * HD], ck[KD], cv[KD], ccs[HD], gq[HD], gk[HD], go[NH * HD], gc[NH * HD];
        for (int i = 0; i < TT * 2 * KD; i++) ckv[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
        for (int i = 0; i < HD; i++) gq[i] = 1.0f + (float)((int)(rnd() % 201) - 100) / 400.0f, gk[i] = 1.0f + (float)((int)(rnd() % 201) - 100) / 400.0f;
        df_act *dkv = B->alloc(TT * 2 * KD), *dq = B->alloc(NH * HD), *dk = B->alloc(KD), *dv = B->alloc(KD), *dcs = B->alloc(HD), *dout = B->alloc(NH * HD);
        B->write(dkv, ckv, TT * 2 * KD);
        for (int m = 0; m < 2; m++) {
            const int mask = m ? mask0 | 4096 : mask0;
            const int64_t l0 = df_cuda_attn_dec_launches();
            double worst = 0;
            for (int st = 0; st < STEPS; st++) {
                const int p = P0 + st;
                for (int i = 0; i < NH * HD; i++) cq[i] = (float)((int)(rnd() % 2001) - 1000) / 400.0f;
                for (int i = 0; i < KD; i++) ck[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f, cv[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
                for (int i = 0; i < HD / 2; i++) ccs[2 * i] = cosf(0.01f * (float)(p * (i + 1))), ccs[2 * i + 1] = sinf(0.01f * (float)(p * (i + 1)));
                B->write(dq, cq, NH * HD), B->write(dk, ck, KD), B->write(dv, cv, KD), B->write(dcs, ccs, HD);
                df_cuda_set_lean_mask(mask);
                df_qk_norm_rope_args r = {dq, dk, gq, gk, 1, NH, NKV, HD, HD, 1e-6f, dcs, 0, dv, DF_AT(dkv, (size_t)p * 2 * KD), DF_AT(dkv, (size_t)p * 2 * KD + KD), 2 * KD};
                B->qk_norm_rope(&r);
                df_attn_gqa_args a = {.q = dq, .kv = dkv, .out = dout, .n = 1, .pos0 = p, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .scale = 1.0f / 11.3f};
                B->attn_gqa(&a);
                B->read(go, dout, NH * HD);
                df_cuda_set_lean_mask(-1);
                B->read(cq, dq, NH * HD), B->read(ckv, dkv, (size_t)(p + 1) * 2 * KD);
                df_attn_gqa_args h = a;
                h.q = (const df_act *)cq, h.kv = (const df_act *)ckv, h.out = (df_act *)gc;
                df_backend_cpu.attn_gqa(&h);
                double d = 0, n2 = 0;
                for (int i = 0; i < NH * HD; i++) d += (double)(go[i] - gc[i]) * (go[i] - gc[i]), n2 += (double)gc[i] * gc[i];
                if (n2 > 0 && d / n2 > worst) worst = d / n2;
                CHECK(d <= 1e-10 * n2, "decode step at position %d (mask %d, after qk_norm_rope): rel L2^2 %g against the CPU", p, mask, n2 > 0 ? d / n2 : d);
            }
            const int64_t got = df_cuda_attn_dec_launches() - l0;
            CHECK(got == (m ? STEPS : 0), "decode steps (mask %d): %lld k_attn_dec launches, expected %d", mask, (long long)got, m ? STEPS : 0);
            printf("test_backend_cuda: %d decode steps after qk_norm_rope, mask %d: worst rel L2^2 %.2e against the CPU\n", STEPS, mask, worst);
        }
        B->free(dkv), B->free(dq), B->free(dk), B->free(dv), B->free(dcs), B->free(dout);
    }
    printf("test_backend_cuda: one-launch decode attention (bit 4096, %d positions a warp, %d threads a block, tree combine %s): %d shapes x %d lengths, %d launches, %s\n", kw,
           kw == 2 ? 128 : th, tree < 0 ? "from 48 parts" : tree == 0 ? "never" : "from 17 parts", (int)(sizeof SH / sizeof *SH), (int)(sizeof lens / sizeof *lens), launches,
           bad ? "FAILED" : "near the CPU and the default launches");
    df_cuda_set_attn_kw(0);
    df_cuda_set_attn_th(0);
}

/* K experts per token, I columns of a down row: (4, 128) one warp step per row, (8, 760) the benchmark's three
 * (768 columns of BF16: here 95 16-byte steps, the last one partial) with its 8 experts */
static void fused_moe_checks(const int K, const int I) {
    /* E = 40: the register-resident route (bit 64) holds experts lane and lane + 32 */
    enum { E = 40, KM = 8, D = 256, IM = 768, LAYER = 5, TRIALS = 60 };
    CHECK(K <= KM && I <= IM, "fused_moe_checks(%d, %d): the test's arrays hold K <= %d, I <= %d", K, I, KM, IM);
    const df_backend_ops *B = &df_backend_cuda;
    CHECK(B->moe_resident && B->moe_fused, "the CUDA backend offers the device-routed MoE");
    if (!B->moe_resident || !B->moe_fused) return;
    df_cuda_set_memory((int64_t)256 << 20, 0, (int64_t)2 * 3 * E * I * D * 2); /* room for two layers */
    static uint16_t wb[E][3][IM * D];
    static float xv[D], lg[E], bias[E], hw[KM], fw[KM], ho[D], fo[D], ro[D], hd[KM * D], fd[KM * D];
    df_weight pw[E][3];
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            for (int i = 0; i < I * D; i++) {
                const float v = (float)((int)(rnd() % 2001) - 1000) / 4096.0f;
                uint32_t u;
                memcpy(&u, &v, 4);
                wb[e][p][i] = (uint16_t)(u >> 16);
            }
            df_weight *w = &pw[e][p];
            memset(w, 0, sizeof *w);
            w->fmt = DF_W_BF16, w->rows = p == 2 ? D : I, w->cols = p == 2 ? I : D, w->data = (const uint8_t *)wb[e][p];
            w->row_bytes = (size_t)w->cols * 2, w->ident = df_expert_ident(LAYER, e, p);
        }
    for (int i = 0; i < D; i++) xv[i] = (float)((int)(rnd() % 1001) - 500) / 256.0f;
    df_act *x = B->alloc(D), *scr = B->alloc(D), *dlg = B->alloc(E), *hwd = B->alloc(K), *fwd = B->alloc(K), *rwd = B->alloc(K);
    df_act *hg = B->alloc(K * I), *hu = B->alloc(K * I), *hdd = B->alloc(K * D), *hout = B->alloc(D);
    df_act *fg = B->alloc(K * I), *fu = B->alloc(K * I), *fdd = B->alloc(K * D), *fout = B->alloc(D), *rout = B->alloc(D), *fids = B->alloc(K);
    B->write(x, xv, D);
    CHECK(B->moe_resident(LAYER, E, K, 1) == 0, "nothing cached: not resident");
    /* every part but the last expert's down projection through a product: still not resident */
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            if (e == E - 1 && p == 2) continue;
            const df_mv_job j = {&pw[e][p], p == 2 ? hg : x, p == 2 ? scr : hg};
            B->matmul_batch(&j, 1, 1);
        }
    B->experts_done();
    CHECK(B->moe_resident(LAYER, E, K, 1) == 2, "one part missing: not resident (a preload offered: the cache has room)");
    {
        const df_mv_job j = {&pw[E - 1][2], hg, scr};
        B->matmul_batch(&j, 1, 1);
        B->experts_done();
    }
    CHECK(B->moe_resident(LAYER, E, K, 1) == 1, "every part cached: resident");
    CHECK(B->moe_resident(LAYER, E, K, 2) == 0, "two tokens: not fused");
    CHECK(B->moe_resident(LAYER + 1, E, K, 1) == 2 && B->moe_resident(LAYER + 1, E, K, 4) == 2, "another layer: not resident (a preload offered, for any n)");
    int ulp1 = 0, nw = 0, mism_ids = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        const int kind = trial % 3; /* 0 softmax + norm, 1 softmax, 2 sigmoid groups */
        const int ties = trial % 2;
        /* the gate kinds (round 6 applies the gate inside the down launch), and every 5th trial with the
         * decode-step savings off (round 4's five launches: gate, down products and combine apart) */
        const df_gate_kind gk = (df_gate_kind)((trial / 3) % DF_GATE_N);
        const float gp0 = gk == DF_GATE_SITU ? 1.5f : 0.0f, gp1 = gk == DF_GATE_SITU ? (trial % 2 ? 2.0f : 0.0f) : 0.0f;
        const int lean = trial % 5 != 4;
        /* round 9: every 5th trial (3, 8, ...) also with bits 1024 and 2048 (the down rows streamed through cp.async) */
        const int r9 = trial % 5 == 3;
        /* round 10: every 5th trial (1, 6, ...) with the default mask and bit 8192 (the route inside the gate/up and down
         * launches: softmax routes only, the sigmoid groups keep the three launches) */
        const int r10 = trial % 5 == 1, rt = r10 && kind != 2;
        /* round 17: every other round-10 trial (6, 16, 36, 46: softmax routes) with bit 268435456 (the gate computed once by
         * the gate/up launch, k_guh_rt; the down launch reads h) */
        const int r17 = trial % 10 == 6, guh = r17 && rt;
        df_cuda_set_lean(lean);
        if (r9) df_cuda_set_lean_mask(511 | 1024 | 2048);
        if (r10) df_cuda_set_lean_mask(2926 | 8192 | (r17 ? 268435456 : 0));
        for (int e = 0; e < E; e++) {
            lg[e] = ties ? (float)((int)(rnd() % 5) - 2) * 0.75f : (float)((int)(rnd() % 200001) - 100000) / 25000.0f;
            bias[e] = ties ? 0.0f : (float)((int)(rnd() % 101) - 50) / 400.0f;
        }
        B->write(dlg, lg, E);
        int hids[KM], fi[KM];
        df_route_args ra = {.kind = kind == 2 ? DF_ROUTE_SIGMOID_GROUPS : DF_ROUTE_SOFTMAX_TOPK, .logits = dlg, .ids = hids, .w = hwd, .n = 1,
                            .n_experts = E, .k = K, .norm_topk = kind != 1, .n_group = 4, .topk_group = 2, .scaling = 2.5f, .bias = bias};
        /* the host-routed path, as ffn.c issues it for one token */
        B->route(&ra);
        df_mv_job jobs[2 * KM];
        for (int k = 0; k < K; k++) {
            jobs[2 * k] = (df_mv_job){&pw[hids[k]][0], x, DF_AT(hg, (size_t)k * I)};
            jobs[2 * k + 1] = (df_mv_job){&pw[hids[k]][1], x, DF_AT(hu, (size_t)k * I)};
        }
        B->matmul_batch(jobs, 2 * K, 1);
        B->gate(hg, hg, hu, (size_t)K * I, gk, gp0, gp1);
        for (int k = 0; k < K; k++) jobs[k] = (df_mv_job){&pw[hids[k]][2], DF_AT(hg, (size_t)k * I), DF_AT(hdd, (size_t)k * D)};
        B->matmul_batch(jobs, K, 1);
        B->experts_done();
        B->moe_combine(hout, hdd, hwd, 1, K, D);
        /* the fused op */
        df_tier_stats s0, s1;
        B->tier_stats(&s0);
        df_moe_fused_args fa = {.route = ra, .layer = LAYER, .x = x, .out = fout, .g = fg, .u = fu, .d = fdd, .D = D, .I = I, .gate = gk,
                                .p0 = gp0, .p1 = gp1, .ids_out = fids};
        fa.route.ids = NULL, fa.route.w = fwd;
        const int64_t l0 = df_cuda_moe_launches(), rf0 = df_cuda_route_fast_launches(), pd0 = df_cuda_pdl_launches(),
                      sh0 = df_cuda_moe_down_sh_launches(), cp0 = df_cuda_moe_down_cp_launches(), rt0 = df_cuda_moe_rt_launches(),
                      gh0 = df_cuda_moe_guh_launches();
        int rc = B->moe_fused(&fa);
        const int64_t launches = df_cuda_moe_launches() - l0, fast = df_cuda_route_fast_launches() - rf0, pdl = df_cuda_pdl_launches() - pd0,
                      sh = df_cuda_moe_down_sh_launches() - sh0, dcp = df_cuda_moe_down_cp_launches() - cp0, rtl = df_cuda_moe_rt_launches() - rt0,
                      ghl = df_cuda_moe_guh_launches() - gh0;
        B->tier_stats(&s1);
        df_cuda_set_lean(1);
        CHECK(rc == 0, "trial %d: moe_fused rc %d", trial, rc);
        CHECK(launches == (rt ? 2 : lean ? 3 : 5), "trial %d (lean %d, r10 %d): moe_fused in %lld launches, expected %d", trial, lean, r10, (long long)launches, rt ? 2 : lean ? 3 : 5);
        CHECK(rtl == rt, "trial %d (kind %d, r10 %d): %lld layers with the route inside the product launches, expected %d", trial, kind, r10, (long long)rtl, rt);
        CHECK(ghl == guh, "trial %d (kind %d, r17 %d): %lld layers with the gate applied by the gate/up launch, expected %d", trial, kind, r17, (long long)ghl, guh);
        /* round 7: the softmax routes in the register-resident kernel, and every launch programmatic, with the savings */
        CHECK(fast == (lean && kind != 2 && !rt), "trial %d (kind %d, lean %d): %lld register-resident routes", trial, kind, lean, (long long)fast);
        CHECK(pdl == (lean ? launches : 0), "trial %d (lean %d): %lld of %lld launches programmatic", trial, lean, (long long)pdl, (long long)launches);
        /* bit 128 (in df_cuda_set_lean(1)): the down launch with the gate once per block, the same rows and output bits */
        CHECK(sh == (lean && !r9 && !r10), "trial %d (lean %d): %lld down launches with the gate in shared memory", trial, lean, (long long)sh);
        /* bit 2048 (round 9): the down launch with its rows streamed through cp.async, the same rows and output bits */
        CHECK(dcp == (r9 || (r10 && !rt)), "trial %d (I %d, r9 %d, r10 %d): %lld down launches through cp.async, expected %d", trial, I, r9, r10, (long long)dcp, r9 || (r10 && !rt));
        CHECK(s1.cache_hits - s0.cache_hits == 3 * K, "trial %d: %lld hits counted, expected %d", trial, (long long)(s1.cache_hits - s0.cache_hits), 3 * K);
        float fif[KM];
        B->read(fif, fids, K);
        memcpy(fi, fif, sizeof fi);
        B->read(hw, hwd, K), B->read(fw, fwd, K), B->read(ho, hout, D), B->read(fo, fout, D), B->read(hd, hdd, K * D), B->read(fd, fdd, K * D);
        int same_w = 1;
        for (int k = 0; k < K; k++) {
            if (fi[k] != hids[k]) mism_ids++;
            CHECK(fi[k] == hids[k], "trial %d (kind %d, ties %d): id %d: device %d, host %d", trial, kind, ties, k, fi[k], hids[k]);
            const int32_t d = fbits(fw[k]) - fbits(hw[k]);
            nw++;
            if (d) ulp1++, same_w = 0;
            CHECK(d >= -1 && d <= 1, "trial %d (kind %d): weight %d: device %a, host %a", trial, kind, k, fw[k], hw[k]);
        }
        CHECK(!memcmp(fd, hd, (size_t)K * D * sizeof(float)), "trial %d (I %d, kind %d, gate %d, lean %d, r9 %d): an expert output row differs from the host-routed launches' (r10 %d)",
              trial, I, kind, (int)gk, lean, r9, r10);
        B->write(rwd, fw, K);
        B->moe_combine(rout, hdd, rwd, 1, K, D);
        B->read(ro, rout, D);
        CHECK(!memcmp(fo, ro, sizeof fo), "trial %d (kind %d): the output is not the combine of the host-routed rows by the device weights", trial, kind);
        if (same_w) CHECK(!memcmp(fo, ho, sizeof fo), "trial %d (kind %d): equal weights, different output", trial, kind);
    }
    printf("test_backend_cuda: device-routed MoE (K %d, I %d): %d trials, ids %s, %d of %d weights one ulp from the host route's (the rest equal)\n", K, I,
           TRIALS, mism_ids ? "DIFFER" : "equal", ulp1, nw);
    /* preload: a second layer of the same bytes, never routed: the cache has room, so moe_resident offers a
     * preload (2, once), after which the layer is resident and its fused output is the first layer's */
    {
        static df_weight pw2[E][3];
        memcpy(pw2, pw, sizeof pw2);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) pw2[e][p].ident = df_expert_ident(LAYER + 2, e, p);
        CHECK(B->moe_resident(LAYER + 2, E, K, 1) == 2, "a layer with room for its experts: preload offered");
        CHECK(B->moe_preload && B->moe_preload(&pw2[0][0], 3 * E) == 0, "moe_preload");
        CHECK(B->moe_resident(LAYER + 2, E, K, 2) == 0, "after the preload, two tokens: not fused");
        CHECK(B->moe_resident(LAYER + 2, E, K, 1) == 1, "after the preload: resident");
        df_moe_fused_args fa = {.route = {.kind = DF_ROUTE_SOFTMAX_TOPK, .logits = dlg, .w = fwd, .n = 1, .n_experts = E, .k = K, .norm_topk = 1},
                                .layer = LAYER, .x = x, .out = fout, .g = fg, .u = fu, .d = fdd, .D = D, .I = I, .gate = DF_GATE_SILU};
        CHECK(B->moe_fused(&fa) == 0, "fused, first layer");
        B->read(fo, fout, D);
        fa.layer = LAYER + 2, fa.out = rout;
        CHECK(B->moe_fused(&fa) == 0, "fused, preloaded layer");
        B->read(ro, rout, D);
        CHECK(!memcmp(fo, ro, sizeof fo), "the preloaded layer (same bytes) gives the first layer's output");
    }
    /* a shape the launch cannot take (the down projection is not [D x I]): declined, nothing done */
    df_moe_fused_args bad = {.route = {.kind = DF_ROUTE_SOFTMAX_TOPK, .logits = dlg, .w = fwd, .n = 1, .n_experts = E, .k = K, .norm_topk = 1},
                             .layer = LAYER, .x = x, .out = fout, .g = fg, .u = fu, .d = fdd, .D = D, .I = I / 2, .gate = DF_GATE_SILU};
    CHECK(B->moe_fused(&bad) == 1, "a shape mismatch is declined");
    B->tier_reset();
    CHECK(B->moe_resident(LAYER, E, K, 1) == 0, "after tier_reset: not resident");
    /* a model of 100 such layers under a budget that holds about 80: a layer with room for its missing part
     * is NOT offered a preload (later layers' misses would evict the preloaded parts first) */
    {
        enum { LAYERS = 100 };
        df_cuda_set_memory((int64_t)256 << 20, 0, (int64_t)LAYERS * 3 * E * I * D * 2);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) {
                if (e == E - 1 && p == 2) continue;
                const df_mv_job j = {&pw[e][p], p == 2 ? hg : x, p == 2 ? scr : hg};
                B->matmul_batch(&j, 1, 1);
            }
        B->experts_done();
        df_tier_stats ts;
        B->tier_stats(&ts);
        CHECK(ts.cache_slots > 0 && ts.cache_slots < (int64_t)LAYERS * 3 * E, "the cache holds part of the model (%lld slots, %d parts)",
              (long long)ts.cache_slots, LAYERS * 3 * E);
        CHECK(B->moe_resident(LAYER, E, K, 1) == 0, "the model's experts do not all fit the cache: no preload offered (got %d)",
              B->moe_resident(LAYER, E, K, 1));
        B->tier_reset();
        df_cuda_set_memory((int64_t)256 << 20, 0, (int64_t)2 * 3 * E * I * D * 2);
    }
    df_act *all[] = {x, scr, dlg, hwd, fwd, rwd, hg, hu, hdd, hout, fg, fu, fdd, fout, rout, fids};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) B->free(all[i]);
}

/* Round 17: the device-routed MoE as the model chains it, layer after layer with nothing read back in between (router
 * product, moe_fused, add_rmsnorm, the next layer's router reading that output, ...: every launch programmatic, the
 * g / u / h scratch and the logits shared by the layers), under the default mask without bit 268435456 (round 15's)
 * and with it (the gate computed once by the gate/up launch, k_guh_rt; in the default since round 18): the final
 * activations must be the same bits. The per-call checks
 * above read back after every call; a hazard between one layer's down launch and the next layer's gate/up launch
 * (the same h) shows only in a chain like this one. Two resident layers (moe_preload), 16 steps, alternating. */
static void moe_chain_checks(void) {
    enum { E = 40, K = 8, D = 256, I = 128, LA = 11, LB = 12, STEPS = 16 };
    const df_backend_ops *B = &df_backend_cuda;
    if (!B->moe_fused || !B->moe_preload || !B->add_rmsnorm) return;
    B->tier_reset();
    df_cuda_set_memory((int64_t)256 << 20, 0, (int64_t)2 * 3 * E * I * D * 2);
    static uint16_t wb[E][3][I * D], rb[E * D];
    static float x0[D], r0[D], gam[D], xo[2][D], ro[2][D];
    static df_weight pw[2][E][3];
    df_weight router;
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++)
            for (int i = 0; i < I * D; i++) {
                const float v = (float)((int)(rnd() % 2001) - 1000) / 4096.0f;
                uint32_t u;
                memcpy(&u, &v, 4);
                wb[e][p][i] = (uint16_t)(u >> 16);
            }
    for (int i = 0; i < E * D; i++) {
        const float v = (float)((int)(rnd() % 2001) - 1000) / 256.0f;
        uint32_t u;
        memcpy(&u, &v, 4);
        rb[i] = (uint16_t)(u >> 16);
    }
    memset(&router, 0, sizeof router);
    router.fmt = DF_W_BF16, router.rows = E, router.cols = D, router.data = (const uint8_t *)rb, router.row_bytes = (size_t)D * 2;
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) {
                df_weight *w = &pw[l][e][p];
                memset(w, 0, sizeof *w);
                w->fmt = DF_W_BF16, w->rows = p == 2 ? D : I, w->cols = p == 2 ? I : D, w->data = (const uint8_t *)wb[e][p];
                w->row_bytes = (size_t)w->cols * 2, w->ident = df_expert_ident(l ? LB : LA, e, p);
            }
    for (int i = 0; i < D; i++)
        x0[i] = (float)((int)(rnd() % 1001) - 500) / 256.0f, r0[i] = (float)((int)(rnd() % 1001) - 500) / 128.0f,
        gam[i] = 1.0f + (float)((int)(rnd() % 201) - 100) / 400.0f;
    /* the router and the norm's weights registered, as the model's are: no host copy inside the chain */
    CHECK(B->weight_register(&router) == 0 && router.handle, "chain: router registered");
    CHECK(B->param_register(gam, D) == 0, "chain: norm weights registered");
    df_act *x = B->alloc(D), *res = B->alloc(D), *lg = B->alloc(E), *w = B->alloc(K), *o = B->alloc(D), *g = B->alloc(K * I), *u = B->alloc(K * I),
           *d = B->alloc(K * D);
    for (int l = 0; l < 2; l++) {
        { /* one part through a product first: the expert cache exists from the first expert product on */
            const df_mv_job j = {&pw[l][0][0], x, g};
            B->matmul_batch(&j, 1, 1);
            B->experts_done();
        }
        CHECK(B->moe_resident(l ? LB : LA, E, K, 1) == 2, "chain: layer %d offered a preload", l ? LB : LA);
        CHECK(B->moe_preload(&pw[l][0][0], 3 * E) == 0, "chain: moe_preload of layer %d", l ? LB : LA);
        B->experts_done();
        CHECK(B->moe_resident(l ? LB : LA, E, K, 1) == 1, "chain: layer %d resident", l ? LB : LA);
    }
    int64_t guh[2] = {0, 0};
    for (int m = 0; m < 2; m++) { /* the default mask without bit 268435456, then with it */
        df_cuda_set_lean_mask((df_cuda_lean_default() & ~268435456) | (m ? 268435456 : 0));
        B->write(x, x0, D), B->write(res, r0, D);
        const int64_t gh0 = df_cuda_moe_guh_launches();
        int bad = 0;
        for (int s = 0; s < STEPS; s++) {
            const df_mv_job j = {&router, x, lg};
            B->matmul_batch(&j, 1, 1);
            df_moe_fused_args fa = {.route = {.kind = DF_ROUTE_SOFTMAX_TOPK, .logits = lg, .w = w, .n = 1, .n_experts = E, .k = K, .norm_topk = 1, .scaling = 1.0f},
                                    .layer = s % 2 ? LB : LA, .x = x, .out = o, .g = g, .u = u, .d = d, .D = D, .I = I, .gate = DF_GATE_SILU};
            bad += B->moe_fused(&fa) != 0;
            B->add_rmsnorm(x, res, o, gam, 1, D, 1e-6f);
        }
        B->read(xo[m], x, D), B->read(ro[m], res, D);
        guh[m] = df_cuda_moe_guh_launches() - gh0;
        df_cuda_set_lean_mask(-1);
        CHECK(!bad, "chain (mask %s): %d moe_fused calls declined or failed", m ? "with 268435456" : "without 268435456", bad);
    }
    CHECK(guh[0] == 0 && guh[1] == STEPS, "chain: %lld / %lld gate-once launches, expected 0 / %d", (long long)guh[0], (long long)guh[1], STEPS);
    CHECK(!memcmp(xo[0], xo[1], sizeof xo[0]) && !memcmp(ro[0], ro[1], sizeof ro[0]),
          "chain of %d layers without read-backs: the gate-once launch (bit 268435456) changed bits", STEPS);
    printf("test_backend_cuda: device-routed MoE chained over %d layers with nothing read back: the gate-once launch %s\n", STEPS,
           !memcmp(xo[0], xo[1], sizeof xo[0]) ? "gives the default's bits" : "DIFFERS");
    df_act *all[] = {x, res, lg, w, o, g, u, d};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) B->free(all[i]);
    B->weight_unregister(&router);
    B->tier_reset();
}

/* Round 8's fused row ops (DELTAFIN_CUDA_LEAN bit 256): add_rmsnorm and qk_norm_rope in one launch each with the
 * savings on, giving the bits of the plain ops they stand for (add then rmsnorm; rmsnorm q, rmsnorm k, rope q,
 * rope k) issued on this backend with the same mask; with the savings off the entries issue those plain ops
 * (no fused launch). Rows of 2048 (a Qwen3-30B-A3B hidden row) and 37, heads of 128 and 16, both rotations, a
 * partial rotation, 1 and 5 tokens. */
static float frnd(void) { return (float)((int)(rnd() % 4001) - 2000) / 700.0f; }
static void fused_rows_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    static const int AC[][2] = {{1, 2048}, {5, 2048}, {3, 37}};
    for (size_t ci = 0; ci < sizeof AC / sizeof *AC; ci++)
        for (int lean = 1; lean >= 0; lean--) {
            const int rows = AC[ci][0], cols = AC[ci][1];
            const size_t N = (size_t)rows * cols;
            float *y = malloc(N * 4), *x = malloc(N * 4), *g = malloc((size_t)cols * 4), *r[2][2];
            for (size_t i = 0; i < N; i++) y[i] = frnd(), x[i] = frnd();
            for (int i = 0; i < cols; i++) g[i] = frnd();
            df_cuda_set_lean(lean);
            for (int way = 0; way < 2; way++) { /* 0: the fused entry, 1: the plain ops */
                df_act *dy = B->alloc(N), *dx = B->alloc(N), *dout = B->alloc(N);
                B->write(dy, y, N), B->write(dx, x, N);
                const int64_t f0 = df_cuda_fused_launches();
                if (!way) B->add_rmsnorm(dout, dy, dx, g, rows, cols, 1e-6f);
                else B->add(dy, dx, N), B->rmsnorm(dout, (size_t)cols, dy, (size_t)cols, g, rows, cols, 1e-6f);
                const int64_t f = df_cuda_fused_launches() - f0;
                CHECK(f == (!way && lean), "add_rmsnorm %dx%d (lean %d, way %d): %lld fused launches", rows, cols, lean, way, (long long)f);
                r[way][0] = malloc(N * 4), r[way][1] = malloc(N * 4);
                B->read(r[way][0], dy, N), B->read(r[way][1], dout, N);
                B->free(dy), B->free(dx), B->free(dout);
            }
            CHECK(!memcmp(r[0][0], r[1][0], N * 4) && !memcmp(r[0][1], r[1][1], N * 4), "add_rmsnorm %dx%d (lean %d): bits differ from add + rmsnorm", rows,
                  cols, lean);
            for (int w = 0; w < 2; w++) free(r[w][0]), free(r[w][1]);
            free(y), free(x), free(g);
        }
    static const int QC[][6] = {/* n, nq, nk, hd, rope_dim, interleaved */
                                {1, 32, 4, 128, 128, 0}, {5, 32, 4, 128, 128, 0}, {1, 6, 2, 16, 16, 1}, {3, 6, 2, 16, 10, 0}, {2, 3, 1, 16, 10, 1}};
    for (size_t ci = 0; ci < sizeof QC / sizeof *QC; ci++)
        for (int lean = 1; lean >= 0; lean--) {
            const int n = QC[ci][0], nq = QC[ci][1], nk = QC[ci][2], hd = QC[ci][3], rd = QC[ci][4], il = QC[ci][5];
            const size_t NQ = (size_t)n * nq * hd, NK = (size_t)n * nk * hd, NC = (size_t)n * rd;
            float *q = malloc(NQ * 4), *k = malloc(NK * 4), *gq = malloc((size_t)hd * 4), *gk = malloc((size_t)hd * 4), *cs = malloc(NC * 4);
            for (size_t i = 0; i < NQ; i++) q[i] = frnd();
            for (size_t i = 0; i < NK; i++) k[i] = frnd();
            for (int i = 0; i < hd; i++) gq[i] = frnd(), gk[i] = frnd();
            for (size_t i = 0; i < NC; i++) cs[i] = frnd() / 3;
            const int cache = ci != 2; /* with the K/V cache rows copied (the model's call), and without */
            const size_t KVS = 2 * (size_t)nk * hd + 3, NKV = (size_t)n * KVS; /* cache rows, a stride that is not 2 x the row */
            float *vh = malloc(NK * 4), *r[2][3];
            for (size_t i = 0; i < NK; i++) vh[i] = frnd();
            df_cuda_set_lean(lean);
            for (int way = 0; way < 2; way++) {
                df_act *dq = B->alloc(NQ), *dk = B->alloc(NK), *dc = B->alloc(NC), *dv = B->alloc(NK), *dkv = B->alloc(NKV);
                B->write(dq, q, NQ), B->write(dk, k, NK), B->write(dc, cs, NC), B->write(dv, vh, NK);
                df_qk_norm_rope_args a = {dq, dk, gq, gk, n, nq, nk, hd, rd, 1e-6f, dc, il, NULL, NULL, NULL, 0};
                if (cache) a.v = dv, a.kc = dkv, a.vc = DF_AT(dkv, (size_t)nk * hd), a.kv_stride = KVS;
                const int64_t f0 = df_cuda_fused_launches();
                if (!way) B->qk_norm_rope(&a);
                else {
                    B->rmsnorm(dq, (size_t)hd, dq, (size_t)hd, gq, n * nq, hd, 1e-6f), B->rmsnorm(dk, (size_t)hd, dk, (size_t)hd, gk, n * nk, hd, 1e-6f);
                    B->rope(dq, n, nq, (size_t)nq * hd, (size_t)hd, rd, dc, il), B->rope(dk, n, nk, (size_t)nk * hd, (size_t)hd, rd, dc, il);
                    if (cache) B->copy_rows(a.kc, KVS, dk, (size_t)nk * hd, n, nk * hd), B->copy_rows(a.vc, KVS, dv, (size_t)nk * hd, n, nk * hd);
                }
                const int64_t f = df_cuda_fused_launches() - f0;
                CHECK(f == (!way && lean), "qk_norm_rope case %zu (lean %d, way %d): %lld fused launches", ci, lean, way, (long long)f);
                r[way][0] = malloc(NQ * 4), r[way][1] = malloc(NK * 4), r[way][2] = malloc(NKV * 4);
                B->read(r[way][0], dq, NQ), B->read(r[way][1], dk, NK), B->read(r[way][2], dkv, NKV);
                B->free(dq), B->free(dk), B->free(dc), B->free(dv), B->free(dkv);
            }
            CHECK(!memcmp(r[0][0], r[1][0], NQ * 4) && !memcmp(r[0][1], r[1][1], NK * 4) && !memcmp(r[0][2], r[1][2], NKV * 4),
                  "qk_norm_rope case %zu (lean %d): bits differ from the plain ops", ci, lean);
            if (cache) { /* the cache holds the rotated k and the v rows (and zeros between) */
                int ok = 1;
                for (int t = 0; t < n; t++)
                    for (int i = 0; i < nk * hd; i++)
                        ok &= fbits(r[0][2][t * KVS + i]) == fbits(r[0][1][(size_t)t * nk * hd + i]) && fbits(r[0][2][t * KVS + nk * hd + i]) == fbits(vh[(size_t)t * nk * hd + i]);
                CHECK(ok, "qk_norm_rope case %zu (lean %d): the cache rows are not k and v", ci, lean);
            }
            for (int w = 0; w < 2; w++) free(r[w][0]), free(r[w][1]), free(r[w][2]);
            free(q), free(k), free(gq), free(gk), free(cs), free(vh);
        }
    df_cuda_set_lean(1);
}
/* Round 11 (DELTAFIN_CUDA_LEAN bit 16384): one-token products of spine rows in one balanced wave (k_mm_bal).
 * The same bits as k_mm for the same row split (wk): each group below runs under the default mask, the default
 * | 16384, the default | 16384 | 32768 (the first round's loads before griddepcontrol.wait), and under the default
 * without bit 512 (round 7's split) and that | 16384 | 32768; every result must be bit-equal to its mask's k_mm
 * result and near the CPU's (rel L2^2 <= 1e-10). Each call's x is written by a kernel just before the product
 * (x / 4 uploaded, then `scale` by 4: exact), so a product that read x before griddepcontrol.wait would see x / 4.
 * Groups: the benchmark's q/k/v (3 jobs in one launch: 4096 / 512 / 512 rows of 2048 BF16, wk 2, tasks of 2 rows),
 * o (2048 x 4096, wk 4, tasks of 1 row), the router (128 x 2048), lm_head (8192 x 2048: more tasks than warps in the
 * wave, so warps loop), F32 45 x 1000 (a partial last warp step, a partial last task), F32 64 x 3072 (two rounds a
 * task), an unregistered F16 33 x 520 (uploaded for the call: no loads before the wait), BF16 37 x 600, and two it
 * must not take: BF16 16 x 16384 (wk 8) and five BF16 jobs in one launch (more than MM_SMALLJ). */
/* a random F32, F16 or BF16 weight of rows x cols in w (its data returned: the caller frees it); 16-bit values
 * finite, magnitudes about 2^-5 .. 2^3 */
static uint8_t *float_weight(df_weight *w, int fmt, int rows, int cols) {
    const int es = fmt == DF_W_F32 ? 4 : 2;
    const size_t rb = (size_t)cols * es, n = (size_t)rows * cols;
    uint8_t *d = malloc((size_t)rows * rb);
    for (size_t i = 0; i < n; i++) {
        if (fmt == DF_W_F32) {
            const float f = frnd();
            memcpy(d + 4 * i, &f, 4);
        } else {
            const uint32_t r = rnd(), sign = r & 1, m = (r >> 1) & (fmt == DF_W_BF16 ? 127 : 1023), ex = (r >> 12) % 8;
            const uint16_t h = fmt == DF_W_BF16 ? (uint16_t)((sign << 15) | ((122 + ex) << 7) | m) : (uint16_t)((sign << 15) | ((10 + ex) << 10) | m);
            memcpy(d + 2 * i, &h, 2);
        }
    }
    memset(w, 0, sizeof *w);
    w->fmt = fmt, w->rows = rows, w->cols = cols, w->data = d, w->row_bytes = rb;
    return d;
}
/* a product job of the launch checks below (fmt: DF_W_*; reg: registered in VRAM; group: the jobs of one matmul_batch) */
struct mm_shape {
    int fmt, rows, cols, reg, group;
};
/* group g's first job (its jobs are consecutive) and its job count; their outputs zeroed and x written by a kernel just
 * before the product (xq = x / 4 scaled by 4: a launch that read x before its wait would see a quarter of it) */
static int mm_group_prep(const struct mm_shape *S, int nj, int g, int *k0, df_act *const *y, df_act *x, const float *xq, size_t xc) {
    const df_backend_ops *B = &df_backend_cuda;
    int nk = 0;
    *k0 = -1;
    for (int k = 0; k < nj; k++)
        if (S[k].group == g) *k0 = *k0 < 0 ? k : *k0, nk++;
    for (int k = *k0; k < *k0 + nk; k++) B->zero(y[k], (size_t)S[k].rows);
    B->write(x, xq, xc);
    B->scale(x, 4.0f, xc);
    return nk;
}
/* random weights of the shapes S (registered where reg), their outputs, and the jobs of x */
static void mm_jobs_setup(const struct mm_shape *S, int nj, df_weight *w, df_mv_job *jobs, uint8_t **data, df_act **y, df_act *x, const char *what) {
    const df_backend_ops *B = &df_backend_cuda;
    for (int k = 0; k < nj; k++) {
        data[k] = float_weight(&w[k], S[k].fmt, S[k].rows, S[k].cols);
        if (S[k].reg) CHECK(B->weight_register(&w[k]) == 0 && w[k].handle, "%s weight %d registered", what, k);
        y[k] = B->alloc((size_t)S[k].rows);
        jobs[k].w = &w[k], jobs[k].x = x, jobs[k].y = y[k];
    }
}
static void mm_bal_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    enum { NJ = 16, NG = 10, XC = 16384 };
    static const struct mm_shape S[NJ] = {
        {DF_W_BF16, 4096, 2048, 1, 0}, {DF_W_BF16, 512, 2048, 1, 0}, {DF_W_BF16, 512, 2048, 1, 0}, {DF_W_BF16, 2048, 4096, 1, 1},
        {DF_W_BF16, 128, 2048, 1, 2},  {DF_W_BF16, 8192, 2048, 1, 3}, {DF_W_F32, 45, 1000, 1, 4},   {DF_W_F32, 64, 3072, 1, 5},
        {DF_W_F16, 33, 520, 0, 6},     {DF_W_BF16, 37, 600, 1, 7},    {DF_W_BF16, 16, 16384, 1, 8}, {DF_W_BF16, 40, 256, 1, 9},
        {DF_W_BF16, 41, 256, 1, 9},    {DF_W_BF16, 42, 256, 1, 9},    {DF_W_BF16, 43, 256, 1, 9},   {DF_W_BF16, 44, 256, 1, 9},
    };
    static const int taken[NG] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    static float xv[XC], xq[XC];
    static float yv[5][NJ][8192];
    df_weight w[NJ];
    df_mv_job jobs[NJ];
    uint8_t *data[NJ];
    df_act *x = B->alloc(XC), *y[NJ];
    for (int c = 0; c < XC; c++) xv[c] = frnd(), xq[c] = xv[c] / 4.0f;
    mm_jobs_setup(S, NJ, w, jobs, data, y, x, "bal");
    static const int masks[5] = {15214, 15214 | 16384, 15214 | 16384 | 32768, 15214 & ~512, (15214 & ~512) | 16384 | 32768};
    for (int m = 0; m < 5; m++) {
        df_cuda_set_lean_mask(masks[m]);
        for (int g = 0; g < NG; g++) {
            int k0;
            const int nk = mm_group_prep(S, NJ, g, &k0, y, x, xq, XC);
            const int64_t l0 = df_cuda_mm_launches(), b0 = df_cuda_mm_bal_launches();
            B->matmul_batch(jobs + k0, nk, 1);
            const int64_t launches = df_cuda_mm_launches() - l0, bal = df_cuda_mm_bal_launches() - b0;
            CHECK(launches == 1, "mask %d, group %d: %lld product launches, expected 1", masks[m], g, (long long)launches);
            const int want = (masks[m] & 16384) && taken[g];
            CHECK(bal == want, "mask %d, group %d: %lld launches of k_mm_bal, expected %d", masks[m], g, (long long)bal, want);
            for (int k = k0; k < k0 + nk; k++) {
                B->read(yv[m][k], y[k], (size_t)S[k].rows);
                double d = 0, n2 = 0;
                for (int r = 0; r < S[k].rows; r++) {
                    const float c = df_dot_row(&w[k], r, xv);
                    d += (double)(yv[m][k][r] - c) * (yv[m][k][r] - c), n2 += (double)c * c;
                }
                CHECK(d <= 1e-10 * n2, "mask %d, bal job %d (%d x %d, fmt %d): rel L2^2 %g against the CPU", masks[m], k, S[k].rows, S[k].cols, S[k].fmt,
                      n2 > 0 ? d / n2 : d);
            }
        }
    }
    df_cuda_set_lean_mask(-1);
    for (int k = 0; k < NJ; k++) {
        const size_t bytes = (size_t)S[k].rows * sizeof(float);
        CHECK(!memcmp(yv[0][k], yv[1][k], bytes), "bal job %d (%d x %d, fmt %d): k_mm_bal's bits differ from the default's (15214)", k, S[k].rows, S[k].cols, S[k].fmt);
        CHECK(!memcmp(yv[0][k], yv[2][k], bytes), "bal job %d (%d x %d, fmt %d): k_mm_bal's bits with the loads before the wait differ from the default's", k, S[k].rows, S[k].cols, S[k].fmt);
        CHECK(!memcmp(yv[3][k], yv[4][k], bytes), "bal job %d (%d x %d, fmt %d): k_mm_bal's bits differ from mask %d's", k, S[k].rows, S[k].cols, S[k].fmt, masks[3]);
        if (S[k].reg) B->weight_unregister(&w[k]);
        B->free(y[k]);
        free(data[k]);
    }
    B->free(x);
    printf("test_backend_cuda: balanced one-token products (bit 16384): %d jobs in %d launches, 5 masks\n", NJ, NG);
}
/* ---- round 12: FP8 E4M3 weights with 128 x 128 scale blocks (DeepSeek-V3's experts and dense products) ---------- */
/* A window of FP8 bytes and F32 scales for weight w (rows x cols, 128 x 128 blocks): data at byte offset doff of db (a
 * multiple of 16), scales at float offset soff of sb: windows of one random buffer give distinct weights cheaply. */
static void fp8_weight(df_weight *w, int64_t rows, int64_t cols, const uint8_t *db, size_t doff, const float *sb, size_t soff) {
    memset(w, 0, sizeof *w);
    w->fmt = DF_W_FP8, w->rows = rows, w->cols = cols, w->data = db + doff, w->row_bytes = (size_t)cols;
    w->scale = sb + soff, w->scale_dtype = DF_SCALE_F32, w->blk_r = 128, w->blk_c = 128, w->scale_cols = (cols + 127) / 128;
}
/* random E4M3 codes (no NaN code) and scales 2^-10 .. 2^-7 times 1..2 */
static void fp8_fill(uint8_t *db, size_t nb, float *sb, size_t ns) {
    for (size_t i = 0; i < nb; i++) {
        uint8_t b = (uint8_t)(rnd() & 0xff);
        if ((b & 0x7f) == 0x7f) b ^= 1;
        db[i] = b;
    }
    for (size_t i = 0; i < ns; i++) sb[i] = ldexpf(1.0f + (float)(rnd() % 1024) / 1024.0f, -10 + (int)(rnd() % 4));
}
/* rel L2^2 of y against the CPU's rows of w times x */
static double fp8_err(const df_weight *w, const float *x, const float *y) {
    double d = 0, n2 = 0;
    for (int64_t r = 0; r < w->rows; r++) {
        const float c = df_dot_row(w, r, x);
        d += (double)(y[r] - c) * (y[r] - c), n2 += (double)c * c;
    }
    return n2 > 0 ? d / n2 : d;
}
static float host_silu(float x) { return x / (1.0f + expf(-x)); }

/* The device-routed MoE of FP8 experts (moe_fused; DeepSeek-V3's sigmoid-group route and silu gate) under the
 * default mask (64366: the down launch is k_moe_down) and with round 12's bits (bit 262144: the gate/up launch at 2
 * blocks an SM, k_mm_dev2, where the gate/up rows are FP8 of the 16-byte path): bit 65536 (k_moe_down_f8) must give
 * the default's bits (memcmp) of the gate/up rows, each expert's down rows and the output, be taken exactly when the
 * default is not, and every row be near the CPU's (df_dot_row of the chosen experts; the down rows from the gate
 * applied on the host to the device's gate/up rows, the output the combine of the device's rows by its weights).
 * Shapes: the benchmark's (D 7168, I 2048, K 8 of 32), I 336 (one warp step a row, a partial scale block column), D
 * 301 (a partial scale block row, a partial last row group), I 1040 with K 6 (three warp steps, 6 warps a block).
 * Round 13: bit 1048576 (the gate/up launch through k_mm_devf8) gives the same bits too. */
static void fp8_moe_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    static const struct { int D, I, E, K; } S[] = {{7168, 2048, 32, 8}, {301, 336, 32, 8}, {520, 1040, 12, 6}};
    /* round 13: bit 1048576, the gate/up launch through k_mm_devf8 (k_mm_f8's body) in place of k_mm_dev2 */
    /* round 14: bit 8388608, the FP8 down launch with one scale product a 16-byte step (I = 2048: 4 steps a lane; its own
     * sums: near the CPU, not the default's bits) */
    /* and bit 16777216, that launch without its combine, k_moe_combine after it (the same bits), alone and with 8388608 */
    /* round 15: bit 33554432, that launch as k_moe_down_c8 (k_moe_down_f8's bits: memcmp-equal to the default's, and
     * with 8388608 to the mask with 8388608 alone; not taken with 16777216 where that applies: I = 2048) */
    enum { NM = 10, LAYER = 9, TRIALS = 3 };
    const int masks[NM] = {64366, 64366 | 65536, 64366 | 65536 | 131072 | 262144, 64366 | 65536 | 262144 | 1048576,
                           64366 | 65536 | 262144 | 1048576 | 8388608, 64366 | 65536 | 262144 | 1048576 | 16777216,
                           64366 | 65536 | 262144 | 1048576 | 8388608 | 16777216, 64366 | 65536 | 262144 | 1048576 | 33554432,
                           64366 | 65536 | 262144 | 1048576 | 8388608 | 33554432, 64366 | 65536 | 262144 | 1048576 | 16777216 | 33554432};
    const int want_any[NM] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1}; /* a down launch of round 12's family (k_moe_down_f8 or _c8) */
    const int twin[NM] = {-1, -1, -1, -1, -1, -1, 4, -1, 4, 5}; /* a mask whose results must be these bits too (with the step sums) */
    for (size_t si = 0; si < sizeof S / sizeof *S; si++) {
        const int D = S[si].D, I = S[si].I, E = S[si].E, K = S[si].K, layer = LAYER + (int)si;
        const size_t stride = 4112, nb = (size_t)D * I + (size_t)3 * E * stride;
        const size_t sstr = 7, ns = (size_t)((D + 127) / 128) * ((I + 127) / 128) + (size_t)3 * E * sstr;
        uint8_t *db = malloc(nb);
        float *sb = malloc(ns * sizeof(float));
        df_weight *pw = malloc((size_t)3 * E * sizeof(df_weight));
        float *xv = malloc((size_t)D * 4), *lg = malloc((size_t)E * 4), *bias = malloc((size_t)E * 4);
        float *gv = malloc((size_t)K * I * 4), *uv = malloc((size_t)K * I * 4), *hv = malloc((size_t)I * 4);
        float *dv[NM], *ov[NM], *gvm[NM], wv[16], iv[16], *co = malloc((size_t)D * 4);
        for (int m = 0; m < NM; m++) dv[m] = malloc((size_t)K * D * 4), ov[m] = malloc((size_t)D * 4), gvm[m] = malloc((size_t)2 * K * I * 4);
        fp8_fill(db, nb, sb, ns);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) {
                df_weight *w = &pw[3 * e + p];
                fp8_weight(w, p == 2 ? D : I, p == 2 ? I : D, db, (size_t)(3 * e + p) * stride, sb, (size_t)(3 * e + p) * sstr);
                w->ident = df_expert_ident(layer, e, p);
            }
        for (int i = 0; i < D; i++) xv[i] = frnd();
        /* a budget that holds the layer's experts (the benchmark's: 1.4 GB) in the cache */
        df_cuda_set_memory((int64_t)4 << 30, 0, (int64_t)3 * E * ((int64_t)D * I + (int64_t)ns * 4) + ((int64_t)64 << 20));
        df_act *x = B->alloc(D), *scr = B->alloc(D > I ? D : I), *dlg = B->alloc(E), *fwd = B->alloc(K), *fids = B->alloc(K);
        df_act *fg = B->alloc((size_t)K * I), *fu = B->alloc((size_t)K * I), *fdd = B->alloc((size_t)K * D), *fout = B->alloc(D);
        B->write(x, xv, D);
        for (int e = 0; e < E; e++) /* every part into the VRAM expert cache through a product */
            for (int p = 0; p < 3; p++) {
                const df_mv_job j = {&pw[3 * e + p], p == 2 ? fg : x, scr};
                B->matmul_batch(&j, 1, 1);
            }
        B->experts_done();
        CHECK(B->moe_resident(layer, E, K, 1) == 1, "FP8 MoE %dx%d: every part cached: resident", D, I);
        for (int trial = 0; trial < TRIALS; trial++) {
            for (int e = 0; e < E; e++) lg[e] = (float)((int)(rnd() % 200001) - 100000) / 25000.0f, bias[e] = (float)((int)(rnd() % 101) - 50) / 400.0f;
            B->write(dlg, lg, E);
            for (int m = 0; m < NM; m++) {
                df_cuda_set_lean_mask(masks[m]);
                df_route_args ra = {.kind = DF_ROUTE_SIGMOID_GROUPS, .logits = dlg, .w = fwd, .n = 1, .n_experts = E, .k = K, .norm_topk = 1,
                                    .n_group = E % 8 ? 4 : 8, .topk_group = E % 8 ? 3 : 4, .scaling = 2.5f, .bias = bias};
                df_moe_fused_args fa = {.route = ra, .layer = layer, .x = x, .out = fout, .g = fg, .u = fu, .d = fdd, .D = D, .I = I,
                                        .gate = DF_GATE_SILU, .ids_out = fids};
                B->zero(fdd, (size_t)K * D), B->zero(fout, (size_t)D);
                const int64_t f0 = df_cuda_moe_down_f8_launches(), u0 = df_cuda_moe_gu_f8_launches(), r0 = df_cuda_moe_gu_f8r_launches();
                const int64_t st0 = df_cuda_moe_down_f8_step_launches(), cb0 = df_cuda_moe_down_f8_comb_launches(), c80 = df_cuda_moe_down_c8_launches();
                const int rc = B->moe_fused(&fa);
                const int64_t f8 = df_cuda_moe_down_f8_launches() - f0, gu8 = df_cuda_moe_gu_f8_launches() - u0, gur = df_cuda_moe_gu_f8r_launches() - r0;
                const int step = (masks[m] & 8388608) && I == 2048, comb = (masks[m] & 16777216) && I == 2048;
                CHECK(df_cuda_moe_down_f8_comb_launches() - cb0 == comb, "FP8 MoE %dx%d mask %d: %lld down launches with the combine after, expected %d", D, I,
                      masks[m], (long long)(df_cuda_moe_down_f8_comb_launches() - cb0), comb);
                CHECK(df_cuda_moe_down_f8_step_launches() - st0 == step, "FP8 MoE %dx%d mask %d: %lld down launches with one scale product a step, expected %d", D, I,
                      masks[m], (long long)(df_cuda_moe_down_f8_step_launches() - st0), step);
                /* bit 1048576 (first) / 262144: the FP8 gate/up launch through k_mm_devf8 / at 2 blocks an SM (FP8 rows of the
                 * 16-byte path: D a multiple of 16; k_mm_devf8: rows read by one warp, D < 8192) */
                const int want_r = (masks[m] & 1048576) && D % 16 == 0 && D < 8192;
                const int want_gu = (masks[m] & 262144) && D % 16 == 0 && !want_r;
                CHECK(gu8 == want_gu, "FP8 MoE %dx%d mask %d: %lld gate/up launches of k_mm_dev2, expected %d", D, I, masks[m], (long long)gu8, want_gu);
                CHECK(gur == want_r, "FP8 MoE %dx%d mask %d: %lld gate/up launches of k_mm_devf8, expected %d", D, I, masks[m], (long long)gur, want_r);
                CHECK(rc == 0, "FP8 MoE %dx%d mask %d: moe_fused rc %d", D, I, masks[m], rc);
                const int want_c8 = want_any[m] && (masks[m] & 33554432) && !comb, c8 = (int)(df_cuda_moe_down_c8_launches() - c80);
                CHECK(c8 == want_c8, "FP8 MoE %dx%d mask %d: %d launches of k_moe_down_c8, expected %d", D, I, masks[m], c8, want_c8);
                CHECK(f8 == (want_any[m] && !want_c8), "FP8 MoE %dx%d mask %d: %lld launches of k_moe_down_f8, expected %d", D, I, masks[m], (long long)f8,
                      want_any[m] && !want_c8);
                B->read(dv[m], fdd, (size_t)K * D), B->read(ov[m], fout, (size_t)D);
                B->read(gvm[m], fg, (size_t)K * I), B->read(gvm[m] + (size_t)K * I, fu, (size_t)K * I);
                B->read(wv, fwd, K), B->read(iv, fids, K);
                memcpy(gv, gvm[m], (size_t)K * I * 4), memcpy(uv, gvm[m] + (size_t)K * I, (size_t)K * I * 4);
                /* the CPU's rows (first trial, every mask): gate/up of the chosen experts (default mask), each down row from the
                 * device's gate/up rows */
                for (int k = 0; k < K; k++) {
                    int32_t id;
                    memcpy(&id, &iv[k], 4);
                    CHECK(id >= 0 && id < E, "FP8 MoE %dx%d: id %d out of range", D, I, id);
                    if (id < 0 || id >= E) continue;
                    if (!trial && !m) {
                        const double eg = fp8_err(&pw[3 * id], xv, gv + (size_t)k * I), eu = fp8_err(&pw[3 * id + 1], xv, uv + (size_t)k * I);
                        CHECK(eg <= 1e-10 && eu <= 1e-10, "FP8 MoE %dx%d expert %d: gate/up rel L2^2 %g %g against the CPU", D, I, id, eg, eu);
                    }
                    if (trial && !step) continue; /* later trials: bit-equal to the default's (below), which the first trial checks; the step sums: near the CPU in every trial */
                    for (int c = 0; c < I; c++) hv[c] = host_silu(gv[(size_t)k * I + c]) * uv[(size_t)k * I + c];
                    const double ed = fp8_err(&pw[3 * id + 2], hv, dv[m] + (size_t)k * D);
                    CHECK(ed <= 1e-10, "FP8 MoE %dx%d mask %d expert %d: down rel L2^2 %g against the CPU", D, I, masks[m], id, ed);
                }
                double d2 = 0, n2 = 0;
                for (int r = 0; r < D; r++) {
                    float o = 0.0f;
                    for (int k = 0; k < K; k++) o += wv[k] * dv[m][(size_t)k * D + r];
                    co[r] = o;
                    d2 += (double)(ov[m][r] - o) * (ov[m][r] - o), n2 += (double)o * o;
                }
                CHECK(n2 > 0 && d2 <= 1e-12 * n2, "FP8 MoE %dx%d mask %d: the output is not the combine of its rows (rel L2^2 %g)", D, I, masks[m], n2 > 0 ? d2 / n2 : d2);
                if (m) {
                    CHECK(!memcmp(gvm[m], gvm[0], (size_t)2 * K * I * 4), "FP8 MoE %dx%d trial %d: mask %d's gate/up rows differ from the default's", D, I, trial, masks[m]);
                    if (!step) {
                        CHECK(!memcmp(dv[m], dv[0], (size_t)K * D * 4), "FP8 MoE %dx%d trial %d: mask %d's down rows differ from the default's", D, I, trial, masks[m]);
                        CHECK(!memcmp(ov[m], ov[0], (size_t)D * 4), "FP8 MoE %dx%d trial %d: mask %d's output differs from the default's", D, I, trial, masks[m]);
                    }
                    if (twin[m] >= 0) {
                        CHECK(!memcmp(dv[m], dv[twin[m]], (size_t)K * D * 4), "FP8 MoE %dx%d trial %d: mask %d's down rows differ from mask %d's", D, I, trial, masks[m], masks[twin[m]]);
                        CHECK(!memcmp(ov[m], ov[twin[m]], (size_t)D * 4), "FP8 MoE %dx%d trial %d: mask %d's output differs from mask %d's", D, I, trial, masks[m], masks[twin[m]]);
                    }
                }
            }
        }
        df_cuda_set_lean_mask(-1);
        B->tier_reset();
        df_act *all[] = {x, scr, dlg, fwd, fids, fg, fu, fdd, fout};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) B->free(all[i]);
        for (int m = 0; m < NM; m++) free(dv[m]), free(ov[m]), free(gvm[m]);
        free(db), free(sb), free(pw), free(xv), free(lg), free(bias), free(gv), free(uv), free(hv), free(co);
    }
    df_cuda_set_memory((int64_t)256 << 20, 0, 0);
    printf("test_backend_cuda: FP8 device-routed MoE (bits 65536, 262144, 33554432): %d shapes x %d trials x %d masks\n", (int)(sizeof S / sizeof *S), TRIALS, NM);
}

/* Round 15's bit 134217728: one-token BF16 products of at most MM_SMALLJ jobs through k_mm_f8's body (a warp per 4
 * whole rows, 4 steps of a lane's rows a round; one-warp rows' sums): DeepSeek-V3's lm_head (8192 x 7168) and router
 * (32 x 7168), Qwen3's q/k/v as one batch of three (4096 / 512 / 512 x 2048), an odd 37 x 600 and an unregistered 45 x
 * 1040; taken exactly with the bit (and bit 524288), one launch each, near the CPU's rows. x is written by a kernel just
 * before (x / 4 scaled by 4). */
static void bf16_f8_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    enum { NJ = 7, NG = 5, XC = 7168 };
    static const struct mm_shape S[NJ] = {{DF_W_BF16, 8192, 7168, 1, 0}, {DF_W_BF16, 32, 7168, 1, 1}, {DF_W_BF16, 4096, 2048, 1, 2},
                                          {DF_W_BF16, 512, 2048, 1, 2},  {DF_W_BF16, 512, 2048, 1, 2}, {DF_W_BF16, 37, 600, 1, 3},
                                          {DF_W_BF16, 45, 1040, 0, 4}};
    static float xv[XC], xq[XC], yv[8192];
    df_weight w[NJ];
    df_mv_job jobs[NJ];
    uint8_t *data[NJ];
    df_act *x = B->alloc(XC), *y[NJ];
    for (int c = 0; c < XC; c++) xv[c] = frnd(), xq[c] = xv[c] / 4.0f;
    mm_jobs_setup(S, NJ, w, jobs, data, y, x, "bf16");
    static const int masks[3] = {113113966, 113113966 | 134217728, (113113966 & ~524288) | 134217728};
    for (int m = 0; m < 3; m++) {
        df_cuda_set_lean_mask(masks[m]);
        for (int g = 0; g < NG; g++) {
            int k0;
            const int nk = mm_group_prep(S, NJ, g, &k0, y, x, xq, XC);
            const int64_t l0 = df_cuda_mm_launches(), f0 = df_cuda_mm_f8_bf16_launches();
            B->matmul_batch(jobs + k0, nk, 1);
            const int64_t launches = df_cuda_mm_launches() - l0, f8b = df_cuda_mm_f8_bf16_launches() - f0;
            const int want = (masks[m] & 134217728) && (masks[m] & 524288);
            CHECK(launches == 1, "bf16 mask %d, group %d: %lld product launches, expected 1", masks[m], g, (long long)launches);
            CHECK(f8b == want, "bf16 mask %d, group %d: %lld BF16 launches of k_mm_f8, expected %d", masks[m], g, (long long)f8b, want);
            for (int k = k0; k < k0 + nk; k++) {
                B->read(yv, y[k], (size_t)S[k].rows);
                double d = 0, n2 = 0;
                for (int r = 0; r < S[k].rows; r++) {
                    const float c = df_dot_row(&w[k], r, xv);
                    d += (double)(yv[r] - c) * (yv[r] - c), n2 += (double)c * c;
                }
                CHECK(n2 > 0 && d <= 1e-10 * n2, "bf16 mask %d, job %d (%d x %d): rel L2^2 %g against the CPU", masks[m], k, S[k].rows, S[k].cols,
                      n2 > 0 ? d / n2 : d);
            }
        }
    }
    df_cuda_set_lean_mask(-1);
    for (int k = 0; k < NJ; k++) {
        if (S[k].reg) B->weight_unregister(&w[k]);
        B->free(y[k]);
        free(data[k]);
    }
    B->free(x);
    printf("test_backend_cuda: BF16 one-token products through k_mm_f8's body (bit 134217728): %d groups x 3 masks\n", NG);
}

/* Round 16: routed expert parts of at least 1 MB from pageable memory reach the VRAM cache through the page-locked
 * staging buffers (DELTAFIN_CUDA_STAGE; 3 MB parts: one chunk each, five of them through the four buffers): each
 * product against the CPU, a second product of each from the cache, and every byte counted as staged. */
static void staged_copy_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    enum { R = 1024, C = 1536, NE = 5 };
    if (B->tier_reset) B->tier_reset(); /* the cache sizes its slots for the parts that come first */
    static float xv[C], yv[R];
    df_weight w[NE];
    uint8_t *data[NE];
    df_act *x = B->alloc(C), *y = B->alloc(R);
    for (int c = 0; c < C; c++) xv[c] = frnd();
    B->write(x, xv, C);
    df_tier_stats s0, s1;
    B->tier_stats(&s0);
    for (int e = 0; e < NE; e++) {
        data[e] = float_weight(&w[e], DF_W_BF16, R, C);
        w[e].ident = df_expert_ident(7, e, 0);
    }
    for (int pass = 0; pass < 2; pass++)
        for (int e = 0; e < NE; e++) {
            df_mv_job j = {&w[e], x, y};
            B->matmul_batch(&j, 1, 1);
            B->read(yv, y, R);
            double d = 0, n2 = 0;
            for (int r = 0; r < R; r++) {
                const float c = df_dot_row(&w[e], r, xv);
                d += (double)(yv[r] - c) * (yv[r] - c), n2 += (double)c * c;
            }
            CHECK(n2 > 0 && d <= 1e-10 * n2, "staged expert %d, pass %d: rel L2^2 %g against the CPU", e, pass, n2 > 0 ? d / n2 : d);
        }
    B->tier_stats(&s1);
    const int64_t staged = s1.h2d_expert_staged_bytes - s0.h2d_expert_staged_bytes, want = (int64_t)NE * R * C * 2;
    const char *env = getenv("DELTAFIN_CUDA_STAGE");
    CHECK(staged == (env && !strcmp(env, "0") ? 0 : want), "staged bytes %lld, expected %lld", (long long)staged, (long long)want);
    for (int e = 0; e < NE; e++) free(data[e]);
    B->free(x), B->free(y);
    if (B->tier_reset) B->tier_reset();
    printf("test_backend_cuda: %d expert parts of 3 MB through the staging buffers, products equal to the CPU's\n", NE);
}

/* Prefill round 2: products of >= 512 tokens in the split-f16 form (x and W as two f16 pieces each, scaled by powers
 * of two; one f16 GEMM over [x1 | x0 (| x0)] and [W0 | (W1 |) W0]). Per token row, against a double product of the
 * stored weights: rel L2 <= SPLIT_TOL (one f16 piece, 2^-12 an element, would err by ~1e-4; device runs gave <= 2.8e-6);
 * token rows whose magnitudes span 2^-1 .. 2^15 (values past f16's 65504, so the scaling is needed), a zero row
 * (exactly 0 out); F32 and FP8 (three pieces), BF16 and F16 (two); the same products under
 * DELTAFIN_CUDA_SPLIT_FORM=bf16 (the first form: no split-f16 GEMM, the same bound); and an FP8 weight of 600 x 1536
 * through slabs of 250 rows (df_cuda_set_slab_bytes: three chunks) whose scale blocks from row 256 are 2^10 larger, so
 * each chunk needs its own alpha. Prefill round 3: rows whose bytes are not a multiple of 16 (BF16 1004 wide, FP8 1000
 * wide with partial scale blocks) take the split kernels' element-wise path, the others 8 columns a thread. */
#define SPLIT_TOL 8e-6
static void split_f16_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    static const struct { int fmt, rows, cols, n, chunks; } S[] = {
        {DF_W_F32, 70, 1000, 600, 1}, {DF_W_BF16, 64, 2048, 600, 1}, {DF_W_F16, 33, 520, 512, 1}, {DF_W_FP8, 300, 1536, 600, 1}, {DF_W_FP8, 600, 1536, 512, 3},
        /* rows not 16-byte multiples: the split kernels' element-wise path (the others take 8 columns a thread) */
        {DF_W_BF16, 40, 1004, 512, 1}, {DF_W_FP8, 130, 1000, 512, 1},
    };
    double worst[2] = {0, 0};
    for (size_t k = 0; k < sizeof S / sizeof *S; k++) {
        const int R = S[k].rows, C = S[k].cols, n = S[k].n;
        df_weight w;
        uint8_t *data = NULL, *db = NULL;
        float *sb = NULL;
        if (S[k].fmt == DF_W_FP8) {
            const size_t ns = (size_t)((R + 127) / 128) * ((C + 127) / 128);
            db = malloc((size_t)R * C), sb = malloc(ns * sizeof(float));
            fp8_fill(db, (size_t)R * C, sb, ns);
            fp8_weight(&w, R, C, db, 0, sb, 0);
            if (S[k].chunks > 1) /* the scale blocks from row 256 (inside the second chunk of 250 rows) 2^10 larger */
                for (size_t i = (size_t)(256 / 128) * w.scale_cols; i < ns; i++) sb[i] *= 1024.0f;
        } else
            data = float_weight(&w, S[k].fmt, R, C);
        CHECK(B->weight_register(&w) == 0 && w.handle, "split-f16 weight %zu registered", k);
        float *xh = malloc((size_t)n * C * sizeof(float)), *yh = malloc((size_t)n * R * sizeof(float));
        for (int t = 0; t < n; t++)
            for (int c = 0; c < C; c++) xh[(size_t)t * C + c] = t == 5 ? 0.0f : ldexpf(frnd(), t % 17 - 1);
        double *ref = malloc((size_t)n * R * sizeof(double));
        float *wr = malloc((size_t)C * sizeof(float));
        for (int i = 0; i < R; i++) {
            df_dequant_row(&w, i, wr);
            for (int t = 0; t < n; t++) {
                double a = 0;
                for (int c = 0; c < C; c++) a += (double)wr[c] * xh[(size_t)t * C + c];
                ref[(size_t)t * R + i] = a;
            }
        }
        df_act *x = B->alloc((size_t)n * C), *y = B->alloc((size_t)n * R);
        B->write(x, xh, (size_t)n * C);
        for (int form = 0; form < 2; form++) { /* 0 split-f16 (the default), 1 split-bf16 */
            if (form) setenv("DELTAFIN_CUDA_SPLIT_FORM", "bf16", 1);
            B->zero(y, (size_t)n * R);
            df_mv_job j = {&w, x, y};
            const int64_t g0 = df_cuda_split_f16_gemms();
            if (S[k].chunks > 1) df_cuda_set_slab_bytes((size_t)250 * 3 * C * 2); /* split-f16: 250 rows a slab */
            B->matmul_batch(&j, 1, n);
            df_cuda_set_slab_bytes(0);
            const int64_t gemms = df_cuda_split_f16_gemms() - g0;
            if (form) unsetenv("DELTAFIN_CUDA_SPLIT_FORM");
            CHECK(gemms == (form ? 0 : S[k].chunks), "split form %d, job %zu: %lld split-f16 GEMMs, expected %d", form, k, (long long)gemms,
                  form ? 0 : S[k].chunks);
            B->read(yh, y, (size_t)n * R);
            for (int t = 0; t < n; t++) {
                double d = 0, n2 = 0;
                for (int i = 0; i < R; i++) {
                    const double e = yh[(size_t)t * R + i] - ref[(size_t)t * R + i];
                    d += e * e, n2 += ref[(size_t)t * R + i] * ref[(size_t)t * R + i];
                }
                if (t == 5) {
                    CHECK(d == 0, "split form %d, job %zu: the zero token row gave non-zero outputs", form, k);
                    continue;
                }
                const double rl = sqrt(d / (n2 > 0 ? n2 : 1e-300));
                if (!(rl <= worst[form])) worst[form] = rl;
                CHECK(rl <= SPLIT_TOL, "split form %d, job %zu (fmt %d, %d x %d), token %d (x about 2^%d): rel L2 %.2e against double", form, k,
                      S[k].fmt, R, C, t, t % 17 - 1, rl);
            }
        }
        B->free(x), B->free(y);
        B->weight_unregister(&w);
        free(xh), free(yh), free(ref), free(wr), free(data), free(db), free(sb);
    }
    printf("test_backend_cuda: prefill split forms: worst rel L2 per token row %.2e (split-f16), %.2e (split-bf16), %zu weights\n", worst[0], worst[1],
           sizeof S / sizeof *S);
}

/* Prefill round 3: jobs of one matmul_batch call with the same x split it once (gate and up, q/k/v): two FP8 weights
 * on x share one split, a BF16 weight on the same x needs its own (two pieces, not three), an FP8 weight on another x
 * its own; every output memcmp-equal to the same job run alone, and the first job of the next call splits again. */
static void split_shared_x_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    enum { C = 1536, N = 520, NJ = 4 };
    static const int rows[NJ] = {300, 256, 64, 130};
    df_weight w[NJ];
    uint8_t *db[NJ] = {0}, *data[NJ] = {0};
    float *sb[NJ] = {0};
    for (int k = 0; k < NJ; k++) {
        if (k == 2) {
            data[k] = float_weight(&w[k], DF_W_BF16, rows[k], C);
        } else {
            const size_t ns = (size_t)((rows[k] + 127) / 128) * (C / 128);
            db[k] = malloc((size_t)rows[k] * C), sb[k] = malloc(ns * sizeof(float));
            fp8_fill(db[k], (size_t)rows[k] * C, sb[k], ns);
            fp8_weight(&w[k], rows[k], C, db[k], 0, sb[k], 0);
        }
        CHECK(B->weight_register(&w[k]) == 0 && w[k].handle, "shared-x weight %d registered", k);
    }
    float *xh = malloc((size_t)2 * N * C * sizeof(float));
    for (size_t i = 0; i < (size_t)2 * N * C; i++) xh[i] = frnd();
    df_act *x[2] = {B->alloc((size_t)N * C), B->alloc((size_t)N * C)}, *y[NJ], *y1 = B->alloc((size_t)N * 300);
    B->write(x[0], xh, (size_t)N * C), B->write(x[1], xh + (size_t)N * C, (size_t)N * C);
    df_mv_job j[NJ];
    for (int k = 0; k < NJ; k++) y[k] = B->alloc((size_t)N * rows[k]), j[k] = (df_mv_job){&w[k], x[k == 3], y[k]};
    const int64_t s0 = df_cuda_split_f16_xsplits(), g0 = df_cuda_split_f16_gemms();
    B->matmul_batch(j, NJ, N);
    const int64_t xs = df_cuda_split_f16_xsplits() - s0, gs = df_cuda_split_f16_gemms() - g0;
    CHECK(xs == 3 && gs == NJ, "shared x: %lld x splits and %lld GEMMs for %d jobs on 2 x (3 splits and %d GEMMs expected)", (long long)xs, (long long)gs, NJ,
          NJ);
    float *a = malloc((size_t)N * 300 * sizeof(float)), *b = malloc((size_t)N * 300 * sizeof(float));
    for (int k = 0; k < NJ; k++) {
        B->read(a, y[k], (size_t)N * rows[k]);
        const int64_t s1 = df_cuda_split_f16_xsplits();
        df_mv_job one = {&w[k], x[k == 3], y1};
        B->matmul_batch(&one, 1, N);
        CHECK(df_cuda_split_f16_xsplits() - s1 == 1, "shared x: job %d alone did not split its x once", k);
        B->read(b, y1, (size_t)N * rows[k]);
        CHECK(!memcmp(a, b, (size_t)N * rows[k] * sizeof(float)), "shared x: job %d in the batch differs from the job alone", k);
    }
    free(a), free(b), free(xh);
    B->free(x[0]), B->free(x[1]), B->free(y1);
    for (int k = 0; k < NJ; k++) B->free(y[k]), B->weight_unregister(&w[k]), free(db[k]), free(sb[k]), free(data[k]);
    printf("test_backend_cuda: split-f16 x shared by a batch's jobs: %lld splits for %d jobs\n", (long long)xs, NJ);
}

/* Round 15's bit 67108864: MLA's decode launches (16-byte paths) with a resident FP8 kv_b load its rows before their
 * wait, and score four heads at a time: the same bits as without the bit (memcmp), taken exactly where kv_b is
 * registered. q and the latent cache are written by a kernel just before the call (x / 4, then scaled by 4), so a
 * launch that read them before its wait would see a quarter of them. DeepSeek-V3's head shapes (nope 128, rope 64,
 * kv_lora 512, v 128), 16 heads, at 1 and 3 positions after 300 cached ones. */
static void mla_early_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    enum { NH = 16, NOPE = 128, ROPE = 64, R = 512, VD = 128, P0 = 300, NMAX = 3 };
    const int rows = NH * (NOPE + VD);
    const size_t nb = (size_t)rows * R, ns = (size_t)(rows / 128) * (R / 128);
    uint8_t *db = malloc(nb);
    float *sb = malloc(ns * sizeof(float));
    fp8_fill(db, nb, sb, ns);
    const size_t nq = (size_t)NMAX * NH * (NOPE + ROPE), nc = (size_t)(P0 + NMAX) * (R + ROPE), no = (size_t)NMAX * NH * VD;
    float *qv = malloc(nq * 4), *cv = malloc(nc * 4), *o[2][2];
    for (size_t i = 0; i < nq; i++) qv[i] = frnd() / 4.0f;
    for (size_t i = 0; i < nc; i++) cv[i] = frnd() / 4.0f;
    df_act *q = B->alloc(nq), *c = B->alloc(nc), *out = B->alloc(no);
    for (int reg = 0; reg < 2; reg++) {
        df_weight w;
        fp8_weight(&w, rows, R, db, 0, sb, 0);
        if (reg) CHECK(B->weight_register(&w) == 0 && w.handle, "MLA kv_b registered");
        for (int nn = 1; nn <= NMAX; nn += NMAX - 1) {
            for (int m = 0; m < 2; m++) {
                df_cuda_set_lean_mask(m ? 113113966 : 113113966 & ~67108864);
                o[nn > 1][m] = malloc(no * 4);
                B->write(q, qv, nq), B->write(c, cv, nc);
                B->scale(q, 4.0f, nq), B->scale(c, 4.0f, nc);
                B->zero(out, no);
                const df_weight none = {0};
                df_attn_mla_args a = {q, c, out, &w, &none, &none, nn, P0, NH, NOPE, ROPE, R, VD, 0.0721688f};
                const int64_t e0 = df_cuda_mla_early_calls();
                B->attn_mla(&a);
                const int64_t early = df_cuda_mla_early_calls() - e0;
                CHECK(early == (m && reg), "MLA n=%d registered %d mask %d: %lld early calls, expected %d", nn, reg, m, (long long)early, m && reg);
                B->read(o[nn > 1][m], out, (size_t)nn * NH * VD);
            }
            CHECK(!memcmp(o[nn > 1][0], o[nn > 1][1], (size_t)nn * NH * VD * 4), "MLA n=%d registered %d: bit 67108864 changed bits", nn, reg);
            double n2 = 0;
            for (size_t i = 0; i < (size_t)nn * NH * VD; i++) n2 += (double)o[nn > 1][1][i] * o[nn > 1][1][i];
            CHECK(n2 > 0 && isfinite(n2), "MLA n=%d registered %d: output norm %g", nn, reg, n2);
            free(o[nn > 1][0]), free(o[nn > 1][1]);
        }
        if (reg) B->weight_unregister(&w);
    }
    df_cuda_set_lean_mask(-1);
    B->free(q), B->free(c), B->free(out);
    free(db), free(sb), free(qv), free(cv);
    printf("test_backend_cuda: MLA decode with kv_b's rows before the wait (bit 67108864): 2 weights x 2 batches x 2 masks\n");
}

/* The dense FP8 one-token products (k_mm under the default mask; round 12's bit 131072: k_mm_bal for FP8; round 13's
 * bit 524288: k_mm_f8): the
 * benchmark's q_b (24576 x 1536), o (7168 x 16384), kv_a (576 x 7168), the shared expert's gate (2048 x 7168) and down
 * (7168 x 2048), and odd shapes: 301 x 336 (partial scale blocks both ways), 37 x 1040, 5 x 16 (one step a row);
 * near the CPU's under every mask, and bit-equal to the default's with the new bits. */
static void fp8_mm_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    static const struct { int rows, cols; } S[] = {{24576, 1536}, {7168, 16384}, {576, 7168}, {2048, 7168}, {7168, 2048}, {301, 336}, {37, 1040}, {5, 16}};
    /* round 13: bit 524288 (k_mm_f8), with bit 131072 too (k_mm_f8 first), and without bit 512 (k_mm_f8 the same; k_mm with
     * round 7's split: rows of 16+ steps a lane over 2 or more warps) */
    /* round 14: bit 2097152 (k_mm_f8 with each row group's columns over 2 or 4 warps where the one-warp launch fills at most
     * half a wave: here 576 x 7168 (18 blocks) and 2048 x 7168 (64) on a GPU of 64+ SMs) */
    enum { NJ = sizeof S / sizeof *S, NM = 8, XC = 16384 };
    const int masks[NM] = {64366, 64366 | 131072, (64366 & ~32768) | 131072, 64366 | 524288, 64366 | 524288 | 131072, 64366 & ~512, (64366 & ~512) | 524288,
                           64366 | 524288 | 2097152};
    int64_t splits = 0;
    size_t nb = 0, ns = 0;
    for (int k = 0; k < NJ; k++) nb += (size_t)S[k].rows * S[k].cols, ns += (size_t)((S[k].rows + 127) / 128) * ((S[k].cols + 127) / 128);
    uint8_t *db = malloc(nb);
    float *sb = malloc(ns * 4), *xv = malloc(XC * 4), *yv[NM][NJ];
    fp8_fill(db, nb, sb, ns);
    for (int c = 0; c < XC; c++) xv[c] = frnd();
    df_cuda_set_memory((int64_t)4 << 30, 0, 0); /* every weight resident, as the benchmark's (190 MB here) */
    df_weight w[NJ];
    df_act *x = B->alloc(XC), *y[NJ];
    size_t doff = 0, soff = 0;
    for (int k = 0; k < NJ; k++) {
        fp8_weight(&w[k], S[k].rows, S[k].cols, db, doff, sb, soff);
        doff += (size_t)S[k].rows * S[k].cols, soff += (size_t)((S[k].rows + 127) / 128) * ((S[k].cols + 127) / 128);
        CHECK(B->weight_register(&w[k]) == 0 && w[k].handle, "FP8 weight %d registered", k);
        y[k] = B->alloc((size_t)S[k].rows);
        for (int m = 0; m < NM; m++) yv[m][k] = malloc((size_t)S[k].rows * 4);
    }
    for (int m = 0; m < NM; m++) {
        df_cuda_set_lean_mask(masks[m]);
        for (int k = 0; k < NJ; k++) {
            const df_mv_job j = {&w[k], x, y[k]};
            B->zero(y[k], (size_t)S[k].rows);
            B->write(x, xv, XC);
            B->scale(x, 1.0f, XC); /* x written by a kernel just before the product */
            const int64_t b0 = df_cuda_mm_bal_launches(), f0 = df_cuda_mm_f8_launches(), s0 = df_cuda_mm_f8_split_launches();
            B->matmul_batch(&j, 1, 1);
            const int64_t bal = df_cuda_mm_bal_launches() - b0, f8 = df_cuda_mm_f8_launches() - f0, split = df_cuda_mm_f8_split_launches() - s0;
            CHECK(split == 0 || (masks[m] & 2097152), "FP8 mask %d, job %d: a split k_mm_f8 launch without bit 2097152", masks[m], k);
            splits += split;
            if (masks[m] & 2097152) /* the split keeps k_mm_f8's bits only where it does not split */
                CHECK(k != 2 || split == 1, "FP8 576 x 7168 (18 one-warp blocks), mask %d: not split", masks[m]);
            const int want_f8 = (masks[m] & 524288) != 0;
            CHECK(f8 == want_f8, "FP8 mask %d, job %d: %lld launches of k_mm_f8", masks[m], k, (long long)f8);
            CHECK(bal == ((masks[m] & 131072) && !want_f8 ? 1 : 0), "FP8 mask %d, job %d: %lld launches of k_mm_bal", masks[m], k, (long long)bal);
            B->read(yv[m][k], y[k], (size_t)S[k].rows);
            const double e = fp8_err(&w[k], xv, yv[m][k]);
            CHECK(e <= 1e-10, "FP8 mask %d, job %d (%d x %d): rel L2^2 %g against the CPU", masks[m], k, S[k].rows, S[k].cols, e);
            /* k_mm_bal: k_mm's bits for the same split (the first mask with the same bit 512); k_mm_f8: a one-warp row's bits
             * whatever bit 512 (the first mask with bit 524288), which are k_mm's where k_mm reads the row with one warp
             * (bit 512: fewer than 8 16-byte steps a lane) */
            int m0 = 0;
            if (split) { /* its own bits: the same again in a second launch */
                float *t = malloc((size_t)S[k].rows * 4);
                B->write(x, xv, XC);
                B->scale(x, 1.0f, XC);
                B->matmul_batch(&j, 1, 1);
                B->read(t, y[k], (size_t)S[k].rows);
                CHECK(!memcmp(t, yv[m][k], (size_t)S[k].rows * 4), "FP8 job %d (%d x %d), split: two launches differ", k, S[k].rows, S[k].cols);
                free(t);
                continue;
            }
            if (want_f8)
                while (!(masks[m0] & 524288)) m0++;
            else
                while ((masks[m0] & 524288) || (masks[m0] & 512) != (masks[m] & 512)) m0++;
            if (m0 < m)
                CHECK(!memcmp(yv[m][k], yv[m0][k], (size_t)S[k].rows * 4), "FP8 job %d (%d x %d): mask %d's bits differ from mask %d's", k, S[k].rows, S[k].cols, masks[m], masks[m0]);
            if (want_f8 && S[k].cols / 16 / 32 < 8)
                CHECK(!memcmp(yv[m][k], yv[0][k], (size_t)S[k].rows * 4), "FP8 job %d (%d x %d): mask %d's one-warp rows differ from the default's", k, S[k].rows, S[k].cols, masks[m]);
        }
    }
    /* round 13: jobs of different shapes in one call (2048 x 7168, 24576 x 1536, 7168 x 2048) take one k_mm_f8 launch, each
     * job's rows the bits of its own launch above */
    {
        df_cuda_set_lean_mask(64366 | 524288);
        const int ks[3] = {3, 0, 4};
        df_mv_job jb[3];
        for (int i = 0; i < 3; i++) jb[i].w = &w[ks[i]], jb[i].x = x, jb[i].y = y[ks[i]], B->zero(y[ks[i]], (size_t)S[ks[i]].rows);
        B->write(x, xv, XC);
        B->scale(x, 1.0f, XC);
        const int64_t f0 = df_cuda_mm_f8_launches();
        B->matmul_batch(jb, 3, 1);
        CHECK(df_cuda_mm_f8_launches() - f0 == 1, "FP8 jobs of three shapes: %lld launches of k_mm_f8, expected 1", (long long)(df_cuda_mm_f8_launches() - f0));
        for (int i = 0; i < 3; i++) {
            float *t = malloc((size_t)S[ks[i]].rows * 4);
            B->read(t, y[ks[i]], (size_t)S[ks[i]].rows);
            CHECK(!memcmp(t, yv[3][ks[i]], (size_t)S[ks[i]].rows * 4), "FP8 job %d in a batch of three: bits differ from its own launch's", ks[i]);
            free(t);
        }
    }
    /* round 14: q_a + kv_a's shape of batch (2048 x 7168 and 576 x 7168 in one call: 82 one-warp blocks) under bit 2097152:
     * one launch, split, each job near the CPU */
    {
        df_cuda_set_lean_mask(64366 | 524288 | 2097152);
        const int ks[2] = {3, 2};
        df_mv_job jb[2];
        for (int i = 0; i < 2; i++) jb[i].w = &w[ks[i]], jb[i].x = x, jb[i].y = y[ks[i]], B->zero(y[ks[i]], (size_t)S[ks[i]].rows);
        B->write(x, xv, XC);
        B->scale(x, 1.0f, XC);
        const int64_t f0 = df_cuda_mm_f8_launches(), s0 = df_cuda_mm_f8_split_launches();
        B->matmul_batch(jb, 2, 1);
        CHECK(df_cuda_mm_f8_launches() - f0 == 1 && df_cuda_mm_f8_split_launches() - s0 == 1, "FP8 q_a + kv_a batch: %lld launches of k_mm_f8 (%lld split), expected 1 (1)",
              (long long)(df_cuda_mm_f8_launches() - f0), (long long)(df_cuda_mm_f8_split_launches() - s0));
        for (int i = 0; i < 2; i++) {
            float *t = malloc((size_t)S[ks[i]].rows * 4);
            B->read(t, y[ks[i]], (size_t)S[ks[i]].rows);
            const double e = fp8_err(&w[ks[i]], xv, t);
            CHECK(e <= 1e-10, "FP8 q_a + kv_a batch, job %d: rel L2^2 %g against the CPU", ks[i], e);
            free(t);
        }
        printf("test_backend_cuda: FP8 one-token products, bit 2097152: %lld split launches of single jobs\n", (long long)splits);
    }
    /* round 13: k_mm_f8's general scale path (SF = 0): 301 x 336 with 6 x 48 scale blocks (the 4 rows of a warp in two block
     * rows, 3 steps a scale), near the CPU and equal to k_mm's one-warp rows */
    {
        const int R2 = 301, C2 = 336, sr = (R2 + 5) / 6, scn = (C2 + 47) / 48;
        float *sb2 = malloc((size_t)sr * scn * 4);
        uint8_t *d2 = malloc((size_t)R2 * C2);
        fp8_fill(d2, (size_t)R2 * C2, sb2, (size_t)sr * scn);
        df_weight w2;
        fp8_weight(&w2, R2, C2, d2, 0, sb2, 0);
        w2.blk_r = 6, w2.blk_c = 48, w2.scale_cols = scn;
        CHECK(B->weight_register(&w2) == 0 && w2.handle, "FP8 6 x 48-block weight registered");
        df_act *y2 = B->alloc(R2);
        float *r2[2];
        for (int m = 0; m < 2; m++) {
            df_cuda_set_lean_mask(m ? 64366 | 524288 : 64366);
            const df_mv_job j2 = {&w2, x, y2};
            B->write(x, xv, XC);
            B->scale(x, 1.0f, XC);
            const int64_t f0 = df_cuda_mm_f8_launches();
            B->matmul_batch(&j2, 1, 1);
            CHECK(df_cuda_mm_f8_launches() - f0 == m, "FP8 6 x 48 blocks, mask %d: %lld launches of k_mm_f8", m ? 64366 | 524288 : 64366, (long long)(df_cuda_mm_f8_launches() - f0));
            r2[m] = malloc((size_t)R2 * 4);
            B->read(r2[m], y2, R2);
            const double e = fp8_err(&w2, xv, r2[m]);
            CHECK(e <= 1e-10, "FP8 6 x 48 blocks, mask %d: rel L2^2 %g against the CPU", m, e);
        }
        CHECK(!memcmp(r2[0], r2[1], (size_t)R2 * 4), "FP8 6 x 48 blocks: k_mm_f8's rows differ from k_mm's one-warp rows");
        free(r2[0]), free(r2[1]), B->free(y2), B->weight_unregister(&w2), free(sb2), free(d2);
    }
    df_cuda_set_lean_mask(-1);
    for (int k = 0; k < NJ; k++) {
        B->weight_unregister(&w[k]), B->free(y[k]);
        for (int m = 0; m < NM; m++) free(yv[m][k]);
    }
    B->free(x), free(db), free(sb), free(xv);
    df_cuda_set_memory((int64_t)256 << 20, 0, 0);
    printf("test_backend_cuda: FP8 one-token products: %d shapes x %d masks\n", NJ, NM);
}
/* Round 9 (DELTAFIN_CUDA_LEAN bit 1024): one-token products of spine weights (F32, F16, BF16 rows of the 16-byte
 * path) through the cp.async pipeline (k_mm_cp). Each row is summed as a one-warp row (wk = 1), so where the
 * round-7 launch (mask 366: no bit 512, split1 16) also reads a row with one warp (fewer than 16 steps per lane)
 * the bits are equal; every row near the CPU's. Shapes: the benchmark's q/k/v, o and router rows, a partial last
 * warp step (600 columns), one step per row (8), several rows per warp and a partial last warp (5000 rows: 5534
 * rows in the launch against 16 warps per SM), F32, an unregistered F16 weight (uploaded for the call: copied after
 * the wait), and rows of 1202 bytes (not 16-byte aligned: the generic path, never k_mm_cp). */
static void mm_cp_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    enum { NJ = 9, XC = 4096 };
    static const struct { int fmt, rows, cols, reg; } S[NJ] = {
        {DF_W_BF16, 300, 2048, 1}, {DF_W_BF16, 64, 4096, 1}, {DF_W_BF16, 128, 2048, 1}, {DF_W_BF16, 37, 600, 1}, {DF_W_BF16, 5, 8, 1},
        {DF_W_BF16, 5000, 64, 1},  {DF_W_F32, 45, 1000, 1},  {DF_W_F16, 33, 520, 0},    {DF_W_BF16, 20, 601, 1},
    };
    static float xv[XC];
    static float yv[3][NJ][5000];
    df_weight w[NJ];
    df_mv_job jobs[NJ];
    uint8_t *data[NJ];
    df_act *x = B->alloc(XC), *y[NJ];
    for (int c = 0; c < XC; c++) xv[c] = frnd();
    B->write(x, xv, XC);
    for (int k = 0; k < NJ; k++) {
        data[k] = float_weight(&w[k], S[k].fmt, S[k].rows, S[k].cols);
        if (S[k].reg) CHECK(B->weight_register(&w[k]) == 0 && w[k].handle, "cp weight %d registered", k);
        y[k] = B->alloc((size_t)S[k].rows);
        jobs[k].w = &w[k], jobs[k].x = x, jobs[k].y = y[k];
    }
    /* masks: 366 (round 7's products), 366 | 1024, 878 | 1024 (bit 512 leaves k_mm_cp's rows alone) */
    static const int masks[3] = {366, 366 | 1024, 878 | 1024};
    for (int m = 0; m < 3; m++) {
        df_cuda_set_lean_mask(masks[m]);
        const int64_t l0 = df_cuda_mm_launches(), c0 = df_cuda_mm_cp_launches();
        B->matmul_batch(jobs, NJ, 1);
        const int64_t launches = df_cuda_mm_launches() - l0, cp = df_cuda_mm_cp_launches() - c0;
        /* BF16 jobs 0-5 in one launch, F32, the unregistered F16 alone, the generic BF16 */
        CHECK(launches == 4, "mask %d: %lld product launches, expected 4", masks[m], (long long)launches);
        CHECK(cp == (m ? 3 : 0), "mask %d: %lld launches of k_mm_cp, expected %d", masks[m], (long long)cp, m ? 3 : 0);
        for (int k = 0; k < NJ; k++) {
            B->read(yv[m][k], y[k], (size_t)S[k].rows);
            double d = 0, n2 = 0;
            for (int r = 0; r < S[k].rows; r++) {
                const float c = df_dot_row(&w[k], r, xv);
                d += (double)(yv[m][k][r] - c) * (yv[m][k][r] - c), n2 += (double)c * c;
            }
            CHECK(d <= 1e-10 * n2, "mask %d, cp job %d (%d x %d, fmt %d): rel L2^2 %g against the CPU", masks[m], k, S[k].rows, S[k].cols, S[k].fmt,
                  n2 > 0 ? d / n2 : d);
        }
    }
    df_cuda_set_lean_mask(-1);
    for (int k = 0; k < NJ; k++) {
        const size_t bytes = (size_t)S[k].rows * sizeof(float);
        /* one warp per row in both (fewer than 16 steps per lane): the same bits; job 1 (16 steps) is split in round 7 */
        if (k != 1) CHECK(!memcmp(yv[0][k], yv[1][k], bytes), "cp job %d (%d x %d): k_mm_cp's bits differ from the one-warp rows of mask 366", k, S[k].rows, S[k].cols);
        if (k != 8) CHECK(!memcmp(yv[1][k], yv[2][k], bytes), "cp job %d: bit 512 changed k_mm_cp's bits", k);
        if (S[k].reg) B->weight_unregister(&w[k]);
        B->free(y[k]);
        free(data[k]);
    }
    B->free(x);
    printf("test_backend_cuda: cp.async one-token products (bit 1024): %d jobs, 3 masks\n", NJ);
}
#endif

#ifdef DF_CUDA
/* Greedy decoding ahead (backend.h next_token / next_token_wait / embed_token): the device argmax against
 * the CPU backend's (test_core_ahead checks that one against df_argmax) on NaN (first and elsewhere),
 * infinities, signed zeros, ties and random logits of real vocabulary sizes, two tickets outstanding; the embedding row the token slot names, bit-equal to df_dequant_row for F32, F16 and
 * BF16 rows (and GGML F16), refused for a weight that is not registered or not float. */
/* Issue 15: exact products (backend.h exact_products) for a verify pass. Groups of jobs as the model issues them (the
 * Qwen3-shape q/k/v in one call, o, lm_head; BF16 rows through k_mm_f8's body with KS 1, 2 and 4 (512 x 4096: 16 one-
 * warp blocks, KS 4; 2048 x 4096: KS 2); F32 and F16 through k_mm; FP8 with 128 x 128 scale blocks (576 x 4096: KS 4;
 * 1536 x 1024: KS 1); an unregistered weight) at n = 2, 5, 9 and 40 tokens (40: past the SGEMM threshold), under the
 * default mask, with bit 1024 (k_mm_cp) and under 511 (k_mm only), with exact products on: every token's row bit-equal
 * to the product of that token alone (n = 1). And off, a batch of 40 takes the SGEMM path, whose rows differ from the
 * one-token bits somewhere (so the comparison can fail). */
static void exact_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    enum { NJ = 11, NG = 9, XC = 4096, NT = 40 };
    static const struct mm_shape S[NJ] = {
        {DF_W_BF16, 4096, 2048, 1, 0}, {DF_W_BF16, 512, 2048, 1, 0}, {DF_W_BF16, 512, 2048, 1, 0}, {DF_W_BF16, 2048, 4096, 1, 1},
        {DF_W_BF16, 512, 4096, 1, 2},  {DF_W_BF16, 8192, 2048, 1, 3}, {DF_W_F32, 45, 1000, 1, 4},   {DF_W_F16, 64, 3072, 1, 5},
        {DF_W_F16, 33, 520, 0, 6},     {DF_W_FP8, 576, 4096, 1, 7},  {DF_W_FP8, 1536, 1024, 1, 8}};
    static float xv[NT * XC], yn[NT * 8192];
    df_weight w[NJ];
    df_mv_job jobs[NJ], one[NJ];
    uint8_t *data[NJ];
    df_act *x = B->alloc((size_t)NT * XC), *y[NJ];
    for (size_t c = 0; c < (size_t)NT * XC; c++) xv[c] = frnd();
    B->write(x, xv, (size_t)NT * XC);
    uint8_t *f8d = malloc((size_t)576 * 4096 + (size_t)1536 * 1024);
    float *f8s = malloc(((size_t)5 * 32 + (size_t)12 * 8) * sizeof(float));
    fp8_fill(f8d, (size_t)576 * 4096 + (size_t)1536 * 1024, f8s, (size_t)5 * 32 + (size_t)12 * 8);
    for (int k = 0; k < NJ; k++) {
        if (S[k].fmt == DF_W_FP8) {
            data[k] = NULL;
            if (S[k].rows == 576) fp8_weight(&w[k], 576, 4096, f8d, 0, f8s, 0);
            else fp8_weight(&w[k], 1536, 1024, f8d, (size_t)576 * 4096, f8s, (size_t)5 * 32);
        } else
            data[k] = float_weight(&w[k], S[k].fmt, S[k].rows, S[k].cols);
        if (S[k].reg) CHECK(B->weight_register(&w[k]) == 0 && w[k].handle, "exact: weight %d registered", k);
        y[k] = B->alloc((size_t)NT * S[k].rows);
    }
    static const int ns[4] = {2, 5, 9, NT};
    int64_t f8 = 0, checked = 0;
    /* the default mask; with bit 1024 (k_mm_cp for the float spine: a call holding one runs a token at a time); 511 */
    const int masks[3] = {df_cuda_lean_default(), df_cuda_lean_default() | 1024, 511};
    for (int mi = 0; mi < 3; mi++)
    for (int g = 0; g < NG; g++) {
        df_cuda_set_lean_mask(masks[mi]);
        int k0 = -1, nk = 0;
        for (int k = 0; k < NJ; k++)
            if (S[k].group == g) k0 = k0 < 0 ? k : k0, nk++;
        for (int k = k0; k < k0 + nk; k++) jobs[k].w = &w[k], jobs[k].x = x, jobs[k].y = y[k];
        for (int ni = 0; ni < 4; ni++) {
            const int n = ns[ni];
            for (int pass = 0; pass < 2; pass++) { /* 0: exact products on, 1: off (n = 40 only) */
                if (pass && n != NT) continue;
                /* each token alone */
                const int64_t f0 = df_cuda_mm_f8_launches() + df_cuda_mm_f8_bf16_launches();
                for (int t = 0; t < n; t++) {
                    for (int k = k0; k < k0 + nk; k++)
                        one[k] = (df_mv_job){&w[k], DF_AT((const df_act *)x, (size_t)t * S[k].cols), DF_AT(y[k], (size_t)t * S[k].rows)};
                    B->matmul_batch(one + k0, nk, 1);
                }
                f8 += df_cuda_mm_f8_launches() + df_cuda_mm_f8_bf16_launches() - f0;
                float *ref = malloc((size_t)NT * 8192 * sizeof(float) * (size_t)nk);
                if (!ref) { CHECK(0, "exact: out of host memory"); return; }
                for (int k = k0; k < k0 + nk; k++) B->read(ref + (size_t)(k - k0) * NT * 8192, y[k], (size_t)n * S[k].rows);
                for (int k = k0; k < k0 + nk; k++) B->zero(y[k], (size_t)n * S[k].rows);
                CHECK(B->exact_products && B->exact_products(!pass) == 2, "exact_products answers 2");
                B->matmul_batch(jobs + k0, nk, n);
                B->exact_products(0);
                for (int k = k0; k < k0 + nk; k++) {
                    B->read(yn, y[k], (size_t)n * S[k].rows);
                    const float *r = ref + (size_t)(k - k0) * NT * 8192;
                    size_t d = 0;
                    while (d < (size_t)n * S[k].rows && !memcmp(&yn[d], &r[d], 4)) d++;
                    if (!pass) {
                        CHECK(d == (size_t)n * S[k].rows, "exact: job %d (%d x %d, fmt %d), %d tokens: token %zu row %zu: %.9g, alone %.9g", k, S[k].rows,
                              S[k].cols, S[k].fmt, n, d / S[k].rows, d % S[k].rows, yn[d], r[d]);
                        checked += (int64_t)n * S[k].rows;
                    } else if (S[k].reg && S[k].cols >= 1024) /* the SGEMM's sums are in another order */
                        CHECK(d < (size_t)n * S[k].rows, "exact off: job %d, %d tokens: bit-equal to the one-token rows (the check could not fail)", k, n);
                }
                free(ref);
            }
        }
    }
    df_cuda_set_lean_mask(-1);
    CHECK(f8 > 0, "exact: no one-token product went through k_mm_f8 (the emulated path untested)");
    for (int k = 0; k < NJ; k++) {
        if (S[k].reg) B->weight_unregister(&w[k]);
        B->free(y[k]);
        free(data[k]);
    }
    free(f8d), free(f8s);
    B->free(x);
    printf("test_backend_cuda: exact products: %lld rows of %d groups at 2..%d tokens x 3 masks bit-equal to one-token products (%lld "
           "one-token launches of k_mm_f8)\n", (long long)checked, NG, NT, (long long)f8);
}
static int cpu_argmax(const float *x, int n) {
    df_act *h = df_backend_cpu.alloc((size_t)n);
    df_backend_cpu.write(h, x, (size_t)n);
    const int id = df_backend_cpu.next_token_wait(df_backend_cpu.next_token(h, n));
    df_backend_cpu.free(h);
    return id;
}
static void ahead_checks(void) {
    const float nan = NAN, inf = INFINITY;
    const float cases[][6] = {{1, 3, 3, 2, 0, 0}, {nan, 5, 6, 1, 2, 3}, {1, nan, 7, nan, 7, 2}, {-inf, -inf, -inf, -inf, -inf, -inf},
                              {-0.0f, 0.0f, -1, -2, -3, -4}, {0.0f, -0.0f, -1, -2, -3, -4}, {-5, inf, 3, inf, nan, 1}, {2, 2, 2, 2, 2, 2}};
    df_act *b = df_backend_cuda.alloc(151936);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        df_backend_cuda.write(b, cases[c], 6);
        const int64_t t = df_backend_cuda.next_token(b, 6);
        const int got = df_backend_cuda.next_token_wait(t), want = cpu_argmax(cases[c], 6);
        CHECK(got == want, "next_token case %zu: %d, the CPU's %d", c, got, want);
    }
    static float x[151936];
    for (int r = 0; r < 60; r++) {
        const int n = r % 3 == 0 ? 151936 : r % 3 == 1 ? 8192 : 1 + (int)(rnd() % 5000);
        for (int i = 0; i < n; i++) x[i] = r % 2 ? (float)(rnd() % 9) - 4 : (float)(rnd() % 100000) / 997.0f; /* ties, or few */
        if (r % 5 == 0) x[rnd() % n] = NAN;
        if (r % 7 == 0) x[0] = NAN;
        df_backend_cuda.write(b, x, (size_t)n);
        const int w1 = cpu_argmax(x, n);
        const int64_t t1 = df_backend_cuda.next_token(b, n);
        x[n - 1] = 1e30f; /* a second ticket outstanding before the first is read */
        df_backend_cuda.write(b, x, (size_t)n);
        const int64_t t2 = df_backend_cuda.next_token(b, n);
        const int g1 = df_backend_cuda.next_token_wait(t1), g2 = df_backend_cuda.next_token_wait(t2);
        const int w2 = cpu_argmax(x, n);
        CHECK(g1 == w1 && g2 == w2, "next_token random %d (n %d): %d vs %d, second ticket %d vs %d", r, n, g1, w1, g2, w2);
    }
    for (int r = 0; r < 20; r++) {
        const int n = 1 + (int)(rnd() % 151936);
        for (int i = 0; i < n; i++) x[i] = (float)(rnd() % 13) - 6;
        df_backend_cuda.write(b, x, (size_t)n);
        const int64_t t = df_backend_cuda.next_token(b, n);
        CHECK(df_backend_cuda.next_token_wait(t) == cpu_argmax(x, n), "next_token alone %d (n %d)", r, n);
    }
    /* embed_token: the row of the slot, as df_dequant_row gives it */
    enum { R = 50, C = 300 };
    static uint8_t raw[R * C * 4];
    static float ref[C], got[C];
    const struct { int fmt, gt, eb; } kinds[] = {{DF_W_F32, 0, 4}, {DF_W_F16, 0, 2}, {DF_W_BF16, 0, 2}, {DF_W_GGML, DF_GGML_F16, 2}};
    df_act *out = df_backend_cuda.alloc(C), *lg = df_backend_cuda.alloc(R);
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        for (size_t i = 0; i < sizeof raw; i++) raw[i] = (uint8_t)rnd();
        if (kinds[k].eb == 2) /* no NaN / infinity codes: exponents below the top */
            for (size_t i = 1; i < (size_t)R * C * 2; i += 2) raw[i] &= 0x3f;
        else
            for (size_t i = 3; i < (size_t)R * C * 4; i += 4) raw[i] &= 0x3f;
        df_weight w;
        memset(&w, 0, sizeof w);
        w.fmt = (df_wfmt)kinds[k].fmt, w.ggml_type = kinds[k].gt, w.rows = R, w.cols = C, w.data = raw, w.row_bytes = (size_t)C * kinds[k].eb;
        CHECK(df_backend_cuda.embed_token(&w, NULL) == DF_EUNSUPPORTED, "embed_token of an unregistered weight (kind %zu)", k);
        CHECK(df_backend_cuda.weight_register(&w) == 0 && df_backend_cuda.embed_token(&w, NULL) == 0, "kind %zu: registered", k);
        for (int row = 0; row < R; row += 7) {
            float l[R];
            for (int i = 0; i < R; i++) l[i] = i == row ? 1.0f : 0.0f;
            df_backend_cuda.write(lg, l, R);
            const int64_t t = df_backend_cuda.next_token(lg, R);
            CHECK(df_backend_cuda.embed_token(&w, out) == 0, "embed_token kind %zu", k);
            CHECK(df_backend_cuda.next_token_wait(t) == row, "the slot's row");
            df_backend_cuda.read(got, out, C);
            df_dequant_row(&w, row, ref);
            int bad = 0;
            for (int c = 0; c < C; c++) bad += fbits(got[c]) != fbits(ref[c]);
            CHECK(!bad, "embed_token kind %zu row %d: %d of %d values differ from df_dequant_row", k, row, bad, C);
        }
        df_backend_cuda.weight_unregister(&w);
    }
    df_weight f8;
    memset(&f8, 0, sizeof f8);
    f8.fmt = DF_W_FP8, f8.rows = R, f8.cols = 128, f8.data = raw, f8.row_bytes = 128, f8.blk_r = 128, f8.blk_c = 128;
    static float sc[1] = {1.0f};
    f8.scale = (const uint8_t *)sc, f8.scale_dtype = DF_SCALE_F32, f8.scale_cols = 1;
    if (df_backend_cuda.weight_register(&f8) == 0) {
        CHECK(df_backend_cuda.embed_token(&f8, NULL) == DF_EUNSUPPORTED, "embed_token of an FP8 weight: not gathered");
        df_backend_cuda.weight_unregister(&f8);
    }
    df_backend_cuda.free(b), df_backend_cuda.free(out), df_backend_cuda.free(lg);
}

#endif

#ifdef DF_CUDA
/* Round 25: the launches between host-visible points recorded and issued as a CUDA graph. Steps of ~24 launches
 * (add, scale, axpy, rmsnorm, add_rmsnorm), each step on the other of two buffer sets with its own scalars, and every
 * third step on fewer rows (other grids): the graph's nodes get other arguments and shapes. Run with recording off
 * (every launch direct) and on with graphs from 2 launches: the same bits after every step; a read in the middle of
 * step 4 (the recorded launches go out before it, the rest after); step 6 with the check for an idle GPU at a step's
 * first launch on (after reads it is idle: launched one by one); the graph built once for the step's sequence and
 * replayed (launches, nodes updated) the other steps. */
static void graph_checks(void) {
    const df_backend_ops *B = &df_backend_cuda;
    enum { COLS = 2048, ROWS = 3, STEPS = 8 };
    const size_t N = (size_t)ROWS * COLS;
    static float h0[2][ROWS * COLS], g[COLS], out[2][STEPS][2][ROWS * COLS], mid[2][ROWS * COLS];
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < N; i++) h0[s][i] = frnd();
    for (int i = 0; i < COLS; i++) g[i] = frnd();
    CHECK(B->param_register(g, COLS) == 0, "param_register"); /* else each norm uploads it: a copy, a flush */
    int64_t st0[7], st1[7];
    for (int on = 0; on < 2; on++) {
        df_cuda_set_graph(on, on ? 2 : 0);
        df_cuda_graph_stats(st0);
        df_act *a[2], *b[2], *o[2];
        for (int s = 0; s < 2; s++) a[s] = B->alloc(N), b[s] = B->alloc(N), o[s] = B->alloc(N), B->write(a[s], h0[s], N), B->write(b[s], h0[1 - s], N);
        for (int step = 0; step < STEPS; step++) {
            const int s = step & 1, rows = step % 3 == 2 ? 1 : ROWS;
            const size_t n = (size_t)rows * COLS;
            /* each step follows reads, so the GPU is idle at its first launch: recorded all the same but for step 6 (the
             * check on: it goes out launch by launch) */
            df_cuda_set_graph_idle_check(step == 6);
            for (int k = 0; k < 4; k++) {
                B->add(a[s], b[s], n);
                B->scale(a[s], 0.5f + 0.01f * (float)(step + k), n);
                B->axpy(b[s], -0.25f - 0.001f * (float)step, a[s], n);
                B->rmsnorm(o[s], COLS, a[s], COLS, g, rows, COLS, 1e-6f);
                B->add_rmsnorm(o[s], b[s], o[s], g, rows, COLS, 1e-5f);
                B->add(a[s], o[s], n);
                if (step == 4 && k == 1) B->read(mid[on], a[s], N); /* a flush in the middle of the sequence */
            }
            B->read(out[on][step][0], a[s], N), B->read(out[on][step][1], b[s], N);
        }
        for (int s = 0; s < 2; s++) B->free(a[s]), B->free(b[s]), B->free(o[s]);
        df_cuda_graph_stats(st1);
        if (on) {
            CHECK(st1[2] - st0[2] >= 1 && st1[2] - st0[2] <= 3, "graphs built: %lld (the step's sequence once; the 1-row steps' too)", (long long)(st1[2] - st0[2]));
            CHECK(st1[1] - st0[1] >= STEPS - 4, "graph launches: %lld of %d steps", (long long)(st1[1] - st0[1]), STEPS);
            CHECK(st1[6] - st0[6] >= 1, "no step found the GPU idle (step 6 should)");
            CHECK(st1[3] - st0[3] > 0, "graph nodes updated: %lld", (long long)(st1[3] - st0[3]));
        } else CHECK(st1[1] == st0[1] && st1[5] == st0[5], "recording off: %lld graph launches, %lld records", (long long)(st1[1] - st0[1]), (long long)(st1[5] - st0[5]));
    }
    CHECK(!memcmp(mid[0], mid[1], sizeof mid[0]), "graph: the read in the middle of a step differs from direct launches");
    int bad = 0;
    for (int step = 0; step < STEPS; step++) bad += !!memcmp(out[0][step], out[1][step], sizeof out[0][step]);
    CHECK(!bad, "graph: %d of %d steps' results differ from direct launches", bad, STEPS);
    df_cuda_set_graph(1, 16);
    df_cuda_set_graph_idle_check(1);
}
#endif

#ifdef DF_CUDA
/* decode_layers declines what it does not cover, with nothing launched: off (the default), and on with another
 * model's shapes (the model-level check of the kernel itself: device_run.sh step persist, eval --decode-from) */
static void decode_layers_checks(void) {
    df_decode_layer L;
    memset(&L, 0, sizeof L);
    df_act *h = df_backend_cuda.alloc(64), *cs = df_backend_cuda.alloc(64);
    df_decode_layers_args a = {&L, 1, h, cs, 3, 64, 4, 2, 16, 8, 2, 32, 1e-6f, 0.25f};
    const int64_t l0 = df_cuda_dec_launches();
    df_cuda_set_persist(0);
    CHECK(df_backend_cuda.decode_layers && df_backend_cuda.decode_layers(&a) == 1, "decode_layers off: declined");
    CHECK(df_backend_cuda.decode_layers(NULL) == 1, "decode_layers off: says so");
    df_cuda_set_persist(1);
    CHECK(df_backend_cuda.decode_layers(NULL) == 0, "decode_layers on: says so");
    CHECK(df_backend_cuda.decode_layers(&a) == 1, "decode_layers on, another model's shapes: declined");
    CHECK(df_cuda_dec_launches() == l0, "nothing launched (%lld)", (long long)(df_cuda_dec_launches() - l0));
    df_cuda_set_persist(-1);
    df_backend_cuda.free(h), df_backend_cuda.free(cs);
}
#endif

int main(void) {
    char err[256] = "";
    CHECK(df_backend_choose(NULL, err, sizeof err) == 0 && df_be == &df_backend_cpu, "NULL keeps the default (cpu)");
    CHECK(df_backend_choose("cpu", err, sizeof err) == 0 && df_be == &df_backend_cpu, "cpu");
    err[0] = 0;
    CHECK(df_backend_choose("gpu", err, sizeof err) == DF_EINPUT && strstr(err, "expected cpu, cuda or auto, got 'gpu'"), "gpu: %s", err);
    CHECK(df_be == &df_backend_cpu, "a refused name leaves the selection");
#ifndef DF_CUDA
    CHECK(!df_backend_cuda_built() && !df_backend_find("cuda"), "a CPU-only build has no cuda backend");
    err[0] = 0;
    CHECK(df_backend_choose("cuda", err, sizeof err) == DF_EUNSUPPORTED && strstr(err, "built without CUDA") && !strchr(err, '\n'), "cuda: %s", err);
    CHECK(df_backend_choose("auto", err, sizeof err) == 0 && df_be == &df_backend_cpu, "auto without CUDA is cpu");
#else
    CHECK(df_backend_cuda_built() && df_backend_find("cuda") == &df_backend_cuda, "a CUDA build lists cuda");
    const int dev = df_cuda_available();
    err[0] = 0;
    int rc = df_backend_choose("cuda", err, sizeof err);
    CHECK(dev ? rc == 0 && df_be == &df_backend_cuda : rc == DF_EUNSUPPORTED && strstr(err, "no CUDA device"), "cuda (device %d): rc %d %s", dev, rc, err);
    df_backend_select("cpu");
    CHECK(df_backend_choose("auto", err, sizeof err) == 0 && df_be == (dev ? &df_backend_cuda : &df_backend_cpu), "auto (device %d)", dev);
    df_backend_select("cpu");
    /* block types without CUDA kernels are refused at register time, before any device call */
    static const int refused[] = {DF_GGML_Q8_1, DF_GGML_Q8_K, DF_GGML_IQ2_XXS, DF_GGML_IQ4_NL, DF_GGML_TQ1_0, DF_GGML_NVFP4, DF_GGML_Q1_0};
    uint8_t bytes[512] = {0};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        df_weight w;
        memset(&w, 0, sizeof w);
        w.fmt = DF_W_GGML, w.ggml_type = refused[i], w.rows = 1, w.cols = 256, w.data = bytes, w.row_bytes = sizeof bytes;
        rc = df_backend_cuda.weight_register(&w);
        CHECK(rc == DF_EUNSUPPORTED && !w.handle, "GGML type %d: rc %d", refused[i], rc);
    }
    df_weight bad;
    memset(&bad, 0, sizeof bad);
    bad.fmt = DF_W_FP8, bad.rows = 1, bad.cols = 16, bad.data = bytes, bad.row_bytes = 16; /* no block shape */
    CHECK(df_backend_cuda.weight_register(&bad) == DF_EUNSUPPORTED && !bad.handle, "FP8 without a block shape");
    /* On a device: the 8 routed experts of a MoE product (weights with an ident, never registered: the VRAM
     * expert cache serves them) go out in ONE launch of the product kernel, with the CPU's results. Before the
     * cached experts joined the batching each ran in a launch of its own (8 here). */
    if (dev) {
        df_backend_select("cuda");
        df_cuda_set_memory((int64_t)256 << 20, 0, (int64_t)8 * 96 * 256 * 4); /* a cache of these 8 experts, not all of VRAM */
        enum { NE = 8, R = 96, C = 256 };
        static float wv[NE][R * C], xv[C], yv[NE][R], yc[R];
        df_weight ew[NE];
        df_mv_job jobs[NE];
        df_act *x = df_backend_cuda.alloc(C), *y[NE];
        for (int c = 0; c < C; c++) xv[c] = (float)((c * 37 % 101) - 50) / 64.0f;
        df_backend_cuda.write(x, xv, C);
        for (int e = 0; e < NE; e++) {
            for (int i = 0; i < R * C; i++) wv[e][i] = (float)(((i + 13 * e) * 29 % 97) - 48) / 128.0f;
            memset(&ew[e], 0, sizeof ew[e]);
            ew[e].fmt = DF_W_F32, ew[e].rows = R, ew[e].cols = C, ew[e].data = (const uint8_t *)wv[e], ew[e].row_bytes = C * sizeof(float);
            ew[e].ident = df_expert_ident(0, e, 0);
            y[e] = df_backend_cuda.alloc(R);
            jobs[e].w = &ew[e], jobs[e].x = x, jobs[e].y = y[e];
        }
        for (int pass = 0; pass < 2; pass++) { /* misses (copies queued), then hits */
            const int64_t l0 = df_cuda_mm_launches();
            df_backend_cuda.matmul_batch(jobs, NE, 1);
            const int64_t launches = df_cuda_mm_launches() - l0;
            CHECK(launches == 1, "pass %d: 8 cached experts in %lld launches, expected 1", pass, (long long)launches);
            if (df_backend_cuda.experts_done) df_backend_cuda.experts_done();
            for (int e = 0; e < NE; e++) {
                df_backend_cuda.read(yv[e], y[e], R);
                for (int r = 0; r < R; r++) yc[r] = df_dot_row(&ew[e], r, xv);
                double d = 0, n2 = 0;
                for (int r = 0; r < R; r++) d += (double)(yv[e][r] - yc[r]) * (yv[e][r] - yc[r]), n2 += (double)yc[r] * yc[r];
                CHECK(d <= 1e-10 * n2, "pass %d expert %d: rel L2^2 %g against the CPU", pass, e, n2 > 0 ? d / n2 : d);
            }
        }
        /* One-token dense products of few blocks (q/k/v, o, router, lm_head of a decode step) run in 4-warp
         * blocks with a small job table (df_cuda_set_lean(1), the default): the same bits as the 8-warp launch
         * with the full table (lean off), jobs whose rows split over 1 and 2 warps, in one launch each way. */
        {
            /* (with lean: 4 steps of loads per lane before the products (bit 4); job 3's 150 steps leave lanes
             * with 5 and 4 steps: the partial second round) */
            enum { ND = 4 };
            static const int DR[ND] = {200, 96, 61, 40}, DC[ND] = {512, 4096, 1024, 600};
            static float dw[ND][200 * 4096], dx[4096], dy[2][ND][200];
            df_weight w2[ND];
            df_mv_job dj[ND];
            df_act *xd = df_backend_cuda.alloc(4096), *yd[ND];
            for (int c = 0; c < 4096; c++) dx[c] = (float)((c * 53 % 113) - 56) / 32.0f;
            df_backend_cuda.write(xd, dx, 4096);
            for (int k = 0; k < ND; k++) {
                for (int i = 0; i < DR[k] * DC[k]; i++) dw[k][i] = (float)(((i + 7 * k) * 31 % 89) - 44) / 256.0f;
                memset(&w2[k], 0, sizeof w2[k]);
                w2[k].fmt = DF_W_F32, w2[k].rows = DR[k], w2[k].cols = DC[k], w2[k].data = (const uint8_t *)dw[k], w2[k].row_bytes = (size_t)DC[k] * sizeof(float);
                CHECK(df_backend_cuda.weight_register(&w2[k]) == 0 && w2[k].handle, "dense weight %d registered", k);
                yd[k] = df_backend_cuda.alloc((size_t)DR[k]);
                dj[k].w = &w2[k], dj[k].x = xd, dj[k].y = yd[k];
            }
            for (int lean = 1; lean >= 0; lean--) {
                df_cuda_set_lean(lean);
                const int64_t l0 = df_cuda_mm_launches(), n0 = df_cuda_mm_narrow_launches(), p0 = df_cuda_pdl_launches();
                df_backend_cuda.matmul_batch(dj, ND, 1);
                const int64_t launches = df_cuda_mm_launches() - l0, narrow = df_cuda_mm_narrow_launches() - n0, pdl = df_cuda_pdl_launches() - p0;
                CHECK(launches == 1 && narrow == lean, "lean %d: %lld launches (%lld narrow), expected 1 (%d)", lean, (long long)launches, (long long)narrow, lean);
                /* round 7 (bit 32): launched programmatically, its registered rows prefetched before it waits: the same bits */
                CHECK(pdl == lean, "lean %d: %lld programmatic launches, expected %d", lean, (long long)pdl, lean);
                for (int k = 0; k < ND; k++) df_backend_cuda.read(dy[lean][k], yd[k], (size_t)DR[k]);
            }
            df_cuda_set_lean(1);
            /* round 8 (bit 512, DELTAFIN_CUDA_MM_SPLIT1): rows split over more warps (job 1's 32 steps per lane over 8
             * warps at 8, job 0's 4 steps still over 1): one launch, near the CPU, and a row that is not split keeps its bits */
            for (int s1 = 8; s1 >= 1; s1 /= 2) {
                static float ys[ND][200];
                df_cuda_set_split1(s1);
                const int64_t l0 = df_cuda_mm_launches();
                df_backend_cuda.matmul_batch(dj, ND, 1);
                CHECK(df_cuda_mm_launches() - l0 == 1, "split %d: %lld launches, expected 1", s1, (long long)(df_cuda_mm_launches() - l0));
                for (int k = 0; k < ND; k++) {
                    df_backend_cuda.read(ys[k], yd[k], (size_t)DR[k]);
                    double d = 0, n2 = 0;
                    for (int r = 0; r < DR[k]; r++) {
                        const float c = df_dot_row(&w2[k], r, dx);
                        d += (double)(ys[k][r] - c) * (ys[k][r] - c), n2 += (double)c * c;
                    }
                    CHECK(d <= 1e-10 * n2, "split %d, dense job %d: rel L2^2 %g against the CPU", s1, k, n2 > 0 ? d / n2 : d);
                }
                if (s1 == 8) CHECK(!memcmp(ys[0], dy[1][0], (size_t)DR[0] * sizeof(float)), "split 8: job 0 (4 steps per lane, not split) changed bits");
            }
            df_cuda_set_split1(0);
            for (int k = 0; k < ND; k++) {
                CHECK(!memcmp(dy[0][k], dy[1][k], (size_t)DR[k] * sizeof(float)), "dense job %d: the narrow launch changed bits", k);
                double d = 0, n2 = 0;
                for (int r = 0; r < DR[k]; r++) {
                    const float c = df_dot_row(&w2[k], r, dx);
                    d += (double)(dy[1][k][r] - c) * (dy[1][k][r] - c), n2 += (double)c * c;
                }
                CHECK(d <= 1e-10 * n2, "dense job %d: rel L2^2 %g against the CPU", k, n2 > 0 ? d / n2 : d);
                df_backend_cuda.weight_unregister(&w2[k]);
                df_backend_cuda.free(yd[k]);
            }
            df_backend_cuda.free(xd);
        }
        for (int e = 0; e < NE; e++) df_backend_cuda.free(y[e]);
        df_backend_cuda.free(x);
        if (df_backend_cuda.tier_reset) df_backend_cuda.tier_reset();
        fused_moe_checks(4, 128);
        fused_moe_checks(8, 760);
        mm_cp_checks();
        mm_bal_checks();
        fp8_mm_checks();
        fp8_moe_checks();
        mla_early_checks();
        bf16_f8_checks();
        staged_copy_checks();
        split_f16_checks();
        split_shared_x_checks();
        attn_split_checks();
        for (int th = 128; th <= 256; th *= 2) {
            attn_dec_checks(4, -1, th);
            attn_dec_checks(4, 17, th); /* the tree from 17 parts (257 or 513 positions) on */
            attn_dec_checks(4, 0, th);  /* never the tree */
        }
        attn_dec_checks(2, -1, 0);
        df_cuda_set_attn_tree(-1);
        fused_rows_checks();
        graph_checks();
        ahead_checks();
        exact_checks();
        decode_layers_checks();
        moe_chain_checks(); /* last: it resets the expert cache and its size */
        df_backend_select("cpu");
    } else
        printf("test_backend_cuda: no CUDA device: the device checks (batching of cached experts, narrow launches, the device-routed MoE) are SKIPPED\n");
#endif
    printf("test_backend_cuda: %s build, %d failures\n", df_backend_cuda_built() ? "CUDA" : "CPU-only", failures);
    return failures ? 1 : 0;
}
