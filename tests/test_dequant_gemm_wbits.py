"""W8 / W2 / W1 (and W4) weights in the dequant kernels: the kernel layout for every bit width, its decode-slice
rule checked against the mma B-fragment map, interpreter runs of the GEMV and tiled paths, GPU correctness."""
import ml_dtypes
import numpy as np
import pytest
import torch

import mmaemit
from mmaemit import dequant as D
from mmaemit import isa
from mmaemit.dequant.decode import decode_program
from mmaemit.dequant.formats import get_format
from mmaemit.dequant.kernel_layout import (from_kernel_layout, from_kernel_scales, k_permutation, kernel_arguments,
                                           to_kernel_layout, words_per_chunk)
from mmaemit.errors import ArgumentError
from mmaemit.layouts import mma_fragment


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_kernel_layout_round_trip_every_bit_width(bits):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 1 << bits, (48, 320), generator=g, dtype=torch.uint8)
    words = to_kernel_layout(codes, bits)
    assert words.dtype == torch.int32 and tuple(words.shape) == (3, 5, 32, bits) and words_per_chunk(bits) == bits
    assert torch.equal(from_kernel_layout(words, bits), codes)
    assert np.array_equal(from_kernel_layout(to_kernel_layout(codes.numpy(), bits), bits), codes.numpy())
    # 16 x 64 codes of b bits per n16 block and chunk = 32 lanes x WPC words: every code bit lands somewhere
    flipped = codes.clone()
    flipped[37, 301] ^= 1
    assert not torch.equal(to_kernel_layout(flipped, bits), words)


def test_kernel_layout_refuses_a_word_count_that_is_not_the_bit_width():
    words = to_kernel_layout(torch.randint(0, 4, (16, 128), dtype=torch.uint8), 2)
    with pytest.raises(ArgumentError, match="WPC = bits"):
        from_kernel_layout(words, 4)
    with pytest.raises(mmaemit.UnsupportedConfigError, match="valid: 1, 2, 4, 8"):
        to_kernel_layout(torch.zeros(16, 64, dtype=torch.uint8), 3)
    with pytest.raises(mmaemit.TileShapeError, match="multiple of 16"):
        to_kernel_layout(torch.zeros(8, 64, dtype=torch.uint8), 8)


@pytest.mark.parametrize("fmt, dtype, fast", [("uint8", "float16", True), ("int8", "bfloat16", False),
                                              ("int8", "bfloat16", True), ("int8_ob", "bfloat16", True),
                                              ("float8_e4m3fn", "float16", True), ("int4", "float16", True),
                                              ("nf4", "bfloat16", False), ("nf4", "bfloat16", True),
                                              ("nf4", "float16", True), ("int2", "float16", True),
                                              ("uint2", "bfloat16", False), ("int1", "float16", True),
                                              ("uint1", "bfloat16", True)])
def test_decode_slices_are_the_mma_b_fragments(fmt, dtype, fast):
    """The kernels' rule: lane l's decode outputs of its WPC words of an n16 x k64 block, concatenated (word w ->
    registers [w R, (w + 1) R), R = 16 / b), are its B-fragment registers 4 s + r of the 4 k16 steps s, r = 0..3 =
    (n0 b0, n0 b1, n1 b0, n1 b1). Checked on the CPU with the decode program against mmaemit.layouts' B map."""
    f = get_format(fmt)
    b = f.bits
    N, K = 32, 128
    codes = torch.randint(0, 1 << b, (N, K), generator=torch.Generator().manual_seed(b), dtype=torch.uint8)
    if fmt == "float8_e4m3fn":
        codes[(codes & 0x7F) == 0x7F] ^= 1          # no NaN codes: compare values
    words = to_kernel_layout(codes, b).numpy()                         # [N/16, K/64, 32, WPC]
    prog = decode_program(fmt, dtype, "none", "sm_90a", fast=fast)
    assert prog.registers == 16 // b and prog.fast == fast
    got = prog.evaluate(words).reshape(N // 16, K // 64, 32, 16, 2)     # [.., lane, chunk register 4 s + r, half]

    Bmap = mma_fragment(isa.select_mma("float16", "float16", "float32", k=16), "B")
    nb, kq, lane, reg, e = np.meshgrid(np.arange(N // 16), np.arange(K // 64), np.arange(32), np.arange(16),
                                       np.arange(2), indexing="ij")
    s, r = reg // 4, reg % 4
    k_in, n_in = Bmap.forward(lane, r % 2, e)                # register r = b(r % 2) of n8 tile r // 2
    n = 16 * nb + 8 * (r // 2) + n_in
    k = k_permutation(K)[64 * kq + 16 * s + k_in]
    # the values rounded once to the output dtype (exact for all but nf4, whose table entries are float32 values)
    want = f.decode(codes.numpy())[n, k].astype(np.float32).astype(ml_dtypes.bfloat16 if dtype == "bfloat16"
                                                                    else np.float16)
    assert got.dtype == want.dtype and np.array_equal(got.astype(np.float64), want.astype(np.float64))
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_kernel_arguments_take_the_bit_width_from_the_format():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)).half()
    qw8 = D.quantize(w, D.QuantScheme("int8", group_size=128))
    (W, S), kw = kernel_arguments(qw8)
    assert kw == {"group_size": 128, "weight_format": "int8", "zeros_mode": None}
    assert tuple(W.shape) == (4, 4, 32, 8) and tuple(S.shape) == (4, 2, 4, 4)
    assert torch.equal(from_kernel_layout(W, 8), qw8.codes())
    qw2 = D.quantize(w, D.QuantScheme("uint2", group_size=64, zeros_mode="quantized"))
    (W, S, Z), kw = kernel_arguments(qw2)
    assert kw == {"group_size": 64, "weight_format": "uint2", "zeros_mode": "quantized"}
    assert tuple(W.shape) == (4, 4, 32, 2) and Z.dtype == torch.int16 and tuple(Z.shape) == (4, 4, 4, 4)
    assert torch.equal(from_kernel_layout(W, 2), qw2.codes())
    z = D.unpack_zeros(qw2.zeros, 2)
    assert z.max() > 0 and torch.equal(from_kernel_scales(Z).to(z.dtype), z)
    with pytest.raises(mmaemit.UnsupportedConfigError, match="'float8_e5m2'.*not 'mxfp4'"):
        kernel_arguments(D.quantize(w.float(), D.QuantScheme("mxfp4")))


# ------------------------------------------------------------------------------------------------ the kernels
def _problem(fmt, mode, M, N, K, group, dtype, device="cpu", seed=0):
    """Random weights quantized to ``fmt`` (zeros ``mode`` for unsigned formats): the kernel arguments (A, W, S[, Z])
    from kernel_arguments, the kernel keywords, and a float64 reference A @ dequantize(W)^T (weights rounded to A's
    dtype where the kernel applies scale / zero at decode time, i.e. with zeros)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g).to(dtype)
    scheme = D.QuantScheme(fmt, group_size=group, zeros_mode=mode)
    qw = D.quantize(w, scheme)
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).to(dtype)
    if mode is None:
        W_ref = qw.dequantize("float32")
    else:
        zeros = qw.zeros if mode == "quantized" else qw.zeros.to(dtype)    # the kernel's zeros are in A's dtype
        W_ref = D.dequantize_codes(qw.codes(), scheme, qw.scales, zeros, out_dtype=str(dtype)[6:])
    ref = A.double() @ torch.as_tensor(W_ref).double().T
    return [t.to(device) for t in (A, *tensors)], kw, ref


def _rel(C, ref):
    assert not torch.isnan(C).any()
    return ((C.double().cpu() - ref).norm() / ref.norm()).item()


_TOL = {torch.float16: 2e-3, torch.bfloat16: 8e-3}
_CASES = [("int8", None, torch.float16), ("uint8", "quantized", torch.float16), ("float8_e4m3fn", None, torch.float16),
          ("int2", None, torch.float16), ("uint2", "original", torch.float16), ("int1", None, torch.float16),
          ("uint1", "rescale", torch.bfloat16), ("int8", None, torch.bfloat16)]


@pytest.mark.parametrize("fmt, mode, dtype", _CASES + [("int8_ob", None, torch.float16), ("int2", None, torch.bfloat16),
                                                      ("uint1", "quantized", torch.float16)])
def test_gemv_every_bit_width_on_the_interpreter(fmt, mode, dtype):
    from mmaemit.kernels.dequant_gemm import GemvConfig, make_dequant_gemv

    M, N, K = 1 + len(fmt) % 7, 64, 512
    args, kw, ref = _problem(fmt, mode, M, N, K, 128, dtype)
    func, _ = make_dequant_gemv(M, N, K, dtype=str(dtype)[6:], config=GemvConfig(n_blocks=2, k_slices=2, stages=3),
                                arch="sm_90a", **kw)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    report = mmaemit.interpret(func, *args, C, arch="sm_90a")
    assert report.ok, report.summary()
    assert _rel(C, ref) < _TOL[dtype]


@pytest.mark.parametrize("fmt, mode, dtype, M", [("int8", None, torch.float16, 32), ("uint2", "original", torch.float16, 19),
                                              ("uint4", "quantized", torch.bfloat16, 25), ("int1", None, torch.float16, 17),
                                              ("float8_e4m3fn", None, torch.bfloat16, 30)])
def test_gemv32_every_bit_width_on_the_interpreter(fmt, mode, dtype, M):
    """The gemv32 path's kernel (symbolic M, m_max=32, two m16 tiles per warp) for 8-, 2-, 1-bit and zero-point
    formats: the stash of 2 / 1-bit words and decode-time zeros with both tiles fed from one decode."""
    from mmaemit.kernels.dequant_gemm import GemvConfig, make_dequant_gemv

    N, K = 64, 512
    args, kw, ref = _problem(fmt, mode, M, N, K, 128, dtype, seed=M)
    func, _ = make_dequant_gemv(None, N, K, dtype=str(dtype)[6:], config=GemvConfig(n_blocks=1, k_slices=2, stages=3),
                                arch="sm_90a", m_max=32, **kw)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    report = mmaemit.interpret(func, *args, C, arch="sm_90a")
    assert report.ok, report.summary()
    assert _rel(C, ref) < _TOL[dtype]


@pytest.mark.parametrize("fmt, mode, dtype", _CASES + [("float8_e5m2", None, torch.float16),
                                                      ("int2_ob", None, torch.float16),
                                                      ("uint1", "original", torch.float16)])
def test_tiled_every_bit_width_on_the_interpreter(fmt, mode, dtype):
    from mmaemit.kernels.dequant_gemm import TiledConfig, make_dequant_gemm_tiled

    M, N, K = 17 + 3 * len(fmt), 64, 512
    args, kw, ref = _problem(fmt, mode, M, N, K, 128, dtype)
    func, _ = make_dequant_gemm_tiled(M, N, K, dtype=str(dtype)[6:], arch="sm_90a", **kw,
                                      config=TiledConfig(block_m=32, block_n=64, warp_m=32, warp_n=32, stages=3))
    C = torch.full((M, N), float("nan"), dtype=dtype)
    report = mmaemit.interpret(func, *args, C, arch="sm_90a")
    assert report.ok and report.total_bank_conflicts == 0, report.summary()
    assert _rel(C, ref) < _TOL[dtype]


@pytest.mark.parametrize("fmt, copy, lds", [("int8", "LDGSTS.E.BYPASS.128", "LDS.128"),
                                            ("int2", "LDGSTS.E.64", "LDS.64"), ("int1", "LDGSTS.E", "LDS")])
def test_gemv_sass_copies_b_bytes_per_lane_and_chunk(fmt, copy, lds):
    """8-bit: two 16-byte cp.async.cg per lane, block and chunk; 2 / 1-bit: one 8- / 4-byte cp.async.ca; no spills
    (weights only: without the operand ring, whose activation and scale copies would add 16- and 8-byte ones)."""
    from mmaemit.kernels.dequant_gemm import GemvConfig, make_dequant_gemv

    kernel = mmaemit.compile(make_dequant_gemv(1, 8192, 8192, 128, config=GemvConfig(operand_ring=False), arch="sm_90a",
                                               weight_format=fmt)[0], target="sm_90a")
    hist = kernel.opcode_histogram("sm_90a")
    copies = {k: v for k, v in hist.items() if k.startswith("LDGSTS")}
    # 2 n16 blocks x ((stages - 1) prologue chunks + 4 in the loop body: at M <= 8 it takes lcm(2, stages) chunks)
    # = 14 copies of 16 / 8 / 4 bytes
    assert copies == {copy: 28 if fmt == "int8" else 14}, copies
    assert hist.get(lds, 0) >= (8 if fmt == "int8" else 4)
    assert kernel.resource_usage("sm_90a").spill_bytes == 0


def test_kernels_refuse_formats_and_shapes_they_cannot_take():
    from mmaemit.kernels.dequant_gemm import GemvConfig, make_dequant_gemm, make_dequant_gemv

    with pytest.raises(mmaemit.UnsupportedConfigError, match="'float8_e5m2', .*not 'mxfp4'"):
        make_dequant_gemm(1, 256, 4096, weight_format="mxfp4")
    with pytest.raises(mmaemit.UnsupportedConfigError, match="'uint1', 'uint2', 'uint4', 'uint8' .*not 'int8'"):
        make_dequant_gemm(64, 256, 4096, weight_format="int8", zeros_mode="quantized")
    with pytest.raises(mmaemit.MmaemitError, match="marlin"):     # the int4 fp16 decode variant is not for 8-bit
        make_dequant_gemv(1, 256, 4096, config=GemvConfig(decode_variant="marlin"), weight_format="int8")
    # W in the 4-bit layout handed to an 8-bit kernel: a typed error naming the expected shape
    func, _ = make_dequant_gemv(1, 64, 512, config=GemvConfig(n_blocks=2, k_slices=2, stages=3), arch="sm_90a",
                                weight_format="int8")
    A = torch.randn(1, 512).half()
    W4 = to_kernel_layout(torch.randint(0, 16, (64, 512), dtype=torch.uint8), 4)
    S = torch.randn(4, 4, 4, 4).half()
    with pytest.raises(ArgumentError, match=r"dimension 3 is 4, the kernel expects 8"):
        mmaemit.interpret(func, A, W4, S, torch.empty(1, 64).half(), arch="sm_90a")


_GPU_CASES = [("int8", None), ("uint8", "quantized"), ("float8_e4m3fn", None), ("int2", None), ("uint2", "original"),
              ("uint1", "rescale")]


_GPU_CASES_BY_DTYPE = [(f, m, torch.float16) for f, m in _GPU_CASES] + [("int8", None, torch.bfloat16),
                                                                        ("int2", None, torch.bfloat16)]


@pytest.mark.gpu
# two of M = 1 / 16 (GEMV) / 128 (tiled) per case, taken in turn so that each M meets most formats (the interpreter
# runs every format through both kernels: test_gemv_ / test_tiled_every_bit_width_on_the_interpreter)
@pytest.mark.parametrize("fmt, mode, dtype, M", [(*case, (1, 16, 128)[(2 * i + j) % 3])
                                                 for i, case in enumerate(_GPU_CASES_BY_DTYPE) for j in range(2)])
def test_every_bit_width_on_gpu(fmt, mode, dtype, M):
    from mmaemit.arch import device_arch
    from mmaemit.kernels.dequant_gemm import make_dequant_gemm

    N, K = 256, 1024
    args, kw, ref = _problem(fmt, mode, M, N, K, 128, dtype, device="cuda", seed=M)
    func, _ = make_dequant_gemm(M, N, K, dtype=str(dtype)[6:], arch=device_arch().name, **kw)
    kernel = mmaemit.compile(func)
    C = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
    kernel(*args, C)
    assert _rel(C, ref) < _TOL[dtype], (fmt, mode, M)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, mode", _GPU_CASES)
def test_gemv32_every_bit_width_on_gpu(fmt, mode):
    """DequantGemm's gemv32 path (M = 17 .. 32 for formats without a fused Hopper path): one symbolic-M kernel, ragged
    and full M, poisoned outputs."""
    from mmaemit.arch import device_arch
    from mmaemit.kernels.dequant_gemm import GemvConfig, make_dequant_gemv

    N, K = 256, 1024
    kernel = None
    for M in (17, 32):
        args, kw, ref = _problem(fmt, mode, M, N, K, 128, torch.float16, device="cuda", seed=M)
        if kernel is None:
            kernel = mmaemit.compile(make_dequant_gemv(None, N, K, config=GemvConfig(n_blocks=1),
                                                       arch=device_arch().name, m_max=32, **kw)[0])
        C = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
        kernel(*args, C)
        assert _rel(C, ref) < _TOL[torch.float16], (fmt, mode, M)
