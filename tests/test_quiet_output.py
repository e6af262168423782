"""A passing run of the built-in suite prints its progress lines, the summary and the verdict line, and no more: no
pytest-benchmark table, no plan of the slowest layout, a progress counter that ends at 100 %. `-v` shows the rest."""

from __future__ import annotations

import re

import pytest

from suite_runs import HOST_LIMITED, SMALL_PAIR, run_suite

SMALL_SWEEP = ["--sweep-block-sizes", "1M", "--sweep-threads", "1", "--sweep-file-bytes", "16M"]
SMALL_SWEEP += ["--transfer", "cpu-only"]
ALL = ("test_fill.py", "test_restore.py", "test_read_sweep.py", "test_shard_layouts.py")
_PERCENT = re.compile(r"\[\s*(\d+)%\]")
_BENCHMARK_TABLE = "Name (time in"
_PLAN = '"format": "ckptqual-plan"'


@pytest.fixture(scope="module")
def built_in_run(tmp_path_factory):
    target = tmp_path_factory.mktemp("target")
    result = run_suite(*SMALL_PAIR, *SMALL_SWEEP, "--layout-examples", "2", "--target", str(target), tests=ALL)
    output = result.stdout + result.stderr
    if result.returncode and "INVALID" in output.splitlines()[-1] and any(r in output for r in HOST_LIMITED):
        pytest.skip(f"this host could not keep up: {output.splitlines()[-1][:300]}")
    assert result.returncode == 0, output[-4000:]
    return output


def test_a_passing_run_prints_progress_summary_and_verdict_only(built_in_run):
    lines = built_in_run.rstrip().splitlines()
    assert lines[-1].startswith("ckptqual verdict: QUALIFIED")
    assert any("ckptqual summary" in line for line in lines)
    assert _BENCHMARK_TABLE not in built_in_run and "Legend:" not in built_in_run
    assert _PLAN not in built_in_run and "slowest layout" in built_in_run
    percents = [int(found) for found in _PERCENT.findall(built_in_run)]
    assert percents and max(percents) == 100 and percents[-1] == 100, percents
    before_summary = lines[: next(i for i, line in enumerate(lines) if "ckptqual summary" in line)]
    noise = [line for line in before_summary if line.startswith(("{", " ", "  rank", "-"))]
    assert noise == [], noise[:10]


def test_verbose_shows_the_benchmark_table_and_the_slowest_layouts_plan(tmp_path):
    result = run_suite(*SMALL_PAIR, "-v", "--layout-examples", "2", "--target", str(tmp_path), tests=("test_fill.py",
                       "test_shard_layouts.py"))  # fmt: skip
    output = result.stdout + result.stderr
    assert _BENCHMARK_TABLE in output and _PLAN in output, output[-3000:]
    assert max(int(found) for found in _PERCENT.findall(output)) == 100
