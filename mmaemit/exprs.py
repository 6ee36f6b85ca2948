"""Integer formulas written once for Python ints and TIR expressions.

A tile order or a schedule is planned on the host with ints (tests, pictures, launch sizes) and emitted into a
kernel as TIR, where an extent may be symbolic (dynamic M). These helpers take either: on ints, bools and NumPy
integers they compute the value; otherwise they build the TIR node (``T.min``, ``T.max``, ``T.Select``,
``T.And``).
"""
from __future__ import annotations

import numpy as np

__all__ = ["is_int", "imin", "imax", "select", "both"]


def is_int(x) -> bool:
    """A Python or NumPy integer (not a bool, not an expression)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _plain(x) -> bool:
    return isinstance(x, (int, np.integer, bool, np.bool_))


def imin(a, b):
    """min(a, b), or ``T.min`` when either is an expression."""
    if _plain(a) and _plain(b):
        return min(a, b)
    from tvm.script import tirx as T

    return T.min(a, b)


def imax(a, b):
    """max(a, b), or ``T.max`` when either is an expression."""
    if _plain(a) and _plain(b):
        return max(a, b)
    from tvm.script import tirx as T

    return T.max(a, b)


def select(cond, a, b):
    """``a if cond else b`` for a bool condition, else ``T.Select(cond, a, b)``."""
    if isinstance(cond, (bool, np.bool_)):
        return a if cond else b
    from tvm.script import tirx as T

    return T.Select(cond, a, b)


def both(a, b):
    """``a and b`` for bools, else ``T.And(a, b)``."""
    if isinstance(a, (bool, np.bool_)) and isinstance(b, (bool, np.bool_)):
        return bool(a and b)
    from tvm.script import tirx as T

    return T.And(a, b)
