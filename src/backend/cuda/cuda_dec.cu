/* cuda_dec.cu - decode_layers (backend.h): one decode position through every layer of a Qwen3-MoE-kind model as ONE
 * cooperative launch of the persistent kernel of dec_kernel.cuh (resident blocks taking the tasks of every op of every
 * layer in order, waiting on per-op counters instead of launch boundaries), instead of ~6 launches a layer.
 *
 * Opt-in (DELTAFIN_CUDA_PERSIST=1, or df_cuda_set_persist) until the GPU has measured it: bench/cuda/layer_bench.cu
 * measures this kernel against the launch schedule on synthetic weights (docs/PERFORMANCE.md, round 27), and the same
 * kernel source, run by the CPU emulation, matches the CPU backend on a real checkpoint (make dec-emu-check).
 *
 * It runs when the model has the kernel's shapes (dec_layers.h: hidden 2048, 32 q heads / 4 KV heads of 128, 128
 * experts of 768, top 8: Qwen3-30B-A3B's), every spine weight of the run is BF16 and resident in VRAM, its norm gains
 * registered, and every layer's routed experts are in the device expert cache (their device table valid: moe_table);
 * anything else is declined (1) and the model takes the op-by-op path. Reads the weights in place: the layer table
 * holds the registered copies' pointers and each layer's expert table is the backend's own (moe_table's DW array, read
 * through a stride). Its own device memory: the table, Net, the scratch of the tasks (attention parts grow with the
 * position, doubling). Each call: the recorded launches flushed, the counters zeroed (a memset), one cooperative launch
 * on the legacy stream, nothing read back. The table and Net are copied (synchronously: the host waits for the device)
 * only when they change: the first call, a layer's expert table or the parts buffer reallocated, another session's
 * residual stream and RoPE table (sessions that alternate steps pay a copy a step). */
#include "backend/cuda/cuda_int.cuh"
#include "backend/cuda/dec_kernel.cuh"

#include <stddef.h>

static int g_persist = -1; /* DELTAFIN_CUDA_PERSIST=1: on; -1: not read yet */
static int64_t g_dec_launches;
extern "C" void df_cuda_set_persist(int on) {
    pthread_mutex_lock(&g_mu);
    g_persist = on < 0 ? -1 : on != 0;
    pthread_mutex_unlock(&g_mu);
}
extern "C" int64_t df_cuda_dec_launches(void) { return g_dec_launches; }
static int persist_on(void) {
    if (g_persist < 0) {
        const char *e = getenv("DELTAFIN_CUDA_PERSIST");
        g_persist = e && !strcmp(e, "1");
    }
    return g_persist;
}

static struct {
    int state;                  /* 0 not set up; 1 ready; -1 this device cannot (said once) */
    int G;                      /* resident blocks: the SMs x the blocks an SM holds */
    dec::Net host, *net;        /* Net as the device copy holds it */
    dec_layer *ltab, *ltab_host; /* the layer table (device, host copy) */
    int nl;
    int part_nch;               /* attention chunks the parts buffer holds */
} g_dc;

static int dec_setup(void) {
    if (g_dc.state) return g_dc.state;
    int dev = 0, coop = 0, sms = 0, occ = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaFuncSetAttribute((const void *)dec::k_persist, cudaFuncAttributeMaxDynamicSharedMemorySize, PSMEM_BYTES);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, dec::k_persist, TH, PSMEM_BYTES);
    if (e != cudaSuccess || !coop || occ < 1 || sms * occ > 64 * dec::TOPK) {
        if (e != cudaSuccess) cudaGetLastError();
        fprintf(stderr, "deltafin: cuda backend: decode_layers: the persistent decode kernel cannot run here (%s; cooperative launch %d, "
                        "%d SMs x %d blocks); decode goes op by op\n", e != cudaSuccess ? cudaGetErrorString(e) : "no error", coop, sms, occ);
        return g_dc.state = -1;
    }
    g_dc.G = sms * occ;
    return g_dc.state = 1;
}

/* opted in but declined: said once a reason (the model then decodes op by op) */
static int decline(const char *why, int layer) {
    static int said;
    if (said++) return 1;
    char at[32] = "";
    if (layer >= 0) snprintf(at, sizeof at, " at layer %d", layer);
    fprintf(stderr, "deltafin: cuda backend: decode_layers (DELTAFIN_CUDA_PERSIST=1) declined%s: %s; decode goes op by op\n", at, why);
    return 1;
}

/* the device view of a resident BF16 weight of rows x cols (16-byte aligned rows); 0: not one */
static int bf16_view(const df_weight *w, int64_t rows, int64_t cols, DW *out) {
    if (!w || !w_resident(w) || w_get(w, S_WD0, S_WS0, out, "decode_layers")) return 0;
    return out->fmt == DF_W_BF16 && out->rows == rows && out->cols == cols && out->row_bytes == (size_t)cols * 2 && !((uintptr_t)out->data & 15);
}

/* (re)allocates a buffer of the task scratch; 0 or DF_ENOMEM */
static int grow(void **p, size_t bytes) {
    if (*p) dev_free(*p, "decode_layers");
    *p = dev_alloc(bytes, "decode_layers");
    return *p ? 0 : DF_ENOMEM;
}

int g_decode_layers(const df_decode_layers_args *a) {
    if (!persist_on()) return 1;
    if (!a) return 0; /* (on: it may take runs) */
    LOCK();
    using namespace dec;
    if (a->n_layers < 1 || a->pos < 0 || a->hidden != H || a->n_heads != NQ || a->n_kv_heads != NKV || a->head_dim != HD_ || a->n_experts != NE ||
        a->k != TOPK || a->moe_inter != IE || !a->h || !a->rope_cs)
        return decline("the model's shapes are not the kernel's (dec_layers.h: hidden 2048, 32 / 4 heads of 128, 128 experts of 768, top 8)", -1);
    if (dec_setup() < 0) return 1;
    /* the layer table from what the backend holds now */
    if (a->n_layers > g_dc.nl) {
        free(g_dc.ltab_host), g_dc.ltab_host = (dec_layer *)calloc((size_t)a->n_layers, sizeof(dec_layer));
        if (!g_dc.ltab_host || grow((void **)&g_dc.ltab, (size_t)a->n_layers * sizeof(dec_layer))) return g_dc.nl = 0, DF_ENOMEM;
        memset(g_dc.ltab_host, 0, (size_t)a->n_layers * sizeof(dec_layer));
        g_dc.nl = a->n_layers;
    }
    static dec_layer *t = NULL;
    static int tn = 0;
    if (tn < a->n_layers) {
        free(t), t = (dec_layer *)calloc((size_t)a->n_layers, sizeof *t), tn = t ? a->n_layers : 0;
        if (!t) return DF_ENOMEM;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const df_decode_layer *L = &a->layers[l];
        DW q, k, v, o, r;
        if (!bf16_view(L->wq, QR, H, &q) || !bf16_view(L->wk, KR, H, &k) || !bf16_view(L->wv, KR, H, &v) || !bf16_view(L->wo, H, QR, &o) ||
            !bf16_view(L->router, NE, H, &r))
            return decline("a q/k/v/o or router weight is not a VRAM-resident BF16 tensor of the kernel's shape", l);
        const DW *h0 = NULL, *tab = moe_resident_held(L->layer, NE, TOPK, 1) == 1 ? moe_table(L->layer, NE, &h0) : NULL;
        if (!tab) return decline("the layer's routed experts are not all in the VRAM expert cache", l);
        for (int p = 0; p < 3; p++) /* every expert of the table has expert 0's shapes (moe_resident built it so) */
            if (h0[p].fmt != DF_W_BF16 || h0[p].rows != (p < 2 ? IE : H) || h0[p].cols != (p < 2 ? H : IE) ||
                h0[p].row_bytes != (size_t)h0[p].cols * 2)
                return decline("the routed experts are not BF16 of the kernel's shape", l);
        const float *n1 = param_registered(L->attn_norm, H), *n2 = param_registered(L->ffn_norm, H);
        const float *qn = param_registered(L->q_norm, HD_), *kn = param_registered(L->k_norm, HD_);
        if (!n1 || !n2 || !qn || !kn || !L->cache) return decline("a norm gain is not registered with the backend", l);
        dec_layer *d = &t[l];
        d->wq = (const uint16_t *)q.data, d->wk = (const uint16_t *)k.data, d->wv = (const uint16_t *)v.data;
        d->wo = (const uint16_t *)o.data, d->wr = (const uint16_t *)r.data;
        d->etab = (const uint8_t *)tab + offsetof(DW, data), d->estride = (int)sizeof(DW);
        d->n1 = n1, d->n2 = n2, d->qn = qn, d->kn = kn, d->kv = DP(L->cache);
    }
    Net n = g_dc.host;
    const int nch = (a->pos + CH) / CH;
    if (!g_dc.net && grow((void **)&g_dc.net, sizeof(Net))) return DF_ENOMEM;
    if (!n.cnt) { /* the first call: the task scratch (n.cnt last: set only once every buffer is there) */
        if (grow((void **)&n.qkv, QKV * sizeof(float)) || grow((void **)&n.att, QR * sizeof(float)) || grow((void **)&n.lg, NE * sizeof(float)) ||
            grow((void **)&n.act, (size_t)TOPK * IE * sizeof(float)) || grow((void **)&n.dy, (size_t)TOPK * H * sizeof(float)) ||
            grow((void **)&n.cnt, (size_t)C_N * 32 * sizeof(unsigned))) {
            g_dc.host = n, g_dc.host.cnt = NULL; /* (what was allocated is reused by the next try) */
            return DF_ENOMEM;
        }
        n.pf = 1, n.pexp = 1; /* the default schedule: weights loaded before the waits, down waiting for its own expert */
        n.trap = 1;           /* a lost counter (a bug) fails the launch, reported, rather than leaving garbage in h */
        decompose(n, g_dc.G);
    }
    if (nch > g_dc.part_nch) { /* the attention's parts: twice the room (a new buffer means a new Net, copied synchronously) */
        const int want = nch + 2 > 2 * g_dc.part_nch ? nch + 2 : 2 * g_dc.part_nch;
        if (grow((void **)&n.part, (size_t)NKV * want * 8 * KS * sizeof(float))) return g_dc.part_nch = 0, g_dc.host.part = NULL, DF_ENOMEM;
        g_dc.part_nch = want;
    }
    n.lw = g_dc.ltab, n.cs = DCP(a->rope_cs), n.h = DP(a->h), n.eps = a->eps, n.scale = a->scale, n.L = a->n_layers, n.V = 0;
    n.ids_dbg = NULL, n.dbg_n = 0; /* (route() writes ids only for s < dbg_n) */
    gr_flush(); /* the recorded launches go first; the copies below wait for the kernels that read the old table */
    if (memcmp(t, g_dc.ltab_host, (size_t)a->n_layers * sizeof *t)) {
        CK("decode_layers", cudaMemcpy(g_dc.ltab, t, (size_t)a->n_layers * sizeof *t, cudaMemcpyHostToDevice));
        memcpy(g_dc.ltab_host, t, (size_t)a->n_layers * sizeof *t);
    }
    if (memcmp(&n, &g_dc.host, sizeof n)) {
        CK("decode_layers", cudaMemcpy(g_dc.net, &n, sizeof n, cudaMemcpyHostToDevice));
        g_dc.host = n;
    }
    cudaError_t e = cudaMemsetAsync(n.cnt, 0, (size_t)C_N * 32 * sizeof(unsigned), 0);
    if (e == cudaSuccess) {
        Net *np = g_dc.net;
        int s0 = 0, ns = a->n_layers, pos = a->pos;
        void *args[] = {(void *)&np, &s0, &ns, &pos};
        e = cudaLaunchCooperativeKernel((const void *)k_persist, dim3((unsigned)g_dc.G), dim3(TH), args, PSMEM_BYTES, 0);
    }
    if (e != cudaSuccess) {
        report("decode_layers", e);
        return DF_EINTERNAL;
    }
    post("decode_layers");
    if (!g_dec_launches++)
        fprintf(stderr, "deltafin: cuda backend: decode_layers (DELTAFIN_CUDA_PERSIST=1): every decode step's %d layers in one persistent launch of %d blocks\n",
                a->n_layers, g_dc.G);
    moe_count_hits((int64_t)3 * TOPK * a->n_layers);
    return 0;
}
