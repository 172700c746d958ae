#!/usr/bin/env python3
"""sass_audit.py BINARY [CUOBJDUMP] - the read-only loads a kernel places before its wait for the kernel before it.

Every kernel of the CUDA backend may be launched programmatically (DELTAFIN_CUDA_LEAN bit 32): it is resident while
the kernel before it in the stream still runs, and griddepcontrol.wait (SASS: ACQBULK) is where it may first read what
that kernel wrote. ld.global.nc (SASS: LDG.E...CONSTANT; __ldg, or a load through a `const T *__restrict__` kernel
parameter) promises data that nothing writes while the reader runs, and ptxas schedules such loads freely, above the
wait too (round 18: k_moe_down_rt<..., H = 1> loaded h there and read stale values). Weights and scales are final
before the launch and may be read that way; activations may not (ld_act in cuda_int.cuh).

Prints, per kernel (template arguments folded), how many instances have a wait, and of those how many place a
read-only load before it, with the largest such count; then the instances' names (mangled) with their counts, for
reading their SASS (cuobjdump -sass -fun NAME BINARY). Exit status 0; this is a map for review, not a verdict.
"""
import collections
import re
import shutil
import subprocess
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cuobj = sys.argv[2] if len(sys.argv) > 2 else shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    sass = subprocess.run([cuobj, "-sass", sys.argv[1]], capture_output=True, text=True, check=True).stdout
    funcs = re.split(r"^\s*Function : ", sass, flags=re.M)[1:]
    per = collections.OrderedDict()
    hits = []
    for f in funcs:
        name = f.split("\n", 1)[0].strip()
        lines = f.split("\n")
        wait = next((i for i, l in enumerate(lines) if re.search(r"\bACQBULK\b", l)), None)
        m = re.match(r"_Z(\d+)", name)
        base = name[m.end():m.end() + int(m.group(1))] if m else name
        st = per.setdefault(base, [0, 0, 0, 0])
        st[0] += 1
        if wait is None:
            continue
        st[1] += 1
        nc = sum(1 for l in lines[:wait] if re.search(r"LDG\S*CONSTANT", l))
        if nc:
            st[2] += 1
            st[3] = max(st[3], nc)
            hits.append((name, nc))
    print("%-28s %9s %9s %22s %s" % ("kernel", "instances", "with wait", "read-only before wait", "(most in one)"))
    for base, (n, w, h, mx) in per.items():
        print("%-28s %9d %9d %22d %s" % (base, n, w, h, "(%d)" % mx if h else ""))
    print("\ninstances with read-only loads before the wait:")
    for name, nc in hits:
        print("  %4d  %s" % (nc, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
