"""The benchmark suites behind ``mmaemit bench gemm|int8|fp8|dequant``: which problems, which implementations, how
each is checked and timed.

Implementations per problem: mmaemit with the hand-picked default configuration ("mmaemit default"), the autotuned
one ("mmaemit tuned", :mod:`mmaemit.kernels.tuned`; tunes on a table miss), optionally every candidate ("mmaemit
sweep"), and the peers: ``torch.matmul`` (gemm), ``torch._int_mm`` (int8), ``torch._scaled_mm`` (fp8), cuBLAS fp16 /
bf16 on the dequantized weights and torch's int4 weight-only kernel (dequant). Every mmaemit kernel is checked against
a higher-precision reference on a poisoned output before it is timed; a wrong one is reported and not timed.
Compute-bound suites time with CUDA events (median); the dequant suite (memory-bound) with rotating weight copies
replayed as CUDA graphs (:func:`mmaemit.runtime.timing.time_rotating`), peers alike.

``--dry-run`` runs the same problem list through :func:`fake_measurements` (made-up numbers, marked as such) to
exercise the report code without a GPU.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .report import Measurement

__all__ = ["Problem", "SUITES", "problems", "measure", "fake_measurements", "short_config", "HBM_BYTES_PER_S"]

HBM_BYTES_PER_S = {"H100": 3.0e12, "H200": 4.3e12}   # measured device-to-device copy bandwidth
LAYOUT_FLAGS = {"NN": (False, False), "NT": (False, True), "TN": (True, False), "TT": (True, True)}


@dataclass
class Problem:
    suite: str
    name: str
    series: str
    x: float
    flops: float
    args: dict


def short_config(cfg) -> str:
    """A compact text of a config dataclass: its type and the fields that differ from the type's defaults."""
    if cfg is None:
        return ""
    if not dataclasses.is_dataclass(cfg):
        return str(cfg)
    parts = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.default is dataclasses.MISSING or v != f.default:
            parts.append(f"{f.name}={v}")
    return f"{type(cfg).__name__}({', '.join(parts)})"


def _gemm_problems(suite, opts, dtypes, layouts):
    out = []
    for n in opts.sizes:
        for dtype in dtypes:
            for layout in layouts:
                ta, tb = LAYOUT_FLAGS[layout]
                out.append(Problem(suite, f"{n}³ {dtype} {layout}", f"{dtype} {layout}", n, 2.0 * n ** 3,
                                   dict(M=n, N=n, K=n, dtype=dtype, b_dtype=None, out_dtype=None, trans_a=ta,
                                        trans_b=tb)))
    return out


def problems(suite: str, opts) -> list:
    if suite == "gemm":
        return _gemm_problems(suite, opts, opts.dtypes, opts.layouts)
    if suite == "int8":
        return _gemm_problems(suite, opts, ["int8"], ["NT"])
    if suite == "fp8":
        return _gemm_problems(suite, opts, opts.dtypes, ["NT"])
    if suite == "dequant":
        out = []
        for shape in opts.shapes:
            N, K = map(int, shape.lower().split("x"))
            zeros = opts.zeros_mode
            for dtype in getattr(opts, "dtypes", None) or ["float16"]:
                series = f"{N}x{K} {opts.format} g{opts.group} {dtype}" + (f" zeros {zeros}" if zeros else "")
                for M in opts.ms:
                    out.append(Problem(suite, f"M={M} {series}", series, M, 2.0 * M * N * K,
                                       dict(M=M, N=N, K=K, group_size=opts.group, dtype=dtype,
                                            weight_format=opts.format, zeros_mode=zeros)))
        return out
    raise ValueError(f"unknown suite {suite!r}")


SUITES = {"gemm": "mma.sync GEMM (fp16 / bf16) vs torch.matmul",
          "int8": "int8 GEMM (s8 x s8 -> s32, B stored [N, K]) vs torch._int_mm",
          "fp8": "fp8 GEMM (e4m3 / e5m2 -> f32, B stored [N, K]) vs torch._scaled_mm",
          "dequant": "low-bit weight GEMV / GEMM at every M vs cuBLAS on dequantized weights and torch int4"}


# ------------------------------------------------------------------------------------------------- dry run
_FAKE_RATES = {"mmaemit default": 0.55, "mmaemit tuned": 0.6, "mmaemit sweep": 0.5, "torch.matmul": 1.0,
               "torch._int_mm": 1.0, "torch._scaled_mm": 1.0, "cuBLAS fp16": 1.0, "cuBLAS bf16": 0.95,
               "torch int4": 0.4}


def _impls(suite, opts) -> list:
    out = [f"mmaemit {c}" for c in opts.configs if c != "sweep"]
    if "dynamic" in opts.configs and getattr(opts, "all_paths", False):
        from ..kernels.dequant_dispatch import EXTRA_PATHS, FUSED_PATHS

        out += [f"mmaemit path {p}" for p in ("tiled64", "tiled128", "dense_mid", "dense") + FUSED_PATHS + EXTRA_PATHS]
    if "sweep" in opts.configs:
        out += ["mmaemit sweep"]
    peers = {"gemm": ["torch.matmul"], "int8": ["torch._int_mm"], "fp8": ["torch._scaled_mm"],
             "dequant": ["cuBLAS fp16", "cuBLAS bf16", "torch int4"]}[suite]
    return out + peers


def fake_measurements(p: Problem, opts) -> list:
    """Made-up but plausible timings (a fixed fraction of a nominal peak per implementation), marked dry run."""
    rows = []
    peak = {"gemm": 650e12, "dequant": 400e12}.get(p.suite, 1300e12)
    for impl in _impls(p.suite, opts):
        rate = _FAKE_RATES.get(impl, 0.5) * peak
        floor = None
        t = p.flops / rate
        if p.suite == "dequant":
            a = p.args
            floor = (a["N"] * a["K"] * 4 / 8 + 2 * a["M"] * (a["N"] + a["K"])) / 3.0e12 * 1e6
            t = max(t, floor * 1e-6 * (1.4 if impl.startswith("mmaemit") else 3.0))
        rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, "dry-run config" if impl.startswith("mmaemit")
                                else "", t * 1e6, p.flops, "dry run" if impl.startswith("mmaemit") else "peer",
                                floor_us=floor, dry_run=True))
    return rows


# ------------------------------------------------------------------------------------------------- GPU
def _median_us(fn, warmup=10, reps=50) -> float:
    from ..runtime.timing import median_time

    return median_time(fn, warmup=warmup, reps=reps) * 1e6


def _check(out, ref, rtol) -> str | None:
    from ..tuning.backend import default_check

    return default_check([out], [ref], rtol)


def _check_text(out, ref, rtol):
    reason = _check(out, ref, rtol)
    if reason is not None:
        return None, f"WRONG: {reason}"
    if not out.dtype.is_floating_point:
        return True, "exact"
    o, r = out.double(), ref.to(out.device).double()
    return True, f"rel {((o - r).norm() / (r.norm() or 1)).item():.1e}"


def _mmaemit_kernels(tk, builder, args, opts, arch):
    """(impl, config text, kernel or exception) for each requested configuration kind."""
    import mmaemit

    from ..tuning.backend import prim_func_of

    full = dict(args, arch=arch)
    for kind in opts.configs:
        if kind == "dynamic":             # timed by the dequant suite itself (_dequant_dynamic)
            continue
        if kind == "default":
            cfg = tk.default_params(**full)["config"]
            items = [("mmaemit default", cfg)]
        elif kind == "tuned":
            try:
                result = tk.tune(**full)
                items = [("mmaemit tuned", ("tuned", result))]
            except Exception as e:  # reported in the table, the rest of the suite goes on
                yield "mmaemit tuned", "", e
                continue
        elif kind == "sweep":
            items = [("mmaemit sweep", p["config"]) for p, reason in tk.candidates(**full) if reason is None]
        else:
            raise ValueError(f"unknown config kind {kind!r}")
        for impl, cfg in items:
            try:
                if isinstance(cfg, tuple):
                    result = cfg[1]
                    kernel = tk(**full)
                    text = short_config(result.winner["config"]) + f" ({result.source})"
                else:
                    kernel = mmaemit.compile(prim_func_of(builder(**full, config=cfg)), target=arch, cubin_cache=True)
                    text = short_config(cfg)
            except Exception as e:  # a configuration that does not build here: reported, not fatal
                yield impl, short_config(cfg) if not isinstance(cfg, tuple) else "", e
                continue
            yield impl, text, kernel


def _gemm_like(p: Problem, opts, arch) -> list:
    import torch

    from ..kernels import tuned as T

    args = dict(p.args)
    full = dict(args, arch=arch)
    A, B, C = T.gemm_inputs(full)
    ref = T.gemm_reference(full, (A, B, C))
    rows = []
    for impl, text, kernel in _mmaemit_kernels(T.gemm_kernel, T.build_gemm, args, opts, arch):
        if isinstance(kernel, Exception):
            rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, text, None, p.flops,
                                    f"ERROR: {type(kernel).__name__}: {str(kernel)[:200]}"))
            continue
        out = torch.full_like(C, float("nan")) if C.dtype.is_floating_point else torch.full_like(C, -(2 ** 31))
        kernel(A, B, out)
        torch.cuda.synchronize()
        ok, check = _check_text(out, ref, 1e-2)
        t = _median_us(lambda: kernel(A, B, out)) if ok else None
        rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, text, t, p.flops, check))
    rows.extend(_gemm_peers(p, A, B, ref))
    return rows


def _gemm_peers(p: Problem, A, B, ref) -> list:
    import torch

    ta, tb = p.args["trans_a"], p.args["trans_b"]
    a = A.T if ta else A
    b = B.T if tb else B
    rows = []

    def peer(impl, fn, note=""):
        try:
            out = fn()
            torch.cuda.synchronize()
            ok, check = _check_text(out if out.dtype != torch.bfloat16 else out.float(), ref,
                                    5e-2 if p.suite == "fp8" else 1e-2)
            t = _median_us(fn)
            rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, "", t, p.flops, "peer",
                                    note=note or ("" if ok else check)))
        except Exception as e:  # a peer op this torch build lacks: reported, not fatal
            rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, "", None, p.flops, "peer",
                                    note=f"unavailable: {type(e).__name__}: {str(e)[:120]}"))

    if p.suite == "gemm":
        peer("torch.matmul", lambda: torch.matmul(a, b))
    elif p.suite == "int8":
        peer("torch._int_mm", lambda: torch._int_mm(a, b))
    else:
        one = torch.ones((), device="cuda")
        peer("torch._scaled_mm", lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return rows


def _dequant(p: Problem, opts, arch) -> list:
    import torch

    from .. import dequant as D
    from ..dequant.kernel_layout import kernel_arguments
    from ..kernels import tuned as T
    from ..runtime.timing import copies_needed, time_rotating

    a = p.args
    M, N, K = a["M"], a["N"], a["K"]
    act = getattr(torch, a.get("dtype", "float16"))
    name = torch.cuda.get_device_name()
    bw = next((v for k, v in HBM_BYTES_PER_S.items() if k in name), 3.0e12)
    wkey = (N, K, a["weight_format"], a["group_size"], a["zeros_mode"], act)
    cache = _DEQUANT_WEIGHTS.get(wkey)
    if cache is None:
        _DEQUANT_WEIGHTS.clear()
        w = torch.randn(N, K, device="cuda", dtype=act)
        qw = D.quantize(w, D.QuantScheme(a["weight_format"], group_size=a["group_size"], zeros_mode=a["zeros_mode"]))
        tensors, _ = kernel_arguments(qw)
        tensors = [t.cuda() for t in tensors]
        wbytes = sum(t.numel() * t.element_size() for t in tensors)
        rot = [tensors] + [[t.clone() for t in tensors] for _ in range(copies_needed(wbytes) - 1)]
        W16 = qw.dequantize().to(torch.float16).cuda()
        cache = _DEQUANT_WEIGHTS[wkey] = (rot, wbytes, W16)
    rot, wbytes, W16 = cache
    A = torch.randn(M, K, device="cuda", dtype=act)
    full = dict(a, arch=arch)
    C = torch.empty(M, N, device="cuda", dtype=act)
    ref = T.dequant_reference(full, (A, *rot[0], C))
    floor = (wbytes + A.numel() * 2 + M * N * 2) / bw * 1e6
    rows = []
    for impl, text, kernel in _mmaemit_kernels(T.dequant_gemm_kernel, T.build_dequant, a, opts, arch):
        if isinstance(kernel, Exception):
            rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, text, None, p.flops,
                                    f"ERROR: {type(kernel).__name__}: {str(kernel)[:200]}", floor_us=floor))
            continue
        out = torch.full((M, N), float("nan"), dtype=act, device="cuda")
        kernel(A, *rot[0], out)
        torch.cuda.synchronize()
        ok, check = _check_text(out, ref, 2e-3 if act == torch.float16 else 8e-3)
        t = time_rotating([lambda ts=ts: kernel(A, *ts, out) for ts in rot]) if ok else None
        rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, text, t, p.flops, check, floor_us=floor))
    if "dynamic" in opts.configs:
        rows.extend(_dequant_dynamic(p, opts, arch, A, rot, ref, floor))
    for impl, dt in (("cuBLAS fp16", torch.float16), ("cuBLAS bf16", torch.bfloat16)):
        Wt = W16.to(dt)
        copies = [Wt] + [Wt.clone() for _ in range(copies_needed(Wt.numel() * 2) - 1)]
        Ad = A.to(dt)
        t = time_rotating([lambda w=w: torch.matmul(Ad, w.T) for w in copies])
        rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, "", t, p.flops, "peer", floor_us=floor))
        del copies
    rows.append(_torch_int4_peer(p, A.to(torch.bfloat16), N, K, a["group_size"], floor))
    return rows


_DEQUANT_WEIGHTS: dict = {}
_DYNAMIC: dict = {}


def _dequant_dynamic(p: Problem, opts, arch, A, rot, ref, floor) -> list:
    """The dynamic-M DequantGemm (one warmed kernel set per weight shape and dtype, shared by every M), and with
    ``--all-paths`` each path that can serve this M, checked on a poisoned output, then timed like the others."""
    import torch

    from ..kernels.dequant_dispatch import EXTRA_PATHS, FUSED_PATHS, DequantGemm
    from ..runtime.timing import time_rotating

    a = p.args
    M, N = a["M"], a["N"]
    key = (N, a["K"], a["group_size"], a["dtype"], a["weight_format"], a["zeros_mode"], arch)
    dg = _DYNAMIC.get(key)
    if dg is None:
        dg = _DYNAMIC[key] = DequantGemm(N, a["K"], a["group_size"], a["dtype"], a["weight_format"],
                                         a["zeros_mode"], arch)
    todo = [("mmaemit dynamic", dg.path_for(M))]
    if getattr(opts, "all_paths", False):
        todo += [(f"mmaemit path {q}", q)
                 for q in ("tiled64", "tiled128", "dense_mid", "dense") + FUSED_PATHS + EXTRA_PATHS
                 if q in dg.runnable_paths()]
    rows = []
    tol = 2e-3 if A.dtype == torch.float16 else 8e-3
    for impl, path in todo:
        text = f"DequantGemm path {path} (large_m={dg.large_m})"
        try:
            out = torch.full((M, N), float("nan"), dtype=A.dtype, device="cuda")
            dg.run_path(path, A, *rot[0], out=out)
            torch.cuda.synchronize()
            ok, check = _check_text(out, ref, tol)
            t = time_rotating([lambda ts=ts: dg.run_path(path, A, *ts, out=out) for ts in rot]) if ok else None
        except Exception as e:  # reported in the table, the rest of the suite goes on
            t, check = None, f"ERROR: {type(e).__name__}: {str(e)[:200]}"
        rows.append(Measurement(p.suite, p.name, p.series, p.x, impl, text, t, p.flops, check, floor_us=floor))
    return rows


def _torch_int4_peer(p, A_bf16, N, K, group, floor) -> Measurement:
    """torch's int4 weight-only kernel (tinygemm) on random codes: a timing peer (rotating weight copies)."""
    import torch

    from ..runtime.timing import copies_needed, time_rotating

    try:
        copies = []
        for _ in range(copies_needed(N * K // 2)):
            w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
            copies.append((torch._convert_weight_to_int4pack(w, 8),
                           torch.rand(K // group, N, 2, dtype=torch.bfloat16, device="cuda")))
        t = time_rotating([lambda q=q, sz=sz: torch._weight_int4pack_mm(A_bf16, q, group, sz) for q, sz in copies])
        return Measurement(p.suite, p.name, p.series, p.x, "torch int4", "", t, p.flops, "peer",
                           note="int4 weights", floor_us=floor)
    except Exception as e:  # the op's signature moves between torch releases: report, do not die
        return Measurement(p.suite, p.name, p.series, p.x, "torch int4", "", None, p.flops, "peer",
                           note=f"unavailable: {type(e).__name__}: {str(e)[:120]}", floor_us=floor)


def measure(p: Problem, opts, arch: str) -> list:
    """Check and time every implementation on problem ``p`` (needs a GPU)."""
    if p.suite == "dequant":
        return _dequant(p, opts, arch)
    return _gemm_like(p, opts, arch)
