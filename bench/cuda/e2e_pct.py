#!/usr/bin/env python3
"""Reads one `deltafin run --stats` log and the floors of the same device call
and prints the end-to-end shares (issue 13 item 5a and 5c):
  decode weight bytes per second (bytes_active per token x tok/s, the
  "GB/s of weights" of --stats) against the HBM read floor (cuda_bench --floor);
  expert bytes host -> VRAM per second of decode against the pinned H2D floor
  (h2d_bw, the 3 MiB-copy line), with the disk bytes read per decode token
  (0 when the host expert cache was warm).
Usage: e2e_pct.py RUN_LOG FLOOR_LOG H2D_LOG"""
import re
import sys

run, floor, h2d = (open(p, errors="replace").read() for p in sys.argv[1:4])
m = re.search(r"decode (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s, ([\d.]+) GB/s of weights\)", run)
f = re.search(r"floor: HBM read ([\d.]+) GB/s", floor)
b = re.search(r"chunks of 3145728 B: ([\d.]+) GB/s", h2d)
if not m:
    print("e2e: no decode stats in the log")
    sys.exit(1)
tok_s, gbs = float(m.group(3)), float(m.group(4))
line = f"e2e: decode {tok_s:.1f} tok/s, {gbs / tok_s * 1e3:.1f} MB of weights per token, {gbs:.1f} GB/s"
if f:
    line += f" = {100 * gbs / float(f.group(1)):.1f}% of the {float(f.group(1)):.0f} GB/s HBM floor"
print(line)
c = re.search(r"decode: ([\d.]+) MB of experts host -> vram per token, ([\d.]+) GB/s of decode time", run)
d = re.search(r"decode: ([\d.]+) MB of experts read per token, ([\d.]+) s I/O wait per token", run)
if c and float(c.group(1)) > 0:
    line = f"e2e: experts host -> VRAM {float(c.group(1)):.1f} MB per token, {float(c.group(2)):.2f} GB/s of decode time"
    if b:
        line += f" = {100 * float(c.group(2)) / float(b.group(1)):.1f}% of the {float(b.group(1)):.2f} GB/s pinned H2D floor"
    if d:
        line += f"; from disk {float(d.group(1)):.1f} MB per token, I/O wait {1e3 * float(d.group(2)):.2f} ms per token"
    print(line)
