"""Verdicts: one test's conclusion from what it found, and the run's one overall verdict from every test's.

The two agree by construction: a test fails exactly when its conclusion is a failing outcome, and the overall
verdict is computed from those outcomes alone, plus the limits that no test judged, the required parts that did not
run, the entries found planted in the run directory and an interruption.
Pure functions over data: nothing here runs I/O or knows pytest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ckptqual.faults import RunError
from ckptqual.limits.judgement import Judgement
from ckptqual.limits.limits import Limit, Outcome

# Within one test the most severe finding decides; a figure that does not count (INVALID) cannot pass or fail.
_SEVERITY = (Outcome.INVALID, Outcome.FAIL, Outcome.NOT_STEADY, Outcome.MARGINAL, Outcome.PASS)
FAILING = frozenset(
    {Outcome.FAIL, Outcome.NOT_STEADY, Outcome.INVALID, Outcome.ERROR, Outcome.NOT_RUN, Outcome.INTERRUPTED}
)


class Overall(StrEnum):
    """The run's one verdict, as a gate reads it."""

    QUALIFIED = "QUALIFIED"
    NOT_QUALIFIED = "NOT QUALIFIED"
    INVALID = "INVALID"
    INCOMPLETE = "INCOMPLETE"


# Which overall verdict a test outcome argues for; the most severe argument wins (this order).
_ARGUES = {
    Outcome.FAIL: Overall.NOT_QUALIFIED,
    Outcome.NOT_STEADY: Overall.NOT_QUALIFIED,
    Outcome.INVALID: Overall.INVALID,
    Outcome.ERROR: Overall.INCOMPLETE,
    Outcome.NOT_RUN: Overall.INCOMPLETE,
    Outcome.INTERRUPTED: Overall.INCOMPLETE,
}
_OVERALL_ORDER = (Overall.NOT_QUALIFIED, Overall.INVALID, Overall.INCOMPLETE, Overall.QUALIFIED)


@dataclass(frozen=True)
class Conclusion:
    """A test's outcome and every reason behind it (all of them: one failure never hides another)."""

    outcome: Outcome
    reasons: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.outcome in FAILING

    def message(self, subject: str) -> str:
        """One line: subject, outcome and the reasons, e.g. `pass 3 NOT_STEADY: ... | ...`."""
        return f"{subject} {self.outcome}" + (f": {' | '.join(self.reasons)}" if self.reasons else "")


@dataclass
class Findings:
    """What one test found, in order: judged measurements and the suite's own outcomes (INVALID, NOT_STEADY)."""

    items: list[tuple[Outcome, str]] = field(default_factory=list)

    def add(self, outcome: Outcome, reason: str | None) -> None:
        """Adds a finding; a reason of None (nothing found) adds nothing."""
        if reason:
            self.items.append((Outcome(outcome), reason))

    def add_judgements(self, judgements: Iterable[Judgement]) -> None:
        for judgement in judgements:
            if judgement.verdict is not None:
                self.add(judgement.verdict.outcome, judgement.verdict.message)

    def conclusion(self) -> Conclusion:
        outcomes = [outcome for outcome, _ in self.items]
        worst = min(outcomes, key=_SEVERITY.index, default=Outcome.PASS)
        return Conclusion(worst, tuple(reason for outcome, reason in self.items if outcome is not Outcome.PASS))


def outcome_of_error(error: BaseException) -> Outcome:
    """The outcome of a test that raised `error` instead of concluding: the target's fault fails it, an earlier
    failure means it was not run, anything else means the test broke."""
    if isinstance(error, RunError):
        if error.target_at_fault:
            return Outcome.FAIL
        return Outcome.NOT_RUN if error.fault == "not-run" else Outcome.ERROR
    return Outcome.ERROR


def unjudged_limits(limits: Iterable[Limit], measurements: Iterable[Mapping[str, Any]]) -> list[Limit]:
    """The declared limits that judged no measurement of the run."""
    judged = {m.get("limit_number") for m in measurements}
    return [limit for limit in limits if limit.number not in judged]


@dataclass(frozen=True)
class PartRun:
    """What became of one part's tests: each test left out of the run as (its subject, or None for the part as a
    whole, and how it was dropped, e.g. "deselected by -k 'not restore'"), and the (outcome, message) of each that
    reported."""

    left_out: tuple[tuple[str | None, str], ...] = ()
    reported: tuple[tuple[str, str], ...] = ()


def unmet_requirements(required: Iterable[str], parts: Mapping[str, PartRun], origin: str) -> list[str]:
    """Why each required part keeps the verdict from QUALIFIED, one reason a part, ending in `origin` (what
    requires it): some of its tests were left out, or every one that reported was skipped. A part whose tests failed
    or broke needs no reason here: those outcomes argue for the verdict themselves."""
    reasons = []
    for name in required:
        why = _why_not_run(parts.get(name, PartRun()))
        if why:
            reasons.append(f"required part {name} {why} ({origin})")
    return reasons


def _why_not_run(part: PartRun) -> str | None:
    if part.left_out:
        by_cause: dict[str, list[str | None]] = {}
        for subject, cause in part.left_out:
            by_cause.setdefault(cause, []).append(subject)
        whole = not part.reported and len(by_cause) == 1
        texts = [cause if whole or None in subjects else f"{_subjects(subjects)} {cause}"
                 for cause, subjects in by_cause.items()]  # fmt: skip
        return f"was not run{'' if not part.reported else ' in full'}: {'; '.join(texts)}"
    if not part.reported:
        return "was not run: none of its tests was selected"
    if all(outcome == Outcome.SKIPPED for outcome, _ in part.reported):
        more = f" (and {len(part.reported) - 1} more skipped)" if len(part.reported) > 1 else ""
        return f"did not run: {part.reported[0][1]}{more}"
    return None


def _subjects(subjects: list[str | None]) -> str:
    named = [subject for subject in subjects if subject]
    return ", ".join(named) if len(named) <= 3 else f"{named[0]} and {len(named) - 1} more of its tests"


@dataclass(frozen=True)
class RunVerdict:
    """The overall verdict and its reasons, most severe first."""

    overall: Overall
    reasons: tuple[str, ...]

    def line(self) -> str:
        return f"ckptqual verdict: {self.overall}" + (f": {' | '.join(self.reasons)}" if self.reasons else "")

    def to_dict(self) -> dict[str, Any]:
        return {"overall": str(self.overall), "reasons": list(self.reasons)}


def overall_verdict(
    tests: Mapping[str, Mapping[str, Any]],
    unjudged: Iterable[Limit] = (),
    interruption: str | None = None,
    unmet: Iterable[str] = (),
    planted: Iterable[str] = (),
) -> RunVerdict:
    """The run's verdict from every test's recorded outcome and message, the limits never judged, an interruption,
    the reasons of the required parts that did not run (`unmet_requirements`) and the entries found planted in the
    run directory (its figures cannot be trusted: INVALID)."""
    by_verdict: dict[Overall, list[str]] = {verdict: [] for verdict in _OVERALL_ORDER}
    for test in tests.values():
        argued = _ARGUES.get(Outcome(test["outcome"]))
        if argued is not None:
            by_verdict[argued].append(test["message"])
    by_verdict[Overall.INCOMPLETE][:0] = [*([interruption] if interruption else []), *unmet]
    by_verdict[Overall.INVALID] += [f"the run directory was tampered with: {line}" for line in planted]
    skips = sorted({test["message"] for test in tests.values() if test["outcome"] == Outcome.SKIPPED})
    for limit in unjudged:
        why = f"; skipped: {'; '.join(skips)}" if skips else ""
        by_verdict[Overall.INCOMPLETE].append(f"{limit.title()} was never judged: no test measured it{why}")
    if not tests:
        by_verdict[Overall.INCOMPLETE].append("no qualification test ran")
    overall = next((verdict for verdict in _OVERALL_ORDER[:-1] if by_verdict[verdict]), Overall.QUALIFIED)
    reasons = [reason for verdict in _OVERALL_ORDER[:-1] for reason in by_verdict[verdict]]
    marginal = [test["message"] for test in tests.values() if test["outcome"] == Outcome.MARGINAL]
    return RunVerdict(overall, tuple(reasons + marginal))


def combined_verdict(verdicts: Mapping[str, RunVerdict]) -> RunVerdict:
    """The verdict of a run over several drives (label -> the drive's verdict): QUALIFIED only if every drive is,
    else the most severe drive's; a reason per drive that is not QUALIFIED, with its first reason."""
    worst = min((verdict.overall for verdict in verdicts.values()), key=_OVERALL_ORDER.index, default=None)
    reasons = tuple(
        f"{label} {verdict.overall}" + (f": {verdict.reasons[0]}" if verdict.reasons else "")
        for label, verdict in verdicts.items()
        if verdict.overall != Overall.QUALIFIED
    )
    return RunVerdict(worst or Overall.INCOMPLETE, reasons or (() if worst else ("no drive was qualified",)))
