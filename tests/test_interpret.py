"""mmaemit.interpret on whole kernels: numerics against torch/numpy on the CPU, and diagnostics that must fire."""
import time

import ml_dtypes
import numpy as np
import pytest
import torch

import interp_kernels as K
from mmaemit.errors import ArchError, ArgumentError, UnsupportedConfigError
from mmaemit.interpret import (CpAsyncBeforeWaitError, DivergenceError, InterpretReport, KernelFault,
                               OutOfBoundsError, SharedMemoryRaceError, UninitializedReadError, enabled, interpret)
from mmaemit.layouts.banks import bank_conflicts

RNG = np.random.default_rng(7)


def _randn(shape, dtype=np.float16):
    return RNG.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------------------------------
# (a), (b): numerics of the f16/bf16 tile and the 4-warp GEMM
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_single_warp_tile_matches_torch(dtype):
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    A = torch.randn(16, 16).to(tdt)
    B = torch.randn(16, 8).to(tdt)
    C = torch.zeros(16, 8)
    report = interpret(K.mma_tile_f16(dtype), A, B, C, arch="sm_80")
    torch.testing.assert_close(C, A.double().matmul(B.double()).float(), rtol=1e-5, atol=1e-5)
    assert report.ok and report.stats["mma"] == 1 and report.stats["ldmatrix"] == 2


def test_gemm_128x128x64_matches_torch_under_10s():
    A, B = torch.randn(128, 64).half(), torch.randn(64, 128).half()
    C = torch.full((128, 128), float("nan"))
    t0 = time.perf_counter()
    report = interpret(K.gemm_fp16(128, 128, 64, stages=3), A, B, C, arch="sm_80")
    elapsed = time.perf_counter() - t0
    torch.testing.assert_close(C, A.float() @ B.float(), rtol=1e-4, atol=1e-4)
    assert elapsed < 10.0, f"interpretation took {elapsed:.1f} s"
    assert report.ok and not report.diagnostics
    assert report.stats["mma"] == 4 * 4 * 8 * 4            # warps x (64/16) x (64/8) x (64/16) k-steps
    ldsm = [b for b in report.bank_conflicts if b.op.startswith("ldmatrix")]
    assert ldsm and sum(b.conflicts for b in ldsm) == 0   # the XOR swizzles are conflict-free


def test_gemm_grid_of_ctas_two_stages_and_unswizzled_layout():
    A, B = _randn((256, 128)), _randn((128, 256))
    C = np.zeros((256, 256), np.float32)
    report = interpret(K.gemm_fp16(256, 256, 128, stages=2, swizzle=False), A, B, C, arch="sm_90a")
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert report.ok and report.stats["ctas"] == 4
    assert sum(b.conflicts for b in report.bank_conflicts if b.op.startswith("ldmatrix")) > 0


# ---------------------------------------------------------------------------------------------------------------------
# (c), (d): a removed barrier and a wrong fragment index are caught
# ---------------------------------------------------------------------------------------------------------------------

def test_removed_barrier_is_reported_as_race():
    A, B = _randn((128, 128)), _randn((128, 128))
    C = np.zeros((128, 128), np.float32)
    with pytest.raises(SharedMemoryRaceError) as exc:
        interpret(K.gemm_fp16(128, 128, 128, stages=3, barrier=False), A, B, C, arch="sm_80")
    d = exc.value.diagnostic
    assert d.kind == "race" and d.buffer in ("As", "Bs") and d.warp is not None and "ldmatrix" in d.location
    report = interpret(K.gemm_fp16(128, 128, 128, stages=3, barrier=False), A, B, C, arch="sm_80",
                       on_error="report")
    races = report.of_kind("race")
    # both hazards of the missing barrier: reading data another warp's cp.async landed (RAW) and refilling a
    # stage other warps are still reading (WAR, at the cp.async issue)
    assert any("ldmatrix" in r.location for r in races) and any("T.ptx.cp(" in r.location for r in races)
    assert not report.ok


def test_wrong_fragment_index_gives_wrong_numbers():
    A, B = _randn((128, 64)), _randn((64, 128))
    C = np.zeros((128, 128), np.float32)
    report = interpret(K.gemm_fp16(128, 128, 64, frag_bug=True), A, B, C, arch="sm_80")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert report.ok                                       # memory-safe and race-free: only the numbers are wrong
    assert not np.allclose(C, ref, rtol=1e-2, atol=1e-2)
    assert np.abs(C - ref).max() > 1.0


# ---------------------------------------------------------------------------------------------------------------------
# (e): out of bounds, uninitialized shared reads, cp.async reads before the wait, divergence
# ---------------------------------------------------------------------------------------------------------------------

def test_out_of_bounds_global_read():
    with pytest.raises(OutOfBoundsError) as exc:
        interpret(K.oob_read(128, shift=1), np.ones(128, np.float32), np.zeros(128, np.float32), arch="sm_80")
    d = exc.value.diagnostic
    assert (d.buffer, d.index, d.thread, d.warp, d.lane) == ("In", 128, 127, 3, 31)
    out = np.zeros(128, np.float32)
    inp = RNG.standard_normal(130).astype(np.float32)
    assert interpret(K.oob_read(130, shift=2), inp, out, arch="sm_80").ok
    assert np.array_equal(out, inp[2:])


def test_uninitialized_shared_read():
    with pytest.raises(UninitializedReadError) as exc:
        interpret(K.uninitialized_shared_read(), np.ones(128, np.float32), np.zeros(128, np.float32), arch="sm_80")
    d = exc.value.diagnostic
    assert (d.buffer, d.index, d.thread, d.warp) == ("S", 64, 64, 2)


def test_cp_async_read_before_wait():
    tile = _randn((16, 16))
    out = np.zeros((32, 4), np.uint32)
    with pytest.raises(CpAsyncBeforeWaitError) as exc:
        interpret(K.cp_async_without_wait(wait=False), tile, out, arch="sm_80")
    assert exc.value.diagnostic.buffer == "Xs" and "ldmatrix" in exc.value.diagnostic.location
    report = interpret(K.cp_async_without_wait(wait=True), tile, out, arch="sm_80")
    assert report.ok
    bits = tile.view(np.uint16)
    for lane in (0, 9, 31):                         # ldmatrix.x4 of the 16x16 tile, read from the ISA rule
        r, c = lane // 4, 2 * (lane % 4)
        for m, (r0, c0) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
            assert int(out[lane, m]) == int(bits[r0 + r, c0 + c]) | (int(bits[r0 + r, c0 + c + 1]) << 16)


def test_divergent_collectives_and_barriers():
    with pytest.raises(DivergenceError, match="16 of 32 lanes"):
        interpret(K.divergent_mma(), np.zeros((32, 4), np.float32), arch="sm_80")
    with pytest.raises(DivergenceError, match="32 of 64 threads"):
        interpret(K.divergent_barrier(), np.zeros(64, np.float32), arch="sm_80")


def test_report_mode_collects_instead_of_raising():
    report = interpret(K.uninitialized_shared_read(), np.ones(128, np.float32), np.zeros(128, np.float32),
                       arch="sm_80", on_error="report")
    assert isinstance(report, InterpretReport)
    (d,) = report.errors
    assert d.kind == "uninitialized_read" and "uninitialized_read" in report.summary()


def test_divergent_guard_masks_threads_across_ctas():
    x = RNG.standard_normal(256).astype(np.float32)
    y = np.full(256, -7.0, np.float32)
    assert interpret(K.masked_scale(200), x, y, arch="sm_80").ok
    assert np.array_equal(y[:200], 2 * x[:200]) and np.all(y[200:] == -7.0)


# ---------------------------------------------------------------------------------------------------------------------
# (f): other mma dtypes
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a_dtype,b_dtype", [("int8", "int8"), ("uint8", "int8"), ("int8", "uint8"),
                                             ("uint8", "uint8")])
def test_int8_m16n8k32_is_exact(a_dtype, b_dtype):
    def rand(dt, shape):
        lo, hi = (-128, 128) if dt == "int8" else (0, 256)
        return RNG.integers(lo, hi, shape).astype(dt)
    A, Bt = rand(a_dtype, (16, 32)), rand(b_dtype, (8, 32))
    C0 = RNG.integers(-(2 ** 20), 2 ** 20, (16, 8)).astype(np.int32)
    C = np.zeros((16, 8), np.int32)
    assert interpret(K.mma_tile_k32_8bit(a_dtype, b_dtype), A, Bt, C0, C, arch="sm_80").ok
    assert np.array_equal(C, A.astype(np.int64) @ Bt.astype(np.int64).T + C0)


@pytest.mark.parametrize("fmt", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_fp8_mma_on_sm89_and_arch_gate(fmt):
    name = np.dtype(fmt).name
    A, Bt = _randn((16, 32), fmt), _randn((8, 32), fmt)
    C0 = _randn((16, 8), np.float32)
    C = np.zeros((16, 8), np.float32)
    assert interpret(K.mma_tile_k32_8bit(name, name), A, Bt, C0, C, arch="sm_89").ok
    np.testing.assert_allclose(C, A.astype(np.float64) @ Bt.astype(np.float64).T + C0, rtol=1e-6, atol=1e-6)
    with pytest.raises(ArchError, match="sm_89"):
        interpret(K.mma_tile_k32_8bit(name, name), A, Bt, C0, C, arch="sm_80")


def _tf32_rna(x):
    m, e = np.frexp(x.astype(np.float64))
    return np.sign(m) * np.floor(np.abs(m) * 2 ** 11 + 0.5) * 2.0 ** (e - 11)


def test_tf32_mma_with_cvt_rna():
    A, Bt = _randn((16, 8), np.float32), _randn((8, 8), np.float32)
    C = np.zeros((16, 8), np.float32)
    assert interpret(K.mma_tile_tf32(), A, Bt, C, arch="sm_80").ok
    np.testing.assert_allclose(C, _tf32_rna(A) @ _tf32_rna(Bt).T, rtol=1e-6, atol=1e-6)
    # without the cvt the mma truncates the inputs to tf32: a different (and worse) result
    C2 = np.zeros((16, 8), np.float32)
    interpret(K.mma_tile_tf32(round_inputs=False), A, Bt, C2, arch="sm_80")
    trunc = lambda x: (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)  # noqa: E731
    np.testing.assert_allclose(C2, trunc(A) @ trunc(Bt).T, rtol=1e-6, atol=1e-6)
    assert not np.array_equal(C, C2)


def test_f16_accumulate_mma():
    A, B = _randn((16, 16)), _randn((16, 8))
    C0 = _randn((16, 8))
    D = np.zeros((16, 4), np.uint32)
    assert interpret(K.mma_tile_f16_acc(), A, B, C0.view(np.uint32), D, arch="sm_80").ok
    exact = A.astype(np.float64) @ B.astype(np.float64) + C0
    got = D.view(np.float16).astype(np.float64)
    assert np.array_equal(got, exact.astype(np.float16).astype(np.float64))  # one rounding of the exact sum


@pytest.mark.parametrize("trans", [False, True])
def test_stmatrix_roundtrip_on_sm90(trans):
    X = _randn((16, 16))
    Y = np.zeros_like(X)
    assert interpret(K.stmatrix_roundtrip(trans), X, Y, arch="sm_90a").ok
    want = X.copy()
    if trans:
        for i in (0, 8):
            for j in (0, 8):
                want[i:i + 8, j:j + 8] = X[i:i + 8, j:j + 8].T
    assert np.array_equal(Y, want)
    with pytest.raises(ArchError, match="sm_90"):
        interpret(K.stmatrix_roundtrip(trans), X, Y, arch="sm_80")


# ---------------------------------------------------------------------------------------------------------------------
# (g) dequant instructions in a kernel, (h) bank conflicts
# ---------------------------------------------------------------------------------------------------------------------

def test_int4_dequant_instructions_are_bit_exact():
    W = RNG.integers(0, 2 ** 32, 32, dtype=np.uint64).astype(np.uint32)
    scale, bias = np.float16(0.5), np.float16(-3.0)
    SB = np.array([np.array([scale, scale]).view(np.uint32)[0], np.array([bias, bias]).view(np.uint32)[0]], np.uint32)
    out = np.zeros((32, 4), np.uint32)
    assert interpret(K.int4_to_f16x2(), W, SB, out, arch="sm_80").ok
    halves = out.view(np.float16).reshape(32, 4, 2)
    for k in range(4):
        for half, shift in ((0, 4 * k), (1, 4 * k + 16)):
            q = ((W >> shift) & 0xF).astype(np.float64)
            assert np.array_equal(halves[:, k, half].astype(np.float64), q * 0.5 - 3.0)


def test_ldmatrix_bank_conflicts_unswizzled_vs_swizzled():
    X = _randn((64, 64))
    expected = {}
    for swizzle in (False, True):
        lane = np.arange(32)
        row = 16 + lane % 16
        chunk = (2 + lane // 16) ^ ((row & 7) if swizzle else 0)
        expected[swizzle] = bank_conflicts([int(a) for a in row * 128 + chunk * 16], 16)
        out = np.zeros((32, 4), np.uint32)
        report = interpret(K.ldmatrix_banks(swizzle), X, out, arch="sm_80")
        (stat,) = [b for b in report.bank_conflicts if b.op == "ldmatrix.x4"]
        assert (stat.executions, stat.conflicts) == (1, expected[swizzle])
        # same data either way: the fragments hold the 16x16 block at (16, 16)
        bits = X.view(np.uint16)
        assert int(out[5, 3]) == int(bits[16 + 8 + 1, 16 + 8 + 2]) | (int(bits[16 + 8 + 1, 16 + 8 + 3]) << 16)
    assert expected[False] == 28 and expected[True] == 0


# ---------------------------------------------------------------------------------------------------------------------
# calling conventions: Kernel-like objects, torch tensors in place, MMAEMIT_INTERPRET, argument errors
# ---------------------------------------------------------------------------------------------------------------------

class _KernelLike:
    def __init__(self, prim_func, arch):
        self.prim_func = prim_func
        self.arch = arch


def test_kernel_like_object_and_torch_tensors_written_in_place():
    A, B = torch.randn(16, 16).half(), torch.randn(16, 8).half()
    C = torch.zeros(16, 8)
    ptr = C.data_ptr()
    interpret(_KernelLike(K.mma_tile_f16(), "sm_90a"), A, B, C)
    assert C.data_ptr() == ptr
    torch.testing.assert_close(C, A.float() @ B.float(), rtol=1e-5, atol=1e-5)
    # the object's arch is used: stmatrix is refused for an sm_80 kernel
    with pytest.raises(ArchError):
        interpret(_KernelLike(K.stmatrix_roundtrip(), "sm_80"), torch.zeros(16, 16).half(), torch.zeros(16, 16).half())


def test_enabled_reads_the_environment(monkeypatch):
    monkeypatch.delenv("MMAEMIT_INTERPRET", raising=False)
    assert not enabled()
    monkeypatch.setenv("MMAEMIT_INTERPRET", "1")
    assert enabled()
    monkeypatch.setenv("MMAEMIT_INTERPRET", "0")
    assert not enabled()


def test_argument_errors_name_the_expectation():
    f = K.mma_tile_f16()
    A, B, C = np.zeros((16, 16), np.float16), np.zeros((16, 8), np.float16), np.zeros((16, 8), np.float32)
    with pytest.raises(ArgumentError, match="takes 3 arguments"):
        interpret(f, A, B)
    with pytest.raises(ArgumentError, match="float32"):
        interpret(f, A, B, C.astype(np.float64))
    with pytest.raises(ArgumentError, match="dimension 1 is 9"):
        interpret(f, A, B, np.zeros((16, 9), np.float32))
    with pytest.raises(ArgumentError, match="contiguous"):
        interpret(f, A, np.zeros((8, 16), np.float16).T, C)
    with pytest.raises(ArgumentError, match="'raise', 'report'"):
        interpret(f, A, B, C, on_error="ignore")
    with pytest.raises(ArgumentError, match="PrimFunc"):
        interpret(object(), A, B, C)
    assert issubclass(KernelFault, Exception) and issubclass(OutOfBoundsError, KernelFault)


def test_unsupported_instruction_is_refused_with_the_supported_list():
    from tvm.script import tirx as T

    @T.prim_func
    def uses_bfind(Out: T.Buffer((32,), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _w = T.warp_id([1])
        lane = T.lane_id([32])
        r = T.alloc_local((1,), "uint32")
        T.ptx.bfind.u32(r[0], T.uint32(lane))
        Out[lane] = r[0]

    with pytest.raises(UnsupportedConfigError, match="'bfind'.*implemented: .*'ldmatrix'"):
        interpret(uses_bfind, np.zeros(32, np.uint32), arch="sm_80")


def test_assorted_ptx_families_in_one_kernel():
    W = RNG.integers(0, 2 ** 32, 32, dtype=np.uint64).astype(np.uint32)
    X = RNG.standard_normal((32, 2)).astype(np.float32)
    H = _randn((8, 8))
    out = np.zeros((32, 7), np.uint32)
    assert interpret(K.ptx_assortment(), W, X, H, out, arch="sm_89").ok
    lane = np.arange(32)
    r0 = W[(lane + 1) % 32]
    r1 = r0[lane ^ 1]
    assert np.array_equal(out[:, 0], r0) and np.array_equal(out[:, 1], r1)
    for i in range(32):          # prmt.f4e: four consecutive bytes of {r1, r0} starting at byte (lane & 3)
        src = ((int(r1[i]) << 32) | int(r0[i])).to_bytes(8, "little")
        assert int(out[i, 2]) == int.from_bytes(src[i % 4:i % 4 + 4], "little")
    assert np.array_equal((out[:, 3] >> 16).astype(np.uint16), X[:, 0].astype(np.float16).view(np.uint16))
    assert np.array_equal((out[:, 3] & 0xFFFF).astype(np.uint16), X[:, 1].astype(np.float16).view(np.uint16))
    f8 = lambda b: b.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float16)  # noqa: E731
    halves = np.ascontiguousarray(out[:, 4]).view(np.float16).reshape(32, 2)
    lo_ref, hi_ref = f8(W & 0xFF), f8((W >> 8) & 0xFF)
    assert np.array_equal(np.isnan(halves[:, 0]), np.isnan(lo_ref))
    assert np.array_equal(halves[:, 0][~np.isnan(lo_ref)], lo_ref[~np.isnan(lo_ref)])
    assert np.array_equal(halves[:, 1][~np.isnan(hi_ref)], hi_ref[~np.isnan(hi_ref)])
    assert np.array_equal(out[:, 5], (W >> 16) | ((W & 0xFFFF) << 16))
    hb = H.view(np.uint16).astype(np.uint32)
    assert np.array_equal(out[:, 6], hb[lane // 4, 2 * (lane % 4)] | (hb[lane // 4, 2 * (lane % 4) + 1] << 16))
    with pytest.raises(ArchError, match="e4m3x2"):          # cvt from e4m3 needs sm_89
        interpret(K.ptx_assortment(), W, X, H, out, arch="sm_80")


def test_let_shared_base_with_ptx_addr_immediates():
    A = _randn((16, 16))
    out = np.zeros((32, 4), np.uint32)
    report = interpret(K.let_base_ptx_addr(), A, out, arch="sm_80")
    assert report.ok
    bits = A.view(np.uint16).astype(np.uint32)
    lane = np.arange(32)
    assert np.array_equal(out[:, 3], bits[8 + lane // 4, 8 + 2 * (lane % 4)] | bits[8 + lane // 4, 9 + 2 * (lane % 4)] << 16)


def test_vectorized_copies_and_stores():
    A = _randn((256, 8))
    C = np.zeros((256, 8), np.float32)
    report = interpret(K.vectorized_rows(256), A, C, arch="sm_80")
    assert report.ok and report.stats["ctas"] == 2
    want = np.concatenate([np.roll(A[:128], -1, 0), np.roll(A[128:], -1, 0)]).astype(np.float32) * 3
    assert np.array_equal(C, want)
    (vec_store,) = [b for b in report.bank_conflicts if b.op == "st.shared"]
    assert vec_store.conflicts == 0 and vec_store.executions == 8       # 16-byte rows: 4 phases of 8 lanes, 2 CTAs


def test_symbolic_shape_binds_from_the_arguments():
    A = RNG.standard_normal(300).astype(np.float32)
    B = np.zeros(300, np.float32)
    report = interpret(K.symbolic_add_one(), A, B, arch="sm_80")
    assert report.stats["ctas"] == 3 and np.array_equal(B, A + 1)
    with pytest.raises(ArgumentError, match="dimension 0 is 299"):
        interpret(K.symbolic_add_one(), A, np.zeros(299, np.float32), arch="sm_80")


def test_per_lane_trip_counts_and_stepped_loops():
    out = np.zeros((32, 2), np.int32)
    assert interpret(K.thread_dependent_loops(), out, arch="sm_80").ok
    n = np.arange(32) % 5
    assert np.array_equal(out[:, 0], n * (n + 1) // 2) and np.all(out[:, 1] == 3 + 8 + 13 + 18)


def test_cp_async_zero_fill_and_small_copies():
    A = RNG.integers(1, 2 ** 32, (32, 4), dtype=np.uint64).astype(np.uint32)
    N = RNG.integers(0, 17, 32).astype(np.uint32)
    out = np.zeros((32, 6), np.uint32)
    assert interpret(K.cp_async_sizes(), A, N, out, arch="sm_80").ok
    src = A.view(np.uint8).reshape(32, 16)
    want = np.where(np.arange(16)[None, :] < N[:, None], src, 0)
    assert np.array_equal(out[:, :4].copy().view(np.uint8).reshape(32, 16), want)
    assert np.array_equal(out[:, 4:], A[:, :2])


def test_shifted_tile_reports_every_fault_in_report_mode():
    A = _randn((16, 16))
    out = np.zeros((32, 4), np.uint32)
    with pytest.raises(OutOfBoundsError, match="global buffer A"):
        interpret(K.shifted_tile(1), A, out, arch="sm_80")
    report = interpret(K.shifted_tile(1), A, out, arch="sm_80", on_error="report")
    kinds = sorted((d.kind, "ldmatrix" in d.location) for d in report.diagnostics)
    assert kinds == [("misaligned", True), ("out_of_bounds", False), ("out_of_bounds", True)]
    (cp,) = [d for d in report.of_kind("out_of_bounds") if "ldmatrix" not in d.location]
    assert (cp.buffer, cp.index, cp.thread) == ("A", 256, 30)     # lane 30 copies row 16 of a 16-row tensor
    assert interpret(K.shifted_tile(0), A, out, arch="sm_80").ok


def test_mmaemit_interpret_is_callable_whichever_import_came_first():
    import mmaemit
    import mmaemit.interpret as package

    A, B = _randn((16, 16)), _randn((16, 8))
    for fn in (mmaemit.interpret, package):
        C = np.zeros((16, 8), np.float32)
        assert fn(K.mma_tile_f16(), A, B, C, arch="sm_80").ok
        np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-5, atol=1e-5)
