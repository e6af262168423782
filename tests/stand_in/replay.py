"""A stand-in for the qualification's I/O, for testing the plugin's wiring in process (pytester): a recorded run
(tests/data/results/*.json) told again, result by result, through the events the real run tells, as pytest-xdist
tests its scheduler against a MockNode.

`ReplayQualification` is the real `Qualification` with its I/O replaced: no target is opened, no rank started; each
pass, checkpoint, restore, odd layout, the baseline and the drive's health come from the recording, rebuilt into the
run's own result classes. Everything else is the product's code: the judging (`judge`, `host_bound_figure`,
`steady_state`), the record, the progress lines, the JUnit XML, the verdict and the reports.

Loaded as a plugin (`-p stand_in.replay`), it puts the stand-in in place of the run and of the suite's calibration
(replaying a recorded ceiling) for the pytest run, and takes options that choose the recording and alter it:

    --replay NAME               the recording (tests/data/results/NAME.json; default loop-ext4-1)
    --replay-slower N=FACTOR    pass N's checkpoints take FACTOR times as long
    --replay-fail-restore TEXT  the restore fails, with TEXT (a restore that read back wrong bytes)
    --replay-measured-ceiling   the suite's ceiling measured on this host, as a real run measures it
    --replay-interrupt POINT    Ctrl-C (SIGINT to the process) at POINT: "start", "pass N" (after its first checkpoint),
                                "restore", "layouts", "sweep" (at its start) or "sweep CELL"

Its asserts are none: PYTEST_DONT_REWRITE (the tests import it before the runs that load it as a plugin).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from ckptqual.config.run_settings import RunSettings
from ckptqual.host.cpu import HostUse
from ckptqual.host.device_bytes import DeviceBytes, Devices
from ckptqual.host.gpu import HostGpu
from ckptqual.limits.ceiling import Ceiling, drive_share
from ckptqual.limits.health import check_health
from ckptqual.limits.host_bound import waits_text
from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.planfile import dump_plan
from ckptqual.runs import calibration, qualification
from ckptqual.runs.baseline import Baseline
from ckptqual.runs.events import Broadcast, RunEvents
from ckptqual.runs.fill import CheckpointRecord, EarlyStop, PassResult, StopRounds, run_rounds
from ckptqual.runs.layouts import LayoutResult
from ckptqual.runs.qualification import Qualification, RestoreError
from ckptqual.runs.restore import RestoreResult
from ckptqual.runs.sweep.cells import Cell, CellStats, SweepConfig
from ckptqual.runs.sweep.driver import CellResult, Runner, SweepRun, plain_runner
from ckptqual.runs.written import SuiteWrites

RECORDINGS = Path(__file__).resolve().parents[1] / "data" / "results"
DEFAULT = "loop-ext4-1"  # a QUALIFIED run on a loop device, no figure host-bound but its restore
# What a region of a recording made before the devices' bytes were counted holds in their place (as the record says
# of a region whose devices could not be counted).
NOT_RECORDED = "the replayed recording predates the counting of device bytes"
CEILING_FROM = "cadence-async"  # the recording that holds a measured ceiling (the others predate it)


@dataclass
class Recording:
    """A recorded run and how a test altered it."""

    data: dict[str, Any]
    slower: dict[int, float] = field(default_factory=dict)  # pass -> factor on its checkpoints' seconds
    failed_restore: str | None = None
    interrupt: str | None = None

    @classmethod
    def named(cls, name: str) -> Recording:
        data = json.loads((RECORDINGS / f"{name}.json").read_text())
        baseline = data["baseline"]
        if "device" not in baseline:
            rounds = {"write": len(baseline["write_GBps"]), "read": len(baseline["read_GBps"])}
            baseline["device"] = {
                kind: [uncounted(kind, baseline["bytes_per_round"]).to_dict()] * count for kind, count in rounds.items()
            }
        return cls(data)

    def stop_at(self, point: str) -> None:
        """Ctrl-C where the run reaches `point`: SIGINT to this process, as a terminal sends it, taken by whatever
        handler the plugin set (once)."""
        if self.interrupt == point:
            self.interrupt = None
            os.kill(os.getpid(), signal.SIGINT)

    def checkpoints(self, number: int, count: int) -> list[dict[str, Any]]:
        """`count` recorded checkpoints of pass `number` (the recording's passes, and a pass's checkpoints, over
        again past its last)."""
        recorded = sorted({c["pass_number"] for c in self.data["checkpoints"]})
        replayed = recorded[(number - 1) % len(recorded)]
        checkpoints = [c for c in self.data["checkpoints"] if c["pass_number"] == replayed]
        return [checkpoints[index % len(checkpoints)] for index in range(count)]


def rebuilt(cls: type, recorded: dict[str, Any], **changes: Any) -> Any:
    """A result dataclass from its recorded dict (the figures it derives left out), its host use and device bytes
    rebuilt too."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {name: value for name, value in recorded.items() if name in names}
    if values.get("host") is not None:
        values["host"] = rebuilt(HostUse, values["host"])
    if cls is not HostUse and values.get("device") is not None:  # a host's `device` is the drive's name
        values["device"] = recorded_device(values["device"])
    return cls(**{**values, **changes})


def recorded_device(recorded: dict[str, Any]) -> DeviceBytes:
    """A region's device bytes (host.device_bytes) from its record."""
    names = {f.name for f in dataclasses.fields(DeviceBytes)}
    values = {name: value for name, value in recorded.items() if name in names}
    below = tuple(values.get("layer_below", ()))
    return DeviceBytes(**{**values, "devices": tuple(values["devices"]), "layer_below": below})


def uncounted(kind: str, nbytes: int) -> DeviceBytes:
    """A region's device bytes where the recording holds none: not counted, saying why."""
    return DeviceBytes("written" if kind == "write" else kind, nbytes, None, (), not_countable=NOT_RECORDED)


class ReplayFill:
    """The fill campaign of a replayed run: each pass's checkpoints from the recording, driven by the runner as the
    real campaign drives its writes (FillCampaign.run_pass)."""

    def __init__(self, recording: Recording, settings: RunSettings, on_checkpoint: Callable[..., None]) -> None:
        self.recording, self.settings, self.on_checkpoint = recording, settings, on_checkpoint
        self.passes: dict[int, PassResult] = {}
        self.retained: deque[tuple[int, Path]] = deque()
        self.failure: str | None = None
        self.written = 0

    def run_pass(
        self, number: int, runner: Callable[..., None] | None = None, early_stop: EarlyStop | None = None
    ) -> PassResult:
        recorded = self.recording.checkpoints(number, self.settings.checkpoints_per_pass)
        result = PassResult(number, planned=len(recorded), drives_at_once=self.settings.drives_at_once)
        factor = self.recording.slower.get(number, 1.0)

        def setup() -> None:
            reason = early_stop(result) if early_stop and result.checkpoints else None
            if reason:
                result.ended_early = reason
                raise StopRounds(reason)

        def write() -> CheckpointRecord:
            if result.checkpoints:
                self.recording.stop_at(f"pass {number}")
            source = recorded[len(result.checkpoints)]
            checkpoint = self.written
            record = rebuilt(
                CheckpointRecord,
                source,
                pass_number=number,
                index=len(result.checkpoints) + 1,
                checkpoint=checkpoint,
                seconds=source["seconds"] * factor,
                **({} if source.get("device") else {"device": uncounted("write", source["bytes"])}),
                removed_before=self.retained.popleft()[0] if len(self.retained) >= len(recorded) else None,
            )
            self.written += 1
            self.retained.append((checkpoint, Path(f"checkpoint-{checkpoint:05d}")))
            result.checkpoints.append(record)
            self.on_checkpoint(record, len(recorded))
            return record

        (runner or run_rounds)(write, setup, len(recorded))
        self.passes[number] = result
        return result

    def close(self) -> None:
        """Nothing is written behind in a replay."""


class ReplayQualification(Qualification):
    """The real Qualification, its I/O replaced by the chosen recording (see the module's docstring)."""

    def __init__(self, settings: RunSettings, events: RunEvents) -> None:
        recording = self.recording = chosen()
        data = recording.data
        self.settings = settings
        self._finished = False
        self._host_bound: dict[str, str] = {}
        self._uncounted: dict[str, str | None] = {}
        self._waits: dict[str, str | None] = {}
        self.served_baselines: dict[str, str] = {}
        self.identity = RecordedDrive(data["drive"])  # type: ignore[assignment,unused-ignore]
        self.replayed_run_dir = Path(settings.target) / Path(data["target"]["run_dir"]).name
        events.started({"path": str(settings.target), "run_dir": str(self.run_dir)}, data["drive"])
        self.written = SuiteWrites()
        self.events = Broadcast(events, self.written)
        self.pool, self.sampler = None, None
        self.health_before = data["health"]["before"]
        self.events.health({"before": self.health_before})
        recording.stop_at("start")
        self.events.timeseries(data["timeseries"])
        self.baselines = {}
        if "baseline" in settings.parts:
            baseline = recorded_baseline(data["baseline"])
            self.events.measuring_baseline(baseline.bytes_per_round)
            self.served_baselines = baseline.invalid()
            self.events.baseline(baseline.to_dict())
            self.baselines = baseline.as_baselines()
        self._restored = 0
        self.fill = ReplayFill(recording, settings, self._checkpoint_done)  # type: ignore[assignment,unused-ignore]

    @property
    def run_dir(self) -> Path:
        return self.replayed_run_dir

    def declare(self, pattern: str, files: list[str]) -> None:
        """Nothing is written in a replay."""

    def restore(self, checkpoint: int, directory: Path) -> RestoreResult:
        """The recorded restore (the recording's restores over again), as checkpoint `checkpoint`."""
        recording = self.recording
        recording.stop_at("restore")
        if recording.failed_restore is not None:
            raise self._failed(RestoreError(recording.failed_restore, "integrity"))
        restores = recording.data["restore"]
        recorded = restores[self._restored % len(restores)]
        self._restored += 1
        device = {} if recorded.get("device") else {"device": uncounted("read", recorded["bytes"])}
        result = rebuilt(RestoreResult, recorded, checkpoint=checkpoint, **device)
        self.events.restore(result.to_dict())  # as Qualification.restore tells a restore it read
        self.host_bound_figure("restore_throughput", result.host_bound_reason())
        self._uncounted["restore_throughput"] = result.device.not_countable if result.device else None
        self._waits["restore_throughput"] = waits_text(result.host)
        return result

    def run_layout(self, plan: CheckpointPlan, example: int) -> LayoutResult:
        """The recorded layout of the same example (the recording's layouts over again), told with `plan`."""
        self.recording.stop_at("layouts")
        layouts = self.recording.data["layouts"]
        result = rebuilt(LayoutResult, layouts[example % len(layouts)], example=example)
        self.events.layout({"example": example, "plan": json.loads(dump_plan(plan)), **result.to_dict()})
        return result

    def read_sweep(self, host: HostGpu, say: Callable[[str], None], cufile_log: Path) -> SweepRun:
        """The sweep over this run's cells, each measured cell replaying the recorded one (ReplaySweep); which cells
        this host can run is the real host's answer (`host`)."""
        self.recording.stop_at("sweep")
        config, on_change = self.settings.sweep, self.events.sweep
        args = (self.recording, config, self.settings.seed, host, say, on_change)
        run = ReplaySweep(*args, cufile_log=cufile_log, devices=Devices())
        self.events.sweep(run.data)
        return run

    def close(self) -> None:
        """The recorded health after the run, judged by the product's check (limits.health), and the recorded
        cleanup; idempotent."""
        if self._finished:
            return
        self._finished = True
        data = self.recording.data
        after = data["health"].get("after", self.health_before)
        checked = check_health(self.settings.thresholds.limits, self.health_before, after, self.written.to_dict())
        self.events.judged([judgement.to_dict() for judgement in checked.judgements])
        self.events.health({"before": self.health_before, "after": after, **checked.record})
        self.events.left([])
        self.events.finished({**data["cleanup"], "run_dir": str(self.run_dir)})


class ReplaySweep(SweepRun):
    """The real read sweep (its cells, skips, records and outcomes), each measured cell the recorded cell of the
    same id (else of the same transfer, else the first measured), its files never written."""

    def __init__(self, recording: Recording, config: SweepConfig, *args: Any, **kwargs: Any) -> None:
        """The sweep's files would lie in an empty temporary directory (the real sweep opens the folder they lie in)
        instead of the run directory, which a replay does not make."""
        self.scratch = tempfile.TemporaryDirectory(prefix="ckptqual-replay-")  # removed with the sweep
        super().__init__(config, Path(self.scratch.name) / "sweep", *args, **kwargs)
        self.recording = recording

    def measure(self, cell: Cell, runner: Runner | None = None) -> CellResult:
        self.recording.stop_at(f"sweep {cell.id}")
        measured = [c for c in self.recording.data["sweep"]["cells"] if "seconds" in c]
        recorded = next(
            (c for c in measured if c["id"] == cell.id),
            next((c for c in measured if c["transfer"] == cell.transfer), measured[0]),
        )
        (runner or plain_runner)(lambda: None, lambda: None)
        stats = rebuilt(CellStats, recorded)
        figures = {key: value for key, value in recorded.items() if key not in cell.to_dict() and key != "outcome"}
        figures.setdefault("device", uncounted("read", stats.bytes).to_dict())
        record = {**cell.to_dict(), **figures, **stats.to_dict()}
        record["outcome"] = "INVALID" if record.get("invalid_reason") else "MEASURED"
        self._store(cell, record)
        self.say(f"ckptqual: sweep {cell.id}: {stats.GiBps:.2f} GiB/s (replayed)")
        return CellResult(cell, stats, record)

    def remove_files(self) -> None:
        """No sweep file is written in a replay."""

    def close(self) -> None:
        """No sweep file is written in a replay."""


def recorded_baseline(recorded: dict[str, Any]) -> Baseline:
    """The run's Baseline (runs.baseline) from its record: the rates of each round, their hosts and device bytes."""
    device = {kind: [recorded_device(d) for d in rounds] for kind, rounds in recorded["device"].items()}
    figures = (recorded["write_GBps"], recorded["read_GBps"], recorded["cached_fraction_before_read"])
    return Baseline(recorded["bytes_per_round"], *figures, host=recorded["host"], device=device)


@dataclass(frozen=True)
class RecordedDrive:
    """The recorded identity of the drive (host.target.DriveIdentity's record)."""

    recorded: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.recorded)


def replayed_ceiling(engine: str, drives_at_once: int = 1) -> tuple[dict[str, Any], dict[str, Ceiling]]:
    """runs.calibration.measure_ceiling on the recorded calibration: this host's speed as it was recorded."""
    recorded = Recording.named(CEILING_FROM).data["ceiling"]
    rounds = {
        phase: [(r["bytes"], r["cpu_s"]) for r in phase_rounds] for phase, phase_rounds in recorded["rounds"].items()
    }
    measured = calibration.Calibration(engine, recorded["directory"], rounds)
    cores = recorded["usable_cores"]
    share = drive_share(cores, drives_at_once)
    return measured.to_dict(share, cores, drives_at_once), measured.ceilings(share)


_chosen: list[Recording] = []


def chosen() -> Recording:
    """The recording this pytest run replays (its options), fresh for each drive run."""
    return replace(_chosen[-1], data=json.loads(json.dumps(_chosen[-1].data)))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("replay", "the replayed run standing in for the qualification's I/O (tests only)")
    group.addoption("--replay", default=DEFAULT, help="the recording: tests/data/results/NAME.json")
    group.addoption("--replay-slower", action="append", default=[], help="N=FACTOR: pass N's checkpoints slower")
    group.addoption("--replay-fail-restore", default=None, help="the restore fails with this text")
    group.addoption("--replay-measured-ceiling", action="store_true", help="the real calibration, not the recorded")
    group.addoption("--replay-interrupt", default=None, help='Ctrl-C at "start", "pass N", "restore", "layouts"')


def pytest_configure(config: pytest.Config) -> None:
    recording = Recording.named(config.getoption("replay"))
    for change in config.getoption("replay_slower"):
        number, factor = change.split("=")
        recording.slower[int(number)] = float(factor)
    recording.failed_restore = config.getoption("replay_fail_restore")
    recording.interrupt = config.getoption("replay_interrupt")
    _chosen.append(recording)
    patch = pytest.MonkeyPatch()
    patch.setattr(qualification, "Qualification", ReplayQualification)
    if not config.getoption("replay_measured_ceiling"):
        patch.setattr(calibration, "measure_ceiling", replayed_ceiling)
    config.add_cleanup(patch.undo)
    config.add_cleanup(lambda: _chosen.remove(recording))
