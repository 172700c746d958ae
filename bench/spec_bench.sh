#!/usr/bin/env bash
# spec_bench.sh - speculative decoding (issue 15): decode tokens/s with
# --spec none vs ngram vs auto on the same prompt, arms interleaved, the
# generated ids compared (they must be identical), medians and spread.
#
#   bench/spec_bench.sh [MODEL]     (default: the installed SmolLM2,
#                                     ~/.cache/deltafin/models/smollm2-135m-instruct/model.gguf;
#                                     ./deltafin setup --model smollm2-135m-instruct makes it)
# Env: DELTAFIN_BIN (default ./deltafin), REPS (default 3), MAX_NEW (default 200),
#      THREADS (default 1: steadier on a shared machine), SPEC_MAX (default 8).
#
# Prompts:
#   edit: a generated ~150-line Python file (bench/data/spec_edit.py) and
#         "rename the function X to Y and return the whole file" (chat
#         template): the answer repeats most of the file, so prompt lookup
#         drafts well;
#   chat: a plain question where drafting mostly fails (auto must not lose).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DELTAFIN_BIN:-./deltafin}
REPS=${REPS:-3}
MAX_NEW=${MAX_NEW:-200}
THREADS=${THREADS:-1}
SPEC_MAX=${SPEC_MAX:-8}
MODEL=${1:-$HOME/.cache/deltafin/models/smollm2-135m-instruct/model.gguf}
[ -e "$MODEL" ] || { echo "model $MODEL not found (./deltafin setup --model smollm2-135m-instruct)"; exit 2; }
mkdir -p bench/data
SRC=bench/data/spec_edit.py
python3 - "$SRC" <<'PY'
import sys
ops = [("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/"), ("mod", "%"), ("pow", "**"), ("floordiv", "//")]
lines = ['"""Small arithmetic helpers on lists of numbers."""', "", "import math", ""]
for name, op in ops:
    lines += [f"def {name}_pairs(xs, ys):", f'    """Element-wise {name} of two lists."""', "    out = []",
              "    for x, y in zip(xs, ys):", f"        out.append(x {op} y)", "    return out", "",
              f"def {name}_all(xs, v):", f'    """{name} of every element with v."""',
              f"    return [x {op} v for x in xs]", "", f"def {name}_reduce(xs, start):", "    acc = start",
              "    for x in xs:", f"        acc = acc {op} x", "    return acc", ""]
lines += ["def mean(xs):", "    return sum(xs) / len(xs) if xs else 0.0", "", "def norm(xs):",
          "    return math.sqrt(sum(x * x for x in xs))", ""]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
EDIT="$(cat "$SRC")

Rename the function mul_pairs to multiply_pairs and return the whole file."
CHAT="Write a short paragraph about why the sky is blue."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "== $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $BIN; model $MODEL; $(wc -l <"$SRC") lines of source; REPS=$REPS MAX_NEW=$MAX_NEW THREADS=$THREADS SPEC_MAX=$SPEC_MAX"

one() { # prompt-name arm rep
    local p=$1 arm=$2 r=$3 text
    if [ "$p" = edit ]; then text=$EDIT; else text=$CHAT; fi
    "$BIN" run --model "$MODEL" --threads "$THREADS" --chat --prompt "$text" --max-new "$MAX_NEW" --ignore-eos \
        --print-ids --stats --spec "$arm" --spec-max "$SPEC_MAX" >"$TMP/$p.$arm.$r.ids" 2>"$TMP/$p.$arm.$r.err"
    local tps spec
    tps=$(grep -o 'decode [0-9]* tokens in [0-9.]* s ([0-9.]* tok/s' "$TMP/$p.$arm.$r.err" | grep -o '[0-9.]* tok/s' | cut -d' ' -f1)
    spec=$(grep -o '\[stats\] spec .*' "$TMP/$p.$arm.$r.err" | sed 's/; time:.*//' | cut -c1-140 || true)
    echo "$tps" >>"$TMP/$p.$arm.tps"
    printf '%-5s %-6s rep %d: %8s tok/s  %s\n' "$p" "$arm" "$r" "$tps" "$spec"
}

for p in edit chat; do
    arms="none ngram auto"
    [ "$p" = chat ] && arms="none auto"
    for r in $(seq "$REPS"); do for a in $arms; do one "$p" "$a" "$r"; done; done
    for a in $arms; do
        for r in $(seq "$REPS"); do
            cmp -s "$TMP/$p.none.1.ids" "$TMP/$p.$a.$r.ids" || { echo "MISMATCH: $p $a rep $r ids differ from none"; exit 1; }
        done
    done
    echo "-- $p: ids identical across arms and reps"
    for a in $arms; do
        sort -g "$TMP/$p.$a.tps" | awk -v p="$p" -v a="$a" '{v[NR]=$1} END {m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2;
            printf "-- %s %-6s median %.2f tok/s (min %.2f, max %.2f, n=%d)\n", p, a, m, v[1], v[NR], NR}'
    done
done
