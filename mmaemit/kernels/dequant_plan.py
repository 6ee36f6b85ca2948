"""Measured plans for :class:`~mmaemit.kernels.dequant_dispatch.DequantGemm`: the fastest path per M bucket, timed
on the GPU that serves, stored per problem and GPU, and used by every later process.

The rules' plan (``dequant_dispatch``'s module doc) picks a path from M, N and K by thresholds measured on the H100;
where two paths are close, which one wins depends on the GPU (an H200's faster memory moves the balance), the dtype
and the shape (docs/perf-notes.md, eighteenth session: at 4096 x 14336 bf16 M=100 the wave-filling rule chose a path
0.91x the other). :func:`measure_plan` times the candidates instead:

* **Buckets.** M = 17 .. ``max_m`` in buckets of 16 rows (17-32, 33-48, ...), each timed at its largest M. Every
  fused tile height is a multiple of 16, so every M of a bucket gives each path the same number of tile rows as the
  timed one (the last row's fill differs by at most 15 rows). M <= 16 keeps the rules' GEMVs (memory-bound, planned
  by rule), M > ``max_m`` the rules' plan.
* **Candidates** (:func:`plan_candidates`): the rules' paths in the bucket, and each fused path that fits the
  problem and gives the bucket's M at most ``max_rows`` tile rows (one-row paths: the two shortest that hold M).
* **Checks.** Each candidate runs once into a NaN-poisoned output before it is timed; a candidate that leaves NaN or
  differs from the rules' path by more than ``rtol`` (relative Frobenius error) is dropped and named in
  :attr:`MeasuredPlan.dropped`.
* **Timing.** ``mmaemit.runtime.timing.time_rotating`` (inputs rotated over copies that exceed L2, one CUDA graph per
  round), ``rounds`` times per candidate with the candidates interleaved; the fastest round counts.
* **Choice.** The (up to three) candidates that beat the rules' path by more than ``margin`` (3 %) at the bucket's
  last M are timed again at its first M, where their last tile row is nearly empty (a zero-filled row costs
  differently from a full one: 4096 x 4096 at M=33, fused32's two rows lost 0.89x to fused48 where they won 1.07x
  at M=48). The bucket takes the finalist whose worse ratio to the rules' path over the two M is smallest, if that
  beats the margin; else it keeps the rules' spans (so noise never moves the plan).

The result is stored in the tuning table (``$MMAEMIT_CACHE_DIR/autotune/mmaemit.dequant_plan.json``, file-locked)
under the problem (the DequantGemm's arguments), the GPU fingerprint and the sources of the kernels and this module:
a change of any of them is a miss. :func:`stored_plan` finds it again; ``torch.ops.mmaemit.dequant_linear`` (and so
``QuantLinear``) uses a stored plan of its problem unless ``MMAEMIT_DEQUANT_PLAN=rules``.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

from mmaemit.errors import ArgumentError

from .dequant_dispatch import FUSED_PATHS, DequantGemm, clip_spans, join_spans, prebuild, span_path

__all__ = ["MeasuredPlan", "measure_plan", "stored_plan", "plan_buckets", "plan_candidates", "PLAN_MAX_M",
           "PLAN_STEP", "PLAN_MARGIN", "PLAN_TABLE"]

#: bucket height (every fused tile height is a multiple of it)
PLAN_STEP = 16
#: default last measured M (the wave-filling and one-wave paths all start at or below it)
PLAN_MAX_M = 512
#: a bucket leaves the rules' plan only for a path that is faster by more than this fraction
PLAN_MARGIN = 0.03
#: the tuning table's name
PLAN_TABLE = "mmaemit.dequant_plan"
_SOURCES = ("mmaemit.kernels.dequant_dispatch", "mmaemit.kernels.dequant_gemm_hopper", "mmaemit.kernels.dequant_gemm",
            "mmaemit.kernels.dequant_dense", "mmaemit.kernels.gemm_hopper", "mmaemit.kernels.dequant_parts",
            "mmaemit.pipeline", "mmaemit.emitters")


@dataclasses.dataclass
class MeasuredPlan:
    """What :func:`measure_plan` found. ``spans``: [(path, first M, last M)] from M=1 to ``max_m`` (give it to
    ``DequantGemm(plan=)`` / :meth:`~mmaemit.kernels.dequant_dispatch.DequantGemm.set_plan`); ``times``: {bucket's
    last M: {path: µs}}; ``rule``: {bucket's last M: the rules' path there}; ``chosen``: {bucket's last M: the path
    that replaced it, or None where the rules' spans stayed}; ``low``: {bucket's last M: {"rule": the rules' path
    at the bucket's first M, "times": {path: µs} there}} for the buckets whose finalists were timed there too;
    ``dropped``: {M: {path: why}};
    ``device``: the GPU's name; ``seconds``: the measurement's wall time (builds included)."""

    spans: list
    max_m: int
    times: dict
    rule: dict
    chosen: dict
    low: dict = dataclasses.field(default_factory=dict)
    dropped: dict = dataclasses.field(default_factory=dict)
    device: str = ""
    seconds: float = 0.0

    def gain(self, m: int) -> float:
        """The rules' path's time over the plan's at the bucket whose last M is ``m``, the smaller of the gains at
        its last and first M (1.0 where the rules' spans stayed)."""
        c = self.chosen[m]
        if not c:
            return 1.0
        t, lo = self.times[m], self.low[m]
        return min(t[self.rule[m]] / t[c], lo["times"][lo["rule"]] / lo["times"][c])

    def text(self) -> str:
        """One line per bucket: the rules' path and time, the plan's choice and its gain."""
        lines = [f"measured plan, M = 17..{self.max_m} ({self.device}, {self.seconds:.0f} s):"]
        for m in sorted(self.times):
            t, r, c = self.times[m], self.rule[m], self.chosen[m]
            best = f"-> {c} {t[c]:.1f} µs ({self.gain(m):.2f}x)" if c else "(kept)"
            lines.append(f"  M {m - PLAN_STEP + 1}-{m}: rules {r} {t[r]:.1f} µs {best}; at {m}: "
                         + ", ".join(f"{p} {v:.1f}" for p, v in sorted(t.items(), key=lambda kv: kv[1])))
            if m in self.low:
                tl = self.low[m]["times"]
                lines[-1] += f"; at {m - PLAN_STEP + 1}: " + ", ".join(
                    f"{p} {v:.1f}" for p, v in sorted(tl.items(), key=lambda kv: kv[1]))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"spans": [list(s) for s in self.spans], "max_m": self.max_m,
                "times": {str(m): t for m, t in self.times.items()}, "rule": {str(m): p for m, p in self.rule.items()},
                "chosen": {str(m): p for m, p in self.chosen.items()}, "low": {str(m): v for m, v in self.low.items()},
                "dropped": {str(m): d for m, d in self.dropped.items()}, "device": self.device,
                "seconds": self.seconds}

    @classmethod
    def from_json(cls, d: dict) -> "MeasuredPlan":
        def keyed(x):
            return {int(m): v for m, v in x.items()}
        return cls([tuple(s) for s in d["spans"]], int(d["max_m"]), keyed(d["times"]), keyed(d["rule"]),
                   keyed(d["chosen"]), keyed(d.get("low", {})), keyed(d.get("dropped", {})), d.get("device", ""),
                   float(d.get("seconds", 0)))


def plan_buckets(max_m: int = PLAN_MAX_M) -> list:
    """[(first M, last M)] of the measured buckets: 17-32, 33-48, ... up to ``max_m`` (a multiple of
    :data:`PLAN_STEP`, at least 32)."""
    if isinstance(max_m, bool) or not isinstance(max_m, int) or max_m < 2 * PLAN_STEP or max_m % PLAN_STEP:
        raise ArgumentError(f"max_m={max_m!r}: a multiple of {PLAN_STEP}, at least {2 * PLAN_STEP}")
    return [(hi - PLAN_STEP + 1, hi) for hi in range(2 * PLAN_STEP, max_m + 1, PLAN_STEP)]


def plan_candidates(gemm: DequantGemm, lo: int, hi: int, max_rows: int = 8) -> list:
    """The paths :func:`measure_plan` times for the bucket ``lo .. hi`` of ``gemm``'s problem: the rules' paths there
    (:attr:`~mmaemit.kernels.dequant_dispatch.DequantGemm.rule_ranges`), the two shortest fused paths whose tiles
    hold ``hi`` rows in one row, and every fused path that fits, needs at most ``max_rows`` tile rows and whose
    tile height is a multiple of :data:`PLAN_STEP` (``fused8``'s 8-row tiles would give the bucket's M two row
    counts)."""
    rule = [p for p, _, _ in clip_spans(gemm.rule_ranges, lo, hi)]
    fused = [p for p in FUSED_PATHS if p in gemm.runnable_paths()]
    bm = {p: gemm.configs[p].block_m for p in fused}
    one_row = sorted((p for p in fused if bm[p] >= hi), key=lambda p: (bm[p], gemm.configs[p].weight_rows))[:2]
    rows = [p for p in fused if bm[p] < hi and -(-hi // bm[p]) <= max_rows and bm[p] % PLAN_STEP == 0]
    return list(dict.fromkeys(rule + one_row + rows))


def _rule_path(gemm, m) -> str:
    return span_path(gemm.rule_ranges, m)


def _entry_key(gemm) -> str:
    from mmaemit.tuning import device_fingerprint, source_hash
    from mmaemit.tuning.space import digest

    spec = dict(gemm.spec(), plan=None, interpret=False)
    return digest({"problem": spec, "device": device_fingerprint(), "source": source_hash(measure_plan, _SOURCES)})


def stored_plan(gemm: DequantGemm):
    """The :class:`MeasuredPlan` stored for ``gemm``'s problem on the visible GPU with today's kernel sources, or
    None (also without a GPU, or on the interpreter)."""
    import torch

    from mmaemit.tuning import TuningTable

    if gemm.interpret or not torch.cuda.is_available():
        return None
    entry = TuningTable(PLAN_TABLE).get(_entry_key(gemm))
    return None if entry is None else MeasuredPlan.from_json(entry["plan"])


def _gpu_timer(gemm, max_m, rtol, dropped):
    """The default timer: (path, M, rules' path) -> µs, or None for a candidate that fails its check (the reason goes
    to ``dropped[M][path]``). Weights: the format's quantizer on normal weights, in as many copies as make one round
    of calls stream 4x L2 from DRAM; activations: normal, one per copy, made once per M."""
    import torch

    from mmaemit import dequant as D
    from mmaemit.dequant.kernel_layout import kernel_arguments
    from mmaemit.dtypes import torch_dtype
    from mmaemit.runtime.timing import copies_needed, time_rotating

    dt = torch_dtype(gemm.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    qw = D.quantize(torch.randn(gemm.N, gemm.K, device="cuda", generator=gen).to(dt),
                    D.QuantScheme(gemm.weight_format, gemm.group_size, gemm.zeros_mode))
    weights = tuple(t.cuda() for t in kernel_arguments(qw)[0])
    nbytes = sum(t.numel() * t.element_size() for t in weights) + max_m * gemm.K * 2
    copies = [weights] + [tuple(t.clone() for t in weights) for _ in range(copies_needed(nbytes) - 1)]
    per_m: dict = {}
    checked: dict = {}

    def inputs(M):
        if M not in per_m:
            per_m.clear()                            # one M's activations at a time
            acts = [torch.randn(M, gemm.K, device="cuda", generator=gen).to(dt) for _ in copies]
            outs = [torch.empty((M, gemm.n_out), dtype=dt, device="cuda") for _ in copies]
            per_m[M] = (acts, outs, {})
        return per_m[M]

    def check(path, M, base):
        acts, outs, ref = inputs(M)
        out = torch.full_like(outs[0], float("nan"))
        gemm.run_path(path, acts[0], *copies[0], out=out)
        torch.cuda.synchronize()
        if torch.isnan(out).any():
            return "NaN left in the poisoned output"
        if path == base:
            ref[base] = out.float()
            return None
        r = ref[base]
        err = ((out.float() - r).norm() / r.norm().clamp_min(1e-30)).item()
        return None if err <= rtol else f"relative error {err:.2e} against {base} (rtol {rtol})"

    def timer(path, M, base):
        if (path, M) not in checked:
            why = checked[path, M] = check(path, M, base)
            if why:
                dropped.setdefault(M, {})[path] = why
        if checked[path, M]:
            return None
        acts, outs, _ = inputs(M)
        calls = [(lambda a=a, w=w, o=o: gemm.run_path(path, a, *w, out=o)) for a, w, o in zip(acts, copies, outs)]
        return time_rotating(calls, reps=20, warmup_ms=20.0)

    return timer


def measure_plan(gemm: DequantGemm, *, max_m: int = PLAN_MAX_M, rounds: int = 2, margin: float = PLAN_MARGIN,
                 rtol: float = 1e-2, max_rows: int = 8, store: bool = True, force: bool = False, adopt: bool = True,
                 workers=None, timer=None, progress: bool = True) -> MeasuredPlan:
    """Time the candidate paths of ``gemm``'s problem per M bucket on the visible GPU and return the plan (module
    doc). ``store``: save it in the tuning table (and, unless ``force``, return a stored plan of the same problem,
    GPU and sources without timing); ``adopt``: ``gemm.set_plan`` it. ``workers``: parallel kernel builds (as
    :func:`~mmaemit.kernels.dequant_dispatch.prebuild`). ``timer``: a callable (path, M, rules' path) -> µs (None:
    the candidate is dropped) instead of the GPU timing, e.g. for a cost model; nothing runs or is stored then.
    Weights and activations are random (the format's quantizer on normal weights): the kernels' speed does not depend
    on the values."""
    import torch
    from tqdm import tqdm

    from mmaemit.tuning import TuningTable

    buckets = plan_buckets(max_m)
    for name, v, ok in (("rounds", rounds, isinstance(rounds, int) and rounds >= 1),
                        ("margin", margin, isinstance(margin, (int, float)) and 0 <= margin < 1),
                        ("rtol", rtol, isinstance(rtol, (int, float)) and rtol > 0),
                        ("max_rows", max_rows, isinstance(max_rows, int) and max_rows >= 1)):
        if not ok or isinstance(v, bool):
            raise ArgumentError(f"{name}={v!r}: valid: rounds an int >= 1, 0 <= margin < 1, rtol > 0, "
                                f"max_rows an int >= 1")
    if not any(p in FUSED_PATHS for p, _, _ in gemm.rule_ranges):
        raise ArgumentError(f"{gemm!r}: measured plans choose among the fused Hopper paths, and this problem's "
                            f"plan has none (they need sm_90a and a fast fused decode of the format)")
    measuring = timer is None
    if measuring:
        if gemm.interpret or not torch.cuda.is_available():
            raise ArgumentError("measure_plan times kernels on a CUDA GPU; on the interpreter or without a GPU pass "
                                "timer= (a cost model) instead")
        plan = stored_plan(gemm) if store and not force else None
        if plan is not None:
            if adopt:
                gemm.set_plan(plan)
            return plan
    t0 = time.time()
    cands = {hi: plan_candidates(gemm, lo, hi, max_rows) for lo, hi in buckets}
    dropped: dict = {}
    if measuring:
        prebuild([dict(gemm.spec(), paths=sorted({p for c in cands.values() for p in c}))], workers)
        timer = _gpu_timer(gemm, max_m, rtol, dropped)
    times: dict = {}
    rule: dict = {}
    chosen: dict = {}
    low: dict = {}
    bar = tqdm(total=len(buckets), desc="measuring the dequant plan", unit="bucket",
               disable=not (progress and measuring))

    def sample(paths, m, base):
        """{path: min µs over ``rounds``} at M=m, ``base`` first in each round; failing candidates dropped."""
        got: dict = {p: [] for p in paths}
        for _ in range(rounds):
            for p in [base] + [c for c in paths if c != base]:
                if p not in got:
                    continue
                us = timer(p, m, base)
                if us is None:
                    if p == base:
                        raise RuntimeError(f"{gemm!r}: the rules' path {base} failed its check at M={m}: "
                                           f"{dropped.get(m, {}).get(base, 'timer returned None')}")
                    got.pop(p)
                    dropped.setdefault(m, {}).setdefault(p, "timer returned None")
                else:
                    got[p].append(float(us))
        return {p: min(v) for p, v in got.items()}

    for lo, hi in buckets:
        base = rule[hi] = _rule_path(gemm, hi)
        t = times[hi] = sample(cands[hi], hi, base)
        finalists = sorted((p for p in t if t[p] < t[base] * (1 - margin)), key=t.get)[:3]
        chosen[hi] = None
        if finalists:               # the bucket's first M: its last tile row nearly empty instead of full
            base_lo = _rule_path(gemm, lo)
            t_lo = sample([base_lo] + finalists, lo, base_lo)
            low[hi] = {"rule": base_lo, "times": t_lo}
            score = {p: max(t[p] / t[base], t_lo[p] / t_lo[base_lo]) for p in finalists if p in t_lo}
            best = min(score, key=score.get, default=None)
            if best is not None and score[best] < 1 - margin:
                chosen[hi] = best
        bar.update(1)
    bar.close()
    plan = MeasuredPlan(_spans(gemm, buckets, chosen), max_m, times, rule, chosen, low, dropped,
                        torch.cuda.get_device_name() if measuring else "", time.time() - t0)
    if measuring and store:
        from datetime import datetime, timezone

        TuningTable(PLAN_TABLE).put(_entry_key(gemm), {"plan": plan.to_json(), "problem": repr(gemm),
                        "date": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    if adopt:
        gemm.set_plan(plan)
    return plan


def _spans(gemm, buckets, chosen) -> list:
    """The plan's spans from M=1 to the last bucket: the rules' spans where a bucket kept them, else its choice."""
    out = clip_spans(gemm.rule_ranges, 1, buckets[0][0] - 1)
    for lo, hi in buckets:
        out += [(chosen[hi], lo, hi)] if chosen[hi] else clip_spans(gemm.rule_ranges, lo, hi)
    return join_spans(out)
