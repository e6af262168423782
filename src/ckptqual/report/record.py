"""The run record: everything the results JSON holds, written atomically as the run goes; every report renders
from it (or from the file it was written to). Its shape, as every reader of a results file checks it, is the schema
beside this writer (report/schema.py): a key written here that a reader reads is typed there."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptqual import __version__
from ckptqual.config.run_settings import RunSettings
from ckptqual.faults import os_error_line
from ckptqual.io.native.status import kernels_in_use
from ckptqual.output_file import write_file
from ckptqual.report.mlperf import mlperf_metrics


def environment() -> dict[str, Any]:
    """Versions and host facts a result depends on."""
    versions = {"ckptqual": __version__, "python": platform.python_version()}
    for module in ("torch", "numpy", "kvikio", "pytest", "pytest_benchmark", "hypothesis"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            versions[module] = getattr(loaded, "__version__", "unknown")
    facts = {"versions": versions, "host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()}
    return facts | {"native_kernels": kernels_in_use()}


@dataclass
class RunRecord:
    """Everything the results JSON holds, written atomically whenever it changes.

    Saving never raises: a failure (the results disk full, say) is kept in `save_error`, so that it cannot stop
    the run from cleaning up its target; the verdict then names it.
    """

    path: Path | None
    data: dict[str, Any] = field(default_factory=dict)
    save_error: str | None = None

    def __post_init__(self) -> None:
        self.data.update(
            started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            environment=environment(),
            passes=[],
            measurements=[],
            tests={},
            errors=[],
        )

    @classmethod
    def reopen(cls, path: Path) -> RunRecord:
        """The record a results file holds, to amend and save again."""
        record = cls(path)
        record.data = json.loads(path.read_text())
        return record

    @classmethod
    def begin(cls, settings: RunSettings, write: bool = True) -> RunRecord:
        """The record of a run, begun before anything touches the target, so that a run that cannot start says why;
        kept in memory only where `write` is false (--collect-only)."""
        record = cls(settings.results if write else None)
        record.data.update(
            settings=settings.to_dict(),
            plan=settings.plan.to_dict(),
            thresholds_drive=settings.thresholds.drive.__dict__,
            limits=[limit.to_dict() for limit in settings.thresholds.limits],
            left_on_target=[],
        )
        record.save()
        return record

    # The run's events (runs.events.RunEvents), each kept as it comes.

    def ceiling(self, ceiling: dict[str, Any]) -> None:
        self._set(ceiling=ceiling)

    def started(self, target: dict[str, Any], drive: dict[str, Any]) -> None:
        self._set(target=target, drive=drive)

    def baseline(self, baseline: dict[str, Any]) -> None:
        self._set(baseline=baseline)

    def checkpoint(self, checkpoint: dict[str, Any], of: int) -> None:
        self._append("checkpoints", checkpoint)

    def fill_pass(self, result: dict[str, Any], wall_s: float) -> None:
        self.data.setdefault("pass_wall_s", {})[str(result["pass"])] = wall_s
        self._append("passes", result)

    def steady_state(self, through_pass: int, state: dict[str, Any]) -> None:
        self.data.setdefault("steady_state", {})[str(through_pass)] = state
        self.save()

    def restore(self, result: dict[str, Any]) -> None:
        self._append("restore", result)

    def layout(self, layout: dict[str, Any]) -> None:
        self._append("layouts", layout)

    def sweep(self, sweep: dict[str, Any]) -> None:
        self._set(sweep=sweep)

    def health(self, health: dict[str, Any]) -> None:
        self._set(health=health)

    def timeseries(self, series: dict[str, Any]) -> None:
        self._set(timeseries=series)

    def judged(self, judgements: list[dict[str, Any]]) -> None:
        self.data["measurements"].extend(judgements)
        self.save()

    def error(self, message: str) -> None:
        if message not in self.data["errors"]:
            self._append("errors", message)

    def left(self, entries: list[dict[str, Any]]) -> None:
        self._set(left_on_target=entries)

    def abandoned(self, lines: list[str]) -> None:
        if lines:
            self.data.setdefault("abandoned_processes", []).extend(lines)
            self.save()

    def finished(self, cleanup: dict[str, Any]) -> None:
        finished = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._set(cleanup=cleanup, finished=finished, mlperf=mlperf_metrics(self.data))

    def _set(self, **values: Any) -> None:
        self.data.update(values)
        self.save()

    def _append(self, key: str, value: Any) -> None:
        self.data.setdefault(key, []).append(value)
        self.save()

    def record_test(self, nodeid: str, subject: str, outcome: str, message: str, when: str) -> None:
        """A test's outcome word and one-line message, what the run's verdict is computed from."""
        self.data["tests"][nodeid] = {"subject": subject, "outcome": str(outcome), "message": message, "when": when}
        self.save()

    def save(self) -> None:
        """Writes the JSON whole (output_file: never through a link, nor over anything but a regular file of this
        user)."""
        if self.path is None:
            return
        try:
            # not fsynced: saved while the drive is measured, perhaps on the same device, as often as a record changes
            write_file(self.path, (json.dumps(self.data, indent=2, default=str) + "\n").encode(), sync=False)
            self.save_error = None
        except OSError as error:
            self.save_error = f"the results file could not be written: {os_error_line(error, 'write')}"
