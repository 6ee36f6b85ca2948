"""GPU timing helpers used by ``mmaemit demo`` and the benchmark scripts (CUDA events, medians).

``median_time``: the median of ``reps`` event-timed calls after ``warmup`` calls.

``time_rotating``: when one call's inputs fit in L2 (50 MB on the H100), timing repeated calls on the same buffers
measures the cache. Instead each call in a round uses its own copy of the large inputs (copies together >= 4x L2),
the round is captured once in a CUDA graph (no launch gaps) and replayed; the median round time / calls is reported.
This is also the realistic setting for inference: consecutive layers read different weights. (An L2 flush by writing a
large buffer, as ``triton.testing.do_bench`` does, leaves L2 full of dirty lines whose write-back competes with the
kernel's reads; rotation avoids that bias.)
"""
from __future__ import annotations

import statistics
import time

import torch

L2_BYTES = 50 << 20


def copies_needed(bytes_per_call: int, factor: int = 4) -> int:
    """How many input copies make a round stream at least ``factor`` x L2 from DRAM (at least 2)."""
    return max(2, -(-factor * L2_BYTES // max(1, bytes_per_call)))


def _event_times(run, reps: int) -> list:
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return times


def median_time(fn, warmup: int = 10, reps: int = 50) -> float:
    """Median seconds per call of ``fn``, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    return statistics.median(_event_times(fn, reps))


def _run_for(fn, ms: float, rounds: int = 0) -> None:
    """Call ``fn`` (then synchronize) at least ``rounds`` times and until ``ms`` milliseconds of wall time passed."""
    start = time.perf_counter()
    done = 0
    while done < rounds or (time.perf_counter() - start) * 1e3 < ms:
        fn()
        torch.cuda.synchronize()
        done += 1


def time_rotating(calls, reps: int = 30, warmup: int = 3, use_graph: bool = True, warmup_ms: float = 200.0) -> float:
    """Median microseconds per call of ``calls`` (zero-argument callables, each on its own input copy).

    Warm-up: at least ``warmup`` rounds and at least ``warmup_ms`` of wall time running them. A GPU that idled sits at
    a low clock (the H100 at 345 MHz) and the first timings of a process scatter: measured on the H100 (2026-11-27,
    int4 GEMV at M=1, 8192^2, 15 µs), after 3 warm-up rounds the first timing in a fresh process read 16.7 µs and the
    next two 14.8; with 25 ms of warm-up, four timings read 16.9 / 15.2 / 15.2 / 17.5; with 300 ms, 15.1 / 15.1 /
    15.1 / 15.2."""
    def all_calls():
        for c in calls:
            c()

    _run_for(all_calls, warmup_ms, warmup)
    run = all_calls
    if use_graph:
        try:
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                all_calls()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(g):
                all_calls()
            run = g.replay
        except Exception as e:  # a launch path that cannot be captured: time plain launches, and say so
            print(f"  (graph capture failed: {type(e).__name__}: {str(e)[:100]}; timing plain launches)")
            torch.cuda.synchronize()
    # warm up what is timed, too: the first CUDA graph of a process replayed ~12 % slower for its first rounds (H100,
    # 2026-11-27: a 15 µs GEMV read 16.9 µs in the first timing of a process, 200 ms of plain warm-up launches before
    # it, then 15.0-15.2 in each of the next seven)
    _run_for(run, min(warmup_ms, 50.0))
    return statistics.median(_event_times(run, reps)) * 1e6 / len(calls)
