"""The Hopper pipeline blocks (mmaemit.pipeline) and the warp-specialized TMA GEMM (mmaemit.kernels.gemm_hopper):
validation errors, the persistent scheduler's bijection, SASS shape on the CPU, numerics on the GPU."""
import functools
import itertools

import numpy as np
import pytest

import mmaemit
from mmaemit.runtime.sass import wgmma_accumulator_hazards
from mmaemit.errors import ArchError, LayoutError, TileShapeError, UnsupportedConfigError
from mmaemit.kernels.gemm_hopper import HopperGemmConfig, default_out_dtype, make_gemm_hopper, smem_bytes
from mmaemit.layouts import make_mma_swizzle_layout
from mmaemit.pipeline import MbarrierRing, PersistentTileScheduler, TmaTile, WarpgroupRoles


# ---- TmaTile -----------------------------------------------------------------------------------------------------
def test_tma_tile_sizes_and_strides():
    t = TmaTile((4096, 1000), "float16", (128, 64), 128)
    assert t.box_bytes == 128 * 64 * 2 and t.byte_strides() == (2000,) and t.smem_alignment == 1024
    assert TmaTile((8, 16, 32), "int8", (1, 16, 32)).byte_strides() == (32, 512)


@pytest.mark.parametrize("kw, err, match", [
    (dict(global_shape=(64, 100), dtype="float16", box=(64, 64), swizzle_bytes=128), TileShapeError, "multiple of 8"),
    (dict(global_shape=(64, 128), dtype="float16", box=(64, 128), swizzle_bytes=128), TileShapeError, "at most 128"),
    (dict(global_shape=(512, 64), dtype="float16", box=(512, 64)), TileShapeError, r"\[1, 256\]"),
    (dict(global_shape=(64, 64), dtype="float16", box=(64, 4)), TileShapeError, "multiple of 16 bytes"),
    (dict(global_shape=(64, 64), dtype="float16", box=(64, 64), swizzle_bytes=96), UnsupportedConfigError, "0, 32"),
    (dict(global_shape=(64, 64), dtype="int4", box=(64, 64)), UnsupportedConfigError, "float16"),
    (dict(global_shape=(64, 64), dtype="int8", box=(64, 64), oob_fill="nan"), UnsupportedConfigError, "float"),
    (dict(global_shape=(2,) * 6, dtype="float16", box=(1,) * 6), UnsupportedConfigError, "rank 1..5"),
    (dict(global_shape=(64, 64), dtype="float16", box=(64,)), TileShapeError, "one extent per"),
])
def test_tma_tile_errors(kw, err, match):
    with pytest.raises(err, match=match):
        TmaTile(**kw)


def test_tma_tile_for_layout_takes_the_layout_swizzle():
    lay = make_mma_swizzle_layout((4, 128, 64), "float16")        # 128-byte rows -> 128-byte swizzle
    t = TmaTile.for_layout((4096, 4096), lay)
    assert (t.box, t.swizzle_bytes) == ((128, 64), 128)
    wide = make_mma_swizzle_layout((128, 128), "float16")          # 256-byte rows: not a TMA layout
    with pytest.raises(LayoutError, match="atoms"):
        TmaTile.for_layout((4096, 4096), wide)


# ---- mbarrier ring, roles, scheduler -----------------------------------------------------------------------------
def test_ring_stage_and_parity():
    ring = MbarrierRing(4, 2)
    assert [ring.stage(i) for i in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert [ring.parity(i) for i in range(9)] == [0, 0, 0, 0, 1, 1, 1, 1, 0]
    with pytest.raises(UnsupportedConfigError, match="2..16"):
        MbarrierRing(1, 2)
    with pytest.raises(UnsupportedConfigError, match="cluster"):
        MbarrierRing(4, 2, cluster=3)


def test_roles_register_budget():
    r = WarpgroupRoles(1, 2, 40, 232)
    assert (r.threads, r.entry_regs) == (384, 168)
    with pytest.raises(UnsupportedConfigError, match="at most 224"):
        WarpgroupRoles(1, 2, 56, 240)
    with pytest.raises(UnsupportedConfigError, match="multiple of 8"):
        WarpgroupRoles(1, 2, 42, 232)
    # 640 threads start with 96 registers: the consumers can only grow by what the producer gives back (a budget
    # within the register file but above the launch allocation hung on the H100)
    assert WarpgroupRoles(1, 4, 24, 112).entry_regs == 96
    with pytest.raises(UnsupportedConfigError, match=r"62464 > 61440 .* at most 104"):
        WarpgroupRoles(1, 4, 40, 112)


@pytest.mark.parametrize("gm, gn, workers, panel, cl", [(32, 16, 132, 16, 1), (7, 5, 4, 3, 1), (8, 9, 66, 8, 2),
                                                         (1, 1, 132, 8, 1), (30, 112, 132, 16, 2)])
def test_scheduler_visits_every_tile_once(gm, gn, workers, panel, cl):
    s = PersistentTileScheduler(gm, gn, workers, panel, cl)
    seen = []
    for w in range(workers):
        for t in range(s.count(w)):
            seen += [s.tile(w, t, r) for r in range(cl)]
    assert sorted(seen) == sorted(itertools.product(range(gm), range(gn)))


# ---- kernel configuration errors ---------------------------------------------------------------------------------
def test_hopper_gemm_errors():
    with pytest.raises(ArchError, match="sm_90a"):
        make_gemm_hopper(256, 256, 256, arch="sm_90")
    with pytest.raises(UnsupportedConfigError, match="K-major only.*float16 / bfloat16"):
        make_gemm_hopper(256, 256, 256, "int8", trans_b=False)
    with pytest.raises(UnsupportedConfigError, match="K-major only"):
        make_gemm_hopper(256, 256, 256, "float8_e4m3fn", trans_a=True)
    with pytest.raises(UnsupportedConfigError, match="static M"):
        make_gemm_hopper(None, 256, 256, trans_a=True)
    with pytest.raises(TileShapeError, match="16 bytes"):
        make_gemm_hopper(100, 256, 256, trans_a=True)              # A [K, M] rows of 200 bytes
    with pytest.raises(TileShapeError, match="multiple of 64 columns"):
        make_gemm_hopper(256, 256, 256, trans_b=False, config=HopperGemmConfig(block_n=192, cluster_m=2,
                                                                               epilogue_boxes=1))
    with pytest.raises(UnsupportedConfigError, match="valid"):
        make_gemm_hopper(256, 256, 256, "float32")
    with pytest.raises(UnsupportedConfigError, match="int32"):
        make_gemm_hopper(256, 256, 256, "int8", "float16")
    with pytest.raises(TileShapeError, match="wgmma N"):
        make_gemm_hopper(256, 256, 256, config=HopperGemmConfig(block_n=100))
    with pytest.raises(UnsupportedConfigError, match="shared memory"):
        make_gemm_hopper(256, 256, 256, config=HopperGemmConfig(stages=6))
    with pytest.raises(UnsupportedConfigError, match="register budget"):
        make_gemm_hopper(256, 256, 256, config=HopperGemmConfig(producer_regs=56, consumer_regs=240))
    with pytest.raises(UnsupportedConfigError, match="scales"):
        make_gemm_hopper(256, 256, 256, "float16", scaled=True)
    with pytest.raises(TileShapeError, match="16 bytes"):
        make_gemm_hopper(256, 256, 100)                 # K rows of 200 bytes: not a TMA stride
    assert default_out_dtype("float8_e4m3fn") == "bfloat16" and default_out_dtype("uint8") == "int32"
    assert smem_bytes("float16", "float16", HopperGemmConfig()) <= 232448


# ---- SASS (CPU) --------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _compiled(M, N, K, dtype, out_dtype=None, cfg=HopperGemmConfig(num_sms=132)):
    func, _ = make_gemm_hopper(M, N, K, dtype, out_dtype, config=cfg)
    return mmaemit.compile(func, target="sm_90a")


_MMA_OP = {"float16": "HGMMA.64x256x16.F32", "bfloat16": "HGMMA.64x256x16.F32.BF16",
           "float8_e4m3fn": "QGMMA.64x256x32.F32.E4M3.E4M3", "int8": "IGMMA.64x128x32.S8.S8"}


@pytest.mark.parametrize("dtype, out", [("float16", None), ("bfloat16", "float32"), ("float8_e4m3fn", None),
                                        ("int8", None)])
def test_hopper_gemm_sass(dtype, out):
    k = _compiled(4096, 4096, 4096, dtype, out)
    hist = k.opcode_histogram("sm_90a")
    per_block = 8 if dtype == "int8" else 4                 # 64-wide (128-byte) K block: 4 k16 or 2 x 2 k32 halves
    assert hist.get(_MMA_OP[dtype], 0) == per_block, hist
    assert hist.get("WARPGROUP.ARRIVE", 0) == 1, hist        # the block's wgmmas issue back to back (no C7514)
    assert hist.get("UTMALDG.2D", 0) == 2 and hist.get("UTMASTG.2D", 0) > 0, hist
    assert not any(op.startswith("LDGSTS") for op in hist), hist
    usage = k.resource_usage("sm_90a")
    assert usage.spill_store_bytes == usage.spill_load_bytes == usage.stack_frame_bytes == 0
    log = k.cubin("sm_90a").ptxas_log
    assert "C7514" not in log and "C7508" not in log, log      # no serialized wgmma, setmaxnreg honoured
    assert "USETMAXREG" in k.sass("sm_90a")
    assert wgmma_accumulator_hazards(k.sass("sm_90a")) == []


@pytest.mark.parametrize("ta, tb", [(True, True), (False, False), (True, False)])
def test_hopper_gemm_mn_major_sass(ta, tb):
    """M/N-contiguous 16-bit operands: one TMA box per 64-column atom (A: 2, B: 4 per stage), the same 4 HGMMA per K
    block issued back to back, no spills."""
    func, _ = make_gemm_hopper(4096, 4096, 4096, "float16", trans_a=ta, trans_b=tb,
                               config=HopperGemmConfig(num_sms=132))
    k = mmaemit.compile(func, target="sm_90a")
    hist = k.opcode_histogram("sm_90a")
    assert hist.get("HGMMA.64x256x16.F32", 0) == 4 and hist.get("WARPGROUP.ARRIVE", 0) == 1, hist
    assert hist.get("UTMALDG.2D", 0) == (2 if ta else 1) + (1 if tb else 4), hist
    assert wgmma_accumulator_hazards(k.sass("sm_90a")) == []
    usage = k.resource_usage("sm_90a")
    assert usage.spill_store_bytes == usage.spill_load_bytes == 0
    log = k.cubin("sm_90a").ptxas_log
    assert "C7514" not in log and "C7508" not in log, log
    # the instruction's immediates (scale-a, scale-b, trans-a, trans-b) carry the majors
    assert f"m64n256k16_f32_f16_f16_1_1_{int(ta)}_{int(not tb)}(" in k.cuda_source


@pytest.mark.parametrize("dt, out, ta, tb, shape", [
    ("float16", "float32", True, True, (200, 136, 200)),          # ragged M, N, K: TMA bounds in every major
    ("bfloat16", "bfloat16", False, False, (128, 200, 136)),
    ("float16", "float16", True, False, (136, 128, 72)),
])
def test_hopper_gemm_mn_major_on_the_interpreter(dt, out, ta, tb, shape):
    import ml_dtypes

    M, N, K = shape
    npdt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
    rng = np.random.default_rng(M + N)
    A = rng.standard_normal((M, K)).astype(npdt[dt])
    B = rng.standard_normal((N, K)).astype(npdt[dt])
    func, _ = make_gemm_hopper(M, N, K, dt, out, trans_a=ta, trans_b=tb,
                               config=HopperGemmConfig(block_n=64, stages=2, num_sms=2, epilogue_boxes=1))
    C = np.full((M, N), np.nan, npdt[out])
    report = mmaemit.interpret(func, np.ascontiguousarray(A.T) if ta else A, B if tb else np.ascontiguousarray(B.T), C)
    assert report.ok, report.summary()
    ref = A.astype(np.float64) @ B.astype(np.float64).T
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}[out]
    got = C.astype(np.float64)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


# ---- GPU ---------------------------------------------------------------------------------------------------------
def _inputs(M, N, K, dtype, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    if dtype in ("int8", "uint8"):
        lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
        return [torch.randint(lo, hi, s, generator=g, device="cuda", dtype=getattr(torch, dtype))
                for s in ((M, K), (N, K))]
    td = getattr(torch, dtype)
    return [(torch.randn(s, generator=g, device="cuda") / K ** 0.25).to(td) for s in ((M, K), (N, K))]


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, dtype, out, cfg", [
    (1024, 1024, 1024, "float16", None, HopperGemmConfig()),
    (1000, 1000, 1000, "float16", None, HopperGemmConfig()),                      # ragged: TMA bounds
    (777, 520, 1304, "bfloat16", "float32", HopperGemmConfig()),
    (1024, 768, 2048, "bfloat16", None, HopperGemmConfig(cluster_m=2, epilogue="overlap")),
    (1024, 1024, 1024, "float16", None, HopperGemmConfig(block_n=128, consumers=1, stages=6, in_flight=0)),
    (512, 1024, 1024, "float8_e4m3fn", None, HopperGemmConfig()),
    (520, 1000, 1040, "float8_e5m2", "float32", HopperGemmConfig()),
    (1024, 1024, 2048, "int8", None, HopperGemmConfig()),
    (300, 1056, 4000, "uint8", None, HopperGemmConfig(panel=4)),
])
def test_hopper_gemm_gpu(M, N, K, dtype, out, cfg):
    import torch

    func, _ = make_gemm_hopper(M, N, K, dtype, out, config=cfg)
    kernel = mmaemit.compile(func)
    A, B = _inputs(M, N, K, dtype, seed=M + N + K)
    out = out or default_out_dtype(dtype)
    C = torch.full((M, N), -7 if out == "int32" else float("nan"), device="cuda", dtype=getattr(torch, out))
    args = [A, B, C]
    scale = 1.0
    if dtype.startswith("float8"):
        sa, sb = torch.rand(1, device="cuda") + 0.5, torch.rand(1, device="cuda") + 0.5
        args += [sa, sb]
        scale = float(sa) * float(sb)
    kernel(*args)
    ref = (A.double() @ B.double().T) * scale
    if out == "int32":
        assert torch.equal(C.double(), ref)
    else:
        assert not torch.isnan(C).any()
        rel = ((C.double() - ref).norm() / ref.norm()).item()
        assert rel < (3e-3 if dtype.startswith("float8") or out == "bfloat16" else 1e-3), rel
    # deterministic: a second run writes the same bits
    C2 = torch.full_like(C, 0)
    args[2] = C2
    kernel(*args)
    assert torch.equal(C, C2)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, dtype, ta, tb, cfg", [
    (1000, 1000, 1000, "float16", True, False, HopperGemmConfig()),                  # ragged, both MN-major
    (1024, 768, 2048, "bfloat16", False, False, HopperGemmConfig(cluster_m=2)),      # B [K, N] multicast
])
def test_hopper_gemm_mn_major_gpu(M, N, K, dtype, ta, tb, cfg):
    import torch

    func, _ = make_gemm_hopper(M, N, K, dtype, trans_a=ta, trans_b=tb, config=cfg)
    kernel = mmaemit.compile(func)
    A, B = _inputs(M, N, K, dtype, seed=M + K)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=getattr(torch, dtype))
    kernel(A.T.contiguous() if ta else A, B if tb else B.T.contiguous(), C)
    ref = A.double() @ B.double().T
    assert not torch.isnan(C).any()
    rel = ((C.double() - ref).norm() / ref.norm()).item()
    assert rel < (3e-3 if dtype == "bfloat16" else 1e-3), rel


# ---- CpAsyncTile (sm_80 counterpart) -----------------------------------------------------------------------------
def test_cp_async_tile_errors():
    from mmaemit.pipeline import CpAsyncTile

    with pytest.raises(TileShapeError, match="multiple of the 128 threads"):
        CpAsyncTile((64, 64), "float16", (8, 64), 128)
    with pytest.raises(TileShapeError, match="16 bytes"):
        CpAsyncTile((64, 64), "float16", (64, 12), 32)
    with pytest.raises(UnsupportedConfigError, match="packed uint8"):
        CpAsyncTile((64, 64), "int4", (64, 64), 32)


def test_cp_async_tile_zero_fills_outside_the_tensor_on_the_interpreter():
    from tvm.script import tirx as T

    from mmaemit.pipeline import CpAsyncTile, cp_async_commit, cp_async_wait

    M, K, BM, BK = 40, 24, 32, 16                     # the second box row / col runs past the tensor
    lay = make_mma_swizzle_layout((2, BM, BK), "float16")
    tile = CpAsyncTile((M, K), "float16", (BM, BK), 64, lay)

    @T.prim_func
    def copy(A: T.Buffer((M, K), "float16"), O: T.Buffer((2, BM, BK), "float16")):
        T.device_entry()
        warp = T.warp_id([2])
        lane = T.lane_id([32])
        tid = T.meta_var(warp * 32 + lane)
        pool = T.SMEMPool()
        S = pool.alloc((2, BM, BK), "float16", align=1024)
        pool.commit()
        tile.load(S, 0, A, (0, 0), tid, bounds=True)
        tile.load(S, 1, A, (BM, BK), tid, bounds=True)
        cp_async_commit()
        cp_async_wait(0)
        T.cuda.cta_sync()
        for i in T.serial(2 * BM * BK // 64):
            e = T.meta_var(i * 64 + tid)
            s = T.meta_var(e // (BM * BK))
            r = T.meta_var(e % (BM * BK) // BK)
            c = T.meta_var(e % BK)
            O[s, r, c] = S[lay(s, r, c)]

    rng = np.random.default_rng(5)
    A = rng.standard_normal((M, K)).astype(np.float16)
    O = np.full((2, BM, BK), np.nan, np.float16)
    mmaemit.interpret(copy, A, O)
    want = np.zeros((2, BM, BK), np.float16)
    want[0] = A[:BM, :BK]
    want[1, :M - BM, :K - BK] = A[BM:, BK:]
    np.testing.assert_array_equal(O, want)


def test_mn_major_tma_box_that_disagrees_with_the_descriptor_is_reported(monkeypatch):
    """The interpreter's TMA-box / descriptor cross-check covers MN-major operands: B [K, N] loaded without the
    swizzle its wgmma descriptor reads is a ``tma_layout_mismatch`` naming the K row."""
    import mmaemit.kernels.gemm_hopper as GH
    from mmaemit.interpret import TmaLayoutError

    real = GH.TmaTile
    M, N, K = 128, 64, 128

    class UnswizzledB(real):
        @classmethod
        def for_layout(cls, global_shape, layout, **kw):
            t = real.for_layout(global_shape, layout, **kw)
            if tuple(global_shape) == (K, N):
                return real(t.global_shape, t.dtype, t.box, 0, multicast=t.multicast)
            return t

    cfg = HopperGemmConfig(block_n=64, stages=2, num_sms=1, epilogue_boxes=1)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)
    good, _ = make_gemm_hopper(M, N, K, "float16", "float32", trans_b=False, config=cfg)
    assert mmaemit.interpret(good, A, B, np.zeros((M, N), np.float32)).ok
    monkeypatch.setattr(GH, "TmaTile", UnswizzledB)
    bad, _ = make_gemm_hopper(M, N, K, "float16", "float32", trans_b=False, config=cfg)
    with pytest.raises(TmaLayoutError, match=r"B descriptor \(128-byte swizzle.*reads its K row"):
        mmaemit.interpret(bad, A, B, np.zeros((M, N), np.float32))
