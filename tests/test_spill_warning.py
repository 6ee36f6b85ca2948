"""Spills are never silent (issue 12): ``mmaemit.compile`` warns with a ``PerformanceWarning`` naming registers and
bytes when ptxas reports spill stores / loads or a stack frame. nvcc only compiles here (no GPU needed)."""
import pathlib
import re
import runpy
import warnings

import pytest
from tvm.script import tirx as T

import mmaemit
from mmaemit import PerformanceWarning, TensorCoreIntrinEmitter
from mmaemit.errors import ToolchainError
from mmaemit.runtime import ResourceUsage, toolchain

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _nvcc_missing():
    try:
        toolchain.find_nvcc()
    except ToolchainError:
        return True
    return False


pytestmark = pytest.mark.skipif(_nvcc_missing(), reason="needs nvcc (compile only)")


def readme_style_gemm(dtype="bfloat16", arch="sm_90a", M=256, N=256, K=512):
    """The quick start's kernel with A stored [K, M], B [K, N], a 64x256 CTA of 1x4 warps of 64x64 and chunk 64:
    64 x 64 accumulators per warp (128 registers per lane) plus the fragments need more than 255 registers."""
    acc = "int32" if dtype == "int8" else "float32"
    em = TensorCoreIntrinEmitter(dtype, dtype, acc, a_transposed=True, b_transposed=False, block_row_warps=1,
                                 block_col_warps=4, warp_row_tiles=64, warp_col_tiles=64, chunk=64, arch=arch)
    BM, BN, BK, NT = em.block_m, em.block_n, em.block_k, em.threads
    swa = em.shared_swizzle("A", em.a_shared_shape, dtype)        # [BK, BM]
    swb = em.shared_swizzle("B", em.b_shared_shape, dtype)        # [BK, BN]

    @T.prim_func
    def gemm(A: T.Buffer((K, M), dtype), B: T.Buffer((K, N), dtype), C: T.Buffer((M, N), acc)):
        T.device_entry()
        bn, bm = T.cta_id([N // BN, M // BM])
        warp = T.warp_id([em.num_warps])
        lane = T.lane_id([32])
        As = T.alloc_buffer(em.a_shared_shape, dtype, scope="shared")
        Bs = T.alloc_buffer(em.b_shared_shape, dtype, scope="shared")
        a, b, c = em.alloc_fragments()
        em.fill_accumulators(c)
        for ko in T.serial(K // BK):
            for t in T.serial(BK * BM // NT):
                e = T.meta_var(t * NT + warp * 32 + lane)
                As[swa(e // BM, e % BM)] = A[ko * BK + e // BM, bm * BM + e % BM]
            for t in T.serial(BK * BN // NT):
                e = T.meta_var(t * NT + warp * 32 + lane)
                Bs[swb(e // BN, e % BN)] = B[ko * BK + e // BN, bn * BN + e % BN]
            T.cuda.cta_sync()
            for ki in T.unroll(em.k_steps):
                em.ldmatrix_a(a, As, ki, warp=warp, lane=lane, layout=swa)
                em.ldmatrix_b(b, Bs, ki, warp=warp, lane=lane, layout=swb)
                em.mma(a, b, c)
            T.cuda.cta_sync()
        em.stmatrix(c, C, warp=warp, lane=lane, block_row=bm, block_col=bn)

    return gemm


@pytest.mark.parametrize("dtype, arch", [("bfloat16", "sm_90a"), ("int8", "sm_80")])
def test_spilling_gemm_warns_with_registers_and_bytes(dtype, arch):
    func = readme_style_gemm(dtype, arch)
    with pytest.warns(PerformanceWarning) as caught:
        kernel = mmaemit.compile(func, target=arch)
    msgs = [str(w.message) for w in caught if issubclass(w.category, PerformanceWarning)]
    assert len(msgs) == 1, msgs
    use = kernel.resource_usage()
    assert use.registers == 255 and use.spill_store_bytes > 0 and use.stack_frame_bytes > 0, use
    if dtype == "bfloat16":
        assert 188 <= use.spill_store_bytes <= 356, use       # the figures of issue 12 (nvcc 13.0 here: 188)
    msg = msgs[0]
    assert f"{use.registers} registers" in msg and f"{use.spill_store_bytes} bytes spill stores" in msg
    assert f"{use.spill_load_bytes} bytes spill loads" in msg and f"{use.stack_frame_bytes} bytes stack frame" in msg
    assert arch in msg and "resource_usage()" in msg
    assert caught[0].filename == __file__          # points at the caller's compile line
    # the switch: the keyword turns the check off
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        mmaemit.compile(func, target=arch, check_spills=False)


def test_spill_check_env_switch_and_missing_nvcc(monkeypatch):
    func = readme_style_gemm()
    monkeypatch.setenv("MMAEMIT_CHECK_SPILLS", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        mmaemit.compile(func, target="sm_90a")
    monkeypatch.setenv("MMAEMIT_CHECK_SPILLS", "1")
    with pytest.warns(PerformanceWarning, match=r"255 registers"):
        mmaemit.compile(func, target="sm_90a")

    def no_nvcc():
        raise ToolchainError("nvcc not found")

    monkeypatch.setattr(toolchain, "find_nvcc", no_nvcc)   # no report, no check: compile still works, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        assert mmaemit.compile(func, target="sm_90a").cuda_source


def test_quick_start_configuration_stays_spill_free():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        ns = runpy.run_path(str(ROOT / "examples" / "quickstart.py"))   # compiles it (sm_80 without a GPU)
        for arch in ("sm_80", "sm_90a"):
            use = mmaemit.compile(ns["gemm"], target=arch).resource_usage()
            assert not use.uses_local_memory and use.registers < 255, (arch, use)


def test_resource_usage_describes_local_memory():
    clean = ResourceUsage("k", 64, 8192, 0, 0, 0, 1)
    frame_only = ResourceUsage("k", 40, 0, 64, 0, 0, 0)      # a dynamically indexed register array, no spills
    spills = ResourceUsage("k", 255, 0, 192, 188, 188, 1)
    assert not clean.uses_local_memory and frame_only.uses_local_memory and spills.uses_local_memory
    assert re.search(r"255 registers, 188 bytes spill stores, 188 bytes spill loads, 192 bytes stack frame",
                     spills.describe())
