#!/usr/bin/env python3
"""make_bigram_model.py - a tiny Llama-architecture model with a real
tokenizer (../shared/fixtures/tokenizers/NAME) whose greedy output cycles
through a fixed text: a bigram machine set by hand (numpy, nothing trained),
for the cross-tokenizer drafting tests, where a draft model of another
tokenizer must write the same text as the target.

  - the text's tokens (in this tokenizer; each must occur once) get one-hot
    embedding dimensions; other tokens embed to zero;
  - attention and MLP outputs are zero (o_proj, down_proj = 0), so the final
    hidden state is the last token's (normed) one-hot;
  - lm_head maps each text token to the next one, the last to the first.

Usage: make_bigram_model.py OUT_DIR TOKENIZER_NAME   (or import build(out_dir, name))"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(os.path.dirname(REPO), "shared", "fixtures", "tokenizers")
# token boundaries differ between the Qwen3 and DeepSeek-V3 tokenizers (" verifies" / " ver"+"ifies",
# "arian"+"ism" / "arianism"); no token repeats in either
TEXT = " Speculative decoding verifies drafted tokens with antidisestablishmentarianism quickly."
H, FFN, HEADS, KV, HD = 64, 32, 4, 2, 16


def text_ids(tok_dir, text=TEXT):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json")).encode(text, add_special_tokens=False).ids


def build(out_dir, name):
    tok_dir = os.path.join(FIXTURES, name)
    os.makedirs(out_dir, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, f), os.path.join(out_dir, f))
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    vocab = max(list(tj["model"]["vocab"].values()) + [a["id"] for a in tj.get("added_tokens", [])]) + 1
    ids = text_ids(tok_dir)
    assert len(set(ids)) == len(ids) < H, "the text must not repeat a token"
    eos = vocab - 1  # never written by the script (the runs use --ignore-eos anyway)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": FFN,
           "num_attention_heads": HEADS, "num_key_value_heads": KV, "num_hidden_layers": 1, "head_dim": HD,
           "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": vocab,
           "bos_token_id": eos, "eos_token_id": eos, "attention_bias": False, "mlp_bias": False}
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": eos, "eos_token_id": eos}, open(os.path.join(out_dir, "generation_config.json"), "w"))
    emb = np.zeros((vocab, H), np.float16)
    head = np.zeros((vocab, H), np.float16)
    for s, t in enumerate(ids):
        emb[t, s] = 1
        head[ids[(s + 1) % len(ids)], s] = 1
    z = lambda r, c: np.zeros((r, c), np.float16)
    p = "model.layers.0."
    w = {"model.embed_tokens.weight": emb, "lm_head.weight": head, "model.norm.weight": np.ones(H, np.float16),
         p + "input_layernorm.weight": np.ones(H, np.float16), p + "post_attention_layernorm.weight": np.ones(H, np.float16),
         p + "self_attn.q_proj.weight": z(HEADS * HD, H), p + "self_attn.k_proj.weight": z(KV * HD, H),
         p + "self_attn.v_proj.weight": z(KV * HD, H), p + "self_attn.o_proj.weight": z(H, HEADS * HD),
         p + "mlp.gate_proj.weight": z(FFN, H), p + "mlp.up_proj.weight": z(FFN, H), p + "mlp.down_proj.weight": z(H, FFN)}
    save_file(w, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: make_bigram_model.py OUT_DIR TOKENIZER_NAME")
    print(build(sys.argv[1], sys.argv[2]))
