#!/bin/bash
# tier_device_run.sh - what one call on the GPU machine runs for the CUDA tiers
# (issue 13 items 3 and 5c): binaries built here with `make CUDA=1` and the
# shared libraries the machine lacks (libmicrohttpd, liburing) are staged in
# STAGE (default .whl/ctier, carried); it runs the op-by-op conformance test,
# the all-models parity check (tests/tools/cuda_e2e.py), the tier checks
# (tests/tools/cuda_tiers.py) and the tier benchmark (tier_bench.sh), and
# leaves its logs and traces in $OUT.
#
# Stage (here):  S=/work/main/.whl/ctier; mkdir -p $S/lib
#                cp build-cuda/deltafin build-cuda/tests/test_backend_ops $S/
#                nvcc -O2 -arch=sm_90 -o $S/h2d_bw bench/cuda/h2d_bw.cu
#                cp /lib/x86_64-linux-gnu/{libmicrohttpd.so.12,liburing.so.2} $S/lib/
#                cp tests/tools/cuda_tiers.py tests/tools/cuda_e2e.py bench/cuda/*.sh bench/cuda/make_moe.py $S/
# Run (device):  bash .whl/ctier/device_run.sh
S=${STAGE:-.whl/ctier}
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=$PWD/$S/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
BIN=$PWD/$S/deltafin
nvidia-smi --query-gpu=name,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current --format=csv
python3 -c "import numpy" 2>/dev/null && NP=1 || NP=0
echo "== test_backend_ops"; timeout 120 "$S/test_backend_ops" --backend cuda --ref cpu-scalar 2>&1 | tail -2
echo "== cuda_tiers"; timeout 240 python3 "$S/cuda_tiers.py" "$BIN" tests/data/models/qwen3-moe-bf16 tests/data/models/deepseek-v3-bf16 2>&1 | tail -30
if [ $NP = 1 ]; then echo "== cuda_e2e"; timeout 240 python3 "$S/cuda_e2e.py" "$BIN" 2>&1 | tail -20; else echo "== cuda_e2e skipped: no numpy"; fi
echo "== tier_bench"; bash "$S/tier_bench.sh" "$BIN" "$S/h2d_bw" /tmp/tierbench "$OUT" 2>&1
