"""The regression gate: two runs' records compared metric by metric, each change against the noise band of what the
two runs themselves measured (report.noise) and an allowed percentage; a metric regresses only when it is worse
beyond both. Host-bound figures measured the host, not the drive: they are not judged, and the report says why."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from statistics import fmean
from typing import Any, NamedTuple

from ckptqual.limits.measurements import MEASUREMENTS, Measurement, field, recorded
from ckptqual.report.extract import Run, measured_cells, passes, steady_rounds
from ckptqual.report.gate import Required, exit_code, fix_for, matching, required_metrics
from ckptqual.report.noise import (
    RULE,
    Noise,
    band,
    mean_noise,
    paired,
    pairs_to_resolve,
    rounds_to_resolve,
    single_noise,
)
from ckptqual.report.summary import table

SWEEP = "sweep"  # the read sweep's cells together, compared in pairs


class CompareError(ValueError):
    """A bad argument of `ckptqual compare`, naming the value and the fix."""


@dataclass(frozen=True)
class Metric:
    """One figure of a run with its rounds, of the table's `measurement` (its unit and direction); a single-round
    figure borrows the spread of one round of a related figure of the same run (`noise_from`). `host_bound` says
    why the figure measured the host, where it did."""

    name: str
    measurement: str
    rounds: tuple[float, ...]
    noise_from: str | None = None
    host_bound: str | None = None

    @property
    def row(self) -> Measurement:
        return MEASUREMENTS[self.measurement]

    @property
    def unit(self) -> str:
        return self.row.unit

    @property
    def mean(self) -> float:
        return fmean(self.rounds)


@dataclass(frozen=True)
class Change:
    """A metric of both runs: the relative change, its noise band, and whether it regressed (a change for the worse
    in its measurement's direction)."""

    name: str
    measurement: str
    base: float
    new: float
    change: float  # (new - base) / base
    band: float | None  # relative half-width; None: not judged (host-bound, or no rounds to tell the noise)
    regressed: bool
    word: str
    resolved: bool = False  # judged with a band no wider than the allowance (a regression is always resolved)
    rounds: int = 0  # the rounds (pairs, for the sweep) the band rests on, the fewer of the two runs'
    needed: int | None = None  # the rounds that would narrow the band to the allowance; None: none would

    @property
    def unit(self) -> str:
        return MEASUREMENTS[self.measurement].unit


def _round_host_bound(rounds: Sequence[dict[str, Any]]) -> str | None:
    return next((entry["host_bound"] for entry in rounds if entry.get("host_bound")), None)


def _rounds(items: Sequence[dict[str, Any]], measurement: str) -> tuple[float, ...]:
    """The values of `measurement` the recorded `items` hold, at the field its row's record path names."""
    key = field(MEASUREMENTS[measurement])
    return tuple(item[key] for item in items if key in item)


def run_metrics(data: dict[str, Any]) -> dict[str, Metric]:
    """Every comparable figure of a record by name, each of a measurement of the table: the raw baseline's rounds,
    each pass's per-checkpoint rates and times, the steady-state rounds, restore, sweep cells, odd layouts."""
    found: list[Metric] = []
    host = data.get("baseline", {}).get("host", {})
    for name, kind in (("raw_write", "write"), ("raw_read", "read")):
        rounds = tuple(recorded(data, MEASUREMENTS[name]))
        found.append(Metric(name, name, rounds, None, _round_host_bound(host.get(kind, []))))
    bound = {result["pass"]: result.get("host_bound") for result in data.get("passes", [])}
    for number, checkpoints in passes(data).items():
        rates = _rounds(checkpoints, "checkpoint_throughput")
        found.append(Metric(f"pass{number}", "checkpoint_throughput", rates, "raw_write", bound.get(number)))
        seconds = _rounds(checkpoints, "checkpoint_seconds")
        found.append(Metric(f"pass{number}.seconds", "checkpoint_seconds", seconds, None, bound.get(number)))
    steady_bound = next((why for number, why in sorted(bound.items()) if number >= 2 and why), None)
    found.append(Metric("steady", "checkpoint_throughput", tuple(steady_rounds(data)), "raw_write", steady_bound))
    restored = data.get("restore", [])
    restore_bound = _round_host_bound(restored)
    found.append(
        Metric("restore", "restore_throughput", _rounds(restored, "restore_throughput"), "raw_read", restore_bound)
    )
    found += [
        Metric(f"{SWEEP}.{cell['id']}", "sweep_read_bandwidth", _rounds([cell], "sweep_read_bandwidth"), None,
               cell.get("host_bound"))
        for cell in measured_cells(data)
    ]  # fmt: skip
    judged = _rounds([layout for layout in data.get("layouts", []) if layout.get("judged")], "layout_throughput_ratio")
    found.append(Metric("layouts.ratio", "layout_throughput_ratio", judged, "raw_write"))
    found.append(
        Metric("layouts.slowest_ratio", "layout_throughput_ratio", (min(judged),) if judged else (), "layouts.ratio")
    )
    return {metric.name: metric for metric in found if metric.rounds}


def _noise(metric: Metric, metrics: dict[str, Metric]) -> Noise | None:
    """The metric's noise, from its rounds, else from one round of its run's related figure."""
    if len(metric.rounds) >= 2:
        return mean_noise(metric.rounds)
    source = metrics.get(metric.noise_from or "")
    return single_noise(metric.mean, source.rounds) if source is not None else None


def _unjudged(name: str, b: Metric, n: Metric) -> Change:
    change = (n.mean - b.mean) / b.mean if b.mean else (0.0 if n.mean == b.mean else math.inf)
    return Change(name, b.measurement, b.mean, n.mean, change, None, False, "")


def _judged(change: Change, width: float, max_regression: float) -> Change:
    """`change` judged against a band of relative half-width `width` and the allowance, in the direction its
    measurement is better (a time that rises is worse, a throughput that falls). A band wider than the allowance
    leaves a change that is not a regression unresolved: a drop as large as the allowance could hide in it."""
    worse, size = MEASUREMENTS[change.measurement].worse(change.change), abs(change.change)
    if worse and size > width and size > max_regression:
        return replace(change, band=width, regressed=True, word="REGRESSION", resolved=True)
    if width > max_regression:
        better = "better, but " if not worse and size > width else ""
        return replace(change, band=width, word=f"{better}not resolved: detects only ±{width:.1%}")
    if size <= width:
        return replace(change, band=width, word="within noise", resolved=True)
    word = f"worse, within the allowed {max_regression:.0%}" if worse else "better"
    return replace(change, band=width, word=word, resolved=True)


def _spread(noise: Noise, rounds: int, base_mean: float) -> float:
    """The standard deviation of one round, relative to the base figure, from the noise of `rounds` rounds."""
    return noise.standard_error * math.sqrt(rounds) / base_mean


def compare_metric(name: str, base: dict[str, Metric], new: dict[str, Metric], max_regression: float) -> Change:
    """The change of metric `name` from `base` to `new`; `max_regression` is a fraction (0.05 for 5 %)."""
    b, n = base[name], new[name]
    unjudged = _unjudged(name, b, n)
    if b.host_bound or n.host_bound:
        return replace(unjudged, word="host-bound: not judged")
    noises = _noise(b, base), _noise(n, new)
    if noises[0] is None or noises[1] is None or b.mean <= 0:
        return replace(unjudged, word="no rounds to tell its noise: not judged")
    judged = _judged(unjudged, band(b.mean, noises[0], noises[1]), max_regression)
    rounds = min(len(b.rounds), len(n.rounds))
    if judged.resolved:
        return replace(judged, rounds=rounds)
    spreads = (_spread(noises[0], len(b.rounds), b.mean), _spread(noises[1], len(n.rounds), b.mean))
    return replace(judged, rounds=rounds, needed=rounds_to_resolve(spreads, max_regression))


def compare_cells(
    names: Sequence[str], base: dict[str, Metric], new: dict[str, Metric], max_regression: float
) -> list[Change]:
    """The sweep cells among `names`, each judged against the spread of the log ratios of every cell both runs
    measured without being host-bound, and those cells together as `sweep` (their geometric means)."""
    cells = [name for name in names if name.startswith(f"{SWEEP}.")]
    fair = [name for name in cells if not (base[name].host_bound or new[name].host_bound)]
    ratios = [math.log(new[name].mean / base[name].mean) for name in fair if base[name].mean > 0 < new[name].mean]
    pairs = paired(ratios) if len(ratios) == len(fair) else None
    changes = []
    for name in cells:
        unjudged = _unjudged(name, base[name], new[name])
        if name not in fair:
            changes.append(replace(unjudged, word="host-bound: not judged"))
        elif pairs is None:
            changes.append(replace(unjudged, word="too few cells to tell their noise: not judged"))
        else:
            changes.append(replace(_judged(unjudged, pairs.single_band, max_regression), rounds=1))
    if pairs is not None:
        means = [math.exp(fmean(math.log(metrics[name].mean) for name in fair)) for metrics in (base, new)]
        whole = _judged(
            Change(SWEEP, base[fair[0]].measurement, means[0], means[1], pairs.change, None, False, ""),
            pairs.band,
            max_regression,
        )
        needed = None if whole.resolved else pairs_to_resolve(ratios, max_regression)
        changes.append(replace(whole, rounds=len(ratios), needed=needed))
    return changes


def select(names: Sequence[str], patterns: Sequence[str] | None) -> list[str]:
    """The metric names matching any of the glob `patterns` (all without); a pattern matching none is an error."""
    if not patterns:
        return list(names)
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name in names):
            raise CompareError(
                f"metric pattern {pattern!r}: matches no metric of either run; known: {', '.join(names)}"
            )
    return [name for name in names if any(fnmatchcase(name, pattern) for pattern in patterns)]


def parse_percentage(text: str) -> float:
    """'5%' or '5' -> 0.05; a bad value is a CompareError naming it."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value < 100):
        raise CompareError(f"max_regression {text!r}: give a percentage from 0 to under 100, e.g. 5%")
    return value / 100


def _differences(base: Run, new: Run) -> list[str]:
    """The settings two runs differ in that change what their figures mean."""
    keys = ("workload", "scale", "engine", "checkpoints_per_pass", "passes", "layout_seed", "layout_max_total_bytes")
    a, b = base.data.get("settings", {}), new.data.get("settings", {})
    return [f"{key} {a.get(key)} vs {b.get(key)}" for key in keys if a.get(key) != b.get(key)]


def _host_bound_lines(names: Sequence[str], base: dict[str, Metric], new: dict[str, Metric]) -> list[str]:
    """Why each host-bound metric was left out: the runs it was host-bound in and the first one's reason."""
    lines = []
    for name in names:
        runs = [(which, metrics[name].host_bound) for which, metrics in (("base", base), ("new", new))]
        bound = [(which, why) for which, why in runs if why]
        if bound:
            lines.append(f"{name} not judged: {' and '.join(which for which, _ in bound)} {bound[0][1]}")
    return lines


def _shown(value: float, unit: str) -> str:
    return f"{value:.4g} {unit}"


class Comparison(NamedTuple):
    """What `compare` found: every metric's change, the report's lines and the gate's exit code (report.gate)."""

    changes: list[Change]
    lines: list[str]
    exit_code: int


def compare_runs(
    base: Run,
    new: Run,
    max_regression: float = 0.05,
    patterns: Sequence[str] | None = None,
    require: Sequence[str] | None = None,
) -> Comparison:
    """Every selected metric's change, the lines of the report (a table, notes, one line per required metric the gate
    could not judge or resolve, and the conclusion) and the exit code."""
    base_metrics, new_metrics = run_metrics(base.data), run_metrics(new.data)
    names = list(dict.fromkeys([*base_metrics, *new_metrics]))
    known = [*names, SWEEP] if any(name.startswith(f"{SWEEP}.") for name in names) else names
    required = required_metrics([new.data, base.data], require)
    if require:
        select(known, require)  # a --require glob matching nothing is a usage error
    chosen = select(known, [*(patterns or ()), *(require or ())] if patterns else None)
    if SWEEP in chosen:  # the sweep as a whole is judged from its cells
        chosen = [name for name in names if name in chosen or name.startswith(f"{SWEEP}.")]
    both = [name for name in chosen if name in base_metrics and name in new_metrics]
    changes = [
        compare_metric(name, base_metrics, new_metrics, max_regression)
        for name in both
        if not name.startswith(f"{SWEEP}.")
    ]
    changes += compare_cells(both, base_metrics, new_metrics, max_regression)
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
    lines += table(["metric", "unit", "base", "new", "change", "detects", ""], rows) if rows else []
    lines += _host_bound_lines([c.name for c in changes if c.word.startswith("host-bound")], base_metrics, new_metrics)
    lines += [f"{name}: only in {'base' if name in base_metrics else 'new'}" for name in chosen if name not in both]
    gaps = _gaps(required, known, chosen, {c.name: c for c in changes}, (base_metrics, new_metrics), max_regression,
                 new.data.get("settings", {}))  # fmt: skip
    lines.append(RULE)
    lines += gaps
    regressed = [c for c in changes if c.regressed]
    lines.append(_conclusion(changes, regressed, len(gaps), _count(required, known), max_regression))
    return Comparison(changes, lines, exit_code(len(regressed), len(gaps)))


def _count(required: Sequence[Required], known: Sequence[str]) -> int:
    """How many metrics the gate must judge: each known one a required glob matches, and each glob matching none."""
    matched = {name for r in required for name in matching(known, r.pattern)}
    return len(matched) + sum(1 for r in required if not matching(known, r.pattern))


def _gaps(
    required: Sequence[Required],
    known: Sequence[str],
    chosen: Sequence[str],
    changes: dict[str, Change],
    runs: tuple[dict[str, Metric], dict[str, Metric]],
    allowed: float,
    settings: dict[str, Any],
) -> list[str]:
    """One line per required metric the gate did not judge, or judged without resolving it: why, and the fix."""
    lines, seen = [], set()
    for r in required:
        found = matching(known, r.pattern)
        if not found:
            lines.append(f"{r.pattern} INCONCLUSIVE: measured by neither run ({r.origin}); fix: run it in both")
        for name in found:
            if name in seen:
                continue
            seen.add(name)
            why = _gap(name, chosen, changes.get(name), runs, allowed, settings)
            if why:
                lines.append(f"{name} INCONCLUSIVE: {why} ({r.origin})")
    return lines


def _gap(
    name: str,
    chosen: Sequence[str],
    change: Change | None,
    runs: tuple[dict[str, Metric], dict[str, Metric]],
    allowed: float,
    settings: dict[str, Any],
) -> str | None:
    """Why the required metric `name` leaves the gate inconclusive, with the fix; None where it was judged and
    resolved, or regressed."""
    if name not in chosen and not (name == SWEEP and any(n.startswith(f"{SWEEP}.") for n in chosen)):
        return "left out by --metric; fix: select it too, or name what the gate must judge with --require"
    if change is None:
        if name == SWEEP:
            return (
                "too few of its cells were judged in both runs (host-bound, or measured by one run only) to tell its "
                "noise; fix: rerun both where at least 3 cells are measured and not host-bound"
            )
        only = "base" if name in runs[0] else "new"
        return f"measured only by the {only} run; fix: run its part in both"
    if change.regressed or change.resolved:
        return None
    if change.word.startswith("host-bound"):
        return "host-bound, so it measured the host; fix: rerun both where the run's processes get the CPUs they need"
    if change.band is None:
        return f"{change.word}; fix: rerun both with at least 2 rounds of it"
    return f"not resolved: detects only ±{change.band:.1%}, more than the allowed {allowed:.0%}; fix: " + fix_for(
        name, change.rounds, change.needed, allowed, settings
    )


def _conclusion(
    changes: Sequence[Change], regressed: Sequence[Change], gaps: int, required: int, max_regression: float
) -> str:
    judged = [c for c in changes if c.band is not None]
    if regressed:
        listed = ", ".join(
            f"{c.name} {c.change:+.1%} ({_shown(c.base, c.unit)} -> {_shown(c.new, c.unit)}, band ±{c.band:.1%})"
            for c in regressed
        )
        return (
            f"ckptqual compare: REGRESSION: {len(regressed)} of {len(judged)} judged metrics worse beyond their noise "
            f"band and {max_regression:.0%}: {listed}"
        )
    if gaps:
        return (
            f"ckptqual compare: INCONCLUSIVE: {gaps} of {required} required metrics not judged or not resolved at "
            f"{max_regression:.0%} (see above); none of the {len(judged)} judged metrics regressed"
        )
    return (
        f"ckptqual compare: no regression: all {required} required metrics judged and resolved (each detects a change "
        f"of {max_regression:.0%}); {len(judged)} of {len(changes)} metrics judged"
    )
