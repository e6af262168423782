"""Threshold files: a drive's run settings and declared limits, validated on load; verdicts on measurements.

A limit is data, declared like an OpenHTF measurement: name, unit, bound, marginal band and the source of its
number (REFERENCE section 7). Absent settings load as None so that callers can overlay their own, in DCGM's
order: packaged file < user file < command line. Messages number the `[[limit]]` blocks from 1.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ckptqual.config.resources import named_files, resolve


class ThresholdError(ValueError):
    """A threshold file that cannot be used; the one-line message names file, key, problem and fix."""


class MissingBaselineError(ValueError):
    """A relative limit was evaluated without the baseline it is relative to."""


class Outcome(StrEnum):
    """The outcome of a check or of a whole test. A limit gives PASS, MARGINAL or FAIL; the rest come from the
    suite: NOT_STEADY (SNIA rule not met), INVALID (the figure measured the host, not the drive), and for a test
    that did not conclude: ERROR (it broke), SKIPPED, NOT_RUN (an earlier failure), INTERRUPTED."""

    PASS = "PASS"
    MARGINAL = "MARGINAL"
    FAIL = "FAIL"
    NOT_STEADY = "NOT_STEADY"
    INVALID = "INVALID"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    NOT_RUN = "NOT_RUN"
    INTERRUPTED = "INTERRUPTED"


# unit -> (kind, factor to the kind's base unit: bytes/s, seconds, or 1 for a ratio)
UNITS: dict[str, tuple[str, float]] = {
    "GB/s": ("throughput", 1e9),
    "GiB/s": ("throughput", 2**30),
    "MB/s": ("throughput", 1e6),
    "MiB/s": ("throughput", 2**20),
    "B/s": ("throughput", 1.0),
    "s": ("duration", 1.0),
    "ms": ("duration", 1e-3),
    "min": ("duration", 60.0),
    "ratio": ("ratio", 1.0),
}
BASELINES = ("raw_write", "raw_read")
ENGINES = ("stream", "torch-save")
TRANSFERS = ("gpu-direct", "cpu-gpu", "cpu-only")
DRIVE_STATES = ("fresh", "steady")  # fill pass 1 runs on the fresh drive, later passes in steady state
_SIZE_FACTORS = {"K": 2**10, "M": 2**20, "G": 2**30}
_SIZE_PATTERN = re.compile(r"([1-9][0-9]*)([KMG]?)")


def unit_kind(unit: str) -> str:
    """The kind of `unit`: "throughput", "duration" or "ratio"."""
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    return UNITS[unit][0]


def to_unit(value: float, from_unit: str, target_unit: str) -> float:
    """`value` given in `from_unit`, expressed in `target_unit` of the same kind (e.g. GiB/s to GB/s)."""
    if unit_kind(from_unit) != unit_kind(target_unit):
        kinds = f"{unit_kind(from_unit)} to {unit_kind(target_unit)}"
        raise ValueError(f"cannot convert {from_unit} to {target_unit}: {kinds}")
    return value * UNITS[from_unit][1] / UNITS[target_unit][1]


def parse_size(text: str) -> int:
    """Bytes of a size string: a positive integer, optionally with binary K, M or G ("128K" = 131072)."""
    match = _SIZE_PATTERN.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a size: {text!r}; write an integer, optionally with K, M or G, e.g. '128K'")
    number, suffix = match.groups()
    return int(number) * _SIZE_FACTORS.get(suffix, 1)


def format_size(nbytes: int) -> str:
    """`nbytes` with the largest of G, M, K that divides it exactly; the inverse of parse_size."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"a size must be a positive integer number of bytes, got {nbytes!r}")
    for suffix, factor in reversed(_SIZE_FACTORS.items()):
        if nbytes % factor == 0:
            return f"{nbytes // factor}{suffix}"
    return str(nbytes)


# Converters: each checks one TOML value and returns it, or raises ValueError with the problem and the fix.
Converter = Callable[[Any], Any]


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def _integer(minimum: int) -> Converter:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"must be an integer >= {minimum}, got {value!r}")
        return value

    return convert


def _number(check: Callable[[float], bool], expected: str) -> Converter:
    def convert(value: Any) -> float:
        number = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
        if not (number and check(value)):
            raise ValueError(f"must be {expected}, got {value!r}")
        return float(value)

    return convert


def _choice(options: Mapping[str, Any] | tuple[str, ...], noun: str) -> Converter:
    def convert(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError(f"unknown {noun} {value!r}; use one of {', '.join(options)}")
        return value

    return convert


def _size(value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError:
        raise ValueError(f"must be a size such as '128K' or '1M' (binary K, M or G), got {value!r}") from None


def _canonical_size(value: Any) -> str:
    canonical = format_size(_size(value))
    if value != canonical:
        raise ValueError(f"write {canonical!r}, not {value!r}, to match the sweep's block size labels")
    return value


def _list_of(item: Converter) -> Converter:
    def convert(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list) or not value:
            raise ValueError(f"must be a non-empty list, got {value!r}")
        items = []
        for index, element in enumerate(value, 1):
            try:
                items.append(item(element))
            except ValueError as exc:
                raise ValueError(f"item {index}: {exc}") from None
        if len(set(items)) != len(items):
            raise ValueError(f"lists a value twice in {value!r}; list each once")
        return tuple(items)

    return convert


_FRACTION = _number(lambda f: 0 < f <= 1, "a number with 0 < value <= 1")
_NON_NEGATIVE = _number(lambda v: v >= 0, "a finite number >= 0")
_MARGINAL = _number(lambda m: 0 <= m < 1, "a fraction with 0 <= marginal < 1")


@dataclass(frozen=True)
class Measurement:
    """A measurement a limit may name: its kind, what it is, and the context keys `where` may select on."""

    kind: str
    doc: str
    context: Mapping[str, Converter] = field(default_factory=dict)


_PASS_CONTEXT: dict[str, Converter] = {"pass": _integer(1), "state": _choice(DRIVE_STATES, "drive state")}
_SWEEP_CONTEXT: dict[str, Converter] = {
    "transfer": _choice(TRANSFERS, "transfer"),
    "block_size": _canonical_size,
    "threads": _integer(1),
}

MEASUREMENTS: dict[str, Measurement] = {
    "fill_throughput": Measurement("throughput", "total bytes / total time of one fill pass", _PASS_CONTEXT),
    "fill_mean_checkpoint_throughput": Measurement(
        "throughput", "mean of the per-checkpoint rates of one fill pass", _PASS_CONTEXT
    ),
    "fill_checkpoint_seconds_mean": Measurement("duration", "mean time to write a checkpoint", _PASS_CONTEXT),
    "fill_checkpoint_seconds_max": Measurement("duration", "slowest checkpoint of a pass", _PASS_CONTEXT),
    "restore_throughput": Measurement(
        "throughput", "total bytes / total time of reading checkpoints back", _PASS_CONTEXT
    ),
    "sweep_read_bandwidth": Measurement("throughput", "read bandwidth of one sweep cell", _SWEEP_CONTEXT),
    "layout_throughput_ratio": Measurement(
        "ratio", "throughput of an odd layout / that of the regular layout", {"layout": _string}
    ),
}

Scalar = str | int | float
Where = tuple[tuple[str, tuple[Scalar, ...]], ...]


def _number_text(value: float, digits: int = 4) -> str:
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


def _distinct_texts(a: float, b: float) -> tuple[str, str]:
    """Both numbers printed with enough digits that different values never print alike."""
    for digits in (4, 6, 9):
        texts = _number_text(a, digits), _number_text(b, digits)
        if texts[0] != texts[1] or a == b:
            break
    return texts


def _where_text(where: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in where.items())


@dataclass(frozen=True)
class Verdict:
    """A measurement judged against one limit; `comparator` is what the limit requires (">=" or "<=")."""

    outcome: Outcome
    measured: float
    limit: float
    unit: str
    comparator: str
    message: str


@dataclass(frozen=True)
class Limit:
    """A declared bound on a measurement: at least `min` or at most `max`, in `unit`, with a marginal band."""

    measurement: str
    unit: str
    source: str
    min: float | None = None
    max: float | None = None
    marginal: float = 0.0
    where: Where = ()
    relative_to: str | None = None
    at_full_scale: bool = False
    number: int = 0  # its place among the file's [[limit]] blocks, from 1

    @property
    def bound(self) -> float:
        return self.min if self.min is not None else self.max

    @property
    def comparator(self) -> str:
        return ">=" if self.min is not None else "<="

    def matches(self, context: Mapping[str, Any]) -> bool:
        """Whether a measurement with `context` is selected: it has every `where` key, with a listed value."""
        return all(key in context and context[key] in values for key, values in self.where)

    def describe(self) -> str:
        """The requirement for reports, e.g. `>= 2.37 GB/s` or `>= 0.25 of raw_write`."""
        text = f"{self.comparator} {_number_text(self.bound)} {self._unit_text()}"
        return f"{text} at full scale" if self.at_full_scale else text

    def title(self) -> str:
        """The limit in one line for a person: number, measurement, requirement and selection."""
        where = _where_text(self.to_dict()["where"])
        return f"limit {self.number} ({self.measurement} {self.describe()}{f' where {where}' if where else ''})"

    def to_dict(self) -> dict[str, Any]:
        """The limit as JSON-ready data, keyed like the threshold file (`name` becomes `measurement`)."""
        return {
            "number": self.number,
            "measurement": self.measurement,
            "min": self.min,
            "max": self.max,
            "unit": self.unit,
            "marginal": self.marginal,
            "where": {key: values[0] if len(values) == 1 else list(values) for key, values in self.where},
            "relative_to": self.relative_to,
            "at_full_scale": self.at_full_scale,
            "source": self.source,
        }

    def evaluate(
        self,
        value: float,
        unit: str,
        *,
        baselines: Mapping[str, float] | None = None,
        scale: float = 1.0,
        context: Mapping[str, Any] | None = None,
    ) -> Verdict:
        """Judge `value` in `unit`; a relative limit divides it by `baselines[relative_to]`, given in bytes per
        second (B/s); an at_full_scale bound is multiplied by `scale`. `context` only labels the message."""
        measured, basis = self._measured(value, unit, baselines)
        bound, scaling = self._scaled_bound(scale)
        outcome = self._outcome(measured, bound)
        selector = _where_text(context if context is not None else self.to_dict()["where"])
        message = self._message(outcome, measured, bound, [basis, scaling, selector])
        return Verdict(outcome, measured, bound, self.unit, self.comparator, message)

    def _unit_text(self) -> str:
        return f"of {self.relative_to}" if self.relative_to else self.unit

    def _measured(self, value: float, unit: str, baselines: Mapping[str, float] | None) -> tuple[float, str]:
        if not math.isfinite(value):
            raise ValueError(f"{self.measurement}: measured value {value!r} is not a finite number")
        if self.relative_to is None:
            return to_unit(value, unit, self.unit), ""
        if unit_kind(unit) != "throughput":
            raise ValueError(f"{self.measurement}: a relative limit needs a throughput, got {unit}")
        baseline = (baselines or {}).get(self.relative_to)
        if baseline is None:
            raise MissingBaselineError(
                f"{self.measurement}: the limit is relative to {self.relative_to}, but no such baseline was "
                f"given; measure it on the same target and pass baselines={{'{self.relative_to}': ...}}"
            )
        if not (math.isfinite(baseline) and baseline > 0):
            raise ValueError(f"{self.measurement}: baseline {self.relative_to} must be > 0, got {baseline!r}")
        baseline_in_unit = to_unit(baseline, "B/s", unit)
        basis = f"{_number_text(value)} {unit} / {self.relative_to} {_number_text(baseline_in_unit)} {unit}"
        return to_unit(value, unit, "B/s") / baseline, basis

    def _scaled_bound(self, scale: float) -> tuple[float, str]:
        if not self.at_full_scale:
            return self.bound, ""
        if not 0 < scale <= 1:
            raise ValueError(f"{self.measurement}: scale must be in (0, 1], got {scale!r}")
        return self.bound * scale, f"scale {scale:g} x {_number_text(self.bound)} {self.unit} at full scale"

    def _outcome(self, measured: float, bound: float) -> Outcome:
        if self.min is not None:
            if measured < bound:
                return Outcome.FAIL
            return Outcome.MARGINAL if measured < bound * (1 + self.marginal) else Outcome.PASS
        if measured > bound:
            return Outcome.FAIL
        return Outcome.MARGINAL if measured > bound * (1 - self.marginal) else Outcome.PASS

    def _message(self, outcome: Outcome, measured: float, bound: float, notes: list[str]) -> str:
        relation = self.comparator
        if outcome is Outcome.FAIL:
            relation = "<" if self.min is not None else ">"
        measured_text, bound_text = _distinct_texts(measured, bound)
        side = "min" if self.min is not None else "max"
        band = f", within the {self.marginal * 100:g} % marginal band" if outcome is Outcome.MARGINAL else ""
        details = "; ".join(note for note in [*notes, f"source: {self.source}"] if note)
        unit = self._unit_text()
        comparison = f"{measured_text} {unit} {relation} {side} {bound_text} {unit}"
        return f"{self.measurement} {comparison}{band} ({details})"


@dataclass(frozen=True)
class DriveInfo:
    """Which drive a threshold file is for, and where its figures come from."""

    name: str
    description: str | None = None
    capacity_bytes: int | None = None
    source: str | None = None


@dataclass(frozen=True)
class RunDefaults:
    """Defaults of a qualification run; None where the file leaves the choice to the caller."""

    workload: str | None = None
    scale: float | None = None
    engine: str | None = None
    checkpoints_per_pass: int | None = None
    fill_fraction: float | None = None
    passes: int | None = None
    require_steady_state: bool | None = None


@dataclass(frozen=True)
class SweepSettings:
    """The read-sweep matrix (gdsio-like); block sizes in bytes, labelled elsewhere with format_size."""

    block_sizes_bytes: tuple[int, ...] | None = None
    threads: tuple[int, ...] | None = None
    jobs: int | None = None
    batch: int | None = None
    file_bytes: int | None = None
    transfers: tuple[str, ...] | None = None


@dataclass(frozen=True)
class LayoutSettings:
    """How many odd checkpoint layouts Hypothesis tries, from which seed, and how large each may be."""

    examples: int | None = None
    seed: int | None = None
    max_total_bytes: int | None = None


@dataclass(frozen=True)
class Thresholds:
    """A loaded, validated threshold file."""

    path: Path
    drive: DriveInfo
    run: RunDefaults
    sweep: SweepSettings
    layouts: LayoutSettings
    limits: tuple[Limit, ...]

    def limits_for(self, measurement: str, context: Mapping[str, Any]) -> list[Limit]:
        """The limits on `measurement` whose `where` selects `context`."""
        if measurement not in MEASUREMENTS:
            raise ValueError(f"unknown measurement {measurement!r}; known: {', '.join(MEASUREMENTS)}")
        return [limit for limit in self.limits if limit.measurement == measurement and limit.matches(context)]


class _Table:
    """One TOML table of a threshold file; `get` turns a problem into a ThresholdError naming file and key."""

    def __init__(self, path: Path, prefix: str, data: Any, known: tuple[str, ...], label: str) -> None:
        self.path, self.prefix, self.label = path, prefix, label
        if not isinstance(data, dict):
            raise self.error("", f"must be a table, got {data!r}; write it as {label}")
        for key in data:
            if key not in known:
                raise self.error(key, f"unknown key in {label}; known keys: {', '.join(known)}")
        self.data = data

    def error(self, key: str, problem: str) -> ThresholdError:
        name = ".".join(part for part in (self.prefix, key) if part)
        return ThresholdError(f"{self.path}: {name}: {problem}")

    def get(self, key: str, convert: Converter, *, required: bool = False) -> Any:
        if key not in self.data:
            if required:
                raise self.error(key, f"missing; add {key} = ... to {self.label}")
            return None
        try:
            return convert(self.data[key])
        except ValueError as exc:
            raise self.error(key, str(exc)) from None


_SECTIONS = {
    "drive": ("name", "description", "capacity_bytes", "source"),
    "run": ("workload", "scale", "engine", "checkpoints_per_pass", "fill_fraction", "passes", "require_steady_state"),
    "sweep": ("block_sizes", "threads", "jobs", "batch", "file_bytes", "transfers"),
    "layouts": ("examples", "seed", "max_total_bytes"),
}
_LIMIT_KEYS = ("name", "min", "max", "unit", "marginal", "where", "relative_to", "at_full_scale", "source")
_UNIT_HINTS = {
    "throughput": "one of GB/s, GiB/s, MB/s, MiB/s, B/s, or ratio with relative_to",
    "duration": "one of s, ms, min",
    "ratio": "ratio",
}


def _drive(table: _Table) -> DriveInfo:
    return DriveInfo(
        name=table.get("name", _string, required=True),
        description=table.get("description", _string),
        capacity_bytes=table.get("capacity_bytes", _integer(1)),
        source=table.get("source", _string),
    )


def _run(table: _Table) -> RunDefaults:
    run = RunDefaults(
        workload=table.get("workload", _string),
        scale=table.get("scale", _FRACTION),
        engine=table.get("engine", _choice(ENGINES, "engine")),
        checkpoints_per_pass=table.get("checkpoints_per_pass", _integer(1)),
        fill_fraction=table.get("fill_fraction", _FRACTION),
        passes=table.get("passes", _integer(1)),
        require_steady_state=table.get("require_steady_state", _flag),
    )
    if run.checkpoints_per_pass is not None and run.fill_fraction is not None:
        raise table.error("fill_fraction", "give checkpoints_per_pass or fill_fraction, not both; remove one")
    return run


def _sweep(table: _Table) -> SweepSettings:
    return SweepSettings(
        block_sizes_bytes=table.get("block_sizes", _list_of(_size)),
        threads=table.get("threads", _list_of(_integer(1))),
        jobs=table.get("jobs", _integer(1)),
        batch=table.get("batch", _integer(1)),
        file_bytes=table.get("file_bytes", _integer(1)),
        transfers=table.get("transfers", _list_of(_choice(TRANSFERS, "transfer"))),
    )


def _layouts(table: _Table) -> LayoutSettings:
    return LayoutSettings(
        examples=table.get("examples", _integer(0)),
        seed=table.get("seed", _integer(0)),
        max_total_bytes=table.get("max_total_bytes", _integer(1)),
    )


def _where(name: str) -> Converter:
    context = MEASUREMENTS[name].context

    def convert(value: Any) -> Where:
        if not isinstance(value, dict) or not value:
            raise ValueError(f"must be a table of context keys such as {{ pass = [2, 3] }}, got {value!r}")
        selectors = []
        for key, selected in value.items():
            if key not in context:
                known = ", ".join(context) or "none"
                raise ValueError(f"unknown context key {key!r} for {name}; use one of: {known}")
            values = selected if isinstance(selected, list) else [selected]
            try:
                selectors.append((key, _list_of(context[key])(values)))
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
        return tuple(selectors)

    return convert


def _check_unit(table: _Table, name: str, unit: str, relative_to: str | None) -> None:
    kind = MEASUREMENTS[name].kind
    if unit not in UNITS:
        raise table.error("unit", f"unknown unit {unit!r} for {name}; use {_UNIT_HINTS[kind]}")
    if relative_to is not None:
        if kind != "throughput":
            raise table.error("relative_to", f"{name} is a {kind}, not a throughput; remove it")
        if unit != "ratio":
            raise table.error("unit", f"a relative limit is a ratio; set unit = 'ratio', not {unit!r}")
    elif unit_kind(unit) != kind:
        raise table.error("unit", f"unit {unit!r} does not suit {name}, a {kind}; use {_UNIT_HINTS[kind]}")


def _limit(path: Path, index: int, data: Any) -> Limit:
    table = _Table(path, f"limit[{index}]", data, _LIMIT_KEYS, f"[[limit]] number {index}")
    name = table.get("name", _choice(MEASUREMENTS, "measurement"), required=True)
    bounds = {side: table.get(side, _NON_NEGATIVE) for side in ("min", "max")}
    if (bounds["min"] is None) == (bounds["max"] is None):
        raise table.error("", "give exactly one of min = ... or max = ...")
    unit = table.get("unit", _string, required=True)
    relative_to = table.get("relative_to", _choice(BASELINES, "baseline"))
    _check_unit(table, name, unit, relative_to)
    at_full_scale = table.get("at_full_scale", _flag) or False
    if at_full_scale and MEASUREMENTS[name].kind != "duration":
        raise table.error("at_full_scale", f"applies to durations only, and {name} is not one; remove it")
    return Limit(
        measurement=name,
        unit=unit,
        source=table.get("source", _string, required=True),
        min=bounds["min"],
        max=bounds["max"],
        marginal=table.get("marginal", _MARGINAL) or 0.0,
        where=table.get("where", _where(name)) or (),
        relative_to=relative_to,
        at_full_scale=at_full_scale,
        number=index,
    )


def _limits(path: Path, data: Any) -> tuple[Limit, ...]:
    if not isinstance(data, list):
        raise ThresholdError(f"{path}: limit: must be [[limit]] blocks (an array of tables), not [limit]")
    return tuple(_limit(path, index, item) for index, item in enumerate(data, 1))


def _parse(path: Path, data: dict[str, Any]) -> Thresholds:
    for key in data:
        if key not in _SECTIONS and key != "limit":
            sections = "[drive], [run], [sweep], [layouts], [[limit]]"
            raise ThresholdError(f"{path}: {key}: unknown section or key; a threshold file has {sections}")
    if "drive" not in data:
        raise ThresholdError(f'{path}: drive: missing section [drive]; add [drive] with name = "..."')
    tables = {key: _Table(path, key, data.get(key, {}), keys, f"[{key}]") for key, keys in _SECTIONS.items()}
    return Thresholds(
        path=path,
        drive=_drive(tables["drive"]),
        run=_run(tables["run"]),
        sweep=_sweep(tables["sweep"]),
        layouts=_layouts(tables["layouts"]),
        limits=_limits(path, data.get("limit", [])),
    )


def available_drives() -> list[str]:
    """Names of the packaged threshold files."""
    return sorted(named_files("thresholds"))


def load_thresholds(name_or_path: str) -> Thresholds:
    """The threshold file of a packaged drive name or a path to a .toml file, fully validated."""
    try:
        path = resolve(name_or_path, "thresholds", "drive")
    except (LookupError, FileNotFoundError) as exc:
        raise ThresholdError(str(exc)) from exc
    try:
        with path.open("rb") as stream:
            data = tomllib.load(stream)
    except tomllib.TOMLDecodeError as exc:
        raise ThresholdError(f"{path}: not valid TOML: {exc}; fix the syntax there") from exc
    return _parse(path, data)
