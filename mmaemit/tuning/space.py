"""Tuning spaces: named lists of values whose Cartesian product is the candidate set.

``Space({"tile": [(128, 128, 32), (256, 128, 64)], "stages": [3, 4]})`` has four candidates, each a dict
``{"tile": ..., "stages": ...}``, enumerated with the first axis slowest (``itertools.product`` order). An axis may
instead be a function ``values(key) -> sequence`` of the tuning key (a dict of the builder's other arguments), for
value lists that depend on the shape or arch.

Values must have a canonical JSON form (:func:`jsonable`): ``None``, bools, ints, floats, strings, tuples / lists of
those, dicts with string keys, and dataclass instances (stored as ``{"__type__": "module.Class", field: ...}``). The
on-disk table stores a winner by that form, and a stored winner is used only if an equal candidate is still in the
space (a space edited since keeps no stale winner).
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import itertools
import json

from ..errors import ArgumentError

__all__ = ["Space", "jsonable", "canonical_json", "digest"]


def jsonable(value):
    """The canonical JSON-able form of a space value or key value (see the module doc); ``ArgumentError`` otherwise."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__module__}.{type(value).__qualname__}", "name": value.name}
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ArgumentError(f"tuning values must be finite numbers, got {value!r}")
        return float(value)
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ArgumentError(f"dict tuning values need string keys, got {list(value)!r}")
        return {k: jsonable(value[k]) for k in sorted(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"__type__": f"{type(value).__module__}.{type(value).__qualname__}"}
        for f in dataclasses.fields(value):
            out[f.name] = jsonable(getattr(value, f.name))
        return out
    name = type(value).__module__ + "." + type(value).__qualname__
    if name.startswith("torch."):  # torch.dtype and friends: their str is canonical ("torch.float16")
        return str(value)
    raise ArgumentError(f"tuning value {value!r} of type {name} has no canonical JSON form; use None, bool, int, "
                        f"float, str, tuples/lists, dicts with str keys or dataclass instances")


def canonical_json(value) -> str:
    """``json.dumps`` of :func:`jsonable` with sorted keys and no spaces (stable across processes and runs)."""
    return json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"))


def digest(value) -> str:
    """sha256 hex of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


class Space:
    """Named axes ``{name: values or values(key)}``; candidates are their Cartesian product (first axis slowest)."""

    def __init__(self, axes=None):
        self.axes = {}
        for name, values in (axes or {}).items():
            self._add(name, values)

    def _add(self, name, values):
        if not isinstance(name, str) or not name.isidentifier():
            raise ArgumentError(f"a tuning axis name must be an identifier (a builder parameter), got {name!r}")
        if name in self.axes:
            raise ArgumentError(f"tuning axis {name!r} is given twice (stacked @autotune decorators must name "
                                f"different parameters)")
        if not callable(values):
            if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
                raise ArgumentError(f"tuning axis {name!r} needs a list of values, got {values!r}")
            values = tuple(values)
            if not values:
                raise ArgumentError(f"tuning axis {name!r} has no values")
            for v in values:
                jsonable(v)
        self.axes[name] = values

    def merged(self, other: "Space") -> "Space":
        """A new space with this one's axes first, then ``other``'s (names must differ)."""
        out = Space(self.axes)
        for name, values in other.axes.items():
            out._add(name, values)
        return out

    @property
    def names(self) -> tuple:
        return tuple(self.axes)

    def values(self, key: dict) -> dict:
        """Each axis's values for ``key`` (callable axes evaluated and checked)."""
        out = {}
        for name, values in self.axes.items():
            if callable(values):
                got = tuple(values(dict(key)))
                if not got:
                    raise ArgumentError(f"tuning axis {name!r} gives no values for key {key}")
                for v in got:
                    jsonable(v)
                values = got
            out[name] = values
        return out

    def product(self, key: dict) -> list:
        """Every candidate (a dict axis -> value) for ``key``, first axis slowest."""
        vals = self.values(key)
        names = list(vals)
        return [dict(zip(names, combo)) for combo in itertools.product(*(vals[n] for n in names))]

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={'<fn>' if callable(v) else list(v)}" for n, v in self.axes.items())
        return f"Space({inner})"
