"""A rank's failure as the run sees it: one line, whose fault it is, and the errno of an I/O error."""

from __future__ import annotations

from typing import Any

from ckptqual.faults import RunError


class RankFailure(RunError):
    """A rank could not finish its part: it raised, died, or ran past the timeout; `fault` says whose fault."""


def failure_of(replies: list[dict[str, Any]], what: str) -> RankFailure | None:
    """The failure of the first rank that reported one, before those that gave up for it (naming how many more
    failed), or None."""
    failed = [(rank, r) for rank, r in enumerate(replies) if "error" in r]
    if not failed:
        return None
    failed.sort(key=lambda item: item[1].get("fault") == "not-run")  # a rank that gave up because another failed
    rank, reply = failed[0]
    others = f" (and {len(failed) - 1} more rank(s) failed)" if len(failed) > 1 else ""
    return RankFailure(
        f"rank {rank} failed during {what}: {reply['error']}{others}", reply["fault"], reply.get("errno")
    )
