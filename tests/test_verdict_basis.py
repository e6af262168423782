"""The verdict's basis (what a verdict rests on) and the one-line figures of a test: pure functions over the judged
limits and findings, each phrase only where it applies, in the spec's order and words."""

from ckptqual.config.drive_file import load_drive_file
from ckptqual.limits.judgement import judge
from ckptqual.limits.limits import Limit
from ckptqual.limits.measurements import is_relative
from ckptqual.limits.verdict import (
    Findings,
    Overall,
    RunVerdict,
    combined_verdict,
    verdict_basis,
)

RELATIVE = "relative limits only"
STEADY = "steady state not reached (not required by this drive file)"
HOST = "host-bound figures kept, each met its minimum: fill_throughput (pass 2)"
RELATIVE_LIMIT = Limit("fill_throughput", "ratio", "test", min=0.05, relative_to="raw_write", number=1)
ABSOLUTE_LIMIT = Limit("fill_throughput", "GB/s", "test", min=0.8, number=2)
REACHED = {"2": {"reached": False}, "5": {"reached": True}}
NOT_REACHED = {"2": {"reached": False}}


def measured(number: int, outcome: str = "PASS", host_bound: str | None = None, at: int = 2) -> dict:
    return {"measurement": "fill_throughput", "limit_number": number, "outcome": outcome, "host_bound": host_bound,
            "context": {"pass": at}}  # fmt: skip


def basis(measurements, steady=REACHED, passes=5, required=False, limits=(RELATIVE_LIMIT, ABSOLUTE_LIMIT)):
    return verdict_basis({limit.number: limit.relative_to is not None for limit in limits}, measurements, steady,
                         passes, required)  # fmt: skip


def test_a_run_judged_only_by_relative_limits_says_so():
    assert basis([measured(1)]) == (RELATIVE,)


def test_one_absolute_limit_judged_takes_relative_limits_only_away():
    assert basis([measured(1), measured(2)]) == ()


def test_an_absolute_limit_declared_but_never_judged_leaves_relative_limits_only():
    assert basis([measured(1), {"measurement": "fill_throughput", "limit_number": None, "outcome": "MEASURED"}]) == (
        RELATIVE,
    )


def test_no_judged_limit_is_no_basis_of_relative_limits():
    assert basis([]) == ()


def test_steady_state_not_reached_shows_only_where_the_drive_file_does_not_require_it():
    assert basis([measured(2)], steady=NOT_REACHED) == (STEADY,)
    assert basis([measured(2)], steady=NOT_REACHED, required=True) == ()
    assert basis([measured(2)], steady={}, passes=1) == (STEADY,)  # one pass: no steady-state rounds at all
    assert basis([measured(2)], steady={}, passes=0) == ()  # no fill pass ran: nothing to be steady


def test_the_last_steady_state_check_decides():
    assert basis([measured(2)], steady={"2": {"reached": True}, "10": {"reached": False}}) == (STEADY,)
    assert basis([measured(2)], steady=REACHED) == ()


def test_a_host_bound_figure_kept_because_it_met_its_minimum_shows():
    assert basis([measured(2, "PASS", "host-bound: ...")]) == (HOST,)
    assert basis([measured(2, "MARGINAL", "host-bound: ...")]) == (HOST,)
    assert basis([measured(2, "INVALID", "host-bound: ...")]) == ()  # not kept: it does not count


def test_every_phrase_in_the_spec_order():
    assert basis([measured(1, "PASS", "host-bound: ...")], steady=NOT_REACHED) == (RELATIVE, STEADY, HOST)


def test_the_basis_names_only_the_host_bound_figures_that_met_their_minimum():
    """A host-bound figure that failed stands beside one that passed: the basis names the one it means, not both."""
    judged = [measured(2, "PASS", "host-bound: ...", at=2), measured(2, "FAIL", "host-bound: ...", at=3)]
    assert basis(judged) == ("host-bound figures kept, each met its minimum: fill_throughput (pass 2)",)
    assert basis([measured(2, "FAIL", "host-bound: ...", at=3)]) == ()


def test_the_verdict_line_carries_the_basis_before_the_reasons():
    assert RunVerdict(Overall.QUALIFIED, (), (RELATIVE, STEADY)).line() == (
        "ckptqual verdict: QUALIFIED (relative limits only; steady state not reached (not required by this drive file))"
    )
    assert RunVerdict(Overall.NOT_QUALIFIED, ("pass 1 FAIL: x",), (RELATIVE,)).line() == (
        "ckptqual verdict: NOT QUALIFIED (relative limits only): pass 1 FAIL: x"
    )
    assert RunVerdict(Overall.QUALIFIED, ()).line() == "ckptqual verdict: QUALIFIED"


def test_the_basis_round_trips_through_the_results_file_and_an_old_file_has_none():
    verdict = RunVerdict(Overall.QUALIFIED, (), (RELATIVE,))
    assert verdict.to_dict() == {"overall": "QUALIFIED", "reasons": [], "basis": [RELATIVE]}
    assert RunVerdict.from_dict(verdict.to_dict()) == verdict
    assert RunVerdict.from_dict({"overall": "QUALIFIED", "reasons": []}).basis == ()


def test_several_drives_rest_on_relative_limits_only_where_every_drive_does():
    one = RunVerdict(Overall.QUALIFIED, (), (RELATIVE, HOST))
    other = RunVerdict(Overall.QUALIFIED, (), (STEADY,))
    assert combined_verdict({"a": one, "b": other}).basis == (STEADY, HOST)
    third = RunVerdict(Overall.QUALIFIED, (), ("host-bound figures kept, each met its minimum: restore_throughput",))
    assert combined_verdict({"a": one, "c": third}).basis == (HOST, third.basis[0])
    assert combined_verdict({"a": one, "b": one}).basis == (RELATIVE, HOST)


def test_a_passing_test_line_carries_value_limit_and_unit_of_every_judged_figure():
    limits = [RELATIVE_LIMIT, ABSOLUTE_LIMIT]
    findings = Findings()
    context = {"pass": 1, "state": "fresh"}
    findings.add_judgements(judge(limits, "fill_throughput", 1.5, "GB/s", context, {"raw_write": 3e9}))
    conclusion = findings.conclusion()
    assert conclusion.figures_line("pass 1") == (
        "pass 1 PASS: fill_throughput 1.5 GB/s = 0.5 of raw_write >= 0.05 of raw_write (pass=1, state=fresh); "
        "fill_throughput 1.5 GB/s >= 0.8 GB/s (pass=1, state=fresh)"
    )


def test_a_failed_or_marginal_figure_shows_which_side_of_its_limit_it_fell():
    marginal = Limit("fill_throughput", "GB/s", "t", min=0.8, marginal=0.5)
    limits = [marginal, Limit("fill_throughput", "GB/s", "t", min=2)]
    findings = Findings()
    findings.add_judgements(judge(limits, "fill_throughput", 1.0, "GB/s", {}, {}))
    assert findings.conclusion().figures_line("pass 1") == (
        "pass 1 FAIL: fill_throughput 1 GB/s >= 0.8 GB/s MARGINAL; fill_throughput 1 GB/s < 2 GB/s"
    )


def test_every_limit_of_the_built_in_drive_file_is_relative_and_the_review_drives_have_absolute_ones():
    """`local.toml` judges the target against itself (raw baselines, a layout against its regular twin), so its
    QUALIFIED says `relative limits only`; the review's drive files hold the drive to its published figures."""
    local = load_drive_file("local").limits
    assert all(is_relative(limit.measurement, limit.relative_to) for limit in local)
    assert {limit.measurement for limit in local} >= {"fill_throughput", "layout_throughput_ratio"}
    relative = {limit.number: is_relative(limit.measurement, limit.relative_to) for limit in local}
    judged = [{"measurement": limit.measurement, "limit_number": limit.number, "outcome": "PASS"} for limit in local]
    assert verdict_basis(relative, judged, REACHED, 5, False) == (RELATIVE,)
    for review in ("d5-p5336", "d7-ps1010"):
        assert not all(is_relative(limit.measurement, limit.relative_to) for limit in load_drive_file(review).limits)
