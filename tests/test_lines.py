"""The lines a person reads: a sweep cell no limit judges reads MEASURED with its figure (JUnit line, record, HTML
tests table); an interrupted run's verdict gives one line per cause with its count, and a cell that would have been
skipped on this host is skipped, not an error, because the run was interrupted."""

from __future__ import annotations

import signal

import pytest

from ckptqual.host import gpu
from ckptqual.limits.verdict import overall_verdict
from ckptqual.report.extract import load_run
from ckptqual.report.html import write_report
from suite_runs import SMALL_PAIR, LiveSuite, junit_cases, results, run_suite

SWEEP = ["--transfer", "cpu-only", "--sweep-block-sizes", "8K,1M", "--sweep-threads", "1", "--sweep-file-bytes", "16M"]


def test_a_sweep_cell_without_a_limit_reads_measured_with_its_figure(tmp_path):
    """local.toml limits only the 1M cpu-only cells: the 8K cell is measured, not judged, and says so everywhere."""
    target = tmp_path / "target"
    target.mkdir()
    reports = ["--junitxml", str(tmp_path / "q.xml"), "--results", str(tmp_path / "r.json")]
    run_suite("--drive", "local", "--target", str(target), *SMALL_PAIR, *SWEEP, *reports, tests=("test_read_sweep.py",))
    cases = junit_cases(tmp_path / "q.xml")
    unlimited, limited = cases["test_read_sweep[cpu-only-8K-1]"], cases["test_read_sweep[cpu-only-1M-1]"]
    line = unlimited["properties"]["ckptqual.line"]
    figure = float(unlimited["properties"]["sweep_read_bandwidth"])
    assert line == (
        f"sweep cpu-only-8K-1 MEASURED: sweep_read_bandwidth {figure:.4g} GiB/s (no limit; transfer=cpu-only, "
        "block_size=8K, threads=1)"
    )
    assert unlimited["outcome"] == "passed" and unlimited["properties"]["ckptqual.outcome"] == "MEASURED"
    assert limited["properties"]["ckptqual.line"].startswith("sweep cpu-only-1M-1 ")
    assert "MEASURED" not in limited["properties"]["ckptqual.line"]  # judged against its limit
    data = results(tmp_path / "r.json")
    test = next(test for test in data["tests"].values() if test["subject"] == "sweep cpu-only-8K-1")
    assert test["outcome"] == "MEASURED" and test["message"] == line
    page = write_report([load_run(tmp_path / "r.json")], tmp_path / "html").read_text()
    assert (
        '<tr><td>sweep cpu-only-8K-1</td><td><span class="outcome MEASURED">MEASURED</span></td>'
        f"<td>{line}</td></tr>" in page
    )


def _test(subject: str, outcome: str, cause: str) -> dict[str, str]:
    return {"subject": subject, "outcome": outcome, "message": f"{subject} {outcome}: {cause}"}


def test_tests_of_one_cause_give_one_reason_with_their_count():
    cause = "not run: the run was interrupted by SIGINT (Ctrl-C) during x"
    tests = {f"n{i}": _test(f"sweep cpu-only-{i}", "NOT_RUN", cause) for i in range(30)}
    tests["other"] = _test("restore", "NOT_RUN", "not run: pass 1 failed")
    verdict = overall_verdict(tests, interruption="the run was interrupted by SIGINT (Ctrl-C) during x")
    assert verdict.reasons == (
        "the run was interrupted by SIGINT (Ctrl-C) during x",
        f"30 tests NOT_RUN (sweep cpu-only-0 and 29 more): {cause}",
        "restore NOT_RUN: not run: pass 1 failed",
    )


@pytest.mark.skipif(gpu.probe().problem("gpu-direct") is None, reason="this host can run gpu-direct cells")
def test_an_interrupted_run_names_each_cause_once_and_skips_the_cells_this_host_cannot_run(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    reports = ["--junitxml", str(tmp_path / "q.xml"), "--results", str(tmp_path / "r.json")]
    many = ["--checkpoints-per-pass", "20", "--passes", "2", "--transfer", "gpu-direct,cpu-only"]
    suite = LiveSuite(
        tmp_path / "log",
        "--drive",
        "local",
        "--target",
        str(target),
        "--workload",
        "llama3-8b-dp2",
        "--scale",
        "0.0003",
        *SWEEP[2:],
        *many,
        *reports,
        tests=("test_fill.py", "test_read_sweep.py"),
    )
    suite.wait_for("ckptqual: pass 1 checkpoint 2/20")
    suite.process.send_signal(signal.SIGINT)
    assert suite.finish() == pytest.ExitCode.INTERRUPTED, suite.output()[-3000:]
    cases = junit_cases(tmp_path / "q.xml")
    gpu_cells = [case for name, case in cases.items() if "[gpu-direct-" in name]
    cpu_cells = [case for name, case in cases.items() if "[cpu-only-" in name]
    assert len(gpu_cells) == len(cpu_cells) == 2
    assert all(case["outcome"] == "skipped" and "needs a GPU" in case["message"] for case in gpu_cells)
    assert all(case["outcome"] == "error" and "NOT_RUN: not run: the run was interrupted" in case["message"]
               for case in cpu_cells)  # fmt: skip
    reasons = results(tmp_path / "r.json")["verdict"]["reasons"]
    assert reasons[0].startswith("the run was interrupted by SIGINT (Ctrl-C) during ")
    not_run = [reason for reason in reasons if "NOT_RUN" in reason]
    assert len(not_run) == 1 and not_run[0].startswith("3 tests NOT_RUN (pass 2, sweep cpu-only-8K-1, sweep ")
    assert sum("the run was interrupted" in reason for reason in reasons) == 3  # cause, test it stopped, the rest
    assert not any("gpu-direct" in reason and ("NOT_RUN" in reason or "ERROR" in reason) for reason in reasons)
