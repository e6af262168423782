"""Drive files (thresholds/<drive>.toml), read once: [drive], the settings table's sections, [verdict] (the parts the
verdict requires) and [[limit]] blocks.

Every key is checked on load; a problem is one SettingsError naming the file, the key, the value and the fix.
Messages number the `[[limit]]` blocks from 1.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptqual.bounded import load_toml
from ckptqual.config.table import PARTS, SETTINGS, Setting
from ckptqual.config.values import FLAG, TEXT, KeyTable, Kind, SettingsError, choice, list_of, number, size, whole
from ckptqual.io.readers import TRANSFERS
from ckptqual.limits.limits import BASELINES, DRIVE_STATES, Limit, limits_for
from ckptqual.limits.measurements import LIMITED, MEASUREMENTS
from ckptqual.limits.units import UNITS, format_size, unit_kind
from ckptqual.resources import named_files, read_text_file, resolve

MAX_FILE_BYTES = 1 << 20  # a drive file is a few dozen limits


@dataclass(frozen=True)
class DriveInfo:
    """Which drive a drive file is for, and where its figures come from."""

    name: str
    description: str | None = None
    capacity_bytes: int | None = None
    source: str | None = None


@dataclass(frozen=True)
class DriveFile:
    """A loaded, checked drive file: the drive, the settings it gives (by setting name) and its limits."""

    path: Path
    drive: DriveInfo
    values: Mapping[str, Any]
    limits: tuple[Limit, ...]
    requires: tuple[str, ...] = ()  # the parts without which the verdict cannot be QUALIFIED
    requires_stated: bool = True  # False: [verdict] requires is absent, so every part of [run] parts is required

    @property
    def requires_origin(self) -> str:
        """Where the required parts come from, for the verdict's reasons."""
        if self.requires_stated:
            return f"required by {self.path.name} [verdict] requires"
        return f"{self.path.name} states no [verdict] requires, so every part of its [run] parts is required"

    def limits_for(self, measurement: str, context: Mapping[str, Any]) -> list[Limit]:
        return limits_for(self.limits, measurement, context)


def _canonical_size(value: Any) -> str:
    canonical = format_size(size().check(value))
    if value != canonical:
        raise ValueError(f"write {canonical!r} to match the sweep's block size labels")
    return value


_CONTEXT: dict[str, Kind] = {
    "pass": whole(1),
    "state": choice(DRIVE_STATES, "drive state"),
    "transfer": choice(TRANSFERS, "transfer"),
    "block_size": Kind(lambda v: isinstance(v, str), "must be a size such as '1M'", _canonical_size),
    "threads": whole(1),
    "layout": TEXT,
}
# A bound of 0 measures nothing: every figure passes a minimum of 0, none passes a maximum of 0.
_BOUNDS = {
    "min": number(lambda v: v > 0, "a finite number > 0 (a minimum of 0 or less passes anything); give the least the "
                  "drive must reach, or remove the limit"),
    "max": number(lambda v: v > 0, "a finite number > 0 (nothing measures at or under a maximum of 0); give the most "
                  "the drive may take, or remove the limit"),
}  # fmt: skip
# Parts whose tests a selection can leave out (the baseline runs before any of them, never alone).
REQUIRABLE = tuple(part for part in PARTS if part != "baseline")
_REQUIRES = Kind(
    lambda v: isinstance(v, list) and bool(v),
    'must be a non-empty list of parts, e.g. requires = ["fill", "restore"]',
    item=choice(REQUIRABLE, "part"),
)
_MARGINAL = number(lambda m: 0 <= m < 1, "a fraction with 0 <= marginal < 1")
_DRIVE_KEYS = {"name": TEXT, "description": TEXT, "capacity_bytes": whole(1), "source": TEXT}
_LIMIT_KEYS = ("name", "min", "max", "unit", "marginal", "where", "relative_to", "at_full_scale", "source")


def _where(name: str) -> Kind:
    context = MEASUREMENTS[name].context

    def selectors_of(value: dict[str, Any]) -> tuple[tuple[str, tuple[Any, ...]], ...]:
        selectors = []
        for key, selected in value.items():
            if key not in context:
                raise ValueError(f"unknown context key {key!r} for {name}; use one of: {', '.join(context)}")
            try:
                selectors.append(
                    (key, list_of(_CONTEXT[key]).check(selected if isinstance(selected, list) else [selected]))
                )
            except ValueError as error:
                raise ValueError(f"{key}: {error}") from None
        return tuple(selectors)

    problem = "must be a table of context keys such as { pass = [2, 3] }"
    return Kind(lambda v: isinstance(v, dict) and bool(v), problem, selectors_of)


def _check_unit(table: KeyTable, name: str, unit: str, relative_to: str | None) -> None:
    kind = MEASUREMENTS[name].kind
    hint = "one of " + ", ".join(known for known, (of, _) in UNITS.items() if of == kind)
    hint = f"{hint}, or ratio with relative_to" if kind == "throughput" else hint
    if unit not in UNITS:
        raise table.error("unit", f"unknown unit {unit!r} for {name}; use {hint}")
    if relative_to is not None:
        if kind != "throughput":
            raise table.error("relative_to", f"{name} is a {kind}, not a throughput; remove it")
        if unit != "ratio":
            raise table.error("unit", f"a relative limit is a ratio; set unit = 'ratio', not {unit!r}")
    elif unit_kind(unit) != kind:
        raise table.error("unit", f"unit {unit!r} does not suit {name}, a {kind}; use {hint}")


def _limit(path: Path, index: int, data: Any) -> Limit:
    table = KeyTable(path, f"limit[{index}]", data, _LIMIT_KEYS, f"[[limit]] number {index}")
    name = table.get("name", choice(LIMITED, "measurement"), required=True)
    bounds = {side: table.get(side, kind) for side, kind in _BOUNDS.items()}
    if (bounds["min"] is None) == (bounds["max"] is None):
        raise table.error("", "give exactly one of min = ... or max = ...")
    unit = table.get("unit", TEXT, required=True)
    relative_to = table.get("relative_to", choice(BASELINES, "baseline"))
    _check_unit(table, name, unit, relative_to)
    at_full_scale = table.get("at_full_scale", FLAG) or False
    if at_full_scale and MEASUREMENTS[name].kind != "duration":
        raise table.error("at_full_scale", f"applies to durations only, and {name} is not one; remove it")
    return Limit(
        measurement=name,
        unit=unit,
        source=table.get("source", TEXT, required=True),
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
        raise SettingsError(f"{path}: limit: must be [[limit]] blocks (an array of tables), not [limit]")
    return tuple(_limit(path, index, item) for index, item in enumerate(data, 1))


def _settings(path: Path, data: dict[str, Any], table: tuple[Setting, ...]) -> dict[str, Any]:
    """The values of the table's sections, by setting name."""
    values = {}
    for section in dict.fromkeys(row.section for row in table if row.section):
        rows = [row for row in table if row.section == section]
        keys = KeyTable(path, section, data.get(section, {}), (row.file_key for row in rows), f"[{section}]")
        values |= {row.name: keys.get(row.file_key, row.kind) for row in rows if row.file_key in keys.data}
    if "checkpoints_per_pass" in values and "fill_fraction" in values:
        raise SettingsError(
            f"{path}: run.fill_fraction: give checkpoints_per_pass or fill_fraction, not both; remove one"
        )
    return values


def _requires(path: Path, data: dict[str, Any], parts: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """The parts the verdict requires and whether the file states them; absent, every part of `parts` it can leave
    out is required. A required part that [run] parts leaves out could never run: refused."""
    if "verdict" not in data:
        return tuple(part for part in parts if part in REQUIRABLE), False
    table = KeyTable(path, "verdict", data["verdict"], ("requires",), "[verdict]")
    requires = table.get("requires", _REQUIRES, required=True)
    never = next((part for part in requires if part not in parts), None)
    if never is not None:
        raise table.error(
            "requires", f"{never} is required, but [run] parts leaves it out, so it never runs; add {never} to "
            f"[run] parts or remove it from requires"
        )  # fmt: skip
    return requires, True


def _parse(path: Path, data: dict[str, Any], table: tuple[Setting, ...]) -> DriveFile:
    sections = dict.fromkeys(row.section for row in table if row.section)
    KeyTable(path, "", data, ["drive", *sections, "verdict", "limit"], "a drive file")
    if "drive" not in data:
        raise SettingsError(f'{path}: drive: missing section [drive]; add [drive] with name = "..."')
    drive = KeyTable(path, "drive", data["drive"], _DRIVE_KEYS, "[drive]")
    info = DriveInfo(**{key: drive.get(key, kind, required=key == "name") for key, kind in _DRIVE_KEYS.items()})
    values, limits = _settings(path, data, table), _limits(path, data.get("limit", []))
    relative = next((limit for limit in limits if limit.relative_to), None)
    if relative is not None and "baseline" not in values.get("parts", ("baseline",)):
        raise SettingsError(
            f"{path}: limit[{relative.number}].relative_to: {relative.relative_to} is measured by the raw baseline, "
            f"which [run] parts leaves out; add baseline to parts or give an absolute limit"
        )
    requires, stated = _requires(path, data, tuple(values.get("parts", PARTS)))
    return DriveFile(path, info, values, limits, requires, stated)


def available_drives() -> list[str]:
    """Names of the packaged drive files."""
    return sorted(named_files("thresholds"))


def load_drive_file(name_or_path: str, table: Iterable[Setting] = SETTINGS) -> DriveFile:
    """The drive file of a packaged drive name or a path to a .toml file, fully checked."""
    try:
        path = resolve(name_or_path, "thresholds", "drive")
    except (LookupError, FileNotFoundError) as error:
        raise SettingsError(str(error)) from error
    try:
        data = load_toml(read_text_file(path, MAX_FILE_BYTES))
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"{path}: not valid TOML: {error}; fix the syntax there") from error
    except ValueError as error:
        raise SettingsError(f"{path}: {error}") from None
    return _parse(path, data, tuple(table))
