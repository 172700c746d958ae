#!/usr/bin/env python3
"""End-to-end check of the CUDA backend's memory tiers on tiny MoE models
(needs a CUDA build and a GPU; tests/py/test_cuda_tiers.py runs it).

    cuda_tiers.py DELTAFIN_BIN [MODEL_DIR ...]

For each model (default: qwen3-moe-bf16 and deepseek-v3-bf16):
  1. a probe run (--backend cuda --stats) reads how much device memory the
     run needs besides the expert cache and how big one cache slot is;
  2. --gpu-memory is set so that only a few expert parts fit in the VRAM cache
     (8: fewer than one token's; 32: more than one token's, fewer than the
     model's), with the host expert cache at its minimum
     (--expert-cache 0: one layer's experts, streamed from disk): teacher-forced
     logits over the golden ids equal the CPU's (rel L2 <= 1e-3 per position,
     same argmax), 32 greedy tokens are identical, the stats show evictions
     (and hits with 32 slots);
  3. the same with the experts resident in host memory (no --expert-cache);
  4. --gpu-memory below the spine's share: the spine stays in host memory
     (said on stderr), the cache has no room (said), results still equal;
  5. --gpu-memory 64K: out of VRAM for the session state, a one-line message
     with the numbers and --gpu-memory, a non-zero exit, no crash.
Exit 0 when all hold, 1 otherwise (one line per failed check)."""
import json
import math
import pathlib
import re
import struct
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
TOL = 1e-3
bad = 0


def fail(msg):
    global bad
    bad += 1
    print("FAIL " + msg)


def sh(args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)


def logits(binary, model, ids, out, extra):
    p = sh([binary, "eval", "--model", model, "--ids", ",".join(map(str, ids)), "--dump-logits", out] + extra)
    if p.returncode:
        return None, p.stderr
    raw = pathlib.Path(out).read_bytes()
    return list(struct.unpack("<%df" % (len(raw) // 4), raw)), p.stderr


def compare(name, cpu, gpu, n, V):
    if gpu is None or len(gpu) != len(cpu):
        fail(f"{name}: {0 if gpu is None else len(gpu)} logits, expected {len(cpu)}")
        return
    worst = 0.0
    for t in range(n):
        a, b = cpu[t * V:(t + 1) * V], gpu[t * V:(t + 1) * V]
        num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
        den = max(math.sqrt(sum(x * x for x in a)), 1e-30)
        worst = max(worst, num / den)
        if max(range(V), key=a.__getitem__) != max(range(V), key=b.__getitem__):
            fail(f"{name}: argmax differs at position {t}")
    if not worst <= TOL:
        fail(f"{name}: rel L2 {worst:.3g} > {TOL}")
    print(f"{name}: worst rel L2 {worst:.3g} over {n} positions")


def greedy(binary, model, ids, extra):
    p = sh([binary, "run", "--model", model, "--ids", ",".join(map(str, ids)), "--max-new", "32", "--ignore-eos", "--print-ids", "--stats"] + extra)
    return p


def stats(err):
    m = re.search(r"\[stats\] vram: budget [\d.]+ MB, in use [\d.]+ MB \((\d+) B\)", err)
    c = re.search(r"\[stats\] vram expert cache: (\d+) slots \((\d+) B, \w+\), hit rate [\d.]+% \((\d+) hits, (\d+) misses of \d+ expert parts\), (\d+) evictions, (\d+) bypasses", err)
    if not m or not c:
        return None
    return {"used": int(m.group(1)), "slots": int(c.group(1)), "cache": int(c.group(2)), "hits": int(c.group(3)), "misses": int(c.group(4)),
            "evictions": int(c.group(5)), "bypasses": int(c.group(6))}


def ids_of(p):
    return re.findall(r"-?\d+", p.stdout)


def check_model(binary, model, tmp):
    name = model.name
    g = json.loads((model / "golden.json").read_text())
    ids, V = g["ids"], g["vocab_size"]
    cpu, e = logits(binary, model, ids, tmp / "cpu.f32", ["--backend", "cpu"])
    if cpu is None:
        fail(f"{name}: cpu eval failed: {e.strip()}")
        return
    ref = greedy(binary, model, ids[:4], ["--backend", "cpu"])
    base = 0
    for label, extra in (("streamed (SSD -> pinned RAM -> VRAM)", ["--expert-cache", "0"]), ("resident in host memory", [])):
        tag = f"{name} [{label}]"
        probe = greedy(binary, model, ids[:4], ["--backend", "cuda", "--gpu-memory", "2G"] + extra)
        st = stats(probe.stderr)
        if probe.returncode or not st or not st["slots"]:
            fail(f"{tag}: probe run failed ({probe.returncode}): {probe.stderr[-1000:]}")
            continue
        slot = st["cache"] // st["slots"]
        base = st["used"] - st["cache"]
        # the cache's scratch reserve (cuda.cu vc_init: 16 MiB + 2 slots) and room for 8 slots (fewer
        # than one token's expert parts: evictions and bypasses, LRU finds nothing again) or 32 (more
        # than one token's, fewer than the model's: hits and evictions)
        for want in (8, 32):
            budget = base + (16 << 20) + 2 * slot + want * slot + slot // 2
            t = f"{tag} {want} slots"
            print(f"{t}: slot {slot} B, {base} B besides the cache; --gpu-memory {budget}")
            opts = ["--backend", "cuda", "--gpu-memory", str(budget)] + extra
            gpu, e = logits(binary, model, ids, tmp / "gpu.f32", opts)
            if gpu is None:
                fail(f"{t}: eval failed: {e.strip()[-1000:]}")
                continue
            compare(t, cpu, gpu, len(ids), V)
            p = greedy(binary, model, ids[:4], opts)
            s = stats(p.stderr)
            if p.returncode or ids_of(p) != ids_of(ref):
                fail(f"{t}: 32 greedy tokens differ from the cpu's ({p.returncode}): {ids_of(p)} vs {ids_of(ref)} {p.stderr[-800:]}")
            elif not s or not (want // 2 <= s["slots"] <= want + 4) or s["evictions"] <= 0 or (want == 32 and s["hits"] <= 0):
                fail(f"{t}: expected about {want} slots with evictions{' and hits' if want == 32 else ''}, got {s}: {p.stderr[-800:]}")
            else:
                print(f"{t}: 32 greedy tokens identical; cache {s}")
    # spine over the budget: kept in host memory, the cache gets no room
    small = ["--backend", "cuda", "--gpu-memory", str(max(base // 2, 1 << 20))]
    gpu, e = logits(binary, model, ids, tmp / "gpu.f32", small)
    if gpu is None:
        # a budget below the session state is refused, which step 5 checks; here it must run
        fail(f"{name} [spine on host]: eval failed: {e.strip()[-1000:]}")
    else:
        compare(f"{name} [spine on host]", cpu, gpu, len(ids), V)
        if "stay in host memory" not in e or "raise --gpu-memory" not in e:
            fail(f"{name} [spine on host]: stderr does not say so: {e[-800:]}")
    p = sh([binary, "eval", "--model", model, "--ids", ",".join(map(str, ids)), "--backend", "cuda", "--gpu-memory", "64K"])
    lines = [l for l in p.stderr.splitlines() if "out of VRAM" in l]
    if p.returncode <= 0 or not lines or "--gpu-memory" not in lines[0] or "asked" not in lines[0] or "available" not in lines[0]:
        fail(f"{name} [--gpu-memory 64K]: expected a refusal with the numbers, got exit {p.returncode}: {p.stderr[-800:]}")
    else:
        print(f"{name} [--gpu-memory 64K]: exit {p.returncode}: {lines[0]}")


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    models = [pathlib.Path(m) for m in sys.argv[2:]] or [REPO / "tests/data/models/qwen3-moe-bf16", REPO / "tests/data/models/deepseek-v3-bf16"]
    with tempfile.TemporaryDirectory() as t:
        for m in models:
            check_model(binary, m, pathlib.Path(t))
    print("cuda_tiers: %s" % ("ok" if not bad else f"{bad} failures"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
