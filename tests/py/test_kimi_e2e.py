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
    r = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=n, temperature=0)
    return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens


def test_serve_reuses_recurrent_state_exactly(k3_dir, tmp_path):
    first = [{"role": "user", "content": "The first question, long enough to be worth keeping."}]
    a = Server(str(k3_dir), str(tmp_path / "a.log"), "--ctx", "1024")
    try:
        c = a.client()
        text1, _, cached1 = ask(c, first)
        assert cached1 == 0
        second = first + [{"role": "assistant", "content": text1}, {"role": "user", "content": "And a follow-up."}]
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
