"""NVMe health from nvme-cli's JSON: `nvme smart-log` (the SMART / health log), `nvme id-ctrl` (the temperature
thresholds) and `nvme ocp smart-add-log` (OCP's cloud SSD log: NAND bytes written, where the drive has it).

nvme-cli's JSON differs by version: temperatures in kelvin; `critical_warning` a number, or an object with `value`
under --verbose and in 2.11; 128-bit counters as numbers or strings; OCP keys in words (log version 1) or snake
case (version 2). Every one of these is parsed; a key that is absent is reported unavailable, never taken as 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckptqual.host.health.reading import Reading
from ckptqual.host.health.tools import Output, Tools, failure
from ckptqual.host.identity import PhysicalDevice

KELVIN = 273
# smart-log key -> counter; temperatures are converted from kelvin.
SMART_LOG = {
    "critical_warning": "critical_warning",
    "temperature": "temperature_C",
    "avail_spare": "available_spare_percent",
    "spare_thresh": "available_spare_threshold_percent",
    "percent_used": "percentage_used",
    "data_units_written": "data_units_written",
    "data_units_read": "data_units_read",
    "host_write_commands": "host_write_commands",
    "host_read_commands": "host_read_commands",
    "media_errors": "media_errors",
    "num_err_log_entries": "error_log_entries",
    "unsafe_shutdowns": "unsafe_shutdowns",
    "power_on_hours": "power_on_hours",
    "warning_temp_time": "warning_temperature_minutes",
    "critical_comp_time": "critical_temperature_minutes",
}
ID_CTRL = {"wctemp": "warning_temperature_threshold_C", "cctemp": "critical_temperature_threshold_C"}
OCP_WRITTEN = ("Physical media units written", "physical_media_units_written")
OCP_READ = ("Physical media units read", "physical_media_units_read")


def read(reading: Reading, device: PhysicalDevice, dev_root: Path, tools: Tools) -> None:
    """Fills `reading` from nvme-cli run on the device's controller (the health log is the controller's)."""
    node = dev_root / (device.nvme_controller or device.name)
    smart = tools.run("nvme", "smart-log", node, "-o", "json")
    parse_smart_log(reading, smart)
    parse_id_ctrl(reading, tools.run("nvme", "id-ctrl", node, "-o", "json"))
    if smart.reason is None:  # nvme-cli is there: ask for the vendor log too
        parse_ocp(reading, tools.run("nvme", "ocp", "smart-add-log", node, "-o", "json"))
    else:
        reading.missing("physical_media_written_bytes", smart.reason)


def parse_smart_log(reading: Reading, output: Output) -> None:
    data, why = _json(output)
    for key, name in SMART_LOG.items():
        if data is None:
            reading.missing(name, why)
            continue
        value = _integer(data.get(key), key)
        if value is None:
            reading.missing(name, _not_a_counter(output, data, key))
        else:
            reading.put(name, value - KELVIN if key == "temperature" else value, output.command)


def parse_id_ctrl(reading: Reading, output: Output) -> None:
    data, why = _json(output)
    for key, name in ID_CTRL.items():
        value = _integer(data.get(key), key) if data is not None else None
        if value:  # 0 means the drive reports no such threshold
            reading.put(name, value - KELVIN, output.command)
        elif data is None:
            reading.missing(name, why)
        else:
            reading.missing(
                name, f"{output.command} reports {key} = 0" if value == 0 else _not_a_counter(output, data, key)
            )


def parse_ocp(reading: Reading, output: Output) -> None:
    data, why = _json(output)
    if data is None:
        reading.missing("physical_media_written_bytes", f"no OCP cloud SSD log: {why}")
        return
    for keys, name in ((OCP_WRITTEN, "physical_media_written_bytes"), (OCP_READ, "physical_media_read_bytes")):
        value = next((data[key] for key in keys if key in data), None)
        if isinstance(value, dict) and {"hi", "lo"} <= value.keys():
            hi, lo = _integer(value["hi"], "hi"), _integer(value["lo"], "lo")
            value = hi << 64 | lo if hi is not None and lo is not None else None
        if isinstance(value, int) and not isinstance(value, bool):
            reading.put(name, value, output.command)
        else:
            present = next((key for key in keys if key in data), None)
            why = _not_a_counter(output, data, present) if present else f"{output.command} gave no {keys[0]!r}"
            reading.missing(name, why)


def _not_a_counter(output: Output, data: dict[str, Any], key: str) -> str:
    """Why `key` of nvme-cli's JSON gave no counter: absent (naming the keys there), or of another shape."""
    if key not in data:
        return f"{output.command} gave no {key} (keys: {', '.join(sorted(data)) or 'none'})"
    shown = json.dumps(data[key])[:40]
    return f"{output.command} printed {key} = {shown} ({type(data[key]).__name__}) where nvme-cli prints a number"


def _json(output: Output) -> tuple[dict[str, Any] | None, str]:
    """The object nvme-cli printed, or None and why there is none."""
    why = failure(output)
    if why is not None or output.text is None:  # failure() names any output without text
        return None, why or f"{output.command} printed nothing"
    try:
        data = json.loads(output.text)
    except json.JSONDecodeError as error:
        return None, f"{output.command} printed no JSON: {error}"
    return (data, "") if isinstance(data, dict) else (None, f"{output.command} printed {type(data).__name__}")


def _integer(value: Any, key: str = "") -> int | None:
    """A counter as nvme-cli prints it: a number, a numeric string, or an object holding `value`."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):  # exact only up to 2^53: a larger float is no longer the drive's number
        return int(value) if value.is_integer() and abs(value) <= 2**53 else None
    if isinstance(value, str):
        text = value.strip().replace(",", "")
        return int(text) if text.isdigit() else None
    return value if isinstance(value, int) else None
