/* cuda.cu - the CUDA backend: df_backend_cuda (see cuda.h and backend.h).
 *
 * First step (issue 13): every operation of the contract, with simple and
 * correct kernels (one block per output row, per (token, head) or per
 * channel; f32 activations and accumulation; reductions of norms and
 * softmax sums in double as the CPU reference does). No tensor cores, no
 * expert tiers.
 *
 * Weights: weight_register uploads the stored bytes and the scale sidecar
 * once into device memory (handle: struct cw below); the product kernels
 * decode each element from the stored format (wget). A weight that was not
 * registered (an expert in a host cache slot, a test's weight) is uploaded
 * into scratch for the one call. Params: param_register keeps a device copy
 * keyed by the host address (an open-addressing table); registering an
 * address again uploads it again. An op given a param that was never
 * registered uploads it into scratch for that call.
 *
 * Routers run on the host with the CPU backend's own code (the logits are
 * read back, the ids are host memory by contract, the weights written
 * back), so expert choices are the reference's exactly. */
#include "backend/cuda/cuda_int.cuh"

/* ---- errors ------------------------------------------------------------------- */
static int g_sync = -1; /* DELTAFIN_CUDA_SYNC=1: wait after every op (an async error then names its op) */
static int g_reported;

void report(const char *op, cudaError_t e) {
    if (g_reported++ < 32) fprintf(stderr, "deltafin: cuda backend: %s: %s (%s)\n", op, cudaGetErrorString(e), cudaGetErrorName(e));
}
void post(const char *op) {
    CK(op, cudaGetLastError());
    if (g_sync < 0) {
        const char *s = getenv("DELTAFIN_CUDA_SYNC");
        g_sync = s && *s && strcmp(s, "0");
    }
    if (g_sync) CK(op, cudaDeviceSynchronize());
}

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- scratch: device buffers that grow on demand, one per role ----------------- */
static void *g_slot[S_N];
static size_t g_slot_cap[S_N];
void *slot(int i, size_t bytes, const char *op) {
    if (bytes > g_slot_cap[i]) {
        if (g_slot[i]) CK(op, cudaFree(g_slot[i])); /* waits for the kernels that used it */
        g_slot[i] = NULL, g_slot_cap[i] = 0;
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
        cudaError_t e = cudaMalloc(&g_slot[i], cap);
        if (e != cudaSuccess) { report(op, e); g_slot[i] = NULL; return NULL; }
        g_slot_cap[i] = cap;
    }
    return g_slot[i];
}

/* ---- memory ------------------------------------------------------------------- */

static df_act *g_alloc(size_t n) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, (n ? n : 1) * sizeof(float));
    if (e != cudaSuccess) {
        report("alloc", e);
        cudaGetLastError(); /* an allocation failure is not sticky */
        return NULL;
    }
    CK("alloc", cudaMemset(p, 0, (n ? n : 1) * sizeof(float)));
    return (df_act *)p;
}
static void g_free(df_act *p) { if (p) CK("free", cudaFree(p)); }
static void g_write(df_act *dst, const float *src, size_t n) { if (n) CK("write", cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice)); }
static void g_read(float *dst, const df_act *src, size_t n) { if (n) CK("read", cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost)); }
static void g_copy(df_act *dst, const df_act *src, size_t n) { if (n) CK("copy", cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice)); }
static void g_zero(df_act *dst, size_t n) { if (n) CK("zero", cudaMemset(dst, 0, n * sizeof(float))); }
static void g_copy_rows(df_act *dst, size_t ds, const df_act *src, size_t ss, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    CK("copy_rows", cudaMemcpy2D(dst, ds * sizeof(float), src, ss * sizeof(float), (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice));
}

__global__ void k_gather(float *dst, const float *src, const int *idx, int n, int cols, int scatter) {
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
    CK(op, cudaMemcpy(di, idx, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
    if (scatter) {
        /* rows in order, as the CPU does (a repeated index: the last row wins) */
        for (int j = 0; j < n; j++) k_gather<<<1, 128>>>(DP(dst), DCP(src), di + j, 1, cols, 1), post(op), src = (const df_act *)(DCP(src) + cols);
        return;
    }
    k_gather<<<n < 65535 ? n : 65535, 128>>>(DP(dst), DCP(src), di, n, cols, 0);
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
        if (e->dev) CK("param_register", cudaFree(e->dev));
        e->dev = NULL, e->n = 0;
        cudaError_t err = cudaMalloc(&e->dev, (n ? n : 1) * sizeof(float));
        if (err != cudaSuccess) {
            cudaGetLastError();
            fprintf(stderr, "deltafin: cuda backend: param_register: cannot allocate %zu floats on the device (%s)\n", n, cudaGetErrorString(err));
            e->dev = NULL;
            return DF_ENOMEM;
        }
        e->n = n;
    }
    if (n) {
        cudaError_t err = cudaMemcpy(e->dev, p, n * sizeof(float), cudaMemcpyHostToDevice);
        if (err != cudaSuccess) { report("param_register", err); return DF_EINTERNAL; }
    }
    return 0;
}
const float *param(const float *p, size_t n, int s, const char *op) {
    if (!p) return NULL;
    pent *e = pfind(p);
    if (e && e->n >= n) return e->dev;
    float *d = (float *)slot(s, (n ? n : 1) * sizeof(float), op);
    if (d && n) CK(op, cudaMemcpy(d, p, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

/* ---- weights ------------------------------------------------------------------------ */
struct cw { DW d; void *data, *scale; };

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
    cudaError_t e = cudaMemcpy(data, w->data, db, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && sb && w->scale) e = cudaMemcpy(scale, w->scale, sb, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) { report(op, e); return DF_EINTERNAL; }
    return 0;
}
static void g_weight_unregister(df_weight *w) {
    LOCK();
    cw *h = (cw *)w->handle;
    if (!h) return;
    CK("weight_unregister", cudaFree(h->data));
    if (h->scale) CK("weight_unregister", cudaFree(h->scale));
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
    cudaError_t e = cudaMalloc(&h->data, db ? db : 1);
    if (e == cudaSuccess && sb) e = cudaMalloc(&h->scale, sb);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "deltafin: cuda backend: weight_register: cannot allocate %zu + %zu bytes for a %s [%lld x %lld] weight on the device (%s)\n",
                db, sb, df_wfmt_name(w), (long long)w->rows, (long long)w->cols, cudaGetErrorString(e));
        if (h->data) cudaFree(h->data);
        free(h);
        return DF_ENOMEM;
    }
    if ((rc = w_upload(w, h->data, h->scale, "weight_register"))) {
        cudaFree(h->data), cudaFree(h->scale), free(h);
        return rc;
    }
    h->d = dw_of(w, h->data, h->scale);
    w->handle = h;
    return 0;
}
int w_get(const df_weight *w, int sd, int ss, DW *out, const char *op) {
    if (w->handle) { *out = ((const cw *)w->handle)->d; return 0; }
    int rc = w_check(w, op);
    if (rc) return rc;
    const size_t db = (size_t)w->rows * w->row_bytes, sb = (size_t)df_weight_scale_bytes(w);
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
};

