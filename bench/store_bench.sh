#!/usr/bin/env bash
# Over-RAM streaming benchmark (issue 4): a synthetic checkpoint with real
# DeepSeek-V3 / Kimi-K2 expert shapes (hidden 7168, expert width 2048, FP8
# with 128x128 block scales, 256 experts, top-8), 4 layers (1 dense + 3 MoE),
# ~39 GB: over 1.5x this machine's 24 GiB. Measures, in the same run, the
# disk floor (O_DIRECT 4 MiB reads at queue depth 8 through io_uring), then
# runs a 16-token prompt + 32 greedy tokens with --stats and --trace, and
# replays the trace against eviction policies.
#
# Usage: bench/store_bench.sh [MODEL_DIR]   (generated if absent)
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:-bench/data/dsv3-big}
BIN=${DELTAFIN_BIN:-./deltafin}
[ -f "$M/config.json" ] || python3 bench/make_synthetic_dsv3.py "$M" --layers 4 --experts 256
echo "machine: $(nproc) cores, $(free -g | awk '/Mem/{print $2}') GiB RAM, $(lscpu | sed -n 's/^Model name: *//p'); $(date -u)"
echo "model: $(du -sh "$M" | cut -f1) on disk"
$BIN bench floors
$BIN bench-disk "$(ls -S "$M"/*.safetensors | head -1)"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(could not drop page caches; experts are read with O_DIRECT anyway)"
PROMPT=$(python3 -c "print(','.join(str(i * 37 % 129000 + 10) for i in range(16)))")
$BIN run --model "$M" --ids "$PROMPT" --max-new 32 --ignore-eos --print-ids --stats --trace /tmp/store_bench_trace.jsonl > /dev/null
python3 bench/replay_policies.py /tmp/store_bench_trace.jsonl --slots 128,256,384,512
