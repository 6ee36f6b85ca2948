"""``mmaemit.ptx``: the numpy definition of every PTX instruction mmaemit kernels use, one function per instruction.

This is the semantic layer under both the CPU interpreter (``mmaemit.interpret``, which binds these functions to
threads, registers and memory) and the host-side dequant emulation (``mmaemit.dequant.regops``). It knows nothing
about TIR, threads or the memory model and depends only on ``mmaemit.isa``, ``mmaemit.layouts``, ``mmaemit.dtypes`` and
``mmaemit.errors``: every function is pure and vectorized, so it can also prove a bit trick on all 2**16 inputs.

Conventions: registers are numpy arrays of their bit patterns (``uint32`` for ``.b32`` / packed ``.f16x2``, ``uint16``
for ``.b16``, any leading shape); ``.rn`` results are correctly rounded; NaN results are the canonical NaN of the format
(compare NaN-ness, not NaN bits). Semantics are transcribed from the PTX ISA (9.x) instruction descriptions.

Modules (everything is also re-exported here):

* ``bits`` - register containers: ``u32``, ``split_b32``, ``pack_b32``, ``half_values``, ``UINT_OF_SIZE``
* ``rounding`` - ``round_f64``, ``round_directed``, ``round_sum_f32``, ``two_sum``, ``canonical_nan``, f32 -> f16/bf16
* ``integer`` - ``lop3``, ``prmt``, ``shf``, ``shl``, ``shr``, ``bfe_u32`` / ``bfe_s32``, ``set_cmp``, ``int_arith``
* ``floating`` - ``half_arith`` (f16/bf16{x2}), ``f32_arith`` (every rounding), ``cvt`` and its packed forms
* ``mma`` - ``mma.sync``: fragment coordinates (from ``mmaemit.layouts``) and ``mma_sync``
* ``movement`` - ``ldmatrix``, ``stmatrix``, ``shfl``
* ``wgmma`` - Hopper ``wgmma.mma_async``: matrix descriptors, K-major canonical layouts, swizzle, ``wgmma_mma``
* ``tma`` - tensor maps (``encode_tiled`` with the driver's validation rules) and ``cp.async.bulk.tensor`` box
  geometry: ``box_element_offsets``, ``box_smem_addresses`` (dense box + Swizzle<b,4,3>), ``gather_box`` /
  ``scatter_box`` (out-of-bounds fill / clipping), ``hardware_fault`` (copies measured to fault on the H100)
* ``mbarrier`` - the ``MBarrier`` state machine (arrivals, expect-tx / complete-tx, phase parity)
* ``control`` - ``elect_sync``, ``setmaxnreg`` rules and the CTA register budget
"""
from .bits import UINT_OF_SIZE, half_values, pack_b32, sint_type, split_b32, u32, uint_type
from .floating import (SCALAR_TYPES, cvt, cvt_f8x2_to_f16x2, cvt_f32_to_f8x2, cvt_f32_to_x2, cvt_tf32, decode_f8,
                       f32_arith, half_arith)
from .integer import PRMT_MODES, bfe, bfe_s32, bfe_u32, int_arith, lop3, prmt, set_cmp, shf, shl, shr
from .mma import MMA_ELEMENT_BITS, mma_a_coords, mma_b_coords, mma_c_coords, mma_sync, unpack_elements
from .movement import ldmatrix, shfl, stmatrix
from .rounding import (canonical_nan, f32_to_bf16_bits, f32_to_f16_bits, round_directed, round_f64, round_sum_f32,
                       two_sum)
from .control import REGISTERS_PER_CTA, SETMAXNREG_COUNTS, check_setmaxnreg, elect_sync, launch_register_cap
from .mbarrier import MAX_COUNT as MBARRIER_MAX_COUNT
from .mbarrier import MBarrier, MbarrierStateError
from .tma import (TMA_DTYPES, TMA_SWIZZLE_BYTES, TensorMap, box_chunk_origins, box_element_offsets,
                  box_smem_addresses, encode_tiled, gather_box, hardware_fault, scatter_box)
from .wgmma import (SWIZZLE_BYTES, WGMMA_K, WGMMA_M, MatrixDescriptor, decode_matrix_descriptor,
                    encode_matrix_descriptor, kmajor_chunk_addresses, mnmajor_chunk_addresses, swizzle_address,
                    wgmma_a_coords, wgmma_d_coords, wgmma_mma)

__all__ = [
    "UINT_OF_SIZE", "uint_type", "sint_type", "u32", "split_b32", "pack_b32", "half_values",
    "canonical_nan", "two_sum", "round_f64", "round_directed", "round_sum_f32", "f32_to_f16_bits", "f32_to_bf16_bits",
    "lop3", "PRMT_MODES", "prmt", "shf", "shl", "shr", "bfe", "bfe_u32", "bfe_s32", "set_cmp", "int_arith",
    "half_arith", "f32_arith", "SCALAR_TYPES", "cvt", "cvt_f32_to_x2", "cvt_tf32", "decode_f8", "cvt_f8x2_to_f16x2",
    "cvt_f32_to_f8x2",
    "MMA_ELEMENT_BITS", "mma_a_coords", "mma_b_coords", "mma_c_coords", "unpack_elements", "mma_sync",
    "ldmatrix", "stmatrix", "shfl",
    "MatrixDescriptor", "decode_matrix_descriptor", "encode_matrix_descriptor", "SWIZZLE_BYTES", "swizzle_address",
    "kmajor_chunk_addresses", "mnmajor_chunk_addresses", "wgmma_a_coords", "wgmma_d_coords", "wgmma_mma",
    "WGMMA_M", "WGMMA_K",
    "TMA_DTYPES", "TMA_SWIZZLE_BYTES", "TensorMap", "encode_tiled", "box_element_offsets", "box_smem_addresses",
    "gather_box", "scatter_box", "box_chunk_origins", "hardware_fault",
    "MBarrier", "MbarrierStateError", "MBARRIER_MAX_COUNT",
    "elect_sync", "check_setmaxnreg", "launch_register_cap", "REGISTERS_PER_CTA", "SETMAXNREG_COUNTS",
]
