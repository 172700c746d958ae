#!/usr/bin/env python3
"""layer_bench_golden.py - the reference of bench/cuda/layer_bench.cu's checks from transformers itself.

layer_bench (and its CPU-emulated run in `make test`) checks its kernels against a double-precision host forward
that this project wrote. This script computes the same decode step with transformers' own Qwen3-MoE modules
(Qwen3MoeDecoderLayer with its attention, q/k norms, RoPE, top-k router and experts; Qwen3MoeRMSNorm for the final
norm) on the weights layer_bench derives from its hash (the hash ported here: a BF16 weight is uniform in
[-1/32, 1/32) rounded to nearest even, norms 1 + t/8, caches and the first h uniform in [-1, 1)), and writes what
the emulated run compares against: per token the chosen experts of each layer, the next token (argmax of the
lm_head's logits) and h after the layers.

Each token is a query at position P over P cached positions (keys already normalised and rotated, as transformers
caches them) plus its own; the first token starts from layer_bench's hashed h, the second from the first token's
embedding row (layer_bench keeps the position, so the second token's cache is the same P positions).

Needs torch and transformers (reference tooling, like tools/make_checkpoints.py: the tests read the file it
writes, tests/data/layer_bench/golden_l1_p64_v8000_t2.bin, and do not import either).
Usage: layer_bench_golden.py OUT [layers 1] [P 64] [V 8000] [tokens 2]
File (little-endian): int32 magic 0x4c424731 ("LBG1"), L, P, V, T; then per token: int32 token, int32 experts[8 L],
float32 h[2048].
"""
import struct
import sys

import numpy as np
import torch
from transformers import Qwen3MoeConfig
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer, Qwen3MoeRMSNorm

H, NQ, NKV, HD, NE, TOPK, IE = 2048, 32, 4, 128, 128, 8, 768
QR, KR = NQ * HD, NKV * HD
MAXL = 8
S_QKV, S_O, S_R, S_G, S_U, S_D, S_N1, S_N2, S_QN, S_KN, S_KC, S_VC = range(12)
S_LM, S_EMB, S_NF = 0, 1, 2  # with layer MAXL
SEED_H0 = 7
M32 = np.uint64(0xFFFFFFFF)


def seed_of(l, what):
    return (100 + 16 * l + what) & 0xFFFFFFFF


def mix(seed, i):
    """layer_bench.cu's mix(): i a uint64 array of indices < 2^32"""
    x = (i.astype(np.uint64) ^ np.uint64((seed * 0x9E3779B9) & 0xFFFFFFFF)) & M32
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & M32
    x ^= x >> np.uint64(16)
    x = (x + np.uint64((seed * 0x632BE5AB) & 0xFFFFFFFF)) & M32
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0x9E3779B1)) & M32
    x ^= x >> np.uint64(16)
    return x


def weights(seed, start, count):
    """count BF16 weights from index start, as float32 (exact values of the BF16 numbers)"""
    x = mix(seed, np.arange(start, start + count, dtype=np.uint64))
    f = ((x >> np.uint64(8)).astype(np.float32) * np.float32(1.0 / 16777216.0) - np.float32(0.5)) * np.float32(1.0 / 16.0)
    return torch.from_numpy(f).to(torch.bfloat16).to(torch.float32)  # round to nearest even, as wbits()


def fvals(seed, start, count, base, amp):
    x = mix(seed, np.arange(start, start + count, dtype=np.uint64))
    t = ((x >> np.uint64(16)).astype(np.float32) - np.float32(32768.0)) * np.float32(1.0 / 32768.0)
    return torch.from_numpy(np.float32(base) + np.float32(amp) * t)


def rope(P):
    """layer_bench's table: cos / sin of P * 1e6^(-2i/128) in double, rounded to float; transformers' halves"""
    i = np.arange(HD // 2, dtype=np.float64)
    ang = P * np.power(1e6, -2.0 * i / HD)
    c, s = torch.from_numpy(np.cos(ang).astype(np.float32)), torch.from_numpy(np.sin(ang).astype(np.float32))
    return torch.cat([c, c]).view(1, 1, HD), torch.cat([s, s]).view(1, 1, HD)


def layer_module(cfg, l):
    m = Qwen3MoeDecoderLayer(cfg, 0).eval()
    with torch.no_grad():
        qkv = weights(seed_of(l, S_QKV), 0, (QR + 2 * KR) * H).view(QR + 2 * KR, H)
        m.self_attn.q_proj.weight.copy_(qkv[:QR])
        m.self_attn.k_proj.weight.copy_(qkv[QR:QR + KR])
        m.self_attn.v_proj.weight.copy_(qkv[QR + KR:])
        m.self_attn.o_proj.weight.copy_(weights(seed_of(l, S_O), 0, H * QR).view(H, QR))
        m.self_attn.q_norm.weight.copy_(fvals(seed_of(l, S_QN), 0, HD, 1.0, 0.125))
        m.self_attn.k_norm.weight.copy_(fvals(seed_of(l, S_KN), 0, HD, 1.0, 0.125))
        m.input_layernorm.weight.copy_(fvals(seed_of(l, S_N1), 0, H, 1.0, 0.125))
        m.post_attention_layernorm.weight.copy_(fvals(seed_of(l, S_N2), 0, H, 1.0, 0.125))
        m.mlp.gate.weight.copy_(weights(seed_of(l, S_R), 0, NE * H).view(NE, H))
        m.mlp.experts.gate_up_proj.zero_()  # experts nobody routes to stay zero: a wrong route would show
        m.mlp.experts.down_proj.zero_()
    return m


def fill_experts(m, l, ids):
    with torch.no_grad():
        for e in ids:
            g = weights(seed_of(l, S_G), e * IE * H, IE * H).view(IE, H)
            u = weights(seed_of(l, S_U), e * IE * H, IE * H).view(IE, H)
            m.mlp.experts.gate_up_proj[e].copy_(torch.cat([g, u]))
            m.mlp.experts.down_proj[e].copy_(weights(seed_of(l, S_D), e * H * IE, H * IE).view(H, IE))


def token(cfg, L, P, V, h_in):
    cos, sin = rope(P)
    h = h_in.view(1, 1, H).clone()
    ids_all = []
    for l in range(L):
        m = layer_module(cfg, l)
        with torch.no_grad():  # the route transformers' router takes, to fill those experts (the others stay zero)
            x2 = m.post_attention_layernorm  # (the route needs h after attention: run the layer twice)
            cache = DynamicCache(config=cfg)
            k = fvals(seed_of(l, S_KC), 0, P * KR, 0.0, 1.0).view(1, P, NKV, HD).transpose(1, 2)
            v = fvals(seed_of(l, S_VC), 0, P * KR, 0.0, 1.0).view(1, P, NKV, HD).transpose(1, 2)
            cache.update(k.contiguous(), v.contiguous(), 0)
            res = h
            a = m.input_layernorm(h)
            att, _ = m.self_attn(a, attention_mask=None, position_embeddings=(cos, sin), cache=cache)
            mid = res + att
            _, _, idx = m.mlp.gate(x2(mid).view(-1, H))
            ids = [int(i) for i in idx[0]]
            fill_experts(m, l, ids)
            cache = DynamicCache(config=cfg)
            cache.update(k.contiguous(), v.contiguous(), 0)
            h = m(h, attention_mask=None, position_embeddings=(cos, sin), cache=cache)
            if isinstance(h, tuple):
                h = h[0]
        ids_all += ids
    nxt = -1
    if V:
        nf = Qwen3MoeRMSNorm(H, eps=cfg.rms_norm_eps)
        with torch.no_grad():
            nf.weight.copy_(fvals(seed_of(MAXL, S_NF), 0, H, 1.0, 0.125))
            logits = weights(seed_of(MAXL, S_LM), 0, V * H).view(V, H) @ nf(h).view(H)
        nxt = int(torch.argmax(logits))  # (the first of equal maxima, as layer_bench)
    return nxt, ids_all, h.view(H)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    L, P, V, T = (int(a) for a in (sys.argv[2:] + ["1", "64", "8000", "2"][len(sys.argv) - 2:])[:4])
    if not (1 <= L <= MAXL and 1 <= P <= 32768 and 0 <= V <= 1 << 20 and 1 <= T <= 2 and (T == 1 or V)):
        sys.exit("layer_bench_golden: layers 1..8, P 1..32768, V 0..2^20, tokens 1..2 (2 with V)")
    torch.set_grad_enabled(False)
    cfg = Qwen3MoeConfig(hidden_size=H, num_attention_heads=NQ, num_key_value_heads=NKV, head_dim=HD, num_experts=NE,
                         num_experts_per_tok=TOPK, moe_intermediate_size=IE, norm_topk_prob=True, rms_norm_eps=1e-6,
                         num_hidden_layers=1, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=max(V, 1))
    cfg._attn_implementation = "eager"
    recs = []
    h_in = fvals(SEED_H0, 0, H, 0.0, 1.0)
    for t in range(T):
        nxt, ids, h = token(cfg, L, P, V, h_in)
        recs.append((nxt, ids, h))
        print(f"token {t}: experts {ids}, next token {nxt}, |h| {float(h.norm()):.6f}")
        if t + 1 < T:
            h_in = weights(seed_of(MAXL, S_EMB), nxt * H, H)
    with open(out, "wb") as f:
        f.write(struct.pack("<5i", 0x4C424731, L, P, V, T))
        for nxt, ids, h in recs:
            f.write(struct.pack("<i", nxt))
            f.write(struct.pack(f"<{len(ids)}i", *ids))
            f.write(h.numpy().astype("<f4").tobytes())


if __name__ == "__main__":
    main()
