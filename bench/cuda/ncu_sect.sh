#!/usr/bin/env bash
# ncu_sect.sh - on the device: why a kernel of the decode runs as it does. ncu's sections (speed of light, occupancy,
# launch, scheduler and warp-state statistics, memory workload) for the launches of the kernels matching SECT_K (a
# regex, default the DeepSeek-V3 decode's MoE down, dense FP8 products and MLA chunk), in a decode of MODEL_DIR, and
# the lines that say what bounds them (duration, DRAM throughput, issue slots, eligible warps, the stall hints).
# Usage: OUT=... bash ncu_sect.sh STAGE_DIR MODEL_DIR   (SECT_SKIP: launches of those kernels skipped, default 60;
# SECT_COUNT: launches profiled, default 12; SECT_ENV: variables for the run, e.g. DELTAFIN_CUDA_LEAN=...)
S=$1 D=$2
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$S/lib:/usr/local/cuda/lib64:${CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu_sect: no ncu"; exit 0; }
IDS=$(python3 -c 'print(",".join(str(3 + i * 37 % 8092) for i in range(27)))')
env ${SECT_ENV:-} timeout "${SECT_TO:-200}" "$NCU" --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --cache-control none --clock-control none \
    -k "regex:${SECT_K:-k_moe_down_f8|k_mm_f8|k_mla_chunk|k_mla_out_v|k_mla_absorb_v}" --launch-skip "${SECT_SKIP:-60}" \
    --launch-count "${SECT_COUNT:-12}" "$S/bin/deltafin" run --backend cuda --model "$D" --ids "$IDS" --max-new 16 --ignore-eos \
    --gpu-memory 100G >"$OUT/ncu_sect.txt" 2>&1
echo "ncu_sect: exit $? ($(wc -l <"$OUT/ncu_sect.txt") lines in ncu_sect.txt)"
grep -E "^  k_|Grid Size|Block Size|Registers Per|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp Per|No Eligible|Active Warps Per Scheduler|Eligible Warps Per|Warp Cycles Per Issued|Dynamic Shared|Waves Per SM|stall|Stall" \
    "$OUT/ncu_sect.txt" | sed 's/  */ /g' | cut -c1-260
