"""The emitter's handling of permuted accumulators, checked by emulating one warp's GEMM on the CPU.

Operand fragments come from the PTX simulation of each load (``ptx_sim.run_plan`` for M/N-contiguous 8/4-bit
operands, placed with ``fragment_slot``; the proven fragment map for K-contiguous ones); the mma is emulated from the
fragment maps; every accumulator is then placed with ``accumulator_coords`` and the result must be exactly A @ B.
The same test checks the vector-store pairs and the PTX stmatrix row addresses against ``accumulator_coords``.
"""
import itertools

import ml_dtypes
import numpy as np
import pytest

from mmaemit import TensorCoreIntrinEmitter
from mmaemit.dtypes import bits
from mmaemit.errors import UnsupportedConfigError
from mmaemit.layouts import make_mma_swizzle_layout, mma_fragment
from mmaemit.layouts.transposed_load import TransposedLoadPlan
from ptx_sim import run_plan

_FP8 = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}


def _random_codes(rng, dtype, shape):
    """Random raw codes (bytes or nibbles) of ``dtype``, finite for fp8."""
    if dtype in _FP8:
        vals = rng.standard_normal(shape) * 4
        return np.asarray(vals.astype(_FP8[dtype]).view(np.uint8), dtype=np.int64)
    return rng.integers(0, 1 << bits(dtype), size=shape)


def _decode(dtype, codes):
    codes = np.asarray(codes, dtype=np.int64)
    if dtype in _FP8:
        return codes.astype(np.uint8).view(_FP8[dtype]).astype(np.float64)
    b = bits(dtype)
    if dtype.startswith("u"):
        return codes.astype(np.float64)
    return np.where(codes >= 1 << (b - 1), codes - (1 << b), codes).astype(np.float64)


def _to_bytes(codes, b):
    """Row-major element codes [rows, cols] -> bytes [rows, cols * b / 8] (4-bit: element 2i = low nibble)."""
    if b == 8:
        return codes.astype(np.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def _pack_fragment(frag, tile_codes, lane, reg):
    word = 0
    for e in range(frag.elems_per_reg):
        r, c = frag.forward(lane, reg, e)
        word |= int(tile_codes[r, c]) << (frag.elem_bits * e)
    return word


def _load_operand(em, operand, codes):
    """uint32 fragments [tiles, regs, 32] of this warp for the logical operand codes (A [M, K], B [K, N])."""
    ins = em.instruction
    frag = mma_fragment(ins, operand)
    plan = em.a_plan if operand == "A" else em.b_plan
    tiles = em.warp_rows if operand == "A" else em.warp_cols
    regs = em.local_size_a if operand == "A" else em.local_size_b
    out = np.full((tiles, regs, 32), -1, dtype=np.int64)
    if isinstance(plan, TransposedLoadPlan):
        stored = codes.T if operand == "A" else codes                 # [K, M] or [K, N]
        row_bytes = stored.shape[1] * plan.elem_bits // 8
        smem = _to_bytes(stored, plan.elem_bits).reshape(-1)
        for grp in range(stored.shape[1] // plan.extent):
            mn0 = grp * plan.extent
            vals = run_plan(plan, smem, lambda k, mn: k * row_bytes + (mn0 + mn) * plan.elem_bits // 8)
            for name, unit, reg in plan.outputs:
                t, q = em.fragment_slot(operand, grp, unit, reg)
                assert (out[t, q] == -1).all(), "fragment register written twice"
                out[t, q] = vals[name]
    else:  # K-contiguous: the single-ldmatrix plan is proven in test_emitter.py; build the fragment directly
        for t in range(tiles):
            for q in range(regs):
                if operand == "A":
                    tile = codes[16 * t:16 * t + 16]
                    out[t, q] = [_pack_fragment(frag, tile, lane, q) for lane in range(32)]
                else:
                    h, r = divmod(q, ins.b_regs)
                    tile = codes[:, em.n_tile * t + 8 * h:em.n_tile * t + 8 * h + 8]
                    out[t, q] = [_pack_fragment(frag, tile, lane, r) for lane in range(32)]
    assert (out >= 0).all(), "fragment register never written"
    return out


def _unpack(frag, regs_lanes, dtype, shape):
    """Fragment registers [regs, 32] -> decoded matrix of ``shape`` (every slot once)."""
    m = np.full(shape, np.nan)
    for lane, reg, e in frag.slots():
        r, c = frag.forward(lane, reg, e)
        code = (int(regs_lanes[reg, lane]) >> (frag.elem_bits * e)) & ((1 << frag.elem_bits) - 1)
        m[r, c] = _decode(dtype, [code])[0]
    assert not np.isnan(m).any()
    return m


def _emulate(em, A_codes, B_codes):
    """C[warp_row_tiles, warp_col_tiles] placed through accumulator_coords; also returns the raw accumulators."""
    ins = em.instruction
    fa, fb, fc = (mma_fragment(ins, x) for x in "ABC")
    A_frag, B_frag = _load_operand(em, "A", A_codes), _load_operand(em, "B", B_codes)
    C = np.full((em.warp_row_tiles, em.warp_col_tiles), np.nan)
    acc = {}
    for i, j in itertools.product(range(em.warp_rows), range(em.warp_cols)):
        a = _unpack(fa, A_frag[i], ins.a_dtype, (16, ins.k))
        for h in range(em.n_tile // 8):
            b = _unpack(fb, B_frag[j, h * ins.b_regs:(h + 1) * ins.b_regs], ins.b_dtype, (ins.k, 8))
            c = a @ b
            for lane, reg, e in fc.slots():
                flat = h * ins.c_elems + reg * fc.elems_per_reg + e
                acc[i, j, flat, lane] = c[fc.forward(lane, reg, e)]
    for (i, j, flat, lane), v in acc.items():
        m, n = em.accumulator_coords(lane, i, j, flat)
        assert np.isnan(C[m, n]), f"two accumulators at {(m, n)}"
        C[m, n] = v
    return C


CONFIGS = [
    # (a, b, accum, k, warp tile (m, n), n_tile)
    ("int8", "int8", "int32", None, (32, 32), 16),
    ("uint8", "int8", "int32", None, (16, 32), 8),
    ("int8", "uint8", "int32", 16, (32, 16), 16),
    ("float8_e4m3fn", "float8_e5m2", "float32", None, (16, 32), 16),
    ("float8_e5m2", "float8_e5m2", "float16", None, (32, 16), 8),
    ("int4", "int4", "int32", None, (32, 64), 16),
    ("uint4", "int4", "int32", 32, (64, 32), 8),
]


@pytest.mark.parametrize("a_t, b_t", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("a, b, acc, k, warp, n_tile", CONFIGS)
def test_emulated_warp_gemm_places_every_accumulator(a, b, acc, k, warp, n_tile, a_t, b_t):
    em = TensorCoreIntrinEmitter(a, b, acc, a_transposed=a_t, b_transposed=b_t, block_row_warps=1,
                                 block_col_warps=1, warp_row_tiles=warp[0], warp_col_tiles=warp[1],
                                 chunk=k or (32 if bits(a) == 8 else 64), k=k, n_tile=n_tile)
    ins = em.instruction
    assert (em.c_row_perm is not None) == a_t and (em.c_col_perm is not None) == (not b_t)
    rng = np.random.default_rng(hash((a, b, a_t, b_t, n_tile)) % 2**32)
    A_codes = _random_codes(rng, ins.a_dtype, (warp[0], ins.k))
    B_codes = _random_codes(rng, ins.b_dtype, (ins.k, warp[1]))
    C = _emulate(em, A_codes, B_codes)
    want = _decode(ins.a_dtype, A_codes) @ _decode(ins.b_dtype, B_codes)
    np.testing.assert_allclose(C, want, rtol=1e-12, atol=0)
    if acc == "int32":
        assert np.array_equal(C, want)

    # vector-store pairs: adjacent n, every accumulator exactly once
    seen = set()
    for pa, pb in em._c_store_pairs:
        for lane in range(32):
            (m0, n0), (m1, n1) = em.accumulator_coords(lane, *pa), em.accumulator_coords(lane, *pb)
            assert (m1, n1) == (m0, n0 + 1) and n0 % 2 == 0
        seen |= {pa, pb}
    assert len(seen) == em.warp_rows * em.warp_cols * (n_tile // 8) * ins.c_elems
    # with a column permutation the pairs join into runs of 4 adjacent n (one 16-byte / 8-byte store)
    assert (em._c_store_quads is not None) == (em.c_col_perm is not None)
    for p, q in em._c_store_quads or ():
        for lane in range(32):
            m0, n0 = em.accumulator_coords(lane, *p[0])
            assert n0 % 4 == 0
            assert [em.accumulator_coords(lane, *s) for s in (*p, *q)] == [(m0, n0 + d) for d in range(4)]

    # PTX stmatrix rows: a row permutation is fine for plain stmatrix, a column one for .trans (the other raises);
    # the micro tile's ``num`` matrices may go out as x4, x2 or x1 instructions (``per`` matrices from ``first``)
    num = 2 * (n_tile // 8)
    for transpose, per in itertools.product((False, True), (1, 2, 4)):
        along_row = em.c_row_perm if transpose else em.c_col_perm
        if along_row is not None or per > num:
            continue
        for i, j, lane in itertools.product(range(em.warp_rows), range(em.warp_cols), range(32)):
            g, c = divmod(lane, 4)
            for q, half in itertools.product(range(num), range(2)):
                e = (q // 2) * ins.c_elems + em._c_pairs[q % 2] + half
                first = q - q % per
                if transpose:   # register half -> stored row 2c + half (an n row) of matrix q, column g (m)
                    m0, n = em._stmatrix_row(8 * (q - first) + 2 * c + half, i, j, first, per, True)
                    got = (m0 + g, n)
                else:           # register -> row g (an m row) of matrix q, columns 2c, 2c + 1 (n)
                    m, n0 = em._stmatrix_row(8 * (q - first) + g, i, j, first, per, False)
                    got = (m, n0 + 2 * c + half)
                assert got == tuple(em.accumulator_coords(lane, i, j, e)), (transpose, per, i, j, lane, q, half)


def test_permuted_layouts_reject_forced_stmatrix():
    """Forcing PTX stmatrix along a permuted direction raises (it would write 8 wrong-ordered values per row)."""
    from tvm.script import tirx as T

    em = TensorCoreIntrinEmitter("float8_e4m3fn", "float8_e4m3fn", "float32", b_transposed=False,
                                 block_row_warps=1, block_col_warps=1, warp_row_tiles=16, warp_col_tiles=16,
                                 arch="sm_90a")
    assert em.c_col_perm is not None

    with pytest.raises(Exception, match="permuted") as err:   # TVMScript re-raises parse-time errors
        @T.prim_func
        def k(C: T.Buffer((16, 16), "float16")):
            T.device_entry()
            warp = T.warp_id([1])
            lane = T.lane_id([32])
            Cs = T.alloc_buffer((16, 16), "float16", scope="shared")
            a_frag, b_frag, c_frag = em.alloc_fragments()
            em.stmatrix(c_frag, Cs, warp=warp, lane=lane, use_stmatrix=True)
    chain, e = [], err.value
    while e is not None:
        chain.append(type(e))
        e = e.__cause__ or e.__context__
    assert UnsupportedConfigError in chain or "UnsupportedConfigError" in str(err.value), chain


def test_shared_swizzle_follows_the_load_plan():
    em = TensorCoreIntrinEmitter("int8", "int8", "int32", a_transposed=True, b_transposed=True, chunk=64)
    a = em.shared_swizzle("A", (3, *em.a_shared_shape), "int8")      # [K, M] = [64, 128]: 128-B rows
    b = em.shared_swizzle("B", (3, *em.b_shared_shape), "int8")      # [N, K]: K-contiguous, default scheme
    assert a.row_bits == (0, 2, 3) and b.row_bits is None
    assert em.a_plan.ldmatrix_conflicts(make_mma_swizzle_layout(em.a_shared_shape, "int8", row_bits=a.row_bits)) == 0
    with pytest.raises(UnsupportedConfigError, match="'A', 'B'"):
        em.shared_swizzle("C", (64, 128), "int8")
