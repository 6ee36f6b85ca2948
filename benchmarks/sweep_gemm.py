"""Thin wrapper: ``mmaemit bench gemm --configs sweep`` (every autotuning candidate, checked and timed in-process).

    PYTHONPATH=. python3 benchmarks/sweep_gemm.py [--sizes 4096] [--dtype float16] [--layout NN]
"""
import sys

from mmaemit.cli import main

if __name__ == "__main__":
    argv = [{"--dtype": "--dtypes", "--layout": "--layouts"}.get(a, a) for a in sys.argv[1:]]
    sys.exit(main(["bench", "gemm", "--configs", "default", "sweep", *argv]))
