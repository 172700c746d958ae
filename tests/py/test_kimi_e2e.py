"""Kimi K3 end to end (issue 12): the tiny K3 checkpoint (tests/data/models/kimi-k3-tiny: KDA + MLA layers,
attention residuals, latent MoE) with a K3-style tokenizer of its own (256 byte ranks, K3's structural
specials after them, tokenizer_config.json without a chat template, as K3 ships) through `deltafin run` and
`deltafin serve` with the official openai client. The weights are random, so the text is noise; what is
checked is the wiring and the state handling of a recurrent model:
  - `run` renders K3's chat format and generates, `--stats` reports the recurrent state;
  - in `serve`, a second request that extends the first reuses the state (usage cached_tokens > 0, restored
    from the snapshot taken at the end of the first prompt) and answers exactly as a fresh server does;
  - a request that diverges inside the first prompt is answered exactly as a fresh server does too (the
    KDA state cannot be truncated: it restarts or restores an earlier snapshot, never cuts)."""
import json
import shutil

import pytest

from conftest import MODELS
from test_server import Server

openai = pytest.importorskip("openai")
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
SPECIALS = ["[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"]


@pytest.fixture(scope="module")
def k3_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("k3") / "kimi-k3-tiny-chat"
    shutil.copytree(MODELS / "kimi-k3-tiny", d)
    with open(d / "tiktoken.model", "w") as f:
        for b in range(256):
            f.write(f"{B64[b >> 2]}{B64[(b & 3) << 4]}== {b}\n")
    dec = {str(256 + i): {"content": s, "special": True} for i, s in enumerate(SPECIALS)}
    (d / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": dec, "bos_token": "[BOS]",
                                                         "eos_token": "<|end_of_msg|>"}))
    cfg = json.loads((d / "config.json").read_text())
    for o in (cfg, cfg["text_config"]):
        o["bos_token_id"], o["eos_token_id"] = 256, 258
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def test_run_chat_and_stats(dfbin, k3_dir):
    import subprocess
    p = subprocess.run([dfbin, "run", "--model", str(k3_dir), "--prompt", "Hello K3", "--max-new", "8", "--stats"],
                       capture_output=True, text=True, errors="replace", timeout=300)
    assert p.returncode == 0, p.stderr
    # from config.json: MLA layers keep latent + rope floats per token; KDA layers keep 3 conv windows of
    # (width - 1) x heads*dim floats and heads x dim x dim matrix state, whatever the position
    t = json.loads((k3_dir / "config.json").read_text())["text_config"]
    la = t["linear_attn_config"]
    per_tok = len(la["full_attn_layers"]) * (t["kv_lora_rank"] + t["qk_rope_head_dim"]) * 4
    C, d = la["num_heads"] * la["head_dim"], la["head_dim"]
    fixed = len(la["kda_layers"]) * (3 * (la["short_conv_kernel_size"] - 1) * C + la["num_heads"] * d * d) * 4
    assert f"session state {per_tok} B per token + {fixed} B fixed" in p.stderr, p.stderr
    r = subprocess.run([dfbin, "chat-template", "--tokenizer", str(k3_dir), "--messages", "-"], input=json.dumps(
        [{"role": "user", "content": "Hello K3"}]), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "<|open|>" in r.stdout and "Hello K3" in r.stdout, r.stdout + r.stderr


def ask(client, messages, n=12):
    """The answer's text (K3's generation prompt opens its think part, so the
    output is reasoning until the model closes it: both are compared), the
    prompt tokens and the cached ones."""
    r = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=n, temperature=0)
    m = r.choices[0].message
    text = (m.model_extra.get("reasoning_content") or "") + "\x00" + (m.content or "")
    return text, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens


def test_serve_reuses_recurrent_state_exactly(k3_dir, tmp_path):
    first = [{"role": "user", "content": "The first question, long enough to be worth keeping."}]
    a = Server(str(k3_dir), str(tmp_path / "a.log"), "--ctx", "1024")
    try:
        c = a.client()
        text1, _, cached1 = ask(c, first)
        assert cached1 == 0
        r1, c1 = text1.split("\x00")
        assert r1 or c1
        second = first + [{"role": "assistant", "content": c1, "reasoning_content": r1},
                          {"role": "user", "content": "And a follow-up."}]
        text2, n2, cached2 = ask(c, second)
        assert 0 < cached2 < n2, (cached2, n2)
        diverged = [{"role": "user", "content": "The first question, but another ending."}]
        text3, _, _ = ask(c, diverged)
    finally:
        a.stop()
    for msgs, want in ((second, text2), (diverged, text3)):
        b = Server(str(k3_dir), str(tmp_path / "b.log"), "--ctx", "1024")
        try:
            got, _, cached = ask(b.client(), msgs)
        finally:
            b.stop()
        assert cached == 0
        assert got == want


def test_serve_k3_tools_and_reasoning_options(k3_dir, tmp_path):
    """K3 through serve (issue 14): tools and past reasoning reach its renderer, thinking and
    reasoning_effort map onto its options; the output starts in the think part (reasoning_content)."""
    from test_server import raw
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ask1 = [{"role": "user", "content": "Weather?"}]
    a = Server(str(k3_dir), str(tmp_path / "a.log"), "--ctx", "1024")
    try:
        def post(**kw):
            return raw(a, "POST", "/v1/chat/completions", {"model": "tiny-chat", "messages": ask1, "max_tokens": 4, **kw})
        st, _, plain = post()
        assert st == 200, plain
        assert plain["choices"][0]["message"]["content"] is None or plain["choices"][0]["message"]["content"] == ""
        assert plain["choices"][0]["message"].get("reasoning_content")
        st, _, withtools = post(tools=[tool])
        assert st == 200, withtools
        assert withtools["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 10
        st, _, low = post(reasoning_effort="high")  # the note says "high" instead of "max"
        assert st == 200, low
        assert low["usage"]["prompt_tokens"] != plain["usage"]["prompt_tokens"]
        st, _, bad = post(reasoning_effort="medium")
        assert st == 400 and bad["error"]["param"] == "reasoning_effort", bad
        st, _, off = post(chat_template_kwargs={"thinking": False})
        assert st == 200, off
        assert not off["choices"][0]["message"].get("reasoning_content")  # the prompt opens the response part
        st, _, bad = post(chat_template_kwargs={"enable_thinking": False})
        assert st == 400 and bad["error"]["param"] == "chat_template_kwargs.enable_thinking", bad
        hist = ask1 + [{"role": "assistant", "content": None, "reasoning_content": "Think.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
        st, _, h = raw(a, "POST", "/v1/chat/completions", {"model": "tiny-chat", "messages": hist, "tools": [tool],
                                                            "max_tokens": 4})
        assert st == 200, h
    finally:
        a.stop()
