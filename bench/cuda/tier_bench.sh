#!/bin/bash
# tier_bench.sh - issue 13 item 5c on a GPU: a synthetic Qwen3-30B-A3B-shape
# BF16 MoE (4 layers, 4.97 GB: bench/cuda/make_moe.py, written here) decoded
# with --gpu-memory 2500M (the model is twice the budget) and the experts fed
# from the pinned host expert cache (--expert-cache 8G holds them all, a
# 64-token prompt reads them in), against the pinned host->device bandwidth
# measured in the same run (bench/cuda/h2d_bw.cu). Then the same with LFU
# eviction, a run with a host cache smaller than the model (SSD -> pinned RAM
# -> VRAM), runs with --gpu-memory 600M (the cache holds ~1/9 of the
# experts), with the experts in pageable host memory (no --expert-cache),
# and runs with the whole model in VRAM (from host memory, and through the
# host expert cache): all must
# give the same token ids. With TRACE=1 also writes an expert trace to OUTDIR
# (for bench/cuda/vcache_replay.c).
#
# Usage: tier_bench.sh DELTAFIN H2D_BW [WORK (default /tmp/tierbench)] [OUTDIR]
set -u
BIN=$1 BW=$2 W=${3:-/tmp/tierbench} OUT=${4:-$W}
mkdir -p "$W" "$OUT"
D=$(cd "$(dirname "$0")" && pwd)
[ -f "$W/moe4/model.safetensors" ] || python3 "$D/make_moe.py" "$W/moe4" --layers 4 || exit 1
"$BW" 2048 || exit 1
IDS=$(python3 -c 'print(",".join(str(3 + i * 37 % 8000) for i in range(64)))')
run() { # name, then options
    local name=$1; shift
    echo "== $name: $*"
    timeout 300 "$BIN" run --backend cuda --model "$W/moe4" --ids "$IDS" --max-new 64 --ignore-eos --print-ids --stats "$@" \
        >"$W/ids_$name.txt" 2>"$W/err_$name.txt"
    echo "exit $?"
    grep -E "^\[stats\] (prefill|vram|host|decode)|out of VRAM|stay in host|cuda backend" "$W/err_$name.txt" | head -12
}
run lru --gpu-memory 2500M --expert-cache 8G
DELTAFIN_CUDA_EVICT=lfu run lfu --gpu-memory 2500M --expert-cache 8G
run tight --gpu-memory 600M --expert-cache 8G
DELTAFIN_CUDA_EVICT=lfu run tight-lfu --gpu-memory 600M --expert-cache 8G
run tight-nopf --gpu-memory 600M --expert-cache 8G --prefetch never
run ssd --gpu-memory 1G --expert-cache 1500M
run resident --gpu-memory 20G
run streamed-all --gpu-memory 20G --expert-cache 8G
run tight-pageable --gpu-memory 600M
run tight-again --gpu-memory 600M --expert-cache 8G
[ -n "${TRACE:-}" ] && run trace --gpu-memory 2500M --expert-cache 8G --trace "$OUT/trace_lru.jsonl"
for n in lfu tight tight-lfu tight-nopf ssd resident streamed-all tight-pageable tight-again; do
    cmp -s "$W/ids_lru.txt" "$W/ids_$n.txt" && echo "ids $n: same as lru" || echo "ids $n: DIFFER from lru"
done
