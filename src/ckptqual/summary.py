"""The terminal summary of a run: per pass, checkpoints, mean and worst seconds, GB/s and verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptqual.qualification import Qualification

_ORDER = ("FAIL", "INVALID", "NOT_STEADY", "MARGINAL", "PASS", "MEASURED")


def worst_outcome(outcomes: list[str]) -> str:
    """The most severe of `outcomes` (MEASURED when nothing was judged)."""
    return min(outcomes, key=_ORDER.index, default="MEASURED")


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Right-aligned text columns."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    return [" ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)) for row in [headers, *rows]]


def summary_lines(qual: Qualification) -> list[str]:
    """What the run measured and decided, in a few lines."""
    data = qual.record.data
    settings = qual.settings
    lines = [
        f"drive {settings.thresholds.drive.name} ({settings.thresholds.path.name}); target {qual.target.path} "
        f"[{qual.identity.model}, fw {qual.identity.firmware}, {qual.identity.filesystem}]",
        f"workload {settings.plan.workload} at scale {settings.scale:g} ({settings.plan.total_bytes / 1e9:,.2f} GB "
        f"per checkpoint), engine {settings.engine}, fsync on, seed {settings.seed}",
    ]
    if "baseline" in data:
        base = data["baseline"]
        lines.append(
            f"raw sequential write {base['raw_write_GBps']:.2f} GB/s, read {base['raw_read_GBps']:.2f} GB/s "
            f"(median of {len(base['write_GBps'])})"
        )
    rows = []
    for result in data["passes"]:
        outcomes = [m["outcome"] for m in data["measurements"] if m["context"].get("pass") == result["pass"]]
        rows.append(
            [
                str(result["pass"]),
                str(len(result["checkpoints"])),
                f"{result['seconds_mean']:.2f}",
                f"{result['seconds_max']:.2f}",
                f"{result['throughput_GBps']:.2f}",
                f"{result['mean_checkpoint_GBps']:.2f}",
                worst_outcome(outcomes),
            ]
        )
    if rows:
        lines += table(["pass", "ckpts", "mean s", "worst s", "GB/s", "mean GB/s", "verdict"], rows)
    if data.get("steady_state"):
        last = max(data["steady_state"], key=int)
        lines.append(
            f"steady state (SNIA, per-checkpoint GB/s of passes 2-{last}): {data['steady_state'][last]['reason']}"
        )
    for restored in data.get("restore", []):
        lines.append(
            f"restore of checkpoint {restored['checkpoint']}: {restored['seconds']:.2f} s, "
            f"{restored['GBps']:.2f} GB/s, every byte verified ({restored['cached_fraction_before']:.1%} "
            f"cached before)"
        )
    lines += [f"error: {error}" for error in data["errors"]]
    if settings.results:
        lines.append(f"results: {settings.results}")
    return lines
