"""No data-reducing storage can shrink the payload: not compression, not dedup, not deltas between blocks.

Each measure runs on one checkpoint's worth of payload (two ranks, odd tensor sizes, one tensor longer than
8 MiB) and on two consecutive checkpoints, as written and after the attacks a similarity- or delta-reducing
store would try: XOR each block with its neighbour, with the block 8 MiB earlier (a generator that repeats a
pool), with the block at the same keystream position in another tensor or checkpoint, or with the word at
its own start (the old generator stored its key there). The stream engine's files as written, format and
alignment padding included, leave no more than torch's fixed records to reduce: padding of zeros (or of torch's
b"Z") would fail here. bench/reduction.py reports the same measures for real checkpoint files.
"""

from __future__ import annotations

import hashlib
import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard  # in the test extra: pip install -e ".[test]"

from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import RankIO
from ckptqual.io.engines.torchread.records import read_records
from ckptqual.io.engines.torchread.source import FileSource
from ckptqual.io.payload import BLOCK_BYTES, PayloadGenerator
from ckptqual.plan.model import FilePlan, TensorSpec

SEED = 2025
CHECKPOINTS = (41, 42)
# (rank, file, tensor) -> bytes: a tensor longer than 8 MiB (an 8 MiB pool would wrap in it), odd tails.
TENSORS = {
    (0, 0, 0): (2048 + 16) * BLOCK_BYTES + 100,
    (0, 0, 1): 3 * BLOCK_BYTES + 7,
    (1, 0, 0): 256 * BLOCK_BYTES,
    (1, 1, 0): 16 * BLOCK_BYTES + 1,
}
MAX_COMPRESSION_GAIN = 0.0005  # random bytes gain nothing (zlib and zstd add a few bytes); 16 B per 4 KiB is more
EIGHT_MIB_BLOCKS = (8 << 20) // BLOCK_BYTES
# The files as written: torch's fixed records (zip headers, data.pkl, version, byteorder) are all that may reduce.
MAX_DUPLICATE_WINDOW_SHARE = 0.001  # 64-byte windows that repeat an earlier one
MAX_FILE_ZSTD_LONG_GAIN = 0.005
# Two ranks' file of a layer: tensors of odd sizes (each padded to a 4 KiB boundary), 100 KB on average.
FILE_PLAN = FilePlan(
    "layer.pt", tuple(TensorSpec(f"layers.3.t{i}", 37_001 * (i % 6) + 1_111 * i + 3, "int8") for i in range(30))
)
FILE_RANKS = (0, 1)

Streams = Sequence[np.ndarray]  # byte sequences as storage sees them: tensors here, whole files in the bench
Pairs = Sequence[tuple[int, int]]  # indices of streams whose blocks share keystream positions


def whole_blocks(stream: np.ndarray) -> np.ndarray:
    """The stream's whole 4 KiB blocks as an (n, 4096) array."""
    count = stream.nbytes // BLOCK_BYTES
    return stream[: count * BLOCK_BYTES].reshape(count, BLOCK_BYTES)


def as_written(streams: Streams, pairs: Pairs) -> Iterator[np.ndarray]:
    yield from streams


def xor_with_neighbour(streams: Streams, pairs: Pairs) -> Iterator[np.ndarray]:
    """Each block XOR the block before it in its stream."""
    for blocks in map(whole_blocks, streams):
        yield blocks[1:] ^ blocks[:-1]


def xor_with_block_8MiB_earlier(streams: Streams, pairs: Pairs) -> Iterator[np.ndarray]:
    """Each block XOR the block 8 MiB before it: a generator with an 8 MiB period cancels out."""
    for blocks in map(whole_blocks, streams):
        yield blocks[EIGHT_MIB_BLOCKS:] ^ blocks[:-EIGHT_MIB_BLOCKS]


def xor_at_same_position(streams: Streams, pairs: Pairs) -> Iterator[np.ndarray]:
    """Block i of one stream XOR block i of its partner: the same keystream position, another identity."""
    for first, second in pairs:
        a, b = whole_blocks(streams[first]), whole_blocks(streams[second])
        count = min(len(a), len(b))
        yield a[:count] ^ b[:count]


def undo_xor_with_first_word(streams: Streams, pairs: Pairs) -> Iterator[np.ndarray]:
    """Each 8-byte word XOR the block's first word: undoes a per-block key stored at the block's start."""
    for blocks in map(whole_blocks, streams):
        words = blocks.view(np.uint64)
        yield (words ^ words[:, :1]).view(np.uint8)


def compression_gain(pieces: Iterable[np.ndarray], compressor: Any) -> float:
    """1 - compressed / original size of the pieces as one stream, NaN if empty; `compressor` is a compressobj."""
    original = compressed = 0
    for piece in pieces:
        original += piece.nbytes
        compressed += len(compressor.compress(np.ascontiguousarray(piece)))
    compressed += len(compressor.flush())
    return 1 - compressed / original if original else math.nan


def zlib_gain(pieces: Iterable[np.ndarray]) -> float:
    return compression_gain(pieces, zlib.compressobj(9))


def zstd_gain(pieces: Iterable[np.ndarray]) -> float:
    return compression_gain(pieces, zstandard.ZstdCompressor(level=19).compressobj())


def zstd_long_gain(pieces: Iterable[np.ndarray]) -> float:
    """zstd --long: long-distance matching over a 2 GiB window (the most zstd allows), level 3."""
    params = zstandard.ZstdCompressionParameters.from_level(3, enable_ldm=True, window_log=31)
    return compression_gain(pieces, zstandard.ZstdCompressor(compression_params=params).compressobj())


def dedup_gain(pieces: Iterable[np.ndarray], unit_bytes: int) -> float:
    """Share of whole `unit_bytes` units (aligned to each piece's start) that repeat an earlier one; NaN if none."""
    seen: set[bytes] = set()
    units = 0
    for piece in pieces:
        flat = np.ascontiguousarray(piece).reshape(-1)
        for start in range(0, flat.nbytes - unit_bytes + 1, unit_bytes):
            seen.add(hashlib.blake2b(flat[start : start + unit_bytes], digest_size=16).digest())
            units += 1
    return 1 - len(seen) / units if units else math.nan


ATTACKS: dict[str, Callable[[Streams, Pairs], Iterator[np.ndarray]]] = {
    "as written": as_written,
    "xor with neighbour": xor_with_neighbour,
    "xor with block 8 MiB earlier": xor_with_block_8MiB_earlier,
    "xor at same keystream position": xor_at_same_position,
    "undo xor with first word": undo_xor_with_first_word,
}
MEASURES: dict[str, Callable[[Iterable[np.ndarray]], float]] = {
    "zlib -9": zlib_gain,
    "zstd -19": zstd_gain,
    "zstd --long": zstd_long_gain,
    "dedup 4 KiB": lambda pieces: dedup_gain(pieces, 4096),
    "dedup 512 B": lambda pieces: dedup_gain(pieces, 512),
    "dedup 64 B": lambda pieces: dedup_gain(pieces, 64),
}


def payload_sample(generator: PayloadGenerator, checkpoints: tuple[int, ...]) -> tuple[Streams, Pairs]:
    """Every tensor of TENSORS for each checkpoint, and which streams share keystream positions."""
    streams = [
        generator.expected(size, checkpoint, rank, file, tensor, 0)
        for checkpoint in checkpoints
        for (rank, file, tensor), size in TENSORS.items()
    ]
    per_checkpoint = len(TENSORS)
    if len(checkpoints) == 1:  # one checkpoint: each tensor against the next one
        return streams, [(i, i + 1) for i in range(per_checkpoint - 1)]
    return streams, [(i, i + per_checkpoint) for i in range(per_checkpoint)]  # same tensor, next checkpoint


@pytest.fixture(scope="module")
def samples() -> dict[str, tuple[Streams, Pairs]]:
    generator = PayloadGenerator(SEED)
    return {
        "one checkpoint": payload_sample(generator, CHECKPOINTS[:1]),
        "two checkpoints": payload_sample(generator, CHECKPOINTS),
    }


def _cases() -> list[tuple[str, str]]:
    """zstd -19 is slow (about 3 MB/s here) and finds nothing --long and zlib miss: as written only."""
    return [(a, m) for a in ATTACKS for m in MEASURES if m != "zstd -19" or a == "as written"]


@pytest.mark.parametrize("scope", ["one checkpoint", "two checkpoints"])
@pytest.mark.parametrize(("attack", "measure"), _cases())
def test_no_reduction_finds_structure_in_the_payload(samples, scope, attack, measure):
    streams, pairs = samples[scope]
    pieces = list(ATTACKS[attack](streams, pairs))
    assert sum(piece.nbytes for piece in pieces) >= 16 * BLOCK_BYTES, "the attack left too little data to judge"
    gain = MEASURES[measure](pieces)
    limit = 0.0 if measure.startswith("dedup") else MAX_COMPRESSION_GAIN
    assert gain <= limit, f"{measure} after '{attack}' ({scope}) saves {gain:.4%}, limit {limit:.1%}"


def padding_places(path: Path) -> list[tuple[int, int]]:
    """(file offset, length) of each tensor record's alignment padding, from the archive's zip layout."""
    fd = os.open(path, os.O_RDONLY)
    try:
        records = read_records(FileSource(fd, str(path), np.empty(0, dtype=np.uint8)))
    finally:
        os.close(fd)
    return [(r.padding_offset, r.padding_bytes) for r in records if r.name.startswith("archive/data/")]


@pytest.fixture(scope="module")
def stream_files(tmp_path_factory) -> list[Path]:
    """One checkpoint's files of FILE_PLAN, one per rank, as the stream engine writes them."""
    directory, paths = tmp_path_factory.mktemp("stream-files"), []
    for rank in FILE_RANKS:
        path = directory / f"rank-{rank}.pt"
        make_engine("stream").write(path, FILE_PLAN, 0, RankIO(PayloadGenerator(SEED), rank=rank, checkpoint=7))
        paths.append(path)
    return paths


def zeroed_padding(path: Path) -> np.ndarray:
    """The file's bytes with every tensor's padding zeroed, as a writer that pads with zeros leaves them."""
    data = np.fromfile(path, dtype=np.uint8)
    for offset, length in padding_places(path):
        data[offset : offset + length] = 0
    return data


@pytest.mark.parametrize(
    ("measure", "limit"), [("dedup 64 B", MAX_DUPLICATE_WINDOW_SHARE), ("zstd --long", MAX_FILE_ZSTD_LONG_GAIN)]
)
def test_stream_files_as_written_leave_only_the_fixed_records_to_reduce(stream_files, measure, limit):
    written = MEASURES[measure](np.fromfile(path, dtype=np.uint8) for path in stream_files)
    assert written <= limit, f"{measure} saves {written:.4%} of the stream engine's files, limit {limit:.1%}"
    zeroed = MEASURES[measure](zeroed_padding(path) for path in stream_files)
    assert zeroed > limit, f"{measure} cannot tell padding of zeros: it saves only {zeroed:.4%} of such files"
