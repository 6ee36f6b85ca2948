"""Reading ``cuobjdump -sass`` text and ``ptxas -v`` reports: instruction mix, opcode histogram, resource usage.

Opcodes are grouped by their base (the text before the first dot): ``HMMA.16816.F32`` counts as HMMA, ``LDS.128`` as
LDS, while ``LDSM`` (ldmatrix) is its own base and never counts as LDS. ``@!PT`` instructions (predicated on
never-true; ptxas pads with ``@!PT LDS RZ, [RZ]``) never execute and are not counted.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

__all__ = ["MIX_OPCODES", "ResourceUsage", "sass_functions", "opcode_histogram", "instruction_mix",
           "parse_ptxas_log", "wgmma_accumulator_hazards"]

#: Opcode bases always present in ``instruction_mix`` (0 when absent): tensor-core MMAs, matrix moves, async copies,
#: global and shared loads/stores, barriers.
MIX_OPCODES = ("HMMA", "IMMA", "QMMA", "HGMMA", "LDSM", "STSM", "LDGSTS", "LDG", "STG", "LDS", "STS", "BAR")

_FUNC_RE = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTR_RE = re.compile(r"^\s*/\*[0-9a-fA-F]{4,}\*/\s+(.*?)\s*;")
_PRED_RE = re.compile(r"^@(!?)(U?P[T0-9]+)\s+")


def sass_functions(sass: str) -> dict:
    """``{function name: [instruction text, ...]}`` in program order (without addresses, encodings, ``;``)."""
    funcs: dict = {}
    current = None
    for line in sass.splitlines():
        m = _FUNC_RE.match(line)
        if m:
            current = funcs.setdefault(m.group(1), [])
            continue
        m = _INSTR_RE.match(line)
        if m and current is not None:
            current.append(m.group(1))
    return funcs


def _executed_opcodes(sass: str, function: str | None):
    funcs = sass_functions(sass)
    if function is not None:
        if function not in funcs:
            from ..errors import UnsupportedConfigError, choices
            raise UnsupportedConfigError(f"no function {function!r} in the SASS; functions: {choices(funcs)}")
        funcs = {function: funcs[function]}
    for instrs in funcs.values():
        for text in instrs:
            m = _PRED_RE.match(text)
            if m:
                if m.group(1) == "!" and m.group(2) in ("PT", "UPT"):
                    continue  # guarded by "not true": never executes
                text = text[m.end():]
            yield text.split()[0]


_HGMMA_RE = re.compile(r"^[HIQ]GMMA\.64x(\d+)x\d+\.(\w+)\S*\s+R(\d+)")
_REG_RE = re.compile(r"(?<![A-Za-z0-9_.])R(\d+)(?![0-9])")


def wgmma_accumulator_hazards(sass: str, function: str | None = None) -> list:
    """Instructions that touch an ``HGMMA`` accumulator register while that HGMMA may still be in flight.

    A linear scan in address order per function: every HGMMA / IGMMA / QGMMA adds its accumulator registers
    (``64 x N`` fp32 / s32: N / 2 registers from the first operand; fp16: N / 4) to the pending set, ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` clears
    it (``0x1`` etc. retire an unknown subset and clear nothing), and any other instruction naming a pending register
    is a hazard: PTX requires ``wgmma.wait_group`` before accumulators are read or written. Returns
    ``[(function, index, instruction text), ...]``; ``[]`` = none found. Branch targets are not followed, so code
    reached only through a loop back edge is checked in layout order (ptxas lays loops out in order).

    Why it exists: ptxas moved fp32->fp16 conversions of the accumulators above the final
    ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` when the last wait followed a K loop that kept one wgmma group in flight, and
    the kernel returned wrong sums on the H100 (docs/perf-notes.md, fused Hopper dequant GEMM, 2026-11-26).
    """
    funcs = sass_functions(sass)
    if function is not None:
        funcs = {function: funcs.get(function, [])}
    found = []
    for name, instrs in funcs.items():
        pending: set = set()
        for i, text in enumerate(instrs):
            body = _PRED_RE.sub("", text, count=1)
            m = _HGMMA_RE.match(body)
            if m:
                n, kind, base = int(m.group(1)), m.group(2), int(m.group(3))
                count = n // 4 if kind == "F16" else n // 2
                pending.update(range(base, base + count))
                continue
            if body.startswith("WARPGROUP.DEPBAR"):
                if body.replace(" ", "").endswith("0x0"):
                    pending.clear()
                continue
            if pending and any(int(r) in pending for r in _REG_RE.findall(body)):
                found.append((name, i, text))
    return found


def opcode_histogram(sass: str, function: str | None = None) -> dict:
    """Count of each full opcode (``"HMMA.16816.F32"``, ``"LDS.128"``, ...) over one or all functions."""
    return dict(Counter(_executed_opcodes(sass, function)))


def instruction_mix(sass: str, function: str | None = None) -> dict:
    """Count per opcode base (``HMMA``, ``LDSM``, ``LDS``, ...); every ``MIX_OPCODES`` key is present."""
    counts = Counter(op.split(".")[0] for op in _executed_opcodes(sass, function))
    mix = {k: counts.get(k, 0) for k in MIX_OPCODES}
    for k, v in sorted(counts.items()):
        mix.setdefault(k, v)
    return mix


@dataclass(frozen=True)
class ResourceUsage:
    """Per-kernel numbers from ``ptxas -v``."""

    function: str
    registers: int
    static_smem_bytes: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes

    @property
    def uses_local_memory(self) -> bool:
        """True when ptxas reports spill stores / loads or a stack frame (per-thread local memory, i.e. DRAM
        behind L1: a kernel meant to live in registers is then slower than it should be)."""
        return bool(self.spill_bytes or self.stack_frame_bytes)

    def describe(self) -> str:
        """One line for messages: registers, spills, stack frame, static shared memory."""
        return (f"{self.function}: {self.registers} registers, {self.spill_store_bytes} bytes spill stores, "
                f"{self.spill_load_bytes} bytes spill loads, {self.stack_frame_bytes} bytes stack frame, "
                f"{self.static_smem_bytes} bytes static smem")


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_STACK_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(log: str) -> dict:
    """``{kernel name: ResourceUsage}`` for each entry function in a ``ptxas -v`` report."""
    out: dict = {}
    stack: dict = {}
    entry = props = None
    for line in log.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            entry = m.group(1)
            continue
        m = _PROPS_RE.search(line)
        if m:
            props = m.group(1)
            continue
        m = _STACK_RE.search(line)
        if m and props is not None:
            stack[props] = tuple(int(x) for x in m.groups())
            continue
        m = _USED_RE.search(line)
        if m and entry is not None:
            frame, st, ld = stack.get(entry, (0, 0, 0))
            b = _BARRIERS_RE.search(line)
            s = _SMEM_RE.search(line)
            out[entry] = ResourceUsage(entry, int(m.group(1)), int(s.group(1)) if s else 0, frame, st, ld,
                                       int(b.group(1)) if b else 0)
            entry = None
    return out
