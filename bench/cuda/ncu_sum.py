#!/usr/bin/env python3
"""ncu_sum.py CSV - sums an `ncu --metrics gpu__time_duration.sum --csv` log by kernel (template
arguments kept: k_mm<V, NT, WP, MJ, U>), and per decode token where the capture holds whole MoE
layers (4 route launches, k_route_fused or k_route_soft or round 10's k_gu_rt, per token of the 4-layer benchmark model: MOE_LAYERS)."""
import collections
import csv
import os
import sys

rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
if not rows:
    print("ncu: no rows")
    sys.exit()
h = rows[0]
ki, vi = h.index("Kernel Name"), len(h) - 1
ui = h.index("Metric Unit") if "Metric Unit" in h else None
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
t = collections.defaultdict(list)
for r in rows[1:]:
    try:
        v = float(r[vi].replace(",", ""))
    except ValueError:
        continue
    v *= scale.get(r[ui], 1.0) if ui is not None else 1e-3
    t[r[ki].split("(")[0].replace("void ", "")[:60]].append(v)
tot = sum(sum(v) for v in t.values())
n = sum(len(v) for v in t.values())
for k, v in sorted(t.items(), key=lambda kv: -sum(kv[1])):
    print(f"ncu {k:60s} n={len(v):4d} mean {sum(v) / len(v):8.2f} us  min {min(v):8.2f}  max {max(v):8.2f}  sum {sum(v):9.1f}")
# one per MoE layer: k_route_fused, or round 7's k_route_soft, or (round 10, bit 8192: the route inside it) k_gu_rt
routes = sum(len(v) for k, v in t.items() if k.startswith("k_route_") or k.startswith("k_gu_rt"))
L = int(os.environ.get("MOE_LAYERS", "4"))
line = f"ncu: {n} kernels, {tot:.1f} us of GPU time"
if routes:
    line += f"; {routes / L:.2f} tokens' MoE layers in the capture: {tot * L / routes:.1f} us of kernel time per token"
print(line)
