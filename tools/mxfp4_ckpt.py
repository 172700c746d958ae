"""MXFP4 (compressed-tensors "mxfp4-pack-quantized") for the tests, numpy only: an independent decode written from
the format's definition, a round-to-nearest quantizer, raw safetensors reading/writing, and the tiny checkpoint
tests/py/test_mxfp4.py runs (the deepseek-v3-bf16 test model with its routed experts stored MXFP4, plus a BF16 twin
holding the exact MXFP4 values). tools/make_mxfp4_golden.py computes transformers' logits of that twin.
"""
import copy
import json
import shutil
import struct
from pathlib import Path

import numpy as np

# Kimi K3's quantization_config (config.json of moonshotai/Kimi-K3, text_config.quantization_config), as published
K3_QUANT = {
    "config_groups": {"group_0": {
        "format": "mxfp4-pack-quantized", "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "scale_dtype": "torch.uint8", "strategy": "group",
                    "symmetric": True, "type": "float", "zp_dtype": None}}},
    "format": "mxfp4-pack-quantized",
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*",
               "re:.*vision_tower.*", "re:.*mm_projector.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}


# ---- an independent decode, from the definition -----------------------------------------------------------------
def e2m1(code):
    """E2M1: bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa; exponent 0 is subnormal (0 or 0.5)."""
    code = np.asarray(code, np.int64)
    e, m = (code >> 1) & 3, code & 1
    mag = np.where(e == 0, 0.5 * m, np.ldexp(1.0 + 0.5 * m, e - 1))
    return np.where(code & 8, -mag, mag)


def numpy_decode(packed, scale):
    """packed u8 [r, c/2], scale u8 [r, c/32] -> f32 [r, c]: code j = nibble j of byte j/2 (low first), times
    2^(s-127) (s = 255: NaN). The float64 product is exact; converting it to f32 rounds nothing (an E2M1 value has
    2 significant bits) except that values beyond FLT_MAX become inf, as in f32 arithmetic."""
    r = packed.shape[0]
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(r, -1)
    s = scale.astype(np.int64)
    mult = np.where(s == 255, np.nan, np.ldexp(1.0, s - 127))
    with np.errstate(over="ignore", invalid="ignore"):
        return (e2m1(codes) * np.repeat(mult, 32, axis=1)).astype(np.float32)


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


# ---- checkpoints ---------------------------------------------------------------------------------------------------
def read_st(path):
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]]) for k, v in h.items()}


def write_st(path, tensors):
    h, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for k in sorted(tensors):
        dt, shape, b = tensors[k]
        h[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def bf16_to_f32(b, shape):
    return (np.frombuffer(b, "<u2").astype("<u4") << 16).view("<f4").reshape(shape)


def f32_to_bf16_exact(a):
    u = np.ascontiguousarray(a, np.float32).view("<u4")
    assert not (u & 0xFFFF).any(), "value not exact in bf16"
    return (u >> 16).astype("<u2").tobytes()


def quantize_mxfp4(w):
    """Round-to-nearest MXFP4 of f32 [r, c] (scale = 2^(floor(log2(amax)) - 2), as compressed-tensors' MX observer
    picks it). Returns (packed u8 [r, c/2], scale u8 [r, c/32])."""
    r, c = w.shape
    g = w.reshape(r, c // 32, 32).astype(np.float64)
    amax = np.abs(g).max(-1)
    s = np.where(amax > 0, 127 + np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, 127).clip(0, 254).astype(np.int64)
    x = g / np.ldexp(1.0, s - 127)[..., None]
    mags = np.abs(e2m1(np.arange(8)))
    idx = np.abs(np.abs(x)[..., None] - mags).argmin(-1)
    codes = (idx | (np.signbit(x).astype(np.int64) << 3)).reshape(r, c)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, s.astype(np.uint8)


def is_routed_expert(name):
    return ".mlp.experts." in name and name.endswith(".weight")




def build(base, out):
    """Writes out/mx (routed experts MXFP4, config with K3's quantization_config) and out/twin (the same model with
    those experts as BF16 holding the decoded values) from the checkpoint directory base. Returns (mx, twin, codes)
    with codes the set of E2M1 codes used."""
    base, out = Path(base), Path(out)
    src = read_st(base / "model.safetensors")
    mx, twin, codes = {}, {}, set()
    for k, (dt, shape, b) in src.items():
        if not is_routed_expert(k):
            mx[k] = twin[k] = (dt, shape, b)
            continue
        assert dt == "BF16" and shape[1] % 32 == 0
        packed, scale = quantize_mxfp4(bf16_to_f32(b, shape))
        codes |= set(int(c) for c in np.unique(packed & 15)) | set(int(c) for c in np.unique(packed >> 4))
        mod = k[: -len(".weight")]
        mx[mod + ".weight_packed"] = ("U8", list(packed.shape), packed.tobytes())
        mx[mod + ".weight_scale"] = ("U8", list(scale.shape), scale.tobytes())
        twin[k] = ("BF16", shape, f32_to_bf16_exact(numpy_decode(packed, scale)))
    dirs = []
    for name, tensors, quant in (("mx", mx, True), ("twin", twin, False)):
        d = out / name
        d.mkdir(parents=True)
        shutil.copy(base / "generation_config.json", d / "generation_config.json")
        cfg = json.loads((base / "config.json").read_text())
        if quant:
            cfg["quantization_config"] = copy.deepcopy(K3_QUANT)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        write_st(d / "model.safetensors", tensors)
        dirs.append(d)
    return dirs[0], dirs[1], codes
