"""pytest-benchmark's compare route judges the figure `ckptqual compare` judges and gives the same answer where the
gate resolves it: a fill pass's rounds are its checkpoints' seconds (replayed here from a recorded run by
clock.time_figures, the FigureClock the odd layouts are timed by), so `--benchmark-compare-fail=mean:X%` and
`ckptqual compare --max-regression X%` agree on a regressed, an improved and an identical pair."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckptqual.cli import main
from ckptqual.report.extract import load_run
from replay_runs import replay_suite
from suite_runs import results, user_environment

RECORDED = Path(__file__).parent / "data" / "results" / "loop-ext4-3.json"
ALLOWED = "40%"  # wider than pass 2's detectable change in these runs (about 20 %), so the gate resolves it

REPLAY = """
import json, os

import pytest

from ckptqual.pytest_plugin.clock import FigureClock, time_figures

CLOCK = FigureClock()


@pytest.mark.parametrize("number", [pytest.param(2, marks=pytest.mark.benchmark(timer=CLOCK))])
def test_fill_pass(number, benchmark):
    record = json.loads(open(os.environ["CKPTQUAL_RECORD"]).read())
    seconds = [c["seconds"] for c in record["checkpoints"] if c["pass_number"] == number]
    time_figures(benchmark, CLOCK, seconds)
"""


pytest_plugins = ("pytester",)


def _timed(data: dict, factor: float) -> dict:
    """The record with every checkpoint of pass 2 taking `factor` times as long and as fast accordingly."""
    data = copy.deepcopy(data)
    for checkpoint in data["checkpoints"]:
        if checkpoint["pass_number"] == 2:
            checkpoint["seconds"] *= factor
            checkpoint["GBps"] /= factor
    return data


def _benchmark(directory: Path, record: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "test_replay.py", "-p", "no:cacheprovider",
               f"--benchmark-storage={directory / 'saved'}", *args]  # fmt: skip
    env = user_environment({"CKPTQUAL_RECORD": str(record)})
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A directory holding the replay test and the recorded run's benchmark, saved as 0001 with its rounds."""
    directory = tmp_path_factory.mktemp("route")
    (directory / "test_replay.py").write_text(REPLAY)
    done = _benchmark(directory, RECORDED, "--benchmark-save=base", "--benchmark-save-data")
    assert done.returncode == 0, done.stdout + done.stderr
    return directory


def test_a_fill_pass_benchmarks_rounds_are_its_checkpoints_seconds(saved):
    stored = json.loads(next((saved / "saved").rglob("0001_base.json")).read_text())
    recorded = [c["seconds"] for c in load_run(RECORDED).data["checkpoints"] if c["pass_number"] == 2]
    assert stored["benchmarks"][0]["stats"]["data"] == pytest.approx(recorded)


@pytest.mark.parametrize(
    ("pair", "factor", "answer"), [("regressed", 1.6, 1), ("improved", 0.6, 0), ("identical", 1, 0)]
)
def test_both_routes_give_the_same_answer_on_a_recorded_pair(saved, tmp_path, capsys, pair, factor, answer):
    new = tmp_path / f"{pair}.json"
    new.write_text(json.dumps(_timed(load_run(RECORDED).data, factor)))
    compared = _benchmark(saved, new, "--benchmark-compare=0001", f"--benchmark-compare-fail=mean:{ALLOWED}")
    gate = main(["compare", str(RECORDED), str(new), "--metric", "pass2.seconds", "--require", "pass2.seconds",
                 "--max-regression", ALLOWED])  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert (compared.returncode, gate) == (answer, answer), compared.stdout + "\n".join(out)
    if answer:
        assert "test_fill_pass[2] mean +60.0% > 40%" in compared.stdout
        assert out[-1].startswith("ckptqual compare: REGRESSION: 1 of 1 judged metrics") and "+60.0%" in out[-1]


def test_a_runs_benchmark_rounds_are_the_figures_its_record_holds(pytester, tmp_path):
    """In process, on a replayed run (stand_in/replay.py): each fill pass's rounds are its checkpoints' seconds, the
    restore's its checkpoints', the odd layouts' each judged layout's slowdown against its twin; host-bound rounds are
    named in extra_info."""
    done = replay_suite(
        pytester,
        *("--drive", "local", "--workload", "llama3-8b-dp2", "--scale", "0.0003"),
        *("--checkpoints-per-pass", "2", "--passes", "1", "--layout-examples", "2"),
        *("--benchmark-save=run", "--benchmark-save-data", f"--benchmark-storage={tmp_path / 'saved'}"),
        tests=("test_fill.py", "test_restore.py", "test_shard_layouts.py"),
    )
    record = results(done.out / "r.json")
    assert record["checkpoints"], done.stdout + done.stderr
    saved = json.loads(next((tmp_path / "saved").rglob("0001_run.json")).read_text())
    rounds = {bench["name"]: bench for bench in saved["benchmarks"]}
    fill = rounds["test_fill_pass[1]"]
    assert fill["stats"]["data"] == pytest.approx([c["seconds"] for c in record["checkpoints"]], rel=1e-9)
    bound = [index for index, c in enumerate(record["checkpoints"]) if c["host_bound"]]
    assert fill["extra_info"]["host_bound_rounds"] == bound
    assert rounds["test_restore"]["stats"]["data"] == pytest.approx([r["seconds"] for r in record["restore"]])
    judged = [1 / layout["ratio"] for layout in record["layouts"] if layout["judged"]]
    assert judged and rounds["test_shard_layouts"]["stats"]["data"] == pytest.approx(judged)
