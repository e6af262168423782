"""Once a layout fails (the drive failed, or the run directory was tampered with), the odd layouts stop at once:
no more are written, none is shrunk, and the summary counts only the layouts written and verified."""

from __future__ import annotations

import os

from suite_runs import REPO, LiveSuite, junit_cases, results

TINY = ["--workload", "llama3-8b", "--scale", "0.0002", "--layout-examples", "5", "--layout-max-bytes", "32M"]


def test_the_odd_layouts_stop_at_the_first_failure_and_count_only_what_was_written(tmp_path):
    target, outside = tmp_path / "target", tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "tests" / "fault_plugins"), os.environ.get("PYTHONPATH")])
        ),
        "CKPTQUAL_PLANT": "layouts",
        "CKPTQUAL_PLANT_BEFORE": "test_shard_layouts",
        "CKPTQUAL_PLANT_OUTSIDE": str(outside),
    }
    xml, json_path = tmp_path / "q.xml", tmp_path / "r.json"
    args = ["-p", "plant", *TINY, "--target", str(target), "--junitxml", str(xml), "--results", str(json_path)]
    suite = LiveSuite(tmp_path / "log", *args, tests=("test_shard_layouts.py",), env=env)
    code, output = suite.finish(timeout_s=600), suite.output()
    assert code == 1 and "Traceback" not in output, output[-3000:]
    record = results(json_path)
    assert len(record.get("layouts", [])) <= 1, record["layouts"]  # one tried, none shrunk or tried after it
    assert output.count("ckptqual: layout 0 failed: ") == 1 and "ckptqual: layout 1 failed" not in output
    assert "odd shard layouts: 0 written and verified" in output, output[-3000:]
    assert junit_cases(xml)["test_shard_layouts"]["outcome"] in ("failure", "error")
    assert list(outside.iterdir()) == []
