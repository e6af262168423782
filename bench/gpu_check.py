"""The Python steps of bench/gpu_check.sh: what the host's GPU and GDS report, a verified restore into GPU memory,
and KvikIO's own reads of sweep-like files as the reference. Each step prints one table (markdown) or one
`SKIP <step>: <reason>` line, and exits 0 either way; a wrong byte or a failed read exits 1.

    python bench/gpu_check.py status
    python bench/gpu_check.py restore --dir /mnt/nvme0/gpu-check
    python bench/gpu_check.py reference --dir /mnt/nvme0/gpu-check --file-bytes 64M --jobs 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from benchutil import drop_caches

from ckptqual.host import gpu
from ckptqual.io.engines.base import RankIO
from ckptqual.io.engines.stream import StreamEngine
from ckptqual.io.engines.torchread.stored import read_table
from ckptqual.io.payload import PayloadGenerator
from ckptqual.limits.units import parse_size
from ckptqual.plan.workloads import load_workload
from ckptqual.runs.sweep.files import SweepFiles

SEED = 7


def gpu_problem() -> str | None:
    """Why this host cannot put data into GPU memory with torch and KvikIO (None: it can)."""
    try:
        import torch
    except ImportError as error:
        return f"torch cannot be imported ({error})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return gpu.probe().problem("cpu-gpu")


def status(_: argparse.Namespace) -> int:
    """What the probe, cuFile and the kernel say about the GPU and GDS; the JSON line is for the tables."""
    host = gpu.probe()
    found: dict[str, Any] = host.to_dict() | {"nvidia_fs_loaded": gpu.nvidia_fs_loaded()}
    found["transfer_problems"] = {
        name: host.problem(name) or host.invalid(name) for name in ("gpu-direct", "cpu-gpu", "cpu-only")
    }
    print(f"GPU: {host.gpu_name or 'none'} ({host.gpu_count} found); CUDA driver {host.driver_version or '-'}")
    print(f"KvikIO {host.kvikio_version or '-'}, cuFile {host.cufile_version or '-'}")
    print(f"nvidia-fs: {'loaded' if found['nvidia_fs_loaded'] else 'not loaded (no /proc/driver/nvidia-fs/stats)'}")
    print(f"GDS: {host.gds_problem or 'available'}; cuFile allow_compat_mode: {host.cufile_allow_compat_mode}")
    for name, problem in found["transfer_problems"].items():
        print(f"  {name}: {problem or 'can run'}")
    print("STATUS " + json.dumps(found))
    return 0


def _checkpoint(directory: Path, scale: float) -> tuple[list[Path], list[Any], RankIO]:
    """Rank 0's files of the review's workload at `scale`, written by the `stream` engine."""
    plan = load_workload("llama3.1-405b-review").plan().scaled(scale)
    rank = plan.ranks[0]
    io = RankIO(PayloadGenerator(SEED), rank=0)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, spec in enumerate(rank.files):
        path = directory / Path(spec.path).name
        StreamEngine().write(path, spec, index, io)
        paths.append(path)
    os.sync()
    return paths, list(rank.files), io


def _check(io: RankIO, label: str, file_index: int, tensor_index: int, data: np.ndarray) -> None:
    bad = io.verify(data, file_index, tensor_index, 0)
    if bad:
        raise SystemExit(f"restore into GPU memory: {label} tensor {tensor_index} holds {bad[0].found}")


def restore(args: argparse.Namespace) -> int:
    """A cold restore of rank 0's `stream` files into GPU memory two ways, every tensor checked on the host after."""
    problem = gpu_problem()
    if problem:
        print(f"SKIP gpu restore: {problem}")
        return 0
    import kvikio
    import torch

    paths, specs, io = _checkpoint(Path(args.dir) / "restore", args.scale)
    total = sum(path.stat().st_size for path in paths)
    rows = []
    how = drop_caches(paths)
    start = time.perf_counter()
    loaded = [torch.load(path, map_location="cuda", weights_only=True) for path in paths]
    torch.cuda.synchronize()
    rows.append(("torch.load(map_location='cuda')", time.perf_counter() - start))
    for index, (state, spec) in enumerate(zip(loaded, specs, strict=True)):
        for number, tensor in enumerate(spec.tensors):
            _check(io, paths[index].name, index, number, state[tensor.name].view(torch.uint8).cpu().numpy())
    del loaded
    how = drop_caches(paths)
    start = time.perf_counter()
    buffers = []
    for path in paths:
        with kvikio.CuFile(path, "r") as file:
            futures = []
            for stored in read_table(path):
                buffer = torch.empty(stored.nbytes, dtype=torch.uint8, device="cuda")
                if stored.nbytes:
                    futures.append(file.pread(buffer, stored.nbytes, stored.data_offset))
                buffers.append(buffer)
            for future in futures:
                future.get()
    torch.cuda.synchronize()
    mode = kvikio.CompatMode(kvikio.defaults.get("compat_mode")).name
    rows.append((f"KvikIO CuFile.pread into torch CUDA tensors (compat {mode})", time.perf_counter() - start))
    position = 0
    for index, spec in enumerate(specs):
        for number in range(len(spec.tensors)):
            _check(io, paths[index].name, index, number, buffers[position].cpu().numpy())
            position += 1
    print(f"restore into GPU memory: rank 0 of llama3.1-405b-review at scale {args.scale:g}, {len(paths)} stream")
    print(f"files, {total / 1e9:.3f} GB, cold ({how}), every tensor verified on the host afterwards\n")
    print("| path | seconds | GB/s |\n|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} | {total / seconds / 1e9:.2f} |")
    shutil.rmtree(Path(args.dir) / "restore")
    return 0


def reference(args: argparse.Namespace) -> int:
    """KvikIO's own whole-file reads (its thread pool, its default task size) of sweep files, cold, per memory."""
    problem = gpu_problem()
    if problem:
        print(f"SKIP kvikio reference: {problem}")
        return 0
    import kvikio
    import kvikio.defaults
    import torch

    files = SweepFiles(Path(args.dir) / "reference", args.jobs, parse_size(args.file_bytes), SEED)
    files.write()
    host = gpu.probe()
    modes = [("cpu-gpu (compat ON)", kvikio.CompatMode.ON, "cuda")]
    if host.problem("gpu-direct") is None:
        modes.insert(0, ("gpu-direct (compat OFF)", kvikio.CompatMode.OFF, "cuda"))
    modes.append(("host memory (compat ON)", kvikio.CompatMode.ON, "cpu"))
    print(f"KvikIO {kvikio.__version__} reads {args.jobs} files of {args.file_bytes} (ckptqual's sweep files, payload")
    print(f"checked after), one pread per file, {args.threads} threads, task size {kvikio.defaults.get('task_size')}\n")
    print("| memory | GiB/s | cached before |\n|---|---|---|")
    try:
        for name, mode, device in modes:
            with kvikio.defaults.set({"compat_mode": mode, "num_threads": args.threads}):
                buffers = [_buffer(torch, files.file_bytes, device) for _ in files.paths]
                drop_caches(files.paths)
                cached = files.cached_fraction()
                opened = [kvikio.CuFile(path, "r") for path in files.paths]
                start = time.perf_counter()
                futures = [f.pread(b, files.file_bytes, 0) for f, b in zip(opened, buffers, strict=True)]
                got = sum(future.get() for future in futures)
                seconds = time.perf_counter() - start
                for file in opened:
                    file.close()
                for job, buffer in enumerate(buffers):
                    head = buffer[: 1 << 20]
                    files.check(job, 0, head if isinstance(head, np.ndarray) else head.cpu().numpy())
                print(f"| {name} | {got / seconds / 2**30:.2f} | {cached:.1%} |")
    finally:
        files.remove()
    return 0


def _buffer(torch: Any, nbytes: int, device: str) -> Any:
    """GPU memory as a torch CUDA tensor (KvikIO reads it through the CUDA array interface), host memory as numpy."""
    if device == "cpu":
        return np.empty(nbytes, dtype=np.uint8)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def kvikio_benchmark(args: argparse.Namespace) -> int:
    """KvikIO's packaged benchmark (it needs cupy and dask) in the same directory, same size, same threads."""
    problem = gpu_problem()
    missing = [name for name in ("cupy", "dask") if not _importable(name)]
    if problem or missing:
        why = problem or f"{' and '.join(missing)} not installed (cupy-cuda13x alone is a 69 MB wheel, over the carry)"
        print(f"SKIP kvikio single_node_io: {why}")
        return 0
    directory = Path(args.dir) / "single-node-io"
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "kvikio.benchmarks.single_node_io", "--dir", str(directory)]
    command += [
        "--nbytes",
        args.file_bytes,
        "--nthreads",
        str(args.threads),
        "--nruns",
        "3",
        "--api",
        "cufile",
        "posix",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    shutil.rmtree(directory, ignore_errors=True)
    print(done.stdout + done.stderr)
    return done.returncode


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except Exception:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("status").set_defaults(run=status)
    for name, run in (("restore", restore), ("reference", reference), ("kvikio-benchmark", kvikio_benchmark)):
        step = steps.add_parser(name)
        step.add_argument("--dir", required=True, help="a directory on the drive under test")
        step.add_argument("--scale", type=float, default=2e-4, help="restore: workload scale (default 2e-4)")
        step.add_argument("--file-bytes", default="64M", help="reference: bytes per file (default 64M)")
        step.add_argument("--jobs", type=int, default=4, help="reference: files (default 4)")
        step.add_argument("--threads", type=int, default=16, help="reference: KvikIO threads (default 16)")
        step.set_defaults(run=run)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
