#!/usr/bin/env python3
"""Writes a random BF16 Qwen3-MoE checkpoint (config.json as published, one model.safetensors with the real tensor
names) in the shapes of the persistent decode kernel's CPU check (bench/cuda/dec_layers.h built with DEC_NE=32,
DEC_IE=256): hidden 2048, 32 q heads / 4 KV heads of 128, q/k norms, 32 experts of 256 choosing 8 (norm_topk_prob),
a 512-id vocabulary, 2 layers (~280 MB). Values: projections N(0, 1/in), embeddings N(0, 1), norm gains 1 + N(0, 0.1)
(not ones, so a norm applied with the wrong gain shows), all rounded to BF16 (nearest even). Deterministic (seed 5).
Used by `make dec-emu-check` (tests/emu/dec_cpu_parity.c); needs numpy.

Usage: make_dec_ckpt.py OUT_DIR [--layers 2]"""
import argparse
import json
import os

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=2)
a = ap.parse_args()

H, NH, NKV, HD, E, K, I, V = 2048, 32, 4, 128, 32, 8, 256, 512
cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H, "intermediate_size": 6144,
       "moe_intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
       "num_experts": E, "num_experts_per_tok": K, "num_hidden_layers": a.layers, "decoder_sparse_step": 1,
       "mlp_only_layers": [], "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 40960,
       "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "vocab_size": V, "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False,
       "attention_dropout": 0.0, "output_router_logits": False, "router_aux_loss_coef": 0.001, "sliding_window": None,
       "use_sliding_window": False, "max_window_layers": a.layers, "initializer_range": 0.02, "use_cache": True}
os.makedirs(a.out, exist_ok=True)
rng = np.random.default_rng(5)


def bf16(x):
    """float32 -> BF16 bits (round to nearest even), as uint16"""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def lin(out, inp):
    return bf16(rng.standard_normal((out, inp), dtype=np.float32) * np.float32(1.0 / np.sqrt(inp)))


def gain(n):
    return bf16(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32))


tensors = [("model.embed_tokens.weight", bf16(rng.standard_normal((V, H), dtype=np.float32))), ("lm_head.weight", lin(V, H)),
           ("model.norm.weight", gain(H))]
for l in range(a.layers):
    p = f"model.layers.{l}."
    tensors += [(p + "input_layernorm.weight", gain(H)), (p + "post_attention_layernorm.weight", gain(H)),
                (p + "self_attn.q_proj.weight", lin(NH * HD, H)), (p + "self_attn.k_proj.weight", lin(NKV * HD, H)),
                (p + "self_attn.v_proj.weight", lin(NKV * HD, H)), (p + "self_attn.o_proj.weight", lin(H, NH * HD)),
                (p + "self_attn.q_norm.weight", gain(HD)), (p + "self_attn.k_norm.weight", gain(HD)), (p + "mlp.gate.weight", lin(E, H))]
    for e in range(E):
        q = p + f"mlp.experts.{e}."
        tensors += [(q + "gate_proj.weight", lin(I, H)), (q + "up_proj.weight", lin(I, H)), (q + "down_proj.weight", lin(H, I))]

hdr, off = {}, 0
for name, t in tensors:
    hdr[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
    off += t.nbytes
hdr["__metadata__"] = {"format": "pt"}
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
    f.write(len(h).to_bytes(8, "little") + h)
    for _, t in tensors:
        f.write(t.tobytes())
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
print(f"{a.out}: {off / 1e6:.1f} MB, {a.layers} layers")
