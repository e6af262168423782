"""The background sampler (host/sampler.py): the devices under a target, the counters it reads, the process that
samples them, and that it ends with the run however the run ends."""

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ckptqual.host.identity import identify
from ckptqual.host.sampler import (
    Sampler,
    cpu_seconds,
    parse_cpu,
    parse_diskstats,
    parse_meminfo,
    physical_devices,
)

# A line of this machine's /proc/diskstats (kernel 6.x: 20 fields), and its first line of /proc/stat.
DISKSTATS = "254       0 vda 126348 12034 24135706 88471 32910 28719 29437728 358634 3 69896 495363 11883 72 25734816"
STAT = "cpu  1000 50 300 8000 400 10 20 5 0 0\ncpu0 500 25 150 4000 200 5 10 2 0 0\n"


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_diskstats_fields_are_the_kernels():
    counters = parse_diskstats(DISKSTATS + "\n   7 0 loop0 1 2 3 4 5 6 7 8 9 10 11\n", ["vda"])
    # reads, sectors read, writes, sectors written, in flight, ms doing I/O
    assert counters == {"vda": (126348, 24135706, 32910, 29437728, 3, 69896)}


def test_this_machines_proc_files_parse():
    names = [line.split()[2] for line in Path("/proc/diskstats").read_text().splitlines()]
    assert set(parse_diskstats(Path("/proc/diskstats").read_text(), names)) == set(names)
    total, idle, iowait = parse_cpu(Path("/proc/stat").read_text())
    assert total > idle + iowait > 0
    memory = parse_meminfo(Path("/proc/meminfo").read_text())
    assert 0 < memory["MemAvailable"] <= memory["MemTotal"]


def test_cpu_counts_all_columns_but_guest():
    assert parse_cpu(STAT) == (9785, 8000, 400)


def fake_block(root: Path, name: str, *, parent: str | None = None, slaves: tuple[str, ...] = ()) -> None:
    """A sysfs block node as the kernel lays it out: partitions inside their disk, members under slaves/."""
    node = root / "devices" / (f"{parent}/{name}" if parent else name)
    node.mkdir(parents=True, exist_ok=True)
    if parent:
        (node / "partition").write_text("1\n")
    if slaves:
        (node / "slaves").mkdir()
        for slave in slaves:
            (node / "slaves" / slave).symlink_to(root / "class" / "block" / slave)
    (root / "class" / "block").mkdir(parents=True, exist_ok=True)
    (root / "class" / "block" / name).symlink_to(node)


def test_partitions_md_and_lvm_resolve_to_their_disks(tmp_path):
    for disk in ("nvme0n1", "nvme1n1", "sda"):
        fake_block(tmp_path, disk)
    fake_block(tmp_path, "nvme0n1p1", parent="nvme0n1")
    fake_block(tmp_path, "nvme1n1p1", parent="nvme1n1")
    fake_block(tmp_path, "sda2", parent="sda")
    fake_block(tmp_path, "md0", slaves=("nvme0n1p1", "nvme1n1p1"))
    fake_block(tmp_path, "dm-0", slaves=("md0", "sda2"))  # an LVM volume over the array and a partition
    sys_block = tmp_path / "class" / "block"
    assert physical_devices(["dm-0"], sys_block) == ["sda", "nvme0n1", "nvme1n1"]
    assert physical_devices(["nvme0n1p1", "nvme0n1", "unknown"], sys_block) == ["nvme0n1"]
    assert physical_devices([], sys_block) == []


def test_a_loop_device_brings_the_disk_of_its_backing_file(loop_ext4, tmp_path):
    mounted = loop_ext4("64M")
    loop = identify(mounted).device
    holder = identify(tmp_path).device  # the disk the image lies on
    found = physical_devices([loop])
    assert found[0] == loop and loop.startswith("loop")
    assert found[1:] == physical_devices([holder])


def test_the_process_samples_at_its_interval_and_stops_when_told():
    got = []
    sampler = Sampler(["nonexistent"], 0.2, on_sample=got.append)
    try:
        assert wait_until(lambda: len(got) >= 5, timeout_s=300)  # it sampled: its command line is its own now
        command = Path(f"/proc/{sampler.pid}/cmdline").read_bytes().split(b"\0")
        assert command[1:3] == [b"-I", b"-S"] and command[3].endswith(b"ckptqual/host/sampler.py")
        opened = {os.readlink(f"/proc/{sampler.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{sampler.pid}/fd")}
    finally:
        sampler.stop()
    assert not alive(sampler.pid)
    assert all(name.startswith("pipe:") or name == "/dev/null" for name in opened), opened
    times = [sample["t_s"] for sample in sampler.samples]
    assert times == sorted(times) and len(times) == len(got)
    assert sampler.samples[0]["devices"] == {}  # a device that is not there is not invented
    series = sampler.timeseries()
    assert series["interval_s"] == 0.2 and series["sampler"]["cpu_s"] is not None
    assert series["sampler"]["wall_s"] >= times[-1]


def test_samples_come_one_per_interval_and_never_bunch():
    """The sampling process keeps sampling, never faster than its interval however late a loaded host wakes it: a
    late tick is skipped, not made up, so between samples i < j lie at least j - i - 1 intervals, and no more samples
    come than intervals passed (each time read on the samples' own clock, never bounded by this host's speed)."""
    interval = 0.25
    start = time.monotonic()
    sampler = Sampler([], interval)
    try:
        assert wait_until(lambda: len(sampler.samples) >= 8, timeout_s=300), "the sampler stopped sampling"
    finally:
        sampler.stop()
    elapsed = time.monotonic() - start
    times = [sample["t_s"] for sample in sampler.samples]  # rounded to the millisecond
    assert len(times) <= (elapsed + 0.002) / interval + 1, (elapsed, times)
    for i, j in itertools.combinations(range(len(times)), 2):
        assert times[j] - times[i] >= (j - i - 1) * interval - 0.002, (i, j, times)


def test_the_drive_and_the_ranks_writes_are_counted(tmp_path):
    devices = physical_devices(device["name"] for device in identify(tmp_path).to_dict()["physical"])
    if not devices:
        pytest.skip(f"{tmp_path} is on no block device (tmpfs?): nothing to sample")
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, sys, time
            sys.stdin.readline()
            with open({str(tmp_path / 'data')!r}, 'wb') as out:
                for _ in range(64):
                    out.write(os.urandom(1 << 20))
                out.flush()
                os.fsync(out.fileno())
            time.sleep(30)
        """)],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    sampler = Sampler(devices, 0.2, pids=[writer.pid])
    try:
        assert wait_until(lambda: len(sampler.samples) >= 1)
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
        assert wait_until(lambda: sampler.samples[-1]["suite_written_bytes"] >= 64 << 20)
        time.sleep(0.5)
    finally:
        writer.kill()
        writer.wait()
        sampler.stop()
    device_MB = sum(s["devices"][name]["write_MBps"] * 0.2 for s in sampler.samples for name in devices)
    assert device_MB >= 60, f"the devices {devices} counted {device_MB:.1f} MB of a 67 MB fsynced file"
    assert max(s["suite_write_MBps"] for s in sampler.samples) > 0


PARENT = """
import sys, time
sys.path.insert(0, {src!r})
from ckptqual.host.sampler import Sampler
sampler = Sampler([], 0.2)
print(sampler.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize(
    ("how", "signum"),
    [("SIGKILL of the run", signal.SIGKILL), ("SIGTERM", signal.SIGTERM), ("Ctrl-C to the group", signal.SIGINT)],
)
def test_the_sampler_ends_with_the_run(how, signum):
    src = str(Path(__file__).resolve().parents[1] / "src")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(src=src)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    pid = int(parent.stdout.readline())
    assert alive(pid)
    if signum == signal.SIGINT:
        os.killpg(parent.pid, signum)  # what a terminal's Ctrl-C does
    else:
        parent.send_signal(signum)
    parent.wait(30)  # at once when idle; a loaded CI host may take seconds
    assert wait_until(lambda: not alive(pid), timeout_s=5), f"the sampler (PID {pid}) outlived the run ({how})"


def test_marks_follow_the_run_and_are_told():
    told = []
    sampler = Sampler([], 0.5, tell=told.append)
    try:
        sampler.measuring_baseline(1)
        sampler.baseline({})
        sampler.fill_started(1)
        time.sleep(0.3)
        sampler.checkpoint({"seconds": 0.2, "pass_number": 1, "index": 1, "checkpoint": 0}, 3)
        sampler.fill_ended(1)
        sampler.restore({"seconds": 0.1, "checkpoint": 0})
        sampler.layout({"example": 2, "error": "boom"})
        cell = {"id": "cpu-only-1M-16", "seconds": 0.05}
        sampler.sweep({"cells": [cell, {"id": "gpu-direct-1M-16", "skipped": "no GPU"}]})
        sampler.sweep({"cells": [{**cell, "outcome": "PASS"}]})  # the same cell, told again with its outcome
    finally:
        sampler.stop()
    marks = {mark["event"]: mark for mark in sampler.marks}
    assert [mark["event"] for mark in sampler.marks] == ["baseline", "checkpoint", "pass", "restore", "layout", "sweep"]
    checkpoint, fill = marks["checkpoint"], marks["pass"]
    assert checkpoint["pass"] == 1 and checkpoint["checkpoint"] == 1 and checkpoint["of"] == 3
    assert checkpoint["end_s"] - checkpoint["start_s"] == pytest.approx(0.2, abs=0.002)
    assert fill["start_s"] <= checkpoint["start_s"] <= checkpoint["end_s"] <= fill["end_s"]
    assert marks["layout"]["failed"] is True and "start_s" not in marks["layout"]
    assert marks["sweep"]["cell"] == "cpu-only-1M-16"
    assert len(told) == 7 and told[-1]["marks"] == sampler.marks
    json.dumps(told[-1])  # the record can keep it as it is


def test_cpu_seconds_of_this_process():
    assert cpu_seconds(os.getpid()) > 0
    assert cpu_seconds(2**22 + 1) is None
