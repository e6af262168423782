"""The lines a person reads: a sweep cell no limit judges reads MEASURED with its figure (JUnit line, record, HTML
tests table); an interrupted run's verdict gives one line per cause with its count, and a cell that would have been
skipped on this host is skipped, not an error, because the run was interrupted."""

from __future__ import annotations

import pytest

from ckptqual.host import gpu
from ckptqual.limits.verdict import overall_verdict
from ckptqual.report.extract import load_run
from ckptqual.report.html import write_report
from replay_runs import replay_suite
from suite_runs import SMALL_PAIR, junit_cases, results

pytest_plugins = ("pytester",)

SWEEP = ["--transfer", "cpu-only", "--sweep-block-sizes", "8K,1M", "--sweep-threads", "1", "--sweep-file-bytes", "16M"]


def test_a_sweep_cell_without_a_limit_reads_measured_with_its_figure(pytester, tmp_path):
    """local.toml limits only the 1M cpu-only cells: the 8K cell is measured, not judged, and says so everywhere. In
    process, on a replayed run (stand_in/replay.py)."""
    done = replay_suite(pytester, "--drive", "local", *SMALL_PAIR, *SWEEP, tests=("test_read_sweep.py",))
    tmp_path = done.out
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
def test_an_interrupted_run_names_each_cause_once_and_skips_the_cells_this_host_cannot_run(pytester):
    """In process, on a replayed run (stand_in/replay.py) that Ctrl-C (SIGINT) stops in pass 1's second checkpoint."""
    many = ["--checkpoints-per-pass", "20", "--passes", "2", "--transfer", "gpu-direct,cpu-only"]
    args = ["--drive", "local", "--workload", "llama3-8b-dp2", "--scale", "0.0003", *SWEEP[2:], *many]
    done = replay_suite(pytester, *args, "--replay-interrupt", "pass 1", tests=("test_fill.py", "test_read_sweep.py"))
    assert done.ret == pytest.ExitCode.INTERRUPTED, done.stdout[-3000:]
    tmp_path = done.out
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
