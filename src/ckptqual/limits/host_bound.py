"""Host-bound figures: when a figure measured the host's CPUs rather than the drive, and which verdicts it still gives.

A figure is host-bound when its own threads (the ranks and their helper lanes, the sweep's readers) were runnable but
waiting for a CPU for more than `MAX_WAIT_SHARE` seconds per second of the figure, their waits added up in the
process that waited most (host.waits, from each thread's schedstat). Other processes that keep the CPUs busy while
the ranks wait on the drive do not make a figure host-bound: a thread blocked on I/O is not waiting for a CPU. Where
the threads' waits could not be read, the figure falls back on the CPUs this run may use being at least
`CPU_SATURATED` busy (/proc/stat, any process).

A host-bound throughput is a lower bound of the drive's, a host-bound duration an upper bound. It still proves a
limit it meets in that direction (at least `min` GB/s, at most `max` s): the drive does at least as well. Every other
verdict on it (a failed minimum, any maximum throughput, a ratio of two figures) would be the host's verdict, so it is
INVALID, with the figures.
"""

from __future__ import annotations

from dataclasses import replace

from ckptqual.host.cpu import HostUse
from ckptqual.limits.limits import Limit, Outcome, Verdict
from ckptqual.limits.measurements import MEASUREMENTS

# Measured on 2 cores (docs/verdict.md): ranks on a loop device throttled to 100 MB/s wrote 0.83-0.91 of it while
# their threads waited 6-14 % of their time; 0.80-0.82 at 21-26 %, 0.65-0.67 at 40-48 %, 0.14-0.33 at 74-94 %. Up to
# a quarter, a figure stayed within about 10 % of the same drive's on a quieter host.
MAX_WAIT_SHARE = 0.25
CPU_SATURATED = 0.9  # only where the threads' waits could not be read

# How `wait_share` reads everywhere it is printed (results' `waits`, JUnit, summary): seconds waited per second of
# the figure, the threads of one process added up, so a 16-thread sweep cell can show 4.69 s a second.
PER_SECOND = "a second in the process that waited most, its threads added up"


def waits_text(use: HostUse | None, who: str = "ranks") -> str | None:
    """The figure's own threads' time in a few words: `threads of ranks waited 0.02 s for a CPU in 1.62 s (0.01 s
    a second in the process that waited most, its threads added up), ran 0.41 s`; None where not measured."""
    if use is None or use.wait_share is None:
        return None
    blocked = f", blocked on I/O {use.io_blocked_s:.2f} s" if use.io_blocked_s is not None else ""
    return (
        f"threads of {who} waited {use.threads_wait_s:.2f} s for a CPU in {use.wall_s:.2f} s "
        f"({use.wait_share:.2f} s {PER_SECOND}), ran {use.threads_run_s:.2f} s{blocked}"
    )


def host_bound_reason(use: HostUse | None, who: str = "ranks") -> str | None:
    """Why a figure measured with `use` is host-bound, in one line with the figures, or None when it is not."""
    if use is None:
        return None
    if use.wait_share is not None:
        if use.wait_share <= MAX_WAIT_SHARE:
            return None
        return f"host-bound: {waits_text(use, who)}, more than {MAX_WAIT_SHARE:.2f} s a second waiting for a CPU"
    if use.cpu_busy < CPU_SATURATED:
        return None
    drive = f", the drive ({use.device}) busy {use.device_busy:.0%} of the time" if use.device_busy is not None else ""
    return (
        f"host-bound: {who} used {use.work_cores:.2f} of {use.cores} cores, which were {use.cpu_busy:.0%} busy "
        f"(at least {CPU_SATURATED:.0%} is saturated; the threads' own waits could not be read){drive}"
    )


def bound_holds(limit: Limit, outcome: Outcome) -> bool:
    """Whether a host-bound figure still decides `outcome` under `limit`: it met a minimum throughput or a maximum
    duration, which the drive, at least as fast as the figure, meets too."""
    kind = MEASUREMENTS[limit.measurement].kind
    one_sided = (kind == "throughput" and limit.min is not None) or (kind == "duration" and limit.max is not None)
    return one_sided and outcome in (Outcome.PASS, Outcome.MARGINAL)


def decide(limit: Limit, verdict: Verdict, reason: str | None) -> Verdict:
    """The verdict of a figure that was host-bound for `reason` (None: it was not): kept where the bound decides it,
    else INVALID with the figure, the limit and the reason."""
    if reason is None:
        return verdict
    if bound_holds(limit, verdict.outcome):
        return replace(verdict, message=f"{verdict.message}; {reason}, so the drive does at least as well")
    return replace(verdict, outcome=Outcome.INVALID, message=f"{verdict.message} not judged: {reason}")
