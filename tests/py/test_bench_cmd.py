"""`deltafin bench WORKLOAD` (issue 16 item 5): named workloads run as child
processes with two arms interleaved, output gated on the first arm's ids,
results.json / results.md / SVG plots; `run --stats-json` (what the run
workloads read) and `tokenize/detokenize --time` (what the tokenizer workload
reads).

The models are the committed tiny checkpoints (tests/data/models) and, for
the server and tokenizer workloads, the tiny Qwen3 with the real tokenizer
(make_tiny_chat_model.py). Timings are not checked (the host is shared):
the structure, the interleaving, the gate and the refusals are."""
import json
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import MODELS  # noqa: E402
import make_tiny_chat_model  # noqa: E402

MOE = str(MODELS / "qwen3-moe-bf16")
DENSE = str(MODELS / "llama-f32-tied")
SVG = "{http://www.w3.org/2000/svg}"


def bench(dfbin, *args, timeout=300):
    return subprocess.run([dfbin, "bench", *args], capture_output=True, text=True, timeout=timeout)


def png_size(path):
    """(width, height) of a PNG, after checking its signature and that it ends with IEND."""
    b = pathlib.Path(path).read_bytes()
    assert b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR" and b[-8:-4] == b"IEND"
    return int.from_bytes(b[16:20], "big"), int.from_bytes(b[20:24], "big")


def svgs(plots):
    """The SVG plots of a results.json 'plots' list; every one has its PNG beside it."""
    s = {p for p in plots if p.endswith(".svg")}
    assert {p[:-4] + ".png" for p in s} == {p for p in plots if p.endswith(".png")}
    return s


def series_names(svg_path):
    """The data-name of every <g class="series"> of an SVG (parsed as XML)."""
    root = ET.parse(svg_path).getroot()
    assert root.tag == SVG + "svg"
    return [g.get("data-name") for g in root.iter(SVG + "g") if g.get("class") == "series"]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return make_tiny_chat_model.build(str(tmp_path_factory.mktemp("bench-chat")))


# ---- run --stats-json ------------------------------------------------------------

def test_run_stats_json(dfbin, tmp_path):
    sj = tmp_path / "s.json"
    p = subprocess.run([dfbin, "run", "--model", MOE, "--ids", "1,2,3", "--max-new", "6", "--ignore-eos", "--print-ids",
                        "--expert-cache", "0", "--stats-json", str(sj)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    s = json.loads(sj.read_text())
    printed = [int(x) for x in p.stdout.split()]
    assert s["ids"] == printed and len(printed) == 6
    assert s["decode_tokens"] + 1 == len(printed) or s["decode_tokens"] == len(printed)
    assert s["streaming"] is True and 0 <= s["hit_rate"] <= 1
    assert s["expert_misses"] > 0 and s["bytes_read"] > 0
    se = s["series"]
    assert len(se["t"]) == len(se["hits"]) == len(se["lookups"]) == len(se["bytes_read"]) == 6
    assert se["t"] == sorted(se["t"]) and se["bytes_read"] == sorted(se["bytes_read"])
    assert se["lookups"][-1] == s["expert_hits"] + s["expert_prefetch_hits"] + s["expert_misses"]


def test_run_stats_json_unwritable(dfbin, tmp_path):
    p = subprocess.run([dfbin, "run", "--model", MOE, "--ids", "1,2", "--max-new", "2", "--stats-json",
                        str(tmp_path / "no" / "such" / "dir.json")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "--stats-json" in p.stderr and "cannot open it for writing" in p.stderr


# ---- decode: two arms, interleaved, gated ------------------------------------------

def test_decode_two_arms(dfbin, tmp_path):
    out = tmp_path / "out"
    p = bench(dfbin, "decode", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--threads 1", "--reps", "3",
              "--model", MOE, "--max-new", "12", "--floor-mem", "16M", "--out", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "results.json").read_text())
    for k in ("workload", "status", "failures", "machine", "date", "git_commit", "command", "floors", "arms", "order",
              "runs", "summary", "plots", "reps"):
        assert k in r, k
    assert r["workload"] == "decode" and r["status"] == "PASSED" and r["failures"] == []
    assert [a["name"] for a in r["arms"]] == ["A", "B"] and r["arms"][1]["options"] == ["--threads", "1"]
    assert r["command"][:2] == ["bench", "decode"] and f"'B={dfbin}:--threads 1'" in r["command_line"]  # quoted to paste
    assert r["floors"]["mem_read_gbs"] > 0 and r["floors"]["peak_fma_gflops"] > 0
    # interleaved, the order rotated per rep
    assert [(o["arm"], o["rep"]) for o in r["order"]] == [("A", 0), ("B", 0), ("B", 1), ("A", 1), ("A", 2), ("B", 2)]
    for arm in ("A", "B"):
        runs = r["runs"][arm]
        assert len(runs) == 3 and all(x["ok"] and x["id_check"] == "equal" for x in runs)
        assert all(len(x["ids"]) == 12 and x["decode_tok_s"] > 0 for x in runs)
        assert runs[0]["argv"][:2] == [dfbin, "run"] and "--stats-json" in runs[0]["argv"]
        m = r["summary"][arm]["decode_tok_s"]
        assert m["runs"] == 3 and m["min"] <= m["median"] <= m["max"]
        assert m["pct_of_floor"] > 0
    assert r["runs"]["B"][0]["argv"][-2:] == ["--threads", "1"]  # the arm's options come last
    assert "ratio_to_first" in r["summary"]["B"]["decode_tok_s"]
    md = (out / "results.md").read_text()
    assert "| decode tok/s | A | 3 |" in md and "PASSED" in md and "% of floor" in md
    assert svgs(r["plots"]) == {"runs.svg", "over_run_tok_s.svg"}
    assert series_names(out / "runs.svg")[:2] == ["A", "B"]
    assert png_size(out / "runs.png") == (1520, 880) and png_size(out / "over_run_tok_s.png") == (1520, 880)
    assert series_names(out / "over_run_tok_s.svg") == ["A", "B"]


def test_decode_sampled_arm_fails_the_gate(dfbin, tmp_path):
    out = tmp_path / "out"
    p = bench(dfbin, "decode", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--temperature 1 --seed 7", "--reps", "1",
              "--model", MOE, "--max-new", "12", "--no-floors", "--out", str(out))
    assert p.returncode == 1, p.stderr
    assert "FAILED" in p.stdout and "generated ids differ at position" in p.stderr
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "FAILED" and r["runs"]["B"][0]["id_check"] == "DIFFERENT"
    assert any("arm B rep 0" in f for f in r["failures"])
    # the same arms with --no-id-check B: passes, B's check recorded as skipped
    p = bench(dfbin, "decode", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--temperature 1 --seed 7", "--reps", "1",
              "--model", MOE, "--max-new", "12", "--no-floors", "--no-id-check", "B", "--out", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "results.json").read_text())
    assert r["status"] == "PASSED" and r["runs"]["B"][0]["id_check"].startswith("skipped")


def test_decode_other_model_fails_the_gate(dfbin, tmp_path):
    out = tmp_path / "out"
    p = bench(dfbin, "decode", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--model {DENSE}", "--reps", "1",
              "--model", MOE, "--max-new", "8", "--no-floors", "--out", str(out))
    assert p.returncode == 1
    assert json.loads((out / "results.json").read_text())["status"] == "FAILED"


def test_decode_failing_run_is_failed(dfbin, tmp_path):
    out = tmp_path / "out"
    p = bench(dfbin, "decode", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--ctx 0", "--reps", "1",
              "--model", MOE, "--max-new", "4", "--no-floors", "--out", str(out))
    assert p.returncode == 1
    r = json.loads((out / "results.json").read_text())
    assert r["runs"]["B"][0]["ok"] is False and "exit 2" in r["runs"]["B"][0]["error"]
    assert "--ctx" in r["runs"]["B"][0]["error"]


# ---- prefill, stream ---------------------------------------------------------------

def test_prefill(dfbin, tmp_path):
    out = tmp_path / "out"
    p = bench(dfbin, "prefill", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--threads 1", "--reps", "1",
              "--model", DENSE, "--prompt-len", "40", "--floor-mem", "16M", "--out", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "results.json").read_text())
    a = r["runs"]["A"][0]
    assert a["prefill_tokens"] == 40 and a["prefill_tok_s"] > 0 and a["prefill_gflops"] > 0 and len(a["ids"]) == 1
    assert r["summary"]["A"]["prefill_tok_s"]["pct_of_floor"] > 0


def test_stream(dfbin, tmp_path):
    out = tmp_path / "out"
    p = bench(dfbin, "stream", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--prefetch never", "--reps", "2",
              "--model", MOE, "--max-new", "16", "--expert-cache", "256K", "--floor-mem", "16M", "--out", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "results.json").read_text())
    assert "posix_fadvise" in r["page_cache"] and r["model_bytes"] > 0 and "disk_note" in r["floors"]
    for arm in ("A", "B"):
        for x in r["runs"][arm]:
            assert x["streaming"] is True and x["files_evicted"] >= 1
            assert "--expert-cache" in x["argv"] and x["decode_mb_per_token"] > 0
            assert 0 < x["hit_rate"] < 1  # a cache smaller than the experts: some hits, some reads
    assert {"over_run_hit_rate.svg", "over_run_mb_per_token.svg"} <= svgs(r["plots"])
    assert series_names(out / "over_run_hit_rate.svg") == ["A", "B"]
    md = (out / "results.md").read_text()
    assert "disk floor" in md and "- model files " in md and "NOT over the cache" not in md


# ---- server, tokenizer ---------------------------------------------------------------

def test_server_two_clients(dfbin, chat_model, tmp_path):
    out = tmp_path / "out"
    p = bench(dfbin, "server", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--threads 1", "--reps", "1",
              "--model", chat_model, "--max-new", "8", "--clients", "2", "--requests", "2", "--out", str(out), timeout=600)
    assert p.returncode == 0, p.stderr + p.stdout
    r = json.loads((out / "results.json").read_text())
    for arm in ("A", "B"):
        x = r["runs"][arm][0]
        assert x["ok"] and x["id_check"] == "equal" and x["serve_exit"] == 0
        assert x["clients"] == 2 and x["requests"] == 4 and len(x["texts"]) == 4 and len(x["ttft_s_all"]) == 4
        assert all(t for t in x["texts"]) and x["ttft_p50_ms"] > 0 and len(x["itl_s_all"]) > 0
    assert svgs(r["plots"]) == {"runs.svg", "latency_ttft.svg", "latency_itl.svg"}
    assert png_size(out / "latency_itl.png") == (1520, 880)
    assert series_names(out / "latency_ttft.svg") == ["A", "B"]
    assert series_names(out / "latency_itl.svg") == ["A", "B"]


def test_tokenizer(dfbin, chat_model, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. héllo 日本語 12345\n" * 500, encoding="utf-8")
    out = tmp_path / "out"
    p = bench(dfbin, "tokenizer", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}:--threads 1", "--reps", "2",
              "--model", chat_model, "--corpus", str(corpus), "--out", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "results.json").read_text())
    ids = subprocess.run([dfbin, "tokenize", "--tokenizer", chat_model], stdin=open(corpus), capture_output=True,
                         timeout=120).stdout
    for arm in ("A", "B"):
        for x in r["runs"][arm]:
            assert x["ok"] and x["id_check"] == "equal" and x["timing"].startswith("--time")
            assert x["tokens"] == len(json.loads(ids)) and x["corpus_bytes"] == corpus.stat().st_size
            assert x["encode_s"] > 0
    assert series_names(out / "runs.svg") == ["A", "B"]


def test_tokenize_time_option(dfbin, chat_model):
    p = subprocess.run([dfbin, "tokenize", "--tokenizer", chat_model, "--time"], input="hello world", capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)
    assert "time: load " in p.stderr and ", encode " in p.stderr and "11 bytes" in p.stderr
    p = subprocess.run([dfbin, "detokenize", "--tokenizer", chat_model, "--time"], input=p.stdout, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout == "hello world" and ", decode " in p.stderr


# ---- refusals --------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    ([], "at least two arms"),
    (["--arm", "A=@BIN@"], "at least two arms (--arm NAME=BINARY[:OPTIONS]), got 1"),
    (["--arm", "A@BIN@", "--arm", "B=@BIN@"], "expected NAME=BINARY[:OPTIONS]"),
    (["--arm", "A=/no/such/binary", "--arm", "B=@BIN@"], "is not an executable file"),
    (["--arm", "A=@BIN@", "--arm", "A=@BIN@"], "the name 'A' is given twice"),
    (["--arm", "A b=@BIN@", "--arm", "B=@BIN@"], "NAME may hold letters"),
    (["--arm", "A=@BIN@", "--arm", "B=@BIN@", "--reps", "0"], "--reps: expected 1..64"),
    (["--arm", "A=@BIN@", "--arm", "B=@BIN@", "--bogus"], "unknown option '--bogus'"),
    (["--arm", "A=@BIN@", "--arm", "B=@BIN@", "--no-id-check", "C"], "--no-id-check C: no arm has that name"),
    (["--arm", "A=@BIN@", "--arm", "B=@BIN@", "--no-id-check", "A"], "the first arm is the reference"),
    (["--arm", "A=@BIN@", "--arm", "B=@BIN@", "--ids", "1,x"], "--ids:"),
    (["--arm", "A=@BIN@", "--arm", "B=@BIN@", "--prompt", "a", "--ids", "1"], "at most one of --prompt and --ids"),
    (["--arm", "A=@BIN@", "--arm", "B=@BIN@", "--timeout", "nan"], "--timeout: expected seconds"),
])
def test_bad_options(dfbin, tmp_path, args, needle):
    args = [a.replace("@BIN@", dfbin) for a in args]
    p = bench(dfbin, "decode", *args, "--out", str(tmp_path / "o"))
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and p.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_bad_options_tokenizer_and_help(dfbin, tmp_path):
    p = bench(dfbin, "tokenizer", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}")
    assert p.returncode == 2 and "--corpus FILE is required" in p.stderr
    p = bench(dfbin, "tokenizer", "--arm", f"A={dfbin}", "--arm", f"B={dfbin}", "--corpus", str(tmp_path / "missing"))
    assert p.returncode == 2 and "cannot read it" in p.stderr
    p = bench(dfbin, "decode", "--help")
    assert p.returncode == 0 and "--arm NAME=BINARY[:OPTIONS]" in p.stdout and "tokenizer" in p.stdout
    p = bench(dfbin, "nonsense")
    assert p.returncode == 2 and "decode | prefill | stream | server | tokenizer" in p.stderr
