/* ggml_quant_avx2.c - AVX2 + FMA + F16C kernels for GGML block types.
 * Compiled with -mavx2 -mfma -mf16c; only called after the dispatcher in
 * ggml_quant.c checked the CPU.
 *
 * Same shape as ggml_quant_avx512.c with 8-float vectors: one bit-exact
 * decoder per type, dec_T(block, w) giving NV = block_elems/8 vectors,
 * and generic dequant / dot / dot_multi drivers stamped out from it.
 * Where AVX-512 uses mask registers for single bits (Q5 high bits, Q3_K
 * hmask), this file shifts the bit into place with variable shifts.
 */
#include "backend/cpu/ggml_quant_impl.h"
#include "backend/cpu/avx2_tr.h"
#include "format/gguf.h"

#include <immintrin.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define MB 4 /* activation vectors per pass in dot_multi */

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 bytes -> 8 dwords. */
static inline __m256i u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline __m256i i8x8(const uint8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline __m256 cvt(__m256i v) { return _mm256_cvtepi32_ps(v); }
static inline __m256i c32(int v) { return _mm256_set1_epi32(v); }
static inline __m256i and15(__m256i v) { return _mm256_and_si256(v, c32(15)); }
static inline __m256i hi4(__m256i v) { return _mm256_srli_epi32(v, 4); }

/* Bits base..base+7 of qh, one per lane, as 0/16. */
static inline __m256i bits16(uint32_t qh, int base) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> base)), lane);
    return _mm256_slli_epi32(_mm256_and_si256(v, c32(1)), 4);
}

/* ---- decoders ---------------------------------------------------------- */

static inline void dec_q4_0(const uint8_t *b, __m256 *w) {
    __m256 d = _mm256_set1_ps(h2f(b));
    const uint8_t *qs = b + offsetof(df_blk_q4_0, qs);
    for (int h = 0; h < 2; h++) {
        __m256i q = u8x8(qs + 8 * h);
        w[h] = _mm256_mul_ps(d, cvt(_mm256_sub_epi32(and15(q), c32(8))));
        w[h + 2] = _mm256_mul_ps(d, cvt(_mm256_sub_epi32(hi4(q), c32(8))));
    }
}

static inline void dec_q4_1(const uint8_t *b, __m256 *w) {
    __m256 d = _mm256_set1_ps(h2f(b)), m = _mm256_set1_ps(h2f(b + 2));
    const uint8_t *qs = b + offsetof(df_blk_q4_1, qs);
    for (int h = 0; h < 2; h++) {
        __m256i q = u8x8(qs + 8 * h);
        w[h] = _mm256_add_ps(_mm256_mul_ps(d, cvt(and15(q))), m);
        w[h + 2] = _mm256_add_ps(_mm256_mul_ps(d, cvt(hi4(q))), m);
    }
}

static inline void dec_q5_0(const uint8_t *b, __m256 *w) {
    __m256 d = _mm256_set1_ps(h2f(b));
    uint32_t qh;
    memcpy(&qh, b + offsetof(df_blk_q5_0, qh), 4);
    const uint8_t *qs = b + offsetof(df_blk_q5_0, qs);
    for (int h = 0; h < 2; h++) {
        __m256i q = u8x8(qs + 8 * h);
        __m256i lo = _mm256_or_si256(and15(q), bits16(qh, 8 * h));
        __m256i hi = _mm256_or_si256(hi4(q), bits16(qh, 16 + 8 * h));
        w[h] = _mm256_mul_ps(d, cvt(_mm256_sub_epi32(lo, c32(16))));
        w[h + 2] = _mm256_mul_ps(d, cvt(_mm256_sub_epi32(hi, c32(16))));
    }
}

static inline void dec_q5_1(const uint8_t *b, __m256 *w) {
    __m256 d = _mm256_set1_ps(h2f(b)), m = _mm256_set1_ps(h2f(b + 2));
    uint32_t qh;
    memcpy(&qh, b + offsetof(df_blk_q5_1, qh), 4);
    const uint8_t *qs = b + offsetof(df_blk_q5_1, qs);
    for (int h = 0; h < 2; h++) {
        __m256i q = u8x8(qs + 8 * h);
        __m256i lo = _mm256_or_si256(and15(q), bits16(qh, 8 * h));
        __m256i hi = _mm256_or_si256(hi4(q), bits16(qh, 16 + 8 * h));
        w[h] = _mm256_add_ps(_mm256_mul_ps(d, cvt(lo)), m);
        w[h + 2] = _mm256_add_ps(_mm256_mul_ps(d, cvt(hi)), m);
    }
}

static inline void dec_q8_0(const uint8_t *b, __m256 *w) {
    __m256 d = _mm256_set1_ps(h2f(b));
    for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(d, cvt(i8x8(b + 2 + 8 * k)));
}

static inline void dec_mxfp4(const uint8_t *b, __m256 *w) {
    const __m256 pos = _mm256_setr_ps(0, 1, 2, 3, 4, 6, 8, 12);
    const __m256 neg = _mm256_setr_ps(0, -1, -2, -3, -4, -6, -8, -12);
    uint32_t e = b[0], bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    float df;
    memcpy(&df, &bits, 4);
    __m256 d = _mm256_set1_ps(df);
    for (int h = 0; h < 2; h++) {
        __m256i q = u8x8(b + 1 + 8 * h);
        __m256i idx[2] = {and15(q), hi4(q)};
        for (int s = 0; s < 2; s++) {
            /* permps uses the low 3 bits; bit 3 (moved to the sign) picks the table */
            __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(pos, idx[s]),
                                        _mm256_permutevar8x32_ps(neg, idx[s]),
                                        _mm256_castsi256_ps(_mm256_slli_epi32(idx[s], 28)));
            w[h + 2 * s] = _mm256_mul_ps(d, v);
        }
    }
}

static inline void dec_q2_k(const uint8_t *b, __m256 *w) {
    float d = h2f(b + offsetof(df_blk_q2_k, d)), dmin = h2f(b + offsetof(df_blk_q2_k, dmin));
    _Alignas(32) float dl[16], ml[16];
    for (int h = 0; h < 2; h++) {
        __m256i sc = u8x8(b + 8 * h);
        _mm256_store_ps(dl + 8 * h, _mm256_mul_ps(_mm256_set1_ps(d), cvt(and15(sc))));
        _mm256_store_ps(ml + 8 * h, _mm256_mul_ps(_mm256_set1_ps(dmin), cvt(hi4(sc))));
    }
    const uint8_t *qs = b + offsetof(df_blk_q2_k, qs);
    for (int c = 0; c < 8; c++) {
        /* bytes 8c..8c+7: half h=c/4, byte offset l0=(c%4)*8 inside the half */
        __m256i src = u8x8(qs + 8 * c);
        int h = c / 4, l0 = (c % 4) * 8;
        for (int j = 0; j < 4; j++) {
            int e = h * 128 + j * 32 + l0; /* first element */
            __m256i q = _mm256_and_si256(_mm256_srli_epi32(src, 2 * j), c32(3));
            w[e / 8] = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dl[e / 16]), cvt(q)),
                                     _mm256_set1_ps(ml[e / 16]));
        }
    }
}

static inline void dec_q3_k(const uint8_t *b, __m256 *w) {
    float d = h2f(b + offsetof(df_blk_q3_k, d));
    const uint8_t *s = b + offsetof(df_blk_q3_k, scales);
    float dl[16];
    for (int k = 0; k < 16; k++) {
        int lo = (s[k % 8] >> (4 * (k / 8))) & 15, hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        dl[k] = d * (float)((lo | (hi << 4)) - 32);
    }
    const uint8_t *qs = b + offsetof(df_blk_q3_k, qs);
    __m256i hm[4] = {u8x8(b), u8x8(b + 8), u8x8(b + 16), u8x8(b + 24)};
    for (int c = 0; c < 8; c++) {
        __m256i src = u8x8(qs + 8 * c);
        int h = c / 4, l0 = (c % 4) * 8;
        for (int j = 0; j < 4; j++) {
            int e = h * 128 + j * 32 + l0;
            __m256i ql = _mm256_and_si256(_mm256_srli_epi32(src, 2 * j), c32(3));
            __m256i hb = _mm256_and_si256(_mm256_srli_epi32(hm[l0 / 8], e / 32), c32(1));
            __m256i q = _mm256_add_epi32(_mm256_sub_epi32(ql, c32(4)), _mm256_slli_epi32(hb, 2));
            w[e / 8] = _mm256_mul_ps(_mm256_set1_ps(dl[e / 16]), cvt(q));
        }
    }
}

/* Q4_K/Q5_K scales and mins, unpacked four at a time in 32-bit words:
 * sm[j] = d*sc_j, sm[8+j] = dmin*m_j (f32 products, as in the reference). */
static inline __attribute__((always_inline)) void k4_scales(const uint8_t *b, float *sm) {
    uint32_t w[3], u[4];
    memcpy(w, b + 4, 12);
    u[0] = w[0] & 0x3f3f3f3fu;
    u[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    u[2] = w[1] & 0x3f3f3f3fu;
    u[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    _mm256_storeu_ps(sm, _mm256_mul_ps(_mm256_set1_ps(h2f(b)), cvt(u8x8((const uint8_t *)u))));
    _mm256_storeu_ps(sm + 8, _mm256_mul_ps(_mm256_set1_ps(h2f(b + 2)), cvt(u8x8((const uint8_t *)u + 8))));
}

static inline void dec_q4_k(const uint8_t *b, __m256 *w) {
    _Alignas(32) float sm[16];
    const float *dl = sm, *ml = sm + 8;
    k4_scales(b, sm);
    const uint8_t *qs = b + offsetof(df_blk_q4_k, qs);
    for (int c = 0; c < 16; c++) {
        /* bytes 8c..: 32-byte chunk c/4 (sub-blocks 2*(c/4), +1), elements (c%4)*8.. */
        __m256i q = u8x8(qs + 8 * c);
        int sb = 2 * (c / 4), k = sb * 4 + c % 4;
        w[k] = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dl[sb]), cvt(and15(q))), _mm256_set1_ps(ml[sb]));
        w[k + 4] = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dl[sb + 1]), cvt(hi4(q))),
                                 _mm256_set1_ps(ml[sb + 1]));
    }
}

static inline void dec_q5_k(const uint8_t *b, __m256 *w) {
    _Alignas(32) float sm[16];
    const float *dl = sm, *ml = sm + 8;
    k4_scales(b, sm);
    const uint8_t *qs = b + offsetof(df_blk_q5_k, qs), *qhp = b + offsetof(df_blk_q5_k, qh);
    __m256i qh[4] = {u8x8(qhp), u8x8(qhp + 8), u8x8(qhp + 16), u8x8(qhp + 24)};
    for (int c = 0; c < 16; c++) {
        __m256i q = u8x8(qs + 8 * c);
        int sb = 2 * (c / 4), k = sb * 4 + c % 4;
        __m256i h = qh[c % 4];
        __m256i lo = _mm256_or_si256(and15(q), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, sb), c32(1)), 4));
        __m256i hi = _mm256_or_si256(hi4(q), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, sb + 1), c32(1)), 4));
        w[k] = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dl[sb]), cvt(lo)), _mm256_set1_ps(ml[sb]));
        w[k + 4] = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dl[sb + 1]), cvt(hi)), _mm256_set1_ps(ml[sb + 1]));
    }
}

static inline void dec_q6_k(const uint8_t *b, __m256 *w) {
    float d = h2f(b + offsetof(df_blk_q6_k, d));
    _Alignas(32) float dl[16];
    for (int h = 0; h < 2; h++)
        _mm256_store_ps(dl + 8 * h, _mm256_mul_ps(_mm256_set1_ps(d), cvt(i8x8(b + offsetof(df_blk_q6_k, scales) + 8 * h))));
    const uint8_t *ql = b, *qhp = b + offsetof(df_blk_q6_k, qh);
    for (int h = 0; h < 2; h++) {
        for (int c = 0; c < 8; c++) {
            /* ql bytes 64h+8c.. give r=8c.. (low nibble) and r=64+8c.. (high) */
            __m256i q = u8x8(ql + 64 * h + 8 * c);
            int r0 = 8 * c, r1 = 64 + 8 * c;
            __m256i qh = u8x8(qhp + 32 * h + r0 % 32);
            __m256i h0 = _mm256_and_si256(_mm256_srli_epi32(qh, 2 * (r0 / 32)), c32(3));
            __m256i h1 = _mm256_and_si256(_mm256_srli_epi32(qh, 2 * (r1 / 32)), c32(3));
            __m256i q0 = _mm256_or_si256(and15(q), _mm256_slli_epi32(h0, 4));
            __m256i q1 = _mm256_or_si256(hi4(q), _mm256_slli_epi32(h1, 4));
            int e0 = 128 * h + r0, e1 = 128 * h + r1;
            w[e0 / 8] = _mm256_mul_ps(_mm256_set1_ps(dl[e0 / 16]), cvt(_mm256_sub_epi32(q0, c32(32))));
            w[e1 / 8] = _mm256_mul_ps(_mm256_set1_ps(dl[e1 / 16]), cvt(_mm256_sub_epi32(q1, c32(32))));
        }
    }
}

/* ---- drivers ----------------------------------------------------------- */

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Blocks of BE elements in BB bytes: NV = BE/8 vectors per block. The dot
 * loops fold vector k into accumulator k%4. */
#define GEN(T, BE, BB)                                                                          \
    enum { NV_##T = (BE) / 8 };                                                                 \
    static void dq_##T(const uint8_t *src, float *dst, int64_t n) {                             \
        for (int64_t i = 0; i < n / (BE); i++) {                                                \
            __m256 w[NV_##T];                                                                   \
            dec_##T(src + i * (BB), w);                                                         \
            for (int k = 0; k < NV_##T; k++) _mm256_storeu_ps(dst + i * (BE) + 8 * k, w[k]);    \
        }                                                                                       \
    }                                                                                           \
    static float dot_##T(const uint8_t *row, const float *x, int64_t n) {                       \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),         \
                         _mm256_setzero_ps()};                                                  \
        for (int64_t i = 0; i < n / (BE); i++) {                                                \
            __m256 w[NV_##T];                                                                   \
            for (int o_ = 0; o_ < (BB); o_ += 64)                                               \
                _mm_prefetch((const char *)row + i * (BB) + 1024 + o_, _MM_HINT_T0);            \
            dec_##T(row + i * (BB), w);                                                         \
            const float *xb = x + i * (BE);                                                     \
            _Pragma("GCC unroll 32") for (int k = 0; k < NV_##T; k++) acc[k & 3] =              \
                _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xb + 8 * k), acc[k & 3]);                 \
        }                                                                                       \
        return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))); \
    }                                                                                           \
    static void dotm_##T(const uint8_t *row, const float *x, int64_t n, int m, int64_t xs,       \
                         float *out, int64_t os) {                                              \
        for (int j0 = 0; j0 < m; j0 += MB) {                                                    \
            int mj = m - j0 < MB ? m - j0 : MB;                                                 \
            __m256 acc[MB];                                                                     \
            for (int j = 0; j < MB; j++) acc[j] = _mm256_setzero_ps();                          \
            for (int64_t i = 0; i < n / (BE); i++) {                                            \
                __m256 w[NV_##T];                                                               \
                dec_##T(row + i * (BB), w);                                                     \
                for (int j = 0; j < mj; j++) {                                                  \
                    const float *xb = x + (int64_t)(j0 + j) * xs + i * (BE);                    \
                    __m256 a0 = acc[j], a1 = _mm256_setzero_ps();                               \
                    for (int k = 0; k < NV_##T; k += 2) {                                       \
                        a0 = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xb + 8 * k), a0);            \
                        a1 = _mm256_fmadd_ps(w[k + 1], _mm256_loadu_ps(xb + 8 * k + 8), a1);    \
                    }                                                                           \
                    acc[j] = _mm256_add_ps(a0, a1);                                             \
                }                                                                               \
            }                                                                                   \
            for (int j = 0; j < mj; j++) out[(int64_t)(j0 + j) * os] = hsum(acc[j]);            \
        }                                                                                       \
    }                                                                                           \
    __attribute__((unused)) static const df_ggml_kernels K_##T = {dq_##T, dot_##T, dotm_##T, NULL, NULL, NULL};

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

/* ---- prepared-x decode kernels (df_ggml_px, issue 17) -------------------
 * Per block the integer codes q are converted to f32 and multiplied by f32
 * x; the block scale multiplies the block's partial sum once, and the
 * offset/min terms use the sums of x prepared once per x (px_prep):
 *   Q4_0:      d * (sum q x) + d * -8 * S32
 *   Q5_0:      d * (sum (q - 16) x)               (nothing prepared)
 *   Q4_1/Q5_1: d * (sum q x) + m * S32
 *   Q8_0:      d * (sum q x)                       (nothing prepared)
 *   Q4_K/Q5_K: sum_sb (d*sc_sb) * (sum q x) - sum_sb (dmin*m_sb) * S32_sb
 *   Q6_K:      sum_k (d*sc_k) * (sum q x) - sum_k (d*sc_k) * (32 * S16_k)
 * Order of additions, per row: within a block of 32 (a sub-block for the
 * K types) two 8-lane chains (products of vectors 0,1 then + 2,3), added,
 * scaled into one 8-lane row accumulator with an FMA, blocks in order; the
 * offset terms go to a separate accumulator (4 lanes for the 32-blocks,
 * folded into the row accumulator for the K types) added at the end. The
 * four-row loop runs the same per-row body as the one-row loop, so a row's
 * result is the same bits whichever rows it is grouped with. */

static inline __m256 ldx(const float *p) { return _mm256_loadu_ps(p); }

/* [h0, h1, 0, 0] from two (or one) f16 at p. */
static inline __m128 ph2(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
}
/* the f16 at p in all 8 lanes: a broadcast load and one conversion (the
 * same value as converting it once and broadcasting the float) */
static inline __m256 ph1x8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_set1_epi16((short)(p[0] | p[1] << 8)));
}

static inline float hsum8(const float *x) {
    __m256 v = _mm256_add_ps(_mm256_add_ps(ldx(x), ldx(x + 8)), _mm256_add_ps(ldx(x + 16), ldx(x + 24)));
    return hsum(v);
}

/* aux[4i + lane] = c * S32_i, other lanes 0 (Q4_0 c=-8, Q5_0 c=-16 in lane 0;
 * Q4_1/Q5_1 c=1 in lane 1, matching ph2's [d, m]). */
static inline void prep_off(const float *x, int64_t n, float *aux, float c, int lane) {
    for (int64_t i = 0; i < n / 32; i++) {
        _mm_storeu_ps(aux + 4 * i, _mm_setzero_ps());
        aux[4 * i + lane] = c * hsum8(x + 32 * i);
    }
}
static void prep_q4_0(const float *x, int64_t n, float *aux) { prep_off(x, n, aux, -8.0f, 0); }
static void prep_q4_1(const float *x, int64_t n, float *aux) { prep_off(x, n, aux, 1.0f, 1); }
static void prep_none(const float *x, int64_t n, float *aux) { (void)x, (void)n, (void)aux; }
/* aux[j] = S32_j for every 32 weights (Q4_K/Q5_K sub-blocks). */
static void prep_s32(const float *x, int64_t n, float *aux) {
    for (int64_t j = 0; j < n / 32; j++) aux[j] = hsum8(x + 32 * j);
}
/* aux[k] = 32 * S16_k (Q6_K sub-blocks of 16). */
static void prep_s16(const float *x, int64_t n, float *aux) {
    for (int64_t k = 0; k < n / 16; k++) aux[k] = 32.0f * hsum(_mm256_add_ps(ldx(x + 16 * k), ldx(x + 16 * k + 8)));
}

typedef struct {
    __m256 a; /* scaled partial sums */
    __m128 m; /* offset terms (32-blocks) */
} pxs;

/* sum over 32 of cvt(q)*x for the four code vectors of a 32-block:
 * (q0 x0 + q2 x2) + (q1 x1 + q3 x3). */
static inline __m256 dot32(__m256i q0, __m256i q1, __m256i q2, __m256i q3, const float *xb) {
    __m256 t0 = _mm256_mul_ps(cvt(q0), ldx(xb));
    __m256 t1 = _mm256_mul_ps(cvt(q1), ldx(xb + 8));
    t0 = _mm256_fmadd_ps(cvt(q2), ldx(xb + 16), t0);
    t1 = _mm256_fmadd_ps(cvt(q3), ldx(xb + 24), t1);
    return _mm256_add_ps(t0, t1);
}

static inline void bx_q4_0(const uint8_t *b, const float *xb, const float *ab, pxs *s) {
    __m256 d = ph1x8(b);
    __m256i q0 = u8x8(b + 2), q1 = u8x8(b + 10);
    __m256 t = dot32(and15(q0), and15(q1), hi4(q0), hi4(q1), xb);
    s->a = _mm256_fmadd_ps(d, t, s->a);
    s->m = _mm_fmadd_ps(_mm256_castps256_ps128(d), _mm_loadu_ps(ab), s->m);
}
static inline void bx_q4_1(const uint8_t *b, const float *xb, const float *ab, pxs *s) {
    __m128 dm = ph2(b);
    __m256i q0 = u8x8(b + 4), q1 = u8x8(b + 12);
    __m256 t = dot32(and15(q0), and15(q1), hi4(q0), hi4(q1), xb);
    s->a = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), t, s->a);
    s->m = _mm_fmadd_ps(dm, _mm_loadu_ps(ab), s->m);
}
/* Q5 codes of a 32-block in element order, built on bytes and widened
 * from memory (the cheapest widening: one load-and-extend per 8 codes).
 * Low nibbles (elements 0..15) and high nibbles (16..31) side by side: the
 * 16 code bytes broadcast to both 128-bit lanes, the upper lane shifted by
 * 4. Bit e of qh goes to byte e by a broadcast and a byte shuffle (byte e
 * holds qh byte e/8), then an and (Q5_1) or and-not (Q5_0) with the bit's
 * mask leaves in byte e the bit's value (1..128) where the bit is set (Q5_1)
 * or clear (Q5_0), else 0; vpsignb turns that into the code's high part in
 * one instruction: it keeps, negates or zeroes a constant by the sign of
 * that byte (the lanes of bit 7 read 0x80, negative, so their constant has
 * the other sign). Q5_1 builds q = nibble | 16 (bit set); Q5_0 (SIGNED)
 * builds q - 16 directly: nibble | 0xf0 (bit clear) = nibble - 16 as a
 * signed byte, the nibble (bit set); no offset term. The same bytes as the
 * compare-and-mask of round 3, in one instruction fewer. The 32 bytes go to
 * c[], which the caller widens with pmov[sz]xbd from memory. */
static inline __attribute__((always_inline)) void q5_bytes(const uint8_t *qhp, const uint8_t *qs, int sgn, uint8_t *c) {
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                         3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    /* 16 in the lanes of bits 0..6, -16 in those of bit 7 (Q5_1); negated for Q5_0 */
    const __m256i hi16 = _mm256_set1_epi64x((long long)0xf010101010101010ull);
    uint32_t qh;
    memcpy(&qh, qhp, 4);
    __m256i u = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel);
    __m256i hb = sgn ? _mm256_sign_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), hi16), _mm256_andnot_si256(u, bit))
                     : _mm256_sign_epi8(hi16, _mm256_and_si256(u, bit));
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
    _mm256_store_si256((__m256i *)c, _mm256_or_si256(nib, hb));
    /* keep the store and the widening loads (else the compiler widens from
     * the register: three more shuffles) */
    __asm__("" : "+m"(*(uint8_t(*)[32])c));
}
/* Q5_0 with its block scale given (the four-row loop converts the four
 * rows' scales with one vcvtph2ps: the same floats as ph1x8) */
static inline __attribute__((always_inline)) void bx_q5_0d(const uint8_t *b, __m256 d, const float *xb, pxs *s) {
    _Alignas(32) uint8_t c[32];
    q5_bytes(b + 2, b + 6, 1, c);
    __m256 t = dot32(i8x8(c), i8x8(c + 8), i8x8(c + 16), i8x8(c + 24), xb);
    s->a = _mm256_fmadd_ps(d, t, s->a);
}
static inline void bx_q5_0(const uint8_t *b, const float *xb, const float *ab, pxs *s) {
    (void)ab;
    bx_q5_0d(b, ph1x8(b), xb, s);
}
static inline void bx_q5_1(const uint8_t *b, const float *xb, const float *ab, pxs *s) {
    __m128 dm = ph2(b);
    _Alignas(32) uint8_t c[32];
    q5_bytes(b + 4, b + 8, 0, c);
    __m256 t = dot32(u8x8(c), u8x8(c + 8), u8x8(c + 16), u8x8(c + 24), xb);
    s->a = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), t, s->a);
    s->m = _mm_fmadd_ps(dm, _mm_loadu_ps(ab), s->m);
}
static inline void bx_q8_0(const uint8_t *b, const float *xb, const float *ab, pxs *s) {
    (void)ab;
    __m256 d = ph1x8(b);
    __m256 t = dot32(i8x8(b + 2), i8x8(b + 10), i8x8(b + 18), i8x8(b + 26), xb);
    s->a = _mm256_fmadd_ps(d, t, s->a);
}

/* Q4_K: 32-byte chunk c holds sub-blocks 2c (low nibbles) and 2c+1 (high). */
static inline __attribute__((always_inline)) void bx_q4_k(const uint8_t *b, const float *xb, const float *ab, pxs *s) {
    _Alignas(32) float sm[16];
    k4_scales(b, sm);
    s->a = _mm256_fnmadd_ps(_mm256_load_ps(sm + 8), _mm256_loadu_ps(ab), s->a);
    const uint8_t *qs = b + offsetof(df_blk_q4_k, qs);
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        __m256i q0 = u8x8(qs + 32 * c), q1 = u8x8(qs + 32 * c + 8), q2 = u8x8(qs + 32 * c + 16),
                q3 = u8x8(qs + 32 * c + 24);
        __m256 tl = dot32(and15(q0), and15(q1), and15(q2), and15(q3), xb + 64 * c);
        __m256 th = dot32(hi4(q0), hi4(q1), hi4(q2), hi4(q3), xb + 64 * c + 32);
        s->a = _mm256_fmadd_ps(_mm256_broadcast_ss(sm + 2 * c), tl, s->a);
        s->a = _mm256_fmadd_ps(_mm256_broadcast_ss(sm + 2 * c + 1), th, s->a);
    }
}
/* Q5_K: the high bit of element l of sub-block sb is bit sb of qh[l]. */
static inline __m256i q5k_hi(__m256i h, int sb) {
    __m256i v = _mm256_and_si256(h, c32(1 << sb));
    return sb < 4 ? _mm256_slli_epi32(v, 4 - sb) : _mm256_srli_epi32(v, sb - 4);
}
static inline __attribute__((always_inline)) void bx_q5_k(const uint8_t *b, const float *xb, const float *ab, pxs *s) {
    _Alignas(32) float sm[16];
    k4_scales(b, sm);
    s->a = _mm256_fnmadd_ps(_mm256_load_ps(sm + 8), _mm256_loadu_ps(ab), s->a);
    const uint8_t *qs = b + offsetof(df_blk_q5_k, qs), *qhp = b + offsetof(df_blk_q5_k, qh);
    __m256i h[4] = {u8x8(qhp), u8x8(qhp + 8), u8x8(qhp + 16), u8x8(qhp + 24)};
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
        __m256i q[4], lo[4], hi[4];
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            q[k] = u8x8(qs + 32 * c + 8 * k);
            lo[k] = _mm256_or_si256(and15(q[k]), q5k_hi(h[k], 2 * c));
            hi[k] = _mm256_or_si256(hi4(q[k]), q5k_hi(h[k], 2 * c + 1));
        }
        __m256 tl = dot32(lo[0], lo[1], lo[2], lo[3], xb + 64 * c);
        __m256 th = dot32(hi[0], hi[1], hi[2], hi[3], xb + 64 * c + 32);
        s->a = _mm256_fmadd_ps(_mm256_broadcast_ss(sm + 2 * c), tl, s->a);
        s->a = _mm256_fmadd_ps(_mm256_broadcast_ss(sm + 2 * c + 1), th, s->a);
    }
}
/* Q6_K: half h (128 weights): r in [32g, 32g+32) takes the low 4 bits from
 * ql[64h + r % 64] (nibble r / 64) and the high 2 from qh[32h + r % 32]
 * (bits 2g, 2g+1). The codes q (0..63) are built on 32 bytes at a time
 * and widened to dwords 8 at a time; the -32 is in aux. Sub-block
 * of 16 of weights r0..r0+15: 8h + r0/16. */
static inline __attribute__((always_inline)) void bx_q6_k(const uint8_t *b, const float *xb, const float *ab, pxs *s) {
    _Alignas(32) float dl[16];
    __m256 d = _mm256_set1_ps(h2f(b + offsetof(df_blk_q6_k, d)));
    const uint8_t *sc = b + offsetof(df_blk_q6_k, scales);
    __m256 d0 = _mm256_mul_ps(d, cvt(i8x8(sc))), d1 = _mm256_mul_ps(d, cvt(i8x8(sc + 8)));
    _mm256_store_ps(dl, d0);
    _mm256_store_ps(dl + 8, d1);
    s->a = _mm256_fnmadd_ps(d0, _mm256_loadu_ps(ab), s->a);
    s->a = _mm256_fnmadd_ps(d1, _mm256_loadu_ps(ab + 8), s->a);
    const uint8_t *ql = b, *qhp = b + offsetof(df_blk_q6_k, qh);
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m256i la = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
        __m256i lb = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(qhp + 32 * h));
        __m256i v[4] = {
            _mm256_or_si256(_mm256_and_si256(la, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(lb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), m4), _mm256_and_si256(qh, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
        /* the codes go through memory: four load-and-extend instructions per
         * 32 codes instead of an extract, two byte shifts and four extends */
        _Alignas(32) uint8_t cb[4][32];
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) _mm256_store_si256((__m256i *)cb[g], v[g]);
        __asm__("" : "+m"(cb));
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
            _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {
                /* 16 codes: weights r = 32g + 16e .., sub-block 8h + 2g + e */
                const float *xk = xb + 128 * h + 32 * g + 16 * e;
                __m256 t = _mm256_fmadd_ps(cvt(u8x8(cb[g] + 16 * e + 8)), ldx(xk + 8), _mm256_mul_ps(cvt(u8x8(cb[g] + 16 * e)), ldx(xk)));
                s->a = _mm256_fmadd_ps(_mm256_broadcast_ss(dl + 8 * h + 2 * g + e), t, s->a);
            }
        }
    }
}

/* Software prefetch: the weights stream from DRAM, and without it the
 * four-row kernels ran slower than the single-row ones on a 48 MiB matrix.
 * The four-row loop prefetches the same position of the next group of four
 * rows (4 row strides ahead: a fixed distance would land in the rows the
 * other three streams are reading when rows are short); the one-row loop
 * prefetches PX_PF bytes ahead. */
#ifndef PX_PF
#define PX_PF 1024
#endif
/* blocks per prefetch step: about one 64-byte line of each stream per step */
#define PX_PFS(BB) ((BB) >= 64 ? 1 : 64 / (BB))

static inline pxs pxs0(void) { return (pxs){_mm256_setzero_ps(), _mm_setzero_ps()}; }

/* The four-row step: the one-row body on each row, in row order (Q5_0
 * has its own pxd below). */
#define BX4(T)                                                                                  \
    static inline __attribute__((always_inline)) void bx4_##T(const uint8_t *b, size_t rs, const float *xb, \
                                                              const float *ab, pxs *s0, pxs *s1, pxs *s2, pxs *s3) { \
        bx_##T(b, xb, ab, s0);                                                                  \
        bx_##T(b + rs, xb, ab, s1);                                                             \
        bx_##T(b + 2 * rs, xb, ab, s2);                                                         \
        bx_##T(b + 3 * rs, xb, ab, s3);                                                         \
    }
BX4(q4_0)
BX4(q4_1)
BX4(q5_1)
BX4(q8_0)
BX4(q5_k)
/* Q4_K and Q6_K four-row steps that issue the latency-long setup of all four
 * rows before the products (256 rows of 1536 from L2, best of 5000: Q4_K
 * 0.074 -> 0.069 ns per weight, Q6_K 0.102 -> 0.084). */
/* Q4_K four rows: the scales and mins of the four rows (and the mins'
 * terms) first, then each row's chunks: bx_q4_k's operations per row, in
 * its order (the same bits), without the chunks waiting on the scales'
 * unpacking. */
static inline __attribute__((always_inline)) void bx4_q4_k(const uint8_t *b, size_t rs, const float *xb, const float *ab,
                                                           pxs *s0, pxs *s1, pxs *s2, pxs *s3) {
    pxs *ss[4] = {s0, s1, s2, s3};
    _Alignas(32) float sm[4][16];
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) k4_scales(b + k * rs, sm[k]);
    __asm__("" : "+m"(sm));
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) ss[k]->a = _mm256_fnmadd_ps(_mm256_load_ps(sm[k] + 8), _mm256_loadu_ps(ab), ss[k]->a);
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        const uint8_t *qs = b + k * rs + offsetof(df_blk_q4_k, qs);
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            __m256i q0 = u8x8(qs + 32 * c), q1 = u8x8(qs + 32 * c + 8), q2 = u8x8(qs + 32 * c + 16),
                    q3 = u8x8(qs + 32 * c + 24);
            __m256 tl = dot32(and15(q0), and15(q1), and15(q2), and15(q3), xb + 64 * c);
            __m256 th = dot32(hi4(q0), hi4(q1), hi4(q2), hi4(q3), xb + 64 * c + 32);
            ss[k]->a = _mm256_fmadd_ps(_mm256_broadcast_ss(sm[k] + 2 * c), tl, ss[k]->a);
            ss[k]->a = _mm256_fmadd_ps(_mm256_broadcast_ss(sm[k] + 2 * c + 1), th, ss[k]->a);
        }
    }
}
/* Q6_K four rows: the scales, the -32 terms and the codes of all four rows
 * first (codes stored, 1 KB), then the products: bx_q6_k's operations per
 * row, in its order (the same bits). */
static inline __attribute__((always_inline)) void bx4_q6_k(const uint8_t *b, size_t rs, const float *xb, const float *ab,
                                                           pxs *s0, pxs *s1, pxs *s2, pxs *s3) {
    pxs *ss[4] = {s0, s1, s2, s3};
    _Alignas(32) float dl[4][16];
    _Alignas(32) uint8_t cb[4][2][4][32];
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        const uint8_t *bk = b + k * rs;
        __m256 d = _mm256_set1_ps(h2f(bk + offsetof(df_blk_q6_k, d)));
        const uint8_t *sc = bk + offsetof(df_blk_q6_k, scales);
        __m256 d0 = _mm256_mul_ps(d, cvt(i8x8(sc))), d1 = _mm256_mul_ps(d, cvt(i8x8(sc + 8)));
        _mm256_store_ps(dl[k], d0);
        _mm256_store_ps(dl[k] + 8, d1);
        ss[k]->a = _mm256_fnmadd_ps(d0, _mm256_loadu_ps(ab), ss[k]->a);
        ss[k]->a = _mm256_fnmadd_ps(d1, _mm256_loadu_ps(ab + 8), ss[k]->a);
        const uint8_t *ql = bk, *qhp = bk + offsetof(df_blk_q6_k, qh);
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m256i la = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            __m256i lb = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(qhp + 32 * h));
            _mm256_store_si256((__m256i *)cb[k][h][0], _mm256_or_si256(_mm256_and_si256(la, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)));
            _mm256_store_si256((__m256i *)cb[k][h][1], _mm256_or_si256(_mm256_and_si256(lb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)));
            _mm256_store_si256((__m256i *)cb[k][h][2], _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), m4), _mm256_and_si256(qh, m30)));
            _mm256_store_si256((__m256i *)cb[k][h][3], _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)));
        }
    }
    __asm__("" : "+m"(cb), "+m"(dl));
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
            _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {
                const float *xk = xb + 128 * h + 32 * g + 16 * e;
                const uint8_t *c = cb[k][h][g] + 16 * e;
                __m256 t = _mm256_fmadd_ps(cvt(u8x8(c + 8)), ldx(xk + 8), _mm256_mul_ps(cvt(u8x8(c)), ldx(xk)));
                ss[k]->a = _mm256_fmadd_ps(_mm256_broadcast_ss(dl[k] + 8 * h + 2 * g + e), t, ss[k]->a);
            }
        }
    }
}
/* Blocks of BE weights in BB bytes, AS floats of aux per block; LANE: the
 * lane of the offset accumulator that holds the offset sum (-1: none). */
#define GEN_PX_FIN(T, LANE)                                                                     \
    static inline float fin_##T(pxs s) {                                                        \
        float r = hsum(s.a);                                                                    \
        if ((LANE) >= 0) {                                                                      \
            _Alignas(16) float m[4];                                                            \
            _mm_store_ps(m, s.m);                                                               \
            r += m[(LANE) < 0 ? 0 : (LANE)];                                                    \
        }                                                                                       \
        return r;                                                                               \
    }
#define GEN_PX(T, BE, BB, AS, LANE, PREP)                                                       \
    GEN_PX_FIN(T, LANE)                                                                         \
    static void pxd_##T(const uint8_t *row, size_t rs, int64_t nr, const float *x, const float *aux, \
                        int64_t n, float *out) {                                                \
        const int64_t nb = n / (BE);                                                            \
        int64_t r = 0;                                                                          \
        for (; r + 4 <= nr; r += 4) {                                                           \
            const uint8_t *p = row + (size_t)r * rs;                                            \
            pxs s0 = pxs0(), s1 = pxs0(), s2 = pxs0(), s3 = pxs0();                             \
            int pf_ = 0;                                                                        \
            for (int64_t i = 0; i < nb; i++) {                                                  \
                const float *xb = x + i * (BE), *ab = aux + i * (AS);                           \
                const uint8_t *b = p + i * (BB);                                                \
                if (--pf_ <= 0) {                                                               \
                    pf_ = PX_PFS(BB);                                                           \
                    _Pragma("GCC unroll 4") for (int o_ = 0; o_ < (BB); o_ += 64)               \
                        _Pragma("GCC unroll 4") for (int k_ = 0; k_ < 4; k_++)                  \
                            _mm_prefetch((const char *)b + (k_ + 4) * rs + o_, _MM_HINT_T0);    \
                }                                                                               \
                bx4_##T(b, rs, xb, ab, &s0, &s1, &s2, &s3);                                     \
            }                                                                                   \
            out[r] = fin_##T(s0), out[r + 1] = fin_##T(s1);                                     \
            out[r + 2] = fin_##T(s2), out[r + 3] = fin_##T(s3);                                 \
        }                                                                                       \
        for (; r < nr; r++) {                                                                   \
            const uint8_t *p = row + (size_t)r * rs;                                            \
            pxs s0 = pxs0();                                                                    \
            int pf_ = 0;                                                                        \
            for (int64_t i = 0; i < nb; i++) {                                                  \
                if (--pf_ <= 0) {                                                               \
                    pf_ = PX_PFS(BB);                                                           \
                    _Pragma("GCC unroll 4") for (int o_ = 0; o_ < (BB); o_ += 64)               \
                        _mm_prefetch((const char *)p + i * (BB) + PX_PF + o_, _MM_HINT_T0);     \
                }                                                                               \
                bx_##T(p + i * (BB), x + i * (BE), aux + i * (AS), &s0);                        \
            }                                                                                   \
            out[r] = fin_##T(s0);                                                               \
        }                                                                                       \
    }                                                                                           \
    static const df_ggml_kernels KP_##T = {dq_##T, dot_##T, dotm_##T, NULL, PREP, pxd_##T};

GEN_PX(q4_0, 32, 18, 4, 0, prep_q4_0)
GEN_PX(q4_1, 32, 20, 4, 1, prep_q4_1)
GEN_PX_FIN(q5_0, -1)
/* Q5_0 four-row loop, Q5B blocks per step: the codes of all 4 x Q5B
 * row-blocks are built and stored first (and the four rows' f16 scales of a
 * block converted by one vcvtph2ps, from a general register: the floats
 * ph1x8 gives), then their products run, so that a product does not wait
 * for its own codes' shuffles and store-to-load forwarding: the kernel was
 * latency-bound (~10 cycles per row-block for ~26 instructions). 256 rows
 * of 1536 from L2, best of 5000: 42.3 us before, 37.6 with one block a
 * step, 31.6 with two, 30.0 with four (docs/PERFORMANCE.md, "Issue 17:
 * Q4_K_M decode, round 4"). Per row, blocks in order,
 * the arithmetic of bx_q5_0: the same bits as the one-row loop. */
#ifndef Q5B
#define Q5B 4
#endif
static inline __attribute__((always_inline)) void q5_0_step(const uint8_t *b, size_t rs, const float *xb, pxs *s, const int nbk) {
    _Alignas(32) uint8_t c[Q5B][4][32];
    _Alignas(16) float d[Q5B][4];
    _Pragma("GCC unroll 4") for (int j = 0; j < nbk; j++) {
        const uint8_t *bj = b + 22 * j;
        uint16_t h0, h1, h2, h3;
        memcpy(&h0, bj, 2), memcpy(&h1, bj + rs, 2), memcpy(&h2, bj + 2 * rs, 2), memcpy(&h3, bj + 3 * rs, 2);
        const uint64_t hh = (uint64_t)h0 | (uint64_t)h1 << 16 | (uint64_t)h2 << 32 | (uint64_t)h3 << 48;
        _mm_store_ps(d[j], _mm_cvtph_ps(_mm_cvtsi64_si128((long long)hh)));
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) q5_bytes(bj + k * rs + 2, bj + k * rs + 6, 1, c[j][k]);
    }
    __asm__("" : "+m"(d), "+m"(c));
    _Pragma("GCC unroll 4") for (int j = 0; j < nbk; j++) _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        const float *xj = xb + 32 * j;
        __m256 t = dot32(i8x8(c[j][k]), i8x8(c[j][k] + 8), i8x8(c[j][k] + 16), i8x8(c[j][k] + 24), xj);
        s[k].a = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[j][k]), t, s[k].a);
    }
}
static void pxd_q5_0(const uint8_t *row, size_t rs, int64_t nr, const float *x, const float *aux, int64_t n, float *out) {
    (void)aux;
    const int64_t nb = n / 32;
    int64_t r = 0;
    for (; r + 4 <= nr; r += 4) {
        const uint8_t *p = row + (size_t)r * rs;
        pxs s[4] = {pxs0(), pxs0(), pxs0(), pxs0()};
        int64_t i = 0;
        for (; i + Q5B <= nb; i += Q5B) {
            const uint8_t *b = p + i * 22;
            /* the same lines of the next four rows as the generic loop: one per stream per 64 bytes */
            _Pragma("GCC unroll 4") for (int o_ = 0; o_ < 22 * Q5B; o_ += 64)
                _Pragma("GCC unroll 4") for (int k_ = 0; k_ < 4; k_++)
                    _mm_prefetch((const char *)b + (k_ + 4) * rs + o_, _MM_HINT_T0);
            q5_0_step(b, rs, x + i * 32, s, Q5B);
        }
        for (; i < nb; i++) q5_0_step(p + i * 22, rs, x + i * 32, s, 1);
        out[r] = fin_q5_0(s[0]), out[r + 1] = fin_q5_0(s[1]);
        out[r + 2] = fin_q5_0(s[2]), out[r + 3] = fin_q5_0(s[3]);
    }
    for (; r < nr; r++) {
        const uint8_t *p = row + (size_t)r * rs;
        pxs s0 = pxs0();
        int pf_ = 0;
        for (int64_t i = 0; i < nb; i++) {
            if (--pf_ <= 0) {
                pf_ = PX_PFS(22);
                _mm_prefetch((const char *)p + i * 22 + PX_PF, _MM_HINT_T0);
            }
            bx_q5_0(p + i * 22, x + i * 32, NULL, &s0);
        }
        out[r] = fin_q5_0(s0);
    }
}
static const df_ggml_kernels KP_q5_0 = {dq_q5_0, dot_q5_0, dotm_q5_0, NULL, prep_none, pxd_q5_0};
GEN_PX(q5_1, 32, 24, 4, 1, prep_q4_1)
GEN_PX(q8_0, 32, 34, 0, -1, prep_none)
GEN_PX(q4_k, 256, 144, 8, -1, prep_s32)
GEN_PX(q5_k, 256, 176, 8, -1, prep_s32)
GEN_PX(q6_k, 256, 210, 16, -1, prep_s16)

/* ---- per-element types (any n) ------------------------------------------ */

static inline __m256 ld_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }
static inline __m256 ld_f16(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256 ld_bf16(const uint8_t *p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
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
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld_##T(src + i * (ES)));           \
        for (; i < n; i++) dst[i] = one_##T(src + i * (ES));                                    \
    }                                                                                           \
    static float dot_##T(const uint8_t *row, const float *x, int64_t n) {                       \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                             \
        int64_t i = 0;                                                                          \
        for (; i + 32 <= n; i += 32) {                                                          \
            a0 = _mm256_fmadd_ps(ld_##T(row + i * (ES)), _mm256_loadu_ps(x + i), a0);           \
            a1 = _mm256_fmadd_ps(ld_##T(row + (i + 8) * (ES)), _mm256_loadu_ps(x + i + 8), a1); \
            a2 = _mm256_fmadd_ps(ld_##T(row + (i + 16) * (ES)), _mm256_loadu_ps(x + i + 16), a2); \
            a3 = _mm256_fmadd_ps(ld_##T(row + (i + 24) * (ES)), _mm256_loadu_ps(x + i + 24), a3); \
        }                                                                                       \
        for (; i + 8 <= n; i += 8)                                                              \
            a0 = _mm256_fmadd_ps(ld_##T(row + i * (ES)), _mm256_loadu_ps(x + i), a0);           \
        float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));            \
        for (; i < n; i++) s += one_##T(row + i * (ES)) * x[i];                                 \
        return s;                                                                               \
    }                                                                                           \
    static void dotm_##T(const uint8_t *row, const float *x, int64_t n, int m, int64_t xs,       \
                         float *out, int64_t os) {                                              \
        for (int j0 = 0; j0 < m; j0 += MB) {                                                    \
            int mj = m - j0 < MB ? m - j0 : MB;                                                 \
            __m256 acc[MB];                                                                     \
            float tail[MB] = {0};                                                               \
            for (int j = 0; j < MB; j++) acc[j] = _mm256_setzero_ps();                          \
            int64_t i = 0;                                                                      \
            for (; i + 8 <= n; i += 8) {                                                        \
                __m256 w = ld_##T(row + i * (ES));                                              \
                for (int j = 0; j < mj; j++)                                                    \
                    acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + (int64_t)(j0 + j) * xs + i), acc[j]); \
            }                                                                                   \
            for (; i < n; i++) {                                                                \
                float w = one_##T(row + i * (ES));                                              \
                for (int j = 0; j < mj; j++) tail[j] += w * x[(int64_t)(j0 + j) * xs + i];      \
            }                                                                                   \
            for (int j = 0; j < mj; j++) out[(int64_t)(j0 + j) * os] = hsum(acc[j]) + tail[j];  \
        }                                                                                       \
    }                                                                                           \
    static const df_ggml_kernels K_##T = {dq_##T, dot_##T, dotm_##T, NULL, NULL, NULL};

GEN_ELEM(f32, 4)
GEN_ELEM(f16, 2)
GEN_ELEM(bf16, 2)

const df_ggml_kernels *df_ggml_kernels_avx2(int type) {
    switch (type) {
    case DF_GGML_F32: return &K_f32;
    case DF_GGML_F16: return &K_f16;
    case DF_GGML_BF16: return &K_bf16;
    case DF_GGML_Q4_0: return &KP_q4_0;
    case DF_GGML_Q4_1: return &KP_q4_1;
    case DF_GGML_Q5_0: return &KP_q5_0;
    case DF_GGML_Q5_1: return &KP_q5_1;
    case DF_GGML_Q8_0: return &KP_q8_0;
    case DF_GGML_Q2_K: return &K_q2_k;
    case DF_GGML_Q3_K: return &K_q3_k;
    case DF_GGML_Q4_K: return &KP_q4_k;
    case DF_GGML_Q5_K: return &KP_q5_k;
    case DF_GGML_Q6_K: return &KP_q6_k;
    case DF_GGML_MXFP4: return &K_mxfp4;
    default: return NULL;
    }
}

/* ---- GEMM panels (df_ggml_pack16, cpu.c mm_rows) ------------------------
 * 16 rows dequantized straight into the prefill GEMM's k-major panel,
 * P[k*16 + i] = weight k of row i, instead of dq_T per row and then an 8x8
 * float transpose: the rows' code bytes are transposed 16x16 (row i to byte
 * i of a vector), so that per k one conversion of 16 codes and one multiply
 * (or FMA) by the 16 rows' scale vectors gives the panel's 16 floats.
 * Values: dq_T's bit for bit. Where dq_T adds an offset after its multiply
 * (Q4_1: d*q + m; Q4_K: dl*q - ml) the product is exact in f32 (an f16 or
 * f16 x 6-bit scale times a 4-bit code), so the FMA here rounds the same
 * exact sum once, as dq_T's add does; the other types multiply as dq_T. */

/* a[r] = 16 bytes of row r -> a[l] = byte l of rows 0..15 (per 128-bit lane
 * for the 256-bit version: lane 1 holds bytes 16..31 of each row) */
#define TR16_U8(V, UL8, UH8, UL16, UH16, UL32, UH32, UL64, UH64)                                \
    static inline void tr16x16_##V(V a[16]) {                                                   \
        V s1[16], s2[16], s3[16];                                                               \
        for (int p = 0; p < 8; p++) s1[2 * p] = UL8(a[2 * p], a[2 * p + 1]), s1[2 * p + 1] = UH8(a[2 * p], a[2 * p + 1]); \
        /* s1[2p + h]: rows 2p, 2p+1 in words, columns 8h.. */                                  \
        for (int q = 0; q < 4; q++)                                                             \
            for (int h = 0; h < 2; h++) {                                                       \
                s2[4 * q + 2 * h] = UL16(s1[4 * q + h], s1[4 * q + 2 + h]);                     \
                s2[4 * q + 2 * h + 1] = UH16(s1[4 * q + h], s1[4 * q + 2 + h]);                 \
            }                                                                                   \
        /* s2[4q + j]: rows 4q..4q+3 in dwords, columns 4j.. */                                 \
        for (int o = 0; o < 2; o++)                                                             \
            for (int j = 0; j < 4; j++) {                                                       \
                s3[8 * o + 2 * j] = UL32(s2[8 * o + j], s2[8 * o + 4 + j]);                     \
                s3[8 * o + 2 * j + 1] = UH32(s2[8 * o + j], s2[8 * o + 4 + j]);                 \
            }                                                                                   \
        /* s3[8o + m]: rows 8o..8o+7 in qwords, columns 2m, 2m+1 */                             \
        for (int m = 0; m < 8; m++) a[2 * m] = UL64(s3[m], s3[8 + m]), a[2 * m + 1] = UH64(s3[m], s3[8 + m]); \
    }
TR16_U8(__m128i, _mm_unpacklo_epi8, _mm_unpackhi_epi8, _mm_unpacklo_epi16, _mm_unpackhi_epi16, _mm_unpacklo_epi32,
        _mm_unpackhi_epi32, _mm_unpacklo_epi64, _mm_unpackhi_epi64)
TR16_U8(__m256i, _mm256_unpacklo_epi8, _mm256_unpackhi_epi8, _mm256_unpacklo_epi16, _mm256_unpackhi_epi16,
        _mm256_unpacklo_epi32, _mm256_unpackhi_epi32, _mm256_unpacklo_epi64, _mm256_unpackhi_epi64)

/* 16 rows' 16 bytes at p (row r at p + r*rs), transposed: t[l] = byte l of rows 0..15 */
static inline void cols16(const uint8_t *p, size_t rs, __m128i t[16]) {
    for (int r = 0; r < 16; r++) t[r] = _mm_loadu_si128((const __m128i *)(p + r * rs));
    tr16x16___m128i(t);
}
/* the same for 32 bytes: t[l] = byte l, t[16 + l] = byte 16 + l */
static inline void cols32(const uint8_t *p, size_t rs, __m128i t[32]) {
    __m256i a[16];
    for (int r = 0; r < 16; r++) a[r] = _mm256_loadu_si256((const __m256i *)(p + r * rs));
    tr16x16___m256i(a);
    for (int l = 0; l < 16; l++) t[l] = _mm256_castsi256_si128(a[l]), t[16 + l] = _mm256_extracti128_si256(a[l], 1);
}
/* h[c] = byte c (< 4) of the 4 bytes at p of rows 0..15 */
static inline void cols4(const uint8_t *p, size_t rs, __m128i h[4]) {
    const __m128i g = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m128i x[4];
    for (int j = 0; j < 4; j++) {
        int v[4];
        for (int r = 0; r < 4; r++) memcpy(&v[r], p + (size_t)(4 * j + r) * rs, 4);
        x[j] = _mm_shuffle_epi8(_mm_setr_epi32(v[0], v[1], v[2], v[3]), g); /* dword c: byte c of rows 4j.. */
    }
    __m128i a = _mm_unpacklo_epi32(x[0], x[1]), b = _mm_unpacklo_epi32(x[2], x[3]);
    __m128i c = _mm_unpackhi_epi32(x[0], x[1]), d = _mm_unpackhi_epi32(x[2], x[3]);
    h[0] = _mm_unpacklo_epi64(a, b), h[1] = _mm_unpackhi_epi64(a, b);
    h[2] = _mm_unpacklo_epi64(c, d), h[3] = _mm_unpackhi_epi64(c, d);
}
/* the f16 at byte offset o (0 or 2) of the 4 bytes cols4 read, as f32: rows 0..7, 8..15 */
static inline void f16cols(const __m128i h[4], int o, __m256 *v0, __m256 *v1) {
    *v0 = _mm256_cvtph_ps(_mm_unpacklo_epi8(h[o], h[o + 1]));
    *v1 = _mm256_cvtph_ps(_mm_unpackhi_epi8(h[o], h[o + 1]));
}
static inline __m256 u8f(__m128i q) { return cvt(_mm256_cvtepu8_epi32(q)); }
static inline __m256 i8f(__m128i q) { return cvt(_mm256_cvtepi8_epi32(q)); }
static inline __m128i hi8(__m128i q) { return _mm_unpackhi_epi64(q, q); }
/* panel row k: 16 unsigned codes q -> d*q + m (m may be zero: then the FMA is d*q exactly) */
static inline void put_u(float *P, __m128i q, __m256 d0, __m256 d1, __m256 m0, __m256 m1) {
    _mm256_storeu_ps(P, _mm256_fmadd_ps(d0, u8f(q), m0));
    _mm256_storeu_ps(P + 8, _mm256_fmadd_ps(d1, u8f(hi8(q)), m1));
}
/* 16 signed codes q -> d*q */
static inline void put_s(float *P, __m128i q, __m256 d0, __m256 d1) {
    _mm256_storeu_ps(P, _mm256_mul_ps(d0, i8f(q)));
    _mm256_storeu_ps(P + 8, _mm256_mul_ps(d1, i8f(hi8(q))));
}
/* rows' 16 f32 values v[i][0..15] (row i at v + 16 i) -> c[j][0..1]: value j of rows 0-7, 8-15 */
static inline void cols_f32(const float *v, __m256 c[16][2]) {
    for (int h = 0; h < 2; h++)
        for (int j0 = 0; j0 < 16; j0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(v + (8 * h + i) * 16 + j0);
            df_tr8x8_avx2(r);
            for (int j = 0; j < 8; j++) c[j0 + j][h] = r[j];
        }
}

static void pk_q4_0(const uint8_t *row, size_t rs, int64_t n, float *P) {
    const __m128i m4 = _mm_set1_epi8(15), o8 = _mm_set1_epi8(8);
    for (int64_t i = 0; i < n / 32; i++, P += 32 * 16) {
        const uint8_t *b = row + i * 18;
        __m128i h[4], t[16];
        __m256 d0, d1;
        cols4(b, rs, h), f16cols(h, 0, &d0, &d1);
        cols16(b + offsetof(df_blk_q4_0, qs), rs, t);
        for (int l = 0; l < 16; l++) {
            put_s(P + l * 16, _mm_sub_epi8(_mm_and_si128(t[l], m4), o8), d0, d1);
            put_s(P + (l + 16) * 16, _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(t[l], 4), m4), o8), d0, d1);
        }
    }
}

static void pk_q4_1(const uint8_t *row, size_t rs, int64_t n, float *P) {
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t i = 0; i < n / 32; i++, P += 32 * 16) {
        const uint8_t *b = row + i * 20;
        __m128i h[4], t[16];
        __m256 d0, d1, m0, m1;
        cols4(b, rs, h), f16cols(h, 0, &d0, &d1), f16cols(h, 2, &m0, &m1);
        cols16(b + offsetof(df_blk_q4_1, qs), rs, t);
        for (int l = 0; l < 16; l++) {
            put_u(P + l * 16, _mm_and_si128(t[l], m4), d0, d1, m0, m1);
            put_u(P + (l + 16) * 16, _mm_and_si128(_mm_srli_epi16(t[l], 4), m4), d0, d1, m0, m1);
        }
    }
}

/* bit j (< 8) of each byte of h, moved to bit 4 (0 or 16) */
static inline __m128i bit_to4(__m128i h, int j) {
    const __m128i b4 = _mm_set1_epi8(16);
    switch (j) { /* epi16 shifts: the bits that cross into the other byte are masked off */
    case 0: return _mm_and_si128(_mm_slli_epi16(h, 4), b4);
    case 1: return _mm_and_si128(_mm_slli_epi16(h, 3), b4);
    case 2: return _mm_and_si128(_mm_slli_epi16(h, 2), b4);
    case 3: return _mm_and_si128(_mm_slli_epi16(h, 1), b4);
    case 4: return _mm_and_si128(h, b4);
    case 5: return _mm_and_si128(_mm_srli_epi16(h, 1), b4);
    case 6: return _mm_and_si128(_mm_srli_epi16(h, 2), b4);
    default: return _mm_and_si128(_mm_srli_epi16(h, 3), b4);
    }
}

static void pk_q5_0(const uint8_t *row, size_t rs, int64_t n, float *P) {
    const __m128i m4 = _mm_set1_epi8(15), o16 = _mm_set1_epi8(16);
    for (int64_t i = 0; i < n / 32; i++, P += 32 * 16) {
        const uint8_t *b = row + i * 22;
        __m128i h[4], qh[4], t[16];
        __m256 d0, d1;
        cols4(b, rs, h), f16cols(h, 0, &d0, &d1);
        cols4(b + offsetof(df_blk_q5_0, qh), rs, qh); /* qh[c]: bits of elements 8c..8c+7 */
        cols16(b + offsetof(df_blk_q5_0, qs), rs, t);
        for (int l = 0; l < 16; l++) {
            __m128i lo = _mm_or_si128(_mm_and_si128(t[l], m4), bit_to4(qh[l / 8], l % 8));
            __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(t[l], 4), m4), bit_to4(qh[2 + l / 8], l % 8));
            put_s(P + l * 16, _mm_sub_epi8(lo, o16), d0, d1);
            put_s(P + (l + 16) * 16, _mm_sub_epi8(hi, o16), d0, d1);
        }
    }
}

static void pk_q5_1(const uint8_t *row, size_t rs, int64_t n, float *P) {
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t i = 0; i < n / 32; i++, P += 32 * 16) {
        const uint8_t *b = row + i * 24;
        __m128i h[4], qh[4], t[16];
        __m256 d0, d1, m0, m1;
        cols4(b, rs, h), f16cols(h, 0, &d0, &d1), f16cols(h, 2, &m0, &m1);
        cols4(b + offsetof(df_blk_q5_1, qh), rs, qh);
        cols16(b + offsetof(df_blk_q5_1, qs), rs, t);
        for (int l = 0; l < 16; l++) {
            __m128i lo = _mm_or_si128(_mm_and_si128(t[l], m4), bit_to4(qh[l / 8], l % 8));
            __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(t[l], 4), m4), bit_to4(qh[2 + l / 8], l % 8));
            put_u(P + l * 16, lo, d0, d1, m0, m1); /* d*q exact (16 bits): the FMA rounds d*q + m once */
            put_u(P + (l + 16) * 16, hi, d0, d1, m0, m1);
        }
    }
}

static void pk_q8_0(const uint8_t *row, size_t rs, int64_t n, float *P) {
    for (int64_t i = 0; i < n / 32; i++, P += 32 * 16) {
        const uint8_t *b = row + i * 34;
        __m128i h[4], t[32];
        __m256 d0, d1;
        cols4(b, rs, h), f16cols(h, 0, &d0, &d1);
        cols32(b + offsetof(df_blk_q8_0, qs), rs, t);
        for (int l = 0; l < 32; l++) put_s(P + l * 16, t[l], d0, d1);
    }
}

static void pk_q4_k(const uint8_t *row, size_t rs, int64_t n, float *P) {
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t i = 0; i < n / 256; i++, P += 256 * 16) {
        const uint8_t *b = row + i * 144;
        _Alignas(32) float sm[16 * 16];
        for (int r = 0; r < 16; r++) k4_scales(b + r * rs, sm + 16 * r); /* dq's f32 products d*sc, dmin*m */
        __m256 s[16][2];
        cols_f32(sm, s); /* s[sb]: d*sc_sb, s[8 + sb]: dmin*m_sb */
        for (int c = 0; c < 4; c++) {
            __m128i t[32];
            cols32(b + offsetof(df_blk_q4_k, qs) + 32 * c, rs, t);
            const int sb = 2 * c;
            const __m256 sg = _mm256_set1_ps(-0.0f); /* -ml by the sign bit: -(+0) is -0 */
            const __m256 nm0 = _mm256_xor_ps(s[8 + sb][0], sg), nm1 = _mm256_xor_ps(s[8 + sb][1], sg);
            const __m256 nn0 = _mm256_xor_ps(s[9 + sb][0], sg), nn1 = _mm256_xor_ps(s[9 + sb][1], sg);
            for (int l = 0; l < 32; l++) {
                /* dl*q - ml: dl*q exact (f16 x 6 bits x 4 bits), so fma(dl, q, -ml) rounds as the subtraction */
                put_u(P + (64 * c + l) * 16, _mm_and_si128(t[l], m4), s[sb][0], s[sb][1], nm0, nm1);
                put_u(P + (64 * c + 32 + l) * 16, _mm_and_si128(_mm_srli_epi16(t[l], 4), m4), s[sb + 1][0], s[sb + 1][1], nn0, nn1);
            }
        }
    }
}

/* bits 2j, 2j+1 (j < 4) of each byte of h, moved to bits 4, 5 */
static inline __m128i bits2_to4(__m128i h, int j) {
    const __m128i b45 = _mm_set1_epi8(0x30);
    switch (j) {
    case 0: return _mm_and_si128(_mm_slli_epi16(h, 4), b45);
    case 1: return _mm_and_si128(_mm_slli_epi16(h, 2), b45);
    case 2: return _mm_and_si128(h, b45);
    default: return _mm_and_si128(_mm_srli_epi16(h, 2), b45);
    }
}

static void pk_q6_k(const uint8_t *row, size_t rs, int64_t n, float *P) {
    const __m128i m4 = _mm_set1_epi8(15), o32 = _mm_set1_epi8(32);
    for (int64_t i = 0; i < n / 256; i++, P += 256 * 16) {
        const uint8_t *b = row + i * 210;
        _Alignas(32) float sc[16 * 16];
        for (int r = 0; r < 16; r++) { /* dq's f32 products d*sc_k */
            const uint8_t *br = b + r * rs;
            const __m256 d = _mm256_set1_ps(h2f(br + offsetof(df_blk_q6_k, d)));
            for (int h = 0; h < 2; h++)
                _mm256_store_ps(sc + 16 * r + 8 * h, _mm256_mul_ps(d, cvt(i8x8(br + offsetof(df_blk_q6_k, scales) + 8 * h))));
        }
        __m256 s[16][2];
        cols_f32(sc, s);
        for (int h = 0; h < 2; h++) {
            __m128i ql[64], qh[32];
            cols32(b + 64 * h, rs, ql), cols32(b + 64 * h + 32, rs, ql + 32);
            cols32(b + offsetof(df_blk_q6_k, qh) + 32 * h, rs, qh);
            for (int r = 0; r < 128; r++) {
                const __m128i lo = r < 64 ? _mm_and_si128(ql[r], m4) : _mm_and_si128(_mm_srli_epi16(ql[r - 64], 4), m4);
                const __m128i q = _mm_sub_epi8(_mm_or_si128(lo, bits2_to4(qh[r % 32], r / 32)), o32);
                const int e = 128 * h + r;
                put_s(P + e * 16, q, s[e / 16][0], s[e / 16][1]);
            }
        }
    }
}

df_ggml_pack16_fn df_ggml_pack16_avx2(int type) {
    switch (type) {
    case DF_GGML_Q4_0: return pk_q4_0;
    case DF_GGML_Q4_1: return pk_q4_1;
    case DF_GGML_Q5_0: return pk_q5_0;
    case DF_GGML_Q5_1: return pk_q5_1;
    case DF_GGML_Q8_0: return pk_q8_0;
    case DF_GGML_Q4_K: return pk_q4_k;
    case DF_GGML_Q6_K: return pk_q6_k;
    default: return NULL;
    }
}

/* ---- prepared x, several tokens (a verify pass: ggml_quant_impl.h) ------
 * px_dot of the same rows for NT prepared activations, each weight block
 * decoded once into registers (the code vectors as floats, the block's
 * scales) and then run against every token with the operations of that
 * type's bx_* above, in the same order per token: dot32's two chains, the
 * block scale's FMA into the token's accumulator, the offset/min terms from
 * the token's aux, and fin_* at the end of the row. So each token's result
 * is the bits px_dot gives (tests/unit/test_backend_exact.c checks it for
 * every row, token count and row count). One row at a time (px_dot's
 * remainder rows run the same operations as its four-row groups), tokens
 * in groups of up to 3 (4 = 2 + 2) whose accumulators stay in registers
 * beside the block's codes (up to 8 per decode spilled them and gave back
 * most of the gain: a 5-token Q4_1 pass 0.95 of 5 one-token products in
 * instructions, 0.75 with groups of 3); NT is a compile-time constant in
 * each instance. Q4_1 and Q8_0 use pxw_* below instead (6 and 8 tokens per
 * decode); pxm_q4_1 stays for rows longer than pxw_m holds. */

/* dot32 on code vectors already converted to floats: the same two chains */
static inline __m256 dot32f(__m256 c0, __m256 c1, __m256 c2, __m256 c3, const float *xb) {
    __m256 t0 = _mm256_mul_ps(c0, ldx(xb));
    __m256 t1 = _mm256_mul_ps(c1, ldx(xb + 8));
    t0 = _mm256_fmadd_ps(c2, ldx(xb + 16), t0);
    t1 = _mm256_fmadd_ps(c3, ldx(xb + 24), t1);
    return _mm256_add_ps(t0, t1);
}

#define PXM_ROWS(T, BB, ...)                                                                      \
    static inline __attribute__((always_inline)) void pxmk_##T(const uint8_t *row, size_t rs, int64_t nr, const int NT, \
                                                               const float *const *x, const float *const *aux, int64_t n, \
                                                               float *out, int64_t os) {          \
        for (int64_t r = 0; r < nr; r++) {                                                        \
            const uint8_t *p = row + (size_t)r * rs;                                              \
            pxs s[3];                                                                             \
            _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) s[t] = pxs0();                   \
            __VA_ARGS__                                                                           \
            _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) out[(int64_t)t * os + r] = fin_##T(s[t]); \
        }                                                                                         \
    }                                                                                             \
    static void pxm_##T(const uint8_t *row, size_t rs, int64_t nr, int nt, const float *const *x,  \
                        const float *const *aux, int64_t n, float *out, int64_t os) {             \
        for (int t0 = 0; t0 < nt;) {                                                              \
            const int left = nt - t0, g = left == 4 ? 2 : left < 3 ? left : 3;                    \
            if (g == 3) pxmk_##T(row, rs, nr, 3, x + t0, aux + t0, n, out + (int64_t)t0 * os, os); \
            else if (g == 2) pxmk_##T(row, rs, nr, 2, x + t0, aux + t0, n, out + (int64_t)t0 * os, os); \
            else pxmk_##T(row, rs, nr, 1, x + t0, aux + t0, n, out + (int64_t)t0 * os, os);        \
            t0 += g;                                                                              \
        }                                                                                         \
    }

/* bx_q4_1 */
PXM_ROWS(q4_1, 20, {
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = p + i * 20;
        _mm_prefetch((const char *)b + PX_PF, _MM_HINT_T0);
        const __m128 dm = ph2(b);
        const __m256 db = _mm256_broadcastss_ps(dm);
        const __m256i q0 = u8x8(b + 4), q1 = u8x8(b + 12);
        const __m256 c0 = cvt(and15(q0)), c1 = cvt(and15(q1)), c2 = cvt(hi4(q0)), c3 = cvt(hi4(q1));
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) {
            const __m256 d = dot32f(c0, c1, c2, c3, x[t] + i * 32);
            s[t].a = _mm256_fmadd_ps(db, d, s[t].a);
            s[t].m = _mm_fmadd_ps(dm, _mm_loadu_ps(aux[t] + i * 4), s[t].m);
        }
    }
})

/* Wider groups for Q4_1 and Q8_0 (issue 15 step 5): one row at a time, up
 * to 6 (Q4_1) or 8 (Q8_0) tokens per decoded block. A token's work per
 * block is dot32's two chains and the scale's FMA into its 8-lane
 * accumulator, the operations of bx_*; what made more than 3 tokens spill
 * for Q4_1 was each token's 4-lane offset accumulator (s.m, of which fin
 * reads only lane 1: m * S32, an FMA per block). Here that lane of every
 * token sits in one vector, lane t for token t: per block one FMA of m
 * (broadcast) with the tokens' S32 (aux lane 1, gathered per call into
 * pxw_m, block-major), the same single-rounding fma(m, S32, acc) per token
 * in the same block order; fin's hsum(s.a) + that lane follows. Registers:
 * 4 code vectors, the scale, NT accumulators, the offset vector and two
 * chain temporaries: 15 for Q4_1 with 6 tokens and for Q8_0 with 8. */
#define PXW_NB 1024 /* blocks of a row (n <= 32768) that pxw_m holds; longer rows: pxm_q4_1 */
#define PXW_GMAX ((DF_GGML_PXM + 5) / 6) /* groups of at most 6 tokens a call */
static _Thread_local _Alignas(32) float pxw_m[PXW_GMAX][PXW_NB * 8];

/* Rows a chunk when a call's tokens take more than one group (a verify pass of 7-16 positions): every group runs
 * over one chunk of rows before the next chunk, so the later groups read the chunk's rows from L1/L2 (64 rows of
 * n = 1536 Q4_1: 60 KB) instead of the whole slice of rows again, from memory where the slice is larger than the
 * last-level cache (kernel_bench --px 3 65536 4096 8, 168 MB: 112-134 -> 96-105 ms; SmolLM2's matrices, at most
 * 553 KB, stay in the caches either way: docs/PERFORMANCE.md, speculative decoding step 8). Each token's
 * arithmetic is unchanged. */
#define PXW_CH 64

/* Rows in tiles of PXW_RT and, where the tokens' x would not stay in L1
 * (NT * n floats over PXW_XB bytes, of a 32 KB L1: the FFN's down product
 * of SmolLM2 with 6 tokens is 36 KB), the blocks of a row in segments whose x does: each
 * row's accumulators are stored after a segment and reloaded for the next,
 * so every row still adds its blocks in order, one after the other. */
#define PXW_RT 16
#define PXW_XB 24576
static inline int64_t pxw_seg(int64_t nb, int NT) {
    const int64_t s = PXW_XB / (NT * 128);
    return nb * NT * 128 <= PXW_XB ? nb : s < 4 ? 4 : s;
}

static inline __attribute__((always_inline)) void pxwk_q4_1(const uint8_t *row, size_t rs, int64_t nr, const int NT,
                                                             const float *const *x, int64_t n, float *out, int64_t os,
                                                             const float *am) {
    const int64_t nb = n / 32, seg = pxw_seg(nb, NT);
    for (int64_t r0 = 0; r0 < nr; r0 += PXW_RT) {
        const int64_t rt = nr - r0 < PXW_RT ? nr - r0 : PXW_RT;
        __m256 sa[PXW_RT][6], sm[PXW_RT];
        for (int64_t i0 = 0; i0 < nb; i0 += seg) {
            const int64_t i1 = nb - i0 < seg ? nb : i0 + seg;
            for (int64_t r = 0; r < rt; r++) {
                const uint8_t *p = row + (size_t)(r0 + r) * rs;
                __m256 a[6], m8;
                __m128 m4;
                if (i0 == 0) {
                    _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) a[t] = _mm256_setzero_ps();
                    m8 = _mm256_setzero_ps();
                } else {
                    _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) a[t] = sa[r][t];
                    m8 = sm[r];
                }
                m4 = _mm256_castps256_ps128(m8);
                for (int64_t i = i0; i < i1; i++) {
                    const uint8_t *b = p + i * 20;
                    _mm_prefetch((const char *)b + PX_PF, _MM_HINT_T0);
                    const __m128 dm = ph2(b);
                    if (NT <= 4) m4 = _mm_fmadd_ps(_mm_permute_ps(dm, 0x55), _mm_load_ps(am + 4 * i), m4);
                    else m8 = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)), _mm256_load_ps(am + 8 * i), m8);
                    const __m256 db = _mm256_broadcastss_ps(dm);
                    const __m256i q0 = u8x8(b + 4), q1 = u8x8(b + 12);
                    const __m256 c0 = cvt(and15(q0)), c1 = cvt(and15(q1)), c2 = cvt(hi4(q0)), c3 = cvt(hi4(q1));
                    _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) a[t] = _mm256_fmadd_ps(db, dot32f(c0, c1, c2, c3, x[t] + i * 32), a[t]);
                }
                if (NT <= 4) m8 = _mm256_castps128_ps256(m4);
                if (i1 < nb) {
                    _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) sa[r][t] = a[t];
                    sm[r] = m8;
                    continue;
                }
                _Alignas(32) float m[8];
                _mm256_store_ps(m, m8);
                _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) {
                    float v = hsum(a[t]);
                    v += m[t];
                    out[(int64_t)t * os + r0 + r] = v;
                }
            }
        }
    }
}

static void pxw_q4_1(const uint8_t *row, size_t rs, int64_t nr, int nt, const float *const *x, const float *const *aux,
                     int64_t n, float *out, int64_t os) {
    const int64_t nb = n / 32;
    if (nb > PXW_NB || nt > 6 * PXW_GMAX) { pxm_q4_1(row, rs, nr, nt, x, aux, n, out, os); return; }
    int gt0[PXW_GMAX], gn[PXW_GMAX], ng = 0;
    for (int t0 = 0; t0 < nt; ng++) { /* the groups: as even as 6 a group allows */
        const int left = nt - t0, groups = (left + 5) / 6, g = (left + groups - 1) / groups, st = g <= 4 ? 4 : 8;
        for (int64_t i = 0; i < nb; i++)
            for (int t = 0; t < st; t++) pxw_m[ng][st * i + t] = t < g ? aux[t0 + t][4 * i + 1] : 0.0f;
        gt0[ng] = t0, gn[ng] = g, t0 += g;
    }
    const int64_t ch = ng > 1 ? PXW_CH : nr;
    for (int64_t r0 = 0; r0 < nr; r0 += ch)
        for (int q = 0; q < ng; q++) {
            const uint8_t *rw = row + (size_t)r0 * rs;
            const int64_t rn = nr - r0 < ch ? nr - r0 : ch;
            const float *const *xg = x + gt0[q];
            float *og = out + (int64_t)gt0[q] * os + r0;
            const float *am = pxw_m[q];
            switch (gn[q]) {
            case 1: pxwk_q4_1(rw, rs, rn, 1, xg, n, og, os, am); break;
            case 2: pxwk_q4_1(rw, rs, rn, 2, xg, n, og, os, am); break;
            case 3: pxwk_q4_1(rw, rs, rn, 3, xg, n, og, os, am); break;
            case 4: pxwk_q4_1(rw, rs, rn, 4, xg, n, og, os, am); break;
            case 5: pxwk_q4_1(rw, rs, rn, 5, xg, n, og, os, am); break;
            default: pxwk_q4_1(rw, rs, rn, 6, xg, n, og, os, am); break;
            }
        }
}

static inline __attribute__((always_inline)) void pxwk_q8_0(const uint8_t *row, size_t rs, int64_t nr, const int NT,
                                                             const float *const *x, int64_t n, float *out, int64_t os) {
    const int64_t nb = n / 32, seg = pxw_seg(nb, NT);
    for (int64_t r0 = 0; r0 < nr; r0 += PXW_RT) {
        const int64_t rt = nr - r0 < PXW_RT ? nr - r0 : PXW_RT;
        __m256 sa[PXW_RT][8];
        for (int64_t i0 = 0; i0 < nb; i0 += seg) {
            const int64_t i1 = nb - i0 < seg ? nb : i0 + seg;
            for (int64_t r = 0; r < rt; r++) {
                const uint8_t *p = row + (size_t)(r0 + r) * rs;
                __m256 a[8];
                _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) a[t] = i0 ? sa[r][t] : _mm256_setzero_ps();
                for (int64_t i = i0; i < i1; i++) {
                    const uint8_t *b = p + i * 34;
                    _mm_prefetch((const char *)b + PX_PF, _MM_HINT_T0);
                    const __m256 db = ph1x8(b);
                    const __m256 c0 = cvt(i8x8(b + 2)), c1 = cvt(i8x8(b + 10)), c2 = cvt(i8x8(b + 18)), c3 = cvt(i8x8(b + 26));
                    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) a[t] = _mm256_fmadd_ps(db, dot32f(c0, c1, c2, c3, x[t] + i * 32), a[t]);
                }
                if (i1 < nb) {
                    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) sa[r][t] = a[t];
                    continue;
                }
                _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) out[(int64_t)t * os + r0 + r] = hsum(a[t]);
            }
        }
    }
}

static void pxw_q8_0(const uint8_t *row, size_t rs, int64_t nr, int nt, const float *const *x, const float *const *aux,
                     int64_t n, float *out, int64_t os) {
    (void)aux;
    const int groups = (nt + 7) / 8;
    const int64_t ch = groups > 1 ? PXW_CH : nr; /* as pxw_q4_1: every group over a chunk of rows, then the next chunk */
    for (int64_t r0 = 0; r0 < nr; r0 += ch)
        for (int t0 = 0; t0 < nt;) {
            const int left = nt - t0, gl = (left + 7) / 8, g = (left + gl - 1) / gl;
            const uint8_t *rw = row + (size_t)r0 * rs;
            const int64_t rn = nr - r0 < ch ? nr - r0 : ch;
            const float *const *xg = x + t0;
            float *og = out + (int64_t)t0 * os + r0;
            switch (g) {
            case 1: pxwk_q8_0(rw, rs, rn, 1, xg, n, og, os); break;
            case 2: pxwk_q8_0(rw, rs, rn, 2, xg, n, og, os); break;
            case 3: pxwk_q8_0(rw, rs, rn, 3, xg, n, og, os); break;
            case 4: pxwk_q8_0(rw, rs, rn, 4, xg, n, og, os); break;
            case 5: pxwk_q8_0(rw, rs, rn, 5, xg, n, og, os); break;
            case 6: pxwk_q8_0(rw, rs, rn, 6, xg, n, og, os); break;
            case 7: pxwk_q8_0(rw, rs, rn, 7, xg, n, og, os); break;
            default: pxwk_q8_0(rw, rs, rn, 8, xg, n, og, os); break;
            }
            t0 += g;
        }
}

/* bx_q5_0: the codes of a block built once (q5_bytes), d * dot32 per token */
PXM_ROWS(q5_0, 22, {
    (void)aux;
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = p + i * 22;
        _mm_prefetch((const char *)b + PX_PF, _MM_HINT_T0);
        const __m256 db = ph1x8(b);
        _Alignas(32) uint8_t c[32];
        q5_bytes(b + 2, b + 6, 1, c);
        const __m256 c0 = cvt(i8x8(c)), c1 = cvt(i8x8(c + 8)), c2 = cvt(i8x8(c + 16)), c3 = cvt(i8x8(c + 24));
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) s[t].a = _mm256_fmadd_ps(db, dot32f(c0, c1, c2, c3, x[t] + i * 32), s[t].a);
    }
})

/* bx_q4_k: the mins first, then per 64 weights the low and the high sub-block */
PXM_ROWS(q4_k, 144, {
    for (int64_t i = 0; i < n / 256; i++) {
        const uint8_t *b = p + i * 144;
        _mm_prefetch((const char *)b + PX_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PX_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PX_PF + 128, _MM_HINT_T0);
        _Alignas(32) float sm[16];
        k4_scales(b, sm);
        const __m256 mins = _mm256_load_ps(sm + 8);
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) s[t].a = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(aux[t] + i * 8), s[t].a);
        const uint8_t *qs = b + offsetof(df_blk_q4_k, qs);
        for (int c = 0; c < 4; c++) {
            const __m256i q0 = u8x8(qs + 32 * c), q1 = u8x8(qs + 32 * c + 8), q2 = u8x8(qs + 32 * c + 16),
                          q3 = u8x8(qs + 32 * c + 24);
            const __m256 l0 = cvt(and15(q0)), l1 = cvt(and15(q1)), l2 = cvt(and15(q2)), l3 = cvt(and15(q3));
            const __m256 h0 = cvt(hi4(q0)), h1 = cvt(hi4(q1)), h2 = cvt(hi4(q2)), h3 = cvt(hi4(q3));
            const __m256 sl = _mm256_broadcast_ss(sm + 2 * c), sh = _mm256_broadcast_ss(sm + 2 * c + 1);
            _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) {
                const float *xb = x[t] + i * 256 + 64 * c;
                const __m256 tl = dot32f(l0, l1, l2, l3, xb), th = dot32f(h0, h1, h2, h3, xb + 32);
                s[t].a = _mm256_fmadd_ps(sl, tl, s[t].a);
                s[t].a = _mm256_fmadd_ps(sh, th, s[t].a);
            }
        }
    }
})

/* bx_q6_k: the -32 terms first, then per half, group and 16 codes */
PXM_ROWS(q6_k, 210, {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    for (int64_t i = 0; i < n / 256; i++) {
        const uint8_t *b = p + i * 210;
        _mm_prefetch((const char *)b + PX_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PX_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PX_PF + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)b + PX_PF + 192, _MM_HINT_T0);
        _Alignas(32) float dl[16];
        const __m256 d = _mm256_set1_ps(h2f(b + offsetof(df_blk_q6_k, d)));
        const uint8_t *sc = b + offsetof(df_blk_q6_k, scales);
        const __m256 d0 = _mm256_mul_ps(d, cvt(i8x8(sc))), d1 = _mm256_mul_ps(d, cvt(i8x8(sc + 8)));
        _mm256_store_ps(dl, d0);
        _mm256_store_ps(dl + 8, d1);
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) {
            s[t].a = _mm256_fnmadd_ps(d0, _mm256_loadu_ps(aux[t] + i * 16), s[t].a);
            s[t].a = _mm256_fnmadd_ps(d1, _mm256_loadu_ps(aux[t] + i * 16 + 8), s[t].a);
        }
        const uint8_t *ql = b, *qhp = b + offsetof(df_blk_q6_k, qh);
        for (int h = 0; h < 2; h++) {
            const __m256i la = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            const __m256i lb = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(qhp + 32 * h));
            const __m256i v[4] = {
                _mm256_or_si256(_mm256_and_si256(la, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(lb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), m4), _mm256_and_si256(qh, m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
            for (int g = 0; g < 4; g++) {
                const __m128i c[2] = {_mm256_castsi256_si128(v[g]), _mm256_extracti128_si256(v[g], 1)};
                for (int e = 0; e < 2; e++) {
                    const __m256 f0 = cvt(_mm256_cvtepu8_epi32(c[e])), f1 = cvt(_mm256_cvtepu8_epi32(_mm_srli_si128(c[e], 8)));
                    const __m256 sd = _mm256_broadcast_ss(dl + 8 * h + 2 * g + e);
                    _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) {
                        const float *xk = x[t] + i * 256 + 128 * h + 32 * g + 16 * e;
                        const __m256 tt = _mm256_fmadd_ps(f1, ldx(xk + 8), _mm256_mul_ps(f0, ldx(xk)));
                        s[t].a = _mm256_fmadd_ps(sd, tt, s[t].a);
                    }
                }
            }
        }
    }
})

df_ggml_pxm_fn df_ggml_pxm_avx2(int type,
                                void (*px_dot)(const uint8_t *, size_t, int64_t, const float *, const float *, int64_t, float *)) {
    /* only where px_dot is the kernel whose arithmetic these repeat */
    switch (type) {
    case DF_GGML_Q4_1: return px_dot == pxd_q4_1 ? pxw_q4_1 : NULL;
    case DF_GGML_Q8_0: return px_dot == pxd_q8_0 ? pxw_q8_0 : NULL;
    case DF_GGML_Q5_0: return px_dot == pxd_q5_0 ? pxm_q5_0 : NULL;
    case DF_GGML_Q4_K: return px_dot == pxd_q4_k ? pxm_q4_k : NULL;
    case DF_GGML_Q6_K: return px_dot == pxd_q6_k ? pxm_q6_k : NULL;
    default: return NULL;
    }
}
