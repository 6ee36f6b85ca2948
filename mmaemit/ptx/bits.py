"""Registers as bit patterns: the containers every PTX semantics function works on.

A register is a numpy array of its bit pattern, any leading shape: ``uint32`` for ``.b32`` / ``.u32`` / ``.s32`` (two's
complement) / ``.f32`` (IEEE bits) and packed ``.f16x2`` / ``.bf16x2`` (element 0 in bits 15:0), ``uint16`` for
``.b16``, ``uint64`` for ``.b64``.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["UINT_OF_SIZE", "uint_type", "sint_type", "u32", "split_b32", "pack_b32", "half_values"]

#: byte size -> the unsigned numpy type of that size (a register's bit container)
UINT_OF_SIZE = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def uint_type(bits: int):
    """The unsigned numpy scalar type of ``bits`` (8, 16, 32, 64) bits."""
    return {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]


def sint_type(bits: int):
    """The signed numpy scalar type of ``bits`` (8, 16, 32, 64) bits."""
    return {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}[bits]


def u32(x) -> np.ndarray:
    """Any integer array (or Python int) -> uint32 bit patterns (negative values wrap, as two's complement)."""
    a = np.asarray(x)
    return a if a.dtype == np.uint32 else a.astype(np.int64).astype(np.uint32)


def split_b32(x):
    """(low 16 bits, high 16 bits) of a ``.b32`` register as uint16 arrays."""
    x = np.asarray(x).astype(np.uint32, copy=False)
    return (x & 0xFFFF).astype(np.uint16), (x >> 16).astype(np.uint16)


def pack_b32(lo, hi):
    """``{hi, lo}`` packed into one ``.b32`` register (``lo`` in bits 15:0)."""
    return (np.asarray(lo).astype(np.uint32) & 0xFFFF) | (np.asarray(hi).astype(np.uint32) << 16)


def half_values(bits, fmt: str):
    """float64 values of 16-bit ``fmt`` ("f16" or "bf16") bit patterns (exact)."""
    b = np.asarray(bits).astype(np.uint16, copy=False)
    if fmt == "f16":
        return b.view(np.float16).astype(np.float64)
    if fmt == "bf16":
        return b.view(ml_dtypes.bfloat16).astype(np.float64)
    raise ValueError(f"half_values: format {fmt!r} (valid: 'f16', 'bf16')")
