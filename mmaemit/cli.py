"""``mmaemit`` command line.

* ``mmaemit demo``: build the hand-composed GEMM example. With a GPU: run it on random inputs for fp16 and bf16,
  check it against a float32 torch reference and time it beside ``torch.matmul``. Without a GPU: build it for sm_80
  and sm_90a, print the SASS instruction mix, and check it numerically through the CPU interpreter when available.
  Exit code 0 only if every check passes.
* ``mmaemit table``: the mma.sync instruction table (Markdown, generated from ``mmaemit.isa``).
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mmaemit", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="build, check and time the hand-composed GEMM (SASS only without a GPU)")
    p.add_argument("--size", type=int, default=4096, help="M = N = K on the GPU (multiple of 128)")
    p.add_argument("--cpu", action="store_true", help="the no-GPU path even where a GPU is visible")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("table", help="print the mma.sync instruction table")
    p.set_defaults(func=_cmd_table)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
