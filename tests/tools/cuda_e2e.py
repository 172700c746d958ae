#!/usr/bin/env python3
"""End-to-end check of the CUDA backend: for every tiny test model with a
golden.json (tests/data/models), one teacher-forced `deltafin eval` pass over
its golden ids with --backend cpu and with --backend cuda; the logits must
agree per position (rel L2 <= 1e-3) and have the same argmax.

    cuda_e2e.py DELTAFIN_BIN [MODEL_DIR ...]

Prints one line per model and exits 1 on any mismatch, 2 when the binary
cannot run the CUDA backend. Needs a CUDA build (make CUDA=1) and a GPU."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
TOL = 1e-3


def eval_logits(binary, model, ids, backend, out):
    p = subprocess.run([binary, "eval", "--backend", backend, "--model", str(model), "--ids", ",".join(map(str, ids)),
                        "--dump-logits", str(out)], capture_output=True, text=True, timeout=600)
    if p.returncode:
        return None, p.stderr.strip()
    return np.fromfile(out, dtype="<f4"), p.stderr.strip()


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    models = [pathlib.Path(m) for m in sys.argv[2:]] or sorted(d for d in (REPO / "tests" / "data" / "models").iterdir()
                                                                 if (d / "golden.json").is_file())
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            g = json.loads((m / "golden.json").read_text())
            ids, V = g["ids"], g["vocab_size"]
            cpu, err_c = eval_logits(binary, m, ids, "cpu", pathlib.Path(tmp) / "cpu.f32")
            gpu, err_g = eval_logits(binary, m, ids, "cuda", pathlib.Path(tmp) / "cuda.f32")
            if cpu is None or gpu is None:
                print(f"FAIL {m.name}: eval failed: cpu: {err_c!r} cuda: {err_g!r}")
                if gpu is None and ("without CUDA" in err_g or "no CUDA device" in err_g):
                    return 2
                bad += 1
                continue
            if cpu.size != len(ids) * V or gpu.size != cpu.size:
                print(f"FAIL {m.name}: {cpu.size} cpu and {gpu.size} cuda logits, expected {len(ids) * V}")
                bad += 1
                continue
            cpu, gpu = cpu.reshape(len(ids), V), gpu.reshape(len(ids), V)
            rel = np.linalg.norm(gpu - cpu, axis=1) / np.maximum(np.linalg.norm(cpu, axis=1), 1e-30)
            same = int((gpu.argmax(1) == cpu.argmax(1)).sum())
            ok = bool(np.all(rel <= TOL)) and same == len(ids) and np.all(np.isfinite(gpu))
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {m.name}: {len(ids)} positions, max rel L2 {rel.max():.3g}, argmax equal at {same}/{len(ids)}"
                  + (f"; cuda stderr: {err_g[:300]!r}" if err_g and not ok else ""))
    print(f"cuda_e2e: {len(models)} models, {bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
