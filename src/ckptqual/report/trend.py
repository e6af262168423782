"""Results over time: many runs of one drive model (every firmware release, every new batch), each headline figure
against the run's date, with its spread and its limit; runs whose verdict was not QUALIFIED are marked."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckptqual.report.extract import Run
from ckptqual.report.figures import Drawn, _figure
from ckptqual.report.headlines import Headline, headline_key, headlines
from ckptqual.report.labels import model_of

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes

MIN_RUNS = 3  # two runs are a comparison (the side-by-side section); three or more make a trend
_COLUMNS = 3


def one_model(runs: Sequence[Run]) -> bool:
    """Whether the runs are enough runs of one drive model (by model, else by drive file) to draw a trend."""
    return len(runs) >= MIN_RUNS and len({model_of(run.data) for run in runs}) == 1


def _tick(run: Run) -> str:
    """The run's date and, where known, firmware: what tells one run of a model from the next."""
    started = str(run.data.get("started") or "")[:16].replace("T", " ") or run.path.name
    firmware = run.data.get("drive", {}).get("firmware")
    return f"{started}\nfw {firmware}" if firmware not in (None, "", "unknown") else started


def _verdict(run: Run) -> str:
    return str((run.data.get("verdict") or {}).get("overall", "INCOMPLETE"))


def over_time(runs: Sequence[Run]) -> Drawn:
    """One panel per headline figure, runs in the order they started."""
    name, title = "trend", f"Results over time: {len(runs)} runs of {model_of(runs[0].data) if runs else 'no drive'}"
    if not one_model(runs):
        return Drawn(name, title, None, f"a trend needs {MIN_RUNS} or more runs of one drive model")
    ordered = sorted(runs, key=lambda run: str(run.data.get("started") or ""))
    per_run = [{headline_key(h): h for h in headlines(run.data)} for run in ordered]
    keys = [key for key in dict.fromkeys(k for found in per_run for k in found) if sum(key in f for f in per_run) > 1]
    if not keys:
        return Drawn(name, title, None, "the runs share no headline figure")
    rows = math.ceil(len(keys) / _COLUMNS)
    figure = _figure(4.2 * _COLUMNS + 2.5, 3.0 * rows + 1.2)
    failed = [index for index, run in enumerate(ordered) if _verdict(run) != "QUALIFIED"]
    for panel, key in enumerate(keys):
        axes = figure.add_subplot(rows, _COLUMNS, panel + 1)
        points = [(index, found[key]) for index, found in enumerate(per_run) if key in found]
        _draw(axes, points, failed, ordered)
        unit = points[0][1].unit
        axes.set_title(key, fontsize="small")
        axes.set_ylabel(unit)
        axes.set_xticks(range(len(ordered)), [_tick(run) for run in ordered], fontsize="x-small", rotation=30)
        axes.set_xlim(-0.5, len(ordered) - 0.5)
        axes.set_ylim(bottom=0)
    entries: dict[str, Artist] = {}
    for axes in figure.axes:
        handles, labels = axes.get_legend_handles_labels()
        entries.update(zip(labels, handles, strict=True))
    figure.legend(list(entries.values()), list(entries), loc="outside right upper", fontsize="small")
    figure.suptitle(title)
    return Drawn(name, title, figure)


def _draw(axes: Axes, points: list[tuple[int, Headline]], failed: list[int], runs: Sequence[Run]) -> None:
    """The figure's means joined by a line, whiskers from lowest to highest, the limit of each run as a dash, and a
    red ring with its verdict on each run that did not qualify."""
    xs = [index for index, _ in points]
    means = [h.mean for _, h in points]
    errors = [[h.mean - h.low for _, h in points], [h.high - h.mean for _, h in points]]
    axes.errorbar(xs, means, yerr=errors, fmt="o-", color="C0", capsize=3, label="mean, lowest to highest")
    limits = [(index, h.limit) for index, h in points if h.limit is not None]
    if limits:
        axes.plot(*zip(*limits, strict=True), "_", color="black", markersize=14, markeredgewidth=2, label="limit")
    bad = [(index, h.mean) for index, h in points if index in failed]
    if bad:
        axes.plot(
            *zip(*bad, strict=True), "o", markersize=13, markerfacecolor="none", markeredgecolor="#c62828",
            markeredgewidth=2, label="verdict not QUALIFIED",
        )  # fmt: skip
        for index, mean in bad:
            axes.annotate(_verdict(runs[index]), (index, mean), xytext=(0, -16), textcoords="offset points",
                          ha="center", fontsize="xx-small", color="#c62828")  # fmt: skip
