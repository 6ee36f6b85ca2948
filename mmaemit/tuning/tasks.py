"""The functions tuning runs inside worker processes (module-level, so they pickle by name).

Compile workers run :func:`compile_candidate`. The single benchmark worker keeps state between tasks: :func:`bench_setup`
makes or receives the arguments and computes the reference outputs once per tuning run; :func:`check_candidate` loads
a candidate and checks its outputs (poisoned first) against the reference; :func:`time_candidate` times a checked
candidate (loading and checking it again if the worker was replaced since); :func:`bench_teardown` drops the state.
"""
from __future__ import annotations

import os
import time
import warnings

__all__ = ["compile_candidate", "bench_setup", "check_candidate", "time_candidate", "bench_teardown", "STATE"]

#: the benchmark worker's state (inputs, reference outputs, loaded kernels) between tasks
STATE: dict = {}


def mmaemit_environment() -> dict:
    """The parent's ``MMAEMIT_*`` variables (cache dir, tool paths), sent with each task: pool workers outlive the
    environment they were started in."""
    return {k: v for k, v in os.environ.items() if k.startswith("MMAEMIT_")}


def _apply_environment(env: dict) -> None:
    for k in [k for k in os.environ if k.startswith("MMAEMIT_") and k not in env]:
        del os.environ[k]
    os.environ.update(env)


def _warning_texts(caught) -> list:
    return sorted({f"{w.category.__name__}: {w.message}" for w in caught})


def compile_candidate(backend, builder_ref, args: dict, params: dict, env: dict) -> dict:
    _apply_environment(env)
    builder = builder_ref.resolve()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = backend.compile(builder, dict(args), dict(params)) or {}
    return {"info": info, "warnings": _warning_texts(caught), "seconds": time.perf_counter() - t0}


def _as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def bench_setup(backend, args: dict, bench_args, inputs_ref, reference_ref, outputs, check_ref, rtol,
                env: dict) -> dict:
    """Arguments (``bench_args``, or ``inputs(args)``), then the reference outputs ``reference(args, arguments)``."""
    STATE.clear()
    _apply_environment(env)
    backend.setup()
    values = list(bench_args) if bench_args is not None else _as_list(inputs_ref.resolve()(dict(args)))
    n = len(values)
    outs = [i % n for i in outputs]
    expected = _as_list(reference_ref.resolve()(dict(args), tuple(values)))
    if len(expected) != len(outs):
        raise ValueError(f"the reference returned {len(expected)} output(s) for outputs={tuple(outputs)} "
                         f"({len(outs)} argument index(es))")
    STATE.update(backend=backend, args=dict(args), values=values, outputs=outs, expected=expected,
                 check=None if check_ref is None else check_ref.resolve(), rtol=rtol, kernels={})
    return {"arguments": n}


def _fresh_values():
    backend, values = STATE["backend"], list(STATE["values"])
    for i in STATE["outputs"]:
        values[i] = backend.poison(values[i])
    return values


def _load_and_check(builder_ref, params: dict):
    from .backend import default_check
    from .space import canonical_json

    backend = STATE["backend"]
    kernel = backend.load(builder_ref.resolve(), dict(STATE["args"]), dict(params))
    values = _fresh_values()
    backend.run(kernel, values)
    backend.synchronize()
    got = [values[i] for i in STATE["outputs"]]
    check = STATE["check"]
    reason = check(got, STATE["expected"]) if check is not None else default_check(got, STATE["expected"],
                                                                                   STATE["rtol"])
    if reason is None:
        STATE["kernels"][canonical_json(params)] = kernel
        STATE.setdefault("timing_values", values)  # one set of output buffers serves every timed candidate
    return reason


def _guarded(fn, *args):
    try:
        return fn(*args)
    except BaseException as e:
        if not STATE["backend"].healthy():
            e.fatal_to_worker = True  # the pool replaces this worker after reporting the error
        raise


def check_candidate(builder_ref, params: dict) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reason = _guarded(_load_and_check, builder_ref, params)
    return {"correct": reason is None, "reason": reason, "warnings": _warning_texts(caught)}


def time_candidate(builder_ref, params: dict) -> dict:
    return _guarded(_time_candidate, builder_ref, params)


def _time_candidate(builder_ref, params: dict) -> dict:
    from .space import canonical_json

    hit = STATE["kernels"].get(canonical_json(params))
    if hit is None:  # this worker replaced one that was killed: load and check again
        reason = _load_and_check(builder_ref, params)
        if reason is not None:
            return {"correct": False, "reason": reason}
        hit = STATE["kernels"][canonical_json(params)]
    seconds = STATE["backend"].time(hit, STATE["timing_values"])
    return {"correct": True, "time_s": float(seconds)}


def bench_teardown() -> None:
    STATE.clear()
    try:
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # teardown is best effort
        pass
