"""The README's quick start is the file examples/quickstart.py, verbatim, and it builds."""
import pathlib
import runpy

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_quickstart_is_the_example_file():
    readme = (ROOT / "README.md").read_text()
    code = (ROOT / "examples" / "quickstart.py").read_text().rstrip("\n")
    assert f"```python\n{code}\n```" in readme


def test_readme_has_the_two_fresh_machine_commands():
    readme = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 && pip install . && mmaemit demo" in readme
    test_cmd = 'pip install torch==2.13.0 && pip install ".[test]" && python3 -m pytest -q'
    assert test_cmd in readme
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_quickstart_runs(capsys):
    # without a GPU it compiles for sm_80 and prints the instruction mix; with one it runs and prints the error
    runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "HMMA" in out or "max |err|" in out


def test_readme_autotune_example_is_the_example_file():
    readme = (ROOT / "README.md").read_text()
    code = (ROOT / "examples" / "autotune_gemm.py").read_text().rstrip("\n")
    assert f"```python\n{code}\n```" in readme


def test_autotune_example_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "autotune_gemm.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "stages" in out
