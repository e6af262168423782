"""The floor under one rank's checkpoint write, part by part, on one thread: the CPU seconds per GB of each thing
a `stream` write must do to every byte (AES-CTR keystream, CRC32, the page-cache copy of pwrite), beside a whole
`stream` write of rank 0's files on the same target. Run it on tmpfs to see the software alone:

    python bench/write_floor.py --target /dev/shm --workload llama3-8b --scale 0.05
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ckptqual.io import keystream
from ckptqual.io.crc import IMPLEMENTATION, crc32
from ckptqual.io.engines.base import RankIO
from ckptqual.io.engines.fileimage import aligned_buffer
from ckptqual.io.payload import PayloadGenerator
from ckptqual.plan.workloads import load_workload
from ckptqual.runs.save import write_checkpoint_files
from ckptqual.runs.task import Task

BUFFER_BYTES = 8 << 20  # a rank's window


def cpu_s_per_GB(work: Callable[[], int]) -> float:
    """CPU seconds of this process per 1e9 bytes `work` handles (it returns how many)."""
    start = time.process_time()
    nbytes = work()
    return (time.process_time() - start) / (nbytes / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--workload", default="llama3-8b")
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--gigabytes", type=float, default=2.0, help="bytes per part (default 2 GB)")
    args = parser.parse_args()
    buffer = aligned_buffer(BUFFER_BYTES)
    rounds = max(1, int(args.gigabytes * 1e9 // BUFFER_BYTES))
    work = Path(tempfile.mkdtemp(prefix="ckptqual-bench-floor-", dir=args.target))

    def aes() -> int:
        for number in range(rounds):
            keystream.fill(bytes(16), number << 64, buffer)
        return rounds * BUFFER_BYTES

    def crc() -> int:
        value = 0
        for _ in range(rounds):
            value = crc32(buffer, value)
        return rounds * BUFFER_BYTES

    def pwrite() -> int:
        fd = os.open(work / "pwrite", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for number in range(rounds):
                os.pwrite(fd, buffer, number * BUFFER_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(work / "pwrite")
        return rounds * BUFFER_BYTES

    plan = load_workload(args.workload).plan().scaled(args.scale).ranks[0]

    def stream() -> int:
        io = RankIO(PayloadGenerator(1), rank=0)
        task = Task("write", 0, str(work / "checkpoint"), plan, {"engine": "stream"})
        return write_checkpoint_files(io, task)

    try:
        parts = {
            f"AES-128-CTR keystream ({keystream.IMPLEMENTATION})": cpu_s_per_GB(aes),
            f"CRC32 ({IMPLEMENTATION})": cpu_s_per_GB(crc),
            f"pwrite of {BUFFER_BYTES >> 20} MiB buffers, fsync": cpu_s_per_GB(pwrite),
        }
        whole = cpu_s_per_GB(stream)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    floor = sum(parts.values())
    size = f"rank 0 of {args.workload} at scale {args.scale:g}: {plan.nbytes / 1e9:.2f} GB"
    print(f"one thread on {args.target}; {size}\n")
    print("| part | CPU s per GB | GB per CPU-s |\n|---|---|---|")
    for name, cost in parts.items():
        print(f"| {name} | {cost:.3f} | {1 / cost:.1f} |")
    print(f"| floor: the parts together | {floor:.3f} | {1 / floor:.2f} |")
    print(f"| `stream` write of rank 0's files, fsync | {whole:.3f} | {1 / whole:.2f} |")
    print(f"\nthe stream write costs {whole / floor:.2f} x its floor")


if __name__ == "__main__":
    main()
