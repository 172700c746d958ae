#!/usr/bin/env bash
# r17_diag.sh STAGE - why the gate-once MoE (DELTAFIN_CUDA_LEAN bit 268435456) read other ids run to run in r17_ab.sh:
# 128-token runs (as r17_ab) of the default and of the bit (plain, h read through L2 only with DELTAFIN_CUDA_H_CG=1,
# programmatic launches off), each run's id line against the default's first: the first position that differs and
# any stderr line of the run.
set -u
S=${1:?stage}
OUT=${OUT:-/tmp/r17d}
mkdir -p "$OUT"
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$S/lib:/usr/local/cuda/lib64:${CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=$S/bin/deltafin
M=/tmp/moe4
[ -f "$M/model.safetensors" ] || python3 "$S/make_moe.py" "$M" --layers 4 >"$OUT/moe_gen.log" 2>&1
DEF=${R17_DEF:-247331694} # round 15's default (round 17's is DEF | 268435456)
G=$((DEF | 268435456))
IDS=$(python3 -c "print(','.join(str(3 + i * 37 % 8000) for i in range(512)))")
one() { # NAME ENV...
    local name=$1
    shift 1
    env "$@" timeout 120 "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new 128 --ignore-eos --print-ids --stats --gpu-memory 100G >"$OUT/$name.out" 2>"$OUT/$name.err"
    local rc=$?
    grep -E '^[0-9 ]+$' "$OUT/$name.out" >"$OUT/$name.ids"
    [ -f "$OUT/ref.ids" ] || cp "$OUT/$name.ids" "$OUT/ref.ids"
    echo "$name rc $rc $(grep -h '^\[stats\] prefill' "$OUT/$name.out" "$OUT/$name.err" | sed 's/.*(\([0-9.]*\) tok\/s,.*/\1/') tok/s lines $(wc -l <"$OUT/$name.ids") $(python3 -c '
import sys
a = open(sys.argv[1]).read().split(); b = open(sys.argv[2]).read().split()
d = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
print("same" if d is None and len(a) == len(b) else "differs at %s (%d vs %d ids): %s / %s" % (d, len(a), len(b), " ".join(a[d:d+6]) if d is not None else "", " ".join(b[d:d+6]) if d is not None else ""))' "$OUT/$name.ids" "$OUT/ref.ids")"
    grep -v "^\[stats\]" "$OUT/$name.err" | head -3
}
for r in 1 2 3; do
    one base$r DELTAFIN_CUDA_LEAN=$DEF
    one gate$r DELTAFIN_CUDA_LEAN=$G
    one gcg$r DELTAFIN_CUDA_LEAN=$G DELTAFIN_CUDA_H_CG=1
done
one gnopdl1 DELTAFIN_CUDA_LEAN=$((G & ~32))
one gnopdl2 DELTAFIN_CUDA_LEAN=$((G & ~32))
head -c 400 "$OUT/ref.ids"; echo
