#!/usr/bin/env bash
# device_run.sh - runs ON the GPU machine (the `run` tool of the device
# library), from the repository root there, out of the folder that
# tools/cuda_device.sh staged (bin/, lib/, this script, cuda_e2e.py):
#   1. test_backend_cuda, then the op-by-op conformance test against the CPU
#      reference (test_backend_ops --backend cuda --ref cpu-scalar);
#   2. the model parity test (cuda_e2e.py: every tiny model in
#      tests/data/models, logits per position and 32 greedy tokens, CUDA vs CPU);
#   3. the benchmark (cuda_bench: floors and our rates);
#   4. with E2E=1 (the default; E2E=0 skips it): a synthetic DeepSeek-V3
#      checkpoint of E2E_LAYERS layers (bench/make_synthetic_dsv3.py, written
#      on the device's disk) decoded by `deltafin run --backend cuda --stats`.
# Logs go to $OUT (machine.txt, conformance.log, parity.log, bench.log,
# e2e.log); a summary to stdout. Exit status: the number of failed steps.
set -u
S=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/cuda_out}
mkdir -p "$OUT"
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$S/lib:/usr/local/cuda/lib64:${CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fail=0
step() { # name timeout log cmd...
    local name=$1 to=$2 log=$3
    shift 3
    local t0=$SECONDS
    timeout "$to" "$@" >"$OUT/$log" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $((SECONDS - t0)) s ($log)"
    [ "$rc" -eq 0 ] || fail=$((fail + 1))
    return $rc
}
{ date -u; nvidia-smi; nvcc --version 2>/dev/null | tail -1; uname -a; nproc; ldd "$S/bin/deltafin"; } >"$OUT/machine.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader

step "test_backend_cuda" 60 cuda_unit.log "$S/bin/test_backend_cuda"
tail -2 "$OUT/cuda_unit.log"
step "conformance (test_backend_ops --backend cuda --ref cpu-scalar)" 240 conformance.log "$S/bin/test_backend_ops" --backend cuda --ref cpu-scalar
grep -E "FAIL|failures" "$OUT/conformance.log" | tail -15
step "model parity (cuda_e2e.py)" 300 parity.log python3 "$S/cuda_e2e.py" "$S/bin/deltafin"
cat "$OUT/parity.log" | cut -c1-200
step "benchmark (cuda_bench)" 300 bench.log "$S/bin/cuda_bench" ${BENCH_ARGS:-}
cat "$OUT/bench.log"
if [ "${E2E:-1}" = 1 ]; then
    M=/tmp/dsv3-synth
    L=${E2E_LAYERS:-3}
    step "synthetic DeepSeek-V3 ($L layers) written" 240 e2e_gen.log python3 bench/make_synthetic_dsv3.py "$M" --layers "$L" --experts "${E2E_EXPERTS:-64}" &&
        step "deltafin run --backend cuda (synthetic DeepSeek-V3)" 240 e2e.log \
            "$S/bin/deltafin" run --backend cuda --model "$M" --ids 1,2,3,4,5,6,7,8 --max-new 32 --ignore-eos --print-ids --stats
    tail -5 "$OUT/e2e_gen.log" "$OUT/e2e.log" 2>/dev/null
fi
echo "device_run: $fail failed steps"
exit $fail
