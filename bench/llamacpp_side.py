#!/usr/bin/env python3
"""llamacpp_side.py - deltafin and llama.cpp side by side on one GGUF file (issue 17): decode of 128 tokens and
prefill of 512 tokens, the same ids into both, the same thread count, runs interleaved (the order alternates per
repetition), medians and min-max, `deltafin bench floors` before and after.

    python3 bench/llamacpp_side.py [--bin ./build/deltafin] [--threads 2] [--reps 5] MODEL.gguf [MODEL2.gguf ...]

llama.cpp comes from its Python package (`CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python diskcache`:
pip builds llama.cpp from source with this machine's compiler, ~10 minutes on 2 cores; GGML_NATIVE targets this CPU
as a plain llama.cpp build does; the binding imports diskcache). It is a
benchmark-only dependency: nothing of it is linked into deltafin, and tools/install_deps.sh does not install it.

What is timed:
  - llama.cpp: the wall time of the binding's eval calls (llama_decode plus the binding's copy of the logits into
    its numpy array; the argmax per decode token is counted too, as deltafin's sampling is). The binding's
    performance counters read 0 in this version (its contexts are made without them), and the binding's own cost
    is tens of microseconds per call against milliseconds of llama_decode.
  - deltafin: `run --stats` (prefill: the prompt's forward; decode: the generated tokens' steps, sampling included).
Decode prompt: "Once upon a time, in a small village" (tokenized by `deltafin tokenize` from the GGUF), then 128
greedy tokens (EOS ignored). Generated ids are compared
for information only: llama.cpp rounds activations to 8 bits in its quantized products, deltafin keeps f32, so
greedy paths may part.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np


DECODE_PROMPT = "Once upon a time, in a small village"


def ids512():
    return [i * 37 % 49000 + 10 for i in range(512)]


def df_rate(bin_, model, threads, ids, max_new, what):
    p = subprocess.run([bin_, "run", "--model", model, "--threads", str(threads), "--ids", ",".join(map(str, ids)),
                        "--max-new", str(max_new), "--ignore-eos", "--print-ids", "--stats"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode:
        sys.exit(f"deltafin failed: {p.stderr}")
    m = re.search(rf"{what} \d+ tokens in [0-9.]+ s \(([0-9.]+) tok/s", p.stderr)
    if not m:
        sys.exit(f"no '{what}' rate in deltafin's --stats:\n{p.stderr}")
    return float(m.group(1)), [int(x) for x in re.findall(r"\d+", p.stdout)]


class Llama:
    def __init__(self, model, threads):
        import llama_cpp
        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.llm.eval([1, 2, 3])  # first call: buffers and thread start-up outside the timings
        self.ctx = self.llm._ctx.ctx
        self.nv = self.llm.n_vocab()

    def _clear(self):
        self.llm.reset()
        mem = self.lc.llama_get_memory(self.ctx) if hasattr(self.lc, "llama_get_memory") else None
        if mem is not None:
            self.lc.llama_memory_clear(mem, True)
        else:
            self.lc.llama_kv_self_clear(self.ctx)

    def prefill(self, ids):
        self._clear()
        t = time.perf_counter()
        self.llm.eval(ids)
        return len(ids) / (time.perf_counter() - t)

    def decode(self, ids, n):
        self._clear()
        self.llm.eval(ids)
        out = []
        t = time.perf_counter()
        for _ in range(n):
            last = np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, -1), shape=(self.nv,))
            tok = int(np.argmax(last))
            out.append(tok)
            self.llm.eval([tok])
        return n / (time.perf_counter() - t), out


def med(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"


def floors(bin_, threads):
    return subprocess.run([bin_, "bench", "floors", "--threads", str(threads)], capture_output=True, text=True,
                          timeout=300).stdout.strip().replace("\n", "; ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--bin", default=os.environ.get("DELTAFIN_BIN", "./build/deltafin"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new", type=int, default=128)
    a = ap.parse_args()
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llama_cpp not installed: CMAKE_ARGS='-DGGML_NATIVE=ON' pip install llama-cpp-python diskcache")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, "
          f"load {open('/proc/loadavg').read().split()[:3]}, llama-cpp-python {llama_cpp.__version__}, "
          f"threads {a.threads}, reps {a.reps}")
    print(f"floors before: {floors(a.bin, a.threads)}")
    pre_ids = ids512()
    for model in a.models:
        dec_ids = json.loads(subprocess.run([a.bin, "tokenize", "--tokenizer", model], input=DECODE_PROMPT,
                                            capture_output=True, text=True, check=True).stdout)
        ll = Llama(model, a.threads)
        r = {k: [] for k in ("df_dec", "ll_dec", "df_pre", "ll_pre")}
        same = []
        for rep in range(a.reps):
            order = ("df", "ll") if rep % 2 == 0 else ("ll", "df")
            for who in order:
                if who == "df":
                    rate, df_ids = df_rate(a.bin, model, a.threads, dec_ids, a.new, "decode")
                    r["df_dec"].append(rate)
                    r["df_pre"].append(df_rate(a.bin, model, a.threads, pre_ids, 1, "prefill")[0])
                else:
                    rate, ll_ids = ll.decode(dec_ids, a.new)
                    r["ll_dec"].append(rate)
                    r["ll_pre"].append(ll.prefill(pre_ids))
            gen = df_ids[len(dec_ids):] if len(df_ids) > a.new else df_ids
            same.append(next((i for i, (x, y) in enumerate(zip(gen, ll_ids)) if x != y), min(len(gen), len(ll_ids))))
        name = os.path.basename(model)
        dd, ld = statistics.median(r["df_dec"]), statistics.median(r["ll_dec"])
        dp, lp = statistics.median(r["df_pre"]), statistics.median(r["ll_pre"])
        print(f"{name}: decode {a.new} tok/s deltafin {med(r['df_dec'])} llama.cpp {med(r['ll_dec'])} = {dd / ld:.2f}x; "
              f"prefill 512 tok/s deltafin {med(r['df_pre'])} llama.cpp {med(r['ll_pre'])} = {dp / lp:.2f}x; "
              f"greedy ids equal for the first {min(same)}-{max(same)} of {a.new}")
        del ll
    print(f"floors after: {floors(a.bin, a.threads)}")


if __name__ == "__main__":
    main()
