#!/usr/bin/env bash
# Over-RAM GGUF MoE benchmark (issue 7): a BF16 GGUF with Qwen3-30B-A3B
# shapes, 30 layers (~38.7 GB, over 1.5x RAM), real Qwen3 tokenizer. From
# dropped page caches: prompt "The capital of France is" + 64 greedy tokens.
# Reports wall time, time to first token, decode tok/s, bytes read, and the
# floor (bench/io_floor.py: bytes that had to be read / O_DIRECT disk
# bandwidth + weight bytes touched / memory bandwidth, both measured here).
# Also reported, outside the issue's floor: the first-touch speed of fresh
# memory (deltafin bench first-touch, after dropping caches) and a floor that
# counts faulting in the run's peak RSS at that speed.
# llama.cpp's time for this run on this machine type: 41.5 s (issue 7).
#
# Usage: bench/gguf_moe_bench.sh [FILE.gguf]   (generated if absent)
set -euo pipefail
cd "$(dirname "$0")/.."
G=${1:-bench/data/qwen3moe-30l.gguf}
BIN=${DELTAFIN_BIN:-./deltafin}
[ -f "$G" ] || python3 bench/make_synthetic_qwen3moe_gguf.py "$G" --layers 30
echo "machine: $(nproc) cores, $(free -g | awk '/Mem/{print $2}') GiB RAM, $(lscpu | sed -n 's/^Model name: *//p'); $(date -u)"
ls -la "$G"
FL=$($BIN bench floors); echo "$FL"
D8=$($BIN bench-disk "$G" --max 4G --qd 8); echo "$D8"
D32=$($BIN bench-disk "$G" --max 4G --qd 32); echo "$D32"
DK=$(python3 -c "import json,sys; a,b=json.loads(sys.argv[1]),json.loads(sys.argv[2]); print(json.dumps(a if a['disk_read_gbs']>=b['disk_read_gbs'] else b))" "$D8" "$D32")
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo "page caches dropped" || echo "(could not drop page caches)"
t0=$(date +%s.%N)
$BIN run --model "$G" --prompt "The capital of France is" --max-new 64 --ignore-eos --stats --trace /tmp/gguf_moe_trace.jsonl 2> /tmp/gguf_moe_stats.txt
t1=$(date +%s.%N)
cat /tmp/gguf_moe_stats.txt
WALL=$(python3 -c "print($t1 - $t0)")
echo "wall time (process start to exit, incl. load): $WALL s"
SLOTS=$(sed -n 's/.*cache \([0-9]*\) slots.*/\1/p' /tmp/gguf_moe_stats.txt)
MEM=$(python3 -c "import json,sys; print(json.loads('''$FL''')['mem_read_gbs'])")
DISK=$(python3 -c "import json; print(json.loads('''$DK''')['disk_read_gbs'])")
# first-touch speed of fresh memory after dropping caches (what a cold start must fault in: the peak RSS)
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; sleep 10
FT=$($BIN bench first-touch --size 2G); echo "$FT"
TOUCH=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['first_touch_gbs'])" "$FT")
RSS=$(sed -n 's/.*peak RSS \([0-9.]*\) MB.*/\1/p' /tmp/gguf_moe_stats.txt)
python3 bench/io_floor.py --trace /tmp/gguf_moe_trace.jsonl --model "$G" --slots "$SLOTS" --disk-gbs "$DISK" --mem-gbs "$MEM" --wall "$WALL" \
    --touch-gbs "$TOUCH" --fresh-bytes "$(python3 -c "print($RSS * 1e6)")"
