"""How much data-reducing storage could shrink ckptqual's checkpoints, and what the payload costs to make and check.

For each scale, writes one checkpoint and the next of the workload with the `stream` engine into a temporary
directory and measures, for the files as written (format overhead included) and for the payload alone (each
tensor's bytes inside the files): zlib -9, zstd -19, zstd --long, exact dedup at 4 KiB and 512 B, as written and
after the XOR/delta attacks, on one checkpoint and on both. The measures and attacks are those of
tests/test_payload_reduction.py, imported from it, so the bench reports what the tests limit.
Then the payload's generation and verification speed, GB/s per core (CPU time), old payload (a named git
revision) against the new one, interleaved round by round in one run.

zstd -19 (under 1 MB/s on the format's compressible bytes) runs on the data as written only, over a sample of
64 KiB windows spread evenly through it (--zstd19-max-mib). All three scales take about two hours on two
cores; --measures and --attacks pick a subset, --scales '' measures the speed only. --pads also measures the
alignment padding alone (each tensor record's "FB" field, found from the zip layout), and --rounds 0 skips the
speed comparison.

    python bench/reduction.py --scales 1e-4,5e-4,1e-3 --json reduction.json
    python bench/reduction.py --scales 1e-4 --pads --measures "zstd --long,dedup 64 B" --attacks "as written" --rounds 0
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ckptqual.io import payload
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import RankIO
from ckptqual.io.engines.torchread.stored import read_table
from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.workloads import load_workload

ROOT = Path(__file__).resolve().parents[1]
OLD_REVISION = "7e9bc99e35195077192042d065292f53a3da9a38"  # the last revision with the 8 MiB pool payload
CHUNK_BYTES = 8 << 20
MiB = 1 << 20
SAMPLE_WINDOW_BYTES = 64 << 10  # small windows: format overhead sits at file starts, so many windows sample it fairly


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def old_payload(revision: str, scratch: Path) -> ModuleType:
    """ckptqual's payload module as it was at `revision`."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:src/ckptqual/payload.py"], capture_output=True, text=True
    )
    if source.returncode:
        sys.exit(f"--old-revision {revision}: git cannot show its payload.py ({source.stderr.strip()}); name a commit")
    path = scratch / "old_payload.py"
    path.write_text(source.stdout)
    return load_module("old_payload", path)


def write_checkpoint(directory: Path, plan: CheckpointPlan, checkpoint: int, seed: int) -> list[Path]:
    """Every rank's files of one checkpoint, written with the stream engine; paths in rank, file order."""
    engine, paths = make_engine("stream"), []
    for rank in plan.ranks:
        io = RankIO(payload.PayloadGenerator(seed), rank=rank.rank, checkpoint=checkpoint)
        for index, spec in enumerate(rank.files):
            path = directory / f"checkpoint-{checkpoint:05d}" / spec.path
            path.parent.mkdir(parents=True, exist_ok=True)
            engine.write(path, spec, index, io)
            paths.append(path)
    return paths


def file_streams(paths: Sequence[Path]) -> list[np.ndarray]:
    return [np.memmap(path, dtype=np.uint8, mode="r") for path in paths]


def payload_streams(paths: Sequence[Path]) -> list[np.ndarray]:
    """Each tensor's bytes where the files hold them: the payload alone, without the format."""
    streams = []
    for path, mapped in zip(paths, file_streams(paths), strict=True):
        streams += [mapped[t.data_offset : t.data_offset + t.nbytes] for t in read_table(path)]
    return streams


def padding_streams(reduction: ModuleType, paths: Sequence[Path]) -> list[np.ndarray]:
    """Each tensor's alignment padding where the files hold it: what the writer chose, apart from the payload."""
    streams = []
    for path, mapped in zip(paths, file_streams(paths), strict=True):
        streams += [mapped[offset : offset + length] for offset, length in reduction.padding_places(path)]
    return streams


def spread_sample(pieces: Iterable[np.ndarray], total_bytes: int, max_bytes: int) -> Iterator[np.ndarray]:
    """About `max_bytes` of the pieces joined, as windows evenly spaced over all `total_bytes` of them."""
    stride = max(SAMPLE_WINDOW_BYTES, total_bytes // max_bytes * SAMPLE_WINDOW_BYTES)
    position = next_window = left_in_window = 0  # positions in the joined bytes
    for piece in pieces:
        flat, start = piece.reshape(-1), 0
        while start < flat.nbytes:
            if not left_in_window:
                start = max(start, next_window - position)
                if start >= flat.nbytes:
                    break
                left_in_window, next_window = SAMPLE_WINDOW_BYTES, next_window + stride
            taken = flat[start : start + left_in_window]
            left_in_window -= taken.nbytes
            start += taken.nbytes
            yield taken
        position += flat.nbytes


def reduction_rows(
    reduction: ModuleType,
    streams: Sequence[np.ndarray],
    per_checkpoint: int,
    scope: str,
    measures: Sequence[str],
    attacks: Sequence[str],
    zstd19_max_bytes: int,
) -> Iterator[dict[str, Any]]:
    """Every attack x measure gain for one scope; zstd -19 (slow) on the data as written only."""
    if scope == "one checkpoint":
        streams, pairs = streams[:per_checkpoint], [(i, i + 1) for i in range(per_checkpoint - 1)]
    else:
        pairs = [(i, i + per_checkpoint) for i in range(per_checkpoint)]
    total_bytes = sum(s.nbytes for s in streams)
    for attack in attacks:
        make_pieces = reduction.ATTACKS[attack]
        for measure in measures:
            if measure == "zstd -19" and attack != "as written":
                continue
            gain_of = reduction.MEASURES[measure]
            pieces = make_pieces(streams, pairs)
            measured_bytes = total_bytes
            if measure == "zstd -19":
                pieces = list(spread_sample(pieces, total_bytes, zstd19_max_bytes))
                measured_bytes = sum(piece.nbytes for piece in pieces)
            start = time.monotonic()
            gain = gain_of(pieces)
            yield {
                "scope": scope,
                "attack": attack,
                "measure": measure,
                "gain": gain,
                "measured_bytes": measured_bytes,
                "seconds": time.monotonic() - start,
            }


def measure_scale(
    reduction: ModuleType,
    workload: str,
    scale: float,
    parent: Path | None,
    seed: int,
    measures: Sequence[str],
    attacks: Sequence[str],
    zstd19_max_bytes: int,
    pads: bool,
) -> list[dict[str, Any]]:
    """Writes two consecutive checkpoints at `scale` and returns every reduction figure of files and payload (and,
    with `pads`, of the alignment padding alone)."""
    plan = load_workload(workload).plan().scaled(scale)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckptqual-reduction-", dir=parent) as directory:
        paths = [write_checkpoint(Path(directory), plan, checkpoint, seed) for checkpoint in (1, 2)]
        file_bytes = sum(p.stat().st_size for p in paths[0])
        padding_bytes = sum(length for path in paths[0] for _, length in reduction.padding_places(path))
        print(
            f"\nscale {scale:g}: {plan.file_count} files per checkpoint, payload {plan.total_bytes / 1e6:.1f} MB, "
            f"files {file_bytes / 1e6:.1f} MB (format overhead {file_bytes / plan.total_bytes - 1:.3%}, "
            f"of it padding {padding_bytes / file_bytes:.3%} of the files)",
            flush=True,
        )
        kinds = [("files", file_streams), ("payload", payload_streams)]
        if pads:
            kinds.append(("padding", lambda paths: padding_streams(reduction, paths)))
        for data, make_streams in kinds:
            streams = make_streams(paths[0] + paths[1])
            per_checkpoint = len(streams) // 2
            for scope in ("one checkpoint", "two checkpoints"):
                rows_of_scope = reduction_rows(
                    reduction, streams, per_checkpoint, scope, measures, attacks, zstd19_max_bytes
                )
                for row in rows_of_scope:
                    row.update(scale=scale, data=data, file_bytes=file_bytes, payload_bytes=plan.total_bytes)
                    row.update(padding_bytes=padding_bytes)
                    print(format_row(row), flush=True)
                    rows.append(row)
    return rows


def format_row(row: dict[str, Any]) -> str:
    sampled = f" ({row['measured_bytes'] / MiB:.0f} MiB sample)" if row["measure"] == "zstd -19" else ""
    figure = "no data left" if math.isnan(row["gain"]) else f"saves {row['gain']:8.3%}  ({row['seconds']:.1f} s)"
    return f"  {row['data']:8s} {row['scope']:16s} {row['attack']:31s} {row['measure'] + sampled:28s} {figure}"


def cpu_GBps(work: Any, nbytes: int) -> float:
    """GB/s of one call of `work`, by the CPU time of this thread."""
    start = time.thread_time()
    work()
    return nbytes / (time.thread_time() - start) / 1e9


def fill_work(generator: Any, buffer: np.ndarray, chunks: int) -> Any:
    def work() -> None:
        for i in range(chunks):
            generator.fill(buffer, 3, 1, 2, 0, i * buffer.nbytes)

    return work


def verify_work(module: ModuleType, generator: Any, data: np.ndarray, chunks: int) -> Any:
    scratch = np.empty_like(data)

    def work() -> None:
        for _ in range(chunks):
            assert module.find_mismatches(generator, data, 3, 1, 2, 0, 0, scratch=scratch) == []

    return work


def small_check_us(module: ModuleType, generator: Any, calls: int = 2000) -> float:
    """CPU microseconds of one 8 KiB check, as the read sweep does per block read."""
    data = generator.expected(8192, 3, 1, 2, 0, 0)
    start = time.thread_time()
    for _ in range(calls):
        module.find_mismatches(generator, data, 3, 1, 2, 0, 0)
    return (time.thread_time() - start) / calls * 1e6


def speed(old: ModuleType, rounds: int, chunks: int, seed: int) -> dict[str, dict[str, float]]:
    """Generation and verification GB/s per core and the cost of a small check, old and new interleaved."""
    modules = {"old": old, "new": payload}
    generators = {name: module.PayloadGenerator(seed) for name, module in modules.items()}
    buffer = np.empty(CHUNK_BYTES, dtype=np.uint8)
    samples: dict[str, dict[str, list[float]]] = {n: {"fill": [], "verify": [], "check_8KiB_us": []} for n in modules}
    for round_index in range(rounds):
        order = list(modules) if round_index % 2 == 0 else list(reversed(modules))
        for name in order:
            module, generator = modules[name], generators[name]
            samples[name]["fill"].append(cpu_GBps(fill_work(generator, buffer, chunks), chunks * CHUNK_BYTES))
            data = generator.expected(CHUNK_BYTES, 3, 1, 2, 0, 0)
            samples[name]["verify"].append(cpu_GBps(verify_work(module, generator, data, chunks), chunks * CHUNK_BYTES))
            samples[name]["check_8KiB_us"].append(small_check_us(module, generator))
    return {name: {k: statistics.median(v) for k, v in figures.items()} for name, figures in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="llama3.1-405b-review")
    parser.add_argument("--scales", default="1e-4,5e-4,1e-3", help="comma-separated scales ('': speed only)")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary checkpoints go")
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--measures", default=None, help="comma-separated subset of the measures (default: all)")
    parser.add_argument("--attacks", default=None, help="comma-separated subset of the attacks (default: all)")
    parser.add_argument("--pads", action="store_true", help="also measure the alignment padding alone")
    parser.add_argument("--zstd19-max-mib", type=int, default=16, help="zstd -19 is slow: a sample of about N MiB")
    parser.add_argument("--old-revision", default=OLD_REVISION, help="git revision of the old payload.py")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved speed rounds (0: no speed comparison)")
    parser.add_argument("--chunks", type=int, default=32, help="8 MiB chunks per speed measurement")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temporary checkpoints are removed

    reduction = load_module("payload_reduction", ROOT / "tests" / "test_payload_reduction.py")
    measures = args.measures.split(",") if args.measures else list(reduction.MEASURES)
    unknown = sorted(set(measures) - set(reduction.MEASURES))
    if unknown:
        sys.exit(f"--measures {','.join(unknown)}: unknown; use some of {','.join(reduction.MEASURES)}")
    attacks = args.attacks.split(",") if args.attacks else list(reduction.ATTACKS)
    unknown = sorted(set(attacks) - set(reduction.ATTACKS))
    if unknown:
        sys.exit(f"--attacks {','.join(unknown)}: unknown; use some of {','.join(reduction.ATTACKS)}")
    rows = []
    for scale in (float(s) for s in args.scales.split(",") if s):  # --scales '' measures the speed only
        zstd19_max_bytes = args.zstd19_max_mib * MiB
        rows += measure_scale(
            reduction, args.workload, scale, args.dir, args.seed, measures, attacks, zstd19_max_bytes, args.pads
        )

    figures: dict[str, dict[str, float]] = {}
    if args.rounds > 0:
        with tempfile.TemporaryDirectory() as scratch:
            figures = speed(old_payload(args.old_revision, Path(scratch)), args.rounds, args.chunks, args.seed)
        print(f"\npayload speed, median of {args.rounds} interleaved rounds, CPU time of one core:")
    for name, values in figures.items():
        print(
            f"  {name}: generate {values['fill']:.2f} GB/s, verify {values['verify']:.2f} GB/s (8 MiB chunks), "
            f"one 8 KiB check {values['check_8KiB_us']:.0f} us"
        )
    if args.json:
        args.json.write_text(json.dumps({"old_revision": args.old_revision, "reduction": rows, "speed": figures}))


if __name__ == "__main__":
    main()
