#!/usr/bin/env python3
"""Write GGUF MoE test files from the tiny safetensors checkpoints, the way llama.cpp's converter
(convert_hf_to_gguf.py) lays them out, with the `gguf` package's GGUFWriter:

    python3 tools/make_gguf_moe.py --out tests/data/gguf_moe            # all files (+ transformers goldens when torch is present)
    python3 tools/make_gguf_moe.py --out DIR --no-golden                 # GGUF files only (numpy + gguf)

Architectures and what the converter does to each tensor (docs/GGUF.md, "MoE GGUF files"):

- `qwen3moe` (Qwen3MoeModel): names mapped, routed experts stacked into `blk.N.ffn_{gate,up,down}_exps`
  [E, out, in] (GGUF ne [in, out, E]); no q/k permutation (NEOX RoPE). A layer listed in `mlp_only_layers`
  keeps its dense `ffn_{gate,up,down}` (llama.cpp itself needs every layer MoE; Deltafin takes either).
- `deepseek2` (DeepseekV2Model, also DeepSeek-V3/R1 and Kimi K2): MTP layers dropped, experts stacked,
  `head_count_kv` 1, `key_length` = kv_lora + rope / `value_length` = kv_lora with the per-head sizes in
  `key_length_mla` / `value_length_mla`, and `kv_b_proj` split per head into `attn_k_b` = W_uk transposed
  (ne [nope, kv_lora, heads]) and `attn_v_b` = W_uv (ne [kv_lora, v, heads]). `--legacy-kvb` writes the
  older layout (one `attn_kv_b`, key_length = nope + rope, value_length = v, no _mla keys).
  `yarn_log_multiplier` = 0.1 * mscale_all_dim (the converter's legacy factor). The converter does not
  store `mscale`; our deepseek-v3-bf16 checkpoint has mscale 1.0 != mscale_all_dim 0.8, so its cos/sin
  factor (transformers' attention_factor) is recorded in the standard key `rope.scaling.yarn_attn_factor`,
  which the converter writes whenever a config gives `attention_factor`.

Types, as the converter's --outtype: `bf16` (2-D+ weights BF16; 1-D tensors, `*_norm.weight`,
`ffn_gate_inp` and non-`.weight` tensors F32) and `q8_0` (the same with Q8_0, falling back to F16 where a
row is not a multiple of 32). K-quants need rows that are multiples of 256, which the hidden-64 checkpoints
never have, so the K-quant files (`q4_k_m`, `q2_k`: mixes of Q2_K..Q6_K, see KMIX) are converted from two
wider checkpoints (make_checkpoints.K256_SPECS, hidden 256, written to a temporary directory) and quantized
with tools/kquant.py (round-to-nearest; gguf-py has dequantizers but no K-quant quantizers).

Goldens: where transformers loads the GGUF (qwen3moe; transformers 5.24 has no deepseek2 GGUF support),
`<name>.golden.json` + `<name>.logits.f32` hold transformers' float32 logits for the source checkpoint's
golden ids, like tools/make_checkpoints.py. For the K-quant files of both architectures the golden also holds
16 greedy tokens; deepseek2's is transformers on a checkpoint of gguf-py's dequantized values.

    python3 tools/make_gguf_moe.py --only deepseek2-q2_k.gguf            # one file (repeatable)
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kquant  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "tests", "data", "models")
QT = gguf.GGMLQuantizationType


# ------------------------------------------------------------------------------------------ safetensors
def read_safetensors(path):
    """name -> (dtype string, numpy array); BF16 stays raw uint16."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        buf = f.read()
    out = {}
    np_of = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "I32": np.int32, "I64": np.int64}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        a = np.frombuffer(buf[s:e], dtype=np_of[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], a)
    return out


def read_checkpoint(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    t = {}
    for f in files:
        t.update(read_safetensors(os.path.join(d, f)))
    return t


def write_safetensors(path, tensors):
    """tensors: name -> float32 array (written F32)."""
    hdr, off, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        hdr[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def f32(dt_arr):
    dt, a = dt_arr
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def bf16_raw(dt_arr):
    dt, a = dt_arr
    assert dt == "BF16", dt
    return a


# ------------------------------------------------------------------------------------------ conversion
class Out:
    """Collects (name, value, kind) where kind is 'w' (a weight following the outtype) or 'f32'."""

    def __init__(self):
        self.items = []

    def w(self, name, arr):
        self.items.append((name, arr, "w"))

    def f32(self, name, arr):
        self.items.append((name, arr, "f32"))


def stack(t, fmt, n):
    return [t[fmt.format(e=e)] for e in range(n)]


def stacked(parts):
    dts = {p[0] for p in parts}
    assert len(dts) == 1
    return (dts.pop(), np.stack([p[1] for p in parts], 0))


def convert_qwen3moe(cfg, t, out, w):
    L, E = cfg["num_hidden_layers"], cfg.get("num_experts") or cfg["num_local_experts"]
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    hd = cfg.get("head_dim")
    if hd is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if not cfg.get("norm_topk_prob", False):
        w.add_expert_weights_norm(False)  # llama.cpp always normalises qwen3moe; record the config's choice
    out.w("token_embd.weight", t["model.embed_tokens.weight"])
    out.f32("output_norm.weight", t["model.norm.weight"])
    if "lm_head.weight" in t:
        out.w("output.weight", t["lm_head.weight"])
    for l in range(L):
        p = f"model.layers.{l}."
        b = f"blk.{l}."
        out.f32(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        out.f32(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            out.w(b + gg + ".weight", t[p + "self_attn." + hf + ".weight"])
        out.f32(b + "attn_q_norm.weight", t[p + "self_attn.q_norm.weight"])
        out.f32(b + "attn_k_norm.weight", t[p + "self_attn.k_norm.weight"])
        if p + "mlp.gate.weight" in t:
            out.f32(b + "ffn_gate_inp.weight", t[p + "mlp.gate.weight"])
            for pr in ("gate", "up", "down"):
                out.w(b + f"ffn_{pr}_exps.weight", stacked(stack(t, p + "mlp.experts.{e}." + pr + "_proj.weight", E)))
        else:
            for pr in ("gate", "up", "down"):
                out.w(b + f"ffn_{pr}.weight", t[p + f"mlp.{pr}_proj.weight"])


def yarn_attention_factor(rs):
    f = rs["factor"]
    if rs.get("attention_factor") is not None:
        return rs["attention_factor"]
    ms, msa = rs.get("mscale"), rs.get("mscale_all_dim")
    g = lambda s, m=1.0: 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    return g(f, ms) / g(f, msa) if ms and msa else g(f)


def convert_deepseek2(cfg, t, out, w, legacy_kvb=False):
    L, E, NH = cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["num_attention_heads"]
    nope, rope, vd, R = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(NH)
    w.add_head_count_kv(NH if legacy_kvb else 1)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_group_count(cfg.get("n_group", 1))
    w.add_expert_group_used_count(cfg.get("topk_group", 1))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if cfg.get("scoring_func", "sigmoid") == "sigmoid" else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(R)
    if legacy_kvb:
        w.add_key_length(nope + rope)
        w.add_value_length(vd)
    else:
        w.add_key_length(R + rope)
        w.add_value_length(R)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(vd)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    rs = cfg.get("rope_scaling") or {}
    if (rs.get("type") or rs.get("rope_type")) == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs.get("original_max_position_embeddings", cfg["max_position_embeddings"]))
        if rs.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(rs["beta_fast"])
        if rs.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(rs["beta_slow"])
        if rs.get("mscale_all_dim") is not None:
            w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])
        if rs.get("attention_factor") is not None or (rs.get("mscale") or 0) != (rs.get("mscale_all_dim") or 0):
            w.add_rope_scaling_yarn_attn_factor(yarn_attention_factor(rs))
    out.w("token_embd.weight", t["model.embed_tokens.weight"])
    out.f32("output_norm.weight", t["model.norm.weight"])
    if "lm_head.weight" in t and not cfg.get("tie_word_embeddings"):
        out.w("output.weight", t["lm_head.weight"])
    for l in range(L):  # MTP layers (index >= num_hidden_layers) are skipped, as the converter does
        p = f"model.layers.{l}."
        b = f"blk.{l}."
        a = p + "self_attn."
        out.f32(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        out.f32(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
        if cfg.get("q_lora_rank"):
            out.w(b + "attn_q_a.weight", t[a + "q_a_proj.weight"])
            out.f32(b + "attn_q_a_norm.weight", t[a + "q_a_layernorm.weight"])
            out.w(b + "attn_q_b.weight", t[a + "q_b_proj.weight"])
        else:
            out.w(b + "attn_q.weight", t[a + "q_proj.weight"])
        out.w(b + "attn_kv_a_mqa.weight", t[a + "kv_a_proj_with_mqa.weight"])
        out.f32(b + "attn_kv_a_norm.weight", t[a + "kv_a_layernorm.weight"])
        dt, kvb = t[a + "kv_b_proj.weight"]
        if legacy_kvb:
            out.w(b + "attn_kv_b.weight", (dt, kvb))
        else:
            kv = kvb.reshape(NH, nope + vd, R)
            out.w(b + "attn_k_b.weight", (dt, np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1))))  # [NH, R, nope]
            out.w(b + "attn_v_b.weight", (dt, np.ascontiguousarray(kv[:, nope:, :])))                     # [NH, v, R]
        out.w(b + "attn_output.weight", t[a + "o_proj.weight"])
        if p + "mlp.gate.weight" in t:
            out.f32(b + "ffn_gate_inp.weight", t[p + "mlp.gate.weight"])
            out.f32(b + "exp_probs_b.bias", t[p + "mlp.gate.e_score_correction_bias"])
            for pr in ("gate", "up", "down"):
                out.w(b + f"ffn_{pr}_exps.weight", stacked(stack(t, p + "mlp.experts.{e}." + pr + "_proj.weight", E)))
            if cfg.get("n_shared_experts"):
                for pr in ("gate", "up", "down"):
                    out.w(b + f"ffn_{pr}_shexp.weight", t[p + f"mlp.shared_experts.{pr}_proj.weight"])
        else:
            for pr in ("gate", "up", "down"):
                out.w(b + f"ffn_{pr}.weight", t[p + f"mlp.{pr}_proj.weight"])


# K-quant mixes in the spirit of llama-quantize's Q4_K_M and Q2_K: the bulk of the weights in the file's main
# type, the tensors llama.cpp protects (attn_v, ffn_down, output) one or two types up; between them every K type
# is used by some expert tensor. Rows that are not a multiple of 256 fall back to Q8_0 (or F16 when not a
# multiple of 32), as llama-quantize falls back for attn_k_b (row = qk_nope_head_dim).
KMIX = {
    "q4_k_m": [("output.", QT.Q6_K), ("token_embd.", QT.Q4_K), ("attn_v", QT.Q6_K), ("ffn_down", QT.Q6_K),
               ("", QT.Q4_K)],
    "q2_k": [("output.", QT.Q6_K), ("token_embd.", QT.Q2_K), ("ffn_gate_exps", QT.Q2_K), ("ffn_up_exps", QT.Q2_K),
             ("ffn_down_exps", QT.Q3_K), ("_shexp", QT.Q5_K), ("attn_v", QT.Q5_K), ("attn_output", QT.Q4_K),
             ("", QT.Q3_K)],
}


def kmix_type(mix, name, row):
    qt = next(t for key, t in KMIX[mix] if key in name)
    if row % 256:
        qt = QT.Q8_0 if row % 32 == 0 else QT.F16
    return qt


def write_gguf(src, path, outtype="bf16", legacy_kvb=False, mutate=None, split_max_tensors=0):
    """Converts checkpoint directory src into path. mutate(items) may edit the (name, value, kind)
    list before writing (tests use it to make bad files); a value may also be (qtype, raw uint8 bytes).
    split_max_tensors > 0 writes split parts (path's stem + -0000k-of-0000N.gguf), as gguf-split does."""
    cfg = json.load(open(os.path.join(src, "config.json")))
    t = read_checkpoint(src)
    arch = {"qwen3_moe": "qwen3moe", "deepseek_v3": "deepseek2", "kimi_k2": "deepseek2"}[cfg["model_type"]]
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    w.add_name(os.path.basename(os.path.normpath(src)))
    out = Out()
    if arch == "qwen3moe":
        convert_qwen3moe(cfg, t, out, w)
    else:
        convert_deepseek2(cfg, t, out, w, legacy_kvb)
    w.add_file_type({"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q2_k": gguf.LlamaFileType.MOSTLY_Q2_K}[outtype])
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(cfg["bos_token_id"])
    if isinstance(cfg.get("eos_token_id"), int):
        w.add_eos_token_id(cfg["eos_token_id"])
    if mutate:
        mutate(out.items)
    for name, val, kind in out.items:
        if isinstance(val, tuple) and isinstance(val[0], QT):  # raw bytes of a given type
            w.add_tensor(name, val[1], raw_dtype=val[0])
        elif kind == "f32" or val[1].ndim <= 1:
            w.add_tensor(name, f32(val))
        elif outtype == "bf16":
            w.add_tensor(name, bf16_raw(val), raw_dtype=QT.BF16)
        elif outtype in KMIX:
            qt = kmix_type(outtype, name, val[1].shape[-1])
            x = f32(val)
            if qt == QT.F16:
                w.add_tensor(name, x.astype(np.float16))
            elif qt == QT.Q8_0:
                w.add_tensor(name, gguf.quants.quantize(x, QT.Q8_0), raw_dtype=QT.Q8_0)
            else:
                w.add_tensor(name, kquant.QUANTIZERS[qt.name](x), raw_dtype=qt)
        else:
            x = f32(val)
            if x.shape[-1] % 32 == 0:
                w.add_tensor(name, gguf.quants.quantize(x, QT.Q8_0), raw_dtype=QT.Q8_0)
            else:  # as the converter: rows that do not fit Q8_0 blocks fall back to F16
                w.add_tensor(name, x.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg


# ------------------------------------------------------------------------------------------ dequantized checkpoint
def dequantized_checkpoint(gguf_path, src, out_dir):
    """An HF checkpoint (F32 safetensors + src's config.json) holding exactly the values the GGUF file
    stores (gguf.quants.dequantize), under the HF names; MTP layers are not included."""
    cfg = json.load(open(os.path.join(src, "config.json")))
    r = gguf.GGUFReader(gguf_path)
    g = {}
    for tt in r.tensors:
        shape = [int(x) for x in reversed(tt.shape.tolist())]
        g[tt.name] = gguf.quants.dequantize(tt.data, tt.tensor_type).reshape(shape).astype(np.float32)
    hf = {}
    L = cfg["num_hidden_layers"]
    hf["model.embed_tokens.weight"] = g["token_embd.weight"]
    hf["model.norm.weight"] = g["output_norm.weight"]
    if "output.weight" in g:
        hf["lm_head.weight"] = g["output.weight"]
    ds = cfg["model_type"] != "qwen3_moe"
    for l in range(L):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        a = p + "self_attn."
        hf[p + "input_layernorm.weight"] = g[b + "attn_norm.weight"]
        hf[p + "post_attention_layernorm.weight"] = g[b + "ffn_norm.weight"]
        if ds:
            NH, nope, vd, R = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
            if cfg.get("q_lora_rank"):
                hf[a + "q_a_proj.weight"] = g[b + "attn_q_a.weight"]
                hf[a + "q_a_layernorm.weight"] = g[b + "attn_q_a_norm.weight"]
                hf[a + "q_b_proj.weight"] = g[b + "attn_q_b.weight"]
            else:
                hf[a + "q_proj.weight"] = g[b + "attn_q.weight"]
            hf[a + "kv_a_proj_with_mqa.weight"] = g[b + "attn_kv_a_mqa.weight"]
            hf[a + "kv_a_layernorm.weight"] = g[b + "attn_kv_a_norm.weight"]
            if b + "attn_kv_b.weight" in g:
                hf[a + "kv_b_proj.weight"] = g[b + "attn_kv_b.weight"]
            else:
                kb, vb = g[b + "attn_k_b.weight"], g[b + "attn_v_b.weight"]  # [NH, R, nope], [NH, v, R]
                hf[a + "kv_b_proj.weight"] = np.concatenate([kb.transpose(0, 2, 1), vb], 1).reshape(NH * (nope + vd), R)
            hf[a + "o_proj.weight"] = g[b + "attn_output.weight"]
        else:
            for hfn, gn in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                hf[a + hfn + ".weight"] = g[b + gn + ".weight"]
            hf[a + "q_norm.weight"] = g[b + "attn_q_norm.weight"]
            hf[a + "k_norm.weight"] = g[b + "attn_k_norm.weight"]
        if b + "ffn_gate_inp.weight" in g:
            hf[p + "mlp.gate.weight"] = g[b + "ffn_gate_inp.weight"]
            if ds:
                hf[p + "mlp.gate.e_score_correction_bias"] = g[b + "exp_probs_b.bias"]
            for pr in ("gate", "up", "down"):
                st = g[b + f"ffn_{pr}_exps.weight"]
                for e in range(st.shape[0]):
                    hf[p + f"mlp.experts.{e}.{pr}_proj.weight"] = st[e]
                if b + f"ffn_{pr}_shexp.weight" in g:
                    hf[p + f"mlp.shared_experts.{pr}_proj.weight"] = g[b + f"ffn_{pr}_shexp.weight"]
        else:
            for pr in ("gate", "up", "down"):
                hf[p + f"mlp.{pr}_proj.weight"] = g[b + f"ffn_{pr}.weight"]
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(cfg)
    cfg.pop("num_nextn_predict_layers", None)
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), hf)


# ------------------------------------------------------------------------------------------ goldens
def transformers_golden(gguf_path, src, out_prefix):
    """transformers' float32 logits for src's golden ids, loading the GGUF file. Returns False if
    transformers cannot load this architecture from GGUF."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    d, f = os.path.split(gguf_path)
    src_cfg = json.load(open(os.path.join(src, "config.json")))
    try:
        cfg = AutoConfig.from_pretrained(d, gguf_file=f)
    except (ValueError, KeyError) as e:
        print(f"  transformers cannot load {f}: {e}")
        return False
    # What GGUF metadata cannot say (transformers' GGUF mapping reads no moe_intermediate_size and
    # llama.cpp has no dense-layer list): taken from the source config.json.
    for k in ("vocab_size", "moe_intermediate_size", "mlp_only_layers", "decoder_sparse_step", "norm_topk_prob", "head_dim",
              "tie_word_embeddings"):
        if k in src_cfg:
            setattr(cfg, k, src_cfg[k])
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, config=cfg, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    r = gguf.GGUFReader(gguf_path)
    deq = {tt.name: gguf.quants.dequantize(tt.data, tt.tensor_type).reshape([int(x) for x in reversed(tt.shape.tolist())]) for tt in r.tensors}
    # transformers' GGUF name map for qwen3moe has no dense ffn_{gate,up,down} (llama.cpp's qwen3moe has none
    # either); the dense layers of mlp_only_layers are copied in from the file's values.
    with torch.no_grad():
        for l in src_cfg.get("mlp_only_layers", []):
            for pr in ("gate", "up", "down"):
                getattr(m.model.layers[l].mlp, pr + "_proj").weight.copy_(torch.from_numpy(deq[f"blk.{l}.ffn_{pr}.weight"]))
    # every weight must be what the file stores
    sd = m.state_dict()
    checks = [("model.embed_tokens.weight", deq["token_embd.weight"]), ("lm_head.weight", deq.get("output.weight", deq["token_embd.weight"])),
              ("model.layers.0.mlp.experts.down_proj", deq["blk.0.ffn_down_exps.weight"]),
              ("model.layers.0.self_attn.q_proj.weight", deq["blk.0.attn_q.weight"])]
    gu = sd["model.layers.0.mlp.experts.gate_up_proj"].numpy()
    I = src_cfg["moe_intermediate_size"]
    assert np.array_equal(gu[:, :I, :], deq["blk.0.ffn_gate_exps.weight"]) and np.array_equal(gu[:, I:, :], deq["blk.0.ffn_up_exps.weight"])
    for k, v in checks:
        assert np.array_equal(sd[k].numpy(), v), k
    g = json.load(open(os.path.join(src, "golden.json")))
    with torch.no_grad():
        logits = m(torch.tensor([g["ids"]])).logits[0].float().numpy()
    logits.astype("<f4").tofile(out_prefix + ".logits.f32")
    json.dump({"ids": g["ids"], "logits": os.path.basename(out_prefix) + ".logits.f32", "vocab_size": int(logits.shape[1]),
               "source": os.path.relpath(src, REPO), "reference": "transformers 5.24 float32, loaded from the GGUF file (gguf_file=)",
               "config_from_source": "vocab_size, moe_intermediate_size, mlp_only_layers, decoder_sparse_step, norm_topk_prob, head_dim, tie_word_embeddings (not in transformers' GGUF mapping); dense layers copied from the file's ffn_{gate,up,down}"},
              open(out_prefix + ".golden.json", "w"), indent=1)
    return True


FILES = [  # (file name, source checkpoint, outtype, legacy kv_b)
    ("qwen3moe-bf16.gguf", "qwen3-moe-bf16", "bf16", False),
    ("qwen3moe-q8_0.gguf", "qwen3-moe-bf16", "q8_0", False),
    ("deepseek2-bf16.gguf", "deepseek-v3-bf16", "bf16", False),
    ("deepseek2-q8_0.gguf", "deepseek-v3-bf16", "q8_0", False),
    ("deepseek2-bf16-kvb.gguf", "deepseek-v3-bf16", "bf16", True),
]


K_FILES = [  # (file name, source spec in make_checkpoints.K256_SPECS, K-quant mix)
    ("qwen3moe-q4_k_m.gguf", "qwen3-moe-k256", "q4_k_m"),
    ("qwen3moe-q2_k.gguf", "qwen3-moe-k256", "q2_k"),
    ("deepseek2-q4_k_m.gguf", "deepseek-v3-k256", "q4_k_m"),
    ("deepseek2-q2_k.gguf", "deepseek-v3-k256", "q2_k"),
]
K_GREEDY = 16


def k_reference_model(gguf_path, src, tmp):
    """transformers float32 model holding exactly the K-quant file's values: loaded from the GGUF itself
    where transformers can (qwen3moe), else from a checkpoint of gguf-py's dequantized values (deepseek2)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = json.load(open(os.path.join(src, "config.json")))
    r = gguf.GGUFReader(gguf_path)
    deq = {tt.name: gguf.quants.dequantize(tt.data, tt.tensor_type).reshape([int(x) for x in reversed(tt.shape.tolist())])
           for tt in r.tensors}
    if cfg["model_type"] == "qwen3_moe":
        d, f = os.path.split(gguf_path)
        tcfg = AutoConfig.from_pretrained(d, gguf_file=f)
        for k in ("vocab_size", "moe_intermediate_size", "mlp_only_layers", "decoder_sparse_step", "norm_topk_prob",
                  "head_dim", "tie_word_embeddings"):
            if k in cfg:
                setattr(tcfg, k, cfg[k])
        m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, config=tcfg, dtype=torch.float32,
                                                 attn_implementation="eager")
        how = "transformers float32, loaded from the GGUF file (gguf_file=), which dequantizes with gguf-py"
        sd = m.state_dict()
        I = cfg["moe_intermediate_size"]
        for l in range(cfg["num_hidden_layers"]):
            gu = sd[f"model.layers.{l}.mlp.experts.gate_up_proj"].numpy()
            assert np.array_equal(gu[:, :I, :], deq[f"blk.{l}.ffn_gate_exps.weight"])
            assert np.array_equal(gu[:, I:, :], deq[f"blk.{l}.ffn_up_exps.weight"])
            assert np.array_equal(sd[f"model.layers.{l}.mlp.experts.down_proj"].numpy(), deq[f"blk.{l}.ffn_down_exps.weight"])
            assert np.array_equal(sd[f"model.layers.{l}.self_attn.v_proj.weight"].numpy(), deq[f"blk.{l}.attn_v.weight"])
        assert np.array_equal(sd["model.embed_tokens.weight"].numpy(), deq["token_embd.weight"])
        assert np.array_equal(sd["lm_head.weight"].numpy(), deq["output.weight"])
    else:
        dequantized_checkpoint(gguf_path, src, tmp)
        m = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
        how = ("transformers float32 DeepseekV3ForCausalLM on a safetensors checkpoint of gguf-py's dequantized values "
               "(transformers has no deepseek2 GGUF loader)")
        sd = m.state_dict()
        assert np.array_equal(sd["model.layers.1.mlp.experts.down_proj"].numpy(), deq["blk.1.ffn_down_exps.weight"])
    m.eval()
    return m, how


def k_golden(gguf_path, src, out_prefix):
    import tempfile
    import torch
    import transformers
    g = json.load(open(os.path.join(src, "golden.json")))
    with tempfile.TemporaryDirectory(prefix="dfkref_") as tmp:
        m, how = k_reference_model(gguf_path, src, tmp)
        with torch.no_grad():
            logits = m(torch.tensor([g["ids"]])).logits[0].float().numpy()
            seq, gaps = list(g["greedy_prompt"]), []
            for _ in range(K_GREEDY):
                row = m(torch.tensor([seq])).logits[0, -1].float().numpy()
                top = np.sort(row)
                gaps.append(float((top[-1] - top[-2]) / max(1.0, abs(top[-1]))))
                seq.append(int(row.argmax()))
    top = np.sort(logits, axis=1)
    tgap = (top[:, -1] - top[:, -2]) / np.maximum(1.0, np.abs(top[:, -1]))
    logits.astype("<f4").tofile(out_prefix + ".logits.f32")
    json.dump({"ids": g["ids"], "logits": os.path.basename(out_prefix) + ".logits.f32", "vocab_size": int(logits.shape[1]),
               "greedy_prompt": g["greedy_prompt"], "greedy": seq[len(g["greedy_prompt"]):],
               "min_logit_gap_rel": float(tgap.min()), "min_greedy_gap_rel": min(gaps),
               "source": "make_checkpoints.K256_SPECS " + os.path.basename(os.path.normpath(src)),
               "reference": f"transformers {transformers.__version__}: {how}"},
              open(out_prefix + ".golden.json", "w"), indent=1)
    return float(tgap.min()), min(gaps)


def make_k_files(out, only=None):
    import tempfile
    import make_checkpoints as mc
    import torch
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    with tempfile.TemporaryDirectory(prefix="dfk256_") as root:
        made = {}
        for name, spec, mix in K_FILES:
            if only and name not in only:
                continue
            if spec not in made:
                made[spec] = mc.make_one(spec, root)
            path = os.path.join(out, name)
            write_gguf(made[spec], path, mix)
            tg, gg = k_golden(path, made[spec], path[:-5])
            print(f"{path}: {os.path.getsize(path)} bytes; golden min rel gap teacher {tg:.2e} greedy {gg:.2e}")
            assert tg > 1e-4 and gg > 1e-4, "near-tie in the K-quant golden (engines agree to ~1e-6): change the seed"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "gguf_moe"))
    ap.add_argument("--no-golden", action="store_true")
    ap.add_argument("--only", action="append", help="file name to (re)write (repeatable); default all")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, src, ot, legacy in FILES:
        if a.only and name not in a.only:
            continue
        path = os.path.join(a.out, name)
        write_gguf(os.path.join(MODELS, src), path, ot, legacy)
        print(f"{path}: {os.path.getsize(path)} bytes")
        if not a.no_golden and ot != "bf16":
            ok = transformers_golden(path, os.path.join(MODELS, src), path[:-5])
            print(f"  transformers golden: {'written' if ok else 'not available'}")
    if not a.no_golden:  # the K-quant files need torch + transformers for their sources and goldens
        make_k_files(a.out, a.only)


if __name__ == "__main__":
    sys.exit(main())
