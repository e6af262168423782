"""pytest-benchmark's own flow, fitted to qualifying drives: autosaved runs named after the drive and its
firmware, the odd layouts timed as a benchmark of their own, GB/s beside the times of a comparison, and a
regression under --benchmark-compare-fail as one clear failing line (exit code 1), with the rest of the summary."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
from pytest_benchmark.session import PerformanceRegression

from ckptqual.pytest_plugin.clock import CLOCK, FigureClock, figure_clock, time_figures
from ckptqual.pytest_plugin.held import session_of
from ckptqual.pytest_plugin.options import DRIVE

LAYOUTS_FIXTURE = "layout_strategy"
ROUNDS_FIXTURE = "rounds_runner"  # a test whose rounds are a pass's checkpoints or a restore's
# Where each benchmark keeps its rate in extra_info, first match wins, and its unit.
RATES = (("mean_checkpoint_GBps", "GB/s"), ("throughput_GBps", "GB/s"), ("GiBps", "GiB/s"), ("slowest_ratio", "ratio"))
NOW_SOURCES = ("NOW", None, False)  # pytest-benchmark's `source` of this run's rows (NOW only beside a saved run)


def run_name(data: dict[str, Any]) -> str:
    """'d5-p5336-fw5CV10302': the --drive name and the drive's firmware, fit for a file name."""
    drive_file = str(data.get("settings", {}).get("thresholds_file") or "drive")
    drive = data.get("drive", {})
    firmware = drive.get("firmware") or next((d.get("firmware") for d in drive.get("physical", [])), None)
    text = f"{drive_file.rsplit('/', 1)[-1].removesuffix('.toml')}-fw{firmware or 'unknown'}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def _runs_name(records: dict[str | None, dict[str, Any]]) -> str:
    """The run's name: its drive's (run_name), or with several drives each one's after its label, joined."""
    return "-".join((f"{label}." if label else "") + run_name(data) for label, data in records.items())[:120]


def name_autosave(config: pytest.Config, records: dict[str | None, dict[str, Any]]) -> None:
    """Before pytest-benchmark saves: an autosaved run is named after the drive and firmware, then the commit.
    pytest-benchmark has no public way to name the file it saves (it would need a hook such as
    `pytest_benchmark_update_save_name(config, name)`), so this sets its session's `autosave`."""
    benchmarks = getattr(config, "_benchmarksession", None)  # private: see above
    if records and benchmarks is not None and benchmarks.autosave and not benchmarks.save:
        benchmarks.autosave = f"{_runs_name(records)}_{benchmarks.autosave}"


def quiet_table(config: pytest.Config, qualifying: bool) -> None:
    """pytest-benchmark's table is shown for -v or a comparison: a plain qualification ends with the summary and the
    verdict. pytest-benchmark reads --benchmark-quiet once, when it starts, and has no public way to leave its table
    out later (it would need, say, a `pytest_benchmark_show_table(config)` hook), so this sets its session's `quiet`."""
    benchmarks = getattr(config, "_benchmarksession", None)  # private: see above
    asked = config.get_verbosity() > 0 or config.getoption("benchmark_compare", None)
    if benchmarks is not None and qualifying and not asked:
        benchmarks.quiet = True


def pytest_benchmark_update_commit_info(config: pytest.Config, commit_info: dict[str, Any]) -> None:
    records = session_of(config).records()
    if records:
        drives = {
            label: {key: data.get("drive", {}).get(key) for key in ("model", "serial", "firmware")}
            for label, data in records.items()
        }
        commit_info["ckptqual_drive"] = drives.get(None) or drives  # by label where the run has several drives
        commit_info["ckptqual_run"] = _runs_name(records)


def pytest_benchmark_compare_machine_info(config: pytest.Config, compared_benchmark: dict[str, Any]) -> None:
    session_of(config).compared.append(compared_benchmark)


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_group_stats(config: pytest.Config, benchmarks: list[dict[str, Any]], group_by: str):
    """Keeps the rows pytest-benchmark compares: this run's (a compared row carries the current extra_info, not the
    saved) and the saved runs', each with its statistics."""
    session_of(config).benchmark_rows = list(benchmarks)
    return (yield)


def rate(extra_info: dict[str, Any]) -> tuple[str, float, str] | None:
    """A benchmark's rate from its extra_info: (key, value, unit)."""
    for key, unit in RATES:
        if isinstance(extra_info.get(key), int | float):
            return key, float(extra_info[key]), unit
    return None


def _now(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """This run's rows by benchmark fullname."""
    return {row["fullname"]: row for row in rows if row.get("source") in NOW_SOURCES}


def comparison_lines(saved: list[dict[str, Any]], now: dict[str, dict[str, Any]]) -> list[str]:
    """Per saved run, each benchmark's rate then and now, and the change (`now`: this run's extra_info by name)."""
    lines = []
    for run in saved:
        info = run.get("commit_info", {})
        lines.append(
            f"against {info.get('ckptqual_run', 'a saved run')} (commit {str(info.get('id'))[:12]}, "
            f"{run.get('datetime', '?')}):"
        )
        for bench in run.get("benchmarks", []):
            then, current = rate(bench.get("extra_info", {})), rate(now.get(bench["fullname"], {}))
            if then is None or current is None or then[0] != current[0]:
                continue
            change = f"{current[1] / then[1] - 1:+.1%}" if then[1] else "n/a"
            lines.append(
                f"  {bench['name']:<40} {then[1]:>10.4g} -> {current[1]:>10.4g} {then[2]:<6} {change:>8}  ({then[0]})"
            )
    return lines


def write_comparison(terminalreporter: Any, saved: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """The rates of this run's benchmarks against each saved run's, after pytest-benchmark's table."""
    if not saved:
        return
    terminalreporter.section("ckptqual benchmark comparison (rates from extra_info)")
    now = {name: row.get("extra_info", {}) for name, row in _now(rows).items()}
    for line in comparison_lines(saved, now):
        terminalreporter.write_line(line)


def is_regression(error: BaseException) -> bool:
    """Whether `error` is pytest-benchmark's PerformanceRegression, raised from its summary under
    --benchmark-compare-fail."""
    return isinstance(error, PerformanceRegression)


def regressions(config: pytest.Config, rows: list[dict[str, Any]]) -> list[str]:
    """'test_fill_pass[2] mean +62.9% > 5%' for each field of a benchmark beyond its --benchmark-compare-fail check
    against a saved run: the checks as the option parsed them, applied to the rows pytest-benchmark compared."""
    now, found = _now(rows), []
    for saved in (row for row in rows if row.get("source") not in NOW_SOURCES):
        current = now.get(saved["fullname"])
        for check in (config.getoption("benchmark_compare_fail", None) or []) if current is not None else []:
            value = check.compute(current, saved)
            if value > check.threshold:
                unit = "%" if type(check).__name__.startswith("Percentage") else " s"
                name = saved["fullname"].rsplit("::", 1)[-1]
                found.append(f"{name} {check.field} +{value:.1f}{unit} > {check.threshold:g}{unit}")
    return found


def write_regressions(
    terminalreporter: Any, config: pytest.Config, rows: list[dict[str, Any]], error: Exception
) -> None:
    """pytest-benchmark's regression as one failing line, naming each field beyond its check."""
    found = regressions(config, rows)
    terminalreporter.write_line(
        f"ckptqual: FAIL: pytest-benchmark: {len(found)} benchmark(s) regressed beyond --benchmark-compare-fail "
        f"against the saved run: {', '.join(found) or error}",
        red=True,
        bold=True,
    )


def host_bound_rounds(results: list[Any]) -> list[int]:
    """The rounds (0-based, in order) whose figure was host-bound: `ckptqual compare` does not judge them."""
    return [index for index, result in enumerate(results) if result.to_dict().get("host_bound")]


LAYOUT_ROUNDS = "each judged odd layout's slowdown against its regular twin (1 / ratio): lower is better, as a time"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests whose benchmark rounds are figures (the odd layouts, a fill pass's and a restore's rounds) are timed
    by a FigureClock of their own (pytest-benchmark's `benchmark(timer=...)` marker)."""
    for item in items:
        if {LAYOUTS_FIXTURE, ROUNDS_FIXTURE} & set(getattr(item, "fixturenames", ())):
            clock = item.stash[CLOCK] = FigureClock()
            item.add_marker(pytest.mark.benchmark(timer=clock))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Runs the odd layouts test, then gives its benchmark one round per judged layout, its slowdown against its
    regular twin (the same layouts, drawn from the same seed, in both runs), so that pytest-benchmark compares the
    figure `ckptqual compare` judges; the ratios go into extra_info."""
    benchmark: Any = pyfuncitem.funcargs.get("benchmark")
    clock = figure_clock(pyfuncitem)
    if LAYOUTS_FIXTURE not in pyfuncitem.fixturenames or clock is None or benchmark is None or benchmark.disabled:
        return None
    pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in inspect.signature(pyfuncitem.obj).parameters})
    drive = pyfuncitem.stash.get(DRIVE, None)
    record = drive.record if drive is not None else None
    judged = [layout for layout in (record.data.get("layouts", []) if record else []) if layout.get("judged")]
    if judged:
        benchmark.extra_info.update(
            rounds=LAYOUT_ROUNDS,
            slowest_ratio=min(layout["ratio"] for layout in judged),
            ratios=[layout["ratio"] for layout in judged],
            odd_GBps=[layout["odd_GBps"] for layout in judged],
            examples=[layout["example"] for layout in judged],
        )
        time_figures(benchmark, clock, [1 / layout["ratio"] for layout in judged if layout["ratio"] > 0])
    return True
