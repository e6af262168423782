"""A checkpoint write against fio for the same bytes and split, side by side in one run, with the checkpoint's phases.

Each round writes, in turn (the order rotates from round to round, so that a host's drift falls on every path alike):

  fio                          one job per rank, each writing that rank's bytes over as many files as the rank has,
                               1M buffered writes, an fsync at the end of each job (--end_fsync=1);
  checkpoint, early writeback  the workload's checkpoint with the `stream` engine as the suite writes it: the
                               writeback of each window of a file is started as soon as it is written, and of each
                               file once it is whole; every file and directory then fsynced;
  checkpoint, writeback at fsync  the same, leaving writeback to the kernel until the fsyncs.

Both checkpoint paths make the same bytes durable before they count as done. A shared disk varies 2x from run to
run, so compare only rounds run side by side: the table gives per path the median GB/s, the median of its per-round
ratios to fio's (x fio), the median CPU seconds per GB written (user plus system: of fio's processes, from getrusage
of the ended children; of the ranks, each over its timed part, all its threads), the median over the rounds of the
slowest rank's seconds in each phase of the checkpoint (mkdir, write, fsync, commit), and each round's GB/s with the
host's 1-minute load average after it in brackets. Run it on a quiet host: a load average above the core count makes
the ranks wait for CPUs, not the drive. The CPU seconds per GB vary less with the load and show what each path costs.

    python bench/checkpoint_vs_fio.py --target /mnt/nvme0/bench --workload llama3-8b --scale 0.015 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.workloads import load_workload
from ckptqual.runs.pool import RankPool


def _children_cpu_s() -> float:
    """User plus system CPU seconds of this process's ended and waited-for children (fio and its jobs)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def fio_run(directory: Path, plan: CheckpointPlan) -> tuple[float, float]:
    """fio: one job per rank writing the rank's bytes over as many files, sequential 1M buffered, end_fsync. Returns
    its GB/s and the CPU seconds per GB that fio's processes spent (getrusage of the ended children)."""
    command = ["fio", f"--directory={directory}", "--rw=write", "--bs=1M", "--end_fsync=1", "--output-format=json"]
    for rank in plan.ranks:
        command += [f"--name=rank{rank.rank}", f"--size={rank.nbytes}", f"--nrfiles={max(1, len(rank.files))}"]
    cpu_before = _children_cpu_s()
    report = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    cpu_s = _children_cpu_s() - cpu_before
    written = sum(job["write"]["io_bytes"] for job in report["jobs"])
    runtime_s = max(job["write"]["runtime"] for job in report["jobs"]) / 1000  # the jobs run at once
    return written / runtime_s / 1e9, cpu_s / (written / 1e9)


def checkpoint_run(pool: RankPool, directory: Path, plan: CheckpointPlan, early: bool) -> tuple[float, float, dict]:
    """The checkpoint's GB/s, the CPU seconds per GB its ranks spent (each rank's own user plus system CPU over its
    timed part, all its threads), and its slowest rank's phases."""
    options = {"engine": "stream", "early_writeback": early}
    timing = pool.run("write", directory, plan.ranks, "bench checkpoint", 0, options)
    slowest = max(timing.ranks, key=lambda rank: rank.done_s)
    cpu_s = sum(rank.cpu_s for rank in timing.ranks)
    return timing.bytes / timing.seconds / 1e9, cpu_s / (timing.bytes / 1e9), slowest.phases


PATHS: dict[str, bool | None] = {  # path: early writeback (None: fio)
    "fio": None,
    "checkpoint, early writeback": True,
    "checkpoint, writeback at fsync": False,
}
PHASES = ("mkdir", "write", "fsync", "commit")


@dataclass
class Rounds:
    """One path's rounds: GB/s, CPU seconds per GB, the load average after each, and the slowest rank's phases."""

    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)


def run_rounds(target: Path, plan: CheckpointPlan, rounds: int) -> dict[str, Rounds]:
    """`rounds` rounds of every path, in an order that rotates, each in a scratch directory removed after it."""
    results = {name: Rounds() for name in PATHS}
    scratch = Path(tempfile.mkdtemp(prefix="ckptqual-bench-", dir=target))
    try:
        with RankPool(len(plan.ranks), seed=1) as pool:
            for round_number in range(rounds):
                names = list(PATHS)
                names = names[round_number % len(names) :] + names[: round_number % len(names)]
                for name in names:
                    directory = scratch / f"round-{round_number}-{name.split(',')[0]}"
                    directory.mkdir()
                    early = PATHS[name]
                    if early is None:
                        rate, cpu = fio_run(directory, plan)
                    else:
                        rate, cpu, timed = checkpoint_run(pool, directory / "ckpt", plan, early)
                        results[name].phases.append(timed)
                    results[name].rates.append(rate)
                    results[name].cpu.append(cpu)
                    shutil.rmtree(directory)
                    results[name].loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def table(results: dict[str, Rounds]) -> list[str]:
    """One row per path: median GB/s, median per-round ratio to fio, median CPU s/GB, median phases, the rounds with
    their load."""
    fio = results["fio"].rates
    header = f"{'path':32s} {'GB/s':>6s} {'x fio':>6s} {'CPU s/GB':>8s}  " + " ".join(f"{p:>6s}" for p in PHASES)
    lines = [header + "  rounds: GB/s (load average)", "-" * len(header)]
    for name, found in results.items():
        ratio = statistics.median(rate / base for rate, base in zip(found.rates, fio, strict=True))
        phases = [statistics.median(p.get(k, 0.0) for p in found.phases) if found.phases else None for k in PHASES]
        cells = " ".join(f"{v:6.2f}" if v is not None else f"{'-':>6s}" for v in phases)
        rounds = ", ".join(f"{rate:.3f} ({load:.1f})" for rate, load in zip(found.rates, found.loads, strict=True))
        cpu = statistics.median(found.cpu)
        lines.append(f"{name:32s} {statistics.median(found.rates):6.3f} {ratio:6.2f} {cpu:8.3f}  {cells}  {rounds}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--target",
        type=Path,
        required=True,
        help="a directory on the drive; a scratch directory is made in it and removed",
    )
    parser.add_argument(
        "--workload", default="llama3-8b", help="a shipped workload's name or a .toml path (default: %(default)s)"
    )
    parser.add_argument(
        "--scale", type=float, default=0.015, help="shrink the workload's tensors by this factor (default: %(default)s)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of every path; the table gives medians (default: %(default)s)"
    )
    args = parser.parse_args()
    plan = load_workload(args.workload).plan().scaled(args.scale)
    results = run_rounds(args.target, plan, args.rounds)
    files = sum(len(r.files) for r in plan.ranks)
    size = f"{plan.total_bytes / 1e9:.3f} GB, {len(plan.ranks)} ranks, {files} files"
    print(
        f"{args.workload} at scale {args.scale}: {size}; {args.rounds} rounds on {args.target}, {os.cpu_count()} cores"
    )
    print("\n".join(table(results)))
    print("phases: median of the slowest rank's seconds; x fio: median of the per-round ratios to fio's GB/s")
    print("CPU s/GB: median of the rounds' user+system CPU seconds per GB written, of fio's processes or of the ranks")


if __name__ == "__main__":
    main()
