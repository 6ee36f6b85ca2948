"""The autotuned entry points (mmaemit.kernels.tuned): candidate sets, pruning, defaults, the dequant reference, and
on the GPU, tuning and correctness."""
import pytest
import torch

from mmaemit.kernels import tuned as T
from mmaemit.kernels.dequant_gemm import GemvConfig, TiledConfig
from mmaemit.kernels.dequant_gemm_wgmma import WgmmaConfig
from mmaemit.kernels.gemm_hopper import HopperGemmConfig
from mmaemit.kernels.gemm_mma import GemmConfig


@pytest.fixture(autouse=True)
def _env(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MMAEMIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tuned-cache"))


def valid(tk, *args, **kw):
    return [p["config"] for p, reason in tk.candidates(*args, **kw) if reason is None]


@pytest.mark.parametrize("dtype, n", [("float16", 12), ("bfloat16", 12), ("int8", 12), ("float8_e4m3fn", 12),
                                      ("int4", 8)])
def test_gemm_candidates_cover_the_sweeps_and_contain_the_default(dtype, n):
    # the mma.sync sweep (16-bit M/N-major problems on sm_90a also get the Hopper family's candidates)
    cands = [c for c in valid(T.gemm_kernel, 4096, 4096, 4096, dtype, arch="sm_90a") if isinstance(c, GemmConfig)]
    assert len(cands) == n and len(set(cands)) == n
    assert T.gemm_kernel.default_params(4096, 4096, 4096, dtype, arch="sm_80")["config"] in cands
    assert all(isinstance(c, GemmConfig) and c.stages in (3, 4) for c in cands)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "float8_e4m3fn"])
def test_k_contiguous_gemms_on_hopper_add_the_wgmma_family(dtype):
    from mmaemit.kernels.gemm_hopper import HopperGemmConfig

    cands = valid(T.gemm_kernel, 4096, 4096, 4096, dtype, trans_b=True, arch="sm_90a")
    hopper = [c for c in cands if isinstance(c, HopperGemmConfig)]
    assert len(hopper) == 8 and len(cands) == 20
    assert isinstance(T.gemm_kernel.default_params(4096, 4096, 4096, dtype, trans_b=True, arch="sm_90a")["config"],
                      HopperGemmConfig)
    assert not [c for c in valid(T.gemm_kernel, 4096, 4096, 4096, dtype, trans_b=True, arch="sm_80")
                if isinstance(c, HopperGemmConfig)]
    mn = [c for c in valid(T.gemm_kernel, 4096, 4096, 4096, dtype, arch="sm_90a") if isinstance(c, HopperGemmConfig)]
    # B [K, N] (M/N-contiguous): wgmma reads it for 16-bit dtypes only (and it is then the default too)
    sixteen = dtype in ("float16", "bfloat16")
    assert len(mn) == (8 if sixteen else 0)
    assert isinstance(T.gemm_kernel.default_params(4096, 4096, 4096, dtype, arch="sm_90a")["config"],
                      HopperGemmConfig) == sixteen
    if mn:
        func, _ = T.build_gemm(512, 768, 1024, dtype, trans_a=True, arch="sm_90a", config=mn[0])
        text = func.script()
        assert "(1024, 512)" in text and "(1024, 768)" in text, text[:400]   # A [K, M], B [K, N]
    func, _ = T.build_gemm(1024, 1024, 1024, dtype, trans_b=True, arch="sm_90a", config=hopper[-1])
    out = T._out_dtype(dict(dtype=dtype))
    assert str(func.params[2].dtype) == out  # every family fills the same C


def test_gemm_prune_reasons_name_the_limit():
    reasons = [r for _, r in T.gemm_kernel.candidates(4096, 4096, 4096, "float16", arch="sm_86") if r]
    assert reasons and all("shared memory, sm_86 has 99 KiB" in r for r in reasons)
    reasons = [r for _, r in T.gemm_kernel.candidates(384, 4096, 4096, "float16", arch="sm_90a") if r]
    assert any("M=384 is not a multiple of the tile's 256" in r for r in reasons)


def test_gemm_key_is_the_whole_problem():
    key = T.gemm_kernel.key(4096, 2048, 1024, "int8", trans_b=True, arch="sm_90a")
    assert key == {"M": 4096, "N": 2048, "K": 1024, "dtype": "int8", "b_dtype": None, "out_dtype": None,
                   "trans_a": False, "trans_b": True, "arch": "sm_90a"}


def test_gemm_candidates_build_and_smem_estimate_matches_the_kernel():
    import mmaemit

    for cfg in valid(T.gemm_kernel, 1024, 1024, 512, "float16", arch="sm_90a")[:3]:
        func, _ = T.build_gemm(1024, 1024, 512, "float16", arch="sm_90a", config=cfg)
        src = mmaemit.compile(func, target="sm_90a").cuda_source
        assert "gemm_kernel" in src


def test_dequant_candidates_by_m_and_arch():
    assert all(isinstance(c, GemvConfig) for c in valid(T.dequant_gemm_kernel, 16, 8192, 8192, arch="sm_90a"))
    big = valid(T.dequant_gemm_kernel, 256, 8192, 8192, arch="sm_90a")
    assert {type(c) for c in big} == {TiledConfig, WgmmaConfig}
    assert {type(c) for c in valid(T.dequant_gemm_kernel, 256, 8192, 8192, arch="sm_80")} == {TiledConfig}
    for M in (1, 16, 64, 256, 4096):
        default = T.dequant_gemm_kernel.default_params(M, 8192, 8192, arch="sm_90a")["config"]
        assert default in valid(T.dequant_gemm_kernel, M, 8192, 8192, arch="sm_90a"), M
    assert T.dequant_gemm_kernel.key(5, 8192, 8192)["M"] == 8 and T.dequant_gemm_kernel.key(16, 64, 64)["M"] == 16
    assert T.dequant_gemm_kernel.key(17, 64, 64)["M"] == 32 and T.dequant_gemm_kernel.key(1, 64, 64)["M"] == 1


@pytest.mark.parametrize("fmt, zeros", [("int4", None), ("uint4", "original"), ("uint4", "rescale"),
                                        ("uint4", "quantized"), ("nf4", None), ("float8_e4m3fn", None)])
def test_dequant_reference_matches_the_quantized_weight(fmt, zeros):
    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments

    torch.manual_seed(0)
    N, K, M = 32, 256, 3
    qw = D.quantize(torch.randn(N, K), D.QuantScheme(fmt, group_size=64, zeros_mode=zeros))
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, K).half()
    args = dict(M=M, N=N, K=K, group_size=kw["group_size"], dtype="float16", weight_format=fmt, zeros_mode=zeros,
                arch="sm_90a")
    got = T.dequant_reference(args, (A, *tensors, torch.empty(M, N, dtype=torch.float16)))
    want = A.double() @ qw.dequantize("float32").double().T
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4)


def test_autotune_off_uses_the_hand_picked_default(monkeypatch):
    monkeypatch.setenv("MMAEMIT_AUTOTUNE", "0")
    r = T.gemm_kernel.tune(4096, 4096, 4096, "bfloat16", arch="sm_80")
    assert r.source == "default" and r.winner == {"config": GemmConfig()}
    r = T.gemm_kernel.tune(4096, 4096, 4096, "bfloat16", arch="sm_90a")
    assert r.source == "default" and isinstance(r.winner["config"], HopperGemmConfig)


def test_a_new_family_joins_the_candidates():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class OtherConfig:
        tile: int = 64

    fam = T.GemmFamily("other", OtherConfig, lambda *a, **k: None,
                       lambda args: [OtherConfig()] if args["arch"] == "sm_90a" else [])
    T.register_gemm_family(fam)
    try:
        assert OtherConfig() in valid(T.gemm_kernel, 4096, 4096, 4096, "float16", arch="sm_90a")
        assert OtherConfig() not in valid(T.gemm_kernel, 4096, 4096, 4096, "float16", arch="sm_80")
    finally:
        T.GEMM_FAMILIES[:] = [f for f in T.GEMM_FAMILIES if f.name != "other"]


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.heavy
@pytest.mark.parametrize("dtype, trans_b", [("float16", False), ("int8", True)])
def test_tuned_gemm_on_the_gpu(dtype, trans_b, monkeypatch):
    from mmaemit.kernels.gemm_mma import random_inputs, reference

    monkeypatch.setenv("MMAEMIT_AUTOTUNE", "1")
    M = N = K = 1024
    A, B = random_inputs(M, N, K, dtype, trans_b=trans_b, seed=1)
    C = T.tuned_gemm(A, B, trans_b=trans_b)
    ref = reference(A, B, trans_b=trans_b)
    if dtype == "int8":
        assert torch.equal(C.cpu().long(), ref)
    else:
        assert ((C.float() - ref).norm() / ref.norm()).item() < 2e-3
    r = T.gemm_kernel.tune(M, N, K, dtype, trans_b=trans_b, arch=T._arch_of(A))
    assert r.source == "table" and r.time_s > 0
    assert all(c.status == "timed" for c in r.candidates if c.status != "pruned"), r.table()


@pytest.mark.gpu
@pytest.mark.heavy
@pytest.mark.parametrize("M", [1, 64, 256])
def test_tuned_dequant_gemm_on_the_gpu(M, monkeypatch):
    monkeypatch.setenv("MMAEMIT_AUTOTUNE", "1")
    args = dict(M=M, N=4096, K=4096, group_size=128, dtype="float16", weight_format="int4", zeros_mode=None,
                arch=T._arch_of(torch.empty(1, device="cuda")))
    A, W, S, C = T.dequant_inputs(args)
    out = T.tuned_dequant_gemm(A, W, S, group_size=128, weight_format="int4")
    ref = T.dequant_reference(args, (A, W, S, C))
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-3


@pytest.mark.parametrize("dtype, trans_b", [("int8", True), ("int4", False), ("uint8", False)])
def test_integer_gemm_reference_is_exact(dtype, trans_b):
    from mmaemit.kernels.gemm_mma import random_inputs, reference

    A, B = random_inputs(128, 64, 256, dtype, trans_b=trans_b, device="cpu", seed=1)
    args = dict(M=128, N=64, K=256, dtype=dtype, b_dtype=None, trans_a=False, trans_b=trans_b)
    assert torch.equal(T.gemm_reference(args, (A, B)), reference(A, B, False, trans_b, dtype=dtype))


@pytest.mark.gpu
@pytest.mark.heavy
def test_a_hanging_gpu_kernel_is_killed_and_the_next_one_is_measured(monkeypatch, tmp_path):
    import time

    import autotune_gpu_kernels as G
    from mmaemit.tuning import autotune

    monkeypatch.setenv("MMAEMIT_CACHE_DIR", str(tmp_path))
    # spin 256: 65536 dependent steps of a quadratic recurrence per thread (an affine one was folded by ptxas and
    # lost to spin 0 under load once), a wide margin whatever else shares the GPU (spin 4 and spin 64 were within
    # the noise of other tests' kernels under pytest-xdist -n 8 and each won once)
    # run_timeout 10 s: the hanging candidate holds the GPU (time-sliced with the other pytest workers) that long
    tk = autotune(spin=[0, 1 << 20, 256], inputs=G.spin_inputs, reference=G.spin_reference, outputs=[1],
                  run_timeout=10, confirm=0)(G.spin_kernel)
    t0 = time.perf_counter()
    r = tk.tune(1 << 20, force=True)
    by = {c.params["spin"]: c for c in r.candidates}
    assert by[1 << 20].status == "run-timeout", r.table()
    assert by[0].status == by[256].status == "timed" and r.winner == {"spin": 0}
    assert time.perf_counter() - t0 < 120
