"""Benchmark the Hopper GEMM (mmaemit.kernels.gemm_hopper) beside its cuBLAS peer, in the same process and run.

    PYTHONPATH=. python3 benchmarks/bench_hopper.py [--shapes 4096x4096x4096 ...] [--dtypes float16 bfloat16]
        [--configs '{"in_flight": 1}' ...] [--out FILE]

Peers: torch.matmul (16-bit), torch._scaled_mm with per-tensor scales (fp8, bf16 out), torch._int_mm (int8).
Each point: correctness first (poisoned output; float64-accurate reference for floats, bit-exact for int8), then
the median of ``triton.testing.do_bench`` (CUDA events) for ours, the peer timed before and after ours (the mean is
the reference, the two show the drift).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

import mmaemit
from mmaemit.kernels.gemm_hopper import HopperGemmConfig, default_out_dtype, make_gemm_hopper


def bench(fn) -> float:
    """Median milliseconds."""
    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=50, rep=500, return_mode="median")
    except ImportError:
        from mmaemit.runtime.timing import median_time

        return median_time(fn, warmup=20, reps=200) * 1e3


def inputs(M, N, K, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if dtype in ("int8", "uint8"):
        lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
        td = getattr(torch, dtype)
        return (torch.randint(lo, hi, (M, K), generator=g, device="cuda", dtype=td),
                torch.randint(lo, hi, (N, K), generator=g, device="cuda", dtype=td))
    A = torch.randn(M, K, device="cuda", generator=g) / K ** 0.25
    B = torch.randn(N, K, device="cuda", generator=g) / K ** 0.25
    td = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn,
          "float8_e5m2": torch.float8_e5m2}[dtype]
    return A.to(td), B.to(td)


def peer(A, B, dtype, out, sa=None, sb=None):
    if dtype.startswith("float8"):
        return lambda: torch._scaled_mm(A, B.T, scale_a=sa, scale_b=sb, out_dtype=out.dtype)
    if dtype in ("int8", "uint8"):
        return lambda: torch._int_mm(A, B.T)
    return lambda: torch.matmul(A, B.T)


def run_point(M, N, K, dtype, cfg, out_dtype=None):
    func, _ = make_gemm_hopper(M, N, K, dtype, out_dtype, config=cfg)
    kernel = mmaemit.compile(func)
    A, B = inputs(M, N, K, dtype, seed=M * 7 + N * 3 + K)
    out_t = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
             "int32": torch.int32}[out_dtype or default_out_dtype(dtype)]
    C = torch.full((M, N), -1 if out_t == torch.int32 else float("nan"), dtype=out_t, device="cuda")
    args = [A, B, C]
    sa = sb = None
    if dtype.startswith("float8"):
        sa = torch.tensor([0.75], device="cuda")
        sb = torch.tensor([1.5], device="cuda")
        args += [sa, sb]
    kernel(*args)
    torch.cuda.synchronize()
    if dtype in ("int8", "uint8"):
        ref = A.double() @ B.double().T          # exact: |sum| < 2^53 for int8 products and K < 2^38
        err = 0.0 if torch.equal(C.double(), ref) else float("inf")
    else:
        ref = (A.double() @ B.double().T) * (float(sa) * float(sb) if sa is not None else 1.0)
        err = ((C.double() - ref).norm() / ref.norm()).item()
    p = peer(A, B, dtype, C, sa, sb)
    tp0 = bench(p)
    t = bench(lambda: kernel(*args))
    tp1 = bench(p)
    return t, tp0, tp1, err


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4096x4096x4096", "8192x8192x8192"])
    ap.add_argument("--dtypes", nargs="+", default=["float16"])
    ap.add_argument("--configs", nargs="+", default=["{}"], help="JSON HopperGemmConfig overrides")
    ap.add_argument("--out-dtype", default=None)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    head = [f"GPU: {torch.cuda.get_device_name()}, {datetime.date.today()}, torch {torch.__version__}",
            "", "| M x N x K | dtype | config | mmaemit TFLOP/s | peer TFLOP/s (before / after) | ratio | rel err |",
            "|---|---|---|---|---|---|---|"]
    print("\n".join(head), flush=True)
    rows, bad = [], 0
    for shape in args.shapes:
        M, N, K = (int(x) for x in shape.split("x"))
        for dtype in args.dtypes:
            for cj in args.configs:
                cfg = HopperGemmConfig(**json.loads(cj))
                try:
                    t, tp0, tp1, err = run_point(M, N, K, dtype, cfg, args.out_dtype)
                except Exception as e:  # report and go on: one bad config must not hide the rest
                    rows.append(f"| {shape} | {dtype} | {cj} | FAILED: {type(e).__name__}: {str(e)[:150]} |")
                    print(rows[-1], flush=True)
                    bad += 1
                    continue
                fl = 2.0 * M * N * K
                ok = err < (2e-2 if dtype.startswith("float8") else 1e-2)
                bad += not ok
                tp = (tp0 + tp1) / 2
                rows.append(f"| {shape} | {dtype} | {cj} | {fl / t / 1e9:.0f} | {fl / tp / 1e9:.0f} "
                            f"({fl / tp0 / 1e9:.0f} / {fl / tp1 / 1e9:.0f}) | {tp / t:.3f} | "
                            f"{err:.1e}{'' if ok else ' WRONG'} |")
                print(rows[-1], flush=True)
    text = "\n".join(head + rows)
    if args.out:
        open(args.out, "w").write(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
