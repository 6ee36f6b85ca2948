"""Attention forward TFLOP/s vs seqlen: mmaemit's mma.sync and Hopper (wgmma) FlashAttention kernels beside every
torch SDPA backend, in the same run.

    PYTHONPATH=. python3 benchmarks/bench_attention.py [--seqlens 4096 8192 16384] [--head-dims 64 128 256]
        [--causal 0 1] [--dtype float16] [--tokens 16384] [--hidden 2048] [--out FILE.md] [--prebuild-tests]
        [--points 8192:64:1 ...]

Shapes: batch = tokens / seqlen, heads = hidden / head_dim (16k tokens, hidden 2048: the FlashAttention papers'
setting; batch x heads x query tiles fill the GPU). Each point: correctness first — mmaemit vs the float32 math of the
first and last 128 query rows of two heads (O and LSE), and every SDPA backend vs the same rows — then the median of
``triton.testing.do_bench``. FLOPs = 4 b h s^2 d (half of it causal). Kernels are built first in parallel worker
processes into the on-disk cubin cache. Columns: ``mmaemit`` (mma.sync), ``mmaemit-wgmma`` (Hopper, default config);
at the ``--ablation`` points also ``mma-alt`` (the other mma.sync tiles), ``wgmma-seq`` (``overlap=False``) and
``wgmma-v-k`` (``v_major="k"``: V transposed by the producer). Points run head dim 128 first, and the table file
is rewritten after each.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from mmaemit.kernels.flash_attention import attention_kernel, flash_attention, flops


def bench(fn) -> float:
    """Median milliseconds."""
    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    except ImportError:
        from mmaemit.runtime.timing import median_time

        return median_time(fn, warmup=5, reps=20) * 1e3


def shape(seqlen, head_dim, tokens, hidden):
    return max(1, tokens // seqlen), max(1, hidden // head_dim)


IMPLS = {"mmaemit": "mma_sync", "mmaemit-wgmma": "wgmma", "mma-alt": "mma_sync", "wgmma-seq": "wgmma",
         "wgmma-v-k": "wgmma"}
ABLATIONS = ("mma-alt", "wgmma-seq", "wgmma-v-k")     # timed only at the --ablation points
#: mma-alt: the other mma.sync tile choice per head dim (d 64: 64-key blocks; d 128: 16 rows per warp, 64-row CTAs
#: with fewer registers; d 256: 64 x 32 tiles, 96 KB of shared memory = 2 CTAs per SM)
MMA_ALT = {64: (128, 64, 4, 2), 128: (64, 64, 4, 2), 256: (64, 32, 4, 2)}


def impl_config(name, D):
    """The config of a column (None: the implementation's default)."""
    from mmaemit.kernels.flash_attention import AttentionConfig
    from mmaemit.kernels.flash_attention_hopper import default_hopper_config

    if name == "mma-alt":
        return AttentionConfig(*MMA_ALT[D])
    if name == "wgmma-seq":
        return dataclasses.replace(default_hopper_config(D), overlap=False)
    if name == "wgmma-v-k":
        return dataclasses.replace(default_hopper_config(D), v_major="k")
    return None


def kernel_key(B, S, H, HK, D, dtype, causal, arch, implementation="mma_sync", config=None):
    return (B, S, B * S, B * S, H, HK, D, dtype, causal, 1.0 / math.sqrt(D), arch, config, implementation)


def _build(key):
    t = time.time()
    try:
        attention_kernel(*key)
    except Exception as exc:  # noqa: BLE001 - reported; the timing run shows the failure in its row
        return key, f"{type(exc).__name__}: {exc}"[:300]
    return key, time.time() - t


def prebuild(keys, workers=None):
    """Compile every kernel in ``keys`` in worker processes (spawned: no CUDA state shared) into the cubin cache, so
    the timing process only loads them."""
    os.environ["MMAEMIT_CUBIN_CACHE"] = "1"
    keys = list(dict.fromkeys(keys))
    t = time.time()
    with ProcessPoolExecutor(max_workers=workers or min(len(keys), os.cpu_count() or 4),
                             mp_context=__import__("multiprocessing").get_context("spawn")) as pool:
        for key, dt in pool.map(_build, keys):
            if isinstance(dt, str):
                print(f"build failed {key}: {dt}", flush=True)
    print(f"prebuilt {len(keys)} kernels in {time.time() - t:.1f} s", flush=True)


def test_shape_keys(arch):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_flash_attention import GPU_CASES

    keys = [kernel_key(B, S, H, HK, D, dt, c, arch) for dt, B, S, H, HK, D, c in GPU_CASES]
    keys += [kernel_key(B, S, H, HK, D, dt, c, arch, "wgmma") for dt, B, S, H, HK, D, c in GPU_CASES[:2]]
    # test_gpu_varlen_ragged_matches_float64: lengths q [300, 1, 129], k [300, 77, 500], 4 / 2 heads, d 128, causal
    return keys + [(3, 300, 430, 877, 4, 2, 128, "float16", True, 1.0 / math.sqrt(128), arch, None, "mma_sync")]


def rows_reference(q, k, v, causal, heads=2, rows=128):
    """float32 math for the first and last ``rows`` query rows of batch 0, heads 0 .. heads-1 (O, LSE)."""
    S, D = q.shape[1], q.shape[3]
    idx = torch.cat([torch.arange(rows), torch.arange(S - rows, S)]).to(q.device)
    G = q.shape[2] // k.shape[2]
    out_o, out_l = [], []
    for h in range(heads):
        qs = q[0, idx, h].float()
        ks, vs = k[0, :, h // G].float(), v[0, :, h // G].float()
        s = qs @ ks.T / math.sqrt(D)
        if causal:
            s = s.masked_fill(torch.arange(S, device=q.device)[None, :] > idx[:, None], float("-inf"))
        out_l.append(torch.logsumexp(s, -1))
        out_o.append(torch.softmax(s, -1) @ vs)
    return idx, torch.stack(out_o, 1), torch.stack(out_l, 0)


def sdpa_backends():
    from torch.nn.attention import SDPBackend

    names = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION")]
    return [(n, getattr(SDPBackend, a)) for n, a in names if hasattr(SDPBackend, a)]


def sdpa_call(backend, q, k, v, causal):
    from torch.nn.attention import sdpa_kernel

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))    # [b, h, s, d] views of the [b, s, h, d] tensors

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return run


def run_point(S, D, causal, dtype, tokens, hidden, backends, impls, ablation=False):
    B, H = shape(S, D, tokens, hidden)
    td = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(S + D + causal)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g).to(td) for _ in range(3))
    idx, ro, rl = rows_reference(q, k, v, causal)
    f = flops(B, S, S, H, D, causal)
    row = {"seqlen": S, "head_dim": D, "causal": causal, "batch": B, "heads": H}
    for name, impl in impls:
        if name in ABLATIONS and not ablation:
            continue
        cfg = impl_config(name, D)
        try:
            o, lse = flash_attention(q, k, v, causal=causal, implementation=impl, config=cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a failing implementation is reported in the table, not fatal
            row[name], row[name + "_err"] = float("nan"), f"{type(exc).__name__}: {str(exc)[:60]}"
            continue
        err_o = (o[0, idx, :2].float() - ro).abs().max().item()
        err_l = (lse[0, :2, idx] - rl).abs().max().item()
        ok = err_o < (4e-3 if dtype == "float16" else 3e-2) and err_l < 2e-3
        row[name + "_err"] = f"{err_o:.1e}/{err_l:.1e}"
        row[name] = (f / bench(lambda: flash_attention(q, k, v, causal=causal, implementation=impl, config=cfg))
                     / 1e9 if ok else float("nan"))
        del o, lse
    for name, be in backends:
        fn = sdpa_call(be, q, k, v, causal)
        try:
            out = fn().transpose(1, 2)
            torch.cuda.synchronize()
            e = (out[0, idx, :2].float() - ro).abs().max().item()
            row[name] = f / bench(fn) / 1e9 if e < 3e-2 else float("nan")
            row[name + "_err"] = f"{e:.1e}"
        except RuntimeError as exc:
            row[name] = float("nan")
            row[name + "_err"] = type(exc).__name__ + ": " + str(exc).split("\n")[0][:60]
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--points", nargs="+", default=None,
                   help="explicit points SEQLEN:HEADDIM:CAUSAL (replaces the grid)")
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=list(IMPLS))
    p.add_argument("--ablation", nargs="*", default=["8192:128", "8192:256"],
                   help="SEQLEN:HEADDIM points that also time mma-alt, wgmma-seq and wgmma-v-k")
    p.add_argument("--prebuild-only", action="store_true")
    p.add_argument("--prebuild-tests", action="store_true", help="also build the GPU tests' kernels")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from mmaemit.arch import device_arch

    arch = device_arch().name
    points = [(S, D, bool(c)) for D in args.head_dims for c in args.causal for S in args.seqlens]
    points.sort(key=lambda p: (p[1] != 128, p[1], p[2], p[0]))        # head dim 128 first
    if args.points:
        points = [(int(a), int(b), bool(int(c))) for a, b, c in (x.split(":") for x in args.points)]
    keys = []
    for S, D, c in points:
        B, H = shape(S, D, args.tokens, args.hidden)
        for n in args.impls:
            if n not in ABLATIONS or f"{S}:{D}" in args.ablation:
                keys.append(kernel_key(B, S, H, H, D, args.dtype, c, arch, IMPLS[n], impl_config(n, D)))
    if args.prebuild_tests:
        keys += test_shape_keys(arch)
    prebuild(keys)
    if args.prebuild_only:
        return 0
    backends = sdpa_backends()
    props = torch.cuda.get_device_properties(0)
    head = (f"GPU {props.name} ({arch}), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch "
            f"{torch.__version__}, {args.dtype}, tokens {args.tokens}, hidden {args.hidden}; TFLOP/s (median)")
    impls = [(n, IMPLS[n]) for n in args.impls]
    cols = [n for n, _ in impls] + [n for n, _ in backends]
    lines = [head, "", "| head dim | causal | seqlen | batch x heads | " + " | ".join(cols)
             + " | errors (ours O/LSE; peers O) |",
             "|---|---|---|---|" + "---|" * len(cols) + "---|"]
    print(head, flush=True)
    for S, D, c in points:
        r = run_point(S, D, c, args.dtype, args.tokens, args.hidden, backends, impls, f"{S}:{D}" in args.ablation)
        errs = " ".join(r.get(n + "_err", "") for n in cols)
        line = (f"| {D} | {'yes' if c else 'no'} | {S} | {r['batch']}x{r['heads']} | "
                + " | ".join(f"{r[n]:.0f}" if n in r else "-" for n in cols) + f" | {errs} |")
        lines.append(line)
        print(line, flush=True)
        if args.out:                # rewritten after every point: a run cut short keeps what it measured
            with open(args.out, "w") as fh:
                fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
