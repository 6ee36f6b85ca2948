"""Dynamic M: the symbolic-M dequant kernels (GEMV, tiled, dense + Hopper GEMM) on the interpreter for ragged M, the
DequantGemm dispatcher's plan, and on the GPU every M from 1 to 4096 with poisoned outputs and CUDA-graph capture."""
import dataclasses
import functools
import os

import pytest
import torch

import mmaemit
from mmaemit import dequant as D
from mmaemit.dequant.kernel_layout import kernel_arguments
from mmaemit.errors import ArgumentError, TileShapeError, UnsupportedConfigError
from mmaemit.kernels.dequant_dense import make_dequant_to_dense
from mmaemit.kernels.dequant_dispatch import FUSED_DENSE_M, LARGE_M, WIDE_M, DequantGemm, fused_serves_every_m
from mmaemit.kernels.dequant_gemm import GemvConfig, TiledConfig, make_dequant_gemm_tiled, make_dequant_gemv
from mmaemit.kernels.gemm_hopper import HopperGemmConfig, make_gemm_hopper

N, K = 128, 512
SMALL_HOPPER = HopperGemmConfig(block_n=64, consumers=2, stages=2, num_sms=2, epilogue_boxes=1)
SMALL_HOPPER_MID = HopperGemmConfig(block_n=64, consumers=1, stages=2, num_sms=3, epilogue_boxes=1)
SMALL_GEMV = GemvConfig(n_blocks=2, k_slices=2, stages=3)


@functools.lru_cache(maxsize=None)
def _weights(fmt="int4", dtype=torch.float16, zeros_mode=None, n=N, k=K, seed=0):
    g = torch.Generator().manual_seed(seed)
    scheme = D.QuantScheme(fmt, group_size=128, zeros_mode=zeros_mode) if zeros_mode else D.QuantScheme(fmt, 128)
    qw = D.quantize(torch.randn(n, k, generator=g).to(dtype), scheme)
    tensors, kw = kernel_arguments(qw)
    return qw, tensors, kw


def _check(C, A, qw, dtype, tol=None):
    assert not torch.isnan(C).any(), "rows left unwritten (the output was NaN-poisoned)"
    ref = A.double() @ qw.dequantize().double().T
    rel = ((C.double() - ref).norm() / ref.norm()).item()
    assert rel < (tol or (2e-3 if dtype == torch.float16 else 8e-3)), rel


def _run(func, M, dtype=torch.float16, seed=1, fmt="int4", zeros_mode=None):
    qw, tensors, _ = _weights(fmt, dtype, zeros_mode)
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(seed + M)).to(dtype)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    report = mmaemit.interpret(func, A, *tensors, C, arch="sm_90a")
    assert report.ok, report.summary()
    _check(C, A, qw, dtype)


@functools.lru_cache(maxsize=None)
def _gemv(m_max, dtype="float16"):
    return make_dequant_gemv(None, N, K, 128, dtype, SMALL_GEMV, "sm_90a", m_max=m_max)[0]


@functools.lru_cache(maxsize=None)
def _tiled(bm, dtype="float16"):
    cfg = TiledConfig(64, 64, 32, 32, 4) if bm == 64 else TiledConfig()
    return make_dequant_gemm_tiled(None, N, K, 128, dtype, cfg, "sm_90a")[0]


@pytest.mark.parametrize("m_max, M", [(8, 1), (8, 7), (16, 9), (16, 16), (16, 1)])
def test_symbolic_m_gemv_serves_ragged_m(m_max, M):
    _run(_gemv(m_max), M)


@pytest.mark.parametrize("bm, M", [(64, 1), (64, 7), (64, 33), (64, 100), (128, 33), (128, 100)])
def test_symbolic_m_tiled_serves_ragged_m(bm, M):
    _run(_tiled(bm), M)


def test_symbolic_m_bf16():
    _run(_gemv(16, "bfloat16"), 11, torch.bfloat16)
    _run(_tiled(64, "bfloat16"), 33, torch.bfloat16)


def test_symbolic_m_signature_binds_m_from_a():
    f = _gemv(8)
    assert str(f.params[0].ty.shape[0] if hasattr(f.params[0], "ty") else "m")  # the PrimFunc builds
    k = mmaemit.compile(make_dequant_gemv(None, 256, 1024, m_max=8, arch="sm_90a")[0], target="sm_90a")
    assert "A: float16(m, 1024)" in k.signature() and "C: float16(m, 256)" in k.signature()
    with pytest.raises(TileShapeError, match="exceeds this path's limit of 32"):
        make_dequant_gemv(None, 256, 1024, m_max=48)
    with pytest.raises(TileShapeError, match="1 <= M <= 32"):
        make_dequant_gemv(33, 256, 1024)


@pytest.mark.parametrize("fmt, dtype, zeros_mode", [("int4", torch.float16, None), ("int4", torch.bfloat16, None),
                                                    ("int8", torch.float16, None), ("uint2", torch.float16, "original"),
                                                    ("nf4", torch.bfloat16, None), ("int1", torch.float16, None),
                                                    ("uint4", torch.float16, "quantized"),
                                                    ("uint8", torch.bfloat16, "quantized")])
def test_dequant_to_dense_is_bit_exact(fmt, dtype, zeros_mode):
    """The dense kernel's output equals dequantize() rounded to the activation dtype, element for element."""
    qw, tensors, kw = _weights(fmt, dtype, zeros_mode, n=32, k=256)
    f = make_dequant_to_dense(32, 256, dtype=str(dtype)[6:], arch="sm_90a", **kw)
    out = torch.full((32, 256), float("nan"), dtype=dtype)
    assert mmaemit.interpret(f, *tensors, out, arch="sm_90a").ok
    assert torch.equal(out, qw.dequantize().to(dtype))


@pytest.mark.parametrize("M", [1, 7, 33, 100])
def test_symbolic_m_hopper_gemm_on_dense_weights(M):
    f = _hopper()
    qw, tensors, _ = _weights()
    dense = qw.dequantize().to(torch.float16)
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).half()
    C = torch.full((M, N), float("nan"), dtype=torch.float16)
    assert mmaemit.interpret(f, A, dense, C).ok
    _check(C, A, qw, torch.float16)


@functools.lru_cache(maxsize=None)
def _hopper():
    return make_gemm_hopper(None, N, K, config=SMALL_HOPPER)[0]


@functools.lru_cache(maxsize=None)
def _dispatcher(large_m=90):
    _, _, kw = _weights()
    return DequantGemm(N, K, interpret=True, large_m=large_m, wide_m=100, arch="sm_90a", fused=False,
                       configs={"gemv8": SMALL_GEMV, "gemv16": SMALL_GEMV, "gemv32": SMALL_GEMV, "hopper": SMALL_HOPPER,
                                "hopper_mid": SMALL_HOPPER_MID}, **kw)


@functools.lru_cache(maxsize=None)
def _fused_dispatcher():
    from mmaemit.kernels.dequant_gemm_hopper import HopperDequantConfig

    _, _, kw = _weights()
    small = {p: HopperDequantConfig(block_m=bm, consumers=c, stages=2 * c if ks else 2, num_sms=2, k_split=ks)
             for p, bm, c, ks in (("fused32", 16, 2, True), ("fused48", 24, 2, True), ("fused64", 32, 2, True),
                                  ("fused96", 48, 2, True), ("fused128", 64, 1, False), ("fused160", 80, 1, False),
                                  ("fused192", 96, 2, True), ("fused224", 112, 2, True), ("fused256k", 128, 2, True),
                                  ("fused128x2", 64, 2, False), ("fused256", 128, 2, False))}
    return DequantGemm(N, K, interpret=True, arch="sm_90a", dense_m=300,
                       configs=dict(small, gemv8=SMALL_GEMV, gemv16=SMALL_GEMV, hopper=SMALL_HOPPER), **kw)


@pytest.mark.parametrize("M", [7, 33])
def test_symbolic_m_wgmma_path_by_name(M):
    """The register-decode wgmma kernel with a symbolic M, run by name through the dispatcher (not in its plan)."""
    from mmaemit.kernels.dequant_gemm_wgmma import WgmmaConfig

    qw, tensors, kw = _weights()
    dg = DequantGemm(N, K, interpret=True, arch="sm_90a", configs={"wgmma": WgmmaConfig(16, 2, 1, 3)}, **kw)
    assert "wgmma" not in [r[0] for r in dg.ranges] and "wgmma" in dg.runnable_paths()
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).half()
    C = dg.run_path("wgmma", A, *tensors, out=torch.full((M, N), float("nan"), dtype=torch.float16))
    _check(C, A, qw, torch.float16)


@pytest.mark.parametrize("M", [3, 40])
def test_dispatcher_with_quantized_zeros_gptq_style(M):
    """uint4 with integer zero codes (what GPTQ / AWQ checkpoints load as) through the GEMV and the dense path (the
    plan without fused paths)."""
    qw, tensors, kw = _weights("uint4", torch.float16, "quantized")
    dg = DequantGemm(N, K, interpret=True, large_m=17, wide_m=17, arch="sm_90a", fused=False,
                     configs={"gemv8": SMALL_GEMV, "gemv16": SMALL_GEMV, "hopper": SMALL_HOPPER}, **kw)
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).half()
    C = dg(A, *tensors, out=torch.full((M, N), float("nan"), dtype=torch.float16))
    _check(C, A, qw, torch.float16)


@pytest.mark.parametrize("M, mode, dtype", [(20, "quantized", torch.float16), (40, "original", torch.bfloat16)])
def test_dispatcher_fused_plan_with_zero_points(M, mode, dtype):
    """Asymmetric GPTQ / AWQ weights (uint4 with zeros) take the fused paths on sm_90a like symmetric ones."""
    qw, tensors, kw = _weights("uint4", dtype, mode)
    # fill_waves=False: the M-only plan (N = 128 would otherwise give M=40 two rows of fused32's tiles)
    dg = DequantGemm(N, K, dtype=str(dtype)[6:], interpret=True, arch="sm_90a", fill_waves=False, **kw)
    assert dg.path_for(M) == ("fused32" if M <= 32 else "fused48")
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(dtype)
    C = dg(A, *tensors, out=torch.full((M, N), float("nan"), dtype=dtype))
    _check(C, A, qw, dtype)


def test_dispatcher_plan():
    dg = _dispatcher()
    assert [(p, lo, hi) for p, lo, hi in dg.ranges] == [("gemv8", 1, 8), ("gemv16", 9, 16), ("gemv32", 17, 32),
                                                        ("tiled64", 33, 64),
                                                        ("tiled128", 65, 89), ("dense_mid", 90, 99),
                                                        ("dense", 100, None)]
    assert [dg.path_for(m) for m in (1, 8, 9, 17, 64, 65, 89, 90, 99, 100, 4096)] == [
        "gemv8", "gemv8", "gemv16", "gemv32", "tiled64", "tiled128", "tiled128", "dense_mid", "dense_mid", "dense",
        "dense"]
    _, _, kw = _weights()
    plain = DequantGemm(N, K, arch="sm_80", **kw)            # no Hopper: the tiled path serves every M above 32
    assert plain.ranges[-1] == ("tiled128", 65, None) and plain.large_m is None
    assert DequantGemm(8192, 8192, arch="sm_90a", fused=False).ranges[-2:] == [("dense_mid", LARGE_M, WIDE_M - 1),
                                                                               ("dense", WIDE_M, None)]
    assert DequantGemm(8192, 8192, arch="sm_90a").ranges == [
        ("gemv8", 1, 8), ("gemv16", 9, 16), ("fused32", 17, 32), ("fused48", 33, 48), ("fused64", 49, 64),
        ("fused96", 65, 96), ("fused128", 97, 128), ("fused160", 129, 160), ("fused192", 161, 192),
        ("fused224", 193, 224), ("fused256k", 225, 256), ("fused128x2", 257, 511),
        ("fused256", 512, None)]
    # dense only from a dense_m the caller gives, or where fused256 does not fit (N = 8256: no 128-row tiles)
    assert DequantGemm(8192, 8192, arch="sm_90a", dense_m=8192).ranges[-2:] == [("fused256", 512, 8191),
                                                                                  ("dense", 8192, None)]
    assert DequantGemm(8256, 8192, arch="sm_90a").ranges[-1] == ("dense", FUSED_DENSE_M, None)
    # no fast scaled decode for the fused kernel: fp4 with bf16 activations takes the second plan; nf4 (scaled
    # tables) the fused one, but dense from FUSED_DENSE_M as 8-bit weights (fused256 serves every M only for
    # integer codes of up to 4 bits)
    for dt in ("float16", "bfloat16"):
        nf4 = DequantGemm(8192, 8192, dtype=dt, arch="sm_90a", weight_format="nf4").ranges
        assert nf4[:-2] == DequantGemm(8192, 8192, dtype=dt, arch="sm_90a").ranges[:-1]
        assert nf4[-2:] == [("fused256", 512, FUSED_DENSE_M - 1), ("dense", FUSED_DENSE_M, None)]
    for fmt, zeros, every_m in (("int8", None, False), ("uint8", "quantized", False), ("float4_e2m1fn", None, False),
                                ("int2", None, True), ("uint4", "rescale", True), ("int4_ob", None, True),
                                ("uint1", "original", True)):
        assert fused_serves_every_m(fmt) == every_m
        last = DequantGemm(8192, 8192, arch="sm_90a", weight_format=fmt, zeros_mode=zeros).ranges[-1]
        assert last == (("fused256", 512, None) if every_m else ("dense", FUSED_DENSE_M, None)), (fmt, last)
    for fmt, dt in (("float4_e2m1fn", "bfloat16"),):
        assert [r[0] for r in DequantGemm(8192, 8192, dtype=dt, arch="sm_90a", weight_format=fmt).ranges] == [
            "gemv8", "gemv16", "gemv32", "dense_mid", "dense"]
        with pytest.raises(UnsupportedConfigError, match="fast scaled decode"):
            DequantGemm(8192, 8192, dtype=dt, arch="sm_90a", weight_format=fmt, fused=True)
    assert DequantGemm(8192, 8192, arch="sm_90a", weight_format="float4_e2m1fn").path_for(20) == "fused32"
    assert "fused32" in DequantGemm(8192, 8192, arch="sm_90a", weight_format="nf4").runnable_paths()
    for zm in ("original", "rescale", "quantized"):      # zero points: the same fused plan
        zeros = DequantGemm(8192, 8192, arch="sm_90a", weight_format="uint4", zeros_mode=zm)
        assert zeros.ranges == DequantGemm(8192, 8192, arch="sm_90a").ranges, zm
    with pytest.raises(UnsupportedConfigError, match="'original' / 'quantized' zeros have none"):
        DequantGemm(8192, 8192, dtype="bfloat16", arch="sm_90a", weight_format="uint8", zeros_mode="original",
                    fused=True)
    with pytest.raises(UnsupportedConfigError, match="sm_90a"):
        DequantGemm(8192, 8192, arch="sm_80", fused=True)
    assert DequantGemm(8192, 8192, arch="sm_90a", fused=True).ranges == DequantGemm(8192, 8192, arch="sm_90a").ranges
    narrow = DequantGemm(64, 1024, arch="sm_90a", large_m=256, wide_m=256, interpret=True, fused=False,
                         **kw)   # N=64
    assert [r[0] for r in narrow.ranges] == ["gemv8", "gemv16", "gemv32", "tiled64", "dense"]
    assert narrow.ranges[3] == ("tiled64", 33, 255)
    assert DequantGemm(8192, 8192, arch="sm_90a").runnable_paths() == [
        "gemv8", "gemv16", "gemv32", "tiled64", "tiled128", "dense_mid", "dense", "fused8", "fused16", "fused32",
        "fused48", "fused64", "fused96", "fused128", "fused160", "fused192", "fused224", "fused256k", "fused128x2",
        "fused256", "wgmma"]
    # N = 64: the fused tiles of 128 weight rows do not fit; those of 64 (k_split, and the one-wave tiles) take their
    # range
    assert [r[0] for r in DequantGemm(64, 1024, arch="sm_90a", fill_waves=False, **kw).ranges] == [
        "gemv8", "gemv16", "fused32", "fused48", "fused64", "fused96", "fused128", "fused160", "fused192", "fused224",
        "fused256k", "dense"]
    # ... and with the default fill_waves, one tile of N=64 per row: fused32's rows serve up to 512, but for 33-48
    # (two rows of 32 pad 16 rows more than fused48's one)
    assert DequantGemm(64, 1024, arch="sm_90a", **kw).ranges[2:] == [
        ("fused32", 17, 32), ("fused48", 33, 48), ("fused32", 49, 512), ("fused256k", 513, 4095), ("dense", 4096, None)]
    assert "dense" not in plain.runnable_paths()
    with pytest.raises(TileShapeError, match=r"serves M > 32 for N=32, K=1024: the tiled path needs N a multiple"):
        DequantGemm(32, 1024, arch="sm_80")          # gemv32 (n_blocks=1) fits, no tiled path does
    with pytest.raises(ArgumentError, match="A must be a 2-D"):
        _dispatcher()(torch.zeros(3, K + 64, dtype=torch.float16), *_weights()[1])


def test_fused_defaults_fall_back_to_fewer_chunks_per_stage_for_k():
    """fused32 / 48 / 64 stage 4 chunks (K a multiple of 512 with two consumers sharing K; fused32 has four where K
    is a multiple of 1024, for weights up to 4 bits), fused96 / 128 / 128x2 two; for other K the defaults take 2
    chunks per stage (K a multiple of 256) or 1 (128), else the path leaves the plan; a config the caller passes is
    never changed."""
    from mmaemit.kernels.dequant_gemm_hopper import HopperDequantConfig

    def cps(K, **kw):
        dg = DequantGemm(8192, K, arch="sm_90a", group_size=-1, **kw)
        return [(dg.configs[p].chunks_per_stage, dg.configs[p].stages)
                for p in ("fused32", "fused64", "fused96", "fused128x2")], [r[0] for r in dg.ranges]
    assert cps(8192)[0] == [(4, 8), (4, 4), (2, 6), (2, 4)]
    fused32 = [DequantGemm(8192, K, arch="sm_90a", group_size=-1, **kw).configs["fused32"]
               for K, kw in ((8192, {}), (8704, {}), (11008, {}), (8192, dict(weight_format="int8")))]
    assert [(c.consumers, c.chunks_per_stage, c.consumer_regs) for c in fused32] == \
        [(4, 4, 112), (2, 4, 232), (2, 2, 232), (2, 2, 232)]
    assert cps(11008)[0] == [(2, 8), (2, 6), (2, 6), (2, 4)]  # Llama-2-7B's intermediate size: 43 x 256
    assert cps(8320)[0] == [(1, 8), (1, 8), (1, 8), (2, 4)]   # 65 x 128 (fused128x2: no k_split, 2 chunks fit)
    cfgs, paths = cps(8256)                                   # 129 chunks: no k_split path divides it
    assert "fused32" not in paths and "fused64" not in paths and "fused128x2" in paths
    mine = HopperDequantConfig(block_m=32, stages=8, k_split=True, chunks_per_stage=4)
    dg = DequantGemm(8192, 11008, arch="sm_90a", group_size=-1, configs={"fused32": mine})
    assert dg.configs["fused32"] is mine and "fused32" not in [r[0] for r in dg.ranges]


def test_gemv16_default_fills_one_wave_of_warps():
    """gemv16's warps per CTA follow the grid: N / 32 CTAs x k_slices warps nearest 16 warps per SM on 132 SMs (the
    shapes measured on the H100; without a GPU 132 is assumed), k_slices dividing K; on fewer SMs the wave is
    smaller (10240 x 8192: 8 warps on 132 SMs, 4 on an H100 PCIe's 114); a config the caller passes is kept."""
    from mmaemit.kernels.dequant_dispatch import GEMV16_CONFIGS, gemv16_config

    want = {(8192, 8192): 8, (28672, 8192): 4, (14336, 4096): 4, (4096, 14336): 16, (4096, 4096): 16,
            (512, 1024): 8, (64, 1024): 8}
    assert {nk: gemv16_config(*nk, sms=132).k_slices for nk in want} == want
    assert gemv16_config(10240, 8192, sms=132).k_slices == 8 and gemv16_config(10240, 8192, sms=114).k_slices == 4
    assert gemv16_config(4096, 14336) is GEMV16_CONFIGS[16] and gemv16_config(4096, 14336 + 1024).k_slices == 8
    assert DequantGemm(4096, 14336, arch="sm_90a").configs["gemv16"] is GEMV16_CONFIGS[16]
    mine = GemvConfig(n_blocks=2, k_slices=8, stages=3)
    assert DequantGemm(4096, 14336, arch="sm_90a", configs={"gemv16": mine}).configs["gemv16"] is mine


def test_gemv8_default_takes_16_warps_where_the_grid_is_one_wave():
    """gemv8 takes one 16-warp CTA per SM where its N / 32 CTAs fit one wave and K has 16 K slices of 128 (the Llama
    down projection, attention projections), else the 8-warp default; a config the caller passes is kept."""
    from mmaemit.kernels.dequant_dispatch import GEMV8_ONE_WAVE, gemv8_config

    want = {(4096, 14336): 16, (4096, 4096): 16, (1024, 4096): 16, (8192, 8192): 8, (28672, 4096): 8,
            (4224, 4096): 16, (4256, 4096): 8, (4096, 14336 + 1024): 8, (512, 1024): 8}
    assert {nk: gemv8_config(*nk, sms=132).k_slices for nk in want} == want
    assert gemv8_config(4096, 14336, sms=114).k_slices == 8          # 128 CTAs on 114 SMs: two waves
    assert DequantGemm(4096, 14336, arch="sm_90a").configs["gemv8"] is GEMV8_ONE_WAVE
    assert DequantGemm(28672, 4096, arch="sm_90a", gated="silu").configs["gemv8"] == GemvConfig()
    mine = GemvConfig(n_blocks=1)
    assert DequantGemm(4096, 14336, arch="sm_90a", configs={"gemv8": mine}).configs["gemv8"] is mine


def test_8bit_plan_takes_the_fused_paths_from_m_1():
    """8-bit weights with a fast scaled decode (int8 / int8_ob / fp8 with fp16, int8 with bf16: the split magic) take
    fused8 / fused16 instead of the GEMVs and 8-bit rings (fewer chunks per stage, deeper, within shared memory);
    formats without a fast scaled decode (uint8 -> bf16 with "original" zeros, e4m3 -> bf16) keep the second plan."""
    from mmaemit.kernels.dequant_dispatch import FUSED_SMALL_M_BITS
    from mmaemit.kernels.dequant_gemm_hopper import fused_smem_bytes
    from mmaemit.kernels.gemm_hopper import SMEM_LIMIT

    assert FUSED_SMALL_M_BITS == (8,)
    for fmt, dt, zm in (("int8", "float16", None), ("int8", "bfloat16", None), ("int8_ob", "bfloat16", None),
                        ("float8_e4m3fn", "float16", None), ("uint8", "float16", "quantized"),
                        ("uint8", "bfloat16", "rescale")):
        dg = DequantGemm(8192, 8192, dtype=dt, weight_format=fmt, zeros_mode=zm, arch="sm_90a")
        assert [r[0] for r in dg.ranges][:3] == ["fused8", "fused16", "fused32"], (fmt, dt)
        assert dg.path_for(1) == "fused8" and dg.path_for(16) == "fused16"
        assert (dg.configs["fused128"].chunks_per_stage, dg.configs["fused128"].stages) == (1, 8)
        # 8-bit rings have fewer than 4 chunks per stage: one chunk per wgmma group
        assert all(dg.configs[p].chunks_per_group == 1 for p in ("fused32", "fused48")), fmt
        for p in dg.configs:
            if p.startswith("fused"):
                assert fused_smem_bytes(dg.configs[p], 8, 128, zm is not None) <= SMEM_LIMIT, p
    for fmt, dt, zm in (("uint8", "bfloat16", "original"), ("float8_e4m3fn", "bfloat16", None)):
        assert DequantGemm(8192, 8192, dtype=dt, weight_format=fmt, zeros_mode=zm,
                           arch="sm_90a").ranges[0][0] == "gemv8"
    assert DequantGemm(8192, 8192, weight_format="int2", arch="sm_90a").ranges[0][0] == "gemv8"


def test_fused_chunk_pairs_by_default_where_stages_hold_4_chunks():
    """fused32 / fused48 issue two chunks per wgmma group (H100, 8192^2 int4: 18.7-19.4 against 19.6-19.8 us at M=32,
    21.8-22.4 against 22.6-22.8 at M=48); every ring of fewer chunks per stage (K fallbacks, 8-bit weights) takes one
    chunk per group, since chunks_per_group=2 needs 4 chunks per stage."""
    dg = DequantGemm(8192, 8192, arch="sm_90a")
    assert [dg.configs[p].chunks_per_group for p in ("fused32", "fused48", "fused64", "fused128")] == [2, 2, 1, 1]
    # fused32's K fallbacks: 4 chunks x 2 consumers (pairs kept), 1 chunk x 2 consumers (one chunk per group)
    for K, (cps, consumers, cpg) in {1536: (4, 2, 2), 640: (1, 2, 1)}.items():
        cfg = DequantGemm(128, K, arch="sm_90a").configs["fused32"]
        assert K % cfg.k_multiple == 0
        assert (cfg.chunks_per_stage, cfg.consumers, cfg.chunks_per_group) == (cps, consumers, cpg), (K, cfg)


#: (N, K) -> whether N / 64 tiles of 64 weight rows fit one wave of 132 SMs and K is a multiple of 128
ONE_WAVE_SHAPES = {(8192, 8192): True, (4096, 14336): True, (28672, 8192): False, (14336, 4096): False,
                   (8448, 8192): True, (8512, 8192): False, (8192, 576): False}


def test_fused160_config_by_grid():
    """fused160 takes 160 x 64 k_split tiles where N / 64 fits one wave and K their 128, else 160 x 128 tiles (H100,
    8192^2 M=160: 41.9-42.1 against 59.1-59.4 us; 28672 x 8192: 158.3-161.4 against 139.1-140.1); a config the
    caller passes is kept."""
    from mmaemit.kernels.dequant_dispatch import _DEFAULTS, FUSED160_ONE_WAVE, fused160_config
    from mmaemit.kernels.dequant_gemm_hopper import HopperDequantConfig

    assert FUSED160_ONE_WAVE.k_split and FUSED160_ONE_WAVE.weight_rows == 64 and FUSED160_ONE_WAVE.block_m == 160
    assert {nk: fused160_config(*nk, sms=132) is FUSED160_ONE_WAVE for nk in ONE_WAVE_SHAPES} == ONE_WAVE_SHAPES
    assert fused160_config(8192, 8192, sms=114) is _DEFAULTS["fused160"]
    assert DequantGemm(8192, 8192, arch="sm_90a").configs["fused160"] == FUSED160_ONE_WAVE
    assert DequantGemm(28672, 8192, arch="sm_90a").configs["fused160"] == _DEFAULTS["fused160"]
    mine = HopperDequantConfig(block_m=160, consumers=1, stages=4)
    assert DequantGemm(8192, 8192, arch="sm_90a", configs={"fused160": mine}).configs["fused160"] is mine
    # 8-bit weights: the same tiles, fewer stages to fit shared memory
    int8 = DequantGemm(8192, 8192, dtype="bfloat16", weight_format="int8", arch="sm_90a").configs["fused160"]
    assert int8.k_split and int8.block_m == 160 and int8.stages == 6


def test_one_wave_paths_by_grid():
    """fused192 / 224 / 256k serve M = 161-256 where N / 64 tiles fit one wave and K their 128 (H100, 8192^2 M=192:
    49.5-51.4 us against fused128x2's 60.1-61.6); elsewhere fused128x2 serves from 161 (fused256 where its tiles fill
    the GPU: test_wide_tiles_take_fused256_from_161); a path whose tiles do not fit
    drops out and the one below extends; a config the caller passes is kept."""
    from mmaemit.kernels.dequant_dispatch import ONE_WAVE_PATHS, one_wave_fits
    from mmaemit.kernels.dequant_gemm_hopper import HopperDequantConfig

    assert {nk: one_wave_fits(*nk, sms=132) for nk in ONE_WAVE_SHAPES} == ONE_WAVE_SHAPES
    assert not one_wave_fits(8192, 8192, sms=114)
    for nk, fits in ONE_WAVE_SHAPES.items():
        dg = DequantGemm(*nk, arch="sm_90a", group_size=64, fill_waves=False)
        assert [dg.path_for(m) for m in (161, 192, 193, 224, 225, 256)] == (
            [p for p in ONE_WAVE_PATHS for _ in (0, 1)] if fits else [dg.path_for(161)] * 6), (nk, dg.ranges)
        wide = nk[0] % 128 == 0 and nk[0] // 128 >= 132          # fused256's tiles fill the GPU at one tile row
        assert dg.path_for(257) == ("fused256" if wide else "fused128x2" if nk[0] % 128 == 0 else dg.path_for(256)), (
            nk, dg.ranges)
    assert DequantGemm(14336, 4096, arch="sm_90a").path_for(161) == "fused128x2"
    mine = HopperDequantConfig(block_m=224, consumers=2, stages=4, k_split=True)
    dg = DequantGemm(8192, 8192, arch="sm_90a", configs={"fused224": mine})
    assert dg.configs["fused224"] is mine and dg.path_for(200) == "fused224"
    # a dense_m inside the one-wave range ends it there (fused128x2 would start after it)
    assert DequantGemm(8192, 8192, arch="sm_90a", dense_m=200).ranges[-2:] == [("fused224", 193, 199),
                                                                               ("dense", 200, None)]
    assert DequantGemm(8192, 8192, arch="sm_90a", dense_m=260).ranges[-3:] == [
        ("fused256k", 225, 256), ("fused128x2", 257, 259), ("dense", 260, None)]
    # fused224 does not fit K = 8256 (129 chunks, no k_split divides it): no one-wave path, fused128x2 from 161
    assert DequantGemm(8192, 8256, arch="sm_90a", group_size=-1).path_for(200) == "fused128x2"


def test_narrow_n_fills_one_wave_with_shorter_tiles():
    """Where one row of the M-tall tile leaves half the SMs or more idle, each M up to WAVE_FILL_MAX_M goes to the
    WAVE_FILL_PATHS path with the most tiles within one wave (ties to the taller tile). On the H100, every path timed
    (docs/perf-notes.md, seventeenth session): 1024 x 4096 M=128 fused32 8.7 us against fused128's 10.9, M=256 fused32
    9.4 against fused256k's 16.6, M=512 fused64 12.6 against fused256's 23.7; 4096 x 4096 M=128 fused64 12.7 against
    15.0, M=256 fused128 18.2 against 26.7, M=512 fused128x2 28.3 against 41.9. Wide N keep the M-only plan, and
    fill_waves=False keeps it everywhere. Shorter rows that pad M by more than a quarter of their tile beyond the
    plan's path lost on the H200 (docs/perf-notes.md, eighteenth session): those M keep the plan's path. Where no
    such path serves, two rows of the shortest TWO_ROW_PATHS tile replace one row of fused192 or fused128x2's tiles
    (H200, nineteenth session, in one run against them: 4096 x 4096 M=192 fused96 14.6 us against 21.9, M=300
    fused160 20.3 against 26.0; 4096 x 14336 M=257 fused160 70.3 against 87.0, M=448 fused224 85.8 against 100.1)."""
    from mmaemit.kernels.dequant_dispatch import TWO_ROW_PATHS, WAVE_FILL_MAX_M, WAVE_FILL_PATHS, wave_fill_pads

    def tiles(dg, p, m):
        cfg = dg.configs[p]
        return -(-m // cfg.block_m) * (dg.N // cfg.weight_rows)

    measured = {(1024, 4096): {128: "fused32", 256: "fused32", 512: "fused64"},
                (4096, 4096): {128: "fused64", 256: "fused128", 512: "fused128x2", 192: "fused96", 300: "fused160",
                               384: "fused192", 448: "fused224"},
                (4096, 14336): {161: "fused96", 257: "fused160", 352: "fused192", 400: "fused224"}}
    for (N, K), best in measured.items():
        dg = DequantGemm(N, K, arch="sm_90a")
        assert {m: dg.path_for(m) for m in best} == best, dg.ranges
    for N, K in ((1024, 4096), (4096, 4096), (4096, 14336), (2048, 4096), (64, 1024)):
        dg, plain = DequantGemm(N, K, arch="sm_90a"), DequantGemm(N, K, arch="sm_90a", fill_waves=False)
        spans = dg.ranges
        assert [r[1] for r in spans] == [1] + [r[2] + 1 for r in spans[:-1]] and spans[-1][2] is None
        for m in range(1, 2 * WAVE_FILL_MAX_M):
            p, p0 = dg.path_for(m), plain.path_for(m)
            if p != p0 and p in TWO_ROW_PATHS and p not in WAVE_FILL_PATHS:
                bm = dg.configs[p].block_m
                assert p0 in ("fused192", "fused128x2") and bm < m <= 2 * bm, (N, K, m, p, p0)
                assert tiles(dg, p, m) == 2 * N // 64 <= 132 and dg.configs[p].weight_rows == 64, (N, K, m, p, p0)
                assert not any(bm > dg.configs[q].block_m >= m / 2 for q in TWO_ROW_PATHS), (N, K, m, p)  # shortest
            elif p != p0:
                assert p in WAVE_FILL_PATHS and 16 < m <= WAVE_FILL_MAX_M, (N, K, m, p, p0)
                assert 2 * tiles(plain, p0, m) <= tiles(dg, p, m) <= 132, (N, K, m, p, p0)
                assert wave_fill_pads(m, dg.configs[p].block_m, plain.configs[p0].block_m), (N, K, m, p, p0)
    for N, K in ((8192, 8192), (28672, 8192), (14336, 4096), (8448, 8192)):
        assert DequantGemm(N, K, arch="sm_90a").ranges == DequantGemm(N, K, arch="sm_90a", fill_waves=False).ranges
    assert DequantGemm(4096, 14336, arch="sm_90a").ranges[2:] == [
        ("fused32", 17, 32), ("fused48", 33, 48), ("fused32", 49, 64), ("fused96", 65, 96), ("fused64", 97, 128),
        ("fused160", 129, 160), ("fused96", 161, 192), ("fused128", 193, 256), ("fused160", 257, 320),
        ("fused192", 321, 384), ("fused224", 385, 448), ("fused128x2", 449, 512), ("fused256", 513, None)]
    # the rule's arithmetic: M rounded up to the short tile against M rounded up to the plan's, a quarter tile spare
    assert wave_fill_pads(200, 128, 224) and not wave_fill_pads(160, 128, 160) and wave_fill_pads(100, 64, 128)
    assert not wave_fill_pads(48, 32, 48) and wave_fill_pads(64, 32, 64) and not wave_fill_pads(80, 64, 96)
    with pytest.raises(ArgumentError, match="fill_waves='no'; valid: True, False"):
        DequantGemm(4096, 4096, arch="sm_90a", fill_waves="no")
    # the wave is the config's num_sms where one is set
    few = {p: dataclasses.replace(DequantGemm(4096, 4096, arch="sm_90a").configs[p], num_sms=64)
           for p in WAVE_FILL_PATHS + TWO_ROW_PATHS}
    assert DequantGemm(4096, 4096, arch="sm_90a", configs=few).ranges == \
        DequantGemm(4096, 4096, arch="sm_90a", configs=few, fill_waves=False).ranges


def test_wide_tiles_take_fused256_from_161():
    """Where 256 x 128 tiles fill the GPU at one tile row (N / 128 >= SMs) and the one-wave paths do not fit,
    fused256 serves from M=161 and fused128x2 leaves the plan (H100, 28672 x 8192 M=256: 187.6-191.3 us against
    fused128x2's 230.5-244.5); a dense_m below 512 still ends it."""
    from mmaemit.kernels.dequant_dispatch import wide_tiles_fill

    assert [wide_tiles_fill(n, sms=132) for n in (28672, 16896, 16768, 14336, 8192)] == [True, True, False, False,
                                                                                          False]
    assert wide_tiles_fill(14336, sms=112) and not wide_tiles_fill(28672, sms=228)
    ranges = DequantGemm(28672, 8192, arch="sm_90a").ranges
    assert ranges[-2:] == [("fused160", 129, 160), ("fused256", 161, None)]
    assert "fused128x2" not in [r[0] for r in ranges]
    assert DequantGemm(28672, 8192, arch="sm_90a", dense_m=300).ranges[-2:] == [("fused256", 161, 299),
                                                                                ("dense", 300, None)]
    # nf4: dense from FUSED_DENSE_M as elsewhere
    assert DequantGemm(28672, 8192, arch="sm_90a", weight_format="nf4").ranges[-2:] == [
        ("fused256", 161, FUSED_DENSE_M - 1), ("dense", FUSED_DENSE_M, None)]


@pytest.mark.parametrize("M", [3, 12])
def test_8bit_fused_small_m_paths_on_the_interpreter(M):
    """int8 (bf16, the split-magic decode) through fused8 / fused16 on the interpreter: NaN-poisoned output vs the
    exact product."""
    qw, tensors, kw = _weights("int8", torch.bfloat16)
    dg = DequantGemm(N, K, dtype="bfloat16", interpret=True, arch="sm_90a", dense_m=300, **kw)
    assert dg.path_for(M) == ("fused8" if M <= 8 else "fused16")
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).bfloat16()
    C = dg(A, *tensors, out=torch.full((M, N), float("nan"), dtype=torch.bfloat16))
    _check(C, A, qw, torch.bfloat16)


@pytest.mark.parametrize("M", [20, 33, 50, 70, 100, 140, 170, 200, 240, 270, 300])
def test_fused_dispatcher_routes_ragged_m_on_the_interpreter(M):
    """int4 on sm_90a: fused32 / 48 / 64 / 96 (k_split) / fused128 / fused160 / fused192 / 224 / 256k (k_split) /
    fused128x2 for M > 16 (small tiles, two persistent CTAs), dense from dense_m (300 here); NaN-poisoned output vs
    the exact product."""
    dg = _fused_dispatcher()
    assert [dg.path_for(m) for m in (20, 33, 50, 70, 100, 140, 170, 200, 240, 270, 300)] == [
        "fused32", "fused48", "fused64", "fused96", "fused128", "fused160", "fused192", "fused224", "fused256k",
        "fused128x2", "dense"]
    qw, tensors, _ = _weights()
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).half()
    C = dg(A, *tensors, out=torch.full((M, N), float("nan"), dtype=torch.float16))
    _check(C, A, qw, torch.float16)


@pytest.mark.parametrize("M", [1, 12, 33, 70, 95, 100])
def test_dispatcher_routes_ragged_m_on_the_interpreter(M):
    dg = _dispatcher()
    qw, tensors, _ = _weights()
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).half()
    C = dg(A, *tensors, out=torch.full((M, N), float("nan"), dtype=torch.float16))
    _check(C, A, qw, torch.float16)


# ------------------------------------------------------------------------------------------------------------ GPU
@functools.lru_cache(maxsize=None)
def _gpu_problem(n, k, dtype):
    qw, tensors, kw = _weights("int4", dtype, None, n=n, k=k, seed=3)
    # dense_m: int4's plan has no dense path (fused256 serves every M from 512); from 2048 here, so that this test
    # also runs it (M = 2100 / 4096) on the GPU, as nf4's and 8-bit weights' plans do from FUSED_DENSE_M. 4 build
    # processes, not one per core: under pytest -n 8 the other workers keep the cores busy, and each process starts
    # by importing torch and TVM
    return (qw.dequantize().to(dtype).cuda(), [t.cuda() for t in tensors],
            DequantGemm(n, k, dtype=str(dtype).replace("torch.", ""), dense_m=2048, **kw).warmup(workers=4))


@pytest.mark.gpu
@pytest.mark.heavy
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dispatcher_every_m_on_the_gpu(dtype):
    """M = 1 .. 4096 (ragged ones included) through one warmed-up dispatcher: no compile after warm-up, every row
    of a NaN-poisoned output written and within tolerance of the fp32 product of the dequantized weights; then the
    calls at M = 5 / 33 / 300 captured in CUDA graphs and replayed on new inputs."""
    dense, tensors, dg = _gpu_problem(4096, 4096, dtype)
    compiled = {p: k for p, k in dg._kernels.items()}
    for M in (1, 7, 16, 20, 33, 40, 50, 64, 100, 127, 128, 140, 170, 200, 250, 257, 1000, 2100, 4096):
        A = torch.randn(M, 4096, device="cuda").to(dtype)
        C = dg(A, *tensors, out=torch.full((M, 4096), float("nan"), dtype=dtype, device="cuda"))
        torch.cuda.synchronize()
        ref = A.float() @ dense.float().T
        assert not torch.isnan(C).any(), (M, dg.path_for(M))
        rel = ((C.float() - ref).norm() / ref.norm()).item()
        assert rel < (3e-3 if dtype == torch.float16 else 1e-2), (M, dg.path_for(M), rel)
    assert dg._kernels == compiled, "a call compiled a kernel after warmup()"
    # the same warmed calls captured in CUDA graphs (one per path kind): replays read new inputs, write every row
    for M in (5, 33, 300):
        A = torch.randn(M, 4096, device="cuda").to(dtype)
        C = torch.empty(M, 4096, device="cuda", dtype=dtype)
        dg(A, *tensors, out=C)                                   # warm the path on the side stream's allocator
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dg(A, *tensors, out=C)
        A.copy_(torch.randn(M, 4096, device="cuda").to(dtype))
        C.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = A.float() @ dense.float().T
        assert not torch.isnan(C).any(), M
        assert ((C.float() - ref).norm() / ref.norm()).item() < (3e-3 if dtype == torch.float16 else 1e-2), M
    assert dg._kernels == compiled, "a graph capture compiled a kernel"


def test_gemv32_path_by_name_on_the_interpreter():
    """The extra ``gemv32`` path (two m16 tiles per warp) runs by name on the interpreter for M in 17 .. 32 and
    refuses M > 32."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    N, K = 128, 512
    dg = DequantGemm(N, K, 128, "float16", arch="sm_90a", interpret=True,
                     configs={"gemv32": GemvConfig(n_blocks=1, k_slices=2, stages=3)})
    assert "gemv32" in dg.runnable_paths() and "gemv32" not in [p for p, _, _ in dg.ranges]   # fused32 serves 17-32
    w = torch.randn(N, K, dtype=torch.float16)
    qw = D.quantize(w, D.QuantScheme("int4", group_size=128))
    ts, _ = kernel_arguments(qw)
    for M in (17, 32):
        A = torch.randn(M, K, dtype=torch.float16)
        out = torch.full((M, N), float("nan"), dtype=torch.float16)
        dg.run_path("gemv32", A, *ts, out=out)
        ref = A.double() @ qw.dequantize().double().T
        assert ((out.double() - ref).norm() / ref.norm()).item() < 2e-3
    with pytest.raises(ArgumentError, match="gemv32 serves M <= 32"):
        dg.run_path("gemv32", torch.randn(33, K, dtype=torch.float16), *ts)


def test_parallel_warmup_builds_in_workers_and_loads_from_the_cache(tmp_path):
    """warmup(workers=2) off the interpreter, called at the top level of a script WITHOUT an ``if __name__ ==
    "__main__"`` guard (multiprocessing's spawned workers would re-import it): the workers build every path's cubin
    into the on-disk cache, the script's process then loads them (the same sources: exactly one cubin per kernel, none
    added by the loads), no warning of a failed worker, its environment untouched; a second warmup compiles
    nothing."""
    import json
    import subprocess
    import sys

    from mmaemit.errors import ToolchainError
    from mmaemit.runtime.toolchain import find_nvcc

    try:
        find_nvcc()
    except ToolchainError:
        pytest.skip("needs nvcc")
    script = tmp_path / "warm.py"
    script.write_text(
        "import json, os, warnings\n"
        "from mmaemit.kernels.dequant_dispatch import DequantGemm\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    g = DequantGemm(256, 1024, arch='sm_80', interpret=False)\n"
        "    g.warmup(workers=2)\n"
        "    first = dict(g._kernels)\n"
        "    g.warmup(workers=2)\n"
        "print(json.dumps({'plan': [r[0] for r in g.ranges], 'kernels': sorted(g._kernels),\n"
        "                  'same': all(g._kernels[p] is first[p] for p in first),\n"
        "                  'env': os.environ.get('MMAEMIT_CUBIN_CACHE'),\n"
        "                  'failed': [str(w.message) for w in caught if 'parallel warm-up' in str(w.message)]}))\n")
    env = dict(os.environ, MMAEMIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("MMAEMIT_CUBIN_CACHE", None)
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["plan"] == ["gemv8", "gemv16", "gemv32", "tiled64", "tiled128"]
    assert out["kernels"] == sorted(out["plan"]) and out["same"] and out["env"] is None and not out["failed"]
    assert len(list((tmp_path / "cache").glob("*.cubin"))) == len(out["plan"])
