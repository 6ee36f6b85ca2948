"""``mma.sync`` (``.m16n8k*`` ``.row.col``): operand fragment maps and the warp multiply-accumulate.

Fragment maps (which lane holds which matrix element) are the PTX ISA tables "Matrix fragments for mma.m16n8k*"; they
are read from the shared layout objects (``mmaemit.layouts.mma_fragment``), never re-derived here. Products are exact
and the sum is formed in float64 (f32 accumulation order is not specified by NVIDIA: compare float results with a
tolerance); integer MMAs are exact with int32 wrap-around or ``.satfinite`` clamping.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import isa
from ..layouts.fragment import mma_fragment
from .bits import half_values, pack_b32, split_b32
from .floating import decode_f8
from .rounding import round_f64

__all__ = ["MMA_ELEMENT_BITS", "mma_a_coords", "mma_b_coords", "mma_c_coords", "unpack_elements", "mma_sync"]

#: bits per element of each PTX mma operand type
MMA_ELEMENT_BITS = {"f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8, "s4": 4, "u4": 4,
                    "f32": 32, "s32": 32}


@functools.lru_cache(maxsize=None)
def _fragment_coords(shape, atype, btype, dtype, operand):
    """(row, col) arrays (32, elems) of an mma operand, read from the shared layout objects (mmaemit.layouts)."""
    m, n, k = shape
    for ins in isa.MMA_TABLE:
        if (ins.m, ins.n, ins.k, ins.a_ptx, ins.b_ptx, ins.accum_ptx) == (m, n, k, atype, btype, dtype):
            t = mma_fragment(ins, operand).table()          # (32, regs, elems_per_reg, 2)
            t = t.reshape(32, -1, 2)
            return t[..., 0], t[..., 1]
    raise NotImplementedError(f"mma m{m}n{n}k{k} .{dtype}.{atype}.{btype} is not in mmaemit.isa.MMA_TABLE")


def mma_a_coords(shape, atype, btype, dtype):
    """(row, col) of every A element per lane: element j = register j // epr, bits (j % epr) * bits."""
    return _fragment_coords(tuple(shape), atype, btype, dtype, "A")


def mma_b_coords(shape, atype, btype, dtype):
    """(k, n) of every B element per lane."""
    return _fragment_coords(tuple(shape), atype, btype, dtype, "B")


def mma_c_coords(shape, atype, btype, dtype):
    """(row, col) of every accumulator element per lane (f16: two per register, low half first)."""
    return _fragment_coords(tuple(shape), atype, btype, dtype, "C")


def unpack_elements(regs, ptype):
    """Element values (float64 or int64) of registers (..., nregs) uint32 -> (..., nregs * epr), element j of a
    register in bits [j * bits, (j + 1) * bits). ``ptype``: a PTX mma operand type (``MMA_ELEMENT_BITS``)."""
    regs = np.asarray(regs).astype(np.uint32)
    bits = MMA_ELEMENT_BITS[ptype]
    epr = 32 // bits
    if ptype == "f32":
        return regs.view(np.float32).astype(np.float64)
    if ptype == "s32":
        return regs.view(np.int32).astype(np.int64)
    if ptype == "tf32":     # the mma reads the 19 tf32 bits: the low 13 significand bits are ignored
        return (regs & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    parts = [(regs >> np.uint32(e * bits)) & np.uint32((1 << bits) - 1) for e in range(epr)]
    elems = np.stack(parts, -1).reshape(regs.shape[:-1] + (regs.shape[-1] * epr,))
    if ptype in ("f16", "bf16"):
        return half_values(elems.astype(np.uint16), ptype)
    if ptype in ("e4m3", "e5m2"):
        return decode_f8(elems, ptype)
    if ptype == "u8" or ptype == "u4":
        return elems.astype(np.int64)
    if ptype == "s8":
        return elems.astype(np.uint8).view(np.int8).astype(np.int64)
    if ptype == "s4":
        e = elems.astype(np.int64)
        return np.where(e >= 8, e - 16, e)
    raise NotImplementedError(f"mma element type .{ptype}")


def mma_sync(shape, atype, btype, ctype, dtype, a, b, c, *, satfinite: bool = False):
    """``mma.sync.aligned.<shape>.row.col{.satfinite}.<dtype>.<atype>.<btype>.<ctype> d, a, b, c`` for whole warps.

    ``a``, ``b``, ``c``: register bit patterns (W, 32, nregs) uint32 for W warps. Returns d (W, 32, nregs_d) uint32.
    Float accumulation: exact products, float64 sum, one rounding to ``dtype``. Integer: exact, wrap (or clamp with
    ``.satfinite``) to int32.
    """
    m, n, k = shape
    W = a.shape[0]
    key = (tuple(shape), atype, btype, dtype)
    ar, ac = mma_a_coords(*key)
    bk, bn = mma_b_coords(*key)
    cr, cc = mma_c_coords(*key)
    integer = dtype == "s32"
    acc_t = np.int64 if integer else np.float64
    A = np.zeros((W, m, k), acc_t)
    B = np.zeros((W, k, n), acc_t)
    A[:, ar, ac] = unpack_elements(a, atype)
    B[:, bk, bn] = unpack_elements(b, btype)
    if ctype == "f16":
        cvals = half_values(np.stack(split_b32(c), -1).reshape(W, 32, -1), "f16")
    else:
        cvals = unpack_elements(c, ctype)
    C = np.zeros((W, m, n), acc_t)
    C[:, cr, cc] = cvals
    if integer:
        D = np.einsum("wmk,wkn->wmn", A, B) + C
        if satfinite:
            D = np.clip(D, -(2 ** 31), 2 ** 31 - 1)
        d = D[:, cr, cc].astype(np.int64).astype(np.uint64).astype(np.uint32)
        return d
    with np.errstate(all="ignore"):
        D = np.einsum("wmk,wkn->wmn", A, B) + C
    dvals = D[:, cr, cc]
    if dtype == "f32":
        return round_f64(dvals, 0.0, "f32")
    if dtype == "f16":
        h = round_f64(dvals, 0.0, "f16").reshape(W, 32, -1, 2)
        return pack_b32(h[..., 0], h[..., 1])
    raise NotImplementedError(f"mma accumulator .{dtype}")
