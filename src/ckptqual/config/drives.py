"""The drives of one run: `--target` given once, several times, or once with a file listing a drive file and a
mount point per line; each drive's label (what its test IDs carry) and the per-drive paths of its outputs.

A label is the target's block device name where no other target shares that device, else the target directory's
name, with `_2`, `_3`, ... where still not unique; it holds only letters, digits, `_` and `.` (never `-`, which
separates it from the rest of a test ID, e.g. `test_fill_pass[nvme1-2]`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptqual.config.values import SettingsError
from ckptqual.host.identity import identify

LIST_EXAMPLE = "d5-p5336 /mnt/nvme1"


@dataclass(frozen=True)
class DriveTarget:
    """One drive to qualify: its target directory, its drive file (None: the run's --drive) and its label (None
    when the run has this one drive: today's test IDs and outputs, unchanged)."""

    target: Path | None
    drive: str | None = None
    label: str | None = None


def drive_targets(targets: Sequence[str] | None, drive: str | None) -> list[DriveTarget]:
    """The run's drives from the --target values (None: one fresh temp dir) and --drive; raises SettingsError for
    a list file with a bad line, a list file beside a --drive, or a target named twice."""
    if not targets:
        return [DriveTarget(None)]
    if len(targets) == 1 and Path(targets[0]).is_file():
        if drive is not None:
            raise SettingsError(
                f"--target {targets[0]} lists a drive file for each drive; drop --drive {drive}, or give the "
                f"targets as --target DIR (each then uses --drive)"
            )
        listed: list[tuple[str | None, Path]] = list(parse_target_list(Path(targets[0])))
    else:
        listed = [(None, Path(target)) for target in targets]
    if len(listed) == 1:
        return [DriveTarget(listed[0][1], listed[0][0])]
    twice = [str(path) for path, count in Counter(path.resolve() for _, path in listed).items() if count > 1]
    if twice:
        raise SettingsError(f"--target {twice[0]} is given twice; give each drive's directory once")
    labels = drive_labels([path for _, path in listed])
    return [DriveTarget(path, name, label) for (name, path), label in zip(listed, labels, strict=True)]


def parse_target_list(path: Path) -> list[tuple[str, Path]]:
    """(drive file, mount point) per line of a list file; `#` starts a comment; a bad line is a SettingsError with
    its number and the fix."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsError(f"--target {path}: cannot be read ({error}); give a text file or a directory") from None
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"--target {path} line {number}"
        if len(fields) != 2:
            raise SettingsError(
                f"{where}: {line.strip()!r} has {len(fields)} field(s); write a drive file and a mount point, "
                f"e.g. {LIST_EXAMPLE!r}"
            )
        if not Path(fields[1]).is_absolute():
            raise SettingsError(
                f"{where}: mount point {fields[1]!r} is not an absolute path; write it from /, e.g. {LIST_EXAMPLE!r}"
            )
        entries.append((fields[0], Path(fields[1])))
    if not entries:
        raise SettingsError(f"--target {path}: lists no drive; write one line per drive, e.g. {LIST_EXAMPLE!r}")
    return entries


def drive_labels(targets: Sequence[Path]) -> list[str]:
    """A short unique label per target: its block device when unique among them, else the directory's name."""
    devices = [_device(target) for target in targets]
    shared = Counter(devices)
    names = [
        _clean(device) if device and shared[device] == 1 else _clean(target.name) or "target"
        for device, target in zip(devices, targets, strict=True)
    ]
    labels: list[str] = []
    for name in names:
        label, suffix = name, 2
        while label in labels:
            label, suffix = f"{name}_{suffix}", suffix + 1
        labels.append(label)
    return labels


def _device(target: Path) -> str | None:
    """The block device holding `target`, or None (none, as on tmpfs, or the target cannot be read yet)."""
    try:
        device = identify(target).device
    except OSError:
        return None
    return None if device == "unknown" else device


def _clean(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", name).strip("_")


def per_drive_path(path: Path, label: str) -> Path:
    """`qual.json` -> `qual.LABEL.json`: where one drive's file goes when the run has several."""
    return path.with_name(f"{path.stem}.{label}{path.suffix}")
