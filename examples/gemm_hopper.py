import torch, mmaemit
from tvm.script import tirx as T
from mmaemit import WgmmaIntrinEmitter
from mmaemit.pipeline import MbarrierRing, TmaTile, WarpgroupRoles

M, N, K, BN, STAGES = 256, 256, 512, 128, 4   # C = A @ B.T: A [M, K], B [N, K] fp16 (both K-major), C fp16
em = WgmmaIntrinEmitter("float16", accum_dtype="float32", n=BN, block_m=128, block_k=64, stages=(STAGES,))
BM, BK = em.block_m, em.block_k               # 2 consumer warpgroups x 64 rows; 64 halves = one 128-byte swizzle row
a_tma = TmaTile.for_layout((M, K), em.shared_layout("A"))    # TMA box + swizzle = the layout wgmma's descriptor reads
b_tma = TmaTile.for_layout((N, K), em.shared_layout("B"))
ring = MbarrierRing(STAGES, 2)                # full / empty barrier per stage; 2 consumers release each stage
roles = WarpgroupRoles(1, 2, 40, 232)         # warpgroup 0 loads (40 registers), 1 and 2 compute (232 each)

@T.prim_func
def gemm(A: T.Buffer((M, K), "float16"), B: T.Buffer((N, K), "float16"), C: T.Buffer((M, N), "float16")):
    a_map = a_tma.encode(A)                   # host side: the tensor maps, from the kernel's own buffers
    b_map = b_tma.encode(B)
    T.device_entry()
    T.attr(WarpgroupRoles.launch_attr())
    bn, bm = T.cta_id([N // BN, M // BM])
    wg = T.warpgroup_id([roles.warpgroups])
    tid = T.thread_id_in_wg([128])
    pool = T.SMEMPool()
    As = pool.alloc(em.a_shared_shape, "float16", align=1024)
    Bs = pool.alloc(em.b_shared_shape, "float16", align=1024)
    bars = ring.alloc(pool)  # noqa: F841
    pool.commit()
    ring.init(T.And(wg == 0, tid == 0))
    T.cuda.cta_sync()
    if wg == 0:                               # producer: one thread issues the TMA loads of each K block
        roles.producer_setup()
        if tid == 0:
            for kt in T.serial(K // BK):
                ring.producer_acquire(kt)     # wait until both consumers released this stage
                ring.producer_expect(kt, (BM + BN) * BK * 2)
                a_tma.load(As.ptr_to([ring.stage(kt), 0, 0]), a_map, (bm * BM, kt * BK), ring.full_ptr(kt))
                b_tma.load(Bs.ptr_to([ring.stage(kt), 0, 0]), b_map, (bn * BN, kt * BK), ring.full_ptr(kt))
    else:                                     # consumers: rows [64 c, 64 c + 64) of the CTA tile
        roles.consumer_setup()
        c = T.meta_var(roles.consumer_index(wg))
        acc = em.alloc_accumulators()
        da = em.alloc_descriptor()
        db = em.alloc_descriptor()
        em.init_descriptor(da, As, "A")
        em.init_descriptor(db, Bs, "B")
        for kt in T.serial(K // BK):
            ring.consumer_wait(kt)            # the stage's TMA bytes have landed
            em.fence()
            em.mma_block(acc, da, db, stage=(ring.stage(kt),), m0=64 * c, scale_d=kt > 0)
            em.commit_group()
            em.wait_group(0)
            ring.consumer_release(kt, pred=tid == 0)
        em.pin_accumulators(acc)
        em.store_accumulators(acc, C, tid, row0=bm * BM + 64 * c, col0=bn * BN)

if __name__ == "__main__":
    print(em)                                 # the instruction, tiles and descriptors it derived
    A, B = torch.randn(M, K, dtype=torch.float16), torch.randn(N, K, dtype=torch.float16)
    C = torch.full((M, N), float("nan"), dtype=torch.float16)
    if torch.cuda.is_available() and mmaemit.arch.device_arch().name == "sm_90a":
        A, B, C = A.cuda(), B.cuda(), C.cuda()
        mmaemit.compile(gemm)(A, B, C)        # C = A @ B.T on the H100
    else:                                     # no H100: the interpreter runs the same kernel with PTX semantics
        mmaemit.interpret(gemm, A, B, C)
    err = (C.float() - A.float() @ B.float().T).abs().max().item()
    print(f"max |error| vs float32 = {err:.3g}")
    assert err < 0.5
