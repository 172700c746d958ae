#!/usr/bin/env python3
"""Replays an expert trace (deltafin run --trace FILE) against cache
policies and sizes, to choose the eviction policy by measurement.

Policies: LRU; LFU (ties by recency); HOT+LRU (the most frequent experts of
the first half of the trace pinned in a quarter of the slots, LRU for the
rest); OPT (Belady: evict the expert used furthest in the future, the upper
bound no online policy beats). Each (token, layer) record is one request of
its experts; the experts of the layer being computed are pinned while it
runs, as in the engine.

Usage: replay_policies.py TRACE.jsonl [--slots 16,32,64,...]"""
import argparse
import collections
import json


def load(path):
    reqs = []
    for line in open(path):
        r = json.loads(line)
        reqs.append([(r["layer"], e["id"]) for e in r["experts"]])
    return reqs


def simulate(reqs, slots, policy):
    cache, last, freq = set(), {}, collections.Counter()
    hits = total = 0
    hot = set()
    if policy == "hot+lru":
        first = collections.Counter(k for r in reqs[: len(reqs) // 2] for k in r)
        hot = {k for k, _ in first.most_common(slots // 4)}
    future = collections.defaultdict(collections.deque)
    if policy == "opt":
        for i, r in enumerate(reqs):
            for k in r:
                future[k].append(i)
    clock = 0
    for i, r in enumerate(reqs):
        pinned = set(r)
        for k in r:
            clock += 1
            total += 1
            if policy == "opt":
                future[k].popleft()
            if k in cache:
                hits += 1
            else:
                if len(cache) >= slots:
                    cand = [c for c in cache if c not in pinned and c not in hot] or [c for c in cache if c not in pinned]
                    if not cand:  # every slot holds an expert of this request: not cached
                        last[k] = clock
                        freq[k] += 1
                        continue
                    if policy == "lfu":
                        victim = min(cand, key=lambda c: (freq[c], last[c]))
                    elif policy == "opt":
                        victim = max(cand, key=lambda c: future[c][0] if future[c] else 1 << 60)
                    else:
                        victim = min(cand, key=lambda c: last[c])
                    cache.discard(victim)
                cache.add(k)
            last[k] = clock
            freq[k] += 1
    return hits / total if total else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--slots", default="8,16,32,64,128")
    a = ap.parse_args()
    reqs = load(a.trace)
    experts = len({k for r in reqs for k in r})
    print(f"{len(reqs)} requests, {sum(map(len, reqs))} expert uses, {experts} distinct experts")
    print("slots   " + "".join(f"{p:>10}" for p in ["lru", "lfu", "hot+lru", "opt"]))
    for s in map(int, a.slots.split(",")):
        print(f"{s:<8}" + "".join(f"{simulate(reqs, s, p):>10.3f}" for p in ["lru", "lfu", "hot+lru", "opt"]))


if __name__ == "__main__":
    main()
