"""``mmaemit bench <suite>``: run a suite (:mod:`.suites`), print the table, write CSV + PNG (:mod:`.report`)."""
from __future__ import annotations

import sys

from .report import write_report
from .suites import fake_measurements, measure, problems

__all__ = ["run_bench", "NO_GPU_MESSAGE"]

NO_GPU_MESSAGE = ("mmaemit bench needs a CUDA GPU, and none is visible here (torch.cuda.is_available() is False). "
                  "Run it on a machine with a GPU, or add --dry-run to exercise the table, CSV and plot with made-up "
                  "timings.")


def run_bench(suite: str, opts, command: str = "") -> int:
    """Exit code: 0 when every mmaemit kernel passed its check, 1 if any was wrong or failed, 2 without a GPU."""
    import torch

    from .report import environment

    dry = bool(getattr(opts, "dry_run", False))
    if not dry and not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    env = environment(dry_run=dry)
    arch = None
    if not dry:
        from ..arch import device_arch

        arch = device_arch().name
    rows = []
    todo = problems(suite, opts)
    for i, p in enumerate(todo):
        got = fake_measurements(p, opts) if dry else measure(p, opts, arch)
        rows.extend(got)
        for r in got:
            t = "-" if r.time_us is None else f"{r.time_us:.1f} us"
            print(f"[{i + 1}/{len(todo)}] {p.name}: {r.impl} {r.config} {t} {r.check} {r.note}".rstrip(), flush=True)
    xlabel, log_x = ("M", True) if suite == "dequant" else ("M = N = K", False)
    report = write_report(rows, suite, opts.out, env, command=command, xlabel=xlabel, log_x=log_x)
    print()
    print(report["text"])
    print(f"wrote {report['md']}, {report['csv']}, {report['png']}")
    bad = [r for r in rows if r.impl.startswith("mmaemit") and (r.check.startswith("WRONG")
                                                                 or r.check.startswith("ERROR"))]
    return 1 if bad else 0
