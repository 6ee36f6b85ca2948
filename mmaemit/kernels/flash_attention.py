"""FlashAttention forward (mma.sync, sm_80+) composed from mmaemit's building blocks.

``O = softmax(scale * Q K^T [+ causal mask]) V`` and ``LSE = log(sum(exp(scale * Q K^T)))`` per query row, for Q, K,
V in ``[batch, seqlen, heads, head_dim]`` (fp16 or bf16, head dim 64 / 128 / 256), GQA / MQA (``kv_heads`` dividing
``heads``), ragged per-batch sequence lengths (``cu_seqlens``: int32 prefix sums, tokens packed ``[total, heads, d]``),
masked in the kernel. One CTA computes ``block_m`` query rows of one (batch, head):

1. ``cp.async`` (``mmaemit.pipeline.CpAsyncTile``, zero-fill at the tensor's end) copies the Q tile once and K / V
   blocks of ``block_n`` keys into a 2-stage ring of swizzled shared tiles; a K block is fetched while the previous
   block's ``P V`` runs, a V block while the current ``Q K^T`` and softmax run.
2. ``S = Q K^T``: ``TensorCoreIntrinEmitter`` (Q: ldmatrix, K stored [keys, d] = B K-contiguous: ldmatrix),
   m16n8k16 into float32 accumulators; each warp owns ``16 * warp_rows`` query rows and all ``block_n`` keys.
3. Online softmax in float32 on the accumulators (row max over the 4 lanes of a row with ``shfl.sync.bfly``,
   ``exp2`` with the scale folded into log2 units, running max / sum, O rescaled by ``exp2(m_old - m_new)``); masked
   keys (past the sequence end, or after the query under ``causal``) become ``-inf`` only in blocks that need it.
4. ``P`` goes from the S accumulators straight into the A fragments of ``O += P V``: the register packing is
   ``mmaemit.layouts.accumulator_as_operand`` (two n8 accumulator tiles = one k16 A step, same lane, proven by
   enumeration), one ``cvt.rn.{f16,bf16}x2.f32`` per A register. V stored [keys, d] is B N-contiguous: ldmatrix.trans.
5. Epilogue: O / rowsum stored from registers (rows past the sequence end skipped), LSE (natural log, float32).

Causal masking is aligned bottom-right (query ``i`` sees keys ``j <= i + seqlen_k - seqlen_q``; the usual
top-left mask when the lengths are equal). A query row that sees no key gets O = 0 and LSE = -inf.

    python -m mmaemit.kernels.flash_attention --seqlen 4096 --heads 16 --head-dim 128     # needs a GPU
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mmaemit import TensorCoreIntrinEmitter
from mmaemit.dtypes import canonical
from mmaemit.emitters.builder import emit, only_if, ptx, store
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices
from mmaemit.layouts.accumulator_operand import accumulator_as_operand
from mmaemit.pipeline.cp_async import CpAsyncTile, cp_async_commit, cp_async_wait

from mmaemit.kernels.attention_spec import HEAD_DIMS, IMPLEMENTATIONS, LN2, LOG2E, KeyBlocks, check_problem


@dataclass(frozen=True)
class AttentionConfig:
    """Tile configuration: ``block_m`` query rows per CTA over ``warps`` warps (``block_m / warps`` rows each, a
    multiple of 16), ``block_n`` keys per K/V block, ``stages`` of the K/V ring."""

    block_m: int = 128
    block_n: int = 64
    warps: int = 4
    stages: int = 2


def default_config(head_dim, arch=None) -> AttentionConfig:
    """The hand-picked tiles per head dim (128 query rows, 4 warps of 32 rows; head dim 256: 16 rows per warp to keep
    the O accumulators in registers, 8 warps where shared memory allows 128 rows)."""
    if head_dim == 64:
        return AttentionConfig(128, 128, 4, 2)
    if head_dim == 128:
        return AttentionConfig(128, 64, 4, 2)
    sm90 = arch is not None and str(arch).startswith("sm_9")
    return AttentionConfig(128, 64, 8, 2) if sm90 else AttentionConfig(64, 64, 4, 2)


def smem_bytes(head_dim, dtype, config: AttentionConfig) -> int:
    return 2 * head_dim * (config.block_m + 2 * config.stages * config.block_n)


def make_flash_attention(batch, max_seqlen_q, total_q, total_k, heads, kv_heads, head_dim, dtype="float16",
                         causal=False, softmax_scale=None, config: AttentionConfig = None, arch=None):
    """Build ``attn(Q, K, V, O, LSE, cu_seqlens_q, cu_seqlens_k)``. Returns (prim_func, config).

    Q: ``[total_q, heads * head_dim]``, K / V: ``[total_k, kv_heads * head_dim]`` (tokens of every sequence packed;
    ``[batch, seqlen, heads, head_dim]`` viewed as 2-D), O like Q, LSE float32 ``[heads, total_q]``,
    ``cu_seqlens_*`` int32 ``[batch + 1]`` (sequence ``b`` is tokens ``cu[b] .. cu[b + 1] - 1``; no sequence of Q
    longer than ``max_seqlen_q``). ``softmax_scale`` defaults to ``1 / sqrt(head_dim)``.
    """
    from tvm.script import tirx as T

    dtype, scale = check_problem(dtype, head_dim, heads, kv_heads, softmax_scale)
    for name, v in (("batch", batch), ("max_seqlen_q", max_seqlen_q), ("total_q", total_q), ("total_k", total_k)):
        if not isinstance(v, int) or v < 1:
            raise TileShapeError(f"{name} must be a positive int, not {v!r}")
    cfg = config or default_config(head_dim, arch)
    D, BM, BN, NW, ST = head_dim, cfg.block_m, cfg.block_n, cfg.warps, cfg.stages
    if BM % (16 * NW) or BN % 16 or ST != 2:
        raise TileShapeError(f"{cfg}: block_m must be a multiple of 16 * warps, block_n of 16, stages 2")
    WR = BM // NW // 16                 # m16 tiles per warp
    THREADS = 32 * NW
    SL2 = scale * LOG2E
    H, HK, GROUP = heads, kv_heads, heads // kv_heads
    MB = -(-max_seqlen_q // BM)
    # S = Q K^T: A = Q tile [BM, D] (K-contiguous), B = K block [BN, D] = [N, K]
    em_s = TensorCoreIntrinEmitter(dtype, dtype, "float32", b_transposed=True, block_row_warps=NW, block_col_warps=1,
                                   warp_row_tiles=16 * WR, warp_col_tiles=BN, chunk=D, n_tile=16, arch=arch)
    # O += P V: A = P (registers), B = V block [BN, D] = [K, N] (N-contiguous: ldmatrix.trans)
    em_o = TensorCoreIntrinEmitter(dtype, dtype, "float32", b_transposed=False, block_row_warps=NW,
                                   block_col_warps=1, warp_row_tiles=16 * WR, warp_col_tiles=D, chunk=BN, n_tile=16,
                                   arch=arch)
    reuse = accumulator_as_operand(dtype, "float32")
    swz_q = em_s.shared_swizzle("A", (BM, D), dtype)
    swz_k = em_s.shared_swizzle("B", (ST, BN, D), dtype)
    swz_v = em_o.shared_swizzle("B", (ST, BN, D), dtype)
    q_copy = CpAsyncTile((total_q, H * D), dtype, (BM, D), THREADS, swz_q)
    k_copy = CpAsyncTile((total_k, HK * D), dtype, (BN, D), THREADS, swz_k)
    v_copy = CpAsyncTile((total_k, HK * D), dtype, (BN, D), THREADS, swz_v)
    R = 2 * WR                          # query rows per thread (two per m16 tile)
    KS_O = em_o.k_steps                 # = BN // 16 = micro tiles of S along keys
    CVT = "cvt.rn.f16x2.f32" if dtype == "float16" else "cvt.rn.bf16x2.f32"
    NEG_INF = float("-inf")

    def row_slot(em, i, j, e):
        """Which of this thread's R rows accumulator (i, j, e) is in (lane 0's m, divided by the 8-row step)."""
        return em.accumulator_coords(0, i, j, e)[0] // 8

    s_slots = [(i, j, e) for i in range(WR) for j in range(em_s.warp_cols) for e in range(em_s.local_size_c)]
    o_slots = [(i, j, e) for i in range(WR) for j in range(em_o.warp_cols) for e in range(em_o.local_size_c)]

    def quad_reduce(x, tmp, op):
        """x[r] = op over the 4 lanes holding row r (shfl.sync.bfly 1, 2)."""
        for r in range(R):
            for d in (1, 2):
                emit(T.ptx.shfl_sync.bfly.b32(tmp[0], x[r], T.uint32(d), T.uint32(0x1F), T.uint32(0xFFFFFFFF)))
                store(x, op(x[r], tmp[0]), (r,))

    def mask_scores(S, lim, warp, lane, q_row0, seq_q, seq_k, k0):
        """Scores of keys past the sequence (or after the query, causal) -> -inf. ``lim[r]``: the first masked key of
        row slot r, relative to the block."""
        for r in range(R):
            limit = seq_k - k0
            if causal:
                m = em_s.accumulator_coords(lane, r // 2, 0, 2 * (r % 2))[0]      # the row of slot r in the warp
                limit = T.min(limit, q_row0 + warp * 16 * WR + m + 1 + seq_k - seq_q - k0)
            store(lim, limit, (r,))
        for (i, j, e) in s_slots:
            n = em_s.accumulator_coords(lane, i, j, e)[1]
            store(S, T.Select(n >= lim[row_slot(em_s, i, j, e)], T.float32(NEG_INF), S[i, j, e]), (i, j, e))

    def online_softmax(S, O, P, m_i, l_i, mx, mu, tmp):
        """Running max / sum update, O rescale, P = exp2(S * scale_log2 - m) packed into the P V A fragments."""
        first = {}
        for (i, j, e) in s_slots:
            r = row_slot(em_s, i, j, e)
            if r not in first:
                first[r] = True
                store(mx, S[i, j, e], (r,))
            else:
                store(mx, T.max(mx[r], S[i, j, e]), (r,))
        quad_reduce(mx, tmp, T.max)
        for r in range(R):
            store(mx, T.max(m_i[r], mx[r] * T.float32(SL2)), (r,))                # new running max (log2 units)
            store(mu, T.Select(mx[r] == T.float32(NEG_INF), T.float32(0), mx[r]), (r,))   # all masked: no -inf - -inf
            store(tmp, T.exp2(m_i[r] - mu[r]), (1 + r,))                           # correction of the old terms
            store(m_i, mx[r], (r,))
            store(l_i, l_i[r] * tmp[1 + r], (r,))
        for (i, j, e) in o_slots:
            store(O, O[i, j, e] * tmp[1 + row_slot(em_o, i, j, e)], (i, j, e))
        for (i, j, e) in s_slots:
            r = row_slot(em_s, i, j, e)
            store(S, T.exp2(S[i, j, e] * T.float32(SL2) - mu[r]), (i, j, e))
            store(l_i, l_i[r] + S[i, j, e], (r,))
        # S micro tile j (keys 16 j .. 16 j + 15, n8 halves h = 0, 1) is A k-step j of P V: pack per the proven map
        c_regs = em_s.instruction.c_regs
        for j in range(KS_O):
            for i in range(WR):
                for a, ((h0, c0, _), (h1, c1, _)) in enumerate(reuse.pack_order()):
                    emit(ptx(CVT)(P[j][i, a], S[i, j, h1 * c_regs + c1], S[i, j, h0 * c_regs + c0]))

    def qk_gemm(Qs, Ks, stage, Qf, Kf, S, warp, lane):
        em_s.fill_accumulators(S)
        for ki in range(em_s.k_steps):
            em_s.ldmatrix_a(Qf, Qs, ki, warp=warp, lane=lane, layout=swz_q)
            em_s.ldmatrix_b(Kf, Ks[stage, 0:BN, 0:D], ki, warp=warp, lane=lane, layout=swz_k)
            em_s.mma(Qf, Kf, S)

    def pv_gemm(Vs, stage, P, Vf, O, warp, lane):
        for ki in range(KS_O):
            em_o.ldmatrix_b(Vf, Vs[stage, 0:BN, 0:D], ki, warp=warp, lane=lane, layout=swz_v)
            em_o.mma(P[ki], Vf, O)

    blocks = KeyBlocks(causal, BM, BN)          # which key blocks each CTA visits and masks (both kernels)
    keys_end, needs_mask = blocks.keys_end, blocks.needs_mask

    def alloc_p():
        return [T.alloc_local((WR, em_o.local_size_a), "uint32") for _ in range(KS_O)]

    def epilogue(O, Og, LSE, m_i, l_i, tmp, warp, lane, h, q_start, q_row0, seq_q):
        quad_reduce(l_i, tmp, lambda a, b: a + b)
        for r in range(R):
            store(tmp, T.Select(l_i[r] == T.float32(0), T.float32(0), T.float32(1) / l_i[r]), (1 + r,))
        for (i, j, e) in o_slots:
            store(O, O[i, j, e] * tmp[1 + row_slot(em_o, i, j, e)], (i, j, e))
        em_o.stmatrix(O, Og[q_start + q_row0:q_start + q_row0 + BM, h * D:h * D + D], warp=warp, lane=lane,
                      row_limit=seq_q - q_row0)
        with only_if(lane % 4 == 0):
            for i in range(WR):
                for hi in range(2):
                    r = 2 * i + hi
                    row = q_row0 + warp * 16 * WR + 16 * i + 8 * hi + lane // 4
                    with only_if(row < seq_q):
                        lse = T.Select(l_i[r] == T.float32(0), T.float32(NEG_INF),
                                       m_i[r] * T.float32(LN2) + T.log(l_i[r]))
                        store(LSE, lse, (h, q_start + row))

    @T.prim_func
    def flash_attention(Q: T.Buffer((total_q, H * D), dtype), K: T.Buffer((total_k, HK * D), dtype),
                        V: T.Buffer((total_k, HK * D), dtype), O: T.Buffer((total_q, H * D), dtype),
                        LSE: T.Buffer((H, total_q), "float32"), CuQ: T.Buffer((batch + 1,), "int32"),
                        CuK: T.Buffer((batch + 1,), "int32")):
        T.device_entry()
        bx, h, b = T.cta_id([MB, H, batch])
        warp = T.warp_id([NW])
        lane = T.lane_id([32])
        pool = T.SMEMPool()
        Qs = pool.alloc((BM, D), dtype, align=1024)
        Ks = pool.alloc((ST, BN, D), dtype, align=1024)
        Vs = pool.alloc((ST, BN, D), dtype, align=1024)
        pool.commit()
        Qf = T.alloc_local((WR, em_s.local_size_a), "uint32")
        Kf = T.alloc_local((em_s.warp_cols, em_s.local_size_b), "uint32")
        Vf = T.alloc_local((em_o.warp_cols, em_o.local_size_b), "uint32")
        S = T.alloc_local((WR, em_s.warp_cols, em_s.local_size_c), "float32")
        O_acc = T.alloc_local((WR, em_o.warp_cols, em_o.local_size_c), "float32")
        P = T.meta_var(alloc_p())
        m_i = T.alloc_local((R,), "float32")
        l_i = T.alloc_local((R,), "float32")
        mx = T.alloc_local((R,), "float32")
        mu = T.alloc_local((R,), "float32")
        tmp = T.alloc_local((R + 1,), "float32")
        lim = T.alloc_local((R,), "int32")
        tid = T.meta_var(warp * 32 + lane)
        q_start: T.let[T.int32] = CuQ[b]
        seq_q: T.let[T.int32] = CuQ[b + 1] - CuQ[b]
        k_start: T.let[T.int32] = CuK[b]
        seq_k: T.let[T.int32] = CuK[b + 1] - CuK[b]
        mb = T.meta_var(MB - 1 - bx)        # longest causal rows first
        q_row0 = T.meta_var(mb * BM)
        hk = T.meta_var(h // GROUP)
        if q_row0 < seq_q:
            n_end: T.let[T.int32] = keys_end(q_row0, seq_q, seq_k)
            nb: T.let[T.int32] = (n_end + BN - 1) // BN
            for r in T.unroll(R):
                m_i[r] = T.float32(NEG_INF)
                l_i[r] = T.float32(0)
            em_o.fill_accumulators(O_acc)
            q_copy.load(Qs, None, Q, (q_start + q_row0, h * D), tid, bounds=True)
            k_copy.load(Ks, 0, K, (k_start, hk * D), tid, bounds=True)
            cp_async_commit()
            v_copy.load(Vs, 0, V, (k_start, hk * D), tid, bounds=True)
            cp_async_commit()
            for n in T.serial(nb):
                cp_async_wait(1)            # Q and K block n landed (V block n may be in flight)
                T.cuda.cta_sync()           # ... for every thread; every warp is done with block n - 1
                if n + 1 < nb:
                    k_copy.load(Ks, (n + 1) % ST, K, (k_start + (n + 1) * BN, hk * D), tid, bounds=True)
                cp_async_commit()
                qk_gemm(Qs, Ks, n % ST, Qf, Kf, S, warp, lane)
                if needs_mask(n, q_row0, seq_q, seq_k):
                    mask_scores(S, lim, warp, lane, q_row0, seq_q, seq_k, n * BN)
                online_softmax(S, O_acc, P, m_i, l_i, mx, mu, tmp)
                cp_async_wait(1)            # V block n landed (K block n + 1 may be in flight)
                T.cuda.cta_sync()
                if n + 1 < nb:
                    v_copy.load(Vs, (n + 1) % ST, V, (k_start + (n + 1) * BN, hk * D), tid, bounds=True)
                cp_async_commit()
                pv_gemm(Vs, n % ST, P, Vf, O_acc, warp, lane)
            cp_async_wait(0)
            epilogue(O_acc, O, LSE, m_i, l_i, tmp, warp, lane, h, q_start, q_row0, seq_q)

    return flash_attention, cfg


# ---------------------------------------------------------------------------------------------------------------------
# torch entry points
# ---------------------------------------------------------------------------------------------------------------------

_KERNELS: dict = {}
_CU_SEQLENS: dict = {}


def _builder(implementation):
    if implementation not in IMPLEMENTATIONS:
        raise UnsupportedConfigError(f"implementation must be one of {choices(IMPLEMENTATIONS)}, not "
                                     f"{implementation!r}")
    if implementation == "wgmma":
        from mmaemit.kernels.flash_attention_hopper import make_flash_attention_hopper

        return make_flash_attention_hopper
    return make_flash_attention


def attention_kernel(batch, max_seqlen_q, total_q, total_k, heads, kv_heads, head_dim, dtype, causal, softmax_scale,
                     arch, config=None, implementation="mma_sync"):
    """The compiled kernel for one problem (cached per process; built through the cubin cache so the SASS checked on
    the CPU is what runs). ``implementation``: "mma_sync" (sm_80+) or "wgmma" (the Hopper kernel, sm_90a)."""
    import mmaemit

    key = (batch, max_seqlen_q, total_q, total_k, heads, kv_heads, head_dim, canonical(dtype), bool(causal),
           float(softmax_scale), str(arch), config, implementation)
    kernel = _KERNELS.get(key)
    if kernel is None:
        func, _ = _builder(implementation)(batch, max_seqlen_q, total_q, total_k, heads, kv_heads, head_dim, dtype,
                                           causal, softmax_scale, config, arch)
        kernel = _KERNELS[key] = mmaemit.compile(func, target=arch, cubin_cache=True)
    return kernel


def _dense_cu_seqlens(batch, seqlen, device):
    import torch

    key = (batch, seqlen, str(device))
    cu = _CU_SEQLENS.get(key)
    if cu is None:
        cu = _CU_SEQLENS[key] = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=device)
    return cu


def _check_inputs(q, k, v, varlen):
    import torch

    from mmaemit.errors import ArgumentError

    want = 3 if varlen else 4
    names = "[total, heads, head_dim]" if varlen else "[batch, seqlen, heads, head_dim]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != want:
            raise ArgumentError(f"{name} must be a {want}-d torch tensor {names}")
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dtype != q.dtype:
            raise ArgumentError(f"{name}: dtype {t.dtype}; q, k, v must all be torch.float16 or all torch.bfloat16")
        if t.device != q.device:
            raise ArgumentError(f"{name} is on {t.device}, q on {q.device}")
    if k.shape != v.shape:
        raise ArgumentError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if q.shape[-1] != k.shape[-1] or q.shape[-1] not in HEAD_DIMS:
        raise ArgumentError(f"head_dim of q ({q.shape[-1]}) and k ({k.shape[-1]}) must agree and be one of "
                            f"{choices(HEAD_DIMS)}")
    if q.shape[-2] % k.shape[-2]:
        raise ArgumentError(f"k/v heads ({k.shape[-2]}) must divide q heads ({q.shape[-2]}) (GQA / MQA)")
    if not varlen and q.shape[0] != k.shape[0]:
        raise ArgumentError(f"batch of q ({q.shape[0]}) and k ({k.shape[0]}) differ")


def _run(q2, k2, v2, o2, lse, cu_q, cu_k, batch, max_seqlen_q, heads, kv_heads, head_dim, causal, scale, config,
         implementation):
    dtype = "float16" if str(q2.dtype) == "torch.float16" else "bfloat16"
    if q2.device.type == "cpu":   # no GPU: the CPU interpreter runs the same kernel (slow; small problems only)
        from mmaemit.interpret import interpret

        arch = "sm_90a" if implementation == "wgmma" else "sm_80"
        func, _ = _builder(implementation)(batch, max_seqlen_q, q2.shape[0], k2.shape[0], heads, kv_heads, head_dim,
                                           dtype, causal, scale, config, arch)
        interpret(func, q2, k2, v2, o2, lse, cu_q, cu_k, arch=arch)
        return
    from mmaemit.arch import device_arch

    kernel = attention_kernel(batch, max_seqlen_q, q2.shape[0], k2.shape[0], heads, kv_heads, head_dim, dtype, causal,
                              scale, device_arch(q2.device.index or 0).name, config, implementation)
    kernel(q2, k2, v2, o2, lse, cu_q, cu_k)


def flash_attention(q, k, v, causal=False, softmax_scale=None, config=None, implementation="mma_sync"):
    """Attention forward on ``[batch, seqlen, heads, head_dim]`` tensors (k / v: ``[batch, seqlen_k, kv_heads,
    head_dim]``). Returns ``(O [batch, seqlen, heads, head_dim], LSE float32 [batch, heads, seqlen])``.

    ``implementation``: "mma_sync" (this module's kernel, sm_80+; ``config`` an ``AttentionConfig``) or "wgmma"
    (``mmaemit.kernels.flash_attention_hopper``, sm_90a; ``config`` a ``HopperAttentionConfig``). CUDA tensors run
    the compiled kernel (cached per shape); CPU tensors run it on the interpreter."""
    import torch

    _check_inputs(q, k, v, varlen=False)
    B, S, H, D = q.shape
    SK, HK = k.shape[1], k.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lse = torch.empty((H, B * S), dtype=torch.float32, device=q.device)
    cu_q = _dense_cu_seqlens(B, S, q.device)
    cu_k = _dense_cu_seqlens(B, SK, q.device)
    _run(q.view(B * S, H * D), k.view(B * SK, HK * D), v.view(B * SK, HK * D), o.view(B * S, H * D), lse, cu_q, cu_k,
         B, S, H, HK, D, causal, scale, config, implementation)
    return o, lse.view(H, B, S).permute(1, 0, 2)


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal=False, softmax_scale=None,
                           config=None, implementation="mma_sync"):
    """Attention over packed ragged sequences: q ``[total_q, heads, d]``, k / v ``[total_k, kv_heads, d]``,
    ``cu_seqlens_*`` int32 ``[batch + 1]`` prefix sums of the lengths (on q's device), ``max_seqlen_q`` >= every query
    length. Returns ``(O [total_q, heads, d], LSE float32 [heads, total_q])``."""
    import torch

    from mmaemit.errors import ArgumentError

    _check_inputs(q, k, v, varlen=True)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.device != q.device:
            raise ArgumentError(f"{name} must be a 1-d torch.int32 tensor on {q.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.shape[0] < 2:
        raise ArgumentError("cu_seqlens_q and cu_seqlens_k must both have batch + 1 >= 2 entries")
    TQ, H, D = q.shape
    HK = k.shape[1]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lse = torch.empty((H, TQ), dtype=torch.float32, device=q.device)
    _run(q.view(TQ, H * D), k.view(k.shape[0], HK * D), v.view(v.shape[0], HK * D), o.view(TQ, H * D), lse,
         cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), cu_seqlens_q.shape[0] - 1, int(max_seqlen_q), H, HK, D,
         causal, scale, config, implementation)
    return o, lse


def reference(q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """float64 reference (O, LSE) in the layouts ``flash_attention`` / ``flash_attention_varlen`` return (computed on
    the CPU; bottom-right causal mask; rows that see no key: O = 0, LSE = -inf)."""
    import torch

    def one(qb, kb, vb):
        H, HK, D = qb.shape[1], kb.shape[1], qb.shape[2]
        scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
        kb = kb.repeat_interleave(H // HK, 1)
        vb = vb.repeat_interleave(H // HK, 1)
        s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
        if causal:
            sq, sk = qb.shape[0], kb.shape[0]
            s = s.masked_fill(torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + sk - sq, float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.softmax(s, -1).nan_to_num(0.0)
        return torch.einsum("hqk,khd->qhd", p, vb), lse

    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    if cu_seqlens_q is None:
        outs = [one(q[b], k[b], v[b]) for b in range(q.shape[0])]
        return torch.stack([o for o, _ in outs]), torch.stack([lse for _, lse in outs])
    cq, ck = cu_seqlens_q.cpu().tolist(), cu_seqlens_k.cpu().tolist()
    outs = [one(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]) for b in range(len(cq) - 1)]
    return torch.cat([o for o, _ in outs]), torch.cat([lse for _, lse in outs], dim=1)


def flops(batch, seqlen_q, seqlen_k, heads, head_dim, causal) -> float:
    """Matmul FLOPs of the forward (4 * b * h * sq * sk * d; causal with equal lengths: half, the usual convention)."""
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return f / 2 if causal else f
