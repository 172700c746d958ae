"""A streaming safetensors shard writer for the synthetic benchmark checkpoints (make_synthetic_*.py): the
header first (offsets known in advance), then each tensor's bytes, taken from a random pool (the content does
not matter for speed) or filled with a constant.

Kinds: "ones" (BF16 1.0), "zeros", "f32small" (F32 0.01), or the name of a pool in `pools` (bytes, repeated
from an offset that differs per tensor)."""
import json
import math
import struct

SIZES = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}


class Writer:
    def __init__(self, path, pools):
        self.path, self.pools, self.tensors = path, pools, []

    def add(self, name, dtype, shape, kind):
        self.tensors.append((name, dtype, shape, math.prod(shape) * SIZES[dtype], kind))

    def write(self):
        hdr, off = {}, 0
        for name, dt, shape, n, _ in self.tensors:
            hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        h = json.dumps(hdr).encode()
        h += b" " * (-len(h) % 8)
        with open(self.path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for i, (name, dt, shape, n, kind) in enumerate(self.tensors):
                if kind in ("ones", "f32small"):  # constants, written in 1 MB pieces (no numpy needed)
                    unit = struct.pack("<H", 0x3F80) if kind == "ones" else struct.pack("<f", 1e-2)
                    piece = unit * ((1 << 20) // len(unit))
                    for o in range(0, n, len(piece)):
                        f.write(piece[:min(len(piece), n - o)])
                elif kind == "zeros":
                    f.write(bytes(n))
                else:
                    pool = self.pools[kind]
                    start, left = (i * 7919 * 4096) % (len(pool) // 2), n
                    while left:
                        k = min(left, len(pool) - start)
                        f.write(pool[start:start + k])
                        left -= k
                        start = 0
        return off
