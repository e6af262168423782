"""Health from smartctl's JSON (`smartctl --json -a DEV`): ATA attributes for SATA drives, the error counter log
for SAS, and the NVMe health log where nvme-cli is not installed. smartctl's exit status is a bit mask: bits 0 and
1 mean it could not read the device at all (its messages say why). A field of another shape than smartctl prints
(a number where an object belongs, a string for a counter) makes the counters it holds unavailable, naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckptqual.host.health.reading import Reading
from ckptqual.host.health.tools import Output, Tools

ATA_ATTRIBUTES = {
    5: "reallocated_sectors",
    197: "pending_sectors",
    198: "offline_uncorrectable",
    241: "total_lbas_written",
}
NVME_LOG = {
    "critical_warning": "critical_warning",
    "available_spare": "available_spare_percent",
    "available_spare_threshold": "available_spare_threshold_percent",
    "percentage_used": "percentage_used",
    "data_units_written": "data_units_written",
    "data_units_read": "data_units_read",
    "host_writes": "host_write_commands",
    "host_reads": "host_read_commands",
    "media_errors": "media_errors",
    "num_err_log_entries": "error_log_entries",
    "unsafe_shutdowns": "unsafe_shutdowns",
    "power_on_hours": "power_on_hours",
    "warning_temp_time": "warning_temperature_minutes",
    "critical_comp_time": "critical_temperature_minutes",
    "temperature": "temperature_C",  # smartctl gives Celsius
}


def read(reading: Reading, node: Path, tools: Tools) -> None:
    parse(reading, tools.run("smartctl", "--json", "-a", node))


Counters = list[tuple[str, int]]
Path_ = tuple[str | int, ...]


class Shape(ValueError):
    """A field of smartctl's JSON holds a value of another type than smartctl prints there."""


def _at(data: Any, *keys: str | int, where: Path_ = ()) -> Any:
    """data[key][key]... (None where a key is absent); Shape naming the field where a level is not an object."""
    value = data
    for depth, key in enumerate(keys):
        if value is None:
            return None
        if not isinstance(value, dict):
            raise Shape(f"{_field((*where, *keys[:depth]))} = {_typed(value)} where smartctl prints an object")
        value = value.get(key)
    return value


def _whole(value: Any, where: Path_) -> int | None:
    """A counter smartctl printed as a whole number (None where absent); Shape where it is something else."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise Shape(f"{_field(where)} = {_typed(value)} where smartctl prints a whole number")


def _field(keys: Path_) -> str:
    return ".".join(map(str, keys)) or "the output"


def _typed(value: Any) -> str:
    """'5 (int)', '"hot" (str)': a value as a message names it, cut short."""
    return f"{json.dumps(value)[:40]} ({type(value).__name__})"


def parse(reading: Reading, output: Output) -> None:
    """Fills `reading` from one smartctl --json -a output; where smartctl could not read the device, or a field has
    another shape than smartctl's, says why for each counter it would have given."""
    data, why = _json(output)
    if data is None:
        reading.note_all(why)
        return
    for names, part in (
        (("smart_passed",), _smart_status),
        (("temperature_C",), _temperature),
        (tuple(ATA_ATTRIBUTES.values()), _ata),
        (("media_errors", "scsi_written_bytes"), _scsi),
        (tuple(NVME_LOG.values()), _nvme_log),
    ):
        try:
            found = part(data)
        except Shape as error:
            for name in names:
                reading.missing(name, f"{output.command} printed {error}")
            continue
        for name, value in found:
            reading.put(name, value, output.command)


def _smart_status(data: dict[str, Any]) -> Counters:
    passed = _at(data, "smart_status", "passed")
    return [] if passed is None else [("smart_passed", int(bool(passed)))]


def _temperature(data: dict[str, Any]) -> Counters:
    current = _whole(_at(data, "temperature", "current"), ("temperature", "current"))
    return [] if current is None else [("temperature_C", current)]


def _ata(data: dict[str, Any]) -> Counters:
    table = _at(data, "ata_smart_attributes", "table") or []
    if not isinstance(table, list):
        raise Shape(f"ata_smart_attributes.table = {_typed(table)} where smartctl prints a list")
    found = []
    for index, attribute in enumerate(table):
        where = ("ata_smart_attributes", "table", index)
        number = _whole(_at(attribute, "id", where=where), (*where, "id"))
        name = ATA_ATTRIBUTES.get(number) if number is not None else None
        raw = _whole(_at(attribute, "raw", "value", where=where), (*where, "raw", "value")) if name else None
        if name and raw is not None:
            found.append((name, raw))
    return found


def _scsi(data: dict[str, Any]) -> Counters:
    """The SAS error counter log: uncorrected errors of reads and writes, and the gigabytes written."""
    if not _at(data, "scsi_error_counter_log"):
        return []
    found = []
    where = ("scsi_error_counter_log",)
    uncorrected = [
        _whole(_at(data, *where, side, "total_uncorrected_errors"), (*where, side, "total_uncorrected_errors"))
        for side in ("read", "write")
    ]
    counted = [count for count in uncorrected if count is not None]
    if len(counted) == len(uncorrected):
        found.append(("media_errors", sum(counted)))
    processed = _at(data, *where, "write", "gigabytes_processed")
    if processed is not None:
        try:
            found.append(("scsi_written_bytes", round(float(processed) * 1e9)))
        except (TypeError, ValueError, OverflowError):
            raise Shape(
                f"{_field((*where, 'write', 'gigabytes_processed'))} = {_typed(processed)} where smartctl "
                "prints a number"
            ) from None
    return found


def _nvme_log(data: dict[str, Any]) -> Counters:
    where = ("nvme_smart_health_information_log",)
    log = _at(data, *where) or {}
    counters = [(name, _whole(_at(log, key, where=where), (*where, key))) for key, name in NVME_LOG.items()]
    return [(name, value) for name, value in counters if value is not None]


def _json(output: Output) -> tuple[dict[str, Any] | None, str]:
    """smartctl's JSON object, or None and why the device could not be read."""
    if output.reason:
        return None, output.reason
    try:
        data = json.loads(output.text or "")
    except json.JSONDecodeError:
        return None, f"{output.command} printed no JSON: {' '.join((output.text or '').split())[:200]}"
    try:
        if not isinstance(data, dict):
            raise Shape(f"the output = {_typed(data)} where smartctl prints an object")
        status = _whole(_at(data, "smartctl", "exit_status"), ("smartctl", "exit_status"))
        status = (output.status if status is None else status) or 0
        messages = _at(data, "smartctl", "messages") or []
        if status & 0b11:
            where = ("smartctl", "messages")
            texts = [str(_at(message, "string", where=(*where, index)) or "") for index, message in enumerate(messages)]
            return (
                None,
                f"{output.command} could not read the device (exit {status}): {'; '.join(texts) or 'no message'}",
            )
    except (Shape, TypeError) as error:
        return None, f"{output.command} printed {error}"
    return data, ""
