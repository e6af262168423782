"""Raw sequential write and read on the target at the start of a run: the yardstick of relative limits.

Measured with the same ranks and chunk size as the checkpoints, repeated, and summarised by the median,
because a shared disk varies about 2x from one run to the next (docs/facts.md).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ckptqual.faults import RunError
from ckptqual.host import cache, device_bytes
from ckptqual.host.beneath import RunTree
from ckptqual.host.device_bytes import DeviceBytes, Devices
from ckptqual.limits.cache_served import cache_served_reason
from ckptqual.limits.host_bound import host_bound_reason
from ckptqual.runs import raw
from ckptqual.runs.pool import Pool
from ckptqual.runs.timing import CheckpointTiming


@dataclass
class Baseline:
    """Raw sequential rates measured on the target (GB/s, 1e9 bytes per second)."""

    bytes_per_round: int
    write_GBps: list[float] = field(default_factory=list)
    read_GBps: list[float] = field(default_factory=list)
    cached_before_read: list[float] = field(default_factory=list)
    host: dict[str, list[dict]] = field(default_factory=lambda: {"write": [], "read": []})  # per round (HostUse)
    device: dict[str, list[DeviceBytes]] = field(default_factory=lambda: {"write": [], "read": []})  # per round

    @property
    def raw_write_GBps(self) -> float:
        return statistics.median(self.write_GBps)

    @property
    def raw_read_GBps(self) -> float:
        return statistics.median(self.read_GBps)

    def as_baselines(self) -> dict[str, float]:
        """The values that limits with `relative_to` refer to, in bytes per second."""
        return {"raw_write": self.raw_write_GBps * 1e9, "raw_read": self.raw_read_GBps * 1e9}

    def invalid(self) -> dict[str, str]:
        """Each baseline a cache served in any round (limits.cache_served), with why: a limit relative to it is not
        judged."""
        reasons: dict[str, str] = {}
        for kind, name in (("write", "raw_write"), ("read", "raw_read")):
            for number, count in enumerate(self.device[kind], start=1):
                reason = cache_served_reason(f"raw {kind} {number}", count)
                if reason:
                    reasons.setdefault(name, reason)
        return reasons

    def to_dict(self) -> dict:
        return {
            "bytes_per_round": self.bytes_per_round,
            "write_GBps": self.write_GBps,
            "read_GBps": self.read_GBps,
            "cached_fraction_before_read": self.cached_before_read,
            "raw_write_GBps": self.raw_write_GBps,
            "raw_read_GBps": self.raw_read_GBps,
            "host": self.host,
            "device": {kind: [count.to_dict() for count in rounds] for kind, rounds in self.device.items()},
            "invalid": self.invalid(),
        }


def measure_baseline(
    pool: Pool,
    tree: RunTree,
    directory: Path,
    total_bytes: int,
    remove: Callable[[Path, str], None],
    repeats: int = 3,
    devices: Devices | None = None,
) -> Baseline:
    """Writes then cold-reads `total_bytes` split over the ranks in `directory` (in `tree`), `repeats` times, counting
    what `devices` (default: those under `directory`'s parent) moved meanwhile; `remove(directory, what)` removes its
    files after each round."""
    devices = devices if devices is not None else device_bytes.devices_under(directory.parent)
    per_rank = -(-total_bytes // pool.ranks)
    baseline = Baseline(per_rank * pool.ranks)
    options = {"bytes_per_rank": per_rank}
    try:
        for round_number in range(repeats):
            with device_bytes.counted(devices) as count:
                written = pool.run("raw-write", directory, None, f"raw write {round_number + 1}", options=options)
            baseline.write_GBps.append(written.bytes / written.seconds / 1e9)
            baseline.host["write"].append(_host(written))
            baseline.device["write"].append(count.of(written.bytes, "written", written.nodes))
            files = [raw.raw_path(directory, rank) for rank in range(pool.ranks)]
            baseline.cached_before_read.append(cache.evict_all(tree, files))
            below = devices.evict_below()
            with device_bytes.counted(devices) as count:
                read = pool.run("raw-read", directory, None, f"raw read {round_number + 1}", options=options)
            baseline.read_GBps.append(read.bytes / read.seconds / 1e9)
            baseline.host["read"].append(_host(read))
            baseline.device["read"].append(count.of(read.bytes, "read", read.nodes, below))
            remove(directory, f"removing the raw files of round {round_number + 1}")
    finally:
        with contextlib.suppress(RunError):  # recorded by the remover; never hides the failure that matters
            remove(directory, "removing the raw files")
    return baseline


def _host(timing: CheckpointTiming) -> dict:
    """A round's use of the host, its CPU seconds per GB and whether it was host-bound (limits.host_bound)."""
    extra = {"cpu_s_per_GB": timing.host.cpu_s_per_GB(timing.bytes), "host_bound": host_bound_reason(timing.host)}
    return timing.host.to_dict() | extra
