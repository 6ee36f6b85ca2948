"""mmaemit bench: the no-GPU message, and the table / CSV / plot code on made-up timings (--dry-run)."""
import pytest

from mmaemit.bench import NO_GPU_MESSAGE, markdown_table, read_csv
from mmaemit.bench.report import DRY_RUN_NOTE, Measurement
from mmaemit.bench.suites import short_config
from mmaemit.cli import main


def _png_size(path):
    from PIL import Image

    with Image.open(path) as im:
        return im.size


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message a CPU-only machine prints")
@pytest.mark.parametrize("suite", ["gemm", "int8", "fp8", "dequant"])
def test_bench_says_it_needs_a_gpu(suite, capsys, tmp_path):
    assert main(["bench", suite, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == NO_GPU_MESSAGE and "--dry-run" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv, n_rows", [
    (["bench", "gemm", "--sizes", "1024", "2048", "--dtypes", "float16", "bfloat16", "--layouts", "NN"], 4 * 3),
    (["bench", "int8", "--size", "4096", "--sweep"], 1 * 4),
    (["bench", "fp8", "--sizes", "2048", "4096", "--configs", "tuned"], 2 * 2),
    (["bench", "dequant", "--shapes", "4096x4096", "--ms", "1", "16", "256", "--dtypes", "float16"], 3 * 5),
    (["bench", "dequant", "--shapes", "4096x4096", "--ms", "1", "256", "--configs", "dynamic", "--all-paths"],
     2 * 2 * (1 + 18 + 3)),                         # 2 dtypes x 2 M x (dynamic + 18 paths + 3 peers)
])
def test_dry_run_writes_table_csv_and_plot(argv, n_rows, tmp_path, capsys):
    assert main(argv + ["--dry-run", "--out", str(tmp_path)]) == 0
    suite = argv[1]
    out = capsys.readouterr().out
    assert "DRY RUN" in out and f"{suite}.png" in out
    md = (tmp_path / f"{suite}.md").read_text()
    assert md.startswith(f"**{DRY_RUN_NOTE}**") and "Versions: torch" in md and "Clocks:" in md
    assert "Command: mmaemit bench " + suite in md
    rows = read_csv(tmp_path / f"{suite}.csv")
    assert len(rows) == n_rows and all(r["dry_run"] == "True" for r in rows)
    assert all(float(r["time_us"]) > 0 and float(r["tflops"]) > 0 for r in rows)
    assert {r["impl"] for r in rows} >= {"mmaemit default"} or "--configs" in argv
    w, h = _png_size(tmp_path / f"{suite}.png")
    assert w > 300 and h > 200


def test_table_relates_each_row_to_the_peer():
    rows = [Measurement("gemm", "p", "s", 1, "mmaemit tuned", "cfg", 200.0, 2e9, "rel 1e-4"),
            Measurement("gemm", "p", "s", 1, "torch.matmul", "", 100.0, 2e9, "peer"),
            Measurement("gemm", "p", "s", 1, "mmaemit default", "cfg0", None, 2e12, "WRONG: relative error 1")]
    text = markdown_table(rows)
    line = next(ln for ln in text.splitlines() if "mmaemit tuned" in ln)
    assert "| 200.0 | 10 | 0.50 |" in line
    wrong = next(ln for ln in text.splitlines() if "mmaemit default" in ln)
    assert "| - | - | - |" in wrong and "WRONG" in wrong


def test_short_config_names_the_changed_fields():
    from mmaemit.kernels.gemm_mma import GemmConfig

    assert short_config(GemmConfig()) == "GemmConfig()"
    assert short_config(GemmConfig(256, 128, 64, stages=4)) == "GemmConfig(block_m=256, block_k=64, stages=4)"
