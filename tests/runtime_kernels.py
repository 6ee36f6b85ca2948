"""Small real tirx kernels for the runtime tests (factories: ``@T.prim_func`` captures Python values at decoration)."""
import tvm
from tvm.script import tirx as T


def mma_tile():
    """One warp: C[16,8] (f32) = A[16,16] (f16, row-major) @ B[16,8] (f16, row-major).

    A and B go through shared memory (plain stores), then ldmatrix.x4 (A) and ldmatrix.x2.trans (B) feed one
    mma.sync m16n8k16; the accumulator starts at zero. Fragment rules: PTX ISA "Matrix fragments for mma.m16n8k16".
    """

    @T.prim_func
    def mma_tile(A: T.Buffer((16, 16), "float16"), B: T.Buffer((16, 8), "float16"), C: T.Buffer((16, 8), "float32")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        As = T.alloc_buffer((16, 16), "float16", scope="shared")
        Bs = T.alloc_buffer((16, 8), "float16", scope="shared")
        a = T.alloc_local((4,), "uint32")
        b = T.alloc_local((2,), "uint32")
        c = T.alloc_local((4,), "float32")
        for i in T.unroll(8):
            As[(lane * 8 + i) // 16, (lane * 8 + i) % 16] = A[(lane * 8 + i) // 16, (lane * 8 + i) % 16]
        for i in T.unroll(4):
            Bs[(lane * 4 + i) // 8, (lane * 4 + i) % 8] = B[(lane * 4 + i) // 8, (lane * 4 + i) % 8]
        for i in T.unroll(4):
            c[i] = T.float32(0)
        T.cuda.cta_sync()
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(a[0], a[1], a[2], a[3],
                                                        As.ptr_to([lane % 16, 8 * (lane // 16)]))
        T.ptx.ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16(b[0], b[1], Bs.ptr_to([lane % 16, 0]))
        T.ptx.mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3],
                                                                 b[0], b[1], c[0], c[1], c[2], c[3])
        g = T.meta_var(lane // 4)
        q = T.meta_var(lane % 4)
        C[g, 2 * q] = c[0]
        C[g, 2 * q + 1] = c[1]
        C[g + 8, 2 * q] = c[2]
        C[g + 8, 2 * q + 1] = c[3]

    return mma_tile


def vector_copy():
    """B[n] = A[n] (f16), one 16-byte load and one 16-byte store per thread, 128 threads x 8 elements per CTA."""
    n = tvm.tirx.Var("n", "int32")

    @T.prim_func
    def vector_copy(A: T.Buffer((n,), "float16"), B: T.Buffer((n,), "float16")):
        T.device_entry()
        bx = T.cta_id([T.ceildiv(n, 1024)])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        base = T.meta_var(bx * 1024 + (warp * 32 + lane) * 8)
        if base < n:
            for i in T.vectorized(8):
                B[base + i] = A[base + i]

    return vector_copy


def cp_async_reverse():
    """B[256] = A[256] with the 32 16-byte chunks reversed: cp.async each chunk into smem, wait, barrier, reread."""

    @T.prim_func
    def cp_async_reverse(A: T.Buffer((256,), "float16"), B: T.Buffer((256,), "float16")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        sm = T.alloc_buffer((256,), "float16", scope="shared")
        T.ptx["cp.async.cg.shared.global"](sm.ptr_to([lane * 8]), A.ptr_to([lane * 8]), 16)
        T.ptx["cp.async.commit_group"]()
        T.ptx["cp.async.wait_group"](0)
        T.cuda.cta_sync()
        for i in T.vectorized(8):
            B[(31 - lane) * 8 + i] = sm[(31 - lane) * 8 + i]

    return cp_async_reverse


def stmatrix_store():
    """stmatrix.x4 of 4 registers per lane into shared memory, then a copy out (stmatrix needs sm_90)."""

    @T.prim_func
    def stmatrix_store(A: T.Buffer((32, 4), "uint32"), B: T.Buffer((32, 16), "float16")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        sm = T.alloc_buffer((32, 16), "float16", scope="shared")
        r = T.alloc_local((4,), "uint32")
        for i in T.unroll(4):
            r[i] = A[lane, i]
        T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(sm.ptr_to([lane, 0]), r[0], r[1], r[2], r[3])
        T.cuda.cta_sync()
        for i in T.vectorized(8):
            B[lane, i] = sm[lane, i]

    return stmatrix_store


def mma_fp8():
    """One e4m3 x e4m3 -> f32 mma.sync m16n8k32 on register fragments loaded from global memory."""

    @T.prim_func
    def mma_fp8(A: T.Buffer((32, 4), "uint32"), B: T.Buffer((32, 2), "uint32"), C: T.Buffer((32, 4), "float32")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        a = T.alloc_local((4,), "uint32")
        b = T.alloc_local((2,), "uint32")
        c = T.alloc_local((4,), "float32")
        for i in T.unroll(4):
            a[i] = A[lane, i]
            c[i] = T.float32(0)
        for i in T.unroll(2):
            b[i] = B[lane, i]
        T.ptx.mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3],
                                                                   b[0], b[1], c[0], c[1], c[2], c[3])
        for i in T.unroll(4):
            C[lane, i] = c[i]

    return mma_fp8


def wgmma_fence_only():
    """Only ``wgmma.fence`` (sm_90a): enough to exercise the arch-specific gate."""

    @T.prim_func
    def wgmma_fence_only(A: T.Buffer((32,), "float32")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        T.ptx.wgmma.fence.sync.aligned()
        A[lane] = T.float32(1)

    return wgmma_fence_only


def elect_and_asm():
    """``T.cuda.elect_sync`` plus a ``T.cuda.func_call`` whose source holds ``barrier.cluster`` asm (both sm_90)."""

    src = ('__device__ void cluster_barrier() { asm volatile("barrier.cluster.arrive.aligned;\\n\\t"'
           ' "barrier.cluster.wait.aligned;" ::: "memory"); }')

    @T.prim_func
    def elect_and_asm(A: T.Buffer((32,), "uint32")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        T.cuda.func_call("cluster_barrier", source_code=src, return_type="void")
        if T.cuda.elect_sync():
            A[lane] = T.uint32(1)

    return elect_and_asm


def symbolic_shapes():
    """Signature-only kernel for argument checks: A[m, k], B[k, 2*m] f32, alpha f32 scalar, C[m, k] f32."""
    m = tvm.tirx.Var("m", "int32")
    k = tvm.tirx.Var("k", "int32")

    @T.prim_func
    def symbolic_shapes(A: T.Buffer((m, k), "float32"), B: T.Buffer((k, m * 2), "float32"), alpha: T.float32,
                        C: T.Buffer((m, k), "float32")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        if lane == 0:
            C[0, 0] = A[0, 0] * alpha + B[0, 0]

    return symbolic_shapes


def declared_strides():
    """A[4, 8] declared with strides (s, 1) (tvm 0.27 still indexes it as compact), C[4, 8] = A."""
    s = tvm.tirx.Var("s", "int32")

    @T.prim_func
    def declared_strides(A: T.Buffer((4, 8), "float32", strides=(s, 1)), C: T.Buffer((4, 8), "float32")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        C[lane // 8, lane % 8] = A[lane // 8, lane % 8]

    return declared_strides


def legacy_mma():
    """One ``T.ptx_legacy.mma`` f16 x f16 -> f32 m16n8k16 on (uninitialised) local fragments: only scanned."""

    @T.prim_func
    def legacy_mma(C: T.Buffer((16, 8), "float32")):
        T.device_entry()
        bx = T.cta_id([1])
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        a = T.alloc_local((8,), "float16")
        b = T.alloc_local((4,), "float16")
        c = T.alloc_local((4,), "float32")
        T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", a.data, 0, b.data, 0, c.data, 0, False,
                         dtype="float32")
        C[0, 0] = c[0]

    return legacy_mma
