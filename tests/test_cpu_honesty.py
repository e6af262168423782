"""CPU honesty: a figure taken while the host's CPUs were saturated keeps only the verdicts its bound decides, and
fails as INVALID with the figures otherwise; measured for real with rank processes, a busy loop on every usable CPU,
and a drive throttled so that the ranks wait on it. The real runs write where no other work's I/O reaches: a tmpfs of
their own, or the stand-in drive (stand_in/slow_drive.py)."""

import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ckptqual.host.cpu import HostSampler, HostUse
from ckptqual.limits.cache_served import OTHER_IO
from ckptqual.limits.host_bound import CPU_SATURATED, MAX_WAIT_SHARE, decide, host_bound_reason
from ckptqual.limits.judgement import judge
from ckptqual.limits.limits import Limit, Outcome
from ckptqual.limits.verdict import Findings, Overall, overall_verdict
from ckptqual.plan.model import FilePlan, RankPlan, TensorSpec
from ckptqual.runs.pool import RankPool
from stand_in import slow_drive
from suite_runs import SMALL_PAIR, LiveSuite, lenient_drive, results

# The stand-in drive, held to a write rate so low against the ranks' own work that their waits for a CPU stay small
# on a host busy with other work (test_host_waits.py: at 0.625-2.5 MB/s a write figure's waits stayed under 0.12 s a
# second at load 23-39); fast until the ranks have loaded their engine.
THROTTLE_BPS = 2_500_000
throttled_target = slow_drive.throttled_target(write_bps=200_000_000, read_bps=200_000_000)


def use(cpu_busy: float, work_cpu_s: float = 3.92, wall_s: float = 2.0) -> HostUse:
    return HostUse(wall_s, work_cpu_s, 2, cpu_busy, "vda", 0.41)


def test_a_saturated_host_is_named_with_the_figures():
    reason = host_bound_reason(use(0.97))
    assert reason == (
        "host-bound: ranks used 1.96 of 2 cores, which were 97% busy (at least 90% is saturated; the threads' own "
        "waits could not be read), the drive (vda) busy 41% of the time"
    )
    assert host_bound_reason(use(CPU_SATURATED - 0.01)) is None
    assert host_bound_reason(None) is None


def limit(measurement: str, unit: str, **bound: float) -> Limit:
    return Limit(measurement, unit, "test", number=1, **bound)


@pytest.mark.parametrize(
    ("measurement", "unit", "bound", "value", "expected"),
    [
        ("fill_throughput", "GB/s", {"min": 2.0}, 2.5, Outcome.PASS),  # the drive is at least this fast: it passes
        ("fill_throughput", "GB/s", {"min": 2.0}, 1.5, Outcome.INVALID),  # a faster host might have passed
        ("fill_throughput", "GB/s", {"max": 3.0}, 2.5, Outcome.INVALID),  # the drive may be faster than the max
        ("fill_checkpoint_seconds_max", "s", {"max": 10.0}, 8.0, Outcome.PASS),  # at most this long: it passes
        ("fill_checkpoint_seconds_max", "s", {"max": 10.0}, 12.0, Outcome.INVALID),
        ("layout_throughput_ratio", "ratio", {"min": 0.1}, 0.5, Outcome.INVALID),  # a ratio of two host figures
    ],
)
def test_a_host_bound_figure_keeps_only_the_verdicts_its_bound_decides(measurement, unit, bound, value, expected):
    rule = limit(measurement, unit, **bound)
    reason = host_bound_reason(use(0.98))
    verdict = decide(rule, rule.evaluate(value, unit), reason)
    assert verdict.outcome is expected
    assert reason in verdict.message
    assert decide(rule, rule.evaluate(value, unit), None) == rule.evaluate(value, unit)


def test_a_host_bound_failure_makes_the_run_invalid_not_unqualified():
    rule = limit("restore_throughput", "GB/s", min=2.0)
    judged = judge([rule], "restore_throughput", 1.2, "GB/s", {}, {}, host_bound_reason(use(0.99)))
    findings = Findings()
    findings.add_judgements(judged)
    conclusion = findings.conclusion()
    assert conclusion.outcome is Outcome.INVALID
    message = conclusion.message("restore")
    assert message.startswith("restore INVALID: restore_throughput 1.2 GB/s < min 2 GB/s")
    assert "not judged: host-bound: ranks used 1.96 of 2 cores" in message
    test = {"subject": "restore", "outcome": str(conclusion.outcome), "message": message}
    assert overall_verdict({"restore": test}).overall is Overall.INVALID
    assert judged[0].to_dict()["host_bound"].startswith("host-bound:")


def plans(ranks: int, numel: int) -> tuple[RankPlan, ...]:
    return tuple(RankPlan(r, (FilePlan(f"rank{r}.pt", (TensorSpec("x", numel, "int8"),)),)) for r in range(ranks))


@contextlib.contextmanager
def spinning() -> Iterator[list[int]]:
    """A busy loop pinned on each CPU this process may use, for the length of the block."""
    loops = []
    for cpu in sorted(os.sched_getaffinity(0)):
        loop = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=functools.partial(pin, cpu))
        loops.append(loop)
    time.sleep(0.5)  # let them start spinning
    try:
        yield [loop.pid for loop in loops]
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def pin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})


def test_ranks_kept_waiting_by_busy_cpus_are_caught_and_a_failed_limit_turns_invalid(tmpfs):
    memory = tmpfs("size=64m")  # no I/O to wait for: the ranks' time is their own work, half of it behind the loops
    with RankPool(2, seed=5, timeout_s=300, sampler=HostSampler(memory)) as pool, spinning():  # ranks started first
        timing = pool.write_checkpoint(memory, 0, plans(2, 20_000_000), "stream")
    host = timing.host
    assert host.cpu_busy >= CPU_SATURATED, host
    assert 0 < host.work_cpu_s == pytest.approx(sum(r.cpu_s for r in timing.ranks))
    assert host.cpu_s_per_GB(timing.bytes) > 0
    reason = host_bound_reason(host)  # judged by the ranks' own waits, not by how busy the CPUs were
    assert host.wait_share is not None and host.wait_share > MAX_WAIT_SHARE and reason is not None, host
    assert reason.startswith(f"host-bound: threads of ranks waited {host.threads_wait_s:.2f} s for a CPU")
    rate = timing.bytes / timing.seconds / 1e9
    failing, passing = limit("fill_throughput", "GB/s", min=rate * 2), limit("fill_throughput", "GB/s", min=rate / 2)
    context = {"pass": 1, "state": "fresh"}
    for rule, expected in ((failing, "INVALID"), (passing, "PASS")):
        [judged] = judge([rule], "fill_throughput", rate, "GB/s", context, {}, reason)
        assert judged.outcome == expected


def test_ranks_waiting_on_a_slow_drive_are_not_host_bound(throttled_target):
    sampler = HostSampler(throttled_target.point)
    with RankPool(2, seed=5, timeout_s=300, sampler=sampler) as pool:
        pool.write_checkpoint(throttled_target.point / "warm-up", 0, plans(2, 1 << 20), "stream")  # loads the engine
        throttled_target.throttle(THROTTLE_BPS, THROTTLE_BPS)
        timing = pool.write_checkpoint(throttled_target.point / "ckpt", 1, plans(2, 2_500_000), "stream")
    host = timing.host
    assert host.device.startswith("loop"), host  # the target's block device, found from its path
    # judged by the ranks' own waits for a CPU, not by how busy other work kept the host's CPUs
    assert host.wait_share is not None and host_bound_reason(host) is None, host
    # The drive was what the ranks waited for: the checkpoint took at least its bytes at the throttled rate. (Not the
    # drive's io_ticks: blk-throttle holds the writes above the device, whose queue is then mostly empty, 4-5 % busy.)
    assert timing.seconds >= 0.9 * timing.bytes / THROTTLE_BPS, (timing.seconds, timing.bytes)
    assert host.device_busy is not None, host  # recorded all the same
    assert 0 < host.work_cores < host.cores


IMPOSSIBLE = """
[[limit]]
name = "fill_throughput"
min = 1000
unit = "ratio"
relative_to = "raw_write"
source = "test: a thousand times the raw write, which no drive reaches"
"""


def test_the_suite_on_a_saturated_host_says_invalid_not_unqualified(tmp_path, tmpfs):
    drive = lenient_drive(tmp_path / "impossible.toml", "impossible drive", extra_limits=IMPOSSIBLE)
    target, record = tmpfs("size=160m"), tmp_path / "results.json"  # no other work's I/O can reach it
    args = [*SMALL_PAIR, "--drive", str(drive), "--target", str(target), "--results", str(record)]
    suite = LiveSuite(tmp_path / "log", *args)
    suite.wait_for("ckptqual: measuring raw sequential write")  # started, its ranks too: every figure is still ahead
    with spinning():
        code = suite.finish()
    assert code == 1, suite.output()[-3000:]
    data = results(record)
    assert data["verdict"]["overall"] == "INVALID", data["verdict"]
    first = next(t for t in data["tests"].values() if t["subject"] == "pass 1")
    assert first["outcome"] == "INVALID" and OTHER_IO not in first["message"], first
    assert "fill_throughput" in first["message"] and "< min 1000 of raw_write" in first["message"]
    assert "not judged: host-bound: threads of ranks waited" in first["message"]
    assert data["passes"][0]["host_bound"] and data["passes"][0]["cpu_s_per_GB"] > 0
    lenient = [m for m in data["measurements"] if m.get("limit_value") == 0.001]
    assert lenient and all(m["outcome"] == "PASS" and m["host_bound"] for m in lenient)  # a minimum it met stands
    assert all(round_["cpu_s_per_GB"] > 0 for round_ in data["baseline"]["host"]["write"])
