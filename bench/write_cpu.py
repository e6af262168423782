"""CPU seconds per GB that the ranks spend writing checkpoints, and the share of it that makes the payload.

Writes the review layout (8 ranks, 536 files) at a given scale with each engine, several rounds, on one
target, and reads every rank's CPU time (user + system, from /proc) before and after each checkpoint.
Run it on tmpfs to see the software alone (no drive in the way), or on a drive:

    python bench/write_cpu.py --target /dev/shm/bench --scale 0.0005 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from benchutil import cpu_seconds

from ckptqual.plan.workloads import load_workload
from ckptqual.runs.pool import RankPool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="directory to write in (default: a temp dir)")
    parser.add_argument("--scale", type=float, default=0.0005)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engines", default="stream,torch-save")
    args = parser.parse_args()
    plan = load_workload("llama3.1-405b-review").plan().scaled(args.scale)
    base = Path(tempfile.mkdtemp(prefix="ckptqual-bench-", dir=args.target))
    pool = RankPool(len(plan.ranks), seed=1)
    print(f"{plan.total_bytes / 1e9:.3f} GB per checkpoint, {plan.file_count} files, {len(plan.ranks)} ranks")
    try:
        for engine in args.engines.split(","):
            per_gb, speeds, payload = [], [], []
            for round_number in range(args.rounds):
                directory = base / f"{engine}-{round_number}"
                directory.mkdir()
                before = cpu_seconds(pool.pids)
                timing = pool.write_checkpoint(directory, round_number, plan.ranks, engine)
                spent = cpu_seconds(pool.pids) - before
                per_gb.append(spent / (timing.bytes / 1e9))
                payload.append(sum(r.payload_cpu_s for r in timing.ranks) / spent)
                speeds.append(timing.bytes / timing.seconds / 1e9)
                shutil.rmtree(directory)
            print(
                f"{engine:10} CPU s/GB median {statistics.median(per_gb):.3f} (min {min(per_gb):.3f}), "
                f"GB/s median {statistics.median(speeds):.2f}, payload {statistics.median(payload):.0%} of the CPU"
            )
    finally:
        pool.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
