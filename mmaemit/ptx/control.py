"""Warp and warpgroup control: ``elect.sync`` and ``setmaxnreg`` (per-warpgroup register budgets).

* ``elect.sync d|p, membermask`` elects one leader among the active threads of the warp named in ``membermask``: p is
  true for the leader only and d is the leader's lane id in every participating thread. PTX does not say which thread
  is elected; these semantics elect the lowest active lane (any fixed choice is a legal execution).
* ``setmaxnreg.{inc,dec}.sync.aligned.u32 N`` (sm_90a, executed by all warps of a warpgroup) sets the warpgroup's
  per-thread register count to N (24..256, a multiple of 8): ``.dec`` releases registers (N must not exceed the current
  count), ``.inc`` requests more (N must not be below it) and blocks until the CTA's register pool has them. The pool
  is the CTA's register file share; ``REGISTERS_PER_CTA`` (64K 32-bit registers) bounds it.
"""
from __future__ import annotations

import numpy as np

from ..errors import ArgumentError

__all__ = ["elect_sync", "REGISTERS_PER_CTA", "SETMAXNREG_COUNTS", "check_setmaxnreg", "launch_register_cap"]

#: 32-bit registers one CTA can hold (the SM's register file)
REGISTERS_PER_CTA = 65536
#: legal ``setmaxnreg`` counts
SETMAXNREG_COUNTS = tuple(range(24, 257, 8))


def elect_sync(active, membermask):
    """``elect.sync`` for whole warps: ``active`` (W, 32) bool (threads executing it), ``membermask`` (W,) or scalar
    uint32. Returns (d (W, 32) int32: the leader lane, or -1 where no thread is elected; p (W, 32) bool)."""
    active = np.asarray(active, bool)
    mm = np.broadcast_to(np.asarray(membermask, np.uint64), (active.shape[0],))
    bits = ((mm[:, None] >> np.arange(32, dtype=np.uint64)[None, :]) & np.uint64(1)).astype(bool)
    cand = active & bits
    has = cand.any(axis=1)
    leader = np.where(has, np.argmax(cand, axis=1), -1).astype(np.int32)
    d = np.repeat(leader[:, None], 32, axis=1)
    p = (np.arange(32)[None, :] == leader[:, None]) & has[:, None]
    return d, p


def check_setmaxnreg(action: str, count: int, current=None) -> int:
    """Validate ``setmaxnreg.<action> count`` against the warpgroup's ``current`` per-thread count (None: not known,
    e.g. the count ptxas gave the kernel); returns count."""
    if action not in ("inc", "dec"):
        raise ArgumentError(f"setmaxnreg.{action}; valid: inc, dec")
    if count not in SETMAXNREG_COUNTS:
        raise ArgumentError(f"setmaxnreg count {count}; valid: 24..256 in steps of 8")
    if current is None:
        return count
    if action == "inc" and count < current:
        raise ArgumentError(f"setmaxnreg.inc to {count} registers below the warpgroup's current {current} "
                            f"(use setmaxnreg.dec to release registers)")
    if action == "dec" and count > current:
        raise ArgumentError(f"setmaxnreg.dec to {count} registers above the warpgroup's current {current} "
                            f"(use setmaxnreg.inc to request registers)")
    return count


def launch_register_cap(threads: int) -> int:
    """The most registers per thread (in allocation units of 8, at most 256) a CTA of ``threads`` threads can hold:
    the register file divided among its threads."""
    return min(256, REGISTERS_PER_CTA // max(int(threads), 1) // 8 * 8)
