"""Thin wrapper: ``mmaemit bench dequant`` (mmaemit/bench/): dequant GEMV / GEMM beside cuBLAS and torch int4.

    PYTHONPATH=. python3 benchmarks/bench_dequant.py [--shapes 8192x8192 28672x8192] [--ms 1 16] [--sweep]
        [--format int8] [--zeros-mode quantized]
"""
import sys

from mmaemit.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "dequant", *sys.argv[1:]]))
