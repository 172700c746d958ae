#!/usr/bin/env python3
"""Writes a synthetic checkpoint with real DeepSeek-V3 layer shapes (hidden
7168, MLA q_lora 1536 / kv_lora 512 / 128 heads, dense FFN 18432, experts of
width 2048, vocab 129280, FP8 E4M3 weights with 128x128 weight_scale_inv
blocks, BF16 embeddings/head/norms) and as many layers as asked. Values are
random (repeating a random block: the content does not matter for speed).
No torch needed. Usage: make_synthetic_dsv3.py OUT [--layers 2] [--experts 128] [--vocab N]"""
import argparse
import json
import os
import sys

try:
    import numpy as np
except ImportError:  # the GPU machine may lack it: pools from the standard library (smaller, the same kinds of values)
    np = None
import random
import struct

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from st_writer import Writer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=2, help="decoder layers (the first is dense, as first_k_dense_replace=1)")
ap.add_argument("--experts", type=int, default=128, help="routed experts per MoE layer (DeepSeek-V3 has 256)")
ap.add_argument("--dtype", choices=["fp8", "bf16"], default="fp8")
ap.add_argument("--vocab", type=int, default=129280, help="vocabulary (a small one keeps the BF16 head from dominating a "
                "few-layer decode benchmark)")
a = ap.parse_args()
if a.vocab < 256 or a.layers < 1 or a.experts < 16 or a.experts % 8:
    ap.error(f"--vocab {a.vocab} --layers {a.layers} --experts {a.experts}: expected vocab >= 256, layers >= 1, and experts a "
             "multiple of 8 of at least 16 (n_group 8 groups of at least 2)")

H, V, NH, QL, KL, NOPE, ROPE, VD, FF, MF = 7168, a.vocab, 128, 1536, 512, 128, 64, 128, 18432, 2048
cfg = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": V, "hidden_size": H,
    "intermediate_size": FF, "moe_intermediate_size": MF, "num_hidden_layers": a.layers, "num_nextn_predict_layers": 0,
    "num_attention_heads": NH, "num_key_value_heads": NH, "n_shared_experts": 1, "n_routed_experts": a.experts,
    "routed_scaling_factor": 2.5, "kv_lora_rank": KL, "q_lora_rank": QL, "qk_rope_head_dim": ROPE, "v_head_dim": VD,
    "qk_nope_head_dim": NOPE, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
}
if a.dtype == "fp8":
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [128, 128]}
os.makedirs(a.out, exist_ok=True)
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)

POOL = 64 << 20
FP8_MASK = bytes(b & 0xB7 for b in range(256))  # |x| <= 2^-1 * 1.875: no NaN, sane
if np is not None:
    rng = np.random.default_rng(0)
    pool_bf16 = (rng.standard_normal(POOL // 2).astype(np.float32) * 0.02).view(np.uint32) >> 16
    pool_bf16 = pool_bf16.astype(np.uint16).tobytes()
    pool_fp8 = (rng.integers(0, 256, POOL, dtype=np.uint8) & 0xB7).tobytes()
else:
    r = random.Random(0)
    pool_bf16 = b"".join(struct.pack("<f", r.gauss(0, 0.02))[2:] for _ in range(1 << 20))
    pool_fp8 = r.randbytes(POOL).translate(FP8_MASK)
POOLS = {"rand": pool_bf16, "fp8": pool_fp8}


def lin(w, name, rows, cols):
    if a.dtype == "fp8":
        w.add(name + ".weight", "F8_E4M3", (rows, cols), "fp8")
        w.add(name + ".weight_scale_inv", "F32", ((rows + 127) // 128, (cols + 127) // 128), "f32small")
    else:
        w.add(name + ".weight", "BF16", (rows, cols), "rand")


weight_map, total = {}, 0
shards = []
w = Writer(os.path.join(a.out, "model-00000.safetensors"), POOLS)
w.add("model.embed_tokens.weight", "BF16", (V, H), "rand")
w.add("model.norm.weight", "BF16", (H,), "ones")
w.add("lm_head.weight", "BF16", (V, H), "rand")
shards.append(w)
for l in range(a.layers):
    w = Writer(os.path.join(a.out, f"model-{l + 1:05d}.safetensors"), POOLS)
    p = f"model.layers.{l}."
    w.add(p + "input_layernorm.weight", "BF16", (H,), "ones")
    w.add(p + "post_attention_layernorm.weight", "BF16", (H,), "ones")
    lin(w, p + "self_attn.q_a_proj", QL, H)
    w.add(p + "self_attn.q_a_layernorm.weight", "BF16", (QL,), "ones")
    lin(w, p + "self_attn.q_b_proj", NH * (NOPE + ROPE), QL)
    lin(w, p + "self_attn.kv_a_proj_with_mqa", KL + ROPE, H)
    w.add(p + "self_attn.kv_a_layernorm.weight", "BF16", (KL,), "ones")
    lin(w, p + "self_attn.kv_b_proj", NH * (NOPE + VD), KL)
    lin(w, p + "self_attn.o_proj", H, NH * VD)
    if l == 0:
        for n_, r, c in (("gate_proj", FF, H), ("up_proj", FF, H), ("down_proj", H, FF)):
            lin(w, p + "mlp." + n_, r, c)
    else:
        w.add(p + "mlp.gate.weight", "BF16", (a.experts, H), "rand")
        w.add(p + "mlp.gate.e_score_correction_bias", "F32", (a.experts,), "zeros")
        for e in range(a.experts):
            for n_, r, c in (("gate_proj", MF, H), ("up_proj", MF, H), ("down_proj", H, MF)):
                lin(w, p + f"mlp.experts.{e}.{n_}", r, c)
        for n_, r, c in (("gate_proj", MF, H), ("up_proj", MF, H), ("down_proj", H, MF)):
            lin(w, p + "mlp.shared_experts." + n_, r, c)
    shards.append(w)
for s in shards:
    total += s.write()
    for t in s.tensors:
        weight_map[t[0]] = os.path.basename(s.path)
    print(f"wrote {s.path}", flush=True)
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, open(os.path.join(a.out, "model.safetensors.index.json"), "w"))
print(f"total {total / 1e9:.2f} GB")
