"""`stream` engine: the torch.save format written chunk by chunk from one reusable buffer (bounded memory), and
read back the same way, in chunks at each tensor's file offset."""

from __future__ import annotations

from pathlib import Path

from ckptqual.io import lanes
from ckptqual.io.crc import crc32
from ckptqual.io.engines.base import Problem, RankIO
from ckptqual.io.engines.fileimage import BLOCK, FileImage
from ckptqual.io.engines.readback import ArchiveFile, read_archive
from ckptqual.io.engines.torchformat import ALIGNMENT, Entry, central_directory, data_record, head_records, tail_records
from ckptqual.io.engines.torchread.expected import ExpectedArchive
from ckptqual.plan.model import FilePlan

# The window of a rank with one lane, writing buffered: 256 KiB (or the chunk size, where smaller). Its one thread
# generates each window, takes its CRC and writes it out while it is still in the core's cache (L2), where a
# chunk-sized (8 MiB) window left memory to copy into the page cache; the calls per window cost less than that saves
# (measured against 128 KiB and 1 MiB windows too). With helper lanes the window is the chunk size, so that its payload
# spreads over the lanes and one window is written behind while the next fills; a direct write's too, as it waits for
# the drive and a larger one waits less often.
WINDOW_BYTES = 256 << 10


class StreamEngine:
    """Peak memory is one window buffer per rank (WINDOW_BYTES with one lane, else the chunk size), two where the rank
    has a helper lane to write one behind while the other fills, whatever the checkpoint size."""

    name = "stream"
    direct = False  # page cache (buffered), like torch.save; `stream-direct` writes O_DIRECT

    def write(self, path: Path, spec: FilePlan, file_index: int, io: RankIO) -> None:
        helpers = lanes.shared()
        wanted = io.chunk_bytes if self.direct or helpers.count > 1 else min(io.chunk_bytes, WINDOW_BYTES)
        size = max(2 * BLOCK, -(-wanted // BLOCK) * BLOCK)
        windows = io.windows(2 if helpers.count > 1 else 1, size)
        behind = (windows[1], helpers) if len(windows) == 2 else None
        writeback = io.chunk_bytes if io.early_writeback else 0  # started a chunk at a time, as other engines do
        image = FileImage(path, windows[0], io.open, self.direct, behind, writeback)
        try:
            write_archive(image, spec, serialization_id(io.checkpoint, io.rank, file_index), file_index, io)
        except BaseException:
            image.abandon()
            raise
        image.close()

    def read(self, path: Path, spec: FilePlan, file_index: int, io: RankIO, label: str) -> list[Problem]:
        expected = self.expected_archive(spec, io.checkpoint, io.rank, file_index)
        return read_archive(ArchiveFile(path, label, file_index, expected), io)

    def expected_archive(self, spec: FilePlan, checkpoint: int, rank: int, file_index: int) -> ExpectedArchive:
        """Every small record is known to the byte, and every byte of padding."""
        records: dict[str, bytes | None] = {
            **head_records(spec.tensors),
            **tail_records(serialization_id(checkpoint, rank, file_index)),
        }
        return ExpectedArchive("the stream engine", spec.tensors, records, ALIGNMENT, padding_is_payload=True)


def serialization_id(checkpoint: int, rank: int, file_index: int) -> str:
    """The file's `.data/serialization_id`: 40 digits like torch's, naming checkpoint, rank and file."""
    return f"{checkpoint:020d}{rank:010d}{file_index:010d}"


def write_archive(image: FileImage, spec: FilePlan, serialization_id: str, file_index: int, io: RankIO) -> None:
    """The whole torch archive of `spec` through `image`: small records and headers placed in the window, the
    payload generated in place and its CRC taken there; a tensor's header is completed once its CRC is known. The
    padding that aligns each tensor's data is keystream too, so no byte the writer chooses repeats."""
    entries: list[Entry] = []
    for name, data in head_records(spec.tensors).items():
        entries.append(_small(image, name, data))
    for index, tensor in enumerate(spec.tensors):
        entry = Entry(data_record(index), image.position, tensor.nbytes, tensor=True)
        entry.padding = io.padding(entry.pad, file_index, index)
        image.pin()
        image.put(entry.local_header())
        crc = offset = 0
        while offset < tensor.nbytes:  # the data starts on a block boundary: every chunk but the last is whole blocks
            chunk = image.space()[: tensor.nbytes - offset]
            io.generate(chunk, file_index, index, offset)
            crc = crc32(chunk, crc)
            image.advance(chunk.nbytes)
            offset += chunk.nbytes
        entry.crc = crc
        io.remember_crc(file_index, index, tensor.nbytes, crc)
        image.patch(entry.local_header())
        entries.append(entry)
    for name, data in tail_records(serialization_id).items():
        entries.append(_small(image, name, data))
    image.put(central_directory(entries, image.position))


def _small(image: FileImage, name: str, data: bytes) -> Entry:
    entry = Entry(name, image.position, len(data), crc32(data))
    image.put(entry.local_header())
    image.put(data)
    return entry
