"""The settings of one qualification run: command-line options over the drive's threshold file, validated.

Everything is checked here, before any I/O on the target: a bad value raises SettingsError with one line
that names the value and the fix. Overlay order (as DCGM's): packaged file < user file < command line.
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ckptqual.host.target import check_target, describe_leftovers
from ckptqual.io.engines import ENGINES
from ckptqual.limits.thresholds import Thresholds, load_thresholds
from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.planfile import load_plan
from ckptqual.plan.workloads import Workload, load_workload
from ckptqual.runs.fill import checkpoints_for_fraction, space_problem

DEFAULT_CHECKPOINTS_PER_PASS = 3
DEFAULT_PASSES = 3
DEFAULT_RANK_TIMEOUT_S = 600.0
BASELINE_MAX_BYTES = 32 << 30
DEFAULT_LAYOUT_EXAMPLES = 5
DEFAULT_LAYOUT_MAX_BYTES = 64 << 20
MAX_PASSES = 100  # SNIA's rule needs at most 25 rounds; more passes than this is a mistake, not a plan
MAX_LAYOUT_EXAMPLES = 10_000
MAX_SEED = 2**32 - 1
# Private memory of one idle rank process (torch imported, buffers allocated), measured: ~150 MiB; with headroom.
RANK_MEMORY_BYTES = 200 << 20
_HOST_MEMORY_SHARE = 0.9
_MEMORY_SHARE = 0.5
T = TypeVar("T")
# What a file path gains inside the target: run directory (ckptqual-run-YYYYmmdd-HHMMSS-xxxxxxxx/) and the deepest
# place a plan's files go (checkpoints/checkpoint-00000/, layouts/layout-000-regular/).
_RUN_PATH_BYTES = 100


class SettingsError(ValueError):
    """A value the run cannot use; the message names it and the fix."""


@dataclass(frozen=True)
class Options:
    """What the user asked for on the command line (None: not given)."""

    drive: str = "local"
    target: Path | None = None
    workload: str | None = None
    scale: float | None = None
    engine: str | None = None
    checkpoints_per_pass: int | None = None
    fill_fraction: float | None = None
    passes: int | None = None
    results: Path | None = None
    keep: bool = False
    rank_timeout_s: float = DEFAULT_RANK_TIMEOUT_S
    memory_budget_bytes: int | None = None
    seed: int | None = None
    restore_checkpoints: int = 1
    layout_examples: int | None = None
    layout_seed: int | None = None
    layout_plan: Path | None = None


@dataclass(frozen=True)
class RunSettings:
    """The resolved run: drive limits, workload plan at scale, fill shape and housekeeping."""

    thresholds: Thresholds
    workload: Workload
    plan: CheckpointPlan
    engine: str
    checkpoints_per_pass: int
    passes: int
    target: Path | None
    results: Path | None
    keep: bool
    rank_timeout_s: float
    memory_budget_bytes: int
    seed: int
    restore_checkpoints: int
    layout_examples: int
    layout_seed: int
    layout_max_total_bytes: int
    layout_plan: CheckpointPlan | None
    require_steady_state: bool

    @property
    def scale(self) -> float:
        return self.plan.scale

    @property
    def baseline_bytes(self) -> int:
        """Bytes per raw baseline round: one checkpoint, capped so that a full-scale run stays short."""
        return min(self.plan.total_bytes, BASELINE_MAX_BYTES)

    def to_dict(self) -> dict:
        return {
            "drive": self.thresholds.drive.name,
            "thresholds_file": str(self.thresholds.path),
            "workload": self.plan.workload,
            "scale": self.scale,
            "engine": self.engine,
            "checkpoints_per_pass": self.checkpoints_per_pass,
            "passes": self.passes,
            "target": str(self.target) if self.target else None,
            "results": str(self.results) if self.results else None,
            "keep": self.keep,
            "rank_timeout_s": self.rank_timeout_s,
            "memory_budget_bytes": self.memory_budget_bytes,
            "seed": self.seed,
            "restore_checkpoints": self.restore_checkpoints,
            "require_steady_state": self.require_steady_state,
            "layout_examples": self.layout_examples,
            "layout_seed": self.layout_seed,
            "layout_max_total_bytes": self.layout_max_total_bytes,
            "layout_plan": self.layout_plan.workload if self.layout_plan else None,
            "fsync": True,
            "direct_io": False,
        }


def resolve_settings(options: Options) -> RunSettings:
    """Validates `options` over the drive's threshold file; raises SettingsError before any I/O."""
    try:
        thresholds = load_thresholds(options.drive)
    except (ValueError, LookupError, FileNotFoundError) as error:
        raise SettingsError(f"--drive: {error}") from error
    run = thresholds.run
    workload_name = _pick(options.workload, run.workload, "llama3.1-405b-review")
    try:
        workload = load_workload(workload_name)
    except ValueError as error:
        raise SettingsError(f"--workload: {error}") from error
    scale = _pick(options.scale, run.scale, 1.0)
    if not (isinstance(scale, int | float) and math.isfinite(scale) and 0 < scale <= 1):
        raise SettingsError(f"--scale {scale!r}: must be a number with 0 < scale <= 1, e.g. --scale 0.01")
    plan = workload.plan().scaled(scale)
    engine = _pick(options.engine, run.engine, "stream")
    if engine not in ENGINES:
        raise SettingsError(f"--engine {engine!r}: unknown engine; use one of {', '.join(ENGINES)}")
    target = options.target
    if target is not None:
        problems = check_target(target)
        if problems:
            raise SettingsError(f"--target: {problems[0]}")
    space_at = target if target is not None else Path(tempfile.gettempdir())
    checkpoints = _checkpoints_per_pass(options, thresholds, plan, space_at)
    passes = _pick(options.passes, run.passes, DEFAULT_PASSES)
    _at_least_one("--passes", passes)
    if passes > MAX_PASSES:
        raise SettingsError(
            f"--passes {passes}: at most {MAX_PASSES}; the SNIA steady-state rule needs at most 25 rounds, "
            f"e.g. --passes 3"
        )
    _at_least_one("--restore-checkpoints", options.restore_checkpoints)
    examples = options.layout_examples
    if examples is not None and (isinstance(examples, bool) or not 0 <= examples <= MAX_LAYOUT_EXAMPLES):
        raise SettingsError(f"--layout-examples {examples!r}: must be a whole number from 0 to {MAX_LAYOUT_EXAMPLES}")
    _check_seed("--seed", options.seed)
    _check_seed("--layout-seed", options.layout_seed)
    _check_ranks(plan, workload_name)
    _check_names(plan, space_at, "--workload")
    if options.restore_checkpoints > checkpoints:
        raise SettingsError(
            f"--restore-checkpoints {options.restore_checkpoints}: only {checkpoints} checkpoints "
            f"are kept; restore at most that many"
        )
    if not (math.isfinite(options.rank_timeout_s) and options.rank_timeout_s > 0):
        raise SettingsError(f"--rank-timeout {options.rank_timeout_s!r}: must be a number > 0 seconds, e.g. 600")
    if options.results is not None:
        _check_results(options.results, target)
    budget = options.memory_budget_bytes or default_memory_budget()
    if budget <= 0:
        raise SettingsError(f"--memory-budget {budget!r}: must be > 0 bytes, e.g. 16G")
    if engine == "torch-save":
        _check_memory(plan, budget)
    free = shutil.disk_usage(space_at).free
    layout_bytes = _pick(thresholds.layouts.max_total_bytes, DEFAULT_LAYOUT_MAX_BYTES)
    problem = space_problem(plan, checkpoints, free)  # the raw baseline's files are gone before the fill starts
    if problem:
        raise SettingsError(space_message(space_at, problem))
    return RunSettings(
        thresholds=thresholds,
        workload=workload,
        plan=plan,
        engine=engine,
        checkpoints_per_pass=checkpoints,
        passes=passes,
        target=target,
        results=options.results,
        keep=options.keep,
        rank_timeout_s=options.rank_timeout_s,
        memory_budget_bytes=budget,
        seed=options.seed if options.seed is not None else int.from_bytes(os.urandom(4), "little"),
        restore_checkpoints=options.restore_checkpoints,
        layout_examples=_pick(options.layout_examples, thresholds.layouts.examples, DEFAULT_LAYOUT_EXAMPLES),
        layout_seed=_pick(options.layout_seed, thresholds.layouts.seed, 0),
        layout_max_total_bytes=layout_bytes,
        require_steady_state=bool(thresholds.run.require_steady_state),
        layout_plan=_layout_plan(options.layout_plan, len(plan.ranks), space_at),
    )


def space_message(where: Path, problem: str) -> str:
    """The refusal of a run that does not fit, naming what earlier runs left on the target and how to remove it."""
    leftovers = describe_leftovers(where) if where.is_dir() else None
    return f"--target {where}: {problem}" + (f"; also, {leftovers}" if leftovers else "")


def _layout_plan(path: Path | None, ranks: int, space_at: Path) -> CheckpointPlan | None:
    """The plan file given to replay one layout, validated; it may use at most the run's ranks."""
    if path is None:
        return None
    try:
        plan = load_plan(path)
    except (OSError, ValueError) as error:
        raise SettingsError(f"--layout-plan {path}: {error}") from error
    if len(plan.ranks) > ranks:
        raise SettingsError(
            f"--layout-plan {path}: the layout has {len(plan.ranks)} ranks but the run has {ranks}; "
            f"use a --workload with at least {len(plan.ranks)} ranks"
        )
    _check_names(plan, space_at, f"--layout-plan {path}")
    return plan


def _check_seed(option: str, seed: int | None) -> None:
    if seed is not None and (isinstance(seed, bool) or not 0 <= seed <= MAX_SEED):
        raise SettingsError(f"{option} {seed!r}: must be a whole number from 0 to {MAX_SEED}, e.g. {option} 42")


def host_rank_capacity() -> int:
    """How many rank processes this host can run at once: its available memory and its open-file limit."""
    memory = int(_available_memory_bytes() * _HOST_MEMORY_SHARE) // RANK_MEMORY_BYTES
    soft_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    files = (soft_files - 64) // 3 if soft_files != resource.RLIM_INFINITY else memory  # a pipe and a sentinel each
    return max(1, min(memory, files))


def _check_ranks(plan: CheckpointPlan, workload: str) -> None:
    """A plan with more ranks than this host can run would measure the host running out, not the drive."""
    capacity = host_rank_capacity()
    if len(plan.ranks) > capacity:
        raise SettingsError(
            f"--workload {workload}: {len(plan.ranks)} ranks, but this host can run at most {capacity} "
            f"({_available_memory_bytes() / 1e9:,.1f} GB of memory available, about "
            f"{RANK_MEMORY_BYTES >> 20} MiB per rank, {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} open files); "
            f"use a -subset workload (8 ranks), or spread the ranks over several nodes"
        )


def _check_names(plan: CheckpointPlan, target: Path, option: str) -> None:
    """Every file name of `plan` must be legal on the target's filesystem (NAME_MAX) inside a run directory."""
    name_max = os.pathconf(target, "PC_NAME_MAX")
    path_max = os.pathconf(target, "PC_PATH_MAX")
    room = path_max - len(str(target.resolve())) - _RUN_PATH_BYTES
    for rank in plan.ranks:
        for spec in rank.files:
            longest = max(spec.path.split("/"), key=len)
            if len(longest.encode()) > name_max:
                raise SettingsError(
                    f"{option}: file {spec.path[:60]!r}... has a name of {len(longest.encode())} bytes, longer than "
                    f"the {name_max} that {target}'s filesystem allows (NAME_MAX); shorten it"
                )
            if len(spec.path.encode()) > room:
                raise SettingsError(
                    f"{option}: file {spec.path[:60]!r}... has a path of {len(spec.path.encode())} bytes, longer than "
                    f"the {room} left under {target} (PATH_MAX {path_max}); shorten it or use a shorter --target"
                )


def _check_results(path: Path, target: Path | None) -> None:
    """The results file's place must be writable and outside the target (which holds only what ckptqual makes)."""
    path = path.absolute()
    if path.is_dir():
        raise SettingsError(f"--results {path}: is a directory; give a file path, e.g. --results {path}/results.json")
    if target is not None and target.resolve() in (path.resolve(), *path.resolve().parents):
        raise SettingsError(
            f"--results {path}: lies inside the target {target}, which holds only what ckptqual creates and removes; "
            f"write the results elsewhere, e.g. --results ./results.json"
        )
    parent = path.parent
    if not parent.is_dir():
        raise SettingsError(f"--results {path}: the directory {parent} does not exist; create it first")
    if os.statvfs(parent).f_flag & os.ST_RDONLY:
        raise SettingsError(f"--results {path}: {parent} is on a read-only filesystem; write the results elsewhere")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SettingsError(f"--results {path}: not writable by this user; write the results elsewhere")


def default_memory_budget() -> int:
    """Half of the memory available now: what the ranks of a torch-save run may hold together."""
    return int(_available_memory_bytes() * _MEMORY_SHARE)


def _available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo, else all physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _pick(*values: T | None) -> T:
    """The first value that is given (not None): command line, then drive file, then default."""
    return next(v for v in values if v is not None)


def _at_least_one(option: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingsError(f"{option} {value!r}: must be a whole number >= 1")


def _checkpoints_per_pass(options: Options, thresholds: Thresholds, plan: CheckpointPlan, space_at: Path) -> int:
    if options.checkpoints_per_pass is not None:
        _at_least_one("--checkpoints-per-pass", options.checkpoints_per_pass)
        return options.checkpoints_per_pass
    fraction = options.fill_fraction
    if fraction is None and thresholds.run.checkpoints_per_pass is not None:
        return thresholds.run.checkpoints_per_pass
    fraction = fraction if fraction is not None else thresholds.run.fill_fraction
    if fraction is None:
        return DEFAULT_CHECKPOINTS_PER_PASS
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise SettingsError(f"--fill-fraction {fraction!r}: must be a number with 0 < fraction <= 1, e.g. 0.9")
    return checkpoints_for_fraction(plan, shutil.disk_usage(space_at).total, fraction)


def _check_memory(plan: CheckpointPlan, budget: int) -> None:
    """torch-save holds a whole file in memory; all ranks at once must fit the budget."""
    largest = [max((f.nbytes for f in rank.files), default=0) for rank in plan.ranks]
    needed = sum(largest)
    if needed > budget:
        worst = max(range(len(largest)), key=largest.__getitem__)
        raise SettingsError(
            f"--engine torch-save holds each file in memory: the ranks' largest files need {needed / 1e9:,.2f} GB "
            f"together (rank {worst}: {largest[worst] / 1e9:,.2f} GB) but the memory budget is "
            f"{budget / 1e9:,.2f} GB; use --engine stream (bounded memory), a smaller --scale, "
            f"or raise --memory-budget"
        )
