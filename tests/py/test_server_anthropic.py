"""test_server_anthropic.py - the Anthropic Messages API of `deltafin serve`
(POST /v1/messages, /v1/messages/count_tokens) driven by the official
`anthropic` client, with the official `openai` client as the reference: the
same conversation must give the same greedy answer, token for token, on
both routes (both go through the same chat template, queue and generation).

The model is the tiny random-weight Qwen3 with the real Qwen3 tokenizer
(make_tiny_chat_model.py): its text is random, so what is checked is the
protocol, the equality with the OpenAI route, and the refusal rules.

Servers, each started once per session:
  main    --max-request-bytes 1MiB --ctx 2048 --max-tokens 1024
  queue0  --queue 0 (a second concurrent generation gets 529)
  keyed   --api-key sekret
"""
import json
import os
import socket
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_chat_model  # noqa: E402
from test_server import MODEL_ID, Server, raw  # noqa: E402

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

SYSTEM = "You are terse."
CONV = [{"role": "user", "content": "Say something about the sea."},
        {"role": "assistant", "content": "It is wide."},
        {"role": "user", "content": "And the sky?"}]
OAI_CONV = [{"role": "system", "content": SYSTEM}] + CONV


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-chat-anth")))


@pytest.fixture(scope="session")
def srv(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "anth-main.log"),
               "--max-request-bytes", "1MiB", "--ctx", "2048", "--max-tokens", "1024")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def srv_q0(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "anth-q0.log"), "--queue", "0")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def srv_key(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "anth-key.log"), "--api-key", "sekret")
    yield s
    s.stop()


def aclient(s, **kw):
    kw.setdefault("api_key", "unused")
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 60)
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{s.port}", **kw)


@pytest.fixture(scope="session")
def ac(srv):
    return aclient(srv)


@pytest.fixture(scope="session")
def oc(srv):
    return srv.client()


SAMPLING = ("temperature", "top_p", "top_k")  # no longer typed parameters of the SDK: sent as extra_body


def msg(ac, **kw):
    extra = {k: kw.pop(k) for k in SAMPLING if k in kw}
    if extra:
        kw["extra_body"] = {**kw.get("extra_body", {}), **extra}
    kw.setdefault("model", MODEL_ID)
    kw.setdefault("max_tokens", 16)
    kw.setdefault("messages", CONV)
    return ac.messages.create(**kw)


def text_of(m):
    assert [b.type for b in m.content] == ["text"], m
    return m.content[0].text


def assert_anth_error(body, etype, field=None):
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == etype, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if field is not None:
        assert body["error"]["message"].startswith(field + ":"), body


def sse_events(data):
    """[(event, data dict)] of an SSE body with event: lines."""
    out = []
    for block in data.decode().strip().split("\n\n"):
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


# ---- answers equal the OpenAI route's ----------------------------------------

@pytest.mark.parametrize("n", [1, 5, 24])
def test_messages_equal_openai_greedy(ac, oc, n):
    ref = oc.chat.completions.create(model=MODEL_ID, messages=OAI_CONV, max_tokens=n, temperature=0)
    m = msg(ac, system=SYSTEM, max_tokens=n, temperature=0)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL_ID
    assert m.id.startswith("msg_")
    assert text_of(m) == ref.choices[0].message.content
    assert m.usage.output_tokens == ref.usage.completion_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    want = {"length": "max_tokens", "stop": "end_turn"}[ref.choices[0].finish_reason]
    assert m.stop_reason == want and m.stop_sequence is None


def test_system_as_text_blocks_and_merged_turns(ac, oc):
    """system as text blocks, content as text blocks, and two consecutive user
    turns: one turn, the texts joined with "\\n" (as OpenAI text parts)."""
    ref = oc.chat.completions.create(
        model=MODEL_ID, max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": "Be brief.\nBe kind."},
                  {"role": "user", "content": "Hello.\nTell me a story."}])
    m = msg(ac, max_tokens=12, temperature=0,
            system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": "Hello."},
                      {"role": "user", "content": [{"type": "text", "text": "Tell me a story."}]}])
    assert text_of(m) == ref.choices[0].message.content


def test_prefix_reuse_reported(ac):
    msg(ac, system=SYSTEM, max_tokens=2, metadata={"user_id": "u1"}, cache_control={"type": "ephemeral"})
    m = msg(ac, system=SYSTEM, max_tokens=3, metadata={"user_id": "u2"})
    assert m.usage.cache_read_input_tokens > 0
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == ac.messages.count_tokens(
        model=MODEL_ID, system=SYSTEM, messages=CONV).input_tokens


def test_streaming_equals_openai(ac, oc):
    ref = oc.chat.completions.create(model=MODEL_ID, messages=OAI_CONV, max_tokens=20, temperature=0)
    with ac.messages.stream(model=MODEL_ID, max_tokens=20, system=SYSTEM, messages=CONV,
                            extra_body={"temperature": 0}) as st:
        pieces = list(st.text_stream)
        final = st.get_final_message()
    assert "".join(pieces) == ref.choices[0].message.content
    assert text_of(final) == ref.choices[0].message.content
    assert final.usage.output_tokens == ref.usage.completion_tokens
    assert final.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[ref.choices[0].finish_reason]


def test_sse_wire_format(srv):
    c = srv.conn()
    c.request("POST", "/v1/messages", body=json.dumps(
        {"model": MODEL_ID, "max_tokens": 6, "messages": CONV, "stream": True}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    ev = sse_events(r.read())
    c.close()
    names = [e for e, _ in ev]
    assert names[:3] == ["message_start", "content_block_start", "ping"], names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert set(names[3:-3]) <= {"content_block_delta"} and len(names) > 6, names
    for e, d in ev:
        assert d["type"] == e
    start = ev[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert all(d["delta"]["type"] == "text_delta" and d["index"] == 0 for e, d in ev if e == "content_block_delta")
    md = ev[-2][1]
    assert md["delta"]["stop_reason"] == "max_tokens" and md["usage"]["output_tokens"] == 6


# ---- stop sequences, max_tokens, sampling options -----------------------------

def test_stop_sequences(ac):
    ref = text_of(msg(ac, max_tokens=24))
    assert len(ref) >= 6, repr(ref)
    stop = ref[len(ref) // 2: len(ref) // 2 + 2]
    want = ref[:ref.index(stop)]
    for seqs in ([stop], ["\u2603never", stop], ["\u2603never", stop]):  # the last: from the memo
        m = msg(ac, max_tokens=24, stop_sequences=seqs)
        assert text_of(m) == want
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    with ac.messages.stream(model=MODEL_ID, max_tokens=24, messages=CONV, stop_sequences=["\u2603never", stop]) as st:
        got = "".join(st.text_stream)
        final = st.get_final_message()
    assert got == want
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    # a stop sequence that never occurs: the generation ends on max_tokens
    m = msg(ac, max_tokens=24, stop_sequences=["\u2603never"])
    assert text_of(m) == ref and m.stop_reason == "max_tokens" and m.stop_sequence is None


def test_max_tokens_stop_reason(ac):
    m = msg(ac, max_tokens=3)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_top_k_one_is_greedy(ac):
    """top_k is honoured: at temperature 1, top_k 1 leaves only the most likely
    token, so the answer is the greedy one (plain sampling would differ)."""
    greedy = text_of(msg(ac, max_tokens=24, temperature=0))
    for _ in range(2):
        assert text_of(msg(ac, max_tokens=24, temperature=1.0, top_k=1)) == greedy
    m = msg(ac, max_tokens=4, temperature=0.8, top_p=0.9, top_k=40)
    assert m.usage.output_tokens >= 1


# ---- count_tokens -------------------------------------------------------------

def test_count_tokens_equals_openai_prompt_tokens(ac, oc):
    ref = oc.chat.completions.create(model=MODEL_ID, messages=OAI_CONV, max_tokens=1)
    n = ac.messages.count_tokens(model=MODEL_ID, system=SYSTEM, messages=CONV).input_tokens
    assert n == ref.usage.prompt_tokens
    ref = oc.chat.completions.create(model=MODEL_ID, messages=CONV, max_tokens=1)
    assert ac.messages.count_tokens(model=MODEL_ID, messages=CONV).input_tokens == ref.usage.prompt_tokens


def test_count_tokens_refusals(srv):
    st, _, b = raw(srv, "POST", "/v1/messages/count_tokens", {"model": MODEL_ID, "messages": CONV, "max_tokens": 5})
    assert st == 400
    assert_anth_error(b, "invalid_request_error", "max_tokens")
    # tools are rendered by the template, so they count
    st, _, a = raw(srv, "POST", "/v1/messages/count_tokens", {"model": MODEL_ID, "messages": CONV})
    st2, _, b = raw(srv, "POST", "/v1/messages/count_tokens", {"model": MODEL_ID, "messages": CONV,
                                                                "tools": [{"name": "f", "input_schema": {"type": "object"}}]})
    assert st == 200 and st2 == 200, (a, b)
    assert b["input_tokens"] > a["input_tokens"] + 20
    st, _, b = raw(srv, "POST", "/v1/messages/count_tokens", {"model": MODEL_ID, "messages": CONV,
                                                               "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                                                               "tool_choice": {"type": "any"}})
    assert st == 200, b  # tool_choice any is enforced by constrained decoding; counting is unaffected
    st, _, b = raw(srv, "POST", "/v1/messages/count_tokens", {"model": MODEL_ID, "messages": CONV,
                                                               "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                                                               "tool_choice": {"type": "tool", "name": "nope"}})
    assert st == 400
    assert_anth_error(b, "invalid_request_error", "tool_choice")


# ---- refusals in Anthropic's shape --------------------------------------------

TOOL = {"name": "get_weather", "description": "w", "input_schema": {"type": "object", "properties": {}}}


@pytest.mark.parametrize("kw,field", [
    # tools, tool_choice auto/none, thinking and tool_use / tool_result / thinking blocks are accepted
    # (test_server_anthropic_tools.py); what cannot be honoured is refused
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}],
      "tool_choice": {"type": "any"}}, "tools.0.input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking.budget_tokens"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
                   {"role": "user", "content": "go"}]}, "messages.1.content.0.type"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
                   {"role": "user", "content": "go"}]}, "messages.1.content.0.type"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]},
     "messages.0.content.0.type"),
    # tools, tool_choice auto/none, thinking and tool_use / tool_result / thinking blocks are accepted
    # (test_server_anthropic_tools.py); what cannot be honoured is refused
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}],
      "tool_choice": {"type": "any"}}, "tools.0.input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking.budget_tokens"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
                   {"role": "user", "content": "go"}]}, "messages.1.content.0.type"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
                   {"role": "user", "content": "go"}]}, "messages.1.content.0.type"),    ({"messages": [{"role": "system", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages.0.name"),
    ({"messages": []}, "messages"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"stop_sequences": [""]}, "stop_sequences.0"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5000}, "max_tokens"),
    ({"metadata": {"user_id": "u", "other": 1}}, "metadata.other"),
    ({"extra_body": {"service_tier": "auto"}}, "service_tier"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
])
def test_refusals_through_sdk(ac, kw, field):
    with pytest.raises(anthropic.BadRequestError) as ei:
        msg(ac, **kw)
    assert ei.value.status_code == 400
    assert_anth_error(ei.value.body, "invalid_request_error", field)


def test_missing_max_tokens(ac, srv):
    with pytest.raises(anthropic.BadRequestError) as ei:
        ac.messages.create(model=MODEL_ID, messages=CONV, max_tokens=anthropic.NOT_GIVEN)
    assert_anth_error(ei.value.body, "invalid_request_error", "max_tokens")
    for body, field in [({"model": MODEL_ID, "messages": CONV}, "max_tokens"),
                        ({"max_tokens": 5, "messages": CONV}, "model"),
                        ({"model": MODEL_ID, "max_tokens": 5}, "messages")]:
        st, _, b = raw(srv, "POST", "/v1/messages", body)
        assert st == 400
        assert_anth_error(b, "invalid_request_error", field)


@pytest.mark.parametrize("patch,field", [
    ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}, "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]}, "messages.0.content.0.x"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages.0.content.0.type"),
    ({"messages": [{"content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": 1, "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"messages": ["hi"]}, "messages.0"),
    ({"messages": {"role": "user"}}, "messages"),
    ({"system": 3}, "system"),
    ({"system": [{"type": "image"}]}, "system.0.type"),
    ({"stop_sequences": "x"}, "stop_sequences"),
    ({"stop_sequences": [1]}, "stop_sequences.0"),
    ({"stream": "yes"}, "stream"),
    ({"metadata": []}, "metadata"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"top_k": 1.5}, "top_k"),
    ({"top_p": "1"}, "top_p"),
    ({"model": 3}, "model"),
    ({"tools": {}}, "tools"),
])
def test_wrong_types_raw(srv, patch, field):
    body = {"model": MODEL_ID, "max_tokens": 4, "messages": CONV}
    body.update(patch)
    st, _, b = raw(srv, "POST", "/v1/messages", body)
    assert st == 400, b
    assert_anth_error(b, "invalid_request_error", field)


def test_wrong_model_and_malformed_json(ac, srv):
    with pytest.raises(anthropic.NotFoundError) as ei:
        msg(ac, model="claude-nope")
    assert_anth_error(ei.value.body, "not_found_error", "model")
    st, _, b = raw(srv, "POST", "/v1/messages", "{not json")
    assert st == 400
    assert_anth_error(b, "invalid_request_error")
    st, _, b = raw(srv, "POST", "/v1/messages", "[1]")
    assert st == 400
    assert_anth_error(b, "invalid_request_error")


def test_routes_and_methods(srv):
    st, _, b = raw(srv, "GET", "/v1/messages")
    assert st == 405
    assert_anth_error(b, "invalid_request_error")
    st, _, b = raw(srv, "POST", "/v1/messages/batches", {})
    assert st == 404
    assert_anth_error(b, "not_found_error")
    # the OpenAI routes keep their own error shape
    st, _, b = raw(srv, "POST", "/v1/chat/completions", "{not json")
    assert st == 400 and set(b) == {"error"} and "code" in b["error"]


def test_context_length_exceeded(ac):
    with pytest.raises(anthropic.BadRequestError) as ei:
        msg(ac, max_tokens=1024, messages=[{"role": "user", "content": "sea " * 1500}])
    assert_anth_error(ei.value.body, "invalid_request_error", "messages")
    assert "context length" in ei.value.body["error"]["message"]


def test_413_body_too_large(srv):
    st, _, b = raw(srv, "POST", "/v1/messages", {"model": MODEL_ID, "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": "x" * (1 << 20)}]})
    assert st == 413
    assert_anth_error(b, "request_too_large")


# ---- authentication --------------------------------------------------------------

def test_x_api_key_auth(srv_key):
    with pytest.raises(anthropic.AuthenticationError) as ei:
        msg(aclient(srv_key, api_key="wrong"), max_tokens=1)
    assert ei.value.status_code == 401
    assert_anth_error(ei.value.body, "authentication_error")
    st, _, b = raw(srv_key, "POST", "/v1/messages", {"model": MODEL_ID, "max_tokens": 1, "messages": CONV})
    assert st == 401
    assert_anth_error(b, "authentication_error")
    st, _, b = raw(srv_key, "POST", "/v1/messages/count_tokens", {"model": MODEL_ID, "messages": CONV})
    assert st == 401
    assert_anth_error(b, "authentication_error")
    m = msg(aclient(srv_key, api_key="sekret"), max_tokens=2)
    assert m.usage.output_tokens == 2
    # Bearer works on the Anthropic routes, x-api-key on the OpenAI ones
    st, _, b = raw(srv_key, "POST", "/v1/messages/count_tokens", {"model": MODEL_ID, "messages": CONV},
                   headers={"Authorization": "Bearer sekret"})
    assert st == 200 and b["input_tokens"] > 0
    st, _, b = raw(srv_key, "GET", "/v1/models", headers={"x-api-key": "sekret"})
    assert st == 200
    st, _, b = raw(srv_key, "GET", "/v1/models", headers={"x-api-key": "sekreT"})
    assert st == 401 and set(b) == {"error"}


# ---- the queue ----------------------------------------------------------------------

def test_529_when_queue_full(srv_q0):
    c = srv_q0.conn()
    c.request("POST", "/v1/messages", body=json.dumps({"model": MODEL_ID, "max_tokens": 2000, "messages": CONV, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    r.fp.readline()  # the generation is running
    st, hdrs, b = raw(srv_q0, "POST", "/v1/messages", {"model": MODEL_ID, "max_tokens": 2, "messages": CONV})
    assert st == 529 and hdrs.get("Retry-After") == "1"
    assert_anth_error(b, "overloaded_error")
    with pytest.raises(anthropic.OverloadedError):
        msg(aclient(srv_q0), max_tokens=2)
    c.close()  # disconnect: the long generation stops, the engine is free again
    deadline = time.time() + 10
    while True:
        st, _, b = raw(srv_q0, "POST", "/v1/messages", {"model": MODEL_ID, "max_tokens": 2, "messages": CONV})
        if st == 200 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert st == 200, b
    assert b["usage"]["output_tokens"] == 2


# ---- framing (the hostile-client cases on the new routes) ---------------------------

def _raw_exchange(port, data):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(data)
    out = b""
    t0 = time.time()
    while time.time() - t0 < 5:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            return out, True
        out += chunk
    s.close()
    return out, False


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_framing(srv, path):
    body = {"model": MODEL_ID, "messages": CONV}
    if path == "/v1/messages":
        body["max_tokens"] = 1
    body = json.dumps(body).encode()
    head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for extra, data, want in [
        (b"Content-Length: %d\r\nContent-Length: 5\r\n" % len(body), body, 400),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body), 400),
        (b"Transfer-Encoding: gzip\r\n", body, 501),
    ]:
        resp, closed = _raw_exchange(srv.port, head + extra + b"\r\n" + data)
        assert int(resp.split(b" ", 2)[1]) == want, resp[:300]
        assert closed
        assert_anth_error(json.loads(resp.split(b"\r\n\r\n", 1)[1]), "api_error" if want == 501 else "invalid_request_error")
    # chunked alone is fine
    resp, _ = _raw_exchange(srv.port, head + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    assert int(resp.split(b" ", 2)[1]) == 200, resp[:300]
