"""The read sweep (docs/facts.md): gdsio's block size x thread count matrix, cold reads, per transfer.

Runs after the fill passes (this file sorts after test_fill.py), on files of its own inside the run directory.
"""

import pytest

from ckptqual.limits.limits import Outcome

pytestmark = [pytest.mark.qualification, pytest.mark.part("sweep")]


def test_read_sweep(sweep_cell, sweep, sweep_runner, sweep_check, benchmark, verdict):
    """One cell reads its blocks from the drive, not the page cache, at or above the drive's limit for the cell;
    a transfer type this host cannot run is skipped with the reason, and GPU Direct on a GPU host without
    GPUDirect Storage, or a GPU Direct run that fell back to POSIX, fails as INVALID."""
    reason = sweep.cannot_run(sweep_cell)
    if reason:
        pytest.skip(reason)
    invalid = sweep.cannot_measure(sweep_cell)
    if invalid:
        verdict.add(Outcome.INVALID, f"not measured: {invalid}")
        verdict.conclude()  # fails the test: INVALID
        return
    result = sweep.measure(sweep_cell, runner=sweep_runner)
    benchmark.extra_info.update(result.extra_info())
    sweep_check(result)
