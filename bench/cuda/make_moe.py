#!/usr/bin/env python3
"""Writes a synthetic BF16 Qwen3-MoE checkpoint with Qwen3-30B-A3B expert
shapes (hidden 2048, 32 heads x 128, 4 KV heads, 128 experts of width 768,
top-8, q/k norms) and a small vocabulary (8192 unless --vocab: the spine stays
small, the experts are the bulk: 1.21 GB per layer), for the CUDA tier benchmark
(tier_bench.sh). Needs only the Python standard library (the device machine
has no numpy); values repeat a random pool (content does not matter for
speed, routing is near uniform).

Usage: make_moe.py OUT_DIR [--layers 4] [--vocab 8192]  (151936: Qwen3's own vocabulary)"""
import argparse
import json
import os
import random
import struct

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--vocab", type=int, default=8192)
a = ap.parse_args()

H, NH, NKV, HD, E, K, I, V = 2048, 32, 4, 128, 128, 8, 768, a.vocab
cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H, "intermediate_size": 6144,
       "moe_intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
       "num_experts": E, "num_experts_per_tok": K, "num_hidden_layers": a.layers, "decoder_sparse_step": 1,
       "mlp_only_layers": [], "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 40960,
       "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "vocab_size": V, "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False}
os.makedirs(a.out, exist_ok=True)
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)

rng = random.Random(0)
POOL_N = 1 << 20  # bf16 values
pool = b"".join(struct.pack("<f", rng.gauss(0, 0.02))[2:] for _ in range(POOL_N))
ONES = struct.pack("<H", 0x3F80) * 4096

tensors = [("model.embed_tokens.weight", (V, H), "rand"), ("lm_head.weight", (V, H), "rand"), ("model.norm.weight", (H,), "ones")]
for l in range(a.layers):
    p = f"model.layers.{l}."
    tensors += [(p + "input_layernorm.weight", (H,), "ones"), (p + "post_attention_layernorm.weight", (H,), "ones"),
                (p + "self_attn.q_proj.weight", (NH * HD, H), "rand"), (p + "self_attn.k_proj.weight", (NKV * HD, H), "rand"),
                (p + "self_attn.v_proj.weight", (NKV * HD, H), "rand"), (p + "self_attn.o_proj.weight", (H, NH * HD), "rand"),
                (p + "self_attn.q_norm.weight", (HD,), "ones"), (p + "self_attn.k_norm.weight", (HD,), "ones"),
                (p + "mlp.gate.weight", (E, H), "rand")]
    for e in range(E):
        q = p + f"mlp.experts.{e}."
        tensors += [(q + "gate_proj.weight", (I, H), "rand"), (q + "up_proj.weight", (I, H), "rand"), (q + "down_proj.weight", (H, I), "rand")]

hdr, off = {}, 0
for name, shape, _ in tensors:
    n = 2
    for d in shape:
        n *= d
    hdr[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
    off += n
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for i, (name, shape, kind) in enumerate(tensors):
        n = hdr[name]["data_offsets"][1] - hdr[name]["data_offsets"][0]
        src = ONES if kind == "ones" else pool
        start = 0 if kind == "ones" else (i * 7919 * 2) % (len(pool) // 2)
        while n:
            k = min(n, len(src) - start)
            f.write(src[start:start + k])
            n -= k
            start = 0
print(f"{a.out}: {off / 1e9:.2f} GB, {a.layers} layers")
