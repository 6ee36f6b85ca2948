"""Emitting TIR statements from Python while TVMScript parses a kernel (the pipeline blocks run at parse time)."""
from __future__ import annotations

__all__ = ["emit", "while_true", "if_then"]


def emit(call) -> None:
    """Append one statement (a ``T.ptx`` call or another builtin call) to the kernel body being parsed."""
    from tvm.tirx.script.builder import ir as IRB

    IRB.add_to_parent(IRB.evaluate(call))


class _Frames:
    def __init__(self, *frames):
        self._frames = frames

    def __enter__(self):
        for f in self._frames:
            f.__enter__()
        return self

    def __exit__(self, *exc):
        for f in reversed(self._frames):
            f.__exit__(*exc)
        return False


def while_true(cond) -> _Frames:
    """``with while_true(cond):`` emits ``while (cond) { ... }``."""
    from tvm.tirx.script.builder import ir as IRB

    return _Frames(IRB.While(cond))


def if_then(cond) -> _Frames:
    """``with if_then(cond):`` emits ``if (cond) { ... }``."""
    from tvm.tirx.script.builder import ir as IRB

    return _Frames(IRB.If(cond), IRB.Then())
