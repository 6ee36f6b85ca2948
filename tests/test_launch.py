"""Programmatic dependent launch: the launch tag reaches TVM's launch parameters of marked kernels only, the kernels
that use it are marked where the arch has griddepcontrol, the interpreter runs griddepcontrol and the bulk L2
prefetch (with their checks), and on the H100 a marked kernel really starts while the one before it runs."""
import numpy as np
import pytest
import torch
from tvm.script import tirx as T

import mmaemit
from mmaemit.errors import ArchError, UnsupportedConfigError
from mmaemit.interpret import MisalignedAccessError, OutOfBoundsError
from mmaemit.kernels.dequant_gemm import GemvConfig, make_dequant_gemv
from mmaemit.kernels.dequant_gemm_hopper import HopperDequantConfig, make_dequant_gemm_hopper
from mmaemit.runtime.build import device_launch_params
from mmaemit.runtime.launch import PDL_TAG, programmatic_dependent_launch, uses_programmatic_dependent_launch


def _probe_kernels(n_iter):
    """P triggers its dependents at entry, spins, then sets F[0] = 1; Q reads F[0] before and after
    griddepcontrol.wait into O[0], O[1]."""
    @T.prim_func
    def P(F: T.Buffer((4,), "int32"), X: T.Buffer((4,), "float32")):
        T.device_entry()
        cta = T.cta_id([1])  # noqa: F841
        tx = T.thread_id([32])
        T.ptx.griddepcontrol.launch_dependents()
        acc = T.alloc_local((1,), "float32")
        acc[0] = X[1]
        for _ in T.serial(n_iter):
            acc[0] = acc[0] * acc[0] * T.float32(0.5) + X[2]     # not affine: ptxas cannot fold the loop
        if tx == 0:
            X[0] = acc[0]
            F[0] = 1

    @T.prim_func
    def Q(F: T.Buffer((4,), "int32"), O: T.Buffer((4,), "int32")):
        T.device_entry()
        cta = T.cta_id([1])  # noqa: F841
        tx = T.thread_id([32])
        v = T.alloc_local((1,), "uint32")
        T.ptx["ld.volatile.global.b32"](v[0], F.ptr_to([0]))
        T.ptx.griddepcontrol.wait()
        if tx == 0:
            O[0] = T.Cast("int32", v[0])
            O[1] = F[0]

    return P, Q


def test_only_marked_kernels_get_the_launch_tag():
    P, Q = _probe_kernels(4)
    assert not uses_programmatic_dependent_launch(Q)
    plain = device_launch_params(Q)
    marked = device_launch_params(programmatic_dependent_launch(Q))
    assert uses_programmatic_dependent_launch(programmatic_dependent_launch(Q))
    assert all(PDL_TAG not in tags for tags in plain.values())
    assert [t for t in marked.values()] == [[t for t in tags if t != "tirx.use_dyn_shared_memory"] + [PDL_TAG] +
                                            [t for t in tags if t == "tirx.use_dyn_shared_memory"]
                                            for tags in plain.values()]


@pytest.mark.parametrize("arch, expect", [("sm_90a", True), ("sm_80", False), ("sm_89", False), (None, False)])
def test_gemv_uses_pdl_where_the_arch_has_griddepcontrol(arch, expect):
    func, _ = make_dequant_gemv(None, 256, 1024, 128, "float16", GemvConfig(), arch, m_max=8)
    (tags,) = device_launch_params(func, arch or "sm_80").values()
    assert (PDL_TAG in tags) == expect and tags[-1] == "tirx.use_dyn_shared_memory", tags
    func, _ = make_dequant_gemv(None, 256, 1024, 128, "float16", GemvConfig(pdl=False), "sm_90a", m_max=8)
    assert all(PDL_TAG not in t for t in device_launch_params(func).values())
    with pytest.raises(ArchError, match="griddepcontrol.*sm_90"):
        make_dequant_gemv(None, 256, 1024, 128, "float16", GemvConfig(pdl=True), "sm_80", m_max=8)
    with pytest.raises(UnsupportedConfigError, match="pdl_prefetch"):
        make_dequant_gemv(None, 256, 1024, 128, "float16", GemvConfig(pdl_prefetch=-2), "sm_90a", m_max=8)


def test_fused_kernel_is_marked_by_default():
    for pdl in (True, False):
        func, _ = make_dequant_gemm_hopper(None, 256, 1024, 128, "float16", HopperDequantConfig(block_m=32, pdl=pdl),
                                           "sm_90a")
        (tags,) = device_launch_params(func).values()
        assert (PDL_TAG in tags) == pdl, tags
    with pytest.raises(UnsupportedConfigError, match="pdl_prefetch"):
        make_dequant_gemm_hopper(None, 256, 1024, 128, "float16", HopperDequantConfig(block_m=32, pdl_prefetch=-1),
                                 "sm_90a")


def _prefetching(offset, size):
    @T.prim_func
    def f(A: T.Buffer((128,), "float32")):
        T.device_entry()
        tx = T.thread_id([32])
        T.ptx.griddepcontrol.launch_dependents()
        if tx == 0:
            T.ptx["cp.async.bulk.prefetch.L2.global"](A.ptr_to([offset]), T.uint32(size))
        T.ptx.griddepcontrol.wait()
        A[tx] = A[tx] + T.float32(1)
    return f


def test_interpreter_runs_griddepcontrol_and_checks_bulk_prefetch():
    a = np.arange(128, dtype=np.float32)
    report = mmaemit.interpret(programmatic_dependent_launch(_prefetching(0, 512)), a, arch="sm_90a")
    assert report.ok and np.array_equal(a[:32], np.arange(32) + 1) and np.array_equal(a[32:], np.arange(32, 128))
    with pytest.raises(OutOfBoundsError, match="prefetch.*512 bytes at byte 16"):
        mmaemit.interpret(_prefetching(4, 512), np.zeros(128, np.float32), arch="sm_90a")
    with pytest.raises(MisalignedAccessError, match="multiples of 16"):
        mmaemit.interpret(_prefetching(0, 40), np.zeros(128, np.float32), arch="sm_90a")
    with pytest.raises(ArchError, match="sm_90"):
        mmaemit.interpret(_prefetching(0, 512), np.zeros(128, np.float32), arch="sm_80")


@pytest.mark.gpu
def test_marked_kernel_starts_while_the_previous_one_runs():
    """Q's read of P's flag before griddepcontrol.wait sees P unfinished when both are marked (a programmatic
    launch), never without the mark; after the wait it always sees P's write."""
    P, Q = _probe_kernels(200_000)
    seen = {}
    for pdl in (False, True):
        mark = programmatic_dependent_launch if pdl else (lambda f: f)
        kp, kq = mmaemit.compile(mark(P), target="sm_90a"), mmaemit.compile(mark(Q), target="sm_90a")
        F = torch.zeros(4, dtype=torch.int32, device="cuda")
        O = torch.full((4,), -1, dtype=torch.int32, device="cuda")
        X = torch.tensor([0, 0.5, 0.25, 0], device="cuda")
        runs = []
        for _ in range(4):
            F.zero_()
            kp(F, X)
            kq(F, O)
            torch.cuda.synchronize()
            runs.append(tuple(O[:2].tolist()))
        seen[pdl] = runs
    assert all(r == (1, 1) for r in seen[False]), seen
    assert all(r[1] == 1 for r in seen[True]) and sum(r[0] == 0 for r in seen[True]) >= 3, seen


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 40])
def test_chained_pdl_kernels_read_their_producers_output(M):
    """Four dequant GEMMs in a row on one stream (K = N), each reading the previous one's output as its activations,
    with no synchronization between them: every kernel is a programmatic launch, so each must wait (griddepcontrol)
    before it reads what the one before writes. Poisoned outputs; each layer against the float64 product of its
    input."""
    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments

    n = 1024
    g = torch.Generator().manual_seed(M)
    if M <= 16:
        func, _ = make_dequant_gemv(None, n, n, 128, "float16", GemvConfig(), "sm_90a", m_max=8 if M == 1 else 16)
    else:
        func, _ = make_dequant_gemm_hopper(None, n, n, 128, "float16", HopperDequantConfig(block_m=48), "sm_90a")
    assert all(PDL_TAG in t for t in device_launch_params(func).values())
    kernel = mmaemit.compile(func, target="sm_90a")         # one kernel, four layers of weights
    layers, refs = [], []
    for i in range(4):
        qw = D.quantize(torch.randn(n, n, generator=g).half() / 16, D.QuantScheme("int4", group_size=128))
        tensors, kw = kernel_arguments(qw)
        layers.append((kernel, [t.cuda() for t in tensors]))
        refs.append(qw.dequantize().double().cuda())
    x = torch.randn(M, n, generator=g).half().cuda()
    outs = [torch.full((M, n), float("nan"), device="cuda", dtype=torch.float16) for _ in layers]
    torch.cuda.synchronize()
    for (k, ts), a, c in zip(layers, [x] + outs[:-1], outs):
        k(a, *ts, c)
    torch.cuda.synchronize()
    for i, w in enumerate(refs):
        assert not torch.isnan(outs[i]).any()
        # each layer's input is the previous layer's fp16 output: compare layer by layer from that input
        one = (outs[i - 1].double() if i else x.double()) @ w.T
        assert ((outs[i].double() - one).norm() / one.norm()).item() < 3e-3, i
