#!/usr/bin/env bash
# cpu_ab_bench.sh - two deltafin binaries (OLD, NEW) side by side on the CPU:
# decode of 128 tokens and prefill of 512 tokens per model, arms interleaved
# (OLD NEW, NEW OLD, ...), generated ids compared, medians and min-max, with
# `deltafin bench floors` of the same run. For builds older than
# `run --stats-json` (which `deltafin bench` needs); newer pairs: use
# `deltafin bench decode|prefill --arm ...`.
#   OLD=/tmp/df-old NEW=./build/deltafin REPS=5 THREADS=2 MODELS="a.gguf b.gguf" bench/cpu_ab_bench.sh
set -euo pipefail
OLD=${OLD:?set OLD to the baseline binary}
NEW=${NEW:-./build/deltafin}
REPS=${REPS:-5}
THREADS=${THREADS:-2}
MODELS=${MODELS:-$HOME/.cache/deltafin/models/smollm2-135m-instruct/model.gguf}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
IDS512=$(python3 -c "print(','.join(str(i*37%49000+10) for i in range(512)))")
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "floors: $("$NEW" bench floors --threads "$THREADS")"
rate() { sed -n "s/.*$1 [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s.*/\1/p" "$2" | head -1; }
med() { python3 -c "import sys,statistics as s; v=[float(x) for x in sys.argv[1:]]; print(f'{s.median(v):.1f} ({min(v):.1f}-{max(v):.1f})')" "$@"; }
for M in $MODELS; do
  declare -A dec pre
  for arm in old new; do dec[$arm]=""; pre[$arm]=""; done
  for r in $(seq 1 "$REPS"); do
    order="old new"; [ $((r % 2)) = 0 ] && order="new old"
    for arm in $order; do
      B=$OLD; [ $arm = new ] && B=$NEW
      "$B" run --model "$M" --threads "$THREADS" --prompt "Once upon a time" --max-new 128 --ignore-eos --print-ids --stats >"$T/$arm.d.$r" 2>"$T/$arm.d.err"
      "$B" run --model "$M" --threads "$THREADS" --ids "$IDS512" --max-new 1 --print-ids --stats >"$T/$arm.p.$r" 2>"$T/$arm.p.err"
      dec[$arm]="${dec[$arm]} $(rate decode "$T/$arm.d.err")"
      pre[$arm]="${pre[$arm]} $(rate prefill "$T/$arm.p.err")"
    done
    cmp -s "$T/old.d.$r" "$T/new.d.$r" || echo "  ids differ (decode, rep $r)"
  done
  echo "$(basename "$M"): decode 128 tok/s old $(med ${dec[old]}) new $(med ${dec[new]}); prefill 512 tok/s old $(med ${pre[old]}) new $(med ${pre[new]})"
done
echo "floors after: $("$NEW" bench floors --threads "$THREADS")"
