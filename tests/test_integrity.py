"""A restore proves each checkpoint file loadable, not only its tensor bytes: damage anywhere is named.

Files are written by the real engines, damaged on disk, and read back by the real restore code path. Where a
record lies is found with Python's zipfile and the zip layout, independently of the verifier under test.
"""

import os
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from ckptqual.io.engines import make_engine, readback
from ckptqual.io.engines.base import RankIO
from ckptqual.io.payload import PayloadGenerator
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.runs import restore
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.pool import RankPool
from ckptqual.runs.task import Task

SEED, RANK, CHECKPOINT = 77, 1, 5
LAYER = FilePlan(
    "layer-0.pt",
    (
        TensorSpec("tiny", 1, "int8"),
        TensorSpec("w", 200_000, "float16"),
        TensorSpec("empty", 0, "float32"),
        TensorSpec("f8", 5, "float8_e4m3fn"),
    ),
)
OPTIMIZER = FilePlan("optim/optimizer-1.pt", (TensorSpec("state", 300_000, "float32"),))
PLAN = RankPlan(RANK, (LAYER, OPTIMIZER))
ENGINES = ["stream", "torch-save"]
# One chunk size reads every file by offset in pieces, the other reads each file whole in one request.
CHUNKS = {"pread": 64 << 10, "whole": 4 << 20}
WRITERS = {"stream": "the stream engine", "torch-save": "torch.save"}


def write_checkpoint(root: Path, engine: str) -> Path:
    directory = root / f"checkpoint-{CHECKPOINT:05d}"
    io = RankIO(PayloadGenerator(SEED), rank=RANK, checkpoint=CHECKPOINT, chunk_bytes=1 << 20)
    for index, spec in enumerate(PLAN.files):
        path = directory / spec.path
        path.parent.mkdir(parents=True, exist_ok=True)
        make_engine(engine).write(path, spec, index, io)
    return directory


def read_back(directory: Path, engine: str, chunk_bytes: int = CHUNKS["pread"], plan: RankPlan = PLAN) -> dict:
    """The rank's verified read of the checkpoint, then its torch.load sample, as the rank runs them."""
    io = RankIO(PayloadGenerator(SEED), rank=RANK, checkpoint=CHECKPOINT, chunk_bytes=chunk_bytes)
    task = Task("read", CHECKPOINT, str(directory), plan, {"engine": engine})
    assert restore.read_checkpoint_files(io, task) == plan.nbytes
    return restore.load_sample(io, task)


def failure(directory: Path, engine: str, chunk_bytes: int = CHUNKS["pread"], plan: RankPlan = PLAN) -> str:
    """The message of the verified read's failure (the torch.load sample is not needed to find the damage)."""
    io = RankIO(PayloadGenerator(SEED), rank=RANK, checkpoint=CHECKPOINT, chunk_bytes=chunk_bytes)
    with pytest.raises(restore.IntegrityError) as raised:
        restore.read_checkpoint_files(io, Task("read", CHECKPOINT, str(directory), plan, {"engine": engine}))
    return str(raised.value)


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


@pytest.fixture(params=list(CHUNKS))
def chunk_bytes(request):
    return CHUNKS[request.param]


@pytest.fixture
def checkpoint(tmp_path, engine):
    return write_checkpoint(tmp_path, engine)


# ---- where things lie, found with zipfile and the zip layout


def records(path: Path) -> dict[str, tuple[int, int, int]]:
    """Each record's (local header offset, data offset, size)."""
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        return {
            info.filename: (info.header_offset, data_offset(raw, info.header_offset), info.file_size)
            for info in archive.infolist()
        }


def data_offset(raw: bytes, header_offset: int) -> int:
    name_bytes, extra_bytes = struct.unpack_from("<HH", raw, header_offset + 26)
    return header_offset + 30 + name_bytes + extra_bytes


def central_entries(path: Path) -> dict[str, int]:
    """Each record's central directory entry offset."""
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        position, count = archive.start_dir, len(archive.infolist())
    entries = {}
    for _ in range(count):
        assert raw[position : position + 4] == b"PK\x01\x02"
        name_bytes, extra_bytes, comment_bytes = struct.unpack_from("<HHH", raw, position + 28)
        entries[raw[position + 46 : position + 46 + name_bytes].decode()] = position
        position += 46 + name_bytes + extra_bytes + comment_bytes
    return entries


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        original = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([original ^ mask]))


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(data)


# ---- intact files


def test_intact_files_restore_and_load_with_torch(checkpoint, engine, chunk_bytes):
    sample = read_back(checkpoint, engine, chunk_bytes)
    assert sample["torch_load_sampled"] == 1 and sample["torch_load_sampled_s"] > 0


def test_the_torch_load_sample_rotates_over_every_file():
    assert sorted(restore.sampled_file(checkpoint, 3) for checkpoint in range(7, 10)) == [0, 1, 2]


def test_torch_save_writes_exactly_the_records_the_verifier_expects(tmp_path):
    path = write_checkpoint(tmp_path, "torch-save") / LAYER.path
    expected = make_engine("torch-save").expected_archive(LAYER, CHECKPOINT, RANK, 0)
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == sorted(expected.record_names())
        for name, data in expected.small_records.items():
            assert data is None or archive.read(f"archive/{name}") == data


# ---- small records


def test_a_changed_byteorder_byte_fails_the_restore_though_the_tensor_bytes_are_right(checkpoint, engine):
    """Issue 8, case 3: one byte of `byteorder` changed; torch.load cannot load the file (or misreads it)."""
    path = checkpoint / LAYER.path
    _, start, _ = records(path)["archive/byteorder"]
    overwrite(path, start + 1, b"a")  # b"little" -> b"lattle"
    message = failure(checkpoint, engine)
    assert message.startswith("checkpoint-00005/layer-0.pt: record archive/byteorder: CRC32 0x")
    assert f"(the record's bytes changed: it holds b'lattle', {WRITERS[engine]} writes b'little')" in message
    with pytest.raises(Exception, match="Unknown endianness type"):
        torch.load(path, weights_only=True)


@pytest.mark.parametrize(
    "record", ["data.pkl", ".format_version", ".storage_alignment", "version", ".data/serialization_id"]
)
def test_a_changed_byte_in_each_small_record_is_named(checkpoint, engine, chunk_bytes, record):
    path = checkpoint / LAYER.path
    _, start, size = records(path)[f"archive/{record}"]
    flip(path, start + size // 2)
    message = failure(checkpoint, engine, chunk_bytes)
    assert f"checkpoint-00005/layer-0.pt: record archive/{record}: CRC32 0x" in message
    assert "does not match the stored 0x" in message


def test_a_file_of_another_checkpoint_is_named_by_its_serialization_id(tmp_path):
    directory = write_checkpoint(tmp_path, "stream")
    io = RankIO(PayloadGenerator(SEED), rank=RANK, checkpoint=CHECKPOINT - 1)
    (directory / LAYER.path).unlink()
    make_engine("stream").write(directory / LAYER.path, LAYER, 0, io)  # a stale file under the new name
    message = failure(directory, "stream")
    assert "record archive/.data/serialization_id holds b'00000000000000000004" in message
    assert "the stream engine writes b'00000000000000000005" in message


def test_a_pickle_of_other_tensors_is_named(tmp_path, engine):
    directory = write_checkpoint(tmp_path, engine)
    renamed = RankPlan(RANK, (FilePlan(LAYER.path, (TensorSpec("tiny", 1, "int8"), *LAYER.tensors[1:])), OPTIMIZER))
    other = FilePlan(LAYER.path, (TensorSpec("other", 1, "int8"), *LAYER.tensors[1:]))
    (directory / LAYER.path).unlink()
    make_engine(engine).write(directory / LAYER.path, other, 0, RankIO(PayloadGenerator(SEED), RANK, CHECKPOINT))
    message = failure(directory, engine, plan=renamed)
    assert "layer-0.pt: record archive/data.pkl" in message
    if engine == "torch-save":  # its pickle is torch's own: checked by what it describes
        assert "names 4 tensors, tensor 0 is 'other'; the plan has 'tiny' there" in message


# ---- tensor records


def test_a_changed_tensor_byte_is_named_by_tensor_and_file_offset(checkpoint, engine, chunk_bytes):
    path = checkpoint / LAYER.path
    _, start, _ = records(path)["archive/data/1"]
    flip(path, start + 3 * 4096 + 100)
    block = 3 * 4096
    message = failure(checkpoint, engine, chunk_bytes)
    assert f"layer-0.pt: tensor 'w' at file offset {start + block} (tensor offset {block}) holds corrupted" in message


def padding(raw: bytes, header_offset: int) -> tuple[int, int]:
    """(file offset, length) of the data of a local header's "FB" padding field, read from the zip layout."""
    name_bytes, extra_bytes = struct.unpack_from("<HH", raw, header_offset + 26)
    position = header_offset + 30 + name_bytes
    while position < header_offset + 30 + name_bytes + extra_bytes:
        kind, length = struct.unpack_from("<HH", raw, position)
        if kind == 0x4246:
            return position + 4, length
        position += 4 + length
    raise AssertionError(f"no padding field in the local header at offset {header_offset}")


@pytest.mark.parametrize("where", ["first", "last"])
def test_a_changed_padding_byte_in_a_stream_file_is_named(tmp_path, chunk_bytes, where):
    """The padding before each tensor's data is keystream the stream engine wrote: a flipped byte there fails the
    read, named by record and file offset, though every tensor byte and CRC is right."""
    checkpoint = write_checkpoint(tmp_path, "stream")
    path = checkpoint / LAYER.path
    raw = path.read_bytes()
    start, length = padding(raw, records(path)["archive/data/1"][0])
    assert length > 64 and len(set(raw[start : start + length])) > 200, "the padding is not keystream"
    offset = start if where == "first" else start + length - 1
    flip(path, offset)
    message = failure(checkpoint, "stream", chunk_bytes)
    assert f"layer-0.pt: record archive/data/1: padding byte at file offset {offset} holds 0x" in message
    assert "the padding before tensor 'w'" in message


def test_the_crc_of_tensor_data_is_checked(checkpoint, engine, chunk_bytes):
    """Both stored copies of a tensor record's CRC changed alike: only a CRC computed over the data can tell."""
    path = checkpoint / LAYER.path
    header, start, size = records(path)["archive/data/1"]
    local_crc = start + size + 4 if engine == "torch-save" else header + 14  # data descriptor, else local header
    flip(path, local_crc)
    flip(path, central_entries(path)["archive/data/1"] + 16)
    message = failure(checkpoint, engine, chunk_bytes)
    assert "layer-0.pt: record archive/data/1: CRC32 0x" in message and "the record's bytes changed" in message


@pytest.mark.parametrize("record", ["archive/byteorder", "archive/data/1"])
def test_a_changed_crc_in_a_local_header_is_named(checkpoint, engine, record):
    path = checkpoint / LAYER.path
    header, _, _ = records(path)[record]
    flip(path, header + 14)
    message = failure(checkpoint, engine)
    if engine == "torch-save":  # torch keeps CRCs in data descriptors; the local header holds zeros
        assert f"record {record}: local header holds CRC32 0x00000001 and sizes 0/0 where 0 belongs" in message
    else:
        assert (
            f"record {record}: local header CRC32 0x" in message and "differs from the central directory's" in message
        )


def test_a_changed_crc_in_a_data_descriptor_is_named(tmp_path):
    path = write_checkpoint(tmp_path, "torch-save") / LAYER.path
    _, start, size = records(path)["archive/data/1"]
    flip(path, start + size + 4)
    message = failure(path.parent, "torch-save")
    assert "record archive/data/1: data descriptor: CRC32 0x" in message
    assert "differs from the central directory's" in message


@pytest.mark.parametrize("record", ["archive/version", "archive/data/3"])
def test_a_changed_crc_in_the_central_directory_is_named(checkpoint, engine, record):
    path = checkpoint / LAYER.path
    flip(path, central_entries(path)[record] + 16)
    message = failure(checkpoint, engine)
    assert f"layer-0.pt: record {record}: " in message
    assert "differs from the central directory's 0x" in message


# ---- truncation and zeroed sectors


@pytest.mark.parametrize("cut", ["in the data", "in the central directory", "in the end record"])
def test_a_truncated_file_is_named_as_truncated(checkpoint, engine, chunk_bytes, cut):
    path = checkpoint / OPTIMIZER.path
    size = path.stat().st_size
    with zipfile.ZipFile(path) as archive:
        directory = archive.start_dir
    keep = {
        "in the data": size // 2,
        "in the central directory": (directory + size) // 2,
        "in the end record": size - 9,
    }
    os.truncate(path, keep[cut])
    message = failure(checkpoint, engine, chunk_bytes)
    prefix = (
        f"checkpoint-00005/optim/optimizer-1.pt: truncated: the file is {keep[cut]} bytes, the plan needs at least "
    )
    assert prefix in message
    needed = int(message.split(prefix)[1].split()[0])
    assert keep[cut] < needed <= size  # a true lower bound on the intact file


def test_a_zeroed_4_kib_sector_in_a_stream_file_is_one_block_of_zeros(tmp_path, chunk_bytes):
    path = write_checkpoint(tmp_path, "stream") / LAYER.path
    _, start, _ = records(path)["archive/data/1"]
    sector = start + 5 * 4096
    assert sector % 4096 == 0
    overwrite(path, sector, bytes(4096))
    message = failure(path.parent, "stream", chunk_bytes)
    assert message.endswith(f"layer-0.pt: tensor 'w' at file offset {sector} (tensor offset {5 * 4096}) holds zeros")


def test_a_zeroed_4_kib_sector_in_a_torch_save_file_names_the_zeros_in_both_blocks(tmp_path):
    path = write_checkpoint(tmp_path, "torch-save") / LAYER.path
    _, start, _ = records(path)["archive/data/1"]
    sector = (start // 4096 + 5) * 4096  # a drive sector: 4 KiB aligned in the file, not in the tensor
    assert start % 64 == 0 and (sector - start) % 4096
    overwrite(path, sector, bytes(4096))
    message = failure(path.parent, "torch-save")
    first = (sector - start) // 4096 * 4096
    for block in (first, first + 4096):
        assert f"tensor 'w' at file offset {start + block} (tensor offset {block}) holds zeros in bytes" in message


# ---- records missing, extra or rewritten


def rewrite(path: Path, keep=lambda name: True, compression: int = zipfile.ZIP_STORED) -> None:
    """The archive written anew by zipfile: same records (those kept), no alignment padding."""
    with zipfile.ZipFile(path) as archive:
        contents = [(name, archive.read(name)) for name in archive.namelist() if keep(name)]
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in contents:
            archive.writestr(name, data)


def test_a_missing_record_is_named(checkpoint, engine):
    rewrite(checkpoint / LAYER.path, keep=lambda name: name != "archive/byteorder")
    message = failure(checkpoint, engine)
    assert f"layer-0.pt: record archive/byteorder is missing (1 missing; {WRITERS[engine]} writes it)" in message


def test_an_extra_record_is_named(checkpoint, engine):
    with zipfile.ZipFile(checkpoint / LAYER.path, "a") as archive:
        archive.writestr("archive/notes.txt", b"written by someone else")
    message = failure(checkpoint, engine)
    assert f"layer-0.pt: record archive/notes.txt is not one {WRITERS[engine]} writes (1 extra)" in message


def test_a_compressed_record_is_named(checkpoint, engine):
    rewrite(checkpoint / LAYER.path, compression=zipfile.ZIP_DEFLATED)
    assert "record archive/data.pkl is compressed (method 8)" in failure(checkpoint, engine)


def test_unaligned_tensor_data_is_named(tmp_path):
    directory = write_checkpoint(tmp_path, "stream")
    rewrite(directory / LAYER.path)
    assert "record archive/data/0: data at file offset" in failure(directory, "stream")


def test_bytes_appended_to_a_file_are_named(checkpoint, engine):
    size = (checkpoint / LAYER.path).stat().st_size
    with open(checkpoint / LAYER.path, "ab") as file:
        file.write(b"\0" * 100)
    message = failure(checkpoint, engine)
    assert f"layer-0.pt: 100 bytes follow the end-of-central-directory record at offset {size - 22}" in message


def test_an_overwritten_end_record_is_named(checkpoint, engine):
    size = (checkpoint / LAYER.path).stat().st_size
    overwrite(checkpoint / LAYER.path, size - 22, bytes(22))
    message = failure(checkpoint, engine)
    assert (
        f"layer-0.pt: no end-of-central-directory record at offset {size - 22}, after the central directory" in message
    )


# ---- the independent torch.load check


def test_the_torch_load_sample_checks_what_torch_sees(tmp_path, engine):
    """The sample (file 1 after checkpoint 5) must give the plan's tensors holding the payload."""
    directory = write_checkpoint(tmp_path, engine)
    io = RankIO(PayloadGenerator(SEED), rank=RANK, checkpoint=CHECKPOINT)
    retyped = RankPlan(RANK, (LAYER, FilePlan(OPTIMIZER.path, (TensorSpec("state", 300_000, "bfloat16"),))))
    task = Task("read", CHECKPOINT, str(directory), retyped, {"engine": engine})
    with pytest.raises(restore.IntegrityError, match=r"gives tensor 0 as \('state', 'float32', 300000\)"):
        restore.load_sample(io, task)
    other_run = RankIO(PayloadGenerator(SEED + 1), rank=RANK, checkpoint=CHECKPOINT)
    task = Task("read", CHECKPOINT, str(directory), PLAN, {"engine": engine})
    with pytest.raises(restore.IntegrityError, match="sees tensor 'state' at tensor offset 0 holding a block from"):
        restore.load_sample(other_run, task)
    _, start, _ = records(directory / OPTIMIZER.path)["archive/byteorder"]
    overwrite(directory / OPTIMIZER.path, start + 1, b"a")
    failed = r"optimizer-1.pt: torch.load\(weights_only=True, mmap=True\) failed .*: \w+: .*Unknown endianness type"
    with pytest.raises(restore.IntegrityError, match=failed) as raised:
        restore.load_sample(io, task)
    assert "\n" not in str(raised.value)


# ---- through the rank processes


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, seed=SEED, timeout_s=120) as ranks:
        yield ranks


def test_ranks_restore_an_intact_checkpoint_and_name_a_damaged_record(tmp_path, pool, engine):
    other = RankPlan(0, (FilePlan("layer-1.pt", LAYER.tensors),))
    plan = CheckpointPlan("two", (other, PLAN))
    directory = tmp_path / f"checkpoint-{CHECKPOINT:05d}"
    pool.write_checkpoint(directory, CHECKPOINT, plan.ranks, engine)
    options = {"engine": engine}
    restored = pool.run("read", directory, plan.ranks, "restore of checkpoint 5", CHECKPOINT, options)
    assert restored.bytes == plan.total_bytes
    _, start, _ = records(directory / LAYER.path)["archive/byteorder"]
    overwrite(directory / LAYER.path, start + 1, b"a")
    with pytest.raises(
        RankFailure, match=r"rank 1 failed during restore of checkpoint 5: IntegrityError: .*record archive/byteorder"
    ):
        pool.run("read", directory, plan.ranks, "restore of checkpoint 5", CHECKPOINT, options)
    shutil.rmtree(directory)


# ---- the CRC a rank took as it wrote


def write_stream_files(directory: Path, io: RankIO) -> None:
    """The plan's files, written by `io` with the stream engine (its rank's payload)."""
    for index, spec in enumerate(PLAN.files):
        (directory / spec.path).parent.mkdir(parents=True, exist_ok=True)
        make_engine("stream").write(directory / spec.path, spec, index, io)


def written_and_read_by_one_rank(tmp_path: Path) -> tuple[Path, RankIO]:
    """A stream checkpoint and the RankIO that wrote it, which remembers the CRC32 of every tensor it wrote."""
    directory = tmp_path / f"checkpoint-{CHECKPOINT:05d}"
    io = RankIO(PayloadGenerator(SEED), rank=RANK, checkpoint=CHECKPOINT, chunk_bytes=64 << 10)
    write_stream_files(directory, io)
    return directory, io


def test_the_rank_that_wrote_a_tensor_holds_its_stored_crc_to_the_one_it_took(tmp_path):
    """Both stored copies of a tensor record's CRC changed alike: the writer's own CRC, not one taken again over the
    intact bytes, names the stored value as the change."""
    directory, io = written_and_read_by_one_rank(tmp_path)
    path = directory / LAYER.path
    header, _, _ = records(path)["archive/data/1"]
    flip(path, header + 14)
    flip(path, central_entries(path)["archive/data/1"] + 16)
    with pytest.raises(restore.IntegrityError) as raised:
        restore.read_checkpoint_files(io, Task("read", CHECKPOINT, str(directory), PLAN, {"engine": "stream"}))
    message = str(raised.value)
    assert "layer-0.pt: record archive/data/1: stored CRC32 0x" in message
    assert "the CRC32 this rank took of the bytes it wrote there, which read back intact" in message


def test_only_a_rank_without_the_writers_crc_takes_one_over_the_data(tmp_path, monkeypatch):
    """The rank that wrote the tensors checks every byte and their stored CRC without a CRC pass over the data; a
    rank that did not write them (a fresh process, another node) takes it."""
    directory, io = written_and_read_by_one_rank(tmp_path)
    taken: list[int] = []
    real = readback.crc32
    monkeypatch.setattr(readback, "crc32", lambda data, value=0: taken.append(len(data)) or real(data, value))
    task = Task("read", CHECKPOINT, str(directory), PLAN, {"engine": "stream"})
    assert restore.read_checkpoint_files(io, task) == PLAN.nbytes
    assert taken == []
    fresh = RankIO(PayloadGenerator(SEED), rank=RANK, checkpoint=CHECKPOINT, chunk_bytes=64 << 10)
    assert restore.read_checkpoint_files(fresh, task) == PLAN.nbytes
    assert sum(taken) == sum(t.nbytes for spec in PLAN.files for t in spec.tensors)


def test_a_changed_tensor_byte_is_found_by_the_rank_that_wrote_it(tmp_path):
    directory, io = written_and_read_by_one_rank(tmp_path)
    path = directory / LAYER.path
    _, start, _ = records(path)["archive/data/1"]
    flip(path, start + 5000)
    with pytest.raises(restore.IntegrityError) as raised:
        restore.read_checkpoint_files(io, Task("read", CHECKPOINT, str(directory), PLAN, {"engine": "stream"}))
    assert f"tensor 'w' at file offset {start + 4096}" in str(raised.value)


def test_a_rank_acting_as_another_checks_that_ranks_files_by_their_own_crc(tmp_path):
    """A shifted read over several nodes: a rank that wrote its own files reads another rank's files of the same
    layout, checkpoint and sizes, acting as that rank. Its own CRCs are not theirs: the read takes the CRC again and
    the intact files pass."""
    mine, io = written_and_read_by_one_rank(tmp_path / "mine")
    theirs = tmp_path / "theirs" / mine.name
    other = RankIO(PayloadGenerator(SEED), rank=RANK + 1, checkpoint=CHECKPOINT, chunk_bytes=64 << 10)
    write_stream_files(theirs, other)
    io.rank = RANK + 1
    task = Task("read", CHECKPOINT, str(theirs), RankPlan(RANK + 1, PLAN.files), {"engine": "stream"})
    assert restore.read_checkpoint_files(io, task) == PLAN.nbytes
