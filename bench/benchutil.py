"""What the bench scripts share: dropping the page cache between rounds, and the CPU time of worker processes.

Standard library and `ckptqual.host.cache` only, so that it also serves a script run against an older ckptqual.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from pathlib import Path

from ckptqual.host import cache
from ckptqual.host.beneath import RunTree

_TICKS = os.sysconf("SC_CLK_TCK")


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
