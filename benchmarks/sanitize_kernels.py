"""Run each library kernel once at a small shape, for compute-sanitizer (memcheck, racecheck, synccheck, initcheck).

    compute-sanitizer --tool memcheck  python3 benchmarks/sanitize_kernels.py [names ...]
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_kernels.py [names ...]

Each case builds its kernel, runs it on random inputs with a poisoned output and checks the result against a torch
reference, so a sanitizer run also proves the instrumented kernel still computes the right thing. ``--list`` names
the cases. Exit 1 if any check fails (the sanitizer's own exit code reports its findings).
"""
from __future__ import annotations

import sys

import torch

import mmaemit

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def _rel(C, ref):
    return ((C.double() - ref).norm() / ref.norm()).item()


@case
def gemm_mma():
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm, random_inputs, reference

    func, _ = make_gemm(256, 256, 128, "float16", config=GemmConfig())
    k = mmaemit.compile(func)
    A, B = random_inputs(256, 256, 128, "float16", seed=1)
    C = torch.full((256, 256), float("nan"), dtype=A.dtype, device="cuda")
    k(A, B, C)
    return _rel(C, reference(A, B).double()) < 2e-3


def _hopper(M, N, K, dtype, trans_a=False, trans_b=True, **cfg):
    from mmaemit.kernels.gemm_hopper import HopperGemmConfig, default_out_dtype, make_gemm_hopper

    k = mmaemit.compile(make_gemm_hopper(M, N, K, dtype, None, trans_a, trans_b, config=HopperGemmConfig(**cfg))[0])
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    out = getattr(torch, default_out_dtype(dtype))
    if dtype == "int8":
        A = torch.randint(-128, 128, (M, K), generator=g, device="cuda", dtype=torch.int8)
        B = torch.randint(-128, 128, (N, K), generator=g, device="cuda", dtype=torch.int8)
    else:
        A = (torch.randn(M, K, generator=g, device="cuda") / K ** 0.25).to(getattr(torch, dtype))
        B = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.25).to(getattr(torch, dtype))
    C = torch.full((M, N), -1 if out == torch.int32 else float("nan"), dtype=out, device="cuda")
    args = [A.T.contiguous() if trans_a else A, B if trans_b else B.T.contiguous(), C]
    if dtype.startswith("float8"):
        args += [torch.ones(1, device="cuda"), torch.ones(1, device="cuda")]
    k(*args)
    ref = A.double() @ B.double().T
    return torch.equal(C.double(), ref) if out == torch.int32 else _rel(C, ref) < 3e-3


@case
def hopper_gemm_f16():
    return _hopper(512, 512, 512, "float16")


@case
def hopper_gemm_ragged():
    return _hopper(300, 520, 264, "bfloat16")


@case
def hopper_gemm_cluster():
    return _hopper(512, 512, 512, "float16", cluster_m=2, epilogue="overlap")


@case
def hopper_gemm_int8():
    return _hopper(256, 512, 512, "int8")


@case
def hopper_gemm_fp8():
    return _hopper(256, 512, 512, "float8_e4m3fn")


@case
def hopper_example():
    import runpy
    from pathlib import Path
    runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "gemm_hopper.py"), run_name="__main__")
    return True                                   # the example asserts its own error bound


@case
def hopper_gemm_mn_major():
    return _hopper(320, 512, 256, "float16", trans_a=True, trans_b=False)


def _attention(implementation):
    from mmaemit.kernels.flash_attention import flash_attention as fa
    from mmaemit.kernels.flash_attention import reference
    g = torch.Generator(device="cuda").manual_seed(5)
    ok = True
    for causal, (B, S, SK, H, HK, D) in ((False, (2, 200, 200, 4, 2, 64)), (True, (1, 130, 130, 2, 1, 128))):
        q = torch.randn(B, S, H, D, generator=g, device="cuda").half()
        k = torch.randn(B, SK, HK, D, generator=g, device="cuda").half()
        v = torch.randn(B, SK, HK, D, generator=g, device="cuda").half()
        o, lse = fa(q, k, v, causal=causal, implementation=implementation)
        ro, rlse = reference(q, k, v, causal=causal)
        ok &= (o.cpu().double() - ro.double()).abs().max().item() < 2e-2
        ok &= (lse.cpu().double() - rlse.double()).abs().max().item() < 1e-3
    return bool(ok)


@case
def flash_attention():
    return _attention("mma_sync")


@case
def flash_attention_hopper():
    return _attention("wgmma")


def _int4_weights(n, k, fmt="int4", dtype=torch.float16, zeros_mode=None):
    """Random g128 weights [n, k] (int4 unless ``fmt``; zero points with ``zeros_mode``) in the kernel layout on the
    GPU, their kwargs and the exact float64 weight."""
    from mmaemit.dequant import QuantScheme, quantize
    from mmaemit.dequant.kernel_layout import kernel_arguments

    qw = quantize(torch.randn(n, k).to(dtype), QuantScheme(fmt, 128, zeros_mode))
    tensors, kw = kernel_arguments(qw)
    return [t.cuda() for t in tensors], kw, qw.dequantize().double().cuda()


@case
def dequant_tiled_paths():
    """The symbolic-M mma.sync paths of the plan without fused kernels (what serves M > 16 for other formats and
    without wgmma) at ragged M: gemv32 (four n8 token tiles per warp), tiled64, tiled128."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    tensors, kw, w = _int4_weights(512, 1024)
    dg = DequantGemm(512, 1024, arch="sm_90a", large_m=1000, fused=False, **kw)
    assert [dg.path_for(m) for m in (20, 33, 100)] == ["gemv32", "tiled64", "tiled128"]
    ok = True
    for M in (20, 33, 100):                             # gemv32, tiled64, tiled128
        x = torch.randn(M, 1024, device="cuda").half()
        ok &= _rel(dg(x, *tensors), x.double() @ w.T) < 3e-3
    return bool(ok)


@case
def dequant_every_path():
    from mmaemit.nn import QuantLinear
    torch.manual_seed(6)
    lin = torch.nn.Linear(1024, 512, bias=True).half().cuda()
    q = QuantLinear.from_linear(lin, "int4", group_size=128).warmup()
    w = q.dequantized_weight().double().cuda()
    ok = True
    # gemv8, gemv16, fused32, fused48, fused64, fused96, fused128, fused160, fused192, fused224, fused256k,
    # fused128x2, fused256 (int4's plan has no dense path: dequant_dense_path)
    for M in (1, 12, 20, 40, 50, 70, 100, 140, 180, 210, 250, 300, 600, 4100):
        x = torch.randn(M, 1024, device="cuda").half()
        y = q(x)
        ref = x.double() @ w.T + lin.bias.double()
        ok &= _rel(y, ref) < 3e-3
    return bool(ok)


@case
def dequant_dense_path():
    """The two-kernel dense path (dequant into a scratch weight, then the Hopper GEMM) at a ragged M, as nf4's and
    8-bit weights' plans take it from FUSED_DENSE_M."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    tensors, kw, w = _int4_weights(512, 1024)
    dg = DequantGemm(512, 1024, arch="sm_90a", dense_m=1000, **kw)
    assert dg.path_for(1100) == "dense"
    x = torch.randn(1100, 1024, device="cuda").half()
    return bool(_rel(dg(x, *tensors), x.double() @ w.T) < 3e-3)


@case
def dequant_hopper_fused():
    """The fused Hopper int4 dequant GEMM at each of its tile shapes, each at a ragged M and out of its plan range."""
    from mmaemit.kernels.dequant_dispatch import FUSED_PATHS, DequantGemm

    tensors, kw, w = _int4_weights(512, 1024)
    dg = DequantGemm(512, 1024, arch="sm_90a", **kw)
    ok = True
    for path in FUSED_PATHS:
        for M in (7, 130):
            x = torch.randn(M, 1024, device="cuda").half()
            ok &= _rel(dg.run_path(path, x, *tensors), x.double() @ w.T) < 3e-3
    return bool(ok)


def _paths_with(k, overrides, cases, launches=1):
    """Each (path, M) of ``cases`` by name on random 512 x ``k`` int4 weights, the paths' default configs with
    ``overrides``, each launched ``launches`` times, against the float64 product."""
    import dataclasses

    from mmaemit.kernels.dequant_dispatch import _DEFAULTS, DequantGemm

    tensors, kw, w = _int4_weights(512, k)
    cfgs = {p: dataclasses.replace(_DEFAULTS[p], **overrides) for p, _ in cases}
    dg = DequantGemm(512, k, arch="sm_90a", configs=cfgs, **kw)
    ok = True
    for path, M in cases:
        x = torch.randn(M, k, device="cuda").half()
        for _ in range(launches):
            ok &= _rel(dg.run_path(path, x, *tensors), x.double() @ w.T) < 3e-3
    return bool(ok)


@case
def dequant_kept_stages():
    """handover="stage" (fused128's default; fused32's ring with it) on 2 persistent CTAs that walk 4 tiles each: the
    consumers' sums and the output tile in kept ring stages, the next tile's loads waiting for their release."""
    return _paths_with(1024, dict(num_sms=2, handover="stage"), (("fused32", 30), ("fused128", 100), ("fused128", 250)))


@case
def dequant_stream_k():
    """stream_k on 5 persistent CTAs: 512 x 1024 weights give 8 tiles of 64 rows (k_split rings) or 4 of 128 (two
    consumer groups), so the last wave's stages go out in pieces (fp32 partial sums in the global workspace, the
    tile's counter, the last piece summing them): fused64 (parallel hand-over), fused128 (kept stages, fit_rows),
    fused128x2 (no k_split), each launched twice (the counters return to zero)."""
    return _paths_with(1024, dict(num_sms=5, stream_k=True, stream_k_min_chunks=0, stream_k_waves=None),
                       (("fused64", 50), ("fused128", 100), ("fused128x2", 300)), launches=2)


@case
def dequant_short_row_boxes():
    """The short last tile row of the stage-box rings (fused32, fused64, fused128x2) with ``fit_rows`` (a box per
    chunk of its height), on 2 persistent CTAs that walk whole rows before the short one."""
    return _paths_with(2048, dict(num_sms=2, fit_rows=True), (("fused32", 75), ("fused64", 100), ("fused128x2", 300)))


@case
def dequant_two_rows():
    """TWO_ROW_PATHS through the plan at 4096 x 4096 (64 tiles of 64 columns per row, two rows in one wave): fused96 /
    fused160 / fused192 / fused224 each at an M whose second tile row is short."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    tensors, kw, w = _int4_weights(4096, 4096)
    dg = DequantGemm(4096, 4096, arch="sm_90a", **kw)
    cases = (("fused96", 170), ("fused160", 300), ("fused192", 350), ("fused224", 420))
    assert [dg.path_for(m) for _, m in cases] == [p for p, _ in cases], [dg.path_for(m) for _, m in cases]
    ok = True
    for _, M in cases:
        x = torch.randn(M, 4096, device="cuda").half()
        ok &= _rel(dg(x, *tensors), x.double() @ w.T) < 3e-3
    return bool(ok)


def _fused_plan(weights, ms):
    """Each (format, dtype, zeros mode) of ``weights`` through the DequantGemm plan at every M of ``ms`` (ragged M on
    each path of the plan), against the float64 product."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    ok = True
    for fmt, dtype, zm in weights:
        tensors, kw, w = _int4_weights(512, 1024, fmt, dtype, zm)
        # fill_waves=False: the M-only plan, one path per range (N = 512 would otherwise give fused32 rows up to 512)
        dg = DequantGemm(512, 1024, dtype=str(dtype)[6:], arch="sm_90a", fill_waves=False, **kw)
        for M in ms:
            x = torch.randn(M, 1024, device="cuda").to(dtype)
            ok &= _rel(dg(x, *tensors), x.double() @ w.T) < (3e-3 if dtype == torch.float16 else 1e-2)
    return bool(ok)


@case
def dequant_hopper_fused_8_2_bit():
    """The fused Hopper kernel with 8-bit (bf16, split-magic decode: two bundle words per quad lane, 8-bit rings) and
    2-bit weights (bundles shifted into place after the transpose), each plan path of M <= 300 at a ragged M."""
    return _fused_plan((("int8", torch.bfloat16, None), ("int2", torch.float16, None)),
                       (5, 13, 20, 40, 60, 90, 120, 150, 300))


@case
def dequant_hopper_fused_zero_points():
    """The fused Hopper kernel with zero points (asymmetric GPTQ / AWQ: uint4 with integer zero codes, fp16; uint4 with
    float zeros, bf16): a second ring box next to the scales, each plan path of M <= 300 at a ragged M."""
    return _fused_plan((("uint4", torch.float16, "quantized"), ("uint4", torch.bfloat16, "original")),
                       (5, 13, 20, 40, 60, 90, 120, 150, 300))


@case
def dequant_hopper_fused_nf4():
    """nf4 weights, fp16 and bf16, through the plan at a ragged M of each path up to M = 300: the GEMVs (gemv8,
    gemv16: the shared pair table, 32 KB filled at entry and read with per-lane offsets) and the fused Hopper kernel
    (each row's scaled 16-value table built once per scale group, then prmt lookups)."""
    return _fused_plan((("nf4", torch.float16, None), ("nf4", torch.bfloat16, None)),
                       (1, 5, 13, 20, 40, 60, 90, 120, 150, 300))


@case
def dequant_gated():
    """The gated (SwiGLU) dequant GEMM: gemv8 / gemv16 with the gate in their epilogue, gemv32 and a fused path
    gating the full product with torch, fp16 and bf16 (gelu_tanh), against the float64 reference."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm
    from mmaemit.kernels.gated import gate_torch, interleave_gated

    ok = True
    for dtype, act in ((torch.float16, "silu"), (torch.bfloat16, "gelu_tanh")):
        (tg, kw, wg), (tu, _, wu) = _int4_weights(256, 1024, "int4", dtype), _int4_weights(256, 1024, "int4", dtype)
        tensors = [interleave_gated(a, b) for a, b in zip(tg, tu)]
        dg = DequantGemm(512, 1024, dtype=str(dtype)[6:], arch="sm_90a", gated=act, **kw)
        for M in (1, 5, 13, 20, 40):
            x = torch.randn(M, 1024, device="cuda").to(dtype)
            ref = gate_torch(act, x.double() @ wg.T, x.double() @ wu.T).double()
            ok &= _rel(dg(x, *tensors), ref) < (3e-3 if dtype == torch.float16 else 1e-2)
    return bool(ok)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--list" in argv:
        print("\n".join(CASES))
        return 0
    names = argv or list(CASES)
    bad = [n for n in names if n not in CASES]
    if bad:
        print(f"unknown cases {bad}; valid: {list(CASES)}")
        return 2
    failures = 0
    for n in names:
        try:
            ok = CASES[n]()
            torch.cuda.synchronize()
            why = ""
        except Exception as e:  # noqa: BLE001 - report and go on to the next case
            ok, why = False, f" ({type(e).__name__}: {e})"
        print(f"{n}: {'PASS' if ok else 'FAIL'}{why}", flush=True)
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
