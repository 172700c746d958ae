#!/usr/bin/env python3
"""dsv3_mtp_hf.py MODEL_DIR IDS OUT.f32 - the MTP module's logits of a
DeepSeek-V3-style checkpoint computed with transformers' own modules (the
reference for `deltafin eval --dump-mtp-logits`, issue 15).

transformers has no MTP forward, so the module is assembled from its parts:
the main model (DeepseekV3ForCausalLM) gives the final hidden states before
the final norm (a hook on model.norm's input); the module's decoder layer is
transformers' DeepseekV3DecoderLayer loaded by from_pretrained from the same
shards as layer N of an (N+1)-layer model (so its MoE weights go through
transformers' own loading), with its rotary embedding; enorm, hnorm and
shared_head.norm are DeepseekV3RMSNorm. The glue is DeepSeek-V3's design (as
vLLM's deepseek_mtp implements it): entry i = eh_proj([enorm(emb(t[i+1]));
hnorm(h[i])]) at position i+1, causal attention over the entries, then
shared_head.head(shared_head.norm(.)) predicts t[i+2]. Needs torch (run on
the device machine: bench/cuda or tools/ scripts carry it there)."""
import glob
import json
import os
import sys
import tempfile

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as M


def main():
    model_dir, ids_s, out = sys.argv[1:4]
    ids = [int(x) for x in ids_s.split(",")]
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    N, H, eps = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["rms_norm_eps"]
    torch.set_grad_enabled(False)
    dt = torch.float64

    raw = {}
    for f in glob.glob(os.path.join(model_dir, "*.safetensors")):
        with safe_open(f, framework="pt") as s:
            for k in s.keys():
                if k.startswith(f"model.layers.{N}.") or k in ("model.embed_tokens.weight", "lm_head.weight"):
                    raw[k] = s.get_tensor(k).to(dt)
    P = f"model.layers.{N}."

    main_m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt, attn_implementation="eager",
                                                  experts_implementation="eager").eval()
    cap = {}
    main_m.model.norm.register_forward_hook(lambda mod, inp, outp: cap.__setitem__("h", inp[0]))
    main_m(torch.tensor([ids]))
    hid = cap["h"][0]

    tmp = tempfile.mkdtemp()
    c2 = dict(cfg, num_hidden_layers=N + 1, num_nextn_predict_layers=0)
    json.dump(c2, open(os.path.join(tmp, "config.json"), "w"))
    for f in os.listdir(model_dir):
        if f.endswith(".safetensors") or f.endswith(".index.json"):
            os.symlink(os.path.abspath(os.path.join(model_dir, f)), os.path.join(tmp, f))
    big = AutoModelForCausalLM.from_pretrained(tmp, dtype=dt, attn_implementation="eager",
                                               experts_implementation="eager").eval()
    layer = big.model.layers[N]
    # the module's layer really holds the checkpoint's layer-N weights
    w = layer.self_attn.o_proj.weight
    assert torch.equal(w, raw[P + "self_attn.o_proj.weight"]), "layer N not loaded from the checkpoint"

    def rms(name):
        n = M.DeepseekV3RMSNorm(H, eps=eps).to(dt)
        n.weight.data = raw[name].clone()
        return n

    enorm, hnorm, snorm = rms(P + "enorm.weight"), rms(P + "hnorm.weight"), rms(P + "shared_head.norm.weight")
    emb = raw.get(P + "embed_tokens.weight", raw["model.embed_tokens.weight"])
    head = raw.get(P + "shared_head.head.weight", raw["lm_head.weight"])
    T = len(ids)
    e = emb[torch.tensor(ids[1:])]
    x = torch.nn.functional.linear(torch.cat([enorm(e), hnorm(hid[:-1])], -1), raw[P + "eh_proj.weight"])[None]
    pos = torch.arange(1, T)[None]
    pe = big.model.rotary_emb(x, pos)
    mask = torch.full((T - 1, T - 1), float("-inf"), dtype=dt).triu(1)[None, None]
    y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    if isinstance(y, tuple):
        y = y[0]
    logits = torch.nn.functional.linear(snorm(y[0]), head)
    logits.to(torch.float32).numpy().tofile(out)
    print(f"wrote {tuple(logits.shape)} to {out}")


if __name__ == "__main__":
    main()
