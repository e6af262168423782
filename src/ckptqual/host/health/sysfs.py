"""Health counters the kernel itself exposes in sysfs: an NVMe controller's temperature and thresholds through
hwmon (drivers/nvme/host/hwmon.c, millidegrees Celsius), and every block device's own count of sectors the block
layer read and wrote (the `stat` file; 512-byte sectors whatever the device's block size)."""

from __future__ import annotations

from pathlib import Path

from ckptqual.host.health.reading import Reading
from ckptqual.host.identity import PhysicalDevice

HWMON = {
    "temp1_input": "temperature_C",
    "temp1_max": "warning_temperature_threshold_C",
    "temp1_crit": "critical_temperature_threshold_C",
}


def read(reading: Reading, device: PhysicalDevice, sys_root: Path) -> None:
    if device.kind == "nvme" and device.nvme_controller:
        _hwmon(reading, sys_root / "class" / "nvme" / device.nvme_controller)
    stat = sys_root / "class" / "block" / device.name / "stat"
    try:
        fields = stat.read_text().split()
    except OSError as error:
        for name in ("block_layer_written_bytes", "block_layer_read_bytes"):
            reading.missing(name, f"{stat}: {error.strerror}")
        return
    reading.put("block_layer_read_bytes", int(fields[2]) * 512, str(stat))
    reading.put("block_layer_written_bytes", int(fields[6]) * 512, str(stat))


def _hwmon(reading: Reading, controller: Path) -> None:
    """The composite temperature and its thresholds from the controller's hwmon device, where the kernel has one."""
    found = sorted(controller.glob("hwmon*/temp1_input"))
    if not found:
        reading.missing("temperature_C", f"the kernel exposes no hwmon temperature under {controller}")
        return
    for name, counter in HWMON.items():
        path = found[0].parent / name
        try:
            millidegrees = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        reading.put(counter, round(millidegrees / 1000), str(path))
