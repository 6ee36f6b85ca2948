"""``mmaemit`` command line.

* ``mmaemit demo``: build the hand-composed GEMM example. With a GPU: run it on random inputs for fp16 and bf16,
  check it against a float32 torch reference and time it beside ``torch.matmul``. Without a GPU: build it for sm_80
  and sm_90a, print the SASS instruction mix, and check it numerically through the CPU interpreter when available.
  Exit code 0 only if every check passes.
* ``mmaemit table``: the mma.sync and wgmma instruction tables (Markdown, generated from ``mmaemit.isa``).
* ``mmaemit bench gemm|int8|fp8|dequant [...]``: check and time mmaemit's kernels (default and autotuned
  configurations) beside their torch peers; print a table, write ``<out>/<suite>.md``, ``.csv`` and ``.png``. Needs a
  GPU (``--dry-run`` exercises the report with made-up timings).
* ``mmaemit layout show fragment|ldmatrix|stmatrix|swizzle|raster [...] -o FILE.png``: draw a layout.
"""
from __future__ import annotations

import argparse
import sys
import time

MIX_KEYS = ("HMMA", "IMMA", "QMMA", "HGMMA", "LDSM", "STSM", "LDGSTS", "LDG", "STG", "LDS", "STS", "BAR")
HOPPER_KEYS = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "SYNCS", "USETMAXREG")


def _cmd_table(args) -> int:
    from . import isa

    print(isa.markdown_table())
    print()
    print(isa.wgmma_markdown_table())
    return 0


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _demo_gpu(args) -> int:
    import torch

    import mmaemit
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm, random_inputs, reference
    from mmaemit.runtime.timing import median_time

    n = args.size
    print(f"mmaemit demo on {torch.cuda.get_device_name()} ({mmaemit.arch.device_arch().name}): "
          f"C = A @ B, {n}x{n}x{n}, hand-composed ldmatrix / mma.sync / stmatrix GEMM")
    failures = 0
    for dtype in ("float16", "bfloat16"):
        func, em = make_gemm(n, n, n, dtype, config=GemmConfig(), arch=mmaemit.arch.device_arch())
        kernel = mmaemit.compile(func)
        A, B = random_inputs(n, n, n, dtype)
        C = torch.full((n, n), float("nan"), dtype=A.dtype, device="cuda")
        kernel(A, B, C)
        torch.cuda.synchronize()
        ref = reference(A, B)
        err = (C.float() - ref).abs().max().item()
        rel = ((C.float() - ref).norm() / ref.norm()).item()
        ok = rel < (2e-3 if dtype == "float16" else 1e-2) and not torch.isnan(C).any().item()
        failures += not ok
        t_ours = median_time(lambda: kernel(A, B, C))
        t_torch = median_time(lambda: torch.matmul(A, B))
        flops = 2.0 * n ** 3
        print(f"  {dtype:9s} max|err| {err:.3e}  rel {rel:.2e}  {'PASS' if ok else 'FAIL'}  "
              f"mmaemit {flops / t_ours / 1e12:6.1f} TFLOP/s  torch.matmul {flops / t_torch / 1e12:6.1f} TFLOP/s")
    if mmaemit.arch.device_arch().satisfies("sm_90a"):
        failures += _demo_hopper_gpu(n)
    return 1 if failures else 0


def _demo_hopper_gpu(n) -> int:
    """The warp-specialized TMA + wgmma GEMM (C = A @ B^T, B stored [N, K]) beside torch.matmul on the same data."""
    import torch

    import mmaemit
    from mmaemit.kernels.gemm_hopper import make_gemm_hopper
    from mmaemit.runtime.timing import median_time

    print(f"  Hopper: C = A @ B^T, {n}x{n}x{n}, TMA + mbarrier ring + warp-specialized persistent wgmma")
    failures = 0
    for dtype in ("float16", "bfloat16"):
        kernel = mmaemit.compile(make_gemm_hopper(n, n, n, dtype)[0])
        td = getattr(torch, dtype)
        A = (torch.randn(n, n, device="cuda") / n ** 0.25).to(td)
        B = (torch.randn(n, n, device="cuda") / n ** 0.25).to(td)
        C = torch.full((n, n), float("nan"), dtype=td, device="cuda")
        kernel(A, B, C)
        ref = A.float() @ B.float().T
        rel = ((C.float() - ref).norm() / ref.norm()).item()
        ok = rel < (2e-3 if dtype == "float16" else 1e-2) and not torch.isnan(C).any().item()
        failures += not ok
        t_ours = median_time(lambda: kernel(A, B, C))
        t_torch = median_time(lambda: torch.matmul(A, B.T))
        flops = 2.0 * n ** 3
        print(f"  {dtype:9s} rel {rel:.2e}  {'PASS' if ok else 'FAIL'}  mmaemit {flops / t_ours / 1e12:6.1f} TFLOP/s  "
              f"torch.matmul {flops / t_torch / 1e12:6.1f} TFLOP/s")
    return failures


def _demo_cpu(args) -> int:
    import mmaemit
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm

    print("mmaemit demo (no GPU visible): building the hand-composed GEMM and reading its SASS")
    failures = 0
    n = 1024
    for arch in ("sm_80", "sm_90a"):
        for dtype in ("float16", "bfloat16"):
            t0 = time.perf_counter()
            func, _ = make_gemm(n, n, n, dtype, config=GemmConfig(), arch=arch)
            kernel = mmaemit.compile(func, target=arch)
            mix = kernel.instruction_mix(arch)
            dt = time.perf_counter() - t0
            need = ("HMMA", "LDSM", "LDGSTS") + (("STSM",) if arch == "sm_90a" else ())
            ok = all(mix.get(k, 0) > 0 for k in need)
            failures += not ok
            shown = "  ".join(f"{k} {mix.get(k, 0)}" for k in MIX_KEYS if mix.get(k, 0))
            print(f"  {arch:7s} {dtype:9s} {shown}  ({dt:.1f} s)  {'PASS' if ok else 'FAIL: missing ' + str(need)}")
    failures += _demo_hopper_cpu()
    failures += _demo_interpret()
    return 1 if failures else 0


def _demo_hopper_cpu() -> int:
    import mmaemit
    from mmaemit.kernels.gemm_hopper import make_gemm_hopper

    t0 = time.perf_counter()
    kernel = mmaemit.compile(make_gemm_hopper(4096, 4096, 4096, "float16")[0], target="sm_90a")
    mix = kernel.instruction_mix("sm_90a")
    usage = kernel.resource_usage("sm_90a")
    ok = all(mix.get(k, 0) > 0 for k in HOPPER_KEYS) and usage.spill_store_bytes == 0 and not mix.get("LDGSTS")
    shown = "  ".join(f"{k} {mix.get(k, 0)}" for k in HOPPER_KEYS)
    print(f"  sm_90a  Hopper TMA+wgmma GEMM  {shown}  ({time.perf_counter() - t0:.1f} s)  "
          f"{'PASS' if ok else 'FAIL'}")
    return (0 if ok else 1) + _demo_hopper_interpret()


def _demo_hopper_interpret() -> int:
    """The same Hopper GEMM (TMA, mbarriers, warp specialization, wgmma) on the CPU interpreter, ragged shape."""
    import numpy as np

    from mmaemit.interpret import interpret
    from mmaemit.kernels.gemm_hopper import HopperGemmConfig, make_gemm_hopper

    M, N, K = 200, 136, 200
    func, _ = make_gemm_hopper(M, N, K, "float16", config=HopperGemmConfig(block_n=64, stages=2, num_sms=2,
                                                                           epilogue_boxes=1))
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((N, K)).astype(np.float16)
    C = np.full((M, N), np.nan, np.float16)
    t0 = time.perf_counter()
    report = interpret(func, A, B, C)
    dt = time.perf_counter() - t0
    ref = A.astype(np.float64) @ B.astype(np.float64).T
    rel = float(np.linalg.norm(C.astype(np.float64) - ref) / np.linalg.norm(ref))
    ok = report.ok and rel < 2e-3 and not np.isnan(C.astype(np.float32)).any()
    print(f"  interpreter Hopper GEMM float16 {M}x{N}x{K} (ragged, 2 persistent CTAs) on the CPU: rel err {rel:.2e}"
          f"  ({dt:.1f} s)  {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def _demo_interpret() -> int:
    """Run the GEMM on the CPU interpreter at a small shape and compare with torch (issue: CPU verification)."""
    try:
        from mmaemit.interpret import interpret
    except ImportError:
        print("  interpreter: not available in this build")
        return 0
    import torch

    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm, random_inputs, reference

    M = N = 128
    K = 64
    failures = 0
    for dtype in ("float16", "bfloat16"):
        func, _ = make_gemm(M, N, K, dtype, config=GemmConfig(), arch="sm_90a")
        A, B = random_inputs(M, N, K, dtype, device="cpu")
        C = torch.full((M, N), float("nan"), dtype=A.dtype)
        t0 = time.perf_counter()
        report = interpret(func, A, B, C)
        dt = time.perf_counter() - t0
        ref = reference(A, B)
        rel = ((C.float() - ref).norm() / ref.norm()).item()
        ok = rel < 1e-2 and not torch.isnan(C).any().item() and not getattr(report, "errors", [])
        failures += not ok
        print(f"  interpreter {dtype:9s} {M}x{N}x{K} on the CPU: rel err {rel:.2e}  ({dt:.1f} s)  "
              f"{'PASS' if ok else 'FAIL'}")
    return failures


def _cmd_demo(args) -> int:
    if _gpu_available() and not args.cpu:
        return _demo_gpu(args)
    return _demo_cpu(args)


def _cmd_bench(args) -> int:
    from .bench import run_bench

    if getattr(args, "sweep", False) and "sweep" not in args.configs:
        args.configs = list(args.configs) + ["sweep"]
    command = "mmaemit " + " ".join(args.argv)
    return run_bench(args.suite, args, command=command)


def _add_bench_parser(sub) -> None:
    from .bench.suites import SUITES

    bench = sub.add_parser("bench", help="check and time kernels beside their peers: table, CSV and PNG")
    bsub = bench.add_subparsers(dest="suite", required=True)
    for suite, text in SUITES.items():
        p = bsub.add_parser(suite, help=text, description=text)
        p.add_argument("--out", default="bench-results", help="folder for <suite>.md / .csv / .png")
        kinds = ["default", "tuned", "sweep"] + (["dynamic"] if suite == "dequant" else [])
        p.add_argument("--configs", nargs="+", default=["default", "tuned"], choices=kinds,
                       help="mmaemit configurations: the hand-picked default, the autotuned winner, every candidate"
                            + ("; dynamic: the dynamic-M DequantGemm (one warmed kernel set for every M)"
                               if suite == "dequant" else ""))
        p.add_argument("--sweep", action="store_true", help="same as adding 'sweep' to --configs")
        p.add_argument("--dry-run", action="store_true", help="no GPU: made-up timings, to check the report code")
        if suite == "dequant":
            from .kernels.dequant_gemm import WEIGHT_FORMATS

            p.add_argument("--shapes", nargs="+", default=["8192x8192", "28672x8192"], help="N x K weight shapes")
            p.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32, 64, 128, 256, 1024, 4096],
                           help="activation rows M")
            p.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"], choices=["float16", "bfloat16"],
                           help="activation (and scale) dtypes")
            p.add_argument("--all-paths", action="store_true",
                           help="with --configs dynamic: also time every DequantGemm path that can serve each M")
            p.add_argument("--group", type=int, default=128)
            p.add_argument("--format", default="int4", choices=WEIGHT_FORMATS)
            p.add_argument("--zeros-mode", choices=["original", "rescale", "quantized"], default=None)
        else:
            p.add_argument("--sizes", "--size", type=int, nargs="+", default=[4096, 8192], help="M = N = K")
            if suite == "gemm":
                p.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"],
                               choices=["float16", "bfloat16"])
                p.add_argument("--layouts", nargs="+", default=["NN", "NT"], choices=["NN", "NT", "TN", "TT"])
            elif suite == "fp8":
                p.add_argument("--dtypes", nargs="+", default=["float8_e4m3fn"],
                               choices=["float8_e4m3fn", "float8_e5m2"])
        p.set_defaults(func=_cmd_bench)


def _cmd_layout_show(args) -> int:
    from . import isa
    from .layouts import make_mma_swizzle_layout, matrix_move_layout, mma_fragment
    from .layouts.pictures import draw_fragment, draw_matrix_move, draw_raster, draw_swizzle
    from .layouts.raster import raster_order

    out = args.output or f"{args.kind}.png"
    if args.kind == "fragment":
        instr = isa.select_mma(args.dtype, args.b_dtype or args.dtype, args.accum or
                               ("float32" if args.dtype.startswith(("float", "bfloat", "fp", "e4", "e5")) else "int32"),
                               k=args.k)
        pic = draw_fragment(mma_fragment(instr, args.operand), out)
    elif args.kind in ("ldmatrix", "stmatrix"):
        pic = draw_matrix_move(matrix_move_layout(args.num, args.trans), out, op=args.kind)
    elif args.kind == "swizzle":
        shape = tuple(int(v) for v in args.shape.lower().split("x"))
        pic = draw_swizzle(make_mma_swizzle_layout(shape, args.dtype, swizzle_bytes=args.swizzle_bytes), out,
                           rows=args.rows)
    else:
        gm, gn = (int(v) for v in args.grid.lower().split("x"))
        pic = draw_raster(raster_order(args.order, gm, gn, args.panel), out, wave=args.wave)
    print(f"{pic.title}\nwrote {pic.path}")
    return 0


def _add_layout_parser(sub) -> None:
    layout = sub.add_parser("layout", help="layout pictures")
    lsub = layout.add_subparsers(dest="action", required=True)
    show = lsub.add_parser("show", help="draw a fragment map, an ldmatrix/stmatrix map, a swizzle or a raster order")
    show.add_argument("kind", choices=["fragment", "ldmatrix", "stmatrix", "swizzle", "raster"])
    show.add_argument("-o", "--output", help="PNG file (default: <kind>.png)")
    show.add_argument("--dtype", default="float16", help="fragment: A's dtype; swizzle: the tile's dtype")
    show.add_argument("--b-dtype", default=None, help="fragment: B's dtype (default: --dtype)")
    show.add_argument("--accum", default=None, help="fragment: accumulator dtype (default float32 / int32)")
    show.add_argument("--k", type=int, default=None, help="fragment: the mma K (default: the largest)")
    show.add_argument("--operand", default="A", choices=["A", "B", "C"], help="fragment: which operand")
    show.add_argument("--num", type=int, default=4, choices=[1, 2, 4], help="ldmatrix/stmatrix: .x1/.x2/.x4")
    show.add_argument("--trans", action="store_true", help="ldmatrix/stmatrix: .trans")
    show.add_argument("--shape", default="64x64", help="swizzle: tile ROWSxCOLS (elements)")
    show.add_argument("--swizzle-bytes", type=int, default=None, help="swizzle: 0/32/64/128 (default: automatic)")
    show.add_argument("--rows", type=int, default=None, help="swizzle: rows drawn (default 16)")
    show.add_argument("--grid", default="8x8", help="raster: tile grid GMxGN")
    show.add_argument("--order", default="panel", choices=["row", "panel", "serpentine", "grouped"])
    show.add_argument("--panel", type=int, default=4, help="raster: panel height / super-tile size")
    show.add_argument("--wave", type=int, default=8, help="raster: CTAs per colour band")
    show.set_defaults(func=_cmd_layout_show)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mmaemit", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="build, check and time the hand-composed GEMM (SASS only without a GPU)")
    p.add_argument("--size", type=int, default=4096, help="M = N = K on the GPU (multiple of 128)")
    p.add_argument("--cpu", action="store_true", help="the no-GPU path even where a GPU is visible")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("table", help="print the mma.sync and wgmma instruction tables")
    p.set_defaults(func=_cmd_table)
    _add_bench_parser(sub)
    _add_layout_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
