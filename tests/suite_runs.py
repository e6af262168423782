"""Running the qualification suite as a user does (pytest tests_qual in a subprocess) and reading what it leaves,
as a CI gate reads it: the exit code, the JUnit XML and the results JSON."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptqual.io.engines import ENGINES

REPO = Path(__file__).resolve().parents[1]
# Few, larger files: at tiny scales the review layout's 536 files make per-file overhead dominate.
SMALL = ["--workload", "llama3-8b", "--scale", "0.0003", "--checkpoints-per-pass", "2", "--passes", "2"]
# The same model on two ranks (2 rank processes to start instead of 8), 11 MB a checkpoint: for runs whose point is
# not the eight ranks' layout.
PAIR = ["--workload", "llama3-8b-dp2", "--scale", "0.0001", "--checkpoints-per-pass", "2", "--passes", "2"]
SMALL_PAIR = ["--workload", "llama3-8b-dp2", *SMALL[2:]]  # SMALL's bytes and checkpoints, on two ranks
BOTH = ("test_fill.py", "test_restore.py")


def user_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without pytest-xdist's worker variables (pytest-benchmark turns itself off under them)."""
    env = {name: value for name, value in os.environ.items() if name not in xdist_variables()}
    return {**env, **(extra or {})}


def xdist_variables() -> list[str]:
    """The names of pytest-xdist's worker variables in this environment."""
    return [name for name in os.environ if name.startswith("PYTEST_XDIST")]


def as_a_users_run(patch: pytest.MonkeyPatch) -> None:
    """Removes pytest-xdist's worker variables for an in-process run, as user_environment does for a subprocess."""
    for name in xdist_variables():
        patch.delenv(name)


def plugin_path(*folders: Path) -> str:
    """A PYTHONPATH that finds plugins in `folders`, then what this one finds (the code under test, where it is given
    on PYTHONPATH)."""
    return os.pathsep.join(filter(None, [*map(str, folders), os.environ.get("PYTHONPATH")]))


def suite_command(*args: str, tests: tuple[str, ...] = ("test_fill.py",)) -> list[str]:
    paths = [str(REPO / "tests_qual" / name) for name in tests]
    return [sys.executable, "-m", "pytest", *paths, "-p", "no:cacheprovider", *args]


def run_suite(*args: str, tests: tuple[str, ...] = ("test_fill.py",), timeout_s: float = 600):
    """Runs the suite to its end; returns the CompletedProcess (output captured)."""
    command = suite_command(*args, tests=tests)
    return subprocess.run(command, cwd=REPO, env=user_environment(), capture_output=True, text=True, timeout=timeout_s)


# What a run of the suite imports that cannot be imported a second time in one process (torch's and KvikIO's compiled
# modules): loaded before a test's pytester is made, as pytester restores sys.modules as it found them.
LOADED_ONCE = (
    *(f"ckptqual.io.engines.{where.partition(':')[0]}" for where in ENGINES.values()),  # made on first use
    "ckptqual.runs.qualification",
    "ckptqual.runs.calibration",
    "ckptqual.plan.strategies",
    "ckptqual.report.figures",
    "ckptqual.report.record",
    "hypothesis",
    "kvikio",
)


def load_once() -> None:
    """Imports LOADED_ONCE (KvikIO where it is installed)."""
    for name in LOADED_ONCE:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def run_suite_in_process(
    pytester: pytest.Pytester, *args: str, tests: tuple[str, ...] = ("test_fill.py",)
) -> pytest.RunResult:
    """The suite's answer to these options in this process (pytester.runpytest_inprocess): the same plugin, test
    files and rootdir as `run_suite`, for a run refused before any I/O. Returns pytest's RunResult (ret, outlines,
    errlines). Call it through the `suite_in_process` fixture, which loads LOADED_ONCE first."""
    paths = [str(REPO / "tests_qual" / name) for name in tests]
    with pytest.MonkeyPatch.context() as patch:
        as_a_users_run(patch)
        return pytester.runpytest_inprocess(*paths, "-p", "no:cacheprovider", *args)


class LiveSuite:
    """The suite running in the background, its output going to a file (a process stuck in the kernel keeps a
    pipe open forever; a file does not hold the test up)."""

    def __init__(
        self, log: Path, *args: str, tests: tuple[str, ...] = ("test_fill.py",), env=None, own_group: bool = False
    ) -> None:
        """`own_group`: in a process group of its own, as a terminal starts it, so that one signal reaches the
        controller and every xdist worker (a terminal's Ctrl-C)."""
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                suite_command(*args, tests=tests),
                cwd=REPO,
                env=user_environment(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=own_group,
            )

    def wait_for(self, text: str, timeout_s: float = 300) -> None:
        """Waits until `text` appears in the output; fails if the run ends or the time passes first."""
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            if self.process.poll() is not None:
                raise AssertionError(f"the run ended before printing {text!r}:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout_s} s:\n{self.output()[-3000:]}")
            time.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def finish(self, timeout_s: float = 300) -> int:
        """The exit code; a run that does not end within the time fails the test (and is killed)."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the run did not end within {timeout_s} s:\n{self.output()[-3000:]}") from None


def parent(pid: int) -> int | None:
    """The parent PID of a process, from /proc; None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def children_of(pid: int) -> set[int]:
    """The live child processes of `pid`."""
    pids = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return {child for child in pids if parent(child) == pid}


def rank_processes(run: int) -> list[int]:
    """The rank processes of the run in process `run`: the children of its multiprocessing fork server."""
    servers = [pid for pid in children_of(run) if b"multiprocessing.forkserver" in _cmdline(pid)]
    return sorted(rank for server in servers for rank in children_of(server))


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return b""


def lenient_drive(path: Path, name: str, extra_limits: str = "", requires: tuple[str, ...] = ("fill",)) -> Path:
    """local.toml with one fill limit no working disk misses (plus `extra_limits`), so that a busy CI machine
    cannot fail the run for speed, and whose verdict requires only `requires` (the fill: the suite's own tests run
    test_fill.py alone unless they need more)."""
    local = (REPO / "thresholds" / "local.toml").read_text()
    header = local[: local.index("[[limit]]")]
    stated = next(line for line in header.splitlines() if line.startswith("requires = "))
    path.write_text(
        header.replace('name = "local disk (no drive-specific thresholds)"', f'name = "{name}"').replace(
            stated, f"requires = {json.dumps(list(requires))}"
        )
        + """
[[limit]]
name = "fill_throughput"
min = 0.001
unit = "ratio"
relative_to = "raw_write"
source = "test: a thousandth of the raw write"
"""
        + extra_limits
    )
    return path


def junit_cases(path: Path) -> dict[str, dict[str, Any]]:
    """Each test case of a JUnit XML by name: its outcome (passed, failure, error, skipped), message, properties."""
    cases: dict[str, dict[str, Any]] = {}
    for case in ElementTree.parse(path).iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome, message = kind, element.get("message", "")
        properties = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        cases[case.get("name", "")] = {"outcome": outcome, "message": message, "properties": properties}
    return cases


def suite_properties(path: Path) -> dict[str, str]:
    """The JUnit XML's suite-level properties."""
    properties = ElementTree.parse(path).find("testsuite/properties")
    if properties is None:
        return {}
    return {p.get("name", ""): p.get("value", "") for p in properties.iter("property")}


def results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


# Outcomes that say this host, not the target, could not keep up (limits/host_bound.py, the payload rule), or that
# other work used the disk under the tests' targets meanwhile (limits/cache_served.py): such a figure is INVALID,
# never PASS or FAIL. Tests whose point is elsewhere accept it where a limit is missed; tests that need a valid run
# run on the slow stand-in drive (stand_in/slow_drive.py), where neither can happen.
HOST_LIMITED = ("host-bound", "payload generation was the bottleneck", "the drive served other I/O")


def missed_limit(outcome: str, message: str = "") -> bool:
    """Whether a test or cell that misses its limit concluded as it must: FAIL, or INVALID because host-limited."""
    return outcome == "FAIL" or (outcome == "INVALID" and any(reason in message for reason in HOST_LIMITED))


@dataclass(frozen=True)
class SharedRun:
    """What one finished run left, for the tests that only read it: its exit code and output, the folder of its
    reports, and the entries left on its target when it ended."""

    returncode: int
    stdout: str
    stderr: str
    out: Path
    left_on_target: tuple[str, ...]


def shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, run: Callable[[Path], SharedRun]) -> SharedRun:
    """`run(folder)` once for the whole test session, also across pytest-xdist's workers: the first to ask runs it
    under a file lock in the session's temporary directory, the others read what it recorded."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the controller's: one per session, shared by its workers
    shared = base / "shared-runs"
    shared.mkdir(exist_ok=True)
    recorded = shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not recorded.exists():  # a run that failed or skipped left none: the next test to ask tries again
            done = run(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared)))
            fields = {**done.__dict__, "out": str(done.out), "left_on_target": list(done.left_on_target)}
            recorded.write_text(json.dumps(fields))
    fields = json.loads(recorded.read_text())
    return SharedRun(**{**fields, "out": Path(fields["out"]), "left_on_target": tuple(fields["left_on_target"])})
