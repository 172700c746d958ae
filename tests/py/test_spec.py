"""test_spec.py - speculative decoding (issue 15, first step): `--spec`
ngram / draft / auto choose exactly the tokens of `--spec none` (greedy and
sampled, the same seed), stop strings and token limits land where they
would without it, the sampled distribution is the model's own (chi-square
against the model's probabilities from `deltafin eval --dump-logits`), and
bad flags get one clear message and exit 2.

Tiny random-weight models from tests/data/models (GQA: qwen3-f16,
llama-f32-tied; MLA: deepseek-v3-bf16; MoE: qwen3-moe-bf16) and the tiny
Qwen3 with a real tokenizer of test_server.py for text and stop strings.
"""
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import MODELS, deltafin_bin  # noqa: E402
import make_tiny_chat_model  # noqa: E402

# a repeated pattern: prompt lookup finds drafts, some accepted, some not
REPEAT = ",".join(str(x) for x in [5, 6, 7, 8, 9, 10, 11, 12] * 3 + [5, 6, 7])


def run(model, *args, check=True):
    p = subprocess.run([deltafin_bin(), "run", "--model", str(model), "--threads", "1", *args], capture_output=True,
                       timeout=300)
    if check:
        assert p.returncode == 0, p.stderr.decode()
    return p


def ids_of(p):
    return [int(x) for x in p.stdout.split()]


def spec_stats(p):
    m = re.search(rb"\[stats\] spec \w+: (?:.*?; )?(\d+) verify passes, (\d+) drafted, (\d+) accepted", p.stderr)
    assert m, p.stderr.decode()
    return tuple(int(x) for x in m.groups())


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-chat-spec")))


@pytest.mark.parametrize("model,draft", [("qwen3-f16", "qwen3-f16"), ("llama-f32-tied", "deepseek-v3-bf16"),
                                         ("deepseek-v3-bf16", "deepseek-v3-fp8"),
                                         ("qwen3-moe-bf16", "llama-f32-tied")])
def test_greedy_ids_identical(model, draft):
    m = MODELS / model
    want = ids_of(run(m, "--ids", REPEAT, "--max-new", "64", "--print-ids", "--spec", "none"))
    assert len(want) > 8
    seen_accept = seen_reject = False
    for spec in (["ngram"], ["ngram", "--spec-max", "3"], ["auto"], ["draft", "--draft", str(MODELS / draft)]):
        p = run(m, "--ids", REPEAT, "--max-new", "64", "--print-ids", "--stats", "--spec", *spec)
        assert ids_of(p) == want, (spec, ids_of(p), want)
        passes, drafted, accepted = spec_stats(p)
        seen_accept |= accepted > 0
        seen_reject |= accepted < drafted
    assert seen_accept and seen_reject  # the verify pass both kept and threw away drafts


def test_max_new_at_every_boundary():
    """The token limit falls inside accepted runs (the model drafts for itself: every draft is accepted)."""
    m = MODELS / "qwen3-f16"
    full = ids_of(run(m, "--ids", REPEAT, "--max-new", "20", "--print-ids", "--spec", "none"))
    for n in range(1, 21):
        for spec in (["draft", "--draft", str(m)], ["ngram"]):
            got = ids_of(run(m, "--ids", REPEAT, "--max-new", str(n), "--print-ids", "--spec", *spec))
            assert got == full[:n], (n, spec)


def test_context_limit_inside_a_verify_pass():
    m = MODELS / "qwen3-f16"
    n_prompt = len(REPEAT.split(","))
    for ctx in range(n_prompt + 1, n_prompt + 12):
        want = run(m, "--ids", REPEAT, "--max-new", "40", "--ctx", str(ctx), "--print-ids", "--spec", "none")
        got = run(m, "--ids", REPEAT, "--max-new", "40", "--ctx", str(ctx), "--print-ids", "--spec", "draft",
                  "--draft", str(m))
        assert got.stdout == want.stdout and got.returncode == want.returncode, ctx


def test_sampled_same_seed_same_tokens():
    m = MODELS / "qwen3-f16"
    for seed in (1, 2, 3, 17):
        args = ["--ids", REPEAT, "--max-new", "40", "--print-ids", "--temperature", "0.8", "--top-k", "20",
                "--seed", str(seed)]
        want = ids_of(run(m, *args, "--spec", "none"))
        a = run(m, *args, "--spec", "draft", "--draft", str(m), "--stats")
        b = run(m, *args, "--spec", "draft", "--draft", str(m))
        assert ids_of(a) == ids_of(b) == want, seed
        assert ids_of(run(m, *args, "--spec", "ngram")) == want
        assert spec_stats(a)[0] > 0


def test_text_and_stop_strings(text_model, tmp_path):
    """Text through run, then stop strings and max_tokens through the server (--spec auto),
    with a server whose drafts are all accepted (the model drafts for itself) against --spec none."""
    prompt = "one two three one two three one two three one two"
    base = ["--prompt", prompt, "--max-new", "40", "--ignore-eos"]
    want = run(text_model, *base, "--spec", "none").stdout.decode()
    assert len(want) > 10
    specs = (["ngram"], ["auto"], ["draft", "--draft", text_model])
    for spec in specs:
        assert run(text_model, *base, "--spec", *spec).stdout.decode() == want, spec
    from test_server import MODEL_ID, Server, raw
    servers = [Server(text_model, str(tmp_path / "none.log"), "--no-memo", "--spec", "none"),
               Server(text_model, str(tmp_path / "draft.log"), "--no-memo", "--spec", "draft", "--draft", text_model),
               Server(text_model, str(tmp_path / "auto.log"), "--no-memo", "--spec", "auto")]
    try:
        def ask(srv, **kw):
            st, _, resp = raw(srv, "POST", "/v1/completions", {"model": MODEL_ID, "prompt": prompt, **kw})
            assert st == 200, resp
            return resp["choices"][0]["text"], resp["choices"][0]["finish_reason"], resp["usage"]["completion_tokens"]
        full = ask(servers[0], max_tokens=40)[0]
        assert full
        cases = [{"max_tokens": n} for n in (1, 2, 3, 5, 8, 13)]
        cases += [{"max_tokens": 40, "stop": [full[i:i + 3]]} for i in range(1, min(len(full) - 3, 40), 7)
                  if full[i:i + 3].strip()]
        cases += [{"max_tokens": 40, "temperature": 0.9, "seed": s} for s in (1, 2)]
        for kw in cases:
            ref = ask(servers[0], **kw)
            for srv in servers[1:]:
                assert ask(srv, **kw) == ref, kw
    finally:
        for s in servers:
            s.stop()
    log = open(tmp_path / "draft.log").read()
    m = re.findall(r"spec draft: (\d+) passes, (\d+) drafted, (\d+) accepted", log)
    assert m and sum(int(a) for a, _, _ in m) > 0, log


def chi2_sf_even(x, dof):
    """Survival function of chi-square with an even number of degrees of freedom."""
    k = dof // 2
    s, term = 0.0, 1.0
    for i in range(k):
        if i:
            term *= (x / 2) / i
        s += term
    return math.exp(-x / 2) * s


def softmax_topk(row, k):
    top = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
    v = np.array([row[j] for j in top], dtype=np.float64)
    p = np.exp(v - v.max())
    return dict(zip(top, p / p.sum()))


def test_sampled_distribution_is_the_models(tmp_path):
    """The first two tokens at temperature 1, top-k 3, over many seeds, with the second chosen inside a verify
    pass (the model drafts for itself): their joint histogram against the model's probabilities."""
    m = MODELS / "qwen3-f16"
    prompt = [5, 6, 7, 8, 9]
    dump = tmp_path / "l.f32"

    def probs_after(ids):
        subprocess.run([deltafin_bin(), "eval", "--model", str(m), "--threads", "1", "--ids",
                        ",".join(map(str, ids)), "--dump-logits", str(dump)], check=True, capture_output=True,
                       timeout=120)
        return softmax_topk(np.fromfile(dump, dtype="<f4").reshape(len(ids), -1)[-1], 3)

    p1 = probs_after(prompt)
    joint = {}
    for a, pa in p1.items():
        for b, pb in probs_after(prompt + [a]).items():
            joint[(a, b)] = pa * pb
    n = 400
    counts = {}
    passes = 0
    for seed in range(1, n + 1):
        p = run(m, "--ids", ",".join(map(str, prompt)), "--max-new", "3", "--print-ids", "--temperature", "1",
                "--top-k", "3", "--seed", str(seed), "--spec", "draft", "--draft", str(m), "--stats")
        t = ids_of(p)
        passes += spec_stats(p)[0]
        counts[(t[0], t[1])] = counts.get((t[0], t[1]), 0) + 1
    assert passes >= n  # the second token came from a verify pass each time
    assert set(counts) <= set(joint), (counts, joint)
    cells = sorted(joint)
    x = sum((counts.get(c, 0) - n * joint[c]) ** 2 / (n * joint[c]) for c in cells)
    dof = len(cells) - 1
    if dof % 2:  # pad to an even dof: a conservative p-value (larger dof, same statistic)
        dof += 1
    assert chi2_sf_even(x, dof) > 1e-3, (x, counts, {c: n * joint[c] for c in cells})


def test_recurrent_model_says_speculation_is_off():
    p = run(MODELS / "kimi-linear-tiny", "--ids", "1,2,1,2,1,2", "--max-new", "5", "--stats", "--spec", "ngram")
    assert b"recurrent layers" in p.stderr and b"not built for them yet" in p.stderr
    assert spec_stats(p)[0] == 0


@pytest.mark.parametrize("args,msg", [
    (["--spec", "mtp"], "--spec mtp: the model has no MTP module to draft with"),
    (["--spec", "fast"], "--spec: expected none, ngram, draft, mtp or auto, got 'fast'"),
    (["--spec-max", "0"], "--spec-max: expected 1..32 drafted tokens per pass, got '0'"),
    (["--spec-max", "33"], "--spec-max: expected 1..32 drafted tokens per pass, got '33'"),
    (["--spec", "draft"], "--spec draft needs --draft MODEL"),
    (["--draft", str(MODELS / "qwen3-f16")], "--draft MODEL is used by --spec draft only (got --spec auto)"),
    (["--spec", "draft", "--draft", str(MODELS / "llama-bf16")],
     "--draft: the draft model's vocabulary has 640 ids, the model's 768"),
    (["--spec", "draft", "--draft", "/nonexistent/model"], "--draft /nonexistent/model:"),
])
def test_refusals(args, msg):
    p = run(MODELS / "qwen3-f16", "--ids", "1,2", *args, check=False)
    assert p.returncode == 2, p.stderr
    err = p.stderr.decode()
    assert msg in err and err.count("\n") == 1, err


def test_draft_vocabulary_bytes_differ(text_model, tmp_path):
    """Same size, different bytes: the draft model drafts through text
    (re-tokenized by the model's tokenizer), and the ids are those of --spec none."""
    import json
    import shutil
    other = tmp_path / "other"
    shutil.copytree(text_model, other)
    tj = json.load(open(other / "tokenizer.json"))
    vocab = tj["model"]["vocab"]
    words = sorted((v, k) for k, v in vocab.items() if len(k) > 3 and k.isalpha())
    (ia, a), (ib, b) = words[10], words[20]
    vocab[a], vocab[b] = ib, ia  # two ids swap their bytes
    json.dump(tj, open(other / "tokenizer.json", "w"))
    args = ["--prompt", "hi there, hi there, hi there", "--max-new", "24", "--ignore-eos", "--print-ids"]
    want = run(text_model, *args, "--spec", "none").stdout
    p = run(text_model, *args, "--spec", "draft", "--draft", str(other), "--stats")
    assert p.stdout == want
    assert b"across tokenizers (text level)" in p.stderr, p.stderr.decode()


@pytest.mark.parametrize("args,msg", [
    (["--spec", "mtp"], "--spec mtp: the model has no MTP module to draft with"),
    (["--spec-max", "40"], "--spec-max: expected 1..32 drafted tokens per pass, got '40'"),
    (["--spec", "draft", "--draft", str(MODELS / "llama-bf16")],
     "--draft: the draft model's vocabulary has 640 ids, the model's 768"),
])
def test_serve_refusals(args, msg):
    p = subprocess.run([deltafin_bin(), "serve", "--model", str(MODELS / "qwen3-f16"), "--port", "0", *args],
                       capture_output=True, timeout=60)
    assert p.returncode == 2
    assert msg in p.stderr.decode() and p.stderr.decode().count("\n") == 1, p.stderr.decode()
