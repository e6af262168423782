"""Runs that could never be QUALIFIED on this host are refused before any I/O (exit 4), in one line naming the fix,
and `ckptqual plan` refuses what the run refuses: a required sweep with nothing this host can run, a steady state
required of fewer checkpoints than the SNIA rule looks at, a scale below the workload's minimum; and a refusal's
suggested fix is itself a run that can qualify here."""

from __future__ import annotations

import re

import pytest

from ckptqual.cli import main
from ckptqual.config.run_settings import resolve_settings
from ckptqual.config.space import check_space
from ckptqual.config.values import SettingsError
from ckptqual.host import gpu
from ckptqual.limits.steady import WINDOW
from suite_runs import lenient_drive

pytest_plugins = ("pytester",)


def test_plan_refuses_the_scale_the_run_refuses(capsys):
    assert main(["plan", "llama3-8b", "--scale", "1e-7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--scale 1e-07 (command line)" in err and "use --scale 7e-07 or more" in err
    with pytest.raises(SettingsError, match=r"use --scale 7e-07 or more"):
        resolve_settings({"workload": "llama3-8b", "scale": "1e-7"})
    assert main(["plan", "llama3-8b", "--scale", "7e-7"]) == 0


@pytest.mark.parametrize(
    ("passes", "per_pass", "fix"), [(3, 2, "--checkpoints-per-pass 3"), (2, 4, "--checkpoints-per-pass 5")]
)
def test_a_required_steady_state_needs_the_rules_window_of_checkpoints(tmp_path, passes, per_pass, fix):
    options = {"drive": "d5-p5336", "scale": "0.001", "passes": passes, "checkpoints_per_pass": per_pass}
    with pytest.raises(SettingsError) as refusal:
        resolve_settings(options)
    message = str(refusal.value)
    assert f"needs {WINDOW} steady-state checkpoints" in message and f"writes {(passes - 1) * per_pass}" in message
    assert message.endswith(f"use {fix} or more") and "\n" not in message
    enough = int(fix.split()[-1])
    resolve_settings({**options, "checkpoints_per_pass": enough})  # the fix it names is accepted


def test_the_manuals_check_command_is_accepted():
    resolve_settings({"drive": "d5-p5336", "scale": "0.001", "checkpoints_per_pass": 3})


@pytest.mark.skipif(gpu.probe().problem("gpu-direct") is None, reason="this host can run gpu-direct")
def test_a_required_sweep_with_nothing_this_host_can_run_is_refused_before_any_io(tmp_path, suite_in_process):
    done = suite_in_process(
        "--drive=d5-p5336", "--scale=0.001", f"--target={tmp_path}", tests=("test_fill.py", "test_read_sweep.py")
    )
    assert done.ret == 4, "\n".join([*done.outlines, *done.errlines])
    error = next(line for line in done.errlines if line.startswith("ERROR: "))
    assert "requires the sweep, whose transfers here are gpu-direct, and none can run on this host" in error
    assert error.endswith(
        "or qualify this host's read path with a drive file whose sweep reads without a GPU too (--drive local)"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written to the target


UNREACHABLE = """
[[limit]]
name = "fill_throughput"
min = 5000
unit = "GB/s"
source = "test: beyond any host's ceiling"
"""


def test_too_little_space_suggests_no_fix_where_the_ceiling_refuses_every_run(tmp_path, tmpfs, suite_in_process):
    """Before, the space refusal came first and suggested --checkpoints-per-pass 3 --scale ..., a run the ceiling
    then refused; now the one line is the ceiling's, which no smaller run changes."""
    drive = lenient_drive(tmp_path / "unreachable.toml", "beyond the ceiling", extra_limits=UNREACHABLE)
    small = tmpfs("size=16m")
    done = suite_in_process(f"--drive={drive}", "--workload=llama3-8b", "--scale=0.001", f"--target={small}")
    assert done.ret == 4, "\n".join([*done.outlines[-30:], *done.errlines[-30:]])
    error = next(line for line in done.errlines if line.startswith("ERROR: "))
    assert "min 5000 GB/s is above what this host can measure" in error and "--checkpoints-per-pass" not in error
    assert "qualify fewer drives at once on this host" in error and "--scale" not in error, error
    assert list(small.iterdir()) == []


def test_a_space_fix_for_a_required_steady_state_writes_the_checkpoints_it_needs(tmp_path):
    """Two passes leave one steady pass, which needs all five of the rule's checkpoints. 7 GB hold four of this
    scale's: before, fixes of three or four checkpoints were all refused, so the refusal said only "use a larger
    target"; now it keeps five and shrinks the scale."""
    options = {"drive": "d5-p5336", "scale": "0.001", "passes": "2", "checkpoints_per_pass": "8", "target": tmp_path}
    with pytest.raises(SettingsError) as refusal:
        check_space(resolve_settings(options), {"fill"}, free_bytes=7 * 10**9)
    fix = re.search(r"; use --checkpoints-per-pass (\d+) --scale (\S+) \(then the run needs ", str(refusal.value))
    assert fix and int(fix[1]) == WINDOW, str(refusal.value)
    fixed = resolve_settings({**options, "checkpoints_per_pass": fix[1], "scale": fix[2]})  # its steady state holds
    check_space(fixed, {"fill"}, free_bytes=7 * 10**9)
