"""Shared-memory swizzles: bijective and bank-conflict-free by enumeration, usable as TIR buffer indices.

Two independent conflict counts: the library's (through ``mmaemit.layouts.banks``) and a direct one here from the
bank rule (32 banks x 4 B, a 16-B access per lane, 8 lanes per phase => a phase is conflict-free iff its 8 addresses
fall in 8 different 16-B bank groups ``(addr // 16) % 8``).
"""
import shutil
import subprocess

import numpy as np
import pytest

from mmaemit import dtypes
from mmaemit.errors import LayoutError, TileShapeError, UnsupportedConfigError
from mmaemit.layouts import SwizzleLayout, make_mma_swizzle_layout

from tir_eval import eval_prim

ROW_BYTES = list(range(16, 513, 16))            # every accepted row size up to 512 B
HEIGHTS = list(range(8, 257, 8))
DTYPES = ["int4", "int8", "float16", "float32"]


def _chunk_addresses(lay):
    """Physical byte address of the first element of every logical 16-B chunk: shape (*lead, rows, chunks)."""
    epc = 128 // dtypes.bits(lay.dtype)
    shape = lay.shape[:-1] + (lay.row_bytes // 16,)
    idx = list(np.indices(shape, dtype=np.int64))
    idx[-1] = idx[-1] * epc
    phys = lay(*idx)
    flat = np.ravel_multi_index(tuple(phys), lay.shape)
    return flat * dtypes.bits(lay.dtype) // 8


def _direct_ldmatrix_bad_phases(addr):
    """Phases (8 consecutive rows from a multiple of 8, one logical chunk) whose bank groups are not all distinct."""
    groups = (addr // 16) % 8
    rows, chunks = groups.shape[-2:]
    g = groups.reshape(-1, rows // 8, 8, chunks)
    return int((np.sort(g, axis=2) != np.arange(8)[None, None, :, None]).any(axis=2).sum())


def _direct_cp_async_bad_phases(addr):
    """8-lane phases of consecutive logical chunks (starting at multiples of 8) with a repeated bank group."""
    groups = ((addr.reshape(-1) // 16) % 8)
    groups = groups[: groups.size // 8 * 8].reshape(-1, 8)
    return int((np.sort(groups, axis=1) != np.arange(8)).any(axis=1).sum())


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_row_size_and_height_is_bijective_and_conflict_free(dtype):
    bits = dtypes.bits(dtype)
    epc = 128 // bits
    for row_bytes in ROW_BYTES:
        cols = row_bytes * 8 // bits
        reference = None
        for rows in HEIGHTS:
            lay = make_mma_swizzle_layout((rows, cols), dtype)
            assert lay.row_bytes == row_bytes
            lay.check()
            # whole 16-B chunks move: the position inside a chunk is kept, the row never changes
            r, c = np.indices((rows, cols))
            pr, pc = lay(r, c)
            assert np.array_equal(pr, r) and np.array_equal(pc % epc, c % epc)
            addr = _chunk_addresses(lay)
            assert (addr % 16 == 0).all()
            assert _direct_ldmatrix_bad_phases(addr) == 0
            assert _direct_cp_async_bad_phases(addr) == 0
            assert lay.ldmatrix_conflicts() == 0
            assert lay.cp_async_conflicts() == 0
            if rows == 64:
                assert lay.cp_async_conflicts(warp_step=8) == 0
            # the byte pattern is the same for every element width
            if reference is None:
                reference = addr[:8]
            assert np.array_equal(addr[:8], reference)


def test_stacked_stages_are_conflict_free():
    for row_bytes in (32, 64, 96, 128, 160, 192, 224, 256, 384):
        lay = make_mma_swizzle_layout((3, 40, row_bytes // 2), "float16")
        lay.check()
        addr = _chunk_addresses(lay)
        assert _direct_ldmatrix_bad_phases(addr) == 0 and _direct_cp_async_bad_phases(addr) == 0
        assert lay.ldmatrix_conflicts() == 0 and lay.cp_async_conflicts() == 0
        s, r, c = 2, 13, 5
        assert lay(s, r, c)[0] == s and lay(s, r, c)[1:] == make_mma_swizzle_layout((40, row_bytes // 2),
                                                                                      "float16")(r, c)


def test_identity_conflicts_so_the_checker_can_fail():
    ident = make_mma_swizzle_layout((64, 64), "float16", swizzle_bytes=0)        # 128-B rows
    assert ident.swizzle_bytes == 0 and ident(5, 17) == (5, 17)
    ident.check()
    phases = (64 // 8) * 8
    assert ident.ldmatrix_conflicts() == 7 * phases                              # 8-way: all rows in one group
    assert _direct_ldmatrix_bad_phases(_chunk_addresses(ident)) == phases
    assert ident.cp_async_conflicts() == 0                                      # contiguous: nothing to fix
    # a too-small swizzle on 128-B rows is bijective but still 2-way conflicted
    small = make_mma_swizzle_layout((64, 64), "float16", swizzle_bytes=64)
    small.check()
    assert small.ldmatrix_conflicts() == phases
    # and a hand-made non-bijective map is caught by check()
    class Broken(SwizzleLayout):
        def __call__(self, *idx):
            *lead, r, c = idx
            return (*lead, r, c & ~8)
    with pytest.raises(Exception, match="share"):
        Broken((64, 64), "float16", 128, 128).check()


def test_automatic_choice_is_the_conflict_free_one():
    expected = {16: 0, 32: 32, 48: 0, 64: 64, 96: 32, 128: 128, 160: 32, 192: 64, 224: 32, 256: 128,
                320: 64, 384: 128, 512: 128, 1024: 128}
    for row_bytes, sb in expected.items():
        lay = make_mma_swizzle_layout((32, row_bytes), "int8")
        assert lay.swizzle_bytes == sb, row_bytes
        costs = {}
        for forced in (0, 32, 64, 128):
            if forced and row_bytes % forced:
                with pytest.raises(UnsupportedConfigError):
                    make_mma_swizzle_layout((32, row_bytes), "int8", swizzle_bytes=forced)
                continue
            costs[forced] = make_mma_swizzle_layout((32, row_bytes), "int8", swizzle_bytes=forced).ldmatrix_conflicts()
        assert costs[sb] == 0 == min(costs.values())
        assert all(costs[s] > 0 for s in costs if s < sb)             # every smaller swizzle conflicts


def test_large_rows_accepted():
    for row_bytes in (640, 768, 1024):
        lay = make_mma_swizzle_layout((16, row_bytes // 4), "float32")
        lay.check()
        assert lay.ldmatrix_conflicts() == 0 and lay.cp_async_conflicts() == 0


def test_bad_shapes_and_choices():
    for shape, dt in (((64, 4), "float16"), ((64, 12), "float16"), ((64, 16), "int4"), ((64, 40), "int8")):
        with pytest.raises(TileShapeError) as ei:
            make_mma_swizzle_layout(shape, dt)
        assert "multiples of 16 bytes" in str(ei.value) and "96" in str(ei.value)
    with pytest.raises(TileShapeError, match="multiples of 8"):
        make_mma_swizzle_layout((12, 64), "float16")
    with pytest.raises(TileShapeError, match="2 dims"):
        make_mma_swizzle_layout((64,), "float16")
    with pytest.raises(UnsupportedConfigError, match="dtype is required"):
        make_mma_swizzle_layout((64, 64))
    with pytest.raises(UnsupportedConfigError) as ei:
        make_mma_swizzle_layout((64, 32), "float16", swizzle_bytes=128)           # 64-B rows
    assert "0, 32, 64" in str(ei.value)
    with pytest.raises(UnsupportedConfigError, match="0, 32, 64, 128"):
        make_mma_swizzle_layout((64, 64), "float16", swizzle_bytes=256)
    with pytest.raises(UnsupportedConfigError):
        make_mma_swizzle_layout((64, 64), "float16", swizzle_bytes=True)
    with pytest.raises(LayoutError, match="disagrees"):
        SwizzleLayout((64, 64), "float16", 64, 64)                                # 64 fp16 = 128 B, not 64
    with pytest.raises(UnsupportedConfigError):
        SwizzleLayout((64, 32), "float16", 64, 128)


def test_tvm_buffer_input():
    import tvm

    buf = tvm.tirx.decl_buffer((2, 32, 96), "float16")
    lay = make_mma_swizzle_layout(buf)
    assert lay.shape == (2, 32, 96) and lay.dtype == "float16" and lay.row_bytes == 192 and lay.swizzle_bytes == 64
    i4 = make_mma_swizzle_layout(tvm.tirx.decl_buffer((16, 256), "int4"))
    assert i4.row_bytes == 128 and i4.swizzle_bytes == 128 and i4(1, 0) == (1, 32)   # chunk 0 -> 1 = 32 int4
    with pytest.raises(UnsupportedConfigError, match="disagrees"):
        make_mma_swizzle_layout(buf, "int8")
    n = tvm.tirx.Var("n", "int32")
    with pytest.raises(TileShapeError, match="static shape"):
        make_mma_swizzle_layout(tvm.tirx.decl_buffer((n, 64), "float16"))




def test_symbolic_indices_match_integers():
    from tvm import tirx

    s, r, c = (tirx.Var(n, "int32") for n in "src")
    rng = np.random.default_rng(11)
    for row_bytes in (32, 64, 96, 128, 192, 256):
        for dt in DTYPES:
            cols = row_bytes * 8 // dtypes.bits(dt)
            lay = make_mma_swizzle_layout((2, 64, cols), dt)
            sym = lay(s, r, c)
            for _ in range(50):
                env = {"s": int(rng.integers(2)), "r": int(rng.integers(64)), "c": int(rng.integers(cols))}
                assert tuple(eval_prim(x, env) for x in sym) == lay(env["s"], env["r"], env["c"])


# ---- TIR kernels ---------------------------------------------------------------------------------------------------
def _copy_kernel(shape, swz):
    from tvm.script import tirx as T

    lead = shape[:-2]
    rows, cols = shape[-2:]
    n_iter = rows * cols // 32

    if lead:
        @T.prim_func
        def kern(A: T.Buffer(shape, "float16"), B: T.Buffer(shape, "float16")):
            T.device_entry()
            T.warp_id([1])
            lane = T.lane_id([32])
            smem = T.alloc_buffer(shape, "float16", scope="shared")
            for st in T.serial(lead[0]):
                for i in T.serial(n_iter):
                    r = T.meta_var((i * 32 + lane) // cols)
                    c = T.meta_var((i * 32 + lane) % cols)
                    smem[swz(st, r, c)] = A[st, r, c]
            T.cuda.cta_sync()
            for st in T.serial(lead[0]):
                for i in T.serial(n_iter):
                    r = T.meta_var((i * 32 + lane) // cols)
                    c = T.meta_var((i * 32 + lane) % cols)
                    B[st, r, c] = smem[swz(st, r, c)]
    else:
        @T.prim_func
        def kern(A: T.Buffer(shape, "float16"), B: T.Buffer(shape, "float16")):
            T.device_entry()
            T.warp_id([1])
            lane = T.lane_id([32])
            smem = T.alloc_buffer(shape, "float16", scope="shared")
            for i in T.serial(n_iter):
                r = T.meta_var((i * 32 + lane) // cols)
                c = T.meta_var((i * 32 + lane) % cols)
                smem[swz(r, c)] = A[r, c]
            T.cuda.cta_sync()
            for i in T.serial(n_iter):
                r = T.meta_var((i * 32 + lane) // cols)
                c = T.meta_var((i * 32 + lane) % cols)
                B[r, c] = smem[swz(r, c)]
    return kern


@pytest.mark.parametrize("shape", [(32, 64), (2, 16, 96)], ids=["2d-128B", "3d-stages-192B"])
def test_tir_kernel_indexing_compiles_for_sm80(shape, tmp_path):
    import tvm

    swz = make_mma_swizzle_layout(shape, "float16")
    kern = _copy_kernel(shape, swz)
    tgt = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    with tgt:
        ex = tvm.compile(kern, target=tgt, tir_pipeline="tirx")
    src = ex.mod.imports[0].inspect_source()
    assert "kern_kernel" in src and "^" in src
    n = int(np.prod(shape))
    assert f"smem_ptr[{n}]" in src                                     # same footprint, no padding
    if shutil.which("nvcc"):
        cu = tmp_path / "k.cu"
        cu.write_text(src)
        subprocess.run(["nvcc", "-arch=sm_80", "-cubin", "-o", str(tmp_path / "k.cubin"), str(cu)], check=True,
                       capture_output=True)
