"""What each rank of another parallel layout needs of a checkpoint's global tensors (`--restore-layout TPxPP`).

A global tensor is a planned name's pieces over the ranks, joined in rank order (as the dcp and safetensors formats
store them). A rank of the new layout needs, of each TP-split tensor of its pipeline stage's layers, its share of
the global tensor split evenly over the new TP ranks; of each replicated tensor (the norms), one copy; of the flat
optimizer state, its share over the ranks that hold one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.workloads import Parallelism, Workload, shard, stage_layers

OPTIMIZER = "optimizer.state"


class ReshardError(ValueError):
    """A layout the checkpoint cannot be restored onto; the message names the layout and the fix."""


def parse_layout(text: str) -> tuple[int, int]:
    """(TP, PP) of "TPxPP"."""
    tp, _, pp = text.partition("x")
    return int(tp), int(pp)


@dataclass(frozen=True)
class Need:
    """Elements [start, start + numel) of global tensor `name`."""

    name: str
    start: int
    numel: int


def new_layout_needs(workload: Workload, source: CheckpointPlan, tp: int, pp: int) -> list[list[Need]]:
    """What each rank of the TP x PP layout needs of the global tensors of `source` (the planned, unformatted
    checkpoint of `workload` at its scale)."""
    old = workload.parallelism
    if workload.layout != "deepspeed" or old.zero_stage == 3 or old.subset_processes is not None:
        raise ReshardError(
            f"--restore-layout: the workload {workload.name} is not a whole deepspeed job with ZeRO 0-2; restoring "
            f"onto another layout needs one (e.g. llama3.1-405b-dcp)"
        )
    if tp * pp != old.tp * old.pp:
        raise ReshardError(
            f"--restore-layout {tp}x{pp}: {tp * pp} ranks per replica, but the checkpoint was written by "
            f"{old.tp}x{old.pp} = {old.tp * old.pp}; give a TPxPP with that product (e.g. {old.tp * old.pp}x1)"
        )
    new = Parallelism(tp, pp, old.dp, old.zero_stage)
    pieces: dict[str, list[int]] = {}
    for rank_plan in source.ranks:
        for file in rank_plan.files:
            for spec in file.tensors:
                pieces.setdefault(spec.name, []).append(spec.numel)
    split = {
        t.name for layer in range(workload.model.layers + 3) for t in workload.model.layer_tensors(layer) if t.tp_split
    }
    holders = [r for r in range(new.world_size) if old.zero_stage > 0 or new.coordinates(r)[0] == 0]
    needs: list[list[Need]] = []
    for rank in range(new.world_size):
        dp, stage, tp_rank = new.coordinates(rank)
        own: list[Need] = []
        if dp == 0:  # ZeRO 0-2: the first replica holds the model states
            for layer in stage_layers(workload.model.layers, pp, stage):
                for tensor in workload.model.layer_tensors(layer):
                    total = sum(pieces[tensor.name])
                    if tensor.name in split:
                        start = sum(shard(total, tp, i) for i in range(tp_rank))
                        own.append(Need(tensor.name, start, shard(total, tp, tp_rank)))
                    else:
                        own.append(Need(tensor.name, 0, pieces[tensor.name][0]))
        if rank in holders:
            total, index = sum(pieces[OPTIMIZER]), holders.index(rank)
            start = sum(shard(total, len(holders), i) for i in range(index))
            own.append(Need(OPTIMIZER, start, shard(total, len(holders), index)))
        needs.append(own)
    return needs
