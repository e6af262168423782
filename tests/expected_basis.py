"""The basis a run's verdict must carry, from the spec's words and the run's own record: a suite test knows which
kind of limits its drive file declares and whether steady state could be reached; whether a figure was host-bound
depends on how busy this host was, so it is read from the judged measurements."""

from __future__ import annotations

from typing import Any

RELATIVE = "relative limits only"
STEADY = "steady state not reached (not required by this drive file)"
HOST = "host-bound figures kept, each met its minimum: "  # then the figures it means
# A run's every timed region on the slow stand-in drive (stand_in/slow_drive.py), whose image in memory has no device
# whose bytes could be counted.
SLOW_DRIVE_REGIONS = "raw write, raw read, fill checkpoints, restores"
NO_BLOCK_DEVICE = "lies on a filesystem without a block device"


def kept_figures(data: dict[str, Any]) -> list[str]:
    """The judged figures of the run that were host-bound and still passed their limit, as the basis names them."""
    named = []
    for m in data["measurements"]:
        if m.get("host_bound") and m.get("limit_number") is not None and m["outcome"] in ("PASS", "MARGINAL"):
            context = ", ".join(f"{key} {value}" for key, value in m.get("context", {}).items())
            named.append(m["measurement"] + (f" ({context})" if context else ""))
    return list(dict.fromkeys(named))


def host_bound_kept(data: dict[str, Any]) -> bool:
    """Whether some judged figure of the run was host-bound and still passed its limit."""
    return bool(kept_figures(data))


def host_phrase(data: dict[str, Any]) -> list[str]:
    """The basis's host-bound phrase of the run, naming its figures; none where no such figure was kept."""
    return [HOST + ", ".join(kept_figures(data))] if host_bound_kept(data) else []


def uncounted(data: dict[str, Any]) -> str:
    """The basis's phrase for a run on the slow stand-in drive: none of its regions' device bytes counted, for the one
    reason its record gives (the loop device's backing file, named by the kernel, lies in memory)."""
    regions = [data["baseline"]["device"][kind] for kind in ("write", "read")]
    regions += [[c["device"] for c in data.get("checkpoints", [])], [r["device"] for r in data.get("restore", [])]]
    names = SLOW_DRIVE_REGIONS.split(", ")[: 2 + bool(data.get("checkpoints")) + bool(data.get("restore"))]
    (reason,) = {device["not_countable"] for region in regions for device in region}
    assert NO_BLOCK_DEVICE in reason, reason
    rest = "so those figures rest on the page-cache checks alone"
    return f"device bytes not counted ({', '.join(names)}): {reason}, {rest}"


def qualified(data: dict[str, Any], *phrases: str, last: str | None = None) -> dict[str, Any]:
    """The QUALIFIED verdict of `data` with `phrases` (RELATIVE, STEADY), the host phrase where the record shows it,
    and `last` (the device bytes not counted: `uncounted`)."""
    return {"overall": "QUALIFIED", "reasons": [], "basis": [*phrases, *host_phrase(data), *filter(None, [last])]}


def line(verdict: dict[str, Any]) -> str:
    """The verdict line of a recorded verdict without reasons, in the spec's form."""
    basis = f" ({'; '.join(verdict['basis'])})" if verdict["basis"] else ""
    return f"ckptqual verdict: {verdict['overall']}{basis}"


def head(verdict: dict[str, Any]) -> str:
    """The verdict line of a recorded verdict up to its reasons: `ckptqual verdict: WORD (basis): `."""
    return f"{line(verdict)}: "
