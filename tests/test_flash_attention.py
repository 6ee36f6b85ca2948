"""FlashAttention forward (mma.sync): the P-in-registers layout fact, the interpreter against float64, SASS on the
CPU, the torch custom op, and a few GPU checks against torch SDPA."""
import dataclasses
import math

import pytest
import torch

import mmaemit
from mmaemit.runtime.sass import wgmma_accumulator_hazards
from mmaemit import isa
from mmaemit.errors import ArgumentError, LayoutError, TileShapeError, UnsupportedConfigError
from mmaemit.interpret import interpret
from mmaemit.kernels.flash_attention import (AttentionConfig, flash_attention, flash_attention_varlen,
                                             make_flash_attention, reference)
from mmaemit.kernels.flash_attention_hopper import (HopperAttentionConfig, default_hopper_config,
                                                    make_flash_attention_hopper)
from mmaemit.layouts import mma_fragment
from mmaemit.layouts.accumulator_operand import AccumulatorAsOperand, accumulator_as_operand


# ---- the layout fact ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, acc", [("float16", "float32"), ("bfloat16", "float32"), ("float16", "float16")])
def test_two_n8_accumulator_tiles_are_one_k16_a_fragment(dtype, acc):
    m = accumulator_as_operand(dtype, acc)
    m.check()
    ins = isa.select_mma(dtype, dtype, acc, k=16)
    A, C = mma_fragment(ins, "A"), mma_fragment(ins, "C")
    # independent enumeration: every lane's A element equals the accumulator the map names, at the same (row, col)
    for lane in range(32):
        for reg, elems in enumerate(m.pack_order()):
            for elem, (h, creg, celem) in enumerate(elems):
                r, c = C.forward(lane, creg, celem)
                assert A.forward(lane, reg, elem) == (r, 8 * h + c)
    if acc == "float32":   # the packing the kernel emits: A reg a <- n8 tile a // 2, accumulators 2 (a % 2) + {0, 1}
        assert m.pack_order() == [[(a // 2, 2 * (a % 2), 0), (a // 2, 2 * (a % 2) + 1, 0)] for a in range(4)]


def test_accumulator_as_operand_refuses_a_layout_that_needs_a_shuffle():
    # tf32 m16n8k8: A column t + 4 (reg // 2) sits in lane t's quad, but C column 2 t + i % 2 in another lane
    tf32 = isa.select_mma("float32", "float32", "float32", k=8)
    with pytest.raises(LayoutError, match="shuffle"):
        AccumulatorAsOperand(tf32, tf32)
    with pytest.raises(UnsupportedConfigError, match="valid"):
        accumulator_as_operand("float32", "float32")


# ---- interpreter vs float64 ----------------------------------------------------------------------------------------

def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)


def _interpret_case(dtype, D, causal, lens_q, lens_k, H, HK, scale=None, config=None, seed=0, hopper=False):
    g = torch.Generator().manual_seed(seed)
    td = getattr(torch, dtype)
    TQ, TK = sum(lens_q), sum(lens_k)
    q = torch.randn(TQ, H, D, generator=g).to(td)
    k = torch.randn(TK, HK, D, generator=g).to(td)
    v = torch.randn(TK, HK, D, generator=g).to(td)
    cq, ck = _cu(lens_q), _cu(lens_k)
    make, arch = (make_flash_attention_hopper, "sm_90a") if hopper else (make_flash_attention, "sm_80")
    func, _ = make(len(lens_q), max(lens_q), TQ, TK, H, HK, D, dtype, causal, scale, config, arch)
    o = torch.full((TQ, H * D), float("nan"), dtype=td)           # poisoned: every row must be written
    lse = torch.full((H, TQ), float("nan"))
    report = interpret(func, q.view(TQ, -1), k.view(TK, -1), v.view(TK, -1), o, lse, cq, ck, arch=arch)
    ro, rl = reference(q, k, v, causal, scale, cq, ck)
    return report, o.view(TQ, H, D), lse, ro, rl


CASES = [  # dtype, causal, lens_q, lens_k, heads, kv_heads
    ("float16", False, [80], [80], 2, 2),
    ("float16", True, [80], [80], 2, 2),
    ("bfloat16", True, [1, 33, 64], [1, 47, 64], 2, 1),          # ragged, seqlen 1, MQA, bottom-right causal
    ("bfloat16", False, [17, 70], [70, 5], 4, 2),                  # GQA, keys shorter than one block
    ("float16", True, [50, 20], [20, 50], 2, 1),                   # causal with more queries than keys: empty rows
]


@pytest.mark.parametrize("dtype, causal, lens_q, lens_k, H, HK", CASES)
def test_interpreter_matches_float64(dtype, causal, lens_q, lens_k, H, HK):
    report, o, lse, ro, rl = _interpret_case(dtype, 64, causal, lens_q, lens_k, H, HK)
    assert report.ok and not report.errors
    assert report.total_bank_conflicts == 0, report.summary()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    tol = 2e-3 if dtype == "float16" else 1.6e-2
    assert (o.double() - ro).abs().max().item() < tol
    finite = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), finite)            # rows that see no key: LSE = -inf, O = 0
    assert (lse.double()[finite] - rl[finite]).abs().max().item() < 1e-3


def _check(report, o, lse, ro, rl, dtype):
    assert report.ok and not report.errors
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert (o.double() - ro).abs().max().item() < (2e-3 if dtype == "float16" else 1.6e-2)
    finite = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - rl[finite]).abs().max().item() < 1e-3


HOPPER_CASES = [  # dtype, D, causal, lens_q, lens_k, heads, kv_heads
    ("float16", 64, False, [80], [80], 2, 2),
    ("bfloat16", 64, True, [200, 33], [300, 47], 2, 1),          # 2 query tiles, 3 key blocks, ragged, MQA
    ("float16", 128, True, [150, 20], [140, 60], 2, 1),          # more queries than keys: empty rows
    ("float16", 256, False, [70, 9], [130, 40], 4, 2),           # block_n 64: 3 key blocks, GQA
]


@pytest.mark.parametrize("v_major, overlap", [("mn", True), ("k", False)])   # the default; the other schedule
@pytest.mark.parametrize("dtype, D, causal, lens_q, lens_k, H, HK", HOPPER_CASES)
def test_hopper_kernel_on_the_interpreter_matches_float64(dtype, D, causal, lens_q, lens_k, H, HK, v_major, overlap):
    cfg = dataclasses.replace(default_hopper_config(D), overlap=overlap, v_major=v_major)
    report, o, lse, ro, rl = _interpret_case(dtype, D, causal, lens_q, lens_k, H, HK, config=cfg, hopper=True)
    _check(report, o, lse, ro, rl, dtype)


@pytest.mark.parametrize("v_major, overlap", [("k", True), ("mn", False)])
def test_hopper_kernel_other_schedules_on_the_interpreter(v_major, overlap):
    cfg = HopperAttentionConfig(block_n=64, overlap=overlap, v_major=v_major)
    report, o, lse, ro, rl = _interpret_case("float16", 64, True, [150, 40], [150, 100], 2, 1, config=cfg, hopper=True)
    _check(report, o, lse, ro, rl, "float16")


def test_hopper_config_errors():
    with pytest.raises(TileShapeError, match="multiple of 64"):
        make_flash_attention_hopper(1, 64, 64, 64, 2, 2, 64, config=HopperAttentionConfig(block_n=96))
    with pytest.raises(UnsupportedConfigError, match="shared memory"):
        make_flash_attention_hopper(1, 64, 64, 64, 2, 2, 256, config=HopperAttentionConfig(block_n=128))
    with pytest.raises(mmaemit.errors.ArchError):
        make_flash_attention_hopper(1, 64, 64, 64, 2, 2, 64, arch="sm_80")


def test_interpreter_head_dim_128_custom_scale_and_small_tiles():
    cfg = AttentionConfig(block_m=64, block_n=32, warps=2, stages=2)
    report, o, lse, ro, rl = _interpret_case("float16", 128, True, [40, 9], [40, 30], 2, 1, scale=0.3, config=cfg)
    assert report.ok
    assert (o.double() - ro).abs().max().item() < 2e-3
    assert (lse.double() - rl).abs().max().item() < 1e-3


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(UnsupportedConfigError, match="head_dim must be one of"):
        make_flash_attention(1, 64, 64, 64, 2, 2, 96)
    with pytest.raises(UnsupportedConfigError, match="dtype must be one of"):
        make_flash_attention(1, 64, 64, 64, 2, 2, 64, "float32")
    with pytest.raises(UnsupportedConfigError, match="must divide"):
        make_flash_attention(1, 64, 64, 64, 4, 3, 64)
    with pytest.raises(TileShapeError, match="block_m"):
        make_flash_attention(1, 64, 64, 64, 2, 2, 64, config=AttentionConfig(block_m=72))
    q = torch.zeros(1, 8, 2, 64, dtype=torch.float16)
    with pytest.raises(ArgumentError, match="float16 or all"):
        flash_attention(q, q.float(), q.float())
    with pytest.raises(ArgumentError, match="must divide"):
        flash_attention(q, torch.zeros(1, 8, 3, 64, dtype=torch.float16), torch.zeros(1, 8, 3, 64, dtype=torch.float16))


def test_torch_wrappers_on_cpu_use_the_interpreter():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 24, 2, 64, generator=g).half() for _ in range(3))
    o, lse = flash_attention(q, k, v, causal=True)
    ro, rl = reference(q, k, v, causal=True)
    assert o.shape == q.shape and lse.shape == (2, 2, 24)
    assert (o.double() - ro).abs().max() < 2e-3 and (lse.double() - rl).abs().max() < 1e-3
    cu = _cu([10, 14])
    o2, lse2 = flash_attention_varlen(q[0], k[0], v[0], cu, cu, 14)
    ro2, rl2 = reference(q[0], k[0], v[0], False, None, cu, cu)
    assert (o2.double() - ro2).abs().max() < 2e-3 and (lse2.double() - rl2).abs().max() < 1e-3


def test_custom_op_traces_under_torch_compile_fullgraph():
    from mmaemit.kernels.attention_op import flash_attention_op  # noqa: F401 - registers torch.ops.mmaemit

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 16, 2, 64, generator=g).half() for _ in range(3))

    def f(q, k, v):
        o, lse = torch.ops.mmaemit.flash_attention(q, k, v, False, None)
        return o.float() * 2, lse

    o, lse = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    ro, rl = reference(q, k, v)
    assert (o.double() / 2 - ro).abs().max() < 2e-3 and (lse.double() - rl).abs().max() < 1e-3


# ---- SASS (nvcc on the CPU) ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch, D, causal", [("sm_80", 64, False), ("sm_80", 128, True), ("sm_80", 256, False),
                                             ("sm_90a", 128, False), ("sm_90a", 256, True)])
def test_sass_has_no_spills_and_uses_hmma(arch, D, causal):
    func, cfg = make_flash_attention(2, 1024, 2048, 2048, 8, 8, D, "bfloat16" if causal else "float16", causal,
                                     arch=arch)
    kernel = mmaemit.compile(func, target=arch)
    usage = kernel.resource_usage(arch)
    assert usage.spill_bytes == 0 and usage.stack_frame_bytes == 0, usage
    mix = kernel.instruction_mix(arch)
    wr = cfg.block_m // cfg.warps // 16
    # one K/V block per loop trip: S = Q K^T and O += P V each take wr * (block_n / 8) * (D / 16) m16n8k16
    assert mix["HMMA"] >= 2 * wr * (cfg.block_n // 8) * (D // 16), mix
    assert mix["LDSM"] > 0 and mix["LDGSTS"] > 0 and mix["SHFL"] > 0, mix
    assert "LDSM.16.MT88.4" in kernel.sass(arch)               # V through ldmatrix.trans


@pytest.mark.parametrize("D, causal, overlap, v_major", [(128, False, True, "mn"), (256, True, True, "mn"),
                                                        (128, True, False, "k")])
def test_hopper_sass_has_no_spills_and_uses_hgmma(D, causal, overlap, v_major):
    cfg = dataclasses.replace(default_hopper_config(D), overlap=overlap, v_major=v_major)
    func, cfg = make_flash_attention_hopper(2, 1024, 2048, 2048, 8, 8, D, "float16", causal, config=cfg)
    kernel = mmaemit.compile(func, target="sm_90a")
    usage = kernel.resource_usage("sm_90a")
    assert usage.spill_bytes == 0 and usage.stack_frame_bytes == 0, usage
    mix = kernel.instruction_mix("sm_90a")
    # Q K^T k-steps + P V k-steps per block (overlap: P V of block n - 1 in trip n, and the last block's after the loop)
    assert mix["HGMMA"] >= D // 16 + (2 if overlap else 1) * (cfg.block_n // 16), mix
    assert mix.get("HMMA", 0) == 0, mix
    if v_major == "k":                                           # V transposed by the producer
        assert mix["LDSM"] > 0 and mix["STSM"] > 0, mix
    else:
        assert mix.get("LDSM", 0) == 0 and mix.get("STSM", 0) == 0, mix
    sass = kernel.sass("sm_90a")
    assert "UTMALDG.2D" in sass and "SYNCS" in sass
    assert wgmma_accumulator_hazards(sass) == []


# ---- GPU vs torch SDPA (fp32) ----------------------------------------------------------------------------------------

def _sdpa_fp32(q, k, v, causal, scale=None):
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    H, HK = q.shape[2], k.shape[2]
    kf, vf = kf.repeat_interleave(H // HK, 1), vf.repeat_interleave(H // HK, 1)
    o = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=scale)
    s = (qf @ kf.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        L = q.shape[1]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return o.transpose(1, 2), torch.logsumexp(s, -1)


GPU_CASES = [  # dtype, B, S, H, HK, D, causal
    ("float16", 2, 1000, 4, 4, 128, False),
    ("bfloat16", 1, 777, 4, 1, 64, True),
    ("float16", 1, 640, 4, 2, 256, True),
    ("bfloat16", 2, 512, 2, 2, 128, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, B, S, H, HK, D, causal", GPU_CASES)
def test_gpu_matches_sdpa_fp32(dtype, B, S, H, HK, D, causal):
    g = torch.Generator(device="cuda").manual_seed(3)
    td = getattr(torch, dtype)
    q = torch.randn(B, S, H, D, device="cuda", generator=g).to(td)
    k = torch.randn(B, S, HK, D, device="cuda", generator=g).to(td)
    v = torch.randn(B, S, HK, D, device="cuda", generator=g).to(td)
    o, lse = flash_attention(q, k, v, causal=causal)
    ro, rl = _sdpa_fp32(q, k, v, causal)
    tol = 4e-3 if dtype == "float16" else 2.5e-2
    assert (o.float() - ro).abs().max().item() < tol
    assert (lse - rl).abs().max().item() < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, B, S, H, HK, D, causal", [("float16", 2, 1000, 4, 4, 128, False),
                                                          ("bfloat16", 1, 777, 4, 1, 64, True)])
def test_gpu_hopper_kernel_matches_sdpa_fp32(dtype, B, S, H, HK, D, causal):
    g = torch.Generator(device="cuda").manual_seed(6)
    td = getattr(torch, dtype)
    q = torch.randn(B, S, H, D, device="cuda", generator=g).to(td)
    k = torch.randn(B, S, HK, D, device="cuda", generator=g).to(td)
    v = torch.randn(B, S, HK, D, device="cuda", generator=g).to(td)
    o, lse = flash_attention(q, k, v, causal=causal, implementation="wgmma")
    ro, rl = _sdpa_fp32(q, k, v, causal)
    assert (o.float() - ro).abs().max().item() < (4e-3 if dtype == "float16" else 2.5e-2)
    assert (lse - rl).abs().max().item() < 2e-3


@pytest.mark.gpu
def test_gpu_varlen_ragged_matches_float64():
    g = torch.Generator(device="cuda").manual_seed(4)
    lens_q, lens_k = [300, 1, 129], [300, 77, 500]
    cq, ck = _cu(lens_q).cuda(), _cu(lens_k).cuda()
    q = torch.randn(sum(lens_q), 4, 128, device="cuda", generator=g).half()
    k = torch.randn(sum(lens_k), 2, 128, device="cuda", generator=g).half()
    v = torch.randn(sum(lens_k), 2, 128, device="cuda", generator=g).half()
    o, lse = flash_attention_varlen(q, k, v, cq, ck, max(lens_q), causal=True)
    ro, rl = reference(q, k, v, True, None, cq, ck)
    assert (o.cpu().double() - ro).abs().max().item() < 4e-3
    assert (lse.cpu().double() - rl).abs().max().item() < 2e-3


@pytest.mark.gpu
def test_gpu_custom_op_under_torch_compile():
    from mmaemit.kernels.attention_op import flash_attention_op  # noqa: F401

    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 1000, 4, 128, device="cuda", generator=g).half() for _ in range(3))
    f = torch.compile(lambda q, k, v: torch.ops.mmaemit.flash_attention(q, k, v, False, None), fullgraph=True)
    o, lse = f(q, k, v)
    ro, rl = _sdpa_fp32(q, k, v, False)
    assert (o.float() - ro).abs().max().item() < 4e-3 and (lse - rl).abs().max().item() < 2e-3


def test_benchmark_reference_rows_and_configs():
    """The benchmark's correctness check (float32 math on a few query rows) agrees with the float64 reference, and
    its ablation columns name valid configurations."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench_attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 48, 4, 64, generator=g)
    k, v = (torch.randn(1, 48, 2, 64, generator=g) for _ in range(2))
    for causal in (False, True):
        idx, ro, rl = bench.rows_reference(q, k, v, causal, rows=8)
        RO, RL = reference(q, k, v, causal)
        assert (RO[0, idx, :2] - ro).abs().max() < 1e-5 and (RL[0, :2][:, idx] - rl).abs().max() < 1e-5
    for name in bench.ABLATIONS:
        for D in (64, 128, 256):
            cfg = bench.impl_config(name, D)
            builder = make_flash_attention if bench.IMPLS[name] == "mma_sync" else make_flash_attention_hopper
            builder(1, 128, 128, 128, 2, 2, D, "float16", False, None, cfg, "sm_90a")   # parses: a valid config
