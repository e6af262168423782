"""Checkpoint fill passes (docs/facts.md): the drive holds checkpoint after checkpoint, pass after pass."""

import pytest

from ckptqual.limits.limits import Outcome
from ckptqual.pytest_plugin.benchmarks import host_bound_rounds
from ckptqual.runs.qualification import fill_measurements

pytestmark = [pytest.mark.qualification, pytest.mark.part("fill")]


def test_fill_pass(fill_pass, qualification, rounds_runner, benchmark, verdict, record_property):
    """Pass N writes its checkpoints with all ranks at once, within the drive's limits for that pass; the last
    pass reaches the SNIA steady state where the drive file requires it."""
    result = qualification.run_pass(fill_pass, runner=rounds_runner)
    benchmark.extra_info.update(
        pass_number=fill_pass,
        checkpoint_bytes=qualification.settings.plan.total_bytes,
        throughput_GBps=result.throughput_GBps,
        mean_checkpoint_GBps=result.mean_checkpoint_GBps,
        checkpoint_seconds=[c.seconds for c in result.checkpoints],
        host_bound=result.host_bound_reason(),
        host_bound_rounds=host_bound_rounds(result.checkpoints),
        **qualification.settings.to_dict(),
    )
    verdict.add(Outcome.INVALID, result.invalid_reason())
    verdict.judge(fill_measurements(result), **{"pass": fill_pass, "state": "fresh" if fill_pass == 1 else "steady"})
    steady = qualification.steady_state(fill_pass) if fill_pass >= 2 else None
    if steady is not None:
        record_property("fill_steady_state", "STEADY" if steady.reached else "NOT_STEADY")
        record_property("fill_steady_state.reason", steady.reason)
    last = fill_pass == qualification.settings.passes
    if last and qualification.settings.require_steady_state and not (steady and steady.reached):
        reason = steady.reason if steady else "a single pass has no steady-state rounds; run --passes 2 or more"
        verdict.add(Outcome.NOT_STEADY, f"SNIA steady state, required by the drive file: {reason}")
    verdict.conclude()
