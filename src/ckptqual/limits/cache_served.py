"""Figures the drive did not serve alone: a timed read whose bytes the devices under the target did not read, a timed
write whose fsynced bytes they did not receive, or one during which they moved clearly more than the suite did
(counted by host.device_bytes).

The devices' counters are host-wide. What takes from them is a cache between the files and the devices (a loop
device's backing file in the page cache, ZFS's ARC, a write-back layer): the suite's cold reads already tolerate up to
5 % of a file left in the page cache, so devices that moved under `MIN_DEVICE_SHARE` of the suite's bytes mean a
cache moved the rest, and the figure is the cache's. What adds to them is the filesystem's journal and metadata,
readahead, a mirror's second copy and other processes' I/O. The suite alone adds up to 18 % (the checkpoint format's
headers at small scales, the filesystem's metadata, a loop device's readahead; measured on ext4 and xfs, see
docs/verdict.md); devices that moved more than `MAX_EXTRA_SHARE` of the suite's bytes plus `MAX_EXTRA_BYTES` beyond
them served other I/O meanwhile, which both slows the figure and can hide a cache (other
I/O makes up the bytes a cache kept from the devices). Either way the figure is INVALID, with both counts. Where
nothing can be counted (tmpfs, a network filesystem, ranks on other hosts) the figure stands on the page-cache checks
alone, and the record says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ckptqual.host.device_bytes import DeviceBytes
from ckptqual.limits.limits import Limit, Outcome, Verdict

MIN_DEVICE_SHARE = 0.9
MAX_EXTRA_SHARE = 0.5
MAX_EXTRA_BYTES = 4 << 20
OTHER_IO = "the drive served other I/O"

_VERBS = {"read": ("read", "the suite read"), "written": ("received", "the suite wrote and fsynced")}


def cache_served_reason(what: str, counted: DeviceBytes | None) -> str | None:
    """Why the figure of `what` (e.g. "restore of checkpoint 3") came from a cache, in one line with both byte counts,
    or None (the devices moved enough, or nothing could be counted)."""
    if counted is None or counted.device_bytes is None or counted.suite_bytes <= 0:
        return None
    verb, suite = _VERBS[counted.direction]
    below = f"; {'; '.join(counted.layer_below)}" if counted.layer_below else ""
    most = most_bytes(counted.suite_bytes)
    if counted.device_bytes > most:
        return (
            f"{what}: {OTHER_IO}: the devices under the target ({', '.join(counted.devices)}) {verb} "
            f"{counted.device_bytes:,} bytes while {suite} {counted.suite_bytes:,} (at most {most:,} expected of the "
            f"suite alone), so the figure is not the drive's alone{below}; qualify a drive nothing else uses"
        )
    if counted.device_bytes >= MIN_DEVICE_SHARE * counted.suite_bytes:
        return None
    return (
        f"{what}: the devices under the target ({', '.join(counted.devices)}) {verb} {counted.device_bytes:,} bytes "
        f"of the {counted.suite_bytes:,} bytes {suite} (at least {MIN_DEVICE_SHARE:.0%} expected), so a cache the "
        f"suite cannot evict served the figure{below}; qualify the device itself, not a file or cache above it"
    )


def most_bytes(suite_bytes: int) -> int:
    """The most the devices move for `suite_bytes` of the suite's when nothing else uses them."""
    return int(suite_bytes * (1 + MAX_EXTRA_SHARE)) + MAX_EXTRA_BYTES


def relative_to_served(limit: Limit, verdict: Verdict, served: Mapping[str, str]) -> Verdict:
    """The verdict of a limit relative to a baseline that a cache served (`served`: baseline -> why): INVALID, for the
    figure was divided by the cache's rate; any other verdict as it was."""
    reason = served.get(limit.relative_to or "")
    if reason is None:
        return verdict
    return replace(verdict, outcome=Outcome.INVALID, message=f"{verdict.message} not judged: {reason}")
