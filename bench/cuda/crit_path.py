#!/usr/bin/env python3
"""crit_path.py - where a decode token's time goes on the GPU's critical path, from a kernel trace.

    crit_path.py TRACE [--tokens N]

TRACE: bench/cuda/ktrace.c's output (CUPTI, loaded by the driver; the GPU machine has no Nsight Systems) or, named
*.sqlite, `nsys profile -t cuda --export=sqlite`, of a `deltafin run --backend cuda` decode (one stream). ncu times
each kernel alone and CUDA events around each op disturb programmatic launches; a trace of the undisturbed run gives
each kernel's start and end as they happened. Kernels run in stream order, each depending on the one before it, so a
token's time is the sum over its kernels of end_i - max(end_j, j < i) (the time kernel i adds to the critical path;
0 when it ends under an earlier one), plus the time the GPU runs nothing (waiting for the host). Tokens are delimited
by the device -> host copies (the logits read back once a token) or, decoding ahead, the k_argmax launches; the
last N tokens are summed.
Prints per kernel name: launches a token, the time it adds a token (us), its mean span (start to end) and how far its
start runs ahead of the previous kernel's end (programmatic launches start early)."""
import argparse
import sqlite3
import subprocess
import sys
from collections import defaultdict


def demangle(mangled):
    """mangled name -> the demangled one without its parameter list (c++filt or cu++filt where one is installed)"""
    ml = sorted(mangled)
    for tool in ("c++filt", "cu++filt", "/usr/local/cuda/bin/cu++filt"):
        try:
            r = subprocess.run([tool], input="\n".join(ml), capture_output=True, text=True, check=True)
            d = r.stdout.split("\n")
            if len(d) >= len(ml):
                return {a: (b.split("(")[0] if "(" in b else b) for a, b in zip(ml, d)}
        except (OSError, subprocess.CalledProcessError):
            pass
    return {a: a for a in ml}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--tokens", type=int, default=100)
    a = ap.parse_args()
    k, m = [], []
    if a.trace.endswith(".sqlite"):
        db = sqlite3.connect(a.trace)
        names = dict(db.execute("select id, value from StringIds"))
        k = db.execute("select start, end, shortName, gridX, gridY, blockX from CUPTI_ACTIVITY_KIND_KERNEL order by start").fetchall()
        try:
            m = db.execute("select start, end from CUPTI_ACTIVITY_KIND_MEMCPY where copyKind = 2 order by start").fetchall()
        except sqlite3.OperationalError:
            m = []
    else:  # ktrace.c's lines
        names = {}
        for line in open(a.trace):
            f = line.split(" ", 7)
            if f[0] == "K":
                k.append((int(f[1]), int(f[2]), f[7].strip(), int(f[3]), int(f[4]), int(f[6])))
            elif f[0] == "M" and f[3] == "2":
                m.append((int(f[1]), int(f[2])))
        k.sort()
        m.sort()
        names = demangle({x[2] for x in k})
    if len(m) < a.tokens + 1:  # decoding ahead reads no logits: the device argmax ends each token
        m = [(x[0], x[1]) for x in k if "k_argmax" in names.get(x[2], str(x[2]))]
    if len(m) < a.tokens + 1:
        sys.exit(f"crit_path: {len(m)} device -> host copies or k_argmax launches in {a.trace}, need {a.tokens + 1} (one a token)")
    bounds = [e for _, e in m[-(a.tokens + 1):]]
    t0, t1 = bounds[0], bounds[-1]
    add = defaultdict(float)
    cnt = defaultdict(int)
    span = defaultdict(float)
    ahead = defaultdict(float)
    idle = 0.0
    last_end = None
    for s, e, nm, gx, gy, bx in k:
        if e <= t0 or s >= t1:
            if e <= t0:
                last_end = e if last_end is None else max(last_end, e)
            continue
        name = names.get(nm, str(nm))
        key = f"{name} <{gx}x{gy},{bx}>"
        prev = last_end if last_end is not None else s
        if s > prev:
            idle += s - prev
        inc = max(0, e - max(prev, s))
        add[key] += inc
        cnt[key] += 1
        span[key] += e - s
        ahead[key] += max(0, prev - s)
        last_end = max(prev, e)
    total = (t1 - t0) / a.tokens / 1e3
    print(f"{a.tokens} tokens, {total:.1f} us a token ({1e6 / total:.1f} tok/s); GPU idle (no kernel running) "
          f"{idle / a.tokens / 1e3:.1f} us a token")
    print(f"{'kernel <grid,block>':70s} {'n/tok':>6s} {'adds us/tok':>11s} {'us each':>8s} {'span us':>8s} {'ahead us':>8s}")
    rows = sorted(add, key=lambda x: -add[x])
    for key in rows:
        n = cnt[key] / a.tokens
        print(f"{key[:70]:70s} {n:6.2f} {add[key] / a.tokens / 1e3:11.2f} {add[key] / cnt[key] / 1e3:8.2f} "
              f"{span[key] / cnt[key] / 1e3:8.2f} {ahead[key] / cnt[key] / 1e3:8.2f}")
    print(f"{'sum':70s} {'':6s} {sum(add.values()) / a.tokens / 1e3:11.2f}")


if __name__ == "__main__":
    main()
