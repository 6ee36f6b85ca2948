"""TensorCoreIntrinEmitter: validation errors, derived sizes, and the ldmatrix plans proven against the PTX maps."""
import itertools

import pytest

from mmaemit import TensorCoreIntrinEmitter, isa
from mmaemit.dtypes import bits
from mmaemit.errors import ArchError, TileShapeError, UnsupportedConfigError
from mmaemit.layouts import matrix_move_layout, mma_fragment
from mmaemit.layouts.operand_load import accumulator_store_plan, operand_load_plan


def test_derived_sizes():
    em = TensorCoreIntrinEmitter("float16", "float16", "float32", block_row_warps=2, block_col_warps=4,
                                 warp_row_tiles=32, warp_col_tiles=64, chunk=64)
    assert (em.micro_m, em.micro_n, em.micro_k) == (16, 16, 16)
    assert (em.warp_rows, em.warp_cols, em.k_steps) == (2, 4, 4)
    assert (em.local_size_a, em.local_size_b, em.local_size_c) == (4, 4, 8)
    assert (em.block_m, em.block_n, em.block_k, em.threads) == (64, 256, 64, 256)
    assert em.a_shared_shape == (64, 64) and em.b_shared_shape == (64, 256)
    em8 = TensorCoreIntrinEmitter("float16", "float16", "float16", warp_col_tiles=24, b_transposed=True)
    assert em8.n_tile == 8 and em8.local_size_c == 2 and em8.c_fragment_dtype == "uint32"
    assert em8.b_shared_shape == (48, 32)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(accum_dtype="float16", a_dtype="bfloat16", b_dtype="bfloat16"), UnsupportedConfigError,
     "bfloat16 x bfloat16 -> float32"),
    (dict(a_dtype="float16", b_dtype="bfloat16"), UnsupportedConfigError, "valid combinations"),
    (dict(warp_row_tiles=24), TileShapeError, "multiple of 16"),
    (dict(warp_col_tiles=40, n_tile=16), TileShapeError, "n_tile=16"),
    (dict(n_tile=32), UnsupportedConfigError, "8, 16"),
    (dict(chunk=24), TileShapeError, "multiple of reduce_k"),
    (dict(block_row_warps=8, block_col_warps=8, reduce_k=1), TileShapeError, "1024"),
    (dict(block_row_warps=0), TileShapeError, "positive"),
    (dict(warp_order="x_first"), UnsupportedConfigError, "m_fast"),
    (dict(satfinite=True), UnsupportedConfigError, "integer"),
    (dict(a_dtype="float32", b_dtype="float32", accum_dtype="float32", a_transposed=True), UnsupportedConfigError,
     "K-contiguous"),
    (dict(a_dtype="int4", b_dtype="int4", accum_dtype="int32", chunk=64, a_transposed=True, warp_row_tiles=48),
     TileShapeError, "multiple of 32"),
    (dict(a_dtype="int8", b_dtype="int8", accum_dtype="int32", b_transposed=False, warp_col_tiles=24, n_tile=8),
     TileShapeError, "multiple of 16"),
    (dict(a_dtype="e4m3", b_dtype="e4m3", arch="sm_80"), ArchError, "sm_89"),
    (dict(k=32), UnsupportedConfigError, "valid k"),
])
def test_invalid_arguments_raise_with_choices(kwargs, err, match):
    base = dict(a_dtype="float16", b_dtype="float16", accum_dtype="float32", chunk=32)
    base.update(kwargs)
    with pytest.raises(err, match=match):
        TensorCoreIntrinEmitter(**base)


def test_warp_coords_orders():
    em = TensorCoreIntrinEmitter(block_row_warps=2, block_col_warps=4, warp_row_tiles=16, warp_col_tiles=16,
                                 chunk=32, reduce_k=2)
    m_fast = [em.warp_coords(w) for w in range(em.num_warps)]
    assert m_fast[:3] == [(0, 0, 0), (1, 0, 0), (0, 1, 0)] and m_fast[8] == (0, 0, 1)
    assert sorted(m_fast) == sorted(itertools.product(range(2), range(4), range(2)))
    em_n = TensorCoreIntrinEmitter(block_row_warps=2, block_col_warps=4, warp_row_tiles=16, warp_col_tiles=16,
                                   chunk=32, warp_order="n_fast")
    assert [em_n.warp_coords(w) for w in range(3)] == [(0, 0, 0), (0, 1, 0), (0, 2, 0)]


def _storage_coord(operand, k_contiguous, logical):
    r, c = logical
    if operand == "A":
        return (r, c) if k_contiguous else (c, r)          # A logical (m, k)
    return (c, r) if k_contiguous else (r, c)              # B logical (k, n); K-contiguous B is stored [N, K]


def _plans():
    for ins in isa.MMA_TABLE:
        b = bits(ins.a_dtype)
        majors = (True, False) if b == 16 else (True,)
        for operand, kc in itertools.product("AB", majors):
            n_tiles = (8,) if operand == "A" else tuple(n for n in (8, 16) if ins.b_regs * n // 8 in (1, 2, 4))
            for n_tile in n_tiles:
                yield ins, operand, kc, n_tile


@pytest.mark.parametrize("ins, operand, kc, n_tile", list(_plans()),
                         ids=lambda v: v.describe() if isinstance(v, isa.MmaInstr) else str(v))
def test_ldmatrix_plan_delivers_the_mma_fragment(ins, operand, kc, n_tile):
    """Compose the plan's lane addresses with the ldmatrix map: every fragment element lands where PTX wants it."""
    plan = operand_load_plan(ins, operand, kc, n_tile)
    ldm = matrix_move_layout(plan.num, plan.trans)
    frag = mma_fragment(ins, operand)
    b = bits(ins.a_dtype if operand == "A" else ins.b_dtype)
    regs_per_tile = frag.regs
    seen = set()
    for lane in range(32):
        for reg in range(plan.num):
            tile, treg = (0, reg) if operand == "A" else divmod(reg, regs_per_tile)
            for e in range(32 // b if b <= 32 else 1):
                o = b * e
                matrix, row, col = ldm.forward(lane, reg, o // 16)
                src_lane = ldm.lane_of_address(matrix, row)
                sr, sc = plan.lane_address(src_lane)
                # bit offset of this element inside the stored 16-byte row, in units of the element width
                bit = 16 * col + o % 16
                got = (sr, sc + bit // b)
                lr, lc = frag.forward(lane, treg, e if b < 32 else 0)
                if operand == "B":
                    lc += 8 * tile
                want = _storage_coord(operand, kc, (lr, lc))
                assert got == want, (lane, reg, e, got, want)
                seen.add(got)
    assert len(seen) == plan.rows * plan.cols


@pytest.mark.parametrize("n_tile, transpose, per", [(n, t, p) for n in (8, 16) for t in (False, True)
                                                    for p in (1, 2, 4) if p <= n // 4])
def test_accumulator_stmatrix_plan_matches_c_fragment(n_tile, transpose, per):
    """stmatrix.x{per}(.trans) with the plan's addresses writes every accumulator to its (m, n) (C^T if transposed)."""
    ins = isa.select_mma("float16", "float16", "float32")
    plan = accumulator_store_plan(n_tile, transpose)
    stm = matrix_move_layout(per, transpose)
    frag = mma_fragment(ins, "C")
    written = set()
    for lane in range(32):
        for q in range(plan.num):
            h, pair = divmod(q, 2)
            first, reg = divmod(q, per)
            first *= per
            for half in range(2):
                matrix, row, col = stm.forward(lane, reg, half)     # element position in the stored matrix
                m0, n0 = plan.lane_address(stm.lane_of_address(matrix, row), first, per)
                got = (m0 + col, n0) if transpose else (m0, n0 + col)
                r, c = frag.forward(lane, 2 * pair + half, 0)
                assert got == (r, c + 8 * h)
                written.add(got)
    assert len(written) == 16 * n_tile
