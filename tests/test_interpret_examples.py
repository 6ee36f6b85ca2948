"""Every example kernel runs on the CPU interpreter in CI and matches torch; diagnostics fire on emitter kernels."""
import itertools

import pytest
import torch
from tvm.script import tirx as T

from mmaemit import TensorCoreIntrinEmitter, make_mma_swizzle_layout
from mmaemit.kernels.gemm_mma import LAYOUTS, GemmConfig, make_gemm, random_inputs, reference
from mmaemit.interpret import interpret
from mmaemit.interpret.diagnostics import SharedMemoryRaceError

from test_gemm_example import CONFIGS


def _run(func, arch, A, B, C, **kw):
    report = interpret(func, A, B, C, arch=arch, **kw)
    return report


def _rel(C, ref):
    return ((C.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype, layout, epilogue, arch", [
    (d, lay, e, a) for d, lay, e, a in itertools.product(("float16", "bfloat16"), sorted(LAYOUTS), ("shared", "global"),
                                                         ("sm_80", "sm_90a"))])
def test_gemm_example_on_the_interpreter(dtype, layout, epilogue, arch):
    ta, tb = LAYOUTS[layout]
    M, N, K = 128, 256, 96
    func, _ = make_gemm(M, N, K, dtype, trans_a=ta, trans_b=tb, config=GemmConfig(epilogue=epilogue), arch=arch)
    A, B = random_inputs(M, N, K, dtype, ta, tb, device="cpu")
    C = torch.full((M, N), float("nan"), dtype=A.dtype)
    report = _run(func, arch, A, B, C)
    assert report.ok and not report.errors
    assert not torch.isnan(C).any()
    assert _rel(C, reference(A, B, ta, tb)) < (1e-3 if dtype == "float16" else 8e-3)
    # the swizzled tiles make every ldmatrix / stmatrix / epilogue shared access conflict-free in the real kernel
    assert report.total_bank_conflicts == 0, report.summary()


@pytest.mark.parametrize("config", CONFIGS)
def test_gemm_configs_on_the_interpreter(config):
    M, N, K = 128, 256, 128
    func, _ = make_gemm(M, N, K, "float16", trans_b=True, config=config, arch="sm_90a")
    A, B = random_inputs(M, N, K, "float16", False, True, device="cpu")
    C = torch.full((M, N), float("nan"), dtype=A.dtype)
    report = _run(func, "sm_90a", A, B, C)
    assert report.ok
    assert _rel(C, reference(A, B, False, True)) < 1e-3


def test_float16_accumulate_and_float32_output_on_the_interpreter():
    M, N, K = 128, 128, 64
    for acc, out in (("float16", "float16"), ("float32", "float32"), ("float16", "float32")):
        func, _ = make_gemm(M, N, K, "float16", out_dtype=out, accum_dtype=acc, arch="sm_90a")
        A, B = random_inputs(M, N, K, "float16", device="cpu")
        C = torch.full((M, N), float("nan"), dtype=getattr(torch, out))
        assert _run(func, "sm_90a", A, B, C).ok
        assert _rel(C, reference(A, B)) < (5e-3 if acc == "float16" else 1e-5), (acc, out)


def _tile_gemm(sync_after_compute=True, swizzle_load=True):
    """The quick-start kernel, optionally broken: the second barrier removed, or ldmatrix reading unswizzled."""
    M, N, K = 64, 64, 64
    em = TensorCoreIntrinEmitter("float16", "float16", "float32", b_transposed=True, block_row_warps=2,
                                 block_col_warps=2, warp_row_tiles=32, warp_col_tiles=32, chunk=32)
    BM, BN, BK, NT = em.block_m, em.block_n, em.block_k, em.threads
    swz = make_mma_swizzle_layout((BM, BK), "float16")
    load_layout = swz if swizzle_load else None

    @T.prim_func
    def gemm(A: T.Buffer((M, K), "float16"), B: T.Buffer((N, K), "float16"), C: T.Buffer((M, N), "float32")):
        T.device_entry()
        bn, bm = T.cta_id([N // BN, M // BM])
        warp = T.warp_id([em.num_warps])
        lane = T.lane_id([32])
        As = T.alloc_buffer((BM, BK), "float16", scope="shared")
        Bs = T.alloc_buffer((BN, BK), "float16", scope="shared")
        a, b, c = em.alloc_fragments()
        em.fill_accumulators(c)
        for ko in T.serial(K // BK):
            for t in T.serial(BM * BK // NT):
                e = T.meta_var(t * NT + warp * 32 + lane)
                As[swz(e // BK, e % BK)] = A[bm * BM + e // BK, ko * BK + e % BK]
                Bs[swz(e // BK, e % BK)] = B[bn * BN + e // BK, ko * BK + e % BK]
            T.cuda.cta_sync()
            for ki in T.unroll(em.k_steps):
                em.ldmatrix_a(a, As, ki, warp=warp, lane=lane, layout=load_layout)
                em.ldmatrix_b(b, Bs, ki, warp=warp, lane=lane, layout=load_layout)
                em.mma(a, b, c)
            if sync_after_compute:
                T.cuda.cta_sync()
        em.stmatrix(c, C, warp=warp, lane=lane, block_row=bm, block_col=bn)

    return gemm, (M, N, K)


def test_removed_barrier_is_reported_as_a_race():
    func, (M, N, K) = _tile_gemm(sync_after_compute=False)
    A, B = random_inputs(M, N, K, "float16", False, True, device="cpu")
    C = torch.full((M, N), float("nan"))
    with pytest.raises(SharedMemoryRaceError) as info:
        interpret(func, A, B, C, arch="sm_80")
    assert "As" in str(info.value) or "Bs" in str(info.value)
    good, _ = _tile_gemm()
    assert interpret(good, A, B, C, arch="sm_80").ok
    assert _rel(C, reference(A, B, False, True)) < 1e-3


def test_wrong_layout_in_ldmatrix_is_caught_numerically():
    func, (M, N, K) = _tile_gemm(swizzle_load=False)
    A, B = random_inputs(M, N, K, "float16", False, True, device="cpu")
    C = torch.full((M, N), float("nan"))
    interpret(func, A, B, C, arch="sm_80")
    assert _rel(C, reference(A, B, False, True)) > 0.1


def test_env_switch_runs_kernel_calls_on_the_interpreter(monkeypatch):
    """MMAEMIT_INTERPRET=1: Kernel.__call__ takes CPU tensors and runs the same kernel on the interpreter."""
    import mmaemit

    monkeypatch.setenv("MMAEMIT_INTERPRET", "1")
    M, N, K = 128, 128, 64
    func, _ = make_gemm(M, N, K, "float16", arch="sm_90a")
    kernel = mmaemit.compile(func, target="sm_90a")
    A, B = random_inputs(M, N, K, "float16", device="cpu")
    C = torch.full((M, N), float("nan"), dtype=A.dtype)
    kernel(A, B, C)
    assert _rel(C, reference(A, B)) < 1e-3
    report = mmaemit.interpret(kernel, A, B, torch.full((M, N), float("nan"), dtype=A.dtype))
    assert report.ok and report.arch == "sm_90a"
