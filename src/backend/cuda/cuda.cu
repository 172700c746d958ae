/* cuda.cu - the CUDA backend: df_backend_cuda (see cuda.h and backend.h).
 *
 * Every operation of the contract, with simple and correct kernels (one
 * block per output row, per (token, head) or per channel; f32 activations
 * and accumulation; reductions of norms and softmax sums in double as the
 * CPU reference does), in cuda_ops.cu; this file holds memory, params,
 * weights and the tiers.
 *
 * VRAM budget (df_cuda_set_memory, --gpu-memory; default: free memory at
 * the first allocation minus max(512 MiB, 5%)): every device allocation is
 * counted (g_used). Activations and state beyond the budget are refused
 * with the numbers (alloc returns NULL, the caller reports). The spine
 * (registered weights) is uploaded while it fits the budget minus the
 * reserve the engine names for activations and state; a weight that does
 * not fit stays in host memory (handle with host = 1) and is copied into
 * scratch for each product: slower, never wrong, and counted in the stats.
 *
 * Routed experts (weights with an ident, never registered): a VRAM expert
 * cache keyed by (layer, expert, part) (bookkeeping in backend/vcache.c),
 * sized at the first routed product, once activations and state exist:
 * what the budget leaves after them and a scratch reserve, at most every
 * expert of the model. A miss copies the host bytes (pinned when they lie in
 * memory given to host_pin: the host expert cache's slots) into its slot on
 * a copy stream of its own, asynchronously; the compute stream waits for that
 * copy through an event, so copies overlap the compute queued before them.
 * A slot is reused only when the work that read it has run: slots used since
 * the last experts_done (called once per acquire of the MoE code) are never
 * evicted, and a copy into an older slot waits for the event recorded at the
 * experts_done that closed its last use. host_fence waits for the copies
 * issued so far; the host expert cache calls it before it rewrites a slot,
 * so a copy never reads bytes being overwritten, and nothing else waits. A weight that finds every slot in use in this layer, or is larger
 * than a slot, is copied into scratch for its product (a bypass). Params: param_register keeps a device copy
 * keyed by the host address (an open-addressing table); registering an
 * address again uploads it again. An op given a param that was never
 * registered uploads it into scratch for that call.
 *
 * Routers run on the host with the CPU backend's own code (the logits are
 * read back, the ids are host memory by contract, the weights written
 * back), so expert choices are the reference's exactly. */
#include "backend/cuda/cuda_int.cuh"

extern "C" {
#include "backend/vcache.h"
}

#include <unistd.h>

/* ---- errors ------------------------------------------------------------------- */
static int g_sync = -1; /* DELTAFIN_CUDA_SYNC=1: wait after every op (an async error then names its op) */
static int g_reported;

void report(const char *op, cudaError_t e) {
    if (g_reported++ >= 32) return;
    if (df_be_layer >= 0) fprintf(stderr, "deltafin: cuda backend: layer %d: %s: %s (%s)\n", df_be_layer, op, cudaGetErrorString(e), cudaGetErrorName(e));
    else fprintf(stderr, "deltafin: cuda backend: %s: %s (%s)\n", op, cudaGetErrorString(e), cudaGetErrorName(e));
}
void post(const char *op) {
    if (g_gr_state > 0) gr_note(op); /* recorded: its launch errors come at the flush, named by this op */
    CK(op, cudaGetLastError());
    if (g_sync < 0) {
        const char *s = getenv("DELTAFIN_CUDA_SYNC");
        g_sync = s && *s && strcmp(s, "0");
    }
    if (g_sync) CK(op, cudaDeviceSynchronize());
}

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
int64_t g_mm_launches;
extern "C" int64_t df_cuda_mm_launches(void) { return g_mm_launches; }

/* ---- DELTAFIN_CUDA_PROF: time and calls per op (a measurement aid) ------------ */
int g_prof = -1;
typedef struct { const char *op; double s; int64_t n; } prof_ent;
static prof_ent g_pt[64];
static int g_npt;
static int64_t g_prof_l0; /* launches when the table restarted */
/* DELTAFIN_CUDA_PROF=3: event pairs around ops, summed (as seconds into the table) when the pool fills, at
 * prof_restart and at tier_reset / exit. Ops nested in another op's scope are counted in both. */
typedef struct { const char *op; cudaEvent_t a, b; int done; } evpair;
#define EV_POOL 8192
static evpair g_evp[EV_POOL];
static int g_evn, g_ev_made, g_ev_skip;
static void prof_ev_flush(int count) {
    if (!g_evn) return;
    if (cudaDeviceSynchronize() != cudaSuccess) { cudaGetLastError(); g_evn = 0; return; }
    for (int i = 0; i < g_evn; i++) {
        float ms = 0;
        if (count && g_evp[i].done && cudaEventElapsedTime(&ms, g_evp[i].a, g_evp[i].b) == cudaSuccess) prof_add(g_evp[i].op, ms * 1e-3);
        else cudaGetLastError();
    }
    g_evn = 0;
}
int prof_ev_begin(const char *op) {
    if (g_ev_skip) return -1;
    if (g_evn == EV_POOL) prof_ev_flush(1);
    if (g_evn == g_ev_made) {
        if (cudaEventCreate(&g_evp[g_evn].a) != cudaSuccess || cudaEventCreate(&g_evp[g_evn].b) != cudaSuccess) { cudaGetLastError(); g_ev_skip = 1; return -1; }
        g_ev_made++;
    }
    evpair *p = &g_evp[g_evn];
    p->op = op, p->done = 0;
    if (cudaEventRecord(p->a, 0) != cudaSuccess) { cudaGetLastError(); return -1; }
    return g_evn++;
}
void prof_ev_end(int i) {
    if (i < 0 || i >= g_evn) return;
    if (cudaEventRecord(g_evp[i].b, 0) == cudaSuccess) g_evp[i].done = 1;
    else cudaGetLastError();
}
static void prof_print(void) {
    if (g_prof == 3) prof_ev_flush(1);
    double tot = 0;
    for (int i = 0; i < g_npt; i++) tot += g_pt[i].s;
    fprintf(stderr, "[cuda prof] %s: %.3f s in backend ops\n",
            g_prof == 3 ? "GPU time (CUDA events around each op)" : g_prof > 1 ? "host + GPU time (synchronized per op)" : "host time (asynchronous)", tot);
    for (int i = 0; i < g_npt; i++)
        if (g_pt[i].n) fprintf(stderr, "[cuda prof] %-20s %9lld calls %9.3f ms %8.2f us/call %5.1f%%\n", g_pt[i].op, (long long)g_pt[i].n, g_pt[i].s * 1e3,
                g_pt[i].n ? g_pt[i].s * 1e6 / g_pt[i].n : 0, tot > 0 ? 100 * g_pt[i].s / tot : 0);
    fprintf(stderr, "[cuda prof] matmul_batch launches: %lld\n", (long long)(g_mm_launches - g_prof_l0));
}
int prof_on(void) {
    if (g_prof < 0) {
        const char *v = getenv("DELTAFIN_CUDA_PROF");
        g_prof = v && *v ? atoi(v) : 0;
        if (g_prof > 0) atexit(prof_print);
    }
    return g_prof > 0;
}
double prof_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
/* DELTAFIN_CUDA_PROF_DECODE=1: the table restarts at every product of more than one token, so what is printed
 * is the decode steps after the last prefill product */
void prof_restart(void) {
    static int dec = -1;
    if (dec < 0) {
        const char *v = getenv("DELTAFIN_CUDA_PROF_DECODE");
        dec = v && *v && strcmp(v, "0");
    }
    if (!dec) return;
    if (g_prof == 3) prof_ev_flush(0);
    for (int i = 0; i < g_npt; i++) g_pt[i].s = 0, g_pt[i].n = 0;
    g_prof_l0 = g_mm_launches;
}
void prof_add(const char *op, double s) {
    int i = 0;
    while (i < g_npt && g_pt[i].op != op) i++;
    if (i == g_npt) {
        if (g_npt == 64) return;
        g_pt[g_npt++].op = op;
    }
    g_pt[i].s += s, g_pt[i].n++;
}

/* ---- device memory accounting: every allocation, by address ------------------- */
typedef struct { void *p; size_t n; } aent;
static aent *g_atab;
static size_t g_acap, g_acount;
static int64_t g_used;              /* bytes allocated now */
static int64_t g_budget = -1;       /* -1: not decided yet (default at the first allocation) */
static int64_t g_reserve;           /* kept from the spine for activations, state, scratch */
static int64_t g_expert_total;      /* bytes of the model's routed experts (caps the cache), 0: unknown */
static int64_t g_vc_part_bytes;     /* the part size the cache was sized for (vc_init) */
static int64_t g_act_used, g_spine_used, g_cache_used; /* parts of g_used */
static size_t ahash(const void *p, size_t cap) {
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33;
    return (size_t)h & (cap - 1);
}
static int aput(void *p, size_t n) {
    if ((g_acount + 1) * 2 > g_acap) {
        size_t ncap = g_acap ? g_acap * 2 : 1024;
        aent *nt = (aent *)calloc(ncap, sizeof *nt);
        if (!nt) return DF_ENOMEM;
        for (size_t i = 0; i < g_acap; i++)
            if (g_atab[i].p) {
                size_t j = ahash(g_atab[i].p, ncap);
                while (nt[j].p) j = (j + 1) & (ncap - 1);
                nt[j] = g_atab[i];
            }
        free(g_atab);
        g_atab = nt, g_acap = ncap;
    }
    size_t i = ahash(p, g_acap);
    while (g_atab[i].p) i = (i + 1) & (g_acap - 1);
    g_atab[i].p = p, g_atab[i].n = n, g_acount++;
    return 0;
}
/* Removes p's entry (backward-shift deletion); returns its size, 0 if unknown. */
static size_t adel(void *p) {
    if (!g_acap) return 0;
    const size_t m = g_acap - 1;
    size_t i = ahash(p, g_acap);
    while (g_atab[i].p && g_atab[i].p != p) i = (i + 1) & m;
    if (!g_atab[i].p) return 0;
    const size_t n = g_atab[i].n;
    g_atab[i].p = NULL, g_acount--;
    for (size_t j = (i + 1) & m; g_atab[j].p; j = (j + 1) & m) {
        size_t h = ahash(g_atab[j].p, g_acap);
        if (((j - h) & m) >= ((j - i) & m)) g_atab[i] = g_atab[j], g_atab[j].p = NULL, i = j;
    }
    return n;
}
static void budget_default(void) {
    if (g_budget >= 0) return;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) { cudaGetLastError(); fr = tot = 0; }
    int64_t margin = (int64_t)tot / 20 > ((int64_t)512 << 20) ? (int64_t)tot / 20 : ((int64_t)512 << 20);
    g_budget = (int64_t)fr > margin ? (int64_t)fr - margin : 0;
}
/* cudaMalloc, counted (*part: the share it counts into, or NULL). A device
 * refusal is reported with the device's free and total memory. */
static cudaError_t dmalloc(void **p, size_t n, int64_t *part, const char *op) {
    budget_default();
    cudaError_t e = cudaMalloc(p, n ? n : 1);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky */
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
        fprintf(stderr, "deltafin: cuda backend: %s: out of VRAM: asked %.2f MB, the device has %.2f MB free of %.2f MB "
                        "(deltafin uses %.2f MB of its %.2f MB budget); lower --gpu-memory to leave room for other programs, or use a smaller context\n",
                op, n / 1e6, fr / 1e6, tot / 1e6, g_used / 1e6, g_budget / 1e6);
        *p = NULL;
        return e;
    }
    if (aput(*p, n)) { cudaFree(*p); *p = NULL; return cudaErrorMemoryAllocation; }
    g_used += (int64_t)n;
    if (part) *part += (int64_t)n;
    return cudaSuccess;
}
static void dfree(void *p, int64_t *part, const char *op) {
    if (!p) return;
    size_t n = adel(p);
    g_used -= (int64_t)n;
    if (part) *part -= (int64_t)n;
    gr_flush(); /* kernels recorded before the free may use p */
    CK(op, cudaFree(p));
}

/* device memory an op keeps between calls (counted with the activations) */
void *dev_alloc(size_t n, const char *op) {
    void *p = NULL;
    return dmalloc(&p, n, &g_act_used, op) == cudaSuccess ? p : NULL;
}
void dev_free(void *p, const char *op) { dfree(p, &g_act_used, op); }

/* ---- scratch: device buffers that grow on demand, one per role ----------------- */
static void *g_slot[S_N];
static size_t g_slot_cap[S_N];
void *slot(int i, size_t bytes, const char *op) {
    if (bytes > g_slot_cap[i]) {
        dfree(g_slot[i], NULL, op); /* waits for the kernels that used it */
        g_slot[i] = NULL, g_slot_cap[i] = 0;
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
        if (dmalloc(&g_slot[i], cap, NULL, op) != cudaSuccess) return NULL;
        g_slot_cap[i] = cap;
    }
    return g_slot[i];
}

/* ---- memory ------------------------------------------------------------------- */

static df_act *g_alloc(size_t n) {
    LOCK();
    void *p = NULL;
    const size_t bytes = (n ? n : 1) * sizeof(float);
    budget_default();
    if (g_used + (int64_t)bytes > g_budget) {
        if (df_alloc_quiet) return NULL;
        fprintf(stderr, "deltafin: cuda backend: out of VRAM budget: asked %.2f MB for activations or session state, available %.2f MB of the "
                        "%.2f MB budget (spine %.2f MB, activations and state %.2f MB, expert cache %.2f MB, scratch %.2f MB in use); "
                        "raise --gpu-memory or use a smaller context\n",
                bytes / 1e6, (g_budget > g_used ? g_budget - g_used : 0) / 1e6, g_budget / 1e6, g_spine_used / 1e6, g_act_used / 1e6,
                g_cache_used / 1e6, (g_used - g_spine_used - g_act_used - g_cache_used) / 1e6);
        return NULL;
    }
    if (dmalloc(&p, bytes, &g_act_used, "alloc") != cudaSuccess) return NULL;
    gr_flush();
    CK("alloc", cudaMemset(p, 0, bytes));
    return (df_act *)p;
}
static void g_free(df_act *p) {
    LOCK();
    dfree(p, &g_act_used, "free");
}
static void g_write(df_act *dst, const float *src, size_t n) { PROF_SCOPE(); if (n) { gr_flush(); CK("write", cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice)); } }
static void g_read(float *dst, const df_act *src, size_t n) {
    PROF_SCOPE();
    if (!n) return;
    gr_flush_step();
    const cudaError_t e = cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) report("read", e);
    else __atomic_add_fetch(&g_host_waits, 1, __ATOMIC_SEQ_CST); /* every kernel queued before the copy has finished */
}
static void g_zero(df_act *dst, size_t n) { if (n) { gr_flush(); CK("zero", cudaMemset(dst, 0, n * sizeof(float))); } }
/* Copies within the device as kernels, not cudaMemcpy: a memcpy in the stream ends the chain of programmatic launches
 * (round 23's trace: the 256-byte rope rows MLA copies into its cache every layer cost ~2 us of idle GPU each). */
__global__ void k_copy_rows(float *dst, size_t ds, const float *src, size_t ss, int rows, int cols) {
    pdl_entry();
    const size_t N = (size_t)rows * (size_t)cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)cols, c = i % (size_t)cols;
        dst[r * ds + c] = ld_act(src + r * ss + c);
    }
}
static int g_copy_memcpy = -1; /* DELTAFIN_CUDA_MEMCPY=1: copies through cudaMemcpy2D as before round 23 (a measurement aid) */
static void g_copy_rows(df_act *dst, size_t ds, const df_act *src, size_t ss, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    if (g_copy_memcpy < 0) g_copy_memcpy = getenv("DELTAFIN_CUDA_MEMCPY") && !strcmp(getenv("DELTAFIN_CUDA_MEMCPY"), "1");
    if (g_copy_memcpy) {
        gr_flush();
        CK("copy_rows", cudaMemcpy2D(dst, (ds ? ds : (size_t)cols) * sizeof(float), src, (ss ? ss : (size_t)cols) * sizeof(float),
                                     (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice));
        return;
    }
    launch_k(k_copy_rows, dim3(blocks_for((size_t)rows * (size_t)cols, 256)), dim3(256), 0, DP(dst), ds, DCP(src), ss, rows, cols);
    post("copy_rows");
}
static void g_copy(df_act *dst, const df_act *src, size_t n) {
    if (!n) return;
    if (n > (size_t)1 << 30) { gr_flush(); CK("copy", cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice)); return; } /* cols is an int */
    g_copy_rows(dst, 0, src, 0, 1, (int)n);
}

__global__ void k_gather(float *dst, const float *src, const int *idx, int n, int cols, int scatter) { pdl_entry();
    for (int j = blockIdx.x; j < n; j += gridDim.x) {
        const int64_t d = scatter ? (int64_t)idx[j] : j, s = scatter ? j : (int64_t)idx[j];
        for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[d * cols + c] = src[s * cols + c];
    }
}
static void gather_scatter(df_act *dst, const df_act *src, const int *idx, int n, int cols, int scatter, const char *op) {
    LOCK();
    if (n <= 0 || cols <= 0) return;
    int *di = (int *)slot(S_IDX, (size_t)n * sizeof(int), op);
    if (!di) return;
    gr_flush(); /* a gather recorded before may still read the slot */
    CK(op, cudaMemcpy(di, idx, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
    if (scatter) {
        /* rows in order, as the CPU does (a repeated index: the last row wins) */
        for (int j = 0; j < n; j++) launch_k(k_gather, dim3(1), dim3(128), 0, DP(dst), DCP(src), di + j, 1, cols, 1), post(op), src = (const df_act *)(DCP(src) + cols);
        return;
    }
    launch_k(k_gather, dim3(n < 65535 ? n : 65535), dim3(128), 0, DP(dst), DCP(src), di, n, cols, 0);
    post(op);
}
static void g_gather(df_act *dst, const df_act *src, const int *idx, int n, int cols) { gather_scatter(dst, src, idx, n, cols, 0, "gather_rows"); }
static void g_scatter(df_act *dst, const int *idx, const df_act *src, int n, int cols) { gather_scatter(dst, src, idx, n, cols, 1, "scatter_rows"); }

/* ---- params: host address -> device copy ----------------------------------------- */
typedef struct { const float *host; float *dev; size_t n; } pent;
static pent *g_ptab;
static size_t g_pcap, g_pcount;
static size_t phash(const float *p, size_t cap) {
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33;
    return (size_t)h & (cap - 1);
}
static pent *pfind(const float *p) {
    if (!g_pcap) return NULL;
    for (size_t i = phash(p, g_pcap);; i = (i + 1) & (g_pcap - 1)) {
        if (g_ptab[i].host == p) return &g_ptab[i];
        if (!g_ptab[i].host) return NULL;
    }
}
static int pgrow(void) {
    size_t ncap = g_pcap ? g_pcap * 2 : 256;
    pent *nt = (pent *)calloc(ncap, sizeof(pent));
    if (!nt) return DF_ENOMEM;
    for (size_t i = 0; i < g_pcap; i++)
        if (g_ptab[i].host) {
            size_t j = phash(g_ptab[i].host, ncap);
            while (nt[j].host) j = (j + 1) & (ncap - 1);
            nt[j] = g_ptab[i];
        }
    free(g_ptab);
    g_ptab = nt, g_pcap = ncap;
    return 0;
}
static int g_param_register(const float *p, size_t n) {
    LOCK();
    if (!p) return 0;
    pent *e = pfind(p);
    if (!e) {
        if ((g_pcount + 1) * 2 > g_pcap && pgrow()) {
            fprintf(stderr, "deltafin: cuda backend: param_register: out of host memory for the table of %zu params\n", g_pcount + 1);
            return DF_ENOMEM;
        }
        size_t i = phash(p, g_pcap);
        while (g_ptab[i].host) i = (i + 1) & (g_pcap - 1);
        e = &g_ptab[i];
        e->host = p, e->dev = NULL, e->n = 0;
        g_pcount++;
    }
    if (n > e->n) {
        dfree(e->dev, &g_spine_used, "param_register");
        e->dev = NULL, e->n = 0;
        void *d = NULL;
        if (dmalloc(&d, (n ? n : 1) * sizeof(float), &g_spine_used, "param_register") != cudaSuccess) return DF_ENOMEM;
        e->dev = (float *)d;
        e->n = n;
    }
    if (n) {
        gr_flush();
        cudaError_t err = cudaMemcpy(e->dev, p, n * sizeof(float), cudaMemcpyHostToDevice);
        if (err != cudaSuccess) { report("param_register", err); return DF_EINTERNAL; }
    }
    return 0;
}
const float *param_registered(const float *p, size_t n) {
    const pent *e = p ? pfind(p) : NULL;
    return e && e->n >= n ? e->dev : NULL;
}
const float *param(const float *p, size_t n, int s, const char *op) {
    if (!p) return NULL;
    pent *e = pfind(p);
    if (e && e->n >= n) return e->dev;
    float *d = (float *)slot(s, (n ? n : 1) * sizeof(float), op);
    if (d && n) { gr_flush(); CK(op, cudaMemcpy(d, p, n * sizeof(float), cudaMemcpyHostToDevice)); }
    return d;
}

/* ---- weights ------------------------------------------------------------------------ */
/* A registered weight: its device copy, or (host = 1) none: over the budget, copied for each product. */
struct cw { DW d; void *data, *scale; int host; int64_t bytes; };
static int64_t g_spine_host_bytes, g_h2d_spine, g_h2d_expert, g_h2d_expert_pinned;
static int g_spine_host_n;

static int ggml_ok(int t) {
    switch (t) {
    case DF_GGML_F32: case DF_GGML_F16: case DF_GGML_BF16: case DF_GGML_Q4_0: case DF_GGML_Q4_1: case DF_GGML_Q5_0:
    case DF_GGML_Q5_1: case DF_GGML_Q8_0: case DF_GGML_Q2_K: case DF_GGML_Q3_K: case DF_GGML_Q4_K: case DF_GGML_Q5_K:
    case DF_GGML_Q6_K: case DF_GGML_MXFP4: return 1;
    default: return 0;
    }
}
/* 0, or DF_EUNSUPPORTED with a one-line message naming what the kernels cannot decode. */
static int w_check(const df_weight *w, const char *op) {
    if ((int)w->fmt < 0 || (int)w->fmt >= DF_W_NFMT) {
        fprintf(stderr, "deltafin: cuda backend: %s: unknown weight format %d\n", op, (int)w->fmt);
        return DF_EUNSUPPORTED;
    }
    if (w->fmt == DF_W_GGML && !ggml_ok(w->ggml_type)) {
        fprintf(stderr, "deltafin: cuda backend: %s: GGML block type %d (%s) is not decoded by the CUDA kernels "
                        "(supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K MXFP4)\n",
                op, w->ggml_type, df_gguf_type_name(w->ggml_type));
        return DF_EUNSUPPORTED;
    }
    if ((w->fmt == DF_W_FP8 && (w->blk_r <= 0 || w->blk_c <= 0)) || ((w->fmt == DF_W_INT4 || w->fmt == DF_W_MXFP4) && w->blk_c <= 0)) {
        fprintf(stderr, "deltafin: cuda backend: %s: %s weight with block %d x %d (expected positive)\n", op, df_wfmt_name(w), w->blk_r, w->blk_c);
        return DF_EUNSUPPORTED;
    }
    return 0;
}
static DW dw_of(const df_weight *w, const void *data, const void *scale) {
    DW d;
    d.fmt = (int)w->fmt, d.gt = w->ggml_type, d.sdt = (int)w->scale_dtype, d.blk_r = w->blk_r, d.blk_c = w->blk_c;
    d.rows = w->rows, d.cols = w->cols, d.scale_cols = w->scale_cols;
    d.data = (const uint8_t *)data, d.scale = (const uint8_t *)scale, d.row_bytes = w->row_bytes;
    return d;
}
/* Uploads w's bytes into the given buffers (device memory owned by the caller). */
static int w_upload(const df_weight *w, void *data, void *scale, const char *op) {
    const size_t db = (size_t)w->rows * w->row_bytes, sb = (size_t)df_weight_scale_bytes(w);
    gr_flush();
    cudaError_t e = cudaMemcpy(data, w->data, db, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && sb && w->scale) e = cudaMemcpy(scale, w->scale, sb, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) { report(op, e); return DF_EINTERNAL; }
    return 0;
}
static void g_weight_unregister(df_weight *w) {
    LOCK();
    cw *h = (cw *)w->handle;
    if (!h) return;
    if (h->host) g_spine_host_bytes -= h->bytes, g_spine_host_n--;
    dfree(h->data, &g_spine_used, "weight_unregister");
    dfree(h->scale, &g_spine_used, "weight_unregister");
    free(h);
    w->handle = NULL;
}
/* Registering a registered weight uploads it again. */
static int g_weight_register(df_weight *w) {
    if (w->handle) g_weight_unregister(w);
    LOCK();
    int rc = w_check(w, "weight_register");
    if (rc) return rc;
    const size_t db = (size_t)w->rows * w->row_bytes, sb = (size_t)df_weight_scale_bytes(w);
    cw *h = (cw *)calloc(1, sizeof *h);
    if (!h) return DF_ENOMEM;
    h->bytes = (int64_t)(db + sb);
    budget_default();
    if (g_used + h->bytes > g_budget - g_reserve) { /* over the spine's share: stays in host memory */
        h->host = 1, g_spine_host_bytes += h->bytes, g_spine_host_n++;
        w->handle = h;
        return 0;
    }
    cudaError_t e = dmalloc(&h->data, db ? db : 1, &g_spine_used, "weight_register");
    if (e == cudaSuccess && sb) e = dmalloc(&h->scale, sb, &g_spine_used, "weight_register");
    if (e != cudaSuccess) {
        fprintf(stderr, "deltafin: cuda backend: weight_register: cannot allocate %zu + %zu bytes for a %s [%lld x %lld] weight on the device\n",
                db, sb, df_wfmt_name(w), (long long)w->rows, (long long)w->cols);
        dfree(h->data, &g_spine_used, "weight_register");
        free(h);
        return DF_ENOMEM;
    }
    if ((rc = w_upload(w, h->data, h->scale, "weight_register"))) {
        dfree(h->data, &g_spine_used, "weight_register"), dfree(h->scale, &g_spine_used, "weight_register"), free(h);
        return rc;
    }
    h->d = dw_of(w, h->data, h->scale);
    w->handle = h;
    return 0;
}
/* ---- the VRAM expert cache ------------------------------------------------------------ */
#define EV_RING 64                  /* events of the last closed epochs */
static df_vcache g_vc;
static int g_vc_state;              /* 0 not sized yet, 1 ready, -1 off (no room: every expert bypasses) */
static uint8_t *g_vc_mem;
static int64_t g_vc_slot_bytes;
static cudaStream_t g_cs;           /* the copy stream */
static cudaEvent_t g_ev_copy;       /* the last copy issued on g_cs */
static cudaEvent_t g_ev_epoch[EV_RING]; /* [epoch % EV_RING]: recorded on the compute stream when that epoch closed */
static int g_copies;                /* copies issued since the last fence */
static int g_lfu;                   /* DELTAFIN_CUDA_EVICT=lfu (measurement aid; LRU by default, docs/PERFORMANCE.md) */
/* The device tables of fully resident layers (the device-routed MoE, moe_resident / moe_fused): for layer l,
 * the DW of part p of expert e at [e * 3 + p], filled when every part of every expert of the layer is in a
 * slot, invalid from the first eviction of one of them. g_slot_dw[i]: what slot i holds (set at its copy). */
typedef struct {
    DW *dev;            /* [n_experts * 3] on the device (NULL: never filled) */
    DW h0[3];           /* expert 0's parts (the layer's shapes: a table is filled only when every expert has them) */
    int n_experts, valid, tried, preloaded;
    int64_t parts;      /* parts of the layer in slots now */
    uint64_t seen;      /* g_lchg[l] at the last failed fill (nothing changed since: no rescan) */
} ltab;
static ltab *g_lt;
static uint64_t *g_lchg; /* per layer: inserts and evictions of its parts */
static int g_nlt;
static DW *g_slot_dw;
static cudaEvent_t g_ev_fused; /* recorded on the compute stream before a copy into a slot that a fused op may read */
static void lt_changed(int layer, int evicted);
static int lt_grow(int layer);
/* host ranges given to host_pin */
typedef struct { uint8_t *p; size_t n; } prange;
static prange g_pin[64];
static int g_npin;
static int64_t g_pinned;

static int is_pinned(const void *p) {
    for (int i = 0; i < g_npin; i++)
        if ((const uint8_t *)p >= g_pin[i].p && (const uint8_t *)p < g_pin[i].p + g_pin[i].n) return 1;
    return 0;
}
static size_t up256(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- staged copies of pageable expert bytes (round 16) ---------------------------------------------------------
 * A copy from pageable host memory (a model's mmapped file) is staged by the driver through its own buffer on the
 * calling thread: 4.69 GB/s on the H200's host (2026-12-03: the first 512-token prompt of the 4-layer Qwen3-shape model
 * moved its 4.83 GB of experts into the VRAM cache in ~1.03 s, the whole prefill). Parts of at least ST_MIN bytes go
 * through ST_N page-locked buffers of ST_BYTES instead: the calling thread and up to ST_T helper threads copy a chunk
 * into a buffer whose last copy to the device has finished (its event), then one asynchronous copy on the copy stream
 * takes it to the slot while the host fills the next buffer. The same bytes land; pinned sources (the host tier) and
 * small parts keep the plain copy. DELTAFIN_CUDA_STAGE=0: the plain copy (a measurement aid). */
#define ST_N 4
#define ST_BYTES ((size_t)8 << 20)
#define ST_MIN ((size_t)1 << 20)
#define ST_T 7
static struct {
    int state; /* 0 not tried, 1 on, -1 off */
    uint8_t *buf[ST_N];
    cudaEvent_t ev[ST_N];
    unsigned next;
    pthread_t th[ST_T];
    int nth;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;
    int left, parts;
    uint8_t *dst;
    const uint8_t *src;
    size_t len;
} g_st = {0, {0}, {0}, 0, {0}, 0, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0};
static int64_t g_h2d_staged;
static void *st_worker(void *arg) {
    const int id = (int)(intptr_t)arg; /* 1..nth: share id of parts (the caller copies share 0) */
    unsigned seen = 0;
    pthread_mutex_lock(&g_st.mu);
    for (;;) {
        while (g_st.gen == seen) pthread_cond_wait(&g_st.go, &g_st.mu);
        seen = g_st.gen;
        uint8_t *d = g_st.dst;
        const uint8_t *s = g_st.src;
        const size_t n = g_st.len, a = n * (size_t)id / (size_t)g_st.parts, b = n * (size_t)(id + 1) / (size_t)g_st.parts;
        pthread_mutex_unlock(&g_st.mu);
        memcpy(d + a, s + a, b - a);
        pthread_mutex_lock(&g_st.mu);
        if (--g_st.left == 0) pthread_cond_signal(&g_st.done);
    }
    return NULL;
}
/* memcpy over the caller and the helpers */
static void st_memcpy(uint8_t *d, const uint8_t *s, size_t n) {
    if (!g_st.nth) { memcpy(d, s, n); return; }
    pthread_mutex_lock(&g_st.mu);
    g_st.dst = d, g_st.src = s, g_st.len = n, g_st.parts = g_st.nth + 1, g_st.left = g_st.nth, g_st.gen++;
    pthread_cond_broadcast(&g_st.go);
    pthread_mutex_unlock(&g_st.mu);
    memcpy(d, s, n / (size_t)(g_st.nth + 1));
    pthread_mutex_lock(&g_st.mu);
    while (g_st.left) pthread_cond_wait(&g_st.done, &g_st.mu);
    pthread_mutex_unlock(&g_st.mu);
}
static int st_on(void) {
    if (g_st.state) return g_st.state > 0;
    g_st.state = -1;
    const char *e = getenv("DELTAFIN_CUDA_STAGE");
    if (e && !strcmp(e, "0")) return 0;
    for (int i = 0; i < ST_N; i++) {
        if (cudaHostAlloc((void **)&g_st.buf[i], ST_BYTES, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&g_st.ev[i], cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            fprintf(stderr, "deltafin: cuda backend: no page-locked staging buffers (%d x %zu MB): experts are copied from pageable memory directly\n",
                    ST_N, ST_BYTES >> 20);
            for (int j = 0; j <= i; j++)
                if (g_st.buf[j]) cudaFreeHost(g_st.buf[j]), g_st.buf[j] = NULL;
            return 0;
        }
    }
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int want = nc > 1 ? (int)(nc - 1 < ST_T ? nc - 1 : ST_T) : 0;
    const char *t = getenv("DELTAFIN_CUDA_STAGE_THREADS");
    if (t && *t) {
        char *end;
        const long v = strtol(t, &end, 10);
        if (*end || v < 0 || v > ST_T)
            fprintf(stderr, "deltafin: cuda backend: DELTAFIN_CUDA_STAGE_THREADS=%s is not a thread count 0..%d: %d helper threads\n", t, ST_T, want);
        else
            want = (int)v;
    }
    for (int i = 0; i < want; i++) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&g_st.th[i], &at, st_worker, (void *)(intptr_t)(i + 1))) {
            pthread_attr_destroy(&at);
            break;
        }
        pthread_attr_destroy(&at);
        g_st.nth = i + 1; /* (a worker reads nth only through parts, set per job) */
    }
    g_st.state = 1;
    return 1;
}
/* n bytes from pageable src to device dst through the staging buffers, on the copy stream */
static cudaError_t st_copy(uint8_t *dst, const uint8_t *src, size_t n, cudaStream_t st) {
    for (size_t off = 0; off < n;) {
        const size_t len = n - off < ST_BYTES ? n - off : ST_BYTES;
        const unsigned b = g_st.next++ % ST_N;
        cudaError_t e = cudaEventSynchronize(g_st.ev[b]); /* its last copy has finished */
        if (e != cudaSuccess) return e;
        st_memcpy(g_st.buf[b], src + off, len);
        e = cudaMemcpyAsync(dst + off, g_st.buf[b], len, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) e = cudaEventRecord(g_st.ev[b], st);
        if (e != cudaSuccess) return e;
        off += len;
    }
    g_h2d_staged += (int64_t)n;
    return cudaSuccess;
}

/* Sizes the cache for parts of about part_bytes: slots with room for the
 * rounding differences between an expert's projections, as many as the
 * budget leaves after what is allocated now and a scratch reserve, at most
 * the model's experts. Off (with one line saying why) when not one fits. */
static void vc_init(size_t part_bytes) {
    g_vc_state = -1;
    budget_default();
    const char *ev = getenv("DELTAFIN_CUDA_EVICT");
    g_lfu = ev && !strcmp(ev, "lfu");
    g_vc_part_bytes = (int64_t)part_bytes;
    g_vc_slot_bytes = (int64_t)((up256(part_bytes) + 256 + part_bytes / 16 + 4095) & ~(size_t)4095);
    const int64_t reserve = ((int64_t)16 << 20) + 2 * g_vc_slot_bytes;
    char err[512];
    int64_t n = df_vc_plan(g_budget, g_used, reserve, g_vc_slot_bytes, 1, err, sizeof err);
    if (n <= 0) {
        fprintf(stderr, "deltafin: cuda backend: %s; routed experts are copied for each product instead\n", err);
        return;
    }
    if (g_expert_total > 0 && n > g_expert_total / (int64_t)part_bytes + 1) n = g_expert_total / (int64_t)part_bytes + 1;
    if (n > (1 << 26)) n = 1 << 26;
    void *mem = NULL;
    while (n >= 1 && dmalloc(&mem, (size_t)(n * g_vc_slot_bytes), &g_cache_used, "expert cache") != cudaSuccess) n /= 2;
    if (!mem) return;
    if (df_vc_init(&g_vc, (int)n, g_lfu ? DF_VC_LFU : DF_VC_LRU)) { dfree(mem, &g_cache_used, "expert cache"); return; }
    free(g_slot_dw);
    if (!(g_slot_dw = (DW *)calloc((size_t)n, sizeof(DW)))) { df_vc_free(&g_vc), dfree(mem, &g_cache_used, "expert cache"); return; }
    cudaError_t e = cudaStreamCreateWithFlags(&g_cs, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g_ev_copy, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g_ev_fused, cudaEventDisableTiming);
    for (int i = 0; i < EV_RING && e == cudaSuccess; i++) e = cudaEventCreateWithFlags(&g_ev_epoch[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        report("expert cache: streams and events", e);
        df_vc_free(&g_vc), dfree(mem, &g_cache_used, "expert cache");
        return;
    }
    g_vc_mem = (uint8_t *)mem;
    g_vc_state = 1;
}

/* The device view of routed expert part w from the cache: 0 (hit, or a miss
 * whose copy is queued), 1 (bypass: the caller copies it into scratch), or
 * a negative DF_E* code. */
static int vc_get(const df_weight *w, size_t db, size_t sb, DW *out, const char *op) {
    if (!g_vc_state) vc_init(db + sb);
    if (g_vc_state < 0) return 1;
    if ((int64_t)(up256(db) + sb) > g_vc_slot_bytes) { g_vc.bypasses++; return 1; }
    int i = df_vc_lookup(&g_vc, w->ident);
    if (i >= 0) {
        uint8_t *base = g_vc_mem + (size_t)i * (size_t)g_vc_slot_bytes;
        *out = dw_of(w, base, sb ? base + up256(db) : NULL);
        return 0;
    }
    uint64_t old;
    int64_t ve;
    i = df_vc_insert(&g_vc, w->ident, &old, &ve);
    if (i < 0) return 1;
    uint8_t *base = g_vc_mem + (size_t)i * (size_t)g_vc_slot_bytes;
    const int layer = (int)(w->ident >> 40) - 1, expert = (int)((w->ident >> 8) & 0xffffffffu);
    gr_flush(); /* the events below order the copy against the kernels recorded so far */
    cudaError_t e = cudaSuccess;
    if (ve >= 0) e = cudaStreamWaitEvent(g_cs, g_ev_epoch[ve % EV_RING], 0); /* the slot's last readers have run */
    if (old) {
        const int ol = (int)(old >> 40) - 1;
        if (ol >= 0 && ol < g_nlt && g_lt[ol].valid && e == cudaSuccess) { /* fused ops queued so far may read the slot: the copy waits for them */
            e = cudaEventRecord(g_ev_fused, 0);
            if (e == cudaSuccess) e = cudaStreamWaitEvent(g_cs, g_ev_fused, 0);
        }
        lt_changed(ol, 1);
    }
    if (layer >= 0 && layer < (1 << 20) && !lt_grow(layer)) lt_changed(layer, 0);
    if (e == cudaSuccess)
        e = db >= ST_MIN && !is_pinned(w->data) && st_on() ? st_copy(base, w->data, db, g_cs) : cudaMemcpyAsync(base, w->data, db, cudaMemcpyHostToDevice, g_cs);
    if (e == cudaSuccess && sb) e = cudaMemcpyAsync(base + up256(db), w->scale, sb, cudaMemcpyHostToDevice, g_cs);
    if (e == cudaSuccess) e = cudaEventRecord(g_ev_copy, g_cs);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(0, g_ev_copy, 0); /* the product waits for its bytes */
    if (e != cudaSuccess) {
        fprintf(stderr, "deltafin: cuda backend: %s: copying layer %d expert %d part %d (%zu bytes) to the device: %s (%s)\n", op, layer, expert,
                (int)(w->ident & 0xff), db + sb, cudaGetErrorString(e), cudaGetErrorName(e));
        df_vc_clear(&g_vc); /* the slot's contents are unknown */
        for (int l = 0; l < g_nlt; l++) g_lchg[l]++, g_lt[l].valid = 0, g_lt[l].parts = 0;
        return DF_EINTERNAL;
    }
    g_slot_dw[i] = dw_of(w, base, sb ? base + up256(db) : NULL);
    g_copies++;
    g_h2d_expert += (int64_t)(db + sb);
    if (is_pinned(w->data)) g_h2d_expert_pinned += (int64_t)(db + sb);
    *out = dw_of(w, base, sb ? base + up256(db) : NULL);
    return 0;
}

static int g_host_pin(void *p, size_t bytes) {
    LOCK();
    if (!p || !bytes) return 0;
    if (g_npin == (int)(sizeof g_pin / sizeof *g_pin)) return DF_EUNSUPPORTED;
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "deltafin: cuda backend: host_pin: cannot page-lock %.2f MB of host memory (%s); copies from it stay synchronous\n",
                bytes / 1e6, cudaGetErrorString(e));
        return DF_EUNSUPPORTED;
    }
    g_pin[g_npin].p = (uint8_t *)p, g_pin[g_npin++].n = bytes;
    g_pinned += (int64_t)bytes;
    return 0;
}
static void g_host_unpin(void *p) {
    LOCK();
    for (int i = 0; i < g_npin; i++)
        if (g_pin[i].p == (uint8_t *)p) {
            gr_flush();
            CK("host_unpin", cudaDeviceSynchronize());
            CK("host_unpin", cudaHostUnregister(p));
            g_pinned -= (int64_t)g_pin[i].n;
            g_pin[i] = g_pin[--g_npin];
            return;
        }
}
static void g_host_fence(void) {
    LOCK();
    if (g_vc_state <= 0 || !g_copies) return;
    CK("host_fence", cudaEventSynchronize(g_ev_copy));
    g_copies = 0;
}
static void g_experts_done(void) {
    LOCK();
    if (g_vc_state <= 0) return;
    gr_flush(); /* the epoch event follows the slots' readers */
    CK("experts_done", cudaEventRecord(g_ev_epoch[g_vc.epoch % EV_RING], 0));
    df_vc_fence(&g_vc);
}
/* ---- the device tables of the device-routed MoE ---------------------------------------------- */
/* Grows the per-layer arrays to hold layer l; 0 or DF_ENOMEM. */
static int lt_grow(int l) {
    if (l < g_nlt) return 0;
    int n = g_nlt ? g_nlt : 64;
    while (n <= l) n *= 2;
    ltab *t = (ltab *)realloc(g_lt, (size_t)n * sizeof *t);
    if (!t) return DF_ENOMEM;
    g_lt = t;
    uint64_t *c = (uint64_t *)realloc(g_lchg, (size_t)n * sizeof *c);
    if (!c) return DF_ENOMEM;
    g_lchg = c;
    memset(g_lt + g_nlt, 0, (size_t)(n - g_nlt) * sizeof *g_lt);
    memset(g_lchg + g_nlt, 0, (size_t)(n - g_nlt) * sizeof *g_lchg);
    g_nlt = n;
    return 0;
}
/* A part of layer l came in (evicted 0) or left (1): its table is stale once one leaves. */
static void lt_changed(int l, int evicted) {
    if (l < 0 || l >= g_nlt) return;
    g_lchg[l]++;
    if (evicted) g_lt[l].valid = 0, g_lt[l].parts--;
    else g_lt[l].parts++;
}
static int same_shape(const DW &a, const DW &b) {
    return a.fmt == b.fmt && a.gt == b.gt && a.sdt == b.sdt && a.blk_r == b.blk_r && a.blk_c == b.blk_c && a.rows == b.rows && a.cols == b.cols &&
           a.scale_cols == b.scale_cols && a.row_bytes == b.row_bytes && !a.scale == !b.scale;
}
/* DELTAFIN_CUDA_FUSED_MOE=0 turns the device-routed MoE off (the host-routed path everywhere: the before of
 * docs/PERFORMANCE.md's measurement). Read once. */
static int g_fused_env = -1;
static int fused_on(void) {
    if (g_fused_env < 0) {
        const char *v = getenv("DELTAFIN_CUDA_FUSED_MOE");
        g_fused_env = !(v && *v && !strcmp(v, "0"));
    }
    return g_fused_env;
}
/* Whether the cache has a slot for every routed expert part of the model (its bytes over the part size the
 * cache was sized for; unknown total: no) */
static int vc_holds_model(void) {
    return g_expert_total > 0 && g_vc_part_bytes > 0 && g_vc.n_slots >= (g_expert_total + g_vc_part_bytes - 1) / g_vc_part_bytes;
}
static int g_moe_resident(int layer, int n_experts, int k, int n) {
    LOCK();
    return moe_resident_held(layer, n_experts, k, n);
}
int moe_resident_held(int layer, int n_experts, int k, int n) {
    if (!fused_on() || n < 1 || g_vc_state != 1 || layer < 0 || n_experts <= 0 || k <= 0 || k > n_experts || k > FUSED_MAX_K ||
        n_experts > FUSED_MAX_E || layer >= (1 << 20) || lt_grow(layer))
        return 0;
    ltab *t = &g_lt[layer];
    if (t->parts < 3 * (int64_t)n_experts) /* the missing parts fit the never used slots and every expert of the model fits
                                               * the cache (else a later layer's misses would evict the preloaded parts
                                               * first): the caller may preload them (once) */
        return !t->preloaded && vc_holds_model() && g_vc.n_slots - g_vc.n_filled >= 3 * (int64_t)n_experts - t->parts ? 2 : 0;
    if (n != 1) return 0;
    if (t->valid && t->n_experts == n_experts) return 1;
    if (t->tried && t->seen == g_lchg[layer] && t->n_experts == n_experts) return 0; /* nothing came in since the last look */
    t->valid = 0, t->tried = 1, t->seen = g_lchg[layer];
    static DW *h;
    static int hcap;
    if (hcap < 3 * n_experts) {
        DW *nh = (DW *)realloc(h, (size_t)3 * n_experts * sizeof *nh);
        if (!nh) return 0;
        h = nh, hcap = 3 * n_experts;
    }
    for (int e = 0; e < n_experts; e++)
        for (int p = 0; p < 3; p++) {
            const int i = df_vc_peek(&g_vc, df_expert_ident(layer, e, p));
            if (i < 0) return 0;
            h[3 * e + p] = g_slot_dw[i];
            if (e && !same_shape(h[p], h[3 * e + p])) return 0; /* one launch per projection needs one shape */
        }
    if (t->dev && t->n_experts != n_experts) dfree(t->dev, &g_cache_used, "moe_resident"), t->dev = NULL;
    if (!t->dev && dmalloc((void **)&t->dev, (size_t)3 * n_experts * sizeof(DW), &g_cache_used, "moe_resident") != cudaSuccess) return 0;
    t->n_experts = n_experts;
    /* synchronous on the legacy stream: after every kernel that may still read an older table */
    gr_flush();
    cudaError_t e = cudaMemcpy(t->dev, h, (size_t)3 * n_experts * sizeof(DW), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) { report("moe_resident", e); return 0; }
    memcpy(t->h0, h, sizeof t->h0);
    t->valid = 1;
    return 1;
}
static int g_moe_preload(const df_weight *w, int n) {
    LOCK();
    for (int i = 0; i < n; i++) { /* a layer is offered one preload */
        const int l = (int)(w[i].ident >> 40) - 1;
        if (w[i].ident && l >= 0 && l < g_nlt) g_lt[l].preloaded = 1;
    }
    for (int i = 0; i < n; i++) {
        if (g_vc_state != 1 || g_vc.n_filled >= g_vc.n_slots) return 0; /* no free slot left: never evicts */
        if (!w[i].ident || df_vc_peek(&g_vc, w[i].ident) >= 0) continue;
        int rc = w_check(&w[i], "moe_preload");
        if (rc) return rc;
        const size_t db = (size_t)w[i].rows * w[i].row_bytes, sb = (size_t)df_weight_scale_bytes(&w[i]);
        DW d;
        if ((rc = vc_get(&w[i], db, sb, &d, "moe_preload")) < 0) return rc;
        if (rc) g_vc.bypasses--; /* too large for a slot: not cached, and no product bypassed */
    }
    return 0;
}
const DW *moe_table(int layer, int n_experts, const DW **h0) {
    if (g_vc_state != 1 || layer < 0 || layer >= g_nlt || !g_lt[layer].valid || g_lt[layer].n_experts != n_experts) return NULL;
    *h0 = g_lt[layer].h0;
    return g_lt[layer].dev;
}
void moe_count_hits(int64_t parts) { g_vc.hits += parts; }

/* Releases the expert cache (its model is closed): the next model sizes its own. */
static void g_tier_reset(void) {
    if (g_prof == 3) { /* the events of the model's run, while the device is surely up */
        pthread_mutex_lock(&g_mu);
        prof_ev_flush(1);
        pthread_mutex_unlock(&g_mu);
    }
    LOCK();
    gr_flush();
    if (g_vc_state > 0) {
        CK("tier_reset", cudaDeviceSynchronize());
        df_vc_free(&g_vc);
        dfree(g_vc_mem, &g_cache_used, "tier_reset");
        g_vc_mem = NULL;
        CK("tier_reset", cudaStreamDestroy(g_cs));
        CK("tier_reset", cudaEventDestroy(g_ev_copy));
        for (int i = 0; i < EV_RING; i++) CK("tier_reset", cudaEventDestroy(g_ev_epoch[i]));
        CK("tier_reset", cudaEventDestroy(g_ev_fused));
        free(g_slot_dw), g_slot_dw = NULL;
    }
    for (int l = 0; l < g_nlt; l++) dfree(g_lt[l].dev, &g_cache_used, "tier_reset");
    free(g_lt), free(g_lchg), g_lt = NULL, g_lchg = NULL, g_nlt = 0;
    g_vc_state = 0, g_copies = 0;
}
static void g_tier_stats(df_tier_stats *o) {
    LOCK();
    budget_default();
    memset(o, 0, sizeof *o);
    o->budget = g_budget, o->used = g_used;
    o->spine_dev_bytes = g_spine_used, o->spine_host_bytes = g_spine_host_bytes, o->spine_host_weights = g_spine_host_n;
    o->cache_bytes = g_vc_state > 0 ? g_vc.n_slots * g_vc_slot_bytes : 0, o->cache_slots = g_vc_state > 0 ? g_vc.n_slots : 0;
    o->cache_hits = g_vc.hits, o->cache_misses = g_vc.misses, o->cache_evictions = g_vc.evictions, o->cache_bypasses = g_vc.bypasses;
    o->pinned_bytes = g_pinned;
    o->h2d_expert_bytes = g_h2d_expert, o->h2d_expert_pinned_bytes = g_h2d_expert_pinned, o->h2d_spine_bytes = g_h2d_spine;
    o->h2d_expert_staged_bytes = g_h2d_staged;
    o->eviction_lfu = g_lfu;
}
extern "C" void df_cuda_set_memory(int64_t budget, int64_t reserve, int64_t expert_bytes) {
    LOCK();
    g_budget = -1;
    if (budget > 0) g_budget = budget;
    else budget_default();
    g_reserve = reserve > 0 ? reserve : 0;
    g_expert_total = expert_bytes;
}

/* Per-op scratch for the weights a tier copies for one product (a spine
 * weight left in host memory, an expert that bypasses the cache): each copy
 * of one op gets a buffer of its own, so an op that launches several jobs
 * at once never finds one job's weight overwritten by the next one's. A
 * buffer is reused by a later op only: the synchronous copy into it waits
 * for the kernels already queued. */
unsigned long g_op;
typedef struct { void *p; size_t cap; } pbuf;
static pbuf *g_pb;
static int g_pb_n, g_pb_next;
static unsigned long g_pb_op;
static void *op_scratch(size_t bytes, const char *op) {
    if (g_pb_op != g_op) g_pb_op = g_op, g_pb_next = 0;
    if (g_pb_next == g_pb_n) {
        pbuf *nb = (pbuf *)realloc(g_pb, (size_t)(g_pb_n + 1) * sizeof *nb);
        if (!nb) return NULL;
        g_pb = nb, g_pb[g_pb_n].p = NULL, g_pb[g_pb_n++].cap = 0;
    }
    pbuf *b = &g_pb[g_pb_next];
    if (b->cap < bytes) {
        dfree(b->p, NULL, op);
        b->p = NULL, b->cap = 0;
        if (dmalloc(&b->p, bytes + bytes / 8, NULL, op) != cudaSuccess) return NULL;
        b->cap = bytes + bytes / 8;
    }
    g_pb_next++;
    return b->p;
}

int w_resident(const df_weight *w) { return w->handle && !((const cw *)w->handle)->host; }
int w_get(const df_weight *w, int sd, int ss, DW *out, const char *op) {
    const size_t db = (size_t)w->rows * w->row_bytes, sb = (size_t)df_weight_scale_bytes(w);
    int tier = 0; /* copied by a tier: into per-op scratch, not the caller's slots */
    if (w->handle) {
        const cw *h = (const cw *)w->handle;
        if (!h->host) { *out = h->d; return 0; }
        g_h2d_spine += (int64_t)(db + sb);
        tier = 1;
    } else if (w->ident) {
        int rc = w_check(w, op);
        if (rc) return rc;
        if ((rc = vc_get(w, db, sb, out, op)) <= 0) return rc;
        g_h2d_expert += (int64_t)(db + sb); /* a bypass */
        if (is_pinned(w->data)) g_h2d_expert_pinned += (int64_t)(db + sb);
        tier = 1;
    }
    int rc = w_check(w, op);
    if (rc) return rc;
    if (tier) {
        uint8_t *b = (uint8_t *)op_scratch(up256(db) + sb, op);
        if (!b) return DF_ENOMEM;
        if ((rc = w_upload(w, b, sb ? b + up256(db) : NULL, op))) return rc;
        *out = dw_of(w, b, sb ? b + up256(db) : NULL);
        return 0;
    }
    if (rc) return rc;
    void *d = slot(sd, db ? db : 1, op), *s = sb ? slot(ss, sb, op) : NULL;
    if (!d || (sb && !s)) return DF_ENOMEM;
    if ((rc = w_upload(w, d, s, op))) return rc;
    *out = dw_of(w, d, s);
    return 0;
}


/* ---- the table -------------------------------------------------------------------------- */
extern "C" int df_cuda_available(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

/* ---- greedy decoding one token ahead (backend.h next_token / embed_token) ---------------------------------
 * k_argmax (one block) writes the id into a device int (the token slot, read by k_embed_tok of the pass queued
 * next) and, with the ticket's number in one 8-byte store, into page-locked host memory mapped into the device: no
 * copy between the
 * kernels (a memcpy node would end the programmatic launch chain), and the host waits by polling that memory,
 * which the next pass's kernels, queued already, do not delay. */
/* the better of two (value, index) candidates: the larger value, of equal ones (== : -0 and +0 too) the lower index */
static __device__ __forceinline__ void am_take(float &bv, int &bi, float ov, int oi) {
    if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
}
__global__ void __launch_bounds__(1024) k_argmax(const float *x, int n, int *slot, volatile unsigned long long *host, unsigned seq) {
    pdl_entry();
    __shared__ float sv[32];
    __shared__ int si[32];
    float bv = 0.0f;
    int bi = -1;
    const int n4 = ((uintptr_t)x & 15) ? 0 : n / 4; /* 16-byte loads where aligned (always, from alloc) */
    for (int q = threadIdx.x; q < n4; q += blockDim.x) { /* this thread's first maximum, NaN skipped */
        const float4 v = ld_act((const float4 *)x + q);
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (e[k] == e[k] && (bi < 0 || e[k] > bv)) bv = e[k], bi = 4 * q + k;
    }
    for (int i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) {
        const float v = ld_act(x + i);
        if (v == v && (bi < 0 || v > bv)) bv = v, bi = i;
    }
    for (int o = 16; o; o >>= 1) am_take(bv, bi, __shfl_down_sync(0xffffffffu, bv, o), __shfl_down_sync(0xffffffffu, bi, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (!lane) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp) return;
    bv = lane < (int)(blockDim.x >> 5) ? sv[lane] : 0.0f, bi = lane < (int)(blockDim.x >> 5) ? si[lane] : -1;
    for (int o = 16; o; o >>= 1) am_take(bv, bi, __shfl_down_sync(0xffffffffu, bv, o), __shfl_down_sync(0xffffffffu, bi, o));
    if (lane) return;
    const float x0 = ld_act(x);
    const int id = n <= 0 || x0 != x0 || bi < 0 ? 0 : bi; /* df_argmax: 0 when x[0] is NaN */
    *slot = id;
    *host = (unsigned long long)seq << 32 | (unsigned)id; /* one 8-byte store: the host sees the ticket and its id together */
}
__global__ void k_embed_tok(DW w, const int *slot, float *out) {
    pdl_entry();
    const int64_t r = *(volatile const int *)slot;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < w.cols; c += (int64_t)gridDim.x * blockDim.x) out[c] = wget(w, r, c);
}
static int *g_tok_slot;
static volatile unsigned long long *g_tok_host; /* [2]: ticket's low 32 bits << 32 | id */
static int64_t g_tok_n;
static int tok_init(void) {
    if (g_tok_slot) return 0;
    void *h = NULL;
    if (cudaMalloc((void **)&g_tok_slot, sizeof(int)) != cudaSuccess || cudaHostAlloc(&h, 2 * sizeof(unsigned long long), cudaHostAllocMapped) != cudaSuccess) {
        cudaGetLastError();
        if (g_tok_slot) cudaFree(g_tok_slot), g_tok_slot = NULL;
        return DF_ENOMEM;
    }
    g_tok_host = (volatile unsigned long long *)h;
    g_tok_host[0] = g_tok_host[1] = ~0ull;
    return 0;
}
static int64_t g_next_token(const df_act *logits, int vocab) {
    PROF_SCOPE();
    LOCK();
    if (tok_init()) {
        fprintf(stderr, "deltafin: cuda backend: next_token: cannot allocate the token slot\n");
        exit(1);
    }
    const int64_t t = g_tok_n++;
    volatile unsigned long long *h = g_tok_host + (t & 1);
    unsigned long long *hd = NULL;
    CK("next_token", cudaHostGetDevicePointer((void **)&hd, (void *)h, 0));
    launch_k(k_argmax, dim3(1), dim3(1024), 0, DCP(logits), vocab, g_tok_slot, (volatile unsigned long long *)hd, (unsigned)t);
    post("next_token");
    gr_flush_step(); /* the step so far goes out now: the host waits for its token next */
    return t;
}
static int32_t g_next_token_wait(int64_t ticket) {
    PROF_SCOPE();
    gr_flush_step();
    volatile unsigned long long *h = g_tok_host + (ticket & 1);
    const unsigned want = (unsigned)ticket; /* a late write of a dropped ticket two back carries its own number */
    unsigned long long v;
    for (unsigned spins = 1; (unsigned)((v = *h) >> 32) != want; spins++) {
        if (spins % 4096) { __builtin_ia32_pause(); continue; }
        const cudaError_t e = cudaStreamQuery(0); /* every 4096 polls: the queue failed, or ran dry without the write */
        if (e == cudaSuccess && (unsigned)(*h >> 32) != want) {
            fprintf(stderr, "deltafin: cuda backend: next_token_wait: ticket %lld was never written (the queue is empty)\n", (long long)ticket);
            exit(1);
        }
        if (e != cudaSuccess && e != cudaErrorNotReady) {
            report("next_token_wait", e);
            exit(1);
        }
    }
    __atomic_add_fetch(&g_host_waits, 1, __ATOMIC_SEQ_CST);
    return (int32_t)(unsigned)v;
}
static int g_embed_token(const df_weight *emb, df_act *out) {
    const cw *h = (const cw *)emb->handle;
    const int plain = emb->fmt == DF_W_F32 || emb->fmt == DF_W_F16 || emb->fmt == DF_W_BF16 ||
                      (emb->fmt == DF_W_GGML && (emb->ggml_type == DF_GGML_F32 || emb->ggml_type == DF_GGML_F16 || emb->ggml_type == DF_GGML_BF16));
    if (!h || h->host || !h->data || !plain) return DF_EUNSUPPORTED; /* float rows only: their decode is exact, as the host's */
    if (!out) return 0;
    PROF_SCOPE();
    LOCK();
    if (tok_init()) return DF_EUNSUPPORTED;
    launch_k(k_embed_tok, dim3(blocks_for((size_t)emb->cols, 256)), dim3(256), 0, h->d, (const int *)g_tok_slot, DP(out));
    post("embed_token");
    return 0;
}

extern "C" const df_backend_ops df_backend_cuda = {
    "cuda",
    g_alloc, g_free, g_write, g_read, g_copy, g_zero,
    g_copy_rows, g_gather, g_scatter,
    g_weight_register, g_weight_unregister, g_param_register,
    g_matmul_batch,
    g_attn_gqa, g_attn_mla,
    g_rmsnorm, g_rope_table, g_rope,
    g_add, g_add_bias, g_axpy, g_scale, g_gate, g_sigmoid, g_l2norm, g_attn_res,
    g_route, g_moe_combine,
    g_causal_conv1d, g_kda_scan, g_kda_gate,
    g_host_pin, g_host_unpin, g_host_fence, g_experts_done, g_tier_reset, g_tier_stats,
    g_moe_resident, g_moe_fused, g_moe_preload,
    g_exact_products, /* the verify pass's products and attention in the one-token bits (cuda_mm.cu) */
    g_add_rmsnorm, g_qk_norm_rope,
    g_next_token, g_next_token_wait, g_embed_token,
    1, /* queued */
    g_decode_layers, /* the persistent decode kernel (cuda_dec.cu; DELTAFIN_CUDA_PERSIST=1) */
};

