"""test_generate_shared.py - `deltafin run` and `deltafin serve` generate with
one step (df_gen, src/core/generate.c), so they must agree token for token,
and the log-probabilities it reports must be the log-softmax of the model's
logits (checked against `deltafin eval --dump-logits` and numpy).

Uses the tiny random-weight Qwen3 of test_server.py (real Qwen3 tokenizer).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import deltafin_bin  # noqa: E402
from test_server import MODEL_ID, Server, model_dir, raw  # noqa: E402,F401  (model_dir: the shared fixture)

PROMPT = "The lighthouse keeper wrote in his log"


@pytest.fixture(scope="module")
def gsrv(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "generate.log"), "--ctx", "1024", "--no-memo")
    yield s
    s.stop()


def run(model_dir, *args):
    p = subprocess.run([deltafin_bin(), "run", "--model", model_dir, "--threads", "1", *args], capture_output=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.endswith(b"\n")
    return p.stdout[:-1].decode("utf-8")


def completion(srv, **body):
    st, _, resp = raw(srv, "POST", "/v1/completions", {"model": MODEL_ID, **body})
    assert st == 200, resp
    return resp["choices"][0]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_p": 0.8, "seed": 11}])
def test_run_and_serve_agree_on_text_prompts(model_dir, gsrv, sampling):
    flags = []
    if sampling:
        flags = ["--temperature", "0.9", "--top-p", "0.8", "--seed", "11"]
    text = run(model_dir, "--prompt", PROMPT, "--max-new", "24", *flags)
    ch = completion(gsrv, prompt=PROMPT, max_tokens=24, **sampling)
    assert ch["text"] == text and text


def test_run_and_serve_agree_on_chat(model_dir, gsrv):
    text = run(model_dir, "--chat", "--prompt", PROMPT, "--max-new", "24")
    st, _, resp = raw(gsrv, "POST", "/v1/chat/completions",
                      {"model": MODEL_ID, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24})
    assert st == 200, resp
    assert resp["choices"][0]["message"]["content"] == text and text


def test_logprobs_are_the_log_softmax_of_the_logits(model_dir, gsrv, tmp_path):
    prompt = [785, 1879, 374, 264]
    n = 6
    gen = [int(x) for x in run(model_dir, "--ids", ",".join(map(str, prompt)), "--max-new", str(n), "--print-ids",
                               "--ignore-eos").split()]
    assert len(gen) == n
    ch = completion(gsrv, prompt=prompt, max_tokens=n, logprobs=5)
    lp = ch["logprobs"]
    assert len(lp["token_logprobs"]) == n
    dump = tmp_path / "logits.f32"
    ids = prompt + gen[:-1]
    subprocess.run([deltafin_bin(), "eval", "--model", model_dir, "--threads", "1", "--ids", ",".join(map(str, ids)),
                    "--dump-logits", str(dump)], check=True, capture_output=True, timeout=120)
    logits = np.fromfile(dump, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
    for i in range(n):
        row = logits[len(prompt) - 1 + i]
        ls = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        assert abs(lp["token_logprobs"][i] - ls[gen[i]]) < 1e-3, (i, lp["token_logprobs"][i], ls[gen[i]])
        want = sorted(range(len(row)), key=lambda j: (-row[j], j))[:5]
        got = list(lp["top_logprobs"][i].values())
        assert 1 <= len(got) <= 5  # (two tokens with the same text share one key)
        top = [ls[j] for j in want]
        assert abs(max(got) - top[0]) < 1e-3
        assert all(min(abs(v - t) for t in top) < 1e-3 for v in got), (got, top)
