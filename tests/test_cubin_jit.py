"""compile(cubin_cache=True): TVM's CUDA JIT callback routed through mmaemit's cubin cache, and the tuning backend's
compile step in a worker process (both run without a GPU: nvcc only compiles)."""
import pytest

import mmaemit
from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm
from mmaemit.runtime import build, toolchain

CALLBACK = "tvm_callback_cuda_compile"


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MMAEMIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jit-cache"))


@pytest.fixture(scope="module")
def small_gemm_source():
    func, _ = make_gemm(128, 128, 64, "float16", config=GemmConfig(), arch="sm_90a")
    return mmaemit.compile(func, target="sm_90a").cuda_source


def test_cached_jit_installs_and_restores_the_callback(small_gemm_source, monkeypatch):
    import tvm_ffi

    calls = []
    real = toolchain._invoke_nvcc
    monkeypatch.setattr(toolchain, "_invoke_nvcc", lambda cmd: calls.append(cmd) or real(cmd))
    before = tvm_ffi.get_global_func(CALLBACK, allow_missing=True)
    toolchain.COMPILE_CACHE.clear_memory()
    with build.cached_jit("sm_90a"):
        jit = tvm_ffi.get_global_func(CALLBACK)
        assert before is None or not jit.same_as(before)
        cubin = bytes(jit(small_gemm_source))     # called through the FFI, as TVM's CUDA module does
        assert cubin[:4] == b"\x7fELF"
        n = len(calls)
        toolchain.COMPILE_CACHE.clear_memory()    # a new process: only the disk cache is left
        assert bytes(jit(small_gemm_source)) == cubin
        assert len(calls) == n                    # served from $MMAEMIT_CACHE_DIR, no nvcc
    after = tvm_ffi.get_global_func(CALLBACK, allow_missing=True)
    assert (after is None) == (before is None) and (before is None or after.same_as(before))


def test_the_jit_cubin_is_the_one_sass_reads(small_gemm_source):
    func, _ = make_gemm(128, 128, 64, "float16", config=GemmConfig(), arch="sm_90a")
    kernel = mmaemit.compile(func, target="sm_90a", cubin_cache=True)
    jit = build.jit_through_cubin_cache("sm_90a")
    assert bytes(jit(kernel.cuda_source)) == kernel.cubin().data


def test_cubin_cache_switch(monkeypatch):
    monkeypatch.delenv("MMAEMIT_CUBIN_CACHE", raising=False)
    assert not build.cubin_cache_enabled()
    monkeypatch.setenv("MMAEMIT_CUBIN_CACHE", "1")
    assert build.cubin_cache_enabled() and not build.cubin_cache_enabled(False)


def small_gemm_builder(M, N, K, *, stages):
    return make_gemm(M, N, K, "float16", config=GemmConfig(stages=stages), arch="sm_90a")


def test_cuda_backend_compiles_candidates_in_worker_processes():
    from mmaemit.tuning import CudaBackend
    from mmaemit.tuning import tasks
    from mmaemit.tuning.pool import FunctionRef, WorkerPool, wait_any

    backend = CudaBackend(arch="sm_90a")
    pool = WorkerPool(2, preload=backend.preload)
    try:
        for stages in (2, 3):
            pool.submit(stages, tasks.compile_candidate,
                        (backend, FunctionRef.of(small_gemm_builder), {"M": 128, "N": 128, "K": 64},
                         {"stages": stages}, tasks.mmaemit_environment()), timeout=300)
        pool.submit(1, tasks.compile_candidate,
                    (backend, FunctionRef.of(small_gemm_builder), {"M": 128, "N": 128, "K": 64}, {"stages": 1},
                     tasks.mmaemit_environment()), timeout=300)
        got = {}
        while len(got) < 3:
            for r in wait_any([pool], 300):
                got[r.tag] = r
    finally:
        pool.shutdown()
    for stages in (2, 3):
        assert got[stages].status == "ok", got[stages].value
        info = got[stages].value["info"]
        assert 0 < info["registers"] <= 255 and info["spill_bytes"] == 0
    # an invalid configuration is an mmaemit error (the tuner lists it as "invalid")
    assert got[1].status == "error" and got[1].value["mmaemit_error"] and "stages" in got[1].value["message"]
