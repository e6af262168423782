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
from typing import TYPE_CHECKING, Any

from ckptqual.bounded import load_toml
from ckptqual.config.table import PARTS, SETTINGS, Setting
from ckptqual.config.values import TEXT, Kind, SettingsError, choice, list_of, size, whole
from ckptqual.documents import checker, problem
from ckptqual.io.readers import TRANSFERS
from ckptqual.limits.limits import BASELINES, DRIVE_STATES, Limit, limits_for
from ckptqual.limits.measurements import LIMITED, MEASUREMENTS
from ckptqual.limits.units import UNITS, format_size, unit_kind
from ckptqual.resources import named_files, read_text_file, resolve

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

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
    "min": {"type": "number", "exclusiveMinimum": 0,
            "expected": "a finite number > 0 (a minimum of 0 or less passes anything)",
            "fix": "give the least the drive must reach, or remove the limit"},
    "max": {"type": "number", "exclusiveMinimum": 0,
            "expected": "a finite number > 0 (nothing measures at or under a maximum of 0)",
            "fix": "give the most the drive may take, or remove the limit"},
}  # fmt: skip
# Parts whose tests a selection can leave out (the baseline runs before any of them, never alone).
REQUIRABLE = tuple(part for part in PARTS if part != "baseline")
_TEXT = {"type": "string", "pattern": r"\S", "expected": "a non-empty string"}


def _table(properties: dict[str, Any], required: tuple[str, ...], label: str) -> dict[str, Any]:
    """A table of a drive file with these keys, `required` among them, and no other."""
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False,
            "expected": f"a table, written as {label}",
            "fix": {"required": f"add it to {label}", "additionalProperties": f"remove it from {label}"}}  # fmt: skip


_LIMIT = checker(
    _table(
        {
            "name": {"enum": list(LIMITED)},
            **_BOUNDS,
            "unit": {"type": "string"},
            "marginal": {
                "type": "number",
                "minimum": 0,
                "exclusiveMaximum": 1,
                "expected": "a fraction with 0 <= marginal < 1",
            },
            "where": {
                "type": "object",
                "minProperties": 1,
                "expected": "a table of context keys such as { pass = [2, 3] }",
            },
            "relative_to": {"enum": list(BASELINES)},
            "at_full_scale": {"type": "boolean"},
            "source": _TEXT,
        },
        ("name", "unit", "source"),
        "a [[limit]] block",
    )
)
_VERDICT = _table(
    {"requires": {"type": "array", "items": {"enum": list(REQUIRABLE)}, "minItems": 1, "uniqueItems": True,
                  "expected": 'a non-empty list of parts, each listed once, e.g. requires = ["fill", "restore"]'}},
    ("requires",),
    "[verdict]",
)  # fmt: skip
_DRIVE = _table(
    {"name": _TEXT, "description": _TEXT, "capacity_bytes": {"type": "integer", "minimum": 1}, "source": _TEXT},
    ("name",),
    "[drive]",
)


def _structure(table: tuple[Setting, ...]) -> Validator:
    """The tables of a drive file and their keys; the settings' values are checked by their kinds (config.table)."""
    sections: dict[str, Any] = {}
    for row in table:
        if row.section:
            sections.setdefault(row.section, {})[row.file_key] = {}
    return checker(
        {
            "type": "object",
            "properties": {
                "drive": _DRIVE,
                **{name: _table(keys, (), f"[{name}]") for name, keys in sections.items()},
                "verdict": _VERDICT,
                "limit": {
                    "type": "array",
                    "items": {"type": "object"},
                    "expected": "[[limit]] blocks (an array of tables), not [limit]",
                },
            },
            "required": ["drive"],
            "additionalProperties": False,
            "fix": {"required": 'add [drive] with name = "..."', "additionalProperties": "remove it"},
        }
    )


def _error(path: Path, where: str, value: Any, problem_text: str) -> SettingsError:
    """The line of a value its kind refused (a setting's, or a limit's `where`, whose keys depend on its measurement):
    the file, the key and its value, and why."""
    return SettingsError(f"{path}: {where} = {value!r}: {problem_text}")


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


def _check_unit(path: Path, where: str, name: str, unit: str, relative_to: str | None) -> None:
    kind = MEASUREMENTS[name].kind
    hint = "one of " + ", ".join(known for known, (of, _) in UNITS.items() if of == kind)
    hint = f"{hint}, or ratio with relative_to" if kind == "throughput" else hint
    if unit not in UNITS:
        raise SettingsError(f"{path}: {where}.unit: unknown unit {unit!r} for {name}; use {hint}")
    if relative_to is not None:
        if kind != "throughput":
            raise SettingsError(f"{path}: {where}.relative_to: {name} is a {kind}, not a throughput; remove it")
        if unit != "ratio":
            raise SettingsError(f"{path}: {where}.unit: a relative limit is a ratio; set unit = 'ratio', not {unit!r}")
    elif unit_kind(unit) != kind:
        raise SettingsError(f"{path}: {where}.unit: unit {unit!r} does not suit {name}, a {kind}; use {hint}")


def _limit(path: Path, index: int, data: dict[str, Any]) -> Limit:
    where = f"limit[{index}]"
    wrong = problem(_LIMIT, data, where)
    if wrong:
        raise SettingsError(f"{path}: {wrong}")
    name, relative_to = data["name"], data.get("relative_to")
    if ("min" in data) == ("max" in data):
        raise SettingsError(f"{path}: {where}: give exactly one of min = ... or max = ...")
    _check_unit(path, where, name, data["unit"], relative_to)
    at_full_scale = data.get("at_full_scale", False)
    if at_full_scale and MEASUREMENTS[name].kind != "duration":
        raise SettingsError(
            f"{path}: {where}.at_full_scale: applies to durations only, and {name} is not one; remove it"
        )
    try:
        selectors = _where(name).check(data["where"]) if "where" in data else ()
    except ValueError as error:
        raise _error(path, f"{where}.where", data["where"], str(error)) from None
    return Limit(
        measurement=name,
        unit=data["unit"],
        source=data["source"],
        min=float(data["min"]) if "min" in data else None,
        max=float(data["max"]) if "max" in data else None,
        marginal=float(data.get("marginal", 0.0)),
        where=selectors,
        relative_to=relative_to,
        at_full_scale=at_full_scale,
        number=index,
    )


def _settings(path: Path, data: dict[str, Any], table: tuple[Setting, ...]) -> dict[str, Any]:
    """The values of the table's sections, by setting name, each checked by its kind."""
    values = {}
    for row in table:
        if row.section and row.file_key in data.get(row.section, {}):
            value = data[row.section][row.file_key]
            try:
                values[row.name] = row.kind.check(value)
            except ValueError as error:
                raise _error(path, f"{row.section}.{row.file_key}", value, str(error)) from None
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
    requires = tuple(data["verdict"]["requires"])
    never = next((part for part in requires if part not in parts), None)
    if never is not None:
        raise SettingsError(
            f"{path}: verdict.requires: {never} is required, but [run] parts leaves it out, so it never runs; add "
            f"{never} to [run] parts or remove it from requires"
        )
    return requires, True


def _parse(path: Path, data: dict[str, Any], table: tuple[Setting, ...]) -> DriveFile:
    wrong = problem(_structure(table), data)
    if wrong:
        raise SettingsError(f"{path}: {wrong}")
    drive = data["drive"]
    info = DriveInfo(**{key: drive.get(key) for key in ("name", "description", "capacity_bytes", "source")})
    values = _settings(path, data, table)
    limits = tuple(_limit(path, index, block) for index, block in enumerate(data.get("limit", []), 1))
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
