"""pytest-xdist's scheduling of a run over several drives: each drive's tests one work unit of one worker. Not a
plugin: drives.py's pytest_xdist_make_scheduler imports it when xdist asks for a scheduler."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

from ckptqual.pytest_plugin.options import drive_of


class DriveScheduling(LoadScopeScheduling):
    """xdist's load-scope scheduling with one scope per drive: all tests of a drive are one work unit, which one
    worker runs in their order, one test at a time, so a drive's tests never overlap (with fewer workers than drives
    a worker takes the next drive near the end of its own, xdist's rule, and qualifies it after)."""

    def _split_scope(self, nodeid: str) -> str:
        """The drive whose label opens the test's id (`nvme1` in `...::test_fill_pass[nvme1-2]`), else the test."""
        label = drive_of(nodeid, self.config)
        return f"drive {label}" if label is not None else nodeid
