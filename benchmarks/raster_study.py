"""The rasterization study on the H100 (issue 11): CTA tile order x panel x persistent, on GEMMs whose per-wave operand
panels exceed the 50 MB L2 and on ones that fit; TFLOP/s (and, with --ncu, the L2 hit rate).

    PYTHONPATH=. python3 benchmarks/raster_study.py OUT_DIR [--shapes 16384x16384x4096 8192x65536x8192 ...]
        [--tile 128x128x32x3] [--ncu] [--quick]

Kernel: the mma.sync GEMM (``mmaemit.kernels.gemm_mma``, fp16, NN), one CTA tile for every variant (default: the
default ``GemmConfig``, 128x128x32, 3 stages). Variants (``GemmConfig.raster`` / ``.panel`` / ``.persistent``):
row-major; panel 2..32; serpentine 4, 8, 16; grouped (panel x panel super-tiles) 4, 8, 16; each with one CTA per tile
and persistent (``--waves`` x SMs CTAs looping over the tiles). All variants of a shape compile in parallel and are
checked and timed in isolation by the autotuner (``mmaemit.tuning``; timing: CUDA events, median, ~0.5 s per variant).

"Wave footprint" = the distinct A and B panels (block x K fp16) touched by one wave of consecutive CTA ids (SMs x
CTAs per SM, from the kernel's registers and shared memory), in MB: above ~50 MB the order has to bring panels back
from DRAM. Writes OUT_DIR/raster_study.csv, .md and .png. About 3 minutes on the H100 without --ncu; --ncu adds an
Nsight Compute run (L2 sector hit rate, DRAM bytes) of row-major and of the best order per shape (~20 s each).
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_SHAPES = ["16384x16384x4096", "8192x65536x8192", "4096x4096x4096", "8192x8192x2048"]
L2_MB = 50.0


def variants(persistent_ctas: int, quick: bool) -> list:
    orders = [("row", 1)] + [("panel", p) for p in (2, 4, 8, 16, 32)]
    orders += [("serpentine", p) for p in (4, 8, 16)] + [("grouped", p) for p in (4, 8, 16)]
    if quick:
        orders = [("row", 1), ("panel", 8), ("panel", 16), ("serpentine", 8), ("grouped", 8)]
    return [(o, p, pers) for o, p in orders for pers in (0, persistent_ctas)]


def occupancy(regs: int, threads: int, smem: int, sms_smem_bytes: int = 228 << 10) -> int:
    """CTAs per SM allowed by registers (65536 per SM, allocated per warp in units of 256) and shared memory."""
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = 65536 // max(1, per_warp * (threads // 32))
    by_smem = sms_smem_bytes // max(1, smem + 1024)
    return max(1, min(by_regs, by_smem, 2048 // threads))


def parse_tile(text):
    bm, bn, bk, st = (int(v) for v in text.lower().split("x"))
    return bm, bn, bk, st


def footprint_mb(order, wave, block_m, block_n, K) -> float:
    from mmaemit.layouts.raster import raster_order, wave_footprint_bytes

    return wave_footprint_bytes(raster_order(order[0], *order[1:]), wave, block_m, block_n, K) / 1e6


def run_ncu(shape, cfg, out_dir) -> dict:
    ncu = shutil.which("ncu") or ("/usr/local/cuda/bin/ncu" if os.path.exists("/usr/local/cuda/bin/ncu") else None)
    if ncu is None:
        return {"l2_hit_pct": "ncu not found"}
    metrics = "lts__t_sector_hit_rate.pct,dram__bytes_read.sum"
    cmd = [ncu, "--metrics", metrics, "--csv", "--kernel-name", "gemm_kernel", "--launch-skip", "1",
           "--launch-count", "1", sys.executable, __file__, str(out_dir), "--one", shape,
           f"{cfg.raster}:{cfg.panel}:{cfg.persistent}:{cfg.block_m}x{cfg.block_n}x{cfg.block_k}x{cfg.stages}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)))
    out = {}
    for row in csv.reader(proc.stdout.splitlines()):
        for name, key in (("lts__t_sector_hit_rate.pct", "l2_hit_pct"), ("dram__bytes_read.sum", "dram_read")):
            if name in row:
                unit = row[row.index(name) + 1] if row.index(name) + 1 < len(row) else ""
                out[key] = f"{row[-1]} {unit}".strip()
    if not out:
        out["l2_hit_pct"] = f"ncu failed (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"
    return out


def one(shape, spec) -> int:
    """Under ncu: build one variant and launch it twice (the profiled launch is the second)."""
    import torch

    import mmaemit
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm, random_inputs

    M, N, K = (int(v) for v in shape.split("x"))
    raster, panel, pers, tile = spec.split(":")
    bm, bn, bk, st = parse_tile(tile)
    cfg = GemmConfig(bm, bn, bk, 64, 64, st, raster=raster, panel=int(panel), persistent=int(pers))
    arch = mmaemit.arch.device_arch().name
    kernel = mmaemit.compile(make_gemm(M, N, K, "float16", config=cfg, arch=arch)[0], cubin_cache=True)
    A, B = random_inputs(M, N, K, "float16", seed=0)
    C = torch.empty(M, N, dtype=torch.float16, device="cuda")
    for _ in range(2):
        kernel(A, B, C)
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="output folder (CSV, Markdown, PNG)")
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="MxNxK")
    p.add_argument("--tile", default="128x128x32x3", help="block_m x block_n x block_k x stages for every variant")
    p.add_argument("--waves", type=int, default=0, help="persistent CTAs = waves x SMs (default: the occupancy)")
    p.add_argument("--ncu", action="store_true", help="also profile row-major and the best order with Nsight Compute")
    p.add_argument("--quick", action="store_true", help="5 orders instead of 12")
    p.add_argument("--one", nargs=2, metavar=("SHAPE", "SPEC"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        return one(*args.one)

    import torch

    import mmaemit
    from mmaemit.bench.report import environment, header_lines
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm
    from mmaemit.kernels.tuned import gemm_kernel

    if not torch.cuda.is_available():
        print("the rasterization study needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    arch = mmaemit.arch.device_arch().name
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bm, bn, bk, st = parse_tile(args.tile)
    probe = mmaemit.compile(make_gemm(4096, 4096, 4096, "float16", config=GemmConfig(bm, bn, bk, 64, 64, st),
                                      arch=arch)[0], cubin_cache=True)
    usage = probe.resource_usage()
    threads = (bm // 64) * (bn // 64) * 32
    smem = st * bk * (bm + bn) * 2
    per_sm = occupancy(usage.registers, threads, smem)
    waves = args.waves or per_sm
    pers_ctas = waves * sms
    print("\n".join(header_lines(env)))
    print(f"tile {bm}x{bn}x{bk}, {st} stages: {usage.registers} registers x {threads} threads, {smem >> 10} KiB "
          f"shared -> {per_sm} CTAs/SM; wave = {per_sm * sms} CTAs; persistent grid = {pers_ctas} CTAs", flush=True)
    rows = []
    t_all = time.perf_counter()
    for shape in args.shapes:
        M, N, K = (int(v) for v in shape.lower().split("x"))
        grid = (M // bm, N // bn)
        cfgs = [GemmConfig(bm, bn, bk, 64, 64, st, raster=o, panel=pn, persistent=pers)
                for o, pn, pers in variants(pers_ctas, args.quick)]
        tk = gemm_kernel.with_space(config=cfgs).with_options(name="mmaemit.raster_study", confirm=0,
                                                               run_timeout=120)
        t0 = time.perf_counter()
        result = tk.tune(M, N, K, "float16", arch=arch, force=True)
        print(f"{shape}: {len(cfgs)} variants in {time.perf_counter() - t0:.0f} s", flush=True)
        flops = 2.0 * M * N * K
        for c in result.candidates:
            cfg = c.params["config"]
            fp = footprint_mb((cfg.raster, *grid, cfg.panel), per_sm * sms, bm, bn, K)
            rows.append({"shape": shape, "order": cfg.raster, "panel": cfg.panel if cfg.raster != "row" else 1,
                         "persistent": cfg.persistent, "status": c.status,
                         "time_us": None if c.time_s is None else c.time_s * 1e6,
                         "tflops": None if c.time_s is None else flops / c.time_s / 1e12,
                         "wave_footprint_mb": round(fp, 1), "fits_l2": fp <= L2_MB, "note": c.reason})
        if args.ncu:
            timed = [r for r in rows if r["shape"] == shape and r["tflops"] and r["persistent"] == 0]
            best = max(timed, key=lambda r: r["tflops"])
            for r in {id(x): x for x in (best, next(x for x in timed if x["order"] == "row"))}.values():
                cfg = GemmConfig(bm, bn, bk, 64, 64, st, raster=r["order"], panel=r["panel"], persistent=0)
                r.update(run_ncu(shape, cfg, out))
                print(f"  ncu {shape} {r['order']} {r['panel']}: L2 hit {r.get('l2_hit_pct')}, DRAM read "
                      f"{r.get('dram_read')}", flush=True)
    fields = ["shape", "order", "panel", "persistent", "status", "time_us", "tflops", "wave_footprint_mb", "fits_l2",
              "l2_hit_pct", "dram_read", "note"]
    with (out / "raster_study.csv").open("w", newline="") as f:
        for line in header_lines(env):
            f.write(f"# {line}\n")
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in fields})
    md = summary(rows, args.shapes, env, header_lines)
    (out / "raster_study.md").write_text(md)
    print(md)
    try:
        plot(rows, args.shapes, out / "raster_study.png", env, f"{bm}x{bn}x{bk}, {st} stages")
    except ImportError as e:
        print(f"no PNG (matplotlib missing: {e}); the CSV and Markdown hold every number")
    print(f"wrote {out / 'raster_study.csv'}, {out / 'raster_study.md'}, {out / 'raster_study.png'} "
          f"({time.perf_counter() - t_all:.0f} s)")
    return 0


def summary(rows, shapes, env, header_lines) -> str:
    lines = header_lines(env) + ["", "| shape | wave footprint row-major / best (MB) | row-major TFLOP/s | panel 8 "
                                     "| best order | best TFLOP/s | best persistent | best / row |",
                                 "|---|---|---|---|---|---|---|---|"]
    score = {}
    for shape in shapes:
        rs = [r for r in rows if r["shape"] == shape and r["tflops"]]
        if not rs:
            lines.append(f"| {shape} | - | - | - | no variant timed | - | - | - |")
            continue
        row = next((r for r in rs if r["order"] == "row" and not r["persistent"]), None)
        default = next((r for r in rs if r["order"] == "panel" and r["panel"] == 8 and not r["persistent"]), None)
        best = max(rs, key=lambda r: r["tflops"])
        best_p = max((r for r in rs if r["persistent"]), key=lambda r: r["tflops"], default=None)
        lines.append(f"| {shape} | {row['wave_footprint_mb'] if row else '-'} / {best['wave_footprint_mb']} | "
                     f"{row['tflops']:.0f} | {default['tflops']:.0f} | {best['order']} {best['panel']}"
                     f"{' persistent' if best['persistent'] else ''} | {best['tflops']:.0f} | "
                     f"{best_p['tflops']:.0f} ({best_p['order']} {best_p['panel']}) | "
                     f"{best['tflops'] / row['tflops']:.2f} |" if row and default and best_p else
                     f"| {shape} | ... | incomplete |")
        top = max(r["tflops"] for r in rs)
        for r in rs:
            k = (r["order"], r["panel"], bool(r["persistent"]))
            score.setdefault(k, []).append(r["tflops"] / top)
    full = {k: math.exp(sum(math.log(v) for v in vs) / len(vs)) for k, vs in score.items() if len(vs) == len(shapes)}
    if full:
        ranked = sorted(full.items(), key=lambda kv: -kv[1])[:5]
        lines += ["", "Geometric mean of (TFLOP/s / the shape's best) over every shape, top 5 (the default order "
                      "should be the first unless the difference is within noise, ~1 %):"]
        for (o, pn, pers), v in ranked:
            lines.append(f"- {o} {pn}{' persistent' if pers else ''}: {v:.3f}")
    return "\n".join(lines) + "\n"


def plot(rows, shapes, path, env, tile_text) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(shapes)
    cols = min(2, n)
    nr = -(-n // cols)
    fig, axes = plt.subplots(nr, cols, figsize=(6.2 * cols, 3.9 * nr + 0.8), squeeze=False)
    for ax, shape in zip(axes.ravel(), shapes):
        rs = [r for r in rows if r["shape"] == shape and r["tflops"]]
        for pers, style in ((0, "-o"), (1, "--s")):
            for order in ("panel", "serpentine", "grouped"):
                pts = sorted((r["panel"], r["tflops"]) for r in rs if r["order"] == order and bool(r["persistent"])
                             == bool(pers))
                if pts:
                    ax.plot([q[0] for q in pts], [q[1] for q in pts], style, markersize=4,
                            label=f"{order}{' persistent' if pers else ''}")
            row = [r["tflops"] for r in rs if r["order"] == "row" and bool(r["persistent"]) == bool(pers)]
            if row:
                ax.axhline(row[0], linestyle=":" if pers else "-.", color="gray",
                           label=f"row-major{' persistent' if pers else ''}")
        fp = [r["wave_footprint_mb"] for r in rs if r["order"] == "row"]
        ax.set_title(f"{shape} (row-major wave: {fp[0] if fp else '?'} MB of panels)", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("panel (tile rows) / super-tile size")
        ax.set_ylabel("TFLOP/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle(f"CTA raster order, mma.sync fp16 GEMM {tile_text}\n{env.get('gpu')} · {env.get('clocks', '')[:60]}"
                 f" · {env.get('date', '')[:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
