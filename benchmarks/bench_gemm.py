"""Benchmark the hand-composed GEMM example beside torch.matmul, in the same process and on the same inputs.

    PYTHONPATH=. python3 benchmarks/bench_gemm.py [--sizes 4096 8192] [--dtypes float16 bfloat16] [--out FILE]

Each point: correctness check against a float32 reference first (poisoned output), then the median of
``triton.testing.do_bench`` (CUDA events; falls back to CUDA events here) for both kernels. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import datetime
import sys

import torch

import mmaemit
from mmaemit.kernels.gemm_mma import LAYOUTS, GemmConfig, make_gemm, random_inputs, reference


def bench(fn) -> float:
    """Median milliseconds."""
    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=100, rep=1000, return_mode="median")
    except ImportError:
        from mmaemit.runtime.timing import median_time

        return median_time(fn, warmup=20, reps=200) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--dtypes", nargs="+", default=["float16"])
    p.add_argument("--layouts", nargs="+", default=["NN", "NT"])
    p.add_argument("--out")
    args = p.parse_args(argv)
    rows = [f"GPU: {torch.cuda.get_device_name()}, {datetime.date.today()}, torch {torch.__version__}",
            "", "| M=N=K | dtype | layout | mmaemit µs | mmaemit TFLOP/s | torch.matmul µs | torch TFLOP/s | ratio | rel err |",
            "|---|---|---|---|---|---|---|---|---|"]
    bad = 0
    for n in args.sizes:
        for dtype in args.dtypes:
            for layout in args.layouts:
                ta, tb = LAYOUTS[layout]
                func, _ = make_gemm(n, n, n, dtype, trans_a=ta, trans_b=tb, config=GemmConfig())
                kernel = mmaemit.compile(func)
                A, B = random_inputs(n, n, n, dtype, ta, tb, seed=n)
                C = torch.full((n, n), float("nan"), dtype=A.dtype, device="cuda")
                kernel(A, B, C)
                ref = reference(A, B, ta, tb)
                rel = ((C.float() - ref).norm() / ref.norm()).item()
                bad += not rel < 1e-2
                a_t = A.T if ta else A
                b_t = B.T if tb else B
                t_ours = bench(lambda: kernel(A, B, C))
                t_torch = bench(lambda: torch.matmul(a_t, b_t))
                fl = 2.0 * n ** 3
                rows.append(f"| {n} | {dtype} | {layout} | {t_ours * 1e3:.0f} | {fl / t_ours / 1e9:.0f} | "
                            f"{t_torch * 1e3:.0f} | {fl / t_torch / 1e9:.0f} | {t_torch / t_ours:.2f} | {rel:.1e} |")
                print(rows[-1], flush=True)
    text = "\n".join(rows)
    print(text)
    if args.out:
        open(args.out, "w").write(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
