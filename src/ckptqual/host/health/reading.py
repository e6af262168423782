"""One device's health reading: the counters read, each with the source it came from, and every expected counter
that could not be read with the reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The counters a reading may hold, by name: unit and meaning. NVMe names follow the SMART / health log page.
COUNTERS: dict[str, str] = {
    "critical_warning": "bits: 0 spare below threshold, 1 temperature, 2 reliability degraded, 3 read-only, "
    "4 volatile backup failed, 5 persistent memory read-only",
    "temperature_C": "composite temperature, degrees Celsius",
    "warning_temperature_threshold_C": "the drive's warning composite temperature threshold (WCTEMP), Celsius",
    "critical_temperature_threshold_C": "the drive's critical composite temperature threshold (CCTEMP), Celsius",
    "warning_temperature_minutes": "minutes spent at or above the warning threshold",
    "critical_temperature_minutes": "minutes spent at or above the critical threshold",
    "available_spare_percent": "remaining spare capacity, percent",
    "available_spare_threshold_percent": "the spare level at which the drive warns, percent",
    "percentage_used": "estimate of the endurance used, percent (may exceed 100)",
    "data_units_written": "units of 1,000 512-byte blocks the host wrote (512,000 bytes each)",
    "data_units_read": "units of 1,000 512-byte blocks the host read",
    "host_write_commands": "write commands completed",
    "host_read_commands": "read commands completed",
    "media_errors": "unrecovered data-integrity errors",
    "error_log_entries": "error information log entries over the drive's life",
    "unsafe_shutdowns": "shutdowns without a shutdown notification",
    "power_on_hours": "hours powered on",
    "physical_media_written_bytes": "bytes written to the NAND (OCP cloud SSD log)",
    "physical_media_read_bytes": "bytes read from the NAND (OCP cloud SSD log)",
    "smart_passed": "1 when the drive's overall SMART self-assessment passed, 0 when it failed",
    "reallocated_sectors": "ATA attribute 5, reallocated sectors",
    "pending_sectors": "ATA attribute 197, sectors waiting to be reallocated",
    "offline_uncorrectable": "ATA attribute 198, sectors that could not be read",
    "total_lbas_written": "ATA attribute 241, raw (its unit is vendor-specific)",
    "scsi_written_bytes": "bytes the SAS drive processed for writes (error counter log, GB x 1e9)",
    "block_layer_written_bytes": "bytes the kernel's block layer wrote to the device (all writers, sysfs stat)",
    "block_layer_read_bytes": "bytes the kernel's block layer read from the device (sysfs stat)",
}
CRITICAL_WARNING_BITS = (
    "available spare below threshold",
    "temperature past a threshold",
    "reliability degraded",
    "read-only",
    "volatile memory backup failed",
    "persistent memory region read-only",
)
# What a reading of each kind is expected to hold; each one not read is listed as unavailable with the reason.
EXPECTED: dict[str, tuple[str, ...]] = {
    "nvme": (
        "critical_warning",
        "temperature_C",
        "warning_temperature_threshold_C",
        "critical_temperature_threshold_C",
        "warning_temperature_minutes",
        "critical_temperature_minutes",
        "available_spare_percent",
        "available_spare_threshold_percent",
        "percentage_used",
        "data_units_written",
        "data_units_read",
        "host_write_commands",
        "host_read_commands",
        "media_errors",
        "error_log_entries",
        "unsafe_shutdowns",
        "physical_media_written_bytes",
    ),
    "ata": ("smart_passed", "temperature_C", "reallocated_sectors", "pending_sectors", "offline_uncorrectable"),
    "scsi": ("smart_passed", "temperature_C", "media_errors", "scsi_written_bytes"),
}
_GENERIC = ("critical_warning", "temperature_C", "media_errors", "data_units_written")


@dataclass
class Reading:
    """Counters read from one device, where each came from, and why the others could not be read."""

    device: str
    kind: str
    counters: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # what was read -> how (the command or sysfs file)
    unavailable: dict[str, str] = field(default_factory=dict)
    _default_reason: list[str] = field(default_factory=list, init=False, repr=False)

    def put(self, name: str, value: int, source: str) -> None:
        """Keeps a counter read from `source` unless a better source already gave it."""
        if name not in COUNTERS:
            raise ValueError(f"unknown health counter {name!r}")
        if name not in self.counters:
            self.counters[name] = value
            self.unavailable.pop(name, None)
            self.sources.setdefault(name, source)

    def missing(self, name: str, reason: str) -> None:
        """Why `name` could not be read (the first reason is kept)."""
        if name not in self.counters:
            self.unavailable.setdefault(name, reason)

    def note_all(self, reason: str) -> None:
        """A reason that holds for every expected counter not read otherwise."""
        self._default_reason.append(reason)

    def close(self) -> None:
        """Lists every expected counter that was not read, with the reasons gathered."""
        why = "; ".join(self._default_reason) or "no source gave it"
        for name in EXPECTED.get(self.kind, _GENERIC):
            self.missing(name, why)

    @property
    def critical_warning_flags(self) -> list[str] | None:
        value = self.counters.get("critical_warning")
        if value is None:
            return None
        return [text for bit, text in enumerate(CRITICAL_WARNING_BITS) if value >> bit & 1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "kind": self.kind,
            "counters": dict(self.counters),
            "critical_warning_flags": self.critical_warning_flags,
            "sources": dict(self.sources),
            "unavailable": dict(self.unavailable),
        }
