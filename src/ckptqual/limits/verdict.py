"""Verdicts: one test's conclusion from what it found, and the run's one overall verdict from every test's.

The two agree by construction: a test fails exactly when its conclusion is a failing outcome, and the overall
verdict is computed from those outcomes alone, plus the limits that no test judged, the required parts that did not
run, the entries found planted in the run directory and an interruption; its basis says what it rests on.
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
from ckptqual.printable import printable

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
    figures: tuple[str, ...] = ()  # each judged figure with its value, limit and unit (Judgement.figure)

    @property
    def failed(self) -> bool:
        return self.outcome in FAILING

    def message(self, subject: str) -> str:
        """One line: subject, outcome and the reasons, e.g. `pass 3 NOT_STEADY: ... | ...`."""
        return f"{subject} {self.outcome}" + (f": {' | '.join(self.reasons)}" if self.reasons else "")

    def figures_line(self, subject: str) -> str:
        """One line: subject, outcome and every judged figure, e.g. `pass 1 PASS: fill_throughput 1.2 GB/s >= ...`."""
        return f"{subject} {self.outcome}" + (f": {'; '.join(self.figures)}" if self.figures else "")


@dataclass
class Findings:
    """What one test found, in order: judged measurements and the suite's own outcomes (INVALID, NOT_STEADY)."""

    items: list[tuple[Outcome, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)  # each figure no limit judged, with its value and unit

    def add(self, outcome: Outcome, reason: str | None) -> None:
        """Adds a finding; a reason of None (nothing found) adds nothing."""
        if reason:
            self.items.append((Outcome(outcome), reason))

    def add_judgements(self, judgements: Iterable[Judgement]) -> None:
        for judgement in judgements:
            if judgement.verdict is not None and (figure := judgement.figure()) is not None:  # judged: it has one
                self.add(judgement.verdict.outcome, judgement.verdict.message)
                self.figures.append(figure)
            else:
                where = ", ".join(f"{key}={value}" for key, value in judgement.context.items())
                self.measured.append(
                    f"{judgement.measurement} {judgement.value:.4g} {judgement.unit} (no limit"
                    + (f"; {where})" if where else ")")
                )

    def conclusion(self, only_measures: bool = False) -> Conclusion:
        """The test's outcome and reasons; a test that `only_measures` and found nothing, its figures unjudged, is
        MEASURED with those figures, not PASS."""
        if only_measures and not self.items and not self.figures and self.measured:
            return Conclusion(Outcome.MEASURED, tuple(self.measured), tuple(self.measured))
        outcomes = [outcome for outcome, _ in self.items]
        worst = min(outcomes, key=_SEVERITY.index, default=Outcome.PASS)
        reasons = tuple(reason for outcome, reason in self.items if outcome is not Outcome.PASS)
        return Conclusion(worst, reasons, tuple(self.figures))


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


# What a verdict rests on (its basis), in this order, each only where it applies.
RELATIVE_ONLY = "relative limits only"
STEADY_NOT_REQUIRED = "steady state not reached (not required by this drive file)"
HOST_BOUND_KEPT = "host-bound figures kept, each met its minimum"  # then ": " and the figures it means
UNCOUNTED = "device bytes not counted"
BASIS_ORDER = (RELATIVE_ONLY, STEADY_NOT_REQUIRED, HOST_BOUND_KEPT, UNCOUNTED)
_KEPT = (Outcome.PASS, Outcome.MARGINAL)


def verdict_basis(
    relative: Mapping[int, bool],
    measurements: Iterable[Mapping[str, Any]],
    steady_states: Mapping[str, Mapping[str, Any]],
    fill_passes: int,
    require_steady_state: bool,
    uncounted: str | None = None,
) -> tuple[str, ...]:
    """What the verdict rests on, from whether each declared limit (by number) is relative to a raw baseline, the
    judged measurements (results `measurements`), the SNIA states by pass (results `steady_state`) and the number of
    fill passes run: every judged limit relative; the last steady-state check (none: one pass) not reached where the
    drive file does not require it; a host-bound figure whose verdict was kept because it met its minimum; and, last,
    `uncounted`: which figures' device bytes could not be counted, and why (`uncounted_basis`)."""
    judged = [m for m in measurements if m.get("limit_number") is not None and m.get("outcome") != "MEASURED"]
    kinds = [relative[m["limit_number"]] for m in judged if m["limit_number"] in relative]
    last = steady_states[max(steady_states, key=int)] if steady_states else None
    kept = list(dict.fromkeys(figure_name(m) for m in judged if m.get("host_bound") and m.get("outcome") in _KEPT))
    applies = {
        RELATIVE_ONLY: bool(kinds) and all(kinds),
        STEADY_NOT_REQUIRED: fill_passes > 0 and not require_steady_state and not (last and last.get("reached")),
        HOST_BOUND_KEPT: bool(kept),
        UNCOUNTED: bool(uncounted),
    }
    named = {HOST_BOUND_KEPT: f"{HOST_BOUND_KEPT}: {', '.join(kept)}", UNCOUNTED: uncounted}
    return tuple(named.get(phrase) or phrase for phrase in BASIS_ORDER if applies[phrase])


def figure_name(measurement: Mapping[str, Any]) -> str:
    """A judged figure as the basis names it: 'fill_throughput (pass 2, state steady)'."""
    context = ", ".join(f"{key} {value}" for key, value in measurement.get("context", {}).items())
    return f"{measurement['measurement']}" + (f" ({context})" if context else "")


def _basis_rank(phrase: str) -> int:
    """Where `phrase` stands in BASIS_ORDER (a named phrase by the words it starts with)."""
    return next(index for index, start in enumerate(BASIS_ORDER) if phrase.startswith(start))


def uncounted_basis(regions: Iterable[tuple[str, Mapping[str, Any] | None]]) -> str | None:
    """The basis phrase for timed regions (name, results `device` entry) whose device bytes could not be counted:
    `device bytes not counted (fill checkpoints, restores): why`; None where every region was counted."""
    names: dict[str, None] = {}
    reasons: dict[str, None] = {}
    for name, device in regions:
        if device and device.get("not_countable"):
            names[name] = None
            reasons[device["not_countable"]] = None
    if not names:
        return None
    why = "; ".join(reasons)
    return f"{UNCOUNTED} ({', '.join(names)}): {why}, so those figures rest on the page-cache checks alone"


@dataclass(frozen=True)
class RunVerdict:
    """The overall verdict, its reasons (most severe first) and its basis (`verdict_basis`)."""

    overall: Overall
    reasons: tuple[str, ...]
    basis: tuple[str, ...] = ()

    def line(self) -> str:
        """`ckptqual verdict: WORD (basis; basis): reason | reason`, one printable line whatever its reasons hold
        (a drive file's or a record's text cannot end it and forge another)."""
        basis = f" ({'; '.join(self.basis)})" if self.basis else ""
        reasons = f": {' | '.join(self.reasons)}" if self.reasons else ""
        return printable(f"ckptqual verdict: {self.overall}{basis}{reasons}")

    def to_dict(self) -> dict[str, Any]:
        return {"overall": str(self.overall), "reasons": list(self.reasons), "basis": list(self.basis)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunVerdict:
        """The verdict a results file holds (`to_dict`); a file written before the basis existed has none, and a word
        this version does not know is kept as the file spells it."""
        word = data["overall"]
        overall = Overall(word) if word in {known.value for known in Overall} else word
        return cls(overall, tuple(data["reasons"]), tuple(data.get("basis", ())))


def overall_verdict(
    tests: Mapping[str, Mapping[str, Any]],
    unjudged: Iterable[Limit] = (),
    interruption: str | None = None,
    unmet: Iterable[str] = (),
    planted: Iterable[str] = (),
    refusal: str | None = None,
) -> RunVerdict:
    """The run's verdict from every test's recorded outcome and message, the limits never judged, an interruption,
    the reasons of the required parts that did not run (`unmet_requirements`), the entries found planted in the
    run directory (its figures cannot be trusted: INVALID) and the refusal of a run that never started, which leads
    its reasons with its fix (no limit is then said to be unjudged: nothing could judge it)."""
    if refusal is not None:
        interruption, unjudged = f"the run was refused before it started: {refusal}", ()
    by_verdict: dict[Overall, list[str]] = {verdict: [] for verdict in _OVERALL_ORDER}
    for test in tests.values():
        argued = _ARGUES.get(Outcome(test["outcome"]))
        if argued is not None and test["outcome"] != Outcome.NOT_RUN:
            by_verdict[argued].append(test["message"])
    by_verdict[Overall.INCOMPLETE] += _by_cause(tests, Outcome.NOT_RUN)
    by_verdict[Overall.INCOMPLETE][:0] = [*([interruption] if interruption else []), *unmet]
    by_verdict[Overall.INVALID] += [f"the run directory was tampered with: {line}" for line in planted]
    skips = _by_cause(tests, Outcome.SKIPPED)
    for limit in unjudged:
        why = f"; skipped: {'; '.join(skips)}" if skips else ""
        by_verdict[Overall.INCOMPLETE].append(f"{limit.title()} was never judged: no test measured it{why}")
    if not tests and refusal is None:
        by_verdict[Overall.INCOMPLETE].append("no qualification test ran")
    overall = next((verdict for verdict in _OVERALL_ORDER[:-1] if by_verdict[verdict]), Overall.QUALIFIED)
    reasons = [reason for verdict in _OVERALL_ORDER[:-1] for reason in by_verdict[verdict]]
    marginal = [test["message"] for test in tests.values() if test["outcome"] == Outcome.MARGINAL]
    return RunVerdict(overall, tuple(reasons + marginal))


def _by_cause(tests: Mapping[str, Mapping[str, Any]], outcome: Outcome) -> list[str]:
    """The messages of the tests of `outcome`, one line per cause: a cause that several tests share (an interruption
    that kept 30 sweep cells from running, a transfer this host cannot run) once, with their count and subjects."""
    causes: dict[str, list[str]] = {}
    for test in tests.values():
        if test["outcome"] == outcome:
            subject, _, cause = test["message"].partition(f" {outcome}: ")
            causes.setdefault(cause or test["message"], []).append(test.get("subject", subject))
    lines = []
    for cause, subjects in causes.items():
        if len(subjects) == 1:
            lines.append(f"{subjects[0]} {outcome}: {cause}")
        else:
            named = ", ".join(subjects) if len(subjects) <= 3 else f"{subjects[0]} and {len(subjects) - 1} more"
            lines.append(f"{len(subjects)} tests {outcome} ({named}): {cause}")
    return lines


def combined_verdict(verdicts: Mapping[str, RunVerdict]) -> RunVerdict:
    """The verdict of a run over several drives (label -> the drive's verdict): QUALIFIED only if every drive is,
    else the most severe drive's; a reason per drive that is not QUALIFIED, with its first reason; its basis holds
    `relative limits only` where every drive's does, each other phrase where any drive's does."""
    worst = min((verdict.overall for verdict in verdicts.values()), key=_OVERALL_ORDER.index, default=None)
    reasons = tuple(
        f"{label} {verdict.overall}" + (f": {verdict.reasons[0]}" if verdict.reasons else "")
        for label, verdict in verdicts.items()
        if verdict.overall != Overall.QUALIFIED
    )
    bases = [set(verdict.basis) for verdict in verdicts.values()]
    every, some = set.intersection(*bases) if bases else set(), set().union(*bases)
    kept = sorted((p for p in some if p != RELATIVE_ONLY or p in every), key=lambda p: (_basis_rank(p), p))
    basis = tuple(dict.fromkeys(kept))
    return RunVerdict(worst or Overall.INCOMPLETE, reasons or (() if worst else ("no drive was qualified",)), basis)
