"""ckptqual's own hooks, for another plugin or a conftest.py that acts on a qualification (pytest_addhooks adds
them: pytest_plugin/session.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ckptqual.limits.verdict import RunVerdict


@pytest.hookspec
def pytest_ckptqual_verdict(session: pytest.Session, verdict: RunVerdict) -> None:
    """The run's verdict (`verdict.overall`: QUALIFIED, FAILED, ...; `.reasons`, `.basis`, `.line()`), once each
    drive's verdict is saved in its record and before the JUnit XML, pytest-benchmark's run and the report are
    written. Called once per run, in the process that reports it (the xdist controller, not a worker)."""
