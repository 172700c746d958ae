/* ggml_quant_avx512.c - AVX-512 (F, BW, VL, DQ) kernels for GGML block
 * types. Compiled with AVX-512 flags; only called after the dispatcher in
 * ggml_quant.c checked the CPU.
 *
 * Each type has one decoder, dec_T(block, w), that turns one block into
 * NV = block_elems/16 vectors of 16 floats, bit-exact to the scalar
 * reference (separate multiplies and adds, no FMA, same operand grouping).
 * Three generic drivers are stamped out per type from it: dequant (store w),
 * dot (w fused-multiply-added into four accumulators), and dot_multi (each
 * decoded block reused for up to MB activation vectors). Inlining and full
 * unrolling keep w[] in registers.
 */
#include "backend/cpu/ggml_quant_impl.h"
#include "format/gguf.h"

#include <immintrin.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define MB 8 /* activation vectors per pass in dot_multi */

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes -> 16 dwords, zero- or sign-extended. */
static inline __m512i u8x16(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline __m512i i8x16(const uint8_t *p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline __m512 cvt(__m512i v) { return _mm512_cvtepi32_ps(v); }
static inline __m512i c32(int v) { return _mm512_set1_epi32(v); }

/* ---- decoders ---------------------------------------------------------- */

static inline void dec_q4_0(const uint8_t *b, __m512 *w) {
    __m512 d = _mm512_set1_ps(h2f(b));
    __m512i q = u8x16(b + offsetof(df_blk_q4_0, qs));
    w[0] = _mm512_mul_ps(d, cvt(_mm512_sub_epi32(_mm512_and_si512(q, c32(15)), c32(8))));
    w[1] = _mm512_mul_ps(d, cvt(_mm512_sub_epi32(_mm512_srli_epi32(q, 4), c32(8))));
}

static inline void dec_q4_1(const uint8_t *b, __m512 *w) {
    __m512 d = _mm512_set1_ps(h2f(b)), m = _mm512_set1_ps(h2f(b + 2));
    __m512i q = u8x16(b + offsetof(df_blk_q4_1, qs));
    w[0] = _mm512_add_ps(_mm512_mul_ps(d, cvt(_mm512_and_si512(q, c32(15)))), m);
    w[1] = _mm512_add_ps(_mm512_mul_ps(d, cvt(_mm512_srli_epi32(q, 4))), m);
}

static inline void dec_q5_0(const uint8_t *b, __m512 *w) {
    __m512 d = _mm512_set1_ps(h2f(b));
    uint32_t qh;
    memcpy(&qh, b + offsetof(df_blk_q5_0, qh), 4);
    __m512i q = u8x16(b + offsetof(df_blk_q5_0, qs));
    __m512i lo = _mm512_and_si512(q, c32(15)), hi = _mm512_srli_epi32(q, 4);
    lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xffff), lo, c32(16));
    hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, c32(16));
    w[0] = _mm512_mul_ps(d, cvt(_mm512_sub_epi32(lo, c32(16))));
    w[1] = _mm512_mul_ps(d, cvt(_mm512_sub_epi32(hi, c32(16))));
}

static inline void dec_q5_1(const uint8_t *b, __m512 *w) {
    __m512 d = _mm512_set1_ps(h2f(b)), m = _mm512_set1_ps(h2f(b + 2));
    uint32_t qh;
    memcpy(&qh, b + offsetof(df_blk_q5_1, qh), 4);
    __m512i q = u8x16(b + offsetof(df_blk_q5_1, qs));
    __m512i lo = _mm512_and_si512(q, c32(15)), hi = _mm512_srli_epi32(q, 4);
    lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xffff), lo, c32(16));
    hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, c32(16));
    w[0] = _mm512_add_ps(_mm512_mul_ps(d, cvt(lo)), m);
    w[1] = _mm512_add_ps(_mm512_mul_ps(d, cvt(hi)), m);
}

static inline void dec_q8_0(const uint8_t *b, __m512 *w) {
    __m512 d = _mm512_set1_ps(h2f(b));
    w[0] = _mm512_mul_ps(d, cvt(i8x16(b + 2)));
    w[1] = _mm512_mul_ps(d, cvt(i8x16(b + 18)));
}

static inline void dec_mxfp4(const uint8_t *b, __m512 *w) {
    const __m512 kv = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    uint32_t e = b[0], bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    float df;
    memcpy(&df, &bits, 4);
    __m512 d = _mm512_set1_ps(df);
    __m512i q = u8x16(b + 1);
    /* vpermps uses only the low 4 bits of each index */
    w[0] = _mm512_mul_ps(d, _mm512_permutexvar_ps(q, kv));
    w[1] = _mm512_mul_ps(d, _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), kv));
}

static inline void dec_q2_k(const uint8_t *b, __m512 *w) {
    float d = h2f(b + offsetof(df_blk_q2_k, d)), dmin = h2f(b + offsetof(df_blk_q2_k, dmin));
    _Alignas(64) float dl[16], ml[16];
    __m512i sc = u8x16(b);
    _mm512_store_ps(dl, _mm512_mul_ps(_mm512_set1_ps(d), cvt(_mm512_and_si512(sc, c32(15)))));
    _mm512_store_ps(ml, _mm512_mul_ps(_mm512_set1_ps(dmin), cvt(_mm512_srli_epi32(sc, 4))));
    const uint8_t *qs = b + offsetof(df_blk_q2_k, qs);
    __m512i src[4] = {u8x16(qs), u8x16(qs + 16), u8x16(qs + 32), u8x16(qs + 48)};
    _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++) {
        /* elements 16k..: half h=k/8, shift 2*((k%8)/2), bytes (k%2)*16 */
        __m512i q = _mm512_and_si512(_mm512_srli_epi32(src[(k / 8) * 2 + k % 2], 2 * ((k % 8) / 2)), c32(3));
        w[k] = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl[k]), cvt(q)), _mm512_set1_ps(ml[k]));
    }
}

static inline void dec_q3_k(const uint8_t *b, __m512 *w) {
    float d = h2f(b + offsetof(df_blk_q3_k, d));
    const uint8_t *s = b + offsetof(df_blk_q3_k, scales);
    _Alignas(64) float dl[16];
    _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++) {
        int lo = (s[k % 8] >> (4 * (k / 8))) & 15, hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        dl[k] = d * (float)((lo | (hi << 4)) - 32);
    }
    const uint8_t *qs = b + offsetof(df_blk_q3_k, qs);
    __m512i src[4] = {u8x16(qs), u8x16(qs + 16), u8x16(qs + 32), u8x16(qs + 48)};
    __m512i hm[2] = {u8x16(b), u8x16(b + 16)};
    _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++) {
        __m512i ql = _mm512_and_si512(_mm512_srli_epi32(src[(k / 8) * 2 + k % 2], 2 * ((k % 8) / 2)), c32(3));
        __m512i q = _mm512_sub_epi32(ql, c32(4));
        __mmask16 hb = _mm512_test_epi32_mask(hm[k % 2], c32(1 << (k / 2)));
        q = _mm512_mask_add_epi32(q, hb, q, c32(4));
        w[k] = _mm512_mul_ps(_mm512_set1_ps(dl[k]), cvt(q));
    }
}

/* Q4_K/Q5_K: the 6-bit scales and mins of the 8 sub-blocks, unpacked four
 * at a time in 32-bit words, as dl[j] = d*sc_j and ml[j] = dmin*m_j
 * (f32 products, as in the reference), stored as sm[0..8) = dl and
 * sm[8..16) = ml. */
static inline void k4_scales(const uint8_t *b, float *sm) {
    uint32_t w[3], u[4];
    memcpy(w, b + 4, 12);
    u[0] = w[0] & 0x3f3f3f3fu;                                            /* sc 0..3 */
    u[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);     /* sc 4..7 */
    u[2] = w[1] & 0x3f3f3f3fu;                                            /* m 0..3 */
    u[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4); /* m 4..7 */
    __m512 dd = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(h2f(b)), _mm512_set1_ps(h2f(b + 2)));
    _mm512_storeu_ps(sm, _mm512_mul_ps(dd, cvt(u8x16((const uint8_t *)u))));
}

static inline void dec_q4_k(const uint8_t *b, __m512 *w) {
    _Alignas(64) float sm[16];
    const float *dl = sm, *ml = sm + 8;
    k4_scales(b, sm);
    const uint8_t *qs = b + offsetof(df_blk_q4_k, qs);
    _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
        /* bytes 16c..16c+15 hold sub-block 2*(c/2) (low) and 2*(c/2)+1 (high) */
        __m512i q = u8x16(qs + 16 * c);
        int sb = 2 * (c / 2), k = (c / 2) * 4 + c % 2;
        w[k] = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl[sb]), cvt(_mm512_and_si512(q, c32(15)))),
                             _mm512_set1_ps(ml[sb]));
        w[k + 2] = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl[sb + 1]), cvt(_mm512_srli_epi32(q, 4))),
                                 _mm512_set1_ps(ml[sb + 1]));
    }
}

static inline void dec_q5_k(const uint8_t *b, __m512 *w) {
    _Alignas(64) float sm[16];
    const float *dl = sm, *ml = sm + 8;
    k4_scales(b, sm);
    const uint8_t *qs = b + offsetof(df_blk_q5_k, qs), *qhp = b + offsetof(df_blk_q5_k, qh);
    __m512i qh[2] = {u8x16(qhp), u8x16(qhp + 16)};
    _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
        __m512i q = u8x16(qs + 16 * c);
        int sb = 2 * (c / 2), k = (c / 2) * 4 + c % 2;
        __m512i lo = _mm512_and_si512(q, c32(15)), hi = _mm512_srli_epi32(q, 4);
        lo = _mm512_mask_or_epi32(lo, _mm512_test_epi32_mask(qh[c % 2], c32(1 << sb)), lo, c32(16));
        hi = _mm512_mask_or_epi32(hi, _mm512_test_epi32_mask(qh[c % 2], c32(2 << sb)), hi, c32(16));
        w[k] = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl[sb]), cvt(lo)), _mm512_set1_ps(ml[sb]));
        w[k + 2] = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl[sb + 1]), cvt(hi)),
                                 _mm512_set1_ps(ml[sb + 1]));
    }
}

static inline void dec_q6_k(const uint8_t *b, __m512 *w) {
    float d = h2f(b + offsetof(df_blk_q6_k, d));
    _Alignas(64) float dl[16];
    _mm512_store_ps(dl, _mm512_mul_ps(_mm512_set1_ps(d), cvt(i8x16(b + offsetof(df_blk_q6_k, scales)))));
    const uint8_t *ql = b, *qhp = b + offsetof(df_blk_q6_k, qh);
    _Pragma("GCC unroll 4") for (int h = 0; h < 2; h++) {
        __m512i qh[2] = {u8x16(qhp + 32 * h), u8x16(qhp + 32 * h + 16)};
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            /* ql bytes 64h+16c.. give elements r=16c.. (low) and r=64+16c.. (high) */
            __m512i q = u8x16(ql + 64 * h + 16 * c);
            int r0 = 16 * c, r1 = 64 + 16 * c;
            __m512i h0 = _mm512_and_si512(_mm512_srli_epi32(qh[(r0 % 32) / 16], 2 * (r0 / 32)), c32(3));
            __m512i h1 = _mm512_and_si512(_mm512_srli_epi32(qh[(r1 % 32) / 16], 2 * (r1 / 32)), c32(3));
            __m512i q0 = _mm512_or_si512(_mm512_and_si512(q, c32(15)), _mm512_slli_epi32(h0, 4));
            __m512i q1 = _mm512_or_si512(_mm512_srli_epi32(q, 4), _mm512_slli_epi32(h1, 4));
            int k0 = 8 * h + c, k1 = 8 * h + 4 + c;
            w[k0] = _mm512_mul_ps(_mm512_set1_ps(dl[k0]), cvt(_mm512_sub_epi32(q0, c32(32))));
            w[k1] = _mm512_mul_ps(_mm512_set1_ps(dl[k1]), cvt(_mm512_sub_epi32(q1, c32(32))));
        }
    }
}

/* ---- drivers ----------------------------------------------------------- */

static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

/* BE elements, BB bytes, NV = BE/16 vectors per block; UN blocks per dot
 * iteration so that at least four vectors feed four accumulators. */
#define GEN(T, BE, BB)                                                                          \
    enum { NV_##T = (BE) / 16, UN_##T = NV_##T >= 4 ? 1 : 4 / NV_##T };                          \
    static void dq_##T(const uint8_t *src, float *dst, int64_t n) {                             \
        for (int64_t i = 0; i < n / (BE); i++) {                                                \
            __m512 w[NV_##T];                                                                   \
            dec_##T(src + i * (BB), w);                                                         \
            _Pragma("GCC unroll 16") for (int k = 0; k < NV_##T; k++)                           \
                _mm512_storeu_ps(dst + i * (BE) + 16 * k, w[k]);                                \
        }                                                                                       \
    }                                                                                           \
    static float dot_##T(const uint8_t *row, const float *x, int64_t n) {                       \
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),         \
                         _mm512_setzero_ps()};                                                  \
        int64_t nb = n / (BE), i = 0;                                                           \
        for (; i + UN_##T <= nb; i += UN_##T) {                                                 \
            for (int o_ = 0; o_ < UN_##T * (BB); o_ += 64)                                      \
                _mm_prefetch((const char *)row + i * (BB) + 1024 + o_, _MM_HINT_T0);            \
            _Pragma("GCC unroll 4") for (int u = 0; u < UN_##T; u++) {                          \
                __m512 w[NV_##T];                                                               \
                dec_##T(row + (i + u) * (BB), w);                                               \
                const float *xb = x + (i + u) * (BE);                                           \
                _Pragma("GCC unroll 16") for (int k = 0; k < NV_##T; k++) acc[(u * NV_##T + k) & 3] = \
                    _mm512_fmadd_ps(w[k], _mm512_loadu_ps(xb + 16 * k), acc[(u * NV_##T + k) & 3]); \
            }                                                                                   \
        }                                                                                       \
        for (; i < nb; i++) {                                                                   \
            __m512 w[NV_##T];                                                                   \
            dec_##T(row + i * (BB), w);                                                         \
            _Pragma("GCC unroll 16") for (int k = 0; k < NV_##T; k++) acc[k & 3] =              \
                _mm512_fmadd_ps(w[k], _mm512_loadu_ps(x + i * (BE) + 16 * k), acc[k & 3]);      \
        }                                                                                       \
        return hsum(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]))); \
    }                                                                                           \
    static void dotm_##T(const uint8_t *row, const float *x, int64_t n, int m, int64_t xs,       \
                         float *out, int64_t os) {                                              \
        for (int j0 = 0; j0 < m; j0 += MB) {                                                    \
            int mj = m - j0 < MB ? m - j0 : MB;                                                 \
            __m512 acc[MB];                                                                     \
            for (int j = 0; j < MB; j++) acc[j] = _mm512_setzero_ps();                          \
            for (int64_t i = 0; i < n / (BE); i++) {                                            \
                __m512 w[NV_##T];                                                               \
                dec_##T(row + i * (BB), w);                                                     \
                for (int j = 0; j < mj; j++) {                                                  \
                    const float *xb = x + (int64_t)(j0 + j) * xs + i * (BE);                    \
                    __m512 a = acc[j];                                                          \
                    _Pragma("GCC unroll 16") for (int k = 0; k < NV_##T; k++) a =               \
                        _mm512_fmadd_ps(w[k], _mm512_loadu_ps(xb + 16 * k), a);                 \
                    acc[j] = a;                                                                 \
                }                                                                               \
            }                                                                                   \
            for (int j = 0; j < mj; j++) out[(int64_t)(j0 + j) * os] = hsum(acc[j]);            \
        }                                                                                       \
    }                                                                                           \
    /* four rows: x of each block is read once (then L1-hot) for the four rows */                 \
    static void dot4_##T(const uint8_t *row, size_t rs, const float *x, int64_t n, float *out) {  \
        __m512 acc[8];                                                                          \
        for (int j = 0; j < 8; j++) acc[j] = _mm512_setzero_ps();                               \
        for (int64_t i = 0; i < n / (BE); i++) {                                                \
            const float *xb = x + i * (BE);                                                     \
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                               \
                __m512 w[NV_##T];                                                               \
                dec_##T(row + r * rs + i * (BB), w);                                            \
                _Pragma("GCC unroll 16") for (int k = 0; k < NV_##T; k++) acc[2 * r + (k & 1)] = \
                    _mm512_fmadd_ps(w[k], _mm512_loadu_ps(xb + 16 * k), acc[2 * r + (k & 1)]);  \
            }                                                                                   \
        }                                                                                       \
        for (int r = 0; r < 4; r++) out[r] = hsum(_mm512_add_ps(acc[2 * r], acc[2 * r + 1]));   \
    }                                                                                           \
    __attribute__((unused)) static const df_ggml_kernels K_##T = {dq_##T, dot_##T, dotm_##T, dot4_##T, NULL, NULL};

GEN(q4_0, 32, 18)
GEN(q4_1, 32, 20)
GEN(q5_0, 32, 22)
GEN(q5_1, 32, 24)
GEN(q8_0, 32, 34)
GEN(mxfp4, 32, 17)
GEN(q2_k, 256, 84)
GEN(q3_k, 256, 110)
GEN(q4_k, 256, 144)
GEN(q5_k, 256, 176)
GEN(q6_k, 256, 210)

/* ---- faster dot products ------------------------------------------------
 * For the types real files use most, the dot product does not need the
 * exact per-weight products: sum_i (d*q_i + m) x_i = d * sum_i q_i x_i +
 * m * sum_i x_i. Nibbles become floats through a 16-entry vpermps table
 * (which reads only the low 4 bits of each index, so no masking), and the
 * block scale is applied once per block to a partial sum. */

/* Software prefetch distance in bytes ahead of the weight stream. */
#define PF_DIST 1024

static inline __m512 lut(__m512i idx, __m512 tbl) { return _mm512_permutexvar_ps(idx, tbl); }

/* Four accumulators over pairs of 32-weight blocks; BODY(i, acc) adds block i. */
#define DOT32(NAME, BB, BODY)                                                                   \
    static float NAME(const uint8_t *row, const float *x, int64_t n) {                          \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                             \
        int64_t nb = n / 32, i = 0;                                                             \
        for (; i + 2 <= nb; i += 2) {                                                           \
            _mm_prefetch((const char *)row + i * (BB) + PF_DIST, _MM_HINT_T0);                  \
            BODY(row + i * (BB), x + i * 32, a0, a1);                                           \
            BODY(row + (i + 1) * (BB), x + (i + 1) * 32, a2, a3);                               \
        }                                                                                       \
        if (i < nb) BODY(row + i * (BB), x + i * 32, a0, a1);                                   \
        return hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));               \
    }

#define Q4_0_BODY(b, xb, acc, acc2)                                                             \
    do {                                                                                        \
        const __m512 tbl = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7); \
        __m512i q = u8x16((b) + 2);                                                             \
        __m512 t = _mm512_mul_ps(lut(q, tbl), _mm512_loadu_ps(xb));                             \
        t = _mm512_fmadd_ps(lut(_mm512_srli_epi32(q, 4), tbl), _mm512_loadu_ps((xb) + 16), t);  \
        acc = _mm512_fmadd_ps(t, _mm512_set1_ps(h2f(b)), acc);                                  \
        (void)acc2;                                                                             \
    } while (0)
DOT32(fdot_q4_0, 18, Q4_0_BODY)

#define MXFP4_BODY(b, xb, acc, acc2)                                                            \
    do {                                                                                        \
        const __m512 tbl = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); \
        uint32_t e_ = (b)[0], bits_ = e_ < 2 ? 0x00200000u << e_ : (e_ - 1) << 23;             \
        float d_;                                                                               \
        memcpy(&d_, &bits_, 4);                                                                 \
        __m512i q = u8x16((b) + 1);                                                             \
        __m512 t = _mm512_mul_ps(lut(q, tbl), _mm512_loadu_ps(xb));                             \
        t = _mm512_fmadd_ps(lut(_mm512_srli_epi32(q, 4), tbl), _mm512_loadu_ps((xb) + 16), t);  \
        acc = _mm512_fmadd_ps(t, _mm512_set1_ps(d_), acc);                                      \
        (void)acc2;                                                                             \
    } while (0)
DOT32(fdot_mxfp4, 17, MXFP4_BODY)

#define Q4_1_BODY(b, xb, acc, acc2)                                                             \
    do {                                                                                        \
        const __m512 tbl = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); \
        __m512i q = u8x16((b) + 4);                                                             \
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps((xb) + 16);                       \
        __m512 t = _mm512_mul_ps(lut(q, tbl), x0);                                              \
        t = _mm512_fmadd_ps(lut(_mm512_srli_epi32(q, 4), tbl), x1, t);                          \
        acc = _mm512_fmadd_ps(t, _mm512_set1_ps(h2f(b)), acc);                                  \
        acc2 = _mm512_fmadd_ps(_mm512_add_ps(x0, x1), _mm512_set1_ps(h2f((b) + 2)), acc2);      \
    } while (0)
DOT32(fdot_q4_1, 20, Q4_1_BODY)

#define Q8_0_BODY(b, xb, acc, acc2)                                                             \
    do {                                                                                        \
        __m512 t = _mm512_mul_ps(cvt(i8x16((b) + 2)), _mm512_loadu_ps(xb));                     \
        t = _mm512_fmadd_ps(cvt(i8x16((b) + 18)), _mm512_loadu_ps((xb) + 16), t);               \
        acc = _mm512_fmadd_ps(t, _mm512_set1_ps(h2f(b)), acc);                                  \
        (void)acc2;                                                                             \
    } while (0)
DOT32(fdot_q8_0, 34, Q8_0_BODY)

/* Q4_K: per sub-block j, d*sc_j * sum q x - dmin*m_j * sum x. */
static float fdot_q4_k(const uint8_t *row, const float *x, int64_t n) {
    const __m512 tbl = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, m0 = a0, m1 = a0;
    for (int64_t i = 0; i < n / 256; i++) {
        const uint8_t *b = row + i * 144, *qs = b + 16;
        _mm_prefetch((const char *)b + PF_DIST, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_DIST + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_DIST + 128, _MM_HINT_T0);
        const float *xb = x + i * 256;
        _Alignas(64) float sm[16];
        const float *dl = sm, *ml = sm + 8;
        k4_scales(b, sm);
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            /* 32 bytes of chunk c: sub-blocks 2c (low nibbles) and 2c+1 (high) */
            __m512i q0 = u8x16(qs + 32 * c), q1 = u8x16(qs + 32 * c + 16);
            const float *xl = xb + 64 * c, *xh = xl + 32;
            __m512 xl0 = _mm512_loadu_ps(xl), xl1 = _mm512_loadu_ps(xl + 16);
            __m512 xh0 = _mm512_loadu_ps(xh), xh1 = _mm512_loadu_ps(xh + 16);
            __m512 tl = _mm512_fmadd_ps(lut(q1, tbl), xl1, _mm512_mul_ps(lut(q0, tbl), xl0));
            __m512 th = _mm512_fmadd_ps(lut(_mm512_srli_epi32(q1, 4), tbl), xh1,
                                        _mm512_mul_ps(lut(_mm512_srli_epi32(q0, 4), tbl), xh0));
            a0 = _mm512_fmadd_ps(tl, _mm512_set1_ps(dl[2 * c]), a0);
            a1 = _mm512_fmadd_ps(th, _mm512_set1_ps(dl[2 * c + 1]), a1);
            m0 = _mm512_fmadd_ps(_mm512_add_ps(xl0, xl1), _mm512_set1_ps(ml[2 * c]), m0);
            m1 = _mm512_fmadd_ps(_mm512_add_ps(xh0, xh1), _mm512_set1_ps(ml[2 * c + 1]), m1);
        }
    }
    return hsum(_mm512_sub_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(m0, m1)));
}

/* Q6_K: per 16 weights, d*sc_k * sum (q-32) x; q from 4 low + 2 high bits. */
static float fdot_q6_k(const uint8_t *row, const float *x, int64_t n) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < n / 256; i++) {
        const uint8_t *b = row + i * 210, *ql = b, *qhp = b + 128;
        _mm_prefetch((const char *)b + PF_DIST, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_DIST + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_DIST + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PF_DIST + 192, _MM_HINT_T0);
        const float *xb = x + i * 256;
        _Alignas(64) float dl[16];
        _mm512_store_ps(dl, _mm512_mul_ps(_mm512_set1_ps(h2f(b + 208)), cvt(i8x16(b + 192))));
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m512i qh[2] = {u8x16(qhp + 32 * h), u8x16(qhp + 32 * h + 16)};
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
                __m512i q = u8x16(ql + 64 * h + 16 * c);
                __m512i h0 = _mm512_and_si512(_mm512_slli_epi32(qh[c % 2], 4 - 2 * (c / 2)), c32(0x30));
                __m512i h1 = _mm512_and_si512(_mm512_srli_epi32(qh[c % 2], 2 * (2 + c / 2) - 4), c32(0x30));
                __m512i q0 = _mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(q, c32(15)), h0), c32(32));
                __m512i q1 = _mm512_sub_epi32(_mm512_or_si512(_mm512_srli_epi32(q, 4), h1), c32(32));
                int k0 = 8 * h + c, k1 = 8 * h + 4 + c;
                acc[c & 1] = _mm512_fmadd_ps(_mm512_mul_ps(cvt(q0), _mm512_loadu_ps(xb + 16 * k0)),
                                             _mm512_set1_ps(dl[k0]), acc[c & 1]);
                acc[2 + (c & 1)] = _mm512_fmadd_ps(_mm512_mul_ps(cvt(q1), _mm512_loadu_ps(xb + 16 * k1)),
                                                   _mm512_set1_ps(dl[k1]), acc[2 + (c & 1)]);
            }
        }
    }
    return hsum(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

#ifndef PF4_DIST
#define PF4_DIST 512
#endif
/* Four-row version of the Q8_0 body: x is loaded once per block for the four
 * rows (measured: +40% single-thread from DRAM). A four-row Q4_1 body measured
 * ~10% slower than fdot_q4_1 (that kernel is bound by its own vector ops, not
 * by x traffic), and four-row K-quant drivers built from the exact decoders
 * lost to fdot_q4_k / fdot_q6_k, so those types keep single-row kernels. */
static void fdot4_q8_0(const uint8_t *row, size_t rs, const float *x, int64_t n, float *out) {
    __m512 a[4];
    for (int r = 0; r < 4; r++) a[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const float *xb = x + i * 32;
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
            const uint8_t *b = row + r * rs + i * 34;
            _mm_prefetch((const char *)b + PF4_DIST, _MM_HINT_T0);
            __m512 t = _mm512_fmadd_ps(cvt(i8x16(b + 18)), x1, _mm512_mul_ps(cvt(i8x16(b + 2)), x0));
            a[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(h2f(b)), a[r]);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = hsum(a[r]);
}

static const df_ggml_kernels F_q4_0 = {dq_q4_0, fdot_q4_0, dotm_q4_0, dot4_q4_0, NULL, NULL};
static const df_ggml_kernels F_q4_1 = {dq_q4_1, fdot_q4_1, dotm_q4_1, NULL, NULL, NULL};
static const df_ggml_kernels F_q8_0 = {dq_q8_0, fdot_q8_0, dotm_q8_0, fdot4_q8_0, NULL, NULL};
static const df_ggml_kernels F_mxfp4 = {dq_mxfp4, fdot_mxfp4, dotm_mxfp4, dot4_mxfp4, NULL, NULL};
static const df_ggml_kernels F_q4_k = {dq_q4_k, fdot_q4_k, dotm_q4_k, NULL, NULL, NULL};
static const df_ggml_kernels F_q6_k = {dq_q6_k, fdot_q6_k, dotm_q6_k, NULL, NULL, NULL};

/* ---- per-element types (any n) ------------------------------------------ */

static inline __m512 ld_f32(const uint8_t *p) { return _mm512_loadu_ps((const float *)p); }
static inline __m512 ld_f16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512 ld_bf16(const uint8_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline float one_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
static inline float one_f16(const uint8_t *p) { return h2f(p); }
static inline float one_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define GEN_ELEM(T, ES)                                                                         \
    static void dq_##T(const uint8_t *src, float *dst, int64_t n) {                             \
        int64_t i = 0;                                                                          \
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ld_##T(src + i * (ES)));         \
        for (; i < n; i++) dst[i] = one_##T(src + i * (ES));                                    \
    }                                                                                           \
    static float dot_##T(const uint8_t *row, const float *x, int64_t n) {                       \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                             \
        int64_t i = 0;                                                                          \
        for (; i + 64 <= n; i += 64) {                                                          \
            a0 = _mm512_fmadd_ps(ld_##T(row + i * (ES)), _mm512_loadu_ps(x + i), a0);           \
            a1 = _mm512_fmadd_ps(ld_##T(row + (i + 16) * (ES)), _mm512_loadu_ps(x + i + 16), a1); \
            a2 = _mm512_fmadd_ps(ld_##T(row + (i + 32) * (ES)), _mm512_loadu_ps(x + i + 32), a2); \
            a3 = _mm512_fmadd_ps(ld_##T(row + (i + 48) * (ES)), _mm512_loadu_ps(x + i + 48), a3); \
        }                                                                                       \
        for (; i + 16 <= n; i += 16)                                                            \
            a0 = _mm512_fmadd_ps(ld_##T(row + i * (ES)), _mm512_loadu_ps(x + i), a0);           \
        float s = hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));            \
        for (; i < n; i++) s += one_##T(row + i * (ES)) * x[i];                                 \
        return s;                                                                               \
    }                                                                                           \
    static void dotm_##T(const uint8_t *row, const float *x, int64_t n, int m, int64_t xs,       \
                         float *out, int64_t os) {                                              \
        for (int j0 = 0; j0 < m; j0 += MB) {                                                    \
            int mj = m - j0 < MB ? m - j0 : MB;                                                 \
            __m512 acc[MB];                                                                     \
            float tail[MB] = {0};                                                               \
            for (int j = 0; j < MB; j++) acc[j] = _mm512_setzero_ps();                          \
            int64_t i = 0;                                                                      \
            for (; i + 16 <= n; i += 16) {                                                      \
                __m512 w = ld_##T(row + i * (ES));                                              \
                for (int j = 0; j < mj; j++)                                                    \
                    acc[j] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + (int64_t)(j0 + j) * xs + i), acc[j]); \
            }                                                                                   \
            for (; i < n; i++) {                                                                \
                float w = one_##T(row + i * (ES));                                              \
                for (int j = 0; j < mj; j++) tail[j] += w * x[(int64_t)(j0 + j) * xs + i];      \
            }                                                                                   \
            for (int j = 0; j < mj; j++) out[(int64_t)(j0 + j) * os] = hsum(acc[j]) + tail[j];  \
        }                                                                                       \
    }                                                                                           \
    __attribute__((unused)) static const df_ggml_kernels K_##T = {dq_##T, dot_##T, dotm_##T, NULL, NULL, NULL};

GEN_ELEM(f32, 4)
GEN_ELEM(f16, 2)
GEN_ELEM(bf16, 2)

const df_ggml_kernels *df_ggml_kernels_avx512(int type) {
    switch (type) {
    case DF_GGML_F32: return &K_f32;
    case DF_GGML_F16: return &K_f16;
    case DF_GGML_BF16: return &K_bf16;
    case DF_GGML_Q4_0: return &F_q4_0;
    case DF_GGML_Q4_1: return &F_q4_1;
    case DF_GGML_Q5_0: return &K_q5_0;
    case DF_GGML_Q5_1: return &K_q5_1;
    case DF_GGML_Q8_0: return &F_q8_0;
    case DF_GGML_Q2_K: return &K_q2_k;
    case DF_GGML_Q3_K: return &K_q3_k;
    case DF_GGML_Q4_K: return &F_q4_k;
    case DF_GGML_Q5_K: return &K_q5_k;
    case DF_GGML_Q6_K: return &F_q6_k;
    case DF_GGML_MXFP4: return &F_mxfp4;
    default: return NULL;
    }
}
