"""Reorder an [N, K] weight so each lane's 32-bit word holds exactly its mma.sync m16n8k16 B-fragment elements.

Operand: B of ``mma.sync.aligned.m16n8k16.row.col`` with f16 or bf16 activations (the map is the same for both),
the weight W[n, k] being B[k, n]. The per-lane B map is the layout layer's
(``mmaemit.layouts.mma_fragment(instr, "B")`` of the ``isa.MMA_TABLE`` entry): element b_j (j = 0..3) of lane l
is ``k = 2*(l%4) + (j&1) + 8*(j>=2)``, ``n = l//4``; register b0 = (b_0, b_1), b1 = (b_2, b_3), low half first.

One word of b-bit codes holds E = 32/b elements = E/2 f16x2 registers = T = E/4 mma B tiles (b0, b1 each). The T
tiles of a word are arranged as TN n8-tiles x TK k16-steps::

    bits  E   T   TN  TK   word block (BN x BK = n x k)   tiles in decode order
     8    4   1   1   1    8 x 16                          (n0,k0)
     4    8   2   2   1    16 x 16                         (n0,k0) (n1,k0)      <- Marlin's choice: two n8 tiles
     2   16   4   2   2    16 x 32                         (n0,k0) (n1,k0) (n0,k1) (n1,k1)
     1   32   8   2   4    16 x 64                         n fastest, then k

so one 32-bit load per lane gives a warp a BN x BK block, and the A fragment of one k16 step is reused for the TN
n8-tiles. **Forward map** (decode-order slot e of lane l -> offsets inside the block)::

    i = e // 2           register index inside the word (f16x2 pair i = (e_{2i}, e_{2i+1}))
    h = e % 2            half (0 = low 16 bits)
    t = i // 2           tile index;  tn = t % TN,  tk = t // TN
    r = i % 2            b0 or b1 of that tile
    n_off = 8*tn + l//4
    k_off = 16*tk + 8*r + 2*(l%4) + h

**Inverse** ((n_off, k_off) -> (l, e))::

    tn = n_off // 8;  tk = k_off // 16;  t = tk*TN + tn
    r = (k_off % 16) // 8;  h = k_off % 2
    l = 4*(n_off % 8) + (k_off % 8) // 2
    e = 2*(2*t + r) + h

Layout of the whole weight: ``words[nb, kb, l]`` (int32, shape [N/BN, K/BK, 32]) is the word lane ``l`` loads for
rows ``nb*BN ..`` and columns ``kb*BK ..``; the 32 words of a block are contiguous (one coalesced 128-byte warp load).
Inside a word, decode-order slot e sits at the interleaved bit offset of :mod:`.interleave` (so decode pair i is
register i with no further shuffling). :func:`pack_for_mma` builds it, :func:`unpack_from_mma` inverts it.

Scales/zeros: both halves of a register share n and hold k, k+1 (same group whenever g is even), so register i of
lane l takes one broadcast pair {S, S} with S = scales[nb*BN + n_off, gi(kb*BK + k_off)] of its slot e = 2i.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import isa
from ..layouts.fragment import mma_fragment
from ..errors import ArgumentError, TileShapeError
from .interleave import deinterleave, interleave
from .packing import check_bits, pack, to_torch, unpack

__all__ = ["tiling", "fragment_index_map", "fragment_coord", "fragment_slot", "to_fragment_order",
           "from_fragment_order", "pack_for_mma", "unpack_from_mma"]

_B_FRAGMENT = mma_fragment(isa.select_mma("float16", "float16", "float32", k=16), "B")  # (k, n) of (lane, reg, elem)


def tiling(bits: int) -> dict:
    """Word tiling for ``bits``: E (elements/word), T (mma tiles/word), TN, TK, BN, BK (block = BN x BK of n x k)."""
    bits = check_bits(bits)
    e = 32 // bits
    t = e // 4
    tn = min(2, t)
    tk = t // tn
    return {"E": e, "T": t, "TN": tn, "TK": tk, "BN": 8 * tn, "BK": 16 * tk}


def fragment_coord(bits: int, lane, e):
    """Forward map: (lane, decode-order slot e) -> (n_off, k_off) inside the BN x BK block (numpy broadcasting)."""
    tl = tiling(bits)
    lane, e = np.asarray(lane), np.asarray(e)
    i, h = e // 2, e % 2
    t, r = i // 2, i % 2
    tn, tk = t % tl["TN"], t // tl["TN"]
    k_in, n_in = _B_FRAGMENT.forward(lane, r, h)
    return 8 * tn + n_in, 16 * tk + k_in


def fragment_slot(bits: int, n_off, k_off):
    """Inverse map: (n_off, k_off) inside a block -> (lane, decode-order slot e) (numpy broadcasting)."""
    tl = tiling(bits)
    n_off, k_off = np.asarray(n_off), np.asarray(k_off)
    tn, tk = n_off // 8, k_off // 16
    r, h = (k_off % 16) // 8, k_off % 2
    lane = 4 * (n_off % 8) + (k_off % 8) // 2
    e = 2 * (2 * (tk * tl["TN"] + tn) + r) + h
    return lane, e


@lru_cache(maxsize=None)
def fragment_index_map(bits: int):
    """(n_off[32, E], k_off[32, E]) int64 arrays: where lane l's decode-order slot e comes from inside a block."""
    tl = tiling(bits)
    n_off, k_off = fragment_coord(bits, np.arange(32)[:, None], np.arange(tl["E"])[None, :])
    n_off, k_off = n_off.astype(np.int64), k_off.astype(np.int64)
    n_off.setflags(write=False)
    k_off.setflags(write=False)
    return n_off, k_off


def _check_nk(n: int, k: int, tl: dict, bits: int):
    if n % tl["BN"] or k % tl["BK"]:
        raise TileShapeError(f"a {bits}-bit weight in fragment order needs N % {tl['BN']} == 0 and "
                             f"K % {tl['BK']} == 0; got N={n}, K={k}")


def to_fragment_order(codes, bits: int):
    """Codes [N, K] -> codes [N/BN, K/BK, 32, E]: ``out[nb, kb, l, e] = codes[nb*BN + n_off, kb*BK + k_off]``."""
    import torch

    tl = tiling(bits)
    t, was_np = to_torch(codes)
    if t.dim() != 2:
        raise ArgumentError(f"codes must be a 2-D [N, K] tensor, got shape {tuple(t.shape)}")
    n, k = t.shape
    _check_nk(n, k, tl, bits)
    n_off, k_off = (torch.tensor(a, device=t.device) for a in fragment_index_map(bits))
    blocks = t.reshape(n // tl["BN"], tl["BN"], k // tl["BK"], tl["BK"]).permute(0, 2, 1, 3)
    out = blocks[:, :, n_off, k_off]
    return out.numpy() if was_np else out


def from_fragment_order(frag, bits: int):
    """Exact inverse of :func:`to_fragment_order`: [N/BN, K/BK, 32, E] -> [N, K]."""
    import torch

    tl = tiling(bits)
    t, was_np = to_torch(frag)
    if t.dim() != 4 or tuple(t.shape[2:]) != (32, tl["E"]):
        raise ArgumentError(f"fragment-ordered codes must have shape [N/{tl['BN']}, K/{tl['BK']}, 32, {tl['E']}], "
                            f"got {tuple(t.shape)}")
    nb, kb = t.shape[:2]
    n_off, k_off = (torch.tensor(a, device=t.device) for a in fragment_index_map(bits))
    blocks = torch.empty((nb, kb, tl["BN"], tl["BK"]), dtype=t.dtype, device=t.device)
    blocks[:, :, n_off, k_off] = t
    out = blocks.permute(0, 2, 1, 3).reshape(nb * tl["BN"], kb * tl["BK"])
    return out.numpy() if was_np else out


def pack_for_mma(codes, bits: int):
    """Codes [N, K] -> int32 words [N/BN, K/BK, 32]: fragment order, packed, interleaved (what the kernel loads)."""
    frag = to_fragment_order(codes, bits)
    words = pack(frag, bits, axis=-1, storage="int32")
    return interleave(words[..., 0], bits)


def unpack_from_mma(words, bits: int):
    """Exact inverse of :func:`pack_for_mma`: int32 words [N/BN, K/BK, 32] -> uint8 codes [N, K]."""
    plain = deinterleave(words, bits)
    frag = unpack(plain[..., None], bits, axis=-1)
    return from_fragment_order(frag, bits)
