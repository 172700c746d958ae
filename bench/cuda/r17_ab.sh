#!/usr/bin/env bash
# r17_ab.sh STAGE - round 17's A/B on the GPU machine (run after device_run.sh from the same stage): the resident
# decode of the synthetic Qwen3-30B-A3B-shape BF16 MoE (make_moe.py, 4 layers) with
#   base  the default mask;
#   gate1 + DELTAFIN_CUDA_LEAN bit 268435456 (the gate computed once by the gate/up launch, k_guh_rt);
#   kw2   DELTAFIN_CUDA_ATTN_KW=2 (the decode attention at 2 positions a warp);
#   both  the two together;
# alternated three times at a 512-token and a 2,048-token prompt, 128 decode tokens each, the HBM floor of this call
# first (cuda_bench --floor). Prints one line a run (tok/s, the md5 of the id line on stdout) and the mean of each
# variant; the ids of base and gate1 must be equal (the same bits), kw2's may differ (other sums in the attention).
# R17_QUICK=1: base and gate1 only; R17_DIAG=1 adds `ncread`, gate1 with DELTAFIN_CUDA_H_CG=0 (h through the
# read-only path, which read stale h in round 17's and 18's runs: its ids may differ), and gate1 without programmatic
# launches (bit 32 off); R17_LENS: the prompt lengths (default "512 2048"); R17_REPS: alternations (default 3).
# R17_TREE=1 adds `notree` (gate1 with DELTAFIN_CUDA_ATTN_TREE=0: round 20's tree combine of the decode attention off)
# and `tree17` (the tree from 17 parts, i.e. also at 512 positions' 32). R17_BIN2: a second deltafin binary (arm `prev`: gate1's mask; round 18: the build before the activations left the
# read-only path). R17_DEF: the base mask (default 247331694, round 15's default; since round 18 the build's default is
# 515767150 = 247331694 | 268435456, i.e. gate1).
set -u
S=${1:?stage}
OUT=${OUT:-/tmp/r17}
mkdir -p "$OUT"
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$S/lib:/usr/local/cuda/lib64:${CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=$S/bin/deltafin
M=/tmp/moe4
[ -f "$M/model.safetensors" ] || python3 "$S/make_moe.py" "$M" --layers 4 >"$OUT/moe_gen.log" 2>&1 || { echo "make_moe failed"; tail "$OUT/moe_gen.log"; exit 1; }
"$S/bin/cuda_bench" --floor >"$OUT/floor.log" 2>&1
grep -h "floor" "$OUT/floor.log" | head -3
DEF=${R17_DEF:-247331694} # round 15's default mask (the build's default since round 18 is DEF | 268435456)
ids_of() { python3 -c "import sys; print(','.join(str(3 + i * 37 % 8000) for i in range(int(sys.argv[1]))))" "$1"; }
P512=$(ids_of 512)
P2048=$(ids_of 2048)
one() { # NAME PROMPT_LEN ENV...
    local name=$1 n=$2
    shift 2
    local ids=$P512
    [ "$n" = 2048 ] && ids=$P2048
    env "$@" timeout 120 "${BIN2:-$BIN}" run --backend cuda --model "$M" --ids "$ids" --max-new 128 --ignore-eos --print-ids --stats --gpu-memory 100G \
        >"$OUT/run.out" 2>"$OUT/run.log"
    local rc=$?
    local tps md
    tps=$(grep -h "^\[stats\] prefill" "$OUT/run.log" | sed 's/.*(\([0-9.]*\) tok\/s,.*/\1/' | head -1)
    md=$(grep -E "^[0-9 ]+$" "$OUT/run.out" | md5sum | cut -c1-10) # stdout alone (the ids; the first version read them out of a log holding stderr too)
    [ -f "$OUT/ref$n.ids" ] || grep -E "^[0-9 ]+$" "$OUT/run.out" >"$OUT/ref$n.ids"
    local dif
    dif=$(python3 -c '
import sys
a = open(sys.argv[1]).read().split(); b = open(sys.argv[2]).read().split()
d = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
print("same as the first run" if d is None and len(a) == len(b) else "DIFFERS from the first run at id %s (%d vs %d ids)" % (d, len(a), len(b)))' "$OUT/run.out" "$OUT/ref$n.ids")
    echo "$name p$n rc $rc decode ${tps:-?} tok/s ids $md, $dif"
    grep -v "^\[stats\]" "$OUT/run.log" | head -3
    [ "$rc" = 0 ] || tail -5 "$OUT/run.log"
    echo "$name p$n ${tps:-0}" >>"$OUT/tps.txt"
}
: >"$OUT/tps.txt"
for n in ${R17_LENS:-512 2048}; do
    for r in $(seq "${R17_REPS:-3}"); do
        one base "$n" DELTAFIN_CUDA_LEAN=$DEF
        one gate1 "$n" DELTAFIN_CUDA_LEAN=$((DEF | 268435456))
        [ -n "${R17_BIN2:-}" ] && BIN2=$R17_BIN2 one prev "$n" DELTAFIN_CUDA_LEAN=$((DEF | 268435456)) # another build, the same mask
        if [ -n "${R17_TREE:-}" ]; then # round 20: the decode attention's parts combined in groups of 16 first (default from 48 parts: 2,048 positions' 128)
            one notree "$n" DELTAFIN_CUDA_LEAN=$((DEF | 268435456)) DELTAFIN_CUDA_ATTN_TREE=0
            one tree17 "$n" DELTAFIN_CUDA_LEAN=$((DEF | 268435456)) DELTAFIN_CUDA_ATTN_TREE=17
        fi
        if [ -n "${R17_DIAG:-}" ]; then # the gate-once launch with h through the read-only path, and without programmatic launches
            one ncread "$n" DELTAFIN_CUDA_LEAN=$((DEF | 268435456)) DELTAFIN_CUDA_H_CG=0
            one gate1nopdl "$n" DELTAFIN_CUDA_LEAN=$(((DEF | 268435456) & ~32))
        fi
        [ -n "${R17_QUICK:-}" ] && continue
        one kw2 "$n" DELTAFIN_CUDA_LEAN=$DEF DELTAFIN_CUDA_ATTN_KW=2
        one both "$n" DELTAFIN_CUDA_LEAN=$((DEF | 268435456)) DELTAFIN_CUDA_ATTN_KW=2
    done
done
awk '{k = $1 " " $2; s[k] += $3; c[k]++; if (!(k in mn) || $3 < mn[k]) mn[k] = $3; if ($3 > mx[k]) mx[k] = $3}
     END {for (k in s) printf "%s: mean %.1f tok/s (%.1f-%.1f) over %d runs\n", k, s[k] / c[k], mn[k], mx[k], c[k]}' "$OUT/tps.txt" | sort
