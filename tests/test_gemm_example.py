"""The hand-composed GEMM example: SASS on the CPU for every dtype x layout; correctness on a GPU."""
import itertools

import pytest

import mmaemit
from mmaemit.errors import TileShapeError
from mmaemit.kernels.gemm_mma import LAYOUTS, GemmConfig, make_gemm, random_inputs, reference

DTYPES = ("float16", "bfloat16")


@pytest.mark.parametrize("dtype, layout", list(itertools.product(DTYPES, sorted(LAYOUTS))))
def test_sass_has_tensor_core_and_ldmatrix(dtype, layout):
    ta, tb = LAYOUTS[layout]
    for arch, epilogue in (("sm_80", "shared"), ("sm_90a", "shared"), ("sm_90a", "global")):
        func, em = make_gemm(256, 256, 128, dtype, trans_a=ta, trans_b=tb, config=GemmConfig(epilogue=epilogue),
                             arch=arch)
        kernel = mmaemit.compile(func, target=arch)
        mix = kernel.instruction_mix(arch)
        # 128x128 CTA tile, 4 warps of 64x64: per K step 4x8 = 32 m16n8k16 per warp, 2 K steps per 32-wide tile
        assert mix["HMMA"] >= 64, mix
        assert mix["LDSM"] >= 16 and mix["LDGSTS"] > 0, mix
        if arch == "sm_90a" and epilogue == "shared":
            assert mix["STSM"] == 16, mix          # 4x4 micro tiles of 16x16 per warp, one x4 each
        else:
            assert mix.get("STSM", 0) == 0, mix
        usage = kernel.resource_usage(arch)
        assert usage.spill_bytes == 0 and usage.stack_frame_bytes == 0, usage


def test_shape_not_multiple_of_tile_raises():
    with pytest.raises(TileShapeError, match="multiple of the block tile 128"):
        make_gemm(200, 256, 128)
    with pytest.raises(TileShapeError, match="K=48"):
        make_gemm(256, 256, 48)


SHAPES = [(256, 384, 512), (512, 128, 4096), (1024, 1024, 1024)]


# Every dtype x layout x epilogue once on the GPU, the shapes rotated through them (16 kernels, not 48: the full
# product runs on the interpreter's budget elsewhere and adds no new instruction sequence on the device).
GPU_CASES = [(d, lay, SHAPES[i % len(SHAPES)], epi) for i, (d, lay, epi) in
             enumerate(itertools.product(DTYPES, sorted(LAYOUTS), ("shared", "global")))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, layout, shape, epilogue", GPU_CASES)
def test_gemm_matches_float32_reference(dtype, layout, shape, epilogue):
    import torch

    M, N, K = shape
    ta, tb = LAYOUTS[layout]
    func, _ = make_gemm(M, N, K, dtype, trans_a=ta, trans_b=tb, config=GemmConfig(epilogue=epilogue))
    kernel = mmaemit.compile(func)
    A, B = random_inputs(M, N, K, dtype, ta, tb)
    C = torch.full((M, N), float("nan"), dtype=A.dtype, device="cuda")
    kernel(A, B, C)
    ref = reference(A, B, ta, tb)
    assert not torch.isnan(C).any()
    rel = ((C.float() - ref).norm() / ref.norm()).item()
    assert rel < (1e-3 if dtype == "float16" else 8e-3), rel


CONFIGS = [
    GemmConfig(block_m=64, block_n=128, warp_m=32, warp_n=64, stages=2),
    GemmConfig(block_m=128, block_n=256, block_k=64, warp_m=64, warp_n=64, stages=4),
    GemmConfig(block_m=128, block_n=64, warp_m=64, warp_n=32, epilogue="global"),
    GemmConfig(reduce_k=2),
    GemmConfig(reduce_k=2, epilogue="global", warp_order="n_fast"),
    GemmConfig(block_m=64, block_n=64, block_k=64, warp_m=32, warp_n=32, reduce_k=4, stages=3),
    GemmConfig(n_tile=8, warp_order="n_fast", stmatrix_num=1),
    GemmConfig(block_n=64, warp_n=32, n_tile=8, stmatrix_num=2, panel=3),
    GemmConfig(block_m=64, warp_m=32, n_tile=16, stmatrix_num=2, warp_order="n_fast", epilogue="global"),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_config_sass_has_no_spills(config):
    func, em = make_gemm(256, 256, 256, "float16", trans_b=True, config=config, arch="sm_90a")
    kernel = mmaemit.compile(func, target="sm_90a")
    assert kernel.resource_usage("sm_90a").spill_bytes == 0
    mix = kernel.instruction_mix("sm_90a")
    assert mix["HMMA"] > 0 and mix["LDSM"] > 0
    if config.epilogue == "shared":
        matrices = em.warp_rows * em.warp_cols * 2 * em.n_tile // 8
        assert mix["STSM"] * (config.stmatrix_num or 2 * em.n_tile // 8) == matrices


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS)
def test_gemm_other_tile_configs(config):
    import torch

    M, N, K = 512, 512, 1024
    func, _ = make_gemm(M, N, K, "float16", trans_b=True, config=config)
    kernel = mmaemit.compile(func)
    A, B = random_inputs(M, N, K, "float16", False, True)
    C = torch.full((M, N), float("nan"), dtype=A.dtype, device="cuda")
    kernel(A, B, C)
    rel = ((C.float() - reference(A, B, False, True)).norm() / reference(A, B, False, True).norm()).item()
    assert rel < 1e-3, rel


@pytest.mark.gpu
def test_gemm_float16_accumulate_and_float32_output():
    import torch

    M, N, K = 256, 256, 256
    for acc, out in (("float16", "float16"), ("float32", "float32")):
        func, _ = make_gemm(M, N, K, "float16", out_dtype=out, accum_dtype=acc)
        kernel = mmaemit.compile(func)
        A, B = random_inputs(M, N, K, "float16")
        C = torch.full((M, N), float("nan"), dtype=getattr(torch, out), device="cuda")
        kernel(A, B, C)
        rel = ((C.float() - reference(A, B)).norm() / reference(A, B).norm()).item()
        assert rel < (5e-3 if acc == "float16" else 1e-4), (acc, out, rel)


def test_tf32_gemm_on_the_interpreter_rounds_with_cvt_rna():
    """float32 operands run as tf32: the kernel rounds them with cvt.rna, so it matches a tf32-rounded reference
    far better than the unrounded float32 product."""
    import torch

    from mmaemit.interpret import interpret

    M, N, K = 128, 128, 64
    func, em = make_gemm(M, N, K, "float32", trans_b=True, arch="sm_90a")
    assert em.instruction.a_ptx == "tf32"
    A, B = random_inputs(M, N, K, "float32", False, True, device="cpu")
    C = torch.full((M, N), float("nan"))
    assert interpret(func, A, B, C, arch="sm_90a").ok

    def rna_tf32(x):  # round to nearest, ties away, keeping 10 mantissa bits
        b = x.contiguous().view(torch.int32).to(torch.int64)
        b = ((b + 0x1000) & ~0x1FFF) & 0xFFFFFFFF
        return b.to(torch.uint32).view(torch.float32) if hasattr(torch, "uint32") else b.to(torch.int32).view(torch.float32)

    ref_tf32 = rna_tf32(A).double() @ rna_tf32(B).double().T
    ref_f32 = A.double() @ B.double().T
    err_tf32 = ((C.double() - ref_tf32).norm() / ref_tf32.norm()).item()
    err_f32 = ((C.double() - ref_f32).norm() / ref_f32.norm()).item()
    assert err_tf32 < 1e-6 < err_f32 < 2e-3, (err_tf32, err_f32)


def test_tf32_needs_k_contiguous_operands():
    with pytest.raises(mmaemit.UnsupportedConfigError, match="K-contiguous"):
        make_gemm(256, 256, 512, "float32", trans_a=False, trans_b=False)
    with pytest.raises(mmaemit.UnsupportedConfigError, match="K-contiguous"):
        make_gemm(256, 256, 512, "float32", trans_a=True, trans_b=True)


@pytest.mark.gpu
def test_tf32_gemm_on_gpu():
    import torch

    M, N, K = 256, 256, 512
    ta, tb = LAYOUTS["NT"]
    func, _ = make_gemm(M, N, K, "float32", trans_a=ta, trans_b=tb)
    kernel = mmaemit.compile(func)
    A, B = random_inputs(M, N, K, "float32", ta, tb)
    C = torch.full((M, N), float("nan"), device="cuda")
    kernel(A, B, C)
    ref = reference(A, B, ta, tb)
    rel = ((C - ref).norm() / ref.norm()).item()
    assert rel < 2e-3, rel
