"""Integer and logic instructions: ``lop3``, ``prmt``, ``shf``, ``shl`` / ``shr``, ``bfe``, ``set``, and
``add`` / ``sub`` / ``mul`` on ``.u32`` / ``.s32``. Operands are register bit patterns (``mmaemit.ptx.bits``)."""
from __future__ import annotations

import numpy as np

from .bits import sint_type, u32, uint_type

__all__ = ["lop3", "PRMT_MODES", "prmt", "shf", "shl", "shr", "bfe_u32", "bfe_s32", "bfe", "set_cmp", "int_arith"]


def lop3(a, b, c, imm_lut: int):
    """``lop3.b32 d, a, b, c, immLut``: bit i of d = bit (4*a_i + 2*b_i + c_i) of immLut."""
    a, b, c = (np.asarray(v).astype(np.uint32) for v in (a, b, c))
    d = np.zeros(np.broadcast_shapes(a.shape, b.shape, c.shape), dtype=np.uint32)
    for minterm in range(8):
        if (imm_lut >> minterm) & 1:
            ta = a if minterm & 4 else ~a
            tb = b if minterm & 2 else ~b
            tc = c if minterm & 1 else ~c
            d |= ta & tb & tc
    return d


#: prmt.{mode}: source byte for d.b0..d.b3 per selector c[1:0] (PTX ISA prmt table, listed d.b3..d.b0 there)
PRMT_MODES = {
    "f4e": ((0, 1, 2, 3), (1, 2, 3, 4), (2, 3, 4, 5), (3, 4, 5, 6)),
    "b4e": ((0, 7, 6, 5), (1, 0, 7, 6), (2, 1, 0, 7), (3, 2, 1, 0)),
    "rc8": ((0, 0, 0, 0), (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3)),
    "ecl": ((0, 1, 2, 3), (1, 1, 2, 3), (2, 2, 2, 3), (3, 3, 3, 3)),
    "ecr": ((0, 0, 0, 0), (0, 1, 1, 1), (0, 1, 2, 2), (0, 1, 2, 3)),
    "rc16": ((0, 1, 0, 1), (2, 3, 2, 3), (0, 1, 0, 1), (2, 3, 2, 3)),
}


def prmt(a, b, c, mode: str = ""):
    """``prmt.b32{.mode} d, a, b, c``: pick 4 of the 8 bytes of {b, a} (a = bytes 0-3).

    Generic form: byte i of d = byte ``c[4i+2:4i]`` of the source, sign-replicated when ``c[4i+3]`` is set.
    Modes (f4e, b4e, rc8, ecl, ecr, rc16): c[1:0] selects a row of the ISA's byte table; no sign replication.
    """
    a, b, c = (np.asarray(v).astype(np.uint32) for v in (a, b, c))
    src = (b.astype(np.uint64) << 32) | a.astype(np.uint64)
    d = np.zeros(np.broadcast_shapes(a.shape, b.shape, c.shape), dtype=np.uint32)
    if mode:
        table = np.array(PRMT_MODES[mode], np.uint64)           # (4 selectors, 4 destination bytes)
        sel = (c & 3).astype(np.int64)
        for i in range(4):
            byte = ((src >> (table[sel, i] * 8)) & 0xFF).astype(np.uint32)
            d |= byte << (8 * i)
        return d
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = ((src >> ((sel & 7).astype(np.uint64) * 8)) & 0xFF).astype(np.uint32)
        sign = np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0))
        byte = np.where(sel & 8, sign, byte)
        d |= byte << (8 * i)
    return d


def shf(a, b, c, direction: str, mode: str):
    """``shf.{l,r}.{clamp,wrap}.b32 d, a, b, c``: funnel shift of {b, a} by c (wrap: c mod 32; clamp: min(c, 32))."""
    a, b, c = (np.asarray(v).astype(np.uint32) for v in (a, b, c))
    n = (c & 31) if mode == "wrap" else np.minimum(c, 32)
    n = n.astype(np.uint64)
    wide = (b.astype(np.uint64) << 32) | a.astype(np.uint64)
    if direction == "l":
        return (((wide << n) >> 32) & 0xFFFFFFFF).astype(np.uint32)
    return ((wide >> n) & 0xFFFFFFFF).astype(np.uint32)


def shl(a, n, bits: int = 32):
    """``shl.b{bits}``: shift amounts >= bits give 0 (PTX clamps the amount to the width)."""
    ut = uint_type(bits)
    a = np.asarray(a).astype(ut)
    n = np.asarray(n).astype(np.uint64)
    wide = a.astype(np.uint64) << np.minimum(n, bits)
    return np.where(n >= bits, ut(0), (wide & ((1 << bits) - 1)).astype(ut)).astype(ut)


def shr(a, n, bits: int = 32, signed: bool = False):
    """``shr.{b,u,s}{bits}``: logical (b/u) or arithmetic (s); amounts >= bits clamp to the width."""
    n = np.minimum(np.asarray(n).astype(np.uint64), bits)
    if signed:
        st = sint_type(bits)
        a = np.asarray(a).astype(uint_type(bits)).view(st).astype(np.int64)
        return (a >> n.astype(np.int64)).astype(st).view(uint_type(bits))
    ut = uint_type(bits)
    a = np.asarray(a).astype(ut).astype(np.uint64)
    return np.where(n >= bits, 0, a >> np.minimum(n, bits - 1)).astype(ut)


def bfe(a, pos, length, signed: bool) -> np.ndarray:
    """``bfe.{u32,s32} d, a, pos, len``: bits [pos, pos + len) of a, zero- or sign-extended (uint32 bits).

    Covers 0 < len and pos + len <= 32 (``ValueError`` otherwise); pos and len are read from their low 8 bits."""
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
    return bfe(a, pos, length, False)


def bfe_s32(a, pos, length) -> np.ndarray:
    """``bfe.s32 d, a, pos, len``: bits [pos, pos + len) of a, sign-extended (as uint32 bits)."""
    return bfe(a, pos, length, True)


def set_cmp(cmp: str, a, b) -> np.ndarray:
    """``set.{eq,ne}.u32.u32``: 0xFFFFFFFF where the comparison holds, else 0."""
    a, b = u32(a), u32(b)
    hit = {"eq": a == b, "ne": a != b}[cmp]
    return np.where(hit, np.uint32(0xFFFFFFFF), np.uint32(0))


def int_arith(op: str, a, b, type_: str = "u32", mode: str = "lo"):
    """``add`` / ``sub`` / ``mul{.lo,.hi}`` on ``.u32`` / ``.s32`` registers with 32-bit wrap-around (no ``.sat``).

    ``op``: "add", "sub", "mul"; ``mode`` (mul only): "lo" (low 32 bits) or "hi" (high 32 bits of the 64-bit
    product, signed for ``.s32``)."""
    a64, b64 = np.asarray(a).astype(np.uint64), np.asarray(b).astype(np.uint64)
    if op == "add":
        return (a64 + b64).astype(np.uint32)
    if op == "sub":
        return (a64 - b64).astype(np.uint32)
    if op != "mul":
        raise ValueError(f"int_arith: op {op!r} (valid: 'add', 'sub', 'mul')")
    if mode == "hi":
        if type_ == "s32":
            p = np.asarray(a).view(np.int32).astype(np.int64) * np.asarray(b).view(np.int32).astype(np.int64)
            return (p >> 32).astype(np.uint32)
        return ((a64 * b64) >> np.uint64(32)).astype(np.uint32)
    return (a64 * b64).astype(np.uint32)
