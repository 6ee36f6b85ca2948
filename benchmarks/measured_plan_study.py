"""Measured plans against the rules' plan (issue 9): ``measure_plan`` per shape, then both plans timed in one run at
M inside every bucket the measurement changed (its first, middle and last M, so M that were not timed themselves),
cuBLAS on the dequantized weight in the same run.

Each (plan, M) is checked once before it is timed (no NaN left in a poisoned output, within tolerance of the fp32
product). The measurement's own table (every candidate's time per bucket) is printed first.

    python3 benchmarks/measured_plan_study.py --shapes 4096x14336 4096x4096 1024x4096 --dtype bfloat16
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from wave_fill_study import check       # one poisoned call against the fp32 product (benchmarks/ is on sys.path)


def validation_ms(plan, limit=24):
    """First, middle and last M of each bucket the plan changed (at most ``limit`` M, evenly over the buckets)."""
    changed = [m for m in sorted(plan.chosen) if plan.chosen[m]]
    step = max(1, -(-len(changed) // max(1, limit // 3)))
    out = []
    for hi in changed[::step]:
        out += [hi - 15, hi - 8, hi]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4096x14336", "4096x4096", "1024x4096"], help="NxK")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--format", default="int4")
    ap.add_argument("--max-m", type=int, default=512)
    ap.add_argument("--ms", nargs="*", type=int, help="validation M (default: inside each changed bucket)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--validate", type=int, default=24, help="at most this many validation M per shape")
    ap.add_argument("--workers", type=int, default=16, help="parallel kernel builds")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("measured_plan_study needs a CUDA GPU")
    os.environ.setdefault("MMAEMIT_CUBIN_CACHE", "1")      # load what the build workers put in the cubin cache
    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments
    from mmaemit.kernels.dequant_dispatch import DequantGemm
    from mmaemit.kernels.dequant_plan import measure_plan
    from mmaemit.runtime.timing import copies_needed, time_rotating

    dt = getattr(torch, args.dtype)
    tol = 3e-3 if dt == torch.float16 else 1e-2
    rows = []
    for s in args.shapes:
        n, k = (int(v) for v in s.lower().split("x"))
        rules = DequantGemm(n, k, 128, args.dtype, weight_format=args.format, arch="sm_90a")
        measured = DequantGemm(n, k, 128, args.dtype, weight_format=args.format, arch="sm_90a")
        t0 = time.time()
        plan = measure_plan(measured, max_m=args.max_m, force=True, workers=args.workers, progress=False)
        print(f"{n}x{k}: measured in {time.time() - t0:.0f} s\n{plan.text()}\n{measured!r}", flush=True)
        ms = args.ms if args.ms else validation_ms(plan, args.validate)
        if not ms:
            continue
        torch.manual_seed(0)
        qw = D.quantize(torch.randn(n, k, device="cuda", dtype=dt), D.QuantScheme(args.format, 128))
        ts = [t.cuda() for t in kernel_arguments(qw)[0]]
        nbytes = sum(t.numel() * t.element_size() for t in ts)
        tsl = [ts] + [[t.clone() for t in ts] for _ in range(copies_needed(nbytes) - 1)]
        dense = qw.dequantize().to(dt).cuda()
        dl = [dense] + [dense.clone() for _ in range(copies_needed(dense.numel() * 2) - 1)]
        for m in ms:
            torch.manual_seed(m)
            A = torch.randn(m, k, device="cuda", dtype=dt)
            out = torch.empty(m, n, device="cuda", dtype=dt)
            ref = A.float() @ dense.float().T
            gemms = (measured, rules) if measured.path_for(m) != rules.path_for(m) else (measured,)
            for g in gemms:
                check(g, A, ts, ref, tol)
            times = {}
            for _ in range(args.rounds):
                for g in gemms:
                    times.setdefault(id(g), []).append(time_rotating(
                        [lambda ts=ts, g=g: g(A, *ts, out=out) for ts in tsl]))
                times.setdefault("cuBLAS", []).append(time_rotating([lambda w=w: torch.matmul(A, w.T) for w in dl]))
            t_meas = min(times[id(measured)])
            t_rule = min(times[id(rules)]) if len(gemms) == 2 else t_meas
            t_cub = min(times["cuBLAS"])
            rows.append(f"| {n} x {k} | {m} | {measured.path_for(m)} | {t_meas:.1f} | {rules.path_for(m)} | "
                        f"{t_rule:.1f} | {t_rule / t_meas:.2f}x | {t_cub:.1f} | {t_cub / t_meas:.2f}x |")
            print(rows[-1], flush=True)
        del tsl, dl
    print(f"\n{args.dtype}, {args.format} g128, µs per call (min over {args.rounds} rounds of time_rotating)")
    print(f"| shape | M | measured plan | µs | rules' plan | µs | gain | cuBLAS {args.dtype} | vs cuBLAS |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
