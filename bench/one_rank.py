"""One rank on one core against the same rank on two: rank 0 of a workload written (stream, fsync) and restored
(every byte verified) by a one-rank pool pinned with `taskset` to 1 CPU, then to 2 CPUs, interleaved round by
round with the page cache dropped before every measurement. The pool gives the rank its share of the CPUs it may
use (its lanes), so the second run differs from the first only in the cores the rank gets.

    python bench/one_rank.py --target /mnt/nvme0/bench --workload llama3-8b --scale 0.1 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchutil import drop_caches, spread

from ckptqual.plan.workloads import load_workload
from ckptqual.runs.pool import RankPool


def cpu_sets() -> dict[str, str]:
    """taskset's lists of this process's first one and first two usable CPUs, by label."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        sys.exit("one_rank: needs 2 CPUs to compare one core with two")
    return {"1": str(usable[0]), "2": f"{usable[0]},{usable[1]}"}


def one_round(target: Path, workload: str, scale: float) -> dict[str, float]:
    """Writes and restores rank 0's files once in a pool of one rank (under this process's affinity)."""
    rank = load_workload(workload).plan().scaled(scale).ranks[:1]
    work = Path(tempfile.mkdtemp(prefix="ckptqual-bench-one-rank-", dir=target))
    try:
        with RankPool(1, seed=5) as pool:
            written = pool.write_checkpoint(work / "checkpoint", 0, rank, "stream")
            drop_caches(work / "checkpoint" / spec.path for spec in rank[0].files)
            read = pool.run("read", work / "checkpoint", rank, "restore", 0, {"engine": "stream"})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "bytes": written.bytes,
        "write_s": written.seconds,
        "write_cpu_s": written.ranks[0].cpu_s,
        "read_s": read.seconds,
        "read_cpu_s": read.ranks[0].cpu_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="directory to write in (default: a temp dir)")
    parser.add_argument("--workload", default="llama3-8b")
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round", action="store_true", help=argparse.SUPPRESS)  # one round, as a child
    args = parser.parse_args()
    if args.round:
        print(json.dumps(one_round(args.target or Path(tempfile.gettempdir()), args.workload, args.scale)))
        return
    sets = cpu_sets()
    figures: dict[str, list[dict[str, float]]] = {label: [] for label in sets}
    for number in range(args.rounds):
        for label in list(sets) if number % 2 == 0 else list(sets)[::-1]:
            command = ["taskset", "-c", sets[label], sys.executable, __file__, "--round", "--workload", args.workload]
            command += ["--scale", str(args.scale)] + (["--target", str(args.target)] if args.target else [])
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            figures[label].append(json.loads(done.stdout.splitlines()[-1]))
        print(f"round {number + 1}/{args.rounds} done", flush=True)
    nbytes = figures["1"][0]["bytes"]
    print(f"\nrank 0 of {args.workload} at scale {args.scale:g}: {nbytes / 1e9:.2f} GB; {args.rounds} rounds\n")
    print(
        "| phase | GB/s on 1 CPU (median) | GB/s on 2 CPUs (median) | 2 / 1, min / median / max | GB per CPU-s, 1 / 2 |"
    )
    print("|---|---|---|---|---|")
    for phase in ("write", "read"):
        rates = {label: [r["bytes"] / r[f"{phase}_s"] / 1e9 for r in rounds] for label, rounds in figures.items()}
        per_cpu = {
            label: statistics.median(r["bytes"] / r[f"{phase}_cpu_s"] / 1e9 for r in rounds)
            for label, rounds in figures.items()
        }
        ratios = [two / one for one, two in zip(*rates.values(), strict=True)]
        name = "checkpoint write" if phase == "write" else "verified restore"
        print(
            f"| {name} | {statistics.median(rates['1']):.2f} | {statistics.median(rates['2']):.2f} | "
            f"{spread(ratios)} | {per_cpu['1']:.2f} / {per_cpu['2']:.2f} |"
        )


if __name__ == "__main__":
    main()
