#!/usr/bin/env python3
"""Write tiny random checkpoints with the real published layouts (config.json, generation_config.json,
safetensors with the real tensor names and dtypes) and golden logits computed by Hugging Face transformers
in float32 with eager attention.

    python3 tools/make_checkpoints.py --out tests/data/models [--only NAME] [--list]

Deterministic: every model has a fixed base seed; if the random draw gives a near-tie (output argmax at a
golden or greedy position, or a router top-k / group selection boundary), the next seed is tried.
See docs/TEST_MODELS.md for what each model covers and for the exact math transformers does.
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_quant as cq  # noqa: E402

SEQ_LEN = 24
GREEDY_PROMPT = 8
GREEDY_NEW = 32
LOGIT_GAP_REL = 1e-3      # top1 - top2 > LOGIT_GAP_REL * max(1, |top1|) at every checked position
ROUTER_GAP = 2e-4         # gap at every router selection boundary (qwen: logits; deepseek: biased sigmoid scores)
MAX_ATTEMPTS = 60


# --------------------------------------------------------------------------------------------- random init
class Rng:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std=1.0, mean=0.0):
        return torch.randn(*shape, generator=self.g, dtype=torch.float32) * std + mean

    def uniform(self, shape, lo, hi):
        return torch.rand(*shape, generator=self.g, dtype=torch.float32) * (hi - lo) + lo

    def ints(self, n, hi):
        return torch.randint(0, hi, (n,), generator=self.g).tolist()


def lin(r, out, inp, gain=1.0):
    return r.normal((out, inp), gain / math.sqrt(inp))


def normw(r, n):
    return r.normal((n,), 0.1, 1.0)


class Tensors:
    """stored: name -> tensor exactly as written; ref: name -> float32 values the reference model uses."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.stored = {}
        self.ref = {}
        self.quantized = set()  # ref names whose stored form is quantized

    def add(self, name, t, dtype=None):
        s = t.to(dtype or self.dtype).contiguous()
        self.stored[name] = s
        self.ref[name] = s.to(torch.float32)

    def add_fp8(self, prefix, t, block):
        q, sinv, deq = cq.fp8_block_quant(t, block)
        self.stored[prefix + ".weight"] = q.contiguous()
        self.stored[prefix + ".weight_scale_inv"] = sinv.contiguous()
        self.ref[prefix + ".weight"] = deq
        self.quantized.add(prefix + ".weight")

    def add_int4(self, prefix, t, group):
        packed, scale, shape, deq = cq.int4_group_quant(t, group)
        self.stored[prefix + ".weight_packed"] = packed.contiguous()
        self.stored[prefix + ".weight_scale"] = scale.contiguous()
        self.stored[prefix + ".weight_shape"] = shape
        self.ref[prefix + ".weight"] = deq
        self.quantized.add(prefix + ".weight")


# --------------------------------------------------------------------------------------------- llama / qwen3
def build_dense(spec, r):
    c = spec["config"]
    H, V = c["hidden_size"], c["vocab_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or H // nh
    I = c["intermediate_size"]
    T = Tensors(spec["dtype"])
    tied = c.get("tie_word_embeddings", False)
    # tied: the embedding is the output head, give it the head's scale; RMSNorm removes the scale at the input
    T.add("model.embed_tokens.weight", r.normal((V, H), 2.0 / math.sqrt(H) if tied else 1.0))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        T.add(p + "input_layernorm.weight", normw(r, H))
        T.add(p + "self_attn.q_proj.weight", lin(r, nh * hd, H))
        T.add(p + "self_attn.k_proj.weight", lin(r, nkv * hd, H))
        T.add(p + "self_attn.v_proj.weight", lin(r, nkv * hd, H))
        T.add(p + "self_attn.o_proj.weight", lin(r, H, nh * hd))
        if spec.get("qk_norm"):
            T.add(p + "self_attn.q_norm.weight", normw(r, hd))
            T.add(p + "self_attn.k_norm.weight", normw(r, hd))
        T.add(p + "post_attention_layernorm.weight", normw(r, H))
        if spec.get("moe") and is_qwen_moe_layer(c, i):
            E = qwen_num_experts(c)
            mi = c["moe_intermediate_size"]
            T.add(p + "mlp.gate.weight", lin(r, E, H, 3.0))
            for e in range(E):
                T.add(p + f"mlp.experts.{e}.gate_proj.weight", lin(r, mi, H))
                T.add(p + f"mlp.experts.{e}.up_proj.weight", lin(r, mi, H))
                T.add(p + f"mlp.experts.{e}.down_proj.weight", lin(r, H, mi))
        else:
            T.add(p + "mlp.gate_proj.weight", lin(r, I, H))
            T.add(p + "mlp.up_proj.weight", lin(r, I, H))
            T.add(p + "mlp.down_proj.weight", lin(r, H, I))
    T.add("model.norm.weight", normw(r, H))
    if not tied:
        T.add("lm_head.weight", lin(r, V, H, 2.0))
    return T


def qwen_num_experts(c):
    return c.get("num_experts", c.get("num_local_experts"))


def is_qwen_moe_layer(c, i):
    # Qwen3MoeDecoderLayer.__init__
    return (i not in (c.get("mlp_only_layers") or [])) and qwen_num_experts(c) > 0 and \
        (i + 1) % c.get("decoder_sparse_step", 1) == 0


# --------------------------------------------------------------------------------------------- deepseek / kimi
def build_deepseek(spec, r):
    c = spec["config"]
    H, V = c["hidden_size"], c["vocab_size"]
    nh = c["num_attention_heads"]
    qr, kvr = c["q_lora_rank"], c["kv_lora_rank"]
    dn, dr, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    I, mi, E = c["intermediate_size"], c["moe_intermediate_size"], c["n_routed_experts"]
    L = c["num_hidden_layers"]
    quant = spec.get("quant")  # None | ("fp8", block) | ("int4", group)
    T = Tensors(torch.bfloat16)

    def linear(name, out, inp, role, gain=1.0):
        """role: attn | dense | shared | expert | head."""
        w = lin(r, out, inp, gain)
        if quant and quant[0] == "fp8" and role in ("attn", "dense", "shared", "expert"):
            T.add_fp8(name, w, quant[1])
        elif quant and quant[0] == "int4" and role == "expert":
            T.add_int4(name, w, quant[1])
        else:
            T.add(name + ".weight", w)

    def decoder_layer(i):
        p = f"model.layers.{i}."
        T.add(p + "input_layernorm.weight", normw(r, H))
        a = p + "self_attn."
        if qr is None:
            linear(a + "q_proj", nh * (dn + dr), H, "attn")
        else:
            linear(a + "q_a_proj", qr, H, "attn")
            T.add(a + "q_a_layernorm.weight", normw(r, qr))
            linear(a + "q_b_proj", nh * (dn + dr), qr, "attn")
        linear(a + "kv_a_proj_with_mqa", kvr + dr, H, "attn")
        T.add(a + "kv_a_layernorm.weight", normw(r, kvr))
        linear(a + "kv_b_proj", nh * (dn + dv), kvr, "attn")
        linear(a + "o_proj", H, nh * dv, "attn")
        T.add(p + "post_attention_layernorm.weight", normw(r, H))
        if i >= c["first_k_dense_replace"] and i % c.get("moe_layer_freq", 1) == 0:
            T.add(p + "mlp.gate.weight", lin(r, E, H, 4.0))
            T.add(p + "mlp.gate.e_score_correction_bias", r.uniform((E,), -0.15, 0.15), torch.float32)
            for e in range(E):
                linear(p + f"mlp.experts.{e}.gate_proj", mi, H, "expert")
                linear(p + f"mlp.experts.{e}.up_proj", mi, H, "expert")
                linear(p + f"mlp.experts.{e}.down_proj", H, mi, "expert")
            si = mi * c["n_shared_experts"]
            linear(p + "mlp.shared_experts.gate_proj", si, H, "shared")
            linear(p + "mlp.shared_experts.up_proj", si, H, "shared")
            linear(p + "mlp.shared_experts.down_proj", H, si, "shared")
        else:
            linear(p + "mlp.gate_proj", I, H, "dense")
            linear(p + "mlp.up_proj", I, H, "dense")
            linear(p + "mlp.down_proj", H, I, "dense")

    T.add("model.embed_tokens.weight", r.normal((V, H), 1.0))
    for i in range(L):
        decoder_layer(i)
    T.add("model.norm.weight", normw(r, H))
    T.add("lm_head.weight", lin(r, V, H, 2.0))
    # MTP module(s), stored as DeepSeek-V3 ships them: layer index num_hidden_layers + k
    for k in range(c.get("num_nextn_predict_layers", 0)):
        m = L + k
        p = f"model.layers.{m}."
        T.add(p + "embed_tokens.weight", r.normal((V, H), 1.0))
        T.add(p + "enorm.weight", normw(r, H))
        T.add(p + "hnorm.weight", normw(r, H))
        linear(p + "eh_proj", H, 2 * H, "head")
        decoder_layer(m)
        T.add(p + "shared_head.norm.weight", normw(r, H))
        T.add(p + "shared_head.head.weight", lin(r, V, H, 2.0))
    return T


# --------------------------------------------------------------------------------------------- model specs
def ct_ignored(name, ignore):
    """compressed-tensors `is_match` for a module name (utils/match.py): "re:" entries use re.match (anchored at
    the start only), plain entries compare the whole name."""
    import re
    return any(re.match(e[3:], name) is not None if e.startswith("re:") else e == name for e in ignore)


def check_ct_ignore(cfg, stored):
    """Every INT4 tensor's module must be a quantization target, every BF16 Linear must be ignored."""
    ign = cfg["quantization_config"]["ignore"]
    n_q = n_f = 0
    for k, t in stored.items():
        if k.endswith(".weight_packed"):
            assert not ct_ignored(k[: -len(".weight_packed")], ign), k
            n_q += 1
        elif k.endswith(".weight") and t.dim() == 2 and "embed_tokens" not in k and not k.endswith("mlp.gate.weight"):
            assert ct_ignored(k[: -len(".weight")], ign), f"{k} is stored unquantized but not in the ignore list"
            n_f += 1
    assert n_q and n_f
    return n_q, n_f


def spec_llama_bf16():
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": [2, 5, 7],
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 176,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 640,
    }
    gc = {"bos_token_id": 1, "do_sample": True, "eos_token_id": [2, 5, 7], "temperature": 0.6, "top_p": 0.9,
          "transformers_version": "4.43.0.dev0"}
    return dict(config=cfg, gen=gc, dtype=torch.bfloat16, build=build_dense, seed=1000,
                purpose="Llama 3.1 layout: BF16, GQA 4/2, untied lm_head, llama3 rope scaling, rope_theta 5e5, "
                        "eos_token_id a list (config and generation_config).")


def spec_llama_f32_tied():
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_act": "silu",
        "hidden_size": 96,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": 160,
        "is_llama_config": True,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 6,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_interleaved": False,
        "rope_scaling": None,
        "rope_theta": 100000,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "transformers_version": "4.40.1",
        "use_cache": True,
        "vocab_size": 512,
    }
    gc = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 0, "transformers_version": "4.40.1"}

    def shards(names):
        # 3 shards; layer 0 is split between shards 1 and 2, layer 1 between shards 2 and 3
        s1, s2, s3 = [], [], []
        for n in names:
            if n == "model.embed_tokens.weight" or (n.startswith("model.layers.0.") and
                                                    ("self_attn" in n or "input_layernorm" in n)):
                s1.append(n)
            elif n.startswith("model.layers.0.") or (n.startswith("model.layers.1.") and
                                                     ("input_layernorm" in n or "q_proj" in n or "k_proj" in n)):
                s2.append(n)
            else:
                s3.append(n)
        return [s1, s2, s3]
    return dict(config=cfg, gen=gc, dtype=torch.float32, build=build_dense, seed=2000, shards=shards,
                purpose="SmolLM2-style Llama: F32, tied embeddings (no lm_head tensor), GQA 6/2, no rope scaling, "
                        "sharded into 3 files with model.safetensors.index.json; layers split across shards.")


def spec_qwen3_f16():
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 3,
        "eos_token_id": 4,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 40960,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 768,
    }
    gc = {"bos_token_id": 3, "do_sample": True, "eos_token_id": [4, 3], "pad_token_id": 3, "temperature": 0.6,
          "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}
    return dict(config=cfg, gen=gc, dtype=torch.float16, build=build_dense, seed=3000, qk_norm=True,
                purpose="Qwen3-0.6B layout: F16, head_dim 32 != hidden/heads (16), q_norm/k_norm per head, tied "
                        "embeddings, GQA 4/2, eos list in generation_config only.")


def spec_qwen3_moe_bf16():
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 3,
        "decoder_sparse_step": 1,
        "eos_token_id": 4,
        "head_dim": 24,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 40960,
        "max_window_layers": 3,
        "mlp_only_layers": [1],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 48,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 3,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 512,
    }
    gc = {"bos_token_id": 3, "do_sample": True, "eos_token_id": [4, 3], "pad_token_id": 3, "temperature": 0.6,
          "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}
    return dict(config=cfg, gen=gc, dtype=torch.bfloat16, build=build_dense, seed=4000, qk_norm=True, moe=True,
                purpose="Qwen3-30B-A3B layout: BF16, 8 experts top-2, norm_topk_prob true, decoder_sparse_step 1, "
                        "mlp_only_layers [1] (layer 1 dense with intermediate_size 128, layers 0 and 2 MoE with "
                        "moe_intermediate_size 48), head_dim 24, untied.")


def spec_qwen3_moe_v5cfg():
    # Written by transformers 5 itself (Qwen3MoeConfig.save_pretrained), so the style is exactly v5's:
    # `dtype`, `rope_parameters`, `num_local_experts`, no `head_dim` (defaults to hidden/heads).
    from transformers import Qwen3MoeConfig
    c = Qwen3MoeConfig(
        architectures=["Qwen3MoeForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=144,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 32768},
        decoder_sparse_step=2, moe_intermediate_size=40, num_experts_per_tok=2, num_local_experts=8,
        norm_topk_prob=False, mlp_only_layers=[], bos_token_id=3, eos_token_id=4, dtype="bfloat16",
        tie_word_embeddings=False)
    d = tempfile.mkdtemp()
    c.save_pretrained(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    shutil.rmtree(d)
    gc = {"bos_token_id": 3, "eos_token_id": 4, "transformers_version": cfg.get("transformers_version")}
    return dict(config=cfg, gen=gc, dtype=torch.bfloat16, build=build_dense, seed=5000, qk_norm=True, moe=True,
                purpose="Qwen3-MoE in the transformers>=5 config style (written by Qwen3MoeConfig.save_pretrained): "
                        "`dtype`, `rope_parameters` (YaRN factor 4 without mscale keys: attention_factor = "
                        "0.1*ln(4)+1), `num_local_experts` 8, no head_dim key; norm_topk_prob false, "
                        "decoder_sparse_step 2 (layers 1 and 3 MoE, 0 and 2 dense).")


DS_COMMON = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_layer_freq": 1,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
}


def ds_cfg(**kw):
    c = copy.deepcopy(DS_COMMON)
    c.update(kw)
    return dict(sorted(c.items()))


DS_GEN = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1, "do_sample": True,
          "temperature": 0.6, "top_p": 0.95, "transformers_version": "4.46.3"}


def spec_deepseek_v3_bf16():
    cfg = ds_cfg(
        first_k_dense_replace=1, hidden_size=64, intermediate_size=128, kv_lora_rank=32, moe_intermediate_size=32,
        n_group=4, n_routed_experts=16, n_shared_experts=1, norm_topk_prob=True, num_attention_heads=4,
        num_experts_per_tok=4, num_hidden_layers=3, num_key_value_heads=4, num_nextn_predict_layers=1,
        q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, routed_scaling_factor=2.5, topk_group=2,
        v_head_dim=12, vocab_size=512,
        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.8,
                      "original_max_position_embeddings": 4096, "type": "yarn"})
    return dict(config=cfg, gen=DS_GEN, build=build_deepseek, seed=6000,
                purpose="DeepSeek-V3 layout in BF16: MLA with q_lora_rank 48, kv_lora_rank 32, nope 16 / rope 8 / "
                        "v 12, 4 heads; YaRN factor 40 with mscale 1.0 != mscale_all_dim 0.8; rope_interleave "
                        "default (true); 16 routed experts top-4, n_group 4 / topk_group 2, noaux_tc sigmoid, "
                        "routed_scaling_factor 2.5, norm_topk_prob true, 1 shared expert, layer 0 dense, layers "
                        "1-2 MoE; MTP layer 3 (num_nextn_predict_layers 1) stored but unused by the reference.")


def spec_deepseek_v3_fp8():
    cfg = ds_cfg(
        first_k_dense_replace=1, hidden_size=72, intermediate_size=100, kv_lora_rank=48, moe_intermediate_size=40,
        n_group=4, n_routed_experts=16, n_shared_experts=1, norm_topk_prob=True, num_attention_heads=4,
        num_experts_per_tok=4, num_hidden_layers=3, num_key_value_heads=4, num_nextn_predict_layers=0,
        q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, routed_scaling_factor=2.5, topk_group=2,
        v_head_dim=12, vocab_size=512,
        quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                             "weight_block_size": [16, 32]},
        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096, "type": "yarn"})
    return dict(config=cfg, gen=DS_GEN, build=build_deepseek, seed=7000, quant=("fp8", [16, 32]),
                purpose="DeepSeek-V3 FP8 layout: float8_e4m3fn weights + F32 weight_scale_inv, weight_block_size "
                        "[16, 32] with partial edge blocks (hidden 72, intermediate 100, moe 40, kv_a out 56); "
                        "q_lora_rank null (plain q_proj); YaRN with mscale == mscale_all_dim (attention_factor 1).")


def spec_kimi_k2_int4():
    cfg = ds_cfg(
        bos_token_id=163, eos_token_id=164, first_k_dense_replace=1, hidden_size=64, intermediate_size=128,
        kv_lora_rank=32, max_position_embeddings=262144, model_type="kimi_k2", moe_intermediate_size=64, n_group=1,
        n_routed_experts=16, n_shared_experts=1, norm_topk_prob=True, num_attention_heads=4, num_experts_per_tok=4,
        num_hidden_layers=3, num_key_value_heads=4, num_nextn_predict_layers=0, q_lora_rank=48, qk_nope_head_dim=16,
        qk_rope_head_dim=8, rms_norm_eps=1e-05, rope_theta=50000.0, routed_scaling_factor=2.827, topk_group=1,
        v_head_dim=16, vocab_size=640, transformers_version="4.56.2",
        rope_scaling={"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096, "type": "yarn"},
        quantization_config={
            "config_groups": {
                "group_0": {
                    "input_activations": None,
                    "output_activations": None,
                    "targets": ["Linear"],
                    "weights": {
                        "actorder": None, "block_structure": None, "dynamic": False, "group_size": 32,
                        "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                        "symmetric": True, "type": "int"}}},
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed"})
    gc = {"max_length": 262144, "eos_token_id": 164, "transformers_version": "4.56.2"}
    return dict(config=cfg, gen=gc, build=build_deepseek, seed=8000, quant=("int4", 32),
                purpose="Kimi-K2-Thinking layout: model_type kimi_k2, compressed-tensors pack-quantized INT4 "
                        "group 32 symmetric for routed experts only (ignore list: lm_head + re: entries for "
                        "self_attn, shared_experts and the dense mlp); n_group 1 / topk_group 1, "
                        "routed_scaling_factor 2.827, YaRN factor 64 with beta_fast = beta_slow = 1.")


def spec_deepseek_v3_noyarn():
    cfg = ds_cfg(
        first_k_dense_replace=1, hidden_size=64, intermediate_size=96, kv_lora_rank=32, moe_intermediate_size=32,
        n_group=1, n_routed_experts=8, n_shared_experts=2, norm_topk_prob=False, num_attention_heads=2,
        num_experts_per_tok=3, num_hidden_layers=2, num_key_value_heads=2, num_nextn_predict_layers=0,
        q_lora_rank=32, qk_nope_head_dim=24, qk_rope_head_dim=16, routed_scaling_factor=1.5, topk_group=1,
        v_head_dim=20, vocab_size=512, max_position_embeddings=4096)
    return dict(config=cfg, gen=DS_GEN, build=build_deepseek, seed=9000,
                purpose="DeepSeek-V3 without rope_scaling (plain RoPE, softmax scale qk_head_dim^-0.5), "
                        "norm_topk_prob false, n_group 1, 2 shared experts (shared intermediate 64), "
                        "routed_scaling_factor 1.5.")


# More routed experts per token than the old fixed arrays of 64 held (issue: a config.json with
# num_experts_per_tok 70 crashed the engine): the engine sizes its buffers from the config.
def spec_qwen3_moe_k70():
    cfg = dict(spec_qwen3_moe_bf16()["config"])
    cfg.update(num_experts=80, num_experts_per_tok=70, moe_intermediate_size=8, num_hidden_layers=2,
               mlp_only_layers=[], max_window_layers=2)
    gc = {"bos_token_id": 3, "eos_token_id": [4, 3], "transformers_version": "4.51.0"}
    return dict(config=cfg, gen=gc, dtype=torch.bfloat16, build=build_dense, seed=4700, qk_norm=True, moe=True,
                purpose="Qwen3-MoE with 70 of 80 experts per token (more than 64), width 8, norm_topk_prob, "
                        "2 MoE layers.")


def spec_deepseek_v3_k70():
    cfg = ds_cfg(
        first_k_dense_replace=1, hidden_size=64, intermediate_size=128, kv_lora_rank=32, moe_intermediate_size=8,
        n_group=4, n_routed_experts=96, n_shared_experts=1, norm_topk_prob=True, num_attention_heads=4,
        num_experts_per_tok=70, num_hidden_layers=2, num_key_value_heads=4, num_nextn_predict_layers=0,
        q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, routed_scaling_factor=2.5, topk_group=3,
        v_head_dim=16, vocab_size=512)
    return dict(config=cfg, gen=DS_GEN, build=build_deepseek, seed=9700,
                purpose="DeepSeek-V3 with 70 of 96 experts per token (more than 64) from 3 of 4 groups of 24, "
                        "width 8, 1 shared expert, layer 0 dense, layer 1 MoE.")


SPECS = {
    "qwen3-moe-k70": spec_qwen3_moe_k70,
    "deepseek-v3-k70": spec_deepseek_v3_k70,
    "llama-bf16": spec_llama_bf16,
    "llama-f32-tied": spec_llama_f32_tied,
    "qwen3-f16": spec_qwen3_f16,
    "qwen3-moe-bf16": spec_qwen3_moe_bf16,
    "qwen3-moe-v5cfg": spec_qwen3_moe_v5cfg,
    "deepseek-v3-bf16": spec_deepseek_v3_bf16,
    "deepseek-v3-fp8": spec_deepseek_v3_fp8,
    "kimi-k2-int4": spec_kimi_k2_int4,
    "deepseek-v3-noyarn": spec_deepseek_v3_noyarn,
}



# Source checkpoints of the K-quant GGUF test files (tools/make_gguf_moe.py): every quantized row is a multiple
# of 256 values, as K-quant blocks need. Not committed (a few MB each); make_gguf_moe.py writes them to a
# temporary directory and keeps only the GGUF files and transformers' logits for them.
def spec_qwen3_moe_k256():
    cfg = dict(spec_qwen3_moe_bf16()["config"])
    cfg.update(head_dim=64, hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_experts=4,
               num_hidden_layers=2, mlp_only_layers=[], max_window_layers=2)
    gc = {"bos_token_id": 3, "eos_token_id": [4, 3], "transformers_version": "4.51.0"}
    return dict(config=cfg, gen=gc, dtype=torch.bfloat16, build=build_dense, seed=4500, qk_norm=True, moe=True,
                max_bytes=8e6,
                purpose="Qwen3-MoE with K-quant-sized rows: hidden 256, 4 heads x 64, 2 KV heads, 4 experts of width "
                        "256, top-2, 2 MoE layers.")


def spec_deepseek_v3_k256():
    cfg = ds_cfg(
        first_k_dense_replace=1, hidden_size=256, intermediate_size=512, kv_lora_rank=256, moe_intermediate_size=256,
        n_group=2, n_routed_experts=8, n_shared_experts=1, norm_topk_prob=True, num_attention_heads=4,
        num_experts_per_tok=2, num_hidden_layers=2, num_key_value_heads=4, num_nextn_predict_layers=0,
        q_lora_rank=256, qk_nope_head_dim=32, qk_rope_head_dim=32, routed_scaling_factor=2.5, topk_group=1,
        v_head_dim=64, vocab_size=512,
        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096, "type": "yarn"})
    return dict(config=cfg, gen=DS_GEN, build=build_deepseek, seed=6500, max_bytes=8e6,
                purpose="DeepSeek-V3 with K-quant-sized rows: hidden 256, q_lora 256, kv_lora 256, 4 heads (nope 32, "
                        "rope 32, v 64), 8 experts of width 256 top-2 (n_group 2 / topk_group 1), 1 shared expert, "
                        "layer 0 dense (512), layer 1 MoE.")


K256_SPECS = {
    "qwen3-moe-k256": spec_qwen3_moe_k256,
    "deepseek-v3-k256": spec_deepseek_v3_k256,
}

# --------------------------------------------------------------------------------------------- writing
def write_json(path, obj, compact_lists=False):
    text = json.dumps(obj, indent=2)
    if compact_lists:  # keep id lists on one line
        import re
        text = re.sub(r"\[\s+([-0-9,\s]+?)\s+\]", lambda m: "[" + ", ".join(m.group(1).split(",")).replace(
            "  ", "").replace("\n", "").replace(" ,", ",") + "]", text)
        text = re.sub(r"\[([-0-9, ]+)\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                      text)
    with open(path, "w") as f:
        f.write(text + "\n")


def write_weights(d, stored, shards_fn=None):
    from safetensors.torch import save_file
    names = list(stored.keys())
    if shards_fn is None:
        save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return
    groups = shards_fn(names)
    assert sorted(sum(groups, [])) == sorted(names)
    n = len(groups)
    weight_map, total = {}, 0
    for k, g in enumerate(groups):
        fn = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        save_file({x: stored[x] for x in g}, os.path.join(d, fn), metadata={"format": "pt"})
        for x in g:
            weight_map[x] = fn
            total += stored[x].numel() * stored[x].element_size()
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


# --------------------------------------------------------------------------------------------- reference
class RouterProbe:
    """Records the minimum gap at every router decision boundary (hooks on the router modules)."""

    def __init__(self, model, cfg):
        self.min_gap = float("inf")
        self.where = None
        self.handles = []
        for name, mod in model.named_modules():
            cls = type(mod).__name__
            if cls == "DeepseekV3TopkRouter":
                self.handles.append(mod.register_forward_pre_hook(self._ds(name, mod)))
            elif cls == "Qwen3MoeTopKRouter":
                self.handles.append(mod.register_forward_pre_hook(self._qw(name, mod)))

    def _note(self, gap, name):
        if gap < self.min_gap:
            self.min_gap, self.where = gap, name

    def _qw(self, name, mod):
        def hook(m, args):
            h = args[0].reshape(-1, m.hidden_dim)
            logits = F.linear(h, m.weight).sort(-1, descending=True).values
            k = m.top_k
            self._note(float((logits[:, k - 1] - logits[:, k]).min()), name)
        return hook

    def _ds(self, name, mod):
        def hook(m, args):
            h = args[0].reshape(-1, m.hidden_dim).float()
            s = F.linear(h, m.weight.float()).sigmoid() + m.e_score_correction_bias
            G, E, k, tg = m.num_group, m.num_experts, m.top_k, m.topk_group
            if G > 1 and tg < G:
                gs = s.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1).sort(-1, descending=True)
                self._note(float((gs.values[:, tg - 1] - gs.values[:, tg]).min()), name + "[group]")
                gidx = gs.indices[:, :tg]
                mask = torch.zeros(s.shape[0], G, dtype=torch.bool).scatter_(1, gidx, True)
                mask = mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
                s = s.masked_fill(~mask, float("-inf"))
            ss = s.sort(-1, descending=True).values
            if k < ss.shape[1]:
                gap = ss[:, k - 1] - ss[:, k]
                gap = torch.where(torch.isfinite(gap), gap, torch.full_like(gap, float("inf")))
                self._note(float(gap.min()), name)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def logit_gap(row):
    t = torch.topk(row, 2)
    top1, top2 = float(t.values[0]), float(t.values[1])
    return (top1 - top2) / max(1.0, abs(top1))


def load_model(d, cls=None):
    import transformers
    from transformers import AutoModelForCausalLM
    kw = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if cls is None:
        model, info = AutoModelForCausalLM.from_pretrained(d, **kw)
    else:
        cfg = transformers.DeepseekV3Config.from_pretrained(d)
        model, info = cls.from_pretrained(d, config=cfg, **kw)
    model.eval()
    return model, info


def check_loaded(model, info, T, cfg, allow_unexpected_prefix):
    if info.get("missing_keys"):
        raise RuntimeError(f"missing keys when loading: {sorted(info['missing_keys'])[:10]}")
    if info.get("mismatched_keys"):
        raise RuntimeError(f"mismatched keys: {info['mismatched_keys']}")
    unexpected = sorted(info.get("unexpected_keys") or [])
    bad = [k for k in unexpected if not (allow_unexpected_prefix and k.startswith(allow_unexpected_prefix))]
    if bad:
        raise RuntimeError(f"unexpected keys: {bad[:10]}")
    # every reference tensor must be what the model holds (experts are fused by transformers 5's loader)
    sd = model.state_dict()
    n_checked = 0
    for name, t in T.ref.items():
        if allow_unexpected_prefix and name.startswith(allow_unexpected_prefix):
            continue
        if name in sd:
            assert torch.equal(sd[name].float(), t), name
            n_checked += 1
            continue
        if ".mlp.experts." in name:
            pre, rest = name.split(".mlp.experts.")
            e, proj = int(rest.split(".")[0]), rest.split(".")[1]
            if proj == "down_proj":
                w = sd[pre + ".mlp.experts.down_proj"][e]
            else:
                gu = sd[pre + ".mlp.experts.gate_up_proj"][e]
                half = gu.shape[0] // 2
                w = gu[:half] if proj == "gate_proj" else gu[half:]
            assert torch.equal(w.float(), t), name
            n_checked += 1
            continue
        raise RuntimeError(f"tensor {name} not found in the loaded model")
    if cfg.get("tie_word_embeddings"):
        assert torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"])
    return unexpected, n_checked


@torch.no_grad()
def reference(model, ids, prompt, V):
    out = model(torch.tensor([ids])).logits[0].float()
    assert out.shape == (len(ids), V), out.shape
    gaps = [logit_gap(out[i]) for i in range(len(ids))]
    seq = list(prompt)
    greedy, ggaps = [], []
    for _ in range(GREEDY_NEW):
        row = model(torch.tensor([seq])).logits[0, -1].float()
        nxt = int(torch.argmax(row))
        ggaps.append(logit_gap(row))
        greedy.append(nxt)
        seq.append(nxt)
    return out, gaps, greedy, ggaps


@torch.no_grad()
def greedy_with_generate(model, prompt):
    """Cross-check of the no-cache greedy loop with transformers' generate (KV cache), EOS disabled."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    out = model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_NEW, do_sample=False,
                         eos_token_id=None, pad_token_id=0, temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt):].tolist()


def dir_size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def make_one(name, out_root, verbose=True):
    import transformers
    spec = (SPECS.get(name) or K256_SPECS[name])()
    cfg = spec["config"]
    V = cfg["vocab_size"]
    is_ds = spec["build"] is build_deepseek
    d = os.path.join(out_root, name)
    mtp_prefix = None
    if is_ds and cfg.get("num_nextn_predict_layers", 0) > 0:
        mtp_prefix = f"model.layers.{cfg['num_hidden_layers']}."

    for attempt in range(MAX_ATTEMPTS):
        seed = spec["seed"] + attempt
        r = Rng(seed)
        T = spec["build"](spec, r)
        if spec.get("quant", ("",))[0] == "int4":
            check_ct_ignore(cfg, T.stored)
        ids_r = Rng(seed + 100000)
        ids = ids_r.ints(SEQ_LEN, V)
        ids[0] = cfg["bos_token_id"] if isinstance(cfg.get("bos_token_id"), int) else ids[0]
        prompt = ids_r.ints(GREEDY_PROMPT, V)

        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
        write_json(os.path.join(d, "config.json"), cfg)
        write_json(os.path.join(d, "generation_config.json"), spec["gen"])
        write_weights(d, T.stored, spec.get("shards"))

        tmp = None
        if spec.get("quant") or cfg.get("model_type") == "kimi_k2":
            # reference on the dequantized values: a float32 checkpoint with the same config minus quantization
            tmp = tempfile.mkdtemp(prefix="dfref_")
            rcfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
            rcfg["torch_dtype"] = "float32"
            if rcfg.get("model_type") == "kimi_k2":
                # transformers 5 picks its checkpoint conversion (per-expert tensors -> fused experts) by
                # config.model_type; with "kimi_k2" the experts would silently stay uninitialized.
                rcfg["model_type"] = "deepseek_v3"
            write_json(os.path.join(tmp, "config.json"), rcfg)
            write_weights(tmp, T.ref)
            cls = transformers.DeepseekV3ForCausalLM if cfg["model_type"] == "kimi_k2" else None
            model, info = load_model(tmp, cls)
        else:
            model, info = load_model(d)
        unexpected, n_checked = check_loaded(model, info, T, cfg, mtp_prefix)

        probe = RouterProbe(model, cfg)
        logits, gaps, greedy, ggaps = reference(model, ids, prompt, V)
        probe.remove()
        ok = min(gaps) > LOGIT_GAP_REL and min(ggaps) > LOGIT_GAP_REL and probe.min_gap > ROUTER_GAP
        if verbose:
            print(f"  [{name}] seed {seed}: min logit gap (rel) teacher {min(gaps):.2e} greedy {min(ggaps):.2e}; "
                  f"router min gap {probe.min_gap:.2e} at {probe.where}; {'OK' if ok else 'retry'}", flush=True)
        if not ok:
            if tmp:
                shutil.rmtree(tmp)
            continue
        gen_greedy = None
        try:
            gen_greedy = greedy_with_generate(model, prompt)
        except Exception as ex:  # noqa: BLE001
            print(f"  [{name}] generate() cross-check failed to run: {ex}")
        if gen_greedy is not None and gen_greedy != greedy:
            raise RuntimeError(f"{name}: generate() greedy {gen_greedy} != no-cache greedy {greedy}")
        if tmp:
            shutil.rmtree(tmp)
        break
    else:
        raise RuntimeError(f"{name}: no seed without near-ties in {MAX_ATTEMPTS} attempts")

    logits.numpy().astype("<f4").tofile(os.path.join(d, "golden_logits.f32"))
    notes = spec["purpose"] + f" Seed {seed}. Teacher-forced logits for `ids` in one forward pass; greedy = " \
        f"{GREEDY_NEW} argmax steps after `greedy_prompt`, no EOS stopping (also checked against generate() with " \
        f"KV cache). Min relative top1-top2 gap: teacher {min(gaps):.3g}, greedy {min(ggaps):.3g}; min router " \
        f"selection gap {probe.min_gap:.3g}."
    if spec.get("quant"):
        notes += " Reference computed on the dequantized weights (float32 checkpoint, quantization_config removed)."
    if mtp_prefix:
        notes += f" MTP tensors ({mtp_prefix}*) are not used by transformers (reported as unexpected keys)."
    golden = {
        "ids": ids,
        "logits": "golden_logits.f32",
        "vocab_size": V,
        "greedy_prompt": prompt,
        "greedy": greedy,
        "reference": f"transformers {'.'.join(transformers.__version__.split('.')[:2])} float32",
        "reference_full": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, "
                          f"attn_implementation=eager",
        "min_logit_gap_rel": min(gaps),
        "min_greedy_gap_rel": min(ggaps),
        "min_router_gap": None if probe.min_gap == float("inf") else probe.min_gap,
        "seed": seed,
        "notes": notes,
    }
    write_json(os.path.join(d, "golden.json"), golden, compact_lists=True)
    size = dir_size(d)
    if verbose:
        print(f"  [{name}] wrote {d}: {size / 1e6:.3f} MB, {len(T.stored)} tensors, {n_checked} verified in the "
              f"loaded model, unexpected keys ignored: {len(unexpected)}", flush=True)
    assert size < spec.get("max_bytes", 1.5e6), f"{name} too big: {size}"
    return d


@torch.no_grad()
def verify(name, out_root):
    """Reload the written directory (dequantizing FP8/INT4 from the stored bytes, independently of the writer)
    and check that the goldens reproduce."""
    import transformers
    from safetensors.torch import load_file
    d = os.path.join(out_root, name)
    cfg = json.load(open(os.path.join(d, "config.json")))
    g = json.load(open(os.path.join(d, "golden.json")))
    V = g["vocab_size"]
    ref = np.fromfile(os.path.join(d, g["logits"]), dtype="<f4").reshape(len(g["ids"]), V)
    q = cfg.get("quantization_config")
    tmp = None
    if q or cfg["model_type"] == "kimi_k2":
        st = {}
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        for f in files:
            st.update(load_file(os.path.join(d, f)))
        out = {}
        for k, t in st.items():
            if k.endswith("_scale_inv") or k.endswith(".weight_scale") or k.endswith(".weight_shape"):
                continue
            if k.endswith(".weight") and t.dtype == torch.float8_e4m3fn:
                out[k] = cq.fp8_block_dequant(t, st[k + "_scale_inv"], q["weight_block_size"])
            elif k.endswith(".weight_packed"):
                p = k[: -len("_packed")]
                gs = q["config_groups"]["group_0"]["weights"]["group_size"]
                out[p] = cq.int4_dequant(t, st[p + "_scale"], st[p + "_shape"], gs)
            else:
                out[k] = t.float()
        tmp = tempfile.mkdtemp(prefix="dfver_")
        rcfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
        if rcfg["model_type"] == "kimi_k2":
            rcfg["model_type"] = "deepseek_v3"
        write_json(os.path.join(tmp, "config.json"), rcfg)
        write_weights(tmp, out)
        model, _ = load_model(tmp, transformers.DeepseekV3ForCausalLM if cfg["model_type"] == "kimi_k2" else None)
        shutil.rmtree(tmp)
    else:
        model, _ = load_model(d)
    got = model(torch.tensor([g["ids"]])).logits[0].float().numpy()
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    same_argmax = bool((got.argmax(1) == ref.argmax(1)).all())
    seq = list(g["greedy_prompt"])
    for _ in range(GREEDY_NEW):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    greedy_ok = seq[len(g["greedy_prompt"]):] == g["greedy"]
    top = np.sort(ref, axis=1)
    gap = (top[:, -1] - top[:, -2]) / np.maximum(1.0, np.abs(top[:, -1]))
    print(f"  verify {name}: max rel L2 {rel.max():.2e}, argmax same {same_argmax}, greedy same {greedy_ok}, "
          f"top1-top2 rel gap min {gap.min():.3e} median {np.median(gap):.3e}")
    assert rel.max() < 1e-5 and same_argmax and greedy_ok, name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/models")
    ap.add_argument("--only", action="append", help="model name (repeatable)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--verify-only", action="store_true", help="only reload existing directories and check")
    a = ap.parse_args()
    if a.list:
        print("\n".join(SPECS))
        return
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    names = a.only or list(SPECS)
    for n in names:
        if n not in SPECS:
            sys.exit(f"unknown model {n}; known: {', '.join(SPECS)}")
    os.makedirs(a.out, exist_ok=True)
    for n in names:
        print(f"{n}:", flush=True)
        if not a.verify_only:
            make_one(n, a.out)
        verify(n, a.out)


if __name__ == "__main__":
    main()
