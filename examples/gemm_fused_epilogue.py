"""A hand-composed GEMM with a custom fused epilogue: C = alpha * act(A @ B.T + bias), fp16 in, fp32 accumulators,
fp16 out.

The main loop is the quick start's (examples/quickstart.py). Instead of ``em.stmatrix`` the epilogue loops over the
accumulators of ``C_frag`` in TIR: ``em.accumulator_coords(lane, i, j, e)`` gives the (m, n) of element ``e`` of micro
tile (i, j) inside the warp tile and ``em.accumulator_value(C_frag, i, j, e)`` its value; both take loop variables.
``T.unroll`` loops keep every register index constant after unrolling (a ``T.serial`` loop would index the registers
dynamically and put C_frag in local memory).
"""
import math

import torch

import mmaemit
from mmaemit import TensorCoreIntrinEmitter, make_mma_swizzle_layout
from tvm.script import tirx as T

ACTIVATIONS = ("gelu", "silu", "none")


def activation(x, kind):
    """``kind`` applied to the float32 PrimExpr ``x``: GELU (tanh approximation), SiLU or the identity."""
    if kind == "gelu":
        return 0.5 * x * (1.0 + T.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    if kind == "silu":
        return x / (1.0 + T.exp(-x))
    if kind == "none":
        return x
    raise ValueError(f"activation must be one of {ACTIVATIONS}, not {kind!r}")


def activation_reference(x, kind):
    """The same activations on a float64 torch tensor."""
    if kind == "gelu":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return x * torch.sigmoid(x) if kind == "silu" else x


def make_fused_gemm(M, N, K, act="gelu", alpha=0.5, arch=None):
    """(prim_func ``gemm(A [M, K], B [N, K], bias [N] fp32, C [M, N] fp16)``, emitter)."""
    activation(T.float32(0), act)  # rejects an unknown activation before parsing
    em = TensorCoreIntrinEmitter("float16", "float16", "float32", b_transposed=True, block_row_warps=2,
                                 block_col_warps=2, warp_row_tiles=32, warp_col_tiles=32, chunk=32, arch=arch)
    BM, BN, BK, NT = em.block_m, em.block_n, em.block_k, em.threads
    if M % BM or N % BN or K % BK:
        raise ValueError(f"M, N, K must be multiples of {BM}, {BN}, {BK}; got {M}, {N}, {K}")
    swz = make_mma_swizzle_layout((BM, BK), "float16")

    @T.prim_func
    def gemm(A: T.Buffer((M, K), "float16"), B: T.Buffer((N, K), "float16"), bias: T.Buffer((N,), "float32"),
             C: T.Buffer((M, N), "float16")):
        T.device_entry()
        bn, bm = T.cta_id([N // BN, M // BM])
        warp = T.warp_id([em.num_warps])
        lane = T.lane_id([32])
        As = T.alloc_buffer((BM, BK), "float16", scope="shared")
        Bs = T.alloc_buffer((BN, BK), "float16", scope="shared")
        a, b, c = em.alloc_fragments()
        em.fill_accumulators(c)
        for ko in T.serial(K // BK):
            for t in T.serial(BM * BK // NT):
                e = T.meta_var(t * NT + warp * 32 + lane)
                As[swz(e // BK, e % BK)] = A[bm * BM + e // BK, ko * BK + e % BK]
                Bs[swz(e // BK, e % BK)] = B[bn * BN + e // BK, ko * BK + e % BK]
            T.cuda.cta_sync()
            for ki in T.unroll(em.k_steps):
                em.ldmatrix_a(a, As, ki, warp=warp, lane=lane, layout=swz)
                em.ldmatrix_b(b, Bs, ki, warp=warp, lane=lane, layout=swz)
                em.mma(a, b, c)
            T.cuda.cta_sync()
        # the fused epilogue: every accumulator this lane holds, straight from registers to global memory
        wm, wn, _ = T.meta_var(em.warp_coords(warp))
        for i in T.unroll(em.warp_rows):
            for j in T.unroll(em.warp_cols):
                for e in T.unroll(em.accumulator_elems):
                    m, n = T.meta_var(em.accumulator_coords(lane, i, j, e))
                    row = T.meta_var(bm * BM + wm * em.warp_row_tiles + m)
                    col = T.meta_var(bn * BN + wn * em.warp_col_tiles + n)
                    x = T.meta_var(em.accumulator_value(c, i, j, e) + bias[col])
                    C[row, col] = T.Cast("float16", T.float32(alpha) * activation(x, act))

    return gemm, em


def reference(A, B, bias, act="gelu", alpha=0.5):
    """float64 alpha * act(A @ B.T + bias)."""
    return alpha * activation_reference(A.double() @ B.double().T + bias.double(), act)


if __name__ == "__main__":
    M, N, K = 256, 256, 512
    if torch.cuda.is_available():
        func, _ = make_fused_gemm(M, N, K)
        kernel = mmaemit.compile(func)
        A, B = torch.randn(M, K, device="cuda").half(), torch.randn(N, K, device="cuda").half()
        bias = torch.randn(N, device="cuda")
        C = torch.full((M, N), float("nan"), device="cuda").half()   # poisoned: every element must be written
        kernel(A, B, bias, C)
        print("max |err|:", (C.double() - reference(A, B, bias)).abs().max().item())
    else:
        func, _ = make_fused_gemm(M, N, K, arch="sm_80")
        print(mmaemit.compile(func, target="sm_80").instruction_mix())
