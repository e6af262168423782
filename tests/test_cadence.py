"""A training cadence on real filesystems: compute intervals kept between checkpoints, asynchronous saves whose waits
follow the drive's rate, and a checkpoint's phases adding up to its time."""

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from ckptqual.config.run_settings import resolve_settings
from ckptqual.plan.footprint import checkpoint_footprint_bytes
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.report.extract import load_run
from ckptqual.report.figures import draw_all
from ckptqual.report.progress import LiveLine, PassProgress
from ckptqual.runs.cadence import Cadence
from ckptqual.runs.early_stop import completed_at
from ckptqual.runs.fill import CheckpointRecord, FillCampaign, PassResult
from ckptqual.runs.pool import RankPool
from stand_in import slow_drive

GB = 1_000_000_000


def plan_of(rank_bytes: int, files: int = 2) -> CheckpointPlan:
    """Two ranks, each `files` files of one float32 tensor, `rank_bytes` bytes per rank in all."""
    numel = rank_bytes // files // 4
    ranks = tuple(
        RankPlan(
            rank, tuple(FilePlan(f"rank{rank}/part-{i}.pt", (TensorSpec("t", numel, "float32"),)) for i in range(files))
        )
        for rank in range(2)
    )
    return CheckpointPlan("cadence", ranks)


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, seed=5, timeout_s=120) as ranks:
        yield ranks


def test_a_cadence_keeps_its_intervals_and_counts_the_stall(checkpoint_space, pool):
    plan = plan_of(4_000_000)
    space, root = checkpoint_space(plan)
    interval = 0.3
    campaign = FillCampaign(root, plan, pool, "stream", 2, remove=space.remove, cadence=Cadence(interval))
    first, second = campaign.run_pass(1), campaign.run_pass(2)
    records = [*first.checkpoints, *second.checkpoints]
    assert records[0].interval_s is None  # nothing was computed before the first
    assert all(r.interval_s is not None and r.interval_s >= interval for r in records[1:])
    for record in records:  # synchronous: training waits for the whole save, which is durable when it goes on
        assert record.stall_s == record.seconds_to_durable >= record.seconds > 0
        assert record.wait_s == record.stage_s == 0.0
    stall = sum(r.stall_s for r in second.checkpoints)
    kept = sum(r.interval_s for r in second.checkpoints)
    assert second.stall_fraction == pytest.approx(stall / (stall + kept))
    assert 0 < second.stall_fraction < 1
    assert second.min_sustained_interval_s == max(r.seconds_to_durable + r.remove_s for r in second.checkpoints)


def test_back_to_back_loses_all_training_time(checkpoint_space, pool):
    plan = plan_of(1_000_000)
    space, root = checkpoint_space(plan)
    result = FillCampaign(root, plan, pool, "stream", 2, remove=space.remove).run_pass(1)
    assert result.stall_fraction == 1.0


def test_a_checkpoints_phases_add_up_to_its_time(checkpoint_space, pool):
    plan = plan_of(8_000_000, files=4)
    space, root = checkpoint_space(plan)
    record = FillCampaign(root, plan, pool, "stream", 1, remove=space.remove).run_pass(1).checkpoints[0]
    for rank in record.ranks:
        phases = rank["phases"]
        assert {"write", "fsync", "commit"} <= set(phases), phases
        assert all(seconds > 0 for seconds in phases.values()), phases
        # the phases tile the rank's timed region; only reading the clocks at its two ends lies outside them
        assert sum(phases.values()) == pytest.approx(rank["own_s"], rel=0.02, abs=0.02)
    for name in ("write", "fsync", "commit"):
        spread = record.phases[name]
        values = sorted(rank["phases"][name] for rank in record.ranks)
        assert spread["max"] == values[-1] and spread["p99"] == values[-1]
        assert spread["median"] == pytest.approx(sum(values) / 2)  # two ranks: the mean of both


# The stand-in drive (stand_in/slow_drive.py), its writes held to 4 MB/s by the block layer (cgroup v1 blkio, which
# covers writeback too): slow enough that the ranks' CPU work, slowed down by a busy host, is a small part of a
# checkpoint's time, and no other work's I/O reaches it.
throttled_target = slow_drive.throttled_target(write_bps=4_000_000)


def test_async_saves_wait_for_a_drive_slower_than_the_interval(throttled_target, checkpoint_space, pool):
    mount, rate = throttled_target.point, throttled_target.write_bps
    plan = plan_of(4_000_000)  # 8 MB a checkpoint: about 2 s at 4 MB/s, against a 0.5 s interval
    space, root = checkpoint_space(plan, mount / "target")
    interval, footprint = 0.5, checkpoint_footprint_bytes(plan)
    campaign = FillCampaign(root, plan, pool, "stream", 2, remove=space.remove, cadence=Cadence(interval, True))
    try:
        records = [*campaign.run_pass(1).checkpoints, *campaign.run_pass(2).checkpoints]
    finally:
        campaign.close()
    assert [r.checkpoint for r in records] == [0, 1, 2, 3]
    for before, record in itertools.pairwise(records):
        assert record.async_save and record.interval_s >= interval
        # the next checkpoint waited for what the drive had left to do for this one: remove the oldest checkpoint and
        # write this one's files at the throttled rate, less the interval training computed meanwhile
        expected = before.remove_s + footprint / rate - record.interval_s
        assert record.wait_s == pytest.approx(expected, rel=0.10), (record, before.device)
        assert record.stall_s == record.wait_s + record.stage_s
    assert all(r.seconds_to_durable > r.stall_s for r in records)  # the writes ran behind the training


def test_the_time_left_counts_the_intervals_still_to_compute():
    settings = resolve_settings({"scale": "0.001", "checkpoints_per_pass": "3", "passes": "2"})
    paced = resolve_settings(
        {"scale": "0.001", "checkpoints_per_pass": "3", "passes": "2", "checkpoint_interval_s": "60"}
    )
    current = PassProgress(1, started=0.0, done_checkpoints=1, done_bytes=settings.plan.total_bytes)
    back_to_back = LiveLine(settings).text(current, None, now=10.0)  # one checkpoint in 10 s
    # with 60 s of compute before each: the same checkpoint written in 10 s after 60 s; 2 intervals left in the pass
    with_cadence = LiveLine(paced).text(current, None, now=70.0)
    assert "left: pass 0:00:20, run 0:00:50" in back_to_back
    assert "left: pass 0:02:20, run 0:05:50" in with_cadence  # 140 s, then 3 x (10 + 60) s


CADENCE_RUN = Path(__file__).parent / "data" / "results" / "cadence-async.json"  # docs/training-stacks.md's async run


def test_the_report_draws_a_checkpoints_phases_their_spread_and_the_cadence():
    run = load_run(CADENCE_RUN)
    drawn = {d.name: d for d in draw_all([run])}
    checkpoints = run.data["checkpoints"]
    phases = drawn["checkpoint_phases"].figure.axes[0]
    stacked = [p for p in phases.patches if p.get_height() > 0]
    slowest = [max(c["ranks"], key=lambda r: r["done_s"]) for c in checkpoints]
    assert len(stacked) == sum(sum(1 for s in r["phases"].values() if s > 0) for r in slowest)
    tops = {}
    for bar in stacked:  # each checkpoint's stack reaches its slowest rank's own time
        tops[round(bar.get_x(), 3)] = max(tops.get(round(bar.get_x(), 3), 0.0), bar.get_y() + bar.get_height())
    assert sorted(tops.values()) == pytest.approx(sorted(r["own_s"] for r in slowest), rel=0.02, abs=0.02)
    assert [a.get_ylabel() for a in drawn["rank_spread"].figure.axes] == ["mkdir s", "write s", "fsync s", "commit s"]
    assert drawn["cadence"].figure is not None and "async" in " ".join(
        t.get_text() for t in drawn["cadence"].figure.axes[0].get_legend().get_texts()
    )


def test_early_stop_bounds_the_cadence_figures_too():
    """A pass completed at a slower rate than it ran stalls longer under a synchronous cadence and is durable later
    under either; its stall fraction and sustained interval grow with it (runs.early_stop's bound)."""

    def paced_pass(async_save: bool) -> PassResult:
        record = CheckpointRecord(2, 1, 0, 2.0, 1.0, 2 * GB, 100.0, None, 0.0, interval_s=3.0, async_save=async_save)
        stall = 0.1 if async_save else 2.0
        durable = stall + (2.0 if async_save else 0.0)  # async: the 2 s of writes after the staging
        record = replace(record, stall_s=stall, stage_s=0.1 if async_save else 0.0, seconds_to_durable=durable)
        return PassResult(2, [record, replace(record, index=2, checkpoint=1)], planned=4)

    for async_save in (False, True):
        written = paced_pass(async_save)
        slower, faster = completed_at(written, 0.5), completed_at(written, 2.0)  # 4 s and 1 s a checkpoint
        assert slower.min_sustained_interval_s > written.min_sustained_interval_s >= faster.min_sustained_interval_s
        assert slower.seconds_to_durable_max > faster.seconds_to_durable_max
        assert slower.stall_fraction > written.stall_fraction >= faster.stall_fraction
        modeled = slower.checkpoints[-1]  # async: its 4 s of writes outlast the 3 s interval by 1 s, a wait
        assert modeled.wait_s == pytest.approx(1.0 if async_save else 0.0)
        assert modeled.stall_s == pytest.approx(1.1 if async_save else 4.0)
