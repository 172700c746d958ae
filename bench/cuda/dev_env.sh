# dev_env.sh - sourced by the device scripts run from the checkout (crit_path.sh, env_ab.sh): with S the staged folder
# of tools/cuda_device.sh, the library path for its binaries (its lib/, CUDA's, pip's cuBLAS) and BIN, its deltafin.
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$S/lib:/usr/local/cuda/lib64:${CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=$S/bin/deltafin
