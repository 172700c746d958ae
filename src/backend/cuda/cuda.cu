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
#include "backend/cuda/cuda.h"

extern "C" {
#include "deltafin.h"
#include "format/gguf.h"
}

#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------- */
static int g_sync = -1; /* DELTAFIN_CUDA_SYNC=1: wait after every op (an async error then names its op) */
static int g_reported;

static void report(const char *op, cudaError_t e) {
    if (g_reported++ < 32) fprintf(stderr, "deltafin: cuda backend: %s: %s (%s)\n", op, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CK(op, call)                                  \
    do {                                              \
        cudaError_t e_ = (call);                      \
        if (e_ != cudaSuccess) report((op), e_);      \
    } while (0)
/* after a kernel launch */
static void post(const char *op) {
    CK(op, cudaGetLastError());
    if (g_sync < 0) {
        const char *s = getenv("DELTAFIN_CUDA_SYNC");
        g_sync = s && *s && strcmp(s, "0");
    }
    if (g_sync) CK(op, cudaDeviceSynchronize());
}

static inline unsigned blocks_for(size_t n, unsigned th) {
    size_t b = (n + th - 1) / th;
    return (unsigned)(b > 65535u * 32u ? 65535u * 32u : (b ? b : 1)); /* grid-stride loops cover the rest */
}

/* One op at a time: the scratch slots and the param table are shared. Kernels
 * run on the legacy default stream, so an op's uploads into a slot wait for
 * the kernels of earlier ops that read it. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
struct Lock {
    Lock() { pthread_mutex_lock(&g_mu); }
    ~Lock() { pthread_mutex_unlock(&g_mu); }
};
#define LOCK() Lock lock_

/* ---- scratch: device buffers that grow on demand, one per role ----------------- */
enum { S_WD0, S_WS0, S_WD1, S_WS1, S_WD2, S_WS2, S_P0, S_P1, S_SCORES, S_IDX, S_N };
static void *g_slot[S_N];
static size_t g_slot_cap[S_N];
static void *slot(int i, size_t bytes, const char *op) {
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
#define DP(p) ((float *)(void *)(p))
#define DCP(p) ((const float *)(const void *)(p))

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
/* The device copy of param p[n]: registered, or uploaded into scratch slot s for this call. */
static const float *param(const float *p, size_t n, int s, const char *op) {
    if (!p) return NULL;
    pent *e = pfind(p);
    if (e && e->n >= n) return e->dev;
    float *d = (float *)slot(s, (n ? n : 1) * sizeof(float), op);
    if (d && n) CK(op, cudaMemcpy(d, p, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

/* ---- weights ------------------------------------------------------------------------ */
/* A weight as the kernels see it (passed by value): df_weight with device pointers. */
struct DW {
    int fmt, gt, sdt, blk_r, blk_c;
    int64_t rows, cols, scale_cols;
    const uint8_t *data, *scale;
    size_t row_bytes;
};
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
/* The device view of w: its registered copy, or an upload into scratch slots (sd, ss) for this call. */
static int w_get(const df_weight *w, int sd, int ss, DW *out, const char *op) {
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

/* ---- decoding one stored element (bit-exact to the CPU decoders) ---------------------- */
__device__ __forceinline__ float bitsf(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t ld16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
__device__ __forceinline__ float f16f(uint32_t h) {
    uint32_t sign = (h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) return bitsf(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (!m) return bitsf(sign);
        float f = __fmul_rn((float)m, bitsf(0x33800000u));
        return sign ? -f : f;
    }
    return bitsf(sign | ((e + 112) << 23) | (m << 13));
}
__device__ __forceinline__ float ldh(const uint8_t *p) { return f16f(ld16(p)); }
__device__ __forceinline__ float bf16f(uint32_t h) { return bitsf(h << 16); }
__device__ __forceinline__ float fp8f(uint32_t b) { /* E4M3FN */
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = __int_as_float(0x7fc00000);
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return s ? -v : v;
}
__device__ __forceinline__ float e8m0f(uint32_t s) { return bitsf(s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : s << 23); }
__device__ __forceinline__ float e2m1f(uint32_t code) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7];
    return (code & 8) ? -v : v;
}
__device__ __forceinline__ float scale_at(const DW &w, int64_t i) {
    switch (w.sdt) {
    case DF_SCALE_F32: return __uint_as_float((uint32_t)w.scale[4 * i] | ((uint32_t)w.scale[4 * i + 1] << 8) | ((uint32_t)w.scale[4 * i + 2] << 16) | ((uint32_t)w.scale[4 * i + 3] << 24));
    case DF_SCALE_BF16: return bf16f(ld16(w.scale + 2 * i));
    case DF_SCALE_E8M0: return e8m0f(w.scale[i]);
    default: return f16f(ld16(w.scale + 2 * i));
    }
}

/* GGML element i of a row (as ggml_quant.c's scalar decoders, operation by operation) */
__device__ float ggml_elem(int t, const uint8_t *row, int64_t i) {
    switch (t) {
    case DF_GGML_F32: { const uint8_t *p = row + 4 * i; return __uint_as_float((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24)); }
    case DF_GGML_F16: return ldh(row + 2 * i);
    case DF_GGML_BF16: return bf16f(ld16(row + 2 * i));
    case DF_GGML_Q4_0: {
        const uint8_t *b = row + (i / 32) * 18;
        int l = (int)(i % 32), q = l < 16 ? (b[2 + l] & 15) : (b[2 + l - 16] >> 4);
        return __fmul_rn(ldh(b), (float)(q - 8));
    }
    case DF_GGML_Q4_1: {
        const uint8_t *b = row + (i / 32) * 20;
        int l = (int)(i % 32), q = l < 16 ? (b[4 + l] & 15) : (b[4 + l - 16] >> 4);
        return __fadd_rn(__fmul_rn(ldh(b), (float)q), ldh(b + 2));
    }
    case DF_GGML_Q5_0: case DF_GGML_Q5_1: {
        const int one = t == DF_GGML_Q5_1, bb = one ? 24 : 22, qho = one ? 4 : 2;
        const uint8_t *b = row + (i / 32) * bb, *qs = b + qho + 4;
        uint32_t qh = (uint32_t)b[qho] | ((uint32_t)b[qho + 1] << 8) | ((uint32_t)b[qho + 2] << 16) | ((uint32_t)b[qho + 3] << 24);
        int l = (int)(i % 32), q = (l < 16 ? (qs[l] & 15) : (qs[l - 16] >> 4)) | (int)(((qh >> l) & 1) << 4);
        if (one) return __fadd_rn(__fmul_rn(ldh(b), (float)q), ldh(b + 2));
        return __fmul_rn(ldh(b), (float)(q - 16));
    }
    case DF_GGML_Q8_0: {
        const uint8_t *b = row + (i / 32) * 34;
        return __fmul_rn(ldh(b), (float)(int8_t)b[2 + i % 32]);
    }
    case DF_GGML_Q2_K: {
        const uint8_t *b = row + (i / 256) * 84, *sc = b, *qs = b + 16;
        int k = (int)(i % 256), h = k / 128, j = (k % 128) / 32, l = k % 32, s = k / 16;
        float dl = __fmul_rn(ldh(b + 80), (float)(sc[s] & 15)), ml = __fmul_rn(ldh(b + 82), (float)(sc[s] >> 4));
        float p = __fmul_rn(dl, (float)((qs[h * 32 + l] >> (2 * j)) & 3));
        return __fsub_rn(p, ml);
    }
    case DF_GGML_Q3_K: {
        const uint8_t *b = row + (i / 256) * 110, *hm = b, *qs = b + 32, *s = b + 96;
        int k = (int)(i % 256), h = k / 128, j = (k % 128) / 32, l = k % 32, si = k / 16;
        int lo = (s[si % 8] >> (4 * (si / 8))) & 15, hi = (s[8 + si % 4] >> (2 * (si / 4))) & 3, scv = (lo | (hi << 4)) - 32;
        int ql = (qs[h * 32 + l] >> (2 * j)) & 3, hb = (hm[l] >> (k / 32)) & 1;
        float dl = __fmul_rn(ldh(b + 108), (float)scv);
        return __fmul_rn(dl, (float)(ql - (hb ? 0 : 4)));
    }
    case DF_GGML_Q4_K: case DF_GGML_Q5_K: {
        const int five = t == DF_GGML_Q5_K;
        const uint8_t *b = row + (i / 256) * (five ? 176 : 144), *s = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
        int k = (int)(i % 256), sb = k / 32, l = k % 32, scv, mn;
        if (sb < 4) scv = s[sb] & 63, mn = s[sb + 4] & 63;
        else scv = (s[sb + 4] & 15) | ((s[sb - 4] >> 6) << 4), mn = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
        float dl = __fmul_rn(ldh(b), (float)scv), ml = __fmul_rn(ldh(b + 2), (float)mn);
        int q = (qs[(sb / 2) * 32 + l] >> (4 * (sb % 2))) & 15;
        if (five) q |= ((qh[l] >> sb) & 1) << 4;
        return __fsub_rn(__fmul_rn(dl, (float)q), ml);
    }
    case DF_GGML_Q6_K: {
        const uint8_t *b = row + (i / 256) * 210, *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        int k = (int)(i % 256), h = k / 128, r = k % 128;
        int lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 15, hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
        float dl = __fmul_rn(ldh(b + 208), (float)sc[k / 16]);
        return __fmul_rn(dl, (float)((lo | (hi << 4)) - 32));
    }
    case DF_GGML_MXFP4: {
        const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        const uint8_t *b = row + (i / 32) * 17;
        uint32_t e = b[0];
        float d = bitsf(e < 2 ? 0x00200000u << e : (e - 1) << 23);
        int l = (int)(i % 32), q = l < 16 ? (b[1 + l] & 15) : (b[1 + l - 16] >> 4);
        return __fmul_rn(d, (float)kv[q]);
    }
    default: return __int_as_float(0x7fc00000);
    }
}

/* W[r][c] as f32 (scaled formats: the element times its scale) */
__device__ float wget(const DW &w, int64_t r, int64_t c) {
    const uint8_t *row = w.data + (size_t)r * w.row_bytes;
    switch (w.fmt) {
    case DF_W_F32: return ((const float *)row)[c];
    case DF_W_F16: return f16f(((const uint16_t *)row)[c]);
    case DF_W_BF16: return bf16f(((const uint16_t *)row)[c]);
    case DF_W_FP8: return __fmul_rn(fp8f(row[c]), scale_at(w, (r / w.blk_r) * w.scale_cols + c / w.blk_c));
    case DF_W_INT4: return __fmul_rn((float)(((row[c >> 1] >> ((c & 1) * 4)) & 15) - 8), scale_at(w, r * w.scale_cols + c / w.blk_c));
    case DF_W_I8ROW: return __fmul_rn((float)(int8_t)row[c], scale_at(w, r));
    case DF_W_MXFP4: return __fmul_rn(e2m1f((row[c >> 1] >> ((c & 1) * 4)) & 15), e8m0f(w.scale[r * w.scale_cols + c / DF_MXFP4_GROUP]));
    case DF_W_GGML: return ggml_elem(w.gt, row, c);
    default: return __int_as_float(0x7fc00000);
    }
}

/* ---- block reductions (blockDim a multiple of 32, <= 1024) ------------------------------ */
template <typename T> __device__ T warp_sum(T v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename T> __device__ T block_sum(T v) {
    __shared__ T part[32];
    __shared__ T total;
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (!lane) part[wid] = v;
    __syncthreads();
    if (!threadIdx.x) {
        T s = 0;
        for (int i = 0; i < nw; i++) s += part[i];
        total = s;
    }
    __syncthreads();
    return total;
}
__device__ float block_max(float v) {
    __shared__ float part[32];
    __shared__ float total;
    v = warp_max(v);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (!lane) part[wid] = v;
    __syncthreads();
    if (!threadIdx.x) {
        float s = -INFINITY;
        for (int i = 0; i < nw; i++) s = fmaxf(s, part[i]);
        total = s;
    }
    __syncthreads();
    return total;
}

/* ---- products --------------------------------------------------------------------------- */
#define MM_TN 8   /* tokens per block */
#define MM_TH 128 /* threads per block */
/* Y[t][r] = X[t] . W[r] for the tokens t0.. of block (r, t-tile): each thread
 * decodes its columns once and uses them for up to MM_TN tokens. */
__global__ void __launch_bounds__(MM_TH) k_matmul(DW w, const float *X, float *Y, int n) {
    const int64_t r = blockIdx.x, K = w.cols;
    const int t0 = blockIdx.y * MM_TN, nt = n - t0 < MM_TN ? n - t0 : MM_TN;
    float acc[MM_TN];
#pragma unroll
    for (int t = 0; t < MM_TN; t++) acc[t] = 0.0f;
    for (int64_t c = threadIdx.x; c < K; c += MM_TH) {
        const float wv = wget(w, r, c);
#pragma unroll
        for (int t = 0; t < MM_TN; t++)
            if (t < nt) acc[t] += wv * X[(int64_t)(t0 + t) * K + c];
    }
    __shared__ float part[MM_TN][MM_TH / 32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < MM_TN; t++) {
        float v = warp_sum(acc[t]);
        if (!lane) part[t][wid] = v;
    }
    __syncthreads();
    if (threadIdx.x < nt) {
        float s = 0.0f;
        for (int i = 0; i < MM_TH / 32; i++) s += part[threadIdx.x][i];
        Y[(int64_t)(t0 + threadIdx.x) * w.rows + r] = s;
    }
}
static void g_matmul_batch(const df_mv_job *jobs, int n_jobs, int n) {
    LOCK();
    if (n <= 0) return;
    const int per = 65535 * MM_TN; /* tokens per launch (grid.y limit) */
    for (int j = 0; j < n_jobs; j++) {
        DW d;
        if (w_get(jobs[j].w, S_WD0, S_WS0, &d, "matmul_batch")) continue;
        if (d.rows <= 0) continue;
        for (int t0 = 0; t0 < n; t0 += per) {
            const int nt = n - t0 < per ? n - t0 : per;
            dim3 grid((unsigned)d.rows, (unsigned)((nt + MM_TN - 1) / MM_TN));
            k_matmul<<<grid, MM_TH>>>(d, DCP(jobs[j].x) + (size_t)t0 * d.cols, DP(jobs[j].y) + (size_t)t0 * d.rows, nt);
            post("matmul_batch");
        }
    }
}

/* ---- attention -------------------------------------------------------------------------- */
#define AT_TH 128
/* In place over sc[0..len): softmax as df_cpu_softmax (max, exp, double sum, times 1/sum). */
__device__ void block_softmax(float *sc, int len) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, sc[j]);
    m = block_max(m);
    double s = 0;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        float e = expf(sc[j] - m);
        sc[j] = e;
        s += e;
    }
    s = block_sum(s);
    const float inv = (float)(1.0 / s);
    for (int j = threadIdx.x; j < len; j += blockDim.x) sc[j] *= inv;
    __syncthreads();
}

/* Tokens per attention launch: the scores scratch (tokens x heads x positions
 * floats) stays under 64 Mi floats and grid.y under its limit; later chunks
 * are later positions of the same cache. */
static int g_chunk = -1; /* DELTAFIN_CUDA_ATTN_CHUNK=N: at most N tokens per launch (a testing aid for the chunked path) */
static int chunk_tokens(int n, int heads, int pos0) {
    if (g_chunk < 0) {
        const char *e = getenv("DELTAFIN_CUDA_ATTN_CHUNK");
        g_chunk = e ? atoi(e) : 0;
        if (g_chunk < 0) g_chunk = 0;
    }
    const size_t T = (size_t)pos0 + n, cap = ((size_t)64 << 20) / ((size_t)(heads > 0 ? heads : 1) * (T ? T : 1));
    size_t per = cap < 1 ? 1 : cap > 65535 ? 65535 : cap;
    if (g_chunk && (size_t)g_chunk < per) per = (size_t)g_chunk;
    return (int)(per < (size_t)n ? per : (size_t)n);
}

/* block (h, t) */
__global__ void __launch_bounds__(AT_TH) k_attn_gqa(df_attn_gqa_args a, float *scores) {
    const int h = blockIdx.x, t = blockIdx.y, NH = a.n_heads, hd = a.head_dim, kvh = h / (NH / a.n_kv_heads), T = a.pos0 + a.n;
    const int len = a.pos0 + t + 1;
    const size_t kdim = (size_t)a.n_kv_heads * hd;
    const float *q = DCP(a.q) + ((size_t)t * NH + h) * hd, *kc = DCP(a.kv) + (size_t)kvh * hd, *vc = kc + kdim;
    float *sc = scores + ((size_t)t * NH + h) * T;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = wid; j < len; j += nw) {
        const float *k = kc + (size_t)j * 2 * kdim;
        float s = 0.0f;
        for (int d = lane; d < hd; d += 32) s += q[d] * k[d];
        s = warp_sum(s);
        if (!lane) sc[j] = s * a.scale;
    }
    __syncthreads();
    block_softmax(sc, len);
    float *out = DP(a.out) + ((size_t)t * NH + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < len; j++) o += sc[j] * vc[(size_t)j * 2 * kdim + d];
        out[d] = o;
    }
}
static void g_attn_gqa(const df_attn_gqa_args *a) {
    LOCK();
    if (a->n <= 0 || a->n_heads <= 0) return;
    const int per = chunk_tokens(a->n, a->n_heads, a->pos0);
    for (int t0 = 0; t0 < a->n; t0 += per) {
        df_attn_gqa_args c = *a;
        c.n = a->n - t0 < per ? a->n - t0 : per, c.pos0 = a->pos0 + t0;
        c.q = (const df_act *)(DCP(a->q) + (size_t)t0 * a->n_heads * a->head_dim);
        c.out = (df_act *)(DP(a->out) + (size_t)t0 * a->n_heads * a->head_dim);
        const size_t T = (size_t)c.pos0 + c.n;
        float *sc = (float *)slot(S_SCORES, (size_t)c.n * c.n_heads * T * sizeof(float), "attn_gqa");
        if (!sc) return;
        k_attn_gqa<<<dim3((unsigned)c.n_heads, (unsigned)c.n), AT_TH>>>(c, sc);
        post("attn_gqa");
    }
}

/* block (h, t); shared: q [nope + rope], qlat [R], olat [R] */
__global__ void __launch_bounds__(AT_TH) k_attn_mla(df_attn_mla_args a, DW kvb, DW kb, DW vb, int split_k, int split_v, float *scores) {
    extern __shared__ float sh[];
    const int h = blockIdx.x, t = blockIdx.y, NH = a.n_heads, nope = a.nope, rope = a.rope, R = a.kv_lora, vd = a.v_dim;
    const int T = a.pos0 + a.n, len = a.pos0 + t + 1;
    const size_t cdim = (size_t)R + rope, qh = (size_t)nope + rope;
    float *qs = sh, *qlat = sh + qh, *olat = qlat + R;
    const float *q = DCP(a.q) + ((size_t)t * NH + h) * qh;
    for (int i = threadIdx.x; i < (int)qh; i += blockDim.x) qs[i] = q[i];
    __syncthreads();
    const int64_t kv_row0 = (int64_t)h * (nope + vd);
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float s = 0.0f;
        if (split_k)
            for (int d = 0; d < nope; d++) s += wget(kb, (int64_t)h * R + c, d) * qs[d];
        else
            for (int d = 0; d < nope; d++) s += qs[d] * wget(kvb, kv_row0 + d, c);
        qlat[c] = s;
    }
    __syncthreads();
    float *sc = scores + ((size_t)t * NH + h) * T;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = wid; j < len; j += nw) {
        const float *cj = DCP(a.cache) + (size_t)j * cdim;
        float s1 = 0.0f, s2 = 0.0f;
        for (int c = lane; c < R; c += 32) s1 += qlat[c] * cj[c];
        for (int c = lane; c < rope; c += 32) s2 += qs[nope + c] * cj[R + c];
        s1 = warp_sum(s1), s2 = warp_sum(s2);
        if (!lane) sc[j] = (s1 + s2) * a.scale;
    }
    __syncthreads();
    block_softmax(sc, len);
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < len; j++) o += sc[j] * DCP(a.cache)[(size_t)j * cdim + c];
        olat[c] = o;
    }
    __syncthreads();
    float *out = DP(a.out) + ((size_t)t * NH + h) * vd;
    for (int i = threadIdx.x; i < vd; i += blockDim.x) {
        float s = 0.0f;
        if (split_v)
            for (int c = 0; c < R; c++) s += wget(vb, (int64_t)h * vd + i, c) * olat[c];
        else
            for (int c = 0; c < R; c++) s += wget(kvb, kv_row0 + nope + i, c) * olat[c];
        out[i] = s;
    }
}
static void g_attn_mla(const df_attn_mla_args *a) {
    LOCK();
    if (a->n <= 0 || a->n_heads <= 0) return;
    const int split_k = a->k_b && a->k_b->data, split_v = a->v_b && a->v_b->data;
    DW kvb, kb, vb;
    memset(&kvb, 0, sizeof kvb), memset(&kb, 0, sizeof kb), memset(&vb, 0, sizeof vb);
    if ((!split_k || !split_v) && w_get(a->kv_b, S_WD0, S_WS0, &kvb, "attn_mla")) return;
    if (split_k && w_get(a->k_b, S_WD1, S_WS1, &kb, "attn_mla")) return;
    if (split_v && w_get(a->v_b, S_WD2, S_WS2, &vb, "attn_mla")) return;
    const size_t shb = ((size_t)a->nope + a->rope + 2 * (size_t)a->kv_lora) * sizeof(float);
    if (shb > 48 * 1024) CK("attn_mla", cudaFuncSetAttribute(k_attn_mla, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shb));
    const int per = chunk_tokens(a->n, a->n_heads, a->pos0);
    for (int t0 = 0; t0 < a->n; t0 += per) {
        df_attn_mla_args c = *a;
        c.n = a->n - t0 < per ? a->n - t0 : per, c.pos0 = a->pos0 + t0;
        c.q = (const df_act *)(DCP(a->q) + (size_t)t0 * a->n_heads * (a->nope + a->rope));
        c.out = (df_act *)(DP(a->out) + (size_t)t0 * a->n_heads * a->v_dim);
        const size_t T = (size_t)c.pos0 + c.n;
        float *sc = (float *)slot(S_SCORES, (size_t)c.n * c.n_heads * T * sizeof(float), "attn_mla");
        if (!sc) return;
        k_attn_mla<<<dim3((unsigned)c.n_heads, (unsigned)c.n), AT_TH, shb>>>(c, kvb, kb, vb, split_k, split_v, sc);
        post("attn_mla");
    }
}

/* ---- rows ------------------------------------------------------------------------------- */
__global__ void k_rmsnorm(float *out, size_t os, const float *x, size_t xs, const float *g, int rows, int n, float eps) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + (size_t)r * xs;
        float *o = out + (size_t)r * os;
        double ss = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
        ss = block_sum(ss);
        const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = g[i] * (xr[i] * inv);
        __syncthreads();
    }
}
static void g_rmsnorm(df_act *out, size_t os, const df_act *x, size_t xs, const float *g, int rows, int cols, float eps) {
    LOCK();
    if (rows <= 0 || cols <= 0) return;
    const float *dg = param(g, (size_t)cols, S_P0, "rmsnorm");
    if (!dg) return;
    k_rmsnorm<<<rows < 65535 ? rows : 65535, 128>>>(DP(out), os, DCP(x), xs, dg, rows, cols, eps);
    post("rmsnorm");
}

__global__ void k_rope_table(float *p, int pos0, int n, const float *inv_freq, int half, float scale) {
    const size_t N = (size_t)n * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < N; k += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(k / half), i = (int)(k % half);
        const float ang = (float)(pos0 + t) * inv_freq[i];
        p[k * 2] = cosf(ang) * scale;
        p[k * 2 + 1] = sinf(ang) * scale;
    }
}
static void g_rope_table(df_act *cs, int pos0, int n, const float *inv_freq, int half, float scale) {
    LOCK();
    if (n <= 0 || half <= 0) return;
    const float *di = param(inv_freq, (size_t)half, S_P0, "rope_table");
    if (!di) return;
    const size_t N = (size_t)n * half;
    k_rope_table<<<blocks_for(N, 256), 256>>>(DP(cs), pos0, n, di, half, scale);
    post("rope_table");
}

__global__ void k_rope(float *x, int n, int nh, size_t ts, size_t hs, int dim, const float *cs, int interleaved) {
    const int half = dim / 2;
    const size_t N = (size_t)n * nh * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < N; k += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(k % half), h = (int)((k / half) % nh), t = (int)(k / ((size_t)half * nh));
        const float *c2 = cs + (size_t)t * half * 2;
        float *v = x + (size_t)t * ts + (size_t)h * hs;
        const float c = c2[2 * i], s = c2[2 * i + 1];
        const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = b * c + a * s;
    }
}
static void g_rope(df_act *x, int n, int nh, size_t ts, size_t hs, int dim, const df_act *cs, int interleaved) {
    if (n <= 0 || nh <= 0 || dim < 2) return;
    const size_t N = (size_t)n * nh * (dim / 2);
    k_rope<<<blocks_for(N, 256), 256>>>(DP(x), n, nh, ts, hs, dim, DCP(cs), interleaved);
    post("rope");
}

/* ---- element-wise ----------------------------------------------------------------------- */
#define GRID_LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
__device__ __forceinline__ float d_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float d_sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void k_add(float *y, const float *x, size_t n) { GRID_LOOP(i, n) y[i] += x[i]; }
__global__ void k_add_bias(float *y, const float *b, size_t n, int cols) { GRID_LOOP(i, n) y[i] += b[i % cols]; }
__global__ void k_axpy(float *y, float a, const float *x, size_t n) { GRID_LOOP(i, n) y[i] += a * x[i]; }
__global__ void k_scale(float *y, float a, size_t n) { GRID_LOOP(i, n) y[i] *= a; }
__global__ void k_sigmoid(float *y, size_t n) { GRID_LOOP(i, n) y[i] = d_sigm(y[i]); }
__global__ void k_gate(float *o, const float *g, const float *u, size_t n, int kind, float p0, float p1) {
    GRID_LOOP(i, n) {
        const float x = g[i], b = u[i];
        float r;
        if (kind == DF_GATE_SILU) r = d_silu(x) * b;
        else if (kind == DF_GATE_SIGMOID) r = d_sigm(x) * b;
        else {
            const float y = p1 != 0.0f ? p1 * tanhf(b / p1) : b;
            r = p0 * tanhf(x / p0) * d_sigm(x) * y;
        }
        o[i] = r;
    }
}
static void g_add(df_act *y, const df_act *x, size_t n) { if (n) k_add<<<blocks_for(n, 256), 256>>>(DP(y), DCP(x), n), post("add"); }
static void g_add_bias(df_act *y, const float *b, int rows, int cols) {
    LOCK();
    if (rows <= 0 || cols <= 0) return;
    const float *db = param(b, (size_t)cols, S_P0, "add_bias");
    if (!db) return;
    const size_t n = (size_t)rows * cols;
    k_add_bias<<<blocks_for(n, 256), 256>>>(DP(y), db, n, cols);
    post("add_bias");
}
static void g_axpy(df_act *y, float a, const df_act *x, size_t n) { if (n) k_axpy<<<blocks_for(n, 256), 256>>>(DP(y), a, DCP(x), n), post("axpy"); }
static void g_scale(df_act *y, float a, size_t n) { if (n) k_scale<<<blocks_for(n, 256), 256>>>(DP(y), a, n), post("scale"); }
static void g_sigmoid(df_act *x, size_t n) { if (n) k_sigmoid<<<blocks_for(n, 256), 256>>>(DP(x), n), post("sigmoid"); }
static void g_gate(df_act *out, const df_act *g, const df_act *u, size_t n, df_gate_kind kind, float p0, float p1) {
    if (!n || kind < 0 || kind >= DF_GATE_N) return;
    k_gate<<<blocks_for(n, 256), 256>>>(DP(out), DCP(g), DCP(u), n, (int)kind, p0, p1);
    post("gate");
}

__global__ void k_l2norm(float *x, int rows, int cols, float eps, float scale) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        float *v = x + (size_t)r * cols, ss = 0.0f;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += v[i] * v[i];
        ss = block_sum(ss);
        const float k = scale / sqrtf(ss + eps);
        for (int i = threadIdx.x; i < cols; i += blockDim.x) v[i] *= k;
        __syncthreads();
    }
}
static void g_l2norm(df_act *x, int rows, int cols, float eps, float scale) {
    if (rows <= 0 || cols <= 0) return;
    k_l2norm<<<rows < 65535 ? rows : 65535, 128>>>(DP(x), rows, cols, eps, scale);
    post("l2norm");
}

/* block per token */
__global__ void k_attn_res(df_attn_res_args a, const float *nw, const float *pw) {
    __shared__ float sc[1 + DF_ATTN_RES_MAX_BLOCKS];
    __shared__ float total;
    const int h = a.h, nb = a.nb;
    for (int t = blockIdx.x; t < a.n; t += gridDim.x) {
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? DCP(a.blocks) + (size_t)i * a.block_stride + (size_t)t * h : DCP(a.p) + (size_t)t * h;
            float ss = 0.0f;
            for (int d = threadIdx.x; d < h; d += blockDim.x) ss += v[d] * v[d];
            ss = block_sum(ss);
            const float r = 1.0f / sqrtf(ss / (float)h + a.eps);
            float s = 0.0f;
            for (int d = threadIdx.x; d < h; d += blockDim.x) s += (v[d] * r) * (nw[d] * pw[d]);
            s = block_sum(s);
            if (!threadIdx.x) sc[i] = s;
        }
        __syncthreads();
        if (!threadIdx.x) {
            float mx = -INFINITY, sum = 0.0f;
            for (int i = 0; i <= nb; i++) mx = fmaxf(mx, sc[i]);
            for (int i = 0; i <= nb; i++) sum += sc[i] = expf(sc[i] - mx);
            total = sum;
        }
        __syncthreads();
        float *o = DP(a.out) + (size_t)t * h;
        for (int d = threadIdx.x; d < h; d += blockDim.x) {
            float acc = 0.0f;
            for (int i = 0; i <= nb; i++) {
                const float *v = i < nb ? DCP(a.blocks) + (size_t)i * a.block_stride + (size_t)t * h : DCP(a.p) + (size_t)t * h;
                acc += (sc[i] / total) * v[d];
            }
            o[d] = acc;
        }
        __syncthreads();
    }
}
static void g_attn_res(const df_attn_res_args *a) {
    LOCK();
    if (a->n <= 0 || a->h <= 0) return;
    if (a->nb < 0 || a->nb > DF_ATTN_RES_MAX_BLOCKS) {
        fprintf(stderr, "deltafin: cuda backend: attn_res: %d blocks (at most %d)\n", a->nb, DF_ATTN_RES_MAX_BLOCKS);
        return;
    }
    const float *nw = param(a->norm_w, (size_t)a->h, S_P0, "attn_res"), *pw = param(a->proj_w, (size_t)a->h, S_P1, "attn_res");
    if (!nw || !pw) return;
    k_attn_res<<<a->n < 65535 ? a->n : 65535, 128>>>(*a, nw, pw);
    post("attn_res");
}

/* ---- MoE -------------------------------------------------------------------------------- */
/* The router on the host with the CPU backend's code (the expert ids are host memory by contract). */
static void g_route(const df_route_args *a) {
    if (a->n <= 0) return;
    const size_t nl = (size_t)a->n * a->n_experts, nw = (size_t)a->n * a->k;
    float *lg = (float *)malloc((nl ? nl : 1) * sizeof(float)), *w = (float *)malloc((nw ? nw : 1) * sizeof(float));
    if (!lg || !w) {
        fprintf(stderr, "deltafin: cuda backend: route: out of host memory for %zu logits\n", nl);
        free(lg), free(w);
        return;
    }
    CK("route", cudaMemcpy(lg, a->logits, nl * sizeof(float), cudaMemcpyDeviceToHost));
    df_route_args h = *a;
    h.logits = (const df_act *)lg;
    h.w = a->w ? (df_act *)w : NULL;
    df_backend_cpu.route(&h);
    if (a->w) CK("route", cudaMemcpy(a->w, w, nw * sizeof(float), cudaMemcpyHostToDevice));
    free(lg), free(w);
}

__global__ void k_moe_combine(float *out, const float *x, const float *w, int n, int k, int cols) {
    const size_t N = (size_t)n * cols;
    GRID_LOOP(i, N) {
        const size_t t = i / cols, c = i % cols;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += w[t * k + j] * x[(t * k + j) * cols + c];
        out[i] = acc;
    }
}
static void g_moe_combine(df_act *out, const df_act *x, const df_act *w, int n, int k, int cols) {
    if (n <= 0 || cols <= 0) return;
    const size_t N = (size_t)n * cols;
    k_moe_combine<<<blocks_for(N, 256), 256>>>(DP(out), DCP(x), DCP(w), n, k, cols);
    post("moe_combine");
}

/* ---- recurrent mixers ------------------------------------------------------------------- */
/* thread per channel, tokens in order (as the CPU loop) */
__global__ void k_conv1d(df_conv1d_args a, const float *wt, const float *bias) {
    const int C = a.C, W = a.W, n = a.n, M = W - 1;
    const float *x = DCP(a.x);
    float *y = DP(a.y), *st = DP(a.state);
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        const float *wc = wt + (size_t)c * W;
        float *sc = st + (size_t)c * M;
        for (int t = 0; t < n; t++) {
            float acc = 0.0f;
            for (int j = 0; j < M; j++) {
                const int src = t + j - M;
                const float v = src < 0 ? sc[M + src] : x[(size_t)src * C + c];
                acc += wc[j] * v;
            }
            acc += wc[M] * x[(size_t)t * C + c];
            if (bias) acc += bias[c];
            y[(size_t)t * C + c] = a.silu ? d_silu(acc) : acc;
        }
        if (n >= M) {
            for (int j = 0; j < M; j++) sc[j] = x[(size_t)(n - M + j) * C + c];
        } else if (M > 0) {
            for (int j = 0; j < M - n; j++) sc[j] = sc[j + n];
            for (int j = 0; j < n; j++) sc[M - n + j] = x[(size_t)j * C + c];
        }
    }
}
static void g_causal_conv1d(const df_conv1d_args *a) {
    LOCK();
    if (a->n <= 0 || a->C <= 0 || a->W <= 0) return;
    const float *wt = param(a->w, (size_t)a->C * a->W, S_P0, "causal_conv1d"), *b = param(a->bias, (size_t)a->C, S_P1, "causal_conv1d");
    if (!wt || (a->bias && !b)) return;
    k_conv1d<<<blocks_for((size_t)a->C, 128), 128>>>(*a, wt, b);
    post("causal_conv1d");
}

/* block per head; thread j owns column j of S (S[i][j] for every key channel i) */
__global__ void k_kda_scan(df_kda_args a) {
    const int h = blockIdx.x, dk = a.dk, dv = a.dv, nh = a.nh;
    float *S = DP(a.S) + (size_t)h * dk * dv;
    for (int j = threadIdx.x; j < dv; j += blockDim.x)
        for (int t = 0; t < a.n; t++) {
            const size_t qk = ((size_t)t * nh + h) * dk, vo = ((size_t)t * nh + h) * dv;
            const float *q = DCP(a.q) + qk, *k = DCP(a.k) + qk, *g = DCP(a.g) + qk;
            const float beta = DCP(a.beta)[(size_t)t * nh + h];
            float u = 0.0f;
            for (int i = 0; i < dk; i++) {
                float s = S[(size_t)i * dv + j] * expf(g[i]);
                S[(size_t)i * dv + j] = s;
                u += k[i] * s;
            }
            u = DCP(a.v)[vo + j] - u;
            float o = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float s = S[(size_t)i * dv + j] + (beta * k[i]) * u;
                S[(size_t)i * dv + j] = s;
                o += (q[i] * a.scale) * s;
            }
            DP(a.o)[vo + j] = o;
        }
}
static void g_kda_scan(const df_kda_args *a) {
    if (a->n <= 0 || a->nh <= 0) return;
    int th = (a->dv + 31) / 32 * 32;
    if (th > 256) th = 256;
    k_kda_scan<<<(unsigned)a->nh, th>>>(*a);
    post("kda_scan");
}

__device__ __forceinline__ float d_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__global__ void k_kda_gate(df_kda_gate_args a, const float *A_log, const float *dt_bias) {
    const size_t N = (size_t)a.n * a.nh * a.d;
    GRID_LOOP(o, N) {
        const int h = (int)((o / a.d) % a.nh), i = (int)(o % a.d);
        const float A = expf(A_log[h]), x = DCP(a.f)[o] + dt_bias[(size_t)h * a.d + i];
        DP(a.g)[o] = a.has_lower_bound ? a.lower_bound * d_sigm(A * x) : -A * d_softplus(x);
    }
}
static void g_kda_gate(const df_kda_gate_args *a) {
    LOCK();
    if (a->n <= 0 || a->nh <= 0 || a->d <= 0) return;
    const float *al = param(a->A_log, (size_t)a->nh, S_P0, "kda_gate"), *dt = param(a->dt_bias, (size_t)a->nh * a->d, S_P1, "kda_gate");
    if (!al || !dt) return;
    const size_t N = (size_t)a->n * a->nh * a->d;
    k_kda_gate<<<blocks_for(N, 256), 256>>>(*a, al, dt);
    post("kda_gate");
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
