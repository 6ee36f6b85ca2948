"""Persistent tile scheduling: a grid of one CTA (or cluster) per SM walks the output tiles in an L2-friendly order.

Worker ``w`` of ``workers`` takes work items ``w, w + workers, w + 2 workers, ...`` of ``grid_m x grid_n`` tiles;
item ``i`` maps to a tile through :func:`mmaemit.layouts.raster.panel_swizzle` (``panel`` tile rows walked column by
column, a bijection proven in tests). With ``cluster_m > 1`` a work item is a column of ``cluster_m`` vertically
adjacent tiles, one per CTA of the cluster (they share the B tile, which TMA multicasts).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import TileShapeError, UnsupportedConfigError
from ..exprs import both, imax, imin, is_int, select
from ..layouts.raster import panel_swizzle

__all__ = ["PersistentTileScheduler", "StreamKScheduler"]


@dataclass(frozen=True)
class PersistentTileScheduler:
    """``grid_m x grid_n`` output tiles over ``workers`` persistent CTAs (clusters when ``cluster_m > 1``)."""

    grid_m: int
    grid_n: int
    workers: int
    panel: int = 8
    cluster_m: int = 1

    def __post_init__(self):
        if not isinstance(self.grid_m, int):       # a symbolic tile-row count (dynamic M): a fixed worker count
            if self.cluster_m != 1 or not isinstance(self.workers, int) or self.workers < 1 or self.grid_n < 1:
                raise TileShapeError(f"a symbolic grid_m ({self.grid_m}) takes cluster_m=1 and positive int workers "
                                     f"and grid_n (got {self.cluster_m}, {self.workers}, {self.grid_n})")
            if self.panel < 1:
                raise UnsupportedConfigError(f"panel={self.panel} must be >= 1")
            return
        if self.grid_m < 1 or self.grid_n < 1 or self.workers < 1:
            raise TileShapeError(f"grid {self.grid_m} x {self.grid_n} over {self.workers} workers: all must be >= 1")
        if self.cluster_m < 1 or self.grid_m % self.cluster_m:
            raise TileShapeError(f"cluster_m={self.cluster_m} must divide grid_m={self.grid_m} (tile rows)")
        if self.panel < 1:
            raise UnsupportedConfigError(f"panel={self.panel} must be >= 1")

    @property
    def items(self) -> int:
        """Work items: tiles, or tile columns of ``cluster_m`` tiles."""
        return self.grid_m // self.cluster_m * self.grid_n

    def count(self, worker):
        """How many work items ``worker`` (int or PrimExpr in [0, workers)) processes."""
        return (self.items - worker + self.workers - 1) // self.workers

    def tile(self, worker, t, rank=0):
        """(tile_m, tile_n) of the ``t``-th item of ``worker``; ``rank``: the CTA's rank in its cluster."""
        pm, tn = panel_swizzle(worker + t * self.workers, self.grid_m // self.cluster_m, self.grid_n, self.panel)
        return pm * self.cluster_m + rank, tn

    def tile_into(self, regs, worker, t, rank=0):
        """Emit ``regs[0], regs[1] = tile(worker, t, rank)`` (``regs``: an int32 local buffer of 2) and return the two
        register reads, for a loop over the tile's K blocks: the tile is computed once per tile. With a symbolic
        ``grid_m`` the panel order is ~20 integer divisions by a run-time count, which nvcc does not hoist out of a K
        loop (the divisor may be 0 for all it knows)."""
        from tvm.tirx.script.builder import ir as IRB

        tm, tn = self.tile(worker, t, rank)
        IRB.buffer_store(regs, tm, [0])
        IRB.buffer_store(regs, tn, [1])
        return regs[0], regs[1]


@dataclass(frozen=True)
class StreamKScheduler:
    """Persistent tiles with a stream-K tail: where the last wave of whole tiles would leave SMs idle, its tiles' K
    work is spread evenly over the workers instead.

    ``grid_m x grid_n`` output tiles of ``units`` K units each (ring stages) over ``workers`` persistent CTAs.
    With ``R = tiles % workers`` tiles in the last wave, stream-K applies when ``0 < R <= workers * 9 / 10``
    (``threshold``; the data-parallel last wave would leave a tenth or more of the SMs idle), a tile has at least
    two granules, the busiest worker does at least ``min_saved`` units fewer than a data-parallel last wave's whole
    tile (the pieces' fixed cost must pay off), and the whole waves before the tail number at most ``max_whole``
    (None: any); all evaluated at run time for a symbolic ``grid_m``. Then every worker first takes
    ``D = tiles // workers`` whole tiles (``w, w + workers, ...`` as :class:`PersistentTileScheduler`, the same panel
    order), and the last ``R`` tiles are cut into ``granule``-unit granules (``S = R * units / granule`` of them, in
    tile then K order), dealt as contiguous ranges to the first ``WS`` workers (all of them, or fewer so that each
    range holds at least ``min_granules``, capped at half a tile). A range that lies inside one tile is one *piece*;
    one that crosses a tile boundary is two (never more: a range never holds more granules than a tile). A piece
    that is not a whole tile writes fp32 partial sums to its own workspace slot (worker, item - D) and adds its
    granule count to the tile's counter; the piece whose add completes the tile (the last to arrive, whoever that
    is) sums every piece's slot in K order (:meth:`pieces`: the same sum whatever the arrival order, so results are
    deterministic) and stores the tile. Nobody waits for anybody, so no co-residency of the CTAs is needed.

    Without stream-K (``R == 0``, or a last wave that fills the GPU) the items are :class:`PersistentTileScheduler`'s.
    Every formula works on Python ints (host-side planning and tests) and on TIR expressions (in the kernel,
    :mod:`mmaemit.exprs`)."""

    grid_m: object
    grid_n: int
    workers: int
    units: int
    granule: int = 1
    panel: int = 8
    min_granules: int = 1
    threshold: tuple = (9, 10)
    min_saved: int = 0
    max_whole: int | None = None

    def __post_init__(self):
        if not is_int(self.units) or self.units < 1 or not is_int(self.granule) or self.granule < 1 \
                or self.units % self.granule:
            raise TileShapeError(f"units={self.units} per tile must be a positive multiple of granule={self.granule}")
        if not is_int(self.min_granules) or self.min_granules < 1:
            raise UnsupportedConfigError(f"min_granules={self.min_granules} must be an int >= 1")
        if not is_int(self.min_saved) or self.min_saved < 0:
            raise UnsupportedConfigError(f"min_saved={self.min_saved} must be an int >= 0")
        if self.max_whole is not None and (not is_int(self.max_whole) or self.max_whole < 0):
            raise UnsupportedConfigError(f"max_whole={self.max_whole} must be None or an int >= 0")
        num, den = self.threshold
        if not (is_int(num) and is_int(den) and 0 < num <= den):
            raise UnsupportedConfigError(f"threshold={self.threshold} must be (num, den) with 0 < num <= den")
        PersistentTileScheduler(self.grid_m, self.grid_n, self.workers, self.panel)     # the same checks

    @property
    def tiles(self):
        return self.grid_m * self.grid_n

    @property
    def granules_per_tile(self) -> int:
        return self.units // self.granule

    # ------------------------------------------------------------------------------------------------ the split
    def _prologue(self, worker, put):
        # the split, one value per step; put(i, v) keeps step i (a register in the kernel) and returns what later
        # steps read
        num, den = self.threshold
        W, ng = self.workers, self.granules_per_tile
        least = min(self.min_granules, max(1, ng // 2))
        tiles = put(0, self.tiles)
        tail = put(1, tiles % W)                                          # R
        S = put(2, tail * ng)
        WS = put(3, imin(W, imax(1, S // least)))
        # the busiest worker's units saved against the data-parallel last wave (a whole tile): its range is at most
        # ceil(S / WS) granules
        saved = self.units - (S + WS - 1) // WS * self.granule
        ok = both(both(tail > 0, tail * den <= W * num), saved >= self.min_saved)
        if self.max_whole is not None:
            ok = both(ok, tiles // W <= self.max_whole)
        on = put(4, select(ok, 1, 0) if ng > 1 else 0)
        D = put(5, select(on != 0, tiles // W, (tiles - worker + W - 1) // W))
        gb = put(6, imin(worker, WS) * S // WS)
        ge = put(7, imin(worker + 1, WS) * S // WS)
        return D, on, gb, ge, S, WS

    def prologue(self, worker) -> tuple:
        """(D, streamed, range start, range end, S, WS) of ``worker``: what its items derive from (D: its whole tiles
        before the tail, or every tile's round without stream-K; streamed: 1 or 0; the range: its tail granules;
        S: the tail's granules; WS: the workers with a range)."""
        return self._prologue(worker, lambda i, v: v)

    def prologue_into(self, regs, worker) -> tuple:
        """Emit :meth:`prologue` into ``regs`` (an int32 local buffer of 8), once per CTA, one step per register (so
        that no expression repeats another's), and return the register reads, for :meth:`count`, :meth:`item` and
        :meth:`pieces`."""
        from tvm.tirx.script.builder import ir as IRB

        def put(i, v):
            IRB.buffer_store(regs, v, [i])
            return regs[i]
        return self._prologue(worker, put)

    @property
    def streamed(self):
        """Whether the stream-K tail applies (a bool, or a TIR condition for a symbolic ``grid_m``)."""
        on = self.prologue(0)[1]
        return bool(on) if is_int(on) else on != 0

    def range_start(self, worker, pre=None):
        """The first tail granule of ``worker`` (its range ends where worker + 1's starts; empty past WS; ``pre``:
        any worker's :meth:`prologue`, for S and WS)."""
        S, WS = (pre or self.prologue(0))[4:6]
        return imin(worker, WS) * S // WS

    def worker_of(self, granule, pre=None):
        """The worker whose range holds tail granule ``granule`` (the inverse of :meth:`range_start`)."""
        S, WS = (pre or self.prologue(0))[4:6]
        return ((granule + 1) * WS + S - 1) // S - 1

    # ------------------------------------------------------------------------------------------------ items
    def count(self, worker, pre=None):
        """How many work items (whole tiles and pieces) ``worker`` processes (``pre``: its :meth:`prologue`)."""
        D, on, g0, g1 = (pre or self.prologue(worker))[:4]
        ng = self.granules_per_tile
        tail = select(g1 > g0, (imax(g1, 1) - 1) // ng - g0 // ng + 1, 0)
        return select(on != 0, D + tail, D)

    def item(self, worker, t, pre=None):
        """(tile_m, tile_n, u0, nu, ring0, sk, slot) of item ``t`` of ``worker`` (``pre``: its :meth:`prologue`): the
        tile, its K units [u0, u0 + nu), ``ring0``: where the item sits in the worker's sequence of units (unit u of
        the item is the worker's unit ring0 + u: its ring iteration), ``sk``: the tail tile's index (-1: a whole
        tile, nothing to combine) and the item's workspace slot (0 or 1; meaningful for sk >= 0)."""
        ng, gr, W, KU = self.granules_per_tile, self.granule, self.workers, self.units
        D, on, gb, ge = (pre or self.prologue(worker))[:4]
        in_tail = t >= D          # only with stream-K: D is then the whole tiles, else every item's round
        slot = t - D
        r = gb // ng + slot
        g0 = imax(gb, r * ng)
        g1 = imin(ge, r * ng + ng)
        linear = select(in_tail, D * W + r, worker + t * W)
        tm, tn = panel_swizzle(linear, self.grid_m, self.grid_n, self.panel)
        u0 = select(in_tail, (g0 - r * ng) * gr, 0)
        nu = select(in_tail, (g1 - g0) * gr, KU)
        ring0 = select(in_tail, D * KU + (r * ng - gb) * gr, t * KU)
        sk = select(in_tail, select(g1 - g0 == ng, -1, r), -1)
        return tm, tn, u0, nu, ring0, sk, select(in_tail, slot, 0)

    def item_into(self, regs, worker, t, pre=None):
        """Emit ``regs[0..6] = item(worker, t, pre)`` (``regs``: an int32 local buffer of 7) and return the register
        reads: computed once per item, not in its K loop."""
        from tvm.tirx.script.builder import ir as IRB

        for i, v in enumerate(self.item(worker, t, pre)):
            IRB.buffer_store(regs, v, [i])
        return tuple(regs[i] for i in range(7))

    def pieces(self, sk, pre=None):
        """(first worker, last worker) whose ranges hold tail tile ``sk``, in K order; worker w's piece of it is in
        its slot ``sk - range_start(w) // granules_per_tile`` (``pre``: any worker's :meth:`prologue`)."""
        ng = self.granules_per_tile
        return self.worker_of(sk * ng, pre), self.worker_of(sk * ng + ng - 1, pre)

    def plan(self, worker) -> list:
        """The items of ``worker`` as Python tuples (ints only; for tests and pictures)."""
        if not is_int(self.grid_m):
            raise TileShapeError("plan() needs an int grid_m")
        return [self.item(worker, t) for t in range(self.count(worker))]
