"""The machine: one CTA's state, the diagnostics recorder, barriers, and running a compiled kernel CTA by CTA.

Execution model. The threads of a CTA run in lockstep, vectorized with numpy: a per-thread value is an array of
shape (T,) (T = threads per CTA), a uniform value is a scalar, a TIR vector value adds a trailing lane axis. Control
flow that differs between threads runs under a boolean activity mask (divergence); warp-collective instructions
(``ldmatrix``, ``stmatrix``, ``mma``, ``shfl``) execute per warp on the warps whose 32 lanes are all active and
report a divergence error for partially active warps; ``bar.sync``/``__syncthreads`` must be reached by every
thread. Because every warp reaches a barrier before any proceeds past it, executing the warps in lockstep between
barriers is one legal schedule; races are detected from vector clocks (memory.py), not from the schedule.

Kernels that wait on each other inside the CTA (``mbarrier`` waits, named barriers with a thread count, ``bar.arrive``,
``setmaxnreg``: warp-specialized pipelines) cannot run in one lockstep pass: a producer warpgroup's loop blocks on an
"empty" barrier that only the consumers, still waiting in the other branch, would release. Those kernels run as
contexts (``Context``): one per warpgroup when the kernel has warpgroup-collective instructions (wgmma, setmaxnreg),
else one per warp. Each context executes the whole kernel body for its threads (its own mask, loop stack, variables
and register buffers; shared memory, mbarriers and the async units are the CTA's), in its own Python thread, and the
``Scheduler`` runs exactly one context at a time: a context runs until it blocks (a wait whose condition does not
hold yet), then the next runnable context in round-robin order runs. When no context can run and some have not
finished, the CTA has deadlocked: the blocked waits are reported (barrier, phase, arrival / transaction counts and the
waiting warps). Warps of one context stay in lockstep, so a kernel in which two warps of the same warpgroup wait on
each other is reported as a deadlock.

Shared memory: static allocations at their ``align`` (``alignas`` in the generated CUDA), then the dynamic pool at
the largest ``align=`` of its views (at least 128): shared-window addresses are byte offsets from the CTA's shared
base, which is taken as 1024-byte aligned, so address-bit swizzles (wgmma descriptors) see the GPU's bits.

Registers (``local`` buffers) are arrays (size, T); shared memory is one byte array per CTA; global buffers alias
the caller's arrays, so outputs are written in place. How the kernel's statements become closures over this state
is ``compiler``; what the instructions do is ``mmaemit.ptx``, bound to this state by ``ptx_exec`` / ``wgmma_exec``.
"""
from __future__ import annotations

import threading

import numpy as np

from ..errors import UnsupportedConfigError
from ..layouts import banks as layout_banks
from .diagnostics import ERROR_KINDS, BankConflictStat, Diagnostic
from .memory import SHARED_RID, SharedMemory

__all__ = ["Site", "CpAsyncQueue", "CTAState", "Recorder", "Context", "Scheduler", "NamedBarriers", "cta_barrier",
           "named_barrier", "block", "run_launch", "CONTEXT_WARPS"]


class Site:
    """A statement of the lowered kernel: where a diagnostic points."""

    __slots__ = ("stmt", "kernel", "_text")

    def __init__(self, stmt, kernel):
        self.stmt = stmt
        self.kernel = kernel
        self._text = None

    def text(self) -> str:
        if self._text is None:
            self._text = _stmt_text(self.stmt)
        return f"{self.kernel}: {self._text}"


def _stmt_text(stmt) -> str:
    from tvm import tirx

    try:
        if isinstance(stmt, tirx.For):
            head = f"for {stmt.loop_var} in range({stmt.min}, {stmt.min} + {stmt.extent}): ..."
        elif isinstance(stmt, tirx.IfThenElse):
            head = f"if {stmt.condition}: ..."
        elif isinstance(stmt, tirx.While):
            head = f"while {stmt.condition}: ..."
        else:
            # the printer declares free buffers/vars first; the statement itself is the last line
            lines = [ln.strip() for ln in stmt.script().splitlines()
                     if ln.strip() and not ln.lstrip().startswith("#")]
            head = lines[-1] if lines else type(stmt).__name__
    except Exception:  # printing is best effort; never hide the real diagnostic
        head = type(stmt).__name__
    return head if len(head) <= 400 else head[:397] + "..."


class CpAsyncQueue:
    """Per-thread cp.async groups of one CTA: data is read at issue and lands in shared memory at the wait."""

    def __init__(self, T):
        self.committed = np.zeros(T, np.int64)
        self.ops = []      # dicts: thr, group, dst (N,), data (N, size), size, site


class CTAState:
    """The run-time state one context of a CTA sees: slot values (``env``), buffer bindings (``bufs``), the activity
    ``mask``, thread indices and the loop stack are the context's; shared memory, the cp.async queue, wgmma state
    (``wg``), mbarriers (``mb``), TMA stores in flight (``bulk``), register budgets (``regs``), named barriers
    (``bars``), the scheduler (``sched``, None when the CTA runs as one context) and the recorder (``rec``) are the
    CTA's."""

    __slots__ = ("env", "bufs", "mask", "T", "W", "tid", "warp_of", "lane_of", "cta", "loops", "smem", "regions", "cp",
                 "rec", "axes", "tid2d", "wg", "mb", "bulk", "regs", "bars", "sched", "ctx", "units")

    def fork(self, ctx):
        """The state of context ``ctx``: shares the CTA's units, copies the variables, owns its mask and loops."""
        st = CTAState()
        for name in CTAState.__slots__:
            setattr(st, name, getattr(self, name, None))
        st.env = list(self.env)
        st.bufs = list(self.bufs)
        st.loops = []
        st.mask = ctx.mask
        st.ctx = ctx
        return st


class Recorder:
    """Collects diagnostics and bank-conflict stats; raises on the first error in ``on_error="raise"`` mode."""

    def __init__(self, report, on_error):
        self.report = report
        self.raise_errors = on_error == "raise"
        self.seen = {}
        self.banks = {}
        self.bank_memo = {}
        self.counts = {}

    def fault(self, st, kind, site, message, thread=None, buffer=None, index=None, detail=""):
        key = (kind, id(site))
        prev = self.seen.get(key)
        if prev is not None:
            prev.count += 1
            return
        loops = ", ".join(f"{n}={v}" for n, v in st.loops) if st.loops else ""
        loc = site.text() if site is not None else ""
        if loops:
            loc += f"  [{loops}]"
        d = Diagnostic(kind=kind, message=message, buffer=buffer, index=None if index is None else int(index),
                       thread=None if thread is None else int(thread),
                       warp=None if thread is None else int(thread) // 32,
                       lane=None if thread is None else int(thread) % 32, location=loc, cta=tuple(st.cta),
                       detail=detail)
        self.seen[key] = d
        self.report.diagnostics.append(d)
        if self.raise_errors and kind in ERROR_KINDS:
            raise ERROR_KINDS[kind](d, self.report)

    def count(self, name, n=1):
        self.counts[name] = self.counts.get(name, 0) + n

    def bank(self, st, site, op, byte_addr, access_bytes, act):
        """Record bank conflicts of one warp-wide shared access for every warp with an active lane.

        ``byte_addr``: (T,) start addresses, ``act``: (T,) bool or None (all active).
        """
        if access_bytes not in (1, 2, 4, 8, 16):
            return
        stat = self.banks.get(id(site))
        if stat is None:
            stat = BankConflictStat(op=op, location=site.text())
            self.banks[id(site)] = stat
        addr = np.broadcast_to(np.asarray(byte_addr, np.int64), (st.T,)).reshape(st.W, 32)
        aligned = (addr % access_bytes) == 0       # misaligned lanes were reported as errors; not a bank question
        act2 = aligned if act is None else (np.asarray(act).reshape(st.W, 32) & aligned)
        if act2.all():
            act2 = None
        for w in range(st.W):
            m = None if act2 is None else act2[w]
            if m is not None and not m.any():
                continue
            a = addr[w]
            base = (int(a.min()) // 128) * 128
            key = (access_bytes, (a - base).tobytes(), b"" if m is None or m.all() else m.tobytes())
            c = self.bank_memo.get(key)
            if c is None:
                lst = [int(x) - base if (m is None or m[i]) else None for i, x in enumerate(a)]
                c = layout_banks.bank_conflicts(lst, access_bytes)
                self.bank_memo[key] = c
            stat.executions += 1
            stat.conflicts += c
            stat.worst = max(stat.worst, c)


# ======================================================================================================================
# contexts and the scheduler
# ======================================================================================================================

#: warps per context: a warpgroup when the kernel has warpgroup-collective instructions, else a warp
CONTEXT_WARPS = {"warpgroup": 4, "warp": 1}


class _Abort(BaseException):
    """Unwinds a blocked context when the CTA is abandoned (deadlock reported, or another context failed)."""


class Context:
    """Warps executing the kernel in lockstep in their own Python thread (see the module docstring)."""

    def __init__(self, index, warps, T):
        self.index = index
        self.warps = list(warps)
        self.threads = (np.asarray(self.warps)[:, None] * 32 + np.arange(32)).reshape(-1)
        mask = np.zeros(T, bool)
        mask[self.threads] = True
        self.mask = None if mask.all() else mask
        self.state = "ready"          # ready | running | blocked | done
        self.wait = None              # (kind, ready(), describe(), site, st) while blocked
        self.sem = threading.Semaphore(0)
        self.error = None
        self.st = None

    def name(self) -> str:
        w = self.warps
        return f"warp {w[0]}" if len(w) == 1 else f"warps {w[0]}-{w[-1]}"


class Scheduler:
    """Runs a CTA's contexts one at a time, switching at blocking waits; detects deadlocks."""

    def __init__(self, contexts):
        self.contexts = contexts
        self.main = threading.Semaphore(0)
        self.aborting = False
        self.last = -1

    def live_threads(self) -> int:
        """Threads of the contexts that have not finished (a count-less CTA barrier waits for these)."""
        return sum(len(c.threads) for c in self.contexts if c.state != "done")

    def block(self, st, kind, ready, describe, site, barriers=()):
        """Called by a running context: wait until ``ready()`` holds, letting the other contexts run. ``barriers``:
        the mbarrier addresses the wait needs (the asynchronous units complete work for those first)."""
        if ready():
            return
        ctx = st.ctx
        ctx.wait = (kind, ready, describe, site, st, tuple(barriers))
        ctx.state = "blocked"
        self.main.release()
        ctx.sem.acquire()
        if self.aborting:
            raise _Abort()
        ctx.state = "running"
        ctx.wait = None

    def _thread_main(self, ctx, body):
        ctx.sem.acquire()
        try:
            if not self.aborting:
                with np.errstate(all="ignore"):
                    body(ctx.st)
        except _Abort:
            pass
        except BaseException as e:     # handed to the main thread, which re-raises it
            ctx.error = e
        finally:
            ctx.state = "done"
            self.main.release()

    def _resume(self, ctx):
        ctx.state = "running"
        ctx.sem.release()
        self.main.acquire()

    def _abort(self):
        self.aborting = True
        for c in self.contexts:
            if c.state != "done":
                c.sem.release()
                self.main.acquire()

    def run(self, body, rec):
        """Run ``body(st)`` for every context until all finish (or a deadlock / error ends the CTA)."""
        threads = [threading.Thread(target=self._thread_main, args=(c, body), daemon=True) for c in self.contexts]
        for t in threads:
            t.start()
        try:
            n = len(self.contexts)
            while True:
                runnable = [c for c in self.contexts
                            if c.state == "ready" or (c.state == "blocked" and c.wait[1]())]
                if not runnable and self._land():
                    continue
                if not runnable:
                    if all(c.state == "done" for c in self.contexts):
                        break
                    self._report_deadlock(rec)
                    break
                c = min(runnable, key=lambda x: (x.index - self.last - 1) % n)
                self.last = c.index
                self._resume(c)
                if c.error is not None:
                    raise c.error
        finally:
            if any(c.state != "done" for c in self.contexts):
                self._abort()
            for t in threads:
                t.join()

    def _land(self) -> bool:
        """Nothing can run: let an asynchronous unit complete work in flight (a TMA load lands), as late as possible.
        The waits of the context that ran last are served first, then the other blocked contexts' in round-robin
        order, then the oldest work in flight: a schedule in which copies land in any order and only when waited for,
        so a wait that passes on an old mbarrier phase reads shared memory the copy has not written yet."""
        n = len(self.contexts)
        order = sorted((c for c in self.contexts if c.state == "blocked"), key=lambda x: (x.index - self.last) % n)
        for c in order:
            if c.wait[5] and land_async(c.st, c.wait[5]):
                return True
        return bool(order) and land_async(order[0].st, None)

    def _report_deadlock(self, rec):
        blocked = [c for c in self.contexts if c.state == "blocked"]
        budget = [c for c in blocked if c.wait[0] == "setmaxnreg"]
        first = (budget or blocked)[0]
        _kind, _ready, describe, site, st = first.wait[:5]
        done = [c.name() for c in self.contexts if c.state == "done"]
        waits = "; ".join(f"{self._waiting(c)} wait{'s' if self._waiting(c).startswith('warp ') else ''} in "
                          f"{c.wait[2]()}" for c in blocked)
        tail = f" ({', '.join(done)} finished)" if done else ""
        if budget:
            others = "; ".join(f"{self._waiting(c)} in {c.wait[2]()}" for c in blocked if c is not first)
            rec.fault(st, "register_budget", site,
                      f"setmaxnreg can never be satisfied: {describe()}; no warpgroup releases registers with "
                      f"setmaxnreg.dec any more{tail}" + (f". Also blocked: {others}" if others else ""),
                      thread=int(first.threads[0]))
            return
        rec.fault(st, "deadlock", site, f"deadlock: no warp can make progress{tail}. {waits}",
                  thread=int(first.threads[0]))

    @staticmethod
    def _waiting(c):
        """The warps of blocked context ``c`` that execute its wait (the rest of the context idles in lockstep)."""
        m = c.wait[4].mask
        warps = c.warps if m is None else sorted({int(t) // 32 for t in np.nonzero(m)[0]})
        name = f"warp {warps[0]}" if len(warps) == 1 else f"warps {warps[0]}-{warps[-1]}"
        if len(warps) < len(c.warps):
            name += f" (the rest of {c.name()} idles in lockstep with it)"
        return name


def land_async(st, barriers=None) -> bool:
    """Complete one piece of asynchronous work in flight (the landers that units register in ``st.units["landers"]``,
    e.g. TMA loads): with ``barriers`` (mbarrier addresses) only work that signals one of them, else the oldest.
    False when there is no such work."""
    return any(lander(st, barriers) for lander in st.units.get("landers", ()))


def block(st, kind, ready, describe, site, barriers=()):
    """Wait until ``ready()`` holds. With one context nothing else can run but the asynchronous units: work in flight
    lands (what ``barriers`` needs first) until the wait holds; a wait that still does not hold is a deadlock, reported
    at once (and the kernel is abandoned by an error in raise mode)."""
    if st.sched is not None:
        st.sched.block(st, kind, ready, describe, site, barriers)
        return True
    while not ready():
        if not (barriers and land_async(st, barriers)) and not land_async(st, None):
            break
    if ready():
        return True
    st.rec.fault(st, "register_budget" if kind == "setmaxnreg" else "deadlock", site,
                 f"deadlock: the CTA's only context waits in {describe()}, which no other warp can complete",
                 thread=int(np.nonzero(st.mask)[0][0]) if st.mask is not None else 0)
    return False


# ======================================================================================================================
# barriers
# ======================================================================================================================

class NamedBarriers:
    """The CTA's 16 named barriers (``bar.sync`` / ``bar.arrive`` id, count; id 0 without a count is
    ``__syncthreads``). Arrivals count per warp (32 threads each)."""

    def __init__(self):
        self.state = {}

    def entry(self, bar_id):
        e = self.state.get(bar_id)
        if e is None:
            e = self.state[bar_id] = {"arrived": 0, "expected": None, "vc": None, "waiters": [], "gen": 0,
                                      "warps": []}
        return e


def _complete_barrier(st, e):
    clocks = st.smem.clocks
    for w in e["waiters"]:
        clocks.acquire(w, e["vc"])
    e.update(arrived=0, expected=None, vc=None, waiters=[], warps=[], gen=e["gen"] + 1)


def named_barrier(st, site, bar_id, count, what, wait=True):
    """``bar.sync`` (``wait``) / ``bar.arrive`` on named barrier ``bar_id`` expecting ``count`` threads (None: every
    live thread of the CTA). Releases the arriving warps' knowledge; waiters acquire everyone's at completion."""
    act = st.tid if st.mask is None else np.nonzero(st.mask)[0]
    if len(act) == 0:
        return
    m = np.zeros(st.T, bool)
    m[act] = True
    per_warp = m.reshape(st.W, 32)
    part = per_warp.any(axis=1) & ~per_warp.all(axis=1)
    if part.any():
        w = int(np.argmax(part))
        st.rec.fault(st, "divergence", site, f"{what} executed by {int(per_warp[w].sum())} of 32 lanes of warp {w}: "
                     f"barriers count whole warps", thread=w * 32 + int(np.argmin(per_warp[w])))
    warps = [int(w) for w in np.nonzero(per_warp.any(axis=1))[0]]
    if count is None and st.ctx is not None and st.mask is not None and not np.array_equal(st.mask, st.ctx.mask):
        n = int(st.mask.sum())
        st.rec.fault(st, "divergence", site, f"{what} reached by {n} of the {len(st.ctx.threads)} threads of "
                     f"{st.ctx.name()}: every thread of the CTA must reach the barrier (deadlock / undefined behaviour "
                     f"on the GPU)", thread=int(np.argmin(st.mask[st.ctx.threads]) + st.ctx.threads[0]))
        warps = list(st.ctx.warps)
    e = st.bars.entry(bar_id)
    clocks = st.smem.clocks
    for w in warps:
        snap = clocks.release(w)
        e["vc"] = snap if e["vc"] is None else np.maximum(clocks.widen(e["vc"]), clocks.widen(snap))
    e["arrived"] += 32 * len(warps)
    e["warps"] += warps
    if wait:
        e["waiters"] += warps
    if count is not None:
        e["expected"] = int(count)
    gen = e["gen"]
    st.rec.count("barriers")

    def expected():
        return e["expected"] if e["expected"] is not None else st.sched.live_threads()

    def ready():
        if e["gen"] > gen:
            return True
        if e["arrived"] >= expected():
            _complete_barrier(st, e)
            return True
        return False

    def describe():
        return (f"{what} (barrier {bar_id}): {e['arrived']} of {expected()} threads arrived "
                f"(warps {', '.join(map(str, e['warps']))})")
    if ready() or not wait:
        return
    block(st, "barrier", ready, describe, site)


def cta_barrier(st, site, what):
    """``__syncthreads`` / ``bar.sync 0``: every thread of the CTA."""
    if st.sched is not None:
        named_barrier(st, site, 0, None, what)
        return
    if st.mask is not None and not st.mask.all():
        n = int(st.mask.sum())
        st.rec.fault(st, "divergence", site, f"{what} reached by {n} of {st.T} threads: every thread of the CTA "
                     f"must reach the barrier (deadlock / undefined behaviour on the GPU)",
                     thread=int(np.argmin(st.mask)))
    st.smem.clocks.barrier(np.arange(st.W))
    st.rec.count("barriers")


# ======================================================================================================================
# running
# ======================================================================================================================

class _NoCTA:
    """Stand-in state for launch-level diagnostics (no CTA, no loops)."""

    loops = ()
    cta = ()


def run_launch(kp, args, dims, rec, regions, source_shared_names):
    """Execute every CTA of one kernel launch of ``kp`` (a ``compiler.KernelProgram``). ``args``: values for the
    device params (pointers as ints)."""
    bx, by, bz = dims.get("blockIdx.x", 1), dims.get("blockIdx.y", 1), dims.get("blockIdx.z", 1)
    tx, ty, tz = dims.get("threadIdx.x", 1), dims.get("threadIdx.y", 1), dims.get("threadIdx.z", 1)
    T = tx * ty * tz
    if T % 32:
        raise UnsupportedConfigError(f"{kp.name}: {T} threads per CTA is not a whole number of warps")
    W = T // 32
    dyn = int(dims.get("tirx.use_dyn_shared_memory", 0))
    # the dynamic pool follows the static allocations, aligned to the largest align= of its views (>= 128)
    dyn_offset = (kp.static_smem + kp.dyn_align - 1) // kp.dyn_align * kp.dyn_align
    smem_total = dyn_offset + dyn
    tid = np.arange(T, dtype=np.int32)
    axes = {"threadIdx.x": (tid % tx).astype(np.int32), "threadIdx.y": ((tid // tx) % ty).astype(np.int32),
            "threadIdx.z": (tid // (tx * ty)).astype(np.int32)}
    names = []
    for meta in kp.shared_allocs:
        if not meta.dyn:
            names.append((meta.alloc_offset, meta.alloc_offset + int(np.prod(meta.shape)) * meta.npdt.itemsize,
                          meta.name, tuple(meta.shape), meta.npdt))
    for start, end, name, shape, dt, alloc_name in source_shared_names:
        base = dyn_offset if alloc_name == "<dyn>" else next(
            (m.alloc_offset for m in kp.shared_allocs if m.name == alloc_name and not m.dyn), None)
        if base is not None:
            names.append((base + start, base + end, name, shape, dt))
    rec.count("launches")
    if kp.static_smem and kp.dyn_align > 128 and dyn:
        rec.fault(_NoCTA, "assumed_alignment", None,
                  f"{kp.name}: the interpreter places the dynamic shared pool {kp.dyn_align}-byte aligned (after "
                  f"{kp.static_smem} bytes of static shared memory) as its views ask, but the generated CUDA declares "
                  f"the pool with a smaller alignment: on the GPU it may start unaligned")
    concurrent = kp.needs_contexts(T)
    group = CONTEXT_WARPS["warpgroup" if kp.warpgroup_collective else "warp"]
    with np.errstate(all="ignore"):
        for z in range(bz):
            for y in range(by):
                for x in range(bx):
                    st = CTAState()
                    st.T, st.W = T, W
                    st.tid = tid
                    st.warp_of = tid // 32
                    st.lane_of = tid % 32
                    st.axes = axes
                    st.cta = (x, y, z)
                    st.env = [None] * kp.nslots
                    st.bufs = [None] * len(kp.bufs)
                    st.mask = None
                    st.loops = []
                    st.smem = SharedMemory(smem_total, names, W)
                    st.smem.dyn_offset = dyn_offset
                    st.regions = dict(regions)
                    st.regions[SHARED_RID] = st.smem
                    st.cp = CpAsyncQueue(T)
                    st.wg = st.mb = st.bulk = st.regs = st.sched = st.ctx = None
                    st.units = {}
                    st.bars = NamedBarriers()
                    st.rec = rec
                    for slot, a in zip(kp.param_slots, args):
                        st.env[slot] = a
                    for setup in kp.cta_setup:
                        setup(st)
                    if concurrent:
                        contexts = [Context(i, range(w0, min(w0 + group, W)), T)
                                    for i, w0 in enumerate(range(0, W, group))]
                        st.sched = Scheduler(contexts)
                        for c in contexts:
                            c.st = st.fork(c)
                        st.sched.run(kp.body, rec)
                        rec.count("contexts", len(contexts))
                    else:
                        kp.body(st)
                    for finish in kp.cta_finish:
                        finish(st)
                    rec.count("ctas")
    return T
