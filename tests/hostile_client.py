#!/usr/bin/env python3
"""hostile_client.py - an attacker's probes against a running `deltafin serve`.

Loopback only (the host must be 127.x.x.x or ::1), bounded in connections
and in time: every probe has a deadline, the hordes of slow connections are
capped in how many sockets they ever open, and the whole run stops itself
after --max-seconds. The probes (issue 18):

  slowloris   N connections that send request headers one byte at a time
  idle        N keep-alive connections that ask one /health and then sit
  framing     two conflicting Content-Length headers; Content-Length with
              Transfer-Encoding; Transfer-Encoding: gzip
  oversize    a body over the server's --max-request-bytes
  huge_chat   a chat body under the byte limit but far beyond the context
  slow_body   headers at once, then the body at a few bytes a second

While the hordes are open, /health and a normal chat request must keep being
answered. Each probe returns a dict of what it saw; tests/py/test_server_
hostile.py asserts on those. As a script it runs them all against --port and
prints one JSON object (exit status 1 if a check failed):

  python3 tests/hostile_client.py --port 8000 [--model ID] [--max-seconds 120]

Hordes come from the loopback addresses 127.0.0.2 .. 127.0.0.(1+addrs) so
that the per-client connection limit (--max-connections-per-client) and the
server-wide limit can both be exercised; the checks use 127.0.0.1.
"""
import argparse
import http.client
import json
import socket
import sys
import threading
import time

MODEL = "tiny-chat"
RUN_DEADLINE = [time.time() + 600]  # moved by main(); every wait below respects it


def _left(t):
    return max(0.0, min(t, RUN_DEADLINE[0] - time.time()))


def check_loopback(host):
    if not (host.startswith("127.") or host == "::1" or host == "localhost"):
        raise SystemExit(f"hostile_client: refusing to probe {host}: loopback addresses only")


def request(port, method, path, body=None, headers=None, timeout=10.0, host="127.0.0.1"):
    """One request on a fresh connection: (status, parsed JSON or text), or (None, error text)."""
    try:
        c = http.client.HTTPConnection(host, port, timeout=_left(timeout) or 0.1)
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
    except (OSError, http.client.HTTPException) as e:
        return None, f"{type(e).__name__}: {e}"
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data.decode("utf-8", "replace")


def health(port, within=3.0):
    """GET /health, retried on connection errors for up to `within` seconds: (status, seconds taken)."""
    t0 = time.time()
    while True:
        st, _ = request(port, "GET", "/health", timeout=within)
        if st is not None or time.time() - t0 > within or not _left(1):
            return st, time.time() - t0
        time.sleep(0.05)


def chat(port, model=MODEL, max_tokens=2, within=30.0, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": max_tokens}
    body.update(extra)
    t0 = time.time()
    while True:
        st, resp = request(port, "POST", "/v1/chat/completions", body, timeout=within)
        if st is not None or time.time() - t0 > within or not _left(1):
            return st, resp, time.time() - t0
        time.sleep(0.05)


def raw(port, data, timeout=5.0, host="127.0.0.1"):
    """Sends raw bytes, reads until the server closes or `timeout`: (bytes read, closed by server, seconds)."""
    s = socket.create_connection((host, port), timeout=_left(timeout) or 0.1)
    t0 = time.time()
    out, closed = b"", False
    try:
        s.sendall(data)
        while time.time() - t0 < timeout:
            s.settimeout(max(0.05, _left(timeout - (time.time() - t0))))
            d = s.recv(65536)
            if not d:
                closed = True
                break
            out += d
    except socket.timeout:
        pass
    except OSError:
        closed = True
    finally:
        s.close()
    return out, closed, time.time() - t0


def status_of(resp_bytes):
    try:
        return int(resp_bytes.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


# ---- hordes -----------------------------------------------------------------

class Horde:
    """n connections from the addresses 127.0.0.2.. (n/addrs each), kept open by
    one thread: 'slowloris' ones send a never-ending header one byte every
    `interval` seconds, 'idle' ones ask GET /health once (keep-alive) and then
    sit. A connection the server closes is reopened (an attacker would), but
    the horde never opens more than max_opens sockets in all."""

    def __init__(self, port, n, kind, addrs=10, interval=1.0, max_opens=None):
        self.port, self.n, self.kind, self.interval = port, n, kind, interval
        self.addrs = [f"127.0.0.{2 + i}" for i in range(addrs)]
        self.max_opens = max_opens if max_opens is not None else 100 * n
        self.opens = self.refused = self.cut = 0
        self.socks = [None] * n
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)

    def _open(self, i):
        if self.opens >= self.max_opens:
            return None
        self.opens += 1
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2,
                                         source_address=(self.addrs[i % len(self.addrs)], 0))
            s.setblocking(False)
            if self.kind == "slowloris":
                s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            else:
                s.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            return s
        except OSError:
            self.refused += 1
            return None

    def _alive(self, s):
        try:
            d = s.recv(4096)
            if d == b"":
                return False
            return True  # e.g. the idle ones' /health answer
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _run(self):
        last_drip = time.time()
        while not self.stop_ev.is_set() and _left(1):
            drip = time.time() - last_drip >= self.interval
            if drip:
                last_drip = time.time()
            for i in range(self.n):
                s = self.socks[i]
                if s is not None and not self._alive(s):
                    s.close()
                    s = self.socks[i] = None
                    self.cut += 1
                if s is None:
                    self.socks[i] = self._open(i)
                elif drip and self.kind == "slowloris":
                    try:
                        s.send(b"X")
                    except OSError:
                        pass
            self.stop_ev.wait(0.05)

    def open_now(self):
        return sum(s is not None for s in self.socks)

    def __enter__(self):
        for i in range(self.n):
            self.socks[i] = self._open(i)
        self.th.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.th.join(10)
        for s in self.socks:
            if s is not None:
                s.close()

    def stats(self):
        return {"kind": self.kind, "n": self.n, "opens": self.opens, "refused": self.refused, "cut": self.cut,
                "open_now": self.open_now()}


def under_horde(port, n, kind, seconds=6.0, addrs=10, model=MODEL):
    """Keeps a horde open for `seconds` and checks /health twice a second and
    one chat request meanwhile. health_fail counts /health checks that got no
    answer within 3 s."""
    res = {"health_ok": 0, "health_fail": 0, "health_max_s": 0.0}
    with Horde(port, n, kind, addrs=addrs) as h:
        time.sleep(_left(1.0))
        res["open_after_1s"] = h.open_now()
        t_end = time.time() + seconds
        while time.time() < t_end and _left(1):
            st, dt = health(port, within=3.0)
            res["health_ok" if st == 200 else "health_fail"] += 1
            res["health_max_s"] = max(res["health_max_s"], round(dt, 3))
            time.sleep(0.5)
        st, _, dt = chat(port, model=model, within=10.0)
        res["chat_status"], res["chat_s"] = st, round(dt, 3)
        res["horde"] = h.stats()
    return res


# ---- single probes ----------------------------------------------------------

def _post_head(extra, body=b""):
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra + b"\r\n"
            + body)


def framing(port, model=MODEL):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    out = {}
    cases = {
        "conflicting_content_length": _post_head(b"Content-Length: %d\r\nContent-Length: 5\r\n" % len(body), body),
        "content_length_and_chunked": _post_head(b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                                                 b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)),
        "gzip_transfer_encoding": _post_head(b"Transfer-Encoding: gzip\r\n", body),
    }
    for name, data in cases.items():
        resp, closed, dt = raw(port, data, timeout=5.0)
        out[name] = {"status": status_of(resp), "closed": closed, "seconds": round(dt, 3),
                     "body": resp.split(b"\r\n\r\n", 1)[-1][:300].decode("utf-8", "replace")}
    return out


def oversize(port, limit):
    """A body of limit + 1 bytes (sent in full): the answer's status."""
    body = b"x" * (limit + 1)
    resp, closed, dt = raw(port, _post_head(b"Connection: close\r\nContent-Length: %d\r\n" % len(body), body), timeout=30.0)
    return {"status": status_of(resp), "seconds": round(dt, 3),
            "body": resp.split(b"\r\n\r\n", 1)[-1][:300].decode("utf-8", "replace")}


def huge_chat(port, mbytes=15.0, model=MODEL):
    """A chat whose content is `mbytes` MB (under the server's byte limit, far
    over any context) in one thread; meanwhile a normal chat and /health.
    Returns the huge one's status and code, and how long the others took."""
    content = "x" * int(mbytes * 1e6)  # one word: the slowest text to tokenize
    big = {}

    def send_big():
        t0 = time.time()
        st, resp = request(port, "POST", "/v1/chat/completions",
                           {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1},
                           timeout=120)
        big["status"], big["seconds"] = st, round(time.time() - t0, 3)
        big["code"] = resp.get("error", {}).get("code") if isinstance(resp, dict) else str(resp)[:200]

    th = threading.Thread(target=send_big, daemon=True)
    th.start()
    chats = []
    while th.is_alive() and _left(1):  # normal chats, one after the other, for as long as the huge one runs
        st, _, dt = chat(port, model=model, within=60.0, user=f"probe-{len(chats)}")  # distinct: not from the memo
        chats.append((st, round(dt, 3)))
        time.sleep(0.1)
    hs, hdt = health(port, within=5.0)
    th.join(_left(120))
    return {"huge_status": big.get("status"), "huge_code": big.get("code"), "huge_s": big.get("seconds"),
            "chat_status": max((c[0] or 0 for c in chats), default=None) if all(c[0] == 200 for c in chats) else
            [c[0] for c in chats], "chats": len(chats), "chat_s": max((c[1] for c in chats), default=0.0),
            "health_status": hs, "health_s": round(hdt, 3)}


def slow_body(port, seconds=30.0, rate=20):
    """Headers at once with Content-Length 100000, then `rate` bytes a second:
    how long until the server closes the connection (None: it never did)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.sendall(_post_head(b"Content-Length: 100000\r\n"))
    t0 = time.time()
    closed_after = None
    try:
        while time.time() - t0 < seconds and _left(1):
            try:
                s.send(b"x" * rate)
            except OSError:
                closed_after = time.time() - t0
                break
            s.settimeout(1.0)
            try:
                d = s.recv(4096)
                if d == b"" or d:
                    closed_after = time.time() - t0
                    break
            except socket.timeout:
                pass
            except OSError:
                closed_after = time.time() - t0
                break
    finally:
        s.close()
    return {"closed_after_s": None if closed_after is None else round(closed_after, 3)}


def slow_headers(port, seconds=30.0):
    """One connection that sends a header byte a second: how long until the
    server closes it (None: it never did within `seconds`)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    t0 = time.time()
    closed_after = None
    try:
        while time.time() - t0 < seconds and _left(1):
            try:
                s.send(b"X")
                s.settimeout(1.0)
                d = s.recv(4096)
                if d == b"" or d:
                    closed_after = time.time() - t0
                    break
            except socket.timeout:
                pass
            except OSError:
                closed_after = time.time() - t0
                break
    finally:
        s.close()
    return {"closed_after_s": None if closed_after is None else round(closed_after, 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--connections", type=int, default=300)
    ap.add_argument("--max-request-bytes", type=int, default=16 << 20)
    ap.add_argument("--max-seconds", type=float, default=180)
    a = ap.parse_args()
    check_loopback(a.host)
    RUN_DEADLINE[0] = time.time() + a.max_seconds
    r = {"slowloris": under_horde(a.port, a.connections, "slowloris", model=a.model),
         "idle": under_horde(a.port, a.connections, "idle", model=a.model),
         "framing": framing(a.port, a.model),
         "oversize": oversize(a.port, a.max_request_bytes),
         "huge_chat": huge_chat(a.port, model=a.model),
         "slow_headers": slow_headers(a.port),
         "slow_body": slow_body(a.port)}
    ok = (all(r[k]["health_fail"] == 0 and r[k]["chat_status"] == 200 for k in ("slowloris", "idle"))
          and r["framing"]["conflicting_content_length"]["status"] == 400
          and r["framing"]["content_length_and_chunked"]["status"] == 400
          and r["framing"]["gzip_transfer_encoding"]["status"] in (400, 411, 415, 501)
          and r["oversize"]["status"] == 413
          and r["huge_chat"]["huge_status"] in (400, 413) and r["huge_chat"]["chat_status"] == 200
          and r["slow_headers"]["closed_after_s"] is not None and r["slow_body"]["closed_after_s"] is not None)
    print(json.dumps(r, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
