#!/usr/bin/env bash
# spec_cuda.sh STAGE MODEL - speculative decoding on the GPU machine (issue 15 item 5 with the CUDA backend): the rows
# of bench/spec_bench.sh (default ROWS="edit chat") with every run on `--backend cuda`, the arms interleaved, the ids
# of every arm compared with --spec none's, from the checkout on the device; STAGE the folder tools/cuda_device.sh
# staged (its deltafin), MODEL the default SmolLM2 GGUF. The model (98 MB) does not fit one call's 64 MiB with the
# tree: carry it in parts (split -b) over calls a few seconds apart, each copying its part to /tmp (the machine
# stays warm 30 s), and cat them here first: MODEL_PARTS="/tmp/m/p1 .whl/p2" writes MODEL from them.
# Env: REPS (default 3), MAX_NEW (default 200), SPEC_MAX (default 8), ROWS; THREADS (the host side's, default 1).
set -euo pipefail
S=${1:?stage}
MODEL=${2:?model}
. "$(dirname "$0")/dev_env.sh"
if [ -n "${MODEL_PARTS:-}" ]; then
    mkdir -p "$(dirname "$MODEL")"
    # shellcheck disable=SC2086
    cat $MODEL_PARTS >"$MODEL"
fi
ls -la "$MODEL"
sha256sum "$MODEL"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader || true
DELTAFIN_BIN=$BIN RUN_ARGS="--backend cuda ${RUN_ARGS:-}" ROWS=${ROWS:-edit chat} bash bench/spec_bench.sh "$MODEL"
