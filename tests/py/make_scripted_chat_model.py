#!/usr/bin/env python3
"""make_scripted_chat_model.py - a tiny Qwen3 (the shape and real tokenizer of
make_tiny_chat_model.py) whose weights are set by hand, not drawn at random,
so that greedy decoding follows a script: the tool-call tests need a model
that really emits a call in Qwen3's native format, and a random-weight model
never does.

How the weights make the script (numpy, nothing trained):
  - every token of the script has its own one-hot embedding dimension
    ("slot"); other tokens embed to zero;
  - attention and MLP outputs are zero (o_proj, down_proj = 0) except one
    head of layer 0: q = k = 0, so it averages v uniformly over the context,
    and v reads the slot of <tool_response>; o_proj writes that average to a
    flag dimension F. So the final hidden state is the last token's slot plus
    F ~ (how many <tool_response> tokens are in the context) / position;
  - lm_head (untied) maps a slot to the next token of the script (a bigram
    machine: each script token has one successor), and F to the first token
    of the answer, strongly enough to win whenever a tool result is in the
    context.

So: a chat whose prompt ends with the generation prompt's "\\n" and has no
tool result gets CALL_TEXT (a <tool_call> for get_weather) then <|im_end|>;
once a tool result is in the context, the answer ANSWER_TEXT then
<|im_end|>. That is what the engine computes from these weights; the server
parses it like any model's output.

With think=True the call is preceded by a think block, <think>THINK_TEXT</think>.

Usage: make_scripted_chat_model.py OUT_DIR   (or import build(out_dir, think=False))
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_tiny_chat_model as tiny  # noqa: E402

# Whitespace chosen so that no token of the script has two different
# successors (a bigram machine cannot follow such a script).
CALL_TEXT = '<tool_call>{"name":"get_weather","arguments":{"city": "Paris"}}</tool_call>'
CALL_ARGS = {"city": "Paris"}
ANSWER_TEXT = "Sunny in Paris."
THINK_TEXT = "Weather lookup needed"  # build(think=True): the call comes after <think>THINK_TEXT</think>
NEWLINE, IM_END, TOOL_RESPONSE = 198, 151645, 151665
W_FLAG, W_ANSWER = 1000.0, 1000.0


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def build(out_dir, think=False):
    from tokenizers import Tokenizer

    tiny.build(out_dir)
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    call, answer = _ids(tok, CALL_TEXT), _ids(tok, ANSWER_TEXT)
    if think:
        call = _ids(tok, "<think>" + THINK_TEXT + "</think>") + call
    # the script: "\n" (the end of the generation prompt) -> the call -> <|im_end|>;
    # a tool result in the context -> the answer -> <|im_end|>
    succ = {}
    for a, b, w in [(NEWLINE, call[0], 1.0)] + [(x, y, 1.0) for x, y in zip(call, call[1:] + [IM_END])] + \
                   [(x, y, W_ANSWER) for x, y in zip(answer, answer[1:] + [IM_END])]:
        assert succ.get(a, (b, w)) == (b, w), "the script gives token %d two successors" % a
        succ[a] = (b, w)
    slots = {}
    for t in [NEWLINE, TOOL_RESPONSE] + call + answer:
        slots.setdefault(t, len(slots))
    H = tiny.HIDDEN
    F = H - 1
    assert len(slots) < F

    t = load_file(os.path.join(out_dir, "model.safetensors"))
    vocab = t["model.embed_tokens.weight"].shape[0]
    emb = np.zeros((vocab, H), np.float16)
    for tid, s in slots.items():
        emb[tid, s] = 1
    head = np.zeros((vocab, H), np.float16)
    for a, (b, w) in succ.items():
        head[b, slots[a]] = w
    head[answer[0], F] = W_FLAG
    t["model.embed_tokens.weight"] = emb
    t["lm_head.weight"] = head
    for i in range(tiny.LAYERS):
        p = f"model.layers.{i}."
        for k in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + "self_attn." + k + ".weight"] = np.zeros_like(t[p + "self_attn." + k + ".weight"])
        t[p + "mlp.down_proj.weight"] = np.zeros_like(t[p + "mlp.down_proj.weight"])
    v = t["model.layers.0.self_attn.v_proj.weight"]
    v[0, slots[TOOL_RESPONSE]] = 1          # kv head 0, dim 0: "is this <tool_response>"
    o = t["model.layers.0.self_attn.o_proj.weight"]
    o[F, 0] = 1                             # query head 0, dim 0 -> the flag dimension
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["tie_word_embeddings"] = False
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_scripted_chat_model.py OUT_DIR")
    print(build(sys.argv[1]))
