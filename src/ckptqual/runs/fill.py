"""Fill passes: checkpoint after checkpoint until the fill target, pass after pass, oldest removed first.

Pass 1 fills the drive with `checkpoints_per_pass` checkpoints; each later pass writes as many again,
removing the oldest checkpoint before each new one, as a training job with that retention limit would. A cadence
(runs.cadence) leaves compute time between checkpoints and may save asynchronously: the ranks stage their state
(the stall) and the writes run during the next interval.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ckptqual.faults import RunError
from ckptqual.host import device_bytes
from ckptqual.host.cpu import HostUse, combined
from ckptqual.host.device_bytes import DeviceBytes, Devices
from ckptqual.limits.cache_served import cache_served_reason
from ckptqual.limits.host_bound import host_bound_reason
from ckptqual.plan.model import CheckpointPlan
from ckptqual.runs.cadence import (
    BACK_TO_BACK,
    AsyncTimes,
    Cadence,
    Clock,
    Due,
    Stall,
    WriteBehind,
    slower_by,
    stall_fraction,
    writes_after_stall_s,
)
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.pool import Pool
from ckptqual.runs.timing import CheckpointTiming

# Payload generation must be at least this many times faster than the checkpoint rate.
MIN_GENERATOR_HEADROOM = 2.0


class FillError(RunError):
    """A fill pass could not be completed; the message says why, the fault whose fault it was."""


class StopRounds(Exception):
    """Raised by a round's setup to end the rounds before the next one (--early-stop); its message says why."""


# Why a pass may end now, given what it wrote so far (None: it goes on); see runs.early_stop.
EarlyStop = Callable[["PassResult"], str | None]


# Removes one checkpoint directory (only the files the run wrote there); raises RunError if it cannot.
Remover = Callable[[Path, str], None]


@dataclass(frozen=True)
class CheckpointRecord:
    """One written checkpoint: when it finished, on each rank, and how fast."""

    pass_number: int
    index: int
    checkpoint: int
    seconds: float
    first_done_s: float
    bytes: int
    generated_GBps: float
    removed_before: int | None
    remove_s: float
    ranks: list[dict] = field(default_factory=list)
    host: HostUse | None = None
    nodes: list[dict] = field(default_factory=list)  # per node, where the ranks ran on several (runs.cluster)
    device: DeviceBytes | None = None  # what the devices under the target received meanwhile (host.device_bytes)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # per phase: the ranks' median, p99, max s
    # The cadence (runs.cadence), on the main process's clock: the training stall (staging and any wait for the
    # previous checkpoint under async save, the whole save otherwise), from the start of the stall until it is
    # durable, the compute interval kept before it (None: the first), and, async only, the wait and the staging.
    stall_s: float = 0.0
    seconds_to_durable: float = 0.0
    interval_s: float | None = None
    wait_s: float = 0.0
    stage_s: float = 0.0
    async_save: bool = False

    @property
    def writes_after_stall_s(self) -> float:
        """The interval this checkpoint's writes need (runs.cadence.writes_after_stall_s)."""
        return writes_after_stall_s(self)

    def at_seconds(self, nbytes: int, seconds: float) -> CheckpointRecord:
        """This checkpoint as it would be with `nbytes` written in `seconds`, at the same cadence
        (runs.cadence.slower_by); each figure grows with `seconds` (runs.early_stop's bound)."""
        stall, wait, durable = slower_by(self, seconds - self.seconds)
        return replace(
            self,
            bytes=nbytes,
            seconds=seconds,
            host=None,
            ranks=[],
            stall_s=stall,
            wait_s=wait,
            seconds_to_durable=durable,
        )

    @property
    def GBps(self) -> float:
        return self.bytes / self.seconds / 1e9

    @property
    def cpu_s_per_GB(self) -> float | None:
        """The ranks' CPU seconds (user+system) per 1e9 bytes written."""
        return self.host.cpu_s_per_GB(self.bytes) if self.host else None

    def to_dict(self) -> dict:
        host = self.host.to_dict() if self.host else None
        return {
            **asdict(self),
            "host": host,
            "GBps": self.GBps,
            "cpu_s_per_GB": self.cpu_s_per_GB,
            "host_bound": host_bound_reason(self.host),
            "device": self.device.to_dict() if self.device else None,
            "writes_after_stall_s": self.writes_after_stall_s,
        }

    def cache_served_reason(self) -> str | None:
        """Why this checkpoint's time is not the drive's: its fsynced bytes did not all reach the devices."""
        return cache_served_reason(f"checkpoint {self.checkpoint}", self.device)


@dataclass
class PassResult:
    """The checkpoints of one pass and what they add up to."""

    number: int
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    planned: int = 0  # checkpoints the pass was to write
    ended_early: str | None = None  # why it ended before `planned` (--early-stop)
    drives_at_once: int = 1  # drives qualified at once on this host: the generator has this share of its cores

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.checkpoints)

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.checkpoints)

    @property
    def throughput_GBps(self) -> float:
        """Total bytes / total time."""
        return self.bytes / self.seconds / 1e9

    @property
    def mean_checkpoint_GBps(self) -> float:
        """The mean of per-checkpoint rates (differs from total bytes / total time when times vary)."""
        return sum(c.GBps for c in self.checkpoints) / len(self.checkpoints)

    @property
    def seconds_mean(self) -> float:
        return self.seconds / len(self.checkpoints)

    @property
    def seconds_max(self) -> float:
        return max(c.seconds for c in self.checkpoints)

    @property
    def stall_fraction(self) -> float:
        """The share of the training time the pass's checkpoints took: stall / (stall + compute intervals)."""
        return stall_fraction(self.checkpoints)

    @property
    def seconds_to_durable_max(self) -> float:
        return max(c.seconds_to_durable for c in self.checkpoints)

    @property
    def min_sustained_interval_s(self) -> float:
        """The shortest compute interval at which no checkpoint of the pass would have found the one before it still
        being written: its slowest checkpoint's writes after the stall (CheckpointRecord.writes_after_stall_s)."""
        return max(c.writes_after_stall_s for c in self.checkpoints)

    @property
    def generated_GBps(self) -> float:
        """How fast payload was made over the pass, had the ranks done nothing else."""
        generating = sum(c.bytes / (c.generated_GBps * 1e9) for c in self.checkpoints)
        return self.bytes / generating / 1e9 if generating > 0 else float("inf")

    @property
    def host(self) -> HostUse | None:
        """The host's use over the pass's timed checkpoints, as one region."""
        uses = [c.host for c in self.checkpoints if c.host is not None]
        return combined(uses) if uses else None

    def host_bound_reason(self) -> str | None:
        """Why the pass's figures measured the host's CPUs rather than the drive, if they did (limits.host_bound)."""
        return host_bound_reason(self.host)

    def invalid_reason(self) -> str | None:
        """Why this pass measured something other than the drive, if it did: a checkpoint whose bytes the devices
        did not receive (the first), or the payload generator; with several drives at once, the generator has only
        this drive's share of the host's cores."""
        served = next(filter(None, (c.cache_served_reason() for c in self.checkpoints)), None)
        if served:
            return served
        drives = self.drives_at_once
        share = self.generated_GBps / drives
        if share >= MIN_GENERATOR_HEADROOM * self.throughput_GBps:
            return None
        return (
            f"payload generation was the bottleneck: generator {share:.2f} GB/s"
            + (f" on 1/{drives} of the cores ({drives} drives at once)" if drives > 1 else "")
            + f" is under {MIN_GENERATOR_HEADROOM:g}x the checkpoint rate {self.throughput_GBps:.2f} GB/s; "
            + "use a host with more or faster cores"
            + (", or qualify fewer drives at once" if drives > 1 else "")
        )

    def to_dict(self) -> dict:
        return {
            "pass": self.number,
            "checkpoints": [c.checkpoint for c in self.checkpoints],  # details: the run's "checkpoints" list
            "checkpoints_planned": self.planned,
            "ended_early": self.ended_early,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "throughput_GBps": self.throughput_GBps,
            "mean_checkpoint_GBps": self.mean_checkpoint_GBps,
            "seconds_mean": self.seconds_mean,
            "seconds_max": self.seconds_max,
            "generated_GBps": self.generated_GBps,
            "host": self.host.to_dict() if self.host else None,
            "cpu_s_per_GB": self.host.cpu_s_per_GB(self.bytes) if self.host else None,
            "host_bound": self.host_bound_reason(),
            "stall_fraction": self.stall_fraction,
            "stall_s": sum(c.stall_s for c in self.checkpoints),
            "interval_s": sum(c.interval_s or 0.0 for c in self.checkpoints),
            "seconds_to_durable_max": self.seconds_to_durable_max,
            "min_sustained_interval_s": self.min_sustained_interval_s,
        }


class FillCampaign:
    """Runs the fill passes of one qualification on one run directory, keeping the retention queue."""

    def __init__(
        self,
        root: Path,
        plan: CheckpointPlan,
        pool: Pool,
        engine: str,
        checkpoints_per_pass: int,
        remove: Remover,
        on_checkpoint: Callable[[CheckpointRecord, int], None] = lambda record, total: None,
        drives_at_once: int = 1,
        devices: Devices | None = None,
        cadence: Cadence = BACK_TO_BACK,
    ) -> None:
        """`devices`: whose counters show what reached the target (default: those under `root`'s parent);
        `cadence`: the compute interval between checkpoints and whether they are saved asynchronously."""
        self.root, self.plan, self.pool, self.engine = root, plan, pool, engine
        self.devices = devices if devices is not None else device_bytes.devices_under(root.parent)
        self.drives_at_once = drives_at_once
        self.checkpoints_per_pass = checkpoints_per_pass
        self.remove = remove
        self.on_checkpoint = on_checkpoint
        self.retained: deque[tuple[int, Path]] = deque()
        self.passes: dict[int, PassResult] = {}
        self.failure: str | None = None
        self._next_checkpoint = 0
        self.cadence, self.clock = cadence, Clock(cadence.interval_s)
        self._behind: WriteBehind[CheckpointRecord] | None = WriteBehind(self.clock) if cadence.async_save else None

    def checkpoint_dir(self, checkpoint: int) -> Path:
        return self.root / f"checkpoint-{checkpoint:05d}"

    def run_pass(
        self, number: int, runner: Callable[..., None] | None = None, early_stop: EarlyStop | None = None
    ) -> PassResult:
        """Writes one pass; `runner(fn, setup, rounds)` may drive the rounds (e.g. pytest-benchmark; `fn` returns each
        round's checkpoint) and ends them when setup raises StopRounds; `early_stop` is asked before each checkpoint
        after the first."""
        if self.failure:
            raise FillError(f"not run: {self.failure}", "not-run")
        result = PassResult(number, planned=self.checkpoints_per_pass, drives_at_once=self.drives_at_once)
        pending: list[tuple[int | None, float, Due]] = []

        def setup() -> None:
            reason = early_stop(result) if early_stop and result.checkpoints else None
            if reason:
                result.ended_early = reason
                raise StopRounds(reason)
            removed, remove_s = self._make_room() if self._behind is None else (None, 0.0)  # async: removed behind
            pending.append((removed, remove_s, self.clock.due()))  # the interval's compute: untimed, as the removal

        def write() -> CheckpointRecord | Stall:
            removed, remove_s, due = pending.pop()
            if self._behind is None:
                result.checkpoints.append(self._write_one(number, len(result.checkpoints) + 1, removed, remove_s, due))
                return result.checkpoints[-1]
            return self._save_async(self._behind, result, number, due)

        try:
            (runner or run_rounds)(write, setup, self.checkpoints_per_pass)
            if self._behind is not None:
                self._behind.settle()  # the pass ends once its last checkpoint is durable
        except RunError as error:
            self.failure = f"pass {number} failed" + (
                " (the target ran out of space)" if error.fault == "out-of-space" else ""
            )
            raise FillError(str(error), error.fault, error.errno) from error
        self.passes[number] = result
        return result

    def _make_room(self) -> tuple[int | None, float]:
        """Removes the oldest checkpoint once the retention limit is reached (untimed)."""
        if len(self.retained) < self.checkpoints_per_pass:
            return None, 0.0
        checkpoint, directory = self.retained.popleft()
        start = time.monotonic()
        self.remove(directory, f"removing checkpoint {checkpoint}")
        return checkpoint, time.monotonic() - start

    def _write_one(self, number: int, index: int, removed: int | None, remove_s: float, due: Due) -> CheckpointRecord:
        """Writes one checkpoint while training waits (synchronous save), once it is due."""
        start = time.monotonic()
        record = self._write(number, index, removed, remove_s)
        durable = time.monotonic()
        self.clock.stalled(durable)
        record = replace(record, stall_s=durable - start, seconds_to_durable=durable - start, interval_s=due.kept_s)
        self.on_checkpoint(record, self.checkpoints_per_pass)
        return record

    def _save_async(self, behind: WriteBehind[CheckpointRecord], result: PassResult, number: int, due: Due) -> Stall:
        """The ranks stage their state (the stall, after any wait for the previous save); the removal of the oldest
        checkpoint and the writes run behind while training goes on, and the record joins the pass once durable."""
        index = len(result.checkpoints) + behind.writing + 1

        def stage() -> None:
            what = f"staging of checkpoint {index}/{self.checkpoints_per_pass} of pass {number}"
            checkpoint = self._next_checkpoint
            self.pool.run("stage", self.checkpoint_dir(checkpoint), self.plan.ranks, what, checkpoint)

        def write() -> CheckpointRecord:
            return self._write(number, index, *self._make_room())

        def done(written: CheckpointRecord, times: AsyncTimes) -> None:
            record = replace(
                written,
                stall_s=times.stall_s,
                seconds_to_durable=times.seconds_to_durable,
                interval_s=due.kept_s,
                wait_s=times.wait_s,
                stage_s=times.stage_s,
                async_save=True,
            )
            result.checkpoints.append(record)
            self.on_checkpoint(record, self.checkpoints_per_pass)

        return behind.save(due, stage, write, done)

    def close(self) -> None:
        """Ends the writing behind of an async save, if any (runs.cadence.WriteBehind.close)."""
        if self._behind is not None:
            self._behind.close()

    def _write(self, number: int, index: int, removed: int | None, remove_s: float) -> CheckpointRecord:
        checkpoint = self._next_checkpoint
        self._next_checkpoint += 1
        directory = self.checkpoint_dir(checkpoint)
        what = f"checkpoint {index}/{self.checkpoints_per_pass} of pass {number} ({directory.name})"
        try:
            with device_bytes.counted(self.devices) as count:
                timing = self.pool.write_checkpoint(directory, checkpoint, self.plan.ranks, self.engine, what=what)
        except RankFailure as error:
            self._remove_partial(directory, checkpoint)
            prefix = "the target ran out of space: " if error.fault == "out-of-space" else ""
            raise FillError(f"{prefix}{error}", error.fault, error.errno) from error
        except BaseException:
            self._remove_partial(directory, checkpoint)
            raise
        self.retained.append((checkpoint, directory))
        device = count.of(timing.bytes, "written", timing.nodes)
        return _record(number, index, checkpoint, timing, removed, remove_s, device)

    def _remove_partial(self, directory: Path, checkpoint: int) -> None:
        """Removes what a failed checkpoint wrote; a removal that fails too is recorded by the remover, and never
        hides the failure that matters."""
        with contextlib.suppress(RunError):
            self.remove(directory, f"removing the partial checkpoint {checkpoint}")


def run_rounds(fn: Callable[[], object], setup: Callable[[], None], rounds: int) -> None:
    """Runs `rounds` rounds of `setup` then `fn`: the plain twin of pytest-benchmark's pedantic(); a setup that
    raises StopRounds ends them."""
    for _ in range(rounds):
        try:
            setup()
        except StopRounds:
            return
        fn()


def _record(
    number: int,
    index: int,
    checkpoint: int,
    timing: CheckpointTiming,
    removed: int | None,
    remove_s: float,
    device: DeviceBytes,
) -> CheckpointRecord:
    return CheckpointRecord(
        pass_number=number,
        index=index,
        checkpoint=checkpoint,
        seconds=timing.seconds,
        first_done_s=timing.first_done_s,
        bytes=timing.bytes,
        generated_GBps=timing.generated_GBps,
        removed_before=removed,
        remove_s=remove_s,
        ranks=[asdict(r) for r in timing.ranks],
        host=timing.host,
        nodes=timing.node_figures(),
        device=device,
        phases=timing.phase_spread(),
    )
