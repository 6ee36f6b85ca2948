"""The README's Hopper quick start is examples/gemm_hopper.py verbatim; it runs on the CPU interpreter against float32
(every TMA load, mbarrier phase and wgmma checked with PTX semantics), its SASS is the warp-specialized TMA + wgmma
pipeline, and on an H100 it runs on the device."""
import pathlib
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gemm_hopper.py"


def test_readme_hopper_quick_start_is_the_example_file():
    code = EXAMPLE.read_text().rstrip("\n")
    assert f"```python\n{code}\n```" in (ROOT / "README.md").read_text()


def test_hopper_example_runs(capsys):
    # no H100 here: the interpreter runs it (poisoned NaN output, checked against float32 inside the example)
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "m64n128k16" in out and "max |error|" in out


def test_hopper_example_sass():
    import mmaemit

    ns = runpy.run_path(str(EXAMPLE), run_name="example")
    k = mmaemit.compile(ns["gemm"], target="sm_90a")
    hist = k.opcode_histogram("sm_90a")
    kt = ns["K"] // ns["BK"]
    assert hist.get("HGMMA.64x128x16.F32", 0) == 4, hist      # one K block = 4 k16 wgmmas (the K loop stays a loop)
    assert hist.get("WARPGROUP.ARRIVE", 0) == 1, hist          # issued back to back: no serialization
    from mmaemit.runtime.sass import wgmma_accumulator_hazards
    assert wgmma_accumulator_hazards(k.sass("sm_90a")) == []
    assert hist.get("UTMALDG.2D", 0) == 2 * kt, hist           # the producer's loop is unrolled: A and B per K block
    assert not any(op.startswith("LDGSTS") for op in hist), hist
    usage = k.resource_usage("sm_90a")
    assert usage.spill_store_bytes == usage.spill_load_bytes == usage.stack_frame_bytes == 0, usage
    log = k.cubin("sm_90a").ptxas_log
    assert "C7514" not in log and "C7508" not in log, log
    assert "USETMAXREG" in k.sass("sm_90a")


@pytest.mark.gpu
def test_hopper_example_on_gpu(capsys):
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert "max |error|" in capsys.readouterr().out
