"""mmaemit.runtime: compile, arch gating, SASS inspection, the cubin cache, argument checks, the interpreter hook."""
import sys
import types
import warnings

import pytest
import torch

import runtime_kernels as K
from mmaemit import runtime as rt
from mmaemit.arch import as_arch
from mmaemit.errors import ArchError, ArgumentError, PerformanceWarning, UnsupportedConfigError
from mmaemit.runtime import cache as rt_cache
from mmaemit.runtime import toolchain

MMA_F16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    # every test writes cubins to a throwaway dir, never to ~/.cache
    monkeypatch.setenv("MMAEMIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "mmaemit-cache"))


@pytest.fixture
def nvcc_calls(monkeypatch):
    """Count real nvcc compiles (cache hits must not reach this)."""
    calls = []
    real = toolchain._invoke_nvcc

    def counting(cmd):
        calls.append(cmd)
        return real(cmd)

    monkeypatch.setattr(toolchain, "_invoke_nvcc", counting)
    return calls


@pytest.fixture(scope="module")
def tile80():
    return rt.compile(K.mma_tile(), "sm_80")


# ------------------------------------------------------------------ compile, source, SASS

def test_cuda_source_holds_the_ptx(tile80):
    src = tile80.cuda_source
    assert f'"{MMA_F16} ' in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src and "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" in src
    assert 'extern "C" __global__' in src and "mma_tile_kernel" in src
    assert tile80.ptx_instructions == ("ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                                       "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16", MMA_F16)
    assert tile80.arch == as_arch("sm_80") and tile80.name == "mma_tile"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_mma_tile_sass_counts(tile80, arch):
    # one mma.sync -> one HMMA.16816.F32; ldmatrix.x4 -> LDSM.16.M88.4, ldmatrix.x2.trans -> LDSM.16.MT88.2
    sass = tile80.sass(arch)
    assert f"code for {arch}" in sass
    mix = tile80.instruction_mix(arch)
    assert (mix["HMMA"], mix["LDSM"], mix["BAR"], mix["STSM"], mix["LDGSTS"], mix["HGMMA"]) == (1, 2, 1, 0, 0, 0)
    hist = tile80.opcode_histogram(arch)
    assert hist["HMMA.16816.F32"] == 1
    assert hist["LDSM.16.M88.4"] == 1 and hist["LDSM.16.MT88.2"] == 1
    assert mix["LDS"] == sum(v for k, v in hist.items() if k.split(".")[0] == "LDS")  # LDSM is not LDS


def test_vector_copy_mix_is_exact():
    k = rt.compile(K.vector_copy(), "sm_80")
    mix = k.instruction_mix()
    assert (mix["LDG"], mix["STG"]) == (1, 1)
    assert all(mix[op] == 0 for op in ("HMMA", "LDSM", "LDS", "STS", "BAR", "LDGSTS"))
    hist = k.opcode_histogram()
    assert [op for op in hist if op.startswith("LDG")][0].startswith("LDG.E.128")
    assert hist["STG.E.128"] == 1


def test_cp_async_mix_is_exact():
    k = rt.compile(K.cp_async_reverse(), "sm_80")
    mix = k.instruction_mix()
    # 1 cp.async (16 B) -> LDGSTS; commit/wait -> LDGDEPBAR/DEPBAR; __syncthreads -> BAR; 16 B smem read, 16 B store
    assert (mix["LDGSTS"], mix["LDG"], mix["LDS"], mix["STS"], mix["STG"], mix["BAR"]) == (1, 0, 1, 0, 1, 1)
    assert mix["LDGDEPBAR"] == 1 and mix["DEPBAR"] == 1
    assert k.opcode_histogram()["LDGSTS.E.BYPASS.128"] == 1


def test_resource_usage(tile80):
    ru = tile80.resource_usage()
    assert ru.function == "mma_tile_kernel"
    assert ru.static_smem_bytes == 16 * 16 * 2 + 16 * 8 * 2  # As + Bs
    assert ru.barriers == 1 and ru.spill_bytes == 0 and ru.stack_frame_bytes == 0
    assert 8 <= ru.registers <= 64


def test_instruction_mix_of_source_matches_kernel(tile80):
    assert rt.instruction_mix_of_source(tile80.cuda_source, "sm_80") == tile80.instruction_mix()


# ------------------------------------------------------------------ SASS text parsing

SASS_SNIPPET = """
	code for sm_80
		Function : k_kernel
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;         /* 0x00000a00ff017624 */
        /*0010*/                   LDSM.16.M88.4 R8, [R18] ;                       /* 0x000000001208783b */
        /*0020*/                   LDS.128 R4, [R2] ;                              /* 0x0000000002047984 */
        /*0030*/               @P0 LDG.E.128 R4, [R2.64] ;                         /* 0x0000000402040981 */
        /*0040*/                   HMMA.16816.F32 R4, R8, R2, R4 ;                 /* 0x000000020804723c */
        /*0050*/                   HFMA2.MMA R5, -RZ, RZ, 0, 0 ;                   /* 0x00000000ff057435 */
        /*0060*/              @!PT LDS RZ, [RZ] ;                                  /* 0x00000000ffff7984 */
        /*0070*/              @!PT LDS RZ, [RZ] ;                                  /* 0x00000000ffff7984 */
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;                   /* 0x0000000000007b1d */
        /*0090*/                   EXIT ;                                          /* 0x000000000000794d */
		Function : other_kernel
        /*0000*/                   STS.64 [R0], R2 ;                               /* 0x0000000200007388 */
"""


def test_sass_parsing_counts_by_opcode_base():
    mix = rt.instruction_mix(SASS_SNIPPET)
    # @!PT padding is dropped; @P0 LDG counts; LDSM is not LDS; HFMA2.MMA is not HMMA
    assert (mix["LDSM"], mix["LDS"], mix["LDG"], mix["HMMA"], mix["BAR"], mix["STS"]) == (1, 1, 1, 1, 1, 1)
    assert mix["HFMA2"] == 1 and mix["QMMA"] == 0
    assert rt.opcode_histogram(SASS_SNIPPET, function="other_kernel") == {"STS.64": 1}
    with pytest.raises(UnsupportedConfigError, match="k_kernel"):
        rt.opcode_histogram(SASS_SNIPPET, function="nope")


def test_ptxas_log_parsing():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm_kernel' for 'sm_90a'
ptxas info    : Function properties for gemm_kernel
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 208 registers, used 1 barriers, 512 bytes smem
"""
    ru = rt.parse_ptxas_log(log)["gemm_kernel"]
    assert (ru.registers, ru.stack_frame_bytes, ru.spill_store_bytes, ru.spill_load_bytes, ru.static_smem_bytes,
            ru.barriers, ru.spill_bytes) == (208, 16, 12, 8, 512, 1, 20)


# ------------------------------------------------------------------ arch gating

def test_stmatrix_on_sm80_raises_before_any_compile(nvcc_calls, monkeypatch):
    import tvm

    def no_compile(*a, **kw):
        raise AssertionError("tvm.compile must not run for a rejected arch")

    func = K.stmatrix_store()
    monkeypatch.setattr(tvm, "compile", no_compile)
    with pytest.raises(ArchError, match=r"stmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16 needs sm_90"):
        rt.compile(func, "sm_80")
    assert nvcc_calls == []


def test_stmatrix_on_sm90a_sass_and_sm80_inspection_refused(nvcc_calls):
    k = rt.compile(K.stmatrix_store(), "sm_90a")
    assert k.instruction_mix()["STSM"] == 1
    n = len(nvcc_calls)
    with pytest.raises(ArchError, match="stmatrix"):
        k.sass("sm_80")
    assert len(nvcc_calls) == n  # refused before nvcc


def test_fp8_mma_gates_and_emulation_warning():
    func = K.mma_fp8()
    with pytest.raises(ArchError, match=r"m16n8k32\.row\.col\.f32\.e4m3\.e4m3\.f32 needs sm_89"):
        rt.compile(func, "sm_80")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # native on sm_89: no warning
        k89 = rt.compile(func, "sm_89")
    assert k89.instruction_mix()["QMMA"] == 1
    with pytest.warns(PerformanceWarning, match="emulated on sm_90"):
        k90 = rt.compile(func, "sm_90")
    # the emulation the table records: no QMMA on sm_90, the mma is rebuilt from HMMAs
    mix90 = k90.instruction_mix()
    assert mix90["QMMA"] == 0 and mix90["HMMA"] >= 2


def test_wgmma_needs_the_a_target():
    func = K.wgmma_fence_only()
    with pytest.raises(ArchError, match=r"wgmma\.fence\.sync\.aligned needs sm_90a"):
        rt.compile(func, "sm_90")
    assert rt.compile(func, "sm_90a").arch.name == "sm_90a"


def test_cuda_helpers_and_func_call_asm_are_gated():
    func = K.elect_and_asm()
    found = rt.ptx_instructions(func)
    assert "elect.sync" in found
    assert "barrier.cluster.arrive.aligned" in found and "barrier.cluster.wait.aligned" in found
    with pytest.raises(ArchError, match="elect.sync needs sm_90") as e:
        rt.compile(func, "sm_89")
    assert "barrier.cluster.arrive.aligned needs sm_90" in str(e.value)


def test_legacy_mma_is_scanned():
    assert rt.ptx_instructions(K.legacy_mma()) == (MMA_F16,)


def test_check_instructions_on_mnemonics():
    assert rt.check_instructions([MMA_F16, "lop3.b32"], "sm_80") == (MMA_F16, "lop3.b32")
    with pytest.warns(PerformanceWarning, match="s4"):
        rt.check_instructions(["mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32"], "sm_90a")
    with pytest.raises(ArchError, match="cp.async.bulk"):
        rt.check_instructions(["cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"],
                              "sm_89")


# ------------------------------------------------------------------ targets

def test_target_forms(monkeypatch):
    import tvm

    assert rt.resolve_target("sm_86")[0].name == "sm_86"
    assert rt.resolve_target(as_arch("sm_90a"))[1].arch == "sm_90a"
    tgt = tvm.target.Target({"kind": "cuda", "arch": "sm_89"})
    arch, same = rt.resolve_target(tgt)
    assert arch.name == "sm_89" and same is tgt
    with pytest.raises(UnsupportedConfigError, match="kind .llvm. is not supported; pass a CUDA target"):
        rt.resolve_target(tvm.target.Target({"kind": "llvm"}))
    with pytest.raises(ArchError, match="sm_90a"):
        rt.resolve_target("sm_61")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ArchError, match="no CUDA GPU.*'sm_80'.*'sm_90a'"):
        rt.resolve_target(None)


def test_name_sets_the_symbol():
    k = rt.compile(K.vector_copy(), "sm_80", name="copy16")
    assert k.name == "copy16" and "copy16_kernel" in k.cuda_source


# ------------------------------------------------------------------ cache

def test_cubin_cache_memory_disk_and_corruption(tmp_path, monkeypatch, nvcc_calls, tile80):
    monkeypatch.setenv("MMAEMIT_CACHE_DIR", str(tmp_path))
    cache = rt_cache.CompileCache()
    monkeypatch.setattr(toolchain, "COMPILE_CACHE", cache)
    monkeypatch.setattr(toolchain, "_SASS_MEMO", {})

    first = tile80.sass("sm_86")
    assert len(nvcc_calls) == 1 and "-gencode=arch=compute_86,code=sm_86" in nvcc_calls[0]
    assert tile80.sass("sm_86") == first and len(nvcc_calls) == 1  # memory hit
    assert cache.memory_hits >= 1

    cache.clear_memory()
    monkeypatch.setattr(toolchain, "_SASS_MEMO", {})
    assert tile80.sass("sm_86") == first and len(nvcc_calls) == 1  # disk hit
    assert cache.disk_hits == 1

    (cubin,) = tmp_path.glob("*.cubin")
    cubin.write_bytes(cubin.read_bytes()[:100])  # truncated entry: hash mismatch -> ignored, rebuilt
    cache.clear_memory()
    monkeypatch.setattr(toolchain, "_SASS_MEMO", {})
    assert tile80.sass("sm_86") == first and len(nvcc_calls) == 2
    (meta,) = tmp_path.glob("*.json")
    meta.write_text("{not json")
    cache.clear_memory()
    assert tile80.resource_usage("sm_86").static_smem_bytes == 768 and len(nvcc_calls) == 3
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no partial files

    tile80.sass("sm_89")  # another arch is another key
    assert len(nvcc_calls) == 4


def test_missing_cuobjdump_is_a_clear_error(monkeypatch):
    from mmaemit.errors import ToolchainError

    monkeypatch.delenv("MMAEMIT_CUOBJDUMP", raising=False)
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    monkeypatch.setattr(toolchain, "_cuda_home_bins", lambda: iter(()))
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: "/nonexistent/nvcc")
    monkeypatch.setitem(sys.modules, "nvidia", types.SimpleNamespace(__path__=[]))
    with pytest.raises(ToolchainError, match="pip install nvidia-cuda-cuobjdump"):
        toolchain.find_cuobjdump()


# ------------------------------------------------------------------ argument checks

@pytest.fixture(scope="module")
def symk():
    return rt.compile(K.symbolic_shapes(), "sm_80")


def _sym_args(m=4, k=8):
    return torch.randn(m, k), torch.randn(k, 2 * m), 1.5, torch.randn(m, k)


@pytest.fixture
def gpu_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_arg_count(symk):
    with pytest.raises(ArgumentError, match=r"takes 4 argument\(s\) symbolic_shapes\(A: float32\(m, k\).*got 3"):
        symk(*_sym_args()[:3])


def test_arg_not_a_tensor(symk):
    a, b, alpha, c = _sym_args()
    with pytest.raises(ArgumentError, match="'B' must be a torch.Tensor of float32.*got ndarray"):
        symk(a, b.numpy(), alpha, c)
    with pytest.raises(ArgumentError, match="'alpha' must be a Python number.*got Tensor"):
        symk(a, b, torch.tensor(1.5), c)


def test_arg_dtype_names_both(symk):
    a, b, alpha, c = _sym_args()
    with pytest.raises(ArgumentError, match="'C' must have dtype torch.float32, got torch.float16"):
        symk(a, b, alpha, c.half())


def test_arg_shape_and_symbolic_binding(symk):
    a, b, alpha, c = _sym_args(m=4, k=8)
    with pytest.raises(ArgumentError, match=r"'A' must be 2-D with shape \(m, k\), got 1-D shape \(32,\)"):
        symk(a.reshape(-1), b, alpha, c)
    with pytest.raises(ArgumentError, match=r"'C' must have shape \(m, k\) with m = 4 \(bound by A.shape\[0\]\), "
                                            r"got \(5, 8\)"):
        symk(a, b, alpha, torch.randn(5, 8))
    with pytest.raises(ArgumentError, match=r"'B' must have shape \(k, m \* 2\): shape\[1\] = m \* 2 = 8 "
                                            r"\(m bound by A.shape\[0\]\), got \(8, 9\)"):
        symk(a, torch.randn(8, 9), alpha, c)


def test_arg_non_contiguous(symk):
    a, b, alpha, c = _sym_args(m=8, k=8)
    with pytest.raises(ArgumentError, match="'A' must be contiguous.*strides \\(1, 8\\)"):
        symk(a.t(), b, alpha, c)


def test_declared_strides_bind_but_contiguity_is_required(fake_interpreter):
    k = rt.compile(K.declared_strides(), "sm_80")
    c = torch.randn(4, 8)
    k(torch.randn(4, 8), c)  # contiguous: strides (8, 1) bind s = 8
    assert len(fake_interpreter) == 1
    with pytest.raises(ArgumentError, match="'A' must be contiguous"):
        k(torch.randn(4, 16)[:, :8], c)  # strides (16, 1) match (s, 1), but tvm indexes A as compact
    assert len(fake_interpreter) == 1


def test_arg_alignment(symk):
    a, b, alpha, c = _sym_args(m=4, k=8)
    shifted = torch.randn(4 * 8 + 1)[1:].view(4, 8)  # contiguous, 4 bytes past a 16-byte boundary
    assert shifted.is_contiguous()
    with pytest.raises(ArgumentError, match="'A': data pointer must be 16-byte aligned.*storage_offset 1"):
        symk(shifted, b, alpha, c)


def test_arg_devices_differ(symk):
    a, b, alpha, c = _sym_args()
    with pytest.raises(ArgumentError, match="one device: 'A' is on cpu, 'C' is on meta"):
        symk(a, b, alpha, torch.empty(4, 8, device="meta"))


def test_arg_cpu_tensor_with_gpu_visible(symk, gpu_visible):
    with pytest.raises(ArgumentError, match="'A' is on cpu; symbolic_shapes runs on CUDA tensors.*MMAEMIT_INTERPRET"):
        symk(*_sym_args())


def test_arg_no_gpu(symk, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ArgumentError, match="no CUDA GPU is visible"):
        symk(*_sym_args())


def test_device_arch_compatibility(tile80, monkeypatch):
    k90a = rt.compile(K.mma_tile(), "sm_90a")
    for kernel, cap, ok in [(tile80, (8, 0), True), (tile80, (8, 9), True), (tile80, (9, 0), False),
                            (k90a, (9, 0), True), (k90a, (8, 9), False), (k90a, (10, 0), False)]:
        kernel._device_ok.clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i, cap=cap: cap)
        if ok:
            kernel._check_device_arch(torch.device("cuda", 0))
        else:
            with pytest.raises(ArgumentError, match=f"compiled for {kernel.arch.name} but cuda:0 is an "
                                                    f"sm_{cap[0]}{cap[1]} GPU"):
                kernel._check_device_arch(torch.device("cuda", 0))


# ------------------------------------------------------------------ out_idx and the interpreter hook

def test_out_idx_validation():
    func = K.symbolic_shapes()
    with pytest.raises(ArgumentError, match=r"valid indices -4\.\.3"):
        rt.compile(func, "sm_80", out_idx=4)
    with pytest.raises(ArgumentError, match="scalar parameter 'alpha'"):
        rt.compile(func, "sm_80", out_idx=2)
    with pytest.raises(ArgumentError, match="dim m is not fixed by the inputs"):
        rt.compile(func, "sm_80", out_idx=[0, 1, -1])  # only alpha left as an input: nothing binds m, k
    with pytest.raises(ArgumentError, match="'C' twice"):
        rt.compile(func, "sm_80", out_idx=[3, -1])
    k = rt.compile(func, "sm_80", out_idx=[0, 1])  # C alone binds m and k
    assert k.out_idx == (0, 1) and k.signature() == ("symbolic_shapes(alpha: float32, C: float32(m, k)) -> "
                                                     "(A: float32(m, k), B: float32(k, m * 2))")


@pytest.fixture
def fake_interpreter(monkeypatch):
    calls = []
    mod = types.ModuleType("mmaemit.interpret")

    def interpret(kernel, *tensors):
        calls.append((kernel, tensors))
        if kernel.out_idx:  # stand-in for the real interpreter: a visible effect on the allocated output
            tensors[-1].copy_(tensors[0] * tensors[2])

    mod.interpret = interpret
    monkeypatch.setitem(sys.modules, "mmaemit.interpret", mod)
    monkeypatch.setenv("MMAEMIT_INTERPRET", "1")
    return calls


def test_interpret_mode_allocates_outputs_and_accepts_cpu(fake_interpreter, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    k = rt.compile(K.symbolic_shapes(), "sm_80", out_idx=-1)
    a, b, _, _ = _sym_args(m=3, k=5)
    alpha = 2  # an int for a float32 parameter is passed on as a float
    out = k(a, b, alpha)
    ((kernel, tensors),) = fake_interpreter
    assert kernel is k and len(tensors) == 4 and tensors[0] is a and tensors[1] is b
    assert type(tensors[2]) is float and tensors[2] == 2.0
    assert tensors[3] is out and out.shape == (3, 5) and out.dtype == torch.float32 and out.device == a.device
    torch.testing.assert_close(out, a * alpha)
    with pytest.raises(ArgumentError, match="dtype"):  # checks still run in interpreter mode
        k(a.double(), b, alpha)


def test_interpret_mode_without_the_module(monkeypatch, symk):
    monkeypatch.setenv("MMAEMIT_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "mmaemit.interpret", None)  # import fails
    with pytest.raises(ImportError, match="MMAEMIT_INTERPRET is set but mmaemit.interpret cannot be imported"):
        symk(*_sym_args())


# ------------------------------------------------------------------ on a GPU (the lead runs these on an H100)

@pytest.mark.gpu
def test_gpu_mma_tile_matches_reference():
    k = rt.compile(K.mma_tile())  # the visible GPU's arch
    torch.manual_seed(0)
    a = torch.randn(16, 16, device="cuda").half()
    b = torch.randn(16, 8, device="cuda").half()
    c = torch.full((16, 8), float("nan"), device="cuda")
    assert k(a, b, c) is None
    torch.cuda.synchronize()
    ref = (a.double() @ b.double()).float()
    assert not c.isnan().any()
    torch.testing.assert_close(c, ref, rtol=1e-4, atol=1e-4)  # fp32 accumulation of exact fp16 products


@pytest.mark.gpu
def test_gpu_out_idx_allocates_and_returns():
    k = rt.compile(K.mma_tile(), out_idx=-1)
    a = torch.randn(16, 16, device="cuda").half()
    b = torch.randn(16, 8, device="cuda").half()
    c = k(a, b)
    assert c.shape == (16, 8) and c.dtype == torch.float32 and c.device == a.device
    torch.testing.assert_close(c, (a.double() @ b.double()).float(), rtol=1e-4, atol=1e-4)
    copy = rt.compile(K.vector_copy(), out_idx=1)
    x = torch.randn(4096 + 64, device="cuda").half()
    torch.testing.assert_close(copy(x), x, rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_wrong_device_or_dtype_raises():
    k = rt.compile(K.mma_tile())
    a = torch.randn(16, 16, device="cuda").half()
    b = torch.randn(16, 8, device="cuda").half()
    with pytest.raises(ArgumentError, match="one device"):
        k(a, b.cpu(), torch.empty(16, 8, device="cuda"))
    with pytest.raises(ArgumentError, match="dtype torch.float32, got torch.float16"):
        k(a, b, torch.empty(16, 8, device="cuda").half())


@pytest.mark.gpu
def test_gpu_kernel_for_another_arch_is_refused():
    from mmaemit.arch import device_arch

    other = "sm_80" if device_arch().number >= 90 else "sm_90a"
    k = rt.compile(K.mma_tile(), other)
    a = torch.randn(16, 16, device="cuda").half()
    b = torch.randn(16, 8, device="cuda").half()
    with pytest.raises(ArgumentError, match=f"compiled for {other}"):
        k(a, b, torch.empty(16, 8, device="cuda"))


def test_wgmma_accumulator_hazard_checker():
    """The SASS scan flags an accumulator read between an HGMMA and the WARPGROUP.DEPBAR that retires it (the
    pattern ptxas produced for the fused Hopper dequant epilogue), not one after it, and tracks only the HGMMA's own
    registers (64 x 128 fp32: R24..R87)."""
    from mmaemit.runtime.sass import wgmma_accumulator_hazards

    def sass(*lines):
        body = "\n".join(f"        /*{16 * i:04x}*/                   {t} ;" for i, t in enumerate(lines))
        return "\n\tFunction : k\n" + body + "\n"

    hg = "HGMMA.64x128x16.F32 R24, R104, gdesc[UR4], R24, gsb0"
    early = sass(hg, "WARPGROUP.DEPBAR.LE gsb0, 0x1", "F2FP.F16.F32.PACK_AB R115, R87, R86",
                 "WARPGROUP.DEPBAR.LE gsb0, 0x0")
    assert [h[1:] for h in wgmma_accumulator_hazards(early)] == [(2, "F2FP.F16.F32.PACK_AB R115, R87, R86")]
    late = sass(hg, "IMAD R88, R2, 0x4, RZ", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "F2FP.F16.F32.PACK_AB R115, R87, R86")
    assert wgmma_accumulator_hazards(late) == []            # R88 is not an accumulator; the read is after the wait
    pred = sass("IGMMA.64x64x32.S8.S8 R24, gdesc[UR4], RZ, !UPT, gsb0", "@P0 IADD3 R40, R55, 0x1, RZ")
    assert len(wgmma_accumulator_hazards(pred)) == 1         # s32 64 x 64: R24..R55; predicated reads count
