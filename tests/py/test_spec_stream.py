"""test_spec_stream.py - speculative decoding with streamed experts (issue
15, item 3): a verify pass asks the expert source for the union of its
positions' experts once per MoE layer (one acquire: the misses are read as
one batch), `--stats` gives the expert bytes read per generated token with
and without speculation, and the ids equal `--spec none`.

The tiny qwen3-moe-bf16 (8 experts, top-2, layers 0 and 2 MoE) streamed with
an expert cache that holds all 8 experts of a layer, so a pass of up to 5
positions is one wave; --trace writes one line per acquire (token = the
pass's first position).
"""
import collections
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import MODELS, deltafin_bin  # noqa: E402

MODEL = MODELS / "qwen3-moe-bf16"
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12] * 3 + [5, 6, 7]
TOPK = 2


def run(spec, trace):
    p = subprocess.run([deltafin_bin(), "run", "--model", str(MODEL), "--threads", "1", "--ids", ",".join(map(str, PROMPT)),
                        "--max-new", "40", "--print-ids", "--stats", "--spec", spec, "--spec-max", "4",
                        "--expert-cache", "400K", "--trace", str(trace)], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return p


def bytes_per_token(p):
    m = re.search(rb"\[stats\] spec: expert bytes read per generated token ([0-9.]+) MB \(([0-9.]+) MB in decode passes for (\d+) tokens\)",
                  p.stderr)
    assert m, p.stderr.decode()
    return float(m.group(1)), int(m.group(3))


def test_verify_pass_reads_the_union_once(tmp_path):
    none = run("none", tmp_path / "none.jsonl")
    spec = run("ngram", tmp_path / "ngram.jsonl")
    assert spec.stdout == none.stdout
    passes = int(re.search(rb"(\d+) verify passes", spec.stderr).group(1))
    assert passes > 0, spec.stderr.decode()
    # bytes per generated token, both arms (the baseline line is printed with --spec none too)
    b0, n0 = bytes_per_token(none)
    b1, n1 = bytes_per_token(spec)
    assert n0 == n1 == 40 and b0 > 0 and b1 > 0
    lines = [json.loads(x) for x in open(tmp_path / "ngram.jsonl")]
    dec = [d for d in lines if d["token"] >= len(PROMPT)]
    per = collections.Counter((d["token"], d["layer"]) for d in dec)
    assert max(per.values()) == 1, "a decode pass asked for a layer's experts more than once"
    for d in dec:
        ids = [e["id"] for e in d["experts"]]
        assert len(ids) == len(set(ids)), d
    # the passes of several positions ask for more than one position's top-k: their union, in one acquire
    assert any(len(d["experts"]) > TOPK for d in dec), "no verify pass asked for the union of its positions' experts"
    # every decode forward is one line per MoE layer: plain steps + verify passes
    plain = int(re.search(rb"(\d+) plain steps", spec.stderr).group(1))
    assert len({d["token"] for d in dec}) == plain + passes
