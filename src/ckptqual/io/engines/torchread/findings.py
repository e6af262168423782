"""The one error of the archive checks, and the helper that words where two sequences part."""

from __future__ import annotations

from collections.abc import Sequence


class FormatError(ValueError):
    """The bytes are not the torch.save archive expected; the message names the record and the problem."""


def first_difference(found: Sequence, wanted: Sequence) -> int:
    """The first index where the sequences differ (the shorter one's length where one is the other's start)."""
    return next(
        (i for i, (a, b) in enumerate(zip(found, wanted, strict=False)) if a != b), min(len(found), len(wanted))
    )
