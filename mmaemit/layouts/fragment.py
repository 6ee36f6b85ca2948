"""Register-fragment maps of warp-level ``mma.sync.m16n8k*`` operands: (lane, reg, elem) <-> (row, col).

Every ``mma.sync`` in ``isa.MMA_TABLE`` distributes its operands the same way once element width is factored out
(PTX ISA, "Matrix Fragments for mma.m16n8k*"): with ``g = lane >> 2`` (groupID), ``t = lane % 4``
(threadID_in_group) and ``e = 32 // elem_bits`` elements per 32-bit register,

* A (m16 x k): register ``reg`` covers an 8 x 4e block; ``row = g + 8 * (reg % 2)``,
  ``col = 4e * (reg // 2) + e * t + elem``.
* B (k x n8):  ``row = 4e * reg + e * t + elem``, ``col = g``.
* C/D (m16 x n8): element ``i = reg * e + elem`` (f16 accumulators pack two per register);
  ``row = g + 8 * (i // 2)``, ``col = 2 * t + i % 2``.

``elem`` counts from the low bits of the register. The maps use only ``+ - * // % >> &`` so they evaluate on Python
ints and on TVM ``PrimExpr`` (``//`` and ``%`` are floordiv/floormod there).
"""
from __future__ import annotations

import functools

import numpy as np

from .. import dtypes as _dt
from .. import isa
from ..errors import LayoutError, UnsupportedConfigError, choices

_OPERANDS = ("A", "B", "C")


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer))


class FragmentLayout:
    """(lane, reg, elem) <-> (row, col) map of one warp-level mma register fragment.

    ``rows x cols`` is the operand tile: A is (m, k), B is (k, n), C/D is (m, n). ``regs`` is the number of 32-bit
    registers per lane, ``elems_per_reg = 32 // elem_bits``.
    """

    def __init__(self, name: str, operand: str, rows: int, cols: int, elem_bits: int, regs: int):
        self.name = name
        self.operand = operand
        self.rows = rows
        self.cols = cols
        self.elem_bits = elem_bits
        self.regs = regs
        self.elems_per_reg = 32 // elem_bits
        if 32 * regs * self.elems_per_reg != rows * cols:
            raise LayoutError(f"{name}: 32 lanes x {regs} regs x {self.elems_per_reg} elems "
                              f"!= {rows} x {cols} elements")

    def __repr__(self) -> str:
        return (f"FragmentLayout({self.name}: {self.rows}x{self.cols}, {self.elem_bits}-bit, "
                f"{self.regs} regs x {self.elems_per_reg} elems per lane)")

    # -- maps -------------------------------------------------------------------------------------------------------
    def forward(self, lane, reg, elem=0) -> tuple:
        """(row, col) of the element held by ``lane`` in register ``reg``, sub-element ``elem`` (0 = low bits)."""
        if _is_int(lane) and _is_int(reg) and _is_int(elem):
            self._check_slot(lane, reg, elem)
        e = self.elems_per_reg
        g = lane >> 2
        t = lane % 4
        if self.operand == "A":
            return g + 8 * (reg % 2), 4 * e * (reg // 2) + e * t + elem
        if self.operand == "B":
            return 4 * e * reg + e * t + elem, g
        i = reg * e + elem
        return g + 8 * (i // 2), 2 * t + i % 2

    def inverse(self, row, col) -> tuple:
        """(lane, reg, elem) holding element (row, col) of the tile."""
        if _is_int(row) and _is_int(col) and not (0 <= row < self.rows and 0 <= col < self.cols):
            raise LayoutError(f"{self.name}: ({row}, {col}) is outside the {self.rows}x{self.cols} tile")
        e = self.elems_per_reg
        if self.operand == "A":
            block = 4 * e
            return 4 * (row % 8) + (col % block) // e, 2 * (col // block) + row // 8, col % e
        if self.operand == "B":
            block = 4 * e
            return 4 * col + (row % block) // e, row // block, row % e
        i = 2 * (row // 8) + col % 2
        return 4 * (row % 8) + col // 2, i // e, i % e

    # -- proofs -----------------------------------------------------------------------------------------------------
    def _check_slot(self, lane, reg, elem):
        if not (0 <= lane < 32 and 0 <= reg < self.regs and 0 <= elem < self.elems_per_reg):
            raise LayoutError(f"{self.name}: slot (lane={lane}, reg={reg}, elem={elem}) out of range; valid: "
                              f"lane 0..31, reg 0..{self.regs - 1}, elem 0..{self.elems_per_reg - 1}")

    def slots(self):
        """Every (lane, reg, elem) slot, lane-major."""
        for lane in range(32):
            for reg in range(self.regs):
                for elem in range(self.elems_per_reg):
                    yield lane, reg, elem

    def check(self) -> None:
        """Enumerate all slots: forward is a bijection onto rows x cols and inverse undoes it. Raises LayoutError."""
        seen = {}
        for slot in self.slots():
            rc = self.forward(*slot)
            if not (0 <= rc[0] < self.rows and 0 <= rc[1] < self.cols):
                raise LayoutError(f"{self.name}: slot {slot} maps outside the tile to {rc}")
            if rc in seen:
                raise LayoutError(f"{self.name}: slots {seen[rc]} and {slot} both map to {rc}")
            seen[rc] = slot
            back = self.inverse(*rc)
            if tuple(back) != slot:
                raise LayoutError(f"{self.name}: inverse(forward{slot}) = {back}")
        if len(seen) != self.rows * self.cols:
            raise LayoutError(f"{self.name}: covers {len(seen)} of {self.rows * self.cols} elements")

    def table(self) -> np.ndarray:
        """int array of shape (32, regs, elems_per_reg, 2): the (row, col) of every slot."""
        out = np.empty((32, self.regs, self.elems_per_reg, 2), dtype=np.int64)
        for lane, reg, elem in self.slots():
            out[lane, reg, elem] = self.forward(lane, reg, elem)
        return out


@functools.lru_cache(maxsize=None)
def _fragment(instr: isa.MmaInstr, operand: str) -> FragmentLayout:
    name = f"{instr.ptx()}.{operand}"
    if operand == "A":
        return FragmentLayout(name, "A", instr.m, instr.k, _dt.bits(instr.a_dtype), instr.a_regs)
    if operand == "B":
        return FragmentLayout(name, "B", instr.k, instr.n, _dt.bits(instr.b_dtype), instr.b_regs)
    return FragmentLayout(name, "C", instr.m, instr.n, _dt.bits(instr.accum_dtype), instr.c_regs)


def _table_entry(instr) -> isa.MmaInstr:
    """``instr`` as an ``MMA_TABLE`` entry: the entry itself, or its exact PTX name (with or without .satfinite)."""
    if isinstance(instr, isa.MmaInstr) and instr in isa.MMA_TABLE:
        return instr
    if isinstance(instr, str):
        name = instr.strip()
        for e in isa.MMA_TABLE:
            if name == e.ptx() or (e.is_integer and name == e.ptx(True)):
                return e
    raise UnsupportedConfigError(
        f"{instr!r} is neither an entry of mmaemit.isa.MMA_TABLE nor the PTX name of one; valid PTX names: "
        f"{choices(e.ptx() for e in isa.MMA_TABLE)} (integer ones also with .satfinite after .row.col)")


def mma_fragment(instr, operand: str) -> FragmentLayout:
    """The fragment map of ``operand`` ("A" (m, k), "B" (k, n), "C" (m, n); "D" = "C") of an mma.sync.

    ``instr``: an ``isa.MMA_TABLE`` entry (``isa.select_mma(...)``, ``emitter.instruction``) or its PTX name, e.g.
    ``"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"``.
    """
    instr = _table_entry(instr)
    op = operand.upper() if isinstance(operand, str) else operand
    if op == "D":
        op = "C"
    if op not in _OPERANDS:
        raise UnsupportedConfigError(f"unknown mma operand {operand!r}; valid: {choices(_OPERANDS)} ('D' = 'C')")
    return _fragment(instr, op)
