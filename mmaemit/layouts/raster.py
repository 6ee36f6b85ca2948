"""Threadblock rasterization: which C tile a CTA computes, ordered for L2 reuse (the "panel swizzle").

A row-major launch order walks a whole row of C tiles before moving down, so every A panel is read once but B is
re-read from DRAM once per row of tiles whenever B does not fit in L2. Grouping ``panel`` tile-rows together makes
consecutive CTAs share both A panels and B panels: CTA ``pid`` walks down a panel of ``panel`` tile-rows column by
column. The map is a bijection of ``range(grid_m * grid_n)`` onto the tile grid (proven by enumeration in tests).
"""
from __future__ import annotations

from ..errors import TileShapeError


def panel_swizzle(pid, grid_m: int, grid_n: int, panel: int = 8):
    """(tile_m, tile_n) of linear CTA id ``pid`` (int or PrimExpr) on a ``grid_m x grid_n`` tile grid.

    Tile rows are taken ``panel`` at a time (the last panel may be shorter); inside a panel, consecutive ids go down
    the panel's rows first, then to the next tile column. ``panel=1`` is the plain row-major order.
    """
    if panel < 1 or grid_m < 1 or grid_n < 1:
        raise TileShapeError(f"panel, grid_m and grid_n must be positive (got {panel}, {grid_m}, {grid_n})")
    panel = min(panel, grid_m)
    per_panel = panel * grid_n
    first_m = (pid // per_panel) * panel
    last = grid_m - (grid_m // panel) * panel   # rows in the final, shorter panel (0 if none)
    if last == 0:
        rows = panel
    else:
        rows = _select(first_m + panel > grid_m, last, panel)
    local = pid % per_panel
    return first_m + local % rows, local // rows


def _select(cond, a, b):
    if isinstance(cond, bool):
        return a if cond else b
    from tvm.script import tirx as T

    return T.Select(cond, a, b)
