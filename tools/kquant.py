"""Round-to-nearest quantizers for the GGML K-quant block types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), for making
test files only. gguf-py ships dequantizers for these types but no quantizers (quantize() raises
NotImplementedError), so the test tools pack blocks themselves; what a block *means* is always taken from
gguf-py's dequantizer, which `check()` compares against.

The scale choice is plain min/max round-to-nearest (llama.cpp's quantizers search scales to minimise the
error; that changes which values get stored, not how a block is laid out or read). Layouts (QK_K = 256):

    Q2_K  scales[16] (lo 4 bits scale, hi 4 bits min) qs[64]  d dmin         x = d*sc*q - dmin*m, q 0..3
    Q3_K  hmask[32] qs[64] scales[12] (6-bit, -32)    d                      x = d*(sc-32)*q, q -4..3
    Q4_K  d dmin scales[12] (6-bit sc/min pairs) qs[128]                      x = d*sc*q - dmin*m, q 0..15
    Q5_K  d dmin scales[12] qh[32] qs[128]                                    x = d*sc*q - dmin*m, q 0..31
    Q6_K  ql[128] qh[64] scales[16] (int8) d                                  x = d*sc*q, q -32..31

    python3 tools/kquant.py      # self-check against gguf.quants.dequantize
"""
import numpy as np

QK_K = 256


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def _blocks(x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    assert x.shape[-1] % QK_K == 0, f"row length {x.shape[-1]} is not a multiple of {QK_K}"
    return x.reshape(-1, QK_K), x.shape


def _out(blocks, shape):
    """Blocks back into the tensor's shape, the last axis now counting bytes."""
    return blocks.reshape(*shape[:-1], -1)


def _affine(xb, nsub, qmax, smax):
    """Per sub-block scale/min for x ~ d*sc*q - dmin*m (q in 0..qmax, sc/m in 0..smax)."""
    n = xb.shape[0]
    xs = xb.reshape(n, nsub, -1)
    lo = np.minimum(xs.min(-1), 0.0)
    hi = xs.max(-1)
    scale = (hi - lo) / qmax
    mn = -lo
    d = _f16(scale.max(-1) / smax)
    dmin = _f16(mn.max(-1) / smax)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.clip(np.rint(scale / df), 0, smax), 0).astype(np.uint8)
        m = np.where(dminf > 0, np.clip(np.rint(mn / dminf), 0, smax), 0).astype(np.uint8)
        step = (df * sc)[..., None]
        off = (dminf * m)[..., None]
        q = np.where(step > 0, np.clip(np.rint((xs + off) / step), 0, qmax), 0).astype(np.uint8)
    return d, dmin, sc, m, q.reshape(n, -1)


def _pack_scale_min_k4(sc, m):
    """8 six-bit scales and mins into the 12 bytes Q4_K/Q5_K use (inverse of gguf-py get_scale_min)."""
    n = sc.shape[0]
    out = np.zeros((n, 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return out


def _pack_2bit(q):
    """256 two-bit values -> 64 bytes: element a*128 + s*32 + l lives in byte a*32 + l at bit 2s."""
    n = q.shape[0]
    q = q.reshape(n, 2, 4, 32).astype(np.uint8)
    b = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return b.reshape(n, 64)


def _pack_bits(bits):
    """256 one-bit values -> 32 bytes: element j*32 + l lives in byte l at bit j."""
    n = bits.shape[0]
    b = bits.reshape(n, 8, 32).astype(np.uint8)
    out = np.zeros((n, 32), dtype=np.uint8)
    for j in range(8):
        out |= b[:, j] << j
    return out


def _pack_nibbles_k4(q):
    """256 four-bit values -> 128 bytes: sub-blocks 2g and 2g+1 share bytes g*32..g*32+31 (lo, hi)."""
    n = q.shape[0]
    q = q.reshape(n, 4, 2, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)


def q2_k(x):
    xb, shape = _blocks(x)
    d, dmin, sc, m, q = _affine(xb, 16, 3, 15)
    blk = np.concatenate([(sc | (m << 4)).astype(np.uint8), _pack_2bit(q), d.view(np.uint8).reshape(-1, 2),
                          dmin.view(np.uint8).reshape(-1, 2)], axis=1)
    return _out(blk, shape)


def q4_k(x):
    xb, shape = _blocks(x)
    d, dmin, sc, m, q = _affine(xb, 8, 15, 63)
    blk = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                          _pack_scale_min_k4(sc, m), _pack_nibbles_k4(q)], axis=1)
    return _out(blk, shape)


def q5_k(x):
    xb, shape = _blocks(x)
    d, dmin, sc, m, q = _affine(xb, 8, 31, 63)
    blk = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                          _pack_scale_min_k4(sc, m), _pack_bits(q >> 4), _pack_nibbles_k4(q & 0xF)], axis=1)
    return _out(blk, shape)


def _symmetric(xb, nsub, qlo, qhi, smax):
    """Per sub-block signed scale for x ~ d*sc*q, q in qlo..qhi, sc in 0..smax (sign folded into q)."""
    n = xb.shape[0]
    xs = xb.reshape(n, nsub, -1)
    scale = np.abs(xs).max(-1) / -qlo
    d = _f16(scale.max(-1) / smax)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.clip(np.rint(scale / df), 0, smax), 0).astype(np.int32)
        step = (df * sc)[..., None]
        q = np.where(step > 0, np.clip(np.rint(xs / step), qlo, qhi), 0).astype(np.int32)
    return d, sc, q.reshape(n, -1)


def q3_k(x):
    xb, shape = _blocks(x)
    d, sc, q = _symmetric(xb, 16, -4, 3, 31)
    n = xb.shape[0]
    hbit = (q >= 0).astype(np.uint8)            # gguf-py: q = ql - 4 * (1 - hbit)
    ql = np.where(q >= 0, q, q + 4).astype(np.uint8)
    s6 = (sc + 32).astype(np.uint8)             # stored 6-bit, value - 32
    scales = np.zeros((n, 12), dtype=np.uint8)
    lo, hi = s6 & 0x0F, s6 >> 4
    scales[:, 0:8] = lo[:, 0:8] | (lo[:, 8:16] << 4)
    h = hi.reshape(n, 4, 4)                     # scale index s*4 + k -> byte 8 + k at bit 2s
    scales[:, 8:12] = h[:, 0] | (h[:, 1] << 2) | (h[:, 2] << 4) | (h[:, 3] << 6)
    blk = np.concatenate([_pack_bits(hbit), _pack_2bit(ql), scales, d.view(np.uint8).reshape(-1, 2)], axis=1)
    return _out(blk, shape)


def q6_k(x):
    xb, shape = _blocks(x)
    d, sc, q = _symmetric(xb, 16, -32, 31, 127)
    n = xb.shape[0]
    u = (q + 32).astype(np.uint8)
    lo, hi = u & 0x0F, u >> 4
    lo4 = lo.reshape(n, 2, 2, 64)               # element a*128 + h*64 + l -> ql[a*64 + l] nibble h
    ql = (lo4[:, :, 0] | (lo4[:, :, 1] << 4)).reshape(n, 128)
    qh = _pack_2bit(hi)                         # element a*128 + s*32 + l -> qh[a*32 + l] at bit 2s
    blk = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)
    return _out(blk, shape)


QUANTIZERS = {"Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}


def check(seed=0):
    """Packs random rows, reads them back with gguf-py's dequantizer and checks the error is what
    round-to-nearest with these bit widths gives (a packing mistake gives errors of the order of x)."""
    import gguf
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 512)).astype(np.float32) * 0.05
    x[0, :256] = 0.0                             # an all-zero block
    x[1] += 0.2                                  # all-positive rows (min 0 for the affine types)
    worst = {"Q2_K": 0.45, "Q3_K": 0.35, "Q4_K": 0.08, "Q5_K": 0.04, "Q6_K": 0.02}
    for name, fn in QUANTIZERS.items():
        b = fn(x)
        y = gguf.quants.dequantize(b, getattr(gguf.GGMLQuantizationType, name)).reshape(x.shape)
        rel = np.linalg.norm(y - x) / np.linalg.norm(x)
        assert rel < worst[name], f"{name}: relative error {rel:.3f}"
        assert np.all(y[0, :256] == 0), name
        print(f"{name}: {b.shape[-1] // 2} bytes per 256 values, relative error {rel:.4f}")


if __name__ == "__main__":
    check()
