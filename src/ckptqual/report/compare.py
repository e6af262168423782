"""The regression gate: two runs' records compared metric by metric, each change against its noise band (from
the rounds within each run) and an allowed percentage. A metric regresses only when it is worse beyond both."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from statistics import fmean, stdev
from typing import Any

from ckptqual.report.extract import Run, measured_cells, passes, steady_rounds
from ckptqual.report.summary import table

BAND_SE = 2.0  # the noise band is this many standard errors of the difference of the two means


class CompareError(ValueError):
    """A bad argument of `ckptqual compare`, naming the value and the fix."""


@dataclass(frozen=True)
class Metric:
    """One figure of a run with its rounds; a single-round figure borrows the relative spread of the run's raw
    baseline rounds (`noise_from`), the drive's own variation measured in the same run."""

    name: str
    unit: str
    rounds: tuple[float, ...]
    noise_from: str | None = None

    @property
    def mean(self) -> float:
        return fmean(self.rounds)


@dataclass(frozen=True)
class Change:
    """A metric of both runs: the relative change, its noise band, and whether it regressed."""

    name: str
    unit: str
    base: float
    new: float
    change: float  # (new - base) / base; every metric is higher-is-better
    band: float | None  # relative half-width; None: no rounds to tell the noise
    regressed: bool
    word: str


def run_metrics(data: dict[str, Any]) -> dict[str, Metric]:
    """Every comparable figure of a record by name: raw baseline, per pass, steady state, restore, sweep cells,
    odd layouts; all throughputs (or ratios of throughputs), so higher is better."""
    found: list[Metric] = []
    baseline = data.get("baseline", {})
    for key, name in (("write_GBps", "raw_write"), ("read_GBps", "raw_read")):
        if baseline.get(key):
            found.append(Metric(name, "GB/s", tuple(baseline[key])))
    for number, checkpoints in passes(data).items():
        found.append(Metric(f"pass{number}", "GB/s", tuple(c["GBps"] for c in checkpoints), "raw_write"))
    if steady_rounds(data):
        found.append(Metric("steady", "GB/s", tuple(steady_rounds(data)), "raw_write"))
    if data.get("restore"):
        found.append(Metric("restore", "GB/s", tuple(r["GBps"] for r in data["restore"]), "raw_read"))
    found += [Metric(f"sweep.{c['id']}", "GiB/s", (c["GiBps"],), "raw_read") for c in measured_cells(data)]
    judged = [layout["ratio"] for layout in data.get("layouts", []) if layout.get("judged")]
    if judged:
        found.append(Metric("layouts.ratio", "ratio", tuple(judged), "raw_write"))
        found.append(Metric("layouts.slowest_ratio", "ratio", (min(judged),), "raw_write"))
    return {metric.name: metric for metric in found if metric.rounds}


def _standard_error(metric: Metric, metrics: dict[str, Metric]) -> float | None:
    """The standard error of the metric's mean, from its rounds, else from its baseline's relative spread."""
    if len(metric.rounds) >= 2:
        return stdev(metric.rounds) / math.sqrt(len(metric.rounds))
    source = metrics.get(metric.noise_from or "")
    if source is None or len(source.rounds) < 2 or not source.mean:
        return None
    return stdev(source.rounds) / source.mean * metric.mean


def compare_metric(name: str, base: dict[str, Metric], new: dict[str, Metric], max_regression: float) -> Change:
    """The change of metric `name` from `base` to `new`; `max_regression` is a fraction (0.05 for 5 %)."""
    b, n = base[name], new[name]
    change = (n.mean - b.mean) / b.mean if b.mean else math.inf
    errors = [_standard_error(b, base), _standard_error(n, new)]
    band = BAND_SE * math.sqrt(sum(e**2 for e in errors)) / b.mean if None not in errors and b.mean else None
    beyond_noise = band is None or abs(change) > band
    regressed = change < 0 and beyond_noise and -change > max_regression
    if regressed:
        word = "REGRESSION"
    elif not beyond_noise:
        word = "within noise"
    elif change < 0:
        word = f"worse, within the allowed {max_regression:.0%}"
    else:
        word = "better" if change > 0 else "unchanged"
    return Change(name, b.unit, b.mean, n.mean, change, band, regressed, word)


def select(names: Sequence[str], patterns: Sequence[str] | None) -> list[str]:
    """The metric names matching any of the glob `patterns` (all without); a pattern matching none is an error."""
    if not patterns:
        return list(names)
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name in names):
            raise CompareError(f"--metric {pattern!r}: matches no metric of either run; known: {', '.join(names)}")
    return [name for name in names if any(fnmatchcase(name, pattern) for pattern in patterns)]


def parse_percentage(text: str) -> float:
    """'5%' or '5' -> 0.05; a bad value is a CompareError naming it."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value < 100):
        raise CompareError(f"--max-regression {text!r}: give a percentage from 0 to under 100, e.g. 5%")
    return value / 100


def _differences(base: Run, new: Run) -> list[str]:
    """The settings two runs differ in that change what their figures mean."""
    keys = ("workload", "scale", "engine", "checkpoints_per_pass", "passes", "layout_seed", "layout_max_total_bytes")
    a, b = base.data.get("settings", {}), new.data.get("settings", {})
    return [f"{key} {a.get(key)} vs {b.get(key)}" for key in keys if a.get(key) != b.get(key)]


def compare_runs(
    base: Run, new: Run, max_regression: float = 0.05, patterns: Sequence[str] | None = None
) -> tuple[list[Change], list[str]]:
    """Every selected metric's change, and the lines of the report (a table, notes and the conclusion)."""
    base_metrics, new_metrics = run_metrics(base.data), run_metrics(new.data)
    names = list(dict.fromkeys([*base_metrics, *new_metrics]))
    chosen = select(names, patterns)
    both = [name for name in chosen if name in base_metrics and name in new_metrics]
    changes = [compare_metric(name, base_metrics, new_metrics, max_regression) for name in both]
    lines = [
        f"base {base.label} ({base.path}): {base.data.get('verdict', {}).get('overall', 'no verdict')}",
        f"new  {new.label} ({new.path}): {new.data.get('verdict', {}).get('overall', 'no verdict')}",
    ]
    lines += [f"note: the runs differ in {', '.join(_differences(base, new))}"] if _differences(base, new) else []
    rows = [
        [
            c.name,
            c.unit,
            f"{c.base:.4g}",
            f"{c.new:.4g}",
            f"{c.change:+.1%}",
            "n/a" if c.band is None else f"±{c.band:.1%}",
            c.word,
        ]
        for c in changes
    ]
    lines += table(["metric", "unit", "base", "new", "change", "noise band", ""], rows) if rows else []
    lines += [f"{name}: only in {'base' if name in base_metrics else 'new'}" for name in chosen if name not in both]
    lines.append(
        f"noise band: {BAND_SE:g} standard errors of the difference of the means, from each run's rounds "
        "(a single-round figure takes the spread of its run's raw baseline rounds)"
    )
    lines.append(_conclusion(changes, max_regression))
    return changes, lines


def _conclusion(changes: Sequence[Change], max_regression: float) -> str:
    regressed = [c for c in changes if c.regressed]
    if not regressed:
        return (
            f"ckptqual compare: no regression beyond its noise band and {max_regression:.0%} in {len(changes)} metrics"
        )
    listed = ", ".join(
        f"{c.name} {c.change:+.1%} (band {'n/a' if c.band is None else f'±{c.band:.1%}'})" for c in regressed
    )
    return (
        f"ckptqual compare: REGRESSION: {len(regressed)} of {len(changes)} metrics worse beyond their noise band "
        f"and {max_regression:.0%}: {listed}"
    )
