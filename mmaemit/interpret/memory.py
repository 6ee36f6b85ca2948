"""The interpreter's memory: global argument regions and one CTA's shared memory with its shadow state.

Addresses: a generic pointer is ``(region_id << 40) | byte_offset``; a shared-window address (what
``cvta.to.shared`` / ``__cvta_generic_to_shared`` yields) is the byte offset into the CTA's shared memory.

Shared memory shadow state, per byte, used for the diagnostics:

* ``init``: written at least once (by a store, stmatrix, or a landed cp.async);
* ``w_epoch``/``w_warp``: barrier interval and warp of the last write (a cp.async counts as a write when issued and
  again when its data lands at the issuing thread's wait);
* ``r_epoch``/``r_mask``: barrier interval of the last reads and the set of warps that read in it;
* ``pending``: cp.async copies issued into the byte whose data has not landed yet;
* ``wg_reading``: pending ``wgmma.mma_async`` operations that read the byte (writing it is a hazard);
* ``unfenced``: written through the generic proxy since the writing warp's last ``fence.proxy.async`` (wgmma reads
  through the async proxy).

Two accesses race when they touch the same byte from different warps in the same barrier interval (no
``bar.sync``/``__syncthreads`` between them) and at least one is a write. Within a warp, accesses are ordered by
program order (lanes execute in lockstep in this model).
"""
from __future__ import annotations

import numpy as np

REGION_SHIFT = 40
OFFSET_MASK = (1 << REGION_SHIFT) - 1
SHARED_RID = 1
FIRST_GLOBAL_RID = 16
POISON = 0xFF       # fill of never-written registers and shared memory (NaN for floats, -1 for ints)


class Region:
    """A flat byte range: a kernel argument (global) or the CTA's shared memory."""

    def __init__(self, rid: int, name: str, scope: str, data: np.ndarray, shape=None, dtype=None):
        self.rid = rid
        self.name = name
        self.scope = scope
        self.data = data                      # uint8, 1-D, aliases the user's array for globals
        self.nbytes = int(data.size)
        self.base = rid << REGION_SHIFT
        self.shape = shape
        self.dtype = dtype
        self._views = {}

    def view(self, npdtype) -> np.ndarray:
        """The region as a flat array of ``npdtype`` (trailing bytes that do not fill an element are dropped)."""
        key = np.dtype(npdtype)
        v = self._views.get(key)
        if v is None:
            n = self.nbytes // key.itemsize
            v = self.data[: n * key.itemsize].view(key)
            self._views[key] = v
        return v


class SharedMemory(Region):
    """One CTA's shared memory (static allocations first, then the dynamic pool) plus its shadow state."""

    def __init__(self, nbytes: int, names):
        super().__init__(SHARED_RID, "shared", "shared", np.full(max(nbytes, 1), POISON, np.uint8))
        n = self.data.size
        self.init = np.zeros(n, bool)
        self.w_epoch = np.full(n, -1, np.int32)
        self.w_warp = np.full(n, -1, np.int16)
        self.r_epoch = np.full(n, -1, np.int32)
        self.r_mask = np.zeros(n, np.uint32)
        self.pending = np.zeros(n, np.int16)
        self.wg_reading = np.zeros(n, np.int16)
        self.unfenced = np.zeros(n, bool)
        self._scratch = np.zeros(n, np.int16)
        self.dyn_offset = 0           # byte offset of the dynamic pool (after the static allocations)
        self.names = names            # [(start, end, name, shape, dtype)] for describing addresses

    def describe(self, byte: int) -> tuple:
        """(buffer name, element index, multi-index text) of the source buffer covering ``byte``."""
        best = None
        for start, end, name, shape, dtype in self.names:
            if start <= byte < end and (best is None or end - start < best[1] - best[0]):
                best = (start, end, name, shape, dtype)
        if best is None:
            return "shared", byte, ""
        start, _end, name, shape, dtype = best
        item = np.dtype(dtype).itemsize
        elem = (byte - start) // item
        text = ""
        if shape:
            try:
                text = f"{name}[{', '.join(str(int(i)) for i in np.unravel_index(elem, shape))}]"
            except ValueError:
                text = ""
        return name, int(elem), text

    # -- checks: each returns a boolean mask over the flat byte list it was given ------------------------------

    def read_hazards(self, b, w, epoch):
        """(pending, uninitialized, race) masks for reads of bytes ``b`` by warps ``w`` (same shape)."""
        pend = self.pending[b] > 0
        uninit = ~self.init[b] & ~pend
        race = (self.w_epoch[b] == epoch) & (self.w_warp[b] != w) & (self.w_warp[b] >= 0)
        return pend, uninit, race

    def note_reads(self, b, w, epoch):
        stale = self.r_epoch[b] != epoch
        if np.any(stale):
            self.r_mask[b[stale]] = 0
        self.r_epoch[b] = epoch
        np.bitwise_or.at(self.r_mask, b, (np.uint32(1) << w.astype(np.uint32)))

    def write_hazards(self, b, w, epoch):
        """Race mask for writes of bytes ``b`` by warps ``w``: write-after-write or write-after-read from another
        warp in this barrier interval, or two warps writing the same byte in this instruction."""
        ww = (self.w_epoch[b] == epoch) & (self.w_warp[b] != w) & (self.w_warp[b] >= 0)
        other_readers = self.r_mask[b] & ~(np.uint32(1) << w.astype(np.uint32))
        war = (self.r_epoch[b] == epoch) & (other_readers != 0)
        self._scratch[b] = w
        dup = self._scratch[b] != w
        return ww | war | dup

    def note_writes(self, b, w, epoch, initialize=True):
        self.w_epoch[b] = epoch
        self.w_warp[b] = w
        self.unfenced[b] = True
        if initialize:
            self.init[b] = True

    def other_warp(self, byte: int, w: int, epoch: int, kind: str) -> str:
        """Text naming the conflicting access recorded on ``byte`` (for race messages)."""
        parts = []
        if self.w_epoch[byte] == epoch and self.w_warp[byte] != w and self.w_warp[byte] >= 0:
            parts.append(f"a write by warp {int(self.w_warp[byte])}")
        if kind == "write" and self.r_epoch[byte] == epoch:
            readers = [i for i in range(32) if (int(self.r_mask[byte]) >> i) & 1 and i != w]
            if readers:
                parts.append(f"a read by warp{'s' if len(readers) > 1 else ''} {', '.join(map(str, readers))}")
        return " and ".join(parts) or "an access by another warp in this instruction"
