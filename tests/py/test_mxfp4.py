"""MXFP4 weights as compressed-tensors stores them ("mxfp4-pack-quantized", the
format of Kimi K3's routed experts): `<module>.weight_packed` U8 [rows, cols/2]
(element j = nibble j of byte j/2, low nibble first, an E2M1 code) and
`<module>.weight_scale` U8 [rows, cols/32] (E8M0: 2^(s-127); 255 is NaN).

* The backend's dequantized rows (every ISA the CPU has) equal an independent
  numpy decode written from the format's definition, bit for bit, for every
  byte value and every scale 0..255, and equal compressed-tensors' own
  decompression (MXFP4PackedCompressor.decompress) for scales 0..254 where
  that package imports (it needs torch, which the CI image does not have).
* The decode products (n = 1) and the prefill path (n = 3, 17) agree with a
  float64 product of the numpy-decoded matrix.
* A tiny DeepSeek-V3-layout checkpoint whose routed experts are MXFP4 (config
  quantization_config as Kimi K3 publishes it) gives the logits of the same
  model with those experts stored as BF16 (the MXFP4 values are exact in
  BF16), on every ISA, and transformers' float32 logits of that dequantized
  model (tests/data/mxfp4, tools/make_mxfp4_golden.py); streamed from the
  shards and from a packed store (setup --from) the logits are bit-identical
  to the resident run.
* Hostile checkpoints (scale shape, scale dtype, packed dtype, columns not a
  multiple of 32, unsupported quantization_config variants) fail with one
  line naming the tensor or field, exit 2.

The backend is reached through tests/tools/mxfp4_driver.c, built here with cc.
"""
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import MODELS, REPO

sys.path.insert(0, str(REPO / "tools"))
from mxfp4_ckpt import (K3_QUANT, build, is_routed_expert, numpy_decode, read_st, same_bits,  # noqa: E402
                        write_st)

ROOT = Path(__file__).resolve().parents[2]
BASE = "deepseek-v3-bf16"
ISAS = ["scalar", "avx2", "avx512"]
AVX2 = ["-mavx2", "-mfma", "-mf16c"]
AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mavx512vnni", "-mfma", "-mf16c"]
# the driver and the CPU backend with what it needs (every backend source but the CUDA one: a list by name
# broke when the thread pool moved to its own file)
SOURCES = ["tests/tools/mxfp4_driver.c", "src/util/util.c"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "src" / "backend").rglob("*.c") if "cuda" not in p.parts)


# ---- compressed-tensors (optional) ---------------------------------------------------------------------------------
def ct_decompress(packed, scale):
    """compressed-tensors' own decompression of an mxfp4-pack-quantized weight (bf16, as the package returns it),
    with the scheme parsed from K3_QUANT by the package's QuantizationConfig. None when it does not import."""
    try:
        import torch
        from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
        from compressed_tensors.quantization import QuantizationConfig
    except Exception:  # noqa: BLE001 - any import failure means "not available here"
        return None
    scheme = QuantizationConfig.model_validate(K3_QUANT).config_groups["group_0"]
    sd = {"weight_packed": torch.from_numpy(np.ascontiguousarray(packed)), "weight_scale": torch.from_numpy(np.ascontiguousarray(scale))}
    w = MXFP4PackedCompressor.decompress(sd, scheme)["weight"]
    return w.to(torch.float32).numpy()


# ---- the driver ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("mxdriver")
    objs = []
    for src in SOURCES:
        extra = AVX512 if "_avx512" in src else AVX2 if "_avx2" in src else []
        obj = out / (Path(src).stem + ".o")
        subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-O1", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Iinclude",
                        "-Isrc", "-pthread", *extra, "-c", src, "-o", str(obj)], cwd=ROOT, check=True)
        objs.append(str(obj))
    exe = out / "mxfp4_driver"
    subprocess.run([cc, "-o", str(exe), *objs, "-lm", "-pthread"], check=True)
    return exe


def backend(driver, tmp_path, isa, packed, scale, x=None):
    """(dequantized rows, products or None) from the backend, or None if the CPU lacks the ISA."""
    r, c = packed.shape[0], packed.shape[1] * 2
    pp, sp, dp = tmp_path / "p.bin", tmp_path / "s.bin", tmp_path / f"d_{isa}.bin"
    pp.write_bytes(np.ascontiguousarray(packed, np.uint8).tobytes())
    sp.write_bytes(np.ascontiguousarray(scale, np.uint8).tobytes())
    args = [str(driver), isa, str(r), str(c), str(pp), str(sp), str(dp)]
    if x is not None:
        xp, yp = tmp_path / "x.bin", tmp_path / f"y_{isa}.bin"
        xp.write_bytes(np.ascontiguousarray(x, np.float32).tobytes())
        args += [str(xp), str(x.shape[0]), str(yp)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode == 77:
        return None
    assert p.returncode == 0, p.stderr
    deq = np.fromfile(dp, dtype="<f4").reshape(r, c)
    return deq, (np.fromfile(yp, dtype="<f4").reshape(x.shape[0], r) if x is not None else None)


def test_rows_every_byte_and_scale(driver, tmp_path):
    """Every byte value (all 16 codes in both nibbles) under every scale 0..255: bit-exact on every ISA."""
    rng = np.random.default_rng(1)
    rows, cols = 96, 32 * 11  # odd multiples of 32
    packed = rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)
    packed[:16, :] = np.arange(256 * 11, dtype=np.int64).reshape(16, cols // 2) % 256
    scale = (np.arange(rows * cols // 32) % 256).astype(np.uint8).reshape(rows, cols // 32)
    want = numpy_decode(packed, scale)
    ran = 0
    for isa in ISAS:
        got = backend(driver, tmp_path, isa, packed, scale)
        if got is None:
            continue
        ran += 1
        ok = same_bits(got[0], want)
        bad = np.argwhere(~ok)
        assert ok.all(), f"{isa}: {len(bad)} values differ, first at {tuple(bad[0])}: got {got[0][tuple(bad[0])]!r}, want {want[tuple(bad[0])]!r}"
        assert np.isnan(got[0][scale.repeat(32, axis=1) == 255]).all(), "scale 255 decodes to NaN"
    assert ran >= 2


def test_rows_against_compressed_tensors(driver, tmp_path):
    rng = np.random.default_rng(2)
    rows, cols = 32 * 3, 32 * 9
    packed = rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)
    scale = (np.arange(rows * cols // 32) % 255).astype(np.uint8).reshape(rows, cols // 32)  # 0..254
    ref = ct_decompress(packed, scale)
    if ref is None:
        pytest.skip("compressed-tensors does not import here (it needs torch >= 2.10, not in the CI image)")
    assert same_bits(numpy_decode(packed, scale), ref).all(), "the numpy decode disagrees with compressed-tensors"
    got = backend(driver, tmp_path, "scalar", packed, scale)[0]
    assert same_bits(got, ref).all()


def test_products_decode_and_prefill(driver, tmp_path):
    rng = np.random.default_rng(3)
    rows, cols = 32 * 5, 32 * 7
    packed = rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)
    scale = rng.integers(100, 150, size=(rows, cols // 32), dtype=np.uint8)
    w = numpy_decode(packed, scale).astype(np.float64)
    for n in (1, 3, 17):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        ref = x.astype(np.float64) @ w.T
        mag = np.abs(x.astype(np.float64)) @ np.abs(w.T)
        for isa in ISAS:
            got = backend(driver, tmp_path, isa, packed, scale, x)
            if got is None:
                continue
            err = np.abs(got[1] - ref)
            assert (err <= 1e-5 * mag + 1e-30).all(), f"{isa} n={n}: max error {err.max()} (relative to |W||x|)"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """(MXFP4 checkpoint, BF16 twin with the MXFP4 values) built from the deepseek-v3-bf16 test model."""
    mx, twin, codes = build(MODELS / BASE, tmp_path_factory.mktemp("mxfp4"))
    assert codes == set(range(16)), f"the test checkpoint should use every E2M1 code, has {sorted(codes)}"
    return {"mx": mx, "twin": twin}


def run(args, env=None, check=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    if check and p.returncode != 0:
        raise AssertionError(f"{args}: exit {p.returncode}: {p.stderr}")
    return p


IDS = [0, 141, 496, 161, 102, 49, 179, 59, 337, 376, 508, 227, 213, 179, 207, 326]


def logits(dfbin, model, path, *extra, env=None):
    run([dfbin, "eval", "--model", model, "--ids", ",".join(map(str, IDS)), "--dump-logits", path, *extra], env=env)
    return np.fromfile(path, dtype="<f4").reshape(len(IDS), -1)


def test_checkpoint_logits_equal_the_bf16_twin(dfbin, ckpts, tmp_path):
    ref = logits(dfbin, ckpts["twin"], tmp_path / "t.f32")
    for isa in ISAS:
        got = logits(dfbin, ckpts["mx"], tmp_path / f"m_{isa}.f32", env={"DELTAFIN_ISA": isa})
        # only the order of the f32 sums differs (group sums times a power of two vs element by element)
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * np.abs(ref).max(), err_msg=isa)
    # and the MXFP4 model is not the BF16 base model (the experts really are the quantized ones)
    base = logits(dfbin, MODELS / BASE, tmp_path / "b.f32")
    assert np.abs(base - ref).max() > 1e-3


def test_logits_equal_transformers_on_the_dequantized_model(dfbin, ckpts, tmp_path):
    """tests/data/mxfp4: transformers' float32 logits of the BF16 twin (tools/make_mxfp4_golden.py), made for
    exactly this MXFP4 checkpoint (its sha256 is recorded)."""
    g = json.loads((REPO / "tests" / "data" / "mxfp4" / "golden.json").read_text())
    sha = hashlib.sha256((ckpts["mx"] / "model.safetensors").read_bytes()).hexdigest()
    assert sha == g["mxfp4_safetensors_sha256"], "the test checkpoint changed: rerun tools/make_mxfp4_golden.py"
    n, V = len(g["ids"]), g["vocab_size"]
    ref = np.fromfile(REPO / "tests" / "data" / "mxfp4" / g["logits"], dtype="<f4").reshape(n, V)
    out = tmp_path / "g.f32"
    run([dfbin, "eval", "--model", ckpts["mx"], "--ids", ",".join(map(str, g["ids"])), "--dump-logits", out])
    got = np.fromfile(out, dtype="<f4").reshape(n, V)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-4, f"per-position relative L2 error {rel.max():.3g} at position {rel.argmax()}"
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_inspect_names_the_format(dfbin, ckpts):
    out = run([dfbin, "inspect", "--model", ckpts["mx"]]).stdout
    assert "MXFP4" in out and "mxfp4-pack-quantized" in out, out


def test_streamed_and_store_bitwise(dfbin, ckpts, tmp_path):
    ref = logits(dfbin, ckpts["mx"], tmp_path / "r.f32").tobytes()
    # a cache of the minimum size: every expert (data + E8M0 scales) read from the shards
    assert logits(dfbin, ckpts["mx"], tmp_path / "a.f32", "--expert-cache", "0").tobytes() == ref
    store = tmp_path / "store"
    run([dfbin, "setup", "--from", ckpts["mx"], "--out", store, "--pack"])
    assert logits(dfbin, store, tmp_path / "b.f32").tobytes() == ref
    assert logits(dfbin, store, tmp_path / "c.f32", "--expert-cache", "0", env={"DELTAFIN_NO_IO_URING": "1"}).tobytes() == ref


# ---- hostile checkpoints -------------------------------------------------------------------------------------------
EXPERT = "model.layers.1.mlp.experts.3.up_proj"


def hostile(ckpts, tmp_path, edit_tensors=None, edit_cfg=None):
    d = tmp_path / "h"
    shutil.copytree(ckpts["mx"], d)
    if edit_tensors:
        t = read_st(d / "model.safetensors")
        edit_tensors(t)
        write_st(d / "model.safetensors", t)
    if edit_cfg:
        cfg = json.loads((d / "config.json").read_text())
        edit_cfg(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return d


def set_tensor(name, dtype, shape):
    def f(t):
        n = int(np.prod(shape)) * {"U8": 1, "I8": 1, "BF16": 2, "F32": 4, "I32": 4}[dtype]
        t[name] = (dtype, shape, bytes(n))
    return f


def drop_scale(t):
    del t[EXPERT + ".weight_scale"]


def qc(path, value):
    def f(cfg):
        o = cfg["quantization_config"]
        for k in path[:-1]:
            o = o[k]
        if value is KeyError:
            del o[path[-1]]
        else:
            o[path[-1]] = value
    return f


W = ["config_groups", "group_0", "weights"]


@pytest.mark.parametrize("edit_tensors,edit_cfg,needle", [
    (set_tensor(EXPERT + ".weight_scale", "U8", [32, 3]), None,
     f"tensor '{EXPERT}.weight_scale': expected shape [32, 2], got [32, 3]"),
    (set_tensor(EXPERT + ".weight_scale", "U8", [2, 32]), None,
     f"tensor '{EXPERT}.weight_scale': expected shape [32, 2], got [2, 32]"),
    (set_tensor(EXPERT + ".weight_scale", "BF16", [32, 2]), None,
     f"tensor '{EXPERT}.weight_scale': expected dtype U8 (E8M0 scales), got BF16"),
    (set_tensor(EXPERT + ".weight_scale", "F32", [32, 2]), None,
     f"tensor '{EXPERT}.weight_scale': expected dtype U8 (E8M0 scales), got F32"),
    (set_tensor(EXPERT + ".weight_packed", "I32", [32, 8]), None,
     f"tensor '{EXPERT}.weight_packed': expected dtype U8, got I32"),
    (set_tensor(EXPERT + ".weight_packed", "U8", [32, 33]), None,
     f"tensor '{EXPERT}.weight_packed': expected shape [32, 32], got [32, 33]"),
    (drop_scale, None, f"missing tensor '{EXPERT}.weight_scale'"),
    (None, qc(W + ["group_size"], 16),
     'field "quantization_config.config_groups.group_0.weights.group_size": expected 32, got 16'),
    (None, qc(W + ["type"], "int"),
     'field "quantization_config.config_groups.group_0.weights.type": expected "float", got "int"'),
    (None, qc(W + ["num_bits"], 8),
     'field "quantization_config.config_groups.group_0.weights.num_bits": expected 4, got 8'),
    (None, qc(W + ["scale_dtype"], "torch.float8_e4m3fn"),
     'field "quantization_config.config_groups.group_0.weights.scale_dtype": expected "torch.uint8", got "torch.float8_e4m3fn"'),
    (None, qc(W + ["symmetric"], False),
     'field "quantization_config.config_groups.group_0.weights.symmetric": expected true, got false'),
    (None, qc(W + ["strategy"], "tensor_group"),
     'field "quantization_config.config_groups.group_0.weights.strategy": expected "group", got "tensor_group"'),
    (None, qc(["config_groups", "group_0", "format"], "nvfp4-pack-quantized"),
     'field "quantization_config.config_groups.group_0.format": expected "mxfp4-pack-quantized", got "nvfp4-pack-quantized"'),
    (None, qc(["config_groups", "group_0", "input_activations"], dict(K3_QUANT["config_groups"]["group_0"]["weights"], dynamic=True)),
     'field "quantization_config.config_groups.group_0.input_activations": expected null'),
    (None, qc(["format"], "nvfp4-pack-quantized"),
     'quantization_config.format nvfp4-pack-quantized is not supported (expected "pack-quantized" or "mxfp4-pack-quantized")'),
])
def test_hostile(dfbin, ckpts, tmp_path, edit_tensors, edit_cfg, needle):
    d = hostile(ckpts, tmp_path, edit_tensors, edit_cfg)
    p = run([dfbin, "eval", "--model", d, "--ids", "1,2", "--dump-logits", os.devnull], check=False)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert needle in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_columns_not_a_multiple_of_32_refused(dfbin, tmp_path):
    """A synthetic MoE whose expert input width (moe_intermediate_size 48) does not fill whole MXFP4 groups."""
    d = tmp_path / "q"
    shutil.copytree(MODELS / "qwen3-moe-bf16", d)
    t = read_st(d / "model.safetensors")
    for k in [k for k in t if is_routed_expert(k)]:
        dt, shape, b = t.pop(k)
        mod = k[: -len(".weight")]
        t[mod + ".weight_packed"] = ("U8", [shape[0], shape[1] // 2], bytes(shape[0] * shape[1] // 2))
        t[mod + ".weight_scale"] = ("U8", [shape[0], max(1, shape[1] // 32)], bytes(shape[0] * max(1, shape[1] // 32)))
    write_st(d / "model.safetensors", t)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = copy.deepcopy(K3_QUANT)
    (d / "config.json").write_text(json.dumps(cfg))
    p = run([dfbin, "eval", "--model", d, "--ids", "1,2", "--dump-logits", os.devnull], check=False)
    assert p.returncode == 2 and "MXFP4 needs input columns in groups of 32, got 48 columns" in p.stderr, p.stderr
    assert "down_proj.weight_packed" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_k3_text_config_placement(dfbin, ckpts, tmp_path):
    """Kimi K3 keeps quantization_config inside text_config: read from there when the top level has none."""
    d = hostile(ckpts, tmp_path, None, lambda c: c.update(text_config={"quantization_config": c.pop("quantization_config")}))
    ref = logits(dfbin, ckpts["mx"], tmp_path / "r.f32")
    assert np.array_equal(logits(dfbin, d, tmp_path / "k.f32"), ref)
