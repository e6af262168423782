"""One qualification run on one target: opens it, starts the ranks, measures the baseline, runs the fill.

Knows nothing of pytest: the plugin hands it a `say` function for progress and reads its records.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ckptqual.config.run_settings import RunSettings
from ckptqual.faults import RunError, fault_of_errno, os_error_line
from ckptqual.host.space import RunSpace
from ckptqual.host.target import DriveIdentity, Target, identify, open_target
from ckptqual.limits.judgement import Judgement, judge
from ckptqual.limits.steady import SteadyState, steady_state
from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.planfile import dump_plan
from ckptqual.report.record import RunRecord
from ckptqual.runs import raw
from ckptqual.runs.baseline import Baseline, measure_baseline
from ckptqual.runs.fill import CheckpointRecord, FillCampaign, PassResult
from ckptqual.runs.layouts import LayoutResult, run_layout
from ckptqual.runs.ranks import RankFailure, RankPool
from ckptqual.runs.restore import RestoreResult, evict_checkpoint


class RestoreError(RunError):
    """A restore could not be run or did not read back what was written."""


def new_record(settings: RunSettings) -> RunRecord:
    """The run's record, begun before anything touches the target, so that even a run that cannot start says why."""
    record = RunRecord(settings.results)
    record.data.update(
        settings=settings.to_dict(),
        plan=settings.plan.to_dict(),
        thresholds_drive=settings.thresholds.drive.__dict__,
        limits=[limit.to_dict() for limit in settings.thresholds.limits],
        left_on_target=[],
    )
    record.save()
    return record


class Qualification:
    """The state of a run: target, ranks, baseline, fill campaign and the record of what was measured.

    The main process never waits on the drive: the ranks do the timed I/O, and every other change to the target
    (removals, directories, untimed files) runs through `ops` with a deadline.
    """

    def __init__(self, settings: RunSettings, record: RunRecord, say: Callable[[str], None]) -> None:
        self.settings, self.record, self.say = settings, record, say
        self.target: Target = open_target(settings.target, keep=settings.keep)
        self.space = RunSpace(self.target, timeout_s=settings.rank_timeout_s)
        self.identity: DriveIdentity = identify(self.target.path)
        self.record.data.update(
            target={"path": str(self.target.path), "run_dir": str(self.target.run_dir)}, drive=self.identity.to_dict()
        )
        plan = settings.plan
        say(
            f"ckptqual: drive {settings.thresholds.drive.name!r} ({settings.thresholds.path.name}), "
            f"target {self.target.path} [{self.identity.filesystem} {self.identity.mount_options}]; "
            f"writing only inside {self.target.run_dir.name}, removed at the end"
            + (" (kept: --keep)" if settings.keep else "")
        )
        say(
            f"ckptqual: {plan.workload} at scale {plan.scale:g}: {len(plan.ranks)} ranks, {plan.file_count} files, "
            f"{plan.total_bytes / 1e9:,.2f} GB per checkpoint, {settings.checkpoints_per_pass} checkpoints per "
            f"pass, {settings.passes} passes, engine {settings.engine}, seed {settings.seed}"
        )
        self.pool: RankPool | None = None
        try:
            self._declare_files()
            self.pool = RankPool(len(plan.ranks), settings.seed, timeout_s=settings.rank_timeout_s)
            self.baseline = self._measure_baseline()
        except BaseException:
            self.close()
            raise
        self.fill = FillCampaign(
            self.run_dir / "checkpoints",
            plan,
            self.pool,
            settings.engine,
            settings.checkpoints_per_pass,
            remove=self.remove,
            on_checkpoint=self._checkpoint_done,
        )

    @property
    def run_dir(self) -> Path:
        return self.target.run_dir

    def _declare_files(self) -> None:
        """Records in the run directory's manifest every file the run will write, before it writes any, and makes
        the directories the ranks write into (at start: a drive that hangs now hangs before anything is timed)."""
        files = [spec.path for rank in self.settings.plan.ranks for spec in rank.files]
        self.space.declare("checkpoints/checkpoint-*", files)
        self.space.declare("raw", [raw.raw_path(Path(), rank).name for rank in range(len(self.settings.plan.ranks))])
        self.target.declare("layouts/layout-*", [], listed=True)
        for name in ("checkpoints", "raw", "layouts"):
            (self.run_dir / name).mkdir()

    def declare(self, pattern: str, files: list[str]) -> None:
        """Records files the run is about to write (relative to the directories matching `pattern`)."""
        self.space.declare(pattern, files)

    def remove(self, directory: Path, what: str) -> None:
        """Removes what the run wrote in `directory` within the deadline (see RunSpace.remove); recorded."""
        try:
            self.space.remove(directory, what)
        finally:
            self._sync_space()

    def own(self, directory: Path, files: list[str]) -> None:
        """Makes `directory` and lists in it the files the run is about to write there."""
        try:
            self.space.own(directory, files)
        finally:
            self._sync_space()

    def _sync_space(self) -> None:
        """Copies the space's account (left entries, errors) into the record."""
        self.record.data["left_on_target"] = list(self.space.left)
        for error in self.space.errors:
            if error not in self.record.data["errors"]:
                self.record.data["errors"].append(error)
        self.record.save()

    def _measure_baseline(self) -> Baseline:
        """Raw sequential write and read on the target, before anything else loads the drive."""
        size = self.settings.baseline_bytes
        self.say(f"ckptqual: measuring raw sequential write and read ({size / 1e9:,.2f} GB x 3) on the target")
        baseline = measure_baseline(self.pool, self.run_dir / "raw", size, self.remove)
        self.record.data["baseline"] = baseline.to_dict()
        self.say(
            f"ckptqual: raw sequential write {baseline.raw_write_GBps:.2f} GB/s, read {baseline.raw_read_GBps:.2f}"
            f" GB/s (medians of {', '.join(f'{v:.2f}' for v in baseline.write_GBps)} / "
            f"{', '.join(f'{v:.2f}' for v in baseline.read_GBps)})"
        )
        self.record.save()
        return baseline

    def _checkpoint_done(self, record: CheckpointRecord, total: int) -> None:
        self.record.data.setdefault("checkpoints", []).append(record.to_dict())
        self.record.save()
        self.say(
            f"ckptqual: pass {record.pass_number} checkpoint {record.index}/{total}: {record.seconds:.2f} s, "
            f"{record.GBps:.2f} GB/s (first rank done {record.first_done_s:.2f} s)"
        )

    def run_pass(self, number: int, runner: Callable[..., None] | None = None) -> PassResult:
        """Writes fill pass `number` and records it."""
        started = time.monotonic()
        try:
            result = self.fill.run_pass(number, runner)
        finally:
            self.record.data.setdefault("pass_wall_s", {})[str(number)] = time.monotonic() - started
        self.record.data["passes"].append(result.to_dict())
        self.record.save()
        return result

    def steady_state(self, through_pass: int) -> SteadyState:
        """The SNIA rule over the per-checkpoint rates of the steady-state passes (2 and later) so far; recorded."""
        rates = [c.GBps for number in range(2, through_pass + 1) for c in self.fill.passes[number].checkpoints]
        state = steady_state(rates)
        self.record.data.setdefault("steady_state", {})[str(through_pass)] = {**asdict(state), "rounds": len(rates)}
        self.record.save()
        return state

    def restore(self, checkpoint: int, directory: Path) -> RestoreResult:
        """Reads one checkpoint back cold with every rank at once and verifies every byte; raises RestoreError."""
        plan = self.settings.plan
        try:
            cached = evict_checkpoint(directory, plan)
        except OSError as error:
            message = f"checkpoint {checkpoint} cannot be read back: {os_error_line(error, 'evict')}"
            fault = "integrity" if error.errno == errno.ENOENT else fault_of_errno(error.errno)
            self.record.data["errors"].append(message)
            self.record.save()
            raise RestoreError(message, fault, error.errno) from error
        try:
            timing = self.pool.run(
                "read",
                directory,
                plan.ranks,
                f"restore of checkpoint {checkpoint}",
                checkpoint,
                {"engine": self.settings.engine},
            )
        except RankFailure as error:
            self.record.data["errors"].append(str(error))
            self.record.save()
            raise RestoreError(str(error), error.fault, error.errno) from error
        result = RestoreResult(
            checkpoint,
            timing.bytes,
            timing.seconds,
            timing.first_done_s,
            cached,
            timing.generated_GBps,
            [asdict(r) for r in timing.ranks],
        )
        self.record.data.setdefault("restore", []).append(result.to_dict())
        self.record.save()
        self.say(
            f"ckptqual: restore of checkpoint {checkpoint}: {result.seconds:.2f} s, {result.GBps:.2f} GB/s, "
            f"every byte verified ({cached:.1%} cached before)"
        )
        return result

    def newest_checkpoints(self, count: int) -> list[tuple[int, Path]]:
        """The newest `count` kept checkpoints; raises RestoreError when there are none to read."""
        if self.fill.failure:
            raise RestoreError(f"not run: {self.fill.failure}", "not-run")
        if not self.fill.retained:
            raise RestoreError("not run: no checkpoint has been written (run the fill passes first)", "not-run")
        return list(self.fill.retained)[-count:]

    def run_layout(self, plan: CheckpointPlan, example: int) -> LayoutResult:
        """Writes, reads back and verifies one odd layout against its regular twin; records it."""
        entry = {"example": example, "plan": json.loads(dump_plan(plan))}
        self.record.data.setdefault("layouts", []).append(entry)
        try:
            result = run_layout(self.pool, self.run_dir / "layouts", plan, self.settings.engine, example, self)
        except RankFailure as error:
            entry["error"] = str(error)
            self.record.save()
            raise
        entry.update(result.to_dict())
        self.record.save()
        self.say(
            f"ckptqual: layout {example}: {result.files} files, {result.bytes / 1e6:,.1f} MB, "
            f"{result.odd_GBps:.2f} GB/s vs regular {result.regular_GBps:.2f} GB/s (ratio {result.ratio:.2f}"
            f"{'' if result.judged else ', too small to judge'}), read back and verified"
        )
        return result

    def judge(self, measurements: list[tuple[str, float, str]], context: Mapping[str, Any]) -> list[Judgement]:
        """Judges (name, value, unit) measurements against the drive's limits and records them."""
        judgements = [
            j
            for name, value, unit in measurements
            for j in judge(
                self.settings.thresholds, name, value, unit, context, self.baseline.as_baselines(), self.settings.scale
            )
        ]
        self.record.add_judgements(judgements)
        return judgements

    def close(self) -> None:
        """Stops the ranks, removes what the run wrote (unless --keep) and records truthfully what is left.
        Never waits on an unresponsive drive beyond the deadline; idempotent."""
        if self.record.data.get("finished"):
            return
        try:
            if self.pool is not None:
                self.pool.close()
                self._record_abandoned(self.pool.abandoned)
        finally:
            cleanup = self.space.close()
            self._record_abandoned(self.space.ops.abandoned)
            self.record.data["cleanup"] = cleanup
            self.record.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            self._sync_space()
            if not cleanup["removed"] and not self.settings.keep:
                why = cleanup.get("why") or next(iter(cleanup.get("errors", [])), "see left_on_target")
                self.say(
                    f"ckptqual: the run directory {self.run_dir} was not removed completely ({why}); "
                    f"once the drive responds, run: {cleanup['fix']}"
                )

    def _record_abandoned(self, lines: list[str]) -> None:
        if lines:
            self.record.data.setdefault("abandoned_processes", []).extend(lines)
            self.record.save()


def fill_measurements(result: PassResult) -> list[tuple[str, float, str]]:
    """The measured values of one fill pass, by measurement name."""
    return [
        ("fill_throughput", result.throughput_GBps, "GB/s"),
        ("fill_mean_checkpoint_throughput", result.mean_checkpoint_GBps, "GB/s"),
        ("fill_checkpoint_seconds_mean", result.seconds_mean, "s"),
        ("fill_checkpoint_seconds_max", result.seconds_max, "s"),
    ]
