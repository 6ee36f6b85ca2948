"""Packed low-bit weights, host side: exact formats, scaling, packing, interleave, mma fragment order, quantize,
GPTQ / BitBLAS import, and the bit-exact emulation of the register fast decode (``fastdecode_reference``)."""
from .formats import FORMATS, NF4_TABLE, Format, get_format

__all__ = ["FORMATS", "NF4_TABLE", "Format", "get_format"]
