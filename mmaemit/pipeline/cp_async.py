"""cp.async tiles (sm_80+): the pre-Hopper counterpart of :class:`mmaemit.pipeline.TmaTile`, with the same
vocabulary — a global tensor, a box of it, the shared layout the box lands in, box coordinates at load time.

Where TMA moves a whole box with one instruction issued by one thread and signals an mbarrier, a cp.async tile is
copied by every thread of the CTA in 16-byte pieces (``cp.async.cg.shared.global``, L1 bypassed), and completion is
tracked per thread by commit groups: ``commit()`` after a stage's loads, ``wait(n)`` (at most ``n`` younger groups
pending) and a CTA barrier before any thread reads another thread's pieces. Piece ``q = tid + i * threads`` is row
``q // pieces_per_row``, 16-byte column ``q % pieces_per_row``: consecutive threads copy consecutive 16-byte pieces
of a row (coalesced 128-byte lines per 8 threads), into the swizzled position ``layout(stage, row, col)``.
``bounds=True`` clips rows / columns at the global edge with the zero-fill form (``src-size`` 0: the piece is
written with zeros), as TMA's out-of-bounds fill does.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes as _dt
from ..errors import TileShapeError, UnsupportedConfigError
from .stmt import emit

__all__ = ["CpAsyncTile", "cp_async_commit", "cp_async_wait"]

PIECE = 16


@dataclass(frozen=True)
class CpAsyncTile:
    """``box`` (rows, cols) of a 2-D global tensor of ``global_shape`` (stored elements; 4-bit operands travel as
    uint8) copied by ``threads`` threads into a shared tile laid out by ``layout`` (a ``SwizzleLayout`` over
    ``(stages, rows, cols)`` or ``(rows, cols)``; None: row-major)."""

    global_shape: tuple
    dtype: str
    box: tuple
    threads: int
    layout: object = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", _dt.canonical(self.dtype))
        object.__setattr__(self, "global_shape", tuple(int(d) for d in self.global_shape))
        object.__setattr__(self, "box", tuple(int(b) for b in self.box))
        if len(self.global_shape) != 2 or len(self.box) != 2:
            raise TileShapeError(f"a cp.async tile is 2-D: global_shape {self.global_shape}, box {self.box}")
        bits = _dt.bits(self.dtype)
        if bits < 8:
            raise UnsupportedConfigError(f"{self.dtype}: pass sub-byte operands as their packed uint8 storage")
        epp = PIECE * 8 // bits
        rows, cols = self.box
        if cols % epp or rows < 1:
            raise TileShapeError(f"box {self.box}: the row of {cols} x {self.dtype} must be a multiple of 16 bytes "
                                 f"({epp} elements)")
        if self.global_shape[1] % epp:
            raise TileShapeError(f"global rows of {self.global_shape[1]} x {self.dtype} are not 16-byte multiples; "
                                 f"16-byte cp.async needs aligned rows")
        if (rows * (cols // epp)) % self.threads:
            raise TileShapeError(f"box {self.box} has {rows * (cols // epp)} 16-byte pieces, not a multiple of the "
                                 f"{self.threads} threads")
        if self.layout is not None and tuple(self.layout.shape[-2:]) != self.box:
            raise TileShapeError(f"layout tile {tuple(self.layout.shape[-2:])} != box {self.box}")

    @property
    def elems_per_piece(self) -> int:
        return PIECE * 8 // _dt.bits(self.dtype)

    @property
    def pieces_per_row(self) -> int:
        return self.box[1] // self.elems_per_piece

    @property
    def iterations(self) -> int:
        """16-byte pieces per thread per load."""
        return self.box[0] * self.pieces_per_row // self.threads

    def _smem_index(self, stage, r, c):
        if self.layout is None:
            return [r, c] if stage is None else [stage, r, c]
        return list(self.layout(r, c) if stage is None else self.layout(stage, r, c))

    def load(self, smem, stage, src, coords, tid, *, bounds=False) -> None:
        """Emit this thread's pieces of the box at element ``coords`` (row, col) of ``src`` into ``smem`` (stage
        ``stage`` of a stacked tile, or None). ``bounds``: zero-fill pieces outside the global tensor."""
        from tvm.script import tirx as T
        from tvm.tirx.script.builder import ir as IRB

        row0, col0 = coords
        epp, cpr = self.elems_per_piece, self.pieces_per_row
        with IRB.unroll(self.iterations) as i:
            q = tid + i * self.threads
            r = q // cpr
            c = q % cpr * epp
            dst = smem.ptr_to(self._smem_index(stage, r, c))
            if not bounds:
                emit(T.ptx["cp.async.cg.shared.global"](dst, src.ptr_to([row0 + r, col0 + c]), PIECE))
            else:
                gr, gc = row0 + r, col0 + c
                inside = T.And(gr < self.global_shape[0], gc < self.global_shape[1])
                emit(T.ptx["cp.async.cg.shared.global"](
                    dst, src.ptr_to([T.min(gr, self.global_shape[0] - 1), T.min(gc, self.global_shape[1] - epp)]),
                    PIECE, T.Select(inside, T.uint32(PIECE), T.uint32(0))))


def cp_async_commit() -> None:
    """``cp.async.commit_group``: close this thread's group of pending copies (commit even an empty group so the
    group count stays uniform across stages)."""
    from tvm.script import tirx as T

    emit(T.ptx["cp.async.commit_group"]())


def cp_async_wait(n: int) -> None:
    """``cp.async.wait_group n``: this thread's copies are done except the ``n`` youngest groups (follow with a CTA
    barrier before reading other threads' pieces)."""
    from tvm.script import tirx as T

    if not isinstance(n, int) or n < 0:
        raise UnsupportedConfigError(f"cp_async_wait takes a non-negative compile-time int, not {n!r}")
    emit(T.ptx["cp.async.wait_group"](n))
