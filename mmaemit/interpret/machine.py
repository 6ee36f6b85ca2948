"""The machine: one CTA's state, the diagnostics recorder, barriers, and running a compiled kernel CTA by CTA.

Execution model. All threads of a CTA run in lockstep, vectorized with numpy: a per-thread value is an array of
shape (T,) (T = threads per CTA), a uniform value is a scalar, a TIR vector value adds a trailing lane axis. Control
flow that differs between threads runs under a boolean activity mask (divergence); warp-collective instructions
(``ldmatrix``, ``stmatrix``, ``mma``, ``shfl``) execute per warp on the warps whose 32 lanes are all active and
report a divergence error for partially active warps; ``bar.sync``/``__syncthreads`` must be reached by every
thread and starts a new barrier interval ("epoch") that the race detector uses (memory.py). Because every warp
reaches a barrier before any proceeds past it, executing the warps in lockstep between barriers is one legal
schedule; races are detected from the epoch bookkeeping, not from the schedule.

Shared memory: static allocations at their ``align`` (``alignas`` in the generated CUDA), then the dynamic pool at
the largest ``align=`` of its views (at least 128): shared-window addresses are byte offsets from the CTA's shared
base, which is taken as 1024-byte aligned, so address-bit swizzles (wgmma descriptors) see the GPU's bits.

Registers (``local`` buffers) are arrays (size, T); shared memory is one byte array per CTA; global buffers alias
the caller's arrays, so outputs are written in place. How the kernel's statements become closures over this state
is ``compiler``; what the instructions do is ``mmaemit.ptx``, bound to this state by ``ptx_exec`` / ``wgmma_exec``.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedConfigError
from ..layouts import banks as layout_banks
from .diagnostics import ERROR_KINDS, BankConflictStat, Diagnostic
from .memory import SHARED_RID, SharedMemory

__all__ = ["Site", "CpAsyncQueue", "CTAState", "Recorder", "cta_barrier", "run_launch"]


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
    """One CTA's run-time state: slot values (``env``), buffer bindings (``bufs``), the activity ``mask``, thread
    indices, barrier ``epoch``, shared memory, cp.async queue, wgmma state (``wg``) and the recorder (``rec``)."""

    __slots__ = ("env", "bufs", "mask", "T", "W", "tid", "warp_of", "lane_of", "epoch", "cta", "loops", "smem",
                 "regions", "cp", "rec", "axes", "tid2d", "wg")


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
# barriers
# ======================================================================================================================

def cta_barrier(st, site, what):
    if st.mask is not None and not st.mask.all():
        n = int(st.mask.sum())
        st.rec.fault(st, "divergence", site, f"{what} reached by {n} of {st.T} threads: every thread of the CTA "
                     f"must reach the barrier (deadlock / undefined behaviour on the GPU)",
                     thread=int(np.argmin(st.mask)))
    st.epoch += 1
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
                    st.epoch = 0
                    st.loops = []
                    st.smem = SharedMemory(smem_total, names)
                    st.smem.dyn_offset = dyn_offset
                    st.regions = dict(regions)
                    st.regions[SHARED_RID] = st.smem
                    st.cp = CpAsyncQueue(T)
                    st.wg = None
                    st.rec = rec
                    for slot, a in zip(kp.param_slots, args):
                        st.env[slot] = a
                    for setup in kp.cta_setup:
                        setup(st)
                    kp.body(st)
                    for finish in kp.cta_finish:
                        finish(st)
                    rec.count("ctas")
    return T
