"""Autotuned entry points of mmaemit's kernels (:mod:`mmaemit.tuning`): the GEMM for every dtype (fp16 / bf16, int8 /
uint8, fp8, int4) and the dequant GEMM for every path (GEMV, mma.sync tiled, wgmma).

Call with tensors (the shapes select the tuning entry; on a miss the tuning runs on these very arguments)::

    C = tuned_gemm(A, B)                                    # A [M, K], B [K, N] (trans_b=True: B [N, K])
    C = tuned_dequant_gemm(A, W, S, group_size=128, weight_format="int4")

or get the compiled winner for a problem and launch it yourself::

    kernel = gemm_kernel(M, N, K, "float16", arch="sm_90a")    # a mmaemit.Kernel: kernel(A, B, C)

Candidate sets (the hand sweeps of ``benchmarks/`` that picked today's defaults): the mma.sync GEMM's CTA tiles x
``stages`` 3 / 4 per operand width (12 for 16- and 8-bit operands, 8 for 4-bit; warp tiles 64 x 64), pruned by
divisibility and the arch's shared memory, plus on sm_90a the Hopper TMA + wgmma GEMM's 8 (every major for 16-bit
dtypes, A [M, K] and B [N, K] for 8-bit; also the untuned default wherever it applies; ``block_n`` x ``stages`` x
``cluster_m``, fp8 unscaled, the same output dtypes); the dequant GEMM's ``GemvConfig`` sweep for M <= 16, else the
``TiledConfig`` sweep plus, on sm_90a, the ``WgmmaConfig`` sweep (tuning decides between mma.sync and wgmma). The
dequant table key buckets M to the next power of two. ``MMAEMIT_AUTOTUNE=0`` gives the hand-picked defaults.

Adding a GEMM family (as the Hopper GEMM is added below): a config dataclass, a ``make(M, N, K, dtype, out_dtype=, trans_a=,
trans_b=, config=, arch=, b_dtype=) -> (prim_func, ...)`` and a function listing its candidate configs for the
problem (``[]`` where it does not apply), then ``register_gemm_family(GemmFamily("wgmma", HopperConfig, make,
configs))`` at the bottom of the family's module and ``import`` that module here (tuning workers import this module
to build candidates; a config's class module is imported with it, so registration at import time reaches them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mmaemit.arch import device_sm_count
from mmaemit.dtypes import bits, canonical, is_float
from mmaemit.errors import ArgumentError, UnsupportedConfigError, choices
from mmaemit.kernels.dequant_gemm import GemvConfig, TiledConfig, default_tiled_config, make_dequant_gemm
from mmaemit.kernels.dequant_gemm_wgmma import WgmmaConfig, default_wgmma_config
from mmaemit.kernels.gemm_hopper import DTYPES as HOPPER_DTYPES
from mmaemit.kernels.gemm_hopper import HopperGemmConfig, make_gemm_hopper, smem_bytes
from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm
from mmaemit.tuning import CudaBackend, autotune

__all__ = ["GemmFamily", "GEMM_FAMILIES", "register_gemm_family", "gemm_configs", "mma_gemm_configs", "build_gemm",
           "gemm_kernel", "tuned_gemm", "gemm_inputs", "gemm_reference", "default_gemm_config", "dequant_configs",
           "build_dequant", "dequant_gemm_kernel", "tuned_dequant_gemm", "dequant_inputs", "dequant_reference",
           "default_dequant_config", "GEMM_TILES", "GEMV_CONFIGS", "TILED_CONFIGS", "WGMMA_CONFIGS",
           "SMEM_BYTES"]

#: dynamic shared memory a CTA may use, by arch (bytes)
SMEM_BYTES = {"sm_80": 163 << 10, "sm_86": 99 << 10, "sm_87": 163 << 10, "sm_89": 99 << 10, "sm_90": 227 << 10,
              "sm_90a": 227 << 10}

#: CTA tiles (block_m, block_n, block_k) per operand width; each is tried with 3 and 4 pipeline stages
GEMM_TILES = {
    16: ((128, 128, 32), (128, 128, 64), (128, 256, 32), (256, 128, 32), (128, 256, 64), (256, 128, 64)),
    8: ((128, 128, 64), (128, 128, 128), (128, 256, 64), (256, 128, 64), (256, 128, 128), (128, 256, 128)),
    4: ((128, 128, 64), (128, 128, 128), (128, 256, 64), (256, 128, 64)),
}
GEMM_STAGES = (3, 4)

GEMV_CONFIGS = (GemvConfig(2, 8, 4, 2), GemvConfig(2, 8, 4, 2, "marlin"), GemvConfig(4, 16, 3),
                GemvConfig(4, 16, 3, 1, "marlin"), GemvConfig(2, 8, 6, 2, "marlin"), GemvConfig(4, 8, 4, 2, "marlin"),
                GemvConfig(2, 8, 4, 3, "marlin"), GemvConfig(1, 16, 4, 2, "marlin"), GemvConfig(2, 4, 8, 4, "marlin"),
                GemvConfig(4, 8, 4, 2))
TILED_CONFIGS = (TiledConfig(128, 128, 64, 64, 4), TiledConfig(64, 128, 32, 64, 4), TiledConfig(128, 256, 64, 64, 3),
                 TiledConfig(256, 128, 64, 64, 3), TiledConfig(64, 64, 32, 32, 4), TiledConfig(128, 128, 64, 64, 3))
WGMMA_CONFIGS = (WgmmaConfig(128, 4, 1, 4), WgmmaConfig(64, 2, 1, 4), WgmmaConfig(256, 2, 1, 4),
                 WgmmaConfig(64, 4, 1, 4), WgmmaConfig(128, 2, 1, 4))


# ---------------------------------------------------------------------------------------------------------- GEMM
@dataclass(frozen=True)
class GemmFamily:
    """One GEMM implementation the tuner may pick: its config type, builder and candidate list (see module doc).
    ``prune(config, args) -> True | reason`` rejects candidates with a recorded reason (optional)."""

    name: str
    config_type: type
    make: Callable
    configs: Callable
    prune: Callable | None = None


GEMM_FAMILIES: list = []


def register_gemm_family(family: GemmFamily) -> None:
    """Add (or replace, by name) a GEMM family among the candidates of :data:`gemm_kernel`."""
    GEMM_FAMILIES[:] = [f for f in GEMM_FAMILIES if f.name != family.name] + [family]


def _family_of(config) -> GemmFamily:
    for fam in GEMM_FAMILIES:
        if isinstance(config, fam.config_type):
            return fam
    raise UnsupportedConfigError(f"no GEMM family takes a {type(config).__name__}; registered: "
                                 f"{choices(f.config_type.__name__ for f in GEMM_FAMILIES)}")


def _operand_bits(args) -> int:
    return min(bits(args["dtype"]), bits(args.get("b_dtype") or args["dtype"]))


def mma_gemm_configs(args) -> list:
    """The mma.sync GEMM's candidates: ``GEMM_TILES`` for the operand width x ``GEMM_STAGES``, warp tiles 64 x 64."""
    return [GemmConfig(bm, bn, bk, 64, 64, st) for bm, bn, bk in GEMM_TILES[_operand_bits(args)]
            for st in GEMM_STAGES]


def _mma_smem(config: GemmConfig, args) -> int:
    a_bits, b_bits = bits(args["dtype"]), bits(args.get("b_dtype") or args["dtype"])
    stages = config.stages * config.block_k * (config.block_m * a_bits + config.block_n * b_bits) // 8
    out_bits = bits(args["out_dtype"]) if args.get("out_dtype") else (a_bits if a_bits == 16 else 32)
    return max(stages, config.block_m * config.block_n * out_bits // 8 if config.epilogue == "shared" else 0)


def _mma_prune(config: GemmConfig, args):
    for name, size, tile in (("M", args["M"], config.block_m), ("N", args["N"], config.block_n),
                             ("K", args["K"], config.block_k)):
        if size % tile:
            return f"{name}={size} is not a multiple of the tile's {tile}"
    limit = SMEM_BYTES.get(args.get("arch"))
    need = _mma_smem(config, args)
    if limit is not None and need > limit:
        return f"needs {need >> 10} KiB of shared memory, {args['arch']} has {limit >> 10} KiB"
    return True


register_gemm_family(GemmFamily("mma.sync", GemmConfig, make_gemm, mma_gemm_configs, _mma_prune))


def _hopper_applies(args, k_major_only=False) -> bool:
    """The Hopper GEMM takes the problem: sm_90a, one dtype it supports, and operands wgmma can read — K-contiguous
    A [M, K] / B [N, K] for every dtype, M/N-contiguous ones (A [K, M], B [K, N]) for 16-bit dtypes only."""
    dt = canonical(args["dtype"])
    if args.get("arch") != "sm_90a" or dt not in HOPPER_DTYPES or canonical(args.get("b_dtype") or dt) != dt:
        return False
    k_major = not args.get("trans_a", False) and args.get("trans_b", False)
    return k_major or (not k_major_only and bits(dt) == 16)


def hopper_gemm_configs(args) -> list:
    """The Hopper GEMM's candidates (sm_90a; any major for 16-bit dtypes, K-contiguous for 8-bit): ``block_n``
    128 / 256 x ``stages`` 3 / 4 x ``cluster_m`` 1 / 2 (B multicast), two consumer warpgroups, the persistent grid
    = the GPU's SMs."""
    if not _hopper_applies(args):
        return []
    sms = device_sm_count()
    return [HopperGemmConfig(block_n=bn, stages=st, cluster_m=cl, num_sms=sms)
            for bn in (256, 128) for st in (4, 3) for cl in (1, 2)]


def _make_hopper(M, N, K, dtype, *, out_dtype, trans_a, trans_b, config, arch, b_dtype=None):
    # the GEMM's output dtype convention (:func:`_out_dtype`) so every family fills the same C; fp8 unscaled
    args = dict(dtype=dtype, out_dtype=out_dtype)
    return make_gemm_hopper(M, N, K, dtype, _out_dtype(args), trans_a, trans_b, config=config, arch=arch,
                            scaled=False if canonical(dtype).startswith("float8") else None)


def _hopper_prune(config: HopperGemmConfig, args):
    dt = canonical(args["dtype"])
    out = _out_dtype(args)
    if args["K"] * bits(dt) // 8 % 16 or args["N"] * bits(out) // 8 % 16:
        return "rows of A / B / C must be multiples of 16 bytes for TMA"
    need = smem_bytes(dt, out, config)
    if need > SMEM_BYTES["sm_90a"]:
        return f"needs {need >> 10} KiB of shared memory, sm_90a has {SMEM_BYTES['sm_90a'] >> 10} KiB"
    return True


register_gemm_family(GemmFamily("wgmma", HopperGemmConfig, _make_hopper, hopper_gemm_configs, _hopper_prune))


def gemm_configs(args) -> list:
    """Every registered family's candidates for these GEMM arguments (the ``config`` axis of :data:`gemm_kernel`)."""
    out = []
    for fam in GEMM_FAMILIES:
        out.extend(fam.configs(dict(args)))
    return out


def gemm_prune(params, args):
    fam = _family_of(params["config"])
    return True if fam.prune is None else fam.prune(params["config"], args)


def default_gemm_config(args) -> dict:
    """Today's hand-picked configuration: the Hopper GEMM's ``HopperGemmConfig()`` where it applies (sm_90a; any
    major for 16-bit dtypes, A [M, K] and B [N, K] for 8-bit); else ``GemmConfig()`` for 16-bit operands,
    128x128x64 / 3 stages for 8- and 4-bit ones (block_k = 64 holds one k32 / k64 step per warp tile)."""
    if _hopper_applies(args):   # H100, 4096^3 fp16 with B [K, N]: 192.9 us vs the mma.sync default's 343.2 (1.78x)
        return {"config": HopperGemmConfig(num_sms=device_sm_count())}
    if _operand_bits(args) == 16:
        return {"config": GemmConfig()}
    return {"config": GemmConfig(128, 128, 64, 64, 64, 3)}


def _out_dtype(args) -> str:
    if args.get("out_dtype"):
        return canonical(args["out_dtype"])
    dt = canonical(args["dtype"])
    if bits(dt) == 16:
        return dt
    return "float32" if is_float(dt) else "int32"


def gemm_inputs(args):
    """Random A, B (``mmaemit.kernels.gemm_mma.random_inputs``) and an output buffer C on the GPU. ``args``: M, N,
    K, dtype and optionally b_dtype, out_dtype, trans_a, trans_b (any builder whose arguments use these names)."""
    import torch

    from mmaemit.dtypes import torch_dtype
    from mmaemit.kernels.gemm_mma import random_inputs

    A, B = random_inputs(args["M"], args["N"], args["K"], args["dtype"], args.get("trans_a", False),
                         args.get("trans_b", False), device="cuda", seed=0, b_dtype=args.get("b_dtype"))
    C = torch.empty((args["M"], args["N"]), dtype=torch_dtype(_out_dtype(args)), device="cuda")
    return A, B, C


def gemm_reference(args, arguments):
    """float32 A @ B for float operands; for integer operands the exact product as int64, computed in float64 on the
    operands' device (every partial sum of 8- or 4-bit products stays below 2^53 for K < 2^37, so it is exact)."""
    from mmaemit.kernels.gemm_mma import reference, unpack_int4

    A, B = arguments[0], arguments[1]
    ta, tb, b_dtype = args.get("trans_a", False), args.get("trans_b", False), args.get("b_dtype")
    if is_float(args["dtype"]):
        return reference(A, B, ta, tb, dtype=args["dtype"], b_dtype=b_dtype)
    da, db = canonical(args["dtype"]), canonical(b_dtype or args["dtype"])
    a = unpack_int4(A, da == "int4") if bits(da) == 4 else A
    b = unpack_int4(B, db == "int4") if bits(db) == 4 else B
    a = a.double().T if ta else a.double()
    b = b.double().T if tb else b.double()
    return (a @ b).round().long()


@autotune(config=gemm_configs, prune=gemm_prune, default=default_gemm_config, inputs=gemm_inputs,
          reference=gemm_reference, outputs=[2], rtol=1e-2, depends=("mmaemit",), name="mmaemit.kernels.gemm")
def gemm_kernel(M, N, K, dtype="float16", b_dtype=None, out_dtype=None, trans_a=False, trans_b=False,
                arch="sm_90a", *, config):
    """The GEMM ``gemm(A, B, C)`` of the registered family that takes ``config`` (tuned: call with the problem)."""
    return build_gemm(M, N, K, dtype, b_dtype, out_dtype, trans_a, trans_b, arch, config=config)


def build_gemm(M, N, K, dtype="float16", b_dtype=None, out_dtype=None, trans_a=False, trans_b=False, arch="sm_90a",
               *, config):
    """The untuned builder behind :data:`gemm_kernel` (PrimFunc, emitter / config)."""
    fam = _family_of(config)
    return fam.make(M, N, K, dtype, out_dtype=out_dtype, trans_a=trans_a, trans_b=trans_b, config=config, arch=arch,
                    b_dtype=b_dtype)


def _arch_of(t) -> str:
    from mmaemit.arch import device_arch

    return device_arch(t.device.index or 0).name


def _dtype_name(t, given) -> str:
    if given is not None:
        return canonical(given)
    return canonical(t.dtype)


def tuned_gemm(A, B, C=None, *, trans_a: bool = False, trans_b: bool = False, dtype=None, b_dtype=None,
               out_dtype=None):
    """C = A @ B with the tuned GEMM (``trans_a``: A is [K, M]; ``trans_b``: B is [N, K]); returns C (allocated when
    not given). ``dtype`` / ``b_dtype`` name 4-bit operands (packed uint8 tensors); otherwise they come from A / B."""
    import torch

    from mmaemit.dtypes import torch_dtype

    da = _dtype_name(A, dtype)
    db = _dtype_name(B, b_dtype if b_dtype is not None else (dtype if B.dtype == A.dtype else None))
    pack_a, pack_b = (2 if bits(da) == 4 else 1), (2 if bits(db) == 4 else 1)
    M, K = (A.shape[1] * pack_a, A.shape[0]) if trans_a else (A.shape[0], A.shape[1] * pack_a)
    N = B.shape[0] if trans_b else B.shape[1] * pack_b
    Kb = B.shape[1] * pack_b if trans_b else B.shape[0]
    if A.dim() != 2 or B.dim() != 2 or Kb != K:
        raise ArgumentError(f"A {tuple(A.shape)} and B {tuple(B.shape)} do not form a GEMM with trans_a={trans_a}, "
                            f"trans_b={trans_b} (K {K} vs {Kb})")
    args = dict(M=M, N=N, K=K, dtype=da, b_dtype=None if db == da else db,
                out_dtype=None if out_dtype is None else canonical(out_dtype), trans_a=trans_a, trans_b=trans_b,
                arch=_arch_of(A))
    if C is None:
        C = torch.empty((M, N), dtype=torch_dtype(_out_dtype(args)), device=A.device)
    kernel = gemm_kernel(**args, bench_args=(A, B, C))
    kernel(A, B, C)
    return C


# ---------------------------------------------------------------------------------------------------- dequant
def dequant_configs(args) -> list:
    """The dequant GEMM's candidates: the GEMV sweep for M <= 16, else the mma.sync tiled sweep plus, on sm_90a, the
    wgmma sweep."""
    if args["M"] <= 16:
        return list(GEMV_CONFIGS)
    out = list(TILED_CONFIGS)
    if args["arch"] == "sm_90a":
        out += list(WGMMA_CONFIGS)
    return out


def dequant_key(args) -> dict:
    """The table key: every argument, M rounded up to a power of two (one tuning serves a bucket of batch sizes)."""
    key = dict(args)
    key["M"] = 1 << max(0, int(args["M"]) - 1).bit_length()
    return key


def default_dequant_config(args) -> dict:
    """``make_dequant_gemm``'s dispatch: GEMV for M <= 16, wgmma above M = 128 on sm_90a, else the tiled path."""
    M, N = args["M"], args["N"]
    if M <= 16:
        return {"config": GemvConfig()}
    if M > 128 and args["arch"] == "sm_90a":
        return {"config": default_wgmma_config(M)}
    return {"config": default_tiled_config(M, N)}


def dequant_inputs(args):
    """Random activations, random finite codes of the format in the kernel layout, positive scales (and zeros), an
    output buffer: ``(A, W, S[, Z], C)`` on the GPU."""
    import numpy as np
    import torch

    from mmaemit.dequant.formats import get_format
    from mmaemit.dequant.kernel_layout import to_kernel_layout, to_kernel_scales
    from mmaemit.dtypes import torch_dtype

    M, N, K, G = args["M"], args["N"], args["K"], args["group_size"]
    G = K if G in (None, -1) else G
    fmt = get_format(args["weight_format"])
    act = torch_dtype(args["dtype"])
    gen = torch.Generator().manual_seed(0)
    finite = torch.as_tensor(np.flatnonzero(np.isfinite(fmt.table)))
    codes = finite[torch.randint(len(finite), (N, K), generator=gen)].to(torch.uint8)
    peak = float(np.nanmax(np.abs(fmt.table[np.isfinite(fmt.table)]))) or 1.0
    scales = ((torch.rand(N, K // G, generator=gen) + 0.5) / (peak * K ** 0.5)).to(act)
    out = [torch.randn(M, K, generator=gen).to(act), to_kernel_layout(codes, fmt.bits), to_kernel_scales(scales)]
    mode = args["zeros_mode"]
    if mode == "quantized":
        out.append(to_kernel_scales(torch.randint(0, 1 << fmt.bits, (N, K // G), generator=gen).to(torch.int16)))
    elif mode == "original":
        out.append(to_kernel_scales((torch.rand(N, K // G, generator=gen) * (1 << fmt.bits)).to(act)))
    elif mode == "rescale":
        out.append(to_kernel_scales((torch.randn(N, K // G, generator=gen) * scales.float() * 4).to(act)))
    out = [t.cuda() for t in out]
    out.append(torch.empty((M, N), dtype=act, device="cuda"))
    return tuple(out)


def dequant_reference(args, arguments):
    """float32 A @ W^T with W dequantized exactly from the kernel-layout tensors (the documented formulas)."""
    from mmaemit.dequant.formats import get_format
    from mmaemit.dequant.kernel_layout import from_kernel_layout, from_kernel_scales

    fmt = get_format(args["weight_format"])
    A, W, S = arguments[0], arguments[1], arguments[2]
    K = A.shape[1]
    G = K if args["group_size"] in (None, -1) else args["group_size"]
    codes = from_kernel_layout(W.cpu(), fmt.bits).to(A.device)
    values = fmt.decode(codes)                                                   # float64 [N, K]
    s = from_kernel_scales(S.cpu()).to(A.device).double().repeat_interleave(G, dim=1)
    mode = args["zeros_mode"]
    if mode is None:
        w = values * s
    else:
        z = from_kernel_scales(arguments[3].cpu()).to(A.device).double().repeat_interleave(G, dim=1)
        w = values * s - z if mode == "rescale" else (values - z) * s
    return A.float() @ w.float().T


@autotune(config=dequant_configs, key=dequant_key, default=default_dequant_config, inputs=dequant_inputs,
          reference=dequant_reference, outputs=[-1], rtol=2e-3, depends=("mmaemit",),
          backend=CudaBackend(rotate=(1, 2, 3)), name="mmaemit.kernels.dequant_gemm")
def dequant_gemm_kernel(M, N, K, group_size=128, dtype="float16", weight_format="int4", zeros_mode=None,
                        arch="sm_90a", *, config):
    """``gemm(A, W, S[, Z], C)`` of the dequant path that takes ``config`` (tuned: call with the problem)."""
    return build_dequant(M, N, K, group_size, dtype, weight_format, zeros_mode, arch, config=config)


def build_dequant(M, N, K, group_size=128, dtype="float16", weight_format="int4", zeros_mode=None, arch="sm_90a",
                  *, config):
    """The untuned builder behind :data:`dequant_gemm_kernel`."""
    return make_dequant_gemm(M, N, K, group_size, dtype, config=config, arch=arch, weight_format=weight_format,
                             zeros_mode=zeros_mode)


def tuned_dequant_gemm(A, W, S, Z=None, C=None, *, group_size=128, weight_format="int4", zeros_mode=None):
    """C = A @ dequant(W)^T with the tuned dequant GEMM: A [M, K] fp16 / bf16, W / S / Z in the kernel layout
    (``mmaemit.dequant.kernel_layout.kernel_arguments``); returns C [M, N] (allocated when not given)."""
    import torch

    if (Z is None) != (zeros_mode is None):
        raise ArgumentError(f"zeros_mode={zeros_mode!r} needs Z, and Z needs a zeros_mode (one of 'original', "
                            f"'rescale', 'quantized')")
    M, K = A.shape
    N = W.shape[0] * 16
    args = dict(M=M, N=N, K=K, group_size=group_size, dtype=canonical(A.dtype), weight_format=weight_format,
                zeros_mode=zeros_mode, arch=_arch_of(A))
    if C is None:
        C = torch.empty((M, N), dtype=A.dtype, device=A.device)
    tensors = (A, W, S) + ((Z,) if Z is not None else ()) + (C,)
    kernel = dequant_gemm_kernel(**args, bench_args=tensors)
    kernel(*tensors)
    return C
