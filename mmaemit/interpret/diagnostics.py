"""What the interpreter reports: diagnostics (with kernel location), bank-conflict counts and run statistics.

Error kinds raise a ``KernelFault`` subclass when ``interpret(..., on_error="raise")`` (the default); with
``on_error="report"`` they are collected in ``InterpretReport.diagnostics`` and the run continues (an out-of-bounds
load then reads 0 and an out-of-bounds store is dropped). Bank conflicts are never errors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import MmaemitError

__all__ = ["Diagnostic", "BankConflictStat", "InterpretReport", "KernelFault", "OutOfBoundsError",
           "UninitializedReadError", "SharedMemoryRaceError", "CpAsyncBeforeWaitError", "DivergenceError",
           "MisalignedAccessError", "AssertionFailedError", "WgmmaBeforeWaitError", "WgmmaFenceError",
           "ProxyFenceError", "WgmmaOperandError", "DeadlockError", "TmaBeforeWaitError", "TmaLayoutError",
           "RegisterBudgetError", "MbarrierError", "TmaError", "ERROR_KINDS"]


@dataclass
class Diagnostic:
    """One problem found while executing the kernel.

    ``kind``: "out_of_bounds", "uninitialized_read", "race", "cp_async_before_wait", "misaligned", "divergence",
    "assert_failed", "wgmma_before_wait", "wgmma_missing_fence", "missing_proxy_fence", "wgmma_operand", "deadlock",
    "tma_before_wait", "tma_layout_mismatch", "register_budget", "mbarrier", "tma" (errors)
    or "assumed_alignment" (a warning: the interpreter assumed an alignment the generated CUDA does not promise).
    ``buffer``/``index``: the buffer as named in the lowered kernel and the element index (``index`` is the flat
    element index; ``detail`` adds the multi-dimensional index of the source buffer when known).
    ``thread``/``warp``/``lane``/``cta``: the first offending thread (thread index within the CTA).
    ``location``: the lowered TIR statement and the enclosing loop variables. ``count``: how many times this
    diagnostic (same kind, same statement) fired; only the first occurrence is described.
    """

    kind: str
    message: str
    buffer: str | None = None
    index: int | None = None
    thread: int | None = None
    warp: int | None = None
    location: str = ""
    lane: int | None = None
    cta: tuple = ()
    detail: str = ""
    count: int = 1

    def __str__(self) -> str:
        where = []
        if self.buffer is not None:
            where.append(f"buffer {self.buffer}" + (f"[{self.index}]" if self.index is not None else ""))
        if self.detail and self.detail != f"{self.buffer}[{self.index}]":
            where.append(f"= {self.detail}")
        if self.thread is not None:
            where.append(f"thread {self.thread} (warp {self.warp}, lane {self.lane})")
        if self.cta:
            where.append(f"CTA {self.cta}")
        head = f"[{self.kind}] {self.message}"
        if where:
            head += " | " + ", ".join(where)
        if self.location:
            head += f"\n    at {self.location}"
        if self.count > 1:
            head += f"\n    (fired {self.count} times; first occurrence shown)"
        return head


@dataclass
class BankConflictStat:
    """Shared-memory bank conflicts of one instruction, summed over every warp-level execution.

    ``conflicts``: extra wavefronts (0 = conflict-free), counted with ``mmaemit.layouts.banks``.
    """

    op: str
    location: str
    executions: int = 0
    conflicts: int = 0
    worst: int = 0

    @property
    def conflicts_per_execution(self) -> float:
        return self.conflicts / self.executions if self.executions else 0.0


@dataclass
class InterpretReport:
    """Result of ``mmaemit.interpret``: diagnostics, per-instruction bank conflicts and execution statistics."""

    kernel: str = ""
    arch: str = ""
    diagnostics: list = field(default_factory=list)
    bank_conflicts: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    @property
    def errors(self) -> list:
        return [d for d in self.diagnostics if d.kind in ERROR_KINDS]

    @property
    def ok(self) -> bool:
        return not self.errors

    def of_kind(self, kind: str) -> list:
        return [d for d in self.diagnostics if d.kind == kind]

    @property
    def total_bank_conflicts(self) -> int:
        return sum(b.conflicts for b in self.bank_conflicts)

    def summary(self) -> str:
        lines = [f"interpret {self.kernel} ({self.arch}): {len(self.errors)} error(s), "
                 f"{self.total_bank_conflicts} bank-conflict wavefront(s)"]
        for k, v in self.stats.items():
            lines.append(f"  {k}: {v}")
        for d in self.diagnostics:
            lines.append("  " + str(d).replace("\n", "\n  "))
        for b in self.bank_conflicts:
            if b.conflicts:
                lines.append(f"  bank conflicts {b.op}: {b.conflicts} over {b.executions} warp executions "
                             f"(worst {b.worst}) at {b.location}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


class KernelFault(MmaemitError):
    """The interpreted kernel did something undefined; ``.diagnostic`` says what and where, ``.report`` holds the
    partial report up to the fault."""

    kind = ""

    def __init__(self, diagnostic: Diagnostic, report: InterpretReport | None = None):
        super().__init__(str(diagnostic))
        self.diagnostic = diagnostic
        self.report = report


class OutOfBoundsError(KernelFault):
    kind = "out_of_bounds"


class UninitializedReadError(KernelFault):
    kind = "uninitialized_read"


class SharedMemoryRaceError(KernelFault):
    kind = "race"


class CpAsyncBeforeWaitError(KernelFault):
    kind = "cp_async_before_wait"


class MisalignedAccessError(KernelFault):
    """An ldmatrix/stmatrix row, cp.async or vector access whose address is not aligned to its size."""

    kind = "misaligned"


class AssertionFailedError(KernelFault):
    kind = "assert_failed"


class DivergenceError(KernelFault):
    """A warp-collective instruction (ldmatrix, mma, shfl, ...) or a CTA barrier reached by only part of the
    threads that must execute it together."""

    kind = "divergence"


class WgmmaBeforeWaitError(KernelFault):
    """An accumulator or A register of a ``wgmma.mma_async`` accessed, or shared memory it reads written, before
    the ``wgmma.wait_group`` that retires it (or the CTA ends with it never retired)."""

    kind = "wgmma_before_wait"


class WgmmaFenceError(KernelFault):
    """A ``wgmma.mma_async`` uses registers accessed by ordinary instructions since the last ``wgmma.fence`` (or is
    the warpgroup's first without one)."""

    kind = "wgmma_missing_fence"


class ProxyFenceError(KernelFault):
    """A ``wgmma.mma_async`` (async proxy) reads shared memory written through the generic proxy without a
    ``fence.proxy.async`` in between."""

    kind = "missing_proxy_fence"


class WgmmaOperandError(KernelFault):
    """A wgmma matrix descriptor or ``scale-d`` that differs between the threads of a warpgroup."""

    kind = "wgmma_operand"


class DeadlockError(KernelFault):
    """No warp of the CTA can make progress: every unfinished warp waits (on an mbarrier phase, a named barrier, a
    register request) for something only the others could do. The message names each wait, its barrier and state."""

    kind = "deadlock"


class TmaBeforeWaitError(KernelFault):
    """Shared memory read (by threads, ldmatrix, wgmma or a TMA store) before the mbarrier phase completing the TMA
    load that writes it was waited for; or written while a TMA store still reads it (before
    ``cp.async.bulk.wait_group.read``), or left being read when the CTA ends."""

    kind = "tma_before_wait"


class TmaLayoutError(KernelFault):
    """A wgmma matrix descriptor reads a TMA-loaded tile in a layout other than the one the tensor map's box and
    swizzle wrote (e.g. a 64-byte-swizzled box read through a 128-byte-swizzle descriptor)."""

    kind = "tma_layout_mismatch"


class RegisterBudgetError(KernelFault):
    """``setmaxnreg`` asks for more registers than the CTA was given at launch (threads x the launch cap: a request
    that can never be granted, it hangs on the GPU), or an illegal count / direction."""

    kind = "register_budget"


class MbarrierError(KernelFault):
    """An mbarrier used before ``mbarrier.init``, initialized with an illegal count, or arrived on more often than its
    phase expects (undefined behaviour in PTX)."""

    kind = "mbarrier"


class TmaError(KernelFault):
    """A tensor copy whose tensor-map operand is not an encoded map, whose dimensionality differs from the map's
    rank, or that the H100 was measured to reject (``mmaemit.ptx.tma.hardware_fault``: a store whose box starts at a
    negative coordinate, a rank-1 copy whose box is not entirely inside the tensor)."""

    kind = "tma"


#: kind -> exception class
ERROR_KINDS = {c.kind: c for c in (OutOfBoundsError, UninitializedReadError, SharedMemoryRaceError,
                                   CpAsyncBeforeWaitError, MisalignedAccessError, DivergenceError,
                                   AssertionFailedError, WgmmaBeforeWaitError, WgmmaFenceError, ProxyFenceError,
                                   WgmmaOperandError, DeadlockError, TmaBeforeWaitError, TmaLayoutError,
                                   RegisterBudgetError, MbarrierError, TmaError)}
