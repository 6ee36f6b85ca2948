"""Worker processes for tuning: candidates compile in parallel, benchmarks run in isolation, hung tasks are killed.

Why processes, and why this pool rather than ``concurrent.futures``: compiling a TIR kernel holds the GIL in TVM's
Python passes (threads do not run in parallel), and a task that hangs (ptxas looping on a pathological kernel, a GPU
kernel that deadlocks on a barrier) can only be stopped by killing its process. ``ProcessPoolExecutor`` cannot kill
one worker; here every worker is a ``spawn`` process in its own session (process group), each task has a deadline,
and a worker past its deadline is killed with its whole process group (nvcc / ptxas children included) and replaced
by a fresh one before the next task. A GPU context dies with its process, so a hung kernel never runs into the next
measurement.

Workers import ``preload`` (TVM, torch: 1-3 s) once when they start and are reused across tuning runs
(:func:`shared_pool`). A pool may carry a *setup* task (e.g. the benchmark inputs and the reference output) that
every new worker runs before its first task, so a replacement worker is ready for the remaining candidates.

Tasks are ``(fn, args)`` with ``fn`` a module-level function or a :class:`FunctionRef` (pickled by name, resolved in
the worker); results come back as :class:`TaskResult`. Workers never import the parent's ``__main__`` at start (a
script without an ``if __name__ == "__main__"`` guard would run again in every worker); a :class:`FunctionRef` to a
function of ``__main__`` loads that script by path in the worker, on first use, as ``__mp_main__`` (what
``multiprocessing`` itself does).
"""
from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import connection

from ..errors import ArgumentError

__all__ = ["FunctionRef", "TaskResult", "WorkerPool", "wait_any", "shared_pool", "shutdown_shared_pools", "SETUP"]

#: the tag of a worker's setup task in results
SETUP = "__setup__"
_START_TIMEOUT = 600.0


@dataclass(frozen=True)
class FunctionRef:
    """A module-level function named by module and qualified name (picklable, resolved in the worker)."""

    module: str
    qualname: str
    main_path: str | None = None

    @classmethod
    def of(cls, fn, what: str = "function") -> "FunctionRef":
        """Reference ``fn``; ``ArgumentError`` for lambdas, closures and functions no process can import."""
        if isinstance(fn, FunctionRef):
            return fn
        target = getattr(fn, "_mmaemit_builder", fn)
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", None)
        if not module or not qualname or "<lambda>" in qualname or "<locals>" in qualname:
            raise ArgumentError(f"the {what} {fn!r} must be a module-level function: tuning calls it in worker "
                                f"processes, which import it by name (lambdas and nested functions cannot be)")
        main_path = None
        if module == "__main__":
            main_path = getattr(sys.modules["__main__"], "__file__", None)
            if not main_path:
                raise ArgumentError(f"the {what} {qualname} is defined in an interactive session; tuning workers "
                                    f"import it by name, so define it in a module (a .py file)")
            main_path = os.path.abspath(main_path)
        return cls(module, qualname, main_path)

    def resolve(self):
        if self.module == "__main__":
            mod = _main_module(self.main_path)
        else:
            mod = importlib.import_module(self.module)
        obj = mod
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return getattr(obj, "_mmaemit_builder", obj)  # a decorated builder's name holds its TunedKernel

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.module}.{self.qualname}"


_MAIN_CACHE: dict = {}


def _main_module(path):
    """The parent's ``__main__`` script, run once in this process as ``__mp_main__`` (as multiprocessing does)."""
    import runpy
    import types

    if __name__ == "__main__" or path is None:
        return sys.modules["__main__"]
    mod = sys.modules.get("__main__")
    if mod is not None and os.path.abspath(getattr(mod, "__file__", "") or "") == path:
        return mod
    if path not in _MAIN_CACHE:
        ns = runpy.run_path(path, run_name="__mp_main__")
        module = types.ModuleType("__mp_main__")
        module.__dict__.update(ns)
        sys.modules.setdefault("__mp_main__", module)
        _MAIN_CACHE[path] = module
    return _MAIN_CACHE[path]


@dataclass
class TaskResult:
    """``status``: "ok" (``value`` is the return value), "error" (``value`` describes the exception: a dict with
    ``type``, ``mmaemit_error``, ``message``, ``traceback``), "timeout" (the worker was killed after ``seconds``) or
    "died" (the worker process ended; ``value`` says how)."""

    tag: object
    status: str
    value: object
    seconds: float


def describe_exception(e: BaseException) -> dict:
    from ..errors import MmaemitError

    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return {"type": f"{type(e).__module__}.{type(e).__qualname__}", "mmaemit_error": isinstance(e, MmaemitError),
            "message": str(e) or type(e).__name__, "traceback": "".join(tb)[-4000:]}


def _worker_main(conn, preload, quiet):
    try:
        os.setsid()  # own process group: a kill on timeout takes nvcc / ptxas children with it
    except OSError:
        pass
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    error = None
    for name in preload:
        try:
            importlib.import_module(name)
        except BaseException as e:  # reported to the parent, which fails the tasks with this text
            error = describe_exception(e)
            break
    conn.send(("ready", os.getpid(), error))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        tag, fn, args = msg
        t0 = time.perf_counter()
        try:
            out = (tag, "ok", fn(*args), time.perf_counter() - t0)
        except BaseException as e:  # every failure goes back to the parent as text, the worker lives on
            out = (tag, "error", describe_exception(e), time.perf_counter() - t0)
            if getattr(e, "fatal_to_worker", False):  # e.g. a CUDA context left unusable by a faulting kernel
                conn.send(out)
                os._exit(3)
        try:
            conn.send(out)
        except Exception as e:  # an unpicklable result
            conn.send((tag, "error", describe_exception(e), time.perf_counter() - t0))


_START_LOCK = threading.Lock()


def _start_without_main(proc) -> None:
    """``proc.start()`` with the spawn preparation data stripped of the parent's ``__main__`` (see the module doc)."""
    from multiprocessing import spawn

    with _START_LOCK:
        original = spawn.get_preparation_data

        def prep(name):
            data = original(name)
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
            return data

        spawn.get_preparation_data = prep
        try:
            proc.start()
        finally:
            spawn.get_preparation_data = original


class _Worker:
    def __init__(self, ctx, preload, quiet):
        import torch.multiprocessing  # noqa: F401  (registers the tensor reductions used when args are sent)

        parent, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, tuple(preload), quiet), daemon=True)
        _start_without_main(self.proc)
        child.close()
        self.conn = parent
        self.started = time.monotonic()
        self.ready = False
        self.setup_done = False
        self.task = None          # (tag, deadline or None, t_sent)
        self.dead = False

    def send(self, tag, fn, args, timeout):
        now = time.monotonic()
        self.task = (tag, None if timeout is None else now + timeout, now)
        self.conn.send((tag, fn, args))

    def kill(self):
        self.dead = True
        pid = self.proc.pid
        if pid is not None:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (OSError, ProcessLookupError):
                    pass
        self.proc.join(10)
        try:
            self.conn.close()
        except OSError:
            pass

    def stop(self):
        if self.dead:
            return
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.kill()
        self.dead = True


class WorkerPool:
    """Up to ``size`` spawn processes that import ``preload`` once; tasks with per-task timeouts (see module doc)."""

    def __init__(self, size: int, preload=(), quiet: bool | None = None, start_timeout: float = _START_TIMEOUT):
        if size < 1:
            raise ArgumentError(f"a worker pool needs at least one worker, got size={size}")
        self.size = size
        self.preload = tuple(preload)
        # workers' stdout / stderr go to /dev/null (failures come back as results) unless MMAEMIT_AUTOTUNE_DEBUG=1
        self.quiet = (os.environ.get("MMAEMIT_AUTOTUNE_DEBUG", "0") in ("", "0")) if quiet is None else quiet
        self.start_timeout = start_timeout
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list = []
        self._pending: list = []  # (tag, fn, args, timeout)
        self._setup = None        # (fn, args, timeout)
        self._fatal = None        # a preload / setup failure: every task fails with it
        self._orphans: list = []  # results of tasks that failed before reaching a worker
        self.started_workers = 0  # processes started over the pool's life (tests read it)

    # ------------------------------------------------------------------ submitting
    def submit(self, tag, fn, args=(), timeout: float | None = None) -> None:
        if self._fatal is not None:
            err = {"type": "WorkerPoolError", "mmaemit_error": False, "message": self._fatal, "traceback": ""}
            self._orphans.append(TaskResult(tag, "error", err, 0.0))
            return
        self._pending.append((tag, fn, tuple(args), timeout))
        self._spawn_for_demand()

    def cancel_pending(self, predicate=None) -> int:
        """Drop queued tasks (those whose tag satisfies ``predicate``; all without one); running ones finish."""
        keep = [t for t in self._pending if predicate is not None and not predicate(t[0])]
        dropped = len(self._pending) - len(keep)
        self._pending = keep
        return dropped

    def set_setup(self, fn, args=(), timeout: float | None = None) -> None:
        """Every worker runs ``fn(*args)`` before its next task (now-running workers too); result tag ``SETUP``."""
        self._setup = (fn, tuple(args), timeout)
        self._fatal = None
        for w in self._workers:
            w.setup_done = False
        self._spawn_for_demand(at_least=1)

    def clear_setup(self) -> None:
        self._setup = None
        self._fatal = None

    def busy(self) -> bool:
        return bool(self._pending) or any(w.task is not None for w in self._workers if not w.dead)

    def idle_workers(self) -> int:
        return sum(1 for w in self._workers if not w.dead and w.task is None)

    def _spawn_for_demand(self, at_least: int = 0) -> None:
        self._workers = [w for w in self._workers if not w.dead]
        if self._fatal is not None:
            return
        free = sum(1 for w in self._workers if w.task is None)
        want = min(self.size, max(at_least, len(self._workers) - free + len(self._pending)))
        while len(self._workers) < want:
            self._workers.append(_Worker(self._ctx, self.preload, self.quiet))
            self.started_workers += 1

    # ------------------------------------------------------------------ progress
    def connections(self) -> list:
        return [w.conn for w in self._workers if not w.dead]

    def next_deadline(self):
        ds = []
        for w in self._workers:
            if w.dead:
                continue
            if w.task is not None and w.task[1] is not None:
                ds.append(w.task[1])
            elif not w.ready:
                ds.append(w.started + self.start_timeout)
        return min(ds) if ds else None

    def poll(self, timeout: float | None = 0.0) -> list:
        """Results that arrive within ``timeout`` seconds (None: until at least one, if any task is outstanding)."""
        return wait_any([self], timeout)

    def _step(self, ready) -> list:
        out = []
        now = time.monotonic()
        for w in list(self._workers):
            if w.dead:
                continue
            if w.conn in ready:
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    out.extend(self._lost(w, "died", f"the worker process ended (exit code {w.proc.exitcode})"))
                    continue
                if msg[0] == "ready" and not w.ready:
                    w.ready = True
                    if msg[2] is not None:
                        self._fatal = f"a worker failed to import {self.preload}: {msg[2]['message']}"
                        w.kill()
                        out.extend(self._fail_pending(self._fatal))
                    continue
                tag, status, value, seconds = msg
                w.task = None
                if tag == SETUP:
                    if status == "ok":
                        w.setup_done = True
                    else:
                        self._fatal = f"setup failed: {value['message']}"
                        out.extend(self._fail_pending(self._fatal))
                out.append(TaskResult(tag, status, value, seconds))
            elif w.task is not None and w.task[1] is not None and now > w.task[1]:
                out.extend(self._lost(w, "timeout", None))
            elif not w.ready and now > w.started + self.start_timeout:
                self._fatal = f"a worker did not start within {self.start_timeout:.0f} s"
                w.kill()
                out.extend(self._fail_pending(self._fatal))
        self._dispatch()
        return out

    def _lost(self, w, status, value) -> list:
        task = w.task
        w.kill()
        if task is None:
            return []
        tag, _, t_sent = task
        seconds = time.monotonic() - t_sent
        if tag == SETUP:
            self._fatal = f"setup {'timed out' if status == 'timeout' else 'worker died'} after {seconds:.1f} s"
            return [TaskResult(SETUP, status, value, seconds)] + self._fail_pending(self._fatal)
        return [TaskResult(tag, status, value, seconds)]

    def _fail_pending(self, message) -> list:
        err = {"type": "WorkerPoolError", "mmaemit_error": False, "message": message, "traceback": ""}
        out = [TaskResult(tag, "error", err, 0.0) for tag, _, _, _ in self._pending]
        self._pending.clear()
        return out

    def _dispatch(self) -> None:
        self._spawn_for_demand()
        for w in self._workers:
            if w.dead or not w.ready or w.task is not None:
                continue
            if self._setup is not None and not w.setup_done:
                fn, args, timeout = self._setup
                w.send(SETUP, fn, args, timeout)
                continue
            if not self._pending:
                continue
            tag, fn, args, timeout = self._pending.pop(0)
            try:
                w.send(tag, fn, args, timeout)  # pickles first, so a failure writes nothing to the pipe
            except Exception as e:  # an argument that does not pickle: that task fails, the worker is fine
                w.task = None
                self._orphans.append(TaskResult(tag, "error", describe_exception(e), 0.0))

    def take_orphans(self) -> list:
        out, self._orphans = self._orphans, []
        return out

    # ------------------------------------------------------------------ lifetime
    def shutdown(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers = []
        self._pending = []


def wait_any(pools, timeout: float | None) -> list:
    """Wait until any pool has results (or ``timeout`` seconds; None = until something happens) and return them."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        results = []
        for p in pools:
            p._dispatch()
            results.extend(p.take_orphans())
        conns, deadlines = [], []
        for p in pools:
            conns.extend(p.connections())
            d = p.next_deadline()
            if d is not None:
                deadlines.append(d)
        now = time.monotonic()
        limits = [d - now for d in deadlines] + ([end - now] if end is not None else [])
        limit = max(0.0, min(limits)) + 0.01 if limits else None
        if results:
            ready = connection.wait(conns, 0) if conns else []
        elif conns:
            ready = connection.wait(conns, limit)
        elif not any(p.busy() for p in pools):
            return []
        else:
            time.sleep(0.01)
            ready = []
        for p in pools:
            results.extend(p._step(ready))
        if results or (end is not None and time.monotonic() >= end):
            return results


_SHARED: dict = {}


def shared_pool(kind: str, size: int, preload=()) -> WorkerPool:
    """The process-wide pool for ``kind`` (e.g. "compile", "bench") and ``preload``, grown to ``size`` workers."""
    key = (kind, tuple(preload))
    pool = _SHARED.get(key)
    if pool is None:
        pool = _SHARED[key] = WorkerPool(size, preload)
    elif pool.size < size:
        pool.size = size
    return pool


def shutdown_shared_pools() -> None:
    for pool in _SHARED.values():
        pool.shutdown()
    _SHARED.clear()


atexit.register(shutdown_shared_pools)
