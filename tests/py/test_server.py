"""test_server.py - `deltafin serve` driven by real clients.

Starts the real binary on free ports with a tiny random-weight Qwen3 that has
the real Qwen3 tokenizer (make_tiny_chat_model.py), and talks to it with the
official `openai` client, http.client (keep-alive, raw bodies) and, when
installed, LangChain's ChatOpenAI. The outputs are random text: what is
checked is the protocol, the refusal rules, and determinism.

Three servers, each started once per session:
  main    --max-request-bytes 1MiB --ctx 2048 --max-tokens 1024
  queue0  --queue 0 (a second concurrent generation gets 429)
  keyed   --api-key sekret
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import deltafin_bin  # noqa: E402
import make_tiny_chat_model  # noqa: E402

openai = pytest.importorskip("openai")

MODEL_ID = "tiny-chat"
USER = [{"role": "user", "content": "Say something about the sea."}]


# ---- servers -----------------------------------------------------------------

class Server:
    def __init__(self, model_dir, log_path, *args):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [deltafin_bin(), "serve", "--model", model_dir, "--port", "0", "--served-model-name", MODEL_ID,
             "--threads", "1", *args],
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("deltafin serve exited: " + open(log_path).read())
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log_path).read())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError("deltafin serve did not start: " + open(log_path).read())
        self.base = f"http://127.0.0.1:{self.port}/v1"

    def client(self, **kw):
        kw.setdefault("api_key", "unused")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 60)
        return openai.OpenAI(base_url=self.base, **kw)

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def stop(self):
        """Stops the server (SIGTERM: a graceful stop) and checks its log for
        sanitizer reports of memory errors or undefined behaviour (under
        `make asan`). Leak reports are left to the reader: the engine's
        per-thread scratch of its one compute thread is freed only by the OS."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        log = open(self.log_path).read()
        assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, log[-4000:]
        assert "stopping" in log, log[-2000:]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-chat")))


@pytest.fixture(scope="session")
def srv(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "main.log"),
               "--max-request-bytes", "1MiB", "--ctx", "2048", "--max-tokens", "1024")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def srv_q0(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "q0.log"), "--queue", "0", "--ctx", "4096")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def srv_key(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "key.log"), "--api-key", "sekret")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(srv):
    return srv.client()


def chat(client, **kw):
    kw.setdefault("model", MODEL_ID)
    kw.setdefault("messages", USER)
    return client.chat.completions.create(**kw)


def raw(srv, method, path, body=None, headers=None):
    """One request on a fresh connection: (status, headers, parsed JSON or text)."""
    c = srv.conn()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, dict(r.getheaders()), json.loads(data)
    except ValueError:
        return r.status, dict(r.getheaders()), data.decode("utf-8", "replace")


def assert_error_shape(body, param=None):
    assert set(body) == {"error"}, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"]
    assert e["code"] is None or isinstance(e["code"], str)
    if param is not None:
        assert e["param"] == param, e


# ---- routes that need no tokenizer ------------------------------------------

def test_health_and_models(srv, client):
    st, _, body = raw(srv, "GET", "/health")
    assert st == 200 and body == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    st, _, body = raw(srv, "GET", "/v1/nope")
    assert st == 404
    assert_error_shape(body)
    st, _, body = raw(srv, "GET", "/v1/chat/completions")
    assert st == 405
    assert_error_shape(body)


# Every refusal rule: (extra request fields, expected param). Each is a 400 in
# the OpenAI error shape with param naming the field.
REFUSALS = [
    ({"foo": 1}, "foo"),
    ({"n": 2}, "n"),
    ({"n": 0}, "n"),
    # tools and tool_choice required / named are accepted (test_server_tools.py, test_server_tool_choice.py);
    # what cannot be honoured is refused
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "format": "email"}}}}}], "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice"),
    ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
    ({"chat_template_kwargs": {"not_a_template_variable": True}}, "chat_template_kwargs.not_a_template_variable"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": {"name": "f"}}, "function_call"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "email"}}}},
     "response_format.json_schema.schema"),
    ({"logit_bias": {"42": 5}}, "logit_bias"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": -1}, "presence_penalty"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": "hi", "foo": 1}]}, "messages[0].foo"),
    ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"bogus": True}}, "stream_options.bogus"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop": [1]}, "stop[0]"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5000}, "max_tokens"),  # over --max-tokens 1024
    ({"max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens"),
    ({"seed": 1.5}, "seed"),
    ({"stream": "yes"}, "stream"),
    ({"logprobs": 1}, "logprobs"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"user": 7}, "user"),
]


@pytest.mark.parametrize("extra,param", REFUSALS, ids=[p + ":" + json.dumps(e)[:40] for e, p in REFUSALS])
def test_refusals_chat(srv, extra, param):
    body = {"model": MODEL_ID, "messages": USER}
    body.update(extra)
    st, _, resp = raw(srv, "POST", "/v1/chat/completions", body)
    assert st == 400, resp
    assert_error_shape(resp, param)
    assert resp["error"]["type"] == "invalid_request_error"


COMPLETION_REFUSALS = [
    ({"best_of": 2}, "best_of"),
    ({"echo": True}, "echo"),
    ({"suffix": "tail"}, "suffix"),
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": [1, 2, 999999999]}, "prompt[2]"),
    ({"logprobs": 6}, "logprobs"),
    ({"messages": USER}, "messages"),
    ({"n": 3}, "n"),
]


@pytest.mark.parametrize("extra,param", COMPLETION_REFUSALS, ids=[p for _, p in COMPLETION_REFUSALS])
def test_refusals_completions(srv, extra, param):
    body = {"model": MODEL_ID, "prompt": "Once upon a time"}
    body.update(extra)
    st, _, resp = raw(srv, "POST", "/v1/completions", body)
    assert st == 400, resp
    assert_error_shape(resp, param)


def test_refusal_through_openai_client(client):
    with pytest.raises(openai.BadRequestError) as ei:
        chat(client, extra_body={"frobnicate": True})
    e = ei.value
    assert e.status_code == 400
    assert e.param == "frobnicate"
    assert "Unrecognized request argument supplied: frobnicate" in e.message
    with pytest.raises(openai.BadRequestError) as ei:
        chat(client, n=2)
    assert ei.value.param == "n"


def test_malformed_json_and_wrong_model(srv):
    for body in ("{not json", "[1, 2]", "", '{"model": "tiny-chat", "messages": [}'):
        st, _, resp = raw(srv, "POST", "/v1/chat/completions", body)
        assert st == 400, (body, resp)
        assert_error_shape(resp)
    st, _, resp = raw(srv, "POST", "/v1/chat/completions", {"model": "gpt-4o", "messages": USER})
    assert st == 404
    assert_error_shape(resp, "model")
    assert resp["error"]["code"] == "model_not_found"
    st, _, resp = raw(srv, "POST", "/v1/chat/completions", {"messages": USER})
    assert st == 400
    assert_error_shape(resp, "model")


def test_413_body_too_large(srv, client):
    big = "x" * (1100 * 1024)
    st, _, resp = raw(srv, "POST", "/v1/chat/completions",
                      {"model": MODEL_ID, "messages": [{"role": "user", "content": big}]})
    assert st == 413
    assert_error_shape(resp)
    with pytest.raises(openai.APIStatusError) as ei:
        chat(client, messages=[{"role": "user", "content": big}])
    assert ei.value.status_code == 413
    # chunked upload (no Content-Length): drained, then refused the same way
    c = srv.conn()
    c.putrequest("POST", "/v1/chat/completions")
    c.putheader("Transfer-Encoding", "chunked")
    c.putheader("Content-Type", "application/json")
    c.endheaders()
    piece = b"x" * 65536
    for _ in range(20):
        c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
    c.send(b"0\r\n\r\n")
    r = c.getresponse()
    assert r.status == 413
    assert_error_shape(json.loads(r.read()))
    c.close()


def test_401_with_api_key(srv_key):
    bad = srv_key.client(api_key="wrong")
    with pytest.raises(openai.AuthenticationError) as ei:
        bad.models.list()
    assert ei.value.status_code == 401
    st, _, resp = raw(srv_key, "GET", "/v1/models")
    assert st == 401
    assert_error_shape(resp)
    assert resp["error"]["code"] == "invalid_api_key"
    st, _, resp = raw(srv_key, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": USER})
    assert st == 401
    assert_error_shape(resp)
    good = srv_key.client(api_key="sekret")
    assert [m.id for m in good.models.list().data] == [MODEL_ID]
    st, _, resp = raw(srv_key, "GET", "/health")  # liveness probes need no key
    assert st == 200


# ---- generation (needs the real tokenizer) -----------------------------------

def test_chat_nonstreaming_shape(srv, client):
    r = chat(client, max_tokens=8)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL_ID
    assert isinstance(r.created, int)
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and c.message.refusal is None
    assert isinstance(c.message.content, str)
    assert c.logprobs is None
    assert c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 8
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    # the raw body carries every required key, with nulls where the spec has them
    st, _, body = raw(srv, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": USER, "max_tokens": 8})
    assert st == 200
    ch = body["choices"][0]
    assert {"index", "message", "logprobs", "finish_reason"} <= set(ch)
    assert {"role", "content", "refusal"} <= set(ch["message"])
    assert ch["message"]["refusal"] is None and ch["logprobs"] is None
    assert {"id", "object", "created", "model", "choices", "usage"} <= set(body)


def test_max_tokens_and_max_completion_tokens(client):
    r = chat(client, max_tokens=5)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    r = chat(client, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_greedy_is_deterministic(client):
    # no temperature: greedy. Different bookkeeping fields defeat the memo, so
    # the engine itself runs twice (the second time from the reused KV prefix).
    a = chat(client, max_tokens=12, user="a")
    b = chat(client, max_tokens=12, user="b", metadata={"run": "2"}, store=False)
    assert a.choices[0].message.content == b.choices[0].message.content
    # byte-identical deterministic request: answered from the memo
    c = chat(client, max_tokens=12, user="a")
    assert c.choices[0].message.content == a.choices[0].message.content
    assert c.usage.prompt_tokens_details.cached_tokens == c.usage.prompt_tokens


def test_seed_reproducibility(client):
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.95, seed=1234)
    a = chat(client, user="x", **kw)
    b = chat(client, user="y", **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens == b.usage.completion_tokens


def test_streaming(client):
    ref = chat(client, max_tokens=10).choices[0].message.content
    chunks = list(chat(client, max_tokens=10, stream=True))
    assert chunks, "no chunks"
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == ref


def test_stream_include_usage(client):
    chunks = list(chat(client, max_tokens=6, stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 6
    assert last.usage.total_tokens == last.usage.prompt_tokens + 6
    assert all(c.usage is None for c in chunks[:-1])


def test_sse_wire_format(srv):
    c = srv.conn()
    c.request("POST", "/v1/chat/completions",
              body=json.dumps({"model": MODEL_ID, "messages": USER, "max_tokens": 4, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    data = r.read().decode()
    c.close()
    events = [e for e in data.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        json.loads(e[6:])


def test_stop_strings(client):
    ref = chat(client, max_tokens=24).choices[0].message.content
    assert len(ref) >= 6, repr(ref)
    stop = ref[len(ref) // 2: len(ref) // 2 + 2]
    want = ref[:ref.index(stop)]
    r = chat(client, max_tokens=24, stop=stop)
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason == "stop"
    r = chat(client, max_tokens=24, stop=["\u2603never", stop])
    assert r.choices[0].message.content == want
    chunks = list(chat(client, max_tokens=24, stop=[stop], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs(client):
    r = chat(client, max_tokens=4, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.content) == r.usage.completion_tokens
    for t in lp.content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6  # greedy picks the top
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token or t.token == "\ufffd" or "\ufffd" in t.token


def test_completions_endpoint(client):
    r = client.completions.create(model=MODEL_ID, prompt="Once upon a time")
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 16  # OpenAI's default max_tokens for completions
    r2 = client.completions.create(model=MODEL_ID, prompt=[[151644, 872, 198]], max_tokens=3, logprobs=2)
    assert r2.usage.prompt_tokens == 3 and r2.usage.completion_tokens == 3
    assert len(r2.choices[0].logprobs.tokens) == 3
    chunks = list(client.completions.create(model=MODEL_ID, prompt="Once upon a time", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_prefix_reuse(client):
    first = chat(client, max_tokens=8, user="prefix-1")
    conv = USER + [{"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "And then?"}]
    second = chat(client, messages=conv, max_tokens=4)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # the shared system/user turn is served from the KV cache
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_context_length_exceeded(srv):
    st, _, resp = raw(srv, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": USER, "max_tokens": 1024,
                                                            "messages": [{"role": "user", "content": "word " * 1500}]})
    assert st == 400, resp
    assert_error_shape(resp)
    assert resp["error"]["code"] == "context_length_exceeded"


def test_bookkeeping_fields_accepted(client):
    r = chat(client, max_tokens=2, user="u", metadata={"a": "b"}, store=False, service_tier="auto",
             parallel_tool_calls=False, tool_choice="none", response_format={"type": "text"}, n=1,
             frequency_penalty=0, presence_penalty=0, logit_bias={}, seed=None, stop=None,
             messages=[{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}])
    assert r.usage.completion_tokens == 2


def _stream_in_thread(srv, body, out, read_chunks=None, started=None):
    c = srv.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out["status"] = r.status
    if started:
        started.set()
    if read_chunks is None:
        out["data"] = r.read()
    c.close()


def test_models_and_health_during_generation(srv):
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 300, "stream": True, "user": "long-1"}
    c = srv.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    r.fp.readline()  # the generation is running
    t0 = time.time()
    st, _, models = raw(srv, "GET", "/v1/models")
    st2, _, _ = raw(srv, "GET", "/health")
    assert st == 200 and st2 == 200 and time.time() - t0 < 1.0
    c.close()


def test_429_when_queue_full(srv_q0):
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 2000, "stream": True}
    c = srv_q0.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    r.fp.readline()
    st, hdrs, resp = raw(srv_q0, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": USER, "max_tokens": 2})
    assert st == 429
    assert_error_shape(resp)
    assert hdrs.get("Retry-After") == "1"
    cl = srv_q0.client()
    with pytest.raises(openai.RateLimitError):
        chat(cl, max_tokens=2, user="429")
    c.close()  # disconnect: the long generation stops, the engine is free again
    deadline = time.time() + 10
    while True:
        st, _, resp = raw(srv_q0, "POST", "/v1/chat/completions",
                          {"model": MODEL_ID, "messages": USER, "max_tokens": 2, "user": "after"})
        if st == 200 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert st == 200, resp


def test_disconnect_mid_stream(srv):
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 1000, "stream": True, "user": "disconnect"}
    s = socket.create_connection(("127.0.0.1", srv.port))
    payload = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    r = chat(srv.client(), max_tokens=3, user="after-disconnect")
    assert r.usage.completion_tokens == 3
    log = open(srv.log_path).read()
    m = re.search(r"client disconnected, generation stopped after (\d+) of at most 1000 tokens", log)
    assert m, log[-2000:]
    assert int(m.group(1)) < 1000


def test_keep_alive(srv):
    c = srv.conn()
    socks = []
    for method, path, body in [("GET", "/v1/models", None), ("GET", "/health", None),
                               ("POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": USER, "max_tokens": 2}),
                               ("POST", "/v1/chat/completions", {"model": MODEL_ID, "bad": 1}),
                               ("GET", "/v1/models", None)]:
        c.request(method, path, body=json.dumps(body) if body else None,
                  headers={"Content-Type": "application/json"} if body else {})
        r = c.getresponse()
        r.read()
        assert r.status in (200, 400)
        assert not r.will_close
        socks.append(c.sock)
    assert c.sock is not None and all(s is socks[0] for s in socks)
    c.close()


def test_langchain_smoke(srv):
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as e:
        pytest.skip(f"langchain-openai is not installed (pip install langchain-openai): {e}")
    llm = ChatOpenAI(model=MODEL_ID, base_url=srv.base, api_key="unused", max_tokens=6, temperature=0, max_retries=0)
    msg = llm.invoke("Hello there")
    assert isinstance(msg.content, str)
    parts = list(llm.stream("Hello there"))
    assert "".join(p.content for p in parts) == msg.content
