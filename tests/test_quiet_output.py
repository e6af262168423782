"""A passing run of the built-in suite prints its progress lines, the summary and the verdict line, and no more: no
pytest-benchmark table, no plan of the slowest layout, a progress counter that ends at 100 %. `-v` shows the rest."""

from __future__ import annotations

import re

from replay_runs import replay_suite
from suite_runs import SMALL_PAIR

pytest_plugins = ("pytester",)

SMALL_SWEEP = ["--sweep-block-sizes", "1M", "--sweep-threads", "1", "--sweep-file-bytes", "16M"]
SMALL_SWEEP += ["--transfer", "cpu-only"]
ALL = ("test_fill.py", "test_restore.py", "test_read_sweep.py", "test_shard_layouts.py")
_PERCENT = re.compile(r"\[\s*(\d+)%\]")
_BENCHMARK_TABLE = "Name (time in"
_PLAN = '"format": "ckptqual-plan"'


def test_a_passing_run_prints_progress_summary_and_verdict_only(pytester):
    """In process, on a replayed run of every part (stand_in/replay.py), QUALIFIED however busy this host is."""
    done = replay_suite(pytester, *SMALL_PAIR, *SMALL_SWEEP, "--layout-examples", "2", tests=ALL, reports=False)
    built_in_run = done.stdout + done.stderr
    assert done.ret == 0, built_in_run[-4000:]
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


def test_verbose_shows_the_benchmark_table_and_the_slowest_layouts_plan(pytester):
    tests = ("test_fill.py", "test_shard_layouts.py")
    done = replay_suite(pytester, *SMALL_PAIR, "-v", "--layout-examples", "2", tests=tests, reports=False)
    output = done.stdout + done.stderr
    assert _BENCHMARK_TABLE in output and _PLAN in output, output[-3000:]
    assert max(int(found) for found in _PERCENT.findall(output)) == 100
