"""Per-32-bit-word interleave that makes the magic-number fast decode yield consecutive f16x2 / bf16x2 pairs.

A plain packed word (:mod:`.packing`) holds element ``j`` (j = 0 .. E-1, E = 32/b) at bits ``[b*j, b*j + b)``.
The interleaved word holds element ``j`` at bit offset

    pos(j) = (j % 2) * 16 + (j // 2) * b          for b in {1, 2, 4}
    pos(j) = 8 * j   (no change)                  for b = 8

i.e. the even elements fill the low 16 bits in order and the odd elements the high 16 bits. The decode of pair
``i`` (elements 2i, 2i+1) is then one shift and one LOP3 on the whole word::

    x_i = lop3((word >> (b*i)), mask_b | mask_b << 16, MAGIC, 0xEA)     # (a & b) | c
    # low half = MAGIC | e_{2i}, high half = MAGIC | e_{2i+1}: one f16x2 register = (e_{2i}, e_{2i+1})

For b = 4 the nibble order low -> high is ``e0 e2 e4 e6 e1 e3 e5 e7`` (Marlin's and BitBLAS's order; Marlin's
two-mask decode, which also reads nibbles at bits 4..7 and 20..23, works on it). For b = 2 it is ``e0 e2 .. e14 |
e1 e3 .. e15`` (8 shifts: 0, 2, .., 14); for b = 1 ``e0 e2 .. e30 | e1 e3 .. e31`` (16 shifts). For b = 8 the fast
decode uses PRMT (byte select, integers) or ``cvt.rn.f16x2.e4m3x2`` (fp8), which both read two *consecutive* bytes,
so 8-bit words keep the plain order. The same layout serves float16 (magic 0x6400) and bfloat16 (magic 0x4300).
"""
from __future__ import annotations

import numpy as np

from .packing import check_bits, to_torch

__all__ = ["bit_positions", "interleave", "deinterleave"]


def bit_positions(bits: int) -> tuple:
    """Bit offset of plain element j inside the interleaved word, for j = 0 .. 32/bits - 1."""
    bits = check_bits(bits)
    e = 32 // bits
    if bits == 8:
        return tuple(8 * j for j in range(e))
    return tuple((j % 2) * 16 + (j // 2) * bits for j in range(e))


def _permute(words, bits: int, src_pos, dst_pos):
    import torch

    t, was_np = to_torch(words)
    out_np_dtype = words.dtype if was_np else None
    if t.dtype.is_floating_point:
        from ..errors import ArgumentError

        raise ArgumentError(f"words must be 32-bit integers, got {t.dtype}")
    w = t.to(torch.int64) & 0xFFFFFFFF
    mask = (1 << bits) - 1
    out = torch.zeros_like(w)
    for s, d in zip(src_pos, dst_pos):
        out |= ((w >> s) & mask) << d
    if was_np:
        return out.numpy().astype(np.uint32).astype(out_np_dtype) if out_np_dtype == np.uint32 else \
            (out - ((out >> 31) & 1) * (1 << 32)).numpy().astype(out_np_dtype)
    return (out - ((out >> 31) & 1) * (1 << 32)).to(torch.int32)


def interleave(words, bits: int):
    """Plain packed 32-bit words (int32 tensor / int32 or uint32 array, any shape) -> interleaved words."""
    bits = check_bits(bits)
    return _permute(words, bits, [bits * j for j in range(32 // bits)], bit_positions(bits))


def deinterleave(words, bits: int):
    """Exact inverse of :func:`interleave`."""
    bits = check_bits(bits)
    return _permute(words, bits, bit_positions(bits), [bits * j for j in range(32 // bits)])
