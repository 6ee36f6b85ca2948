"""Bit-exact numpy semantics of the PTX register instructions the dequant decode uses (one definition each).

Registers are numpy ``uint32`` arrays holding bit patterns: ``.b32`` / ``.u32`` values, ``.s32`` in two's
complement, ``.f32`` as its IEEE bits, ``.b16`` zero-extended, and ``f16x2`` / ``bf16x2`` pairs with the low half in
bits 0..15. Every function broadcasts over its operands and follows the PTX ISA text of its instruction:

* ``lop3.b32 d, a, b, c, LUT``: bit j of d = bit (4 a_j + 2 b_j + c_j) of LUT (inputs a = 0xF0, b = 0xCC, c = 0xAA)
* ``shr.b32`` / ``shl.b32`` (logical), ``bfe.u32`` / ``bfe.s32`` (field extract, zero / sign extended)
* ``prmt.b32 d, a, b, c`` (default mode): d.byte[j] = {b, a}.byte[c nibble j & 7], sign-replicated if nibble bit 3
* ``set.{eq,ne}.u32.u32``: 0xFFFFFFFF if true else 0; ``mov.b32 {lo, hi}, a``: split into two b16
* ``add/sub/fma.rn.{f16x2,bf16x2}``: each half computed exactly and rounded once to nearest-even (an error-free
  TwoSum in float64 plus round-to-odd, see :mod:`.rounding`)
* ``add/sub/mul.rn.f32``, ``fma.{rn,rz,rm,rp}.f32``: exact result rounded once in the given direction (no ``.ftz``:
  subnormals kept); a zero sum of opposite signs is +0 except under ``.rm`` (-0), as IEEE 754 says
* ``cvt.rn.f32.u32``, ``cvt.f32.f16`` (exact), ``cvt.rn.{f16x2,bf16x2}.f32 d, a, b`` (a -> high half, b -> low half,
  one rounding each), ``cvt.rn.f16x2.e4m3x2 d, a`` (byte 0 of a -> low half; exact, NaN -> NaN)
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..interpret import ptx as _ptx

from .rounding import half_name, round_np

__all__ = ["NP_HALF", "u32", "lop3", "shr", "shl", "bfe_u32", "bfe_s32", "prmt", "set_cmp", "mov_unpack",
           "split2", "pack2", "add2", "sub2", "fma2", "f32_bits", "f32_of", "add_f32", "sub_f32", "mul_f32",
           "fma_f32", "cvt_f32_u32", "cvt_f32_f16", "cvt_pack_f32", "cvt_f16x2_e4m3x2"]

NP_HALF = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_M32 = np.uint32(0xFFFFFFFF)


def u32(x) -> np.ndarray:
    """Any integer array (or Python int) -> uint32 bit patterns (negative values wrap, as two's complement)."""
    a = np.asarray(x)
    return a if a.dtype == np.uint32 else a.astype(np.int64).astype(np.uint32)


# ---------------------------------------------------------------------------------------------- integer instructions
def lop3(a, b, c, lut: int) -> np.ndarray:
    """``lop3.b32``: arbitrary 3-input bitwise function given by its 8-bit truth table (the interpreter's definition)."""
    a, b, c = np.broadcast_arrays(u32(a), u32(b), u32(c))
    return _ptx.lop3(a, b, c, lut)


def shr(a, n) -> np.ndarray:
    """``shr.b32`` (logical; shift amounts above 31 give 0)."""
    a, n = np.broadcast_arrays(u32(a), u32(n))
    return u32(_ptx.shr(a, n))


def shl(a, n) -> np.ndarray:
    """``shl.b32`` (shift amounts above 31 give 0)."""
    a, n = np.broadcast_arrays(u32(a), u32(n))
    return u32(_ptx.shl(a, n))


def _bfe(a, pos, length, signed: bool) -> np.ndarray:
    a = u32(a).astype(np.uint64)
    pos, length = u32(pos) & np.uint32(0xFF), u32(length) & np.uint32(0xFF)
    if np.any(pos + length > 32) or np.any(length == 0):
        raise ValueError("bfe emulation covers 0 < len and pos + len <= 32 only")
    pos, length = pos.astype(np.uint64), length.astype(np.uint64)
    field = (a >> pos) & ((np.uint64(1) << length) - np.uint64(1))
    if signed:
        sign = (field >> (length - np.uint64(1))) & np.uint64(1)
        field = np.where(sign == 1, field | (np.uint64(0xFFFFFFFF) << length), field)
    return (field & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def bfe_u32(a, pos, length) -> np.ndarray:
    """``bfe.u32 d, a, pos, len``: bits [pos, pos + len) of a, zero-extended."""
    return _bfe(a, pos, length, False)


def bfe_s32(a, pos, length) -> np.ndarray:
    """``bfe.s32 d, a, pos, len``: bits [pos, pos + len) of a, sign-extended (as uint32 bits)."""
    return _bfe(a, pos, length, True)


def prmt(a, b, sel) -> np.ndarray:
    """``prmt.b32 d, a, b, c`` default mode; ``sel`` (c) may be an int or a register array (only c[15:0] is read)."""
    a, b, sel = np.broadcast_arrays(u32(a), u32(b), u32(sel))
    return u32(_ptx.prmt(a, b, sel))


def set_cmp(cmp: str, a, b) -> np.ndarray:
    """``set.{eq,ne}.u32.u32``: 0xFFFFFFFF where the comparison holds, else 0."""
    a, b = u32(a), u32(b)
    hit = {"eq": a == b, "ne": a != b}[cmp]
    return np.where(hit, _M32, np.uint32(0))


def mov_unpack(a):
    """``mov.b32 {lo, hi}, a``: (bits 0..15, bits 16..31) as zero-extended b16 registers."""
    a = u32(a)
    return a & np.uint32(0xFFFF), a >> np.uint32(16)


# ------------------------------------------------------------------------------------------- f16x2 / bf16x2 arithmetic
def split2(r, dtype):
    """uint32 register -> (low, high) halves as float64 values of ``dtype``."""
    r = u32(r)
    lo = (r & np.uint32(0xFFFF)).astype(np.uint16).view(NP_HALF[dtype])
    hi = (r >> np.uint32(16)).astype(np.uint16).view(NP_HALF[dtype])
    return lo.astype(np.float64), hi.astype(np.float64)


def _bits16(v, dtype) -> np.ndarray:
    return np.asarray(v).astype(NP_HALF[dtype]).view(np.uint16).astype(np.uint32)


def pack2(lo, hi, dtype) -> np.ndarray:
    """Two arrays of ``dtype`` values (exactly representable) -> uint32 register, ``lo`` in the low 16 bits."""
    lo = np.asarray(lo, dtype=NP_HALF[dtype])
    hi = np.asarray(hi, dtype=NP_HALF[dtype])
    return _bits16(lo, dtype) | (_bits16(hi, dtype) << np.uint32(16))


def _two_sum(a, b):
    s = a + b
    bp = s - a
    ap = s - bp
    e = (a - ap) + (b - bp)
    return s, np.where(np.isfinite(s), e, 0.0)


def _round_exact(s, e, dtype):
    """Round the exact value s + e (s = fl64(s + e)) once to ``dtype`` (via round-to-odd at float64)."""
    s = np.asarray(s, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    inexact = e != 0
    toward_zero = inexact & (np.sign(e) != np.sign(s))
    trunc = np.where(toward_zero, np.nextafter(s, 0.0), s)
    odd = trunc.view(np.uint64) | np.where(inexact, np.uint64(1), np.uint64(0))
    return round_np(odd.view(np.float64), dtype)





def add2(a, b, dtype) -> np.ndarray:
    """``add.rn.{f16x2,bf16x2}``."""
    return _half2("add", dtype, a, b)


def sub2(a, b, dtype) -> np.ndarray:
    """``sub.rn.{f16x2,bf16x2}`` (bf16: ``fma.rn.bf16x2(a, 1.0, -b)`` below sm_90, identical result)."""
    return _half2("sub", dtype, a, b)


def fma2(a, b, c, dtype) -> np.ndarray:
    """``fma.rn.{f16x2,bf16x2}``: a * b + c per half, exact product, one rounding."""
    return _half2("fma", dtype, a, b, c)


def _half2(op, dtype, *regs):
    # the interpreter's correctly rounded half arithmetic (mmaemit.interpret.ptx) is the one definition
    type_ = {"float16": "f16x2", "bfloat16": "bf16x2"}[half_name(dtype)]
    arrs = np.broadcast_arrays(*[u32(r) for r in regs])
    return u32(_ptx.half_arith(op, type_, *arrs))


# ---------------------------------------------------------------------------------------------------- f32 arithmetic
def f32_of(r) -> np.ndarray:
    """uint32 bits -> float64 values of the float32 they encode."""
    return u32(r).view(np.float32).astype(np.float64)


def f32_bits(x) -> np.ndarray:
    """float32 values (array) -> uint32 bits."""
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _round_f32(p, z, rnd: str):
    """Bits of the exact value p + z (float64 operands, exact) rounded once to float32 in direction ``rnd``."""
    with np.errstate(invalid="ignore", over="ignore"):
        s, e = _two_sum(p, z)
        r = np.asarray(_round_exact(s, e, "float32"), dtype=np.float32)
        if rnd != "rn":
            rf = r.astype(np.float64)
            above = ((rf - s) - e) > 0      # the nearest value lies above the exact one
            below = ((rf - s) - e) < 0
            exact_val = s + e
            if rnd == "rz":
                step = (above & (exact_val > 0)) | (below & (exact_val < 0))
                r = np.where(step, np.nextafter(r, np.float32(0)), r)
            elif rnd == "rm":
                r = np.where(above, np.nextafter(r, np.float32(-np.inf)), r)
            elif rnd == "rp":
                r = np.where(below, np.nextafter(r, np.float32(np.inf)), r)
            else:
                raise ValueError(f"rounding {rnd!r}")
        bits = f32_bits(r)
        zero_sum = (s == 0) & (e == 0)
        if rnd == "rm":  # IEEE 754: an exact zero sum is -0 under roundTowardNegative unless both are +0
            plus = (p == 0) & (z == 0) & ~np.signbit(p) & ~np.signbit(z)
            bits = np.where(zero_sum & ~plus, np.uint32(0x80000000), bits)
    return bits.astype(np.uint32)


def add_f32(a, b) -> np.ndarray:
    """``add.rn.f32``."""
    return _round_f32(f32_of(a), f32_of(b), "rn")


def sub_f32(a, b) -> np.ndarray:
    """``sub.rn.f32``."""
    return _round_f32(f32_of(a), -f32_of(b), "rn")


def mul_f32(a, b) -> np.ndarray:
    """``mul.rn.f32`` (the float64 product of two float32 is exact)."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = f32_of(a) * f32_of(b)
    return f32_bits(_round_exact(p, np.zeros_like(p), "float32"))


def fma_f32(a, b, c, rnd: str = "rn") -> np.ndarray:
    """``fma.{rn,rz,rm,rp}.f32``: a * b + c with one rounding in direction ``rnd``."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = f32_of(a) * f32_of(b)
    return _round_f32(p, f32_of(c), rnd)


def cvt_f32_u32(a) -> np.ndarray:
    """``cvt.rn.f32.u32``."""
    return f32_bits(u32(a).astype(np.float64))


def cvt_f32_f16(h) -> np.ndarray:
    """``cvt.f32.f16`` of a b16 register (exact)."""
    return f32_bits((u32(h) & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16).astype(np.float32))


def cvt_pack_f32(hi, lo, dtype) -> np.ndarray:
    """``cvt.rn.{f16x2,bf16x2}.f32 d, hi, lo``: each float32 rounded once to ``dtype``; ``hi`` -> bits 16..31."""
    dtype = half_name(dtype)
    return pack2(round_np(f32_of(lo), dtype), round_np(f32_of(hi), dtype), dtype)


def cvt_f16x2_e4m3x2(a) -> np.ndarray:
    """``cvt.rn.f16x2.e4m3x2 d, a``: byte 0 of the b16 ``a`` -> low half, byte 1 -> high half (exact; NaN stays)."""
    from .formats import get_format

    table = get_format("float8_e4m3fn").table
    a = u32(a)
    lo = table[(a & np.uint32(0xFF)).astype(np.intp)]
    hi = table[((a >> np.uint32(8)) & np.uint32(0xFF)).astype(np.intp)]
    return pack2(lo, hi, "float16")
