"""The built-in qualification's first fill pass, this checkout against another source tree, interleaved in one run:
what the suite itself spends per GB as `pytest tests_qual` runs it (the review's layout at its default scale, 536
files of 8 ranks per checkpoint, every file and directory fsynced).

Per round, each tree (the order rotating from round to round) runs `pytest tests_qual/test_fill.py --passes 1`
from its own root, with its own source on PYTHONPATH, on a fresh directory of the target with the page cache
dropped before, and the figures are read from the pass's record in its results file: the ranks' CPU seconds per
GB (user + system over each rank's timed part) and the pass's GB/s. Only the fill runs, so each run's verdict is
INCOMPLETE by design; a run that leaves no first pass in its results file stops the benchmark.

    python bench/builtin_run.py --before /tmp/before --target /var/tmp/bench --rounds 3

`--before SRC` is another source tree of ckptqual (its root: src/, tests_qual/, fixtures/, thresholds/), for
example an earlier version unpacked with `git archive <version> | tar -x -C SRC`; without it only this checkout
runs.
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
from typing import Any

from benchutil import drop_caches, spread

CHECKOUT = Path(__file__).resolve().parent.parent


def first_pass(tree: Path, target: Path, options: list[str]) -> tuple[dict[str, Any], str]:
    """Runs the fill of the built-in qualification from `tree` on an empty directory of `target`: its first pass, and
    how the page cache was emptied before it."""
    work = Path(tempfile.mkdtemp(prefix="ckptqual-bench-builtin-", dir=target))
    results = work / "results.json"
    drive = work / "drive"
    drive.mkdir()
    command = [sys.executable, "-m", "pytest", "tests_qual/test_fill.py", "-q", "-p", "no:cacheprovider"]
    command += ["--passes", "1", f"--target={drive}", f"--results={results}", *options]
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    try:
        emptied = drop_caches([])  # without root, nothing: the run's directory is new
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
        try:
            passes = json.loads(results.read_text())["passes"]
        except (OSError, ValueError, KeyError) as error:
            tail = (done.stdout + done.stderr)[-800:]
            sys.exit(f"{tree}: pytest exited {done.returncode} and left no pass in {results} ({error}):\n{tail}")
        if not passes:
            sys.exit(f"{tree}: pytest exited {done.returncode} without a fill pass:\n{done.stdout[-800:]}")
        return passes[0], emptied
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=None, help="directory on the drive (default: a temp dir)")
    parser.add_argument("--before", type=Path, default=None, help="another source tree to run in the same rounds")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("pytest_options", nargs="*", help="more options for both runs (after --), e.g. --scale 1e-3")
    args = parser.parse_args()
    trees = {"this checkout": CHECKOUT} | ({"before": args.before.resolve()} if args.before else {})
    for name, tree in trees.items():
        if not (tree / "tests_qual" / "test_fill.py").is_file() or not (tree / "src" / "ckptqual").is_dir():
            sys.exit(f"{name} ({tree}) is not a ckptqual source tree: it needs src/ckptqual and tests_qual/")
    target = args.target or Path(tempfile.gettempdir())
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    emptied: set[str] = set()
    load_before = os.getloadavg()
    for round_number in range(args.rounds):
        names = list(trees)
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            found, how = first_pass(trees[name], target, args.pytest_options)
            figures[name].append(found)
            emptied.add(how)
        print(f"round {round_number + 1}/{args.rounds} done", flush=True)
    first = figures["this checkout"][0]
    print(
        f"\nthe built-in qualification's first fill pass: {len(first['checkpoints'])} checkpoints, "
        f"{first['bytes'] / 1e9:.3f} GB on {target}; {args.rounds} interleaved rounds, "
        f"{' / '.join(sorted(emptied))} before each; "
        f"{os.cpu_count()} CPUs, load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}\n"
    )
    print("| tree | GB/s, min / median / max | CPU s per GB, min / median / max | CPU s per GB / this checkout's |")
    print("|---|---|---|---|")
    ours = [p["cpu_s_per_GB"] for p in figures["this checkout"]]
    for name, passes in figures.items():
        cpu = [p["cpu_s_per_GB"] for p in passes]
        ratios = [theirs / mine for theirs, mine in zip(cpu, ours, strict=True)]
        rates = spread([p["throughput_GBps"] for p in passes])
        print(f"| {name} | {rates} | {spread(cpu)} | {spread(ratios)} |")
    if args.json:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "load": [load_before, os.getloadavg()]}
        args.json.write_text(json.dumps(record | {"passes": figures, "median_cpu": statistics.median(ours)}))


if __name__ == "__main__":
    main()
