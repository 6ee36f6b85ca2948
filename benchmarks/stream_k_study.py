"""Stream-K tail against the data-parallel fused kernel (issue 9): ``DequantGemm.run_path`` of one fused path with
``stream_k`` off and on (``--field``: another bool field of ``HopperDequantConfig``, e.g. ``fit_rows``), cuBLAS on
the dequantized weight in the same run.

Each case is ``NxK:path:M[,M...]``; the default cases are the shapes whose last wave leaves SMs idle on the H100
(28672 x 8192: 448 tiles of 64 rows, 3.39 waves; 4096 x 14336: 64 tiles; 14336 x 4096: 224 tiles) and one that
stays data-parallel (8192^2). Both kernels are built in parallel worker processes first. Every case is checked
before it is timed: no NaN in a poisoned output, within tolerance of the fp32 product, identical over repeated
launches. A watchdog ends the process (exit 3) if a check launch has not finished within ``--hang-s`` seconds, so a
deadlocked kernel costs seconds of device time, not the run's whole limit.

    python3 benchmarks/stream_k_study.py --rounds 3
    python3 benchmarks/stream_k_study.py --cases 28672x8192:fused128:100,128 --dtype bfloat16
    python3 benchmarks/stream_k_study.py --field fit_rows --cases 4096x4096:fused128x2:300,512
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import threading
import time

import torch

DEFAULT_CASES = ["28672x8192:fused32:32", "28672x8192:fused64:64", "28672x8192:fused128:100,128",
                 "28672x8192:fused256:256", "4096x14336:fused64:64", "4096x14336:fused128:128",
                 "4096x14336:fused256k:256", "14336x4096:fused128:128", "14336x4096:fused128x2:256",
                 "8192x8192:fused128:128"]


def parse_case(text: str):
    """``"NxK:path:M,M"`` -> (N, K, path, [M, ...])."""
    shape, path, ms = text.split(":")
    n, k = (int(v) for v in shape.lower().split("x"))
    return n, k, path, [int(m) for m in ms.split(",")]


def parse_setting(text: str):
    """``"field=value"`` -> (field, value): a Python literal where the value is one, else the string."""
    import ast

    key, value = text.split("=", 1)
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def plans(cases, dtype: str, weight_format="int4", arch="sm_90a", interpret=False, num_sms=None, overrides=None,
          field="stream_k"):
    """{(N, K, path, on): DequantGemm} with the path's default config (``overrides``: fields replaced in both),
    ``field`` (a bool field of the config) off and on."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    out = {}
    for n, k, path, _ in cases:
        base = DequantGemm(n, k, 128, dtype, weight_format=weight_format, arch=arch, interpret=interpret).configs[path]
        if num_sms is not None:
            base = dataclasses.replace(base, num_sms=num_sms)
        if overrides:
            base = dataclasses.replace(base, **overrides)
        for sk in (False, True):
            out[(n, k, path, sk)] = DequantGemm(n, k, 128, dtype, weight_format=weight_format, arch=arch,
                                                interpret=interpret,
                                                configs={path: dataclasses.replace(base, **{field: sk})})
    return out


def check(plan, path, A, weights, ref, tol, launches=2):
    """Run ``path`` ``launches`` times into NaN-poisoned outputs: (relative error, every launch identical)."""
    outs = []
    for i in range(launches):
        out = torch.full((A.shape[0], plan.n_out), float("nan"), dtype=A.dtype, device=A.device)
        outs.append(plan.run_path(path, A, *weights[i % len(weights)], out=out))
    if A.is_cuda:
        torch.cuda.synchronize()
    for C in outs:
        if torch.isnan(C).any():
            raise AssertionError(f"{path}: NaN left in the output")
    err = ((outs[0].float() - ref).norm() / ref.norm()).item()
    if err > tol:
        raise AssertionError(f"{path}: relative error {err:.2e} > {tol}")
    return err, all(torch.equal(C, outs[0]) for C in outs)


def check_on_interpreter(N=320, K=2048, M=20, path="fused32", num_sms=3):
    """The same check on the interpreter at a small shape whose last wave is in pieces (no GPU): the stream-K and
    data-parallel kernels both within tolerance; returns their largest difference."""
    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments
    from mmaemit.kernels.dequant_gemm_hopper import stream_k_scheduler

    g = torch.Generator().manual_seed(0)
    qw = D.quantize(torch.randn(N, K, generator=g).half(), D.QuantScheme("int4", 128))
    tensors, _ = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).half()
    ref = A.float() @ qw.dequantize().float().T
    # stream_k_min_chunks=0: a tail at this small K (the H100 default wants pieces that save 48 chunks)
    objs = plans([(N, K, path, [M])], "float16", interpret=True, num_sms=num_sms,
                 overrides=dict(stream_k_min_chunks=0, stream_k_waves=None))
    cfg = objs[(N, K, path, True)].configs[path]
    sched = stream_k_scheduler(cfg, -(-M // cfg.block_m), N, K)
    if not sched.streamed:
        raise AssertionError(f"{N}x{K} {path} on {num_sms} SMs has no stream-K tail")
    outs = []
    for sk in (False, True):
        plan = objs[(N, K, path, sk)]
        check(plan, path, A, [tensors], ref, 3e-3, launches=1)
        outs.append(plan.run_path(path, A, *tensors))
    return (outs[0].float() - outs[1].float()).abs().max().item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="NxK:path:M[,M...]")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hang-s", type=float, default=30.0, help="watchdog for each check launch (seconds)")
    ap.add_argument("--workers", type=int, default=16, help="parallel kernel builds")
    ap.add_argument("--field", default="stream_k", help="the bool HopperDequantConfig field to time off and on")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="HopperDequantConfig fields replaced in both kernels of every case, e.g. handover=parallel")
    args = ap.parse_args(argv)
    overrides = dict(parse_setting(s) for s in args.set)
    if not torch.cuda.is_available():
        raise SystemExit("stream_k_study needs a CUDA GPU (check_on_interpreter() runs without one)")
    os.environ.setdefault("MMAEMIT_CUBIN_CACHE", "1")      # load what the build workers put in the cubin cache
    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments
    from mmaemit.kernels.dequant_dispatch import _build_in_workers
    from mmaemit.kernels.dequant_gemm_hopper import HopperDequantConfig
    from mmaemit.runtime.timing import copies_needed, time_rotating

    cases = [parse_case(c) for c in args.cases]
    if not isinstance(getattr(HopperDequantConfig(), args.field, None), bool):
        raise SystemExit(f"--field {args.field}: not a bool field of HopperDequantConfig")
    objs = plans(cases, args.dtype, overrides=overrides, field=args.field)
    t0 = time.time()
    _build_in_workers([(o.spec(), key[2]) for key, o in objs.items()], workers=args.workers)
    print(f"built {len(objs)} kernels in {time.time() - t0:.0f} s", flush=True)
    dt = getattr(torch, args.dtype)
    tol = 3e-3 if dt == torch.float16 else 1e-2
    weights, times = {}, {}
    for rnd in range(args.rounds):
        for n, k, path, ms in cases:
            if (n, k) not in weights:
                torch.manual_seed(0)
                qw = D.quantize(torch.randn(n, k, device="cuda", dtype=dt), D.QuantScheme("int4", 128))
                ts = [t.cuda() for t in kernel_arguments(qw)[0]]
                nbytes = sum(t.numel() * t.element_size() for t in ts)
                dense = qw.dequantize().to(dt).cuda()
                weights[(n, k)] = ([ts] + [[t.clone() for t in ts] for _ in range(copies_needed(nbytes) - 1)],
                                   [dense] + [dense.clone() for _ in range(copies_needed(dense.numel() * 2) - 1)])
            tsl, dense = weights[(n, k)]
            for m in ms:
                torch.manual_seed(m)
                A = torch.randn(m, k, device="cuda", dtype=dt)
                out = torch.empty(m, n, device="cuda", dtype=dt)
                for sk in (False, True):
                    plan = objs[(n, k, path, sk)]
                    if rnd == 0:
                        done = threading.Event()

                        def watchdog(label=f"{n}x{k} {path} M={m} {args.field}={sk}"):
                            if not done.wait(args.hang_s):
                                print(f"HANG: {label} did not finish within {args.hang_s} s", flush=True)
                                os._exit(3)
                        threading.Thread(target=watchdog, daemon=True).start()
                        err, same = check(plan, path, A, tsl, A.float() @ dense[0].float().T, tol)
                        done.set()
                        print(f"{n}x{k} {path} M={m} {args.field}={sk}: rel {err:.2e}, repeat-identical {same}",
                              flush=True)
                    times.setdefault((n, k, path, m, sk), []).append(time_rotating(
                        [lambda ts=ts, plan=plan: plan.run_path(path, A, *ts, out=out) for ts in tsl]))
                times.setdefault((n, k, path, m, "cuBLAS"), []).append(
                    time_rotating([lambda w=w: torch.matmul(A, w.T) for w in dense]))
    print(f"\n{args.dtype}, µs per round (median of time_rotating)")
    for n, k, path, ms in cases:
        for m in ms:
            row = [f"{n}x{k} {path} M={m}"]
            for what in (False, True, "cuBLAS"):
                label = ({False: "data-parallel", True: "stream-K"} if args.field == "stream_k" else
                         {False: f"{args.field}=False", True: f"{args.field}=True"}).get(what, what)
                row.append(f"{label} " + " / ".join(f"{t:.1f}" for t in times[(n, k, path, m, what)]))
            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
