"""``autotune`` (decorator) and ``tune`` (function form): pick the fastest correct configuration of a kernel builder.

A *builder* is a module-level function of the problem (shapes, dtypes, arch: its "key" arguments) and of tunable
parameters (keyword arguments named by the tuning axes) that returns a PrimFunc (or ``(PrimFunc, ...)``)::

    @mmaemit.autotune("tile", [(128, 128, 32), (256, 128, 64)])       # stacked decorators: axes multiply
    @mmaemit.autotune(stages=[3, 4], inputs=gemm_inputs, reference=gemm_reference, outputs=[2])
    def gemm(M, N, K, dtype, arch, *, tile, stages):
        return make_gemm(M, N, K, dtype, config=GemmConfig(*tile, 64, 64, stages), arch=arch)[0]

    kernel = gemm(4096, 4096, 4096, "float16", "sm_90a")      # the winner for this key, compiled
    kernel(A, B, C)

Calling the decorated builder with its key arguments returns the winner's compiled kernel. What happens is set by
``$MMAEMIT_AUTOTUNE``: ``0`` uses the ``default`` parameters (no tuning, no table); ``1`` (the default) takes the
winner from the on-disk table (:mod:`.table`) and tunes on a miss; ``force`` tunes again (once per key and process)
and overwrites the entry.

Tuning one key: the candidates are the Cartesian product of the axes (:mod:`.space`), minus those a ``prune``
function rejects; each compiles in a worker process (in parallel, ``compile_timeout`` each, :mod:`.pool`); one
benchmark process (``run_timeout`` per candidate, killed and replaced on a hang) computes the ``reference`` outputs
once, runs every compiled candidate on poisoned output buffers, checks them against the reference, and times the
correct ones. Every candidate ends as "timed" or skipped with its reason: "pruned", "invalid" (the builder rejected the
parameters with an mmaemit error), "compile-error", "compile-timeout", "run-error", "run-timeout", "wrong". The
fastest timed one wins and is stored under the kernel's source hash, the candidate set, the key values and the device
fingerprint (GPU, driver, CUDA, TVM, mmaemit versions). Two processes tuning the same entry take turns (file lock);
the second finds the first one's winner.

Options (keywords of ``autotune`` / ``tune``; an outer stacked decorator's option wins over an inner one's):

* ``key``: which builder arguments select a table entry: None (all of them), a list of names, or a module-level
  function ``key(args) -> dict`` (e.g. to bucket M); the kernel is still built with the exact arguments.
* ``prune``: module-level ``prune(params, args) -> bool | str`` (False or a reason string drops the candidate).
* ``inputs``: ``inputs(args) -> tuple`` of the kernel's arguments (outputs included) when the call gives no
  ``bench_args``; ``reference(args, arguments) -> output(s)``; ``outputs``: indices of the arguments the kernel writes
  (negative allowed); ``rtol`` or ``check(outputs, expected) -> None | reason`` decide correctness.
* ``default``: parameters for ``MMAEMIT_AUTOTUNE=0`` (a dict, or ``default(args) -> dict``; missing axes take their
  first value).
* ``backend``: a :class:`~mmaemit.tuning.backend.Backend` (default ``CudaBackend()``).
* ``compile_timeout`` (120 s), ``run_timeout`` (60 s: load + check or timing of one candidate), ``setup_timeout``
  (600 s: inputs and reference), ``workers`` (compile processes; default ``$MMAEMIT_AUTOTUNE_WORKERS`` or the CPU
  count), ``progress`` (True, False or a file), ``depends`` (modules / packages whose source is part of the kernel
  source hash besides the builder's module), ``name`` (the table's name; default ``module.qualname``),
  ``confirm`` (3: the fastest 3 are timed a second time, in reverse order, and keep the better of their two times,
  so one noisy measurement does not pick the winner).
"""
from __future__ import annotations

import datetime
import functools
import inspect
import os
import time
from dataclasses import dataclass, field

from ..errors import ArgumentError, TuningError, choices
from . import tasks
from .fingerprint import source_hash
from .pool import SETUP, FunctionRef, shared_pool, wait_any
from .progress import Progress
from .space import Space, canonical_json, digest, jsonable
from .table import TuningTable, entry_key

__all__ = ["autotune", "tune", "TunedKernel", "TuneResult", "CandidateResult", "autotune_mode", "MODES"]

AUTOTUNE_ENV = "MMAEMIT_AUTOTUNE"
#: accepted ``$MMAEMIT_AUTOTUNE`` values -> mode
MODES = {"0": "off", "off": "off", "1": "on", "on": "on", "force": "force"}

_DEFAULTS = {"key": None, "prune": (), "inputs": None, "reference": None, "outputs": (-1,), "check": None,
             "rtol": 1e-2, "default": None, "backend": None, "compile_timeout": 120.0, "run_timeout": 60.0,
             "setup_timeout": 600.0, "depends": (), "workers": None, "progress": True, "name": None, "confirm": 3}
OPTIONS = tuple(_DEFAULTS)

_STATUSES = ("timed", "pruned", "invalid", "compile-error", "compile-timeout", "run-error", "run-timeout", "wrong")


def autotune_mode() -> str:
    """"off", "on" or "force" from ``$MMAEMIT_AUTOTUNE`` (unset: "on")."""
    raw = os.environ.get(AUTOTUNE_ENV, "1").strip().lower() or "1"
    if raw not in MODES:
        raise ArgumentError(f"{AUTOTUNE_ENV}={raw!r} is not valid; use one of {choices(['0', '1', 'force'])} "
                            f"(0: defaults, 1: cached winners and tune misses, force: tune again)")
    return MODES[raw]


@dataclass
class CandidateResult:
    """One candidate's fate. ``status`` is "timed" (``time_s`` set) or the reason class of a skip (see module doc)."""

    params: dict
    status: str = "pending"
    reason: str = ""
    time_s: float | None = None
    compile_s: float | None = None
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"params": jsonable(self.params), "status": self.status, "reason": self.reason, "time_s": self.time_s,
                "compile_s": self.compile_s, "info": self.info}

    @classmethod
    def from_json(cls, d: dict) -> "CandidateResult":
        return cls(d["params"], d["status"], d.get("reason", ""), d.get("time_s"), d.get("compile_s"),
                   d.get("info") or {})


@dataclass
class TuneResult:
    """The outcome for one key: ``winner`` (the parameters), its ``time_s``, every candidate, and where it came from
    (``source``: "tuned", "table" or "default")."""

    kernel: str
    key: dict
    winner: dict
    time_s: float | None
    candidates: list
    source: str
    entry_key: str = ""
    tuning_s: float = 0.0
    date: str = ""

    @property
    def from_cache(self) -> bool:
        return self.source == "table"

    @property
    def skipped(self) -> list:
        return [c for c in self.candidates if c.status != "timed"]

    def table(self) -> str:
        """The candidates as a text table, fastest first, skipped ones last with their reasons."""
        timed = sorted((c for c in self.candidates if c.status == "timed"), key=lambda c: c.time_s)
        lines = [f"{self.kernel} {_key_text(self.key)}: winner {_params_text(self.winner)}"
                 + (f" {self.time_s * 1e6:.1f} us" if self.time_s is not None else "") + f" ({self.source})"]
        for c in timed:
            lines.append(f"  {c.time_s * 1e6:10.1f} us  {_params_text(c.params)}")
        for c in self.skipped:
            lines.append(f"  {c.status:>13s}  {_params_text(c.params)}: {c.reason}")
        return "\n".join(lines)

    def to_entry(self, device: dict, source: str, space: str) -> dict:
        return {"kernel": self.kernel, "key": jsonable(self.key), "device": device, "source": source, "space": space,
                "winner": jsonable(self.winner), "time_s": self.time_s,
                "candidates": [c.to_json() for c in self.candidates], "date": self.date, "tuning_s": self.tuning_s}


def _short(v) -> str:
    j = jsonable(v)
    if isinstance(j, dict) and "__type__" in j:
        return j["__type__"].rsplit(".", 1)[-1] + "(" + ",".join(str(_short(x)) for k, x in j.items()
                                                                 if k != "__type__") + ")"
    if isinstance(j, list):
        return "x".join(str(x) for x in j)
    return str(j)


def _params_text(params: dict) -> str:
    return " ".join(f"{k}={_short(v)}" for k, v in params.items())


def _key_text(key: dict) -> str:
    return " ".join(f"{k}={_short(v)}" for k, v in key.items())


def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _Decorator:
    def __init__(self, space: Space, options: dict):
        self.space = space
        self.options = options

    def __call__(self, target):
        if isinstance(target, TunedKernel):
            return target._stacked(self.space, self.options)
        if not callable(target):
            raise ArgumentError(f"@autotune decorates a kernel builder function, got {target!r}")
        return TunedKernel(target, self.space, self.options)


def _split_options(kwargs: dict):
    options, axes = {}, {}
    for k, v in kwargs.items():
        (options if k in _DEFAULTS else axes)[k] = v
    if "prune" in options:
        p = options["prune"]
        options["prune"] = tuple(p) if isinstance(p, (tuple, list)) else (p,)
    return options, axes


def autotune(*axis, space: dict | None = None, **kwargs):
    """Decorator factory: ``@autotune("name", values, **options)``, ``@autotune(name=values, ..., **options)`` or
    ``@autotune(space={"name": values}, **options)``; stack several to multiply their axes. Keywords that are option
    names (see the module doc) are options, every other keyword is an axis. ``autotune(...)(builder)`` is the same
    without the decorator syntax. Returns a decorator giving a :class:`TunedKernel`."""
    options, axes = _split_options(kwargs)
    if axis:
        if len(axis) != 2 or not isinstance(axis[0], str):
            raise ArgumentError("positional form: @autotune('name', [values]); use keywords for several axes")
        if axis[0] in axes:
            raise ArgumentError(f"axis {axis[0]!r} given twice")
        axes = {axis[0]: axis[1], **axes}
    if space:
        for k in space:
            if k in axes:
                raise ArgumentError(f"axis {k!r} given twice")
        axes = {**axes, **space}
    return _Decorator(Space(axes), options)


def tune(builder, space: dict | None = None, *, args: dict, bench_args=None, force: bool = False,
         **options) -> TuneResult:
    """Function form: tune ``builder`` over ``space`` (axis -> values) for the builder arguments ``args`` (a dict)
    and return the :class:`TuneResult` (from the table on a hit unless ``force``). Options as for :func:`autotune`."""
    tk = autotune(space=space or {}, **options)(builder)
    return tk.tune(bench_args=bench_args, force=force, **args)


class TunedKernel:
    """A kernel builder with tuning axes and options (made by :func:`autotune`). See the module doc."""

    def __init__(self, fn, space: Space, options: dict):
        self.fn = fn
        self._mmaemit_builder = fn
        self.space = space
        self._explicit = dict(options)
        self.options = {**_DEFAULTS, **options}
        self.options["prune"] = tuple(self.options["prune"] or ())
        functools.update_wrapper(self, fn)
        self._signature = inspect.signature(fn)
        params = self._signature.parameters
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for name in space.names:
            if name not in params and not var_kw:
                raise ArgumentError(f"tuning axis {name!r} is not a parameter of {fn.__qualname__}; its parameters: "
                                    f"{choices(params)}")
            if name in params and params[name].kind is params[name].POSITIONAL_ONLY:
                raise ArgumentError(f"tuning axis {name!r} is a positional-only parameter of {fn.__qualname__}")
        self._key_signature = self._signature.replace(
            parameters=[p for p in params.values() if p.name not in space.names])
        self.name = self.options["name"] or f"{fn.__module__}.{fn.__qualname__}"
        self._source = None
        self._backend = None
        self._memo: dict = {}
        for what in ("inputs", "reference", "check"):  # called in worker processes: must be importable by name
            if self.options[what] is not None:
                FunctionRef.of(self.options[what], f"{what} function")

    # ------------------------------------------------------------------ composition
    def _stacked(self, space: Space, options: dict) -> "TunedKernel":
        merged = {**self._explicit, **options}
        merged["prune"] = tuple(options.get("prune", ())) + tuple(self._explicit.get("prune", ()))
        return TunedKernel(self.fn, space.merged(self.space), merged)

    def with_space(self, **axes) -> "TunedKernel":
        """The same builder and options with axes replaced or added (e.g. a wider sweep)."""
        new = {**self.space.axes, **axes}
        return TunedKernel(self.fn, Space(new), self._explicit)

    def with_options(self, **options) -> "TunedKernel":
        opts, axes = _split_options(options)
        if axes:
            raise ArgumentError(f"unknown option(s) {choices(axes)}; options: {choices(OPTIONS)}")
        return TunedKernel(self.fn, self.space, {**self._explicit, **opts})

    def __repr__(self) -> str:
        return f"<TunedKernel {self.name} {self.space!r}>"

    # ------------------------------------------------------------------ arguments and keys
    def bind(self, *args, **kwargs) -> dict:
        """The builder's non-tuned arguments as a dict (defaults applied)."""
        for name in self.space.names:
            if name in kwargs:
                raise ArgumentError(f"{name!r} is tuned by {self.name}; do not pass it (use with_space({name}=[...]) "
                                    f"to restrict its values)")
        try:
            bound = self._key_signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"{self.name}{self._key_signature}: {e}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def key(self, *args, **kwargs) -> dict:
        """The table key of these builder arguments."""
        return self._key_of(self.bind(*args, **kwargs))

    def _key_of(self, bound: dict) -> dict:
        k = self.options["key"]
        if k is None:
            out = dict(bound)
        elif callable(k):
            out = dict(k(dict(bound)))
        else:
            names = [k] if isinstance(k, str) else list(k)
            missing = [n for n in names if n not in bound]
            if missing:
                raise ArgumentError(f"key names {missing} are not arguments of {self.name}: {choices(bound)}")
            out = {n: bound[n] for n in names}
        jsonable(out)
        return out

    def candidates(self, *args, **kwargs) -> list:
        """``[(params, None | prune reason)]`` for these builder arguments, in enumeration order."""
        return self._candidates(self.bind(*args, **kwargs))

    def _candidates(self, bound: dict) -> list:
        out = []
        for params in self.space.product(bound):
            reason = None
            for prune in self.options["prune"]:
                verdict = prune(dict(params), dict(bound))
                if verdict is False or isinstance(verdict, str):
                    reason = verdict if isinstance(verdict, str) else f"rejected by {prune.__qualname__}"
                    break
            out.append((params, reason))
        return out

    def default_params(self, *args, **kwargs) -> dict:
        return self._default(self.bind(*args, **kwargs))

    def _default(self, bound: dict) -> dict:
        d = self.options["default"]
        if callable(d):
            d = d(dict(bound))
        values = self.space.values(bound)
        if d is None:
            for params, reason in self._candidates(bound):
                if reason is None:
                    return params
            return {n: v[0] for n, v in values.items()}
        unknown = [n for n in d if n not in values]
        if unknown:
            raise ArgumentError(f"default parameters {unknown} are not tuning axes of {self.name}: "
                                f"{choices(values)}")
        return {n: d[n] if n in d else v[0] for n, v in values.items()}

    def source_hash(self) -> str:
        if self._source is None:
            self._source = source_hash(self.fn, tuple(self.options["depends"]))
        return self._source

    def backend(self):
        if self._backend is None:
            b = self.options["backend"]
            if b is None:
                from .backend import CudaBackend

                b = CudaBackend()
            self._backend = b.bind()
        return self._backend

    # ------------------------------------------------------------------ lookup and tuning
    def _entry(self, bound: dict):
        backend = self.backend()
        key = self._key_of(bound)
        cands = self._candidates(bound)
        space_hash = digest([p for p, _ in cands])
        device = backend.fingerprint()
        ekey = entry_key(self.name, self.source_hash(), space_hash, key, device)
        return key, cands, space_hash, device, ekey

    def lookup(self, *args, **kwargs):
        """The stored :class:`TuneResult` for these arguments, or None (never tunes)."""
        bound = self.bind(*args, **kwargs)
        key, cands, _, _, ekey = self._entry(bound)
        return self._from_table(TuningTable(self.name), ekey, key, cands)

    def _from_table(self, table, ekey, key, cands):
        entry = table.get(ekey)
        if not entry:
            return None
        by_json = {canonical_json(p): p for p, reason in cands if reason is None}
        winner = by_json.get(canonical_json(entry.get("winner")))
        if winner is None:  # an entry whose winner is no longer a candidate: a miss
            return None
        return TuneResult(self.name, key, winner, entry.get("time_s"),
                          [CandidateResult.from_json(c) for c in entry.get("candidates", [])], "table", ekey,
                          entry.get("tuning_s", 0.0), entry.get("date", ""))

    def tune(self, *args, bench_args=None, force: bool = False, **kwargs) -> TuneResult:
        """The :class:`TuneResult` for these builder arguments: from the table on a hit (unless ``force`` or
        ``MMAEMIT_AUTOTUNE=force``), else tuned now and stored. ``MMAEMIT_AUTOTUNE=0``: the defaults, untimed."""
        return self._resolve(self.bind(*args, **kwargs), bench_args, "force" if force else autotune_mode())

    def best(self, *args, bench_args=None, **kwargs) -> dict:
        """The winning parameters for these builder arguments (see :meth:`tune`)."""
        return self.tune(*args, bench_args=bench_args, **kwargs).winner

    def __call__(self, *args, bench_args=None, **kwargs):
        """The compiled winner for these builder arguments (memoised per process)."""
        bound = self.bind(*args, **kwargs)
        mode = autotune_mode()
        memo_key = (mode, canonical_json(bound))
        kernel = self._memo.get(memo_key)
        if kernel is None:
            result = self._resolve(bound, bench_args, mode)
            kernel = self.backend().load(self.fn, dict(bound), dict(result.winner))
            self._memo[memo_key] = kernel
        return kernel

    def _resolve(self, bound: dict, bench_args, mode: str) -> TuneResult:
        if mode == "off":
            return TuneResult(self.name, self._key_of(bound), self._default(bound), None, [], "default")
        key, cands, space_hash, device, ekey = self._entry(bound)
        table = TuningTable(self.name)
        if mode == "on":
            hit = self._from_table(table, ekey, key, cands)
            if hit is not None:
                return hit
        with table.tuning_lock(ekey):
            if mode == "on":  # another process may have tuned this entry while we waited for the lock
                hit = self._from_table(table, ekey, key, cands)
                if hit is not None:
                    return hit
            result = _run_tuning(self, bound, key, cands, bench_args, ekey)
            table.put(ekey, result.to_entry(device, self.source_hash(), space_hash))
        return result


_RUN_IDS = iter(range(1, 1 << 62))


def _default_workers() -> int:
    env = os.environ.get("MMAEMIT_AUTOTUNE_WORKERS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ArgumentError(f"MMAEMIT_AUTOTUNE_WORKERS={env!r} must be a positive integer") from None
    return os.cpu_count() or 1


def _skip_status(phase: str, status: str, value) -> tuple:
    if status == "timeout":
        return f"{phase}-timeout", None
    if status == "died":
        return f"{phase}-error", str(value)
    if phase == "compile" and value.get("mmaemit_error"):
        return "invalid", value["message"]
    return f"{phase}-error", f"{value['type'].rsplit('.', 1)[-1]}: {value['message']}"


def _run_tuning(tk: TunedKernel, bound: dict, key: dict, cands: list, bench_args, ekey: str) -> TuneResult:
    opts = tk.options
    backend = tk.backend()
    if opts["reference"] is None:
        raise ArgumentError(f"{tk.name}: tuning needs reference=(args, arguments) -> expected output(s): every "
                            f"candidate is checked against it before it may win")
    if bench_args is None and opts["inputs"] is None:
        raise ArgumentError(f"{tk.name}: tuning needs the kernel's arguments: pass bench_args=(...) or give the "
                            f"builder inputs=(args) -> arguments")
    builder_ref = FunctionRef.of(tk.fn, "kernel builder")
    inputs_ref = None if opts["inputs"] is None else FunctionRef.of(opts["inputs"], "inputs function")
    reference_ref = FunctionRef.of(opts["reference"], "reference function")
    check_ref = None if opts["check"] is None else FunctionRef.of(opts["check"], "check function")
    outputs = tuple(opts["outputs"]) if isinstance(opts["outputs"], (tuple, list)) else (opts["outputs"],)
    t0 = time.perf_counter()
    results = [CandidateResult(params=p) for p, _ in cands]
    progress_opt = opts["progress"]
    prog = Progress(len(cands), f"autotune {tk.name.rsplit('.', 1)[-1]} {_key_text(key)}"[:60],
                    enabled=bool(progress_opt), file=None if isinstance(progress_opt, bool) else progress_opt)

    def skip(i, status, reason):
        results[i].status, results[i].reason = status, reason or ""
        prog.on_skipped()

    valid = []
    for i, (_, reason) in enumerate(cands):
        if reason is not None:
            skip(i, "pruned", reason)
        else:
            valid.append(i)
    if not valid:
        prog.close()
        raise TuningError(f"{tk.name} {_key_text(key)}: every candidate was pruned:\n"
                          + "\n".join(f"  {_params_text(r.params)}: {r.reason}" for r in results))
    run = next(_RUN_IDS)
    workers = min(len(valid), opts["workers"] or _default_workers())
    cpool = shared_pool("compile", workers, backend.preload)
    bpool = shared_pool("bench", 1, backend.preload)
    bpool.cancel_pending()  # anything still queued belongs to an earlier, finished or aborted run
    bpool.set_setup(tasks.bench_setup, (backend, dict(bound), None if bench_args is None else tuple(bench_args),
                                        inputs_ref, reference_ref, outputs, check_ref, float(opts["rtol"]),
                                        tasks.mmaemit_environment()),
                    timeout=opts["setup_timeout"])
    for i in valid:
        cpool.submit((run, "compile", i), tasks.compile_candidate,
                     (backend, builder_ref, dict(bound), cands[i][0], tasks.mmaemit_environment()),
                     timeout=opts["compile_timeout"])
    compiles_out, checks_out, times_out = len(valid), 0, 0
    timing_started = confirming = False
    setup_error = None
    mine = lambda tag: isinstance(tag, tuple) and tag[0] == run  # noqa: E731
    try:
        while True:
            if not timing_started and compiles_out == 0 and checks_out == 0:
                timing_started = True  # every compile and check is done: time with the CPU otherwise idle
                for i in valid:
                    if results[i].status == "checked":
                        times_out += 1
                        bpool.submit((run, "time", i), tasks.time_candidate, (builder_ref, cands[i][0]),
                                     timeout=opts["run_timeout"])
            if timing_started and times_out == 0:
                top = sorted((i for i in valid if results[i].status == "timed"), key=lambda i: results[i].time_s)
                top = top[:int(opts["confirm"] or 0)]
                if confirming or len(top) < 2:
                    break
                confirming = True
                for i in reversed(top):
                    times_out += 1
                    bpool.submit((run, "retime", i), tasks.time_candidate, (builder_ref, cands[i][0]),
                                 timeout=opts["run_timeout"])
                continue
            got = wait_any([cpool, bpool], None)
            if not got and not cpool.busy() and not bpool.busy():
                raise TuningError(f"{tk.name}: the worker pools went idle with results outstanding")
            for r in got:
                if r.tag == SETUP:
                    if r.status != "ok":
                        if r.status == "timeout":
                            setup_error = f"timed out after {r.seconds:.0f} s (setup_timeout)"
                        elif isinstance(r.value, dict):
                            setup_error = r.value["message"] + ("\n" + r.value["traceback"]
                                                                if r.value.get("traceback") else "")
                        else:
                            setup_error = str(r.value)
                    continue
                if not mine(r.tag) or r.tag[1] == "teardown":
                    continue  # a late result of an earlier, aborted run
                _, phase, i = r.tag
                res = results[i]
                if phase == "compile":
                    compiles_out -= 1
                    if r.status == "ok":
                        res.compile_s = r.value["seconds"]
                        res.info = dict(r.value["info"])
                        if r.value["warnings"]:
                            res.info["warnings"] = r.value["warnings"]
                        prog.on_compiled()
                        checks_out += 1
                        bpool.submit((run, "check", i), tasks.check_candidate, (builder_ref, cands[i][0]),
                                     timeout=opts["run_timeout"])
                    else:
                        status, reason = _skip_status("compile", r.status, r.value)
                        skip(i, status, reason or f"no result after {opts['compile_timeout']:g} s (compile_timeout)")
                    continue
                if phase == "check":
                    checks_out -= 1
                else:
                    times_out -= 1
                if phase == "retime" and r.status == "ok" and r.value["correct"]:
                    res.info["times_s"] = [res.time_s, r.value["time_s"]]
                    res.time_s = min(res.time_s, r.value["time_s"])
                    continue
                if phase == "retime":  # it ran once and now fails or hangs: not a winner
                    status, reason = (("wrong", r.value["reason"]) if r.status == "ok"
                                      else _skip_status("run", r.status, r.value))
                    res.status, res.reason = status, f"second timing run: {reason or 'run_timeout'}"
                    prog.timed_then_skipped()
                    continue
                if r.status == "ok" and r.value["correct"]:
                    if phase == "check":
                        res.status = "checked"
                    else:
                        res.status, res.time_s = "timed", r.value["time_s"]
                        prog.on_timed()
                elif r.status == "ok":
                    skip(i, "wrong", r.value["reason"])
                else:
                    status, reason = _skip_status("run", r.status, r.value)
                    skip(i, status, reason or f"no result after {opts['run_timeout']:g} s (run_timeout): the "
                                              f"benchmark process was killed")
            if setup_error is not None:
                break
    finally:
        cpool.cancel_pending(mine)
        bpool.cancel_pending(mine)
        bpool.clear_setup()
        prog.close()
    # free the benchmark worker's inputs and outputs (GPU memory the caller needs) before returning
    bpool.submit((run, "teardown", None), tasks.bench_teardown, (), timeout=60)
    deadline = time.monotonic() + 70
    while bpool.busy() and time.monotonic() < deadline:
        if any(r.tag == (run, "teardown", None) for r in wait_any([bpool], 5.0)):
            break
    if setup_error is not None:
        raise TuningError(f"{tk.name} {_key_text(key)}: the benchmark setup (inputs and reference outputs) failed: "
                          f"{setup_error}")
    timed = [r for r in results if r.status == "timed"]
    wall = time.perf_counter() - t0
    if not timed:
        raise TuningError(f"{tk.name} {_key_text(key)}: no candidate was compiled, checked and timed:\n"
                          + "\n".join(f"  {r.status}: {_params_text(r.params)}: {r.reason}" for r in results))
    best = min(timed, key=lambda r: r.time_s)
    result = TuneResult(tk.name, key, best.params, best.time_s, results, "tuned", ekey, wall,
                        datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if progress_opt:
        skipped = result.skipped
        msg = (f"autotune {tk.name.rsplit('.', 1)[-1]}: winner {_params_text(best.params)} "
               f"{best.time_s * 1e6:.1f} us; {len(timed)} timed, {len(skipped)} skipped in {wall:.1f} s")
        for c in skipped:
            msg += f"\n  skipped ({c.status}) {_params_text(c.params)}: {_first_line(c.reason, 200)}"
        print(msg, file=prog.file, flush=True)
    return result
