"""The one space check, before any I/O: what the parts of the run that will run need on the target at once, in bytes
and in inodes; beside it, the check that every absolute minimum throughput is one this host can measure.

The raw baseline is written and removed first, alone. Then the fill's checkpoints stay until the end, and beside
them the read sweep's files and the odd layouts (each with its regular twin) come and go one after the other. A run
that does not fit is refused once, with a fix that makes the whole run fit, checked by resolving the run again (which
refuses a required steady state it cannot show) and against this host's ceiling (a fix with an absolute minimum the
host cannot measure is no fix); where no fix can qualify, the refusal suggests none.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from ckptqual.config.run_settings import RunSettings, TargetProblem, minimum_scale, resolve_settings
from ckptqual.config.table import COMMAND_LINE, setting
from ckptqual.config.values import SettingsError
from ckptqual.host.target import describe_leftovers
from ckptqual.limits.ceiling import REFUSAL_FIX, Ceiling, limits_above
from ckptqual.limits.steady import WINDOW as STEADY_WINDOW
from ckptqual.limits.units import format_size
from ckptqual.plan.footprint import RESERVE_BYTES, checkpoint_footprint_bytes
from ckptqual.plan.model import CheckpointPlan

PARTS = ("fill", "sweep", "layouts")
LAYOUT_MAX_FILES = 64  # files of a drawn odd layout
# The target's marker and lock, the run directory, its manifest and the manifest's temporary while it is rewritten,
# and its checkpoints/, raw/, layouts/ and sweep/ directories.
MARKER_INODES = 9
MIN_STEADY_CHECKPOINTS = 3  # over passes 2 and 3 they give the 5 rounds the SNIA rule tests
_SCALE_STEPS = 16  # bisection steps over six decades of scale: within 0.02 %


@dataclass(frozen=True)
class SpaceNeed:
    """Bytes (or inodes) each part of a run writes; the baseline's are gone before the others start."""

    baseline: int
    fill: int
    sweep: int
    layouts: int
    reserve: int = RESERVE_BYTES

    @property
    def total(self) -> int:
        return max(self.baseline, self.fill + max(self.sweep, self.layouts)) + self.reserve


def space_needed(run: RunSettings, parts: set[str]) -> SpaceNeed:
    """What `run` writes, counting only `parts` (of PARTS) besides the baseline, which runs unless the drive file's
    [run] parts leaves it out."""
    layout_bytes = checkpoint_footprint_bytes(run.layout_plan) if run.layout_plan else run.layout_max_total_bytes
    return SpaceNeed(
        baseline=run.baseline_bytes if "baseline" in run.parts else 0,
        fill=run.checkpoints_per_pass * checkpoint_footprint_bytes(run.plan) if "fill" in parts else 0,
        sweep=run.sweep.files_bytes if "sweep" in parts else 0,
        layouts=2 * layout_bytes if "layouts" in parts else 0,
    )


def check_space(
    run: RunSettings, parts: set[str], free_bytes: int | None = None, ceilings: dict[str, Ceiling] | None = None
) -> None:
    """Raises one TargetProblem (a SettingsError), with need and free space per part and a fix that could qualify
    under `ceilings` (this host's, limits.ceiling; None: not checked), unless `parts` fit the target."""
    free = shutil.disk_usage(run.space_path).free if free_bytes is None else free_bytes
    need = space_needed(run, parts)
    if need.total <= free:
        return
    raise TargetProblem(
        f"--target {run.space_path}: the run needs {_gb(need.total)} but the target has {_gb(free)} free "
        f"({_parts_text(run, need)}); {_advice(run, parts, free, ceilings or {})}" + _leftovers_text(run)
    )


def inodes_needed(run: RunSettings, parts: set[str]) -> SpaceNeed:
    """Inodes (files and directories) each part of `run` holds at once at most, counted like the bytes."""
    drawn = 2 * LAYOUT_MAX_FILES + 1  # a drawn layout: its directory, its files, each in at most one new directory
    odd = (_plan_inodes(run.layout_plan) if run.layout_plan else drawn) + 1  # and its file list
    return SpaceNeed(
        baseline=len(run.plan.ranks) if "baseline" in run.parts else 0,
        fill=run.checkpoints_per_pass * _plan_inodes(run.plan) if "fill" in parts else 0,
        sweep=run.sweep.jobs + 1 if "sweep" in parts else 0,
        layouts=odd + len(run.plan.ranks) + 2 if "layouts" in parts else 0,  # beside it, its regular twin
        reserve=MARKER_INODES,
    )


def _plan_inodes(plan: CheckpointPlan) -> int:
    """One checkpoint's inodes: its directory, the directories under it and its files."""
    paths = [PurePosixPath(spec.path) for rank in plan.ranks for spec in rank.files]
    return 1 + len({parent for path in paths for parent in path.parents if parent.parts}) + len(paths)


def check_inodes(run: RunSettings, parts: set[str], free_inodes: int | None = None) -> None:
    """Raises one TargetProblem, with both counts and a fix, unless the target has the inodes `parts` need."""
    stats = os.statvfs(run.space_path)
    if free_inodes is None and stats.f_files == 0:
        return  # the filesystem sets no inode limit (btrfs, some network filesystems)
    free = stats.f_favail if free_inodes is None else free_inodes
    need = inodes_needed(run, parts)
    if need.total <= free:
        return
    per_checkpoint = _plan_inodes(run.plan)
    fewest = max(MIN_STEADY_CHECKPOINTS, run.restore_checkpoints)
    fitting = (free - need.total + need.fill) // per_checkpoint if need.fill else 0
    fix = f"use --checkpoints-per-pass {fitting}, or " if fewest <= fitting < run.checkpoints_per_pass else "use "
    raise TargetProblem(
        f"--target {run.space_path}: the run needs {need.total:,} inodes (files and directories; "
        f"{run.checkpoints_per_pass} checkpoints of {per_checkpoint:,}) but the target has {free:,} free "
        f"(df -i); {fix}a filesystem with more inodes (e.g. mkfs.ext4 -i 16384)"
    )


class HostTooSlow(SettingsError):
    """A limit asks for more throughput than this host can measure: the run could only end INVALID."""


def check_ceiling(run: RunSettings, ceilings: dict[str, Ceiling]) -> None:
    """Raises one HostTooSlow, with each limit, the ceiling and the fix, unless every absolute minimum throughput of
    the drive file is within its phase's ceiling (limits.ceiling). A run over several nodes is not checked: its
    ranks run on the nodes' cores, not on this host's."""
    if run.nodes > 1:
        return
    above = limits_above(run.thresholds.limits, ceilings)
    if above:
        drives = f" ({run.drives_at_once} drives share this host's cores)" if run.drives_at_once > 1 else ""
        raise HostTooSlow(f"drive file {run.thresholds.path}{drives}: {'; '.join(above)}; {REFUSAL_FIX}")


def _advice(run: RunSettings, parts: set[str], free: int, ceilings: dict[str, Ceiling]) -> str:
    """The change that makes the whole run fit and could qualify here; else, where the sweep's files are what cannot
    shrink enough, the run without the read sweep."""
    fix = find_fix(run, parts, free, ceilings)
    if fix is not None:
        return f"use {_flags(fix[0])} (then the run needs {_gb(fix[1].total)})"
    if "sweep" in parts:
        rest, leave_out = parts - {"sweep"}, "use a larger target, or leave out the read sweep with -k 'not read_sweep'"
        if space_needed(run, rest).total <= free:
            return f"{leave_out} (then the run needs {_gb(space_needed(run, rest).total)})"
        without = find_fix(run, rest, free, ceilings)
        if without is not None:
            return f"{leave_out} and use {_flags(without[0])} (then the run needs {_gb(without[1].total)})"
    return "use a larger target"


def _above_ceiling(run: RunSettings, ceilings: dict[str, Ceiling]) -> list[str]:
    """The absolute minimums of `run` this host cannot measure (check_ceiling's lines; none over several nodes)."""
    return limits_above(run.thresholds.limits, ceilings) if run.nodes <= 1 else []


def _leftovers_text(run: RunSettings) -> str:
    leftovers = describe_leftovers(run.space_path) if run.space_path.is_dir() else None
    return f"; also, {leftovers}" if leftovers else ""


def find_fix(
    run: RunSettings, parts: set[str], free: int, ceilings: dict[str, Ceiling] | None = None
) -> tuple[dict[str, str], SpaceNeed] | None:
    """The first change that makes the whole run fit, and what it then needs: fewer checkpoints per pass, else a
    smaller scale, else smaller sweep files, else both; each checked by resolving the run with it (which refuses a
    required steady state it cannot show) and against `ceilings`."""
    options = {name: value for name, value in run.values.items() if run.sources[name] == COMMAND_LINE}

    def fitting(change: dict[str, str]) -> SpaceNeed | None:
        try:
            changed = resolve_settings(options | change)
        except SettingsError:
            return None
        need = space_needed(changed, parts)
        return need if need.total <= free and not _above_ceiling(changed, ceilings or {}) else None

    for change in _changes(run, parts, free, fitting):
        need = fitting(change)
        if need is not None:
            return change, need
    return None


def _changes(run: RunSettings, parts: set[str], free: int, fitting: Callable) -> Iterator[dict[str, str]]:
    """Candidate fixes in the order a user would prefer them."""
    fewest = min(run.checkpoints_per_pass, max(_steady_checkpoints(run), run.restore_checkpoints))
    fewer = {"checkpoints_per_pass": str(fewest)} if "fill" in parts and fewest < run.checkpoints_per_pass else {}
    if fewer:
        need = space_needed(run, parts)
        room = free - RESERVE_BYTES - max(need.sweep, need.layouts)
        yield {"checkpoints_per_pass": str(max(fewest, room // checkpoint_footprint_bytes(run.plan)))}
    yield from _smaller_scale(run, fewer, fitting)
    if "sweep" in parts:
        file_sizes = list(_smaller_files(run))
        yield from ({**fewer, "sweep_file_bytes": size} for size in file_sizes)
        yield from _smaller_scale(run, {**fewer, "sweep_file_bytes": file_sizes[-1]} if file_sizes else fewer, fitting)


def _steady_checkpoints(run: RunSettings) -> int:
    """The fewest checkpoints per pass that leave the steady-state rule its window: all of it where the drive file
    requires the steady state, else MIN_STEADY_CHECKPOINTS."""
    if run.values["require_steady_state"] and run.passes > 1:
        return math.ceil(STEADY_WINDOW / (run.passes - 1))
    return MIN_STEADY_CHECKPOINTS


def _smaller_scale(run: RunSettings, change: dict[str, str], fitting: Callable) -> Iterator[dict[str, str]]:
    """The largest scale below the run's (two significant digits) with which `change` fits, if any."""
    with_scale = lambda exponent: {**change, "scale": _two_digits(10**exponent)}  # noqa: E731
    smallest = math.log10(minimum_scale(run.workload.plan())) + 1e-9  # above it even once rounded down
    high, low = math.log10(run.scale), max(math.log10(run.scale) - 6, smallest)
    if fitting(with_scale(low)) is None:
        return
    for _ in range(_SCALE_STEPS):
        middle = (high + low) / 2
        low, high = (middle, high) if fitting(with_scale(middle)) else (low, middle)
    yield with_scale(low)


def _two_digits(scale: float) -> str:
    """`scale` rounded down to two significant digits, as text."""
    step = 10 ** (math.floor(math.log10(scale)) - 1)
    return f"{math.floor(scale / step) * step:.2g}"


def _smaller_files(run: RunSettings) -> Iterator[str]:
    """The sweep's file size halved, down to 64 of its largest blocks."""
    smallest = 64 * max(run.sweep.block_sizes_bytes)
    size = run.sweep.file_bytes // 2
    while size >= smallest and size % 4096 == 0:
        yield format_size(size)
        size //= 2


def _flags(change: Mapping[str, str]) -> str:
    return " ".join(f"{setting(name).flag} {value}" for name, value in change.items())


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.3f} GB"


def _parts_text(run: RunSettings, need: SpaceNeed) -> str:
    per_checkpoint = checkpoint_footprint_bytes(run.plan)
    parts = [f"raw baseline {_gb(need.baseline)}, alone first"] if need.baseline else []
    if need.fill:
        parts.append(f"fill {_gb(need.fill)}: {run.checkpoints_per_pass} checkpoints of {_gb(per_checkpoint)}")
    if need.sweep:
        parts.append(f"read sweep {_gb(need.sweep)}: {run.sweep.jobs} files of {format_size(run.sweep.file_bytes)}")
    if need.layouts:
        parts.append(f"odd layouts {_gb(need.layouts)}: the largest and its regular twin")
    return "; ".join([*parts, f"reserve {_gb(RESERVE_BYTES)}"])
