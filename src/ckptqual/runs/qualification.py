"""One qualification run on one target: opens it, starts the ranks, measures the baseline, runs the work.

Knows nothing of pytest and neither stores nor prints: it tells each result to `events` (the record and the
progress view listen). The main process never waits on the drive: the ranks do the timed I/O, and every other
change to the target runs through the run's space (a helper process with a deadline).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ckptqual.config.run_settings import RunSettings
from ckptqual.faults import RunError, fault_of_errno, os_error_line
from ckptqual.host import device_bytes, health
from ckptqual.host.beneath import PlantedEntry, RunTree
from ckptqual.host.cpu import HostSampler, usable_cores
from ckptqual.host.gpu import HostGpu
from ckptqual.host.sampler import Sampler, physical_devices
from ckptqual.host.space import RunSpace
from ckptqual.host.target import DriveIdentity, Target, identify, open_target
from ckptqual.io.lanes import share_of
from ckptqual.limits.ceiling import drive_share
from ckptqual.limits.health import check_health
from ckptqual.limits.host_bound import waits_text
from ckptqual.limits.judgement import Judgement, judge
from ckptqual.limits.measurements import MEASUREMENTS, Taken, field, in_recorded_unit, taken_at
from ckptqual.limits.steady import SteadyState, steady_state
from ckptqual.plan.formats import shared_files
from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.planfile import dump_plan
from ckptqual.runs import raw, reshard
from ckptqual.runs.baseline import measure_baseline
from ckptqual.runs.cadence import Cadence
from ckptqual.runs.cluster import NodePool
from ckptqual.runs.early_stop import stop_reason
from ckptqual.runs.events import Broadcast, RunEvents
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.fill import CheckpointRecord, EarlyStop, FillCampaign, PassResult
from ckptqual.runs.layouts import LayoutResult, run_layout
from ckptqual.runs.pool import Pool, RankPool
from ckptqual.runs.restore import RestoreResult, evict_checkpoint
from ckptqual.runs.sweep.driver import SweepRun
from ckptqual.runs.sweep.files import file_names
from ckptqual.runs.written import SuiteWrites


class RestoreError(RunError):
    """A restore could not be run or did not read back what was written."""


class Qualification:
    """The state of a run: target, space, ranks, baseline and fill campaign."""

    def __init__(self, settings: RunSettings, events: RunEvents) -> None:
        self.settings, self.events = settings, events
        self.target: Target = open_target(settings.target, keep=settings.keep)
        self.tree = RunTree(self.run_dir)  # the run directory as made: every entry under it is reached from here
        self.space = RunSpace(self.target, timeout_s=settings.rank_timeout_s)
        self.identity: DriveIdentity = identify(self.target.path)
        self._finished = False
        self._host_bound: dict[str, str] = {}  # measurement -> why its figure about to be judged was host-bound
        self._uncounted: dict[str, str | None] = {}  # measurement -> why its figure's device bytes could not be counted
        self._waits: dict[str, str | None] = {}  # measurement -> what its figure's own threads waited for (host.waits)
        self.devices = device_bytes.devices_under(self.target.path)  # whose counters show the target's real I/O
        self.served_baselines: dict[str, str] = {}  # baseline -> why a cache served it (limits.cache_served)
        events.started({"path": str(self.target.path), "run_dir": str(self.run_dir)}, self.identity.to_dict())
        self.written = SuiteWrites()  # what the suite writes, told by the events, against what the drive counts
        self.events = Broadcast(events, self.written)
        self.pool: Pool | None = None
        self.sampler: Sampler | None = None
        try:
            self.health_before = health.snapshot(self.identity)  # before the first byte the suite writes
            self.events.health({"before": self.health_before})
            self._declare_files()
            sampler = HostSampler(self.target.path)  # the target's block device, resolved once, before any I/O
            self.pool = self._start_ranks(sampler)
            self.sampler = self._start_sampling()
            self.baselines = self._measure_baseline() if "baseline" in settings.parts else {}
        except BaseException:
            self.close()
            raise
        self.fill = FillCampaign(
            self.run_dir / "checkpoints",
            settings.plan,
            self.pool,
            settings.checkpoint_engine,
            settings.checkpoints_per_pass,
            remove=self.remove,
            on_checkpoint=self._checkpoint_done,
            drives_at_once=settings.drives_at_once,
            devices=self.devices,
            cadence=Cadence(settings.checkpoint_interval_s, settings.async_save),
        )

    @property
    def run_dir(self) -> Path:
        return self.target.run_dir

    @property
    def ranks(self) -> Pool:
        """The run's rank processes, once started (the constructor starts them before any part runs)."""
        if self.pool is None:
            raise RuntimeError("the rank processes were asked for before they started")
        return self.pool

    def _declare_files(self) -> None:
        """Records in the run directory's manifest every file the run will write, before it writes any, and makes
        the directories the ranks write into (at start: a drive that hangs now hangs before anything is timed)."""
        plan = self.settings.plan
        files = [spec.path for rank in plan.ranks for spec in rank.files] + list(shared_files(self.settings.format))
        self.space.declare("checkpoints/checkpoint-*", files)
        self.space.declare("raw", [raw.raw_path(Path(), rank).name for rank in range(len(plan.ranks))])
        self.target.declare("layouts/layout-*", [], listed=True)
        for name in ("checkpoints", "raw", "layouts"):
            os.mkdir(name, 0o700, dir_fd=self.tree.fd)

    def _start_ranks(self, sampler: HostSampler) -> Pool:
        """The plan's ranks as processes of this host, or spread over --nodes nodes whose torchrun workers reach this
        process at --controller (runs.cluster)."""
        settings, ranks = self.settings, len(self.settings.plan.ranks)
        if settings.nodes > 1:
            if settings.controller is None or settings.secret_file is None:  # resolve_settings requires both
                raise ValueError(f"--nodes {settings.nodes} came without --controller or --secret-file")
            args = (settings.controller, settings.nodes, ranks, settings.seed, self.run_dir, settings.secret_file)
            return NodePool(*args, settings.rank_timeout_s, sampler=sampler)
        lanes = share_of(ranks, drive_share(usable_cores(), settings.drives_at_once))
        return RankPool(
            ranks, settings.seed, settings.rank_timeout_s, sampler=sampler, root=self.tree.reference, lanes=lanes
        )

    def declare(self, pattern: str, files: list[str]) -> None:
        """Records files the run is about to write (relative to the directories matching `pattern`)."""
        self.space.declare(pattern, files)

    def remove(self, directory: Path, what: str) -> None:
        """Removes what the run wrote in `directory` within the deadline (see RunSpace.remove); told as it goes."""
        try:
            self.space.remove(directory, what)
        finally:
            self._tell_space()

    def own(self, directory: Path, files: list[str]) -> None:
        """Makes `directory` and lists in it the files the run is about to write there."""
        try:
            self.space.own(directory, files)
        finally:
            self._tell_space()

    def _tell_space(self) -> None:
        self.events.left(list(self.space.left))
        for error in self.space.errors:
            self.events.error(error)
        self.space.errors.clear()

    def _start_sampling(self) -> Sampler | None:
        """The time series of the drive's counters, CPU, memory and the ranks' writes, marked with the run's
        events (it listens to them from now on); None when --sample-interval is 0."""
        interval_s = self.settings.sample_interval_s
        if not interval_s:
            self.events.timeseries({"interval_s": 0, "unavailable": "sampling was off (sample_interval_s 0)"})
            return None
        names = [device["name"] for device in self.identity.to_dict().get("physical", [])] or [self.identity.device]
        events = self.events
        sampler = Sampler(physical_devices(names), interval_s, self.ranks.pids, events.sample, events.timeseries)
        self.events = Broadcast(events, sampler)
        return sampler

    def _measure_baseline(self) -> dict[str, float]:
        """Raw sequential write and read on the target, before anything else loads the drive; the rates that relative
        limits refer to (none where the drive file's [run] parts leaves the baseline out)."""
        self.events.measuring_baseline(self.settings.baseline_bytes)
        raw_dir, total = self.run_dir / "raw", self.settings.baseline_bytes
        baseline = measure_baseline(self.ranks, self.tree, raw_dir, total, self.remove, devices=self.devices)
        self.served_baselines = baseline.invalid()
        self.events.baseline(baseline.to_dict())
        return baseline.as_baselines()

    def _checkpoint_done(self, record: CheckpointRecord, total: int) -> None:
        self.events.checkpoint(record.to_dict(), total)

    def run_pass(self, number: int, runner: Callable[..., None] | None = None) -> PassResult:
        """Writes fill pass `number`."""
        started = time.monotonic()
        self.events.fill_started(number)
        try:
            result = self.fill.run_pass(number, runner, self._early_stop(number))
        finally:
            self.events.fill_ended(number)  # done, failed or interrupted
        self.events.fill_pass(result.to_dict(), time.monotonic() - started)
        devices = [c.device for c in result.checkpoints if c.device is not None]
        uncounted = next((device.not_countable for device in devices if device.not_countable), None)
        for name, _, _ in fill_measurements(result):
            self._host_bound.pop(name, None)
            self.host_bound_figure(name, result.host_bound_reason())
            self._uncounted[name] = uncounted
            self._waits[name] = waits_text(result.host)
        return result

    def _early_stop(self, number: int) -> EarlyStop | None:
        """--early-stop's check for pass `number` (runs.early_stop); never pass 1: its fill state is what is tested."""
        if not self.settings.early_stop or number < 2:
            return None
        passes = [self.fill.passes[n] for n in range(2, number) if n in self.fill.passes]
        earlier = [c.GBps for result in passes for c in result.checkpoints]
        settings, baselines, served = self.settings, self.baselines, self.served_baselines
        context = {"pass": number, "state": "steady"}

        def outcomes(result: PassResult) -> tuple[str, ...]:
            limits, bound = settings.thresholds.limits, result.host_bound_reason()
            return tuple(
                j.outcome
                for name, value, unit in fill_measurements(result)
                for j in judge(limits, name, value, unit, context, baselines, bound, served)
            )

        return lambda result: stop_reason(result, earlier, outcomes)

    def host_bound_figure(self, measurement: str, reason: str | None) -> None:
        """Notes that the next figure of `measurement` to be judged was host-bound for `reason` (None: nothing);
        the first reason of a figure made of several results is kept."""
        if reason:
            self._host_bound.setdefault(measurement, reason)

    def steady_state(self, through_pass: int) -> SteadyState:
        """The SNIA rule over the per-checkpoint rates of the steady-state passes (2 and later) so far."""
        rates = [c.GBps for number in range(2, through_pass + 1) for c in self.fill.passes[number].checkpoints]
        state = steady_state(rates)
        self.events.steady_state(through_pass, {**asdict(state), "rounds": len(rates)})
        return state

    def restore(self, checkpoint: int, directory: Path) -> RestoreResult:
        """Reads one checkpoint back cold with every rank at once and verifies every byte; raises RestoreError."""
        plan = self.settings.plan
        try:
            cached = evict_checkpoint(self.tree, directory, plan)
            below = self.devices.evict_below()
        except PlantedEntry as error:
            message = f"checkpoint {checkpoint} cannot be read back: evict: {error}"
            raise self._failed(RestoreError(message, "planted")) from None
        except OSError as error:
            message = f"checkpoint {checkpoint} cannot be read back: {os_error_line(error, 'evict')}"
            fault = "integrity" if error.errno == errno.ENOENT else fault_of_errno(error.errno)
            raise self._failed(RestoreError(message, fault, error.errno)) from error
        options = {"engine": self.settings.checkpoint_engine}
        op, plans = ("reshard-read", self._layout_plans) if self.settings.restore_layout else ("read", plan.ranks)
        try:
            with device_bytes.counted(self.devices) as count:
                timing = self.ranks.run(
                    op, directory, plans, f"restore of checkpoint {checkpoint}", checkpoint, options
                )
        except RankFailure as error:
            raise self._failed(RestoreError(str(error), error.fault, error.errno)) from error
        ranks = [asdict(r) for r in timing.ranks]
        figures = (timing.bytes, timing.seconds, timing.first_done_s, cached, timing.generated_GBps, ranks)
        distinct, layout = timing.bytes, None
        if self.settings.restore_layout:
            distinct, layout = self._reshard_figures(directory, timing.ranks, plan.total_bytes)
        device = count.of(distinct, "read", timing.nodes, below)
        result = RestoreResult(
            checkpoint, *figures, host=timing.host, nodes=timing.node_figures(), device=device, reshard=layout
        )
        self.events.restore(result.to_dict())
        self.host_bound_figure("restore_throughput", result.host_bound_reason())
        self._uncounted["restore_throughput"] = device.not_countable
        self._waits["restore_throughput"] = waits_text(result.host)
        return result

    @functools.cached_property
    def _layout_plans(self) -> tuple:
        """Each new rank's reads for --restore-layout (runs.reshard), made once."""
        settings = self.settings
        if settings.restore_layout is None:
            raise ValueError("the restore's layout plans were asked for without --restore-layout")
        args = (settings.workload, settings.scale, settings.plan, settings.restore_layout, settings.checkpoint_engine)
        return reshard.layout_plans(*args)

    def _reshard_figures(self, directory: Path, ranks: Sequence[Any], checkpoint_bytes: int) -> tuple[int, dict]:
        """A restore onto another layout: the distinct bytes the ranks read (ranks that read the same bytes get them
        from the drive once), and what each new rank read (runs.reshard.figures)."""
        distinct = reshard.distinct_bytes(self._layout_plans, lambda path: (directory / path).stat().st_size)
        par = self.settings.workload.parallelism
        layouts = f"{par.tp}x{par.pp} -> {self.settings.restore_layout}"
        return distinct, reshard.figures(self._layout_plans, [r.bytes for r in ranks], checkpoint_bytes, layouts)

    def _failed(self, error: RunError) -> RunError:
        self.events.error(str(error))
        return error

    def newest_checkpoints(self, count: int) -> list[tuple[int, Path]]:
        """The newest `count` kept checkpoints; raises RestoreError when there are none to read."""
        if self.fill.failure:
            raise RestoreError(f"not run: {self.fill.failure}", "not-run")
        if not self.fill.retained:
            raise RestoreError("not run: no checkpoint has been written (run the fill passes first)", "not-run")
        return list(self.fill.retained)[-count:]

    def run_layout(self, plan: CheckpointPlan, example: int) -> LayoutResult:
        """Writes, reads back and verifies one odd layout against its regular twin."""
        entry: dict[str, Any] = {"example": example, "plan": json.loads(dump_plan(plan))}
        try:
            result = run_layout(
                self.ranks, self.tree, self.run_dir / "layouts", plan, self.settings.engine, example, self
            )
        except RankFailure as error:
            self.events.layout({**entry, "error": str(error)})
            raise
        self.events.layout({**entry, **result.to_dict()})
        return result

    def read_sweep(self, host: HostGpu, say: Callable[[str], None], cufile_log: Path) -> SweepRun:
        """The run's read sweep: its files declared in the run directory, its file changes made through the run's
        space, its reads sampled with the ranks' host use, each change of it recorded."""
        config = self.settings.sweep
        self.declare("sweep", file_names(config.jobs))
        sampler = self.pool.sampler if self.pool is not None else None
        run = SweepRun(
            config,
            self.run_dir / "sweep",
            seed=self.settings.seed,
            host=host,
            say=say,
            on_change=self.events.sweep,
            cufile_log=cufile_log,
            run=self.space.call,
            sampler=sampler,
        )
        self.events.sweep(run.data)
        return run

    def judge(self, measurements: list[tuple[str, float, str]], context: Mapping[str, Any]) -> list[Judgement]:
        """Judges (name, value, unit) measurements against the drive's limits, each recorded in the unit the table
        of measurements gives it."""
        baselines, settings = self.baselines, self.settings
        judgements = [
            j
            for name, value, unit in measurements
            for j in judge(
                settings.thresholds.limits,
                name,
                in_recorded_unit(name, value, unit),
                MEASUREMENTS[name].unit,
                context,
                baselines,
                self._host_bound.pop(name, None),
                self.served_baselines,
                self._waits.get(name),
            )
        ]
        judgements = [uncounted_named(j, self._uncounted.get(j.measurement)) for j in judgements]
        self.events.judged([j.to_dict() for j in judgements])
        return judgements

    @property
    def closed(self) -> bool:
        """Whether close() has run: the run directory and all the run wrote in it are gone (or accounted for)."""
        return self._finished

    def close(self) -> None:
        """Stops the ranks, removes what the run wrote (unless --keep) and tells truthfully what is left. Never
        waits on an unresponsive drive beyond the deadline; idempotent."""
        if self._finished:
            return
        self._finished = True
        try:
            if self.pool is not None:
                try:
                    self.pool.close()  # a message refused after the last task fails the run here (runs.cluster)
                finally:
                    self.events.abandoned(self.pool.abandoned)
                    if getattr(self, "fill", None) is not None:
                        self.fill.close()  # a save still being written behind ends with the ranks
        finally:
            self._check_health()
            cleanup = self.space.close()
            self.events.abandoned(self.space.ops.abandoned)
            self._tell_space()
            if self.sampler is not None:
                self.sampler.stop()
            self.tree.close()
            self.events.finished(cleanup)

    def _check_health(self) -> None:
        """The drive's health after the last test against before the first, and the bytes it counted written
        against the suite's; a reading that fails is an error of the record, never a stop to the cleanup."""
        try:
            after = health.snapshot(self.identity)
            settings = self.settings
            checked = check_health(settings.thresholds.limits, self.health_before, after, self.written.to_dict())
        except Exception as error:  # whatever broke, the target is still cleaned up
            self.events.error(f"the drive's health after the run could not be read: {error!r}")
            return
        self.events.judged([judgement.to_dict() for judgement in checked.judgements])
        self.events.health({"before": self.health_before, "after": after, **checked.record})


def uncounted_named(judgement: Judgement, why: str | None) -> Judgement:
    """A judged figure whose device bytes could not be counted (`why`; None: they were) says so in its message."""
    if why is None or judgement.verdict is None:
        return judgement
    message = f"{judgement.verdict.message} (device bytes not counted: {why})"
    return replace(judgement, verdict=replace(judgement.verdict, message=message))


def fill_measurements(result: PassResult) -> list[tuple[str, float, str]]:
    """The measured values of one fill pass: each measurement the table takes per pass, read from the pass's record
    at the field its row names."""
    recorded = result.to_dict()
    return [(row.name, recorded[field(row)], row.unit) for row in taken_at(Taken.PASS)]
