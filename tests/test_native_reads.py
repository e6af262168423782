"""The POSIX engine's native psync loop (io/native/psync_cell.c) on a real file system, against its Python loop: the
same bytes in the same buffers, its batches and depth as each read's own issue and completion times show them, the
checks between batches, real failed and short reads, an interrupt, and the refusal of a missing or stale library.

The loop under test is built from the source as it is now, into a temporary directory (the installed build may be
missing, or stale while the source is being edited); without a C compiler those tests skip, saying so."""

import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ckptqual.host.gpu import HostGpu
from ckptqual.io.native import library, psync_kernel
from ckptqual.io.readers.base import ReadShape
from ckptqual.io.readers.posix import PosixReader
from ckptqual.runs.sweep.cells import SweepConfig, job_offsets
from ckptqual.runs.sweep.driver import ReadError, SweepRun
from ckptqual.runs.sweep.files import DataMismatch

K, M = 1 << 10, 1 << 20
BLOCK = 64 * K
NO_DRIVER = HostGpu(driver_problem="no CUDA driver library (test)")


@pytest.fixture(scope="session")
def native_library(tmp_path_factory) -> psync_kernel.Loaded:
    """The native loop built from the C sources as they are now, loaded as the engine would load it."""
    built = tmp_path_factory.mktemp("native") / library.LIBRARY.name
    problem = library.build(built)
    if problem:
        pytest.skip(f"ckptqual's native library cannot be built here: {problem}")
    loaded, refused = psync_kernel.bind(library.load_from(built, library.sources()))
    assert refused is None
    return loaded


@pytest.fixture
def native(native_library, monkeypatch) -> psync_kernel.Loaded:
    """Makes the engine load the fresh build (PosixReader() then runs cells with it)."""
    monkeypatch.setattr(psync_kernel, "load", lambda: (native_library, None))
    return native_library


class Files:
    """`jobs` sweep files of `file_bytes` written with the payload; POSIX engines opened on them for a cell."""

    def __init__(self, directory: Path, jobs: int, file_bytes: int = M) -> None:
        config = SweepConfig(block_sizes_bytes=(BLOCK,), threads=(1,), jobs=jobs, batch=1, file_bytes=file_bytes)
        self.run = SweepRun(config, directory / "sweep", seed=7, host=NO_DRIVER)
        self.run.files.write()
        self.files, self.jobs, self.file_bytes, self.readers = self.run.files, jobs, file_bytes, []

    def reader(self, loop: str, threads: int, slots: int) -> PosixReader:
        reader = PosixReader(loop=loop)
        with self.files.open_tree() as tree:
            reader.open(tree, self.files.paths, ReadShape(self.jobs, slots, BLOCK, threads))
        self.readers.append(reader)
        return reader

    def offsets(self, counts: list[int]) -> list[list[int]]:
        return [job_offsets(0, count, BLOCK, self.file_bytes) for count in counts]

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
        self.run.close()


@pytest.fixture
def files(tmp_path):
    made: list[Files] = []

    def make(jobs: int, file_bytes: int = M) -> Files:
        made.append(Files(tmp_path, jobs, file_bytes))
        return made[-1]

    yield make
    for each in made:
        each.close()


def run_bounded(reader: PosixReader, *args, result: bool = False, timeout_s: float = 60) -> tuple[bool, list]:
    """Runs read_cell in a thread: (whether it still runs after `timeout_s`, what it raised, or with `result`
    what it returned)."""
    outcome: list = []

    def drive():
        try:
            returned = reader.read_cell(*args)
            if result:
                outcome.append(returned)
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=drive, daemon=True)  # a hung cell fails its test, not the whole run
    worker.start()
    worker.join(timeout=timeout_s)
    return worker.is_alive(), outcome


def read_bounded(reader: PosixReader, *args, timeout_s: float = 60):
    """read_cell's result; fails the test (rather than hang it) if the cell is still running after `timeout_s`."""
    hung, outcome = run_bounded(reader, *args, result=True, timeout_s=timeout_s)
    assert not hung, "the cell hung"
    (returned,) = outcome
    if isinstance(returned, BaseException):
        raise returned
    return returned


# (threads, batch, reads per job): one thread; fewer threads than a batch; more threads than all batches together;
# a last batch shorter than the others; one read per batch; jobs with different counts of reads.
SHAPES = [
    (1, 4, [20, 20, 20]),
    (3, 4, [21, 21]),
    (16, 2, [16, 16]),
    (16, 16, [40] * 4),
    (4, 1, [7, 7]),
    (5, 3, [9, 4, 0]),
]


@pytest.mark.parametrize(("threads", "slots", "counts"), SHAPES)
def test_the_native_loop_reads_what_the_python_loop_reads(native, files, threads, slots, counts):
    made = files(len(counts))
    offsets = made.offsets(counts)
    native_reader, python_reader = made.reader("native", threads, slots), made.reader("python", threads, slots)
    assert native_reader.settings()["workers"].startswith("psync (native C threads)")
    assert native_reader.settings()["native_loop_problem"] is None
    assert python_reader.settings()["workers"].startswith("psync (Python threads)")
    ours, theirs = read_bounded(native_reader, offsets, slots, None), read_bounded(python_reader, offsets, slots, None)
    assert ours.bytes_per_job == theirs.bytes_per_job == [count * BLOCK for count in counts]
    for job, count in enumerate(counts):
        for slot in range(min(slots, count)):
            mine = native_reader.host_copy(job, slot)
            assert np.array_equal(mine, python_reader.host_copy(job, slot)), (job, slot)
        last = offsets[job][-(count % slots or slots) :] if count else []
        for slot, offset in enumerate(last):  # what the buffers hold after the cell: the job's last batch
            made.files.check(job, offset, native_reader.host_copy(job, slot))
    assert ours.latencies_ns.shape == theirs.latencies_ns.shape == (len(counts), max(counts))
    for job, count in enumerate(counts):
        assert (ours.latencies_ns[job, :count] > 0).all() and (ours.latencies_ns[job, count:] == 0).all()
    assert 0 < ours.started_ns < ours.finished_ns <= time.perf_counter_ns()  # the clock of perf_counter_ns
    assert ours.verified == theirs.verified == 0


def in_flight_at_most(issued: np.ndarray, completed: np.ndarray) -> int:
    """The most reads in flight at once, from each read's issue and completion time."""
    events = sorted([(t, 1) for t in issued] + [(t, -1) for t in completed], key=lambda event: (event[0], event[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize(("threads", "slots", "counts"), SHAPES)
def test_the_native_loop_keeps_batches_apart_depth_and_checks_each_batch_before_reuse(
    native, files, threads, slots, counts
):
    made = files(len(counts))
    offsets = made.offsets(counts)
    reader = made.reader("native", threads, slots)
    checked: list[tuple[int, int, int]] = []  # (job, offset, when)

    def check_block(job, offset, data):
        made.files.check(job, offset, data)  # the buffer still holds this block: not reused yet
        checked.append((job, offset, time.perf_counter_ns()))

    reads = read_bounded(reader, offsets, slots, check_block)
    issued = reader.last_issued_ns
    completed = issued + reads.latencies_ns
    assert reads.verified == sum(counts)
    assert in_flight_at_most(
        np.concatenate([issued[job, :count] for job, count in enumerate(counts)]),
        np.concatenate([completed[job, :count] for job, count in enumerate(counts)]),
    ) <= min(threads, len(counts) * slots)
    for job, count in enumerate(counts):
        mine = [(offset, when) for who, offset, when in checked if who == job]
        assert [offset for offset, _ in mine] == offsets[job]  # every block once, in order
        for first in range(0, count, slots):
            end = min(first + slots, count)
            batch_done = completed[job, first:end].max()
            assert issued[job, first:end].min() >= reads.started_ns
            checks = [when for _, when in mine[first:end]]
            assert min(checks) >= batch_done  # checked once the whole batch is in
            if end < count:  # the next batch starts after this one is done and checked
                assert issued[job, end : min(end + slots, count)].min() >= max(max(checks), batch_done)
    assert reads.finished_ns >= completed.max()


def test_a_block_that_reads_back_wrong_stops_the_native_loop_with_the_mismatch(native, files):
    made = files(2)
    with open(made.files.paths[1], "r+b") as file:
        file.seek(5 * BLOCK)
        file.write(bytes(BLOCK))
        os.fsync(file.fileno())
    reader = made.reader("native", 4, 4)
    with pytest.raises(DataMismatch, match=rf"sweep-job001\.bin: block read at offset {5 * BLOCK} holds"):
        read_bounded(reader, made.offsets([16, 16]), 4, made.files.check)


def loop_under_test(request, loop: str) -> None:
    """The native loop's tests need it built (else they skip); the Python loop's run anywhere."""
    if loop == "native":
        request.getfixturevalue("native")


@pytest.mark.parametrize("loop", ["native", "python"])
@pytest.mark.parametrize("threads", [1, 4, 16])
def test_a_file_cut_short_under_the_reader_is_a_short_read_of_that_job_and_offset(request, files, loop, threads):
    """The file of job 1 cut in the middle of its 8th block (the last of its 2nd batch): that read comes back
    short, and no later read of the job may start (its batch never ends), so it is the one named."""
    loop_under_test(request, loop)
    made = files(2)
    reader = made.reader(loop, threads, 4)
    os.truncate(made.files.paths[1], 7 * BLOCK + 4096)
    hung, outcome = run_bounded(reader, made.offsets([12, 12]), 4, None)
    assert not hung, "the cell hung after a short read"
    assert [str(error) for error in outcome] == [f"job 1 offset {7 * BLOCK}: read 4096 of {BLOCK} bytes"]
    assert all(isinstance(error, ReadError) for error in outcome)


@pytest.mark.parametrize("loop", ["native", "python"])
def test_a_read_the_kernel_refuses_names_its_job_offset_and_errno(request, files, loop):
    """Job 1's descriptor made write-only (a real file opened O_WRONLY, dup2'd over it): pread fails with EBADF."""
    loop_under_test(request, loop)
    made = files(2)
    reader = made.reader(loop, 1, 4)
    other = os.open(made.files.paths[0], os.O_WRONLY)
    try:
        os.dup2(other, reader._fds[1])
    finally:
        os.close(other)
    hung, outcome = run_bounded(reader, made.offsets([8, 8]), 4, None)
    assert not hung, "the cell hung after a failed read"
    assert [str(error) for error in outcome] == ["job 1 offset 0: [Errno 9] Bad file descriptor"]
    assert isinstance(outcome[0], ReadError) and outcome[0].__cause__.errno == 9


def test_a_refused_read_among_many_threads_stops_the_cell_without_a_hang(native, files):
    made = files(4)
    reader = made.reader("native", 16, 16)
    directory = os.open(made.files.directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.dup2(directory, reader._fds[2])  # pread on a directory: EISDIR
    finally:
        os.close(directory)
    hung, outcome = run_bounded(reader, made.offsets([16] * 4), 16, made.files.check)
    assert not hung, "the cell hung after a failed read"
    assert len(outcome) == 1 and isinstance(outcome[0], ReadError)
    offset = int(str(outcome[0]).split()[3].rstrip(":"))
    assert str(outcome[0]) == f"job 2 offset {offset}: [Errno 21] Is a directory" and offset < 16 * BLOCK


class Interrupted(Exception):
    pass


def test_an_interrupt_stops_the_native_workers_and_waits_for_the_reads_in_flight(native, files):
    """A signal handler that raises (as the plugin's does for SIGINT and SIGTERM) stops a cell at once: it would
    run over 3 s (each block's check sleeps 50 ms: 16 batches of 4 per job), but stops within a batch or two, and
    no native thread is left."""
    made = files(2)
    reader = made.reader("native", 4, 4)

    def slow_check(job, offset, data):
        time.sleep(0.05)

    def interrupt(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    started = time.monotonic()
    try:
        timer.start()
        with pytest.raises(Interrupted):
            reader.read_cell(made.offsets([64, 64]), 4, slow_check)
            time.sleep(10)  # not reached if the cell was interrupted
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert time.monotonic() - started < 1.2
    assert not [
        thread for thread in threading.enumerate() if thread.name == "ckptqual-psync-native" and thread.is_alive()
    ]


def test_a_library_built_from_another_source_is_refused_and_the_python_loop_runs(tmp_path, files, monkeypatch):
    stale = tmp_path / library.LIBRARY.name
    problem = library.build(stale, digest="0" * 64)  # as if built from older sources
    if problem:
        pytest.skip(f"ckptqual's native library cannot be built here: {problem}")
    loaded, refused = psync_kernel.bind(library.load_from(stale, library.sources()))
    assert loaded is None and "was built from other versions of its sources (sha256 000000000000" in refused
    assert "a stale build is not used" in refused
    monkeypatch.setattr(psync_kernel, "load", lambda: (loaded, refused))
    made = files(2)
    reader = made.reader("native", 4, 4)
    assert reader.settings()["workers"].startswith("psync (Python threads)")
    assert reader.settings()["native_loop_problem"] == refused
    reads = read_bounded(reader, made.offsets([8, 8]), 4, made.files.check)
    assert reads.bytes_per_job == [8 * BLOCK] * 2 and reads.verified == 16


def test_an_edited_source_makes_the_built_library_stale(tmp_path):
    sources = []
    for source in library.sources():
        sources.append(tmp_path / source.name)
        sources[-1].write_bytes(source.read_bytes())
    built = tmp_path / library.LIBRARY.name
    problem = library.build(built, sources)
    if problem:
        pytest.skip(f"ckptqual's native library cannot be built here: {problem}")
    assert library.load_from(built, sources)[1] is None
    edited = next(path for path in sources if path.name == "psync_cell.c")
    edited.write_bytes(edited.read_bytes() + b"/* edited */\n")
    loaded, refused = library.load_from(built, sources)
    assert loaded is None and "a stale build is not used" in refused


def test_without_the_library_the_python_loop_runs_and_says_why(tmp_path, files, monkeypatch):
    missing = psync_kernel.bind(library.load_from(tmp_path / library.LIBRARY.name, library.sources()))
    assert missing[0] is None and "ckptqual's native kernels are not built" in missing[1]
    monkeypatch.setattr(psync_kernel, "load", lambda: missing)
    made = files(2)
    reader = made.reader("native", 4, 4)
    assert reader.settings()["workers"].startswith("psync (Python threads)")
    assert reader.settings()["native_loop_problem"] == missing[1]
    reads = read_bounded(reader, made.offsets([8, 8]), 4, made.files.check)
    assert reads.bytes_per_job == [8 * BLOCK] * 2 and reads.verified == 16


@pytest.mark.parametrize(
    ("compiler", "reason"),
    [("/bin/false", "/bin/false failed to compile library.c, payload.c, psync_cell.c (exit 1)"), (None, "no C")],
)
def test_a_build_without_a_working_compiler_says_why_and_leaves_no_library(tmp_path, monkeypatch, compiler, reason):
    if compiler:
        monkeypatch.setenv("CC", compiler)
    else:
        monkeypatch.delenv("CC", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    built = tmp_path / "out" / library.LIBRARY.name
    problem = library.build(built)
    assert problem is not None and problem.startswith(reason)
    assert not built.parent.exists() or list(built.parent.iterdir()) == []


CONSTRUCTOR = """#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void ckptqual_test_constructor(void) {
    const char *marker = getenv("CKPTQUAL_TEST_CONSTRUCTOR_MARKER");
    if (marker) close(open(marker, O_CREAT | O_WRONLY, 0600));
}
"""


def _with_constructor(tmp_path: Path) -> list[Path]:
    """The library's sources and one more whose constructor creates the file $CKPTQUAL_TEST_CONSTRUCTOR_MARKER."""
    extra = tmp_path / "zz_constructor.c"
    extra.write_text(CONSTRUCTOR)
    return [*library.sources(), extra]


@pytest.mark.parametrize("fault", ["stale sources", "altered file"])
def test_a_stale_or_altered_library_is_refused_before_any_of_its_code_runs(tmp_path, monkeypatch, fault):
    """The build records the library file's SHA-256 and its sources'; both are checked before the library is
    loaded, so a refused build's constructor never runs, and the refusal gives the file's SHA-256."""
    sources = _with_constructor(tmp_path)
    built = tmp_path / library.LIBRARY.name
    problem = library.build(built, sources, digest="0" * 64 if fault == "stale sources" else None)
    if problem:
        pytest.skip(f"ckptqual's native library cannot be built here: {problem}")
    if fault == "altered file":
        with built.open("ab") as file:
            file.write(b"\0")
    marker = tmp_path / "constructor-ran"
    monkeypatch.setenv("CKPTQUAL_TEST_CONSTRUCTOR_MARKER", str(marker))
    loaded, refused = library.load_from(built, sources)
    actual = hashlib.sha256(built.read_bytes()).hexdigest()
    assert loaded is None and f"(sha256 {actual})" in refused, refused
    expected = "a stale build is not used" if fault == "stale sources" else "is not the file its build recorded"
    assert expected in refused, refused
    assert not marker.exists()


def test_a_library_without_the_record_of_its_build_is_refused(tmp_path):
    built = tmp_path / library.LIBRARY.name
    problem = library.build(built)
    if problem:
        pytest.skip(f"ckptqual's native library cannot be built here: {problem}")
    assert library.load_from(built, library.sources())[1] is None
    library.build_record(built).unlink()
    loaded, refused = library.load_from(built, library.sources())
    assert loaded is None and f"has no record of its build ({built.name}.sha256)" in refused
