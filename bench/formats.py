"""CPU seconds per GB of each checkpoint format's writer and verified restore, side by side on the same plan.

One rank pool writes a checkpoint of the workload at --scale in each format in turn (the order rotates from round
to round), then restores it cold as a qualification run does (every byte verified; the library's sampled load
after the timed read is not counted), its files evicted from the page cache before. CPU seconds are the ranks'
own (user + system, over each rank's timed part) per 1e9 payload bytes; the ratio is each format's median against
torch-save's.

    python bench/formats.py --target /dev/shm --workload llama3.1-405b-tp4pp2 --scale 0.0005 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from ckptqual.host import cache
from ckptqual.host.beneath import RunTree
from ckptqual.plan.formats import FORMATS, checkpoint_engine, formatted_plan
from ckptqual.plan.workloads import load_workload
from ckptqual.runs.pool import RankPool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="directory to write in (default: a temp dir)")
    parser.add_argument("--workload", default="llama3.1-405b-tp4pp2")
    parser.add_argument("--scale", type=float, default=0.0005)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--engine", default="stream", help="the engine of torch-save files")
    args = parser.parse_args()
    formats = args.formats.split(",")
    source = load_workload(args.workload).plan().scaled(args.scale)
    plans = {fmt: formatted_plan(source, fmt) for fmt in formats}
    base = Path(tempfile.mkdtemp(prefix="ckptqual-bench-", dir=args.target))
    pool = RankPool(len(source.ranks), seed=1)
    figures: dict[str, dict[str, list[float]]] = {fmt: {"write": [], "restore": []} for fmt in formats}
    print(f"{args.workload} at scale {args.scale:g}: {source.total_bytes / 1e9:.3f} GB per checkpoint, "
          f"{len(source.ranks)} ranks; {args.rounds} rounds in {base}")  # fmt: skip
    try:
        for round_number in range(args.rounds):
            for fmt in formats[round_number % len(formats) :] + formats[: round_number % len(formats)]:
                plan, engine = plans[fmt], checkpoint_engine(fmt, args.engine)
                directory = base / f"{fmt}-{round_number}"
                written = pool.write_checkpoint(directory, round_number, plan.ranks, engine)
                figures[fmt]["write"].append(sum(r.cpu_s for r in written.ranks) / (written.bytes / 1e9))
                with RunTree(base) as tree:
                    for rank in plan.ranks:
                        for spec in rank.files:
                            cache.evict(tree, directory / spec.path)
                read = pool.run("read", directory, plan.ranks, "restore", round_number, {"engine": engine})
                figures[fmt]["restore"].append(sum(r.cpu_s for r in read.ranks) / (read.bytes / 1e9))
                shutil.rmtree(directory)
    finally:
        pool.close()
        shutil.rmtree(base, ignore_errors=True)
    reference = {part: statistics.median(figures[formats[0]][part]) for part in ("write", "restore")}
    print(f"| format | write CPU s/GB (median, min-max) | x {formats[0]} | restore CPU s/GB | x {formats[0]} |")
    print("|---|---|---|---|---|")
    for fmt in formats:
        cells = []
        for part in ("write", "restore"):
            values = figures[fmt][part]
            median = statistics.median(values)
            cells += [f"{median:.3f} ({min(values):.3f}-{max(values):.3f})", f"{median / reference[part]:.2f}"]
        print(f"| {fmt} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
