"""The regression gate's answer: which metrics it must judge (the drive file's required parts, or --require), why
each one it could not judge or resolve leaves it inconclusive and what would fix that, and its exit code. The gate is
never green on a required figure it did not judge: 0 only when every required metric was judged and resolved and
none regressed, 1 on a regression, 3 when inconclusive."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from ckptqual.report.noise import MAX_ROUNDS, NOISE_FLOOR

PASSED, REGRESSED, INCONCLUSIVE = 0, 1, 3
# The metrics each part of a run measures, as globs over compare's metric names.
PART_METRICS = {
    "baseline": ("raw_write", "raw_read"),
    "fill": ("pass*", "steady"),
    "restore": ("restore",),
    "sweep": ("sweep",),
    "layouts": ("layouts.*",),
}

# The setting that sets a metric's rounds, by the metric's name's start: (what a round is, the flag).
_ROUNDS = (
    ("pass", ("checkpoints per pass", "--checkpoints-per-pass")),
    ("restore", ("restored checkpoints", "--restore-checkpoints")),
    ("layouts.", ("odd layouts", "--layout-examples")),
)


@dataclass(frozen=True)
class Required:
    """A glob of metrics the gate must judge, and what requires it."""

    pattern: str
    origin: str


def required_metrics(records: Sequence[Mapping[str, Any]], given: Sequence[str] | None) -> list[Required]:
    """`given` (--require) where given, else the metrics of the parts the drive file requires, as the first of
    `records` (the run under test first) that names them recorded it (settings.requires); where none does, every part
    the first record ran."""
    if given:
        return [Required(pattern, "--require") for pattern in given]
    stated = next((parts for data in records if (parts := _parts(data.get("settings", {}), "requires"))), None)
    if stated is not None:
        origin, parts = "the drive file's [verdict] requires", stated
    else:
        ran = _parts(records[0].get("settings", {}), "parts") if records else None
        origin, parts = "every part run: the record names no requires", ran or list(PART_METRICS)
    return [Required(pattern, f"part {part}, {origin}") for part in parts for pattern in PART_METRICS.get(part, ())]


def _parts(settings: Any, key: str) -> list[str] | None:
    """The part names a record's settings list under `key`; None where it lists none (absent, or not a list)."""
    value = settings.get(key) if isinstance(settings, Mapping) else None
    return [part for part in value if isinstance(part, str)] or None if isinstance(value, list) else None


def matching(names: Sequence[str], pattern: str) -> list[str]:
    return [name for name in names if fnmatchcase(name, pattern)]


def fix_for(name: str, have: int, needed: int | None, allowed: float, settings: Mapping[str, Any]) -> str:
    """How many rounds would resolve metric `name` (it has `have` per run), as the setting to change."""
    if name.startswith("sweep."):
        return "a sweep cell is one round, its band does not narrow: require the sweep as a whole (--require sweep)"
    if needed is None:
        if allowed < NOISE_FLOOR:
            return (
                f"no number of rounds resolves it: no band is narrower than {NOISE_FLOOR:.0%}, so give "
                f"--max-regression {NOISE_FLOOR:.0%} or more"
            )
        return f"its rounds spread so widely that even {MAX_ROUNDS:,} would not resolve it: rerun both on a quiet host"
    if name == "steady":
        steady_passes = max(int(settings.get("passes") or 3) - 1, 1)
        per_pass = math.ceil(needed / steady_passes)
        return (
            f"{needed} steady-state checkpoints would resolve it (has {have}): rerun both with "
            f"--checkpoints-per-pass {per_pass}"
        )
    rounds = next((row for prefix, row in _ROUNDS if name.startswith(prefix)), None)
    if rounds is not None:
        return f"{needed} {rounds[0]} would resolve it (has {have}): rerun both with {rounds[1]} {needed}"
    if name == "sweep":
        return (
            f"{needed} measured sweep cells would resolve it (has {have}): rerun both with more block sizes or thread "
            "counts (--sweep-block-sizes, --sweep-threads)"
        )
    return f"{needed} rounds would resolve it (has {have}; the raw baseline's rounds are not a setting)"


def exit_code(regressions: int, inconclusive: int) -> int:
    """1 on a regression, else 3 where a required metric was not judged or not resolved, else 0."""
    if regressions:
        return REGRESSED
    return INCONCLUSIVE if inconclusive else PASSED
