"""Drives side by side, as the review compared its two SSDs: one bar per run per pass (mean seconds per checkpoint,
then GB/s, the spread from the fastest to the slowest checkpoint marked), the restore, and the read-sweep heatmaps on
one colour scale; legends outside the data, one entry per distinct limit."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ckptqual.report.extract import Run
from ckptqual.report.figures import _COLORS, Drawn, _bar_offsets, _figure, outside_legend, sweep_heatmap
from ckptqual.report.headlines import Headline, headlines, pass_rates, pass_seconds

SPREAD = "bar: mean; whiskers: fastest to slowest checkpoint"


def _same(values: Sequence[float]) -> bool:
    return all(math.isclose(value, values[0], rel_tol=1e-6) for value in values)


def _bars(
    runs: Sequence[Run],
    series: Sequence[dict[Any, Headline]],
    name: str,
    title: str,
    ylabel: str,
    group_label: Callable[[Any], str],
) -> Drawn:
    """One bar per run in each group (a pass, or the restore), its mean with whiskers from lowest to highest; each
    limit as a black dash over its bar, one legend entry whether the runs share it or each has its own."""
    groups = sorted({key for by_group in series for key in by_group})
    figure = _figure(max(6.0, 1.6 * len(groups) * max(1, len(runs)) / 2 + 4.0), 4.2)
    axes = figure.add_subplot()
    width, offsets = _bar_offsets(len(runs))
    for index, (run, by_group) in enumerate(zip(runs, series, strict=True)):
        color = _COLORS[index % len(_COLORS)]
        xs = [groups.index(key) + offsets[index] for key in by_group]
        values = list(by_group.values())
        axes.bar(
            xs,
            [h.mean for h in values],
            width,
            color=color,
            label=run.label,
            yerr=[[h.mean - h.low for h in values], [h.high - h.mean for h in values]],
            capsize=3,
            error_kw={"elinewidth": 1, "ecolor": "#333"},
        )
    for group in groups:
        limits = [
            (index, limit)
            for index, by_group in enumerate(series)
            if group in by_group and (limit := by_group[group].limit) is not None
        ]
        shared = len(limits) == len(runs) and _same([limit for _, limit in limits])
        for index, limit in limits:
            left = groups.index(group) + offsets[index] - width / 2
            label = "limit" if shared else "limit of the run under it"
            axes.hlines(limit, left, left + width, colors="black", linestyles="--", linewidth=2, label=label)
    axes.set_xticks(range(len(groups)), [group_label(key) for key in groups])
    axes.set_ylabel(ylabel)
    axes.set_ylim(bottom=0)
    axes.set_title(f"{title}\n{SPREAD}", fontsize="medium")
    outside_legend(axes)
    return Drawn(name, title, figure)


@dataclass(frozen=True)
class BarFigure:
    """One side-by-side bar figure: its name and title, what each run contributes (per group, a Headline), the y
    axis, how a group is labelled, and what the page says where no run has any."""

    name: str
    title: str
    series: Callable[[dict], dict[Any, Headline]]
    ylabel: str
    group_label: Callable[[Any], str]
    missing: str

    def __call__(self, runs: Sequence[Run]) -> Drawn:
        series = [self.series(run.data) for run in runs]
        if not any(series):
            return Drawn(self.name, self.title, None, self.missing)
        return _bars(runs, series, self.name, self.title, self.ylabel, self.group_label)


def _restore(data: dict) -> dict[Any, Headline]:
    return {h.name: h for h in headlines(data) if h.name == "restore GB/s"}


def _pass(number: Any) -> str:
    return f"pass {number}"


# Mean seconds per checkpoint (the slowest rank's) and mean GB/s per checkpoint, one bar per run per pass; the
# restore's GB/s (cold read, every byte verified), one bar per run.
pass_seconds_bars = BarFigure(
    "side_pass_seconds",
    "Mean seconds per checkpoint, by pass",
    pass_seconds,
    "seconds per checkpoint",
    _pass,
    "no checkpoint was recorded",
)
pass_rate_bars = BarFigure(
    "side_pass_GBps",
    "Mean GB/s per checkpoint, by pass",
    pass_rates,
    "GB/s (1e9 B/s)",
    _pass,
    "no checkpoint was recorded",
)
restore_bars = BarFigure(
    "side_restore",
    "Restore GB/s (cold read, every byte verified)",
    _restore,
    "GB/s (1e9 B/s)",
    lambda _: "restore",
    "no restore was recorded",
)

SIDE_BY_SIDE: tuple[Callable[[Sequence[Run]], Drawn], ...] = (
    pass_seconds_bars,
    pass_rate_bars,
    restore_bars,
    sweep_heatmap,  # the read sweep's matrix of each run, on one colour scale, each panel titled with its label
)


def draw_side_by_side(runs: Sequence[Run]) -> list[Drawn]:
    """The side-by-side figures of two or more runs; none for one."""
    return [draw(runs) for draw in SIDE_BY_SIDE] if len(runs) > 1 else []


def headline_table(runs: Sequence[Run]) -> tuple[list[str], list[list[Any]]]:
    """Headers and rows: one row per headline figure, per run its mean and its ratio to the first run's."""
    per_run = [{h.name.split(" (")[0]: h for h in headlines(run.data)} for run in runs]
    names = list(dict.fromkeys(name for found in per_run for name in found))
    headers = ["figure", "unit"]
    for index, run in enumerate(runs):
        headers += [run.label] + (["ratio to the first"] if index else [])
    rows = []
    for name in names:
        first = per_run[0].get(name)
        unit = next(found[name].unit for found in per_run if name in found)
        row: list[Any] = [name, unit]
        for index, found in enumerate(per_run):
            value = found[name].mean if name in found else "-"
            row.append(value)
            if index:
                ratio = value / first.mean if first and first.mean and isinstance(value, float) else "-"
                row.append(f"x{ratio:.2f}" if isinstance(ratio, float) else ratio)
        rows.append(row)
    return headers, rows
