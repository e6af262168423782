"""The write benchmarks, one command per row: ckptqual's writers against fio (and DLIO) side by side.

Every round runs every tool of the row once, the order rotating from round to round, with the page cache
dropped (and dirty pages synced) before each tool, so that noise on a shared host hits all tools alike.
Ratios are taken within a round (tool / reference of the same round) and printed as min / median / max.

    python bench/write_rows.py --row checkpoint   # stream and torch-save vs fio buffered, end_fsync, same files
    python bench/write_rows.py --row direct       # stream (and stream-direct) vs fio O_DIRECT libaio iodepth 16
    python bench/write_rows.py --row tmpfs        # stream vs the best plain writer of the same files, on /dev/shm
    python bench/write_rows.py --row dlio         # stream seconds vs DLIO v2.0.0 seconds per checkpoint
    python bench/write_rows.py --row raw          # the raw baseline writer vs fio, one file per rank

`--before SRC` adds the same ckptqual tools run from another source tree (e.g. `git archive HEAD` unpacked)
in the same rounds: before and after side by side. `--scale 0.001` is the review's layout at 1.6 GB per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchutil import Result, Server, spread

from ckptqual.plan.model import RankPlan
from ckptqual.plan.workloads import load_workload

WORKLOAD = "llama3.1-405b-review"


Tool = Callable[[Path, int], Result]


def drop_caches() -> None:
    """Writes back dirty pages and drops the page cache, so that no tool inherits another's cached state."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as error:
        sys.exit(f"cannot drop the page cache ({error}); run as root")


def checkpoint_tool(server: Server, engine: str, scale: float, workload: str) -> Tool:
    def run(directory: Path, round_number: int) -> Result:
        return server.request(
            op="checkpoint", directory=directory, engine=engine, workload=workload, scale=scale, checkpoint=round_number
        )

    return run


def raw_tool(server: Server, bytes_per_rank: int) -> Tool:
    def run(directory: Path, round_number: int) -> Result:
        return server.request(op="raw", directory=directory, bytes_per_rank=bytes_per_rank)

    return run


def fio_jobs(ranks: tuple[RankPlan, ...], direct: bool) -> list[list[dict[str, str]]]:
    """fio jobs that write the plan's files with each rank's split: per rank, one job per run of equally sized
    files, in the rank's order (each waits for the one before). O_DIRECT rounds sizes up to 4 KiB."""
    chains = []
    for rank in ranks:
        chain: list[dict[str, str]] = []
        sizes = [-(-f.nbytes // 4096) * 4096 if direct else f.nbytes for f in rank.files if f.nbytes]
        groups: list[list[int]] = []
        for size in sizes:
            if groups and groups[-1][0] == size:
                groups[-1][1] += 1
            else:
                groups.append([size, 1])
        for index, (size, count) in enumerate(groups):
            block = min(1 << 20, size)
            job = {"name": f"r{rank.rank}-{index}", "bs": str(block), "filesize": str(size // block * block)}
            job |= {"nrfiles": str(count), "size": str(count * (size // block * block))}
            if chain:
                job["wait_for"] = chain[-1]["name"]
            chain.append(job)
        chains.append(chain)
    return chains


def fio_tool(chains: list[list[dict[str, str]]], options: dict[str, str]) -> Tool:
    """fio writing the jobs `chains`; its time is the slowest rank's sum of job runtimes (fio's own clock)."""

    def run(directory: Path, round_number: int) -> Result:
        lines = ["[global]", "rw=write", "end_fsync=1", "file_service_type=sequential", f"directory={directory}"]
        lines += ["filename_format=$jobname.$filenum", *(f"{k}={v}" for k, v in options.items())]
        for chain in chains:
            for job in chain:
                lines += [f"[{job['name']}]", *(f"{k}={v}" for k, v in job.items() if k != "name")]
        job_file = directory / "jobs.fio"
        job_file.write_text("\n".join(lines) + "\n")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(["fio", "--output-format=json", str(job_file)], capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode:
            sys.exit(f"fio failed: {done.stderr.strip()}")
        jobs = {job["jobname"]: job for job in json.loads(done.stdout)["jobs"]}
        seconds = max(sum(jobs[job["name"]]["job_runtime"] for job in chain) for chain in chains if chain) / 1000
        written = sum(job["write"]["io_bytes"] for job in jobs.values())
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return Result(written, seconds, cpu)

    return run


def plain_tool(ranks: tuple[RankPlan, ...]) -> Tool:
    """The plainest writer of the same files in Python: 8 processes, each writing its rank's files from one
    buffer (1 MiB writes), then fsyncing them; the time is the slowest process's."""

    def run(directory: Path, round_number: int) -> Result:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        sizes = [",".join(str(f.nbytes) for f in rank.files) for rank in ranks]
        children = [
            subprocess.Popen([sys.executable, "-c", _PLAIN, str(directory / f"p{i}"), s]) for i, s in enumerate(sizes)
        ]
        if any(child.wait() for child in children):
            sys.exit("the plain writer failed")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        ends = [float((directory / f"p{i}" / "end").read_text()) for i in range(len(ranks))]
        starts = [float((directory / f"p{i}" / "start").read_text()) for i in range(len(ranks))]
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return Result(sum(r.nbytes for r in ranks), max(ends) - min(starts), cpu)

    return run


# The plain writer's process: it times itself from its first write, so that interpreter start-up is not counted.
_PLAIN = """
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1]); out.mkdir()
buffer = memoryview(os.urandom(1 << 20))
(out / "start").write_text(repr(time.monotonic()))
fds = []
for index, size in enumerate(int(s) for s in sys.argv[2].split(",")):
    fd = os.open(out / f"f{index}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for offset in range(0, size, len(buffer)):
        os.write(fd, buffer[: min(len(buffer), size - offset)])
    fds.append(fd)
for fd in fds:
    os.fsync(fd); os.close(fd)
fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)
(out / "end").write_text(repr(time.monotonic()))
"""


def dlio_unavailable(dlio: str | None) -> str:
    """Why the DLIO row cannot run on this host, or an empty string."""
    if dlio is None or shutil.which("mpirun") is None:
        return (
            "DLIO v2.0.0 is not installed: its wheel (pip download --no-deps dlio-benchmark==2.0.0) needs an MPI "
            "(mpirun, mpi4py), tensorflow (imported at start even for pytorch), hydra-core, omegaconf, pydftracer; "
            "install those and pass --dlio PATH/TO/dlio_benchmark"
        )
    return ""


def dlio_config(plan_ranks: tuple[RankPlan, ...], parallelism: dict[str, int], directory: Path, epochs: int) -> str:
    """A DLIO v2.0.0 checkpoint workload with the plan's layout: optimizer group, layer tensors, layers, TP x PP."""
    layer_rank = next(rank for rank in plan_ranks if len(rank.files) > 1)
    layer = next(f for f in layer_rank.files if f.path.startswith("layer-"))
    group = next(f for f in plan_ranks[1].files if f.path.startswith("optimizer-")).tensors[0].numel
    layers = sum(f.path.startswith("layer-") for f in layer_rank.files) - parallelism["tp"]
    return f"""model: ckptqual_review_layout
framework: pytorch
workflow: {{generate_data: True, train: True, checkpoint: True}}
dataset:
  {{data_folder: {directory}/data, format: npz, num_files_train: 8, num_samples_per_file: 1, record_length: 4096}}
reader: {{data_loader: pytorch, batch_size: 1, read_threads: 0}}
train: {{epochs: {epochs}, computation_time: 0}}
checkpoint:
  checkpoint_folder: {directory}/checkpoints
  type: all_ranks
  checkpoint_after_epoch: 1
  epochs_between_checkpoints: 1
  optimization_groups: [{group}]
  num_layers: {layers}
  layer_parameters: [{", ".join(str(t.numel) for t in layer.tensors)}]
  tensor_parallelism: {parallelism["tp"]}
  pipeline_parallelism: {parallelism["pp"]}
  model_size: 0
"""


def dlio_seconds(dlio: str, config: str, directory: Path) -> list[float]:
    """Runs DLIO with 8 MPI ranks; its seconds per checkpoint as it reports them (rank 0's, without fsync)."""
    (directory / "conf" / "workload").mkdir(parents=True)
    (directory / "conf" / "workload" / "ckptqual.yaml").write_text(config)
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "8", dlio, "--config-dir"]
    command += [str(directory / "conf"), "workload=ckptqual", f"hydra.run.dir={directory}/out"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"DLIO failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    stats = json.loads((directory / "out" / "per_epoch_stats.json").read_text())
    return [float(epoch[key]["duration"]) for epoch in stats.values() for key in epoch if key.startswith("ckpt")]


def dlio_row(args: argparse.Namespace) -> None:
    """DLIO runs its checkpoints in one invocation (its start-up takes minutes here), then `stream` writes as
    many, each after a page-cache drop; seconds per checkpoint compared, medians and spread."""
    plan = load_workload(args.workload).plan().scaled(args.scale)
    work = Path(tempfile.mkdtemp(prefix="ckptqual-bench-", dir=args.target))
    server = Server(None)
    try:
        drop_caches()
        dlio = dlio_seconds(args.dlio, dlio_config(plan.ranks, plan.parallelism, work / "dlio", args.rounds), work)
        shutil.rmtree(work / "dlio", ignore_errors=True)
        stream = []
        write = checkpoint_tool(server, "stream", args.scale, args.workload)
        for round_number in range(args.rounds):
            drop_caches()
            stream.append(write(work / f"stream-{round_number}", round_number))
            shutil.rmtree(work / f"stream-{round_number}")
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    seconds = [r.seconds for r in stream]
    size = f"{plan.total_bytes / 1e9:.3f} GB, {plan.file_count} files, {len(plan.ranks)} ranks"
    print(f"row dlio: {size}, {args.rounds} checkpoints")
    print(f"  DLIO v2.0.0 (torch.save of zeros, no fsync, rank 0's time)  s: {spread(dlio)}")
    print(f"  stream (unique payload, fsync, slowest rank)                 s: {spread(seconds)}")
    ratios = sorted(s / d for s in seconds for d in dlio)
    print(f"  stream s / DLIO s: {spread(ratios)} (every pair)")


def rows(args: argparse.Namespace) -> tuple[str, dict[str, Tool], list[Server], Path | None]:
    """The row's tools (the reference first) and the servers that hold ckptqual's pools."""
    plan = load_workload(args.workload).plan().scaled(args.scale)
    servers: dict[str, Server] = {"": Server(None)}
    if args.before:
        servers["before "] = Server(args.before)
    tools: dict[str, Tool] = {}
    target = args.target
    if args.row == "checkpoint":
        tools["fio buffered"] = fio_tool(fio_jobs(plan.ranks, False), {"ioengine": "psync"})
        for label, server in servers.items():
            tools[f"{label}stream"] = checkpoint_tool(server, "stream", args.scale, args.workload)
            tools[f"{label}torch-save"] = checkpoint_tool(server, "torch-save", args.scale, args.workload)
    elif args.row == "direct":
        tools["fio O_DIRECT libaio qd16"] = fio_tool(
            fio_jobs(plan.ranks, True), {"ioengine": "libaio", "direct": "1", "iodepth": "16"}
        )
        for label, server in servers.items():
            tools[f"{label}stream"] = checkpoint_tool(server, "stream", args.scale, args.workload)
        if args.direct_engine:
            tools["stream-direct"] = checkpoint_tool(servers[""], "stream-direct", args.scale, args.workload)
    elif args.row == "tmpfs":
        target = target or Path("/dev/shm")
        tools["best plain writer"] = _best(
            fio_tool(fio_jobs(plan.ranks, False), {"ioengine": "psync"}), plain_tool(plan.ranks)
        )
        for label, server in servers.items():
            tools[f"{label}stream"] = checkpoint_tool(server, "stream", args.scale, args.workload)
    elif args.row == "raw":
        per_rank = -(-plan.total_bytes // len(plan.ranks))
        job = {"bs": str(1 << 20), "filesize": str(per_rank), "size": str(per_rank)}
        tools["fio one file per rank"] = fio_tool([[job | {"name": f"r{r}"}] for r in range(len(plan.ranks))], {})
        for label, server in servers.items():
            tools[f"{label}raw writer"] = raw_tool(server, per_rank)
    size = f"{plan.total_bytes / 1e9:.3f} GB, {plan.file_count} files, {len(plan.ranks)} ranks"
    return size, tools, list(servers.values()), target


def _best(*candidates: Tool) -> Tool:
    """Runs every candidate (cache dropped between) and keeps the fastest: the best plain writer of the round."""

    def run(directory: Path, round_number: int) -> Result:
        results = []
        for index, candidate in enumerate(candidates):
            drop_caches()
            (directory / str(index)).mkdir()
            results.append(candidate(directory / str(index), round_number))
        return max(results, key=lambda r: r.GBps)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--row", required=True, choices=("checkpoint", "direct", "tmpfs", "dlio", "raw"))
    parser.add_argument("--target", type=Path, default=None, help="directory on the drive (default: the temp dir)")
    parser.add_argument("--scale", type=float, default=0.001, help="checkpoint scale (default 0.001: 1.64 GB)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workload", default=WORKLOAD, help=f"workload (default: {WORKLOAD}, 8 ranks, 536 files)")
    parser.add_argument("--before", type=Path, default=None, help="another source tree to run side by side")
    parser.add_argument("--direct-engine", action="store_true", help="also the stream-direct engine (row direct)")
    parser.add_argument("--dlio", default=shutil.which("dlio_benchmark"), help="DLIO v2.0.0's dlio_benchmark")
    args = parser.parse_args()
    if args.row == "dlio":
        if reason := dlio_unavailable(args.dlio):
            raise SystemExit(f"row dlio skipped: {reason}")
        return dlio_row(args)
    what, tools, servers, target = rows(args)
    work = Path(tempfile.mkdtemp(prefix="ckptqual-bench-", dir=target))
    results: dict[str, list[Result]] = {name: [] for name in tools}
    try:
        for round_number in range(args.rounds):
            names = list(tools)
            shift = round_number % len(names)
            for name in names[shift:] + names[:shift]:
                directory = work / f"{round_number}-{name.replace(' ', '_')}"
                directory.mkdir()
                drop_caches()
                results[name].append(tools[name](directory, round_number))
                shutil.rmtree(directory)
            print(f"round {round_number + 1}: " + ", ".join(f"{n} {r[-1].GBps:.2f}" for n, r in results.items()))
    finally:
        for server in servers:
            server.close()
        shutil.rmtree(work, ignore_errors=True)
    reference = next(iter(tools))
    print(f"row {args.row}: {what}, {args.rounds} rounds on {work.parent}, order rotating, cache dropped before each")
    header = f"  {'tool':28} {'GB/s min / median / max':>24} {'ratio to ' + reference:>30} {'CPU s/GB':>9}"
    print(header + f" {'CPU s/GB / ' + reference + ', min / median / max':>44}")
    for name, values in results.items():
        pairs = list(zip(values, results[reference], strict=True))
        ratios = [v.GBps / ref.GBps for v, ref in pairs]
        cpu_ratios = [v.cpu_s / v.bytes / (ref.cpu_s / ref.bytes) for v, ref in pairs]  # per round, same bytes' CPU
        cpu = statistics.median(v.cpu_s / (v.bytes / 1e9) for v in values)
        line = f"  {name:28} {spread([v.GBps for v in values]):>24} {spread(ratios):>30} {cpu:9.2f}"
        print(line + f" {spread(cpu_ratios):>44}")


if __name__ == "__main__":
    main()
