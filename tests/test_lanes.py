"""One rank on more than one core: the keystream, the lanes, the write behind and the read ahead give the same bytes
and the same findings as one thread, and a helper's error reaches the rank."""

import itertools
import os
import threading
import time

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ckptqual.io import keystream, lanes
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import RankIO, ReadBackError
from ckptqual.io.engines.fileimage import BLOCK, FileImage, aligned_buffer
from ckptqual.io.engines.torchread.source import FileSource
from ckptqual.io.payload import BLOCK_BYTES, PayloadGenerator, find_mismatches
from ckptqual.plan.model import FilePlan, RankPlan, TensorSpec
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.pool import RankPool

KEY = bytes(range(16))
# Several 1 MiB windows per tensor, odd sizes and an empty tensor: every window boundary and tail is crossed.
MULTI_WINDOW = FilePlan(
    "multi.pt",
    (
        TensorSpec("tiny", 3, "int8"),
        TensorSpec("wqkv", 2_500_001, "float16"),
        TensorSpec("empty", 0, "float32"),
        TensorSpec("state", 777_777, "float32"),
    ),
)


@pytest.fixture
def two_lanes():
    """This process with two lanes for the test, one again after it."""
    yield lanes.use(2)
    lanes.use(1)


def _cryptography_ctr(key: bytes, counter: int, nbytes: int) -> bytes:
    encryptor = Cipher(algorithms.AES(key), modes.CTR(counter.to_bytes(16, "big"))).encryptor()
    return encryptor.update(bytes(nbytes))


@pytest.mark.parametrize("counter", [0, 7 << 64 | 256, (1 << 128) - 3])  # the last wraps around, as CTR does
@pytest.mark.parametrize("nbytes", [16, 4096 + 5, (1 << 20) + 4096 * 3])
def test_keystream_is_cryptographys_aes_ctr(counter, nbytes, monkeypatch):
    wanted = _cryptography_ctr(KEY, counter, nbytes)
    out = np.empty(nbytes, dtype=np.uint8)
    keystream.fill(KEY, counter, out)
    assert out.tobytes() == wanted
    monkeypatch.setattr(keystream, "_libcrypto", None)  # the fallback where libcrypto cannot be loaded
    out[:] = 0
    keystream.fill(KEY, counter, out)
    assert out.tobytes() == wanted


def test_keystream_runs_without_the_gil_on_this_host():
    assert keystream.RELEASES_GIL, keystream.IMPLEMENTATION


def test_pieces_cover_the_job_aligned_and_not_too_small():
    spread = lanes.Lanes(3)
    try:
        pieces = spread.pieces(10 << 20, BLOCK_BYTES)
        assert len(pieces) == 3
        assert pieces[0][0] == 0 and pieces[-1][1] == 10 << 20
        assert all(stop == start for (_, stop), (start, _) in itertools.pairwise(pieces))
        assert all(start % BLOCK_BYTES == 0 for start, _ in pieces)
        assert spread.pieces(lanes.MIN_PIECE_BYTES + 1, BLOCK_BYTES) == [(0, lanes.MIN_PIECE_BYTES + 1)]
        assert spread.pieces(0, BLOCK_BYTES) == []
    finally:
        spread.close()
    with pytest.raises(ValueError, match="lanes 0: must be at least 1"):
        lanes.Lanes(0)


def test_map_runs_every_piece_waits_for_all_and_raises_the_error():
    spread = lanes.Lanes(2)
    done: list[tuple[int, int]] = []
    release = threading.Event()

    def work(start: int, stop: int) -> None:
        if start == 0:
            raise OSError(5, "piece 0 failed")
        release.wait(5)
        done.append((start, stop))

    try:
        timer = threading.Timer(0.2, release.set)
        timer.start()
        with pytest.raises(OSError, match="piece 0 failed"):
            spread.map(work, [(0, 1), (1, 2), (2, 3)])
        assert sorted(done) == [(1, 2), (2, 3)]  # the error waited for the pieces that share its buffers

        def spin(start: int, stop: int) -> None:
            end = time.thread_time() + 0.05
            while time.thread_time() < end:
                pass

        before = spread.helper_cpu_s
        spread.map(spin, [(0, 1), (1, 2)])
        assert spread.helper_cpu_s >= before  # a helper's CPU is counted where a helper ran a piece
    finally:
        spread.close()


def test_pool_share_of_cores_is_at_least_one_and_at_most_the_cap():
    assert lanes.share_of(10_000) == 1
    assert 1 <= lanes.share_of(1) <= lanes.MAX_LANES


def test_payload_and_comparison_are_the_same_on_two_lanes(two_lanes):
    generator = PayloadGenerator(5)
    one, two = np.empty(6 << 20, np.uint8), np.empty(6 << 20, np.uint8)
    lanes.use(1)
    generator.fill(one, 1, 2, 3, 4, 8192)
    lanes.use(2)
    generator.fill(two, 1, 2, 3, 4, 8192)
    assert one.tobytes() == two.tobytes()
    assert find_mismatches(generator, two, 1, 2, 3, 4, 8192) == []
    two[-1] ^= 1  # in the last piece, which a helper checks
    found = find_mismatches(generator, two, 1, 2, 3, 4, 8192)
    assert [m.offset for m in found] == [8192 + (two.nbytes - 1) // BLOCK_BYTES * BLOCK_BYTES]


def _written(tmp_path, name: str, count: int, engine_name: str = "stream") -> tuple[bytes, RankIO]:
    lanes.use(count)
    io = RankIO(PayloadGenerator(11), rank=3, checkpoint=2, chunk_bytes=1 << 20)
    path = tmp_path / name
    make_engine(engine_name).write(path, MULTI_WINDOW, 4, io)
    return path.read_bytes(), io


@pytest.mark.parametrize("engine_name", ["stream", "stream-direct"])
def test_write_behind_gives_the_same_file_as_one_thread(tmp_path, two_lanes, engine_name):
    one, _ = _written(tmp_path, "one.pt", 1, engine_name)
    two, io = _written(tmp_path, "two.pt", 2, engine_name)
    assert one == two and len(one) > 4 << 20
    state = torch.load(tmp_path / "two.pt", weights_only=True)
    assert [tuple(t.shape) for t in state.values()] == [(t.numel,) for t in MULTI_WINDOW.tensors]
    assert make_engine("stream").read(tmp_path / "two.pt", MULTI_WINDOW, 4, io, "two.pt") == []
    assert io.payload_cpu_s > 0


def test_a_failed_write_in_flight_is_raised(tmp_path, two_lanes):
    window, spare = aligned_buffer(2 * BLOCK), aligned_buffer(2 * BLOCK)
    image = FileImage(
        tmp_path / "full", window, lambda path, flags: os.open("/dev/full", os.O_WRONLY), False, (spare, two_lanes)
    )
    with pytest.raises(OSError) as raised:
        for _ in range(4):  # the first window's write fails behind; a later put or the close raises it
            image.put(bytes(2 * BLOCK))
        image.close()
    assert raised.value.errno == 28  # ENOSPC, as /dev/full answers every write
    image.abandon()
    assert image.fd == -1


def _damaged_copy(tmp_path, name: str, blocks: list[int]) -> tuple[RankIO, object]:
    data, io = _written(tmp_path, f"good-{name}", 2)
    damaged = bytearray(data)
    for at in blocks:
        damaged[at] ^= 0xFF
    path = tmp_path / name
    path.write_bytes(bytes(damaged))
    return io, path


def test_read_ahead_finds_the_wrong_block_and_stops_after_enough(tmp_path, two_lanes):
    far = 3 << 20  # in wqkv's fourth chunk: read ahead, not first
    io, path = _damaged_copy(tmp_path, "one-bad.pt", [far])
    problems = make_engine("stream").read(path, MULTI_WINDOW, 4, io, "bad.pt")
    assert [p.file_offset for p in problems] == [far // BLOCK * BLOCK]
    many = [far + i * BLOCK for i in range(40)]
    io, path = _damaged_copy(tmp_path, "many-bad.pt", many)
    problems = make_engine("stream").read(path, MULTI_WINDOW, 4, io, "bad.pt")
    lanes.use(1)
    alone = make_engine("stream").read(path, MULTI_WINDOW, 4, io, "bad.pt")
    assert problems == alone and len(problems) < len(many)  # it stopped early, as one thread does


def test_read_ahead_raises_a_failed_read_with_its_offset(tmp_path, two_lanes):
    path = tmp_path / "dir"
    path.mkdir()
    fd = os.open(path, os.O_RDONLY)  # a directory: every read fails with EISDIR
    try:
        source = FileSource(fd, "dir", np.empty(1024, np.uint8))  # smaller than the directory: read by span
        pieces = source.chunks([(0, 1024), (1024, 1024)], (np.empty(1024, np.uint8), two_lanes))
        with pytest.raises(ReadBackError, match="dir: I/O error at file offset 0"):
            next(pieces)
    finally:
        os.close(fd)


def test_ranks_with_two_lanes_write_restore_and_find_a_damaged_block(tmp_path):
    plan = (RankPlan(0, (MULTI_WINDOW,)),)
    directory = tmp_path / "checkpoint"
    with RankPool(1, seed=9, timeout_s=120, chunk_bytes=1 << 20, lanes=2) as pool:
        written = pool.write_checkpoint(directory, 3, plan, "stream")
        assert written.bytes == MULTI_WINDOW.nbytes
        assert pool.run("read", directory, plan, "restore", 3, {"engine": "stream"}).bytes == MULTI_WINDOW.nbytes
        path = directory / MULTI_WINDOW.path
        with open(path, "r+b") as file:  # a byte deep in wqkv, in a span the rank reads ahead
            file.seek(3 << 20)
            byte = file.read(1)
            file.seek(3 << 20)
            file.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(RankFailure, match=rf"tensor 'wqkv' at file offset {3 << 20} "):
            pool.run("read", directory, plan, "restore", 3, {"engine": "stream"})
