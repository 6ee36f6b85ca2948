"""The instruction table: every tensor-core and matrix-move instruction mmaemit emits, as data.

Validation, the emitters, the docs (``python -m mmaemit table``) and the tests all read these tables; nothing else
in the package hard-codes an instruction shape, a dtype combination or a minimum arch.

Facts (PTX ISA 9.x, "Warp-level matrix multiply-accumulate instructions" and "ldmatrix"/"stmatrix"; ptxas 13.0):

* ``mma.sync.aligned.m16n8k{8,16}`` f16/bf16, ``m16n8k8`` tf32, ``m16n8k{16,32}`` s8/u8 and ``m16n8k{32,64}`` s4/u4
  exist from sm_80. e4m3/e5m2 ``m16n8k32`` needs sm_89.
* On sm_90 ptxas *emulates* e4m3/e5m2 and s4/u4 mma.sync (F2FP unpack + HMMA, or LOP3/SHF sign extension + IMMA):
  they assemble but run on a slow path. ``emulated_on`` records it; the emitter warns (Hopper's fast path is wgmma).
* Only integer MMAs take ``.satfinite`` (clamp the s32 result instead of wrapping).
* ``ldmatrix`` exists from sm_75, ``stmatrix`` from sm_90. Both move 8x8 matrices of b16 elements.
* ``wgmma.mma_async.sync.aligned.m64nNkK`` (PTX ISA 9.7.15, sm_90a only; ``WGMMA_TABLE``): K = 16 for f16 / bf16,
  8 for tf32, 32 for e4m3 / e5m2 / s8 / u8 (every instruction reads 32 bytes of K per row). N is any multiple of 8
  up to 256 for the floating-point types; for s8 / u8 the instruction syntax lists 8, 16, 24 and the multiples of 16
  up to 224 (the ISA's shape table also names 240 and 256, its syntax line and TVM 0.27's ``T.ptx`` table do not, so
  mmaemit stays at 224). Only f16 / bf16 operands may be MN-major (``imm-trans-a/b``); every type may take A from
  registers (the RS form, A then K-major). Accumulators: f32 or f16 for f16 and e4m3 / e5m2, f32 for bf16 and tf32,
  s32 (optionally ``.satfinite``) for s8 / u8. e4m3 and e5m2 may be mixed, as may s8 and u8.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from . import dtypes as _dt
from .arch import as_arch
from .errors import ArchError, UnsupportedConfigError, choices

__all__ = [
    "MmaInstr", "MatrixMoveInstr", "Feature", "MMA_TABLE", "MATRIX_MOVE_TABLE", "FEATURES",
    "find_mma", "select_mma", "matrix_move", "require_feature", "check_mma_arch", "feature_of_ptx",
    "WgmmaInstr", "WGMMA_TABLE", "WGMMA_N_FLOAT", "WGMMA_N_INT", "find_wgmma", "select_wgmma",
]


@dataclass(frozen=True)
class MmaInstr:
    """One ``mma.sync.aligned.mMnNkK.row.col`` variant. Dtypes are canonical TVM names; ``a_ptx`` etc. the PTX tokens.

    Register counts are 32-bit registers per lane: A holds M*K, B holds K*N, C/D hold M*N elements over 32 lanes.
    """

    m: int
    n: int
    k: int
    a_dtype: str
    b_dtype: str
    accum_dtype: str
    min_arch: str
    emulated_on: tuple = ()
    note: str = ""
    a_ptx: str = field(default="")
    b_ptx: str = field(default="")

    def __post_init__(self):
        # float32 operands run as tf32: the PTX token differs from the storage dtype
        def tok(d):
            return "tf32" if d == "float32" else _dt.ptx_type(d)

        if not self.a_ptx:
            object.__setattr__(self, "a_ptx", tok(self.a_dtype))
        if not self.b_ptx:
            object.__setattr__(self, "b_ptx", tok(self.b_dtype))

    @property
    def shape(self) -> tuple:
        return (self.m, self.n, self.k)

    @property
    def shape_name(self) -> str:
        return f"m{self.m}n{self.n}k{self.k}"

    @property
    def is_integer(self) -> bool:
        return self.accum_dtype == "int32"

    @property
    def accum_ptx(self) -> str:
        return _dt.ptx_type(self.accum_dtype)

    @property
    def operand_bits(self) -> int:
        return _dt.bits(self.a_dtype)

    @property
    def a_regs(self) -> int:
        return self.m * self.k * self.operand_bits // (32 * 32)

    @property
    def b_regs(self) -> int:
        return self.k * self.n * self.operand_bits // (32 * 32)

    @property
    def c_regs(self) -> int:
        return self.m * self.n * _dt.bits(self.accum_dtype) // (32 * 32)

    @property
    def c_elems(self) -> int:
        """Accumulator elements per lane (f16 accumulators pack two per register)."""
        return self.m * self.n // 32

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def ptx(self, satfinite: bool = False) -> str:
        """The exact PTX mnemonic, e.g. ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``."""
        if satfinite and not self.is_integer:
            raise UnsupportedConfigError(".satfinite exists only for integer mma (s32 accumulators)")
        sat = ".satfinite" if satfinite else ""
        return (f"mma.sync.aligned.{self.shape_name}.row.col{sat}."
                f"{self.accum_ptx}.{self.a_ptx}.{self.b_ptx}.{self.accum_ptx}")

    def describe(self) -> str:
        return f"{self.shape_name} {self.a_dtype} x {self.b_dtype} -> {self.accum_dtype} (>= {self.min_arch})"


def _mma_table():
    t = []
    for d in ("float16", "bfloat16"):
        accs = ("float32", "float16") if d == "float16" else ("float32",)
        for acc, k in itertools.product(accs, (16, 8)):
            t.append(MmaInstr(16, 8, k, d, d, acc, "sm_80"))
    t.append(MmaInstr(16, 8, 8, "float32", "float32", "float32", "sm_80",
                      note="tf32: float32 inputs are rounded with cvt.rna.tf32.f32 before the mma"))
    for a, b in itertools.product(("int8", "uint8"), repeat=2):
        for k in (32, 16):
            t.append(MmaInstr(16, 8, k, a, b, "int32", "sm_80"))
    for a, b in itertools.product(("float8_e4m3fn", "float8_e5m2"), repeat=2):
        for acc in ("float32", "float16"):
            t.append(MmaInstr(16, 8, 32, a, b, acc, "sm_89", emulated_on=("sm_90", "sm_90a"),
                              note="emulated by ptxas on sm_90 (F2FP unpack + HMMA); use wgmma on Hopper"))
    for a, b in itertools.product(("int4", "uint4"), repeat=2):
        for k in (64, 32):
            t.append(MmaInstr(16, 8, k, a, b, "int32", "sm_80", emulated_on=("sm_90", "sm_90a"),
                              note="emulated by ptxas on sm_90 (sign extension + IMMA.16832)"))
    return tuple(t)


#: Every mma.sync variant mmaemit emits. Order: preferred (largest K) first within a dtype combination.
MMA_TABLE: tuple = _mma_table()


#: legal wgmma N for floating-point operands (f16, bf16, tf32, e4m3, e5m2)
WGMMA_N_FLOAT: tuple = tuple(range(8, 257, 8))
#: legal wgmma N for s8 / u8 operands (the PTX syntax line; see the module doc for 240 / 256)
WGMMA_N_INT: tuple = (8, 16, 24) + tuple(range(32, 225, 16))
_WGMMA_PTX = {"float16": "f16", "bfloat16": "bf16", "float32": "tf32", "float8_e4m3fn": "e4m3",
              "float8_e5m2": "e5m2", "int8": "s8", "uint8": "u8"}


@dataclass(frozen=True)
class WgmmaInstr:
    """One ``wgmma.mma_async.sync.aligned.m64nNkK`` dtype combination (every legal N shares the entry).

    ``n_values``: legal N; ``majors``: the majors its shared-memory operands may take (``"K"``, and ``"MN"`` for
    16-bit); ``rs``: A may come from registers; ``satfinite``: the ``.satfinite`` modifier exists (integer only).
    float32 operands run as tf32 (the low 13 mantissa bits are ignored, not rounded).
    """

    a_dtype: str
    b_dtype: str
    accum_dtype: str
    k: int
    n_values: tuple
    majors: tuple
    rs: bool = True
    satfinite: bool = False
    min_arch: str = "sm_90a"
    m: int = 64
    note: str = ""

    a_ptx = property(lambda self: _WGMMA_PTX[self.a_dtype])
    b_ptx = property(lambda self: _WGMMA_PTX[self.b_dtype])
    accum_ptx = property(lambda self: _dt.ptx_type(self.accum_dtype))
    is_integer = property(lambda self: self.accum_dtype == "int32")
    operand_bits = property(lambda self: _dt.bits(self.a_dtype))

    def shape_name(self, n: int) -> str:
        return f"m{self.m}n{n}k{self.k}"

    def accum_regs(self, n: int) -> int:
        """32-bit accumulator registers per thread of the warpgroup (f16 accumulators pack two per register)."""
        return self.m * n * _dt.bits(self.accum_dtype) // (128 * 32)

    def accum_elems(self, n: int) -> int:
        return self.m * n // 128

    @property
    def a_regs(self) -> int:
        """A-fragment registers per thread in the RS form (64 x 32 bytes over 128 threads: always 4)."""
        return self.m * self.k * self.operand_bits // (128 * 32)

    def check_n(self, n) -> int:
        if isinstance(n, bool) or n not in self.n_values:
            raise UnsupportedConfigError(
                f"N={n!r} is not a wgmma N for {self.describe()}; valid N: {choices(self.n_values)}")
        return n

    def ptx(self, n: int, satfinite: bool = False) -> str:
        """The exact mnemonic, e.g. ``wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16``."""
        self.check_n(n)
        if satfinite and not self.satfinite:
            raise UnsupportedConfigError(f".satfinite exists only for integer wgmma (s32 accumulators); "
                                         f"{self.describe()} has none")
        sat = ".satfinite" if satfinite else ""
        return (f"wgmma.mma_async.sync.aligned.{self.shape_name(n)}{sat}.{self.accum_ptx}.{self.a_ptx}."
                f"{self.b_ptx}")

    def describe(self) -> str:
        return f"m64nNk{self.k} {self.a_dtype} x {self.b_dtype} -> {self.accum_dtype}"


def _wgmma_table():
    t = []
    for d in ("float16", "bfloat16"):
        for acc in (("float32", "float16") if d == "float16" else ("float32",)):
            t.append(WgmmaInstr(d, d, acc, 16, WGMMA_N_FLOAT, ("K", "MN")))
    t.append(WgmmaInstr("float32", "float32", "float32", 8, WGMMA_N_FLOAT, ("K",),
                        note="tf32: the low 13 mantissa bits of each float32 operand are ignored"))
    for a, b in itertools.product(("float8_e4m3fn", "float8_e5m2"), repeat=2):
        for acc in ("float32", "float16"):
            t.append(WgmmaInstr(a, b, acc, 32, WGMMA_N_FLOAT, ("K",)))
    for a, b in itertools.product(("int8", "uint8"), repeat=2):
        t.append(WgmmaInstr(a, b, "int32", 32, WGMMA_N_INT, ("K",), satfinite=True))
    return tuple(t)


#: Every dense wgmma dtype combination mmaemit emits (sm_90a).
WGMMA_TABLE: tuple = _wgmma_table()


def find_wgmma(a_dtype=None, b_dtype=None, accum_dtype=None):
    """All ``WGMMA_TABLE`` entries matching the given (canonicalised) dtypes; None matches anything."""
    want = {"a_dtype": a_dtype, "b_dtype": b_dtype, "accum_dtype": accum_dtype}
    want = {f: _dt.canonical(v) for f, v in want.items() if v is not None}
    return [e for e in WGMMA_TABLE if all(getattr(e, f) == v for f, v in want.items())]


def select_wgmma(a_dtype, b_dtype=None, accum_dtype="float32", arch=None) -> WgmmaInstr:
    """The wgmma entry for a dtype combination (``b_dtype`` None: A's), checked against ``arch`` (sm_90a).

    Raises ``UnsupportedConfigError`` naming the valid combinations, or ``ArchError``.
    """
    b_dtype = a_dtype if b_dtype is None else b_dtype
    for d in (a_dtype, b_dtype, accum_dtype):
        if _dt.canonical(d) not in _dt.DTYPES:
            raise UnsupportedConfigError(f"unknown dtype {d!r}; valid wgmma combinations: "
                                         f"{choices(_combo(e) for e in WGMMA_TABLE)}")
    hits = find_wgmma(a_dtype, b_dtype, accum_dtype)
    if not hits:
        raise UnsupportedConfigError(
            f"no wgmma instruction for {_dt.canonical(a_dtype)} x {_dt.canonical(b_dtype)} -> "
            f"{_dt.canonical(accum_dtype)}; valid combinations: {choices(_combo(e) for e in WGMMA_TABLE)}")
    if arch is not None:
        a = as_arch(arch)
        if not a.satisfies(hits[0].min_arch):
            raise ArchError(f"wgmma.mma_async needs {hits[0].min_arch} (the arch-specific Hopper target); target is "
                            f"{a.name}")
    return hits[0]


@dataclass(frozen=True)
class MatrixMoveInstr:
    """``ldmatrix`` / ``stmatrix`` ``.sync.aligned.m8n8.x{num}[.trans].shared.b16``: ``num`` 8x8 b16 matrices."""

    op: str
    num: int
    trans: bool
    min_arch: str

    @property
    def regs(self) -> int:
        return self.num

    def ptx(self) -> str:
        return f"{self.op}.sync.aligned.m8n8.x{self.num}{'.trans' if self.trans else ''}.shared.b16"


MATRIX_MOVE_TABLE: tuple = tuple(
    MatrixMoveInstr(op, num, trans, "sm_75" if op == "ldmatrix" else "sm_90")
    for op in ("ldmatrix", "stmatrix") for num in (1, 2, 4) for trans in (False, True)
)


@dataclass(frozen=True)
class Feature:
    """A non-mma instruction with an arch gate (what ptxas would otherwise reject late)."""

    name: str
    ptx: str
    min_arch: str
    note: str = ""
    #: regexes over a full PTX mnemonic ("cp.async.cg.shared.global"); any match means the instruction needs the feature
    patterns: tuple = ()

    def matches(self, mnemonic: str) -> bool:
        return any(re.search(p, mnemonic) for p in self.patterns)


FEATURES = {f.name: f for f in (
    Feature("cp.async", "cp.async.cg.shared.global", "sm_80",
            patterns=(r"^cp\.async\.(ca|cg|commit_group|wait_group|wait_all|mbarrier)(\.|$)",)),
    Feature("ldmatrix", "ldmatrix.sync.aligned.m8n8", "sm_75", patterns=(r"^ldmatrix\.sync\.aligned\.m8n8\.",)),
    Feature("stmatrix", "stmatrix.sync.aligned.m8n8", "sm_90", patterns=(r"^stmatrix\.sync\.aligned\.m8n8\.",)),
    Feature("cvt.e4m3x2", "cvt.rn.f16x2.e4m3x2", "sm_89", patterns=(r"^cvt\.(.*\.)?e4m3x2(\.|$)",)),
    Feature("cvt.e5m2x2", "cvt.rn.f16x2.e5m2x2", "sm_89", patterns=(r"^cvt\.(.*\.)?e5m2x2(\.|$)",)),
    Feature("cvt.e2m1x2", "cvt.rn.f16x2.e2m1x2", "sm_100a", patterns=(r"^cvt\.(.*\.)?e2m1x2(\.|$)",)),
    Feature("add.bf16x2", "add.bf16x2 / sub.bf16x2 / mul.bf16x2", "sm_90",
            note="on sm_80-89 use fma.rn.bf16x2 with 1.0", patterns=(r"^(add|sub|mul)\.(.*\.)?bf16(x2)?$",)),
    Feature("fence.proxy.async", "fence.proxy.async.shared::cta", "sm_90", patterns=(r"^fence\.proxy\.async(\.|$)",)),
    Feature("wgmma", "wgmma.mma_async.sync.aligned", "sm_90a", patterns=(r"^wgmma\.",)),
    Feature("setmaxnreg", "setmaxnreg", "sm_90a", patterns=(r"^setmaxnreg(\.|$)",)),
    # ptxas 13.0 rejects each of the following below sm_90 ("requires .target sm_90 or higher") and accepts it on sm_90
    Feature("cp.async.bulk", "cp.async.bulk / cp.reduce.async.bulk (TMA)", "sm_90",
            patterns=(r"^cp\.(reduce\.)?async\.bulk(\.|$)",)),
    Feature("mbarrier.tx", "mbarrier.try_wait / mbarrier.expect_tx / .complete_tx", "sm_90",
            patterns=(r"^mbarrier\.(.*\.)?(try_wait|expect_tx|complete_tx)(\.|$)",)),
    Feature("elect.sync", "elect.sync", "sm_90", patterns=(r"^elect\.sync(\.|$)",)),
    Feature("barrier.cluster", "barrier.cluster.arrive / barrier.cluster.wait", "sm_90",
            patterns=(r"^barrier\.cluster(\.|$)",)),
    Feature("cluster.address", "mapa / getctarank (distributed shared memory)", "sm_90",
            patterns=(r"^(mapa|getctarank)(\.|$)",)),
    Feature("griddepcontrol", "griddepcontrol.wait / launch_dependents", "sm_90", patterns=(r"^griddepcontrol(\.|$)",)),
    Feature("fence.proxy.tensormap", "fence.proxy.tensormap::generic", "sm_90",
            patterns=(r"^fence\.proxy\.tensormap",)),
    # ptxas 13.0 rejects tcgen05 on sm_89/sm_90/sm_90a and accepts it on sm_100a
    Feature("tcgen05", "tcgen05.*", "sm_100a", patterns=(r"^tcgen05\.",)),
)}


def feature_of_ptx(mnemonic: str):
    """The ``FEATURES`` entry gating the PTX mnemonic (e.g. "cp.async.bulk.tensor.2d..."), or None if none does."""
    for f in FEATURES.values():
        if f.matches(mnemonic):
            return f
    return None


def find_mma(a_dtype=None, b_dtype=None, accum_dtype=None, k=None):
    """All table entries matching the given (canonicalised) fields; None matches anything."""
    want = {
        "a_dtype": _dt.canonical(a_dtype) if a_dtype is not None else None,
        "b_dtype": _dt.canonical(b_dtype) if b_dtype is not None else None,
        "accum_dtype": _dt.canonical(accum_dtype) if accum_dtype is not None else None,
        "k": k,
    }
    return [e for e in MMA_TABLE if all(v is None or getattr(e, f) == v for f, v in want.items())]


def _combo(e):
    return f"{e.a_dtype} x {e.b_dtype} -> {e.accum_dtype}"


def select_mma(a_dtype, b_dtype, accum_dtype, k=None, arch=None) -> MmaInstr:
    """The instruction for a dtype combination (the largest K unless ``k`` is given), checked against ``arch``.

    Raises ``UnsupportedConfigError`` naming the valid combinations, or ``ArchError`` naming the archs that have it.
    """
    hits = find_mma(a_dtype, b_dtype, accum_dtype)
    if not hits:
        raise UnsupportedConfigError(
            f"no mma.sync instruction for {_dt.canonical(a_dtype)} x {_dt.canonical(b_dtype)} -> "
            f"{_dt.canonical(accum_dtype)}; valid combinations: {choices(_combo(e) for e in MMA_TABLE)}")
    if k is not None:
        exact = [e for e in hits if e.k == k]
        if not exact:
            raise UnsupportedConfigError(
                f"{_combo(hits[0])} has no k={k} mma.sync; valid k: {choices(e.k for e in hits)}")
        hits = exact
    instr = hits[0]
    if arch is not None:
        check_mma_arch(instr, arch)
    return instr


def check_mma_arch(instr: MmaInstr, arch) -> None:
    a = as_arch(arch)
    if not a.satisfies(instr.min_arch):
        raise ArchError(f"{instr.ptx()} needs {instr.min_arch} or newer; target is {a.name}")


def matrix_move(op: str, num: int, trans: bool = False, arch=None) -> MatrixMoveInstr:
    """The ldmatrix/stmatrix entry for ``op`` x``num`` [.trans], checked against ``arch``."""
    hits = [e for e in MATRIX_MOVE_TABLE if e.op == op and e.num == num and e.trans == trans]
    if not hits:
        raise UnsupportedConfigError(
            f"no {op}.x{num}; valid: {choices(e.ptx() for e in MATRIX_MOVE_TABLE)}")
    if arch is not None:
        a = as_arch(arch)
        if not a.satisfies(hits[0].min_arch):
            raise ArchError(f"{hits[0].ptx()} needs {hits[0].min_arch} or newer; target is {a.name}"
                            + ("; use the vectorized-store epilogue below sm_90" if op == "stmatrix" else ""))
    return hits[0]


def require_feature(name: str, arch) -> Feature:
    """Raise ``ArchError`` unless ``arch`` has the feature ``name`` (a key of ``FEATURES``)."""
    if name not in FEATURES:
        raise UnsupportedConfigError(f"unknown feature {name!r}; valid: {choices(FEATURES)}")
    f = FEATURES[name]
    a = as_arch(arch)
    if not a.satisfies(f.min_arch):
        raise ArchError(f"{f.ptx} needs {f.min_arch} or newer; target is {a.name}" + (f" ({f.note})" if f.note else ""))
    return f


def markdown_table() -> str:
    """The mma table as Markdown (docs are generated from the data, never written by hand)."""
    rows = ["| shape | A | B | accumulate | PTX | min arch | regs A/B/C | notes |", "|---|---|---|---|---|---|---|---|"]
    for e in MMA_TABLE:
        rows.append(f"| {e.shape_name} | {e.a_dtype} | {e.b_dtype} | {e.accum_dtype} | `{e.ptx()}` | {e.min_arch} | "
                    f"{e.a_regs}/{e.b_regs}/{e.c_regs} | {e.note} |")
    return "\n".join(rows)


def wgmma_markdown_table() -> str:
    """``WGMMA_TABLE`` as Markdown."""
    rows = ["| shape | A | B | accumulate | N | majors | RS | .satfinite | min arch |",
            "|---|---|---|---|---|---|---|---|---|"]
    for e in WGMMA_TABLE:
        ns = e.n_values
        n = "8..256 step 8" if ns == WGMMA_N_FLOAT else ", ".join(map(str, ns))
        rows.append(f"| m64nNk{e.k} | {e.a_dtype} | {e.b_dtype} | {e.accum_dtype} | {n} | {'/'.join(e.majors)} | "
                    f"{'yes' if e.rs else 'no'} | {'yes' if e.satfinite else 'no'} | {e.min_arch} |")
    return "\n".join(rows)
