"""Element types: canonical names (TVM's), bit widths, PTX type tokens and torch equivalents.

Canonical names are TVM dtype strings. Aliases ("fp16", "e4m3", torch dtypes) are accepted everywhere a dtype is.
"""
from __future__ import annotations

from .errors import UnsupportedConfigError, choices

#: canonical name -> (bits, PTX mma type token or None)
DTYPES = {
    "float16": (16, "f16"),
    "bfloat16": (16, "bf16"),
    "float32": (32, "f32"),
    "float64": (64, "f64"),
    "int8": (8, "s8"),
    "uint8": (8, "u8"),
    "int4": (4, "s4"),
    "uint4": (4, "u4"),
    "int32": (32, "s32"),
    "uint32": (32, "u32"),
    "float8_e4m3fn": (8, "e4m3"),
    "float8_e5m2": (8, "e5m2"),
}

_ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
    "tf32": "float32", "tfloat32": "float32",
    "s8": "int8", "u8": "uint8", "s4": "int4", "u4": "uint4", "s32": "int32", "i32": "int32",
    "e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
}


def canonical(dtype) -> str:
    """Canonical TVM name of ``dtype`` (a string alias, a torch dtype or a numpy dtype)."""
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise UnsupportedConfigError(f"unknown dtype {dtype!r}; valid: {choices(DTYPES)}")
    return name


def bits(dtype) -> int:
    return DTYPES[canonical(dtype)][0]


def ptx_type(dtype) -> str:
    return DTYPES[canonical(dtype)][1]


def is_float(dtype) -> bool:
    return canonical(dtype).startswith(("float", "bfloat"))


def torch_dtype(dtype):
    """The torch dtype holding ``dtype`` in memory (int4/uint4 have none: they travel packed in int8/uint8)."""
    import torch

    name = canonical(dtype)
    table = {
        "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
        "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "uint32": torch.uint32,
        "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    }
    if name not in table:
        raise UnsupportedConfigError(f"{name} has no torch dtype; it is stored packed (valid: {choices(table)})")
    return table[name]
