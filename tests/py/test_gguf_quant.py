"""GGUF reader and GGML block kernels against the `gguf` Python package.

* Dequantization of random blocks of every supported type, on every ISA the
  CPU has, is bit-exact to gguf.quants.dequantize.
* A file written by gguf.GGUFWriter (metadata of every value type, nested
  arrays, tensors of several types, custom alignment, split into parts) is
  read back by our reader with identical metadata, shapes and tensor bytes,
  at the offsets gguf.GGUFReader finds.
* Truncating such a file anywhere gives a clean DF_EFORMAT exit, never a crash.

Our C code is reached through tests/tools/ggml_driver.c, which this module
compiles with `cc` (or $CC) into a temporary directory.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
AVX2 = ["-mavx2", "-mfma", "-mf16c"]
AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16",
          "-mavx512vnni", "-mfma", "-mf16c"]
SOURCES = ["tests/tools/ggml_driver.c", "src/format/gguf.c", "src/format/gguf_parse.c",
           "src/format/gguf_access.c", "src/util/util.c",
           "src/backend/cpu/ggml_quant.c", "src/backend/cpu/ggml_quant_avx2.c",
           "src/backend/cpu/ggml_quant_avx512.c"]

# type -> byte offsets of its f16 scale fields inside a block
SCALES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.MXFP4: [],
}
TYPES = [T.F32, T.F16, T.BF16] + list(SCALES)
ISAS = ["scalar", "avx2", "avx512"]


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("driver")
    objs = []
    for src in SOURCES:
        extra = AVX512 if "_avx512" in src else AVX2 if "_avx2" in src else []
        obj = out / (Path(src).stem + ".o")
        subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-O1", "-g", "-Wall", "-Wextra",
                        "-Wno-unused-parameter", "-Iinclude", "-Isrc", *extra, "-c", src,
                        "-o", str(obj)], cwd=ROOT, check=True)
        objs.append(str(obj))
    exe = out / "ggml_driver"
    subprocess.run([cc, "-o", str(exe), *objs, "-lm"], check=True)
    return exe


def rand_f16(rng, n):
    """Random finite f16 bit patterns (subnormals included, no NaN/Inf)."""
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exp = (h >> 10) & 31
    fix = rng.integers(0, 31, size=n).astype(np.uint16)
    return np.where(exp == 31, (h & 0x83FF) | (fix << 10), h).astype(np.uint16)


def random_blocks(qtype, n_blocks, rng):
    """Random bytes for n_blocks blocks with sane (finite) scales."""
    be, bs = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8)
    if qtype == T.F16:
        return rand_f16(rng, n_blocks).view(np.uint8)
    if qtype == T.BF16:
        h = rng.integers(0, 1 << 16, size=n_blocks, dtype=np.uint32).astype(np.uint16)
        nan = ((h >> 7) & 0xFF) == 0xFF
        return np.where(nan, h & 0xBFFF, h).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, size=(n_blocks, bs), dtype=np.uint16).astype(np.uint8)
    for off in SCALES.get(qtype, []):
        blocks[:, off:off + 2] = rand_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequant_bit_exact(driver, tmp_path, qtype):
    rng = np.random.default_rng(int(qtype) + 1)
    be, bs = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = 4096 // be * 3 + 1  # odd count, not a multiple of 64 weights for small blocks
    data = random_blocks(qtype, n_blocks, rng)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32).reshape(-1)
    assert ref.size == n_blocks * be
    inp = tmp_path / "in.bin"
    data.tofile(inp)
    ran = 0
    for isa in ISAS:
        outp = tmp_path / f"out_{isa}.bin"
        r = subprocess.run([str(driver), "dequant", str(int(qtype)), isa, str(inp), str(outp)])
        if r.returncode == 77:
            continue
        assert r.returncode == 0, f"driver failed for {qtype.name} {isa}"
        got = np.fromfile(outp, dtype=np.float32)
        assert got.size == ref.size
        diff = np.nonzero(got.view(np.uint32) != ref.view(np.uint32))[0]
        assert diff.size == 0, (
            f"{qtype.name} {isa}: {diff.size} weights differ, first at {diff[0]}: "
            f"ours {got[diff[0]]!r} gguf {ref[diff[0]]!r}")
        ran += 1
    assert ran >= 1


def test_unsupported_type_refused(driver, tmp_path):
    (tmp_path / "in.bin").write_bytes(b"\0" * 66)
    r = subprocess.run([str(driver), "dequant", str(int(T.IQ2_XXS)), "auto",
                        str(tmp_path / "in.bin"), str(tmp_path / "o.bin")], capture_output=True)
    assert r.returncode == 3


# ---- reader round trip ------------------------------------------------------

def hexs(s):
    return (s.encode("utf-8") if isinstance(s, str) else bytes(s)).hex()


def build_file(path, alignment=64, split_max_tensors=0):
    """Writes a GGUF with every metadata type and tensors of several types.
    Returns (expected metadata {key: (type, value)}, tensors {name: (qtype, ne, bytes)})."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    meta = {"general.architecture": (V.STRING, hexs("llama"))}
    if alignment != 32:
        w.add_custom_alignment(alignment)
        meta["general.alignment"] = (V.UINT32, alignment)
    scalars = [
        ("t.u8", V.UINT8, 250), ("t.i8", V.INT8, -120), ("t.u16", V.UINT16, 65000),
        ("t.i16", V.INT16, -32000), ("t.u32", V.UINT32, 4_000_000_000), ("t.i32", V.INT32, -2_000_000_000),
        ("t.f32", V.FLOAT32, 0.1), ("t.u64", V.UINT64, 2**63 + 5), ("t.i64", V.INT64, -2**62),
        ("t.f64", V.FLOAT64, 1e-300), ("t.bool", V.BOOL, True), ("t.bool0", V.BOOL, False),
    ]
    for key, vt, val in scalars:
        w.add_key_value(key, val, vt)
        meta[key] = (vt, float(np.float32(val)) if vt == V.FLOAT32 else val)
    w.add_string("t.str", "héllo, wörld ✓")
    meta["t.str"] = (V.STRING, hexs("héllo, wörld ✓"))
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    meta["tokenizer.chat_template"] = (V.STRING, hexs("{% for m in messages %}{{ m['content'] }}{% endfor %}"))
    toks = ["<s>", "</s>", "a", "Ġthe", "", "ü"]
    w.add_array("tokenizer.ggml.tokens", toks)
    meta["tokenizer.ggml.tokens"] = (V.ARRAY, (V.STRING, [hexs(t) for t in toks]))
    scores = [0.5, -1.25, 3.0]
    w.add_array("tokenizer.ggml.scores", scores)
    meta["tokenizer.ggml.scores"] = (V.ARRAY, (V.FLOAT32, scores))
    ints = [1, -2, 3, 2**31 - 1]
    w.add_array("t.arr_i32", ints)
    meta["t.arr_i32"] = (V.ARRAY, (V.INT32, ints))
    u64 = [0, 2**64 - 1, 12345]
    w.add_key_value("t.arr_u64", u64, V.ARRAY, sub_type=V.UINT64)
    meta["t.arr_u64"] = (V.ARRAY, (V.UINT64, u64))
    u8 = [0, 255, 7]
    w.add_key_value("t.arr_u8", u8, V.ARRAY, sub_type=V.UINT8)
    meta["t.arr_u8"] = (V.ARRAY, (V.UINT8, u8))
    bools = [True, False, True]
    w.add_array("t.arr_bool", bools)
    meta["t.arr_bool"] = (V.ARRAY, (V.BOOL, bools))
    nested = [[1, 2, 3], [4], [5, 6]]
    w.add_array("t.nested", nested)
    meta["t.nested"] = (V.ARRAY, (V.ARRAY, [(V.INT32, x) for x in nested]))

    tensors = {}

    def add(name, qtype, shape):  # shape in numpy order (outer first)
        be, bs = gguf.GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        data = random_blocks(qtype, rows * shape[-1] // be, rng)
        if qtype == T.F32:
            arr = data.view(np.float32).reshape(shape)
            w.add_tensor(name, arr)
        elif qtype == T.F16:
            arr = data.view(np.float16).reshape(shape)
            w.add_tensor(name, arr)
        else:
            arr = data.reshape(*shape[:-1], shape[-1] // be * bs)
            w.add_tensor(name, arr, raw_dtype=qtype)  # byte shape -> element shape
        ne = list(reversed(shape)) + [1] * (4 - len(shape))
        tensors[name] = (int(qtype), ne, data.tobytes())

    add("token_embd.weight", T.Q4_0, (5, 96))
    add("blk.0.attn_norm.weight", T.F32, (64,))
    add("blk.0.attn_q.weight", T.Q4_K, (3, 512))
    add("blk.0.ffn_down.weight", T.Q6_K, (2, 256))
    add("blk.0.ffn_gate_exps.weight", T.MXFP4, (4, 2, 64))
    add("blk.0.ffn_up.weight", T.F16, (3, 7))
    add("blk.0.attn_k.weight", T.BF16, (2, 5))
    add("blk.0.attn_v.weight", T.Q8_0, (1, 32))
    add("output.weight", T.IQ4_NL, (2, 64))  # readable even if not executable
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return meta, tensors


def dump(driver, path, outdir):
    outdir.mkdir(exist_ok=True)
    r = subprocess.run([str(driver), "dump", str(path), str(outdir)], capture_output=True, text=True)
    return r, (json.loads((outdir / "meta.json").read_text()) if r.returncode == 0 else None)


def check_value(got_type, got, exp_type, exp):
    assert got_type == int(exp_type)
    if exp_type == V.ARRAY:
        et, vals = exp
        assert got["elem_type"] == int(et)
        assert len(got["values"]) == len(vals)
        for g, e in zip(got["values"], vals):
            if et == V.ARRAY:
                check_value(V.ARRAY, g, V.ARRAY, e)
            else:
                assert g == e, (g, e)
    else:
        assert got == exp, (got, exp)


def test_writer_round_trip(driver, tmp_path):
    path = tmp_path / "model.gguf"
    meta, tensors = build_file(path, alignment=64)
    r, d = dump(driver, path, tmp_path / "dump")
    assert r.returncode == 0, r.stderr
    assert d["version"] == 3 and d["alignment"] == 64 and d["n_files"] == 1
    got = {kv["key"]: kv for kv in d["kv"]}
    assert set(got) == set(meta)
    for key, (vt, val) in meta.items():
        check_value(got[key]["type"], got[key]["value"], vt, val)
    ref = gguf.GGUFReader(str(path))
    ref_t = {t.name: t for t in ref.tensors}
    assert [t["name"] for t in d["tensors"]] == [t.name for t in ref.tensors]
    for i, t in enumerate(d["tensors"]):
        qtype, ne, data = tensors[t["name"]]
        assert t["type"] == qtype and t["ne"] == ne
        assert t["file_offset"] == ref_t[t["name"]].data_offset
        assert t["file_offset"] % 64 == 0
        assert (tmp_path / "dump" / f"{i}.bin").read_bytes() == data


def test_split_round_trip(driver, tmp_path):
    path = tmp_path / "big.gguf"
    meta, tensors = build_file(path, alignment=32, split_max_tensors=3)
    first = tmp_path / "big-00001-of-00003.gguf"
    assert first.exists()
    r, d = dump(driver, first, tmp_path / "dump")
    assert r.returncode == 0, r.stderr
    assert d["n_files"] == 3
    assert sorted(t["name"] for t in d["tensors"]) == sorted(tensors)
    assert {t["file_index"] for t in d["tensors"]} == {0, 1, 2}
    for i, t in enumerate(d["tensors"]):
        assert (tmp_path / "dump" / f"{i}.bin").read_bytes() == tensors[t["name"]][2]
    # a later part is refused with a pointer to the first
    r, _ = dump(driver, tmp_path / "big-00002-of-00003.gguf", tmp_path / "d2")
    assert r.returncode == 1 and "first part" in r.stderr
    # a missing part is an I/O error naming it
    (tmp_path / "big-00003-of-00003.gguf").unlink()
    r, _ = dump(driver, first, tmp_path / "d3")
    assert r.returncode == 4 and "00003-of-00003" in r.stderr


def test_truncated_files_never_crash(driver, tmp_path):
    path = tmp_path / "model.gguf"
    build_file(path, alignment=32)
    blob = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    # every prefix through the header and tensor infos, then a few into the data
    data_start = gguf.GGUFReader(str(path)).data_offset
    points = list(range(0, data_start + 1, 3)) + list(range(data_start, len(blob), 97))
    for n in points:
        cut.write_bytes(blob[:n])
        r, _ = dump(driver, cut, tmp_path / "dc")
        assert r.returncode == 2, f"prefix {n}: rc {r.returncode} {r.stderr}"
        assert "cut.gguf" in r.stderr and "\n" not in r.stderr.strip()
