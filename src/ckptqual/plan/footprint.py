"""What a plan takes on disk: payload plus an upper bound of the file format's overhead."""

from __future__ import annotations

from ckptqual.plan.model import CheckpointPlan

# Format overhead per file and per tensor beyond the payload, upper bounds. Per file, at worst: six small records
# (local header, name, 64-byte alignment padding, data descriptor, central entry: under 300 bytes each with their
# bytes), the pickle's fixed part and the zip64 end records, about 2 KiB. Per tensor, at worst: up to 4,095 bytes
# padding its data to 4 KiB plus the 4-byte padding field, a local header with zip64 field (74 bytes with its
# name), a data descriptor (24), a central entry with zip64 field (97 with its name), and its pickle entry (about
# 150 bytes plus its name): 4.4 KiB for a tensor name up to 700 bytes.
FILE_OVERHEAD_BYTES = 16 << 10
TENSOR_OVERHEAD_BYTES = 5 << 10
# Space left free on the target besides the checkpoints (their format overhead is counted separately).
RESERVE_BYTES = 8 << 20


def checkpoint_footprint_bytes(plan: CheckpointPlan) -> int:
    """Bytes one checkpoint takes on disk at most: payload plus file-format overhead."""
    tensors = sum(len(f.tensors) for r in plan.ranks for f in r.files)
    return plan.total_bytes + plan.file_count * FILE_OVERHEAD_BYTES + tensors * TENSOR_OVERHEAD_BYTES


def checkpoints_for_fraction(plan: CheckpointPlan, capacity_bytes: int, fraction: float) -> int:
    """How many checkpoints fill `fraction` of the capacity (at least one)."""
    return max(1, int(capacity_bytes * fraction // checkpoint_footprint_bytes(plan)))
