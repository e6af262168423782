"""How many cores this run may use, and what the host did during a timed region: how busy the CPUs this run may
use were (any process, the kernel included) and how busy the target's block device was, beside the CPU seconds the
working processes report.

Read from /proc (affinity, cgroup, /proc/stat per CPU), cgroupfs (the CPU quota) and the block device's sysfs stat
file (io_ticks); nothing here touches the drive under test, so sampling never waits on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ckptqual.host.waits import Waits

# /proc/stat columns after the name: user nice system idle iowait irq softirq steal (guest is inside user).
_IDLE_COLUMNS = (3, 4)
_COUNTED_COLUMNS = 8


@dataclass(frozen=True)
class HostUse:
    """A timed region's use of the host: `work_cpu_s` user+system CPU seconds of the working processes over
    `wall_s`, on `cores` usable cores that were `cpu_busy` busy (0-1), and the drive's busy share (None: unknown);
    and the working processes' own threads (host.waits): seconds on a CPU, seconds runnable but waiting for one, the
    largest share of its time any one process's threads waited, and seconds blocked on block I/O (None: not kept)."""

    wall_s: float
    work_cpu_s: float
    cores: int
    cpu_busy: float
    device: str | None
    device_busy: float | None
    threads_run_s: float | None = None
    threads_wait_s: float | None = None
    wait_share: float | None = None
    io_blocked_s: float | None = None

    def waited(self, waits: Iterable[Waits]) -> HostUse:
        """This use with the waits of the working processes, one Waits each (none: unchanged)."""
        waits = list(waits)
        if not waits:
            return self
        blocked = [w.io_blocked_s for w in waits]
        return replace(
            self,
            threads_run_s=sum(w.run_s for w in waits),
            threads_wait_s=sum(w.wait_s for w in waits),
            wait_share=max(w.wait_share for w in waits),
            io_blocked_s=None if None in blocked else sum(blocked),  # type: ignore[arg-type]
        )

    @property
    def work_cores(self) -> float:
        """Cores the working processes kept busy on average."""
        return self.work_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def cpu_s_per_GB(self, nbytes: int) -> float:
        """CPU seconds the working processes spent per 1e9 bytes moved."""
        return self.work_cpu_s / (nbytes / 1e9) if nbytes > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "work_cores": self.work_cores}


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), in order."""
    return sorted(os.sched_getaffinity(0))


# Where cgroupfs is mounted, below the root: cgroup v2 alone, or v2 beside v1 (hybrid); v1 controllers by name.
_V2_MOUNTS = ("sys/fs/cgroup", "sys/fs/cgroup/unified")
_V1_MOUNT = "sys/fs/cgroup"


def usable_cores(root: Path = Path("/")) -> float:
    """The cores this process may keep busy: its CPUs (affinity), capped by its cgroup's CPU quota (which may be
    fractional: a quota of 150 ms per 100 ms is 1.5 cores). `root`: where /proc and /sys are (a test lays out a
    tree like them)."""
    quota = cgroup_quota_cores(root)
    cpus = float(len(usable_cpus()))
    return min(cpus, quota) if quota is not None else cpus


def cgroup_quota_cores(root: Path = Path("/")) -> float | None:
    """The tightest CPU quota, in cores, of this process's cgroup and its ancestors, from cgroup v2 `cpu.max` or v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us` under `root`; None where no quota is set or none can be read."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if not controllers:  # "0::/path": cgroup v2
            quotas += [_v2_quota(root / mount, path) for mount in _V2_MOUNTS]
        elif "cpu" in controllers.split(","):
            quotas += [_v1_quota(root / _V1_MOUNT / name, path) for name in (controllers, "cpu")]
    found = [quota for quota in quotas if quota is not None]
    return min(found) if found else None


def _levels(mount: Path, path: str) -> list[Path]:
    """The directories of cgroup `path` and its ancestors under `mount` that exist there (a container sees its own
    cgroup as the mount's root, so the deeper ones may be missing)."""
    parts = [part for part in path.split("/") if part]
    levels = [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [level for level in levels if level.is_dir()]


def _v2_quota(mount: Path, path: str) -> float | None:
    """The tightest `cpu.max` ("max 100000" or "150000 100000": quota and period in microseconds) on the path."""
    quotas = []
    for level in _levels(mount, path):
        try:
            quota, period = (level / "cpu.max").read_text().split()
        except (OSError, ValueError):
            continue
        if quota != "max":
            quotas.append(_cores(quota, period, level / "cpu.max"))
    return min(quotas) if quotas else None


def _v1_quota(mount: Path, path: str) -> float | None:
    """The tightest `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us` on the path."""
    quotas = []
    for level in _levels(mount, path):
        try:
            quota = (level / "cpu.cfs_quota_us").read_text().strip()
            period = (level / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            continue
        if quota != "-1":
            quotas.append(_cores(quota, period, level / "cpu.cfs_quota_us"))
    return min(quotas) if quotas else None


def _cores(quota: str, period: str, where: Path) -> float:
    """Cores a quota of `quota` microseconds per `period` gives; a malformed pair names the file."""
    if not (quota.isdigit() and period.isdigit() and int(quota) > 0 and int(period) > 0):
        raise ValueError(f"{where}: CPU quota {quota!r} per period {period!r} is not two positive integers")
    return int(quota) / int(period)


def cpu_times(cpus: list[int]) -> tuple[int, int]:
    """(busy, total) clock ticks so far, summed over `cpus`, from /proc/stat."""
    wanted = {f"cpu{cpu}" for cpu in cpus}
    busy = total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *columns = line.split()
        if name in wanted:
            ticks = [int(value) for value in columns[:_COUNTED_COLUMNS]]
            total += sum(ticks)
            busy += sum(ticks) - sum(ticks[i] for i in _IDLE_COLUMNS)
    return busy, total


def block_stat_path(path: Path | None) -> Path | None:
    """The sysfs stat file of the block device holding `path`, or None (no path, tmpfs, NFS, a device without one)."""
    if path is None:
        return None
    try:
        device = os.stat(path).st_dev
    except OSError:
        return None
    stat = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat")
    return stat if os.major(device) != 0 and stat.is_file() else None


def device_name(stat: Path) -> str:
    """The kernel's name of the device whose stat file is `stat` (vda, loop3, nvme0n1p1)."""
    return stat.parent.resolve().name


def io_ticks_ms(stat: Path | None) -> int | None:
    """Milliseconds the device has had I/O in flight so far (io_ticks), or None."""
    if stat is None:
        return None
    try:
        return int(stat.read_text().split()[9])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Mark:
    """The host's counters at one moment (monotonic clock, CPU ticks, the device's io_ticks)."""

    wall: float
    cpu: tuple[int, int]
    io_ms: int | None


class HostSampler:
    """Samples the host at the edges of timed regions; `device_of` is a path on the drive under test (resolved once,
    here). A rank process takes its marks itself, right at the edges of its timed part: the sampler travels to it
    pickled through its own pipe on one host, and as plain data (to_data, from_data) from another node."""

    def __init__(self, device_of: Path | None = None) -> None:
        self.cpus = usable_cpus()
        self.stat = block_stat_path(device_of)
        self.device = device_name(self.stat) if self.stat else None

    def to_data(self) -> dict[str, Any]:
        return {"cpus": list(self.cpus), "stat": str(self.stat) if self.stat else None, "device": self.device}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> HostSampler:
        """The sampler of another host, as its to_data gave it (its figures are read there, never here)."""
        sampler = cls.__new__(cls)
        sampler.cpus, sampler.device = list(data["cpus"]), data["device"]
        sampler.stat = Path(data["stat"]) if data["stat"] else None
        return sampler

    def mark(self) -> Mark:
        return Mark(time.monotonic(), cpu_times(self.cpus), io_ticks_ms(self.stat))

    def use(self, start: Mark, end: Mark, work_cpu_s: float) -> HostUse:
        """The host's use between two marks, the working processes having spent `work_cpu_s` CPU seconds."""
        busy, total = (b - a for a, b in zip(start.cpu, end.cpu, strict=True))
        elapsed = end.wall - start.wall
        device_busy = None
        if start.io_ms is not None and end.io_ms is not None and elapsed > 0:
            device_busy = min(1.0, (end.io_ms - start.io_ms) / 1e3 / elapsed)
        return HostUse(
            wall_s=elapsed,
            work_cpu_s=work_cpu_s,
            cores=len(self.cpus),
            cpu_busy=busy / total if total > 0 else 0.0,
            device=self.device,
            device_busy=device_busy,
        )


def combined(uses: list[HostUse]) -> HostUse:
    """Several timed regions as one: times and CPU seconds added, busy shares weighted by each region's length."""
    wall = sum(use.wall_s for use in uses)
    known = [(use.device_busy, use.wall_s) for use in uses if use.device_busy is not None]
    known_wall = sum(wall_s for _, wall_s in known)
    shares = [(use.wait_share, use.wall_s) for use in uses if use.wait_share is not None]
    waited = len(shares) == len(uses)
    return HostUse(
        wall_s=wall,
        work_cpu_s=sum(use.work_cpu_s for use in uses),
        cores=max(use.cores for use in uses),
        cpu_busy=sum(use.cpu_busy * use.wall_s for use in uses) / wall if wall > 0 else 0.0,
        device=uses[0].device,
        device_busy=sum(busy * wall_s for busy, wall_s in known) / known_wall if known_wall > 0 else None,
        threads_run_s=_total([use.threads_run_s for use in uses]),
        threads_wait_s=_total([use.threads_wait_s for use in uses]),
        wait_share=sum(share * wall_s for share, wall_s in shares) / wall if waited and wall > 0 else None,
        io_blocked_s=_total([use.io_blocked_s for use in uses]),
    )


def _total(values: list[float | None]) -> float | None:
    """The sum, or None where any is unknown."""
    return None if None in values else sum(values)  # type: ignore[arg-type]


def at_once(uses: list[tuple[str, HostUse]]) -> HostUse:
    """Regions that ran at the same time on several hosts (hostname, use) as one: the longest time, the CPU seconds
    added, each host's cores counted once, and the busiest host's CPU and drive shares (so a figure is host-bound where
    any host was saturated)."""
    cores = {host: use.cores for host, use in uses}
    busiest = max((use for _, use in uses), key=lambda use: use.cpu_busy)
    drives = [(use.device_busy, use) for _, use in uses if use.device_busy is not None]
    drive = max(drives, key=lambda pair: pair[0])[1] if drives else busiest
    return HostUse(
        wall_s=max(use.wall_s for _, use in uses),
        work_cpu_s=sum(use.work_cpu_s for _, use in uses),
        cores=sum(cores.values()),
        cpu_busy=busiest.cpu_busy,
        device=drive.device,
        device_busy=drive.device_busy,
        threads_run_s=_total([use.threads_run_s for _, use in uses]),
        threads_wait_s=_total([use.threads_wait_s for _, use in uses]),
        wait_share=max((use.wait_share for _, use in uses if use.wait_share is not None), default=None),
        io_blocked_s=_total([use.io_blocked_s for _, use in uses]),
    )


def own_cpu_s() -> float:
    """User+system CPU seconds so far of this process (all its threads) and of its children that have ended."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system
