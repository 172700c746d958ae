"""Parity of `deltafin tokenize` / `detokenize` with Hugging Face `tokenizers`
and `tiktoken` on a generated corpus (code, many scripts, emoji ZWJ sequences,
combining marks, whitespace runs, CRLF, numbers, special-token text), plus
invalid-UTF-8 round trips, parallel == serial, the PCRE2 path == the scanner
fast path, and CLI errors. The binary is $DELTAFIN_BIN (default <repo>/deltafin)."""
import json
import os
import random
import subprocess
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIX = REPO.parent / "shared" / "fixtures" / "tokenizers"
BIN = os.environ.get("DELTAFIN_BIN", str(REPO / "deltafin"))


CODE = [
    'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n',
    '#include <stdio.h>\nint main(int argc, char **argv) {\n\tfor (int i = 0; i < argc; i++) printf("%s\\n", argv[i]);\n\treturn 0;\n}\n',
    'fn main() {\n    let v: Vec<u32> = (1..=10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n',
    'const f = async (url) => { const r = await fetch(url); return r.json(); };\n// TODO: handle errors\n',
    'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello, 世界")\n}\n',
    'SELECT id, name FROM users WHERE created_at >= \'2024-01-01\' ORDER BY id DESC LIMIT 10;\r\n',
    '<html>\n  <body class="main">\n    <p>Hello &amp; welcome!</p>\n  </body>\n</html>\n',
    '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b\\u00e9"}}\n',
    '    if x == 0:\n        return None  # early exit\n\n\n    else:\n',
]
PROSE = [
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m.; don't you think they'll be late? I'M SURE WE'VE SEEN IT.",
    "Le cœur a ses raisons que la raison ne connaît point. « Ça va ? » — Très bien, merci !",
    "Die Straße ist übermäßig groß. Äpfel, Öl und Übung.",
    "¿Dónde está la biblioteca? ¡Vamos ya!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "العربية لغة جميلة، وهي لغة القرآن الكريم. ١٢٣٤٥",
    "עברית היא שפה שמית.",
    "हिन्दी भारत की राजभाषा है। क्षत्रिय, ज्ञान, श्री।",
    "ภาษาไทยเป็นภาษาที่สวยงาม ไม่มีการเว้นวรรคระหว่างคำ",
    "我们的目标是星辰大海。人工智能正在改变世界，机器学习很重要！",
    "日本語の文章です。カタカナとひらがな、そして漢字。ｶﾀｶﾅ。",
    "한국어는 아름다운 언어입니다. 안녕하세요!",
    "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ế ề ể ễ ệ.",
    "Türkçe: İstanbul, ığdır, şeker.",
    "ᐊᓂᔑᓈᐯᒧᐎᓐ ᎣᏏᏲ ᚠᚢᚦᚨᚱᚲ 𐌰𐌱𐌲 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
]
EMOJI = ["👨‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🇫🇷🇯🇵", "1️⃣", "❤️‍🔥", "🧑🏿‍💻", "😀😃😄", "🫠", "✨🚀"]
COMBINING = ["e\u0301", "a\u0308\u0301", "o\u0323\u0302", "q\u0307\u0323", "\u1100\u1161\u11a8", "\u212b", "\u2126",
             "A\u030a", "\u0301abc", "n\u0303o", "\u0958", "s\u0323\u0307", "\u1e9b\u0323", "it'\u017f", "\u212a"]
WS = [" ", "  ", "\t", "\n", "\r\n", "\n\n\n", "   \n  ", "\u00a0", "\u3000", "\u2028", "\u0085", " \t \r\n\t", "\r", "\u180e", "\u200b"]
NUMS = ["0", "42", "1234567", "3.14159", "-0.5e-10", "1,000,000", "٣٤٥", "１２３", "²³", "Ⅻ", "12:30", "2024-05-09"]
SPECIAL = ["<|im_end|>", "<|endoftext|>", "<|im_start|>user", "<think>", "</think>", "<｜begin▁of▁sentence｜>",
           "<｜User｜>", "<|EOT|>", "<|im_e", "<<|im_end|>>", "<|endofprompt|>", "<tool_call>"]


def gen_corpus(seed=1234, n_docs=600):
    rng = random.Random(seed)
    assigned = [c for c in range(0x20, 0x3000) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    pools = [CODE, PROSE, EMOJI, COMBINING, WS, NUMS, SPECIAL]
    docs = []
    for _ in range(n_docs):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.08:
                parts.append("".join(chr(rng.choice(assigned)) for _ in range(rng.randint(1, 8))))
            elif r < 0.12:
                parts.append(rng.choice("abcXYZ'’.,!?-_/\\ \t\n\r0123") * rng.randint(1, 40))
            else:
                parts.append(rng.choice(rng.choice(pools)))
            if rng.random() < 0.5:
                parts.append(rng.choice(WS))
        docs.append("".join(parts))
    docs += PROSE + CODE + EMOJI + COMBINING + NUMS + SPECIAL + WS + ["", "a", " ", "'s", "'S", "'ll", " 's"]
    return docs


def run(args, data, env=None):
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([BIN] + args, input=data, capture_output=True, env=e, timeout=120)


def tok_jsonl(path, docs, extra=(), env=None):
    data = "".join(json.dumps(d) + "\n" for d in docs).encode()
    r = run(["tokenize", "--tokenizer", str(path), "--jsonl", *extra], data, env)
    assert r.returncode == 0, r.stderr.decode()
    out = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert len(out) == len(docs)
    return out


def tok_raw(path, data, extra=(), env=None):
    r = run(["tokenize", "--tokenizer", str(path), *extra], data, env)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def detok(path, ids):
    r = run(["detokenize", "--tokenizer", str(path)], json.dumps(ids).encode())
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def nfc_bytes(b):
    """NFC of the valid UTF-8 runs of b; invalid bytes stay as they are (they compose with nothing)."""
    return unicodedata.normalize("NFC", b.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def first_diff(docs, got, want):
    for d, g, w in zip(docs, got, want):
        if g != w:
            return f"text={d!r}\n got={g}\nwant={w}"
    return None


@pytest.fixture(scope="module")
def corpus():
    return gen_corpus()


@pytest.fixture(scope="module")
def hf():
    from tokenizers import Tokenizer
    return {n: Tokenizer.from_file(str(FIX / n / "tokenizer.json")) for n in ("qwen3", "deepseek-v3")}


@pytest.fixture(scope="module")
def o200k():
    import tiktoken
    import tiktoken.load
    j = json.loads((FIX / "o200k" / "o200k_base.json").read_text())
    ranks = tiktoken.load.load_tiktoken_bpe(str(FIX / "o200k" / "o200k_base.tiktoken"))
    return tiktoken.Encoding("o200k_base_fixture", pat_str=j["pat_str"], mergeable_ranks=ranks, special_tokens=j["special_tokens"])


@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3"])
def test_hf_parity(name, corpus, hf):
    t = hf[name]
    want = [e.ids for e in t.encode_batch(corpus, add_special_tokens=False)]
    got = tok_jsonl(FIX / name, corpus)
    assert got == want, first_diff(corpus, got, want)
    # the PCRE2 path (no hand-written scanner) gives the same ids
    got_re = tok_jsonl(FIX / name, corpus, env={"DF_TOK_NO_FAST": "1"})
    assert got_re == want, first_diff(corpus, got_re, want)
    # one long document (exercises the parallel path) and its round trip
    big = "\n".join(corpus)
    ids = tok_raw(FIX / name, big.encode())
    assert ids == t.encode(big, add_special_tokens=False).ids
    out = detok(FIX / name, ids)
    assert out.decode() == t.decode(ids, skip_special_tokens=False)
    # Qwen normalizes to NFC, so its round trip gives the NFC text
    assert out == (unicodedata.normalize("NFC", big) if name == "qwen3" else big).encode()


def test_tiktoken_parity(corpus, o200k):
    path = FIX / "o200k" / "o200k_base.tiktoken"
    want = [o200k.encode_ordinary(d) for d in corpus]
    got = tok_jsonl(path, corpus)
    assert got == want, first_diff(corpus, got, want)
    got_re = tok_jsonl(path, corpus, env={"DF_TOK_NO_FAST": "1"})
    assert got_re == want, first_diff(corpus, got_re, want)
    want_sp = [o200k.encode(d, allowed_special="all") for d in corpus]
    got_sp = tok_jsonl(path, corpus, ["--allow-special"])
    assert got_sp == want_sp, first_diff(corpus, got_sp, want_sp)
    big = "\n".join(corpus)
    ids = tok_raw(FIX / "o200k", big.encode())  # the directory form finds the single .tiktoken
    assert ids == o200k.encode_ordinary(big)
    assert detok(path, ids) == o200k.decode_bytes(ids) == big.encode()


@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3", "o200k"])
def test_invalid_utf8_round_trip(name):
    rng = random.Random(7)
    chunks = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 30))) for _ in range(300)]
    chunks += [b"\xff", b"\xc3", b"\xe4\xb8", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"a\x80b", b"  \xff", b"\n\xfe\n"]
    data = b"".join(c + rng.choice([b"", b" ", b"\n", "é".encode(), b"abc"]) for c in chunks)
    for piece in (data, b"\xff", b"  \xff", b"\xe4\xb8"):
        ids = tok_raw(FIX / name, piece)
        assert detok(FIX / name, ids) == (nfc_bytes(piece) if name == "qwen3" else piece)
    # the fast scanner and PCRE2 agree on invalid bytes too
    assert tok_raw(FIX / name, data) == tok_raw(FIX / name, data, env={"DF_TOK_NO_FAST": "1"})


@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3", "o200k"])
def test_parallel_equals_serial(name, corpus):
    rng = random.Random(99)
    docs = corpus[:]
    parts = []
    size = 0
    while size < 3 << 20:
        d = rng.choice(docs)
        parts.append(d)
        size += len(d.encode())
    big = "\n".join(parts).encode()
    serial = tok_raw(FIX / name, big, ["--threads", "1"])
    par = tok_raw(FIX / name, big, ["--threads", "4"])
    assert serial == par
    assert detok(FIX / name, par) == (nfc_bytes(big) if name == "qwen3" else big)


def test_qwen_multi_mb_matches_hf(corpus, hf):
    text = "\n".join(corpus * 12)
    assert len(text.encode()) > 1 << 20
    assert tok_raw(FIX / "qwen3", text.encode(), ["--threads", "2"]) == hf["qwen3"].encode(text, add_special_tokens=False).ids


def test_help_and_errors(tmp_path):
    for cmd in ("tokenize", "detokenize"):
        r = run([cmd, "--help"], b"")
        assert r.returncode == 0 and b"--tokenizer" in r.stdout
    r = run(["tokenize", "--tokenizer", str(tmp_path / "missing")], b"x")
    assert r.returncode == 2 and b"missing" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}')
    r = run(["tokenize", "--tokenizer", str(broken)], b"x")
    assert r.returncode == 2 and b"merges" in r.stderr
    broken.write_text('{"model": ')
    r = run(["tokenize", "--tokenizer", str(tmp_path)], b"x")
    assert r.returncode == 2 and b"tokenizer.json" in r.stderr
    r = run(["tokenize", "--tokenizer", str(FIX / "qwen3"), "--jsonl"], b'"ok"\nnot json\n')
    assert r.returncode == 2 and b"line 2" in r.stderr
    r = run(["detokenize", "--tokenizer", str(FIX / "qwen3")], b"[1, 2, 99999999]")
    assert r.returncode == 2 and b"stdin[2]" in r.stderr
    r = run(["detokenize", "--tokenizer", str(FIX / "qwen3")], b"{")
    assert r.returncode == 2
    r = run(["tokenize", "--bogus"], b"")
    assert r.returncode == 2
