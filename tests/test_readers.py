"""The sweep's read engines on a real file system: the POSIX engine here, KvikIO's host path through the libcuda
stand-in in child processes, and a child qualification run that skips a GPU transfer type with its reason."""

import json
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import stand_in
from ckptqual.host.gpu import HostGpu
from ckptqual.io.readers.posix import PosixReader
from ckptqual.runs.sweep.cells import Cell, SweepConfig, job_offsets, plan_cells
from ckptqual.runs.sweep.driver import ReadError, SweepRun, read_shape, run_cell
from ckptqual.runs.sweep.files import DataMismatch
from suite_runs import missed_limit

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[1]
K, M = 1 << 10, 1 << 20
NO_DRIVER = HostGpu(driver_problem="no CUDA driver library (test)")
SMALL = SweepConfig(
    block_sizes_bytes=(M, 64 * K, 8 * K),
    threads=(4, 1),
    jobs=2,
    batch=4,
    file_bytes=4 * M,
    transfers=("cpu-only",),
    requests=96,
)


def warm(paths: list[Path]) -> None:
    """Reads the files buffered, so that they sit in the page cache: the sweep must drop them before a cell."""
    for path in paths:
        path.read_bytes()


KVIKIO_MISSING = "KvikIO is not installed (docs/qualifying.md: the 115 MB install without cupy); CI installs it"


@pytest.fixture(scope="session")
def libcuda_stand_in(tmp_path_factory) -> Path:
    """The stand-in driver library; the tests that use it drive KvikIO, so they need it installed."""
    pytest.importorskip("kvikio", reason=KVIKIO_MISSING)
    try:
        return stand_in.build(tmp_path_factory.mktemp("stand-in"))
    except stand_in.StandInUnavailable as error:
        pytest.skip(str(error))


def test_posix_engine_reads_back_what_was_written_from_the_drive(slow_target):
    """On the slow stand-in drive, which no other process's I/O reaches: no cell can be INVALID for it."""
    run = SweepRun(SMALL, slow_target / "sweep", seed=5, host=NO_DRIVER, verify="all")
    run.files.write()
    for cell in plan_cells(SMALL):
        warm(run.files.paths)
        assert run.files.cached_fraction() > 0.9
        result = run.measure(cell)
        record = result.record
        assert record["engine"] == "posix"
        assert record["bytes"] == record["planned_bytes"] == SMALL.jobs * cell.requests_per_job * cell.block_bytes
        assert record["verified_requests"] == record["requests"] == SMALL.jobs * cell.requests_per_job
        assert record["cached_fraction_before"] <= 0.01
        if record["settings"]["direct_io"]:
            assert record["cached_fraction_after"] == 0.0  # O_DIRECT left nothing in the page cache
        assert result.stats.GiBps > 0
        assert 0 < result.stats.mean_latency_us <= result.stats.max_latency_us
        assert result.stats.p99_latency_us <= result.stats.max_latency_us
        assert record["outcome"] == "MEASURED" and record["invalid_reason"] is None
    assert [cell["id"] for cell in run.data["cells"]] == [cell.id for cell in plan_cells(SMALL)]
    # Each cell starts where the last one stopped (1M and 64K cells read whole 4M files; 8K cells 96 blocks).
    assert [cell["start_offsets"] for cell in run.data["cells"]] == [[0, 0]] * 5 + [[96 * 8 * K] * 2]
    run.close()
    assert not (slow_target / "sweep").exists()


def test_a_block_that_reads_back_wrong_fails_the_cell(tmp_path):
    run = SweepRun(SMALL, tmp_path / "sweep", seed=5, host=NO_DRIVER, verify="all")
    run.files.write()
    with open(run.files.paths[1], "r+b") as file:
        file.seek(128 * K)
        file.write(bytes(8 * K))
        os.fsync(file.fileno())
    cell = Cell("cpu-only", 64 * K, 4, jobs=2, batch=4, requests_per_job=8)
    with pytest.raises(DataMismatch, match=r"sweep-job001\.bin: block read at offset 131072 holds .*zeros"):
        run.measure(cell)
    assert run.data["cells"][0]["outcome"] == "ERROR"
    assert "DataMismatch" in run.data["cells"][0]["error"]
    run.close()


class Watching:
    """Wraps a real reader to watch the loop: reads in flight, and whether a job's batch finished before the next."""

    def __init__(self, inner: PosixReader, slots: int) -> None:
        self.inner, self.slots = inner, slots
        self.engine, self.transfer = inner.engine, inner.transfer
        self.lock = threading.Lock()
        self.in_flight = self.peak = 0
        self.open_per_job: dict[int, int] = {}
        self.submitted: dict[int, list[int]] = {}
        self.early: list[str] = []

    def submit(self, job, slot, offset):
        with self.lock:
            if slot == 0 and self.open_per_job.get(job, 0):
                self.early.append(f"job {job} began a batch with {self.open_per_job[job]} reads outstanding")
            self.open_per_job[job] = self.open_per_job.get(job, 0) + 1
            self.submitted.setdefault(job, []).append(offset)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        pending, watcher = self.inner.submit(job, slot, offset), self

        class Done:
            def wait(self):
                result = pending.wait()
                with watcher.lock:
                    watcher.in_flight -= 1
                    watcher.open_per_job[job] -= 1
                return result

        return Done()

    def host_copy(self, job, slot):
        return self.inner.host_copy(job, slot)


@pytest.mark.parametrize(("threads", "jobs", "batch"), [(1, 3, 4), (3, 2, 4), (16, 2, 2)])
def test_the_loop_keeps_depth_and_batches(tmp_path, threads, jobs, batch):
    config = SweepConfig(block_sizes_bytes=(64 * K,), threads=(threads,), jobs=jobs, batch=batch, file_bytes=M)
    run = SweepRun(config, tmp_path / "sweep", seed=1, host=NO_DRIVER)
    run.files.write()
    cell = Cell("cpu-only", 64 * K, threads, jobs, batch, requests_per_job=20)
    inner = PosixReader()
    with run.files.open_tree() as tree:
        inner.open(tree, run.files.paths, read_shape(cell))
    watching = Watching(inner, cell.slots)
    try:
        done = run_cell(watching, cell, [3 * 64 * K] * jobs, M, check_block=run.files.check)
    finally:
        inner.close()
        run.close()
    assert watching.peak <= min(threads, jobs * batch)
    assert watching.early == []
    for job in range(jobs):
        assert watching.submitted[job] == job_offsets(3 * 64 * K, 20, 64 * K, M)  # sequential, wrapping at 1M
    assert done.bytes == jobs * 20 * 64 * K and done.verified_requests == jobs * 20
    assert done.next_starts == [(3 + 20) * 64 * K % M] * jobs
    assert len(done.latencies_ns) == jobs * 20 and (done.latencies_ns > 0).all()


class Failing(Watching):
    """A real reader whose submits of one offset fail, or whose reads of another come back short."""

    def __init__(self, inner: PosixReader, slots: int, refuse: int, short: int) -> None:
        super().__init__(inner, slots)
        self.refuse, self.short = refuse, short

    def submit(self, job, slot, offset):
        if job == 0 and offset == self.refuse:
            raise OSError("refused for the test")
        pending = super().submit(job, slot, offset)
        if job == 1 and offset == self.short:

            class Short:
                def wait(self):
                    got, issued, done = pending.wait()
                    return got // 2, issued, done

            return Short()
        return pending


def opened_posix_cell(
    tmp_path: Path, threads: int, requests_per_job: int, loop: str = "native"
) -> tuple[SweepRun, Cell, PosixReader]:
    """Two 1 MiB sweep files written, a 64K cpu-only cell over them, and the POSIX engine (with `loop`) opened
    for it."""
    config = SweepConfig(block_sizes_bytes=(64 * K,), threads=(threads,), jobs=2, batch=4, file_bytes=M)
    run = SweepRun(config, tmp_path / "sweep", seed=1, host=NO_DRIVER)
    run.files.write()
    cell = Cell("cpu-only", 64 * K, threads, jobs=2, batch=4, requests_per_job=requests_per_job)
    reader = PosixReader(loop=loop)
    with run.files.open_tree() as tree:
        reader.open(tree, run.files.paths, read_shape(cell))
    return run, cell, reader


def run_cell_bounded(reader, cell: Cell, timeout_s: float = 60) -> tuple[bool, list[BaseException]]:
    """Runs one cell in a thread: (whether it still runs after `timeout_s`, what it raised)."""
    outcome: list[BaseException] = []

    def drive():
        try:
            run_cell(reader, cell, [0, 0], M)
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=drive)
    worker.start()
    worker.join(timeout=timeout_s)
    return worker.is_alive(), outcome


@pytest.mark.parametrize(
    ("refuse", "short", "message"), [(2 * 64 * K, -1, "could not submit"), (-1, 64 * K, "read 32768")]
)
def test_a_failing_read_fails_the_cell_and_the_other_jobs_finish(tmp_path, refuse, short, message):
    run, cell, inner = opened_posix_cell(tmp_path, threads=1, requests_per_job=8)
    failing = Failing(inner, cell.slots, refuse, short)
    hung, outcome = run_cell_bounded(failing, cell)
    inner.close()
    run.close()
    assert not hung, "the cell hung after a failed read"
    assert len(outcome) == 1 and isinstance(outcome[0], ReadError) and message in str(outcome[0])
    assert failing.in_flight == 0  # every read that started was collected


KVIKIO_CHILD = (
    stand_in.PRELOAD
    + """
import json, sys
from pathlib import Path
from ckptqual.host import gpu
from ckptqual.runs.sweep.driver import SweepRun
from ckptqual.runs.sweep.cells import SweepConfig, plan_cells

host = gpu.probe()
config = SweepConfig(block_sizes_bytes=(1 << 20, 8192), threads=(4, 1), jobs=2, batch=4, file_bytes=4 << 20,
                     transfers=("cpu-only",), requests=64)
run = SweepRun(config, Path(sys.argv[1]), seed=3, host=host, verify="all")
run.files.write()
cached = []
for cell in plan_cells(config):
    for path in run.files.paths:
        path.read_bytes()
    cached.append(run.files.cached_fraction())
    run.measure(cell)
run.close()
problems = {transfer: host.problem(transfer) for transfer in ("gpu-direct", "cpu-gpu", "cpu-only")}
print(json.dumps({"host": host.to_dict(), "problems": problems, "cells": run.data["cells"], "warmed": cached}))
"""
)


def test_kvikio_host_path_reads_cold_data_through_the_stand_in(slow_target, libcuda_stand_in):
    """On the slow stand-in drive, which no other process's I/O reaches: no cell can be INVALID for it."""
    env = os.environ | {"CKPTQUAL_TEST_LIBCUDA": str(libcuda_stand_in)}
    child = subprocess.run(
        [sys.executable, "-c", KVIKIO_CHILD, str(slow_target / "sweep")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout.strip().splitlines()[-1])
    host = out["host"]
    assert host["driver_version"] == 12090 and host["driver_problem"] is None
    assert host["cpu_only_engine"] == "kvikio"
    assert "cuInit returned CUDA_ERROR_NO_DEVICE (100)" in out["problems"]["gpu-direct"]
    assert "cuInit returned CUDA_ERROR_NO_DEVICE (100)" in out["problems"]["cpu-gpu"]
    assert out["problems"]["cpu-only"] is None
    assert min(out["warmed"]) > 0.9
    assert len(out["cells"]) == 4
    for cell in out["cells"]:
        settings = cell["settings"]
        assert cell["engine"] == settings["engine"] == "kvikio"
        assert settings["compat_mode"] == "ON" and settings["memory"] == "host"
        assert settings["threads"] == cell["threads"] and settings["task_size"] == cell["block_bytes"]
        assert settings["auto_direct_io_read"] is True
        assert cell["cached_fraction_before"] <= 0.01
        if settings["direct_io"]:
            assert cell["cached_fraction_after"] == 0.0
        assert cell["bytes"] == cell["planned_bytes"]
        assert cell["verified_requests"] == cell["requests"] == 2 * cell["requests_per_job"]
        assert cell["outcome"] == "MEASURED"
    assert not (slow_target / "sweep").exists()


DEVICE_CHILD = (
    stand_in.PRELOAD
    + """
import json, mmap, sys
from pathlib import Path
import numpy as np
from ckptqual.host import gpu


class HostPosingAsDevice:
    # Page-aligned host memory handed over as CUDA memory; the stand-in driver calls it host memory, so KvikIO
    # runs its device-memory code paths (the CUDA array interface, per-slot views, host copies) on the CPU.
    def __init__(self, nbytes, device=0):
        self.nbytes, self._map = nbytes, mmap.mmap(-1, nbytes)
        self._array = np.frombuffer(self._map, dtype=np.uint8)

    def view(self, offset, nbytes):
        return gpu._DeviceView(self._array.ctypes.data + offset, nbytes)

    def to_host(self, offset, nbytes):
        return self._array[offset : offset + nbytes].copy()

    def close(self):
        pass


gpu.DeviceMemory = HostPosingAsDevice
from ckptqual.runs.sweep.driver import SweepRun
from ckptqual.runs.sweep.cells import SweepConfig, plan_cells

host = gpu.HostGpu(driver_version=12090, gpu_count=1, kvikio_version="test")  # what a GPU host would report
config = SweepConfig(block_sizes_bytes=(1 << 20, 64 << 10), threads=(4,), jobs=2, batch=4, file_bytes=4 << 20,
                     transfers=(sys.argv[2],), requests=16)
run = SweepRun(config, Path(sys.argv[1]), seed=3, host=host, verify="all")
out = {"cells": [], "error": None}
try:
    for cell in plan_cells(config):
        run.measure(cell)
except RuntimeError as error:
    out["error"] = str(error)
run.close()
out["cells"] = run.data["cells"]
print(json.dumps(out))
"""
)


def device_child(tmp_path: Path, target: Path, stand_in_library: Path, transfer: str) -> dict:
    """The sweep's files on `target` (the slow stand-in drive, which no other process's I/O reaches)."""
    env = os.environ | {"CKPTQUAL_TEST_LIBCUDA": str(stand_in_library), "CUFILE_LOGFILE_PATH": str(tmp_path / "log")}
    command = [sys.executable, "-c", DEVICE_CHILD, str(target / "sweep"), transfer]
    child = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_cpu_gpu_reads_into_device_buffers_through_bounce_buffers(tmp_path, slow_target, libcuda_stand_in):
    out = device_child(tmp_path, slow_target, libcuda_stand_in, "cpu-gpu")
    assert out["error"] is None
    for cell in out["cells"]:
        settings = cell["settings"]
        assert settings["memory"] == "device" and settings["compat_mode"] == "ON"
        assert settings["task_size"] == cell["block_bytes"] and settings["bounce_buffer_size"] > 0
        assert cell["verified_requests"] == cell["requests"] == 2 * cell["requests_per_job"]
        assert cell["outcome"] == "MEASURED"


def test_gpu_direct_never_falls_back_to_posix_silently(tmp_path, slow_target, libcuda_stand_in):
    """Where cuFile cannot run (here: no nvidia-fs, no GPU), gpu-direct fails; it never measures POSIX reads."""
    out = device_child(tmp_path, slow_target, libcuda_stand_in, "gpu-direct")
    assert out["error"].startswith("gpu-direct: KvikIO cannot read sweep-job000.bin with cuFile (compat mode is off")
    (cell,) = out["cells"]
    assert cell["outcome"] == "ERROR" and "GiBps" not in cell


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"compat_mode_preferred": True}, "KvikIO ran in compat mode"),
        ({"compat_mode_preferred": False, "gds_available": False}, "cuFile reports GDS unavailable"),
        (
            {"compat_mode_preferred": False, "gds_available": True, "cufile_allow_compat_mode": True},
            'set "allow_compat_mode": false in the cufile.json named by CUFILE_ENV_PATH_JSON',
        ),
        ({"compat_mode_preferred": False, "gds_available": True, "cufile_allow_compat_mode": False}, None),
    ],
)
def test_a_gpu_direct_result_counts_only_without_any_posix_fallback(settings, reason):
    pytest.importorskip("kvikio", reason=KVIKIO_MISSING)
    from ckptqual.io.readers.kvikio_reader import KvikioReader

    reader = KvikioReader("gpu-direct")
    reader._settings = settings
    found = reader.invalid_reason()
    assert found is None if reason is None else reason in found
    assert KvikioReader("cpu-gpu").invalid_reason() is None


TEST_DRIVE = """
[drive]
name = "test drive"

[sweep]
jobs = 2
batch = 4
file_bytes = 8_388_608
transfers = ["cpu-only"]

[[limit]]
name = "sweep_read_bandwidth"
min = 0.001
unit = "ratio"
relative_to = "raw_read"
where = { transfer = "cpu-only", block_size = "1M", threads = 1 }
source = "test: any cold read from a disk reaches a thousandth of its raw sequential read"

[[limit]]
name = "sweep_read_bandwidth"
min = 1000.0
unit = "GiB/s"
where = { transfer = "cpu-only", block_size = "1M", threads = 16 }
source = "test: no disk here reads 1000 GiB/s"
"""


def test_a_gpu_transfer_without_a_gpu_is_skipped_with_its_reason(tmp_path, libcuda_stand_in):
    """A child qualification run: the driver library is there (the stand-in) but no GPU, so gpu-direct is skipped
    with the reason and cpu-only runs on KvikIO's host path, judged by the drive file's limits (one met, one that
    no disk meets); results JSON, JUnit and the summary say so."""
    drive = tmp_path / "test-drive.toml"
    drive.write_text(TEST_DRIVE)
    results, junit = tmp_path / "results.json", tmp_path / "junit.xml"
    env = os.environ | {"LD_LIBRARY_PATH": f"{libcuda_stand_in.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    command = [
        *(sys.executable, "-m", "pytest", "tests_qual/test_read_sweep.py", "-p", "no:cacheprovider", "-rfs"),
        *("--drive", str(drive), "--passes", "1", "--checkpoints-per-pass", "1", "--scale", "0.00005"),
        *("--transfer", "gpu-direct,cpu-only", "--sweep-block-sizes", "1M", "--sweep-threads", "16,1"),
        *("--benchmark-disable", "--results", str(results), "--junitxml", str(junit)),
    ]
    child = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == pytest.ExitCode.TESTS_FAILED, child.stdout[-4000:] + child.stderr[-2000:]
    assert "2 failed, 1 passed, 2 skipped" in child.stdout  # the cell below its limit, and the verdict
    assert "sweep_read_bandwidth " in child.stdout and " GiB/s < min 1000 GiB/s (transfer=cpu-only" in child.stdout
    summary = child.stdout[child.stdout.index("ckptqual read sweep") :]
    assert "gpu-direct: skipped: gpu-direct needs a GPU and KvikIO: no usable GPU: cuInit returned" in summary
    assert "cpu-only: KvikIO's host path" in summary
    row = next(line.split() for line in summary.splitlines() if line.strip().startswith("1M "))
    assert row[2] in ("F", "INVALID") and len(row) == 4  # 1M: GiB/s at 16 threads, F (or INVALID), GiB/s at 1 thread

    sweep = json.loads(results.read_text())["sweep"]
    assert sweep["files"]["removed"] is True
    assert (sweep["config"]["jobs"], sweep["config"]["sources"]["jobs"]) == (2, str(drive))
    cells = {cell["id"]: cell for cell in sweep["cells"]}
    for skipped in (cells["gpu-direct-1M-16"], cells["gpu-direct-1M-1"]):
        assert skipped["outcome"] == "SKIPPED" and "CUDA_ERROR_NO_DEVICE" in skipped["reason"]
    missed, met = cells["cpu-only-1M-16"], cells["cpu-only-1M-1"]
    assert missed_limit(missed["outcome"], json.dumps(missed)) and met["outcome"] == "PASS"
    for threads in (16, 1):
        measured = cells[f"cpu-only-1M-{threads}"]
        assert measured["engine"] == "kvikio" and measured["cached_fraction_before"] <= 0.01

    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    skip = cases["test_read_sweep[gpu-direct-1M-1]"].find("skipped")
    assert skip is not None and "cuInit returned CUDA_ERROR_NO_DEVICE" in skip.get("message")
    properties = {p.get("name"): p.get("value") for p in cases["test_read_sweep[cpu-only-1M-1]"].iter("property")}
    assert properties["sweep.engine"] == "kvikio"
    assert properties["sweep_read_bandwidth.outcome"] == "PASS"
    assert properties["sweep_read_bandwidth.limit"] == ">= 0.001 of raw_read"
    failure = cases["test_read_sweep[cpu-only-1M-16]"].find("failure")
    assert failure is not None and "< min 1000 GiB/s" in failure.get("message")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--sweep-threads", "0"], "ERROR: --sweep-threads '0': item 1: must be a whole number from 1 to 4096"),
        (
            ["--transfer", "gpu"],
            "ERROR: --transfer 'gpu': item 1: unknown transfer; use one of gpu-direct, cpu-gpu, cpu-only",
        ),
        (["--sweep-file-bytes", "64K"], "ERROR: sweep file size 64K (command line) is smaller than the largest block"),
    ],
)
def test_a_bad_sweep_option_is_a_usage_error_before_any_io(suite_in_process, options, message):
    """In process (pytester): the suite's answer to the option."""
    done = suite_in_process(*options, "--collect-only", "-q", tests=("test_read_sweep.py",))
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in [*done.outlines, *done.errlines] if line.startswith("ERROR:")]
    assert len(errors) == 1 and errors[0].startswith(message)


class PreadSpy:
    """Wraps os.preadv (the real read still runs) to watch the POSIX engine's Python cell loop: reads in flight in
    all, per job by batch, and a job's next batch starting before its last one ended. (The native loop's preads
    never pass through os.preadv: tests/test_native_reads.py checks it from each read's own times.)"""

    def __init__(self, paths: list[Path], block: int, slots: int, fail: tuple[int, int, str] | None = None) -> None:
        self.inodes = {os.stat(path).st_ino: job for job, path in enumerate(paths)}
        self.block, self.slots, self.fail = block, slots, fail
        self.real = os.preadv
        self.lock = threading.Lock()
        self.in_flight = self.peak = 0
        self.batches: dict[int, set[int]] = {}  # per job: batches with a read in flight
        self.early: list[str] = []

    def __call__(self, fd, buffers, offset):
        job = self.inodes[os.fstat(fd).st_ino]
        batch = offset // self.block // self.slots
        with self.lock:
            if any(other != batch for other in self.batches.setdefault(job, set())):
                self.early.append(f"job {job} read batch {batch} while {sorted(self.batches[job])} was in flight")
            self.batches[job].add(batch)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            if self.fail is not None and (job, offset) == self.fail[:2]:
                if self.fail[2] == "error":
                    raise OSError(5, "Input/output error (test)")
                return 0
            return self.real(fd, buffers, offset)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.batches[job].discard(batch)  # one batch per job in flight, as checked above


@pytest.mark.parametrize(("threads", "jobs", "batch"), [(1, 3, 4), (3, 2, 4), (16, 2, 2), (16, 4, 16)])
def test_the_engines_python_loop_keeps_depth_batches_and_checks_every_block(
    tmp_path, monkeypatch, threads, jobs, batch
):
    config = SweepConfig(block_sizes_bytes=(64 * K,), threads=(threads,), jobs=jobs, batch=batch, file_bytes=M)
    run = SweepRun(config, tmp_path / "sweep", seed=1, host=NO_DRIVER)
    run.files.write()
    cell = Cell("cpu-only", 64 * K, threads, jobs, batch, requests_per_job=16)
    reader = PosixReader(loop="python")
    with run.files.open_tree() as tree:
        reader.open(tree, run.files.paths, read_shape(cell))
    spy = PreadSpy(run.files.paths, 64 * K, cell.slots)
    monkeypatch.setattr(os, "preadv", spy)
    try:
        done = run_cell(reader, cell, [0] * jobs, M, check_block=run.files.check)
    finally:
        monkeypatch.undo()
        reader.close()
        run.close()
    assert 1 <= spy.peak <= min(threads, jobs * cell.slots) and spy.early == []  # the spy saw the reads
    assert done.bytes == jobs * M and done.verified_requests == jobs * 16
    assert done.next_starts == [0] * jobs  # a whole file read: the next cell starts over
    assert len(done.latencies_ns) == jobs * 16 and (done.latencies_ns > 0).all()
    assert reader.settings()["workers"].startswith("psync (Python threads)")


@pytest.mark.parametrize(("kind", "message"), [("error", "Input/output error (test)"), ("short", "read 0 of 65536")])
def test_a_failing_read_in_the_engines_python_loop_fails_the_cell_without_a_hang(tmp_path, monkeypatch, kind, message):
    run, cell, reader = opened_posix_cell(tmp_path, threads=4, requests_per_job=12, loop="python")
    monkeypatch.setattr(os, "preadv", PreadSpy(run.files.paths, 64 * K, cell.slots, fail=(1, 5 * 64 * K, kind)))
    hung, outcome = run_cell_bounded(reader, cell)
    monkeypatch.undo()
    reader.close()
    run.close()
    assert not hung, "the cell hung after a failed read"
    assert len(outcome) == 1 and isinstance(outcome[0], ReadError)
    assert str(outcome[0]).startswith(f"job 1 offset {5 * 64 * K}: ") and message in str(outcome[0])
