"""Compile the DequantGemm kernels of the GPU tests and benchmarks in parallel worker processes into the cubin cache
(then run the tests / benchmarks with MMAEMIT_CUBIN_CACHE=1: they only load them).

    MMAEMIT_CUBIN_CACHE=1 PYTHONPATH=. python3 benchmarks/prebuild_dequant.py [--tests]
        [--bench [--formats ...] [--zeros-mode M]] [--mlp]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mmaemit.kernels.dequant_dispatch import prebuild  # noqa: E402


def specs(args, arch):
    out = []
    small = ["gemv8", "gemv16", "gemv32", "tiled64", "dense_mid", "dense"]
    if args.tests:
        for dt in ("float16", "bfloat16"):
            out.append(dict(N=4096, K=4096, dtype=dt, arch=arch, dense_m=2048))    # as the dispatcher GPU test
        for n, k in ((2048, 1024), (1024, 2048)):
            out.append(dict(N=n, K=k, dtype="float16", arch=arch, paths=["gemv8", "tiled64", "dense_mid", "fused64"]))
        out.append(dict(N=256, K=1024, dtype="float16", arch=arch, paths=["tiled64"]))
    if args.bench:
        for shape in args.shapes:
            n, k = map(int, shape.split("x"))
            for dt in args.dtypes:
                for fmt in args.formats:
                    out.append(dict(N=n, K=k, dtype=dt, arch=arch, paths=args.paths, weight_format=fmt,
                                    zeros_mode=args.zeros_mode))
    if args.mlp:
        for n, k in ((14336, 4096), (4096, 14336), (4096, 4096), (1024, 4096)):
            out.append(dict(N=n, K=k, dtype="float16", arch=arch, paths=small))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--mlp", action="store_true")
    ap.add_argument("--shapes", nargs="+", default=["8192x8192", "28672x8192"])
    ap.add_argument("--dtypes", nargs="+", default=["float16"])
    ap.add_argument("--paths", nargs="+", default=None)
    ap.add_argument("--formats", nargs="+", default=["int4"], help="weight formats of --bench")
    ap.add_argument("--zeros-mode", choices=["original", "rescale", "quantized"], default=None,
                    help="zero points of --bench (unsigned formats)")
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    todo = specs(args, args.arch)
    print(f"prebuilt {len(todo)} problems in {prebuild(todo):.1f} s", flush=True)


if __name__ == "__main__":
    main()
