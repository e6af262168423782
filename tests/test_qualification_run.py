"""The qualification suite end to end, as a user runs it: pytest tests_qual with options, in a subprocess."""

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from expected_basis import RELATIVE, STEADY, host_phrase, line, qualified, uncounted
from replay_runs import checkout, replay_suite
from suite_runs import BOTH, PAIR, REPO, junit_cases, lenient_drive, results, run_suite

pytest_plugins = ("pytester",)


@pytest.fixture(scope="module")
def small_run(qualified_run):
    """One small qualification on an empty target of the slow stand-in drive, with every report a user can ask for
    (conftest.run_qualified), shared with the other tests that read it."""
    return qualified_run, qualified_run.out


def test_a_small_run_passes_and_leaves_the_target_as_it_found_it(small_run):
    result, _ = small_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.left_on_target == ()  # as the run left it, before the stand-in drive was unmounted


def test_progress_and_summary_are_printed(small_run):
    output = small_run[0].stdout
    assert "ckptqual: pass 1 checkpoint 1/2:" in output and "ckptqual: pass 2 checkpoint 2/2:" in output
    assert "ckptqual summary" in output and "raw sequential write" in output
    assert "pass ckpts GB/s mean GB/s mean s worst s outcome" in " ".join(output.split())


def test_junit_carries_every_measurement_with_limit_and_unit(small_run):
    tree = ElementTree.parse(small_run[1] / "qual.xml")
    cases = {case.get("name"): case for case in tree.iter("testcase")}
    assert set(cases) == {"test_fill_pass[1]", "test_fill_pass[2]", "test_restore", "verdict"}
    properties = {p.get("name"): p.get("value") for p in cases["test_fill_pass[2]"].iter("property")}
    assert properties["workload"] == "llama3-8b-dp2" and properties["engine"] == "stream"
    assert float(properties["scale"]) == 0.0001
    assert float(properties["fill_throughput"]) > 0 and properties["fill_throughput.unit"] == "GB/s"
    assert properties["fill_throughput.limit"] == ">= 0.001 of raw_write"
    assert properties["fill_throughput.outcome"] == "PASS"
    assert properties["fill_checkpoint_seconds_max.outcome"] == "MEASURED"
    assert properties["fill_steady_state"] == "NOT_STEADY"
    assert properties["fill_steady_state.reason"] == "needs 5 rounds, got 2"  # pass 2 of 2 checkpoints


def test_every_junit_case_shows_its_figures_in_system_out_where_gitlab_and_jenkins_show_it(small_run):
    tree = ElementTree.parse(small_run[1] / "qual.xml")
    out = {case.get("name"): case.findtext("system-out", "") for case in tree.iter("testcase")}
    data = results(small_run[1] / "results.json")
    judged = {m["context"]["pass"]: m for m in data["measurements"] if m["measurement"] == "fill_throughput"}
    for number in (1, 2):
        figure = judged[number]
        ratio, limit = f"{figure['judged_value']:.4g}", f"{figure['limit_value']:.4g}"
        state = "fresh" if number == 1 else "steady"
        waits = f" [{figure['waits']}]" if figure["waits"] else ""  # the figure's own threads' waits for a CPU
        assert out[f"test_fill_pass[{number}]"].splitlines() == [
            f"pass {number} PASS: fill_throughput {figure['value']:.4g} GB/s = {ratio} of raw_write >= {limit} of "
            f"raw_write (pass={number}, state={state}){waits}"
        ]
    assert out["test_restore"].splitlines() == ["restore PASS"]  # no restore limit in this drive file: no figure
    assert out["verdict"].splitlines() == [line(data["verdict"])]


def test_results_json_records_configuration_timings_and_outcomes(small_run):
    data = json.loads((small_run[1] / "results.json").read_text())
    assert data["settings"]["scale"] == 0.0001 and data["settings"]["engine"] == "stream"
    assert data["plan"]["files"] == 4 and len(data["plan"]["ranks"]) == 2
    assert len(data["baseline"]["write_GBps"]) == 3
    assert max(data["baseline"]["cached_fraction_before_read"]) < 0.05
    assert [p["pass"] for p in data["passes"]] == [1, 2]
    assert [p["checkpoints"] for p in data["passes"]] == [[0, 1], [2, 3]]
    assert data["steady_state"]["2"]["reached"] is False and data["steady_state"]["2"]["rounds"] == 2
    checkpoint = data["checkpoints"][2]
    assert checkpoint["pass_number"] == 2 and checkpoint["removed_before"] == 0 and len(checkpoint["ranks"]) == 2
    assert checkpoint["seconds"] == max(r["done_s"] for r in checkpoint["ranks"])
    assert {m["measurement"] for m in data["measurements"]} >= {"fill_throughput", "fill_mean_checkpoint_throughput"}
    assert all(t["outcome"] == "PASS" for t in data["tests"].values())
    assert data["verdict"] == qualified(data, RELATIVE, STEADY, last=uncounted(data))
    assert data["cleanup"]["removed"] is True and "torch" in data["environment"]["versions"]
    assert [r["checkpoint"] for r in data["restore"]] == [2, 3]
    assert all(
        r["cached_fraction_before"] < 0.05 and r["bytes"] == data["plan"]["total_bytes"] for r in data["restore"]
    )


def test_a_real_runs_benchmark_rounds_are_its_checkpoints_and_restores_seconds(small_run):
    """The shared real run's saved benchmarks: a round per checkpoint and per restore, each the seconds its record
    holds (the fill campaign drives pytest-benchmark's rounds)."""
    _, out = small_run
    [saved] = [json.loads(path.read_text()) for path in (out / "benchmarks").rglob("*.json")]
    data = results(out / "results.json")
    rounds = {bench["name"]: bench["stats"] for bench in saved["benchmarks"]}
    for number in (1, 2):
        seconds = [c["seconds"] for c in data["checkpoints"] if c["pass_number"] == number]
        assert rounds[f"test_fill_pass[{number}]"]["rounds"] == len(seconds) == 2
        assert rounds[f"test_fill_pass[{number}]"]["min"] == pytest.approx(min(seconds), rel=1e-9)
        assert rounds[f"test_fill_pass[{number}]"]["max"] == pytest.approx(max(seconds), rel=1e-9)
    restores = [r["seconds"] for r in data["restore"]]
    assert rounds["test_restore"]["rounds"] == 2 and rounds["test_restore"]["max"] == pytest.approx(max(restores))
    assert saved["machine_info"]["ckptqual"]["drive"] == "lenient drive"


def test_benchmarks_compare_across_runs_of_different_drives(pytester, tmp_path):
    """In process, on a replayed run (stand_in/replay.py): two runs of different drives saved by pytest-benchmark
    side by side, their rounds the checkpoints and restores, compared by pytest-benchmark's own command."""
    storage = tmp_path / "benchmarks"
    for name in ("lenient drive", "other drive"):
        drive = lenient_drive(tmp_path / f"{name.replace(' ', '-')}.toml", name)
        saved = ["--benchmark-autosave", "--benchmark-storage", str(storage), "--restore-checkpoints", "2"]
        done = replay_suite(pytester, *PAIR, "--drive", str(drive), *saved, tests=BOTH, reports=False)
        assert done.ret == 0, done.stdout[-3000:]
    saved = sorted(storage.rglob("*.json"))
    assert len(saved) == 2
    runs = [json.loads(path.read_text()) for path in saved]
    assert sorted(r["machine_info"]["ckptqual"]["drive"] for r in runs) == ["lenient drive", "other drive"]
    names = [[b["name"] for b in r["benchmarks"]] for r in runs]
    assert sorted(names[0]) == sorted(names[1]) == ["test_fill_pass[1]", "test_fill_pass[2]", "test_restore"]
    rounds = {b["name"]: b["stats"]["rounds"] for b in runs[0]["benchmarks"]}
    assert rounds == {"test_fill_pass[1]": 2, "test_fill_pass[2]": 2, "test_restore": 2}
    assert runs[0]["benchmarks"][0]["extra_info"]["checkpoint_bytes"] > 0
    cli = [sys.executable, "-c", "from pytest_benchmark.cli import main; main()"]  # = the pytest-benchmark command
    compare = subprocess.run(
        [*cli, "--storage", str(storage), "compare", "--columns", "mean,max"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compare.returncode == 0, compare.stderr
    assert compare.stdout.count("test_fill_pass[1]") == 2


def test_a_bad_option_is_a_usage_error_and_writes_nothing(pytester):
    done = replay_suite(pytester, "--scale", "0", "--results", "r.json", reports=False)
    assert done.ret == 4
    assert "ERROR: --scale '0': must be a number with 0 < scale <= 1" in done.stderr
    assert not (done.out / "r.json").exists() and list((done.out / "target").iterdir()) == []


def test_a_failing_limit_fails_the_pass_with_value_limit_and_unit(pytester, tmp_path):
    """In process, on a replayed run: the failed pass's JUnit case gives the failing figure, its limit and unit,
    and every figure judged, and nothing is left on the target."""
    strict = tmp_path / "strict.toml"
    strict.write_text(
        (REPO / "thresholds" / "local.toml").read_text()
        + """
[[limit]]
name = "fill_throughput"
min = 1000
unit = "ratio"
relative_to = "raw_write"
source = "an impossible limit, to see the failure"
"""
    )
    one = ["--workload", "llama3-8b-dp2", "--scale", "0.0001", "--checkpoints-per-pass", "1", "--passes", "1"]
    done = replay_suite(pytester, *one, "--drive", str(strict))
    assert done.ret == 1
    xml = done.out / "q.xml"
    failure = next(ElementTree.parse(xml).iter("failure")).get("message")
    assert "fill_throughput" in failure and "< min 1000 of raw_write" in failure and "an impossible limit" in failure
    assert list((done.out / "target").iterdir()) == []
    pass_1 = next(case for case in ElementTree.parse(xml).iter("testcase") if case.get("line"))
    figures = pass_1.findtext("system-out").splitlines()[0]
    number, where = r"[0-9.e+-]+", r" \(pass=1, state=fresh\)"
    relative = rf"fill_throughput {number} GB/s = {number} of raw_write"
    shape = rf"pass 1 FAIL: {relative} >= 0\.05 of raw_write{where}; {relative} < 1000 of raw_write{where}"
    assert re.fullmatch(shape, figures), figures
    assert failure.endswith(" || figures: " + figures.split(": ", 1)[1])  # the figures that passed, too


def test_a_target_with_foreign_files_is_refused_and_left_byte_for_byte(pytester):
    target = checkout(pytester)
    precious = target / "precious.ckpt"
    precious.write_bytes(b"\x00\x01" * 5000)
    done = replay_suite(pytester, reports=False)
    assert done.ret == 4
    assert "holds 1 entry ckptqual did not create (precious.ckpt); give an empty directory" in done.stderr
    assert sorted(p.name for p in target.iterdir()) == ["precious.ckpt"]
    assert precious.read_bytes() == b"\x00\x01" * 5000


def test_a_run_that_does_not_fit_is_refused_once_with_a_fix_for_the_whole_run(tmpfs):
    target = tmpfs("size=100m")
    selected = ("test_fill.py", "test_shard_layouts.py")
    result = run_suite("--workload", "llama3-8b-dp2", "--target", str(target), tests=selected)
    assert result.returncode == 4
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr
    assert "fill 0.175 GB: 3 checkpoints of 0.058 GB; odd layouts 0.134 GB" in errors[0]
    assert "read sweep" not in errors[0]  # not selected, not counted
    fix = errors[0].split("; use ")[1].split(" (then")[0].split()
    assert fix[0] == "--scale" and list(target.iterdir()) == []
    fixed = run_suite("--workload", "llama3-8b-dp2", "--target", str(target), *fix, "--passes", "1", tests=selected)
    assert "ERROR:" not in fixed.stderr and "passed" in fixed.stdout, fixed.stdout[-2000:] + fixed.stderr
    assert list(target.iterdir()) == []


def test_a_refused_run_ends_with_its_fix_and_the_junit_holds_only_that(tmpfs, pytester):
    target = tmpfs("size=20m")
    done = replay_suite(pytester, "--workload", "llama3-8b", "--junitxml", "q.xml", target=target, reports=False)
    assert done.ret == 4
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith(f"ERROR: --target {target}: the run needs ") and last.endswith("; use a larger target")
    assert "never judged" not in done.stdout + done.stderr
    refusal = last.removeprefix("ERROR: ")
    cases = junit_cases(done.out / "q.xml")
    assert list(cases) == ["verdict"]
    verdict = cases["verdict"]["message"]  # then the required parts, which never ran
    assert verdict.startswith(f"ckptqual verdict: INCOMPLETE: the run was refused before it started: {refusal} | ")
    assert list(target.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value", "refusal"),
    [("--drive", "nosuch", "--drive: unknown drive 'nosuch'"), ("--scale", "0", "--scale '0': must be a number")],
)
def test_a_run_refused_while_pytest_starts_has_the_refusal_as_its_one_junit_case(pytester, option, value, refusal):
    done = replay_suite(pytester, option, value, "--junitxml", "q.xml", reports=False)
    assert done.ret == 4
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith(f"ERROR: {refusal}"), done.stderr
    cases = junit_cases(done.out / "q.xml")
    assert list(cases) == ["verdict"] and cases["verdict"]["outcome"] == "failure"
    line = f"ckptqual verdict: INCOMPLETE: the run was refused before it started: {last.removeprefix('ERROR: ')}"
    assert cases["verdict"]["message"] == line
    assert ElementTree.parse(done.out / "q.xml").findtext("testsuite/testcase/system-out") == line + "\n"
    target = done.out / "target"
    assert list(target.iterdir()) == []
    inside = replay_suite(pytester, option, value, "--junitxml", str(target / "q.xml"), reports=False)
    assert inside.ret == 4
    assert list(target.iterdir()) == []  # never into the target, refused or not


def test_the_built_in_drive_file_rests_on_relative_limits_only_in_every_report(pytester, tmp_path):
    """In process, on a replayed run whose figures were host-bound (stand_in/replay.py): the basis in the results,
    the last line, the JUnit suite property and verdict case, and `ckptqual summary` drawn again from the record."""
    html = ["--report-dir", str(tmp_path / "h"), "--replay", "loop-ext4-devices"]
    done = replay_suite(pytester, *PAIR, "--drive", "local", *html)
    data = results(done.out / "r.json")
    basis = data["verdict"]["basis"]
    assert basis == [RELATIVE, STEADY, *host_phrase(data)]  # local.toml; 2 passes of 2 checkpoints
    assert host_phrase(data)  # the recording's figures were host-bound and met their minimum
    last = done.last
    assert last.startswith(f"ckptqual verdict: {data['verdict']['overall']} ({'; '.join(basis)})")
    assert last.startswith("ckptqual verdict: INCOMPLETE (relative limits only; steady state not reached (not ")
    xml = ElementTree.parse(done.out / "q.xml")
    suite = {p.get("name"): p.get("value") for p in xml.find("testsuite/properties")}
    assert suite["ckptqual.limits.verdict.basis"] == "; ".join(basis)
    verdict_case = next(case for case in xml.iter("testcase") if case.get("name") == "verdict")
    assert verdict_case.find("failure").get("message") == last == verdict_case.findtext("system-out").strip()
    again = subprocess.run([sys.executable, "-m", "ckptqual.cli", "summary", str(done.out / "r.json")],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert again.stdout.rstrip().splitlines()[-1] == last


def test_a_drive_file_that_requires_steady_state_refuses_a_run_that_cannot_show_it(pytester, tmp_path):
    """One pass has no steady-state checkpoints: the run could only end NOT QUALIFIED, so it is refused before any
    I/O (exit 4), naming the fix; two passes of 5 checkpoints would do. In process (nothing runs)."""
    strict = lenient_drive(tmp_path / "steady.toml", "steady drive")
    strict.write_text(strict.read_text().replace("[run]\n", "[run]\nrequire_steady_state = true\n", 1))
    done = replay_suite(
        pytester,
        *("--workload", "llama3-8b", "--scale", "0.0001", "--passes", "1", "--checkpoints-per-pass", "1"),
        *("--drive", str(strict), "--junitxml", "q.xml"),
        reports=False,
    )
    assert done.ret == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    error = next(line for line in done.stderr.splitlines() if line.startswith("ERROR: "))
    assert "the SNIA rule needs 5 steady-state checkpoints (passes 2 and later), but --passes 1" in error
    assert error.endswith("writes 0; use --passes 2 or more") and list((done.out / "target").iterdir()) == []
