"""Restore: read a checkpoint back cold, every rank its own files at once, and prove each file loadable and exact.

Each file is read and checked by the engine that wrote it (`Engine.read`): zip structure, every record and its
CRC32, the pickle against the plan, the small records against what the engine writes, and every payload block.
A wrong byte fails the restore whatever its speed, naming file, record or offset and what was found instead;
an I/O error names file and offset. After the timed read, each rank loads one of its files with `torch.load`
(mmap) as an independent check (`load_sample`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ckptqual.host import cache
from ckptqual.host.beneath import RunTree
from ckptqual.host.cpu import HostUse
from ckptqual.host.device_bytes import DeviceBytes
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import MAX_REPORTED, IntegrityError, Problem, RankIO, opened_path
from ckptqual.io.engines.readback import check_loaded, first_line, tensor_bytes
from ckptqual.limits.cache_served import cache_served_reason
from ckptqual.limits.host_bound import host_bound_reason
from ckptqual.plan.model import CheckpointPlan

# More of a checkpoint than this in the page cache before a restore makes it a cache read, not a drive read.
MAX_CACHED_FRACTION = 0.05
# Checking runs interleaved with the reads; below this headroom the result is the host's CPU more than the drive.
MIN_VERIFY_HEADROOM = 1.5


def read_checkpoint_files(io: RankIO, task: Any) -> int:
    """Rank side: reads the rank's files of one checkpoint and proves each loadable and exact; returns bytes read."""
    engine = make_engine(task.options["engine"])
    check_shared = getattr(engine, "check_shared", None)  # a format's shared file (dcp's .metadata), checked first
    if check_shared is not None:
        check_shared(io, task)
    problems: list[Problem] = []
    for index, spec in enumerate(task.plan.files):
        problems += engine.read(Path(task.directory) / spec.path, spec, index, io, _label(task, index))
    if problems:
        shown = "; ".join(p.describe() for p in problems[:MAX_REPORTED])
        more = f" (and more: at least {len(problems)} bad blocks)" if len(problems) > MAX_REPORTED else ""
        raise IntegrityError(f"{shown}{more}")  # the rank and what it was reading are said by the caller
    return task.plan.nbytes


def _label(task: Any, index: int) -> str:
    """How messages name the task's file `index`: its checkpoint directory and its path there."""
    return f"{Path(task.directory).name}/{task.plan.files[index].path}"


def sampled_file(checkpoint: int, files: int) -> int:
    """The file a rank loads after restoring `checkpoint`: the rotation loads every file once in `files` checkpoints."""
    return checkpoint % files


def load_sample(io: RankIO, task: Any) -> dict[str, float]:
    """Rank side, after a verified read: torch.load(weights_only=True, mmap=True) of one of the rank's files.

    An independent check of the verifier, not part of the restore's I/O, so it runs after the rank's timed read
    ends and is reported apart (`torch_load_sampled` files in `torch_load_sampled_s` seconds): a restarting job
    loads each file once, which the timed read already did. The loaded tensors must be the plan's, and the first
    payload block of each must be right as torch maps it (from the page cache: the read just brought it there).
    """
    engine = make_engine(task.options["engine"])
    if hasattr(engine, "load_sample"):  # a format its own library loads (dcp: dcp.load)
        return engine.load_sample(io, task)
    if not task.plan.files:
        return {"torch_load_sampled": 0, "torch_load_sampled_s": 0.0}
    start = time.monotonic()
    index = sampled_file(io.checkpoint, len(task.plan.files))
    spec, label = task.plan.files[index], _label(task, index)
    with opened_path(io, Path(task.directory) / spec.path) as reached:
        try:
            state = torch.load(reached, weights_only=True, mmap=True)
        except Exception as error:
            raise IntegrityError(
                f"{label}: torch.load(weights_only=True, mmap=True) failed though the verified read passed: "
                f"{first_line(error)}"
            ) from error
    check_loaded(label, state, spec.tensors, "torch.load(mmap=True)")
    for tensor, tensor_spec in enumerate(spec.tensors):
        first_block = tensor_bytes(state[tensor_spec.name])[:4096]
        for mismatch in io.verify(first_block, index, tensor, 0):
            raise IntegrityError(
                f"{label}: torch.load(mmap=True) sees tensor {tensor_spec.name!r} at tensor offset {mismatch.offset} "
                f"holding {mismatch.found}, though the verified read passed"
            )
    return {"torch_load_sampled": 1, "torch_load_sampled_s": time.monotonic() - start}


@dataclass(frozen=True)
class RestoreResult:
    """One cold restore: bytes, time to the slowest rank, and how much was cached beforehand."""

    checkpoint: int
    bytes: int
    seconds: float
    first_done_s: float
    cached_fraction_before: float
    payload_GBps: float
    ranks: list[dict]
    host: HostUse | None = None
    # Per node, where the ranks ran on several (runs.cluster): each node read what the next one wrote
    # (`read_files_of_node`), so that no node read back from the page cache that wrote the files.
    nodes: list[dict] = field(default_factory=list)
    device: DeviceBytes | None = None  # what the devices under the target read meanwhile (host.device_bytes)
    reshard: dict | None = None  # a restore onto another layout: what each new rank read (runs.reshard.figures)

    @property
    def GBps(self) -> float:
        return self.bytes / self.seconds / 1e9

    def invalid_reason(self) -> str | None:
        """Why this restore measured something other than the drive, if it did."""
        if self.cached_fraction_before > MAX_CACHED_FRACTION:
            return (
                f"{self.cached_fraction_before:.0%} of the checkpoint was still in the page cache after "
                f"eviction; the read would not come from the drive"
            )
        served = cache_served_reason(f"restore of checkpoint {self.checkpoint}", self.device)
        if served:
            return served
        if self.payload_GBps < MIN_VERIFY_HEADROOM * self.GBps:
            return (
                f"verification was the bottleneck: checking ran at {self.payload_GBps:.2f} GB/s on this host's "
                f"cores, under {MIN_VERIFY_HEADROOM:g}x the restore rate {self.GBps:.2f} GB/s; use a host with "
                f"more or faster cores"
            )
        return None

    def host_bound_reason(self) -> str | None:
        """Why this restore measured the host's CPUs rather than the drive, if it did (limits.host_bound)."""
        return host_bound_reason(self.host)

    def to_dict(self) -> dict:
        host = self.host.to_dict() if self.host else None
        cpu = self.host.cpu_s_per_GB(self.bytes) if self.host else None
        extra = {"host": host, "GBps": self.GBps, "cpu_s_per_GB": cpu, "host_bound": self.host_bound_reason()}
        extra |= {"device": self.device.to_dict() if self.device else None, "invalid": self.invalid_reason()}
        return {**self.__dict__, **extra}


def evict_checkpoint(tree: RunTree, directory: Path, plan: CheckpointPlan) -> float:
    """Drops the checkpoint's files (reached through `tree`) from the page cache; returns the fraction still cached."""
    return cache.evict_all(tree, (directory / f.path for rank in plan.ranks for f in rank.files))
