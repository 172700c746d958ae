#!/usr/bin/env python3
"""Writes a synthetic checkpoint at Kimi K3's true widths, in the K3 release's layout: the kimi_k3 wrapper
config (text_config, model_type kimi_linear), tensors under language_model., hidden 7168, vocab 163840, KDA
layers of 96 heads x 128 (full-rank gate with lower bound, short convolutions of width 4), MLA layers without
RoPE with the output gate (96 heads, q_lora 1536, kv_lora 512), dense layer 0 (33792), MoE layers with 896
routed experts stored MXFP4 by compressed-tensors (weight_packed + uint8 weight_scale, group 32) in the latent
width 3584 -> 3072, 16 per token, 2 shared experts, SiTU, sigmoid router + bias, block attention residuals.
Values are random (a random block repeated: the content does not matter for speed); the MXFP4 scales are
chosen so activations stay finite. No torch needed.

    make_synthetic_k3.py OUT [--layers 3] [--experts 896]

Layer 0 is dense, the others are MoE; the last layer is MLA and the others KDA (K3 has 69 KDA and 24 MLA
layers). Sizes: ~7.8 GB of spine, ~15.4 GB of experts per MoE layer with 896 experts."""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from st_writer import Writer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=3, help="decoder layers (layer 0 dense, the rest MoE)")
ap.add_argument("--experts", type=int, default=896, help="routed experts per MoE layer (K3 has 896)")
a = ap.parse_args()

H, V, NH, QL, KL, NOPE, ROPE, VD = 7168, 163840, 96, 1536, 512, 128, 64, 128
KH, KD, CONV = 96, 128, 4             # KDA heads x head dim, conv width
FF, MF, LAT, TOPK, NSH = 33792, 3072, 3584, 16, 2
C = KH * KD
L = a.layers
full = [L]                             # 1-based: the last layer is MLA
kda = [i for i in range(1, L + 1) if i not in full]
text = {
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "vocab_size": V, "hidden_size": H,
    "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NH, "intermediate_size": FF,
    "q_lora_rank": QL, "kv_lora_rank": KL, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": VD,
    "mla_use_nope": True, "mla_use_output_gate": True, "num_experts": a.experts, "num_experts_per_token": TOPK,
    "num_shared_experts": NSH, "moe_intermediate_size": MF, "routed_expert_hidden_size": LAT,
    "latent_moe_use_norm": True, "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
    "topk_method": "noaux_tc", "num_expert_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
    "moe_layer_freq": 1, "first_k_dense_replace": 1, "hidden_act": "situ", "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "attn_res_block_size": 12, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 262144, "tie_word_embeddings": False, "num_nextn_predict_layers": 0,
    "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
    "linear_attn_config": {"full_attn_layers": full, "kda_layers": kda, "num_heads": KH, "head_dim": KD,
                           "short_conv_kernel_size": CONV, "use_full_rank_gate": True, "gate_lower_bound": -5.0},
}
cfg = {
    "model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"], "text_config": text,
    "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839, "tie_word_embeddings": False,
    "quantization_config": {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                      "weights": {"num_bits": 4, "type": "float", "strategy": "group",
                                                  "group_size": 32, "symmetric": True, "dynamic": False,
                                                  "scale_dtype": "torch.uint8", "zp_dtype": None}}},
        # everything but the routed experts stays bf16 (as the release's ignore list does)
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\..*",
                   "re:.*block_sparse_moe\\.gate$", "re:.*routed_expert_(down|up)_proj$", "re:.*vision.*"],
    },
}
os.makedirs(a.out, exist_ok=True)
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)

rng = np.random.default_rng(0)
POOL = 64 << 20
pool_bf16 = ((rng.standard_normal(POOL // 2).astype(np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16).tobytes()
pool_u8 = rng.integers(0, 256, POOL, dtype=np.uint8).tobytes()          # any byte is two finite E2M1 values
pool_e8m0 = rng.integers(119, 123, POOL, dtype=np.uint8).tobytes()     # scales 2^-8 .. 2^-5
POOLS = {"rand": pool_bf16, "packed": pool_u8, "e8m0": pool_e8m0}


def lin(w, name, rows, cols):
    w.add(name + ".weight", "BF16", (rows, cols), "rand")


def mxfp4(w, name, rows, cols):
    w.add(name + ".weight_packed", "U8", (rows, cols // 2), "packed")
    w.add(name + ".weight_scale", "U8", (rows, cols // 32), "e8m0")


P0 = "language_model."
weight_map, total, shards = {}, 0, []
w = Writer(os.path.join(a.out, "model-00000.safetensors"), POOLS)
w.add(P0 + "model.embed_tokens.weight", "BF16", (V, H), "rand")
w.add(P0 + "model.norm.weight", "BF16", (H,), "ones")
w.add(P0 + "model.output_attn_res_norm.weight", "BF16", (H,), "ones")
w.add(P0 + "model.output_attn_res_proj.weight", "BF16", (1, H), "rand")
w.add(P0 + "lm_head.weight", "BF16", (V, H), "rand")
shards.append(w)
for l in range(L):
    w = Writer(os.path.join(a.out, f"model-{l + 1:05d}.safetensors"), POOLS)
    p = f"{P0}model.layers.{l}."
    for n_ in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
        w.add(p + n_ + ".weight", "BF16", (H,), "ones")
    for n_ in ("self_attention_res_proj", "mlp_res_proj"):
        w.add(p + n_ + ".weight", "BF16", (1, H), "rand")
    a_ = p + "self_attn."
    if (l + 1) in kda:
        for n_ in ("q_proj", "k_proj", "v_proj", "g_proj"):
            lin(w, a_ + n_, C, H)
        lin(w, a_ + "o_proj", H, C)
        lin(w, a_ + "f_a_proj", KD, H)
        lin(w, a_ + "f_b_proj", C, KD)
        lin(w, a_ + "b_proj", KH, H)
        for n_ in ("q_conv1d", "k_conv1d", "v_conv1d"):
            w.add(a_ + n_ + ".weight", "F32", (C, 1, CONV), "f32small")
        w.add(a_ + "A_log", "F32", (KD,), "zeros")     # padded to head_dim like the release; all zero here
        w.add(a_ + "dt_bias", "F32", (C,), "zeros")
        w.add(a_ + "o_norm.weight", "BF16", (KD,), "ones")
    else:
        lin(w, a_ + "q_a_proj", QL, H)
        w.add(a_ + "q_a_layernorm.weight", "BF16", (QL,), "ones")
        lin(w, a_ + "q_b_proj", NH * (NOPE + ROPE), QL)
        lin(w, a_ + "kv_a_proj_with_mqa", KL + ROPE, H)
        w.add(a_ + "kv_a_layernorm.weight", "BF16", (KL,), "ones")
        lin(w, a_ + "kv_b_proj", NH * (NOPE + VD), KL)
        lin(w, a_ + "g_proj", NH * VD, H)
        lin(w, a_ + "o_proj", H, NH * VD)
    if l == 0:
        for n_, r, c in (("gate_proj", FF, H), ("up_proj", FF, H), ("down_proj", H, FF)):
            lin(w, p + "mlp." + n_, r, c)
    else:
        m = p + "block_sparse_moe."
        w.add(m + "gate.weight", "BF16", (a.experts, H), "rand")
        w.add(m + "gate.e_score_correction_bias", "F32", (a.experts,), "zeros")
        lin(w, m + "routed_expert_down_proj", LAT, H)
        lin(w, m + "routed_expert_up_proj", H, LAT)
        w.add(m + "routed_expert_norm.weight", "BF16", (LAT,), "ones")
        for n_, r, c in (("gate_proj", MF * NSH, H), ("up_proj", MF * NSH, H), ("down_proj", H, MF * NSH)):
            lin(w, m + "shared_experts." + n_, r, c)
        for e in range(a.experts):
            for n_, r, c in (("w1", MF, LAT), ("w3", MF, LAT), ("w2", LAT, MF)):
                mxfp4(w, m + f"experts.{e}.{n_}", r, c)
    shards.append(w)
for s in shards:
    total += s.write()
    for t in s.tensors:
        weight_map[t[0]] = os.path.basename(s.path)
    print(f"wrote {s.path}", flush=True)
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
          open(os.path.join(a.out, "model.safetensors.index.json"), "w"))
print(f"total {total / 1e9:.2f} GB")
