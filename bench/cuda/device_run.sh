#!/usr/bin/env bash
# device_run.sh - the ONE script that runs ON the GPU machine (the `run` tool
# of the device library), from the repository root there, out of the folder
# that tools/cuda_device.sh staged (bin/: deltafin, test_backend_ops,
# test_backend_cuda, cuda_bench, h2d_bw; lib/; this script, cuda_e2e.py,
# cuda_tiers.py, make_moe.py, tier_bench.sh, e2e_pct.py):
#   1. test_backend_cuda (incl. the batching of cached experts) and test_core_verify
#      on cuda (verify passes bit-equal to plain steps), then the
#      op-by-op conformance test (test_backend_ops --backend cuda --ref cpu-scalar);
#   2. model parity (cuda_e2e.py: every tiny model in tests/data/models, CUDA vs CPU);
#   3. the tier checks (cuda_tiers.py: tiny MoE models under a tiny VRAM budget);
#   4. (last) the product benchmark (cuda_bench ${BENCH_ARGS:---quick});
#   5. END TO END, on a synthetic Qwen3-30B-A3B-shape BF16 MoE written here
#      (make_moe.py, ${MOE_LAYERS:-4} layers): the HBM read floor (cuda_bench
#      --floor) and the pinned H2D floor (h2d_bw) of this call, then
#      a. resident: `deltafin run --backend cuda --gpu-memory 100G` (every expert
#         cached in VRAM by a 512-token prompt), 128 decode tokens: weight bytes
#         per token x tok/s against the HBM floor (e2e_pct.py); with
#         DELTAFIN_CUDA_PROF=1 and =2 (time per backend op over the decode
#         steps) after it; then sampled (--temperature 1: each token routes anew);
#      b. pinned tier: --gpu-memory 2500M, 600M and 400M with --expert-cache 8G
#         (every expert in the pinned host cache, warmed by the same 512-token
#         prompt before decode is timed), sampled tokens: expert bytes
#         host->VRAM per second of decode against the H2D floor;
#   6. with TIER_BENCH=1: the older tier benchmark (tier_bench.sh, all budgets).
# Logs go to $OUT/logs.tgz; a summary to stdout. Exit status: the number of failed steps.
# Steps: STEPS="isa chain layer persist unit conf e2e mtp tiers bench moe dsv3 fp8mv mdown r17 sass" (default all but isa, chain, layer, persist, mtp, dsv3, fp8mv, mdown, r17 and sass; persist: the persistent decode kernel in the engine (DELTAFIN_CUDA_PERSIST=1) on the synthetic Qwen3-shape model: its decode logits against the CPU backend's and the op-by-op path's (eval --decode-from 16, logits_cmp.py), then 2 x 2 alternated runs of 128 tokens after a 512-token prompt with e2e_pct's share of the HBM floor; chain: bench/cuda/chain_bench.cu; layer: bench/cuda/layer_bench.cu (a synthetic Qwen3-shape decode layer as launches and as one persistent kernel, LAYER_ARGS="tokens layers positions vocabulary", default "256 4 640 8000" with the first token checked against transformers (tests/data/layer_bench/golden_l4_p640_v8000_t1.bin), then 2048 positions, Qwen3's 151,936-id vocabulary, the PDEPTH=2 and PBLOCKS=2 builds); r17: bench/cuda/r17_ab.sh (R17_QUICK, R17_DIAG, R17_LENS, R17_REPS pass through); sass: cuobjdump of the MoE down launch reading h (H 0, 1, 2) into $OUT/sass_h*.txt and sass_audit.py over every kernel; fp8mv: bench/cuda/fp8_gemv.cu; mdown: bench/cuda/moe_down_bench.cu; isa: the CPU's AVX-512 flags and the CPU
# backend's conformance under DELTAFIN_ISA=avx512 and avx2; mtp: tests/py/test_spec_mtp.py -k transformers,
# the CPU backend against transformers' modules). CONF_MASKS / E2E_MASKS="3950": conformance / model parity again under each
# DELTAFIN_CUDA_LEAN mask. MOE_SET=r11: resident decode with the masks of R11_AB (default "15214 31598 64366": the default, + bit
# 16384, + bit 32768) alternated three times, ncu of R11_NCU (default "15214 64366"), the ids compared (R11_LONG=1: 512 tokens and sampled
# too). MOE_SET=r10: resident decode with the masks of R10_AB (default "2926 7022 11118 15214": the default,
# + bit 4096, + bit 8192, both) alternated three times, ncu of R10_NCU (default "2926 15214"), the ids compared (R10_LONG=1: 512
# tokens and sampled too; R10_EARLY0=MASK: that mask twice more with DELTAFIN_CUDA_ATTN_EARLY=0). MOE_SET=r9: resident decode with the masks of R9_AB (default "878 1902 2926 3950": the default, + bit
# 1024, + bit 2048, both) alternated three times, ncu of each, the ids compared (R9_LONG=1: 512 tokens and sampled too). MOE_SET=r8: resident decode with the masks of R8_AB (default "110 366 878":
# round 7, + the fused row ops, + the one-token spine products' row split) alternated three times, 512 tokens and sampled
# each, ncu of each; R8_SPLITS="8 4" adds DELTAFIN_CUDA_MM_SPLIT1 runs. MOE_SET=r7: resident decode with DELTAFIN_CUDA_LEAN=14 (round 6) and 110
# (the default: + bit 32 programmatic dependent launches, + bit 64 the register-resident route) alternated twice, 46 and 78
# (each bit alone), 512 tokens, PROF=3, sampled, the pinned 600M tier, the ids compared, ncu per kernel of 14 and 110. MOE_SET=r6: resident decode with DELTAFIN_CUDA_LEAN=6 (round 5's
# kernels) and 14 (the default: + round 6's fused MoE down launch; the binary of the round-6 calls also had the attention
# change, now opt-in bit 16, under bit 8) alternated twice,
# LEAN=15, DELTAFIN_CUDA_MOE_U=1/4, PROF=3 of 6 and 14, PROF=1, sampled 6 and 14, the ids compared, and ncu's GPU time per
# decode kernel (NCU_SKIP/NCU_COUNT launches) of 6 and 14 where ncu is there. MOE_SET=r5: resident decode with DELTAFIN_CUDA_LEAN=2
# (round 4's kernels) and 6 (the default: + round 5's deeper product loads and wider rmsnorm) alternated twice,
# PROF=3 of each, PROF=1, sampled, the ids compared, nsys kernel summaries when nsys is there. MOE_SET=fused: conformance without the unsplit rerun,
# and step 5 runs resident decode with the device-routed MoE off and on (DELTAFIN_CUDA_FUSED_MOE=0/1) alternated
# twice, 512 tokens, sampled, profiled (PROF=1: host time, PROF=3: GPU time per op), the pinned 600M tier with it on, the ids compared, and an nsys
# kernel summary of each when nsys is there. MOE_SET=lean: conformance without the unsplit
# rerun, and step 5 runs only resident decode with each mask of the decode-step savings (DELTAFIN_CUDA_LEAN=0..3),
# alternated twice, 512 tokens with 0 and 3, profiled (PROF=1) with 0 and 3, the ids compared.
set -u
S=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/cuda_out}
mkdir -p "$OUT"
STEPS=${STEPS:-unit conf e2e tiers bench moe}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$S/lib:/usr/local/cuda/lib64:${CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=$S/bin/deltafin
fail=0
step() { # name timeout log cmd...
    local name=$1 to=$2 log=$3
    shift 3
    local t0=$SECONDS
    timeout "$to" "$@" >"$OUT/$log" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $((SECONDS - t0)) s ($log)"
    [ "$rc" -eq 0 ] || fail=$((fail + 1))
    return $rc
}
{ date -u; nvidia-smi; uname -a; nproc; free -g; df -h /tmp; ldd "$BIN"; which nsys; } >"$OUT/machine.txt" 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader

# one end-to-end run (PREFIX MODEL IDS NAME OPTIONS...): `deltafin run --stats` into PREFIX_NAME.log, its stats lines, and
# the shares of the floors of this call (e2e_pct.py)
erun() {
    local pre=$1 model=$2 ids=$3 name=$4
    shift 4
    step "$pre $name: $*" 300 "${pre}_$name.log" "$BIN" run --backend cuda --model "$model" --ids "$ids" --max-new "${MAX_NEW:-128}" --ignore-eos --print-ids --stats "$@"
    grep -E "^\[stats\] (prefill|vram|host|decode|time split)|^\[cuda prof\]|out of VRAM|stay in host|rror" "$OUT/${pre}_$name.log" | head -40
    python3 "$S/e2e_pct.py" "$OUT/${pre}_$name.log" "$OUT/floor.log" "$OUT/h2d.log"
}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# ncu of one decode run into CSV (CSV MODEL IDS MAX_NEW SKIP; DELTAFIN_* set by the caller), 1 when ncu is absent
ncu_dec() {
    [ -n "$NCU" ] || return 1
    timeout "${NCU_TO:-150}" "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
        --launch-skip "$5" --launch-count "${NCU_COUNT:-400}" "$BIN" run --backend cuda --model "$2" --ids "$3" --max-new "$4" \
        --ignore-eos --gpu-memory 100G >"$1" 2>&1
}
# the mean decode tok/s of the alternated runs OUT/PREFIX-r1..3.log, printed as "LABEL: mean ..." (PREFIX LABEL)
mask_mean() {
    grep -h "^\[stats\] prefill" "$OUT"/$1-r[123].log | sed 's/.*(\([0-9.]*\) tok\/s,.*/\1/' |
        awk -v L="$2" '{s += $1; n++} END {if (n) printf "%s: mean %.1f tok/s over %d runs\n", L, s / n, n}'
}
if has isa; then # the device CPU's ISA, and the CPU backend's AVX-512 kernels against the scalar reference (round 7: the integrator's ask)
    { echo "== isa: $(grep -o -w 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"; nproc; lscpu | grep -i 'model name'; } | tee "$OUT/isa.log"
    if grep -q -w avx512f /proc/cpuinfo; then
        for I in avx512 avx2; do
            DELTAFIN_ISA=$I step "test_backend_ops --backend cpu --ref cpu-scalar, DELTAFIN_ISA=$I" 300 "cpu_$I.log" "$S/bin/test_backend_ops" --backend cpu --ref cpu-scalar
            tail -15 "$OUT/cpu_$I.log"
        done
    fi
fi
if has chain; then # round 24: what a dependent step costs (kernel boundaries, graphs, a grid barrier; L2 / DRAM round trips)
    step "chain_bench" 120 chain.log "$S/bin/chain_bench" 2000
    cat "$OUT/chain.log"
    "$S/bin/chain_bench" 256 | grep 'chain q-' | tee -a "$OUT/chain.log"
fi
if has layer; then # round 27: what a persistent decode kernel could reach (bench/cuda/layer_bench.cu)
    step "layer_bench" 180 layer.log "$S/bin/layer_bench" ${LAYER_ARGS:-256 4 640 8000 "$S/golden_l4_p640_v8000_t1.bin"}
    cat "$OUT/layer.log"
    step "layer_bench 2048 positions" 180 layer2k.log "$S/bin/layer_bench" 256 4 2048 8000
    grep -E '^(arm|check|HBM|summary|layer_bench)' "$OUT/layer2k.log"
    step "layer_bench Qwen3's vocabulary" 180 layer_v.log "$S/bin/layer_bench" 256 4 640 151936
    grep -E '^(arm|check|HBM|summary|layer_bench)' "$OUT/layer_v.log"
    step "layer_bench_d2 (PDEPTH=2)" 180 layer_d2.log "$S/bin/layer_bench_d2" ${LAYER_ARGS:-256 4 640 8000}
    grep -E '^(device|arm|check|summary|layer_bench)' "$OUT/layer_d2.log"
    step "layer_bench_b2 (PBLOCKS=2)" 180 layer_b2.log "$S/bin/layer_bench_b2" ${LAYER_ARGS:-256 4 640 8000}
    grep -E '^(device|arm|check|summary|layer_bench)' "$OUT/layer_b2.log"
fi
if has unit; then
    step "test_backend_cuda" 60 cuda_unit.log "$S/bin/test_backend_cuda"
    tail -3 "$OUT/cuda_unit.log"
    # issue 15 on the GPU: every verify pass's logits bit-equal to plain steps (exact products, attention and MoE a
    # position at a time); SmolLM2 too where $HOME/.cache/deltafin/models holds it
    DELTAFIN_TEST_BACKEND=cuda step "test_core_verify on cuda" 300 cuda_verify.log "$S/bin/test_core_verify"
    grep -E "FAIL|failures" "$OUT/cuda_verify.log" | tail -8
fi
if has conf; then
    step "conformance (test_backend_ops --backend cuda --ref cpu-scalar)" 240 conformance.log "$S/bin/test_backend_ops" --backend cuda --ref cpu-scalar
    grep -E "FAIL|failures" "$OUT/conformance.log" | tail -15
    for E in ${CONF_ENV:-}; do # conformance again under each VAR=VALUE of CONF_ENV (e.g. "DELTAFIN_CUDA_MLA_DEC_N=64")
        env "$E" "$S/bin/test_backend_ops" --backend cuda --ref cpu-scalar >"$OUT/conformance_env_${E%%=*}.log" 2>&1
        echo "== conformance, $E: exit $?"; grep -E "FAIL|failures" "$OUT/conformance_env_${E%%=*}.log" | tail -15
    done
    for L in ${CONF_MASKS:-}; do # round 9: conformance again under each DELTAFIN_CUDA_LEAN mask of CONF_MASKS (e.g. "3950")
        DELTAFIN_CUDA_LEAN=$L step "conformance, DELTAFIN_CUDA_LEAN=$L" 240 "conformance_lean$L.log" "$S/bin/test_backend_ops" --backend cuda --ref cpu-scalar
        grep -E "FAIL|failures" "$OUT/conformance_lean$L.log" | tail -15
    done
    if [ "${MOE_SET:-all}" = all ]; then
        DELTAFIN_CUDA_ATTN_SPLIT=0 step "conformance, decode attention without the position split" 240 conformance_nosplit.log \
            "$S/bin/test_backend_ops" --backend cuda --ref cpu-scalar
        grep -E "FAIL|failures" "$OUT/conformance_nosplit.log" | tail -5
    fi
fi
if has e2e; then
    step "model parity (cuda_e2e.py, every tiny model)" 300 parity.log python3 "$S/cuda_e2e.py" "$BIN"
    cut -c1-200 "$OUT/parity.log" | tail -25
    for E in ${E2E_ENV:-}; do # model parity again under each VAR=VALUE of E2E_ENV
        env "$E" python3 "$S/cuda_e2e.py" "$BIN" >"$OUT/parity_env_${E%%=*}.log" 2>&1
        echo "== model parity, $E: exit $?"; cut -c1-200 "$OUT/parity_env_${E%%=*}.log" | tail -4
    done
    for L in ${E2E_MASKS:-}; do # round 9: model parity again under each DELTAFIN_CUDA_LEAN mask of E2E_MASKS (e.g. "3950")
        DELTAFIN_CUDA_LEAN=$L step "model parity, DELTAFIN_CUDA_LEAN=$L" 300 "parity_lean$L.log" python3 "$S/cuda_e2e.py" "$BIN"
        cut -c1-200 "$OUT/parity_lean$L.log" | tail -25
    done
fi
if has mtp; then # the MTP check against transformers' own modules (torch is on the device), on the CPU backend
    # ../shared (the tokenizer fixtures conftest.py asks for) does not travel: without it, the test file alone
    DELTAFIN_BIN=$BIN timeout 300 python3 -m pytest -q -p no:cacheprovider tests/py/test_spec_mtp.py -k transformers >"$OUT/mtp.log" 2>&1
    rc=$?
    if [ "$rc" = 4 ]; then
        echo "(conftest.py refused: no ../shared here; rerun with --noconftest)" >>"$OUT/mtp.log"
        DELTAFIN_BIN=$BIN timeout 300 python3 -m pytest -q -p no:cacheprovider --noconftest tests/py/test_spec_mtp.py -k transformers >>"$OUT/mtp.log" 2>&1
        rc=$?
    fi
    echo "== MTP pytest (tests/py/test_spec_mtp.py -k transformers): exit $rc (mtp.log)"
    [ "$rc" -eq 0 ] || fail=$((fail + 1))
    cat "$OUT/mtp.log"
    [ "$rc" -eq 0 ] || bash "$S/mtp_diag.sh" "$BIN" "$PWD" "$OUT"
fi
if has sass; then # the SASS of the Qwen3-shape MoE down launch (BF16, SPR 3) as it reads h: read-only path (H 1) vs L2 only (H 2)
    CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
    if [ -n "$CUOBJ" ]; then
        for h in 0 1 2; do
            "$CUOBJ" -sass -fun "_Z13k_moe_down_rtILi3ELi3ELi4ELi${h}EEv6RouteK6GateInPf" "$S/bin/deltafin" >"$OUT/sass_h$h.txt" 2>&1
            echo "== sass H $h: $(wc -l <"$OUT/sass_h$h.txt") lines; first lines naming a wait or a constant load:"
            grep -nE "ACQ|DEPBAR|griddep|LDG.*CONSTANT|CCTL" "$OUT/sass_h$h.txt" | head -12 | cut -c1-150
        done
        python3 "$S/sass_audit.py" "$S/bin/deltafin" "$CUOBJ" >"$OUT/sass_audit.txt" 2>&1
        echo "== sass_audit.py (read-only loads before the wait, per kernel): exit $?"
        cut -c1-160 "$OUT/sass_audit.txt" | head -80
    else
        echo "== sass: no cuobjdump on this machine"
    fi
fi
if has r17; then # round 17's A/B: the gate-once MoE (and the attention at 2 positions a warp) against the default, ids compared
    OUT="$OUT/r17" bash "$S/r17_ab.sh" "$S" 2>&1 | tee "$OUT/r17.log" | cut -c1-200
    grep -qE "^(base|gate1[a-z]*|prev) .*DIFFERS" "$OUT/r17.log" && { echo "== r17: the gate-once or default runs read other ids"; fail=$((fail + 1)); }
fi
if has tiers; then
    step "tiers (cuda_tiers.py)" 240 tiers.log python3 "$S/cuda_tiers.py" "$BIN" tests/data/models/qwen3-moe-bf16 tests/data/models/deepseek-v3-bf16
    tail -12 "$OUT/tiers.log"
fi
if has persist; then # the persistent decode kernel in the engine (DELTAFIN_CUDA_PERSIST=1, cuda_dec.cu): its decode logits against
    # the CPU backend's and the op-by-op path's (eval --decode-from), then its speed against the op-by-op path, alternated
    W=${WORK:-/tmp/moebench}
    M=$W/moe${MOE_LAYERS:-4}
    mkdir -p "$W"
    [ -f "$M/model.safetensors" ] || step "synthetic Qwen3-30B-A3B-shape MoE written" 240 moe_gen.log python3 "$S/make_moe.py" "$M" --layers "${MOE_LAYERS:-4}"
    [ -f "$OUT/floor.log" ] || step "HBM floor (cuda_bench --floor)" 60 floor.log "$S/bin/cuda_bench" --floor
    [ -f "$OUT/h2d.log" ] || step "pinned H2D floor (h2d_bw)" 60 h2d.log "$S/bin/h2d_bw" 2048
    PIDS=$(python3 -c 'print(",".join(str(3 + i * 37 % 8000) for i in range(48)))')
    step "decode logits, cpu" 300 persist_cpu.log "$BIN" eval --backend cpu --model "$M" --ids "$PIDS" --decode-from 16 --dump-logits "$OUT/persist_cpu.f32"
    step "decode logits, cuda op by op" 180 persist_off.log "$BIN" eval --backend cuda --gpu-memory 100G --model "$M" --ids "$PIDS" --decode-from 16 \
        --dump-logits "$OUT/persist_off.f32"
    DELTAFIN_CUDA_PERSIST=1 step "decode logits, cuda persistent" 180 persist_on.log "$BIN" eval --backend cuda --gpu-memory 100G --model "$M" \
        --ids "$PIDS" --decode-from 16 --dump-logits "$OUT/persist_on.f32"
    grep -h "decode_layers\|rror" "$OUT/persist_on.log" | head -5
    step "decode logits compared (logits_cmp.py)" 60 persist_cmp.log python3 "$S/logits_cmp.py" 8192 16 "$OUT/persist_cpu.f32" "$OUT/persist_off.f32" \
        "$OUT/persist_on.f32"
    cat "$OUT/persist_cmp.log"
    IDS=$(python3 -c 'print(",".join(str(3 + i * 37 % 8000) for i in range(512)))')
    for r in 1 2; do
        for P in 0 1; do DELTAFIN_CUDA_PERSIST=$P erun persist "$M" "$IDS" "p$P-r$r" --gpu-memory 100G; done
    done
    for r in 1 2; do
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/persist_p0-r1.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/persist_p1-r$r.log" | head -1) &&
            echo "ids persist r$r: same as op by op" || echo "ids persist r$r: DIFFER from op by op"
    done
fi
if has moe; then
    W=${WORK:-/tmp/moebench}
    M=$W/moe${MOE_LAYERS:-4}
    mkdir -p "$W"
    [ -f "$M/model.safetensors" ] || step "synthetic Qwen3-30B-A3B-shape MoE written" 240 moe_gen.log python3 "$S/make_moe.py" "$M" --layers "${MOE_LAYERS:-4}"
    step "HBM floor (cuda_bench --floor)" 60 floor.log "$S/bin/cuda_bench" --floor
    step "pinned H2D floor (h2d_bw)" 60 h2d.log "$S/bin/h2d_bw" 2048
    cat "$OUT/floor.log" "$OUT/h2d.log"
    IDS=$(python3 -c 'print(",".join(str(3 + i * 37 % 8000) for i in range(512)))')
    moe() { erun moe "$M" "$IDS" "$@"; } # name, then options
    moe resident --gpu-memory 100G
    if [ "${MOE_SET:-all}" = fused ]; then # the device-routed MoE (DELTAFIN_CUDA_FUSED_MOE=0: off, the host-routed path) on and off, alternated
        for r in 1 2; do
            for F in 0 1; do DELTAFIN_CUDA_FUSED_MOE=$F moe "resident-fused$F-r$r" --gpu-memory 100G; done
        done
        for F in 0 1; do DELTAFIN_CUDA_FUSED_MOE=$F MAX_NEW=512 moe "resident-fused$F-512" --gpu-memory 100G; done
        for F in 0 1; do DELTAFIN_CUDA_FUSED_MOE=$F moe "resident-fused$F-sampled" --gpu-memory 100G --temperature 1 --seed 1; done
        for F in 0 1; do DELTAFIN_CUDA_FUSED_MOE=$F DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 moe "resident-fused$F-prof1" --gpu-memory 100G; done
        for F in 0 1; do DELTAFIN_CUDA_FUSED_MOE=$F DELTAFIN_CUDA_PROF=3 DELTAFIN_CUDA_PROF_DECODE=1 moe "resident-fused$F-prof3" --gpu-memory 100G; done
        DELTAFIN_CUDA_FUSED_MOE=1 moe pinned-600M-fused1 --gpu-memory 600M --expert-cache 8G --temperature 1 --seed 1
        for n in resident-fused0-r1 resident-fused1-r1 resident-fused0-r2 resident-fused1-r2 resident-fused0-prof1 resident-fused1-prof1; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: DIFFER from resident"
        done
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-fused0-512.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-fused1-512.log" | head -1) && echo "ids 512: fused 0 and 1 the same" || echo "ids 512: fused 0 and 1 DIFFER"
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-fused0-sampled.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-fused1-sampled.log" | head -1) && echo "ids sampled: fused 0 and 1 the same" || echo "ids sampled: fused 0 and 1 DIFFER"
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-fused1-sampled.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_pinned-600M-fused1.log" | head -1) && echo "ids pinned-600M: same as resident sampled" || echo "ids pinned-600M: DIFFER from resident sampled"
        if command -v nsys >/dev/null 2>&1; then # a kernel trace of the fused decode, when the machine has nsys
            for F in 0 1; do
                DELTAFIN_CUDA_FUSED_MOE=$F timeout 120 nsys profile -o "$OUT/nsys_fused$F" --stats=true -t cuda "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new 64 --ignore-eos --gpu-memory 100G >"$OUT/nsys_fused$F.log" 2>&1
                grep -A14 "cuda_gpu_kern_sum" "$OUT/nsys_fused$F.log" | cut -c1-160 | head -16
                rm -f "$OUT"/nsys_fused$F.nsys-rep "$OUT"/nsys_fused$F.sqlite
            done
        fi
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
    elif [ "${MOE_SET:-all}" = r6 ]; then # round 6: DELTAFIN_CUDA_LEAN=6 (round 5's kernels) against the default (14: + bit 8), alternated
        for r in 1 2; do
            for L in 6 14; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done
        done
        DELTAFIN_CUDA_LEAN=15 moe resident-lean15 --gpu-memory 100G # + the narrow dense product launches (bit 1)
        for U in 1 4; do DELTAFIN_CUDA_MOE_U=$U moe "resident-moeu$U" --gpu-memory 100G; done # the gate/up launch's loads per lane
        for C in 16 32; do DELTAFIN_CUDA_ATTN_CH=$C moe "resident-ch$C" --gpu-memory 100G; done # positions per split attention block (other sums: ids may differ)
        for L in 6 14; do DELTAFIN_CUDA_LEAN=$L DELTAFIN_CUDA_PROF=3 DELTAFIN_CUDA_PROF_DECODE=1 moe "resident-lean$L-prof3" --gpu-memory 100G; done
        DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 moe resident-prof1 --gpu-memory 100G
        for L in 6 14; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-sampled" --gpu-memory 100G --temperature 1 --seed 1; done
        for n in resident-lean6-r1 resident-lean14-r1 resident-lean6-r2 resident-lean14-r2 resident-lean15 resident-moeu1 resident-moeu4 resident-lean6-prof3 resident-lean14-prof3 resident-prof1; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: DIFFER from resident"
        done
        for n in resident-ch16 resident-ch32; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: differ from resident (other float sums)"
        done
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean6-sampled.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean14-sampled.log" | head -1) && echo "ids sampled: lean 6 and 14 the same" || echo "ids sampled: lean 6 and 14 DIFFER"
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        if [ -n "$NCU" ] && [ "${R6_NCU:-1}" = 1 ]; then # GPU time of each decode kernel alone (no launch gaps): a few decode tokens
            for L in 6 14; do
                DELTAFIN_CUDA_LEAN=$L timeout 150 "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv --launch-skip "${NCU_SKIP:-450}" --launch-count "${NCU_COUNT:-150}" \
                    "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new 12 --ignore-eos --gpu-memory 100G >"$OUT/ncu_lean$L.csv" 2>&1
                echo "== ncu lean $L: exit $?"
                python3 - "$OUT/ncu_lean$L.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
if not rows: print("ncu: no rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = len(h) - 1; ui = h.index("Metric Unit") if "Metric Unit" in h else None
t = collections.defaultdict(list)
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    if ui is not None and r[ui] == "usecond": v *= 1000
    if ui is not None and r[ui] == "msecond": v *= 1e6
    t[r[ki].split("(")[0].replace("void ", "")[:48]].append(v)
for k, v in sorted(t.items(), key=lambda kv: -sum(kv[1])):
    print(f"ncu {k:48s} n={len(v):4d} mean {sum(v)/len(v)/1000:8.2f} us  min {min(v)/1000:8.2f}  max {max(v)/1000:8.2f}")
PY
            done
        fi
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
    elif [ "${MOE_SET:-all}" = s10 ]; then # 2026-12-02 evening: the rmsnorm rows in registers (DELTAFIN_CUDA_RN_REG=0: the loops) under the
        # default mask, alternated three times, ids compared (the same bits: all must be the same), the mean of each
        for r in 1 2 3; do for R in 0 1; do DELTAFIN_CUDA_RN_REG=$R moe "resident-rn$R-r$r" --gpu-memory 100G; done; done
        for r in 1 2 3; do for R in 0 1; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-rn$R-r$r.log" | head -1) && echo "ids rn$R-r$r: same as resident" || echo "ids rn$R-r$r: DIFFER from resident"
        done; done
        for R in 0 1; do
            grep -h "^\[stats\] prefill" "$OUT"/moe_resident-rn$R-r[123].log | sed 's/.*(\([0-9.]*\) tok\/s,.*/\1/' | awk -v R="$R" '{s += $1; n++} END {if (n) printf "RN_REG=%s: mean %.1f tok/s over %d runs\n", R, s / n, n}'
        done
    elif [ "${MOE_SET:-all}" = r11 ]; then # round 11: the masks of R11_AB (default "15214 31598 64366": the default; + bit 16384,
        # the one-token spine products in one balanced wave, k_mm_bal; + bit 32768, its first round of loads before the wait)
        # alternated three times (128 tokens), ncu of R11_NCU
        # (default "15214 64366"; none: none), R11_LONG=1 adds 512 tokens and sampled of each; the ids of each run compared with
        # the first (default) run's: bits 16384 and 32768 keep the bits (every run must give the same ids)
        R11_AB=${R11_AB:-15214 31598 64366}
        for r in 1 2 3; do for L in $R11_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done; done
        if [ "${R11_LONG:-0}" = 1 ]; then
            for L in $R11_AB; do DELTAFIN_CUDA_LEAN=$L MAX_NEW=512 moe "resident-lean$L-512" --gpu-memory 100G; done
            for L in $R11_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-sampled" --gpu-memory 100G --temperature 1 --seed 1; done
        fi
        for r in 1 2 3; do for L in $R11_AB; do
            n=resident-lean$L-r$r
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: DIFFER from resident"
        done; done
        set -- $R11_AB
        if [ "${R11_LONG:-0}" = 1 ]; then for k in 512 sampled; do for L in $R11_AB; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$1-$k.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$L-$k.log" | head -1) && echo "ids $k lean$L: same as lean$1" || echo "ids $k lean$L: DIFFER from lean$1"
        done; done; fi
        R11_NCU=${R11_NCU:-15214 64366}
        [ "$R11_NCU" = none ] && R11_NCU=
        for L in $R11_NCU; do
            DELTAFIN_CUDA_LEAN=$L ncu_dec "$OUT/ncu_$L.csv" "$M" "$IDS" "${NCU_NEW:-384}" "${NCU_SKIP:-30000}" && echo "ncu of DELTAFIN_CUDA_LEAN=$L:" &&
                python3 "$S/ncu_sum.py" "$OUT/ncu_$L.csv"
        done
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
        for L in $R11_AB; do # the mean of the alternated runs per mask
            mask_mean "moe_resident-lean$L" "mask $L"
        done
    elif [ "${MOE_SET:-all}" = r10 ]; then # round 10: the masks of R10_AB (default "2926 7022 11118 15214": the default; + bit
        # 4096, the one-token GQA decode attention in one launch over (chunk, KV head) blocks; + bit 8192, the MoE route inside
        # the gate/up and down launches; both) alternated three times (128 tokens), ncu of R10_NCU (default "2926 15214"; none:
        # none), R10_LONG=1 adds 512 tokens and sampled of each; the ids of each run compared with the first (default) run's:
        # bit 8192 keeps the bits (11118 must give the same ids), bit 4096 sums the attention in another order (a different id
        # there is not by itself a failure, but the conformance and cuda_e2e runs under CONF_MASKS / E2E_MASKS must pass)
        R10_AB=${R10_AB:-2926 7022 11118 15214}
        for r in 1 2 3; do for L in $R10_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done; done
        if [ -n "${R10_EARLY0:-}" ]; then # e.g. R10_EARLY0=15214: that mask with DELTAFIN_CUDA_ATTN_EARLY=0 (no cache row read before the wait), twice
            for r in 1 2; do DELTAFIN_CUDA_LEAN=$R10_EARLY0 DELTAFIN_CUDA_ATTN_EARLY=0 moe "resident-early0-lean$R10_EARLY0-r$r" --gpu-memory 100G; done
        fi
        if [ "${R10_LONG:-0}" = 1 ]; then
            for L in $R10_AB; do DELTAFIN_CUDA_LEAN=$L MAX_NEW=512 moe "resident-lean$L-512" --gpu-memory 100G; done
            for L in $R10_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-sampled" --gpu-memory 100G --temperature 1 --seed 1; done
        fi
        for r in 1 2 3; do for L in $R10_AB; do
            n=resident-lean$L-r$r
            note="DIFFER from resident"
            [ $((L & 4096)) -ne 0 ] && note="differ from resident (bit 4096: other sums of the decode attention)"
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: $note"
        done; done
        set -- $R10_AB
        if [ "${R10_LONG:-0}" = 1 ]; then for k in 512 sampled; do for L in $R10_AB; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$1-$k.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$L-$k.log" | head -1) && echo "ids $k lean$L: same as lean$1" || echo "ids $k lean$L: differ from lean$1"
        done; done; fi
        R10_NCU=${R10_NCU:-2926 15214}
        [ "$R10_NCU" = none ] && R10_NCU=
        for L in $R10_NCU; do
            DELTAFIN_CUDA_LEAN=$L ncu_dec "$OUT/ncu_$L.csv" "$M" "$IDS" "${NCU_NEW:-384}" "${NCU_SKIP:-30000}" && echo "ncu of DELTAFIN_CUDA_LEAN=$L:" &&
                python3 "$S/ncu_sum.py" "$OUT/ncu_$L.csv"
        done
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
        for L in $R10_AB; do # the mean of the alternated runs per mask
            mask_mean "moe_resident-lean$L" "mask $L"
        done
    elif [ "${MOE_SET:-all}" = r9 ]; then # round 9: the masks of R9_AB (default "878 1902 2926 3950": the default; + bit 1024,
        # the one-token spine products through the cp.async pipeline; + bit 2048, the MoE down launch through cp.async; both)
        # alternated three times (128 tokens), ncu of each (R9_NCU: the masks to profile, default R9_AB; R9_NCU=none: none),
        # R9_LONG=1 adds 512 tokens and sampled of each; the ids of each run compared with the first (default) run's: bit 2048
        # keeps the bits, bit 1024 sums the dense rows in another order (a different id there is not a failure)
        R9_AB=${R9_AB:-878 1902 2926 3950}
        for r in 1 2 3; do for L in $R9_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done; done
        if [ "${R9_LONG:-0}" = 1 ]; then
            for L in $R9_AB; do DELTAFIN_CUDA_LEAN=$L MAX_NEW=512 moe "resident-lean$L-512" --gpu-memory 100G; done
            for L in $R9_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-sampled" --gpu-memory 100G --temperature 1 --seed 1; done
        fi
        for r in 1 2 3; do for L in $R9_AB; do
            n=resident-lean$L-r$r
            note="DIFFER from resident"
            [ $((L & 1024)) -ne 0 ] && note="differ from resident (bit 1024: other sums of the dense rows)"
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: $note"
        done; done
        set -- $R9_AB
        if [ "${R9_LONG:-0}" = 1 ]; then for k in 512 sampled; do for L in $R9_AB; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$1-$k.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$L-$k.log" | head -1) && echo "ids $k lean$L: same as lean$1" || echo "ids $k lean$L: differ from lean$1"
        done; done; fi
        R9_NCU=${R9_NCU:-$R9_AB}
        [ "$R9_NCU" = none ] && R9_NCU=
        for L in $R9_NCU; do
            DELTAFIN_CUDA_LEAN=$L ncu_dec "$OUT/ncu_$L.csv" "$M" "$IDS" "${NCU_NEW:-384}" "${NCU_SKIP:-30000}" && echo "ncu of DELTAFIN_CUDA_LEAN=$L:" &&
                python3 "$S/ncu_sum.py" "$OUT/ncu_$L.csv"
        done
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
        for L in $R9_AB; do # the mean of the alternated runs per mask
            mask_mean "moe_resident-lean$L" "mask $L"
        done
    elif [ "${MOE_SET:-all}" = r8 ]; then # round 8: the masks of R8_AB (default "110 366 878": round 7; + bit 256, the fused add +
        # norm and q/k norm + rope + cache rows; + bit 512, the default: one-token spine products' rows over more warps) alternated
        # three times, 512 tokens and sampled each; R8_SPLITS="8 4": DELTAFIN_CUDA_MM_SPLIT1=S runs alternated with the second mask
        # twice; ncu of each mask (and split); the ids compared with the first (default) run
        R8_AB=${R8_AB:-110 366 878}
        for r in 1 2 3; do for L in $R8_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done; done
        set -- $R8_AB
        if [ -n "${R8_SPLITS:-}" ]; then
            for r in 1 2; do
                DELTAFIN_CUDA_LEAN=$2 moe "resident-lean$2-s$r" --gpu-memory 100G
                for S1 in $R8_SPLITS; do DELTAFIN_CUDA_LEAN=$2 DELTAFIN_CUDA_MM_SPLIT1=$S1 moe "resident-split$S1-r$r" --gpu-memory 100G; done
            done
        fi
        for L in $R8_AB; do DELTAFIN_CUDA_LEAN=$L MAX_NEW=512 moe "resident-lean$L-512" --gpu-memory 100G; done
        for L in $R8_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-sampled" --gpu-memory 100G --temperature 1 --seed 1; done
        for n in $(for r in 1 2 3; do for L in $R8_AB; do echo resident-lean$L-r$r; done; done) $(for S1 in ${R8_SPLITS:-}; do echo resident-split$S1-r1 resident-split$S1-r2; done); do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: DIFFER from resident"
        done
        for k in 512 sampled; do for L in $R8_AB; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$1-$k.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$L-$k.log" | head -1) && echo "ids $k lean$L: same as lean$1" || echo "ids $k lean$L: DIFFER from lean$1"
        done; done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        for V in ${R8_NCU:-$R8_AB} $(for S1 in ${R8_SPLITS:-}; do echo s$S1; done); do
            case $V in s*) L=$2 S1=${V#s} ;; *) L=$V S1= ;; esac
            [ -n "$NCU" ] && DELTAFIN_CUDA_LEAN=$L DELTAFIN_CUDA_MM_SPLIT1=$S1 timeout "${NCU_TO:-150}" "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
                --launch-skip "${NCU_SKIP:-30000}" --launch-count "${NCU_COUNT:-400}" "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new "${NCU_NEW:-384}" --ignore-eos \
                --gpu-memory 100G >"$OUT/ncu_$V.csv" 2>&1 && echo "ncu of $V:" && python3 "$S/ncu_sum.py" "$OUT/ncu_$V.csv"
        done
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
    elif [ "${MOE_SET:-all}" = r7 ]; then # round 7: DELTAFIN_CUDA_LEAN=14 (round 6) against the default (110: + bit 32 programmatic
        # launches, + bit 64 the register-resident route), alternated twice; 46 (PDL alone) and 78 (route alone); PROF=3 of 14 and
        # 110; sampled 14 and 110; the ids compared; ncu's time of each decode kernel of 14 and 110 (R7_NCU=0: none)
        if [ -n "${R7_AB:-}" ]; then # R7_AB="110 238": only those masks alternated three times, 512 tokens, ncu of the last
            for r in 1 2 3; do
                for L in $R7_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done
            done
            for L in $R7_AB; do DELTAFIN_CUDA_LEAN=$L MAX_NEW=512 moe "resident-lean$L-512" --gpu-memory 100G; done
            for L in $R7_AB; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-sampled" --gpu-memory 100G --temperature 1 --seed 1; done
            for L in $R7_AB; do for r in 1 2 3; do
                cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$L-r$r.log" | head -1) && echo "ids lean$L-r$r: same as resident" || echo "ids lean$L-r$r: DIFFER from resident"
            done; done
            set -- $R7_AB
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$1-512.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$2-512.log" | head -1) && echo "ids 512: the same" || echo "ids 512: DIFFER"
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$1-sampled.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean$2-sampled.log" | head -1) && echo "ids sampled: the same" || echo "ids sampled: DIFFER"
            NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
            for L in ${R7_NCU_LIST:-$2}; do # R7_NCU_LIST="110 366": ncu of each (round 8)
            [ -n "$NCU" ] && DELTAFIN_CUDA_LEAN=$L timeout "${NCU_TO:-150}" "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv --launch-skip "${NCU_SKIP:-30000}" \
                --launch-count "${NCU_COUNT:-400}" "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new "${NCU_NEW:-256}" --ignore-eos --gpu-memory 100G >"$OUT/ncu_lean$L.csv" 2>&1 && echo "ncu of DELTAFIN_CUDA_LEAN=$L:" && python3 "$S/ncu_sum.py" "$OUT/ncu_lean$L.csv"
            done
            echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
        else
        for r in 1 2; do
            for L in 14 110; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done
        done
        for L in 46 78; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L" --gpu-memory 100G; done
        for L in 14 110; do DELTAFIN_CUDA_LEAN=$L MAX_NEW=512 moe "resident-lean$L-512" --gpu-memory 100G; done
        for L in 14 110; do DELTAFIN_CUDA_LEAN=$L DELTAFIN_CUDA_PROF=3 DELTAFIN_CUDA_PROF_DECODE=1 moe "resident-lean$L-prof3" --gpu-memory 100G; done
        for L in 14 110; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-sampled" --gpu-memory 100G --temperature 1 --seed 1; done
        DELTAFIN_CUDA_LEAN=110 moe pinned-600M-lean110 --gpu-memory 600M --expert-cache 8G --temperature 1 --seed 1
        for n in resident-lean14-r1 resident-lean110-r1 resident-lean14-r2 resident-lean110-r2 resident-lean46 resident-lean78 resident-lean14-prof3 resident-lean110-prof3; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: DIFFER from resident"
        done
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean14-512.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean110-512.log" | head -1) && echo "ids 512: lean 14 and 110 the same" || echo "ids 512: lean 14 and 110 DIFFER"
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean14-sampled.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean110-sampled.log" | head -1) && echo "ids sampled: lean 14 and 110 the same" || echo "ids sampled: lean 14 and 110 DIFFER"
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean110-sampled.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_pinned-600M-lean110.log" | head -1) && echo "ids pinned-600M: same as resident sampled" || echo "ids pinned-600M: DIFFER from resident sampled"
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        if [ -n "$NCU" ] && [ "${R7_NCU:-1}" = 1 ]; then
            for L in 14 110; do
                DELTAFIN_CUDA_LEAN=$L timeout "${NCU_TO:-150}" "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv --launch-skip "${NCU_SKIP:-30000}" \
                    --launch-count "${NCU_COUNT:-400}" "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new "${NCU_NEW:-256}" --ignore-eos --gpu-memory 100G >"$OUT/ncu_lean$L.csv" 2>&1
                echo "== ncu lean $L: exit $?"
                python3 "$S/ncu_sum.py" "$OUT/ncu_lean$L.csv"
            done
        fi
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log "$OUT"/moe_pinned*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
        fi
    elif [ "${MOE_SET:-all}" = r6b ]; then # round 6, later calls: 512-token A/B of LEAN 6 and 14, host time of each (R6B_AB=0: none),
        # ncu's time of each kernel of launches NCU_SKIP.. (a 512-token prefill is more than 9400 launches: its rows are scattered one
        # launch each; NCU_SKIP=30000 NCU_NEW=256 lands in decode)
        [ "${R6B_AB:-1}" = 1 ] && for r in 1 2; do
            for L in 6 14; do DELTAFIN_CUDA_LEAN=$L MAX_NEW=512 moe "resident-lean$L-512-r$r" --gpu-memory 100G; done
        done
        [ "${R6B_AB:-1}" = 1 ] && for L in 6 14; do DELTAFIN_CUDA_LEAN=$L DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 moe "resident-lean$L-prof1" --gpu-memory 100G; done
        [ "${R6B_AB:-1}" = 1 ] && for n in resident-lean6-512-r1 resident-lean14-512-r1 resident-lean6-512-r2 resident-lean14-512-r2; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean6-512-r1.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as lean6-512-r1" || echo "ids $n: DIFFER from lean6-512-r1"
        done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        if [ -n "$NCU" ]; then # GPU time of each decode kernel alone: launches NCU_SKIP.. of a 64-token decode (past the prefill)
            for L in 6 14; do
                DELTAFIN_CUDA_LEAN=$L timeout "${NCU_TO:-120}" "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv --launch-skip "${NCU_SKIP:-3000}" \
                    --launch-count "${NCU_COUNT:-330}" "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new "${NCU_NEW:-64}" --ignore-eos --gpu-memory 100G >"$OUT/ncu_lean$L.csv" 2>&1
                echo "== ncu lean $L: exit $?"
                python3 "$S/ncu_sum.py" "$OUT/ncu_lean$L.csv"
            done
        fi
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
    elif [ "${MOE_SET:-all}" = r5 ]; then # round 5: DELTAFIN_CUDA_LEAN=2 (round 4's kernels) against the default (6: + bit 4), alternated
        for r in 1 2; do
            for L in 2 6; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done
        done
        for L in 2 6; do DELTAFIN_CUDA_LEAN=$L DELTAFIN_CUDA_PROF=3 DELTAFIN_CUDA_PROF_DECODE=1 moe "resident-lean$L-prof3" --gpu-memory 100G; done
        DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 moe resident-prof1 --gpu-memory 100G
        if [ "${R5_SAMPLED:-0}" = 1 ]; then
            DELTAFIN_CUDA_LEAN=6 moe resident-lean6-sampled --gpu-memory 100G --temperature 1 --seed 1
            DELTAFIN_CUDA_LEAN=2 moe resident-lean2-sampled --gpu-memory 100G --temperature 1 --seed 1
        fi
        for n in resident-lean2-r1 resident-lean6-r1 resident-lean2-r2 resident-lean6-r2 resident-lean2-prof3 resident-lean6-prof3 resident-prof1; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: DIFFER from resident"
        done
        if [ "${R5_SAMPLED:-0}" = 1 ]; then cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean2-sampled.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean6-sampled.log" | head -1) && echo "ids sampled: lean 2 and 6 the same" || echo "ids sampled: lean 2 and 6 DIFFER"; fi
        if command -v nsys >/dev/null 2>&1; then
            for L in 2 6; do
                DELTAFIN_CUDA_LEAN=$L timeout 120 nsys profile -o "$OUT/nsys_lean$L" --stats=true -t cuda "$BIN" run --backend cuda --model "$M" --ids "$IDS" --max-new 64 --ignore-eos --gpu-memory 100G >"$OUT/nsys_lean$L.log" 2>&1
                grep -A14 "cuda_gpu_kern_sum" "$OUT/nsys_lean$L.log" | cut -c1-160 | head -16
                rm -f "$OUT"/nsys_lean$L.nsys-rep "$OUT"/nsys_lean$L.sqlite
            done
        fi
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
    elif [ "${MOE_SET:-all}" = lean ]; then # the decode-step savings (DELTAFIN_CUDA_LEAN mask, default 3) on and off, alternated
        for r in 1 2; do
            for L in 0 1 2 3; do DELTAFIN_CUDA_LEAN=$L moe "resident-lean$L-r$r" --gpu-memory 100G; done
        done
        for L in 0 3; do DELTAFIN_CUDA_LEAN=$L MAX_NEW=512 moe "resident-lean$L-512" --gpu-memory 100G; done
        DELTAFIN_CUDA_LEAN=0 DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 moe resident-lean0-prof1 --gpu-memory 100G
        DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 moe resident-prof1 --gpu-memory 100G
        for n in resident-lean0-r1 resident-lean1-r1 resident-lean2-r1 resident-lean3-r2 resident-lean0-prof1 resident-prof1; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: DIFFER from resident"
        done
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean0-512.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-lean3-512.log" | head -1) && echo "ids 512: lean 0 and 3 the same" || echo "ids 512: lean 0 and 3 DIFFER"
        echo "decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/moe_resident*.log | sed 's/.*moe_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
    else
    DELTAFIN_CUDA_ATTN_SPLIT=0 moe resident-nosplit --gpu-memory 100G
    DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 moe resident-prof1 --gpu-memory 100G
    DELTAFIN_CUDA_PROF=2 DELTAFIN_CUDA_PROF_DECODE=1 moe resident-prof2 --gpu-memory 100G
    # sampled tokens (--temperature 1): each decode token routes anew, as text does (greedy repeats one token here)
    moe resident-sampled --gpu-memory 100G --temperature 1 --seed 1
    moe pinned-2500M --gpu-memory 2500M --expert-cache 8G --temperature 1 --seed 1
    moe pinned-600M --gpu-memory 600M --expert-cache 8G --temperature 1 --seed 1
    moe pinned-400M --gpu-memory 400M --expert-cache 8G --temperature 1 --seed 1
    DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 moe pinned-400M-prof1 --gpu-memory 400M --expert-cache 8G --temperature 1 --seed 1
    for n in resident-nosplit resident-prof1 resident-prof2; do
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident" || echo "ids $n: DIFFER from resident"
    done
    for n in pinned-2500M pinned-600M pinned-400M pinned-400M-prof1; do
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/moe_resident-sampled.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/moe_$n.log" | head -1) && echo "ids $n: same as resident-sampled" || echo "ids $n: DIFFER from resident-sampled"
    done
    fi
    if [ "${TIER_BENCH:-0}" = 1 ]; then
        step "tier benchmark (tier_bench.sh)" 500 tier_bench.log bash "$S/tier_bench.sh" "$BIN" "$S/bin/h2d_bw" "$W" "$OUT"
        tail -40 "$OUT/tier_bench.log"
    fi
fi
if has dsv3; then # issue 13 item 5a's second row: decode of a VRAM-resident DeepSeek-V3-shape FP8 MoE, a few layers
    # (bench/make_synthetic_dsv3.py from the checkout: 1 dense + DSV3_LAYERS-1 MoE layers of DSV3_EXPERTS FP8 experts of the
    # real shapes, MLA, vocab DSV3_VOCAB), greedy and sampled, the same floor as the moe step, DELTAFIN_CUDA_PROF=1, ncu
    W=${WORK:-/tmp/moebench}
    D=$W/dsv3-${DSV3_LAYERS:-4}l-${DSV3_EXPERTS:-32}e-${DSV3_VOCAB:-8192}v
    mkdir -p "$W"
    [ -f "$D/model.safetensors.index.json" ] || step "synthetic DeepSeek-V3-shape FP8 model written" 300 dsv3_gen.log \
        python3 bench/make_synthetic_dsv3.py "$D" --layers "${DSV3_LAYERS:-4}" --experts "${DSV3_EXPERTS:-32}" --vocab "${DSV3_VOCAB:-8192}"
    tail -2 "$OUT/dsv3_gen.log" 2>/dev/null
    [ -f "$OUT/floor.log" ] || step "HBM floor (cuda_bench --floor)" 60 floor.log "$S/bin/cuda_bench" --floor
    [ -f "$OUT/h2d.log" ] || step "pinned H2D floor (h2d_bw)" 60 h2d.log "$S/bin/h2d_bw" 2048
    grep -h "floor" "$OUT/floor.log" | head -3
    DIDS=$(python3 -c 'import os; v=int(os.environ.get("DSV3_VOCAB","8192")); print(",".join(str(3 + i * 37 % (v - 100)) for i in range(512)))')
    ds() { erun dsv3 "$D" "$DIDS" "$@"; } # name, then options
    if [ -n "${DSV3_AB:-}" ]; then # round 12 (the FP8 one-token products): the masks of DSV3_AB (e.g. "64366 129902 195438 392046 523118":
        # the default; + bit 65536, the FP8 MoE down launch k_moe_down_f8; + bit 131072, the dense FP8 products in k_mm_bal; + 65536
        # + 262144, the FP8 gate/up launch at 2 blocks an SM; all three)
        # alternated three times (MAX_NEW tokens, default 128) INSTEAD of the default runs below; the ids of every run compared with
        # the first mask's first run (every bit of round 12 keeps the bits: all must be the same); the mean per mask; ncu of
        # DSV3_NCU (default: the first and the last mask of DSV3_AB; none: none)
        # an entry MASK,VAR=VALUE[,VAR=VALUE...] also sets those variables (e.g. 916334,DELTAFIN_CUDA_F8_WK1=1); in a subshell
        # (its failures are not counted)
        for r in 1 2 3; do for L in $DSV3_AB; do
            if [ "${L%%,*}" = "$L" ]; then DELTAFIN_CUDA_LEAN=$L ds "lean$L-r$r" --gpu-memory 100G
            else (export DELTAFIN_CUDA_LEAN="${L%%,*}"; for e in $(echo "${L#*,}" | tr , " "); do export "$e"; done; ds "lean$L-r$r" --gpu-memory 100G); fi
        done; done
        set -- $DSV3_AB
        for r in 1 2 3; do for L in $DSV3_AB; do
            cmp -s <(grep -E '^[0-9 ]+$' "$OUT/dsv3_lean$1-r1.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/dsv3_lean$L-r$r.log" | head -1) && echo "ids dsv3 lean$L-r$r: same as lean$1-r1" || echo "ids dsv3 lean$L-r$r: DIFFER from lean$1-r1"
        done; done
        for L in $DSV3_AB; do
            mask_mean "dsv3_lean$L" "dsv3 mask $L"
        done
        DSV3_NCU=${DSV3_NCU:-$1 ${@: -1}}
        [ "$DSV3_NCU" = none ] && DSV3_NCU=
        for L in $DSV3_NCU; do
            (export DELTAFIN_CUDA_LEAN="${L%%,*}"; [ "${L%%,*}" = "$L" ] || for e in $(echo "${L#*,}" | tr , " "); do export "$e"; done; ncu_dec "$OUT/ncu_dsv3_lean$L.csv" "$D" "${DIDS%%,1[0-9][0-9][0-9]*}" "${DSV3_NCU_NEW:-300}" "${DSV3_NCU_SKIP:-3000}" &&
                echo "ncu of the dsv3 decode, DELTAFIN_CUDA_LEAN=$L:" &&
                MOE_LAYERS=$((${DSV3_LAYERS:-4} - 1)) python3 "$S/ncu_sum.py" "$OUT/ncu_dsv3_lean$L.csv")
        done
        echo "dsv3 decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/dsv3_*.log | sed 's/.*dsv3_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
    else
    for r in 1 2 3; do ds "resident-r$r" --gpu-memory 100G; done
    [ "${DSV3_MLA0:-0}" = 1 ] && DELTAFIN_CUDA_MLA_DEC=0 ds resident-mla0 --gpu-memory 100G # the MLA decode of round 1 (k_attn_mla)
    ds resident-sampled --gpu-memory 100G --temperature 1 --seed 1
    DELTAFIN_CUDA_PROF=1 DELTAFIN_CUDA_PROF_DECODE=1 ds resident-prof1 --gpu-memory 100G
    for n in resident-r2 resident-r3 resident-prof1; do
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/dsv3_resident-r1.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/dsv3_$n.log" | head -1) && echo "ids dsv3 $n: same as r1" || echo "ids dsv3 $n: DIFFER from r1"
    done
    if [ "${DSV3_NCU:-1}" = 1 ]; then
        ncu_dec "$OUT/ncu_dsv3.csv" "$D" "${DIDS%%,1[0-9][0-9][0-9]*}" "${DSV3_NCU_NEW:-300}" "${DSV3_NCU_SKIP:-3000}" && echo "ncu of the dsv3 decode:" &&
            MOE_LAYERS=$((${DSV3_LAYERS:-4} - 1)) python3 "$S/ncu_sum.py" "$OUT/ncu_dsv3.csv"
    fi
    echo "dsv3 decode tok/s by run:"; grep -H "^\[stats\] prefill" "$OUT"/dsv3_*.log | sed 's/.*dsv3_\(.*\)\.log:.*(\([0-9.]*\) tok\/s, \([0-9.]*\) GB.*/\1 \2 \3/'
    fi
    if [ "${DSV3_PREFILL_PROF:-0}" = 1 ]; then # where the 512-token prefill goes: each op waits for its kernels (DELTAFIN_CUDA_PROF=2),
        # the whole run (no PROF_DECODE), one token; then the MLA decode launches for the prefill too (DELTAFIN_CUDA_MLA_DEC_N=512)
        DELTAFIN_CUDA_PROF=2 MAX_NEW=1 ds prefill-prof2 --gpu-memory 100G
        DELTAFIN_CUDA_MLA_DEC_N=512 DELTAFIN_CUDA_PROF=2 MAX_NEW=1 ds prefill-prof2-mladec512 --gpu-memory 100G
        for k in 1 2; do for N in 4 512; do DELTAFIN_CUDA_MLA_DEC_N=$N MAX_NEW=16 ds "prefill-mladec$N-r$k" --gpu-memory 100G; done; done
        cmp -s <(grep -E '^[0-9 ]+$' "$OUT/dsv3_prefill-mladec4-r1.log" | head -1) <(grep -E '^[0-9 ]+$' "$OUT/dsv3_prefill-mladec512-r1.log" | head -1) && echo "ids dsv3 prefill mladec 512: same as 4" || echo "ids dsv3 prefill mladec 512: differ from 4 (other sums in the prefill's attention)"
        grep -H "^\[stats\] prefill" "$OUT"/dsv3_prefill-mladec*.log | sed 's/.*dsv3_\(.*\)\.log:.*prefill 512 tokens in \([0-9.]*\) s (\([0-9.]*\) tok.*/\1: prefill \2 s, \3 tok\/s/'
    fi
fi
if has fp8mv; then # the FP8 one-token product's arithmetic on DeepSeek-V3's dense shapes (bench/cuda/fp8_gemv.cu), and where
    # cuobjdump is there the SASS of its kernels (instructions per 16-byte step)
    step "fp8_gemv (FP8 one-token product variants)" 240 fp8_gemv.log "$S/bin/fp8_gemv" ${FP8MV_REPS:-50}
    cat "$OUT/fp8_gemv.log"
    if [ -n "${FP8MV_NCU:-}" ] && [ -n "$NCU" ]; then # ncu's time of the variants' kernels on the shapes named FP8MV_NCU (e.g. "o 7168"):
        # the same tool the model's kernel times come from (does ncu read the event-timed kernels the same?)
        timeout 120 "$NCU" --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv -k 'regex:k_(ab|t|f)' \
            "$S/bin/fp8_gemv" 3 "$FP8MV_NCU" >"$OUT/ncu_fp8_gemv.csv" 2>&1
        python3 "$S/ncu_sum.py" "$OUT/ncu_fp8_gemv.csv" | head -12
    fi
    CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
    [ -n "$CUOBJ" ] && "$CUOBJ" -sass "$S/bin/fp8_gemv" >"$OUT/fp8_gemv.sass" 2>&1
fi
if has mdown; then # the FP8 MoE down product's memory schedules on DeepSeek-V3's routed down shape (bench/cuda/moe_down_bench.cu)
    step "moe_down_bench (FP8 MoE down schedules)" 240 moe_down_bench.log "$S/bin/moe_down_bench" ${MDOWN_REPS:-50}
    cat "$OUT/moe_down_bench.log"
fi
if has bench; then
    step "benchmark (cuda_bench ${BENCH_ARGS:---quick})" 300 bench.log "$S/bin/cuda_bench" ${BENCH_ARGS:---quick}
    cat "$OUT/bench.log"
fi
date -u
# one file back (the device tool returns a few files only)
tar czf /tmp/device_run_logs.tgz -C "$OUT" . && find "$OUT" -type f -delete && mv /tmp/device_run_logs.tgz "$OUT/logs.tgz"
echo "device_run: $fail failed steps"
exit $fail
