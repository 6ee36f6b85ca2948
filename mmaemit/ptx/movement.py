"""Warp data movement: ``ldmatrix`` / ``stmatrix`` (``.m8n8 .b16``) and ``shfl.sync``, for whole warps."""
from __future__ import annotations

import numpy as np

from .bits import pack_b32, split_b32

__all__ = ["ldmatrix", "stmatrix", "shfl"]


def ldmatrix(mats, trans: bool = False):
    """``ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16`` data movement.

    ``mats``: (..., num, 8, 8) uint16, matrix ``m`` row ``r`` being the 16 bytes at the row address of lane 8m+r.
    Returns registers (..., 32, num) uint32: lane l, register m holds row l//4, columns 2(l%4), 2(l%4)+1 of
    matrix m (low half first); with ``.trans`` the matrix is transposed first.
    """
    mats = np.asarray(mats).astype(np.uint16)
    if trans:
        mats = np.swapaxes(mats, -1, -2)
    lane = np.arange(32)
    r, c = lane // 4, 2 * (lane % 4)
    lo = mats[..., r, c]            # (..., num, 32)
    hi = mats[..., r, c + 1]
    return np.swapaxes(pack_b32(lo, hi), -1, -2)


def stmatrix(regs, trans: bool = False):
    """Inverse of :func:`ldmatrix`: registers (..., 32, num) uint32 -> matrices (..., num, 8, 8) uint16 to be stored
    at the row addresses (matrix m row r at the address of lane 8m+r)."""
    regs = np.swapaxes(np.asarray(regs).astype(np.uint32), -1, -2)     # (..., num, 32)
    lo, hi = split_b32(regs)
    lane = np.arange(32)
    r, c = lane // 4, 2 * (lane % 4)
    mats = np.zeros(regs.shape[:-1] + (8, 8), np.uint16)
    mats[..., r, c] = lo
    mats[..., r, c + 1] = hi
    if trans:
        mats = np.swapaxes(mats, -1, -2)
    return np.ascontiguousarray(mats)


def shfl(values, mode: str, b, c):
    """``shfl.sync.{up,down,bfly,idx}.b32 d|p, a, b, c, membermask`` for whole warps.

    ``values``: (W, 32, ...) source registers; ``b`` (lane or delta) and ``c`` (clamp in c[4:0], segment mask in
    c[12:8]) broadcastable to (W, 32). Returns (d, p): the shuffled values and the in-range predicate.
    """
    values = np.asarray(values)
    lane = np.arange(32)[None, :]
    b = np.broadcast_to(np.asarray(b).astype(np.int64), (values.shape[0], 32))
    c = np.broadcast_to(np.asarray(c).astype(np.int64), (values.shape[0], 32))
    bval, cval, segmask = b & 31, c & 31, (c >> 8) & 31
    max_lane = (lane & segmask) | (cval & ~segmask)
    min_lane = lane & segmask
    if mode == "up":
        j = lane - bval
        p = j >= max_lane
    elif mode == "down":
        j = lane + bval
        p = j <= max_lane
    elif mode == "bfly":
        j = lane ^ bval
        p = j <= max_lane
    elif mode == "idx":
        j = min_lane | (bval & ~segmask)
        p = j <= max_lane
    else:
        raise ValueError(mode)
    j = np.where(p, j, lane) & 31
    w = np.arange(values.shape[0])[:, None]
    return values[w, j], p
