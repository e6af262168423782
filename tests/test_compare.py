"""`ckptqual compare`, the regression gate: a change beyond both its noise band (from the rounds of each run) and
the allowed percentage fails (exit 1); a change inside the band does not (exit 0); bad input is exit 2."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptqual.cli import main
from ckptqual.report.compare import compare_metric, compare_runs, parse_percentage, run_metrics
from ckptqual.report.extract import Run, load_run
from suite_runs import user_environment

RESULTS = Path(__file__).parent / "data" / "results"
A = RESULTS / "drive-a.json"


def _slowed(data: dict, pass_number: int, factor: float) -> dict:
    """The record with every checkpoint of one pass `factor` times as fast (0.5: half the rate)."""
    data = copy.deepcopy(data)
    for checkpoint in data["checkpoints"]:
        if checkpoint["pass_number"] == pass_number:
            checkpoint["GBps"] *= factor
    return data


def _write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_the_same_run_does_not_regress(capsys):
    assert main(["compare", str(A), str(A)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("ckptqual compare: no regression beyond its noise band and 5% in ")
    assert not any("REGRESSION" in line for line in out)


def test_an_injected_regression_is_found_and_exits_1(tmp_path, capsys):
    base = load_run(A)
    new = _write(tmp_path, "new.json", _slowed(base.data, 3, 0.5))
    assert main(["compare", str(A), str(new)]) == 1
    out = capsys.readouterr().out.splitlines()
    row = next(line for line in out if line.split()[0] == "pass3")
    assert "-50.0%" in row and row.endswith("REGRESSION")
    assert out[-1].startswith("ckptqual compare: REGRESSION: ") and "pass3 -50.0%" in out[-1]
    assert next(line for line in out if line.split()[0] == "pass1").endswith("within noise")


def test_a_change_inside_the_noise_band_is_ignored(tmp_path, capsys):
    base = load_run(A)
    metrics = run_metrics(base.data)
    change = compare_metric("pass2", metrics, metrics, 0.05)
    assert change.band > 0.12, "the fixture's pass 2 should vary by more than the change injected below"
    slower = Run(tmp_path / "new.json", _slowed(base.data, 2, 0.9))  # 10 % slower: beyond 5 %, inside the band
    changes, _ = compare_runs(base, slower, 0.05)
    pass2 = next(c for c in changes if c.name == "pass2")
    assert pass2.change == pytest.approx(-0.10) and pass2.word == "within noise" and not pass2.regressed
    assert main(["compare", str(A), str(_write(tmp_path, "new.json", slower.data))]) == 0


def test_the_allowance_and_the_band_must_both_be_exceeded(tmp_path):
    base = load_run(A)
    halved = Run(tmp_path / "n.json", _slowed(base.data, 3, 0.5))
    assert next(c for c in compare_runs(base, halved, 0.05)[0] if c.name == "pass3").regressed
    assert not next(c for c in compare_runs(base, halved, 0.6)[0] if c.name == "pass3").regressed
    faster = Run(tmp_path / "n.json", _slowed(base.data, 3, 2.0))
    assert next(c for c in compare_runs(base, faster, 0.05)[0] if c.name == "pass3").word == "better"


def test_a_single_round_takes_its_band_from_the_raw_baseline_rounds():
    metrics = run_metrics(load_run(A).data)
    cell = next(name for name in metrics if name.startswith("sweep."))
    assert len(metrics[cell].rounds) == 1 and metrics[cell].noise_from == "raw_read"
    assert compare_metric(cell, metrics, metrics, 0.05).band > 0


def test_metric_selects_by_glob(capsys):
    assert main(["compare", str(A), str(A), "--metric", "pass*", "--metric", "restore"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:-2]]
    assert rows == ["pass1", "pass2", "pass3", "restore"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--max-regression", "abc"], "--max-regression 'abc': give a percentage from 0 to under 100, e.g. 5%"),
        (["--max-regression", "150%"], "--max-regression '150%': give a percentage from 0 to under 100, e.g. 5%"),
        (["--metric", "nosuch*"], "--metric 'nosuch*': matches no metric of either run; known: raw_write, "),
    ],
)
def test_bad_input_exits_2_with_one_line(args, error, capsys):
    assert main(["compare", str(A), str(A), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ckptqual compare: {error}") and err.count("\n") == 1


def test_a_file_that_is_not_results_exits_2(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["compare", str(A), str(tmp_path / "bad.json")]) == 2
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


def test_a_pytest_benchmark_regression_fails_in_one_line_and_keeps_the_summary(tmp_path):
    """--benchmark-compare-fail: exit 1, one clear line, no traceback, pytest's counts still printed, and the
    rate of each benchmark then and now. The slowdown is injected (a 50 times longer sleep), not measured."""
    (tmp_path / "test_bench.py").write_text(BENCH_TEST)
    storage = f"--benchmark-storage={tmp_path / 'saved'}"

    def run(delay_s: float, *args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pytest", "test_bench.py", "-p", "no:cacheprovider", storage, *args]
        env = {**user_environment(), "CKPTQUAL_TEST_DELAY_S": str(delay_s)}
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    saved = run(0.001, "--benchmark-save=drive-fw1")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    slower = run(0.05, "--benchmark-compare=0001", "--benchmark-compare-fail=mean:5%")
    output = slower.stdout + slower.stderr
    assert slower.returncode == 1, output
    assert "Traceback" not in output and "PerformanceRegression" not in output
    failing = [line for line in slower.stdout.splitlines() if line.startswith("ckptqual: FAIL: pytest-benchmark")]
    assert len(failing) == 1 and re.search(
        r"1 benchmark\(s\) regressed .*: test_write mean \+\d+\.\d% > 5%$", failing[0]
    )
    assert re.search(r"^\s+test_write\s+1\s+->\s+0.02 GB/s\s+-98.0%", slower.stdout, re.MULTILINE), slower.stdout
    assert re.search(r"=+ 1 passed in ", slower.stdout)
