"""Persistent tile scheduling: a grid of one CTA (or cluster) per SM walks the output tiles in an L2-friendly order.

Worker ``w`` of ``workers`` takes work items ``w, w + workers, w + 2 workers, ...`` of ``grid_m x grid_n`` tiles;
item ``i`` maps to a tile through :func:`mmaemit.layouts.raster.panel_swizzle` (``panel`` tile rows walked column by
column, a bijection proven in tests). With ``cluster_m > 1`` a work item is a column of ``cluster_m`` vertically
adjacent tiles, one per CTA of the cluster (they share the B tile, which TMA multicasts).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import TileShapeError, UnsupportedConfigError
from ..layouts.raster import panel_swizzle

__all__ = ["PersistentTileScheduler"]


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
