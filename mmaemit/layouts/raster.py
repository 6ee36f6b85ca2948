"""Threadblock rasterization: which C tile the CTA with linear id ``pid`` computes, ordered for L2 reuse.

A GEMM on a ``grid_m x grid_n`` grid of C tiles reads A panel ``tm`` (block_m rows x K) and B panel ``tn`` (K x
block_n) for tile (tm, tn). The CTAs resident at one time (a "wave": SMs x CTAs per SM) touch the union of their
panels; when that exceeds L2 (50 MB on the H100), panels are re-read from DRAM. The order decides the union:

* ``"row"``: row-major, ``pid -> (pid // grid_n, pid % grid_n)``. A wave covers about one tile row: one A panel but
  (wave size) B panels.
* ``"panel"``: ``panel`` tile rows at a time; inside a panel, consecutive ids go down its rows first, then to the next
  tile column (the last panel may be shorter). A wave covers ``panel`` rows x (wave / panel) columns. This is the
  order Triton's matmul tutorial calls grouping (``GROUP_SIZE_M = panel``) and ``panel = 1`` is ``"row"``.
* ``"serpentine"``: ``"panel"`` with every odd panel walking its columns right to left, so the B panels of a panel's
  last columns are the first ones the next panel reads (the boustrophedon order TileLang's L2 swizzle uses).
* ``"grouped"``: 2-D super-tiles of ``panel x panel`` tiles, taken left to right along bands of ``panel`` tile rows;
  row-major inside a super-tile (partial super-tiles at the right and bottom edges).

Each order is a layout object (:class:`RasterOrder`): ``forward(pid) -> (tile_m, tile_n)`` on ints or TIR
expressions (what a kernel calls), ``inverse(tile_m, tile_n) -> pid``, ``check()`` (a bijection of
``range(grid_m * grid_n)`` onto the grid and inverse(forward) = id, by enumeration) and ``order()`` (the pid of every
tile, for pictures). :func:`raster_order` builds one by name; :func:`panel_swizzle` is the ``"panel"`` forward map.
"""
from __future__ import annotations

import numpy as np

from ..errors import LayoutError, TileShapeError, UnsupportedConfigError, choices
from ..exprs import imin, select

__all__ = ["RASTER_ORDERS", "RasterOrder", "RowMajorRaster", "PanelRaster", "GroupedRaster", "raster_order",
           "panel_swizzle", "wave_footprint_bytes", "choose_raster", "L2_BYTES"]

# L2 capacity by SM major version (bytes): A100 40 MB, H100 50 MB. Used by choose_raster's default rule.
L2_BYTES = {8: 40_000_000, 9: 50_000_000}

RASTER_ORDERS = ("row", "panel", "serpentine", "grouped")


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer))


def _is_expr(x) -> bool:
    """A TIR integer expression (a symbolic grid extent), not a Python int."""
    return not _is_int(x) and type(x).__module__.startswith("tvm")


class RasterOrder:
    """A bijection between linear CTA ids and the tiles of a ``grid_m x grid_n`` grid (see the module doc)."""

    name = "?"

    def __init__(self, grid_m: int, grid_n: int):
        if self.symbolic_m and _is_expr(grid_m) and _is_int(grid_n) and grid_n >= 1:
            self.grid_m, self.grid_n = grid_m, int(grid_n)     # a symbolic tile-row count (dynamic M)
            return
        if not (_is_int(grid_m) and _is_int(grid_n)) or grid_m < 1 or grid_n < 1:
            raise TileShapeError(f"grid_m and grid_n must be positive ints (got {grid_m!r}, {grid_n!r})"
                                 + ("" if not self.symbolic_m else "; grid_m may also be a TIR expression"))
        self.grid_m, self.grid_n = int(grid_m), int(grid_n)

    #: whether ``forward`` takes a symbolic ``grid_m`` (a TIR expression: dynamic M)
    symbolic_m = False

    @property
    def size(self) -> int:
        return self.grid_m * self.grid_n

    def forward(self, pid) -> tuple:
        raise NotImplementedError

    def inverse(self, tile_m, tile_n):
        raise NotImplementedError

    def __call__(self, pid) -> tuple:
        return self.forward(pid)

    def _check_pid(self, pid):
        if _is_int(pid) and not 0 <= pid < self.size:
            raise LayoutError(f"{self!r}: pid {pid} outside 0..{self.size - 1}")

    def _check_tile(self, tm, tn):
        if _is_int(tm) and _is_int(tn) and not (0 <= tm < self.grid_m and 0 <= tn < self.grid_n):
            raise LayoutError(f"{self!r}: tile ({tm}, {tn}) outside the {self.grid_m}x{self.grid_n} grid")

    def order(self) -> np.ndarray:
        """int array [grid_m, grid_n]: the pid that computes each tile."""
        out = np.full((self.grid_m, self.grid_n), -1, dtype=np.int64)
        for pid in range(self.size):
            tm, tn = self.forward(pid)
            out[tm, tn] = pid
        return out

    def check(self) -> None:
        """Enumerate every pid: forward is a bijection onto the grid and inverse undoes it. Raises LayoutError."""
        seen = {}
        for pid in range(self.size):
            tile = tuple(int(v) for v in self.forward(pid))
            if not (0 <= tile[0] < self.grid_m and 0 <= tile[1] < self.grid_n):
                raise LayoutError(f"{self!r}: pid {pid} maps outside the grid to {tile}")
            if tile in seen:
                raise LayoutError(f"{self!r}: pids {seen[tile]} and {pid} both map to {tile}")
            seen[tile] = pid
            back = self.inverse(*tile)
            if back != pid:
                raise LayoutError(f"{self!r}: inverse(forward({pid})) = {back}")

    def wave_panels(self, wave: int) -> float:
        """Mean number of distinct (A panels + B panels) over the consecutive-pid windows of ``wave`` CTAs: the
        operand footprint of one wave in units of one panel (what the order is for)."""
        tiles = [self.forward(p) for p in range(self.size)]
        counts = []
        for s in range(0, self.size, max(1, wave)):
            chunk = tiles[s:s + wave]
            counts.append(len({t[0] for t in chunk}) + len({t[1] for t in chunk}))
        return float(np.mean(counts))


class RowMajorRaster(RasterOrder):
    name = "row"

    def forward(self, pid):
        self._check_pid(pid)
        return pid // self.grid_n, pid % self.grid_n

    def inverse(self, tile_m, tile_n):
        self._check_tile(tile_m, tile_n)
        return tile_m * self.grid_n + tile_n

    def __repr__(self):
        return f"RowMajorRaster({self.grid_m}x{self.grid_n})"


class PanelRaster(RasterOrder):
    """``panel`` tile rows at a time, down the rows first (``serpentine``: odd panels walk right to left)."""

    def __init__(self, grid_m: int, grid_n: int, panel: int = 8, serpentine: bool = False):
        super().__init__(grid_m, grid_n)
        if not _is_int(panel) or panel < 1:
            raise TileShapeError(f"panel must be a positive int, got {panel!r}")
        self.panel = int(panel)
        self.serpentine = bool(serpentine)
        self.name = "serpentine" if serpentine else "panel"

    def __repr__(self):
        return f"PanelRaster({self.grid_m}x{self.grid_n}, panel={self.panel}{', serpentine' if self.serpentine else ''})"

    symbolic_m = True

    def forward(self, pid):
        if _is_expr(self.grid_m):
            return self._forward_symbolic(pid)
        self._check_pid(pid)
        p = min(self.panel, self.grid_m)
        gn = self.grid_n
        per_panel = p * gn
        index = pid // per_panel
        first_m = index * p
        last = self.grid_m - (self.grid_m // p) * p   # rows in the final, shorter panel (0 if none)
        rows = p if last == 0 else select(first_m + p > self.grid_m, last, p)
        local = pid % per_panel
        col = local // rows
        if self.serpentine:
            col = select(index % 2 == 1, gn - 1 - col, col)
        return first_m + local % rows, col

    def _forward_symbolic(self, pid):
        # the same order with grid_m a TIR expression: the panel height and the last panel's rows are run-time values
        from tvm.script import tirx as T

        p = imin(self.panel, self.grid_m)
        gn = self.grid_n
        index = pid // (p * gn)
        first_m = index * p
        last = self.grid_m - (self.grid_m // p) * p
        rows = T.Select(T.And(last != 0, first_m + p > self.grid_m), last, p)
        local = pid % (p * gn)
        col = local // rows
        if self.serpentine:
            col = T.Select(index % 2 == 1, gn - 1 - col, col)
        return first_m + local % rows, col

    def inverse(self, tile_m, tile_n):
        self._check_tile(tile_m, tile_n)
        p = min(self.panel, self.grid_m)
        index = tile_m // p
        first_m = index * p
        rows = min(p, self.grid_m - first_m)
        col = tile_n
        if self.serpentine and index % 2 == 1:
            col = self.grid_n - 1 - tile_n
        return first_m * self.grid_n + col * rows + (tile_m - first_m)


class GroupedRaster(RasterOrder):
    """2-D super-tiles of ``group x group`` tiles along bands of ``group`` tile rows, row-major inside each."""

    name = "grouped"

    def __init__(self, grid_m: int, grid_n: int, group: int = 8):
        super().__init__(grid_m, grid_n)
        if not _is_int(group) or group < 1:
            raise TileShapeError(f"group must be a positive int, got {group!r}")
        self.group = int(group)

    def __repr__(self):
        return f"GroupedRaster({self.grid_m}x{self.grid_n}, group={self.group})"

    def forward(self, pid):
        self._check_pid(pid)
        gr, gc = min(self.group, self.grid_m), min(self.group, self.grid_n)
        gm, gn = self.grid_m, self.grid_n
        first_m = pid // (gr * gn) * gr
        last_r, last_c = gm % gr, gn % gc
        rows = gr if last_r == 0 else select(first_m + gr > gm, last_r, gr)
        # remainders, not pid - first_m * gn: TVM's simplifier would expand the difference into products of the
        # caller's strides that overflow int32 literals on large grids (16384 x 16384 C tiles of 128)
        local = pid % (gr * gn)
        first_n = local // (rows * gc) * gc
        cols = gc if last_c == 0 else select(first_n + gc > gn, last_c, gc)
        within = local % (rows * gc)
        return first_m + within // cols, first_n + within % cols

    def inverse(self, tile_m, tile_n):
        self._check_tile(tile_m, tile_n)
        gr, gc = min(self.group, self.grid_m), min(self.group, self.grid_n)
        first_m = tile_m // gr * gr
        rows = min(gr, self.grid_m - first_m)
        first_n = tile_n // gc * gc
        cols = min(gc, self.grid_n - first_n)
        return first_m * self.grid_n + first_n * rows + (tile_m - first_m) * cols + (tile_n - first_n)


def raster_order(kind: str, grid_m: int, grid_n: int, panel: int = 8) -> RasterOrder:
    """The order named ``kind`` (one of ``RASTER_ORDERS``) on a ``grid_m x grid_n`` grid; ``panel`` is the panel
    height of "panel" / "serpentine" and the super-tile size of "grouped" (ignored by "row")."""
    if kind == "row":
        return RowMajorRaster(grid_m, grid_n)
    if kind in ("panel", "serpentine"):
        return PanelRaster(grid_m, grid_n, panel, serpentine=kind == "serpentine")
    if kind == "grouped":
        return GroupedRaster(grid_m, grid_n, panel)
    raise UnsupportedConfigError(f"unknown raster order {kind!r}; valid: {choices(RASTER_ORDERS)}")


def panel_swizzle(pid, grid_m: int, grid_n: int, panel: int = 8):
    """(tile_m, tile_n) of linear CTA id ``pid`` (int or PrimExpr) in the ``"panel"`` order (see the module doc).

    Tile rows are taken ``panel`` at a time (the last panel may be shorter); inside a panel, consecutive ids go down
    the panel's rows first, then to the next tile column. ``panel=1`` is the plain row-major order.
    """
    if _is_expr(grid_m) and _is_int(panel) and panel >= 1:
        return PanelRaster(grid_m, grid_n, panel).forward(pid)
    if not _is_int(panel) or panel < 1 or grid_m < 1 or grid_n < 1:
        raise TileShapeError(f"panel, grid_m and grid_n must be positive (got {panel}, {grid_m}, {grid_n})")
    return PanelRaster(grid_m, grid_n, panel).forward(pid)


def wave_footprint_bytes(order: RasterOrder, wave: int, block_m: int, block_n: int, K: int, a_bytes: float = 2,
                         b_bytes: float = 2) -> int:
    """The largest number of distinct operand bytes (A panels ``block_m x K`` plus B panels ``K x block_n``) that
    one wave of ``wave`` consecutive tile ids of ``order`` touches: what L2 must hold for those panels to be read from
    DRAM once per wave."""
    if wave < 1:
        raise TileShapeError(f"wave must be >= 1, not {wave}")
    worst = 0
    for s in range(0, order.size, wave):
        tiles = [order.forward(p) for p in range(s, min(order.size, s + wave))]
        rows = len({t[0] for t in tiles})
        cols = len({t[1] for t in tiles})
        worst = max(worst, int(rows * block_m * K * a_bytes + cols * block_n * K * b_bytes))
    return worst


def choose_raster(grid_m: int, grid_n: int, block_m: int, block_n: int, K: int, wave: int, l2_bytes: int,
                  a_bytes: float = 2, b_bytes: float = 2, panel: int = 8) -> tuple:
    """The default tile order, ``(kind, panel)``, by the rule the H100 rasterization study measured
    (docs/perf-notes.md, BENCHMARKS.md): row-major while one wave's panels fit in L2 (row-major was fastest there,
    panel 8 lost 7-19 %), ``"panel"`` with ``panel`` rows once they do not (panel 8 won by 4-12 %)."""
    row = RowMajorRaster(grid_m, grid_n)
    if wave_footprint_bytes(row, wave, block_m, block_n, K, a_bytes, b_bytes) <= l2_bytes:
        return "row", 1
    return "panel", panel
