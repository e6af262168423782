"""Checkpoint formats: how a plan's tensors are laid out in files, and the engine that writes and reads them.

`torch-save` is DLIO's layout, one torch.save archive per planned file, written by the `--engine` chosen; `dcp`
is torch.distributed.checkpoint's FileSystemWriter layout (plan.dcp), written by the `dcp` engine; `safetensors` is a
Hugging Face safetensors export (plan.safetensors), written by the `safetensors` engine.
"""

from __future__ import annotations

from ckptqual.plan.dcp import METADATA, METADATA_TMP, dcp_plan
from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.safetensors import INDEX, safetensors_plan

FORMATS = ("torch-save", "dcp", "safetensors")
DEFAULT_FORMAT = "torch-save"
# A format with an engine of its own: that engine's name in the registry.
FORMAT_ENGINES = {"dcp": "dcp", "safetensors": "safetensors"}


def formatted_plan(plan: CheckpointPlan, fmt: str, dcp_threads: int = 1) -> CheckpointPlan:
    """`plan`'s tensors laid out as the format `fmt` lays them out (the same payload bytes)."""
    if fmt == "dcp":
        return dcp_plan(plan, dcp_threads)
    if fmt == "safetensors":
        return safetensors_plan(plan)
    if fmt != DEFAULT_FORMAT:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    return plan


def checkpoint_engine(fmt: str, engine: str) -> str:
    """The engine that writes and reads the checkpoints of format `fmt` (`engine`: the one torch-save files use)."""
    return FORMAT_ENGINES.get(fmt, engine)


def shared_files(fmt: str) -> tuple[str, ...]:
    """Files of a checkpoint directory beside the ranks' own: the coordinator's (dcp's metadata, and its temporary
    name before the rename)."""
    return {"dcp": (METADATA, METADATA_TMP), "safetensors": (INDEX,)}.get(fmt, ())
