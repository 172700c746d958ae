#!/usr/bin/env bash
# f8_diag.sh - on the device, after device_run.sh's dsv3 step wrote the model: why the dense FP8 one-token products run
# slower in the model than in bench/cuda/fp8_gemv.cu. (1) cuda_bench --quick's DeepSeek-V3 FP8 decode row (the backend's
# own launches, event-timed, weights reused) under each mask of F8_MASKS; (2) ncu of the model's k_mm_f8 launches with
# DRAM bytes and the L2 hit rate beside the time.  Usage: OUT=... bash f8_diag.sh STAGE_DIR MODEL_DIR
S=$1 D=$2
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$S/lib:/usr/local/cuda/lib64:${CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for M in ${F8_MASKS:-392046 916334}; do
    echo "== cuda_bench --quick, DELTAFIN_CUDA_LEAN=$M ${F8_ENV:-}"
    env DELTAFIN_CUDA_LEAN=$M ${F8_ENV:-} timeout 200 "$S/bin/cuda_bench" --quick 2>&1 | grep -E "floor|DeepSeek-V3 FP8 +n=1 "
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || exit 0
IDS=$(python3 -c 'print(",".join(str(3 + i * 37 % 8092) for i in range(27)))')
env DELTAFIN_CUDA_LEAN=${F8_NCU_MASK:-916334} ${F8_ENV:-} timeout 150 "$NCU" --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active \
    --cache-control none --clock-control none --csv -k regex:k_mm_f8 --launch-skip 40 --launch-count 14 \
    "$S/bin/deltafin" run --backend cuda --model "$D" --ids "$IDS" --max-new 8 --ignore-eos --gpu-memory 100G >"$OUT/ncu_f8diag.csv" 2>&1
python3 - "$OUT/ncu_f8diag.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
h = rows[0]
ix = {k: h.index(k) for k in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Unit", "Metric Value")}
by = {}
for r in rows[1:]:
    by.setdefault((r[ix["ID"]], r[ix["Kernel Name"]][:20], r[ix["Grid Size"]]), []).append(f'{r[ix["Metric Name"]]}={r[ix["Metric Value"]]}{r[ix["Metric Unit"]]}')
for k, v in by.items(): print(*k, *v)
PY
