"""Lane maps of ``ldmatrix`` / ``stmatrix`` ``.sync.aligned.m8n8.x{num}[.trans].shared.b16``.

PTX ISA ("Warp-level matrix load instruction: ldmatrix"): each of the ``num`` matrices is 8 rows of 8 b16 elements
(16 bytes per row); lanes ``8i .. 8i+7`` supply the row addresses of matrix ``i`` (x1 reads lanes 0-7, x2 lanes 0-15,
the other addresses are ignored). Destination register ``i`` of every lane holds a fragment of matrix ``i``: without
``.trans`` lane ``l`` gets row ``l // 4``, columns ``2 (l % 4)`` (low half) and ``2 (l % 4) + 1`` (high half); with
``.trans`` (matrix read column-major) it gets rows ``2 (l % 4)`` and ``2 (l % 4) + 1`` of column ``l // 4``.
``stmatrix`` uses the same maps with data flowing from registers to memory.
"""
from __future__ import annotations

import numpy as np

from .. import isa
from ..errors import LayoutError


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer))


class MatrixMoveLayout:
    """The lane maps of ldmatrix/stmatrix .m8n8.x{num}[.trans].b16 (stmatrix: same maps, data flowing the other way)."""

    def __init__(self, num: int, trans: bool):
        self.num = num
        self.trans = bool(trans)

    @property
    def regs(self) -> int:
        """32-bit destination (ldmatrix) / source (stmatrix) registers per lane."""
        return self.num

    @property
    def address_lanes(self) -> int:
        """Lanes whose addresses the hardware reads (8 per matrix)."""
        return 8 * self.num

    def __repr__(self) -> str:
        return f"MatrixMoveLayout(m8n8.x{self.num}{'.trans' if self.trans else ''}.b16)"

    def ptx(self, op: str = "ldmatrix") -> str:
        return isa.matrix_move(op, self.num, self.trans).ptx()

    # -- addresses --------------------------------------------------------------------------------------------------
    def address_of_lane(self, lane):
        """(matrix, row) whose 16-byte row start ``lane`` supplies, or None for a lane whose address is ignored.

        For a symbolic lane (PrimExpr) the result is never None: lanes >= 8*num get the address of lane
        ``lane % (8*num)`` (in bounds, ignored by the hardware), so one expression serves every lane.
        """
        if _is_int(lane):
            if not 0 <= lane < 32:
                raise LayoutError(f"lane {lane} out of range; valid: 0..31")
            if lane >= 8 * self.num:
                return None
            return lane // 8, lane % 8
        matrix = lane >> 3 if self.num == 4 else (lane >> 3) % self.num
        return matrix, lane & 7

    def lane_of_address(self, matrix, row) -> int:
        """The lane that supplies the start address of ``row`` of ``matrix``."""
        if _is_int(matrix) and _is_int(row) and not (0 <= matrix < self.num and 0 <= row < 8):
            raise LayoutError(f"(matrix {matrix}, row {row}) out of range; valid: matrix 0..{self.num - 1}, row 0..7")
        return 8 * matrix + row

    # -- register contents ------------------------------------------------------------------------------------------
    def forward(self, lane, reg, half) -> tuple:
        """(matrix, row, col) of the b16 element in ``lane``'s register ``reg``, ``half`` 0 = low 16 bits."""
        if _is_int(lane) and _is_int(reg) and _is_int(half):
            if not (0 <= lane < 32 and 0 <= reg < self.num and half in (0, 1)):
                raise LayoutError(f"slot (lane={lane}, reg={reg}, half={half}) out of range; valid: lane 0..31, "
                                  f"reg 0..{self.num - 1}, half 0..1")
        if self.trans:
            return reg, 2 * (lane % 4) + half, lane >> 2
        return reg, lane >> 2, 2 * (lane % 4) + half

    def inverse(self, matrix, row, col) -> tuple:
        """(lane, reg, half) receiving element (row, col) of ``matrix``."""
        if _is_int(matrix) and _is_int(row) and _is_int(col):
            if not (0 <= matrix < self.num and 0 <= row < 8 and 0 <= col < 8):
                raise LayoutError(f"(matrix {matrix}, row {row}, col {col}) out of range; valid: matrix "
                                  f"0..{self.num - 1}, row 0..7, col 0..7")
        if self.trans:
            return 4 * col + row // 2, matrix, row % 2
        return 4 * row + col // 2, matrix, col % 2

    def check(self) -> None:
        """Enumerate every slot and address lane: bijections, inverses agree. Raises LayoutError."""
        seen = {}
        for lane in range(32):
            for reg in range(self.num):
                for half in range(2):
                    mrc = self.forward(lane, reg, half)
                    if not (0 <= mrc[0] < self.num and 0 <= mrc[1] < 8 and 0 <= mrc[2] < 8):
                        raise LayoutError(f"{self!r}: slot {(lane, reg, half)} maps outside to {mrc}")
                    if mrc in seen:
                        raise LayoutError(f"{self!r}: slots {seen[mrc]} and {(lane, reg, half)} both map to {mrc}")
                    seen[mrc] = (lane, reg, half)
                    if tuple(self.inverse(*mrc)) != (lane, reg, half):
                        raise LayoutError(f"{self!r}: inverse(forward{(lane, reg, half)}) = {self.inverse(*mrc)}")
        if len(seen) != 64 * self.num:
            raise LayoutError(f"{self!r}: covers {len(seen)} of {64 * self.num} elements")
        rows = set()
        for lane in range(32):
            a = self.address_of_lane(lane)
            if (a is None) != (lane >= 8 * self.num):
                raise LayoutError(f"{self!r}: lane {lane} address role is {a}")
            if a is not None:
                if a in rows or self.lane_of_address(*a) != lane:
                    raise LayoutError(f"{self!r}: lane {lane} -> {a} is not a bijection")
                rows.add(a)


def matrix_move_layout(num: int, trans: bool = False) -> MatrixMoveLayout:
    """The lane maps of ldmatrix/stmatrix ``.m8n8.x{num}[.trans].b16``; ``num`` is validated by ``isa.matrix_move``."""
    isa.matrix_move("ldmatrix", num, trans)
    return MatrixMoveLayout(num, trans)
