"""Stage: every rank copies its state into host memory, as an asynchronous save does before it writes (the stall of
`--async-save`). The copy runs at the host's memory rate through one reused buffer: without a GPU there is no device
memory to copy from, so the time is that of a host-to-host copy of the rank's bytes."""

from __future__ import annotations

import numpy as np

from ckptqual.io.engines.base import RankIO
from ckptqual.runs.task import Task


def stage_to_host(io: RankIO, task: Task) -> int:
    """Rank side: copies as many bytes as the rank's plan holds from its state (the rank's payload buffer) into
    host memory, chunk by chunk; returns the bytes copied."""
    if task.plan is None:
        raise ValueError(f"the staging of checkpoint {task.checkpoint} came without the rank's plan")
    total = task.plan.nbytes
    source, staged = io.buffer, np.empty_like(io.buffer)
    source[:] = 0x5A  # the source's pages are touched once, so the copy is not of the zero page
    copied = 0
    while copied < total:
        count = min(source.nbytes, total - copied)
        np.copyto(staged[:count], source[:count])
        copied += count
    return copied
