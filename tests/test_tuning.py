"""mmaemit.tuning on the CPU: spaces, stacked decorators, the tuning run with its failure paths (fake kernels that fail
or hang while compiling or running), the on-disk table (hits, misses, invalidation by each key part, a second process),
MMAEMIT_AUTOTUNE modes, the file lock under two processes, and the progress output."""
import dataclasses
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import autotune_fakes as F
from mmaemit.errors import ArgumentError, TuningError
from mmaemit.tuning import Space, TuningTable, autotune, jsonable, tune
from mmaemit.tuning import fingerprint as fp_mod
from mmaemit.tuning.pool import FunctionRef, WorkerPool, wait_any

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMAEMIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MMAEMIT_AUTOTUNE", raising=False)
    monkeypatch.setenv("MMAEMIT_AUTOTUNE_PROGRESS", "1")


@pytest.fixture
def logfile(tmp_path):
    return str(tmp_path / "events.log")


def events(path, kind):
    return [e for e in F.read_log(path) if e[0] == kind]


def fake_tuned(logfile, **kw):
    options = dict(inputs=F.fake_inputs, reference=F.fake_reference, outputs=[1], backend=F.FakeBackend(log=logfile),
                   progress=False)
    options.update(kw)
    return autotune(**options)(F.fake_builder)


# ------------------------------------------------------------------ spaces and decorators

@dataclasses.dataclass(frozen=True)
class Cfg:
    a: int
    b: tuple = (1, 2)


def test_space_product_is_cartesian_first_axis_slowest():
    s = Space({"x": [1, 2], "y": ["a", "b", "c"]})
    assert s.product({}) == [{"x": 1, "y": "a"}, {"x": 1, "y": "b"}, {"x": 1, "y": "c"},
                             {"x": 2, "y": "a"}, {"x": 2, "y": "b"}, {"x": 2, "y": "c"}]
    callable_axis = Space({"t": lambda key: [key["n"], 2 * key["n"]]})
    assert callable_axis.product({"n": 4}) == [{"t": 4}, {"t": 8}]
    with pytest.raises(ArgumentError, match="given twice"):
        s.merged(Space({"x": [3]}))
    with pytest.raises(ArgumentError, match="no values"):
        Space({"x": []})
    with pytest.raises(ArgumentError, match="no canonical JSON"):
        Space({"x": [object()]})


def test_jsonable_forms_are_canonical():
    assert jsonable(Cfg(3)) == {"__type__": f"{__name__}.Cfg", "a": 3, "b": [1, 2]}
    assert jsonable({"b": (1, 2), "a": None}) == {"a": None, "b": [1, 2]}
    with pytest.raises(ArgumentError):
        jsonable(float("nan"))


def test_stacked_decorators_multiply_axes_and_outer_options_win():
    tk = F.stacked_builder
    assert tk.space.names == ("speed", "mode")
    assert [p for p, _ in tk.candidates(8)] == [{"speed": 3.0, "mode": "ok"}, {"speed": 2.0, "mode": "ok"},
                                                {"speed": 5.0, "mode": "ok"}]
    assert tk.key(8) == {"n": 8, "scale": 2.0}
    outer = autotune(rtol=0.5, progress=True)(tk)
    assert outer.options["rtol"] == 0.5 and outer.options["progress"] is True
    assert outer.options["outputs"] == [1]  # the inner decorator's option survives
    with pytest.raises(ArgumentError, match="tuned by"):
        tk.bind(8, speed=1.0)
    with pytest.raises(ArgumentError, match="not a parameter"):
        autotune(nope=[1])(F.fake_builder)
    with pytest.raises(ArgumentError, match="module-level"):
        autotune(speed=[1.0], reference=lambda a, b: b)(F.fake_builder)


def test_prunes_of_stacked_decorators_all_apply():
    tk = autotune(speed=[1.0, 2.0, 3.0], prune=lambda p, a: p["speed"] != 2.0)(
        autotune(mode=["ok", "invalid"], prune=lambda p, a: "no invalid" if p["mode"] == "invalid" else True)(
            F.fake_builder))
    kept = [p for p, reason in tk.candidates(8) if reason is None]
    assert kept == [{"speed": 1.0, "mode": "ok"}, {"speed": 3.0, "mode": "ok"}]
    reasons = {r for _, r in tk.candidates(8) if r}
    assert "no invalid" in reasons and any("rejected by" in r for r in reasons)


def test_key_option_selects_and_buckets():
    tk = autotune(speed=[1.0], key=["n"])(F.fake_builder)
    assert tk.key(8, 3.0) == {"n": 8}
    tk2 = autotune(speed=[1.0], key=lambda a: {"n_bucket": 1 << (a["n"] - 1).bit_length()})(F.fake_builder)
    assert tk2.key(5) == tk2.key(8) == {"n_bucket": 8}
    with pytest.raises(ArgumentError, match="not arguments"):
        autotune(speed=[1.0], key=["m"])(F.fake_builder).key(8)


def test_function_refs_resolve_decorated_builders():
    ref = FunctionRef.of(F.stacked_builder)
    assert ref == FunctionRef("autotune_fakes", "stacked_builder")
    assert ref.resolve() is F.stacked_builder.fn
    with pytest.raises(ArgumentError, match="module-level"):
        FunctionRef.of(lambda: 0)


# ------------------------------------------------------------------ tuning runs

def test_tuning_picks_the_fastest_correct_candidate_and_lists_every_skip(logfile):
    # speed 0.5 is the fastest but computes a wrong result: it must not win
    tk = autotune(space={"cfg": [(4.0, "ok"), (3.0, "ok"), (0.5, "wrong"), (1.0, "compile_error"),
                                 (1.0, "invalid"), (1.0, "compile_hang"), (1.0, "run_hang"), (1.0, "run_error"),
                                 (2.0, "ok")]},
                  inputs=F.fake_inputs, reference=F.fake_reference, outputs=[1], compile_timeout=4, run_timeout=4,
                  backend=F.FakeBackend(log=logfile), progress=io.StringIO())(cfg_builder)
    t0 = time.perf_counter()
    result = tk.tune(16)
    wall = time.perf_counter() - t0
    by = {tuple(c.params["cfg"]): c for c in result.candidates}
    assert result.winner == {"cfg": (2.0, "ok")} and result.source == "tuned"
    assert result.time_s == pytest.approx(2e-6)
    assert by[(4.0, "ok")].status == by[(3.0, "ok")].status == "timed"
    assert by[(0.5, "wrong")].status == "wrong" and "relative error" in by[(0.5, "wrong")].reason
    assert by[(1.0, "compile_error")].status == "compile-error" and "ptxas fatal" in by[(1.0, "compile_error")].reason
    assert by[(1.0, "invalid")].status == "invalid" and "multiple of the fake tile" in by[(1.0, "invalid")].reason
    assert by[(1.0, "compile_hang")].status == "compile-timeout"
    assert by[(1.0, "run_hang")].status == "run-timeout" and "killed" in by[(1.0, "run_hang")].reason
    assert by[(1.0, "run_error")].status == "run-error" and "illegal memory access" in by[(1.0, "run_error")].reason
    assert wall < 120  # the hung compile and the hung run were cut off by their timeouts (4 s each)
    # the hung compile's grandchild (a stand-in for ptxas under nvcc) died with its worker's process group
    hung = [int(e[2]) for e in events(logfile, "hang")]
    assert len(hung) == 1
    time.sleep(0.5)
    stat = Path(f"/proc/{hung[0]}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"
    # the table lists every candidate with its reason
    text = result.table()
    for status in ("wrong", "compile-error", "invalid", "compile-timeout", "run-timeout", "run-error"):
        assert status in text


def cfg_builder(n, scale=2.0, *, cfg):
    speed, mode = cfg
    return F.fake_builder(n, scale, speed=speed, mode=mode)


def test_progress_bar_counts_compiled_timed_skipped(logfile):
    out = io.StringIO()
    tk = autotune(space={"cfg": [(2.0, "ok"), (1.0, "ok"), (1.0, "compile_error"), (1.0, "wrong")]},
                  inputs=F.fake_inputs, reference=F.fake_reference, outputs=[1], backend=F.FakeBackend(log=logfile),
                  progress=out)(cfg_builder)
    tk.tune(8)
    text = out.getvalue().replace("\r", "\n")
    assert "compiled 3, timed 2, skipped 2]" in text
    assert "4/4" in text and "autotune cfg_builder n=8" in text
    assert "winner cfg=1.0xok" in text and "skipped (compile-error)" in text and "skipped (wrong)" in text


def test_no_surviving_candidate_is_a_tuning_error_with_reasons(logfile):
    tk = autotune(space={"cfg": [(1.0, "compile_error"), (1.0, "wrong")]}, inputs=F.fake_inputs,
                  reference=F.fake_reference, outputs=[1], backend=F.FakeBackend(log=logfile),
                  progress=False)(cfg_builder)
    with pytest.raises(TuningError, match="compile-error.*ptxas fatal.*\n.*wrong.*relative error"):
        tk.tune(8)
    pruned = autotune(speed=[1.0], prune=lambda p, a: "too big", inputs=F.fake_inputs,
                      reference=F.fake_reference, backend=F.FakeBackend(log=logfile))(F.fake_builder)
    with pytest.raises(TuningError, match="(?s)every candidate was pruned.*too big"):
        pruned.tune(8)


def test_a_failing_reference_is_reported_as_a_setup_error(logfile):
    tk = fake_tuned(logfile, reference=F.failing_reference).with_space(speed=[1.0], mode=["ok"])
    with pytest.raises(TuningError, match="setup.*reference exploded"):
        tk.tune(8)
    assert not TuningTable(tk.name).entries()


def test_tuning_without_reference_or_arguments_is_refused(logfile):
    tk = autotune(speed=[1.0], backend=F.FakeBackend(log=logfile))(F.fake_builder)
    with pytest.raises(ArgumentError, match="reference"):
        tk.tune(8)
    tk = autotune(speed=[1.0], reference=F.fake_reference, backend=F.FakeBackend(log=logfile))(F.fake_builder)
    with pytest.raises(ArgumentError, match="bench_args"):
        tk.tune(8)


def test_real_arguments_are_benchmarked_and_left_untouched(logfile):
    import torch

    tk = fake_tuned(logfile).with_space(speed=[2.0, 1.0], mode=["ok"])
    x = torch.linspace(-1, 1, 8)
    out = torch.full((8,), 7.0)
    result = tk.tune(8, bench_args=(x, out))
    assert result.winner == {"speed": 1.0, "mode": "ok"}
    assert torch.equal(out, torch.full((8,), 7.0))  # outputs were poisoned copies in the benchmark worker


# ------------------------------------------------------------------ the table

def test_table_hit_compiles_nothing_and_loads_only_the_winner(logfile):
    tk = fake_tuned(logfile).with_space(speed=[3.0, 1.0, 2.0], mode=["ok"])
    first = tk.tune(8)
    n_compiles = len(events(logfile, "compile"))
    assert n_compiles == 3 and first.source == "tuned"
    again = tk.tune(8)
    assert again.source == "table" and again.winner == first.winner
    assert len(again.candidates) == 3 and again.time_s == pytest.approx(1e-6)
    loads_before = len(events(logfile, "load"))
    kernel = tk(8)
    assert kernel.speed == 1.0
    assert len(events(logfile, "compile")) == n_compiles
    loads = events(logfile, "load")[loads_before:]
    assert len(loads) == 1 and loads[0][1] == str(os.getpid()) and "1.0" in loads[0][2]
    assert tk(8) is kernel  # memoised in the process


def test_a_second_process_reuses_the_table_without_compiling(tmp_path, logfile):
    cache = str(tmp_path / "cache")
    code = ("import sys; sys.path[:0] = [%r, %r]; import autotune_fakes as F; "
            "F.main_tune_in_subprocess(8, %r, %r)" % (str(TESTS), str(ROOT), cache, logfile))
    first = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      timeout=300).stdout.strip().splitlines()[-1])
    compiles = len(events(logfile, "compile"))
    second = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       timeout=300).stdout.strip().splitlines()[-1])
    assert first["source"] == "tuned" and second["source"] == "table"
    assert first["winner"] == second["winner"] == {"speed": 2.0, "mode": "ok"} and second["kernel_speed"] == 2.0
    assert len(events(logfile, "compile")) == compiles == 3


def test_each_key_part_invalidates(logfile, tmp_path, monkeypatch):
    dep = tmp_path / "dep_mod_for_hash.py"
    dep.write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tk = fake_tuned(logfile, depends=("dep_mod_for_hash",)).with_space(speed=[2.0, 1.0], mode=["ok"])
    tk.tune(8)
    assert tk.lookup(8) is not None and tk.lookup(8).source == "table"
    # key values
    assert tk.lookup(16) is None and tk.lookup(8, scale=3.0) is None
    # every device fingerprint field
    for field in ("gpu", "arch", "driver", "cuda", "tvm", "mmaemit", "torch", "nvcc"):
        fp = tuple((k, v + "-other" if k == field else v) for k, v in F.FINGERPRINT)
        assert tk.with_options(backend=F.FakeBackend(fp=fp, log=logfile)).lookup(8) is None, field
    # the candidate set
    assert tk.with_space(speed=[2.0, 1.0, 0.5], mode=["ok"]).lookup(8) is None
    # the kernel source (a file the builder depends on)
    fp_mod._files_digest.cache_clear()
    assert tk.with_options().lookup(8) is not None
    dep.write_text("X = 2\n")
    fp_mod._files_digest.cache_clear()
    assert tk.with_options().lookup(8) is None
    dep.write_text("X = 1\n")
    fp_mod._files_digest.cache_clear()
    assert tk.with_options().lookup(8) is not None


def test_a_stored_winner_no_longer_in_the_space_is_a_miss(logfile):
    tk = fake_tuned(logfile).with_space(speed=[2.0, 1.0], mode=["ok"])
    result = tk.tune(8)
    table = TuningTable(tk.name)
    entry = table.get(result.entry_key)
    entry["winner"] = {"speed": 9.0, "mode": "ok"}
    table.put(result.entry_key, entry)
    assert tk.lookup(8) is None


def test_corrupt_table_is_a_miss_and_gets_rewritten(logfile):
    tk = fake_tuned(logfile).with_space(speed=[1.0], mode=["ok"])
    table = TuningTable(tk.name)
    table.directory.mkdir(parents=True, exist_ok=True)
    table.path.write_text("{not json")
    assert tk.lookup(8) is None
    assert tk.tune(8).source == "tuned"
    assert tk.lookup(8).source == "table"


def test_autotune_modes(logfile, monkeypatch):
    tk = fake_tuned(logfile, default={"speed": 3.0}).with_space(speed=[2.0, 1.0, 3.0], mode=["ok"])
    monkeypatch.setenv("MMAEMIT_AUTOTUNE", "0")
    off = tk.tune(8)
    assert off.source == "default" and off.winner == {"speed": 3.0, "mode": "ok"}
    assert tk(8).speed == 3.0
    assert not events(logfile, "compile") and not TuningTable(tk.name).entries()
    monkeypatch.setenv("MMAEMIT_AUTOTUNE", "1")
    assert tk.tune(8).source == "tuned" and tk.tune(8).source == "table"
    n = len(events(logfile, "compile"))
    monkeypatch.setenv("MMAEMIT_AUTOTUNE", "force")
    assert tk.tune(8).source == "tuned"
    assert len(events(logfile, "compile")) == 2 * n
    monkeypatch.setenv("MMAEMIT_AUTOTUNE", "sometimes")
    with pytest.raises(ArgumentError, match="MMAEMIT_AUTOTUNE"):
        tk.tune(8)


def test_function_form(logfile):
    result = tune(F.fake_builder, {"speed": [2.0, 0.5], "mode": ["ok"]}, args={"n": 8}, inputs=F.fake_inputs,
                  reference=F.fake_reference, outputs=[1], backend=F.FakeBackend(log=logfile), progress=False)
    assert result.winner == {"speed": 0.5, "mode": "ok"} and result.key == {"n": 8, "scale": 2.0}


# ------------------------------------------------------------------ two processes

_PUT_MANY = """
import sys
sys.path[:0] = [{root!r}]
import os
os.environ["MMAEMIT_CACHE_DIR"] = {cache!r}
from mmaemit.tuning import TuningTable
t = TuningTable("shared")
for i in range(40):
    t.put(f"{tag}-{{i}}", {{"i": i, "pad": "x" * 2000}})
"""


def test_file_lock_keeps_every_write_of_two_concurrent_processes(tmp_path):
    cache = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", _PUT_MANY.format(root=str(ROOT), cache=cache, tag=tag)])
             for tag in ("a", "b")]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    entries = TuningTable("shared", Path(cache) / "autotune").entries()
    assert sorted(entries) == sorted([f"a-{i}" for i in range(40)] + [f"b-{i}" for i in range(40)])


def test_two_processes_tuning_one_key_tune_it_once(tmp_path, logfile):
    cache = str(tmp_path / "cache")
    code = ("import sys; sys.path[:0] = [%r, %r]; import autotune_fakes as F; "
            "F.main_tune_in_subprocess(32, %r, %r)" % (str(TESTS), str(ROOT), cache, logfile))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert sorted(o["source"] for o in outs) == ["table", "tuned"]
    assert outs[0]["winner"] == outs[1]["winner"] == {"speed": 2.0, "mode": "ok"}
    assert len(events(logfile, "compile")) == 3  # one process compiled, the other waited and reused


# ------------------------------------------------------------------ the pool itself

def test_pool_kills_a_hung_task_and_keeps_serving():
    pool = WorkerPool(1, preload=())
    try:
        pool.submit("hang", time.sleep, (60,), timeout=1.0)
        pool.submit("ok", max, (3, 4), timeout=30)
        got = {}
        t0 = time.monotonic()
        while len(got) < 2 and time.monotonic() - t0 < 120:
            for r in wait_any([pool], 5):
                got[r.tag] = r
        assert got["hang"].status == "timeout" and got["ok"].status == "ok" and got["ok"].value == 4
        assert pool.started_workers == 2
    finally:
        pool.shutdown()


def test_pool_reports_exceptions_with_type_and_message():
    pool = WorkerPool(1, preload=())
    try:
        pool.submit("bad", int, ("x",), timeout=30)
        r = []
        while not r:
            r = wait_any([pool], 30)
        assert r[0].status == "error" and r[0].value["type"] == "builtins.ValueError"
        assert "invalid literal" in r[0].value["message"]
    finally:
        pool.shutdown()


def test_the_fastest_candidates_are_timed_twice(logfile):
    tk = fake_tuned(logfile, confirm=2).with_space(speed=[4.0, 1.0, 3.0, 2.0], mode=["ok"])
    result = tk.tune(8)
    twice = {c.params["speed"]: c.info.get("times_s") for c in result.candidates}
    assert twice[1.0] == [1e-6, 1e-6] and twice[2.0] == [2e-6, 2e-6]
    assert twice[3.0] is None and twice[4.0] is None
    assert result.winner["speed"] == 1.0
