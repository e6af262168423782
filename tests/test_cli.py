"""The `ckptqual` command: plan and workloads subcommands, and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ckptqual
from ckptqual.cli import main
from ckptqual.workloads import available_workloads

REVIEW_BYTES = 1_635_776_902_656


def plan_json(capsys, *args: str) -> dict:
    assert main(["plan", "llama3.1-405b-review", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_gives_the_review_totals(capsys):
    plan = plan_json(capsys)
    assert plan["total_bytes"] == REVIEW_BYTES
    assert plan["files"] == 536
    assert len(plan["ranks"]) == 8
    assert sum(r["bytes"] for r in plan["ranks"]) == REVIEW_BYTES


def test_plan_scale_halves_the_bytes(capsys):
    plan = plan_json(capsys, "--scale", "0.5")
    assert plan["scale"] == 0.5
    assert plan["files"] == 536
    assert plan["total_bytes"] == pytest.approx(REVIEW_BYTES / 2, rel=1e-9)


def test_plan_table_says_what_space_is_needed(capsys):
    assert main(["plan", "llama3-1t"]) == 0
    out = capsys.readouterr().out
    assert "16,566,399,503,808 bytes" in out
    assert "16,566.40 GB" in out and "15,428.66 GiB" in out
    assert "2,072 over 1024 ranks" in out
    assert "512-1023" in out  # alike ranks share one row


def test_workloads_lists_every_workload_with_its_size(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    for name in available_workloads():
        assert name in out
    assert "1,635.78" in out


def test_plan_by_path(capsys):
    path = Path(ckptqual.__file__).parents[2] / "fixtures" / "workloads" / "llama3-8b.toml"
    assert main(["plan", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_bytes"] == 112_425_623_552


def test_bad_workload_name_exits_2(capsys):
    assert main(["plan", "llama9"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "'llama9'" in captured.err and "available:" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize("scale", ["0", "-0.5", "1.5", "abc", "nan", "inf"])
def test_bad_scale_exits_2(capsys, scale):
    assert main(["plan", "llama3-8b", f"--scale={scale}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--scale: must be a number in (0, 1]" in err and repr(scale) in err
    assert len(err.splitlines()) == 1


def run_module(*args: str) -> subprocess.CompletedProcess:
    src = str(Path(ckptqual.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "ckptqual.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_module_entry_point():
    good = run_module("plan", "llama3.1-405b-review", "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["total_bytes"] == REVIEW_BYTES
    bad = run_module("plan", "llama9")
    assert bad.returncode == 2
    assert "llama9" in bad.stderr and bad.stdout == ""
