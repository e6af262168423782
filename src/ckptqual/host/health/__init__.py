"""The drive's own health counters before and after a run: nvme-cli's JSON for NVMe (the SMART / health log,
Identify Controller's temperature thresholds, OCP's cloud SSD log for NAND writes), smartctl's JSON for SATA and
SAS (and NVMe without nvme-cli), sysfs where the kernel exposes a counter. A counter that cannot be read is listed
under "unavailable" with the reason; none is ever guessed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ckptqual.host.health import nvme, smartctl, sysfs
from ckptqual.host.health.reading import Reading
from ckptqual.host.health.tools import Tools
from ckptqual.host.identity import SYS, DriveIdentity, PhysicalDevice

DEV = Path("/dev")


def snapshot(
    identity: DriveIdentity, *, sys_root: Path = SYS, dev_root: Path = DEV, tools: Tools | None = None
) -> dict[str, Any]:
    """One reading of every physical device under the target, with when it was taken and which tools were found."""
    tools = tools if tools is not None else Tools.find()
    devices = [read_device(device, sys_root=sys_root, dev_root=dev_root, tools=tools) for device in identity.physical]
    data: dict[str, Any] = {"taken": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "tools": tools.to_dict()}
    data["devices"] = [reading.to_dict() for reading in devices]
    if not identity.physical:
        data["unavailable"] = identity.physical_reason or "no physical device under the target"
    return data


def read_device(device: PhysicalDevice, *, sys_root: Path, dev_root: Path, tools: Tools) -> Reading:
    """The health of one physical device, from the best source there is for its kind, then sysfs."""
    reading = Reading(device.name, device.kind)
    if device.kind == "nvme":
        nvme.read(reading, device, dev_root, tools)
        if "data_units_written" not in reading.counters and tools.smartctl:
            smartctl.read(reading, dev_root / (device.nvme_controller or device.name), tools)
    elif device.kind in ("ata", "scsi"):
        smartctl.read(reading, dev_root / device.name, tools)
    elif device.kind == "virtio":
        reading.note_all(f"{device.name} is a virtio disk: the hypervisor gives the guest no SMART or health log")
        smartctl.read(reading, dev_root / device.name, tools)
    else:
        reading.note_all(f"{device.name} is a {device.kind} block device, not a drive: it has no health log")
    sysfs.read(reading, device, sys_root)
    reading.close()
    return reading
