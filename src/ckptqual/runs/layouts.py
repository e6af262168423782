"""Odd shard layouts on the drive: written, read back and verified, and timed against a regular layout.

The regular layout has the same total bytes, split evenly as one file per rank; both are written by the
same ranks, one right after the other, so that their throughputs compare within one run of a noisy disk.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ckptqual.faults import RunError
from ckptqual.host.beneath import RunTree
from ckptqual.limits.limits import MIN_JUDGED_BYTES
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.runs.pool import Pool
from ckptqual.runs.restore import evict_checkpoint

# Payload checkpoint numbers of layout examples: far above any fill checkpoint, so blocks never repeat.
_FIRST_CHECKPOINT = 1 << 30


def padded(plan: CheckpointPlan, ranks: int) -> CheckpointPlan:
    """`plan` with ranks that write nothing added up to `ranks` (the pool's size)."""
    if len(plan.ranks) > ranks:
        raise ValueError(f"layout has {len(plan.ranks)} ranks, the run has {ranks}")
    extra = tuple(RankPlan(rank, ()) for rank in range(len(plan.ranks), ranks))
    return CheckpointPlan(plan.workload, plan.ranks + extra, plan.scale, plan.description, dict(plan.parallelism))


def regular_layout(total_bytes: int, ranks: int) -> CheckpointPlan:
    """`total_bytes` split evenly over `ranks` ranks, one int8 tensor in one file each."""
    shares = [total_bytes // ranks + (1 if r < total_bytes % ranks else 0) for r in range(ranks)]
    return CheckpointPlan(
        "regular",
        tuple(
            RankPlan(r, (FilePlan(f"regular-{r}.pt", (TensorSpec("data", n, "int8"),)),)) for r, n in enumerate(shares)
        ),
    )


@dataclass(frozen=True)
class LayoutResult:
    """One odd layout and its regular twin: bytes, seconds, and the read-back."""

    example: int
    bytes: int
    files: int
    odd_seconds: float
    regular_seconds: float
    read_seconds: float

    @property
    def odd_GBps(self) -> float:
        return self.bytes / self.odd_seconds / 1e9

    @property
    def regular_GBps(self) -> float:
        return self.bytes / self.regular_seconds / 1e9

    @property
    def ratio(self) -> float:
        """Odd-layout throughput over regular-layout throughput."""
        return self.regular_seconds / self.odd_seconds

    @property
    def judged(self) -> bool:
        return self.bytes >= MIN_JUDGED_BYTES

    def to_dict(self) -> dict:
        return {
            **self.__dict__,
            "odd_GBps": self.odd_GBps,
            "regular_GBps": self.regular_GBps,
            "ratio": self.ratio,
            "judged": self.judged,
        }


class LayoutSpace(Protocol):
    """Where layouts are written: the run records a directory's files before writing them, and removes only those."""

    def own(self, directory: Path, files: list[str]) -> None: ...

    def remove(self, directory: Path, what: str) -> None: ...


def run_layout(
    pool: Pool, tree: RunTree, root: Path, plan: CheckpointPlan, engine: str, example: int, space: LayoutSpace
) -> LayoutResult:
    """Writes the regular twin and the odd layout in `root` (in `tree`), reads the odd one back cold and verifies every
    byte.

    Raises RankFailure (integrity or I/O) with the file and offset; removes what it wrote either way.
    """
    odd = padded(plan, pool.ranks)
    regular = regular_layout(odd.total_bytes, pool.ranks)
    checkpoint = _FIRST_CHECKPOINT + 2 * example
    directories = (root / f"layout-{example:03d}-regular", root / f"layout-{example:03d}")
    names = (f"the regular twin of layout {example}", f"layout {example}")
    order = (0, 1) if example % 2 == 0 else (1, 0)  # alternate which goes first, so neither gains from its turn
    layouts = (regular, odd)
    try:
        times = [0.0, 0.0]
        for number in order:
            space.own(directories[number], [f.path for rank in layouts[number].ranks for f in rank.files])
            written = pool.write_checkpoint(
                directories[number], checkpoint + number, layouts[number].ranks, engine, what=names[number]
            )
            times[number] = written.seconds
        space.remove(directories[0], f"removing {names[0]}")
        evict_checkpoint(tree, directories[1], odd)
        read = pool.run(
            "read", directories[1], odd.ranks, f"read-back of layout {example}", checkpoint + 1, {"engine": engine}
        )
    finally:
        for directory, name in zip(directories, names, strict=True):
            with contextlib.suppress(RunError):  # recorded by the remover; never hides the failure that matters
                space.remove(directory, f"removing {name}")
    return LayoutResult(example, odd.total_bytes, odd.file_count, times[1], times[0], read.seconds)
