"""The one table of settings: each row a flag, a drive-file key, a kind, a default and a help line.

From it come the command-line options (pytest's and the `ckptqual` command's), the keys a drive file may hold,
the overlay command line > drive file > default with where each value came from, and `--help`'s defaults.
A new option is one row here plus the code that uses it.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ckptqual.config.values import (
    ADDRESS,
    FLAG,
    PATH,
    TEXT,
    Kind,
    SettingsError,
    choice,
    fraction,
    list_of,
    number,
    size,
    whole,
)
from ckptqual.io.readers import TRANSFERS
from ckptqual.io.readers.base import ALIGN_BYTES
from ckptqual.limits.units import format_size
from ckptqual.plan.dcp import MAX_THREADS as MAX_DCP_THREADS
from ckptqual.plan.formats import DEFAULT_FORMAT, FORMAT_ENGINES, FORMATS

MAX_SEED = 2**32 - 1
MIN_RANK_TIMEOUT_S = 1.0
MAX_SWEEP_THREADS = 4096  # gdsio's sweep goes to 128
PARTS = ("baseline", "fill", "restore", "sweep", "layouts")  # what a drive file's [run] parts may list


def _engines() -> Collection[str]:
    from ckptqual.io.engines import ENGINES  # when first checked: it loads numpy, which `ckptqual plan` never needs

    return [name for name in ENGINES if name not in FORMAT_ENGINES.values()]  # a format's own engine: --format


COMMAND_LINE, DEFAULT = "command line", "default"


def _resolves(address: Any) -> bool:
    """Whether `address` is HOST:PORT whose HOST resolves (checked before any I/O: an unknown name fails at once)."""
    if not ADDRESS.ok(address):
        return False
    host, _, port = address.rpartition(":")
    try:
        return bool(socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        return False


LAYOUT = Kind(
    lambda v: isinstance(v, str) and re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", v) is not None,
    "must be TPxPP, two whole numbers of at least 1, e.g. 8x1",
)
CONTROLLER_ADDRESS = Kind(
    _resolves,
    "must be HOST:PORT with a port from 1 to 65535 and a HOST that resolves (a name in DNS or /etc/hosts, or an "
    "address), e.g. 10.0.0.1:29410",
)


@dataclass(frozen=True)
class Setting:
    """One setting. `default` is written as on the command line; None where it is computed (`unset` says how)."""

    name: str  # the setting's name: its options key, its origin's key, its key in the record
    flag: str | None  # None: only a drive file sets it
    section: str | None  # the drive file's table; None: only the command line sets it
    kind: Kind
    default: str | None
    help: str
    key: str | None = None  # the key in the drive file's section, where it is not `name`
    unset: str = "none"
    many: bool = False  # the flag may be given several times: its value is then the list of what was given
    attribute: str | None = None  # the field of SettingValues that holds it, where it is not `name`

    @property
    def file_key(self) -> str:
        return self.key or self.name

    @property
    def field_name(self) -> str:
        return self.attribute or self.name

    def help_text(self, drive_file: bool = True) -> str:
        """The help line with the default and where it would come from."""
        fallback = self.default if self.default is not None else self.unset
        origin = f"the drive file's [{self.section}] {self.file_key}, else " if drive_file and self.section else ""
        return f"{self.help} (default: {origin}{fallback})"

    def default_value(self) -> Any:
        return None if self.default is None else self.kind.from_text(self.default)

    def from_command_line(self, value: Any) -> Any:
        """`value` given for this setting's flag, checked; a bad one is a SettingsError naming flag, value and fix."""
        try:
            return self.kind.from_text(value)
        except ValueError as error:
            raise SettingsError(f"{self.flag or self.name} {value!r}: {error}") from None


_ROW = "ckptqual.setting"  # the key of a field's row in its metadata


def row(
    flag: str | None,
    section: str | None,
    kind: Kind,
    default: str | None,
    help: str,
    *,
    key: str | None = None,
    unset: str = "none",
    many: bool = False,
    name: str | None = None,
) -> Any:
    """A field of SettingValues with its row (see Setting); `name` where the setting's name is not the field's."""
    return field(metadata={_ROW: Setting(name or "", flag, section, kind, default, help, key, unset, many)})


_FILE_SIZE = size(ALIGN_BYTES)


@dataclass(frozen=True, kw_only=True)
class SettingValues:
    """The one table of settings: each field one setting, its type the resolved value's (where a row computes an
    unset value, as the seed, its type is what the run gets), its row (flag, drive-file section, kind, default, help)
    in `row(...)`. `name` is the setting's name where the attribute differs: RunSettings.workload is the loaded
    workload and RunSettings.layout_plan the plan read from the file."""

    # fmt: off
    drive: str = row("--drive", None, TEXT, "local", "drive file: a name in thresholds/ or a path to a .toml file")
    target: Path | None = row("--target", None, PATH, None,
            "directory on the drive under test, empty or ckptqual's own; give it several times, or once with a file "
            "listing a drive file and a mount point per line, to qualify several drives",
            unset="a fresh directory under the system temp dir", many=True)
    workload_name: str = row("--workload", "run", TEXT, "llama3.1-405b-review",
            "workload: a name in fixtures/workloads/ or a path to a .toml file", name="workload")
    scale: float = row("--scale", "run", fraction("scale"), "1.0",
            "shrink every tensor (and the odd layouts) by this factor, 0 < S <= 1, and not so far that the "
            f"checkpoint holds less than one {format_size(ALIGN_BYTES)} block per file")
    engine: str = row("--engine", "run", choice(_engines, "engine"), "stream",
            "how checkpoint files are written: stream (bounded memory), stream-direct (O_DIRECT) or torch-save")
    format: str = row("--format", "run", choice(FORMATS, "format"), DEFAULT_FORMAT,
            "checkpoint format: torch-save (DLIO's torch.save files, written by --engine), dcp "
            "(torch.distributed.checkpoint's FileSystemWriter files) or safetensors (a Hugging Face export); a "
            "workload file may name it too")
    dcp_threads: int = row("--dcp-threads", "run", whole(1, MAX_DCP_THREADS), "1",
            "files each rank writes under --format dcp (FileSystemWriter's thread_count)")
    restore_layout: str | None = row("--restore-layout", "run", LAYOUT, None,
            "restore onto this TP x PP layout (TPxPP, e.g. 8x1, the same ranks in all): each new rank reads what "
            "its shards need of the checkpoint", unset="the layout that saved")
    checkpoints_per_pass: int = row("--checkpoints-per-pass", "run", whole(1), "3",
            "checkpoints per fill pass (the retention limit)")
    fill_fraction: float | None = row("--fill-fraction", "run", fraction("fraction"), None,
            "fill this fraction of the target's capacity per pass instead")
    passes: int = row("--passes", "run", whole(1, 100), "3",
            "fill passes; the SNIA steady-state rule needs at most 25 rounds")
    results: Path | None = row("--results", None, PATH, None, "write a JSON record of the run to this path")
    report_dir: Path | None = row("--report-dir", None, PATH, None,
            "write report.html and its figures (ckptqual report) into this directory at the end of the run")
    keep: bool = row("--keep", None, FLAG, "false", "keep the run directory and its checkpoints")
    rank_timeout_s: float = row("--rank-timeout", None,
            number(lambda s: s >= MIN_RANK_TIMEOUT_S, f"a number >= {MIN_RANK_TIMEOUT_S:g} second(s), e.g. 600"),
            "600", f"seconds a rank may take for one checkpoint before the run fails it, at least "
            f"{MIN_RANK_TIMEOUT_S:g} (starting, writing and fsyncing a checkpoint takes longer than that)")
    memory_budget_bytes: int = row("--memory-budget", None, size(), None,
            "memory the ranks may hold together under torch-save, e.g. 32G", unset="half of the available memory")
    seed: int = row("--seed", None, whole(0, MAX_SEED), None, "payload seed", unset="random, recorded in the results")
    restore_checkpoints: int = row("--restore-checkpoints", "run", whole(1), "1",
            "how many of the newest checkpoints test_restore reads back")
    sample_interval_s: float = row("--sample-interval", None, number(lambda s: s == 0 or s >= 0.1,
            "0 (off) or a number >= 0.1 seconds, e.g. 1"),
            "1", "seconds between samples of the drive's counters, CPU and memory (the time series); 0: off")
    require_steady_state: bool = row(None, "run", FLAG, "false", "fail the last pass unless the SNIA rule holds")
    early_stop: bool = row("--early-stop", "run", FLAG, "false",
            "end a steady-state pass once the SNIA rule holds and no remaining checkpoint could change a verdict")
    checkpoint_interval_s: float = row("--checkpoint-interval", "run",
            number(lambda s: s >= 0, "a number >= 0 seconds, e.g. 1800"), "0",
            "seconds of training compute between the end of one checkpoint's stall and the start of the next, the "
            "drive idle meanwhile; 0: back to back")
    async_save: bool = row("--async-save", "run", FLAG, "false",
            "save as torch.distributed.checkpoint.async_save does: training stalls while the ranks stage their "
            "state to host memory (and while the previous save is still being written), the writes run behind")
    layout_examples: int = row("--layout-examples", "layouts", whole(0, 10_000), "5", "odd shard layouts to try",
            key="examples")
    layout_seed: int = row("--layout-seed", "layouts", whole(0, MAX_SEED), "0", "seed of the odd layouts",
            key="seed")
    layout_max_total_bytes: int = row("--layout-max-bytes", "layouts", size(), "64M",
            "largest odd layout, e.g. 64M; a drive file's value shrinks with --scale", key="max_total_bytes")
    layout_plan_file: Path | None = row("--layout-plan", None, PATH, None,
            "replay one layout from a plan file (as printed)", name="layout_plan")
    sweep_block_sizes_bytes: tuple[int, ...] = row("--sweep-block-sizes", "sweep", list_of(_FILE_SIZE), "1M,128K,8K",
            "read sweep block sizes, multiples of 4K", key="block_sizes")
    sweep_threads: tuple[int, ...] = row("--sweep-threads", "sweep", list_of(whole(1, MAX_SWEEP_THREADS)), "16,4,1",
            f"read sweep thread counts (the I/O depth of a cell), 1 to {MAX_SWEEP_THREADS}", key="threads")
    sweep_jobs: int = row(None, "sweep", whole(1), "4", "read sweep files, one per job", key="jobs")
    sweep_batch: int = row(None, "sweep", whole(1), "16", "reads a sweep job submits before it waits", key="batch")
    sweep_file_bytes: int = row("--sweep-file-bytes", "sweep", _FILE_SIZE, "256M",
            "size of each of the read sweep's files (one per job)", key="file_bytes")
    sweep_requests: int = row("--sweep-requests", None, whole(1), "2048",
            "reads per sweep job per cell, at most one pass over its file")
    sweep_transfers: tuple[str, ...] = row("--transfer", "sweep", list_of(choice(TRANSFERS, "transfer")),
            ",".join(TRANSFERS), "read sweep transfer types; those this host cannot run are skipped with the reason",
            key="transfers")
    parts: tuple[str, ...] = row(None, "run", list_of(choice(PARTS, "part")), ",".join(PARTS),
            "the parts of the run that run; the tests of the others are skipped, naming why")
    nodes: int = row("--nodes", None, whole(1, 4096), "1",
            "nodes whose torchrun workers share the plan's ranks, on one shared filesystem (docs/many-nodes.md)")
    controller: str | None = row("--controller", None, CONTROLLER_ADDRESS, None,
            "with --nodes: HOST:PORT at which the nodes' workers reach this process, which listens there only",
            unset="none; --nodes 2 or more needs it")
    secret_file: Path | None = row("--secret-file", None, PATH, None,
            "with --nodes: a file this process writes the run's secret to (mode 0600) and every node's `ckptqual node "
            "--secret-file` reads, in a directory of yours that every node sees",
            unset="none; --nodes 2 or more needs it")
    # fmt: on


def table_of(values: type[SettingValues]) -> tuple[Setting, ...]:
    """The rows of `values`' fields in the order declared, each named, and knowing the field it fills."""
    rows = [(spec.name, spec.metadata[_ROW]) for spec in fields(values)]
    return tuple(replace(row, name=row.name or attribute, attribute=attribute) for attribute, row in rows)


SETTINGS = table_of(SettingValues)


def setting(name: str, table: Iterable[Setting] = SETTINGS) -> Setting:
    """The row called `name`."""
    return next(row for row in table if row.name == name)


def add_options(add: Callable[..., Any], table: Iterable[Setting] = SETTINGS, drive_file: bool = True) -> None:
    """Declares each row's flag with `add` (argparse's add_argument or pytest's addoption); values stay text."""
    for row in table:
        if row.flag:
            action = {"action": "store_true"} if row.kind is FLAG else {"metavar": row.flag[2:].upper()}
            action |= {"action": "append"} if row.many else {}
            add(row.flag, dest=row.name, default=None, help=row.help_text(drive_file), **action)


def overlay(
    command_line: Mapping[str, Any], file_values: Mapping[str, Any], file_source: str, table: Iterable[Setting]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each row's value, command line over drive file over default, and where each came from."""
    table = tuple(table)
    unknown = set(command_line) - {row.name for row in table}
    if unknown:
        raise SettingsError(f"unknown setting {sorted(unknown)[0]!r}; known: {', '.join(row.name for row in table)}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for row in table:
        if command_line.get(row.name) is not None:
            values[row.name], sources[row.name] = row.from_command_line(command_line[row.name]), COMMAND_LINE
        elif row.name in file_values:
            values[row.name], sources[row.name] = file_values[row.name], file_source
        else:
            values[row.name], sources[row.name] = row.default_value(), DEFAULT
    return values, sources
