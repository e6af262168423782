"""Checkpoint formats: how a plan's tensors are laid out in files, and the engine that writes and reads them.

`torch-save` is DLIO's layout, one torch.save archive per planned file, written by the `--engine` chosen; `dcp`
is torch.distributed.checkpoint's FileSystemWriter layout (plan.dcp), written by the `dcp` engine.
"""

from __future__ import annotations

from ckptqual.plan.dcp import METADATA, METADATA_TMP, dcp_plan
from ckptqual.plan.model import CheckpointPlan

FORMATS = ("torch-save", "dcp")
DEFAULT_FORMAT = "torch-save"
FORMAT_ENGINES = {"dcp": "dcp"}  # a format with an engine of its own: the engine registry's name


def formatted_plan(plan: CheckpointPlan, fmt: str, dcp_threads: int = 1) -> CheckpointPlan:
    """`plan`'s tensors laid out as the format `fmt` lays them out (the same payload bytes)."""
    if fmt == "dcp":
        return dcp_plan(plan, dcp_threads)
    if fmt != DEFAULT_FORMAT:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    return plan


def checkpoint_engine(fmt: str, engine: str) -> str:
    """The engine that writes and reads the checkpoints of format `fmt` (`engine`: the one torch-save files use)."""
    return FORMAT_ENGINES.get(fmt, engine)


def shared_files(fmt: str) -> tuple[str, ...]:
    """Files of a checkpoint directory beside the ranks' own: the coordinator's (dcp's metadata, and its temporary
    name before the rename)."""
    return (METADATA, METADATA_TMP) if fmt == "dcp" else ()
