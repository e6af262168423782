"""Running the qualification suite in process (pytester) on a replayed run (stand_in/replay.py), as a user runs it
from a checkout: `pytest tests_qual/... --target ... --junitxml ... --results ...`, read back as a CI gate reads it.
For the tests whose point is the plugin's wiring, not the drive's I/O."""

from __future__ import annotations

import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from stand_in.replay import NOT_RECORDED
from suite_runs import REPO, as_a_users_run, load_once

load_once()  # before any run: pytester forgets the modules a run imported, and torch cannot be imported twice

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CUFILE_LOG = "CUFILE_LOGFILE_PATH"
INI = "[pytest]\njunit_family = xunit1\naddopts = -p no:randomly\n"  # pyproject.toml's, for a checkout's tests_qual


@dataclass(frozen=True)
class Replayed:
    """What a replayed run left: its exit code, its output (stdout, stderr) and the folder of its reports."""

    ret: int
    stdout: str
    stderr: str
    out: Path

    @property
    def last(self) -> str:
        """The output's last line (the verdict's, or the refusal's)."""
        return self.stdout.rstrip().splitlines()[-1]


def not_counted(data: dict) -> str:
    """The basis's last phrase of a replayed run whose recording holds no device bytes (stand_in.replay)."""
    last = data["verdict"]["basis"][-1]
    assert last.startswith("device bytes not counted (") and NOT_RECORDED in last, last
    return last


def checkout(pytester: pytest.Pytester) -> Path:
    """pytester's folder as a user's checkout: tests_qual, the ini, an empty target; returns the target."""
    if not (pytester.path / "tests_qual").exists():
        shutil.copytree(REPO / "tests_qual", pytester.path / "tests_qual", ignore=shutil.ignore_patterns("__pycache__"))
        pytester.makeini(INI)
        (pytester.path / "target").mkdir()
    return pytester.path / "target"


def replay_suite(
    pytester: pytest.Pytester,
    *args: str,
    tests: tuple[str, ...] = ("test_fill.py",),
    reports: bool = True,
    target: Path | None = None,
) -> Replayed:
    """`pytest tests_qual/<tests> --target TARGET [--junitxml q.xml --results r.json] ARGS`, in process, with the
    recorded run standing in for the drive (`--replay...` options among ARGS alter it); TARGET: the checkout's empty
    `target` unless given."""
    empty = checkout(pytester)
    target = target or empty
    paths = [f"tests_qual/{name}" for name in tests]
    given = ["--junitxml", "q.xml", "--results", "r.json"] if reports else []
    targets = [] if "--target" in args else ["--target", str(target)]  # several drives name their own
    options = ["-p", "stand_in.replay", "-p", "no:cacheprovider", *targets, *given, *args]
    handlers = {signum: signal.getsignal(signum) for signum in SIGNALS}  # an interrupted run leaves its own in place
    with pytest.MonkeyPatch.context() as patch:
        as_a_users_run(patch)  # pytest-benchmark turns itself off in an xdist worker
        cufile = os.environ.get(CUFILE_LOG)  # the sweep points cuFile's log into the run: as it was, after the run
        if cufile is None:
            patch.delenv(CUFILE_LOG, raising=False)
        else:
            patch.setenv(CUFILE_LOG, cufile)
        try:
            result = pytester.runpytest_inprocess(*paths, *options, no_reraise_ctrlc=True)  # Ctrl-C ends that run alone
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
    return Replayed(int(result.ret), result.stdout.str(), result.stderr.str(), pytester.path)
