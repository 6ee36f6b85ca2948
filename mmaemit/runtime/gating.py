"""Arch gating: find every PTX instruction a PrimFunc emits and check it against ``mmaemit.isa`` before nvcc runs.

TVM never rejects an instruction for the target arch (ptxas does, late, with a message about a line of a temp file),
so ``compile`` walks the PrimFunc first. Sources of PTX that are recognised:

* ``T.ptx.<mnemonic>(...)`` calls (op ``tirx.ptx.<entry>``; the modifier tokens ride as trailing string arguments, so
  the exact mnemonic is rebuilt from TVM's own instruction table);
* ``T.ptx_legacy.mma`` / ``T.ptx_legacy.ldmatrix``;
* ``T.cuda`` helpers whose bodies are fixed PTX (``elect_sync``, ``cluster_sync``, ``mbarrier_wait*``);
* ``asm(...)`` strings inside ``T.cuda.func_call(..., source_code=...)``.

Each mnemonic is then looked up in ``isa.MMA_TABLE`` (exact ``ptx()`` spelling), ``isa.MATRIX_MOVE_TABLE``
(ldmatrix/stmatrix m8n8) or ``isa.FEATURES`` (``feature_of_ptx``); mnemonics none of them know pass unchecked.
"""
from __future__ import annotations

import re
import warnings

from .. import dtypes as _dt
from .. import isa
from ..arch import Arch, as_arch
from ..errors import ArchError, PerformanceWarning, UnsupportedConfigError

__all__ = ["ptx_instructions", "check_instructions", "mnemonics_in_asm"]

_PTX_OP_PREFIX = "tirx.ptx."
# T.cuda helpers whose bodies are one fixed PTX sequence (tvm/backend/cuda/cpp/asm.py, builtins.py)
_CUDA_OP_PTX = {
    "tirx.cuda.elect_sync": ("elect.sync",),
    "tirx.cuda.cluster_sync": ("barrier.cluster.arrive.aligned", "barrier.cluster.wait.aligned"),
    "tirx.cuda.mbarrier_wait": ("mbarrier.try_wait.parity.acquire.cta.shared::cta.b64",),
    "tirx.cuda.mbarrier_wait_acquire_cluster": ("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64",),
}
_MATRIX_MOVE_RE = re.compile(r"^(ldmatrix|stmatrix)\.sync\.aligned\.m8n8\.x(\d+)(\.trans)?(\.shared(::cta)?)?\.b16$")
_MMA_BY_PTX = {}
for _e in isa.MMA_TABLE:
    _MMA_BY_PTX.setdefault(_e.ptx(), _e)
    if _e.is_integer:
        _MMA_BY_PTX.setdefault(_e.ptx(satfinite=True), _e)


def _ptx_table():
    try:
        from tvm.backend.cuda.ptx.table import TABLE
    except ImportError:  # a TVM without the table-driven dialect: fall back to the call's own strings
        return {}
    return TABLE


def _str_value(arg):
    value = getattr(arg, "value", None)
    return value if isinstance(value, str) else None


def _mnemonic_of_ptx_call(call, table) -> str:
    key = call.op.name[len(_PTX_OP_PREFIX):]
    entry = table.get(key)
    args = list(call.args)
    if entry is not None:
        n = len(entry.slots)
        # layout (engine._emit): [operands..., pred?] [one token per modifier slot, "" = omitted] [flag marker]
        tokens = [_str_value(a) for a in args[len(args) - n - 1:-1]]
        if len(args) >= n + 1 and all(t is not None for t in tokens):
            return ".".join([entry.ptx_name, *[t for t in tokens if t]])
    strings = [s for s in map(_str_value, args[:-1]) if s]
    return ".".join([key.split("_")[0], *strings])


def _legacy_mma_mnemonic(call) -> str:
    shape, alayout, blayout, a, b, c = (_str_value(x) or str(x) for x in call.args[:6])

    def tok(d):
        if d == "tf32":
            return "tf32"
        try:
            return _dt.ptx_type(d)
        except UnsupportedConfigError:
            return d

    sat = len(call.args) > 12 and bool(getattr(call.args[12], "value", False))
    return (f"mma.sync.aligned.{shape}.{alayout}.{blayout}{'.satfinite' if sat else ''}."
            f"{tok(c)}.{tok(a)}.{tok(b)}.{tok(c)}")


def _legacy_ldmatrix_mnemonic(call) -> str:
    trans = bool(getattr(call.args[0], "value", False))
    num = int(getattr(call.args[1], "value", 0))
    return f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"


_ASM_RE = re.compile(r"\basm\s*(?:volatile|__volatile__)?\s*\(\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+)")
_CSTR_RE = re.compile(r"\"((?:[^\"\\]|\\.)*)\"")


def mnemonics_in_asm(c_source: str) -> list:
    """PTX mnemonics in the ``asm(...)`` statements of a C/CUDA source string (labels, ``.reg`` and braces skipped)."""
    out = []
    for m in _ASM_RE.finditer(c_source):
        text = "".join(_CSTR_RE.findall(m.group(1)))
        text = text.replace("\\n", "\n").replace("\\t", " ").replace('\\"', '"').replace("\\\\", "\\")
        for stmt in re.split(r"[;\n]", text):
            stmt = stmt.replace("{", " ").replace("}", " ").strip()
            stmt = re.sub(r"^\w+:\s*", "", stmt)  # label
            stmt = re.sub(r"^@!?%?\w+\s+", "", stmt)  # predicate guard
            if not stmt or stmt.startswith((".", "//")):
                continue
            out.append(stmt.split()[0])
    return out


def ptx_instructions(func) -> tuple:
    """The distinct PTX mnemonics ``func`` (a PrimFunc or IRModule) emits, in first-use order.

    E.g. ``("ldmatrix.sync.aligned.m8n8.x4.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")``.
    """
    import tvm_ffi
    from tvm.ir.expr import Call

    table = _ptx_table()
    found = {}

    def visit(call):
        name = getattr(call.op, "name", None)
        if not isinstance(name, str):
            return None
        if name.startswith(_PTX_OP_PREFIX) and name != "tirx.ptx.addr":
            found.setdefault(_mnemonic_of_ptx_call(call, table), None)
        elif name == "tirx.ptx_legacy.mma":
            found.setdefault(_legacy_mma_mnemonic(call), None)
        elif name == "tirx.ptx_legacy.ldmatrix":
            found.setdefault(_legacy_ldmatrix_mnemonic(call), None)
        elif name in _CUDA_OP_PTX:
            for m in _CUDA_OP_PTX[name]:
                found.setdefault(m, None)
        elif name == "tirx.cuda.func_call":
            for arg in call.args[1:]:
                s = _str_value(arg)
                if s and "asm" in s:
                    for m in mnemonics_in_asm(s):
                        found.setdefault(m, None)
        return None

    tvm_ffi.structural_walk(func, (Call, visit))
    return tuple(found)


def _requirement(mnemonic):
    """(min_arch, emulated_on, note) of a mnemonic per the isa tables, or None when no table gates it."""
    mma = _MMA_BY_PTX.get(mnemonic)
    if mma is not None:
        return mma.min_arch, mma.emulated_on, ""
    m = _MATRIX_MOVE_RE.match(mnemonic)
    if m:
        entry = isa.matrix_move(m.group(1), int(m.group(2)), bool(m.group(3)))
        return entry.min_arch, (), ("use the vectorized-store epilogue below sm_90" if entry.op == "stmatrix" else "")
    feat = isa.feature_of_ptx(mnemonic)
    if feat is not None:
        return feat.min_arch, (), feat.note
    return None


def check_instructions(instructions, arch, *, stacklevel: int = 2) -> tuple:
    """Raise ``ArchError`` if ``arch`` lacks any of ``instructions`` (mnemonics, or a PrimFunc to scan).

    Emits one ``PerformanceWarning`` per instruction the isa table lists as emulated on ``arch``. Returns the
    mnemonics checked.
    """
    a: Arch = as_arch(arch)
    if not isinstance(instructions, (tuple, list)):
        instructions = ptx_instructions(instructions)
    missing, emulated = [], []
    for mnemonic in instructions:
        req = _requirement(mnemonic)
        if req is None:
            continue
        min_arch, emulated_on, note = req
        if not a.satisfies(min_arch):
            need = min_arch if min_arch[-1].isalpha() else f"{min_arch} or newer"  # "a" features: that chip only
            missing.append(f"{mnemonic} needs {need}" + (f" ({note})" if note else ""))
        elif a.name in emulated_on:
            emulated.append(f"{mnemonic} is emulated on {a.name}" + (f": {_MMA_BY_PTX[mnemonic].note}"
                                                                      if mnemonic in _MMA_BY_PTX else ""))
    if missing:
        raise ArchError(f"target {a.name} lacks instructions this kernel uses: " + "; ".join(missing))
    for msg in emulated:
        warnings.warn(msg, PerformanceWarning, stacklevel=stacklevel + 1)
    return tuple(instructions)
