"""Tile study of the fused Hopper int4 dequant GEMM (``make_dequant_gemm_hopper``, symbolic M) on the H100.

For each weight shape and M, every candidate configuration (block_m, consumers, stages, in_flight) is checked on a
poisoned output against the float64 product of the exactly dequantized weights, then timed with rotating weight
copies (CUDA graph replays, ``mmaemit.runtime.timing.time_rotating``); cuBLAS fp16 on the same dequantized weights
and the current ``DequantGemm`` plan are timed in the same run. Kernels compile in parallel worker processes into
the on-disk cubin cache first.

    python benchmarks/dequant_hopper_study.py --shapes 8192x8192 --ms 1 16 32 64 128 256 1024 4096 --out study.md
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: candidates per M range: (first M, last M) -> [(block_m, consumers, stages, in_flight[, k_split[, producers]])];
#: ("gemv", m_max, n_blocks, k_slices, stages, min_blocks_per_sm) entries time make_dequant_gemv instead
CANDIDATES = [
    ((1, 8), [("gemv", 8, 2, 8, 4, 2), (8, 2, 8, 1, True, 1)]),
    ((9, 16), [("gemv", 16, 2, 8, 4, 2), ("gemv", 32, 1, 8, 4, 2), (16, 2, 8, 1, True, 1)]),
    ((17, 32), [(32, 2, 8, 1, True, 1), ("gemv", 32, 1, 8, 4, 2), ("gemv", 32, 2, 8, 4, 1), ("gemv", 32, 1, 16, 4, 1)]),
    ((33, 64), [(64, 2, 8, 1, True, 1), (64, 4, 12, 1, True, 1)]),
    ((65, 128), [(128, 2, 8, 1, True, 1), (128, 1, 8, 1)]),
    ((129, 256), [(128, 2, 6, 1)]),
    ((257, 1 << 30), [(256, 2, 4, 1)]),
]


def candidates(M):
    for (lo, hi), cands in CANDIDATES:
        if lo <= M <= hi:
            return cands
    raise ValueError(M)


def _config(c):
    from mmaemit.kernels.dequant_gemm_hopper import HopperDequantConfig

    bm, cons, st, fl, *rest = c
    ks, npr = (list(rest) + [False, 1][len(rest):])[:2]
    return HopperDequantConfig(block_m=bm, consumers=cons, stages=st, in_flight=fl, k_split=bool(ks), producers=npr,
                               consumer_regs=232 if cons <= 2 else 112, producer_regs=40 if cons <= 2 else 24)


def _make(N, K, dtype, c):
    if c[0] == "gemv":
        from mmaemit.kernels.dequant_gemm import GemvConfig, make_dequant_gemv

        _, m_max, nb, ks, st, mb = c
        cfg = GemvConfig(n_blocks=nb, k_slices=ks, stages=st, min_blocks_per_sm=mb)
        return make_dequant_gemv(None, N, K, 128, dtype, cfg, "sm_90a", m_max=m_max)[0]
    from mmaemit.kernels.dequant_gemm_hopper import make_dequant_gemm_hopper

    return make_dequant_gemm_hopper(None, N, K, 128, dtype, _config(c), "sm_90a")[0]


def _build(item):
    N, K, dtype, c = item
    import mmaemit

    t = time.time()
    try:
        mmaemit.compile(_make(N, K, dtype, c), target="sm_90a")
        return item, time.time() - t, None
    except Exception as e:  # reported, the study goes on
        return item, time.time() - t, f"{type(e).__name__}: {str(e)[:300]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["8192x8192"])
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32, 64, 128, 256, 1024, 4096])
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--out", default=None)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--build-only", action="store_true", help="compile the candidates into the cubin cache and stop")
    opts = ap.parse_args()
    os.environ["MMAEMIT_CUBIN_CACHE"] = "1"
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch

    import mmaemit
    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments
    from mmaemit.kernels.dequant_dispatch import DequantGemm
    from mmaemit.runtime.timing import copies_needed, time_rotating

    shapes = [tuple(int(x) for x in s.split("x")) for s in opts.shapes]
    items = sorted({(N, K, opts.dtype, c) for N, K in shapes for M in opts.ms for c in candidates(M)}, key=str)
    t0 = time.time()
    errors = {}
    with ProcessPoolExecutor(opts.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for item, dt, err in pool.map(_build, items):
            if err:
                errors[item] = err
                print(f"build {item[3]} for {item[0]}x{item[1]}: {err}", flush=True)
    print(f"built {len(items)} kernels in {time.time() - t0:.0f} s", flush=True)
    if opts.build_only:
        return

    lines = [f"# fused Hopper dequant study, {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"`python benchmarks/dequant_hopper_study.py {' '.join(sys.argv[1:])}`", "",
             "| N x K | M | config (block_m, consumers, stages, in_flight[, k_split, producers]; or gemv, m_max, n_blocks, k_slices, stages, min_blocks) | µs | rel err | cuBLAS fp16 µs | plan path | plan µs |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    act = getattr(torch, opts.dtype)
    for N, K in shapes:
        w = torch.randn(N, K, device="cuda", dtype=act)
        qw = D.quantize(w, D.QuantScheme("int4", group_size=128))
        tensors, _ = kernel_arguments(qw)
        tensors = [t.cuda() for t in tensors]
        wbytes = sum(t.numel() * t.element_size() for t in tensors)
        rot = [tensors] + [[t.clone() for t in tensors] for _ in range(copies_needed(wbytes) - 1)]
        Wd = qw.dequantize().cuda()
        W16 = Wd.to(torch.float16)
        wcopies = [W16] + [W16.clone() for _ in range(copies_needed(W16.numel() * 2) - 1)]
        dg = DequantGemm(N, K, 128, opts.dtype, arch="sm_90a").warmup()
        kernels = {}
        for M in opts.ms:
            A = torch.randn(M, K, device="cuda", dtype=act)
            ref = (A.double() @ Wd.double().T)
            Ah = A.to(torch.float16)
            t_cub = time_rotating([lambda w=w: torch.matmul(Ah, w.T) for w in wcopies])
            out = torch.empty(M, N, device="cuda", dtype=act)
            path = dg.path_for(M)
            t_plan = time_rotating([lambda ts=ts: dg(A, *ts, out=out) for ts in rot])
            for c in candidates(M):
                if (N, K, opts.dtype, c) in errors:
                    continue
                key = (N, K, c)
                if key not in kernels:
                    kernels[key] = mmaemit.compile(_make(N, K, opts.dtype, c), target="sm_90a")
                kern = kernels[key]
                C = torch.full((M, N), float("nan"), device="cuda", dtype=act)
                try:
                    kern(A, *rot[0], C)
                    torch.cuda.synchronize()
                    rel = ((C.double() - ref).norm() / ref.norm()).item()
                    ok = not torch.isnan(C).any().item() and rel < (2e-3 if act == torch.float16 else 8e-3)
                    t = time_rotating([lambda ts=ts: kern(A, *ts, C) for ts in rot]) if ok else None
                except Exception as e:
                    rel, t = float("nan"), None
                    print(f"run {c} M={M}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                line = (f"| {N}x{K} | {M} | {c} | {'WRONG' if t is None else f'{t:.1f}'} | {rel:.1e} | "
                        f"{t_cub:.1f} | {path} | {t_plan:.1f} |")
                lines.append(line)
                print(line, flush=True)
        del rot, wcopies, dg, kernels
        torch.cuda.empty_cache()
    if opts.out:
        with open(opts.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
