"""Health from smartctl's JSON (`smartctl --json -a DEV`): ATA attributes for SATA drives, the error counter log
for SAS, and the NVMe health log where nvme-cli is not installed. smartctl's exit status is a bit mask: bits 0 and
1 mean it could not read the device at all (its messages say why)."""

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


def parse(reading: Reading, output: Output) -> None:
    """Fills `reading` from one smartctl --json -a output; if smartctl could not read the device, says why."""
    data, why = _json(output)
    if data is None:
        reading.note_all(why)
        return
    source = output.command
    if "smart_status" in data and "passed" in data["smart_status"]:
        reading.put("smart_passed", int(bool(data["smart_status"]["passed"])), source)
    current = data.get("temperature", {}).get("current")
    if isinstance(current, int):
        reading.put("temperature_C", current, source)
    for attribute in data.get("ata_smart_attributes", {}).get("table", []):
        name = ATA_ATTRIBUTES.get(attribute.get("id"))
        raw = attribute.get("raw", {}).get("value")
        if name and isinstance(raw, int):
            reading.put(name, raw, source)
    errors = data.get("scsi_error_counter_log")
    if errors:
        uncorrected = [errors.get(side, {}).get("total_uncorrected_errors") for side in ("read", "write")]
        if all(isinstance(count, int) for count in uncorrected):
            reading.put("media_errors", sum(uncorrected), source)
        processed = errors.get("write", {}).get("gigabytes_processed")
        if processed is not None:
            reading.put("scsi_written_bytes", round(float(processed) * 1e9), source)
    log = data.get("nvme_smart_health_information_log", {})
    for key, name in NVME_LOG.items():
        if isinstance(log.get(key), int):
            reading.put(name, log[key], source)


def _json(output: Output) -> tuple[dict[str, Any] | None, str]:
    """smartctl's JSON object, or None and why the device could not be read."""
    if output.reason:
        return None, output.reason
    try:
        data = json.loads(output.text or "")
    except json.JSONDecodeError:
        return None, f"{output.command} printed no JSON: {' '.join((output.text or '').split())[:200]}"
    status = data.get("smartctl", {}).get("exit_status", output.status) or 0
    if status & 0b11:
        messages = [m.get("string", "") for m in data.get("smartctl", {}).get("messages", [])]
        return (
            None,
            f"{output.command} could not read the device (exit {status}): {'; '.join(messages) or 'no message'}",
        )
    return data, ""
