#!/usr/bin/env python3
"""make_tiny_chat_model.py - a tiny random-weight Qwen3 with the real Qwen3
tokenizer, for server tests (numpy + safetensors only; CI has no torch).

The model: model_type qwen3, hidden 64, 2 layers, 4 query / 2 KV heads of 32,
tied embeddings, vocab_size 151669 (the tokenizer's base vocabulary plus its
added tokens), F16 weights drawn from a fixed seed, so the same directory
comes out every time. The embedding rows of the added (special) tokens are
zero: their logits are then 0 while the ordinary tokens spread around it, so
greedy decoding almost never ends on <|im_end|> by chance and outputs are
long enough to test stop strings and lengths. Outputs are random text;
determinism is what the server tests check.

Usage: make_tiny_chat_model.py OUT_DIR   (or import and call build(out_dir))
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(os.path.dirname(REPO), "shared", "fixtures", "tokenizers", "qwen3")

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 4, 2, 32, 128


def vocab_size(tokenizer_json):
    """Base vocabulary plus added tokens: one more than the largest id."""
    with open(tokenizer_json, encoding="utf-8") as f:
        t = json.load(f)
    ids = list(t["model"]["vocab"].values()) + [a["id"] for a in t.get("added_tokens", [])]
    return max(ids) + 1, min(a["id"] for a in t["added_tokens"])


def build(out_dir, fixtures=FIXTURES, seed=1234):
    """Writes config.json, generation_config.json, model.safetensors and the
    tokenizer files into out_dir (created if missing); returns out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    tok_json = os.path.join(fixtures, "tokenizer.json")
    vocab, first_added = vocab_size(tok_json)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": FFN,
        "max_position_embeddings": 40960,
        "max_window_layers": LAYERS,
        "model_type": "qwen3",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }
    gen = {
        "bos_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "4.51.0",
    }
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    t = {}
    emb = w(vocab, HIDDEN, scale=1.0)
    emb[first_added:] = 0
    t["model.embed_tokens.weight"] = emb
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float16)
        t[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float16)
        t[p + "self_attn.q_proj.weight"] = w(HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * HEAD_DIM)
        t[p + "self_attn.q_norm.weight"] = np.ones(HEAD_DIM, np.float16)
        t[p + "self_attn.k_norm.weight"] = np.ones(HEAD_DIM, np.float16)
        t[p + "mlp.gate_proj.weight"] = w(FFN, HIDDEN)
        t[p + "mlp.up_proj.weight"] = w(FFN, HIDDEN)
        t[p + "mlp.down_proj.weight"] = w(HIDDEN, FFN)
    t["model.norm.weight"] = np.ones(HIDDEN, np.float16)
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(fixtures, name), os.path.join(out_dir, name))
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_chat_model.py OUT_DIR")
    print(build(sys.argv[1]))
