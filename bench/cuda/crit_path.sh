#!/usr/bin/env bash
# crit_path.sh STAGE - the decode's critical path kernel by kernel (issue 13 item 5a), on the GPU machine: the
# synthetic Qwen3-30B-A3B-shape BF16 model (make_moe.py, 4 layers) at 512 and 2,048 prompt tokens and, with
# CRIT_DSV3=1, the DeepSeek-V3-shape FP8 model (bench/make_synthetic_dsv3.py, 4 layers, 32 experts), each run once
# plain (tok/s) and once traced by bench/cuda/ktrace.c (CUPTI: the machine has no Nsight Systems), then crit_path.py over the last 100
# tokens. CRIT_ENV: variables for the runs (e.g. DELTAFIN_CUDA_LEAN=...); CRIT_LENS (default "512 2048").
set -u
S=${1:?stage}
OUT=${OUT:-/tmp/crit}
mkdir -p "$OUT"
. "$(dirname "$0")/dev_env.sh"
# the tracer (bench/cuda/ktrace.c) built here where a compiler and CUPTI's headers are, else KTRACE_LIB (built elsewhere)
KT=$OUT/libktrace.so
CU=$(ls -d /usr/local/cuda 2>/dev/null || ls -d /usr/local/cuda-* | head -1)
cc -O2 -shared -fPIC -I"$CU/include" -o "$KT" "$(dirname "$0")/ktrace.c" -L"$CU/lib64" -L"$CU/targets/x86_64-linux/lib" -lcupti 2>"$OUT/ktrace_cc.log" ||
    { cp "${KTRACE_LIB:?ktrace.c did not build here and KTRACE_LIB is not set}" "$KT"; echo "ktrace: the carried build"; }
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$CU/lib64:$CU/targets/x86_64-linux/lib"
"$S/bin/cuda_bench" --floor >"$OUT/floor.log" 2>&1
grep -h "floor" "$OUT/floor.log" | head -2
M=/tmp/moe4
[ -f "$M/model.safetensors" ] || python3 "$S/make_moe.py" "$M" --layers 4 >"$OUT/moe_gen.log" 2>&1 || { echo "make_moe failed"; exit 1; }
ids_of() { python3 -c "import sys; print(','.join(str(3 + i * 37 % int(sys.argv[2])) for i in range(int(sys.argv[1]))))" "$1" "$2"; }
crit() { # NAME MODEL IDS
    local name=$1 model=$2 ids=$3
    env ${CRIT_ENV:-} "$BIN" run --backend cuda --model "$model" --ids "$ids" --max-new 128 --ignore-eos --print-ids --stats \
        --gpu-memory 100G >"$OUT/$name.out" 2>"$OUT/$name.log"
    echo "$name plain: $(grep -h '^\[stats\] prefill' "$OUT/$name.log" | sed 's/.*(\([0-9.]*\) tok\/s,.*/\1/') tok/s"
    env ${CRIT_ENV:-} CUDA_INJECTION64_PATH="$KT" KTRACE_OUT="$OUT/$name.kt" timeout 300 \
        "$BIN" run --backend cuda --model "$model" --ids "$ids" --max-new 128 --ignore-eos --print-ids --stats \
        --gpu-memory 100G >"$OUT/$name.traced.out" 2>"$OUT/$name.traced.log"
    echo "$name traced: $(grep -h '^\[stats\] prefill' "$OUT/$name.traced.log" | sed 's/.*(\([0-9.]*\) tok\/s,.*/\1/') tok/s," \
        "ids $(cmp -s <(grep -E '^[0-9 ]+$' "$OUT/$name.out") <(grep -E '^[0-9 ]+$' "$OUT/$name.traced.out") && echo same || echo DIFFER)"
    python3 "$(dirname "$0")/crit_path.py" "$OUT/$name.kt" --tokens 100 || tail -5 "$OUT/$name.traced.log"
    xz -T4 "$OUT/$name.kt"
}
for n in ${CRIT_LENS:-512 2048}; do crit "qwen3_p$n" "$M" "$(ids_of "$n" 8000)"; done
if [ "${CRIT_DSV3:-0}" = 1 ]; then
    D=/tmp/dsv3
    [ -f "$D/model.safetensors.index.json" ] || timeout 400 python3 bench/make_synthetic_dsv3.py "$D" --layers 4 --experts 32 --vocab 8192 >"$OUT/dsv3_gen.log" 2>&1 || { echo "dsv3 gen failed"; tail -3 "$OUT/dsv3_gen.log"; }
    crit dsv3_p512 "$D" "$(ids_of 512 8092)"
fi
