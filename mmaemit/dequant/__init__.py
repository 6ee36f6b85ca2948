"""Packed low-bit weights, host side: exact formats, scaling, packing, interleave, mma fragment order, quantize,
GPTQ / BitBLAS import, and the bit-exact emulation of the register fast decode (``fastdecode_reference``)."""
from .formats import FORMATS, NF4_TABLE, Format, get_format
from .fragment_order import (fragment_coord, fragment_index_map, fragment_slot, from_fragment_order, pack_for_mma,
                             tiling, to_fragment_order, unpack_from_mma)
from .interleave import bit_positions, deinterleave, interleave
from .packing import pack, unpack
from .quantize import QuantizedWeight, quantize
from .scaling import (ZEROS_MODES, QuantScheme, act_order_permutation, dequantize, dequantize_codes, pack_zeros,
                      unpack_zeros)

__all__ = ["FORMATS", "NF4_TABLE", "Format", "get_format", "pack", "unpack", "interleave", "deinterleave",
           "bit_positions", "tiling", "fragment_coord", "fragment_slot", "fragment_index_map", "to_fragment_order",
           "from_fragment_order", "pack_for_mma", "unpack_from_mma", "QuantScheme", "ZEROS_MODES", "dequantize",
           "dequantize_codes", "pack_zeros", "unpack_zeros", "act_order_permutation", "QuantizedWeight", "quantize"]
