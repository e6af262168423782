"""The one small interface every checkpoint I/O engine implements (write and read back), and the state a rank
carries."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ckptqual.faults import RunError
from ckptqual.host.beneath import RunTree
from ckptqual.io import lanes
from ckptqual.io.engines.fileimage import aligned_buffer
from ckptqual.io.payload import Mismatch, PayloadGenerator, find_mismatches
from ckptqual.io.writeback import start_writeback
from ckptqual.plan.model import FilePlan

DEFAULT_CHUNK_BYTES = 8 << 20
MAX_REPORTED = 5  # wrong blocks named in one failure; a read stops looking after one more
REMEMBERED_CRCS = 1 << 16  # tensors whose written CRC32 a rank keeps (a few MB), the newest ones


@dataclass
class RankIO:
    """What one rank needs to write or read its files: payload, identity, a reusable buffer, counters.

    `payload_cpu_s` is the CPU time spent making (writing) or checking (reading) payload; `stage` names the
    operation under way (mkdir, write, fsync, commit, read), so that an I/O error says what failed, and `phases` keeps
    the wall seconds spent in each stage begun with `begin` (`commit`: the metadata commit, its renames and
    directory fsyncs). `tree`: the run directory
    every file is reached through (a rank sets it for each task); without one, a file is reached from its own
    directory. Either way no symlink is followed.
    """

    generator: PayloadGenerator
    rank: int
    checkpoint: int = 0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    payload_cpu_s: float = 0.0
    generated_bytes: int = 0
    stage: str = "write"
    tree: RunTree | None = None
    barrier: Any = None  # where every rank of the task meets (set by the worker); an engine's `finish` may wait there
    early_writeback: bool = True  # an engine starts the writeback of what it wrote as it goes (io.writeback)

    def __post_init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._phase = ""  # the stage begun last
        self._phase_start: float | None = None  # when it began (None: none timed)
        self.buffer = np.empty(self.chunk_bytes, dtype=np.uint8)
        self._spare = np.empty(0, dtype=np.uint8)
        self._expected = np.empty(0, dtype=np.uint8)
        self._windows: list[np.ndarray] = []
        self._crcs: OrderedDict[tuple[int, ...], int] = OrderedDict()

    def begin(self, stage: str) -> None:
        """Ends the stage under way (its wall seconds added to `phases`) and begins `stage`."""
        now = time.monotonic()
        if self._phase_start is not None:
            self.phases[self._phase] = self.phases.get(self._phase, 0.0) + now - self._phase_start
        self.stage, self._phase, self._phase_start = stage, stage, now

    def end_phases(self) -> dict[str, float]:
        """Ends the stage under way and hands over the phases timed since the last call (begun with `begin`)."""
        self.begin(self.stage)
        phases, self.phases, self._phase_start = self.phases, {}, None
        return phases

    def _tensor_key(self, file: int, tensor: int, nbytes: int) -> tuple[int, ...]:
        """Everything a tensor's payload is a function of: seed, checkpoint, rank, file, tensor and size. A rank may
        act as another (a shifted read over several nodes), so the rank is part of it."""
        return (self.generator.seed, self.checkpoint, self.rank, file, tensor, nbytes)

    def remember_crc(self, file: int, tensor: int, nbytes: int, crc: int) -> None:
        """Keeps the CRC32 this rank took of a tensor's payload as it wrote it; it holds for every copy of that
        tensor (`_tensor_key`)."""
        key = self._tensor_key(file, tensor, nbytes)
        self._crcs[key] = crc
        self._crcs.move_to_end(key)
        while len(self._crcs) > REMEMBERED_CRCS:
            self._crcs.popitem(last=False)

    def written_crc(self, file: int, tensor: int, nbytes: int) -> int | None:
        """The CRC32 taken of that tensor's payload when this process wrote it (None: it did not, or forgot)."""
        return self._crcs.get(self._tensor_key(file, tensor, nbytes))

    def spare_buffer(self) -> np.ndarray:
        """A second buffer as large as `buffer` (made on first use), for a read ahead while `buffer` is checked."""
        if self._spare.nbytes < self.chunk_bytes:
            self._spare = np.empty(self.chunk_bytes, dtype=np.uint8)
        return self._spare

    def windows(self, count: int, size: int) -> list[np.ndarray]:
        """`count` page-aligned window buffers of `size` bytes (fileimage.aligned_buffer), kept for the rank's later
        files and checkpoints: a fresh one would cost a page fault per page of every checkpoint."""
        if len(self._windows) < count or any(window.nbytes != size for window in self._windows):
            self._windows = [aligned_buffer(size) for _ in range(count)]
        return self._windows[:count]

    @contextmanager
    def acting_as(self, rank: int) -> Iterator[None]:
        """Payload made and checked inside the block is rank `rank`'s (a piece another rank wrote)."""
        own, self.rank = self.rank, rank
        try:
            yield
        finally:
            self.rank = own

    def payload_time(self) -> _PayloadClock:
        """Counts the CPU time of the block as payload time: this thread's and that of the lanes' helpers (not wall
        time: ranks share cores)."""
        return _PayloadClock(self)

    def generate(self, out: np.ndarray, file: int, tensor: int, offset: int) -> None:
        """Fills `out` with this rank's payload; CPU time counted."""
        with self.payload_time():
            self.generator.fill(out, self.checkpoint, self.rank, file, tensor, offset)
        self.generated_bytes += out.nbytes

    def padding(self, size: int, file: int, tensor: int) -> bytes:
        """The `size` bytes of keystream that pad the file before tensor `tensor`'s data; CPU time counted."""
        with self.payload_time():
            out = np.empty(size, dtype=np.uint8)
            self.generator.fill_padding(out, self.checkpoint, self.rank, file, tensor)
            return out.tobytes()

    def verify(self, data: np.ndarray, file: int, tensor: int, offset: int) -> list[Mismatch]:
        """The blocks of `data` (tensor bytes from `offset`) that differ from this rank's payload; CPU time counted."""
        with self.payload_time():
            if self._expected.nbytes < data.nbytes:  # grows to the largest piece checked, then is reused
                self._expected = np.empty(max(data.nbytes, self.chunk_bytes), dtype=np.uint8)
            return find_mismatches(
                self.generator, data, self.checkpoint, self.rank, file, tensor, offset, scratch=self._expected
            )

    def open(self, path: Path, flags: int) -> int:
        """A descriptor of the file `path` (new where `flags` hold O_CREAT | O_EXCL), reached without following a
        symlink; a planted entry raises PlantedEntry."""
        if self.tree is not None:
            return self.tree.open(path, flags)
        with RunTree(path.parent) as own:
            return own.open(path, flags)

    @contextmanager
    def directory(self, path: Path, create: bool = False) -> Iterator[int]:
        """A handle of the directory `path` (made where `create` and missing), reached as `open` reaches a file."""
        with self.tree.directory(path, create) if self.tree is not None else _own_directory(path, create) as fd:
            yield fd


class _PayloadClock:
    """RankIO.payload_time's block: a plain class, as it runs for every tensor and chunk."""

    __slots__ = ("_io", "_start")

    def __init__(self, io: RankIO) -> None:
        self._io = io

    def __enter__(self) -> None:
        self._start = time.thread_time() + lanes.shared().helper_cpu_s

    def __exit__(self, *exc: object) -> None:
        self._io.payload_cpu_s += time.thread_time() + lanes.shared().helper_cpu_s - self._start


@contextmanager
def opened_path(io: RankIO, path: Path) -> Iterator[str]:
    """A path that reaches the file `path` as `io.open` opened it (/proc/self/fd/N: the same inode, not the name), for
    a library that takes only a path (torch.load with mmap, KvikIO); valid inside the block."""
    fd = io.open(path, os.O_RDONLY)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


@contextmanager
def _own_directory(path: Path, create: bool) -> Iterator[int]:
    with RunTree(path.parent) as above, above.directory(path, create) as fd:
        yield fd


class IntegrityError(RuntimeError):
    """Read-back data differs from what was written; the one-line message names file, record or offset."""


class ReadBackError(OSError):
    """The drive failed a read; the message names file and offset."""


@dataclass(frozen=True)
class Problem:
    """One wrong block, located in its file."""

    file: str
    tensor: str
    file_offset: int
    mismatch: Mismatch

    def describe(self) -> str:
        return (
            f"{self.file}: tensor {self.tensor!r} at file offset {self.file_offset} "
            f"(tensor offset {self.mismatch.offset}) holds {self.mismatch.found}"
        )


class Engine(Protocol):
    """Writes one checkpoint file of a plan (the rank makes it durable once all its files are written), and reads
    one back cold, proving it loadable and exact."""

    name: str

    def write(self, path: Path, spec: FilePlan, file_index: int, io: RankIO) -> None: ...

    def read(self, path: Path, spec: FilePlan, file_index: int, io: RankIO, label: str) -> list[Problem]:
        """Checks structure, records, CRCs, pickle and payload; returns the wrong blocks (stopping after
        MAX_REPORTED + 1), raises IntegrityError for other damage, ReadBackError for a failed read; messages
        name the file as `label`."""
        ...


def meet_to_commit(io: RankIO, what: str) -> None:
    """Once this rank's files are durable: meets every rank of the task twice before the coordinator commits `what`
    (a format's shared file). A rank that failed meets the others at the first and breaks the second
    (`release_commit`), so they fail at once and nothing is committed."""
    if io.barrier is None:
        return
    try:
        io.barrier.wait()
        io.barrier.wait()
    except threading.BrokenBarrierError:
        raise RunError(f"{what} not committed: another rank failed before its files were durable", "not-run") from None


def commit_shared(
    io: RankIO, task: Any, name: str, data: Callable[[Path], bytes], staged_as: str | None = None
) -> None:
    """Once this rank's files are durable: meets every rank (meet_to_commit), then the coordinator (rank 0) writes a
    format's shared file `name`, `data(directory)`, new in the task's directory (O_EXCL), fsyncs it and the directory;
    `staged_as`: written under that name and renamed to `name`, so that `name` appears whole or not at all."""
    meet_to_commit(io, name)
    if task.plan.rank != 0:
        return
    directory = Path(task.directory)
    fd = io.open(directory / (staged_as or name), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        write_all(fd, data(directory))
        os.fsync(fd)
    finally:
        os.close(fd)
    with io.directory(directory) as handle:
        if staged_as is not None:
            os.rename(staged_as, name, src_dir_fd=handle, dst_dir_fd=handle)
        os.fsync(handle)


def write_all(fd: int, data: Any) -> None:
    """Writes all of `data` (bytes or a uint8 array) at the file's position."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def write_payload(io: RankIO, fd: int, chunk: np.ndarray) -> None:
    """Writes a chunk of payload at the file's position and, with the rank's early writeback, starts writing those
    pages to the drive at once (io.writeback), so that it works while the rank makes the next chunk."""
    start = os.lseek(fd, 0, os.SEEK_CUR)
    write_all(fd, chunk)
    if io.early_writeback:
        start_writeback(fd, start, chunk.nbytes)


def release_commit(io: RankIO) -> None:
    """A rank whose files failed: meets the others where they wait after theirs (so every rank has left the task's
    start), then breaks the meeting at which the coordinator would commit. Where the meeting cannot be broken (the
    nodes' barrier), it meets twice: the checkpoint is committed, and failed by this rank's error."""
    if io.barrier is None:
        return
    with contextlib.suppress(threading.BrokenBarrierError):
        io.barrier.wait()
        if hasattr(io.barrier, "abort"):
            io.barrier.abort()
        else:
            io.barrier.wait()


def fsync_path(io: RankIO, path: Path) -> None:
    """Makes a written file durable; an error names the file."""
    fd = io.open(path, os.O_RDONLY)
    try:
        _fsync(fd, path)
    finally:
        os.close(fd)


def writeback_path(io: RankIO, path: Path) -> None:
    """Starts the writeback of a written file's dirty pages without waiting for it (io.writeback); an error names
    the file."""
    fd = io.open(path, os.O_RDONLY)
    try:
        start_writeback(fd)
    except OSError as error:
        raise OSError(error.errno, error.strerror, str(path)) from None
    finally:
        os.close(fd)


def fsync_directory(io: RankIO, path: Path) -> None:
    """Makes the directory entries of files created in `path` durable; an error names the directory."""
    with io.directory(path) as fd:
        _fsync(fd, path)


def _fsync(fd: int, path: Path) -> None:
    try:
        os.fsync(fd)
    except OSError as error:
        raise OSError(error.errno, error.strerror, str(path)) from None
