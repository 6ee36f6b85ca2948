import torch, mmaemit
from tvm.script import tirx as T
from mmaemit import TensorCoreIntrinEmitter, make_mma_swizzle_layout

M, N, K = 256, 256, 512                     # C = A @ B.T, fp16 in, fp32 out
em = TensorCoreIntrinEmitter("float16", "float16", "float32", b_transposed=True, block_row_warps=2,
                             block_col_warps=2, warp_row_tiles=32, warp_col_tiles=32, chunk=32)
BM, BN, BK, NT = em.block_m, em.block_n, em.block_k, em.threads
swz = make_mma_swizzle_layout((BM, BK), "float16")   # A and B tiles are both 64 x 32 here

@T.prim_func
def gemm(A: T.Buffer((M, K), "float16"), B: T.Buffer((N, K), "float16"), C: T.Buffer((M, N), "float32")):
    T.device_entry()
    bn, bm = T.cta_id([N // BN, M // BM])
    warp = T.warp_id([em.num_warps])
    lane = T.lane_id([32])
    As = T.alloc_buffer((BM, BK), "float16", scope="shared")
    Bs = T.alloc_buffer((BN, BK), "float16", scope="shared")
    a, b, c = em.alloc_fragments()
    em.fill_accumulators(c)
    for ko in T.serial(K // BK):
        for t in T.serial(BM * BK // NT):    # plain copies; see mmaemit/kernels/gemm_mma.py for cp.async
            e = T.meta_var(t * NT + warp * 32 + lane)
            As[swz(e // BK, e % BK)] = A[bm * BM + e // BK, ko * BK + e % BK]
            Bs[swz(e // BK, e % BK)] = B[bn * BN + e // BK, ko * BK + e % BK]
        T.cuda.cta_sync()
        for ki in T.unroll(em.k_steps):
            em.ldmatrix_a(a, As, ki, warp=warp, lane=lane, layout=swz)
            em.ldmatrix_b(b, Bs, ki, warp=warp, lane=lane, layout=swz)
            em.mma(a, b, c)
        T.cuda.cta_sync()
    em.stmatrix(c, C, warp=warp, lane=lane, block_row=bm, block_col=bn)

if torch.cuda.is_available():
    kernel = mmaemit.compile(gemm)
    A, B = torch.randn(M, K, device="cuda").half(), torch.randn(N, K, device="cuda").half()
    C = torch.full((M, N), float("nan"), device="cuda")   # poisoned: every element must be written
    kernel(A, B, C)
    print("max |err|:", (C - A.float() @ B.float().T).abs().max().item())
else:
    print(mmaemit.compile(gemm, target="sm_80").instruction_mix())
