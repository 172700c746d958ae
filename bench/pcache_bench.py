#!/usr/bin/env python3
"""pcache_bench.py - time to first token on a repeated ~8k-token prefix with
the prompt cache on disk (serve --cache-dir, docs/SERVER.md).

    bench/pcache_bench.py [--model smollm2-135m-instruct] [--prefix 8000] [--threads 2]

Env: DELTAFIN_BIN (default ./deltafin, else build/deltafin).

One server with --ctx 8192 --no-memo --cache-dir TMP; prompts are token ids
(a fixed pseudo-random prefix P of --prefix ids plus a short distinct suffix
per request) on /v1/completions with max_tokens 1, so the request's time is
the time to the first token. Measured:
  1. cold:            P+s1 on a fresh server and an empty cache
  2. warm in RAM:     P+s2 on the same server (the session keeps P)
  3. restart (disk, page cache warm): a new server over the same directory, P+s3
     (the P prefix stored after request 2 is loaded from the file)
  4. restart (disk, file dropped from the page cache with
     posix_fadvise(DONTNEED) first): a new server, P+s4
and, for the file of P, the disk floor: `deltafin bench-disk FILE` (O_DIRECT
read bandwidth), against the load's read rate from the server's log line.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="smollm2-135m-instruct")
ap.add_argument("--prefix", type=int, default=8000)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BIN = os.environ.get("DELTAFIN_BIN") or ("./deltafin" if os.path.exists("./deltafin") else "build/deltafin")
tmp = tempfile.mkdtemp(prefix="pcache-bench-")
cache = os.path.join(tmp, "cache")


class Server:
    def __init__(self, tag):
        self.log_path = os.path.join(tmp, tag + ".log")
        self.proc = subprocess.Popen([BIN, "serve", "--model", args.model, "--port", "0", "--ctx", "8192", "--no-memo",
                                      "--threads", str(args.threads), "--cache-dir", cache, "--served-model-name", "m"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log_path, "w"))
        for _ in range(1200):
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit("server did not start: " + self.text())

    def text(self):
        return open(self.log_path).read()

    def ttft(self, ids):
        body = json.dumps({"model": "m", "prompt": ids, "max_tokens": 1, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", body, {"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=3600) as r:
            b = json.loads(r.read())
        return time.perf_counter() - t0, b["usage"]["prompt_tokens_details"]["cached_tokens"]

    def wait_stored(self, n):
        while self.text().count("prompt cache: stored") < n:
            time.sleep(0.1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


V = 49152
P = [1000 + (i * 104729 + 17) % (V - 2000) for i in range(args.prefix)]
suffix = lambda k: [500 + k * 11 + j for j in range(8)]  # noqa: E731
rows = []
s = Server("a")
t, c = s.ttft(P + suffix(1))
rows.append(("cold (empty cache)", t, c))
s.wait_stored(1)
t, c = s.ttft(P + suffix(2))
rows.append(("warm in RAM (same server)", t, c))
s.wait_stored(3)
s.stop()
store = re.findall(r"prompt cache: stored .*", s.text())
s = Server("b")
t, c = s.ttft(P + suffix(3))
rows.append(("after restart, file in page cache", t, c))
load1 = re.findall(r"prompt cache: loaded .*", s.text())
s.stop()
pfile = [f for f in glob.glob(os.path.join(cache, "*.dfpc")) if f.endswith(f"-{args.prefix}.dfpc")][0]
fd = os.open(pfile, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
s = Server("c")
t, c = s.ttft(P + suffix(4))
rows.append(("after restart, file not in page cache", t, c))
load2 = re.findall(r"prompt cache: loaded .*", s.text())
s.stop()
fd = os.open(pfile, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
floor = subprocess.run([BIN, "bench-disk", pfile], capture_output=True, text=True)

print(f"model {args.model}, prefix {args.prefix} tokens + 8, {args.threads} threads, {os.cpu_count()} cores")
print(f"{'case':40s} {'TTFT s':>9s} {'cached':>7s}")
for name, t, c in rows:
    print(f"{name:40s} {t:9.3f} {c:7d}")
print("stores:", *store, sep="\n  ")
print("loads:", *(load1 + load2), sep="\n  ")
print(f"file {os.path.basename(pfile)}: {os.path.getsize(pfile) / 2**20:.1f} MiB")
print("disk floor (deltafin bench-disk):", (floor.stdout + floor.stderr).strip())
shutil.rmtree(tmp)
