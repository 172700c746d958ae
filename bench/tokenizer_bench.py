#!/usr/bin/env python3
"""Encode throughput (MB/s) of deltafin's native tokenizer vs HF `tokenizers`
and `tiktoken`, one thread and all threads, same corpus, same machine.

usage: python3 bench/tokenizer_bench.py [--mb 8] [--reps 3] [--json out.json]
       python3 bench/tokenizer_bench.py --scaling 9 [--cpus 2,3] [--mb 8]

--scaling N: deltafin only, one thread vs two threads on long inputs: N
interleaved rounds, each running the driver once per tokenizer with 1 thread
(pinned to the first of --cpus) and once with 2 threads (pinned to both);
prints best, median and range of MB/s and the ratios, plus the CPU seconds
(all threads) of the best runs, so duplicated work shows apart from a busy
machine. Check `uptime` first: other work on the same cores skews the ratio.
--driver, --corpus and --fixtures run a prebuilt (e.g. static) driver on a
given corpus file elsewhere.

Corpus: Python standard-library sources (code, English comments and
docstrings) interleaved with multilingual prose (CJK, Arabic, Hindi, Thai,
Cyrillic, emoji), cut to --mb MiB; a fixed, reproducible mix. Tokenizers: the
fixtures in ../shared/fixtures/tokenizers (Qwen3, DeepSeek-V3: HF tokenizers;
o200k: tiktoken). Timing excludes loading. For HF "all threads" is
encode_batch over the corpus lines (rayon); for tiktoken it is
encode_ordinary_batch with num_threads = cores; for deltafin it is one
df_tok_encode call with n_threads = 0 (all cores) on the whole text.
The deltafin driver (bench/tokenizer_bench.c) is compiled into a temp dir."""
import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIX = REPO.parent / "shared" / "fixtures" / "tokenizers"
PROSE = [
    "我们的目标是星辰大海。人工智能正在改变世界，机器学习很重要！",
    "日本語の文章です。カタカナとひらがな、そして漢字。",
    "العربية لغة جميلة، وهي لغة القرآن الكريم.",
    "हिन्दी भारत की राजभाषा है। क्षत्रिय, ज्ञान, श्री।",
    "ภาษาไทยเป็นภาษาที่สวยงาม ไม่มีการเว้นวรรคระหว่างคำ",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Le cœur a ses raisons que la raison ne connaît point. 👨‍👩‍👧‍👦 🇫🇷",
]


def corpus(mb):
    lib = Path(sysconfig.get_paths()["stdlib"])
    out, size, i = [], 0, 0
    for f in sorted(lib.glob("*.py")):
        s = f.read_text(errors="replace")
        out.append(s)
        out.append(PROSE[i % len(PROSE)] * 3 + "\n")
        i += 1
        size += len(s.encode())
        if size >= mb << 20:
            break
    text = "".join(out).encode()[: mb << 20].decode(errors="ignore")
    return text


def build_driver(tmp):
    exe = Path(tmp) / "tokenizer_bench"
    # the tok module and what it links against (format: the GGUF vocabulary; util), as the Makefile builds them
    srcs = [str(p) for d in ("tok", "format") for p in sorted((REPO / "src" / d).glob("*.c"))]
    srcs += [str(REPO / "src" / "util" / "bulkread.c")]
    cmd = ["cc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-march=native", "-I" + str(REPO / "include"), "-I" + str(REPO / "src"),
           "-o", str(exe), str(REPO / "bench" / "tokenizer_bench.c"), *srcs, str(REPO / "src" / "util" / "util.c"),
           "-ljansson", "-lpcre2-8", "-luring", "-lxxhash", "-lm", "-pthread"]
    subprocess.run(cmd, check=True)
    return exe


def best(fn, reps):
    b = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        b = min(b, time.perf_counter() - t0)
    return b


def scaling(a):
    import statistics as st
    global FIX
    if a.fixtures:
        FIX = Path(a.fixtures)
    data = Path(a.corpus).read_bytes() if a.corpus else corpus(a.mb).encode()
    cpus = a.cpus.split(",")
    print(f"corpus {len(data) / 1e6:.2f} MB, cpus {a.cpus}, load {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(a.driver).resolve() if a.driver else build_driver(tmp)
        f = Path(tmp) / "corpus.txt"
        f.write_bytes(data)
        names = ("qwen3", "deepseek-v3", "o200k")
        runs = {(n, th): [] for n in names for th in (1, 2)}
        for _ in range(a.scaling):
            for name in names:
                path = FIX / "o200k" / "o200k_base.tiktoken" if name == "o200k" else FIX / name
                for th in (1, 2):
                    pin = ["taskset", "-c", ",".join(cpus[:th])]
                    r = subprocess.run(pin + [str(exe), str(path), str(f), str(th), str(a.reps)], capture_output=True, text=True, check=True)
                    runs[(name, th)].append([float(x) for x in r.stdout.split()[2:4]])
        results = []
        for name in names:
            one, two = runs[(name, 1)], runs[(name, 2)]
            m1, m2 = [x[0] for x in one], [x[0] for x in two]
            row = {"tokenizer": name, "1t best": max(m1), "1t median": st.median(m1), "1t range": [min(m1), max(m1)],
                   "2t best": max(m2), "2t median": st.median(m2), "2t range": [min(m2), max(m2)],
                   "ratio best": round(max(m2) / max(m1), 2), "ratio median": round(st.median(m2) / st.median(m1), 2),
                   "cpu s 1t best": max(one)[1], "cpu s 2t best": max(two)[1]}
            results.append(row)
            print(json.dumps(row), flush=True)
    print(f"load after {os.getloadavg()}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--scaling", type=int, default=0)
    ap.add_argument("--cpus", default="0,1")
    ap.add_argument("--driver", help="a prebuilt tokenizer_bench driver (else compiled here)")
    ap.add_argument("--corpus", help="a corpus file (else generated from this Python's stdlib)")
    ap.add_argument("--fixtures", help="the tokenizer fixtures directory")
    a = ap.parse_args()
    if a.scaling:
        return scaling(a)
    text = corpus(a.mb)
    data = text.encode()
    mb = len(data) / 1e6
    ncpu = os.cpu_count()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(tmp)
        f = Path(tmp) / "corpus.txt"
        f.write_bytes(data)
        lines = text.splitlines(keepends=True)
        from tokenizers import Tokenizer
        import tiktoken
        import tiktoken.load
        for name in ("qwen3", "deepseek-v3", "o200k"):
            row = {"tokenizer": name, "mb": round(mb, 2), "cores": ncpu}
            if name == "o200k":
                j = json.loads((FIX / "o200k" / "o200k_base.json").read_text())
                enc = tiktoken.Encoding("o200k", pat_str=j["pat_str"], special_tokens=j["special_tokens"],
                                        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(FIX / "o200k" / "o200k_base.tiktoken")))
                ref = "tiktoken"
                t1 = best(lambda: enc.encode_ordinary(text), a.reps)
                tn = best(lambda: enc.encode_ordinary_batch(lines, num_threads=ncpu), a.reps)
                path = FIX / "o200k" / "o200k_base.tiktoken"
            else:
                tk = Tokenizer.from_file(str(FIX / name / "tokenizer.json"))
                ref = "hf-tokenizers"
                t1 = best(lambda: tk.encode(text, add_special_tokens=False), a.reps)
                tn = best(lambda: tk.encode_batch(lines, add_special_tokens=False), a.reps)
                path = FIX / name
            row[ref + " 1t MB/s"] = round(mb / t1, 2)
            row[ref + " all MB/s"] = round(mb / tn, 2)
            for th, key in ((1, "deltafin 1t MB/s"), (0, "deltafin all MB/s")):
                r = subprocess.run([str(exe), str(path), str(f), str(th), str(a.reps)], capture_output=True, text=True, check=True)
                row[key] = float(r.stdout.split()[2])
            row["speedup 1t"] = round(row["deltafin 1t MB/s"] / row[ref + " 1t MB/s"], 2)
            results.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
