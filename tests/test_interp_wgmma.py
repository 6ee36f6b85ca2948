"""Hopper wgmma on the CPU interpreter: descriptor and layout semantics against independent references, whole
kernels against float64 matmuls, and the asynchronous-model diagnostics.

References are independent of ``mmaemit.ptx.wgmma``: descriptor fields cut out of the binary string by the
PTX ISA bit table, TVM's own C encoder compiled on the host, shared-memory layouts enumerated by hand per swizzle
mode (and the PTX ISA's worked tf32 example), fragment maps transcribed from the ISA, numpy float64 products.
"""
import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import interp_wgmma_kernels as K
from mmaemit.errors import ArchError, UnsupportedConfigError
from mmaemit.interpret import (DivergenceError, OutOfBoundsError, ProxyFenceError, WgmmaBeforeWaitError,
                               WgmmaFenceError, WgmmaOperandError, interpret)
from mmaemit.ptx import wgmma as W

RNG = np.random.default_rng(2024)
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


# ---------------------------------------------------------------------------------------------------------------------
# matrix descriptors
# ---------------------------------------------------------------------------------------------------------------------

def test_decode_reads_the_isa_bit_fields():
    for d in RNG.integers(0, 2 ** 63, 200, dtype=np.uint64).tolist() + [2 ** 64 - 1, 0]:
        d = int(d) | (int(RNG.integers(0, 2)) << 63)
        bits = format(d, "064b")[::-1]                      # bits[i] = bit i

        def field(lo, hi):                                   # bits lo..hi inclusive, as the ISA table lists them
            return int(bits[lo:hi + 1][::-1], 2)
        got = W.decode_matrix_descriptor(d)
        assert got.start == field(0, 13) * 16 and got.lbo == field(16, 29) * 16 and got.sbo == field(32, 45) * 16
        assert got.base_offset == field(49, 51) and got.layout_type == field(62, 63)
        assert got.swizzle_bytes == {0: 0, 1: 128, 2: 64, 3: 32}[field(62, 63)]


def _tvm_encoder_source():
    """TVM's C encoder and GmmaDescriptor union, cut out of a kernel it generated, wrapped for a host build."""
    import tvm

    tgt = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with tgt:
        ex = tvm.compile(K.wgmma_gemm(8, 16), target=tgt, tir_pipeline="tirx")
    src = ex.mod.imports[0].inspect_source()
    i = src.index("#ifndef HOST_DEVICE")
    union = src[i:src.index("};", src.index("union GmmaDescriptor")) + 2]
    m = re.search(r"__forceinline__ __device__ void ptx_wgmma_encode_matrix_descriptor\(.*?\n}\n", src, re.S)
    return ("#include <cstdint>\n#include <cstdio>\n#define __forceinline__ inline\n#define __host__\n"
            "#define __device__\n"
            "static inline uint32_t __cvta_generic_to_shared(const void* p) { return (uint32_t)(uintptr_t)p; }\n"
            + union + "\n" + m.group(0) +
            "int main() { unsigned long long a; int l, s, w;\n"
            "  while (scanf(\"%llu %d %d %d\", &a, &l, &s, &w) == 4) { uint64_t d;\n"
            "    ptx_wgmma_encode_matrix_descriptor(&d, (void*)(uintptr_t)a, l, s, w);\n"
            "    printf(\"%llu\\n\", (unsigned long long)d); } }\n")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build TVM's encoder on the host")
def test_encode_matches_tvm_c_encoder_built_on_the_host(tmp_path):
    (tmp_path / "enc.cpp").write_text(_tvm_encoder_source())
    subprocess.run(["g++", "-std=c++17", "-O1", "-o", str(tmp_path / "enc"), str(tmp_path / "enc.cpp")], check=True)
    cases = [(int(RNG.integers(0, 2 ** 18)) & ~15, int(RNG.integers(-2 ** 15, 2 ** 15)),
              int(RNG.integers(-2 ** 15, 2 ** 15)), int(RNG.integers(-1, 6))) for _ in range(300)]
    cases += [(1024, 1, 64, 3), (0, 8, 64, 0), (4096 + 32, 1, 32, 2), (2 ** 18 - 16, 16383, 16383, 1)]
    out = subprocess.run([str(tmp_path / "enc")], input="\n".join(" ".join(map(str, c)) for c in cases),
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == len(cases)
    for c, want in zip(cases, out):
        assert W.encode_matrix_descriptor(*c) == int(want), c
    vec = W.encode_matrix_descriptor(*(np.array(col) for col in zip(*cases)))
    assert vec.dtype == np.uint64 and [int(v) for v in vec] == [int(v) for v in out]
    d = W.decode_matrix_descriptor(W.encode_matrix_descriptor(2048 + 96, 1, 64, 3))
    assert (d.start, d.lbo, d.sbo, d.base_offset, d.swizzle_bytes) == (2048 + 96, 16, 1024, 0, 128)


# ---------------------------------------------------------------------------------------------------------------------
# K-major shared-memory layouts and fragments
# ---------------------------------------------------------------------------------------------------------------------

def _expected_chunk_addresses(start, lbo, sbo, width, rows, chunks):
    """Hand enumeration: 8-row atoms SBO apart; no swizzle: 16-byte rows, chunk j at + j LBO; W-byte swizzle: W-byte
    rows whose 16-byte chunk c is stored at c ^ phase, phase = (row % 8) // (8 / (W / 16)), on the absolute address
    (start = tile + offset inside the row; the tile is aligned to the 8-row atom, 8 W bytes)."""
    out = np.zeros((rows, chunks), np.int64)
    for r in range(rows):
        for j in range(chunks):
            if width == 0:
                out[r, j] = start + (r // 8) * sbo + (r % 8) * 16 + j * lbo
                continue
            atom = 8 * width
            tile = start - start % atom
            col = start % atom + 16 * j                      # byte column inside row 0 of the atom
            phase = (r % 8) // (8 // (width // 16))
            chunk = (col // 16) ^ phase
            out[r, j] = tile + (r // 8) * sbo + (r % 8) * width + chunk * 16 + col % 16
    return out


@pytest.mark.parametrize("layout_type", [0, 1, 2, 3])
def test_kmajor_addresses_match_hand_enumeration(layout_type):
    width = {0: 0, 1: 128, 2: 64, 3: 32}[layout_type]
    for _ in range(20):
        rows = 8 * int(RNG.integers(1, 33))
        if width:
            # a step s of k16 inside a W-byte row: start = atom-aligned tile + 32 s
            start = 1024 * int(RNG.integers(0, 64)) + 32 * int(RNG.integers(0, width // 32))
            lbo, sbo = 16, 8 * width * int(RNG.integers(1, 4))
        else:
            start, lbo, sbo = 16 * int(RNG.integers(0, 4096)), 16 * int(RNG.integers(8, 64)), 16 * int(RNG.integers(8, 64))
        d = W.decode_matrix_descriptor(W.encode_matrix_descriptor(start, lbo >> 4, sbo >> 4,
                                                                  {0: 0, 1: 3, 2: 2, 3: 1}[layout_type]))
        assert d.layout_type == layout_type
        np.testing.assert_array_equal(W.kmajor_chunk_addresses(d, rows),
                                      _expected_chunk_addresses(start, lbo, sbo, width, rows, 2))


def test_kmajor_no_swizzle_matches_the_isa_tf32_example():
    # PTX ISA, K-major no-swizzling tf32: Swizzle<0,4,3> o ((8,2),(4,4)):((4,32),(1,64)) in tf32 elements,
    # LBO = 64 * 4 bytes, SBO = 32 * 4 bytes
    d = W.MatrixDescriptor(start=2048, lbo=256, sbo=128, base_offset=0, layout_type=0)
    got = W.kmajor_chunk_addresses(d, 16, chunks=4)
    for r in range(16):
        for k in range(16):
            elem = (r % 8) * 4 + (r // 8) * 32 + (k % 4) * 1 + (k // 4) * 64
            assert got[r, k // 4] + 4 * (k % 4) == 2048 + 4 * elem


@pytest.mark.parametrize("width, lbo, sbo", [
    # PTX ISA MN-major bf16 examples: exact layouts ((8,W/16,2),(8,2)):((1,8,LBO),(8 W/16,SBO)) in elements
    (0, 128, 64),                                    # no swizzle: ((8,1,2),(8,2)):((1,8,64),(8,128))
    (32, 128, 256), (64, 256, 512),
])
def test_mnmajor_addresses_match_the_isa_bf16_examples(width, lbo, sbo):
    d = W.MatrixDescriptor(start=4096, lbo=2 * lbo, sbo=2 * sbo, base_offset=0,
                           layout_type={0: 0, 32: 3, 64: 2}[width])
    per = 1 if width == 0 else width // 16                  # 16-byte chunks per swizzle row
    got = W.mnmajor_chunk_addresses(d, 16, 2 * per)          # (k, chunk): 16 K rows, 2 atoms of MN chunks
    for k in range(16):
        for mn in range(0, 16 * per, 8):
            c = mn // 8
            if width == 0:                                   # MN: (8,1,2):(1,8,SBO); K: (8,2):(8,LBO)
                elem = mn % 8 + sbo * (mn // 8) + 8 * (k % 8) + lbo * (k // 8)
            else:                                            # MN: (8,per,2):(1,8,LBO); K: (8,2):(8 per,SBO)
                elem = mn % 8 + 8 * (c % per) + lbo * (c // per) + 8 * per * (k % 8) + sbo * (k // 8)
            addr = 4096 + 2 * elem
            if width:                                        # Swizzle<b,4,3> on the byte address
                addr ^= ((addr >> 7) & (per - 1)) << 4
            assert got[k, c] == addr, (k, mn)


def test_swizzle_address_xors_chunk_bits_with_row_bits():
    a = RNG.integers(0, 2 ** 18, 500)
    for width, nbits in ((128, 3), (64, 2), (32, 1)):
        got = W.swizzle_address(a, width)
        for x, y in zip(a.tolist(), got.tolist()):
            chunk = (x >> 4) & ((1 << nbits) - 1)
            row = (x >> 7) & ((1 << nbits) - 1)
            assert y == (x & ~(((1 << nbits) - 1) << 4)) | ((chunk ^ row) << 4)
        np.testing.assert_array_equal(W.swizzle_address(got, width), a)     # an involution
    np.testing.assert_array_equal(W.swizzle_address(a, 0), a)


@pytest.mark.parametrize("atype", ["f16", "bf16"])
def test_fragment_maps_follow_the_isa(atype):
    ar, ac = W.wgmma_a_coords(atype)
    dr, dc = W.wgmma_d_coords(24)
    for t in range(128):
        w, g, c = t // 32, (t % 32) // 4, t % 4
        for q in range(4):                       # a_q holds (row, 2c + 8 (q // 2) + e) for rows g + 8 (q % 2)
            for e in range(2):
                assert (ar[t, 2 * q + e], ac[t, 2 * q + e]) == (16 * w + g + 8 * (q % 2), 2 * c + 8 * (q // 2) + e)
        for j in range(3):
            for h in range(2):
                for e in range(2):
                    assert (dr[t, 4 * j + 2 * h + e], dc[t, 4 * j + 2 * h + e]) == (16 * w + g + 8 * h, 8 * j + 2 * c + e)


def test_wgmma_mma_scales_and_ignores_d_without_scale_d():
    n = 40
    a = RNG.standard_normal((64, 16)).astype(np.float16)
    b = RNG.standard_normal((16, n)).astype(np.float16)
    d = RNG.standard_normal((64, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    got = W.wgmma_mma(n, "f16", a.view(np.uint16), b.view(np.uint16), d, True, -1, 1)
    np.testing.assert_allclose(got, -ref + d, rtol=1e-6, atol=1e-6)
    nan_d = np.full((64, n), np.nan, np.float32)
    got = W.wgmma_mma(n, "f16", a.view(np.uint16), b.view(np.uint16), nan_d, False, 1, -1)
    np.testing.assert_allclose(got, -ref, rtol=1e-6, atol=1e-6)
    assert got.dtype == np.float32


# ---------------------------------------------------------------------------------------------------------------------
# whole kernels
# ---------------------------------------------------------------------------------------------------------------------

def _run(N=64, KC=64, dtype="float16", warpgroups=1, on_error="raise", **kw):
    A = RNG.standard_normal((64 * warpgroups, KC)).astype(NP[dtype])
    X = RNG.standard_normal((N, KC)).astype(NP[dtype])
    C = np.full((64 * warpgroups, N), np.nan, np.float32)          # poisoned: every element must be written
    report = interpret(K.wgmma_gemm(N, KC, dtype, warpgroups=warpgroups, **kw), A, X, C, arch="sm_90a",
                       on_error=on_error)
    ref = A.astype(np.float64) @ X.astype(np.float64).T * (-1.0 if kw.get("neg_b") else 1.0)
    return C, ref, report


@pytest.mark.parametrize("N,dtype", [(64, "float16"), (256, "float16"), (64, "bfloat16"), (256, "bfloat16")])
def test_probe_kernel_rs_sw128_matches_float64(N, dtype):
    """The lead's H100-verified probe: RS, B K-major 128-byte swizzle, ldo 1, sdo 64, +32 bytes per k16."""
    C, ref, report = _run(N, 64, dtype)
    np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-5)
    assert report.ok and not report.diagnostics and report.stats["wgmma"] == 4


@pytest.mark.parametrize("kw", [
    dict(swizzle=0), dict(swizzle=1), dict(swizzle=2),                       # no swizzle, 32-byte, 64-byte
    dict(form="ss"), dict(form="ss", swizzle=1, dtype="bfloat16"),
    dict(desc_math=True), dict(desc_math=True, form="ss"),                   # uint64 descriptor arithmetic
    dict(wait="end"), dict(wait="pipelined", swizzle=0),                     # 4 groups in flight; wait_group 1
    dict(neg_b=True, zero_init=False),                                      # imm-scale-b -1, scale-d false
    dict(warpgroups=2), dict(warpgroups=2, form="ss", wait="end"),
    dict(a_via_ptx=True, N=8),
    dict(b_cp_async=True, N=128), dict(b_cp_async=True, swizzle=2, wait="end"),       # B staged by cp.async
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_kernel_variants_match_float64(kw):
    kw = dict(kw)
    C, ref, report = _run(kw.pop("N", 64), kw.pop("KC", 64), kw.pop("dtype", "float16"), **kw)
    np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-5)
    assert report.ok and not report.diagnostics


def test_dynamic_pool_is_placed_at_its_requested_alignment_after_static_shared():
    # a 16-byte static buffer precedes the pool; the 128-byte swizzle (absolute address bits) only reproduces the
    # stored layout if the pool starts 1024-byte aligned as align=1024 asks
    C, ref, report = _run(static_smem=True)
    np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-5)
    assert report.ok
    (warn,) = report.of_kind("assumed_alignment")
    assert "1024" in warn.message


def test_wait_group_1_retires_only_the_older_group():
    A = RNG.standard_normal((64, 32)).astype(np.float16)
    X = RNG.standard_normal((8, 32)).astype(np.float16)
    C0, C1 = (np.full((64, 8), np.nan, np.float32) for _ in range(2))
    report = interpret(K.wgmma_two_groups(), A, X, C0, C1, arch="sm_90a")
    a, x = A.astype(np.float64), X.astype(np.float64)
    np.testing.assert_allclose(C0, a[:, :16] @ x[:, :16].T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(C1, a[:, 16:] @ x[:, 16:].T, rtol=1e-5, atol=1e-5)
    assert report.ok and not report.diagnostics
    with pytest.raises(WgmmaBeforeWaitError, match=r"read of register acc1\[0\]"):
        interpret(K.wgmma_two_groups(read_pending=True), A, X, C0, C1, arch="sm_90a")


# ---------------------------------------------------------------------------------------------------------------------
# diagnostics: each broken rule raises its error (default on_error="raise")
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,error,pattern", [
    (dict(wait="late"), WgmmaBeforeWaitError, r"read of register acc\[0\] while a wgmma"),
    (dict(wait="none"), WgmmaBeforeWaitError, r"read of register acc"),
    (dict(commit=False, wait="end"), WgmmaBeforeWaitError, r"read of register acc"),
    (dict(reuse_a=True, wait="end"), WgmmaBeforeWaitError, r"write to register af\[0\]"),
    (dict(reuse_a=True, wait="end", a_via_ptx=True), WgmmaBeforeWaitError, r"write to register af\[0\]"),
    (dict(smem_overwrite=True, wait="end"), WgmmaBeforeWaitError, r"write to shared memory that a wgmma"),
    (dict(fence="none"), WgmmaFenceError, r"first wgmma.mma_async without a wgmma.fence"),
    (dict(fence="once"), WgmmaFenceError, r"A-fragment register af\[0\] was accessed"),
    (dict(proxy_fence=False), ProxyFenceError, r"no fence.proxy.async"),
    (dict(proxy_fence=False, b_cp_async=True), ProxyFenceError, r"no fence.proxy.async"),
    (dict(desc_warp_skew=True), WgmmaOperandError, r"B descriptor differs between the threads"),
    (dict(guard_warps=True), DivergenceError, r"64 of the 128 threads of warpgroup 0"),
    (dict(desc_extra=1 << 13), OutOfBoundsError, r"outside the CTA's"),
], ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else None)
def test_broken_rule_raises(kw, error, pattern):
    with pytest.raises(error, match=pattern):
        _run(**kw)


def test_report_mode_lists_a_read_before_wait_and_the_unretired_operations():
    C, ref, report = _run(wait="none", on_error="report")
    kinds = {d.kind for d in report.errors}
    assert kinds == {"wgmma_before_wait"}
    assert any("never retired" in d.message for d in report.errors)
    assert not np.allclose(C, ref)          # the accumulators were read before any wgmma landed


def test_unsupported_forms_are_refused():
    # (MN-major f16 / bf16 operands, imm-trans = 1, run: tests/test_wgmma_emitter.py)
    with pytest.raises(UnsupportedConfigError, match=r"base offset 1"):
        _run(desc_extra=1 << 49)
    with pytest.raises(ArchError):
        A = np.ones((64, 64), np.float16)
        interpret(K.wgmma_gemm(), A, A, np.zeros((64, 64), np.float32), arch="sm_90")


def test_fence_proxy_async_is_gated_at_sm_90():
    from tvm.script import tirx as T

    @T.prim_func
    def fenced(A: T.Buffer((32,), "float32")):
        T.device_entry()
        _cta = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        A[lane] = A[lane] + T.float32(1)
        T.ptx.fence.proxy.async_()

    for arch in ("sm_90", "sm_90a", "sm_100a"):
        a = np.arange(32, dtype=np.float32)
        assert interpret(fenced, a, arch=arch).ok
        np.testing.assert_array_equal(a, np.arange(32) + 1)
    with pytest.raises(ArchError, match="sm_90"):
        interpret(fenced, np.zeros(32, np.float32), arch="sm_89")


def test_unimplemented_wgmma_type_names_what_is_implemented():
    from tvm.script import tirx as T

    @T.prim_func
    def b1(C: T.Buffer((64, 8), "uint32")):
        T.device_entry()
        _cta = T.cta_id([1])
        _warp = T.warp_id([4])
        _lane = T.lane_id([32])
        acc = T.alloc_local((4,), "uint32")
        desc = T.alloc_local((1,), "uint64")
        T.ptx.wgmma.fence.sync.aligned()
        T.ptx["wgmma.mma_async.sync.aligned.m64n8k256.s32.b1.b1.and.popc"](acc[0], acc[1], acc[2], acc[3], desc[0],
                                                                           desc[0], False)
        C[0, 0] = acc[0]

    with pytest.raises(UnsupportedConfigError, match=r"wgmma_b1_ss.*implemented:.*wgmma_f16_rs"):
        interpret(b1, np.zeros((64, 8), np.uint32), arch="sm_90a")


def test_mn_major_semantics_agree_with_the_h100_verified_attention_kernel():
    """The Hopper attention kernel's ``v_major="mn"`` variant builds its N-major V descriptor by hand (LBO = the
    64-column panel stride, SBO = 1024 B) and was checked on the H100; the interpreter's MN-major wgmma reproduces
    its float64 result, an independent check of ``mnmajor_chunk_addresses``."""
    import torch

    from mmaemit.kernels.flash_attention import reference
    from mmaemit.kernels.flash_attention_hopper import HopperAttentionConfig, make_flash_attention_hopper

    g = torch.Generator().manual_seed(3)
    lens_q, lens_k, H, HK, D = [150, 40], [150, 100], 2, 1, 64
    TQ, TK = sum(lens_q), sum(lens_k)
    q, k, v = (torch.randn(T_, h, D, generator=g).half() for T_, h in ((TQ, H), (TK, HK), (TK, HK)))
    cq = torch.tensor([0, 150, 190], dtype=torch.int32)
    ck = torch.tensor([0, 150, 250], dtype=torch.int32)
    func, _ = make_flash_attention_hopper(2, 150, TQ, TK, H, HK, D, "float16", True, None,
                                          HopperAttentionConfig(block_n=64, v_major="mn"), "sm_90a")
    o = torch.full((TQ, H * D), float("nan"), dtype=torch.float16)
    lse = torch.full((H, TQ), float("nan"))
    report = interpret(func, q.view(TQ, -1), k.view(TK, -1), v.view(TK, -1), o, lse, cq, ck, arch="sm_90a")
    assert report.ok, report.summary()
    ro, rl = reference(q, k, v, True, None, cq, ck)
    assert (o.view(TQ, H, D).double() - ro.double()).abs().max().item() < 2e-3
    assert (lse - rl).abs().max().item() < 1e-5
