#!/usr/bin/env python3
"""Golden reference for the default model (SmolLM2-135M-Instruct Q4_1 GGUF):
transformers loads the GGUF file itself (from_pretrained(..., gguf_file=...)
dequantizes the blocks to float32) and computes the logits of a chat prompt,
a 32-token greedy continuation, and the token ids of sample texts with the
GGUF tokenizer as transformers converts it. Needs torch, transformers,
accelerate, gguf (not needed by the tests, which read the committed output).

Usage: make_smollm2_golden.py DIR_WITH_model.gguf OUT_DIR"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

src, out = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(src, gguf_file="model.gguf")
model = AutoModelForCausalLM.from_pretrained(src, gguf_file="model.gguf", dtype=torch.float32).eval()
msgs = [{"role": "user", "content": "What is the capital of France?"}]
prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
ids = tok(prompt, add_special_tokens=False)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0].float().numpy()
gen = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=2)
greedy = gen[0, len(ids):].tolist()
texts = ["Hello world", "The capital of France is Paris.", "  leading spaces and\ttabs\n\nnewlines",
         "Numbers 12345 and 3.14159", "Ünïcödé — 日本語 😀 👩‍👩‍👧", "def f(x):\n    return x**2  # comment",
         "<|im_start|>user\nhi<|im_end|>"]
text_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
logits[-8:].astype("<f4").tofile(f"{out}/golden_logits.f32")
json.dump({"prompt": prompt, "ids": ids, "logits_positions": list(range(len(ids) - 8, len(ids))),
           "vocab_size": int(logits.shape[1]), "greedy": greedy, "texts": texts, "text_ids": text_ids,
           "reference": f"transformers {transformers.__version__} float32 (GGUF dequantized by from_pretrained(gguf_file=...))"},
          open(f"{out}/golden.json", "w"), indent=1)
