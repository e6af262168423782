"""The checkpoint plan: which rank writes which files holding which tensors, exact to the byte."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


@dataclass(frozen=True)
class TensorSpec:
    """One 1-D tensor of a checkpoint file."""

    name: str
    numel: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    def scaled(self, scale: float) -> TensorSpec:
        """This tensor shrunk by `scale`; a non-empty tensor keeps at least one element."""
        if scale == 1 or self.numel == 0:
            return self
        return TensorSpec(self.name, max(1, int(self.numel * scale)), self.dtype)


@dataclass(frozen=True)
class FilePlan:
    """One file a rank writes, relative to the checkpoint directory."""

    path: str
    tensors: tuple[TensorSpec, ...]

    def __post_init__(self) -> None:
        parts = PurePosixPath(self.path).parts
        if not parts or self.path.startswith("/") or any(part in ("..", ".") for part in parts):
            raise ValueError(f"file path {self.path!r} must be relative to the checkpoint directory, without '..'")

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank writes for one checkpoint."""

    rank: int
    files: tuple[FilePlan, ...]

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.files)


@dataclass(frozen=True)
class CheckpointPlan:
    """One checkpoint of a workload: every rank's files; payload bytes exclude file-format overhead."""

    workload: str
    ranks: tuple[RankPlan, ...]
    scale: float = 1.0
    description: str = ""
    parallelism: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(r.nbytes for r in self.ranks)

    @property
    def file_count(self) -> int:
        return sum(len(r.files) for r in self.ranks)

    @property
    def largest_file_bytes(self) -> int:
        return max((f.nbytes for r in self.ranks for f in r.files), default=0)

    def scaled(self, scale: float) -> CheckpointPlan:
        """The same layout (ranks, files, tensors) with every tensor shrunk by `scale` (0 < scale <= 1)."""
        if not 0 < scale <= 1:
            raise ValueError(f"scale must be in (0, 1], got {scale!r}")
        ranks = tuple(
            RankPlan(r.rank, tuple(FilePlan(f.path, tuple(t.scaled(scale) for t in f.tensors)) for f in r.files))
            for r in self.ranks
        )
        return CheckpointPlan(self.workload, ranks, self.scale * scale, self.description, dict(self.parallelism))

    def to_dict(self) -> dict:
        """A JSON-ready summary: totals and per-rank file counts and bytes."""
        return {
            "workload": self.workload,
            "description": self.description,
            "scale": self.scale,
            "parallelism": self.parallelism,
            "total_bytes": self.total_bytes,
            "total_GB": self.total_bytes / 1e9,
            "total_GiB": self.total_bytes / 2**30,
            "files": self.file_count,
            "largest_file_bytes": self.largest_file_bytes,
            "ranks": [{"rank": r.rank, "files": len(r.files), "bytes": r.nbytes} for r in self.ranks],
        }
