"""The suite's own ceiling: the most GB/s this host could measure in a phase (usable cores x the suite's GB per
CPU-second there), and the absolute minimums above it, which no run on this host can prove (pure arithmetic).

A minimum throughput above the ceiling would only ever be met by a faster host: the run would end host-bound
(limits.host_bound), INVALID, hours later. It is refused before any I/O instead. The calibration behind the ceiling
varies on a busy shared host (its worst of six runs 0.7 of its best on this project's 2-core VM), so a limit is refused
only when it stands above the ceiling by more than `NOISE_MARGIN`: a limit near the ceiling runs, and the host-bound
rule judges its figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ckptqual.limits.limits import Limit
from ckptqual.limits.units import to_unit, unit_kind

FILL_WRITE, RESTORE = "fill write", "restore"
PHASES = (FILL_WRITE, RESTORE)
# The phase whose ceiling bounds each measurement an absolute minimum may name.
PHASE_OF = {"fill_throughput": FILL_WRITE, "fill_mean_checkpoint_throughput": FILL_WRITE, "restore_throughput": RESTORE}
REFUSAL_FIX = "qualify fewer drives at once on this host, use a host with more (or faster) cores, or lower the limit"
NOISE_MARGIN = 0.5  # a limit is refused above ceiling x (1 + NOISE_MARGIN): beyond the calibration's spread


@dataclass(frozen=True)
class Ceiling:
    """One phase's ceiling: `cores` usable cores (this drive's share of them) x `GB_per_cpu_s` measured."""

    phase: str
    cores: float
    GB_per_cpu_s: float

    @property
    def GBps(self) -> float:
        return self.cores * self.GB_per_cpu_s

    def describe(self) -> str:
        """E.g. `fill write 3.4 GB/s (2 cores x 1.7 GB per CPU-s)`."""
        return f"{self.phase} {self.GBps:.2f} GB/s ({self.cores:.3g} cores x {self.GB_per_cpu_s:.2f} GB per CPU-s)"

    def to_dict(self) -> dict[str, float | str]:
        return {"phase": self.phase, "cores": self.cores, "GB_per_cpu_s": self.GB_per_cpu_s, "GBps": self.GBps}


def best_rate(rounds: Iterable[tuple[int, float]]) -> float:
    """GB per CPU-second of the best of (bytes, CPU seconds) rounds: noise only ever slows a round down."""
    rates = [nbytes / 1e9 / cpu_s for nbytes, cpu_s in rounds if cpu_s > 0]
    if not rates:
        raise ValueError("no calibration round took measurable CPU time; calibrate with more bytes per round")
    return max(rates)


def drive_share(cores: float, drives_at_once: int) -> float:
    """The cores one drive's ranks may count on when `drives_at_once` drives share this host."""
    return cores / max(1, drives_at_once)


def ceilings(cores: float, GB_per_cpu_s: dict[str, float]) -> dict[str, Ceiling]:
    """Each measured phase's ceiling on `cores` cores."""
    return {phase: Ceiling(phase, cores, rate) for phase, rate in GB_per_cpu_s.items()}


def limits_above(limits: Iterable[Limit], ceilings: dict[str, Ceiling]) -> list[str]:
    """One line per absolute minimum throughput above its phase's ceiling by more than NOISE_MARGIN, with the
    numbers (REFUSAL_FIX says what to do); relative limits, maximums and phases without a ceiling are never refused."""
    lines = []
    for limit in limits:
        ceiling = ceilings.get(PHASE_OF.get(limit.measurement, ""))
        if ceiling is None or limit.min is None or limit.relative_to or unit_kind(limit.unit) != "throughput":
            continue
        bound_GBps = to_unit(limit.run_bound, limit.unit, "GB/s")
        if bound_GBps > ceiling.GBps * (1 + NOISE_MARGIN):
            lines.append(
                f"{limit.title()}: min {bound_GBps:.4g} GB/s is above what this host can measure: ceiling "
                f"{ceiling.describe().removeprefix(ceiling.phase + ' ')} for the {ceiling.phase}, and more than "
                f"{1 + NOISE_MARGIN:g} x that, which no noise explains"
            )
    return lines
