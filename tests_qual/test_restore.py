"""Restore (issue: read checkpoints back cold, as a job restarting from a failure would), every byte verified."""

import pytest

from ckptqual.limits.limits import Outcome
from ckptqual.pytest_plugin.benchmarks import host_bound_rounds

pytestmark = [pytest.mark.qualification, pytest.mark.part("restore")]


def test_restore(qualification, rounds_runner, benchmark, verdict):
    """The newest checkpoints come back from the drive, byte for byte, within the drive's restore limit."""
    newest = qualification.newest_checkpoints(qualification.settings.restore_checkpoints)
    results = []

    def restore_next():
        checkpoint, directory = newest[len(results)]
        results.append(qualification.restore(checkpoint, directory))
        return results[-1]  # the round's figure: its seconds are the benchmark round's

    rounds_runner(restore_next, lambda: None, len(newest))
    total_bytes = sum(r.bytes for r in results)
    throughput = total_bytes / sum(r.seconds for r in results) / 1e9
    benchmark.extra_info.update(
        checkpoints=[r.checkpoint for r in results],
        bytes=total_bytes,
        throughput_GBps=throughput,
        host_bound_rounds=host_bound_rounds(results),
        **qualification.settings.to_dict(),
    )
    for result in results:
        verdict.add(Outcome.INVALID, result.invalid_reason())
    verdict.judge([("restore_throughput", throughput, "GB/s")])
    verdict.conclude()
