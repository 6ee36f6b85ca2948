"""Synchronization of the asynchronous pipeline bound to the machine: ``mbarrier`` objects, ``elect.sync``,
``setmaxnreg`` and TVM's ``T.cuda.mbarrier_wait`` / ``T.cuda.warpgroup_sync`` / ``T.cuda.elect_sync`` helpers.

* mbarriers: the CTA's table (``st.mb``) maps a shared address to the barrier's state (``mmaemit.ptx.mbarrier``),
  the vector-clock knowledge released into its current phase and the knowledge of its last completed phase. Arrivals
  release the arriving warps' knowledge; a wait that sees its phase complete acquires it (``memory.VectorClocks``).
  Each barrier also has a TMA agent: loads signalling it write shared memory as that agent (``tma_exec``).
* ``mbarrier.try_wait.parity`` / ``test_wait.parity`` (and ``T.cuda.mbarrier_wait``) block their context until the
  phase of the given parity has completed (``machine.block``), then write true; a wait on a phase no context can
  complete is a deadlock. (``test_wait`` is non-blocking in PTX; here it also waits, which is what its spin loops do.)
* ``setmaxnreg``: per-warpgroup register counts. A warpgroup that has not executed one holds the kernel's own
  count, which only ptxas knows: it is taken as the launch cap (64K / threads, a multiple of 8, at most 256) for the
  budget and not checked against the direction of the first ``.inc`` / ``.dec``. ``.inc`` blocks until the CTA's
  launch allocation (threads x that cap, not the 64K file: measured on the H100, 640 threads with a 96-register cap
  hung on ``.inc`` to 1 x 40 + 4 x 112 = 62464 registers, within 64K) can hold every warpgroup's count (registers
  come back only through ``.dec``, not when warps exit); a request that can never be granted is a ``register_budget``
  error.
* ``elect.sync`` elects the lowest active lane of each warp (``mmaemit.ptx.control``).
"""
from __future__ import annotations

import numpy as np

from .. import isa
from ..errors import MmaemitError
from ..ptx.control import REGISTERS_PER_CTA, check_setmaxnreg, elect_sync, launch_register_cap
from ..ptx.mbarrier import MBarrier, MbarrierStateError
from .access import (WARPGROUP, active_threads, as_thread_vector, full_warpgroups, shared_addresses,
                     warpgroup_threads)
from .machine import block, named_barrier
from .ptxcall import family_registry

__all__ = ["FAMILIES", "MbarrierEntry", "setup_cta", "mbarrier_entry", "mbarrier_release", "compile_mbarrier_wait",
           "compile_warpgroup_sync", "compile_elect_sync"]

#: family name -> compile function (filled by ``@_family`` below)
FAMILIES, _family = family_registry()


class MbarrierEntry:
    """One initialized mbarrier of the CTA: its state, TMA agent column and phase knowledge."""

    __slots__ = ("addr", "obj", "agent", "phase_vc", "done_vc", "name")

    def __init__(self, addr, count, agent, name):
        self.addr = addr
        self.obj = MBarrier(count)
        self.agent = agent
        self.phase_vc = None
        self.done_vc = None
        self.name = name


class RegisterBudget:
    """Per-warpgroup register counts of one CTA (``setmaxnreg``)."""

    def __init__(self, T):
        self.threads = [min(WARPGROUP, T - g * WARPGROUP) for g in range(-(-T // WARPGROUP))]
        self.cap = launch_register_cap(T)
        self.allocation = sum(self.threads) * self.cap     # what the CTA holds from launch: .inc takes nothing more
        self.count = [None] * len(self.threads)          # None: the kernel's count, not known (taken as the cap)

    def used(self, st, override=None):
        total = 0
        for g, n in enumerate(self.threads):
            c = override[1] if override is not None and override[0] == g else self.count[g]
            total += n * (self.cap if c is None else c)
        return total

    def describe(self, st, g=None, new=None):
        parts = []
        for i, n in enumerate(self.threads):
            c = new if i == g else self.count[i]
            c = f"{self.cap} (assumed)" if c is None else c
            parts.append(f"warpgroup {i}: {c} x {n}")
        return ", ".join(parts)


def setup_cta(st):
    """Before a CTA of a kernel using mbarriers / setmaxnreg: empty barrier table, launch register counts."""
    st.mb = {}
    st.regs = RegisterBudget(st.T)


# ----------------------------------------------------------------------------------------------------------------------
# mbarrier state shared with tma_exec
# ----------------------------------------------------------------------------------------------------------------------

def _barrier_name(st, addr):
    _n, _e, text = st.smem.describe(int(addr))
    return f"mbarrier {text} (shared byte {int(addr)})" if text else f"mbarrier at shared byte {int(addr)}"


def mbarrier_entry(st, site, addr, what, thread):
    """The initialized mbarrier at shared address ``addr``, or None after reporting its misuse."""
    e = st.mb.get(int(addr))
    if e is None:
        st.rec.fault(st, "mbarrier", site, f"{what} on {_barrier_name(st, addr)}, which no mbarrier.init initialized",
                     thread=int(thread), buffer="shared", index=int(addr))
    return e


def _fault(st, site, err, thread, e):
    st.rec.fault(st, "mbarrier", site, f"{err} ({e.name})", thread=int(thread), buffer="shared", index=e.addr)


def mbarrier_release(st, e, knowledge, arrivals=0, tx_done=0, drop=False):
    """Release ``knowledge`` into ``e``'s current phase, then perform ``arrivals`` arrivals and complete ``tx_done``
    transaction bytes; a completed phase keeps the released knowledge for its waiters."""
    clocks = st.smem.clocks
    e.phase_vc = clocks.widen(knowledge) if e.phase_vc is None else \
        np.maximum(clocks.widen(e.phase_vc), clocks.widen(knowledge))
    done = False
    if tx_done:
        done = e.obj.complete_tx(tx_done) or done
    if arrivals:
        done = e.obj.arrive(arrivals, drop=drop) or done
    if done:
        e.done_vc = e.phase_vc
        e.phase_vc = None


# ----------------------------------------------------------------------------------------------------------------------
# the mbarrier instructions
# ----------------------------------------------------------------------------------------------------------------------

def _addresses(st, faddr, site, thr):
    return shared_addresses(st, faddr(st), site)[thr]


@_family("mbarrier_init")
def _init(kp, ops, mod, site):
    faddr, fcount = ops.value("addr"), ops.value("count")

    def run(st):
        thr = active_threads(st)
        if len(thr) == 0:
            return
        addrs = _addresses(st, faddr, site, thr)
        counts = as_thread_vector(st, np.asarray(fcount(st), np.int64))[thr]
        for t, a, c in zip(thr, addrs, counts):
            a = int(a)
            if a % 8 or a < 0 or a + 8 > st.smem.nbytes:
                st.rec.fault(st, "misaligned" if 0 <= a < st.smem.nbytes else "out_of_bounds", site,
                             f"mbarrier.init: shared address {a} is not an 8-byte aligned address inside the CTA's "
                             f"{st.smem.nbytes}-byte shared memory", thread=int(t), buffer="shared", index=a)
                continue
            old = st.mb.get(a)
            name = _barrier_name(st, a)
            agent = old.agent if old is not None else st.smem.clocks.add_agent(name)
            try:
                st.mb[a] = MbarrierEntry(a, int(c), agent, name)
            except MbarrierStateError as err:
                st.rec.fault(st, "mbarrier", site, f"{err} ({name})", thread=int(t), buffer="shared", index=a)
                continue
            st.smem.init[a:a + 8] = True
        st.rec.count("mbarrier.init", len(thr))
    return run


@_family("mbarrier_arrive", "mbarrier_arrive_nocount", "mbarrier_arrive_drop", "mbarrier_arrive_drop_nocount",
         "mbarrier_arrive_expect_tx", "mbarrier_arrive_drop_expect_tx", "mbarrier_expect_tx", "mbarrier_complete_tx")
def _arrive(kp, ops, mod, site):
    fam = ops.family
    if mod.get("scope") == "cluster" or mod.get("space") == "shared::cluster":
        raise kp.unsupported(f"{fam} on a cluster-scope mbarrier (the interpreter runs clusters of one CTA)")
    faddr = ops.value("addr")
    fcount = ops.value("count") if ops.nodes("count") else None
    ftx = ops.value("tx_count") if ops.nodes("tx_count") else None
    arrive = fam.startswith("mbarrier_arrive")
    drop = "_drop" in fam
    complete = fam == "mbarrier_complete_tx"
    if ftx is not None:
        isa.require_feature("mbarrier.tx", kp.arch)
    what = "mbarrier." + ("arrive" + (".drop" if drop else "") + (".expect_tx" if ftx is not None else "")
                          if arrive else "complete_tx" if complete else "expect_tx")

    def run(st):
        thr = active_threads(st)
        if len(thr) == 0:
            return
        addrs = _addresses(st, faddr, site, thr)
        counts = np.ones(len(thr), np.int64) if fcount is None else \
            as_thread_vector(st, np.asarray(fcount(st), np.int64))[thr]
        txs = None if ftx is None else as_thread_vector(st, np.asarray(ftx(st), np.int64))[thr]
        clocks = st.smem.clocks
        snaps = {}
        if arrive or complete:
            for w in np.unique(st.warp_of[thr]):
                snaps[int(w)] = clocks.release(int(w))
        for i, (t, a) in enumerate(zip(thr, addrs)):
            e = mbarrier_entry(st, site, a, what, t)
            if e is None:
                continue
            try:
                if txs is not None and not complete:
                    e.obj.expect_tx(int(txs[i]))
                if arrive:
                    mbarrier_release(st, e, snaps[int(st.warp_of[t])], arrivals=int(counts[i]), drop=drop)
                elif complete:
                    mbarrier_release(st, e, snaps[int(st.warp_of[t])], tx_done=int(txs[i]))
            except MbarrierStateError as err:
                _fault(st, site, f"{what}: {err}", t, e)
        st.rec.count(what, len(thr))
    return run


def _wait_closure(kp, site, faddr, fparity, writer, what):
    kp.blocking = True

    def run(st):
        thr = active_threads(st)
        if len(thr) == 0:
            return
        addrs = _addresses(st, faddr, site, thr)
        par = as_thread_vector(st, np.asarray(fparity(st), np.int64))[thr] & 1
        waits = {}
        for t, a, p in zip(thr, addrs, par):
            waits.setdefault((int(a), int(p)), []).append(int(t))
        pairs = []
        for (a, p), ts in waits.items():
            e = mbarrier_entry(st, site, a, what, ts[0])
            if e is not None:
                pairs.append((e, p, ts))

        def ready():
            return all(e.obj.phase_completed(p) for e, p, _ts in pairs)

        def describe():
            return "; ".join(f"{what} for the phase of parity {p} of {e.name}: {e.obj.describe()}"
                             for e, p, _ts in pairs if not e.obj.phase_completed(p))
        if not block(st, "mbarrier", ready, describe, site, [e.addr for e, _p, _ts in pairs]):
            return
        clocks = st.smem.clocks
        for e, _p, ts in pairs:
            if e.done_vc is not None:
                for w in np.unique(st.warp_of[np.asarray(ts)]):
                    clocks.acquire(int(w), e.done_vc)
        if writer is not None:
            writer(st, np.ones(len(thr), np.uint32), thr)
        st.rec.count("mbarrier.wait", len(thr))
    return run


@_family("mbarrier_try_wait_parity", "mbarrier_try_wait_parity_no_hint", "mbarrier_test_wait_parity")
def _try_wait(kp, ops, mod, site):
    if mod.get("scope") == "cluster":
        raise kp.unsupported(f"{ops.family} with .cluster scope (the interpreter runs clusters of one CTA)")
    isa.require_feature("mbarrier.tx", kp.arch)
    (writer,) = ops.writers("wait_complete")
    what = f"mbarrier.{'test' if 'test' in ops.family else 'try'}_wait.parity"
    return _wait_closure(kp, site, ops.value("addr"), ops.value("phase"), writer, what)


@_family("mbarrier_inval")
def _inval(kp, ops, mod, site):
    faddr = ops.value("addr")

    def run(st):
        thr = active_threads(st)
        for a in _addresses(st, faddr, site, thr):
            st.mb.pop(int(a), None)
    return run


@_family("fence_mbarrier_init")
def _fence_init(kp, ops, mod, site):
    return lambda st: None      # makes the inits visible cluster-wide: a cluster of one CTA needs nothing more


@_family("elect_sync")
def _elect(kp, ops, mod, site):
    isa.require_feature("elect.sync", kp.arch)
    fmask = ops.value("membermask")
    wd = ops.writers("d")[0] if ops.nodes("d") else None
    wp = ops.writers("p")[0] if ops.nodes("p") else None

    def run(st):
        thr = active_threads(st)
        if len(thr) == 0:
            return
        act = np.zeros(st.T, bool)
        act[thr] = True
        mm = as_thread_vector(st, np.asarray(fmask(st)).astype(np.uint64)).reshape(st.W, 32)[:, 0]
        d, p = elect_sync(act.reshape(st.W, 32), mm)
        if wd is not None:
            wd(st, d.reshape(-1)[thr].astype(np.uint32), thr)
        if wp is not None:
            wp(st, p.reshape(-1)[thr].astype(np.uint32), thr)
    return run


@_family("setmaxnreg")
def _setmaxnreg(kp, ops, mod, site):
    isa.require_feature("setmaxnreg", kp.arch)
    action = mod["action"]
    n = ops.imm("nreg")
    kp.warpgroup_collective = True
    kp.blocking = True
    what = f"setmaxnreg.{action}.sync.aligned.u32 {n}"

    def run(st):
        budget = st.regs
        for g in full_warpgroups(st, site, what, family="setmaxnreg"):
            g = int(g)
            t0 = int(warpgroup_threads(g)[0])
            try:
                check_setmaxnreg(action, n, budget.count[g])
            except MmaemitError as err:
                st.rec.fault(st, "register_budget", site, f"{what} by warpgroup {g}: {err}", thread=t0)
                continue
            if action == "inc":
                def ready(g=g):
                    return budget.used(st, (g, n)) <= budget.allocation

                def describe(g=g):
                    return (f"{what} by warpgroup {g}: the CTA would hold {budget.used(st, (g, n))} registers, over "
                            f"its {budget.allocation} (its launch allocation, {sum(budget.threads)} threads x "
                            f"{budget.cap}; the file has {REGISTERS_PER_CTA}) ({budget.describe(st, g, n)})")
                if not block(st, "setmaxnreg", ready, describe, site):
                    continue
            budget.count[g] = n
        st.rec.count("setmaxnreg")
    return run


# ----------------------------------------------------------------------------------------------------------------------
# TVM's T.cuda helpers
# ----------------------------------------------------------------------------------------------------------------------

def compile_mbarrier_wait(kp, args):
    """``T.cuda.mbarrier_wait(bar_ptr, phase)``: ``try_wait.parity.acquire.cta`` retried until it succeeds."""
    isa.require_feature("mbarrier.tx", kp.arch)
    faddr, fparity = kp.expr(args[0]), kp.expr(args[1])
    return _wait_closure(kp, kp.site, faddr, fparity, None, "T.cuda.mbarrier_wait (mbarrier.try_wait.parity)")


def compile_warpgroup_sync(kp, args):
    """``T.cuda.warpgroup_sync(id)``: ``bar.sync id, 128`` (the executing warpgroup's 128 threads)."""
    fid = kp.expr(args[0])
    site = kp.site
    kp.blocking = True

    def run(st):
        named_barrier(st, site, int(np.asarray(fid(st)).flat[0]), WARPGROUP, "T.cuda.warpgroup_sync (bar.sync)")
    return run


def compile_elect_sync(kp, args):
    """``T.cuda.elect_sync()``: 1 in the lowest active lane of each warp (``elect.sync`` with a full member mask),
    else 0."""

    def run(st):
        act = np.ones(st.T, bool) if st.mask is None else st.mask
        _d, p = elect_sync(act.reshape(st.W, 32), 0xFFFFFFFF)
        return p.reshape(-1).astype(np.uint32)
    return run
