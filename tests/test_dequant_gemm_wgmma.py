"""The sm_90a wgmma dequant GEMM: SASS shape on the CPU (wgmma issued back to back, not serialized), errors, dispatch,
and correctness on the GPU across formats, zero modes, dtypes, group sizes, tile configurations and ragged M."""
import warnings

import pytest
import torch

import mmaemit
from mmaemit.runtime.sass import wgmma_accumulator_hazards
from mmaemit import dequant as D
from mmaemit.dequant.kernel_layout import kernel_arguments
from mmaemit.errors import ArchError, PerformanceWarning, TileShapeError
from mmaemit.kernels.dequant_gemm import TiledConfig, make_dequant_gemm
from mmaemit.kernels.dequant_gemm_wgmma import WgmmaConfig, default_wgmma_config, make_dequant_gemm_wgmma


def _sass_counts(kernel):
    hist = kernel.opcode_histogram("sm_90a")
    hgmma = sum(v for k, v in hist.items() if k.startswith("HGMMA"))
    arrive = sum(v for k, v in hist.items() if k.startswith("WARPGROUP.ARRIVE"))
    return hist, hgmma, arrive


@pytest.mark.parametrize("cfg, dtype", [(WgmmaConfig(128, 4, 1, 4), "float16"), (WgmmaConfig(64, 2, 1, 4), "bfloat16"),
                                        (WgmmaConfig(256, 2, 1, 3), "float16")])
def test_wgmma_issued_back_to_back(cfg, dtype):
    func, _ = make_dequant_gemm_wgmma(4096, 8192, 8192, 128, dtype, cfg)
    kernel = mmaemit.compile(func, target="sm_90a")
    hist, hgmma, arrive = _sass_counts(kernel)
    ab = "F32" if dtype == "float16" else "F32.BF16"
    assert hist.get(f"HGMMA.64x{cfg.block_t}x16.{ab}", 0) == hgmma == 4, hist
    # one warpgroup arrive per chunk: ptxas did not serialize the four wgmma (C7514 gives one arrive per wgmma)
    assert arrive == 1, hist
    assert wgmma_accumulator_hazards(kernel.sass("sm_90a")) == []
    assert kernel.resource_usage("sm_90a").spill_store_bytes == 0
    assert hist.get("LDGSTS.E.BYPASS.128", 0) > 0 and hist.get("LDGSTS.E", 0) > 0   # weights 16 B, activations 4 B


def test_m64_per_wg_above_one_warns_that_ptxas_serializes():
    with pytest.warns(PerformanceWarning, match="serializes"):
        make_dequant_gemm_wgmma(256, 512, 1024, 128, config=WgmmaConfig(128, 2, 2, 4))


def test_wgmma_path_errors():
    with pytest.raises(ArchError, match="sm_90a"):
        make_dequant_gemm_wgmma(256, 512, 1024, arch="sm_80")
    with pytest.raises(ArchError, match="sm_90a"):
        make_dequant_gemm_wgmma(256, 512, 1024, arch="sm_90")      # wgmma needs the arch-specific target
    with pytest.raises(TileShapeError, match="multiple of 8"):
        make_dequant_gemm_wgmma(256, 512, 1024, config=WgmmaConfig(block_t=100))
    with pytest.raises(TileShapeError, match="256"):
        make_dequant_gemm_wgmma(256, 640, 1024, config=WgmmaConfig(128, 4, 1, 4))   # N % (64 * 4) != 0
    with pytest.raises(mmaemit.UnsupportedConfigError, match="stages"):
        make_dequant_gemm_wgmma(256, 512, 1024, config=WgmmaConfig(stages=2))
    with pytest.raises(mmaemit.UnsupportedConfigError, match="weight_format"):
        make_dequant_gemm_wgmma(256, 512, 1024, weight_format="mxfp4")


def test_dispatch_picks_wgmma_on_hopper_for_large_m():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, cfg = make_dequant_gemm(1024, 512, 2048, arch="sm_90a")
        assert cfg == default_wgmma_config(1024)
        _, em = make_dequant_gemm(128, 512, 2048, arch="sm_90a")        # M <= 128: mma.sync tiled
        assert em.block_m == 128
        _, em = make_dequant_gemm(1024, 512, 2048, arch="sm_80")         # no wgmma: mma.sync tiled
        assert em.block_m == 128
        _, em = make_dequant_gemm(1024, 512, 2048, config=TiledConfig(), arch="sm_90a")
        assert em.block_m == 128


def _problem(M, N, K, group, dtype, fmt="int4", mode=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g).to(dtype)
    scheme = D.QuantScheme(fmt, group_size=group, zeros_mode=mode) if mode else D.QuantScheme(fmt, group_size=group)
    qw = D.quantize(w, scheme)
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).to(dtype)
    ref = A.double() @ qw.dequantize().double().T
    return [A, *tensors], kw, ref


@pytest.mark.gpu
@pytest.mark.parametrize("M, fmt, mode, group, dtype, cfg", [
    (300, "int4", None, 128, torch.float16, WgmmaConfig(128, 4, 1, 4)),
    (1024, "int4", None, 64, torch.bfloat16, WgmmaConfig(128, 4, 1, 4)),
    (256, "int4", None, -1, torch.float16, WgmmaConfig(256, 2, 1, 3)),
    (129, "uint4", "quantized", 128, torch.float16, WgmmaConfig(64, 2, 1, 4)),
    (200, "uint4", "original", 64, torch.bfloat16, WgmmaConfig(64, 2, 1, 4)),
    (77, "uint4", "rescale", 128, torch.float16, WgmmaConfig(32, 1, 1, 5)),
    (160, "float4_e2m1fn", None, 128, torch.float16, WgmmaConfig(64, 2, 1, 4)),
    (160, "nf4", None, 128, torch.bfloat16, WgmmaConfig(64, 2, 1, 4)),
    (5, "int4", None, 128, torch.float16, WgmmaConfig(8, 1, 1, 3)),
    (300, "int4", None, 128, torch.float16, WgmmaConfig(128, 2, 2, 4)),
    (256, "int8", None, 128, torch.float16, WgmmaConfig(64, 2, 1, 4)),
    (144, "int8", None, 128, torch.bfloat16, WgmmaConfig(64, 2, 1, 4)),
    (144, "float8_e4m3fn", None, 128, torch.float16, WgmmaConfig(64, 2, 1, 4)),
    (200, "uint8", "quantized", 128, torch.float16, WgmmaConfig(64, 2, 1, 4)),
    (256, "int2", None, 128, torch.float16, WgmmaConfig(128, 4, 1, 4)),
    (144, "uint2", "original", 64, torch.bfloat16, WgmmaConfig(64, 2, 1, 4)),
    (144, "uint1", "rescale", 128, torch.float16, WgmmaConfig(64, 2, 1, 4)),
])
def test_wgmma_path_matches_reference_on_gpu(M, fmt, mode, group, dtype, cfg):
    N, K = 512, 2048 + 64 if group == 64 else 2048
    args, kw, ref = _problem(M, N, K, group, dtype, fmt, mode, seed=M)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceWarning)
        func, _ = make_dequant_gemm_wgmma(M, N, K, dtype=str(dtype)[6:], config=cfg, **kw)
    kernel = mmaemit.compile(func)
    C = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
    kernel(*[t.cuda() for t in args], C)
    assert not torch.isnan(C).any()
    rel = ((C.double().cpu() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), rel


@pytest.mark.parametrize("M, cfg, dtype, fmt, mode", [
    (40, WgmmaConfig(32, 1, 1, 3), torch.float16, "int4", None),
    (20, WgmmaConfig(16, 2, 1, 3), torch.bfloat16, "uint4", "quantized"),
    (24, WgmmaConfig(16, 1, 1, 3), torch.float16, "int8", None),
    (17, WgmmaConfig(16, 1, 1, 4), torch.float16, "int2", None),
])
def test_wgmma_path_on_the_interpreter(M, cfg, dtype, fmt, mode):
    """The exact sm_90a kernel on the CPU: wgmma commit/wait model, fence.proxy.async and race checks all pass."""
    N, K = 64 * cfg.warpgroups, 256
    args, kw, ref = _problem(M, N, K, 128, dtype, fmt, mode, seed=M)
    func, _ = make_dequant_gemm_wgmma(M, N, K, dtype=str(dtype)[6:], config=cfg, **kw)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    report = mmaemit.interpret(func, *args, C, arch="sm_90a")
    assert report.ok, report
    rel = ((C.double() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), rel


def test_kernel_index_maps_follow_the_layout_objects():
    """The copy puts real pair p at logical_k_of_pair(p): the inverse of the kernel layout's k_permutation; the A
    register order is derived from the mma fragment maps (each A register has exactly one B-register source)."""
    from mmaemit.dequant.kernel_layout import k_permutation
    from mmaemit.kernels.dequant_gemm_wgmma import logical_k_of_pair, wgmma_a_order

    perm = k_permutation(64)
    for p in range(32):
        kl = logical_k_of_pair(p)
        assert kl % 2 == 0 and perm[kl] == 2 * p and perm[kl + 1] == 2 * p + 1
    for dtype in ("float16", "bfloat16"):
        assert sorted(wgmma_a_order(dtype)) == [0, 1, 2, 3]
