#!/usr/bin/env python3
"""Writes a BF16 GGUF with Qwen3-30B-A3B shapes (hidden 2048, 32 heads x 128,
4 KV heads, 128 experts of width 768, top-8, dense-free, q/k norms) and the
real Qwen3 tokenizer (../shared/fixtures/tokenizers/qwen3) embedded as
llama.cpp's converter embeds it, with as many layers as asked (30 layers =
about 38.7 GB: over 1.5x this machine's RAM). Tensor data is streamed to the
file (nothing close to the model's size is held in memory); values repeat a
random pool (content does not matter for speed). Uses the gguf package.

Usage: make_synthetic_qwen3moe_gguf.py OUT.gguf [--layers 30]"""
import argparse
import json
import os
import pathlib

import gguf
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=30)
a = ap.parse_args()

H, NH, NKV, HD, E, K, I = 2048, 32, 4, 128, 128, 8, 768
tokdir = pathlib.Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "tokenizers" / "qwen3"
tj = json.loads((tokdir / "tokenizer.json").read_text())
tc = json.loads((tokdir / "tokenizer_config.json").read_text())
vocab = dict(tj["model"]["vocab"])
for t in tj["added_tokens"]:
    vocab[t["content"]] = t["id"]
V = max(vocab.values()) + 1
tokens = [f"[PAD{i}]" for i in range(V)]
types = [gguf.TokenType.UNUSED] * V
for s, i in vocab.items():
    tokens[i] = s
    types[i] = gguf.TokenType.NORMAL
for t in tj["added_tokens"]:
    types[t["id"]] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

w = gguf.GGUFWriter(a.out, "qwen3moe")
w.add_name("synthetic Qwen3-30B-A3B shapes (benchmark)")
w.add_block_count(a.layers)
w.add_context_length(40960)
w.add_embedding_length(H)
w.add_feed_forward_length(6144)
w.add_head_count(NH)
w.add_head_count_kv(NKV)
w.add_key_length(HD)
w.add_value_length(HD)
w.add_rope_freq_base(1000000.0)
w.add_layer_norm_rms_eps(1e-6)
w.add_expert_count(E)
w.add_expert_used_count(K)
w.add_expert_feed_forward_length(I)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("qwen2")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(merges)
w.add_eos_token_id(vocab["<|im_end|>"])
w.add_pad_token_id(vocab["<|endoftext|>"])
w.add_add_bos_token(False)
w.add_chat_template(tc["chat_template"])

BF = gguf.GGMLQuantizationType.BF16
F32 = gguf.GGMLQuantizationType.F32
shapes = [("token_embd.weight", (V, H), BF), ("output_norm.weight", (H,), F32), ("output.weight", (V, H), BF)]
for l in range(a.layers):
    p = f"blk.{l}."
    shapes += [(p + "attn_norm.weight", (H,), F32), (p + "ffn_norm.weight", (H,), F32),
               (p + "attn_q.weight", (NH * HD, H), BF), (p + "attn_k.weight", (NKV * HD, H), BF),
               (p + "attn_v.weight", (NKV * HD, H), BF), (p + "attn_output.weight", (H, NH * HD), BF),
               (p + "attn_q_norm.weight", (HD,), F32), (p + "attn_k_norm.weight", (HD,), F32),
               (p + "ffn_gate_inp.weight", (E, H), F32),
               (p + "ffn_gate_exps.weight", (E, I, H), BF), (p + "ffn_up_exps.weight", (E, I, H), BF),
               (p + "ffn_down_exps.weight", (E, H, I), BF)]
for name, shape, t in shapes:
    n = int(np.prod(shape)) * (2 if t == BF else 4)
    w.add_tensor_info(name, shape, np.dtype(np.uint16 if t == BF else np.float32), n, raw_dtype=t)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()

rng = np.random.default_rng(0)
pool = ((rng.standard_normal(32 << 20).astype(np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16)
total = 0
for name, shape, t in shapes:
    n = int(np.prod(shape))
    if t == F32:
        arr = np.ones(shape, np.float32) if "norm" in name else (rng.standard_normal(shape).astype(np.float32) * 0.05)
    else:
        reps = -(-n // pool.size)
        arr = np.tile(pool, reps)[:n].reshape(shape) if reps > 1 else pool[:n].reshape(shape)
    w.write_tensor_data(arr)
    total += arr.nbytes
    if name.endswith("ffn_down_exps.weight"):
        print(f"{name}: {total / 1e9:.1f} GB written", flush=True)
w.close()
print(f"{a.out}: {os.path.getsize(a.out) / 1e9:.2f} GB")
