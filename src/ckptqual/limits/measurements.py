"""The one table of measurements: each figure the suite takes, with its unit, which way is better, where it is taken,
where the run record keeps it and how the report draws it. Limits, summary, compare and figures loop over it.

Pure data and small pure accessors: nothing here reads a file or knows of pytest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ckptqual.limits.units import to_unit, unit_kind


class Direction(StrEnum):
    """Which way a measurement is better: a throughput higher, a duration lower."""

    HIGHER = "higher"
    LOWER = "lower"


class Taken(StrEnum):
    """Where in the run a measurement is taken."""

    BASELINE = "baseline"
    CHECKPOINT = "checkpoint"
    PASS = "pass"
    RESTORE = "restore"
    SWEEP_CELL = "sweep cell"
    LAYOUT = "layout"
    DRIVE_HEALTH = "drive health"


@dataclass(frozen=True)
class Drawing:
    """How the report draws a measurement: the figure (report.figures' name for it) and its axis label."""

    figure: str
    axis: str


@dataclass(frozen=True)
class Measurement:
    """One row of the table. `record` is where the results JSON keeps each value: dotted keys, `[]` after a list
    (every item). `context` holds the keys a limit's `where` may select on; `limited` says whether a drive file may
    declare limits on it (the others are recorded and compared, never judged)."""

    name: str
    unit: str
    direction: Direction
    taken: Taken
    doc: str
    record: str
    context: tuple[str, ...] = ()
    limited: bool = True
    drawn: Drawing | None = None
    column: str = ""  # its header in the summary's table, where it has one there
    within_run: bool = False  # a ratio of two figures this run took on this target, so a limit on it is relative

    @property
    def kind(self) -> str:
        """The unit's kind: throughput, duration, ratio or temperature."""
        return unit_kind(self.unit)

    def worse(self, change: float) -> bool:
        """Whether a relative change (new - base) / base of this measurement is a change for the worse."""
        return change < 0 if self.direction is Direction.HIGHER else change > 0


_PASS = ("pass", "state")
_CHECKPOINT_TIMES = Drawing("checkpoint_times", "seconds (slowest rank)")
_ROWS = (
    Measurement(
        "raw_write",
        "GB/s",
        Direction.HIGHER,
        Taken.BASELINE,
        "raw sequential write of the target, each round (the baseline relative limits divide by)",
        "baseline.write_GBps[]",
        limited=False,
    ),
    Measurement(
        "raw_read",
        "GB/s",
        Direction.HIGHER,
        Taken.BASELINE,
        "raw sequential cold read of the target, each round",
        "baseline.read_GBps[]",
        limited=False,
    ),
    Measurement(
        "checkpoint_throughput",
        "GB/s",
        Direction.HIGHER,
        Taken.CHECKPOINT,
        "bytes of one checkpoint / the time its slowest rank took (the SNIA steady-state rounds, passes 2+)",
        "checkpoints[].GBps",
        limited=False,
        drawn=Drawing("steady_state", "GB/s (1e9 B/s)"),
    ),
    Measurement(
        "checkpoint_seconds",
        "s",
        Direction.LOWER,
        Taken.CHECKPOINT,
        "time to write one checkpoint, its slowest rank's",
        "checkpoints[].seconds",
        limited=False,
        drawn=_CHECKPOINT_TIMES,
    ),
    Measurement(
        "fill_throughput",
        "GB/s",
        Direction.HIGHER,
        Taken.PASS,
        "total bytes / total time of one fill pass",
        "passes[].throughput_GBps",
        _PASS,
        drawn=_CHECKPOINT_TIMES,
        column="GB/s",
    ),
    Measurement(
        "fill_mean_checkpoint_throughput",
        "GB/s",
        Direction.HIGHER,
        Taken.PASS,
        "mean of the per-checkpoint rates of a pass",
        "passes[].mean_checkpoint_GBps",
        _PASS,
        drawn=_CHECKPOINT_TIMES,
        column="mean GB/s",
    ),
    Measurement(
        "fill_checkpoint_seconds_mean",
        "s",
        Direction.LOWER,
        Taken.PASS,
        "mean time to write a checkpoint",
        "passes[].seconds_mean",
        _PASS,
        drawn=_CHECKPOINT_TIMES,
        column="mean s",
    ),
    Measurement(
        "fill_checkpoint_seconds_max",
        "s",
        Direction.LOWER,
        Taken.PASS,
        "slowest checkpoint of a pass",
        "passes[].seconds_max",
        _PASS,
        drawn=_CHECKPOINT_TIMES,
        column="worst s",
    ),
    Measurement(
        "stall_fraction",
        "ratio",
        Direction.LOWER,
        Taken.PASS,
        "share of a pass's training time lost to checkpointing: stall / (stall + compute intervals); the stall is "
        "the whole save, or under async save the staging and any wait for the previous save",
        "passes[].stall_fraction",
        _PASS,
        drawn=_CHECKPOINT_TIMES,
    ),
    Measurement(
        "seconds_to_durable_max",
        "s",
        Direction.LOWER,
        Taken.PASS,
        "slowest checkpoint of a pass from the start of its stall until its last fsync and metadata commit are done",
        "passes[].seconds_to_durable_max",
        _PASS,
        drawn=_CHECKPOINT_TIMES,
    ),
    Measurement(
        "min_sustained_interval",
        "s",
        Direction.LOWER,
        Taken.PASS,
        "shortest compute interval at which no checkpoint of a pass finds the one before it still being written: "
        "its slowest checkpoint's writes after the stall (async save), or its save and removal (synchronous)",
        "passes[].min_sustained_interval_s",
        _PASS,
        drawn=_CHECKPOINT_TIMES,
    ),
    Measurement(
        "restore_throughput",
        "GB/s",
        Direction.HIGHER,
        Taken.RESTORE,
        "total bytes / total time of reading checkpoints back, every byte verified",
        "restore[].GBps",
        _PASS,
        drawn=Drawing("restore", "seconds (slowest rank)"),
    ),
    Measurement(
        "sweep_read_bandwidth",
        "GiB/s",
        Direction.HIGHER,
        Taken.SWEEP_CELL,
        "read bandwidth of one sweep cell",
        "sweep.cells[].GiBps",
        ("transfer", "block_size", "threads"),
        drawn=Drawing("sweep_bandwidth", "GiB/s (2^30 B/s)"),
    ),
    Measurement(
        "layout_throughput_ratio",
        "ratio",
        Direction.HIGHER,
        Taken.LAYOUT,
        "write throughput of an odd shard layout / its regular twin's",
        "layouts[].ratio",
        ("layout",),
        drawn=Drawing("layouts", "odd / regular GB/s"),
        within_run=True,
    ),
    Measurement(
        "drive_temperature",
        "C",
        Direction.LOWER,
        Taken.DRIVE_HEALTH,
        "a drive's temperature, before or after the run, the hotter",
        "health.after.devices[].counters.temperature_C",
        ("device",),
    ),
    Measurement(
        "drive_written_ratio",
        "ratio",
        Direction.LOWER,
        Taken.DRIVE_HEALTH,
        "bytes the drives counted written during the run / the suite's",
        "health.written.ratio",
    ),
    Measurement(
        "drive_write_amplification",
        "ratio",
        Direction.LOWER,
        Taken.DRIVE_HEALTH,
        "NAND bytes / host bytes a drive wrote (OCP log)",
        "health.written.devices[].write_amplification",
        ("device",),
    ),
)
MEASUREMENTS: dict[str, Measurement] = {row.name: row for row in _ROWS}
LIMITED: tuple[str, ...] = tuple(row.name for row in _ROWS if row.limited)


def is_relative(measurement: str, relative_to: str | None) -> bool:
    """Whether a limit on `measurement` judges the target against itself: relative to a raw baseline of the run, or
    on a ratio of two figures of the run; otherwise it is absolute (a figure of the drive)."""
    row = MEASUREMENTS.get(measurement)
    return relative_to is not None or (row is not None and row.within_run)


def in_recorded_unit(name: str, value: float, unit: str) -> float:
    """`value`, given in `unit`, in the unit the table records measurement `name` in; an unknown name, or a unit
    of another kind, is a ValueError naming it."""
    if name not in MEASUREMENTS:
        raise ValueError(f"unknown measurement {name!r}; add a row for it to limits/measurements.py")
    row = MEASUREMENTS[name]
    return value if unit == row.unit else to_unit(value, unit, row.unit)


def taken_at(taken: Taken) -> list[Measurement]:
    """The measurements taken at `taken`, in the table's order."""
    return [row for row in _ROWS if row.taken is taken]


def drawn_on(figure: str) -> list[Measurement]:
    """The measurements the report draws on `figure`, in the table's order."""
    return [row for row in _ROWS if row.drawn is not None and row.drawn.figure == figure]


def axis_label(figure: str) -> str:
    """The value axis label of `figure`, as the table declares it for the measurements drawn there."""
    labels = {row.drawn.axis for row in drawn_on(figure) if row.drawn is not None}
    if len(labels) != 1:
        raise ValueError(f"figure {figure!r} has axis labels {sorted(labels)} in the table; give it exactly one")
    return labels.pop()


def field(row: Measurement) -> str:
    """The last key of the row's record path: the field a recorded item holds the value in (e.g. `GBps`)."""
    return row.record.rsplit(".", 1)[-1].removesuffix("[]")


def recorded(data: Mapping[str, Any], row: Measurement) -> list[float]:
    """Every value the run record `data` keeps at the row's record path, in order; [] where it holds none."""
    return [value for value in _walk(data, row.record.split(".")) if isinstance(value, int | float)]


def _walk(node: Any, keys: list[str]) -> Iterator[Any]:
    if not keys:
        yield node
        return
    key, many = keys[0].removesuffix("[]"), keys[0].endswith("[]")
    child = node.get(key) if isinstance(node, Mapping) else None
    if child is None:
        return
    for item in child if many and isinstance(child, list) else [] if many else [child]:
        yield from _walk(item, keys[1:])
