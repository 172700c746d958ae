"""test_server_hostile.py - `deltafin serve` against a hostile client (issue 18).

Runs the probes of tests/hostile_client.py against the real binary
(DELTAFIN_BIN: under `make asan` the sanitized one, whose log is checked for
sanitizer reports at the end). Two servers, started once:
  dflt   the defaults for every connection and size limit (--ctx 2048)
  fast   --header-timeout 1 --idle-timeout 1 --body-min-rate 1KiB, to see the
         timeouts act within a test's time

Each case is a reproducer from the issue: before the fix 300 slow or idle
connections locked everyone out (/health included) for the 600 s timeout,
duplicate Content-Length was accepted, Transfer-Encoding: gzip was never
answered, and a huge chat body held the engine while it was tokenized.
"""
import os
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from conftest import deltafin_bin  # noqa: E402
import hostile_client as hc  # noqa: E402
from test_server import MODEL_ID, Server, model_dir  # noqa: E402,F401  (model_dir: the shared fixture)

hc.MODEL = MODEL_ID


def _can_bind_loopback_aliases():
    try:
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.close()
        return True
    except OSError:
        return False


aliases = pytest.mark.skipif(not _can_bind_loopback_aliases(), reason="cannot bind 127.0.0.2 (loopback aliases)")


@pytest.fixture(scope="module")
def dflt(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "hostile-default.log"), "--ctx", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def fast(model_dir, tmp_path_factory):
    s = Server(model_dir, str(tmp_path_factory.mktemp("log") / "hostile-fast.log"), "--ctx", "2048",
               "--header-timeout", "1", "--idle-timeout", "1", "--body-min-rate", "1KiB")
    yield s
    s.stop()


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def sanitized(pid):
    return "libasan" in open(f"/proc/{pid}/maps").read() or "__asan" in open(f"/proc/{pid}/cmdline").read()


# ---- slow and idle connections ------------------------------------------------

@aliases
@pytest.mark.parametrize("kind", ["slowloris", "idle"])
def test_health_and_chat_served_under_300_slow_connections(dflt, kind):
    """300 connections from 10 client addresses (30 each, under the per-client
    limit; together over the 256 slots): /health and a chat keep being answered."""
    r = hc.under_horde(dflt.port, 300, kind, seconds=5.0, addrs=10)
    assert r["open_after_1s"] >= 200, r  # the horde really was there
    assert r["health_fail"] == 0 and r["health_ok"] >= 5, r
    assert r["chat_status"] == 200, r


@aliases
def test_per_client_connection_limit(dflt):
    """300 slowloris connections from ONE address: only --max-connections-per-client
    (32) are served at a time; everyone else is unaffected."""
    with hc.Horde(dflt.port, 300, "slowloris", addrs=1) as h:
        time.sleep(1.0)
        st, dt = hc.health(dflt.port, within=3.0)
        assert st == 200 and dt < 1.0, (st, dt)
        # the server refuses (accepts and closes) the connections over the limit
        assert h.cut >= 300 - 32, h.stats()
    st, _, _ = hc.chat(dflt.port)
    assert st == 200


def test_slow_headers_are_cut(fast):
    r = hc.slow_headers(fast.port, seconds=15.0)
    assert r["closed_after_s"] is not None and r["closed_after_s"] < 4.0, r


def test_slow_body_is_cut(fast):
    r = hc.slow_body(fast.port, seconds=15.0, rate=20)
    assert r["closed_after_s"] is not None and r["closed_after_s"] < 5.0, r


def test_idle_keep_alive_is_closed(fast):
    s = socket.create_connection(("127.0.0.1", fast.port), timeout=10)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
        got += s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200")
    t0 = time.time()
    s.settimeout(10)
    assert s.recv(4096) == b""  # closed by the server
    assert time.time() - t0 < 4.0
    s.close()


def test_long_generation_not_cut_by_timeouts(fast):
    """The timeouts are for waiting connections: a generation that takes longer
    than them (here > 1 s) is answered in full."""
    st, resp, dt = hc.chat(fast.port, max_tokens=300, within=120)
    assert st == 200, resp
    assert resp["usage"]["completion_tokens"] >= 1


# ---- framing ------------------------------------------------------------------

def test_framing(dflt):
    r = hc.framing(dflt.port)
    for name, want in [("conflicting_content_length", 400), ("content_length_and_chunked", 400),
                       ("gzip_transfer_encoding", 501)]:
        assert r[name]["status"] == want, r
        assert r[name]["closed"] and r[name]["seconds"] < 2.0, r
        assert '"error"' in r[name]["body"] and '"code"' in r[name]["body"], r
    # a normal request still works afterwards
    st, _, _ = hc.chat(dflt.port)
    assert st == 200


# ---- sizes --------------------------------------------------------------------

def test_default_body_limit_413(dflt):
    r = hc.oversize(dflt.port, 16 << 20)
    assert r["status"] == 413 and "request_too_large" in r["body"], r
    # an absurd Content-Length is answered at once, without reading the body
    resp, closed, dt = hc.raw(dflt.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Type: application/json\r\nContent-Length: 60000000000\r\n\r\n{", timeout=5)
    assert hc.status_of(resp) == 413 and dt < 2.0


def test_huge_chat_refused_without_holding_the_engine(dflt):
    """A 15 MB chat (under the byte limit, far over the context): refused as
    context_length_exceeded without tokenizing it under the engine's turn, so a
    normal chat sent meanwhile is answered at once; memory goes back down."""
    pid = dflt.proc.pid
    before = rss_kb(pid)
    r = hc.huge_chat(dflt.port, mbytes=15.0)
    assert r["huge_status"] == 400 and r["huge_code"] == "context_length_exceeded", r
    assert r["chat_status"] == 200 and r["chat_s"] < 5.0, r
    assert r["health_status"] == 200 and r["health_s"] < 2.0, r
    if not sanitized(pid):  # ASan's allocator keeps freed memory in quarantine
        time.sleep(0.5)
        grown = rss_kb(pid) - before
        assert grown < 100 * 1024, f"RSS grew by {grown} kB after a 15 MB request"


# ---- options ------------------------------------------------------------------

@pytest.mark.parametrize("opt,val", [("--max-connections", "0"), ("--max-connections-per-client", "-1"),
                                     ("--header-timeout", "0"), ("--idle-timeout", "x"),
                                     ("--body-min-rate", "fast")])
def test_bad_limit_options(opt, val):
    p = subprocess.run([deltafin_bin(), "serve", "--model", "unused", opt, val], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 2
    assert opt in p.stderr, p.stderr


# ---- --trace write errors -------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("cmd", ["run", "serve"])
def test_trace_write_error_is_reported(cmd):
    """`--trace /dev/full` used to be accepted and every trace line lost
    silently (exit 0); now the write error is reported before the model loads."""
    moe = os.path.join(os.path.dirname(HERE), "data", "models", "deepseek-v3-fp8")
    args = ["--ids", "1,2,3", "--max-new", "2", "--print-ids"] if cmd == "run" else ["--port", "0"]
    p = subprocess.run([deltafin_bin(), cmd, "--model", moe, "--expert-cache", "0", "--trace", "/dev/full", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "--trace /dev/full" in p.stderr and "No space left on device" in p.stderr, p.stderr
