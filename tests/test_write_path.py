"""The write path: `stream` and `stream-direct` write, byte for byte, the archive Python's zipfile writes for the
same records (what torch.load and the read-back were proven against), in few write() calls; O_DIRECT skips the
page cache; the zip64 records past 2 GiB match zipfile's without writing gigabytes."""

import io
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ckptqual.host.beneath import RunTree
from ckptqual.host.cache import cached_fraction
from ckptqual.io.crc import crc32
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import RankIO
from ckptqual.io.engines.stream import serialization_id
from ckptqual.io.engines.torchformat import (
    ALIGNMENT,
    ARCHIVE,
    Entry,
    central_directory,
    data_record,
    head_records,
    tail_records,
)
from ckptqual.io.payload import PayloadGenerator
from ckptqual.plan.model import FilePlan, TensorSpec

SPECS = {
    "odd": FilePlan(
        "odd.pt",
        (
            TensorSpec("tiny", 1, "int8"),
            TensorSpec("layers.0.attention.wqkv", 3_000_001, "float16"),
            TensorSpec("empty", 0, "float32"),
            TensorSpec("bf16", 1_234_567, "bfloat16"),
        ),
    ),
    "many-small": FilePlan(
        "many.pt", tuple(TensorSpec(f"layers.{i}.{'x' * 300}", 700 * i + 1, "int8") for i in range(60))
    ),
    "one-block": FilePlan("block.pt", (TensorSpec("w", 4096, "int8"),)),
}


def zipfile_archive(path: Path, spec: FilePlan, generator: PayloadGenerator, checkpoint: int, rank: int, index: int):
    """The reference: the same records written through Python's zipfile, as the engine did before issue 10."""
    with open(path, "wb") as file, zipfile.ZipFile(file, "w", allowZip64=True) as archive:
        for name, data in head_records(spec.tensors).items():
            archive.writestr(zipfile.ZipInfo(f"{ARCHIVE}/{name}"), data)
        for number, tensor in enumerate(spec.tensors):
            info = zipfile.ZipInfo(f"{ARCHIVE}/{data_record(number)}")
            info.file_size = tensor.nbytes
            end = file.tell() + 30 + len(info.filename) + 4 + 20
            padding = np.empty(-end % ALIGNMENT, dtype=np.uint8)  # keystream of the tensor's own padding stream
            generator.fill_padding(padding, checkpoint, rank, index, number)
            info.extra = struct.pack("<HH", 0x4246, padding.nbytes) + padding.tobytes()
            with archive.open(info, "w", force_zip64=True) as stream:
                stream.write(generator.expected(tensor.nbytes, checkpoint, rank, index, number, 0).tobytes())
            info.extra = b""
        for name, data in tail_records(serialization_id(checkpoint, rank, index)).items():
            archive.writestr(zipfile.ZipInfo(f"{ARCHIVE}/{name}"), data)


@pytest.mark.parametrize("engine", ["stream", "stream-direct"])
@pytest.mark.parametrize("chunk_bytes", [8192, 1 << 20])  # 8 KiB: headers and patches fall across window flushes
@pytest.mark.parametrize("name", sorted(SPECS))
def test_engine_writes_exactly_what_zipfile_writes(tmp_path, engine, chunk_bytes, name):
    spec, generator = SPECS[name], PayloadGenerator(4)
    written, reference = tmp_path / "engine.pt", tmp_path / "zipfile.pt"
    make_engine(engine).write(written, spec, 3, RankIO(generator, rank=2, checkpoint=7, chunk_bytes=chunk_bytes))
    zipfile_archive(reference, spec, generator, 7, 2, 3)
    assert written.read_bytes() == reference.read_bytes()


def test_a_small_file_is_one_write(tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace)")
    script = (
        "import sys; from pathlib import Path; from ckptqual.io.engines import make_engine; "
        "from ckptqual.io.engines.base import RankIO; from ckptqual.io.payload import PayloadGenerator; "
        "from ckptqual.plan.model import FilePlan, TensorSpec; "
        "spec = FilePlan('s.pt', tuple(TensorSpec(f't{i}', 5000 * i + 7, 'int8') for i in range(6))); "
        "make_engine('stream').write(Path(sys.argv[1]), spec, 0, RankIO(PayloadGenerator(1), rank=0))"
    )
    target, log = tmp_path / "small.pt", tmp_path / "strace.log"
    trace = ["strace", "-o", str(log), "-e", "trace=openat,write,pwrite64,lseek,close"]
    subprocess.run([*trace, sys.executable, "-c", script, str(target)], check=True)
    lines = log.read_text().splitlines()
    opened = next(i for i, line in enumerate(lines) if f'"{target.name}"' in line and line.startswith("openat"))
    fd = lines[opened].rsplit("= ", 1)[1]
    closed = next(i for i, line in enumerate(lines) if i > opened and line.startswith(f"close({fd})"))
    calls = [line.split("(", 1)[0] for line in lines[opened + 1 : closed] if f"({fd}," in line]
    assert calls == ["pwrite64"]  # headers, records, payload and central directory: one call
    assert target.stat().st_size > 6 * 5000 * 5 / 2


def test_direct_writes_skip_the_page_cache(tmp_path):
    spec = FilePlan("d.pt", (TensorSpec("w", 24 << 20, "int8"),))
    for engine in ("stream", "stream-direct"):
        path = tmp_path / f"{engine}.pt"
        make_engine(engine).write(path, spec, 0, RankIO(PayloadGenerator(1), rank=0))
        with RunTree(tmp_path) as tree:
            cached = cached_fraction(tree, [path])
        assert cached < 0.05 if engine == "stream-direct" else cached > 0.5, (engine, cached)


class _Sink(io.RawIOBase):
    """A seekable file that keeps only small writes (headers, records), for zipfile to write gigabytes into."""

    def __init__(self) -> None:
        self.position, self.pieces = 0, {}

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = offset
        return offset

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size < 1 << 16:
            self.pieces[self.position] = bytes(data)
        self.position += size
        return size


def test_zip64_records_past_2_gib_match_zipfile(monkeypatch):
    monkeypatch.setattr(zipfile, "crc32", lambda data, crc=0: crc ^ 0x5A5A)  # the CRC is not what is compared
    sizes = [5, (1 << 31) + 4097, 3 << 30, 17]  # a record past 2 GiB, then records whose offsets are past it
    sink, zeros = _Sink(), memoryview(bytes(64 << 20))
    with zipfile.ZipFile(sink, "w", allowZip64=True) as archive:
        entries = []
        for number, size in enumerate(sizes):
            entry = Entry(data_record(number), sink.tell(), size, tensor=True)
            entry.padding = os.urandom(entry.pad)
            info = zipfile.ZipInfo(f"{ARCHIVE}/{data_record(number)}")
            info.file_size = size
            info.extra = struct.pack("<HH", 0x4246, entry.pad) + entry.padding
            with archive.open(info, "w", force_zip64=True) as stream:
                for start in range(0, size, zeros.nbytes):
                    stream.write(zeros[: min(zeros.nbytes, size - start)])
            info.extra = b""
            entry.crc = info.CRC
            entries.append(entry)
            assert sink.pieces[entry.offset] == entry.local_header()
        monkeypatch.undo()
        small = Entry("version", sink.tell(), 2, crc32(b"3\n"))
        archive.writestr(zipfile.ZipInfo(f"{ARCHIVE}/version"), b"3\n")
        assert sink.pieces[small.offset] == small.local_header()
        entries.append(small)
        start = sink.tell()
    directory = b"".join(piece for offset, piece in sorted(sink.pieces.items()) if offset >= start)
    assert directory == central_directory(entries, start)
    assert struct.unpack("<4s", directory[-22:-18]) == (b"PK\x05\x06",) and b"PK\x06\x06" in directory


def test_payload_of_a_range_is_the_payload_of_its_blocks():
    generator = PayloadGenerator(3)
    whole = generator.expected(5 * 4096 + 100, 1, 2, 3, 4, 8192)
    pieces = [
        generator.expected(min(4096, whole.nbytes - i), 1, 2, 3, 4, 8192 + i) for i in range(0, whole.nbytes, 4096)
    ]
    assert np.array_equal(whole, np.concatenate(pieces))
