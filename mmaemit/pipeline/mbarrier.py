"""mbarrier rings: the full / empty barrier pairs that guard a multi-stage shared-memory pipeline.

PTX facts (ISA "Parallel Synchronization and Communication Instructions: mbarrier"): an mbarrier is a 64-bit shared
object with an expected arrival count, a pending arrival count, a transaction (tx) count and a phase bit. A phase
completes when the pending arrivals reach 0 and the tx-count is 0; the barrier then flips its phase and re-arms
with the expected count. ``mbarrier.arrive.expect_tx`` adds bytes to the tx-count and arrives; a TMA copy that
names the barrier subtracts the bytes it delivered (``complete_tx``). ``mbarrier.try_wait.parity P`` returns true
once the phase with parity ``P`` has completed; on a freshly initialised barrier (phase 0 in progress) waiting for
parity 1 returns at once, which is how a producer's first pass over an empty ring proceeds without a wait.

Ring protocol (:class:`MbarrierRing`), iteration ``it`` = the running count of stages handed out (it may cross tile
boundaries; the stage is ``it % stages`` and the parity ``(it // stages) % 2``):

* producer: ``producer_acquire(it)`` (wait until every consumer released the stage: empty parity ^ 1),
  ``producer_expect(it, bytes)`` (arrive on full with the stage's transaction bytes), then the TMA loads that
  complete on ``full_ptr(it)``;
* consumer: ``consumer_wait(it)`` (full parity), read the stage, ``consumer_release(it)`` (arrive on empty; with a
  cluster, on the empty barrier of every CTA whose producer multicasts into this CTA).

Expected arrivals: full = 1 (the producer's expect-tx arrive; the bytes do the rest); empty = the number of
consumer arrivals per stage x cluster size.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedConfigError
from .stmt import emit, if_then, while_true

__all__ = ["MbarrierRing", "mbarrier_wait", "mbarrier_init", "mbarrier_arrive", "mbarrier_expect_tx"]


def _u32(x):
    from tvm.script import tirx as T

    return T.uint32(x) if isinstance(x, int) else T.Cast("uint32", x)


def mbarrier_init(bar_ptr, count) -> None:
    """``mbarrier.init.shared::cta.b64 [bar], count`` (one thread; follow with ``fence.mbarrier_init`` and a CTA or
    cluster barrier before any other thread uses the barrier)."""
    from tvm.script import tirx as T

    if isinstance(count, int) and not 1 <= count < 2 ** 20:
        raise UnsupportedConfigError(f"an mbarrier's expected arrival count is 1..2^20-1, not {count}")
    emit(T.ptx.mbarrier.init.shared__cta.b64(bar_ptr, _u32(count)))


def mbarrier_wait(bar_ptr, parity) -> None:
    """Spin until the phase of parity ``parity`` of the barrier at ``bar_ptr`` has completed (a ``try_wait.parity``
    loop without a suspend-time hint: the hardware parks the warp inside each try)."""
    from tvm.script import tirx as T

    done = T.alloc_local((1,), "uint32")
    from tvm.tirx.script.builder import ir as IRB

    IRB.buffer_store(done, T.uint32(0), [0])
    with while_true(done[0] == T.uint32(0)):
        emit(T.ptx.mbarrier.try_wait.parity.shared__cta.b64(done[0], bar_ptr, _u32(parity)))


def mbarrier_arrive(bar_ptr, *, pred=None, cta_rank=None) -> None:
    """Arrive once on the barrier at ``bar_ptr`` (``pred``: only where true). ``cta_rank``: arrive on the barrier at
    the same shared offset in CTA ``cta_rank`` of the cluster (``mapa`` + ``mbarrier.arrive.shared::cluster``)."""
    from tvm.script import tirx as T

    kw = {} if pred is None else {"pred": pred}
    if cta_rank is None:
        emit(T.ptx.mbarrier.arrive.shared__cta.b64(bar_ptr, **kw))
        return
    remote = T.alloc_local((1,), "uint32")
    emit(T.ptx.mapa.shared__cluster.u32(remote[0], T.cuda.cvta_generic_to_shared(bar_ptr), _u32(cta_rank)))
    emit(T.ptx.mbarrier.arrive.shared__cluster.b64(remote[0], **kw))


def mbarrier_expect_tx(bar_ptr, tx_bytes) -> None:
    """``mbarrier.arrive.expect_tx``: arrive once and expect ``tx_bytes`` more transaction bytes in this phase."""
    from tvm.script import tirx as T

    emit(T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(bar_ptr, _u32(tx_bytes)))


@dataclass
class MbarrierRing:
    """``stages`` full/empty mbarrier pairs. ``consumer_arrivals``: arrivals that release one stage in one CTA (e.g.
    one elected thread per consumer warpgroup -> the number of consumer warpgroups); ``cluster``: CTAs whose
    producers multicast into each other's stages (each consumer then releases the stage in all of them)."""

    stages: int
    consumer_arrivals: int
    cluster: int = 1

    def __post_init__(self):
        if not isinstance(self.stages, int) or not 2 <= self.stages <= 16:
            raise UnsupportedConfigError(f"stages={self.stages!r}: a ring needs 2..16 stages")
        if not isinstance(self.consumer_arrivals, int) or self.consumer_arrivals < 1:
            raise UnsupportedConfigError(f"consumer_arrivals={self.consumer_arrivals!r} must be a positive int")
        if self.cluster not in (1, 2, 4, 8, 16):
            raise UnsupportedConfigError(f"cluster={self.cluster!r}; valid: 1, 2, 4, 8, 16")
        self.full = None
        self.empty = None

    # -- allocation and set-up ------------------------------------------------------------------------------------
    def alloc(self, pool):
        """Allocate the barriers in a ``T.SMEMPool`` (8-byte aligned); returns ``(full, empty)`` buffers."""
        self.full = pool.alloc((self.stages,), "uint64", align=8)
        self.empty = pool.alloc((self.stages,), "uint64", align=8)
        return self.full, self.empty

    def _need(self):
        if self.full is None:
            raise UnsupportedConfigError("call ring.alloc(pool) before using the ring")

    def init(self, leader) -> None:
        """Initialise every barrier from the thread where ``leader`` is true and fence the inits for the cluster.
        All threads (of every CTA of the cluster) must then pass a CTA barrier (cluster barrier) before use."""
        from tvm.script import tirx as T

        self._need()
        with if_then(leader):
            for s in range(self.stages):
                mbarrier_init(self.full.ptr_to([s]), 1)
                mbarrier_init(self.empty.ptr_to([s]), self.consumer_arrivals * self.cluster)
            emit(T.ptx.fence.mbarrier_init.release.cluster())

    # -- stage / phase ------------------------------------------------------------------------------------------
    def stage(self, it):
        return it % self.stages

    def parity(self, it):
        return (it // self.stages) % 2

    def full_ptr(self, it):
        self._need()
        return self.full.ptr_to([self.stage(it)])

    def empty_ptr(self, it):
        self._need()
        return self.empty.ptr_to([self.stage(it)])

    # -- producer side --------------------------------------------------------------------------------------------
    def producer_acquire(self, it) -> None:
        """Wait until stage ``it % stages`` is free (released by every consumer of its previous round)."""
        mbarrier_wait(self.empty_ptr(it), self.parity(it) ^ 1)

    def producer_expect(self, it, tx_bytes) -> None:
        """Arrive on the stage's full barrier expecting ``tx_bytes`` (every byte TMA will write into THIS CTA's
        stage, multicast pieces from other CTAs included)."""
        mbarrier_expect_tx(self.full_ptr(it), tx_bytes)

    # -- consumer side --------------------------------------------------------------------------------------------
    def consumer_wait(self, it) -> None:
        """Wait until stage ``it % stages`` holds the data of round ``it // stages``."""
        mbarrier_wait(self.full_ptr(it), self.parity(it))

    def consumer_release(self, it, *, pred=None) -> None:
        """Release stage ``it % stages`` (one arrival; ``pred`` selects the arriving thread, e.g. one per warpgroup),
        in every CTA of the cluster."""
        if self.cluster == 1:
            mbarrier_arrive(self.empty_ptr(it), pred=pred)
        else:
            for r in range(self.cluster):
                mbarrier_arrive(self.empty_ptr(it), pred=pred, cta_rank=r)
