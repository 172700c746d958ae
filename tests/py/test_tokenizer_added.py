"""Added tokens against HF `tokenizers` on texts that made the matcher
quadratic: tokens longer than the trie's plain walk (DF_TRIE_WALK_MAX, 64
bytes: then the reversed Aho-Corasick scan runs), raw and normalized, and
whitespace tokens with lstrip / rstrip over long whitespace runs. The ids must
be HF's exactly; the long texts (tens of KiB against 100-byte tokens) took
seconds per call before the scan was made linear (fuzz_tokenizer_json's
timeout in CI)."""
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIX = REPO.parent / "shared" / "fixtures" / "tokenizers"
BIN = os.environ.get("DELTAFIN_BIN", str(REPO / "deltafin"))


def added(i, content, **flags):
    d = {"id": 151669 + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False}
    d.update(flags)
    return d


LONG = [
    added(0, "<" + "long" * 30 + ">"),                       # 122 bytes, raw
    added(1, "a" * 100 + "b"),                                # the plain walk's worst case
    added(2, "a" * 70),                                       # a shorter one inside it
    added(3, "\u00e9" * 40, normalized=True),                 # 80 bytes, normalized (NFC keeps it)
    added(4, "x" * 90 + "y", normalized=True),
    added(5, "<ab|>"),
]
# lstrip on whitespace tokens: each match would walk back over the whole run
LSTRIP = [
    added(0, " ", lstrip=True),
    added(1, "\n\n", lstrip=True),
    added(2, "<t>", lstrip=True),
    added(3, "w\u00f6rd", single_word=True),
    added(4, "\u3000", lstrip=True, normalized=True),
]
# rstrip (no whitespace token: HF's own matcher panics, "AddedVocabulary bad
# split", when a match starts inside the run a previous one stripped)
RSTRIP = [
    added(0, "<t>", rstrip=True),
    added(1, "<u>", lstrip=True, rstrip=True),
    added(2, "w\u00f6rd", single_word=True, rstrip=True),
    added(3, "<v>", rstrip=True, normalized=True),
]


def texts(seed):
    rnd = random.Random(seed)
    out = ["a" * 20000, "a" * 20000 + "b", "x" * 30000, "x" * 30000 + "y", " " * 20000, "\n" * 9000,
           " " * 5000 + "<t>" + " " * 5000 + "<t>", "<t>" + " " * 20000 + "<u>" + " " * 9000, "\u3000" * 3000 + "z", "\u00e9" * 4000 + "b"]
    pieces = ["a" * 100 + "b", "a" * 70, "a" * 99, "<" + "long" * 30 + ">", "<" + "long" * 29, "\u00e9" * 40,
              "e\u0301" * 40, "x" * 91 + "y", "<ab|>", "<ab", " ", "  ", "\n\n", "\n", "<t>", "<u>", "<v>", "w\u00f6rd", " w\u00f6rd ", "w\u00f6rds", "\u3000",
              "hello", "\u00e9", "a", "b", "x"]
    for _ in range(300):
        out.append("".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 40))))
    return out


def encode(tok_dir, docs):
    data = "".join(json.dumps(d) + "\n" for d in docs).encode()
    r = subprocess.run([BIN, "tokenize", "--tokenizer", str(tok_dir), "--jsonl"], input=data, capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    return [json.loads(x) for x in r.stdout.decode().splitlines()]


@pytest.mark.parametrize("name,tokens", [("long", LONG), ("lstrip", LSTRIP), ("rstrip", RSTRIP)])
def test_added_tokens_match_hf(tmp_path, name, tokens):
    from tokenizers import Tokenizer
    src = FIX / "qwen3" / "tokenizer.json"
    if not src.exists():
        pytest.fail(f"{src} is missing (../shared/fixtures)")
    tj = json.loads(src.read_text())
    vocab = tj["model"]["vocab"]
    assert not any(t["content"] in vocab for t in tokens)  # HF gives such a token its vocabulary id
    tj["added_tokens"] = tj["added_tokens"] + tokens
    d = tmp_path / name
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(tj))
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    docs = texts(len(name))
    want = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    got = encode(d, docs)
    assert len(got) == len(want)
    for doc, g, w in zip(docs, got, want):
        assert g == w, f"text={doc[:200]!r}... ({len(doc)} chars)\n got={g[:40]}\nwant={w[:40]}"
    # the added tokens did match somewhere (the test would prove nothing otherwise)
    ids = {t["id"] for t in tokens}
    assert all(any(i in w for w in want) for i in ids), "an added token never matched"


def test_scan_is_linear_in_the_text(tmp_path):
    """A 64,000-byte added token that almost matches everywhere in 1 MB of text:
    a walk from every position would take 6.4e10 steps (minutes); the scan
    takes milliseconds. The 120 s limit only guards against a hang; HF's ids
    are the reference."""
    from tokenizers import Tokenizer
    tj = json.loads((FIX / "qwen3" / "tokenizer.json").read_text())
    tj["added_tokens"] = tj["added_tokens"] + [added(0, "a" * 64000 + "b"), added(1, "<x|" + "a" * 80 + ">")]
    d = tmp_path / "huge"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(tj))
    docs = ["a" * 1_000_000, "a" * 200_000 + "a" * 64000 + "b" + "<x|" + "a" * 80 + ">" + "a" * 1000]
    want = [e.ids for e in Tokenizer.from_file(str(d / "tokenizer.json")).encode_batch(docs, add_special_tokens=False)]
    assert 151669 in want[1] and 151670 in want[1]
    assert encode(d, docs) == want
