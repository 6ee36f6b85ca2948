"""Bit-exact numpy emulation of the register-level fast decode: the spec the TIR/PTX fast path is tested against.

Input: 32-bit words as the kernel loads them (interleaved per :mod:`.interleave`; 8-bit words in plain byte order).
Every step is one PTX instruction on uint32 registers, emulated bit for bit by :mod:`.regops` (``lop3``, ``shr``,
``prmt``, ``add2`` / ``sub2`` / ``fma2`` for ``add/sub/fma.rn.{f16x2,bf16x2}``; re-exported here). bf16 ``sub`` is
written as ``fma.rn.bf16x2(a, 1.0, -b)`` below sm_90 (same result: both are one exact rounding of a - b). The TIR
emitter of this decode is :mod:`.decode`, whose programs run on the same emulation.

Decode of pair i (elements 2i, 2i+1 -> one f16x2 / bf16x2 register), MAGIC = 0x6400 (f16 1024.0, spacing 1 in
[1024, 2048), fields up to 10 bits) or 0x4300 (bf16 128.0, spacing 1 in [128, 256), fields up to 7 bits)::

    b in {1,2,4}:  x = lop3(word >> (b*i), M_b, MAGIC2, 0xEA)          # (a & b) | c  -> MAGIC + q
                   two's complement: lop3(word >> (b*i), M_b, MAGIC2 | SIGN_b, 0x6A)
                                     # (a & b) ^ c -> MAGIC + (q ^ 2^(b-1))
    b = 8 (f16):   x = prmt(word', 0x64646464, 0x4140 / 0x4342)       # {0x64, byte} per half -> 1024 + q
                   two's complement: word' = word ^ 0x80808080 (one lop3 per word), else word' = word
    then           unsigned:              h = x - MAGIC2                  (= q, exact)
                   int (both encodings):  h = x - (MAGIC + 2^(b-1))2      (= value, exact)
                   int1:                  h = fma(x - MAGIC2, 2.0, -1.0)  (= 2q - 1, exact)
    modes          none:       h
                   scale:      fma(h, S, -0.0)                  (-0.0 addend: same signed zeros as a multiply)
                   original:   fma(h - Z, S, -0.0)              (h - Z exact when Z is an integer, e.g. GPTQ zeros)
                   rescale:    fma(h, S, -Z)                    (one rounding; -Z = Z ^ 0x80008000)
                   quantized:  fma(x + (NEG_MAGIC | z)2, S, -0.0)   NEG_MAGIC = 0xE400 (-1024.0) / 0xC300 (-128.0):
                               (MAGIC + q) + -(MAGIC + z) = q - z exactly in ONE add, no MAGIC subtract
    e5m2 (f16):    h = prmt(word, 0, 0x1404 / 0x3424)   (byte -> high byte of each half: fp16 == e5m2 << 8)

Cost per 32-bit word (before scaling): b = 4 shift variant: 3 SHR + 4 LOP3 + 4 HSUB2; ``variant="marlin"`` (4-bit,
f16): 1 SHR + 4 LOP3 + 2 HSUB2 + 2 HFMA2; b = 8: 2 PRMT + 2 HSUB2 (+1 LOP3 for two's complement); b = 2 / 1: 7 / 15
SHR + 8 / 16 LOP3 + 8 / 16 HSUB2 (int1: + 16 HFMA2). Scales add one HFMA2 per register, "original" one HSUB2 more.

Precision rule: the exact subtract (q - z, or the MAGIC removal) always happens *before* the scale multiply. Folding
the magic into the scale, ``fma(x, S, -(MAGIC + z) * S)``, rounds the constant -(1024 + z) S to fp16 and is off by up
to half a quantization step (a test demonstrates it).

Which formats have a fast path here: :data:`FAST_PATHS`. Formats without one: nf4 (a 16-entry LUT, no arithmetic
trick), float4_e2m1fn / mxfp4 / nvfp4 (hardware ``cvt.rn.f16x2.e2m1x2`` only on sm_100a/sm_120a; no sm_80/90 trick
implemented here), float8_e4m3fn (hardware ``cvt.rn.f16x2.e4m3x2`` on sm_89+; the exponent-rebias trick gets the NaN
codes wrong, so it is not offered), e5m2 -> bf16, and every 8-bit integer format -> bf16 (8-bit codes do not fit the
7 mantissa bits of the bf16 magic). The TIR decode (:mod:`.decode`, ``FAST_DECODE``) adds table / hardware fast
paths on top of these arithmetic ones: e2m1 / nvfp4 -> f16 (prmt register LUT), e4m3 -> f16 (cvt, sm_89+), nf4
-> f16 / bf16 without a scale (a prmt byte-plane LUT of the rounded table) and 8-bit integers -> bf16 (a split
magic: the low seven bits in 0x4300, minus 128.0 or 256.0 by the top bit).
"""
from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, UnsupportedConfigError, choices
from .formats import get_format
from .regops import NP_HALF as _NP
from .regops import add2, fma2, lop3, pack2, prmt, shr, split2, sub2, u32
from .rounding import half_name

__all__ = ["FAST_PATHS", "VARIANTS", "MAGIC", "NEG_MAGIC", "fast_path_modes", "fast_decode", "lop3", "prmt", "shr",
           "add2", "sub2", "fma2", "pack2", "split2"]

MAGIC = {"float16": 0x6400, "bfloat16": 0x4300}
NEG_MAGIC = {"float16": 0xE400, "bfloat16": 0xC300}
_ALL_MODES = ("none", "scale", "original", "rescale", "quantized")


def _fast_paths() -> dict:
    t = {}
    for name in ("uint1", "uint2", "uint4", "uint8", "int1", "int2", "int4", "int8", "int2_ob", "int4_ob", "int8_ob"):
        fmt = get_format(name)
        modes = _ALL_MODES if fmt.kind == "uint" else ("none", "scale")  # zeros: unsigned formats only
        t[(name, "float16")] = modes
        if fmt.bits < 8:
            t[(name, "bfloat16")] = modes
    t[("float8_e5m2", "float16")] = ("none", "scale")
    return t


#: (format, out dtype) -> modes with a fast path in this emulation (everything else: see the module docstring)
FAST_PATHS: dict = _fast_paths()


def fast_path_modes(fmt, out_dtype) -> tuple:
    """Modes with a fast path for (``fmt``, ``out_dtype``); () if none."""
    return FAST_PATHS.get((get_format(fmt).name, half_name(out_dtype)), ())


def _const2(bits16: int) -> np.uint32:
    return np.uint32(bits16 | (bits16 << 16))


# ---------------------------------------------------------------------------------------------------- the decoder
def _pair_operand(vals, i, dtype):
    """Per-element operand array [..., E] -> register of pair i."""
    return pack2(vals[..., 2 * i], vals[..., 2 * i + 1], dtype)


#: variants of the decode: "shift" (one shift per pair, every format above) and "marlin" (4-bit -> f16 only)
VARIANTS = ("shift", "marlin")


def fast_decode(words, fmt, out_dtype="float16", mode="none", scale=None, zero=None,
                variant="shift") -> np.ndarray:
    """Decode interleaved 32-bit ``words`` [...] to values [..., 32/b] of ``out_dtype`` with the fast path.

    ``scale`` / ``zero``: arrays broadcastable to [..., 32/b] of per-element operands (each f16x2 register may hold
    two different values): ``scale`` in ``out_dtype``; ``zero`` in ``out_dtype`` for "original" / "rescale", or
    integer zero codes in [0, 2^b) for "quantized". Raises UnsupportedConfigError where no fast path exists.

    ``variant="marlin"`` (4-bit formats, float16 only): Marlin's two-mask decode on the same interleaved word, one
    shift per 8 values instead of three. Pairs 1 and 3 are taken in place at bits 4..7 / 20..23, giving
    1024 + 16q, then scaled back exactly: ``h = fma(x, 1/16, -64)`` (= q; -72 for the signed formats, since
    (1024 + 16q)/16 - 72 = q - 8), and in "quantized" mode ``fma(x, 1/16, -(64 + z))`` (= q - z; the constant is
    ``0xD400 | z << 4``). Pairs 0 and 2 decode as in the shift variant (on ``word`` and ``word >> 8``).
    """
    fmt = get_format(fmt)
    dtype = half_name(out_dtype)
    modes = FAST_PATHS.get((fmt.name, dtype), ())
    if mode not in modes:
        valid = sorted(f"{f}/{d}" for (f, d) in FAST_PATHS)
        raise UnsupportedConfigError(
            f"no fast decode for {fmt.name} -> {dtype} in mode {mode!r} (modes here: {choices(modes) or 'none'}); "
            f"formats with a fast path: {', '.join(valid)}")
    if variant not in VARIANTS:
        raise UnsupportedConfigError(f"variant {variant!r} is unknown; valid: {choices(VARIANTS)}")
    if variant == "marlin" and (fmt.bits != 4 or dtype != "float16"):
        raise UnsupportedConfigError("the marlin variant exists for 4-bit formats -> float16 only (the bf16 magic "
                                     "has no room for a nibble at bits 4..7); valid formats: uint4, int4, int4_ob")
    words = np.asarray(words)
    if not np.issubdtype(words.dtype, np.integer):
        raise ArgumentError(f"words must be 32-bit integers, got {words.dtype}")
    words = u32(words)
    b = fmt.bits
    e_count = 32 // b
    shape = words.shape + (e_count,)
    need_scale = mode != "none"
    if need_scale == (scale is None):
        raise ArgumentError(f"mode {mode!r} {'needs' if need_scale else 'takes no'} scale")
    if (mode in ("original", "rescale", "quantized")) == (zero is None):
        raise ArgumentError(f"mode {mode!r} {'needs' if zero is None else 'takes no'} zero")
    if scale is not None:
        scale = np.broadcast_to(np.asarray(scale).astype(_NP[dtype]), shape)
    if zero is not None:
        if mode == "quantized":
            zero = np.broadcast_to(np.asarray(zero), shape)
            if not np.issubdtype(zero.dtype, np.integer) or zero.min() < 0 or zero.max() >= (1 << b):
                raise ArgumentError(f"quantized zeros must be integer codes in [0, {(1 << b) - 1}]")
        else:
            zero = np.broadcast_to(np.asarray(zero).astype(_NP[dtype]), shape)

    with np.errstate(invalid="ignore", over="ignore"):  # e5m2 inf/NaN flow through the arithmetic on purpose
        return _decode(words, fmt, dtype, mode, scale, zero, shape, variant == "marlin")


def _decode(words, fmt, dtype, mode, scale, zero, shape, marlin=False):
    b = fmt.bits
    e_count = shape[-1]
    magic, neg_magic = MAGIC[dtype], NEG_MAGIC[dtype]
    neg_zero = _const2(0x8000)
    out = np.empty(shape, dtype=_NP[dtype])
    if fmt.name == "float8_e5m2":
        regs = [prmt(words, 0, sel) for sel in (0x1404, 0x3424)]
    elif b == 8:
        src = lop3(words, 0x80808080, 0, 0x3C) if fmt.storage == "twos_complement" else words  # a ^ b
        regs = [prmt(src, 0x64646464, sel) for sel in (0x4140, 0x4342)]
    else:
        mask = np.uint32(((1 << b) - 1) * 0x10001)
        if fmt.storage == "twos_complement":
            c, lut = _const2(magic | (1 << (b - 1))), 0x6A   # (a & b) ^ c flips the sign bit: q ^ 2^(b-1)
        else:
            c, lut = _const2(magic), 0xEA                    # (a & b) | c
        if marlin:
            hi_c = _const2(magic | 0x80) if fmt.storage == "twos_complement" else _const2(magic)
            upper = shr(words, 8)
            regs = [lop3(words, mask, c, lut), lop3(words, mask << np.uint32(4), hi_c, lut),
                    lop3(upper, mask, c, lut), lop3(upper, mask << np.uint32(4), hi_c, lut)]
        else:
            regs = [lop3(shr(words, b * i), mask, c, lut) for i in range(e_count // 2)]
    for i, x in enumerate(regs):
        if fmt.name == "float8_e5m2":
            h = x
        elif marlin and i % 2 == 1:                            # x = 1024 + 16q: rescale by 1/16 exactly
            sixteenth = pack2(1.0 / 16, 1.0 / 16, dtype)
            if mode == "quantized":
                zc = [np.uint32(0xD400) | (zero[..., 2 * i + j].astype(np.uint32) << np.uint32(4)) for j in (0, 1)]
                h = fma2(x, sixteenth, zc[0] | (zc[1] << np.uint32(16)), dtype)   # -(64 + z)
            else:
                h = fma2(x, sixteenth, pack2(-72.0 if fmt.signed else -64.0, -72.0 if fmt.signed else -64.0,
                                             dtype), dtype)
        elif mode == "quantized":
            zreg = (np.uint32(neg_magic) | zero[..., 2 * i].astype(np.uint32)) | \
                   ((np.uint32(neg_magic) | zero[..., 2 * i + 1].astype(np.uint32)) << np.uint32(16))
            h = add2(x, zreg, dtype)                           # (MAGIC + q) - (MAGIC + z) = q - z, exact
        elif fmt.kind == "uint":
            h = sub2(x, _const2(magic), dtype)
        elif fmt.storage == "plus_minus_one":
            h = fma2(sub2(x, _const2(magic), dtype), pack2(2.0, 2.0, dtype), pack2(-1.0, -1.0, dtype), dtype)
        else:
            h = sub2(x, _const2(magic + (1 << (b - 1))), dtype)
        if mode == "original":
            h = sub2(h, _pair_operand(zero, i, dtype), dtype)
        if mode in ("scale", "original", "quantized"):
            h = fma2(h, _pair_operand(scale, i, dtype), neg_zero, dtype)
        elif mode == "rescale":
            h = fma2(h, _pair_operand(scale, i, dtype), _pair_operand(zero, i, dtype) ^ np.uint32(0x80008000), dtype)
        lo, hi = split2(h, dtype)
        out[..., 2 * i] = lo.astype(_NP[dtype])
        out[..., 2 * i + 1] = hi.astype(_NP[dtype])
    return out
