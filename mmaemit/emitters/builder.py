"""Thin helpers to emit statements into the TIR being parsed (the emitters run as plain Python at parse time)."""
from __future__ import annotations

from tvm.script import tirx as T
from tvm.tirx.script.builder import ir as IRB


def emit(call) -> None:
    """Append one statement (a ``T.ptx.*`` call) to the kernel body being built."""
    IRB.add_to_parent(IRB.evaluate(call))


def ptx(name: str):
    """The ``T.ptx`` callable for an exact PTX mnemonic (``"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"``)."""
    return T.ptx[name]


def is_buffer(x) -> bool:
    """tvm 0.27 hands buffers to parse-time Python as ``Var``s of BufferType (with ``shape``/``ptr_to``)."""
    return hasattr(x, "ptr_to") and hasattr(x, "shape") and hasattr(x, "scope")


def split_region(operand):
    """(buffer, leading indices, row offset, col offset) of a buffer or a region over its last two dims.

    A buffer must be 2-D. A region (``As[stage, 0:128, 0:32]``) may have scalar leading dims; its last two ranges give
    the tile origin. A load (``As[stage, r0, c0]``) names the origin element.
    """
    from ..errors import UnsupportedConfigError

    if is_buffer(operand):
        if len(operand.shape) != 2:
            raise UnsupportedConfigError(
                f"buffer {operand.name} has shape {list(operand.shape)}; pass a 2-D buffer or a region such as "
                f"{operand.name}[stage, 0:rows, 0:cols]")
        return operand, (), 0, 0
    src = getattr(operand, "source", None)
    if src is not None and hasattr(operand, "region"):
        rng = list(operand.region)
        return src, tuple(r.min for r in rng[:-2]), rng[-2].min, rng[-1].min
    if src is not None and hasattr(operand, "indices"):
        idx = list(operand.indices)
        return src, tuple(idx[:-2]), idx[-2], idx[-1]
    raise UnsupportedConfigError(f"expected a buffer, a buffer region or a buffer element, got {type(operand).__name__}")


def scope_of(buf) -> str:
    return buf.scope() if callable(getattr(buf, "scope", None)) else str(buf.scope)


def store(buf, value, index) -> None:
    """Append ``buf[index] = value``."""
    IRB.buffer_store(buf, value, list(index))


def cast(dtype: str, value):
    from tvm.script import tirx as T

    return T.Cast(dtype, value)


class only_if:
    """``with only_if(cond):`` wraps the statements emitted inside in ``if cond`` (no-op for ``cond=None``)."""

    def __init__(self, cond):
        self.cond = cond
        self._frames = []

    def __enter__(self):
        if self.cond is not None:
            f = IRB.If(self.cond)
            f.__enter__()
            t = IRB.Then()
            t.__enter__()
            self._frames = [f, t]
        return self

    def __exit__(self, *exc):
        for f in reversed(self._frames):
            f.__exit__(*exc)
        return False
