"""Host-bound figures: when a figure measured the host's CPUs rather than the drive, and which verdicts it still gives.

A figure is host-bound when the CPUs this run may use (its affinity) were at least `CPU_SATURATED` busy over the
figure's timed region, counting every process and the kernel (/proc/stat). Then the drive kept up with a host that
had no CPU to spare: a host-bound throughput is a lower bound of the drive's, a host-bound duration an upper bound.
It still proves a limit it meets in that direction (at least `min` GB/s, at most `max` s): the drive does at least as
well. Every other verdict on it (a failed minimum, any maximum throughput, a ratio of two figures) would be the host's
verdict, so it is INVALID, with the figures.
"""

from __future__ import annotations

from dataclasses import replace

from ckptqual.host.cpu import HostUse
from ckptqual.limits.limits import Limit, Outcome, Verdict
from ckptqual.limits.measurements import MEASUREMENTS

CPU_SATURATED = 0.9


def host_bound_reason(use: HostUse | None, who: str = "ranks") -> str | None:
    """Why a figure measured with `use` is host-bound, in one line with the figures, or None when it is not."""
    if use is None or use.cpu_busy < CPU_SATURATED:
        return None
    drive = f", the drive ({use.device}) busy {use.device_busy:.0%} of the time" if use.device_busy is not None else ""
    return (
        f"host-bound: {who} used {use.work_cores:.2f} of {use.cores} cores, which were {use.cpu_busy:.0%} busy "
        f"(at least {CPU_SATURATED:.0%} is saturated){drive}"
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
