"""The report's figures, drawn with matplotlib (Agg, no display) from results records alone; given several runs,
each figure draws them side by side on the same axes, as the review compared its two SSDs."""

from __future__ import annotations

import inspect
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ckptqual.limits.measurements import Measurement, axis_label, drawn_on
from ckptqual.limits.steady import slope, steady_state
from ckptqual.report.extract import Run, limit_in, limits_of, measured_cells, passes, steady_rounds

_SNIA = inspect.signature(steady_state).parameters  # the rule's bounds, declared once in limits/steady.py
_RANGE = _SNIA["max_range_fraction"].default
_EXCURSION = _SNIA["max_slope_excursion_fraction"].default
_STYLES = ("-", "--", ":", "-.")
_LEGEND_LINE = 80  # characters: a longer legend entry wraps rather than squeeze its axes away
_COLORS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7")


@dataclass(frozen=True)
class Drawn:
    """One figure of the report, or why it could not be drawn ("not recorded: ...")."""

    name: str
    title: str
    figure: Figure | None
    missing: str | None = None


def _figure(width: float = 9.0, height: float = 4.2, **kwargs: Any) -> Figure:
    figure = Figure(figsize=(width, height), layout="constrained", **kwargs)
    FigureCanvasAgg(figure)
    return figure


def outside_legend(axes: Any, **kwargs: Any) -> None:
    """The axes' legend to the right of its plotting area, never over the data, one entry per distinct text (a limit
    drawn over several bars is named once)."""
    handles, labels = axes.get_legend_handles_labels()
    wrapped = ["\n".join(textwrap.wrap(text, _LEGEND_LINE)) for text in labels]
    unique = dict(zip(wrapped, handles, strict=True))
    if unique:
        options = {"fontsize": "small", "loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
        axes.legend(list(unique.values()), list(unique), **{**options, **kwargs})


def _bar_offsets(count: int, group: float = 0.8) -> tuple[float, list[float]]:
    """The width of one run's bar and each run's offset within a group of `count` side by side, `group` wide."""
    width = group / count
    return width, [(index - (count - 1) / 2) * width for index in range(count)]


def checkpoint_times(runs: Sequence[Run]) -> Drawn:
    """Per-checkpoint write time (the slowest rank's) by pass, passes side by side; the limits drawn as times."""
    name, title = "checkpoint_times", "Per-checkpoint write time by pass"
    if not any(passes(run.data) for run in runs):
        return Drawn(name, title, None, "no checkpoint was recorded")
    figure = _figure()
    axes = figure.add_subplot()
    numbers = sorted({number for run in runs for number in passes(run.data)})
    per_pass = {n: max(len(passes(run.data).get(n, [])) for run in runs) for n in numbers}
    starts, position = {}, 0
    for number in numbers:
        starts[number] = position
        position += per_pass[number] + 1
    width, offsets = _bar_offsets(len(runs))
    for index, run in enumerate(runs):
        color = _COLORS[index % len(_COLORS)]
        for number, checkpoints in passes(run.data).items():
            xs = [starts[number] + i + offsets[index] for i in range(len(checkpoints))]
            label = run.label if number == numbers[0] else None
            axes.bar(xs, [c["seconds"] for c in checkpoints], width, color=color, label=label)
        _time_limits(axes, run, starts, per_pass, color, f" of {run.label}" if len(runs) > 1 else "")
    ticks = [starts[n] + i for n in numbers for i in range(per_pass[n])]
    axes.set_xticks(ticks, [str(i + 1) for n in numbers for i in range(per_pass[n])])
    for number in numbers:
        axes.text(
            starts[number] + (per_pass[number] - 1) / 2,
            -0.12,
            f"pass {number}",
            ha="center",
            transform=axes.get_xaxis_transform(),
        )
    axes.set_xlabel("checkpoint of the pass", labelpad=18)
    axes.set_ylabel(axis_label(name))
    axes.set_title(title)
    outside_legend(axes)
    return Drawn(name, title, figure)


def _as_seconds(entry: dict[str, Any], row: Measurement, nbytes: int) -> float | None:
    """A judged entry's bound as the seconds `nbytes` take: a duration as it is, a throughput as the time at that
    rate; None for any other kind (it has no time to draw)."""
    if row.kind == "duration":
        return limit_in(entry, "s")
    if row.kind == "throughput" and nbytes:
        rate = limit_in(entry, "B/s")
        return nbytes / rate if rate else None
    return None


def _limited_on(figure: str) -> dict[str, Measurement]:
    """The measurements the table draws on `figure` that a limit may name, by name."""
    return {row.name: row for row in drawn_on(figure) if row.limited}


def _time_limits(axes: Any, run: Run, starts: dict[int, int], per_pass: dict[int, int], color: str, whose: str) -> None:
    """Each pass's limits on the measurements the table draws here, as a time per checkpoint: a duration as it is,
    a throughput as the time one checkpoint of the run's size takes at that rate; `whose` names the run among
    several (a relative limit is a different time for each)."""
    checkpoint_bytes = run.data.get("plan", {}).get("total_bytes", 0)
    drawn = _limited_on("checkpoint_times")
    shown: set[str] = set()
    for entry in run.data.get("measurements", []):
        number = entry.get("context", {}).get("pass")
        row = drawn.get(entry["measurement"])
        if number not in starts or entry.get("limit_value") is None or row is None:
            continue
        seconds = _as_seconds(entry, row, checkpoint_bytes)
        if seconds is None:
            continue
        text = f"limit{whose}: {entry['limit']} ({entry['measurement']})"
        left = starts[number] - 0.45
        axes.hlines(
            seconds,
            left,
            left + per_pass[number] - 0.1,
            colors=color,
            linestyles="--",
            linewidth=1.2,
            label=None if text in shown else text,
        )
        shown.add(text)


def steady_window(runs: Sequence[Run]) -> Drawn:
    """The SNIA steady-state rounds (per-checkpoint GB/s of passes 2+), the window, its mean, 90 % and 110 % of
    the mean and the fitted line."""
    name, title = "steady_state", "Steady state (SNIA PTS): per-checkpoint GB/s of passes 2 and later"
    states = [(run, _last_state(run.data)) for run in runs]
    if not any(state and state.get("mean") for _, state in states):
        reasons = "; ".join(f"{run.label}: {(state or {}).get('reason', 'not recorded')}" for run, state in states)
        return Drawn(name, title, None, f"no steady-state window: {reasons}")
    figure = _figure()
    axes = figure.add_subplot()
    for index, (run, state) in enumerate(states):
        color = _COLORS[index % len(_COLORS)]
        rounds = steady_rounds(run.data)
        verdict = "" if not state else ("STEADY" if state["reached"] else "NOT STEADY")
        axes.plot(range(1, len(rounds) + 1), rounds, "o-", color=color, label=f"{run.label} {verdict}".rstrip())
        if not state or not state.get("mean"):
            continue
        window = len(state["window"])
        xs = list(range(len(rounds) - window + 1, len(rounds) + 1))
        mean = state["mean"]
        axes.axvspan(xs[0] - 0.3, xs[-1] + 0.3, color=color, alpha=0.08)
        axes.hlines(mean, xs[0], xs[-1], colors=color, linewidth=1.5)
        half = _RANGE / 2
        for bound in (1 - half, 1 + half):
            axes.hlines(mean * bound, xs[0], xs[-1], colors=color, linestyles=":", linewidth=1.2)
        fitted = slope(state["window"])
        centre = (xs[0] + xs[-1]) / 2
        axes.plot(
            [xs[0], xs[-1]],
            [mean + fitted * (xs[0] - centre), mean + fitted * (xs[-1] - centre)],
            "--",
            color=color,
            linewidth=1.2,
        )
    axes.set_xlabel("round (checkpoint of passes 2 and later)")
    axes.set_ylabel(axis_label(name))
    axes.set_title(title, fontsize="medium")
    note = (
        f"window shaded; solid: mean, dotted: {1 - _RANGE / 2:.0%} and {1 + _RANGE / 2:.0%} of the mean (range "
        f"<= {_RANGE:.0%}), dashed: fitted line (excursion <= {_EXCURSION:.0%})"
    )
    axes.text(0.01, 0.02, note, transform=axes.transAxes, fontsize="x-small")
    outside_legend(axes)
    return Drawn(name, title, figure)


def _last_state(data: dict[str, Any]) -> dict[str, Any] | None:
    states = data.get("steady_state") or {}
    return states[max(states, key=int)] if states else None


def restore_times(runs: Sequence[Run]) -> Drawn:
    """Seconds to read each restored checkpoint back, every byte verified; the restore limit as a time."""
    name, title = "restore", "Restore time (cold read, every byte verified)"
    if not any(run.data.get("restore") for run in runs):
        return Drawn(name, title, None, "no restore was recorded")
    figure = _figure(7.0 if len(runs) == 1 else 9.0, 4.0)
    axes = figure.add_subplot()
    width, offsets = _bar_offsets(len(runs), min(0.8, 0.3 * len(runs)))
    for index, run in enumerate(runs):
        color = _COLORS[index % len(_COLORS)]
        restored = run.data.get("restore", [])
        xs = [i + offsets[index] for i in range(len(restored))]
        bars = axes.bar(xs, [r["seconds"] for r in restored], width, color=color, label=run.label)
        axes.bar_label(bars, [f"{r['GBps']:.2f} GB/s" for r in restored], fontsize="small")
        for row in _limited_on(name).values():
            for entry in limits_of(run.data, row.name):
                seconds = _as_seconds(entry, row, restored[0]["bytes"]) if restored else None
                if seconds is not None:
                    whose = f" of {run.label}" if len(runs) > 1 else ""
                    label = f"limit{whose}: {entry['limit']} ({row.name})"
                    axes.axhline(seconds, color=color, linestyle="--", linewidth=1.2, label=label)
    count = max(len(run.data.get("restore", [])) for run in runs)
    labels = [f"checkpoint {r['checkpoint']}" for r in max((run.data.get("restore", []) for run in runs), key=len)]
    axes.set_xticks(range(count), labels)
    axes.set_xlim(-0.75, count - 0.25)
    axes.set_ylabel(axis_label(name))
    axes.set_title(title)
    outside_legend(axes)
    return Drawn(name, title, figure)


def _transfers(runs: Sequence[Run]) -> list[str]:
    return list(dict.fromkeys(cell["transfer"] for run in runs for cell in measured_cells(run.data)))


def _block_sizes(runs: Sequence[Run]) -> list[str]:
    cells = [cell for run in runs for cell in measured_cells(run.data)]
    return [size for _, size in sorted({(-cell["block_bytes"], cell["block_size"]) for cell in cells})]


def sweep_lines(runs: Sequence[Run]) -> Drawn:
    """Read bandwidth against thread count, one line per block size (and run), one panel per transfer type."""
    name, title = "sweep_bandwidth", "Read sweep: bandwidth against threads"
    transfers = _transfers(runs)
    if not transfers:
        return Drawn(name, title, None, _no_sweep(runs))
    figure = _figure(5.0 * len(transfers) + 1, 4.2)
    sizes = _block_sizes(runs)
    for panel, transfer in enumerate(transfers):
        axes = figure.add_subplot(1, len(transfers), panel + 1)
        for index, run in enumerate(runs):
            for size_index, size in enumerate(sizes):
                cells = sorted(
                    (c for c in measured_cells(run.data) if c["transfer"] == transfer and c["block_size"] == size),
                    key=lambda c: c["threads"],
                )
                if not cells:
                    continue
                color = _COLORS[size_index % len(_COLORS)]
                label = size if len(runs) == 1 else f"{size} {run.label}"
                axes.plot(
                    [c["threads"] for c in cells],
                    [c["GiBps"] for c in cells],
                    "o",
                    linestyle=_STYLES[index % len(_STYLES)],
                    color=color,
                    label=label,
                )
                _cell_limits(axes, run, transfer, size, color, f"limit of {label}")
        threads = sorted({c["threads"] for run in runs for c in measured_cells(run.data)})
        axes.set_xscale("log", base=2)
        axes.set_xticks(threads, [str(t) for t in threads])
        axes.set_xlabel("threads (I/O depth)")
        axes.set_ylabel(axis_label(name))
        axes.set_title(transfer)
        axes.set_ylim(bottom=0)
        outside_legend(axes, fontsize="x-small", title="block size", title_fontsize="x-small")
    figure.suptitle(title)
    return Drawn(name, title, figure)


def _cell_limits(axes: Any, run: Run, transfer: str, size: str, color: str, label: str) -> None:
    """The limits on this block size's cells as markers at their thread counts, under one legend entry `label` of
    their own, so a limit is read as its block size's and no other's."""
    markers = []
    for row in _limited_on("sweep_bandwidth").values():
        for entry in limits_of(run.data, row.name):
            context = entry.get("context", {})
            if context.get("transfer") == transfer and context.get("block_size") == size:
                bound = limit_in(entry, row.unit)
                if bound is not None:
                    markers.append((context["threads"], bound))
    if markers:
        xs, ys = zip(*markers, strict=True)
        axes.plot(xs, ys, "v", linestyle="none", color=color, markersize=8, alpha=0.7, label=label)


def _no_sweep(runs: Sequence[Run]) -> str:
    engines = {transfer: why for run in runs for transfer, why in run.data.get("sweep", {}).get("engines", {}).items()}
    if not engines:
        return "no read sweep was recorded"
    return "no sweep cell was measured: " + "; ".join(f"{transfer}: {why}" for transfer, why in engines.items())


def sweep_heatmap(runs: Sequence[Run]) -> Drawn:
    """The sweep matrix (block sizes down, threads across, GiB/s) per transfer type and run, on one color scale."""
    name, title = "sweep_heatmap", "Read sweep matrix (GiB/s)"
    transfers = _transfers(runs)
    if not transfers:
        return Drawn(name, title, None, _no_sweep(runs))
    panels = [(run, transfer) for transfer in transfers for run in runs]
    figure = _figure(3.6 * len(panels) + 1.2, 3.6)
    sizes = _block_sizes(runs)
    threads = sorted({c["threads"] for run in runs for c in measured_cells(run.data)}, reverse=True)
    top = max(c["GiBps"] for run in runs for c in measured_cells(run.data))
    image = None
    for index, (run, transfer) in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), index + 1)
        cells = {
            (c["block_size"], c["threads"]): c["GiBps"] for c in measured_cells(run.data) if c["transfer"] == transfer
        }
        matrix = [[cells.get((size, t), float("nan")) for t in threads] for size in sizes]
        image = axes.imshow(matrix, cmap="viridis", vmin=0, vmax=top, aspect="auto")
        for row, size in enumerate(sizes):
            for column, t in enumerate(threads):
                value = cells.get((size, t))
                text = "-" if value is None else f"{value:.2f}"
                shade = "white" if value is None or value < top * 0.6 else "black"
                axes.text(column, row, text, ha="center", va="center", color=shade, fontsize="small")
        axes.set_xticks(range(len(threads)), [str(t) for t in threads])
        axes.set_yticks(range(len(sizes)), sizes)
        axes.set_xlabel("threads")
        axes.set_title(f"{transfer}\n{run.label}" if len(runs) > 1 else transfer, fontsize="small")
    if image is None:
        raise ValueError(f"{name}: the sweep of {len(runs)} runs gave no panel to draw")
    figure.colorbar(image, ax=figure.axes, label="GiB/s", shrink=0.9)
    figure.suptitle(title)
    return Drawn(name, title, figure)


def layout_ratios(runs: Sequence[Run]) -> Drawn:
    """Each odd layout's write throughput as a ratio of its regular twin's; layouts too small to judge hatched."""
    name, title = "layouts", "Odd shard layouts: throughput ratio to a regular layout of the same size"
    if not any(run.data.get("layouts") for run in runs):
        return Drawn(name, title, None, "no odd layout was recorded")
    figure = _figure(8.0, 4.0)
    axes = figure.add_subplot()
    width, offsets = _bar_offsets(len(runs))
    for index, run in enumerate(runs):
        color = _COLORS[index % len(_COLORS)]
        for layout in (entry for entry in run.data.get("layouts", []) if "ratio" in entry):
            judged = layout.get("judged", False)
            axes.bar(
                layout["example"] + offsets[index],
                layout["ratio"],
                width,
                color=color if judged else "none",
                edgecolor=color,
                hatch=None if judged else "//",
                label=run.label if layout["example"] == 0 else None,
            )
        for row in _limited_on(name).values():
            for entry in limits_of(run.data, row.name):
                bound = limit_in(entry, row.unit)
                if bound is not None:
                    axes.axhline(bound, color="black", linestyle="--", linewidth=1.2, label=f"limit: {entry['limit']}")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    count = max(len(run.data.get("layouts", [])) for run in runs)
    axes.set_xticks(range(count), [str(i) for i in range(count)])
    axes.set_xlabel("layout (hatched: under 16 MiB, verified but not judged)")
    axes.set_ylabel(axis_label(name))
    axes.set_title(title, fontsize="medium")
    outside_legend(axes)
    return Drawn(name, title, figure)


def device_timeseries(runs: Sequence[Run]) -> Drawn:
    """The device's own counters second by second (host/sampler.py): write and read MB/s per device, CPU use and
    memory; passes and the other phases shaded, checkpoint ends dotted, where the run recorded a time series."""
    name, title = "timeseries", "Device counters over time"
    recorded = [(run, run.data["timeseries"]) for run in runs if run.data.get("timeseries", {}).get("samples")]
    if not recorded:
        why = "; ".join(
            f"{run.label}: {run.data.get('timeseries', {}).get('unavailable', 'the results hold no time series')}"
            for run in runs
        )
        return Drawn(name, title, None, f"not recorded: {why}")
    figure = _figure(10.0, 9.0)
    panels = [figure.add_subplot(4, 1, 1)]
    panels += [figure.add_subplot(4, 1, row, sharex=panels[0]) for row in (2, 3, 4)]
    write_axes, read_axes, cpu_axes, memory_axes = panels
    for index, (run, series) in enumerate(recorded):
        color = _COLORS[index % len(_COLORS)]
        samples = series["samples"]
        times = [s["t_s"] for s in samples]
        for device_index, device in enumerate(series.get("devices") or _devices(samples)):
            style = _STYLES[device_index % len(_STYLES)]
            label = f"{run.label} {device}" if len(recorded) > 1 else device
            for axes, key in ((write_axes, "write_MBps"), (read_axes, "read_MBps")):
                values = [s.get("devices", {}).get(device, {}).get(key, math.nan) for s in samples]
                axes.plot(times, values, linestyle=style, color=color, linewidth=1, label=label)
        prefix = f"{run.label} " if len(recorded) > 1 else ""
        for key, style, text in (("cpu_busy", "-", "busy"), ("cpu_iowait", ":", "iowait")):
            values = [100 * s[key] if s.get(key) is not None else math.nan for s in samples]
            cpu_axes.plot(times, values, linestyle=style, color=color, linewidth=1, label=prefix + text)
        for key, style, text in (("mem_used_bytes", "-", "used"), ("dirty_bytes", ":", "dirty")):
            values = [s[key] / 1e9 if s.get(key) is not None else math.nan for s in samples]
            memory_axes.plot(times, values, linestyle=style, color=color, linewidth=1, label=prefix + text)
        _marks(panels, series.get("marks", []), color, shade=len(recorded) == 1)
    for axes, text in zip(panels, ("write MB/s", "read MB/s", "CPU %", "memory GB"), strict=True):
        axes.set_ylabel(text)
        outside_legend(axes, fontsize="x-small")
    memory_axes.set_xlabel("seconds since sampling began")
    write_axes.set_title(title + " (phases shaded, checkpoint ends dotted)")
    return Drawn(name, title, figure)


def _devices(samples: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(device for sample in samples for device in sample.get("devices", {})))


_PHASE_COLORS = {"pass": "C0", "baseline": "grey", "restore": "C2"}


def _marks(panels: Sequence[Any], marks: Sequence[dict[str, Any]], color: str, shade: bool) -> None:
    """Passes, the baseline and the restore as shaded spans (for a single run), checkpoint ends as dotted lines."""
    for mark in marks:
        event = mark.get("event")
        if event == "checkpoint":
            for axes in panels[:2]:
                axes.axvline(mark["t_s"], color=color, linestyle=":", linewidth=0.7)
        elif shade and event in _PHASE_COLORS and mark.get("start_s") is not None:
            for axes in panels:
                axes.axvspan(mark["start_s"], mark["end_s"], color=_PHASE_COLORS[event], alpha=0.08)
            text = f" pass {mark['pass']}" if event == "pass" else f" {event}"
            panels[0].text(
                mark["start_s"], 0.98, text, transform=panels[0].get_xaxis_transform(), fontsize="x-small", va="top"
            )


_PHASES = ("mkdir", "write", "fsync", "commit")  # a checkpoint's phases on a rank, in the order it runs them
_PHASE_SHADES = {"mkdir": "0.75", "write": "C0", "fsync": "C1", "commit": "C3"}


def _all_checkpoints(run: Run) -> list[dict[str, Any]]:
    return [c for checkpoints in passes(run.data).values() for c in checkpoints]


def _slowest_rank(checkpoint: dict[str, Any]) -> dict[str, Any]:
    return max(checkpoint.get("ranks") or [{}], key=lambda rank: rank.get("done_s", 0.0))


def checkpoint_phases(runs: Sequence[Run]) -> Drawn:
    """Each checkpoint's time on its slowest rank as its phases stacked: make directories, write, fsync and the
    metadata commit (directory fsyncs and renames); one panel per run."""
    name, title = "checkpoint_phases", "What a checkpoint's time is made of (slowest rank)"
    timed = [run for run in runs if any(_slowest_rank(c).get("phases") for c in _all_checkpoints(run))]
    if not timed:
        return Drawn(name, title, None, "not recorded: no checkpoint's phases were timed")
    figure = _figure(9.0, 2.2 + 2.2 * len(timed))
    for panel, run in enumerate(timed):
        axes = figure.add_subplot(len(timed), 1, panel + 1)
        checkpoints = _all_checkpoints(run)
        bottom = [0.0] * len(checkpoints)
        for phase in _PHASES:
            heights = [_slowest_rank(c).get("phases", {}).get(phase, 0.0) for c in checkpoints]
            if any(heights):
                axes.bar(range(len(checkpoints)), heights, 0.7, bottom=bottom, color=_PHASE_SHADES[phase], label=phase)
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        labels = [f"{c['pass_number']}.{i + 1}" for i, c in enumerate(checkpoints)]
        axes.set_xticks(range(len(checkpoints)), labels, fontsize="small")
        axes.set_ylabel("seconds")
        axes.set_title(f"{run.label}", fontsize="small")
        axes.legend(fontsize="small", ncols=4)
    figure.axes[-1].set_xlabel("checkpoint (pass.index)")
    figure.suptitle(title)
    return Drawn(name, title, figure)


def rank_spread(runs: Sequence[Run]) -> Drawn:
    """Per phase, each checkpoint's spread across its ranks: the median rank's seconds, the 99th percentile's and
    the slowest's; a wide band is a rank held back (one panel per phase, runs in their colors)."""
    name, title = "rank_spread", "Per-rank spread of each phase (median, p99, max across ranks)"
    shown = [p for p in _PHASES if any(p in c.get("phases", {}) for run in runs for c in _all_checkpoints(run))]
    if not shown:
        return Drawn(name, title, None, "not recorded: no checkpoint's phases were timed")
    figure = _figure(9.0, 1.0 + 2.0 * len(shown))
    for panel, phase in enumerate(shown):
        axes = figure.add_subplot(len(shown), 1, panel + 1)
        for index, run in enumerate(runs):
            color = _COLORS[index % len(_COLORS)]
            spreads = [c.get("phases", {}).get(phase) for c in _all_checkpoints(run)]
            xs = [x for x, spread in enumerate(spreads) if spread]
            values = [spread for spread in spreads if spread]
            if not values:
                continue
            medians = [v["median"] for v in values]
            prefix = f"{run.label}: " if len(runs) > 1 else ""
            axes.fill_between(xs, medians, [v["max"] for v in values], color=color, alpha=0.2)
            axes.plot(xs, medians, color=color, marker="o", markersize=3, label=f"{prefix}median")
            axes.plot(xs, [v["p99"] for v in values], color=color, linestyle=":", label=f"{prefix}p99")
            axes.plot(xs, [v["max"] for v in values], color=color, linestyle="--", label=f"{prefix}max")
        axes.set_ylabel(f"{phase} s")
    handles, labels = figure.axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=3 if len(runs) == 1 else 2, fontsize="x-small")
    figure.axes[-1].set_xlabel("checkpoint of the run")
    figure.suptitle(title)
    return Drawn(name, title, figure)


def cadence(runs: Sequence[Run]) -> Drawn:
    """A training cadence checkpoint by checkpoint: the stall (staging and any wait under async save, the whole save
    otherwise) stacked on the compute interval kept before it, and when the checkpoint was durable."""
    name, title = "cadence", "Training cadence: stall, compute interval and time to durable per checkpoint"
    kept = [run for run in runs if any(c.get("interval_s") for c in _all_checkpoints(run))]
    if not kept:
        return Drawn(name, title, None, "not recorded: the checkpoints were written back to back")
    figure = _figure()
    axes = figure.add_subplot()
    width, offsets = _bar_offsets(len(kept))
    for index, run in enumerate(kept):
        color = _COLORS[index % len(_COLORS)]
        checkpoints = _all_checkpoints(run)
        xs = [i + offsets[index] for i in range(len(checkpoints))]
        intervals = [c.get("interval_s") or 0.0 for c in checkpoints]
        waits = [c.get("wait_s", 0.0) for c in checkpoints]
        stalls = [c.get("stall_s", 0.0) - w for c, w in zip(checkpoints, waits, strict=True)]
        mode = "async" if any(c.get("async_save") for c in checkpoints) else "sync"
        axes.bar(xs, intervals, width, color=color, alpha=0.25, label=f"{run.label} ({mode}): compute interval")
        axes.bar(
            xs, waits, width, bottom=intervals, color="C3", label="wait for the previous save" if index == 0 else None
        )
        bottoms = [i + w for i, w in zip(intervals, waits, strict=True)]
        axes.bar(
            xs,
            stalls,
            width,
            bottom=bottoms,
            color=color,
            label=f"{run.label}: {'staging' if mode == 'async' else 'save'}",
        )
        durable = [
            b + c.get("seconds_to_durable", 0.0) - w for b, c, w in zip(bottoms, checkpoints, waits, strict=True)
        ]
        axes.plot(xs, durable, linestyle="none", marker="v", color="k", label="durable" if index == 0 else None)
    axes.set_xlabel("checkpoint of the run")
    axes.set_ylabel("seconds from the end of the last stall")
    axes.set_title(title)
    axes.legend(fontsize="small")
    return Drawn(name, title, figure)


FIGURES: tuple[Callable[[Sequence[Run]], Drawn], ...] = (
    checkpoint_times,
    steady_window,
    restore_times,
    sweep_lines,
    sweep_heatmap,
    layout_ratios,
    device_timeseries,
    checkpoint_phases,
    rank_spread,
    cadence,
)


def draw_all(runs: Sequence[Run]) -> list[Drawn]:
    """Every figure of the report, in the page's order."""
    return [draw(runs) for draw in FIGURES]
