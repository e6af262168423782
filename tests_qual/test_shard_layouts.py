"""Odd shard layouts (Hypothesis): uneven splits, unaligned sizes, tiny and huge tensors come back intact, fast."""

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from ckptqual.faults import RunError
from ckptqual.limits.limits import MIN_JUDGED_BYTES, Outcome
from ckptqual.plan.planfile import dump_plan
from ckptqual.plan.strategies import describe_plan, note_plan

pytestmark = [pytest.mark.qualification, pytest.mark.part("layouts")]


def test_shard_layouts(qualification, layout_strategy, verdict, say, pytestconfig):
    """Each generated layout reads back byte for byte and keeps its throughput against a regular twin; the first
    is one large enough to judge, so that even one example measures something."""
    run = qualification.settings
    results, failed = [], []
    judgeable = layout_strategy.filter(lambda plan: plan.total_bytes >= MIN_JUDGED_BYTES)

    def write_read_verify(plan):
        results.append((plan, qualification.run_layout(plan, len(results) + len(failed))))

    def generated(data):
        plan = data.draw(layout_strategy if results else judgeable, label="layout")
        if failed:  # the drive (or the run) failed a layout: no more are written, and none is shrunk
            return
        note_plan(plan)  # on a failure of the suite's own, Hypothesis prints the layout and its plan file
        try:
            write_read_verify(plan)
        except RunError as failure:
            failed.append(failure)
            say(f"ckptqual: layout {len(results)} failed: {describe_plan(plan)}; its plan, to replay it with "
                f"--layout-plan FILE:\n{dump_plan(plan)}")  # fmt: skip

    if run.layout_plan is not None:
        write_read_verify(run.layout_plan)
    else:
        hypothesis_settings = settings(
            max_examples=run.layout_examples,
            database=None,
            deadline=None,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
        )
        hypothesis_settings(seed(run.layout_seed)(given(st.data())(generated)))()
    if failed:
        raise failed[0]
    judged = [(plan, result) for plan, result in results if result.judged]
    if not judged:
        raise RunError(f"none of the {len(results)} layouts had 16 MiB or more: nothing to judge", "not-run")
    worst_plan, worst = min(judged, key=lambda pair: pair[1].ratio)
    verdict.judge(
        [("layout_throughput_ratio", worst.ratio, "ratio")],
        example=worst.example,
        examples=len(results),
        seed=run.layout_seed,
    )
    slowest = f"ckptqual: slowest layout {worst.example} (ratio {worst.ratio:.2f})"
    if pytestconfig.get_verbosity() > 0 or verdict.findings.conclusion().outcome is not Outcome.PASS:
        say(
            f"{slowest}: {describe_plan(worst_plan)}\n"
            f"ckptqual: to replay it, save this plan to a file and pass --layout-plan FILE:\n{dump_plan(worst_plan)}"
        )
    else:
        say(f"{slowest}; -v prints its plan, to replay it")
    verdict.conclude()
