"""The tests that drive optional system tools, run with those tools hidden from PATH: each must pass or skip naming
why, never error. Run as a script (`python3 tests/without_tools.py [pytest args]`, what `.ci/without-tools` does);
pytest loads this file as the plugin that selects those tests and checks their skips."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HIDDEN: tuple[str, ...] = ("strace", "smartctl", "nvme", "fio", "chromium", "losetup", "mkfs.ext4", "mke2fs", "mount")
HIDDEN += ("umount", "fsfreeze", "tmux", "cc", "gcc")
TOOL_FIXTURES = {"tmpfs", "loop_ext4", "parallel_run", "browser"}  # fixtures that mount, loop-mount or launch
TOOL_FIXTURES |= {"slow_target", "qualified_run", "throttled_target"}  # the slow stand-in drive (tests/stand_in)
TOOL_TESTS = (  # tests that call a hidden tool themselves
    "tests/test_health.py::",
    "tests/test_trust.py::test_every_directory_a_checkpoint_changes_is_fsynced_by_its_ranks",
    "tests/test_write_path.py::test_a_small_file_is_one_write",
    "tests/test_progress.py::test_on_a_terminal_one_live_line_is_redrawn_in_place",
    "tests/test_cache_served.py::",
    "tests/test_native_reads.py::",  # builds the native psync loop with the C compiler
)
ROOT = Path(__file__).resolve().parents[1]


def path_without_tools(into: Path) -> str:
    """A PATH of one directory holding a link to every command on PATH but the hidden ones."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        for command in sorted(Path(directory).glob("*")) if Path(directory).is_dir() else ():
            link = into / command.name
            if command.name in HIDDEN or link.exists() or command.is_dir() or not os.access(command, os.X_OK):
                continue
            link.symlink_to(command)
    return str(into)


def uses_a_tool(item: pytest.Item) -> bool:
    return bool(TOOL_FIXTURES & set(getattr(item, "fixturenames", ()))) or item.nodeid.startswith(TOOL_TESTS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept = [item for item in items if uses_a_tool(item)]
    config.hook.pytest_deselected(items=[item for item in items if not uses_a_tool(item)])
    items[:] = kept


_UNEXPLAINED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2].removeprefix("Skipped: ").strip()
        if not reason or reason in {"Skipped", "unconditional skip"}:
            _UNEXPLAINED.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _UNEXPLAINED:
        print(f"\nskipped without saying why: {', '.join(_UNEXPLAINED)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif session.testscollected == 0:
        print("\nno test that drives a system tool was collected", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def main(arguments: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="ckptqual-no-tools-") as hidden:
        env = os.environ | {
            "PATH": path_without_tools(Path(hidden)),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])),
        }
        command = [sys.executable, "-m", "pytest", "tests", "-p", "no:cacheprovider", "-p", "without_tools", "-rs"]
        return subprocess.run([*command, *arguments], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
