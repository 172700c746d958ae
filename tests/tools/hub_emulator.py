"""A local Hugging Face hub emulator for tests: the endpoints and headers that
huggingface_hub and `deltafin setup --full/--stream` use, with fault injection.

Two servers on 127.0.0.1: the hub (revision and tree APIs, HEAD/GET resolve
URLs) and a "storage" host on another port that resolve URLs of LFS files
redirect to (302), as the real hub redirects to its CDN. Storage serves HTTP
ranges. Faults are queued with `faults` (each consumed by one storage data
request): drop (close mid-body), short (Content-Length and body shorter than
asked), wronglen (Content-Length longer than the body, then close), overlong
(more bytes than asked), badrange (a Content-Range for other bytes), 429
(Retry-After: 1), 503, expired (403, as an expired signed URL), stall (send part of the body, then nothing for
`stall_s`), corrupt (one byte flipped). `throttle` (bytes/s) slows every
body. Every request is logged in `log` as (server, method, path, range,
authorization).

Used as a library (HubEmulator(repo_dir, ...).start()) or run directly:
python3 hub_emulator.py REPO_ID DIR  (prints the endpoint, serves until killed).
"""
import hashlib
import http.server
import json
import os
import socketserver
import sys
import threading
import time
import urllib.parse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class HubEmulator:
    def __init__(self, repo_id, repo_dir, commit=COMMIT, token=None, lfs_suffixes=(".safetensors",)):
        self.repo_id, self.commit, self.token = repo_id, commit, token
        self.files = {}
        for root, _, names in os.walk(repo_dir):
            for n in sorted(names):
                p = os.path.join(root, n)
                rel = os.path.relpath(p, repo_dir)
                data = open(p, "rb").read()
                lfs = rel.endswith(tuple(lfs_suffixes))
                self.files[rel] = {"data": data, "size": len(data), "blob": git_blob_id(data),
                                   "sha256": hashlib.sha256(data).hexdigest() if lfs else None}
        self.by_sha = {f["sha256"]: f for f in self.files.values() if f["sha256"]}
        self.faults = []          # consumed by storage data requests, one each
        self.api_faults = []      # consumed by hub requests (429 / 503 / drop)
        self.throttle = 0         # bytes per second for bodies (0: unlimited)
        self.stall_s = 5
        self.log = []
        self.lock = threading.Lock()

    # ---- bookkeeping -----------------------------------------------------
    def record(self, server, h):
        with self.lock:
            self.log.append((server, h.command, h.path, h.headers.get("Range"), h.headers.get("Authorization")))

    def count(self, server=None, method=None, contains=None):
        with self.lock:
            return sum(1 for s, m, p, _, _ in self.log
                       if (server is None or s == server) and (method is None or m == method) and (contains is None or contains in p))

    def take(self, queue):
        with self.lock:
            return queue.pop(0) if queue else None

    # ---- servers ---------------------------------------------------------
    def start(self):
        emu = self

        class Hub(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, code, body=b"", headers=(), ctype="application/json"):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                emu.record("hub", self)
                f = emu.take(emu.api_faults)
                if f == "429":
                    return self.send(429, b'{"error":"rate limited"}', [("Retry-After", "1")])
                if f == "503":
                    return self.send(503, b'{"error":"unavailable"}')
                if f == "drop":
                    self.close_connection = True
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
                    return
                if emu.token and self.headers.get("Authorization") != "Bearer " + emu.token:
                    return self.send(401, b'{"error":"Invalid credentials"}')
                u = urllib.parse.urlparse(self.path)
                path = urllib.parse.unquote(u.path)
                api = "/api/models/" + emu.repo_id + "/"
                if path.startswith(api + "revision/"):
                    rev = path[len(api + "revision/"):]
                    if rev not in ("main", emu.commit):
                        return self.send(404, b'{"error":"Revision Not Found"}', [("X-Error-Code", "RevisionNotFound")])
                    sib = []
                    for name, fi in sorted(emu.files.items()):
                        e = {"rfilename": name, "size": fi["size"], "blobId": fi["blob"]}
                        if fi["sha256"]:
                            e["lfs"] = {"sha256": fi["sha256"], "size": fi["size"], "pointerSize": 134}
                        sib.append(e)
                    body = {"_id": "x", "id": emu.repo_id, "modelId": emu.repo_id, "sha": emu.commit, "private": False,
                            "siblings": sib, "tags": [], "downloads": 0, "likes": 0}
                    return self.send(200, json.dumps(body).encode())
                if path.startswith(api + "tree/"):
                    out = []
                    for name, fi in sorted(emu.files.items()):
                        e = {"type": "file", "oid": fi["blob"], "size": fi["size"], "path": name}
                        if fi["sha256"]:
                            e["lfs"] = {"oid": fi["sha256"], "size": fi["size"], "pointerSize": 134}
                        out.append(e)
                    return self.send(200, json.dumps(out).encode())
                pre = "/" + emu.repo_id + "/resolve/"
                if path.startswith(pre):
                    rev, _, name = path[len(pre):].partition("/")
                    if rev not in ("main", emu.commit):
                        return self.send(404, b'{"error":"Revision Not Found"}', [("X-Error-Code", "RevisionNotFound")])
                    fi = emu.files.get(name)
                    if fi is None:
                        return self.send(404, b'{"error":"Entry not found"}', [("X-Error-Code", "EntryNotFound"),
                                                                                 ("X-Repo-Commit", emu.commit)])
                    common = [("X-Repo-Commit", emu.commit), ("Accept-Ranges", "bytes")]
                    if fi["sha256"]:
                        loc = "http://127.0.0.1:%d/blobs/%s?sig=x" % (emu.storage_port, fi["sha256"])
                        return self.send(302, b"", common + [("Location", loc), ("ETag", '"%s"' % fi["blob"]),
                                                             ("X-Linked-Etag", '"%s"' % fi["sha256"]),
                                                             ("X-Linked-Size", str(fi["size"]))], ctype="text/plain")
                    return emu.serve_bytes(self, fi["data"], common + [("ETag", '"%s"' % fi["blob"])], fault=None)
                return self.send(404, b'{"error":"not found"}')

        class Storage(Hub):
            def do_GET(self):
                emu.record("storage", self)
                if self.headers.get("Authorization"):
                    emu.leaked_auth = True
                u = urllib.parse.urlparse(self.path)
                if not u.path.startswith("/blobs/") or u.path[7:] not in emu.by_sha:
                    return self.send(404, b"no such blob")
                fi = emu.by_sha[u.path[7:]]
                fault = emu.take(emu.faults) if self.command == "GET" else None
                emu.serve_bytes(self, fi["data"], [("ETag", '"%s"' % fi["sha256"])], fault)

        self.leaked_auth = False
        self.hub = _Server(("127.0.0.1", 0), Hub)
        self.storage = _Server(("127.0.0.1", 0), Storage)
        self.storage_port = self.storage.server_address[1]
        self.endpoint = "http://127.0.0.1:%d" % self.hub.server_address[1]
        for s in (self.hub, self.storage):
            threading.Thread(target=s.serve_forever, daemon=True).start()
        return self

    def stop(self):
        for s in (self.hub, self.storage):
            s.shutdown()
            s.server_close()

    # ---- bodies, ranges and faults ---------------------------------------
    def serve_bytes(self, h, data, headers, fault):
        n = len(data)
        if fault == "expired":  # a signed storage URL past its expiry
            body = b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>"
            h.send_response(403)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        if fault in ("429", "503"):
            body = b"slow down" if fault == "429" else b"unavailable"
            h.send_response(int(fault))
            if fault == "429":
                h.send_header("Retry-After", "1")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        a, b, code = 0, n - 1, 200
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            s, _, e = rng[6:].partition("-")
            a = int(s) if s else n - int(e)
            b = min(int(e), n - 1) if (e and s) else n - 1
            if a >= n or a > b:
                h.send_response(416)
                h.send_header("Content-Range", "bytes */%d" % n)
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            code = 206
        body = data[a:b + 1]
        length, crange = len(body), "bytes %d-%d/%d" % (a, b, n)
        if fault == "corrupt" and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        if fault == "short":
            body = body[:len(body) // 2]
            length = len(body)
        if fault == "overlong":
            body = body + b"\0" * 17
            length = len(body)
        if fault == "badrange":
            crange = "bytes %d-%d/%d" % (a + 1, b + 1, n)
        h.send_response(code)
        for k, v in headers:
            h.send_header(k, v)
        if code == 206:
            h.send_header("Content-Range", crange)
        h.send_header("Content-Length", str(length + (1000 if fault == "wronglen" else 0)))
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        if h.command == "HEAD":
            return
        if fault in ("drop", "wronglen", "stall"):
            cut = len(body) if fault == "wronglen" else len(body) // 2
            self.write(h, body[:cut])
            if fault == "stall":
                time.sleep(self.stall_s)
            h.close_connection = True
            try:
                h.wfile.flush()
                h.connection.shutdown(2)
            except OSError:
                pass
            return
        self.write(h, body)

    def write(self, h, body):
        step = 16384
        for i in range(0, len(body), step):
            try:
                h.wfile.write(body[i:i + step])
            except OSError:
                return
            if self.throttle:
                time.sleep(step / self.throttle)


if __name__ == "__main__":
    emu = HubEmulator(sys.argv[1], sys.argv[2]).start()
    if len(sys.argv) > 3:
        emu.throttle = int(sys.argv[3])
    print(emu.endpoint, flush=True)
    while True:
        time.sleep(3600)
