"""Hopper (sm_90a) fused dequant GEMM: TMA + mbarrier ring + warp-specialized wgmma, decode inside the pipeline.

C[M, N] = A[M, K] @ dequant(W)[N, K]^T with W / S (and zero points Z) in the kernel layout of
:mod:`mmaemit.dequant.kernel_layout` (``kernel_arguments``), so the packed weight crosses HBM once, at its 1, 2, 4 or 8
bits (no fp16 scratch as in ``dense`` paths).
Like :mod:`mmaemit.kernels.dequant_gemm_wgmma` it computes ``C^T = W @ A^T``: the decoded weights are the
register-sourced A operand of ``wgmma`` (RS form), the activations the shared-memory B operand.

Per CTA (persistent, ``PersistentTileScheduler``; with ``stream_k`` the last wave's stages in per-CTA ranges,
``StreamKScheduler``), per output tile of ``block_m`` activation rows x
``64 * consumers`` weight rows, per ring stage of ``chunks_per_stage`` 64-wide K chunks:

* producer warpgroup (one elected thread, or two filling alternate stages with ``producers=2``): waits for a free
  ring stage (``MbarrierRing``), arms the full barrier and issues the stage's TMA box loads: per chunk the activation
  tile (``block_m`` x 64, 128-byte swizzle, the wgmma B layout: ``TmaTile.for_layout`` of the emitter's shared
  layout; rows >= M are zero-filled by TMA bounds), one box of packed weights (4 n16 blocks per 64-row group x the
  stage's chunks of kernel-layout words: 128 x bits contiguous bytes per block and chunk) and one box of group scales
  (32 bytes per n16 block and group; one box per chunk where a group straddles stages; zero points, when the format
  has them, in a second box of the same shape). The ring costs a roughly fixed
  time per stage (measured on the H100), so a stage of 4 chunks at small M;
* consumer warpgroups (64 weight rows each, one n16 block per warp): wait for the stage, read the lane's ``bits``
  words (4 bytes x bits), **re-pair them across the lane quad** (below), decode them straight into the wgmma A registers
  (``kernel_decode_program``, register order ``wgmma_a_order``), issue 4 ``wgmma m64n{block_m}k16`` (RS), commit
  (``chunks_per_group=2``: two chunks decode into their own A buffers, then their 8 wgmmas go as one group);
  ``in_flight=1`` (default): two A-register buffers (K loop unrolled by 2), ``wait_group 1`` after the commit retires
  the previous chunk, whose stage is then released, so a chunk decodes while the previous one's wgmmas run; the
  tile's last chunk retires every group itself (``wait_group 0``: with that wait after the loop, ptxas moved the
  epilogue's accumulator reads above it); ``in_flight=0``: ``wait_group 0`` in the same chunk. Every consumer thread
  arrives on the empty barrier (the words are read with ``ld.shared``, not only by the async proxy); with
  ``k_split`` the 2 or 4 consumers share one 64-row group, deal the chunks round robin and add their sums through
  shared memory before the store (their own slots, or with ``handover="stage"`` the ring stages of their last units,
  kept past the K loop and released by consumer 0 after the store);
* epilogue per 64-row group: accumulators -> transposed staging tile [block_m, 64] -> one TMA box store (rows >= M
  are clipped by TMA bounds).

Why the re-pairing: the kernel layout permutes K inside every 64-chunk so that lane c of a quad holds the real
columns 16c .. 16c + 15 (its word s holds k16 step s: real k = 16c + 4s + 2h + e for register half h). That order
suits the mma.sync kernels' 16-byte activation loads, but TMA copies the activations in real order and wgmma then
contracts step S over real k = 16S + 8H + 2c + e for lane c. So lane c needs, for step S, the codes that lane S
holds in its steps c//2 (H = 0) and c//2 + 2 (H = 1), register half c % 2. At 4 bits (one word per step) each lane
builds 4 words ``Y[c'] = word[c'//2] half c'%2 | word[c'//2 + 2] half c'%2`` (code moves derived from
:func:`mmaemit.dequant.interleave.bit_positions`, :func:`quad_word_plan`), and a 4 x 4 transpose over the quad
(two ``shfl.sync.bfly`` stages, 4 shuffles per chunk) hands lane c the word ``Y_S[c]`` of every lane S: a word in
the decode program's own input order for wgmma k16 step S. At 8 bits a bundle is two words (one per n8 half; two
transposes); at 2 and 1 bits a bundle fills part of a word, placed as for step 0 and shifted into its decode word
after the transpose (``QuadRepairPlan.assemble``). Scales are per (row, group): unchanged.

Scales: ``S`` [N/16, K/G, 4, 4] is viewed as [N/16, K/G, 16] (a row of 4 halves is below TMA's 16-byte box
minimum; 16 halves are 32 bytes) and travels in the ring; each consumer lane reads its 8 bytes with one
``ld.shared.v2`` after the stage's barrier (a per-chunk ``ld.global`` used to sit in the consumer's critical path).
Zero points ``Z`` (same layout; values in A's dtype, int16 codes for "quantized", copied as 16-bit words) take the
same way and reach the decode program (``zeros_mode``) as pairs like the scales: asymmetric GPTQ and AWQ checkpoints
run here too.
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

from mmaemit.dequant.kernel_layout import CHUNK
from mmaemit.dtypes import canonical
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices
from mmaemit.kernels.dequant_parts import WEIGHT_FORMATS
from mmaemit.runtime.launch import programmatic_dependent_launch

__all__ = ["HopperDequantConfig", "make_dequant_gemm_hopper", "quad_word_plan", "QuadRepairPlan", "HOPPER_FUSED_FORMATS",
           "fused_smem_bytes", "scale_boxes", "ACTIVATION_BOXES", "HANDOVERS", "QUAD_REPAIRS",
           "DECODE_VARIANTS", "stream_k_workspace", "stream_k_scheduler"]

#: weight formats of the fused Hopper path: every kernel format (1, 2, 4 and 8 bits: the quad re-pairing moves codes,
#: whatever they mean; the decode is the format's own program), one scale per (row, group), zero points (every
#: ``zeros_mode``) for the unsigned formats. int4_ob is what symmetric GPTQ checkpoints import as; asymmetric GPTQ
#: and AWQ import as uint4 with zeros.
HOPPER_FUSED_FORMATS = WEIGHT_FORMATS
#: how a ring stage's activations travel (``HopperDequantConfig.activation_boxes``)
ACTIVATION_BOXES = ("chunk", "stage")
#: how k_split consumers hand their sums to consumer 0 (``HopperDequantConfig.handover``)
HANDOVERS = ("parallel", "rounds", "stage")
#: decode program variants (``HopperDequantConfig.decode_variant``): "auto" or one of ``decode.VARIANTS``
DECODE_VARIANTS = ("auto", "shift", "marlin")
#: how a lane gets its quad partners' codes (``HopperDequantConfig.quad_repair``)
QUAD_REPAIRS = ("shuffle", "shared")


@dataclass(frozen=True)
class HopperDequantConfig:
    """Tile configuration. ``block_m``: activation rows per tile (the wgmma N: multiple of 8, 8..256);
    ``consumers``: math warpgroups of 64 weight rows each (1 or 2; with ``k_split`` 2 or 4 on one 64-row group);
    ``stages``: ring depth (>= 2); ``panel``: tile
    rows per rasterization panel; ``num_sms``: persistent grid (None: the visible GPU's SM count, 132 without one).
    ``in_flight``: 1 = two A-register buffers (K loop unrolled by 2): chunk kt decodes while chunk kt - 1's wgmmas
    run, retired after kt is issued; 0 = retire each chunk's wgmmas before the next decode (one buffer).
    ``k_split`` (``consumers`` 2 or 4, K a multiple of 64 x consumers): all consumer warpgroups work on the same 64
    weight rows, consumer c on the chunks kt = c (mod consumers), and their fp32 sums meet in shared memory before
    the store: 2 or 4 warps per scheduler instead of one (measured on the H100 at M <= 128: 2 consumers 3-7 %
    faster than one, 4 no faster than 2; ``docs/perf-notes.md``). 4 consumers need ``consumer_regs`` <= 112 with
    ``producer_regs=24`` (640 threads start with 96 registers each) and so ``block_m`` <= 96. With ``k_split``
    ``stages`` is a multiple of ``consumers`` (:attr:`stage_step`): a consumer waits for a stage by its mbarrier
    phase parity, which is sound only when the stage's previous round was its own unit.
    ``producers`` (1 or 2): threads of the producer warpgroup (lane 0 of warps 0 and 1) that issue the loads, each
    every ``producers``-th chunk (its own stages; ``stages`` a multiple of ``producers``): per chunk a producer waits
    on an mbarrier, arms one and issues three TMA copies.
    ``chunks_per_stage`` (1, 2 or 4): 64-wide K chunks per ring stage: one barrier round, one weight box and one
    scale box (per group in the stage) for that many chunks; stages then hold that many times the bytes. With
    ``k_split`` the consumers take whole stages round robin (K a multiple of 64 x chunks_per_stage x consumers).
    ``activation_boxes``: ``"chunk"`` loads a stage's activations as one TMA box per chunk; ``"stage"`` as one box
    for all its chunks (a 3-D view of A, [K / 64, M, 64], whose box lands the chunk tiles one after another).
    ``handover`` (``k_split``): ``"parallel"`` gives each consumer c > 0 its own shared slot of fp32 sums, written at
    once (``consumers - 1`` slots); ``"rounds"`` one slot, written by consumers 1, 2, ... in turn, each added by
    consumer 0 before the next round (``consumers - 1`` barrier rounds): with 4 consumers two slots less shared
    memory for ring stages (measured on the H100: no faster; ``docs/perf-notes.md``, ninth session); ``"stage"``
    no slot at all: each consumer c > 0 keeps its last ring stage of the tile and writes its sums over the stage's
    activation bytes, consumer 0 adds them, stages its output tile in consumer 1's stage and releases those stages
    after the store has read it (needs ``chunks_per_stage`` >= 2, so that the sums fit, and ``in_flight=1``): the
    shared memory of the slots goes to ring stages (``fused128``: 6 stages of 2 chunks instead of 8 of one).
    ``pdl``: programmatic dependent launch (:mod:`mmaemit.runtime.launch`): ``griddepcontrol.launch_dependents`` at
    entry; the producer prefetches into L2 the weight boxes of its first tile's first ``pdl_prefetch`` stages (None:
    ``stages``; 0: none), then the producer threads and every consumer thread execute ``griddepcontrol.wait`` before
    the kernel reads activations or scales or writes anything (H100, 8192^2 int4, back-to-back calls: M=32 19.2-19.5
    against 19.4-19.8 us, M=128 34.5-34.7 against 35.5-37.0, the same at M=64 and 256; on by default, so that a next
    kernel can start early).
    ``quad_repair``: ``"shuffle"`` builds each quad partner's bundle from the lane's own words and transposes them
    over the quad (``shfl.sync.bfly``, 4 per bundle word and chunk); ``"shared"`` reads the partners' words straight
    from the ring stage instead (two ``ld.shared`` per bundle word, at per-lane offsets) and rotates the codes into
    place (:meth:`QuadRepairPlan.shared_terms`): no shuffles or selects, 5 fewer SASS instructions per chunk, but
    slower on the H100 (8192^2 int4: M=32 19.9-20.1 against 19.1-19.2 us, M=64 25.2-26.2 against 24.3-25.0, M=128
    36.4-37.4 against 34.2-34.8; ``docs/perf-notes.md``, tenth session).
    ``lookahead`` (with ``quad_repair="shuffle"``): a consumer loads the words of every chunk of a stage right after
    its barrier (one ``ld.shared`` each, at once) and issues chunk j + 1's quad shuffles before it decodes chunk j,
    so their latencies run under the decode and the wgmmas instead of stalling each chunk (ncu of fused64 had ~10 %
    of the consumers' samples at the first use of each chunk's words and ~6 % at the shuffles' results). Same bits;
    H100, 8192^2 int4: M=96 28.9-29.4 against 30.3-31.6 us, M = 32-64 within the spread, M=128 35.0-36.5 against
    33.1-34.3, so only ``fused96`` has it by default.
    ``chunks_per_group`` (1 or 2): 64-wide chunks per wgmma commit group. With 2 a consumer decodes chunk j into one
    A buffer and chunk j + 1 into another, then issues one ``wgmma.fence``, the 8 wgmmas of both and one commit: half
    the warpgroup synchronisations (a wgmma starts when all four warps of its warpgroup have issued it, so each one
    waits for the slowest warp's decode). With ``in_flight=1`` a pair decodes while the previous pair's wgmmas run
    (four A buffers, 32 more registers per consumer thread). Needs ``chunks_per_stage=4``.
    ``decode_variant``: the decode program's variant (:data:`DECODE_VARIANTS`): ``"auto"`` takes ``"marlin"`` where it
    exists (4-bit integer codes to float16: one shift per word instead of three, two of the four magic subtracts an
    exact ``fma`` by 1/16; :func:`mmaemit.dequant.decode.variants_of`) and ``"shift"`` elsewhere; an explicit variant
    the format lacks is an error; the same bits either way (H100, 8192^2 int4 fp16: M=48 20.7-21.1 us against
    21.5-22.3 with "shift"; ``docs/perf-notes.md``, fifteenth session).
    ``fit_rows``: the last tile row's activation boxes carry its rows (M - (tile rows - 1) x ``block_m``) rounded up
    to 8 instead of ``block_m``, one box per chunk whatever ``activation_boxes`` says (a second map of A, encoded
    per launch), so TMA does not zero-fill the rows past M every stage; the tile rows past that box are zeroed once
    per CTA (later whole-row loads and hand-over writes leave other values there, which only feed output rows the
    store clips). The same bits; H100, 8192^2 int4 fp16: fused128 at M=97 29.8-33.2 us against 41.4-41.5
    (``docs/perf-notes.md``, fifteenth session); H200 4096 x 14336, the short last row of two: fused64 M=65 37.2
    against 61.4, fused128 M=129 52.7 against 96.0; slower where the short row's stage box becomes a box per chunk
    and the row is not nearly empty (fused32, 1024 x 4096 M=200: 11.3 against 9.5; eighteenth session).
    ``stream_k``: where the last wave of whole tiles would leave a tenth or more of the SMs idle and spreading it
    saves the busiest SM at least ``stream_k_min_chunks`` 64-deep chunks of K (decided at run time from M:
    :func:`stream_k_scheduler`), that wave's K work is spread evenly over every SM instead: each CTA first takes
    its whole tiles, then a contiguous range of the remaining tiles' ring stages (whole k_split rounds of stages, at
    least 1024 of K where there is enough). A piece that is not a whole tile writes its fp32 sums to a global
    workspace and adds to the tile's counter; the piece that completes the tile sums every piece's slot in K order
    (the same result whatever order the CTAs finish in) and stores the tile. The kernel then takes two more
    arguments after C (:func:`stream_k_workspace`): the fp32 workspace and the int32 counters, zero before the first
    launch (every launch leaves them zero). Launches that share a workspace must not run concurrently (one stream at
    a time). The grid is always the SM count. A tile of a single k_split round of stages cannot be cut: that kernel
    runs whole tiles (and ignores the two arguments).
    ``stream_k_min_chunks``: the pieces cost ~5 us per launch whatever their size (int4 g128, fp16, data-parallel
    against stream-K: H200 4096 x 4096 fused64 M=64 11.8 / 12.9 us, saving 32 chunks of the busiest SM; H200 4096 x
    7168 18.4 / 17.1, saving 56; H100 4096 x 14336 34.4 / 28.3, saving 112; H100 14336 x 4096 fused128 M=128 31.9 /
    36.6, saving 16), so the tail applies only where the busiest SM saves at least this many chunks (48: about 6 us
    of fused64's work and 11 of fused128's).
    ``stream_k_waves``: the most whole waves a launch may run before its tail (0: only launches of less than one
    wave; None: any). With whole waves first the H100 runs at its power cap, and evening out the last wave raised
    the power and lowered the clock instead of the time (28672 x 8192, H100: fused32 M=32 65.8 / 64.7 us, fused64
    89.5 / 87.6, fused128 M=128 124.6 / 126.2, fused160 134.6 / 136.6; H200 sustained, fused128: 129.2 us at 1590
    MHz / 128.0 at 1485 MHz, 670 W, power-capped both); under one wave it pays (H100 4096 x 14336: fused48 29.2 /
    24.4, fused160 56.3 / 51.5, fused224 77.1 / 67.5, fused256 M=512 135.4 / 106.0; 1024 x 4096 fused128 14.3 /
    10.8; ``docs/perf-notes.md``, seventeenth session)."""

    block_m: int = 128
    consumers: int = 2
    stages: int = 4
    panel: int = 16
    producer_regs: int = 40
    consumer_regs: int = 232
    num_sms: int | None = None
    in_flight: int = 1
    k_split: bool = False
    producers: int = 1
    chunks_per_stage: int = 1
    activation_boxes: str = "stage"
    handover: str = "parallel"
    pdl: bool = True
    pdl_prefetch: int | None = None
    quad_repair: str = "shuffle"
    lookahead: bool = False
    chunks_per_group: int = 1
    decode_variant: str = "auto"
    fit_rows: bool = False
    stream_k: bool = False
    stream_k_min_chunks: int = 48
    stream_k_waves: int | None = 0

    @property
    def k_multiple(self) -> int:
        """The K multiple this config needs: 64-wide chunks x chunks per stage x the consumers that deal the
        stages round robin (``k_split``)."""
        return CHUNK * self.chunks_per_stage * (self.consumers if self.k_split else 1)

    @property
    def weight_rows(self) -> int:
        """Weight rows (output columns) per tile: 64 per consumer warpgroup, 64 with ``k_split`` (one shared group);
        N must be a multiple of it."""
        return 64 if self.k_split else 64 * self.consumers

    @property
    def min_stages(self) -> int:
        """The fewest ring stages this config can run with: ``in_flight=1`` holds a consumer's previous stage while
        it waits for its next one, which with ``k_split`` is ``consumers`` stages later (fewer stages deadlock);
        with ``k_split`` the stages are also a multiple of ``consumers`` (:attr:`stage_step`)."""
        least = max(2, (self.consumers if self.k_split else 1) * self.in_flight + 1)
        return -(-least // self.stage_step) * self.stage_step

    @property
    def stage_step(self) -> int:
        """What the stage count must be a multiple of: ``producers`` and, with ``k_split``, ``consumers``. Each
        producer and each k_split consumer then meets the same stages every ring round, so the unit one round before
        the one it waits for on a stage is its own, and it has waited for that unit's barrier phase; a parity wait
        cannot tell a phase from the one two rounds later (see :func:`make_dequant_gemm_hopper`)."""
        return math.lcm(self.producers, self.consumers if self.k_split else 1)


@dataclass(frozen=True)
class QuadRepairPlan:
    """How one lane quad turns its kernel-layout words into wgmma A-operand decode words (:func:`quad_word_plan`).

    ``words``: kernel-layout words per lane and 64-wide chunk (``bits``); ``bundle_words``: 32-bit words a lane
    sends to each quad lane (the 8 codes lane c' contracts at k16 step S = the sender's quad index: 1 word up to 4
    bits, 2 at 8 bits). ``build[c'][b]``: ``((src word, shift, mask), ...)``, bundle word b for quad lane c' =
    ``OR ((word[src] <<shift>>) & mask)`` (positive shift = left); a 4 x 4 transpose over the quad then hands lane c
    the bundles ``y[b][S]`` of every sender S. ``assemble[w]``: ``((S, b, shift), ...)``, decode word w =
    ``OR (y[b][S] << shift)``: the decode program's input for registers ``[w R, (w + 1) R)`` (R = 16 / bits) in the
    kernel layout's decode-slice order, now for wgmma's real-order k16 steps."""

    bits: int
    words: int
    bundle_words: int
    build: tuple
    assemble: tuple

    def shared_terms(self) -> tuple:
        """The receiving side of ``build``, for reading the partners' words from shared memory: per bundle word b,
        ``((mask, ((src word, left rotation) for receiver q = 0..3)), ...)``: bundle word b that lane S built for
        lane q = ``OR rotl(word_S[src], rotation) & mask`` (the rotation a shift's amount mod 32, equal to the shift
        under the mask: checked). Raises if a mask's terms differ between receivers in anything but word and shift."""
        out = []
        for b in range(self.bundle_words):
            masks = sorted({m for _, _, m in self.build[0][b]})
            if any(sorted(m for _, _, m in self.build[cp][b]) != masks for cp in range(4)):
                raise AssertionError(f"{self.bits}-bit: bundle word {b} has other masks for other receivers")
            terms = []
            for m in masks:
                per_q = []
                for cp in range(4):
                    (sw, sh), = [(sw, sh) for sw, sh, mm in self.build[cp][b] if mm == m]
                    rot = sh % 32
                    wrapped = ((1 << sh) - 1) if sh > 0 else ((0xFFFFFFFF << (32 + sh)) & 0xFFFFFFFF if sh < 0 else 0)
                    if m & wrapped:
                        raise AssertionError(f"{self.bits}-bit: a rotation by {rot} is not the shift {sh} under "
                                             f"mask {m:#x}")
                    per_q.append((sw, rot))
                terms.append((m, tuple(per_q)))
            out.append(tuple(terms))
        return tuple(out)

    @property
    def identity_assembly(self) -> bool:
        """Whether every decode word is one received bundle word unshifted (4 and 8 bits)."""
        return all(len(t) == 1 and t[0][2] == 0 for t in self.assemble)


def quad_word_plan(bits: int = 4) -> QuadRepairPlan:
    """The quad re-pairing of ``bits``-bit kernel-layout words (1, 2, 4 or 8) for the fused kernel's RS wgmma.

    The kernel layout gives lane c the real columns 16c .. 16c + 15 of its two rows g, g + 8 (step s, B-fragment
    register r = 2n + h, element e: real k = 16c + 4s + 2h + e); wgmma contracts a real-order activation tile, so at
    k16 step S lane c needs real k = 16S + 8H + 2c + e for register r = 2n + H: lane S's step 2H + c // 2, register
    2n + c % 2. Every position comes from the layout facts (``bit_positions``, the decode-slice rule of
    :mod:`mmaemit.dequant.kernel_layout`); shifts that would have to differ within one move raise."""
    from mmaemit.dequant.interleave import bit_positions
    from mmaemit.dequant.kernel_layout import words_per_chunk

    if bits not in (1, 2, 4, 8):
        raise UnsupportedConfigError(f"bits={bits!r}; valid: 1, 2, 4, 8")
    pos = bit_positions(bits)
    field = (1 << bits) - 1
    R = 16 // bits                        # B-fragment registers per word (2 elements each)

    def place(rho, e):                    # register rho = 4 * step + r of a lane's chunk, element e -> (word, bit)
        return rho // R, pos[2 * (rho % R) + e]

    TB = max(1, bits // 4)
    build = []
    for cp in range(4):
        terms = [{} for _ in range(TB)]   # per bundle word: (src word, shift) -> mask
        for r in range(4):
            n, H = r // 2, r % 2
            for e in range(2):
                sw, sb = place(4 * (2 * H + cp // 2) + 2 * n + cp % 2, e)
                b, db = place(r, e)
                terms[b][(sw, db - sb)] = terms[b].get((sw, db - sb), 0) | (field << db)
        build.append(tuple(tuple((sw, sh, m) for (sw, sh), m in sorted(t.items())) for t in terms))
    assemble = [dict() for _ in range(words_per_chunk(bits))]
    for S in range(4):
        for r in range(4):
            for e in range(2):
                b, db = place(r, e)
                w, wb = place(4 * S + r, e)
                if assemble[w].setdefault((S, b), wb - db) != wb - db:
                    raise AssertionError(f"{bits}-bit: bundle word {b} of step {S} moves by two shifts")
    return QuadRepairPlan(bits, words_per_chunk(bits), TB, tuple(build),
                          tuple(tuple((S, b, sh) for (S, b), sh in sorted(a.items())) for a in assemble))


def scale_boxes(chunks_per_stage: int, group: int) -> tuple:
    """(scale boxes per stage, groups per box): one box of the stage's groups when the stage holds whole groups or
    lies inside one group, else one box per chunk (a group of 192 with 2 chunks per stage)."""
    span = CHUNK * chunks_per_stage
    if span % group == 0 or group % span == 0:
        return 1, max(1, span // group)
    return chunks_per_stage, 1


def fused_smem_bytes(config: HopperDequantConfig, bits: int, group_size: int, zeros: bool = False) -> int:
    """Dynamic shared memory of :func:`make_dequant_gemm_hopper` for ``config`` and ``bits``-bit weights (16-bit
    activations; ``group_size`` the scale group along K, in elements; ``zeros``: with zero points): the ring's stages
    (per chunk a ``block_m`` x 64 activation box, the weight box of the tile's n16 blocks, the scale boxes and as many
    zero boxes), the output staging tile (or, with ``k_split``, the consumers' hand-over buffer that contains it;
    neither with ``handover="stage"``, which uses kept ring stages), the barriers and 2 KB of alignment slack."""
    cfg = config
    rows = cfg.weight_rows
    nb = rows // 16
    sps, gps = scale_boxes(cfg.chunks_per_stage, group_size)
    stage = (cfg.chunks_per_stage * cfg.block_m * CHUNK * 2 + nb * cfg.chunks_per_stage * 128 * bits
             + (2 if zeros else 1) * sps * nb * gps * 32)
    slots = 1 if cfg.handover == "rounds" else 0 if cfg.handover == "stage" else cfg.consumers - 1
    tail = (slots * 128 * (cfg.block_m // 2) * 4 if cfg.k_split
            else (rows // 64) * cfg.block_m * 64 * 2)
    return cfg.stages * stage + tail + 16 * cfg.stages + 2048 + (16 if cfg.stream_k else 0)


def _stream_k_workers(config, sms=None) -> int:
    # a config's stream-K fields checked, and its workers: num_sms, else sms, else the visible GPU's SM count
    from mmaemit.arch import device_sm_count

    if not isinstance(config, HopperDequantConfig):
        raise UnsupportedConfigError(f"config must be a HopperDequantConfig, not {type(config).__name__}")
    if not isinstance(config.stream_k, bool):
        raise UnsupportedConfigError(f"stream_k={config.stream_k!r}; valid: True, False")
    if not isinstance(config.stream_k_min_chunks, int) or isinstance(config.stream_k_min_chunks, bool) \
            or config.stream_k_min_chunks < 0:
        raise UnsupportedConfigError(f"stream_k_min_chunks={config.stream_k_min_chunks!r}; valid: an int >= 0")
    waves = config.stream_k_waves
    if waves is not None and (not isinstance(waves, int) or isinstance(waves, bool) or waves < 0):
        raise UnsupportedConfigError(f"stream_k_waves={waves!r}; valid: None or an int >= 0")
    return config.num_sms if config.num_sms is not None else (sms if sms is not None else device_sm_count())


def stream_k_workspace(config: HopperDequantConfig, sms: int | None = None) -> tuple:
    """((shape, "float32"), (shape, "int32")) of the two buffers a ``stream_k`` kernel takes after C: per worker
    (``num_sms`` or ``sms``, else the visible GPU's SM count) two slots of fp32 partial sums per 64-row group of the
    tile (``block_m / 2`` x 128 per group: one per accumulator and consumer thread), and one counter per tail tile
    and group (at most one tail tile per worker). The counters must be zero before the first launch."""
    W = _stream_k_workers(config, sms)
    groups = config.weight_rows // 64
    return ((W, 2, groups, config.block_m // 2, 128), "float32"), ((W, groups), "int32")


def stream_k_scheduler(config: HopperDequantConfig, grid_m, N: int, K: int, sms: int | None = None):
    """The :class:`mmaemit.pipeline.StreamKScheduler` a ``stream_k`` kernel of ``config`` runs for ``grid_m`` tile
    rows (an int, or the kernel's expression of M) of an N x K problem on ``num_sms`` or ``sms`` SMs (else the
    visible GPU's): tiles of ``weight_rows``, units of ``chunks_per_stage`` 64-deep chunks; pieces start and end on
    whole rounds of the k_split consumers' stages (each consumer then has a unit in every piece and keeps meeting its
    own stages), at least 16 chunks of K where there is enough; the tail applies where the busiest SM saves at least
    ``stream_k_min_chunks`` chunks and at most ``stream_k_waves`` whole waves come before it (its ``streamed``)."""
    from mmaemit.pipeline import StreamKScheduler

    W = _stream_k_workers(config, sms)
    if K % config.k_multiple or N % config.weight_rows:
        raise TileShapeError(f"N={N}, K={K}: need N a multiple of {config.weight_rows} and K of {config.k_multiple}")
    cps = config.chunks_per_stage
    step = config.consumers if config.k_split else 1
    return StreamKScheduler(grid_m, N // config.weight_rows, W, K // CHUNK // cps, step, config.panel,
                            -(-16 // (cps * step)), min_saved=-(-config.stream_k_min_chunks // cps),
                            max_whole=config.stream_k_waves)


def make_dequant_gemm_hopper(M, N, K, group_size=128, dtype="float16",
                             config: HopperDequantConfig = HopperDequantConfig(), arch="sm_90a", *,
                             weight_format="int4", zeros_mode=None):
    """Build ``gemm(A, W, S, C)`` for sm_90a (``gemm(A, W, S, Z, C)`` with ``zeros_mode``; arguments as
    :func:`mmaemit.kernels.dequant_gemm.make_dequant_gemv`: A [M, K], W int32 [N/16, K/64, 32, bits], S and Z
    [N/16, K/G, 4, 4] (Z in A's dtype, int16 codes for "quantized"), C [M, N]); returns ``(prim_func, config)``.
    ``M=None``: a symbolic M (one compiled kernel for every M >= 1; TMA maps encoded per launch).
    N must be a multiple of ``64 * consumers``, K and the group a multiple of 64 (group -1: per column)."""
    from tvm.script import tirx as T

    from mmaemit import isa
    from mmaemit.arch import as_arch
    from mmaemit.emitters.builder import emit, store
    from mmaemit.emitters.wgmma import WgmmaIntrinEmitter
    from mmaemit.dequant.kernel_layout import words_per_chunk
    from mmaemit.kernels.dequant_gemm_wgmma import wgmma_a_order
    from mmaemit.dequant.decode import variants_of
    from mmaemit.kernels.dequant_parts import check_scheme, emit_pair_of_column, kernel_decode_program
    from mmaemit.kernels.gemm_hopper import SMEM_LIMIT
    from mmaemit.pipeline import (MbarrierRing, PersistentTileScheduler, TmaTile, WarpgroupRoles,
                                  bulk_commit, bulk_wait)

    arch = as_arch(arch or "sm_90a")
    isa.require_feature("wgmma", arch)
    isa.require_feature("cp.async.bulk", arch)
    if weight_format not in HOPPER_FUSED_FORMATS:
        raise UnsupportedConfigError(f"the fused Hopper path takes weight_format in {choices(HOPPER_FUSED_FORMATS)}, "
                                     f"not {weight_format!r} (block-scaled mxfp4 / nvfp4 have no kernel layout)")
    bits, z_kind = check_scheme(weight_format, zeros_mode)
    HAS_Z = z_kind is not None
    dtype = canonical(dtype)
    if dtype not in ("float16", "bfloat16"):
        raise UnsupportedConfigError(f"activation dtype must be one of {choices(['float16', 'bfloat16'])}, "
                                     f"not {dtype!r}")
    if not isinstance(config, HopperDequantConfig):
        raise UnsupportedConfigError(f"config must be a HopperDequantConfig, not {type(config).__name__}")
    cfg = config
    BT, NC, ST = cfg.block_m, cfg.consumers, cfg.stages
    if not isinstance(BT, int) or BT % 8 or not 8 <= BT <= 256:
        raise TileShapeError(f"block_m={BT} must be a multiple of 8 in [8, 256] (the wgmma N)")
    KS = bool(cfg.k_split)
    if NC not in ((2, 4) if KS else (1, 2)):
        raise UnsupportedConfigError(
            f"consumers={NC} with k_split={KS}; valid: " + ("2 or 4 (warpgroups sharing one 64-row group)" if KS else
                                                            "1 or 2 (64 weight rows each)"))
    if not isinstance(ST, int) or ST < 2:
        raise UnsupportedConfigError(f"stages={ST} must be an int >= 2")
    if cfg.in_flight not in (0, 1):
        raise UnsupportedConfigError(f"in_flight={cfg.in_flight!r}; valid: 0, 1")
    INF = cfg.in_flight
    PDL = cfg.pdl
    if PDL not in (True, False):
        raise UnsupportedConfigError(f"pdl={cfg.pdl!r}; valid: True, False")
    PFS = ST if cfg.pdl_prefetch is None else cfg.pdl_prefetch
    if not isinstance(PFS, int) or PFS < 0:
        raise UnsupportedConfigError(f"pdl_prefetch={cfg.pdl_prefetch!r}; valid: None (stages) or a number of stages "
                                     f">= 0")
    NP = cfg.producers
    if NP not in (1, 2):
        raise UnsupportedConfigError(f"producers={NP!r}; valid: 1, 2")
    if ST % NP:
        # each producer must own its stages: an mbarrier phase is only known by its parity, and a producer two
        # rounds ahead of the other on a shared stage would take the other's pending round for its own
        raise UnsupportedConfigError(f"producers={NP} needs stages a multiple of {NP}, not {ST}")
    roles = WarpgroupRoles(1, NC, cfg.producer_regs, cfg.consumer_regs)
    if BT // 2 + 64 > cfg.consumer_regs:
        raise UnsupportedConfigError(f"block_m={BT} needs {BT // 2} accumulator registers per thread; "
                                     f"consumer_regs={cfg.consumer_regs} leaves too few for the decode")
    BW = cfg.weight_rows                  # weight rows (output columns) per tile
    RG = BW // 64                         # 64-row weight groups per tile (k_split: all consumers on one)
    NB = BW // 16                         # n16 blocks per tile (one per consumer warp)
    G = K if group_size in (None, -1) else group_size
    if not isinstance(N, int) or N < 1 or N % BW:
        raise TileShapeError(f"N={N} must be a positive multiple of the tile's {BW} weight rows (64 per consumer, "
                             f"64 with k_split)")
    if not isinstance(K, int) or K < 1 or not isinstance(G, int) or K % CHUNK or G % CHUNK or K % G:
        raise TileShapeError(f"K={K} and group_size={group_size} must be multiples of {CHUNK}, the group dividing K "
                             f"(or -1 for one group per column)")
    DYN = M is None
    if DYN:
        import tvm

        M = tvm.tirx.Var("m", "int32")
    elif not isinstance(M, int) or isinstance(M, bool) or M < 1:
        raise TileShapeError(f"M must be a positive int, or None for a symbolic M; got {M!r}")
    WPC = words_per_chunk(bits)           # words per lane per n16 block and chunk (= bits)
    KSTEPS = CHUNK // 16                  # wgmma k16 steps per chunk
    CPS = cfg.chunks_per_stage
    if CPS not in (1, 2, 4):
        raise UnsupportedConfigError(f"chunks_per_stage={CPS!r}; valid: 1, 2, 4")
    KT = K // CHUNK
    if KT % CPS:
        raise TileShapeError(f"chunks_per_stage={CPS} needs K a multiple of {CHUNK * CPS}, not K={K}")
    KU = KT // CPS                        # ring stages (units of CPS chunks) per tile
    STEP = NC if KS else 1                # a consumer's units are u = first, first + STEP, ...
    if K % cfg.k_multiple:
        raise TileShapeError(f"k_split=True with {NC} consumers needs K a multiple of {cfg.k_multiple} (stages "
                             f"of {CPS} 64-wide chunks dealt round robin), not K={K}")
    KC = KU // STEP                       # units per consumer and tile
    if ST % cfg.stage_step:
        # consumer c waits for unit v on stage v % ST by the parity of round v // ST. That is only sound if the
        # stage's previous round (unit v - ST) has landed: a parity wait on a barrier still in that round's phase
        # passes at once (the phase before it, of the waited parity, is complete). With ST a multiple of the
        # consumers, unit v - ST is c's own and c waited for it; otherwise it is another consumer's, whose copy may
        # still be in flight (H100: an ablation whose consumers only wait and release faulted in the producer's
        # expect-tx arrive with 5 stages and 2 consumers; docs/perf-notes.md, fourteenth session)
        raise UnsupportedConfigError(f"k_split=True deals the ring's stages round robin to {NC} consumers: stages must "
                                     f"be a multiple of {NC} (each consumer then meets its own previous round on "
                                     f"every stage it waits for), not {ST}")
    if ST < cfg.min_stages:
        # in_flight=1 holds a consumer's previous chunk's stage while it waits for the next one's: with k_split that
        # is chunk kt - consumers, which shares kt's stage when stages <= consumers (a deadlock)
        raise UnsupportedConfigError(f"k_split=True with {NC} consumers and in_flight=1 needs stages >= "
                                     f"{cfg.min_stages}, not {ST}")
    PAIRS = (KC - 1) // 2                 # in_flight=1, CPS=1: chunk pairs in the K loop before the peeled tail
    em = WgmmaIntrinEmitter(dtype, dtype, "float32", BT, form="rs", block_k=CHUNK, swizzle_bytes=128,
                            stages=(ST, CPS), arch=arch)
    if em.k_steps != KSTEPS:
        raise AssertionError(f"{em.k_steps} wgmma k steps per chunk, expected {KSTEPS}")
    if cfg.activation_boxes not in ACTIVATION_BOXES:
        raise UnsupportedConfigError(f"activation_boxes={cfg.activation_boxes!r}; valid: {choices(ACTIVATION_BOXES)}")
    if cfg.handover not in HANDOVERS:
        raise UnsupportedConfigError(f"handover={cfg.handover!r}; valid: {choices(HANDOVERS)}")
    if cfg.quad_repair not in QUAD_REPAIRS:
        raise UnsupportedConfigError(f"quad_repair={cfg.quad_repair!r}; valid: {choices(QUAD_REPAIRS)}")
    if not isinstance(cfg.lookahead, bool):
        raise UnsupportedConfigError(f"lookahead={cfg.lookahead!r}; valid: True, False")
    CPG = cfg.chunks_per_group
    if CPG not in (1, 2) or isinstance(CPG, bool):
        raise UnsupportedConfigError(f"chunks_per_group={CPG!r}; valid: 1, 2")
    if CPG == 2 and CPS != 4:
        raise UnsupportedConfigError(f"chunks_per_group=2 pairs the chunks of a stage and needs chunks_per_stage=4 "
                                     f"(every stage then starts on the same A buffers), not {CPS}")
    if cfg.lookahead and cfg.quad_repair != "shuffle":
        raise UnsupportedConfigError("lookahead=True works on the shuffle repair (it issues a chunk's shuffles "
                                     "early); quad_repair='shared' reads its partners' words in place: use "
                                     "lookahead=False")
    if cfg.handover != "parallel" and not cfg.k_split:
        raise UnsupportedConfigError(f"handover={cfg.handover!r} passes k_split consumers' sums to consumer 0; "
                                     f"without k_split=True each consumer stores its own rows: use "
                                     f"handover='parallel'")
    if cfg.handover == "stage" and (CPS < 2 or cfg.in_flight != 1):
        raise UnsupportedConfigError(f"handover='stage' writes a consumer's fp32 sums over its last ring stage's "
                                     f"activations, which hold them from chunks_per_stage=2 on, and keeps that "
                                     f"stage past the K loop of in_flight=1: chunks_per_stage={CPS}, "
                                     f"in_flight={cfg.in_flight}; use handover='parallel'")
    XST = cfg.activation_boxes == "stage" and CPS > 1        # one activation box per stage
    FIT = cfg.fit_rows
    if not isinstance(FIT, bool):
        raise UnsupportedConfigError(f"fit_rows={FIT!r}; valid: True, False")
    if XST:
        # A [M, K] viewed as [K / 64, M, 64]: the box's CPS chunk tiles of BT x 64 land one after another, Xs[s]
        x_map_t = TmaTile.for_layout((KT, M, CHUNK), em.shared_layout("B"), box_outer=(CPS,), strides=(CHUNK, K, 1))
    else:
        x_map_t = TmaTile.for_layout((M, K), em.shared_layout("B"))             # activations: the wgmma B tile
    # fit_rows: the last tile row's activations travel in boxes of its rows rounded up to 8, one box per chunk (a
    # stage box lands its chunks at box height), through a second map of A
    xt_map_t = TmaTile.for_layout((M, K), em.shared_layout("B")) if XST and FIT else x_map_t
    # packed words, plain order: a tile's n16 block and chunk is 32 x WPC contiguous words, one box row of 128 x bits
    # bytes (measured at 4 bits: 3 % faster than the same box with 16-byte rows, [.., 32, WPC])
    w_map_t = TmaTile((N // 16, KT, 32 * WPC), "int32", (NB, CPS, 32 * WPC))
    SPS, GPS = scale_boxes(CPS, G)
    s_map_t = TmaTile((N // 16, K // G, 16), dtype, (NB, GPS, 16))
    ZD = "int16" if z_kind == "int16" else dtype          # Z's dtype ("quantized": int16 codes)
    # zero points: boxes like the scales' (the 16-bit words travel as A's dtype: TMA copies bits)
    z_map_t = TmaTile((N // 16, K // G, 16), dtype, (NB, GPS, 16))
    c_map_t = TmaTile((M, N), dtype, (BT, 64))                                  # one box per consumer
    X_BYTES, W_BYTES, S_BYTES = x_map_t.box_bytes, w_map_t.box_bytes, s_map_t.box_bytes
    NACC = BT // 2                        # fp32 accumulators per thread (64 x BT per warpgroup)
    ROUNDS = KS and cfg.handover == "rounds" and NC > 2
    STAGE_HO = KS and cfg.handover == "stage"
    SLOTS = 1 if ROUNDS else NC - 1           # hand-over slots of 128 x NACC float32 (k_split)
    RED_BYTES = 0 if STAGE_HO else SLOTS * 128 * NACC * 4 if KS else 0
    STAGE_BYTES = (1 if XST else CPS) * X_BYTES + W_BYTES + SPS * S_BYTES * (2 if HAS_Z else 1)

    def plus(a, b):
        # a + b, without a literal "0 +" in the generated code
        return b if isinstance(a, int) and a == 0 else a + b

    def last_unit(ib, u0, kc, o):
        # k_split consumer o's last ring iteration of an item whose unit u is iteration ib + u (its units are
        # u0 + o, then every STEP-th, kc of them): the stage it keeps with handover="stage"
        return plus(u0, ib) + o + STEP * (kc - 1)

    GM_EXPR = (M + (BT - 1)) // BT if DYN else -(-M // BT)        # tile rows

    LAST_ROWS = ((M - 1) % BT + 8) // 8 * 8                         # the last tile row's rows, rounded up to 8

    def x_rows():
        # rows of the last tile row's activation boxes: with fit_rows LAST_ROWS, else the tile's
        return T.min(T.int32(BT), LAST_ROWS) if FIT else BT

    # whether a launch can have a short last row (a static M whose last row is whole has none: nothing to zero)
    SHORT = FIT and (DYN or LAST_ROWS < BT)

    def short_row(tm):
        # tile row tm is the last one and short (its activation boxes carry x_rows() rows)
        return T.And(tm == GM_EXPR - 1, x_rows() < BT)
    smem = fused_smem_bytes(cfg, bits, G, HAS_Z)
    SK = cfg.stream_k
    sms = _stream_k_workers(cfg)          # the stream-K fields checked; the persistent grid's SMs
    if smem != (ST * STAGE_BYTES + (RED_BYTES if KS else RG * c_map_t.box_bytes) + 16 * ST + 2048
                + (16 if SK else 0)):
        raise AssertionError("fused_smem_bytes disagrees with the kernel's boxes")
    if smem > SMEM_LIMIT:
        raise UnsupportedConfigError(f"{smem} bytes of shared memory > {SMEM_LIMIT}: lower stages ({ST}), "
                                     f"chunks_per_stage ({CPS}) or block_m ({BT})")
    GN = N // BW
    # stream-K needs tiles of at least two granules; with fewer the kernel is the data-parallel one (it still takes
    # the workspace arguments, unused)
    NG = KU // STEP                       # stream-K granules (k_split rounds of stages) per tile
    SKA = SK and NG >= 2
    if SKA:
        sched = stream_k_scheduler(cfg, GM_EXPR, N, K, sms)
    elif DYN:
        sched = PersistentTileScheduler(GM_EXPR, GN, sms, cfg.panel, 1)
    else:
        sched = PersistentTileScheduler(GM_EXPR, GN, max(1, min(sms, GM_EXPR * GN)), cfg.panel, 1)
    NW = sched.workers

    def prologue_into(pre, worker):
        # stream-K: the worker's whole-tile count and tail range, once per CTA (None otherwise)
        return sched.prologue_into(pre, worker) if SKA else None

    def count(worker, pre):
        return sched.count(worker, pre) if SKA else sched.count(worker)

    def item_into(tile, worker, t, pre):
        # (tm, tn, u0, nu, ib, sk, slot) of the worker's t-th item: units [u0, u0 + nu) of tile (tm, tn), unit u is
        # ring iteration ib + u; sk >= 0: a stream-K piece of tail tile sk (workspace slot "slot")
        if SKA:
            return sched.item_into(tile, worker, t, pre)
        tm, tn = sched.tile_into(tile, worker, t)
        return tm, tn, 0, KU, t * KU, -1, 0
    # every consumer thread arrives: each reads its words of the stage with ld.shared (not only the async proxy)
    # (k_split: one consumer per stage)
    ring = MbarrierRing(ST, 128 * RG, 1)
    if cfg.decode_variant not in DECODE_VARIANTS:
        raise UnsupportedConfigError(f"decode_variant={cfg.decode_variant!r}; valid: {choices(DECODE_VARIANTS)}")
    variant = cfg.decode_variant
    if variant == "auto":
        variant = "marlin" if "marlin" in variants_of(weight_format, dtype) else "shift"
    program = kernel_decode_program(weight_format, dtype, zeros_mode or "scale", arch.name, variant)
    R = program.registers                 # B-fragment registers per word (16 / bits)
    A_ORDER = wgmma_a_order(dtype)
    # a table-building decode (nf4 with a scale: each row's 16 scaled values, rounded once) builds its operands once
    # per scale group into registers (emit_operands) instead of once per word
    HOIST = program.hoist_operands
    if HOIST and R % 4:
        raise AssertionError(f"{weight_format}: hoisted decode operands need 4 registers per word row pattern, R={R}")
    PLAN = quad_word_plan(bits)
    if NACC != em.local_size_c:
        raise AssertionError(f"{em.local_size_c} accumulators per thread, expected {NACC}")

    def or_all(values):
        return functools.reduce(operator.or_, values)

    def shifted(word, shift):
        return word << T.uint32(shift) if shift > 0 else (word >> T.uint32(-shift) if shift < 0 else word)

    def moved(word, shift, mask):
        return shifted(word, shift) & T.uint32(mask)

    TB = PLAN.bundle_words
    SHARED_REPAIR = cfg.quad_repair == "shared"
    LOOKAHEAD = cfg.lookahead
    # with "shared": (bundle word b, mask, per-receiver (word, rotation)) of every term, in bundle-word order
    SHARED_TERMS = ([(b, m, per_q) for b, terms in enumerate(PLAN.shared_terms()) for m, per_q in terms]
                    if SHARED_REPAIR else [])
    ROT = max((sum(t[0] == b for t in SHARED_TERMS) for b in range(TB)), default=0)   # terms per bundle word
    # rr: the shuffle's scratch; with "shared" also each term's source word and rotation, and ROT rotated words
    NRR = 1 + 2 * len(SHARED_TERMS) + ROT

    def by_lane(q, values):
        return T.Select(q == 0, T.uint32(values[0]), T.Select(q == 1, T.uint32(values[1]), T.Select(
            q == 2, T.uint32(values[2]), T.uint32(values[3]))))

    def shared_tables(rr, q):
        # once per thread: this lane's source word and rotation of every term (they depend on its quad index only)
        for i, (_, _, per_q) in enumerate(SHARED_TERMS):
            store(rr, by_lane(q, [sw for sw, _ in per_q]), (1 + 2 * i,))
            store(rr, by_lane(q, [rot for _, rot in per_q]), (2 + 2 * i,))

    def shared_repair(Ws, s, blk, j, g, y, rr):
        # y[4 b + S] = bundle word b that quad partner S would build for this lane, from S's words in the stage
        for b in range(TB):
            terms = [(i, m) for i, (tb, m, _) in enumerate(SHARED_TERMS) if tb == b]
            for S in range(4):
                for t, (i, _) in enumerate(terms):
                    v = T.reinterpret("uint32", Ws[s, blk, j, g * 4 + S, T.Cast("int32", rr[1 + 2 * i])])
                    emit(T.ptx.shf.l.wrap.b32(rr[NRR - ROT + t], v, v, rr[2 + 2 * i]))     # rotate left
                store(y, or_all(rr[NRR - ROT + t] & T.uint32(m) for t, (_, m) in enumerate(terms)), (4 * b + S,))

    def repair(wb, off, y, rr, q):
        # y[4 b + c'] = bundle word b for quad lane c' (built from this lane's words wb[off ..]), then a 4 x 4
        # transpose over the quad per bundle word: afterwards y[4 b + S] = what lane S built for this lane = its codes
        # of k16 step S
        for cp in range(4):
            for b in range(TB):
                terms = PLAN.build[cp][b]
                if len(terms) == 2 and terms[0][2] ^ terms[1][2] == 0xFFFFFFFF:
                    # two fields under complementary masks: one lop3 select, (a & m) | (c & ~m)
                    (s0, h0, m0), (s1, h1, _) = terms
                    emit(T.ptx["lop3.b32"](y[4 * b + cp], shifted(wb[off + s0], h0), T.uint32(m0),
                                           shifted(wb[off + s1], h1), T.uint32(0xE2)))
                else:
                    store(y, or_all(moved(wb[off + sw], sh, m) for sw, sh, m in terms), (4 * b + cp,))
        for b in range(TB):
            for mk in (2, 1):
                bit = (q & mk) != 0
                for i in range(4):
                    if i & mk == 0:
                        lo, hi = 4 * b + i, 4 * b + (i ^ mk)
                        emit(T.ptx.shfl_sync.bfly.b32(rr[0], T.Select(bit, y[lo], y[hi]), T.uint32(mk),
                                                      T.uint32(0x1F), T.uint32(0xFFFFFFFF)))
                        store(y, T.Select(bit, rr[0], y[lo]), (lo,))
                        store(y, T.Select(bit, y[hi], rr[0]), (hi,))

    def word_pairs(pairs, w):
        # the scale / zero pair of each output register of word w: that of its n8 half (row g or g + 8)
        return [pairs[((w * R + i) % 4) // 2] for i in range(R)]

    def build_operands(sp, zp, opr):
        # the hoisted operand stage (a row's scaled tables) into opr, once per scale group
        program.emit_operands(scale_pair=word_pairs(sp, 0), zero_pair=word_pairs(zp, 0) if HAS_Z else None, into=opr)

    def decode_steps(wb, y, af, sp, zp, opr):
        # decode word w (assembled from the received bundles; 4 / 8 bits: one bundle word as is) gives the
        # B-fragment registers rho = w R .. w R + R - 1 = 4 S + r (r = [n0 H0, n0 H1, n1 H0, n1 H1] of k16 step S);
        # they land in wgmma A order; register r's scale is that of its n8 half r // 2
        for w in range(WPC):
            terms = PLAN.assemble[w]
            if PLAN.identity_assembly:
                word = y[4 * terms[0][1] + terms[0][0]]
            else:
                store(wb, or_all(y[4 * b + S] << T.uint32(sh) if sh else y[4 * b + S] for S, b, sh in terms), (w,))
                word = wb[w]
            rhos = [w * R + i for i in range(R)]
            regs = [af[4 * (rho // 4) + A_ORDER.index(rho % 4)] for rho in rhos]
            if HOIST:
                program.emit(word, regs, operands=opr)
            else:
                program.emit(word, regs, scale_pair=word_pairs(sp, w), zero_pair=word_pairs(zp, w) if HAS_Z else None)

    def issue(acc, af, afo, desc, s, u, j, first):
        # one wgmma commit group: chunk j's 4 k16 steps, after chunk j - 1's (registers afo) with chunks_per_group=2
        em.fence()
        for jj, a_regs in ([(j - 1, afo)] if CPG == 2 else []) + [(j, af)]:
            for ks in range(KSTEPS):
                em.mma([acc[i] for i in range(NACC)], [a_regs[4 * ks + i] for i in range(4)], desc, ks,
                       stage=(s, jj), scale_d=(u > first if jj == 0 else True) if ks == 0 else True)
        em.commit_group()

    def retire(it, u, j, first, final, c):
        # after chunk j's commit (the last chunk of its group): retire wgmmas in the group that issued them or the
        # next one (a wait deferred past a loop iteration made ptxas serialize every wgmma, C7514, through the
        # epilogue's accumulator reads)
        if INF == 0:
            em.wait_group(0)                   # this group's wgmmas read its A buffers and the stage
            if j == CPS - 1:
                ring.consumer_release(it)
        elif final and j == CPS - 1:
            # the tile's last chunk retires everything in the same chunk: with the last wait after the K loop
            # instead, ptxas scheduled the epilogue's accumulator reads above it (wrong results on the H100)
            em.wait_group(0)
            if CPS == 1:
                ring.consumer_release(it + ST - STEP, pred=u > first)
            # handover="stage": consumers c > 0 keep their last stage for their sums (c, not the unit: a stream-K
            # piece's first unit is past c)
            ring.consumer_release(it, pred=(c < 1) if STAGE_HO else None)
        else:
            em.wait_group(1)                   # the previous group retired: its A buffers are reusable
            if j == CPG - 1:
                # ... and it was the last of unit u - STEP: that stage is free
                ring.consumer_release(it + ST - STEP, pred=u > first)

    @T.inline
    def sub(Ss, Zs, Ws, acc, af, afo, wb, wpre, y, ynext, rr, sv, sp, zp, opr, desc, s, it, u, j, first, blk, lane, g,
            q, final, c):
        # chunk j (a Python int) of the unit in stage s: words, scales (and zeros) -> A registers af -> 4 wgmmas;
        # hoisted operands are rebuilt where a scale group may start: the unit's first chunk, chunks at a group
        # boundary of the stage, every chunk when a group straddles stages (one scale box per chunk). With
        # lookahead the unit loaded every chunk's words into wpre and repaired chunk 0 into y; chunk j repairs
        # chunk j + 1 into ynext before it decodes, so those shuffles run under this chunk's decode. With
        # chunks_per_group=2 an even chunk only decodes (into af); the odd one decodes and issues both chunks' wgmmas
        # (chunk j - 1's A registers are afo) as one group, and the retire / release logic runs per pair
        fresh = T.meta_var(j == 0 or SPS > 1 or j * CHUNK % G == 0)
        if fresh:
            T.ptx["ld.shared.v2.b32"](sv[0], sv[1], Ss.ptr_to([s, j if SPS > 1 else 0, blk,
                                                               j * CHUNK // G if GPS > 1 else 0, g // 2 * 4]))
            if HAS_Z:
                T.ptx["ld.shared.v2.b32"](sv[2], sv[3], Zs.ptr_to([s, j if SPS > 1 else 0, blk,
                                                                   j * CHUNK // G if GPS > 1 else 0, g // 2 * 4]))
        if SHARED_REPAIR:
            shared_repair(Ws, s, blk, j, g, y, rr)
        elif LOOKAHEAD:
            if j + 1 < CPS:
                repair(wpre, (j + 1) * WPC, ynext, rr, q)
        else:
            for w in T.unroll(WPC):
                wb[w] = T.reinterpret("uint32", Ws[s, blk, j, lane, w])
            repair(wb, 0, y, rr, q)
        if fresh:
            emit_pair_of_column(sp[0], sv[0], sv[1], g, 0)
            emit_pair_of_column(sp[1], sv[0], sv[1], g, 1)
            if HAS_Z:
                emit_pair_of_column(zp[0], sv[2], sv[3], g, 0)
                emit_pair_of_column(zp[1], sv[2], sv[3], g, 1)
            if HOIST:
                build_operands(sp, zp, opr)
        decode_steps(wb, y, af, sp, zp, opr)
        if CPG == 1 or j % 2 == 1:
            issue(acc, af, afo, desc, s, u, j, first)
            retire(it, u, j, first, final, c)

    @T.inline
    def unit(Ss, Zs, Ws, acc, afa, afb, afc, afd, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib, u, first, c, warp,
             lane, g, q, final=False):
        # ring stage u of the item (chunks kt = CPS u .. CPS u + CPS - 1; ring iteration ib + u); first: this
        # consumer's first unit of the item (u0, or u0 + c with k_split); its previous one is u - STEP. CPS = 1: chunk
        # on afa (the caller alternates the buffers);
        # CPS = 2, 4: the chunks alternate afa / afb, so every unit starts on afa; chunks_per_group=2: chunks 0, 1 on
        # afa / afb, chunks 2, 3 on afc / afd
        it = T.meta_var(ib + u)
        s = T.meta_var(ring.stage(it))
        blk = T.meta_var((0 if KS else c) * 4 + warp)     # the warp's n16 block in the stage
        ring.consumer_wait(it)
        # chunk j's bundles: y for even j, y2 for odd j (y2 is y without lookahead)
        if LOOKAHEAD:                  # every chunk's words at once, then chunk 0's repair
            for w in T.unroll(CPS * WPC):
                wpre[w] = T.reinterpret("uint32", Ws[s, blk, w // WPC, lane, w % WPC])
            repair(wpre, 0, y, rr, q)
        sub(Ss, Zs, Ws, acc, afa, afb, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, s, it, u, 0, first, blk, lane, g, q,
            final, c)
        if CPS >= 2:
            sub(Ss, Zs, Ws, acc, afb, afa, wb, wpre, y2, y, rr, sv, sp, zp, opr, desc, s, it, u, 1, first, blk, lane, g,
                q, final, c)
        if CPS == 4:
            sub(Ss, Zs, Ws, acc, afc, afd, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, s, it, u, 2, first, blk, lane, g,
                q, final, c)
            sub(Ss, Zs, Ws, acc, afd, afc, wb, wpre, y2, y, rr, sv, sp, zp, opr, desc, s, it, u, 3, first, blk, lane, g,
                q, final, c)

    @T.inline
    def epilogue(Cs, slot, c_map, acc, tm, tn, r, tid):
        # accumulator i = C^T[weight row m, activation row n]: staged as C rows [n, m] in Cs[slot]; r: the 64-row
        # group
        bulk_wait(0, read=True)                       # the previous tile's store has read Cs[slot]
        T.ptx.bar.sync(T.uint32(1 + r), T.uint32(128))
        for i in T.unroll(NACC):
            mn = T.meta_var(em.accumulator_coords(tid, i))
            Cs[slot, mn[1], mn[0]] = T.Cast(dtype, acc[i])
        T.ptx.fence.proxy.async_.shared__cta()
        T.ptx.bar.sync(T.uint32(1 + r), T.uint32(128))
        c_map_t.store(c_map, (tm * BT, tn * BW + r * 64), Cs.ptr_to([slot, 0, 0]), pred=tid == 0)
        bulk_commit()

    @T.inline
    def fixup(WSP, LKC, Flag, acc, worker, pre, sk, sk_slot, sk_units, r, tid):
        # a stream-K piece (sk >= 0) of 64-row group r: its sums into its workspace slot, then its granules onto the
        # tile's counter; Flag[r] = 1 where this piece completed the tile (or is a whole tile), and then acc = the sum
        # of every piece's slot in K order (deterministic whatever the arrival order) and the counter back to 0
        if sk >= 0:
            for i in T.unroll(NACC):
                WSP[worker, sk_slot, r, i, tid] = acc[i]
            T.ptx.bar.sync(T.uint32(5 + r), T.uint32(128))
            if tid == 0:
                old = T.alloc_local((1,), "int32")
                T.ptx.fence.acq_rel.gpu()
                T.ptx.atom.acq_rel.gpu.global_.add.s32(old[0], LKC.ptr_to([sk, r]), sk_units // STEP)
                Flag[r] = T.Select(old[0] + sk_units // STEP == NG, 1, 0)
            T.ptx.bar.sync(T.uint32(5 + r), T.uint32(128))
            if Flag[r] != 0:
                T.ptx.fence.acq_rel.gpu()
                lohi = T.meta_var(sched.pieces(sk, pre))
                for i in T.unroll(NACC):
                    acc[i] = T.float32(0)
                part = T.alloc_local((1,), "float32")
                for w2 in T.serial(lohi[0], lohi[1] + 1):
                    for i in T.unroll(NACC):
                        # other SMs wrote these: a gpu-scope (L1-bypassing) load, ordered after the acquire above
                        T.ptx.ld.relaxed.gpu.global_.f32(
                            part[0], WSP.ptr_to([w2, sk - sched.range_start(w2, pre) // NG, r, i, tid]))
                        acc[i] = acc[i] + part[0]
                if tid == 0:
                    LKC[sk, r] = 0
        else:
            if tid == 0:
                Flag[r] = 1
            T.ptx.bar.sync(T.uint32(5 + r), T.uint32(128))

    @T.inline
    def stored(Cs, cs_slot, c_map, acc, tmn, r, tid, read_back):
        epilogue(Cs, cs_slot, c_map, acc, tmn[0], tmn[1], r, tid)
        if read_back:
            if tid == 0:
                bulk_wait(0, read=True)          # the store has read C out of its staging slot

    @T.inline
    def store_tile(WSP, LKC, Flag, Cs, cs_slot, c_map, acc, worker, pre, tmn, r, tid, read_back=False):
        # the epilogue of 64-row group r from staging slot cs_slot (read_back: then wait until the store has read
        # it); with stream_k only where this item completes its tile (its sums are then the tile's)
        if SKA:
            fixup(WSP, LKC, Flag, acc, worker, pre, tmn[5], tmn[6], tmn[3], r, tid)
            if Flag[r] != 0:
                stored(Cs, cs_slot, c_map, acc, tmn, r, tid, read_back)
        else:
            stored(Cs, cs_slot, c_map, acc, tmn, r, tid, read_back)

    @T.inline
    def x_loads(Xs, x_map, s, uu, tm, it):
        # a whole tile's activations of stage s (unit uu), one box per stage or per chunk, and the stage's barrier
        # armed for the stage's bytes
        ring.producer_expect(it, STAGE_BYTES)
        if XST:
            x_map_t.load(Xs.ptr_to([s, 0, 0, 0]), x_map, (uu * CPS, tm * BT, 0), ring.full_ptr(it))
        else:
            for j in range(CPS):
                x_map_t.load(Xs.ptr_to([s, j, 0, 0]), x_map, (tm * BT, (uu * CPS + j) * CHUNK), ring.full_ptr(it))

    @T.inline
    def body(A, W, S, C, x_map, xt_map, w_map, s_map, z_map, c_map, WSP=None, LKC=None):
        T.attr(WarpgroupRoles.launch_attr())
        worker = T.cta_id([NW])
        wg = T.warpgroup_id([roles.warpgroups])
        tid = T.thread_id_in_wg([128])
        pool = T.SMEMPool()
        Xs = pool.alloc(em.b_shared_shape, dtype, align=em.b_layout.alignment)      # (ST, CPS, BT, 64)
        Ws = pool.alloc((ST, NB, CPS, 32, WPC), "int32", align=w_map_t.smem_alignment)
        Ss = pool.alloc((ST, SPS, NB, GPS, 16), dtype, align=s_map_t.smem_alignment)
        Zs = pool.alloc((ST, SPS, NB, GPS, 16), dtype, align=z_map_t.smem_alignment) if HAS_Z else Ss
        if STAGE_HO:
            # views of the ring's activation bytes: a kept stage's fp32 sums, or the output tile, at its start
            # (slots of two chunks' activations: NACC x 128 fp32 = BT x 64 x 2 halves; stage s starts at slot
            # s * CPS / 2, or at output slot s * CPS)
            RedS = T.decl_buffer((ST * CPS // 2, NACC, 128), "float32", data=Xs.data,
                                 elem_offset=Xs.elem_offset // 2, scope="shared.dyn")
            CsS = T.decl_buffer((ST * CPS, BT, 64), dtype, data=Xs.data, elem_offset=Xs.elem_offset,
                                scope="shared.dyn")
        elif KS:
            # the sums of consumers 1 .. NC - 1; the output staging tile Cs shares their bytes
            Red = pool.alloc((SLOTS, NACC, 128), "float32", align=max(128, c_map_t.smem_alignment))
            Cs = T.decl_buffer((RG, BT, 64), dtype, data=Red.data, elem_offset=Red.elem_offset * 2,  # 4 / 2 bytes
                               scope="shared.dyn")
        else:
            Cs = pool.alloc((RG, BT, 64), dtype, align=c_map_t.smem_alignment)
            Red = pool.alloc((1, 1, 128), "float32", align=128)      # unused without k_split
        bars = ring.alloc(pool)  # noqa: F841
        Flag = T.meta_var(pool.alloc((4,), "int32", align=16) if SK else None)
        pool.commit()
        if PDL:
            T.ptx.griddepcontrol.launch_dependents()
        ring.init(T.And(wg == 0, tid == 0))
        if SHORT:
            # the tile rows past the last tile row's short boxes: zeroed once, so that the wgmmas read defined values
            # (their sums land in output rows the store clips; later whole-tile loads and hand-over writes leave other
            # values there, as harmless), before the async proxy reads the stages
            if x_rows() < BT:
                pieces = T.meta_var((BT - x_rows()) * 8)           # 16-byte pieces per chunk slot past the box
                for i in T.serial((ST * CPS * pieces + roles.threads - 1) // roles.threads):
                    idx = T.meta_var(i * roles.threads + wg * 128 + tid)
                    if idx < ST * CPS * pieces:
                        for e in T.unroll(8):
                            Xs[idx // pieces // CPS, idx // pieces % CPS, x_rows() + idx % pieces // 8,
                               idx % 8 * 8 + e] = T.Cast(dtype, 0)
                T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        if wg == 0:
            roles.producer_setup()
            if T.And(tid % 32 == 0, tid < 32 * NP):
                p = T.meta_var(tid // 32)         # this producer fills the stages s = p (mod NP), in ring order
                tile = T.alloc_local((7 if SKA else 2,), "int32")
                pre_r = T.meta_var(T.alloc_local((8,), "int32") if SKA else None)
                pre = T.meta_var(prologue_into(pre_r, worker))
                if PDL:
                    # the weights are read-only: their first stages' boxes may move into L2 before the wait
                    if PFS > 0:
                        if T.And(p == 0, count(worker, pre) > 0):
                            t0 = T.meta_var(item_into(tile, worker, 0, pre))
                            for u in T.unroll(min(PFS, KU)):
                                if SKA:
                                    if u < t0[3]:
                                        w_map_t.prefetch(w_map, (t0[1] * NB, (t0[2] + u) * CPS, 0))
                                else:
                                    w_map_t.prefetch(w_map, (t0[1] * NB, u * CPS, 0))
                    T.ptx.griddepcontrol.wait()
                for t in T.serial(count(worker, pre)):
                    tmn = T.meta_var(item_into(tile, worker, t, pre))
                    tm = T.meta_var(tmn[0])
                    tn = T.meta_var(tmn[1])
                    # rolled: unrolled at a short K (8 units at K = 1024), the producer's per-unit box coordinates
                    # outgrow its setmaxnreg budget and spill (fused128x2 with fit_rows)
                    for u in T.serial(tmn[3], annotations={"pragma_unroll": 1}):
                        uu = T.meta_var(plus(tmn[2], u))
                        it = T.meta_var(tmn[4] + uu)
                        s = T.meta_var(ring.stage(it))
                        if it % NP == p:
                            ring.producer_acquire(it)
                            if FIT:
                                if short_row(tm):
                                    # the last tile row, short: its rows rounded up to 8, one box per chunk
                                    ring.producer_expect(it, STAGE_BYTES - CPS * (BT - x_rows()) * CHUNK * 2)
                                    for j in range(CPS):
                                        xt_map_t.load(Xs.ptr_to([s, j, 0, 0]), xt_map,
                                                      (tm * BT, (uu * CPS + j) * CHUNK), ring.full_ptr(it))
                                else:
                                    x_loads(Xs, x_map, s, uu, tm, it)
                            else:
                                x_loads(Xs, x_map, s, uu, tm, it)
                            w_map_t.load(Ws.ptr_to([s, 0, 0, 0, 0]), w_map, (tn * NB, uu * CPS, 0), ring.full_ptr(it))
                            for j in range(SPS):
                                s_map_t.load(Ss.ptr_to([s, j, 0, 0, 0]), s_map,
                                             (tn * NB, (uu * CPS + j) * CHUNK // G, 0), ring.full_ptr(it))
                                if HAS_Z:
                                    z_map_t.load(Zs.ptr_to([s, j, 0, 0, 0]), z_map,
                                                 (tn * NB, (uu * CPS + j) * CHUNK // G, 0), ring.full_ptr(it))
        else:
            roles.consumer_setup()
            if PDL:
                T.ptx.griddepcontrol.wait()      # before the epilogue's stores (the producer's loads wait too)
            c = T.meta_var(roles.consumer_index(wg))
            warp = T.meta_var(tid // 32)
            lane = T.meta_var(tid % 32)
            g = T.meta_var(lane // 4)
            q = T.meta_var(lane % 4)
            acc = T.alloc_local((NACC,), "float32")
            af0 = T.alloc_local((4 * KSTEPS,), "uint32")
            af1 = T.alloc_local((4 * KSTEPS,), "uint32")
            # chunks_per_group=2 with a group in flight: chunks 2, 3 of a stage decode into their own pair of buffers
            af2 = T.meta_var(T.alloc_local((4 * KSTEPS,), "uint32") if CPG == 2 and INF == 1 else af0)
            af3 = T.meta_var(T.alloc_local((4 * KSTEPS,), "uint32") if CPG == 2 and INF == 1 else af1)
            wb = T.alloc_local((WPC,), "uint32")
            y = T.alloc_local((4 * PLAN.bundle_words,), "uint32")
            y2 = T.alloc_local((4 * PLAN.bundle_words,), "uint32") if LOOKAHEAD else y
            wpre = T.alloc_local((CPS * WPC,), "uint32") if LOOKAHEAD else wb
            rr = T.alloc_local((NRR,), "uint32")
            if SHARED_REPAIR:
                shared_tables(rr, q)
            sv = T.alloc_local((4 if HAS_Z else 2,), "uint32")
            sp = T.alloc_local((2,), "uint32")
            zp = T.meta_var(T.alloc_local((2,), "uint32") if HAS_Z else sp)
            opr = T.meta_var(program.alloc_operands() if HOIST else None)
            desc = em.alloc_descriptor()
            em.init_descriptor(desc, Xs, "B")
            tile = T.alloc_local((7 if SKA else 2,), "int32")
            pre_r = T.meta_var(T.alloc_local((8,), "int32") if SKA else None)
            pre = T.meta_var(prologue_into(pre_r, worker))
            for t in T.serial(count(worker, pre)):
                tmn = T.meta_var(item_into(tile, worker, t, pre))
                tm = T.meta_var(tmn[0])
                tn = T.meta_var(tmn[1])
                ib = T.meta_var(tmn[4])                     # unit u of this item is ring iteration ib + u
                first = T.meta_var(plus(tmn[2], c if KS else 0))
                KC = T.meta_var(KU // STEP if not SKA else tmn[3] // STEP)     # this consumer's units of the item
                PAIRS = T.meta_var((KC - 1) // 2 if not SKA else (tmn[3] - STEP) // (2 * STEP))
                if INF == 0:
                    for j in T.serial(KC):
                        unit(Ss, Zs, Ws, acc, af0, af1, af2, af3, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib,
                             first + STEP * j, first, c, warp, lane, g, q)
                elif CPS > 1:
                    # every unit alternates the A buffers itself; the last one retires all
                    for j in T.serial(KC - 1):
                        unit(Ss, Zs, Ws, acc, af0, af1, af2, af3, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib,
                             first + STEP * j, first, c, warp, lane, g, q)
                    unit(Ss, Zs, Ws, acc, af0, af1, af2, af3, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib,
                         first + STEP * (KC - 1), first, c, warp, lane, g, q, True)
                else:
                    # pairs of chunks (two A buffers), then the last one or two chunks peeled: the last retires all
                    for j2 in T.serial(PAIRS):
                        unit(Ss, Zs, Ws, acc, af0, af1, af2, af3, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib,
                             first + STEP * (2 * j2), first, c, warp, lane, g, q)
                        unit(Ss, Zs, Ws, acc, af1, af0, af1, af0, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib,
                             first + STEP * (2 * j2 + 1), first, c, warp, lane, g, q)
                    if KC - 2 * PAIRS == 2:
                        unit(Ss, Zs, Ws, acc, af0, af1, af2, af3, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib,
                             first + STEP * (KC - 2), first, c, warp, lane, g, q)
                        unit(Ss, Zs, Ws, acc, af1, af0, af1, af0, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib,
                             first + STEP * (KC - 1), first, c, warp, lane, g, q, True)
                    else:
                        unit(Ss, Zs, Ws, acc, af0, af1, af2, af3, wb, wpre, y, y2, rr, sv, sp, zp, opr, desc, ib,
                             first + STEP * (KC - 1), first, c, warp, lane, g, q, True)
                em.pin_accumulators(acc)
                if STAGE_HO:
                    # consumer c > 0 writes its sums over its last unit's stage (kept, its wgmmas retired), consumer 0
                    # adds them, stages C in consumer 1's stage and releases the kept stages once the store read it
                    if c > 0:
                        for i in T.unroll(NACC):
                            RedS[ring.stage(last_unit(ib, tmn[2], KC, c)) * (CPS // 2), i, tid] = acc[i]
                        if FIT:
                            # the rows past a short box are not rewritten by the stage's later loads: the wgmmas
                            # (async proxy) read these generic writes there
                            T.ptx.fence.proxy.async_.shared__cta()
                    T.ptx.bar.sync(T.uint32(4), T.uint32(128 * NC))
                    if c == 0:
                        for i in T.unroll(NACC):
                            for o in T.unroll(NC - 1):
                                kept = T.meta_var(ring.stage(last_unit(ib, tmn[2], KC, o + 1)))
                                acc[i] = acc[i] + RedS[kept * (CPS // 2), i, tid]
                        for o in T.unroll(NC - 2):
                            ring.consumer_release(last_unit(ib, tmn[2], KC, o + 2))
                        s1 = T.meta_var(ring.stage(last_unit(ib, tmn[2], KC, 1)))
                        # C staged in consumer 1's kept stage: released once the store has read it
                        store_tile(WSP, LKC, Flag, CsS, s1 * CPS, c_map, acc, worker, pre, tmn, 0, tid, True)
                        ring.consumer_release(last_unit(ib, tmn[2], KC, 1))
                elif KS:
                    # consumers 1 .. NC - 1 hand their sums to consumer 0 (thread for thread: the same accumulator
                    # layout); the first barrier also keeps them from overwriting Red before consumer 0 read the last
                    # tile's
                    # (Cs lies in Red: the last tile's store must have read it before consumers 1 .. write Red)
                    if c == 0:
                        bulk_wait(0, read=True)
                    if ROUNDS:
                        # one slot: consumer o + 1 writes it in round o, consumer 0 adds it before the next round
                        for o in T.unroll(NC - 1):
                            T.ptx.bar.sync(T.uint32(3), T.uint32(128 * NC))
                            if c == o + 1:
                                for i in T.unroll(NACC):
                                    Red[0, i, tid] = acc[i]
                            T.ptx.bar.sync(T.uint32(4), T.uint32(128 * NC))
                            if c == 0:
                                for i in T.unroll(NACC):
                                    acc[i] = acc[i] + Red[0, i, tid]
                        if c == 0:
                            store_tile(WSP, LKC, Flag, Cs, 0, c_map, acc, worker, pre, tmn, 0, tid)
                    else:
                        T.ptx.bar.sync(T.uint32(3), T.uint32(128 * NC))
                        if c > 0:
                            for i in T.unroll(NACC):
                                Red[c - 1, i, tid] = acc[i]
                        T.ptx.bar.sync(T.uint32(4), T.uint32(128 * NC))
                        if c == 0:
                            for i in T.unroll(NACC):
                                for o in T.unroll(NC - 1):
                                    acc[i] = acc[i] + Red[o, i, tid]
                            store_tile(WSP, LKC, Flag, Cs, 0, c_map, acc, worker, pre, tmn, 0, tid)
                else:
                    store_tile(WSP, LKC, Flag, Cs, c, c_map, acc, worker, pre, tmn, c, tid)
            bulk_wait(0, read=False)

    if SK:
        WS_SHAPE, LK_SHAPE = (shape for shape, _ in stream_k_workspace(cfg, sms))

    @T.inline
    def entry(A, W, S, Z, C, WSP, LKC):
        x_map = x_map_t.encode(A)
        xt_map = T.meta_var(xt_map_t.encode(A, box=(x_rows(), CHUNK)) if FIT else x_map)
        w_map = w_map_t.encode(T.decl_buffer((N // 16, KT, 32 * WPC), "int32", data=W.data))
        S16 = T.decl_buffer((N // 16, K // G, 16), dtype, data=S.data)    # S's rows of 4 x 4 scales as one row
        s_map = s_map_t.encode(S16)
        z_map = T.meta_var(z_map_t.encode(T.decl_buffer((N // 16, K // G, 16), dtype, data=Z.data)) if HAS_Z
                           else s_map)
        c_map = c_map_t.encode(C)
        T.device_entry()
        body(A, W, S, C, x_map, xt_map, w_map, s_map, z_map, c_map, WSP, LKC)

    if HAS_Z and SK:
        @T.prim_func
        def gemm(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, KT, 32, WPC), "int32"),
                 S: T.Buffer((N // 16, K // G, 4, 4), dtype), Z: T.Buffer((N // 16, K // G, 4, 4), ZD),
                 C: T.Buffer((M, N), dtype), WSP: T.Buffer(WS_SHAPE, "float32"), LKC: T.Buffer(LK_SHAPE, "int32")):
            entry(A, W, S, Z, C, WSP, LKC)
    elif HAS_Z:
        @T.prim_func
        def gemm(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, KT, 32, WPC), "int32"),
                 S: T.Buffer((N // 16, K // G, 4, 4), dtype), Z: T.Buffer((N // 16, K // G, 4, 4), ZD),
                 C: T.Buffer((M, N), dtype)):
            entry(A, W, S, Z, C, None, None)
    elif SK:
        @T.prim_func
        def gemm(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, KT, 32, WPC), "int32"),
                 S: T.Buffer((N // 16, K // G, 4, 4), dtype), C: T.Buffer((M, N), dtype),
                 WSP: T.Buffer(WS_SHAPE, "float32"), LKC: T.Buffer(LK_SHAPE, "int32")):
            entry(A, W, S, S, C, WSP, LKC)
    else:
        @T.prim_func
        def gemm(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, KT, 32, WPC), "int32"),
                 S: T.Buffer((N // 16, K // G, 4, 4), dtype), C: T.Buffer((M, N), dtype)):
            entry(A, W, S, S, C, None, None)

    return (programmatic_dependent_launch(gemm) if PDL else gemm), cfg
