/* attn_kernels.h - the attention kernels of the CPU backend (internal):
 * scores, softmax and P x V of attn.c's GQA core, per ISA.
 *
 * The arithmetic is DEFINED here, once, and every version computes exactly
 * it (the scalar one with fmaf, the SIMD ones with fused multiply-adds in
 * the same order), so every ISA gives the same bits, and so does any
 * blocking of queries, keys or head dimensions:
 *
 *   score   s(q, k) = tree8(l_0 .. l_7) * scale, where lane l_c is the chain
 *           l_c = fma(q[d], k[d], l_c) over d = c, c + 8, c + 16, ... < hd
 *           from +0, and tree8(l) = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
 *           (l6 + l7)).
 *   softmax m = max_j s_j (exact); e_j = exp8(s_j - m) (df_ka_exp below:
 *           a fixed polynomial, ~1 ulp; 0 below -87); the sum is tree8 of
 *           eight lane sums, lane c adding e_j for j = c, c + 8, ... in
 *           order from +0.
 *   output  o[d] = chain o[d] = fma(e_j, v_j[d], o[d]) over j in key order
 *           from +0, then o[d] * (1 / sum).
 *
 * Each (query, key) score and each (query, d) output depends on nothing
 * but its own inputs and the key order, so a query's result is the same
 * whatever other queries share its call (one position or a verify pass,
 * any tile, any thread count). AVX-512 machines run the AVX2 versions
 * (8 lanes is part of the definition). */
#ifndef DF_CPU_ATTN_KERNELS_H
#define DF_CPU_ATTN_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* exp(x) for x <= 0 as defined above (x < -87: 0) */
float df_ka_exp(float x);

#define DF_DECL_ATTN_KERNELS(isa)                                                                                   \
    /* S[i*lds + j] = s(Q[i*hd ..], K[j*ldk ..]) for i < nq, j < nk */                                             \
    void df_ka_scores_##isa(const float *Q, int nq, const float *K, int64_t ldk, int nk, int hd, float scale,      \
                            float *S, int64_t lds);                                                                \
    /* s[j] = e_j for j < n (n >= 1); returns the sum of the e_j */                                               \
    float df_ka_softmax_##isa(float *s, int n);                                                                    \
    /* continues the chains: O[i*hd + d] = fma(P[i*ldp + j], V[j*ldv + d], O[i*hd + d]) for j < nk in order */    \
    void df_ka_pv_##isa(const float *P, int64_t ldp, int nq, const float *V, int64_t ldv, int nk, int hd, float *O);

DF_DECL_ATTN_KERNELS(scalar)
DF_DECL_ATTN_KERNELS(avx2)

#endif
