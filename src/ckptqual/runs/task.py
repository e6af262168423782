"""What the ranks are told to do next, one task each: the message a pool sends every rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptqual.host.beneath import RunRoot
from ckptqual.host.cpu import HostSampler
from ckptqual.plan.model import RankPlan


@dataclass
class Task:
    """What every rank does next: an operation of `runs.worker.OPERATIONS` (or "stop") on its plan in `directory`,
    which lies in the run directory `root` (without one: the deepest existing directory above it); every entry is
    reached from there."""

    op: str
    checkpoint: int = 0
    directory: str = ""
    plan: RankPlan | None = None
    options: dict[str, Any] = field(default_factory=dict)
    sampler: HostSampler | None = None
    root: RunRoot | None = None

    def run_root(self) -> RunRoot:
        """`root`, or else the deepest directory above `directory` that exists."""
        if self.root is not None:
            return self.root
        above = Path(self.directory).parent
        while not above.is_dir():
            above = above.parent
        return RunRoot(str(above))
