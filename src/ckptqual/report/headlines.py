"""The headline figures of one run, read from its record: per pass the mean seconds per checkpoint and GB/s with
their spread, the restore, the raw baseline, the sweep's best cell and the slowest layout, each with its limit where
the drive file set one; the side-by-side table, the bars and the trend all draw from these."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Any

from ckptqual.report.extract import limit_in, limits_of, measured_cells, passes


@dataclass(frozen=True)
class Headline:
    """One figure: its name and unit, the mean of its values and their spread (lowest, highest), its bound in the
    same unit (None where no limit applies), and which way is better."""

    name: str
    unit: str
    mean: float
    low: float
    high: float
    limit: float | None = None
    higher_is_better: bool = True


def _of(name: str, unit: str, values: list[float], limit: float | None = None, higher: bool = True) -> Headline:
    return Headline(name, unit, fmean(values), min(values), max(values), limit, higher)


def _limit(data: dict[str, Any], measurement: str, unit: str, **context: Any) -> float | None:
    """The bound of `measurement` in `unit` where its context holds `context` (the first judged entry)."""
    for entry in limits_of(data, measurement):
        if all(entry.get("context", {}).get(key) == value for key, value in context.items()):
            return limit_in(entry, unit)
    return None


def _as_time(rate: float | None, nbytes: int) -> float | None:
    """A throughput bound (GB/s) as the seconds `nbytes` take at that rate."""
    return nbytes / (rate * 1e9) if rate and nbytes else None


def pass_seconds(data: dict[str, Any]) -> dict[int, Headline]:
    """Per pass, seconds per checkpoint (the slowest rank's), and the fill limit as a checkpoint's time."""
    checkpoint_bytes = data.get("plan", {}).get("total_bytes", 0)
    return {
        number: _of(
            f"pass {number} s per checkpoint",
            "s",
            [c["seconds"] for c in checkpoints],
            _as_time(_limit(data, "fill_throughput", "GB/s", **{"pass": number}), checkpoint_bytes),
            higher=False,
        )
        for number, checkpoints in passes(data).items()
    }


def pass_rates(data: dict[str, Any]) -> dict[int, Headline]:
    """Per pass, GB/s per checkpoint, and the pass's fill limit."""
    return {
        number: _of(
            f"pass {number} GB/s",
            "GB/s",
            [c["GBps"] for c in checkpoints],
            _limit(data, "fill_throughput", "GB/s", **{"pass": number}),
        )
        for number, checkpoints in passes(data).items()
    }


def headlines(data: dict[str, Any]) -> list[Headline]:
    """Every headline figure the record holds, in the page's order."""
    found = [*pass_seconds(data).values(), *pass_rates(data).values()]
    restored = data.get("restore") or []
    if restored:
        found.append(
            _of("restore GB/s", "GB/s", [r["GBps"] for r in restored], _limit(data, "restore_throughput", "GB/s"))
        )
        found.append(_of("restore s", "s", [r["seconds"] for r in restored], higher=False))
    baseline = data.get("baseline") or {}
    for key, name in (("write_GBps", "raw write GB/s"), ("read_GBps", "raw read GB/s")):
        if baseline.get(key):
            found.append(_of(name, "GB/s", baseline[key]))
    cells = measured_cells(data)
    if cells:
        best = max(cells, key=lambda cell: cell["GiBps"])
        where = f"{best['transfer']} {best['block_size']} x{best['threads']}"
        found.append(_of(f"sweep best GiB/s ({where})", "GiB/s", [best["GiBps"]]))
    ratios = [layout["ratio"] for layout in data.get("layouts", []) if layout.get("judged") and "ratio" in layout]
    if ratios:
        found.append(
            Headline("slowest layout ratio", "ratio", min(ratios), min(ratios), min(ratios),
                     _limit(data, "layout_throughput_ratio", "ratio"))
        )  # fmt: skip
    return found


def headline_key(headline: Headline) -> str:
    """The name a headline is matched by across runs (the sweep's best cell may differ from run to run)."""
    return headline.name.split(" (")[0]
