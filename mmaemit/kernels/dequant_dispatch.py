"""Dynamic-M dequant GEMM: one object per weight shape, a few kernels compiled once, every M served without compiling.

``DequantGemm(N, K, ...)`` holds one kernel per M range (each with a symbolic M, bound from A's shape at every call).
On sm_90a with weights whose scaled decode has a fast program (int4, int4_ob = symmetric GPTQ, uint4 with or
without zero points = asymmetric GPTQ / AWQ, 8-bit integers, int2 / int1, nf4 (per-row scaled tables built once per
group), and fp4 / fp8 with fp16 activations; N a multiple of 64) the plan is

==============  ====================  ==========================================================================
path            M range (defaults)    kernel
==============  ====================  ==========================================================================
``gemv8``       1 .. 8                :func:`~mmaemit.kernels.dequant_gemm.make_dequant_gemv`, ``m_max=8``; 16 warps
                                      per CTA where its N / 32 CTAs fit one wave (:func:`gemv8_config`)
``gemv16``      9 .. 16               the same with ``m_max=16`` (two token rows per lane), warps per CTA from
                                      :func:`gemv16_config` (one wave of warps for the grid)
``fused32``     17 .. 32              :func:`~mmaemit.kernels.dequant_gemm_hopper.make_dequant_gemm_hopper` (TMA +
                                      mbarrier ring, warp-specialized, codes decoded into RS wgmma), 32 activation
                                      rows x 64 weight rows per tile, four consumer warpgroups splitting K
                                      (``k_split``), 8 stages of 4 chunks (fewer for K not a multiple of 1024),
                                      two chunks per wgmma group
``fused48``     33 .. 48              the same, 48 activation rows, two consumers, 6 stages
``fused64``     49 .. 64              the same, 64 activation rows, 4 stages, one chunk per wgmma group
``fused96``     65 .. 96              the same, 96 activation rows, 6 stages of 2 chunks
``fused128``    97 .. 128             the same, 128 activation rows, 6 stages of 2 chunks, the sums handed over in
                                      the consumers' kept last stages (``handover="stage"``)
``fused160``    129 .. 160            160 x 64 tiles, two consumers splitting K, 8 stages of one chunk, where N / 64
                                      tiles fit one wave (:func:`fused160_config`), else 160 x 128 tiles, two
                                      consumer warpgroups, 5 stages of one chunk
``fused192``    161 .. 192            192 x 64 tiles, two consumers splitting K, 6 stages of one chunk, where N / 64
                                      tiles fit one wave (:data:`ONE_WAVE_PATHS`; else ``fused128x2`` serves)
``fused224``    193 .. 224            the same, 224 activation rows, 4 stages
``fused256k``   225 .. 256            the same, 256 activation rows, 4 stages
``fused128x2``  257 .. 511            128 x 128 tiles, two consumer warpgroups, 4 stages of 2 chunks (from 161 where
                                      the one-wave tiles do not fit; not where ``fused256``'s tiles fill the GPU
                                      at one tile row, :func:`wide_tiles_fill`: then ``fused256`` serves from 161;
                                      where two rows of block_m x 64 tiles fit one wave, M = 257 .. 448 take them,
                                      :data:`TWO_ROW_PATHS`)
``fused256``    512 ..                256 x 128 tiles, two consumers, 4 stages, panels of 4 tile rows
``dense``       ``dense_m`` ..        :func:`~mmaemit.kernels.dequant_dense.make_dequant_to_dense` into an fp16 /
                                      bf16 scratch [N, K], then the Hopper TMA + wgmma GEMM
                                      (:func:`~mmaemit.kernels.gemm_hopper.make_gemm_hopper`, ``M=None``, 128 x 256)
==============  ====================  ==========================================================================

(``dense`` is in this plan from :data:`FUSED_DENSE_M` where ``fused256`` does not fit or the format is not an
integer one of :data:`FUSED_EVERY_M_BITS` bits (nf4, fp4, 8-bit: :func:`fused_serves_every_m`), or from a ``dense_m``
the caller gives; the stages and chunks above are the 4-bit rings.) 8-bit weights
(:data:`FUSED_SMALL_M_BITS`) take ``fused8`` (1 .. 8) and ``fused16`` (9 .. 16), 8- and 16-row tiles of the same
kernel, instead of the GEMVs, and rings of fewer chunks per stage (twice the weight bytes per chunk; any default ring
that would not fit shared memory loses stages). Other formats (and zero-point modes without a fast decode: uint8
with bf16 activations and "original" / "quantized" zeros), or GPUs without wgmma:

=============  ===========================  ====================================================================
path           M range (defaults)           kernel
=============  ===========================  ====================================================================
``gemv8``      1 .. 8                       as above
``gemv16``     9 .. 16                      as above
``gemv32``     17 .. 32                     the GEMV with ``m_max=32``: four n8 token tiles per warp, each decoded
                                            weight fragment feeds all (``GemvConfig(n_blocks=1)``: 128 registers, no
                                            spills for any format)
``tiled64``    33 .. 64 (without sm_90a)    :func:`~mmaemit.kernels.dequant_gemm.make_dequant_gemm_tiled`, 64 x 64
``tiled128``   65 .. ``large_m`` - 1        the same, 128 x 128 CTA tiles (``large_m`` > 65, or no sm_90a)
``dense_mid``  ``large_m`` .. ``wide_m`` - 1 the dense scratch + Hopper GEMM with 128 x 128 tiles (sm_90a; twice the
                                            CTAs of the wide tiles at small M)
``dense``      ``wide_m`` .. (sm_90a)       the same with the GEMM's default 128 x 256 tiles
=============  ===========================  ====================================================================

An extra path, runnable by name (``run_path``, ``--all-paths``) but in no plan: ``wgmma``
(:mod:`~mmaemit.kernels.dequant_gemm_wgmma`, register decode with cp.async activations); every path of either plan
that fits the problem also runs by name.

``large_m`` (default :data:`LARGE_M`, from the H100 measurement in ``docs/perf-notes.md``) is where the two-kernel
path starts in the second plan (``wide_m``, default :data:`WIDE_M`, where its GEMM switches to wide tiles); without
sm_90a the tiled path serves every M above 32. Paths whose tiles do not divide N / K drop out
(the next path up takes their range). ``warmup()`` compiles every path; after it a call only checks the arguments and
launches (no compile, no host synchronisation, outputs and the scratch from torch's caching allocator), so the calls
can be captured in a CUDA graph. With ``interpret=True`` (or ``MMAEMIT_INTERPRET=1``) the same PrimFuncs run on the
CPU interpreter instead (tests). The plan above is rules; :mod:`mmaemit.kernels.dequant_plan` measures one per problem
on the GPU that serves (``measure_plan``), and ``plan=`` / :meth:`DequantGemm.set_plan` take its spans.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os

from mmaemit.arch import device_sm_count
from mmaemit.dequant.formats import get_format
from mmaemit.dtypes import canonical
from mmaemit.errors import ArgumentError, TileShapeError, UnsupportedConfigError, choices

from .dequant_dense import DenseConfig, make_dequant_to_dense
from .dequant_gemm import GemvConfig, TiledConfig, make_dequant_gemm_tiled, make_dequant_gemv
from .dequant_gemm_hopper import (HOPPER_FUSED_FORMATS, HopperDequantConfig, fused_smem_bytes,
                                  make_dequant_gemm_hopper, stream_k_workspace)
from .dequant_gemm_wgmma import WgmmaConfig, make_dequant_gemm_wgmma
from .dequant_parts import check_scheme
from .gated import check_gate, gate_into
from .gemm_hopper import SMEM_LIMIT, HopperGemmConfig, make_gemm_hopper

__all__ = ["DequantGemm", "LARGE_M", "WIDE_M", "FUSED_DENSE_M", "PATHS", "FUSED_PATHS", "FUSED_SMALL_M_BITS",
           "EXTRA_PATHS", "FUSED_EVERY_M_BITS", "fused_serves_every_m", "GEMV16_CONFIGS", "gemv16_config",
           "GEMV8_ONE_WAVE", "gemv8_config", "FUSED160_ONE_WAVE", "fused160_config", "ONE_WAVE_PATHS", "one_wave_fits",
           "wide_tiles_fill", "STREAM_K_PATHS", "WAVE_FILL_PATHS", "WAVE_FILL_MAX_M", "TWO_ROW_PATHS", "wave_fill_pads",
           "span_path", "clip_spans", "join_spans", "prebuild", "warmup_all"]

#: first M of the two-kernel (dense scratch + Hopper GEMM) path on sm_90a: on the H100 at 8192 x 8192 it beat the
#: symbolic-M tiled paths at every measured M >= 32 (docs/perf-notes.md, 2026-11-26), so the tiled paths serve only
#: GPUs without wgmma; below it ``gemv32`` (four n8 token tiles per warp) serves M = 17 .. 32 (int4 at M=32 on the H100:
#: 28.9 µs against 156 µs for dense_mid)
LARGE_M = 33
#: first M of the two-kernel path with the GEMM's wide (128 x 256) tiles (128 x 128 won at M=256, lost at 1024)
WIDE_M = 512
#: path names of the plan without fused paths, smallest M first
PATHS = ("gemv8", "gemv16", "gemv32", "tiled64", "tiled128", "dense_mid", "dense")
#: the fused Hopper kernel (:mod:`~mmaemit.kernels.dequant_gemm_hopper`: TMA + mbarrier ring, warp-specialized,
#: weights decoded into RS wgmma) at thirteen tile shapes, with the first M each serves on sm_90a (formats whose scaled
#: decode, with their zero points if any, is fast; from the tile studies on the H100, docs/perf-notes.md): they replace
#: tiled64 .. dense_mid there, and for :data:`FUSED_SMALL_M_BITS` the GEMVs too
FUSED_PATHS = ("fused8", "fused16", "fused32", "fused48", "fused64", "fused96", "fused128", "fused160", "fused192",
               "fused224", "fused256k", "fused128x2", "fused256")
_FUSED_START = {"fused8": 1, "fused16": 9, "fused32": 17, "fused48": 33, "fused64": 49, "fused96": 65, "fused128": 97,
                "fused160": 129, "fused192": 161, "fused224": 193, "fused256k": 225, "fused128x2": 161, "fused256": 512}
#: fused paths of block_m x 64 tiles (two consumers splitting K) that the plan takes only where their N / 64 tiles fit
#: one wave (:func:`one_wave_fits`), each up to its ``block_m`` rows; ``fused128x2`` then starts after the last one.
#: Why: 128 x 128 tiles give N / 128 CTAs, half the H100 at N = 8192, and decode every weight twice at M > 128. On
#: the H100, int4 g128 fp16, µs, against fused128x2 (docs/perf-notes.md, twelfth session): 8192^2 M=176 47.7-51.2
#: against 57.7-59.0, M=192 49.5-51.4 against 60.1-61.6, M=208 52.5-53.7 against 60.9-62.1, M=224 53.3-53.7
#: against 58.4-62.2, M=256 57.6-58.2 against 61.8-63.7; 4096 x 14336 M=192 66.1-66.7 against 83.8-86.4, M=224
#: 72.2-73.0 against 85.3-87.2, M=256 83.6-83.9 against 85.4-86.3
ONE_WAVE_PATHS = ("fused192", "fused224", "fused256k")
#: fused paths that :meth:`DequantGemm._fill_waves` may give several tile rows where the plan's tall one-row path
#: leaves half the SMs or more idle, and the M it considers. Why: on the H100 (int4 g128 fp16, every path timed in one
#: run against the plan's, µs; docs/perf-notes.md, seventeenth session) 1024 x 4096 M=128 fused32 8.7 against the
#: plan's fused128 10.9, M=256 fused32 9.4 against fused256k 16.6, M=512 fused64 12.6 against fused256 23.7; 4096 x
#: 4096 M=128 fused64 12.7 against fused128 15.0, M=256 fused128 18.2 against fused256k 26.7, M=512 fused128x2 28.3
#: against fused256 41.9 (cuBLAS fp16 9.2-12.1 and 15.4-29.6): each the path that fills one wave (128 tiles of 132)
WAVE_FILL_PATHS = ("fused32", "fused64", "fused128", "fused128x2")
WAVE_FILL_MAX_M = 512
#: block_m x 64 tiles (two consumers splitting K) that :meth:`DequantGemm._fill_waves` gives two tile rows in place of
#: one row of ``fused192`` or of ``fused128x2``'s 128 x 128 tiles, where both rows fit one wave (2 N / 64 tiles: N
#: up to 4224 on 132 SMs) and no :data:`WAVE_FILL_PATHS` path serves: the shortest whose tile holds M in two rows.
#: Why (H200, int4 g128 fp16, measured plans validated in one run, docs/perf-notes.md, nineteenth session): 4096 x
#: 4096 M = 161-176 fused96 15.5-15.8 µs against fused192's 21.7-21.8, M = 289-304 fused160 20.7-22.6 against
#: fused128x2's 26.1-26.3, M = 353-368 fused192 22.9-25.1 against 26.2-26.5; 4096 x 14336 fused96 45.4-47.4 against
#: 48.5-49.8, fused160 66.8-71.8 against 84.0-86.6, fused192 83.3-84.6 against 88.5-89.4, M = 417-432 fused224
#: 85.2-90.7 against 99.3-101.2 (4096 x 4096 M = 385-448: within 2 %). Not fused256k: its two rows lost at 4096 x
#: 4096 M = 449-512 (29.0-29.8 against 27.2-27.7); not in place of fused160 (M = 129-160: fused96's two rows won
#: 1.13-1.17x at K = 4096 but lost at K = 14336, 46.4 against 43.7)
TWO_ROW_PATHS = ("fused96", "fused160", "fused192", "fused224")
_TWO_ROW_REPLACES = ("fused192", "fused128x2")


def wave_fill_pads(M, block_m, plan_block_m) -> bool:
    """Whether tile rows of ``block_m`` may serve M in place of the plan's ``plan_block_m`` (``_fill_waves``): M
    rounded up to ``block_m`` exceeds M rounded up to ``plan_block_m`` by at most ``block_m / 4`` rows. Just past a
    multiple of ``block_m`` the shorter tiles' last row is mostly padding, the tall tile's rows are not, and stream-K
    already spreads the tall row's work: on the H200 (int4 g128 fp16, both plans in one run, fit_rows; docs/perf-
    notes.md, eighteenth session) 4096 x 14336 M = 33 / 48 / 65 / 80 / 129 / 160 took 0.77-0.82x the M-only plan's
    time in shorter rows and 4096 x 4096 0.89-0.97x, while M = 64 / 100 / 128 / 200 / 256 / 512 (rows no longer than
    the plan's, or by 32 at M=200) took 0.94-1.14x and 1.12-1.61x."""
    def up(b):
        return -(-M // b) * b

    return up(block_m) <= up(plan_block_m) + block_m // 4


def span_path(spans, M):
    """The path of the span [(path, first M, last M or None)] that holds ``M``, or None."""
    return next((p for p, lo, hi in spans if lo <= M and (hi is None or M <= hi)), None)


def clip_spans(spans, lo, hi) -> list:
    """The parts of ``spans`` that lie in M = ``lo`` .. ``hi`` (None: no upper end), in order."""
    return [(p, max(a, lo), b if hi is None else hi if b is None else min(b, hi)) for p, a, b in spans
            if (hi is None or a <= hi) and (b is None or b >= lo)]


def join_spans(spans) -> list:
    """``spans`` (in M order, contiguous) with each span joined to the one before it where it continues its path."""
    out = []
    for p, lo, hi in spans:
        if out and out[-1][0] == p and out[-1][2] == lo - 1:
            out[-1] = (p, out[-1][1], hi)
        else:
            out.append((p, lo, hi))
    return out
#: weight widths whose fused paths also serve M <= 16 (``fused8``, ``fused16`` instead of the GEMVs): on the H100 at
#: 8192 x 8192 g128 fp16 int8 took 28.5 us at M=1 with 8-row tiles against 45.0 for the GEMV; int4 17.3 vs 19.7 and
#: int2 14.1 vs 19.1 keep the GEMV (docs/perf-notes.md, fifth session)
FUSED_SMALL_M_BITS = (8,)
#: with the fused paths, the first M of the two-kernel ``dense`` path, unless ``fused256`` serves every M from 512
#: (:func:`fused_serves_every_m`)
FUSED_DENSE_M = 4096
#: integer code widths (int / uint formats, any zeros mode) whose ``fused256`` serves every M from 512 where it fits,
#: with no ``dense`` path. On the H100, g128, rotating weights, µs, fused256 (panel 4) against dense
#: (docs/perf-notes.md, thirteenth session): int4 fp16 8192^2 M = 2048 / 4096 / 8192 409-412 / 782-806 / 1644-1657
#: against 470-477 / 909-924 / 1748-1764; 28672 x 8192 M=4096 2842-2922 against 2971-3066; 14336 x 4096 M = 2048 /
#: 4096 369-383 / 740-754 against 419-440 / 823-830; 4096 x 14336 346-358 / 692-711 against 406-424 / 768-772;
#: 8192^2 M=4096 int4 bf16 752-756 against 867-918, uint4 with quantized zeros 778-803 against 891-916, int2 715
#: against 746-792. Not nf4 (985-986 against 894-940) or 8-bit (int8 fp16 M=8192 1792-1855 against 1711-1765, bf16
#: M=4096 885-901 against 876-884); fp4 not measured
FUSED_EVERY_M_BITS = (1, 2, 4)


def fused_serves_every_m(weight_format) -> bool:
    """Whether ``fused256`` (where it fits) serves every M from 512 for this format, rather than ``dense`` from
    :data:`FUSED_DENSE_M`: integer codes of :data:`FUSED_EVERY_M_BITS` bits."""
    fmt = get_format(weight_format)
    return fmt.kind in ("int", "uint") and fmt.bits in FUSED_EVERY_M_BITS


#: runnable by name (``run_path``, ``--all-paths``), in no plan: the register-decode Hopper kernel of
#: :mod:`mmaemit.kernels.dequant_gemm_wgmma` (symbolic M)
EXTRA_PATHS = ("wgmma",)
#: ``gemv16``'s configs by warps per CTA (``k_slices``): 4 warps x 4 CTAs, 8 x 2, 16 x 1 per SM
GEMV16_CONFIGS = {4: GemvConfig(2, 4, 4, 4), 8: GemvConfig(), 16: GemvConfig(2, 16, 3, 1)}
#: warps per SM a GEMV grid should have for one full wave
GEMV_WAVE_WARPS_PER_SM = 16
#: ``gemv8``'s config where its grid is at most one CTA per SM (:func:`gemv8_config`)
GEMV8_ONE_WAVE = GemvConfig(2, 16, 3, 1)


def _sm_count(sms) -> int:
    """SMs a grid rule plans for: ``sms``, or the visible GPU's count (132 without one)."""
    return device_sm_count() if sms is None else int(sms)


def gemv16_config(N, K, sms=None) -> GemvConfig:
    """``gemv16``'s default for an N x K problem: the ``k_slices`` of :data:`GEMV16_CONFIGS` whose grid (N / 32 CTAs
    x k_slices warps) is nearest one wave of :data:`GEMV_WAVE_WARPS_PER_SM` warps on each of ``sms`` SMs (None: the
    visible GPU's, 132 without one) and divides K. On the H100 at M=16, int4 g128 (docs/perf-notes.md, seventh
    session): 14336 x 4096 15.8 us with 4 warps against 17.7 with 8, 4096 x 14336 15.5 with 16 against 18.3,
    28672 x 8192 55.4-61.5 with 4 against 58.0-64.1, 8192^2 keeps 8 (17.1)."""
    fits = [ks for ks in GEMV16_CONFIGS if K % (128 * ks) == 0]
    if N % 32 or not fits:
        return GemvConfig()
    wave = GEMV_WAVE_WARPS_PER_SM * _sm_count(sms)
    return GEMV16_CONFIGS[min(fits, key=lambda ks: (abs(N // 32 * ks - wave), ks != 8))]


#: ``fused160``'s config where its 64-row tiles fit one wave (:func:`fused160_config`): 160 activation rows x 64
#: weight rows, two consumers splitting K
FUSED160_ONE_WAVE = HopperDequantConfig(block_m=160, consumers=2, stages=8, k_split=True, chunks_per_stage=1,
                                        fit_rows=True, stream_k=True)


def one_wave_fits(N, K, sms=None) -> bool:
    """Whether tiles of 64 weight rows with two consumers splitting K (:data:`FUSED160_ONE_WAVE`,
    :data:`ONE_WAVE_PATHS`) fit an N x K problem in one wave: N / 64 tiles on at most ``sms`` SMs (None: the visible
    GPU's) and K a multiple of their 128."""
    return N % 64 == 0 and N // 64 <= _sm_count(sms) and K % FUSED160_ONE_WAVE.k_multiple == 0


def wide_tiles_fill(N, sms=None) -> bool:
    """Whether ``fused256``'s 256 x 128 tiles fill the GPU at one tile row: N / 128 of them on at least ``sms`` SMs
    (None: the visible GPU's). There ``fused256`` serves from M=161 instead of ``fused128x2`` (where the one-wave paths
    do not fit): one tile row decodes each weight once where 128 x 128 tiles take two rows and decode it twice. On the
    H100, int4 g128 fp16, 28672 x 8192, µs, fused256 against fused128x2 (cuBLAS fp16): M=192 179.0-183.9 against
    212.9-216.6 (180.3-189.2), M=256 187.6-191.3 against 230.5-244.5 (210.6-213.7) (docs/perf-notes.md, thirteenth
    session)."""
    rows = _DEFAULTS["fused256"].weight_rows
    return N % rows == 0 and N // rows >= _sm_count(sms)


def fused160_config(N, K, sms=None) -> HopperDequantConfig:
    """``fused160``'s default for an N x K problem: :data:`FUSED160_ONE_WAVE` where its N / 64 tiles fit one wave on
    ``sms`` SMs (None: the visible GPU's) and K is a multiple of its 128, else 160 x 128 tiles (two consumers of 64
    rows each). Why: 160 x 128 tiles give N / 128 CTAs, half the H100 at N = 8192. On the H100, int4 g128 fp16, µs,
    the 160 x 64 tiles against the 160 x 128 ones: 8192^2 M=136 40.3-40.7 against 58.8-59.4, M=160 41.9-42.1 against
    59.1-59.4; 4096 x 14336 M=160 56.3-57.3 against 96.6-97.1; where N / 64 exceeds the SMs they lose: 28672 x 8192
    M=160 158.3-161.4 against 139.1-140.1, 14336 x 4096 40.3-41.1 against 35.6-36.8 (docs/perf-notes.md, eleventh
    session)."""
    if one_wave_fits(N, K, sms):
        return FUSED160_ONE_WAVE
    return _DEFAULTS["fused160"]


def gemv8_config(N, K, sms=None) -> GemvConfig:
    """``gemv8``'s default for an N x K problem: :data:`GEMV8_ONE_WAVE` (16 warps per CTA, one CTA per SM) where the
    grid of N / 32 CTAs fits one wave at one CTA per SM of ``sms`` (None: the visible GPU's) and K allows 16 K slices,
    else ``GemvConfig()`` (8 warps, two CTAs per SM). Why: with programmatic dependent launch a GEMV's CTAs start
    while the kernel before it drains, and the first SMs to free up took two 8-warp CTAs each, leaving others idle:
    the Llama MLP block's down projection (4096 x 14336, 128 CTAs) ran 19.4-20.8 us after the gated GEMV instead of
    13 (H100, M=1, CUDA graph); with one 16-warp CTA per SM the block took 42.3-43.6 us against 44.6-47.5
    (docs/perf-notes.md, tenth session)."""
    wave = _sm_count(sms)
    if N % 32 == 0 and N // 32 <= wave and K % (128 * GEMV8_ONE_WAVE.k_slices) == 0:
        return GEMV8_ONE_WAVE
    return GemvConfig()


_DEFAULTS = {"gemv8": GemvConfig(), "gemv16": GemvConfig(), "gemv32": GemvConfig(n_blocks=1),
             "tiled64": TiledConfig(64, 64, 32, 32, 4),
             "tiled128": TiledConfig(), "dense": DenseConfig(), "hopper": HopperGemmConfig(),
             "hopper_mid": HopperGemmConfig(block_n=128), "wgmma": WgmmaConfig(64, 2, 1, 4),
             "fused8": HopperDequantConfig(block_m=8, consumers=2, stages=6, k_split=True, chunks_per_stage=4),
             "fused16": HopperDequantConfig(block_m=16, consumers=2, stages=6, k_split=True, chunks_per_stage=4),
             "fused32": HopperDequantConfig(block_m=32, consumers=4, stages=8, k_split=True, chunks_per_stage=4,
                                            consumer_regs=112, producer_regs=24, chunks_per_group=2),
             # k_split rings hold a multiple of their consumers' stages (HopperDequantConfig.stage_step): fused48 has
             # 6 (5 before: 21.8-22.8 us against 21.7-21.9 at M=48), fused224 4 (53.2-53.7 against 53.6-54.6); H100,
             # docs/perf-notes.md, fourteenth session
             "fused48": HopperDequantConfig(block_m=48, consumers=2, stages=6, k_split=True, chunks_per_stage=4,
                                            chunks_per_group=2, fit_rows=True),
             "fused64": HopperDequantConfig(block_m=64, consumers=2, stages=4, k_split=True, chunks_per_stage=4,
                                            fit_rows=True),
             # fit_rows (fused48 up to fused256k): the last tile row's activation boxes carry its rows rounded up
             # to 8, not the tile's; TMA's zero fill of the rows past M cost ~25-40 % where a quarter or more of a
             # tall tile's rows lie past M (H100 8192^2, default / fit: fused96 M=65 36.9-37.0 / 26.1-27.5 us,
             # fused128 M=97 41.4-41.5 / 29.8-33.2, fused160 M=129 44.9-45.1 / 35.1-40.3, fused224 M=193 56.2-56.3 /
             # 49.8-51.0; docs/perf-notes.md, fifteenth session) and ~70 % in the short last row of two (H200
             # 4096 x 14336: fused64 M=65 61.4 / 37.2, fused128 M=129 96.0 / 52.7; fused48 M=33 23.9 / 22.7;
             # eighteenth session). Not fused32, fused128x2 or fused256, whose short rows lose the stage box (A/B in
             # one run, H200: fused32 1024 x 4096 M=200 9.5 / 11.3, 8192^2 M=20 17.5 / 19.2; fused128x2 4096 x 4096
             # M=300 26.3 / 27.5, 8192^2 M=300 96.3 / 97.6; fused256 8192^2 M = 600 / 1000 168.5 / 166.9, 199.7 /
             # 204.6)
             "fused96": HopperDequantConfig(block_m=96, consumers=2, stages=6, k_split=True, chunks_per_stage=2,
                                            lookahead=True, fit_rows=True, activation_boxes="chunk"),
             # fused128: 6 stages of 2 chunks, the sums handed over in the kept last stages (handover="stage": the
             # 32 KB slot went to ring stages; 8 one-chunk stages before, 2 x 5 is unsafe): H100 8192^2 M=128
             # 32.4-34.2 us against 36.9-41.5, M=100 37.7-38.1 against 41.0, 28672 x 8192 M=128 121-133 against
             # 138-146 (docs/perf-notes.md, fifteenth session)
             "fused128": HopperDequantConfig(block_m=128, consumers=2, stages=6, k_split=True, chunks_per_stage=2,
                                             handover="stage", fit_rows=True, activation_boxes="chunk"),
             "fused160": HopperDequantConfig(block_m=160, consumers=2, stages=5, fit_rows=True),
             # one wave of 64-row tiles (ONE_WAVE_PATHS): in_flight=0 measured faster at 224 and 256 rows (each
             # consumer otherwise holds a stage while it waits for its next) and within the spread at 192
             "fused192": HopperDequantConfig(block_m=192, consumers=2, stages=6, k_split=True, chunks_per_stage=1,
                                             in_flight=0, fit_rows=True),
             "fused224": HopperDequantConfig(block_m=224, consumers=2, stages=4, k_split=True, chunks_per_stage=1,
                                             in_flight=0, fit_rows=True),
             "fused256k": HopperDequantConfig(block_m=256, consumers=2, stages=4, k_split=True, chunks_per_stage=1,
                                              in_flight=0, fit_rows=True),
             "fused128x2": HopperDequantConfig(block_m=128, consumers=2, stages=4, chunks_per_stage=2),
             # panels of 4 tile rows: a wave of 132 tiles then reads 4 activation panels (4 MB each at K=8192) and
             # ~33 weight panels (~0.5 MB) instead of 16 and ~8 (64 MB, past the 50 MB L2); on the H100 2-6 % faster
             # than panel 16 at M = 4096-8192 (docs/perf-notes.md, thirteenth session)
             "fused256": HopperDequantConfig(block_m=256, consumers=2, stages=4, panel=4)}

#: the fused paths whose defaults take a stream-K tail (``HopperDequantConfig.stream_k``; under the config's rule:
#: launches of less than one wave whose busiest SM saves at least 48 chunks of K). Measured on the H100 against the
#: same config without it (int4 g128 fp16, us): 4096 x 14336 fused32 M=32 24.8 / 20.3 (H200), fused48 29.2 / 24.4,
#: fused64 34.4 / 28.3, fused96 39.8 / 31.5 (H200), fused128 44.1 / 43.4, fused160 56.3 / 51.5, fused192 65.3 / 60.2,
#: fused224 77.1 / 67.5, fused256k 82.8 / 76.6, fused256 M=512 135.4 / 106.0; 1024 x 4096 fused32 8.5 / 7.5, fused128
#: 14.3 / 10.8. fused128x2 (4096 x 14336 M=300: 86.2 / 87.2) and the GEMV-sized fused8 / fused16 keep whole tiles
#: (docs/perf-notes.md, seventeenth session)
STREAM_K_PATHS = ("fused32", "fused48", "fused64", "fused96", "fused128", "fused160", "fused192", "fused224",
                  "fused256k", "fused256")
_DEFAULTS.update({p: dataclasses.replace(_DEFAULTS[p], stream_k=True) for p in STREAM_K_PATHS})


def _ring(cps, stages, **kw) -> dict:
    # two chunks per wgmma group pair a stage's 4 chunks: rings of fewer chunks per stage take one per group; the
    # sums of one-chunk stages do not fit a kept stage (handover="stage"): they take their own slots
    return dict(chunks_per_stage=cps, stages=stages, **({} if cps == 4 else {"chunks_per_group": 1}),
                **({"handover": "parallel"} if cps == 1 else {}), **kw)


#: fused32's two-consumer shape (the 4-consumer default needs K a multiple of 1024 and 4-bit or narrower weights)
_TWO_CONSUMERS = dict(consumers=2, consumer_regs=232, producer_regs=40)
#: the default fused configs' ring shapes (chunks per stage, stages) for 8-bit weights, whose weight boxes are twice
#: the 4-bit ones: fewer chunks per stage, deeper rings (H100, 8192^2 int8: fused128 39.2 us against 44.8 with 2 x 4,
#: fused32 30.1 against 30.8 with 4 x 6; docs/perf-notes.md, fifth session)
_FUSED_8BIT = {"fused8": _ring(2, 8), "fused16": _ring(2, 8), "fused32": _ring(2, 8, **_TWO_CONSUMERS),
               "fused48": _ring(2, 8), "fused64": _ring(2, 6), "fused96": _ring(1, 8), "fused128": _ring(1, 8)}
#: fallbacks of the default fused configs for K that is not a multiple of their ``HopperDequantConfig.k_multiple``,
#: first that fits: fewer chunks per stage, deeper rings (H100 measurements, ``docs/perf-notes.md``, "Fourth session";
#: fused32 with 4 consumers and 2 chunks per stage lost to 2 consumers with 4, 22.4 against 21.0 us, eighth session)
_FUSED_K_FALLBACKS = {"fused8": (_ring(2, 8), _ring(1, 8)), "fused16": (_ring(2, 8), _ring(1, 8)),
                      "fused32": (_ring(4, 8, **_TWO_CONSUMERS), _ring(2, 8, **_TWO_CONSUMERS),
                                  _ring(1, 8, **_TWO_CONSUMERS)),
                      "fused48": (_ring(2, 8), _ring(1, 8)), "fused64": (_ring(2, 6), _ring(1, 8)),
                      "fused96": (_ring(1, 8),), "fused128": (_ring(1, 8),), "fused128x2": (_ring(1, 6),)}


@functools.lru_cache(maxsize=None)
def _fast_fused_decode(weight_format, dtype, zeros_mode=None) -> bool:
    """Whether the fused kernel's decode (mode "scale" or the zeros mode, sm_90a) is a fast program; without one
    (float4_e2m1fn -> bfloat16, uint8 -> bfloat16 with "original" / "quantized" zeros) the fused paths are correct
    but slow (the reference converter: nf4 before its table decode took 167 us at M=32 on the H100 at 8192^2, 0.31x
    cuBLAS), so the plan leaves them out."""
    from .dequant_parts import kernel_decode_program

    return bool(kernel_decode_program(weight_format, dtype, zeros_mode or "scale", "sm_90a").fast)


def _interpret_default() -> bool:
    return os.environ.get("MMAEMIT_INTERPRET", "") not in ("", "0")


class DequantGemm:
    """``C = A @ dequant(W)^T`` for any M with kernels built once (see the module doc).

    ``N, K, group_size, dtype, weight_format, zeros_mode``: as :func:`~mmaemit.kernels.dequant_gemm.make_dequant_gemm`
    (W / S / Z in the kernel layout, ``mmaemit.dequant.kernel_layout.kernel_arguments``). ``arch``: None = the
    visible GPU's (sm_90a rules without one when ``interpret``, else sm_80 rules). ``large_m``: first M of the
    ``dense_mid`` path (sm_90a without the fused paths; None = :data:`LARGE_M`). ``wide_m``: first M of ``dense``
    there (None = :data:`WIDE_M`). ``dense_m``: first M of ``dense`` when the fused paths serve below it (None:
    no ``dense`` where ``fused256`` fits and :func:`fused_serves_every_m`, else :data:`FUSED_DENSE_M`). ``fused``:
    False keeps the second plan (tiled / dense_mid) where the fused paths would serve, None uses the fused paths
    wherever they fit, True insists on them (``UnsupportedConfigError`` naming the reason where none fits).
    ``configs``: per-path config overrides, keys from :data:`PATHS`, :data:`FUSED_PATHS`,
    :data:`EXTRA_PATHS` plus ``"hopper"`` / ``"hopper_mid"`` (the GEMMs of the dense paths; ``"dense"`` configures
    their dequant kernel). ``interpret``: run on the CPU interpreter. ``gated`` ("silu" / "gelu_tanh",
    :mod:`mmaemit.kernels.gated`): W holds a gate and an up weight interleaved by 16 rows (``interleave_gated``), and
    a call returns act(gate) * up, [M, N / 2]: the GEMVs gate in their epilogue (:meth:`gates_in_kernel`, float32,
    one rounding), the other paths gate their [M, N] output with torch (``gate_into``: as an unfused module).
    ``fill_waves``: True (default) lets narrow N take several rows of shorter tiles where one row of the M-tall tile
    leaves half the SMs or more idle (:data:`WAVE_FILL_PATHS`); False plans by M alone. ``plan``: spans
    [(path, first M, last M)] that replace the rules' plan from M=1 up to the last span's last M (the rules serve
    above it), e.g. a measured plan (:func:`~mmaemit.kernels.dequant_plan.measure_plan`, whose result is accepted
    as is); :meth:`set_plan` does the same on a built object. :attr:`rule_ranges` keeps the rules' plan.
    """

    def __init__(self, N, K, group_size=128, dtype="float16", weight_format="int4", zeros_mode=None, arch=None, *,
                 large_m=None, wide_m=None, dense_m=None, fused=None, configs=None, interpret=None, gated=None,
                 fill_waves=True, plan=None):
        from mmaemit.arch import as_arch, device_arch
        from mmaemit.errors import ArchError

        self.interpret = _interpret_default() if interpret is None else bool(interpret)
        if arch is None:
            try:
                arch = device_arch().name
            except ArchError:
                arch = "sm_90a" if self.interpret else "sm_80"
        self.arch = as_arch(arch).name
        self.N, self.K = int(N), int(K)
        if not isinstance(fill_waves, bool):
            raise ArgumentError(f"fill_waves={fill_waves!r}; valid: True, False")
        self.dtype = canonical(dtype)
        if self.dtype not in ("float16", "bfloat16"):
            raise UnsupportedConfigError(f"activation dtype must be one of {choices(['float16', 'bfloat16'])}, "
                                         f"not {self.dtype!r}")
        self.group_size = self.K if group_size in (None, -1) else int(group_size)
        if self.group_size <= 0 or self.K % self.group_size or self.group_size % 64:
            raise TileShapeError(f"group_size={group_size} must divide K={K} and be a multiple of 64 (or -1)")
        self.bits, _ = check_scheme(weight_format, zeros_mode)
        self.weight_format, self.zeros_mode = weight_format, zeros_mode
        self.gated = check_gate(gated)
        if self.gated and self.N % 32:
            raise TileShapeError(f"gated={gated!r}: N={N} rows must be 16-row gate / up block pairs (a multiple of 32)")
        #: output columns: N, or N / 2 gated
        self.n_out = self.N // 2 if self.gated else self.N
        extra = ("hopper", "hopper_mid") + FUSED_PATHS + EXTRA_PATHS
        unknown = set(configs or {}) - set(PATHS) - set(extra)
        if unknown:
            raise UnsupportedConfigError(f"configs keys must be among {choices(PATHS + extra)}, not "
                                         f"{sorted(unknown)}")
        self.configs = dict(_DEFAULTS, **(configs or {}))
        if "fused160" not in (configs or {}):
            self.configs["fused160"] = fused160_config(self.N, self.K)
        for path in FUSED_PATHS:
            if path not in (configs or {}):       # a config the caller passes is never changed
                self.configs[path] = self._default_fused(path, self.configs[path])
        if "gemv16" not in (configs or {}):
            self.configs["gemv16"] = gemv16_config(self.N, self.K)
        if "gemv8" not in (configs or {}):
            self.configs["gemv8"] = gemv8_config(self.N, self.K)
        hopper = self.arch == "sm_90a"
        self.large_m = (LARGE_M if large_m is None else int(large_m)) if hopper else None
        self.wide_m = (WIDE_M if wide_m is None else int(wide_m)) if hopper else None
        if hopper and self.wide_m < self.large_m:
            self.wide_m = self.large_m
        #: first M of ``dense`` in the fused plan (None: not in it)
        self.dense_m = (None if not hopper else int(dense_m) if dense_m is not None else
                        None if self._fits("fused256") and fused_serves_every_m(weight_format) else FUSED_DENSE_M)
        self.use_fused = fused
        self._spec = dict(N=self.N, K=self.K, group_size=group_size, dtype=self.dtype, weight_format=weight_format,
                          zeros_mode=zeros_mode, arch=self.arch, large_m=large_m, wide_m=wide_m, dense_m=dense_m,
                          fused=fused, configs=dict(configs or {}), interpret=self.interpret, gated=self.gated,
                          fill_waves=fill_waves, plan=None)
        self.fill_waves = fill_waves
        #: the rules' plan (this module's doc); :attr:`ranges` is the plan in use
        self.rule_ranges = self._plan()
        self.ranges = list(self.rule_ranges)
        self._funcs: dict = {}
        self._kernels: dict = {}
        self._sk_buffers: dict = {}
        if plan is not None:
            self.set_plan(plan)

    def set_plan(self, plan):
        """Serve M = 1 .. L by ``plan`` and M > L by the rules' plan (:attr:`rule_ranges`); returns self.

        ``plan``: spans [(path, first M, last M)] from M=1, each starting where the previous one ends, L the last
        span's last M (a finite int), every path one of :meth:`runnable_paths` and a GEMV only up to its ``m_max``;
        or an object with a ``spans`` attribute holding them (a
        :class:`~mmaemit.kernels.dequant_plan.MeasuredPlan`); None restores the rules' plan. Paths not compiled yet
        compile on first use (or :meth:`warmup`)."""
        if plan is None:
            self.ranges = list(self.rule_ranges)
            self._spec["plan"] = None
            return self
        spans = [tuple(s) for s in getattr(plan, "spans", plan)]
        runnable = self.runnable_paths()
        nxt = 1
        for s in spans:
            if len(s) != 3 or not isinstance(s[0], str) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                       for v in s[1:]):
                raise ArgumentError(f"plan span {s!r}: each span is (path, first M, last M) with int bounds")
            path, lo, hi = s
            if path not in runnable:
                raise UnsupportedConfigError(f"plan span {s!r}: path {path!r} cannot run this problem here; valid: "
                                             f"{choices(runnable)}")
            if lo != nxt or hi < lo:
                raise ArgumentError(f"plan span {s!r}: spans must cover M = 1, 2, ... in order without gaps (this "
                                    f"one should start at {nxt} and end at or after its start)")
            if path.startswith("gemv") and hi > int(path[4:]):
                raise ArgumentError(f"plan span {s!r}: path {path} serves M <= {path[4:]}, not up to {hi}")
            nxt = hi + 1
        if not spans:
            raise ArgumentError("plan: at least one span (path, 1, last M); None restores the rules' plan")
        self.ranges = join_spans(spans + clip_spans(self.rule_ranges, spans[-1][2] + 1, None))
        self._spec["plan"] = spans
        return self

    def _default_fused(self, path, cfg):
        """A fused path's default config for this problem: the 8-bit ring shape; for K that is not a multiple of its
        ``k_multiple`` the largest fallback that divides K (else unchanged, and the path drops out of the plan in
        ``_fits``); then fewer stages while the ring exceeds shared memory (8-bit weight boxes), down to
        ``min_stages`` in steps that keep the stages a multiple of the k_split consumers (``stage_step``)."""
        if self.bits == 8 and path in _FUSED_8BIT:
            cfg = dataclasses.replace(cfg, **_FUSED_8BIT[path])
        if self.K % cfg.k_multiple:
            for ring in _FUSED_K_FALLBACKS.get(path, ()):
                alt = dataclasses.replace(cfg, **ring)
                if self.K % alt.k_multiple == 0:
                    cfg = alt
                    break
        while cfg.stages - cfg.stage_step >= cfg.min_stages and fused_smem_bytes(
                cfg, self.bits, self.group_size, self.zeros_mode is not None) > SMEM_LIMIT:
            cfg = dataclasses.replace(cfg, stages=cfg.stages - cfg.stage_step)
        return cfg

    # ------------------------------------------------------------------------------------------------ planning
    def _fits(self, path) -> bool:
        N, K, cfg = self.N, self.K, self.configs.get(path)
        if path.startswith("gemv"):
            return N % (16 * cfg.n_blocks) == 0 and K % (64 * cfg.k_slices * 2) == 0
        if path.startswith("tiled"):
            return N % cfg.block_n == 0
        if path == "wgmma":
            return N % (64 * cfg.warpgroups * cfg.m64_per_wg) == 0
        if path in FUSED_PATHS:
            return (N % cfg.weight_rows == 0 and K % cfg.k_multiple == 0
                    and self.weight_format in HOPPER_FUSED_FORMATS
                    and fused_smem_bytes(cfg, self.bits, self.group_size, self.zeros_mode is not None) <= SMEM_LIMIT)
        return True

    def _fused(self) -> bool:
        """Whether the fused Hopper paths serve M > 16 (M >= 1 for :data:`FUSED_SMALL_M_BITS`; sm_90a, a format of
        ``HOPPER_FUSED_FORMATS`` whose scaled decode, with its zeros mode, has a fast program for the dtype, N a
        multiple of 64)."""
        fits = (self.large_m is not None and any(map(self._fits, FUSED_PATHS))
                and _fast_fused_decode(self.weight_format, self.dtype, self.zeros_mode))
        if self.use_fused and not fits:
            raise UnsupportedConfigError(
                f"fused=True, but no fused Hopper path fits: they need sm_90a (arch={self.arch}), weight_format in "
                f"{choices(HOPPER_FUSED_FORMATS)} (got {self.weight_format!r}), a fast scaled decode of it for "
                f"{self.dtype} with zeros_mode={self.zeros_mode!r} (fp4 / fp8 -> bfloat16, and uint8 -> bfloat16 "
                f"with 'original' / 'quantized' zeros have none: the fused kernel would run the reference "
                f"converter, ~0.3x cuBLAS at M=32) and N a multiple of 64 (N={self.N}); pass fused=None to "
                f"use them where they fit")
        return self.use_fused is not False and fits

    @staticmethod
    def _spans(paths, start):
        """[(path, first M, last M or None)]: each path from its first M (the first path from 1) up to the next's."""
        return [(p, 1 if i == 0 else start[p], start[paths[i + 1]] - 1 if i + 1 < len(paths) else None)
                for i, p in enumerate(paths)]

    def _fill_waves(self, spans):
        """``spans`` with each M up to :data:`WAVE_FILL_MAX_M` served instead by the :data:`WAVE_FILL_PATHS` path
        that gives the most tiles (tile rows of M x N / its weight rows) within one wave of its config's ``num_sms``
        or the visible GPU's SMs, ties to the taller tile, where that is at least twice the tiles of the span's own
        fused path (its one tall row of tiles then leaves half the SMs or more idle: narrow N such as attention's
        1024 x 4096 and 4096 x 4096 or the MLP's 4096 x 14336) and its rows (M rounded up to its tile rows) exceed
        the span path's by at most a quarter of its tile (:func:`wave_fill_pads`); where none does and the span's
        path is ``fused192`` or ``fused128x2``, the shortest :data:`TWO_ROW_PATHS` path whose tile holds M in two
        rows within one wave. Wide N keep their plan (8192 x 8192 already fills a wave)."""
        sms = _sm_count(None)
        cands = [p for p in WAVE_FILL_PATHS if self._fits(p)]

        def tiles(p, M):
            cfg = self.configs[p]
            return -(-M // cfg.block_m) * (self.N // cfg.weight_rows)

        def wave(p):
            return self.configs[p].num_sms or sms

        def choose(M, p0):
            if p0 not in FUSED_PATHS or not cands:
                return p0
            fill = [(tiles(p, M), self.configs[p].block_m, p) for p in cands
                    if self.configs[p].block_m < M and tiles(p, M) <= wave(p)
                    and wave_fill_pads(M, self.configs[p].block_m, self.configs[p0].block_m)]
            best = max(fill, default=None)
            if best and best[0] >= 2 * tiles(p0, M):
                return best[2]
            if p0 in _TWO_ROW_REPLACES:     # two rows of block_m x 64 tiles (TWO_ROW_PATHS)
                two = [(self.configs[p].block_m, p) for p in TWO_ROW_PATHS if self._fits(p)
                       and self.configs[p].weight_rows == 64 and self.configs[p].block_m < M <= 2 * self.configs[p].block_m
                       and tiles(p, M) <= wave(p)]
                if two:
                    return min(two)[1]
            return p0

        out = []
        for p0, lo, hi in spans:
            last = min(WAVE_FILL_MAX_M, hi or WAVE_FILL_MAX_M)
            out += [(choose(M, p0), M, M) for M in range(lo, last + 1)]
            if hi is None or hi > WAVE_FILL_MAX_M:
                out.append((p0, max(lo, WAVE_FILL_MAX_M + 1), hi))
        return join_spans(out)

    def _plan(self):
        """[(path, first M, last M or None)] in M order: each path from its first M up to the next path's; a path
        whose tiles do not fit N / K drops out and the path below it extends over its range."""
        if self._fused():
            end = self.dense_m if self.dense_m is not None else float("inf")
            start = dict({"gemv8": 1, "gemv16": 9}, **_FUSED_START, dense=end)
            small = (("fused8", "fused16") if self.bits in FUSED_SMALL_M_BITS
                     and self._fits("fused8") and self._fits("fused16") else ("gemv8", "gemv16"))
            waves = [p for p in ONE_WAVE_PATHS if one_wave_fits(self.N, self.K) and self._fits(p) and start[p] < end]
            skip = [p for p in ONE_WAVE_PATHS if p not in waves]
            if waves:       # fused128x2 from the row after the last one-wave path's tile rows
                start["fused128x2"] = _DEFAULTS[waves[-1]].block_m + 1
            elif wide_tiles_fill(self.N) and self._fits("fused256"):    # fused256 instead of fused128x2
                start["fused256"] = _FUSED_START["fused128x2"]
                skip.append("fused128x2")
            paths = [p for p in small + tuple(p for p in FUSED_PATHS if _FUSED_START[p] > 16)
                     if p in waves or p not in skip and self._fits(p) and start[p] < end]
            spans = self._spans(paths + (["dense"] if self.dense_m is not None else []), start)
            return self._fill_waves(spans) if self.fill_waves else spans
        start = {"gemv8": 1, "gemv16": 9, "gemv32": 17, "tiled64": 33, "tiled128": 65, "dense_mid": self.large_m,
                 "dense": self.wide_m}
        paths = [p for p in PATHS if start[p] is not None and self._fits(p)]
        if self.large_m is not None:
            paths = [p for p in paths if p.startswith("dense") or start[p] < self.large_m]
            if self.wide_m == self.large_m:
                paths.remove("dense_mid")
        served = paths[-1][4:] if paths and paths[-1].startswith("gemv") else "0"   # the largest GEMV's m_max
        if not any(p.startswith("tiled") or p == "dense" for p in paths):
            raise TileShapeError(f"no dequant path serves M > {served} for N={self.N}, K={self.K}: the tiled path "
                                 f"needs N a multiple of block_n ({self.configs['tiled64'].block_n} or "
                                 f"{self.configs['tiled128'].block_n})")
        if paths[-1].startswith("gemv"):
            raise TileShapeError(f"no dequant path serves M > {served} for N={self.N}, K={self.K}")
        return self._spans(paths, start)

    def runnable_paths(self) -> list:
        """Every path that can run this problem here (the plan's and those it leaves unused), in :data:`PATHS`
        order."""
        return [p for p in PATHS + FUSED_PATHS + EXTRA_PATHS if self._fits(p) and
                (not p.startswith(("dense", "wgmma", "fused")) or self.large_m is not None)]

    def path_for(self, M: int) -> str:
        """The path that serves ``M`` rows."""
        if M < 1:
            raise ArgumentError(f"M must be >= 1, got {M}")
        path = span_path(self.ranges, M)
        if path is None:
            raise AssertionError(f"no path for M={M}: {self.ranges}")
        return path

    # ------------------------------------------------------------------------------------------------ building
    def _build(self, path):
        kw = dict(weight_format=self.weight_format, zeros_mode=self.zeros_mode)
        N, K, G, dt, arch = self.N, self.K, self.group_size, self.dtype, self.arch
        cfg = self.configs.get(path)
        if path.startswith("gemv"):
            return (make_dequant_gemv(None, N, K, G, dt, cfg, arch, m_max=int(path[4:]),
                                      gated=self.gated if self.gates_in_kernel(path) else None, **kw)[0],)
        if path.startswith("tiled"):
            return (make_dequant_gemm_tiled(None, N, K, G, dt, cfg, arch, **kw)[0],)
        if path == "wgmma":
            return (make_dequant_gemm_wgmma(None, N, K, G, dt, cfg, arch, **kw)[0],)
        if path in FUSED_PATHS:
            return (make_dequant_gemm_hopper(None, N, K, G, dt, cfg, arch, **kw)[0],)
        if path == "dequant":
            return (make_dequant_to_dense(N, K, G, dt, self.configs["dense"], arch, **kw),)
        hcfg = self.configs["hopper" if path == "dense" else "hopper_mid"]
        return self.funcs("dequant")[0], make_gemm_hopper(None, N, K, dt, config=hcfg, arch=arch)[0]

    def gates_in_kernel(self, path) -> bool:
        """Whether ``path`` applies the gate in its epilogue (with ``gated``: the GEMVs with an even ``n_blocks``);
        other paths write the full [M, N] product to a scratch and gate it with torch (``gate_into``)."""
        return bool(self.gated) and path.startswith("gemv") and self.configs[path].n_blocks % 2 == 0

    def funcs(self, path):
        """The PrimFunc(s) of a path (built once)."""
        if path not in self._funcs:
            self._funcs[path] = self._build(path)
        return self._funcs[path]

    def kernels(self, path, cubin_cache=None):
        """The compiled kernel(s) of a path (compiled once; ``cubin_cache`` as :func:`mmaemit.compile`)."""
        if path not in self._kernels:
            import mmaemit

            if path.startswith("dense"):       # one dequant kernel serves both dense paths
                self._kernels[path] = (self.kernels("dequant", cubin_cache)[0],
                                       mmaemit.compile(self.funcs(path)[1], target=self.arch, cubin_cache=cubin_cache))
            else:
                self._kernels[path] = tuple(mmaemit.compile(f, target=self.arch, cubin_cache=cubin_cache)
                                            for f in self.funcs(path))
        return self._kernels[path]

    def spec(self) -> dict:
        """The constructor arguments that rebuild this object (``arch`` resolved), e.g. in a worker process."""
        return dict(self._spec)

    def warmup(self, workers=None):
        """Build (and, off the interpreter, compile) every path of the plan now; returns self. ``workers``: as
        :func:`warmup_all` (None: the cubins of the paths not compiled yet are built in parallel worker processes,
        then loaded here; 1: one after the other in this process)."""
        warmup_all([self], workers)
        return self

    # ------------------------------------------------------------------------------------------------ calling
    def __call__(self, A, W, S, Z=None, out=None):
        """C [M, N] = A [M, K] @ dequant(W)^T (``out``: an [M, N] tensor of A's dtype to write, else allocated);
        with ``gated``: C [M, N / 2] = act(gate part) * (up part) (:mod:`mmaemit.kernels.gated`)."""
        import torch

        if (Z is None) != (self.zeros_mode is None):
            raise ArgumentError(f"zeros_mode={self.zeros_mode!r}: Z must be {'given' if self.zeros_mode else 'None'}")
        if not isinstance(A, torch.Tensor) or A.dim() != 2 or A.shape[1] != self.K:
            raise ArgumentError(f"A must be a 2-D [M, {self.K}] tensor, got "
                                f"{tuple(A.shape) if isinstance(A, torch.Tensor) else type(A).__name__}")
        M = A.shape[0]
        if out is None:
            out = torch.empty((M, self.n_out), dtype=A.dtype, device=A.device)
        if M == 0:
            return out
        return self.run_path(self.path_for(M), A, W, S, Z, out=out)

    def run_path(self, path, A, W, S, Z=None, out=None):
        """Run one named path (any path serves any M >= 1, except the GEMVs: M <= 8 / 16), e.g. to time the
        paths against each other, including paths the plan does not use (the tiled paths on sm_90a); ``__call__``
        picks by M."""
        import torch

        runnable = self.runnable_paths()
        if path not in runnable:
            raise UnsupportedConfigError(f"path {path!r} cannot run this problem here; valid: {choices(runnable)}")
        M = A.shape[0]
        if path.startswith("gemv") and M > int(path[4:]):
            raise ArgumentError(f"path {path} serves M <= {path[4:]}, not M={M}")
        if out is None:
            out = torch.empty((M, self.n_out), dtype=A.dtype, device=A.device)
        weights = (W, S) if Z is None else (W, S, Z)
        if self.gated and not self.gates_in_kernel(path):
            full = torch.empty((M, self.N), dtype=A.dtype, device=A.device)
            self._run(path, A, weights, full)
            return gate_into(self.gated, full, out)
        self._run(path, A, weights, out)
        return out

    def _run(self, path, A, weights, out):
        import torch

        if self.interpret:
            from mmaemit.interpret import interpret as run

            funcs = self.funcs(path)
            if path.startswith("dense"):
                scratch = torch.empty((self.N, self.K), dtype=A.dtype, device=A.device)
                self._check(run(funcs[0], *weights, scratch, arch=self.arch))
                self._check(run(funcs[1], A, scratch, out, arch=self.arch))
            else:
                self._check(run(funcs[0], A, *weights, out, *self._stream_k_buffers(path, A.device), arch=self.arch))
            return
        kernels = self.kernels(path)
        if path.startswith("dense"):
            scratch = torch.empty((self.N, self.K), dtype=A.dtype, device=A.device)
            kernels[0](*weights, scratch)
            kernels[1](A, scratch, out)
        else:
            kernels[0](A, *weights, out, *self._stream_k_buffers(path, A.device))

    def _stream_k_buffers(self, path, device) -> tuple:
        # a stream_k fused kernel's workspace and counters (stream_k_workspace): views of the device's shared
        # scratch (mmaemit.runtime.workspace), made once per path and device (every launch leaves the counters
        # zero, so a view of a scratch that has since grown stays valid), or fresh zeros on the interpreter
        import torch

        cfg = self.configs.get(path)
        if not (path in FUSED_PATHS and cfg.stream_k):
            return ()
        key = (path, str(device))
        if key in self._sk_buffers:
            return self._sk_buffers[key]
        (ws, _), (lk, _) = stream_k_workspace(cfg)
        if self.interpret:
            return torch.empty(ws, dtype=torch.float32), torch.zeros(lk, dtype=torch.int32)
        from mmaemit.runtime.workspace import scratch

        n_ws, n_lk = math.prod(ws), math.prod(lk)
        bufs = self._sk_buffers[key] = (scratch(device, torch.float32, n_ws)[:n_ws].view(ws),
                                        scratch(device, torch.int32, n_lk)[:n_lk].view(lk))
        return bufs

    @staticmethod
    def _check(report):
        if not report.ok:
            raise RuntimeError(f"the interpreter reported a problem: {report.summary()}")

    def __repr__(self):
        spans = ", ".join(f"{p} {lo}..{'' if hi is None else hi}" for p, lo, hi in self.ranges)
        gate = f", gated {self.gated}" if self.gated else ""
        return (f"DequantGemm(N={self.N}, K={self.K}, {self.weight_format} g{self.group_size}, {self.dtype}{gate}, "
                f"{self.arch}: {spans})")


def _prebuild_one(item):
    import time

    spec, path = item
    t = time.time()
    DequantGemm(**spec).kernels(path, cubin_cache=True)
    return path, time.time() - t


def _worker_main():
    """Entry of a build worker (:func:`_build_in_workers`): pickled [(spec, path)] on stdin, each compiled into the
    cubin cache."""
    import pickle
    import sys

    for item in pickle.loads(sys.stdin.buffer.read()):
        _prebuild_one(item)


def _build_in_workers(items, workers=None):
    """Compile [(DequantGemm spec, path)] into the cubin cache in fresh interpreter processes (not multiprocessing:
    its spawned children re-import the caller's ``__main__``, which breaks a script that calls ``warmup()`` outside
    an ``if __name__ == "__main__"`` guard). Raises ``RuntimeError`` with a worker's stderr if one fails."""
    import pickle
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    import mmaemit

    n = max(1, min(workers or os.cpu_count() or 4, len(items)))
    root = os.path.dirname(os.path.dirname(os.path.abspath(mmaemit.__file__)))
    env = dict(os.environ, MMAEMIT_CUBIN_CACHE="1",
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    code = "from mmaemit.kernels.dequant_dispatch import _worker_main; _worker_main()"

    def run(chunk):
        r = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(chunk), env=env, capture_output=True)
        if r.returncode:
            raise RuntimeError(f"a kernel build worker failed (exit {r.returncode}): "
                               f"{r.stderr.decode(errors='replace')[-2000:]}")

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(run, [items[i::n] for i in range(n)]))


def prebuild(specs, workers=None) -> float:
    """Compile the paths of several problems in worker processes into the on-disk cubin cache
    (``MMAEMIT_CUBIN_CACHE=1`` is set here; set it in the process that then uses the kernels, which only loads them).
    ``specs``: dicts of DequantGemm's arguments (``arch`` included) plus ``paths`` (None = every path). Returns the
    wall time in seconds."""
    import time

    os.environ["MMAEMIT_CUBIN_CACHE"] = "1"
    items = []
    for spec in specs:
        spec = dict(spec)
        paths = spec.pop("paths", None)
        for path in paths or [r[0] for r in DequantGemm(**spec).ranges]:
            items.append((spec, path))
    t = time.time()
    _build_in_workers(items, workers)
    return time.time() - t


def warmup_all(gemms, workers=None) -> float:
    """Build (and, off the interpreter, compile) the plan of every :class:`DequantGemm` in ``gemms`` (e.g. the
    distinct shapes of a model's layers); returns the wall time in seconds. ``workers``: None = with more than one
    path left to compile and nvcc at hand, the cubins are built by up to ``os.cpu_count()`` worker processes (fresh
    interpreters; a failed worker is reported as a ``PerformanceWarning`` and its paths compile here instead)
    into the on-disk cubin cache (``$MMAEMIT_CACHE_DIR``) and then loaded here (``cubin_cache=True``: each load still
    lowers the PrimFunc, ~1/3 of a compile); an int caps the processes; 1 compiles one after the other in this
    process. After it, a call never compiles."""
    import time

    from mmaemit.errors import ToolchainError
    from mmaemit.runtime.toolchain import find_nvcc

    t = time.time()
    todo = []
    for g in gemms:
        for path, _, _ in g.ranges:
            if g.interpret:
                g.funcs(path)
            elif path not in g._kernels:
                todo.append((g, path))
    cache = None
    if (workers is None or workers > 1) and len(todo) > 1:
        try:
            find_nvcc()
        except ToolchainError:
            pass                      # no nvcc: TVM's own JIT, serially
        else:
            try:
                _build_in_workers([(g.spec(), p) for g, p in todo], workers)
            except RuntimeError as e:   # what the workers did not build compiles below, in this process
                import warnings

                from mmaemit.errors import PerformanceWarning

                warnings.warn(f"parallel warm-up failed, compiling in this process instead: {e}", PerformanceWarning,
                              stacklevel=2)
            cache = True
    for g, path in todo:
        g.kernels(path, cubin_cache=cache)
    return time.time() - t
