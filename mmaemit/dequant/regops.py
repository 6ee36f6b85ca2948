"""The PTX register instructions the dequant decode uses, in the dequant code's conventions, over their one
definition in :mod:`mmaemit.ptx`.

Registers are numpy ``uint32`` arrays holding bit patterns: ``.b32`` / ``.u32`` values, ``.s32`` in two's
complement, ``.f32`` as its IEEE bits, ``.b16`` zero-extended, and ``f16x2`` / ``bf16x2`` pairs with the low half in
bits 0..15; half types are named by their TVM dtype ("float16" / "bfloat16"). Every function broadcasts over its
operands and is the ``mmaemit.ptx`` function of its instruction (PTX ISA semantics, canonical NaNs):

* ``lop3.b32 d, a, b, c, LUT``: bit j of d = bit (4 a_j + 2 b_j + c_j) of LUT (inputs a = 0xF0, b = 0xCC, c = 0xAA)
* ``shr.b32`` / ``shl.b32`` (logical), ``bfe.u32`` / ``bfe.s32`` (field extract, zero / sign extended)
* ``prmt.b32 d, a, b, c`` (default mode): d.byte[j] = {b, a}.byte[c nibble j & 7], sign-replicated if nibble bit 3
* ``set.{eq,ne}.u32.u32``: 0xFFFFFFFF if true else 0; ``mov.b32 {lo, hi}, a``: split into two b16
* ``add/sub/fma.rn.{f16x2,bf16x2}``: each half computed exactly and rounded once to nearest-even (an error-free
  TwoSum in float64 plus round-to-odd)
* ``add/sub/mul.rn.f32``, ``fma.{rn,rz,rm,rp}.f32``: exact result rounded once in the given direction (no ``.ftz``:
  subnormals kept); a zero sum of opposite signs is +0 except under ``.rm`` (-0), as IEEE 754 says
* ``cvt.rn.f32.u32``, ``cvt.f32.f16`` (exact), ``cvt.rn.{f16x2,bf16x2}.f32 d, a, b`` (a -> high half, b -> low half,
  one rounding each), ``cvt.rn.f16x2.e4m3x2 d, a`` (byte 0 of a -> low half; exact, NaN -> NaN)
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .. import ptx
from ..ptx import u32
from .rounding import half_name, round_np  # noqa: F401  (round_np: re-exported, tests read R.round_np)

__all__ = ["NP_HALF", "u32", "lop3", "shr", "shl", "bfe_u32", "bfe_s32", "prmt", "set_cmp", "mov_unpack",
           "split2", "pack2", "add2", "sub2", "fma2", "f32_bits", "f32_of", "add_f32", "sub_f32", "mul_f32",
           "fma_f32", "cvt_f32_u32", "cvt_f32_f16", "cvt_pack_f32", "cvt_f16x2_e4m3x2"]

NP_HALF = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_PTX_HALF = {"float16": "f16", "bfloat16": "bf16"}


# ---------------------------------------------------------------------------------------------- integer instructions
def lop3(a, b, c, lut: int) -> np.ndarray:
    """``lop3.b32``: arbitrary 3-input bitwise function given by its 8-bit truth table."""
    a, b, c = np.broadcast_arrays(u32(a), u32(b), u32(c))
    return ptx.lop3(a, b, c, lut)


def shr(a, n) -> np.ndarray:
    """``shr.b32`` (logical; shift amounts above 31 give 0)."""
    a, n = np.broadcast_arrays(u32(a), u32(n))
    return u32(ptx.shr(a, n))


def shl(a, n) -> np.ndarray:
    """``shl.b32`` (shift amounts above 31 give 0)."""
    a, n = np.broadcast_arrays(u32(a), u32(n))
    return u32(ptx.shl(a, n))


def bfe_u32(a, pos, length) -> np.ndarray:
    """``bfe.u32 d, a, pos, len``: bits [pos, pos + len) of a, zero-extended."""
    return ptx.bfe_u32(a, pos, length)


def bfe_s32(a, pos, length) -> np.ndarray:
    """``bfe.s32 d, a, pos, len``: bits [pos, pos + len) of a, sign-extended (as uint32 bits)."""
    return ptx.bfe_s32(a, pos, length)


def prmt(a, b, sel) -> np.ndarray:
    """``prmt.b32 d, a, b, c`` default mode; ``sel`` (c) may be an int or a register array (only c[15:0] is read)."""
    a, b, sel = np.broadcast_arrays(u32(a), u32(b), u32(sel))
    return u32(ptx.prmt(a, b, sel))


def set_cmp(cmp: str, a, b) -> np.ndarray:
    """``set.{eq,ne}.u32.u32``: 0xFFFFFFFF where the comparison holds, else 0."""
    return ptx.set_cmp(cmp, a, b)


def mov_unpack(a):
    """``mov.b32 {lo, hi}, a``: (bits 0..15, bits 16..31) as zero-extended b16 registers."""
    a = u32(a)
    return a & np.uint32(0xFFFF), a >> np.uint32(16)


# ------------------------------------------------------------------------------------------- f16x2 / bf16x2 arithmetic
def split2(r, dtype):
    """uint32 register -> (low, high) halves as float64 values of ``dtype``."""
    lo, hi = ptx.split_b32(u32(r))
    fmt = _PTX_HALF[dtype]
    return ptx.half_values(lo, fmt), ptx.half_values(hi, fmt)


def _bits16(v, dtype) -> np.ndarray:
    return np.asarray(v).astype(NP_HALF[dtype]).view(np.uint16).astype(np.uint32)


def pack2(lo, hi, dtype) -> np.ndarray:
    """Two arrays of ``dtype`` values (exactly representable) -> uint32 register, ``lo`` in the low 16 bits."""
    lo = np.asarray(lo, dtype=NP_HALF[dtype])
    hi = np.asarray(hi, dtype=NP_HALF[dtype])
    return _bits16(lo, dtype) | (_bits16(hi, dtype) << np.uint32(16))


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
    arrs = np.broadcast_arrays(*[u32(r) for r in regs])
    return u32(ptx.half_arith(op, _PTX_HALF[half_name(dtype)] + "x2", *arrs))


# ---------------------------------------------------------------------------------------------------- f32 arithmetic
def f32_of(r) -> np.ndarray:
    """uint32 bits -> float64 values of the float32 they encode."""
    return u32(r).view(np.float32).astype(np.float64)


def f32_bits(x) -> np.ndarray:
    """float32 values (array) -> uint32 bits."""
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def add_f32(a, b) -> np.ndarray:
    """``add.rn.f32``."""
    return ptx.f32_arith("add", u32(a), u32(b))


def sub_f32(a, b) -> np.ndarray:
    """``sub.rn.f32``."""
    return ptx.f32_arith("sub", u32(a), u32(b))


def mul_f32(a, b) -> np.ndarray:
    """``mul.rn.f32``."""
    return ptx.f32_arith("mul", u32(a), u32(b))


def fma_f32(a, b, c, rnd: str = "rn") -> np.ndarray:
    """``fma.{rn,rz,rm,rp}.f32``: a * b + c with one rounding in direction ``rnd``."""
    return ptx.f32_arith("fma", u32(a), u32(b), u32(c), rnd=rnd)


def cvt_f32_u32(a) -> np.ndarray:
    """``cvt.rn.f32.u32``."""
    return ptx.cvt(u32(a), "f32", "u32", "rn")


def cvt_f32_f16(h) -> np.ndarray:
    """``cvt.f32.f16`` of a b16 register (exact)."""
    return ptx.cvt(u32(h) & np.uint32(0xFFFF), "f32", "f16")


def cvt_pack_f32(hi, lo, dtype) -> np.ndarray:
    """``cvt.rn.{f16x2,bf16x2}.f32 d, hi, lo``: each float32 rounded once to ``dtype``; ``hi`` -> bits 16..31."""
    fmt = _PTX_HALF[half_name(dtype)]
    return ptx.cvt_f32_to_x2(u32(hi).view(np.float32), u32(lo).view(np.float32), fmt)


def cvt_f16x2_e4m3x2(a) -> np.ndarray:
    """``cvt.rn.f16x2.e4m3x2 d, a``: byte 0 of the b16 ``a`` -> low half, byte 1 -> high half (exact)."""
    return ptx.cvt_f8x2_to_f16x2(u32(a) & np.uint32(0xFFFF), "e4m3")
