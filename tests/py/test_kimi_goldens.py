"""Kimi K3 / Kimi Linear exactness: our all-position logits against the goldens that Moonshot's own modeling code
(modeling_kimi_linear.py of the Kimi K3 release, float32, KDA recurrent path) computed on the tiny checkpoints of
tools/make_kimi.py, for prompts of 1, 7, 64 and 210 tokens (golden.json `cases`; docs/TEST_MODELS.md). Every
position must be within 1e-3 relative L2 of the golden row and have the same argmax.

The teacher-forced `ids` and the 32 cached greedy steps of the same directories are checked by test_engine.py's
generic tests."""
import json

import numpy as np
import pytest

from conftest import MODELS
from test_engine import eval_logits

KIMI_MODELS = ["kimi-k3-tiny", "kimi-k3-mxfp4", "kimi-linear-tiny"]


def kimi_cases():
    out = []
    for name in KIMI_MODELS:
        g = json.loads((MODELS / name / "golden.json").read_text())
        for c in g["cases"]:
            out.append(pytest.param(name, c, id=f"{name}-{len(c['ids'])}"))
    return out


def test_every_kimi_model_has_the_four_prompt_lengths():
    for name in KIMI_MODELS:
        g = json.loads((MODELS / name / "golden.json").read_text())
        lens = [len(c["ids"]) for c in g["cases"]]
        assert lens == [1, 7, 64, 210], (name, lens)
        for c in g["cases"]:
            n = (MODELS / name / c["logits"]).stat().st_size
            assert n == 4 * len(c["ids"]) * g["vocab_size"], (name, c["logits"], n)


@pytest.mark.parametrize("name,case", kimi_cases())
def test_kimi_case_logits(dfbin, name, case, tmp_path):
    g = json.loads((MODELS / name / "golden.json").read_text())
    n, V = len(case["ids"]), g["vocab_size"]
    ref = np.fromfile(MODELS / name / case["logits"], dtype="<f4").reshape(n, V)
    got = eval_logits(dfbin, MODELS / name, case["ids"], tmp_path)
    assert got.size == n * V, f"expected {n}x{V} logits, got {got.size}"
    got = got.reshape(n, V)
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-3, f"per-position relative L2 error {rel.max():.3g} at position {rel.argmax()} of {n}"
    bad = np.nonzero(got.argmax(1) != ref.argmax(1))[0]
    assert bad.size == 0, f"argmax differs from the reference at positions {bad[:10].tolist()} of {n}"
