"""test_spec_cross.py - `--spec draft` with a draft model of another
tokenizer (issue 15): the draft model writes text, which is re-tokenized by
the target's tokenizer after the text of the last committed tokens; the
target tokens whose bytes the draft's text covers are the drafts. The ids
are those of `--spec none` whatever the drafts.

Two bigram machines (make_bigram_model.py) that write the same cyclic text,
one with the Qwen3 tokenizer and one with DeepSeek-V3's, whose token
boundaries differ in places: drafting across them accepts most drafts in
both directions. A random target (make_tiny_chat_model.py, Qwen3 tokenizer)
with the DeepSeek-V3 bigram as draft accepts few, and its ids are still
those of `--spec none` (greedy and sampled).
"""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import deltafin_bin  # noqa: E402
import make_bigram_model  # noqa: E402
import make_tiny_chat_model  # noqa: E402

PROMPT = " Speculative decoding"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec-cross")
    return {"qwen3": make_bigram_model.build(str(d / "bigram-qwen3"), "qwen3"),
            "deepseek-v3": make_bigram_model.build(str(d / "bigram-dsv3"), "deepseek-v3"),
            "random": make_tiny_chat_model.build(str(d / "random-qwen3"))}


def run(model, *args):
    p = subprocess.run([deltafin_bin(), "run", "--model", str(model), "--threads", "1", "--prompt", PROMPT,
                        "--ignore-eos", "--print-ids", *args], capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return p


def stats(p):
    m = re.search(rb"\[stats\] spec draft: across tokenizers \(text level\); (\d+) verify passes, (\d+) drafted, (\d+) accepted",
                  p.stderr)
    assert m, p.stderr.decode()
    return tuple(int(x) for x in m.groups())


@pytest.mark.parametrize("target,draft", [("qwen3", "deepseek-v3"), ("deepseek-v3", "qwen3")])
def test_bigram_pair_accepts(models, target, draft):
    want = run(models[target], "--max-new", "60", "--spec", "none").stdout
    got = run(models[target], "--max-new", "60", "--spec", "draft", "--draft", models[draft], "--stats")
    assert got.stdout == want
    passes, drafted, accepted = stats(got)
    assert passes > 0 and accepted >= 0.8 * drafted and drafted >= 40, (passes, drafted, accepted)


@pytest.mark.parametrize("extra", [[], ["--temperature", "0.9", "--seed", "11"]])
def test_random_target_same_ids(models, extra):
    want = run(models["random"], "--max-new", "40", "--spec", "none", *extra).stdout
    got = run(models["random"], "--max-new", "40", "--spec", "draft", "--draft", models["deepseek-v3"], "--stats", *extra)
    assert got.stdout == want
    assert stats(got)[1] > 0


def test_server_log_says_text_level(models, tmp_path):
    """The server drafts across tokenizers too, and its per-request log line says so."""
    import http.client
    import json
    import time
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([deltafin_bin(), "serve", "--model", models["qwen3"], "--port", "0", "--threads", "1",
                                 "--spec", "draft", "--draft", models["deepseek-v3"], "--served-model-name", "m"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        port, deadline = None, time.time() + 120
        while port is None and time.time() < deadline and proc.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log_path).read())
            port = int(m.group(1)) if m else time.sleep(0.05)
        assert port, open(log_path).read()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": 30, "temperature": 0}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200, body
        assert body["choices"][0]["text"].startswith(" verifies drafted tokens with"), body
        deadline = time.time() + 30
        while time.time() < deadline and "tokens per pass" not in open(log_path).read():
            time.sleep(0.05)
        log = open(log_path).read()
        m = re.search(r"spec draft \(across tokenizers, text level\): (\d+) passes, (\d+) drafted, (\d+) accepted", log)
        assert m and int(m.group(3)) > 0, log
    finally:
        proc.terminate()
        proc.wait(30)
