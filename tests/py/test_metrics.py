"""test_metrics.py - GET /metrics of `deltafin serve` (docs/SERVER.md).

The real server on the tiny random-weight chat model (make_tiny_chat_model.py),
its answer parsed by the official prometheus_client parser: every family
parses, the counters grow by exactly the requests this test makes (ok, 400,
404, a stream), histogram buckets are cumulative and end in +Inf, _count is
the number of observations, token counters match the usage the answers
reported.
"""
import http.client
import json
import os
import socket
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_chat_model  # noqa: E402
from test_server import MODEL_ID, Server  # noqa: E402

parser = pytest.importorskip("prometheus_client.parser")

USER = [{"role": "user", "content": "Tell me about rivers."}]
FAMILIES = [
    "deltafin_build_info", "deltafin_uptime_seconds", "deltafin_requests", "deltafin_generations",
    "deltafin_memo_hits", "deltafin_prompt_tokens", "deltafin_prompt_tokens_cached", "deltafin_completion_tokens",
    "deltafin_time_to_first_token_seconds", "deltafin_inter_token_latency_seconds", "deltafin_queue_waiting",
    "deltafin_generation_running", "deltafin_expert_cache_hits", "deltafin_expert_cache_misses",
    "deltafin_expert_cache_read_bytes", "deltafin_expert_prefetch_hits", "deltafin_expert_prefetch_issued",
    "deltafin_expert_prefetch_unused", "deltafin_expert_prefetch_predicted", "deltafin_expert_prefetch_predicted_right",
    "deltafin_expert_prefetch_precision", "deltafin_spec_drafted_tokens", "deltafin_spec_accepted_tokens",
    "deltafin_memory_bytes",
]


@pytest.fixture(scope="module")
def msrv(tmp_path_factory):
    d = make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-chat-m")))
    s = Server(d, str(tmp_path_factory.mktemp("log") / "metrics.log"), "--ctx", "512", "--no-memo",
               "--max-request-bytes", "64KiB")
    yield s
    s.stop()


def call(conn, method, path, body=None):
    hdr = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=hdr)
    r = conn.getresponse()
    return r.status, r.getheader("Content-Type"), r.read()


def scrape(srv):
    c = srv.conn()
    st, ct, body = call(c, "GET", "/metrics")
    c.close()
    assert st == 200
    assert ct == "text/plain; version=0.0.4; charset=utf-8"
    text = body.decode()
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    return text, fams


def value(fams, fam, name, **labels):
    """The sample `name` with exactly these labels (0 when absent: a counter not yet incremented)."""
    for s in fams[fam].samples:
        if s.name == name and s.labels == labels:
            return s.value
    return 0.0


def req_count(fams, route, outcome):
    return value(fams, "deltafin_requests", "deltafin_requests_total", route=route, outcome=outcome)


def settle(srv, check, timeout=10):
    """The counters of a request are updated when the library is done with its connection, which may be just
    after the client has read the answer: scrape until check() holds."""
    deadline = time.time() + timeout
    while True:
        text, fams = scrape(srv)
        if check(fams) or time.time() > deadline:
            return text, fams
        time.sleep(0.05)


def test_every_family_parses_and_has_help_and_type(msrv):
    text, fams = scrape(msrv)
    for f in FAMILIES:
        assert f in fams, f"family {f} missing:\n{text}"
        assert fams[f].documentation, f
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ")
            if typ == "counter":
                assert name.endswith("_total"), line  # 0.0.4: counters are named ..._total, TYPE line included
        elif not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            assert name.startswith("deltafin_"), line
    for s in fams["deltafin_build_info"].samples:
        assert s.labels["model"] == MODEL_ID and s.value == 1
    assert {s.labels["tier"] for s in fams["deltafin_memory_bytes"].samples} >= {"rss", "peak_rss", "expert_cache_ram"}
    rss = value(fams, "deltafin_memory_bytes", "deltafin_memory_bytes", tier="rss")
    assert rss > 1 << 20


def test_counters_grow_by_exactly_the_requests_made(msrv):
    _, before = scrape(msrv)
    c = msrv.conn()
    usage_out = usage_in = 0
    # two plain chats (distinct prompts), each one generation
    for i in range(2):
        st, _, b = call(c, "POST", "/v1/chat/completions",
                        {"model": MODEL_ID, "messages": [{"role": "user", "content": f"Count {i} fish."}],
                         "max_tokens": 5})
        assert st == 200, b
        u = json.loads(b)["usage"]
        usage_out += u["completion_tokens"]
        usage_in += u["prompt_tokens"]
    # one 400 (bad field), one 404 (unknown path), one 405
    st, _, _ = call(c, "POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": USER, "bogus": 1})
    assert st == 400
    st, _, _ = call(c, "GET", "/v1/nothing-here")
    assert st == 404
    st, _, _ = call(c, "GET", "/v1/chat/completions")
    assert st == 405
    # one stream with usage
    st, ct, b = call(c, "POST", "/v1/chat/completions",
                     {"model": MODEL_ID, "messages": USER, "max_tokens": 4, "stream": True,
                      "stream_options": {"include_usage": True}})
    assert st == 200 and ct.startswith("text/event-stream")
    chunks = [json.loads(line[6:]) for line in b.decode().split("\n") if line.startswith("data: {")]
    u = [ch["usage"] for ch in chunks if ch.get("usage")][-1]
    usage_out += u["completion_tokens"]
    usage_in += u["prompt_tokens"]
    c.close()

    def diff(f, fam, name, **lb):
        return value(f, fam, name, **lb) - value(before, fam, name, **lb)

    want = {("/v1/chat/completions", "ok"): 3, ("/v1/chat/completions", "bad_request"): 1,
            ("other", "not_found"): 1, ("/v1/chat/completions", "method_not_allowed"): 1}
    _, after = settle(msrv, lambda f: all(req_count(f, r, o) - req_count(before, r, o) == n for (r, o), n in want.items()))
    for (route, outcome), n in want.items():
        assert req_count(after, route, outcome) - req_count(before, route, outcome) == n, (route, outcome)
    # no other series moved except /metrics itself
    for s in after["deltafin_requests"].samples:
        key = (s.labels["route"], s.labels["outcome"])
        if key not in want and key[0] != "/metrics":
            assert s.value == value(before, "deltafin_requests", s.name, **s.labels), key
    assert diff(after, "deltafin_generations", "deltafin_generations_total") == 3
    assert diff(after, "deltafin_completion_tokens", "deltafin_completion_tokens_total") == usage_out
    assert diff(after, "deltafin_prompt_tokens", "deltafin_prompt_tokens_total") == usage_in
    assert diff(after, "deltafin_memo_hits", "deltafin_memo_hits_total") == 0
    # one first-token observation per generation that produced a token; one gap per further token
    ttft = "deltafin_time_to_first_token_seconds"
    gap = "deltafin_inter_token_latency_seconds"
    assert diff(after, ttft, ttft + "_count") == 3
    assert diff(after, gap, gap + "_count") == usage_out - 3
    assert diff(after, ttft, ttft + "_sum") > 0


def test_histograms_cumulative(msrv):
    c = msrv.conn()
    st, _, _ = call(c, "POST", "/v1/completions", {"model": MODEL_ID, "prompt": "Once upon", "max_tokens": 6})
    assert st == 200
    c.close()
    _, fams = settle(msrv, lambda f: True)
    for fam in ("deltafin_time_to_first_token_seconds", "deltafin_inter_token_latency_seconds"):
        buckets = [(s.labels["le"], s.value) for s in fams[fam].samples if s.name == fam + "_bucket"]
        assert buckets[-1][0] == "+Inf"
        les = [float(le) for le, _ in buckets]
        assert les == sorted(les) and len(set(les)) == len(les)
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), counts  # cumulative
        assert counts[-1] == value(fams, fam, fam + "_count") > 0
        assert value(fams, fam, fam + "_sum") >= 0


def test_queue_gauge_idle_and_method(msrv):
    _, fams = scrape(msrv)
    assert value(fams, "deltafin_queue_waiting", "deltafin_queue_waiting") == 0
    assert value(fams, "deltafin_generation_running", "deltafin_generation_running") == 0
    c = msrv.conn()
    st, _, _ = call(c, "POST", "/metrics", {})
    assert st == 405
    c.close()


def test_memo_hit_counted_not_as_generation(tmp_path_factory):
    d = make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-chat-memo")))
    s = Server(d, str(tmp_path_factory.mktemp("log") / "memo.log"), "--ctx", "256")
    try:
        c = s.conn()
        body = {"model": MODEL_ID, "messages": USER, "max_tokens": 3}
        for _ in range(2):
            st, _, _ = call(c, "POST", "/v1/chat/completions", body)
            assert st == 200
        c.close()
        _, f = settle(s, lambda f: req_count(f, "/v1/chat/completions", "ok") == 2)
        assert req_count(f, "/v1/chat/completions", "ok") == 2
        assert value(f, "deltafin_generations", "deltafin_generations_total") == 1
        assert value(f, "deltafin_memo_hits", "deltafin_memo_hits_total") == 1
    finally:
        s.stop()


def test_too_large_and_cancelled(msrv):
    """A 413 from the http layer itself (before any handler) and a request whose client left before sending its
    whole body (never answered: cancelled) are counted too."""
    _, before = scrape(msrv)
    c = msrv.conn()
    st, _, _ = call(c, "POST", "/v1/completions", {"model": MODEL_ID, "prompt": "x" * (100 << 10)})
    assert st == 413
    c.close()
    sk = socket.create_connection(("127.0.0.1", msrv.port), timeout=10)
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: 1000\r\n\r\n{\"model\": ")
    time.sleep(0.2)
    sk.close()
    want = {("/v1/completions", "payload_too_large"): 1, ("/v1/completions", "cancelled"): 1}
    _, after = settle(msrv, lambda f: all(req_count(f, r, o) - req_count(before, r, o) == n for (r, o), n in want.items()))
    for (route, outcome), n in want.items():
        assert req_count(after, route, outcome) - req_count(before, route, outcome) == n, (route, outcome)
    gens = "deltafin_generations_total"
    assert value(after, "deltafin_generations", gens) == value(before, "deltafin_generations", gens)


def test_label_escaping(tmp_path_factory):
    """The served model id is a label value: a quote, a backslash and a newline are escaped so the parser reads
    the id back exactly."""
    d = make_tiny_chat_model.build(str(tmp_path_factory.mktemp("tiny-chat-esc")))
    weird = 'we"ird\\id\nx'
    s = Server(d, str(tmp_path_factory.mktemp("log") / "esc.log"), "--ctx", "64", "--served-model-name", weird)
    try:
        text, fams = scrape(s)
        [sample] = fams["deltafin_build_info"].samples
        assert sample.labels["model"] == weird, text
        assert 'model="we\\"ird\\\\id\\nx"' in text
    finally:
        s.stop()
