#!/usr/bin/env python3
"""The physical floor of a streamed run, from its --trace: the bytes that had
to be read (the spine once, from cold caches, except an untied embedding
table of which only the rows of the positions run count, and the expert misses of
Belady's optimal policy with the run's cache size, first uses included) over
the disk bandwidth, plus the weight
bytes every forward pass touches (the spine once per pass, each routed
expert used) over the memory bandwidth, both measured in the same run.

With --touch-gbs and --fresh-bytes it also reports the time to fault in the
memory the run held at the measured first-touch speed and a floor that
counts it (max of it and the read time, plus compute): on a VM that backs
memory lazily this, not the disk, bounds a cold start.

Usage: io_floor.py --trace T.jsonl --model M.gguf|DIR --slots N --disk-gbs D --mem-gbs B [--wall S]
                   [--touch-gbs G --fresh-bytes N]"""
import argparse
import collections
import glob
import json
import os
import re
import struct


def expert_and_spine_bytes(model):
    """(bytes of one routed expert, spine bytes a forward pass touches) from a
    GGUF or a checkpoint dir. The embedding table counts one row: a pass
    reads only its tokens' rows."""
    sizes = {}
    if model.endswith(".gguf"):
        import gguf
        r = gguf.GGUFReader(model)
        for t in r.tensors:
            sizes[t.name] = int(t.n_bytes)
        exp = {k: v for k, v in sizes.items() if "_exps." in k}
        n_exp = int(r.fields[[k for k in r.fields if k.endswith(".expert_count")][0]].contents())
        layers = {k.split(".")[1] for k in exp}
        per_expert = sum(exp.values()) // (n_exp * len(layers))
        emb = next(t for t in r.tensors if t.name == "token_embd.weight")
        emb_row = int(emb.n_bytes) // int(emb.shape[-1])
        spine = sum(sizes.values()) - sum(exp.values())
        tied = "output.weight" not in sizes
        return per_expert, spine - sizes["token_embd.weight"] + emb_row, spine, 0 if tied else sizes["token_embd.weight"], emb_row
    for f in glob.glob(os.path.join(model, "*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            for k, v in json.loads(fh.read(n)).items():
                if k != "__metadata__":
                    sizes[k] = v["data_offsets"][1] - v["data_offsets"][0]
    pat = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.")
    per = collections.Counter()
    for k, v in sizes.items():
        m = pat.match(k)
        if m:
            per[(m.group(1), m.group(2))] += v
    emb = sizes.get("model.embed_tokens.weight", 0)
    vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
    tied = "lm_head.weight" not in sizes
    return (max(per.values()), sum(sizes.values()) - sum(per.values()) - emb + emb // vocab, sum(sizes.values()) - sum(per.values()),
            0 if tied else emb, emb // vocab)


def opt_misses(reqs, slots):
    future = collections.defaultdict(collections.deque)
    for i, r in enumerate(reqs):
        for k in r:
            future[k].append(i)
    cache, misses = set(), 0
    for r in reqs:
        pinned = set(r)
        for k in r:
            future[k].popleft()
            if k in cache:
                continue
            misses += 1
            if len(cache) >= slots:
                cand = [c for c in cache if c not in pinned]
                if not cand:
                    continue
                cache.discard(max(cand, key=lambda c: future[c][0] if future[c] else 1 << 60))
            cache.add(k)
    return misses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--slots", type=int, required=True)
    ap.add_argument("--disk-gbs", type=float, required=True)
    ap.add_argument("--mem-gbs", type=float, required=True)
    ap.add_argument("--wall", type=float, default=0)
    ap.add_argument("--touch-gbs", type=float, default=0, help="first-touch speed of fresh memory (deltafin bench first-touch)")
    ap.add_argument("--fresh-bytes", type=float, default=0, help="memory the run had to fault in (its peak RSS)")
    a = ap.parse_args()
    recs = [json.loads(l) for l in open(a.trace)]
    reqs = [[(r["layer"], e["id"]) for e in r["experts"]] for r in recs]
    passes = len({r["token"] for r in recs})
    eb, sb, spine_file, emb_skip, emb_row = expert_and_spine_bytes(a.model)
    miss = opt_misses(reqs, a.slots)
    # from cold caches the spine is read once too; of an untied embedding table only the rows of the
    # positions that run have to be read (the trace's token field is a pass's first position)
    positions = max(r["token"] for r in recs) + 1
    spine_must = spine_file - emb_skip + (positions * emb_row if emb_skip else 0)
    io = (miss * eb + spine_must) / (a.disk_gbs * 1e9)
    touched = passes * sb + sum(len(r) for r in reqs) * eb
    comp = touched / (a.mem_gbs * 1e9)
    out = {"forward_passes": passes, "expert_bytes": eb, "spine_touched_per_pass": sb, "spine_file_bytes": spine_file,
           "spine_must_read_bytes": spine_must, "opt_misses": miss, "must_read_gb": (miss * eb + spine_must) / 1e9, "io_floor_s": io, "weights_touched_gb": touched / 1e9,
           "compute_floor_s": comp, "floor_s": io + comp}
    if a.wall:
        out["wall_s"] = a.wall
        out["pct_of_floor"] = 100 * (io + comp) / a.wall
    if a.touch_gbs and a.fresh_bytes:
        # not part of the floor: on a host that backs memory lazily every byte a run holds must be
        # faulted in first, at the measured speed, overlapping the reads at best
        touch = a.fresh_bytes / (a.touch_gbs * 1e9)
        out["first_touch_s"] = touch
        out["floor_incl_first_touch_s"] = max(io, touch) + comp
        if a.wall:
            out["pct_of_floor_incl_first_touch"] = 100 * (max(io, touch) + comp) / a.wall
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
