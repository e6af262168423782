"""Test-only pytest plugin: fills the target's filesystem just before a chosen test runs (a real ENOSPC).

Set CKPTQUAL_BALLAST (a file path outside the target, on the same filesystem), CKPTQUAL_BALLAST_BEFORE (a test
name) and CKPTQUAL_BALLAST_LEAVE_BYTES (free space to leave); load with `-p ballast`. With
CKPTQUAL_BALLAST_AT=setup the filesystem fills before the test's fixtures are set up, not after.
"""

import errno
import os
import shutil

import pytest


def _fill(item: pytest.Item, phase: str) -> None:
    if item.name != os.environ["CKPTQUAL_BALLAST_BEFORE"] or os.environ.get("CKPTQUAL_BALLAST_AT", "call") != phase:
        return
    path = os.environ["CKPTQUAL_BALLAST"]
    leave = int(os.environ["CKPTQUAL_BALLAST_LEAVE_BYTES"])
    free = shutil.disk_usage(os.path.dirname(path)).free
    chunk = b"\xff" * (1 << 20)
    with open(path, "wb", buffering=0) as ballast:
        try:
            for start in range(0, max(0, free - leave), len(chunk)):
                ballast.write(chunk[: free - leave - start])
            os.fsync(ballast.fileno())
        except OSError as error:  # leave 0: the file's own blocks fill the last of it first
            if error.errno != errno.ENOSPC or leave:
                raise


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _fill(item, "setup")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _fill(item, "call")
