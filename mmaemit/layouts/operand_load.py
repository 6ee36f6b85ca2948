"""How one mma operand micro-tile is loaded from shared memory with a single ldmatrix, as a layout.

An ``OperandLoadPlan`` says which ``ldmatrix.x{num}[.trans]`` loads the A (16 x K) or B (K x n_tile) micro tile of an
``MmaInstr`` and which element of the *stored* tile each lane addresses. Storage coordinates are (row, col) of the
shared tile as it is laid out in memory:

* A, K-contiguous ("not transposed"): stored [M, K]; A transposed: stored [K, M].
* B, N-contiguous ("not transposed"): stored [K, N]; B transposed: stored [N, K] (K-contiguous).

ldmatrix moves 8x8 matrices of b16, i.e. 8 rows of 16 bytes. For a K-contiguous operand of any width the rows of
those matrices are 16-byte pieces of operand rows, so the same plan serves 32/16/8/4-bit elements (measured in bytes);
the destination registers come out in exactly the mma fragment's register order (proved in tests by composing
``matrix_move_layout`` with ``mma_fragment``). An M/N-contiguous operand needs ``.trans``, which only transposes
16-bit elements: one ldmatrix.trans for 16-bit operands; 8-bit and 4-bit operands get a ``TransposedLoadPlan``
(``transposed_load.py``: ldmatrix.trans + in-register byte/nibble shuffles, with an M/N permutation); 32-bit (tf32)
operands must be K-contiguous.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes as _dt
from ..errors import UnsupportedConfigError, choices
from ..isa import MmaInstr
from .transposed_load import TransposedLoadPlan, transposed_load_plan  # noqa: F401


@dataclass(frozen=True)
class OperandLoadPlan:
    """One ldmatrix for an operand micro tile.

    ``num``/``trans``: the ldmatrix variant. ``k_contiguous``: the storage major. ``elem_bits``: operand width.
    ``rows``/``cols``: the stored micro tile's shape in elements. Matrix ``j`` (register ``j`` of every lane) covers
    the stored 8-row x 16-byte block ``matrix_origin(j)``.
    """

    operand: str
    num: int
    trans: bool
    k_contiguous: bool
    elem_bits: int
    rows: int
    cols: int
    regs_per_n8: int  # B only: registers per n8 tile (the n16 tile = two n8 tiles back to back)

    @property
    def elems_per_16b(self) -> int:
        return 128 // self.elem_bits

    def matrix_origin(self, j):
        """(row, col) in storage elements of the top-left of 8x8-b16 matrix ``j``."""
        e = self.elems_per_16b
        if self.operand == "A":
            # fragment order a0..a3: (m 0-7, k lo), (m 8-15, k lo), (m 0-7, k hi), (m 8-15, k hi)
            m_blk, k_blk = j % 2, j // 2
            return (8 * m_blk, e * k_blk) if self.k_contiguous else (8 * k_blk, 8 * m_blk)
        # B: per n8 tile, regs_per_n8 registers walk along K; n8 tiles follow each other
        n_blk, k_blk = j // self.regs_per_n8, j % self.regs_per_n8
        return (8 * n_blk, e * k_blk) if self.k_contiguous else (8 * k_blk, 8 * n_blk)

    def lane_address(self, lane):
        """(row, col) in storage elements of the 16-byte row whose address ``lane`` supplies (works on PrimExprs)."""
        j = (lane // 8) % self.num
        r0, c0 = self.matrix_origin_expr(j)
        return r0 + lane % 8, c0

    def matrix_origin_expr(self, j):
        # same as matrix_origin, written with // and % only so that j may be a PrimExpr
        e = self.elems_per_16b
        if self.operand == "A":
            m_blk, k_blk = j % 2, j // 2
        else:
            m_blk, k_blk = j // self.regs_per_n8, j % self.regs_per_n8
        return (8 * m_blk, e * k_blk) if self.k_contiguous else (8 * k_blk, 8 * m_blk)


def operand_load_plan(instr: MmaInstr, operand: str, k_contiguous: bool, n_tile: int = 8):
    """The ldmatrix plan for operand ``"A"`` (16 x K micro tile) or ``"B"`` (K x ``n_tile``, n_tile 8 or 16).

    8-bit and 4-bit operands stored M/N-contiguous get a ``TransposedLoadPlan`` (ldmatrix.trans + register
    shuffles over a 16- or 32-wide load group, with an M/N permutation; ``n_tile`` does not change it); every other
    case an ``OperandLoadPlan`` (one ldmatrix, fragment order, no permutation).
    """
    bits = _dt.bits(instr.a_dtype if operand == "A" else instr.b_dtype)
    if operand not in ("A", "B"):
        raise UnsupportedConfigError(f"operand must be one of {choices(['A', 'B'])}, not {operand!r}")
    if n_tile not in (8, 16):
        raise UnsupportedConfigError(f"n_tile must be one of {choices([8, 16])}, not {n_tile!r}")
    if not k_contiguous and bits in (8, 4):
        return transposed_load_plan(instr, operand)
    if not k_contiguous and bits != 16:
        raise UnsupportedConfigError(
            f"operand {operand} of {instr.describe()} stored M/N-contiguous needs a transposing load, which exists "
            f"for 16-, 8- and 4-bit elements only; store it K-contiguous (a_transposed=False for A, "
            f"b_transposed=True for B). Valid majors for {bits}-bit operands: ['K-contiguous']")
    if operand == "A":
        num = instr.a_regs
        shape = (instr.m, instr.k) if k_contiguous else (instr.k, instr.m)
        return OperandLoadPlan("A", num, not k_contiguous, k_contiguous, bits, *shape, regs_per_n8=0)
    per = instr.b_regs
    num = per * (n_tile // 8)
    if num not in (1, 2, 4):
        raise UnsupportedConfigError(f"B micro tile {instr.k}x{n_tile} needs ldmatrix.x{num}, which does not exist; "
                                     f"valid n_tile for {instr.describe()}: "
                                     f"{choices(n for n in (8, 16) if instr.b_regs * n // 8 in (1, 2, 4))}")
    shape = (n_tile, instr.k) if k_contiguous else (instr.k, n_tile)
    # B stored [K, N] (N-contiguous) is the transposed case for ldmatrix
    return OperandLoadPlan("B", num, not k_contiguous, k_contiguous, bits, *shape, regs_per_n8=per)


@dataclass(frozen=True)
class AccumulatorStorePlan:
    """stmatrix of one 16 x n_tile accumulator micro tile (n_tile 8: x2, 16: x4) as 16-bit values.

    Matrix ``q`` covers m ``8 * (q % 2)``.. and n ``8 * (q // 2)``.. of the micro tile; register ``q`` holds the
    accumulator pair of n8 half ``q // 2`` and row half ``q % 2`` (rows g or g + 8 of the mma C fragment). Not
    transposed, each matrix row is an m row; transposed (``.trans``, C^T stored [N, M]) each row is an n row.
    """

    num: int
    transpose: bool = False

    def lane_address(self, lane, first: int = 0, per_instr: int | None = None):
        """(m, n) of the first element of the stored row whose address ``lane`` supplies.

        With ``per_instr`` < ``num`` the micro tile is stored by several narrower stmatrix (x1/x2): the instruction
        covering matrices ``first .. first + per_instr - 1`` takes the addresses of lanes ``0 .. 8*per_instr-1``.
        """
        per = self.num if per_instr is None else per_instr
        j = first + (lane // 8) % per
        if self.transpose:
            return 8 * (j % 2), 8 * (j // 2) + lane % 8
        return 8 * (j % 2) + lane % 8, 8 * (j // 2)


def accumulator_store_plan(n_tile: int, transpose: bool = False) -> AccumulatorStorePlan:
    if n_tile not in (8, 16):
        raise UnsupportedConfigError(f"n_tile must be one of {choices([8, 16])}, not {n_tile!r}")
    return AccumulatorStorePlan(2 * (n_tile // 8), bool(transpose))
