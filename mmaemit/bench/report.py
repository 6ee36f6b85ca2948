"""Benchmark reports: the measurement record, the environment header, a Markdown table, CSV and a PNG plot.

Every report names the GPU, its clocks (current and maximum SM / memory clock, power limit, from ``nvidia-smi``),
the driver, CUDA, torch, TVM and mmaemit versions and the date. A dry run (made-up timings, to exercise this code
without a GPU) says so in the header, in every CSV row and in the plot title.
"""
from __future__ import annotations

import csv
import datetime
import math
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Measurement", "environment", "header_lines", "markdown_table", "write_csv", "read_csv", "plot",
           "write_report"]

DRY_RUN_NOTE = "DRY RUN: made-up timings (no GPU was used)"


@dataclass
class Measurement:
    """One timed implementation on one problem.

    ``series`` groups problems into one plot panel (e.g. "float16 NN"), ``x`` is the plot's x value (the GEMM size,
    or M), ``impl`` names the implementation ("mmaemit tuned", "torch.matmul", ...), ``check`` the correctness result
    ("rel 2.1e-04", "exact", "WRONG: ...", "peer"), ``time_us`` is None when nothing was timed (a wrong result or an
    unavailable peer; ``note`` says why). ``flops`` is the operation count, so throughput = flops / time.
    """

    suite: str
    problem: str
    series: str
    x: float
    impl: str
    config: str = ""
    time_us: float | None = None
    flops: float = 0.0
    check: str = ""
    note: str = ""
    floor_us: float | None = None
    dry_run: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def tflops(self) -> float | None:
        if self.time_us is None or not self.time_us > 0:
            return None
        return self.flops / (self.time_us * 1e-6) / 1e12


def _nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    fields = ["name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.limit",
              "persistence_mode"]
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    values = [v.strip() for v in out[0].split(",")]
    return dict(zip(fields, values)) if len(values) == len(fields) else {}


def environment(dry_run: bool = False) -> dict:
    """GPU, clocks, driver, CUDA, library versions and the date (what every report header states)."""
    import torch
    import tvm

    import mmaemit

    env = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "torch": torch.__version__,
           "tvm": str(tvm.__version__), "mmaemit": mmaemit.__version__, "cuda_runtime": str(torch.version.cuda)}
    if dry_run:
        env.update(gpu="none (dry run)", note=DRY_RUN_NOTE)
        return env
    from ..tuning.fingerprint import nvidia_driver_version

    smi = _nvidia_smi()
    env["gpu"] = torch.cuda.get_device_name()
    env["driver"] = smi.get("driver_version") or nvidia_driver_version()
    props = torch.cuda.get_device_properties(0)
    env["sms"] = props.multi_processor_count
    if smi:
        env["clocks"] = (f"SM {smi['clocks.sm']} MHz (max {smi['clocks.max.sm']}), memory {smi['clocks.mem']} MHz "
                         f"(max {smi['clocks.max.mem']}), power limit {smi['power.limit']} W, persistence "
                         f"{smi['persistence_mode']}")
    else:
        env["clocks"] = "unknown (nvidia-smi not found)"
    return env


def header_lines(env: dict, command: str = "") -> list:
    lines = [f"GPU: {env.get('gpu')}" + (f" ({env['sms']} SMs)" if env.get("sms") else "")
             + (f", driver {env['driver']}" if env.get("driver") else "") + f", CUDA runtime {env.get('cuda_runtime')}",
             f"Clocks: {env.get('clocks', 'n/a')}",
             f"Versions: torch {env.get('torch')}, apache-tvm {env.get('tvm')}, mmaemit {env.get('mmaemit')}; "
             f"date {env.get('date')}"]
    if command:
        lines.append(f"Command: {command}")
    if env.get("note"):
        lines.insert(0, f"**{env['note']}**")
    return lines


def _fmt(v, spec):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def markdown_table(rows: list) -> str:
    """One line per measurement: problem, implementation, config, µs, TFLOP/s, speed relative to the problem's
    first peer (peer µs / this µs), x floor (memory-bound suites), check."""
    peers = {}
    for r in rows:
        if r.check == "peer" and r.time_us and r.problem not in peers:
            peers[r.problem] = r.time_us
    has_floor = any(r.floor_us for r in rows)
    head = "| problem | implementation | config | µs | TFLOP/s | vs peer |" + (" x floor |" if has_floor else "") \
           + " check |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        peer = peers.get(r.problem)
        rel = peer / r.time_us if (peer and r.time_us) else None
        cells = [r.problem, r.impl, r.config or "", _fmt(r.time_us, ".1f"), _fmt(r.tflops, ".0f"), _fmt(rel, ".2f")]
        if has_floor:
            cells.append(_fmt(r.time_us / r.floor_us if (r.time_us and r.floor_us) else None, ".2f"))
        cells.append((r.check or "") + (f" ({r.note})" if r.note else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_CSV_FIELDS = ["suite", "problem", "series", "x", "impl", "config", "time_us", "tflops", "flops", "floor_us", "check",
               "note", "dry_run"]


def write_csv(rows: list, path, env: dict) -> None:
    path = Path(path)
    with path.open("w", newline="") as f:
        for line in header_lines(env):
            f.write(f"# {line}\n")
        w = csv.DictWriter(f, fieldnames=_CSV_FIELDS)
        w.writeheader()
        for r in rows:
            d = asdict(r)
            d["tflops"] = r.tflops
            w.writerow({k: d.get(k) for k in _CSV_FIELDS})


def read_csv(path) -> list:
    """The measurement rows of a CSV written by :func:`write_csv` (dicts of strings; ``#`` header lines skipped)."""
    with Path(path).open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def plot(rows: list, path, title: str, env: dict, xlabel: str = "M = N = K", log_x: bool = False) -> None:
    """Throughput (TFLOP/s) against ``x``, one panel per series, one line per implementation (sweep rows: their best
    per problem). Needs matplotlib (``pip install 'mmaemit[plot]'``)."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("plots need matplotlib: pip install 'mmaemit[plot]' (or pip install matplotlib)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(r.series for r in rows))
    n = max(1, len(series))
    cols = min(3, n)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows + 0.8), squeeze=False)
    for ax, s in zip(axes.ravel(), series):
        best = {}
        for r in rows:
            if r.series != s or r.tflops is None:
                continue
            impl = "mmaemit sweep (best)" if r.impl.startswith("mmaemit sweep") else r.impl
            k = (impl, r.x)
            best[k] = max(best.get(k, 0.0), r.tflops)
        for impl in dict.fromkeys(k[0] for k in best):
            pts = sorted((x, y) for (i, x), y in best.items() if i == impl)
            style = "-o" if impl.startswith("mmaemit") else "--s"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=impl, markersize=4)
        ax.set_title(s, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("TFLOP/s")
        if log_x:  # the memory-bound suites span M = 1 .. 4096: log axes both ways
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes.ravel()[len(series):]:
        ax.axis("off")
    sub = f"{env.get('gpu')} · torch {env.get('torch')} · mmaemit {env.get('mmaemit')} · {env.get('date', '')[:10]}"
    if env.get("note"):
        sub = env["note"] + "\n" + sub
    fig.suptitle(f"{title}\n{sub}", fontsize=10)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def write_report(rows: list, suite: str, out_dir, env: dict, command: str = "", xlabel: str = "M = N = K",
                 log_x: bool = False) -> dict:
    """Print-ready Markdown (returned), plus ``<out_dir>/<suite>.md``, ``.csv`` and ``.png``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(header_lines(env, command)) + "\n\n" + markdown_table(rows) + "\n"
    paths = {"md": out / f"{suite}.md", "csv": out / f"{suite}.csv", "png": out / f"{suite}.png"}
    paths["md"].write_text(text)
    write_csv(rows, paths["csv"], env)
    try:
        plot(rows, paths["png"], f"mmaemit bench {suite}", env, xlabel=xlabel, log_x=log_x)
    except ImportError as e:  # the measurements are written already; a missing plotting library only costs the PNG
        paths["png"] = f"(no PNG: {e})"
    return {"text": text, **paths}
