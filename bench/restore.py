"""Cold restore side by side with fio, interleaved in one run: every rank reads its own files of one checkpoint at
once, after the page cache was dropped, with each path in turn (the order rotates from round to round).

For `stream` files (default) and `torch-save` files (--engine torch-save), one checkpoint of the workload at
--scale is written once; then per round:

- `fio`: one job per rank reading that rank's files one after the other (buffered, psync, 16K reads: fio skips
  the tail of a file shorter than a block, so its rate is its own bytes over its own time), the same files;
- `read path`: the ranks' reads as the engine's restore does them, without checks: `stream` reads each file's
  zip directory and records, then every tensor in 8 MiB chunks from its file offset (small files in one read);
  `torch-save` calls torch.load(weights_only=True) on each file;
- `verified`: ckptqual's restore itself (the rank pool's "read": structure, records, CRCs, pickle and every
  payload block checked; the sampled torch.load after the timed part is neither timed nor counted), by the pool
  that wrote the checkpoint, as in a qualification run;
- `before verified` (--before TREE): the same restore by another source tree of ckptqual (its root, e.g. an
  earlier version unpacked with `git archive`), of a checkpoint that tree wrote, in the same rounds.

Ratios are per round, as min / median / max, of GB/s and of CPU seconds per GB against fio's; CPU seconds are the
ranks' own (user + system), and fio's its process's.

    python bench/restore.py --target /mnt/nvme0/bench --engine stream --rounds 5
    python bench/restore.py --target /dev/shm --workload llama3-8b --scale 0.01 --before /tmp/before
    python bench/restore.py --engine torch-save --rounds 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
from benchutil import Server, spread

from ckptqual.io.engines.torchread.records import read_records
from ckptqual.io.engines.torchread.source import FileSource
from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.workloads import load_workload

CHUNK_BYTES = 8 << 20  # the ranks' read buffer (ckptqual's DEFAULT_CHUNK_BYTES)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_stream_files(paths: list[str], buffer: np.ndarray) -> int:
    """The `stream` reader's I/O without its checks: directory and records, then each record in chunks."""
    done = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            source = FileSource(fd, path, buffer)
            for record in read_records(source):
                for offset in range(0, record.size, CHUNK_BYTES):
                    length = min(CHUNK_BYTES, record.size - offset)
                    done += source.chunk(record.data_offset + offset, length).nbytes
        finally:
            os.close(fd)
    return done


def torch_load_files(paths: list[str], buffer: np.ndarray) -> int:
    """torch.load of each file, as a restarting job loads a `torch-save` checkpoint."""
    import torch

    done = 0
    for path in paths:
        state = torch.load(path, weights_only=True)
        done += sum(tensor.untyped_storage().nbytes() for tensor in state.values())
    return done


READS = {"stream": read_stream_files, "torch-save": torch_load_files}


def _reader(conn: Connection, barrier: Any) -> None:
    """One rank of the read path: waits for its files, meets the others at the barrier, reads, reports."""
    buffer = np.empty(CHUNK_BYTES, dtype=np.uint8)
    while (task := conn.recv()) is not None:
        engine, paths = task
        barrier.wait()
        start, cpu = time.monotonic(), time.process_time()
        moved = READS[engine](paths, buffer)
        conn.send((start, time.monotonic(), moved, time.process_time() - cpu))


class ReadPath:
    """`ranks` processes that read their files from a common start; the slowest decides the time."""

    def __init__(self, ranks: int) -> None:
        context = mp.get_context("spawn")
        self._barrier = barrier = context.Barrier(ranks)  # kept: the children open it after this returns
        self._conns, self._procs = [], []
        for _ in range(ranks):
            parent, child = context.Pipe()
            proc = context.Process(target=_reader, args=(child, barrier), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)

    def run(self, engine: str, files: list[list[str]]) -> tuple[float, int, float]:
        """Seconds to the slowest rank, bytes read (tensor bytes for torch.load), and the ranks' CPU seconds."""
        for conn, paths in zip(self._conns, files, strict=True):
            conn.send((engine, paths))
        replies = [conn.recv() for conn in self._conns]
        start = min(reply[0] for reply in replies)
        return max(r[1] for r in replies) - start, sum(r[2] for r in replies), sum(r[3] for r in replies)

    def close(self) -> None:
        for conn in self._conns:
            conn.send(None)
        for proc in self._procs:
            proc.join(timeout=10)


def fio_read(directory: Path, files: list[list[str]]) -> tuple[float, int, float]:
    """fio, one job per rank over that rank's files in turn: seconds (its slowest job), bytes, CPU seconds."""
    command = ["fio", "--output-format=json", "--rw=read", "--bs=16k", "--ioengine=psync", "--thread"]
    command += ["--file_service_type=sequential", f"--directory={directory}"]
    for rank, paths in enumerate(files):
        names = ":".join(str(Path(path).relative_to(directory)).replace(":", "\\:") for path in paths)
        if len(names) > 4096:
            raise SystemExit(f"rank {rank}'s file names are {len(names)} characters; fio takes at most 4096")
        command += [f"--name=rank{rank}", f"--filename={names}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"fio failed (exit {done.returncode}): {(done.stderr or done.stdout)[-500:]}")
    jobs = json.loads(done.stdout)["jobs"]
    seconds = max(job["read"]["runtime"] for job in jobs) / 1000
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, sum(job["read"]["io_bytes"] for job in jobs), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=None, help="directory on the drive (default: a temp dir)")
    parser.add_argument("--engine", choices=sorted(READS), default="stream", help="writer of the files (stream)")
    parser.add_argument("--workload", default="llama3.1-405b-review", help="workload (default: the review's)")
    parser.add_argument("--scale", type=float, default=5e-4, help="scale (default: 5e-4, about 818 MB)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    parser.add_argument("--before", type=Path, default=None, help="another source tree to restore side by side")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    plan: CheckpointPlan = load_workload(args.workload).plan().scaled(args.scale)
    work = Path(tempfile.mkdtemp(prefix="ckptqual-bench-restore-", dir=args.target))
    servers = {"verified": Server(None)} | ({"before verified": Server(args.before)} if args.before else {})
    directories = {name: work / name.replace(" ", "-") for name in servers}
    directory = directories["verified"]
    files = [[str(directory / spec.path) for spec in rank.files] for rank in plan.ranks]
    paths = ("fio", "read path", *servers)
    figures: dict[str, list[tuple[float, int, float]]] = {name: [] for name in paths}
    load_before = os.getloadavg()
    readers = ReadPath(len(plan.ranks))
    request = {"engine": args.engine, "workload": args.workload, "scale": args.scale, "checkpoint": 0}
    try:
        for name, server in servers.items():
            server.request(op="checkpoint", directory=directories[name], **request)
        total = sum(os.path.getsize(path) for paths in files for path in paths)
        for round_number in range(args.rounds):
            shift = round_number % len(paths)
            for name in paths[shift:] + paths[:shift]:
                drop_caches()
                if name == "fio":
                    figures[name].append(fio_read(directory, files))
                elif name == "read path":
                    figures[name].append(readers.run(args.engine, files))
                else:
                    done = servers[name].request(op="restore", directory=directories[name], **request)
                    figures[name].append((done.seconds, done.bytes, done.cpu_s))
            print(f"round {round_number + 1}/{args.rounds} done", flush=True)
    finally:
        for server in servers.values():
            server.close()
        shutil.rmtree(work, ignore_errors=True)
        readers.close()
    print(
        f"\ncold restore, {args.engine} files: {args.workload} at scale {args.scale:g}, {total / 1e9:.3f} GB in "
        f"{plan.file_count} files, {len(plan.ranks)} ranks; {args.rounds} interleaved rounds, drop_caches before each; "
        f"{os.cpu_count()} CPUs, load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}\n"
    )
    print("| path | GB/s median (rounds) | CPU s per GB | GB/s vs fio | CPU s per GB vs fio |\n|---|---|---|---|---|")
    # fio's bytes are what it read; the others read every byte of the files
    rates = {name: [(b if name == "fio" else total) / s / 1e9 for s, b, _ in found] for name, found in figures.items()}
    cpus = {name: [c / ((b if name == "fio" else total) / 1e9) for _, b, c in found] for name, found in figures.items()}
    for name in figures:
        ratios = [mine / theirs for mine, theirs in zip(rates[name], rates["fio"], strict=True)]
        cpu_ratios = [mine / theirs for mine, theirs in zip(cpus[name], cpus["fio"], strict=True)]
        shown = ", ".join(f"{rate:.2f}" for rate in rates[name])
        median = statistics.median(rates[name])
        print(
            f"| {name} | {median:.2f} ({shown}) | {statistics.median(cpus[name]):.2f} | {spread(ratios)} | "
            f"{spread(cpu_ratios)} |"
        )
    cost = [v / r for v, r in zip(rates["verified"], rates["read path"], strict=True)]
    print(
        f"\nverified / read path: {spread(cost)}; fio read {figures['fio'][0][1] / total:.1%} of the checkpoint's bytes"
    )
    if args.json:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "bytes": total, "files": plan.file_count}
        args.json.write_text(json.dumps(record | {"figures": figures, "load": [load_before, os.getloadavg()]}))


if __name__ == "__main__":
    main()
