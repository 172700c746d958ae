#!/usr/bin/env python3
"""A float64 numpy reference of a DeepSeek-V3 checkpoint and its MTP module, written for the MTP tests from the
published math (docs/TEST_MODELS.md: MLA with interleaved YaRN RoPE, the grouped sigmoid router; the MTP module as
DeepSeek-V3's report section 2.2 and vLLM's deepseek_mtp.py describe it):

    entry i:  x = eh_proj(concat(enorm(embed(t[i+1])), hnorm(h[i])))      (the embedding first)
              x = decoder_layer(x)   attention over entries 0..i, its own cache
              logits[i] = shared_head.head(shared_head.norm(x))           predicts t[i+2]

h[i] is the main model's final hidden state at position i, before model.norm. The main forward is checked
against the checkpoint's transformers goldens (golden_logits.f32) before the MTP logits are trusted:

    python3 tests/tools/dsv3_mtp_ref.py MODEL_DIR IDS_CSV OUT.f32      # writes MTP logits [(n-1) x vocab]
"""
import json
import math
import struct
import sys

import numpy as np


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "BF16":
            v = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F32":
            v = np.frombuffer(raw, dtype=np.float32)
        elif t["dtype"] == "F16":
            v = np.frombuffer(raw, dtype=np.float16)
        else:
            raise SystemExit(f"{name}: dtype {t['dtype']} not handled by this reference")
        out[name] = v.astype(np.float64).reshape(t["shape"])
    return out


class Model:
    def __init__(self, d):
        self.c = json.load(open(f"{d}/config.json"))
        self.w = read_st(f"{d}/model.safetensors")
        c = self.c
        self.eps = c["rms_norm_eps"]
        dim, base = c["qk_rope_head_dim"], c["rope_theta"]
        rs = c.get("rope_scaling") or {}
        self.att_factor, self.scaling = 1.0, (c["qk_nope_head_dim"] + dim) ** -0.5
        pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
        inv = (1.0 / pos_freqs).astype(np.float32)
        if rs.get("type", rs.get("rope_type")) == "yarn":
            f, omp = rs["factor"], rs["original_max_position_embeddings"]
            ms = lambda s, m=1.0: 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
            msc, msa = rs.get("mscale"), rs.get("mscale_all_dim")
            self.att_factor = ms(f, msc) / ms(f, msa) if msc and msa else ms(f)
            cd = lambda r: dim * math.log(omp / (r * 2 * math.pi)) / (2 * math.log(base))
            lo, hi = max(math.floor(cd(rs.get("beta_fast") or 32)), 0), min(math.ceil(cd(rs.get("beta_slow") or 1)), dim - 1)
            if lo == hi:
                hi += 0.001
            ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1).astype(np.float32)
            extra = 1 - ramp
            inv = (1.0 / (np.float32(f) * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
            if msa:
                self.scaling *= ms(f, msa) ** 2
        self.inv_freq = inv.astype(np.float64)

    def rms(self, x, g, eps=None):
        eps = self.eps if eps is None else eps
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(self, x, pos):  # x [T, ..., d] interleaved pairs -> de-interleaved rotated (docs: same dot products)
        fr = np.outer(pos, self.inv_freq)  # [T, d/2]
        cs, sn = np.cos(fr) * self.att_factor, np.sin(fr) * self.att_factor
        shp = (x.shape[0],) + (1,) * (x.ndim - 2) + (fr.shape[1],)
        cs, sn = cs.reshape(shp), sn.reshape(shp)
        a, b = x[..., 0::2], x[..., 1::2]
        return np.concatenate([a * cs - b * sn, b * cs + a * sn], -1)

    def layer(self, p, x, pos):
        c, w = self.c, self.w
        nh, dn, dr, dv, kvr = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        T = x.shape[0]
        h = self.rms(x, w[p + "input_layernorm.weight"])
        a = p + "self_attn."
        if c.get("q_lora_rank"):
            q = self.rms(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], 1e-6) @ w[a + "q_b_proj.weight"].T
        else:
            q = h @ w[a + "q_proj.weight"].T
        q = q.reshape(T, nh, dn + dr)
        ckv = h @ w[a + "kv_a_proj_with_mqa.weight"].T
        kv_n = self.rms(ckv[:, :kvr], w[a + "kv_a_layernorm.weight"], 1e-6)
        k_rot = self.rope(ckv[:, None, kvr:], pos)  # [T, 1, dr]
        q_rot = self.rope(q[:, :, dn:], pos)
        kv = (kv_n @ w[a + "kv_b_proj.weight"].T).reshape(T, nh, dn + dv)
        key = np.concatenate([kv[:, :, :dn], np.broadcast_to(k_rot, (T, nh, dr))], -1)
        query = np.concatenate([q[:, :, :dn], q_rot], -1)
        s = np.einsum("thd,shd->hts", query, key) * self.scaling
        s = s + np.triu(np.full((T, T), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, kv[:, :, dn:]).reshape(T, nh * dv)
        x = x + o @ w[a + "o_proj.weight"].T
        h = self.rms(x, w[p + "post_attention_layernorm.weight"])
        glu = lambda pre, v: (lambda g, u: (g / (1 + np.exp(-g)) * u) @ w[pre + "down_proj.weight"].T)(v @ w[pre + "gate_proj.weight"].T, v @ w[pre + "up_proj.weight"].T)
        if p + "mlp.gate.weight" not in w:
            return x + glu(p + "mlp.", h)
        E, K, ng, tg = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
        sc = 1 / (1 + np.exp(-(h @ w[p + "mlp.gate.weight"].T)))
        sfc = sc + w[p + "mlp.gate.e_score_correction_bias"]
        out = np.zeros_like(x)
        for t in range(T):
            gs = np.sort(sfc[t].reshape(ng, E // ng), -1)[:, -2:].sum(-1)
            allowed = np.zeros(E, bool)
            for g in np.argsort(-gs, kind="stable")[:tg]:
                allowed[g * (E // ng):(g + 1) * (E // ng)] = True
            idx = np.argsort(-np.where(allowed, sfc[t], -np.inf), kind="stable")[:K]
            wt = sc[t, idx]
            if c.get("norm_topk_prob"):
                wt = wt / (wt.sum() + 1e-20)
            wt = wt * c["routed_scaling_factor"]
            for k, e in enumerate(idx):
                out[t] += wt[k] * glu(p + f"mlp.experts.{e}.", h[t:t + 1])[0]
        return x + out + glu(p + "mlp.shared_experts.", h)

    def hidden(self, ids):
        """The final hidden states before model.norm, [T x hidden]."""
        x = self.w["model.embed_tokens.weight"][ids]
        pos = np.arange(len(ids))
        for l in range(self.c["num_hidden_layers"]):
            x = self.layer(f"model.layers.{l}.", x, pos)
        return x

    def logits(self, ids):
        return self.rms(self.hidden(ids), self.w["model.norm.weight"]) @ self.w["lm_head.weight"].T

    def mtp_logits(self, ids):
        """MTP entries 0..T-2: entry i from h[i] and ids[i+1], logits predicting ids[i+2]."""
        N = self.c["num_hidden_layers"]
        p, w = f"model.layers.{N}.", self.w
        h = self.hidden(ids)[:-1]
        emb = w.get(p + "embed_tokens.weight", w["model.embed_tokens.weight"])[ids[1:]]
        x = np.concatenate([self.rms(emb, w[p + "enorm.weight"]), self.rms(h, w[p + "hnorm.weight"])], -1) @ w[p + "eh_proj.weight"].T
        x = self.layer(p, x, np.arange(1, len(ids)))  # the embedded token's position (only distances matter)
        head = w.get(p + "shared_head.head.weight", w["lm_head.weight"])
        return self.rms(x, w[p + "shared_head.norm.weight"]) @ head.T


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


if __name__ == "__main__":
    d, ids_s, out = sys.argv[1], sys.argv[2], sys.argv[3]
    m = Model(d)
    g = json.load(open(f"{d}/golden.json"))
    gold = np.fromfile(f"{d}/{g['logits']}", dtype=np.float32).reshape(len(g["ids"]), g["vocab_size"])
    err = max(rel_l2(r, gr) for r, gr in zip(m.logits(np.array(g["ids"])), gold))
    if err > 1e-5:
        raise SystemExit(f"the reference's main forward differs from the transformers goldens: rel L2 {err:.3g}")
    ids = np.array([int(v) for v in ids_s.split(",")])
    m.mtp_logits(ids).astype(np.float32).tofile(out)
    print(f"main forward vs transformers goldens: max rel L2 {err:.3g}")
