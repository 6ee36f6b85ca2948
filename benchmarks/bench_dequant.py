"""Dequant GEMV/GEMM (default int4, group 128; ``--format`` any kernel format: W8A16 / W4A16 / W2A16 / W1A16) beside
cuBLAS fp16/bf16 and torch's int4 weight-only kernel.

    PYTHONPATH=. python3 benchmarks/bench_dequant.py [--shapes 8192x8192 28672x8192] [--ms 1 16] [--sweep]
        [--format int8] [--zeros-mode quantized]

Method: correctness of every mmaemit configuration against an fp64 reference on the same inputs first (poisoned
output), then ``mmaemit.runtime.timing.time_rotating``: every call of a round reads its own copy of the weights (copies >= 4x L2,
since the 8192x8192 int4 weights (34 MB) fit in the 50 MB L2), rounds replayed as CUDA graphs, median per call. The
peers get the same treatment. The HBM floor counts every byte once (weights, scales, zeros, A, C) at the device's
measured large-copy bandwidth (H100: 3.0 TB/s).
"""
from __future__ import annotations

import argparse
import datetime
import sys

import torch

import mmaemit
from mmaemit import dequant as D
from mmaemit.arch import device_arch
from mmaemit.dequant.formats import get_format
from mmaemit.dequant.kernel_layout import kernel_arguments
from mmaemit.kernels.dequant_gemm import (WEIGHT_FORMATS, ZEROS_FORMATS, GemvConfig, TiledConfig, default_tiled_config,
                                           make_dequant_gemm)
from mmaemit.kernels.dequant_gemm_wgmma import WgmmaConfig, default_wgmma_config
from mmaemit.runtime.timing import copies_needed, time_rotating

HBM_BYTES_PER_S = {"H100": 3.0e12, "H200": 4.3e12}   # measured device-to-device copy bandwidth
CONFIGS = [GemvConfig(2, 8, 4, 2), GemvConfig(2, 8, 4, 2, "marlin"), GemvConfig(4, 16, 3),
           GemvConfig(4, 16, 3, 1, "marlin"), GemvConfig(2, 8, 6, 2, "marlin"), GemvConfig(4, 8, 4, 2, "marlin"),
           GemvConfig(2, 8, 4, 3, "marlin"), GemvConfig(1, 16, 4, 2, "marlin"), GemvConfig(2, 4, 8, 4, "marlin"),
           GemvConfig(4, 8, 4, 2)]
TILED = [TiledConfig(128, 128, 64, 64, 4), TiledConfig(64, 128, 32, 64, 4), TiledConfig(128, 256, 64, 64, 3),
         TiledConfig(256, 128, 64, 64, 3), TiledConfig(64, 64, 32, 32, 4), TiledConfig(128, 128, 64, 64, 3)]
WGMMA = [WgmmaConfig(128, 4, 1, 4), WgmmaConfig(64, 2, 1, 4), WgmmaConfig(256, 2, 1, 4), WgmmaConfig(64, 4, 1, 4),
         WgmmaConfig(128, 2, 1, 4)]


def configs_for(M, hopper):
    """The configurations timed for M, the dispatch's default first (GEMV M <= 16, wgmma M > 128 on sm_90a)."""
    if M <= 16:
        return CONFIGS
    if M > 128 and hopper:
        first = default_wgmma_config(M)
        return [first] + [c for c in WGMMA if c != first]
    first = default_tiled_config(M, 8192)
    return [first] + [c for c in TILED if c != first]


def torch_int4_peer(A_bf16, N, K, group):
    """torch's int4 weight-only kernel (tinygemm) on random codes: a timing peer only (rotating weight copies)."""
    try:
        copies = []
        for _ in range(copies_needed(N * K // 2)):
            w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
            copies.append((torch._convert_weight_to_int4pack(w, 8),
                           torch.rand(K // group, N, 2, dtype=torch.bfloat16, device="cuda")))
        return time_rotating([lambda p=p, sz=sz: torch._weight_int4pack_mm(A_bf16, p, group, sz) for p, sz in copies])
    except Exception as e:  # the op's signature moves between torch releases: report, do not die
        print(f"  torch int4 peer unavailable: {type(e).__name__}: {str(e)[:160]}")
        return float("nan")


def cublas_peer(A, W16, dtype):
    """torch.matmul on dequantized fp16/bf16 weights, rotating weight copies."""
    Wt = W16.to(dtype)
    copies = [Wt] + [Wt.clone() for _ in range(copies_needed(Wt.numel() * 2) - 1)]
    Ad = A.to(dtype)
    return time_rotating([lambda w=w: torch.matmul(Ad, w.T) for w in copies])


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["8192x8192", "28672x8192"])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 16, 64, 256, 4096])
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--format", default="int4", choices=WEIGHT_FORMATS,
                   help="weight format (1-, 2-, 4- or 8-bit codes)")
    p.add_argument("--zeros-mode", choices=["original", "rescale", "quantized"], default=None,
                   help=f"zero points ({', '.join(ZEROS_FORMATS)} only; default for them: quantized)")
    p.add_argument("--sweep", action="store_true", help="time every GemvConfig, not only the default")
    args = p.parse_args(argv)
    zeros_mode = args.zeros_mode or ("quantized" if args.format in ZEROS_FORMATS else None)
    bits = get_format(args.format).bits
    arch = device_arch().name      # the decode's fast paths gated by arch (e.g. e4m3 -> f16 needs sm_89+)
    name = torch.cuda.get_device_name()
    bw = next((v for k, v in HBM_BYTES_PER_S.items() if k in name), 3.0e12)
    print(f"GPU: {name}, {datetime.date.today()}, torch {torch.__version__}, floor at {bw / 1e12:.1f} TB/s, "
          f"weights {args.format} ({bits}-bit) group {args.group}" + (f" zeros {zeros_mode}" if zeros_mode else ""))
    rows = ["| N x K | M | floor µs | mmaemit µs (config) | x floor | cuBLAS fp16 µs | cuBLAS bf16 µs | torch int4 µs | "
            "vs cuBLAS fp16 |", "|---|---|---|---|---|---|---|---|---|"]
    bad = 0
    for shape in args.shapes:
        N, K = map(int, shape.split("x"))
        w = torch.randn(N, K, device="cuda", dtype=torch.float16)
        qw = D.quantize(w, D.QuantScheme(args.format, group_size=args.group, zeros_mode=zeros_mode))
        tensors, kw = kernel_arguments(qw)
        tensors = [t.cuda() for t in tensors]                   # W, S[, Z]
        wbytes = sum(t.numel() * t.element_size() for t in tensors)
        rot = [tensors] + [[t.clone() for t in tensors] for _ in range(copies_needed(wbytes) - 1)]
        W16 = qw.dequantize().to(torch.float16).cuda()
        del w
        for M in args.ms:
            A = torch.randn(M, K, device="cuda", dtype=torch.float16)
            ref = A.double() @ W16.double().T
            floor = (wbytes + A.numel() * 2 + M * N * 2) / bw * 1e6
            results = []
            configs = configs_for(M, torch.cuda.get_device_capability() == (9, 0))
            for cfg in (configs if args.sweep else configs[:1]):
                try:
                    func, _ = make_dequant_gemm(M, N, K, config=cfg, arch=arch, **kw)
                except mmaemit.MmaemitError as e:
                    print(f"  skip {cfg}: {e}")
                    continue
                kernel = mmaemit.compile(func)
                C = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
                kernel(A, *tensors, C)
                rel = ((C.double() - ref).norm() / ref.norm()).item()
                ok = rel < 2e-3
                bad += not ok
                t = time_rotating([lambda ts=ts: kernel(A, *ts, C) for ts in rot])
                results.append((t, cfg, rel))
                print(f"  {N}x{K} M={M} {cfg}: {t:.1f} µs ({t / floor:.2f}x floor) rel {rel:.1e} "
                      f"{'' if ok else 'WRONG'}", flush=True)
            t_fp16 = cublas_peer(A, W16, torch.float16)
            t_bf16 = cublas_peer(A, W16, torch.bfloat16)
            t_int4 = torch_int4_peer(A.to(torch.bfloat16), N, K, args.group)
            t, cfg, rel = min(results, key=lambda r: r[0])
            tag = "x".join(str(v) for v in vars(cfg).values())
            rows.append(f"| {N}x{K} | {M} | {floor:.1f} | {t:.1f} ({tag}) | {t / floor:.2f} | {t_fp16:.1f} | "
                        f"{t_bf16:.1f} | {t_int4:.1f} | {t_fp16 / t:.2f} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
