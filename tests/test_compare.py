"""`ckptqual compare`, the regression gate, on real recorded runs: two back-to-back runs of one drive do not
regress either way; a change beyond both its noise band (from each run's own rounds) and the allowance fails (exit
1) naming the metric, both values and the band; host-bound figures are not judged; bad input is exit 2.

tests/data/results/loop-ext4-1.json and loop-ext4-3.json are the first and third of five back-to-back runs of
`pytest tests_qual --workload llama3-8b --scale 0.001 --sweep-file-bytes 128M --target /mnt/e-a` on one
loop-mounted ext4 on this project's 2-core machine, under the other work of the machine."""

from __future__ import annotations

import copy
import json
import math
import os
import re
from pathlib import Path

import pytest

from ckptqual.cli import main
from ckptqual.report.compare import compare_metric, compare_runs, parse_percentage, run_metrics
from ckptqual.report.extract import Run, load_run
from ckptqual.report.noise import Noise, band, rounds_to_resolve

pytest_plugins = ("pytester",)

RESULTS = Path(__file__).parent / "data" / "results"
FIRST, THIRD = RESULTS / "loop-ext4-1.json", RESULTS / "loop-ext4-3.json"


def _scaled(data: dict, factor: float, passes_from: int = 2) -> dict:
    """The record with every checkpoint of pass `passes_from` and later `factor` times as fast (0.7: 30 % slower)."""
    data = copy.deepcopy(data)
    for checkpoint in data["checkpoints"]:
        if checkpoint["pass_number"] >= passes_from:
            checkpoint["GBps"] *= factor
    return data


def _write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _change(base: Path | Run, new: Run, name: str, allowed: float = 0.05):
    base = base if isinstance(base, Run) else load_run(base)
    return next(c for c in compare_runs(base, new, allowed)[0] if c.name == name)


@pytest.mark.parametrize(("base", "new"), [(FIRST, THIRD), (THIRD, FIRST), (FIRST, FIRST)])
def test_back_to_back_runs_of_one_drive_do_not_regress_and_name_what_they_cannot_resolve(base, new, capsys):
    """Three checkpoints per pass on a busy shared disk resolve no fill figure at 5 %: never green, never a
    regression; each required metric's line names why and the rounds that would resolve it."""
    assert main(["compare", str(base), str(new)]) == 3
    out = capsys.readouterr().out.splitlines()
    assert re.match(r"ckptqual compare: INCONCLUSIVE: \d+ of 13 required metrics not judged or not resolved", out[-1])
    assert not any(line.endswith("REGRESSION") for line in out)
    steady = next(line for line in out if line.startswith("steady INCONCLUSIVE"))
    assert re.search(r"not resolved: detects only ±\d+\.\d%, more than the allowed 5%; fix: \d+ steady-state "
                     r"checkpoints would resolve it \(has 6\): rerun both with --checkpoints-per-pass \d+",
                     steady)  # fmt: skip
    assert "restore INCONCLUSIVE: host-bound" in "\n".join(out)


def test_a_gate_of_resolved_required_metrics_is_green(capsys):
    """Alike sweep cells resolve the sweep to the 5 % floor: exit 0 when the sweep is all the gate must judge."""
    assert main(["compare", str(FIRST), str(FIRST), "--require", "sweep"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("ckptqual compare: no regression: all 1 required metrics judged and resolved")


def test_an_allowance_under_the_noise_floor_resolves_nothing_and_says_so(capsys):
    assert main(["compare", str(FIRST), str(FIRST), "--require", "sweep", "--max-regression", "3%"]) == 3
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("sweep INCONCLUSIVE"))
    assert (
        "detects only ±5.0%, more than the allowed 3%; fix: no number of rounds resolves it: no band is narrower "
        "than 5%, so give --max-regression 5% or more" in line
    )


def test_the_drive_files_required_parts_are_the_gates_default(tmp_path, capsys):
    data = load_run(FIRST).data
    data["settings"]["requires"] = ["sweep"]
    assert main(["compare", str(FIRST), str(_write(tmp_path, "r.json", data))]) == 0
    data["settings"]["requires"] = ["sweep", "restore"]
    assert main(["compare", str(FIRST), str(_write(tmp_path, "r.json", data))]) == 3
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[:-1] if " INCONCLUSIVE: " in line] == ["restore"]
    assert "(part restore, the drive file's [verdict] requires)" in out[-2]


def test_a_run_compared_with_itself_halved_is_never_green(tmp_path, capsys):
    """Every throughput halved and every duration doubled: a regression where the band resolves it, otherwise
    inconclusive, never 0, whatever the gate must judge."""
    halved = _write(tmp_path, "halved.json", _halved(load_run(FIRST).data))
    for metric in ("*", "pass1", "pass2", "steady", "restore", "sweep", "layouts.*"):
        assert main(["compare", str(FIRST), str(halved), "--metric", metric, "--require", metric]) in (1, 3), metric
    assert main(["compare", str(FIRST), str(halved), "--require", "steady"]) == 1
    assert main(["compare", str(FIRST), str(halved), "--metric", "pass1", "--require", "pass1"]) == 3
    out = capsys.readouterr().out.splitlines()
    assert re.match(r"pass1 INCONCLUSIVE: not resolved: detects only ±\d+\.\d%, more than the allowed 5%; fix: "
                    r"\d+ checkpoints per pass would resolve it \(has 3\)", out[-2])  # fmt: skip


def test_the_rounds_named_resolve_the_metric():
    """The number of rounds a line names is the fewest at which a figure of that spread is resolved."""
    spreads, allowed = (0.2, 0.3), 0.1
    needed = rounds_to_resolve(spreads, allowed)
    assert needed is not None and needed > 3

    def width(n: int) -> float:
        noises = [Noise(spread / math.sqrt(n), n - 1) for spread in spreads]
        return band(1.0, *noises)

    assert width(needed) <= allowed < width(needed - 1)
    assert rounds_to_resolve(spreads, 0.04) is None  # under the 5 % floor no number of rounds resolves it


def _halved(data: dict) -> dict:
    """The record with every throughput halved and every duration doubled."""
    data = copy.deepcopy(data)
    for checkpoint in data["checkpoints"]:
        checkpoint["GBps"] /= 2
        checkpoint["seconds"] *= 2
    for key in ("write_GBps", "read_GBps"):
        data["baseline"][key] = [rate / 2 for rate in data["baseline"][key]]
    for result in data["restore"]:
        result["GBps"] /= 2
    for cell in data["sweep"]["cells"]:
        if "GiBps" in cell:
            cell["GiBps"] /= 2
    return data


def test_an_injected_30_percent_drop_exits_1_naming_the_metric_both_values_and_the_band(tmp_path, capsys):
    slower = _write(tmp_path, "slower.json", _scaled(load_run(THIRD).data, 0.7))
    assert main(["compare", str(FIRST), str(slower)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert next(line for line in out if line.split()[0] == "steady").endswith("REGRESSION")
    assert re.search(r"REGRESSION: 1 of \d+ judged metrics .*: steady -27\.8% \(0\.8598 GB/s -> 0\.6208 GB/s, "
                     r"band ±\d+\.\d%\)$", out[-1])  # fmt: skip


def test_the_allowance_and_the_band_must_both_be_exceeded(tmp_path):
    base = load_run(FIRST)
    halved = Run(tmp_path / "n.json", _scaled(base.data, 0.5))
    assert _change(base, halved, "steady").regressed
    assert not _change(base, halved, "steady", allowed=0.6).regressed
    assert _change(base, Run(tmp_path / "n.json", _scaled(base.data, 2.0)), "steady", allowed=0.6).word == "better"
    within = _change(base, Run(tmp_path / "n.json", _scaled(base.data, 0.9)), "pass2")
    assert within.change == pytest.approx(-0.10) and within.band > 0.5 and not within.regressed
    assert within.word == f"not resolved: detects only ±{within.band:.1%}" and not within.resolved
    assert within.needed is not None and within.needed > within.rounds == 3


def test_fewer_rounds_give_a_wider_band():
    metrics = run_metrics(load_run(FIRST).data)
    three, six = (compare_metric(name, metrics, metrics, 0.05) for name in ("pass2", "steady"))
    assert len(metrics["pass2"].rounds) == 3 and len(metrics["steady"].rounds) == 6
    assert three.band > six.band > 0.05


def test_host_bound_figures_are_not_judged_and_the_report_says_why(tmp_path, capsys):
    data = load_run(FIRST).data
    assert all(entry["host_bound"] for entry in data["baseline"]["host"]["read"][1:])  # as the run recorded it
    slower = copy.deepcopy(data)
    slower["baseline"]["read_GBps"] = [rate * 0.1 for rate in slower["baseline"]["read_GBps"]]
    bound = _scaled(data, 0.5)
    for result in bound["passes"]:
        result["host_bound"] = "host-bound: ranks used 2.00 of 2 cores, which were 100% busy"
    assert main(["compare", str(FIRST), str(_write(tmp_path, "a.json", slower))]) == 3
    out = capsys.readouterr().out.splitlines()
    assert next(line for line in out if line.split()[0] == "raw_read").endswith("host-bound: not judged")
    assert next(line for line in out if line.startswith("raw_read INCONCLUSIVE: host-bound"))
    assert main(["compare", str(FIRST), str(_write(tmp_path, "b.json", bound))]) == 3
    out = capsys.readouterr().out.splitlines()
    assert next(line for line in out if line.split()[0] == "steady").endswith("host-bound: not judged")
    assert "steady not judged: new host-bound: ranks used 2.00 of 2 cores, which were 100% busy" in out


def test_a_single_round_borrows_the_spread_of_its_runs_related_rounds():
    metrics = run_metrics(load_run(FIRST).data)
    slowest = metrics["layouts.slowest_ratio"]
    assert len(slowest.rounds) == 1 and slowest.noise_from == "layouts.ratio"
    assert compare_metric("layouts.slowest_ratio", metrics, metrics, 0.05).band > 0.05


def test_sweep_cells_are_compared_in_pairs(tmp_path):
    """Alike cells give a narrow band, so a drop of every cell is a regression of each and of the sweep; the noisy
    cells of two real runs give a wide one."""
    base = load_run(FIRST)
    slower = copy.deepcopy(base.data)
    for cell in slower["sweep"]["cells"]:
        if "GiBps" in cell:
            cell["GiBps"] *= 0.7
    changes = {c.name: c for c in compare_runs(base, Run(tmp_path / "s.json", slower))[0]}
    judged = [c for name, c in changes.items() if name.startswith("sweep") and c.band is not None]
    assert len(judged) >= 4 and all(c.regressed and c.change == pytest.approx(-0.3) for c in judged)
    assert changes["sweep.cpu-only-8K-16"].word == "host-bound: not judged"
    assert _change(FIRST, load_run(THIRD), "sweep").band > 0.3


@pytest.mark.parametrize(
    ("key", "named"),
    [(("checkpoints", 4, "GBps"), "checkpoints[4].GBps: must be a number, got NaN"),
     (("verdict",), "verdict: must be an object, got NaN")],
)  # fmt: skip
def test_a_record_holding_nan_is_a_usage_error_naming_the_key(key, named, tmp_path, capsys):
    data = load_run(FIRST).data
    node = data
    for part in key[:-1]:
        node = node[part]
    node[key[-1]] = math.nan
    bad = _write(tmp_path, "nan.json", data)
    assert main(["compare", str(FIRST), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ckptqual compare: {bad}: ") and named in err and err.count("\n") == 1


def test_metric_selects_by_glob(capsys):
    assert main(["compare", str(FIRST), str(FIRST), "--metric", "pass?", "--metric", "restore"]) == 3
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:7]]
    assert rows == ["pass1", "pass2", "pass3", "restore"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--max-regression", "abc"], "max_regression 'abc': give a percentage from 0 to under 100, e.g. 5%"),
        (["--max-regression", "150%"], "max_regression '150%': give a percentage from 0 to under 100, e.g. 5%"),
        (["--metric", "nosuch*"], "metric pattern 'nosuch*': matches no metric of either run; known: raw_write, "),
        (["--require", "nosuch*"], "metric pattern 'nosuch*': matches no metric of either run; known: raw_write, "),
    ],
)
def test_bad_input_exits_2_with_one_line(args, error, capsys):
    assert main(["compare", str(FIRST), str(FIRST), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ckptqual compare: {error}") and err.count("\n") == 1


def test_a_file_that_is_not_results_exits_2(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["compare", str(FIRST), str(tmp_path / "bad.json")]) == 2
    assert f"{tmp_path / 'bad.json'}: not JSON" in capsys.readouterr().err


def test_parse_percentage():
    assert parse_percentage("5%") == pytest.approx(0.05)
    assert parse_percentage("12.5") == pytest.approx(0.125)


BENCH_TEST = """
import os, time

def test_write(benchmark):
    delay = float(os.environ["CKPTQUAL_TEST_DELAY_S"])
    benchmark.pedantic(time.sleep, args=(delay,), rounds=3, iterations=1)
    benchmark.extra_info["throughput_GBps"] = 0.001 / delay
"""


def test_a_pytest_benchmark_regression_fails_in_one_line_and_keeps_the_summary(pytester, monkeypatch):
    """--benchmark-compare-fail: exit 1, one clear line, no traceback, pytest's counts still printed, and the
    rate of each benchmark then and now. The slowdown is injected (a 50 times longer sleep), not measured. The two
    runs are in this process (pytester), not xdist workers (pytest-benchmark turns itself off in one)."""
    pytester.makepyfile(test_bench=BENCH_TEST)
    storage = f"--benchmark-storage={pytester.path / 'saved'}"
    for name in [name for name in os.environ if name.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)

    def run(delay_s: float, *args: str) -> tuple[int, str, str]:
        monkeypatch.setenv("CKPTQUAL_TEST_DELAY_S", str(delay_s))
        done = pytester.runpytest_inprocess("test_bench.py", "-p", "no:cacheprovider", storage, *args)
        return done.ret, "\n".join(done.outlines), "\n".join(done.errlines)

    saved = run(0.001, "--benchmark-save=drive-fw1")
    assert saved[0] == 0, saved[1] + saved[2]
    code, stdout, stderr = run(0.05, "--benchmark-compare=0001", "--benchmark-compare-fail=mean:5%")
    output = stdout + stderr
    assert code == 1, output
    assert "Traceback" not in output and "PerformanceRegression" not in output
    failing = [line for line in stdout.splitlines() if line.startswith("ckptqual: FAIL: pytest-benchmark")]
    assert len(failing) == 1 and re.search(
        r"1 benchmark\(s\) regressed .*: test_write mean \+\d+\.\d% > 5%$", failing[0]
    )
    assert re.search(r"^\s+test_write\s+1\s+->\s+0.02 GB/s\s+-98.0%", stdout, re.MULTILINE), stdout
    assert re.search(r"=+ 1 passed in ", stdout)
