"""Run one ``DequantGemm`` path at one M a few times, for a profiler (Nsight Compute, Nsight Systems).

    ncu --kernel-name regex:^gemm --launch-skip 2 --launch-count 1 --section SourceCounters \\
        --section WarpStateStats -o fused64 -f python3 benchmarks/profile_dequant_path.py --path fused64 --m 64
    ncu -i fused64.ncu-rep --page source --csv --print-source sass > fused64.csv

The path is built for the weight shape (random weights, int4 g128 fp16 by default), checked once on a NaN-poisoned
output against the float32 product of the dequantized weights, then launched ``--launches`` times. ``--interpret``
runs the same steps on the CPU interpreter (small shapes only), which checks the script without a GPU. Exit status 1
if the check fails.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192x8192", help="N x K of the weights")
    ap.add_argument("--path", required=True, help="a DequantGemm path (e.g. fused64, gemv16)")
    ap.add_argument("--m", type=int, required=True, help="activation rows")
    ap.add_argument("--format", default="int4")
    ap.add_argument("--zeros-mode", default=None)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--interpret", action="store_true", help="run on the CPU interpreter (sm_90a semantics)")
    a = ap.parse_args(argv)

    import torch

    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments
    from mmaemit.errors import ArgumentError
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    N, K = (int(x) for x in a.shape.lower().split("x"))
    dt = getattr(torch, a.dtype)
    dev = "cpu" if a.interpret else "cuda"
    qw = D.quantize(torch.randn(N, K).to(dt), D.QuantScheme(a.format, group_size=a.group, zeros_mode=a.zeros_mode))
    tensors, kw = kernel_arguments(qw)
    tensors = [t.to(dev) for t in tensors]
    dg = DequantGemm(N, K, dtype=a.dtype, interpret=a.interpret or None,
                     arch="sm_90a" if a.interpret else None, **kw)
    if a.path not in dg.runnable_paths():
        raise ArgumentError(f"path {a.path!r} does not run for N={N}, K={K}; runnable: {dg.runnable_paths()}")
    A = torch.randn(a.m, K).to(dt).to(dev)
    out = torch.full((a.m, N), float("nan"), dtype=dt, device=dev)
    dg.run_path(a.path, A, *tensors, out=out)
    ref = A.float() @ qw.dequantize().to(dt).float().to(dev).T
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    ok = not torch.isnan(out).any().item() and rel < (3e-3 if dt == torch.float16 else 1e-2)
    print(f"{a.path} M={a.m} {N}x{K} {a.format}: rel err {rel:.2e} {'PASS' if ok else 'FAIL'}")
    for _ in range(a.launches):
        dg.run_path(a.path, A, *tensors, out=out)
    if not a.interpret:
        torch.cuda.synchronize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
