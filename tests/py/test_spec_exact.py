"""test_spec_exact.py - speculative decoding, step 4 (issue 15 items 1, 4, 5):
a verify pass computes every position as a plain step does (bit for bit: the
logits are compared in tests/unit/test_core_verify.c), so greedy ids with
long drafts (`--spec ngram --spec-max 8`) equal `--spec none` on every family
of tiny model (GQA, MLA, MoE resident and streamed, BF16/F16/F32, FP8, INT4,
GGUF K-quants; MXFP4 in tests/unit/test_backend_exact.c: its tiny models are recurrent) and on the default model where installed; `--spec
auto` is the default of `run` (the [stats] spec line names it) and of
`serve` (its log line), and a grammar keeps speculation off, saying so.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import MODELS, deltafin_bin  # noqa: E402
import make_tiny_chat_model  # noqa: E402

GGUF = Path(HERE).parent / "data" / "gguf_moe"
SMOLLM2 = Path.home() / ".cache/deltafin/models/smollm2-135m-instruct/model.gguf"

# a long repeated pattern with a few breaks: prompt lookup drafts 8 at a time, most accepted, some not
REPEAT = ",".join(str(x) for x in [5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 4 + [5, 6, 7, 30, 8, 9] + [5, 6, 7, 8, 9, 10])


def run(model, *args):
    p = subprocess.run([deltafin_bin(), "run", "--model", str(model), "--threads", "2", *args], capture_output=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    return p


def ids_of(p):
    return [int(x) for x in p.stdout.split()]


def passes_of(p):
    m = re.search(rb"\[stats\] spec \w+: (?:.*?; )?(\d+) verify passes, (\d+) drafted, (\d+) accepted", p.stderr)
    assert m, p.stderr.decode()
    return tuple(int(x) for x in m.groups())


CASES = [(MODELS / n, []) for n in ("llama-bf16", "llama-f32-tied", "qwen3-f16", "qwen3-moe-bf16", "qwen3-moe-k70",
                                      "deepseek-v3-bf16", "deepseek-v3-fp8", "deepseek-v3-k70", "kimi-k2-int4")]
CASES += [(GGUF / n, []) for n in ("qwen3moe-q4_k_m.gguf", "deepseek2-q4_k_m.gguf", "qwen3moe-q8_0.gguf")]
CASES += [(MODELS / "qwen3-moe-k70", ["--expert-cache", "0"]), (GGUF / "deepseek2-q4_k_m.gguf", ["--expert-cache", "0"])]


@pytest.mark.parametrize("model,extra", CASES, ids=[f"{m.name}{'-streamed' if e else ''}" for m, e in CASES])
def test_greedy_ids_long_drafts(model, extra):
    want = ids_of(run(model, "--ids", REPEAT, "--max-new", "80", "--ignore-eos", "--print-ids", "--spec", "none", *extra))
    p = run(model, "--ids", REPEAT, "--max-new", "80", "--ignore-eos", "--print-ids", "--stats", "--spec", "ngram", "--spec-max", "8", *extra)
    passes, drafted, accepted = passes_of(p)
    assert passes > 0 and drafted > 0, p.stderr.decode()
    assert ids_of(p) == want


@pytest.mark.skipif(not SMOLLM2.exists(), reason="the default model is not installed")
def test_default_model_long_drafts():
    prompt = ("Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. "
              "the quick brown fox jumps over the lazy dog.")
    want = run(SMOLLM2, "--prompt", prompt, "--max-new", "80", "--print-ids", "--spec", "none").stdout
    p = run(SMOLLM2, "--prompt", prompt, "--max-new", "80", "--print-ids", "--stats", "--spec", "ngram", "--spec-max", "8")
    assert passes_of(p)[0] > 0
    assert p.stdout == want


def test_run_defaults_to_auto():
    m = MODELS / "qwen3-f16"
    none = run(m, "--ids", REPEAT, "--max-new", "40", "--print-ids", "--stats", "--spec", "none")
    assert b"[stats] spec" not in none.stderr
    dflt = run(m, "--ids", REPEAT, "--max-new", "40", "--print-ids", "--stats")
    assert re.search(rb"\[stats\] spec auto: \d+ verify passes", dflt.stderr), dflt.stderr.decode()
    assert dflt.stdout == none.stdout
    assert b"auto (default" in subprocess.run([deltafin_bin(), "run", "--help"], capture_output=True).stdout


def test_grammar_keeps_speculation_off(tmp_path):
    model = make_tiny_chat_model.build(str(tmp_path / "m"))
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "a" [a-z]*\n')
    p = subprocess.run([deltafin_bin(), "run", "--model", str(model), "--threads", "2", "--prompt", "x",
                        "--max-new", "8", "--stats", "--grammar", str(g)], capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    assert re.search(rb"\[stats\] spec auto: a constraint \(grammar\) chooses the tokens", p.stderr), p.stderr.decode()
