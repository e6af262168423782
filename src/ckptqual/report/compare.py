"""The regression gate: two runs' records compared metric by metric. Each change is judged against a noise band that
comes from what the two runs themselves measured (their rounds, checkpoints and cells) and against an allowed
percentage; a metric regresses only when it is worse beyond both. Host-bound figures are not judged."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from statistics import fmean, stdev
from typing import Any

from ckptqual.report.extract import Run, measured_cells, passes, steady_rounds
from ckptqual.report.summary import table

STANDARD_ERRORS = 3.0  # the band is at least this many standard errors of the difference of the two means
NOISE_FLOOR = 0.05  # and never narrower than this fraction of the base figure
RULE = (
    f"noise band: the widest of {STANDARD_ERRORS:g} standard errors of the difference of the means, either run's "
    f"own min-max spread of its rounds, and {NOISE_FLOOR:.0%} (a single-round figure takes the relative noise of its "
    "run's raw baseline rounds); host-bound figures are not judged"
)


class CompareError(ValueError):
    """A bad argument of `ckptqual compare`, naming the value and the fix."""


@dataclass(frozen=True)
class Noise:
    """A figure's relative noise in one run: the standard error of its mean and the min-max spread of its rounds,
    both as fractions of the mean."""

    standard_error: float
    spread: float


@dataclass(frozen=True)
class Metric:
    """One figure of a run with its rounds; a single-round figure borrows the relative noise of the run's raw
    baseline rounds (`noise_from`), the drive's own variation measured in the same run. `host_bound` says why the
    figure measured the host rather than the drive, where it did."""

    name: str
    unit: str
    rounds: tuple[float, ...]
    noise_from: str | None = None
    host_bound: str | None = None

    @property
    def mean(self) -> float:
        return fmean(self.rounds)

    def own_noise(self) -> Noise | None:
        """The noise of its own rounds; None with fewer than two, or a mean of zero."""
        if len(self.rounds) < 2 or self.mean <= 0:
            return None
        standard_error = stdev(self.rounds) / math.sqrt(len(self.rounds)) / self.mean
        return Noise(standard_error, (max(self.rounds) - min(self.rounds)) / self.mean)


@dataclass(frozen=True)
class Change:
    """A metric of both runs: the relative change, its noise band, and whether it regressed."""

    name: str
    unit: str
    base: float
    new: float
    change: float  # (new - base) / base; every metric is higher-is-better
    band: float | None  # relative half-width; None: not judged (host-bound, or no rounds to tell the noise)
    regressed: bool
    word: str


def _round_host_bound(rounds: Sequence[dict[str, Any]]) -> str | None:
    return next((entry["host_bound"] for entry in rounds if entry.get("host_bound")), None)


def run_metrics(data: dict[str, Any]) -> dict[str, Metric]:
    """Every comparable figure of a record by name: raw baseline, per pass, steady state, restore, sweep cells,
    odd layouts; all throughputs (or ratios of throughputs), so higher is better."""
    found: list[Metric] = []
    baseline = data.get("baseline", {})
    host = baseline.get("host", {})
    for key, name, kind in (("write_GBps", "raw_write", "write"), ("read_GBps", "raw_read", "read")):
        if baseline.get(key):
            found.append(Metric(name, "GB/s", tuple(baseline[key]), None, _round_host_bound(host.get(kind, []))))
    bound = {result["pass"]: result.get("host_bound") for result in data.get("passes", [])}
    for number, checkpoints in passes(data).items():
        rounds = tuple(c["GBps"] for c in checkpoints)
        found.append(Metric(f"pass{number}", "GB/s", rounds, "raw_write", bound.get(number)))
    if steady_rounds(data):
        steady_bound = next((why for number, why in sorted(bound.items()) if number >= 2 and why), None)
        found.append(Metric("steady", "GB/s", tuple(steady_rounds(data)), "raw_write", steady_bound))
    if data.get("restore"):
        rounds = tuple(r["GBps"] for r in data["restore"])
        found.append(Metric("restore", "GB/s", rounds, "raw_read", _round_host_bound(data["restore"])))
    found += [
        Metric(f"sweep.{c['id']}", "GiB/s", (c["GiBps"],), "raw_read", c.get("host_bound"))
        for c in measured_cells(data)
    ]
    judged = [layout["ratio"] for layout in data.get("layouts", []) if layout.get("judged")]
    if judged:
        found.append(Metric("layouts.ratio", "ratio", tuple(judged), "raw_write"))
        found.append(Metric("layouts.slowest_ratio", "ratio", (min(judged),), "raw_write"))
    return {metric.name: metric for metric in found if metric.rounds}


def _noise(metric: Metric, metrics: dict[str, Metric]) -> Noise | None:
    """The metric's relative noise, from its rounds, else from its run's raw baseline rounds."""
    if len(metric.rounds) >= 2:
        return metric.own_noise()
    source = metrics.get(metric.noise_from or "")
    return source.own_noise() if source is not None else None


def noise_band(base: Noise, new: Noise) -> float:
    """The relative half-width within which two means are alike: the widest of STANDARD_ERRORS standard errors of
    their difference, either run's min-max spread, and NOISE_FLOOR."""
    combined = STANDARD_ERRORS * math.hypot(base.standard_error, new.standard_error)
    return max(combined, base.spread, new.spread, NOISE_FLOOR)


def compare_metric(name: str, base: dict[str, Metric], new: dict[str, Metric], max_regression: float) -> Change:
    """The change of metric `name` from `base` to `new`; `max_regression` is a fraction (0.05 for 5 %)."""
    b, n = base[name], new[name]
    change = (n.mean - b.mean) / b.mean if b.mean else (0.0 if n.mean == b.mean else math.inf)
    unjudged = Change(name, b.unit, b.mean, n.mean, change, None, False, "")
    if b.host_bound or n.host_bound:
        return replace(unjudged, word="host-bound: not judged")
    noises = _noise(b, base), _noise(n, new)
    if noises[0] is None or noises[1] is None:
        return replace(unjudged, word="no rounds to tell its noise: not judged")
    band = noise_band(noises[0], noises[1])
    if change < 0 and -change > band and -change > max_regression:
        return replace(unjudged, band=band, regressed=True, word="REGRESSION")
    if abs(change) <= band:
        word = "within noise"
    else:
        word = "better" if change > 0 else f"worse, within the allowed {max_regression:.0%}"
    return replace(unjudged, band=band, word=word)


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


def _host_bound_lines(names: Sequence[str], base: dict[str, Metric], new: dict[str, Metric]) -> list[str]:
    """Why each host-bound metric was left out, per run."""
    lines = []
    for name in names:
        for which, metrics in (("base", base), ("new", new)):
            if metrics[name].host_bound:
                lines.append(f"{name} not judged: {which} {metrics[name].host_bound}")
    return lines


def _shown(value: float, unit: str) -> str:
    return f"{value:.4g} {unit}"


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
    lines += _host_bound_lines([c.name for c in changes if c.word.startswith("host-bound")], base_metrics, new_metrics)
    lines += [f"{name}: only in {'base' if name in base_metrics else 'new'}" for name in chosen if name not in both]
    lines.append(RULE)
    lines.append(_conclusion(changes, max_regression))
    return changes, lines


def _conclusion(changes: Sequence[Change], max_regression: float) -> str:
    judged = [c for c in changes if c.band is not None]
    left_out = f" ({len(changes) - len(judged)} not judged)" if len(judged) < len(changes) else ""
    regressed = [c for c in changes if c.regressed]
    if not regressed:
        return (
            f"ckptqual compare: no regression beyond its noise band and {max_regression:.0%} in {len(judged)} "
            f"judged metrics{left_out}"
        )
    listed = ", ".join(
        f"{c.name} {c.change:+.1%} ({_shown(c.base, c.unit)} -> {_shown(c.new, c.unit)}, band ±{c.band:.1%})"
        for c in regressed
    )
    return (
        f"ckptqual compare: REGRESSION: {len(regressed)} of {len(judged)} judged metrics worse beyond their noise "
        f"band and {max_regression:.0%}: {listed}"
    )
