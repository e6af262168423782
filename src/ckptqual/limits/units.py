"""Units and sizes: a value in one unit expressed in another of its kind, and sizes written like "128K"."""

from __future__ import annotations

import re

# unit -> (kind, factor to the kind's base unit: bytes/s, seconds, or 1 for a ratio)
UNITS: dict[str, tuple[str, float]] = {
    "GB/s": ("throughput", 1e9),
    "GiB/s": ("throughput", 2**30),
    "MB/s": ("throughput", 1e6),
    "MiB/s": ("throughput", 2**20),
    "B/s": ("throughput", 1.0),
    "s": ("duration", 1.0),
    "ms": ("duration", 1e-3),
    "min": ("duration", 60.0),
    "ratio": ("ratio", 1.0),
    "C": ("temperature", 1.0),  # degrees Celsius
}
_SIZE_FACTORS = {"K": 2**10, "M": 2**20, "G": 2**30}
_SIZE_PATTERN = re.compile(r"([1-9][0-9]*)([KMG]?)")


def unit_kind(unit: str) -> str:
    """The kind of `unit`: "throughput", "duration" or "ratio"."""
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    return UNITS[unit][0]


def to_unit(value: float, from_unit: str, target_unit: str) -> float:
    """`value` given in `from_unit`, expressed in `target_unit` of the same kind (e.g. GiB/s to GB/s)."""
    if unit_kind(from_unit) != unit_kind(target_unit):
        kinds = f"{unit_kind(from_unit)} to {unit_kind(target_unit)}"
        raise ValueError(f"cannot convert {from_unit} to {target_unit}: {kinds}")
    return value * UNITS[from_unit][1] / UNITS[target_unit][1]


def parse_size(text: str) -> int:
    """Bytes of a size string: a positive integer, optionally with binary K, M or G ("128K" = 131072)."""
    match = _SIZE_PATTERN.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a size: {text!r}; write an integer, optionally with K, M or G, e.g. '128K'")
    number, suffix = match.groups()
    return int(number) * _SIZE_FACTORS.get(suffix, 1)


def format_size(nbytes: int) -> str:
    """`nbytes` with the largest of G, M, K that divides it exactly; the inverse of parse_size."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"a size must be a positive integer number of bytes, got {nbytes!r}")
    for suffix, factor in reversed(_SIZE_FACTORS.items()):
        if nbytes % factor == 0:
            return f"{nbytes // factor}{suffix}"
    return str(nbytes)
