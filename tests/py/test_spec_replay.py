"""bench/spec_replay (issue 15 step 8): a greedy answer replayed through spec.c's drafter and auto policy under a
scripted pass cost. Checked here: the properties the tool's output must have whatever the policy does (the oracle
drafts only accepted tokens and is never slower than auto or ngram; every mode generates the whole answer), and that
malformed id files and arguments are refused with exit status 2 and a message naming what was wrong. kernel_bench's
new --px NP argument is range-checked the same way."""
import os
import pathlib
import re
import subprocess

import pytest

from conftest import deltafin_bin


def tool(name):
    p = pathlib.Path(os.path.realpath(deltafin_bin())).parent / "bench" / name  # ./deltafin links into the build folder
    if not p.exists():
        pytest.skip(f"{p} not built (make all)")
    return str(p)


def run(*args):
    return subprocess.run([tool("spec_replay"), *map(str, args)], capture_output=True, text=True, timeout=60)


def write(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text)
    return f


LINE = re.compile(r"^(auto|ngram|oracle)\s+([0-9.]+)x\s+(\d+) passes \(([0-9.]+) tokens a pass\), (\d+) of (\d+) drafts accepted, (\d+) plain steps$")


def parse(out):
    res = {}
    for line in out.splitlines():
        m = LINE.match(line.strip())
        if m:
            g = m.groups()
            res[g[0]] = dict(speed=float(g[1]), passes=int(g[2]), acc=int(g[4]), drafted=int(g[5]), plain=int(g[6]))
    return res


def test_replay_properties(tmp_path):
    # a "file" of 40 distinct lines of 6 ids, then an answer that copies it with one line changed and one skipped
    lines = [[1000 + 10 * i + j for j in range(6)] for i in range(40)]
    prompt = [1, 2, 3] + [t for ln in lines for t in ln] + [4, 5]
    ans_lines = [ln[:] for ln in lines]
    ans_lines[12][3] = 7
    del ans_lines[25]
    answer = [t for ln in ans_lines for t in ln]
    p = write(tmp_path, "p.ids", ",".join(map(str, prompt)))
    a = write(tmp_path, "a.ids", " ".join(map(str, answer)) + "\n")
    r = run(p, a, 1.0, 0.28, 8)
    assert r.returncode == 0, r.stderr
    res = parse(r.stdout)
    assert set(res) == {"auto", "ngram", "oracle"}, r.stdout
    n_gen = len(answer) - 1  # the first answer id comes from the prefill
    for name, v in res.items():
        # every generated token is one plain step or one token of a pass (its accepted drafts + the model's own)
        assert v["plain"] + v["passes"] + v["acc"] == n_gen, (name, v)
        assert v["acc"] <= v["drafted"]
    assert res["oracle"]["acc"] == res["oracle"]["drafted"]  # the oracle drafts only what is accepted
    assert res["oracle"]["speed"] >= res["auto"]["speed"] * 0.97 and res["oracle"]["speed"] >= res["ngram"]["speed"] * 0.97
    assert res["auto"]["speed"] > 1.5, r.stdout  # a copy this long: drafting pays at that cost
    # a more expensive draft lowers every mode's speedup
    r2 = run(p, a, 1.0, 0.6, 8)
    res2 = parse(r2.stdout)
    assert res2["oracle"]["speed"] < res["oracle"]["speed"]


@pytest.mark.parametrize("prompt,answer,args,msg", [
    ("1 2 x", "1 2 3", [], "unexpected character 'x'"),
    ("1 2 99999999999", "1 2 3", [], "larger than 2147483647"),
    ("1 2 3", "", [], "an answer of 2+ ids"),
    ("", "1 2 3", [], "a prompt of 1+ ids"),
    ("1 2 3", "1 2 3", ["abc"], "A (a pass's fixed cost in plain steps) must be a number"),
    ("1 2 3", "1 2 3", [1, -1], "B (a pass's cost per drafted token) must be a number in [0, 100], got '-1'"),
    ("1 2 3", "1 2 3", [1, 0.2, 99], "K_MAX must be a number in [1, 32], got '99'"),
    ("1 2 3", "1 2 3", [1, 0.2, 2.5], "K_MAX must be a whole number"),
    ("1 2 3", "1 2 3", [1, 0.2, 4, 5], "too many arguments"),
])
def test_replay_refuses(tmp_path, prompt, answer, args, msg):
    p = write(tmp_path, "p.ids", prompt)
    a = write(tmp_path, "a.ids", answer)
    r = run(p, a, *args)
    assert r.returncode == 2 and msg in r.stderr, (r.returncode, r.stderr)


def test_replay_missing_file(tmp_path):
    r = run(tmp_path / "nope.ids", tmp_path / "nope2.ids")
    assert r.returncode == 2 and "cannot open" in r.stderr and "nope.ids" in r.stderr


@pytest.mark.parametrize("np_", ["0", "17", "x"])
def test_kernel_bench_px_np_range(np_):
    r = subprocess.run([tool("kernel_bench"), "--px", "3", "64", "4096", np_], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "NP must be 1..16" in r.stderr, (r.returncode, r.stderr)

