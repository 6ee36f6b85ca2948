"""An mma accumulator reused as the next mma's A operand, register for register (no shared memory, no shuffle).

Attention computes ``S = Q K^T`` with ``mma.sync.m16n8k16`` into float32 accumulators and then ``O += P V`` with P =
softmax(S) as the A operand of another ``m16n8k16``. The C/D fragment of two adjacent n8 tiles (``h = 0, 1``: columns
``8 h .. 8 h + 7``) covers an m16 x k16 tile, exactly the A fragment of one k16 step, and every lane holds the same
(row, col) set in both: with ``g = lane >> 2``, ``t = lane % 4``

* C (f32): register ``c`` of n8 tile ``h`` is ``(g + 8 (c // 2), 8 h + 2 t + c % 2)``;
* A (16-bit, two per register): register ``a`` element ``x`` is ``(g + 8 (a % 2), 8 (a // 2) + 2 t + x)``.

So A register ``a`` = the two accumulators ``(h, c) = (a // 2, 2 (a % 2) + x)`` for ``x = 0, 1``, packed low element
first (``cvt.rn.f16x2.f32 d, hi, lo``). ``AccumulatorAsOperand`` does not assume this: it finds the map by
enumerating both fragment layouts (``mmaemit.layouts.fragment``) over all 32 lanes, and ``check()`` proves that the map
is the same for every lane (a per-lane register rename) and a bijection. Kernels derive their packing from
``pack_order()``.
"""
from __future__ import annotations

import functools

from .. import isa
from ..errors import LayoutError, UnsupportedConfigError, choices
from .fragment import mma_fragment


class AccumulatorAsOperand:
    """Map A slot ``(reg, elem)`` of ``a_instr`` <-> accumulator slot ``(h, reg, elem)`` of ``tiles`` adjacent
    C fragments of ``c_instr`` (n8 tile ``h`` covers A columns ``8 h .. 8 h + 7``), identical for every lane.

    ``forward(reg, elem)`` -> ``(h, c_reg, c_elem)``; ``inverse(h, c_reg, c_elem)`` -> ``(reg, elem)``.
    Raises ``LayoutError`` at construction if some A element sits in another lane's accumulators (a shuffle would be
    needed) or the shapes do not tile.
    """

    def __init__(self, c_instr: isa.MmaInstr, a_instr: isa.MmaInstr):
        self.c_layout = mma_fragment(c_instr, "C")
        self.a_layout = mma_fragment(a_instr, "A")
        c, a = self.c_layout, self.a_layout
        if c.rows != a.rows or a.cols % c.cols:
            raise LayoutError(f"{a.name} ({a.rows}x{a.cols}) is not a row of {c.name} tiles ({c.rows}x{c.cols})")
        self.tiles = a.cols // c.cols
        self.name = f"{c.name} x{self.tiles} -> {a.name}"
        where = {}  # (lane, row, col) -> C slot
        for h in range(self.tiles):
            for lane, reg, elem in c.slots():
                row, col = c.forward(lane, reg, elem)
                where[(lane, row, col + h * c.cols)] = (h, reg, elem)
        self._map = {}
        for reg in range(a.regs):
            for elem in range(a.elems_per_reg):
                found = {where.get((lane, *a.forward(lane, reg, elem))) for lane in range(32)}
                if len(found) != 1 or None in found:
                    raise LayoutError(f"{self.name}: A register {reg} element {elem} is not held by the same "
                                      f"accumulator slot in every lane ({sorted(found, key=str)}); a shuffle is needed")
                self._map[(reg, elem)] = found.pop()
        self._inv = {v: k for k, v in self._map.items()}
        self.check()

    def __repr__(self):
        return f"AccumulatorAsOperand({self.name})"

    def forward(self, reg, elem=0) -> tuple:
        """(n8 tile h, C register, C element) that A register ``reg`` element ``elem`` takes, in every lane."""
        try:
            return self._map[(reg, elem)]
        except KeyError:
            raise LayoutError(f"{self.name}: no A slot (reg={reg}, elem={elem}); valid regs 0..{self.a_layout.regs - 1}"
                              f", elems 0..{self.a_layout.elems_per_reg - 1}") from None

    def inverse(self, h, reg, elem=0) -> tuple:
        """(A register, A element) that accumulator ``reg`` / ``elem`` of n8 tile ``h`` becomes."""
        try:
            return self._inv[(h, reg, elem)]
        except KeyError:
            raise LayoutError(f"{self.name}: no accumulator slot (h={h}, reg={reg}, elem={elem})") from None

    def check(self) -> None:
        """Prove by enumeration: a bijection between A slots and accumulator slots, and for every lane the A element
        and the accumulator it is taken from are the same (row, col) of the m x k tile."""
        c, a = self.c_layout, self.a_layout
        if len(self._map) != a.regs * a.elems_per_reg or len(self._inv) != len(self._map):
            raise LayoutError(f"{self.name}: not a bijection")
        if len(self._map) != self.tiles * c.regs * c.elems_per_reg:
            raise LayoutError(f"{self.name}: {len(self._map)} A slots for {self.tiles * c.regs * c.elems_per_reg} "
                              f"accumulator slots")
        for (reg, elem), (h, creg, celem) in self._map.items():
            for lane in range(32):
                row, col = c.forward(lane, creg, celem)
                if a.forward(lane, reg, elem) != (row, col + h * c.cols):
                    raise LayoutError(f"{self.name}: lane {lane} A ({reg}, {elem}) != C ({h}, {creg}, {celem})")
                if self.inverse(h, creg, celem) != (reg, elem):
                    raise LayoutError(f"{self.name}: inverse disagrees at {(h, creg, celem)}")

    def pack_order(self) -> list:
        """Per A register, the accumulator slots ``(h, c_reg, c_elem)`` of its elements, low element first: what a
        kernel packs (``cvt.rn.{f16,bf16}x2.f32 d, hi, lo`` for two float32 accumulators)."""
        return [[self._map[(reg, e)] for e in range(self.a_layout.elems_per_reg)] for reg in range(self.a_layout.regs)]


@functools.lru_cache(maxsize=None)
def accumulator_as_operand(dtype="float16", accum_dtype="float32") -> AccumulatorAsOperand:
    """The proven map for ``m16n8k16`` with ``dtype`` operands and ``accum_dtype`` accumulators (two n8 tiles of C ->
    one k16 step of A), e.g. attention's P = softmax(S) fed from S's accumulators into the P V mma."""
    valid = [(e.a_dtype, e.accum_dtype) for e in isa.MMA_TABLE if e.shape == (16, 8, 16) and e.a_dtype == e.b_dtype]
    try:
        ins = isa.select_mma(dtype, dtype, accum_dtype, k=16)
    except Exception as exc:  # noqa: BLE001 - restated with the valid choices
        raise UnsupportedConfigError(f"no m16n8k16 mma for {dtype} x {dtype} -> {accum_dtype}; valid: "
                                     f"{choices(valid)}") from exc
    return AccumulatorAsOperand(ins, ins)


def warpgroup_accumulator_as_operand(c_layout, a_layout, k_steps: int) -> list:
    """The wgmma form of :class:`AccumulatorAsOperand`: a warpgroup accumulator (``c_layout``, a
    ``mmaemit.layouts.WarpgroupFragmentLayout`` of 64 x N) reused as ``k_steps`` K steps of an RS-form A operand
    (``a_layout``, 64 x K per step), register for register. Returns, per K step and A register, the accumulator
    slots ``(c_reg, c_elem)`` of its elements, low element first (what a kernel packs, e.g. ``cvt.rn.f16x2.f32 d,
    hi, lo``). Proven by enumeration over all 128 threads: each A element is held by the same thread as the
    accumulator element of the same (row, col), and the register map is the same for every thread; raises
    ``LayoutError`` otherwise (a shuffle would be needed)."""
    ak = a_layout.cols
    if c_layout.rows != a_layout.rows or k_steps * ak > c_layout.cols:
        raise LayoutError(f"{k_steps} K steps of {a_layout.name} ({a_layout.rows}x{ak}) do not fit in "
                          f"{c_layout.name} ({c_layout.rows}x{c_layout.cols})")
    out = []
    for ks in range(k_steps):
        step = []
        for reg in range(a_layout.regs):
            elems = []
            for elem in range(a_layout.elems_per_reg):
                found = set()
                for t in range(128):
                    row, col = a_layout.forward(t, reg, elem)
                    ct, creg, celem = c_layout.inverse(row, col + ks * ak)
                    found.add((creg, celem) if ct == t else None)
                if len(found) != 1 or None in found:
                    raise LayoutError(f"{c_layout.name} -> {a_layout.name}: K step {ks} A register {reg} element "
                                      f"{elem} is not one accumulator slot of the same thread in every thread "
                                      f"({sorted(found, key=str)}); a shuffle is needed")
                elems.append(found.pop())
            step.append(elems)
        out.append(step)
    return out
