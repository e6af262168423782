"""An archive against what its writer writes: exactly its records, the small records' bytes and CRCs, a data.pkl of
exactly the plan's tensors, each tensor record of the planned size and alignment."""

from __future__ import annotations

from dataclasses import dataclass

from ckptqual.io.crc import crc32
from ckptqual.io.engines.torchformat import ARCHIVE, data_record
from ckptqual.io.engines.torchread.findings import FormatError, first_difference
from ckptqual.io.engines.torchread.missing_end import explain_missing_end
from ckptqual.io.engines.torchread.records import NoEndRecord, Record, check_crc, read_records
from ckptqual.io.engines.torchread.source import FileSource
from ckptqual.io.engines.torchread.table import check_table, unpickle_table
from ckptqual.io.engines.zipheaders import CENTRAL, END, LOCAL
from ckptqual.plan.model import TensorSpec


@dataclass(frozen=True)
class ExpectedArchive:
    """What one checkpoint file must hold: the plan's tensors, and the small records its writer puts beside them.

    `small_records` maps a record's name under `archive/` to its exact bytes, or to None where only its CRC can be
    checked (bytes that torch.save makes its own way, e.g. its pickle and serialization id). `padding_is_payload`:
    each tensor's alignment padding is the writer's keystream, which the read checks byte for byte.
    """

    writer: str
    tensors: tuple[TensorSpec, ...]
    small_records: dict[str, bytes | None]
    alignment: int
    padding_is_payload: bool = False

    def record_names(self) -> list[str]:
        """Every record's full name, small records first."""
        names = list(self.small_records) + [data_record(index) for index in range(len(self.tensors))]
        return [f"{ARCHIVE}/{name}" for name in names]

    def minimum_file_bytes(self) -> int:
        """A lower bound on the file's size: each record's headers, known bytes and central entry, the end record."""
        known = [len(data or b"") for data in self.small_records.values()] + [t.nbytes for t in self.tensors]
        names = [len(name.encode()) for name in self.record_names()]
        return sum(known) + sum(LOCAL.size + CENTRAL.size + 2 * n for n in names) + END.size


@dataclass(frozen=True)
class TensorRecord:
    """A tensor of the plan and the record that holds its bytes."""

    index: int
    spec: TensorSpec
    record: Record


def check_archive(source: FileSource, expected: ExpectedArchive) -> list[TensorRecord]:
    """Checks everything but the tensor data; returns the tensor records in file order for the caller to read."""
    try:
        records = read_records(source)
    except NoEndRecord as missing:
        raise explain_missing_end(source, expected.record_names(), expected.minimum_file_bytes()) from missing
    by_name = _by_name(records, expected)
    small = {
        name: _small_record(source, by_name[f"{ARCHIVE}/{name}"], wanted, expected.writer)
        for name, wanted in expected.small_records.items()
    }
    check_table(unpickle_table(small["data.pkl"]), expected.tensors)
    tensors = [
        TensorRecord(index, spec, by_name[f"{ARCHIVE}/{data_record(index)}"])
        for index, spec in enumerate(expected.tensors)
    ]
    for tensor in tensors:
        _check_tensor_record(tensor, expected.alignment)
    return sorted(tensors, key=lambda t: t.record.header_offset)


def _by_name(records: list[Record], expected: ExpectedArchive) -> dict[str, Record]:
    """The records by name, once they are exactly the set the writer writes."""
    by_name: dict[str, Record] = {}
    for record in records:
        if record.name in by_name:
            raise FormatError(f"record {record.name} appears twice")
        by_name[record.name] = record
    wanted = expected.record_names()
    missing = [name for name in wanted if name not in by_name]
    if missing:
        raise FormatError(f"record {missing[0]} is missing ({len(missing)} missing; {expected.writer} writes it)")
    extra = [name for name in by_name if name not in set(wanted)]
    if extra:
        raise FormatError(f"record {extra[0]} is not one {expected.writer} writes ({len(extra)} extra)")
    return by_name


def _small_record(source: FileSource, record: Record, wanted: bytes | None, writer: str) -> bytes:
    """A small record's bytes, once its CRC and, where they are known, the bytes check out (a change says both)."""
    data = source.read(record.data_offset, record.size)
    difference = "" if wanted is None or data == wanted else _difference(data, wanted, writer)
    check_crc(record, crc32(data), f": it {difference}" if difference else "")
    if difference:
        raise FormatError(f"record {record.name} {difference}")
    return data


def _difference(found: bytes, wanted: bytes, writer: str) -> str:
    """E.g. "holds b'lattle', the stream engine writes b'little'"."""
    if len(found) <= 64 and len(wanted) <= 64:
        return f"holds {found!r}, {writer} writes {wanted!r}"
    first = first_difference(found, wanted)
    return f"holds {len(found)} bytes that differ from the {len(wanted)} {writer} writes from byte {first}"


def _check_tensor_record(tensor: TensorRecord, alignment: int) -> None:
    record = tensor.record
    if record.size != tensor.spec.nbytes:
        raise FormatError(
            f"record {record.name} holds {record.size} bytes, tensor {tensor.spec.name!r} needs {tensor.spec.nbytes}"
        )
    if record.data_offset % alignment:
        raise FormatError(
            f"record {record.name}: data at file offset {record.data_offset}, not a multiple of {alignment}"
        )
