"""Why a file has no end-of-central-directory record where it belongs: truncated, bytes appended, or its end
overwritten."""

from __future__ import annotations

import struct

from ckptqual.io.engines.torchread.findings import FormatError
from ckptqual.io.engines.torchread.records import ZIP64_END_BYTES
from ckptqual.io.engines.torchread.source import FileSource
from ckptqual.io.engines.zipheaders import CENTRAL, CENTRAL_SIGNATURE, END, END_SIGNATURE, ZIP64_END_SIGNATURE

_MAX_CENTRAL_EXTRA_BYTES = 28  # a zip64 field with both sizes and the header offset


def explain_missing_end(source: FileSource, names: list[str], minimum_bytes: int) -> FormatError:
    """Why a file has no end record where it belongs: truncated (and how much it needs at least), bytes appended,
    or its end overwritten."""
    start = _first_central_entry(source, names)
    end, needed = _walk_central_directory(source, start, names) if start is not None else (None, 0)
    needed = max(needed, minimum_bytes)
    if source.size < needed:
        return FormatError(f"truncated: the file is {source.size} bytes, the plan needs at least {needed}")
    if end is None:
        return FormatError(
            f"no end-of-central-directory record at offset {source.size - END.size} and no central directory "
            f"before it: the file's end was overwritten, or it is cut inside its last record"
        )
    if source.read(end, 4) == END_SIGNATURE:
        return FormatError(
            f"{source.size - end - END.size} bytes follow the end-of-central-directory record at offset {end}"
        )
    return FormatError(f"no end-of-central-directory record at offset {end}, after the central directory")


def _walk_central_directory(source: FileSource, position: int, names: list[str]) -> tuple[int, int]:
    """Where the end record belongs after the central directory that starts at `position`, and the file size that
    needs at least: a cut entry and every later one need their fixed part and name, the end record its 22 bytes."""
    unseen = {name.encode(): CENTRAL.size + len(name.encode()) for name in names}
    for _ in names:
        if position + CENTRAL.size > source.size:
            return position, position + sum(unseen.values()) + END.size
        name_bytes, extra_bytes, comment_bytes = struct.unpack_from("<HHH", source.read(position + 28, 6))
        length = CENTRAL.size + name_bytes + extra_bytes + comment_bytes
        if position + length > source.size:  # this entry is one of the unseen: count it at its full length
            return position, position + length + sum(unseen.values()) - max(unseen.values(), default=0) + END.size
        unseen.pop(source.read(position + CENTRAL.size, name_bytes), None)
        position += length
    if source.size - position >= 4 and source.read(position, 4) == ZIP64_END_SIGNATURE:
        position += ZIP64_END_BYTES
    return position, position + END.size


def _first_central_entry(source: FileSource, names: list[str]) -> int | None:
    """Where the central directory starts, if the file's last bytes (as many as a whole directory and the end records
    could take) hold its first entry: a central signature followed by a record's name."""
    window = min(
        source.size,
        sum(CENTRAL.size + len(n) + _MAX_CENTRAL_EXTRA_BYTES for n in names) + ZIP64_END_BYTES + END.size,
    )
    tail = source.read(source.size - window, window)
    wanted = tuple(name.encode() for name in names)
    start = tail.find(CENTRAL_SIGNATURE)
    while start >= 0 and not tail[start + CENTRAL.size :].startswith(wanted):
        start = tail.find(CENTRAL_SIGNATURE, start + 1)
    return None if start < 0 else source.size - window + start
