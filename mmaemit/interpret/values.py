"""How the interpreter represents TIR values: dtype names -> numpy dtypes, and the C integer ranges it wraps to.

A per-thread value is an array of shape (T,) (T = threads per CTA), a uniform value is a scalar, a TIR vector value
adds a trailing lane axis. ``int32`` / ``int64`` uniform values are Python ints (wrapped to their C range).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import UnsupportedConfigError, choices

__all__ = ["NP_DTYPES", "INT_RANGE", "split_dtype", "np_dtype", "expr_dtype", "is_py_int_dtype"]

#: TVM dtype name -> numpy dtype (pointers are int64 generic addresses)
NP_DTYPES = {
    "float16": np.dtype(np.float16), "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16), "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "int8": np.dtype(np.int8), "int16": np.dtype(np.int16), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8), "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64), "bool": np.dtype(np.bool_), "handle": np.dtype(np.int64),
}

#: C integer types whose uniform values are Python ints: (min, max, modulus)
INT_RANGE = {"int32": (-(1 << 31), (1 << 31) - 1, 1 << 32), "int64": (-(1 << 63), (1 << 63) - 1, 1 << 64)}


def split_dtype(dt) -> tuple:
    """("float16", 8) for "float16x8"; ("handle", 1) for pointers."""
    s = str(dt)
    if s.startswith("handle") or s == "":
        return "handle", 1
    import tvm

    d = tvm.DataType(s)
    lanes = int(d.lanes)
    base = s[: -len(f"x{lanes}")] if lanes > 1 and s.endswith(f"x{lanes}") else s
    return base, lanes


def np_dtype(dt) -> np.dtype:
    """The numpy dtype of one lane of TVM dtype ``dt``."""
    base, _ = split_dtype(dt)
    if base not in NP_DTYPES:
        raise UnsupportedConfigError(f"the interpreter does not support dtype {base!r}; supported: "
                                     f"{choices(NP_DTYPES)}")
    return NP_DTYPES[base]


def expr_dtype(e) -> str:
    """The dtype string of a TIR expression ("handle" for pointers and untyped nodes)."""
    from tvm.ir.type import PrimType

    ty = getattr(e, "ty", None)
    if isinstance(ty, PrimType):
        return str(ty.dtype)
    return "handle"


def is_py_int_dtype(base) -> bool:
    """True for the integer types whose uniform values the interpreter keeps as Python ints."""
    return base in INT_RANGE
