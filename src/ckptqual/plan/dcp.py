"""A plan laid out as torch.distributed.checkpoint's FileSystemWriter lays it out: per rank, `thread_count` files
`__{rank}_{i}.distcp` holding its tensors spread by size as torch spreads them; every tensor a chunk of a global
tensor (its name's pieces over the ranks, in rank order), with its offset, as DCP records a DTensor's shards."""

from __future__ import annotations

from dataclasses import dataclass

from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.spread import note_dtype, split_by_size

METADATA = ".metadata"
METADATA_TMP = ".metadata.tmp"
MAX_THREADS = 64


@dataclass(frozen=True)
class Chunk:
    """One tensor a rank writes: elements [offset, offset + numel) of the global tensor `spec.name`, tensor
    `tensor` of the rank's file `file`."""

    spec: TensorSpec
    offset: int
    rank: int
    file: int
    tensor: int


@dataclass(frozen=True)
class DcpLayout:
    """Every chunk of one checkpoint, in the order the ranks write them; the global tensors they make up."""

    chunks: tuple[Chunk, ...]

    def global_numel(self) -> dict[str, int]:
        """Each global tensor's elements, in the order their first chunk comes."""
        sizes: dict[str, int] = {}
        for chunk in self.chunks:
            sizes[chunk.spec.name] = max(sizes.get(chunk.spec.name, 0), chunk.offset + chunk.spec.numel)
        return sizes

    def of_rank(self, rank: int) -> tuple[Chunk, ...]:
        return tuple(chunk for chunk in self.chunks if chunk.rank == rank)


@dataclass(frozen=True)
class DcpRankPlan(RankPlan):
    """A rank's `.distcp` files, with the whole checkpoint's layout (its coordinator writes `.metadata` from it)."""

    layout: DcpLayout | None = None


def dcp_plan(plan: CheckpointPlan, threads: int = 1) -> CheckpointPlan:
    """`plan`'s tensors as a DCP checkpoint written with `thread_count=threads`; same payload bytes."""
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"--dcp-threads {threads}: must be from 1 to {MAX_THREADS}")
    offsets: dict[str, int] = {}
    dtypes: dict[str, str] = {}
    chunks: list[Chunk] = []
    rank_files: list[tuple[int, tuple[FilePlan, ...]]] = []
    for rank in plan.ranks:
        tensors = [spec for file in rank.files for spec in file.tensors]
        names = [spec.name for spec in tensors]
        if len(set(names)) != len(names):
            duplicate = next(name for name in names if names.count(name) > 1)
            raise ValueError(f"rank {rank.rank} holds tensor {duplicate!r} twice: a DCP state dict names each once")
        files = []
        for index, bucket in enumerate(split_by_size(threads, tensors)):
            files.append(FilePlan(f"__{rank.rank}_{index}.distcp", tuple(bucket)))
            for position, spec in enumerate(bucket):
                note_dtype(dtypes, spec, rank.rank)
                chunks.append(Chunk(spec, offsets.get(spec.name, 0), rank.rank, index, position))
                offsets[spec.name] = offsets.get(spec.name, 0) + spec.numel
        rank_files.append((rank.rank, tuple(files)))
    layout = DcpLayout(tuple(chunks))
    ranks = tuple(DcpRankPlan(rank, files, layout) for rank, files in rank_files)
    return CheckpointPlan(plan.workload, ranks, plan.scale, plan.description, dict(plan.parallelism))
