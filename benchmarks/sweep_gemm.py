"""Sweep tile configurations of the example GEMM (what the coming autotuner automates) and print a ranked table.

    PYTHONPATH=. python3 benchmarks/sweep_gemm.py [--size 4096] [--dtype float16] [--layout NN]

Each configuration is checked against a float32 reference (poisoned output) before it is timed; torch.matmul is
timed in the same run as the peer.
"""
from __future__ import annotations

import argparse
import sys

import torch

import mmaemit
from mmaemit.kernels.gemm_mma import LAYOUTS, GemmConfig, make_gemm, random_inputs, reference

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_gemm import bench  # noqa: E402

CONFIGS = [
    GemmConfig(128, 128, 32, 64, 64, 3),
    GemmConfig(128, 128, 32, 64, 64, 4),
    GemmConfig(128, 128, 64, 64, 64, 3),
    GemmConfig(128, 128, 64, 64, 64, 4),
    GemmConfig(128, 256, 32, 64, 64, 3),
    GemmConfig(128, 256, 32, 64, 64, 4),
    GemmConfig(256, 128, 32, 64, 64, 3),
    GemmConfig(256, 128, 32, 64, 64, 4),
    GemmConfig(128, 256, 64, 64, 64, 3),
    GemmConfig(256, 128, 64, 64, 64, 3),
    GemmConfig(128, 128, 32, 64, 64, 3, panel=1),
    GemmConfig(128, 128, 32, 64, 64, 3, panel=16),
    GemmConfig(128, 128, 32, 64, 64, 3, epilogue="global"),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[4096])
    p.add_argument("--dtype", default="float16")
    p.add_argument("--layout", default="NN")
    args = p.parse_args(argv)
    ta, tb = LAYOUTS[args.layout]
    for n in args.sizes:
        A, B = random_inputs(n, n, n, args.dtype, ta, tb, seed=1)
        ref = reference(A, B, ta, tb)
        a_t, b_t = (A.T if ta else A), (B.T if tb else B)
        t_torch = bench(lambda: torch.matmul(a_t, b_t))
        fl = 2.0 * n ** 3
        rows = []
        for cfg in CONFIGS:
            try:
                func, _ = make_gemm(n, n, n, args.dtype, trans_a=ta, trans_b=tb, config=cfg)
                kernel = mmaemit.compile(func)
            except Exception as e:  # a config the device cannot hold (e.g. shared memory) is reported, not fatal
                rows.append((0.0, f"{cfg}: {type(e).__name__}: {str(e)[:120]}"))
                continue
            C = torch.full((n, n), float("nan"), dtype=A.dtype, device="cuda")
            kernel(A, B, C)
            rel = ((C.float() - ref).norm() / ref.norm()).item()
            t = bench(lambda: kernel(A, B, C))
            rows.append((fl / t / 1e9, f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} warp {cfg.warp_m}x{cfg.warp_n} "
                                       f"stages {cfg.stages} panel {cfg.panel} {cfg.epilogue}: {t * 1e3:.0f} us "
                                       f"{fl / t / 1e9:.0f} TFLOP/s rel {rel:.1e}{'' if rel < 1e-2 else ' WRONG'}"))
            print(rows[-1][1], flush=True)
        print(f"\n{n}^3 {args.dtype} {args.layout}: torch.matmul {t_torch * 1e3:.0f} us {fl / t_torch / 1e9:.0f} TFLOP/s")
        for tf, line in sorted(rows, reverse=True):
            print("  ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
