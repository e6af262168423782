"""Fill planning (space, fill fraction) and small real fills with both engines on a temporary directory."""

import pytest
import torch

from ckptqual.io.engines import ENGINES
from ckptqual.io.payload import PayloadGenerator, find_mismatches
from ckptqual.plan.footprint import checkpoint_footprint_bytes, checkpoints_for_fraction
from ckptqual.plan.formats import FORMAT_ENGINES
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.workloads import load_workload
from ckptqual.runs.fill import (
    CheckpointRecord,
    FillCampaign,
    FillError,
    PassResult,
)
from ckptqual.runs.pool import RankPool


def small_plan() -> CheckpointPlan:
    """Two ranks: rank 0 one big file and two small ones in a subdirectory, rank 1 one mid-size file."""
    rank0 = RankPlan(
        0,
        (
            FilePlan("optimizer-0.pt", (TensorSpec("state", 3_000_000, "float32"),)),
            FilePlan("layers/layer-0.pt", (TensorSpec("w", 1000, "float16"), TensorSpec("b", 7, "int8"))),
            FilePlan("layers/layer-1.pt", (TensorSpec("w", 1000, "float16"),)),
        ),
    )
    rank1 = RankPlan(1, (FilePlan("optimizer-1.pt", (TensorSpec("state", 1_500_000, "bfloat16"),)),))
    return CheckpointPlan("small", (rank0, rank1))


def test_footprint_covers_payload_and_format_overhead():
    plan = small_plan()
    assert checkpoint_footprint_bytes(plan) > plan.total_bytes


def test_fill_fraction_gives_whole_checkpoints():
    plan = load_workload("llama3.1-405b-review").plan()
    assert checkpoints_for_fraction(plan, 61_440_000_000_000, 0.9) == 33  # the review's D5-P5336 fill
    assert checkpoints_for_fraction(plan, 7_680_000_000_000, 0.66) == 3  # the review's D7-PS1010 fill
    assert checkpoints_for_fraction(plan, 10, 0.5) == 1


def record(seconds: float, nbytes: int, generated: float = 100.0) -> CheckpointRecord:
    return CheckpointRecord(1, 1, 0, seconds, seconds / 2, nbytes, generated, None, 0.0)


def test_pass_reports_both_total_and_mean_rates():
    result = PassResult(1, [record(1.0, 2_000_000_000), record(3.0, 2_000_000_000)])
    assert result.throughput_GBps == pytest.approx(1.0)  # 4 GB in 4 s
    assert result.mean_checkpoint_GBps == pytest.approx((2.0 + 2 / 3) / 2)
    assert (result.seconds_mean, result.seconds_max) == (2.0, 3.0)
    assert result.invalid_reason() is None


def test_pass_is_invalid_when_payload_generation_was_the_bottleneck():
    result = PassResult(1, [record(1.0, 2_000_000_000, generated=3.0)])
    assert "payload generation was the bottleneck" in result.invalid_reason()


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, seed=77, timeout_s=120) as ranks:
        yield ranks


@pytest.mark.parametrize("engine", sorted(set(ENGINES) - set(FORMAT_ENGINES.values())))  # torch.save files
def test_fill_passes_keep_the_retention_limit_and_files_load(checkpoint_space, pool, engine):
    seen = []
    space, root = checkpoint_space(small_plan())
    campaign = FillCampaign(
        root,
        small_plan(),
        pool,
        engine,
        checkpoints_per_pass=2,
        remove=space.remove,
        on_checkpoint=lambda record, total: seen.append((record.pass_number, record.index, total)),
    )
    first = campaign.run_pass(1)
    second = campaign.run_pass(2)
    assert seen == [(1, 1, 2), (1, 2, 2), (2, 1, 2), (2, 2, 2)]
    assert [c.removed_before for c in first.checkpoints] == [None, None]
    assert [c.removed_before for c in second.checkpoints] == [0, 1]
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-00002", "checkpoint-00003"]
    for result in (first, second):
        for checkpoint in result.checkpoints:
            assert checkpoint.bytes == small_plan().total_bytes
            assert checkpoint.seconds >= checkpoint.first_done_s > 0
            assert len(checkpoint.ranks) == 2
    generator = PayloadGenerator(77)
    for rank in small_plan().ranks:
        for file_index, spec in enumerate(rank.files):
            state = torch.load(root / "checkpoint-00003" / spec.path, weights_only=True)
            for tensor_index, tensor in enumerate(spec.tensors):
                data = state[tensor.name].view(torch.uint8).numpy()
                assert find_mismatches(generator, data, 3, rank.rank, file_index, tensor_index, 0) == []


def test_a_failed_pass_stops_later_passes_with_the_reason(checkpoint_space, pool):
    clash = (FilePlan("a", (TensorSpec("t", 1, "int8"),)), FilePlan("a/b.pt", (TensorSpec("t", 1, "int8"),)))
    bad = CheckpointPlan("bad", (RankPlan(0, clash), RankPlan(1, ())))
    space, root = checkpoint_space(bad)
    campaign = FillCampaign(root, bad, pool, "stream", checkpoints_per_pass=1, remove=space.remove)
    with pytest.raises(FillError, match=r"rank 0 failed .*\[Errno 21 EISDIR\]") as failure:
        campaign.run_pass(1)
    assert failure.value.fault == "crash"  # the plan's own error, not the drive's
    with pytest.raises(FillError, match="not run: pass 1 failed"):
        campaign.run_pass(2)
    assert not root.exists() or list(root.iterdir()) == []


@pytest.mark.parametrize("path", ["../escape.pt", "/abs.pt", "a/../../b.pt", ""])
def test_plans_cannot_name_files_outside_the_checkpoint_directory(path):
    with pytest.raises(ValueError, match="must be relative to the checkpoint directory"):
        FilePlan(path, ())


def test_an_early_stop_ends_the_pass_before_its_next_checkpoint_and_keeps_the_retention(checkpoint_space, pool):
    space, root = checkpoint_space(small_plan())
    campaign = FillCampaign(root, small_plan(), pool, "stream", checkpoints_per_pass=4, remove=space.remove)
    asked = []

    def after_two(result: PassResult) -> str | None:
        asked.append(len(result.checkpoints))
        return "enough seen" if len(result.checkpoints) == 2 else None

    first = campaign.run_pass(1)
    second = campaign.run_pass(2, early_stop=after_two)
    assert (len(first.checkpoints), first.ended_early) == (4, None)
    assert asked == [1, 2]  # asked before each checkpoint after the first, never again once it said stop
    assert (len(second.checkpoints), second.planned, second.ended_early) == (2, 4, "enough seen")
    assert second.to_dict()["checkpoints_planned"] == 4 and second.to_dict()["ended_early"] == "enough seen"
    assert [c.removed_before for c in second.checkpoints] == [0, 1]  # the retention limit still holds: 4 kept
    assert sorted(p.name for p in root.iterdir()) == [f"checkpoint-{n:05d}" for n in (2, 3, 4, 5)]


def test_a_pass_records_cpu_seconds_per_gb_per_checkpoint_and_per_pass(checkpoint_space, pool):
    space, root = checkpoint_space(small_plan())
    campaign = FillCampaign(root, small_plan(), pool, "stream", checkpoints_per_pass=2, remove=space.remove)
    result = campaign.run_pass(1)
    for checkpoint in result.checkpoints:
        record = checkpoint.to_dict()
        assert record["cpu_s_per_GB"] == pytest.approx(checkpoint.host.work_cpu_s / (checkpoint.bytes / 1e9))
        assert record["host"]["work_cpu_s"] > 0 and "host_bound" in record
    summary = result.to_dict()
    cpu_s = sum(c.host.work_cpu_s for c in result.checkpoints)
    assert summary["cpu_s_per_GB"] == pytest.approx(cpu_s / (result.bytes / 1e9))
    assert summary["host"]["wall_s"] == pytest.approx(result.seconds)
