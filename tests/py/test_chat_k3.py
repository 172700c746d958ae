"""Kimi K3's chat format (src/tok/kimi_k3_chat.c, through `deltafin chat-template` on a directory whose
config.json says model_type kimi_k3) against the goldens in tests/data/chat/k3: the rendered prompt byte for
byte, its segments (structure vs text) one for one, and the token ids: every segment encoded alone by
`tiktoken` as the vendor tokenizer's _encode_chat_segments does (structure with special tokens, text
without), with the Kimi pattern and a rank file of our own (tests/py/test_tokenizer_kimi.py).
tests/data/chat/k3/PROVENANCE.md says where the goldens come from."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from test_tokenizer_kimi import RANKS, build_kimi_dir, vendor_encode

REPO = Path(__file__).resolve().parents[2]
GOLD = REPO / "tests" / "data" / "chat" / "k3"
BIN = os.environ.get("DELTAFIN_BIN", str(REPO / "deltafin"))
CASES = sorted(p.stem for p in GOLD.glob("*.json"))


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    d = tmp_path_factory.mktemp("kimi-k3")
    enc = build_kimi_dir(d)
    (d / "config.json").write_text(json.dumps({"model_type": "kimi_k3", "eos_token_id": RANKS + 2}))
    return d, enc


def chat(d, tmp, messages, tools=None, add_gen=True, options=None, extra=()):
    mp = tmp / "messages.json"
    mp.write_text(json.dumps(messages, ensure_ascii=False))
    args = [BIN, "chat-template", "--tokenizer", str(d), "--messages", str(mp), *extra]
    if tools is not None:
        tp = tmp / "tools.json"
        tp.write_text(json.dumps(tools, ensure_ascii=False))
        args += ["--tools", str(tp)]
    if add_gen:
        args.append("--add-generation-prompt")
    for k, v in (options or {}).items():
        args += ["--var", f"{k}={json.dumps(v)}"]
    return subprocess.run(args, capture_output=True, timeout=60)


def test_enough_goldens():
    assert len(CASES) >= 15


@pytest.mark.parametrize("name", CASES)
def test_golden(k3, tmp_path, name):
    d, enc = k3
    g = json.loads((GOLD / f"{name}.json").read_text())
    kw = dict(tools=g["tools"], add_gen=g["add_generation_prompt"], options=g["options"])
    r = chat(d, tmp_path, g["messages"], **kw)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode() == g["rendered"]
    r = chat(d, tmp_path, g["messages"], **kw, extra=["--segments"])
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout) == g["segments"]
    r = chat(d, tmp_path, g["messages"], **kw, extra=["--ids"])
    assert r.returncode == 0, r.stderr.decode()
    want = [i for text, special in g["segments"] for i in vendor_encode(enc, text, special)]
    assert json.loads(r.stdout) == want


def test_segments_change_ids(k3):
    """Encoding each segment alone is not the same as encoding the text once: the check above can fail."""
    _, enc = k3
    differ = []
    for name in CASES:
        g = json.loads((GOLD / f"{name}.json").read_text())
        per_segment = [i for text, special in g["segments"] for i in vendor_encode(enc, text, special)]
        if per_segment != vendor_encode(enc, g["rendered"], True):
            differ.append(name)
    # attribute values starting or ending with punctuation ('="' + '@type', '&quot;' + '"') and user text
    # holding special-token text
    assert {"tool_calls_typed_arguments", "unicode_and_escaping", "control_markers_in_user_text"} <= set(differ), differ


def test_user_text_cannot_forge_structure(k3, tmp_path):
    d, _ = k3
    g = json.loads((GOLD / "control_markers_in_user_text.json").read_text())
    ids = json.loads(chat(d, tmp_path, g["messages"], options=g["options"], extra=["--ids"]).stdout)
    structural = sum(1 for text, special in g["segments"] if special and text == "<|open|>")
    assert ids.count(RANKS + 3) == structural  # <|open|> in the user's text stayed text


def test_long_text_segments_use_slicing(k3, tmp_path):
    d, enc = k3
    msgs = [{"role": "user", "content": "中文字" * 10_000 + " " * 26_000 + "x" * 30_000}]
    r = chat(d, tmp_path, msgs, extra=["--segments"])
    segs = json.loads(r.stdout)
    ids = json.loads(chat(d, tmp_path, msgs, extra=["--ids"]).stdout)
    assert ids == [i for text, special in segs for i in vendor_encode(enc, text, special)]


@pytest.mark.parametrize("messages,options,needle", [
    ([{"role": "user", "content": "hi"}], {"thinking_effort": "medium"}, "--var: thinking_effort: unsupported value 'medium'"),
    ([{"role": "tool", "content": "r"}], {}, "messages[0]: a Kimi K3 tool message needs a resolvable tool name"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}]}], {},
     "messages[0].tool_calls[0].arguments: Kimi K3 tool call arguments must be a JSON object"),
    ([{"role": "user", "content": 5.5}], {}, "messages[0].content: expected a string, a list of parts or null"),
    ([{"content": "x"}], {}, "messages[0].role: missing"),
    ([{"role": "user", "content": "x", "name": {"a": 1}}], {}, "messages[0]: the name attribute must be"),
    ({"role": "user"}, {}, "messages: expected an array"),
])
def test_errors(k3, tmp_path, messages, options, needle):
    d, _ = k3
    r = chat(d, tmp_path, messages, options=options)
    assert r.returncode == 2 and r.stdout == b""
    err = r.stderr.decode()
    assert needle in err and err.count("\n") == 1, err


def test_thinking_effort_options(k3, tmp_path):
    d, _ = k3
    m = [{"role": "user", "content": "hi"}]
    default = chat(d, tmp_path, m).stdout.decode()
    assert "`thinking_effort=max`" in default  # the vendor apply_chat_template's default
    assert "thinking_effort" not in chat(d, tmp_path, m, options={"thinking_effort": None}).stdout.decode()
    off = chat(d, tmp_path, m, options={"thinking": False, "thinking_effort": "medium"})  # not checked when off
    assert off.returncode == 0 and off.stdout.decode().endswith("<|open|>response<|sep|>")


# ---------------------------------------------------------------- Kimi K2 / K2 Thinking: their Jinja templates

from test_chat_template import CONVS, TOOL_HISTORIES, TOOLS, check, template_dir  # noqa: E402

K2_TEMPLATES = REPO / "tests" / "data" / "tokenizers" / "kimi-k2"  # PROVENANCE.md there
K2_SPECIAL = {"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]"}
K2_CONVS = {
    **CONVS,
    **TOOL_HISTORIES,  # content null next to tool_calls (issue 14)
    "k2_native_ids": [
        {"role": "system", "content": "You are Kimi."},
        {"role": "user", "content": "Weather in 北京 and Paris?", "name": "alice"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Two calls.", "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"北京\"}"}},
            {"id": "functions.get_weather:1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "晴 25°C"},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "rain\n12°C"},
        {"role": "assistant", "content": "北京 is sunny; Paris rainy.", "reasoning_content": "Summarize both."},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call again.", "tool_calls": [
            {"id": "functions.get_weather:2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:2", "content": ""},
    ],
    "k2_content_parts": [
        {"role": "user", "content": [{"type": "text", "text": "What is in "}, {"type": "image_url", "image_url": {"url": "u"}},
                                     {"type": "text", "text": " this picture?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}], "name": "kimi"},
    ],
}


@pytest.fixture(scope="module")
def k2_dirs(tmp_path_factory):
    out = {}
    for p in sorted(K2_TEMPLATES.glob("*.jinja")):
        src = p.read_bytes().decode("utf-8")
        out[p.stem] = (template_dir(tmp_path_factory, p.stem, src, K2_SPECIAL), src)
    assert set(out) == {"kimi-k2-instruct", "kimi-k2-thinking"}
    return out


@pytest.mark.parametrize("name", ["kimi-k2-instruct", "kimi-k2-thinking"])
@pytest.mark.parametrize("conv", sorted(K2_CONVS))
def test_kimi_k2_templates(k2_dirs, name, conv):
    d, src = k2_dirs[name]
    for tools in (None, TOOLS):
        for agp in (False, True):
            check(d, src, K2_SPECIAL, K2_CONVS[conv], tools=tools, agp=agp)
