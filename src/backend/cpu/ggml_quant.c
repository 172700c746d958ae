/* ggml_quant.c - GGML block types: traits table, scalar reference kernels
 * and the run-time ISA dispatch (see backend/ggml_quant.h for contracts).
 *
 * The scalar decoders are the reference the SIMD kernels are tested
 * against, and they reproduce gguf-py's dequantizers operation by
 * operation: every product is one f32 multiply of the same operands in the
 * same grouping (e.g. Q4_K is (d*sc) * q - (dmin*m)), so results are
 * bit-identical. Contraction into fused multiply-adds would break that, so
 * it is switched off for this file (gcc's -std=c11 already does; clang
 * needs the pragma).
 */
#include "backend/ggml_quant.h"

#include "backend/cpu/ggml_quant_impl.h"
#include "format/gguf.h"

#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- traits ------------------------------------------------------------ */

static const df_ggml_traits TRAITS[DF_GGML_N_TYPES] = {
    [DF_GGML_F32] = {"F32", 1, 4},
    [DF_GGML_F16] = {"F16", 1, 2},
    [DF_GGML_BF16] = {"BF16", 1, 2},
    [DF_GGML_Q4_0] = {"Q4_0", 32, sizeof(df_blk_q4_0)},
    [DF_GGML_Q4_1] = {"Q4_1", 32, sizeof(df_blk_q4_1)},
    [DF_GGML_Q5_0] = {"Q5_0", 32, sizeof(df_blk_q5_0)},
    [DF_GGML_Q5_1] = {"Q5_1", 32, sizeof(df_blk_q5_1)},
    [DF_GGML_Q8_0] = {"Q8_0", 32, sizeof(df_blk_q8_0)},
    [DF_GGML_Q2_K] = {"Q2_K", DF_QK_K, sizeof(df_blk_q2_k)},
    [DF_GGML_Q3_K] = {"Q3_K", DF_QK_K, sizeof(df_blk_q3_k)},
    [DF_GGML_Q4_K] = {"Q4_K", DF_QK_K, sizeof(df_blk_q4_k)},
    [DF_GGML_Q5_K] = {"Q5_K", DF_QK_K, sizeof(df_blk_q5_k)},
    [DF_GGML_Q6_K] = {"Q6_K", DF_QK_K, sizeof(df_blk_q6_k)},
    [DF_GGML_MXFP4] = {"MXFP4", 32, sizeof(df_blk_mxfp4)},
};

const df_ggml_traits *df_ggml_traits_of(int type) {
    if (type < 0 || type >= DF_GGML_N_TYPES || !TRAITS[type].name) return NULL;
    return &TRAITS[type];
}

int64_t df_ggml_row_bytes(int type, int64_t n) {
    const df_ggml_traits *t = df_ggml_traits_of(type);
    return t ? n / t->block_elems * t->block_bytes : -1;
}

/* ---- scalar helpers ---------------------------------------------------- */

static uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE half -> float, exact for every value (subnormals included). */
static float f16_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (!m) return bits_f32(sign);
        /* subnormal: m * 2^-24, exact in f32 */
        float f = (float)m * bits_f32(0x33800000u);
        return sign ? -f : f;
    }
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

static float ldh(const uint8_t *p) { return f16_f32(ld16(p)); }

/* ---- scalar block decoders (bit-exact to gguf-py) ---------------------- */

static void deq_q4_0(const uint8_t *b, float *y) {
    float d = ldh(b);
    const uint8_t *qs = b + offsetof(df_blk_q4_0, qs);
    for (int l = 0; l < 16; l++) {
        y[l] = d * (float)((qs[l] & 15) - 8);
        y[l + 16] = d * (float)((qs[l] >> 4) - 8);
    }
}

static void deq_q4_1(const uint8_t *b, float *y) {
    float d = ldh(b), m = ldh(b + 2);
    const uint8_t *qs = b + offsetof(df_blk_q4_1, qs);
    for (int l = 0; l < 16; l++) {
        float p0 = d * (float)(qs[l] & 15), p1 = d * (float)(qs[l] >> 4);
        y[l] = p0 + m;
        y[l + 16] = p1 + m;
    }
}

static void deq_q5_0(const uint8_t *b, float *y) {
    float d = ldh(b);
    uint32_t qh;
    memcpy(&qh, b + offsetof(df_blk_q5_0, qh), 4);
    const uint8_t *qs = b + offsetof(df_blk_q5_0, qs);
    for (int l = 0; l < 16; l++) {
        int q0 = (qs[l] & 15) | (int)(((qh >> l) & 1) << 4);
        int q1 = (qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1) << 4);
        y[l] = d * (float)(q0 - 16);
        y[l + 16] = d * (float)(q1 - 16);
    }
}

static void deq_q5_1(const uint8_t *b, float *y) {
    float d = ldh(b), m = ldh(b + 2);
    uint32_t qh;
    memcpy(&qh, b + offsetof(df_blk_q5_1, qh), 4);
    const uint8_t *qs = b + offsetof(df_blk_q5_1, qs);
    for (int l = 0; l < 16; l++) {
        int q0 = (qs[l] & 15) | (int)(((qh >> l) & 1) << 4);
        int q1 = (qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1) << 4);
        float p0 = d * (float)q0, p1 = d * (float)q1;
        y[l] = p0 + m;
        y[l + 16] = p1 + m;
    }
}

static void deq_q8_0(const uint8_t *b, float *y) {
    float d = ldh(b);
    const int8_t *qs = (const int8_t *)(b + offsetof(df_blk_q8_0, qs));
    for (int l = 0; l < 32; l++) y[l] = d * (float)qs[l];
}

static void deq_q2_k(const uint8_t *b, float *y) {
    float d = ldh(b + offsetof(df_blk_q2_k, d)), dmin = ldh(b + offsetof(df_blk_q2_k, dmin));
    const uint8_t *sc = b, *qs = b + offsetof(df_blk_q2_k, qs);
    for (int i = 0; i < DF_QK_K; i++) {
        int h = i / 128, j = (i % 128) / 32, l = i % 32, s = i / 16;
        float dl = d * (float)(sc[s] & 15), ml = dmin * (float)(sc[s] >> 4);
        float p = dl * (float)((qs[h * 32 + l] >> (2 * j)) & 3);
        y[i] = p - ml;
    }
}

/* The 16 signed 6-bit scales of a Q3_K block. */
static void q3k_scales(const uint8_t *s, int sc[16]) {
    for (int k = 0; k < 16; k++) {
        int lo = (s[k % 8] >> (4 * (k / 8))) & 15;
        int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        sc[k] = (lo | (hi << 4)) - 32;
    }
}

static void deq_q3_k(const uint8_t *b, float *y) {
    float d = ldh(b + offsetof(df_blk_q3_k, d));
    const uint8_t *hm = b, *qs = b + offsetof(df_blk_q3_k, qs);
    int sc[16];
    q3k_scales(b + offsetof(df_blk_q3_k, scales), sc);
    for (int i = 0; i < DF_QK_K; i++) {
        int h = i / 128, j = (i % 128) / 32, l = i % 32;
        int ql = (qs[h * 32 + l] >> (2 * j)) & 3;
        int hb = (hm[l] >> (i / 32)) & 1;
        float dl = d * (float)sc[i / 16];
        y[i] = dl * (float)(ql - (hb ? 0 : 4));
    }
}

/* Q4_K/Q5_K 6-bit scale and min of sub-block j (0..7) from 12 bytes. */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void deq_q4_k(const uint8_t *b, float *y) {
    float d = ldh(b), dmin = ldh(b + 2);
    const uint8_t *s = b + offsetof(df_blk_q4_k, scales), *qs = b + offsetof(df_blk_q4_k, qs);
    for (int sb = 0; sb < 8; sb++) {
        int sc, mn;
        k4_scale_min(s, sb, &sc, &mn);
        float dl = d * (float)sc, ml = dmin * (float)mn;
        for (int l = 0; l < 32; l++) {
            float p = dl * (float)((qs[(sb / 2) * 32 + l] >> (4 * (sb % 2))) & 15);
            y[sb * 32 + l] = p - ml;
        }
    }
}

static void deq_q5_k(const uint8_t *b, float *y) {
    float d = ldh(b), dmin = ldh(b + 2);
    const uint8_t *s = b + offsetof(df_blk_q5_k, scales), *qh = b + offsetof(df_blk_q5_k, qh),
                  *qs = b + offsetof(df_blk_q5_k, qs);
    for (int sb = 0; sb < 8; sb++) {
        int sc, mn;
        k4_scale_min(s, sb, &sc, &mn);
        float dl = d * (float)sc, ml = dmin * (float)mn;
        for (int l = 0; l < 32; l++) {
            int q = ((qs[(sb / 2) * 32 + l] >> (4 * (sb % 2))) & 15) | (((qh[l] >> sb) & 1) << 4);
            float p = dl * (float)q;
            y[sb * 32 + l] = p - ml;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    float d = ldh(b + offsetof(df_blk_q6_k, d));
    const uint8_t *ql = b, *qh = b + offsetof(df_blk_q6_k, qh);
    const int8_t *sc = (const int8_t *)(b + offsetof(df_blk_q6_k, scales));
    for (int i = 0; i < DF_QK_K; i++) {
        int h = i / 128, r = i % 128;
        int lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 15;
        int hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
        float dl = d * (float)sc[i / 16];
        y[i] = dl * (float)((lo | (hi << 4)) - 32);
    }
}

/* MXFP4 block scale: 2^(e-128) (gguf-py's e8m0_to_fp32_half). */
static float e8m0_half(uint8_t e) {
    return bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

static void deq_mxfp4(const uint8_t *b, float *y) {
    static const int8_t kv[16] = DF_E2M1X2;
    float d = e8m0_half(b[0]);
    const uint8_t *qs = b + offsetof(df_blk_mxfp4, qs);
    for (int l = 0; l < 16; l++) {
        y[l] = d * (float)kv[qs[l] & 15];
        y[l + 16] = d * (float)kv[qs[l] >> 4];
    }
}

typedef void (*block_fn)(const uint8_t *b, float *y);

static block_fn block_decoder(int type) {
    switch (type) {
    case DF_GGML_Q4_0: return deq_q4_0;
    case DF_GGML_Q4_1: return deq_q4_1;
    case DF_GGML_Q5_0: return deq_q5_0;
    case DF_GGML_Q5_1: return deq_q5_1;
    case DF_GGML_Q8_0: return deq_q8_0;
    case DF_GGML_Q2_K: return deq_q2_k;
    case DF_GGML_Q3_K: return deq_q3_k;
    case DF_GGML_Q4_K: return deq_q4_k;
    case DF_GGML_Q5_K: return deq_q5_k;
    case DF_GGML_Q6_K: return deq_q6_k;
    case DF_GGML_MXFP4: return deq_mxfp4;
    default: return NULL;
    }
}

/* Decodes elements [i, i+cnt) of a row of a per-element type into y. */
static void deq_elems(int type, const uint8_t *src, int64_t i, int64_t cnt, float *y) {
    for (int64_t k = 0; k < cnt; k++) {
        const uint8_t *p = src + (i + k) * TRAITS[type].block_bytes;
        if (type == DF_GGML_F32) {
            memcpy(&y[k], p, 4);
        } else if (type == DF_GGML_F16) {
            y[k] = ldh(p);
        } else {
            y[k] = bits_f32((uint32_t)ld16(p) << 16);
        }
    }
}

/* ---- scalar row kernels ------------------------------------------------ */

/* Decodes the row in chunks of CH weights (a multiple of every block size). */
#define CH 256

/* Calls decode for chunk [i, i+cnt) into buf. */
static int64_t chunk(int type, const uint8_t *src, int64_t i, int64_t n, float *buf) {
    int64_t cnt = n - i < CH ? n - i : CH;
    block_fn f = block_decoder(type);
    if (!f) {
        deq_elems(type, src, i, cnt, buf);
    } else {
        int be = TRAITS[type].block_elems, bb = TRAITS[type].block_bytes;
        for (int64_t k = 0; k < cnt; k += be) f(src + (i + k) / be * bb, buf + k);
    }
    return cnt;
}

static void scalar_dequant(int type, const uint8_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n;) i += chunk(type, src, i, n, dst + i);
}

/* Eight interleaved partial sums, like an 8-lane SIMD accumulator. */
static float scalar_dot(int type, const uint8_t *row, const float *x, int64_t n) {
    float buf[CH], acc[8] = {0};
    for (int64_t i = 0; i < n;) {
        int64_t cnt = chunk(type, row, i, n, buf);
        for (int64_t k = 0; k < cnt; k++) acc[k & 7] += buf[k] * x[i + k];
        i += cnt;
    }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void scalar_dot_multi(int type, const uint8_t *row, const float *x, int64_t n, int m,
                             int64_t xs, float *out, int64_t os) {
    float buf[CH];
    for (int j = 0; j < m; j++) out[j * os] = 0;
    for (int64_t i = 0; i < n;) {
        int64_t cnt = chunk(type, row, i, n, buf);
        for (int j = 0; j < m; j++) {
            const float *xj = x + j * xs + i;
            float acc[8] = {0};
            for (int64_t k = 0; k < cnt; k++) acc[k & 7] += buf[k] * xj[k];
            out[j * os] +=
                ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        }
        i += cnt;
    }
}

/* ---- dispatch ---------------------------------------------------------- */

static atomic_int forced_isa = DF_GGML_ISA_AUTO;

#if defined(__x86_64__) || defined(__i386__)
/* F16C (CPUID.1:ECX bit 29); not every compiler's __builtin_cpu_supports knows it. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

int df_ggml_isa_supported(int isa) {
    switch (isa) {
    case DF_GGML_ISA_SCALAR: return 1;
#if defined(__x86_64__) || defined(__i386__)
    case DF_GGML_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case DF_GGML_ISA_AVX512:
        return df_ggml_isa_supported(DF_GGML_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
#endif
    default: return 0;
    }
}

const char *df_ggml_isa_name(int isa) {
    switch (isa) {
    case DF_GGML_ISA_SCALAR: return "scalar";
    case DF_GGML_ISA_AVX2: return "avx2";
    case DF_GGML_ISA_AVX512: return "avx512";
    default: return "auto";
    }
}

static int best_isa(void) {
    static atomic_int best = -1;
    int b = atomic_load_explicit(&best, memory_order_relaxed);
    if (b < 0) {
        b = df_ggml_isa_supported(DF_GGML_ISA_AVX512) ? DF_GGML_ISA_AVX512
            : df_ggml_isa_supported(DF_GGML_ISA_AVX2) ? DF_GGML_ISA_AVX2
                                                       : DF_GGML_ISA_SCALAR;
        atomic_store_explicit(&best, b, memory_order_relaxed);
    }
    return b;
}

void df_ggml_set_isa(int isa) {
    atomic_store(&forced_isa, isa);
}

int df_ggml_get_isa(void) {
    int f = atomic_load_explicit(&forced_isa, memory_order_relaxed), b = best_isa();
    return f < 0 || f > b ? b : f;
}

/* The kernels of the ISA in effect for type, or NULL (use scalar). */
static const df_ggml_kernels *kernels(int type) {
#if defined(__x86_64__) || defined(__i386__)
    switch (df_ggml_get_isa()) {
    case DF_GGML_ISA_AVX512: {
        const df_ggml_kernels *k = df_ggml_kernels_avx512(type);
        return k ? k : df_ggml_kernels_avx2(type);
    }
    case DF_GGML_ISA_AVX2: return df_ggml_kernels_avx2(type);
    default: return NULL;
    }
#else
    (void)type;
    return NULL;
#endif
}

void df_ggml_dequant_row(int type, const void *src, float *dst, int64_t n) {
    const df_ggml_kernels *k = kernels(type);
    if (k && k->dequant) k->dequant(src, dst, n);
    else scalar_dequant(type, src, dst, n);
}

int df_ggml_pack16(int type, const void *rows, size_t row_stride, int64_t n, float *P) {
#if defined(__x86_64__) || defined(__i386__)
    const df_ggml_traits *t = df_ggml_traits_of(type);
    if (t && n % t->block_elems == 0 && df_ggml_get_isa() >= DF_GGML_ISA_AVX2) {
        df_ggml_pack16_fn f = df_ggml_pack16_avx2(type);
        if (f) {
            f(rows, row_stride, n, P);
            return 0;
        }
    }
#else
    (void)type, (void)rows, (void)row_stride, (void)n, (void)P;
#endif
    return -1;
}

float df_ggml_dot(int type, const void *row, const float *x, int64_t n) {
    const df_ggml_kernels *k = kernels(type);
    if (k && k->dot) return k->dot(row, x, n);
    return scalar_dot(type, row, x, n);
}

void df_ggml_dot_multi(int type, const void *row, const float *x, int64_t n, int m, int64_t x_stride,
                       float *out, int64_t out_stride) {
    const df_ggml_kernels *k = kernels(type);
    if (k && k->dot_multi) k->dot_multi(row, x, n, m, x_stride, out, out_stride);
    else scalar_dot_multi(type, row, x, n, m, x_stride, out, out_stride);
}

void df_ggml_dot4(int type, const void *row, size_t row_stride, const float *x, int64_t n, float *out) {
    const df_ggml_kernels *k = kernels(type);
    if (k && k->dot4) {
        k->dot4(row, row_stride, x, n, out);
        return;
    }
    for (int r = 0; r < 4; r++) out[r] = df_ggml_dot(type, (const uint8_t *)row + r * row_stride, x, n);
}

/* ---- prepared activations ---------------------------------------------- */

size_t df_ggml_px_floats(int type, int64_t n) {
    (void)type;
    return (size_t)(n / 8 + 16);
}

/* The kernels of a decode product (the prepared-x path): kernels(type),
 * except on AVX-512 where its table has no prepared-x kernels: then the
 * AVX2 table's, whose rows give the same bits however they are grouped
 * (the AVX-512 tables' four-row dot4 and one-row dot sum in different
 * orders, so a row's value depended on whether it fell in a group of four:
 * on the thread split and the row count; test_backend_ggml's pieces check,
 * first run on an AVX-512 host on 2026-12-02, failed for 8 types). */
static const df_ggml_kernels *px_kernels(int type) {
    const df_ggml_kernels *k = kernels(type);
#if defined(__x86_64__) || defined(__i386__)
    if (df_ggml_get_isa() == DF_GGML_ISA_AVX512 && !(k && k->px_dot)) {
        const df_ggml_kernels *a = df_ggml_kernels_avx2(type);
        if (a) return a;
    }
#endif
    return k;
}

void df_ggml_px_init(df_ggml_px *p, int type, const float *x, int64_t n, float *aux) {
    const df_ggml_kernels *k = px_kernels(type);
    p->type = type;
    p->n = n;
    p->x = x;
    p->aux = NULL;
    p->isa = -1;
    if (k && k->px_prep && k->px_dot && aux) {
        k->px_prep(x, n, aux);
        p->aux = aux;
        p->isa = df_ggml_get_isa();
    }
}

void df_ggml_px_dot(const df_ggml_px *p, const void *row, size_t row_stride, int64_t nrows, float *out) {
    const df_ggml_kernels *k = px_kernels(p->type);
    const uint8_t *r = row;
    if (p->isa >= 0 && p->isa == df_ggml_get_isa() && k && k->px_dot) {
        k->px_dot(r, row_stride, nrows, p->x, p->aux, p->n, out);
        return;
    }
    int64_t i = 0;
    if (k && k->dot && df_ggml_get_isa() != DF_GGML_ISA_SCALAR) { /* that table's kernels only */
        for (; k->dot4 && i + 4 <= nrows; i += 4) k->dot4(r + i * row_stride, row_stride, p->x, p->n, out + i);
        for (; i + 4 <= nrows; i += 4)
            for (int j = 0; j < 4; j++) out[i + j] = k->dot(r + (i + j) * row_stride, p->x, p->n);
        for (; i < nrows; i++) out[i] = k->dot(r + i * row_stride, p->x, p->n);
        return;
    }
    for (; i < nrows; i++) out[i] = df_ggml_dot(p->type, r + i * row_stride, p->x, p->n);
}

void df_ggml_px_dot_multi(const df_ggml_px *p, int np, const void *row, size_t row_stride, int64_t nrows, float *out,
                          int64_t out_stride) {
    if (np <= 0) return;
    const df_ggml_kernels *k = px_kernels(p[0].type);
#if defined(__x86_64__) || defined(__i386__)
    const df_ggml_pxm_fn pxm = k && k->px_dot && p[0].isa >= DF_GGML_ISA_AVX2 ? df_ggml_pxm_avx2(p[0].type, k->px_dot) : NULL;
#else
    const df_ggml_pxm_fn pxm = NULL;
    (void)k;
#endif
    int fused = pxm && p[0].isa == df_ggml_get_isa();
    for (int t = 1; t < np && fused; t++) fused = p[t].isa == p[0].isa && p[t].type == p[0].type && p[t].n == p[0].n;
    int t = 0;
    if (fused)
        for (; t + 1 < np; t += DF_GGML_PXM) { /* a lone token: the one-token kernel */
            const int nt = np - t < DF_GGML_PXM ? np - t : DF_GGML_PXM;
            const float *xs[DF_GGML_PXM], *as[DF_GGML_PXM];
            for (int i = 0; i < nt; i++) xs[i] = p[t + i].x, as[i] = p[t + i].aux;
            pxm((const uint8_t *)row, row_stride, nrows, nt, xs, as, p[0].n, out + (int64_t)t * out_stride, out_stride);
        }
    for (; t < np; t++) df_ggml_px_dot(&p[t], row, row_stride, nrows, out + (int64_t)t * out_stride);
}
