"""A plan laid out as a Hugging Face safetensors export: the global tensors (each planned name's pieces over the
ranks, in rank order, joined) in shards `model-0000K-of-0000N.safetensors`, one shard per writing rank, balanced
by size, each shard's tensors in the order the safetensors library writes them; `model.safetensors.index.json`
maps every tensor to its shard."""

from __future__ import annotations

from dataclasses import dataclass

from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.spread import note_dtype, split_by_size

INDEX = "model.safetensors.index.json"
# The safetensors library's dtype order (its Dtype enum, for the dtypes a plan holds); a file holds its tensors
# largest dtype first, then by name.
DTYPE_ORDER = ("uint8", "int8", "float8_e5m2", "float8_e4m3fn", "float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Piece:
    """Elements of a global tensor that one rank holds: tensor `tensor` of its file `file` in the planned layout
    (the payload's identity), `numel` of them."""

    rank: int
    file: int
    tensor: int
    numel: int


@dataclass(frozen=True)
class ShardFile(FilePlan):
    """One shard: its global tensors (`tensors`) and, for each, the pieces it joins, in order."""

    pieces: tuple[tuple[Piece, ...], ...] = ()


@dataclass(frozen=True)
class ShardedRankPlan(RankPlan):
    """A rank's shard (none where there are more ranks than shards), with every shard's names for the index."""

    weight_map: tuple[tuple[str, str], ...] = ()
    total_bytes: int = 0  # every shard's tensor bytes: the index's total_size


def file_order(spec: TensorSpec) -> tuple[int, str]:
    return (-DTYPE_ORDER.index(spec.dtype), spec.name)


def safetensors_plan(plan: CheckpointPlan) -> CheckpointPlan:
    """`plan`'s tensors as a safetensors export; the same payload bytes."""
    pieces: dict[str, list[Piece]] = {}
    dtypes: dict[str, str] = {}
    for rank in plan.ranks:
        for file_index, file in enumerate(rank.files):
            for tensor_index, spec in enumerate(file.tensors):
                note_dtype(dtypes, spec, rank.rank)
                pieces.setdefault(spec.name, []).append(Piece(rank.rank, file_index, tensor_index, spec.numel))
    tensors = [TensorSpec(name, sum(p.numel for p in parts), dtypes[name]) for name, parts in pieces.items()]
    count = min(len(plan.ranks), len(tensors))
    files = []
    for index, shard in enumerate(split_by_size(count, tensors)):  # one shard keeps the order: sorted below
        ordered = tuple(sorted(shard, key=file_order))
        name = f"model-{index + 1:05d}-of-{count:05d}.safetensors"
        files.append(ShardFile(name, ordered, tuple(tuple(pieces[spec.name]) for spec in ordered)))
    weight_map = tuple(sorted((spec.name, file.path) for file in files for spec in file.tensors))
    ranks = tuple(
        ShardedRankPlan(rank.rank, (files[position],) if position < count else (), weight_map, plan.total_bytes)
        for position, rank in enumerate(plan.ranks)
    )
    return CheckpointPlan(plan.workload, ranks, plan.scale, plan.description, dict(plan.parallelism))
