"""Packed low-bit weights, host side: exact formats, scaling, packing, interleave, mma fragment order, quantize,
GPTQ / BitBLAS import, and the bit-exact emulation of the register fast decode (``fastdecode_reference``).

Pipeline (each step has an exact inverse)::

    quantize(W[N, K], QuantScheme(...)) -> QuantizedWeight(packed [N, K*b/32] along K, scales [N, G], zeros, g_idx)
    QuantizedWeight.codes()             -> uint8 codes [N, K]
    fragment_order.pack_for_mma(codes)  -> int32 words [N/BN, K/BK, 32]: mma B-fragment order + interleave
    decode.decode_program(fmt, dtype, mode, arch) -> the register ops turning one word into B-fragment registers
                                           (emitted as T.ptx in a kernel, or evaluated bit-exactly on the CPU)
"""
from .decode import FAST_DECODE, DecodeProgram, decode_program
from .formats import FORMATS, NF4_TABLE, Format, get_format
from .fragment_order import (fragment_coord, fragment_index_map, fragment_slot, from_fragment_order, pack_for_mma,
                             tiling, to_fragment_order, unpack_from_mma)
from .importers import AWQ_PACK_ORDER, from_awq, from_bitblas, from_gptq
from .interleave import bit_positions, deinterleave, interleave
from .packing import pack, unpack
from .quantize import QuantizedWeight, quantize
from .scaling import (ZEROS_MODES, QuantScheme, act_order_permutation, dequantize, dequantize_codes, pack_zeros,
                      unpack_zeros)

__all__ = [
    "FORMATS", "NF4_TABLE", "Format", "get_format",
    "QuantScheme", "ZEROS_MODES", "dequantize", "dequantize_codes", "pack_zeros", "unpack_zeros",
    "act_order_permutation",
    "pack", "unpack", "interleave", "deinterleave", "bit_positions",
    "tiling", "fragment_coord", "fragment_slot", "fragment_index_map", "to_fragment_order", "from_fragment_order",
    "pack_for_mma", "unpack_from_mma",
    "QuantizedWeight", "quantize", "from_gptq", "from_awq", "from_bitblas", "AWQ_PACK_ORDER",
    "DecodeProgram", "decode_program", "FAST_DECODE",
]
