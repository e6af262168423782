"""The suite's own speed on this host, measured before any I/O on the target: GB per CPU-second of a checkpoint write
through the run's engine (payload, CRCs, fsync) and of the verified read of a restore, on memory (a temporary
directory in /dev/shm, removed after), through the engine registry and payload a rank uses.

Short rounds (ROUND_BYTES each, well under a second in all); the best round counts, as noise only slows one down.
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptqual.config.values import SettingsError
from ckptqual.faults import os_error_line
from ckptqual.host.cpu import usable_cores
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import Engine, RankIO, fsync_path
from ckptqual.io.payload import PayloadGenerator
from ckptqual.limits.ceiling import FILL_WRITE, PHASES, RESTORE, Ceiling, best_rate, ceilings, drive_share
from ckptqual.plan.model import FilePlan, TensorSpec

MEMORY = Path("/dev/shm")  # tmpfs: the calibration measures the suite, never a drive
ROUND_BYTES = 32 << 20
ROUNDS = 5
_SEED = 0


class CalibrationError(SettingsError):
    """The suite's own write or read back, on memory, did not work: the run cannot know what this host can measure."""


@dataclass(frozen=True)
class Calibration:
    """(bytes, CPU seconds) of each round of each phase, with the engine and the directory it ran in."""

    engine: str
    directory: str
    rounds: dict[str, list[tuple[int, float]]]

    def GB_per_cpu_s(self) -> dict[str, float]:
        return {phase: best_rate(rounds) for phase, rounds in self.rounds.items()}

    def ceilings(self, cores: float) -> dict[str, Ceiling]:
        return ceilings(cores, self.GB_per_cpu_s())

    def to_dict(self, cores: float, usable_cores: float, drives_at_once: int) -> dict[str, Any]:
        """The record's `ceiling`: each phase's ceiling on this drive's `cores`, and how it was measured."""
        return {
            "cores": cores,
            "usable_cores": usable_cores,
            "drives_at_once": drives_at_once,
            "engine": self.engine,
            "directory": self.directory,
            "rounds": {
                phase: [{"bytes": nbytes, "cpu_s": cpu_s} for nbytes, cpu_s in rounds]
                for phase, rounds in self.rounds.items()
            },
            "phases": {phase: ceiling.to_dict() for phase, ceiling in self.ceilings(cores).items()},
        }


@functools.cache
def calibrate(engine: str, round_bytes: int = ROUND_BYTES, rounds: int = ROUNDS, memory: Path = MEMORY) -> Calibration:
    """Writes and reads back `rounds` files of `round_bytes` with `engine` in a temporary directory in `memory` (the
    system's temporary directory where there is no such directory), timing the CPU each takes; once per engine in a
    process: the host does not change during a session. A failure is a CalibrationError naming the directory."""
    spec = FilePlan("calibration.pt", (TensorSpec("calibration", round_bytes, "uint8"),))
    io, io_engine = RankIO(PayloadGenerator(_SEED), rank=0), make_engine(engine)
    timed: dict[str, list[tuple[int, float]]] = {phase: [] for phase in PHASES}
    parent = str(memory) if memory.is_dir() else tempfile.gettempdir()
    try:
        with tempfile.TemporaryDirectory(prefix="ckptqual-calibration-", dir=parent) as directory:
            for number in range(rounds):
                path, io.checkpoint = Path(directory) / f"round-{number}" / spec.path, number
                path.parent.mkdir()
                timed[FILL_WRITE].append((spec.nbytes, _cpu_s(_write, io_engine, path, spec, io)))
                timed[RESTORE].append((spec.nbytes, _cpu_s(_read, io_engine, path, spec, io)))
                path.unlink()
    except OSError as error:
        raise CalibrationError(
            f"the suite's own speed could not be measured in {parent} (before any I/O on the target): "
            f"{os_error_line(error, 'write')}; it needs {round_bytes / 1e6:.0f} MB free there"
        ) from None
    return Calibration(engine, parent, timed)


def measure_ceiling(engine: str, drives_at_once: int = 1) -> tuple[dict[str, Any], dict[str, Ceiling]]:
    """The record's `ceiling` of one drive's run with `engine` and each phase's ceiling: this host's usable cores,
    shared by `drives_at_once` drives, x the suite's GB per CPU-second."""
    cores, calibration = usable_cores(), calibrate(engine)
    share = drive_share(cores, drives_at_once)
    return calibration.to_dict(share, cores, drives_at_once), calibration.ceilings(share)


def _write(engine: Engine, path: Path, spec: FilePlan, io: RankIO) -> None:
    engine.write(path, spec, 0, io)
    fsync_path(io, path)


def _read(engine: Engine, path: Path, spec: FilePlan, io: RankIO) -> None:
    problems = engine.read(path, spec, 0, io, path.name)
    if problems:
        raise CalibrationError(
            f"the {engine.name} engine read back wrong bytes from memory: {problems[0].describe()}; the host's memory "
            "or the engine is broken, so no run on this host can be trusted"
        )


def _cpu_s(work: Callable[..., None], *args: Any) -> float:
    """CPU seconds (user + system, this process) `work(*args)` took, as a rank counts its own."""
    start = time.process_time()
    work(*args)
    return time.process_time() - start
