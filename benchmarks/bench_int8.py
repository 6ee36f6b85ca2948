"""int8 GEMM (s8 x s8 -> s32, mma.sync m16n8k32) from the example beside ``torch._int_mm`` (cuBLASLt), same run.

    PYTHONPATH=. python3 benchmarks/bench_int8.py [--size 8192] [--sweep]

A is [M, K] row-major, B is stored [N, K] (K-contiguous, the layout cuBLASLt's int8 path wants: ``torch._int_mm(A,
B.T)``). Correctness: the kernel's int32 output must equal ``torch._int_mm``'s exactly (integer arithmetic, |C| < 2^31
for K = 8192 and |a|, |b| <= 127); the small shapes are checked against an int64 CPU reference in
tests/test_transposed_gemm.py. Timing: ``triton.testing.do_bench`` median (inputs 64 MiB each, larger than L2).
"""
from __future__ import annotations

import argparse
import datetime
import sys

import torch
from triton.testing import do_bench

import mmaemit
from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm

CONFIGS = [GemmConfig(128, 128, 64, 64, 64, 3), GemmConfig(128, 128, 64, 64, 64, 4),
           GemmConfig(128, 128, 128, 64, 64, 3), GemmConfig(128, 256, 64, 64, 64, 3),
           GemmConfig(256, 128, 64, 64, 64, 3), GemmConfig(256, 128, 128, 64, 64, 3),
           GemmConfig(128, 256, 128, 64, 64, 3)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--sweep", action="store_true")
    args = p.parse_args(argv)
    n = args.size
    A = torch.randint(-128, 128, (n, n), dtype=torch.int8, device="cuda")
    B = torch.randint(-128, 128, (n, n), dtype=torch.int8, device="cuda")   # stored [N, K]
    ref = torch._int_mm(A, B.T)
    t_peer = do_bench(lambda: torch._int_mm(A, B.T), warmup=100, rep=1000, return_mode="median")
    ops = 2.0 * n ** 3
    print(f"GPU: {torch.cuda.get_device_name()}, {datetime.date.today()}, torch {torch.__version__}")
    print(f"torch._int_mm {n}^3: {t_peer * 1e3:.0f} us {ops / t_peer / 1e9:.0f} TOP/s")
    rows, bad = [], 0
    for cfg in (CONFIGS if args.sweep else CONFIGS[:1]):
        func, _ = make_gemm(n, n, n, "int8", trans_b=True, config=cfg)
        kernel = mmaemit.compile(func)
        C = torch.full((n, n), -(2 ** 31), dtype=torch.int32, device="cuda")  # poisoned
        kernel(A, B, C)
        exact = torch.equal(C, ref)
        bad += not exact
        t = do_bench(lambda: kernel(A, B, C), warmup=100, rep=1000, return_mode="median")
        rows.append((ops / t / 1e9, f"| {n} | {cfg.block_m}x{cfg.block_n}x{cfg.block_k} | {cfg.stages} | {t * 1e3:.0f} | "
                                    f"{ops / t / 1e9:.0f} | {t_peer * 1e3:.0f} | {ops / t_peer / 1e9:.0f} | "
                                    f"{'exact' if exact else 'MISMATCH'} |"))
        print(rows[-1][1], flush=True)
    print("| M=N=K | CTA tile (warps 64x64) | stages | mmaemit µs | mmaemit TOP/s | torch._int_mm µs | torch TOP/s | "
          "vs torch._int_mm |\n|---|---|---|---|---|---|---|---|")
    for _, r in sorted(rows, reverse=True):
        print(r)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
