"""The read sweep's planning and arithmetic: its options and their errors, cells, offsets, GiB/s, IOPS, latency."""

import numpy as np
import pytest

from ckptqual.config.drive_file import load_drive_file
from ckptqual.config.run_settings import SettingsError, SweepConfig, resolve_settings
from ckptqual.config.table import setting
from ckptqual.host.gpu import HostGpu
from ckptqual.io.readers import TRANSFERS
from ckptqual.limits.judgement import judge
from ckptqual.report.sweep_table import matrix
from ckptqual.report.sweep_table import sweep_lines as summary_lines
from ckptqual.runs.sweep.cells import (
    Cell,
    cell_stats,
    job_offsets,
    next_start,
    percentile,
    plan_cells,
    requests_per_job,
)
from ckptqual.runs.sweep.driver import SweepRun

K, M = 1 << 10, 1 << 20


def option(name: str, text: str) -> object:
    return setting(name).from_command_line(text)


def test_options_parse_lists():
    assert option("sweep_block_sizes_bytes", "1M,128K, 8K") == (M, 128 * K, 8 * K)
    assert option("sweep_block_sizes_bytes", "4096") == (4096,)
    assert option("sweep_threads", "128,16,1") == (128, 16, 1)
    assert option("sweep_transfers", "gpu-direct,cpu-only") == ("gpu-direct", "cpu-only")
    assert option("sweep_file_bytes", "256M") == 256 * M
    assert option("sweep_requests", "64") == 64


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("sweep_threads", "0", r"^--sweep-threads '0': item 1: must be a whole number from 1 to 4096$"),
        ("sweep_threads", "4,-1", r"'4,-1': item 2: must be a whole number from 1 to 4096"),
        ("sweep_threads", "four", r"'four': item 1: must be a whole number"),
        ("sweep_threads", "4,4", r"lists a value twice; list each once"),
        ("sweep_threads", "4,,1", r"'4,,1': item 2: must be a whole number"),
        (
            "sweep_block_sizes_bytes",
            "3X",
            r"^--sweep-block-sizes '3X': item 1: must be a size in bytes, a multiple of 4K, written like 1048576 or",
        ),
        ("sweep_block_sizes_bytes", "6K", r"'6K': item 1: must be a size in bytes, a multiple of 4K"),
        ("sweep_block_sizes_bytes", "1M,1024K", r"lists a value twice"),
        ("sweep_transfers", "gpu", r"^--transfer 'gpu': item 1: unknown transfer; use one of gpu-direct, cpu-gpu, "),
        ("sweep_file_bytes", "lots", r"--sweep-file-bytes 'lots': must be a size in bytes"),
        ("sweep_file_bytes", "5000", r"must be a size in bytes, a multiple of 4K"),
        ("sweep_requests", "0", r"--sweep-requests '0': must be a whole number >= 1"),
    ],
)
def test_bad_options_name_the_value_and_the_fix(name, text, expected):
    with pytest.raises(SettingsError, match=expected) as raised:
        option(name, text)
    assert "\n" not in str(raised.value)


def test_command_line_over_drive_file_over_defaults(tmp_path):
    drive = tmp_path / "x.toml"
    drive.write_text('[drive]\nname = "x"\n[sweep]\nblock_sizes = ["1M", "8K"]\nthreads = [8, 1]\njobs = 2\nbatch = 4\n'
                     "file_bytes = 67108864\n")  # fmt: skip
    config = resolve_settings({"drive": str(drive), "sweep_threads": "2", "sweep_transfers": "cpu-only"}).sweep
    assert config.block_sizes_bytes == (M, 8 * K)
    assert config.threads == (2,)
    assert (config.jobs, config.batch, config.file_bytes) == (2, 4, 64 * M)
    assert config.transfers == ("cpu-only",)
    assert config.requests == 2048
    assert config.sources["threads"] == "command line"
    assert config.sources["jobs"] == str(drive)
    assert config.sources["requests"] == "default"
    assert SweepConfig().transfers == TRANSFERS


def test_packaged_drive_files_resolve_to_the_documented_matrices():
    local = resolve_settings({"drive": "local"}).sweep
    assert (local.block_sizes_bytes, local.threads, local.jobs, local.batch) == ((M, 128 * K, 8 * K), (16, 4, 1), 4, 16)
    assert local.files_bytes == 4 * 256 * M
    review = resolve_settings({"drive": "d5-p5336"}).sweep
    assert len(plan_cells(review)) == 5 * 7 * len(review.transfers)
    assert (review.jobs, review.batch) == (16, 16)


def test_settings_that_do_not_fit_together_are_refused(tmp_path):
    with pytest.raises(SettingsError, match=r"file size 64K \(command line\) is smaller than the largest block 1M"):
        resolve_settings({"sweep_block_sizes_bytes": "1M", "sweep_file_bytes": "64K"})
    drive = tmp_path / "x.toml"
    drive.write_text('[drive]\nname = "x"\n[sweep]\nblock_sizes = ["6K"]\n')
    with pytest.raises(
        SettingsError,
        match=r"x\.toml: sweep\.block_sizes = \['6K'\]: item 1: must be a size in bytes, a multiple of 4K",
    ):
        resolve_settings({"drive": str(drive)})


def test_cells_in_order_with_ids_free_of_the_drive():
    config = SweepConfig(block_sizes_bytes=(M, 8 * K), threads=(16, 1), transfers=("gpu-direct", "cpu-only"))
    cells = plan_cells(config)
    assert [cell.id for cell in cells] == [
        "gpu-direct-1M-16",
        "gpu-direct-1M-1",
        "gpu-direct-8K-16",
        "gpu-direct-8K-1",
        "cpu-only-1M-16",
        "cpu-only-1M-1",
        "cpu-only-8K-16",
        "cpu-only-8K-1",
    ]
    assert cells[0].context() == {"transfer": "gpu-direct", "block_size": "1M", "threads": 16}


def test_a_cell_reads_at_most_its_requests_and_never_more_than_the_file():
    config = SweepConfig(file_bytes=256 * M, requests=2048, jobs=4)
    assert requests_per_job(config, M) == 256  # the whole file
    assert requests_per_job(config, 8 * K) == 2048  # 16 MiB of the file
    assert requests_per_job(SweepConfig(file_bytes=M, requests=10), M) == 1
    cell = Cell("cpu-only", 8 * K, 1, jobs=4, batch=16, requests_per_job=2048)
    assert (cell.bytes_per_job, cell.total_bytes) == (16 * M, 64 * M)


@pytest.mark.parametrize(
    ("threads", "jobs", "batch", "requests", "depth", "slots"),
    [(128, 16, 16, 2048, 128, 16), (16, 4, 16, 2048, 16, 16), (64, 2, 16, 2048, 32, 16), (8, 4, 16, 3, 8, 3)],
)
def test_depth_is_threads_unless_the_jobs_batches_hold_fewer(threads, jobs, batch, requests, depth, slots):
    cell = Cell("cpu-only", M, threads, jobs, batch, requests)
    assert (cell.depth, cell.slots) == (depth, slots)


def test_offsets_run_sequentially_and_wrap_at_the_end_of_the_file():
    assert job_offsets(0, 4, M, 4 * M) == [0, M, 2 * M, 3 * M]
    assert job_offsets(3 * M, 3, M, 4 * M) == [3 * M, 0, M]
    assert job_offsets(0, 3, 3 * M, 4 * M) == [0, 0, 0]  # a block that does not fit starts over
    assert next_start([2 * M, 3 * M], M, 4 * M) == 0
    assert next_start([0, M], M, 4 * M) == 2 * M
    assert next_start([], M, 4 * M) == 0
    with pytest.raises(ValueError, match="larger than the file"):
        job_offsets(0, 1, 2 * M, M)


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([5.0], 99) == 5.0
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(1, 1001)), 99) == 990
    with pytest.raises(ValueError, match="no values"):
        percentile([], 99)


def test_cell_stats_arithmetic():
    latencies_ns = np.array([100_000] * 99 + [1_000_000])  # 99 reads of 100 us, one of 1 ms
    stats = cell_stats(bytes_read=100 * M, seconds=0.5, latencies_ns=latencies_ns)
    assert stats.GiBps == pytest.approx(100 / 1024 / 0.5)
    assert stats.GBps == pytest.approx(100 * M / 1e9 / 0.5)
    assert stats.iops == pytest.approx(200.0)
    assert stats.mean_latency_us == pytest.approx((99 * 100 + 1000) / 100)
    assert stats.p99_latency_us == pytest.approx(100.0)
    assert stats.max_latency_us == pytest.approx(1000.0)
    assert stats.to_dict()["requests"] == 100
    with pytest.raises(ValueError, match="> 0 seconds"):
        cell_stats(1, 0.0, [1])
    with pytest.raises(ValueError, match="without requests"):
        cell_stats(1, 1.0, [])


def test_matrix_puts_block_sizes_down_and_threads_across():
    cells = [
        {"transfer": "cpu-only", "block_size": "1M", "threads": 16, "GiBps": 1.5, "outcome": "PASS"},
        {"transfer": "cpu-only", "block_size": "1M", "threads": 1, "GiBps": 0.5, "outcome": "FAIL"},
        {"transfer": "cpu-only", "block_size": "8K", "threads": 16, "GiBps": 0.25, "outcome": "INVALID"},
        {"transfer": "cpu-only", "block_size": "8K", "threads": 1, "outcome": "ERROR"},
        {"transfer": "gpu-direct", "block_size": "1M", "threads": 16, "outcome": "SKIPPED"},
    ]
    headers, rows = matrix(cells, "cpu-only")
    assert headers == ["block \\ threads", "16", "1"]
    assert rows == [["1M", "1.50", "0.50 F"], ["8K", "0.25 INVALID", "error"]]
    assert matrix(cells, "gpu-direct")[1] == [["1M", "skip"]]


def test_summary_shows_a_table_per_transfer_and_the_reason_for_a_skipped_one():
    data = {
        "config": SweepConfig(transfers=("gpu-direct", "cpu-only")).to_dict(),
        "engines": {"gpu-direct": "skipped: no GPU", "cpu-only": "ckptqual's POSIX engine"},
        "cells": [
            {"transfer": "gpu-direct", "block_size": "1M", "threads": 16, "outcome": "SKIPPED"},
            {
                "transfer": "cpu-only",
                "block_size": "1M",
                "threads": 16,
                "GiBps": 1.25,
                "outcome": "PASS",
                "settings": {"direct_io": True},
            },
        ],
    }
    lines = summary_lines(data)
    assert "gpu-direct: skipped: no GPU" in lines
    assert "cpu-only: ckptqual's POSIX engine, O_DIRECT" in lines
    assert lines[-1].split() == ["1M", "1.25"]


def test_what_a_host_can_run():
    none = HostGpu(driver_problem="no CUDA driver library (libcuda.so.1: cannot open)")
    assert none.problem("cpu-only") is None
    assert (
        none.problem("cpu-gpu") == "cpu-gpu needs a GPU and KvikIO: no CUDA driver library (libcuda.so.1: cannot open)"
    )
    assert none.problem("gpu-direct").startswith("gpu-direct needs a GPU and KvikIO: no CUDA driver")
    assert none.cpu_only_engine == "posix"
    driver_only = HostGpu(driver_version=12090, gpu_problem="no usable GPU: cuInit returned CUDA_ERROR_NO_DEVICE (100)")
    assert driver_only.cpu_only_engine == "kvikio"
    assert "CUDA_ERROR_NO_DEVICE" in driver_only.problem("gpu-direct")
    no_gds = HostGpu(driver_version=12090, gpu_count=1, gds_problem="cuFile reports GDS unavailable")
    assert no_gds.problem("cpu-gpu") is None
    assert no_gds.problem("gpu-direct") is None  # a GPU host without GDS runs the cell, as INVALID: never skipped
    assert no_gds.invalid("gpu-direct") == "gpu-direct needs GPUDirect Storage: cuFile reports GDS unavailable"
    assert no_gds.invalid("cpu-gpu") is None
    assert none.invalid("gpu-direct") is None  # no GPU at all: skipped, not INVALID
    assert HostGpu(driver_version=12090, gpu_count=1).problem("gpu-direct") is None
    assert HostGpu(driver_version=12090, gpu_count=1).invalid("gpu-direct") is None
    no_kvikio = HostGpu(driver_version=12090, gpu_count=1, kvikio_problem="KvikIO cannot be imported")
    assert no_kvikio.cpu_only_engine == "posix"
    assert "KvikIO cannot be imported" in no_kvikio.problem("cpu-gpu")


def test_sweep_bandwidth_in_GiBps_is_judged_right_against_relative_and_absolute_limits():
    """The sweep reports GiB/s; a relative limit converts it before dividing by the raw_read baseline (B/s)."""
    local = load_drive_file("local")
    context = {"transfer": "cpu-only", "block_size": "1M", "threads": 16}
    baselines = {"raw_read": 1e9, "raw_write": 1e9}
    (relative,) = judge(local.limits, "sweep_read_bandwidth", 0.3, "GiB/s", context, baselines)
    assert relative.verdict.measured == pytest.approx(0.3 * 2**30 / 1e9)
    assert relative.outcome == "PASS"
    (low,) = judge(local.limits, "sweep_read_bandwidth", 0.09, "GiB/s", context, baselines)
    assert low.outcome == "FAIL"  # 0.0966 of raw_read < 0.1
    (unjudged,) = judge(local.limits, "sweep_read_bandwidth", 0.01, "GiB/s", context | {"block_size": "8K"}, {})
    assert unjudged.outcome == "MEASURED"
    review = load_drive_file("d5-p5336")
    cell = {"transfer": "gpu-direct", "block_size": "1M", "threads": 128}
    (absolute,) = judge(review.limits, "sweep_read_bandwidth", 3.79, "GiB/s", cell, {})
    assert absolute.verdict.measured == pytest.approx(3.79)
    assert absolute.outcome == "PASS"
    (below,) = judge(review.limits, "sweep_read_bandwidth", 3.77, "GiB/s", cell, {})
    assert below.outcome == "FAIL"


def test_gpu_direct_on_a_gpu_host_without_gds_is_invalid_unread_and_says_why(tmp_path):
    """A GPU host without GPUDirect Storage could only read gpu-direct cells through POSIX bounce buffers: each is
    recorded INVALID with the reason, nothing is read for it, and the engines line says so; cpu-gpu still runs."""
    host = HostGpu(driver_version=13000, gpu_count=1, kvikio_version="26.10", gds_problem="nvidia-fs not loaded")
    config = SweepConfig(block_sizes_bytes=(1 << 20,), threads=(4,), transfers=("gpu-direct", "cpu-gpu"))
    run = SweepRun(config, tmp_path / "sweep", seed=1, host=host)
    try:
        direct, via_host = plan_cells(config)
        assert run.cannot_run(direct) is None and run.cannot_run(via_host) is None
        assert run.cannot_measure(via_host) is None
        assert run.cannot_measure(direct) == "gpu-direct needs GPUDirect Storage: nvidia-fs not loaded"
        (cell,) = run.data["cells"]
        assert (cell["transfer"], cell["outcome"]) == ("gpu-direct", "INVALID")
        assert cell["invalid_reason"] == "gpu-direct needs GPUDirect Storage: nvidia-fs not loaded"
        assert run.data["engines"]["gpu-direct"] == "INVALID: gpu-direct needs GPUDirect Storage: nvidia-fs not loaded"
        assert not (tmp_path / "sweep").exists() or not any((tmp_path / "sweep").iterdir())  # nothing was written
    finally:
        run.close()
