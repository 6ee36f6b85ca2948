"""The interpreter's memory: global argument regions and one CTA's shared memory with its shadow state.

Addresses: a generic pointer is ``(region_id << 40) | byte_offset``; a shared-window address (what
``cvta.to.shared`` / ``__cvta_generic_to_shared`` yields) is the byte offset into the CTA's shared memory.

Shared memory shadow state, per byte, used for the diagnostics:

* ``init``: written at least once (by a store, stmatrix, a landed cp.async or a TMA load);
* ``w_warp``/``w_clock``: the last writer (a warp, or the TMA agent of an mbarrier, see below) and its own clock at the
  write (a cp.async counts as a write when issued and again when its data lands at the issuing thread's wait);
* ``r_clock``: per warp, its own clock at its last read of the byte (0: never read); per warpgroup, the sequence
  number of the last retired wgmma that read it (a wgmma's reads stay the reading warps' until a ``wait_group``
  retires it, then they belong to the warpgroup's wgmma agent, which every warp that retired it knows);
* ``pending``: cp.async copies issued into the byte whose data has not landed yet;
* ``tma_pending``: TMA loads issued into the byte that have not landed yet (``tma_exec``);
* ``wg_reading``: pending ``wgmma.mma_async`` operations that read the byte (writing it is a hazard);
* ``bulk_reading``: TMA stores (``cp.async.bulk.tensor`` to global) whose read of the byte has not been waited for;
* ``unfenced``: written through the generic proxy since the writing warp's last ``fence.proxy.async`` (wgmma and TMA
  stores read through the async proxy);
* per 16-byte chunk, ``tma_origin``/``tma_map``: for chunks a TMA load wrote, the global byte offset of the chunk's
  first element and which tensor map (for checking that a wgmma descriptor reads the tile the way TMA laid it out).

Ordering is tracked with vector clocks (``VectorClocks``): every warp has a clock that advances at each of its release
operations (barrier arrival, mbarrier arrive, TMA issue); a barrier, or an mbarrier phase a warp waits for, passes the
releasers' knowledge to the acquirers. Two accesses race when they touch the same byte from different warps, at least
one is a write, and the second does not know the first (no barrier or mbarrier chain between them). With
``bar.sync``/``__syncthreads`` alone this is exactly "same barrier interval". Within a warp, accesses are ordered by
program order (lanes execute in lockstep in this model). A TMA load's writes belong to the "TMA agent" of the mbarrier
it signals: only waiting for the phase it completes (or learning of it through later synchronization) orders a read
after them.
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


class VectorClocks:
    """Vector clocks of the CTA's warps, plus one column per agent (the TMA agent of each mbarrier).

    ``vc[w]`` is what warp w knows: ``vc[w, x]`` = the latest clock of writer x (warp or agent) ordered before w's
    next access. A warp's own clock ``vc[w, w]`` starts at 1 and advances at each release."""

    def __init__(self, warps: int):
        self.W = warps
        self.G = -(-warps // 4)       # reader agents: the wgmma operations of each warpgroup
        self.vc = np.zeros((warps, warps + self.G), np.int32)
        self.vc[np.arange(warps), np.arange(warps)] = 1
        self.agent_clock = [0] * self.G          # next clock of each agent
        self.agent_names = [f"the wgmma operations of warpgroup {g}" for g in range(self.G)]

    @property
    def readers(self) -> int:
        """Columns that can read shared memory: the warps, then each warpgroup's wgmma agent."""
        return self.W + self.G

    def wgmma_agent(self, group: int) -> int:
        """The column of warpgroup ``group``'s wgmma operations (their shared-memory reads)."""
        return self.W + group

    @property
    def width(self) -> int:
        return self.vc.shape[1]

    def add_agent(self, name: str) -> int:
        """A new writer column (the TMA agent of an mbarrier); returns its index."""
        self.vc = np.concatenate([self.vc, np.zeros((self.W, 1), np.int32)], axis=1)
        self.agent_clock.append(0)
        self.agent_names.append(name)
        return self.vc.shape[1] - 1

    def widen(self, v):
        """A knowledge vector padded with zeros to the current width."""
        v = np.asarray(v, np.int32)
        if v.shape[-1] == self.width:
            return v
        return np.concatenate([v, np.zeros(v.shape[:-1] + (self.width - v.shape[-1],), np.int32)], axis=-1)

    def own(self, w):
        """Own clocks of warps ``w`` (array)."""
        w = np.asarray(w)
        return self.vc[w, w]

    def release(self, w: int):
        """Warp ``w`` publishes what it knows (the returned copy) and advances its own clock."""
        snap = self.vc[w].copy()
        self.vc[w, w] += 1
        return snap

    def acquire(self, w: int, knowledge) -> None:
        """Warp ``w`` learns ``knowledge`` (a vector from releases)."""
        np.maximum(self.vc[w], self.widen(knowledge), out=self.vc[w])

    def barrier(self, warps) -> None:
        """A barrier among ``warps``: each learns what all of them knew, then advances its own clock."""
        warps = np.asarray(warps, np.int64)
        if len(warps) == 0:
            return
        joined = self.vc[warps].max(axis=0)
        self.vc[warps] = joined
        self.vc[warps, warps] += 1

    def agent_tick(self, agent: int) -> int:
        """The clock of the next operation of ``agent``."""
        k = agent - self.W
        self.agent_clock[k] += 1
        return self.agent_clock[k]

    def writer_name(self, x: int) -> str:
        if x < self.W:
            return f"warp {x}"
        name = self.agent_names[x - self.W]
        return name if x < self.readers else f"the TMA agent of {name}"


class SharedMemory(Region):
    """One CTA's shared memory (static allocations first, then the dynamic pool) plus its shadow state."""

    def __init__(self, nbytes: int, names, warps: int = 1):
        super().__init__(SHARED_RID, "shared", "shared", np.full(max(nbytes, 1), POISON, np.uint8))
        n = self.data.size
        self.init = np.zeros(n, bool)
        self.w_warp = np.full(n, -1, np.int16)
        self.w_clock = np.zeros(n, np.int32)
        self.clocks = VectorClocks(max(warps, 1))
        self.r_clock = np.zeros((n, self.clocks.readers), np.int32)
        self.pending = np.zeros(n, np.int16)
        self.tma_pending = np.zeros(n, np.int16)
        self.wg_reading = np.zeros(n, np.int16)
        self.bulk_reading = np.zeros(n, np.int16)
        self.unfenced = np.zeros(n, bool)
        self.tma_origin = np.zeros(n // 16 + 1, np.int64)
        self.tma_map = np.full(n // 16 + 1, -1, np.int32)
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

    def read_hazards(self, b, w):
        """(pending, TMA pending, uninitialized, unordered) masks for reads of bytes ``b`` by warps ``w`` (same
        shape): cp.async data not landed, a TMA load not landed, never written, or written by another warp / agent
        the reader does not know of."""
        pend = self.pending[b] > 0
        tpend = self.tma_pending[b] > 0
        uninit = ~self.init[b] & ~pend & ~tpend
        x = self.w_warp[b].astype(np.int64)
        known = self.clocks.vc[np.asarray(w, np.int64), np.maximum(x, 0)]
        race = (x >= 0) & (x != w) & (known < self.w_clock[b])
        return pend, tpend, uninit, race

    def note_reads(self, b, w):
        w = np.asarray(w, np.int64)
        self.r_clock[b, w] = self.clocks.vc[w, w]

    def write_hazards(self, b, w, knowledge=None):
        """Race mask for writes of bytes ``b`` by writers ``w`` (warps or an agent; ``knowledge``: the writer's
        knowledge vector when it is not a warp's current one): a write or read by another warp the writer does not
        know of, or two warps writing the same byte in this instruction."""
        w = np.broadcast_to(np.asarray(w, np.int64), np.shape(b))
        know = self.clocks.vc[np.minimum(w, self.clocks.W - 1)] if knowledge is None else \
            np.broadcast_to(self.clocks.widen(knowledge), (len(b), self.clocks.width))
        x = self.w_warp[b].astype(np.int64)
        ww = (x >= 0) & (x != w) & (know[np.arange(len(b)), np.maximum(x, 0)] < self.w_clock[b])
        W = self.r_clock.shape[1]
        others = np.arange(W)[None, :] != w[:, None]
        war = ((self.r_clock[b] > know[:, :W]) & others).any(axis=1)
        self._scratch[b] = w
        dup = self._scratch[b] != w
        return ww | war | dup

    def note_writes(self, b, w, clock=None, initialize=True, generic=True):
        """Record writes of bytes ``b`` by writers ``w`` at ``clock`` (default: the warps' own clocks); ``generic``:
        through the generic proxy (needs a fence.proxy.async before async-proxy readers)."""
        w = np.broadcast_to(np.asarray(w, np.int64), np.shape(b))
        self.w_clock[b] = self.clocks.own(w) if clock is None else clock
        self.w_warp[b] = w
        self.unfenced[b] = generic
        if initialize:
            self.init[b] = True
        if generic:
            self.tma_map[np.asarray(b) // 16] = -1

    def conflicts(self, byte: int, w: int, kind: str, knowledge=None) -> str:
        """Text naming the accesses on ``byte`` that ``w`` (reading or writing, per ``kind``) is not ordered after."""
        know = self.clocks.vc[w] if knowledge is None else self.clocks.widen(knowledge)
        parts = []
        x = int(self.w_warp[byte])
        if x >= 0 and x != w and know[x] < self.w_clock[byte]:
            parts.append(f"a write by {self.clocks.writer_name(x)}")
        if kind == "write":
            readers = [r for r in range(self.r_clock.shape[1]) if r != w and self.r_clock[byte, r] > know[r]]
            warps = [r for r in readers if r < self.clocks.W]
            if warps:
                parts.append(f"a read by warp{'s' if len(warps) > 1 else ''} {', '.join(map(str, warps))}")
            parts += [f"a read by {self.clocks.writer_name(r)}" for r in readers if r >= self.clocks.W]
        return " and ".join(parts) or "an access by another warp in this instruction"
