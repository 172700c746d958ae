"""Quantizers for tools/make_checkpoints.py: DeepSeek FP8 block scales and
compressed-tensors INT4 "pack-quantized" (the layouts as shipped on the Hub).

Every function returns both the stored tensors and the exact dequantized float32
weight that the transformers reference is run on.
"""
import importlib.util
import math
import os

import torch

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def fp8_block_quant(w: torch.Tensor, block):
    """w: float32 [out, in].  block = weight_block_size = [bo, bi].
    Returns (weight float8_e4m3fn [out, in], weight_scale_inv f32 [ceil(out/bo), ceil(in/bi)], dequant f32).
    Dequant (DeepSeek `weight_dequant`): w[i, j] = float(fp8[i, j]) * scale_inv[i // bo, j // bi], the product
    rounded to float32. Edge blocks are partial (no padding is stored)."""
    bo, bi = block
    out, inp = w.shape
    so, si = math.ceil(out / bo), math.ceil(inp / bi)
    scale = torch.empty(so, si, dtype=torch.float32)
    for a in range(so):
        for b in range(si):
            blk = w[a * bo:(a + 1) * bo, b * bi:(b + 1) * bi]
            scale[a, b] = blk.abs().max().clamp_min(1e-12) / FP8_MAX
    full = scale.repeat_interleave(bo, 0)[:out].repeat_interleave(bi, 1)[:, :inp]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    deq = q.to(torch.float32) * full
    return q, scale, deq


def fp8_block_dequant(q: torch.Tensor, scale_inv: torch.Tensor, block):
    bo, bi = block
    out, inp = q.shape
    full = scale_inv.repeat_interleave(bo, 0)[:out].repeat_interleave(bi, 1)[:, :inp]
    return q.to(torch.float32) * full


def _round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round positive x to `bits` significant bits (so that q * scale is exact in bf16)."""
    m, e = torch.frexp(x)  # x = m * 2**e, m in [0.5, 1)
    m = torch.round(m * (1 << bits)) / (1 << bits)
    return torch.ldexp(m, e)


def _ct_helpers():
    """compressed-tensors' own pack/unpack functions (loaded straight from the installed file so that the
    package's heavy __init__ dependencies are not needed). Returns None if the package is absent."""
    spec = importlib.util.find_spec("compressed_tensors")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "compressors", "pack_quantized", "helpers.py")
    if not os.path.exists(path):
        return None
    s = importlib.util.spec_from_file_location("_ct_pack_helpers", path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


_CT = _ct_helpers()


def pack_int4_rows(q: torch.Tensor) -> torch.Tensor:
    """Own implementation of compressed-tensors pack_to_int32(value, 4, packed_dim=1):
    element j of a row goes to word j // 8, bits 4*(j % 8) .. 4*(j % 8)+3, stored as (q + 8) (offset binary)."""
    out, inp = q.shape
    assert inp % 8 == 0
    u = (q.to(torch.int64) + 8).view(out, inp // 8, 8)
    word = torch.zeros(out, inp // 8, dtype=torch.int64)
    for k in range(8):
        word |= u[:, :, k] << (4 * k)
    word = torch.where(word >= 2**31, word - 2**32, word)
    return word.to(torch.int32)


def unpack_int4_rows(packed: torch.Tensor, inp: int) -> torch.Tensor:
    w = packed.to(torch.int64) & 0xFFFFFFFF
    vals = [((w >> (4 * k)) & 0xF) for k in range(8)]
    u = torch.stack(vals, dim=-1).view(packed.shape[0], -1)[:, :inp]
    return (u - 8).to(torch.int8)


def int4_group_quant(w: torch.Tensor, group: int):
    """Symmetric INT4 group quantization, compressed-tensors pack-quantized layout.
    Returns (weight_packed int32 [out, in/8], weight_scale bf16 [out, in/group], weight_shape int32 [2],
    dequant f32 [out, in]). q = clamp(round(w / scale), -8, 7); dequant = q * scale (no zero point).
    Scales keep only 4 significant bits, so q * scale is exact in bf16 as well as in f32: the reference is
    then identical whether dequantization is done in bf16 (compressed-tensors' decompress) or f32."""
    out, inp = w.shape
    assert inp % group == 0 and inp % 8 == 0
    g = w.view(out, inp // group, group)
    scale = g.abs().amax(-1).clamp_min(1e-8) / 7.5
    scale = _round_mantissa(scale, 4).to(torch.bfloat16)
    s32 = scale.to(torch.float32)
    q = torch.clamp(torch.round(g / s32[..., None]), -8, 7).to(torch.int8).view(out, inp)
    packed = pack_int4_rows(q)
    if _CT is not None:  # cross-check against the package's own functions
        ref_packed = _CT.pack_to_int32(q, 4)
        assert torch.equal(ref_packed, packed), "INT4 packing differs from compressed-tensors pack_to_int32"
        unq = _CT.unpack_from_int32(packed, 4, torch.Size([out, inp]))
        assert torch.equal(unq, q), "compressed-tensors unpack_from_int32 disagrees"
    assert torch.equal(unpack_int4_rows(packed, inp), q)
    deq = (q.view(out, inp // group, group).to(torch.float32) * s32[..., None]).view(out, inp)
    deq_bf16 = (q.view(out, inp // group, group).to(torch.bfloat16) * scale[..., None]).view(out, inp)
    assert torch.equal(deq_bf16.to(torch.float32), deq), "bf16 and f32 dequantization differ"
    shape = torch.tensor([out, inp], dtype=torch.int32)
    return packed, scale, shape, deq


def int4_dequant(packed, scale, shape, group):
    out, inp = int(shape[0]), int(shape[1])
    if _CT is not None:
        q = _CT.unpack_from_int32(packed, 4, torch.Size([out, inp]))
    else:
        q = unpack_int4_rows(packed, inp)
    s32 = scale.to(torch.float32)
    return (q.view(out, inp // group, group).to(torch.float32) * s32[..., None]).view(out, inp)
