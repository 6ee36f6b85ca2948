"""Hopper ``wgmma`` layouts: shared-memory operand tiles with their matrix descriptors, and the warpgroup register
fragments (accumulator, RS A operand).

Shared operand tiles. A wgmma reads A (SS form) and B from shared memory through a 64-bit matrix descriptor: a start
address, a leading- and a stride-dimension byte offset (LBO, SBO) and a swizzle mode (none, 32, 64, 128 bytes); the
hardware applies ``Swizzle<log2(W/16), 4, 3>`` to absolute shared addresses (PTX ISA 9.7.15.5.1.2). mmaemit never
writes those numbers by hand: :func:`make_wgmma_layout` builds the tile as a :class:`SwizzleLayout` (the object the
TMA box (``TmaTile.for_layout``), cp.async copies and plain stores use) made of *atoms* whose rows are exactly one
swizzle span (W bytes; 16 bytes without swizzle), and :class:`WgmmaOperandLayout` derives LBO / SBO from that
layout's own byte offsets. ``WgmmaOperandLayout.check`` then proves, by enumerating every element of every
instruction slice, that the descriptor's address function (``mmaemit.ptx.wgmma``, transcribed from the ISA) and the
layout's ``byte_offset`` agree.

Tile shapes (``mn`` = M rows of A or N columns of B, ``k`` = the K extent; ``stages`` leading dims pass through):

* K-major (K contiguous, every dtype): ``(*stages, [k_atoms,] mn, span)``, span = W / element bytes K elements
  (16 bytes without swizzle), ``k_atoms = k / span`` (the dim is omitted when it is 1).
* MN-major (M / N contiguous, f16 / bf16 only): ``(*stages, [mn_atoms,] k, span)`` of span M / N elements.

Fragments. A warpgroup is 4 warps; warp ``w`` holds rows ``16 w .. 16 w + 15`` of the 64-row accumulator as the
``mma.m16n8`` C fragment of every 8-column block, and (RS form) those rows of A as the ``mma.m16n8kK`` A fragment
(PTX ISA 9.7.15.5.1.1). :func:`wgmma_accumulator_layout` and :func:`wgmma_a_layout` build both from
``mmaemit.layouts.mma_fragment``; their maps take ints, numpy arrays or TIR expressions.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .. import dtypes as _dt
from .. import isa
from ..errors import LayoutError, TileShapeError, UnsupportedConfigError, choices
from .fragment import mma_fragment
from .swizzle import SWIZZLE_CHOICES, SwizzleLayout, make_mma_swizzle_layout

__all__ = ["WGMMA_MAJORS", "WgmmaOperandLayout", "make_wgmma_layout", "wgmma_operand_layout",
           "WarpgroupFragmentLayout", "wgmma_accumulator_layout", "wgmma_a_layout", "DESCRIPTOR_SWIZZLE_FIELD",
           "TVM_SWIZZLE_ARG"]

WGMMA_MAJORS = ("K", "MN")
#: swizzle bytes -> the descriptor's 2-bit swizzle field (PTX ISA matrix descriptor, bits 63-62)
DESCRIPTOR_SWIZZLE_FIELD = {0: 0, 128: 1, 64: 2, 32: 3}
#: swizzle bytes -> the ``swizzle`` argument of TVM's ``T.cuda.wgmma.encode_matrix_descriptor``
TVM_SWIZZLE_ARG = {0: 0, 32: 1, 64: 2, 128: 3}
_INSTR_K_BYTES = 32          # every wgmma reads 32 bytes of K per row (k16 f16, k8 tf32, k32 8-bit)


def _span_bytes(swizzle_bytes: int) -> int:
    return swizzle_bytes or 16


def _check_major(major, dtype):
    if major not in WGMMA_MAJORS:
        raise UnsupportedConfigError(f"major must be one of {choices(WGMMA_MAJORS)}, not {major!r}")
    if major == "MN" and _dt.bits(dtype) != 16:
        raise UnsupportedConfigError(
            f"wgmma reads {dtype} operands K-major only; MN-major operands exist for 16-bit types "
            f"(float16, bfloat16); valid majors for {dtype}: 'K'")


def make_wgmma_layout(mn: int, k: int, dtype, *, major: str = "K", swizzle_bytes: int = 128,
                      stages: tuple = ()) -> SwizzleLayout:
    """The shared ``SwizzleLayout`` of an ``mn x k`` wgmma operand tile (see the module doc for its shape).

    ``swizzle_bytes``: 0, 32, 64 or 128. The contiguous extent (k for K-major, mn for MN-major) must be a multiple
    of one swizzle span, the other a multiple of 8; K a multiple of the instruction K (32 bytes).
    """
    dt = _dt.canonical(dtype)
    _check_major(major, dt)
    if swizzle_bytes not in SWIZZLE_CHOICES:
        raise UnsupportedConfigError(f"swizzle_bytes={swizzle_bytes!r}; valid: {choices(SWIZZLE_CHOICES)}")
    bits = _dt.bits(dt)
    if bits not in (8, 16, 32):
        raise UnsupportedConfigError(f"{dt} is not a wgmma operand type; valid: "
                                     f"{choices(sorted({e.a_dtype for e in isa.WGMMA_TABLE}))}")
    span = _span_bytes(swizzle_bytes) * 8 // bits
    kstep = _INSTR_K_BYTES * 8 // bits
    if k <= 0 or k % kstep:
        raise TileShapeError(f"k={k} must be a positive multiple of the wgmma K for {dt} ({kstep})")
    contiguous, other = (k, mn) if major == "K" else (mn, k)
    cname, oname = ("k", "mn") if major == "K" else ("mn", "k")
    if contiguous % span:
        raise TileShapeError(
            f"{cname}={contiguous}: a {major}-major {dt} tile with {swizzle_bytes or 'no'}-byte swizzle is made of "
            f"atoms {span} elements wide ({_span_bytes(swizzle_bytes)} bytes); use a multiple of {span}"
            + ("" if major == "K" else " or a smaller swizzle_bytes"))
    if other <= 0 or other % 8:
        raise TileShapeError(f"{oname}={other} must be a positive multiple of 8 (8-row core matrices)")
    atoms = contiguous // span
    shape = (*tuple(int(s) for s in stages), *((atoms,) if atoms > 1 else ()), other, span)
    return make_mma_swizzle_layout(shape, dt, swizzle_bytes=swizzle_bytes)


@dataclass(frozen=True)
class WgmmaOperandLayout:
    """An ``mn x k`` wgmma operand tile in shared memory (``layout``, from :func:`make_wgmma_layout`) and the matrix
    descriptor fields that read it. ``stages``: the number of leading (stage) dims of ``layout``.

    ``lbo`` / ``sbo`` are bytes, derived from ``layout.byte_offset``; ``start_offset(mn0, k0, *stage)`` is the byte
    offset from the buffer start of the descriptor start address of the instruction slice at (mn0, k0). The buffer
    must start ``alignment`` bytes aligned (the swizzle repeat: base offset 0).
    """

    layout: SwizzleLayout
    major: str
    mn: int
    k: int
    stages: int = 0

    def __post_init__(self):
        _check_major(self.major, self.layout.dtype)
        want = make_wgmma_layout(self.mn, self.k, self.layout.dtype, major=self.major,
                                 swizzle_bytes=self.layout.swizzle_bytes, stages=self.layout.shape[:self.stages])
        if want.shape != self.layout.shape or self.layout.row_bits is not None:
            raise LayoutError(f"{self.layout!r} is not the {self.major}-major wgmma tile of {self.mn} x {self.k} "
                              f"{self.layout.dtype} (expected shape {want.shape} with the default XOR rows)")

    # -- geometry ---------------------------------------------------------------------------------------------------
    dtype = property(lambda self: self.layout.dtype)
    swizzle_bytes = property(lambda self: self.layout.swizzle_bytes)
    elem_bytes = property(lambda self: self.layout.elem_bits // 8)
    span = property(lambda self: self.layout.cols, doc="elements per atom row (one swizzle span)")
    atoms = property(lambda self: (self.k if self.major == "K" else self.mn) // self.span)
    instr_k = property(lambda self: _INSTR_K_BYTES // self.elem_bytes, doc="K of one wgmma for this dtype")
    alignment = property(lambda self: max(8 * self.swizzle_bytes, 128), doc="required buffer alignment (bytes)")
    stage_shape = property(lambda self: self.layout.shape[:self.stages])
    descriptor_swizzle = property(lambda self: DESCRIPTOR_SWIZZLE_FIELD[self.swizzle_bytes],
                                  doc="the descriptor's swizzle field (0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B)")
    tvm_swizzle = property(lambda self: TVM_SWIZZLE_ARG[self.swizzle_bytes],
                           doc="the swizzle argument of T.cuda.wgmma.encode_matrix_descriptor")

    def index(self, mn, k, *stage) -> tuple:
        """The layout index (logical) of operand element (mn, k) of stage ``stage`` (ints or PrimExprs)."""
        contiguous, other = (k, mn) if self.major == "K" else (mn, k)
        span = self.span
        if self.atoms > 1:
            return (*stage, contiguous // span, other, contiguous % span)
        return (*stage, other, contiguous)

    def byte_offset(self, mn, k, *stage):
        """Byte offset from the buffer start of operand element (mn, k) (the physical, swizzled location)."""
        return self.layout.byte_offset(*self.index(mn, k, *stage))

    def _zero_stage(self):
        return (0,) * self.stages

    @property
    def lbo(self) -> int:
        """Leading-dimension byte offset: K-major: the K atom stride without swizzle (16 with swizzle: unused);
        MN-major: the MN atom stride with swizzle, 8 K rows without."""
        z = self._zero_stage()
        if self.major == "K":
            if self.swizzle_bytes:
                return 16
            return int(self.byte_offset(0, self.span, *z)) if self.atoms > 1 else 16
        if self.swizzle_bytes:
            return int(self.byte_offset(self.span, 0, *z)) if self.atoms > 1 else 16
        return int(self.byte_offset(0, 8, *z)) if self.k > 8 else 16

    @property
    def sbo(self) -> int:
        """Stride-dimension byte offset: K-major: 8 M / N rows; MN-major: 8 K rows with swizzle, the MN atom stride
        without."""
        z = self._zero_stage()
        if self.major == "K":
            return int(self.byte_offset(8, 0, *z)) if self.mn > 8 else 16
        if self.swizzle_bytes:
            return int(self.byte_offset(0, 8, *z)) if self.k > 8 else 16
        return int(self.byte_offset(self.span, 0, *z)) if self.atoms > 1 else 16

    def start_offset(self, mn0, k0, *stage):
        """Byte offset of the descriptor start address of the instruction slice whose first element is (mn0, k0):
        the element's unswizzled (logical) position; the hardware swizzles the addresses it derives from it. A slice
        starts on an 8-row boundary (mn0 % 8 == 0 K-major, k0 % 8 == 0 MN-major), where logical and physical agree.
        Works on ints and PrimExprs (no XOR: the offset stays a linear expression)."""
        row = mn0 if self.major == "K" else k0
        if _is_int(row) and row % 8:
            raise TileShapeError(f"a wgmma slice starts on an 8-row boundary; {'mn0' if self.major == 'K' else 'k0'}"
                                 f"={row}")
        flat = 0
        for i, extent in zip(self.index(mn0, k0, *stage), self.layout.shape):
            flat = flat * extent + i
        return flat * self.layout.elem_bits // 8

    def descriptor(self, mn0=0, k0=0, *stage, base=0):
        """The decoded descriptor (``mmaemit.ptx.wgmma.MatrixDescriptor``) of the instruction slice at (mn0, k0) for a
        buffer at shared address ``base``."""
        # imported here: mmaemit.ptx reads the mma fragment maps of this package at import time
        from ..ptx.wgmma import MatrixDescriptor

        return MatrixDescriptor(start=base + int(self.start_offset(mn0, k0, *stage)), lbo=self.lbo, sbo=self.sbo,
                                base_offset=0, layout_type=self.descriptor_swizzle)

    # -- proof ------------------------------------------------------------------------------------------------------
    def slices(self, instr_mn: int):
        """(mn0, k0) of every instruction slice of ``instr_mn`` rows and ``instr_k`` K the tile holds."""
        if instr_mn <= 0 or instr_mn % 8 or self.mn % instr_mn:
            raise TileShapeError(f"instruction extent {instr_mn} must be a positive multiple of 8 dividing mn="
                                 f"{self.mn}")
        return [(m0, k0) for m0 in range(0, self.mn, instr_mn) for k0 in range(0, self.k, self.instr_k)]

    def check(self, instr_mn: int = None) -> None:
        """Prove by enumeration that, for every stage and every instruction slice (``instr_mn`` rows: 64 for A, the
        instruction N for B; default: the whole ``mn``), the descriptor's address function (``mmaemit.ptx.wgmma``)
        reads each element where the layout stores it. Raises ``LayoutError`` naming the first disagreement."""
        from ..ptx.wgmma import kmajor_chunk_addresses, mnmajor_chunk_addresses

        instr_mn = self.mn if instr_mn is None else instr_mn
        eb = self.elem_bytes
        per = 16 // eb                                           # elements per 16-byte chunk
        base = 8 * 1024                                          # any alignment-multiple base
        for stage in np.ndindex(*self.stage_shape) if self.stages else [()]:
            for m0, k0 in self.slices(instr_mn):
                d = self.descriptor(m0, k0, *stage, base=base)
                if self.major == "K":
                    got = kmajor_chunk_addresses(d, instr_mn, _INSTR_K_BYTES // 16)       # (rows, chunks)
                    r, j = np.meshgrid(np.arange(instr_mn), np.arange(_INSTR_K_BYTES // 16), indexing="ij")
                    want = base + self.byte_offset(m0 + r, k0 + per * j, *stage)
                else:
                    got = mnmajor_chunk_addresses(d, self.instr_k, instr_mn // per)         # (k rows, chunks)
                    r, j = np.meshgrid(np.arange(self.instr_k), np.arange(instr_mn // per), indexing="ij")
                    want = base + self.byte_offset(m0 + per * j, k0 + r, *stage)
                bad = np.argwhere(np.asarray(got) != np.asarray(want))
                if len(bad):
                    a, b = (int(x) for x in bad[0])
                    what = (f"row {m0 + a}, k {k0 + per * b}" if self.major == "K"
                            else f"mn {m0 + per * b}, k {k0 + a}")
                    raise LayoutError(
                        f"{self.describe()}: stage {stage} slice (mn0={m0}, k0={k0}): the descriptor (LBO {d.lbo}, "
                        f"SBO {d.sbo}, {self.swizzle_bytes or 'no'}-byte swizzle) reads {what} at byte "
                        f"{int(got[a, b]) - base}, the layout stores it at {int(want[a, b]) - base}")

    def describe(self) -> str:
        return (f"{self.major}-major {self.mn}x{self.k} {self.dtype} wgmma tile, {self.swizzle_bytes or 'no'}-byte "
                f"swizzle, layout shape {self.layout.shape}")


def wgmma_operand_layout(mn: int, k: int, dtype, *, major: str = "K", swizzle_bytes: int = 128,
                         stages: tuple = ()) -> WgmmaOperandLayout:
    """:func:`make_wgmma_layout` wrapped with its descriptor fields (``.layout`` is the ``SwizzleLayout``)."""
    lay = make_wgmma_layout(mn, k, dtype, major=major, swizzle_bytes=swizzle_bytes, stages=stages)
    return WgmmaOperandLayout(lay, major, mn, k, len(tuple(stages)))


# ---------------------------------------------------------------------------------------------------------------------
# register fragments of the warpgroup
# ---------------------------------------------------------------------------------------------------------------------

def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer))


class WarpgroupFragmentLayout:
    """(thread, reg, elem) <-> (row, col) of a warpgroup register fragment: thread ``t`` (0..127) of warp
    ``t // 32`` holds rows ``16 (t // 32) + r`` where ``(r, c)`` is the warp fragment ``warp`` (an mma.sync
    ``FragmentLayout``) of lane ``t % 32``; register ``reg`` is register ``reg % warp.regs`` of column block
    ``reg // warp.regs`` (``blocks`` blocks of ``warp.cols`` columns)."""

    def __init__(self, name: str, warp, blocks: int):
        self.name = name
        self.warp = warp
        self.blocks = blocks
        self.rows = 4 * warp.rows
        self.cols = blocks * warp.cols
        self.regs = blocks * warp.regs
        self.elems_per_reg = warp.elems_per_reg
        self.elem_bits = warp.elem_bits

    def __repr__(self) -> str:
        return (f"WarpgroupFragmentLayout({self.name}: {self.rows}x{self.cols}, {self.regs} regs x "
                f"{self.elems_per_reg} elems per thread)")

    def forward(self, thread, reg, elem=0) -> tuple:
        """(row, col) of the element ``thread`` holds in register ``reg``, sub-element ``elem`` (0 = low bits)."""
        if _is_int(thread) and _is_int(reg) and _is_int(elem) and not (
                0 <= thread < 128 and 0 <= reg < self.regs and 0 <= elem < self.elems_per_reg):
            raise LayoutError(f"{self.name}: slot (thread={thread}, reg={reg}, elem={elem}) out of range; valid: "
                              f"thread 0..127, reg 0..{self.regs - 1}, elem 0..{self.elems_per_reg - 1}")
        w = self.warp
        r, c = w.forward(thread % 32, reg % w.regs, elem)
        return self.warp.rows * (thread // 32) + r, w.cols * (reg // w.regs) + c

    def inverse(self, row, col) -> tuple:
        """(thread, reg, elem) holding element (row, col)."""
        if _is_int(row) and _is_int(col) and not (0 <= row < self.rows and 0 <= col < self.cols):
            raise LayoutError(f"{self.name}: ({row}, {col}) is outside the {self.rows}x{self.cols} tile")
        w = self.warp
        lane, r, e = w.inverse(row % w.rows, col % w.cols)
        return 32 * (row // w.rows) + lane, w.regs * (col // w.cols) + r, e

    def slots(self):
        for t in range(128):
            for reg in range(self.regs):
                for e in range(self.elems_per_reg):
                    yield t, reg, e

    def check(self) -> None:
        """Enumerate all slots: forward is a bijection onto rows x cols and inverse undoes it."""
        seen = set()
        for slot in self.slots():
            rc = self.forward(*slot)
            if not (0 <= rc[0] < self.rows and 0 <= rc[1] < self.cols) or rc in seen:
                raise LayoutError(f"{self.name}: slot {slot} maps to {rc} (outside or taken twice)")
            seen.add(rc)
            if tuple(self.inverse(*rc)) != slot:
                raise LayoutError(f"{self.name}: inverse(forward{slot}) = {self.inverse(*rc)}")
        if len(seen) != self.rows * self.cols:
            raise LayoutError(f"{self.name}: covers {len(seen)} of {self.rows * self.cols} elements")

    def table(self) -> np.ndarray:
        """int array (128, regs, elems_per_reg, 2): the (row, col) of every slot."""
        out = np.empty((128, self.regs, self.elems_per_reg, 2), np.int64)
        for t, reg, e in self.slots():
            out[t, reg, e] = self.forward(t, reg, e)
        return out


def _mma_twin(instr: isa.WgmmaInstr):
    """The mma.sync m16n8kK entry whose warp fragments the wgmma's 16-row warp slices share."""
    return isa.select_mma(instr.a_dtype, instr.b_dtype, instr.accum_dtype, k=instr.k)


@functools.lru_cache(maxsize=None)
def wgmma_accumulator_layout(instr: isa.WgmmaInstr, n: int) -> WarpgroupFragmentLayout:
    """The accumulator map of ``instr`` at N = ``n``: 64 x n, ``instr.accum_regs(n)`` registers per thread."""
    instr.check_n(n)
    c = mma_fragment(_mma_twin(instr), "C")
    return WarpgroupFragmentLayout(f"{instr.ptx(n)}.D", c, n // 8)


@functools.lru_cache(maxsize=None)
def wgmma_a_layout(instr: isa.WgmmaInstr) -> WarpgroupFragmentLayout:
    """The RS-form A register map of ``instr``: 64 x K, 4 registers per thread (K-major only)."""
    if not instr.rs:
        raise UnsupportedConfigError(f"{instr.describe()} has no register-sourced A")
    a = mma_fragment(_mma_twin(instr), "A")
    return WarpgroupFragmentLayout(f"{instr.describe()}.A", a, 1)
