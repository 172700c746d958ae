#!/usr/bin/env bash
# cuda_device.sh - builds what must travel to the GPU machine, stages it, and
# prints the `run` call to give the device tool (an agent makes that call).
#
#   tools/cuda_device.sh [STAGE]
#
# STAGE (default /work/main/.whl/ckern): a git-ignored folder of the checkout
# that the device tool ships (`run` sends that checkout, plus the ignored
# paths named in `carry`). Builds here with `make CUDA=1` (nvcc; sm_90 + PTX):
# deltafin, the conformance test, test_backend_cuda, test_core_verify, the benchmark, h2d_bw, chain_bench, fp8_gemv,
# moe_down_bench and layer_bench (also layer_bench_d2: -DPDEPTH=2, layer_bench_b2: -DPBLOCKS=2, layer_bench_c16: -DDEC_CH=16,
# layer_bench_xpf: -DDEC_XPF=1, layer_bench_ef: -DDEC_XPF=2); copies
# them to STAGE/bin, the shared libraries they need that are not glibc's,
# the C++ runtime's or CUDA's (libmicrohttpd, liburing, libjansson, ...) to
# STAGE/lib, and bench/cuda/device_run.sh (the one device script) with the
# scripts it runs (cuda_e2e.py, cuda_tiers.py, make_moe.py, e2e_pct.py,
# tier_bench.sh, mtp_diag.sh, f8_diag.sh, ncu_sect.sh, ncu_sum.py) beside them. The device has CUDA 13 and cuBLAS; device_run.sh finds libcublas
# there. Also writes STAGE.txz (xz -9; NO_XZ=1 skips it), the one path to carry. Delete both when done.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STAGE=${1:-/work/main/.whl/ckern}
cd "$ROOT"
make --no-print-directory CUDA=1 O=build-cuda -j2 build-cuda/deltafin build-cuda/tests/test_backend_ops build-cuda/tests/test_backend_cuda \
    build-cuda/tests/test_core_verify build-cuda/bench/cuda_bench >/dev/null
mkdir -p build-cuda/bench
[ build-cuda/bench/h2d_bw -nt bench/cuda/h2d_bw.cu ] || ${NVCC:-nvcc} -O2 -arch=sm_90 -o build-cuda/bench/h2d_bw bench/cuda/h2d_bw.cu
[ build-cuda/bench/chain_bench -nt bench/cuda/chain_bench.cu ] || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -o build-cuda/bench/chain_bench bench/cuda/chain_bench.cu
[ build-cuda/bench/fp8_gemv -nt bench/cuda/fp8_gemv.cu ] && [ build-cuda/bench/fp8_gemv -nt bench/cuda/fp8_bench.cuh ] || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -o build-cuda/bench/fp8_gemv bench/cuda/fp8_gemv.cu
[ build-cuda/bench/moe_down_bench -nt bench/cuda/moe_down_bench.cu ] && [ build-cuda/bench/moe_down_bench -nt bench/cuda/fp8_bench.cuh ] || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -o build-cuda/bench/moe_down_bench bench/cuda/moe_down_bench.cu
# layer_bench and its builds: rebuilt when any of their sources is newer
lb_fresh() { for f in bench/cuda/layer_bench.cu src/backend/cuda/dec_kernel.cuh src/backend/cuda/dec_layers.h bench/cuda/read_floor.cuh; do [ "$1" -nt "$f" ] || return 1; done; }
lb_fresh build-cuda/bench/layer_bench || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -Isrc -o build-cuda/bench/layer_bench bench/cuda/layer_bench.cu
lb_fresh build-cuda/bench/layer_bench_d2 || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -DPDEPTH=2 -Isrc -o build-cuda/bench/layer_bench_d2 bench/cuda/layer_bench.cu
lb_fresh build-cuda/bench/layer_bench_b2 || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -DPBLOCKS=2 -Isrc -o build-cuda/bench/layer_bench_b2 bench/cuda/layer_bench.cu
lb_fresh build-cuda/bench/layer_bench_c16 || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -DDEC_CH=16 -Isrc -o build-cuda/bench/layer_bench_c16 bench/cuda/layer_bench.cu
lb_fresh build-cuda/bench/layer_bench_xpf || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -DDEC_XPF=1 -Isrc -o build-cuda/bench/layer_bench_xpf bench/cuda/layer_bench.cu
lb_fresh build-cuda/bench/layer_bench_ef || ${NVCC:-nvcc} -O2 -std=c++17 -arch=sm_90 -DDEC_XPF=2 -Isrc -o build-cuda/bench/layer_bench_ef bench/cuda/layer_bench.cu
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/lib"
cp build-cuda/deltafin build-cuda/tests/test_backend_ops build-cuda/tests/test_backend_cuda build-cuda/tests/test_core_verify build-cuda/bench/cuda_bench build-cuda/bench/h2d_bw build-cuda/bench/chain_bench build-cuda/bench/fp8_gemv build-cuda/bench/moe_down_bench build-cuda/bench/layer_bench build-cuda/bench/layer_bench_d2 build-cuda/bench/layer_bench_b2 build-cuda/bench/layer_bench_c16 build-cuda/bench/layer_bench_xpf build-cuda/bench/layer_bench_ef "$STAGE/bin/"
strip --strip-debug "$STAGE"/bin/*
cp bench/cuda/device_run.sh bench/cuda/logits_cmp.py bench/cuda/e2e_pct.py bench/cuda/make_moe.py bench/cuda/tier_bench.sh bench/cuda/mtp_diag.sh bench/cuda/f8_diag.sh bench/cuda/ncu_sect.sh bench/cuda/ncu_sum.py bench/cuda/r17_ab.sh bench/cuda/sass_audit.py tests/tools/cuda_e2e.py tests/tools/cuda_tiers.py tests/data/layer_bench/golden_l4_p640_v8000_t1.bin "$STAGE/"
# the libraries the binaries load, minus those every Linux (and the CUDA image) has
for b in "$STAGE"/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u | while read -r so; do
    case "$(basename "$so")" in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so* | libnss_* | libanl.so* | libutil.so* | ld-linux* | libgcc_s.so* | libstdc++.so* | libcublas* | libcudart*) ;; # glibc's own: never mix versions
    *) cp -L "$so" "$STAGE/lib/" ;;
    esac
done
REL=${STAGE#/work/main/}
echo "staged $(du -sh "$STAGE" | cut -f1) in $STAGE:" >&2
ls "$STAGE" "$STAGE/bin" "$STAGE/lib" >&2
# one archive for the carry limit (64 MiB with the tracked tree): xz -9's 64 MiB window sees that the binaries share
# their CUDA fatbins (round 18: 38 MB with -6, 14-23 MB with -9); bench binaries a call does not use can be removed first
NAME=$(basename "$STAGE")
if [ -z "${NO_XZ:-}" ]; then
    tar cf - -C "$(dirname "$STAGE")" "$NAME" | xz -T1 -9 >"$STAGE.txz"
    echo "archived $(du -h "$STAGE.txz" | cut -f1) in $STAGE.txz" >&2
fi
echo "give the device tool (from the session whose checkout is /work/main):"
echo "  run(command=\"tar xJf $REL.txz -C $(dirname "$REL") && OUT=\$OUT bash $REL/device_run.sh\", carry=[\"$REL.txz\"], timeout_s=600)"
echo "optional: STEPS='unit conf e2e tiers bench moe' picks steps; BENCH_ARGS='' runs the full product benchmark; TIER_BENCH=1 adds tier_bench.sh"
