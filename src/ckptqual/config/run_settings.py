"""The settings of one run, resolved from the table: command line over drive file over default, each value checked
once and its origin recorded, then the checks that need several values or the host. Raises SettingsError before
any I/O on the target."""

from __future__ import annotations

import math
import os
import resource
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptqual.config.drive_file import DriveFile, load_drive_file
from ckptqual.config.drives import DriveTarget, per_drive_path
from ckptqual.config.outputs import check_report_dir, check_results, check_secret
from ckptqual.config.table import COMMAND_LINE, DEFAULT, SETTINGS, SettingValues, overlay, setting
from ckptqual.config.values import SettingsError
from ckptqual.host.guard import LOCK_FILE, RUN_MARKER, TARGET_MARKER
from ckptqual.host.manifest import FILE_LIST, TEMP_INFIX
from ckptqual.host.target import check_target
from ckptqual.io.readers.base import ALIGN_BYTES
from ckptqual.limits.limits import MIN_JUDGED_BYTES, at_scale
from ckptqual.limits.steady import WINDOW as STEADY_WINDOW
from ckptqual.limits.units import format_size
from ckptqual.plan.footprint import checkpoints_for_fraction
from ckptqual.plan.formats import checkpoint_engine, formatted_plan
from ckptqual.plan.model import DTYPE_BYTES, CheckpointPlan
from ckptqual.plan.planfile import load_plan
from ckptqual.plan.reshard import ReshardError, new_layout_needs, parse_layout
from ckptqual.plan.workloads import Workload, load_workload

BASELINE_MAX_BYTES = 32 << 30
# Private memory of one idle rank process (torch imported, buffers allocated), measured: ~150 MiB; with headroom.
RANK_MEMORY_BYTES = 200 << 20
_HOST_MEMORY_SHARE = 0.9
_MEMORY_SHARE = 0.5
# What a file path gains inside the target: run directory (ckptqual-run-YYYYmmdd-HHMMSS-xxxxxxxx/) and the deepest
# place a plan's files go (checkpoints/checkpoint-00000/, layouts/layout-000-regular/).
_RUN_PATH_BYTES = 100
RESERVED_NAMES = (TARGET_MARKER, LOCK_FILE, RUN_MARKER, FILE_LIST)  # ckptqual's own entries on a target
_PRECEDENCE = {COMMAND_LINE: 0, DEFAULT: 2}  # a drive file's path ranks 1
Options = dict[str, Any]  # command-line values by setting name; None or absent: not given


class TargetProblem(SettingsError):
    """A problem of the target, not of the options (refused, too small): in a run over several drives it fails
    only that drive's tests."""


def _default(name: str) -> Any:
    return setting(name).default_value()


@dataclass(frozen=True)
class SweepConfig:
    """The resolved read sweep: the matrix, the shape of each cell, the files it reads, and where each came from."""

    block_sizes_bytes: tuple[int, ...] = _default("sweep_block_sizes_bytes")
    threads: tuple[int, ...] = _default("sweep_threads")
    jobs: int = _default("sweep_jobs")
    batch: int = _default("sweep_batch")
    file_bytes: int = _default("sweep_file_bytes")
    transfers: tuple[str, ...] = _default("sweep_transfers")
    requests: int = _default("sweep_requests")
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def files_bytes(self) -> int:
        """Bytes the sweep writes before its first cell: one file per job."""
        return self.jobs * self.file_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "block_sizes": [format_size(size) for size in self.block_sizes_bytes],
            "threads": list(self.threads),
            "jobs": self.jobs,
            "batch": self.batch,
            "file_bytes": self.file_bytes,
            "transfers": list(self.transfers),
            "requests_per_job": self.requests,
            "sources": dict(self.sources),
        }


@dataclass(frozen=True, kw_only=True)
class RunSettings(SettingValues):
    """The resolved run: every row's value (an attribute of SettingValues) and origin, the drive file, the workload
    and its plan at scale, the layout to replay, and the sweep."""

    thresholds: DriveFile
    workload: Workload
    plan: CheckpointPlan
    layout_plan: CheckpointPlan | None
    sweep: SweepConfig
    sources: Mapping[str, str]  # setting -> "command line", the drive file's path, or "default"
    label: str | None = None  # the drive's label in a run over several drives (config.drives)
    drives_at_once: int = 1  # drives qualified at the same time on this host, sharing its cores

    @property
    def values(self) -> dict[str, Any]:
        """Each setting's value by its name."""
        return {row.name: getattr(self, row.field_name) for row in SETTINGS}

    @property
    def baseline_bytes(self) -> int:
        """Bytes per raw baseline round: one checkpoint, capped so that a full-scale run stays short."""
        return min(self.plan.total_bytes, BASELINE_MAX_BYTES)

    @property
    def checkpoint_engine(self) -> str:
        """The engine that writes and reads the checkpoints: the format's own, or --engine for torch-save files."""
        return checkpoint_engine(self.format, self.engine)

    @property
    def space_path(self) -> Path:
        return space_path(self.target)

    def to_dict(self) -> dict[str, Any]:
        return {
            **{name: str(value) if isinstance(value, Path) else value for name, value in self.values.items()},
            "drive": self.thresholds.drive.name,
            "thresholds_file": str(self.thresholds.path),
            "requires": list(self.thresholds.requires),
            "workload": self.plan.workload,
            "sources": dict(self.sources),
            "fsync": True,
            "direct_io": False,
            **({"drive_label": self.label, "drives_at_once": self.drives_at_once} if self.label else {}),
        }


def resolve_settings(options: Mapping[str, Any]) -> RunSettings:
    """`options` (command-line values by setting name) over the drive file over the defaults, fully checked."""
    drive_file = _drive_file(options)
    values, sources = overlay(options, drive_file.values, str(drive_file.path), SETTINGS)
    workload = _workload(values["workload"])
    if sources["format"] == DEFAULT and workload.format is not None:
        values["format"], sources["format"] = workload.format, f"workload {workload.name}"
    plan = _formatted(scaled_plan(workload, values["scale"], sources["scale"]), values, sources)
    _check_restore_layout(workload, values)
    _check_target_and_outputs(values)
    values["checkpoints_per_pass"], sources["checkpoints_per_pass"] = _checkpoints_per_pass(values, sources, plan)
    _check_steady_rounds(values, sources)
    _check_host(plan, values)
    values["seed"] = values["seed"] if values["seed"] is not None else int.from_bytes(os.urandom(4), "little")
    values["memory_budget_bytes"] = values["memory_budget_bytes"] or default_memory_budget()
    if checkpoint_engine(values["format"], values["engine"]) == "torch-save":
        _check_memory(plan, values["memory_budget_bytes"])
    values["layout_max_total_bytes"] = _layout_bytes(values, sources, drive_file)
    layout_plan = _layout_plan(values["layout_plan"], len(plan.ranks), space_path(values["target"]))
    sweep = _sweep(values, sources)
    return RunSettings(
        **{row.field_name: values[row.name] for row in SETTINGS},
        thresholds=replace(drive_file, limits=at_scale(drive_file.limits, values["scale"])),
        workload=workload,
        plan=plan,
        layout_plan=layout_plan,
        sweep=sweep,
        sources=sources,
    )


def resolve_drive(options: Options, drive: DriveTarget, at_once: int) -> tuple[RunSettings, str | None]:
    """One drive's settings in a run over several: its target, drive file and per-drive output paths over
    `options`; with the problem of its target (refused, as TargetProblem says), or None. A bad option still raises."""
    if drive.label is None:
        raise ValueError(
            f"resolve_drive: the drive at {drive.target} has no label; a run over several drives names each"
        )
    own = {**options, "target": drive.target, "drive": drive.drive or options.get("drive")}
    if options.get("results") is not None:
        own["results"] = per_drive_path(Path(options["results"]), drive.label)
    if options.get("report_dir") is not None:
        own["report_dir"] = Path(options["report_dir"]) / drive.label
    try:
        run, problem = resolve_settings(own), None
    except TargetProblem as refused:  # the options are checked again without the target, which is put back
        run, problem = resolve_settings({**own, "target": None}), str(refused)
        run = replace(run, target=drive.target)
    return replace(run, label=drive.label, drives_at_once=at_once), problem


def space_path(target: Path | None) -> Path:
    """Where the run writes: the target, or the system temp dir under which a fresh one is made."""
    return target if target is not None else Path(tempfile.gettempdir())


def _drive_file(options: Mapping[str, Any]) -> DriveFile:
    drive = setting("drive")
    name = drive.from_command_line(options["drive"]) if options.get("drive") is not None else drive.default_value()
    try:
        return load_drive_file(name)
    except SettingsError as error:
        raise SettingsError(f"--drive: {error}") from error


def _workload(name: str) -> Workload:
    try:
        return load_workload(name)
    except ValueError as error:
        raise SettingsError(f"--workload: {error}") from error


def minimum_scale(full: CheckpointPlan) -> float:
    """The smallest scale (two significant digits) at which `full` still holds one block (ALIGN_BYTES) per file: each
    tensor loses less than one element to rounding, so its bytes are then at least files x ALIGN_BYTES."""
    tensors = sum(len(spec.tensors) for rank in full.ranks for spec in rank.files)
    needed = full.file_count * ALIGN_BYTES + tensors * max(DTYPE_BYTES.values())
    if needed >= full.total_bytes:
        return 1.0
    step = 10 ** (math.floor(math.log10(needed / full.total_bytes)) - 1)
    return float(f"{math.ceil(needed / full.total_bytes / step) * step:.2g}")


def scaled_plan(workload: Workload, scale: float, source: str) -> CheckpointPlan:
    """The workload's plan at `scale`, refused where its files would shrink below a block: nothing could be timed."""
    full = workload.plan()
    smallest = minimum_scale(full)
    if scale < smallest:
        raise SettingsError(
            f"--scale {scale:g} ({source}): the workload {workload.name}'s {full.file_count} files would hold less "
            f"than one {format_size(ALIGN_BYTES)} block each, too little to time a write or a read; use --scale "
            f"{smallest:.2g} or more"
        )
    return full.scaled(scale)


def _formatted(plan: CheckpointPlan, values: Mapping[str, Any], sources: Mapping[str, str]) -> CheckpointPlan:
    """The plan laid out in the run's format; a plan the format cannot hold is refused naming why."""
    try:
        return formatted_plan(plan, values["format"], values["dcp_threads"])
    except ValueError as error:
        raise SettingsError(f"--format {values['format']} ({sources['format']}): {error}") from None


def _check_restore_layout(workload: Workload, values: Mapping[str, Any]) -> None:
    """--restore-layout must be one the workload's checkpoint can be restored onto (plan.reshard)."""
    if values["restore_layout"] is None:
        return
    try:
        new_layout_needs(workload, workload.plan().scaled(values["scale"]), *parse_layout(values["restore_layout"]))
    except ReshardError as error:
        raise SettingsError(str(error)) from None


def _check_target_and_outputs(values: Mapping[str, Any]) -> None:
    target = values["target"]
    problems = check_target(target) if target is not None else []
    if problems:
        raise TargetProblem(f"--target: {problems[0]}")
    if values["results"] is not None:
        check_results(values["results"], target)
    if values["report_dir"] is not None:
        check_report_dir(values["report_dir"], target)
    if values["secret_file"] is not None:
        check_secret(values["secret_file"], target)


def _checkpoints_per_pass(values: Mapping[str, Any], sources: Mapping[str, str], plan: CheckpointPlan) -> tuple:
    """Checkpoints per pass, from a fill fraction where one is given closer to the user than a count; with its
    origin. The restore reads at most that many."""
    count, source = values["checkpoints_per_pass"], sources["checkpoints_per_pass"]
    fraction, fraction_source = values["fill_fraction"], sources["fill_fraction"]
    if fraction is not None and _PRECEDENCE.get(fraction_source, 1) < _PRECEDENCE.get(source, 1):
        capacity = shutil.disk_usage(space_path(values["target"])).total
        count, source = checkpoints_for_fraction(plan, capacity, fraction), fraction_source
    if values["restore_checkpoints"] > count:
        raise SettingsError(
            f"--restore-checkpoints {values['restore_checkpoints']}: only {count} checkpoints are kept; "
            f"restore at most that many"
        )
    return count, source


def _check_steady_rounds(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """A run that must reach the steady state writes at least the SNIA rule's window of steady-state checkpoints
    (passes 2 and later); fewer can only end NOT QUALIFIED, so the run is refused with the count that would do."""
    if not values["require_steady_state"]:
        return
    per_pass, steady_passes = values["checkpoints_per_pass"], values["passes"] - 1
    if steady_passes * per_pass >= STEADY_WINDOW:
        return
    fix = (
        f"use --checkpoints-per-pass {math.ceil(STEADY_WINDOW / steady_passes)} or more"
        if steady_passes
        else "use --passes 2 or more"
    )
    raise SettingsError(
        f"require_steady_state = true ({sources['require_steady_state']}): the SNIA rule needs {STEADY_WINDOW} "
        f"steady-state checkpoints (passes 2 and later), but --passes {values['passes']} with --checkpoints-per-pass "
        f"{per_pass} ({sources['checkpoints_per_pass']}) writes {steady_passes * per_pass}; {fix}"
    )


def _check_host(plan: CheckpointPlan, values: Mapping[str, Any]) -> None:
    """The plan's ranks must split evenly over the nodes (--nodes) and each node's share fit this host, and its file
    names the target's filesystem."""
    nodes, ranks = values["nodes"], len(plan.ranks)
    if ranks % nodes or (nodes > 1 and values["controller"] is None):
        fix = f"use a number that divides {ranks}" if ranks % nodes else "give --controller HOST:PORT (this host's)"
        raise SettingsError(f"--nodes {nodes}: the workload has {ranks} ranks, {ranks / nodes:g} per node; {fix}")
    secret = values["secret_file"]
    if nodes > 1 and (secret is None or not secret.parent.is_dir()):
        where = "give" if secret is None else f"{secret.parent} is not a directory; give"
        raise SettingsError(
            f"--nodes {nodes}: {where} --secret-file PATH, a file in a directory of yours that every node sees, for "
            f"the run's secret (docs/many-nodes.md)"
        )
    capacity, share = host_rank_capacity(), f"{ranks // nodes} ranks{' per node' if nodes > 1 else ''}"
    if ranks // nodes > capacity:
        raise SettingsError(
            f"--workload {values['workload']}: {share}, but this host can run at most {capacity} "
            f"({_available_memory_bytes() / 1e9:,.1f} GB of memory available, about {RANK_MEMORY_BYTES >> 20} MiB "
            f"per rank, {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} open files); use a -subset workload "
            f"(8 ranks), or spread the ranks over several nodes"
        )
    _check_names(plan, space_path(values["target"]), "--workload")


def _layout_bytes(values: Mapping[str, Any], sources: Mapping[str, str], drive_file: DriveFile) -> int:
    """The largest odd layout: as given on the command line, else scaled like the run against the drive file's
    own scale, but not below the size under which a layout is not judged (unless the drive file asks less)."""
    given = values["layout_max_total_bytes"]
    if sources["layout_max_total_bytes"] == COMMAND_LINE:
        return given
    scaled = int(given * values["scale"] / drive_file.values.get("scale", _default("scale")))
    return max(scaled, min(given, MIN_JUDGED_BYTES))


def _layout_plan(path: Path | None, ranks: int, where: Path) -> CheckpointPlan | None:
    """The plan file given to replay one layout, checked; it may use at most the run's ranks."""
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
    _check_names(plan, where, f"--layout-plan {path}")
    return plan


def _sweep(values: Mapping[str, Any], sources: Mapping[str, str]) -> SweepConfig:
    """The sweep's settings (the rows named sweep_*) and their origins; its files must hold the largest block."""
    rows = {name.removeprefix("sweep_"): name for name in values if name.startswith("sweep_")}  # SweepConfig's fields
    config = SweepConfig(
        **{key: values[name] for key, name in rows.items()}, sources={k: sources[n] for k, n in rows.items()}
    )
    largest = max(config.block_sizes_bytes)
    if config.file_bytes < largest:
        raise SettingsError(
            f"sweep file size {format_size(config.file_bytes)} ({sources['sweep_file_bytes']}) is smaller than the "
            f"largest block {format_size(largest)}; use --sweep-file-bytes {format_size(largest * 64)} or more"
        )
    return config


def host_rank_capacity() -> int:
    """How many rank processes this host can run at once: its available memory and its open-file limit."""
    memory = int(_available_memory_bytes() * _HOST_MEMORY_SHARE) // RANK_MEMORY_BYTES
    soft_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    files = (soft_files - 64) // 3 if soft_files != resource.RLIM_INFINITY else memory  # a pipe and a sentinel each
    return max(1, min(memory, files))


def _check_names(plan: CheckpointPlan, target: Path, option: str) -> None:
    """Every file name of `plan` must be legal on the target's filesystem (NAME_MAX) inside a run directory, and none
    of ckptqual's own (RESERVED_NAMES)."""
    name_max = os.pathconf(target, "PC_NAME_MAX")
    path_max = os.pathconf(target, "PC_PATH_MAX")
    room = path_max - len(str(target.resolve())) - _RUN_PATH_BYTES
    for spec in (spec for rank in plan.ranks for spec in rank.files):
        reserved = next((name for part in spec.path.split("/") for name in RESERVED_NAMES if _is_own(part, name)), None)
        if reserved is not None:
            raise SettingsError(
                f"{option}: file {spec.path[:60]!r} uses the name {reserved}, which ckptqual keeps for its own "
                f"bookkeeping on the target; rename it"
            )
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


def _is_own(part: str, name: str) -> bool:
    """Whether the path part `part` is ckptqual's own entry `name`, or a temporary of it (`.ckptqual-run.tmp-42`)."""
    return part == name or part.startswith(name + TEMP_INFIX)


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
