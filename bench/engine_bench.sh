#!/usr/bin/env bash
# engine_bench.sh - CPU decode/prefill against the floors measured in the same run
# (issues 2 and 6). Prints the machine, the date, `deltafin bench floors`, the
# SmolLM2-135M Q4_1 decode/prefill and the synthetic DeepSeek-V3 FP8 run.
#   BIN=build-perf/deltafin DELTAFIN_HOME=/tmp/dfhome REPS=3 bench/engine_bench.sh
# The DS-V3 part needs bench/data/dsv3-fp8 (python3 bench/make_synthetic_dsv3.py
# bench/data/dsv3-fp8 --layers 2 --experts 128; 10 GB, ~20 s to load); skipped if absent.
set -euo pipefail
BIN=${BIN:-build-perf/deltafin}
REPS=${REPS:-3}
echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo ?)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== floors (best of $REPS)"
for i in $(seq "$REPS"); do "$BIN" bench floors; done
echo "== SmolLM2-135M Q4_1: 4-token prompt, 128 new tokens (best of $REPS by decode tok/s)"
for i in $(seq "$REPS"); do
    "$BIN" run --prompt "Once upon a time" --max-new 128 --ignore-eos --stats 2>&1 >/dev/null | grep -E '^\[stats\] prefill' || true
done | sort -t'(' -k3 -g | tail -n "$REPS"
echo "== SmolLM2-135M Q4_1: 64-token prompt prefill"
IDS=$(python3 -c "print(','.join(str(i*131%49000+10) for i in range(64)))")
for i in $(seq "$REPS"); do
    "$BIN" run --ids "$IDS" --max-new 1 --ignore-eos --print-ids --stats 2>&1 >/dev/null | grep -E '^\[stats\] prefill' || true
done
if [ -d bench/data/dsv3-fp8 ]; then
    echo "== DeepSeek-V3 shapes, FP8 block-scaled + BF16 head (bench/data/dsv3-fp8): 64-token prefill, 32 decode"
    IDS=$(python3 -c "print(','.join(str(i*37%129000+10) for i in range(64)))")
    "$BIN" run --model bench/data/dsv3-fp8 --ids "$IDS" --max-new 32 --ignore-eos --print-ids --stats 2>&1 >/dev/null | grep '^\[stats\]'
    "$BIN" inspect --model bench/data/dsv3-fp8 2>/dev/null | grep -iE 'active|flop' | head -5 || true
fi
echo "== floors after the runs"
"$BIN" bench floors
