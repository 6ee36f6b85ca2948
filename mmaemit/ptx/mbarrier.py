"""The ``mbarrier`` object (PTX ISA "Parallel synchronization and communication instructions: mbarrier"): phases,
pending arrivals and the transaction count, as a pure state machine.

An mbarrier (a 64-bit object in shared memory) has a current phase, an expected arrival count, a pending arrival count
and a transaction count (tx-count). ``mbarrier.init [b], count`` sets phase 0, expected = pending = count (1 .. 2^20-1)
and tx-count 0. An arrive-on operation decrements the pending count (by 1, or by ``count``); ``expect-tx(n)`` raises
tx-count by n; ``complete-tx(n)`` (what a TMA copy signals for the bytes it moved) lowers it by n; tx-count may go
negative in between (range +-(2^20 - 1)). The current phase completes when the pending count is 0 and tx-count is 0:
the phase advances, the pending count is reset to the expected count. ``arrive.drop`` also lowers the expected count
for the following phases.

``try_wait.parity`` / ``test_wait.parity`` with ``phaseParity`` P test the completion of the phase of parity P, which
is the current phase or the immediately preceding one: true exactly when the current phase's parity differs from P.
"""
from __future__ import annotations

from ..errors import MmaemitError

__all__ = ["MAX_COUNT", "MbarrierStateError", "MBarrier"]

#: largest arrival count and |tx-count| (2^20 - 1)
MAX_COUNT = (1 << 20) - 1


class MbarrierStateError(MmaemitError):
    """An operation the PTX ISA leaves undefined for this mbarrier state (over-arrival, a count out of range)."""


class MBarrier:
    """One mbarrier object. ``phase`` counts completed phases (its parity is the current phase's parity)."""

    __slots__ = ("expected", "pending", "tx", "phase")

    def __init__(self, count: int):
        count = int(count)
        if not 1 <= count <= MAX_COUNT:
            raise MbarrierStateError(f"mbarrier.init count {count}; valid: 1..{MAX_COUNT}")
        self.expected = count
        self.pending = count
        self.tx = 0
        self.phase = 0

    @property
    def parity(self) -> int:
        """Parity of the current (incomplete) phase."""
        return self.phase & 1

    def _maybe_complete(self) -> bool:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.expected
            return True
        return False

    def arrive(self, count: int = 1, drop: bool = False) -> bool:
        """An arrive-on operation of ``count`` arrivals (``drop``: also lower the expected count). Returns True when
        it completes the current phase."""
        count = int(count)
        if not 1 <= count <= MAX_COUNT:
            raise MbarrierStateError(f"mbarrier.arrive count {count}; valid: 1..{MAX_COUNT}")
        if count > self.pending:
            raise MbarrierStateError(f"mbarrier.arrive of {count} arrival(s) when only {self.pending} of the "
                                     f"{self.expected} expected arrivals of phase {self.phase} are pending "
                                     f"(more arrivals than the barrier was initialized with)")
        if drop:
            self.expected -= count
        self.pending -= count
        return self._maybe_complete()

    def expect_tx(self, nbytes: int) -> None:
        """``expect-tx``: the current phase also waits for ``nbytes`` more transaction bytes."""
        nbytes = int(nbytes)
        if not 0 <= nbytes <= MAX_COUNT or not -MAX_COUNT <= self.tx + nbytes <= MAX_COUNT:
            raise MbarrierStateError(f"mbarrier expect-tx of {nbytes} bytes makes the tx-count {self.tx + nbytes}; "
                                     f"valid: |tx-count| <= {MAX_COUNT}")
        self.tx += nbytes

    def complete_tx(self, nbytes: int) -> bool:
        """``complete-tx``: ``nbytes`` transaction bytes arrived. Returns True when it completes the phase."""
        nbytes = int(nbytes)
        if not -MAX_COUNT <= self.tx - nbytes <= MAX_COUNT:
            raise MbarrierStateError(f"mbarrier complete-tx of {nbytes} bytes makes the tx-count {self.tx - nbytes}; "
                                     f"valid: |tx-count| <= {MAX_COUNT}")
        self.tx -= nbytes
        return self._maybe_complete()

    def phase_completed(self, parity: int) -> bool:
        """``test_wait.parity`` / ``try_wait.parity``: has the phase of parity ``parity`` completed?"""
        return (int(parity) & 1) != self.parity

    def describe(self) -> str:
        return (f"phase {self.phase} (parity {self.parity}): {self.pending} of {self.expected} arrivals pending, "
                f"tx-count {self.tx}")
