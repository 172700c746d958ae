"""Hostile tokenizer.json files (issue 18): normalizers / pre-tokenizers that
grow the text without bound, and values that would size huge allocations.
`deltafin tokenize` must exit 2 with a message naming the step and the cap,
in bounded memory (peak RSS of the child is checked, and non-ASan binaries
also run under an address-space limit so the old behaviour, eating all
memory, fails fast instead of hurting the machine)."""
import json
import os
import resource
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIX = REPO.parent / "shared" / "fixtures" / "tokenizers"
BIN = os.environ.get("DELTAFIN_BIN", str(REPO / "deltafin"))
ASAN = b"__asan_init" in Path(BIN).resolve().read_bytes()
LIMIT = 2 << 30  # address space for non-ASan runs, and the peak RSS allowed


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run(args, stdin: bytes):
    """Runs the binary; returns (exit code, stdout, stderr, peak RSS in bytes)."""
    with tempfile.TemporaryFile() as fi, tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        fi.write(stdin)
        fi.seek(0)
        env = dict(os.environ)
        if ASAN:  # the sanitizer reserves address space: limit the allocation size instead
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":max_allocation_size_mb=2048:allocator_may_return_null=0"
        p = subprocess.Popen([BIN, *args], stdin=fi, stdout=fo, stderr=fe, env=env, preexec_fn=None if ASAN else _limit)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return p.returncode, fo.read(), fe.read().decode("utf-8", "replace"), ru.ru_maxrss * 1024


def qwen3_with(tmp_path, **changes):
    src = FIX / "qwen3" / "tokenizer.json"
    if not src.exists():
        pytest.fail(f"{src} is missing (../shared/fixtures)")
    tj = json.loads(src.read_text())
    tj.update(changes)
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(tj))
    return d


EIGHT_REPLACES = {"type": "Sequence", "normalizers": [
    {"type": "Replace", "pattern": {"String": "a"}, "content": "a" * 10} for _ in range(8)]}


def test_expanding_normalizer_is_refused_in_bounded_memory(tmp_path):
    d = qwen3_with(tmp_path, normalizer=EIGHT_REPLACES)
    rc, out, err, rss = run(["tokenize", "--tokenizer", str(d)], b"banana " * 20)
    assert rc == 2, (rc, err[-2000:])
    assert out == b""
    assert "tokenizer.json: normalizer step 4 of 8 (Replace \"a\" -> \"aaaaaaaaaa\")" in err, err
    assert "65536 bytes, the cap for a 140-byte input (max(64 KiB, 16 x input))" in err, err
    assert rss < LIMIT, rss
    # --jsonl names the line
    rc, out, err, _ = run(["tokenize", "--tokenizer", str(d), "--jsonl"], b'"xyz"\n"banana"\n')
    assert rc == 2 and "stdin line 2:" in err and "normalizer step" in err, (rc, err)


def test_normalized_added_token_past_the_cap_fails_at_load(tmp_path):
    tj = json.loads((FIX / "qwen3" / "tokenizer.json").read_text())
    added = tj["added_tokens"] + [{"id": 151669, "content": "a", "special": False, "normalized": True,
                                   "lstrip": False, "rstrip": False, "single_word": False}]
    d = qwen3_with(tmp_path, normalizer=EIGHT_REPLACES, added_tokens=added)
    rc, _, err, rss = run(["tokenize", "--tokenizer", str(d)], b"x")
    assert rc == 2 and "id 151669" in err and "normalizer step 5 of 8" in err, (rc, err[-2000:])
    assert rss < LIMIT


def test_real_tokenizers_are_untouched_by_the_cap(tmp_path):
    # the qwen3 fixture has an NFC normalizer: a long text full of decomposed
    # characters passes (NFC never grows text past 3x)
    text = ("e\u0301" * 5000 + " hello\n") * 4
    rc, out, err, _ = run(["tokenize", "--tokenizer", str(FIX / "qwen3")], text.encode())
    assert rc == 0, err
    assert len(json.loads(out)) > 0


@pytest.mark.parametrize("field,value,msg", [
    ("added_tokens", [{"id": 1 << 29, "content": "<x>", "special": True}], "added_tokens[0].id: expected an id in [0, 4194304), got 536870912"),
    ("normalizer", {"type": "Replace", "pattern": {"String": "a"}, "content": "b" * 5000}, "content is 5000 bytes, at most 1024 are accepted"),
    ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFC"}] * 100}, "normalizer: more than 64 steps"),
    ("pre_tokenizer", {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}] * 40}, "pre_tokenizer: more than 62 steps"),
])
def test_values_sizing_allocations_are_range_checked(tmp_path, field, value, msg):
    d = qwen3_with(tmp_path, **{field: value})
    rc, _, err, rss = run(["tokenize", "--tokenizer", str(d)], b"hello")
    assert rc == 2 and msg in err and "tokenizer.json" in err, (rc, err[-2000:])
    assert rss < LIMIT


def test_server_answers_400_in_bounded_memory(tmp_path):
    """The issue's server case: one request with an expanding tokenizer got
    the server OOM-killed. Now the request is refused with HTTP 400 naming
    the normalizer step, and the server keeps serving."""
    import http.client
    import re
    import sys
    import time
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_tiny_chat_model
    d = Path(make_tiny_chat_model.build(str(tmp_path / "m")))
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["normalizer"] = EIGHT_REPLACES
    (d / "tokenizer.json").write_text(json.dumps(tj))
    log = open(tmp_path / "serve.log", "w")
    env = dict(os.environ)
    if ASAN:
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":max_allocation_size_mb=2048:allocator_may_return_null=0"
    p = subprocess.Popen([BIN, "serve", "--model", str(d), "--port", "0", "--threads", "1"], stdout=subprocess.DEVNULL, stderr=log,
                         env=env, preexec_fn=None if ASAN else _limit)
    try:
        port = None
        deadline = time.time() + 60
        while port is None and time.time() < deadline and p.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", (tmp_path / "serve.log").read_text())
            port = int(m.group(1)) if m else time.sleep(0.05)
        assert port, (tmp_path / "serve.log").read_text()

        def post(prompt):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            c.request("POST", "/v1/completions", json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read().decode()

        status, body = post("banana " * 20)
        assert status == 400, body
        assert "normalizer step 4 of 8" in body and "refusing to tokenize" in body, body
        status, body = post("hello")  # no 'a': nothing grows
        assert status == 200, body
        hwm = int(re.search(r"VmHWM:\s+(\d+) kB", open(f"/proc/{p.pid}/status").read()).group(1)) * 1024
        assert hwm < LIMIT, hwm
    finally:
        p.terminate()
        p.wait(timeout=30)
        log.close()


def split_then_bytes(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}


def test_regex_that_pcre2_gives_up_on_is_an_error_not_other_tokens(tmp_path):
    # catastrophic backtracking: PCRE2 stops at its match limit; that used to
    # read as "no match" and silently gave different tokens (exit 0)
    d = qwen3_with(tmp_path, pre_tokenizer=split_then_bytes("(a+)+$"))
    rc, out, err, _ = run(["tokenize", "--tokenizer", str(d)], b"a" * 40 + b"b")
    assert rc == 2 and out == b"", (rc, out[:200], err)
    assert "tokenizer.json: pre-tokenizer step 1 of 1 (Split regex): PCRE2 gave up matching" in err, err


def test_pattern_matching_empty_everywhere_on_a_long_piece(tmp_path):
    # "a*" matches empty at every 'b': the scan moves on one character at a
    # time, which used to be one level of recursion per character
    d = qwen3_with(tmp_path, pre_tokenizer=split_then_bytes("a*"))
    text = b"b" * (2 << 20)

    def small_stack():
        if not ASAN:
            _limit()
        resource.setrlimit(resource.RLIMIT_STACK, (256 << 10, 256 << 10))

    with tempfile.TemporaryFile() as fi:
        fi.write(text)
        fi.seek(0)
        p = subprocess.run([BIN, "tokenize", "--tokenizer", str(d)], stdin=fi, capture_output=True, preexec_fn=small_stack, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(json.loads(p.stdout)) > 0
