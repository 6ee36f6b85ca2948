"""Fast loads of 8-bit and 4-bit mma operands stored M/N-contiguous: ``ldmatrix.trans`` + in-register shuffles.

ldmatrix only transposes 16-bit elements, so an A tile stored [K, M] (or B stored [K, N]) of 8/4-bit elements cannot
come out of ldmatrix in mma fragment order by itself. This plan loads it with ``ldmatrix.x{2,4}.trans`` and fixes
the element order inside each lane with ``prmt.b32`` (8-bit) or ``prmt.b32`` + ``shl``/``shr`` + ``lop3.b32`` (4-bit).
No shared-memory access is narrower than ldmatrix's 16-byte rows and no data crosses lanes after the load.

Why it works (``g = lane / 4``, ``c = lane % 4``, element width ``b`` bits, ``V = 16 / b`` M/N values per b16):
``.trans`` hands lane (g, c) the b16 column ``g`` (M/N values ``V g .. V g + V-1``) of rows ``2c`` and ``2c+1`` of
each 8x8 matrix. The rows are chosen (any 16-byte row may feed any matrix row) so that the ``E / 2`` registers of a
lane hold exactly the K values ``E c .. E c + E-1`` that the mma fragment puts in lane c (``E = 32 / b``):

* 8-bit: matrix q, row r reads k = ``16 (q // 2) + 4 (r // 2) + 2 (q % 2) + r % 2``. Registers ``R0 = (k 4c, 4c+1)
  x (mn 2g, 2g+1)`` and ``R1 = (k 4c+2, 4c+3) x (mn 2g, 2g+1)``; ``prmt(R0, R1, 0x6420)`` collects the four k of
  mn ``2g``, ``prmt(R0, R1, 0x7531)`` those of mn ``2g+1``. 1 ldmatrix + 4 prmt per m16n8k32 A tile.
* 4-bit: step t, matrix q, row r reads k = ``32 t + 8 (r // 2) + 4 (q % 2) + 2 (r % 2) + q // 2``. The two prmt of
  ``(R0, R1)`` / ``(R2, R3)`` give ``X_p`` / ``Y_p``: byte j = k ``8c + 2j`` / ``8c + 2j + 1`` of the mn pair
  ``4g + 2p, +1``; a nibble exchange ``X' = (X & 0x0F0F0F0F) | (Y << 4 & 0xF0F0F0F0)``,
  ``Y' = (X >> 4 & 0x0F0F0F0F) | (Y & 0xF0F0F0F0)`` (``lop3`` LUT 0xE4) turns them into the eight k nibbles of mn
  ``4g + 2p`` and ``4g + 2p + 1``. A 16-byte row holds 32 values, so one load covers 32 M (two A micro tiles) or
  32 N (four n8 tiles): 2 ldmatrix.x4 + 8 prmt + 4 shl + 4 shr + 8 lop3 for two m16n8k64 A tiles.

The price is a fixed permutation of the M (A) or N (B) positions inside a load group: fragment row ``x`` of A
micro tile ``u`` holds m = ``perm[16 u + x]``, fragment column ``col`` of B n8 tile ``s`` holds n = ``perm[8 s +
col]``. A row permutation of A permutes the rows of C the same way (and one of B the columns of C), so the mma result
is exact; whoever writes the accumulators must place them with the permutation (``TensorCoreIntrinEmitter`` does).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .. import dtypes as _dt
from ..errors import UnsupportedConfigError, choices
from ..isa import MmaInstr
from .banks import phase_wavefronts
from .swizzle import CHUNK_BYTES, auto_swizzle_bytes, make_mma_swizzle_layout

NIBBLE_MASK = 0x0F0F0F0F
LUT_SELECT = 0xE4  # lop3: (a & c) | (b & ~c)  (F(0xF0, 0xCC, 0xAA) = 0xE4)
PRMT_EVEN_BYTES = 0x6420  # d = {b.2, b.0, a.2, a.0}: bytes 0 and 2 of a then of b
PRMT_ODD_BYTES = 0x7531   # d = {b.3, b.1, a.3, a.1}


@dataclass(frozen=True)
class LdmatrixStep:
    """One ``ldmatrix.sync.aligned.m8n8.x{num}.trans.shared.b16`` into virtual registers ``dst`` (one per matrix)."""

    index: int
    num: int
    dst: tuple


@dataclass(frozen=True)
class RegOp:
    """One 32-bit register instruction of the shuffle program.

    ``op``: ``"prmt"`` (``imm = (selector,)``, PTX ``prmt.b32 d, a, b, selector``), ``"shl"`` / ``"shr"``
    (``imm = (amount,)``, ``shl.b32`` / ``shr.b32``), ``"lop3"`` (``imm = (c, lut)``: ``lop3.b32 d, a, b, c, lut``
    with the constant ``c``). ``srcs`` and ``dst`` name virtual registers.
    """

    op: str
    dst: str
    srcs: tuple
    imm: tuple

    def ptx(self) -> str:
        return {"prmt": "prmt.b32", "shl": "shl.b32", "shr": "shr.b32", "lop3": "lop3.b32"}[self.op]


@dataclass(frozen=True)
class TransposedLoadPlan:
    """ldmatrix.trans + register shuffles loading one *load group* of an M/N-contiguous 8/4-bit operand.

    A load group is ``extent`` consecutive M (A) or N (B) positions (16 for 8-bit, 32 for 4-bit: one 16-byte row)
    times the mma's K, stored ``[K, extent]`` (row = k). It fills ``units`` fragments: A micro tiles of 16 rows
    (``units = extent // 16``) or B n8 tiles (``units = extent // 8``). ``loads`` run first (lane addresses from
    ``lane_address``), then ``ops``; ``outputs[i] = (register, unit, reg)`` says which fragment register of which
    unit a virtual register ends up as. ``perm[f]`` is the storage M/N offset (inside the group) of fragment position
    ``f`` (A: ``16 unit + row``; B: ``8 unit + col``).
    """

    operand: str
    elem_bits: int
    k: int
    extent: int
    units: int
    loads: tuple
    ops: tuple
    outputs: tuple
    perm: tuple

    k_contiguous = False
    trans = True

    @property
    def stride(self) -> int:
        """M/N distance between neighbouring lanes' fragment rows (A) / columns (B): ``extent // 8``."""
        return self.extent // 8

    def mn_offset(self, unit, lo, hi=0):
        """Storage M/N offset of fragment row/col ``lo + 8 hi`` of ``unit``; ``lo`` (0..7) may be a PrimExpr.

        A: ``stride * lo + 2 unit + hi`` (fragment rows g and g + 8 of a lane hold adjacent m). B: ``stride * lo +
        unit`` (``hi`` must be 0: an n8 tile has 8 columns).
        """
        if self.operand == "A":
            return self.stride * lo + 2 * unit + hi
        return self.stride * lo + unit

    def k_row(self, step, q, r):
        """The k (storage row inside the group) that row ``r`` of matrix ``q`` of load ``step`` reads."""
        if self.elem_bits == 8:
            return 16 * (q // 2) + 4 * (r // 2) + 2 * (q % 2) + r % 2
        return 32 * step + 8 * (r // 2) + 4 * (q % 2) + 2 * (r % 2) + q // 2

    def lane_address(self, step, lane):
        """(k, mn) storage offset of the 16-byte row whose address ``lane`` supplies in load ``step``.

        Works on PrimExprs; lanes beyond ``8 num`` (ignored by the hardware) get an in-bounds repeat.
        """
        num = self.loads[step].num
        q = (lane // 8) % num
        return self.k_row(step, q, lane % 8), 0

    def phase_rows(self) -> tuple:
        """The k offsets of the 8 rows of every matrix of every load (one ldmatrix phase each)."""
        return tuple(tuple(self.k_row(ld.index, q, r) for r in range(8)) for ld in self.loads for q in range(ld.num))

    def ldmatrix_conflicts(self, layout) -> int:
        """Extra shared-memory wavefronts of this plan's ldmatrix phases on a tile stored with ``layout`` (a 2-D
        ``SwizzleLayout`` whose rows are k), summed over every load group position (each 16-byte chunk of a row)
        and every K step inside one 64-row window, with the ``banks`` model."""
        rows, chunks = layout.rows, layout.row_bytes // CHUNK_BYTES
        extra = 0
        for k0 in range(0, min(rows, 64) - self.k + 1, self.k):
            for chunk in range(chunks):
                col = chunk * layout.elems_per_chunk
                for phase in self.phase_rows():
                    addrs = [layout.byte_offset(k0 + k, col) for k in phase]
                    extra += phase_wavefronts(addrs, CHUNK_BYTES) - 1
        return extra

    def swizzle_row_bits(self, row_bytes: int):
        """``row_bits`` for ``make_mma_swizzle_layout`` that make this plan's loads from a tile with ``row_bytes``-byte
        rows conflict-free, or the least conflicted choice where none is (None: the default scheme is as good).

        A phase reads rows whose k differ in three bits (8-bit: bits 0, 2, 3; 4-bit: bits 1, 3, 4), not 8
        consecutive rows, so the default ``row & 7`` XOR maps two (8-bit) or four (4-bit) of them to one bank group.
        Found by enumerating bit choices with the bank model. Rows of 64 bytes leave a 4-bit plan 2-way conflicted
        whatever the XOR (its 8 rows have one parity, i.e. one half of the 128-byte bank window); 128-byte rows
        (a 256-wide 4-bit or 128-wide 8-bit tile) are conflict-free.
        """
        width = auto_swizzle_bytes(row_bytes) // CHUNK_BYTES
        if width <= 1:
            return None
        b = width.bit_length() - 1
        rows = 64
        cols = row_bytes * 8 // self.elem_bits
        dtype = "uint8" if self.elem_bits == 8 else "int4"

        def cost(bits_):
            return self.ldmatrix_conflicts(make_mma_swizzle_layout((rows, cols), dtype, row_bits=bits_))

        best, best_cost = None, cost(None)
        for cand in itertools.combinations(range(6), b):
            c = cost(cand)
            if c < best_cost:
                best, best_cost = cand, c
        return best

    @property
    def temps(self) -> tuple:
        """Virtual registers other than the outputs (ldmatrix destinations and intermediates), in first-use order."""
        outs = {o[0] for o in self.outputs}
        names = []
        for ld in self.loads:
            names += [d for d in ld.dst if d not in outs]
        for op in self.ops:
            if op.dst not in outs and op.dst not in names:
                names.append(op.dst)
        return tuple(names)

    def instruction_counts(self) -> dict:
        """PTX instructions per load group: ``{"ldmatrix": n, "prmt": n, ...}``."""
        counts = {"ldmatrix": len(self.loads)}
        for op in self.ops:
            counts[op.op] = counts.get(op.op, 0) + 1
        return counts

    def describe(self) -> str:
        c = self.instruction_counts()
        body = ", ".join(f"{v} {k}" for k, v in c.items())
        what, mn = ("A micro tile", "m") if self.operand == "A" else ("B n8 tile", "n")
        return (f"{self.operand} [{self.k} k x {self.extent} {mn}] {self.elem_bits}-bit = {self.units} {what}"
                f"{'s' if self.units > 1 else ''}: {body}")


def _plan_8bit(operand, k):
    chunks = k // 16
    num = 2 * chunks
    regs = tuple(f"r{q}" for q in range(num))
    ops, outputs = [], []
    for h in range(chunks):
        a, b = regs[2 * h], regs[2 * h + 1]
        for v, sel in ((0, PRMT_EVEN_BYTES), (1, PRMT_ODD_BYTES)):
            name = f"o{h}{v}"
            ops.append(RegOp("prmt", name, (a, b), (sel,)))
            # A: mn 2g + v is fragment row g + 8v -> reg 2h + v; B: it is n8 tile v, reg h
            outputs.append((name, 0, 2 * h + v) if operand == "A" else (name, v, h))
    return (LdmatrixStep(0, num, regs),), tuple(ops), tuple(outputs)


def _plan_4bit(operand, k):
    steps = k // 32
    loads, ops, outputs = [], [], []
    for t in range(steps):
        r = tuple(f"r{4 * t + q}" for q in range(4))
        loads.append(LdmatrixStep(t, 4, r))
        for p, sel in ((0, PRMT_EVEN_BYTES), (1, PRMT_ODD_BYTES)):
            x, y = f"x{t}{p}", f"y{t}{p}"
            ops.append(RegOp("prmt", x, (r[0], r[1]), (sel,)))   # even k of mn pair (4g + 2p, +1)
            ops.append(RegOp("prmt", y, (r[2], r[3]), (sel,)))   # odd k
        for p in range(2):
            x, y = f"x{t}{p}", f"y{t}{p}"
            ys, xs = f"ys{t}{p}", f"xs{t}{p}"
            lo, hi = f"o{t}{p}0", f"o{t}{p}1"
            ops.append(RegOp("shl", ys, (y,), (4,)))
            ops.append(RegOp("shr", xs, (x,), (4,)))
            ops.append(RegOp("lop3", lo, (x, ys), (NIBBLE_MASK, LUT_SELECT)))   # mn 4g + 2p
            ops.append(RegOp("lop3", hi, (xs, y), (NIBBLE_MASK, LUT_SELECT)))   # mn 4g + 2p + 1
            for v, name in ((0, lo), (1, hi)):
                # A: unit p, fragment row g + 8v -> reg 2t + v; B: n8 tile 2p + v, reg t
                outputs.append((name, p, 2 * t + v) if operand == "A" else (name, 2 * p + v, t))
    return tuple(loads), tuple(ops), tuple(outputs)


def transposed_load_plan(instr: MmaInstr, operand: str) -> TransposedLoadPlan:
    """The plan for operand ``"A"`` stored [K, M] or ``"B"`` stored [K, N] of an 8-bit or 4-bit ``MMA_TABLE`` entry."""
    if operand not in ("A", "B"):
        raise UnsupportedConfigError(f"operand must be one of {choices(['A', 'B'])}, not {operand!r}")
    bits = _dt.bits(instr.a_dtype if operand == "A" else instr.b_dtype)
    if bits not in (8, 4):
        raise UnsupportedConfigError(f"transposed loads are for 8-bit and 4-bit operands, not {bits}-bit "
                                     f"(16-bit operands use ldmatrix .trans directly); valid widths: [4, 8]")
    extent = 128 // bits
    loads, ops, outputs = (_plan_8bit if bits == 8 else _plan_4bit)(operand, instr.k)
    units = extent // 16 if operand == "A" else extent // 8
    plan = TransposedLoadPlan(operand, bits, instr.k, extent, units, loads, ops, outputs, perm=())
    per = 16 if operand == "A" else 8
    perm = tuple(plan.mn_offset(f // per, f % 8, (f % per) // 8) for f in range(extent))
    return TransposedLoadPlan(operand, bits, instr.k, extent, units, loads, ops, outputs, perm)
