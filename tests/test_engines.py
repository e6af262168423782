"""Both engines write files that torch.load reads back as the planned tensors, holding the planned payload."""

import itertools
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import torch

from ckptqual.io.engines import ENGINES, make_engine
from ckptqual.io.engines.base import RankIO
from ckptqual.io.engines.torchformat import ALIGNMENT
from ckptqual.io.payload import PayloadGenerator, find_mismatches
from ckptqual.plan.footprint import FILE_OVERHEAD_BYTES, TENSOR_OVERHEAD_BYTES
from ckptqual.plan.formats import FORMAT_ENGINES
from ckptqual.plan.model import FilePlan, TensorSpec

ODD_FILE = FilePlan(
    "odd.pt",
    (
        TensorSpec("tiny", 1, "int8"),
        TensorSpec("layers.0.attention.wqkv", 3_000_001, "float16"),
        TensorSpec("empty", 0, "float32"),
        TensorSpec("fp8", 5, "float8_e4m3fn"),
        TensorSpec("bf16", 1_234_567, "bfloat16"),
        TensorSpec("optimizer.state", 777_777, "float32"),
    ),
)


@pytest.mark.parametrize("engine_name", sorted(set(ENGINES) - set(FORMAT_ENGINES.values())))  # torch.save files
def test_files_load_with_torch_and_hold_the_payload(tmp_path, engine_name):
    generator = PayloadGenerator(11)
    io = RankIO(generator, rank=3, checkpoint=2, chunk_bytes=1 << 20)
    path = tmp_path / "odd.pt"
    make_engine(engine_name).write(path, ODD_FILE, 4, io)
    state = torch.load(path, weights_only=True)
    assert list(state) == [t.name for t in ODD_FILE.tensors]
    for index, spec in enumerate(ODD_FILE.tensors):
        tensor = state[spec.name]
        assert tensor.dtype == getattr(torch, spec.dtype)
        assert tuple(tensor.shape) == (spec.numel,)
        data = tensor.view(torch.uint8).numpy() if spec.numel else np.empty(0, np.uint8)
        assert data.nbytes == spec.nbytes
        assert find_mismatches(generator, data, 2, 3, 4, index, 0) == []
    assert io.generated_bytes == ODD_FILE.nbytes


def test_stream_tensor_data_starts_at_4_kib_file_offsets(tmp_path):
    path = tmp_path / "aligned.pt"
    make_engine("stream").write(path, ODD_FILE, 0, RankIO(PayloadGenerator(1), rank=0))
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        records = [i for i in archive.infolist() if "/data/" in i.filename and not i.filename.endswith(".data/")]
        assert len(records) == len(ODD_FILE.tensors)
        for info in records:
            name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
            assert (info.header_offset + 30 + name_len + extra_len) % 4096 == 0
        assert archive.read("archive/.storage_alignment") == b"4096" == str(ALIGNMENT).encode()
        assert archive.testzip() is None  # every CRC is right
    for options in ({}, {"weights_only": True}, {"weights_only": True, "mmap": True}):
        assert list(torch.load(path, **options)) == [t.name for t in ODD_FILE.tensors]


@pytest.mark.parametrize("engine_name", sorted(ENGINES))
def test_files_fit_the_space_checks_overhead_bound(tmp_path, engine_name):
    many = FilePlan("many.pt", tuple(TensorSpec(f"layers.{i}.{'x' * 200}", 1 + i, "bfloat16") for i in range(40)))
    for spec in (ODD_FILE, many):
        path = tmp_path / spec.path
        make_engine(engine_name).write(path, spec, 0, RankIO(PayloadGenerator(1), rank=0, chunk_bytes=1 << 20))
        bound = spec.nbytes + FILE_OVERHEAD_BYTES + len(spec.tensors) * TENSOR_OVERHEAD_BYTES
        assert spec.nbytes < path.stat().st_size <= bound


def test_torch_load_mmap_reads_stream_files(tmp_path):
    path = tmp_path / "mapped.pt"
    generator = PayloadGenerator(5)
    make_engine("stream").write(path, ODD_FILE, 0, RankIO(generator, rank=1, checkpoint=1))
    state = torch.load(path, weights_only=True, mmap=True)
    data = state["optimizer.state"].view(torch.uint8).numpy()
    assert find_mismatches(generator, data, 1, 1, 0, 5, 0) == []


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(ValueError, match="use one of stream, stream-direct, torch-save"):
        make_engine("fio")


PEAK_RSS = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    from ckptqual.io.engines import make_engine
    from ckptqual.io.engines.base import RankIO
    from ckptqual.io.payload import PayloadGenerator
    from ckptqual.plan.model import FilePlan, TensorSpec
    from ckptqual.plan.safetensors import Piece, ShardFile
    engine, size, path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    tensors = (TensorSpec("x", size, "int8"),)
    if engine == "safetensors":  # one tensor, two ranks' pieces of it
        spec = ShardFile(path.name, tensors, ((Piece(0, 0, 0, size // 2), Piece(1, 0, 0, size - size // 2)),))
    else:
        spec = FilePlan(path.name, tensors)
    make_engine(engine).write(path, spec, 0, RankIO(PayloadGenerator(1), rank=0))
    path.unlink()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    """
)


@pytest.mark.parametrize(
    "engine, name",
    [("stream", "big.pt"), ("dcp", "__0_0.distcp"), ("safetensors", "model-00001-of-00001.safetensors")],
)
def test_an_engines_memory_does_not_grow_with_file_size(tmp_path, engine, name):
    def peak(size: int) -> int:
        args = [sys.executable, "-c", PEAK_RSS, engine, str(size), str(tmp_path / name)]
        return int(subprocess.run(args, capture_output=True, text=True, check=True).stdout)

    small, large = peak(32 << 20), peak(512 << 20)
    assert large - small < 64 << 20, f"peak RSS grew by {(large - small) >> 20} MiB for a 16x larger file"


WINDOWED_WRITE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from ckptqual.io.engines import make_engine
    from ckptqual.io.engines.base import RankIO
    from ckptqual.io.payload import PayloadGenerator
    from ckptqual.plan.model import FilePlan, TensorSpec
    engine, path, early = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "early"
    io = RankIO(PayloadGenerator(1), rank=0, chunk_bytes=1 << 20)
    io.early_writeback = early
    make_engine(engine).write(path, FilePlan(path.name, (TensorSpec("x", 5 << 20, "int8"),)), 0, io)
    """
)


@pytest.mark.parametrize("early", [True, False], ids=["early", "at-fsync"])
@pytest.mark.parametrize(
    "engine, name", [("stream", "w.pt"), ("dcp", "__0_0.distcp"), ("safetensors", "model-00001-of-00001.safetensors")]
)
def test_an_engine_starts_the_writeback_of_its_payload_as_it_writes_it(tmp_path, engine, name, early):
    """With early writeback each chunk of payload written (the stream engine: each chunk's worth of its windows) has
    its writeback started at once (sync_file_range over just that range, on whatever thread wrote it); without,
    none. The fsync that makes the file durable is the saver's."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace)")
    path, log = tmp_path / name, tmp_path / "strace.log"
    trace = ["strace", "-f", "-qq", "-o", str(log), "-e", "trace=sync_file_range"]
    subprocess.run([*trace, sys.executable, "-c", WINDOWED_WRITE, engine, str(path), "early" * early], check=True)
    ranges = re.findall(r"sync_file_range\(\d+, (\d+), (\d+), SYNC_FILE_RANGE_WRITE\) = 0", log.read_text())
    started = [(int(offset), int(size)) for offset, size in ranges]
    if not early:
        assert started == []
        return
    # one range per chunk, in file order, one after the other: together all but the file's last piece
    # (written at close, where the saver's per-file writeback takes over) and its headers
    assert len(started) >= 4
    assert all(offset == before + size for (before, size), (offset, _) in itertools.pairwise(started))
    assert sum(size for _, size in started) >= 4 << 20
