"""MLPerf Storage's checkpointing metrics, drawn from the run record: per checkpoint written (the fill) and read (the
restore), the duration is the slowest rank's and the throughput the lowest per-rank rate (a rank's bytes / its own
seconds); each phase also gives their means, and several runs (MLPerf repeats a setup 5 times) the mean of those."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckptqual.report.extract import ResultsError, Run

PHASES = {"write": "checkpoints", "read": "restore"}  # MLPerf's phase -> the record's list of its checkpoints
MEANS = ("duration_mean_s", "throughput_mean_GBps", "throughput_mean_GiBps")
MLPERF_RUNS = 5  # MLPerf Storage reports the mean of 5 runs of a setup
DEFINITION = "duration = the slowest rank's seconds; throughput = the lowest per-rank bytes / that rank's own seconds"


def checkpoint_metrics(ranks: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """One checkpoint's figures from its per-rank records (`bytes`, `done_s` from the common start); ranks that
    moved no bytes have no rate and are left out of the minimum."""
    ranks = list(ranks)
    rates = [rank["bytes"] / rank["done_s"] for rank in ranks if rank["bytes"] > 0]
    slowest = min(rates) if rates else None
    return {
        "duration_s": max(rank["done_s"] for rank in ranks),
        "throughput_GBps": slowest / 1e9 if slowest is not None else None,
        "throughput_GiBps": slowest / 2**30 if slowest is not None else None,
    }


def phase_metrics(entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Each checkpoint's figures, in the order they ran, and their means (None where no checkpoint ran)."""
    checkpoints = [{"checkpoint": entry["checkpoint"], **checkpoint_metrics(entry["ranks"])} for entry in entries]
    means = {
        name: _mean(c[key] for c in checkpoints)
        for name, key in zip(MEANS, ("duration_s", "throughput_GBps", "throughput_GiBps"), strict=True)
    }
    return {"count": len(checkpoints), **means, "checkpoints": checkpoints}


def mlperf_metrics(data: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics of one run record: its written checkpoints (every fill pass) and its restores."""
    return {"definition": DEFINITION, **{phase: phase_metrics(data.get(key, [])) for phase, key in PHASES.items()}}


def mean_over_runs(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mean of each phase's means over several runs' metrics (MLPerf reports a setup run 5 times); `runs` counts
    the runs in which the phase ran."""
    means = {}
    for phase in PHASES:
        ran = [run[phase] for run in runs if run[phase]["count"]]
        means[phase] = {"runs": len(ran), **{name: _mean(metrics[name] for metrics in ran) for name in MEANS}}
    return means


def _mean(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.fmean(present) if present else None


PER_RANK = "per rank (each checkpoint's slowest rank, MLPerf's minimum across ranks)"


def phase_line(phase: str, metrics: Mapping[str, Any], count: str) -> str:
    """`write: 10 checkpoints, duration mean 12.340 s, throughput mean 0.1234 GB/s (0.1149 GiB/s) per rank (...)`:
    the throughput is one rank's, not the checkpoint's, and says so."""
    if metrics["duration_mean_s"] is None:
        return f"{phase}: none"
    rate = metrics["throughput_mean_GBps"]
    rate_text = (
        f"{rate:.4g} GB/s ({metrics['throughput_mean_GiBps']:.4g} GiB/s) {PER_RANK}" if rate is not None else "no rate"
    )
    return f"{phase}: {count}, duration mean {metrics['duration_mean_s']:.3f} s, throughput mean {rate_text}"


def _checkpoints_line(phase: str, metrics: Mapping[str, Any]) -> str:
    return phase_line(phase, metrics, f"{metrics['count']} checkpoints")


def mlperf_lines(metrics: Mapping[str, Any]) -> list[str]:
    """The summary's lines: the definition, then each phase's count and means."""
    return [f"MLPerf Storage metrics ({metrics['definition']}):"] + [
        f"  {_checkpoints_line(phase, metrics[phase])}" for phase in PHASES
    ]


def _per_checkpoint(checkpoints: Iterable[Mapping[str, Any]]) -> str:
    """`0: 1.200 s 0.8123 GB/s, 1: ...`."""
    texts = []
    for c in checkpoints:
        rate = f" {c['throughput_GBps']:.4g} GB/s" if c["throughput_GBps"] is not None else ""
        texts.append(f"{c['checkpoint']}: {c['duration_s']:.3f} s{rate}")
    return ", ".join(texts)


def runs_lines(runs: Sequence[Run]) -> list[str]:
    """`ckptqual mlperf`: each run's verdict, phases and checkpoints, then the mean over the runs; runs of different
    setups (workload, scale, checkpoints per phase) are refused, since their mean would mean nothing."""
    setups = {_setup(run.data) for run in runs}
    if len(setups) > 1:
        shown = "; ".join(f"{run.path}: {', '.join(map(str, _setup(run.data)))}" for run in runs)
        raise ResultsError(f"the runs are not of one setup (workload, scale, writes, reads): {shown}; give runs of one")
    metrics = [mlperf_metrics(run.data) for run in runs]
    lines = [f"MLPerf Storage checkpointing metrics ({DEFINITION})"]
    for run, found in zip(runs, metrics, strict=True):
        lines.append(f"{run.path} ({run.data.get('verdict', {}).get('overall', 'no verdict')}):")
        for phase in PHASES:
            lines.append(f"  {_checkpoints_line(phase, found[phase])}")
            if found[phase]["count"]:
                lines.append(f"    per checkpoint: {_per_checkpoint(found[phase]['checkpoints'])}")
    mean = mean_over_runs(metrics)
    note = "" if len(runs) == MLPERF_RUNS else f" (MLPerf Storage reports the mean of {MLPERF_RUNS} runs)"
    phases = "; ".join(phase_line(phase, mean[phase], f"{mean[phase]['runs']} runs") for phase in PHASES)
    return [*lines, f"mean over {len(runs)} runs{note}: {phases}"]


def _setup(data: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must be alike for runs to be averaged: workload, scale, and how many checkpoints each phase has."""
    settings = data.get("settings", {})
    counts = tuple(len(data.get(key, [])) for key in PHASES.values())
    return (settings.get("workload"), settings.get("scale"), *counts)
