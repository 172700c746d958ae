#!/usr/bin/env python3
"""Compares `deltafin eval --dump-logits` files of the same ids (float32 [n x vocab]) position by position: the first
file is the reference; for every other file, the largest per-position relative L2 error against it (over all rows, and
over the rows from FROM on: the decode steps of `eval --decode-from FROM`) and whether every row's argmax agrees.
Exit 1 when an error exceeds 1e-3 (issue 13's bound) or an argmax differs.

Usage: logits_cmp.py VOCAB FROM REF.f32 OTHER.f32 [OTHER.f32 ...]"""
import sys

import numpy as np

V, frm = int(sys.argv[1]), int(sys.argv[2])
names = sys.argv[3:]
ref = np.fromfile(names[0], dtype="<f4").reshape(-1, V)
ok = True
for nm in names[1:]:
    got = np.fromfile(nm, dtype="<f4").reshape(-1, V)
    if got.shape != ref.shape:
        print(f"{nm}: {got.shape[0]} rows, the reference has {ref.shape[0]}  FAILED")
        ok = False
        continue
    rel = np.linalg.norm(got - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
    same = got.argmax(1) == ref.argmax(1)
    good = bool(rel.max() <= 1e-3 and same.all())
    print(f"{nm} against {names[0]}: rel L2 max {rel.max():.3g} (rows {frm}.. {rel[frm:].max() if rel.shape[0] > frm else 0:.3g}, "
          f"median {np.median(rel):.3g}), argmax equal in {int(same.sum())} of {len(same)} rows  {'ok' if good else 'FAILED'}")
    ok &= good
sys.exit(0 if ok else 1)
