"""Hostile model files (issue 18): a model file is untrusted input, so no value in it may overflow a
buffer, divide by zero or silently make NaN. Each case copies a tiny test model (tests/data/models) and
edits one value of its config.json, or writes a GGUF of it (tools/make_gguf_moe.py) with one metadata
key overridden, then runs `deltafin run` on it. Every case must exit 2 with one line that names the
file, the field, the expected range and the actual value: never a signal (SIGFPE from a block size of
0, an ASan report), never exit 0 with NaN logits. Run them against the ASan build too:
DELTAFIN_BIN=build-asan/deltafin. The ranges are documented in docs/CLI.md "Model files"."""
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from conftest import MODELS, REPO

RUN = ["run", "--ids", "1,2", "--max-new", "2", "--print-ids"]


def run_model(dfbin, model):
    return subprocess.run([dfbin, *RUN[:1], "--model", str(model), *RUN[1:]], capture_output=True, text=True, timeout=300)


def expect_refused(dfbin, model, file, *needles):
    p = run_model(dfbin, model)
    assert p.returncode == 2, f"exit {p.returncode} (negative: a signal), stdout {p.stdout!r}, stderr {p.stderr!r}"
    msg = p.stderr.strip()
    assert msg.count("\n") == 0, f"expected one line, got {msg!r}"
    for n in (str(file), *needles):
        assert n in msg, f"{n!r} not in {msg!r}"


# ------------------------------------------------------------------------------------------ config.json
def hostile_copy(tmp_path, name, edit):
    """A copy of tests/data/models/<name> whose config.json edit(cfg) has changed; returns (dir, config path)."""
    d = tmp_path / name
    shutil.copytree(MODELS / name, d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d, d / "config.json"


def setk(path, value):
    def edit(cfg):
        o = cfg
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value
    return edit


CONFIG_CASES = [
    # FP8 block sizes: 2^32 was cast to int 0 and divided by (SIGFPE in the loader)
    ("deepseek-v3-fp8", ["quantization_config", "weight_block_size"], [2 ** 32, 32],
     ['"quantization_config.weight_block_size[0]"', "expected 1..65536", "got 4294967296"]),
    ("deepseek-v3-fp8", ["quantization_config", "weight_block_size"], [16, 0],
     ['"quantization_config.weight_block_size[1]"', "expected 1..65536", "got 0"]),
    ("kimi-k2-int4", ["quantization_config", "config_groups", "group_0", "weights", "group_size"], 2 ** 32,
     ['"group_size"', "expected 1..65536", "got 4294967296"]),
    # RoPE: theta <= 1 gives inverse frequencies above 1 (or log(1) = 0 in YaRN), factor 0 divides by zero
    ("qwen3-f16", ["rope_theta"], 0, ['"rope_theta"', "(1, 3.402823466e+38]", "got 0"]),
    ("qwen3-f16", ["rope_theta"], -10000, ['"rope_theta"', "(1, 3.402823466e+38]", "got -10000"]),
    ("qwen3-moe-v5cfg", ["rope_parameters", "rope_theta"], 0.5, ['"rope_parameters.rope_theta"', "(1, 3.402823466e+38]", "got 0.5"]),
    ("llama-bf16", ["rope_scaling", "factor"], 0, ['"rope_scaling.factor"', "[0.001, 1000000]", "got 0"]),
    ("llama-bf16", ["rope_scaling", "high_freq_factor"], 1.0,
     ['"rope_scaling.high_freq_factor"', "> 1", "got 1"]),  # low_freq_factor is 1: high must exceed it
    ("llama-bf16", ["rope_scaling", "low_freq_factor"], -1.0, ['"rope_scaling.low_freq_factor"', "> 0", "got -1"]),
    ("llama-bf16", ["rope_scaling", "original_max_position_embeddings"], 0,
     ['"rope_scaling.original_max_position_embeddings"', "(0, 2147483647]", "got 0"]),
    ("deepseek-v3-bf16", ["rope_scaling", "factor"], 1e12, ['"rope_scaling.factor"', "[0.001, 1000000]", "got 1e+12"]),
    ("deepseek-v3-bf16", ["rope_scaling", "beta_fast"], -32, ['"rope_scaling.beta_fast"', "> 0", "got -32"]),
    ("deepseek-v3-bf16", ["rope_scaling", "beta_slow"], -1, ['"rope_scaling.beta_slow"', "> 0", "got -1"]),
    ("deepseek-v3-bf16", ["rope_scaling", "mscale_all_dim"], -20, ['"rope_scaling.mscale_all_dim"', "[0, 1000]", "got -20"]),
    ("deepseek-v3-bf16", ["rope_scaling", "mscale"], 1e200, ['"rope_scaling.mscale"', "[0, 1000]", "got 1e+200"]),
    ("deepseek-v3-bf16", ["rope_scaling", "attention_factor"], 0, ['"rope_scaling.attention_factor"', "(0, 1000]", "got 0"]),
    ("deepseek-v3-bf16", ["rope_scaling", "original_max_position_embeddings"], -4096,
     ['"rope_scaling.original_max_position_embeddings"', "(0, 2147483647]", "got -4096"]),
    # norms
    ("llama-bf16", ["rms_norm_eps"], -1e-6, ['"rms_norm_eps"', "[1e-30, 1)", "got -1e-06"]),
    ("llama-bf16", ["rms_norm_eps"], 0, ['"rms_norm_eps"', "[1e-30, 1)", "got 0"]),
    ("qwen3-f16", ["rms_norm_eps"], 2.0, ['"rms_norm_eps"', "[1e-30, 1)", "got 2"]),
    # MoE routing
    ("deepseek-v3-bf16", ["routed_scaling_factor"], 1e30, ['"routed_scaling_factor"', "(0, 10000]", "got 1e+30"]),
    ("deepseek-v3-bf16", ["routed_scaling_factor"], 0, ['"routed_scaling_factor"', "(0, 10000]", "got 0"]),
    ("qwen3-moe-bf16", ["num_experts_per_tok"], 65, ['"num_experts_per_tok"', "expected 1..8", "got 65"]),
    ("qwen3-moe-bf16", ["num_experts_per_tok"], 0, ['"num_experts_per_tok"', "got 0"]),
    ("deepseek-v3-bf16", ["num_experts_per_tok"], 0, ['"num_experts_per_tok"', "got 0"]),
    ("deepseek-v3-bf16", ["num_experts_per_tok"], 9, ['"num_experts_per_tok"', "expected 1..8", "got 9"]),
    ("deepseek-v3-bf16", ["n_group"], 3, ['"n_group"', "divisor of n_routed_experts (16)", "got 3"]),
    ("deepseek-v3-bf16", ["topk_group"], 5, ['"topk_group"', "expected 1..4", "got 5"]),
    # integers that feed int casts and allocations
    ("llama-bf16", ["vocab_size"], 2 ** 40, ['"vocab_size"', "got 1099511627776"]),
    ("llama-bf16", ["max_position_embeddings"], 2 ** 40, ['"max_position_embeddings"', "got 1099511627776"]),
    ("llama-bf16", ["eos_token_id"], [2, 2 ** 32 + 5], ['"eos_token_id"', "expected token ids 0..639", "got 4294967301"]),
    ("qwen3-f16", ["bos_token_id"], -5, ['"bos_token_id"', "expected 0..767", "got -5"]),
    ("qwen3-f16", ["head_dim"], 2 ** 31, ['"head_dim"', "got 2147483648"]),
]


@pytest.mark.parametrize("name,path,value,needles", CONFIG_CASES,
                         ids=[f"{c[0]}-{'.'.join(map(str, c[1]))}={c[2]}" for c in CONFIG_CASES])
def test_hostile_config(dfbin, tmp_path, name, path, value, needles):
    d, cfg = hostile_copy(tmp_path, name, setk(path, value))
    expect_refused(dfbin, d, cfg, *needles)


def test_shared_experts_width_overflows_int(dfbin, tmp_path):
    """n_shared_experts x moe_intermediate_size is the shared expert's width, an int in the engine."""
    def edit(cfg):
        cfg["n_shared_experts"], cfg["moe_intermediate_size"] = 1000, 2 ** 22
    d, cfg = hostile_copy(tmp_path, "deepseek-v3-bf16", edit)
    expect_refused(dfbin, d, cfg, '"n_shared_experts"', "expected at most 511", "got 1000")


def test_hostile_generation_config(dfbin, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(MODELS / "qwen3-f16", d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [4, 100000]}))
    expect_refused(dfbin, d, d / "generation_config.json", '"eos_token_id"', "got 100000")


@pytest.mark.parametrize("name", ["deepseek-v3-fp8", "llama-bf16", "qwen3-moe-v5cfg"])
def test_unedited_copy_runs(dfbin, tmp_path, name):
    """The generator's copies are valid models: each refusal above is the edited value's."""
    d, _ = hostile_copy(tmp_path, name, lambda cfg: None)
    p = run_model(dfbin, d)
    assert p.returncode == 0 and len(p.stdout.split()) == 2, (p.returncode, p.stderr)


# ------------------------------------------------------------------------------------------------- GGUF
def maker():
    gguf = pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO / "tools"))
    import make_gguf_moe
    return make_gguf_moe, gguf


def hostile_gguf(tmp_path, src, overrides=(), mutate=None):
    """A BF16 GGUF of tests/data/models/<src> with metadata overrides [(key, value, GGUFValueType)]
    ('{arch}' in a key is the file's architecture) applied after the converter's own keys."""
    mk, gguf = maker()
    out = tmp_path / "hostile.gguf"
    orig = mk.gguf.GGUFWriter.write_header_to_file

    def write_header_to_file(self, *a, **kw):
        for key, value, vtype in overrides:
            self.add_key_value(key.format(arch=self.arch), value, vtype)
        return orig(self, *a, **kw)
    mk.gguf.GGUFWriter.write_header_to_file = write_header_to_file
    try:
        mk.write_gguf(str(MODELS / src), str(out), "bf16", mutate=mutate)
    finally:
        mk.gguf.GGUFWriter.write_header_to_file = orig
    return out


def gguf_cases():
    try:
        import gguf
    except ImportError:
        return []
    T = gguf.GGUFValueType
    Q, D = "qwen3-moe-bf16", "deepseek-v3-bf16"
    return [
        (Q, "{arch}.rope.freq_base", math.nan, T.FLOAT32, ["'qwen3moe.rope.freq_base'", "(1, 3.402823466e+38]", "got nan"]),
        (Q, "{arch}.rope.freq_base", 0.0, T.FLOAT32, ["'qwen3moe.rope.freq_base'", "(1, 3.402823466e+38]", "got 0"]),
        (Q, "{arch}.rope.freq_base", 1e300, T.FLOAT64, ["'qwen3moe.rope.freq_base'", "float range", "1e+300"]),
        (Q, "{arch}.attention.layer_norm_rms_epsilon", -1e-6, T.FLOAT32,
         ["'qwen3moe.attention.layer_norm_rms_epsilon'", "[1e-30, 1)", "got -1e-06"]),
        (Q, "{arch}.attention.layer_norm_rms_epsilon", math.inf, T.FLOAT32,
         ["'qwen3moe.attention.layer_norm_rms_epsilon'", "got inf"]),
        (Q, "{arch}.context_length", 2 ** 40, T.UINT64, ["'qwen3moe.context_length'", "expected 1..2147483647", "got 1099511627776"]),
        (Q, "{arch}.embedding_length", 2 ** 33, T.UINT64, ["'qwen3moe.embedding_length'", "got 8589934592"]),
        (Q, "{arch}.attention.head_count", 0, T.UINT32, ["'qwen3moe.attention.head_count'", "expected 1..4096", "got 0"]),
        (Q, "{arch}.attention.head_count_kv", 3, T.UINT32, ["'qwen3moe.attention.head_count_kv'", "divisor of head_count (4)", "got 3"]),
        (Q, "{arch}.expert_count", 2 ** 33, T.UINT64, ["'qwen3moe.expert_count'", "expected 1..65536", "got 8589934592"]),
        (Q, "{arch}.expert_used_count", 65, T.UINT32, ["'qwen3moe.expert_used_count'", "expected 1..8", "got 65"]),
        (Q, "{arch}.expert_used_count", 0, T.UINT32, ["'qwen3moe.expert_used_count'", "expected 1..8", "got 0"]),
        (Q, "tokenizer.ggml.eos_token_id", 2 ** 31, T.UINT32, ["'tokenizer.ggml.eos_token_id'", "expected 0..511", "got 2147483648"]),
        (D, "{arch}.expert_weights_scale", 1e30, T.FLOAT32, ["'deepseek2.expert_weights_scale'", "(0, 10000]", "got 1e+30"]),
        (D, "{arch}.expert_weights_scale", math.nan, T.FLOAT32, ["'deepseek2.expert_weights_scale'", "got nan"]),
        (D, "{arch}.expert_used_count", 9, T.UINT32, ["'deepseek2.expert_used_count'", "expected 1..8", "got 9"]),
        (D, "{arch}.expert_used_count", 17, T.UINT32, ["'deepseek2.expert_used_count'", "expected 1..16", "got 17"]),
        (D, "{arch}.expert_group_count", 3, T.UINT32, ["'deepseek2.expert_group_count'", "divisor of expert_count (16)", "got 3"]),
        (D, "{arch}.expert_group_used_count", 5, T.UINT32, ["'deepseek2.expert_group_used_count'", "expected 1..4", "got 5"]),
        (D, "{arch}.rope.scaling.factor", 0.0, T.FLOAT32, ["'deepseek2.rope.scaling.factor'", "[0.001, 1000000]", "got 0"]),
        (D, "{arch}.rope.scaling.yarn_beta_fast", -1.0, T.FLOAT32, ["'deepseek2.rope.scaling.yarn_beta_fast'", "> 0", "got -1"]),
        (D, "{arch}.rope.scaling.yarn_log_multiplier", -5.0, T.FLOAT32,
         ["'deepseek2.rope.scaling.yarn_log_multiplier'", "[0, 100]", "got -5"]),
        (D, "{arch}.rope.scaling.original_context_length", 0, T.UINT32,
         ["'deepseek2.rope.scaling.original_context_length'", "expected 1..2147483647", "got 0"]),
        (D, "{arch}.attention.kv_lora_rank", 2 ** 32, T.UINT64, ["'deepseek2.attention.kv_lora_rank'", "got 4294967296"]),
        (D, "{arch}.leading_dense_block_count", 2 ** 32, T.UINT64, ["'deepseek2.leading_dense_block_count'", "got 4294967296"]),
    ]


GGUF_CASES = gguf_cases()


@pytest.mark.parametrize("src,key,value,vtype,needles", GGUF_CASES,
                         ids=[f"{c[0]}-{c[1].replace('{arch}.', '')}={c[2]}" for c in GGUF_CASES])
def test_hostile_gguf_metadata(dfbin, tmp_path, src, key, value, vtype, needles):
    f = hostile_gguf(tmp_path, src, [(key, value, vtype)])
    expect_refused(dfbin, f, f, *needles)


@pytest.mark.parametrize("src,arch", [("qwen3-moe-bf16", "qwen3moe"), ("deepseek-v3-bf16", "deepseek2")])
def test_block_count_short_of_the_tensors(dfbin, tmp_path, src, arch):
    """block_count one short of the file's blocks used to run the model without its last layer."""
    _, gguf = maker()
    n = json.loads((MODELS / src / "config.json").read_text())["num_hidden_layers"]
    f = hostile_gguf(tmp_path, src, [("{arch}.block_count", n - 1, gguf.GGUFValueType.UINT32)])
    expect_refused(dfbin, f, f, f"tensor 'blk.{n - 1}.", f"'{arch}.block_count'", f"expected 0..{n - 2}")


@pytest.mark.parametrize("value,shown", [(0.0, "got 0"), (math.nan, "got nan"), (-2.0, "got -2")])
def test_rope_freqs_factor(dfbin, tmp_path, value, shown):
    """llama 3.x GGUFs divide the RoPE frequencies by rope_freqs.weight: a 0 made an infinite frequency."""
    import numpy as np
    hd = json.loads((MODELS / "qwen3-moe-bf16" / "config.json").read_text())["head_dim"]
    ff = np.ones(hd // 2, dtype=np.float32)
    ff[3] = value
    f = hostile_gguf(tmp_path, "qwen3-moe-bf16", mutate=lambda items: items.append(("rope_freqs.weight", ("F32", ff), "f32")))
    expect_refused(dfbin, f, f, "tensor 'rope_freqs.weight' element 3", "[0.001, 1000000]", shown)


def test_rope_freqs_in_range_accepted(dfbin, tmp_path):
    import numpy as np
    hd = json.loads((MODELS / "qwen3-moe-bf16" / "config.json").read_text())["head_dim"]
    ff = np.linspace(1, 8, hd // 2, dtype=np.float32)  # as llama 3.1's: 1 .. factor
    f = hostile_gguf(tmp_path, "qwen3-moe-bf16", mutate=lambda items: items.append(("rope_freqs.weight", ("F32", ff), "f32")))
    p = run_model(dfbin, f)
    assert p.returncode == 0 and len(p.stdout.split()) == 2, (p.returncode, p.stderr)


@pytest.mark.parametrize("src", ["qwen3-moe-bf16", "deepseek-v3-bf16"])
def test_unedited_gguf_runs(dfbin, tmp_path, src):
    f = hostile_gguf(tmp_path, src)
    p = run_model(dfbin, f)
    assert p.returncode == 0 and len(p.stdout.split()) == 2, (p.returncode, p.stderr)
