"""Bad Kimi Linear / Kimi K3 checkpoints (issue 12): a missing tensor, a wrong shape, an A_log of the wrong
size or with non-zero padding, an unknown activation, layer lists that do not cover the model, an unknown
router or quantization format. Each is a copy of a tiny Kimi model (tests/data/models) with one thing
changed; `deltafin run` must exit 2 with one line naming the file, tensor or field and what was expected."""
import json
import shutil
import struct
import subprocess

import numpy as np
import pytest

from conftest import MODELS

RUN = ["--ids", "1,2", "--max-new", "2", "--print-ids"]


def run_model(dfbin, model):
    return subprocess.run([dfbin, "run", "--model", str(model), *RUN], capture_output=True, text=True, timeout=300)


def expect_refused(dfbin, model, *needles):
    p = run_model(dfbin, model)
    assert p.returncode == 2, f"exit {p.returncode}, stdout {p.stdout!r}, stderr {p.stderr!r}"
    msg = p.stderr.strip()
    assert msg.count("\n") == 0, f"expected one line, got {msg!r}"
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


def copy_with_config(tmp_path, name, edit):
    d = tmp_path / name
    shutil.copytree(MODELS / name, d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg["text_config"] if "text_config" in cfg else cfg, cfg)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


# ---------------------------------------------------------------------------------------------- safetensors
def read_st(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    body = raw[8 + n:]
    tensors = {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in hdr.items()}
    return tensors, meta


def write_st(path, tensors, meta):
    hdr, off, blobs = {}, 0, []
    for k, (dt, shape, b) in tensors.items():
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if meta is not None:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def copy_with_tensors(tmp_path, name, edit):
    """A copy of the model whose shard holding the edited tensors is rewritten by edit(tensors) (name -> (dtype,
    shape, bytes)); the index, if any, follows."""
    d = tmp_path / name
    shutil.copytree(MODELS / name, d)
    for f in sorted(d.glob("*.safetensors")):
        t, meta = read_st(f)
        before = set(t)
        if edit(t):
            write_st(f, t, meta)
            idx = d / "model.safetensors.index.json"
            if idx.exists():
                j = json.loads(idx.read_text())
                for k in before - set(t):
                    j["weight_map"].pop(k, None)
                for k in set(t) - before:
                    j["weight_map"][k] = f.name
                idx.write_text(json.dumps(j))
            return d
    raise AssertionError("no shard held the tensor to edit")


def find(t, suffix):
    ks = sorted(k for k in t if k.endswith(suffix))
    return ks[0] if ks else None


def f32(values):
    return np.asarray(values, dtype="<f4").tobytes()


# --------------------------------------------------------------------------------------------------- cases
CONFIG_CASES = [
    ("kimi-k3-tiny", lambda t, r: t.__setitem__("hidden_act", "gelu"), ['hidden_act "gelu"', '"silu" or "situ"']),
    ("kimi-k3-tiny", lambda t, r: t["linear_attn_config"].__setitem__("kda_layers", [0, 1, 2, 3, 5]),
     ['"linear_attn_config.kda_layers[0]"', "1..7 (1-based)"]),
    ("kimi-k3-tiny", lambda t, r: t["linear_attn_config"].__setitem__("full_attn_layers", [4, 6]),
     ["linear_attn_config: layer 7 (1-based)", "exactly one of kda_layers and full_attn_layers", "neither"]),
    ("kimi-linear-tiny", lambda t, r: t["linear_attn_config"].__setitem__("full_attn_layers", [4, 5, 6]),
     ["layer 5 (1-based)", "both"]),
    ("kimi-k3-tiny", lambda t, r: t.__setitem__("moe_router_activation_func", "softmax"),
     ['"moe_router_activation_func"', 'expected "sigmoid"', "softmax"]),
    ("kimi-k3-tiny", lambda t, r: t.__setitem__("mla_use_nope", False), ['"mla_use_nope"', "expected true"]),
    ("kimi-k3-tiny", lambda t, r: t.__setitem__("model_type", "deepseek_v3"),
     ['"text_config.model_type"', 'expected "kimi_linear"', "deepseek_v3"]),
    ("kimi-k3-tiny", lambda t, r: t.__setitem__("num_experts_per_token", 17), ['"num_experts_per_token"', "1..16", "17"]),
    ("kimi-k3-tiny", lambda t, r: t["linear_attn_config"].__setitem__("short_conv_kernel_size", 0),
     ['"short_conv_kernel_size"', "1..64", "got 0"]),
    ("kimi-k3-tiny", lambda t, r: t.__setitem__("activation_situ_linear_beta", -1.0),
     ['"activation_situ_linear_beta"', "(0, 1e+30]", "got -1"]),
]


@pytest.mark.parametrize("name,edit,needles", CONFIG_CASES, ids=[f"cfg{i}" for i in range(len(CONFIG_CASES))])
def test_bad_kimi_config(dfbin, tmp_path, name, edit, needles):
    d = copy_with_config(tmp_path, name, edit)
    expect_refused(dfbin, d, str(d / "config.json"), *needles)


def drop(suffix):
    def edit(t):
        k = find(t, suffix)
        if k:
            del t[k]
        return k
    return edit


def reshape(suffix, shape):
    def edit(t):
        k = find(t, suffix)
        if k:
            dt, _, b = t[k]
            t[k] = (dt, shape, b)
        return k
    return edit


def resize_f32(suffix, n):
    def edit(t):
        k = find(t, suffix)
        if k:
            t[k] = ("F32", [n], f32([0.0] * n))
        return k
    return edit


def inf_f32(suffix, n):
    def edit(t):
        k = find(t, suffix)
        if k:
            t[k] = ("F32", [n], f32([float("inf")] + [0.0] * (n - 1)))
        return k
    return edit


def a_log(values):
    def edit(t):
        k = find(t, "layers.0.self_attn.A_log")
        if k:
            t[k] = ("F32", [len(values)], f32(values))
        return k
    return edit


TENSOR_CASES = [
    ("kimi-k3-tiny", drop("layers.1.self_attn.q_conv1d.weight"), ["missing tensor", "layers.1.self_attn.q_conv1d.weight"]),
    ("kimi-k3-tiny", drop("layers.2.block_sparse_moe.routed_expert_norm.weight"), ["missing tensor", "routed_expert_norm.weight"]),
    ("kimi-k3-tiny", drop("model.output_attn_res_proj.weight"), ["missing tensor", "output_attn_res_proj.weight"]),
    ("kimi-k3-tiny", reshape("layers.0.self_attn.f_b_proj.weight", [16, 64]),
     ["layers.0.self_attn.f_b_proj.weight", "expected shape [64, 16]", "got [16, 64]"]),
    ("kimi-k3-tiny", a_log([0.1, 0.2, 0.3, 0.4, 0.5]),
     ["layers.0.self_attn.A_log", "expected 4 entries (num_heads) or 16 (head_dim, zero-padded)", "got shape [5]"]),
    ("kimi-k3-tiny", a_log([0.1, 0.2, 0.3, 0.4] + [0.0] * 11 + [0.7]),
     ["layers.0.self_attn.A_log", "entry 15 is 0.7", "must be zero padding"]),
    ("kimi-k3-tiny", a_log([0.1, float("nan"), 0.3, 0.4] + [0.0] * 12), ["layers.0.self_attn.A_log", "entry 1 is nan", "expected a finite value"]),
    ("kimi-linear-tiny", inf_f32("layers.0.self_attn.dt_bias", 64),
     ["layers.0.self_attn.dt_bias", "entry 0 is inf", "expected a finite value"]),
    ("kimi-linear-tiny", drop("layers.0.self_attn.g_a_proj.weight"), ["missing tensor", "layers.0.self_attn.g_a_proj.weight"]),
    ("kimi-linear-tiny", resize_f32("layers.0.self_attn.dt_bias", 63), ["layers.0.self_attn.dt_bias", "expected shape [64]", "got [63]"]),
]


@pytest.mark.parametrize("name,edit,needles", TENSOR_CASES, ids=[f"t{i}" for i in range(len(TENSOR_CASES))])
def test_bad_kimi_tensor(dfbin, tmp_path, name, edit, needles):
    d = copy_with_tensors(tmp_path, name, edit)
    expect_refused(dfbin, d, *needles)


def test_padded_a_log_is_accepted(dfbin, tmp_path):
    """K3 stores A_log padded to head_dim (16 here) with zeros after the num_heads (4) used entries; the
    unpadded form gives the same tokens."""
    def edit(t):
        k = find(t, "layers.0.self_attn.A_log")
        dt, shape, b = t[k]
        v = np.frombuffer(b, dtype="<f4")
        assert dt == "F32" and v.size == 16 and not v[4:].any(), (dt, shape)
        t[k] = ("F32", [4], f32(v[:4]))
        return k
    d = copy_with_tensors(tmp_path, "kimi-k3-tiny", edit)
    a, b = run_model(dfbin, MODELS / "kimi-k3-tiny"), run_model(dfbin, d)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout


def test_spine_over_the_memory_budget_is_refused_before_reading(dfbin):
    """Only routed experts stream: a spine larger than the memory budget is refused with one line (before the
    spine is read), not left to the OOM killer. K3's spine is 113 GB in BF16."""
    p = subprocess.run([dfbin, "run", "--model", str(MODELS / "kimi-k3-tiny"), "--ram", "200K", *RUN],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    msg = p.stderr.strip()
    assert msg.count("\n") == 0 and "the resident weights" in msg and "memory budget of 0.2 MB (--ram)" in msg, msg
    ok = subprocess.run([dfbin, "run", "--model", str(MODELS / "kimi-k3-tiny"), "--ram", "4M", *RUN],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
