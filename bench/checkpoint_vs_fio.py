"""A checkpoint write against fio for the same bytes and split, interleaved in one run, with the checkpoint's phases.

Each round writes, in turn (the order rotates from round to round): fio with one job per rank, each writing that
rank's bytes over as many files as the rank has, 1M buffered writes and an fsync at the end of each job; and the
workload's checkpoint with the `stream` engine, with each file's writeback started as soon as it is written
(the default) and without. A shared disk varies 2x from run to run, so only the medians of interleaved rounds
compare. Prints per path the median GB/s, its ratio to fio's, and the checkpoint's phases (median of the slowest
rank's seconds), and the host's load average meanwhile.

    python bench/checkpoint_vs_fio.py --target /mnt/nvme0/bench --workload llama3-8b --scale 0.015 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.workloads import load_workload
from ckptqual.runs.pool import RankPool


def fio_GBps(directory: Path, plan: CheckpointPlan) -> float:
    """fio: one job per rank writing the rank's bytes over as many files, sequential 1M buffered, end_fsync."""
    command = ["fio", f"--directory={directory}", "--rw=write", "--bs=1M", "--end_fsync=1", "--output-format=json"]
    for rank in plan.ranks:
        command += [f"--name=rank{rank.rank}", f"--size={rank.nbytes}", f"--nrfiles={max(1, len(rank.files))}"]
    report = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    written = sum(job["write"]["io_bytes"] for job in report["jobs"])
    runtime_s = max(job["write"]["runtime"] for job in report["jobs"]) / 1000  # the jobs run at once
    return written / runtime_s / 1e9


def checkpoint_GBps(pool: RankPool, directory: Path, plan: CheckpointPlan, early: bool) -> tuple[float, dict]:
    """The checkpoint's GB/s and its slowest rank's phases."""
    options = {"engine": "stream", "early_writeback": early}
    timing = pool.run("write", directory, plan.ranks, "bench checkpoint", 0, options)
    slowest = max(timing.ranks, key=lambda rank: rank.done_s)
    return timing.bytes / timing.seconds / 1e9, slowest.phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True, help="a directory on the drive (a scratch dir is made)")
    parser.add_argument("--workload", default="llama3-8b")
    parser.add_argument("--scale", type=float, default=0.015)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    plan = load_workload(args.workload).plan().scaled(args.scale)
    paths = {"fio": None, "checkpoint, early writeback": True, "checkpoint, writeback at fsync": False}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    phases: dict[str, list[dict]] = {name: [] for name in paths}
    loads = []
    scratch = Path(tempfile.mkdtemp(prefix="ckptqual-bench-", dir=args.target))
    try:
        with RankPool(len(plan.ranks), seed=1) as pool:
            for round_number in range(args.rounds):
                names = list(paths)
                names = names[round_number % len(names) :] + names[: round_number % len(names)]
                for name in names:
                    directory = scratch / f"round-{round_number}-{len(rates[name])}-{name.split(',')[0]}"
                    directory.mkdir()
                    if paths[name] is None:
                        rates[name].append(fio_GBps(directory, plan))
                    else:
                        rate, timed = checkpoint_GBps(pool, directory / "ckpt", plan, paths[name])
                        rates[name].append(rate)
                        phases[name].append(timed)
                    shutil.rmtree(directory)
                    loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    fio = statistics.median(rates["fio"])
    files = sum(len(r.files) for r in plan.ranks)
    size = f"{plan.total_bytes / 1e9:.3f} GB, {len(plan.ranks)} ranks, {files} files"
    print(f"{args.workload} at scale {args.scale}: {size}; {args.rounds} interleaved rounds on {args.target}")
    print(f"load average (1 min) during the rounds: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores")
    for name, values in rates.items():
        median = statistics.median(values)
        line = f"{name:32s} median {median:.3f} GB/s = {median / fio:.2f}x fio  (rounds: "
        line += ", ".join(f"{v:.3f}" for v in values) + ")"
        if phases[name]:
            names = dict.fromkeys(k for p in phases[name] for k in p)
            line += "  phases (s, median of slowest rank): " + ", ".join(
                f"{k} {statistics.median(p.get(k, 0.0) for p in phases[name]):.2f}" for k in names
            )
        print(line)


if __name__ == "__main__":
    main()
