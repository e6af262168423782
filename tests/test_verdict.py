"""Test conclusions and the run's overall verdict: every reason kept, failures never hidden, nothing unjudged passes."""

import pytest

from ckptqual.faults import RunError
from ckptqual.limits.judgement import Judgement
from ckptqual.limits.limits import Limit, Outcome, Verdict
from ckptqual.limits.verdict import (
    Findings,
    Overall,
    PartRun,
    outcome_of_error,
    overall_verdict,
    unjudged_limits,
    unmet_requirements,
)


def judgement(outcome: Outcome, message: str) -> Judgement:
    return Judgement("fill_throughput", 1.0, "GB/s", {}, Verdict(outcome, 1.0, 2.0, "GB/s", ">=", message), ">= 2", 1)


def test_a_test_with_no_findings_passes():
    assert Findings().conclusion().outcome is Outcome.PASS


def test_not_steady_and_a_failed_limit_both_stay_in_the_message():
    findings = Findings()
    findings.add_judgements([judgement(Outcome.FAIL, "fill_throughput 1 GB/s < min 2 GB/s")])
    findings.add(Outcome.NOT_STEADY, "SNIA steady state: range 33% exceeds 20%")
    conclusion = findings.conclusion()
    assert conclusion.outcome is Outcome.FAIL and conclusion.failed
    message = conclusion.message("pass 3")
    assert "fill_throughput 1 GB/s < min 2 GB/s" in message and "range 33% exceeds 20%" in message


def test_not_steady_alone_fails_as_not_steady():
    findings = Findings()
    findings.add_judgements([judgement(Outcome.PASS, "fine")])
    findings.add(Outcome.NOT_STEADY, "not steady")
    assert findings.conclusion().outcome is Outcome.NOT_STEADY
    assert findings.conclusion().reasons == ("not steady",)


def test_invalid_outranks_a_limit_because_the_figure_does_not_count():
    findings = Findings()
    findings.add(Outcome.INVALID, "host-bound")
    findings.add_judgements([judgement(Outcome.FAIL, "slow")])
    assert findings.conclusion().outcome is Outcome.INVALID


def test_a_marginal_result_passes_with_its_reason():
    findings = Findings()
    findings.add_judgements([judgement(Outcome.MARGINAL, "within the band")])
    conclusion = findings.conclusion()
    assert conclusion.outcome is Outcome.MARGINAL and not conclusion.failed


def test_nothing_found_adds_nothing():
    findings = Findings()
    findings.add(Outcome.INVALID, None)
    assert findings.conclusion().outcome is Outcome.PASS


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (RunError("EIO", "io-error"), Outcome.FAIL),
        (RunError("no answer", "unresponsive"), Outcome.FAIL),
        (RunError("lost a file", "integrity"), Outcome.FAIL),
        (RunError("not run: pass 1 failed", "not-run"), Outcome.NOT_RUN),
        (RunError("rank 3 was killed", "crash"), Outcome.ERROR),
        (TypeError("a bug"), Outcome.ERROR),
    ],
)
def test_a_raised_error_is_the_targets_fault_or_the_runs(error, outcome):
    assert outcome_of_error(error) is outcome


def record(outcome: str, message: str = "") -> dict:
    return {"subject": "x", "outcome": outcome, "message": message or outcome, "when": "call"}


def limit(number: int, measurement: str = "sweep_read_bandwidth") -> Limit:
    return Limit(measurement, "GiB/s", "review", min=3.78, where=(("transfer", ("gpu-direct",)),), number=number)


def test_all_passed_and_every_limit_judged_is_qualified():
    verdict = overall_verdict({"a": record("PASS"), "b": record("MARGINAL", "b MARGINAL: close")})
    assert verdict.overall is Overall.QUALIFIED
    assert verdict.reasons == ("b MARGINAL: close",)


def test_a_failure_is_not_qualified_whatever_else_happened():
    tests = {
        "a": record("FAIL", "pass 1 FAIL: slow"),
        "b": record("INVALID"),
        "c": record("NOT_RUN"),
        "d": record("PASS"),
    }
    verdict = overall_verdict(tests, [limit(1)], "the run was interrupted by SIGTERM")
    assert verdict.overall is Overall.NOT_QUALIFIED
    assert verdict.reasons[0] == "pass 1 FAIL: slow"
    assert "the run was interrupted by SIGTERM" in verdict.reasons


def test_invalid_without_failure_is_invalid():
    assert overall_verdict({"a": record("INVALID"), "b": record("PASS")}).overall is Overall.INVALID


def test_not_steady_is_not_qualified():
    assert overall_verdict({"a": record("NOT_STEADY")}).overall is Overall.NOT_QUALIFIED


@pytest.mark.parametrize("outcome", ["ERROR", "NOT_RUN", "INTERRUPTED"])
def test_a_test_that_did_not_conclude_makes_the_run_incomplete(outcome):
    assert overall_verdict({"a": record("PASS"), "b": record(outcome)}).overall is Overall.INCOMPLETE


def test_a_limit_never_judged_makes_an_all_green_run_incomplete_and_is_named():
    tests = {"a": record("PASS"), "b": record("SKIPPED", "sweep gpu-direct-1M-128 SKIPPED: needs a GPU")}
    verdict = overall_verdict(tests, [limit(5)])
    assert verdict.overall is Overall.INCOMPLETE
    assert (
        "limit 5 (sweep_read_bandwidth >= 3.78 GiB/s where transfer=gpu-direct) was never judged" in verdict.reasons[0]
    )
    assert "needs a GPU" in verdict.reasons[0]


def test_an_interruption_alone_makes_the_run_incomplete():
    verdict = overall_verdict({"a": record("PASS")}, interruption="the run was interrupted by SIGINT (Ctrl-C)")
    assert verdict.overall is Overall.INCOMPLETE


def test_a_run_without_tests_is_incomplete():
    assert overall_verdict({}).overall is Overall.INCOMPLETE


def test_unjudged_limits_are_those_no_measurement_names():
    limits = [limit(1), limit(2), limit(3)]
    measurements = [{"limit_number": 2}, {"limit_number": None}]
    assert [lim.number for lim in unjudged_limits(limits, measurements)] == [1, 3]


# Required parts (a drive file's [verdict] requires)

ORIGIN = "required by d.toml [verdict] requires"
RESTORED = PartRun(reported=(("PASS", "restore PASS"),))
FILLED = PartRun(reported=(("PASS", "pass 1 PASS"), ("PASS", "pass 2 PASS")))


def test_every_required_part_that_ran_and_passed_meets_its_requirement():
    assert unmet_requirements(["fill", "restore"], {"fill": FILLED, "restore": RESTORED}, ORIGIN) == []
    marginal = PartRun(reported=(("MARGINAL", "restore MARGINAL: close"),))
    assert unmet_requirements(["restore"], {"restore": marginal}, ORIGIN) == []


def test_a_deselected_required_part_names_the_part_and_the_option():
    dropped = PartRun(left_out=(("restore", "deselected by -k 'not restore'"),))
    (reason,) = unmet_requirements(["fill", "restore"], {"fill": FILLED, "restore": dropped}, ORIGIN)
    assert (
        reason
        == "required part restore was not run: deselected by -k 'not restore' (required by d.toml [verdict] requires)"
    )
    verdict = overall_verdict({"f": record("PASS")}, unmet=[reason])
    assert verdict.overall is Overall.INCOMPLETE and verdict.reasons == (reason,)


def test_a_part_left_out_in_part_names_what_was_left_out():
    cells = [(f"sweep cpu-only-1M-{threads}", "deselected by --deselect x.py::c") for threads in (16, 4, 1, 2)]
    sweep = PartRun(left_out=(("pass 3", "deselected by -k 'not 3'"), *cells), reported=(("PASS", "pass 1 PASS"),))
    (reason,) = unmet_requirements(["sweep"], {"sweep": sweep}, ORIGIN)
    assert reason.startswith(
        "required part sweep was not run in full: pass 3 deselected by -k 'not 3'; "
        "sweep cpu-only-1M-16 and 3 more of its tests deselected by --deselect x.py::c"
    )


def test_a_part_never_collected_says_how_the_command_line_left_it_out():
    missing = PartRun(left_out=((None, "not collected: pytest was given tests_qual/test_fill.py"),))
    (reason,) = unmet_requirements(["restore"], {"restore": missing}, ORIGIN)
    assert reason.startswith("required part restore was not run: not collected: pytest was given tests_qual/test_fill")
    (absent,) = unmet_requirements(["restore"], {}, ORIGIN)
    assert absent.startswith("required part restore was not run: none of its tests was selected")


def test_a_skipped_required_restore_keeps_the_run_from_qualified():
    skipped = PartRun(reported=(("SKIPPED", "restore SKIPPED: no time"),))
    (reason,) = unmet_requirements(["restore"], {"restore": skipped}, ORIGIN)
    assert reason.startswith("required part restore did not run: restore SKIPPED: no time")
    tests = {"f": record("PASS"), "r": record("SKIPPED", "restore SKIPPED: no time")}
    assert overall_verdict(tests, unmet=[reason]).overall is Overall.INCOMPLETE


def test_a_part_of_which_some_tests_ran_and_the_rest_were_skipped_is_met():
    cells = PartRun(reported=(("SKIPPED", "sweep gpu-direct-1M-16 SKIPPED: no GPU"), ("PASS", "sweep cpu-only PASS")))
    assert unmet_requirements(["sweep"], {"sweep": cells}, ORIGIN) == []


@pytest.mark.parametrize(("outcome", "overall"), [("ERROR", "INCOMPLETE"), ("FAIL", "NOT QUALIFIED"),
                                                  ("INVALID", "INVALID"), ("NOT_RUN", "INCOMPLETE")])  # fmt: skip
def test_a_required_restore_that_failed_or_broke_argues_through_its_own_outcome(outcome, overall):
    broke = PartRun(reported=((outcome, f"restore {outcome}: why"),))
    assert unmet_requirements(["restore"], {"restore": broke}, ORIGIN) == []
    assert overall_verdict({"r": record(outcome, f"restore {outcome}: why")}).overall == overall


def test_a_refused_run_leads_with_its_refusal_and_calls_no_limit_unjudged():
    limit = Limit("fill_throughput", "GB/s", "test", min=1.0, number=1)
    unmet = ["required part fill was not run: never reached"]
    refusal = "--target /t: the run needs 9 GB; use --scale 0.1"
    verdict = overall_verdict({}, [limit], None, unmet, (), refusal)
    assert verdict.overall is Overall.INCOMPLETE
    assert verdict.reasons == (f"the run was refused before it started: {refusal}", *unmet)
