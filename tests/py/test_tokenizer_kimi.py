"""Kimi K2/K3 tokenizer (a directory with tiktoken.model + tokenizer_config.json) against the `tiktoken`
package, the way Kimi's tokenization_kimi.py drives it: the Kimi split pattern (Han runs, letter classes
intersected with [^\\p{Han}]), the 256 special ids after the ranks named by added_tokens_decoder (K3's
[BOS] / <|end_of_msg|> / <|open|> ...), and the slicing guards (400,000-character slices, runs of at most
25,000 whitespace or non-whitespace characters, each piece encoded alone).

The real 163,584-rank tiktoken.model is not available offline: the rank file here is the first RANKS ranks
of the o200k_base fixture (a consistent tiktoken rank file whose first 256 ranks are the bytes), written
in the same base64 format, with K3's specials after it. The binary is $DELTAFIN_BIN (default <repo>/deltafin)."""
import base64
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from test_tokenizer import gen_corpus

REPO = Path(__file__).resolve().parents[2]
FIX = REPO.parent / "shared" / "fixtures" / "tokenizers"
BIN = os.environ.get("DELTAFIN_BIN", str(REPO / "deltafin"))
RANKS = 60000

# The pattern of tokenization_kimi.py (Kimi K2 and K3 ship the same one), branch by branch.
KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

# Kimi K3's named specials, as offsets from the number of ranks (163584 in the real file:
# [BOS] 163584, [EOS] 163585, <|end_of_msg|> 163586, <|open|> 163587, <|close|> 163588, <|sep|> 163589).
K3_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
               18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
               254: "[UNK]", 255: "[PAD]"}

SLICE, RUN = 400_000, 25_000


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    d = tmp_path_factory.mktemp("kimi-k3-tok")
    return d, build_kimi_dir(d)


def build_kimi_dir(d):
    """Writes tiktoken.model + tokenizer_config.json (K3 specials) into d; returns the tiktoken.Encoding
    that tokenization_kimi.py would build from them."""
    import tiktoken
    import tiktoken.load
    ranks = tiktoken.load.load_tiktoken_bpe(str(FIX / "o200k" / "o200k_base.tiktoken"))
    ranks = {k: v for k, v in ranks.items() if v < RANKS}
    with open(d / "tiktoken.model", "w") as f:
        for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(tok).decode()} {r}\n")
    dec = {str(RANKS + off): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": True} for off, name in K3_SPECIALS.items()}
    cfg = {"added_tokens_decoder": dec, "bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]",
           "pad_token": "[PAD]", "tokenizer_class": "TikTokenTokenizer"}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    specials = {K3_SPECIALS.get(i - RANKS, f"<|reserved_token_{i}|>"): i for i in range(RANKS, RANKS + 256)}
    return tiktoken.Encoding("kimi_test", pat_str=KIMI_PAT, mergeable_ranks=ranks, special_tokens=specials)


def pieces(text):
    """The pieces tokenization_kimi.py hands to tiktoken one by one (its slicing guards, restated)."""
    out = []
    for a in range(0, len(text), SLICE):
        s = text[a:a + SLICE]
        start, run, space = 0, 0, (s[0].isspace() if s else False)
        for i, ch in enumerate(s):
            sp = ch.isspace()
            if sp != space:
                run, space = 1, sp
            else:
                run += 1
                if run > RUN:
                    out.append(s[start:i])
                    start, run = i, 1
        out.append(s[start:])
    return out


def vendor_encode(enc, text, allow_special):
    ids = []
    for p in pieces(text):
        ids += enc.encode(p, allowed_special="all") if allow_special else enc.encode(p, disallowed_special=())
    return ids


def run(args, data, env=None):
    return subprocess.run([BIN] + args, input=data, capture_output=True, timeout=300, env={**os.environ, **(env or {})})


def tok_jsonl(d, docs, extra=(), env=None):
    r = run(["tokenize", "--tokenizer", str(d), "--jsonl", *extra], "".join(json.dumps(x) + "\n" for x in docs).encode(), env)
    assert r.returncode == 0, r.stderr.decode()
    return [json.loads(x) for x in r.stdout.decode().splitlines()]


def tok_raw(d, data, extra=()):
    r = run(["tokenize", "--tokenizer", str(d), *extra], data)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def detok(d, ids):
    r = run(["detokenize", "--tokenizer", str(d)], json.dumps(ids).encode())
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


CJK = [
    "我们的目标是星辰大海。人工智能正在改变世界，机器学习很重要！",
    "日本語の文章です。カタカナとひらがな、そして漢字。ｶﾀｶﾅ。東京タワーは333メートル。",
    "한국어는 아름다운 언어입니다. 안녕하세요! 漢字와 한글을 섞어 씁니다.",
    "Hello世界abc", "中文English混合", "ABC中DEF", "é中", "'s中", "中's", "中\u0301字", "中123文", "𠀀𠀁𪚥 豈更",
    "Kimi模型K3版本v2.0发布", "iPhone手机和MacBook电脑", "「引用」『書名』〈注〉", "中 文 之 间 有 空 格",
    "\u3007\u3021\u3038 〆々", "ＡＢＣ全角ａｂｃ１２３", "水\n\n火\r\n土", "𝓗𝓮𝓵𝓵𝓸中", "Ⅻ章第3节",
]
CODE_MIX = [
    "def f(x):\n    return x  # 返回\n", "if (a&&b) { c = a || b; }", "I'm sure they'll've DON'T", "it's 中's",
    "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>", "<|im_end|> [BOS] [EOS] <|sep",
    "😀😃 👨‍👩‍👧 🇨🇳", "  \t\n\n   x   \n", "123456789 ١٢٣ １２３", "\u00a0\u3000\u2028x\u0085",
]


def test_parity_corpus(kimi):
    d, enc = kimi
    docs = gen_corpus(seed=77, n_docs=300) + CJK + CODE_MIX
    want = [vendor_encode(enc, x, False) for x in docs]
    got = tok_jsonl(d, docs)
    bad = [(x, g, w) for x, g, w in zip(docs, got, want) if g != w]
    assert not bad, f"{len(bad)} differ; first: {bad[0]}"
    want_sp = [vendor_encode(enc, x, True) for x in docs]
    assert tok_jsonl(d, docs, ["--allow-special"]) == want_sp
    # the specials really were matched somewhere (and not without --allow-special)
    assert any(RANKS + 3 in w for w in want_sp) and not any(RANKS + 3 in w for w in want)
    # the PCRE2 translation of the pattern (no hand-written scanner) agrees too
    assert tok_jsonl(d, docs, env={"DF_TOK_NO_FAST": "1"}) == want


def test_han_is_the_script_property(kimi):
    """\\p{Han} is Script=Han in tiktoken's regex, not Script_Extensions (PCRE2's reading since 10.40):
    CJK punctuation such as U+3002 is Common and joins a following newline; ideographs run together."""
    d, enc = kimi
    import unicodedata
    cps = [c for r in ((0x2E80, 0x3400), (0xF900, 0xFB00), (0xFE30, 0xFE50), (0xFF00, 0xFFF0), (0x4E00, 0x4E40),
                       (0x20000, 0x20010)) for c in range(*r) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    docs = ["".join(chr(c) + sep for c in cps[i:i + 40]) for sep in ("", "\n", "a", " ", "中")
            for i in range(0, len(cps), 40)]
    want = [vendor_encode(enc, x, False) for x in docs]
    assert tok_jsonl(d, docs) == want
    assert tok_jsonl(d, docs, env={"DF_TOK_NO_FAST": "1"}) == want


def test_k3_special_ids(kimi):
    d, _ = kimi
    text = "[BOS][EOS]<|end_of_msg|><|open|><|close|><|sep|><|media_pad|>[UNK][PAD]<|reserved_token_%d|>" % (RANKS + 7)
    assert tok_raw(d, text.encode(), ["--allow-special"]) == [RANKS + i for i in (0, 1, 2, 3, 4, 5, 21, 254, 255, 7)]


def long_inputs():
    rng = random.Random(5)
    words = ["alpha", "中文", "beta", "日本語", "x", "123", "'s", ".,;", "ÄÖÜ"]
    mixed = " ".join(rng.choice(words) for _ in range(90_000))  # > 400k characters: slice borders in words
    return {
        "letters_30k": "a" * 30_000,
        "han_60k": "中文字" * 20_000,  # one Han run, cut every 25,000 characters
        "spaces_30k": "x" + " " * 30_000 + "y",
        "newlines_26k": "\n" * 26_000 + "z",
        "exact_25k": "b" * 25_000 + " " + "c" * 25_001,
        "digits_27k": "1234567" * 4_000,
        "mixed_slices": mixed,
        "special_across_slice": "w" * 399_996 + " <|open|> tail" + "q" * 10,
        "alternating_slice_border": ("ab " * 140_000)[: SLICE + 7],
        "cjk_punct_run": "。、" * 13_000,
    }


@pytest.mark.parametrize("name", list(long_inputs()))
def test_slicing_guards(kimi, name):
    d, enc = kimi
    text = long_inputs()[name]
    want = vendor_encode(enc, text, True)
    got = tok_raw(d, text.encode(), ["--allow-special"])
    assert got == want, f"{name}: first difference at {next(i for i, (a, b) in enumerate(zip(got + [-1], want + [-2])) if a != b)}"
    assert detok(d, got) == text.encode()


def test_slicing_changes_ids(kimi):
    """The guard cases are real tests: without the cuts the ids would differ."""
    _, enc = kimi
    changed = [n for n, t in long_inputs().items() if enc.encode(t, allowed_special="all") != vendor_encode(enc, t, True)]
    assert {"han_60k", "spaces_30k", "exact_25k", "special_across_slice", "alternating_slice_border"} <= set(changed), changed


def test_parallel_equals_serial_long(kimi):
    d, enc = kimi
    text = long_inputs()["mixed_slices"] * 2 + "\n" + "文" * 30_000
    want = vendor_encode(enc, text, False)
    assert tok_raw(d, text.encode(), ["--threads", "1"]) == want
    assert tok_raw(d, text.encode(), ["--threads", "4"]) == want


def test_decode_roundtrip(kimi):
    d, enc = kimi
    docs = CJK + CODE_MIX
    for x in docs:
        ids = vendor_encode(enc, x, True)
        assert detok(d, ids) == enc.decode_bytes(ids) == x.encode()
    # invalid UTF-8 round-trips byte for byte
    raw = b"\xff\xfe a \xe4\xb8 \xc3(" + "中".encode() * 3
    assert detok(d, tok_raw(d, raw)) == raw
