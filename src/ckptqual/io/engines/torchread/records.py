"""The zip structure of a stored (uncompressed) archive: every record, each central directory entry checked
against its local header (and data descriptor), every byte of the file accounted for."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ckptqual.io.engines.torchread.findings import FormatError
from ckptqual.io.engines.torchread.source import FileSource
from ckptqual.io.engines.zipheaders import (
    CENTRAL,
    CENTRAL_SIGNATURE,
    DESCRIPTOR,
    DESCRIPTOR64,
    DESCRIPTOR_SIGNATURE,
    END,
    END_SIGNATURE,
    EXTRA_HEADER,
    LOCAL,
    LOCAL_SIGNATURE,
    PAD_EXTRA_ID,
    SATURATED,
    ZIP64_END,
    ZIP64_END_SIGNATURE,
    ZIP64_EXTRA_ID,
    ZIP64_LOCATOR,
    ZIP64_LOCATOR_SIGNATURE,
)

ZIP64_END_BYTES = ZIP64_END.size + ZIP64_LOCATOR.size
_FLAG_ENCRYPTED, _FLAG_DESCRIPTOR = 0x1, 0x8
_STORED = 0


@dataclass(frozen=True)
class Record:
    """One record as its central directory entry and local header place it; `end` includes its data descriptor.

    `padding_offset` and `padding_bytes` place the data of the local header's "FB" padding field (0 bytes, at the
    data offset, where it has none)."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    crc: int
    end: int
    padding_offset: int = 0
    padding_bytes: int = 0


@dataclass(frozen=True)
class _CentralEntry:
    name: str
    flags: int
    method: int
    crc: int
    compressed: int
    size: int
    header_offset: int


class NoEndRecord(FormatError):
    """No end-of-central-directory record where a writer puts it, the file's last 22 bytes."""


def check_crc(record: Record, computed: int, detail: str = "") -> None:
    """Raises FormatError unless `computed`, the CRC32 of the record's bytes as read, is the stored one."""
    if computed != record.crc:
        raise FormatError(
            f"record {record.name}: CRC32 0x{computed:08x} does not match the stored 0x{record.crc:08x} "
            f"(the record's bytes changed{detail})"
        )


def read_records(source: FileSource) -> list[Record]:
    """Every record of a stored (uncompressed) zip archive in file order, each central entry checked against its
    local header, and every byte of the file accounted for: records back to back from offset 0, then the
    central directory, then the end records."""
    directory_offset, directory_bytes, count = _central_directory_place(source)
    entries = _central_entries(source.read(directory_offset, directory_bytes), directory_offset, count)
    records = sorted((_record(source, entry, directory_offset) for entry in entries), key=lambda r: r.header_offset)
    position = 0
    for record in records:
        _check_follows(position, record.header_offset, f"record {record.name}")
        position = record.end
    _check_follows(position, directory_offset, "the central directory")
    return records


def _check_follows(position: int, start: int, what: str) -> None:
    if start < position:
        raise FormatError(f"{what} at offset {start} overlaps the bytes before it, which end at {position}")
    if start > position:
        raise FormatError(f"{start - position} unexplained bytes at offset {position}, before {what}")


def _central_directory_place(source: FileSource) -> tuple[int, int, int]:
    """Offset, size and entry count of the central directory, from the end record (and its zip64 twin)."""
    end_offset = source.size - END.size
    if end_offset < 0 or source.read(end_offset, 4) != END_SIGNATURE:
        raise NoEndRecord(f"no end-of-central-directory record at offset {max(end_offset, 0)}")
    _, disk, directory_disk, disk_entries, entries, directory_bytes, directory_offset, comment = END.unpack(
        source.read(end_offset, END.size)
    )
    if disk or directory_disk or disk_entries != entries or comment:
        raise FormatError(
            f"end-of-central-directory record: disk {disk}, directory disk {directory_disk}, entries "
            f"{disk_entries}/{entries}, comment of {comment} bytes; torch writes one disk and no comment"
        )
    locator_offset = end_offset - ZIP64_LOCATOR.size
    if locator_offset >= 0 and source.read(locator_offset, 4) == ZIP64_LOCATOR_SIGNATURE:
        zip64 = _zip64_end(source, locator_offset)
        for what, short, full, limit in (
            ("entries", entries, zip64[2], 0xFFFF),
            ("directory size", directory_bytes, zip64[1], SATURATED),
            ("directory offset", directory_offset, zip64[0], SATURATED),
        ):
            if short not in (full, limit):
                raise FormatError(f"end-of-central-directory record: {what} {short}, the zip64 end record says {full}")
        directory_offset, directory_bytes, entries = zip64
        end_offset = locator_offset - ZIP64_END.size
    _check_follows(directory_offset + directory_bytes, end_offset, "the end records")
    return directory_offset, directory_bytes, entries


def _zip64_end(source: FileSource, locator_offset: int) -> tuple[int, int, int]:
    """Offset, size and entry count of the central directory from the zip64 end record before the locator."""
    _, disk, offset, disks = ZIP64_LOCATOR.unpack(source.read(locator_offset, ZIP64_LOCATOR.size))
    if disk or disks != 1 or offset + ZIP64_END.size != locator_offset:
        raise FormatError(
            f"zip64 end locator: record at offset {offset} on disk {disk} of {disks}; "
            f"it must end where the locator begins, at {locator_offset}, on disk 0 of 1"
        )
    fields = ZIP64_END.unpack(source.read(offset, ZIP64_END.size))
    signature, size, _, _, disk, directory_disk, disk_entries, entries, directory_bytes, directory_offset = fields
    if signature != ZIP64_END_SIGNATURE or size != ZIP64_END.size - 12 or disk or directory_disk:
        raise FormatError(f"zip64 end record at offset {offset} is damaged (signature {signature!r}, size {size})")
    if disk_entries != entries:
        raise FormatError(f"zip64 end record: {disk_entries} entries on this disk, {entries} in all")
    return directory_offset, directory_bytes, entries


def _central_entries(table: bytes, directory_offset: int, count: int) -> list[_CentralEntry]:
    entries = []
    position = 0
    for index in range(count):
        if position + CENTRAL.size > len(table):
            raise FormatError(f"central directory ends after {index} of its {count} entries")
        fields = CENTRAL.unpack_from(table, position)
        if fields[0] != CENTRAL_SIGNATURE:
            raise FormatError(f"central directory entry {index} at offset {directory_offset + position} is damaged")
        flags, method, _, _, crc, compressed, size, name_bytes, extra_bytes, comment_bytes, disk = fields[3:14]
        start = position + CENTRAL.size
        name = table[start : start + name_bytes].decode("utf-8", "replace")
        extra = table[start + name_bytes : start + name_bytes + extra_bytes]
        size, compressed, header_offset = _zip64_values(extra, size, compressed, fields[16], what=f"record {name}")
        if disk:
            raise FormatError(f"record {name}: central directory entry places it on disk {disk}; torch writes one disk")
        entries.append(_CentralEntry(name, flags, method, crc, compressed, size, header_offset))
        position = start + name_bytes + extra_bytes + comment_bytes
    if position != len(table):
        raise FormatError(f"central directory holds {len(table) - position} bytes after its {count} entries")
    return entries


def _zip64_values(extra: bytes, *values: int, what: str) -> tuple[int, ...]:
    """`values` (size, compressed size[, header offset]) with each one saturated at 0xFFFFFFFF taken from the
    zip64 extra field, in that order."""
    wanted = [value == SATURATED for value in values]
    if not any(wanted):
        return values
    field = _extra_field(extra, ZIP64_EXTRA_ID)
    if field is None or len(field) < 8 * sum(wanted):
        raise FormatError(f"{what}: a size or offset is 0xFFFFFFFF but no zip64 field holds the value")
    full = iter(struct.unpack_from(f"<{sum(wanted)}Q", field))
    return tuple(next(full) if saturated else value for value, saturated in zip(values, wanted, strict=True))


def _extra_field(extra: bytes, field_id: int) -> bytes | None:
    place = _extra_field_place(extra, field_id)
    return None if place is None else extra[place[0] : place[0] + place[1]]


def _extra_field_place(extra: bytes, field_id: int) -> tuple[int, int] | None:
    """Where the data of the extra field `field_id` starts in `extra`, and its length; None where it is absent."""
    position = 0
    while position + EXTRA_HEADER.size <= len(extra):
        kind, length = EXTRA_HEADER.unpack_from(extra, position)
        if kind == field_id:
            return position + EXTRA_HEADER.size, min(length, len(extra) - position - EXTRA_HEADER.size)
        position += EXTRA_HEADER.size + length
    return None


def _record(source: FileSource, entry: _CentralEntry, limit: int) -> Record:
    """The record a central entry describes, its local header (and data descriptor) checked against the entry."""
    what = f"record {entry.name}"
    _check_stored(entry, what)
    header = _within(source, entry.header_offset, LOCAL.size, limit, f"{what}: local header")
    signature, _, flags, method, _, _, crc, compressed, size, name_bytes, extra_bytes = LOCAL.unpack(header)
    if signature != LOCAL_SIGNATURE:
        raise FormatError(f"{what}: no local header at offset {entry.header_offset}, where the central directory says")
    names = _within(source, entry.header_offset + LOCAL.size, name_bytes + extra_bytes, limit, f"{what}: local header")
    if names[:name_bytes].decode("utf-8", "replace") != entry.name or (flags, method) != (entry.flags, entry.method):
        raise FormatError(
            f"{what}: local header (name {names[:name_bytes]!r}, flags 0x{flags:x}, method {method}) differs from "
            f"its central directory entry (flags 0x{entry.flags:x}, method {entry.method})"
        )
    data_offset = entry.header_offset + LOCAL.size + name_bytes + extra_bytes
    end = data_offset + entry.size
    if end > limit:
        raise FormatError(
            f"{what}: its {entry.size} bytes from offset {data_offset} run past offset {limit}, "
            f"where the central directory begins"
        )
    extra = names[name_bytes:]
    if flags & _FLAG_DESCRIPTOR:
        if (crc, compressed, size) != (0, 0, 0):
            raise FormatError(
                f"{what}: local header holds CRC32 0x{crc:08x} and sizes {compressed}/{size} where 0 belongs "
                f"(its data descriptor carries them)"
            )
        end += _check_descriptor(source, entry, end, limit, _extra_field(extra, ZIP64_EXTRA_ID) is not None)
    else:
        if crc != entry.crc:
            raise FormatError(
                f"{what}: local header CRC32 0x{crc:08x} differs from the central directory's 0x{entry.crc:08x}"
            )
        local_sizes = _zip64_values(extra, size, compressed, what=f"{what}: local header")
        if local_sizes != (entry.size, entry.size):
            raise FormatError(f"{what}: local header says {local_sizes[0]} bytes, the central directory {entry.size}")
    padding = _extra_field_place(extra, PAD_EXTRA_ID) or (len(extra), 0)
    padding_offset = entry.header_offset + LOCAL.size + name_bytes + padding[0]
    return Record(entry.name, entry.header_offset, data_offset, entry.size, entry.crc, end, padding_offset, padding[1])


def _check_stored(entry: _CentralEntry, what: str) -> None:
    """torch.load reads only records stored as they are: not compressed, not encrypted."""
    if entry.method != _STORED:
        raise FormatError(f"{what} is compressed (method {entry.method}); torch.load reads only stored records")
    if entry.flags & _FLAG_ENCRYPTED:
        raise FormatError(f"{what} is encrypted; torch.load cannot read it")
    if entry.compressed != entry.size:
        raise FormatError(f"{what}: stored size {entry.compressed} differs from its size {entry.size}")


def _check_descriptor(source: FileSource, entry: _CentralEntry, offset: int, limit: int, zip64: bool) -> int:
    """Checks the data descriptor after a record's data against its central entry; returns its size."""
    layout = DESCRIPTOR64 if zip64 else DESCRIPTOR
    what = f"record {entry.name}: data descriptor"
    signature, crc, compressed, size = layout.unpack(_within(source, offset, layout.size, limit, what))
    if signature != DESCRIPTOR_SIGNATURE:
        raise FormatError(f"{what} at offset {offset} is damaged (signature {signature!r})")
    if crc != entry.crc:
        raise FormatError(f"{what}: CRC32 0x{crc:08x} differs from the central directory's 0x{entry.crc:08x}")
    if (compressed, size) != (entry.size, entry.size):
        raise FormatError(f"{what}: says {size} bytes, the central directory {entry.size}")
    return layout.size


def _within(source: FileSource, offset: int, length: int, limit: int, what: str) -> bytes:
    """`length` bytes at `offset`, which must end by `limit` (where the central directory begins)."""
    if offset < 0 or offset + length > limit:
        raise FormatError(f"{what} at offset {offset} runs past offset {limit}, where the central directory begins")
    return source.read(offset, length)
