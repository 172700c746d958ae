"""test_ahead.py - greedy decoding one token ahead (core.h df_session_sample_ahead: the next forward pass queued before
the token is known, a device backend's default) must not change what `deltafin run` and `deltafin serve` produce. On
the CPU it runs only with DELTAFIN_AHEAD=1, so here every output with DELTAFIN_AHEAD=1 is compared byte for byte with
DELTAFIN_AHEAD=0: prompts, chat, max_tokens 1 and 2 (nothing queued past the end), the end-of-sequence id, ids,
speculation (auto's plain steps queued ahead; ngram's verify passes taking a queued pass as their first position),
sampling (the plain path), and a server answering requests one after another on its reused sessions (a stop string: the queued pass dropped;
the prefix reused by the next request) and streamed.

Uses the tiny random-weight Qwen3 of test_server.py (real Qwen3 tokenizer).
"""
import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import deltafin_bin  # noqa: E402
from test_server import MODEL_ID, Server, model_dir, raw  # noqa: E402,F401  (model_dir: the shared fixture)

PROMPT = "The lighthouse keeper wrote in his log"


def run(model_dir, ahead, *args):
    env = dict(os.environ, DELTAFIN_AHEAD=ahead)
    p = subprocess.run([deltafin_bin(), "run", "--model", model_dir, "--threads", "1", "--stats", *args], capture_output=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout, p.stderr.decode()


# (args, decode steps queued ahead with DELTAFIN_AHEAD=1: "all" = every decode step but the last ones)
CASES = [
    (["--prompt", PROMPT, "--max-new", "40", "--spec", "none"], "all"),
    (["--prompt", PROMPT, "--max-new", "1", "--spec", "none"], 0),
    (["--prompt", PROMPT, "--max-new", "2", "--spec", "none"], "all"),
    (["--chat", "--prompt", PROMPT, "--max-new", "30", "--spec", "none"], "all"),
    (["--ids", "785,1879,374,264", "--max-new", "30", "--print-ids", "--ignore-eos", "--spec", "none"], "all"),
    (["--ids", "785,1879,374,264", "--max-new", "30", "--print-ids"], "all"),  # --spec auto: its plain steps queued ahead
    # verify passes after queued plain steps: a pass takes the queued pass as its first position (session.c
    # df_session_verify); the ids must not change
    (["--ids", "785,1879,374,264,785,1879,374,264,785,1879", "--max-new", "60", "--print-ids", "--ignore-eos", "--spec", "ngram"], "some"),
    (["--prompt", PROMPT, "--max-new", "40", "--temperature", "0.8", "--seed", "5", "--spec", "none"], 0),  # sampled
]


def ahead_steps(err):
    m = re.search(r"decode ahead: (\d+) of (\d+) decode steps", err)
    return (int(m.group(1)), int(m.group(2))) if m else (0, None)


@pytest.mark.parametrize("args,queued", CASES, ids=[" ".join(c[0][:2]) + f" #{i}" for i, c in enumerate(CASES)])
def test_run_same_with_and_without_ahead(model_dir, args, queued):
    (a, ea), (b, eb) = run(model_dir, "1", *args), run(model_dir, "0", *args)
    assert a == b and a.strip()
    assert ahead_steps(eb)[0] == 0
    n, total = ahead_steps(ea)
    if queued == "all":  # every decode step was queued ahead (the last chosen token is never pushed)
        assert n > 0 and n == total, ea
    elif queued == "some":  # plain steps queued ahead, and verify passes after some of them
        assert 0 < n < total, ea
        m = re.search(r"spec ngram: (\d+) verify passes", ea)
        assert m and int(m.group(1)) > 0, ea
        # every generated token but the last was pushed once: by a plain step (counted when the token after it is
        # known: generate.c close_plain) or by a pass (its first position and its accepted drafts)
        for out, err in ((a, ea), (b, eb)):
            m = re.search(r"spec ngram: (\d+) verify passes, \d+ drafted, (\d+) accepted .*?; (\d+) plain steps", err)
            assert m, err
            assert int(m.group(1)) + int(m.group(2)) + int(m.group(3)) == len(out.split()) - 1, err
    else:
        assert n == queued, ea


def test_stats_json_counts_ahead_steps(model_dir, tmp_path):
    js = tmp_path / "s.json"
    out, err = run(model_dir, "1", "--prompt", PROMPT, "--max-new", "12", "--spec", "none", "--ignore-eos", "--stats-json", str(js))
    st = json.loads(js.read_text())
    assert st["decode_ahead_tokens"] == ahead_steps(err)[0] == st["decode_tokens"] == 11


def requests(srv):
    out = []
    for body in [{"prompt": PROMPT, "max_tokens": 24},
                 {"prompt": PROMPT + " and then", "max_tokens": 24},  # the prefix of the last request reused
                 {"prompt": PROMPT, "max_tokens": 24, "stop": [" the"]},
                 {"prompt": PROMPT, "max_tokens": 1},
                 {"prompt": PROMPT, "max_tokens": 24}]:
        st, _, resp = raw(srv, "POST", "/v1/completions", {"model": MODEL_ID, **body})
        assert st == 200, resp
        out.append(resp["choices"][0]["text"])
    st, _, resp = raw(srv, "POST", "/v1/chat/completions",
                      {"model": MODEL_ID, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 20})
    assert st == 200, resp
    out.append(resp["choices"][0]["message"]["content"])
    c = srv.conn()
    c.request("POST", "/v1/completions", json.dumps({"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 16, "stream": True}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    text = ""
    for line in r.read().decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            text += json.loads(line[6:])["choices"][0].get("text", "")
    out.append(text)
    return out


def test_server_same_with_and_without_ahead(model_dir, tmp_path, monkeypatch):
    res = {}
    for ahead in ("1", "0"):
        monkeypatch.setenv("DELTAFIN_AHEAD", ahead)
        s = Server(model_dir, str(tmp_path / f"ahead{ahead}.log"), "--ctx", "1024", "--no-memo", "--spec", "none")
        try:
            res[ahead] = requests(s)
        finally:
            s.stop()
    assert res["1"] == res["0"]
    assert all(res["0"][i] for i in (0, 1, 4, 5, 6))
