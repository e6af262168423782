"""The one key check of the plan's files (workload TOML, plan JSON): the first unknown or missing key of a table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal


def key_problem(
    table: Mapping[str, Any], required: Iterable[str], optional: Iterable[str] = ()
) -> tuple[Literal["unknown", "missing"], str] | None:
    """("unknown", key) for the first key not allowed, ("missing", key) for the first required key absent, or None."""
    required = tuple(required)
    allowed = required + tuple(optional)
    for key in table:
        if key not in allowed:
            return "unknown", key
    for key in required:
        if key not in table:
            return "missing", key
    return None
