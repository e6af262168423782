"""The measurements behind the host-bound share and the other-I/O margin (docs/verdict.md), as root on Linux.

`waits quiet|busy|pinned`: two ranks write and read back three checkpoints on a loop-mounted ext4 throttled by cgroup
v1 blkio to 100 MB/s write and 150 MB/s read; `busy` adds a busy loop on every core, `pinned` confines the ranks to one
core that a busy loop at nice -10 shares. Prints each figure's rate and its threads' waits (host.waits).

`margin ext4|xfs NUMEL FILES`: two ranks write and read back four checkpoints of FILES files of NUMEL bytes each on a
loop device over a file in /dev/shm, and print what the loop device moved beyond the suite's bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ckptqual.host.cpu import HostSampler
from ckptqual.limits.host_bound import host_bound_reason, waits_text
from ckptqual.plan.model import FilePlan, RankPlan, TensorSpec
from ckptqual.runs.pool import RankPool

BLKIO = Path("/sys/fs/cgroup/blkio")


def plans(numel: int, files: int = 1) -> tuple[RankPlan, ...]:
    return tuple(
        RankPlan(r, tuple(FilePlan(f"rank{r}-{f}.pt", (TensorSpec("x", numel, "int8"),)) for f in range(files)))
        for r in range(2)
    )


@contextlib.contextmanager
def loop_mount(fs: str, directory: str) -> Iterator[tuple[Path, str]]:
    """A 1 GiB `fs` on a loop device over a file in `directory`: its mount point and its device's name."""
    where = Path(tempfile.mkdtemp(dir=directory))
    image, point = where / "image", Path(tempfile.mkdtemp())
    subprocess.run(["truncate", "-s", "1G", str(image)], check=True)
    subprocess.run([f"mkfs.{fs}", "-q", "-f" if fs == "xfs" else "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
    source = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(point)], capture_output=True, text=True).stdout
    try:
        yield point, Path(source.strip()).name
    finally:
        subprocess.run(["umount", str(point)], check=True)
        subprocess.run(["rm", "-rf", str(where), str(point)], check=True)


def evict(directory: Path) -> None:
    for path in directory.rglob("*.pt"):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def waits(mode: str) -> None:
    with loop_mount("ext4", "/tmp") as (point, name):
        numbers = Path(f"/sys/class/block/{name}/dev").read_text().strip()
        (BLKIO / "blkio.throttle.write_bps_device").write_text(f"{numbers} 100000000\n")
        (BLKIO / "blkio.throttle.read_bps_device").write_text(f"{numbers} 150000000\n")
        cpus = sorted(os.sched_getaffinity(0))
        nice = -10 if mode == "pinned" else 0
        loops = [] if mode == "quiet" else [busy_loop(cpu, nice) for cpu in (cpus[:1] if mode == "pinned" else cpus)]
        try:
            time.sleep(0.3)
            if mode == "pinned":
                os.sched_setaffinity(0, cpus[:1])
            with RankPool(2, seed=5, timeout_s=300, sampler=HostSampler(point)) as pool:
                for checkpoint in range(3):
                    directory = point / f"checkpoint-{checkpoint}"
                    timing = pool.write_checkpoint(directory, checkpoint, plans(50_000_000), "stream")
                    show(mode, "write", timing)
                    evict(directory)
                    timing = pool.run("read", directory, plans(50_000_000), "restore", checkpoint, {"engine": "stream"})
                    show(mode, "read", timing)
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
            (BLKIO / "blkio.throttle.write_bps_device").write_text(f"{numbers} 0\n")
            (BLKIO / "blkio.throttle.read_bps_device").write_text(f"{numbers} 0\n")


def busy_loop(cpu: int, nice: int) -> subprocess.Popen:
    def start() -> None:
        os.sched_setaffinity(0, {cpu})
        os.setpriority(os.PRIO_PROCESS, 0, nice)

    return subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=start)


def show(mode: str, what: str, timing) -> None:
    rate = timing.bytes / timing.seconds / 1e6
    bound = host_bound_reason(timing.host) is not None
    print(f"{mode} {what} {rate:.1f} MB/s, CPUs {timing.host.cpu_busy:.0%} busy, {waits_text(timing.host)}, "
          f"host-bound {bound}")  # fmt: skip


def sectors(name: str) -> tuple[int, int]:
    fields = Path(f"/sys/class/block/{name}/stat").read_text().split()
    return int(fields[2]) * 512, int(fields[6]) * 512


def margin(fs: str, numel: int, files: int) -> None:
    mounted = loop_mount(fs, "/dev/shm")
    with mounted as (point, name), RankPool(2, seed=5, timeout_s=300, sampler=HostSampler(point)) as pool:
        for checkpoint in range(4):
            directory = point / f"checkpoint-{checkpoint}"
            before = sectors(name)
            timing = pool.write_checkpoint(directory, checkpoint, plans(numel, files), "stream")
            written = sectors(name)[1] - before[1]
            subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
            before = sectors(name)
            read = pool.run("read", directory, plans(numel, files), "restore", checkpoint, {"engine": "stream"})
            got = sectors(name)[0] - before[0]
            print(f"{fs} {files} files of {numel:,} bytes a rank: wrote {written - timing.bytes:,} bytes "
                  f"({(written - timing.bytes) / timing.bytes:.2%}) more than the suite, read "
                  f"{got - read.bytes:,} ({(got - read.bytes) / read.bytes:.2%}) more")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("waits").add_argument("mode", choices=("quiet", "busy", "pinned"))
    measure = commands.add_parser("margin")
    measure.add_argument("fs", choices=("ext4", "xfs"))
    measure.add_argument("numel", type=int)
    measure.add_argument("files", type=int)
    args = parser.parse_args()
    if args.command == "waits":
        waits(args.mode)
    else:
        margin(args.fs, args.numel, args.files)


if __name__ == "__main__":
    main()
