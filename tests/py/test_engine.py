"""Engine core parity: our logits and greedy continuations against golden
references computed by Hugging Face transformers (float32, eager attention)
on tiny random checkpoints with the real layouts and key names
(tools/make_checkpoints.py; docs/TEST_MODELS.md). Also sampling
reproducibility, EOS stopping, inspect, and bad-input handling."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from conftest import MODELS

MODEL_NAMES = sorted(p.name for p in MODELS.iterdir() if (p / "golden.json").exists())


def golden(name):
    return json.loads((MODELS / name / "golden.json").read_text())


def run(args, env=None, check=True):
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}): {p.stderr}")
    return p


def eval_logits(dfbin, model_dir, ids, tmp_path, env=None):
    out = tmp_path / "logits.f32"
    run([dfbin, "eval", "--model", str(model_dir), "--ids", ",".join(map(str, ids)), "--dump-logits", str(out)], env=env)
    return np.fromfile(out, dtype="<f4")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_golden_logits(dfbin, name, tmp_path):
    g = golden(name)
    n, V = len(g["ids"]), g["vocab_size"]
    ref = np.fromfile(MODELS / name / g["logits"], dtype="<f4").reshape(n, V)
    got = eval_logits(dfbin, MODELS / name, g["ids"], tmp_path)
    assert got.size == n * V, f"expected {n}x{V} logits, got {got.size}"
    got = got.reshape(n, V)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-3, f"per-position relative L2 error {rel.max():.3g} at position {rel.argmax()}"
    assert (got.argmax(1) == ref.argmax(1)).all(), "argmax differs from transformers"


@pytest.mark.parametrize("name", ["qwen3-moe-bf16", "llama-bf16", "deepseek-v3-fp8", "kimi-linear-tiny", "kimi-k3-tiny"])
def test_eval_decode_from(dfbin, name, tmp_path):
    """--decode-from K: the first K ids in one pass, then one-token decode steps; every row still matches transformers'
    teacher-forced logits (the decode path's kernels, compared position by position)."""
    g = golden(name)
    n, V = len(g["ids"]), g["vocab_size"]
    ref = np.fromfile(MODELS / name / g["logits"], dtype="<f4").reshape(n, V)
    out = tmp_path / "dec.f32"
    p = run([dfbin, "eval", "--model", str(MODELS / name), "--ids", ",".join(map(str, g["ids"])), "--decode-from", "5", "--dump-logits", str(out)])
    got = np.fromfile(out, dtype="<f4").reshape(n, V)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-3, f"per-position relative L2 error {rel.max():.3g} at position {rel.argmax()}"
    assert (got.argmax(1) == ref.argmax(1)).all()
    assert [int(x) for x in p.stdout.split()] == got.argmax(1).tolist()
    for bad in ("0", str(n + 1), "2x"):
        p = run([dfbin, "eval", "--model", str(MODELS / name), "--ids", "1,2", "--decode-from", bad, "--dump-logits", os.devnull], check=False)
        assert p.returncode == 2 and "--decode-from" in p.stderr, (bad, p.stderr)
    p = run([dfbin, "eval", "--model", str(MODELS / name), "--ids", "1,2", "--decode-from", "1", "--dump-mtp-logits", os.devnull,
             "--dump-logits", os.devnull], check=False)
    assert p.returncode == 2 and "--dump-mtp-logits" in p.stderr, p.stderr


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_greedy_continuation(dfbin, name):
    g = golden(name)
    p = run([dfbin, "run", "--model", str(MODELS / name), "--ids", ",".join(map(str, g["greedy_prompt"])),
             "--max-new", str(len(g["greedy"])), "--ignore-eos", "--print-ids"])
    got = [int(x) for x in p.stdout.split()]
    assert got == g["greedy"]


@pytest.mark.parametrize("isa", ["scalar", "avx2"])
@pytest.mark.parametrize("name", ["deepseek-v3-fp8", "kimi-k2-int4", "qwen3-f16", "llama-bf16"])
def test_every_isa_matches(dfbin, name, isa, tmp_path):
    """The run-time dispatch picks AVX-512 here; the other kernels must agree too."""
    g = golden(name)
    n, V = len(g["ids"]), g["vocab_size"]
    ref = np.fromfile(MODELS / name / g["logits"], dtype="<f4").reshape(n, V)
    got = eval_logits(dfbin, MODELS / name, g["ids"], tmp_path, env={"DELTAFIN_ISA": isa}).reshape(n, V)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-3 and (got.argmax(1) == ref.argmax(1)).all()


def test_incremental_decode_equals_teacher_forcing(dfbin, tmp_path):
    """Greedy decode (KV cache, one token at a time) must pick the argmax of a
    full teacher-forced pass over the same sequence."""
    name = "deepseek-v3-bf16"
    g = golden(name)
    prompt = g["greedy_prompt"]
    p = run([dfbin, "run", "--model", str(MODELS / name), "--ids", ",".join(map(str, prompt)), "--max-new", "12",
             "--ignore-eos", "--print-ids"])
    cont = [int(x) for x in p.stdout.split()]
    seq = prompt + cont
    V = g["vocab_size"]
    logits = eval_logits(dfbin, MODELS / name, seq, tmp_path).reshape(len(seq), V)
    assert list(logits.argmax(1)[len(prompt) - 1:-1]) == cont


def test_sampling_is_reproducible(dfbin):
    m = str(MODELS / "qwen3-moe-bf16")
    base = [dfbin, "run", "--model", m, "--ids", "5,6,7,8", "--max-new", "24", "--ignore-eos", "--print-ids",
            "--temperature", "1.5", "--top-p", "0.95", "--top-k", "200"]
    a = run(base + ["--seed", "42"]).stdout
    b = run(base + ["--seed", "42"]).stdout
    c = run(base + ["--seed", "43"]).stdout
    greedy = run([dfbin, "run", "--model", m, "--ids", "5,6,7,8", "--max-new", "24", "--ignore-eos", "--print-ids"]).stdout
    assert a == b
    assert a != c or a != greedy


@pytest.mark.parametrize("opt,val", [("--temperature", "nan"), ("--temperature", "inf"), ("--temperature", "1e39"),
                                     ("--top-p", "nan"), ("--min-p", "nan"), ("--top-p", "-inf")])
def test_sampling_options_refuse_non_finite(dfbin, opt, val):
    """NaN passes every `x < lo` check by comparison, and inf / a value beyond float range makes NaN
    probabilities: the run used to exit 0 printing token 0 forever."""
    p = run([dfbin, "run", "--model", str(MODELS / "llama-bf16"), "--ids", "5,6,7", "--max-new", "2", "--print-ids",
             opt, val], check=False)
    assert p.returncode == 2, f"exit {p.returncode}, stdout {p.stdout!r}, stderr {p.stderr!r}"
    msg = p.stderr.strip()
    assert msg.count("\n") == 0 and opt in msg and f"'{val}'" in msg, msg


def test_tiny_temperature_is_greedy(dfbin):
    """logit / 1e-44 overflows to inf; the draw is then the T -> 0 limit (greedy), not inf - inf = NaN."""
    base = [dfbin, "run", "--model", str(MODELS / "qwen3-moe-bf16"), "--ids", "5,6,7,8", "--max-new", "8", "--ignore-eos",
            "--print-ids"]
    assert run(base + ["--temperature", "1e-44", "--seed", "3"]).stdout == run(base).stdout


@pytest.mark.parametrize("args,needle", [(["--threads", "2000"], "--threads: expected 1..1024, got '2000'"),
                                         (["--threads", "0"], "--threads: expected 1..1024, got '0'"),
                                         (["--threads", "abc"], "--threads: expected 1..1024, got 'abc'"),
                                         (["--bogus"], "unknown option '--bogus'")])
def test_bench_floors_refuses_bad_options(dfbin, args, needle):
    """--threads went through atoi into a pool whose per-thread results lived in 256-entry arrays
    (--threads 300 wrote past them); a bad value silently meant "one per CPU"."""
    p = run([dfbin, "bench", "floors", *args], check=False)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and needle in p.stderr, (p.returncode, p.stderr)


def test_stops_at_eos(dfbin, tmp_path):
    name = "llama-bf16"
    g = golden(name)
    d = tmp_path / name
    shutil.copytree(MODELS / name, d)
    gc = json.loads((d / "generation_config.json").read_text())
    gc["eos_token_id"] = [g["greedy"][5]]
    (d / "generation_config.json").write_text(json.dumps(gc))
    p = run([dfbin, "run", "--model", str(d), "--ids", ",".join(map(str, g["greedy_prompt"])), "--max-new", "32",
             "--print-ids"])
    got = [int(x) for x in p.stdout.split()]
    first = g["greedy"].index(g["greedy"][5])
    assert got == g["greedy"][:first]


def test_inspect(dfbin):
    p = run([dfbin, "inspect", "--model", str(MODELS / "deepseek-v3-fp8")])
    out = p.stdout
    assert "deepseek_v3" in out and "MLA" in out and "FP8_E4M3" in out
    assert "weight_block_size [16, 32]" in out
    assert "active per token" in out
    p = run([dfbin, "inspect", "--model", str(MODELS / "kimi-k2-int4")])
    assert "INT4" in p.stdout and "kimi_k2" in p.stdout


# ---- bad input: one clear line, exit code 2, never a crash ------------------------------------

def read_st(path):
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def write_st(path, header, data):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def broken_copy(tmp_path, name="llama-bf16"):
    d = tmp_path / "m"
    shutil.copytree(MODELS / name, d)
    return d


def expect_error(dfbin, d, *needles):
    p = run([dfbin, "eval", "--model", str(d), "--ids", "1,2,3", "--dump-logits", os.devnull], check=False)
    assert p.returncode == 2, f"exit {p.returncode}, stderr {p.stderr!r}"
    msg = p.stderr.strip()
    assert msg.count("\n") == 0, f"expected one line, got {msg!r}"
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def test_truncated_file(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    expect_error(dfbin, d, "model.safetensors", "past the data section")


def test_header_offsets_out_of_bounds(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    f = d / "model.safetensors"
    h, data = read_st(f)
    name = "model.layers.0.self_attn.q_proj.weight"
    b, e = h[name]["data_offsets"]
    h[name]["data_offsets"] = [b + len(data), e + len(data)]
    write_st(f, h, data)
    expect_error(dfbin, d, name, "past the data section")


def test_overlapping_tensors(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    f = d / "model.safetensors"
    h, data = read_st(f)
    a, b = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"
    h[b]["data_offsets"] = h[a]["data_offsets"]
    write_st(f, h, data)
    expect_error(dfbin, d, "overlap")


def test_dtype_shape_mismatch(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    f = d / "model.safetensors"
    h, data = read_st(f)
    name = "model.layers.0.mlp.up_proj.weight"
    h[name]["dtype"] = "F32"
    write_st(f, h, data)
    expect_error(dfbin, d, name, "need", "bytes")


def test_wrong_shape(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    f = d / "model.safetensors"
    h, data = read_st(f)
    name = "model.layers.1.self_attn.k_proj.weight"
    r, c = h[name]["shape"]
    h[name]["shape"] = [c, r]
    write_st(f, h, data)
    expect_error(dfbin, d, name, "expected shape")


def test_missing_tensor(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    f = d / "model.safetensors"
    h, data = read_st(f)
    del h["model.layers.1.mlp.down_proj.weight"]
    write_st(f, h, data)
    expect_error(dfbin, d, "missing tensor 'model.layers.1.mlp.down_proj.weight'")


def test_bad_header_json(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    f = d / "model.safetensors"
    b = bytearray(f.read_bytes())
    b[8] = ord("x")  # the opening brace
    f.write_bytes(bytes(b))
    expect_error(dfbin, d, "model.safetensors", "JSON")


def test_unknown_model_type(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    c = json.loads((d / "config.json").read_text())
    c["model_type"] = "mamba9"
    (d / "config.json").write_text(json.dumps(c))
    expect_error(dfbin, d, "config.json", "model_type \"mamba9\" is not supported")


def test_unknown_quantization(dfbin, tmp_path):
    d = broken_copy(tmp_path)
    c = json.loads((d / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (d / "config.json").write_text(json.dumps(c))
    expect_error(dfbin, d, "quant_method \"gptq\" is not supported")


def test_fp8_scale_shape_checked(dfbin, tmp_path):
    """The block size comes from weight_block_size: a wrong one makes every scale tensor's shape wrong."""
    d = broken_copy(tmp_path, "deepseek-v3-fp8")
    c = json.loads((d / "config.json").read_text())
    c["quantization_config"]["weight_block_size"] = [128, 128]
    (d / "config.json").write_text(json.dumps(c))
    expect_error(dfbin, d, "weight_scale_inv", "expected shape")


def test_int4_ignore_list_checked(dfbin, tmp_path):
    """An expert the ignore list says is unquantized but is stored packed is an error."""
    d = broken_copy(tmp_path, "kimi-k2-int4")
    c = json.loads((d / "config.json").read_text())
    c["quantization_config"]["ignore"].append("re:.*experts.*")
    (d / "config.json").write_text(json.dumps(c))
    expect_error(dfbin, d, "quantization_config.ignore")


def test_sharded_index_mismatch(dfbin, tmp_path):
    d = broken_copy(tmp_path, "llama-f32-tied")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    k = next(iter(idx["weight_map"]))
    shards = sorted(set(idx["weight_map"].values()))
    idx["weight_map"][k] = [s for s in shards if s != idx["weight_map"][k]][0]
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    expect_error(dfbin, d, "weight_map")


def test_bad_ids(dfbin):
    p = run([dfbin, "eval", "--model", str(MODELS / "llama-bf16"), "--ids", "1,2,99999", "--dump-logits", os.devnull], check=False)
    assert p.returncode == 2 and "out of range" in p.stderr
    p = run([dfbin, "eval", "--model", str(MODELS / "llama-bf16"), "--ids", "1,x"], check=False)
    assert p.returncode == 2 and "--ids" in p.stderr


def test_missing_model(dfbin, tmp_path):
    p = run([dfbin, "run", "--model", str(tmp_path / "nope"), "--ids", "1"], check=False)
    assert p.returncode == 2 and "nope" in p.stderr


@pytest.mark.parametrize("name", ["llama-bf16", "qwen3-moe-bf16", "deepseek-v3-bf16", "qwen3-moe-k70"])
def test_state_bytes_in_stats_and_inspect(dfbin, name):
    """Session state per token, computed from config.json as the layer kinds store it: GQA keeps K and V rows
    (2 x kv_heads x head_dim floats per layer), MLA the latent and the rotated key (kv_lora + rope floats)."""
    c = json.loads((MODELS / name / "config.json").read_text())
    L = c["num_hidden_layers"]
    if "kv_lora_rank" in c:
        want = L * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 4
    else:
        hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        want = L * 2 * c["num_key_value_heads"] * hd * 4
    p = run([dfbin, "run", "--model", str(MODELS / name), "--ids", "1,2,3", "--max-new", "1", "--stats"])
    assert f"session state {want} B per token + 0 B fixed" in p.stderr, p.stderr
    out = run([dfbin, "inspect", "--model", str(MODELS / name)]).stdout
    assert f"state        {want} B per token" in out and "prefix reuse by truncation" in out, out
    # where things live: the CPU backend unless --backend says otherwise
    assert "[stats] backend cpu (" in p.stderr, p.stderr
    assert "backend      cpu, " in out and "host memory" in out, out
