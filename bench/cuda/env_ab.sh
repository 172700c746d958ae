#!/usr/bin/env bash
# env_ab.sh STAGE ARM... - A/B of the resident decode under environment settings, on the GPU machine (issue 13 item
# 5a): each ARM is NAME or NAME:VAR=VALUE[,VAR=VALUE...] (NAME alone: the build's defaults; SPEC=MODE: --spec MODE), run alternated AB_REPS
# times (default 3) at each prompt length of AB_LENS (default "512 2048"), 128 decode tokens, greedy, on the synthetic
# Qwen3-30B-A3B-shape BF16 model (make_moe.py, 4 layers; AB_VOCAB=151936: with Qwen3's own vocabulary size;
# AB_MODEL=dsv3: the DeepSeek-V3-shape FP8 one of bench/make_synthetic_dsv3.py, 4 layers, 32 experts). Prints a line
# a run (decode tok/s, the ids against the first run of that length) and, per arm and length, the mean and its share
# of the HBM floor measured first (cuda_bench --floor) at the model's weight bytes a token (from --stats).
set -u
S=${1:?stage}
shift
OUT=${OUT:-/tmp/envab}
mkdir -p "$OUT"
. "$(dirname "$0")/dev_env.sh"
if [ "${AB_MODEL:-qwen3}" = dsv3 ]; then
    M=/tmp/dsv3
    V=8092
    [ -f "$M/model.safetensors.index.json" ] || timeout 400 python3 bench/make_synthetic_dsv3.py "$M" --layers 4 --experts 32 --vocab 8192 >"$OUT/gen.log" 2>&1
elif [ -n "${AB_VOCAB:-}" ]; then # the same model with a vocabulary of AB_VOCAB (151936: Qwen3's own)
    M=/tmp/moe4-v$AB_VOCAB
    V=8000
    [ -f "$M/model.safetensors" ] || python3 "$(dirname "$0")/make_moe.py" "$M" --layers 4 --vocab "$AB_VOCAB" >"$OUT/gen.log" 2>&1
else
    M=/tmp/moe4
    V=8000
    [ -f "$M/model.safetensors" ] || python3 "$S/make_moe.py" "$M" --layers 4 >"$OUT/gen.log" 2>&1
fi
"$S/bin/cuda_bench" --floor >"$OUT/floor.log" 2>&1
FLOOR=$(grep -o 'HBM read [0-9.]* GB/s' "$OUT/floor.log" | grep -o '[0-9.]*' | head -1)
echo "floor: HBM read $FLOOR GB/s; model $M"
: >"$OUT/tps.txt"
for n in ${AB_LENS:-512 2048}; do
    IDS=$(python3 -c "import sys; print(','.join(str(3 + i * 37 % $V) for i in range($n)))")
    rm -f "$OUT/ref$n.ids"
    for r in $(seq "${AB_REPS:-3}"); do
        for arm in "$@"; do
            name=${arm%%:*}
            envs=()
            [ "$name" != "$arm" ] && IFS=, read -r -a envs <<<"${arm#*:}"
            opts=() # SPEC=MODE among an arm's settings: --spec MODE (not an environment variable)
            for i in "${!envs[@]}"; do
                case ${envs[$i]} in SPEC=*) opts+=(--spec "${envs[$i]#SPEC=}"); unset "envs[$i]" ;; esac
            done
            env "${envs[@]}" timeout 200 "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new 128 --ignore-eos --print-ids --stats \
                --gpu-memory 100G "${opts[@]}" >"$OUT/run.out" 2>"$OUT/run.log"
            rc=$?
            tps=$(grep -h '^\[stats\] prefill' "$OUT/run.log" | sed 's/.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1/' | head -1)
            gbs=$(grep -h '^\[stats\] prefill' "$OUT/run.log" | sed 's/.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\2/' | head -1)
            grep -E '^[0-9 ]+$' "$OUT/run.out" >"$OUT/cur.ids"
            [ -f "$OUT/ref$n.ids" ] || cp "$OUT/cur.ids" "$OUT/ref$n.ids"
            same=$(cmp -s "$OUT/cur.ids" "$OUT/ref$n.ids" && echo same || echo DIFFER)
            echo "$name p$n rc $rc decode ${tps:-?} tok/s ($gbs GB/s of weights), ids $same; $(grep -h '^\[stats\] spec' "$OUT/run.log" | head -1 | cut -c9-130)"
            grep -h " timeline over \| graphs: " "$OUT/run.log" | head -12 # DELTAFIN_CUDA_ATTN_TS / DELTAFIN_CUDA_MLA_TS / DELTAFIN_CUDA_GRAPH_STATS
            [ "$rc" = 0 ] || tail -3 "$OUT/run.log"
            echo "$name $n ${tps:-0} ${gbs:-0}" >>"$OUT/tps.txt"
        done
    done
done
python3 - "$OUT/tps.txt" "$FLOOR" <<'PY'
import sys, collections
f = float(sys.argv[2] or 0)
d = collections.OrderedDict()
for line in open(sys.argv[1]):
    a, n, t, g = line.split()
    d.setdefault((a, n), []).append((float(t), float(g)))
for (a, n), v in d.items():
    t = sum(x for x, _ in v) / len(v); g = sum(y for _, y in v) / len(v)
    print(f"{a:12s} p{n}: mean {t:8.1f} tok/s ({', '.join(f'{x:.1f}' for x, _ in v)}), {g:.1f} GB/s = {100 * g / f if f else 0:.1f}% of the floor")
PY
