"""Side-by-side write paths on one target, interleaved in one run: fio (the reference) against ckptqual.

Each round writes the same bytes with 8 writers, buffered, fsynced at the end, with every path in turn (the
order rotates from round to round):
fio sequential 1M writes, ckptqual's raw writer, the `stream` engine and the `torch-save` engine (one file
per rank). A shared disk varies 2x from run to run, so only the medians of interleaved rounds compare.
Then the peak memory of one writer per engine for two file sizes: `stream` must stay flat, `torch-save` grows.

    python bench/write_paths.py --target /mnt/nvme0/bench --gigabytes 2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from ckptqual.runs.layouts import regular_layout
from ckptqual.runs.pool import RankPool

RANKS = 8


def fio_GBps(directory: Path, total_bytes: int) -> float:
    """fio: 8 jobs, sequential 1M buffered writes, fsync at the end of each job."""
    command = [
        "fio",
        "--name=ckptqual-bench",
        f"--directory={directory}",
        "--rw=write",
        "--bs=1M",
        f"--numjobs={RANKS}",
        f"--size={total_bytes // RANKS}",
        "--end_fsync=1",
        "--group_reporting",
        "--output-format=json",
    ]
    report = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    job = report["jobs"][0]["write"]
    return job["io_bytes"] / (job["runtime"] / 1000) / 1e9


def ckptqual_GBps(pool: RankPool, directory: Path, total_bytes: int, engine: str | None) -> float:
    """ckptqual's raw writer (engine None) or a checkpoint engine writing one file per rank."""
    if engine is None:
        timing = pool.run("raw-write", directory, None, "raw write", options={"bytes_per_rank": total_bytes // RANKS})
    else:
        timing = pool.write_checkpoint(directory, 0, regular_layout(total_bytes, RANKS).ranks, engine)
    return timing.bytes / timing.seconds / 1e9


PEAK_RSS = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    from ckptqual.io.engines import make_engine
    from ckptqual.io.engines.base import RankIO
    from ckptqual.io.payload import PayloadGenerator
    from ckptqual.plan.model import FilePlan, TensorSpec
    engine, size, path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    spec = FilePlan("one.pt", (TensorSpec("x", size, "int8"),))
    make_engine(engine).write(path, spec, 0, RankIO(PayloadGenerator(1), rank=0))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    """
)


def peak_rss_bytes(engine: str, size: int, directory: Path) -> int:
    path = directory / f"rss-{engine}.pt"
    done = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, engine, str(size), str(path)], capture_output=True, text=True, check=True
    )
    path.unlink()
    return int(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=None, help="an empty directory (default: a temp dir)")
    parser.add_argument("--gigabytes", type=float, default=1.0, help="bytes per round, in GB (default: 1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptqual-bench-", dir=args.target))
    total = int(args.gigabytes * 1e9) // RANKS * RANKS
    paths = {
        "fio (reference)": None,
        "ckptqual raw": None,
        "stream engine": "stream",
        "torch-save engine": "torch-save",
    }
    rates: dict[str, list[float]] = {name: [] for name in paths}
    try:
        with RankPool(RANKS, seed=1) as pool:
            for round_number in range(args.rounds):
                names = list(paths)
                shift = round_number % len(names)  # rotate the order: no path always follows the same one
                for name in names[shift:] + names[:shift]:
                    engine = paths[name]
                    directory = work / f"round-{round_number}-{name.split()[0]}"
                    directory.mkdir()
                    if name.startswith("fio"):
                        rates[name].append(fio_GBps(directory, total))
                    elif name == "ckptqual raw":
                        rates[name].append(ckptqual_GBps(pool, directory, total, None))
                    else:
                        rates[name].append(ckptqual_GBps(pool, directory, total, engine))
                    shutil.rmtree(directory)
        print(f"write paths, {total / 1e9:.2f} GB per round, {RANKS} writers, buffered + fsync, {args.rounds} rounds")
        for name, values in rates.items():
            print(
                f"  {name:18} median {statistics.median(values):5.2f} GB/s  "
                f"(rounds: {', '.join(f'{v:.2f}' for v in values)})"
            )
        print("peak memory of one writer (RSS), 256 MB file vs 1 GB file")
        for engine in ("stream", "torch-save"):
            small, large = (peak_rss_bytes(engine, size, work) for size in (256 << 20, 1 << 30))
            print(f"  {engine:18} {small / 2**20:7.0f} MiB -> {large / 2**20:7.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
