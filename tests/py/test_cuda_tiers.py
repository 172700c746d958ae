"""--gpu-memory (run/eval/serve) and the CUDA backend's memory tiers.

In any build: a bad --gpu-memory is refused with one line and exit 2, and on
the CPU backend the option changes nothing (logits bit for bit). On a CUDA
build with a device, tests/tools/cuda_tiers.py runs tiny MoE models with a
VRAM budget so small that only a few experts fit and the host expert cache
at its minimum: logits equal the CPU's (rel L2 <= 1e-3, same argmax), 32
greedy tokens identical, evictions in the stats; the spine over the budget
stays in host memory; --gpu-memory 1M is refused with the numbers."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import MODELS, REPO
from test_cuda import need_gpu, run

MODEL = MODELS / "qwen3-moe-bf16"


def ids():
    return ",".join(map(str, json.loads((MODEL / "golden.json").read_text())["ids"][:8]))


def test_gpu_memory_bad_value(dfbin):
    for cmd in ("eval", "run", "serve"):
        for bad in ("lots", "0", "-5G"):
            p = run([dfbin, cmd, "--model", str(MODEL), "--gpu-memory", bad], check=False)
            assert p.returncode == 2, (cmd, bad, p.returncode, p.stderr)
            assert f"--gpu-memory: expected a size like 24G, got '{bad}'" in p.stderr, (cmd, bad, p.stderr)


def test_gpu_memory_changes_nothing_on_cpu(dfbin, tmp_path):
    outs = []
    for extra in ([], ["--gpu-memory", "1M"], ["--gpu-memory", "64G"]):
        out = tmp_path / f"l{len(outs)}.f32"
        run([dfbin, "eval", "--backend", "cpu", "--model", str(MODEL), "--ids", ids(), "--dump-logits", str(out)] + extra)
        outs.append(np.fromfile(out, dtype="<f4"))
    assert outs[0].size > 0 and all(np.array_equal(o, outs[0]) for o in outs[1:])


def test_inspect_says_where_on_cpu(dfbin):
    p = run([dfbin, "inspect", "--model", str(MODEL), "--backend", "cpu", "--gpu-memory", "1G"])
    assert "backend      cpu" in p.stdout and "host memory" in p.stdout, p.stdout


def test_cuda_tiers(dfbin, tmp_path):
    need_gpu(dfbin, tmp_path)
    p = run([sys.executable, str(REPO / "tests" / "tools" / "cuda_tiers.py"), dfbin], check=False)
    assert p.returncode == 0, p.stdout + p.stderr
