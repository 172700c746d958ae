"""Expert store and streaming (issue 4): routed experts streamed from disk
through the engine's expert cache give logits and continuations bit-identical
to an all-resident run, for every MoE family and dtype, with a cache smaller
than one layer's experts; packs, manifests and checksums (xxh3, checked here
with the independent `xxhash` package); corruption detection; resumable and
verified setup; disk-full handling; traces; the memory budget (peak RSS)."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from conftest import MODELS

MOE = ["qwen3-moe-bf16", "qwen3-moe-v5cfg", "deepseek-v3-bf16", "deepseek-v3-fp8", "deepseek-v3-noyarn", "kimi-k2-int4", "kimi-k3-tiny", "kimi-k3-mxfp4", "kimi-linear-tiny"]


def run(args, env=None, check=True):
    p = subprocess.run(args, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    if check and p.returncode != 0:
        raise AssertionError(f"{args}: exit {p.returncode}: {p.stderr}")
    return p


def golden(name):
    return json.loads((MODELS / name / "golden.json").read_text())


def logits(dfbin, model, ids, path, *extra, env=None):
    run([dfbin, "eval", "--model", str(model), "--ids", ",".join(map(str, ids)), "--dump-logits", str(path), *extra], env=env)
    return path.read_bytes()


def greedy(dfbin, model, ids, *extra, env=None):
    return run([dfbin, "run", "--model", str(model), "--ids", ",".join(map(str, ids)), "--max-new", "24", "--ignore-eos",
                "--print-ids", *extra], env=env).stdout


@pytest.fixture(scope="module")
def stores(dfbin, tmp_path_factory):
    out = {}
    for name in MOE:
        d = tmp_path_factory.mktemp("store") / name
        run([dfbin, "setup", "--from", str(MODELS / name), "--out", str(d), "--pack"])
        out[name] = d
    return out


@pytest.mark.parametrize("name", MOE)
def test_streamed_equals_resident_bitwise(dfbin, name, stores, tmp_path):
    g = golden(name)
    ref = logits(dfbin, MODELS / name, g["ids"], tmp_path / "r.f32")
    # a cache smaller than one layer's experts (the minimum: top-k slots), straight from the shards
    assert logits(dfbin, MODELS / name, g["ids"], tmp_path / "a.f32", "--expert-cache", "0") == ref
    # a packed store, and synchronous pread instead of io_uring
    assert logits(dfbin, stores[name], g["ids"], tmp_path / "b.f32") == ref
    assert logits(dfbin, stores[name], g["ids"], tmp_path / "c.f32", env={"DELTAFIN_NO_IO_URING": "1"}) == ref
    base = greedy(dfbin, MODELS / name, g["greedy_prompt"])
    assert base.split() == [str(x) for x in g["greedy"][:24]]
    # decode with router-lookahead prefetch (a cache with room for it) and without
    assert greedy(dfbin, stores[name], g["greedy_prompt"], "--expert-cache", "2M") == base
    assert greedy(dfbin, MODELS / name, g["greedy_prompt"], "--expert-cache", "0") == base


def test_direct_store_without_pack(dfbin, tmp_path):
    name = "kimi-k2-int4"
    g = golden(name)
    d = tmp_path / "direct"
    run([dfbin, "setup", "--from", str(MODELS / name), "--out", str(d)])
    man = json.loads((d / "manifest.json").read_text())
    assert man["packed"] is False and all(os.path.isabs(f) for f in man["files"])
    assert not (d / "packs").exists()
    assert logits(dfbin, d, g["ids"], tmp_path / "a.f32") == logits(dfbin, MODELS / name, g["ids"], tmp_path / "b.f32")


def test_manifest_checksums_and_layout(stores):
    xxhash = pytest.importorskip("xxhash")
    name = "deepseek-v3-fp8"
    d = stores[name]
    man = json.loads((d / "manifest.json").read_text())
    assert man["format"] == "deltafin-store" and man["complete"] is True and man["spine"]["exact"] is True
    src = {f["name"]: f for f in man["source"]["files"]}
    import hashlib
    for fname, f in src.items():
        assert hashlib.sha256((MODELS / name / fname).read_bytes()).hexdigest() == f["sha256"]
    assert man["experts"], "no experts recorded"
    for x in man["experts"]:
        blob = b""
        offs = [p["offset"] for p in x["parts"]]
        assert offs[0] % 4096 == 0, "each expert starts 4 KiB-aligned"
        assert all(a + p["length"] == b for a, p, b in zip(offs, x["parts"], offs[1:])), "parts are contiguous"
        for p in x["parts"]:
            with open(d / man["files"][p["file"]], "rb") as fh:
                fh.seek(p["offset"])
                blob += fh.read(p["length"])
        assert xxhash.xxh3_64_hexdigest(blob) == x["xxh3"]


def test_store_dirs_spread_layers(dfbin, tmp_path):
    name = "qwen3-moe-bf16"
    d = tmp_path / "s"
    a, b = tmp_path / "driveA", tmp_path / "driveB"
    run([dfbin, "setup", "--from", str(MODELS / name), "--out", str(d), "--pack", "--store-dirs", f"{a},{b}"])
    man = json.loads((d / "manifest.json").read_text())
    used = {man["files"][x["parts"][0]["file"]].split("/")[-2] for x in man["experts"] if x["layer"] == 0}
    assert used == {"driveA", "driveB"}, "one layer's experts go to every drive"
    g = golden(name)
    assert logits(dfbin, d, g["ids"], tmp_path / "a.f32") == logits(dfbin, MODELS / name, g["ids"], tmp_path / "b.f32")


def test_flipped_byte_is_detected(dfbin, stores, tmp_path):
    name = "qwen3-moe-bf16"
    d = tmp_path / "s"
    shutil.copytree(stores[name], d)
    man = json.loads((d / "manifest.json").read_text())
    x = man["experts"][5]
    p = x["parts"][1]
    f = d / man["files"][p["file"]]
    b = bytearray(f.read_bytes())
    b[p["offset"] + 7] ^= 0x10
    f.write_bytes(bytes(b))
    g = golden(name)
    r = run([dfbin, "eval", "--model", str(d), "--ids", ",".join(map(str, g["ids"])), "--dump-logits", os.devnull], check=False)
    assert r.returncode != 0
    assert f"checksum mismatch for layer {x['layer']} expert {x['expert']}" in r.stderr


def tree_bytes(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_killed_setup_resumes_to_the_same_store(dfbin, tmp_path):
    name = "kimi-k2-int4"
    clean, d = tmp_path / "clean", tmp_path / "killed"
    run([dfbin, "setup", "--from", str(MODELS / name), "--out", str(clean), "--pack"])
    r = run([dfbin, "setup", "--from", str(MODELS / name), "--out", str(d), "--pack"], env={"DELTAFIN_TEST_ABORT_AFTER_LAYERS": "1"}, check=False)
    assert r.returncode == 9, "the test hook kills setup after one layer"
    assert not (d / "manifest.json").exists(), "a killed setup leaves nothing marked complete"
    r = run([dfbin, "eval", "--model", str(d), "--ids", "1,2", "--dump-logits", os.devnull], check=False)
    assert r.returncode == 2 and "no config" not in r.stderr
    r = run([dfbin, "setup", "--from", str(MODELS / name), "--out", str(d), "--pack"])
    assert "resuming" in r.stderr
    a, b = tree_bytes(clean), tree_bytes(d)
    assert a.keys() == b.keys()
    for k in a:
        if k == "manifest.json":
            ma, mb = json.loads(a[k]), json.loads(b[k])
            assert ma["experts"] == mb["experts"] and ma["source"]["files"] == mb["source"]["files"]
        else:
            assert a[k] == b[k], k


def test_full_disk_stops_cleanly(dfbin, tmp_path):
    d = tmp_path / "full"
    r = run([dfbin, "setup", "--from", str(MODELS / "deepseek-v3-bf16"), "--out", str(d), "--pack"],
            env={"DELTAFIN_TEST_WRITE_LIMIT": "200000"}, check=False)
    assert r.returncode != 0
    assert "No space left on device" in r.stderr and "not marked complete" in r.stderr
    assert not (d / "manifest.json").exists()


def test_full_disk_real_tmpfs(dfbin, tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        r = run([dfbin, "setup", "--from", str(MODELS / "deepseek-v3-bf16"), "--out", str(mnt / "s"), "--pack"], check=False)
        assert r.returncode != 0 and "No space left on device" in r.stderr
        assert not (mnt / "s" / "manifest.json").exists()
    finally:
        subprocess.run(["umount", str(mnt)])


def test_trace_is_well_formed(dfbin, tmp_path):
    name = "deepseek-v3-fp8"
    g = golden(name)
    tr = tmp_path / "t.jsonl"
    run([dfbin, "run", "--model", str(MODELS / name), "--ids", ",".join(map(str, g["greedy_prompt"])), "--max-new", "8",
         "--ignore-eos", "--print-ids", "--expert-cache", "0", "--trace", str(tr)])
    lines = [json.loads(l) for l in tr.read_text().splitlines()]
    cfg = json.loads((MODELS / name / "config.json").read_text())
    moe_layers = {l for l in range(cfg["num_hidden_layers"]) if l >= cfg["first_k_dense_replace"]}
    assert {x["layer"] for x in lines} == moe_layers
    decode = [x for x in lines if x["token"] >= len(g["greedy_prompt"])]
    assert decode and all(len(x["experts"]) == cfg["num_experts_per_tok"] for x in decode)
    for x in lines:
        for e in x["experts"]:
            assert 0 <= e["id"] < cfg["n_routed_experts"] and e["served"] in {"hit", "prefetch_hit", "prefetch_wait", "read"}
            assert e["wait_us"] >= 0


def test_bad_store_inputs(dfbin, stores, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(stores["qwen3-moe-bf16"], d)
    man = json.loads((d / "manifest.json").read_text())
    man["complete"] = False
    (d / "manifest.json").write_text(json.dumps(man))
    r = run([dfbin, "eval", "--model", str(d), "--ids", "1", "--dump-logits", os.devnull], check=False)
    assert r.returncode == 2 and "incomplete" in r.stderr
    man["complete"] = True
    man["experts"][0]["parts"][0]["length"] += 2
    (d / "manifest.json").write_text(json.dumps(man))
    r = run([dfbin, "eval", "--model", str(d), "--ids", "1", "--dump-logits", os.devnull], check=False)
    assert r.returncode == 2 and "need" in r.stderr
    r = run([dfbin, "setup", "--from", str(MODELS / "llama-bf16"), "--out", str(tmp_path / "x")], check=False)
    assert r.returncode == 2 and "not a mixture-of-experts" in r.stderr


def make_big_moe(d, layers=4, experts=48, hidden=256, inter=512, vocab=512):
    """A qwen3_moe checkpoint whose experts (~150 MB) dwarf its spine (numpy only)."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(1)
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": vocab, "hidden_size": hidden,
           "intermediate_size": 512, "moe_intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 64, "num_experts": experts, "num_experts_per_tok": 4, "norm_topk_prob": True,
           "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 4096, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    (d / "config.json").write_text(json.dumps(cfg))

    def bf(*shape, scale=None):
        a = (rng.standard_normal(shape) * (scale or 1 / np.sqrt(shape[-1]))).astype(np.float32)
        return (a.view(np.uint32) >> 16).astype(np.uint16)

    t = {"model.embed_tokens.weight": bf(vocab, hidden, scale=1.0), "lm_head.weight": bf(vocab, hidden),
         "model.norm.weight": bf(hidden, scale=0.1) * 0 + 0x3F80}
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = np.full(hidden, 0x3F80, np.uint16)
        t[p + "post_attention_layernorm.weight"] = np.full(hidden, 0x3F80, np.uint16)
        t[p + "self_attn.q_proj.weight"] = bf(4 * 64, hidden)
        t[p + "self_attn.k_proj.weight"] = bf(2 * 64, hidden)
        t[p + "self_attn.v_proj.weight"] = bf(2 * 64, hidden)
        t[p + "self_attn.o_proj.weight"] = bf(hidden, 4 * 64)
        t[p + "self_attn.q_norm.weight"] = np.full(64, 0x3F80, np.uint16)
        t[p + "self_attn.k_norm.weight"] = np.full(64, 0x3F80, np.uint16)
        t[p + "mlp.gate.weight"] = bf(experts, hidden, scale=1.0)
        for e in range(experts):
            t[p + f"mlp.experts.{e}.gate_proj.weight"] = bf(inter, hidden)
            t[p + f"mlp.experts.{e}.up_proj.weight"] = bf(inter, hidden)
            t[p + f"mlp.experts.{e}.down_proj.weight"] = bf(hidden, inter)
    # safetensors.numpy has no bfloat16: write uint16 and patch the dtype in the header
    save_file(t, str(d / "model.safetensors"))
    raw = (d / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    for k, v in h.items():
        if k != "__metadata__":
            v["dtype"] = "BF16"
    hb = json.dumps(h).encode()
    hb += b" " * ((8 - (len(hb) + 8) % 8) % 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


def test_budget_is_never_exceeded(dfbin, tmp_path):
    d = tmp_path / "big"
    make_big_moe(d)
    size = (d / "model.safetensors").stat().st_size
    assert size > 140e6
    budget = 96 << 20
    prompt = ",".join(str(i % 500 + 3) for i in range(40))
    res = run([dfbin, "run", "--model", str(d), "--ids", prompt, "--max-new", "12", "--ignore-eos", "--print-ids", "--stats"])
    r = run([dfbin, "run", "--model", str(d), "--ids", prompt, "--max-new", "12", "--ignore-eos", "--print-ids", "--stats",
             "--ram", str(budget)])
    assert r.stdout == res.stdout, "streamed under the budget == all resident"
    assert "experts streamed" in r.stderr
    rss = float(r.stderr.split("peak RSS ")[1].split(" MB")[0]) * 1e6
    assert rss <= budget, f"peak RSS {rss / 1e6:.1f} MB exceeds the {budget / 1e6:.1f} MB budget (model file {size / 1e6:.0f} MB)"


@pytest.mark.parametrize("name", ["kimi-k2-int4", "qwen3-moe-v5cfg", "deepseek-v3-fp8"])
def test_prefetch_and_cancellation_keep_the_bits(dfbin, name, stores):
    """Caches of several sizes: router-lookahead prefetches are issued, some are
    wrong and cancelled in flight or evicted unused; the tokens never change."""
    g = golden(name)
    ids = ",".join(map(str, g["greedy_prompt"]))
    base = run([dfbin, "run", "--model", str(MODELS / name), "--ids", ids, "--max-new", "64", "--ignore-eos", "--print-ids"]).stdout
    issued = 0
    for cache in ["300K", "600K", "1M", "2M"]:
        r = run([dfbin, "run", "--model", str(stores[name]), "--ids", ids, "--max-new", "64", "--ignore-eos", "--print-ids",
                 "--expert-cache", cache, "--stats", "--prefetch", "always"])
        assert r.stdout == base, cache
        issued += int(r.stderr.split("prefetch (always): ")[1].split(" issued")[0])
    assert issued > 0, "no prefetch was exercised"
    # auto judges every prediction and reads them only while they are mostly right; never predicts nothing
    total = 0
    for cache in ["300K", "600K", "1M"]:
        r = run([dfbin, "run", "--model", str(stores[name]), "--ids", ids, "--max-new", "64", "--ignore-eos", "--print-ids",
                 "--expert-cache", cache, "--stats"])
        assert r.stdout == base
        line = r.stderr.split("prefetch (auto): ")[1].split("\n")[0]
        right, judged = [int(x) for x in line.split("lookahead right ")[1].split(" (")[0].split(" of ")]
        assert 0 <= right <= judged, line
        total += judged
    assert total > 0, "no prediction was judged"
    # where fresh memory is slow, stale experts are evicted before never-used slots are taken: same tokens
    for fm in ("slow", "fast"):
        r = run([dfbin, "run", "--model", str(stores[name]), "--ids", ids, "--max-new", "64", "--ignore-eos", "--print-ids",
                 "--expert-cache", "2M", "--stats"], env={"DELTAFIN_FRESH_MEMORY": fm})
        assert r.stdout == base, fm
    r = run([dfbin, "run", "--model", str(stores[name]), "--ids", ids, "--max-new", "64", "--ignore-eos", "--print-ids",
             "--expert-cache", "1M", "--stats", "--prefetch", "never"])
    assert r.stdout == base
    assert "prefetch (never): 0 issued" in r.stderr and "lookahead right 0 of 0" in r.stderr


def test_stale_experts_reused_where_fresh_memory_is_slow(dfbin):
    """With first touches slow (forced here; measured at cache creation otherwise), a read evicts an
    expert no position used for 16 tokens before it takes a never-used slot; with them fast it never does."""
    name = "qwen3-moe-v5cfg"
    args = [dfbin, "run", "--model", str(MODELS / name), "--ids", "5,6,7,8", "--max-new", "64", "--ignore-eos",
            "--print-ids", "--expert-cache", "2M", "--stats"]
    base = run([dfbin, "run", "--model", str(MODELS / name), "--ids", "5,6,7,8", "--max-new", "64", "--ignore-eos",
                "--print-ids"]).stdout
    slow = run(args, env={"DELTAFIN_FRESH_MEMORY": "slow"})
    fast = run(args, env={"DELTAFIN_FRESH_MEMORY": "fast"})
    assert slow.stdout == base and fast.stdout == base
    n = int(slow.stderr.split("(lazily backed: stale experts are reused first); ")[1].split(" reads")[0])
    assert n > 0, slow.stderr
    assert "; 0 reads took a stale" in fast.stderr and "lazily backed" not in fast.stderr


def read_st(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], raw[base + b:base + e])
    return out


def to_f32(dtype, shape, data):
    if dtype == "F32":
        return np.frombuffer(data, "<f4").reshape(shape)
    if dtype == "BF16":
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "F16":
        return np.frombuffer(data, "<f2").astype(np.float32).reshape(shape)
    raise ValueError(dtype)


def test_spine_int8_is_opt_in_reported_and_computes_its_values(dfbin, tmp_path):
    """--spine int8 stores row-int8 linear weights (routers stay exact), is
    reported as not exact everywhere, and the engine computes exactly what a
    float checkpoint of the dequantized int8 values (numpy) gives."""
    name = "qwen3-moe-bf16"
    d = tmp_path / "s8"
    r = run([dfbin, "setup", "--from", str(MODELS / name), "--out", str(d), "--pack", "--spine", "int8"])
    assert "NOT be exact" in r.stderr
    man = json.loads((d / "manifest.json").read_text())
    assert man["spine"]["mode"] == "int8" and man["spine"]["exact"] is False
    spine = read_st(d / "spine.safetensors")
    src = read_st(MODELS / name / "model.safetensors")
    assert spine["model.layers.0.mlp.gate.weight"][0] == "BF16", "the router stays exact"
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    shutil.copy(MODELS / name / "config.json", ref_dir / "config.json")
    tensors = {}
    for k, (dt, shape, data) in spine.items():
        if k.endswith("_row_scale"):
            continue
        if dt == "I8":
            q = np.frombuffer(data, np.int8).reshape(shape).astype(np.float32)
            sc = np.frombuffer(spine[k + "_row_scale"][2], "<f4")
            assert np.all(np.abs(q) <= 127)
            tensors[k] = q * sc[:, None]
        else:
            tensors[k] = to_f32(dt, shape, data)
    for k, (dt, shape, data) in src.items():
        if ".experts." in k:
            tensors[k] = to_f32(dt, shape, data)
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}, str(ref_dir / "model.safetensors"))
    g = golden(name)
    n, V = len(g["ids"]), g["vocab_size"]
    a = np.frombuffer(logits(dfbin, d, g["ids"], tmp_path / "a.f32"), "<f4").reshape(n, V)
    b = np.frombuffer(logits(dfbin, ref_dir, g["ids"], tmp_path / "b.f32"), "<f4").reshape(n, V)
    rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
    assert rel.max() < 1e-5 and (a.argmax(1) == b.argmax(1)).all()
    r = run([dfbin, "run", "--model", str(d), "--ids", "1,2,3", "--max-new", "2", "--ignore-eos", "--print-ids", "--stats"])
    assert "NOT exact" in r.stderr
    assert "NOT exact" in run([dfbin, "inspect", "--model", str(d)]).stdout


def test_i8_weights_outside_an_int8_store_are_refused(dfbin, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(MODELS / "llama-bf16", d)
    f = d / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    name = "model.layers.0.mlp.up_proj.weight"
    r0, c0 = h[name]["shape"]
    h[name]["dtype"] = "I8"
    b0 = h[name]["data_offsets"][0]
    h[name]["data_offsets"] = [b0, b0 + r0 * c0]  # the first half of its bytes, read as int8
    hb = json.dumps(h).encode()
    f.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    r = run([dfbin, "eval", "--model", str(d), "--ids", "1", "--dump-logits", os.devnull], check=False)
    assert r.returncode == 2 and name in r.stderr and "only accepted in the spine of a store built with --spine int8" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["run", "--model", "MODEL", "--ids", "1,2", "--max-new", "1", "--prefetch", "sometimes"],
     "--prefetch: expected auto, always or never, got 'sometimes'"),
    (["run", "--model", "MODEL", "--ids", "1,2", "--max-new", "1", "--prefetch"], "--prefetch"),
    (["bench", "first-touch", "--size", "-3"], "expected --size > 0"),
    (["bench", "first-touch", "--threads", "0"], "--threads 1..16"),
    (["bench", "first-touch", "--bogus"], "unknown option '--bogus'"),
])
def test_new_options_refuse_bad_values(dfbin, args, needle):
    args = [str(MODELS / "qwen3-moe-bf16") if a == "MODEL" else a for a in args]
    p = run([dfbin, *args], check=False)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert needle in p.stderr, p.stderr


def test_bench_first_touch_reports(dfbin):
    import json as _json
    p = run([dfbin, "bench", "first-touch", "--size", "64M", "--threads", "2"])
    r = _json.loads(p.stdout)
    assert r["bytes"] == 64 << 20 and r["threads"] == 2 and r["first_touch_gbs"] > 0


# ---- hostile manifests and spines (issue 18) ----

def _eval_store(dfbin, d):
    return run([dfbin, "eval", "--model", str(d), "--ids", "1,2,3", "--dump-logits", os.devnull], check=False)


def _edited_store(stores, tmp_path, edit, name="qwen3-moe-bf16"):
    d = tmp_path / "s"
    shutil.copytree(stores[name], d)
    man = json.loads((d / "manifest.json").read_text())
    edit(man)
    (d / "manifest.json").write_text(json.dumps(man))
    return d


def test_spine_tensor_named_as_an_expert_part_is_refused(dfbin, stores, tmp_path):
    def edit(man):
        man["experts"][0]["parts"][0]["tensor"] = "model.layers.0.self_attn.q_proj.weight"
    r = _eval_store(dfbin, _edited_store(stores, tmp_path, edit))
    assert r.returncode == 2, r.stderr
    assert "manifest.json: experts[0].parts[0].tensor: expected a routed-expert tensor model.layers.0.mlp.experts.0." in r.stderr, r.stderr
    assert '"model.layers.0.self_attn.q_proj.weight"' in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _set(path, value):
    def edit(man):
        o = man
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value(o[path[-1]]) if callable(value) else value
    return edit


def _dup_expert(man):
    man["experts"].append(json.loads(json.dumps(man["experts"][3])))


@pytest.mark.parametrize("edit,needle", [
    (_set(["experts", 0, "layer"], 99), "experts[0].layer: expected an integer in [0, 2], got 99"),
    (_set(["experts", 0, "expert"], -1), "experts[0].expert: expected an integer in [0, 7], got -1"),
    (_set(["experts", 0, "layer"], "0"), "experts[0].layer: expected an integer in [0, 2], got a string"),
    (_dup_expert, "layer 0 expert 3 appears twice"),
    (_set(["experts", 1, "parts", 0, "tensor"], "model.layers.0.mlp.experts.0.gate_proj.weight"),
     "experts[1].parts[0].tensor: expected a routed-expert tensor model.layers.0.mlp.experts.1."),
    (_set(["experts", 0, "parts", 1, "tensor"], "model.layers.0.mlp.experts.0.gate_proj.weight"), "experts[0].parts[1].tensor: \"model.layers.0.mlp.experts.0.gate_proj.weight\" is out of order or repeated"),
    (_set(["experts", 0, "parts", 0, "offset"], 1 << 40), "experts[0].parts[0]: bytes [1099511627776, 1099511627776+6144) lie outside files[0]".replace("1099511627776+6144", str((1 << 40) + 6144))),
    (_set(["experts", 0, "parts", 0, "offset"], -4096), "experts[0].parts[0].offset: expected an integer in [0,"),
    (_set(["experts", 0, "parts", 0, "file"], 7), "experts[0].parts[0].file: expected an integer in [0, 1], got 7"),
    (_set(["experts", 0, "parts", 0, "shape"], [48, -64]), "experts[0].parts[0].shape[1]: expected an integer in [0, 1099511627776], got -64"),
    (_set(["experts", 0, "parts", 0, "dtype"], "Q9"), "experts[0].parts[0].dtype: expected a safetensors dtype, got Q9"),
    (_set(["experts", 0, "xxh3"], "zz"), "experts[0].xxh3: expected 16 hex digits, got zz"),
    (_set(["experts", 0, "parts"], []), "experts[0].parts: expected an array of 1 to 6 parts, got an array (empty)"),
    (_set(["files", 0], "packs/nope.pack"), "files[0]: "),
    (_set(["experts"], lambda x: x * 5), "experts: 80 entries, but 3 layers x 8 experts allow at most 24"),
    (_set(["spine", "tensors"], None), "spine.tensors: expected an object"),
    (lambda man: man["experts"].pop(3), "experts: layer 0 has 7 of its 8 experts (expert 3 is missing)"),
    (_set(["spine", "size"], 12), "spine.size 12 (the spine changed since setup)"),
    (_set(["spine", "file"], "../x"), "spine.file: expected \"spine.safetensors\", got ../x"),
    (_set(["format_version"], 1), "format_version 1 (an older deltafin) has no spine checksums; this build reads version 2"),
    (_set(["format_version"], 3), "format_version: expected 2, got 3"),
])
def test_manifest_is_validated_as_a_whole(dfbin, stores, tmp_path, edit, needle):
    r = _eval_store(dfbin, _edited_store(stores, tmp_path, edit))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "manifest.json" in r.stderr and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _flip_spine(d, tensor, byte, mask):
    p = d / "spine.safetensors"
    b = bytearray(p.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    b[8 + n + hdr[tensor]["data_offsets"][0] + byte] ^= mask
    p.write_bytes(bytes(b))


@pytest.mark.parametrize("tensor", ["model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight", "model.norm.weight"])
def test_flipped_spine_byte_is_detected(dfbin, stores, tmp_path, tensor):
    """A flipped exponent byte in the spine changed the logits and the run
    exited 0: the spine now carries an xxh3 per tensor, checked at open (from
    the arena the spine is read into; the untied embedding, which stays on
    disk, from its mapping; model.norm is converted to f32 at load)."""
    d = tmp_path / "s"
    shutil.copytree(stores["qwen3-moe-bf16"], d)
    assert _eval_store(dfbin, d).returncode == 0
    _flip_spine(d, tensor, 1, 0x40)  # the high byte of the first BF16 value: sign and exponent
    r = _eval_store(dfbin, d)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"spine.safetensors: checksum mismatch for spine tensor '{tensor}'" in r.stderr, r.stderr


def test_changed_spine_header_is_detected(dfbin, stores, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(stores["qwen3-moe-bf16"], d)
    p = d / "spine.safetensors"
    b = p.read_bytes()
    assert b'"format":"pt"' in b
    p.write_bytes(b.replace(b'"format":"pt"', b'"format":"pu"'))  # still valid JSON of the same length
    r = _eval_store(dfbin, d)
    assert r.returncode == 2 and "spine.safetensors: header checksum mismatch" in r.stderr, r.stderr


def test_store_does_not_import_the_model_layer():
    import re
    repo = MODELS.parents[2]
    for f in ("store.c", "store.h"):
        src = (repo / "src" / "store" / f).read_text()
        assert not re.search(r'#include\s+"model/', src), f


def test_too_many_store_dirs_refused(dfbin, tmp_path):
    """Each layer's pack offsets are kept per drive in a fixed table of 64: more drives are refused, not overflowed."""
    dirs = ",".join(str(tmp_path / f"d{i}") for i in range(65))
    p = subprocess.run([dfbin, "setup", "--from", str(MODELS / "qwen3-moe-bf16"), "--out", str(tmp_path / "s"), "--pack",
                        "--store-dirs", dirs], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "at most 64" in p.stderr, p.stderr
