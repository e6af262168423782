"""Spreading a checkpoint's tensors over a format's files (plan.dcp, plan.safetensors): torch's greedy split by size,
and the rule that a tensor's name has one dtype on every rank."""

from __future__ import annotations

from ckptqual.plan.model import TensorSpec


def split_by_size(bins: int, tensors: list[TensorSpec]) -> list[list[TensorSpec]]:
    """torch's `_split_by_size_and_type` for tensors: one bin keeps the order; else largest first, each into the
    bin with fewest bytes so far (the first such)."""
    if bins == 1:
        return [list(tensors)]
    buckets: list[list[TensorSpec]] = [[] for _ in range(bins)]
    sizes = [0] * bins
    for spec in sorted(tensors, key=lambda t: t.nbytes, reverse=True):
        index = min(range(bins), key=sizes.__getitem__)
        buckets[index].append(spec)
        sizes[index] += spec.nbytes
    return buckets


def note_dtype(dtypes: dict[str, str], spec: TensorSpec, rank: int) -> None:
    """Notes `spec`'s dtype under its name; a name seen before with another dtype is refused (ValueError)."""
    if dtypes.setdefault(spec.name, spec.dtype) != spec.dtype:
        raise ValueError(f"tensor {spec.name!r} is {spec.dtype} on rank {rank}, {dtypes[spec.name]} before")
