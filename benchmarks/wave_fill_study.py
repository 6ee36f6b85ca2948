"""The wave-filling plan against the M-only plan (issue 9): ``DequantGemm(fill_waves=True)`` and
``DequantGemm(fill_waves=False)`` at each M, cuBLAS on the dequantized weight in the same run.

For narrow N the wave-filling plan gives M rows of shorter tiles where one row of the M-tall tile leaves half the SMs
or more idle (``WAVE_FILL_PATHS``); it was timed at six points when it landed (docs/perf-notes.md, seventeenth
session) and this study times the rest. Both plans' kernels are built in parallel worker processes first; every
(plan, M) is checked once before it is timed (no NaN left in a poisoned output, within tolerance of the fp32
product); M where the two plans take the same path are timed once and reported for both.

    python3 benchmarks/wave_fill_study.py --shapes 4096x14336 4096x4096 1024x4096 --ms 33 48 64 100 128 200 256 512
"""
from __future__ import annotations

import argparse
import os
import time

import torch


def plans(N, K, dtype="float16", weight_format="int4", arch="sm_90a", interpret=False, **kw):
    """(wave-filling plan, M-only plan) of one problem."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    return tuple(DequantGemm(N, K, 128, dtype, weight_format=weight_format, arch=arch, interpret=interpret,
                             fill_waves=fill, **kw) for fill in (True, False))


def check(plan, A, weights, ref, tol):
    """One call of ``plan`` into a NaN-poisoned output: its relative error against ``ref`` (raises past ``tol``)."""
    out = torch.full((A.shape[0], plan.n_out), float("nan"), dtype=A.dtype, device=A.device)
    C = plan(A, *weights, out=out)
    if A.is_cuda:
        torch.cuda.synchronize()
    if torch.isnan(C).any():
        raise AssertionError(f"M={A.shape[0]} {plan.path_for(A.shape[0])}: NaN left in the output")
    err = ((C.float() - ref).norm() / ref.norm()).item()
    if err > tol:
        raise AssertionError(f"M={A.shape[0]} {plan.path_for(A.shape[0])}: relative error {err:.2e} > {tol}")
    return err


def check_on_interpreter(N=128, K=1024, M=60):
    """The check on the interpreter at a small problem where the plans differ: N=128 is two 64-row tiles, so M=60
    takes fused32 in two rows (4 tiles, on 4 persistent CTAs) against fused64's one row (2 tiles, 2 CTAs); both
    within tolerance; returns both paths."""
    import dataclasses

    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    g = torch.Generator().manual_seed(0)
    qw = D.quantize(torch.randn(N, K, generator=g).half(), D.QuantScheme("int4", 128))
    tensors, _ = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).half()
    ref = A.float() @ qw.dequantize().float().T
    base = DequantGemm(N, K, 128, "float16", arch="sm_90a", interpret=True).configs
    small = {"fused32": dataclasses.replace(base["fused32"], num_sms=4),
             "fused64": dataclasses.replace(base["fused64"], num_sms=2)}
    filled, plain = plans(N, K, interpret=True, configs=small)
    paths = (filled.path_for(M), plain.path_for(M))
    if paths[0] == paths[1]:
        raise AssertionError(f"{N}x{K} M={M}: both plans take {paths[0]}")
    for plan in (filled, plain):
        check(plan, A, tensors, ref, 3e-3)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4096x14336", "4096x4096", "1024x4096"], help="NxK")
    ap.add_argument("--ms", nargs="+", type=int, default=[33, 48, 64, 65, 100, 128, 129, 200, 256, 300, 512])
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=16, help="parallel kernel builds")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("wave_fill_study needs a CUDA GPU (check_on_interpreter() runs without one)")
    os.environ.setdefault("MMAEMIT_CUBIN_CACHE", "1")      # load what the build workers put in the cubin cache
    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments
    from mmaemit.kernels.dequant_dispatch import _build_in_workers
    from mmaemit.runtime.timing import copies_needed, time_rotating

    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    objs = {nk: plans(*nk, dtype=args.dtype) for nk in shapes}
    items = {(p.N, p.K, p.fill_waves, p.path_for(m)): p for both in objs.values() for p in both for m in args.ms}
    t0 = time.time()
    _build_in_workers([(p.spec(), key[3]) for key, p in items.items()], workers=args.workers)
    print(f"built {len(items)} kernels in {time.time() - t0:.0f} s", flush=True)
    dt = getattr(torch, args.dtype)
    tol = 3e-3 if dt == torch.float16 else 1e-2
    times = {}
    for (n, k), (filled, plain) in objs.items():
        torch.manual_seed(0)
        qw = D.quantize(torch.randn(n, k, device="cuda", dtype=dt), D.QuantScheme("int4", 128))
        ts = [t.cuda() for t in kernel_arguments(qw)[0]]
        nbytes = sum(t.numel() * t.element_size() for t in ts)
        tsl = [ts] + [[t.clone() for t in ts] for _ in range(copies_needed(nbytes) - 1)]
        dense = qw.dequantize().to(dt).cuda()
        dl = [dense] + [dense.clone() for _ in range(copies_needed(dense.numel() * 2) - 1)]
        for m in args.ms:
            torch.manual_seed(m)
            A = torch.randn(m, k, device="cuda", dtype=dt)
            out = torch.empty(m, n, device="cuda", dtype=dt)
            same = filled.path_for(m) == plain.path_for(m)
            for plan in (filled,) if same else (filled, plain):
                err = check(plan, A, ts, A.float() @ dense.float().T, tol)
                print(f"{n}x{k} M={m} {plan.path_for(m)} (fill_waves={plan.fill_waves}): rel {err:.2e}", flush=True)
            for rnd in range(args.rounds):
                for plan in (filled,) if same else (filled, plain):
                    times.setdefault((n, k, m, plan.fill_waves), []).append(time_rotating(
                        [lambda ts=ts, plan=plan: plan(A, *ts, out=out) for ts in tsl]))
                times.setdefault((n, k, m, "cuBLAS"), []).append(
                    time_rotating([lambda w=w: torch.matmul(A, w.T) for w in dl]))
            if same:
                times[(n, k, m, False)] = times[(n, k, m, True)]
        del tsl, dl
    print(f"\n{args.dtype}, int4 g128, µs per round (median of time_rotating)")
    print(f"| shape | M | wave-filling plan | µs | M-only plan | µs | gain | cuBLAS {args.dtype} | vs cuBLAS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (n, k), (filled, plain) in objs.items():
        for m in args.ms:
            on, off, cub = (min(times[(n, k, m, w)]) for w in (True, False, "cuBLAS"))
            fmt = " / ".join
            print(f"| {n} x {k} | {m} | {filled.path_for(m)} | {fmt(f'{t:.1f}' for t in times[(n, k, m, True)])} | "
                  f"{plain.path_for(m)} | {fmt(f'{t:.1f}' for t in times[(n, k, m, False)])} | {off / on:.2f}x | "
                  f"{fmt(f'{t:.1f}' for t in times[(n, k, m, 'cuBLAS')])} | {cub / on:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
