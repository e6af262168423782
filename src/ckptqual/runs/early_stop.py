"""Time to verdict (--early-stop): a steady-state pass ends once the SNIA rule holds and the checkpoints it has yet to
write could not change any verdict of the pass.

The bound: the remaining checkpoints of the pass are assumed to run between the slowest and the fastest rate of the
SNIA window (the drive is steady, by the rule). Every measurement of a pass is monotonic in the rate of the
checkpoints added to it (total bytes / total time, the mean rate, mean and worst seconds), and so is the outcome of
every limit on it (FAIL, MARGINAL and PASS are intervals of the value). So if the pass completed with all of its
remaining checkpoints at the slowest rate and, again, all at the fastest, gives the outcomes of the pass as written
so far, for every limit, then no mix of rates in between can give others, and the pass ends.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from ckptqual.limits.steady import steady_state
from ckptqual.runs.fill import PassResult

# The outcome of every limit on a pass's measurements, in order (what "a verdict" of the pass is).
Outcomes = Callable[[PassResult], tuple[str, ...]]


def completed_at(result: PassResult, rate_GBps: float) -> PassResult:
    """`result` as it would end with every remaining checkpoint written at `rate_GBps` (each of the mean size)."""
    size = statistics.mean(c.bytes for c in result.checkpoints)
    remaining = result.planned - len(result.checkpoints)
    model = result.checkpoints[-1].at_seconds(round(size), size / rate_GBps / 1e9)
    return replace(result, checkpoints=[*result.checkpoints, *[model] * remaining], ended_early=None)


def stop_reason(result: PassResult, earlier_rates: Sequence[float], outcomes: Outcomes) -> str | None:
    """Why pass `result` can end now, or None. `earlier_rates`: the per-checkpoint rates (GB/s) of the earlier
    steady-state passes, which the SNIA window spans together with this pass's."""
    remaining = result.planned - len(result.checkpoints)
    if remaining <= 0 or result.invalid_reason():
        return None
    state = steady_state([*earlier_rates, *(c.GBps for c in result.checkpoints)])
    if not state.reached:
        return None
    slowest, fastest = min(state.window), max(state.window)
    now = outcomes(result)
    if any(outcomes(completed_at(result, rate)) != now for rate in (slowest, fastest)):
        return None
    shown = ", ".join(outcome for outcome in now if outcome != "MEASURED") or "none judged"
    return (
        f"{state.reason}; the {remaining} remaining checkpoint(s), at the window's slowest to fastest "
        f"{slowest:.4g}-{fastest:.4g} GB/s, could not change the pass's outcomes ({shown})"
    )
