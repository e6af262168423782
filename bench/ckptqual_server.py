"""One ckptqual rank pool kept alive for a benchmark, driven by JSON lines on stdin, answering on stdout.

`bench/write_rows.py` starts one per source tree (PYTHONPATH), so the checkout and an older tree (`--before`)
run side by side in the same rounds. Requests:

    {"op": "checkpoint", "directory": D, "engine": E, "workload": W, "scale": S, "checkpoint": N}
    {"op": "restore", "directory": D, "engine": E, "workload": W, "scale": S, "checkpoint": N}
    {"op": "raw", "directory": D, "bytes_per_rank": B}

Each answer is {"bytes": ..., "seconds": ..., "cpu_s": ...}: payload bytes, the slowest rank's time, and the
ranks' CPU time (user + system): over the request, from /proc, for writes; over each rank's timed part, as the
rank counts it, for a restore (its torch.load sample after the timed part is not counted).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchutil import cpu_seconds

from ckptqual.plan.workloads import load_workload

try:
    from ckptqual.runs.pool import RankPool
except ImportError:  # a tree from before the pool had a module of its own (--before)
    from ckptqual.runs.ranks import RankPool

RANKS = 8


def serve(pool: RankPool) -> None:
    plans: dict[tuple[str, float], tuple] = {}
    for line in sys.stdin:
        print(json.dumps(answer(pool, json.loads(line), plans)), flush=True)


def answer(pool: RankPool, request: dict, plans: dict[tuple[str, float], tuple]) -> dict:
    """Runs one request on the pool: bytes, the slowest rank's seconds, the ranks' CPU seconds."""
    directory = Path(request["directory"])
    before = cpu_seconds(pool.pids)
    if request["op"] == "raw":
        options = {"bytes_per_rank": int(request["bytes_per_rank"])}
        timing = pool.run("raw-write", directory, None, "raw write", options=options)
        return {"bytes": timing.bytes, "seconds": timing.seconds, "cpu_s": cpu_seconds(pool.pids) - before}
    key = (request["workload"], float(request["scale"]))
    if key not in plans:
        plans[key] = load_workload(key[0]).plan().scaled(key[1]).ranks
    checkpoint, engine = int(request["checkpoint"]), request["engine"]
    if request["op"] == "restore":
        timing = pool.run("read", directory, plans[key], "restore", checkpoint, {"engine": engine})
        return {"bytes": timing.bytes, "seconds": timing.seconds, "cpu_s": sum(r.cpu_s for r in timing.ranks)}
    timing = pool.write_checkpoint(directory, checkpoint, plans[key], engine)
    return {"bytes": timing.bytes, "seconds": timing.seconds, "cpu_s": cpu_seconds(pool.pids) - before}


def main() -> None:
    with RankPool(RANKS, seed=1) as pool:
        print(json.dumps({"ready": True}), flush=True)
        serve(pool)


if __name__ == "__main__":
    main()
