"""ldmatrix / stmatrix lane maps against a byte-exact simulation of the instructions.

The simulation transcribes the PTX ISA text (section "Warp-level matrix load instruction: ldmatrix" and
"... store instruction: stmatrix"): addresses addr0-addr7 (lanes 0-7) are the rows of the first 8x8 b16 matrix,
addr8-addr15 of the second, and so on (x1 reads lanes 0-7 only, x2 lanes 0-15); "each thread in a warp loads
fragments of a row, with thread 0 receiving the first fragment in its register r, and so on; a group of four
threads loads an entire row" -- i.e. the matrix read row-major is cut into 32 consecutive 32-bit words and lane l gets
word l (lower-indexed element in the low half); ".trans indicates that the matrix is loaded in column-major format",
i.e. the same distribution applied to the transpose. Register i holds matrix i.
"""

import numpy as np
import pytest

from mmaemit import isa
from mmaemit.errors import LayoutError, UnsupportedConfigError
from mmaemit.layouts import mma_fragment, matrix_move_layout

from tir_eval import eval_prim

VARIANTS = [(num, trans) for num in (1, 2, 4) for trans in (False, True)]
SMEM_BYTES = 4096


def _random_setup(rng, num):
    smem = rng.integers(0, 256, size=SMEM_BYTES, dtype=np.uint8)
    rows = rng.choice(SMEM_BYTES // 16, size=32, replace=False) * 16       # distinct 16-B aligned row starts
    return smem, [int(a) for a in rows]


def _matrix(smem, addrs):
    """8x8 uint16 matrix whose row j is the 16 bytes at addrs[j] (little endian)."""
    return np.stack([smem[a:a + 16].view("<u2") for a in addrs])


def simulate_ldmatrix(smem, lane_addrs, num, trans):
    regs = np.zeros((32, num), dtype=np.uint32)
    for i in range(num):
        m = _matrix(smem, lane_addrs[8 * i:8 * i + 8])
        if trans:
            m = m.T
        flat = m.reshape(-1).astype(np.uint32)
        regs[:, i] = flat[0::2] | (flat[1::2] << 16)
    return regs


def simulate_stmatrix(smem, lane_addrs, regs, num, trans):
    out = smem.copy()
    for i in range(num):
        flat = np.empty(64, dtype=np.uint16)
        flat[0::2] = regs[:, i] & 0xFFFF
        flat[1::2] = regs[:, i] >> 16
        m = flat.reshape(8, 8)
        if trans:
            m = m.T
        for j, a in enumerate(lane_addrs[8 * i:8 * i + 8]):
            out[a:a + 16] = np.ascontiguousarray(m[j]).view(np.uint8)
    return out


def _u16(smem, byte):
    return int(smem[byte]) | (int(smem[byte + 1]) << 8)


@pytest.mark.parametrize("num,trans", VARIANTS)
def test_ldmatrix_map_matches_simulation(num, trans):
    lay = matrix_move_layout(num, trans)
    lay.check()
    rng = np.random.default_rng(100 + 2 * num + trans)
    for _ in range(20):
        smem, addrs = _random_setup(rng, num)
        regs = simulate_ldmatrix(smem, addrs, num, trans)
        for lane in range(32):
            for reg in range(num):
                for half in range(2):
                    matrix, row, col = lay.forward(lane, reg, half)
                    src_lane = lay.lane_of_address(matrix, row)
                    assert lay.address_of_lane(src_lane) == (matrix, row)
                    want = _u16(smem, addrs[src_lane] + 2 * col)
                    assert (int(regs[lane, reg]) >> (16 * half)) & 0xFFFF == want
                    assert tuple(lay.inverse(matrix, row, col)) == (lane, reg, half)


@pytest.mark.parametrize("num,trans", VARIANTS)
def test_stmatrix_map_matches_simulation(num, trans):
    lay = matrix_move_layout(num, trans)
    rng = np.random.default_rng(200 + 2 * num + trans)
    for _ in range(20):
        smem, addrs = _random_setup(rng, num)
        regs = rng.integers(0, 2**32, size=(32, num), dtype=np.uint64).astype(np.uint32)
        out = simulate_stmatrix(smem, addrs, regs, num, trans)
        touched = np.zeros(SMEM_BYTES, dtype=bool)
        for lane in range(32):
            for reg in range(num):
                for half in range(2):
                    matrix, row, col = lay.forward(lane, reg, half)
                    byte = addrs[lay.lane_of_address(matrix, row)] + 2 * col
                    assert _u16(out, byte) == (int(regs[lane, reg]) >> (16 * half)) & 0xFFFF
                    touched[byte:byte + 2] = True
        assert touched.sum() == 128 * num
        assert np.array_equal(out[~touched], smem[~touched])


@pytest.mark.parametrize("num,trans", VARIANTS)
def test_ignored_address_lanes(num, trans):
    lay = matrix_move_layout(num, trans)
    rng = np.random.default_rng(300 + num)
    smem, addrs = _random_setup(rng, num)
    moved = list(addrs)
    for lane in range(8 * num, 32):
        assert lay.address_of_lane(lane) is None
        moved[lane] = int(rng.integers(0, SMEM_BYTES // 16)) * 16
    assert np.array_equal(simulate_ldmatrix(smem, moved, num, trans), simulate_ldmatrix(smem, addrs, num, trans))
    for lane in range(8 * num):
        assert lay.address_of_lane(lane) == (lane // 8, lane % 8)


def test_invalid_variants_and_slots():
    with pytest.raises(UnsupportedConfigError, match="x4"):
        matrix_move_layout(3)
    lay = matrix_move_layout(2, True)
    with pytest.raises(LayoutError):
        lay.forward(0, 2, 0)
    with pytest.raises(LayoutError):
        lay.inverse(0, 8, 0)
    with pytest.raises(LayoutError):
        lay.lane_of_address(2, 0)
    assert lay.ptx() == "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"
    assert lay.ptx("stmatrix") == isa.matrix_move("stmatrix", 2, True).ptx()




@pytest.mark.parametrize("num,trans", VARIANTS)
def test_symbolic_lane(num, trans):
    from tvm import tirx

    lane = tirx.Var("lane", "int32")
    lay = matrix_move_layout(num, trans)
    m, r = lay.address_of_lane(lane)
    for v in range(32):
        got = (eval_prim(m, {"lane": v}), eval_prim(r, {"lane": v}))
        assert got == (lay.address_of_lane(v) or lay.address_of_lane(v % (8 * num)))
        for reg in range(num):
            for half in range(2):
                sym = lay.forward(lane, reg, half)
                assert tuple(eval_prim(x, {"lane": v}) for x in sym) == lay.forward(v, reg, half)


# ---- composition with the mma fragments (what the emitter relies on) ---------------------------------------------
def test_ldmatrix_x4_gives_mma_A_fragment_f16():
    """A (16x16, row-major) read with x4, lane l addressing row l % 16, col 8 * (l // 16): registers = mma A regs."""
    lay = matrix_move_layout(4, False)
    frag = mma_fragment(isa.select_mma("float16", "float16", "float32", k=16), "A")
    for lane in range(32):
        for reg in range(4):
            for half in range(2):
                matrix, row, col = lay.forward(lane, reg, half)
                src = lay.lane_of_address(matrix, row)
                tile = (src % 16, 8 * (src // 16) + col)
                assert tile == frag.forward(lane, reg, half)


def test_ldmatrix_x4_trans_gives_two_mma_B_fragments_f16():
    """B (16x16 = K x 2 n-tiles, row-major) with x4.trans, lane l addressing row l % 16, col 8 * (l // 16):
    registers 0,1 = B fragment of n-tile 0, registers 2,3 = B fragment of n-tile 1."""
    lay = matrix_move_layout(4, True)
    frag = mma_fragment(isa.select_mma("float16", "float16", "float32", k=16), "B")
    for lane in range(32):
        for reg in range(4):
            for half in range(2):
                matrix, row, col = lay.forward(lane, reg, half)
                src = lay.lane_of_address(matrix, row)
                k, n = src % 16, 8 * (src // 16) + col
                assert (k, n - 8 * (reg // 2)) == frag.forward(lane, reg % 2, half)
