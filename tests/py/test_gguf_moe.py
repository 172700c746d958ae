"""GGUF MoE architectures (qwen3moe, deepseek2) against the safetensors checkpoints they were converted
from (tools/make_gguf_moe.py; files in tests/data/gguf_moe, docs/GGUF.md "MoE GGUF files"):

- a BF16 GGUF gives the same logits, bit for bit, as its source checkpoint in our engine (both deepseek2
  kv_b layouts: the current converter's split attn_k_b / attn_v_b and the legacy attn_kv_b);
- a Q8_0 GGUF matches transformers' logits where transformers loads that GGUF (qwen3moe), and our engine on
  a safetensors checkpoint of its dequantized values (gguf.quants.dequantize) for every architecture;
- K-quant files (Q4_K_M- and Q2_K-style mixes of Q2_K..Q6_K on 256-wide rows) match transformers on exactly
  the values the file stores, on every ISA, resident and streamed;
- routed experts streamed through the expert cache (--expert-cache) give the same bits as resident ones,
  and --trace writes well-formed JSONL;
- bad files (a missing expert tensor, a wrong expert count, an unsupported block type) exit 2 with one
  line naming the tensor.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import MODELS, REPO

GGUF_DIR = REPO / "tests" / "data" / "gguf_moe"
SOURCE = {
    "qwen3moe-bf16": "qwen3-moe-bf16",
    "qwen3moe-q8_0": "qwen3-moe-bf16",
    "deepseek2-bf16": "deepseek-v3-bf16",
    "deepseek2-bf16-kvb": "deepseek-v3-bf16",
    "deepseek2-q8_0": "deepseek-v3-bf16",
}


def golden(src):
    return json.loads((MODELS / src / "golden.json").read_text())


def run(args, check=True, env=None):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env} if env else None)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}): {p.stderr}")
    return p


def eval_logits(dfbin, model, ids, tmp_path, extra=(), env=None):
    out = tmp_path / "logits.f32"
    run([dfbin, "eval", "--model", model, "--ids", ",".join(map(str, ids)), "--dump-logits", out, *extra], env=env)
    return np.fromfile(out, dtype="<f4")


def greedy(dfbin, model, prompt, extra=()):
    p = run([dfbin, "run", "--model", model, "--ids", ",".join(map(str, prompt)), "--max-new", "16", "--ignore-eos",
             "--print-ids", *extra])
    return [int(x) for x in p.stdout.split()]


def maker():
    gguf = pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO / "tools"))
    import make_gguf_moe
    return make_gguf_moe, gguf


@pytest.mark.parametrize("name", ["qwen3moe-bf16", "deepseek2-bf16", "deepseek2-bf16-kvb"])
def test_bf16_gguf_equals_safetensors(dfbin, name, tmp_path):
    src = SOURCE[name]
    g = golden(src)
    got = eval_logits(dfbin, GGUF_DIR / f"{name}.gguf", g["ids"], tmp_path)
    ref = eval_logits(dfbin, MODELS / src, g["ids"], tmp_path)
    assert got.size == len(g["ids"]) * g["vocab_size"]
    assert np.array_equal(got, ref), f"max |diff| {np.abs(got - ref).max():.3g}"
    assert greedy(dfbin, GGUF_DIR / f"{name}.gguf", g["greedy_prompt"]) == g["greedy"][:16]


def test_q8_0_qwen3moe_matches_transformers(dfbin, tmp_path):
    """transformers 5.24 loads qwen3moe GGUF files (gguf_file=); the golden was made from this file."""
    gj = json.loads((GGUF_DIR / "qwen3moe-q8_0.golden.json").read_text())
    n, V = len(gj["ids"]), gj["vocab_size"]
    ref = np.fromfile(GGUF_DIR / gj["logits"], dtype="<f4").reshape(n, V)
    got = eval_logits(dfbin, GGUF_DIR / "qwen3moe-q8_0.gguf", gj["ids"], tmp_path).reshape(n, V)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-3, f"relative L2 {rel.max():.3g} at position {rel.argmax()}"
    assert (got.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("name", ["qwen3moe-q8_0", "deepseek2-q8_0"])
def test_q8_0_matches_dequantized_checkpoint(dfbin, name, tmp_path):
    """transformers has no deepseek2 GGUF loader: the reference is our engine on an F32 safetensors
    checkpoint holding exactly the values the GGUF stores (kv_b rebuilt from attn_k_b / attn_v_b)."""
    mk, _ = maker()
    src = SOURCE[name]
    ckpt = tmp_path / "deq"
    mk.dequantized_checkpoint(str(GGUF_DIR / f"{name}.gguf"), str(MODELS / src), str(ckpt))
    g = golden(src)
    n = len(g["ids"])
    got = eval_logits(dfbin, GGUF_DIR / f"{name}.gguf", g["ids"], tmp_path).reshape(n, -1)
    ref = eval_logits(dfbin, ckpt, g["ids"], tmp_path).reshape(n, -1)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-4, f"relative L2 {rel.max():.3g} at position {rel.argmax()}"
    assert (got.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("name", ["qwen3moe-bf16", "deepseek2-bf16", "deepseek2-q8_0"])
def test_streamed_equals_resident(dfbin, name, tmp_path):
    src = SOURCE[name]
    g = golden(src)
    model = GGUF_DIR / f"{name}.gguf"
    resident = eval_logits(dfbin, model, g["ids"], tmp_path)
    ids = greedy(dfbin, model, g["greedy_prompt"])
    for cache in ("0", "200K"):
        trace = tmp_path / f"trace-{cache}.jsonl"
        streamed = eval_logits(dfbin, model, g["ids"], tmp_path, ["--expert-cache", cache, "--trace", trace])
        assert np.array_equal(streamed, resident), f"--expert-cache {cache}: max |diff| {np.abs(streamed - resident).max():.3g}"
        check_trace(trace, src)
        assert greedy(dfbin, model, g["greedy_prompt"], ["--expert-cache", cache]) == ids


def check_trace(path, src):
    cfg = json.loads((MODELS / src / "config.json").read_text())
    E = cfg.get("num_experts") or cfg.get("n_routed_experts")
    if cfg["model_type"] == "qwen3_moe":
        moe_layers = {l for l in range(cfg["num_hidden_layers"]) if l not in cfg.get("mlp_only_layers", [])}
    else:
        moe_layers = set(range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]))
    check_trace_layers(path, moe_layers, E)


def check_trace_layers(path, moe_layers, E):
    lines = path.read_text().splitlines()
    assert lines, "empty trace"
    seen = set()
    for line in lines:
        r = json.loads(line)
        assert set(r) == {"token", "layer", "experts"}, r
        assert r["layer"] in moe_layers and isinstance(r["token"], int) and r["token"] >= 0
        assert r["experts"], r
        for x in r["experts"]:
            assert set(x) == {"id", "served", "wait_us"}, x
            assert 0 <= x["id"] < E and x["served"] in ("hit", "prefetch_hit", "prefetch_wait", "read") and x["wait_us"] >= 0
        seen.add(r["layer"])
    assert seen == moe_layers


# ------------------------------------------------------------------------------------------ K-quant files
K_FILES = ["qwen3moe-q4_k_m", "qwen3moe-q2_k", "deepseek2-q4_k_m", "deepseek2-q2_k"]


def k_golden(name):
    gj = json.loads((GGUF_DIR / f"{name}.golden.json").read_text())
    ref = np.fromfile(GGUF_DIR / gj["logits"], dtype="<f4").reshape(len(gj["ids"]), gj["vocab_size"])
    return gj, ref


@pytest.mark.parametrize("isa", ["auto", "scalar", "avx2"])
@pytest.mark.parametrize("name", K_FILES)
def test_kquant_matches_transformers(dfbin, name, isa, tmp_path):
    """Q4_K_M- and Q2_K-style mixes (Q2_K..Q6_K, Q8_0 fallback rows) with 256-wide rows, made by
    tools/make_gguf_moe.py: transformers' logits on exactly the file's values (qwen3moe: loaded from the GGUF
    itself; deepseek2: gguf-py's dequantized values, as transformers has no deepseek2 GGUF loader)."""
    gj, ref = k_golden(name)
    env = None if isa == "auto" else {"DELTAFIN_ISA": isa}
    got = eval_logits(dfbin, GGUF_DIR / f"{name}.gguf", gj["ids"], tmp_path, env=env).reshape(ref.shape)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-4, f"relative L2 {rel.max():.3g} at position {rel.argmax()}"
    assert (got.argmax(1) == ref.argmax(1)).all()
    if isa == "auto":
        assert greedy(dfbin, GGUF_DIR / f"{name}.gguf", gj["greedy_prompt"]) == gj["greedy"]


@pytest.mark.parametrize("name", K_FILES)
def test_kquant_streamed_equals_resident(dfbin, name, tmp_path):
    gguf = pytest.importorskip("gguf")
    gj, _ = k_golden(name)
    model = GGUF_DIR / f"{name}.gguf"
    r = gguf.GGUFReader(str(model))
    moe = {int(t.name.split(".")[1]) for t in r.tensors if t.name.endswith("ffn_gate_exps.weight")}
    E = next(int(t.shape[-1]) for t in r.tensors if t.name.endswith("ffn_gate_exps.weight"))
    types = {t.name.split(".", 2)[2]: t.tensor_type.name for t in r.tensors if "_exps" in t.name}
    assert {v for v in types.values()} & {"Q2_K", "Q3_K", "Q4_K", "Q6_K"}, types
    resident = eval_logits(dfbin, model, gj["ids"], tmp_path)
    for cache in ("0", "300K"):
        trace = tmp_path / f"trace-{cache}.jsonl"
        streamed = eval_logits(dfbin, model, gj["ids"], tmp_path, ["--expert-cache", cache, "--trace", trace])
        assert np.array_equal(streamed, resident), f"--expert-cache {cache}: max |diff| {np.abs(streamed - resident).max():.3g}"
        check_trace_layers(trace, moe, E)
    assert greedy(dfbin, model, gj["greedy_prompt"], ["--expert-cache", "0"]) == gj["greedy"]


# ------------------------------------------------------------------------------------------ bad files
def bad_gguf(tmp_path, src, mutate):
    mk, _ = maker()
    out = tmp_path / "bad.gguf"
    mk.write_gguf(str(MODELS / src), str(out), "bf16", mutate=mutate)
    return out


def expect_error(dfbin, model, *needles, extra=()):
    p = run([dfbin, "eval", "--model", model, "--ids", "1,2,3", "--dump-logits", os.devnull, *extra], check=False)
    assert p.returncode == 2, f"exit {p.returncode}, stderr {p.stderr!r}"
    msg = p.stderr.strip()
    assert msg.count("\n") == 0, f"expected one line, got {msg!r}"
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


@pytest.mark.parametrize("src,tensor", [("qwen3-moe-bf16", "blk.2.ffn_up_exps.weight"),
                                        ("deepseek-v3-bf16", "blk.1.ffn_down_exps.weight"),
                                        ("deepseek-v3-bf16", "blk.2.attn_k_b.weight")])
@pytest.mark.parametrize("stream", [False, True])
def test_missing_tensor(dfbin, tmp_path, src, tensor, stream):
    f = bad_gguf(tmp_path, src, lambda items: items.__delitem__([i[0] for i in items].index(tensor)))
    expect_error(dfbin, f, f"missing tensor '{tensor}'", extra=["--expert-cache", "0"] if stream else [])


@pytest.mark.parametrize("src", ["qwen3-moe-bf16", "deepseek-v3-bf16"])
def test_wrong_expert_count(dfbin, tmp_path, src):
    tensor = "blk.2.ffn_gate_exps.weight"

    def drop_last_expert(items):
        i = [x[0] for x in items].index(tensor)
        name, (dt, a), kind = items[i]
        items[i] = (name, (dt, a[:-1]), kind)
    f = bad_gguf(tmp_path, src, drop_last_expert)
    expect_error(dfbin, f, tensor, "experts")


@pytest.mark.parametrize("src,tensor", [("qwen3-moe-bf16", "blk.0.ffn_gate_exps.weight"),
                                        ("deepseek-v3-bf16", "blk.1.attn_v_b.weight")])
def test_unsupported_type(dfbin, tmp_path, src, tensor):
    """An IQ4_NL tensor (32 weights in 18 bytes; not executable here), written as raw bytes."""
    mk, gguf = maker()

    def to_iq4_nl(items):
        i = [x[0] for x in items].index(tensor)
        name, (dt, a), kind = items[i]
        shape = list(a.shape)
        nbytes = shape[:-1] + [shape[-1] // 32 * 18]
        raw = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
        items[i] = (name, (gguf.GGMLQuantizationType.IQ4_NL, raw), kind)
    f = bad_gguf(tmp_path, src, to_iq4_nl)
    expect_error(dfbin, f, tensor, "IQ4_NL", "not supported")


def test_softmax_router_refused(dfbin, tmp_path):
    """DeepSeek-V2 GGUFs (softmax gating, no expert_gating_func key) are refused, not run wrongly."""
    mk, gguf = maker()
    out = tmp_path / "v2.gguf"
    orig = mk.gguf.GGUFWriter.add_expert_gating_func
    try:
        mk.gguf.GGUFWriter.add_expert_gating_func = lambda self, v: None
        mk.write_gguf(str(MODELS / "deepseek-v3-bf16"), str(out), "bf16")
    finally:
        mk.gguf.GGUFWriter.add_expert_gating_func = orig
    expect_error(dfbin, out, "deepseek2.expert_gating_func", "softmax")


@pytest.mark.parametrize("src", ["qwen3-moe-bf16", "deepseek-v3-bf16"])
def test_split_parts_stream(dfbin, tmp_path, src):
    """A model split into parts (-0000k-of-0000N.gguf): experts stream from whichever part holds them."""
    mk, _ = maker()
    mk.write_gguf(str(MODELS / src), str(tmp_path / "m.gguf"), "bf16", split_max_tensors=15)
    parts = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(parts) >= 3
    g = golden(src)
    ref = eval_logits(dfbin, MODELS / src, g["ids"], tmp_path)
    for extra in ([], ["--expert-cache", "0"], ["--expert-cache", "200K"]):
        got = eval_logits(dfbin, parts[0], g["ids"], tmp_path, extra)
        assert np.array_equal(got, ref), f"{extra}: max |diff| {np.abs(got - ref).max():.3g}"
