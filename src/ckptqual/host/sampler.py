"""What the host and the drive did, second by second: a light background process samples /proc/diskstats for the
physical devices under the target, CPU use (/proc/stat), memory (/proc/meminfo) and the ranks' written bytes
(/proc/PID/io), and hands each sample to the run through a pipe.

The process reads only /proc and /sys, never the drive under test, and writes only to its pipe. It ends with the
run: when told to (its stdin closes), when the run's process is gone (its parent changes: Ctrl-C, SIGTERM, SIGKILL
of the run alike) or when nobody reads its samples any more. This module imports only the standard library: the
process runs it as a script (`python -I -S sampler.py`), which costs a few MB and no package imports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size
_PARENT_CHECK_S = 1.0  # how often, at most, the process checks that the run is still there
_STOP_WAIT_S = 3.0
Counters = dict[str, tuple[int, ...]]


def physical_devices(names: Iterable[str], sys_block: Path = Path("/sys/class/block")) -> list[str]:
    """The devices to sample under block devices `names`: a partition's whole disk, every member of a
    device-mapper, md or LVM device (followed through `slaves/`, to any depth), and a loop device together with
    the disk that holds its backing file; names sysfs lacks are dropped."""
    found: list[str] = []
    pending = list(names)
    seen: set[str] = set()
    while pending:
        name = pending.pop(0)
        if name in seen or not (sys_block / name).exists():
            continue
        seen.add(name)
        node = (sys_block / name).resolve()
        if (node / "partition").exists():
            pending.append(node.parent.name)
            continue
        slaves = sorted(p.name for p in (node / "slaves").iterdir()) if (node / "slaves").is_dir() else []
        pending.extend(slaves)
        if not slaves:
            found.append(name)
            pending.extend(_backing_device(node, sys_block))
    return found


def _backing_device(node: Path, sys_block: Path) -> list[str]:
    """The block device holding a loop device's backing file ([] for any other device, or where it is unknown)."""
    try:
        backing = os.stat((node / "loop" / "backing_file").read_text().strip()).st_dev
    except OSError:
        return []
    link = sys_block.parent.parent / "dev" / "block" / f"{os.major(backing)}:{os.minor(backing)}"
    return [link.resolve().name] if os.major(backing) and link.exists() else []


def parse_diskstats(text: str, devices: Iterable[str]) -> Counters:
    """Per device: reads, sectors read, writes, sectors written, I/Os in flight, ms doing I/O."""
    wanted = set(devices)
    counters: Counters = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 14 and fields[2] in wanted:
            values = [int(v) for v in fields[3:14]]
            counters[fields[2]] = (values[0], values[2], values[4], values[6], values[8], values[9])
    return counters


def parse_cpu(text: str) -> tuple[int, int, int]:
    """All CPUs' jiffies from /proc/stat: total, idle, iowait (guest time is already counted in user and nice)."""
    fields = [int(v) for v in text.split("\n", 1)[0].split()[1:9]]
    return sum(fields), fields[3], fields[4]


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes, by field name."""
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def written_bytes(pid: int) -> int | None:
    """Bytes process `pid` handed to write calls (wchar of /proc/PID/io), None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of process `pid`, from /proc/PID/stat; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round(value: float) -> float:
    return float(f"{value:.4g}")


class _Reading:
    """One look at the counters, and the sample two looks make."""

    def __init__(self, devices: list[str], pids: list[int], suite_bytes: dict[int, int]) -> None:
        self.t = time.monotonic()
        self.disks = parse_diskstats(Path("/proc/diskstats").read_text(), devices)
        self.cpu = parse_cpu(Path("/proc/stat").read_text())
        self.memory = parse_meminfo(Path("/proc/meminfo").read_text())
        for pid in pids:  # the last figure of a rank that is gone stays counted
            value = written_bytes(pid)
            if value is not None:
                suite_bytes[pid] = value
        self.suite_bytes = sum(suite_bytes.values())

    def sample(self, before: _Reading, t0: float, suite_start: int) -> dict[str, Any]:
        dt = self.t - before.t
        devices = {}
        for name, now in self.disks.items():
            old = before.disks.get(name, now)
            devices[name] = {
                "read_MBps": _round((now[1] - old[1]) * SECTOR_BYTES / dt / 1e6),
                "write_MBps": _round((now[3] - old[3]) * SECTOR_BYTES / dt / 1e6),
                "read_iops": _round((now[0] - old[0]) / dt),
                "write_iops": _round((now[2] - old[2]) / dt),
                "in_flight": now[4],
                "util": _round(min(1.0, (now[5] - old[5]) / 1000 / dt)),
            }
        total = max(1, self.cpu[0] - before.cpu[0])
        idle, iowait = self.cpu[1] - before.cpu[1], self.cpu[2] - before.cpu[2]
        memory = self.memory
        return {
            "t_s": round(self.t - t0, 3),
            "devices": devices,
            "cpu_busy": _round(1 - (idle + iowait) / total),
            "cpu_iowait": _round(iowait / total),
            "mem_used_bytes": memory.get("MemTotal", 0) - memory.get("MemAvailable", 0),
            "dirty_bytes": memory.get("Dirty", 0),
            "writeback_bytes": memory.get("Writeback", 0),
            "suite_written_bytes": self.suite_bytes - suite_start,
            "suite_write_MBps": _round((self.suite_bytes - before.suite_bytes) / dt / 1e6),
        }


def sample_forever(devices: list[str], pids: list[int], interval_s: float, t0: float, parent: int) -> None:
    """The sampling process: one JSON line per interval on stdout until stdin closes or the parent is gone."""
    suite_bytes: dict[int, int] = {}
    before = _Reading(devices, pids, suite_bytes)
    start = before.suite_bytes
    tick = before.t
    while True:
        tick += interval_s
        while (wait := tick - time.monotonic()) > 0:
            ready, _, _ = select.select([sys.stdin], [], [], min(wait, _PARENT_CHECK_S))
            if (ready and not os.read(sys.stdin.fileno(), 4096)) or os.getppid() != parent:
                return
        if os.getppid() != parent:
            return
        now = _Reading(devices, pids, suite_bytes)
        try:
            sys.stdout.write(json.dumps(now.sample(before, t0, start), separators=(",", ":")) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):  # nobody reads: the run is gone
            return
        before = now
        tick = max(tick, now.t - interval_s)  # a late wake-up (a loaded host) skips ticks rather than bunching


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--devices", default="")
    parser.add_argument("--pids", default="")
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--t0", type=float, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    devices = [name for name in args.devices.split(",") if name]
    pids = [int(pid) for pid in args.pids.split(",") if pid]
    # A SIGINT sent to it alone ends it quietly; a terminal's Ctrl-C does not reach it (it runs in a session of its
    # own) and it ends when the run does.
    with contextlib.suppress(KeyboardInterrupt):
        sample_forever(devices, pids, args.interval, args.t0, args.parent)


Listener = Callable[[dict[str, Any]], None]


def _ignore(data: dict[str, Any]) -> None:
    return None


class Sampler:
    """The sampling process seen from the run: its samples as they arrive (each handed to `on_sample`), the run's
    marks on the same clock (seconds since `t0`), and the time series the run record keeps (handed to `tell` at
    each mark and at the end). It listens to the run's events (runs.events.RunEvents) to mark them."""

    def __init__(
        self,
        devices: list[str],
        interval_s: float,
        pids: Iterable[int] = (),
        on_sample: Listener = _ignore,
        tell: Listener = _ignore,
        t0: float | None = None,
    ) -> None:
        self.devices, self.interval_s, self.on_sample, self.tell = devices, interval_s, on_sample, tell
        self._begun: dict[str, float] = {}
        self._swept: set[str | None] = set()
        self.t0 = time.monotonic() if t0 is None else t0
        self.samples: list[dict[str, Any]] = []
        self.marks: list[dict[str, Any]] = []
        self.cpu_s: float | None = None
        self.wall_s: float | None = None
        self.stopped_because: str | None = None
        self.listener_error: str | None = None
        command = [
            sys.executable, "-I", "-S", __file__, "--interval", repr(interval_s), "--t0", repr(self.t0),
            "--parent", str(os.getpid()), "--devices", ",".join(devices), "--pids", ",".join(map(str, pids)),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self._reader = threading.Thread(target=self._read, name="ckptqual-sampler-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def now_s(self) -> float:
        """Seconds since the series began, on the samples' clock."""
        return round(time.monotonic() - self.t0, 3)

    def _read(self) -> None:
        if self.process.stdout is None:
            raise RuntimeError("the sampler process was started without a pipe for its standard output")
        for line in self.process.stdout:
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            self.samples.append(sample)
            try:
                self.on_sample(sample)
            except Exception as error:  # a view that breaks must not stop the sampling; the series says so
                self.on_sample, self.listener_error = _ignore, f"{type(error).__name__}: {error}"

    def mark(self, event: str, start_s: float | None = None, **fields: Any) -> None:
        """Marks an event that ends now (and began at `start_s`, on the samples' clock, if given); tells the series."""
        end_s = self.now_s()
        span = {"start_s": round(max(0.0, start_s), 3), "end_s": end_s} if start_s is not None else {}
        self.marks.append({"t_s": end_s, "event": event, **fields, **span})
        self.tell(self.timeseries())

    # The run's events that mark the series: each spans from its start (told, or its duration back) to now.

    def measuring_baseline(self, bytes_per_round: int) -> None:
        self._begun["baseline"] = self.now_s()

    def baseline(self, baseline: dict[str, Any]) -> None:
        self.mark("baseline", self._begun.pop("baseline", None))

    def fill_started(self, number: int) -> None:
        self._begun["pass"] = self.now_s()

    def checkpoint(self, checkpoint: dict[str, Any], of: int) -> None:
        start_s = self.now_s() - checkpoint["seconds"]
        fields = {"pass": checkpoint["pass_number"], "checkpoint": checkpoint["index"], "of": of}
        self.mark("checkpoint", start_s, **fields, number=checkpoint["checkpoint"])

    def fill_ended(self, number: int) -> None:
        self.mark("pass", self._begun.pop("pass", None), **{"pass": number})

    def restore(self, result: dict[str, Any]) -> None:
        self.mark("restore", self.now_s() - result["seconds"], checkpoint=result["checkpoint"])

    def layout(self, layout: dict[str, Any]) -> None:
        self.mark("layout", example=layout["example"], failed="error" in layout)

    def sweep(self, sweep: dict[str, Any]) -> None:
        for cell in sweep.get("cells", []):  # each measured cell once, when it is first told
            if "seconds" in cell and cell.get("id") not in self._swept:
                self._swept.add(cell.get("id"))
                self.mark("sweep", self.now_s() - cell["seconds"], cell=cell.get("id"))

    def timeseries(self) -> dict[str, Any]:
        """What the run record keeps under `timeseries`."""
        series: dict[str, Any] = {
            "interval_s": self.interval_s,
            "devices": list(self.devices),
            "clock": "seconds since the sampler started (CLOCK_MONOTONIC)",
            "samples": list(self.samples),
            "marks": list(self.marks),
            "sampler": {"pid": self.pid, "cpu_s": self.cpu_s, "wall_s": self.wall_s},
        }
        if self.cpu_s is not None and self.wall_s:
            series["sampler"]["cpu_s_per_hour"] = round(self.cpu_s / self.wall_s * 3600, 3)
        if self.stopped_because:
            series["sampler"]["stopped"] = self.stopped_because
        if self.listener_error:
            series["sampler"]["listener_error"] = self.listener_error
        return series

    def stop(self) -> None:
        """Ends the process (it exits once its stdin closes; killed if it does not within a few seconds), keeping
        the CPU it used, and tells the whole series; idempotent."""
        if self.wall_s is not None:
            return
        self.cpu_s, self.wall_s = cpu_seconds(self.pid), self.now_s()
        if self.process.poll() is not None:
            self.stopped_because = f"the sampler ended early (exit code {self.process.returncode})"
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(_STOP_WAIT_S)
        self._reader.join(_STOP_WAIT_S)
        self.tell(self.timeseries())


if __name__ == "__main__":
    main()
