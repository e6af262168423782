"""What the bench scripts share: dropping the page cache between rounds, the CPU time of worker processes, and a
ckptqual rank pool of any source tree in a child process (`Server`, which runs bench/ckptqual_server.py).

Standard library and `ckptqual.host.cache` only, so that it also serves a script run against an older ckptqual.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ckptqual.host import cache
from ckptqual.host.beneath import RunTree

_TICKS = os.sysconf("SC_CLK_TCK")
BENCH = Path(__file__).resolve().parent


def drop_caches(paths: Iterable[Path]) -> str:
    """Drops the whole page cache (root), else evicts the files' pages; says which was done."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for path in paths:
            with RunTree(path.parent) as tree:
                cache.evict(tree, path)
        return "posix_fadvise(DONTNEED) per file (not root)"


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU time of the processes `pids`, from /proc/PID/stat."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / _TICKS


def spread(values: list[float]) -> str:
    """min / median / max of per-round figures."""
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


@dataclass(frozen=True)
class Result:
    """One request of a rank pool: the bytes it moved, the slowest rank's seconds, the ranks' CPU seconds."""

    bytes: int
    seconds: float
    cpu_s: float

    @property
    def GBps(self) -> float:
        return self.bytes / self.seconds / 1e9


class Server:
    """A ckptqual rank pool in a child process running the code of the source tree `tree` (its root or its src/;
    None: the installed ckptqual)."""

    def __init__(self, tree: Path | None) -> None:
        env = dict(os.environ)
        if tree is not None:
            env["PYTHONPATH"] = str(tree / "src" if (tree / "src" / "ckptqual").is_dir() else tree)
        self.process = subprocess.Popen(
            [sys.executable, str(BENCH / "ckptqual_server.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            sys.exit(f"the ckptqual pool (PID {self.process.pid}) ended; see its error above")
        return json.loads(line)

    def request(self, **request: object) -> Result:
        self.process.stdin.write((json.dumps(request, default=str) + "\n").encode())
        self.process.stdin.flush()
        answer = self._answer()
        return Result(answer["bytes"], answer["seconds"], answer["cpu_s"])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(60)
