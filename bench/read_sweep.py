"""The read sweep's cpu-only cells side by side with fio, interleaved in one run: ckptqual's engine against fio's
psync and io_uring engines on the same files, block size and depth, O_DIRECT, the page cache dropped before each.

Per cell (block size x threads) and round, every tool reads the same bytes of the sweep's files (`jobs` files
of --file-bytes, written once with the payload, `requests` reads per job, as the sweep does), in an order that
rotates from round to round, so that a noisy neighbour hits every tool alike:

- `fio psync`: `threads` jobs, one read at a time each, every job its own slice of every file (offset_increment);
- `fio io_uring`: one job, iodepth = threads, over the same files;
- `ckptqual`: the sweep's cpu-only engine as the product picks it (`make_reader`), through the sweep's own loop
  (`run_cell`), its last batch checked against the payload after the timed part; where that is ckptqual's POSIX
  engine, its native psync loop (psync_cell.c) if it is built, else its Python loop (the header says which);
- `ckptqual python loop` (--python-loop): the POSIX engine with its Python psync loop (Python threads, one GIL),
  as every cpu-only cell ran before the native loop;
- `ckptqual before` (--before): the same engine driven through the generic submit loop (a pool thread per read
  and its result handed back), the path every cpu-only cell took before the psync workers.

Ratios are ckptqual / fio per round, as min / median / max over the rounds.

    python bench/read_sweep.py --target /mnt/nvme0/bench --block-sizes 1M --rounds 3
    python bench/read_sweep.py --block-sizes 1M,128K,64K,16K,8K --threads 16,4,1 --python-loop --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchutil import drop_caches, spread

from ckptqual.host import gpu
from ckptqual.io.readers import make_reader
from ckptqual.io.readers.base import Reader
from ckptqual.io.readers.posix import PosixReader
from ckptqual.limits.units import format_size, parse_size
from ckptqual.runs.sweep.cells import Cell
from ckptqual.runs.sweep.driver import read_shape, run_cell
from ckptqual.runs.sweep.files import SweepFiles

FIO = ("fio psync", "fio io_uring")


def fio_GiBps(engine: str, paths: Sequence[Path], cell: Cell) -> float:
    """fio reading the cell's bytes of `paths` with `engine` (psync or io_uring), O_DIRECT, at the cell's depth."""
    total = cell.total_bytes
    if engine == "psync":
        share = total // cell.threads  # each job reads share / jobs of every file, from its own offset
        shape = [f"--numjobs={cell.threads}", f"--size={share}", f"--offset_increment={share // len(paths)}"]
    else:
        shape = ["--numjobs=1", f"--iodepth={cell.threads}", f"--size={total}"]
    command = [
        *("fio", "--name=ckptqual-read", f"--filename={':'.join(str(p) for p in paths)}", "--rw=read"),
        *(f"--bs={cell.block_bytes}", "--direct=1", f"--ioengine={engine}", "--thread", "--group_reporting"),
        *("--output-format=json", *shape),
    ]
    report = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    read = report["jobs"][0]["read"]
    if read["io_bytes"] != total:
        raise RuntimeError(f"fio {engine} read {read['io_bytes']} bytes, the cell reads {total}")
    return read["io_bytes"] / (read["runtime"] / 1000) / 2**30


class GenericLoop:
    """Hides an engine's own cell loop, so that the sweep drives it read by read (`submit`): the earlier path."""

    def __init__(self, inner: Reader) -> None:
        self.inner, self.engine, self.transfer = inner, inner.engine, inner.transfer

    def submit(self, job: int, slot: int, offset: int) -> Any:
        return self.inner.submit(job, slot, offset)

    def host_copy(self, job: int, slot: int) -> Any:
        return self.inner.host_copy(job, slot)


def ckptqual_GiBps(files: SweepFiles, cell: Cell, host: gpu.HostGpu, tool: str) -> tuple[float, str]:
    """`tool`'s engine on one cell from offset 0 of every file: the product's cpu-only engine (its Python loop for
    "ckptqual python loop", the generic submit loop for "ckptqual before"); returns GiB/s and the engine's loop."""
    if tool == "ckptqual python loop":
        if host.cpu_only_engine != "posix":
            raise SystemExit(f"--python-loop: cpu-only reads with {host.cpu_only_engine} here, not the POSIX engine")
        reader: Reader = PosixReader("cpu-only", loop="python")
    else:
        reader = make_reader("cpu-only", host)
    generic = tool == "ckptqual before"
    with files.open_tree() as tree:
        reader.open(tree, files.paths, read_shape(cell))
    try:
        run = run_cell(GenericLoop(reader) if generic else reader, cell, [0] * cell.jobs, files.file_bytes)
        for job in range(cell.jobs):  # untimed, as the sweep's verify="last"
            for slot, offset in enumerate(run.last_batch(job, cell.slots)):
                files.check(job, offset, reader.host_copy(job, slot))
        settings = reader.settings()
    finally:
        reader.close()
    if not settings.get("direct_io"):
        raise RuntimeError(f"{reader.engine} could not read {files.directory} with O_DIRECT; fio does: not comparable")
    loop = "generic submit loop" if generic else settings.get("workers", "").partition(":")[0]
    problem = f", native loop absent: {settings['native_loop_problem']}" if settings.get("native_loop_problem") else ""
    return run.bytes / run.seconds / 2**30, f"{tool}: {reader.engine} {loop}{problem}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=None, help="directory on the drive (default: a temp dir)")
    parser.add_argument("--block-sizes", default="1M,128K,64K,16K,8K", help="default: 1M,128K,64K,16K,8K")
    parser.add_argument("--threads", default="16,4,1", help="thread counts = depth (default: 16,4,1)")
    parser.add_argument("--jobs", type=int, default=4, help="files, one per job (default: 4, as the sweep)")
    parser.add_argument("--batch", type=int, default=16, help="reads a job submits before it waits (default: 16)")
    parser.add_argument("--file-bytes", default="256M", help="size of each file (default: 256M)")
    parser.add_argument("--requests", type=int, default=2048, help="reads per job per cell (default: 2048)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    parser.add_argument("--python-loop", action="store_true", help="also the POSIX engine's Python psync loop")
    parser.add_argument("--before", action="store_true", help="also the engine through the generic submit loop")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed (apt-get install fio): it is the reference")
    file_bytes = parse_size(args.file_bytes)
    blocks = [parse_size(size) for size in args.block_sizes.split(",")]
    threads = [int(count) for count in args.threads.split(",")]
    host = gpu.probe()
    work = Path(tempfile.mkdtemp(prefix="ckptqual-bench-read-", dir=args.target))
    files = SweepFiles(work / "sweep", args.jobs, file_bytes, seed=11)
    ours = [
        "ckptqual",
        *(["ckptqual python loop"] if args.python_loop else []),
        *(["ckptqual before"] if args.before else []),
    ]
    tools = [*FIO, *ours]
    cells = [
        Cell("cpu-only", block, count, args.jobs, args.batch, max(1, min(args.requests, file_bytes // block)))
        for block in blocks
        for count in threads
    ]
    rates: dict[str, dict[str, list[float]]] = {cell.id: {tool: [] for tool in tools} for cell in cells}
    engines: set[str] = set()
    load_before = os.getloadavg()
    try:
        files.write()
        eviction = ""
        for round_number in range(args.rounds):
            for cell in cells:
                shift = (round_number + cells.index(cell)) % len(tools)  # no tool always follows the same one
                for tool in tools[shift:] + tools[:shift]:
                    eviction = drop_caches(files.paths)
                    if tool in FIO:
                        rate = fio_GiBps(tool.split()[1], files.paths, cell)
                    else:
                        rate, engine = ckptqual_GiBps(files, cell, host, tool)
                        engines.add(engine)
                    rates[cell.id][tool].append(rate)
            print(f"round {round_number + 1}/{args.rounds} done", flush=True)
    finally:
        files.remove()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\nread sweep, cpu-only, O_DIRECT: {args.jobs} files of {format_size(file_bytes)}, batch {args.batch}, "
        f"up to {args.requests} reads per job; {args.rounds} interleaved rounds; before each: {eviction}; "
        f"engines: {'; '.join(sorted(engines))}; {os.cpu_count()} CPUs, load {load_before[0]:.1f} -> "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    header = ["block", "threads", *(f"{tool} GiB/s" for tool in tools)]
    header += [
        f"{tool.removeprefix('ckptqual ') or tool} / {reference.split()[1]}" for tool in ours for reference in FIO
    ]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    table = []
    for cell in cells:
        mine = rates[cell.id]
        row: dict[str, Any] = {"block": cell.block_size, "threads": cell.threads, "GiBps": mine}
        shown = [cell.block_size, str(cell.threads), *(f"{statistics.median(mine[tool]):.3f}" for tool in tools)]
        for tool in ours:
            for reference in FIO:
                ratios = [a / b for a, b in zip(mine[tool], mine[reference], strict=True)]
                row[f"{tool} / {reference}"] = ratios
                shown.append(spread(ratios))
        table.append(row)
        print("| " + " | ".join(shown) + " |")
    if args.json:
        machine = {"cpus": os.cpu_count(), "kernel": platform.release(), "load": [load_before, os.getloadavg()]}
        record = {"args": vars(args) | {"target": str(args.target), "json": str(args.json)}, "machine": machine}
        args.json.write_text(json.dumps(record | {"engines": sorted(engines), "cells": table, "time": time.time()}))


if __name__ == "__main__":
    main()
