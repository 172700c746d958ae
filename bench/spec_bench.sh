#!/usr/bin/env bash
# spec_bench.sh - speculative decoding (issue 15): decode tokens/s with
# --spec none vs ngram vs auto on the same prompt, arms interleaved, the
# generated ids compared (they must be identical), medians and spread.
#
#   bench/spec_bench.sh [MODEL]     (default: the installed SmolLM2,
#                                     ~/.cache/deltafin/models/smollm2-135m-instruct/model.gguf;
#                                     ./deltafin setup --model smollm2-135m-instruct makes it)
# Env: DELTAFIN_BIN (default ./deltafin), REPS (default 3), MAX_NEW (default 200),
#      THREADS (default 1: steadier on a shared machine), SPEC_MAX (default 8),
#      RUN_ARGS (more options for every run, e.g. "--backend cuda" on a GPU
#      machine: bench/cuda/spec_cuda.sh).
#
# Prompts (rows):
#   edit:     the 158-line Python file bench/spec_edit_src.py in a code block,
#             "Change the function low_stock so that its default threshold
#             is 10 instead of 5. Reply with the whole updated file in one
#             code block." as the user message of SmolLM2's chat template
#             (ChatML with its default system message, written out here and
#             tokenized with `deltafin tokenize`), and the assistant's turn
#             prefilled with "```python\n" and the file's first line: the
#             answer copies the file (the copy share is printed: the share
#             of generated tokens inside a run of 8 that occurs in the
#             prompt), so prompt lookup drafts well;
#   edit-old: the step-1 prompt (a generated 129-line file,
#             bench/data/spec_edit.py, and "Rename the function mul_pairs to
#             multiply_pairs and return the whole file.", --chat): SmolLM2
#             explains the code instead of copying it; auto must not lose;
#   chat:     a plain question where drafting mostly fails (auto must not
#             lose).
# ROWS (default "edit edit-old chat") picks the rows.
#
# The MoE arm (ARM=moe bench/spec_bench.sh): a Qwen3-30B-A3B-shaped GGUF with
# its routed experts streamed through a small expert cache, --spec none vs
# ngram on an --ids prompt that repeats an 8-id pattern, interleaved: the
# expert bytes read per generated token (from --stats: independent of CPU
# load) and the wall time per run (load dependent), ids compared.
#   MOE_MODEL  (default bench/data/qwen3moe-2l.gguf, made on first use with
#              bench/make_synthetic_qwen3moe_gguf.py --layers 2: 3.7 GB);
#              MOE_BIG=1 uses bench/data/qwen3moe-30l.gguf (38.7 GB, over
#              RAM: minutes per run; make it with --layers 30)
#   MOE_CACHE  --expert-cache (default 100M: fewer slots than one token's
#              experts over all layers, so every plain step re-reads them)
#   MOE_NEW    tokens to generate (default 48)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DELTAFIN_BIN:-./deltafin}
REPS=${REPS:-3}
MAX_NEW=${MAX_NEW:-200}
THREADS=${THREADS:-1}
SPEC_MAX=${SPEC_MAX:-8}
MODEL=${1:-$HOME/.cache/deltafin/models/smollm2-135m-instruct/model.gguf}

if [ "${ARM:-dense}" = moe ]; then
    if [ "${MOE_BIG:-0}" = 1 ]; then MM=${MOE_MODEL:-bench/data/qwen3moe-30l.gguf}; else MM=${MOE_MODEL:-bench/data/qwen3moe-2l.gguf}; fi
    if [ ! -e "$MM" ]; then
        [ "${MOE_BIG:-0}" = 1 ] && { echo "$MM not found (bench/make_synthetic_qwen3moe_gguf.py $MM --layers 30)"; exit 2; }
        mkdir -p "$(dirname "$MM")"
        python3 bench/make_synthetic_qwen3moe_gguf.py "$MM" --layers 2
    fi
    CACHE=${MOE_CACHE:-100M}
    NEW=${MOE_NEW:-48}
    IDS=$(python3 -c "print(','.join(str(x) for x in [1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000] * 4))")
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    echo "== MoE arm: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $BIN; $MM; --expert-cache $CACHE; REPS=$REPS MAX_NEW=$NEW SPEC_MAX=$SPEC_MAX THREADS=$THREADS"
    for r in $(seq "$REPS"); do
        for a in none ngram; do
            t0=$(date +%s.%N)
            "$BIN" run --model "$MM" --threads "$THREADS" --ids "$IDS" --max-new "$NEW" --print-ids --stats --spec "$a" \
                --spec-max "$SPEC_MAX" --expert-cache "$CACHE" >"$TMP/$a.$r.ids" 2>"$TMP/$a.$r.err"
            wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
            mb=$(grep -o 'expert bytes read per generated token [0-9.]* MB' "$TMP/$a.$r.err" | grep -o '[0-9.]* MB' | cut -d' ' -f1)
            spec=$(grep -o '\[stats\] spec ngram: .*' "$TMP/$a.$r.err" | sed 's/\[stats\] spec ngram: //; s/time: drafting [0-9.]* s, //' || true)
            echo "$wall" >>"$TMP/$a.wall"
            echo "$mb" >>"$TMP/$a.mb"
            printf 'moe %-6s rep %d: %9s MB of experts per generated token, wall %6.2f s  %s\n' "$a" "$r" "$mb" "$wall" "$spec"
            cmp -s "$TMP/none.1.ids" "$TMP/$a.$r.ids" || { echo "MISMATCH: moe $a rep $r ids differ from none"; exit 1; }
        done
    done
    echo "-- moe: ids identical across arms and reps"
    for a in none ngram; do
        for f in mb wall; do
            sort -g "$TMP/$a.$f" | awk -v a="$a" -v f="$f" '{v[NR]=$1} END {m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2;
                printf "-- moe %-6s %-4s median %.3f (min %.3f, max %.3f, n=%d)\n", a, f, m, v[1], v[NR], NR}'
        done
    done
    exit 0
fi

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
EDIT_OLD="$(cat "$SRC")

Rename the function mul_pairs to multiply_pairs and return the whole file."
CHAT="Write a short paragraph about why the sky is blue."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ROWS=${ROWS:-edit edit-old chat}
NEWSRC=bench/spec_edit_src.py
# the edit row: SmolLM2's chat template written out, the answer prefilled with the code fence and the first line
python3 - "$NEWSRC" >"$TMP/edit.txt" <<'PY'
import sys
src = open(sys.argv[1]).read()
sys.stdout.write("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                 "<|im_start|>user\nHere is a Python file:\n\n```python\n" + src + "```\n\n"
                 "Change the function low_stock so that its default threshold is 10 instead of 5. "
                 "Reply with the whole updated file in one code block.<|im_end|>\n"
                 "<|im_start|>assistant\n```python\n" + src.split("\n")[0] + "\n")
PY
"$BIN" tokenize --tokenizer "$MODEL" <"$TMP/edit.txt" | tr -d '[] \n' >"$TMP/edit.ids"
echo "== $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $BIN; model $MODEL; edit: $(wc -l <"$NEWSRC") lines, $(awk -F, '{print NF}' "$TMP/edit.ids") prompt tokens; edit-old: $(wc -l <"$SRC") lines; REPS=$REPS MAX_NEW=$MAX_NEW THREADS=$THREADS SPEC_MAX=$SPEC_MAX RUN_ARGS=${RUN_ARGS:-}"
# the floors of this run (memory read with 1 and THREADS threads, peak f32 FMA), before the rows and after them
floors() { echo "-- floors ($1): $("$BIN" bench floors --threads "$THREADS" 2>/dev/null | tail -1)"; }
floors before
trap 'floors after; rm -rf "$TMP"' EXIT

one() { # prompt-name arm rep
    local p=$1 arm=$2 r=$3
    local -a in
    case $p in
        edit) in=(--ids "$(cat "$TMP/edit.ids")") ;;
        edit-old) in=(--chat --prompt "$EDIT_OLD") ;;
        *) in=(--chat --prompt "$CHAT") ;;
    esac
    # shellcheck disable=SC2086
    "$BIN" run --model "$MODEL" --threads "$THREADS" ${RUN_ARGS:-} "${in[@]}" --max-new "$MAX_NEW" --ignore-eos \
        --print-ids --stats --spec "$arm" --spec-max "$SPEC_MAX" >"$TMP/$p.$arm.$r.ids" 2>"$TMP/$p.$arm.$r.err"
    local tps spec
    tps=$(grep -o 'decode [0-9]* tokens in [0-9.]* s ([0-9.]* tok/s' "$TMP/$p.$arm.$r.err" | grep -o '[0-9.]* tok/s' | cut -d' ' -f1)
    spec=$(grep -o '\[stats\] spec .*' "$TMP/$p.$arm.$r.err" | sed 's/\[stats\] spec [a-z]*: //; s/ verify passes/ passes/; s/time: drafting [0-9.]* s, //' || true)
    echo "$tps" >>"$TMP/$p.$arm.tps"
    printf '%-8s %-6s rep %d: %8s tok/s  %s\n' "$p" "$arm" "$r" "$tps" "$spec"
}

for p in $ROWS; do
    arms="none ngram auto"
    [ "$p" = chat ] && arms="none auto"
    for r in $(seq "$REPS"); do for a in $arms; do one "$p" "$a" "$r"; done; done
    for a in $arms; do
        for r in $(seq "$REPS"); do
            cmp -s "$TMP/$p.none.1.ids" "$TMP/$p.$a.$r.ids" || { echo "MISMATCH: $p $a rep $r ids differ from none"; exit 1; }
        done
    done
    echo "-- $p: ids identical across arms and reps"
    if [ "$p" = edit ]; then # how much of the answer is a copy of the prompt
        python3 - "$TMP/edit.ids" "$TMP/edit.none.1.ids" <<'PY'
import sys
p = [int(x) for x in open(sys.argv[1]).read().split(",")]
o = [int(x) for x in open(sys.argv[2]).read().split()]
n = 8
grams = {tuple(p[j:j + n]) for j in range(len(p) - n + 1)}
cov = [0] * len(o)
for j in range(len(o) - n + 1):
    if tuple(o[j:j + n]) in grams:
        cov[j:j + n] = [1] * n
print(f"-- edit: copy share {sum(cov) / max(1, len(o)):.2f} (generated tokens inside a run of {n} that occurs in the prompt)")
PY
    fi
    for a in $arms; do
        sort -g "$TMP/$p.$a.tps" | awk -v p="$p" -v a="$a" '{v[NR]=$1} END {m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2;
            printf "-- %s %-6s median %.2f tok/s (min %.2f, max %.2f, n=%d)\n", p, a, m, v[1], v[NR], NR}'
    done
    for a in $arms; do # per repetition against none run just before it (the load moves less within a repetition)
        [ "$a" = none ] && continue
        paste "$TMP/$p.none.tps" "$TMP/$p.$a.tps" | awk '{printf "%.3f\n", $2 / $1}' >"$TMP/$p.$a.ratio"
        sort -g "$TMP/$p.$a.ratio" | awk -v p="$p" -v a="$a" -v all="$(tr '\n' ' ' <"$TMP/$p.$a.ratio")" '{v[NR]=$1}
            END {m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "-- %s %s/none per repetition: %s(median %.3f)\n", p, a, all, m}'
    done
done
