"""Judging the drive's own counters: health before against after the run, and the bytes the drive counted written
against the bytes the suite wrote. Pure functions over the snapshots that host/health takes.

Fixed rules fail the run (a critical warning that appears, new media errors, a temperature at or past the drive's
warning threshold, time spent there); a drive file adds limits on the measurements named in MEASURED.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptqual.host.health.reading import CRITICAL_WARNING_BITS
from ckptqual.limits.judgement import Judgement, judge
from ckptqual.limits.limits import Limit, Outcome
from ckptqual.limits.measurements import MEASUREMENTS, Taken, taken_at
from ckptqual.limits.verdict import Findings

DATA_UNIT_BYTES = 512_000  # NVMe: one data unit is 1,000 512-byte blocks, whatever the LBA format
SUBJECT = "drive health"
MEASURED = tuple(row.name for row in taken_at(Taken.DRIVE_HEALTH))
MEDIA_ERRORS = {
    "media_errors": "media and data-integrity errors",
    "reallocated_sectors": "reallocated sectors",
    "pending_sectors": "pending sectors",
    "offline_uncorrectable": "offline uncorrectable sectors",
}
_HEALTH_COUNTERS = ("critical_warning", "temperature_C", "smart_passed", *MEDIA_ERRORS)
NOTE = (
    "the drive counts what the host sent it (data units of 512,000 bytes); what the drive itself wrote to its NAND "
    "for it (write amplification) is not in this counter, only in a vendor log such as OCP's"
)


@dataclass(frozen=True)
class HealthCheck:
    """The judgements of the health measurements and the record of the check, outcome and message included."""

    judgements: list[Judgement]
    record: dict[str, Any]


def check_health(
    limits: Iterable[Limit], before: Mapping[str, Any], after: Mapping[str, Any], suite: Mapping[str, int]
) -> HealthCheck:
    """Before against after, and the bytes written two ways, judged by the fixed rules and the drive file's limits;
    SKIPPED (with every reason) where no device gave a health counter to judge."""
    pairs = list(_pairs(before, after))
    written = compare_written(pairs, suite)
    findings = Findings()
    for outcome, reason in health_findings(pairs):
        findings.add(outcome, reason)
    limits = list(limits)
    judgements = [
        j
        for name, value, unit, context in health_measurements(pairs, written)
        for j in judge(limits, name, value, unit, context, {})
    ]
    findings.add_judgements(judgements)
    readable = any(name in side["counters"] for pair in pairs for side in pair for name in _HEALTH_COUNTERS)
    if not readable and not any(j.verdict for j in judgements):
        outcome, message = Outcome.SKIPPED, f"{SUBJECT} SKIPPED: unavailable: {_why_unavailable(before, after)}"
    else:
        conclusion = findings.conclusion()
        outcome, message = conclusion.outcome, conclusion.message(SUBJECT)
    record = {"written": written, "outcome": str(outcome), "message": message}
    return HealthCheck(judgements, record)


def _pairs(before: Mapping[str, Any], after: Mapping[str, Any]) -> Iterable[tuple[dict, dict]]:
    """Each device's reading before and after (a device read only once is left out)."""
    earlier = {reading["device"]: reading for reading in before.get("devices", [])}
    for reading in after.get("devices", []):
        if reading["device"] in earlier:
            yield earlier[reading["device"]], reading


def _why_unavailable(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    reasons = []
    for reading in after.get("devices", []):
        unavailable = reading["unavailable"]
        reasons.append(
            f"{reading['device']}: {unavailable.get('critical_warning') or unavailable.get('temperature_C')}"
        )
    return "; ".join(reasons) or after.get("unavailable") or before.get("unavailable") or "no device was read"


def _delta(pair: tuple[dict, dict], name: str) -> int | None:
    first, last = (side["counters"].get(name) for side in pair)
    return last - first if first is not None and last is not None else None


def health_findings(pairs: Iterable[tuple[dict, dict]]) -> list[tuple[Outcome, str]]:
    """The fixed rules, each finding in one line naming the device and the counts."""
    found: list[tuple[Outcome, str]] = []
    for first, last in pairs:
        device, was, now = last["device"], first["counters"], last["counters"]
        if "critical_warning" in was and "critical_warning" in now:
            new = now["critical_warning"] & ~was["critical_warning"]
            if new:
                flags = ", ".join(_flags(new))
                found.append((Outcome.FAIL, f"{device}: critical warning appeared during the run: {flags}"))
            elif now["critical_warning"]:
                flags = ", ".join(_flags(now["critical_warning"]))
                found.append((Outcome.MARGINAL, f"{device}: critical warning set before the run already: {flags}"))
        for name, what in MEDIA_ERRORS.items():
            grew = _delta((first, last), name)
            if grew:
                found.append((Outcome.FAIL, f"{device}: {grew} new {what} during the run ({was[name]} -> {now[name]})"))
        found += _temperature_findings(device, first, last)
        if was.get("smart_passed") == 1 and now.get("smart_passed") == 0:
            found.append((Outcome.FAIL, f"{device}: the drive's SMART self-assessment failed during the run"))
    return found


def _flags(bits: int) -> list[str]:
    return [text for bit, text in enumerate(CRITICAL_WARNING_BITS) if bits >> bit & 1]


def _temperature_findings(device: str, first: dict, last: dict) -> list[tuple[Outcome, str]]:
    found = []
    now = last["counters"]
    warning = now.get("warning_temperature_threshold_C")
    if warning is not None and now.get("temperature_C", -273) >= warning:
        found.append(
            (
                Outcome.FAIL,
                f"{device}: temperature {now['temperature_C']} C after the run, at or past the "
                f"drive's warning threshold {warning} C",
            )
        )
    for name, level in (("warning_temperature_minutes", "warning"), ("critical_temperature_minutes", "critical")):
        minutes = _delta((first, last), name)
        if minutes:
            found.append(
                (
                    Outcome.FAIL,
                    f"{device}: {minutes} min at or past the drive's {level} temperature threshold during the run",
                )
            )
    return found


def compare_written(pairs: Iterable[tuple[dict, dict]], suite: Mapping[str, int]) -> dict[str, Any]:
    """Bytes written during the run two ways: counted by each drive (NVMe data units x 512,000 bytes; a SAS
    drive's write GB) and by the suite, with their ratio; the block layer's count and OCP write amplification
    beside them where there are."""
    suite_bytes = suite.get("total_bytes", 0)
    devices = [_device_written(pair) for pair in pairs]
    result: dict[str, Any] = {"suite_written_bytes": suite_bytes, "suite_parts": dict(suite), "devices": devices}
    drive = [d["drive_written_bytes"] for d in devices]
    if devices and all(count is not None for count in drive):
        result["drive_written_bytes"] = sum(drive)
        result["ratio"] = sum(drive) / suite_bytes if suite_bytes else None
    else:
        missing = [f"{d['device']}: {d['drive_unavailable']}" for d in devices if d["drive_written_bytes"] is None]
        result["drive_written_bytes"] = result["ratio"] = None
        result["unavailable"] = "; ".join(missing) or "no device was read before and after the run"
    block = [d["block_layer_written_bytes"] for d in devices]
    if devices and all(count is not None for count in block):
        result["block_layer_written_bytes"] = sum(block)
        result["block_layer_ratio"] = sum(block) / suite_bytes if suite_bytes else None
    result["note"] = NOTE
    return result


def _device_written(pair: tuple[dict, dict]) -> dict[str, Any]:
    last = pair[1]
    entry: dict[str, Any] = {"device": last["device"], "drive_written_bytes": None}
    units = _delta(pair, "data_units_written")
    scsi = _delta(pair, "scsi_written_bytes")
    if units is not None:
        entry["drive_written_bytes"] = units * DATA_UNIT_BYTES
    elif scsi is not None:
        entry["drive_written_bytes"] = scsi
    elif "total_lbas_written" in last["counters"]:
        entry["drive_unavailable"] = "ATA attribute 241 counts in a vendor-specific unit; not converted to bytes"
    else:
        entry["drive_unavailable"] = last["unavailable"].get("data_units_written", "the drive gave no write count")
    entry["block_layer_written_bytes"] = _delta(pair, "block_layer_written_bytes")
    nand = _delta(pair, "physical_media_written_bytes")
    entry["nand_written_bytes"] = nand
    host = entry["drive_written_bytes"]
    entry["write_amplification"] = nand / host if nand is not None and host else None
    if nand is None:
        entry["write_amplification_unavailable"] = (
            last["unavailable"].get("physical_media_written_bytes")
            or entry.get("drive_unavailable")
            or "the drive gave no NAND write count"
        )
    return entry


def health_measurements(
    pairs: Iterable[tuple[dict, dict]], written: Mapping[str, Any]
) -> list[tuple[str, float, str, dict[str, Any]]]:
    """(name, value, unit, context) of what a drive file may limit: the hotter temperature of each device, the
    drive-counted to suite-written ratio, each device's write amplification."""
    measured = []
    for first, last in pairs:
        temperatures = [
            side["counters"]["temperature_C"] for side in (first, last) if "temperature_C" in side["counters"]
        ]
        if temperatures:
            measured.append(_measured("drive_temperature", float(max(temperatures)), {"device": last["device"]}))
    if written.get("ratio") is not None:
        measured.append(_measured("drive_written_ratio", written["ratio"], {}))
    for device in written.get("devices", []):
        if device.get("write_amplification") is not None:
            context = {"device": device["device"]}
            measured.append(_measured("drive_write_amplification", device["write_amplification"], context))
    return measured


def _measured(name: str, value: float, context: dict[str, Any]) -> tuple[str, float, str, dict[str, Any]]:
    return name, value, MEASUREMENTS[name].unit, context
