"""Thin wrapper: ``mmaemit bench gemm`` (mmaemit/bench/). Same flags: --sizes, --dtypes, --layouts; --out is a folder.

    PYTHONPATH=. python3 benchmarks/bench_gemm.py [--sizes 4096 8192] [--dtypes float16 bfloat16] [--layouts NN NT]
"""
import sys

from mmaemit.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "gemm", *sys.argv[1:]]))
