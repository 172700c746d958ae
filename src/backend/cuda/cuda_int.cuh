/* cuda_int.cuh - what the CUDA backend's files share: error reporting, the
 * op lock, scratch slots, the device view of a weight (DW) and the device
 * decoders of every stored format (bit-exact to the CPU decoders), block
 * reductions, and the operations cuda_ops.cu implements for the table in
 * cuda.cu. Internal to src/backend/cuda. */
#ifndef DF_BACKEND_CUDA_INT_CUH
#define DF_BACKEND_CUDA_INT_CUH

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
#include <time.h>
#include <type_traits>

void report(const char *op, cudaError_t e);
#define CK(op, call)                                  \
    do {                                              \
        cudaError_t e_ = (call);                      \
        if (e_ != cudaSuccess) report((op), e_);      \
    } while (0)
/* after a kernel launch */
void post(const char *op);

static inline unsigned blocks_for(size_t n, unsigned th) {
    size_t b = (n + th - 1) / th;
    return (unsigned)(b > 65535u * 32u ? 65535u * 32u : (b ? b : 1)); /* grid-stride loops cover the rest */
}

/* One op at a time: the scratch slots and the param table are shared. Kernels
 * run on the legacy default stream, so an op's uploads into a slot wait for
 * the kernels of earlier ops that read it. */
extern pthread_mutex_t g_mu;
extern unsigned long g_op; /* ops begun: cuda.cu's per-op scratch (w_get) never hands one op the same buffer twice */
/* DELTAFIN_CUDA_PROF=1: host time and calls per op, printed at exit (stderr);
 * =2: each op also waits for its kernels, so the time includes the GPU's. */
extern int g_prof; /* -1: not read yet */
int prof_on(void);
void prof_add(const char *op, double seconds);
void prof_restart(void); /* DELTAFIN_CUDA_PROF_DECODE: forget what was timed so far (a prefill product calls it) */
double prof_now(void);
/* =3: each op's GPU time instead, from CUDA events recorded around it on the compute stream (no waits; the
 * host time is not timed): the GPU's busy time per op, and the gaps between ops by difference */
int prof_ev_begin(const char *op);
void prof_ev_end(int i);
struct Lock {
    const char *op;
    double t0;
    int ev;
    Lock(const char *f) : op(f), t0(0), ev(-1) {
        pthread_mutex_lock(&g_mu), g_op++;
        if (prof_on()) {
            if (g_prof == 3) ev = prof_ev_begin(op);
            else t0 = prof_now();
        }
    }
    ~Lock() {
        if (g_prof == 3) prof_ev_end(ev);
        else if (g_prof > 0) {
            if (g_prof > 1) cudaDeviceSynchronize();
            prof_add(op, prof_now() - t0);
        }
        pthread_mutex_unlock(&g_mu);
    }
};
#define LOCK() Lock lock_(__func__)
/* the timing of Lock for ops that take no lock */
struct ProfScope {
    const char *op;
    double t0;
    int ev;
    ProfScope(const char *f) : op(f), t0(prof_on() ? prof_now() : 0), ev(g_prof == 3 ? prof_ev_begin(f) : -1) {}
    ~ProfScope() {
        if (g_prof == 3) prof_ev_end(ev);
        else if (g_prof > 0) {
            if (g_prof > 1) cudaDeviceSynchronize();
            prof_add(op, prof_now() - t0);
        }
    }
};
#define PROF_SCOPE() ProfScope prof_(__func__)
/* DELTAFIN_CUDA_LEAN: the mask of the decode-step savings in force (cuda_mm.cu: 1 products, 2 attention) */
int lean_mask(void);
/* exact products on for the calling thread (cuda_mm.cu; backend.h exact_products): attention a position a launch */
extern thread_local int g_exact;
int g_exact_products(int on);
/* blocking host waits for the device so far (g_read; cuda_ops.cu's decode attention reads rows final before them early) */
extern int64_t g_host_waits;
/* ---- programmatic dependent launch (DELTAFIN_CUDA_LEAN bit 32, round 7) ----------------------------------
 * Every kernel of the backend begins with pdl_entry(): it lets the next kernel of the stream be launched now
 * (griddepcontrol.launch_dependents), then waits until the kernel before it in the stream has finished and its
 * writes are visible (griddepcontrol.wait). Launched the plain way both are no-ops; launched through launch_k
 * with the bit on, a kernel's launch, block scheduling and (the decode products: pdl_go(), then the prefetch of
 * their own weights into L2, then pdl_wait()) the first reads of its weights overlap the kernel before it, and
 * nothing it reads or writes that an earlier kernel wrote is touched before the wait: the same bits. */
static __device__ __forceinline__ void pdl_go(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_entry(void) { pdl_go(), pdl_wait(); }
/* An activation (anything an earlier kernel of the stream wrote: x, g, u, h, logits) read by a kernel: through L1
 * (ld.global.ca), never the read-only path. Launched programmatically a kernel is resident while the kernel before
 * it still writes, and ld.global.nc (__ldg) promises data that nothing writes during the reader's lifetime: ptxas
 * then moves such loads above griddepcontrol.wait (round 18: the SASS of k_moe_down_rt<..., H = 1> loads h before
 * its ACQBULK; 5 of 6 end-to-end runs read other ids). Weights and scales, final before the launch, keep __ldg.
 * bench/cuda/sass_audit.py lists, per kernel of a binary, the read-only loads placed before the wait. */
template <class T> static __device__ __forceinline__ T ld_act(const T *p) { return __ldca(p); }
/* launches with the programmatic-serialization attribute since the start (tests: 0 with the bit off) */
extern int64_t g_pdl_launches;
/* 1: launch_k launches with the attribute (bit 32 of the mask, and the launch API accepted it once) */
int pdl_on(void);
void pdl_refused(cudaError_t e);
/* ---- the launches of a step replayed as a CUDA graph (round 25, cuda_graph.cu; DELTAFIN_CUDA_GRAPH) -------------
 * With it on, launch_k does not launch: it records the kernel, its launch shape and a copy of its arguments (each
 * converted to the kernel's parameter type, as a launch converts it). gr_flush() issues what was recorded, in order,
 * on the legacy stream: a sequence of kernels seen before (the same kernels in the same order; a decode step is one)
 * as one launch of the CUDA graph built for it, its nodes given this time's shapes and arguments where they changed
 * (cudaGraphExecKernelNodeSetParams), programmatic edges where the launches were programmatic; anything else as the
 * launches it recorded (so is any sequence that does not end a step: see gr_flush_at). Every call that orders work on the legacy stream against the host or another stream (a copy,
 * a memset, an event, a stream wait, a free, cuBLAS, a host wait or poll) calls gr_flush() first, so the stream
 * runs the same kernels in the same order either way: the same bits. */
int gr_init(void);
extern int g_gr_state; /* 1 recording, 0 off, -1 not decided yet */
static inline int gr_rec_on(void) { return g_gr_state > 0 || (g_gr_state < 0 && gr_init()); }
void gr_begin(const void *fn, dim3 g, dim3 b, size_t sm, int pdl, int nargs, size_t bytes); /* takes the recorder's lock */
void *gr_arg(size_t size, size_t align);
void gr_end(void); /* releases it */
/* step 1: the end of a step (the host reads its result next: next_token, next_token_wait, read), the only flushes
 * whose launches may go out as a graph; 0: any other (prefill's pieces between copies and cuBLAS calls, a tier's
 * copies). file:line: counted per call site for DELTAFIN_CUDA_GRAPH_STATS. */
void gr_flush_at(const char *file, int line, int step);
#define gr_flush() gr_flush_at(__FILE__, __LINE__, 0)
#define gr_flush_step() gr_flush_at(__FILE__, __LINE__, 1)
void gr_note(const char *op); /* post(): the op (and layer) of the latest record, for its errors */
template <typename T, typename A> static inline void gr_put(A a) {
    const T v = a; /* the implicit conversion a launch applies, no more */
    memcpy(gr_arg(sizeof(T), alignof(T)), (const void *)&v, sizeof(T));
}
template <typename... P> static constexpr size_t gr_bytes(void) { return (size_t(0) + ... + (sizeof(P) + 16)); }
/* k<<<g, b, sm>>>(args...) on the legacy stream, with the attribute when pdl_on(); recorded for gr_flush() while
 * recording is on */
template <typename... P, typename... A> static inline void launch_k(void (*k)(P...), dim3 g, dim3 b, size_t sm, A... args) {
    static_assert(sizeof...(P) == sizeof...(A), "launch_k: an argument a parameter");
    if (gr_rec_on()) {
        const int pdl = pdl_on();
        gr_begin((const void *)k, g, b, sm, pdl, (int)sizeof...(P), gr_bytes<P...>());
        int d_[] = {0, (gr_put<typename std::remove_cv<P>::type>(args), 0)...};
        (void)d_;
        gr_end();
        if (pdl) g_pdl_launches++;
        return;
    }
    if (pdl_on()) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1] = {};
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = g, cfg.blockDim = b, cfg.dynamicSmemBytes = sm, cfg.stream = 0, cfg.attrs = at, cfg.numAttrs = 1;
        const cudaError_t e = cudaLaunchKernelEx(&cfg, k, args...);
        if (e == cudaSuccess) {
            g_pdl_launches++;
            return;
        }
        pdl_refused(e); /* reported once; every later launch the plain way */
    }
    k<<<g, b, sm>>>(args...);
}

/* kernel launches of matmul_batch (the decode kernel) since the start: tests check the batching */
extern int64_t g_mm_launches;

/* scratch: device buffers that grow on demand, one per role */
/* S_SLAB0..2, S_X0..2: the prefill products' weight slabs and split activations; S_F16M, S_F16X: the split-f16 form's
 * weight maxima and alphas, x's maximum and beta (cuda_mm.cu) */
enum { S_WD0, S_WS0, S_WD1, S_WS1, S_WD2, S_WS2, S_P0, S_P1, S_SCORES, S_IDX, S_SLAB0, S_SLAB1, S_SLAB2, S_X0, S_X1, S_X2, S_CNT, S_MOE, S_MOEH, S_F16M, S_F16X, S_N };
void *slot(int i, size_t bytes, const char *op);

#define DP(p) ((float *)(void *)(p))
#define DCP(p) ((const float *)(const void *)(p))

/* The device copy of param p[n]: registered, or uploaded into scratch slot s for this call. */
const float *param(const float *p, size_t n, int s, const char *op);
/* Its registered copy only (NULL: none of n floats). */
const float *param_registered(const float *p, size_t n);
/* Device memory an op keeps between calls (counted with the activations; NULL: refused, said on stderr). */
void *dev_alloc(size_t n, const char *op);
void dev_free(void *p, const char *op);

/* A weight as the kernels see it (passed by value): df_weight with device pointers. */
struct DW {
    int fmt, gt, sdt, blk_r, blk_c;
    int64_t rows, cols, scale_cols;
    const uint8_t *data, *scale;
    size_t row_bytes;
};
/* The device view of w: its registered copy, or an upload into scratch slots (sd, ss) for this call. */
int w_get(const df_weight *w, int sd, int ss, DW *out, const char *op);
/* 1: w's registered copy lives in VRAM for good (no kernel or copy writes it while it is registered) */
int w_resident(const df_weight *w);

/* ---- decoding one stored element (bit-exact to the CPU decoders) ---------------------- */
static __device__ __forceinline__ float bitsf(uint32_t u) { return __uint_as_float(u); }
static __device__ __forceinline__ uint32_t ld16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
static __device__ __forceinline__ float f16f(uint32_t h) {
    uint32_t sign = (h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) return bitsf(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (!m) return bitsf(sign);
        float f = __fmul_rn((float)m, bitsf(0x33800000u));
        return sign ? -f : f;
    }
    return bitsf(sign | ((e + 112) << 23) | (m << 13));
}
static __device__ __forceinline__ float ldh(const uint8_t *p) { return f16f(ld16(p)); }
static __device__ __forceinline__ float bf16f(uint32_t h) { return bitsf(h << 16); }
static __device__ __forceinline__ float fp8f(uint32_t b) { /* E4M3FN */
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = __int_as_float(0x7fc00000);
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return s ? -v : v;
}
static __device__ __forceinline__ float e8m0f(uint32_t s) { return bitsf(s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : s << 23); }
static __device__ __forceinline__ float e2m1f(uint32_t code) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7];
    return (code & 8) ? -v : v;
}
static __device__ __forceinline__ float scale_at(const DW &w, int64_t i) {
    switch (w.sdt) {
    case DF_SCALE_F32: return __uint_as_float((uint32_t)w.scale[4 * i] | ((uint32_t)w.scale[4 * i + 1] << 8) | ((uint32_t)w.scale[4 * i + 2] << 16) | ((uint32_t)w.scale[4 * i + 3] << 24));
    case DF_SCALE_BF16: return bf16f(ld16(w.scale + 2 * i));
    case DF_SCALE_E8M0: return e8m0f(w.scale[i]);
    default: return f16f(ld16(w.scale + 2 * i));
    }
}

/* GGML element i of a row (as ggml_quant.c's scalar decoders, operation by operation) */
static __device__ float ggml_elem(int t, const uint8_t *row, int64_t i) {
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
static __device__ float wget(const DW &w, int64_t r, int64_t c) {
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

/* ---- the gates (k_gate, and the device-routed MoE's down product, which applies it to its input as it
 * loads it: one function, so the same bits) ---------------------------------------------------------- */
static __device__ __forceinline__ float d_silu(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float d_sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float gate_apply(int kind, float x, float b, float p0, float p1) {
    if (kind == DF_GATE_SILU) return d_silu(x) * b;
    if (kind == DF_GATE_SIGMOID) return d_sigm(x) * b;
    const float y = p1 != 0.0f ? p1 * tanhf(b / p1) : b;
    return p0 * tanhf(x / p0) * d_sigm(x) * y;
}

/* ---- block reductions (blockDim a multiple of 32, <= 1024) ------------------------------ */
template <typename T> static __device__ T warp_sum(T v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename T> static __device__ T block_sum(T v) {
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
static __device__ float block_max(float v) {
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


/* ---- the device-routed MoE (cuda.cu: the tables; cuda_mm.cu: g_moe_fused) ---- */
#define FUSED_MAX_K 12    /* experts per token (2k gate/up jobs in one product launch) */
#define FUSED_MAX_E 2048  /* experts per layer (the router's shared memory) */
/* The device table [n_experts][3] of layer's resident experts and, in *h0, expert 0's parts (the layer's
 * shapes), or NULL when the table is not valid now. */
const DW *moe_table(int layer, int n_experts, const DW **h0);
/* moe_resident (backend.h) for a caller that holds the op lock (it fills the layer's table when it can) */
int moe_resident_held(int layer, int n_experts, int k, int n);
/* a fused op's expert parts, counted as cache hits */
void moe_count_hits(int64_t parts);
int g_moe_fused(const df_moe_fused_args *a);
/* decode_layers (cuda_dec.cu): the persistent decode kernel of dec_kernel.cuh, opt-in (DELTAFIN_CUDA_PERSIST=1) */
int g_decode_layers(const df_decode_layers_args *a);

/* ---- operations (cuda_ops.cu; products: cuda_mm.cu) ---- */
void g_matmul_batch(const df_mv_job *jobs, int n_jobs, int n);
void g_attn_gqa(const df_attn_gqa_args *a);
void g_attn_mla(const df_attn_mla_args *a);
void g_rmsnorm(df_act *out, size_t os, const df_act *x, size_t xs, const float *g, int rows, int cols, float eps);
void g_rope_table(df_act *cs, int pos0, int n, const float *inv_freq, int half, float scale);
void g_rope(df_act *x, int n, int nh, size_t ts, size_t hs, int dim, const df_act *cs, int interleaved);
void g_add(df_act *y, const df_act *x, size_t n);
void g_add_rmsnorm(df_act *out, df_act *y, const df_act *x, const float *g, int rows, int cols, float eps);
void g_qk_norm_rope(const df_qk_norm_rope_args *a);
void g_add_bias(df_act *y, const float *b, int rows, int cols);
void g_axpy(df_act *y, float a, const df_act *x, size_t n);
void g_scale(df_act *y, float a, size_t n);
void g_sigmoid(df_act *x, size_t n);
void g_gate(df_act *out, const df_act *g, const df_act *u, size_t n, df_gate_kind kind, float p0, float p1);
void g_l2norm(df_act *x, int rows, int cols, float eps, float scale);
void g_attn_res(const df_attn_res_args *a);
void g_route(const df_route_args *a);
void g_moe_combine(df_act *out, const df_act *x, const df_act *w, int n, int k, int cols);
void g_causal_conv1d(const df_conv1d_args *a);
void g_kda_scan(const df_kda_args *a);
void g_kda_gate(const df_kda_gate_args *a);

#endif
