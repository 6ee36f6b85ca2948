"""Thin wrapper: ``mmaemit bench int8`` (mmaemit/bench/): s8 x s8 -> s32 beside torch._int_mm.

    PYTHONPATH=. python3 benchmarks/bench_int8.py [--size 8192] [--sweep]
"""
import sys

from mmaemit.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "int8", *sys.argv[1:]]))
