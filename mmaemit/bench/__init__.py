"""Benchmarks as a library: ``mmaemit bench gemm|int8|fp8|dequant`` (:mod:`.run`), their problems and measurements
(:mod:`.suites`), and the report: Markdown table, CSV, PNG plot, environment header (:mod:`.report`)."""
from .report import Measurement, environment, markdown_table, plot, read_csv, write_csv, write_report
from .run import NO_GPU_MESSAGE, run_bench
from .suites import SUITES, Problem, fake_measurements, measure, problems, short_config

__all__ = ["run_bench", "NO_GPU_MESSAGE", "SUITES", "Problem", "problems", "measure", "fake_measurements",
           "short_config", "Measurement", "environment", "markdown_table", "plot", "read_csv", "write_csv",
           "write_report"]
