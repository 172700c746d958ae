#!/usr/bin/env python3
"""make_q4km_gguf.py - re-quantize a GGUF model to a Q4_K_M-like mix (issue 17).

Reads a GGUF file with the gguf package, dequantizes every tensor and
writes it again with llama.cpp's Q4_K_M type choice:
  - token_embd / output: Q6_K
  - attn_v and ffn_down: Q6_K for the layers llama.cpp's use_more_bits picks
    (first and last eighth, and every third layer between), Q4_K otherwise
  - every other 2-D weight: Q4_K; 1-D tensors (norms) stay F32
and llama.cpp's fallback where a row is not a multiple of 256 weights
(SmolLM2-135M's 576-wide rows): Q4_K -> Q5_0, Q6_K -> Q8_0.

gguf-py (0.19) has no K-quant encoders, so the Q4_K / Q6_K encoders below
are written here: a plain min/max rule per sub-block (not ggml's make_qkx2
search). The blocks are valid and decode with gguf.quants.dequantize; the
file is a benchmark input, its perplexity is not a goal.

    python3 bench/make_q4km_gguf.py IN.gguf bench/data/smollm2-q4km.gguf
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

QK = 256


def f16(a):
    return np.asarray(a, dtype=np.float16)


def enc_q4_k(w):
    """w: (nb, 256) f32 -> (nb, 144) uint8 Q4_K blocks."""
    nb = w.shape[0]
    s = w.reshape(nb, 8, 32)
    mn = np.minimum(s.min(axis=2), 0.0)
    mx = s.max(axis=2)
    scale = (mx - mn) / 15.0
    off = -mn
    d = f16(scale.max(axis=1) / 63.0)
    dmin = f16(off.max(axis=1) / 63.0)
    df, dmf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(0, 63).astype(np.int32)
        m = np.where(dmf[:, None] > 0, np.rint(off / dmf[:, None]), 0).clip(0, 63).astype(np.int32)
        step = df[:, None] * sc
        q = np.where(step[:, :, None] > 0,
                     np.rint((s + (dmf[:, None] * m)[:, :, None]) / step[:, :, None]), 0)
    q = q.clip(0, 15).astype(np.uint8)
    out = np.zeros((nb, 144), dtype=np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(nb, 2)
    sb = np.zeros((nb, 12), dtype=np.int32)
    for j in range(4):
        sb[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        sb[:, j + 4] = (m[:, j] & 63) | ((m[:, j + 4] >> 4) << 6)
        sb[:, j + 8] = (sc[:, j + 4] & 15) | ((m[:, j + 4] & 15) << 4)
    out[:, 4:16] = sb.astype(np.uint8)
    for c in range(4):
        out[:, 16 + 32 * c:16 + 32 * (c + 1)] = q[:, 2 * c] | (q[:, 2 * c + 1] << 4)
    return out


def enc_q6_k(w):
    """w: (nb, 256) f32 -> (nb, 210) uint8 Q6_K blocks."""
    nb = w.shape[0]
    s = w.reshape(nb, 16, 16)
    amax = np.abs(s).max(axis=2)
    scale = amax / 31.0
    d = f16(scale.max(axis=1) / 127.0)
    df = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(-128, 127).astype(np.int32)
        step = df[:, None] * sc
        q = np.where(step[:, :, None] > 0, np.rint(s / step[:, :, None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.int32).reshape(nb, 256)
    out = np.zeros((nb, 210), dtype=np.uint8)
    ql = np.zeros((nb, 128), dtype=np.int32)
    qh = np.zeros((nb, 64), dtype=np.int32)
    for i in range(256):
        h, r = i // 128, i % 128
        ql[:, h * 64 + r % 64] |= (q[:, i] & 15) << (4 * (r // 64))
        qh[:, h * 32 + r % 32] |= (q[:, i] >> 4) << (2 * (r // 32))
    out[:, 0:128] = ql.astype(np.uint8)
    out[:, 128:192] = qh.astype(np.uint8)
    out[:, 192:208] = sc.astype(np.int8).view(np.uint8)
    out[:, 208:210] = d.view(np.uint8).reshape(nb, 2)
    return out


def quantize(a, qt):
    """a: (rows, cols) f32 -> (rows, row_bytes) uint8."""
    rows, cols = a.shape
    if qt == T.Q4_K or qt == T.Q6_K:
        blk = (enc_q4_k if qt == T.Q4_K else enc_q6_k)(a.reshape(-1, QK).astype(np.float32))
        return blk.reshape(rows, -1)
    return gguf.quants.quantize(a, qt)


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def pick(name, cols, n_layer):
    if name in ("token_embd.weight", "output.weight"):
        qt = T.Q6_K
    elif ".attn_v." in name or ".ffn_down." in name:
        qt = T.Q6_K if more_bits(int(name.split(".")[1]), n_layer) else T.Q4_K
    else:
        qt = T.Q4_K
    if cols % QK:
        qt = T.Q8_0 if qt == T.Q6_K else T.Q5_0
    return qt


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    n_layer = int(r.fields[f"{arch}.block_count"].contents())
    w = gguf.GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        val = f.contents()
        if f.name == "general.file_type":
            val = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, val, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, val, vt)
    counts = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # numpy order: rows, cols
        deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if len(shape) == 1 or t.tensor_type == T.F32:
            w.add_tensor(t.name, deq)
            counts["F32"] = counts.get("F32", 0) + 1
            continue
        qt = pick(t.name, shape[-1], n_layer)
        data = quantize(deq.reshape(-1, shape[-1]), qt)
        back = gguf.quants.dequantize(data, qt).reshape(deq.shape)
        rel = float(np.abs(back - deq).max() / max(np.abs(deq).max(), 1e-30))
        if rel > 0.2:
            sys.exit(f"{t.name}: {qt.name} round trip error {rel:.3g} of max|w|")
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qt)
        counts[qt.name] = counts.get(qt.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(dst, counts)


if __name__ == "__main__":
    main()
