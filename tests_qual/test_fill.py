"""Checkpoint fill passes (REFERENCE section 1): the drive holds checkpoint after checkpoint, pass after pass."""

import pytest

from ckptqual.qualification import fill_measurements

pytestmark = pytest.mark.qualification


def test_fill_pass(fill_pass, qualification, rounds_runner, benchmark, check):
    """Pass N writes its checkpoints with all ranks at once, within the drive's limits for that pass."""
    result = qualification.run_pass(fill_pass, runner=rounds_runner)
    benchmark.extra_info.update(
        pass_number=fill_pass,
        checkpoint_bytes=qualification.settings.plan.total_bytes,
        throughput_GBps=result.throughput_GBps,
        mean_checkpoint_GBps=result.mean_checkpoint_GBps,
        checkpoint_seconds=[c.seconds for c in result.checkpoints],
        **qualification.settings.to_dict(),
    )
    invalid = result.invalid_reason()
    if invalid:
        pytest.fail(f"pass {fill_pass} invalid: {invalid}", pytrace=False)
    check(fill_measurements(result), **{"pass": fill_pass, "state": "fresh" if fill_pass == 1 else "steady"})
