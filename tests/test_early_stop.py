"""Time to verdict (--early-stop): the bound on the remaining checkpoints, and a whole run on a simulated drive whose
rate settles (a loop device throttled by the block layer) giving the full run's verdict from fewer checkpoints."""

from ckptqual.limits.judgement import judge
from ckptqual.limits.limits import Limit
from ckptqual.runs.early_stop import completed_at, stop_reason
from ckptqual.runs.fill import CheckpointRecord, PassResult
from ckptqual.runs.qualification import fill_measurements
from stand_in import slow_drive
from suite_runs import LiveSuite, lenient_drive, results

GB = 1_000_000_000
STEADY_LIMIT = """
[[limit]]
name = "fill_throughput"
min = 0.1
unit = "ratio"
relative_to = "raw_write"
marginal = 0.5
where = { state = "steady" }
source = "test: local.toml's steady-state limit"
"""


def steady_pass(rates: list[float], planned: int) -> PassResult:
    """A pass of 1 GB checkpoints written at `rates` GB/s, of `planned` checkpoints."""
    records = [
        CheckpointRecord(2, i + 1, i, 1 / rate, 0.5 / rate, GB, 100.0, None, 0.0) for i, rate in enumerate(rates)
    ]
    return PassResult(2, records, planned=planned)


def outcomes_under(*limits: Limit):
    def outcomes(result: PassResult) -> tuple[str, ...]:
        context = {"pass": 2, "state": "steady"}
        return tuple(
            j.outcome
            for name, value, unit in fill_measurements(result)
            for j in judge(limits, name, value, unit, context, {})
        )

    return outcomes


def at_least(gbps: float, marginal: float = 0.0) -> Limit:
    return Limit("fill_throughput", "GB/s", "test", min=gbps, marginal=marginal, number=1)


STEADY = [2.0, 2.1, 1.95, 2.05, 2.0]  # range 7.4 %, slope excursion 0 %: steady


def test_a_steady_pass_far_from_its_limit_ends_and_says_why():
    reason = stop_reason(steady_pass(STEADY, planned=33), [], outcomes_under(at_least(1.0)))
    assert reason is not None
    assert "steady over the last 5 rounds" in reason and "28 remaining checkpoint(s)" in reason
    assert "1.95-2.1 GB/s" in reason and "(PASS)" in reason


def test_a_pass_whose_remaining_checkpoints_could_reach_the_marginal_band_goes_on():
    # now: 2.02 GB/s, PASS above 1.9 x 1.05 = 1.995; 28 more at the window's slowest 1.95 GB/s end near 1.96: MARGINAL
    limit = at_least(1.9, marginal=0.05)
    result = steady_pass(STEADY, planned=33)
    assert outcomes_under(limit)(result)[0] == "PASS"
    assert outcomes_under(limit)(completed_at(result, 1.95))[0] == "MARGINAL"
    assert stop_reason(result, [], outcomes_under(limit)) is None
    assert stop_reason(steady_pass(STEADY, planned=6), [], outcomes_under(limit)) is not None  # one more cannot


def test_a_failing_pass_ends_only_when_the_fastest_rate_cannot_rescue_it():
    assert stop_reason(steady_pass(STEADY, planned=33), [], outcomes_under(at_least(2.5))) is not None
    assert stop_reason(steady_pass(STEADY, planned=33), [], outcomes_under(at_least(2.08))) is None


def test_no_early_end_before_the_snia_window_holds_nor_after_the_last_checkpoint():
    assert stop_reason(steady_pass([2.0, 2.0, 2.0, 2.0], planned=33), [], outcomes_under()) is None  # 4 of 5
    assert stop_reason(steady_pass([2.0], planned=33), [2.0, 2.0, 2.0, 2.0], outcomes_under()) is not None
    assert stop_reason(steady_pass([1.0, 1.5, 2.0, 2.5, 3.0], planned=33), [], outcomes_under()) is None  # a trend
    assert stop_reason(steady_pass(STEADY, planned=5), [], outcomes_under()) is None  # nothing left to skip


# Two stand-in drives (stand_in/slow_drive.py), each its own device and throttle: the full run on one, the early-stopped
# run on the other, at the same time. A checkpoint of 11 MB takes 2 s at the write throttle, against a few hundredths
# of a second of the ranks' own work and their waits for a CPU (up to 0.3 s at load 25 on 2 cores), so that the drive
# sets the rates and they settle within the SNIA window on any host; no other work's I/O reaches either drive.
WRITE_BPS = 5_500_000
throttled_target = slow_drive.throttled_target(write_bps=WRITE_BPS, read_bps=4 * WRITE_BPS, drives=2)
PER_PASS = 6  # pass 2 can end after the SNIA window's first 5 checkpoints; pass 3 after any of its first 5


def test_early_stop_gives_the_full_runs_verdict_from_fewer_checkpoints(throttled_target, tmp_path, capsys):
    drive = lenient_drive(tmp_path / "throttled.toml", "throttled loop device", extra_limits=STEADY_LIMIT)
    common = ["--workload", "llama3-8b-dp2", "--scale", "0.0001", "--checkpoints-per-pass", str(PER_PASS)]
    common += ["--passes", "3", "--drive", str(drive)]
    suites = {}
    for name, extra, target in (("full", [], throttled_target[0]), ("early", ["--early-stop"], throttled_target[1])):
        args = [*common, *extra, "--target", str(target.point), "--results", str(tmp_path / f"{name}.json")]
        suites[name] = LiveSuite(tmp_path / f"{name}.log", *args)
    codes = {name: suite.finish(timeout_s=400) for name, suite in suites.items()}
    assert codes == {"full": 0, "early": 0}, {name: suite.output()[-3000:] for name, suite in suites.items()}
    runs = {name: results(tmp_path / f"{name}.json") for name in suites}
    assert runs["early"]["settings"]["early_stop"] is True
    assert runs["early"]["settings"]["sources"]["early_stop"] == "command line"
    assert runs["full"]["verdict"]["overall"] == runs["early"]["verdict"]["overall"] == "QUALIFIED"
    outcome = {name: {t["subject"]: t["outcome"] for t in record["tests"].values()} for name, record in runs.items()}
    assert outcome["full"] == outcome["early"]
    written = {name: [len(p["checkpoints"]) for p in record["passes"]] for name, record in runs.items()}
    seconds = [(c["pass_number"], round(c["seconds"], 2)) for c in runs["early"]["checkpoints"]]
    assert written["full"] == [PER_PASS] * 3
    # pass 1 always fills completely; the drive's rate is its throttle's, steady within a window that spans passes 2
    # and 3: pass 3 ends early every time, pass 2 where its first 5 checkpoints were steady already
    assert written["early"][0] == PER_PASS and written["early"][1] in (5, PER_PASS), seconds
    assert written["early"][2] < PER_PASS, (seconds, runs["early"]["steady_state"])
    for result, count in zip(runs["early"]["passes"], written["early"], strict=True):
        if count == PER_PASS:
            assert result["ended_early"] is None, result
        else:  # ended on the SNIA window, saying why and what it did not write
            assert result["ended_early"].startswith("steady over the last 5 rounds"), result["ended_early"]
            assert f"the {PER_PASS - count} remaining checkpoint(s)" in result["ended_early"]
    # How much sooner is a figure (README, goal: a third of the steady-state passes' time), not asserted.
    steady = {name: sum(p["seconds"] for p in record["passes"][1:]) for name, record in runs.items()}
    with capsys.disabled():
        print(
            f"\nthrottled loop devices {WRITE_BPS / 1e6:g} MB/s: checkpoints written per pass {written['full']} -> "
            f"{written['early']}; steady-state passes {steady['full']:.1f} s -> {steady['early']:.1f} s "
            f"({steady['early'] / steady['full']:.2f}); verdict {runs['early']['verdict']['overall']} both"
        )
