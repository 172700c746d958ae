#!/usr/bin/env bash
# mtp_diag.sh BIN REPO OUT - when test_spec_mtp.py -k transformers fails on the device because the
# reference (tests/tools/dsv3_mtp_hf.py) cannot run with the device's transformers (5.x runs the MoE
# experts through torch's grouped_mm, which refuses float64), this runs a patched COPY of it (in /tmp;
# the file in the repository is not changed) in two ways and compares deltafin's MTP logits against each
# as the test does (rel L2 per entry, argmax): a) float64 with experts_implementation="eager",
# b) the reference in float32 (grouped_mm takes it). Prints the numbers; exit 0 always (a diagnostic).
BIN=$1 REPO=$2 OUT=${3:-/tmp}
M=$REPO/tests/data/models/deepseek-v3-bf16
IDS=0,418,41,102,13,245,222,10,321,237,76,198,90,173,352,356,42,339,476,491
T=$(mktemp -d)
"$BIN" eval --model "$M" --threads 1 --ids "$IDS" --dump-mtp-logits "$T/df.f32" >"$T/df.log" 2>&1 || { echo "mtp_diag: deltafin eval failed:"; tail -3 "$T/df.log"; exit 0; }
sed 's/attn_implementation="eager")/attn_implementation="eager", experts_implementation="eager")/' "$REPO/tests/tools/dsv3_mtp_hf.py" >"$T/ref_eager64.py"
sed 's/dt = torch.float64/dt = torch.float32/' "$REPO/tests/tools/dsv3_mtp_hf.py" >"$T/ref_f32.py"
for v in eager64 f32; do
    if python3 "$T/ref_$v.py" "$M" "$IDS" "$T/ref_$v.f32" >"$T/ref_$v.log" 2>&1; then
        python3 - "$T/df.f32" "$T/ref_$v.f32" "$v" <<'PY'
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32)
b = np.fromfile(sys.argv[2], dtype=np.float32)
n = 19
a, b = a.reshape(n, -1), b.reshape(n, -1)
errs = [float(np.linalg.norm(x - y) / np.linalg.norm(y)) for x, y in zip(a, b)]
same = sum(int(x.argmax() == y.argmax()) for x, y in zip(a, b))
print(f"mtp_diag ({sys.argv[3]} reference): {n} entries, max rel L2 {max(errs):.3g} (the test's bound 1e-4), argmax equal at {same}/{n}")
PY
    else
        echo "mtp_diag ($v reference): the reference failed: $(tail -1 "$T/ref_$v.log")"
    fi
done
cp "$T"/ref_*.log "$OUT/" 2>/dev/null
rm -rf "$T"
exit 0
