"""``mmaemit.interpret``: execute the device code of a kernel on the CPU with exact PTX semantics.

``interpret(kernel, *args)`` lowers the PrimFunc exactly as ``tvm.compile(..., tir_pipeline="tirx")`` does for CUDA
(``lowering``), compiles the resulting device PrimFunc into Python closures (``compiler``, ``intrinsics``, and
``ptx_exec`` / ``wgmma_exec`` for ``T.ptx`` calls) and runs every CTA with the threads vectorized in numpy
(``machine``: CTA state, barriers, diagnostics; ``access``: memory accesses and their checks). What each PTX
instruction computes is defined once, below the interpreter, in ``mmaemit.ptx`` (bit-exact numpy semantics, reusable
on their own). The returned ``InterpretReport`` lists diagnostics (out-of-bounds, uninitialized shared reads, shared-memory
races, cp.async reads before the wait, wgmma operands touched before their wait_group, missing wgmma.fence /
fence.proxy.async, ...), shared-memory bank conflicts per instruction and run statistics. Hopper ``wgmma`` runs with
its asynchronous commit/wait model (``wgmma_exec``; semantics in ``mmaemit.ptx.wgmma``).
"""
import sys as _sys
import types as _types

from .api import DEFAULT_ARCH, enabled, interpret
from .diagnostics import (AssertionFailedError, BankConflictStat, CpAsyncBeforeWaitError, Diagnostic,
                          DivergenceError, InterpretReport, KernelFault, MisalignedAccessError, OutOfBoundsError,
                          ProxyFenceError, SharedMemoryRaceError, UninitializedReadError, WgmmaBeforeWaitError,
                          WgmmaFenceError, WgmmaOperandError)
from .lowering import lower

__all__ = ["interpret", "enabled", "lower", "InterpretReport", "Diagnostic", "BankConflictStat", "KernelFault",
           "OutOfBoundsError", "UninitializedReadError", "SharedMemoryRaceError", "CpAsyncBeforeWaitError",
           "MisalignedAccessError", "DivergenceError", "AssertionFailedError", "WgmmaBeforeWaitError",
           "WgmmaFenceError", "ProxyFenceError", "WgmmaOperandError", "DEFAULT_ARCH"]


class _CallablePackage(_types.ModuleType):
    """``mmaemit.interpret`` names both this package and the function (``mmaemit.__init__`` exports it lazily); once
    the package is imported it shadows the lazy attribute, so calling the package calls ``interpret``."""

    def __call__(self, *args, **kwargs):
        return interpret(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallablePackage
